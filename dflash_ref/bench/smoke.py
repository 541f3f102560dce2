"""`python -m dflash_ref smoke`: the full-size CUDA path, checked end to end with random weights.

Full size: a Qwen3-8B-shaped target (36 layers, hidden 4096, 32/8 heads, head_dim 128, FFN 12288,
vocabulary 151936) and a 5-layer block-16 draft reading layers [1, 9, 17, 25, 33], random weights,
bf16 on CUDA; 256 new tokens after a 64-token prompt. It reports, side by side in one run:
AR decoding, speculative decoding with the random draft (τ ≈ 0: lossless, not fast), and with an
oracle draft whose proposals are the target's own greedy continuation (full acceptance, the
ceiling), with tokens/s, the speedup over AR, and peak GPU memory. Where there is no GPU it skips
with a message; `--size tiny` runs the same check shrunk, on the CPU, in seconds (CI runs that).

Lossless here means token-identical to AR. In bf16, a block verify and a one-token step use
different kernel shapes, so a near-tie in the logits can flip an argmax: a mismatch is reported
with its position and the logit margin there, not hidden.
"""
from __future__ import annotations

import json
import time

import torch

from ..decoding import generate
from ..config import TargetConfig
from ..drafts.oracle import OracleDraft
from ..drafts.random_draft import random_draft
from ..decoding import spec_generate
from ..target import Qwen3Target

SIZES = {
    "full": dict(target=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
                             max_position_embeddings=40960, tie_word_embeddings=False),
                 draft_layers=5, block_size=16, mask_token_id=151669, prompt=64, new=256, dtype=torch.bfloat16,
                 device="cuda"),
    "tiny": dict(target=dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=8,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                             max_position_embeddings=1024, tie_word_embeddings=False),
                 draft_layers=2, block_size=8, mask_token_id=511, prompt=16, new=48, dtype=torch.float32,
                 device="cpu"),
}


def random_target(config: TargetConfig, device, dtype, seed: int = 0, std: float = 0.02) -> Qwen3Target:
    """Built on the meta device and filled in place on `device`: no host copy of the weights."""
    with torch.device("meta"):
        target = Qwen3Target(config)
    target = target.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)
    if config.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    return target.to(dtype).eval()


def _timed(fn, device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    n = min(a.shape[1], b.shape[1])
    diff = (a[0, :n] != b[0, :n]).nonzero()
    return int(diff[0, 0]) if diff.numel() else (None if a.shape == b.shape else n)


def run(size: str = "full", say=print) -> dict | None:
    spec = SIZES[size]
    device = torch.device(spec["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        say("smoke: no CUDA device here — skipping the full-size check (run `--size tiny` for the CPU version)")
        return None
    torch.manual_seed(0)
    target = random_target(TargetConfig(**spec["target"]), device, spec["dtype"])
    draft = random_draft(target, spec["draft_layers"], spec["block_size"], spec["mask_token_id"])
    ids = torch.randint(0, target.config.vocab_size, (1, spec["prompt"]), generator=torch.Generator().manual_seed(0))
    n = spec["new"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _timed(lambda: generate(target, ids, 8), device)                       # warm-up, both paths: the first
    _timed(lambda: spec_generate(draft, target, ids, 8), device)           # call of a shape pays its kernels
    ar, t_ar = _timed(lambda: generate(target, ids, n), device)
    rand, t_rand = _timed(lambda: spec_generate(draft, target, ids, n), device)
    oracle = OracleDraft(draft, ar.output_ids)
    orc, t_orc = _timed(lambda: spec_generate(oracle, target, ids, n), device)
    result = {
        "size": size, "device": str(device), "dtype": str(spec["dtype"]).removeprefix("torch."),
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()), "new_tokens": n,
        "ar_tokens_per_s": ar.num_output_tokens / t_ar,
        "random_draft": {"tokens_per_s": rand.num_output_tokens / t_rand, "speedup": t_ar / t_rand,
                         "mean_tokens_per_step": rand.mean_tokens_per_step,
                         "first_difference_from_ar": _first_difference(rand.output_ids, ar.output_ids)},
        "oracle_draft": {"tokens_per_s": orc.num_output_tokens / t_orc, "speedup": t_ar / t_orc,
                         "mean_tokens_per_step": orc.mean_tokens_per_step,
                         "first_difference_from_ar": _first_difference(orc.output_ids, ar.output_ids)},
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    say(json.dumps(result, indent=1))
    for name in ("random_draft", "oracle_draft"):
        d = result[name]["first_difference_from_ar"]
        say(f"{name}: {'lossless (token-identical to AR)' if d is None else f'DIFFERS from AR at token {d}'}")
    return result
