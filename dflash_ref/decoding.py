"""Decoding: the target alone (autoregressive, the baseline) and speculative decoding with a DFlash
draft (seed: "推理流程"), which must give exactly the same output.

Autoregressive (`generate`):   x_{t+1} = argmax p(· | x_≤t)  (temperature 0)  or  x_{t+1} ~ p_T(· | x_≤t)

Speculative (`spec_generate`), the seed's five stages:

    1. prefill   target(prompt) → first token x_0, target_hidden for every prompt position
       then per step, start = position of the last committed token x_0 = output_ids[start]:
    2. draft     block = [x_0, mask, …, mask], L_q = min(block_size, max_length − start);
                 draft(embed(block), target_hidden, positions start − L_c … start + L_q − 1)[:, 1:]
                 → γ = L_q − 1 proposals d_1..d_γ; the draft cache is cropped back to `start`
                 (context K/V stay, the block's go)                               (`draft_block`)
    3. verify    target([x_0, d_1, …, d_γ]) → the posterior at every block position, new hidden states
    4. accept    τ by cumprod and the bonus token (acceptance.py); commit x_0, d_1..d_τ, bonus
    5. crop      the target cache to the new start = start + τ + 1; target_hidden = new features[:, :τ + 1]

Why `[:, 1:]`: block position 0 holds the known token x_0; positions 1..γ are the predictions.
Output buffer and position rules follow `dflash` 0.1.0 exactly, so both give the same tokens, and
random numbers are drawn in the same order in both functions here, so `spec_generate(...,
block_size=1)` gives exactly `generate`'s output, sampled or greedy.

The seam for extensions (none is on unless passed): stage 2 is a function `propose(Block) → Proposal`,
the paper's `draft_block` by default. A Proposal is the block to verify and, for the rejection
verifier, the q its tokens were drawn from; the draft's own answer, a DraftedProposal, also carries
what its pass computed. Each extension in `extensions` wraps stage 2, `propose =
extension.wrap(propose)`, and may change what the draft pass is asked (the output head: a draft
vocabulary), answer without a draft pass (prompt lookup, which then keeps the step's context features
for the next pass itself), or cut the block before the verify (the verify gate). Stages 1 and 3–5
never change, so an extension is lossless exactly when the Proposal it returns is one the verifier may
take (extensions/: each proves it in its own tests).

Observers (`on_step`) get each step as its stages left it, a `Step`; the trace (trace/) is one. The
loop keeps no record of its own beyond the output and its counts.
# diff with official: tokens equal to mask_token_id are kept (never stripped), batch size > 1 is
# refused with a clear error, and no CUDA synchronisation is needed (it runs on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .acceptance import check_sampling, sample, verify_block
from .compat import check_pair, check_request
from .layer_sampling import extract_context_feature

VERIFIERS = ("rejection", "match")


@dataclass
class GenerationOutput:
    output_ids: torch.Tensor  # (1, prompt_len + num_output_tokens)
    num_input_tokens: int
    acceptance_lengths: list[int] = field(default_factory=list)  # τ per decode step
    tokens_per_step: list[int] = field(default_factory=list)  # committed per step (official's list)
    num_draft_passes: int = 0
    num_target_passes: int = 0  # prefill included

    @property
    def num_output_tokens(self) -> int:
        return self.output_ids.shape[1] - self.num_input_tokens

    def add_step(self, acceptance_length: int, produced: int) -> None:
        """One decode step's τ and the tokens it committed."""
        self.acceptance_lengths.append(acceptance_length)
        self.tokens_per_step.append(produced)

    @property
    def mean_tokens_per_step(self) -> float:
        """Mean tokens committed per step: τ + 1 averaged (the paper's acceptance length), less where the length
        limit or a stop token cut a step."""
        return sum(self.tokens_per_step) / max(len(self.tokens_per_step), 1)


@torch.inference_mode()
def generate(
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    stop_token_ids: list[int] | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
) -> GenerationOutput:
    """Up to `max_new_tokens` tokens after `input_ids` (1, L) from the target alone, one per pass."""
    check_sampling(temperature, top_p, top_k)
    check_request(
        input_ids, max_new_tokens, target.config.max_position_embeddings, target.config.vocab_size, stop_token_ids
    )
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
        last = torch.tensor([[tokens[-1]]], device=input_ids.device)  # (1, 1)
        logits = target(last, past_key_values=cache, output_hidden_states=False).logits
        result.num_target_passes += 1
        tokens.append(int(sample(logits[:, -1], temperature, top_p, top_k)[0]))
        result.add_step(0, 1)
    new = torch.tensor([tokens], dtype=torch.long, device=input_ids.device)
    result.output_ids = torch.cat([input_ids, new], dim=1)
    return result


@dataclass
class Block:
    """What stage 2 is asked at one step: d_1..d_γ after x_0 = output_ids[0, start]."""

    output_ids: torch.Tensor  # (1, max_length + 1): prompt, committed tokens, then mask_token_id
    start: int  # position of x_0, the last committed token
    size: int  # L_q = γ + 1, the block's length
    target_hidden: torch.Tensor | None  # (1, L_c, k·d) the features of the tokens committed since the
    # last step (the prompt's at the first), positions start − L_c … start − 1 (None: b = 1)
    head: Callable[[torch.Tensor], torch.Tensor]  # hidden (…, d) → logits (…, V): the target's output head

    def ids(self) -> torch.Tensor:
        """[x_0, mask, …, mask] (1, L_q), a copy to fill with proposals."""
        return self.output_ids[:, self.start : self.start + self.size].clone()


@dataclass
class Proposal:
    """Stage 2's answer: the block the target verifies, and the q the rejection verifier reads. An
    extension that changes the draft's answer keeps it a DraftedProposal (`dataclasses.replace`): the
    loop counts draft passes by it, and the trace reads it."""

    block_ids: torch.Tensor  # (1, L) [x_0, d_1, …, d_{L−1}], L ≤ L_q
    draft_probs: torch.Tensor | None = None  # (1, L − 1, V or M) q the d_i were drawn from (rejection, T > 0)
    candidates: torch.Tensor | None = None  # (1, L − 1, M) the tokens q is over (DFlash 2, prompt lookup)


@dataclass(kw_only=True)
class DraftedProposal(Proposal):
    """The draft's answer (`draft_block`): a Proposal made by one pass of the draft, with what that pass
    computed, for what reads more than the block (the verify gate, the trace)."""

    drafted: torch.Tensor  # (1, L_q) the whole block as drafted, [x_0, d_1..d_γ] (a gate may verify fewer)
    context_length: int  # L_c, the context features the pass injected (Block.target_hidden's length)
    cache_lengths: tuple[int, int]  # the draft cache's length before the pass, and after it (before its crop)
    hidden: torch.Tensor  # (1, γ, d) the draft's final hidden states at positions 1..γ
    logits: torch.Tensor  # (1, γ, V) their logits
    draft: torch.nn.Module  # the draft that made it


Proposer = Callable[[Block], Proposal]


@dataclass
class Step:
    """One decode step as its stages left it, for observers (`spec_generate(on_step=…)`): stage 2's
    question and answer, stage 4's verdict, and both caches as they stand after stage 5's crop (live
    objects: read them in the callback)."""

    index: int  # 0, 1, … in decoding order
    block: Block
    proposal: Proposal
    posterior: torch.Tensor | None  # (1, L) the target's token at each verified position (None: rejection)
    acceptance_length: int  # τ
    bonus: int  # the target's token after the accepted run
    produced: int  # tokens committed after x_0: τ + 1, clipped by the length limit or a stop token
    verified_length: int  # the target cache's length after the verify pass, before its crop
    draft_cache: object
    target_cache: object


@torch.inference_mode()
def spec_generate(
    draft,
    target,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    stop_token_ids: list[int] | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    block_size: int | None = None,
    verifier: str = "rejection",
    extensions: Sequence = (),
    on_step: Callable[[Step], None] | None = None,
) -> GenerationOutput:
    """Up to `max_new_tokens` tokens after `input_ids` (1, L) from draft + target: the five stages above.

    Lossless: greedy output equals `generate(target, …)`; sampled output has the target's distribution
    with either verifier ("rejection" or "match", acceptance.py). `extensions`: objects with
    `wrap(propose) → propose` (extensions/: DraftVocab, VerifyGate, PromptLookup), applied in order
    around stage 2; none (the official loop) by default. `on_step` gets each Step after its crop
    (trace.Trace.on_step, trace.StepLog: the step as a StepRecord)."""
    block_size = _check_arguments(
        draft, target, input_ids, max_new_tokens, stop_token_ids, temperature, top_p, top_k, block_size, verifier
    )
    device, prompt_len = target.device, input_ids.shape[1]
    input_ids, max_length = input_ids.to(device), prompt_len + max_new_tokens
    result = GenerationOutput(input_ids.clone(), prompt_len)
    if max_new_tokens == 0:  # no prefill, no random draw
        return result
    output_ids = torch.full((1, max_length + 1), draft.mask_token_id, dtype=torch.long, device=device)
    position_ids = torch.arange(max_length + 1, device=device)[None]  # (1, max_length + 1)
    target_cache, draft_cache = target.make_cache(), draft.make_cache()
    stop_tokens = torch.tensor(sorted({int(t) for t in stop_token_ids or ()}), dtype=torch.long, device=device)
    propose = _draft_proposer(draft, target, draft_cache, temperature, top_p, top_k, verifier)
    for extension in extensions:
        propose = extension.wrap(propose)

    # 1. prefill: the prompt's next token x_0, and its features as the first context
    out = target(
        input_ids, position_ids[:, :prompt_len], target_cache, output_hidden_states=block_size > 1, logits_to_keep=1
    )
    result.num_target_passes += 1
    output_ids[:, :prompt_len] = input_ids
    output_ids[:, prompt_len] = sample(out.logits[:, -1], temperature, top_p, top_k)
    target_hidden = (
        extract_context_feature(out.hidden_states, draft.target_layer_ids) if block_size > 1 else None
    )  # (1, L, k·d)
    start = prompt_len
    stopped = bool(torch.isin(output_ids[0, start], stop_tokens))
    while start + 1 < max_length and not stopped:
        # 2. draft: [x_0, mask, …] → d_1..d_γ in one parallel pass (draft_block), or what an extension proposes
        block = Block(output_ids, start, min(block_size, max_length - start), target_hidden, target.output_head)
        proposal = propose(block)
        result.num_draft_passes += isinstance(proposal, DraftedProposal)
        block_ids = proposal.block_ids  # (1, L)

        # 3. verify: one target pass over [x_0, d_1, …]
        out = target(
            block_ids,
            position_ids[:, start : start + block_ids.shape[1]],
            target_cache,
            output_hidden_states=block_size > 1,
        )
        result.num_target_passes += 1
        verified_length = target_cache.get_seq_length()  # for observers: the cache as the verify left it

        # 4. accept: τ by cumprod, the bonus, and what is committed (a stop token ends the step)
        tau, bonus, posterior = verify_block(
            block_ids[:, 1:], out.logits, proposal.draft_probs, temperature, top_p, top_k, verifier, proposal.candidates
        )
        output_ids[:, start : start + tau + 1] = block_ids[:, : tau + 1]
        output_ids[:, start + tau + 1] = bonus
        produced, stopped = _committed(output_ids, start, tau, max_length, stop_tokens)

        # 5. crop the target cache to the committed tokens; their features are the next context
        target_cache.crop(start + produced)  # rejected K/V go
        if block_size > 1:
            target_hidden = committed_features(out.hidden_states, draft.target_layer_ids, produced)
        result.add_step(tau, produced)
        if on_step is not None:
            index = len(result.acceptance_lengths) - 1
            on_step(
                Step(index, block, proposal, posterior, tau, int(bonus), produced, verified_length, draft_cache,
                     target_cache)
            )  # fmt: skip
        start += produced

    result.output_ids = output_ids[:, : min(start + 1, max_length)]
    return result


def draft_block(
    draft, target, draft_cache, temperature: float, top_p: float, top_k: int, verifier: str, block: Block
) -> Proposal:
    """Stage 2, the paper's: one parallel pass of the draft over [x_0, mask, …, mask], the new context
    features injected as K/V, then its cache cropped back to `start`; d_1..d_γ from the pass's
    positions 1..γ (`draft.choose_tokens`). A block of 1 (b = 1) proposes nothing and needs no pass."""
    block_ids = block.ids()  # (1, L_q)
    if block.size == 1:
        return Proposal(block_ids)
    start, ctx_len = block.start, block.target_hidden.shape[1]  # L_c new context positions
    noise = target.embed(block_ids) * draft.config.input_embedding_scale  # (1, L_q, d)
    positions = torch.arange(start - ctx_len, start + block.size, device=block_ids.device)[None]  # (1, L_c + L_q)
    cached = draft_cache.get_seq_length()
    hidden = draft(positions, noise_embedding=noise, target_hidden=block.target_hidden, past_key_values=draft_cache)
    hidden = hidden[:, 1:]  # (1, γ, d): position 0 is x_0, known
    cache_lengths = (cached, draft_cache.get_seq_length())
    draft_cache.crop(start)  # the block's K/V go; the context's stay
    draft_logits = draft.compute_logits(hidden, block.head)  # (1, γ, V)
    sampled = temperature > 0 and verifier == "rejection"  # "match" takes the draft's greedy proposals
    block_ids[:, 1:], draft_probs, candidates = draft.choose_tokens(
        hidden, draft_logits, block_ids[:, 0], temperature if sampled else 0.0, top_p, top_k
    )
    return DraftedProposal(
        block_ids, draft_probs, candidates,
        drafted=block_ids.clone(), context_length=ctx_len, cache_lengths=cache_lengths,
        hidden=hidden, logits=draft_logits, draft=draft,
    )  # fmt: skip


def _draft_proposer(draft, target, draft_cache, temperature, top_p, top_k, verifier) -> Proposer:
    """`draft_block` with this run's draft, cache and sampling settings: the `propose` extensions wrap. It
    keeps where its cache's context ends, and refuses a block whose features do not start there (an
    extension answered a step without the draft and dropped that step's features)."""
    fed = 0  # the draft cache holds the context of positions 0 … fed − 1

    def propose(block: Block) -> Proposal:
        nonlocal fed
        if block.size > 1 and block.start - block.target_hidden.shape[1] != fed:
            raise ValueError(
                f"stage 2: the draft pass at position {block.start} was given context features from position "
                f"{block.start - block.target_hidden.shape[1]}, but its cache holds the context up to {fed}: an "
                "extension that answers a step without the draft must hand that step's features "
                "(Block.target_hidden) on to the next draft pass, as extensions/prompt_lookup.py does"
            )
        proposal = draft_block(draft, target, draft_cache, temperature, top_p, top_k, verifier, block)
        if isinstance(proposal, DraftedProposal):
            fed = block.start
        return proposal

    return propose


def committed_features(hidden_states, layer_ids, produced: int) -> torch.Tensor:
    """Stage 5's new context: the features of the verified positions whose tokens were committed, x_0 and the τ
    accepted (`produced` of them), never those of the rejected proposals → (1, produced, k·d)."""
    return extract_context_feature(hidden_states, layer_ids)[:, :produced]


def _check_arguments(
    draft, target, input_ids, max_new_tokens, stop_token_ids, temperature, top_p, top_k, block_size, verifier
) -> int:
    """Refuse what cannot be decoded, before any compute (compat.py); → the block size to use."""
    check_pair(draft, target)
    if not callable(getattr(draft, "choose_tokens", None)):
        raise TypeError(
            f"{type(draft).__name__} has no choose_tokens(hidden, logits, anchor, temperature, top_p, top_k), the "
            "rule that turns a draft pass's logits into proposals (DFlashDraftModel's; a wrapper passes it on)"
        )
    check_sampling(temperature, top_p, top_k)
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {VERIFIERS}")
    block_size = draft.block_size if block_size is None else block_size
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer ≥ 1, got {block_size!r}")
    max_positions = min(target.config.max_position_embeddings, draft.config.max_position_embeddings)
    check_request(input_ids, max_new_tokens, max_positions, target.config.vocab_size, stop_token_ids)
    return block_size


def _committed(
    output_ids: torch.Tensor, start: int, tau: int, max_length: int, stop_tokens: torch.Tensor
) -> tuple[int, bool]:
    """(tokens committed after x_0, stopped): τ + 1, clipped by the length limit, and cut just after
    the first stop token among them (a stop token anywhere in the accepted run ends the output)."""
    produced = min(tau + 1, max_length - start - 1)
    hits = torch.isin(output_ids[0, start + 1 : start + produced + 1], stop_tokens).nonzero()
    if hits.numel():
        return int(hits[0, 0]) + 1, True
    return produced, False
