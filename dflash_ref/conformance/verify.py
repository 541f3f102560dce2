"""Compare a candidate's tensors with golden bundles, stage by stage, and say where it first diverges.

Numpy only (torch is imported only when an adapter has to run). For every manifest entry, in the
order of the data's walk:

    floats:   err = max|got − expected| / max(1, max|expected|)  ≤  tolerance    (the manifest's)
    integers: got == expected, element for element
    shape:    must be equal (a wrong context length or cache length shows up here first)

The first entry that fails is the first stage where the candidate departs from DFlash. A candidate
is either an adapter (`run(bundle) -> {key: array}`, see adapters.py) or a dump file (.npz or
.safetensors) of `{bundle name}/{key}` → array, written by a port in any framework.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .bundle import TITLES, Bundle, find_bundles
from .tensorfile import read_arrays


@dataclass
class Check:
    bundle: str
    key: str
    stage: str
    step: int | None
    layer: int | None
    status: str                  # "pass" | "FAIL" | "missing" | "error"
    max_abs: float = 0.0
    rel: float = 0.0             # max_abs / max(1, max|expected|)
    tolerance: float = 0.0
    detail: str = ""             # why it failed (shape, integers, missing)
    note: str = ""               # what was allowed (keys evicted by a sliding window)

    @property
    def where(self) -> str:
        parts = [self.bundle] + ([f"step {self.step}"] if self.step is not None else []) + \
                ([f"layer {self.layer}"] if self.layer is not None else [])
        return " · ".join(parts)

    def line(self) -> str:
        numbers = f"max abs {self.max_abs:.2e}  rel {self.rel:.2e}  tol {self.tolerance:.0e}"
        text = self.detail or (numbers if self.tolerance else "exact") + (f" ({self.note})" if self.note else "")
        return f"{self.status:<7} {self.where:<36} {TITLES.get(self.stage, self.stage):<22} {text}   [{self.key}]"


@dataclass
class Report:
    impl: str
    checks: list[Check] = field(default_factory=list)
    allow_missing: bool = False
    ignored: dict[str, list[str]] = field(default_factory=dict)  # bundle → keys the manifest lacks

    def failed(self, check: Check) -> bool:
        return check.status in ("FAIL", "error") or (check.status == "missing" and not self.allow_missing)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and not any(self.failed(c) for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        """The first failing check along the walk, in the first bundle that fails."""
        return next((c for c in self.checks if self.failed(c)), None)

    def stages(self, bundle: str) -> list[tuple[str, int, int, float | None]]:
        """Per stage of one bundle: (stage, checks, failures, worst rel error or None if exact), in walk order."""
        rows: dict[str, list] = {}
        for c in self.checks:
            if c.bundle == bundle:
                row = rows.setdefault(c.stage, [c.stage, 0, 0, None])
                row[1] += 1
                row[2] += self.failed(c)
                if c.tolerance:
                    row[3] = max(row[3] or 0.0, c.rel)
        return [tuple(r) for r in rows.values()]

    def text(self, verbose: bool = False) -> str:
        bundles = list(dict.fromkeys(c.bundle for c in self.checks))
        lines = [f"verify {self.impl} on {len(bundles)} bundle(s), {len(self.checks)} tensors"]
        for b in bundles:
            lines.append(f"\n{b}:")
            for stage, n, bad, worst in self.stages(b):
                lines.append(f"  {'FAIL' if bad else 'pass':<5} {TITLES.get(stage, stage):<22} {n - bad:>3}/{n:<3} "
                             + ("exact" if worst is None else f"worst rel {worst:.1e}"))
            if self.ignored.get(b):  # most often a misspelt key, whose tensor then shows as missing
                keys = self.ignored[b]
                lines.append(f"  ignored {len(keys)} key(s) the manifest does not list: {', '.join(keys[:4])}"
                             + (" …" if len(keys) > 4 else ""))
        if verbose:
            lines += ["", "every tensor:"] + ["  " + c.line() for c in self.checks]
        first = self.first_failure
        if first is None:
            lines.append(f"\nPASS: all {len(self.checks)} tensors agree with DFlash.")
        else:
            lines.append(f"\nFIRST DIVERGENCE: {first.where} · {TITLES.get(first.stage, first.stage)}\n  "
                         + first.line())
        return "\n".join(lines)

    def __repr__(self) -> str:
        first = self.first_failure
        return (f"Report({self.impl!r}, {len(self.checks)} checks, "
                f"{'PASS' if first is None else 'first divergence: ' + first.where + ' · ' + first.stage})")


def as_array(value) -> np.ndarray:
    """numpy arrays, lists, numbers, and (without importing torch) CPU-able torch tensors."""
    if hasattr(value, "detach"):  # a torch tensor: bf16 has no numpy twin, go through float32
        value = value.detach().cpu()
        value = value.float() if value.is_floating_point() else value
        return value.numpy()
    return np.asarray(value)


def _evicted(entry: dict, expected: np.ndarray, got: np.ndarray) -> int:
    """How many leading keys a candidate left out on a sliding-window layer (0: none, −1: not allowed).
    Allowed only along the entry's `evictable_axis`, and for weights only where they are exactly 0."""
    axis = entry.get("evictable_axis")
    if axis is None or got.ndim != expected.ndim or got.shape[axis] >= expected.shape[axis] or \
            any(g != e for i, (g, e) in enumerate(zip(got.shape, expected.shape)) if i != axis):
        return -1
    dropped = expected.shape[axis] - got.shape[axis]
    if entry["stage"] == "pattern" and np.any(np.take(expected, range(dropped), axis=axis) != 0):
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
    except (TypeError, ValueError) as e:     # ragged lists, objects, strings: a result, not a crash of verify
        check.status, check.detail = "FAIL", f"not an array of numbers ({e})"
        return check
    if got.shape != expected.shape:
        dropped = _evicted(entry, expected, got)
        if dropped < 0:
            check.status, check.detail = "FAIL", f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
            return check
        expected = np.take(expected, range(dropped, expected.shape[entry["evictable_axis"]]),
                           axis=entry["evictable_axis"])
        check.note = f"{dropped} keys outside the window left out"
    if expected.size == 0:
        return check
    if np.issubdtype(expected.dtype, np.integer):
        wrong = np.flatnonzero(got.reshape(-1) != expected.reshape(-1))
        if wrong.size:
            i = int(wrong[0])
            check.status = "FAIL"
            check.detail = (f"{wrong.size} of {expected.size} differ; first at flat index {i}: "
                            f"got {got.reshape(-1)[i]}, expected {expected.reshape(-1)[i]}")
        return check
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    check.max_abs = float(np.nanmax(diff)) if not np.isnan(diff).all() else float("nan")
    check.rel = check.max_abs / max(1.0, float(np.abs(expected).max()))
    if not np.isfinite(got).all() or not check.rel <= check.tolerance:
        check.status = "FAIL"
        check.detail = "" if np.isfinite(got).all() else "non-finite values"
    return check


def compare(bundle: Bundle, produced: dict, report: Report | None = None) -> list[Check]:
    """Every manifest entry of `bundle` against `produced` (key → array), in walk order; keys the
    manifest does not list are noted in `report.ignored`."""
    if report is not None:
        listed = {e["key"] for e in bundle.entries}
        report.ignored[bundle.name] = sorted(k for k in produced if k not in listed)
    return [compare_one(bundle.name, e, bundle.expected[e["key"]], produced.get(e["key"]))
            for e in bundle.entries]


def resolve(impl):
    """"reference" | "zlab" | "module:factory" | an adapter | a run function → something with run()."""
    if isinstance(impl, str):
        from .adapters import resolve as resolve_adapter  # imports torch
        impl = resolve_adapter(impl)
    if not hasattr(impl, "run") and callable(impl):
        return type("FunctionAdapter", (), {"name": getattr(impl, "__name__", "function"),
                                            "run": staticmethod(impl)})()
    return impl


def verify(impl, bundle: str | Path | None = None, allow_missing: bool = False) -> Report:
    """Run a candidate on the bundles at `bundle` (default: the shipped one) and compare. What cannot be
    read (the bundles, the implementation named) is an InputError before anything runs."""
    adapter, bundles = _read_inputs(lambda: resolve(impl), bundle)
    report = Report(getattr(adapter, "name", str(impl)), allow_missing=allow_missing)
    for b in bundles:
        try:
            produced = adapter.run(b)
        except Exception as e:  # noqa: BLE001 - a crashing port is a result to report, not to hide
            where = traceback.extract_tb(e.__traceback__)[-1]
            report.checks.append(Check(b.name, "adapter", "adapter", None, None, "error",
                                       detail=f"{type(e).__name__}: {e} ({Path(where.filename).name}:"
                                              f"{where.lineno})"))
            continue
        report.checks += compare(b, produced, report)
    return report


def verify_dump(path: str | Path, bundle: str | Path | None = None, allow_missing: bool = False) -> Report:
    """Compare a port's dump (keys `{bundle name}/{key}`) with the bundles at `bundle`."""
    arrays, bundles = _read_inputs(lambda: read_arrays(path), bundle)
    report = Report(f"dump {Path(path).name}", allow_missing=allow_missing)
    for b in bundles:
        prefix = b.name + "/"
        report.checks += compare(b, {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)},
                                 report)
    return report


class InputError(ValueError):
    """A bundle, dump or implementation that cannot be read (the command line prints it in one line)."""


def _read_inputs(read_candidate, bundle):
    """(read_candidate(), the bundles at `bundle` with their expected tensors read), or an InputError."""
    try:
        candidate, bundles = read_candidate(), find_bundles(bundle)
        for b in bundles:
            b.expected                                    # read now: a damaged file is named before any run
    except (ValueError, OSError) as e:
        raise InputError(str(e)) from None
    return candidate, bundles
