"""The folders and files a command-line option names (--out, --figures, --trace, --screenshot): made or
checked before any work, or refused with the option's name, so that a file in the way, a path no folder
can be made at, or a place nothing can be written in ends in a message instead of failing after the work
is done."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def make_folder(flag: str, folder: str | Path) -> None:
    """Make the folder an option names (and its parents), or a ValueError naming the option: a file
    there, a path no folder can be made at, or a folder nothing can be written in. generate checks its
    folders with it, bench and train make theirs before any work."""
    problem = _make_writable(Path(os.path.abspath(folder)))  # x/../y: y, and no x made on the way
    if problem:
        raise ValueError(f"{flag} {folder}{problem}")


def _make_writable(path: Path) -> str | None:
    """Make `path` a folder (and its parents) and write a file in it (removed at once); None if that
    worked, else why not, as it reads after the path: " is a file, not a folder", ": cannot make this
    folder (…)" or ": cannot write in this folder (…)". Writing is the only sure test: os.access says
    yes to root in a place such as /sys, where no file can be made."""
    if path.exists() and not path.is_dir():
        return " is a file, not a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f": cannot make this folder ({e.strerror})"
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        return f": cannot write in this folder ({e.strerror})"
    return None


def _made_by(check, path: Path):
    """Run check() (which may make `path` and its parents) and remove every folder it made, deepest first:
    a check leaves nothing behind."""
    made = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        return check()
    finally:
        for p in made:
            if p.is_dir():
                p.rmdir()


def check_output_folder(flag: str, folder: str | Path) -> None:
    """FOLDER is a folder one can write in, or can be made one: checked by making it (and removing what
    was made), so that a file there, a path no folder can be made at, or a folder nothing can be written
    in is refused before the work (ValueError naming the option)."""
    _made_by(lambda: make_folder(flag, folder), Path(os.path.abspath(folder)))  # as make_folder makes it


def check_output_file(flag: str, path: str | Path, example: str = "out.txt", parents: bool = True) -> None:
    """A file can be written at PATH, else a ValueError naming the option (leaving nothing behind): PATH is no
    folder (`example`: the file name the message suggests in it), an existing file there can be opened for
    writing, and its folder is there or can be made, and can be written in. Checked before the work, so
    that a long run does not end at a path it cannot write. `parents`: the command makes the file's folder
    when it writes (as `view --out` does); False: the folder must be there already (as Path.write_text wants)."""
    file = Path(os.path.abspath(path))
    if file.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give the file to write, e.g. {Path(path) / example}")
    if not parents and not file.parent.is_dir():
        raise ValueError(f"{flag} {path}: needs a file path in an existing folder ({file.parent} is none)")
    problem = _made_by(lambda: _make_writable(file.parent), file.parent)
    if problem:
        raise ValueError(f"{flag} {path}: its folder {file.parent}{problem}")
    if file.exists():
        try:
            with open(file, "ab"):  # appends nothing: the file stays as it is
                pass
        except OSError as e:
            raise ValueError(f"{flag} {path}: cannot write this file ({e.strerror})") from None
