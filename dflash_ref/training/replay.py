"""On-policy error replay (`train --replay ρ`): train more on the blocks the draft itself gets wrong, at
the anchors greedy decoding with it would actually visit.

Our reading of Draft-OPD (arXiv 2605.29343: target-assisted rollouts, drafting replayed from the
positions verification exposes as errors), for a DFlash draft trained on the target's own greedy
responses. No code of theirs is used; no DFlash training recipe with it is published.

For a training sequence x (prompt + the target's greedy response) and the draft as it is now:

    L_a      = the leading proposals of the block anchored at a that equal x_{a+1} … (teacher_forced.py;
               on the target's greedy response that is what greedy verification keeps)
    visited  a_0 = first response position,  a_{i+1} = a_i + L_{a_i} + 1        (the anchors greedy
               decoding with this draft starts its steps at: a rollout of the target, assisted by the draft,
               is the target's own response, so it needs no decoding, only L at every anchor)
    errors   E(x) = { a ∈ visited : L_a < b − 1 }                              (a step that rejected a proposal)

Every `--replay-every` steps the errors of `--replay-sequences` training sequences, drawn at random, are
found anew with the current draft (one no-grad draft pass per sequence, with the features training
already holds). Each optimiser step then takes round(ρ · batch) of its sequences from those with errors,
their anchors being their errors (at most m, topped up with uniform ones to m); the other sequences of
the batch are drawn as without replay. The labels stay the target's tokens, so the loss is the recipe's:
only where it is taken changes. With ρ = 0 (the default) nothing is drawn differently.

The responses are the target's greedy ones as its bf16 copy wrote them (distill.py's default), so the walk
is greedy decoding's up to the steps where the fp32 target would have chosen another token.

Departure from the paper: DFlash proposes a whole block in parallel from the committed prefix, so the
states the draft induces are only *which* anchors decoding visits (a draft's wrong proposal never
becomes the prefix of a later proposal); that is what is replayed. Draft-OPD also trains on the target's
distribution at those states; here only its greedy token (the data holds no target distributions).
"""

from __future__ import annotations

import torch

from .recipe import sample_anchors
from .teacher_forced import draft_proposals, every_anchor, leading_count


def visited_errors(leads: torch.Tensor, first: int, block_size: int) -> list[int]:
    """leads (m,): L_a for the anchors first, first + 1, …, first + m − 1 → the anchors greedy decoding
    visits (a_{i+1} = a_i + L_{a_i} + 1) whose block was not accepted whole (L_a < b − 1)."""
    errors, a = [], first
    while a - first < len(leads):
        accepted = int(leads[a - first])
        if accepted < block_size - 1:
            errors.append(a)
        a += accepted + 1
    return errors


@torch.no_grad()
def sequence_errors(draft, target, token_ids: torch.Tensor, features: torch.Tensor, prompt_len: int) -> list[int]:
    """E(x) for one training sequence (1, T) with its features (1, T, k·d), the draft as it is now (in
    fp32, in eval mode: its proposals as decoding makes them)."""
    b = draft.block_size
    anchors = every_anchor(prompt_len, token_ids.shape[1], b)  # (m,) a, a + 1, …
    if len(anchors) == 0:
        return []
    proposals = draft_proposals(draft, target, token_ids, features.float(), anchors)  # (m, b − 1)
    wanted = token_ids[0, anchors[:, None] + torch.arange(1, b)[None, :]]  # (m, b − 1) x_{a+k}
    return visited_errors(leading_count(proposals, wanted), int(anchors[0]), b)


def find_errors(draft, target, data, feats, count: int, generator: torch.Generator) -> dict[int, list[int]]:
    """E(x) of `count` training sequences drawn with `generator` (data: [(prompt_len, ids (1, T))], feats
    their features) → {sequence index: its error anchors}, sequences without errors left out."""
    was_training = draft.training
    draft.eval()
    picks = torch.randperm(len(data), generator=generator)[:count].tolist()
    found = {i: sequence_errors(draft, target, data[i][1], feats[i], data[i][0]) for i in sorted(picks)}
    draft.train(was_training)
    return {i: errors for i, errors in found.items() if errors}


def replay_batch(
    errors: dict[int, list[int]],
    data,
    batch: int,
    share: float,
    anchors: int,
    block_size: int,
    generator: torch.Generator,
) -> list[tuple[int, torch.Tensor]]:
    """round(share · batch) sequences drawn from `errors`' (none while it is empty), each with its error
    anchors (a random `anchors` of them if more) topped up with uniform ones to `anchors` → [(index,
    sorted anchors)]. The rest of the batch is the caller's."""
    if not errors:
        return []
    keys = sorted(errors)
    picked = []
    for pick in torch.randint(len(keys), (round(share * batch),), generator=generator).tolist():
        i = keys[pick]
        mine = torch.tensor(errors[i])
        mine = mine[torch.randperm(len(mine), generator=generator)[:anchors]]
        prompt_len, ids = data[i]
        uniform = sample_anchors(prompt_len, ids.shape[1], block_size, anchors, generator)
        extra = uniform[~torch.isin(uniform, mine)][: anchors - len(mine)]
        picked.append((i, torch.cat([mine, extra]).sort().values))
    return picked
