"""`python -m dflash_ref bench trained [--draft DIR]`: trained SmolLM2 drafts against transformers' own
`generate` and the target alone, on held-out prompts of both kinds (harness and reporting: cli/bench.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ..decoding import generate, spec_generate
from ..dflash2 import selector_of
from ..drafts.folder import SHIPPED_DRAFTS, check_fits, draft_folder, open_draft
from ..extensions import chosen_extensions
from ..extensions.verify_gate import draft_confidence
from ..hooks import hooks
from ..loading.smollm2 import STOP_TOKEN_IDS, chat_ids, load_smollm2, load_smollm2_own
from ..trace.plots import save_figure
from ..training.measure import acceptance_by_position, emitted, path_against_argmax, per_prompt, selector_log
from ..training.prompt_sets import split_prompts
from ..training.prompts import eval_prompts
from .baselines import VERIFY_GATE, hf_generate, transformers_twin
from .suite import _measure

PROMPTS, NEW_TOKENS = 8, 96  # of each held-out set: the templates' held-out topics, the hand-written other styles
LOOKUP = 2  # prompt lookup's shortest suffix (figures/training/levers.md, "Prompt lookup beside the draft")


def prompt_sets() -> dict[str, list[str]]:
    """What is decoded: PROMPTS of the template held-out set and PROMPTS hand-written in styles no training
    prompt has (training/heldout_styles.py)."""
    return {"template held-out": eval_prompts(PROMPTS), "other styles": split_prompts("heldout-styles")[:PROMPTS]}


def drafts_to_compare(draft: str | Path | None) -> dict[str, Path]:
    """label → folder: `--draft` first (a folder, or a shipped name: that draft first, under its own label),
    then the other drafts shipped for SmolLM2 (drafts/shipped.py)."""
    if draft is None:
        return dict(SHIPPED_DRAFTS)
    folder = draft_folder(draft)
    first = {label: f for label, f in SHIPPED_DRAFTS.items() if f == folder} or {f"draft {draft}": folder}
    return first | {label: f for label, f in SHIPPED_DRAFTS.items() if f != folder}


def bench_trained(repeats: int, out: Path, progress, draft: str | Path | None = None) -> dict:
    """Greedy, NEW_TOKENS tokens after each prompt of `prompt_sets()`, all variants interleaved in one run:
    transformers' `generate` (the baseline), dflash_ref's AR, and each draft of `drafts_to_compare` at its
    own block size, each also with the verify gate (extensions/verify_gate.py) and with prompt lookup beside
    it (extensions/prompt_lookup.py, N = LOOKUP); the first draft
    also at the smaller blocks and proposing over all V instead of its vocabulary (extensions/draft_vocab.py).
    Every output is checked equal to AR's before anything is timed. Speed is over transformers' generate
    and over AR; τ + 1 per prompt set; acceptance per block position; the gate's calibration (its premise)."""
    target, tokenizer = load_smollm2_own()  # the own Llama target (target/llama.py)
    model = transformers_twin(load_smollm2()[0].model)
    sets = prompt_sets()
    inputs = {name: [chat_ids(tokenizer, p) for p in prompts] for name, prompts in sets.items()}
    every = [ids for group in inputs.values() for ids in group]
    n = NEW_TOKENS
    folders = drafts_to_compare(draft)
    opened = {label: open_draft(folder, proposing=True)[0] for label, folder in folders.items()}
    for label, d in opened.items():
        check_fits(d, folders[label], target)
    spec = _variants(opened)
    ar_out = [generate(target, ids, n, STOP_TOKEN_IDS).output_ids for ids in every]
    own = _own_blocks(spec)
    premise = next((name for name in own if selector_of(spec[name][0]) is None), None)  # gate's calibration
    stats, calibration, selector = {}, None, {}
    for name, (d, b, gate, lookup) in spec.items():  # one untimed pass each: the statistics and the lossless check
        outputs, records = [], []

        def run_all(d=d, b=b, gate=gate, lookup=lookup, outputs=outputs, records=records):
            return {
                set_name: acceptance_by_position(
                    d,
                    target,
                    tokenizer,
                    prompts,
                    n,
                    STOP_TOKEN_IDS,
                    block_size=b,
                    outputs=outputs,
                    verify_gate=gate,
                    records=records,
                    lookup=lookup,
                )
                for set_name, prompts in sets.items()
            }

        if name == premise:  # whole blocks verified every step: what the gate relies on
            by_set, confidences = confidence_log(d, run_all)
            calibration = gate_calibration(confidences, outputs)
        elif selector_of(d) is not None and name in own:  # the path against the argmax of the same logits
            by_set, choices = selector_log(d, run_all)
            selector[name] = path_against_argmax(records, choices, outputs)
        else:
            by_set = run_all()
        if not all(torch.equal(o.output_ids, expected) for o, expected in zip(outputs, ar_out)):
            raise AssertionError(f"{name}: speculative output differs from AR (lossless broken)")
        lengths = [emitted(a, p) for o in outputs for a, p in zip(o.acceptance_lengths, o.tokens_per_step)]
        stats[name] = {
            "sets": by_set,
            "accepted": sum(lengths) / len(lengths),
            "tau": sum(sum(o.tokens_per_step) for o in outputs) / sum(len(o.tokens_per_step) for o in outputs),
        }
    if not all(torch.equal(o, e) for o, e in zip((hf_generate(model, ids, n) for ids in every), ar_out)):
        raise AssertionError("transformers' generate differs from dflash_ref's AR")
    progress("outputs equal AR in every variant; timing")
    variants = {
        "transformers generate (nn.Linear)": lambda: [hf_generate(model, ids, n) for ids in every],
        "dflash_ref AR (target alone)": lambda: [generate(target, ids, n, STOP_TOKEN_IDS) for ids in every],
    }
    for name, (d, b, gate, lookup) in spec.items():
        extensions = chosen_extensions(d, target, gate, lookup)
        variants[name] = lambda d=d, b=b, extensions=extensions: [
            spec_generate(d, target, ids, n, STOP_TOKEN_IDS, block_size=b, extensions=extensions) for ids in every
        ]
    with torch.inference_mode():
        rows = _measure(variants, repeats, progress)
    ar_ratio = rows[1]["ratio"]
    for row in rows:
        s = stats.get(row["variant"])
        row.update(
            {
                "speed vs transformers generate": 1 / row["ratio"],
                "speed vs AR": ar_ratio / row["ratio"],
                **{f"τ + 1, {set_name}": (s["sets"][set_name][1] if s else 1.0) for set_name in sets},
                "τ + 1 (tokens/step)": s["tau"] if s else 1.0,
                "accepted/step": s["accepted"] if s else 0.0,
            }
        )
    positions = [
        {
            "block position k": k + 1,
            **{
                f"{name} · {set_name}": by_position[k] if k < len(by_position) else ""
                for name in own
                for set_name, (by_position, _) in stats[name]["sets"].items()
            },
        }
        for k in range(max(spec[name][1] for name in own) - 1)
    ]
    first = next(iter(opened.values()))  # its blocks, over its vocabulary, ungated
    sweep = {
        spec[r["variant"]][1]: (r, stats[r["variant"]])
        for r in rows
        if r["variant"] in spec and spec[r["variant"]][0] is first and spec[r["variant"]][2:] == (None, None)
    }
    _plot_trained(sweep, out / "trained.png")
    tables = {
        f"trained drafts · SmolLM2-135M, {PROMPTS} template held-out + {PROMPTS} hand-written other-style "
        f"prompts, {n} tokens, greedy": rows,
        "accepted fraction per block position": positions,
    }
    if selector:
        tables["candidate selector: its path against the argmax of the same draft logits (greedy, every step)"] = [
            {"variant": name, **tally} for name, tally in selector.items()
        ]
    if calibration is not None:
        tables["verify gate: the DFlash 1 draft's c_1·c_2 against what the target accepted (no gate)"] = calibration
    return tables


def _variants(opened: dict[str, object]) -> dict[str, tuple[object, int, float | None, int | None]]:
    """name → (draft, block size, verify gate, lookup): each draft at its block size, also with the gate (a
    DFlash 2 draft's c_k read from its selector's q over the candidates) and with prompt lookup beside it
    (extensions/prompt_lookup.py, N = LOOKUP); the first draft also at smaller blocks and over all V."""
    spec = {f"{label} b={d.block_size}": (d, d.block_size, None, None) for label, d in opened.items()}
    spec |= {
        f"{label} b={d.block_size}, verify gate θ={VERIFY_GATE}": (d, d.block_size, VERIFY_GATE, None)
        for label, d in opened.items()
    }
    spec |= {
        f"{label} b={d.block_size}, prompt lookup N={LOOKUP}": (d, d.block_size, None, LOOKUP)
        for label, d in opened.items()
    }
    label, d = next(iter(opened.items()))
    spec |= {f"{label} b={b}": (d, b, None, None) for b in (2, 3, 4, 8) if b < d.block_size}
    all_v = copy.deepcopy(d)
    all_v.draft_vocab = None  # what an official loader proposes among
    spec[f"{label} b={d.block_size}, proposals over all V"] = (all_v, d.block_size, None, None)
    return spec


def _own_blocks(spec: dict) -> set[str]:
    """The variants that run a draft at its own block size over its vocabulary, ungated: one per draft."""
    return {
        name
        for name, (d, b, gate, lookup) in spec.items()
        if b == d.block_size and gate is None and lookup is None and not name.endswith("all V")
    }


def confidence_log(draft, run) -> tuple[object, list[float | None]]:
    """(run()'s result, c_1·c_2 (extensions/verify_gate.py) of every pass `draft` made while it ran, in order, None
    where a pass drafted fewer than 2 positions), read at the `draft.hook_logits` hook point."""
    log = []

    def read(logits, point):  # (1, γ, V), once per draft pass
        c = draft_confidence(logits[:, :2])  # (1, min(γ, 2))
        log.append(float(c[0, 0] * c[0, 1]) if c.shape[1] == 2 else None)

    with hooks(draft, read, lambda name: name == "draft.hook_logits"):
        result = run()
    return result, log


def gate_calibration(confidences: list[float | None], outputs: list) -> list[dict]:
    """Does the draft's confidence c_1·c_2 predict acceptance? `outputs`: greedy GenerationOutputs, one
    per prompt, the whole block verified every step; `confidences`: c_1·c_2 of their draft passes in
    the same order (`confidence_log`; one pass per step, so each prompt takes as many as it has steps).
    → one row per bin of c_1·c_2: steps, and the fractions in which the target accepted d_1, and d_1
    and d_2."""
    # (c_1·c_2, τ) per step that drafted γ ≥ 2
    pairs = [
        (c, tau)
        for out, mine in zip(outputs, per_prompt(confidences, outputs, "confidences"))
        for c, tau in zip(mine, out.acceptance_lengths)
        if c is not None
    ]
    edges = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    rows = []
    for lo, hi in zip(edges, edges[1:]):
        taus = [tau for c, tau in pairs if lo <= c < hi or (hi == 1.0 and c == 1.0)]
        rows.append(
            {
                "c_1·c_2": f"{lo:.1f} … {hi:.1f}",
                "steps": len(taus),
                "d_1 accepted": sum(t >= 1 for t in taus) / max(len(taus), 1),
                "d_1 and d_2 accepted": sum(t >= 2 for t in taus) / max(len(taus), 1),
            }
        )
    return rows


def _plot_trained(sweep: dict[int, tuple[dict, dict]], path):
    """τ + 1 and speed against AR by block size (the first draft), and acceptance by block position per prompt set."""
    fig = Figure(figsize=(9, 3.2))
    left, right = fig.subplots(1, 2)
    blocks = sorted(sweep)
    left.plot(blocks, [sweep[b][0]["τ + 1 (tokens/step)"] for b in blocks], "o-", label="τ + 1 (tokens/step)")
    left.plot(blocks, [sweep[b][0]["speed vs AR"] for b in blocks], "s-", label="wall-clock speedup vs AR")
    left.axhline(1.0, color="grey", lw=0.5)
    left.set_xscale("log", base=2)
    left.set_xlabel("block size")
    left.legend()
    for b in blocks:
        for (set_name, (by_position, _)), style in zip(sweep[b][1]["sets"].items(), ("o-", "s--")):
            right.plot(range(1, b), [share or 0.0 for share in by_position], style, ms=3, label=f"b={b}, {set_name}")
    right.set_xlabel("block position k")
    right.set_ylabel("accepted fraction (held-out)")
    right.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
