"""The verdict on a deployment: one line a request, the shared counts, and what the run says as a whole.

Exit code (cli/verify.py, `verdict`): 0 where no request FAILed or ended in an error, at least one was verified, the
run's departures from the float64 argmax are as many as its dtype's rounding makes (control.py; a tie, or a
departure within the dtype's drift, is not a bug: 0 too, unless --strict) and speculation was seen to run for every
request (or the operator accepted outputs only); 3 where all that holds but some request's outputs were right and
its speculation not seen (UNOBSERVED); else 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .check import Result, Shared


@dataclass
class EndpointReport:
    header: list[str]
    results: list[Result]
    shared: list[Shared] = field(default_factory=list)
    reported: bool = True  # whether the server reported any acceptance (per request or counters)
    kind: str = "endpoint"  # what was checked: "endpoint" (verify --endpoint) or "outputs" (verify --outputs)
    held: tuple[bool, str, dict] | None = None  # the departures held to the control's: (failed, said, figures)
    probes: list = field(default_factory=list)  # the API's fields on the speculative route (semantics.Probe)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def verdict(self, strict: bool = False) -> str:
        """ "pass", "fail" or "unobserved" (the module docstring's exit codes)."""
        counts = self.counts()
        verified = counts.get("pass", 0) + counts.get("tie", 0)
        bad = counts.get("FAIL", 0) + counts.get("error", 0) + (counts.get("tie", 0) if strict else 0)
        departs = self.held is not None and self.held[0]
        if bad or departs or any(s.failed for s in self.shared) or any(p.status == "FAIL" for p in self.probes):
            return "fail"
        if counts.get("unobserved", 0):
            return "unobserved"
        return "pass" if verified else "fail"

    def passed(self, strict: bool = False) -> bool:
        return self.verdict(strict) == "pass"

    def ratio(self) -> tuple[float, float, float, int] | None:
        """The server's accepted draft tokens over the reference's own (Σ τ of its run), in all and per request: (all,
        least, most, requests), over the requests with a count of their own."""
        counted = [(r.accepted, sum(r.request.taus)) for r in self.results if r.accepted is not None]
        if not counted:
            return None
        per = [a / h for a, h in counted if h > 0]
        total = sum(a for a, _ in counted) / max(sum(h for _, h in counted), 1)
        return total, min(per, default=total), max(per, default=total), len(counted)

    def conditions(self) -> list[str]:
        """Each serving condition the requests were sent under: on how many the server's own figures confirm it."""
        said = []
        for condition in dict.fromkeys(r.request.condition for r in self.results if r.condition):
            judged = [r for r in self.results if r.request.condition == condition and r.condition]
            seen = sum(r.exercised is True for r in judged)
            not_seen = sum(r.exercised is False for r in judged)
            unknown = len(judged) - seen - not_seen
            parts = [f"{what} on {n}" for what, n in (("confirmed", seen), ("not exercised", not_seen),
                                                      ("not confirmed (no figure of it)", unknown)) if n]  # fmt: skip
            said.append(f"{condition}: {', '.join(parts)} of {len(judged)} request{'s' * (len(judged) > 1)}")
        return said

    def text(self) -> str:
        lines = list(self.header)
        width = max([len(r.request.name) for r in self.results] + [7])
        for r in self.results:
            lines.append(f"{r.request.name:<{width}}  {r.status:<5}  output: {r.output}")
            if r.speculation:
                lines.append(f"{'':<{width}}         speculation: {r.speculation}")
            if r.condition:
                lines.append(f"{'':<{width}}         {r.request.condition}: {r.condition}")
            if r.acceptance:
                lines.append(f"{'':<{width}}         acceptance: {r.acceptance}")
            if r.note:
                lines.append(f"{'':<{width}}         ({r.note})")
        for s in self.shared:
            lines.append(f"in flight together ({', '.join(s.names)}): {s.verdict}{' FAIL' * s.failed}")
        if self.held is not None:
            lines.append(f"{'FAIL ' * self.held[0]}against the control: {self.held[1]}")
        if self.probes:
            lines.append("the API's fields on the speculative route:")
            lines += [f"   {p.request} · {p.field}: {p.status}, {p.said}" for p in self.probes]
        counts = self.counts()
        said = ", ".join(f"{n} {status}" for status, n in counts.items())
        lines.append(f"\n{len(self.results)} requests: {said}")
        ratio = self.ratio()
        if ratio:
            total, low, high, n = ratio
            lines.append(
                f"acceptance: the server accepted {total:.3f} of the reference's draft tokens "
                f"({low:.3f}–{high:.3f} over {n} request{'s' * (n > 1)})"
            )
        elif not self.reported:
            lines.append("acceptance not reported: outputs only")
        lines += self.conditions()
        unseen = counts.get("unobserved", 0)
        if unseen:
            lines.append(
                f"UNOBSERVED: {unseen} request{'s' * (unseen > 1)} gave the reference's output, but nothing the server "
                "showed says it decoded them speculatively (a plain engine gives the same output): exit 3; "
                "--outputs-only takes outputs alone"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "header": self.header,
            "requests": [
                {
                    "name": r.request.name,
                    "condition": r.request.condition,
                    "status": r.status,
                    "output": r.output,
                    "acceptance": r.acceptance,
                    "speculation": r.speculation,
                    "observed": r.observed,
                    "condition_seen": r.condition,
                    "exercised": r.exercised,
                    "accepted": r.accepted,
                    "reference_accepted": list(r.bounds),
                    "divergences": [
                        {
                            "index": d.index,
                            "token": d.token,
                            "top": d.top,
                            "margin": d.margin,
                            "resolution": d.resolution,
                            "scale": d.scale,
                            "tie": d.tie,
                            "drift": d.drift,
                            "within_drift": d.drifted,
                        }
                        for d in r.divergences
                    ],  # fmt: skip
                    "note": r.note,
                }
                for r in self.results
            ],
            "shared": [s.__dict__ for s in self.shared],
            "probes": [p.__dict__ for p in self.probes],
            "control": None if self.held is None else {"failed": self.held[0], "said": self.held[1], **self.held[2]},
            "counts": self.counts(),
            "verdict": self.verdict(),
        }

    def json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"
