"""Compare a candidate's tensors with golden bundles, stage by stage, and say where it first diverges.

Numpy only (torch is imported only when an adapter has to run). For every manifest entry, in the
order of the data's walk:

    floats:   err = max|got − expected| / max(1, max|expected|)  ≤  tolerance    (the manifest's)
    integers: got == expected, element for element
    shape:    must be equal (a wrong context length shows up here first)

Semantic stages (what DFlash defines) fail; observables (the cache lengths) are checked against the
port's design variant, declared or detected (variants.py), and are a note where it declared none.
The first semantic entry that fails is the first stage where the candidate departs from DFlash. A
candidate is either an adapter (`run(bundle) -> {key: array}`, see adapters.py) or a dump file
(.npz or .safetensors) of `{bundle name}/{key}` → array, written by a port in any framework.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np

from .bundle import KINDS, STAGES, Bundle, candidates_in_id_order, find_bundles
from .hints import hint
from .report import Check, NotApplicable, Report
from .tensorfile import array_or_none, as_array, read_arrays
from .variants import check_variants, expected_lengths, read_profile, resolve_variants, shrunk_steps, window_mismatch


def _evicted(entry: dict, expected: np.ndarray, got: np.ndarray) -> int:
    """How many leading rows a candidate left out (0: none, −1: not allowed): keys on a sliding-window
    layer, or position 0's final hidden. Allowed only along the entry's `evictable_axis`, for weights
    only where they are exactly 0, for the final hidden only its first row."""
    axis = entry.get("evictable_axis")
    if (
        axis is None
        or got.ndim != expected.ndim
        or got.shape[axis] >= expected.shape[axis]
        or any(g != e for i, (g, e) in enumerate(zip(got.shape, expected.shape)) if i != axis)
    ):
        return -1
    dropped = expected.shape[axis] - got.shape[axis]
    if entry["stage"] == "pattern" and np.any(np.take(expected, range(dropped), axis=axis) != 0):
        return -1
    if entry["stage"] == "final_hidden" and dropped != 1:
        return -1
    return dropped


def compare_one(bundle: str, entry: dict, expected: np.ndarray, got) -> Check:
    stage, step, layer = entry["stage"], entry.get("step"), entry.get("layer")
    check = Check(bundle, entry["key"], stage, step, layer, "pass", tolerance=entry["tolerance"])
    if got is None:
        check.status, check.detail = "missing", "not produced by the candidate"
        return check
    try:
        got = as_array(got)
        if not np.issubdtype(got.dtype, np.number) and got.dtype != np.bool_:
            raise TypeError(f"of dtype {got.dtype}")
    except (TypeError, ValueError) as e:  # ragged lists, objects, strings: a result, not a crash of verify
        check.status, check.detail = "FAIL", f"not an array of numbers ({e})"
        return check
    if got.shape != expected.shape:
        dropped = _evicted(entry, expected, got)
        if dropped < 0:
            check.status, check.detail = "FAIL", f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
            return check
        expected = np.take(
            expected, range(dropped, expected.shape[entry["evictable_axis"]]), axis=entry["evictable_axis"]
        )
        check.note = (
            f"{dropped} keys outside the window left out"
            if stage != "final_hidden"
            else "position 0 (no logit) left out"
        )
    if expected.size == 0:
        return check
    if np.issubdtype(expected.dtype, np.integer):
        wrong = np.flatnonzero(got.reshape(-1) != expected.reshape(-1))
        if wrong.size:
            i = int(wrong[0])
            check.status = "FAIL"
            check.detail = (
                f"{wrong.size} of {expected.size} differ; first at flat index {i}: "
                f"got {got.reshape(-1)[i]}, expected {expected.reshape(-1)[i]}"
            )
        return check
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    check.max_abs = float(np.nanmax(diff)) if not np.isnan(diff).all() else float("nan")
    check.rel = check.max_abs / max(1.0, float(np.abs(expected).max()))
    if not np.isfinite(got).all() or not check.rel <= check.tolerance:
        check.status = "FAIL"
        check.detail = "" if np.isfinite(got).all() else "non-finite values"
    return check


# what the first shrunk step of a full-then-truncate port still computes as the reference did: its
# context, before any row of the block (later shrunk steps may follow other proposals, so other contexts)
BLOCK_FREE = {"target_hidden", "fc", "context", "k_ctx"}


def compare(
    bundle: Bundle, produced: dict, report: Report | None = None, declared: dict | None = None, skip: list[str] = ()
) -> list[Check]:
    """Every manifest entry of `bundle` against `produced` (key → array), in walk order, under the
    port's design variants (`declared`, the rest detected); `skip` names stages the port waives. Keys
    the manifest does not list, and the variants used, go to `report`."""
    unread = window_mismatch(bundle, declared or {})
    if unread:
        return [Check(bundle.name, "bundle", "sliding_window", None, None, "skipped", detail=unread)]
    produced = candidates_in_id_order(produced)
    variants = resolve_variants(bundle, produced, declared or {})
    if report is not None:
        listed = {e["key"] for e in bundle.entries}
        report.ignored[bundle.name] = sorted(k for k in produced if k not in listed)
        report.variants[bundle.name] = variants
    truncated = shrunk_steps(bundle) if variants["last_block"][0] == "full-then-truncate" else set()
    draft = bundle.config("draft")
    context = {
        "inputs": bundle.inputs,
        "mask_token_id": draft.get("dflash_config", draft).get("mask_token_id"),
        "sliding_window": bundle.manifest.get("sliding_window"),
    }
    checks, last = [], max((e["step"] for e in bundle.entries if e["stage"] == "cache_lengths"), default=None)
    for e in bundle.entries:
        expected, got = bundle.expected[e["key"]], produced.get(e["key"])
        if truncated and e["stage"] == "output_ids" and (got is None or "output_ids" in skip):
            checks.append(
                Check(
                    bundle.name,
                    e["key"],
                    e["stage"],
                    None,
                    None,
                    "FAIL",
                    detail="full-then-truncate is judged by its output ids, which the port did not give",
                )
            )
            continue
        if e["stage"] in skip or (
            e.get("step") in truncated and not (e["stage"] in BLOCK_FREE and e.get("step") == min(truncated))
        ):
            checks.append(
                Check(
                    bundle.name,
                    e["key"],
                    e["stage"],
                    e.get("step"),
                    e.get("layer"),
                    "skipped",
                    detail="waived by the port"
                    if e["stage"] in skip
                    else "the reference shrank this last block; full-then-truncate compares the output",
                )
            )
            continue
        choice, how = variants["draft_cache"] if e["stage"] == "cache_lengths" else (None, None)
        if choice:
            expected = _final_crop_free(expected_lengths(choice, expected), got, e.get("step") == last)
        check = compare_one(bundle.name, e, expected, got)
        if choice and choice != "crop-after-pass":
            check.note = f"the {choice} variant's lengths"
        if check.status in ("FAIL", "missing") and KINDS.get(e["stage"]) == "observable" and how != "declared":
            check.status = "note"  # an undeclared implementation choice: reported, not a failure
        if check.status == "FAIL":
            check.hint = hint(e["stage"], expected, array_or_none(got), context, e.get("layer"))
            check.expected, check.got = expected, array_or_none(got)
        checks.append(check)
    _keep_first_tensors(checks)
    return checks


def _keep_first_tensors(checks: list[Check]) -> None:
    """Only the bundle's first divergence keeps its two tensors (for `verify --html`): the others are let go."""
    failing = [c for c in checks if c.status == "FAIL"]
    first = next((c for c in failing if c.kind == "semantic"), failing[0] if failing else None)
    for c in failing:
        if c is not first:
            c.expected = c.got = None


def _final_crop_free(expected: np.ndarray, got, last: bool) -> np.ndarray:
    """The expected cache lengths, except the target's crop after the last step (its cache is never
    used again: a port may skip that crop), which is taken as the port gave it."""
    got = array_or_none(got)
    if not last or got is None or got.shape != expected.shape:
        return expected
    expected = expected.copy()
    expected[5] = got[5]
    return expected


def resolve(impl):
    """ "reference" | "zlab" | "module:factory" | an adapter | a run function → something with run()."""
    if isinstance(impl, str):
        from .ports import resolve as resolve_adapter  # imports torch

        impl = resolve_adapter(impl)
    if not hasattr(impl, "run") and callable(impl):
        return type("FunctionAdapter", (), {"name": getattr(impl, "__name__", "function"), "run": staticmethod(impl)})()
    return impl


def verify(
    impl,
    bundle: str | Path | None = None,
    allow_missing: bool = False,
    variants: dict | None = None,
    skip: list[str] = (),
) -> Report:
    """Run a candidate on the bundles at `bundle` (default: the shipped one) and compare. `variants`
    (or the adapter's own `variants` attribute) declares its design variants; `skip` (and the adapter's
    own `skip`: stages its port computes inside fused kernels, never as a tensor) waives stages.
    What cannot be read (the bundles, the implementation, the declaration) is an InputError before
    anything runs."""
    adapter, bundles = _read_inputs(lambda: resolve(impl), bundle)
    skip = [*getattr(adapter, "skip", ()), *skip]
    declared = _declaration({**getattr(adapter, "variants", {}), **(variants or {})}, skip)
    report = Report(getattr(adapter, "name", str(impl)), allow_missing=allow_missing, skip=list(skip))
    for b in bundles:
        if window_mismatch(b, declared):  # not applicable: not even run
            report.checks += compare(b, {}, report, declared, skip)
            continue
        try:
            produced = adapter.run(b)
        except NotApplicable as e:  # the port (an engine) refuses this bundle: said, neither a pass nor a failure
            report.checks.append(Check(b.name, "bundle", "adapter", None, None, "skipped", detail=str(e)))
            continue
        except Exception as e:  # noqa: BLE001 - a crashing port is a result to report, not to hide
            where = traceback.extract_tb(e.__traceback__)[-1]
            report.checks.append(
                Check(
                    b.name,
                    "adapter",
                    "adapter",
                    None,
                    None,
                    "error",
                    detail=f"{type(e).__name__}: {e} ({Path(where.filename).name}:{where.lineno})",
                )
            )
            continue
        report.checks += compare(b, produced, report, declared, skip)
    if getattr(adapter, "layout", None):  # which code of the port it found (official.py)
        report.impl += f" [{adapter.layout} code]"
    return report


def verify_dump(
    path: str | Path,
    bundle: str | Path | None = None,
    allow_missing: bool = False,
    variants: dict | None = None,
    skip: list[str] = (),
    profile: str | Path | None = None,
) -> Report:
    """Compare a port's dump (keys `{bundle name}/{key}`) with the bundles at `bundle`. A profile
    (`profile`, or FILE.profile.json beside the dump) declares variants and waivers, which `variants`
    and `skip` extend."""
    arrays, bundles = _read_inputs(lambda: read_arrays(path), bundle)
    beside = Path(path).with_suffix(".profile.json")
    try:
        found = read_profile(profile or beside) if profile or beside.is_file() else {"variants": {}, "skip": []}
    except ValueError as e:
        raise InputError(str(e)) from None
    skip = [*found["skip"], *skip]
    declared = _declaration({**found["variants"], **(variants or {})}, skip)
    report = Report(f"dump {Path(path).name}", allow_missing=allow_missing, skip=skip)
    for b in bundles:
        prefix = b.name + "/"
        report.checks += compare(
            b, {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}, report, declared, skip
        )
    return report


class InputError(ValueError):
    """A bundle, dump or implementation that cannot be read (the command line prints it in one line)."""


def _declaration(variants: dict, skip: list[str]) -> dict:
    """The declared variants, checked, and the waived stages known; else an InputError."""
    unknown = sorted(set(skip) - {s[0] for s in STAGES})
    if unknown:
        raise InputError(f"--skip {unknown}: no such stage; stages: {[s[0] for s in STAGES]}")
    try:
        return check_variants(variants)
    except ValueError as e:
        raise InputError(str(e)) from None


def _read_inputs(read_candidate, bundle):
    """(read_candidate(), the greedy bundles at `bundle` with their expected tensors read), or an
    InputError; a sampling bundle is for `verify --sampling` (exact.py) and is left out here."""
    try:
        candidate, bundles = read_candidate(), find_bundles(bundle)
        bundles = [b for b in bundles if b.manifest.get("kind") != "sampling"]
        if not bundles:
            raise ValueError(f"{bundle} holds only a sampling bundle: check it with verify --sampling")
        for b in bundles:
            _ = b.expected  # read now: a damaged file is named before any run
    except (ValueError, OSError) as e:
        raise InputError(str(e)) from None
    return candidate, bundles
