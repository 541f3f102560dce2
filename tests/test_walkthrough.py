"""The walkthrough, the main job: its notebooks run headless in real kernels (once per test session, by the
command a user runs), what is committed is what they produce, their checks can fail, their knobs work, and
their exercises hold a prediction to the run.

The one walkthrough run's subprocess limit only catches a hang: on a busy 2-core machine the run takes several
times its idle minutes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from notebook_cells import CellFailed, cell_with, code_cells, mutate, run_cells

from dflash_ref import (
    acceptance,
    attention,
    candidate_selector,
    context,
    decoding,
    draft_layer,
    draft_model,
    dynamic_conv,
    layer_sampling,
    mlp,
    rmsnorm,
    rope,
)
from dflash_ref import config as config_module
from dflash_ref.tour import notebooks as walkthrough

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "figures"
SOURCES = sorted((ROOT / "walkthroughs").glob("[0-9]*.py"))
HANG = 3600  # seconds: a hang, not a slow machine


@pytest.fixture(scope="module")
def walkthrough_run(tmp_path_factory):
    """`python -m dflash_ref walkthrough`, figures and executed notebooks written to a temporary folder."""
    out = tmp_path_factory.mktemp("walkthrough")
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "walkthrough", "--out", str(out / "figures"), "--notebooks", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=HANG,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, proc.stderr


# -- the run, as a user sees it -------------------------------------------------------------------------------


def test_the_walkthrough_tells_each_notebook_as_it_runs(walkthrough_run):
    _, text, _ = walkthrough_run
    banners = [text.index(f"== {n.title}  [{n.takes} on a 2-core CPU]") for n in walkthrough.NOTEBOOKS]
    ends = [text.index(f"-- {n.name}: ") for n in walkthrough.NOTEBOOKS]
    assert banners == sorted(banners) and all(b < e for b, e in zip(banners, ends))  # said before it runs
    for expected in [
        "## 1. Layer sampling, and the +1 offset",  # a heading, as the run reaches it
        "library: build_target_layer_ids(6, 2) = [1, 3]",  # a cell's output
        "Qwen3-8B, 36 layers, a 5-layer draft: [1, 9, 17, 25, 33]",
        "→ τ = 2; bonus = posterior_2",
        "FIRST DIVERGENCE: walkthrough · step 0 · layer 0 · Q after RoPE",
        "Predict first: set the variable above",
    ]:
        assert expected in text, expected


def test_progress_bars_draw_on_stderr_token_by_token_and_end_at_their_totals(walkthrough_run):
    _, text, err = walkthrough_run
    assert "tok/s" not in text  # stdout is the story alone
    for bar, total in (("trained draft", 64), ("random draft", 64), ("traced decode", 64), ("held-out prompts", 384)):
        counts = [int(n) for n in re.findall(rf"{bar}:.*?\| *(\d+)/{total} ", err)]
        assert counts and counts[-1] == total, bar  # it ends at its total
        assert len(set(counts)) > 3, bar  # and moved on the way: per step, not once per decode


def test_every_notebook_ran_without_error_and_shows_its_figures(walkthrough_run):
    out, _, _ = walkthrough_run
    for source in SOURCES:
        executed = json.loads((out / f"{source.stem}.ipynb").read_text())
        outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert not [o for o in outputs if o.get("output_type") == "error"], source.stem
        assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2, source.stem


def test_the_walkthrough_writes_the_committed_figures(walkthrough_run):
    from matplotlib.testing.compare import compare_images

    out, _, _ = walkthrough_run
    written = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert written == sorted(p.name for p in FIGURES.glob("0*.png")) and written
    for name in written:
        if (out / "figures" / name).read_bytes() != (FIGURES / name).read_bytes():
            # the same pixels up to font-rasteriser noise across matplotlib/freetype builds
            assert compare_images(str(FIGURES / name), str(out / "figures" / name), tol=2) is None, name


def test_the_viewers_are_written_and_a_committed_screenshot_shows_each(walkthrough_run):
    out, _, _ = walkthrough_run
    assert sorted(p.name for p in (out / "figures").glob("*.html")) == [
        "02_decode_loop.html",
        "04_dflash2_smollm2.html",
    ]
    shown = {m for s in SOURCES for m in re.findall(r'Image\("\.\./(figures/[\w.]+\.png)"', s.read_text())}
    assert len(shown) == 2 and all((ROOT / f).is_file() for f in shown)  # no link a clone lacks


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_the_committed_notebook_is_its_source_executed(source):
    jupytext = pytest.importorskip("jupytext")
    committed = json.loads(source.with_suffix(".ipynb").read_text())
    assert ["".join(c["source"]) for c in committed["cells"]] == [c.source for c in jupytext.read(source).cells], (
        "regenerate with: python -m dflash_ref walkthrough"
    )
    outputs = [o for c in committed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert outputs and not [o for o in outputs if o.get("output_type") == "error"]


def test_each_notebook_opens_with_its_knobs_and_says_what_it_needs():
    for source in SOURCES:
        _, cell = code_cells(source.stem)[0]
        assert "parameters" in cell.metadata.get("tags", []), source.stem
        knobs = {k.strip() for line in re.findall(r"^([\w, ]+?) = ", cell.source, re.M) for k in line.split(",")}
        assert {"prompt", "block_size", "figures"} <= knobs and knobs & {"layer", "head"}, (source.stem, knobs)
        assert "**Needs**" in source.read_text(), source.stem


# -- the checks can fail: a library with one stage broken stops its notebook at that stage's cell ------------


def _offset_zero(mp):
    mp.setattr(layer_sampling, "HIDDEN_STATE_OFFSET", 0)


def _mutant(owner, name, old, new, *also, occurrences=1):
    return lambda mp: mutate(mp, owner, name, old, new, *also, occurrences=occurrences)


SMOLLM2 = 'require("smollm2")'  # the in-process runs stop before the SmolLM2 parts
KV, SCORES = "q = rms_norm(heads(x @ attn.q_proj.weight.T, H_q), attn.q_norm)", "scores = q_rot @ k_rot[kv_of_head]"
MUTANTS = {  # stage → (notebook, the library broken there, the cell that must fail)
    "layer ids": (
        "01_kv_injection",
        _mutant(layer_sampling, "build_target_layer_ids", "first, last = 1,", "first, last = 2,", config_module),
        "by_hand = [L // 2]",
    ),
    "the +1 offset": ("01_kv_injection", _offset_zero, 'assert_close(target_hidden, trace["draft.hook_target_hidden"'),
    "RMSNorm's ε inside the root": (
        "01_kv_injection",
        _mutant(
            rmsnorm.RMSNorm,
            "forward",
            "x32.pow(2).mean(-1, keepdim=True) + self.eps",
            "x32.pow(2).mean(-1, keepdim=True) + 0.5",
        ),
        "C = rms_norm(fc_out, draft.hidden_norm)",
    ),  # fmt: skip
    "the block shifted in its embedding": (
        "01_kv_injection",
        _mutant(decoding, "draft_block", "target.embed(block_ids)", "target.embed(block_ids.roll(1, dims=1))"),
        "H = target.model.embed_tokens.weight[block]",
    ),
    "the residual subtracted": (
        "01_kv_injection",
        _mutant(draft_layer.DFlashDecoderLayer, "forward", "hidden_states + attended", "hidden_states - attended"),
        "resid_mid = H_in + attn_out",
    ),
    "the MLP's gate by GELU": (
        "01_kv_injection",
        _mutant(mlp.SwiGLU, "forward", "F.silu(", "F.gelu("),
        "resid_mid = H_in + attn_out",
    ),
    "C without hidden_norm": (
        "01_kv_injection",
        _mutant(context, "project_context", "context = hidden_norm(projected)", "context = projected", draft_model),
        "C = rms_norm(fc_out, draft.hidden_norm)",
    ),
    "K_ctx without KNorm": (
        "01_kv_injection",
        _mutant(
            attention.KVInjectionAttention,
            "forward",
            "self.k_norm(heads(self.k_proj(context)))",
            "heads(self.k_proj(context))",
        ),
        KV,
    ),  # fmt: skip
    "V as [V_noise; V_ctx]": (
        "01_kv_injection",
        _mutant(
            attention.KVInjectionAttention,
            "forward",
            "[heads(self.v_proj(context)), heads(self.v_proj(hidden_states))]",
            "[heads(self.v_proj(hidden_states)), heads(self.v_proj(context))]",
        ),
        KV,
    ),  # fmt: skip
    "Q rotated at the first positions": (
        "01_kv_injection",
        _mutant(
            rope,
            "apply_sliced_rope",
            "q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]",
            "q * cos[..., :q_len, :] + rotate_half(q) * sin[..., :q_len, :]",
            attention,
        ),
        "q_rot = q * cos[-L_q:]",
    ),  # fmt: skip
    "a causal mask in the block": (
        "01_kv_injection",
        _mutant(attention.KVInjectionAttention, "forward", "is_causal=self.is_causal,", "is_causal=True,"),
        SCORES,
    ),
    "scores scaled by 1/d_h": (
        "01_kv_injection",
        _mutant(attention.KVInjectionAttention, "forward", "self.scaling,", "self.head_dim**-1.0,"),
        SCORES,
    ),
    "KV heads tiled, not shared by neighbours": (
        "01_kv_injection",
        _mutant(attention, "attend", '"b hkv l d -> b (hkv g) l d"', '"b hkv l d -> b (g hkv) l d"', occurrences=2),
        SCORES,
    ),  # fmt: skip
    "the logits of positions 0 … γ − 1": (
        "01_kv_injection",
        _mutant(decoding, "draft_block", "hidden = hidden[:, 1:]", "hidden = hidden[:, :-1]"),
        "logits = out[1:] @ target.lm_head.weight.T",
    ),
    "the posterior one position off": (
        "02_decode_loop",
        _mutant(
            acceptance,
            "verify_greedy",
            "posterior = target_logits.argmax(dim=-1)",
            "posterior = target_logits.roll(1, dims=1).argmax(dim=-1)",
        ),
        "posterior = logits.argmax(dim=-1)",
    ),  # fmt: skip
    "τ counting matches after a mismatch": (
        "02_decode_loop",
        _mutant(
            acceptance, "acceptance_length", "matches.int().cumprod(dim=1).sum(dim=1)[0]", "matches.int().sum(dim=1)[0]"
        ),
        "tau = int(matches.cumprod(0).sum())",
    ),  # fmt: skip
    "the bonus after the wrong position": (
        "02_decode_loop",
        _mutant(
            acceptance,
            "verify_greedy",
            "return tau, posterior[0, tau], posterior",
            "return tau, posterior[0, min(tau + 1, posterior.shape[1] - 1)], posterior",
        ),
        "tau = int(matches.cumprod(0).sum())",
    ),  # fmt: skip
    "the target cache not cropped": (
        "02_decode_loop",
        _mutant(decoding, "spec_generate", "target_cache.crop(start + produced)", "pass"),
        "produced = min(tau + 1,",
    ),
    "the draft cache not cropped": (
        "02_decode_loop",
        _mutant(decoding, "draft_block", "draft_cache.crop(start)", "pass"),
        "produced = min(tau + 1,",
    ),
    "the next context one position late": (
        "02_decode_loop",
        _mutant(
            decoding,
            "spec_generate",
            "draft.target_layer_ids)[:, :produced]",
            "draft.target_layer_ids)[:, 1 : produced + 1]",
        ),
        "nxt = trace.records[step + 1]",
    ),  # fmt: skip
    "a convolution that reads later positions": (
        "04_dflash2",
        _mutant(
            dynamic_conv,
            "convolve",
            "F.pad(x[:, : x.shape[1] - j], (0, 0, 0, 0, j, 0))",
            "F.pad(x[:, j:], (0, 0, 0, 0, 0, j))",
        ),
        "prepared = lag_terms(x, taps[:, 0], conv.base_kernel[0])",
    ),  # fmt: skip
    "the pair term's predecessor the argmax": (
        "04_dflash2",
        _mutant(
            candidate_selector.CandidateSelector,
            "select",
            "path.append(predecessor)\n",  # (the method's source is dedented: its loop body at 8 spaces)
            "path.append(predecessor)\n"
            "        predecessor = candidates[:, t].gather(-1, unary[:, t].argmax(-1)[:, None])[:, 0]\n",
        ),
        "def walk(s)",
    ),  # fmt: skip
}


@pytest.mark.parametrize("stage", list(MUTANTS))
def test_a_library_broken_at_one_stage_stops_its_notebook_at_that_stages_cell(stage, monkeypatch, tmp_path):
    pytest.importorskip("jupytext")
    notebook, breaks, marker = MUTANTS[stage]
    run_cells(notebook, {"figures": str(tmp_path)}, until=SMOLLM2)  # whole, it runs through
    breaks(monkeypatch)
    with pytest.raises(CellFailed) as failed:
        run_cells(notebook, {"figures": str(tmp_path)}, until=SMOLLM2)
    assert failed.value.index == cell_with(notebook, marker), str(failed.value)


# -- the knobs, and the exercises ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "notebook, knobs",
    [
        ("01_kv_injection", {"block_size": 6}),
        ("01_kv_injection", {"block_size": 2}),
        ("01_kv_injection", {"prompt": "the dog ran to the park", "layer": 1, "head": 1}),
        ("02_decode_loop", {"block_size": 6, "step": 1, "target_layer": 2}),
        ("02_decode_loop", {"block_size": 2}),
        ("02_decode_loop", {"prompt": "the cat sat", "max_new_tokens": 16}),  # a later step is the first to accept
        ("04_dflash2", {"block_size": 6, "layer": 1, "step": 2}),
    ],
)
def test_the_notebooks_pass_their_own_checks_with_other_knobs(notebook, knobs, tmp_path):
    pytest.importorskip("jupytext")
    found = run_cells(notebook, {**knobs, "figures": str(tmp_path)}, until=SMOLLM2)
    assert torch.is_grad_enabled()  # what the notebook switched off for itself is back
    knobs = {"prompt": found["prompt"], "block_size": found["block_size"], "layer": found["layer"], **knobs}
    assert found["input_ids"].shape[1] == len(knobs["prompt"].split())
    if notebook == "02_decode_loop":  # the walked step: the one asked for, else the first that accepted a token
        walked = knobs.get("step") or next(r.step for r in found["trace"].records if r.acceptance_length)
        assert found["r"].step == walked and found["r"].acceptance_length > 0
        assert max(len(r.q_position_ids) for r in found["trace"].records) == knobs["block_size"]
    else:
        assert len(found["record"].q_position_ids) == knobs["block_size"]
    if notebook == "01_kv_injection":  # the figure of the layer and head asked for
        assert (tmp_path / f"01_attention_step0_layer{knobs['layer']}_head{found['head']}.png").is_file()


def test_a_step_with_no_step_after_it_is_refused_by_name(tmp_path):
    pytest.importorskip("jupytext")
    with pytest.raises(CellFailed) as failed:
        run_cells("02_decode_loop", {"step": 8, "figures": str(tmp_path)}, until=SMOLLM2)
    assert failed.value.index == cell_with("02_decode_loop", "walkable = ")
    assert "step = 8: this run's steps to walk are [0, 1, 2, 3, 4, 5, 6, 7]" in str(failed.value.error)


EXERCISES = {  # notebook → (a marker of its exercise cell, the right answer, a wrong one), as Python text
    "01_kv_injection": [("trace6", "(2, 6, 9)", "(2, 6, 6)"), ("q8 = torch.zeros", "1", "0")],
    "02_decode_loop": [("OracleDraft(draft", "(7, 5, 2)", "(7, 4, 1)")],
    "03_verify_your_port": [("class WrongTheta", '"q_rot"', '"q"')],
    "04_dflash2": [("prepared[j, 1]", "[2]", "[1, 2]")],
}


@pytest.mark.parametrize("notebook", list(EXERCISES))
def test_an_exercise_holds_a_prediction_to_the_run(notebook, tmp_path, capsys):
    pytest.importorskip("jupytext")
    if notebook.startswith("03"):
        pytest.importorskip("dflash")
    stop = "write_report_html(" if notebook.startswith("03") else SMOLLM2
    knobs = {"figures": str(tmp_path)}
    run_cells(notebook, knobs, until=stop, answers={marker: right for marker, right, _ in EXERCISES[notebook]})
    assert capsys.readouterr().out.count("right: ") == len(EXERCISES[notebook])
    for marker, _, wrong in EXERCISES[notebook]:
        with pytest.raises(CellFailed) as failed:
            run_cells(notebook, knobs, until=stop, answers={marker: wrong})
        assert failed.value.index == cell_with(notebook, marker)
        assert isinstance(failed.value.error, AssertionError) and "not quite: you predicted" in str(failed.value.error)
    assert sum(len(e) for e in EXERCISES.values()) >= 3


def test_check_keeps_the_answer_back_until_a_prediction_is_made(capsys):
    from dflash_ref.tour.exercises import check

    assert check(None, 3, "because") is False and "Predict first" in capsys.readouterr().out
    assert check(3, 3, "because") is True and capsys.readouterr().out == "right: 3. because\n"
    with pytest.raises(AssertionError, match=r"you predicted 2, the run gave 3\. because"):
        check(2, 3, "because")


def test_show_source_prints_the_library_file_at_its_lines(capsys):
    from dflash_ref.layer_sampling import build_target_layer_ids
    from dflash_ref.tour.source import show_source

    show_source(build_target_layer_ids, "if num_draft_layers == 1", "return [round")
    header, *body = capsys.readouterr().out.splitlines()
    path, lines = re.match(r"# (\S+), lines (\d+)–(\d+)", header).group(1), header.split("lines ")[1].split("–")
    source = (ROOT / path).read_text().splitlines()[int(lines[0]) - 1 : int(lines[1])]
    assert body == source and body[0].strip() == "if num_draft_layers == 1:"
    with pytest.raises(ValueError, match="no line containing 'nowhere'"):
        show_source(build_target_layer_ids, "nowhere")


# -- what the notebooks stand on -------------------------------------------------------------------------------


def test_the_trained_toy_drafts_beat_random_ones_on_fresh_prompts():
    from dflash_ref.tour.demo import VOCAB, demo_models, encode
    from dflash_ref.tour.dflash2 import dflash2_models

    generator = torch.Generator().manual_seed(7)
    words = [w for w in VOCAB if w not in ("<mask>", "<s>", "</s>")]
    prompts = [[words[int(i)] for i in torch.randint(len(words), (3,), generator=generator)] for _ in range(12)]
    (target, trained), (_, random) = demo_models(trained=True), demo_models()
    _, trained2, _ = dflash2_models(trained=True)
    for draft in (trained, trained2, random):
        draft.accepted = sum(
            sum(decoding.spec_generate(draft, target, encode(p), 16).acceptance_lengths) for p in prompts
        )
    assert trained.accepted > 3 * max(random.accepted, 1) and trained2.accepted > 3 * max(random.accepted, 1)
    with pytest.raises(ValueError, match="trained=True needs seed=0"):
        demo_models(seed=1, trained=True)
    with pytest.raises(ValueError, match=r"\['kitten'\]: a prompt is words of the toy vocabulary"):
        encode("a kitten")


def test_decode_progress_counts_committed_tokens_and_ends_at_its_total():
    from dflash_ref.tour.demo import demo_models, encode
    from dflash_ref.tour.progress import DecodeProgress

    target, draft = demo_models(trained=True)
    seen = []
    with DecodeProgress("toy", 16, decodes=2, on=False) as bar:
        out = decoding.spec_generate(
            draft, target, encode("a cat sat"), 16, on_step=lambda step: (bar.on_step(step), seen.append(bar.count))
        )
        assert seen == [1 + sum(out.tokens_per_step[: i + 1]) for i in range(len(seen))]  # x_0, then τ + 1 a step
        bar.end_decode()
        stopped = decoding.spec_generate(
            draft, target, encode("a cat sat"), 16, stop_token_ids=[12], on_step=bar.on_step
        )
        assert stopped.num_output_tokens < 16  # "and" (12) stopped it early
        bar.end_decode()
        assert bar.count == bar.bar.total == 32  # the stopped decode's unused budget, taken at its end


def test_tidy_numbers_the_cells_and_drops_progress_bars_only():
    nbformat = pytest.importorskip("nbformat")

    stream = lambda name, text: nbformat.v4.new_output("stream", name=name, text=text)  # noqa: E731
    cell = nbformat.v4.new_code_cell("load()")
    tqdm_warning = (
        "/x/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update\n"
        "  from .autonotebook import tqdm as notebook_tqdm\n"
    )
    cell.outputs = [
        stream("stderr", "\rLoading:  50%|█████ "),
        stream("stderr", "\n"),
        stream("stderr", tqdm_warning),
        stream("stderr", "/x/y.py:3: UserWarning: real\n  warn()\n" + tqdm_warning + "another\n"),
        stream("stdout", "τ 1.79\n"),
    ]
    notebook = walkthrough.tidy(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# x"), cell]))
    assert [c.id for c in notebook.cells] == ["cell-0", "cell-1"]
    # a real warning sent in the same chunk as tqdm's stays, with its own source line
    assert [o.text for o in notebook.cells[1].outputs] == [
        "/x/y.py:3: UserWarning: real\n  warn()\nanother\n",
        "τ 1.79\n",
    ]


def test_parameters_are_injected_after_the_parameters_cell_as_papermill_does():
    jupytext = pytest.importorskip("jupytext")
    notebook = walkthrough.with_parameters(jupytext.read(SOURCES[0]), {"block_size": 6})
    index = next(i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", []))
    injected = notebook.cells[index + 1]
    assert injected.metadata["tags"] == ["injected-parameters"] and injected.source == "# Parameters\nblock_size = 6\n"


# -- what the command refuses, before any work -----------------------------------------------------------------


def test_the_walkthrough_names_what_it_lacks(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "dflash" else real(name, *a))
    with pytest.raises(SystemExit, match=r"needs dflash \(pip install --no-deps dflash==0\.1\.0\)"):
        walkthrough.run(only=["03"])
    with pytest.raises(SystemExit, match=r"no walkthrough named \['07'\]"):
        walkthrough.run(only=["07"])
    with pytest.raises(ModuleNotFoundError, match="this notebook needs dflash: pip install --no-deps dflash==0.1.0"):
        walkthrough.require("dflash")


def test_the_walkthrough_refuses_a_folder_that_is_a_file_before_running(tmp_path, capsys, monkeypatch):
    from dflash_ref.__main__ import main
    from dflash_ref.cli import walkthrough as command

    monkeypatch.setattr(command, "run", lambda *a, **k: pytest.fail("the walkthrough ran"))
    (tmp_path / "afile").write_text("not a folder")
    for option in ("--out", "--notebooks"):
        with pytest.raises(SystemExit) as e:
            main(["walkthrough", option, str(tmp_path / "afile")])
        assert e.value.code == 2 and f"{option} {tmp_path / 'afile'} is a file, not a folder" in capsys.readouterr().err


def test_a_failing_cell_is_named_with_its_notebook_and_heading(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    source = tmp_path / "09_broken.py"
    source.write_text('# %% [markdown]\n# ## 1. A stage\n\n# %% tags=["parameters"]\nx = 1\n\n# %%\nassert x == 2\n')
    with pytest.raises(SystemExit, match=r"09_broken stopped at cell 2 \(## 1\. A stage\): AssertionError"):
        walkthrough.run(notebooks=tmp_path, only=["09"], folder=tmp_path)
    written = nbformat.read(tmp_path / "09_broken.ipynb", as_version=4)
    assert written.cells[2].outputs[0].output_type == "error"  # the executed part is kept, to look at
