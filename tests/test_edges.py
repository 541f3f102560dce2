"""Edge cases of `spec_generate`: lengths, stop tokens, the mask token, clear errors, the output.

Each edge is one test. Greedy runs are compared with `generate` (the target alone); the oracle
draft (`dflash_ref.drafts.oracle.OracleDraft`) places stop tokens exactly: inside an accepted run, or as
the bonus token. Errors are ValueError subclasses raised before any model compute (checked with
forward pre-hooks that count every call of the target and the draft).
"""

from __future__ import annotations

import contextlib
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import draft_config, make_pair, randomize_, target_config

from dflash_ref import Qwen3Target, generate, spec_generate
from dflash_ref.compat import IncompatibleModels
from dflash_ref.dflash2 import make_draft
from dflash_ref.drafts.oracle import OracleDraft
from dflash_ref.trace import StepLog

VOCAB = 24


pytestmark = pytest.mark.usefixtures("one_thread_module")


def pair(seed: int = 0, block_size: int = 4, vocab: int = VOCAB, **draft_overrides):
    return make_pair(seed, dict(vocab_size=vocab), dict(block_size=block_size, **draft_overrides))


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor([tokens])


def tokens(out) -> list[int]:
    return out.output_ids[0].tolist()


def records(draft, target, prompt, n, **kw) -> tuple:
    steps = StepLog()
    out = spec_generate(draft, target, prompt, n, on_step=steps, **kw)
    return out, steps


@contextlib.contextmanager
def count_forward(*modules):
    """Counts forward calls of `modules` (and everything below them)."""
    calls = Counter()
    handles = [
        m.register_forward_pre_hook(lambda mod, args, i=i: calls.update([i]))
        for i, module in enumerate(modules)
        for m in module.modules()
    ]
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def first_occurrence_at(seq: list[int], lo: int, hi: int) -> int | None:
    """An index j in [lo, hi] whose token does not occur earlier in `seq`."""
    for j in range(lo, hi + 1):
        if seq[j] not in seq[:j]:
            return j
    return None


# ---------------------------------------------------------------------------------------------
# Lengths
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling", [dict(), dict(temperature=1.0, verifier="rejection"), dict(temperature=1.0, verifier="match")]
)
@pytest.mark.parametrize("block_size", [1, 4])
def test_zero_new_tokens_returns_prompt(sampling, block_size):
    target, draft = pair(1)
    prompt = ids(3, 1, 4)
    out = spec_generate(draft, target, prompt, 0, stop_token_ids=[0], block_size=block_size, **sampling)
    assert torch.equal(out.output_ids, prompt)
    assert out.num_output_tokens == 0
    assert out.acceptance_lengths == [] and out.tokens_per_step == [] and out.num_draft_passes == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_new_token_equals_ar(seed):
    target, draft = pair(seed, block_size=8)
    prompt = ids(5, 2)
    out = spec_generate(draft, target, prompt, 1)
    assert out.num_output_tokens == 1
    assert tokens(out) == tokens(generate(target, prompt, 1))
    assert out.num_draft_passes == 0 and out.num_target_passes == 1  # the prefill alone
    for verifier in ("rejection", "match"):
        torch.manual_seed(seed)
        sampled = spec_generate(draft, target, prompt, 1, temperature=1.0, verifier=verifier)
        torch.manual_seed(seed)
        assert tokens(sampled) == tokens(generate(target, prompt, 1, temperature=1.0))


@pytest.mark.parametrize("n", [2, 3, 7, 11, 14])
def test_length_not_a_multiple_of_the_block(n):
    """n − 1 tokens after the prefill's, blocks of 4: the last block shrinks to what is left, the
    output is exactly prompt + n long, and equals AR (full acceptance and a random draft)."""
    block = 4
    target, draft = pair(2, block_size=block)
    prompt = ids(7, 7, 1)
    ar = generate(target, prompt, n)
    out, steps = records(OracleDraft(draft, ar.output_ids[0]), target, prompt, n)
    assert tokens(out) == tokens(ar)
    assert out.output_ids.shape[1] == prompt.shape[1] + n
    max_length = prompt.shape[1] + n
    for rec in steps:
        assert len(rec.block_ids) == min(block, max_length - rec.start)  # L_q shrinks at the end
    assert [len(r.block_ids) for r in steps[:-1]] == [block] * (len(steps) - 1)
    if (n - 1) % block:
        assert len(steps[-1].block_ids) < block
    assert sum(r.produced for r in steps) == n - 1
    # a random draft (mostly rejected) and sampled runs: still exactly prompt + n tokens
    assert tokens(spec_generate(draft, target, prompt, n)) == tokens(ar)
    for verifier in ("rejection", "match"):
        sampled = spec_generate(draft, target, prompt, n, temperature=1.0, verifier=verifier)
        assert sampled.output_ids.shape[1] == max_length


def test_generation_up_to_the_position_limit():
    """prompt + max_new_tokens == max_position_embeddings is allowed (the last token is never fed)."""
    tc = target_config(vocab_size=VOCAB, max_position_embeddings=16)
    target = randomize_(Qwen3Target(tc), 0)
    draft = randomize_(make_draft(draft_config(tc, block_size=4)), 1)
    prompt = ids(1, 2, 3, 4)
    out = spec_generate(draft, target, prompt, 12)
    assert out.output_ids.shape[1] == 16
    assert tokens(out) == tokens(generate(target, prompt, 12))


def test_int32_prompt_is_accepted():
    target, draft = pair(3)
    out = spec_generate(draft, target, ids(4, 5, 6).int(), 9)
    assert out.output_ids.dtype == torch.long
    assert tokens(out) == tokens(generate(target, ids(4, 5, 6), 9))


# ---------------------------------------------------------------------------------------------
# Stop tokens
# ---------------------------------------------------------------------------------------------


def test_stop_token_at_first_generated_position():
    target, draft = pair(4)
    prompt = ids(2, 8, 3)
    first = tokens(generate(target, prompt, 1))[-1]
    out = spec_generate(draft, target, prompt, 20, stop_token_ids=[first])
    assert tokens(out) == [2, 8, 3, first]
    assert out.acceptance_lengths == [] and out.num_target_passes == 1 and out.num_draft_passes == 0
    oracle = OracleDraft(draft, generate(target, prompt, 20).output_ids[0])
    assert tokens(spec_generate(oracle, target, prompt, 20, stop_token_ids=[first])) == [2, 8, 3, first]


def _pair_with_fresh_token(lo: int, hi: int, block: int = 8, n: int = 24):
    """A pair whose greedy continuation g (new tokens) has a token at j ∈ [lo, hi] not seen before."""
    prompt = ids(1, 6)
    for seed in range(40):
        target, draft = pair(seed, block_size=block)
        g = tokens(generate(target, prompt, n))[prompt.shape[1] :]
        j = first_occurrence_at(g, lo, hi)
        if j is not None:
            return target, draft, prompt, g, j
    raise AssertionError("no seed gives a suitable continuation")


def test_stop_token_inside_an_accepted_run():
    """Full acceptance of the first block [g_0, g_1..g_7] (τ = 7), stop token g_j, 2 ≤ j ≤ 5: the
    output stops right after it, includes it, and equals AR truncated there."""
    target, draft, prompt, g, j = _pair_with_fresh_token(2, 5)
    stop = g[j]
    full = generate(target, prompt, 24).output_ids[0]
    out, steps = records(OracleDraft(draft, full), target, prompt, 24, stop_token_ids=[stop])
    expected = prompt[0].tolist() + g[: j + 1]
    assert tokens(out) == expected == tokens(generate(target, prompt, 24, stop_token_ids=[stop]))
    assert tokens(out)[-1] == stop
    assert out.acceptance_lengths == [7]  # the whole block was accepted ...
    assert out.tokens_per_step == [j]  # ... but only g_1..g_j are committed
    assert steps[0].draft_tokens[j - 1] == stop  # the stop token was a drafted, accepted token


@pytest.mark.parametrize("verifier", ["rejection", "match"])
def test_stop_token_as_the_bonus(verifier):
    """Force τ = j − 1 so that the target's bonus token is exactly the stop token g_j."""
    target, draft, prompt, g, j = _pair_with_fresh_token(2, 6)
    stop = g[j]
    full = generate(target, prompt, 24).output_ids[0]
    oracle = OracleDraft(draft, full, accept=[j - 1])
    out, steps = records(oracle, target, prompt, 24, stop_token_ids=[stop], verifier=verifier)
    assert tokens(out) == prompt[0].tolist() + g[: j + 1]
    assert tokens(out) == tokens(generate(target, prompt, 24, stop_token_ids=[stop]))
    assert out.acceptance_lengths == [j - 1] and out.tokens_per_step == [j]
    assert steps[0].bonus == stop and stop not in steps[0].draft_tokens[: j - 1]


def test_stop_token_never_generated_gives_full_length():
    target, draft = pair(5)
    prompt, n = ids(4, 4), 30
    ar = generate(target, prompt, n)
    unused = sorted(set(range(VOCAB)) - set(tokens(ar)[prompt.shape[1] :]))
    assert unused, "every token was generated: pick another seed"
    out = spec_generate(draft, target, prompt, n, stop_token_ids=unused[:2])
    assert out.num_output_tokens == n and tokens(out) == tokens(ar)
    oracle = OracleDraft(draft, ar.output_ids[0])
    assert tokens(spec_generate(oracle, target, prompt, n, stop_token_ids=unused[:2])) == tokens(ar)


# ---------------------------------------------------------------------------------------------
# The mask token is an ordinary output token
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("oracle", [False, True])
def test_generated_mask_token_is_kept(oracle):
    """(The official code strips output tokens equal to mask_token_id.) Make the mask token one
    the target actually generates: the speculative output still equals AR and contains it."""
    prompt, n = ids(3, 9, 1), 30
    target, _ = pair(6)
    ar = generate(target, prompt, n)
    new = tokens(ar)[prompt.shape[1] :]
    mask = Counter(new).most_common(1)[0][0]
    _, draft = pair(6, mask_token_id=mask)
    assert draft.mask_token_id == mask
    if oracle:
        draft = OracleDraft(draft, ar.output_ids[0])
    out = spec_generate(draft, target, prompt, n)
    assert tokens(out) == tokens(ar)
    assert out.output_ids[0, prompt.shape[1] :].tolist().count(mask) == new.count(mask) >= 1


# ---------------------------------------------------------------------------------------------
# Clear errors, before any compute
# ---------------------------------------------------------------------------------------------

REQUEST_ERRORS = {
    "beyond max_position_embeddings": (dict(input_ids=ids(1, 2, 3), max_new_tokens=510), "max_position_embeddings"),
    "batch size > 1": (dict(input_ids=torch.zeros(2, 3, dtype=torch.long)), "batch size 2"),
    "empty prompt": (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), "empty prompt"),
    "1-d prompt": (dict(input_ids=torch.tensor([1, 2])), r"\(1, prompt_len\)"),
    "float ids": (dict(input_ids=torch.tensor([[1.0, 2.0]])), "integer token ids"),
    "id beyond vocabulary": (dict(input_ids=ids(1, 12)), r"prompt token ids must lie in 0\.\.11"),
    "negative id": (dict(input_ids=ids(-1, 2)), r"prompt token ids must lie in 0\.\.11"),
    "negative max_new_tokens": (dict(max_new_tokens=-1), "max_new_tokens"),
    "float max_new_tokens": (dict(max_new_tokens=3.0), "max_new_tokens"),
    "temperature < 0": (dict(temperature=-0.5), "temperature"),
    "temperature nan": (dict(temperature=float("nan")), "temperature"),
    "temperature inf": (dict(temperature=float("inf")), "temperature must be ≥ 0 and finite, got inf"),
    "top_p 0": (dict(top_p=0.0), "top_p"),
    "top_p > 1": (dict(top_p=1.5), "top_p"),
    "top_k < 0": (dict(top_k=-1), "top_k"),
    "stop token beyond vocabulary": (dict(stop_token_ids=[12]), "stop token id 12"),
    "negative stop token": (dict(stop_token_ids=[-1]), "stop token id -1"),
}
SPEC_ONLY_ERRORS = {
    "block_size 0": (dict(block_size=0), "block_size"),
    "block_size bool": (dict(block_size=True), "block_size"),
    "unknown verifier": (dict(verifier="greedy"), "unknown verifier 'greedy'"),
}


@pytest.fixture(scope="module")
def small_pair():
    return make_pair(7)  # vocab 12, max_position_embeddings 512 (conftest defaults)


def _call_kwargs(overrides: dict) -> dict:
    kw = dict(input_ids=ids(1, 2, 3), max_new_tokens=5)
    kw.update(overrides)
    return kw


@pytest.mark.parametrize("case", list(REQUEST_ERRORS) + list(SPEC_ONLY_ERRORS))
def test_spec_generate_rejects_bad_requests_before_compute(case, small_pair):
    target, draft = small_pair
    overrides, pattern = {**REQUEST_ERRORS, **SPEC_ONLY_ERRORS}[case]
    kw = _call_kwargs(overrides)
    with count_forward(target, draft) as calls, pytest.raises(ValueError, match=pattern):
        spec_generate(draft, target, kw.pop("input_ids"), kw.pop("max_new_tokens"), **kw)
    assert not calls, f"model compute ran before the error: {dict(calls)}"


@pytest.mark.parametrize("case", list(REQUEST_ERRORS))
def test_generate_rejects_the_same_requests(case, small_pair):
    target, _ = small_pair
    overrides, pattern = REQUEST_ERRORS[case]
    kw = _call_kwargs(overrides)
    with count_forward(target) as calls, pytest.raises(ValueError, match=pattern):
        generate(target, kw.pop("input_ids"), kw.pop("max_new_tokens"), **kw)
    assert not calls


def test_draft_position_limit_applies():
    """The draft's own max_position_embeddings (smaller than the target's) bounds the request."""
    tc = target_config(max_position_embeddings=32)
    target = randomize_(Qwen3Target(tc), 0)
    draft = randomize_(make_draft(draft_config(tc, max_position_embeddings=10)), 1)
    with pytest.raises(ValueError, match="max_position_embeddings = 10"):
        spec_generate(draft, target, ids(1, 2, 3), 8)
    assert spec_generate(draft, target, ids(1, 2, 3), 7).output_ids.shape[1] == 10


def _mismatched_draft(kind: str):
    tc = target_config()  # 4 layers, hidden 32, vocab 12
    target = randomize_(Qwen3Target(tc), 0)
    if kind == "hidden size":
        dc = draft_config(tc, hidden_size=16)
    elif kind == "vocabulary":
        dc = draft_config(tc, vocab_size=13)
    elif kind == "target_layer_ids beyond the target":
        dc = draft_config(tc, num_target_layers=8, target_layer_ids=[1, 6])
    elif kind == "num_target_layers":
        dc = draft_config(tc, num_target_layers=6)  # ids [1, 3] fit, the count does not
    else:
        dc = draft_config(tc)
    draft = randomize_(make_draft(dc), 1)
    if kind == "mask token outside the target vocabulary":
        draft.config.mask_token_id = 12  # only reachable by editing a built config
    if kind == "dtype":
        draft = draft.double()
    return target, draft


@pytest.mark.parametrize(
    "kind, pattern",
    [
        ("hidden size", "draft hidden_size 16 != target hidden_size 32"),
        ("vocabulary", "draft vocab_size 13 != target vocab_size 12"),
        ("target_layer_ids beyond the target", r"target_layer_ids \[1, 6\] include \[6\]"),
        ("num_target_layers", "num_target_layers"),
        ("mask token outside the target vocabulary", "mask_token_id 12 is outside the target vocabulary"),
        ("dtype", "draft is torch.float64 .* but target is torch.float32"),
    ],
)
def test_incompatible_draft_is_refused_before_compute(kind, pattern):
    target, draft = _mismatched_draft(kind)
    with count_forward(target, draft) as calls, pytest.raises(IncompatibleModels, match=pattern):
        spec_generate(draft, target, ids(1, 2, 3), 5)
    assert not calls
    assert issubclass(IncompatibleModels, ValueError)


@pytest.mark.parametrize(
    "bad, pattern",
    [
        ("noise_embedding", r"noise_embedding must be \(batch, block, 32\)"),
        ("target_hidden", r"target_hidden must be \(batch, ctx_len, 64\)"),
        ("position_ids", r"position_ids must be \(batch, ctx_len \+ block\) = \(·, 7\)"),
    ],
)
def test_draft_forward_names_the_wrong_tensor(bad, pattern, small_pair):
    _, draft = small_pair  # hidden 32, 2 target layers read (k·d = 64)
    d, k = draft.config.hidden_size, len(draft.target_layer_ids)
    kw = dict(
        position_ids=torch.arange(7)[None], noise_embedding=torch.randn(1, 4, d), target_hidden=torch.randn(1, 3, k * d)
    )
    kw[bad] = {
        "noise_embedding": torch.randn(1, 4, d + 1),
        "target_hidden": torch.randn(1, 3, k * d - 1),
        "position_ids": torch.arange(6)[None],
    }[bad]
    with pytest.raises(ValueError, match=pattern):
        draft(kw.pop("position_ids"), **kw)


# ---------------------------------------------------------------------------------------------
# The output dataclass
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("accept, stop", [(None, None), ([3, 0, 1, 2, 0, 3, 1], None), (1, "mid")])
def test_generation_output_bookkeeping(accept, stop):
    """num_output_tokens = new tokens; the first comes from the prefill, so tokens_per_step (one
    entry per decode step, τ + 1 clipped by the length limit or cut after a stop token) sums to
    num_output_tokens − 1; num_target_passes = steps + 1 (the prefill); one draft pass per step."""
    target, draft = pair(8, block_size=4)
    prompt, n = ids(2, 3, 5, 7), 17
    ar = generate(target, prompt, n)
    stops = [tokens(ar)[prompt.shape[1] + 9]] if stop else None
    out, steps = records(OracleDraft(draft, ar.output_ids[0], accept), target, prompt, n, stop_token_ids=stops)
    assert tokens(out) == tokens(generate(target, prompt, n, stop_token_ids=stops))
    assert out.num_input_tokens == prompt.shape[1]
    assert out.num_output_tokens == out.output_ids.shape[1] - prompt.shape[1]
    if stop is None:
        assert out.num_output_tokens == n
    else:
        assert out.num_output_tokens <= 10 and tokens(out)[-1] == stops[0]
    k = len(out.acceptance_lengths)
    assert len(out.tokens_per_step) == len(steps) == k
    assert sum(out.tokens_per_step) == out.num_output_tokens - 1
    assert out.num_target_passes == k + 1 and out.num_draft_passes == k
    assert out.mean_tokens_per_step == pytest.approx(sum(out.tokens_per_step) / k)
    for rec, tau, produced in zip(steps, out.acceptance_lengths, out.tokens_per_step):
        assert rec.acceptance_length == tau and rec.produced == produced
        assert 1 <= produced <= tau + 1  # clipped only at the end or by a stop
        assert rec.target_cache_after == rec.start + produced


def test_ar_output_bookkeeping_matches():
    """generate() fills the same fields: one token per step, τ = 0, passes = steps + 1."""
    target, _ = pair(9)
    out = generate(target, ids(1, 2), 12)
    assert out.num_output_tokens == 12 and out.tokens_per_step == [1] * 11
    assert out.acceptance_lengths == [0] * 11 and out.num_target_passes == 12


# ---------------------------------------------------------------------------------------------
# Defects these tests found, now fixed
# ---------------------------------------------------------------------------------------------


def test_zero_new_tokens_does_no_compute():
    target, draft = pair(10)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    with count_forward(target, draft) as calls:
        out = spec_generate(draft, target, ids(1, 2), 0, temperature=1.0)
    assert torch.equal(before, torch.get_rng_state()), "a random number was drawn"
    assert not calls and out.num_target_passes == generate(target, ids(1, 2), 0).num_target_passes == 0


def test_stop_token_ids_as_a_set():
    target, draft = pair(11)
    ar = generate(target, ids(1, 2), 20)
    stop = tokens(ar)[6]
    expected = tokens(generate(target, ids(1, 2), 20, stop_token_ids={stop}))
    assert tokens(spec_generate(draft, target, ids(1, 2), 20, stop_token_ids={stop})) == expected


@pytest.mark.parametrize("make", [np.int64, torch.tensor], ids=["numpy", "tensor"])
def test_integer_like_stop_token_is_not_called_out_of_vocabulary(make):
    target, draft = pair(12)
    plain = spec_generate(draft, target, ids(1, 2), 8, stop_token_ids=[5])
    assert torch.equal(
        spec_generate(draft, target, ids(1, 2), 8, stop_token_ids=[make(5)]).output_ids, plain.output_ids
    )


def test_ar_zero_new_tokens_returns_a_new_tensor():
    target, _ = pair(13)
    prompt = ids(1, 2, 3)
    out = generate(target, prompt, 0)
    assert out.output_ids is not prompt
