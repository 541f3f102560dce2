"""Prompt lookup beside the draft (extensions/prompt_lookup.py): the proposals by hand, the refusals,
and decoding with it: greedy equal to AR on random pairs (DFlash 1 and 2), sampled with the target's
distribution (both verifiers), no draft pass where it proposes, and its steps in the trace."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import make_pair
from test_dflash2 import dflash2
from test_lossless import random_case

from dflash_ref import generate, spec_generate
from dflash_ref.extensions import PromptLookup, chosen_extensions
from dflash_ref.extensions.prompt_lookup import check_lookup, lookup_proposals
from dflash_ref.trace import StepLog, Trace, tracing

pytestmark = pytest.mark.usefixtures("one_thread_module")


def proposals(tokens: list[int], gamma: int, lookup: int | None = 1):
    """lookup_proposals at the last position of `tokens`, as a list, or None."""
    found = lookup_proposals(torch.tensor([tokens]), len(tokens) - 1, gamma, lookup)
    return None if found is None else found[0].tolist()


def test_proposals_by_hand():
    # the last two tokens (5, 6) end at j = 1 and j = 5 before; the latest whose γ tokens are committed is 5
    assert proposals([5, 6, 7, 8, 5, 6, 9, 5, 6], gamma=2, lookup=2) == [9, 5]
    # the longest suffix first: (1, 2, 3) ended at j = 2 (then 4), though (2, 3) ended later, at j = 5 (then 5)
    assert proposals([1, 2, 3, 4, 2, 3, 5, 1, 2, 3], gamma=1) == [4]
    assert proposals([1, 2, 3, 4, 2, 3, 5, 1, 2, 3], gamma=1, lookup=3) == [4]
    # (7, 8) ends at j = 1; its γ = 3 tokens reach the present token, which is committed: allowed
    assert proposals([7, 8, 9, 7, 8], gamma=3, lookup=2) == [9, 7, 8]
    assert proposals([7, 8, 9, 7, 8], gamma=4, lookup=1) is None  # no match has 4 tokens after it
    assert proposals([7, 8, 9, 1, 8], gamma=1, lookup=2) is None  # (1, 8) never occurred before
    assert proposals([7, 8, 9, 1, 8], gamma=1, lookup=1) == [9]  # (8) did, at j = 1
    assert proposals([7, 8, 9, 7, 8], gamma=0) is None  # nothing to propose
    assert proposals([7, 8, 9, 7, 8], gamma=2, lookup=None) is None  # off
    assert proposals([4], gamma=1) is None  # one token: nothing before it


@pytest.mark.parametrize("bad", [0, 4, -1, True, 1.5, "2"])
def test_bad_lookup_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="lookup must be None"):
        check_lookup(bad)
    with pytest.raises(ValueError, match="lookup must be None"):
        PromptLookup(bad)


def lookup_run(draft, target, prompt, n: int, lookup: int, verify_gate: float | None = None, **kw):
    """spec_generate with prompt lookup N = `lookup` (and the verify gate θ where given), and its step records."""
    records = StepLog()
    extensions = chosen_extensions(draft, target, verify_gate, lookup)
    out = spec_generate(draft, target, prompt, n, extensions=extensions, on_step=records, **kw)
    return out, records


@pytest.mark.parametrize("seed", range(30))
def test_greedy_with_lookup_equals_ar_on_random_pairs(seed):
    """Each random case at its own length (0 … 40 new tokens) and at 24, with a stop token the target emits in
    some of them: the output equals AR's, and every step proposed by lookup exactly where `lookup_proposals` on
    the final output finds a match, with its tokens (no draft pass, no draft positions)."""
    case = random_case(seed)
    target, draft = make_pair(seed, case["target"], case["draft"])
    prompt = torch.tensor([case["prompt"]])
    for n in sorted({case["max_new_tokens"], 24}):
        cont = generate(target, prompt, n).output_ids[0, prompt.shape[1] :].tolist()
        stops = [cont[len(cont) // 2]] if case["stop_kind"] == "generated" and cont else None
        expected = generate(target, prompt, n, stop_token_ids=stops).output_ids
        for lookup in (1, 2, 3):
            out, records = lookup_run(
                draft, target, prompt, n, lookup, block_size=case["block_size"], stop_token_ids=stops
            )
            assert torch.equal(out.output_ids, expected), (lookup, n, case)
            for r in records:
                found = lookup_proposals(out.output_ids, r.start, len(r.draft_tokens), lookup)
                assert r.lookup == (found is not None), (lookup, r.step)
                if r.lookup:
                    assert r.draft_tokens == found[0].tolist() == r.block_ids[1:]
                    assert r.q_position_ids == [] and r.ctx_len == 0 and r.draft_cache_after == r.draft_cache_before
            assert out.num_draft_passes == sum(1 for r in records if not r.lookup and len(r.block_ids) > 1)
        gated, records = lookup_run(
            draft, target, prompt, n, 2, block_size=case["block_size"], verify_gate=0.5, stop_token_ids=stops
        )
        assert torch.equal(gated.output_ids, expected)  # with the verify gate: lookup steps ungated
        assert all(r.verify_size == len(r.block_ids) == len(r.draft_tokens) + 1 for r in records if r.lookup)


def test_lookup_fires_on_random_pairs_and_the_next_draft_pass_takes_the_waiting_context():
    """Random tiny targets repeat themselves, so lookups happen; the draft pass after them is fed the
    context features of every token committed since the last draft pass (L_c), from where its cache ends."""
    fired = 0
    for seed in range(10):
        case = random_case(seed)
        target, draft = make_pair(seed, case["target"], case["draft"])
        _, records = lookup_run(draft, target, torch.tensor([case["prompt"]]), 40, 1, block_size=4)
        fired += sum(r.lookup for r in records)
        drafted = [r for r in records if not r.lookup and len(r.block_ids) > 1]
        for before, after in zip(drafted, drafted[1:]):
            assert after.draft_cache_before == before.start  # the cache ends at the last x_0
            assert after.ctx_len == after.start - before.start  # everything since waits for it
    assert fired > 20, fired


def test_greedy_dflash2_with_lookup_equals_ar():
    for seed in range(6):
        target, draft = make_pair(
            seed,
            target_overrides=dict(vocab_size=12),
            draft_overrides=dflash2(block_size=4, top_k=4, kernel=3, group=4),
        )
        prompt = torch.randint(0, 12, (1, 5), generator=torch.Generator().manual_seed(seed))
        out, records = lookup_run(draft, target, prompt, 30, 1)
        assert torch.equal(out.output_ids, generate(target, prompt, 30).output_ids), seed
        assert any(r.lookup for r in records) and any(not r.lookup for r in records)


# DFlash 1 with the rejection verifier is tests/test_lossless.py's; where the lookup proposes, q is one-hot whatever
# the draft, so its rejection rule is held once, on DFlash 2
@pytest.mark.parametrize("version, verifier", [(1, "match"), (2, "rejection")])
def test_sampled_with_lookup_has_the_targets_distribution(version, verifier):
    """The first 3 sampled tokens (V = 4, T = 1.5, prompt 0 1 0 1) against their exact probabilities under
    the target, by a chi-square test; the prompt repeats, so lookups propose (asserted): q puts all its
    mass on the copied token, and the rejection verifier's residual is p without it."""
    from dflash_ref.conformance.exact import _next_probs
    from dflash_ref.conformance.sampling import chi_square

    extra = dflash2(top_k=2, kernel=2, group=4) if version == 2 else {}
    target, draft = make_pair(5, target_overrides=dict(vocab_size=4), draft_overrides=dict(block_size=3, **extra))
    prompt, t = [0, 1, 0, 1], 1.5
    sequences = list(itertools.product(range(4), repeat=3))
    with torch.inference_mode():
        exact = np.array(
            [
                np.prod([float(_next_probs(target, prompt + list(seq[:i]), t)[-1, tok]) for i, tok in enumerate(seq)])
                for seq in sequences
            ]
        )
        counts, lookups, accepted = dict.fromkeys(sequences, 0), 0, 0
        for seed in range(1500):
            torch.manual_seed(seed)
            out, records = lookup_run(draft, target, torch.tensor([prompt]), 4, 1, temperature=t, verifier=verifier)
            counts[tuple(out.output_ids[0, 4:7].tolist())] += 1
            lookups += sum(r.lookup for r in records)
            accepted += sum(r.acceptance_length for r in records if r.lookup)
    _, _, p_value = chi_square(np.array([counts[s] for s in sequences], float), exact * 1500)
    assert p_value > 1e-3, p_value
    assert lookups > 500 and accepted > 100, (lookups, accepted)


def test_lookup_steps_in_a_trace_have_no_draft_activations_and_round_trip(tmp_path):
    target, draft = make_pair(2, target_overrides=dict(vocab_size=8))
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    with tracing(draft, names=["*hook_pattern"]) as trace:
        out = spec_generate(draft, target, prompt, 30, extensions=[PromptLookup(1)], on_step=trace.on_step)
    assert torch.equal(out.output_ids, generate(target, prompt, 30).output_ids)
    name = "draft.layers.0.self_attn.hook_pattern"
    assert any(r.lookup for r in trace.records) and any(not r.lookup for r in trace.records)
    for record, pattern in zip(trace.records, trace[name]):
        assert (pattern is None) == record.lookup
        if pattern is not None:  # the pattern's keys: the cached context, the context fed now, the block
            assert pattern.shape[-1] == trace.context_columns(record.step) + len(record.q_position_ids)
    trace.save(tmp_path / "t")
    back = Trace.load(tmp_path / "t")
    assert [r.lookup for r in back.records] == [r.lookup for r in trace.records]


def test_draft_passes_after_lookups_propose_what_a_draft_fed_the_whole_prefix_at_once_does():
    """The context that waits through lookup steps must reach the draft whole and at its positions: at
    every drafted step, the proposals equal those of the draft run on the final sequence's features at
    that anchor in one pass (training.teacher_forced.draft_proposals, no cache)."""
    from dflash_ref.layer_sampling import extract_context_feature
    from dflash_ref.training.teacher_forced import draft_proposals

    checked = 0
    for seed in range(4):
        target, draft = make_pair(seed, target_overrides=dict(vocab_size=10), draft_overrides=dict(block_size=4))
        prompt = torch.randint(0, 10, (1, 4), generator=torch.Generator().manual_seed(seed))
        out, records = lookup_run(draft, target, prompt, 40, 1)
        with torch.inference_mode():
            hidden = target(out.output_ids, output_hidden_states=True).hidden_states
            features = extract_context_feature(hidden, draft.target_layer_ids)
            after_lookup = [
                r
                for i, r in enumerate(records)
                if not r.lookup and len(r.block_ids) == 4 and i and records[i - 1].lookup
            ]
            for r in after_lookup:
                whole = draft_proposals(draft, target, out.output_ids, features, torch.tensor([r.start]))
                assert whole[0].tolist() == r.draft_tokens, (seed, r.step)
        checked += len(after_lookup)
    assert checked > 5, checked


def test_generate_figures_start_at_the_first_drafted_step(tmp_path):
    """`generate --figures` draws the first step with a draft pass: here step 0 is a lookup (the prompt repeats)."""
    from dflash_ref.cli.generate import write_figures

    target, draft = make_pair(2, target_overrides=dict(vocab_size=8))
    with tracing(draft, names=["*hook_pattern"]) as trace:
        prompt = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2, 3]])
        spec_generate(draft, target, prompt, 30, extensions=[PromptLookup(1)], on_step=trace.on_step)
    first = next(r.step for r in trace.records if not r.lookup)
    assert trace.records[0].lookup and first > 0
    write_figures(trace, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {
        "acceptance.png",
        "cache_timeline.png",
        "attention_steps.png",
        f"attention_grid_step{first}.png",
        f"rope_alignment_step{first}.png",
    }
