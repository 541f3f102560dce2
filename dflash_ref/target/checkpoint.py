"""Checkpoints in the Hugging Face layout: `config.json` + `model.safetensors`, or shards listed in
`model.safetensors.index.json` (`{"weight_map": {name: shard file}}`). safetensors only: no pickle,
no remote code. Parameter names are the official ones, so the same folder loads here, in the
official `dflash` package and in transformers.

Loading builds the model on the `meta` device (no memory), then reads each shard straight onto
`device` in `dtype`, so no full float32 copy of a large model is ever held in host memory.
The own Qwen3 loads here (`load_qwen3_target`), the own Llama and Qwen3.5 through the same reader
(llama.py, qwen3_5_checkpoint.py), drafts too (drafts/checkpoint.py); `load_target` (loading/folder.py) reads a
folder's architecture and picks among them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ..config import ConfigError, Qwen3Config, TargetConfig
from .qwen3 import Qwen3Target

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


class CheckpointError(ValueError):
    """A checkpoint folder is missing files, or its tensors do not match the model."""


class CheckpointConfigError(CheckpointError, ConfigError):
    """A folder's config.json is invalid: a CheckpointError (the commands catch it) naming the file,
    and still the ConfigError it was."""


def resolve_dtype(dtype: str | torch.dtype | None, config: Qwen3Config) -> torch.dtype:
    if dtype is None or dtype == "auto":
        dtype = config.dtype or "float32"
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def check_device(device: str | torch.device, dtype: torch.dtype) -> torch.device:
    """The device exists here and can compute in `dtype`, or a clear error."""
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise CheckpointError(f"unknown device {device!r}: {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CheckpointError(
                f"device {device} asked for, but this torch has no usable CUDA device "
                f"(torch {torch.__version__}); use device='cpu'"
            )
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise CheckpointError(
                f"{torch.cuda.get_device_name(device)} cannot compute in bfloat16; use dtype float16 or float32"
            )
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise CheckpointError(
                f"device {device} asked for, but this torch has no usable MPS device "
                f"(torch {torch.__version__}); use device='cpu'"
            )
    elif device.type != "cpu":
        raise CheckpointError(f"device type {device.type!r} is not supported (cpu, cuda, mps)")
    elif device.index not in (None, 0):
        raise CheckpointError(f"device {device}: the CPU is one device, 'cpu' (or 'cpu:0')")
    else:
        device = torch.device("cpu")  # cpu:0 is the CPU; safetensors takes only "cpu"
    return device


def _weight_map(path: Path) -> dict[str, str]:
    """model.safetensors.index.json → its weight_map {tensor name: shard file}."""
    try:
        index = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        index = None
    if not isinstance(index, dict):
        raise CheckpointError(f"{path} is not a JSON object with a weight_map")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path} has no weight_map")
    if not all(isinstance(shard, str) for shard in weight_map.values()):
        raise CheckpointError(f"{path} is not a JSON object with a weight_map (of tensor name → shard file name)")
    return weight_map


def _shards(folder: Path) -> dict[str, list[str]]:
    """shard file → tensor names in it."""
    if (folder / INDEX).is_file():
        weight_map = _weight_map(folder / INDEX)
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise CheckpointError(f"{folder}: shard files listed in {INDEX} are missing: {missing}")
        return shards
    if (folder / SINGLE).is_file():
        return {SINGLE: None}
    found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if any(n.endswith((".bin", ".pt", ".pth", ".ckpt")) for n in found):
        raise CheckpointError(f"{folder} holds pickle weights ({found}); only safetensors are read")
    raise CheckpointError(f"{folder} has neither {SINGLE} nor {INDEX} (found: {found or 'nothing'})")


def read_config(folder: Path) -> dict:
    """folder/config.json as a dict, or a CheckpointError naming the file."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not a JSON object (not valid JSON: {e})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object (a {type(config).__name__})")
    return config


def config_architectures(folder: Path) -> list[str]:
    """The `architectures` named in folder/config.json ([] if none), or a CheckpointError naming the file."""
    path = folder / "config.json"
    archs = read_config(folder).get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(f"{path}: 'architectures' must be a list of class names, got {archs!r}")
    return archs


def _check_architecture(folder: Path, expected: set[str]) -> None:
    archs = config_architectures(folder)
    if archs and not set(archs) & expected:
        raise CheckpointError(f"{folder}: architectures {archs} is not one of {sorted(expected)}")


def _read_shard(path: Path, dtype: torch.dtype, device: str | torch.device, rename=None) -> dict[str, torch.Tensor]:
    """One safetensors file's tensors, in `dtype` on `device`, under rename's names (those it maps to
    None are not read); a damaged file is named."""
    rename = rename or (lambda name: name)
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            stored = {rename(name): f.get_tensor(name) for name in f.keys() if rename(name) is not None}
    except SafetensorError as e:
        reason = str(e).removeprefix("Error while deserializing header: ")
        raise CheckpointError(f"{path} is not a readable safetensors file ({reason})") from None
    whole = sorted(f"{name} ({t.dtype})" for name, t in stored.items() if not t.is_floating_point())
    if whole:  # not weights this model can compute with; a cast would hide it
        raise CheckpointError(f"{path} holds tensors that are not floating point: {whole}")
    return {name: t.to(dtype) for name, t in stored.items()}


def load_weights(model: nn.Module, folder: Path, dtype: torch.dtype, device: str | torch.device, rename=None) -> None:
    """Fill a meta-device model from the folder's safetensors, listing missing/unexpected names.
    `rename(stored name)` → the model's name, or None for a tensor the model does not use (identity if None)."""
    expected = dict(model.state_dict(keep_vars=True))
    tied = getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" in expected
    state: dict[str, torch.Tensor] = {}
    for shard in _shards(folder):
        state.update(_read_shard(folder / shard, dtype, device, rename))
    if tied:
        state.pop("lm_head.weight", None)
        expected.pop("lm_head.weight")
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}: tensors do not match the model. missing: {missing or 'none'}; "
            f"unexpected: {unexpected or 'none'}"
        )
    wrong = [
        f"{n}: file {tuple(state[n].shape)} vs model {tuple(expected[n].shape)}"
        for n in expected
        if state[n].shape != expected[n].shape
    ]
    if wrong:
        raise CheckpointError(f"{folder}: tensor shapes do not match the config: {wrong}")
    model.load_state_dict(state, assign=True, strict=not tied)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight


def load_folder(cls, config_cls, folder, dtype, device, architectures: set[str], rename=None):
    """A folder of this layout → `cls(config_cls.from_json(folder))` with its weights (names mapped by
    `rename`, see load_weights), in eval mode; every problem (no folder, another architecture, a bad
    config, missing tensors) a CheckpointError."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"{folder} is a file, not a folder")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} has no config.json" if folder.is_dir() else f"no folder {folder}")
    _check_architecture(folder, architectures)
    try:
        config = config_cls.from_json(folder)
    except ConfigError as e:
        raise CheckpointConfigError(f"{folder / 'config.json'}: {e}") from None
    dtype = resolve_dtype(dtype, config)
    device = check_device(device, dtype)
    with torch.device("meta"):
        model = cls(config)
    load_weights(model, folder, dtype, device, rename)
    return model.eval()


def load_qwen3_target(folder: str | Path, dtype=None, device: str | torch.device = "cpu") -> Qwen3Target:
    """A transformers Qwen3ForCausalLM folder → the project's own Qwen3Target."""
    return load_folder(Qwen3Target, TargetConfig, folder, dtype, device, {"Qwen3ForCausalLM"})


def save_folder(model: nn.Module, folder: str | Path, dtype) -> None:
    """config.json (with the saved dtype) + model.safetensors; a tied lm_head is not stored."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    saved_dtype = next(iter(state.values())).dtype
    config = model.config.to_dict()
    config["dtype"] = str(saved_dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_safetensors(state, folder / SINGLE, metadata={"format": "pt"})


def save_safetensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict | None = None) -> None:
    """safetensors' save_file, the file then given the mode any other file written here gets (0644 under the usual
    umask 022): save_file makes it 0600, as if weights were secret, and a bundle or a trace shared with others
    would be unreadable to them. Every safetensors file the package writes goes through here."""
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    """The process's umask (reading it means setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_target(model: Qwen3Target, folder: str | Path, dtype: torch.dtype | None = None) -> None:
    save_folder(model, folder, dtype)
