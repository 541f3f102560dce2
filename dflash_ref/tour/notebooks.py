"""Regenerate and execute the walkthrough notebooks: `walkthroughs/*.py` (jupytext py:percent) are
the truth; `walkthroughs/*.ipynb` are generated from them, executed, outputs included.

Needs the `notebooks` extra (jupytext, nbclient, ipykernel), and walkthrough 03 the official dflash
0.1.0 (`pip install --no-deps dflash==0.1.0`), whose conformance it runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

WALKTHROUGHS = Path(__file__).resolve().parents[2] / "walkthroughs"  # the repository's, beside dflash_ref/


def execute(source: Path, timeout: int = 600):
    """Read a py:percent source and run it top to bottom in a fresh kernel; returns the notebook."""
    import jupytext
    from nbclient import NotebookClient

    notebook = jupytext.read(source)
    NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(source.parent)}},
    ).execute()
    return notebook


TQDM_WARNING = "TqdmWarning: IProgress not found"  # the kernel has no ipywidgets; names a local path


def _without_progress_noise(output):
    """A stderr chunk less its progress-bar noise: None for a progress bar's chunk (it starts with a
    carriage return, or is the bare newline that ends it), tqdm's ipywidgets warning cut out line by
    line (with the source line Python prints under it), so that a warning sent in the same chunk stays."""
    if output.output_type != "stream" or output.name != "stderr":
        return output
    if output.text.startswith("\r") or not output.text.strip():
        return None
    lines, kept = output.text.splitlines(keepends=True), []
    for i, line in enumerate(lines):
        if TQDM_WARNING in line or (i and TQDM_WARNING in lines[i - 1] and line.startswith("  ")):
            continue
        kept.append(line)
    output.text = "".join(kept)
    return output if output.text.strip() else None


def tidy(notebook):
    """What is committed: cell ids by position (a rebuild changes no id), and no progress-bar noise."""
    for i, cell in enumerate(notebook.cells):
        cell.id = f"cell-{i}"
        if cell.cell_type == "code":
            cell.outputs = [o for o in map(_without_progress_noise, cell.outputs) if o is not None]
    return notebook


def build(folder: Path = WALKTHROUGHS) -> list[Path]:
    """Write every executed notebook next to its source."""
    if importlib.util.find_spec("dflash") is None:
        raise SystemExit(
            "walkthrough 03 runs the official dflash 0.1.0 (its part 5); install it first: "
            "pip install --no-deps dflash==0.1.0"
        )
    import jupytext

    sources = sorted(Path(folder).glob("[0-9]*.py"))
    if not sources:  # e.g. an installed package without the repository's walkthroughs/ beside it
        raise SystemExit(f"no walkthrough sources (NN_name.py) in {folder}")
    written = []
    for source in sources:
        notebook = tidy(execute(source))
        target = source.with_suffix(".ipynb")
        jupytext.write(notebook, target, fmt="ipynb")
        written.append(target)
    return written
