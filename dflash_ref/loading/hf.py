"""Any transformers causal LM as the target (Qwen3ForCausalLM, LlamaForCausalLM, …).

The adapter exposes the target protocol (see `target/__init__.py`) on top of the model's own
pieces: `get_input_embeddings()` for the block's noise embedding, `get_output_embeddings()` as the
lm_head, `output_hidden_states=True` for the context features (same layout: embedding output first,
the last entry after the final norm), and a transformers `DynamicCache` cropped in place.
Hook points live in the project's own targets only (Qwen3, Llama, the Qwen3.5 hybrid): a transformers
model gives no attention weights on its SDPA path, so tracing such a target is refused rather than
silently empty; the own Llama (llama.py) gives a transformers Llama's numbers with them
(`from_transformers(model)`, and what `--target DIR` opens a Llama folder on).
"""

from __future__ import annotations

import torch
from torch import nn

from ..target.qwen3 import TargetOutput
from .grouped_attention import use_sdpa_grouped
from .hf_guard import check_rollback
from .hf_hybrid import ReplayCache, replayable


class HFCache:
    """A transformers DynamicCache behind the project's cache interface (crop to a length)."""

    def __init__(self, config) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=config)
        # sliding-window layers drop old states on update unless told to keep them for a crop
        self.cache.activate_past_recording()

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        current = self.get_seq_length()
        if not 0 <= length <= current:
            raise ValueError(f"cannot crop a cache of length {current} to {length}")
        if length < current:
            self.cache.crop(length - current)  # transformers 5: a negative count removes tokens


class HFTarget(nn.Module):
    """A transformers causal LM behind the target protocol; its own forward, untouched."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.replay = replayable(model)  # Qwen3.5 / Qwen3-Next: exact rollback by snapshot + replay (hf_hybrid.py)
        if not self.replay:
            check_rollback(model)  # other recurrent (linear-attention, SSM) states: a crop cannot undo them
        config = model.config
        missing = [
            k
            for k in ("hidden_size", "vocab_size", "num_hidden_layers", "max_position_embeddings")
            if getattr(config, k, None) is None
        ]
        if missing or model.get_output_embeddings() is None:
            raise TypeError(
                f"{type(model).__name__} is not a causal LM this adapter can drive "
                f"(config lacks {missing or 'nothing'}; output head: "
                f"{'missing' if model.get_output_embeddings() is None else 'ok'})"
            )
        self.model = model.eval()
        self.config = config
        use_sdpa_grouped(model)  # "sdpa" without copying the cache's key/value heads: the same numbers

    @property
    def device(self) -> torch.device:
        return self.model.get_output_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_output_embeddings().weight.dtype

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(input_ids)

    def output_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden)

    def output_weight(self) -> torch.Tensor:
        """The lm_head matrix (V, d): logits = hidden @ output_weight().T (training takes rows of it)."""
        head = self.model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("this target's lm_head has a bias; output_weight() alone does not give its logits")
        return head.weight

    def make_cache(self) -> HFCache | ReplayCache:
        return ReplayCache(self.model) if self.replay else HFCache(self.config)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key_values: HFCache | None = None,
        output_hidden_states: bool = True,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        if isinstance(past_key_values, ReplayCache):
            past_key_values.record(input_ids, position_ids)  # the snapshot a crop restores
        out = self.model(
            input_ids,
            position_ids=position_ids,
            past_key_values=past_key_values.cache if past_key_values is not None else None,
            use_cache=past_key_values is not None,
            output_hidden_states=output_hidden_states,
            logits_to_keep=logits_to_keep,
        )
        return TargetOutput(out.logits, tuple(out.hidden_states) if output_hidden_states else None)
