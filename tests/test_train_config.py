"""`train`'s options: a config file, the copy a run keeps, what --resume may change, and the refusals
that come before any model is loaded; the data file's checks (distill.read_responses)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from dflash_ref.__main__ import main
from dflash_ref.training import distill
from dflash_ref.training import prompts as written
from dflash_ref.training.arguments import add_train_arguments
from dflash_ref.training.dflash2_options import DFLASH2_DEFAULTS
from dflash_ref.training.options import (
    CONFIG_NAME,
    DEFAULTS,
    TrainOptionError,
    fill_target_layers,
    read_config_file,
    resolve,
    save,
)
from dflash_ref.training.precision import DTYPE_OPTIONS, choose_dtypes, native_bf16

DRAFTS = Path(__file__).resolve().parents[1] / "dflash_ref" / "drafts"
# the defaults as a run on this machine takes them (auto dtypes; as many target layers as draft layers)
RESOLVED = fill_target_layers(choose_dtypes(dict(DEFAULTS)))


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return p.parse_args(list(argv))


def write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def started_run(out: Path, step: int = 10, **options) -> Path:
    """A folder as a run leaves it: its options and a state at `step`."""
    out.mkdir(parents=True, exist_ok=True)
    save(out, {**DEFAULTS, **options})
    write(out / "state.json", {"step": step, "losses": [], "seconds": 1.0})
    return out


def test_defaults_then_config_file_then_command_line(tmp_path):
    config = write(tmp_path / "c.json", {"layers": 4, "block-size": 8, "steps": 100, "full_vocab": True})
    options = resolve(parse("--out", str(tmp_path / "run"), "--config", str(config), "--steps", "7"))
    assert options == {**RESOLVED, "layers": 4, "target_layers": 4, "block_size": 8, "steps": 7, "full_vocab": True}
    assert resolve(parse("--out", str(tmp_path / "run"))) == RESOLVED
    assert not (tmp_path / "run").exists()  # resolving writes nothing


@pytest.mark.parametrize(
    "cpuinfo, native",
    [
        ("processor : 0\nflags : fpu sse avx2 avx512f avx512bw\n", False),  # AVX-512, bf16 emulated
        ("processor : 0\nflags : fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n", True),
        ("processor : 0\nFeatures : fp asimd sve bf16 i8mm\n", True),  # Arm FEAT_BF16
        ("processor : 0\n", False),
        (None, False),
    ],
)
def test_auto_dtypes_are_bf16_only_where_the_cpu_has_bf16_instructions(tmp_path, monkeypatch, cpuinfo, native):
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    assert native_bf16(path) is native
    from dflash_ref.training import precision

    monkeypatch.setattr(precision, "native_bf16", lambda: native)
    chosen = "bf16" if native else "fp32"
    assert choose_dtypes({"distill_dtype": "auto", "train_dtype": "fp32", "steps": 3}) == {
        "distill_dtype": chosen,
        "train_dtype": "fp32",
        "steps": 3,
    }
    options = resolve(parse("--out", str(tmp_path / "run")))
    assert (options["distill_dtype"], options["train_dtype"]) == (chosen, chosen)  # saved as chosen
    out = started_run(tmp_path / "old", distill_dtype="bf16", train_dtype="bf16")
    assert resolve(parse("--out", str(out), "--resume"))["train_dtype"] == "bf16"  # a run keeps its own
    if not native:
        with pytest.raises(TrainOptionError, match=r"--train-dtype \(the run has 'bf16', asked 'fp32'\)"):
            resolve(parse("--out", str(out), "--resume", "--train-dtype", "auto"))


def test_a_saved_config_is_a_config_file(tmp_path):
    options = {**DEFAULTS, "layers": 3, "gamma": 2.5, "lr": 1e-3}
    assert read_config_file(save(tmp_path, options)) == options


@pytest.mark.parametrize(
    "content, message",
    [
        ({"layer": 4}, "unknown option(s) ['layer']"),
        ({"layers": "4"}, "layers must be a whole number, got '4'"),
        ({"layers": 4.0}, "layers must be a whole number"),
        ({"full-vocab": 1}, "full_vocab must be true or false"),
        ({"lr": True}, "lr must be a number"),
        ({"init": 3}, "init must be a string, got 3"),
        ({"gamma": "4"}, "gamma must be a number or null"),
        ({"version": 3}, "version must be one of [1, 2], got 3"),
        ({"selector_rank": "32"}, "selector_rank must be a whole number or null, got '32'"),
        ({"prompt_set": "all"}, "prompt_set must be one of ['templates', 'varied', 'mixed']"),
        ('{"block-size": 8, "block_size": 16}', "an option given more than once: ['block-size', 'block_size']"),
        ('{"steps": 1, "steps": 2}', "an option given more than once: ['steps']"),
        ([4, 2], "must hold a JSON object of options, not a list"),
        ("{not json", "is not JSON"),
    ],
)
def test_a_bad_config_file_is_refused_by_name(tmp_path, content, message):
    path = tmp_path / "c.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(TrainOptionError) as e:
        read_config_file(path)
    assert message in str(e.value) and str(path) in str(e.value)


def test_init_from_a_trained_draft_takes_its_shape(tmp_path):
    """--init DRAFT: the draft's version, layers, block size and DFlash 2 sizes become the run's; a folder
    is kept absolute, a shipped name as given."""
    shipped = json.loads((DRAFTS / "smollm2_dflash2" / "config.json").read_text())
    options = resolve(parse("--out", str(tmp_path / "run"), "--init", "shipped:dflash2", "--block-size", "4"))
    sizes = {k: shipped["dflash_config"][k] for k in DFLASH2_DEFAULTS}
    assert options == {
        **RESOLVED,
        "init": "shipped:dflash2",
        "version": 2,
        "layers": shipped["num_hidden_layers"],
        "target_layers": len(shipped["dflash_config"]["target_layer_ids"]),
        "block_size": shipped["block_size"],
        **sizes,
    }
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "config.json").write_text((DRAFTS / "smollm2" / "config.json").read_text())
    options = resolve(parse("--out", str(tmp_path / "run"), "--init", f"{copy}/"))
    assert options["init"] == str(copy) and options["version"] == 1 and options["selector_rank"] is None


def test_the_options_and_their_init_checks_import_no_torch():
    """training/options.py (with init_draft.py and precision.py) stays torch-free, so that `train --help` and a
    usage error stay cheap; only an --init naming a draft reads its config through config.py."""
    import subprocess
    import sys

    code = (
        "import sys; from dflash_ref.training import arguments, options, init_draft, precision; "
        "init_draft.init_folder('shipped:dflash2'); assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-1000:]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--init", "shipped:dflash2", "--layers", "4", "--selector-rank", "8"],
            "the run asks --layers 4 (the draft has 2), --selector-rank 8 (the draft has 32)",
        ),
        (["--init", "shipped:dflash1", "--version", "2"], "--version 2 (the draft has 1)"),
        (["--init", "shipped:dflash2", "--target-layers", "4"], "--target-layers 4 (the draft has 2)"),
        (["--init", "shipped:dflash1", "--selector-top-k", "4"], "--selector-top-k 4 (the draft has none)"),
        (["--init", "shipped:dflash3"], "--init shipped:dflash3: no shipped draft of that name"),
        (["--init", "nowhere"], "nowhere: no such folder; --init takes random or target, a draft folder"),
        (["--init", "."], "no config.json there"),
        (["--init", "README.md"], "README.md: a file, not a folder"),
    ],
)
def test_init_from_a_draft_refuses_by_name(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    with pytest.raises(TrainOptionError) as e:
        resolve(parse("--out", str(tmp_path / "run"), *argv))
    assert message in str(e.value)


def test_resume_takes_the_saved_options_and_lets_the_run_grow(tmp_path):
    out = started_run(tmp_path / "run", layers=4, prompts=5580, steps=100)
    options = resolve(parse("--out", str(out), "--resume"))
    assert options["layers"] == 4 and options["prompts"] == 5580 and options["steps"] == 100
    grown = resolve(parse("--out", str(out), "--resume", "--steps", "200", "--eval-prompts", "24", "--layers", "4"))
    assert grown["steps"] == 200 and grown["eval_prompts"] == 24 and grown["layers"] == 4


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--layers", "2"], "layers (the run has 4, asked 2)"),
        (["--lr", "0.001", "--batch", "4"], "--batch (the run has 8, asked 4); --lr (the run has 0.003, asked 0.001)"),
        (["--no-full-vocab"], "--full-vocab (the run has True, asked False)"),
        (["--soft-labels", "0.5"], "--soft-labels (the run has 0.0, asked 0.5)"),
        (["--steps", "5"], "is at step 10, past --steps 5"),
    ],
)
def test_resume_refuses_a_changed_run(tmp_path, argv, message):
    out = started_run(tmp_path / "run", layers=4, steps=100, full_vocab=True)
    with pytest.raises(TrainOptionError) as e:
        resolve(parse("--out", str(out), "--resume", *argv))
    assert message in str(e.value)


def test_resume_checks_the_config_file_too(tmp_path):
    out = started_run(tmp_path / "run", layers=4)
    config = write(tmp_path / "c.json", {"block_size": 8})
    with pytest.raises(TrainOptionError, match=r"--block-size \(the run has 4, asked 8\)"):
        resolve(parse("--out", str(out), "--resume", "--config", str(config)))


def test_a_dflash2_run_saves_its_sizes_and_resumes_only_with_them(tmp_path):
    """--version 2 fills the sizes not given with DFLASH2_DEFAULTS, so train_config.json holds every one;
    a DFlash 1 run keeps them null, and a resume may change none of them."""
    from dflash_ref.training.dflash2_options import DFLASH2_DEFAULTS

    options = resolve(parse("--out", str(tmp_path / "run"), "--version", "2", "--selector-top-k", "12"))
    assert options == {**RESOLVED, **DFLASH2_DEFAULTS, "version": 2, "selector_top_k": 12}
    assert all(DEFAULTS[k] is None for k in DFLASH2_DEFAULTS) and DEFAULTS["version"] == 1
    out = started_run(tmp_path / "run", **{k: options[k] for k in ("version", *DFLASH2_DEFAULTS)})
    assert read_config_file(out / CONFIG_NAME)["selector_top_k"] == 12
    assert resolve(parse("--out", str(out), "--resume"))["selector_top_k"] == 12
    for argv, message in (
        (["--selector-top-k", "8"], "--selector-top-k (the run has 12, asked 8)"),
        (["--version", "1"], "--version (the run has 2, asked 1)"),
        (["--conv-group-size", "64"], "--conv-group-size (the run has 16, asked 64)"),
    ):
        with pytest.raises(TrainOptionError) as e:
            resolve(parse("--out", str(out), "--resume", *argv))
        assert message in str(e.value)
    ran = resolve(parse("--out", str(out), "--resume", "--eval-styles", "48", "--steps", "20"))  # may change
    assert ran["eval_styles"] == 48


def test_the_prompt_set_is_held_on_resume_and_refused_beside_a_prompts_file(tmp_path, capsys):
    out = started_run(tmp_path / "run", prompt_set="varied")
    with pytest.raises(TrainOptionError, match=r"--prompt-set \(the run has 'varied', asked 'templates'\)"):
        resolve(parse("--out", str(out), "--resume", "--prompt-set", "templates"))
    prompts = tmp_path / "p.txt"
    prompts.write_text("Hello?\n")
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(tmp_path / "new"), "--prompt-set", "varied", "--prompts-file", str(prompts)])
    assert e.value.code == 2 and "--prompt-set varied chooses among the prompts written here" in capsys.readouterr().err


def test_a_target_folders_widths_are_read_from_its_config_without_loading_it(tmp_path):
    from dflash_ref.training.dflash2_options import target_widths

    assert target_widths("smollm2") == (576, 49152)
    write(tmp_path / "config.json", {"hidden_size": 64, "vocab_size": 100})
    assert target_widths(str(tmp_path)) == (64, 100)
    write(tmp_path / "config.json", {"text_config": {"hidden_size": 32, "vocab_size": 50}, "hidden_size": 8})
    assert target_widths(str(tmp_path)) == (32, 50)
    write(tmp_path / "config.json", {"hidden_size": "64"})
    assert target_widths(str(tmp_path)) is None and target_widths(str(tmp_path / "none")) is None


def test_the_command_line_undoes_a_config_files_switch(tmp_path):
    config = write(tmp_path / "c.json", {"full_vocab": True})
    assert resolve(parse("--out", str(tmp_path / "a"), "--config", str(config)))["full_vocab"] is True
    assert (
        resolve(parse("--out", str(tmp_path / "a"), "--config", str(config), "--no-full-vocab"))["full_vocab"] is False
    )
    config = write(tmp_path / "g.json", {"gamma": 1.0})
    assert resolve(parse("--out", str(tmp_path / "a"), "--config", str(config)))["gamma"] == 1.0
    assert resolve(parse("--out", str(tmp_path / "a"), "--config", str(config), "--gamma", "default"))["gamma"] is None


def test_gamma_takes_a_number_or_default_only(capsys):
    with pytest.raises(SystemExit) as e:
        parse("--out", "x", "--gamma", "paper")
    assert e.value.code == 2 and "a number or 'default', got 'paper'" in capsys.readouterr().err


def test_a_run_from_before_train_config_json_is_still_held_to_its_step(tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    write(out / "state.json", {"step": 300, "losses": []})
    assert resolve(parse("--out", str(out), "--resume", "--layers", "4"))["layers"] == 4  # its draft is checked later
    with pytest.raises(TrainOptionError, match="is at step 300, past --steps 200"):
        resolve(parse("--out", str(out), "--resume", "--steps", "200"))


@pytest.mark.parametrize(
    "state, config, message",
    [
        ({"losses": []}, None, "holds no step"),
        ("{cut", None, "holds no step"),
        ({"step": 3}, [1, 2], "--resume {out}/train_config.json must hold a JSON object of options"),
        ({"step": 3}, {"layers": "2"}, "--resume {out}/train_config.json: layers must be a whole number"),
    ],
)
def test_a_damaged_run_folder_is_named_not_a_traceback(tmp_path, state, config, message):
    out = tmp_path / "run"
    out.mkdir()
    (out / "state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    if config is not None:
        write(out / CONFIG_NAME, config)
    with pytest.raises(TrainOptionError) as e:
        resolve(parse("--out", str(out), "--resume"))
    assert message.format(out=out) in str(e.value)


def test_nothing_to_resume_and_a_run_in_the_way_are_refused(tmp_path):
    with pytest.raises(TrainOptionError, match="holds no training run to continue"):
        resolve(parse("--out", str(tmp_path / "empty"), "--resume"))
    out = started_run(tmp_path / "run", step=250)
    with pytest.raises(TrainOptionError, match="already holds a training run \\(at step 250\\); add --resume"):
        resolve(parse("--out", str(out)))
    (tmp_path / "seeded").mkdir()  # a folder seeded with a data file only is no run
    (tmp_path / "seeded" / "data.jsonl").write_text("")
    assert resolve(parse("--out", str(tmp_path / "seeded")))["prompts"] == DEFAULTS["prompts"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--batch", "0"], "--batch must be at least 1"),
        (["--anchors", "0"], "--anchors must be at least 1"),
        (["--save-every", "0"], "--save-every must be at least 1"),
        (["--layers", "0"], "--layers must be at least 1"),
        (["--negatives", "-1"], "--negatives must be at least 0"),
        (["--distill-batch", "0"], "--distill-batch must be at least 1"),
        (["--eval-tokens", "1"], "--eval-tokens must be at least 2, got 1"),
        (["--lr", "0"], "--lr must be a positive number"),
        (["--seed", "-1"], f"--seed must lie in 0…{2**62 - 1}, got -1"),
        (["--lr", "nan"], "--lr must be a positive number"),
        (["--gamma", "-1"], "--gamma must be a positive number"),
        (["--prompts", "0"], "--prompts must lie in 1…7140"),
        (["--prompts", "7141"], "--prompts must lie in 1…7140"),
        (["--eval-prompts", "145"], "--eval-prompts must lie in 1…144"),
        (["--max-new-tokens", "4"], "leaves no response long enough to train on with blocks of 4"),
        (["--block-size", "8", "--max-new-tokens", "8"], "at least block size + 1 = 9 tokens"),
        (["--config", "/no/such/config.json"], "--config: no file /no/such/config.json"),
        (
            ["--conv-kernel-size", "3"],
            "--conv-kernel-size: DFlash 2 options, for a --version 2 draft (this run is --version 1)",
        ),
        (
            ["--version", "2", "--conv-group-size", "7"],
            "--conv-group-size 7 does not divide the target's hidden size 576; "
            "one of [1, 2, 3, 4, 6, 8, 9, 12, 16, 18,",
        ),
        (["--version", "2", "--selector-rank", "0"], "--selector-rank must be at least 1, got 0"),
        (["--version", "2", "--conv-kernel-size", "0"], "--conv-kernel-size must be at least 1, got 0"),
        (
            ["--version", "2", "--selector-top-k", "49153"],
            "--selector-top-k 49153 exceeds the target's vocabulary of 49152",
        ),
        (["--modules", "conv"], "--modules conv: DFlash 2 options, for a --version 2 draft (this run is --version 1)"),
        (["--version", "2", "--modules", "layers"], "argument --modules: invalid choice: 'layers'"),
        (["--replay", "1.5"], "--replay is the share of a batch's sequences replayed, in 0…1, got 1.5"),
        (["--replay", "nan"], "--replay is the share of a batch's sequences replayed, in 0…1, got nan"),
        (["--replay-every", "0"], "--replay-every must be at least 1, got 0"),
        (["--target-layers", "0"], "--target-layers must be at least 1, got 0"),
        (["--soft-labels", "-0.1"], "--soft-labels is the soft labels' share α of the loss, in 0…1, got -0.1"),
        (["--soft-labels", "inf"], "--soft-labels is the soft labels' share α of the loss, in 0…1, got inf"),
        (["--replay-sequences", "0"], "--replay-sequences must be at least 1, got 0"),
        (["--version", "3"], "argument --version: invalid choice: 3"),
        (["--prompt-set", "tables"], "argument --prompt-set: invalid choice: 'tables'"),
        (
            ["--prompt-set", "varied", "--prompts", "28561"],
            "--prompts must lie in 1…28560 (the varied training prompts",
        ),
        (["--eval-styles", "49"], "--eval-styles must lie in 0…48"),
        (["--eval-styles", "-1"], "--eval-styles must lie in 0…48"),
        (["--resume"], "holds no training run to continue"),
    ],
)
def test_train_refuses_bad_options_before_any_work(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(out)] + flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
    assert not out.exists()  # nothing loaded, distilled or written


@pytest.mark.parametrize(
    "folder, command",
    [
        ("smollm2", {"prompts": 5580, "steps": 5600}),
        ("smollm2_dflash2", {"version": 2, "prompt_set": "mixed", "prompts": 4000, "steps": 5000}),
    ],
)
# both ran in bf16 on an Intel Xeon with AMX, where `auto` (the default now) chooses bf16
def test_the_shipped_drafts_options_are_a_config_for_their_runs(folder, command):
    """drafts/*/train_config.json: the training README's command for each shipped draft (the defaults plus
    the options named here; a DFlash 2 run records its modules' defaults too), readable by --config, and
    the draft's own shape."""
    options = read_config_file(DRAFTS / folder / CONFIG_NAME)
    recorded = DFLASH2_DEFAULTS if options.get("version") == 2 else {}
    assert {k: v for k, v in options.items() if v != DEFAULTS[k]} == command | recorded | dict.fromkeys(
        DTYPE_OPTIONS, "bf16"
    )
    draft = json.loads((DRAFTS / folder / "config.json").read_text())
    assert (draft["num_hidden_layers"], draft["block_size"]) == (options["layers"], options["block_size"])


# the data file: distill.read_responses


def rows_for(prompt_list, max_new_tokens=6, stop=2):
    """Rows as self_distill writes them: 3 prompt tokens, then a stopped or a cut response."""
    return [
        {"prompt": p, "prompt_len": 3, "ids": [7, 8, 9] + ([5, 6, stop] if i % 2 else [5] * max_new_tokens)}
        for i, p in enumerate(prompt_list)
    ]


def write_rows(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_missing_data_file_holds_no_rows():
    prompts = written.prompts("train")[:5]
    assert distill.read_responses(Path("/no/such/data.jsonl"), prompts, 6) == []


def test_rows_past_the_prompts_asked_are_left_unused(tmp_path):
    prompts, said = written.prompts("train")[:5], []
    path = write_rows(tmp_path / "data.jsonl", rows_for(prompts))
    assert distill.read_responses(path, prompts[:2], 6, say=said.append) == rows_for(prompts)[:2]
    assert said == [f"{path}: using the first 2 of its 5 responses"]
    assert distill.read_responses(path, prompts + written.prompts("train")[5:9], 6) == rows_for(prompts)


@pytest.mark.parametrize("cut", [20, None])  # the line cut short, or whole but without its newline
def test_a_last_line_without_its_end_is_dropped_from_the_file(tmp_path, cut):
    prompts = written.prompts("train")[:3]
    path = write_rows(tmp_path / "data.jsonl", rows_for(prompts[:2]))
    whole = path.read_text()
    path.write_text(whole + json.dumps(rows_for(prompts)[2])[:cut])  # a run stopped while writing
    said = []
    assert distill.read_responses(path, prompts, 6, say=said.append) == rows_for(prompts)[:2]
    assert path.read_text() == whole and "line 3 has no end of line" in said[0]


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            lambda rows: rows.__setitem__(1, {**rows[1], "prompt": "Something else?"}),
            "line 2 answers 'Something else?', but training prompt 2 is",
        ),
        (
            lambda rows: rows.__setitem__(0, {**rows[0], "ids": [7, 8, 9, 5, 5]}),  # cut at 2: another limit
            "line 1 holds a response of 2 tokens cut without a stop token, which a run with --max-new-tokens 6",
        ),
        (
            lambda rows: rows.__setitem__(1, {**rows[1], "ids": [7, 8, 9] + [5] * 7 + [2]}),  # longer than the limit
            "line 2 holds a response of 8 tokens ending at a stop token",
        ),
        (lambda rows: rows.__setitem__(0, {"prompt": "x"}), "line 1 is not a response row"),
        # token ids the target cannot embed used to fail raw in torch's embedding, after the features
        (
            lambda rows: rows[1]["ids"].__setitem__(4, 999999),
            "line 2 is not a response row (token id 999999 is past the target's vocabulary of 100)",
        ),
        (lambda rows: rows[0]["ids"].__setitem__(3, -5), "line 1 is not a response row (ids holds something other"),
        (lambda rows: rows[0]["ids"].__setitem__(3, 5.0), "line 1 is not a response row (ids holds something other"),
        (lambda rows: rows[2].__setitem__("prompt_len", 0), "line 3 is not a response row (prompt_len 0 does not lie"),
        (lambda rows: rows[2].__setitem__("prompt_len", 99), "line 3 is not a response row (prompt_len 99 does not"),
    ],
)
def test_a_data_file_from_other_prompts_or_another_limit_is_refused(tmp_path, damage, message):
    prompts = written.prompts("train")[:3]
    rows = rows_for(prompts)
    damage(rows)
    path = write_rows(tmp_path / "data.jsonl", rows)
    with pytest.raises(distill.DataFileError) as e:
        distill.read_responses(path, prompts, 6, vocab_size=100)
    assert message in str(e.value) and str(path) in str(e.value)
