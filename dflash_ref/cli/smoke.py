"""`python -m dflash_ref smoke`: a full-size check on CUDA (bench/smoke.py), or a tiny one on a CPU."""

from __future__ import annotations

import argparse

from ..bench import smoke


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--size", choices=["full", "tiny"], default="full", help="full: Qwen3-8B's shapes, on CUDA; tiny: on a CPU"
    )
    p.add_argument(
        "--version",
        type=int,
        choices=[1, 2],
        default=1,
        help="2: a DFlash 2 draft shaped like z-lab/Qwen3.8-27B-DFlash2, on a target of "
        "Qwen3.8-27B's widths (shapes assumed: bench/smoke.py says which)",
    )
    p.add_argument(
        "--arch",
        choices=["qwen3", "qwen3_5"],
        default="qwen3",
        help="qwen3_5: a hybrid target shaped like Qwen3.5-27B, its DFlash draft (shapes assumed: "
        "bench/smoke_hybrid.py says which)",
    )


NOTHING_RAN = 3  # the exit code where the full-size check could not run here (no CUDA): not a pass


def main(args, parser: argparse.ArgumentParser) -> int:
    """0 where the check ran and held; NOTHING_RAN where it ran nothing (a script must not read that as a pass)."""
    result = smoke.run(args.size, version=args.version, arch=args.arch)
    return 0 if result is not None else NOTHING_RAN
