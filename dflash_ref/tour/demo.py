"""The walkthroughs' toy models: drafts/toy.py's, named here as the notebooks and the tour import them."""

from __future__ import annotations

from ..drafts.toy import (
    HERE,
    PROMPT,
    TOY_BLOCK_SIZES,
    VOCAB,
    check_toy_block_size,
    decode,
    demo_models,
    encode,
    load_toy_weights_,
    toy_weights_file,
)

__all__ = [
    "HERE",
    "PROMPT",
    "TOY_BLOCK_SIZES",
    "VOCAB",
    "check_toy_block_size",
    "decode",
    "demo_models",
    "encode",
    "load_toy_weights_",
    "toy_weights_file",
]
