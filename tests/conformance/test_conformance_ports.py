"""Real ports through the kit: the official MLX backend (dflash 0.1.0's model_mlx.py, on mlx-cpu),
the official PyTorch code in both its layouts (the PyPI 0.1.0 release here; the GitHub repository's
current code when a copy of its dflash/model.py is named by DFLASH_GITHUB_MODEL), and the matrix
command over them. Each passes every semantic stage of every bundle it applies to, except where the
kit names a real bug of that code (asserted here, with the hint it gives)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import pytest
from test_conformance import run_cli

from dflash_ref.conformance import verify
from dflash_ref.conformance.matrix import cells

WINDOWS = {"gqa_sliding", "window_symmetric", "window_rotating"}
MUSE = {"muse_glimmer", "muse_glimmer_window"}  # drafts in transformers' format: `verify --impl transformers` only


def verdicts(report) -> dict[str, dict]:
    return {row["bundle"]: row for row in cells(report)}


def test_official_mlx_backend(golden):
    pytest.importorskip("mlx.core")
    pytest.importorskip("dflash.model_mlx")
    rows = verdicts(verify("mlx", golden))
    assert all(rows[b]["verdict"] == "pass" for b in rows if b not in WINDOWS | MUSE), rows
    assert all(rows[b]["verdict"] == "n/a" for b in MUSE), rows
    # it reads every sliding window as rotating (declared): the causal and symmetric bundles do not apply
    assert rows["gqa_sliding"]["verdict"] == rows["window_symmetric"]["verdict"] == "n/a"
    assert "context-only" in rows["walkthrough"]["variants"]  # detected from its cache lengths
    assert rows["hybrid_target"]["verdict"] == "pass"  # its snapshot + replay rolls Gated DeltaNet back
    # its bug: after a one-position update its rotating cache hands the keys over in ring order, while
    # the window's mask counts positions in temporal order
    rotating = rows["window_rotating"]
    assert rotating["verdict"] == "fail" and rotating["first"].startswith("step 1 · layer 0 · K after RoPE")
    assert "the right keys in the wrong order" in rotating["first"]
    assert rotating["cause"].startswith("a bug of the official MLX backend")


def test_official_pytorch_release_layout(golden):
    pytest.importorskip("dflash.model")
    report = verify("zlab", golden / "01_walkthrough")
    assert report.passed and report.impl == "zlab [0.1.0 code]"


def test_official_pytorch_code_rolls_a_hybrid_target_back_by_crop_only(golden):
    """dflash 0.1.0 with transformers' Qwen3.5: its crop trims the conv windows but leaves the recurrent
    state with the rejected tokens in; the kit names that stage first, at the first rejection (step 0), the
    catalogue's cause reproduces the port's tensors (its own numbers, never told which port it is), and the
    decoding then parts from the target's own (the output ids differ)."""
    pytest.importorskip("dflash.model")
    report = verify("zlab", golden / "16_hybrid_target")
    first = report.first_failure
    assert (first.stage, first.step, first.layer) == ("recurrent_state", 0, 0), report.text()
    assert first.hint.startswith("reproduced by the reference with recurrent-state-not-rolled-back"), first.hint
    status = {c.key: c.status for c in report.checks}
    assert status["step0/target.layers.0.linear_attn.conv_state"] == "pass"
    assert status["step0/posterior"] == "pass" and status["output_ids"] != "pass"
    assert "rolls a hybrid target back by `DynamicCache.crop` alone" in verdicts(report)["hybrid_target"]["cause"]


@pytest.fixture
def github_code(monkeypatch):
    """The GitHub repository's dflash/model.py, imported as `dflash.model` for the test."""
    path = os.environ.get("DFLASH_GITHUB_MODEL")
    if not path:
        pytest.skip("set DFLASH_GITHUB_MODEL to a copy of the official repository's dflash/model.py")
    dflash = pytest.importorskip("dflash")
    spec = importlib.util.spec_from_file_location("dflash.model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "dflash.model", module)
    monkeypatch.setattr(dflash, "model", module, raising=False)


def test_official_pytorch_github_layout(golden, github_code):
    report = verify("zlab", golden)
    assert report.impl == "zlab [github code]"
    rows = verdicts(report)
    # hybrid_target: it raises inside transformers' cache (IndexError in DynamicCache, measured); stop_first: below
    others = WINDOWS | {"dflash2", "hybrid_target", "stop_first"}
    assert all(rows[b]["verdict"] == "pass" for b in rows if b not in others), rows
    # its bug: stop tokens are looked for only after a decode step, so a stop token as x_0 still costs a whole
    # draft and verify step (its tokens then cut away)
    assert (
        rows["stop_first"]["verdict"] == "fail" and "after the stop at the first token" in rows["stop_first"]["first"]
    )
    assert rows["stop_first"]["cause"].startswith("a bug of the official GitHub code"), rows["stop_first"]
    assert "full-then-truncate" in rows["walkthrough"]["variants"]  # detected from its shapes
    assert rows["dflash2"]["verdict"] == "crash" and "no DFlash2DraftModel" in rows["dflash2"]["first"]
    # its bug: the sliding window goes to the attention kernel as a keyword that SDPA ignores
    for name in ("gqa_sliding", "window_symmetric"):
        assert rows[name]["verdict"] == "fail" and "is not applied" in rows[name]["first"], rows[name]
        assert rows[name]["cause"].startswith("a bug of the official GitHub code"), rows[name]
    assert rows["window_rotating"]["verdict"] == "n/a"


def test_the_matrix_command_writes_every_port(golden, tmp_path, monkeypatch):
    pytest.importorskip("dflash.model")
    for name in ("01_walkthrough", "12_window_rotating"):
        shutil.copytree(golden / name, tmp_path / "bundles" / name)
    monkeypatch.setenv("DFLASH_REF_VLLM_PYTHON", sys.executable)  # the engines as on a machine without them
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    out = tmp_path / "MATRIX.md"
    done = run_cli("matrix", "--bundle", str(tmp_path / "bundles"), "--out", str(out))
    text = out.read_text()
    # a row fails (the MLX backend's rotating-cache bug): the command says so by its exit code, after writing
    assert done.returncode == 1 and "| window_rotating | fail |" in text, done.stderr
    for port in ("reference", "zlab", "mlx", "vllm", "vllm-batch", "vllm-serve", "llamacpp", "llama-server"):
        assert f"## {port}\n" in text
    assert "| walkthrough | n/a | not a request of a serving scenario" in text
    assert "## Serving conditions" not in text  # no bundle of a serving scenario here
    assert "| walkthrough | pass |" in text and "| window_rotating | n/a |" in text
    assert "zlab [0.1.0 code]" in text and "`python -m dflash_ref matrix` on" in text
    assert "| walkthrough | n/a | llama.cpp is not installed: set LLAMA_CPP_DIR" in text


def test_every_fail_of_the_matrix_names_its_cause_or_says_it_is_unexplained():
    from dflash_ref.conformance.report import Check, Report

    def report(impl, stage):
        return cells(Report(impl, [Check("b", f"step0/{stage}", stage, 0, 0, "FAIL", 1.0, 1.0, 1e-4)]))[0]["cause"]

    assert "reports/vllm-cpu-context-k-norm.md" in report("vllm", "k_ctx")
    assert report("vllm", "q") == "unexplained: a new finding, to follow to its cause"


TARGET_STAGES = ("prefill_logits", "first_token", "verify_logits")


def test_the_official_ports_read_the_targets_own_logits(golden):
    """The target's stages from the official code's own tensors: its prefill's last row, its x_0, and every
    row each verify computed (L_q: as many as the reference's block, checked by the comparison's shapes)."""
    pytest.importorskip("dflash.model")
    ports = ["zlab"] + (["mlx"] if importlib.util.find_spec("mlx") and importlib.util.find_spec("mlx_lm") else [])
    for port in ports:
        report = verify(port, golden / "02_multiround")
        checks = [c for c in report.checks if c.stage in TARGET_STAGES]
        assert {c.stage for c in checks} == set(TARGET_STAGES), port
        assert all(c.status == "pass" for c in checks), report.text()
        assert sum(c.stage == "verify_logits" for c in checks) == sum(c.stage == "posterior" for c in report.checks)
        text = report.text()
        for title in ("target logits (prefill)", "first token x_0", "target logits (verify)"):
            assert f"pass  {title}" in text, (port, text)


def not_applicable(report) -> list[str]:
    return [c.detail for c in report.checks if c.key == "bundle"]


def test_zlab_without_dflash_is_not_applicable_with_how_to_install_it(golden, monkeypatch):
    monkeypatch.setitem(sys.modules, "dflash", None)
    monkeypatch.setitem(sys.modules, "dflash.model", None)
    report = verify("zlab", golden / "01_walkthrough")
    assert not_applicable(report) == ["the official dflash is not installed: pip install --no-deps dflash==0.1.0"]
    assert "ModuleNotFoundError" not in report.text()


def test_mlx_without_mlx_is_not_applicable_with_how_to_install_it(golden, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    report = verify("mlx", golden / "01_walkthrough")
    assert not_applicable(report) == ["the official MLX backend needs MLX: pip install 'dflash-ref[mlx]'"]
    assert "ModuleNotFoundError" not in report.text()


def test_mlx_without_dflash_is_not_applicable_with_how_to_install_it(golden, monkeypatch):
    pytest.importorskip("mlx.core")
    pytest.importorskip("mlx_lm")
    monkeypatch.setitem(sys.modules, "dflash", None)
    monkeypatch.setitem(sys.modules, "dflash.model_mlx", None)
    report = verify("mlx", golden / "01_walkthrough")
    assert not_applicable(report) == ["the official dflash is not installed: pip install --no-deps dflash==0.1.0"]


def test_the_matrix_keeps_each_ports_report_as_verify_prints_it(tmp_path):
    """matrix --texts: the report of each port the matrix ran, as `verify --impl PORT` prints it, so that .ci/ports
    shows the reports without running each port a second time."""
    from dflash_ref.conformance.bundle import SHIPPED
    from dflash_ref.conformance.matrix import matrix

    texts = {}
    matrix(SHIPPED, ("reference",), texts=texts)
    text, seconds = texts[("reference",)]
    assert text == verify("reference", SHIPPED).text() and seconds >= 0
    proc = run_cli("matrix", "--bundle", str(SHIPPED), "--ports", "reference", "--texts", str(tmp_path / "texts"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "texts" / "reference.txt").read_text() == text + "\n"
    assert int((tmp_path / "texts" / "reference.seconds").read_text()) >= 0
