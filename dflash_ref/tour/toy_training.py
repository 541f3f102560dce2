"""Notebook 05's measurements and figures: a toy draft trained in view, and what it learnt.

acceptance        greedy decodes of fresh prompts: τ per step, and per block position k the share of the
                  steps that drafted position k whose first k proposals were all accepted
loss by position  the recipe's cross-entropy at each block position k = 1 … b − 1, unweighted, on a fixed
                  set of blocks of the training data: which positions the draft can predict
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from matplotlib.figure import Figure
from torch.nn import functional as F

from ..decoding import spec_generate
from ..trace import StepLog
from ..training.features import target_features
from ..training.recipe import output_logits, sample_anchors, training_hidden
from .toy_drafts import ANCHORS, toy_words


def fresh_prompts(count: int = 12, words: int = 3, seed: int = 7) -> list[torch.Tensor]:
    """`count` prompts of `words` random toy words each (another seed than the training data's: the toy
    vocabulary is small, so some may repeat a training prompt)."""
    ids, g = toy_words(), torch.Generator().manual_seed(seed)
    return [torch.tensor([[ids[int(i)] for i in torch.randint(0, len(ids), (words,), generator=g)]]) for _ in
            range(count)]  # fmt: skip


@dataclass
class Acceptance:
    taus: list[int]  # τ of every step of every decode
    by_position: list[float]  # k = 1 … γ: accepted at position k / steps that drafted position k

    @property
    def tokens_per_step(self) -> float:
        """Mean τ + 1."""
        return sum(self.taus) / max(len(self.taus), 1) + 1


def acceptance(draft, target, prompts: list[torch.Tensor], max_new_tokens: int = 16) -> Acceptance:
    """Greedy speculative decodes of `prompts`: τ per step and the acceptance at each block position."""
    taus, drafted, accepted = [], np.zeros(draft.block_size - 1), np.zeros(draft.block_size - 1)
    with torch.no_grad():
        for ids in prompts:
            log = StepLog()
            spec_generate(draft, target, ids, max_new_tokens, on_step=log)
            for record in log:
                taus.append(record.acceptance_length)
                drafted[: len(record.draft_tokens)] += 1  # γ of this step's block (the last may be shrunk)
                accepted[: record.acceptance_length] += 1
    return Acceptance(taus, (accepted / np.maximum(drafted, 1)).tolist())


def evaluation_blocks(data, block_size: int, sequences: int = 64, seed: int = 3) -> list[tuple]:
    """A fixed set of (token_ids, anchors) from the first `sequences` of `data`, ANCHORS blocks apiece."""
    g = torch.Generator().manual_seed(seed)
    return [(ids, sample_anchors(prompt_len, ids.shape[1], block_size, ANCHORS, g)) for ids, prompt_len in
            data[:sequences]]  # fmt: skip


def loss_by_position(draft, target, blocks: list[tuple]) -> list[float]:
    """The cross-entropy at each block position k = 1 … b − 1 (unweighted), averaged over `blocks`."""
    total = torch.zeros(draft.block_size - 1)
    with torch.no_grad():
        for ids, anchors in blocks:
            features = target_features(target, ids, draft.target_layer_ids)
            hidden, tokens = training_hidden(draft, target, ids, features, anchors)
            logits, labels = output_logits(draft, target, hidden, tokens)  # (m, b − 1, V), (m, b − 1)
            ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
            total += ce.view(labels.shape).mean(0)  # (b − 1,)
    return (total / len(blocks)).tolist()


def plot_training(losses: list[float], before: list[float], after: list[float], shipped: list[float] | None = None,
                  smooth: int = 20) -> Figure:  # fmt: skip
    """Left: the training loss per step and its running mean over `smooth` steps. Right: the cross-entropy at
    each block position, before and after training (and the shipped toy draft's, if given)."""
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    a, b = fig.subplots(1, 2)
    steps = np.arange(len(losses))
    a.plot(steps, losses, color="#bbbbbb", lw=0.8, label="each step")
    if len(losses) >= smooth:
        mean = np.convolve(losses, np.ones(smooth) / smooth, mode="valid")
        a.plot(steps[smooth - 1 :], mean, color="#d62728", lw=1.8, label=f"mean of the last {smooth}")
    a.set_xlabel("optimiser step")
    a.set_ylabel("weighted cross-entropy")
    a.set_title("the training loss", fontsize=9)
    a.legend(fontsize=8)
    positions = np.arange(1, len(before) + 1)
    lines = [("before training", before, "#1f77b4"), ("after", after, "#d62728")]
    if shipped is not None:
        lines.append(("the shipped toy draft", shipped, "#2ca02c"))
    for name, values, colour in lines:
        b.plot(positions, values, marker="o", color=colour, label=name)
    b.set_xticks(positions, [f"d{k}" for k in positions])
    b.set_xlabel("block position k")
    b.set_ylabel("cross-entropy (nats)")
    b.set_title("how well each block position is predicted", fontsize=9)
    b.legend(fontsize=8)
    return fig


def plot_acceptance_by_position(runs: dict[str, Acceptance]) -> Figure:
    """Per block position k, the share of steps whose first k proposals were all accepted, one line a run."""
    fig = Figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.subplots()
    for name, run in runs.items():
        positions = np.arange(1, len(run.by_position) + 1)
        ax.plot(positions, run.by_position, marker="o", label=f"{name}: τ + 1 = {run.tokens_per_step:.2f}")
    ax.set_xticks(np.arange(1, max(len(r.by_position) for r in runs.values()) + 1))
    ax.set_xlabel("block position k")
    ax.set_ylabel("accepted up to k (share of steps)")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("acceptance by block position, greedy, fresh prompts", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def plot_block_sizes(runs: dict[int, Acceptance]) -> Figure:
    """Mean τ + 1 of the shipped toy draft of each block size: what a longer block buys."""
    fig = Figure(figsize=(5.5, 3), layout="constrained")
    ax = fig.subplots()
    sizes = sorted(runs)
    ax.bar(sizes, [runs[b].tokens_per_step for b in sizes], color="#1f77b4")
    ax.plot(sizes, sizes, color="#999999", ls=":", label="every proposal accepted: b")
    ax.set_xticks(sizes)
    ax.set_xlabel("block size b (a draft trained for each)")
    ax.set_ylabel("tokens per step, τ + 1")
    ax.set_title("what a longer block buys (toy target, fresh prompts)", fontsize=9)
    ax.legend(fontsize=8)
    return fig
