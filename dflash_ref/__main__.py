"""Command line: `python -m dflash_ref walkthrough [--out DIR]` and `python -m dflash_ref notebooks`."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_ref", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    walk = sub.add_parser("walkthrough", help="run the 3-token / block-4 walkthrough, write its figures")
    walk.add_argument("--out", default="figures", help="folder for the figures (default: figures/)")
    sub.add_parser("notebooks", help="regenerate and execute walkthroughs/*.ipynb from their .py sources")
    args = parser.parse_args(argv)
    if args.command == "walkthrough":
        from .walkthrough import run
        run(args.out)
    elif args.command == "notebooks":
        from .notebooks import build
        for path in build():
            print("executed", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
