"""Benchmarks as side-by-side ratios: every variant runs in the same process, interleaved
round-robin over the repeats, and is reported as median, spread (min–max) and the ratio of its
median to the baseline's. Absolute times on a shared machine drift; ratios measured together
don't (much). Nothing here is asserted: benchmarks report, tests check correctness.

    python -m dflash_ref bench tracing [--repeats N] [--out DIR]

tracing: the loop with hook points but nothing attached (what everyone runs), against a build
whose hook points are plain function calls (no tracing support at all), and against full tracing
(every draft hook point recorded, attention on the explicit path).
"""
from __future__ import annotations

import contextlib
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from .ar_generate import generate
from .config import DraftConfig, TargetConfig
from .draft_model import DFlashDraftModel
from .hooks import HookPoint
from .oracle import OracleDraft
from .spec_generate import spec_generate
from .target import Qwen3Target
from .trace import tracing


def measure(variants: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
            progress: Callable[[str], None] = lambda s: None) -> dict[str, list[float]]:
    """Seconds per call of each variant, interleaved so that drift hits all variants alike."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        progress(f"repeat {i + 1}/{repeats}")
    return times


def summarise(times: dict[str, list[float]], baseline: str) -> list[dict]:
    base = statistics.median(times[baseline])
    return [{"variant": name, "median_s": statistics.median(t), "min_s": min(t), "max_s": max(t),
             "ratio": statistics.median(t) / base} for name, t in times.items()]


def markdown(rows: list[dict], title: str) -> str:
    lines = [f"### {title}", "", "| variant | median (s) | min–max (s) | ratio to baseline |",
             "|---|---|---|---|"]
    lines += [f"| {r['variant']} | {r['median_s']:.4f} | {r['min_s']:.4f}–{r['max_s']:.4f} | "
              f"{r['ratio']:.3f} |" for r in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def without_hook_support():
    """Hook points become bare function calls: the loop as if tracing did not exist."""
    original = HookPoint.__call__
    HookPoint.__call__ = lambda self, x: x
    try:
        yield
    finally:
        HookPoint.__call__ = original


def smollm2_sized_pair(seed: int = 0, block_size: int = 8):
    """A random target with SmolLM2-135M's shape (30 layers, hidden 576, 9/3 heads) and a draft."""
    torch.manual_seed(seed)
    shared = dict(vocab_size=49152, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                  head_dim=64, rope_theta=100000.0, max_position_embeddings=8192)
    target = Qwen3Target(TargetConfig(num_hidden_layers=30, intermediate_size=1536, tie_word_embeddings=True,
                                      **shared)).eval()
    draft = DFlashDraftModel(DraftConfig(num_hidden_layers=3, intermediate_size=1536, block_size=block_size,
                                         num_target_layers=30, mask_token_id=0, **shared)).eval()
    return target, draft


def bench_tracing(repeats: int, max_new_tokens: int = 48, progress=print) -> list[dict]:
    target, draft = smollm2_sized_pair()
    ids = torch.randint(1, 49152, (1, 32), generator=torch.Generator().manual_seed(0))
    reference = generate(target, ids, max_new_tokens).output_ids
    oracle = lambda: OracleDraft(draft, reference, accept=[3, 7, 1, 5])  # noqa: E731  varied τ

    def plain():
        return spec_generate(oracle(), target, ids, max_new_tokens)

    def no_support():
        with without_hook_support():
            return spec_generate(oracle(), target, ids, max_new_tokens)

    def full():
        with tracing(draft) as trace:
            return spec_generate(oracle(), target, ids, max_new_tokens, on_step=trace.on_step)

    variants = {"hook points, nothing attached": plain, "no hook support at all": no_support,
                "full draft tracing": full}
    times = measure(variants, repeats, progress=progress)
    return summarise(times, "no hook support at all")


BENCHES = {"tracing": bench_tracing}


def run(names: list[str], repeats: int, out: str | Path, say=print) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(torch.get_num_threads())
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    report = {"machine": machine, "repeats": repeats, "results": {}}
    texts = [f"machine: {machine}; {repeats} interleaved repeats per variant"]
    for name in names:
        say(f"== bench {name} ==")
        rows = BENCHES[name](repeats, progress=lambda s: say(f"   {name}: {s}"))
        report["results"][name] = rows
        texts.append(markdown(rows, name))
        say(texts[-1])
    (out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "bench.md").write_text("\n\n".join(texts) + "\n")
    return report
