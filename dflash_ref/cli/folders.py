"""The folders a command-line option names (--out, --figures, --trace): made before any work, or
refused with the option's name, so that a file in the way or a path no folder can be made at ends in
a message instead of failing after the work is done."""

from __future__ import annotations

import os
from pathlib import Path


def make_folder(flag: str, folder: str | Path) -> None:
    """Make the folder an option names (and its parents), or a ValueError naming the option: a file
    there, or a path no folder can be made at. generate checks its folders with it, bench and train
    make theirs before any work."""
    path = Path(os.path.abspath(folder))  # x/../y: y, and no x made on the way
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {folder} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {folder}: cannot make this folder ({e.strerror})") from None


def check_output_folder(flag: str, folder: str) -> None:
    """FOLDER is a folder or can be made one: checked by making it (and removing what was made), so
    that a file there, or a path no folder can be made at, is refused before the decoding."""
    path = Path(os.path.abspath(folder))  # as make_folder makes it
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        make_folder(flag, folder)
    finally:
        for p in made:
            if p.is_dir():
                p.rmdir()


def check_output_file(flag: str, path: str | Path, example: str = "out.txt") -> None:
    """A file can be written at PATH, else a ValueError naming it: PATH is no folder, its folder is there or
    can be made (check_output_folder), and it can be written in. Checked before the work, so that a long
    run does not end at a path it cannot write."""
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a folder; give the file to write, e.g. {Path(path) / example}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        check_output_folder(flag, folder)
    except ValueError as e:
        raise ValueError(f"{flag} {path}: {str(e).removeprefix(flag + ' ')}") from None
    if os.path.isdir(folder) and not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {path}: cannot write in {folder}")
