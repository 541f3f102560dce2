"""Running a walkthrough notebook's cells in this process, to see which cell fails: a library with one stage
broken (`mutate`) must stop its notebook at that stage's cell, and an exercise's check must refuse a wrong
prediction. The notebooks themselves run in real kernels in tests/test_walkthrough.py (the walkthrough
command); here they run in-process because a kernel per mutant would cost minutes."""

from __future__ import annotations

import contextlib
import inspect
import linecache
import os
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WALKTHROUGHS = ROOT / "walkthroughs"


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
def printing_as_before() -> Iterator[None]:
    import torch

    try:
        yield
    finally:
        torch.set_printoptions(profile="default")


def code_cells(name: str) -> list[tuple[int, object]]:
    import jupytext

    notebook = jupytext.read(WALKTHROUGHS / f"{name}.py")
    return [(i, cell) for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]


def run_cells(
    name: str, parameters: dict | None = None, until: str | None = None, answers: dict[str, str] | None = None
) -> dict:
    """Run notebook `name`'s code cells in order in one namespace, in walkthroughs/ (as a kernel would),
    with `parameters` set after the parameters cell, stopping before the first cell whose source contains
    `until`. `answers`: text that replaces `your_answer = None` in the cell that contains the key.
    → the namespace; a failing cell raises CellFailed."""
    import matplotlib
    import torch

    matplotlib.use("Agg")
    namespace: dict = {}
    # a notebook turns gradients off and sets torch's print options for its own process: here they are put
    # back after it, or the tests that run next in this process would inherit them
    with working_folder(WALKTHROUGHS), torch.set_grad_enabled(torch.is_grad_enabled()), printing_as_before():
        for index, cell in code_cells(name):
            source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("%"))  # magics
            if until is not None and until in source:
                break
            for marker, answer in (answers or {}).items():
                if marker in source:
                    source = source.replace("your_answer = None", f"your_answer = {answer}")
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
    assert len(found) == 1, f"{len(found)} cells of {name} contain {marker!r}"
    return found[0]


def mutate(monkeypatch, owner, name: str, old: str, new: str, *also, occurrences: int = 1) -> None:
    """Replace `old` (found `occurrences` times) by `new` in the source of `owner.name` (a module's function or a
    class's method, its source dedented), compile
    it in its module's namespace and put it in place (and as the same name in each of `also`, the modules that
    imported it by name). Its source stays readable (linecache), as a notebook shows it."""
    function = inspect.unwrap(getattr(owner, name))
    source = textwrap.dedent(inspect.getsource(function))
    assert source.count(old) == occurrences, f"{old!r} occurs {source.count(old)} times in {function.__qualname__}"
    source = source.replace(old, new)
    filename = f"<mutant of {function.__module__}.{function.__qualname__}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    module = inspect.getmodule(function)
    scope = dict(vars(module))
    exec(compile(source, filename, "exec"), scope)
    mutant = scope[function.__name__]
    for where in (owner, *also):
        monkeypatch.setattr(where, name, mutant)
