"""The target's side of the training data, computed once per run with the frozen fp32 target, without
gradient (training/recipe.py reads it at every step):

    features  the sampled layers' hidden states at every position of a sequence, concatenated
              (1, T, k·d): the draft's context (layer_sampling.extract_context_feature)
    soft      with `train --soft-labels`, the target's top-k next-token distribution at every position
              (T, k): SoftTargets (soft_labels.py)

Many sequences go through in batches, sorted by length and right-padded: causal attention makes the
padding change nothing before it.
"""

from __future__ import annotations

import math

import torch

from ..layer_sampling import extract_context_feature
from .soft_labels import SoftTargets, top_k_distribution


def target_features(target, token_ids: torch.Tensor, layer_ids: list[int]) -> torch.Tensor:
    """(1, T) → the sampled layers' features (1, T, k·d), without gradient (the target is frozen)."""
    return target_pass(target, token_ids, layer_ids)[0]


def target_pass(target, token_ids: torch.Tensor, layer_ids: list[int], top_k: int = 0):
    """(n, T) → the sampled layers' features (n, T, k·d) and, with top_k > 0, the target's top-k next-token
    distribution at every position (ids, probabilities (n, T, top_k): soft_labels.py), else None."""
    with torch.no_grad():  # without top_k the logits are not needed: the last position's only
        out = target(token_ids, output_hidden_states=True, logits_to_keep=0 if top_k else 1)
    features = extract_context_feature(out.hidden_states, layer_ids)
    return features, (top_k_distribution(out.logits, top_k) if top_k else None)


def target_features_batched(
    target, sequences: list[torch.Tensor], layer_ids: list[int], batch_size: int = 16, say=None, top_k: int = 0
) -> tuple[list[torch.Tensor], list[SoftTargets] | None]:
    """target_pass for many (1, T_i) sequences, `batch_size` at a time: sorted by length and right-padded,
    which changes nothing before the padding (causal attention) → [(1, T_i, k·d)] and, with top_k > 0,
    [SoftTargets (T_i, top_k)] (the target's whole distribution, not yet restricted: soft_labels.py), else
    None. `say`, if given, gets a progress line about every 10 % of the sequences."""
    order = sorted(range(len(sequences)), key=lambda i: sequences[i].shape[1])
    out: list[torch.Tensor | None] = [None] * len(sequences)
    soft: list[SoftTargets | None] = [None] * len(sequences)
    for start in range(0, len(order), batch_size):
        group = order[start : start + batch_size]
        width = max(sequences[i].shape[1] for i in group)
        padded = torch.zeros(len(group), width, dtype=torch.long)  # (n, T_max), pad id 0
        for row, i in enumerate(group):
            padded[row, : sequences[i].shape[1]] = sequences[i][0]
        features, top = target_pass(target, padded.to(target.device), layer_ids, top_k)  # (n, T_max, k·d)
        for row, i in enumerate(group):
            length = sequences[i].shape[1]
            out[i] = features[row : row + 1, :length].clone()
            if top is not None:  # (n, T_max, top_k) each
                soft[i] = SoftTargets(top[0][row, :length].clone(), top[1][row, :length].clone())
        group_number, groups = start // batch_size + 1, math.ceil(len(order) / batch_size)
        if say is not None and (group_number == groups or group_number % math.ceil(groups / 10) == 0):
            say(f"target features: {start + len(group)}/{len(order)} sequences")
    return out, (soft if top_k else None)
