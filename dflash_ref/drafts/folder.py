"""Opening a draft folder the commands name (`--draft DIR`), and the drafts shipped with the package:
the ones `python -m dflash_ref train` trained for SmolLM2-135M-Instruct (official format, bf16), a
DFlash 2 draft (the default) and the DFlash 1 draft before it, which `--draft shipped:dflash1` names
(their folders and names: shipped.py). A folder that cannot serve ends the command with the checkpoint's
own message, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..compat import IncompatibleModels, check_pair
from ..draft_model import DFlashDraftModel
from ..target.checkpoint import CheckpointError
from .checkpoint import load_draft
from .shipped import (  # noqa: F401 (imported from here)
    SHIPPED_DFLASH1,
    SHIPPED_DFLASH2,
    SHIPPED_DRAFT,
    SHIPPED_DRAFTS,
    SHIPPED_NAMES,
    draft_folder,
)


def open_draft(
    folder: str | Path | None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    proposing: bool = False,
) -> tuple[DFlashDraftModel, Path]:
    """--draft FOLDER or shipped name (default: the shipped SmolLM2 draft) → (draft, folder); a bad folder ends the
    command with the checkpoint's own message (checkpoint.CheckpointError) instead of a traceback.
    generate, evaluate and bench trained all read --draft here. `proposing`: a measure of acceptance
    at the draft's own block size, which a block of 1 (the anchor alone) cannot give."""
    try:
        folder = draft_folder(folder)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    try:
        draft = load_draft(folder, dtype, device)
    except CheckpointError as e:
        shipped = folder in SHIPPED_DRAFTS.values()
        raise SystemExit(f"{f'the shipped SmolLM2 draft {folder.name}' if shipped else '--draft'}: {e}") from None
    if proposing and draft.block_size < 2:
        raise SystemExit(
            f"--draft {folder}: its block_size {draft.block_size} holds no proposal (a block is the "
            f"anchor and b − 1 proposals), so there is no acceptance to measure"
        )
    return draft, folder


def check_fits(draft, folder: Path, target, target_name: str = "SmolLM2-135M") -> None:
    """End the command, naming the folder and the mismatch, if the draft does not fit the target (compat.py)."""
    try:
        check_pair(draft, target)
    except IncompatibleModels as e:
        raise SystemExit(f"--draft {folder} does not fit {target_name}: {e}") from None
