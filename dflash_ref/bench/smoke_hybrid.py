"""`smoke --arch qwen3_5`: the smoke check (smoke.py) on a hybrid target, the own Qwen3.5 (target/qwen3_5.py).

Full size: a random target shaped like Qwen/Qwen3.5-27B's text model, bf16 on CUDA, and a random 5-layer
block-16 DFlash draft shaped like z-lab/Qwen3.5-27B-DFlash; 256 new tokens after a 64-token prompt, AR
against the random draft (τ ≈ 0: a crop inside nearly every verify, so every step rolls the Gated
DeltaNet states back) and against the oracle (whole blocks). The shapes were read from public material
(no network here to fetch the released config.json files), so they are ASSUMED:
  - the target (public configs of Qwen3.5-27B quoted in ports' tests, and a training recipe's model
    arguments): hidden 5120, 64 layers, every 4th full attention (48 Gated DeltaNet, 16 gated attention),
    24 query / 4 KV heads of head_dim 256, partial RoPE 0.25 at rope_theta 1e7, Gated DeltaNet 16 key /
    48 value heads of 128, conv kernel 4, FFN 17408, vocabulary 248320, untied, 262144 positions: 26.9e9
    parameters, 50.1 GiB in bf16 (the released safetensors, 51.75 GiB, hold the vision tower and the mtp
    head besides);
  - the draft: its config.json was not found. A draft of 5 layers with the target's hidden 5120, 32 query
    / 8 KV heads of 128, FFN 17408 (as the DFlash 2 draft of the same width, smoke.py) has 1.73e9
    parameters, 3.22 GiB in bf16, the released draft's size; block 16 and layer ids
    build_target_layer_ids(64, 5) = [1, 16, 31, 46, 61] as the other DFlash 1 drafts; mask_token_id
    248070 as the DFlash 2 draft of the same vocabulary.
Random weights are N(0, 0.02²); Qwen3.5's offset norms (1 + w) get w = 0 and the gated norm's w = 1, so
every norm starts at unit scale. The tiny size keeps the structure (both mixers, partial RoPE, GQA, the
draft's heads unlike the target's, explicit layer ids) and runs on the CPU in seconds (CI runs it).
"""

from __future__ import annotations

from collections import Counter

import torch

from ..target import HybridConfig, Qwen3_5Target
from ..target.qwen3_5 import OffsetRMSNorm

HYBRID_SIZES = {
    "full": dict(
        target=dict(
            vocab_size=248320,
            hidden_size=5120,
            intermediate_size=17408,
            num_hidden_layers=64,
            num_attention_heads=24,
            num_key_value_heads=4,
            head_dim=256,
            linear_num_key_heads=16,
            linear_num_value_heads=48,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            partial_rotary_factor=0.25,
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
            block_size=16,
            mask_token_id=248070,
            target_layer_ids=[1, 16, 31, 46, 61],
        ),
        prompt=64,
        new=256,
        dtype=torch.bfloat16,
        device="cuda",
    ),
    "tiny": dict(
        target=dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
            partial_rotary_factor=0.25,
            rope_theta=1e7,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
        ),
        draft=dict(
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            rope_theta=1e7,
            max_position_embeddings=1024,
            block_size=8,
            mask_token_id=511,
            target_layer_ids=[1, 6],
        ),
        prompt=16,
        new=32,
        dtype=torch.float32,
        device="cpu",
    ),
}


def random_hybrid_target(config: HybridConfig, device, dtype, fill, seed: int = 0, std: float = 0.02) -> Qwen3_5Target:
    """Built on the meta device and filled in place on `device` by `fill` (smoke.py's: N(0, std²), norm
    weights 1); then the offset norms' w = 0, so that (1 + w) is 1 as the gated norm's w."""
    with torch.device("meta"):
        target = Qwen3_5Target(config)
    target = fill(target.to_empty(device=device), device, seed, std)
    with torch.no_grad():
        for module in target.modules():
            if isinstance(module, OffsetRMSNorm):
                module.weight.zero_()
    return target.to(dtype).eval()


def hybrid_models(spec: dict, device, fill, make_draft):
    """(target, draft, checks): the random hybrid pair of this size, `make_draft(target, fields)` building
    the draft; checks: the count of each layer type and the layers the draft reads."""
    target = random_hybrid_target(HybridConfig(**spec["target"]), device, spec["dtype"], fill)
    draft = make_draft(target, spec["draft"])
    checks = {"layer_types": dict(Counter(target.config.layer_types)), "target_layer_ids": draft.target_layer_ids}
    return target, draft, checks
