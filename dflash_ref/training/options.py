"""The options of `python -m dflash_ref train`: their defaults, a JSON config file (`--config`), the
copy every run keeps (`out/train_config.json`) and what `--resume` may change. No torch here, so
that building the command line stays cheap.

Where an option's value comes from, the later winning:

    DEFAULTS  <  out/train_config.json (with --resume)  <  --config FILE  <  the command line

A resumed run is the run that was started: options that shape the data, the draft or the
optimisation (everything but RESUME_MAY_CHANGE) must equal the saved ones, or nothing starts.
`--steps` may grow (the cosine schedule is then laid over the new total from the step reached).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from .dflash2_options import DFLASH2_DEFAULTS, MODULES, VERSIONS, check_dflash2, fill_dflash2
from .init_draft import FRESH, InitDraftError, take_draft_shape
from .precision import choose_dtypes
from .prompt_file import PROMPT_SETS, file_counts

CONFIG_NAME = "train_config.json"

DEFAULTS = {
    "version": 1,
    **dict.fromkeys(DFLASH2_DEFAULTS),
    "layers": 2,
    "block_size": 4,
    "gamma": None,
    "steps": 4400,
    "lr": 3e-3,
    "batch": 8,
    "anchors": 32,
    "full_vocab": False,
    "negatives": 4096,
    "prompt_set": "templates",
    "prompts": 1860,
    "max_new_tokens": 192,
    "distill_batch": 48,
    "distill_dtype": "auto",
    "train_dtype": "auto",
    "init": "random",
    "save_every": 500,
    "eval_prompts": 12,
    "eval_styles": 12,
    "eval_tokens": 128,
    "figures": "figures/training",
    "seed": 0,
    "target": "smollm2",
    "prompts_file": None,
    "heldout_file": None,
    "modules": "both",
    "replay": 0.0,
    "replay_every": 250,
    "replay_sequences": 64,
    "soft_labels": 0.0,
    "target_layers": None,
}
FILES = ("prompts_file", "heldout_file")  # None: the prompts written in prompts.py
PATHS = ("target", *FILES)  # kept as absolute paths (but the target "smollm2")
# None: a DFlash 1 run's, or the DFlash 2 default; target_layers: as many as --layers (the official rule)
NULLABLE = (*DFLASH2_DEFAULTS, "target_layers")
CHOICES = {
    "version": VERSIONS,
    "prompt_set": tuple(PROMPT_SETS),
    "distill_dtype": ("auto", "bf16", "fp32"),
    "train_dtype": ("auto", "bf16", "fp32"),
    "modules": MODULES,
}
# how long the run goes on, how often it saves, how it is evaluated and where its plot goes
RESUME_MAY_CHANGE = frozenset(
    {"steps", "save_every", "eval_prompts", "eval_styles", "eval_tokens", "figures", "heldout_file"}
)


class TrainOptionError(ValueError):
    """An option, a config file or a resume that cannot give a sound run; the message names it."""


def read_config_file(path: str | Path, role: str = "--config") -> dict:
    """A JSON object of options, keys as the option names (`block-size` or `block_size`); unknown
    keys and values of the wrong kind are refused, naming the file and the key. `role` says whose
    file it is in the messages (--config, or --resume for a run's own train_config.json)."""
    path = Path(path)
    if not path.is_file():
        raise TrainOptionError(f"{role}: no file {path}")
    pairs = []  # every key as written: json.loads would keep the last
    try:
        raw = json.loads(path.read_text(), object_pairs_hook=lambda kv: pairs.append(kv) or dict(kv))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TrainOptionError(f"{role} {path} is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise TrainOptionError(f"{role} {path} must hold a JSON object of options, not a {type(raw).__name__}")
    keys = [k for k, _ in pairs[-1]]  # the outermost object is the last one closed
    options = {str(k).replace("-", "_"): v for k, v in raw.items()}
    if len({k.replace("-", "_") for k in keys}) < len(keys):
        twice = sorted({k for k in keys if sum(j.replace("-", "_") == k.replace("-", "_") for j in keys) > 1})
        raise TrainOptionError(f"{role} {path}: an option given more than once: {twice}")
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise TrainOptionError(f"{role} {path}: unknown option(s) {unknown}; known: {sorted(DEFAULTS)}")
    for key, value in options.items():
        _check_kind(key, value, f"{role} {path}")
    return options


def _check_kind(key: str, value, where: str) -> None:
    default = DEFAULTS[key]
    if key in FILES:
        ok, kind = value is None or isinstance(value, str), "a file path or null"
    elif key in NULLABLE:
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
        kind = "a whole number or null"
    elif key == "gamma":
        ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))
        kind = "a number or null"
    elif isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "a whole number"
    elif isinstance(default, float):
        ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:
        ok, kind = isinstance(value, str), "a string"
    if not ok:
        raise TrainOptionError(f"{where}: {key} must be {kind}, got {value!r}")
    if key in CHOICES and value not in CHOICES[key]:
        raise TrainOptionError(f"{where}: {key} must be one of {list(CHOICES[key])}, got {value!r}")


def check_seed(seed: int, low: int = 0, high: int = 2**62) -> None:
    """--seed in [low, high): by default a seed torch's generators take with room for the training run's seed + step
    (generate passes torch's own range)."""
    if not low <= seed < high:
        raise TrainOptionError(f"--seed must lie in {low}…{high - 1}, got {seed}")


def check_values(
    options: dict,
    heldout_prompts: int,
    training_prompts: int,
    style_prompts: int,
    widths: tuple[int, int] | None = None,
) -> None:
    """Ranges that would otherwise fail deep in torch, divide by zero, or train on nothing. The counts:
    the prompts there are to take from (a --prompts-file's or --heldout-file's, else the written ones;
    the hand-written held-out styles'); widths: the target's (hidden size, vocabulary) if known, for the
    DFlash 2 sizes (dflash2_options.check_dflash2)."""

    def at_least(key: str, low: int) -> None:
        if options[key] < low:
            raise TrainOptionError(f"{flag(key)} must be at least {low}, got {options[key]}")

    for key in (
        "layers",
        "steps",
        "batch",
        "anchors",
        "distill_batch",
        "save_every",
        "replay_every",
        "replay_sequences",
    ):
        at_least(key, 1)
    if options["target_layers"] is not None:
        at_least("target_layers", 1)
    at_least("eval_tokens", 2)  # the first token is the prefill's; decode steps start at the second
    at_least("negatives", 0)
    try:
        check_dflash2(options, widths)
    except ValueError as e:
        raise TrainOptionError(str(e)) from None
    if options["prompts_file"] and options["prompt_set"] != DEFAULTS["prompt_set"]:
        raise TrainOptionError(
            f"--prompt-set {options['prompt_set']} chooses among the prompts written here; "
            f"--prompts-file {options['prompts_file']} replaces them: give one of the two"
        )
    if not 0 <= options["eval_styles"] <= style_prompts:
        raise TrainOptionError(
            f"--eval-styles must lie in 0…{style_prompts} (the hand-written held-out styles' "
            f"prompts), got {options['eval_styles']}"
        )
    check_seed(options["seed"])
    if not (math.isfinite(options["replay"]) and 0 <= options["replay"] <= 1):
        raise TrainOptionError(
            f"--replay is the share of a batch's sequences replayed, in 0…1, got {options['replay']}"
        )
    if not (math.isfinite(options["soft_labels"]) and 0 <= options["soft_labels"] <= 1):
        raise TrainOptionError(
            f"--soft-labels is the soft labels' share α of the loss, in 0…1, got {options['soft_labels']}"
        )
    if not (math.isfinite(options["lr"]) and options["lr"] > 0):
        raise TrainOptionError(f"--lr must be a positive number, got {options['lr']}")
    if options["gamma"] is not None and not (math.isfinite(options["gamma"]) and options["gamma"] > 0):
        raise TrainOptionError(f"--gamma must be a positive number, got {options['gamma']}")
    for key, count, written, given in (
        ("prompts", training_prompts, f"the {options['prompt_set']} training prompts written", "prompts_file"),
        ("eval_prompts", heldout_prompts, "the held-out prompts", "heldout_file"),
    ):
        if not 1 <= options[key] <= count:
            source = f"the prompts in {options[given]}" if options[given] else written
            raise TrainOptionError(f"{flag(key)} must lie in 1…{count} ({source}), got {options[key]}")
    if options["max_new_tokens"] < options["block_size"] + 1:
        # training/driver.py trains on responses of at least b + 1 tokens (it always has: the shipped draft's data
        # was chosen so); sample_anchors itself would take one of b
        raise TrainOptionError(
            f"--max-new-tokens {options['max_new_tokens']} leaves no response long enough "
            f"to train on with blocks of {options['block_size']} (training keeps responses of "
            f"at least block size + 1 = {options['block_size'] + 1} tokens)"
        )


def resolve(args: argparse.Namespace) -> dict:
    """The run's options: DEFAULTS, then (with --resume) the run's saved config, then --config, then
    what the command line gave. Refuses a resume of nothing, a resume that changes the run, and a
    fresh start over a folder that holds a run. Reads files only; writes nothing."""
    out = Path(args.out)
    given = {k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None}
    if given.get("gamma") == "default":
        given["gamma"] = None  # the block size's own γ, over a --config's (or a saved) number
    requested = {**(read_config_file(args.config) if args.config else {}), **given}
    for key in PATHS:  # absolute, so that a run resumes from any folder and `DIR/` is the same as `DIR`
        if requested.get(key) not in (None, DEFAULTS["target"]):
            requested[key] = os.path.abspath(requested[key])
    requested = choose_dtypes(requested)  # `auto` → what this CPU runs fast (precision.py)
    init = requested.get("init")
    if init is not None and init not in FRESH and not init.startswith("shipped:"):  # a draft folder
        requested["init"] = os.path.abspath(init)
    state = out / "state.json"
    if not args.resume:
        if state.is_file():
            step = _step(state)
            where = f"its {state.name}" if step is None else f"at step {step}"
            raise TrainOptionError(
                f"{out} already holds a training run ({where}); add --resume to "
                f"continue it, delete {state} to train again from step 0 on its data, or "
                f"choose another --out"
            )
        try:  # --init DRAFT: the draft's shape (init_draft.py)
            options = take_draft_shape({**DEFAULTS, **requested}, requested)
        except InitDraftError as e:
            raise TrainOptionError(str(e)) from None
        return fill_target_layers(
            fill_dflash2(file_counts(choose_dtypes(options), requested, False, DEFAULTS["eval_prompts"]))
        )
    if not state.is_file():
        raise TrainOptionError(
            f"--resume: {out} holds no training run to continue (no {state.name}); leave out --resume to start one"
        )
    step = _step(state)
    if step is None:
        raise TrainOptionError(
            f'--resume: {state} holds no step (a JSON object with "step"); the checkpoint cannot be continued'
        )
    saved_path = out / CONFIG_NAME
    # a run from before train_config.json has none: training/driver.py checks its draft's layers and block size
    held = saved_path.is_file()
    run = {**DEFAULTS, **(read_config_file(saved_path, "--resume") if held else {})}
    changed = [
        f"{flag(k)} (the run has {run[k]!r}, asked {v!r})"
        for k, v in sorted(requested.items())
        if held and k not in RESUME_MAY_CHANGE and v != run[k]
    ]
    if changed:
        raise TrainOptionError(
            f"--resume: {out} was started with other options: {'; '.join(changed)}. A resumed "
            f"run may change only {[flag(k) for k in sorted(RESUME_MAY_CHANGE)]}; choose "
            f"another --out for a new run"
        )
    options = fill_target_layers(
        fill_dflash2(file_counts(choose_dtypes({**run, **requested}), requested, True, DEFAULTS["eval_prompts"]))
    )
    if options["steps"] < step:
        raise TrainOptionError(f"--resume: {out} is at step {step}, past --steps {options['steps']}")
    return options


def fill_target_layers(options: dict) -> dict:
    """--target-layers not given (null, or a run from before the option) → as many as --layers: the official
    layer sampling, one target layer per draft layer (layer_sampling.py)."""
    if options["target_layers"] is None:
        options["target_layers"] = options["layers"]
    return options


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _step(state: Path) -> int | None:
    """The step a state.json records, or None if it records none."""
    try:
        step = json.loads(state.read_text())["step"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def save(out: Path, options: dict) -> Path:
    """Write the run's options to out/train_config.json (the file --resume and --config read)."""
    path = Path(out) / CONFIG_NAME
    path.write_text(json.dumps({k: options[k] for k in DEFAULTS}, indent=1) + "\n")
    return path
