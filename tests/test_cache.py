"""KV cache: update appends along the sequence, crop(n) keeps the first n positions, length reads layer 0."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dflash_ref.cache import KVCache


def kv(values, heads: int = 1, head_dim: int = 1):
    """Keys holding `values` along the sequence (B = 1); values are the keys negated."""
    k = torch.tensor(values, dtype=torch.float32).view(1, 1, -1, 1).expand(1, heads, -1, head_dim).clone()
    return k, -k


def seq(tensor: torch.Tensor) -> list[float]:
    return tensor[0, 0, :, 0].tolist()


def test_update_appends_and_returns_the_whole_layer():
    cache = KVCache(2)
    assert cache.lengths() == [0, 0] and cache.length == 0 and len(cache) == 2
    k, v = cache.update(*kv([1, 2, 3]), 0)
    assert seq(k) == [1, 2, 3] and seq(v) == [-1, -2, -3]
    k, v = cache.update(*kv([4, 5]), 0)
    # concat[[1, 2, 3], [4, 5]] along the sequence axis
    assert seq(k) == [1, 2, 3, 4, 5] and seq(v) == [-1, -2, -3, -4, -5]
    assert k.shape == (1, 1, 5, 1)
    assert cache.lengths() == [5, 0] and cache.length == 5
    cache.update(*kv([9]), 1)
    assert cache.lengths() == [5, 1] and cache.get_seq_length(1) == 1
    assert repr(cache) == "KVCache(layers=2, lengths=[5, 1])"


def test_crop_keeps_the_first_positions_of_every_layer():
    cache = KVCache(2)
    cache.update(*kv([1, 2, 3, 4]), 0)
    cache.update(*kv([5, 6, 7, 8]), 1)
    cache.crop(2)
    assert cache.lengths() == [2, 2]
    assert seq(cache.keys[0]) == [1, 2] and seq(cache.values[1]) == [-5, -6]
    cache.crop(2)  # crop to the current length: nothing changes
    assert seq(cache.keys[1]) == [5, 6]
    cache.crop(0)
    assert cache.lengths() == [0, 0]
    k, _ = cache.update(*kv([7]), 0)  # appending after a crop continues from the cropped state
    assert seq(k) == [7]


def test_draft_style_crop_back_to_start():
    # the draft loop: context K/V (3 positions) + block K/V (4) appended, then cropped back to start = 3
    cache = KVCache(1)
    cache.update(*kv([10, 11, 12]), 0)
    cache.update(*kv([0, 0, 0, 0]), 0)
    cache.crop(3)
    k, _ = cache.update(*kv([13, 1, 1, 1, 1]), 0)  # one new context position + the next block
    assert seq(k) == [10, 11, 12, 13, 1, 1, 1, 1]


def test_multi_head_contents_are_kept():
    cache = KVCache(1)
    k = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).view(2, 3, 2, 4)  # (B, H_kv, L, d_h)
    cache.update(k, k + 100, 0)
    k2 = -torch.ones(2, 3, 1, 4)
    out_k, out_v = cache.update(k2, k2, 0)
    assert torch.equal(out_k, torch.cat([k, k2], 2)) and torch.equal(out_v, torch.cat([k + 100, k2], 2))
    cache.crop(1)
    assert torch.equal(cache.keys[0], k[:, :, :1]) and torch.equal(cache.values[0], k[:, :, :1] + 100)


@pytest.mark.parametrize("length", [4, -1])
def test_crop_out_of_range_is_refused(length):
    cache = KVCache(1)
    cache.update(*kv([1, 2, 3]), 0)
    with pytest.raises(ValueError, match=f"cannot crop a cache of length 3 to {length}"):
        cache.crop(length)
    assert cache.length == 3  # unchanged


def test_crop_of_an_empty_cache():
    cache = KVCache(3)
    cache.crop(0)
    with pytest.raises(ValueError, match="cannot crop a cache of length 0 to 1"):
        cache.crop(1)


@pytest.mark.parametrize("layer", [2, -1, 5])
def test_layer_out_of_range_is_refused(layer):
    with pytest.raises(IndexError, match=f"layer {layer} is outside this 2-layer cache"):
        KVCache(2).update(*kv([1]), layer)


def test_shape_mismatches_are_refused():
    cache = KVCache(1)
    with pytest.raises(ValueError, match=r"keys \(1, 1, 2, 1\) and values \(1, 1, 3, 1\) must have the same shape"):
        cache.update(torch.zeros(1, 1, 2, 1), torch.zeros(1, 1, 3, 1), 0)
    cache.update(*kv([1, 2], heads=2, head_dim=4), 0)
    for bad in (torch.zeros(1, 3, 1, 4), torch.zeros(2, 2, 1, 4), torch.zeros(1, 2, 1, 8)):
        with pytest.raises(
            ValueError,
            match=r"layer 0 caches \(1, 2, 2, 4\); cannot append .* "
            r"\(batch, heads and head_dim must match\)",
        ):
            cache.update(bad, bad, 0)
    assert cache.length == 2


def test_needs_a_layer():
    with pytest.raises(ValueError, match="at least one layer, got 0"):
        KVCache(0)


class CacheMachine(RuleBasedStateMachine):
    """Model: one plain Python list of numbers per layer (keys; values are the negated keys)."""

    LAYERS = 3

    def __init__(self):
        super().__init__()
        self.cache = KVCache(self.LAYERS)
        self.model: list[list[float]] = [[] for _ in range(self.LAYERS)]
        self.counter = 0

    def fresh(self, n: int) -> list[float]:
        values = [float(self.counter + i) for i in range(n)]
        self.counter += n
        return values

    @rule(n=st.integers(1, 4))
    def append_every_layer(self, n):
        # the loop's case: every layer gets the same number of new positions
        for layer in range(self.LAYERS):
            values = self.fresh(n)
            k, v = self.cache.update(*kv(values, heads=2), layer)
            self.model[layer] += values
            assert seq(k) == self.model[layer] and seq(v) == [-x for x in self.model[layer]]

    @rule(layer=st.integers(0, LAYERS - 1), n=st.integers(1, 3))
    def append_one_layer(self, layer, n):
        values = self.fresh(n)
        self.cache.update(*kv(values, heads=2), layer)
        self.model[layer] += values

    @rule(data=st.data())
    def crop(self, data):
        # valid lengths: 0..length of layer 0 (the cache's `length`)
        n = data.draw(st.integers(0, len(self.model[0])))
        self.cache.crop(n)
        self.model = [layer[:n] for layer in self.model]

    @rule(extra=st.integers(1, 3))
    def crop_too_far_is_refused(self, extra):
        with pytest.raises(ValueError):
            self.cache.crop(len(self.model[0]) + extra)

    @invariant()
    def layers_equal_the_model(self):
        assert self.cache.lengths() == [len(layer) for layer in self.model]
        assert self.cache.length == len(self.model[0])
        for i, layer in enumerate(self.model):
            if self.cache.keys[i] is None:
                assert layer == []
                continue
            assert self.cache.keys[i].shape == (1, 2, len(layer), 1)
            assert seq(self.cache.keys[i]) == layer
            assert seq(self.cache.values[i]) == [-x for x in layer]
            assert torch.equal(self.cache.keys[i][:, 0], self.cache.keys[i][:, 1])


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
