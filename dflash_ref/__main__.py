"""Command line: `python -m dflash_ref walkthrough [--out DIR]` and `python -m dflash_ref notebooks`."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dflash_ref", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    walk = sub.add_parser("walkthrough", help="run the 3-token / block-4 walkthrough, write its figures")
    walk.add_argument("--out", default="figures", help="folder for the figures (default: figures/)")
    gen = sub.add_parser("generate", help="speculative decoding with a real or random draft, streamed")
    from .cli_generate import add_arguments
    add_arguments(gen)
    smoke = sub.add_parser("smoke", help="full-size Qwen3-8B-shaped check on CUDA (or --size tiny on CPU)")
    smoke.add_argument("--size", choices=["full", "tiny"], default="full")
    bench = sub.add_parser("bench", help="side-by-side benchmarks, reported as ratios")
    bench.add_argument("names", nargs="*", default=["tracing"], help="which benchmarks (default: all)")
    bench.add_argument("--repeats", type=int, default=7)
    bench.add_argument("--out", default="figures/bench")
    sub.add_parser("notebooks", help="regenerate and execute walkthroughs/*.ipynb from their .py sources")
    args = parser.parse_args(argv)
    if args.command == "walkthrough":
        from .walkthrough import run
        run(args.out)
    elif args.command == "generate":
        from .cli_generate import run as run_generate
        return run_generate(args)
    elif args.command == "smoke":
        from .smoke import run as run_smoke
        run_smoke(args.size)
    elif args.command == "bench":
        from .bench import BENCHES, run as run_bench
        unknown = sorted(set(args.names) - set(BENCHES))
        if unknown:
            parser.error(f"unknown benchmark(s) {unknown}; choose from {sorted(BENCHES)}")
        run_bench(args.names, args.repeats, args.out)
    elif args.command == "notebooks":
        from .notebooks import build
        for path in build():
            print("executed", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
