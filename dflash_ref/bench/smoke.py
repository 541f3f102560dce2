"""`python -m dflash_ref smoke`: the full-size CUDA path, checked end to end with random weights.

Full size: a Qwen3-8B-shaped target (36 layers, hidden 4096, 32/8 heads, head_dim 128, FFN 12288,
vocabulary 151936) and a 5-layer block-16 draft reading layers [1, 9, 17, 25, 33], random weights,
bf16 on CUDA; 256 new tokens after a 64-token prompt. It reports, side by side in one run:
AR decoding, speculative decoding with the random draft (τ ≈ 0: lossless, not fast), and with an
oracle draft whose proposals are the target's own greedy continuation (full acceptance, the
ceiling), with tokens/s, the speedup over AR, and peak GPU memory. Where there is no GPU it skips
with a message; `--size tiny` runs the same check shrunk, on the CPU, in seconds (CI runs that).

`--version 2`: a DFlash 2 draft shaped like z-lab/Qwen3.8-27B-DFlash2, on a target of Qwen3.8-27B's
widths, checked first by its shapes (each convolution's base_kernel (2, K, d) and kernel_projection
(2·K·G, d); the codebooks (V, r), hidden_projection (r, d)) and by one draft pass through the
selector, then timed as above (its oracle replaces the proposals, so there the selector does not run).
The released config.json could not be read here (no network), so the shapes are ASSUMED:
  - from public ports' fixtures and loaders of the released drafts (read as text, not run): draft
    hidden 5120, 5 layers, 32 query / 8 KV heads, head_dim 128, FFN 17408, vocabulary 248320,
    block 8, mask_token_id 248070, num_target_layers 64, target_layer_ids [5, 19, 33, 47, 61],
    rope_theta 1e7, max_position_embeddings 262144, every layer sliding_attention with window 2048,
    is_causal false; dflash_config conv_kernel_size 2, conv_group_size 16, selector_rank 256,
    selector_top_k 16 (the same four in the ports' Muse-Glimmer-30B loader). About 1.9e9 parameters,
    3.9 GB in bf16, which matches the 3.8-3.85 GB size the ports report for the bf16 draft;
  - dflash 0.1.0 itself gives no defaults for the four DFlash 2 fields (it reads them from the config);
  - the target: Qwen3.8-27B is a hybrid (Gated DeltaNet layers, every 4th full attention, gated
    attention, partial RoPE). It stands in here as a plain Qwen3 stack of its widths, full attention
    in all 64 layers: hidden 5120, 24 query / 4 KV heads, head_dim 256, FFN 17408, vocabulary 248320,
    rope_theta 1e7 (the Qwen3.5-27B numbers; taken to hold for 3.8): about 24e9 parameters, 49 GB in bf16.
`--arch qwen3_5`: a hybrid target shaped like Qwen3.5-27B and its DFlash draft (smoke_hybrid.py).
The tiny DFlash 2 size keeps that structure shrunk (the draft's heads unlike the target's, explicit
target_layer_ids, sliding layers, K = 2, groups of 16, top 16) with a window of 16 that binds on CPU.

Lossless here means token-identical to AR. In bf16, a block verify and a one-token step use
different kernel shapes, so a near-tie in the logits can flip an argmax: a mismatch is reported
with its position (the first token that differs from AR), not hidden.
"""

from __future__ import annotations

import json
import time

import torch

from ..config import DraftConfig, TargetConfig
from ..decoding import generate, spec_generate
from ..dflash2 import make_draft
from ..draft_model import DFlashDraftModel
from ..drafts.oracle import OracleDraft
from ..drafts.random_draft import random_draft
from ..layer_sampling import extract_context_feature
from ..target import Qwen3Target
from .smoke_hybrid import HYBRID_SIZES, hybrid_models

SIZES = {
    "full": dict(
        target=dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=1e6,
            max_position_embeddings=40960,
            tie_word_embeddings=False,
        ),
        draft_layers=5,
        block_size=16,
        mask_token_id=151669,
        prompt=64,
        new=256,
        dtype=torch.bfloat16,
        device="cuda",
    ),
    "tiny": dict(
        target=dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=192,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=1e6,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
        ),
        draft_layers=2,
        block_size=8,
        mask_token_id=511,
        prompt=16,
        new=48,
        dtype=torch.float32,
        device="cpu",
    ),
}

# DFlash 2 (--version 2): the draft's own fields; width, vocabulary and target depth come from the target
DFLASH2 = dict(version=2, conv_kernel_size=2, conv_group_size=16, selector_rank=256, selector_top_k=16)
DFLASH2_SIZES = {
    "full": dict(
        target=dict(
            vocab_size=248320,
            hidden_size=5120,
            intermediate_size=17408,
            num_hidden_layers=64,
            num_attention_heads=24,
            num_key_value_heads=4,
            head_dim=256,
            rope_theta=1e7,
            max_position_embeddings=262144,
            tie_word_embeddings=False,
        ),
        draft=dict(
            num_hidden_layers=5,
            intermediate_size=17408,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            rope_theta=1e7,
            max_position_embeddings=262144,
            block_size=8,
            mask_token_id=248070,
            target_layer_ids=[5, 19, 33, 47, 61],
            layer_types=["sliding_attention"] * 5,
            sliding_window=2048,
            is_causal=False,
            **DFLASH2,
        ),
        prompt=64,
        new=256,
        dtype=torch.bfloat16,
        device="cuda",
    ),
    "tiny": dict(
        target=SIZES["tiny"]["target"],
        draft=dict(
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            rope_theta=1e6,
            max_position_embeddings=1024,
            block_size=8,
            mask_token_id=511,
            target_layer_ids=[1, 6],
            layer_types=["sliding_attention"] * 2,
            sliding_window=16,
            is_causal=False,
            **{**DFLASH2, "selector_rank": 16},
        ),
        prompt=16,
        new=48,
        dtype=torch.float32,
        device="cpu",
    ),
}


def _fill_(module: torch.nn.Module, device, seed: int, std: float) -> torch.nn.Module:
    """Every parameter N(0, std²) drawn on `device` from a seeded generator, norm weights 1."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)
    return module


def random_target(config: TargetConfig, device, dtype, seed: int = 0, std: float = 0.02) -> Qwen3Target:
    """Built on the meta device and filled in place on `device`: no host copy of the weights."""
    with torch.device("meta"):
        target = Qwen3Target(config)
    target = _fill_(target.to_empty(device=device), device, seed, std)
    if config.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    return target.to(dtype).eval()


def random_sized_draft(target, fields: dict, seed: int = 1, std: float = 0.02) -> DFlashDraftModel:
    """A random draft with `fields` (its heads, FFN, block, layer ids, DFlash 2 sizes, …) and the target's
    width, vocabulary and depth, built on the meta device and filled on the target's (base_kernel too)."""
    tc = target.config
    config = DraftConfig(
        vocab_size=tc.vocab_size,
        hidden_size=tc.hidden_size,
        rms_norm_eps=tc.rms_norm_eps,
        num_target_layers=tc.num_hidden_layers,
        **fields,
    )
    with torch.device("meta"):
        draft = make_draft(config)
    draft = _fill_(draft.to_empty(device=target.device), target.device, seed, std)
    return draft.to(target.dtype).eval()


def dflash2_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    """The shapes a DFlash 2 draft of `config` must have, by state-dict name: per layer and sublayer
    base_kernel (2, K, d) and kernel_projection (2·K·G, d) with G = d / conv_group_size; the
    codebooks (V, r) and hidden_projection (r, d)."""
    d, k, r, v = config.hidden_size, config.conv_kernel_size, config.selector_rank, config.vocab_size
    groups = d // config.conv_group_size
    shapes = {
        f"layers.{i}.{conv}.{name}": shape
        for i in range(config.num_hidden_layers)
        for conv in ("attention_conv", "mlp_conv")
        for name, shape in (("base_kernel", (2, k, d)), ("kernel_projection.weight", (2 * k * groups, d)))
    }
    return {
        **shapes,
        "candidate_selector.predecessor_codebook": (v, r),
        "candidate_selector.successor_codebook": (v, r),
        "candidate_selector.hidden_projection.weight": (r, d),
    }


def check_dflash2_shapes(draft) -> dict[str, str]:
    """Every DFlash 2 parameter of `draft` against dflash2_shapes; a ValueError naming each one missing
    or misshapen. → the shapes checked, by name ("(2, 2, 5120)")."""
    if getattr(draft.config, "version", 1) != 2:
        raise ValueError(f"not a DFlash 2 draft (config.version {draft.config.version})")
    have = {name: tuple(p.shape) for name, p in draft.named_parameters()}
    wrong = [
        f"{name}: {have.get(name, 'missing')} (expected {shape})"
        for name, shape in dflash2_shapes(draft.config).items()
        if have.get(name) != shape
    ]
    if wrong:
        raise ValueError("DFlash 2 draft shapes differ from its config: " + "; ".join(wrong))
    return {name: str(shape) for name, shape in dflash2_shapes(draft.config).items()}


@torch.no_grad()
def draft_pass(draft, target, ids: torch.Tensor) -> dict:
    """One proposal as the loop makes it: prefill → x_0 and target_hidden (1, L, k·d); the block
    [x_0, mask × (b − 1)] → one draft pass → logits (1, γ, V) → the selector's path (1, γ) through its
    candidates (1, γ, top_k). A ValueError if a shape is off or the path leaves the candidates."""
    ids, b = ids.to(target.device), draft.block_size
    out = target(ids, None, target.make_cache(), output_hidden_states=True, logits_to_keep=1)
    anchor = out.logits[:, -1].argmax(-1)  # (1,) x_0
    block = torch.full((1, b), draft.mask_token_id, dtype=torch.long, device=target.device)
    block[:, 0] = anchor
    noise = target.embed(block) * draft.config.input_embedding_scale  # (1, b, d)
    features = extract_context_feature(out.hidden_states, draft.target_layer_ids)  # (1, L, k·d)
    positions = torch.arange(ids.shape[1] + b, device=target.device)[None]  # (1, L + b)
    hidden = draft(positions, noise_embedding=noise, target_hidden=features)[:, 1:]  # (1, γ, d)
    logits = draft.compute_logits(hidden, target.output_head)  # (1, γ, V)
    path, candidates, q = draft.candidate_selector.select(hidden, logits, anchor, 0.0)
    expected = (
        (1, b - 1, draft.config.hidden_size),
        (1, b - 1, draft.config.vocab_size),
        (1, b - 1),
        (1, b - 1, draft.config.selector_top_k),
    )
    got = (tuple(hidden.shape), tuple(logits.shape), tuple(path.shape), tuple(candidates.shape))
    if got != expected or q is not None:
        raise ValueError(f"draft pass: hidden, logits, path, candidates are {got}, expected {expected}")
    if not (candidates == path[..., None]).any(-1).all():
        raise ValueError(f"draft pass: the selector's path {path[0].tolist()} left its candidates")
    return {
        "hidden": str(got[0]),
        "logits": str(got[1]),
        "candidates": str(got[3]),
        "path": str(path[0].tolist()),
        "path_equals_argmax": bool(torch.equal(path, logits.argmax(-1))),
    }


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


def _models(spec: dict, version: int, device, arch: str):
    """(target, draft, report): the random pair of this size; DFlash 2's shapes and one draft pass checked,
    a hybrid's layer types counted."""
    if arch == "qwen3_5":
        return hybrid_models(spec, device, _fill_, random_sized_draft)
    target = random_target(TargetConfig(**spec["target"]), device, spec["dtype"])
    if version == 1:
        return target, random_draft(target, spec["draft_layers"], spec["block_size"], spec["mask_token_id"]), {}
    draft = random_sized_draft(target, spec["draft"])
    ids = torch.randint(0, target.config.vocab_size, (1, spec["prompt"]), generator=torch.Generator().manual_seed(1))
    return target, draft, {"dflash2_shapes": check_dflash2_shapes(draft), "draft_pass": draft_pass(draft, target, ids)}


def run(size: str = "full", say=print, version: int = 1, arch: str = "qwen3") -> dict | None:
    if version not in (1, 2):
        raise ValueError(f"smoke: version must be 1 or 2, got {version!r}")
    if arch not in ("qwen3", "qwen3_5") or (arch == "qwen3_5" and version != 1):
        raise ValueError(
            f"smoke: arch must be 'qwen3' or 'qwen3_5' (the hybrid with a DFlash 1 draft), "
            f"got arch {arch!r} with version {version}"
        )
    spec = (HYBRID_SIZES if arch == "qwen3_5" else SIZES if version == 1 else DFLASH2_SIZES)[size]
    device = torch.device(spec["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        say("smoke: no CUDA device here — skipping the full-size check (run `--size tiny` for the CPU version)")
        return None
    torch.manual_seed(0)
    target, draft, checks = _models(spec, version, device, arch)
    ids = torch.randint(0, target.config.vocab_size, (1, spec["prompt"]), generator=torch.Generator().manual_seed(0))
    n = spec["new"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _timed(lambda: generate(target, ids, 8), device)  # warm-up, both paths: the first
    _timed(lambda: spec_generate(draft, target, ids, 8), device)  # call of a shape pays its kernels
    ar, t_ar = _timed(lambda: generate(target, ids, n), device)
    rand, t_rand = _timed(lambda: spec_generate(draft, target, ids, n), device)
    oracle = OracleDraft(draft, ar.output_ids)
    orc, t_orc = _timed(lambda: spec_generate(oracle, target, ids, n), device)
    result = {
        "size": size,
        "arch": arch,
        "version": version,
        "device": str(device),
        "dtype": str(spec["dtype"]).removeprefix("torch."),
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "new_tokens": n,
        "ar_tokens_per_s": ar.num_output_tokens / t_ar,
        "random_draft": {
            "tokens_per_s": rand.num_output_tokens / t_rand,
            "speedup": t_ar / t_rand,
            "mean_tokens_per_step": rand.mean_tokens_per_step,
            "first_difference_from_ar": _first_difference(rand.output_ids, ar.output_ids),
        },
        "oracle_draft": {
            "tokens_per_s": orc.num_output_tokens / t_orc,
            "speedup": t_ar / t_orc,
            "mean_tokens_per_step": orc.mean_tokens_per_step,
            "first_difference_from_ar": _first_difference(orc.output_ids, ar.output_ids),
        },
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        **checks,
    }
    say(json.dumps(result, indent=1))
    for name in ("random_draft", "oracle_draft"):
        d = result[name]["first_difference_from_ar"]
        say(f"{name}: {'lossless (token-identical to AR)' if d is None else f'DIFFERS from AR at token {d}'}")
    return result
