"""The sets of prompts written here, by name: what `train --prompt-set` trains on and what
`evaluate --sets SPLIT:START:COUNT` measures on.

    train            prompts.prompts("train"): 12 templates × 595 topics (7140)      train --prompt-set templates
    heldout          prompts.prompts("heldout"): the templates × 12 held-out topics (144)
    varied           varied_prompts.varied_prompts(): 48 styles × 595 topics (28560)  train --prompt-set varied
    mixed            train and varied taken in turn, then the rest of varied (35700)  train --prompt-set mixed
    heldout-styles   heldout_styles.heldout_styles(): 48 hand-written, in 12 styles no training prompt has

No torch here.
"""

from __future__ import annotations

from .heldout_styles import heldout_styles, style_of_heldout
from .prompts import prompts, template_of
from .varied_prompts import style_of, varied_prompts

PROMPT_SETS = {"templates": "train", "varied": "varied", "mixed": "mixed"}  # train --prompt-set → its split
SPLITS = ("train", "heldout", "varied", "mixed", "heldout-styles")


def split_prompts(split: str) -> list[str]:
    """All the prompts of a split written here (ValueError for another name)."""
    if split in ("train", "heldout"):
        return prompts(split)
    if split == "varied":
        return varied_prompts()
    if split == "mixed":
        return mixed_prompts()
    if split == "heldout-styles":
        return heldout_styles()
    raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")


def mixed_prompts() -> list[str]:
    """The template prompts and the varied ones in turn (train[0], varied[0], train[1], …), then the varied
    prompts left: any first 2n are n of each, and each half keeps its own spread over topics and styles."""
    templates, varied = prompts("train"), varied_prompts()
    return [p for pair in zip(templates, varied) for p in pair] + varied[len(templates) :]


def kind_of(prompt: str) -> str:
    """The template ("What is {t}?") or the style ("haiku") a prompt written here was made from."""
    for name_of in (template_of, style_of, style_of_heldout):
        try:
            return name_of(prompt)
        except ValueError:
            pass
    raise ValueError(f"{prompt[:60]!r} is none of the prompts written here (training/prompt_sets.py)")
