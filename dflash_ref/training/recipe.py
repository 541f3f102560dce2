"""Training a DFlash draft: the paper's recipe (arXiv 2602.06036), every choice in one module.

Data: a sequence x_0 … x_{T−1} (prompt + the target's own response) and the target's features
target_hidden (T, k·d) of the sampled layers at every position (computed once, no gradient: features.py).

    anchors   m positions a_j in the response, a_j + b − 1 ≤ T − 1, resampled at every step
    block j   [x_{a_j}, mask, …, mask] at positions a_j … a_j + b − 1; labels x_{a_j+1} … x_{a_j+b−1}
    context   the features of positions p < a_j: exactly what inference holds when x_{a_j} is the
              last committed token (its own features are not known yet)
    one pass  queries = the m·b block positions; keys = [C at all T positions; the m blocks];
              block j sees context key p iff p < a_j and the keys of its own block (bidirectional),
              nothing of the other blocks                                    (block_mask)
              (a causal or sliding-window layer narrows that by its own rule on the positions, as
              inference applies it; the official drafts have none                (block_masks))
    loss      Σ_j Σ_{k=1}^{b−1} w_k · CE(logits_{j,k}, x_{a_j+k}) / (m · Σ_k w_k),
              w_k = exp(−(k − 1)/γ), γ = 7 for b = 16, 5 for b = 10, 4 for b = 8 (the paper's; any
              other b > 2 must be given its γ: training/driver.py takes γ = 4 for b = 4)
    DFlash 2  the convolutions restart at every block of the pass (draft(…, blocks=m)), and the loss
              adds the selector's, teacher-forced: L + L_sel (selector_loss.py)
    frozen    the target's embedding (noise embedding) and lm_head, shared with the draft
    optimiser AdamW, linear warmup then cosine decay to 0, gradient-norm clipping; one step averages
              the loss of several sequences (a batch), each with its own m anchors

Departure for CPU budgets (optional, `vocab=`; sampled_softmax.py): the loss's softmax normaliser is estimated instead
of summed over all V. On a CPU the (m·(b − 1), d) × (d, V) product is most of a step. The sum runs
over the tokens of the training responses R (all labels are among them) plus K tokens drawn
uniformly, every step, from the other V − |R|, each counted (V − |R|)/K times:

    Z ≈ Σ_{v∈R} e^{z_v} + (V − |R|)/K · Σ_{v∈sample} e^{z_v}      (log-weight log((V − |R|)/K))

an unbiased estimate of Z; its log, which the loss takes, is biased low (E log Ẑ ≤ log E Ẑ), the
less the more of Z lies in R.

Without the sampled part (softmax over R alone) tokens outside R are never pushed down, and the
trained draft proposes them at inference (measured: nothing accepted). At inference the draft proposes
among R (its draft vocabulary, extensions/draft_vocab.py) or over all V; the target verifies either way.

The inference draft with its KV cache gives the same logits for a block (tests/test_training.py).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..attention import position_rule
from ..dflash2 import selector_of
from .sampled_softmax import positions_in, with_log_weight
from .selector_loss import selector_loss
from .soft_labels import block_soft_targets, soft_label_loss

PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def loss_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """w_k = exp(−(k − 1)/γ) for k = 1 … b − 1: early block positions count most."""
    if block_size < 2:
        raise ValueError(f"a block of {block_size} has no position to predict: training needs block_size ≥ 2")
    if gamma is None:
        if block_size == 2:  # one weight, w_1 = 1, whatever γ
            gamma = 1.0
        elif block_size not in PAPER_GAMMA:
            raise ValueError(
                f"the paper gives γ for block sizes {sorted(PAPER_GAMMA)}; pass gamma for block size {block_size}"
            )
        else:
            gamma = PAPER_GAMMA[block_size]
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)  # (b − 1,)


def sample_anchors(
    prompt_len: int, seq_len: int, block_size: int, num_anchors: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Up to `num_anchors` distinct sorted anchors in [max(prompt_len, 1), seq_len − block_size]."""
    first, last = max(prompt_len, 1), seq_len - block_size
    if last < first:
        raise ValueError(
            f"a sequence of {seq_len} tokens with a {prompt_len}-token prompt has no room for a block of {block_size}"
        )
    candidates = torch.arange(first, last + 1)
    pick = torch.randperm(len(candidates), generator=generator)[:num_anchors]
    return candidates[pick].sort().values


def block_mask(anchors: torch.Tensor, block_size: int, ctx_len: int) -> torch.Tensor:
    """bool (m·b, ctx_len + m·b): block j sees context p < a_j and its own block, nothing else."""
    m = len(anchors)
    block_of_query = torch.arange(m).repeat_interleave(block_size)  # (m·b,)
    sees_context = torch.arange(ctx_len)[None, :] < anchors[block_of_query][:, None]  # (m·b, T)
    sees_block = block_of_query[:, None] == block_of_query[None, :]  # (m·b, m·b)
    return torch.cat([sees_context, sees_block], dim=1)


def block_masks(draft, anchors: torch.Tensor, block_size: int, position_ids: torch.Tensor):
    """block_mask narrowed, layer by layer, by each layer's own rule (a causal or sliding-window
    layer), evaluated on the positions as inference applies it to its cache, whose key i is position
    i: one bool (m·b, T + m·b) for all layers when none has a rule of its own, else a list of them.
    position_ids (T + m·b,): the context's positions, then the blocks'."""
    ctx_len = len(position_ids) - len(anchors) * block_size
    mask = block_mask(anchors, block_size, ctx_len)  # (m·b, T + m·b)
    starts = anchors.repeat_interleave(block_size)  # (m·b,) each query's block start
    rules = [
        position_rule(
            position_ids[ctx_len:],
            position_ids,
            is_causal=layer.self_attn.is_causal,
            sliding_window=layer.self_attn.sliding_window,
            block_start=starts if layer.self_attn.rotating else None,
        )
        for layer in draft.layers
    ]
    if all(rule is None for rule in rules):  # the official drafts: non-causal, full
        return mask
    return [mask if rule is None else mask & rule for rule in rules]


def training_hidden(
    draft, target, token_ids: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """All m blocks in one pass → the final hidden of their proposal positions (m, b − 1, d) and the
    labels (m, b − 1). A DFlash 2 draft's convolution restarts at every block of the pass."""
    b, seq_len = draft.block_size, token_ids.shape[1]
    offsets = torch.arange(b)
    block_positions = (anchors[:, None] + offsets[None, :]).reshape(-1)  # (m·b,)
    block_ids = torch.full_like(block_positions, draft.mask_token_id)
    block_ids[::b] = token_ids[0, anchors]  # x_{a_j} first, then masks
    with torch.no_grad():
        noise_embedding = target.embed(block_ids[None])  # (1, m·b, d), frozen
    position_ids = torch.cat([torch.arange(seq_len), block_positions])[None]  # (1, T + m·b)
    hidden = draft(
        position_ids,
        block_masks(draft, anchors, b, position_ids[0]),
        noise_embedding=noise_embedding,
        target_hidden=features,
        blocks=len(anchors),
    )  # (1, m·b, d)
    # contiguous: a strided input sends F.linear to a broadcast bmm, much slower than mm on a CPU
    hidden = hidden.reshape(len(anchors), b, -1)[:, 1:].contiguous()  # (m, b − 1, d)
    return hidden, token_ids[0, (anchors[:, None] + offsets[None, 1:])]  # labels (m, b − 1)


def output_logits(
    draft,
    target,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    vocab: torch.Tensor | None = None,
    vocab_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen lm_head on the proposal positions' hidden (m, b − 1, d) → logits (m, b − 1, V), or with
    `vocab` (V',) over those ids only, (m, b − 1, V'), the labels then indexing into `vocab` (they must
    be among the ids). `vocab_rows` (V', d) = the lm_head's rows of `vocab`, if already gathered."""
    if vocab is None:  # the frozen lm_head, detached: backward computes no gradient for its V × d matrix
        return draft.compute_logits(hidden, lambda h: F.linear(h, target.output_weight().detach())), labels
    labels = positions_in(vocab, labels)
    if (labels < 0).any():
        raise ValueError("a label is not in the training vocabulary; build it from every response trained on")
    if vocab_rows is None:
        vocab_rows = target.output_weight()[vocab.to(target.device)]  # (V', d), frozen rows
    return draft.compute_logits(hidden, lambda h: F.linear(h, vocab_rows.detach())), labels  # (m, b − 1, V')


def training_logits(
    draft,
    target,
    token_ids: torch.Tensor,
    features: torch.Tensor,
    anchors: torch.Tensor,
    vocab: torch.Tensor | None = None,
    vocab_log_weight: torch.Tensor | None = None,
    vocab_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """All m blocks in one pass → logits (m, b − 1, V) and labels (m, b − 1) (output_logits for `vocab`),
    plus `vocab_log_weight` (V',) if given."""
    hidden, labels = training_hidden(draft, target, token_ids, features, anchors)
    logits, labels = output_logits(draft, target, hidden, labels, vocab, vocab_rows)
    return with_log_weight(logits, vocab_log_weight), labels


def dflash_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Position-weighted cross-entropy: Σ w_k CE_{j,k} / (m Σ w_k)."""
    flat = logits.float().reshape(-1, logits.shape[-1])  # (m·(b − 1), V), rows contiguous
    ce = F.cross_entropy(flat, labels.reshape(-1), reduction="none").reshape(labels.shape)  # (m, b − 1)
    return (ce * weights).sum() / (len(labels) * weights.sum())


def warmup_cosine(step: int, total_steps: int, warmup_steps: int) -> float:
    """Learning-rate factor: linear 0 → 1 over the warmup, then cosine 1 → 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(draft, lr: float, total_steps: int, warmup_steps: int, weight_decay: float = 0.01):
    """AdamW over the draft's own trainable parameters (the target's are not among them) + the schedule."""
    optimizer = torch.optim.AdamW(
        [p for p in draft.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay
    )  # not a frozen module's (dflash2_modules.py)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_cosine(step, total_steps, warmup_steps))
    return optimizer, schedule


def train_step(
    draft,
    target,
    batch,
    weights: torch.Tensor,
    optimizer,
    schedule,
    max_grad_norm: float = 1.0,
    vocab: torch.Tensor | None = None,
    vocab_log_weight: torch.Tensor | None = None,
    bf16: bool = False,
    selector_detached: bool = False,
    soft_weight: float = 0.0,
) -> float:
    """One optimiser step on a batch of (token_ids (1, T), features (1, T, k·d), anchors (m,)[, soft]),
    the loss averaged over its sequences (each backpropagated alone: memory stays one sequence's).

    bf16=True runs the forward under autocast (matrix products in bf16, faster where the CPU has bf16
    instructions; weights, gradients and AdamW stay fp32, the CE is taken in fp32 on the
    bf16 logits): mixed precision. selector_detached=True takes a DFlash 2 selector's loss on the
    draft's detached hidden and logits (`train --modules conv`: dflash2_modules.py). soft_weight α > 0
    mixes in the soft labels each item then carries as SoftTargets (restricted to the loss's R):
    (1 − α) L_hard + α L_soft (soft_labels.py)."""
    draft.train()
    optimizer.zero_grad(set_to_none=True)
    rows = None if vocab is None else target.output_weight()[vocab.to(target.device)]  # (V', d), once
    if rows is not None and bf16:
        rows = rows.to(torch.bfloat16)  # cast once, not once per sequence by autocast
    total = 0.0
    for token_ids, features, anchors, *soft in batch:
        with torch.autocast(features.device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden, tokens = training_hidden(draft, target, token_ids, features, anchors)
            logits, labels = output_logits(draft, target, hidden, tokens, vocab, rows)
        weighted = with_log_weight(logits, vocab_log_weight)
        loss = dflash_loss(weighted, labels, weights)
        if soft_weight:
            if not soft:
                raise ValueError("soft_weight > 0 needs every batch item's SoftTargets (soft_labels.py)")
            soft_ids, soft_probs = block_soft_targets(soft[0], anchors, draft.block_size)  # (m, b − 1, K) each
            loss = (1 - soft_weight) * loss + soft_weight * soft_label_loss(
                weighted, soft_ids, soft_probs, weights, vocab
            )
        if selector_of(draft) is not None:  # DFlash 2: and its selector (selector_loss.py)
            previous = token_ids[0, anchors[:, None] + torch.arange(draft.block_size - 1)[None]]  # (m, b − 1)
            inputs = (hidden.detach(), logits.detach()) if selector_detached else (hidden, logits)
            loss = loss + selector_loss(draft.candidate_selector, *inputs, previous, tokens, weights, vocab)
        loss = loss / len(batch)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(draft.parameters(), max_grad_norm)
    optimizer.step()
    schedule.step()
    return total
