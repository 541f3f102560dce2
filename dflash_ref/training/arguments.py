"""The command line of `python -m dflash_ref train`: one argument per option of options.DEFAULTS, each
defaulting to None so that what was given can be told from what was not (options.resolve fills the
rest). No torch here, so that `--help` and a usage error stay cheap.
"""

from __future__ import annotations

import argparse

from .dflash2_options import DFLASH2_DEFAULTS, VERSIONS
from .options import CHOICES, CONFIG_NAME, DEFAULTS


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    """The `train` subcommand's arguments."""

    def option(name: str, help: str = "", **kw) -> None:
        key = name.replace("-", "_")
        shown = "" if DEFAULTS[key] is None or isinstance(DEFAULTS[key], bool) else f" (default: {DEFAULTS[key]})"
        p.add_argument(f"--{name}", default=None, help=(help + shown).strip(), **kw)

    p.add_argument("--out", required=True, help="folder for data, checkpoints, state and plots")
    p.add_argument(
        "--config",
        help='a JSON file of options ({"layers": 4, "steps": 5600, …}; the names of '
        "these options); options on the command line win over it",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"continue the run in --out from its checkpoint, with the options in its {CONFIG_NAME}",
    )
    option(
        "target",
        "the chat model to distil from and train for: smollm2, or a Hugging Face causal LM folder "
        "with a tokenizer and chat template (loading/chat.py)",
    )
    option(
        "version",
        "1: a DFlash draft; 2: a DFlash 2 draft (dynamic convolutions and a candidate selector: "
        "training/dflash2_options.py)",
        type=int,
        choices=VERSIONS,
    )
    for key, what in (
        ("conv_kernel_size", "taps K of each dynamic convolution"),
        ("conv_group_size", "channels per dynamic tap, dividing the hidden size"),
        ("selector_rank", "rank r of the selector's codebooks"),
        ("selector_top_k", "candidates per proposal position"),
    ):
        option(key.replace("_", "-"), f"--version 2: {what} (default: {DFLASH2_DEFAULTS[key]})", type=int)
    option(
        "modules",
        "--version 2: the modules trained: both, conv (the convolutions; proposals by the "
        "argmax in the run's evaluation) or selector (the convolutions stay the identity)",
        choices=CHOICES["modules"],
    )
    option("layers", "draft layers", type=int)
    option(
        "target-layers",
        "target layers the draft's context is read from, evenly spaced "
        "(build_target_layer_ids; default: as many as --layers, the official drafts' rule)",
        type=int,
    )
    option("block-size", "block size b", type=int)
    option(
        "gamma",
        "loss decay γ (default: the paper's for blocks 8, 10, 16; 4 for block 4, ours); "
        "`--gamma default` undoes a --config's number",
        type=_gamma,
    )
    option("steps", "optimiser steps in all (a resumed run may raise it)", type=int)
    option("lr", "peak learning rate", type=float)
    option("batch", "sequences per optimiser step", type=int)
    option("anchors", "blocks per sequence in one pass", type=int)
    option(
        "full-vocab",
        "the loss's softmax over all V (the paper), not estimated (training/recipe.py); "
        "--no-full-vocab undoes a --config's true",
        action=argparse.BooleanOptionalAction,
    )
    option("negatives", "tokens sampled per step beside the responses' for the softmax estimate", type=int)
    option(
        "prompt-set",
        "the training prompts written here: templates (12 templates × 595 topics, 7140), "
        "varied (48 styles × 595 topics, 28560: training/varied_prompts.py) or mixed (the two "
        "in turn: training/prompt_sets.py)",
        choices=CHOICES["prompt_set"],
    )
    option("prompts", "distil the first N training prompts (of the --prompt-set; all of a --prompts-file)", type=int)
    option(
        "prompts-file",
        "training prompts of your own: .txt (one a line) or .jsonl (prompt, messages or "
        "conversations; training/prompt_file.py)",
    )
    option("heldout-file", "held-out prompts of your own for the final evaluation, as --prompts-file")
    option("max-new-tokens", "longest response distilled", type=int)
    option("distill-batch", "prompts per generate() call", type=int)
    option(
        "distill-dtype",
        "the target copy that writes the responses (features always come from fp32); auto: "
        "bf16 where the CPU has bf16 instructions, else fp32 (training/precision.py)",
        choices=CHOICES["distill_dtype"],
    )
    option(
        "train-dtype",
        "bf16: mixed precision, the forward under bf16 autocast, weights and AdamW fp32 "
        "(faster where the CPU has bf16 instructions); fp32: all fp32; auto: bf16 where the CPU "
        "has bf16 instructions, else fp32",
        choices=CHOICES["train_dtype"],
    )
    option(
        "init",
        "random: draft layers from noise (the paper); target: copied from the target's last layers; or "
        "a trained draft to go on from, a folder or shipped:dflash1 / shipped:dflash2 (its layers, block "
        "size and DFlash 2 sizes are the run's: training/init_draft.py)",
    )
    option(
        "replay",
        "on-policy error replay: the share of each batch's sequences drawn from the draft's own "
        "rejected blocks, at the anchors greedy decoding visits (training/replay.py; 0: off)",
        type=float,
    )
    option("replay-every", "--replay: steps between two searches for the draft's errors", type=int)
    option("replay-sequences", "--replay: training sequences searched each time", type=int)
    option(
        "soft-labels",
        "α: the loss is (1 − α) · cross-entropy on the target's greedy tokens + α · cross-entropy "
        "on its top-16 next-token distribution (training/soft_labels.py; 0: off, the paper's)",
        type=float,
    )
    option("save-every", "steps between checkpoints", type=int)
    option(
        "eval-prompts", "held-out prompts for the final evaluation (of a --heldout-file: up to 12 by default)", type=int
    )
    option(
        "eval-styles",
        "hand-written held-out prompts in styles no training prompt has, evaluated beside "
        "them (0: none; training/heldout_styles.py)",
        type=int,
    )
    option("eval-tokens", "tokens generated per held-out prompt", type=int)
    option("figures", "where training.png goes")
    option("seed", "seed of the draft's initialisation, the anchors and the batches", type=int)


def _gamma(text: str) -> float | str:
    """--gamma's value: a number, or `default` (the block size's own γ, as a config file's null)."""
    if text == "default":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number or 'default', got {text!r}") from None
