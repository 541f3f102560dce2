"""The drafts shipped with the package and the names the commands take for them (`--draft shipped:dflash1`,
`train --init shipped:dflash2`). No torch here, so that an option naming one is checked before anything loads."""

from __future__ import annotations

from pathlib import Path

# the drafts trained for SmolLM2 by `python -m dflash_ref train` (figures/training/README.md), official format, bf16
SHIPPED_DFLASH1 = Path(__file__).parent / "smollm2"
SHIPPED_DFLASH2 = Path(__file__).parent / "smollm2_dflash2"
SHIPPED_DRAFT = SHIPPED_DFLASH2  # what a command without --draft uses for SmolLM2
# every draft shipped for SmolLM2, the default first, by the label `bench trained` gives it
SHIPPED_DRAFTS = {"DFlash 2 (shipped)": SHIPPED_DFLASH2, "DFlash 1 (shipped)": SHIPPED_DFLASH1}
# what --draft takes for a shipped draft, in place of its folder
SHIPPED_NAMES = {"shipped:dflash2": SHIPPED_DFLASH2, "shipped:dflash1": SHIPPED_DFLASH1}


def draft_folder(name: str | Path | None, flag: str = "--draft") -> Path:
    """--draft as given → its folder: None is the default shipped draft, otherwise `shipped_or_folder(name)`;
    an unknown `shipped:` name is refused (ValueError), naming the ones there are, so that a command can refuse
    it before loading anything. `flag`: the option named in the refusal (`train --init` takes the same names)."""
    if name is None:
        return SHIPPED_DRAFT
    try:
        return shipped_or_folder(name)
    except ValueError as e:
        raise ValueError(f"{flag} {e}") from None


def shipped_or_folder(name: str | Path) -> Path:
    """A draft as `--draft` and `load_draft` take it → its folder: `shipped:dflash1` / `shipped:dflash2` a shipped
    one, anything else a folder; an unknown `shipped:` name is a ValueError naming the ones there are."""
    if str(name).startswith("shipped:"):
        if str(name) not in SHIPPED_NAMES:
            raise ValueError(f"{name}: no shipped draft of that name (there are {', '.join(SHIPPED_NAMES)})")
        return SHIPPED_NAMES[str(name)]
    return Path(name)
