"""The speculative decoding loop (seed: "推理流程"): prefill, then per step
draft → verify → accept → crop both caches → slice the new context features.

    prefill:  target(prompt) → first token x_0, target_hidden for every prompt position
    step (start = position of the last committed token x_0 = output_ids[start]):
      block  = [x_0, mask, …, mask]                       L_q = min(block_size, max_length − start)
      draft  = draft(embed(block), target_hidden, positions start − L_c … start + L_q − 1)[:, 1:]
               → γ = L_q − 1 draft tokens (argmax over the draft's vocabulary if it has one,
               draft_vocab.py); draft cache cropped back to `start` (context stays)
      verify = target([x_0, d_1, …, d_γ]) → posterior, new hidden states
      accept = τ by cumprod, bonus token (acceptance.py); commit x_0, d_1..d_τ, bonus
      crop target cache to the new start = start + τ + 1; target_hidden = new features[:, :τ + 1]

Why `[:, 1:]`: block position 0 holds the known token x_0; positions 1..γ are the predictions.
Output buffer and position rules follow `dflash` 0.1.0 exactly, so both give the same tokens.
# diff with official: tokens equal to mask_token_id are kept (never stripped), batch size > 1 is
# refused with a clear error, no CUDA synchronisation is needed (it runs on the CPU), and a draft
# with a draft vocabulary proposes among it only (official: always all V; equally lossless).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .acceptance import check_sampling, sample, sample_probs, sampling_probs, verify_greedy, \
    verify_match, verify_rejection
from .compat import check_pair, check_request
from .draft_vocab import DraftVocabHead
from .layer_sampling import extract_context_feature
from .verify_gate import check_gate, draft_confidence, gated_verify_size

VERIFIERS = ("rejection", "match")


@dataclass
class StepRecord:
    """What happened in one decode step (the trace stores one per step)."""
    step: int
    start: int                       # position of x_0, the last committed token
    block_ids: list[int]             # [x_0, d_1, …] as verified (drafted from [x_0, mask, …])
    q_position_ids: list[int]        # positions of the draft's block (Q): start … start + L_q − 1
    k_position_ids: list[int]        # every key column of the draft's attention: cached context,
                                     # new context, block = 0 … start + L_q − 1
    draft_tokens: list[int]          # d_1..d_γ, every proposal drafted
    posterior: list[int]             # the target's token at each block position (empty: rejection)
    acceptance_length: int           # τ, accepted draft tokens
    bonus: int                       # the target's token after the accepted run
    produced: int                    # tokens committed (τ + 1, clipped by max length or a stop token)
    ctx_len: int                     # L_c, new context features fed to this draft pass
    draft_cache_before: int
    draft_cache_after_draft: int     # before its crop
    draft_cache_after: int           # after its crop (= start)
    target_cache_before: int
    target_cache_after_verify: int   # before its crop
    target_cache_after: int          # after its crop (= new start)
    verify_size: int = 0             # L, tokens verified: L_q, or 2 where verify_gate shut (0: not recorded,
                                     # a trace saved before this field existed)


@dataclass
class GenerationOutput:
    output_ids: torch.Tensor                       # (1, prompt_len + num_output_tokens)
    num_input_tokens: int
    acceptance_lengths: list[int] = field(default_factory=list)  # τ per decode step
    tokens_per_step: list[int] = field(default_factory=list)     # committed per step (official's list)
    num_draft_passes: int = 0
    num_target_passes: int = 0                      # prefill included

    @property
    def num_output_tokens(self) -> int:
        return self.output_ids.shape[1] - self.num_input_tokens

    @property
    def mean_tokens_per_step(self) -> float:
        """Mean tokens committed per target verify (the paper's τ, bonus included)."""
        return sum(self.tokens_per_step) / max(len(self.tokens_per_step), 1)


@torch.inference_mode()
def spec_generate(draft, target, input_ids: torch.Tensor, max_new_tokens: int,
                  stop_token_ids: list[int] | None = None, temperature: float = 0.0,
                  top_p: float = 1.0, top_k: int = 0, block_size: int | None = None,
                  verifier: str = "rejection", verify_gate: float | None = None,
                  on_step: Callable[[StepRecord], None] | None = None) -> GenerationOutput:
    """Generate up to `max_new_tokens` tokens after `input_ids` (1, L) with draft + target.

    Lossless: greedy output equals `generate(target, …)`; sampled output has the target's
    distribution with either verifier ("rejection" or "match", see acceptance.py).
    `verify_gate` θ (an extension, verify_gate.py): verify the whole block only when the draft's
    confidence in its first two proposals, c_1·c_2, is at least θ, else the first proposal alone;
    None (the default, the official behaviour) verifies every block whole. Lossless either way.
    `on_step` receives a StepRecord after every decode step (tracing, streaming).
    """
    check_pair(draft, target)
    check_sampling(temperature, top_p, top_k)
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {VERIFIERS}")
    check_gate(verify_gate)
    block_size = draft.block_size if block_size is None else block_size
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer ≥ 1, got {block_size!r}")
    max_positions = min(target.config.max_position_embeddings, draft.config.max_position_embeddings)
    check_request(input_ids, max_new_tokens, max_positions, target.config.vocab_size, stop_token_ids)

    device = target.device
    input_ids = input_ids.to(device)
    prompt_len = input_ids.shape[1]
    max_length = prompt_len + max_new_tokens
    output_ids = torch.full((1, max_length + 1), draft.mask_token_id, dtype=torch.long, device=device)
    position_ids = torch.arange(max_length + 1, device=device)[None]       # (1, max_length + 1)
    target_cache, draft_cache = target.make_cache(), draft.make_cache()
    stop_tokens = torch.tensor(sorted({int(t) for t in stop_token_ids or ()}), dtype=torch.long, device=device)
    result = GenerationOutput(output_ids, prompt_len)
    if max_new_tokens == 0:  # nothing to generate: no prefill, no random draw
        result.output_ids = input_ids.clone()
        return result
    # the draft's proposals over its draft vocabulary if it has one (draft_vocab.py), else all V
    vocab = getattr(draft, "draft_vocab", None)
    output_head = target.output_head if vocab is None or block_size == 1 else DraftVocabHead(target, vocab)

    out = target(input_ids, position_ids[:, :prompt_len], target_cache,
                 output_hidden_states=block_size > 1, logits_to_keep=1)
    result.num_target_passes += 1
    output_ids[:, :prompt_len] = input_ids
    output_ids[:, prompt_len] = sample(out.logits[:, -1], temperature, top_p, top_k)
    if block_size > 1:
        target_hidden = extract_context_feature(out.hidden_states, draft.target_layer_ids)  # (1, L, k·d)

    start = prompt_len
    stopped = bool(torch.isin(output_ids[0, start], stop_tokens))
    while start + 1 < max_length and not stopped:
        draft_size = min(block_size, max_length - start)                     # L_q of the draft pass
        block_ids = output_ids[:, start:start + draft_size].clone()          # (1, L_q)
        ctx_len = target_hidden.shape[1] if draft_size > 1 else 0
        draft_before, target_before = draft_cache.get_seq_length(), target_cache.get_seq_length()
        draft_after_draft, draft_probs = draft_before, None
        if draft_size > 1:
            noise_embedding = target.embed(block_ids)                         # (1, L_q, d)
            hidden = draft(position_ids[:, start - ctx_len:start + draft_size],
                           noise_embedding=noise_embedding, target_hidden=target_hidden,
                           past_key_values=draft_cache)[:, 1:]                # (1, γ, d)
            result.num_draft_passes += 1
            draft_after_draft = draft_cache.get_seq_length()
            draft_cache.crop(start)                                           # block K/V go
            draft_logits = draft.compute_logits(hidden, output_head)          # (1, γ, V)
            if temperature > 0 and verifier == "rejection":
                draft_probs = sampling_probs(draft_logits, temperature, top_p, top_k)
                block_ids[:, 1:] = sample_probs(draft_probs)
            else:
                block_ids[:, 1:] = draft_logits.argmax(dim=-1)
        proposals = block_ids[:, 1:]                                          # (1, γ) d_1..d_γ, all drafted
        verify_size = draft_size
        if verify_gate is not None and draft_size > 2:                        # verify_gate.py
            confidence = draft_confidence(draft_logits[:, :2],                # c_1, c_2: (1, 2)
                                          draft_probs[:, :2] if draft_probs is not None else None)
            verify_size = gated_verify_size(confidence, draft_size, verify_gate)
            block_ids = block_ids[:, :verify_size]                            # (1, L_q) → (1, L)
            if draft_probs is not None:
                draft_probs = draft_probs[:, :verify_size - 1]                # (1, γ, V) → (1, L − 1, V)

        out = target(block_ids, position_ids[:, start:start + verify_size], target_cache,
                     output_hidden_states=verify_size > 1)
        result.num_target_passes += 1
        target_after_verify = target_cache.get_seq_length()
        draft_tokens = block_ids[:, 1:]                                       # (1, L − 1) verified
        posterior = None
        if temperature == 0:
            tau, bonus, posterior = verify_greedy(draft_tokens, out.logits)
        else:
            target_probs = sampling_probs(out.logits, temperature, top_p, top_k)  # (1, L, V)
            if verifier == "match":
                tau, bonus, posterior = verify_match(draft_tokens, target_probs)
            elif verify_size > 1:
                tau, bonus = verify_rejection(draft_tokens, target_probs, draft_probs)
            else:
                tau, bonus = 0, sample_probs(target_probs[:, -1])[0]

        output_ids[:, start:start + tau + 1] = block_ids[:, :tau + 1]
        output_ids[:, start + tau + 1] = bonus
        produced = min(tau + 1, max_length - start - 1)
        hits = torch.isin(output_ids[0, start + 1:start + produced + 1], stop_tokens).nonzero()
        if hits.numel():
            produced, stopped = int(hits[0, 0]) + 1, True
        start += produced
        target_cache.crop(start)                                              # rejected K/V go
        if draft_size > 1:
            target_hidden = extract_context_feature(out.hidden_states, draft.target_layer_ids)[:, :produced]
        result.acceptance_lengths.append(tau)
        result.tokens_per_step.append(produced)
        if on_step is not None:
            on_step(StepRecord(
                step=len(result.acceptance_lengths) - 1, start=start - produced,
                block_ids=block_ids[0].tolist(),
                q_position_ids=list(range(start - produced, start - produced + draft_size)),
                k_position_ids=list(range(start - produced + draft_size))
                if draft_size > 1 else [],
                draft_tokens=proposals[0].tolist(), verify_size=verify_size,
                posterior=posterior[0].tolist() if posterior is not None else [],
                acceptance_length=tau, bonus=int(bonus), produced=produced, ctx_len=ctx_len,
                draft_cache_before=draft_before, draft_cache_after_draft=draft_after_draft,
                draft_cache_after=draft_cache.get_seq_length(), target_cache_before=target_before,
                target_cache_after_verify=target_after_verify,
                target_cache_after=target_cache.get_seq_length()))

    result.output_ids = output_ids[:, :min(start + 1, max_length)]
    return result
