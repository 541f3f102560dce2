"""The verdict on a deployment: one line a request, the shared counts, and what the run says as a whole.

Exit code (cli/verify.py): 0 where no request FAILed or ended in an error and at least one was verified (a tie is
not a bug: 0 too, unless --strict), else 1.
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

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def passed(self, strict: bool = False) -> bool:
        counts = self.counts()
        verified = counts.get("pass", 0) + counts.get("tie", 0)
        bad = counts.get("FAIL", 0) + counts.get("error", 0) + (counts.get("tie", 0) if strict else 0)
        return verified > 0 and bad == 0 and not any(s.failed for s in self.shared)

    def ratio(self) -> tuple[float, float, float, int] | None:
        """The server's accepted draft tokens over the reference's own (Σ τ of its run), in all and per request: (all,
        least, most, requests), over the requests with a count of their own."""
        counted = [(r.accepted, sum(r.request.taus)) for r in self.results if r.accepted is not None]
        if not counted:
            return None
        per = [a / h for a, h in counted if h > 0]
        total = sum(a for a, _ in counted) / max(sum(h for _, h in counted), 1)
        return total, min(per, default=total), max(per, default=total), len(counted)

    def text(self) -> str:
        lines = list(self.header)
        width = max([len(r.request.name) for r in self.results] + [7])
        for r in self.results:
            lines.append(f"{r.request.name:<{width}}  {r.status:<5}  output: {r.output}")
            if r.acceptance:
                lines.append(f"{'':<{width}}         acceptance: {r.acceptance}")
            if r.note:
                lines.append(f"{'':<{width}}         ({r.note})")
        for s in self.shared:
            lines.append(f"in flight together ({', '.join(s.names)}): {s.verdict}{' FAIL' * s.failed}")
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
                        }
                        for d in r.divergences
                    ],  # fmt: skip
                    "note": r.note,
                }
                for r in self.results
            ],
            "shared": [s.__dict__ for s in self.shared],
            "counts": self.counts(),
        }

    def json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"
