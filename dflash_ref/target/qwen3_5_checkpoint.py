"""A Qwen3.5 / 3.6 folder (`--target DIR`) → the own hybrid target (qwen3_5.py), read by checkpoint.py.

Two layouts, told apart by config.json (`model_type`, else `architectures`):

    text model   "qwen3_5_text", Qwen3_5ForCausalLM         tensors model.*, lm_head.weight: the own names
    multimodal   "qwen3_5", Qwen3_5ForConditionalGeneration  (how Qwen3.5 / 3.6 are released) the text model's
                 config is its text_config; tensors model.language_model.* → model.*, lm_head.weight as is;
                 model.visual.* (the vision tower) and mtp.* (the multi-token-prediction head) are not read

Any other tensor is reported as unexpected, a missing one as missing (load_weights). `save_hybrid_target`
writes the multimodal layout (the text model alone: no vision tower), which transformers, mlx-lm and this
loader all read. The MoE variants
(qwen3_5_moe) are not this model: they go to transformers (loading/folder.py), which refuses them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .checkpoint import SINGLE, load_folder, read_config, save_safetensors
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


def save_hybrid_target(model: Qwen3_5Target, folder: str | Path, dtype: torch.dtype | None = None) -> None:
    """config.json (model_type "qwen3_5", the text model's fields as text_config, RoPE as rope_parameters and
    full_attention_interval where the layers follow it, as mlx-lm reads it) + model.safetensors
    (model.* as model.language_model.*); a tied lm_head is not stored."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    state = {
        (MULTIMODAL_PREFIX + k.removeprefix("model.") if k.startswith("model.") else k): v.detach()
        .to(dtype or v.dtype)
        .contiguous()
        .cpu()
        for k, v in model.state_dict().items()
    }
    if c.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    text = {k: v for k, v in c.to_dict().items() if k not in ("rope_theta", "partial_rotary_factor", "dtype")}
    text.update(
        model_type="qwen3_5_text",
        rope_parameters={
            "rope_type": "default",
            "rope_theta": c.rope_theta,
            "partial_rotary_factor": c.partial_rotary_factor,
        },
    )
    every_4th = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(c.num_hidden_layers)]
    if c.layer_types == every_4th:
        text["full_attention_interval"] = 4
    config = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": c.tie_word_embeddings,
        "dtype": str(next(iter(state.values())).dtype).removeprefix("torch."),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_safetensors(state, folder / SINGLE, metadata={"format": "pt"})
