"""What exact rollback costs on a hybrid target: per-position states kept versus snapshot + replay.

    keep    a verify of L keeps S_{n+1..n+L} and the conv inputs; crop(n + τ + 1) picks them   (target/hybrid_cache.py)
    final   the same verify keeping S_{n+L} alone (what a plain cache does; it cannot roll back)
    replay  snapshot S_n before the verify, and on a rejection run the τ + 1 accepted tokens again:
            its extra cost per step is one target forward of τ + 1 tokens (timed here for τ + 1 = 1 … L)

    python -m dflash_ref bench rollback          (blocks 4 and 16, in the tables of cli/bench.py)
    python -m dflash_ref.bench.hybrid_rollback [--hidden 256] [--layers 8] [--verify 4] [--repeats 30]

Times are medians over interleaved repeats on one thread (bench/timing.py); the model is a random Qwen3.5-shaped
hybrid (every 4th layer full attention), so only the ratios mean something.
"""

from __future__ import annotations

import argparse
import json

import torch

from ..target.hybrid_cache import HybridCache
from ..target.qwen3_5 import Qwen3_5Target
from ..target.qwen3_5_config import HybridConfig
from ..threads import one_thread
from .timing import measure, summarise


def bench_target(hidden: int, layers: int) -> Qwen3_5Target:
    """A random hybrid of Qwen3.5's proportions (head dims hidden / 8, every 4th layer full attention)."""
    head = max(hidden // 8, 8)
    config = HybridConfig(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=head,
        linear_key_head_dim=head,
        linear_value_head_dim=head,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        max_position_embeddings=4096,
    )
    target = Qwen3_5Target(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in target.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return target.eval()


@torch.inference_mode()
def rollback_costs(
    target: Qwen3_5Target,
    prompt_len: int = 64,
    verify: int = 4,
    repeats: int = 30,
    replays: tuple[int, ...] | None = None,
    progress=lambda s: None,
) -> dict:
    """Median seconds of a verify of `verify` tokens (+ its crop) keeping every state or only the last,
    and of the replay forwards of τ + 1 = `replays` tokens (default 1 … verify)."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, target.config.vocab_size, (1, prompt_len), generator=g)
    block = torch.randint(0, target.config.vocab_size, (1, verify), generator=g)
    caches = {
        "keep": HybridCache(target.config.layer_types, keep_positions=verify),
        "final": HybridCache(target.config.layer_types, keep_positions=verify - 1),
    }
    for cache in caches.values():
        target(prompt, past_key_values=cache, output_hidden_states=False)

    def verify_with(cache: HybridCache, crop_to: int):
        def run():
            target(block, past_key_values=cache)
            cache.crop(crop_to)  # keep: mid-block (τ = 1); final: back to the start

        return run

    variants = {
        "verify_keep_states": verify_with(caches["keep"], prompt_len + 2),
        "verify_final_state_only": verify_with(caches["final"], prompt_len),
    }
    for accepted in replays or range(1, verify + 1):  # a replay after a verify accepting τ + 1 = accepted tokens
        replay_cache = HybridCache(target.config.layer_types, keep_positions=1)
        target(prompt, past_key_values=replay_cache, output_hidden_states=False)
        variants[f"replay_{accepted}_tokens"] = verify_with_replay(
            target, replay_cache, block[:, :accepted], prompt_len
        )
    rows = summarise(measure(variants, repeats, warmup=2, progress=progress), baseline="verify_final_state_only")
    keep_bytes = sum(
        4 * verify * m.num_v_heads * m.head_k_dim * m.head_v_dim
        for layer in target.model.layers
        if (m := getattr(layer, "linear_attn", None)) is not None
    )
    return {"rows": rows, "kept_state_bytes_per_verify": keep_bytes, "prompt_len": prompt_len, "verify": verify}


def verify_with_replay(target: Qwen3_5Target, cache: HybridCache, tokens: torch.Tensor, start: int):
    """One replay forward of the accepted tokens (keeping the final state only), then back to `start`."""

    def run():
        target(tokens, past_key_values=cache)
        cache.crop(start)

    return run


def bench_rollback(repeats: int, out, progress) -> dict:
    """`bench rollback`: at blocks 4 and 16, what keeping every verified position's state adds to a verify,
    against the replay of τ + 1 = 1, b / 2 and b accepted tokens that a snapshot would need instead. (`out`:
    the benchmarks' folder, which this one writes nothing to.)"""
    rows = []
    with one_thread():
        target = bench_target(256, 8)
        config = target.config
        for b in (4, 16):
            replays = {"1 token": 1, "b/2 tokens": b // 2, "b tokens": b}  # column label → tokens replayed
            result = rollback_costs(
                target, verify=b, repeats=repeats, replays=tuple(replays.values()), progress=progress
            )
            ms = {r["variant"]: 1e3 * r["median_s"] for r in result["rows"]}
            verify = ms["verify_final_state_only"]
            row = {
                "block size b": b,
                "verify, final state only (ms)": verify,
                "verify keeping every position's state (ms)": ms["verify_keep_states"],
                "keeping / final only": ms["verify_keep_states"] / verify,
            }
            row.update(
                {
                    f"replay of {label} / verify": ms[f"replay_{n}_tokens"] / verify  # the same columns at each b
                    for label, n in replays.items()
                }
            )
            row["kept state (MB per verify)"] = result["kept_state_bytes_per_verify"] / 1e6
            rows.append(row)
    linear = config.layer_types.count("linear_attention")
    return {
        f"rollback · a random Qwen3.5-shaped hybrid (hidden {config.hidden_size}, {config.num_hidden_layers} "
        f"layers, {linear} Gated DeltaNet), 64 cached, one thread": rows
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--verify", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    with one_thread():  # 2 threads on a shared 2-core machine only thrash
        result = rollback_costs(bench_target(args.hidden, args.layers), args.prompt, args.verify, args.repeats)
    for row in result["rows"]:
        print(
            f"{row['variant']:>26}: {1e3 * row['median_s']:8.2f} ms  (× {row['ratio']:.2f} of a verify "
            "keeping the final state only)"
        )
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return result


if __name__ == "__main__":
    main()
