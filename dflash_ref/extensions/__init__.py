"""Extensions: options neither the paper nor the official code has, each off unless asked for.

Three plug into the decoding loop through its one seam (decoding.py: an extension wraps stage 2,
the proposal), each lossless: a draft vocabulary (draft_vocab.py), a confidence-gated verify
(verify_gate.py), prompt lookup beside the draft (prompt_lookup.py). The speed path for the CPU is
another mechanism, switched on per model, in its own subpackage (dflash_ref/fast_cpu/).
"""

from __future__ import annotations

import os
from pathlib import Path

from .draft_vocab import DraftVocab, draft_vocab_of
from .prompt_lookup import PromptLookup
from .verify_gate import VerifyGate

__all__ = ["DraftVocab", "PromptLookup", "VerifyGate", "cache_folder", "chosen_extensions"]


def cache_folder() -> Path:
    """Where the package keeps what it makes once per machine (the fast CPU path's compiled product and
    plans, SmolLM2 converted from its GGUF): $DFLASH_REF_CACHE, else $XDG_CACHE_HOME/dflash_ref, else
    ~/.cache/dflash_ref."""
    if os.environ.get("DFLASH_REF_CACHE"):
        return Path(os.environ["DFLASH_REF_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dflash_ref"


def chosen_extensions(draft, target, verify_gate: float | None = None, lookup: int | None = None) -> list:
    """The decoding extensions the commands pass to spec_generate: the draft's own vocabulary where its
    folder declares one, the verify gate θ and prompt lookup N where asked for (None: off). Applied in
    this order, prompt lookup outermost: a step it answers has no draft pass to restrict or gate."""
    chosen = draft_vocab_of(draft, target)
    if verify_gate is not None:
        chosen.append(VerifyGate(verify_gate))
    if lookup is not None:
        chosen.append(PromptLookup(lookup))
    return chosen
