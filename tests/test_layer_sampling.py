"""Target-layer sampling (l_i = round(1 + i·(L − 4)/(n − 1)); n = 1: ⌊L/2⌋) and the +1 read offset."""

from __future__ import annotations

import pytest
import torch
from conftest import draft_config, make_pair, target_config

from dflash_ref.config import ConfigError
from dflash_ref.layer_sampling import HIDDEN_STATE_OFFSET, build_target_layer_ids, extract_context_feature


@pytest.mark.parametrize(
    "num_target_layers,num_draft_layers,expected",
    [
        (36, 5, [1, 9, 17, 25, 33]),  # Qwen3-8B, released draft: step (36 − 4)/4 = 8
        (28, 4, [1, 9, 17, 25]),  # step (28 − 4)/3 = 8
        (4, 2, [1, 1]),  # tiny target: 1 + (4 − 4)/1 = 1, the id repeats
        (7, 3, [1, 2, 4]),  # 1 + 1·3/2 = 2.5 → round half to even → 2; 1 + 3 = 4
        (9, 3, [1, 4, 6]),  # 1 + 1·5/2 = 3.5 → round half to even → 4; 1 + 5 = 6
        (36, 1, [18]),  # n = 1: ⌊36/2⌋
        (5, 1, [2]),  # ⌊5/2⌋
        (1, 1, [0]),
    ],
)
def test_layer_ids_by_hand(num_target_layers, num_draft_layers, expected):
    assert build_target_layer_ids(num_target_layers, num_draft_layers) == expected


def test_matches_the_official_formula():
    official = pytest.importorskip("dflash.model")
    for L in range(4, 65):
        for n in range(1, 9):
            assert build_target_layer_ids(L, n) == official.build_target_layer_ids(L, n), (L, n)


@pytest.mark.parametrize("args", [(0, 1), (5, 0), (-3, 2)])
def test_nonpositive_counts_are_refused(args):
    with pytest.raises(ValueError, match="need at least one target layer and one draft layer"):
        build_target_layer_ids(*args)


@pytest.mark.parametrize("num_target_layers", [1, 2])
def test_small_targets_out_of_range_ids_are_refused_by_the_config(num_target_layers):
    # the formula (as official) gives (2, 2) → [1, −1]; a draft config built on it is refused,
    # naming the call and the way out, instead of reading hidden_states[0] by accident
    assert min(build_target_layer_ids(num_target_layers, 2)) < 0
    with pytest.raises(ConfigError, match=rf"build_target_layer_ids\({num_target_layers}, 2\).*explicitly"):
        draft_config(target_config(num_hidden_layers=num_target_layers))
    assert build_target_layer_ids(3, 2) == [1, 0]  # the smallest target where n = 2 still fits


def index_coded_hidden_states(num_layers: int = 4):
    # hidden_states[j] is filled with the value j: 0 is the embedding output, j the output of layer j − 1
    return [torch.full((1, 2, 3), float(j)) for j in range(num_layers + 1)]


def test_extract_reads_hidden_states_at_id_plus_one():
    assert HIDDEN_STATE_OFFSET == 1
    hs = index_coded_hidden_states()
    # ids [0, 2] read entries 1 and 3
    out = extract_context_feature(hs, [0, 2])
    assert out.shape == (1, 2, 6)
    assert out[0, 0].tolist() == [1.0, 1.0, 1.0, 3.0, 3.0, 3.0]
    # the last layer (id 3) is entry 4; the order of ids is kept; repeats are allowed
    assert extract_context_feature(hs, [3, 0])[0, 1].tolist() == [4.0, 4.0, 4.0, 1.0, 1.0, 1.0]
    assert extract_context_feature(hs, [1, 1])[0, 0].tolist() == [2.0] * 6


def test_extract_against_the_official_function():
    official = pytest.importorskip("dflash.model")
    g = torch.Generator().manual_seed(0)
    hs = [torch.randn(2, 3, 4, generator=g) for _ in range(6)]
    for ids in ([1, 3], [0, 4], [2]):
        assert torch.equal(extract_context_feature(hs, ids), official.extract_context_feature(hs, ids))


@pytest.mark.parametrize("ids", [[4], [0, 4], [-1], [7, 1]])
def test_ids_out_of_range_are_refused(ids):
    with pytest.raises(
        ValueError,
        match=r"target layer ids \[.*\] do not fit a target with 4 layers "
        r"\(ids must lie in 0\.\.3\)",
    ):
        extract_context_feature(index_coded_hidden_states(), ids)


def test_empty_ids_are_refused():
    with pytest.raises(ValueError, match=r"target layer ids \[\] do not fit"):
        extract_context_feature(index_coded_hidden_states(), [])


def test_target_hidden_states_have_the_embedding_first():
    # the layout the +1 offset assumes: L + 1 entries, entry 0 = embedding output
    target, _ = make_pair(seed=2)
    ids = torch.tensor([[1, 5, 7]])
    out = target(ids)
    assert len(out.hidden_states) == target.config.num_hidden_layers + 1
    torch.testing.assert_close(out.hidden_states[0], target.embed(ids))
