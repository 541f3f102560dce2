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
from .acceptance import acceptance_length, sample, sampling_probs
from .ar_generate import generate
from .cache import KVCache
from .checkpoint import load_draft, load_target, save_draft, save_target
from .config import ConfigError, DraftConfig, TargetConfig
from .draft_model import DFlashDraftModel
from .layer_sampling import build_target_layer_ids, extract_context_feature
from .spec_generate import GenerationOutput, StepRecord, spec_generate
from .target import Qwen3Target

__all__ = [
    "ConfigError", "DFlashDraftModel", "DraftConfig", "GenerationOutput", "KVCache", "Qwen3Target",
    "StepRecord", "TargetConfig", "acceptance_length", "build_target_layer_ids",
    "extract_context_feature", "generate", "load_draft", "load_target", "sample", "sampling_probs",
    "save_draft", "save_target", "spec_generate",
]
