"""Regenerate and execute the walkthrough notebooks: `walkthroughs/*.py` (jupytext py:percent) are
the truth; `walkthroughs/*.ipynb` are generated from them, executed, outputs included.

Needs the `notebooks` extra (jupytext, nbclient, ipykernel).
"""
from __future__ import annotations

from pathlib import Path

WALKTHROUGHS = Path(__file__).resolve().parent.parent / "walkthroughs"


def execute(source: Path, timeout: int = 600):
    """Read a py:percent source and run it top to bottom in a fresh kernel; returns the notebook."""
    import jupytext
    from nbclient import NotebookClient

    notebook = jupytext.read(source)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(source.parent)}}).execute()
    return notebook


def build(folder: Path = WALKTHROUGHS) -> list[Path]:
    """Write every executed notebook next to its source."""
    import jupytext

    written = []
    for source in sorted(folder.glob("[0-9]*.py")):
        notebook = execute(source)
        target = source.with_suffix(".ipynb")
        jupytext.write(notebook, target, fmt="ipynb")
        written.append(target)
    return written
