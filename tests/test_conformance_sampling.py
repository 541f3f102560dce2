"""Sampling conformance: the exact output distribution and first-step acceptance of the sampling
bundles (DFlash 1, and DFlash 2 with 2 candidates of 4 tokens), the statistics by hand, the reference
(both verifiers) and dflash 0.1.0 passing, and four sampling bugs each failing the test that names it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import dflash_ref.acceptance as acceptance_module
import dflash_ref.decoding as loop_module
from dflash_ref.conformance.adapters import ReferenceAdapter
from dflash_ref.conformance.bundle import SHIPPED, find_bundles
from dflash_ref.conformance.exact import reference_sampler, verify_sampling, write_sampling
from dflash_ref.conformance.sampling import check_sampling, chi_square, upper_gamma_regularized

RUNS = 1000  # seeds 0 … 999: measured here, the reference passes (p 0.6, z −1.1) and the weakest mutant,
# the draft at temperature 1, fails by z = −6.1 (the bundle's default for a port is 2000)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return find_bundles(write_sampling(tmp_path_factory.mktemp("sampling") / "sampling"))[0]


@pytest.fixture(scope="module")
def bundle2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sampling") / "sampling_dflash2"
    return find_bundles(write_sampling(folder, name="sampling_dflash2"))[0]


def test_the_chi_square_tail_by_hand():
    stats = pytest.importorskip("scipy.stats")
    for df, x in [(1, 0.5), (3, 2.0), (5, 11.07), (34, 40.3), (60, 120.0), (2, 0.0)]:
        assert math.isclose(upper_gamma_regularized(df / 2, x / 2), stats.chi2.sf(x, df), rel_tol=1e-9, abs_tol=1e-15)
    # counts 10, 10, 0 against 8, 8, 4: the bin under 5 is pooled, still under 5, so merged into the first
    statistic, df, p = chi_square(np.array([10.0, 10.0, 0.0]), np.array([8.0, 8.0, 4.0]))
    assert math.isclose(statistic, 4 / 12 + 4 / 8) and df == 1 and math.isclose(p, stats.chi2.sf(4 / 12 + 4 / 8, 1))
    assert chi_square(np.array([3.0, 1.0]), np.array([4.0, 0.0]))[2] == 0.0  # a count where none is expected


def test_the_bundle_holds_exact_distributions(bundle):
    s = bundle.manifest["sampling"]
    assert len(s["sequences"]) == 4 ** s["compared"] and math.isclose(sum(s["probabilities"]), 1, rel_tol=1e-9)
    for verifier in ("rejection", "match"):
        assert math.isclose(sum(s["acceptance"][verifier]), 1, rel_tol=1e-9) and min(s["acceptance"][verifier]) >= 0
    # the rejection verifier's draft is sampled from q: its acceptance Σ min(p, q) beats the greedy match here
    mean = {v: float(np.dot([0, 1, 2], s["acceptance"][v])) for v in ("rejection", "match")}
    assert mean["rejection"] > mean["match"] + 0.3


@pytest.mark.parametrize("which", ["bundle", "bundle2"], ids=["dflash1", "dflash2"])
@pytest.mark.parametrize("impl, verifier", [("reference", "rejection"), ("reference", "match"), ("zlab", "rejection")])
def test_the_reference_and_the_official_package_pass(request, which, impl, verifier):
    if impl == "zlab":
        pytest.importorskip("dflash.model")
    bundle = request.getfixturevalue(which)
    [(name, result)] = verify_sampling(impl, bundle.path, RUNS, verifier=verifier)
    assert name == bundle.name and result.passed, result.text()


def test_dflash2_bundle_holds_exact_distributions_with_fewer_candidates_than_tokens(bundle2):
    s, draft = bundle2.manifest["sampling"], bundle2.config("draft")
    assert draft["architectures"] == ["DFlash2DraftModel"]
    assert draft["dflash_config"]["selector_top_k"] == 2 < draft["vocab_size"] == 4
    assert math.isclose(sum(s["probabilities"]), 1, rel_tol=1e-9)
    for verifier in ("rejection", "match"):
        assert math.isclose(sum(s["acceptance"][verifier]), 1, rel_tol=1e-9) and min(s["acceptance"][verifier]) >= 0


def residual_at_candidate_slots(mp):
    """DFlash 1's residual applied to DFlash 2's q: q_k subtracted at token id k (the candidate's slot),
    not at c_k, the candidate's token id."""
    rejection = acceptance_module.verify_rejection

    def misplaced(draft_tokens, target_probs, draft_probs, candidates=None):
        tau, bonus = rejection(draft_tokens, target_probs, draft_probs, candidates)
        if candidates is not None and tau < draft_tokens.shape[1]:
            q = torch.nn.functional.pad(draft_probs[0, tau], (0, target_probs.shape[-1] - draft_probs.shape[-1]))
            residual = (target_probs[0, tau] - q).clamp_min(0)  # (V,) the slots as token ids
            bonus = acceptance_module.sample_probs((residual / residual.sum())[None])[0]
        return tau, bonus

    mp.setattr(acceptance_module, "verify_rejection", misplaced)


def test_dflash2_residual_at_the_candidate_slots_fails_the_distribution(bundle2):
    with pytest.MonkeyPatch.context() as mp:
        residual_at_candidate_slots(mp)
        result = check_sampling(bundle2.manifest["sampling"], reference_sampler(bundle2), RUNS)
    assert not result.passed and not result.distribution_ok and result.acceptance_ok, result.text()
    assert "residual norm(max(p − q, 0))" in result.text(), result.text()


def no_residual(target_probs, draft_probs, tau):
    """After a rejection, samples the target's p instead of the residual norm(max(p − q, 0))."""
    return target_probs[0, tau]


def mutant_sampler(bundle, mp, which):
    if which == "no_residual":
        rejection = acceptance_module.verify_rejection

        def biased(draft_tokens, target_probs, draft_probs, candidates=None):
            tau, bonus = rejection(draft_tokens, target_probs, draft_probs, candidates)
            if tau < draft_tokens.shape[1]:
                bonus = acceptance_module.sample_probs(no_residual(target_probs, draft_probs, tau)[None])[0]
            return tau, bonus

        mp.setattr(acceptance_module, "verify_rejection", biased)
    elif which == "no_rejection":  # keeps every drafted token, as if each had been accepted

        def keep_all(draft_tokens, target_probs, draft_probs, candidates=None):
            return draft_tokens.shape[1], acceptance_module.sample_probs(target_probs[:, -1])[0]

        mp.setattr(acceptance_module, "verify_rejection", keep_all)
    elif which == "draft_ignores_temperature":
        probs = loop_module.sampling_probs
        mp.setattr(loop_module, "sampling_probs", lambda logits, t, p=1.0, k=0: probs(logits, 1.0, p, k))
    return reference_sampler(bundle)


@pytest.mark.parametrize(
    "which, fails, named",
    [
        ("no_residual", "distribution", "residual norm(max(p − q, 0))"),
        ("no_rejection", "distribution", "the rejection rule"),
        ("draft_ignores_temperature", "acceptance", "samples at the request's temperature"),
    ],
)
def test_sampling_bugs_fail_their_test_with_the_reason(bundle, which, fails, named):
    with pytest.MonkeyPatch.context() as mp:
        result = check_sampling(bundle.manifest["sampling"], mutant_sampler(bundle, mp, which), RUNS)
    assert not result.passed, result.text()
    assert result.distribution_ok == (fails == "acceptance") and named in result.text(), result.text()


def test_a_sampler_that_reports_tokens_per_step_or_too_few_runs_is_named(bundle):
    sampler = reference_sampler(bundle)
    with pytest.raises(ValueError, match=r"outside 0 … 2 \(the accepted proposals, not tokens per step"):
        check_sampling(bundle.manifest["sampling"], lambda seed: (sampler(seed)[0], 3), 10)
    with pytest.raises(ValueError, match="runs must be a whole number ≥ 1, got 0"):
        check_sampling(bundle.manifest["sampling"], sampler, 0)
    with pytest.raises(ValueError, match="has no sampler"):
        verify_sampling(ReferenceAdapter(), bundle.path, 10)  # a greedy adapter


def test_verify_sampling_from_the_command_line(bundle, capsys):
    from dflash_ref.__main__ import main

    assert main(["verify", "--impl", "reference", "--sampling", "--bundle", str(bundle.path), "--runs", "400"]) == 0
    out = capsys.readouterr().out
    assert "sampling: reference" in out and "chi-square" in out and "first-step τ (rejection)" in out
    with pytest.raises(SystemExit, match="no sampling bundle at"):  # the shipped greedy bundle
        main(["verify", "--impl", "reference", "--sampling", "--bundle", str(SHIPPED)])
    with pytest.raises(SystemExit, match="no golden bundle at"):
        main(["verify", "--impl", "reference", "--sampling", "--bundle", str(bundle.path / "target")])
    with pytest.raises(SystemExit, match="holds only a sampling bundle: check it with verify --sampling"):
        main(["verify", "--impl", "reference", "--bundle", str(bundle.path)])
    with pytest.raises(SystemExit, match="--runs and --verifier go with --sampling"):
        main(["verify", "--impl", "reference", "--runs", "10"])
    with pytest.raises(SystemExit, match="--variant, --skip and --profile are for the greedy bundles"):
        main(["verify", "--impl", "reference", "--sampling", "--skip", "q"])
