"""A training run's checkpoint (`train --resume`): the draft (official format, fp32), AdamW's moments and
state.json, written so that a resumed run continues exactly as an uninterrupted one would.

    out/draft/                  config.json, model.safetensors, draft_vocab.json
    out/optimizer.safetensors   AdamW's exp_avg and exp_avg_sq per draft parameter
    out/state.json              step, warmup steps, elapsed seconds, losses, the batch generator's state,
                                the draft's errors found for --replay (training/replay.py), and the
                                SHA-256 of the two weight files it belongs with

Each file is written whole under a temporary name and renamed; state.json goes last, so a run stopped
while saving leaves a state.json whose hashes do not match, and its resume is refused by name. A
resume reads all three (`read_state`, `run_draft`, `read_moments`) before any distilling.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..compat import IncompatibleModels, check_pair
from ..drafts.checkpoint import load_draft, save_draft
from ..drafts.from_target import init_from_target
from ..drafts.random_draft import identity_convolutions_, random_draft
from ..extensions.draft_vocab import FILE as DRAFT_VOCAB_FILE
from ..layer_sampling import build_target_layer_ids
from ..target.checkpoint import CheckpointError, save_safetensors
from .dflash2_modules import freeze_convolutions_
from .dflash2_options import draft_fields
from .init_draft import config_shape, init_folder

HASHED = ("draft/model.safetensors", "optimizer.safetensors")  # the files state.json records digests of
GENERATOR_STATE_BYTES = torch.Generator().get_state().numel()


def save_state(
    out: Path,
    draft,
    optimizer,
    generator: torch.Generator,
    step: int,
    warmup_steps: int,
    losses: list[float],
    seconds: float,
    errors: dict[int, list[int]] | None = None,
) -> None:
    """The checkpoint: the draft, AdamW's moments, and state.json (step, warmup, the generator's state,
    losses, --replay's errors), each file written whole under a temporary name and then renamed, state.json last; it
    records the SHA-256 of the other two, so a run stopped between the renames is caught on resume."""
    staging = out / "draft.saving"
    save_draft(draft, staging)
    names = {id(p): n for n, p in draft.named_parameters()}
    moments = {
        f"{names[id(p)]}.{k}": v.contiguous()
        for group in optimizer.param_groups
        for p in group["params"]
        for k, v in optimizer.state.get(p, {}).items()
        if k in ("exp_avg", "exp_avg_sq")
    }
    save_safetensors(moments, out / "optimizer.safetensors.saving")
    draft_file, optimizer_file = HASHED  # the digests of what is about to be renamed
    digests = {
        draft_file: _sha256(staging / "model.safetensors"),  # into place
        optimizer_file: _sha256(out / "optimizer.safetensors.saving"),
    }
    (out / "draft").mkdir(exist_ok=True)
    (out / "draft" / DRAFT_VOCAB_FILE).unlink(missing_ok=True)  # as save_draft: none left from before
    for f in sorted(staging.iterdir()):
        os.replace(f, out / "draft" / f.name)
    staging.rmdir()
    os.replace(out / "optimizer.safetensors.saving", out / "optimizer.safetensors")
    state = {
        "step": step,
        "warmup_steps": warmup_steps,
        "seconds": seconds,
        "losses": losses,
        "generator": base64.b64encode(bytes(generator.get_state().tolist())).decode("ascii"),
        "replay_errors": {str(i): anchors for i, anchors in (errors or {}).items()},
        "sha256": digests,
    }
    (out / "state.json.saving").write_text(json.dumps(state) + "\n")
    os.replace(out / "state.json.saving", out / "state.json")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_state(out: Path) -> dict:
    """state.json, checked before any work (training/driver.py calls it before distilling): its fields have
    the types `save_state` writes, the checkpoint's files are there, and they are the files it was
    saved with (runs from before the hashes record none). Anything else is refused by name."""
    path = out / "state.json"

    def refuse(problem: str) -> SystemExit:
        return SystemExit(
            f"--resume: {path} {problem}; the checkpoint cannot be continued (start again in "
            f"another --out; its data.jsonl can be copied)"
        )

    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise refuse(f"cannot be read as JSON ({e})") from None
    if not isinstance(state, dict):
        raise refuse("is not a JSON object")
    for key, ok, what in (
        ("step", lambda v: _whole(v) and v >= 0, "a whole number ≥ 0"),
        ("warmup_steps", lambda v: _whole(v) and v >= 1, "a whole number ≥ 1"),
        ("seconds", lambda v: _number(v) and v >= 0, "a number of seconds ≥ 0"),
        ("losses", lambda v: isinstance(v, list) and all(_number(x) for x in v), "a list of numbers"),
        ("generator", _generator_state, f"a generator state ({GENERATOR_STATE_BYTES} bytes in base64)"),
        ("replay_errors", _errors, "an object of sequence index → list of anchors"),
        (
            "sha256",
            lambda v: isinstance(v, dict) and set(v) <= set(HASHED) and all(isinstance(d, str) for d in v.values()),
            f"an object of SHA-256 digests of {list(HASHED)}",
        ),
    ):
        if key in state and not ok(state[key]):
            if key == "losses" and isinstance(state[key], list):
                i = next(i for i, x in enumerate(state[key]) if not _number(x))
                raise refuse(f"has losses[{i}] = {_short(state[key][i])}, not a number")
            raise refuse(f"has {key} = {_short(state[key])}, not {what}")
    for key in ("step", "losses"):  # every state.json ever written holds these two
        if key not in state:
            raise refuse(f"holds no {key}")
    for name in ("draft/config.json", *HASHED):
        if not (out / name).is_file():
            raise refuse(f"belongs with {out / name}, which is missing")
    for name, digest in state.get("sha256", {}).items():
        if _sha256(out / name) != digest:
            raise SystemExit(
                f"--resume: {out / name} is not the file {path} was saved with (step "
                f"{state['step']}): the run was stopped while saving its checkpoint, which cannot be "
                f"continued exactly; start again in another --out (its data.jsonl can be copied)"
            )
    return state


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # not NaN


def _errors(v) -> bool:
    return isinstance(v, dict) and all(
        k.isdigit() and isinstance(a, list) and all(_whole(x) and x >= 0 for x in a) for k, a in v.items()
    )


def replay_errors(state: dict) -> dict[int, list[int]]:
    """--replay's errors as the checkpoint left them ({} for a fresh run or one from before them)."""
    return {int(i): anchors for i, anchors in state.get("replay_errors", {}).items()}


def _generator_state(v) -> bool:
    try:
        return isinstance(v, str) and len(base64.b64decode(v, validate=True)) == GENERATOR_STATE_BYTES
    except ValueError:  # binascii.Error: not base64
        return False


def _short(v) -> str:
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def run_draft(out: Path, args, chat):
    """The draft to train: the checkpoint's on a resume (checked against the options: a run from before
    train_config.json is held to its draft's layers and block size), the trained draft --init names
    (init_draft.py), else a new one, random or with --init target the target's last layers (chat:
    target/chat.ChatTarget). Whatever cannot be made is refused by name."""
    target = chat.model
    if args.resume:
        draft = _trained_draft(out / "draft", "--resume", chat)
        found = config_shape(draft.config)
        wrong = [f"{k} {v} (asked {getattr(args, k)})" for k, v in found.items() if v != getattr(args, k)]
        if wrong:  # a run from before train_config.json, resumed with other options
            raise SystemExit(f"--resume: the draft in {out / 'draft'} has {', '.join(wrong)}")
        return _modules(draft, args)
    init = init_folder(args.init)
    if init is not None:  # a trained draft, whose shape options.resolve made the run's
        return _modules(_trained_draft(init, f"--init {args.init}", chat), args)
    if args.init == "target" and args.layers > target.config.num_hidden_layers:
        raise SystemExit(
            f"--init target copies the target's last --layers {args.layers} layers, but {chat.label} has "
            f"{target.config.num_hidden_layers}"
        )
    fields = draft_fields(vars(args))
    sizes = "".join(f" --{k.replace('_', '-')} {v}" for k, v in fields.items())  # DFlash 2's, if any
    distinct = target.config.num_hidden_layers - 3  # ids 1 … L − 3 (layer_sampling.py), for more than one
    if args.target_layers > max(distinct, 1):
        raise SystemExit(
            f"--target-layers {args.target_layers}: {chat.label}'s {target.config.num_hidden_layers} "
            f"layers give at most {max(distinct, 1)} distinct evenly spaced ones"
        )
    fields["target_layer_ids"] = build_target_layer_ids(target.config.num_hidden_layers, args.target_layers)
    try:  # e.g. more layers than the target has, or a DFlash 2 size its widths refuse (config.py)
        draft = random_draft(target, args.layers, args.block_size, chat.mask_token_id, args.seed, **fields)
    except ValueError as e:
        raise SystemExit(f"--layers {args.layers}{sizes}: {e}") from None
    identity_convolutions_(draft)  # DFlash 2: each layer starts as the DFlash 1 layer of its weights
    if args.init == "target":
        try:
            init_from_target(draft, target)
        except ValueError as e:
            raise SystemExit(f"--layers {args.layers} --init target: {e}") from None
    return _modules(draft, args)


def _trained_draft(folder: Path, flag: str, chat):
    """A trained draft to go on training, in fp32 (a shipped one is bf16), refused by `flag` if it cannot be
    loaded or does not fit the target (a run made for another target)."""
    try:
        draft = load_draft(folder, torch.float32)
    except CheckpointError as e:
        raise SystemExit(f"{flag}: {e}") from None
    try:
        check_pair(draft, chat.model)
    except IncompatibleModels as e:
        raise SystemExit(f"{flag}: the draft in {folder} does not fit {chat.label}: {e}") from None
    return draft


def _modules(draft, args):
    """`--modules selector`: the convolutions kept as they are (the identity: dflash2_modules.py)."""
    if getattr(args, "modules", "both") == "selector":
        freeze_convolutions_(draft)
    return draft


def read_moments(out: Path, draft) -> dict[str, torch.Tensor]:
    """optimizer.safetensors, checked against the draft it resumes (training/driver.py reads it before distilling):
    both AdamW moments of every trained draft parameter, in the parameter's shape; anything else is refused."""
    path = out / "optimizer.safetensors"
    try:
        moments = load_file(str(path))
    except SafetensorError as e:  # a damaged file, as target/checkpoint.py names one
        raise SystemExit(f"--resume: {path} is not a readable safetensors file ({e})") from None
    wrong = [
        f"{name}.{k} "
        + (f"{tuple(moments[f'{name}.{k}'].shape)}, not {tuple(p.shape)}" if f"{name}.{k}" in moments else "missing")
        for name, p in draft.named_parameters()
        if p.requires_grad
        for k in ("exp_avg", "exp_avg_sq")
        if f"{name}.{k}" not in moments or moments[f"{name}.{k}"].shape != p.shape
    ]
    if wrong:
        raise SystemExit(
            f"--resume: {path} is not this draft's optimiser state: {', '.join(wrong[:4])}"
            f"{f' and {len(wrong) - 4} more' if len(wrong) > 4 else ''}"
        )
    return moments


def resume_optimizer(moments: dict[str, torch.Tensor], draft, optimizer, schedule, step: int) -> None:
    """AdamW's moments (`read_moments`) into the optimiser, and the schedule brought to `step`."""
    for name, p in draft.named_parameters():
        if not p.requires_grad:  # a module the run does not train (--modules)
            continue
        optimizer.state[p] = {
            "step": torch.tensor(float(step)),
            "exp_avg": moments[f"{name}.exp_avg"],
            "exp_avg_sq": moments[f"{name}.exp_avg_sq"],
        }
    with warnings.catch_warnings():  # fast-forwarding the schedule: no optimiser step is missing
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        for _ in range(step):
            schedule.step()


def batch_generator(state: dict, seed: int) -> torch.Generator:
    """The generator of batches, anchors and sampled tokens, where the checkpoint left it: a run stopped
    and resumed draws what an uninterrupted one would (runs from before: reseeded by the step)."""
    g = torch.Generator().manual_seed(seed + state["step"])
    if "generator" in state:
        g.set_state(torch.tensor(list(base64.b64decode(state["generator"])), dtype=torch.uint8))
    return g
