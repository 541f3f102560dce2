"""The verify gate (extensions/verify_gate.py): L = b if c_1·c_2 ≥ θ else 2, by hand; lossless in the loop,
greedy (here) and sampled (test_lossless.py's distribution cases); bad thresholds refused."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import hand_selector, make_pair

from dflash_ref import generate, spec_generate
from dflash_ref.drafts.oracle import OracleDraft
from dflash_ref.extensions import VerifyGate
from dflash_ref.extensions.verify_gate import check_gate, draft_confidence, gated_verify_size, selector_confidence
from dflash_ref.trace import StepLog

pytestmark = pytest.mark.usefixtures("one_thread_module")


def test_confidence_by_hand():
    # logits [0, ln 3, −∞] → softmax [1/4, 3/4, 0]; [ln 2, 0, ln 2] → [2/5, 1/5, 2/5]: c = the largest
    logits = torch.tensor([[[0.0, math.log(3), -math.inf], [math.log(2), 0.0, math.log(2)]]])
    assert torch.allclose(draft_confidence(logits), torch.tensor([[0.75, 0.4]]))
    # sampled proposals: read from the distributions they are drawn from (temperature, top-p applied)
    probs = torch.tensor([[[0.1, 0.9, 0.0], [0.5, 0.2, 0.3]]])
    assert torch.equal(draft_confidence(logits, probs), torch.tensor([[0.9, 0.5]]))


def test_selector_confidence_by_hand():
    # test_dflash2's selector by hand (V = 3, rank 1, K = 2): from x_0 = 0 the candidates 1, 2 score 4 and −1.5;
    # after d_1 = 1 they score −2 and 4.5; c_k = the larger softmax of the two, along the path [0, 1, 2]
    selector = hand_selector()
    logits, hidden = torch.tensor([[[0.0, 1.0, 1.5], [0.0, 1.0, 1.5]]]), torch.ones(1, 2, 1)
    c = selector_confidence(selector, hidden, logits, torch.tensor([[0, 1, 2]]))
    assert torch.allclose(c, torch.tensor([[1 / (1 + math.exp(-5.5)), 1 / (1 + math.exp(-6.5))]]))
    # the path decides the predecessors: after d_1 = 2 (E_pred 2) the candidates score 1 + 6 = 7 and 1.5 − 6
    c = selector_confidence(selector, hidden, logits, torch.tensor([[0, 2, 1]]))
    assert torch.allclose(c[0, 1], torch.tensor(1 / (1 + math.exp(-11.5))))
    # sampled proposals: q over the candidates, as drawn
    q = torch.tensor([[[0.3, 0.7], [0.6, 0.4]]])
    assert torch.equal(
        selector_confidence(selector, hidden, logits, torch.tensor([[0, 1, 2]]), q), torch.tensor([[0.7, 0.6]])
    )


def test_gated_size_by_hand():
    c = torch.tensor([[0.5, 0.75, 0.01]])  # c_1·c_2 = 0.375 exactly; c_3 plays no part
    assert gated_verify_size(c, 4, 0.3) == 4
    assert gated_verify_size(c, 4, 0.375) == 4  # ≥: the boundary verifies the whole block
    assert gated_verify_size(c, 4, 0.376) == 2
    assert gated_verify_size(c, 16, 0.0) == 16  # θ = 0: always whole (the official loop)
    assert gated_verify_size(torch.ones(1, 3), 4, 1.5) == 2  # θ > 1: never whole
    assert gated_verify_size(c, 4, None) == 4  # off
    assert gated_verify_size(torch.tensor([[0.0]]), 2, 0.5) == 2  # a block of 2 has nothing to cut


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "0.5", True, [0.5]])
def test_bad_threshold_is_refused(bad):
    with pytest.raises(ValueError, match="verify_gate"):
        check_gate(bad)
    with pytest.raises(ValueError, match="verify_gate"):
        VerifyGate(bad)


class SteppedConfidenceOracle(OracleDraft):
    """OracleDraft whose confidence alternates: sure (c ≈ 1) on even steps, unsure (c = 1/V) on odd
    ones, with the same proposals either way, so the gate's decision is known for every step."""

    def compute_logits(self, hidden, output_head):
        step = self._steps
        forced = super().compute_logits(hidden, output_head)  # ±1e4, one-hot
        return forced if step % 2 == 0 else torch.where(forced > 0, 1e-3, 0.0)


@pytest.mark.parametrize("block_size, accept", [(4, None), (5, 1), (3, [2, 0, 1, 2, 2, 0, 1])])
def test_gate_is_lossless_and_cuts_where_unsure(block_size, accept):
    target, draft = make_pair(7, dict(vocab_size=24), dict(block_size=block_size))
    prompt, n = torch.tensor([[3, 11, 5]]), 30
    ar = generate(target, prompt, n)
    records = StepLog()
    oracle = SteppedConfidenceOracle(draft, ar.output_ids[0], accept)
    out = spec_generate(oracle, target, prompt, n, extensions=[VerifyGate(0.5)], on_step=records)
    assert torch.equal(out.output_ids, ar.output_ids)
    for r in records:
        drafted = len(r.q_position_ids)
        assert len(r.draft_tokens) == drafted - 1  # every proposal is recorded
        expected = drafted if r.step % 2 == 0 or drafted <= 2 else 2
        assert r.verify_size == len(r.block_ids) == expected
        assert r.block_ids[1:] == r.draft_tokens[: expected - 1]
        assert r.acceptance_length <= expected - 1
        assert r.target_cache_after_verify == r.target_cache_before + expected
    assert any(r.verify_size == 2 < len(r.q_position_ids) for r in records)  # the gate did shut
    # the same oracle ungated: the same tokens
    ungated = spec_generate(OracleDraft(draft, ar.output_ids[0], accept), target, prompt, n)
    assert torch.equal(ungated.output_ids, ar.output_ids)


def test_gate_zero_verifies_every_block_whole():
    target, draft = make_pair(2, dict(vocab_size=16), dict(block_size=4))
    prompt, n = torch.tensor([[1, 2, 3]]), 20
    records = StepLog()
    plain = spec_generate(draft, target, prompt, n)
    gated = spec_generate(draft, target, prompt, n, extensions=[VerifyGate(0.0)], on_step=records)
    assert torch.equal(plain.output_ids, gated.output_ids)
    assert plain.acceptance_lengths == gated.acceptance_lengths
    assert all(r.verify_size == len(r.block_ids) == len(r.q_position_ids) for r in records)


def test_gate_calibration_bins_by_hand():
    """bench trained's calibration table: c_1·c_2 read at draft.hook_logits and binned. Here a hook
    attached first sets the logits the table reads (c_k = 0.95 on even draft passes, 0.5 on odd
    ones: c_1·c_2 = 0.9025 and 0.25) and an oracle sets τ (2 on even steps, 0 on odd ones)."""
    from dflash_ref.bench.trained import confidence_log, gate_calibration
    from dflash_ref.hooks import hooks

    target, draft = make_pair(5, dict(vocab_size=16), dict(block_size=4))
    prompt, n, accept = torch.tensor([[1, 2, 3]]), 14, [2, 0] * 10
    continuation = generate(target, prompt, n).output_ids[0]
    passes = [0]

    def set_confidence(logits, point):  # (1, γ, V) → the same shape
        c = 0.95 if passes[0] % 2 == 0 else 0.5
        passes[0] += 1
        out = torch.zeros_like(logits)
        out[..., 0] = math.log(c * (logits.shape[-1] - 1) / (1 - c))  # softmax's largest entry = c
        return out

    records = StepLog()
    spec_generate(OracleDraft(draft, continuation, accept), target, prompt, n, [], block_size=4, on_step=records)
    whole = [r for r in records if len(r.draft_tokens) >= 2]  # steps the table counts
    oracle = OracleDraft(draft, continuation, accept)
    with hooks(draft, set_confidence, lambda name: name == "draft.hook_logits"):
        output, confidences = confidence_log(oracle, lambda: spec_generate(oracle, target, prompt, n, [], block_size=4))
    assert len(confidences) == passes[0] == output.num_draft_passes
    table = gate_calibration(confidences, [output])
    assert [r["c_1·c_2"] for r in table] == ["0.0 … 0.2", "0.2 … 0.4", "0.4 … 0.6", "0.6 … 0.8", "0.8 … 1.0"]
    rows = {r["c_1·c_2"]: r for r in table}
    assert rows["0.8 … 1.0"]["steps"] == sum(r.step % 2 == 0 for r in whole) > 0
    assert rows["0.2 … 0.4"]["steps"] == sum(r.step % 2 == 1 for r in whole) > 0
    assert sum(r["steps"] for r in table) == len(whole)
    assert rows["0.8 … 1.0"]["d_1 and d_2 accepted"] == 1.0 and rows["0.2 … 0.4"]["d_1 accepted"] == 0.0


def test_gate_calibration_splits_confidences_between_prompts():
    """The confidences of several prompts come as one list: each prompt takes one per step (every
    step makes one draft pass), by hand: prompt 1 has 3 steps, the last a pass of γ = 1 that logs
    None and is not counted, prompt 2 has 2 steps. Counts that do not match are refused."""
    from types import SimpleNamespace

    from dflash_ref.bench.trained import gate_calibration

    outputs = [
        SimpleNamespace(num_draft_passes=3, acceptance_lengths=[2, 0, 1]),
        SimpleNamespace(num_draft_passes=2, acceptance_lengths=[3, 1]),
    ]
    rows = {r["c_1·c_2"]: r for r in gate_calibration([0.9, 0.1, None, 0.85, 0.3], outputs)}
    assert [rows[k]["steps"] for k in rows] == [1, 1, 0, 0, 2]
    assert rows["0.8 … 1.0"]["d_1 and d_2 accepted"] == 1.0  # τ 2 and 3
    assert rows["0.2 … 0.4"]["d_1 accepted"] == 1.0 and rows["0.2 … 0.4"]["d_1 and d_2 accepted"] == 0.0
    assert rows["0.0 … 0.2"]["d_1 accepted"] == 0.0
    with pytest.raises(ValueError, match="left over"):
        gate_calibration([0.9, 0.1, None, 0.85, 0.3, 0.5], outputs)
    with pytest.raises(ValueError, match="not its passes"):
        gate_calibration([0.9, 0.1, None, 0.85], outputs)
    with pytest.raises(ValueError, match="not its passes"):
        gate_calibration(
            [0.9, 0.1, None, 0.85, 0.3], [SimpleNamespace(num_draft_passes=2, acceptance_lengths=[2, 0, 1]), outputs[1]]
        )
