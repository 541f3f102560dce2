"""`python -m dflash_ref.conformance.causes [list | heldout FILE | leave-one-out] [--bundles DIR]`: the catalogue of
causes, and how far the diagnosis generalises (measure.py)."""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

from . import measure
from .catalogue import CATALOGUE


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dflash_ref.conformance.causes", description=__doc__.split(":")[0])
    p.add_argument("what", choices=("list", "heldout", "leave-one-out"))
    p.add_argument("file", nargs="?", help="heldout: a Python file whose PORTS are the held-out ports")
    p.add_argument("--bundles", help="a folder for the golden bundles (default: a temporary one)")
    args = p.parse_args(argv)
    if args.what == "list":
        for cause in CATALOGUE:
            print(f"{cause.name:36} {'/'.join(cause.stages):20} {cause.says}")
        print(f"\n{len(CATALOGUE)} causes")
        return
    if args.what == "heldout" and not (args.file and Path(args.file).is_file()):
        p.error("heldout needs FILE, a Python file of held-out ports (tests/conformance/heldout_ports.py)")
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.bundles or scratch
        if args.what == "heldout":
            spec = importlib.util.spec_from_file_location("heldout_ports", args.file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            outcomes = measure.held_out(module.PORTS, folder)
        else:
            outcomes = measure.leave_one_out(folder)
    print(measure.table(outcomes))


if __name__ == "__main__":
    main()
