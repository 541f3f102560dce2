"""How far the diagnosis generalises, measured as a model is on held-out data.

    held out        ports with bugs the catalogue was not built from (another author's, written blind), each with
                    the catalogue entry that is the same bug (`catalogued`), or None where it has none: named
                    right, named with others that give the same tensors, misnamed, missed, or rightly unexplained
    leave one out   each catalogued cause run as a port against the catalogue without it: the only honest answer
                    is "unexplained" (or a cause that gives the very same tensors on that bundle)

`python -m dflash_ref.conformance.causes heldout FILE` and `… leave-one-out` print the tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..bundle import Bundle, find_bundles
from ..golden import generate_golden
from ..judge import compare
from .catalogue import CATALOGUE, Cause
from .diagnose import END, Mutant, diagnose, first_semantic_failure


@dataclass
class Outcome:
    port: str
    bundle: str
    stage: str
    named: list[str]
    expected: str | None  # the catalogue entry that is the port's bug; None: none is
    same_tensors: bool = False  # the causes named give every tensor the port gave: its twins on this bundle

    @property
    def verdict(self) -> str:
        if not self.named:
            return "unexplained, rightly (none catalogued)" if self.expected is None else "missed"
        if self.expected in self.named:
            return "named right" if len(self.named) == 1 else "named right, with others"
        return "misnamed (the same tensors here)" if self.same_tensors else "misnamed"


class AsPort(Mutant):
    """A catalogued cause run as a port would run it: in the bundle's own dtype, not the diagnosis's float64."""

    dtype = None


def bundles_for(scenarios: set[str], folder: str | Path) -> dict[str, Bundle]:
    """The golden bundles of `scenarios` in `folder`, written there first where missing."""
    folder = Path(folder)
    have = {b.name: b for b in find_bundles(folder)} if folder.is_dir() and any(folder.iterdir()) else {}
    if scenarios - set(have):
        generate_golden(folder, sorted(scenarios - set(have) | set(have)))
        have = {b.name: b for b in find_bundles(folder)}
    return have


def _outcome(port, bundle: Bundle, expected: str | None, catalogue: list[Cause]) -> Outcome | None:
    produced = port.run(bundle)
    first = first_semantic_failure(compare(bundle, produced))
    if first is None:
        return None
    finding = diagnose(bundle, produced, first, catalogue=catalogue)
    # a cause named that gives every tensor the port gave is its twin on this bundle: no number here tells them apart
    return Outcome(port.name, bundle.name, first.stage, [c.name for c in finding.named], expected, finding.reach == END)


def held_out(ports: list, folder: str | Path) -> list[Outcome]:
    """Each held-out port on the first of its scenarios where it fails, diagnosed with the whole catalogue."""
    bundles = bundles_for({s for p in ports for s in p.scenarios}, folder)
    outcomes = []
    for cls in ports:
        port = cls()
        for scenario in cls.scenarios:
            outcome = _outcome(port, bundles[scenario], cls.catalogued, CATALOGUE)
            if outcome is not None:
                outcomes.append(outcome)
                break
    return outcomes


def leave_one_out(folder: str | Path) -> list[Outcome]:
    """Each catalogued cause as a port on its scenario, diagnosed with the catalogue less that cause."""
    bundles = bundles_for({c.shows_on for c in CATALOGUE}, folder)
    outcomes = []
    for cause in CATALOGUE:
        outcome = _outcome(AsPort(cause), bundles[cause.shows_on], None, [c for c in CATALOGUE if c is not cause])
        if outcome is not None:
            outcome.port = cause.name
            outcomes.append(outcome)
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    lines = [f"{'port':36} {'bundle':14} {'first divergence':18} verdict: named"]
    for o in outcomes:
        lines.append(f"{o.port:36} {o.bundle:14} {o.stage:18} {o.verdict}: {', '.join(o.named) or '—'}")
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.verdict] = counts.get(o.verdict, 0) + 1
    lines.append("")
    lines.append(f"{len(outcomes)} ports: " + "; ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    return "\n".join(lines)
