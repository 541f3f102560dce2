"""The mlx-dspark adapter's mapping (dflash_ref/conformance/ports/pypi/mlx_dspark.py), without mlx-dspark: its layout
functions on hand-made arrays, the loop values it reads from its caller's frame, its declaration, and its n/a with
the install line. The MLX pieces it shares with dflash-mlx (ports/mlx_taps.py) are tested in test_pypi_dflash_mlx.py.
One test runs the real port, where it is installed."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dflash_ref.conformance import find_bundles
from dflash_ref.conformance.ports.pypi import mlx_dspark as port
from dflash_ref.conformance.report import NotApplicable
from dflash_ref.conformance.variants import check_variants

WALKTHROUGH = Path(port.__file__).resolve().parents[2] / "bundles" / "01_walkthrough"


def test_declared_variants_are_known_choices():
    assert check_variants(port.MLXDSparkPort.variants) == {
        "draft_cache": "context-only",
        "last_block": "full-then-truncate",
        "sliding_window": "causal",
    }
    assert port.MLXDSparkPort.name == "mlx-dspark" and port.MLXDSparkPort.skip == []


def test_a_crash_is_located_in_its_package_and_the_release_that_ran_is_named():
    assert port.MLXDSparkPort.package == "mlx_dspark"
    installed = importlib.util.find_spec("mlx_dspark") is not None
    assert (port.MLXDSparkPort().version is not None) == installed


def test_missing_package_is_not_applicable_with_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx_dspark", None)  # `import mlx_dspark` raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "mlx_dspark.generate", None)
    with pytest.raises(NotApplicable) as e:
        port.port_modules()
    assert port.INSTALL in str(e.value) and "mlx-dspark==0.20.3" in port.INSTALL
    bundle = find_bundles(WALKTHROUGH)[0]
    with pytest.raises(NotApplicable, match="mlx-dspark==0.20.3"):
        port.MLXDSparkPort().run(bundle)


def test_another_missing_module_is_raised_not_hidden(monkeypatch):
    pytest.importorskip("mlx.core")
    real = importlib.import_module

    def fake(name, *args, **kwargs):
        if name == "mlx_dspark":  # the port imports a module that is neither it nor a requirement it declares
            raise ModuleNotFoundError("No module named 'somethingelse'", name="somethingelse")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ModuleNotFoundError, match="somethingelse"):
        port.port_modules()


def test_a_muse_draft_is_not_its_format():
    assert port.MLXDSparkPort.reads_muse is False  # verify says n/a before running it (transformers' format)


def test_conv_taps_are_prepares_then_finishes():
    taps = np.arange(2 * 2 * 2 * 3).reshape(2, 12)  # (L_q, 2·K·G), K = 2, G = 3
    t = port.conv_taps(taps, 2)
    assert t.shape == (2, 2, 2, 3) and t[1, 1, 0].tolist() == taps[1, 6:9].tolist()  # finish's first tap


def test_selector_pair_follows_the_path():
    candidates = np.array([[5, 7], [2, 9], [4, 1]])  # (γ, K)
    path = np.array([7, 2, 1])
    assert port.predecessor_rows(candidates, path) == [0, 1, 0]
    rng = np.random.default_rng(1)
    pred, succ, proj = rng.normal(size=(3, 2, 4)), rng.normal(size=(3, 2, 4)), rng.normal(size=(3, 4))
    pair = port.selector_pair(pred, proj, succ, candidates, path)
    want = np.stack(
        [succ[0] @ (pred[0, 0] * proj[0]), succ[1] @ (pred[1, 1] * proj[1]), succ[2] @ (pred[2, 0] * proj[2])]
    )
    np.testing.assert_allclose(pair, want)
    with pytest.raises(AssertionError, match="not among"):
        port.predecessor_rows(candidates, np.array([6, 2, 1]))


def test_stop_tokenizer_exposes_the_bundles_stops_only():
    real = SimpleNamespace(decode=lambda ids: "x" * len(ids), eos_token_id=2, eos_token_ids={2, 0})
    tok = port.StopTokenizer(real, [3, 5])
    assert tok.eos_token_ids == {3, 5} and tok.eos_token_id is None and tok.unk_token_id is None
    with pytest.raises(KeyError):
        tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode([1, 2]) == "xx"
    assert port.StopTokenizer(real, None).eos_token_ids == set()


def _recorder(selector=None):
    drafter = SimpleNamespace(config=SimpleNamespace(vocab_size=4), candidate_selector=selector, layers=[])
    return port.Reader(SimpleNamespace(), drafter)


def test_on_round_reads_the_loops_own_variables():
    recorder = _recorder()
    recorder.lengths = [7, 7, 7, 7, 11]

    def dflash_generate(on_round):  # the port's loop and names, as it holds them at on_round
        drafted, tt, n = [3, 1, 2], [3, 1, 0, 2], 2  # noqa: F841
        head = np.full((3, 4), 0.5, np.float32)  # noqa: F841
        on_round(drafted=3, accepted=n, committed=n + 1, cap=3, source="drafter")

    dflash_generate(recorder.on_round)
    assert recorder.step == 1
    assert recorder.steps == [[0, [3, 1, 2], [3, 1, 0, 2], 2, 0, [7, 7, 7, 7, 11]]]
    assert recorder.out["step0/draft.hook_logits"].shape == (3, 4)
    recorder.rolled_back(None, [SimpleNamespace(offset=10)], 1, [3, 1])  # the loop's rollback, after on_round
    assert recorder.steps[0][-1] == [7, 7, 7, 7, 11, 10]
    with pytest.raises(AssertionError, match="lookup"):
        recorder.on_round(drafted=2, accepted=0, committed=1, cap=3, source="lookup")


def test_a_draft_pass_records_its_features_and_lengths():
    recorder = _recorder()
    cache = [SimpleNamespace(offset=5)]
    hidden = np.ones((1, 2, 6), np.float32)  # (B, L_c, k·d)
    recorder.before_pass(None, hidden, cache, logits_start=1)
    assert recorder.in_draft and recorder.out["step0/draft.hook_target_hidden"].shape == (2, 6)
    cache[0].offset = 7
    recorder.after_pass(None, None, hidden, cache, logits_start=1)
    assert not recorder.in_draft and recorder.lengths == [5, 7, 7]


def test_the_real_port_passes_the_walkthrough():
    pytest.importorskip("mlx_dspark")
    from dflash_ref.conformance.verify import verify

    report = verify(port.MLXDSparkPort(), WALKTHROUGH)
    assert report.status("walkthrough") == "pass", report.text()
