"""Target-layer sampling and context-feature extraction (seed: "Hidden States 提取与使用").

Which target layers feed the draft (official rule, for n draft-side layers out of L target layers):

    n = 1:  l_1 = ⌊L / 2⌋
    n > 1:  l_i = round(1 + i · (L − 4) / (n − 1)),   i = 0 .. n − 1

(Python's round: halves go to the even neighbour.) Qwen3-8B has L = 36 and the released draft uses
n = 5, giving [1, 9, 17, 25, 33]. # diff with seed: it says "32 layers → about 3, 9, 16, 22, 28";
Qwen3-8B has 36 layers and the formula is exact. For tiny targets ids can repeat ((4, 2) → [1, 1]).

Extraction: `hidden_states` has L + 1 entries, index 0 being the embedding output, so the output
of layer l is `hidden_states[l + 1]`:

    target_hidden = concat[h^(l_1), …, h^(l_k)]  over features:  (B, L_ctx, k · d)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

HIDDEN_STATE_OFFSET = 1  # hidden_states[0] is the embedding output, not a layer's


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Evenly spaced target layers: `num_draft_layers` ids out of `num_target_layers`."""
    if num_target_layers < 1 or num_draft_layers < 1:
        raise ValueError(
            f"need at least one target layer and one draft layer, got "
            f"num_target_layers={num_target_layers}, num_draft_layers={num_draft_layers}"
        )
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    first, last = 1, num_target_layers - 3
    # for targets of < 3 layers the formula leaves the range ((2, 2) → [1, −1]); it is returned as
    # the official code returns it, and DraftConfig refuses it with a message naming this call
    return [round(first + i * (last - first) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def extract_context_feature(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """Concatenate the outputs of `layer_ids` (read at `hidden_states[id + 1]`) on the feature axis.

    hidden_states: L + 1 tensors (B, L_ctx, d) → target_hidden (B, L_ctx, len(layer_ids) · d)
    """
    num_layers = len(hidden_states) - HIDDEN_STATE_OFFSET
    bad = [i for i in layer_ids if not 0 <= i < num_layers]
    if bad or not layer_ids:
        raise ValueError(
            f"target layer ids {list(layer_ids)} do not fit a target with {num_layers} "
            f"layers (ids must lie in 0..{num_layers - 1})"
        )
    return torch.cat([hidden_states[i + HIDDEN_STATE_OFFSET] for i in layer_ids], dim=-1)
