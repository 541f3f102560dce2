"""`python -m dflash_ref bench trained [--draft DIR]`: the shipped (or another) SmolLM2 draft against
the target alone, on held-out prompts (harness and reporting: cli/bench.py; the other benchmarks: bench/suite.py)."""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from matplotlib.figure import Figure

from ..decoding import generate, spec_generate
from ..drafts.folder import SHIPPED_DRAFT, check_fits, open_draft
from ..extensions.verify_gate import draft_confidence
from ..hooks import hooks
from ..plots import save_figure
from ..target.smollm2 import STOP_TOKEN_IDS, chat_ids, load_smollm2
from ..training.measure import acceptance_by_position, emitted
from ..training.prompts import eval_prompts
from .suite import _measure

VERIFY_GATE = 0.5   # extensions/verify_gate.py's θ, chosen on held-out prompts 9…24 (not these 8; figures/training/README.md)


def bench_trained(repeats: int, out: Path, progress, draft: str | Path | None = None) -> dict:
    """A trained SmolLM2 draft (`draft`, an official-format folder; default: the shipped one) on
    held-out prompts (greedy, 96 new tokens): τ and wall-clock speedup over the target's own AR
    decoding, per block size up to the draft's, all variants interleaved in one run. Every
    speculative output is checked equal to AR's before anything is timed. Two more variants run the
    largest block with proposals over all V instead of the draft's vocabulary (extensions/draft_vocab.py), and
    with the verify gate (extensions/verify_gate.py); a last table checks the gate's premise, calibration."""
    draft, folder = open_draft(draft, proposing=True)
    target, tokenizer = load_smollm2()
    check_fits(draft, folder, target)
    all_v = copy.deepcopy(draft)
    all_v.draft_vocab = None                                  # what an official loader proposes among
    prompts, n = eval_prompts(8), 96
    inputs = [chat_ids(tokenizer, p) for p in prompts]
    blocks = [b for b in (2, 3, 4, 8, 16) if b <= draft.block_size]
    ar_out = [generate(target, ids, n, STOP_TOKEN_IDS).output_ids for ids in inputs]
    spec = {f"DFlash b={b}": (draft, b, None) for b in blocks}
    spec[f"DFlash b={blocks[-1]}, proposals over all V"] = (all_v, blocks[-1], None)
    spec[f"DFlash b={blocks[-1]}, verify gate θ={VERIFY_GATE}"] = (draft, blocks[-1], VERIFY_GATE)
    stats, accepted, calibration = {}, {}, None
    for name, (d, b, gate) in spec.items():  # one untimed pass each: the statistics and the lossless check
        outputs = []

        def run(d=d, b=b, gate=gate, outputs=outputs):
            return acceptance_by_position(d, target, tokenizer, prompts, n, STOP_TOKEN_IDS, block_size=b,
                                          outputs=outputs, verify_gate=gate)
        if name == f"DFlash b={blocks[-1]}":     # the whole block verified every step: the gate's premise
            stats[name], confidences = confidence_log(d, run)
            calibration = gate_calibration(confidences, outputs)
        else:
            stats[name] = run()
        if not all(torch.equal(o.output_ids, expected) for o, expected in zip(outputs, ar_out)):
            raise AssertionError(f"{name}: speculative output differs from AR (lossless broken)")
        lengths = [emitted(a, p) for o in outputs                        # the seed's τ of every step,
                   for a, p in zip(o.acceptance_lengths, o.tokens_per_step)]  # as far as it was emitted
        accepted[name] = sum(lengths) / len(lengths)
    progress("outputs equal AR in every variant; timing")
    variants = {"AR (target alone)": lambda: [generate(target, ids, n, STOP_TOKEN_IDS) for ids in inputs]}
    for name, (d, b, gate) in spec.items():
        variants[name] = lambda d=d, b=b, gate=gate: [
            spec_generate(d, target, ids, n, STOP_TOKEN_IDS, block_size=b, verify_gate=gate) for ids in inputs]
    rows = _measure(variants, repeats, progress)
    rows[0].update({"τ (tokens/step)": 1.0, "accepted/step": 0.0, "speedup vs AR": 1.0})   # AR: one per pass
    for row in rows[1:]:
        tau = stats[row["variant"]][1]
        row.update({"τ (tokens/step)": tau, "accepted/step": accepted[row["variant"]],
                    "speedup vs AR": 1 / row["ratio"]})
    by_block = {b: stats[f"DFlash b={b}"] for b in blocks}
    best = max(blocks, key=lambda b: by_block[b][1])
    positions = [{"block position k": k + 1, **{f"b={b}": by_block[b][0][k] if k < b - 1 else ""
                                                for b in blocks}} for k in range(max(blocks) - 1)]
    _plot_trained(rows[1:len(blocks) + 1], by_block, out / "trained.png")
    which = "trained draft" if folder == SHIPPED_DRAFT else f"draft {folder}"
    return {f"{which} · SmolLM2-135M, {len(prompts)} held-out prompts, {n} tokens, greedy": rows,
            f"accepted fraction per block position (best τ at b={best})": positions,
            f"verify gate: the draft's c_1·c_2 against what the target accepted (b={blocks[-1]}, no gate)":
                calibration}


def confidence_log(draft, run) -> tuple[object, list[float | None]]:
    """(run()'s result, c_1·c_2 (extensions/verify_gate.py) of every pass `draft` made while it ran, in order, None
    where a pass drafted fewer than 2 positions), read at the `draft.hook_logits` hook point."""
    log = []

    def read(logits, point):                                     # (1, γ, V), once per draft pass
        c = draft_confidence(logits[:, :2])                      # (1, min(γ, 2))
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
    pairs, rest = [], list(confidences)                          # (c_1·c_2, τ) per step with γ ≥ 2
    for out in outputs:
        steps = len(out.acceptance_lengths)
        if out.num_draft_passes != steps or len(rest) < steps:
            raise ValueError(f"a prompt of {steps} steps made {out.num_draft_passes} draft passes, and "
                             f"{len(rest)} confidences are left for it: these are not its passes")
        mine, rest = rest[:steps], rest[steps:]
        pairs += [(c, tau) for c, tau in zip(mine, out.acceptance_lengths) if c is not None]
    if rest:
        raise ValueError(f"{len(rest)} confidences left over: they do not belong to these outputs' draft passes")
    edges = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    rows = []
    for lo, hi in zip(edges, edges[1:]):
        taus = [tau for c, tau in pairs if lo <= c < hi or (hi == 1.0 and c == 1.0)]
        rows.append({"c_1·c_2": f"{lo:.1f} … {hi:.1f}", "steps": len(taus),
                     "d_1 accepted": sum(t >= 1 for t in taus) / max(len(taus), 1),
                     "d_1 and d_2 accepted": sum(t >= 2 for t in taus) / max(len(taus), 1)})
    return rows


def _plot_trained(rows, by_block, path):

    fig = Figure(figsize=(9, 3.2))
    a, c = fig.subplots(1, 2)
    blocks = [int(r["variant"].split("=")[1]) for r in rows]
    a.plot(blocks, [r["τ (tokens/step)"] for r in rows], "o-", label="τ (tokens/step)")
    a.plot(blocks, [r["speedup vs AR"] for r in rows], "s-", label="wall-clock speedup vs AR")
    a.axhline(1.0, color="grey", lw=0.5)
    a.set_xscale("log", base=2)
    a.set_xlabel("block size")
    a.legend()
    for b, (by_position, _) in by_block.items():
        c.plot(range(1, b), by_position, "o-", ms=3, label=f"b={b}")
    c.set_xlabel("block position k")
    c.set_ylabel("accepted fraction (held-out)")
    c.legend()
    fig.tight_layout()
    save_figure(fig, path)
