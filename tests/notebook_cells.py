"""Breaking the library for a walkthrough notebook's checks: `mutate` rewrites one line of a library function in
place, so that tests/test_walkthrough.py can hold each notebook to stopping at that stage's cell (the cells run
in-process by dflash_ref/tour/cells.py)."""

from __future__ import annotations

import inspect
import linecache
import textwrap

from dflash_ref.tour.cells import CellFailed, cell_with, code_cells, run_cells

__all__ = ["CellFailed", "cell_with", "code_cells", "mutate", "run_cells"]


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
