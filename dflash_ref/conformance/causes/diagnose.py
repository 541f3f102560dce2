"""The diagnosis: a failing port's first divergence explained by testing hypotheses, not by recognising text.

For a bundle whose port fails, the reference is run again on the bundle's own inputs (float64) under each
catalogued mis-implementation that could first show where the port first fails (catalogue.py): one at that stage,
or at an earlier stage the port gave no tensor of. Each such run is a bundle of its own, and the judge holds the
port's tensors against it exactly as against the golden one (judge.compare: the same tolerances, variants and
waivers). A cause is named where its run gives the port's tensors through the whole step of its first divergence
(and the furthest of those: every tensor, where one does), all of them where several do (twins on this bundle; a
bundle the port passes and a named cause would fail refutes it: `refute`). Where none does, the
divergence is unexplained, and said so ("unexplained: none of the N catalogued causes … reproduces the port's
tensors"), with the nearest cause beside it where one agrees with the port past its first divergence: how far, and
where it parts (a port with two bugs is reproduced by neither alone).

    first divergence at (stage s, step t)  →  candidates C = {c : c.stage = s, or c.stage before s and not given}
    reach(c)  =  where judge(port, reference with c) first fails (the end: never)
    named     =  argmax reach(c), where it passes the end of step t   the port's tensors reproduced through its step
    nearest   =  the same where it does not: said as the nearest, and where it parts
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..bundle import Bundle, candidates_in_id_order
from ..judge import compare
from ..ports.reference import ReferenceAdapter
from ..report import Check, NotApplicable, title
from ..stages import STAGE, STAGE_INDEX, parse_key, stage_of, walk_order
from ..tensorfile import array_or_none
from .catalogue import CATALOGUE, Cause, Change

END = (9,)  # the position of "no failure": past every key
BUDGET = 60.0  # seconds a bundle's diagnosis may take: on a real model's bundle each cause's run costs seconds


class Mutant(ReferenceAdapter):
    """The reference with one catalogued cause, in float64: a port whose only bug is that cause."""

    dtype = torch.float64

    def __init__(self, cause: Cause) -> None:
        self.cause, self.name, self.change = cause, f"reference with {cause.name}", None

    def load(self, bundle: Bundle):
        target, draft = super().load(bundle)
        try:
            applies = self.cause.applies(draft, target)
        except (AttributeError, TypeError, IndexError):  # a model without the part the cause changes
            applies = False
        if not applies:
            raise NotApplicable(f"{self.cause.name} does not apply to {bundle.name}'s models")
        self.change = Change(draft, target)
        self.cause.change(self.change)
        return target, draft

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        try:
            return super().run(bundle)
        finally:
            if self.change is not None:
                self.change.stack.close()
                self.change = None


_RUNS: dict[tuple, dict | None] = {}  # (bundle folder, manifest name, cause) → its run; None: it does not apply


def mutant_run(bundle: Bundle, cause: Cause, runs: dict | None = None) -> dict[str, np.ndarray] | None:
    """The reference's tensors with `cause` on `bundle` (None where the cause does not apply, or its run fails),
    computed once per `runs` (a verify's own; by default, once per process)."""
    runs = _RUNS if runs is None else runs
    key = (str(bundle.path.resolve()), bundle.name, cause.name)
    if key not in runs:
        try:
            runs[key] = candidates_in_id_order(Mutant(cause).run(bundle))
        except NotApplicable:
            runs[key] = None
        except Exception:  # noqa: BLE001 - a cause whose change breaks this bundle's run reproduces nothing here
            runs[key] = None
    return runs[key]


def as_bundle(bundle: Bundle, produced: dict[str, np.ndarray]) -> Bundle:
    """A run of the reference (a mutant's) as a bundle: the golden's entries (their tolerances) for the keys they
    share; a key only the run has (a step the golden never took) takes its stage's largest tolerance."""
    by_key = {e["key"]: e for e in bundle.entries}
    like: dict[str, dict] = {}
    for e in bundle.entries:
        if e["stage"] not in like or e["tolerance"] > like[e["stage"]]["tolerance"]:
            like[e["stage"]] = e
    entries, expected = [], {}
    for key in sorted((k for k in produced if stage_of(k) is not None), key=walk_order):
        stage, step, layer = parse_key(key)
        array = np.asarray(produced[key])
        entry = by_key.get(key)
        if entry is None:
            if stage not in like:
                continue
            entry = {**like[stage], "key": key, "step": step, "layer": layer, "shape": list(array.shape)}
        entries.append(entry)
        expected[key] = array.astype(np.int64 if np.issubdtype(array.dtype, np.integer) else np.float32)
    return Bundle(bundle.path, {**bundle.manifest, "tensors": entries}, _expected=expected)


def position(check: Check) -> tuple:
    """Where a check lies along the data's walk."""
    try:
        return walk_order(check.key)
    except (KeyError, ValueError):
        return (1, check.step if check.step is not None else 0, 3)


def first_semantic_failure(checks: list[Check]) -> Check | None:
    return next((c for c in checks if c.status == "FAIL" and c.kind == "semantic"), None)


@dataclass
class Finding:
    """What the catalogue says of one divergence (`first`, a check whose hint it writes): the causes tried, those
    that reproduce it, and those another bundle refutes."""

    first: Check
    tried: list[str]
    named: list[Cause]  # the causes whose runs give the port's tensors through the step of `first` (horizon)
    reach: tuple = END  # where the named (or nearest) causes' runs part from the port (END: they never do)
    parts_at: str = ""  # that place, in words
    nearest: list[Cause] = field(default_factory=list)  # none named: those that agree with the port furthest
    untried: list[str] = field(default_factory=list)  # the candidates left when the time budget ran out
    read: str = ""  # what a reader saw in the tensors (hints.py), "" where none spoke
    refuted: dict[str, str] = field(default_factory=dict)  # cause → the bundle the port passes and it would fail

    def sentence(self) -> str:
        stage = self.first.stage
        if not self.tried:
            return f"unexplained: no catalogued cause can first show at {title(stage)}"
        if not self.named:
            said = (
                f"unexplained: none of the {len(self.tried)} catalogued causes that can first show here "
                "reproduces the port's tensors"
            )
            if self.nearest:
                names = " and ".join(f"{c.name} ({c.says})" for c in self.nearest)
                said += (
                    f"; the nearest, {names}, gives them up to {self.parts_at} and parts from the port there (a "
                    "second bug there, or another cause)"
                )
            if self.untried:
                said += f" ({len(self.untried)} more not tried in the diagnosis's {BUDGET:g} s)"
            if self.refuted:
                said += " on every bundle: " + "; ".join(
                    f"{cause} gives them here, but the port passes {where}, which {cause} fails"
                    for cause, where in self.refuted.items()
                )
            return said
        said = "; ".join(f"{c.name} ({c.says})" for c in self.named)
        which = "the reference with" if len(self.named) == 1 else f"each of {len(self.named)} causes alike:"
        refuted = "".join(f"; not {c}: the port passes {where}, which {c} fails" for c, where in self.refuted.items())
        upto = (
            "every tensor the port gave"
            if self.reach == END
            else f"the port's tensors up to {self.parts_at}, past the step where it first parts from DFlash"
        )
        return f"reproduced by {which} {said}: it gives {upto}{refuted}"

    def write_hint(self) -> None:
        """The first divergence's hint: the finding, with what a reader saw in the tensors beside it (where no
        cause reproduces them whole, the reader's pattern first: it is read off the port's own numbers)."""
        if self.named:
            self.first.hint = self.sentence() + (f"; read from the tensors: {self.read}" if self.read else "")
        elif self.read:
            self.first.hint = (
                f"{self.read} (a pattern read in the tensors; {self.sentence().removeprefix('unexplained: ')})"
            )
        else:
            computes = _usual(self.first.stage) or self.first.stage
            self.first.hint = f"{self.sentence()} (this stage computes: {computes})"


def _usual(stage: str) -> str:
    """The stage's usual causes (the hint where no reader spoke), "" for a check of no stage."""
    return STAGE[stage].causes if stage in STAGE else ""


def candidates(stage: str, produced: dict, waived, catalogue: list[Cause]) -> list[Cause]:
    """The causes that could first show at `stage` for this port: those of that stage, and those of an earlier
    stage of which the port gave no tensor (or waived it)."""
    stage = stage if stage in STAGE_INDEX else "output_ids"  # a check of the loop's own (a step past the output)
    given = {stage_of(k) for k in produced} - set(waived)
    here = STAGE_INDEX[stage]
    return [c for c in catalogue if any(s == stage or (STAGE_INDEX[s] < here and s not in given) for s in c.stages)]


def diagnose(
    bundle: Bundle,
    produced: dict,
    first: Check,
    declared: dict | None = None,
    waivers=(),
    catalogue: list[Cause] | None = None,
    runs: dict | None = None,
    budget: float = BUDGET,
) -> Finding:
    """Which catalogued causes reproduce every tensor the port gave, from its first divergence `first` on (and
    where none does, the ones that agree with it furthest past `first`: the nearest)."""
    catalogue = CATALOGUE if catalogue is None else catalogue
    tried, fits, began = [], [], time.monotonic()
    pending = candidates(first.stage, produced, waivers, catalogue)
    for i, cause in enumerate(pending):
        if time.monotonic() - began > budget:  # an engine-shaped bundle (a real model) costs seconds a run
            untried = [c.name for c in pending[i:]]
            break
        run = mutant_run(bundle, cause, runs)
        if run is None:
            continue
        tried.append(cause.name)
        try:
            checks = compare(as_bundle(bundle, run), produced, None, declared, waivers)
        except (IndexError, KeyError, ValueError):  # a run the judge cannot read as a bundle (its output cut short
            continue  # where its steps say more was committed): it reproduces nothing
        parted = first_semantic_failure(checks)
        reach = position(parted) if parted is not None else END
        if reach > position(first):
            fits.append((reach, cause, parted))
    else:
        untried = []
    if not fits:
        return Finding(first, tried, [], untried=untried)
    best = max(reach for reach, _, _ in fits)
    chosen = [(cause, parted) for reach, cause, parted in fits if reach == best]
    parted = chosen[0][1]
    where = f"{parted.place}{title(parted.stage)}" if parted is not None else ""
    causes = [c for c, _ in chosen]
    if best >= horizon(first):
        return Finding(first, tried, causes, best, where, untried=untried)
    # none reproduces the step: the nearest, said as such
    return Finding(first, tried, [], best, where, nearest=causes, untried=untried)


def horizon(first: Check) -> tuple:
    """How far a cause's run must agree with the port to be named: to the end of the step of its first divergence
    (step 0 for the prefill's), or to the end where that is the output. A later parting is a decision taken the
    other way at a near tie (the cause's run is a model with no margins checked: its float64 and the port's
    float32 may round a tie apart) or a second bug; within the step it is another cause."""
    if first.stage == "output_ids":
        return END
    return (1, first.step or 0, 99)


def explain(
    bundle: Bundle, produced: dict, checks: list[Check], declared=None, waivers=(), runs: dict | None = None
) -> Finding | None:
    """The bundle's first divergence (a semantic failure among `checks`, the judge's) given the catalogue's
    finding, in its hint: the causes that reproduce it, else "unexplained", with what a reader saw in the
    tensors kept beside either. None where nothing failed."""
    first = first_semantic_failure(checks)
    if first is None or (first.key in produced and array_or_none(produced[first.key]) is None):
        return None  # nothing failed, or the port gave no numbers there to hold against a cause
    finding = diagnose(bundle, produced, first, declared, waivers, runs=runs)
    finding.read = first.hint if first.hint and first.hint != _usual(first.stage) else ""
    finding.write_hint()
    return finding


def refute(findings: list[Finding], passed: list[Bundle], declared=None, waivers=(), runs: dict | None = None) -> None:
    """Causes named on one bundle that another bundle refutes: the port passes it, and the cause's run does not.
    A cause that fits one bundle's numbers may be a twin of the port's bug there alone (a stop token ignored
    everywhere and one ignored only as the bonus give the same tensors where the only stop is a bonus); the
    bundles the port passes tell them apart. The hints are written again."""
    began = time.monotonic()
    for finding in findings:
        for cause in list(finding.named):
            for bundle in passed:
                if time.monotonic() - began > BUDGET:  # what is not refuted by then stays named
                    break
                run = mutant_run(bundle, cause, runs)
                if run is not None and first_semantic_failure(compare(bundle, run, None, declared, waivers)):
                    finding.refuted[cause.name] = bundle.name
                    finding.named.remove(cause)
                    break
        if finding.refuted:
            finding.write_hint()


@dataclass
class Session:
    """One verify's diagnosis: its findings, and the causes' runs it made (its own: a run made while something
    outside patched the package, as a test does around verify, must not serve another verify)."""

    findings: list[Finding] = field(default_factory=list)
    runs: dict = field(default_factory=dict)

    def explain(self, bundle: Bundle, produced: dict, checks: list[Check], declared=None, waivers=()) -> None:
        found = explain(bundle, produced, checks, declared, waivers, self.runs)
        self.findings += [found] if found is not None else []

    def refute(self, passed: list[Bundle], declared=None, waivers=()) -> None:
        if any(f.named for f in self.findings):
            refute(self.findings, passed, declared, waivers, self.runs)
