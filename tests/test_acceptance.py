"""Acceptance: τ = Σ_i Π_{j≤i} 1[d_j = posterior_{j−1}], the bonus token, and the two sampling verifiers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.acceptance import (
    acceptance_length,
    check_sampling,
    sample,
    sampling_probs,
    verify_greedy,
    verify_match,
    verify_rejection,
)


def row(values) -> torch.Tensor:
    return torch.tensor([values])


def one_hot_logits(tokens, vocab: int = 10) -> torch.Tensor:
    """(1, len, V) logits whose argmax at position i is tokens[i]."""
    logits = torch.zeros(1, len(tokens), vocab)
    logits[0, torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


# ---------------------------------------------------------------- τ and the greedy verifier


def test_acceptance_length_by_hand():
    # d = [5, 6, 7] vs posterior [5, 6, 9, x]: matches [1, 1, 0] → cumprod [1, 1, 0] → τ = 2
    assert acceptance_length(row([5, 6, 7]), row([5, 6, 9, 3])) == 2
    # first token wrong: cumprod [0, 0, 0] → τ = 0, even though positions 2 and 3 match
    assert acceptance_length(row([1, 6, 7]), row([5, 6, 7, 3])) == 0
    # all match → τ = γ = 3 (posterior_γ, the bonus position, is never compared)
    assert acceptance_length(row([5, 6, 7]), row([5, 6, 7, 8])) == 3
    # posterior of exactly γ entries also works
    assert acceptance_length(row([5, 6]), row([5, 6])) == 2
    # a later mismatch after a gap: [1, 0, 1] → τ = 1
    assert acceptance_length(row([4, 4, 4]), row([4, 0, 4, 4])) == 1


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_tau_is_the_longest_matching_prefix(data):
    gamma = data.draw(st.integers(1, 8))
    tokens = st.integers(0, 2)  # a tiny vocabulary: long matching runs are common
    draft = data.draw(st.lists(tokens, min_size=gamma, max_size=gamma))
    posterior = data.draw(st.lists(tokens, min_size=gamma + 1, max_size=gamma + 1))
    prefix = 0
    while prefix < gamma and draft[prefix] == posterior[prefix]:
        prefix += 1
    assert acceptance_length(row(draft), row(posterior)) == prefix


def test_verify_greedy_bonus_is_posterior_at_tau():
    # posterior = argmax = [5, 6, 9, 2]; d = [5, 6, 7] → τ = 2, bonus = posterior[2] = 9
    tau, bonus, posterior = verify_greedy(row([5, 6, 7]), one_hot_logits([5, 6, 9, 2]))
    assert (tau, int(bonus)) == (2, 9)
    assert posterior.tolist() == [[5, 6, 9, 2]]
    # all accepted: bonus is the target's token after the block, posterior[γ] = 2
    tau, bonus, _ = verify_greedy(row([5, 6, 9]), one_hot_logits([5, 6, 9, 2]))
    assert (tau, int(bonus)) == (3, 2)
    # none accepted: bonus is the target's own first token
    tau, bonus, _ = verify_greedy(row([0, 6, 9]), one_hot_logits([5, 6, 9, 2]))
    assert (tau, int(bonus)) == (0, 5)


def test_verify_match_with_deterministic_target_is_greedy():
    # one-hot target probabilities: the sampled posterior is the argmax, so "match" = greedy
    probs = torch.nn.functional.one_hot(torch.tensor([[5, 6, 9, 2]]), 10).float()
    tau, bonus, posterior = verify_match(row([5, 6, 7]), probs)
    assert (tau, int(bonus)) == (2, 9) and posterior.tolist() == [[5, 6, 9, 2]]


# ---------------------------------------------------------------- sampling_probs


def test_temperature_by_hand():
    # logits [0, 2 ln 2]: T = 1 → [1, 4]/5; T = 2 → [0, ln 2] → [1, 2]/3; T = ½ → [1, 16]/17
    logits = torch.tensor([0.0, 2 * math.log(2)])
    torch.testing.assert_close(sampling_probs(logits, 1.0), torch.tensor([0.2, 0.8]))
    torch.testing.assert_close(sampling_probs(logits, 2.0), torch.tensor([1 / 3, 2 / 3]))
    torch.testing.assert_close(sampling_probs(logits, 0.5), torch.tensor([1 / 17, 16 / 17]))
    assert sampling_probs(logits.to(torch.bfloat16), 1.0).dtype == torch.float32


def test_top_k_by_hand():
    # logits [1, 3, 2, 0], top_k = 2 keeps 3 and 2: softmax([3, 2]) = [e/(e + 1), 1/(e + 1)]
    #   = [0.7310586, 0.2689414]
    probs = sampling_probs(torch.tensor([1.0, 3.0, 2.0, 0.0]), 1.0, top_k=2)
    torch.testing.assert_close(probs, torch.tensor([0.0, 0.7310586, 0.2689414, 0.0]))
    assert int((probs > 0).sum()) == 2
    # top_k = 0 or ≥ V keeps everything
    for k in (0, 4, 9):
        assert int((sampling_probs(torch.tensor([1.0, 3.0, 2.0, 0.0]), 1.0, top_k=k) > 0).sum()) == 4


def test_top_k_keeps_exactly_k_tokens_under_ties():
    probs = sampling_probs(torch.tensor([2.0, 1.0, 1.0, 0.0]), 1.0, top_k=2)
    assert int((probs > 0).sum()) == 2


def test_top_p_nucleus_by_hand():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    # mass strictly above each sorted token: [0, 0.5, 0.8]; keep where that is < top_p
    # top_p = 0.6 → keep 0.5, 0.3 → renormalised [0.5, 0.3]/0.8 = [0.625, 0.375, 0]
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_p=0.6), torch.tensor([0.625, 0.375, 0.0]))
    # top_p = 0.5 → only the first (mass above it is 0 < 0.5; above the second is 0.5, not < 0.5)
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_p=0.5), torch.tensor([1.0, 0.0, 0.0]))
    # top_p = 0.1 still keeps the most likely token
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_p=0.1), torch.tensor([1.0, 0.0, 0.0]))
    # top_p = 0.85 → all three
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_p=0.85), torch.tensor([0.5, 0.3, 0.2]))
    # order is by probability, not by index: [0.2, 0.5, 0.3] with top_p 0.6 keeps indices 1, 2
    shuffled = torch.log(torch.tensor([0.2, 0.5, 0.3]))
    torch.testing.assert_close(sampling_probs(shuffled, 1.0, top_p=0.6), torch.tensor([0.0, 0.625, 0.375]))


def test_top_k_then_top_p_by_hand():
    # probs ∝ [4, 3, 2, 1] (logits ln of these); top_k = 3 → [4, 3, 2]/9 = [0.444, 0.333, 0.222]
    # top_p = 0.7: mass above = [0, 0.444, 0.778] → keep first two → [4, 3]/7
    logits = torch.log(torch.tensor([4.0, 3.0, 2.0, 1.0]))
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_p=0.7, top_k=3), torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.integers(-20, 20).map(lambda v: v / 2), min_size=2, max_size=12),
    temperature=st.sampled_from([0.25, 0.7, 1.0, 3.0]),
    top_p=st.floats(0.01, 1.0),
    top_k=st.integers(0, 14),
)
def test_probabilities_sum_to_one_and_agree_with_official(logits, temperature, top_p, top_k):
    x = torch.tensor([logits, logits[::-1]])
    probs = sampling_probs(x, temperature, top_p, top_k)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
    assert (probs >= 0).all()
    # a most likely token always survives the filters
    full = torch.softmax(x / temperature, dim=-1)
    assert ((probs > 0) & (full == full.max(-1, keepdim=True).values)).any(-1).all()
    official = pytest.importorskip("dflash.model")
    # top_k ties included (both keep exactly the k tokens torch.topk picks); under a nucleus
    # (top_p < 1) which of several tied tokens is cut depends on the sort order, so not compared
    if top_p == 1.0 or len(set(logits)) == len(logits):
        torch.testing.assert_close(probs, official._sampling_probs(x, temperature, top_p, top_k), rtol=1e-5, atol=1e-6)


def test_sample_is_argmax_at_temperature_zero():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 4.9]])
    assert sample(logits, 0.0).tolist() == [1, 0]
    torch.manual_seed(0)
    drawn = sample(logits, 1.0, top_k=1)  # top_k = 1 is argmax too
    assert drawn.tolist() == [1, 0]


@pytest.mark.parametrize("temperature", [1e-320, 1e-45, 1e-39])
def test_tiny_temperature_is_argmax_not_nan(temperature):
    """l / T overflows float32 here (and T itself rounds to 0 in float32): the limit, argmax, ties shared."""
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 5.0], [-3.0, -2.0, float("-inf")]])
    probs = sampling_probs(logits, temperature)
    assert probs.tolist() == [[0.0, 1.0, 0.0], [0.5, 0.0, 0.5], [0.0, 1.0, 0.0]]
    assert sampling_probs(logits, temperature, top_k=1)[0].tolist() == [0.0, 1.0, 0.0]
    # a row that overflows leaves the others as they were, bit for bit
    normal = 3 * torch.randn(1, 50, generator=torch.Generator().manual_seed(0))
    both = torch.cat([normal, torch.full((1, 50), 1e38)])  # 1e38 / 0.1 overflows
    assert torch.equal(sampling_probs(both, 0.1)[0], sampling_probs(normal, 0.1)[0])
    torch.manual_seed(0)
    assert sample(logits[:1], temperature).tolist() == [1]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(temperature=-0.1), "temperature must be ≥ 0"),
        (dict(temperature=float("nan")), "temperature must be ≥ 0"),
        (dict(temperature=1.0, top_p=0.0), r"top_p must lie in \(0, 1\]"),
        (dict(temperature=1.0, top_p=1.5), r"top_p must lie in \(0, 1\]"),
        (dict(temperature=1.0, top_p=float("nan")), r"top_p must lie in \(0, 1\]"),
        (dict(temperature=1.0, top_k=-1), "top_k must be an integer ≥ 0"),
        (dict(temperature=1.0, top_k=2.5), "top_k must be an integer ≥ 0"),
        (dict(temperature=1.0, top_k=True), "top_k must be an integer ≥ 0"),
        (dict(temperature=1.0, top_k="3"), "top_k must be an integer ≥ 0"),
    ],
)
def test_check_sampling_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_sampling(**kwargs)


def test_check_sampling_accepts_valid_settings():
    check_sampling(0.0)
    check_sampling(0.7, top_p=0.9, top_k=20)
    check_sampling(1.0, top_p=1.0, top_k=0)


# ---------------------------------------------------------------- rejection sampling


def random_probs(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(shape, generator=g) * 2, dim=-1)


@pytest.mark.parametrize("seed", range(20))
def test_identical_draft_and_target_accept_everything(seed):
    # u · q < p with p = q holds iff u < 1, and u ~ U[0, 1): every drafted token is accepted
    gamma, vocab = 5, 7
    target = random_probs((1, gamma + 1, vocab), seed)
    draft_probs = target[:, :gamma].clone()
    torch.manual_seed(seed)
    draft_tokens = torch.multinomial(draft_probs[0], 1).T  # (1, γ)
    tau, bonus = verify_rejection(draft_tokens, target, draft_probs)
    assert tau == gamma
    assert 0 <= int(bonus) < vocab


def test_zero_target_probability_rejects_and_residual_picks_the_bonus():
    # position 0: p = [0, .5, .5, 0], q = [.5, .5, 0, 0], d_1 = 0 has p(d) = 0 → u·q < 0 never → τ = 0
    # residual max(p − q, 0) = [0, 0, .5, 0] → normalised [0, 0, 1, 0]: the bonus is always 2
    target = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]])
    draft_probs = torch.tensor([[[0.5, 0.5, 0.0, 0.0]]])
    for seed in range(50):
        torch.manual_seed(seed)
        tau, bonus = verify_rejection(row([0]), target, draft_probs)
        assert (tau, int(bonus)) == (0, 2)


def test_bonus_is_never_the_rejected_token():
    # p_0 = [0, .6, .3, .1], q_1 = [.5, .4, .1, 0], d_1 = 0 (p(d) = 0): always rejected.
    # residual = max(p − q, 0) = [0, .2, .2, .1] → normalised [0, .4, .4, .2]
    target = torch.tensor([[[0.0, 0.6, 0.3, 0.1], [1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]])
    draft_probs = torch.tensor([[[0.5, 0.4, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]]])
    counts = torch.zeros(4)
    torch.manual_seed(1234)
    for _ in range(2000):
        tau, bonus = verify_rejection(row([0, 1]), target, draft_probs)
        assert tau == 0
        counts[int(bonus)] += 1
    assert counts[0] == 0  # the rejected token never comes back
    freq = counts / counts.sum()
    # binomial std at n = 2000 is ≤ 0.011; 0.05 is > 4σ
    torch.testing.assert_close(freq, torch.tensor([0.0, 0.4, 0.4, 0.2]), rtol=0, atol=0.05)


def test_rejection_sampling_is_lossless_for_one_token():
    # γ = 1, p = [.2, .5, .3], q = [.6, .2, .2]. By hand:
    #   accept x with q(x)·min(1, p(x)/q(x)): [.6·⅓, .2·1, .2·1] = [.2, .2, .2] (reject mass .4)
    #   residual max(p − q, 0) = [0, .3, .1] → [0, .75, .25]; · .4 = [0, .3, .1]
    #   total [.2, .5, .3] = p: the emitted token is distributed exactly as the target's
    p = torch.tensor([0.2, 0.5, 0.3])
    q = torch.tensor([0.6, 0.2, 0.2])
    target = torch.stack([p, torch.tensor([1.0, 0.0, 0.0])])[None]
    counts = torch.zeros(3)
    torch.manual_seed(7)
    n = 4000
    for _ in range(n):
        d = torch.multinomial(q, 1)
        tau, bonus = verify_rejection(d[None], target, q[None, None])
        counts[int(d) if tau == 1 else int(bonus)] += 1
    torch.testing.assert_close(counts / n, p, rtol=0, atol=0.035)  # std ≤ 0.008 at n = 4000


def test_all_accepted_bonus_comes_from_the_last_target_row():
    # p == q and the last target row is one-hot on token 3: bonus is 3
    target = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]])
    for seed in range(10):
        torch.manual_seed(seed)
        tau, bonus = verify_rejection(row([1]), target, target[:, :1])
        assert (tau, int(bonus)) == (1, 3)


@pytest.mark.parametrize("seed", range(10))
def test_rejection_matches_official_with_the_same_seed(seed):
    official = pytest.importorskip("dflash.model")
    gamma, vocab = 4, 6
    target = random_probs((1, gamma + 1, vocab), seed)
    draft_probs = random_probs((1, gamma, vocab), seed + 100)
    torch.manual_seed(seed)
    draft_tokens = torch.multinomial(draft_probs[0], 1).T
    torch.manual_seed(seed + 1)
    ours = verify_rejection(draft_tokens, target, draft_probs)
    torch.manual_seed(seed + 1)
    theirs = official._rejection_sample(draft_tokens, target, draft_probs)
    assert (ours[0], int(ours[1])) == (theirs[0], int(theirs[1]))
