"""`python -m dflash_ref matrix`: every shipped port on every greedy bundle (conformance/matrix.py)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ..conformance.bundle import find_bundles
from ..conformance.golden import generate_golden
from ..conformance.matrix import (
    PORTS,
    check_matrix_file,
    check_ports,
    endpoint_rows,
    header,
    matrix,
    merge,
    report_kind,
)
from .folders import check_output_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", help="a folder of bundles (default: all scenarios, written to a temporary folder)")
    p.add_argument(
        "--out",
        help="write the Markdown here: a new file, or a matrix this command wrote (another file is refused) "
        "(default: print it)",
    )
    p.add_argument(
        "--engines",
        action="store_true",
        help="with the engine-shaped bundles too (golden --engines), on which vLLM and llama.cpp can run",
    )
    p.add_argument(
        "--ports", nargs="+", metavar="PORT", help="these ports only (default: every shipped port and engine)"
    )
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="PORT=REPORT.json[,REPORT.json]",
        help='with --out and --merge: a port\'s `verify --endpoint --json` reports, as its "endpoint" cell of the '
        "serving conditions (no port runs)",
    )
    p.add_argument(
        "--texts",
        metavar="DIR",
        help="also write each port's report as verify prints it, to DIR/PORT.txt (`verify --impl PORT`) and "
        "DIR/PORT.sampling.VERIFIER.txt (`verify --sampling --impl PORT --verifier VERIFIER`), the seconds each "
        "took beside it (.seconds): a CI that shows the reports runs each port once",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="with --out: put these ports into the matrix already there (a run in a port's own environment: "
        "its sections and table rows replace their own, the rest stays)",
    )


KINDS = {  # what a verify --json report is, in words, for a report that is not verify --endpoint's
    "outputs": "a report of verify --outputs (outputs a user had, judged against the target: no server answered)",
    "bundles": "a report of verify --impl or --dump (a port's tensors on the bundles, not a server's answers)",
    "unknown": "not a report of verify --endpoint --json",
}


def _endpoint(args, parser: argparse.ArgumentParser) -> int:
    """--endpoint PORT=FILES: the reports read and merged into --out's serving conditions."""
    if not (args.out and args.merge) or args.ports or args.engines or args.bundle:
        parser.error("--endpoint merges reports into the matrix at --out: give --out and --merge, and no port to run")
    try:
        check_output_file("--out", args.out, "MATRIX.md")
        check_matrix_file(args.out)
    except ValueError as e:
        parser.error(str(e))
    reports = {}
    for given in args.endpoint:
        port, _, files = given.partition("=")
        if not port or not files:
            parser.error(f"--endpoint {given!r}: write PORT=REPORT.json[,REPORT.json]")
        reports[port] = []
        for file in files.split(","):
            try:
                report = json.loads(Path(file).read_text())
            except (OSError, ValueError, RecursionError) as e:
                parser.error(f"--endpoint {given}: {file}: {e}")
            kind = report_kind(report)
            if kind != "endpoint":  # a server's cell holds a server's answers only
                parser.error(f"--endpoint {given}: {file} is {KINDS[kind]}")
            reports[port].append(report)
    out = Path(args.out)
    old = out.read_text() if out.is_file() else ""
    command = "python -m dflash_ref matrix --merge " + " ".join(f"--endpoint {g}" for g in args.endpoint)
    old = old if old.strip() else "\n".join(header(command))  # a new file: a matrix from its first line
    out.write_text(merge(old, "\n".join(endpoint_rows(reports))) + "\n")
    return 0


def _write_texts(folder: Path, texts: dict) -> None:
    """matrix --texts: each report as verify prints it, and the seconds it took."""
    folder.mkdir(parents=True, exist_ok=True)
    for key, (text, seconds) in texts.items():
        name = ".".join(key)
        (folder / f"{name}.txt").write_text(text + "\n")
        (folder / f"{name}.seconds").write_text(f"{round(seconds)}\n")


def main(args, parser: argparse.ArgumentParser) -> int:
    if args.endpoint:
        return _endpoint(args, parser)
    try:
        check_ports(args.ports or PORTS)
        if args.merge and not args.out:
            raise ValueError("--merge puts this run into the matrix at --out FILE: give --out")
        if args.out:
            check_output_file("--out", args.out, "MATRIX.md")  # now, not after the whole matrix has run
            check_matrix_file(args.out)  # a file of other words is neither merged into nor replaced
        if args.bundle is not None:
            find_bundles(args.bundle)  # a missing or empty folder is said now, in one line
    except (ValueError, OSError) as e:
        parser.error(str(e))
    with tempfile.TemporaryDirectory() as scratch:
        if args.bundle is None:
            generate_golden(scratch, engines=args.engines)
        command = "python -m dflash_ref matrix" + " --engines" * args.engines
        command += f" --ports {' '.join(args.ports)}" if args.ports else ""
        command += " --merge" if args.merge else ""
        texts = {} if args.texts else None
        text, clean = matrix(args.bundle or scratch, args.ports or PORTS, command, texts)
    if args.texts:
        _write_texts(Path(args.texts), texts)
    if args.out is None:
        print(text)
    else:
        out = Path(args.out)
        if args.merge and out.is_file():
            text = merge(out.read_text(), text)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0 if clean else 1  # a FAIL, or a port that raised or could not start
