"""Tiny deterministic models for the walkthroughs: small enough that every tensor fits on a screen.

Target: a 6-layer Qwen3 with hidden size 8, 2 query heads sharing 1 KV head (GQA), head_dim 4, and a
16-word vocabulary. Draft: 2 layers, block size 4, reading target layers
build_target_layer_ids(6, 2) = [1, 3]. Weights are N(0, 0.5²) from a fixed seed (norm weights 1).
The draft is untrained, so its own proposals are almost never accepted; the decode-loop example
uses `OracleDraft` (the real draft network runs; its proposals are replaced) to show zero, partial
and full acceptance.
"""

from __future__ import annotations

import torch

from ..config import DraftConfig, TargetConfig
from ..dflash2 import make_draft
from ..draft_model import DFlashDraftModel
from ..drafts.random_draft import randomize_
from ..target import Qwen3Target

VOCAB = ["<s>", "the", "cat", "sat", "on", "a", "mat", ".", "dog", "ran", "to", "park", "and", "then", "</s>", "<mask>"]
PROMPT = ["the", "cat", "sat"]


def encode(words: list[str]) -> torch.Tensor:
    return torch.tensor([[VOCAB.index(w) for w in words]])


def decode(ids) -> list[str]:
    return [VOCAB[int(i)] for i in torch.as_tensor(ids).reshape(-1)]


def demo_models(seed: int = 0, block_size: int = 4) -> tuple[Qwen3Target, DFlashDraftModel]:
    shared = dict(
        vocab_size=len(VOCAB),
        hidden_size=8,
        intermediate_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        rope_theta=10000.0,
        max_position_embeddings=256,
    )
    target = Qwen3Target(TargetConfig(num_hidden_layers=6, **shared))
    draft = make_draft(
        DraftConfig(
            num_hidden_layers=2,
            num_target_layers=6,
            block_size=block_size,
            mask_token_id=VOCAB.index("<mask>"),
            **shared,
        )
    )
    return randomize_(target, seed, norm_jitter=None), randomize_(draft, seed + 1, norm_jitter=None)
