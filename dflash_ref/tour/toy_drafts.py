"""The walkthrough's toy drafts: DFlash 1 and DFlash 2 drafts trained for the toy target (demo.py), so that
the notebooks walk steps where draft tokens are really accepted.

The recipe is the project's (training/recipe.py), on data the toy target writes itself:

    prompts    PROMPTS random sequences of 1 … 5 words of the toy vocabulary (the mask token left out)
    responses  the toy target's greedy continuation of each, RESPONSE_TOKENS tokens (self-distillation)
    steps      STEPS optimiser steps, each over BATCH sequences with ANCHORS blocks of 4 apiece
    loss       the paper's position-weighted cross-entropy (γ = 4 for blocks of 4), AdamW, warm-up and cosine

The drafts are as small as the toy target (hidden 8, 2 layers), so they are weak: on fresh prompts about
two in three proposals at block position 1 are wrong. They are trained once and shipped
(`toy_dflash1.safetensors`, `toy_dflash2.safetensors` beside this module, a few kB each), so every
machine walks the same numbers:

    python -m dflash_ref.tour.toy_drafts      # retrains both and rewrites the files (a few minutes)
"""

from __future__ import annotations

import torch

from ..decoding import generate
from ..drafts.random_draft import identity_convolutions_
from ..target.checkpoint import save_safetensors
from ..training.features import target_features
from ..training.recipe import loss_weights, make_optimizer, sample_anchors, train_step
from .demo import VOCAB, toy_weights_file
from .dflash2 import dflash2_models

PROMPTS, RESPONSE_TOKENS = 1024, 24
STEPS, BATCH, ANCHORS, LR, WARMUP = 1500, 8, 12, 1e-2, 50


def toy_data(target, words: list[int], seed: int) -> list[tuple[torch.Tensor, int]]:
    """PROMPTS (sequence (1, T), prompt length) pairs: a random prompt and the target's greedy response."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(PROMPTS):
        length = int(torch.randint(1, 6, (1,), generator=g))
        prompt = torch.tensor([[words[int(i)] for i in torch.randint(0, len(words), (length,), generator=g)]])
        data.append((generate(target, prompt, RESPONSE_TOKENS).output_ids, length))
    return data


def train_toy_draft(target, draft, words: list[int], seed: int = 1, say=print) -> torch.nn.Module:
    """Train `draft` in place on toy_data, the recipe's way; returns it in eval mode."""
    data = toy_data(target, words, seed)
    features = [target_features(target, ids, draft.target_layer_ids) for ids, _ in data]
    g = torch.Generator().manual_seed(seed + 1)
    weights = loss_weights(draft.block_size, 4.0)
    optimizer, schedule = make_optimizer(draft, LR, STEPS, WARMUP)
    for step in range(STEPS):
        batch = []
        for i in torch.randint(0, len(data), (BATCH,), generator=g).tolist():
            ids, prompt_len = data[i]
            batch.append((ids, features[i], sample_anchors(prompt_len, ids.shape[1], draft.block_size, ANCHORS, g)))
        loss = train_step(draft, target, batch, weights, optimizer, schedule)
        if step % 250 == 0 or step == STEPS - 1:
            say(f"   step {step:>4}: loss {loss:.3f}")
    return draft.eval()


def main() -> None:
    torch.manual_seed(0)
    words = [i for i, w in enumerate(VOCAB) if w != "<mask>"]
    target, dflash2, dflash1 = dflash2_models()
    identity_convolutions_(dflash2)  # DFlash 2 starts as its DFlash 1 twin (as `train` starts its drafts)
    for draft in (dflash1, dflash2):
        print(f"DFlash {draft.config.version}:")
        train_toy_draft(target, draft.train(), words)
        save_safetensors(
            {k: v.contiguous() for k, v in draft.state_dict().items()}, toy_weights_file(draft.config.version)
        )
        print("wrote", toy_weights_file(draft.config.version))


if __name__ == "__main__":
    main()
