"""RMSNorm(x) = w ⊙ x / sqrt(mean(x²) + eps), checked against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dflash_ref.rmsnorm import RMSNorm


def norm(dim: int, eps: float = 0.0, weight=None, dtype=torch.float32) -> RMSNorm:
    module = RMSNorm(dim, eps=eps)
    if weight is not None:
        with torch.no_grad():
            module.weight.copy_(torch.tensor(weight))
    return module.to(dtype)


def test_three_four_by_hand():
    # mean(x²) = (9 + 16) / 2 = 12.5, rms = sqrt(12.5) = 3.5355339
    # x / rms = [3 / 3.5355339, 4 / 3.5355339] = [0.8485281, 1.1313708]
    out = norm(2)(torch.tensor([3.0, 4.0]))
    expected = torch.tensor([0.8485281, 1.1313708])
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    # the defining property: the mean of the squares of the output is 1
    assert out.pow(2).mean().item() == pytest.approx(1.0, abs=1e-6)


def test_weight_scales_each_feature():
    # w = [2, −0.5]: [2 · 0.8485281, −0.5 · 1.1313708] = [1.6970563, −0.5656854]
    out = norm(2, weight=[2.0, -0.5])(torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(out, torch.tensor([1.6970563, -0.5656854]), rtol=0, atol=1e-6)


def test_mean_runs_over_last_dimension_only():
    # row 0 = [3, 4] as above; row 1 = [1, 1]: rms = 1 → [1, 1]; row 2 = [−2, 0]: rms = sqrt(2)
    # → [−2/1.4142136, 0] = [−1.4142136, 0]
    x = torch.tensor([[[3.0, 4.0], [1.0, 1.0], [-2.0, 0.0]]])  # (1, 3, 2)
    out = norm(2)(x)
    expected = torch.tensor([[[0.8485281, 1.1313708], [1.0, 1.0], [-1.4142136, 0.0]]])
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)


def test_eps_enters_under_the_square_root():
    # x = [1, 1], eps = 1: mean(x²) + eps = 2 → [1/√2, 1/√2] = [0.7071068, 0.7071068]
    out = norm(2, eps=1.0)(torch.tensor([1.0, 1.0]))
    torch.testing.assert_close(out, torch.tensor([0.7071068, 0.7071068]), rtol=0, atol=1e-6)
    # x = 0: without eps 0/0 = nan; with eps = 1e-6 the output is exactly 0
    assert torch.isnan(norm(2, eps=0.0)(torch.zeros(2))).all()
    assert torch.equal(norm(2, eps=1e-6)(torch.zeros(2)), torch.zeros(2))
    # x = [3, 4], eps = 12.5 (as large as mean(x²)): scale 1/sqrt(25) = 0.2 → [0.6, 0.8]
    torch.testing.assert_close(norm(2, eps=12.5)(torch.tensor([3.0, 4.0])), torch.tensor([0.6, 0.8]), rtol=0, atol=1e-7)


def test_bf16_casts_before_the_weight_multiplies():
    # x = [3, 4] (exact in bf16), w = [3, 3] (exact), eps = 0. The float32 normalised value of the
    # second feature is 4 / sqrt(12.5) = 1.1313708.
    #   cast first (the documented order, as transformers' Qwen3RMSNorm):
    #     bf16(1.1313708): spacing in [1, 2) is 2⁻⁷ = 0.0078125; 1.1313708 / 0.0078125 = 144.82 → 145
    #     → 1.1328125; then 3 · 1.1328125 = 3.3984375, bf16 spacing in [2, 4) is 2⁻⁶ = 0.015625,
    #     3.3984375 / 0.015625 = 217.5 → ties-to-even → 218 → 3.40625
    #   multiply first would give bf16(3 · 1.1313708 = 3.3941125): 217.22 → 217 → 3.390625
    # first feature: bf16(0.8485281) = 217 · 2⁻⁸ = 0.84765625, · 3 = 2.54296875 → 162.75 → 163 · 2⁻⁶
    # = 2.546875 (both orders agree there)
    module = norm(2, weight=[3.0, 3.0], dtype=torch.bfloat16)
    out = module(torch.tensor([3.0, 4.0], dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    assert out.float().tolist() == [2.546875, 3.40625]


def test_bf16_input_with_float32_weight_returns_float32():
    # weight float32 · bf16(normalised) promotes to float32: 3 · 1.1328125 = 3.3984375 exactly
    module = norm(2, weight=[3.0, 3.0])
    out = module(torch.tensor([3.0, 4.0], dtype=torch.bfloat16))
    assert out.dtype == torch.float32
    assert out.tolist() == [3 * 0.84765625, 3 * 1.1328125]


def test_shape_error_names_the_expected_size():
    with pytest.raises(
        ValueError,
        match=r"RMSNorm over 4 features got a tensor of shape \(2, 3\)"
        r" \(last dimension must be 4\)",
    ):
        norm(4)(torch.zeros(2, 3))


def test_default_weight_is_one_and_repr():
    module = RMSNorm(3, eps=1e-5)
    assert module.weight.tolist() == [1.0, 1.0, 1.0]
    assert module.eps == 1e-5
    assert "3, eps=1e-05" in repr(module)
    # a constant vector c·1 normalises to 1 (up to eps): c = 7, mean(x²) = 49 → 7/7 = 1
    assert torch.allclose(module(torch.full((3,), 7.0)), torch.ones(3), atol=1e-6)
    assert math.isclose(module.weight.sum().item(), 3.0)
