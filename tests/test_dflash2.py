"""DFlash 2 in the reference: the grouped dynamic causal convolution, the candidate selector and
rejection restricted to candidates, checked by hand, by their properties, against the official
`dflash` 0.1.0 (`DFlash2DraftModel`, `dflash_generate`) and for losslessness against AR.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random

import numpy as np
import pytest
import torch
from conftest import gate_cuts, hand_selector, make_pair

from dflash_ref import generate, spec_generate
from dflash_ref.candidate_selector import CandidateSelector
from dflash_ref.config import ConfigError, DraftConfig
from dflash_ref.drafts.checkpoint import load_draft, save_draft
from dflash_ref.dynamic_conv import GroupedDynamicCausalConv, convolve
from dflash_ref.extensions import chosen_extensions
from dflash_ref.trace import StepLog
from dflash_ref.training.teacher_forced import best_paths

pytestmark = pytest.mark.usefixtures("one_thread_module")


def dflash2(kernel: int = 3, group: int = 4, rank: int = 4, top_k: int = 4, **more) -> dict:
    return dict(
        version=2, conv_kernel_size=kernel, conv_group_size=group, selector_rank=rank, selector_top_k=top_k, **more
    )


# --------------------------------------------------------------------------- the convolution


def test_convolution_by_hand():
    # d = 2 in one group, K = 2: y_t = (w_0 + a_{t,0}) x_t + (w_1 + a_{t,1}) x_{t−1}, x_{−1} = 0
    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]])  # (1, 3, 2)
    w = torch.tensor([[1.0, 0.5], [2.0, -1.0]])  # (K, d)
    a = torch.tensor([[[0.0], [0.0]], [[1.0], [0.5]], [[-1.0], [2.0]]])[None]  # (1, 3, K, 1)
    y = convolve(x, a, w, group_size=2)
    expected = torch.tensor(
        [
            [
                [1.0, 1.0],  # (1, .5) ⊙ x_0
                [2 * 3 + 2.5 * 1, 1.5 * 4 + (-0.5) * 2],
                [0 * 5 + 4 * 3, -0.5 * 6 + 1 * 4],
            ]
        ]
    )
    assert torch.allclose(y, expected)


@pytest.mark.parametrize("seed", range(4))
def test_convolution_is_causal_and_grouped(seed):
    g = torch.Generator().manual_seed(seed)
    conv = GroupedDynamicCausalConv(8, 3, 2)
    with torch.no_grad():
        conv.base_kernel.normal_(generator=g)
        conv.kernel_projection.weight.normal_(generator=g)
    x = torch.randn(1, 6, 8, generator=g)
    y, taps = conv.prepare(x)
    assert taps.shape == (1, 6, 3, 4)
    for t in range(6):  # changing x_t never changes y before t
        changed = x.clone()
        changed[:, t] += 1.0
        y2, _ = conv.prepare(changed)
        assert torch.equal(y2[:, :t], y[:, :t]) and not torch.equal(y2[:, t:], y[:, t:])


# --------------------------------------------------------------------------- the selector


def test_selector_with_one_candidate_is_the_argmax():
    g = torch.Generator().manual_seed(0)
    selector = CandidateSelector(vocab_size=9, hidden_size=6, rank=3, top_k=1)
    with torch.no_grad():
        for p in selector.parameters():
            p.normal_(generator=g)
    logits = torch.randn(1, 4, 9, generator=g)
    path, candidates, q = selector.select(torch.randn(1, 4, 6, generator=g), logits, torch.tensor([2]), 0.0)
    assert torch.equal(path, logits.argmax(-1)) and q is None and candidates.shape == (1, 4, 1)


def test_selector_pair_term_by_hand():
    # V = 3, rank 1, d = 1: score_k = z_k + E_pred(prev) · P h · E_succ(c_k)
    selector = hand_selector()
    logits = torch.tensor([[[0.0, 1.0, 1.5], [0.0, 1.0, 1.5]]])  # candidates {1, 2} at both positions
    hidden = torch.tensor([[[1.0], [1.0]]])
    # t = 1 from anchor 0 (E_pred 1): token 1 → 1 + 3 = 4, token 2 → 1.5 − 3 = −1.5: picks 1
    # t = 2 from 1 (E_pred −1):       token 1 → 1 − 3 = −2, token 2 → 1.5 + 3 = 4.5: picks 2
    path, _, _ = selector.select(hidden, logits, torch.tensor([0]), 0.0)
    assert path.tolist() == [[1, 2]]


def test_the_selectors_best_paths_by_hand():
    """best_paths on test_selector_pair_term_by_hand's lattice: log q_1 from the anchor, log q_2 from each
    first token, the four paths in order of log P (here the best is also select's greedy path, which in general
    it need not be); more than K^γ is refused."""
    selector, logits, hidden = hand_selector(), torch.tensor([[[0.0, 1.0, 1.5]] * 2]), torch.ones(1, 2, 1)
    lq1 = torch.log_softmax(torch.tensor([4.0, -1.5]), -1)  # tokens 1, 2 after anchor 0
    lq2 = {
        1: torch.log_softmax(torch.tensor([-2.0, 4.5]), -1),  # after 1 (E_pred −1): tokens 1, 2
        2: torch.log_softmax(torch.tensor([7.0, -4.5]), -1),
    }  # after 2 (E_pred 2):  1 + 6, 1.5 − 6
    by_hand = {(a, b): (lq1[a - 1] + lq2[a][b - 1]).item() for a in (1, 2) for b in (1, 2)}
    paths, scores = best_paths(selector, hidden, logits, torch.tensor([0]), 4)
    assert [tuple(p) for p in paths[0].tolist()] == [(1, 2), (2, 1), (1, 1), (2, 2)]
    assert scores[0].tolist() == pytest.approx([by_hand[tuple(p)] for p in paths[0].tolist()], abs=1e-6)
    assert paths[0, 0].tolist() == selector.select(hidden, logits, torch.tensor([0]), 0.0)[0][0].tolist()
    with pytest.raises(ValueError, match=r"count=5 must be 1 … K\^γ = 4"):
        best_paths(selector, hidden, logits, torch.tensor([0]), 5)


@pytest.mark.parametrize("seed", range(4))
def test_the_selectors_best_paths_are_the_best_of_every_path(seed):
    """best_paths against all K^γ paths scored one by one (K = 3, γ = 3, random selector and logits): the
    same log P, best first, for every count."""
    torch.manual_seed(seed)
    selector = CandidateSelector(vocab_size=11, hidden_size=5, rank=4, top_k=3)
    torch.nn.init.normal_(selector.predecessor_codebook), torch.nn.init.normal_(selector.successor_codebook)
    hidden, logits, anchors = torch.randn(2, 3, 5), torch.randn(2, 3, 11) * 2, torch.tensor([4, 9])
    unary, candidates = torch.topk(logits, 3, dim=-1)
    projected = selector.hidden_projection(hidden)
    for row in range(2):
        every = {}
        for picks in itertools.product(range(3), repeat=3):
            previous, total, tokens = anchors[row], 0.0, []
            for t, k in enumerate(picks):
                scores = unary[row, t] + selector.pair_term(previous, projected[row, t], candidates[row, t])
                total += torch.log_softmax(scores, -1)[k].item()
                previous = candidates[row, t, k]
                tokens.append(previous.item())
            every[tuple(tokens)] = total
        ranked = sorted(every.values(), reverse=True)
        for count in (1, 5, 27):
            paths, scores = best_paths(selector, hidden, logits, anchors, count)
            assert scores[row].tolist() == pytest.approx(ranked[:count], abs=1e-5)
            assert [every[tuple(p)] for p in paths[row].tolist()] == pytest.approx(ranked[:count], abs=1e-5)


# --------------------------------------------------------------------------- config and checkpoint


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(version=2, conv_kernel_size=3, conv_group_size=4, selector_rank=4), "selector_top_k' is missing"),
        (dflash2(top_k=0), "selector_top_k' must be an integer ≥ 1"),
        (dflash2(top_k=10_000), "selector_top_k 10000 exceeds the vocabulary"),
        (dflash2(group=5), "conv_group_size 5 does not divide hidden_size"),
        (dict(conv_kernel_size=3), "DFlash 2's fields need architectures"),
        (dflash2(output_multiplier=0), "'output_multiplier' must be a positive number"),
    ],
)
def test_bad_dflash2_configs_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        make_pair(0, draft_overrides=fields)


def test_checkpoint_round_trip_keeps_the_released_key_names(tmp_path):
    from safetensors import safe_open

    _, draft = make_pair(1, draft_overrides=dflash2())
    save_draft(draft, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"} <= keys
    assert "layers.0.attention_conv.base_kernel" in keys
    loaded = load_draft(tmp_path)
    assert loaded.config.to_dict() == {**draft.config.to_dict(), "dtype": "float32"} and loaded.config.version == 2
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), draft.state_dict().values()))
    assert DraftConfig.from_json(tmp_path).to_dict()["architectures"] == ["DFlash2DraftModel"]


def test_a_checkpoint_without_a_codebook_is_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    _, draft = make_pair(1, draft_overrides=dflash2())
    save_draft(draft, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["candidate_selector.successor_codebook"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing: \['candidate_selector.successor_codebook'\]"):
        load_draft(tmp_path)


# --------------------------------------------------------------------------- the official package

official = pytest.importorskip("dflash.model")
transformers = pytest.importorskip("transformers")


def official_twin(draft):
    """The official DFlash2DraftModel with the reference draft's weights (codebooks as `.weight`)."""
    twin = official.DFlash2DraftModel(transformers.Qwen3Config(**draft.config.to_dict())).eval()
    state = {(k + ".weight" if k.endswith("_codebook") else k): v for k, v in draft.state_dict().items()}
    twin.load_state_dict(state)
    return twin


@functools.cache
def case(seed: int):
    rng = random.Random(seed)
    vocab = rng.choice([8, 12, 16])
    top_k = rng.choice([1, 2, 4, vocab])
    block = rng.choice([4, 8, 16])
    fields = dflash2(
        kernel=rng.choice([1, 2, 3, 4]),
        group=rng.choice([2, 4, 8, 32]),
        rank=rng.choice([2, 4]),
        top_k=top_k,
        block_size=block,
        num_hidden_layers=rng.randint(1, 2),
        input_embedding_scale=rng.choice([1.0, 0.5]),
        final_logit_softcapping=rng.choice([None, 5.0]),
    )
    if seed % 4 == 3:
        fields.update(layer_types=["sliding_attention"] * fields["num_hidden_layers"], sliding_window=3)
    target, draft = make_pair(seed, target_overrides=dict(vocab_size=vocab), draft_overrides=fields)
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**target.config.to_dict())).eval()
    hf.load_state_dict(target.state_dict())
    prompt = torch.randint(0, vocab, (1, rng.randint(1, 6)), generator=torch.Generator().manual_seed(seed))
    return target, draft, hf, official_twin(draft), prompt, block * 2 + 3


@pytest.mark.parametrize("seed", range(12))
def test_draft_forward_and_selector_match_official(seed):
    target, draft, hf, twin, prompt, _ = case(seed)
    g = torch.Generator().manual_seed(seed)
    ctx, block = 5, draft.block_size
    features = torch.randn(1, ctx, len(draft.target_layer_ids) * draft.config.hidden_size, generator=g)
    noise = torch.randn(1, block, draft.config.hidden_size, generator=g)
    positions = torch.arange(ctx + block)[None]
    with torch.no_grad():
        ours = draft(positions, noise_embedding=noise, target_hidden=features)
        theirs = twin(position_ids=positions, noise_embedding=noise, target_hidden=features)
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (ours - theirs).abs().max()
        head = target.output_head
        logits = draft.compute_logits(ours[:, 1:], head)
        path, candidates, _ = draft.candidate_selector.select(ours[:, 1:], logits, prompt[:, 0], 0.0)
        their_path, their_candidates, _ = twin.propose(ours[:, 1:], prompt[:, 0], hf.lm_head, 0.0)
    assert torch.equal(path, their_path) and torch.equal(candidates, their_candidates)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("seed", range(12))
def test_spec_generate_matches_official(seed, temperature):
    target, draft, hf, twin, prompt, max_new = case(seed)
    torch.manual_seed(seed)
    ours = spec_generate(draft, target, prompt, max_new, temperature=temperature)
    torch.manual_seed(seed)
    try:
        theirs = official.dflash_generate(twin, hf, prompt, max_new, None, temperature=temperature, return_stats=True)
    except RuntimeError as e:
        # 0.1.0's convolution pads x[:, :-j] by j rows, too many once the block (the last, shrunk one) is
        # shorter than the kernel; the reference's taps past the block's start are 0, as the equation says
        shortest = min_block(ours, draft.block_size, max_new)
        assert "must match the size" in str(e) and shortest < draft.config.conv_kernel_size
        pytest.skip(f"dflash 0.1.0 fails on a block of {shortest} < kernel {draft.config.conv_kernel_size}")
    assert torch.equal(ours.output_ids, theirs.output_ids), (ours.output_ids, theirs.output_ids)
    assert ours.tokens_per_step == theirs.acceptance_lengths


def min_block(result, block: int, max_new: int) -> int:
    """The shortest block a run drafted (the last ones, which max_new_tokens cuts)."""
    start, end, sizes = result.num_input_tokens, result.num_input_tokens + max_new, []
    for produced in result.tokens_per_step:
        sizes.append(min(block, end - start))
        start += produced
    return min(size for size in sizes if size > 1)


@pytest.mark.parametrize("seed", range(12))
def test_greedy_dflash2_is_lossless(seed):
    target, draft, _, _, prompt, max_new = case(seed)
    assert torch.equal(
        spec_generate(draft, target, prompt, max_new).output_ids, generate(target, prompt, max_new).output_ids
    )


@pytest.mark.parametrize("top_k, gate", [(2, None), (4, None), (4, 0.4)])
def test_sampled_dflash2_has_the_targets_distribution(top_k, gate):
    """The first 3 sampled tokens (V = 4, T = 1.5) against their exact probabilities under the target,
    enumerated in float64, by a chi-square test: with K < V (q zero on two tokens) and K = V, and with the
    verify gate (extensions/verify_gate.py), which reads c_2 from q_2 given the drawn d_1: it must both cut
    blocks to [x_0, d_1] and let whole ones through."""
    import itertools

    from dflash_ref.conformance.exact import _next_probs
    from dflash_ref.conformance.sampling import chi_square

    target, draft = make_pair(
        5, target_overrides=dict(vocab_size=4), draft_overrides=dflash2(top_k=top_k, block_size=3, kernel=2, group=4)
    )
    prompt, t = [0, 1, 2], 1.5
    sequences = list(itertools.product(range(4), repeat=3))
    with torch.inference_mode():
        exact = np.array(
            [
                np.prod([float(_next_probs(target, prompt + list(seq[:i]), t)[-1, tok]) for i, tok in enumerate(seq)])
                for seq in sequences
            ]
        )
        counts, cut = dict.fromkeys(sequences, 0), []
        for seed in range(1500):
            torch.manual_seed(seed)
            out = spec_generate(
                draft,
                target,
                torch.tensor([prompt]),
                4,
                temperature=t,
                extensions=chosen_extensions(draft, target, verify_gate=gate),
                on_step=lambda step: cut.extend(gate_cuts(step)),
            )  # blocks the gate may cut
            counts[tuple(out.output_ids[0, 3:6].tolist())] += 1
    _, _, p_value = chi_square(np.array([counts[s] for s in sequences], float), exact * 1500)
    assert p_value > 1e-3, p_value
    assert (0.1 * len(cut) < sum(cut) < 0.9 * len(cut)) if gate is not None else not any(cut), sum(cut)


@pytest.mark.parametrize("seed", range(4))
def test_the_gate_reads_c1_c2_from_the_selectors_own_scores_and_stays_lossless(seed):
    """Greedy: c_k = the largest softmax of score_k = z_k + pair_k over the K candidates, as `select` walked
    them (its hooks' unary and pair terms); the block is verified whole exactly where c_1·c_2 ≥ θ, θ the
    median of an ungated run's c_1·c_2, and the output is the target's own."""
    from dflash_ref.trace import tracing

    target, draft = make_pair(
        seed, target_overrides=dict(vocab_size=16), draft_overrides=dflash2(top_k=4, block_size=4)
    )
    prompt, n = torch.tensor([[1, 5, 2]]), 24
    ar = generate(target, prompt, n).output_ids
    names = ["draft.candidate_selector.hook_unary", "draft.candidate_selector.hook_pair"]

    def run(gate):
        with tracing(draft, names=names) as trace:
            out = spec_generate(
                draft, target, prompt, n, extensions=chosen_extensions(draft, target, gate), on_step=trace.on_step
            )
        assert torch.equal(out.output_ids, ar)
        scores = [
            a["draft.candidate_selector.hook_unary"] + a["draft.candidate_selector.hook_pair"]
            for a in trace.activations
        ]  # (γ, K) per step
        c = [torch.softmax(s.float(), -1).amax(-1) for s in scores]
        return [(float(ck[0] * ck[1]), r) for ck, r in zip(c, trace.records) if len(r.q_position_ids) > 2]

    theta = float(np.median([c for c, _ in run(None)]))
    steps = run(theta)
    for c, r in steps:  # the gate recomputes the scores (teacher_forced): equal to the hooks' up to rounding
        if abs(c - theta) > 1e-5:
            assert r.verify_size == (len(r.q_position_ids) if c >= theta else 2), (c, theta, r.verify_size)
    assert {r.verify_size == 2 for _, r in steps} == {True, False}


def test_the_trace_records_the_convolution_and_the_selector_per_step():
    from dflash_ref.trace import tracing

    target, draft = make_pair(3, draft_overrides=dflash2(top_k=3))
    names = ["draft.candidate_selector.*", "draft.layers.*.attention_conv.*", "draft.layers.*.mlp_conv.*"]
    with tracing(draft, names=names) as trace:
        out = spec_generate(draft, target, torch.tensor([[1, 2, 3]]), 9, on_step=trace.on_step)
    assert len(trace.activations) == len(out.acceptance_lengths) > 0
    step = trace.activations[0]
    gamma = draft.block_size - 1
    assert step["draft.candidate_selector.hook_candidates"].shape == (gamma, 3)  # the batch dropped
    assert step["draft.candidate_selector.hook_path"].tolist() == trace.records[0].draft_tokens
    assert step["draft.layers.1.mlp_conv.hook_taps"].shape == (draft.block_size, 2, 3, draft.config.hidden_size // 4)
    assert "draft.candidate_selector.hook_q" not in step  # greedy: no q


# --------------------------------------------------------------------------- measuring the selector


def test_path_against_argmax_by_hand():
    """Two steps of one prompt whose output (the target's greedy tokens) is 10 … 16. Step 0 drafts from
    x_0 = 11 (truth 12 13 14): the path 12 13 99 matches 2, the argmax 12 98 14 matches 1; position 2
    moved right (13 against 98), position 3 moved wrong (99 against 14) and ends the decisive ones.
    Step 1 drafts from x_0 = 14, where only 15 16 are left (the output ends): the path 15 0 matches 1,
    the argmax 15 16 matches 2."""
    from types import SimpleNamespace

    from dflash_ref.training.measure import path_against_argmax

    out = SimpleNamespace(
        output_ids=torch.tensor([[10, 11, 12, 13, 14, 15, 16]]), num_draft_passes=2, acceptance_lengths=[2, 1]
    )
    steps = [
        SimpleNamespace(step=0, start=1, draft_tokens=[12, 13, 99], acceptance_length=2),
        SimpleNamespace(step=1, start=4, draft_tokens=[15, 0, 0], acceptance_length=1),
    ]
    choices = [
        (torch.tensor([[12, 50], [13, 98], [99, 14]]), torch.tensor([12, 98, 14])),
        (torch.tensor([[15, 3], [0, 16], [0, 7]]), torch.tensor([15, 16, 7])),
    ]
    tally = path_against_argmax([steps], choices, [out])
    assert tally == {
        "accepted/step, path": 1.5,
        "accepted/step, argmax": 1.5,
        "steps": 2,
        "decisive": 5,
        "in candidates": 5,
        "argmax right": 4,
        "path right": 3,
        "moved": 3,
        "moved, path right": 1,
        "moved, argmax right": 2,
    }
    with pytest.raises(ValueError, match="left over"):
        path_against_argmax([steps], choices * 2, [out])
    with pytest.raises(ValueError, match="not its passes"):
        path_against_argmax([steps], choices[:1], [out])
    steps[0].acceptance_length = 1  # a record the output contradicts (its block is whole)
    with pytest.raises(ValueError, match="not this run's"):
        path_against_argmax([steps], choices, [out])


def test_selector_log_reads_the_candidates_and_the_argmax_of_each_pass():
    """On a real run: one entry per draft pass, the candidates as the trace records them, the argmax that
    of the draft logits; the path's matched prefix is each step's own τ, so the tally's path is the run's."""
    from dflash_ref.trace import tracing
    from dflash_ref.training.measure import path_against_argmax, selector_log

    target, draft = make_pair(3, draft_overrides=dflash2(top_k=3))
    prompt, records = torch.tensor([[1, 2, 3]]), StepLog()
    with tracing(draft, names=["draft.hook_logits", "draft.candidate_selector.hook_candidates"]) as trace:
        out, choices = selector_log(
            draft,
            lambda: spec_generate(
                draft, target, prompt, 12, [], on_step=lambda step: (records(step), trace.on_step(step))
            ),
        )
    assert len(choices) == out.num_draft_passes == len(trace.activations) > 1
    for (candidates, argmax), acts in zip(choices, trace.activations):
        assert torch.equal(candidates, acts["draft.candidate_selector.hook_candidates"])
        assert torch.equal(argmax, acts["draft.hook_logits"].argmax(-1))
    tally = path_against_argmax([records], choices, [out])
    truth = [min(len(r.draft_tokens), out.output_ids.shape[1] - r.start - 1) for r in records]  # tokens left
    assert tally["steps"] == len(records)
    assert tally["accepted/step, path"] * len(records) == pytest.approx(
        sum(min(r.acceptance_length, n) for r, n in zip(records, truth))
    )


# --------------------------------------------------------------------------- training


def _sequence(target, length: int = 20, seed: int = 0) -> torch.Tensor:
    ids = torch.randint(0, target.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(seed))
    return generate(target, ids, length - 4).output_ids  # (1, length)


def follow(candidates: torch.Tensor, truth: list[int]):
    """A `sample` for CandidateSelector.select that picks, position after position, the index of the
    next true token among the candidates (1, γ, K)."""
    positions = iter(range(len(truth)))
    return lambda q: torch.tensor([candidates[0, (t := next(positions))].tolist().index(truth[t])])


def test_training_pass_and_selector_equal_the_inference_draft_and_selector():
    """The training pass (m blocks side by side, each convolution restarted at its block) and the
    teacher-forced selector against the inference draft on each block alone and its selector walked
    along the true tokens (K = V: every true token is a candidate, so the path can follow them)."""
    from dflash_ref.training.features import target_features
    from dflash_ref.training.recipe import output_logits, training_hidden

    target, draft = make_pair(4, draft_overrides=dflash2(kernel=3, top_k=12))
    tokens = _sequence(target)
    features = target_features(target, tokens, draft.target_layer_ids)
    anchors, b = torch.tensor([4, 7, 8, 13]), draft.block_size
    selector = draft.candidate_selector
    with torch.no_grad():
        hidden, labels = training_hidden(draft, target, tokens, features, anchors)
        logits, _ = output_logits(draft, target, hidden, labels)
        previous = tokens[0, anchors[:, None] + torch.arange(b - 1)[None]]  # (m, b − 1)
        candidates, scores = selector.teacher_forced(hidden, logits, previous)
        for j, a in enumerate(anchors.tolist()):
            block = torch.tensor([[tokens[0, a].item()] + [draft.mask_token_id] * (b - 1)])
            h = draft(
                torch.arange(a + b)[None],
                noise_embedding=target.embed(block),
                target_hidden=features[:, :a],
                past_key_values=draft.make_cache(),
            )[:, 1:]
            z = draft.compute_logits(h, target.output_head)
            error = float((logits[j] - z[0]).abs().max()) / max(1.0, float(z.abs().max()))  # the kit's measure
            assert error < 1e-5, (j, error)
            own = torch.topk(z, selector.top_k, dim=-1, sorted=False)[1]  # select's candidates
            path, c, q = selector.select(h, z, block[:, 0], 1.0, follow(own, labels[j].tolist()))
            assert path[0].tolist() == labels[j].tolist()
            mine = torch.softmax(scores[j], -1).gather(-1, candidates[j].argsort(-1))  # both by token id
            theirs = q[0].gather(-1, c[0].argsort(-1))
            assert torch.allclose(mine, theirs, atol=1e-5), (j, (mine - theirs).abs().max())


def test_teacher_forced_acceptance_of_a_dflash2_draft_follows_its_greedy_path():
    from dflash_ref.training.teacher_forced import leading_matches

    target, draft = make_pair(6, draft_overrides=dflash2(kernel=2, top_k=3))
    tokens = _sequence(target, 16).clone()  # out of inference mode
    leads, _, verified = leading_matches(draft, target, tokens, 4)
    tree_leads, _, nodes = leading_matches(draft, target, tokens, 4, paths=5)
    features = target_features_of(target, draft, tokens)
    with torch.no_grad():
        greedy = target(tokens).logits[0].argmax(-1)  # (T,)
    b = draft.block_size
    assert verified.tolist() == [b - 1] * len(leads)
    for i, a in enumerate(range(4, 16 - b + 1)):
        block = torch.tensor([[tokens[0, a].item()] + [draft.mask_token_id] * (b - 1)])
        with torch.no_grad():
            h = draft(
                torch.arange(a + b)[None],
                noise_embedding=target.embed(block),
                target_hidden=features[:, :a],
                past_key_values=draft.make_cache(),
            )[:, 1:]
            z = draft.compute_logits(h, target.output_head)
            path = draft.candidate_selector.select(h, z, block[:, 0], 0.0)[0]
            paths = best_paths(draft.candidate_selector, h, z, block[:, 0], 5)[0][0]  # (5, b − 1)
        wanted = greedy[a : a + b - 1]
        assert int(leads[i]) == int((path[0] == wanted).long().cumprod(-1).sum()), (a, path, wanted)
        # the tree of the 5 best paths: the longest leading match of any, its distinct prefixes
        assert int(tree_leads[i]) == max(int((p == wanted).long().cumprod(-1).sum()) for p in paths)
        assert int(nodes[i]) == len({tuple(p[:t].tolist()) for p in paths for t in range(1, b)})
    assert (tree_leads >= leading_matches(draft, target, tokens, 4, paths=1)[0]).all()  # the best path is among them


def test_the_tree_measure_counts_prefixes_and_refuses_what_it_cannot_measure():
    from dflash_ref.training.teacher_forced import teacher_forced, tree_nodes

    # paths 1 2 3 / 1 2 4 / 1 5 3 / 6 2 3: prefixes 1, 12, 123, 124, 15, 153, 6, 62, 623
    assert tree_nodes(torch.tensor([[[1, 2, 3], [1, 2, 4], [1, 5, 3], [6, 2, 3]]])).tolist() == [9]
    target, draft = make_pair(6, draft_overrides=dflash2(kernel=2, top_k=3))
    rows = [{"ids": _sequence(target, 16)[0].tolist(), "prompt_len": 4}]
    found = teacher_forced(draft, target, rows, paths=4)
    assert found["paths"] == 4 and 7 <= found["mean_nodes"] <= 4 * (draft.block_size - 1)  # K = 3: ≥ 1 + 2 + 4
    with pytest.raises(ValueError, match=r"paths=0: must be 1 … K\^\(b − 1\)"):
        teacher_forced(draft, target, rows, paths=0)
    _, dflash1 = make_pair(6)
    with pytest.raises(ValueError, match="needs a DFlash 2 draft"):
        teacher_forced(dflash1, target, rows, paths=2)


def target_features_of(target, draft, tokens):
    from dflash_ref.training.features import target_features

    return target_features(target, tokens, draft.target_layer_ids)


def test_the_selector_loss_by_hand():
    from dflash_ref.training.selector_loss import selector_loss

    class Fixed:  # scores given, candidates given: the loss alone
        def teacher_forced(self, hidden, logits, previous, vocab=None):
            return torch.tensor([[[3, 5], [1, 2]]]), torch.tensor([[[0.0, 1.0], [2.0, 2.0]]])

    # position 1: label 5 is candidate 1 → CE = log(1 + e^{−1}); position 2: label 7 is no candidate → left out
    loss = selector_loss(Fixed(), None, None, None, torch.tensor([[5, 7]]), torch.tensor([1.0, 0.5]))
    assert math.isclose(float(loss), math.log(1 + math.exp(-1)), rel_tol=1e-6)
    nothing = selector_loss(Fixed(), None, None, None, torch.tensor([[4, 7]]), torch.tensor([1.0, 0.5]))
    assert float(nothing) == 0.0


def test_a_tiny_dflash2_training_run_lowers_both_losses_and_trains_every_weight():
    from dflash_ref.training.features import target_features
    from dflash_ref.training.recipe import loss_weights, make_optimizer, train_step

    target, draft = make_pair(5, draft_overrides=dflash2(kernel=2, top_k=3))
    sequences = [_sequence(target, 24, seed) for seed in range(3)]
    batch = [(t, target_features(target, t, draft.target_layer_ids), torch.arange(4, 20, 3)) for t in sequences]
    before = {n: p.detach().clone() for n, p in draft.named_parameters()}
    optimizer, schedule = make_optimizer(draft, 3e-3, 60, 5)
    losses = [
        train_step(draft, target, batch, loss_weights(draft.block_size, 4.0), optimizer, schedule) for _ in range(60)
    ]
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5]), losses[::10]
    unchanged = [n for n, p in draft.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == [], unchanged  # the codebooks, P, both convolutions' taps included


def test_identity_convolutions_make_each_layer_its_dflash1_layer_and_init_from_target_leaves_them():
    """`train`'s start for a DFlash 2 draft (drafts/random_draft.identity_convolutions_): with w_0 = 1 and
    every other tap 0, the draft's hidden states are those of the DFlash 1 draft with the same weights;
    `--init target` copies the layers around the convolutions, which have no target counterpart."""
    from dflash_ref.drafts.from_target import init_from_target
    from dflash_ref.drafts.random_draft import identity_convolutions_

    target, two = make_pair(3, draft_overrides=dflash2(kernel=3, group=4))
    _, one = make_pair(3)
    identity_convolutions_(two)
    shared = {k: v for k, v in two.state_dict().items() if k in one.state_dict()}
    assert set(one.state_dict()) <= set(shared)
    one.load_state_dict(shared)
    inputs = dict(noise_embedding=torch.randn(1, 4, 32), target_hidden=torch.randn(1, 3, 64))
    with torch.no_grad():
        assert torch.allclose(two(torch.arange(7)[None], **inputs), one(torch.arange(7)[None], **inputs), atol=1e-6)
        init_from_target(two, target)
    assert torch.equal(two.layers[0].mlp_conv.base_kernel[:, 0], torch.ones(2, 32))
    assert not two.layers[0].attention_conv.kernel_projection.weight.any()


def test_the_candidate_lattice_figure(tmp_path):
    from dflash_ref.trace import tracing
    from dflash_ref.trace.plots import plot_candidate_lattice, save_figure

    target, draft = make_pair(3, draft_overrides=dflash2(top_k=3))
    with tracing(draft, names=["draft.candidate_selector.*"]) as trace:
        spec_generate(draft, target, torch.tensor([[1, 2, 3]]), 9, on_step=trace.on_step)
    fig = plot_candidate_lattice(trace, 0, tokens=[f"t{i}" for i in range(draft.config.vocab_size)])
    assert save_figure(fig, tmp_path / "lattice.png").stat().st_size > 1000
    assert len(fig.axes[0].patches) == draft.block_size - 1  # one box per proposal position


def test_each_class_builds_its_own_version_and_make_draft_and_load_draft_pick_it(tmp_path):
    from dflash_ref.dflash2 import DFlash2DraftModel, make_draft, selector_of
    from dflash_ref.draft_model import DFlashDraftModel

    target, one = make_pair(0)
    two = make_draft(dataclasses.replace(one.config, **dflash2()))
    assert type(make_draft(one.config)) is DFlashDraftModel and type(two) is DFlash2DraftModel
    assert selector_of(one) is None and selector_of(two) is two.candidate_selector
    with pytest.raises(ConfigError, match="make_draft"):
        DFlashDraftModel(two.config)
    with pytest.raises(ConfigError, match="make_draft"):
        DFlash2DraftModel(one.config)
    for draft, kind in ((one, DFlashDraftModel), (two, DFlash2DraftModel)):
        save_draft(draft, tmp_path / kind.__name__)
        assert type(load_draft(tmp_path / kind.__name__)) is kind
