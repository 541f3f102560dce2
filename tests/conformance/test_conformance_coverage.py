"""What a verdict covers: a missing tensor is never a pass and a PASS says how much it compared; steps a port
runs that DFlash does not are failures; the target's own stages come before the draft's; the variants after
which a port's run parts from the reference's (adaptive blocks, a windowed draft cache, proposals by lookup)
compare what still holds and hold the port's own steps to the loop's invariants; `matrix` exits non-zero on a
failing row or an unknown port."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_conformance import After, Wrapped, run_cli

from dflash_ref.cache import KVCache
from dflash_ref.conformance import find_bundles, verify
from dflash_ref.conformance.matrix import check_ports
from dflash_ref.conformance.ports.reference import ReferenceAdapter
from dflash_ref.conformance.stages import parse_key
from dflash_ref.decoding import spec_generate
from dflash_ref.extensions.prompt_lookup import PromptLookup

pytestmark = pytest.mark.usefixtures("one_thread_module")


def only(keep):
    """The reference's tensors whose (stage, step, layer) `keep` accepts."""

    def run(bundle):
        return {k: v for k, v in ReferenceAdapter().run(bundle).items() if keep(*parse_key(k))}

    return run


# --------------------------------------------------------------------------- coverage


def test_a_missing_tensor_is_never_a_pass(golden):
    """The issue's case: a port that gave step 0's tensors only, with --allow-missing. It passes, and the PASS
    says on how many of how many, and why the rest were not compared."""
    multiround = golden / "02_multiround"
    total = len(find_bundles(multiround)[0].entries)
    report = verify(only(lambda stage, step, layer: step in (None, 0)), multiround, allow_missing=True)
    assert report.passed, report.text()
    cov = report.coverage()
    assert cov.total == total and cov.missing > 0 and cov.passed + cov.missing + cov.noted == total
    verdict = report.text().splitlines()[-1]
    assert verdict.startswith(f"PASS on {cov.passed:,} of {total:,} tensors: ")
    assert "missing (--allow-missing)" in verdict
    assert "all agree" not in report.text()
    assert "(8 missing)" in report.text()  # per stage: the posterior of steps 1..8
    strict = verify(only(lambda stage, step, layer: step in (None, 0)), multiround)
    assert not strict.passed and strict.first_failure.status == "missing"


def test_a_full_pass_says_it_compared_everything(golden):
    report = verify("reference", golden / "01_walkthrough")
    total = len(find_bundles(golden / "01_walkthrough")[0].entries)
    assert report.text().splitlines()[-1] == f"PASS: {total} of {total} tensors compared, all agree with DFlash."


def test_a_skipped_variant_is_not_counted_as_agreeing(golden):
    from test_conformance_variants import FullThenTruncate

    report = verify(FullThenTruncate(), golden / "01_walkthrough")
    cov = report.coverage()
    assert report.passed and cov.not_compared["last_block=full-then-truncate"] > 0, report.text()
    assert report.text().splitlines()[-1] == (
        f"PASS on {cov.passed} of {cov.total} tensors: "
        f"{cov.not_compared['last_block=full-then-truncate']} not compared under last_block=full-then-truncate."
    )


def test_a_fail_line_shows_what_differs(golden):
    """A shape mismatch has no error to print: its stage line shows the shapes, never `worst rel 0.0e+00`."""

    def short_pattern(bundle):
        out = ReferenceAdapter().run(bundle)
        key = "step0/draft.layers.0.self_attn.hook_pattern"
        out[key] = out[key][:, :, 1:]
        return out

    text = verify(short_pattern, golden / "01_walkthrough").text()
    line = next(line for line in text.splitlines() if line.strip().startswith("FAIL") and "attention weights" in line)
    assert "shape (" in line and "expected (" in line and "0.0e+00" not in line, line


# --------------------------------------------------------------------------- steps DFlash does not run


class DecodesPastTheStop(ReferenceAdapter):
    """Decodes without the stop tokens (every step run) and then cuts its output at the first stop token:
    the output is right, the steps after the stop are not DFlash's."""

    def generate(self, draft, target, input_ids, inputs, on_step):
        out = spec_generate(draft, target, input_ids, inputs["max_new_tokens"], on_step=on_step)
        new, stops = out.output_ids[0, input_ids.shape[1] :].tolist(), set(inputs["stop_token_ids"])
        end = next(i + 1 for i, t in enumerate(new) if t in stops)
        out.output_ids = out.output_ids[:, : input_ids.shape[1] + end]
        return out


def test_steps_after_a_stop_at_the_first_token_fail(golden):
    report = verify(DecodesPastTheStop(), golden / "08_stop_first")
    first = report.first_failure
    assert not report.passed and first.stage == "extra_step" and first.step == 0, report.text()
    assert "the port ran step 0 after the stop at the first token" in first.detail
    assert "ignored" not in report.text()


def test_steps_after_a_stop_inside_a_step_fail(golden):
    report = verify(DecodesPastTheStop(), golden / "03_stop_token")
    first = report.first_failure
    last = max(parse_key(k)[1] for k in find_bundles(golden / "03_stop_token")[0].expected if k.startswith("step"))
    assert (first.stage, first.step) == ("extra_step", last + 1), report.text()
    assert f"after the stop token 2 at step {last}" in first.detail


def test_steps_past_max_new_tokens_fail(golden):
    class Longer(ReferenceAdapter):
        def generate(self, draft, target, input_ids, inputs, on_step):
            out = spec_generate(draft, target, input_ids, inputs["max_new_tokens"] + 6, on_step=on_step)
            out.output_ids = out.output_ids[:, : input_ids.shape[1] + inputs["max_new_tokens"]]
            return out

    report = verify(Longer(), golden / "02_multiround")  # no block shrunk there: no variant explains the steps
    first = report.first_failure
    assert first.stage == "extra_step" and "past max_new_tokens (20)" in first.detail, report.text()
    # where the reference shrank its last blocks, the longer run drafts them whole: that is full-then-truncate
    # (detected), whose step past max_new_tokens is its own (the official repository's loop runs one), not compared
    truncating = verify(Longer(), golden / "01_walkthrough")
    assert truncating.variants["walkthrough"]["last_block"] == ("full-then-truncate", "detected")
    past = [c for c in truncating.checks if c.stage == "extra_step"]
    assert past[0].status == "skipped" and "all cut away" in past[0].detail  # the one step that loop runs
    assert len(past) > 1 and all(c.status == "FAIL" for c in past[1:]), truncating.text()  # no more than one


def test_a_misspelt_key_is_still_ignored_and_its_tensor_missing(golden):
    def misspelt(bundle):
        out = ReferenceAdapter().run(bundle)
        out["step0/draft.layers.0.self_attn.hook_qrot"] = out.pop("step0/draft.layers.0.self_attn.hook_q_rot")
        return out

    report = verify(misspelt, golden / "01_walkthrough")
    assert report.first_failure.status == "missing" and "hook_qrot" in report.text()
    assert not any(c.stage == "extra_step" for c in report.checks)


# --------------------------------------------------------------------------- the target's own stages


def test_the_targets_stages_come_first(golden):
    """A target whose lm_head is wrong (an untied head read as the embedding): named at the prefill's logits,
    before any draft stage (it used to show at the block embedding, through a wrong x_0)."""

    def untied_as_tied(target, draft):
        with torch.no_grad():
            target.lm_head.weight.mul_(-1.0)  # another output head than the target's own

    report = verify(After(untied_as_tied), golden / "02_multiround")
    first = report.first_failure
    assert (first.stage, first.step) == ("prefill_logits", None), report.text()
    assert "tie_word_embeddings" in first.hint  # the target's cause, not the block embedding's
    stages = [c.stage for c in report.checks]
    assert stages.index("prefill_logits") < stages.index("first_token") < stages.index("layer_ids")


def test_every_bundle_has_the_targets_stages(golden):
    for bundle in find_bundles(golden):
        if bundle.manifest.get("kind") == "sampling":
            continue
        stages = [e["stage"] for e in bundle.entries]
        assert stages[:3] == ["prefill_logits", "first_token", "layer_ids"], bundle.name
        steps = {e["step"] for e in bundle.entries if e["stage"] == "posterior"}
        assert {e["step"] for e in bundle.entries if e["stage"] == "verify_logits"} == steps
        x0 = bundle.expected["prefill/first_token"]
        assert int(x0) == int(bundle.expected["prefill/target_logits"].argmax())
        assert int(x0) == int(bundle.expected["output_ids"][len(bundle.inputs["input_ids"])])
        for s in steps:
            logits = bundle.expected[f"step{s}/target_logits"]
            assert np.array_equal(logits.argmax(-1), bundle.expected[f"step{s}/posterior"]), (bundle.name, s)


# --------------------------------------------------------------------------- runs that part from the reference's


class LastContext(KVCache):
    """Attends the last `window` context positions only (and the block): older context K/V stay stored but
    are never handed to the attention."""

    window, q_len = 2, 0

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        keys, values = super().update(key_states, value_states, layer_idx)
        keep = min(keys.shape[2], self.window + self.q_len)
        return keys[:, :, -keep:], values[:, :, -keep:]  # (B, H_kv, W + L_q, d_h)


def windowed(window: int):
    class WindowedDraft(Wrapped):
        def make_cache(self):
            cache = LastContext(self.config.num_hidden_layers)
            cache.window = window
            return cache

        def forward(self, position_ids, attention_mask=None, *, noise_embedding, past_key_values=None, **kw):
            past_key_values.q_len = noise_embedding.shape[1]
            return self.draft(position_ids, noise_embedding=noise_embedding, past_key_values=past_key_values, **kw)

    return After(lambda target, draft: (target, WindowedDraft(draft)))


def test_a_windowed_draft_cache_is_offered_declared_and_held_to_its_invariant(golden):
    """Never detected (a port that loses context keys by mistake must not pass for a windowed one): the hint
    offers the declaration, and declared, its steps are held to the window's invariant."""
    multiround = golden / "02_multiround"
    undeclared = verify(windowed(2), multiround)
    assert not undeclared.passed and "draft_context_window=2" in undeclared.first_failure.hint, undeclared.text()
    report = verify(windowed(2), multiround, variants={"draft_context_window": "2"})
    assert report.passed, report.text()
    cov = report.coverage()
    assert cov.not_compared["draft_context_window=2"] > 0 and cov.own_steps > 0
    assert "not compared under draft_context_window=2" in report.text().splitlines()[-1]
    # declared with the wrong size: the keys it attends are not min(start, N) + L_q
    wrong = verify(windowed(2), multiround, variants={"draft_context_window": "3"})
    assert not wrong.passed, wrong.text()
    first = wrong.first_failure
    assert first.stage in ("k_rot", "pattern", "q_rot") or "keys attended" in first.detail, wrong.text()
    # and declared unbounded, it fails where its context is cut short
    strict = verify(windowed(2), multiround, variants={"draft_context_window": "unbounded"})
    assert not strict.passed and strict.first_failure.stage in ("k_rot", "pattern"), strict.text()


class ShorterBlocks(ReferenceAdapter):
    """Blocks of 3 where the draft's are 4 (a port whose block length is its own choice)."""

    def generate(self, draft, target, input_ids, inputs, on_step):
        stops = inputs.get("stop_token_ids")
        return spec_generate(draft, target, input_ids, inputs["max_new_tokens"], stops, block_size=3, on_step=on_step)


def test_adaptive_blocks_declared_pass_on_their_invariants(golden):
    report = verify(ShorterBlocks(), golden / "02_multiround", variants={"block_length": "adaptive"})
    assert report.passed, report.text()
    cov = report.coverage()
    assert cov.own_steps > 0 and cov.not_compared["block_length=adaptive"] > 0
    assert cov.passed >= 4  # the target's prefill, the layer ids, step 0's context, the output ids
    undeclared = verify(ShorterBlocks(), golden / "02_multiround")
    assert not undeclared.passed


def test_a_lossy_port_fails_the_invariants(golden):
    """Adaptive blocks whose bonus is the draft's token: the invariants name the bonus."""

    class WrongBonus(ShorterBlocks):
        def run(self, bundle):
            out = super().run(bundle)
            for key in [k for k in out if k.endswith("/bonus")]:
                out[key] = out[key] + 1
            return out

    report = verify(WrongBonus(), golden / "02_multiround", variants={"block_length": "adaptive"})
    failing = [c for c in report.checks if report.failed(c)]
    assert not report.passed and any(c.stage == "bonus" and not c.manifest for c in failing), report.text()


class LooksUp(ReferenceAdapter):
    """Proposes by prompt lookup where the last committed token occurred before (no draft pass there)."""

    def generate(self, draft, target, input_ids, inputs, on_step):
        return spec_generate(
            draft,
            target,
            input_ids,
            inputs["max_new_tokens"],
            inputs.get("stop_token_ids"),
            on_step=on_step,
            extensions=[PromptLookup(1)],
        )


def test_proposals_by_lookup_declared_pass_and_undeclared_are_offered(golden):
    multiround = golden / "02_multiround"
    report = verify(LooksUp(), multiround, variants={"proposals": "draft-or-lookup"})
    assert report.passed, report.text()
    assert report.coverage().not_compared["proposals=draft-or-lookup"] > 0
    undeclared = verify(LooksUp(), multiround)
    assert not undeclared.passed
    offered = [c for c in undeclared.checks if "proposals=draft-or-lookup" in c.hint]
    assert offered, undeclared.text()


# --------------------------------------------------------------------------- the matrix


def test_matrix_refuses_an_unknown_port_and_fails_on_a_failing_row(golden):
    with pytest.raises(ValueError, match=r"unknown port\(s\) \['nosuch'\]"):
        check_ports(["reference", "nosuch"])
    proc = run_cli("matrix", "--ports", "nosuch", "--bundle", str(golden / "01_walkthrough"))
    assert proc.returncode == 2 and "unknown port(s) ['nosuch']" in proc.stderr
    ok = run_cli("matrix", "--ports", "reference", "--bundle", str(golden / "01_walkthrough"))
    assert ok.returncode == 0 and "| walkthrough | pass |" in ok.stdout, ok.stdout + ok.stderr


def test_the_readme_documents_every_key():
    """conformance/README.md's table of keys and layouts names every stage's key."""
    from pathlib import Path

    from dflash_ref.conformance.stages import STAGES, key_for

    readme = (Path(__file__).resolve().parents[2] / "dflash_ref" / "conformance" / "README.md").read_text()
    table = readme[readme.index("**Keys and layouts**") : readme.index("**The Port contract**")]
    for stage in (s.name for s in STAGES):
        name = key_for(stage, 0, 0).split("/")[-1].rsplit(".", 1)[-1]  # e.g. hook_k_rot, target_logits
        assert name in table or name.split("_", 1)[-1] in table, stage


# --------------------------------------------------------------------------- what a declared variant cannot hide


def test_a_declared_window_does_not_excuse_a_draft_that_hands_over_no_keys(golden):
    """Declared draft_context_window=1, the port gives no K after RoPE and junk elsewhere in the draft: the
    window's invariant needs every layer's keys, so the run fails (an independent review's case)."""

    def junk(bundle):
        out = {}
        for k, v in ReferenceAdapter().run(bundle).items():
            stage = parse_key(k)[0]
            if stage == "k_rot":
                continue
            out[k] = np.full_like(v, 7.0) if k.startswith("step") and v.dtype.kind == "f" else v
        return out

    report = verify(junk, golden / "02_multiround", variants={"draft_context_window": "1"})
    assert not report.passed, report.text()


def test_checks_of_the_ports_own_steps_alone_are_no_pass(golden):
    everything_but_loop = [s for s in ("prefill_logits", "first_token", "layer_ids", "output_ids")] + [
        "target_hidden", "fc", "context", "k_ctx", "noise_embedding", "q", "k_noise", "v", "q_rot",
    ]  # fmt: skip
    report = verify(
        windowed(1), golden / "01_walkthrough", variants={"draft_context_window": "1"}, skip=everything_but_loop
    )
    assert not report.passed and "NOTHING COMPARED" in report.text(), report.text()


@pytest.mark.parametrize(
    "change",
    [
        lambda out: out.update({"step0/acceptance_length": np.array(np.nan)}),
        lambda out: out.update({"step0/bonus": np.array([1, 2])}),
        lambda out: out.update({"step1/draft.layers.x.self_attn.hook_k_rot": np.zeros(3)}),
        lambda out: out.update({"step0/draft.layers.0.self_attn.hook_k_rot": np.zeros(4)}),
    ],
)
@pytest.mark.parametrize("variants", [{}, {"block_length": "adaptive"}, {"draft_context_window": "2"}])
def test_odd_tensors_are_failures_never_a_crash(golden, change, variants):
    def odd(bundle):
        out = ReferenceAdapter().run(bundle)
        change(out)
        return out

    report = verify(odd, golden / "01_walkthrough", variants=variants)  # no traceback, whatever the tensors
    text = report.text()
    # a key of no stage (layer "x") is listed as ignored; everything else fails where it is
    assert ("FIRST DIVERGENCE" in text and not report.passed) or "ignored 1 key(s)" in text, text


def test_a_run_that_returns_no_mapping_is_reported(golden):
    report = verify(lambda bundle: [1, 2, 3], golden / "01_walkthrough")
    assert not report.passed and "run() returned list, not a mapping" in report.text()
