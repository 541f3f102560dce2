"""DFlash draft folders in the official format: `config.json` (`architectures: ["DFlashDraftModel"]`)
+ safetensors, read and written by the Hugging Face layout reader of target/checkpoint.py, with the
official parameter names, so one folder loads here, in `dflash` and in any port.

A draft folder may also hold `draft_vocab.json` (extensions/draft_vocab.py): the token ids the draft
proposes among; the official loader ignores the file and proposes over all V.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DRAFT_ARCHITECTURES, DraftConfig
from ..dflash2 import make_draft
from ..draft_model import DFlashDraftModel
from ..extensions.draft_vocab import FILE as DRAFT_VOCAB_FILE
from ..extensions.draft_vocab import check_draft_vocab, load_draft_vocab, save_draft_vocab
from ..target.checkpoint import CheckpointError, load_folder, save_folder
from .shipped import SHIPPED_NAMES, shipped_or_folder


def load_draft(folder: str | Path, dtype=None, device: str | torch.device = "cpu") -> DFlashDraftModel:
    """An official-format DFlash draft folder, or a shipped draft's name as `--draft` takes it (`shipped:dflash2`,
    `shipped:dflash1`: shipped.py) → DFlashDraftModel (dtype: None = the config's; the shipped ones are bf16).
    What is neither is refused, listing the names (CheckpointError)."""
    try:
        folder = shipped_or_folder(folder)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if not folder.exists():
        names = ", ".join(SHIPPED_NAMES)
        raise CheckpointError(f"no folder {folder} (a draft folder, or a shipped draft's name: {names})")
    model = load_folder(make_draft, DraftConfig, folder, dtype, device, set(DRAFT_ARCHITECTURES))
    state = model.state_dict()
    broken = [name for name, t in state.items() if not bool(torch.isfinite(t).all())]
    if broken:  # a damaged draft: its proposals would be NaN, sampling them fails in torch
        loaded = next(iter(state.values())).dtype
        narrow = ", which may be too narrow for the stored values" if loaded == torch.float16 else ""
        raise CheckpointError(
            f"{Path(folder)}: tensors holding NaN or infinity as loaded in {loaded}{narrow}: {broken}"
        )
    try:
        model.draft_vocab = load_draft_vocab(folder, model.config.vocab_size)  # draft_vocab.json, if any
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return model


def save_draft(model: DFlashDraftModel, folder: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write config.json + model.safetensors in the official draft format, and draft_vocab.json
    beside them if the draft has a draft vocabulary (a stale one is removed if it has none)."""
    save_folder(model, folder, dtype)
    if getattr(model, "draft_vocab", None) is not None:
        save_draft_vocab(check_draft_vocab(model.draft_vocab, model.config.vocab_size), folder)
    else:
        (Path(folder) / DRAFT_VOCAB_FILE).unlink(missing_ok=True)
