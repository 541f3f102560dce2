"""Loading a target folder: `load_target(folder)` reads a Hugging Face causal-LM folder's architecture
and returns the target that runs it, and `open_target` does the same for the commands (`--target DIR`),
with the folder's tokenizer.

    Qwen3ForCausalLM                      the own Qwen3 (qwen3.py, with hook points)
    LlamaForCausalLM                      the own Llama (llama.py); one it refuses (Llama 3's RoPE, biases)
                                          runs in transformers, with a warning that says why
    Qwen3.5 / 3.6, text or multimodal     the own hybrid target (qwen3_5.py, qwen3_5_checkpoint.py)
    anything else transformers can load   HFTarget (hf.py), which refuses recurrent models it cannot roll back
    a draft, or what nothing can run      refused by name (CheckpointError)

`open_target` turns every refusal into the command's own message (SystemExit), never a traceback, and
`folder_stop_ids` gives the token ids the folder's answers end with.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

from ..config import DRAFT_ARCHITECTURES
from .checkpoint import (
    CheckpointConfigError,
    CheckpointError,
    check_device,
    config_architectures,
    load_qwen3_target,
    read_config,
    resolve_dtype,
)
from .hf import HFTarget
from .llama import load_llama_target
from .qwen3_5_checkpoint import is_hybrid_folder, load_hybrid_target

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class TransformersFallback(UserWarning):
    """A folder of an architecture with an own target ran in transformers instead (its config asks for
    something the own target does not compute): the same model, without hook points."""


def load_target(folder: str | Path, dtype=None, device: str | torch.device = "cpu", via_transformers: bool = False):
    """A Hugging Face causal-LM folder → the target that runs it (the table above), its weights on `device`
    in `dtype` (None or "auto": the config's). `via_transformers`: run it in transformers even where an own
    target exists (training distils through transformers' generate)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} has no config.json" if folder.is_dir() else f"no folder {folder}")
    archs = config_architectures(folder)
    if set(archs) & set(DRAFT_ARCHITECTURES):
        raise CheckpointError(f"{folder}: architectures {archs} is a DFlash draft, not a target (load_draft reads it)")
    own = _own_loader(folder, archs)
    refused = None
    if own is not None and not via_transformers:
        try:
            return own(folder, dtype, device)
        except CheckpointConfigError as e:
            if own is not load_llama_target:
                raise
            refused = f"not on the own Llama ({e})"
            warnings.warn(f"{refused}; running it in transformers", TransformersFallback, 2)
    return _transformers_target(folder, archs, dtype, device, refused)


def _own_loader(folder: Path, archs: list[str]):
    """The own target's loader for this folder (by `architectures`, else by `model_type` for a config that
    names no architecture), or None."""
    if not archs:
        archs = {"qwen3": ["Qwen3ForCausalLM"], "llama": ["LlamaForCausalLM"]}.get(
            read_config(folder).get("model_type"), []
        )
    if "Qwen3ForCausalLM" in archs:
        return load_qwen3_target
    if "LlamaForCausalLM" in archs:
        return load_llama_target
    return load_hybrid_target if is_hybrid_folder(folder) else None


def _transformers_target(folder: Path, archs: list[str], dtype, device, refused: str | None = None) -> HFTarget:
    """The folder as transformers loads it, behind HFTarget; what transformers cannot load is refused
    naming the architecture (and `refused`, why the own target did not take it)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM  # optional: the hf extra
    except ImportError:
        why = refused or "has no own target here"
        raise CheckpointError(
            f"{folder}: architectures {archs or '(none named)'} {why}, and transformers, which could run it, is "
            "not installed (pip install 'dflash-ref[hf]')"
        ) from None
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{folder}: architectures {archs or '(none named)'}: transformers cannot read its "
                              f"config: {e}") from None  # fmt: skip
    dtype = resolve_dtype(dtype, config)
    device = check_device(device, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}: architectures {archs or '(none named)'}: neither dflash_ref nor "
                              f"transformers can run it as a causal LM: {e}") from None  # fmt: skip
    try:
        return HFTarget(model.to(device))
    except TypeError as e:  # HFTarget's refusals: a model a crop cannot roll back, or no causal-LM head
        raise CheckpointError(f"{folder}: {e}") from None


def open_target(folder: Path, dtype: torch.dtype, device: torch.device, own: bool = True):
    """--target FOLDER (a Hugging Face model folder) → (target, tokenizer) by `load_target` (in transformers
    only, unless `own`), or the command ends naming the folder and the problem."""
    if not (folder / "config.json").is_file():
        raise SystemExit(f"--target {folder}: no config.json there (a Hugging Face model folder, or 'smollm2')")
    try:
        archs = config_architectures(folder)
    except CheckpointError as e:
        raise SystemExit(f"--target {e}") from None
    if set(archs) & set(DRAFT_ARCHITECTURES):
        raise SystemExit(f"--target {folder}: architectures {archs} is a draft, not a target")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):  # else transformers makes an empty one
        raise SystemExit(f"--target {folder}: no tokenizer files ({' or '.join(TOKENIZER_FILES)})")
    from transformers import AutoTokenizer  # optional: the hf extra

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError) as e:  # transformers' own, for damaged files
        raise SystemExit(f"--target {folder}: its tokenizer does not load: {type(e).__name__}: {e}") from None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TransformersFallback)
        try:
            target = load_target(folder, dtype, device, via_transformers=not own)
        except CheckpointError as e:
            raise SystemExit(f"--target: {e}") from None
    for warning in caught:
        if issubclass(warning.category, TransformersFallback):
            print(f"[--target: {warning.message}]", file=sys.stderr)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return target, tokenizer


def folder_stop_ids(folder: Path, tokenizer) -> list[int]:
    """generation_config.json's eos_token_id (an id or a list), else the tokenizer's eos_token_id."""
    path = folder / "generation_config.json"
    eos = None
    if path.is_file():
        try:
            eos = json.loads(path.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise SystemExit(f"--target {path} is not a JSON object: {e}") from None
    if eos is None or eos == []:
        eos = tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise SystemExit(f"--target {folder}: eos_token_id {eos!r} is not a token id or a list of them")
    return sorted(set(ids))
