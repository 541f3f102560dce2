"""The walkthrough's checks, knobs and exercises, its notebooks' cells run in this process (tour/cells.py): a library
broken at one stage stops its notebook at that stage's cell, every knob offered gives a true run (its checks held
to float32's rounding measured in the run) and every knob out of range is refused in one line, and each exercise
holds a prediction or the learner's code to the library. The notebooks run in real kernels in
tests/test_walkthrough.py; here, a kernel per run would cost minutes."""

from __future__ import annotations

import contextlib
import io
import re
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

ROOT = Path(__file__).resolve().parent.parent

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
            "committed_features",
            "layer_ids)[:, :produced]",
            "layer_ids)[:, 1 : produced + 1]",
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


SHIPPED_RUNS: dict[str, tuple[dict, str]] = {}  # notebook → (namespace, stdout) of its run as shipped


def shipped_run(notebook: str, tmp_path) -> tuple[dict, str]:
    """Notebook `notebook` as shipped (its default knobs, until SMOLLM2), run once in this module: the same run is
    the control of every stage's mutant, the default block size's true run and the code exercises' untouched run,
    each of which ran it again. → (its namespace, what it printed)"""
    if notebook not in SHIPPED_RUNS:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            found = run_cells(notebook, {"figures": str(tmp_path)}, until=SMOLLM2)
        assert torch.is_grad_enabled()  # what the notebook switched off for itself is back
        SHIPPED_RUNS[notebook] = found, printed.getvalue()
    return SHIPPED_RUNS[notebook]


@pytest.mark.parametrize("stage", list(MUTANTS))
def test_a_library_broken_at_one_stage_stops_its_notebook_at_that_stages_cell(stage, monkeypatch, tmp_path):
    pytest.importorskip("jupytext")
    notebook, breaks, marker = MUTANTS[stage]
    shipped_run(notebook, tmp_path)  # whole, unbroken, it runs through (run once per notebook)
    breaks(monkeypatch)
    with pytest.raises(CellFailed) as failed:
        run_cells(notebook, {"figures": str(tmp_path)}, until=SMOLLM2)
    assert failed.value.index == cell_with(notebook, marker), str(failed.value)


# -- the knobs, and the exercises ------------------------------------------------------------------------------


TOY_BLOCK_SIZES = list(range(2, 9))  # what the notebooks offer: a toy draft is trained for each
DEFAULT_BLOCK_SIZE = 4  # the parameters cell's block_size in 01, 02 and 04 (checked below)


def test_the_default_block_size_is_the_parameters_cells():
    for notebook in ("01_kv_injection", "02_decode_loop", "04_dflash2"):
        _, cell = code_cells(notebook)[0]
        assert re.search(rf"^block_size = {DEFAULT_BLOCK_SIZE}  #", cell.source, re.M), notebook


@pytest.mark.parametrize("block_size", TOY_BLOCK_SIZES)
@pytest.mark.parametrize("notebook", ["01_kv_injection", "02_decode_loop", "04_dflash2"])
def test_every_block_size_offered_gives_a_true_run(notebook, block_size, tmp_path):
    """Every check of the notebook holds at every block size it offers, its tolerances measured in the run."""
    pytest.importorskip("jupytext")
    if block_size == DEFAULT_BLOCK_SIZE:  # the notebook as shipped: its one run
        found, _ = shipped_run(notebook, tmp_path)
    else:
        found = run_cells(notebook, {"block_size": block_size, "figures": str(tmp_path)}, until=SMOLLM2)
    assert torch.is_grad_enabled()  # what the notebook switched off for itself is back
    assert found["draft"].block_size == block_size
    records = found["trace"].records
    assert max(len(r.q_position_ids) for r in records) == block_size
    assert found["rounding"].worst and max(found["rounding"].worst.values()) <= 1  # every check ran, and held
    if notebook == "02_decode_loop":  # the walked step: the first that accepted a token, if any did
        accepting = [r.step for r in records[:-1] if r.acceptance_length]
        assert found["r"].step == (accepting[0] if accepting else 0)


@pytest.mark.parametrize(
    "notebook, knobs",
    [
        ("01_kv_injection", {"prompt": "the dog ran to the park", "layer": 1, "head": 1}),
        ("02_decode_loop", {"block_size": 6, "step": 1, "target_layer": 2, "layer": 1, "head": 1}),
        ("02_decode_loop", {"prompt": "the cat sat", "max_new_tokens": 16}),  # a later step is the first to accept
        ("03_verify_your_port", {"block_size": 6, "max_new_tokens": 9, "head": 1}),
        ("04_dflash2", {"block_size": 6, "layer": 1, "step": 2, "max_new_tokens": 24}),
        ("05_training", {"block_size": 2, "steps": 12, "prompts": 16}),
    ],
)
def test_the_notebooks_pass_their_own_checks_with_other_knobs(notebook, knobs, tmp_path):
    pytest.importorskip("jupytext")
    if notebook.startswith("03"):
        pytest.importorskip("dflash")
    until = "generate_golden" if notebook.startswith("03") else SMOLLM2  # 03's §5 is the same whatever the knobs
    found = run_cells(notebook, {**knobs, "figures": str(tmp_path)}, until=until)
    assert torch.is_grad_enabled()
    if "prompt" in knobs:
        assert found["input_ids"].shape[1] == len(knobs["prompt"].split())
    if notebook == "01_kv_injection":  # the figure of the layer and head asked for
        assert (tmp_path / f"01_attention_step0_layer{knobs['layer']}_head{knobs['head']}.png").is_file()
    if notebook == "02_decode_loop":
        walked = knobs.get("step") or next(r.step for r in found["trace"].records if r.acceptance_length)
        assert found["r"].step == walked
    if notebook == "03_verify_your_port":  # the bundle's first block is the one asked for, drafted whole
        assert f"block size {knobs['block_size']}" in found["bundle"].manifest["description"]
        drafted = [e for e in found["bundle"].entries if e["stage"] == "draft_tokens" and e["step"] == 0]
        assert drafted and drafted[0]["shape"][-1] == knobs["block_size"] - 1
    if notebook == "04_dflash2":
        assert found["record"].step == knobs["step"] and len(found["record"].q_position_ids) == knobs["block_size"]
    if notebook == "05_training":
        assert len(found["losses"]) == knobs["steps"] and len(found["data"]) == knobs["prompts"]
        assert {p.name for p in tmp_path.glob("05_*.png")} == {
            "05_training.png", "05_acceptance_by_position.png", "05_block_sizes.png"
        }  # fmt: skip


@pytest.mark.parametrize(
    "notebook, knobs, cell, says",
    [
        ("01_kv_injection", {"block_size": 1}, "demo_models(block_size=block_size", "block_size = 1: this run offers "
         "block_size 2 to 8 (the block sizes the toy drafts are trained for)"),
        ("01_kv_injection", {"block_size": 9}, "demo_models(block_size=block_size", "block_size = 9: this run offers"),
        ("01_kv_injection", {"layer": 2}, "demo_models(block_size=block_size", "layer = 2: this run offers layer 0, 1"),
        ("01_kv_injection", {"head": 2}, "demo_models(block_size=block_size", "head = 2: this run offers head 0, 1"),
        ("02_decode_loop", {"step": 8}, "walkable = ", "step = 8: this run offers step 0 to 7 (each needs a step "
         "after it in this run)"),
        ("02_decode_loop", {"max_new_tokens": 5}, "demo_models(block_size=block_size",
         "max_new_tokens = 5: this run offers max_new_tokens 6 to 200"),
        ("02_decode_loop", {"target_layer": 6}, "demo_models(block_size=block_size",
         "target_layer = 6: this run offers target_layer 0 to 5"),
        ("03_verify_your_port", {"block_size": 6, "max_new_tokens": 4}, 'require("dflash")',
         "max_new_tokens = 4: this run offers max_new_tokens 6 to 64 (a first block of 6 needs that many)"),
        ("04_dflash2", {"step": 99}, 'knob("step"', "step = 99: this run offers step 0 to 8 (this run's steps)"),
        ("04_dflash2", {"layer": 5}, "dflash2_models(block_size=block_size", "layer = 5: this run offers layer 0, 1"),
        ("05_training", {"steps": 0}, 'knob("steps"', "steps = 0: this run offers steps 1 to 3000"),
    ],
)  # fmt: skip
def test_a_knob_out_of_its_range_is_refused_in_one_line_naming_the_range(notebook, knobs, cell, says, tmp_path):
    pytest.importorskip("jupytext")
    if notebook.startswith("03"):
        pytest.importorskip("dflash")
    with pytest.raises(CellFailed) as failed:
        run_cells(notebook, {**knobs, "figures": str(tmp_path)}, until=SMOLLM2)
    assert failed.value.index == cell_with(notebook, cell)
    assert isinstance(failed.value.error, ValueError) and says in str(failed.value.error)
    assert "\n" not in str(failed.value.error)


EXERCISES = {  # notebook → (a marker of its exercise cell, the right answer, a wrong one), as Python text
    "01_kv_injection": [("trace6", "[2, 6, 9]", "(2, 6, 6)"), ("q8 = torch.zeros", "1", "0")],
    "02_decode_loop": [("OracleDraft(draft", "(7, 5, 2)", "(7, 4, 1)")],
    "03_verify_your_port": [("class WrongTheta", '"q_rot"', '"q"')],
    "04_dflash2": [("prepared[j, 1]", "[2]", "[1, 2]")],
    "05_training": [("loss_weights(8, GAMMA)[3]", "0.47", "0.5")],
}
ANSWERS = "    from dflash_ref.tour import answers\n\n"
CODE = {  # notebook → (the exercise's placeholder line, a right body, a wrong body) for each code exercise
    "01_kv_injection": [
        ("    ...  # your code: C = RMSNorm(W_fc · concat[h^(l_1), …, h^(l_k)])",
         ANSWERS + "    return answers.context_projection(target_hidden, fc_weight, norm_weight, eps)",
         "    return target_hidden @ fc_weight.T  # the norm forgotten"),
        ('    ...  # your code\n\n\nexercise("sliced rope"',
         ANSWERS + '    return answers.sliced_rope(q, k, cos, sin)\n\n\nexercise("sliced rope"',
         "    half = lambda x: torch.cat([-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]], -1)  # noqa\n"
         "    q_len = q.shape[-2]  # Q at the first L_q positions: the classic slip\n"
         "    return q * cos[:q_len] + half(q) * sin[:q_len], k * cos + half(k) * sin\n\n\n"
         'exercise("sliced rope"'),
    ],
    "02_decode_loop": [
        ('    ...  # your code\n\n\nexercise("acceptance length"',
         ANSWERS + '    return answers.acceptance_length(draft_tokens, posterior)\n\n\nexercise("acceptance length"',
         "    return sum(int(d == p) for d, p in zip(draft_tokens, posterior))  # a later match counted\n\n\n"
         'exercise("acceptance length"'),
    ],
    "04_dflash2": [
        ('    ...  # your code\n\n\nexercise("convolution"',
         ANSWERS + '    return answers.convolve(x, taps, base, group_size)\n\n\nexercise("convolution"',
         '    return x * base[0]  # lag 0 alone, no dynamic taps\n\n\nexercise("convolution"'),
    ],
}  # fmt: skip


@pytest.mark.parametrize("notebook", list(EXERCISES))
def test_an_exercise_holds_a_prediction_to_the_run(notebook, tmp_path, capsys):
    pytest.importorskip("jupytext")
    if notebook.startswith("03"):
        pytest.importorskip("dflash")
    stop = "write_report_html(" if notebook.startswith("03") else SMOLLM2
    knobs = {"figures": str(tmp_path), **({"steps": 4, "prompts": 16} if notebook.startswith("05") else {})}
    run_cells(notebook, knobs, until=stop, answers={marker: right for marker, right, _ in EXERCISES[notebook]})
    assert capsys.readouterr().out.count("right: ") == len(EXERCISES[notebook])
    for marker, _, wrong in EXERCISES[notebook]:
        with pytest.raises(CellFailed) as failed:
            run_cells(notebook, knobs, until=stop, answers={marker: wrong})
        assert failed.value.index == cell_with(notebook, marker)
        assert isinstance(failed.value.error, AssertionError) and "not quite: you predicted" in str(failed.value.error)
    assert sum(len(e) for e in EXERCISES.values()) >= 3


@pytest.mark.parametrize("notebook", list(CODE))
def test_a_code_exercise_holds_the_learners_function_to_the_library(notebook, tmp_path, capsys):
    pytest.importorskip("jupytext")
    knobs = {"figures": str(tmp_path)}
    _, printed = shipped_run(notebook, tmp_path)  # as shipped: nothing written yet, said, and the notebook runs on
    assert printed.count("Write the function first") == len(CODE[notebook])
    run_cells(notebook, knobs, until=SMOLLM2, edits={placeholder: right for placeholder, right, _ in CODE[notebook]})
    assert capsys.readouterr().out.count("right: yours agrees with the library's") == len(CODE[notebook])
    for placeholder, _, wrong in CODE[notebook]:
        with pytest.raises(CellFailed) as failed:
            run_cells(notebook, knobs, until=SMOLLM2, edits={placeholder: wrong})
        message = str(failed.value.error)
        assert failed.value.index == cell_with(notebook, placeholder.split("\n")[-1] if "\n" in placeholder else
                                               placeholder)  # fmt: skip
        assert "not quite, on the case" in message and "Hint:" in message and "show_answer(" in message
    assert sum(len(c) for c in CODE.values()) >= 3


def test_show_answer_keeps_each_answer_back_until_asked_and_the_answers_agree_with_the_library(capsys):
    from dflash_ref.tour.exercises import EXERCISES as CODE_EXERCISES
    from dflash_ref.tour.exercises import exercise, show_answer

    for name, ex in CODE_EXERCISES.items():
        exercise(name, ex.answer)
        said = capsys.readouterr().out
        assert said.startswith("right: yours agrees") and "def " not in said  # the answer is not shown unasked
        show_answer(name)
        assert f"def {ex.answer.__name__}(" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no exercise named 'nope'"):
        exercise("nope", print)
    with pytest.raises(AssertionError, match="your function raised ZeroDivisionError: division by zero on the case"):
        exercise("acceptance length", lambda draft_tokens, posterior: 1 / 0)


def test_check_keeps_the_answer_back_until_a_prediction_is_made(capsys):
    from dflash_ref.tour.exercises import check

    check(None, 3, "because")
    assert "Predict first" in capsys.readouterr().out
    check(3, 3, "because")
    assert capsys.readouterr().out == "right: 3. because\n"
    check([2, 6, 9], (2, 6, 9), "because")  # a list is the same answer as a tuple of its items
    assert capsys.readouterr().out == "right: (2, 6, 9). because\n"
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


@pytest.mark.parametrize("block_size", TOY_BLOCK_SIZES)
def test_the_trained_toy_drafts_of_every_block_size_beat_random_ones_on_fresh_prompts(block_size):
    from dflash_ref.tour.demo import demo_models
    from dflash_ref.tour.dflash2 import dflash2_models
    from dflash_ref.tour.toy_training import acceptance, fresh_prompts

    prompts = fresh_prompts()
    (target, trained), (_, random) = (
        demo_models(block_size=block_size, trained=True),
        demo_models(block_size=block_size),
    )
    _, trained2, _ = dflash2_models(block_size=block_size, trained=True)
    accepted = {name: sum(acceptance(d, target, prompts).taus) for name, d in
                (("DFlash 1", trained), ("DFlash 2", trained2), ("random", random))}  # fmt: skip
    assert min(accepted["DFlash 1"], accepted["DFlash 2"]) > 3 * max(accepted["random"], 1), accepted


def test_the_toy_models_refuse_what_they_were_not_made_for():
    from dflash_ref.tour.demo import demo_models, encode

    with pytest.raises(ValueError, match="trained=True needs seed=0"):
        demo_models(seed=1, trained=True)
    with pytest.raises(ValueError, match=r"block_size = 9: this run offers block_size 2 to 8"):
        demo_models(block_size=9, trained=True)
    assert demo_models(block_size=9)[1].block_size == 9  # a random draft takes any size
    with pytest.raises(ValueError, match=r"\['kitten'\]: a prompt is words of the toy vocabulary"):
        encode("a kitten")


def test_the_measured_rounding_is_float32s_and_its_checks_tell_rounding_from_a_wrong_stage():
    from dflash_ref.tour.demo import demo_models, encode
    from dflash_ref.tour.rounding import measure_rounding

    target, draft = demo_models(trained=True)
    rounding = measure_rounding(draft, target, encode("a cat sat"), 12)
    assert 1e-8 < rounding.error < 1e-4  # float32's, grown through the layers; far below any wrong stage's
    x = torch.randn(4, 8)
    rounding.assert_close(x + rounding.tolerance / 2, x, "within")
    with pytest.raises(AssertionError, match="beyond float32's rounding in this run"):
        rounding.assert_close(x + 1e-3, x, "a wrong stage")
    logits = torch.tensor([[1.0, 1.0 + rounding.tolerance / 2, 0.0], [3.0, 1.0, 0.0]])
    rounding.assert_same_choice(logits, torch.tensor([0, 0]), "a tie")  # row 0: a tie, either is right
    with pytest.raises(AssertionError, match=r"at \(1,\) the library chose token 1.*not a tie"):
        rounding.assert_same_choice(logits, torch.tensor([0, 1]), "a wrong choice")
    reference = decoding.generate(target, encode("a cat sat"), 12).output_ids
    rounding.assert_same_output(target, reference.clone(), reference)
    wrong = reference.clone()
    wrong[0, 5] = (wrong[0, 5] + 1) % 15
    with pytest.raises(AssertionError, match="part at position 5"):
        rounding.assert_same_output(target, wrong, reference, "the outputs")


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
