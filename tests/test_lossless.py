"""Losslessness: speculative decoding emits exactly what the target alone would.

    greedy:       spec_generate(draft, target, x, n) == generate(target, x, n)     (token for token)
    block 1:      no draft at all, so the same seed gives the same tokens, greedy or sampled
    temperature:  P_spec(y_1..y_n | x) == Π_t p_T(y_t | x, y_<t)                   (both verifiers)

The greedy claim is checked on many random tiny pairs. A random draft rarely agrees with the
target, so the same runs are repeated with `OracleDraft`, which forces exactly τ accepted draft
tokens per step: partial and full acceptance, clipped by the last (shrunk) block.

The sampling claim is checked by enumerating the target's exact distribution over every sequence
(V ≤ 4, 1-token prompt, 2–3 new tokens) and a chi-square goodness-of-fit test on a few thousand
speculative samples at a fixed seed. Power: the same test rejects two deliberately wrong samplers.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from conftest import gate_cuts, make_pair
from scipy.stats import chisquare

from dflash_ref import extract_context_feature, generate, sampling_probs, spec_generate
from dflash_ref.draft_model import DFlashDraftModel
from dflash_ref.drafts.oracle import OracleDraft
from dflash_ref.extensions import chosen_extensions

P_MIN = 1e-3  # chi-square threshold: fixed seeds make every p-value deterministic


pytestmark = pytest.mark.usefixtures("one_thread_module")


def new_tokens(out, prompt_len: int) -> list[int]:
    return out.output_ids[0, prompt_len:].tolist()


# ---------------------------------------------------------------------------------------------
# Greedy: many random configurations
# ---------------------------------------------------------------------------------------------


def random_case(seed: int) -> dict:
    """One random tiny configuration: sizes, GQA, block size (and override), prompt, n, stops."""
    rng = random.Random(seed)
    vocab = rng.randint(8, 32)
    t_layers, d_layers = rng.randint(2, 6), rng.randint(1, 3)
    hidden = rng.choice([16, 24, 32])
    t_heads = rng.choice([2, 4])
    t_kv = rng.choice([k for k in (1, 2, 4) if t_heads % k == 0])
    d_heads = rng.choice([2, 4])
    d_kv = rng.choice([k for k in (1, 2, 4) if d_heads % k == 0])
    # the official layer formula gives negative ids for 2-layer targets: choose them then
    layer_ids = sorted(rng.randrange(t_layers) for _ in range(d_layers)) if t_layers < 4 or rng.random() < 0.5 else []
    return dict(
        seed=seed,
        target=dict(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=t_layers,
            num_attention_heads=t_heads,
            num_key_value_heads=t_kv,
            head_dim=rng.choice([4, 8]),
        ),
        draft=dict(
            num_hidden_layers=d_layers,
            num_attention_heads=d_heads,
            num_key_value_heads=d_kv,
            head_dim=rng.choice([4, 8]),
            intermediate_size=rng.choice([16, 48]),
            block_size=rng.randint(2, 8),
            mask_token_id=rng.randrange(vocab),
            target_layer_ids=layer_ids,
        ),
        block_size=rng.choice([None, None, rng.randint(2, 8)]),
        prompt=[rng.randrange(vocab) for _ in range(rng.randint(1, 10))],
        max_new_tokens=rng.choice([0, 1, 2, rng.randint(3, 40), rng.randint(3, 40), rng.randint(3, 40)]),
        stop_kind=rng.choice(["none", "none", "random", "generated", "generated"]),
        accept=rng.choice(
            [
                None,
                rng.randint(0, 9),
                [rng.randint(0, 9) for _ in range(rng.randint(0, 12))],
                [rng.randint(0, 9) for _ in range(rng.randint(0, 12))],
            ]
        ),
        rng=rng,
    )


def expected_oracle_steps(
    prompt_len: int, n: int, block_size: int, accept, cont: list[int], stops: list[int]
) -> tuple[list[int], list[int]]:
    """(τ per step, tokens committed per step) when the oracle forces `accept` and the target's
    continuation is `cont`: τ = min(forced, L_q − 1); commit τ + 1, clipped by the length limit,
    cut right after the first stop token."""
    max_length, start, step = prompt_len + n, prompt_len, 0
    taus, produced_list = [], []
    stopped = n > 0 and cont[prompt_len] in stops
    while start + 1 < max_length and not stopped:
        q_len = min(block_size, max_length - start)
        forced = (
            (1 << 30)
            if accept is None
            else accept
            if isinstance(accept, int)
            else (accept[step] if step < len(accept) else 0)
        )
        tau = min(forced, q_len - 1)
        produced = min(tau + 1, max_length - start - 1)
        for j in range(1, produced + 1):
            if cont[start + j] in stops:
                produced, stopped = j, True
                break
        taus.append(tau)
        produced_list.append(produced)
        start, step = start + produced, step + 1
    return taus, produced_list


def check_bookkeeping(out, prompt_len: int) -> None:
    steps = len(out.acceptance_lengths)
    assert len(out.tokens_per_step) == steps
    # the prefill, then one verify per step; nothing at all when no token was asked for
    assert out.num_target_passes == (steps + 1 if out.num_output_tokens else 0)
    assert sum(out.tokens_per_step) == max(out.num_output_tokens - 1, 0)
    assert out.output_ids.shape[1] == prompt_len + out.num_output_tokens


@pytest.mark.parametrize("seed", range(60))
def test_greedy_spec_equals_ar_random_configs(seed):
    case = random_case(seed)
    rng = case["rng"]
    target, draft = make_pair(seed, case["target"], case["draft"])
    prompt = torch.tensor([case["prompt"]])
    n, P = case["max_new_tokens"], prompt.shape[1]
    block = case["block_size"] or case["draft"]["block_size"]

    full = generate(target, prompt, n)  # the continuation, no stop tokens
    cont = full.output_ids[0].tolist()
    vocab = case["target"]["vocab_size"]
    if case["stop_kind"] == "random":
        stops = rng.sample(range(vocab), rng.randint(1, 2))
    elif case["stop_kind"] == "generated" and n > 0:
        stops = [rng.choice(cont[P:])]
    else:
        stops = None
    ar = generate(target, prompt, n, stop_token_ids=stops)
    expected = ar.output_ids[0].tolist()

    spec = spec_generate(draft, target, prompt, n, stop_token_ids=stops, block_size=case["block_size"])
    assert spec.output_ids[0].tolist() == expected, f"random draft diverged from AR ({case})"
    check_bookkeeping(spec, P)

    oracle = OracleDraft(draft, cont, case["accept"])
    forced = spec_generate(oracle, target, prompt, n, stop_token_ids=stops, block_size=case["block_size"])
    assert forced.output_ids[0].tolist() == expected, f"oracle draft diverged from AR ({case})"
    taus, produced = expected_oracle_steps(P, n, block, case["accept"], cont, stops or [])
    assert forced.acceptance_lengths == taus
    assert forced.tokens_per_step == produced
    check_bookkeeping(forced, P)


@pytest.mark.parametrize("block_size", [2, 3, 5, 8])
def test_full_acceptance_commits_whole_blocks(block_size):
    """Oracle = the target's own greedy continuation: every step commits L_q tokens (τ = L_q − 1)."""
    target, draft = make_pair(3, dict(vocab_size=20), dict(block_size=block_size))
    prompt, n = torch.tensor([[4, 7, 1]]), 23
    ar = generate(target, prompt, n)
    out = spec_generate(OracleDraft(draft, ar.output_ids[0]), target, prompt, n)
    assert torch.equal(out.output_ids, ar.output_ids)
    assert all(t == block_size - 1 for t in out.acceptance_lengths[:-1])
    last_q_len = min(block_size, n - sum(out.tokens_per_step[:-1]))  # the last block shrinks
    assert out.acceptance_lengths[-1] == last_q_len - 1
    assert len(out.acceptance_lengths) == -(-(n - 1) // block_size)  # ⌈(n − 1) / block⌉ steps


def test_zero_acceptance_is_still_lossless():
    """A draft that is always wrong (τ = 0 every step) degrades to one token per step, same output."""
    target, draft = make_pair(4, dict(vocab_size=16), dict(block_size=6))
    prompt, n = torch.tensor([[2, 9]]), 15
    ar = generate(target, prompt, n)
    out = spec_generate(OracleDraft(draft, ar.output_ids[0], accept=0), target, prompt, n)
    assert torch.equal(out.output_ids, ar.output_ids)
    assert out.acceptance_lengths == [0] * (n - 1) and out.tokens_per_step == [1] * (n - 1)


@pytest.mark.parametrize("verifier", ["rejection", "match"])
@pytest.mark.parametrize("temperature", [1e-320, 1e-30])
def test_tiny_temperature_decodes_as_greedy(verifier, temperature):
    """As T → 0 sampling is argmax: a T whose l / T overflows float32 (1e-320) must decode as greedy, not
    fail; 1e-30, which does not overflow with these logits, is the control."""
    target, draft = make_pair(5, dict(vocab_size=20), dict(block_size=4))
    prompt, n = torch.tensor([[4, 7, 1]]), 17
    greedy = generate(target, prompt, n)
    torch.manual_seed(0)
    assert torch.equal(generate(target, prompt, n, temperature=temperature).output_ids, greedy.output_ids)
    oracle = OracleDraft(draft, greedy.output_ids[0], accept=2)
    out = spec_generate(oracle, target, prompt, n, temperature=temperature, verifier=verifier)
    assert torch.equal(out.output_ids, greedy.output_ids)
    assert max(out.acceptance_lengths) == 2


# ---------------------------------------------------------------------------------------------
# block_size 1 is autoregressive decoding
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier", ["rejection", "match"])
@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.8)],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_size_one_is_ar(verifier, sampling, seed):
    target, draft = make_pair(seed, dict(vocab_size=10 + seed), dict(block_size=4))
    prompt = torch.tensor([[seed % 7, 3, 5][: seed + 1]])
    stops = [3] if seed == 2 else None
    n = 25
    torch.manual_seed(100 + seed)
    ar = generate(target, prompt, n, stop_token_ids=stops, **sampling)
    torch.manual_seed(100 + seed)
    spec = spec_generate(draft, target, prompt, n, stop_token_ids=stops, block_size=1, verifier=verifier, **sampling)
    assert spec.output_ids.tolist() == ar.output_ids.tolist()
    assert spec.num_draft_passes == 0
    assert spec.acceptance_lengths == [0] * len(spec.acceptance_lengths)
    assert spec.num_target_passes == ar.num_target_passes


# ---------------------------------------------------------------------------------------------
# Temperature > 0: the exact distribution over whole sequences
# ---------------------------------------------------------------------------------------------

DIST_TARGET = dict(
    vocab_size=3,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
)
DIST_DRAFT = dict(intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)


@torch.inference_mode()
def exact_distribution(
    target, prompt: list[int], n: int, temperature: float, top_p: float = 1.0, top_k: int = 0, stops=()
) -> dict[tuple[int, ...], float]:
    """P(y_1..y_m | prompt) = Π_t p_T(y_t | prompt, y_<t), by running the target (no cache) on
    every prefix; sequences end at n tokens or right after a stop token. Zero-probability
    sequences (cut by top_k / top_p) are left out."""
    vocab, dist = target.config.vocab_size, {}

    def walk(prefix: list[int], prob: float) -> None:
        if len(prefix) == n or (prefix and prefix[-1] in stops):
            dist[tuple(prefix)] = prob
            return
        logits = target(torch.tensor([prompt + prefix]), output_hidden_states=False).logits[:, -1]
        p = sampling_probs(logits, temperature, top_p, top_k)[0].double().tolist()
        for token in range(vocab):
            if p[token] > 0:
                walk(prefix + [token], prob * p[token])

    walk([], 1.0)
    return dist


def chi_square_pvalue(samples: list[tuple[int, ...]], exact: dict[tuple[int, ...], float]) -> float:
    """Goodness of fit of the sampled sequences to `exact`; cells with expected count < 5 are
    merged (smallest first). A sequence `exact` gives probability 0 fails outright."""
    counts, n = Counter(samples), len(samples)
    impossible = set(counts) - set(exact)
    assert not impossible, f"sampled sequences the target never produces: {sorted(impossible)}"
    observed, expected, acc_o, acc_e = [], [], 0, 0.0
    for cell in sorted(exact, key=exact.get):
        acc_o, acc_e = acc_o + counts.get(cell, 0), acc_e + n * exact[cell]
        if acc_e >= 5:
            observed.append(acc_o)
            expected.append(acc_e)
            acc_o, acc_e = 0, 0.0
    if acc_e > 0:
        observed[-1] += acc_o
        expected[-1] += acc_e
    assert len(observed) >= 3, "too few cells for a meaningful test"
    total = sum(expected)
    return float(chisquare(observed, [e * n / total for e in expected]).pvalue)


class MimicDraft(torch.nn.Module):
    """A near-target draft for short runs: d_i's logits are `scale` × the target's own logits
    after the committed prefix + the target's greedy tokens, so q ≈ p: acceptance is frequent but
    the residual max(p − q, 0) is not empty. The prefix is rebuilt from the block's first token
    x_0 at each step (found by its embedding), so every earlier position must have been some
    step's x_0: true when n ≤ 3 (a step either finishes the run or accepts nothing).
    The real draft network still runs (cache handling unchanged); only the logits are replaced."""

    def __init__(self, draft, target, prompt: list[int], scale: float) -> None:
        super().__init__()
        self.draft, self.target, self.prompt, self.scale = draft, target, prompt, scale
        self.config = draft.config
        self._x0: dict[int, int] = {}  # position → token, for the current run
        self._prefix: list[int] = []
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}  # prefix → target logits (memo)

    block_size = property(lambda self: self.draft.block_size)
    mask_token_id = property(lambda self: self.draft.mask_token_id)
    target_layer_ids = property(lambda self: self.draft.target_layer_ids)

    def make_cache(self):
        self._x0 = {}  # spec_generate makes a fresh cache per run
        return self.draft.make_cache()

    def choose_tokens(self, *args):
        return DFlashDraftModel.choose_tokens(self.draft, *args)  # the argmax of its logits, or a draw (DFlash 1's)

    def forward(self, position_ids, attention_mask=None, **kwargs):
        hidden = self.draft(position_ids, attention_mask, **kwargs)
        noise = kwargs["noise_embedding"]  # (1, L_q, d)
        start = int(position_ids[0, -noise.shape[1]])
        table = self.target.model.embed_tokens.weight  # (V, d)
        self._x0[start] = int((table - noise[0, 0]).norm(dim=-1).argmin())  # block[0] is x_0
        self._prefix = self.prompt + [self._x0[i] for i in range(len(self.prompt), start + 1)]
        return hidden

    def compute_logits(self, hidden, output_head):
        prefix, rows = list(self._prefix), []
        for _ in range(hidden.shape[1]):
            key = tuple(prefix)
            if key not in self._logits:
                out = self.target(torch.tensor([prefix]), output_hidden_states=False)
                self._logits[key] = out.logits[0, -1]  # (V,)
            logits = self._logits[key]
            rows.append(self.scale * logits)
            prefix.append(int(logits.argmax()))
        return torch.stack(rows)[None]  # (1, γ, V)


# seed: the pair's seed; target_std: the target's weight scale (0.25: neither flat nor one-hot);
# draft: "random" (its own weights at scale `std`, far from the target), "oracle" (proposes the
# target's greedy path, q one-hot: accepted with probability p(greedy)), "mimic" (q ≈ p, soft).
DIST_CASES = {
    "far-draft-block-4": dict(seed=1, vocab=3, n=3, block=4, sampling=dict(temperature=1.0), draft="random", std=2.0),
    "oracle-draft-block-2-stop": dict(
        seed=2, vocab=3, n=3, block=2, sampling=dict(temperature=0.8), draft="oracle", stops=[0]
    ),
    "mimic-draft-block-4-top-k": dict(
        seed=3, vocab=4, n=3, block=4, sampling=dict(temperature=1.2, top_k=2), draft="mimic"
    ),
    "far-draft-block-2-top-p": dict(
        seed=4, vocab=4, n=3, block=2, sampling=dict(temperature=1.0, top_p=0.7), draft="random", std=1.5
    ),
    # q = 0 outside the draft vocabulary {0, 2} (extensions/draft_vocab.py): still a proposal distribution
    "far-draft-block-3-draft-vocab": dict(
        seed=5, vocab=4, n=3, block=3, sampling=dict(temperature=1.0), draft="random", std=1.0, draft_vocab=[0, 2]
    ),
    # the verify gate (extensions/verify_gate.py, θ = `gate`) cuts some blocks to [x_0, d_1] and verifies others
    # whole (n = 3: the first block holds 3 tokens, so the gate picks 3 or 2); with this draft, θ = 0.3
    # lets some blocks through whole and cuts others (asserted)
    "mimic-draft-block-4-gated": dict(
        seed=3, vocab=4, n=3, block=4, sampling=dict(temperature=1.0), draft="mimic", gate=0.3
    ),
}
N_SAMPLES = 1200
TARGET_STD = 0.25


def build_dist_case(case: dict):
    """→ target, the draft to speculate with, prompt, stops."""
    seed, vocab = case["seed"], case["vocab"]
    target_kw = dict(DIST_TARGET, vocab_size=vocab)
    draft_kw = dict(DIST_DRAFT, block_size=case["block"], mask_token_id=vocab - 1)
    target, draft = make_pair(seed, target_kw, draft_kw, std=TARGET_STD)
    if case["draft"] == "random":
        _, draft = make_pair(seed + 50, target_kw, draft_kw, std=case["std"])
    if "draft_vocab" in case:
        draft.draft_vocab = torch.tensor(case["draft_vocab"])
    prompt = [seed % vocab]
    if case["draft"] == "oracle":
        greedy = generate(target, torch.tensor([prompt]), case["n"]).output_ids[0]
        draft = OracleDraft(draft, greedy)
    elif case["draft"] == "mimic":
        draft = MimicDraft(draft, target, prompt, scale=0.8)
    return target, draft, prompt, case.get("stops")


@pytest.mark.parametrize("verifier", ["rejection", "match"])
@pytest.mark.parametrize("name", list(DIST_CASES))
def test_sampled_distribution_equals_target(name, verifier):
    case = DIST_CASES[name]
    target, draft, prompt, stops = build_dist_case(case)
    exact = exact_distribution(target, prompt, case["n"], stops=stops or (), **case["sampling"])
    torch.manual_seed(1234)
    samples, accepted, verified = [], 0, Counter()
    ids = torch.tensor([prompt])
    for _ in range(N_SAMPLES):
        out = spec_generate(
            draft,
            target,
            ids,
            case["n"],
            stop_token_ids=stops,
            verifier=verifier,
            block_size=case["block"],
            extensions=chosen_extensions(draft, target, verify_gate=case.get("gate")),
            on_step=lambda step: verified.update(gate_cuts(step)),
            **case["sampling"],
        )
        samples.append(tuple(new_tokens(out, 1)))
        accepted += sum(out.acceptance_lengths)
    p = chi_square_pvalue(samples, exact)
    print(f"{name}/{verifier}: chi-square p = {p:.4g}, accepted {accepted} draft tokens")
    assert p > P_MIN, f"{name}/{verifier}: sequences are not distributed as the target's (p = {p:.3g})"
    # each case must exercise what it claims: a near-target draft is accepted often, a far one sometimes
    if case["draft"] in ("oracle", "mimic"):
        assert accepted > 0.3 * N_SAMPLES, "a near-target draft should be accepted often"
    else:
        assert accepted > 0, "some draft tokens should still be accepted"
    if "gate" in case:  # the gate must have both cut blocks and let whole ones through
        assert verified[True] > 0.1 * N_SAMPLES and verified[False] > 0.1 * N_SAMPLES, verified


# ---------------------------------------------------------------------------------------------
# Power: the same test rejects wrong samplers
# ---------------------------------------------------------------------------------------------


@torch.inference_mode()
def one_step_tables(target, draft, prompt: list[int], n: int, sampling: dict):
    """For a run whose first block covers every new token (block ≥ n): p(· | prefix) for every
    prefix, and for every first token x_0 the draft's q_1..q_γ of that first block (one draft
    pass, no cache), γ = n − 1. Library pieces only."""
    vocab, gamma = target.config.vocab_size, n - 1
    out = target(torch.tensor([prompt]))
    target_hidden = extract_context_feature(out.hidden_states, draft.target_layer_ids)  # (1, P, k·d)
    positions = torch.arange(len(prompt) + gamma + 1)[None]  # (1, P + L_q)
    q = {}
    for x0 in range(vocab):
        block = torch.tensor([[x0] + [draft.mask_token_id] * gamma])  # (1, L_q)
        hidden = draft(positions, noise_embedding=target.embed(block), target_hidden=target_hidden)
        logits = draft.compute_logits(hidden[:, 1:], target.output_head)  # (1, γ, V)
        q[x0] = sampling_probs(logits, **sampling)[0].double().tolist()

    def p(prefix: list[int]) -> list[float]:
        logits = target(torch.tensor([prompt + prefix]), output_hidden_states=False).logits[:, -1]
        return sampling_probs(logits, **sampling)[0].double().tolist()

    return p, q


def wrong_samples(kind: str, p, q, n: int, count: int, seed: int, gate: float | None = None) -> list[tuple[int, ...]]:
    """Local samplers over the first block: "accept-all" keeps every draft token (the draft's distribution);
    "bonus-from-p" rejects correctly but draws the replacement from p instead of
    norm(max(p − q, 0)) (a classic bug); "correct" is standard rejection sampling (control).
    "gate-on-max" verifies only d_1 unless c_1·c_2 ≥ `gate` with c_k = max q_k (extensions/verify_gate.py: correct);
    "gate-on-draw" takes c_k = q_k(d_k) of the drawn tokens instead (biased: only likely d_2 get verified)."""
    rng, cache = random.Random(seed), {}
    draw = lambda probs: rng.choices(range(len(probs)), weights=probs)[0]  # noqa: E731

    def p_of(prefix):
        key = tuple(prefix)
        if key not in cache:
            cache[key] = p(prefix)
        return cache[key]

    samples = []
    for _ in range(count):
        seq = [draw(p_of([]))]
        drafted = [draw(q[seq[0]][i]) for i in range(n - 1)]
        if kind.startswith("gate-on-") and len(drafted) >= 2:
            c = [q[seq[0]][i][drafted[i]] if kind == "gate-on-draw" else max(q[seq[0]][i]) for i in range(2)]
            drafted = drafted if c[0] * c[1] >= gate else drafted[:1]
        for i, d in enumerate(drafted):
            target_p, draft_q = p_of(seq), q[seq[0]][i]
            if kind == "accept-all" or rng.random() * draft_q[d] < target_p[d]:
                seq.append(d)
                continue
            if kind == "bonus-from-p":
                seq.append(draw(target_p))
            else:
                residual = [max(a - b, 0.0) for a, b in zip(target_p, draft_q)]
                seq.append(draw(residual if sum(residual) > 0 else target_p))
            break
        while len(seq) < n:  # after a rejection: the target goes on
            seq.append(draw(p_of(seq)))
        samples.append(tuple(seq))
    return samples


@pytest.mark.parametrize(
    "name, kind, should_pass",
    [
        *[
            (name, kind, ok)
            for name in ("far-draft-block-4", "mimic-draft-block-4-top-k")
            for kind, ok in (("correct", True), ("accept-all", False), ("bonus-from-p", False))
        ],
        ("mimic-draft-block-4-gated", "gate-on-max", True),
        ("mimic-draft-block-4-gated", "gate-on-draw", False),
    ],
)
def test_chi_square_has_power(name, kind, should_pass):
    """The goodness-of-fit test used above, at the same sample size, accepts a correct local
    rejection sampler and rejects two wrong ones built from the same draft and target."""
    case = DIST_CASES[name]
    target, draft, prompt, _ = build_dist_case(case)
    exact = exact_distribution(target, prompt, case["n"], **case["sampling"])
    p_fn, q = one_step_tables(target, draft, prompt, case["n"], case["sampling"])
    samples = wrong_samples(kind, p_fn, q, case["n"], N_SAMPLES, seed=7, gate=case.get("gate"))
    impossible = sum(s not in exact for s in samples)  # a sequence of probability 0: fails outright
    p = 0.0 if impossible else chi_square_pvalue(samples, exact)
    print(f"power {name}/{kind}: chi-square p = {p:.4g} ({impossible} impossible sequences)")
    assert (p > P_MIN) == should_pass, f"{kind}: p = {p:.3g}"
