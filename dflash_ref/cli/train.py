"""`python -m dflash_ref train`: its options (training/arguments.py) and its folders checked, then the training
driver run (training/driver.py: what it writes, and how)."""

from __future__ import annotations

import argparse

from ..training import options as train_options
from ..training.arguments import add_train_arguments
from ..training.driver import check_options, run
from .folders import make_folder

__all__ = ["add_arguments", "check_options", "main", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`train`'s options (training/arguments.py, which imports no torch)."""
    add_train_arguments(p)


def main(args, parser: argparse.ArgumentParser) -> int:
    try:
        options = check_options(train_options.resolve(args))
    except ValueError as e:
        parser.error(str(e))
    for folder, flag in ((args.out, "--out"), (options["figures"], "--figures")):  # now, not after the training
        try:
            make_folder(flag, folder)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    return run(argparse.Namespace(out=args.out, resume=args.resume, **options))
