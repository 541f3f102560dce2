"""SwiGLU: MLP(x) = W_down · (SiLU(W_gate · x) ⊙ (W_up · x)), with hand-set weights."""

from __future__ import annotations

import torch

from dflash_ref.mlp import SwiGLU


def swiglu(gate, up, down) -> SwiGLU:
    gate, up, down = (torch.tensor(w, dtype=torch.float32) for w in (gate, up, down))
    mlp = SwiGLU(gate.shape[1], gate.shape[0])
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(gate)
        mlp.up_proj.weight.copy_(up)
        mlp.down_proj.weight.copy_(down)
    return mlp


def test_one_by_one_by_hand():
    mlp = swiglu([[2.0]], [[3.0]], [[0.5]])
    # x = 1: SiLU(2) = 2·σ(2) = 2 · 0.8807971 = 1.7615942; ⊙ up 3 → 5.2847826; · 0.5 → 2.6423913
    # x = −1: SiLU(−2) = −2·σ(−2) = −2 · 0.1192029 = −0.2384058; ⊙ up −3 → 0.7152174; · 0.5 → 0.3576087
    # x = 0: SiLU(0) · 0 = 0
    out = mlp(torch.tensor([[1.0], [-1.0], [0.0]]))
    torch.testing.assert_close(out, torch.tensor([[2.6423913], [0.3576087], [0.0]]), rtol=0, atol=1e-6)


def test_two_by_two_by_hand():
    mlp = swiglu(gate=[[1.0, 0.0], [0.0, 1.0]], up=[[1.0, 1.0], [0.0, 2.0]], down=[[1.0, -1.0], [2.0, 0.0]])
    # x = [1, −1]: gate = [1, −1] → SiLU = [σ(1), −σ(−1)] = [0.7310586, −0.2689414]
    #              up = [1 − 1, 0 − 2] = [0, −2]; product = [0, 0.5378828]
    #              down = [0 − 0.5378828, 2·0 + 0] = [−0.5378828, 0]
    # x = [2, 1]:  gate = [2, 1] → [1.7615942, 0.7310586]; up = [3, 2] → product [5.2847826, 1.4621172]
    #              down = [5.2847826 − 1.4621172, 2 · 5.2847826] = [3.8226654, 10.5695652]
    out = mlp(torch.tensor([[[1.0, -1.0], [2.0, 1.0]]]))
    torch.testing.assert_close(out, torch.tensor([[[-0.5378828, 0.0], [3.8226654, 10.5695652]]]), rtol=0, atol=1e-6)


def test_shapes_and_no_biases():
    mlp = SwiGLU(3, 5)
    assert mlp.gate_proj.weight.shape == (5, 3) and mlp.up_proj.weight.shape == (5, 3)
    assert mlp.down_proj.weight.shape == (3, 5)
    assert sorted(mlp.state_dict()) == ["down_proj.weight", "gate_proj.weight", "up_proj.weight"]
    # no bias: zero input gives exactly zero output whatever the weights
    assert torch.equal(mlp(torch.zeros(2, 4, 3)), torch.zeros(2, 4, 3))


def test_gate_is_silu_not_relu_or_sigmoid():
    # gate weight 1, up weight 1, down 1: MLP(x) = SiLU(x) · x = x² σ(x); at x = −1: 1 · 0.2689414
    # (ReLU gating would give 0, a plain sigmoid gate σ(−1) · (−1) = −0.2689414)
    mlp = swiglu([[1.0]], [[1.0]], [[1.0]])
    torch.testing.assert_close(mlp(torch.tensor([[-1.0]])), torch.tensor([[0.2689414]]), rtol=0, atol=1e-6)
