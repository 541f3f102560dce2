"""DFlash draft folders in the official format: `config.json` (`architectures: ["DFlashDraftModel"]`)
+ safetensors, read and written by the Hugging Face layout reader of target/checkpoint.py, with the
official parameter names, so one folder loads here, in `dflash` and in any port. A Muse Glimmer assistant's
folder (transformers' own DFlash drafter, muse_glimmer.py) loads too, as the DFlash 1 draft it is, and a
DFlash 1 draft is written as one with `save_muse_glimmer`.

A draft folder may also hold `draft_vocab.json` (extensions/draft_vocab.py): the token ids the draft
proposes among; the official loader ignores the file and proposes over all V.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import muse_glimmer
from ..config import DRAFT_ARCHITECTURES, ConfigError, DraftConfig
from ..dflash2 import make_draft
from ..draft_model import DFlashDraftModel
from ..extensions.draft_vocab import FILE as DRAFT_VOCAB_FILE
from ..extensions.draft_vocab import check_draft_vocab, load_draft_vocab, save_draft_vocab
from ..target.checkpoint import (
    SINGLE,
    CheckpointConfigError,
    CheckpointError,
    _check_architecture,
    config_architectures,
    load_folder,
    save_folder,
    save_safetensors,
)
from .shipped import SHIPPED_NAMES, draft_folder, shipped_or_folder


def load_draft(folder: str | Path, dtype=None, device: str | torch.device = "cpu") -> DFlashDraftModel:
    """An official-format DFlash draft folder, or a shipped draft's name as `--draft` takes it (`shipped:dflash2`,
    `shipped:dflash1`: shipped.py) → DFlashDraftModel (dtype: None = the config's; the shipped ones are bf16).
    What is neither is refused, listing the names (CheckpointError)."""
    folder = check_draft_folder(folder)
    if (folder / "config.json").is_file() and muse_glimmer.ARCHITECTURE in config_architectures(folder):
        model = load_folder(
            make_draft, muse_glimmer.MuseGlimmerConfig, folder, dtype, device, {muse_glimmer.ARCHITECTURE},
            rename=muse_glimmer.dflash_name,
        )  # fmt: skip
    else:
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


def check_draft_folder(folder: str | Path) -> Path:
    """What `load_draft` would refuse before reading a weight: a folder or shipped name that is not there, a folder
    without config.json, another architecture, a config it cannot read (CheckpointError, its message as
    load_draft's) → the folder. Commands call it before loading the target, which takes far longer."""
    try:
        folder = shipped_or_folder(folder)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if not folder.exists():
        names = ", ".join(SHIPPED_NAMES)
        raise CheckpointError(f"no folder {folder} (a draft folder, or a shipped draft's name: {names})")
    if not (folder / "config.json").is_file():
        said = f"{folder} has no config.json" if folder.is_dir() else f"{folder} is a file, not a folder"
        raise CheckpointError(said)
    muse = muse_glimmer.ARCHITECTURE in config_architectures(folder)
    _check_architecture(folder, {muse_glimmer.ARCHITECTURE} if muse else set(DRAFT_ARCHITECTURES))
    try:
        (muse_glimmer.MuseGlimmerConfig if muse else DraftConfig).from_json(folder)
    except ConfigError as e:
        raise CheckpointConfigError(f"{folder / 'config.json'}: {e}") from None
    return folder


def check_block_size(folder: str | Path, block_size: int, flag: str = "--block-size") -> None:
    """A block size asked of the trained draft at `folder` (as check_draft_folder reads it): at most the block it was
    made for (its config's block_size), else a ValueError naming `flag` and the draft's block size. The draft's
    attention runs any block, so a larger one ran silently: its positions past the trained block were never trained,
    and what a run of them measures is not the draft's. `evaluate --block-size` measures them on purpose, and says
    so."""
    folder = Path(folder)
    muse = muse_glimmer.ARCHITECTURE in config_architectures(folder)
    made_for = (muse_glimmer.MuseGlimmerConfig if muse else DraftConfig).from_json(folder).block_size
    if block_size > made_for:
        raise ValueError(
            f"{flag} {block_size}: the draft {folder} was made for blocks of {made_for} (its config's block_size), "
            f"and positions past them were never trained; give at most {made_for}, or leave it out "
            "(evaluate --block-size measures untrained positions on purpose)"
        )


def draft_option(name: str | Path | None, flag: str = "--draft") -> Path:
    """--draft as a command takes it → its folder (shipped.draft_folder: None is the default shipped draft), checked
    as load_draft checks it before reading a weight (check_draft_folder): a ValueError naming `flag`, for a command
    to refuse as a usage error before it loads its target."""
    folder = draft_folder(name, flag)
    if name is not None:
        try:
            check_draft_folder(folder)
        except CheckpointError as e:
            raise ValueError(f"{flag} {e}") from None
    return folder


def save_draft(model: DFlashDraftModel, folder: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write config.json + model.safetensors in the official draft format, and draft_vocab.json
    beside them if the draft has a draft vocabulary (a stale one is removed if it has none)."""
    save_folder(model, folder, dtype)
    if getattr(model, "draft_vocab", None) is not None:
        save_draft_vocab(check_draft_vocab(model.draft_vocab, model.config.vocab_size), folder)
    else:
        (Path(folder) / DRAFT_VOCAB_FILE).unlink(missing_ok=True)


def save_muse_glimmer(model: DFlashDraftModel, folder: str | Path, dtype: torch.dtype | None = None) -> None:
    """Write a DFlash 1 draft as a Muse Glimmer assistant's folder (config.json + model.safetensors, Muse's names),
    the drafter transformers' own DFlash loads; a ConfigError names what Muse cannot say (muse_glimmer.py)."""
    config = muse_glimmer.muse_config(model.config)
    state = {
        muse_glimmer.muse_name(k): v.detach().to(dtype or v.dtype).contiguous().cpu()
        for k, v in model.state_dict().items()
    }
    config["dtype"] = str(next(iter(state.values())).dtype).removeprefix("torch.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_safetensors(state, folder / SINGLE, metadata={"format": "pt"})
