"""dflash_ref: an educational, instrumented reference implementation of DFlash.

The modules at the top follow the data's walk, one per equation (README.md beside this file):

    layer_sampling  which target layers feed the draft, and reading them (+1 offset)
    context         C = RMSNorm(W_fc · concat[h^(l_1), …, h^(l_k)])
    rope            RoPE with the sliced query (K: L_c + L_q positions, Q: the last L_q)
    attention       KV injection: Q from the block, K/V = concat[context, block], non-causal, GQA
    draft_layer     pre-norm decoder layer (attention + SwiGLU)
    draft_model     N layers + fc + hidden_norm + norm; the target's embedding and lm_head reused
    dflash2         DFlash 2's layer (dynamic_conv) and model (candidate_selector), extending DFlash 1's
    acceptance      cumprod acceptance, bonus token, and the two lossless sampling verifiers
    cache           per-layer K/V with append / crop / length
    decoding        AR `generate`, and `spec_generate`: prefill → (draft → verify → accept → crop)*

With target/ (the targets written out here) they are the core, which imports only torch, einops and
safetensors. The tools live in subpackages: extensions/ (the loop's opt-in wrappers), fast_cpu/ (the
opt-in speed path), trace/ and viewer/ (observing a run), loading/ (targets from transformers, GGUF,
folders), drafts/, training/, bench/, tour/ (the walkthrough's code), conformance/, cli/.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Names are imported on first use (PEP 562), so that `dflash_ref.conformance`'s numpy-only bundle
# reader and comparison can be imported without importing torch.
_EXPORTS = {
    "acceptance": ["acceptance_length", "sample", "sampling_probs"],
    "cache": ["KVCache"],
    "config": ["ConfigError", "DraftConfig", "TargetConfig"],
    "decoding": ["GenerationOutput", "generate", "spec_generate"],
    "draft_model": ["DFlashDraftModel"],
    "dflash2": ["DFlash2DraftModel", "make_draft"],
    "drafts.checkpoint": ["load_draft", "save_draft"],
    "layer_sampling": ["build_target_layer_ids", "extract_context_feature"],
    "extensions": ["DraftVocab", "PromptLookup", "VerifyGate"],
    "fast_cpu": ["use_fast_cpu"],
    "loading.hf": ["HFTarget"],
    "target": ["Qwen3Target"],
    "target.checkpoint": ["save_target"],
    "loading.folder": ["load_target", "load_tokenizer"],
    "target.llama": ["LlamaTarget", "load_llama_target"],
    "trace": ["StepLog", "StepRecord"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:
    from .acceptance import acceptance_length, sample, sampling_probs
    from .cache import KVCache
    from .config import ConfigError, DraftConfig, TargetConfig
    from .decoding import GenerationOutput, generate, spec_generate
    from .dflash2 import DFlash2DraftModel, make_draft
    from .draft_model import DFlashDraftModel
    from .drafts.checkpoint import load_draft, save_draft
    from .extensions import DraftVocab, PromptLookup, VerifyGate
    from .fast_cpu import use_fast_cpu
    from .layer_sampling import build_target_layer_ids, extract_context_feature
    from .loading.folder import load_target, load_tokenizer
    from .loading.hf import HFTarget
    from .target import Qwen3Target
    from .target.checkpoint import save_target
    from .target.llama import LlamaTarget, load_llama_target
    from .trace import StepLog, StepRecord


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
