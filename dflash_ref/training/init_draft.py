"""`train --init DRAFT`: start from a trained draft instead of noise (`random`, the paper) or the target's last
layers (`target`): a folder in the official format, or `shipped:dflash1` / `shipped:dflash2`. That is
fine-tuning, and the start that on-policy error replay (training/replay.py) was described from.

A draft fixes the run's shape: its version, layers, target layers, block size and DFlash 2 sizes are read from its
config.json, and the command line may repeat them but not change them (a draft of 2 layers cannot be
trained as one of 4). Everything else (data, steps, learning rate, replay) is the run's own. The shape is
read, and refused, before any model is loaded; config.py (and with it torch) is imported only where --init
names a draft, so that `train --help` and the other options stay cheap.
"""

from __future__ import annotations

from pathlib import Path

from ..drafts.shipped import SHIPPED_NAMES, draft_folder
from .dflash2_options import DFLASH2_DEFAULTS

FRESH = ("random", "target")  # --init values that make a new draft (state.run_draft)


class InitDraftError(ValueError):
    """An --init that names no draft, or a draft the run's other options contradict; the message names it."""


def init_folder(init: str) -> Path | None:
    """--init → the draft folder it names, or None for a new draft (`random`, `target`)."""
    if init in FRESH:
        return None
    try:
        return draft_folder(init, "--init")
    except ValueError as e:  # an unknown shipped: name
        raise InitDraftError(str(e)) from None


def draft_shape(folder: Path) -> dict:
    """The options a draft folder fixes, from its config.json: version, layers, block size and (DFlash 2)
    its four sizes; a folder that holds no readable draft config is refused by name."""
    from ..config import DraftConfig  # torch, through layer_sampling: only for a draft
    from ..config_fields import ConfigError

    if not (folder / "config.json").is_file():
        raise InitDraftError(
            f"--init {folder}: "
            + (
                "no config.json there"
                if folder.is_dir()
                else "a file, not a folder"
                if folder.exists()
                else "no such folder"
            )
            + f"; --init takes {' or '.join(FRESH)}, a draft folder, or "
            + " / ".join(SHIPPED_NAMES)
        )
    try:
        config = DraftConfig.from_json(folder)
    except ConfigError as e:
        raise InitDraftError(f"--init {folder}: its config.json is not a draft's: {e}") from None
    return config_shape(config)


def config_shape(config) -> dict:
    """A DraftConfig → the run options it fixes (a DFlash 1 config's DFlash 2 sizes are None); also what
    state.run_draft holds a resumed checkpoint's draft to."""
    return {
        "version": config.version,
        "layers": config.num_hidden_layers,
        "block_size": config.block_size,
        "target_layers": len(config.target_layer_ids),
        **{k: getattr(config, k) for k in DFLASH2_DEFAULTS},
    }


def take_draft_shape(options: dict, requested: dict) -> dict:
    """A new run's options with --init DRAFT: the draft's shape where the run did not ask one, and a refusal
    naming every option asked otherwise. Other --init values leave the options as they are."""
    folder = init_folder(options["init"])
    if folder is None:
        return options
    shape = draft_shape(folder)
    wrong = [
        f"--{k.replace('_', '-')} {requested[k]} (the draft has {'none' if v is None else v})"
        for k, v in shape.items()
        if requested.get(k) is not None and requested[k] != v
    ]
    if wrong:
        raise InitDraftError(
            f"--init {options['init']}: the run asks {', '.join(wrong)}; a draft is trained in "
            f"its own shape: leave these out"
        )
    return {**options, **shape}
