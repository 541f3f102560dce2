"""Opening a draft folder the commands name (`--draft DIR`), and the draft shipped with the package:
the one `python -m dflash_ref train` trained for SmolLM2-135M-Instruct (official format, bf16). A
folder that cannot serve ends the command with the checkpoint's own message, never a traceback.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..compat import IncompatibleModels, check_pair
from ..draft_model import DFlashDraftModel
from ..target.checkpoint import CheckpointError
from .checkpoint import load_draft

# the draft trained for SmolLM2 by `python -m dflash_ref train` (figures/training/README.md), official format, bf16
SHIPPED_DRAFT = Path(__file__).parent / "smollm2"
# every draft shipped for SmolLM2, the default first, by the label `bench trained` gives it
SHIPPED_DRAFTS = {"DFlash 1 (shipped)": SHIPPED_DRAFT}


def open_draft(folder: str | Path | None, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", proposing: bool = False) -> tuple[DFlashDraftModel, Path]:
    """--draft FOLDER (default: the shipped SmolLM2 draft) → (draft, folder); a bad folder ends the
    command with the checkpoint's own message (checkpoint.CheckpointError) instead of a traceback.
    generate, evaluate and bench trained all read --draft here. `proposing`: a measure of acceptance
    at the draft's own block size, which a block of 1 (the anchor alone) cannot give."""
    folder = Path(folder) if folder else SHIPPED_DRAFT
    try:
        draft = load_draft(folder, dtype, device)
    except CheckpointError as e:
        raise SystemExit(f"{'--draft' if folder != SHIPPED_DRAFT else 'the shipped SmolLM2 draft'}: {e}") from None
    if proposing and draft.block_size < 2:
        raise SystemExit(f"--draft {folder}: its block_size {draft.block_size} holds no proposal (a block is the "
                         f"anchor and b − 1 proposals), so there is no acceptance to measure")
    return draft, folder


def check_fits(draft, folder: Path, target, target_name: str = "SmolLM2-135M") -> None:
    """End the command, naming the folder and the mismatch, if the draft does not fit the target (compat.py)."""
    try:
        check_pair(draft, target)
    except IncompatibleModels as e:
        raise SystemExit(f"--draft {folder} does not fit {target_name}: {e}") from None
