"""Autoregressive decoding with the target alone: the baseline speculative decoding must reproduce.

    x_{t+1} = argmax p(· | x_≤t)      (temperature 0)    or    x_{t+1} ~ p_T(· | x_≤t)

Same interface and output as `spec_generate`; random numbers are drawn in the same order, so
`spec_generate(..., block_size=1)` gives exactly this output, sampled or greedy.
"""
from __future__ import annotations

import torch

from .acceptance import check_sampling, sample
from .compat import check_request
from .spec_generate import GenerationOutput


@torch.inference_mode()
def generate(target, input_ids: torch.Tensor, max_new_tokens: int,
             stop_token_ids: list[int] | None = None, temperature: float = 0.0,
             top_p: float = 1.0, top_k: int = 0) -> GenerationOutput:
    check_sampling(temperature, top_p, top_k)
    check_request(input_ids, max_new_tokens, target.config.max_position_embeddings,
                  target.config.vocab_size, stop_token_ids)
    input_ids = input_ids.to(target.device)
    stop = {int(t) for t in stop_token_ids or ()}
    cache = target.make_cache()
    result = GenerationOutput(input_ids.clone(), input_ids.shape[1])
    if max_new_tokens == 0:
        return result
    logits = target(input_ids, past_key_values=cache, output_hidden_states=False, logits_to_keep=1).logits
    tokens = [int(sample(logits[:, -1], temperature, top_p, top_k)[0])]
    result.num_target_passes = 1
    while len(tokens) < max_new_tokens and tokens[-1] not in stop:
        last = torch.tensor([[tokens[-1]]], device=input_ids.device)          # (1, 1)
        logits = target(last, past_key_values=cache, output_hidden_states=False).logits
        result.num_target_passes += 1
        tokens.append(int(sample(logits[:, -1], temperature, top_p, top_k)[0]))
        result.tokens_per_step.append(1)
        result.acceptance_lengths.append(0)
    new = torch.tensor([tokens], dtype=torch.long, device=input_ids.device)
    result.output_ids = torch.cat([input_ids, new], dim=1)
    return result
