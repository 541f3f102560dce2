"""The runner: a candidate run on golden bundles and judged (judge.py), or a dump read and judged.

A candidate is either a port (port.py: `run(bundle) -> {key: array}`) or a dump file (.npz or .safetensors) of
`{bundle name}/{key}` → array, written by a port in any framework. The runner reads the inputs (an InputError
before anything runs where it cannot), runs the port under a time limit, turns a crash into the port's result
(crash.py: where it fell over) and hands what it produced to the judge. Numpy only until a port runs: a port
named by a string is imported then (ports/registry.py, torch).
"""

from __future__ import annotations

from pathlib import Path

from . import crash
from .bundle import Bundle, find_bundles
from .hints import crash_hint
from .judge import compare
from .port import Port, as_port
from .report import Check, NotApplicable, Report
from .stages import STAGES
from .tensorfile import read_arrays
from .variants import check_variants, read_profile, window_mismatch


def resolve(impl) -> Port:
    """ "reference" | "zlab" | "module:factory" | a Port | an object with run() | a run function → a Port."""
    if isinstance(impl, str):
        from .ports.registry import resolve as resolve_adapter  # imports torch

        impl = resolve_adapter(impl)
    return as_port(impl)


def verify(
    impl,
    bundle: str | Path | None = None,
    allow_missing: bool = False,
    variants: dict | None = None,
    skip: list[str] = (),
    timeout: float | None = None,
    diagnose: bool = True,
) -> Report:
    """Run a candidate on the bundles at `bundle` (default: the shipped one) and compare. `variants`
    (or the adapter's own `variants` attribute) declares its design variants; the adapter's own `skip` (stages
    its port computes inside fused kernels, never as a tensor) waives stages, and `skip` (the user's) skips more,
    each said as whose. `timeout`: seconds a bundle's run may take before it is a timeout (None: no limit).
    `diagnose`: each bundle's first divergence explained by the catalogue of causes (causes/; left out
    where torch is not installed).
    What cannot be read (the bundles, the implementation, the declaration) is an InputError before
    anything runs."""
    adapter, bundles = _read_inputs(lambda: resolve(impl), bundle)
    own = list(adapter.skip)
    declared = _declaration({**adapter.variants, **(variants or {})}, [*own, *skip])
    users = [s for s in dict.fromkeys(skip) if s not in own]
    waivers = {**dict.fromkeys(own, "waived"), **dict.fromkeys(users, "user")}
    report = Report(adapter.name, allow_missing=allow_missing, skip=own, user_skip=users)
    report.totals = {b.name: len(b.entries) for b in bundles}
    diagnosis = _Diagnosis(diagnose)
    for b in bundles:
        if not adapter.reads_muse and b.draft_is_muse():  # not applicable: not even run
            said = f"{report.impl} reads DFlash checkpoints; this bundle's draft is transformers' Muse Glimmer format"
            said += " (`verify --impl transformers` runs it)"
            report.checks.append(
                Check(b.name, "bundle", "adapter", None, None, "skipped", detail=said, skipped_by="n/a")
            )
            continue
        if window_mismatch(b, declared):  # not applicable: not even run
            report.checks += compare(b, {}, report, declared, waivers)
            continue
        try:
            with crash.time_limit(timeout):
                produced = adapter.run(b)
        except NotApplicable as e:  # the port (an engine) refuses this bundle: said, neither a pass nor a failure
            report.checks.append(
                Check(b.name, "bundle", "adapter", None, None, "skipped", detail=str(e), skipped_by="n/a")
            )
            continue
        except (Exception, crash.OutOfTime) as e:  # noqa: BLE001 - a crashing port is a result to report, not to hide
            status = "timeout" if crash.timed_out(e) else "error"
            detail = crash.timeout_detail(e, timeout) if status == "timeout" else crash.where(e, adapter)
            configs = {"target": b.config("target"), "draft": b.config("draft")}
            held = crash.values_at_crash(e, adapter, crash.dimensions(configs, b.inputs.get("block_size")))
            said = "; ".join(filter(None, [crash_hint(e, configs), held]))
            report.checks.append(Check(b.name, "adapter", "adapter", None, None, status, detail=detail, hint=said))
            partial = getattr(e, "produced", None)  # what the adapter recorded before the port crashed
            if isinstance(partial, dict) and partial:  # compared too: a crash must not hide an earlier divergence
                done = compare(b, partial, None, declared, waivers)
                report.checks += [c for c in done if c.status not in ("missing", "skipped") and c.manifest]
            continue
        if not isinstance(produced, dict) or not all(isinstance(k, str) for k in produced):
            detail = f"run() returned {type(produced).__name__}, not a mapping of manifest keys (str) to arrays"
            report.checks.append(Check(b.name, "adapter", "adapter", None, None, "error", detail=detail))
            continue
        report.checks += _judged(b, produced, report, declared, waivers, diagnosis)
    diagnosis.refute(report, bundles, declared, waivers)
    report.impl = adapter.label  # with the code it found and the release that ran, known now
    return report


def verify_dump(
    path: str | Path,
    bundle: str | Path | None = None,
    allow_missing: bool = False,
    variants: dict | None = None,
    skip: list[str] = (),
    profile: str | Path | None = None,
    diagnose: bool = True,
) -> Report:
    """Compare a port's dump (keys `{bundle name}/{key}`) with the bundles at `bundle`. A profile
    (`profile`, or FILE.profile.json beside the dump) declares variants and waivers, which `variants`
    and `skip` extend."""
    arrays, bundles = _read_inputs(lambda: read_arrays(path), bundle)
    _check_dump_keys(path, arrays, bundles)
    beside = Path(path).with_suffix(".profile.json")
    try:
        found = read_profile(profile or beside) if profile or beside.is_file() else {"variants": {}, "skip": []}
    except ValueError as e:
        raise InputError(str(e)) from None
    own = list(found["skip"])  # the profile is the port's declaration; --skip is the user's
    declared = _declaration({**found["variants"], **(variants or {})}, [*own, *skip])
    users = [s for s in dict.fromkeys(skip) if s not in own]
    waivers = {**dict.fromkeys(own, "waived"), **dict.fromkeys(users, "user")}
    report = Report(f"dump {Path(path).name}", allow_missing=allow_missing, skip=own, user_skip=users)
    report.totals = {b.name: len(b.entries) for b in bundles}
    diagnosis = _Diagnosis(diagnose)
    for b in bundles:
        prefix = b.name + "/"
        produced = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
        report.checks += _judged(b, produced, report, declared, waivers, diagnosis)
    diagnosis.refute(report, bundles, declared, waivers)
    return report


class _Diagnosis:
    """This verify's diagnosis (causes/diagnose.Session), begun at the first failure: torch is imported then, never
    for a port that passes, and never where it is not installed (a dump checked with numpy alone: the readers'
    hints stay) or not asked for."""

    def __init__(self, asked: bool) -> None:
        self.asked, self.session = asked, None

    def explain(self, b: Bundle, produced: dict, checks: list[Check], declared: dict, waivers: dict) -> None:
        if not self.asked or not any(c.status == "FAIL" for c in checks):
            return
        if self.session is None:
            try:
                from .causes.diagnose import Session  # imports torch: the reference re-runs under each cause
            except ImportError:
                self.asked = False
                return
            self.session = Session()
        self.session.explain(b, produced, checks, declared, waivers)

    def refute(self, report: Report, bundles: list[Bundle], declared: dict, waivers: dict) -> None:
        if self.session is not None:
            self.session.refute([b for b in bundles if report.status(b.name) == "pass"], declared, waivers)


def _judged(b: Bundle, produced: dict, report: Report, declared: dict, waivers: dict, diagnosis) -> list[Check]:
    """The judge's checks of one bundle, its first divergence explained by the `diagnosis`."""
    checks = compare(b, produced, report, declared, waivers)
    diagnosis.explain(b, produced, checks, declared, waivers)
    return checks


def _check_dump_keys(path, arrays: dict, bundles: list[Bundle]) -> None:
    """A dump none of whose keys names a bundle it is compared with: an InputError saying how its keys should
    start (most often the bundle's folder, `01_walkthrough/…`, where the key is its name, `walkthrough/…`)."""
    prefixes = {k.split("/", 1)[0] for k in arrays}
    if not arrays or prefixes & {b.name for b in bundles}:
        return
    folders = {b.path.name: b.name for b in bundles if b.path.name in prefixes}
    example = next(iter(folders.items()), (None, bundles[0].name))
    said = (
        f"its keys start with the bundles' folder names ({example[0]}/…): key each tensor by its bundle's name, "
        f'{example[1]}/KEY (the manifest\'s "name")'
        if folders
        else f"none of its {len(arrays)} keys starts with the name of a bundle here ({', '.join(sorted(prefixes)[:3])}"
        f"{' …' if len(prefixes) > 3 else ''}): key each tensor {bundles[0].name}/KEY, the bundle's name then "
        "the manifest key"
    )
    raise InputError(f"dump {path}: {said}")


class InputError(ValueError):
    """A bundle, dump or implementation that cannot be read (the command line prints it in one line)."""


def _declaration(variants: dict, skip: list[str]) -> dict:
    """The declared variants, checked, and the waived stages known; else an InputError."""
    unknown = sorted(set(skip) - {s.name for s in STAGES})
    if unknown:
        raise InputError(f"--skip {unknown}: no such stage; stages: {[s.name for s in STAGES]}")
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
            raise ValueError(f"{bundle} holds only a sampling bundle: check it with verify sampling impl NAME")
        for b in bundles:
            _ = b.expected  # read now: a damaged file is named before any run
    except (ValueError, OSError) as e:
        raise InputError(str(e)) from None
    return candidate, bundles
