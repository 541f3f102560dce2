"""Does this draft fit this target, and is this request decodable? Clear errors before any compute.

A draft reuses the target's embedding and lm_head and reads its hidden states, so:
    hidden sizes equal · vocabularies equal (where the draft records one) · every target_layer_id < the target's
    layers ·
    mask_token_id inside the vocabulary · the same dtype and device for both.
"""

from __future__ import annotations

import operator

import torch


class IncompatibleModels(ValueError):
    """The draft was not built for this target."""


def check_pair(draft, target) -> None:
    dc, tc = draft.config, target.config
    if dc.hidden_size != tc.hidden_size:
        raise IncompatibleModels(f"draft hidden_size {dc.hidden_size} != target hidden_size {tc.hidden_size}")
    if dc.vocab_size is not None and dc.vocab_size != tc.vocab_size:  # None: the draft's format records none
        raise IncompatibleModels(f"draft vocab_size {dc.vocab_size} != target vocab_size {tc.vocab_size}")
    bad = [i for i in dc.target_layer_ids if not 0 <= i < tc.num_hidden_layers]
    if bad:
        raise IncompatibleModels(
            f"draft target_layer_ids {dc.target_layer_ids} include {bad}, beyond "
            f"the target's {tc.num_hidden_layers} layers"
        )
    if dc.num_target_layers is not None and dc.num_target_layers != tc.num_hidden_layers:
        raise IncompatibleModels(
            f"draft was built for a {dc.num_target_layers}-layer target "
            f"(num_target_layers); this target has {tc.num_hidden_layers} layers"
        )
    if not 0 <= dc.mask_token_id < tc.vocab_size:
        raise IncompatibleModels(
            f"mask_token_id {dc.mask_token_id} is outside the target vocabulary 0..{tc.vocab_size - 1}"
        )
    d_param = next(draft.parameters())
    if d_param.dtype != target.dtype or d_param.device != target.device:
        raise IncompatibleModels(
            f"draft is {d_param.dtype} on {d_param.device} but target is "
            f"{target.dtype} on {target.device}; move both with .to(...)"
        )


def check_request(
    input_ids: torch.Tensor, max_new_tokens: int, max_positions: int, vocab_size: int, stop_token_ids
) -> None:
    """One prompt (1, L ≥ 1) of valid ids; the generation must fit the position limit."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids must be a (1, prompt_len) tensor of token ids, got "
            f"{getattr(input_ids, 'shape', type(input_ids).__name__)}"
        )
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"batch size {input_ids.shape[0]}: speculative decoding here runs one sequence "
            "at a time (batch size 1); loop over the prompts"
        )
    if input_ids.shape[1] == 0:
        raise ValueError("empty prompt: at least one token is needed to start decoding")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab_size:
        raise ValueError(f"prompt token ids must lie in 0..{vocab_size - 1}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer ≥ 0, got {max_new_tokens!r}")
    total = input_ids.shape[1] + max_new_tokens
    if total > max_positions:
        raise ValueError(
            f"prompt ({input_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) = {total} "
            f"exceeds the position limit max_position_embeddings = {max_positions}"
        )
    for t in stop_token_ids or ():
        try:
            if isinstance(t, bool):
                raise TypeError
            t = operator.index(t)  # int, numpy integer, 0-d integer tensor
        except TypeError:
            raise ValueError(f"stop token ids must be integers, got {t!r} ({type(t).__name__})") from None
        if not 0 <= t < vocab_size:
            raise ValueError(f"stop token id {t} is outside the vocabulary 0..{vocab_size - 1}")
