"""Command line: `python -m dflash_ref walkthrough [--out DIR]`, `python -m dflash_ref notebooks`,
`python -m dflash_ref golden --out DIR` and `python -m dflash_ref verify --impl NAME | --dump FILE`."""
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
    golden = sub.add_parser("golden", help="write the conformance kit's golden bundles (same bytes on a rerun)")
    golden.add_argument("--out", required=True, help="folder for the bundles (one subfolder per scenario)")
    golden.add_argument("--only", nargs="+", metavar="NAME", help="only these scenarios (default: all)")
    verify = sub.add_parser("verify", help="check an implementation against golden bundles, stage by stage")
    candidate = verify.add_mutually_exclusive_group(required=True)
    candidate.add_argument("--impl", help="reference | zlab | package.module:factory (an adapter)")
    candidate.add_argument("--dump", help="a port's tensors: .npz or .safetensors keyed {bundle}/{key}")
    verify.add_argument("--bundle", help="a bundle or a folder of bundles (default: the one in the package)")
    verify.add_argument("--allow-missing", action="store_true", help="tensors a candidate lacks do not fail")
    verify.add_argument("-v", "--verbose", action="store_true", help="one line per tensor")
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
    elif args.command == "golden":
        from .conformance.golden import generate_golden
        for path in generate_golden(args.out, args.only):
            print("wrote", path)
    elif args.command == "verify":
        from .conformance.verify import verify as run_verify, verify_dump
        report = (verify_dump(args.dump, args.bundle, args.allow_missing) if args.dump else
                  run_verify(args.impl, args.bundle, args.allow_missing))
        print(report.text(verbose=args.verbose))
        return 0 if report.passed else 1
    elif args.command == "notebooks":
        from .notebooks import build
        for path in build():
            print("executed", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
