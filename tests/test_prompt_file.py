"""`train --prompts-file / --heldout-file` (training/prompt_file.py): prompts of one's own, read from .txt or
.jsonl (prompt, messages, conversations), counted before anything is loaded, and refused by name."""

from __future__ import annotations

import json

import pytest
from test_train_config import parse, write

from dflash_ref.__main__ import main
from dflash_ref.training.options import DEFAULTS, save
from dflash_ref.training.prompt_file import PromptFileError, heldout_prompts, read_prompts, training_prompts

ROWS = [
    {"prompt": "Say hi."},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Why is the sky blue?"},
            {"role": "assistant", "content": "Scattering."},
            {"role": "user", "content": "More?"},
        ]
    },
    {"conversations": [{"from": "human", "value": "Count to three."}, {"from": "gpt", "value": "1 2 3"}]},
]


def jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_a_prompts_file_is_read_in_order_from_either_format(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("  Tell me about cats.\n\nWhat is rain?\n")
    assert read_prompts(text) == ["Tell me about cats.", "What is rain?"]  # blank lines skipped, stripped
    # the first user turn of a conversation; system turns, answers and later turns are not read
    assert read_prompts(jsonl(tmp_path / "p.jsonl", ROWS + [""])) == [
        "Say hi.",
        "Why is the sky blue?",
        "Count to three.",
    ]


@pytest.mark.parametrize(
    "name, rows, message",
    [
        ("p.csv", ["a"], "a prompts file must be .txt or .jsonl, not .csv"),
        ("p.txt", [], "holds no prompt"),
        ("p.txt", ["", "  "], "holds no prompt"),
        ("p.jsonl", ['{"prompt": "a"}', "{oops"], "line 2 is not JSON"),
        ("p.jsonl", ["[1]"], "line 1 is not a JSON object"),
        ("p.jsonl", [{"text": "a"}], 'line 1 has no "prompt", "messages" or "conversations"'),
        (
            "p.jsonl",
            [{"messages": [{"role": "assistant", "content": "a"}]}],
            "line 1: its conversation has no user turn",
        ),
        ("p.jsonl", [{"prompt": ""}], "line 1: its prompt is not a non-empty string: ''"),
        ("p.jsonl", [{"conversations": [{"from": "human", "value": 3}]}], "its prompt is not a non-empty string: 3"),
    ],
)
def test_a_prompts_file_that_holds_no_prompts_is_refused_by_line(tmp_path, name, rows, message):
    path = jsonl(tmp_path / name, rows)
    with pytest.raises(PromptFileError) as e:
        read_prompts(path, "--prompts-file")
    assert str(e.value).startswith(f"--prompts-file {path}") and message in str(e.value)


def test_a_missing_or_undecodable_file_is_named(tmp_path):
    with pytest.raises(PromptFileError, match="nope.txt: no such file"):
        read_prompts(tmp_path / "nope.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(PromptFileError, match="cannot read it as UTF-8 text"):
        read_prompts(tmp_path / "latin1.txt")


def test_a_new_run_takes_all_of_a_prompts_file_and_up_to_12_held_out(tmp_path):
    from dflash_ref.training.options import resolve

    train = jsonl(tmp_path / "t.txt", [f"Question {i}?" for i in range(30)])
    held = jsonl(tmp_path / "h.txt", [f"Other {i}?" for i in range(20)])
    out = str(tmp_path / "run")
    options = resolve(parse("--out", out, "--prompts-file", str(train), "--heldout-file", str(held)))
    assert (options["prompts"], options["eval_prompts"]) == (30, 12)
    assert training_prompts(options)[: options["prompts"]] == read_prompts(train)
    assert heldout_prompts(options)[:2] == ["Other 0?", "Other 1?"]
    options = resolve(parse("--out", out, "--prompts-file", str(train), "--prompts", "7", "--eval-prompts", "3"))
    assert (options["prompts"], options["eval_prompts"]) == (7, 3)  # given counts stay
    # a resumed run keeps its count, even with its --prompts-file given again
    (tmp_path / "run").mkdir()
    save(tmp_path / "run", {**DEFAULTS, "prompts_file": str(train), "prompts": 7})
    write(tmp_path / "run" / "state.json", {"step": 1, "losses": [], "seconds": 1.0})
    assert resolve(parse("--out", out, "--resume", "--prompts-file", str(train)))["prompts"] == 7


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--prompts-file", "{T}", "--prompts", "31"], "--prompts must lie in 1…30 (the prompts in {T}), got 31"),
        (
            ["--heldout-file", "{H}", "--eval-prompts", "21"],
            "--eval-prompts must lie in 1…20 (the prompts in {H}), got 21",
        ),
        (
            ["--prompts-file", "{T}", "--heldout-file", "{T}"],
            "12 of the 12 held-out prompts are also training prompts, e.g. 'Question 0?': hold them out",
        ),
        (["--prompts-file", "{MISSING}"], "--prompts-file {MISSING}: no such file"),
        (["--heldout-file", "{MISSING}"], "--heldout-file {MISSING}: no such file"),
    ],
)
def test_train_refuses_prompt_files_that_cannot_serve_before_any_work(tmp_path, capsys, flags, message):
    names = {
        "T": str(jsonl(tmp_path / "t.txt", [f"Question {i}?" for i in range(30)])),
        "H": str(jsonl(tmp_path / "h.txt", [f"Other {i}?" for i in range(20)])),
        "MISSING": str(tmp_path / "missing.txt"),
    }
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(out)] + [f.format(**names) for f in flags])
    assert e.value.code == 2 and message.format(**names) in capsys.readouterr().err
    assert not out.exists()  # nothing loaded, distilled or written
