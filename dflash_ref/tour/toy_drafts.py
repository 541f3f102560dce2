"""The walkthrough's toy drafts: DFlash 1 and DFlash 2 drafts trained for the toy target (demo.py), one per
block size the notebooks offer (demo.TOY_BLOCK_SIZES), so that the notebooks walk steps where draft tokens
are really accepted, and a longer block shows what a longer block buys.

The recipe is the project's (training/recipe.py), on data the toy target writes itself:

    prompts    PROMPTS random sequences of 1 … 5 words of the toy vocabulary (the mask token left out)
    responses  the toy target's greedy continuation of each, RESPONSE_TOKENS tokens (self-distillation)
    steps      STEPS optimiser steps, each over BATCH sequences with ANCHORS blocks of b apiece
    loss       the paper's position-weighted cross-entropy, w_k = exp(−(k − 1)/γ) with γ = GAMMA (the
               paper's γ for b = 8, and what it gives the shortest blocks it trains), AdamW, warm-up and cosine

A draft's weights have the same shapes whatever its block size (block_size is a number in its config), but
what it learns does not carry over: a draft trained on blocks of 4 has never predicted a fifth position, and
at block 8 it proposes nonsense past the fourth. Hence one draft per block size, each trained on blocks of
its own size. They are as small as the toy target (hidden 8, 2 layers), so they are weak, and shipped (a
few kB each, `toy_weights/`), so every machine walks the same numbers:

    python -m dflash_ref.tour.toy_drafts [--block-sizes 2 3 …]   # retrains them, rewrites the files (minutes each)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from ..decoding import generate
from ..drafts.random_draft import identity_convolutions_
from ..target.checkpoint import save_safetensors
from ..training.features import target_features
from ..training.recipe import loss_weights, make_optimizer, sample_anchors, train_step
from .demo import TOY_BLOCK_SIZES, VOCAB, toy_weights_file
from .dflash2 import dflash2_models

PROMPTS, RESPONSE_TOKENS = 1024, 24
STEPS, BATCH, ANCHORS, LR, WARMUP, GAMMA = 1500, 8, 12, 1e-2, 50, 4.0


def toy_words() -> list[int]:
    """The ids a toy prompt is drawn from: the vocabulary less the mask token."""
    return [i for i, w in enumerate(VOCAB) if w != "<mask>"]


def toy_data(target, prompts: int = PROMPTS, seed: int = 1) -> list[tuple[torch.Tensor, int]]:
    """`prompts` (sequence (1, T), prompt length) pairs: a random prompt of 1 … 5 words and the target's greedy
    response of RESPONSE_TOKENS tokens."""
    words = toy_words()
    g = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(prompts):
        length = int(torch.randint(1, 6, (1,), generator=g))
        prompt = torch.tensor([[words[int(i)] for i in torch.randint(0, len(words), (length,), generator=g)]])
        data.append((generate(target, prompt, RESPONSE_TOKENS).output_ids, length))
    return data


def train_toy_draft(
    target,
    draft,
    data: list[tuple[torch.Tensor, int]],
    steps: int = STEPS,
    seed: int = 1,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train `draft` in place on `data` (toy_data), the recipe's way, on blocks of its own block size; it is
    left in eval mode. `on_step(step, loss)` after each optimiser step. → the loss of every step."""
    features = [target_features(target, ids, draft.target_layer_ids) for ids, _ in data]
    g = torch.Generator().manual_seed(seed + 1)
    weights = loss_weights(draft.block_size, GAMMA)
    optimizer, schedule = make_optimizer(draft, LR, steps, min(WARMUP, steps // 10 + 1))
    losses = []
    for step in range(steps):
        batch = []
        for i in torch.randint(0, len(data), (BATCH,), generator=g).tolist():
            ids, prompt_len = data[i]
            batch.append((ids, features[i], sample_anchors(prompt_len, ids.shape[1], draft.block_size, ANCHORS, g)))
        losses.append(train_step(draft, target, batch, weights, optimizer, schedule))
        if on_step is not None:
            on_step(step, losses[-1])
    draft.eval()
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Retrain the walkthrough's toy drafts and rewrite their files.")
    parser.add_argument("--block-sizes", nargs="+", type=int, default=list(TOY_BLOCK_SIZES), metavar="B")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # matrices 8 wide: a second thread only adds its synchronisation
    for block_size in args.block_sizes:
        torch.manual_seed(0)
        target, dflash2, dflash1 = dflash2_models(block_size=block_size)
        identity_convolutions_(dflash2)  # DFlash 2 starts as its DFlash 1 twin (as `train` starts its drafts)
        data = toy_data(target)
        for draft in (dflash1, dflash2):
            path = toy_weights_file(draft.config.version, block_size)
            print(f"DFlash {draft.config.version}, block size {block_size}:", flush=True)

            def say(step: int, loss: float) -> None:
                if step % 250 == 0 or step == STEPS - 1:
                    print(f"   step {step:>4}: loss {loss:.3f}", flush=True)

            train_toy_draft(target, draft.train(), data, on_step=say)
            save_safetensors({k: v.contiguous() for k, v in draft.state_dict().items()}, path)
            print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
