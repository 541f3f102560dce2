"""RoPE with the sliced query: K rotated at all L_c + L_q positions, Q at the last L_q only."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.rope import RotaryEmbedding, apply_sliced_rope, rotate_half

# head_dim = 4, theta = 100: θ_i = 100^(−2i/4) for i = 0, 1 → [100⁰, 100^(−1/2)] = [1, 0.1]
C1, S1 = 0.5403023, 0.8414710  # cos 1,   sin 1
C01, S01 = 0.9950042, 0.0998334  # cos 0.1, sin 0.1
C2, S2 = -0.4161468, 0.9092974  # cos 2,   sin 2
C02, S02 = 0.9800666, 0.1986693  # cos 0.2, sin 0.2


def tables(positions, head_dim=4, theta=100.0, dtype=torch.float32):
    return RotaryEmbedding(head_dim, theta)(torch.tensor([positions]), dtype)


def test_rotate_half_by_hand():
    # [a, b] = [[1, 2], [3, 4]] → [−b, a] = [−3, −4, 1, 2] (halves, not interleaved pairs)
    assert rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]
    # twice is a half turn: −x
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    assert torch.equal(rotate_half(rotate_half(x)), -x)


def test_inverse_frequencies_by_hand():
    assert RotaryEmbedding(4, 100.0).inv_freq(torch.device("cpu")).tolist() == pytest.approx([1.0, 0.1])
    # head_dim 8, theta 10000: 10000^(−[0, 2, 4, 6]/8) = [1, 0.1, 0.01, 0.001]
    assert RotaryEmbedding(8, 10000.0).inv_freq(torch.device("cpu")).tolist() == pytest.approx(
        [1.0, 0.1, 0.01, 0.001], rel=1e-6
    )


def test_position_zero_is_the_identity_rotation():
    cos, sin = tables([0], head_dim=8, theta=1e6)
    assert cos.shape == sin.shape == (1, 1, 8)
    assert torch.equal(cos, torch.ones(1, 1, 8)) and torch.equal(sin, torch.zeros(1, 1, 8))


def test_cos_sin_tables_by_hand_at_positions_one_and_two():
    # angles p · [θ_0, θ_1, θ_0, θ_1] = p · [1, 0.1, 1, 0.1]
    cos, sin = tables([1, 2])
    torch.testing.assert_close(cos[0], torch.tensor([[C1, C01, C1, C01], [C2, C02, C2, C02]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin[0], torch.tensor([[S1, S01, S1, S01], [S2, S02, S2, S02]]), rtol=0, atol=1e-6)


def test_tables_are_returned_in_the_requested_dtype():
    cos, sin = tables([1, 2], dtype=torch.bfloat16)
    assert cos.dtype == sin.dtype == torch.bfloat16
    assert cos[0, 0, 0].item() == torch.tensor(C1).to(torch.bfloat16).item()


def test_batch_rows_get_their_own_positions():
    cos, _ = RotaryEmbedding(4, 100.0)(torch.tensor([[0, 1], [2, 2]]), torch.float32)
    torch.testing.assert_close(
        cos,
        torch.tensor([[[1, 1, 1, 1], [C1, C01, C1, C01]], [[C2, C02, C2, C02], [C2, C02, C2, C02]]]),
        rtol=0,
        atol=1e-6,
    )


def test_sliced_query_uses_the_last_rows_of_the_tables():
    # L_c = 1, L_q = 2: tables for positions [0, 1, 2]. K gets all three rows, Q rows 1 and 2.
    cos, sin = tables([0, 1, 2])
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]]).view(1, 1, 2, 4)
    k = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]).view(1, 1, 3, 4)
    q_rot, k_rot = apply_sliced_rope(q, k, cos, sin)
    # q row 0 at position 1: q ⊙ cos + rotate_half(q) ⊙ sin, rotate_half([1,0,0,0]) = [0,0,1,0]
    #   = [C1, 0, 0, 0] + [0, 0, S1, 0] = [0.5403023, 0, 0.8414710, 0]
    # q row 1 at position 2: rotate_half([1,2,3,4]) = [−3,−4,1,2]
    #   [1·C2 − 3·S2, 2·C02 − 4·S02, 3·C2 + 1·S2, 4·C02 + 2·S02]
    #   = [−0.4161468 − 2.7278922, 1.9601332 − 0.7946772, −1.2484404 + 0.9092974, 3.9202664 + 0.3973386]
    #   = [−3.1440390, 1.1654560, −0.3391430, 4.3176050]
    expected_q = torch.tensor([[C1, 0.0, S1, 0.0], [-3.1440390, 1.1654560, -0.3391430, 4.3176050]])
    torch.testing.assert_close(q_rot[0, 0], expected_q, rtol=0, atol=1e-6)
    # had Q taken the *first* rows (positions 0, 1) it would read [1,0,0,0] and row 1 at position 1
    # = [1·C1 − 3·S1, ...] = [−1.9841107, ...]: clearly different from the values above
    assert not torch.allclose(q_rot[0, 0, 0], q[0, 0, 0], atol=1e-3)
    assert abs(q_rot[0, 0, 1, 0].item() - (C1 - 3 * S1)) > 1.0
    # K: row 0 at position 0 unchanged; row 1 ([1,0,0,0]) at position 1 = [C1, 0, S1, 0];
    # row 2 ([0,1,0,0]) at position 2: rotate_half = [0,0,0,1] → [0, C02, 0, S02]
    expected_k = torch.tensor([[1.0, 2.0, 3.0, 4.0], [C1, 0.0, S1, 0.0], [0.0, C02, 0.0, S02]])
    torch.testing.assert_close(k_rot[0, 0], expected_k, rtol=0, atol=1e-6)


def test_sliced_rope_broadcasts_over_heads_with_gqa_shapes():
    # H_q = 4, H_kv = 2 (Q and K have different head counts): each head gets the same rotation
    cos, sin = tables([3, 4, 5])
    q = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(1, 4, 1, 4)
    k = torch.tensor([0.0, 0.0, 1.0, 0.0]).expand(1, 2, 3, 4)
    q_rot, k_rot = apply_sliced_rope(q, k, cos, sin)
    assert q_rot.shape == (1, 4, 1, 4) and k_rot.shape == (1, 2, 3, 4)
    # q at position 5: [cos 5, 0, sin 5, 0]
    for h in range(4):
        torch.testing.assert_close(
            q_rot[0, h, 0], torch.tensor([math.cos(5), 0.0, math.sin(5), 0.0]), rtol=0, atol=1e-6
        )
    # k = [0,0,1,0] at position 3: rotate_half = [−1,0,0,0] → [−sin 3, 0, cos 3, 0]
    torch.testing.assert_close(k_rot[0, 1, 0], torch.tensor([-math.sin(3), 0.0, math.cos(3), 0.0]), rtol=0, atol=1e-6)


def test_without_context_it_is_plain_rope():
    # L_c = 0: Q and K at the same positions, both rotated the same way
    cos, sin = tables([1, 2])
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]).view(1, 1, 2, 4)
    q_rot, k_rot = apply_sliced_rope(x, x.clone(), cos, sin)
    assert torch.equal(q_rot, k_rot)
    # position 1 of [1,2,3,4]: [1·C1 − 3·S1, 2·C01 − 4·S01, 3·C1 + S1, 4·C01 + 2·S01]
    #   = [0.5403023 − 2.5244130, 1.9900084 − 0.3993336, 1.6209069 + 0.8414710, 3.9800168 + 0.1996668]
    #   = [−1.9841107, 1.5906748, 2.4623779, 4.1796836]
    torch.testing.assert_close(
        q_rot[0, 0, 0], torch.tensor([-1.9841107, 1.5906748, 2.4623779, 4.1796836]), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        q_rot[0, 0, 1], torch.tensor([-3.1440390, 1.1654560, -0.3391430, 4.3176050]), rtol=0, atol=1e-6
    )


finite = st.floats(-4.0, 4.0, allow_nan=False, width=32)


@settings(max_examples=60, deadline=None)
@given(
    x=st.lists(finite, min_size=8, max_size=8),
    position=st.integers(0, 5000),
    theta=st.sampled_from([100.0, 10000.0, 1e6]),
)
def test_rotation_preserves_each_pair_norm(x, position, theta):
    # pairs are (x_i, x_{i + d_h/2}): each is rotated by its own angle, so its length is unchanged
    cos, sin = tables([position], head_dim=8, theta=theta)
    v = torch.tensor(x).view(1, 1, 1, 8)
    rotated, _ = apply_sliced_rope(v, v, cos, sin)
    before = v[..., :4] ** 2 + v[..., 4:] ** 2
    after = rotated[..., :4] ** 2 + rotated[..., 4:] ** 2
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    q=st.lists(finite, min_size=8, max_size=8),
    k=st.lists(finite, min_size=8, max_size=8),
    m=st.integers(0, 60),
    n=st.integers(0, 60),
    shift=st.integers(0, 60),
    theta=st.sampled_from([100.0, 10000.0]),
)
def test_scores_depend_only_on_relative_position(q, k, m, n, shift, theta):
    # ⟨RoPE(q, m), RoPE(k, n)⟩ = qᵀ R(n − m) k only depends on m − n, so shifting both by s keeps it
    rope = RotaryEmbedding(8, theta)

    def dot(pm: int, pn: int) -> float:
        cos_m, sin_m = rope(torch.tensor([[pm]]), torch.float64)
        cos_n, sin_n = rope(torch.tensor([[pn]]), torch.float64)
        qv = torch.tensor(q, dtype=torch.float64).view(1, 1, 1, 8)
        kv = torch.tensor(k, dtype=torch.float64).view(1, 1, 1, 8)
        q_rot, _ = apply_sliced_rope(qv, qv, cos_m, sin_m)
        _, k_rot = apply_sliced_rope(kv, kv, cos_n, sin_n)
        return float((q_rot * k_rot).sum())

    scale = 1 + sum(abs(a) for a in q) * sum(abs(b) for b in k)
    assert dot(m, n) == pytest.approx(dot(m + shift, n + shift), abs=1e-5 * scale)


def test_mismatched_tables_are_refused():
    cos, sin = tables([0, 1, 2])
    q, k = torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match="RoPE tables cover 3 positions but K has 2 and Q 1"):
        apply_sliced_rope(q, k, cos, sin)
    # more queries than keys cannot be "the last L_q of the keys"
    cos, sin = tables([0, 1])
    with pytest.raises(ValueError, match="K has 2 and Q 3"):
        apply_sliced_rope(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 2, 4), cos, sin)


def test_constructor_and_input_errors():
    with pytest.raises(ValueError, match="even head_dim, got 5"):
        RotaryEmbedding(5, 100.0)
    with pytest.raises(ValueError, match=r"position_ids must be \(batch, length\), got shape \(3,\)"):
        RotaryEmbedding(4, 100.0)(torch.arange(3), torch.float32)
    assert "head_dim=4, rope_theta=100.0" in repr(RotaryEmbedding(4, 100))
    assert list(RotaryEmbedding(4, 100).state_dict()) == []  # no parameters, no buffers


def test_matches_transformers_qwen3_rotary_embedding():
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=1e6)
    hf = transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding(config)
    positions = torch.tensor([[0, 1, 7, 1000, 40000]])
    x = torch.zeros(1, 5, 16)
    cos_hf, sin_hf = hf(x, positions)
    cos, sin = RotaryEmbedding(16, 1e6)(positions, torch.float32)
    torch.testing.assert_close(cos, cos_hf, rtol=0, atol=0)
    torch.testing.assert_close(sin, sin_hf, rtol=0, atol=0)
