"""`verify`'s command line (cli/verify.py): five modes, each a subcommand with its own options, so the parser
refuses an option a mode does not take, in one line naming the modes that take it; the flags of earlier releases
(`--impl NAME`, `--dump FILE`, `--endpoint URL`, `--outputs FILE`, `--sampling`) read as the modes they name.
Parsing only: each mode's runner is replaced by one that hands back what it was given."""

from __future__ import annotations

import argparse

import pytest

from dflash_ref.__main__ import Parser, main
from dflash_ref.cli import verify

RUNNERS = ("_greedy_run", "_served", "_sampled_impl", "_sampled_endpoint")


@pytest.fixture
def parsed(monkeypatch):
    """argv → (the runner the mode runs, its arguments), nothing run."""
    for name in RUNNERS:
        monkeypatch.setattr(verify, name, lambda args, parser, name=name: (name, args))
    seen = {}

    def parse(argv):
        with monkeypatch.context() as m:
            m.setattr(verify, "main", lambda args, parser: seen.setdefault("run", args.run(args, parser)) and 0)
            main(["verify", *argv])
        name, args = seen.pop("run")
        return name, {k: v for k, v in vars(args).items() if k not in ("parser", "run")}

    return parse


@pytest.mark.parametrize(
    "old, new",
    [
        ("--impl reference --bundle B -v", "impl reference --bundle B -v"),
        ("-v --impl=reference --timeout 5", "impl reference -v --timeout 5"),
        ("--dump port.npz --profile p.json --html r.html", "dump port.npz --profile p.json --html r.html"),
        ("--bundle B --endpoint http://h:8000 --strict", "endpoint http://h:8000 --bundle B --strict"),
        ("--outputs o.jsonl --target T --dtype bfloat16", "outputs o.jsonl --target T --dtype bfloat16"),
        ("--sampling --impl reference --runs 400", "sampling impl reference --runs 400"),
        ("--impl vllm --sampling --verifier match", "sampling impl vllm --verifier match"),
        ("--sampling --endpoint http://h --bundle S", "sampling endpoint http://h --bundle S"),
    ],
)
def test_the_old_flags_read_as_the_modes_they_name(parsed, old, new):
    assert verify.respell(["verify", *old.split()]) == ["verify", *new.split()]
    assert parsed(old.split()) == parsed(new.split())


def test_each_mode_runs_its_own_runner_with_only_its_own_options(parsed):
    name, args = parsed(["impl", "reference"])
    assert name == "_greedy_run" and args["impl"] == "reference" and args["dump"] is None and "prompts" not in args
    name, args = parsed(["dump", "port.npz"])
    assert name == "_greedy_run" and args["dump"] == "port.npz" and args["impl"] is None and args["timeout"] is None
    name, args = parsed(["endpoint", "http://h", "--prompts", "P"])
    assert name == "_served" and args["outputs"] is None and args["prompts"] == "P" and "variant" not in args
    name, args = parsed(["outputs", "o.jsonl", "--strict"])
    assert name == "_served" and args["endpoint"] is None and args["strict"] and "bundle" not in args
    assert parsed(["sampling", "impl", "reference"])[0] == "_sampled_impl"
    assert parsed(["sampling", "endpoint", "http://h", "--bundle", "S"])[0] == "_sampled_endpoint"


def usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(["verify", *argv])
    said = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "Traceback" not in "\n".join(said), said
    return said[-1]


@pytest.mark.parametrize(
    "argv, said",
    [
        ("--impl reference --prompts P", "verify impl: error: --prompts goes with verify endpoint, not verify impl"),
        (
            "dump port.npz --timeout 5",
            "--timeout goes with verify impl, endpoint and sampling endpoint, not verify dump",
        ),
        (
            "--outputs o --bundle B",
            "--bundle goes with verify impl, dump, endpoint, sampling impl and sampling endpoint, not verify outputs",
        ),  # fmt: skip
        ("--outputs o --plain http://h", "--plain goes with verify endpoint, not verify outputs"),
        ("--endpoint http://h --no-diagnose", "--no-diagnose goes with verify impl and dump, not verify endpoint"),
        (
            "--sampling --impl reference --json r.json",
            "--json goes with verify impl, dump, endpoint and outputs, not verify sampling impl",
        ),  # fmt: skip
        ("--impl reference --runs 4", "--runs goes with verify sampling impl and sampling endpoint, not verify impl"),
        ("impl reference --dump port.npz", "--dump is a mode of its own: verify dump FILE (verify --help)"),
        (
            "endpoint http://h --sampling",
            "--sampling is a mode of its own: verify sampling impl NAME | sampling endpoint URL",
        ),  # fmt: skip
        ("--impl reference --dump port.npz", "verify: error: --impl and --dump are two modes: give one"),
        ("--bundle B --impl", "verify: error: argument --impl: expected one argument"),
        ("--bundle B", "verify: error: give a mode first: verify impl NAME | dump FILE | endpoint URL | outputs"),
        ("imp reference", "argument MODE: invalid choice: 'imp' (choose from 'impl', 'dump', "),
        ("", "verify: error: the following arguments are required: MODE"),
        ("sampling endpoint http://h", "the following arguments are required: --bundle"),
        ("--sampling --dump port.npz", "invalid choice: 'dump' (choose from 'impl', 'endpoint')"),
    ],
)
def test_an_option_a_mode_does_not_take_is_one_line_naming_the_modes_that_do(capsys, argv, said):
    assert said in usage_error(capsys, argv.split())


def test_every_option_is_refused_by_every_mode_that_does_not_take_it(capsys):
    """The refusals come from the modes' parsers, not a table beside them: each option, each mode without it."""
    where = verify_where()
    modes = {mode for taking in where.values() for mode in taking}
    assert modes == {"impl", "dump", "endpoint", "outputs", "sampling impl", "sampling endpoint"}
    given = {mode: [*mode.split(), "x"] for mode in modes}  # each mode and its positional argument
    given["sampling endpoint"] += ["--bundle", "S"]  # required
    for option, taking in where.items():
        for mode in sorted(modes - set(taking)):
            said = usage_error(capsys, [*given[mode], option, "1"])
            assert said.endswith(f", not verify {mode}") and f"error: {option} goes with verify " in said, said


def verify_where() -> dict[str, list[str]]:
    """Each option → the modes that take it, as the modes' parsers say (`Mode.where`)."""
    parser = Parser(prog="verify")
    verify.add_arguments(parser)
    (modes,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return type(modes.choices["impl"]).where


def test_the_help_shows_the_modes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["verify", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "verify impl NAME | dump FILE | endpoint URL | outputs FILE.jsonl" in out
    assert "verify sampling impl NAME | sampling endpoint URL --bundle DIR" in out
    for mode in verify.MODES:
        assert f"\n    {mode} " in out, out
