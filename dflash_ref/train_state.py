"""A training run's checkpoint (`train --resume`): the draft (official format, fp32), AdamW's moments and
state.json, written so that a resumed run continues exactly as an uninterrupted one would.

    out/draft/                  config.json, model.safetensors, draft_vocab.json
    out/optimizer.safetensors   AdamW's exp_avg and exp_avg_sq per draft parameter
    out/state.json              step, warmup steps, elapsed seconds, losses, the batch generator's state,
                                and the SHA-256 of the two weight files it belongs with

Each file is written whole under a temporary name and renamed; state.json goes last, so a run stopped
while saving leaves a state.json whose hashes do not match, and its resume is refused by name.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .checkpoint import save_draft
from .draft_vocab import FILE as DRAFT_VOCAB_FILE


def save_state(out: Path, draft, optimizer, generator: torch.Generator, step: int, warmup_steps: int,
                losses: list[float], seconds: float) -> None:
    """The checkpoint: the draft, AdamW's moments, and state.json (step, warmup, the generator's state,
    losses), each file written whole under a temporary name and then renamed, state.json last; it
    records the SHA-256 of the other two, so a run stopped between the renames is caught on resume."""
    staging = out / "draft.saving"
    save_draft(draft, staging)
    names = {id(p): n for n, p in draft.named_parameters()}
    moments = {f"{names[id(p)]}.{k}": v.contiguous() for group in optimizer.param_groups for p in group["params"]
               for k, v in optimizer.state.get(p, {}).items() if k in ("exp_avg", "exp_avg_sq")}
    save_file(moments, str(out / "optimizer.safetensors.saving"))
    digests = {"draft/model.safetensors": _sha256(staging / "model.safetensors"),     # of what is about to be
               "optimizer.safetensors": _sha256(out / "optimizer.safetensors.saving")}  # renamed into place
    (out / "draft").mkdir(exist_ok=True)
    (out / "draft" / DRAFT_VOCAB_FILE).unlink(missing_ok=True)     # as save_draft: none left from before
    for f in sorted(staging.iterdir()):
        os.replace(f, out / "draft" / f.name)
    staging.rmdir()
    os.replace(out / "optimizer.safetensors.saving", out / "optimizer.safetensors")
    state = {"step": step, "warmup_steps": warmup_steps, "seconds": seconds, "losses": losses,
             "generator": base64.b64encode(bytes(generator.get_state().tolist())).decode("ascii"),
             "sha256": digests}
    (out / "state.json.saving").write_text(json.dumps(state) + "\n")
    os.replace(out / "state.json.saving", out / "state.json")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_state(out: Path) -> dict:
    """state.json, checked against the files it was written with (runs from before the check record none)."""
    state = json.loads((out / "state.json").read_text())
    for name, digest in state.get("sha256", {}).items():
        if not (out / name).is_file() or _sha256(out / name) != digest:
            raise SystemExit(f"--resume: {out / name} is not the file {out / 'state.json'} was saved with (step "
                             f"{state['step']}): the run was stopped while saving its checkpoint, which cannot be "
                             f"continued exactly; start again in another --out (its data.jsonl can be copied)")
    return state


def resume_optimizer(out: Path, draft, optimizer, schedule, step: int) -> None:
    """AdamW's moments from the checkpoint, and the schedule brought to `step`."""
    moments = load_file(str(out / "optimizer.safetensors"))
    for name, p in draft.named_parameters():
        if f"{name}.exp_avg" in moments:
            optimizer.state[p] = {"step": torch.tensor(float(step)),
                                  "exp_avg": moments[f"{name}.exp_avg"], "exp_avg_sq": moments[f"{name}.exp_avg_sq"]}
    with warnings.catch_warnings():      # fast-forwarding the schedule: no optimiser step is missing
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
