"""`python -m dflash_ref walkthrough`, the main job: the notebooks in walkthroughs/, run top to bottom, their
executed `.ipynb` and their figures written (tour/notebooks.py)."""

from __future__ import annotations

import argparse

from ..tour.notebooks import MACHINE, NOTEBOOKS, run
from .folders import check_output_folder

TIMES = "; ".join(f"{n.name[:2]} {n.takes}" for n in NOTEBOOKS) + f" ({MACHINE})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Run the walkthrough notebooks, each in a fresh kernel, telling them on the terminal as they run. "
        f"How long each took: {TIMES}. The first run also converts SmolLM2's GGUF once into the model cache "
        "($DFLASH_REF_CACHE or ~/.cache/dflash_ref, about 0.5 GB)."
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="folder for the figures and, unless --notebooks says otherwise, the executed notebooks (default: "
        "figures/ and walkthroughs/, the repository's own, rewritten as committed)",
    )
    p.add_argument(
        "--notebooks",
        metavar="DIR",
        help="folder for the executed notebooks (default: --out if given, else walkthroughs/ beside their sources)",
    )
    p.add_argument(
        "--only", nargs="+", metavar="NN", help="only these notebooks, by number: 01 02 03 04 05 (default: all)"
    )


def main(args, parser: argparse.ArgumentParser) -> int:
    for option, folder in (("--out", args.out), ("--notebooks", args.notebooks)):
        if folder is not None:
            try:
                check_output_folder(option, folder)  # now, not after the notebooks have run
            except ValueError as e:
                parser.error(str(e))
    run(args.out, args.notebooks, args.only)
    return 0
