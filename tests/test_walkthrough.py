"""The walkthrough, the main job: its notebooks run headless in real kernels (once per test session, by the
command a user runs), and what is committed is what they produce; the runner's tidying and refusals. Their
checks, knobs and exercises: tests/test_walkthrough_cells.py.

The one walkthrough run's subprocess limit only catches a hang: on a busy 2-core machine the run takes several
times its idle minutes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from notebook_cells import code_cells

from dflash_ref.tour import notebooks as walkthrough

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "figures"
SOURCES = sorted((ROOT / "walkthroughs").glob("[0-9]*.py"))
HANG = 3600  # seconds: a hang, not a slow machine


@pytest.fixture(scope="module")
def walkthrough_run(tmp_path_factory):
    """`python -m dflash_ref walkthrough`, figures and executed notebooks written to a temporary folder."""
    out = tmp_path_factory.mktemp("walkthrough")
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "walkthrough", "--out", str(out / "figures"), "--notebooks", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=HANG,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, proc.stderr


# -- the run, as a user sees it -------------------------------------------------------------------------------


def test_the_walkthrough_tells_each_notebook_as_it_runs(walkthrough_run):
    _, text, _ = walkthrough_run
    banners = [text.index(f"== {n.title}  [{n.takes} on a 2-core CPU]") for n in walkthrough.NOTEBOOKS]
    ends = [text.index(f"-- {n.name}: ") for n in walkthrough.NOTEBOOKS]
    assert banners == sorted(banners) and all(b < e for b, e in zip(banners, ends))  # said before it runs
    for expected in [
        "## 1. Layer sampling, and the +1 offset",  # a heading, as the run reaches it
        "library: build_target_layer_ids(6, 2) = [1, 3]",  # a cell's output
        "Qwen3-8B, 36 layers, a 5-layer draft: [1, 9, 17, 25, 33]",
        "→ τ = 2; bonus = posterior_2",
        "FIRST DIVERGENCE: walkthrough · step 0 · layer 0 · Q after RoPE",
        "Predict first: set the variable above",
    ]:
        assert expected in text, expected


def test_progress_bars_draw_on_stderr_token_by_token_and_end_at_their_totals(walkthrough_run):
    _, text, err = walkthrough_run
    assert "tok/s" not in text  # stdout is the story alone
    bars = (
        ("trained draft", 32),
        ("random draft", 32),
        ("traced decode", 64),
        ("held-out prompts", 384),
        ("training", 300),
    )
    for bar, total in bars:
        counts = [int(n) for n in re.findall(rf"{bar}:.*?\| *(\d+)/{total} ", err)]
        assert counts and counts[-1] == total, bar  # it ends at its total
        assert len(set(counts)) > 3, bar  # and moved on the way: per step, not once per decode


def test_every_notebook_ran_without_error_and_shows_its_figures(walkthrough_run):
    out, _, _ = walkthrough_run
    for source in SOURCES:
        executed = json.loads((out / f"{source.stem}.ipynb").read_text())
        outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert not [o for o in outputs if o.get("output_type") == "error"], source.stem
        assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2, source.stem


def test_the_walkthrough_writes_the_committed_figures(walkthrough_run):
    from matplotlib.testing.compare import compare_images

    out, _, _ = walkthrough_run
    written = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert written == sorted(p.name for p in FIGURES.glob("0*.png")) and written
    for name in written:
        if (out / "figures" / name).read_bytes() != (FIGURES / name).read_bytes():
            # the same pixels up to font-rasteriser noise across matplotlib/freetype builds
            assert compare_images(str(FIGURES / name), str(out / "figures" / name), tol=2) is None, name


def test_the_viewers_are_written_and_a_committed_screenshot_shows_each(walkthrough_run):
    out, _, _ = walkthrough_run
    assert sorted(p.name for p in (out / "figures").glob("*.html")) == [
        "02_decode_loop.html",
        "04_dflash2_smollm2.html",
    ]
    shown = {m for s in SOURCES for m in re.findall(r'Image\("\.\./(figures/[\w.]+\.png)"', s.read_text())}
    assert len(shown) == 2 and all((ROOT / f).is_file() for f in shown)  # no link a clone lacks


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_the_committed_notebook_is_its_source_executed(source):
    jupytext = pytest.importorskip("jupytext")
    committed = json.loads(source.with_suffix(".ipynb").read_text())
    assert ["".join(c["source"]) for c in committed["cells"]] == [c.source for c in jupytext.read(source).cells], (
        "regenerate with: python -m dflash_ref walkthrough"
    )
    outputs = [o for c in committed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert outputs and not [o for o in outputs if o.get("output_type") == "error"]


def test_each_notebook_opens_with_its_knobs_and_says_what_it_needs():
    for source in SOURCES:
        _, cell = code_cells(source.stem)[0]
        assert "parameters" in cell.metadata.get("tags", []), source.stem
        knobs = {k.strip() for line in re.findall(r"^([\w, ]+?) = ", cell.source, re.M) for k in line.split(",")}
        assert {"block_size", "figures"} <= knobs, (source.stem, knobs)
        assert all("  # " in line for line in cell.source.splitlines()), source.stem  # each knob says its range
        assert "**Needs**" in source.read_text(), source.stem


def test_tidy_numbers_the_cells_and_drops_progress_bars_only():
    nbformat = pytest.importorskip("nbformat")

    stream = lambda name, text: nbformat.v4.new_output("stream", name=name, text=text)  # noqa: E731
    cell = nbformat.v4.new_code_cell("load()")
    tqdm_warning = (
        "/x/tqdm/auto.py:21: TqdmWarning: IProgress not found. Please update\n"
        "  from .autonotebook import tqdm as notebook_tqdm\n"
    )
    cell.outputs = [
        stream("stderr", "\rLoading:  50%|█████ "),
        stream("stderr", "\n"),
        stream("stderr", tqdm_warning),
        stream("stderr", "/x/y.py:3: UserWarning: real\n  warn()\n" + tqdm_warning + "another\n"),
        stream("stdout", "τ 1.79\n"),
    ]
    notebook = walkthrough.tidy(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# x"), cell]))
    assert [c.id for c in notebook.cells] == ["cell-0", "cell-1"]
    # a real warning sent in the same chunk as tqdm's stays, with its own source line
    assert [o.text for o in notebook.cells[1].outputs] == [
        "/x/y.py:3: UserWarning: real\n  warn()\nanother\n",
        "τ 1.79\n",
    ]


def test_parameters_are_injected_after_the_parameters_cell_as_papermill_does():
    jupytext = pytest.importorskip("jupytext")
    notebook = walkthrough.with_parameters(jupytext.read(SOURCES[0]), {"block_size": 6})
    index = next(i for i, c in enumerate(notebook.cells) if "parameters" in c.metadata.get("tags", []))
    injected = notebook.cells[index + 1]
    assert injected.metadata["tags"] == ["injected-parameters"] and injected.source == "# Parameters\nblock_size = 6\n"


# -- what the command refuses, before any work -----------------------------------------------------------------


def test_the_walkthrough_names_what_it_lacks(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "dflash" else real(name, *a))
    with pytest.raises(SystemExit, match=r"needs dflash \(pip install --no-deps dflash==0\.1\.0\)"):
        walkthrough.run(only=["03"])
    with pytest.raises(SystemExit, match=r"no walkthrough named \['07'\]"):
        walkthrough.run(only=["07"])
    with pytest.raises(ModuleNotFoundError, match="this notebook needs dflash: pip install --no-deps dflash==0.1.0"):
        walkthrough.require("dflash")


def test_the_walkthrough_refuses_a_folder_that_is_a_file_before_running(tmp_path, capsys, monkeypatch):
    from dflash_ref.__main__ import main
    from dflash_ref.cli import walkthrough as command

    monkeypatch.setattr(command, "run", lambda *a, **k: pytest.fail("the walkthrough ran"))
    (tmp_path / "afile").write_text("not a folder")
    for option in ("--out", "--notebooks"):
        with pytest.raises(SystemExit) as e:
            main(["walkthrough", option, str(tmp_path / "afile")])
        assert e.value.code == 2 and f"{option} {tmp_path / 'afile'} is a file, not a folder" in capsys.readouterr().err


def test_a_failing_cell_is_named_with_its_notebook_and_heading(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    source = tmp_path / "09_broken.py"
    source.write_text('# %% [markdown]\n# ## 1. A stage\n\n# %% tags=["parameters"]\nx = 1\n\n# %%\nassert x == 2\n')
    with pytest.raises(SystemExit, match=r"09_broken stopped at cell 2 \(## 1\. A stage\): AssertionError"):
        walkthrough.run(notebooks=tmp_path, only=["09"], folder=tmp_path)
    written = nbformat.read(tmp_path / "09_broken.ipynb", as_version=4)
    assert written.cells[2].outputs[0].output_type == "error"  # the executed part is kept, to look at


def test_out_takes_the_executed_notebooks_too_so_the_sources_folder_is_left_as_it_was(tmp_path):
    """A run with another figures folder writes its path into the notebooks it executes: they go there too."""
    pytest.importorskip("nbclient")
    source = tmp_path / "09_fine.py"
    source.write_text('# %% tags=["parameters"]\nfigures = "../figures"\n\n# %%\nprint(figures)\n')
    before = sorted(p.name for p in tmp_path.iterdir())
    written = walkthrough.run(figures=tmp_path / "out", only=["09"], folder=tmp_path, say=lambda line: None)
    assert written == [tmp_path / "out" / "09_fine.ipynb"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["out"])  # nothing beside the source
    assert str((tmp_path / "out").resolve()) in written[0].read_text()
