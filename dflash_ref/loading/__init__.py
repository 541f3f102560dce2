"""Opening targets from outside the core: `load_target` / `load_tokenizer` (`folder.py`: a folder's
architecture picks the target, or a name, `smollm2`, as `--target` takes it); any transformers causal LM
behind the target protocol (`hf.py`; recurrent models refused by `hf_guard.py`, transformers' Qwen3.5 /
Qwen3-Next rolled back by snapshot + replay in `hf_hybrid.py`; grouped-query attention without repeated
key/value heads for its sdpa, `grouped_attention.py`); SmolLM2-135M from its GGUF (`smollm2.py`); the chat
model `train` distils from (`chat.py`). The targets written out here are in `target/`, part of the core.
"""
