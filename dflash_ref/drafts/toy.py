"""Tiny deterministic models: small enough that every tensor fits on a screen. The walkthroughs stand on them
(tour/demo.py) and so does the conformance kit's walkthrough bundle (conformance/scenarios.py), which is why they
live here, below both.

Target: a 6-layer Qwen3 with hidden size 8, 2 query heads sharing 1 KV head (GQA), head_dim 4, and a
16-word vocabulary. Draft: 2 layers, block size 4 unless asked, reading target layers
build_target_layer_ids(6, 2) = [1, 3]. Weights are N(0, 0.5²) from a fixed seed (norm weights 1).
`trained=True` gives the draft trained for this target at that block size instead (tour/toy_drafts.py: one
draft per block size in TOY_BLOCK_SIZES), whose proposals are often accepted; the random one's almost
never are (the conformance kit's walkthrough bundle uses it).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from ..config import DraftConfig, TargetConfig
from ..dflash2 import make_draft
from ..draft_model import DFlashDraftModel
from ..target import Qwen3Target
from .random_draft import randomize_

VOCAB = ["<s>", "the", "cat", "sat", "on", "a", "mat", ".", "dog", "ran", "to", "park", "and", "then", "</s>", "<mask>"]
PROMPT = ["the", "cat", "sat"]
HERE = Path(__file__).resolve().parent
TOY_BLOCK_SIZES = range(2, 9)  # a toy draft is trained and shipped for each (tour/toy_drafts.py)


def check_toy_block_size(block_size) -> int:
    """`block_size` if a trained toy draft exists for it, else a ValueError naming the range."""
    sizes = TOY_BLOCK_SIZES
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size not in sizes:
        raise ValueError(  # tour/knobs.py's sentence, which a notebook's knobs say too
            f"block_size = {block_size!r}: this run offers block_size {sizes.start} to {sizes.stop - 1} "
            "(the block sizes the toy drafts are trained for)"
        )
    return block_size


def toy_weights_file(version: int, block_size: int) -> Path:
    """The shipped weights of the toy draft of a DFlash version and block size, trained for the seed-0 target
    (tour/toy_drafts.py)."""
    return HERE / "toy_weights" / f"dflash{version}_block{check_toy_block_size(block_size)}.safetensors"


def load_toy_weights_(draft: torch.nn.Module) -> torch.nn.Module:
    """The trained toy weights of the draft's version and block size, loaded in place (its config must be the
    toy's)."""
    draft.load_state_dict(load_file(str(toy_weights_file(draft.config.version, draft.block_size))))
    return draft.eval()


def encode(words: list[str] | str) -> torch.Tensor:
    """Words of VOCAB (a list, or one string split at spaces) → ids (1, n)."""
    words = words.split() if isinstance(words, str) else list(words)
    unknown = [w for w in words if w not in VOCAB]
    if unknown or not words:
        raise ValueError(f"{unknown or 'no words'}: a prompt is words of the toy vocabulary {VOCAB}")
    return torch.tensor([[VOCAB.index(w) for w in words]])


def decode(ids) -> list[str]:
    return [VOCAB[int(i)] for i in torch.as_tensor(ids).reshape(-1)]


def demo_models(seed: int = 0, block_size: int = 4, trained: bool = False) -> tuple[Qwen3Target, DFlashDraftModel]:
    """(target, draft): both random from `seed`, or with trained=True the draft trained for this target at this
    block size (seed 0 only: the target it was trained for; block sizes TOY_BLOCK_SIZES)."""
    if trained and seed != 0:
        raise ValueError("the trained toy draft was trained for the seed-0 target: trained=True needs seed=0")
    if trained:
        check_toy_block_size(block_size)
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
    target, draft = randomize_(target, seed, norm_jitter=None), randomize_(draft, seed + 1, norm_jitter=None)
    return target, load_toy_weights_(draft) if trained else draft
