"""Design variants and waivers in `verify`: a port that caches context only, or drafts its last block
whole and truncates, passes every semantic stage (detected, or declared); a declared variant's own
invariant is checked; what a port waives is skipped and said; an observable that differs is a note
unless the port declared it follows the reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_conformance import After, Wrapped, dump_of, greedy_bundles

from dflash_ref.cache import KVCache
from dflash_ref.conformance import find_bundles, verify, verify_dump
from dflash_ref.conformance.ports.reference import ReferenceAdapter
from dflash_ref.conformance.stages import parse_key
from dflash_ref.conformance.variants import check_variants, context_only_lengths, parse_variant, shrunk_steps
from dflash_ref.decoding import spec_generate


class ContextOnlyCache(KVCache):
    """Stores context K/V only: the block's K/V are attended in the pass and never kept (the MLX ports)."""

    q_len = 0

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        keys, values = super().update(key_states, value_states, layer_idx)
        self._len[layer_idx] -= self.q_len  # forget the block at once
        return keys, values


class ContextOnlyDraft(Wrapped):
    def make_cache(self):
        return ContextOnlyCache(self.config.num_hidden_layers)

    def forward(self, position_ids, attention_mask=None, *, noise_embedding, past_key_values=None, **kw):
        past_key_values.q_len = noise_embedding.shape[1]
        return self.draft(position_ids, noise_embedding=noise_embedding, past_key_values=past_key_values, **kw)


def context_only():
    return After(lambda target, draft: (target, ContextOnlyDraft(draft)))


class FullThenTruncate(ReferenceAdapter):
    """Drafts every block whole, the last ones too, and cuts the output at max_length (the official
    repository's current loop): the reference's loop run past the end, its extra steps not reported."""

    name = "full-then-truncate"

    def run(self, bundle):
        self.block = bundle.config("draft")["block_size"]
        listed = {e["key"] for e in bundle.entries}
        return {k: v for k, v in super().run(bundle).items() if k in listed or not k.startswith("step")}

    def generate(self, draft, target, input_ids, inputs, on_step):
        n = inputs["max_new_tokens"]
        out = spec_generate(draft, target, input_ids, n + self.block - 1, inputs.get("stop_token_ids"), on_step=on_step)
        out.output_ids = out.output_ids[:, : input_ids.shape[1] + n]
        return out


def test_variant_declarations_by_hand():
    assert check_variants({"draft_cache": "context-only"}) == {"draft_cache": "context-only"}
    assert parse_variant("last_block=full-then-truncate") == ("last_block", "full-then-truncate")
    with pytest.raises(ValueError, match="unknown design variant 'cache'"):
        check_variants({"cache": "x"})
    with pytest.raises(ValueError, match=r"choose one of \['crop-after-pass', 'context-only', 'crop-at-next-pass'\]"):
        parse_variant("draft_cache=sometimes")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_variant("context-only")
    # [draft before, after the pass, after its crop, target before, after verify, after its crop]
    assert context_only_lengths(np.array([3, 10, 7, 3, 7, 5])).tolist() == [3, 7, 7, 3, 7, 5]


def test_a_context_only_cache_is_detected_and_passes(golden):
    report = verify(context_only(), golden)
    assert report.passed, report.text()
    assert report.variants["walkthrough"]["draft_cache"] == ("context-only", "detected")
    assert "draft_cache = context-only (detected)" in report.text()


def test_a_declared_variant_is_held_to_its_invariant(golden):
    """Declared crop-after-pass, a context-only cache fails at the cache lengths (and only there);
    undeclared, the reference's own lengths on a context-only port would be a note, not a failure."""
    report = verify(context_only(), golden, variants={"draft_cache": "crop-after-pass"})
    assert not report.passed and report.first_failure.stage == "cache_lengths", report.text()
    assert {c.stage for c in report.checks if report.failed(c)} == {"cache_lengths"}
    reference_declared_context_only = verify(ReferenceAdapter(), golden, variants={"draft_cache": "context-only"})
    assert reference_declared_context_only.first_failure.stage == "cache_lengths"


def test_two_declared_variants_that_both_cut_are_judged_together(golden, tmp_path):
    """accepted_count=committed keeps the steps a stop token cuts, draft_context_window=2 the context rows kept:
    one name once served both (and crashed). The reference, declared with a window it does not have, fails at its
    K after RoPE, where the window shows, and nowhere raises."""
    np.savez(tmp_path / "port.npz", **{f"{b.name}/{k}": v for b in find_bundles(golden) for k, v in b.expected.items()})
    declared = {"accepted_count": "committed", "draft_context_window": "2"}
    report = verify_dump(tmp_path / "port.npz", golden, variants=declared)
    assert {c.stage for c in report.checks if report.failed(c)} == {"k_rot"}, report.text()


def test_undeclared_observables_that_follow_neither_variant_are_notes(golden):
    """Cache lengths off by one everywhere (a port that counts its cache another way): semantic stages
    all pass, so the verdict is a pass with notes."""

    def shifted(bundle):
        out = ReferenceAdapter().run(bundle)
        return {k: v + 1 if parse_key(k)[0] == "cache_lengths" else v for k, v in out.items()}

    report = verify(shifted, golden)
    assert report.passed, report.text()
    assert {c.status for c in report.checks if c.stage == "cache_lengths"} == {"note"}
    assert "differ: observable, not declared" in report.text()


def test_full_then_truncate_is_detected_and_compares_the_output(golden):
    report = verify(FullThenTruncate(), golden)
    assert report.passed, report.text()
    shrunk = {b.name: shrunk_steps(b) for b in greedy_bundles(golden)}
    assert any(shrunk.values())
    for b, steps in shrunk.items():
        if steps:
            assert report.variants[b]["last_block"] == ("full-then-truncate", "detected")
    skipped = [c for c in report.checks if c.status == "skipped"]
    assert skipped and all(c.step in shrunk[c.bundle] for c in skipped)
    assert all(c.status == "pass" for c in report.checks if c.stage == "output_ids")
    # the same port, declared to shrink, fails at a shrunk step's shapes
    strict = verify(FullThenTruncate(), golden, variants={"last_block": "shrink"})
    first = strict.first_failure
    assert not strict.passed and first.step in shrunk[first.bundle] and "shape" in first.detail


def test_full_then_truncate_without_its_output_ids_fails(golden):
    def no_output(bundle):
        return {k: v for k, v in FullThenTruncate().run(bundle).items() if k != "output_ids"}

    report = verify(no_output, golden, allow_missing=True)
    assert not report.passed and "judged by its output ids" in report.first_failure.detail, report.text()


def test_waiving_every_stage_proves_nothing(golden):
    from dflash_ref.conformance.stages import STAGES

    report = verify(ReferenceAdapter(), golden / "01_walkthrough", skip=[s.name for s in STAGES])
    assert not report.passed and "NOTHING COMPARED" in report.text()


def test_waived_stages_are_skipped_and_said(golden):
    def no_patterns(bundle):
        return {k: v for k, v in ReferenceAdapter().run(bundle).items() if parse_key(k)[0] != "pattern"}

    assert not verify(no_patterns, golden).passed
    report = verify(no_patterns, golden, skip=["pattern"])  # the user's --skip: said as the user's
    assert report.passed and "skipped by the user (--skip): attention weights" in report.text()
    assert "waived by the port" not in report.text() and report.coverage().user_skipped > 0

    class Waiving:  # the port's own declaration: said as the port's
        skip = ("pattern",)
        run = staticmethod(no_patterns)

    report = verify(Waiving(), golden)
    assert report.passed and "waived by the port (its skip): attention weights" in report.text()
    assert report.coverage().waived == report.coverage(None).waived > 0 and not report.coverage().user_skipped
    with pytest.raises(ValueError, match="no such stage"):
        verify(no_patterns, golden, skip=["patterns"])


def test_an_adapter_declares_its_variants_itself(golden):
    port = context_only()
    port.variants = {"draft_cache": "context-only"}
    report = verify(port, golden)
    assert report.passed and report.variants["walkthrough"]["draft_cache"] == ("context-only", "declared")


def test_a_dump_profile_beside_the_dump_declares_variants(golden, tmp_path):
    dump = dump_of(context_only(), golden)
    np.savez(tmp_path / "port.npz", **dump)
    assert verify_dump(tmp_path / "port.npz", golden).passed
    (tmp_path / "port.profile.json").write_text(json.dumps({"variants": {"draft_cache": "crop-after-pass"}}))
    assert verify_dump(tmp_path / "port.npz", golden).first_failure.stage == "cache_lengths"
    (tmp_path / "other.json").write_text(json.dumps({"variants": {"draft_cache": "context-only"}, "skip": ["pattern"]}))
    report = verify_dump(tmp_path / "port.npz", golden, profile=tmp_path / "other.json")
    assert report.passed and report.skip == ["pattern"]
    (tmp_path / "bad.json").write_text(json.dumps({"variant": {}}))
    with pytest.raises(ValueError, match="must be a JSON object with 'variants' and/or 'skip'"):
        verify_dump(tmp_path / "port.npz", golden, profile=tmp_path / "bad.json")
    (tmp_path / "str.json").write_text(json.dumps({"skip": "q"}))
    with pytest.raises(ValueError, match="'skip' must be a list of stage names, got 'q'"):
        verify_dump(tmp_path / "port.npz", golden, profile=tmp_path / "str.json")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--variant", "draft_cache=sometimes"], "verify: draft_cache = 'sometimes' is no variant"),
        (["--variant", "draft_cache"], "verify: --variant 'draft_cache': write KEY=VALUE"),
        (["--skip", "nosuch"], "verify: --skip ['nosuch']: no such stage"),
        (["--profile", "p.json"], "--profile goes with verify dump, not verify impl"),  # a usage error
    ],
)
def test_verify_names_a_bad_declaration(golden, argv, message, capsys):
    from dflash_ref.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["verify", "--impl", "reference", "--bundle", str(golden)] + argv)
    said = str(e.value) if e.value.code != 2 else capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith(message) or said.endswith(f"error: {message}"), said


# --------------------------------------------------------------------------- instrumenting a port


def test_a_port_recording_from_inside_its_loop_writes_a_dump_verify_reads(golden, tmp_path):
    from dflash_ref.conformance.record import Recorder

    rec = Recorder()
    for b in greedy_bundles(golden):
        with rec.bundle(b.name):
            for key, value in ReferenceAdapter().run(b).items():  # a port records where it has the values
                stage, step, layer = parse_key(key)
                assert rec.record(stage, value, step=step, layer=layer) == key
    assert verify_dump(rec.save(tmp_path / "port.npz"), golden).passed
    assert verify_dump(rec.save(tmp_path / "port.safetensors"), golden).passed


def test_a_minimal_port_records_its_outputs_only(golden, tmp_path):
    from dflash_ref.conformance.record import Recorder

    rec, outputs = Recorder(), {"output_ids", "draft_tokens", "posterior", "acceptance_length", "bonus"}
    for b in greedy_bundles(golden):
        with rec.bundle(b.name):
            for key, value in ReferenceAdapter().run(b).items():
                stage, step, layer = parse_key(key)
                if stage in outputs:
                    rec.record(stage, value, step=step, layer=layer)
    path = rec.save(tmp_path / "outputs.npz")
    assert not verify_dump(path, golden).passed and verify_dump(path, golden, allow_missing=True).passed
    with pytest.raises(ValueError, match="outside `with recorder.bundle"):
        Recorder().record("q", np.zeros(2), step=0, layer=0)
    with rec.bundle("x"), pytest.raises(ValueError, match="unknown stage 'q_after_rope'"):
        rec.record("q_after_rope", np.zeros(2), step=0, layer=0)
    with rec.bundle("x"), pytest.raises(ValueError, match="'draft_tokens' is per step: give step="):
        rec.record("draft_tokens", np.zeros(2))
    with rec.bundle("x"), pytest.raises(ValueError, match="'q' is per draft layer: give layer="):
        rec.record("q", np.zeros(2), step=0)
    assert Recorder().save(tmp_path / "plain") == tmp_path / "plain.npz" and (tmp_path / "plain.npz").is_file()


def test_bundles_carry_a_tokenizer_stub(golden):
    for b in greedy_bundles(golden):
        stub, target = b.manifest["tokenizer"], b.config("target")
        target = target.get("text_config", target)  # the hybrid target's folder is multimodal, as released
        draft = b.config("draft")
        if b.draft_is_muse():  # transformers' Muse Glimmer folder: no vocab_size, its mask id at the top level
            draft = {"vocab_size": target["vocab_size"], "dflash_config": {"mask_token_id": draft["mask_token_id"]}}
        assert len(stub["tokens"]) == draft["vocab_size"] == target["vocab_size"]
        assert stub["mask_token_id"] == draft["dflash_config"]["mask_token_id"]
        assert stub["eos_token_ids"] == (b.inputs["stop_token_ids"] or [])
    assert find_bundles(golden / "01_walkthrough")[0].manifest["tokenizer"]["tokens"][:4] == [
        "<s>",
        "the",
        "cat",
        "sat",
    ]
