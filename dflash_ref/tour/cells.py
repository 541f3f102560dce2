"""A walkthrough notebook's cells run in this process, in order, in one namespace, as a kernel would run them:
for the knob sweep of rounding.py and for the tests (a library with one stage broken must stop its notebook at
that stage's cell; an exercise must refuse a wrong answer), where a kernel per run would cost minutes. The main
job runs the notebooks in real kernels (notebooks.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import torch

from .notebooks import WALKTHROUGHS


@dataclass
class CellFailed(Exception):
    index: int  # among the notebook's cells
    source: str
    error: BaseException

    def __str__(self) -> str:
        return f"cell {self.index} failed ({type(self.error).__name__}: {self.error}):\n{self.source}"


@contextlib.contextmanager
def working_folder(folder: Path) -> Iterator[None]:
    """cd into `folder` for the block (contextlib.chdir is Python 3.11's; the project takes 3.10)."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def torch_state_kept() -> Iterator[None]:
    """A notebook turns gradients off and sets torch's print options for its own process: here they are put
    back after it, or what runs next in this process would inherit them."""
    try:
        with torch.set_grad_enabled(torch.is_grad_enabled()):
            yield
    finally:
        torch.set_printoptions(profile="default")


def code_cells(name: str, folder: Path = WALKTHROUGHS) -> list[tuple[int, object]]:
    """(index among all its cells, cell) of notebook `name`'s code cells."""
    import jupytext

    notebook = jupytext.read(folder / f"{name}.py")
    return [(i, cell) for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]


def run_cells(
    name: str,
    parameters: dict | None = None,
    until: str | None = None,
    answers: dict[str, str] | None = None,
    edits: dict[str, str] | None = None,
) -> dict:
    """Run notebook `name`'s code cells in order in one namespace, in walkthroughs/ (as a kernel would),
    with `parameters` set after the parameters cell, stopping before the first cell whose source contains
    `until`. `answers`: text that replaces `your_answer = None` in the cell that contains the key. `edits`:
    {old: new} text replaced in every cell (a learner's code in an exercise's function, say).
    → the namespace; a failing cell raises CellFailed."""
    matplotlib.use("Agg")  # figures drawn, none shown
    namespace: dict = {}
    with working_folder(WALKTHROUGHS), torch_state_kept():
        for index, cell in code_cells(name):
            source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))  # magics
            if until is not None and until in source:
                break
            for marker, answer in (answers or {}).items():
                if marker in source:
                    source = source.replace("your_answer = None", f"your_answer = {answer}")
            for old, new in (edits or {}).items():
                source = source.replace(old, new)
            try:
                exec(compile(source, f"<{name} cell {index}>", "exec"), namespace)
            except Exception as e:  # noqa: BLE001 - any failure is the cell's
                raise CellFailed(index, source, e) from e
            if "parameters" in cell.metadata.get("tags", []):
                namespace.update(parameters or {})
    return namespace


def cell_with(name: str, marker: str) -> int:
    """The index of notebook `name`'s one code cell whose source contains `marker`."""
    found = [i for i, cell in code_cells(name) if marker in cell.source]
    if len(found) != 1:
        raise ValueError(f"{len(found)} cells of {name} contain {marker!r}")
    return found[0]
