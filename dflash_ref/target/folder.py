"""Opening a target folder the commands name (`--target DIR`): a Hugging Face causal-LM folder
with its tokenizer, run on the project's own Qwen3 or Llama where it is one (qwen3.py, llama.py), on
the own hybrid target where it is a Qwen3.5 / 3.6, text or multimodal (qwen3_5_checkpoint.py), and in
transformers otherwise (hf.py), and the token ids its answers end with. A folder that cannot serve ends the
command with a message naming the folder and the problem, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from .checkpoint import CheckpointConfigError, CheckpointError, config_architectures, load_target
from .hf import HFTarget
from .llama import load_llama_target
from .qwen3_5_checkpoint import is_hybrid_folder, load_hybrid_target

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def open_target(folder: Path, dtype: torch.dtype, device: torch.device, own_qwen3: bool = True):
    """--target FOLDER (a Hugging Face model folder) → (target, tokenizer), or the command ends naming
    the folder and the problem: a Qwen3ForCausalLM or LlamaForCausalLM runs on the project's own Qwen3 or
    Llama and a Qwen3.5 / 3.6 on the own hybrid target (unless not `own_qwen3`: training distils through
    transformers' generate), anything else in transformers, as is a Llama whose config the own Llama
    refuses. The own Llama's linear layers take the measured plan's products, as HFTarget's do."""
    if not (folder / "config.json").is_file():
        raise SystemExit(f"--target {folder}: no config.json there (a Hugging Face model folder, or 'smollm2')")
    try:
        archs = config_architectures(folder)
    except CheckpointError as e:
        raise SystemExit(f"--target {e}") from None
    if "DFlashDraftModel" in archs:
        raise SystemExit(f"--target {folder}: architectures {archs} is a draft, not a target")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):  # else transformers makes an empty one
        raise SystemExit(f"--target {folder}: no tokenizer files ({' or '.join(TOKENIZER_FILES)})")
    from transformers import AutoTokenizer  # optional: the hf extra

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError) as e:  # transformers' own, for damaged files
        raise SystemExit(f"--target {folder}: its tokenizer does not load: {type(e).__name__}: {e}") from None
    own = (
        load_target
        if "Qwen3ForCausalLM" in archs
        else load_llama_target
        if "LlamaForCausalLM" in archs
        else load_hybrid_target
        if is_hybrid_folder(folder)
        else None
    )
    if own is not None and own_qwen3:
        try:
            return own(folder, dtype, device), tokenizer  # the project's own Qwen3, Llama or Qwen3.5
        except CheckpointConfigError as e:
            if own is not load_llama_target:
                raise SystemExit(f"--target: {e}") from None
            # a Llama the own target cannot compute (Llama 3's RoPE, biases): transformers runs it, as before
            print(f"[--target: not on the own Llama ({e}); running it in transformers]", file=sys.stderr)
        except CheckpointError as e:
            raise SystemExit(f"--target: {e}") from None
    from transformers import AutoModelForCausalLM  # optional: the hf extra

    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as e:
        raise SystemExit(f"--target {folder}: transformers cannot load it: {e}") from None
    return HFTarget(model.to(device)), tokenizer


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
