"""The project's own targets (part of the core): the model whose output the speculative loop must
reproduce exactly, written out here: Qwen3 (`qwen3.py`), Llama (`llama.py`: Qwen3 without its per-head
norm), the Qwen3.5 / 3.6 hybrid (`qwen3_5.py`, its Gated DeltaNet `gated_deltanet.py`, its cache
`hybrid_cache.py`, its config `qwen3_5_config.py`), and their Hugging Face folders (`checkpoint.py`,
`qwen3_5_checkpoint.py`). Targets from outside (any transformers model, SmolLM2's GGUF, a folder by its
architecture) are opened by `loading/`.

A target offers what the loop needs and nothing more:

    target.device, target.dtype
    target.config                       hidden_size, vocab_size, num_hidden_layers, max_position_embeddings
    target.embed(input_ids)             (B, L) → (B, L, d)      the input embedding, reused by the draft
    target.output_head(hidden)          (B, L, d) → (B, L, V)   the lm_head, reused by the draft
    target.output_weight()              (V, d)                  its matrix (training; a draft vocabulary)
    target.make_cache()                 a cache with crop(length) / get_seq_length()
    target(input_ids, position_ids, past_key_values, output_hidden_states)
                                        → TargetOutput(logits (B, L, V), hidden_states: L_t + 1 tensors)
"""

from .llama import LlamaTarget
from .qwen3 import Qwen3Target, TargetOutput
from .qwen3_5 import Qwen3_5Target
from .qwen3_5_config import HybridConfig

__all__ = ["HybridConfig", "LlamaTarget", "Qwen3Target", "Qwen3_5Target", "TargetOutput"]
