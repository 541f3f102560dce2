"""An oracle draft: a real draft forward whose *proposals* come from a known continuation.

    d_i = continuation[p_i]              if i ≤ accept[step]   (p_i: the block position's index)
          (continuation[p_i] + 1) mod V  otherwise             (a guaranteed mismatch)

With `continuation` = the target's own greedy output, every proposal is what the target would say,
so acceptance is full (the speedup ceiling); `accept` (a list of τ per step, or one int) forces
exact partial acceptance, which the tests use to place stop tokens inside accepted runs or as the
bonus. The draft network still runs (same cost, same cache handling); only its logits are replaced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..draft_model import DFlashDraftModel


class OracleDraft(nn.Module):
    def __init__(
        self,
        draft: DFlashDraftModel,
        continuation: torch.Tensor | Sequence[int],
        accept: int | Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.draft = draft
        self.config = draft.config
        self.continuation = torch.as_tensor(continuation).reshape(-1).tolist()
        self.accept = accept
        self._steps = 0
        self._block_positions: list[int] = []  # set by forward, read by compute_logits (same step)

    block_size = property(lambda self: self.draft.block_size)
    mask_token_id = property(lambda self: self.draft.mask_token_id)
    target_layer_ids = property(lambda self: self.draft.target_layer_ids)

    def make_cache(self):
        return self.draft.make_cache()

    def choose_tokens(self, *args):
        """The oracle's tokens: the argmax of its logits, or a draw from them (DFlash 1's rule), whatever
        the version of the draft it wraps."""
        return DFlashDraftModel.choose_tokens(self.draft, *args)

    def forward(self, position_ids, attention_mask=None, **kwargs):
        hidden = self.draft(position_ids, attention_mask, **kwargs)
        q_len = kwargs["noise_embedding"].shape[1]
        self._block_positions = position_ids[0, -q_len:].tolist()
        return hidden

    def _allowed(self) -> int:
        if self.accept is None:
            return 1 << 30
        if isinstance(self.accept, int):
            return self.accept
        return self.accept[self._steps] if self._steps < len(self.accept) else 0

    def compute_logits(self, hidden: torch.Tensor, output_head: nn.Module) -> torch.Tensor:
        logits = self.draft.compute_logits(hidden, output_head)  # (1, γ, V): real, still traced
        vocab, allowed = logits.shape[-1], self._allowed()
        forced = torch.full_like(logits, -1e4)
        for i, pos in enumerate(self._block_positions[1:]):  # d_i predicts position pos
            token = self.continuation[pos] if pos < len(self.continuation) else 0
            if i >= allowed:
                token = (token + 1) % vocab
            forced[0, i, token] = 1e4
        self._steps += 1
        return forced
