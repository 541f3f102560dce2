"""dflash_ref: an educational, instrumented reference implementation of DFlash.

The package follows the data's walk, one module per equation:

    layer_sampling  which target layers feed the draft, and reading them (+1 offset)
    context         C = RMSNorm(W_fc · concat[h^(l_1), …, h^(l_k)])
    rope            RoPE with the sliced query (K: L_c + L_q positions, Q: the last L_q)
    attention       KV injection: Q from the block, K/V = concat[context, block], non-causal, GQA
    draft_layer     pre-norm decoder layer (attention + SwiGLU)
    draft_model     N layers + fc + hidden_norm + norm; the target's embedding and lm_head reused
    acceptance      cumprod acceptance, bonus token, and the two lossless sampling verifiers
    cache           per-layer K/V with append / crop / length
    spec_generate   prefill → (draft → verify → accept → crop → new context)*
    target/         an explicit Qwen3 causal LM
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

# Names are imported on first use (PEP 562), so that `dflash_ref.conformance`'s numpy-only bundle
# reader and comparison can be imported without importing torch.
_EXPORTS = {
    "acceptance": ["acceptance_length", "sample", "sampling_probs"], "ar_generate": ["generate"],
    "cache": ["KVCache"], "checkpoint": ["load_draft", "load_target", "save_draft", "save_target"],
    "config": ["ConfigError", "DraftConfig", "TargetConfig"], "draft_model": ["DFlashDraftModel"],
    "layer_sampling": ["build_target_layer_ids", "extract_context_feature"],
    "spec_generate": ["GenerationOutput", "StepRecord", "spec_generate"], "target": ["Qwen3Target"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:
    from .acceptance import acceptance_length, sample, sampling_probs
    from .ar_generate import generate
    from .cache import KVCache
    from .checkpoint import load_draft, load_target, save_draft, save_target
    from .config import ConfigError, DraftConfig, TargetConfig
    from .draft_model import DFlashDraftModel
    from .layer_sampling import build_target_layer_ids, extract_context_feature
    from .spec_generate import GenerationOutput, StepRecord, spec_generate
    from .target import Qwen3Target


def __getattr__(name: str):
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f".{name}", __name__)  # a submodule, as after an eager import
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """Importing the submodule `spec_generate` binds it on the package; keep the function of that name
    there instead, as the former eager `from .spec_generate import spec_generate` did."""

    def __setattr__(self, name: str, value) -> None:
        if name in _MODULE_OF and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
