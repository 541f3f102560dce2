"""The library's own code, shown in a notebook beside the cell that recomputes it: read from its file when
the cell runs (never a copy), with the file and line numbers, so a learner can open the module at that line."""

from __future__ import annotations

import inspect
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def show_source(obj, start: str | None = None, stop: str | None = None) -> None:
    """Print the source of a function, method or class: all of it, or from its first line that contains
    `start` through the first line from there that contains `stop` (the last line if none does)."""
    obj = inspect.unwrap(obj)  # a decorated function's own source (spec_generate is under inference_mode)
    lines, first = inspect.getsourcelines(obj)
    begin = next((i for i, line in enumerate(lines) if start in line), None) if start else 0
    if begin is None:
        raise ValueError(f"{obj.__qualname__} has no line containing {start!r}")
    end = (
        next((i for i in range(begin, len(lines)) if stop and stop in lines[i]), len(lines) - 1)
        if stop
        else len(lines) - 1
    )
    path = Path(inspect.getsourcefile(obj)).resolve()
    shown = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
    print(f"# {shown}, lines {first + begin}–{first + end}")
    print("".join(lines[begin : end + 1]).rstrip())
