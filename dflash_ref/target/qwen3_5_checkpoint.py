"""A Qwen3.5 / 3.6 folder (`--target DIR`) → the own hybrid target (qwen3_5.py), read by checkpoint.py.

Two layouts, told apart by config.json (`model_type`, else `architectures`):

    text model   "qwen3_5_text", Qwen3_5ForCausalLM         tensors model.*, lm_head.weight: the own names
    multimodal   "qwen3_5", Qwen3_5ForConditionalGeneration  (how Qwen3.5 / 3.6 are released) the text model's
                 config is its text_config; tensors model.language_model.* → model.*, lm_head.weight as is;
                 model.visual.* (the vision tower) and mtp.* (the multi-token-prediction head) are not read

Any other tensor is reported as unexpected, a missing one as missing (load_weights). The MoE variants
(qwen3_5_moe) are not this model: they go to transformers (target/folder.py), which refuses them.
"""
from __future__ import annotations

from pathlib import Path

from .checkpoint import load_folder, read_config
from .qwen3_5 import Qwen3_5Target
from .qwen3_5_config import HybridConfig

HYBRID_ARCHITECTURES = {"Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"}
HYBRID_MODEL_TYPES = {"qwen3_5", "qwen3_5_text"}
MULTIMODAL_PREFIX, NOT_READ = "model.language_model.", ("model.visual.", "mtp.")


def is_hybrid_folder(folder: Path) -> bool:
    """Whether folder/config.json names a dense Qwen3.5 / 3.6 (text or multimodal)."""
    config = read_config(folder)
    archs = config.get("architectures") or []
    return config.get("model_type") in HYBRID_MODEL_TYPES or bool(set(archs) & HYBRID_ARCHITECTURES)


def text_model_name(name: str) -> str | None:
    """A stored tensor's name → the own target's (None: not part of the text model)."""
    if name.startswith(NOT_READ):
        return None
    if name.startswith(MULTIMODAL_PREFIX):
        return "model." + name.removeprefix(MULTIMODAL_PREFIX)
    return name


def load_hybrid_target(folder: str | Path, dtype=None, device="cpu") -> Qwen3_5Target:
    """A Qwen3.5 / 3.6 folder → Qwen3_5Target on `device` in `dtype` ("auto"/None: the config's)."""
    return load_folder(Qwen3_5Target, HybridConfig, folder, dtype, device, HYBRID_ARCHITECTURES, text_model_name)
