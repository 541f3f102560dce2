"""dflash-mlx 0.1.8 as a port of the kit (conformance/ports/pypi/dflash_mlx.py), and the MLX pieces it shares with the
other MLX ports (ports/mlx_taps.py, also mlx-dspark's): the mapping checked on hand-made inputs, without the port
installed (CI does not install the ports); the taps on mlx itself where mlx is installed; and one run of the real
port where it is."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from dflash_ref.conformance import load_bundle
from dflash_ref.conformance.bundle import SHIPPED
from dflash_ref.conformance.port import outputs
from dflash_ref.conformance.ports import mlx_taps
from dflash_ref.conformance.ports.pypi import dflash_mlx as port
from dflash_ref.conformance.report import NotApplicable
from dflash_ref.conformance.variants import check_variants

WALKTHROUGH = SHIPPED / "01_walkthrough"


def test_declared_variants_are_the_kits_and_nothing_is_waived():
    assert check_variants(port.DFlashMLXPort.variants) == port.DFlashMLXPort.variants
    assert port.DFlashMLXPort.name == "dflash-mlx" and port.DFlashMLXPort.skip == ()


def test_a_crash_is_located_in_its_package_and_the_release_that_ran_is_named():
    assert port.DFlashMLXPort.package == "dflash_mlx"
    installed = importlib.util.find_spec("dflash_mlx") is not None
    assert (port.DFlashMLXPort().version is not None) == installed


def test_a_dflash2_draft_is_refused_by_design_a_dflash1_draft_is_not():
    assert port.refusal({"architectures": ["DFlashDraftModel"], "dflash_config": {}}) is None
    assert port.refusal({}) is None
    why = port.refusal({"architectures": ["DFlash2DraftModel"]})
    assert "DFlash 1 only" in why and "0.1.8" in why


def test_per_head_tensors_go_heads_first():
    q = np.arange(2 * 3 * 4).reshape(2, 3, 4)  # (L, H, d_h) as the port's q_norm returns it, batch dropped
    out = mlx_taps.heads_first(q)
    assert out.shape == (3, 2, 4) and np.array_equal(out[1, 0], q[0, 1])


def test_values_are_context_then_block_by_kv_head():
    heads, d_h = 2, 3
    context = np.arange(4 * heads * d_h).reshape(4, heads * d_h)  # (L_c, H_kv·d_h): v_proj on the context
    block = -np.arange(1, 2 * heads * d_h + 1).reshape(2, heads * d_h)  # (L_q, H_kv·d_h): on the block
    v = mlx_taps.values_by_head(context, block, heads)
    assert v.shape == (heads, 4 + 2, d_h)
    assert np.array_equal(v[1, 0], context[0, d_h:]) and np.array_equal(v[0, 4], block[0, :d_h])


def test_k_and_v_of_the_context_then_the_block_become_the_kits_stages():
    pairs, prefix = mlx_taps.ContextThenBlock(), "draft.layers.1."
    k_ctx, k_block = np.ones((1, 4, 2, 3)), np.zeros((1, 2, 2, 3))  # (1, L, H_kv, d_h): k_norm on context, block
    assert pairs.add(prefix, "k_norm", k_ctx, 2) == {}  # the context's: kept until the block's comes
    v_ctx = np.arange(4 * 6).reshape(1, 4, 6)  # (1, L_c, H_kv·d_h): v_proj on the context, between them
    assert pairs.add(prefix, "v_proj", v_ctx, 2) == {}
    k = pairs.add(prefix, "k_norm", k_block, 2)
    assert {n: a.shape for n, a in k.items()} == {
        prefix + "self_attn.hook_k_ctx": (2, 4, 3),
        prefix + "self_attn.hook_k_noise": (2, 2, 3),
    }
    v = pairs.add(prefix, "v_proj", -np.ones((1, 2, 6)), 2)[prefix + "self_attn.hook_v"]
    assert v.shape == (2, 6, 3) and v[1, 0].tolist() == [3, 4, 5] and v[0, 4].tolist() == [-1, -1, -1]
    assert pairs.pending == {}


def test_loop_values_and_output_ids():
    proposals, posterior, tau, bonus = port.step_values(np.array([5, 4, 4, 4]), 2, np.array([5, 4, 9], np.uint32))
    assert (proposals, posterior, tau, bonus) == ([5, 4, 9], [5, 4, 4, 4], 2, 4)  # the bonus is posterior[τ]
    assert port.step_values([7], 0, [])[0] == []  # a block of one token: no proposals
    out = outputs({}, [1, 2, 3], np.array([9, 5], np.uint32), [0, 2])  # its stream's tokens, after the prompt
    assert out["output_ids"].dtype == np.int64 and out["output_ids"].tolist() == [1, 2, 3, 9, 5]
    assert out["prefill/first_token"] == 9 and out["prefill/layer_ids"].tolist() == [0, 2]
    assert "prefill/first_token" not in outputs({}, [1, 2, 3], [])  # x_0 not produced: not recorded


def test_not_installed_is_not_applicable_with_its_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "dflash_mlx", None)  # an import of it raises ModuleNotFoundError
    with pytest.raises(NotApplicable) as e:
        port.DFlashMLXPort().run(load_bundle(WALKTHROUGH))
    assert "pip install 'dflash-ref[mlx]' dflash-mlx==0.1.8" in str(e.value)


def test_a_dflash2_bundle_is_not_applicable_before_anything_is_imported(tmp_path, monkeypatch):
    bundle = load_bundle(WALKTHROUGH)
    config = {**bundle.config("draft"), "architectures": ["DFlash2DraftModel"]}
    monkeypatch.setattr(type(bundle), "config", lambda self, which: config if which == "draft" else {})
    monkeypatch.setitem(sys.modules, "dflash_mlx", None)
    with pytest.raises(NotApplicable, match="DFlash 1 only"):
        port.DFlashMLXPort().run(bundle)


def test_require_names_the_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "no_such_port_xyz", None)
    with pytest.raises(NotApplicable, match="no_such_port_xyz is not installed: pip install x"):
        mlx_taps.require(("json", "no_such_port_xyz"), "pip install x")
    with pytest.raises(NotApplicable, match="no_such_port_xyz.sub is not installed"):  # one the install brings
        mlx_taps.require(("no_such_port_xyz.sub",), "pip install x", installs=("no_such_port_xyz",))
    with pytest.raises(ModuleNotFoundError):  # not the install's: the port's own import error
        mlx_taps.require(("no_such_port_xyz",), "pip install x", installs=("another",))


def test_taps_see_arguments_and_outputs_and_are_undone():
    class Helper:
        def double(self, x):
            return 2 * x

    helper, seen = Helper(), []
    stored = helper.double
    helper.stored = stored  # an instance attribute the object holds itself (a bound method a port stored on it)
    ns = SimpleNamespace(f=len)
    with mlx_taps.Taps() as taps:
        taps.on(helper, "double", after=lambda out, x: seen.append((x, out)), before=lambda x: seen.append(x))
        assert helper.double(3) == 6 and helper.double.__name__ == "double"  # other attributes: the target's
        taps.on(helper, "stored", after=lambda out, x: seen.append(("stored", out)))
        assert helper.stored(1) == 2
        taps.on(json, "dumps", after=lambda out, obj: seen.append(("dumps", out)))  # a module's global
        assert json.dumps(1) == "1"
        taps.replace(ns, "f", sum)
        assert ns.f([1, 2]) == 3
        taps.keep(Helper, "double")
        Helper.double = lambda self, x: 0
    assert seen == [3, (3, 6), ("stored", 2), ("dumps", "1")]
    assert "double" not in helper.__dict__ and helper.__dict__["stored"] is stored and ns.f is len
    assert json.dumps.__module__ == "json" and Helper().double(2) == 4


def test_a_gathered_table_hands_back_and_shows_the_rows_the_port_takes():
    seen = []
    table = mlx_taps.Gathered(np.arange(10) * 10, lambda rows, ids: seen.append((rows.tolist(), ids)))
    assert table[[1, 2]].tolist() == [10, 20] and table.shape == (10,)  # other attributes: the table's
    assert seen == [([10, 20], [1, 2])]


def test_rows_concatenate_the_calls_of_one_stage():
    rows = mlx_taps.Rows()
    assert rows.take() is None
    rows.add(np.ones((2, 3)))
    rows.add(np.zeros((1, 3)))
    assert rows.take().tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 0]] and rows.take() is None


def test_a_loops_variables_are_read_off_its_frame():
    def loop():
        posterior = [4, 5]  # noqa: F841  (read off the frame)
        yield probe()

    def probe():
        return mlx_taps.running_locals("loop")["posterior"]

    def outer():
        yield from loop()

    assert next(outer()) == [4, 5]  # read while the loop runs (a tap it called), through `yield from`
    with pytest.raises(KeyError):
        mlx_taps.running_locals("no_such_loop")


def test_mask_bias_reads_every_kind_of_mask():
    assert (mlx_taps.mask_bias(None, 2, 3) == 0).all()
    causal = mlx_taps.mask_bias("causal", 2, 4)  # aligned to the last key: query 0 sees keys 0..2
    assert np.isfinite(causal).tolist() == [[True, True, True, False], [True, True, True, True]]
    boolean = np.array([[[[True, False], [True, True]]]])  # (1, 1, L_q, L_k)
    assert mlx_taps.mask_bias(boolean, 2, 2).tolist() == [[0, -np.inf], [0, 0]]
    additive = np.array([[0.5, -np.inf], [0.0, -1.0]], np.float32)  # added to the scores as it is
    assert mlx_taps.mask_bias(additive, 2, 2).tolist() == additive.tolist()
    with pytest.raises(ValueError):
        mlx_taps.mask_bias("sliding", 2, 2)


def test_attention_weights_from_a_kernels_own_inputs():
    mx = pytest.importorskip("mlx.core")
    mx.random.seed(0)
    q, k, v = mx.random.normal((1, 4, 3, 8)), mx.random.normal((1, 2, 5, 8)), mx.random.normal((1, 2, 5, 8))
    mask = mx.array(np.tril(np.ones((3, 5), bool), k=2))  # (L_q, L_k): True attends
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=8**-0.5, mask=mask)
    weights = mlx_taps.attention_weights(q, k, v, 8**-0.5, mask, out)
    assert weights.shape == (4, 3, 5) and np.allclose(weights.sum(-1), 1)
    assert np.all(weights[:, 0, 3:] == 0)  # the mask's zeros
    with pytest.raises(AssertionError, match="do not reproduce"):
        mlx_taps.attention_weights(q, k, v, 8**-0.5, None, out)  # not the weights the kernel used


def test_attention_weights_are_softmax_under_the_mask_by_kv_group():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(1, 4, 3, 2)), rng.normal(size=(1, 2, 5, 2)), rng.normal(size=(1, 2, 5, 2))  # GQA
    scores = q[0] @ np.repeat(k[0], 2, 0).transpose(0, 2, 1) * 0.5 + mlx_taps.mask_bias("causal", 3, 5)
    expected = np.exp(scores - scores.max(-1, keepdims=True))  # (H_q, L_q, L_k)
    expected /= expected.sum(-1, keepdims=True)
    out = (expected @ np.repeat(v[0], 2, 0))[None]  # (1, H_q, L_q, d_h): query head h reads KV head h // 2
    got = mlx_taps.attention_weights(q, k, v, 0.5, "causal", out)
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert got[0, 0, 3:].sum() == 0  # masked keys weigh exactly 0
    with pytest.raises(AssertionError, match="do not reproduce"):
        mlx_taps.attention_weights(q, k, v, 0.5, None, out)  # another mask: not the kernel's weights


def test_a_tapped_mlx_submodule_records_its_output_and_keeps_its_parameters():
    pytest.importorskip("mlx.core")
    import mlx.core as mx
    import mlx.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(2, 3)

        def __call__(self, x):
            return self.proj(x) * 2

    block, seen = Block(), []
    with mlx_taps.Taps() as taps:
        taps.on(block, "proj", after=lambda out, x: seen.append(mlx_taps.as_numpy(out)))
        y = block(mx.ones((1, 2)))
        assert "proj" in block.parameters() and block.proj.weight.shape == (3, 2)  # through the stand-in
    assert len(seen) == 1 and np.allclose(2 * seen[0], mlx_taps.as_numpy(y))
    assert isinstance(block.proj, nn.Linear) and "proj" not in block.__dict__


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("dflash_mlx") is None, reason="dflash-mlx is not installed (.ci/ports)"
)
def test_the_real_port_on_the_shipped_walkthrough():
    """Every tensor of the walkthrough agrees with DFlash's; the one failure is its bug: one more target verify
    (a block of one token, the last bonus) after its output is complete
    (reports/dflash-mlx-extra-verify-after-last-token.md)."""
    from dflash_ref.conformance import verify

    report = verify("dflash_ref.conformance.ports.pypi.dflash_mlx:DFlashMLXPort", WALKTHROUGH)
    failed = [c for c in report.checks if c.status == "FAIL"]
    assert [c.stage for c in failed] == ["extra_step"], report.text()
    assert "past max_new_tokens" in failed[0].detail
    assert not [c for c in report.checks if c.manifest and c.status not in ("pass",)], report.text()
