"""What `verify` says: one Check per manifest entry, and the Report over all bundles.

A check's status: pass, FAIL, missing, error (the adapter raised), note (an observable that differs
from the reference's choice where the port declared none: not a failure), skipped (waived by the
port, or not compared under its declared variant). FIRST DIVERGENCE is the first failing semantic
check along the data's walk (an observable only where none is semantic), with a hint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .stages import KINDS, TITLES


class NotApplicable(Exception):
    """Raised by an adapter whose port cannot take a bundle (an engine refuses its shapes or a feature, or
    is not installed): its message says why, e.g. "vLLM refuses this bundle: <vLLM's own message>"; the
    report says "not applicable" and why, neither a pass nor a failure."""


# A bundle's status, one of these words, printed and in the JSON (`Report.status`): pass (something compared, and
# nothing failed), fail (a tensor differs or is missing, a check of the port's own steps fails, or nothing was
# compared), n/a (the port does not take this bundle, in its words), crash (the port raised), timeout (it did not
# finish in the time given). ("tie" belongs to the endpoint checks, not to a bundle's tensors.)
STATUSES = ("pass", "fail", "n/a", "crash", "timeout")

# Independent divergences (Report.divergences): each failing stage belongs to one part of the walk; a failure is a
# consequence, not a finding of its own, where a part upstream of it failed at the same step or earlier, or where
# the run had already parted from DFlash's (other proposals or other committed tokens at an earlier step: every
# later step sees another context). The port's own steps (a step DFlash does not run, an invariant) are a part of
# their own, upstream of nothing.
PARTS = {
    **dict.fromkeys(("prefill_logits", "first_token", "verify_logits", "posterior", "conv_state", "recurrent_state"),
                    "target"),
    **dict.fromkeys(("layer_ids", "target_hidden"), "features"),
    **dict.fromkeys(("acceptance_length", "bonus", "cache_lengths"), "loop"),
    "output_ids": "output",
}  # fmt: skip
# the parts whose failure explains a part's (the loop and the output are also explained by a step's decision that
# differs: other proposals at the same step or earlier; a draft whose tokens all agree explains neither)
UPSTREAM = {
    "target": (),
    "features": ("target",),
    "draft": ("target", "features"),
    "loop": ("target",),
    "output": ("target", "loop"),
    "steps": (),
}
PARTING = {"draft_tokens", "posterior", "acceptance_length", "bonus"}  # a step's decision: later steps follow it

# what a check that is no manifest tensor is about (judge.py): a step the port ran and DFlash does not
TITLES_BEYOND = {
    "extra_step": "a step DFlash does not run",
    "draft_accepted": "draft tokens accepted (engine's count)",
}


def title(stage: str) -> str:
    """A stage's title; a row of checks of the port's own steps ("τ (own steps)") keeps its suffix."""
    base, own, _ = stage.partition(" (own steps)")
    return (TITLES.get(base) or TITLES_BEYOND.get(base, base)) + (" (own steps)" if own else "")


@dataclass
class Check:
    bundle: str
    key: str
    stage: str
    step: int | None
    layer: int | None
    status: str  # "pass" | "FAIL" | "missing" | "error" | "timeout" | "note" | "skipped"
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
    # a skipped check: "waived" (the port's own `skip`, or its profile's), "user" (--skip given on the command line),
    # the variant it is not compared under, or "n/a"
    skipped_by: str = ""
    manifest: bool = True  # False: a check of the port's own steps (one DFlash does not run, or an invariant)
    serving: str = ""  # a serving scenario's request: "scenario · condition · request r1" (said instead of the bundle)

    @property
    def kind(self) -> str:
        return KINDS.get(self.stage, "semantic")

    @property
    def where(self) -> str:
        parts = (
            [self.serving or self.bundle]
            + ([f"step {self.step}"] if self.step is not None else [])
            + ([f"layer {self.layer}"] if self.layer is not None else [])
        )
        return " · ".join(parts)

    @property
    def place(self) -> str:
        """Where within its bundle: "step 2 · layer 1 · " (empty for the prefill's and the output's checks)."""
        parts = ([f"step {self.step}"] if self.step is not None else []) + (
            [f"layer {self.layer}"] if self.layer is not None else []
        )
        return "".join(p + " · " for p in parts)

    @property
    def differs(self) -> str:
        """What a failed check found different, always something: its detail (a shape, the integers, …) or
        its numbers."""
        numbers = f"max abs {self.max_abs:.2e}  rel {self.rel:.2e}  tol {self.tolerance:.0e}"
        shown = numbers if self.tolerance or self.max_abs or self.status == "FAIL" else "exact"
        return self.detail or shown + (f" ({self.note})" if self.note else "")

    def line(self) -> str:
        return f"{self.status:<7} {self.where:<36} {title(self.stage):<26} {self.differs}   [{self.key}]"


@dataclass
class Coverage:
    """What was done with a bundle's manifest tensors (or every bundle's): each is counted once."""

    total: int = 0  # the tensors the manifests list
    passed: int = 0
    failed: int = 0
    noted: int = 0  # observables that differ from the reference's choice, the port having declared none
    missing: int = 0  # not produced, and not failing: under --allow-missing, or an observable with no variant
    failed_missing: int = 0  # not produced, and failing (counted in `failed` too): a semantic tensor the port lacks
    waived: int = 0  # the port's own `skip` (or its profile's)
    user_skipped: int = 0  # --skip given by the user
    not_compared: dict[str, int] = field(default_factory=dict)  # variant → tensors not compared under it
    not_applicable: int = 0  # tensors of bundles the port does not take (n/a)
    raised: int = 0  # tensors of bundles whose adapter raised
    own_steps: int = 0  # checks of the port's own steps: invariants under a departing variant, steps past DFlash's
    own_failed: int = 0

    @property
    def compared(self) -> int:
        return self.passed + self.failed - self.failed_missing + self.noted

    def add(self, other: Coverage) -> None:
        for name in (
            "total",
            "passed",
            "failed",
            "noted",
            "missing",
            "failed_missing",
            "waived",
            "user_skipped",
            "not_applicable",
            "raised",
            "own_steps",
            "own_failed",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for k, v in other.not_compared.items():
            self.not_compared[k] = self.not_compared.get(k, 0) + v

    def apart(self, allow_missing: bool) -> list[str]:
        """What of the total was not compared and agreed, each part with its reason."""
        parts = [f"{n:,} not compared under {v}" for v, n in self.not_compared.items()]
        parts += [f"{self.waived:,} waived by the port (its skip)"] if self.waived else []
        parts += [f"{self.user_skipped:,} skipped by the user (--skip)"] if self.user_skipped else []
        # not allowed, a missing tensor fails (counted in `failed`), but for an observable whose variant the port did
        # not declare
        why = " (--allow-missing)" if allow_missing else " observables (no variant declared)"
        parts += [f"{self.missing:,} missing{why}"] if self.missing else []
        parts += (
            [f"{self.noted:,} observables unlike the reference's (notes: no variant declared)"] if self.noted else []
        )
        parts += [f"{self.not_applicable:,} in bundles not applicable to the port"] if self.not_applicable else []
        parts += [f"{self.raised:,} in bundles where the port raised"] if self.raised else []
        return parts

    def line(self, allow_missing: bool) -> str:
        """compared …, failed …, and everything else with its reason."""
        own = (
            f"; {self.own_failed:,} of {self.own_steps:,} checks of the port's own steps failed"
            if self.own_steps
            else ""
        )
        apart = self.apart(allow_missing)
        lacking = f" ({self.failed_missing:,} of them missing: not produced)" if self.failed_missing else ""
        return f"compared {self.compared:,} of {self.total:,} tensors, {self.failed:,} failed{lacking}{own}" + (
            "; " + "; ".join(apart) if apart else ""
        )


@dataclass
class Report:
    impl: str
    checks: list[Check] = field(default_factory=list)
    allow_missing: bool = False
    ignored: dict[str, list[str]] = field(default_factory=dict)  # bundle → keys that name no stage of it
    variants: dict[str, dict] = field(default_factory=dict)  # bundle → {variant: (choice, how)}
    cached: dict[str, int] = field(default_factory=dict)  # bundle → prompt positions its port took from a prefix cache
    skip: list[str] = field(default_factory=list)  # stages the port waived (its own `skip`, its profile's)
    user_skip: list[str] = field(default_factory=list)  # stages the user skipped (--skip)
    totals: dict[str, int] = field(default_factory=dict)  # bundle → the tensors its manifest lists

    def failed(self, check: Check) -> bool:
        missing = check.status == "missing" and not self.allow_missing and check.kind != "observable"
        return check.status in ("FAIL", "error", "timeout") or missing

    @property
    def passed(self) -> bool:
        """Nothing failed, and some tensor of a manifest was compared and agreed (waiving every stage proves
        nothing, and neither do checks of the port's own steps alone)."""
        return any(c.status == "pass" and c.manifest for c in self.checks) and not any(
            self.failed(c) for c in self.checks
        )

    @property
    def first_failure(self) -> Check | None:
        """The first failing check along the walk, semantic stages ranked before observables."""
        return self.first_failure_in(self.checks)

    def first_failure_in(self, checks: list[Check]) -> Check | None:
        """The same over some of the checks (e.g. one bundle's)."""
        failing = [c for c in checks if self.failed(c)]
        return next((c for c in failing if c.kind == "semantic"), failing[0] if failing else None)

    def bundles(self) -> list[str]:
        return list(dict.fromkeys([*self.totals, *(c.bundle for c in self.checks)]))

    def coverage(self, bundle: str | None = None) -> Coverage:
        """What was compared, skipped, waived and missing, of one bundle (None: of every bundle)."""
        if bundle is None:
            whole = Coverage()
            for b in self.bundles():
                whole.add(self.coverage(b))
            return whole
        checks = [c for c in self.checks if c.bundle == bundle]
        cov = Coverage(total=self.totals.get(bundle, sum(c.manifest and c.key != "bundle" for c in checks)))
        if any(c.key == "bundle" for c in checks):  # not applicable to the port
            cov.not_applicable = cov.total
            return cov
        if any(c.key == "adapter" for c in checks):  # the adapter raised or timed out: nothing of it compared
            cov.raised = cov.total
            return cov
        for c in checks:
            if not c.manifest:
                if c.status == "skipped":  # a step of a variant's own, not compared (verify._extra_steps)
                    continue
                cov.own_steps += 1
                cov.own_failed += c.status == "FAIL"
                continue
            if c.status == "skipped":
                if c.skipped_by in ("waived", "user"):
                    cov.waived += c.skipped_by == "waived"
                    cov.user_skipped += c.skipped_by == "user"
                else:
                    cov.not_compared[c.skipped_by] = cov.not_compared.get(c.skipped_by, 0) + 1
            elif c.status == "missing" and self.failed(c):  # a semantic tensor the port lacks: a failure
                cov.failed += 1
                cov.failed_missing += 1
            else:
                name = {"pass": "passed", "FAIL": "failed", "note": "noted", "missing": "missing"}[c.status]
                setattr(cov, name, getattr(cov, name) + 1)
        return cov

    def status(self, bundle: str) -> str:
        """The bundle's status, a word of STATUSES."""
        checks = [c for c in self.checks if c.bundle == bundle]
        if any(c.key == "bundle" for c in checks):
            return "n/a"
        adapter = next((c for c in checks if c.key == "adapter"), None)
        if adapter is not None:
            return "timeout" if adapter.status == "timeout" else "crash"
        compared = any(c.status == "pass" and c.manifest for c in checks)
        return "pass" if compared and not any(self.failed(c) for c in checks) else "fail"

    def reason(self, bundle: str) -> str:
        """One line for the bundle's status: what it covers (pass), its first divergence with the hint (fail),
        the port's words (n/a, crash, timeout)."""
        checks = [c for c in self.checks if c.bundle == bundle]
        status = self.status(bundle)
        if status == "n/a":
            return next(c.detail for c in checks if c.key == "bundle")
        if status in ("crash", "timeout"):
            crashed = next(c for c in checks if c.key == "adapter")
            return crashed.detail + (f" (hint: {crashed.hint})" if crashed.hint else "")
        first = self.first_failure_in(checks)
        if first is None:
            cov = self.coverage(bundle)
            apart = cov.apart(self.allow_missing)
            if not cov.compared:
                return "nothing compared: " + "; ".join(apart)
            return f"{cov.passed:,} of {cov.total:,} tensors agree" + (f" ({'; '.join(apart)})" if apart else "")
        said = f"hint: {first.hint}" if first.hint else first.detail
        return f"{first.place}{title(first.stage)}" + (f" ({said})" if said else "")

    def divergences(self, bundle: str) -> list[Check]:
        """The bundle's independent divergences, in walk order: per part of the walk (PARTS) its first failing
        check that no failure upstream of it explains (so a step run after the output is complete does not hide
        a wrong stop, nor a wrong RoPE the draft's head)."""
        crashed = [c for c in self.checks if c.bundle == bundle and c.key == "adapter"]
        if crashed:  # the port crashed or timed out: that is a finding, after what failed before it
            before = [c for c in self.checks if c.bundle == bundle and c.status == "FAIL" and c.key != "adapter"]
            return before[:1] + crashed
        failing = [c for c in self.checks if c.bundle == bundle and self.failed(c) and c.key != "bundle"]

        def part(c: Check) -> str:
            return PARTS.get(c.stage, "draft") if c.manifest else "steps"

        def at(c: Check) -> float:  # the prefill before step 0, a step's verify after its draft, the output last
            if c.stage == "output_ids":
                return float("inf")
            return -1 if c.step is None else c.step + 0.5 * (part(c) in ("target", "loop"))

        decided = {c.step for c in failing if c.stage in PARTING and c.manifest}  # steps whose decision differs
        proposed = {c.step for c in failing if c.stage == "draft_tokens" and c.manifest}  # other blocks verified
        parted = min((at(c) for c in failing if c.stage in PARTING and c.manifest), default=float("inf"))
        found: dict[str, Check] = {}
        for c in failing:
            if part(c) in found or at(c) > parted:
                continue
            if part(c) in ("loop", "output") and c.stage not in PARTING and c.step in decided:
                continue
            if part(c) == "target" and c.step in proposed:  # the target verified other proposals at this step
                continue
            if any(part(o) in UPSTREAM[part(c)] and at(o) <= at(c) for o in failing):
                continue
            found[part(c)] = c
        return [c for c in failing if c in found.values()]

    def by_cause(self) -> list[tuple[Check, list[str]]]:
        """Every bundle's independent divergences, grouped by what they say (stage and hint, or detail): (the
        first such check, the bundles that show it), in the order first seen."""
        groups: dict[tuple[str, str], tuple[Check, list[str]]] = {}
        for b in self.bundles():
            for c in self.divergences(b):
                said = c.hint or c.detail
                groups.setdefault((c.stage, said), (c, []))[1].append(b)
        return list(groups.values())

    def to_dict(self) -> dict:
        """The report as JSON-ready data (`verify --json`): each bundle's status (STATUSES) and reason, its
        independent divergences and coverage, the run's divergences by cause."""

        def said(c: Check) -> dict:
            return {"where": c.where, "stage": c.stage, "key": c.key, "status": c.status, "detail": c.detail,
                    "hint": c.hint}  # fmt: skip

        def counts(cov: Coverage) -> dict:
            return {**{k: v for k, v in vars(cov).items() if k != "not_compared"}, "compared": cov.compared,
                    "not_compared": dict(cov.not_compared)}  # fmt: skip

        return {
            "impl": self.impl,
            "passed": self.passed,
            "statuses": list(STATUSES),
            "allow_missing": self.allow_missing,
            "waived_by_the_port": self.skip,
            "skipped_by_the_user": self.user_skip,
            "bundles": [
                {
                    "bundle": b,
                    "status": self.status(b),
                    "reason": self.reason(b),
                    "variants": {k: list(v) for k, v in self.variants.get(b, {}).items()},
                    "divergences": [said(c) for c in self.divergences(b)],
                    "coverage": counts(self.coverage(b)),
                }
                for b in self.bundles()
            ],
            "by_cause": [{**said(c), "bundles": where} for c, where in self.by_cause()],
            "coverage": counts(self.coverage()),
        }

    def stage_rows(self, bundle: str) -> list[dict]:
        """Per stage of one bundle, in walk order: the checks compared, passed, failing (as `failed` judges
        them: a FAIL, or a missing tensor that is no allowed one), noted, missing and not compared (skipped), the
        worst rel error (None: exact or none), the first failing check (what differs) and the row's state
        (`row_state`). The checks of the port's own steps have rows of their own."""
        rows: dict[str, dict] = {}
        for c in self.checks:
            if c.bundle != bundle or c.key in ("bundle", "adapter"):
                continue
            name = c.stage if c.manifest or c.stage == "extra_step" else f"{c.stage} (own steps)"
            row = rows.setdefault(
                name,
                {"stage": name, "compared": 0, "passed": 0, "failed": 0, "noted": 0, "missing": 0, "skipped": 0,
                 "worst": None, "first": None},
            )  # fmt: skip
            if self.failed(c):
                row["failed"] += 1
                row["first"] = row["first"] or c
            if c.status in ("skipped", "missing"):
                row[c.status] += 1
                continue
            row["compared"] += 1
            row["passed"] += c.status == "pass"
            row["noted"] += c.status == "note"
            if c.tolerance:
                row["worst"] = max(row["worst"] or 0.0, c.rel)
        for row in rows.values():
            row["state"] = row_state(row)
        return list(rows.values())

    def verdict(self) -> str:
        """The last line: PASS with what it covers, or that nothing was compared (FIRST DIVERGENCE: text())."""
        cov = self.coverage()
        bundles = self.bundles()
        if bundles and all(self.status(b) == "n/a" for b in bundles):
            return f"NOT APPLICABLE: the port took none of the {len(bundles)} bundle(s): {self.reason(bundles[0])}"
        if not self.passed:
            return "NOTHING COMPARED: every tensor was skipped, waived, missing or a note."
        own = f" (and {cov.own_steps:,} checks of the port's own steps)" if cov.own_steps else ""
        apart = cov.apart(self.allow_missing)
        if not apart:
            return f"PASS: {cov.passed:,} of {cov.total:,} tensors compared, all agree with DFlash{own}."
        return f"PASS on {cov.passed:,} of {cov.total:,} tensors{own}: " + "; ".join(apart) + "."

    def text(self, verbose: bool = False) -> str:
        bundles = self.bundles()
        cov = self.coverage()
        lines = [f"verify {self.impl} on {len(bundles)} bundle(s), {cov.total:,} tensors"]
        if self.skip:
            lines.append(f"waived by the port (its skip): {', '.join(title(s) for s in self.skip)}")
        if self.user_skip:
            lines.append(f"skipped by the user (--skip): {', '.join(title(s) for s in self.user_skip)}")
        for b in bundles:
            lines.append(f"\n{b}: {self.status(b)}")
            variants = {k: (v, how) for k, (v, how) in self.variants.get(b, {}).items() if how != "reference"}
            if variants:  # the ones the port declared or showed (the others: the reference's)
                lines.append("  variants: " + ", ".join(f"{k} = {v} ({how})" for k, (v, how) in variants.items()))
            if self.cached.get(b):  # a serving engine's prefix-cache hit: what it restored rather than computed
                lines.append(f"  served: prompt positions 0–{self.cached[b] - 1} restored from the prefix cache")
            for c in self.checks:
                if c.bundle == b and c.key == "adapter":
                    lines.append(f"  {'timed out' if c.status == 'timeout' else 'crashed'}: {c.detail}")
                    lines += [f"  hint: {c.hint}"] if c.hint else []
            for row in self.stage_rows(b):
                lines.append("  " + _stage_line(row))
            lines += [f"  not applicable: {c.detail}" for c in self.checks if c.bundle == b and c.key == "bundle"]
            lines.append("  " + self.coverage(b).line(self.allow_missing))
            found = self.divergences(b)
            if len(found) > 1:  # more than the first: each its own finding
                lines.append(f"  {len(found)} independent divergences:")
                lines += [f"    {c.place}{title(c.stage)}: {c.hint or c.detail}" for c in found]
            if self.ignored.get(b):  # most often a misspelt key, whose tensor then shows as missing
                keys = self.ignored[b]
                lines.append(
                    f"  ignored {len(keys)} key(s) that name no tensor of this bundle: {', '.join(keys[:4])}"
                    + (" …" if len(keys) > 4 else "")
                )
        if verbose:
            lines += ["", "every tensor:"] + ["  " + c.line() for c in self.checks]
        first = self.first_failure
        if first is None:
            lines.append("\n" + self.verdict())
        else:
            lines.append("\n" + cov.line(self.allow_missing))
            causes = self.by_cause()
            if len(causes) > 1:  # the run's findings, each once, with the bundles that show it
                lines.append(f"DIVERGENCES BY CAUSE ({len(causes)}):")
                for c, where in causes:
                    shown = ", ".join(where[:6]) + (f" and {len(where) - 6} more" if len(where) > 6 else "")
                    lines.append(f"  {title(c.stage)}: {c.hint or c.detail}  [{shown}]")
            if first.key == "adapter":
                how = "timed out" if first.status == "timeout" else "crashed"
                lines.append(f"FIRST DIVERGENCE: {first.bundle} · the port {how}\n  {first.detail}")
                lines += [f"  hint: {first.hint}"] if first.hint else []
            else:
                lines.append(
                    f"FIRST DIVERGENCE: {first.where} · {title(first.stage)}\n  "
                    + first.line()
                    + (f"\n  hint: {first.hint}" if first.hint else "")
                )
        return "\n".join(lines)

    def __repr__(self) -> str:
        first = self.first_failure
        said = "PASS" if self.passed else "nothing compared"
        return (
            f"Report({self.impl!r}, {len(self.checks)} checks, "
            f"{said if first is None else 'first divergence: ' + first.where + ' · ' + first.stage})"
        )


def row_state(row: dict) -> str:
    """A stage row's state: FAIL where a check of it fails, else note, pass, miss (missing, not failing: allowed,
    or an observable), skip."""
    if row["failed"]:
        return "FAIL"
    return "note" if row["noted"] else "pass" if row["compared"] else "miss" if row["missing"] else "skip"


def _stage_line(row: dict) -> str:
    """One stage of one bundle: its state, passed / compared, the worst error or, failing, what differs."""
    first, state = row["first"], row["state"]
    shown = (
        first.differs
        if first is not None and (first.detail or not first.tolerance)
        else ("exact" if row["worst"] is None else f"worst rel {row['worst']:.1e}")
    )
    extra = [f"{row['missing']} missing"] if row["missing"] else []
    extra += [f"{row['skipped']} not compared"] if row["skipped"] else []
    extra += [f"{row['noted']} differ: {KINDS.get(row['stage'])}, not declared"] if row["noted"] else []
    return f"{state:<5} {title(row['stage']):<32} {row['passed']:>4}/{row['compared']:<4} {shown}" + (
        f"  ({'; '.join(extra)})" if extra else ""
    )
