"""The smoke check: full size is for a GPU; here its reduced size runs on the CPU (as in CI)."""
from __future__ import annotations

import torch

from dflash_ref.bench.smoke import SIZES, run


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
    assert (full["target"]["num_attention_heads"], full["target"]["num_key_value_heads"],
            full["target"]["head_dim"], full["target"]["vocab_size"]) == (32, 8, 128, 151936)
    assert full["draft_layers"] == 5 and full["block_size"] == 16 and full["new"] == 256
    if not torch.cuda.is_available():
        lines: list[str] = []
        assert run("full", say=lines.append) is None
        assert "no CUDA device" in lines[0]
