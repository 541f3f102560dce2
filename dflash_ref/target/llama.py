"""An explicit Llama causal LM, the target (same parameter names as transformers' LlamaForCausalLM): the
project's own Qwen3 (qwen3.py) without its per-head norm, SmolLM2's architecture.

    Qwen3:  Q = QNorm(h W_Q),  K = KNorm(h W_K)
    Llama:  Q = h W_Q,         K = h W_K

Everything else is Qwen3's: pre-norm decoder layers, RoPE on Q and K, causal GQA attention, SwiGLU,
the final norm, a tied or separate lm_head, every hidden state returned (embedding output first). So
a Llama runs with the own target's hook points (`target.model.layers.{l}.self_attn.hook_pattern`) and
its explicit attention path, which transformers' SDPA path cannot give; its logits and hidden states are
transformers' bit for bit on the same weights and products (tests/test_llama_target.py).

Refused by name rather than run approximately: mlp_bias, attention_bias, an activation other than
SiLU, rope types other than default / linear / yarn (Llama 3's "llama3" among them).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import ConfigError, TargetConfig
from ..config_fields import bool_field
from .checkpoint import load_folder
from .qwen3 import Qwen3Target

LLAMA_MAX_POSITIONS = 2048  # transformers' LlamaConfig default (a yarn RoPE without its original length reads it)


class LlamaTargetConfig(TargetConfig):
    """A Llama causal LM used as the target (architectures: LlamaForCausalLM)."""

    @classmethod
    def _fields_from_dict(cls, d: dict) -> dict:
        if isinstance(d, dict):
            if bool_field(d.get("mlp_bias", False), "mlp_bias"):
                raise ConfigError("mlp_bias=true is not supported (the SwiGLU here has no biases)")
            d = {"max_position_embeddings": LLAMA_MAX_POSITIONS, **d}  # LlamaConfig's default, not Qwen3's
        return super()._fields_from_dict(d)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "architectures": ["LlamaForCausalLM"], "model_type": "llama", "mlp_bias": False}


class LlamaTarget(Qwen3Target):
    qk_norm = False


def from_transformers(model) -> LlamaTarget:
    """A loaded transformers LlamaForCausalLM → a LlamaTarget on the very same weight tensors (no copy),
    its config read as a folder's would be (a field this target cannot compute is refused by name)."""
    if type(model).__name__ != "LlamaForCausalLM":
        raise TypeError(f"from_transformers takes a transformers LlamaForCausalLM, got {type(model).__name__}")
    config = LlamaTargetConfig.from_dict(model.config.to_dict())
    with torch.device("meta"):
        target = LlamaTarget(config)
    state = model.state_dict()
    if config.tie_word_embeddings:  # one tensor under two names: the own target ties it after loading
        state.pop("lm_head.weight", None)
    missing, unexpected = target.load_state_dict(state, assign=True, strict=False)
    missing = [name for name in missing if not (config.tie_word_embeddings and name == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"{type(model).__name__}'s tensors do not match a Llama target: missing {missing or 'none'}, "
            f"unexpected {unexpected or 'none'}"
        )
    if config.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    theirs = model.model.rotary_emb.inv_freq
    if not torch.equal(theirs.float(), target.rotary_emb.inv_freq(theirs.device)) or theirs.dtype != torch.float32:
        raise ValueError(
            "this model's RoPE frequencies (model.model.rotary_emb.inv_freq, "
            f"{theirs.dtype}) are not the fp32 ones its config gives: a model cast by .to(dtype) "
            "rounds them; load it with from_pretrained(..., dtype=...) instead"
        )
    return target.eval()


def load_llama_target(folder: str | Path, dtype=None, device: str | torch.device = "cpu") -> LlamaTarget:
    """A transformers LlamaForCausalLM folder → the project's own LlamaTarget."""
    return load_folder(LlamaTarget, LlamaTargetConfig, folder, dtype, device, {"LlamaForCausalLM"})
