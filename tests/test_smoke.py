"""The smoke check: full size is for a GPU; here its reduced size runs on the CPU (as in CI)."""

from __future__ import annotations

import pytest
import torch

from dflash_ref.bench.smoke import SIZES, run

pytestmark = pytest.mark.usefixtures("one_thread_module")  # tiny models: one thread is faster on a small machine


def test_tiny_smoke_is_lossless_and_the_oracle_accepts_whole_blocks():
    lines: list[str] = []
    result = run("tiny", say=lines.append)
    assert result["random_draft"]["first_difference_from_ar"] is None
    assert result["oracle_draft"]["first_difference_from_ar"] is None
    block = SIZES["tiny"]["block_size"]
    assert result["oracle_draft"]["mean_tokens_per_step"] > block - 1
    assert result["random_draft"]["mean_tokens_per_step"] < 1.5
    assert any("lossless" in line for line in lines)


def test_full_size_is_the_qwen3_8b_shape_and_skips_without_a_gpu():
    full = SIZES["full"]
    assert full["target"]["num_hidden_layers"] == 36 and full["target"]["hidden_size"] == 4096
    assert (
        full["target"]["num_attention_heads"],
        full["target"]["num_key_value_heads"],
        full["target"]["head_dim"],
        full["target"]["vocab_size"],
    ) == (32, 8, 128, 151936)
    assert full["draft_layers"] == 5 and full["block_size"] == 16 and full["new"] == 256
    if not torch.cuda.is_available():
        lines: list[str] = []
        assert run("full", say=lines.append) is None
        assert "no CUDA device" in lines[0]


def test_tiny_dflash2_smoke_checks_the_shapes_runs_the_selector_and_is_lossless():
    from dflash_ref.bench.smoke import DFLASH2_SIZES

    lines: list[str] = []
    result = run("tiny", say=lines.append, version=2)
    draft = DFLASH2_SIZES["tiny"]["draft"]
    assert result["version"] == 2
    assert result["random_draft"]["first_difference_from_ar"] is None
    assert result["oracle_draft"]["first_difference_from_ar"] is None
    assert result["oracle_draft"]["mean_tokens_per_step"] > draft["block_size"] - 1
    shapes = result["dflash2_shapes"]
    assert shapes["layers.1.mlp_conv.base_kernel"] == "(2, 2, 64)"  # (2, K, d)
    assert shapes["layers.0.attention_conv.kernel_projection.weight"] == "(16, 64)"  # 2·K·(64 / 16), d
    assert shapes["candidate_selector.successor_codebook"] == "(512, 16)"  # (V, r)
    assert shapes["candidate_selector.hidden_projection.weight"] == "(16, 64)"  # (r, d)
    assert result["draft_pass"]["candidates"] == "(1, 7, 16)"  # (1, γ, top_k)
    assert sum("lossless" in line for line in lines) == 2


def test_full_dflash2_is_shaped_like_the_released_qwen3_8_27b_draft_and_skips_without_a_gpu():
    from dflash_ref.bench.smoke import DFLASH2_SIZES, check_dflash2_shapes
    from dflash_ref.config import DraftConfig, TargetConfig
    from dflash_ref.dflash2 import make_draft
    from dflash_ref.target import Qwen3Target

    full = DFLASH2_SIZES["full"]
    t, d = full["target"], full["draft"]
    assert (t["hidden_size"], t["vocab_size"], t["num_hidden_layers"]) == (5120, 248320, 64)
    assert (d["num_hidden_layers"], d["block_size"], d["mask_token_id"], d["target_layer_ids"]) == (
        5,
        8,
        248070,
        [5, 19, 33, 47, 61],
    )
    assert (d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"], d["intermediate_size"]) == (
        32,
        8,
        128,
        17408,
    )
    assert (d["conv_kernel_size"], d["conv_group_size"], d["selector_rank"], d["selector_top_k"]) == (2, 16, 256, 16)
    with torch.device("meta"):  # the shapes, with no memory behind them
        target = Qwen3Target(TargetConfig(**t))
        draft = make_draft(
            DraftConfig(
                vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], num_target_layers=t["num_hidden_layers"], **d
            )
        )
    shapes = check_dflash2_shapes(draft)
    assert shapes["layers.4.mlp_conv.base_kernel"] == "(2, 2, 5120)"
    assert shapes["layers.0.attention_conv.kernel_projection.weight"] == "(1280, 5120)"
    assert shapes["candidate_selector.predecessor_codebook"] == "(248320, 256)"
    params = sum(p.numel() for p in draft.parameters())
    assert 3.8e9 < 2 * params < 3.9e9  # bf16 bytes: the released draft's 3.85 GB
    assert 2 * sum(p.numel() for p in target.parameters()) < 60e9  # fits one 80 GB GPU with the draft
    if not torch.cuda.is_available():
        lines: list[str] = []
        assert run("full", say=lines.append, version=2) is None
        assert "no CUDA device" in lines[0]


def test_smoke_refuses_what_it_cannot_check():
    from dflash_ref.bench.smoke import check_dflash2_shapes, dflash2_shapes, random_target
    from dflash_ref.config import TargetConfig
    from dflash_ref.drafts.random_draft import random_draft

    with pytest.raises(ValueError, match="version must be 1 or 2"):
        run("tiny", say=lambda _: None, version=3)
    target = random_target(TargetConfig(**SIZES["tiny"]["target"]), torch.device("cpu"), torch.float32)
    one = random_draft(target, 1, 4)
    with pytest.raises(ValueError, match="not a DFlash 2 draft"):
        check_dflash2_shapes(one)
    two = random_draft(
        target, 1, 4, version=2, conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4
    )
    assert set(check_dflash2_shapes(two)) == set(dflash2_shapes(two.config))
    two.candidate_selector.hidden_projection.weight = torch.nn.Parameter(torch.zeros(8, 32))
    with pytest.raises(ValueError, match=r"hidden_projection.weight: \(8, 32\) \(expected \(8, 64\)\)"):
        check_dflash2_shapes(two)


def test_the_command_line_passes_the_version(monkeypatch):
    import dflash_ref.bench.smoke as smoke
    from dflash_ref.__main__ import main

    calls = []
    monkeypatch.setattr(smoke, "run", lambda size, version=1, arch="qwen3": calls.append((size, version, arch)))
    main(["smoke", "--size", "tiny", "--version", "2"])
    main(["smoke", "--size", "tiny"])
    main(["smoke", "--arch", "qwen3_5"])
    assert calls == [("tiny", 2, "qwen3"), ("tiny", 1, "qwen3"), ("full", 1, "qwen3_5")]


def test_tiny_hybrid_smoke_rolls_gated_deltanet_back_and_is_lossless():
    from dflash_ref.bench.smoke_hybrid import HYBRID_SIZES

    lines: list[str] = []
    result = run("tiny", say=lines.append, arch="qwen3_5")
    assert result["arch"] == "qwen3_5" and result["layer_types"] == {"linear_attention": 6, "full_attention": 2}
    assert result["target_layer_ids"] == [1, 6]
    assert result["random_draft"]["first_difference_from_ar"] is None  # τ ≈ 0: a crop inside every verify
    assert result["random_draft"]["mean_tokens_per_step"] < 1.5
    assert result["oracle_draft"]["first_difference_from_ar"] is None
    assert result["oracle_draft"]["mean_tokens_per_step"] > HYBRID_SIZES["tiny"]["draft"]["block_size"] - 1
    assert sum("lossless" in line for line in lines) == 2


def test_full_hybrid_is_shaped_like_qwen3_5_27b_and_its_draft_and_skips_without_a_gpu():
    from dflash_ref.bench.smoke_hybrid import HYBRID_SIZES
    from dflash_ref.config import DraftConfig
    from dflash_ref.dflash2 import make_draft
    from dflash_ref.target import HybridConfig, Qwen3_5Target

    full = HYBRID_SIZES["full"]
    t, d = full["target"], full["draft"]
    with torch.device("meta"):  # the shapes, with no memory behind them
        target = Qwen3_5Target(HybridConfig(**t))
        draft = make_draft(
            DraftConfig(
                vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], num_target_layers=t["num_hidden_layers"], **d
            )
        )
    types = target.config.layer_types
    assert (types.count("linear_attention"), types.count("full_attention"), types[3]) == (48, 16, "full_attention")
    assert target.config.rotary_dim == 64  # 0.25 of head_dim 256
    assert tuple(target.model.layers[0].linear_attn.in_proj_qkv.weight.shape) == (2 * 16 * 128 + 48 * 128, 5120)
    assert tuple(target.model.layers[3].self_attn.q_proj.weight.shape) == (2 * 24 * 256, 5120)  # query and gate
    assert 50.0 < 2 * sum(p.numel() for p in target.parameters()) / 2**30 < 50.2  # bf16 GiB (+ vision, mtp: 51.75)
    assert 3.2 < 2 * sum(p.numel() for p in draft.parameters()) / 2**30 < 3.25  # the released draft's 3.22
    assert draft.target_layer_ids == [1, 16, 31, 46, 61]
    with pytest.raises(ValueError, match="arch must be 'qwen3' or 'qwen3_5'"):
        run("tiny", say=lambda _: None, version=2, arch="qwen3_5")
    if not torch.cuda.is_available():
        lines: list[str] = []
        assert run("full", say=lines.append, arch="qwen3_5") is None
        assert "no CUDA device" in lines[0]


def test_the_full_size_check_without_cuda_ran_nothing_and_says_so_by_its_exit_code(monkeypatch, capsys):
    from dflash_ref.__main__ import main
    from dflash_ref.cli.smoke import NOTHING_RAN

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["smoke"]) == NOTHING_RAN != 0  # a script must not read "skipped" as a pass
    assert "no CUDA device here" in capsys.readouterr().out
