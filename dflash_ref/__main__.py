"""Command line: `python -m dflash_ref COMMAND`, with COMMAND one of walkthrough (the main job), generate,
view, smoke, bench, train, evaluate, golden, verify, matrix (see README.md).

Each command lives in dflash_ref/cli/COMMAND.py: its options (`add_arguments`) beside what it runs (`main`), and
where it had other spellings before, how it reads them now (`respell`: verify's mode flags).
Only the command named is imported, so `--help` lists them all without loading torch."""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

COMMANDS = {  # name → its line in `--help`
    "walkthrough": "run the walkthrough notebooks (the main job) and write their figures",
    "generate": "speculative decoding with a real or random draft, streamed",
    "view": "a saved trace as one HTML file to step through in a browser (offline)",
    "smoke": "full-size Qwen3-8B-shaped check on CUDA (or --size tiny on CPU)",
    "bench": "side-by-side benchmarks, reported as ratios",
    "train": "self-distil SmolLM2 (or --target DIR) and train a draft with the paper's recipe",
    "evaluate": "a draft's tokens per step (τ + 1) and acceptance per block position on prompt sets",
    "golden": "write the conformance kit's golden bundles (same bytes on a rerun)",
    "verify": "check an implementation against golden bundles, stage by stage",
    "matrix": "the conformance matrix: every shipped port on every greedy bundle",
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` as argparse writes it, the descriptions' line breaks kept, and every option's default after
    its help: "(default: …)". Not where the help already says its default in its own words, nor where there
    is none to say (None, False, an empty list: the option is off, or empty, unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        default = action.default
        if "default" in help or default is argparse.SUPPRESS or default is None or default is False or default == []:
            return help
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{help} (default: {shown.replace('%', '%%')})".lstrip()


FREE_TEXT = ("prompt", "title")  # options whose value is text, which may be blank: their command judges it


class Parser(argparse.ArgumentParser):
    """The command's parser, and each subcommand's (a subparser is of its parent's class): HelpFormatter's help,
    and no option given an empty value. An empty string names no path, URL or choice, yet reads as "not given"
    wherever the code tests an option's truth (`--endpoint ""` would run another mode, `--out ""` write into
    the current folder): a usage error instead, for every option but the free text ones (FREE_TEXT)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            if action.dest in FREE_TEXT or value is action.default:
                continue
            if any(isinstance(v, str) and not v.strip() for v in (value if isinstance(value, list) else [value])):
                name = "/".join(action.option_strings) or action.dest
                how = "give one, or leave the option out" if action.option_strings else "give one"
                self.error(f"argument {name}: an empty value names nothing ({how})")
        return namespace, extras


def _version() -> str:
    """The installed distribution's version (pyproject.toml's), without importing the package's torch modules."""
    try:
        return version("dflash-ref")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = Parser(prog="python -m dflash_ref", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dflash_ref {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    named = next((a for a in argv if not a.startswith("-")), None)
    command = parsers = None
    for name, help in COMMANDS.items():
        p = sub.add_parser(name, help=help, description=help)
        if name == named:  # its module, and torch with it, only for the command asked for
            command, parsers = importlib.import_module(f"dflash_ref.cli.{name}"), p
            command.add_arguments(p)
    if hasattr(command, "respell"):  # the command's older spellings, as it spells them now (verify's mode flags)
        argv = command.respell(argv)
    args = parser.parse_args(argv)
    return command.main(args, parsers) or 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C outside generate's decoding (which reports what it did): no traceback
        print("interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
