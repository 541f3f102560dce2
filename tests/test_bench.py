"""The benchmark harness reports ratios correctly (no timing is asserted: benchmarks report)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from dflash_ref.bench.suite import without_hook_support
from dflash_ref.bench.timing import Stopwatch, cpu_model, measure, paired_ratio, summarise
from dflash_ref.cli import bench
from dflash_ref.cli.bench import markdown
from dflash_ref.hooks import HookPoint, hooks


def test_measure_interleaves_and_summarise_gives_ratios_to_the_baseline():
    order: list[str] = []
    times = measure({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, warmup=1)
    assert order == ["a", "b"] * 4 and all(len(t) == 3 for t in times.values())
    # paired: each repeat's ratio, then the median; a slow minute (that began at the 2nd repeat's first variant)
    # cancels out of the 3rd repeat's ratio, while the ratio of the medians is 4.5 / 1
    assert paired_ratio([1.5, 4.5, 4.5], [1.0, 1.0, 3.0]) == 1.5 and paired_ratio([4.0, 3.0], [2.0, 2.0]) == 1.75
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])
    rows = summarise({"base": [1.0, 2.0, 3.0], "other": [4.0, 5.0, 4.5]}, "base")
    assert rows[0]["ratio"] == 1.0 and rows[1]["ratio"] == 2.5  # median of 4, 2.5, 1.5
    assert (rows[1]["min_s"], rows[1]["max_s"], rows[1]["median_s"]) == (4.0, 5.0, 4.5)
    table = markdown(rows, "t")
    assert table.splitlines()[2] == "| variant | median_s | min_s | max_s | ratio |"
    assert "| other | 4.5 | 4 | 5 | 2.5 |" in table
    ragged = markdown([{"b": 4, "x1": 1.0, "size": 2.0}, {"b": 16, "x1": 3.0, "x8": 5.0, "size": 6.0}], "r")
    assert ragged.splitlines()[2:] == [
        "| b | x1 | x8 | size |",
        "|---|---|---|---|",
        "| 4 | 1 |  | 2 |",
        "| 16 | 3 | 5 | 6 |",
    ]


def test_each_timed_variant_of_baselines_runs_its_own_decoder():
    """bench baselines times one call per decoder over every input; each must run that decoder (a comprehension
    whose lambdas defaulted to an earlier loop's last decoder once timed that one in every row)."""
    from dflash_ref.bench.baselines import over_inputs

    decoders = {name: (lambda ids, name=name: (name, ids)) for name in ("transformers", "ours", "official")}
    variants = over_inputs(decoders, [1, 2])
    assert list(variants) == list(decoders)
    assert {name: call() for name, call in variants.items()} == {name: [(name, 1), (name, 2)] for name in decoders}


def test_without_hook_support_is_scoped_and_really_skips_hooks():
    point, seen, original = HookPoint(), [], HookPoint.__call__
    point.name = "p"
    with hooks(point, lambda x, _: seen.append(1)):
        with without_hook_support():
            point(torch.ones(1))
        assert seen == []
        point(torch.ones(1))
        assert seen == [1]
    assert HookPoint.__call__ is original


def test_stopwatch_counts_forwards_and_detaches():
    layer = torch.nn.Linear(2, 2)
    clock = Stopwatch(layer)
    layer(torch.ones(1, 2))
    layer(torch.ones(1, 2))
    clock.remove()
    layer(torch.ones(1, 2))
    assert clock.calls == 2 and clock.seconds >= 0


@pytest.mark.parametrize("planning", [0.0, 3.0])
def test_generate_reports_time_without_the_plans_a_first_run_measured(capsys, planning):
    """generate's statistics: the seconds the run spent measuring linear plans (a first run on a machine)
    are named and left out of the overall time and rate; without any, no such line."""
    from dflash_ref.cli.generate import report

    out = SimpleNamespace(num_output_tokens=12, acceptance_lengths=[1, 2], mean_tokens_per_step=2.5)
    clock = SimpleNamespace(calls=2, seconds=0.5)
    report(out, 5.0, clock, clock, planning)
    printed = capsys.readouterr().out
    assert ("linear plans: 3.000 s measuring" in printed) == (planning > 0)
    assert f"overall: {5.0 - planning:.3f} s, {12 / (5.0 - planning):.1f} tokens/s" in printed


def test_run_writes_tables_with_the_machine_they_ran_on(tmp_path, monkeypatch):
    """bench.run: each benchmark's tables go to bench.json and bench.md under a footer naming the
    machine, the date and the probe's speed (and the fast CPU path's plan for a benchmark that timed it);
    a second benchmark's run keeps the first one's results."""
    monkeypatch.setitem(bench.BENCHES, "one", lambda repeats, out, progress: {"first": [{"a": 1.23456}]})
    monkeypatch.setitem(bench.BENCHES, "two", lambda repeats, out, progress: {"second": [{"b": "x"}]})
    monkeypatch.setattr(bench, "FAST_CPU_BENCHES", {"two"})
    bench.run(["one"], 2, tmp_path, say=lambda s: None)
    bench.run(["two"], 3, tmp_path, say=lambda s: None)
    report = json.loads((tmp_path / "bench.json").read_text())["results"]
    assert report["one"]["tables"] == {"first": [{"a": 1.23456}]} and report["two"]["repeats"] == 3
    text = (tmp_path / "bench.md").read_text()
    assert "### first" in text and "| 1.235 |" in text and "### second" in text
    assert (
        len(
            re.findall(
                r"Python [\d.]+, \d{4}-\d\d-\d\d, probe [\d.]+ ms \(\d+ GB/s: 49152×576 fp32 by 2 columns\)",
                text,
            )
        )
        == 2
    )
    fast = r"--fast-cpu plan (measured|linear|rows-first) \((C product streamed-\w+\.so|no C product \(.+\))\)"
    assert "--fast-cpu" not in report["one"]["machine"] and re.search(fast, report["two"]["machine"])
    assert text.count(cpu_model()) == 2 and cpu_model()


def test_run_hands_a_draft_folder_to_trained_alone(tmp_path, monkeypatch):
    """bench.run(draft=...): `trained` gets the folder, a benchmark beside it in the same run gets none,
    and without a folder `trained` is called as before (its default, the shipped draft)."""
    calls = []
    for name in ("trained", "one"):
        monkeypatch.setitem(
            bench.BENCHES, name, lambda repeats, out, progress, n=name, **kw: calls.append((n, kw)) or {}
        )
    from conftest import make_pair

    from dflash_ref.drafts.checkpoint import save_draft

    folder = str(tmp_path / "draft-bf16")
    save_draft(make_pair()[1], folder)  # a folder that is there: run checks it before anything runs
    bench.run(["one", "trained"], 1, tmp_path, say=lambda s: None, draft=folder)
    bench.run(["trained"], 1, tmp_path, say=lambda s: None)
    assert calls == [("one", {}), ("trained", {"draft": folder}), ("trained", {})]


@pytest.mark.parametrize(
    "repeats, out, saved, message",
    [
        (0, "out", None, "--repeats must be at least 1, got 0"),
        (1, "a_file", None, "a_file is a file, not a folder"),
        (1, "out", "{bad", "bench.json is not JSON"),
        (1, "out", '{"x": 1}', "bench.json is not a bench results file"),
        (1, "out", '{"results": {"one": {"tables": {}}}}', "bench.json is not a bench results file"),
    ],
)
def test_run_refuses_before_any_benchmark_runs(tmp_path, monkeypatch, repeats, out, saved, message):
    """A run that could not keep its results is refused before it measures anything."""
    calls = []
    monkeypatch.setitem(bench.BENCHES, "one", lambda repeats, out, progress: calls.append(1) or {})
    (tmp_path / "a_file").write_text("")
    if saved is not None:
        (tmp_path / out).mkdir()
        (tmp_path / out / "bench.json").write_text(saved)
    with pytest.raises(ValueError, match=re.escape(message)):
        bench.run(["one"], repeats, tmp_path / out, say=lambda s: None)
    assert not calls


def test_bench_refuses_a_draft_folder_without_the_trained_benchmark(capsys, tmp_path):
    from dflash_ref.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "official", "memory", "--draft", "some/draft", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert "--draft some/draft: only the trained benchmark measures a draft folder" in err
    assert "(official, memory)" in err and not list(tmp_path.iterdir())  # refused before anything ran


def test_bench_trained_names_a_missing_draft_folder(tmp_path, capsys):
    from dflash_ref.__main__ import main

    with pytest.raises(SystemExit) as e:  # a usage error, before anything runs
        main(["bench", "trained", "--draft", str(tmp_path / "nope"), "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and f"--draft no folder {tmp_path / 'nope'}" in capsys.readouterr().err


def test_bench_trained_takes_a_shipped_name_as_its_first_draft(tmp_path, capsys):
    """--draft shipped:dflash1 puts that draft first (the one measured at every block), under its own label and
    once; an unknown shipped name is refused before anything runs."""
    from dflash_ref.__main__ import main
    from dflash_ref.bench.trained import drafts_to_compare
    from dflash_ref.drafts.folder import SHIPPED_DFLASH1, SHIPPED_DRAFTS

    assert drafts_to_compare("shipped:dflash1") == {
        "DFlash 1 (shipped)": SHIPPED_DFLASH1,
        "DFlash 2 (shipped)": SHIPPED_DRAFTS["DFlash 2 (shipped)"],
    }
    assert list(drafts_to_compare("runs/x/draft-bf16")) == ["draft runs/x/draft-bf16", *SHIPPED_DRAFTS]
    with pytest.raises(SystemExit) as e:
        main(["bench", "trained", "--draft", "shipped:dflash9", "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and "--draft shipped:dflash9: no shipped draft of that name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_benchmarks_against_transformers_are_registered():
    assert {"baselines", "steps", "dflash2", "rollback"} <= set(bench.BENCHES)


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_transformers_twin_is_the_model_as_made_on_the_same_tensors():
    """The baseline: plain nn.Linear layers and sdpa (HFTarget switched the original's attention) on the original's very
    weights (tying kept, nothing copied), the same logits; transformers' generate on it gives the
    tokens dflash_ref's AR gives, stopping after a stop token as AR does."""
    from dflash_ref import generate
    from dflash_ref.bench.baselines import transformers_twin
    from dflash_ref.bench.steps import weight_bytes
    from dflash_ref.fast_cpu import PlannedLinear
    from dflash_ref.loading.grouped_attention import SDPA_GROUPED
    from dflash_ref.loading.hf import HFTarget

    model = tiny_llama()
    target = HFTarget(model)
    twin = transformers_twin(model)
    assert not any(type(m) is PlannedLinear for m in twin.modules())
    # transformers' own sdpa attention, and the original keeps the one HFTarget gave it (loading/grouped_attention.py)
    assert twin.config._attn_implementation == "sdpa" and model.config._attn_implementation == SDPA_GROUPED
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(model.parameters(), twin.parameters()))
    assert twin.lm_head.weight is twin.model.embed_tokens.weight
    assert all(not b.is_meta for b in twin.buffers())
    per_layer = 2 * 32 * 32 + 2 * 16 * 32 + 3 * 64 * 32  # q o, k v (2 KV heads of 8), gate up down
    assert weight_bytes(model) == weight_bytes(twin) == 4 * (2 * per_layer + 64 * 32)  # the tied head once
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(twin(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
        ours = generate(target, ids, 20).output_ids
        stop = int(ours[0, 6 + 5])
        theirs = twin.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=20,
            do_sample=False,
            eos_token_id=[stop],
            pad_token_id=stop,
        )
    assert torch.equal(theirs, generate(target, ids, 20, [stop]).output_ids)


def test_the_official_timer_is_perf_counter_inside_and_restored_after():
    official = pytest.importorskip("dflash.model")
    import time

    from dflash_ref.bench.baselines import official_timer

    original = official._cuda_time
    with official_timer() as module:
        assert module is official and official._cuda_time is time.perf_counter
    assert official._cuda_time is original


def test_bench_rollback_reports_blocks_4_and_16_against_a_verify(monkeypatch):
    """The table's rows and columns, from one repeat on a tiny hybrid (no timing is asserted)."""
    from dflash_ref.bench import hybrid_rollback

    monkeypatch.setattr(
        hybrid_rollback, "bench_target", lambda hidden, layers, real=hybrid_rollback.bench_target: real(32, 4)
    )
    [rows] = hybrid_rollback.bench_rollback(1, out=None, progress=lambda s: None).values()
    assert [r["block size b"] for r in rows] == [4, 16]
    assert list(rows[0]) == list(rows[1])  # one set of columns for both b
    assert {"replay of 1 token / verify", "replay of b/2 tokens / verify", "replay of b tokens / verify"} <= set(
        rows[0]
    )
    for r in rows:
        assert all(v > 0 for k, v in r.items() if k != "block size b")


def test_bench_trained_runs_every_decoder_side_by_side(tmp_path, monkeypatch):
    """One prompt of each held-out set, 8 tokens, one repeat (no timing is asserted): transformers' generate
    first, then AR and each shipped draft, every output checked equal to AR inside; τ + 1 for both sets."""
    pytest.importorskip("gguf")
    from dflash_ref.bench import trained
    from dflash_ref.drafts.folder import SHIPPED_DRAFTS

    monkeypatch.setattr(trained, "PROMPTS", 1)
    monkeypatch.setattr(trained, "NEW_TOKENS", 8)
    tables = trained.bench_trained(1, tmp_path, progress=lambda s: None)
    rows = next(iter(tables.values()))
    names = [r["variant"] for r in rows]
    assert names[:2] == ["transformers generate (nn.Linear)", "dflash_ref AR (target alone)"]
    assert all(any(n.startswith(f"{label} b=") for n in names) for label in SHIPPED_DRAFTS)
    assert all(
        any(n.endswith(f", prompt lookup N={trained.LOOKUP}") and n.startswith(label) for n in names)
        for label in SHIPPED_DRAFTS
    )
    assert rows[0]["speed vs transformers generate"] == 1.0
    assert all({"τ + 1, template held-out", "τ + 1, other styles", "speed vs AR"} <= set(r) for r in rows)
    assert (tmp_path / "trained.png").is_file()
