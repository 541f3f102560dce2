"""What `verify` says: one Check per manifest entry, and the Report over all bundles.

A check's status: pass, FAIL, missing, error (the adapter raised), note (an observable that differs
from the reference's choice where the port declared none: not a failure), skipped (waived by the
port, or not compared under its declared variant). FIRST DIVERGENCE is the first failing semantic
check along the data's walk (an observable only where none is semantic), with a hint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .bundle import KINDS, TITLES


class NotApplicable(Exception):
    """Raised by an adapter whose port cannot take a bundle (an engine refuses its shapes or a feature, or
    is not installed): its message says why, e.g. "vLLM refuses this bundle: <vLLM's own message>"; the
    report says "not applicable" and why, neither a pass nor a failure."""


@dataclass
class Check:
    bundle: str
    key: str
    stage: str
    step: int | None
    layer: int | None
    status: str  # "pass" | "FAIL" | "missing" | "error" | "note" | "skipped"
    max_abs: float = 0.0
    rel: float = 0.0  # max_abs / max(1, max|expected|)
    tolerance: float = 0.0
    detail: str = ""  # why it failed (shape, integers, missing), or why it was skipped
    note: str = ""  # what was allowed (keys evicted by a sliding window, a variant)
    hint: str = ""  # for a failure: what to look at first (hints.py)
    # a failure's own tensors (the reference's, the port's), kept for the first divergence of each bundle only
    # (verify drops the others), for `verify --html`: numpy arrays as compared, or None
    expected: object = field(default=None, repr=False, compare=False)
    got: object = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        return KINDS.get(self.stage, "semantic")

    @property
    def where(self) -> str:
        parts = (
            [self.bundle]
            + ([f"step {self.step}"] if self.step is not None else [])
            + ([f"layer {self.layer}"] if self.layer is not None else [])
        )
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
    variants: dict[str, dict] = field(default_factory=dict)  # bundle → {variant: (choice, how)}
    skip: list[str] = field(default_factory=list)  # stages the port waived

    def failed(self, check: Check) -> bool:
        return check.status in ("FAIL", "error") or (check.status == "missing" and not self.allow_missing)

    @property
    def passed(self) -> bool:
        """Nothing failed, and something was compared (waiving every stage proves nothing)."""
        return any(c.status == "pass" for c in self.checks) and not any(self.failed(c) for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        """The first failing check along the walk, semantic stages ranked before observables."""
        return self.first_failure_in(self.checks)

    def first_failure_in(self, checks: list[Check]) -> Check | None:
        """The same over some of the checks (e.g. one bundle's)."""
        failing = [c for c in checks if self.failed(c)]
        return next((c for c in failing if c.kind == "semantic"), failing[0] if failing else None)

    def stages(self, bundle: str) -> list[tuple[str, int, int, float | None, int]]:
        """Per stage of one bundle: (stage, checks, failures, worst rel error or None if exact, notes),
        in walk order; skipped checks are not counted."""
        rows: dict[str, list] = {}
        for c in self.checks:
            if c.bundle == bundle and c.status != "skipped":
                row = rows.setdefault(c.stage, [c.stage, 0, 0, None, 0])
                row[1] += 1
                row[2] += self.failed(c)
                row[4] += c.status == "note"
                if c.tolerance:
                    row[3] = max(row[3] or 0.0, c.rel)
        return [tuple(r) for r in rows.values()]

    def text(self, verbose: bool = False) -> str:
        bundles = list(dict.fromkeys(c.bundle for c in self.checks))
        lines = [f"verify {self.impl} on {len(bundles)} bundle(s), {len(self.checks)} tensors"]
        if self.skip:
            lines.append(f"waived by the port (--skip): {', '.join(TITLES.get(s, s) for s in self.skip)}")
        for b in bundles:
            lines.append(f"\n{b}:")
            variants = self.variants.get(b, {})
            if variants:
                lines.append("  variants: " + ", ".join(f"{k} = {v} ({how})" for k, (v, how) in variants.items()))
            for c in self.checks:
                if c.bundle == b and c.status == "error":
                    lines.append(f"  adapter raised: {c.detail}")
            for stage, n, bad, worst, notes in self.stages(b):
                if stage == "adapter":
                    continue
                state = "FAIL" if bad else "note" if notes else "pass"
                lines.append(
                    f"  {state:<5} {TITLES.get(stage, stage):<22} {n - bad - notes:>3}/{n:<3} "
                    + ("exact" if worst is None else f"worst rel {worst:.1e}")
                    + (f"  ({notes} differ: {KINDS.get(stage)}, not declared)" if notes else "")
                )
            lines += [f"  not applicable: {c.detail}" for c in self.checks if c.bundle == b and c.key == "bundle"]
            skipped = sum(c.bundle == b and c.status == "skipped" and c.key != "bundle" for c in self.checks)
            if skipped:
                lines.append(f"  skipped {skipped} tensor(s): waived, or not compared under a declared variant")
            if self.ignored.get(b):  # most often a misspelt key, whose tensor then shows as missing
                keys = self.ignored[b]
                lines.append(
                    f"  ignored {len(keys)} key(s) the manifest does not list: {', '.join(keys[:4])}"
                    + (" …" if len(keys) > 4 else "")
                )
        if verbose:
            lines += ["", "every tensor:"] + ["  " + c.line() for c in self.checks]
        first = self.first_failure
        if first is None and not self.passed:
            lines.append("\nNOTHING COMPARED: every tensor was skipped, waived or a note.")
        elif first is None:
            compared = sum(c.status not in ("skipped", "note") for c in self.checks)
            lines.append(f"\nPASS: all {compared} tensors compared agree with DFlash.")
        elif first.status == "error":
            lines.append(f"\nFIRST DIVERGENCE: {first.bundle} · adapter raised\n  {first.detail}")
        else:
            lines.append(
                f"\nFIRST DIVERGENCE: {first.where} · {TITLES.get(first.stage, first.stage)}\n  "
                + first.line()
                + (f"\n  hint: {first.hint}" if first.hint else "")
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        first = self.first_failure
        return (
            f"Report({self.impl!r}, {len(self.checks)} checks, "
            f"{'PASS' if first is None else 'first divergence: ' + first.where + ' · ' + first.stage})"
        )
