"""`train --version 2`: the four sizes of a DFlash 2 draft (config.py's DFLASH2_FIELDS), their defaults
for a target of SmolLM2's widths, and the checks that refuse a size before anything is loaded.

    --conv-kernel-size K   taps of each dynamic convolution          y_t = Σ_{j<K} (w_j + a_{t,j,g}) ⊙ x_{t−j}
    --conv-group-size      channels sharing one dynamic tap a_{t,j,g}; must divide the hidden size d
    --selector-rank r      width of the selector's codebooks E_pred, E_succ (V, r) and of P (r, d)
    --selector-top-k K     candidates per proposal position; at most V
    --modules              both (default), conv or selector: the modules a run trains (MODULES)

A DFlash 1 run (`--version 1`, the default) takes none of them (each stays null in train_config.json); a
DFlash 2 run fills the ones not given with DFLASH2_DEFAULTS, so that its train_config.json holds the
sizes it was trained with and `--resume` is held to them. No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path

VERSIONS = (1, 2)
# which of DFlash 2's two modules a run trains (the levers of figures/training/levers.md): both; the
# convolutions only (the selector learns beside them from detached inputs, and the run's evaluation
# proposes by the argmax of the logits); the selector only (the convolutions stay the identity)
MODULES = ("both", "conv", "selector")
# SmolLM2-135M: d = 576, V = 49152. K = 3 (the walkthrough's) reaches two positions back inside a block
# of 4; 16 channels a group (the released Muse-Glimmer-30B's) gives 36 groups; r = 32 keeps the two
# codebooks (2 · 49152 · 32 = 3.1 M weights) below the draft's layers; 8 candidates for 3 proposals
DFLASH2_DEFAULTS = {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 32, "selector_top_k": 8}
SMOLLM2_WIDTHS = (576, 49152)  # hidden size, vocabulary (loading/smollm2.py's model; the GGUF holds them)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def fill_dflash2(options: dict) -> dict:
    """A DFlash 2 run's sizes not given → their defaults; a DFlash 1 run's left as given (null), for
    `check_dflash2` to refuse any that was."""
    if options["version"] == 2:
        options.update({k: v if options[k] is None else options[k] for k, v in DFLASH2_DEFAULTS.items()})
    return options


def check_dflash2(options: dict, widths: tuple[int, int] | None) -> None:
    """ValueError naming the option: a DFlash 2 size given to a DFlash 1 run, a size below 1, a group size
    that does not divide the target's hidden size, more candidates than its vocabulary. `widths`: the
    target's (hidden size, vocabulary), or None where they are not known before loading it (then the
    draft's own config refuses them once it is built: state.run_draft)."""
    if options["version"] not in VERSIONS:
        raise ValueError(f"--version must be one of {list(VERSIONS)}, got {options['version']!r}")
    given = [_flag(k) for k in DFLASH2_DEFAULTS if options[k] is not None]
    if options.get("modules", "both") != "both":
        given.append(f"--modules {options['modules']}")
    if options["version"] == 1:
        if given:
            raise ValueError(f"{', '.join(given)}: DFlash 2 options, for a --version 2 draft (this run is --version 1)")
        return
    for key in DFLASH2_DEFAULTS:
        if options[key] < 1:
            raise ValueError(f"{_flag(key)} must be at least 1, got {options[key]}")
    if widths is None:
        return
    hidden, vocab = widths
    if hidden % options["conv_group_size"]:
        divisors = [g for g in range(1, hidden + 1) if hidden % g == 0]
        raise ValueError(
            f"--conv-group-size {options['conv_group_size']} does not divide the target's hidden size "
            f"{hidden}; one of {divisors}"
        )
    if options["selector_top_k"] > vocab:
        raise ValueError(f"--selector-top-k {options['selector_top_k']} exceeds the target's vocabulary of {vocab}")


def target_widths(target: str) -> tuple[int, int] | None:
    """(hidden size, vocabulary) of `smollm2` or of a folder's config.json (its text_config's where it
    has one), read without loading the model; None where the file does not give both as numbers."""
    if target == "smollm2":
        return SMOLLM2_WIDTHS
    try:
        config = json.loads((Path(target) / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(config, dict) and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # a multimodal folder: its language model's
    widths = (config.get("hidden_size"), config.get("vocab_size")) if isinstance(config, dict) else (None, None)
    return widths if all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths) else None


def draft_fields(options: dict) -> dict:
    """The config fields `random_draft` takes for the run's version: none for DFlash 1."""
    return {} if options["version"] == 1 else {"version": 2, **{k: options[k] for k in DFLASH2_DEFAULTS}}
