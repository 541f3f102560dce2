"""`python -m dflash_ref view TRACE [--out FILE.html]`: one self-contained HTML file to step through a saved
trace (viewer/), and with `--screenshot PNG` how headless Chromium draws it."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..trace import Trace
from ..viewer import browser, write_html
from .folders import check_output_file

LARGE_MIB = 100  # a file above this opens slowly: the command says how to make it smaller


def run(args) -> int:
    """Write the viewer; a trace that cannot be read or shown, or a file that cannot be written (checked
    before the trace is read), ends the command with the reason."""
    out = Path(args.out) if args.out else Path(args.trace) / "trace.html"
    try:
        if args.out or Path(args.trace).is_dir():  # else the trace's own refusal (below) says what is wrong
            check_output_file("--out", out, "trace.html")
        if args.screenshot:
            check_output_file("--screenshot", args.screenshot, "trace.png")
    except ValueError as e:
        raise SystemExit(f"view: {e}") from None
    try:
        trace = Trace.load(args.trace)
        title = args.title or f"dflash_ref trace · {Path(args.trace).name}"
        path = write_html(trace, out, steps=args.steps, layers=args.layers, target_layers=args.target_layers,
                          precision=args.precision, title=title)  # fmt: skip
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        raise SystemExit(f"view: {e}") from None
    size = path.stat().st_size / 2**20
    print(f"wrote {path} ({size:.1f} MiB): open it in any browser, offline")
    if size > LARGE_MIB:
        print(f"  a browser opens {size:.0f} MiB slowly: --steps, --layers or --target-layers keep the file smaller")
    if args.screenshot:
        try:
            print(f"wrote {browser.screenshot(path, args.screenshot)}")
        except RuntimeError as e:
            raise SystemExit(f"view --screenshot: {e}") from None
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`view`'s options."""
    p.add_argument("trace", help="a trace folder (generate --trace DIR, Trace.save)")
    p.add_argument("--out", help="the HTML file to write (default: TRACE/trace.html)")
    p.add_argument("--steps", type=int, nargs="+", metavar="STEP", help="only these steps (default: all)")
    p.add_argument("--layers", type=int, nargs="+", metavar="L", help="only these draft layers (default: all)")
    p.add_argument(
        "--target-layers", type=int, nargs="+", metavar="L", help="only these target layers (default: all traced)"
    )
    p.add_argument(
        "--precision",
        choices=["float16", "float32"],
        default="float16",
        help="how the attention weights are stored in the file (float16: half the size, about 3 digits)",
    )
    p.add_argument("--title", help="the page's title")
    p.add_argument("--screenshot", metavar="PNG", help="also write how headless Chromium draws the page")


def main(args, parser: argparse.ArgumentParser) -> int:
    return run(args)
