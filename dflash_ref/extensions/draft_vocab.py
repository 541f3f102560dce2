"""A draft vocabulary: the draft proposes only among a subset V_d of the target's V token ids
(the reduced draft vocabulary of EAGLE-3 and FR-Spec; not in the DFlash paper).

    z_d = h · W[V_d]ᵀ                  (…, d) × (|V_d|, d)ᵀ → (…, |V_d|)   the lm_head's rows of V_d
    z_v = z_d[v] for v ∈ V_d, −∞ else   (…, V)                             so q(v) = 0 outside V_d

Lossless either way: the target verifies every proposal, and for rejection sampling a q that is
zero outside V_d is still a proposal distribution (the residual max(p − q, 0) covers the rest).
What it buys: the proposals' product over the lm_head shrinks by V / |V_d| (SmolLM2 with the
tokens of its training responses: 49152 / 13083 ≈ 3.8×). What it costs: a token outside V_d is never
proposed, so a run of accepted tokens ends there. A trained draft whose loss only ever had V_d
among its labels (training/recipe.py's sampled vocabulary) almost never proposes such a token correctly.

Stored next to an official checkpoint as `draft_vocab.json` ({"token_ids": [...]}); loaders that
do not know it (the official one) ignore it and propose over all V, which is equally lossless.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch import nn

from ..decoding import Block, Proposal, Proposer

FILE = "draft_vocab.json"


def check_draft_vocab(token_ids, vocab_size: int) -> torch.Tensor:
    """Sorted distinct ids in [0, vocab_size), at least one → a 1-D long tensor; anything else raises."""
    try:
        ids = torch.as_tensor(token_ids)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(
            f"a draft vocabulary is a sorted list of integer token ids, got {type(token_ids).__name__}: {e}"
        ) from None
    if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(
            f"a draft vocabulary is a non-empty 1-D list of integer token ids, got "
            f"{ids.dtype} of shape {tuple(ids.shape)}"
        )
    ids = ids.long()
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(
            f"draft vocabulary ids must lie in [0, {vocab_size}) (the target's vocabulary), "
            f"got ids from {int(ids.min())} to {int(ids.max())}"
        )
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("draft vocabulary ids must be sorted and distinct")
    return ids


class DraftVocab(nn.Module):
    """`spec_generate(..., extensions=[DraftVocab(target, token_ids)])`: the draft's proposals come from
    the target's lm_head restricted to V_d, (…, d) → (…, V) logits, −∞ outside V_d. The rows W[V_d] are
    gathered once, into a plain nn.Linear (so that `use_fast_cpu` reaches it too)."""

    def __init__(self, target, token_ids: torch.Tensor) -> None:
        super().__init__()
        try:
            weight = target.output_weight()  # (V, d)
        except ValueError as e:
            raise ValueError(f"a draft vocabulary needs the target's lm_head as one matrix: {e}") from None
        ids = check_draft_vocab(token_ids, weight.shape[0]).to(weight.device)
        self.register_buffer("ids", ids, persistent=False)
        self.rows = nn.Linear(weight.shape[1], len(ids), bias=False, device="meta")
        self.rows.weight = nn.Parameter(weight.detach()[ids], requires_grad=False)  # (|V_d|, d)
        self.vocab_size = weight.shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = self.rows(hidden)  # (…, |V_d|)
        full = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))  # (…, V)
        full[..., self.ids] = sub
        return full

    def wrap(self, propose: Proposer) -> Proposer:
        def propose_in_vocabulary(block: Block) -> Proposal:
            return propose(dataclasses.replace(block, head=self))

        return propose_in_vocabulary


def draft_vocab_of(draft, target) -> list[DraftVocab]:
    """[DraftVocab(target, draft.draft_vocab)] where the draft's folder declared one (load_draft reads
    draft_vocab.json into `draft.draft_vocab`), else []: what the commands decode a loaded draft with."""
    vocab = getattr(draft, "draft_vocab", None)
    return [] if vocab is None else [DraftVocab(target, vocab)]


def save_draft_vocab(token_ids: torch.Tensor, folder: str | Path) -> None:
    ids = torch.as_tensor(token_ids).long().tolist()
    (Path(folder) / FILE).write_text(json.dumps({"token_ids": ids}) + "\n")


def load_draft_vocab(folder: str | Path, vocab_size: int) -> torch.Tensor | None:
    """The folder's draft_vocab.json, checked against the draft's vocab_size; None without one."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["token_ids"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f'{path} is not a draft vocabulary ({{"token_ids": [...]}}): {e}') from None
    try:
        return check_draft_vocab(ids, vocab_size)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
