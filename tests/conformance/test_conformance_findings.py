"""What a port's author reads: each bundle's status in a fixed vocabulary (pass, fail, n/a, crash, timeout), in
the text and the JSON; every independent divergence of a bundle, not only the first, and the run's by cause; a
crash located at the port's own line; missing tensors counted as failed; and the declared behaviours a correct
port passes: a window measured from the block's start (W keys), a context cut to its last N positions (with or
without sinks, its new rows computed for those alone), a step of x_0 alone."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from test_conformance import After, Wrapped, window_from_the_block_start
from test_conformance_coverage import ShorterBlocks, only, windowed

from dflash_ref import attention as attention_module
from dflash_ref.cache import KVCache
from dflash_ref.conformance import verify
from dflash_ref.conformance.bundle import find_bundles
from dflash_ref.conformance.crash import EngineFailed
from dflash_ref.conformance.golden import generate_golden
from dflash_ref.conformance.matrix import CAUSES, cells
from dflash_ref.conformance.ports.reference import ReferenceAdapter
from dflash_ref.conformance.report import STATUSES, NotApplicable
from dflash_ref.conformance.stages import key_for, parse_key

pytestmark = pytest.mark.usefixtures("one_thread_module")

NAMES = ["walkthrough", "multiround", "stop_token", "gqa_sliding", "window_symmetric", "window_rotating"]


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    generate_golden(out, NAMES)
    return {b.name: b.path for b in find_bundles(out)} | {"all": out}


# --------------------------------------------------------------------------- statuses and coverage words


class Refuses:
    def run(self, bundle):
        raise NotApplicable("this port takes no bundle with a stop token")


class Sleeps:
    def run(self, bundle):
        time.sleep(30)


def test_each_bundle_has_a_status_of_the_fixed_vocabulary(bundles):
    assert STATUSES == ("pass", "fail", "n/a", "crash", "timeout")
    report = verify("reference", bundles["walkthrough"])
    assert report.status("walkthrough") == "pass" and "walkthrough: pass" in report.text()
    assert verify(Refuses(), bundles["walkthrough"]).status("walkthrough") == "n/a"
    crashed = verify(lambda bundle: 1 / 0, bundles["walkthrough"])
    assert crashed.status("walkthrough") == "crash" and "walkthrough: crash" in crashed.text()
    late = verify(Sleeps(), bundles["walkthrough"], timeout=0.5)
    assert late.status("walkthrough") == "timeout" and "did not finish in 0.5 s" in late.text()
    missing = verify(only(lambda stage, step, layer: stage != "q"), bundles["walkthrough"])
    assert missing.status("walkthrough") == "fail"


def test_missing_semantic_tensors_count_as_failed(bundles):
    lacking = only(lambda stage, step, layer: stage not in ("q", "cache_lengths"))
    report = verify(lacking, bundles["multiround"])
    cov = report.coverage()
    assert cov.failed == cov.failed_missing > 0 and cov.missing > 0  # the Q's fail; the observables are apart
    line = cov.line(report.allow_missing)
    assert f"{cov.failed} failed ({cov.failed_missing} of them missing: not produced)" in line
    assert f"{cov.missing} missing observables (no variant declared)" in line
    allowed = verify(lacking, bundles["multiround"], allow_missing=True)
    assert allowed.passed and "missing (--allow-missing)" in allowed.coverage().line(True)


def test_the_json_says_what_the_text_says(bundles, tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "verify", "--impl", "reference", "--bundle", str(bundles["all"]),
         "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = json.loads(out.read_text())
    assert said["passed"] and said["statuses"] == list(STATUSES)
    assert {b["bundle"]: b["status"] for b in said["bundles"]} == dict.fromkeys(NAMES, "pass")
    assert said["coverage"]["failed"] == 0 and said["coverage"]["compared"] == said["coverage"]["total"]


# --------------------------------------------------------------------------- crashes, located


def test_a_crash_is_located_at_the_ports_own_line(tmp_path, bundles, monkeypatch):
    package = tmp_path / "someport"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(
        "import numpy as np\n\n\ndef project(x):\n    return np.ones((2, 3)) @ x  # the port's own line\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from someport.model import project

    class Port:
        package = "someport"

        def run(self, bundle):
            return {"output_ids": project(np.ones((4, 1)))}

    said = verify(Port(), bundles["walkthrough"]).reason("walkthrough")
    assert said.startswith("ValueError: matmul") and "in the port at model.py:5 (project)" in said, said
    assert "raised inside" not in said or "numpy" in said  # numpy raised it from C: no frame of its own
    mine = verify(lambda bundle: ReferenceAdapter().run(None), bundles["walkthrough"]).reason("walkthrough")
    assert "in the adapter (the kit's code) at dflash_ref/conformance/ports/reference.py" in mine, mine


def test_an_engine_process_that_fails_is_the_ports_crash(bundles):
    def engine(bundle):  # an adapter that runs its port as a process notices its exit on its own line
        raise EngineFailed("llama.cpp failed on walkthrough (exit -6): GGML_ASSERT(t != nullptr) failed")

    said = verify(engine, bundles["walkthrough"]).reason("walkthrough")
    assert said.endswith("GGML_ASSERT(t != nullptr) failed — in the port's own process"), said


def test_a_crash_the_matrix_knows_gets_its_cause(bundles, monkeypatch):
    def converter(bundle):  # a converter that reads a key where the config does not keep it
        raise KeyError("num_hidden_layers")

    cause = "a bug of someport 1.0's converter: num_hidden_layers read at the top of the config"
    monkeypatch.setitem(CAUSES, ("someport 1.0", "adapter", "walkthrough"), cause)
    report = verify(converter, bundles["walkthrough"])
    report.impl = "someport 1.0"
    assert cells(report)[0]["verdict"] == "crash" and cells(report)[0]["cause"] == cause, cells(report)
    report.impl = "another port"
    assert cells(report)[0]["cause"].startswith("unexplained"), cells(report)


def test_each_known_bug_is_its_report_and_the_matrix_reads_it(tmp_path):
    """A report's header is all the matrix knows of its bug: its cause, said once, with its report (and the
    release that fixed it); a cell two reports explain names both."""
    from dflash_ref.conformance.known_bugs import REPORTS, causes, known_bugs

    bugs = known_bugs()
    assert len(bugs) == len(list(REPORTS.glob("*.md"))) and all(b.cause and b.release for b in bugs)
    assert all(CAUSES[cell].count(f"reports/{b.report}") == 1 for b in bugs for cell in b.cells)
    (tmp_path / "a.md").write_text(
        "---\nrelease: someport 1.0\nfixed: someport 1.1\ncause: a bug of someport 1.0: x_0 dropped\ncells:\n"
        "  - someport 1.0 · first_token\n  - someport 1.0 · adapter · walkthrough — where it raises\n---\n\n# x_0\n"
    )
    (tmp_path / "b.md").write_text(
        "---\nrelease: r\nfixed: not yet\ncause: c\ncells:\n  - someport 1.0 · first_token\n---\n"
    )
    said = causes(known_bugs(tmp_path))
    assert said[("someport 1.0", "adapter", "walkthrough")] == (
        "a bug of someport 1.0: x_0 dropped — where it raises (fixed in someport 1.1; reports/a.md)"
    )
    assert said[("someport 1.0", "first_token")] == (
        "a bug of someport 1.0: x_0 dropped (fixed in someport 1.1; reports/a.md); c (reports/b.md)"
    )


@pytest.mark.parametrize(
    "header, says",
    [
        ("# no header\n", "a.md:1: a report opens with its header"),
        ("---\nrelease: r\nfixed: not yet\ncause: c\ncells: none\n", "no closing line"),
        ("---\nrelease: r\nfixed: not yet\ncells: none\n---\n", "a.md:5: the header lacks cause"),
        ("---\nrelease: r\nrelease: s\n---\n", "a.md:3: expected one of fixed, cause, cells: 'release: s'"),
        ("---\nrelease: r\nfixed: not yet\ncause: c\ncells:\n  - vllm\n---\n", "a.md:6: a cell is 'port · stage'"),
        ("---\nrelease: r\nfixed: not yet\ncause:\ncells: none\n---\n", "a.md:4: cause is empty"),
    ],
)
def test_a_report_header_out_of_form_is_named_at_its_line(tmp_path, header, says):
    from dflash_ref.conformance.known_bugs import read_report

    (tmp_path / "a.md").write_text(header)
    with pytest.raises(ValueError, match=re.escape(says)):
        read_report(tmp_path / "a.md")


# --------------------------------------------------------------------------- every bug, not only the first


class ThreeBugs(ReferenceAdapter):
    """The draft's head reads one row late (its logits), one extra step after the output is complete, and the
    output keeps a token past max_new_tokens: three findings, none the consequence of another."""

    def run(self, bundle):
        out = super().run(bundle)
        steps = sorted({parse_key(k)[1] for k in out if parse_key(k)[1] is not None})
        for step in steps:
            logits = out[key_for("logits", step)]
            out[key_for("logits", step)] = np.roll(logits, 1, axis=0)  # (γ, V): one row late
        last = steps[-1]
        for key in [k for k in out if parse_key(k)[1] == last]:
            out[key.replace(f"step{last}/", f"step{last + 1}/", 1)] = out[key]  # a step DFlash does not run
        out["output_ids"] = np.append(out["output_ids"], out["output_ids"][-1])
        return out


def test_every_independent_divergence_is_listed(bundles):
    report = verify(ThreeBugs(), bundles["multiround"])
    found = report.divergences("multiround")
    assert [c.stage for c in found] == ["logits", "extra_step", "output_ids"], report.text()
    text = report.text()
    assert "3 independent divergences:" in text and "DIVERGENCES BY CAUSE (3)" in text
    assert "new tokens where max_new_tokens is" in text  # the output's own reader names the limit
    # a consequence is not a finding: a wrong RoPE makes everything after it wrong, and is one divergence
    assert len(verify(ThreeBugs(), bundles["walkthrough"]).by_cause()) >= 2


# --------------------------------------------------------------------------- declared behaviours a correct port passes


@pytest.mark.parametrize("bundle", ["gqa_sliding", "window_symmetric", "window_rotating"])
def test_a_window_measured_from_the_block_start_passes_declared(bundles, bundle):
    with pytest.MonkeyPatch.context() as mp:
        port = window_from_the_block_start(mp)
        undeclared = verify(port, bundles[bundle])
        declared = verify(port, bundles[bundle], variants={"sliding_window": "block-start"})
    assert not undeclared.passed and "measured from the block's start" in undeclared.first_failure.hint
    assert declared.passed, declared.text()
    assert declared.coverage().own_steps > 0 and "not compared under sliding_window=block-start" in declared.text()


def test_a_block_start_window_one_key_short_fails_its_invariant(bundles):
    rule = attention_module.visibility_mask

    def short(q_len, k_len, *, is_causal, sliding_window, device, rotating=False):
        if sliding_window is None:
            return rule(q_len, k_len, is_causal=is_causal, sliding_window=None, device=device, rotating=rotating)
        k, start = torch.arange(k_len, device=device), k_len - q_len
        return (((k < start) & (start - k < sliding_window)) | (k >= start)).expand(q_len, k_len)  # W − 1 keys

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attention_module, "visibility_mask", short)
        report = verify(ReferenceAdapter(), bundles["gqa_sliding"], variants={"sliding_window": "block-start"})
    assert not report.passed and any("where a cache of the last" in c.detail for c in report.divergences("gqa_sliding"))


def last_rows_only(port, window: int, sinks: int = 0):
    """The port computes its new context's stages at the first cut step for the rows it keeps alone: the first
    `sinks` and the last `window`."""

    def run(bundle):
        out = port.run(bundle)
        axes = {"target_hidden": 0, "fc": 0, "context": 0, "k_ctx": 1}
        for key in list(out):
            stage, step, _ = parse_key(key)
            if step == 0 and stage in axes and out[key].shape[axes[stage]] > sinks + window:
                rows = out[key].shape[axes[stage]]
                keep = [*range(sinks), *range(rows - window, rows)]
                out[key] = np.take(out[key], keep, axis=axes[stage])
        return out

    return run


class SinksAndLast(KVCache):
    """Attends its first `sinks` context positions and its last `window` (and the block): the others stay stored
    but are never handed to the attention."""

    sinks, window, q_len = 1, 2, 0

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        keys, values = super().update(key_states, value_states, layer_idx)
        context = keys.shape[2] - self.q_len
        if context <= self.sinks + self.window:
            return keys, values
        keep = [*range(self.sinks), *range(context - self.window, keys.shape[2])]
        return keys[:, :, keep], values[:, :, keep]  # (B, H_kv, S + N + L_q, d_h)


def sinks_port(window: int, sinks: int):
    class Draft(Wrapped):
        def make_cache(self):
            cache = SinksAndLast(self.config.num_hidden_layers)
            cache.window, cache.sinks = window, sinks
            return cache

        def forward(self, position_ids, attention_mask=None, *, noise_embedding, past_key_values=None, **kw):
            past_key_values.q_len = noise_embedding.shape[1]
            return self.draft(position_ids, noise_embedding=noise_embedding, past_key_values=past_key_values, **kw)

    return After(lambda target, draft: (target, Draft(draft)))


def test_a_cut_context_passes_declared_with_its_rows_and_its_sinks(bundles):
    multiround = bundles["multiround"]
    cut = verify(last_rows_only(windowed(2), 2), multiround, variants={"draft_context_window": "2"})
    assert cut.passed, cut.text()
    assert "context rows the port's cut context never attends left out" in " ".join(c.note for c in cut.checks)
    sinks = {"draft_context_window": "2", "draft_context_sinks": "1"}
    kept = verify(sinks_port(2, 1), multiround, variants=sinks)
    assert kept.passed, kept.text()
    assert "not compared under draft_context_window=2, draft_context_sinks=1" in kept.text()
    # the same port declared without its sinks: its attended keys are not the last 2
    assert not verify(sinks_port(2, 1), multiround, variants={"draft_context_window": "3"}).passed
    with pytest.raises(ValueError, match="draft_context_sinks goes with draft_context_window=N"):
        verify("reference", multiround, variants={"draft_context_sinks": "1"})


def test_a_step_of_x0_alone_is_an_empty_step_not_a_missing_one(bundles):
    class OneByOne(ShorterBlocks):
        """Blocks of x_0 alone: no draft pass at all, one token a step, the target's own."""

        def run(self, bundle):
            out = ReferenceAdapter.run(self, bundle)
            return {k: v for k, v in out.items() if parse_key(k)[0] not in ("draft_tokens", "logits")}

        def generate(self, draft, target, input_ids, inputs, on_step):
            from dflash_ref.decoding import spec_generate

            stops = inputs.get("stop_token_ids")
            return spec_generate(
                draft, target, input_ids, inputs["max_new_tokens"], stops, block_size=1, on_step=on_step
            )

    report = verify(OneByOne(), bundles["walkthrough"], variants={"block_length": "adaptive"})
    assert report.passed, report.text()
    assert "a step needs" not in report.text() and "missing or not so" not in report.text()


# --------------------------------------------------------------------------- the matrix of several environments


def test_a_ports_run_in_its_own_environment_merges_into_the_matrix():
    from dflash_ref.conformance.matrix import merge

    old = "\n".join([
        "# Conformance matrix", "", "`python -m dflash_ref matrix --engines` on 2026-12-06, x86_64.", "",
        "## reference", "", "| bundle | verdict |", "|---|---|", "| walkthrough | pass |", "",
        "## dflash-mlx", "", "not installed", "",
        "## Sampled decoding", "", "| port | bundle | verdict |", "|---|---|---|",
        "| reference | sampling | pass |", "| dflash-mlx | sampling | n/a |", "",
    ])  # fmt: skip
    new = "\n".join([
        "# Conformance matrix", "", "`python -m dflash_ref matrix --ports dflash-mlx transformers` on 2026-12-07.", "",
        "## dflash-mlx 0.1.8", "", "| bundle | verdict |", "|---|---|", "| walkthrough | fail |", "",
        "## transformers 5.25.0", "", "| bundle | verdict |", "|---|---|", "| walkthrough | pass |", "",
        "## Sampled decoding", "", "| port | bundle | verdict |", "|---|---|---|",
        "| transformers 5.25.0 | sampling | pass |", "",
    ])  # fmt: skip
    merged = merge(old, new)
    titles = [line for line in merged.splitlines() if line.startswith("## ")]
    assert titles == ["## reference", "## dflash-mlx 0.1.8", "## transformers 5.25.0", "## Sampled decoding"]
    assert "| reference | sampling | pass |" in merged and "| transformers 5.25.0 | sampling | pass |" in merged
    assert "| dflash-mlx | sampling | n/a |" not in merged  # its run where it was not installed, replaced
    assert merged.count("Merged with `python -m dflash_ref matrix --ports dflash-mlx transformers`") == 1
    assert merge(merged, new) == merged  # the same run again changes nothing
