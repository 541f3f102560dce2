"""`train --modules`: which of a DFlash 2 draft's two modules a run trains (dflash2_options.MODULES), to
measure each alone (figures/training/levers.md, "The levers").

    both      the convolutions, the selector, and the layers through both losses (the recipe)
    conv      the selector's loss taken on the draft's detached hidden and logits: it learns beside the
              draft without shaping it, so the draft is what training the convolutions alone makes;
              the run's evaluation proposes by the argmax of the logits (`proposing_by_argmax`)
    selector  the convolutions kept the identity they start as (`freeze_convolutions_`): each layer
              stays its DFlash 1 layer, and the selector proposes
"""

from __future__ import annotations

import types
from contextlib import contextmanager

from ..dflash2 import selector_of
from ..draft_model import DFlashDraftModel
from ..drafts.random_draft import convolutions


def freeze_convolutions_(draft) -> None:
    """The convolutions' weights left out of training (no gradient, so AdamW never moves them)."""
    for conv in convolutions(draft):
        conv.requires_grad_(False)


@contextmanager
def proposing_by_argmax(draft, on: bool = True):
    """Inside it, the draft proposes as a DFlash 1 draft does (DFlashDraftModel.choose_tokens: the argmax of its
    logits, no selector), in decoding and in teacher-forced measuring alike; its own proposals are back after."""
    if not on or selector_of(draft) is None:
        yield draft
        return
    draft.choose_tokens = types.MethodType(DFlashDraftModel.choose_tokens, draft)
    try:
        yield draft
    finally:
        del draft.choose_tokens
