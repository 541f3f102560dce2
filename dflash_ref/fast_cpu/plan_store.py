"""The store of measured linear plans (fast_cpu/plan.py): one JSON file per machine in the
cache folder, so that a process reads the plans an earlier one measured instead of timing its ~50
products again (seconds a short run would otherwise spend before its first token).

    linear-plans-<machine>.json   {"plans": {"d_out×d_in rows N copies|no-copies dtype threads T":
                                             {"chosen": kernel, "times": {candidate: [seconds, …]}}}}

<machine> is a digest of what a plan depends on beyond its shape: the CPU (model and instruction sets),
its last-level cache, the CPUs this process may use, torch's version and the C product (built from
which source, or why not). An entry is trusted only where its candidates are those measurable now and
its times are seconds; a file that does not parse is as good as none. Delete the file, or call
`plan.forget_plans(stored=True)`, to measure afresh.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from ..extensions import cache_folder
from . import streamed

Plan = tuple[str, dict[str, list[float]]]  # (the kernel chosen, each candidate's samples in seconds)
_read: dict[str, dict] | None = None  # the file's plans, read at the first lookup of a process


@functools.lru_cache(maxsize=1)
def last_level_cache() -> int:
    """Bytes of the largest CPU cache this process sees (Linux sysfs); 0 where it cannot be read."""
    size = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        size = max(size, int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
    return size


@functools.lru_cache(maxsize=1)
def machine_digest() -> str:
    """16 hex digits naming the machine a plan was measured on (the module's docstring)."""
    machine = "\n".join(
        [
            streamed.cpu_identity(),
            str(last_level_cache()),
            str(streamed.cpus_at_hand()),
            torch.__version__,
            streamed.status(),
        ]
    )
    return hashlib.sha256(machine.encode()).hexdigest()[:16]


def store_path() -> Path:
    """This machine's file, in the cache folder ($DFLASH_REF_CACHE, else ~/.cache/dflash_ref)."""
    return cache_folder() / f"linear-plans-{machine_digest()}.json"


def entry_name(key: tuple) -> str:
    """A plan's name in the file, from plan.py's key (d_out, d_in, rows, with_copies, dtype, threads)."""
    d_out, d_in, rows, with_copies, dtype, threads = key
    return f"{d_out}×{d_in} rows {rows} {'copies' if with_copies else 'no-copies'} {dtype} threads {threads}"


def _file_plans() -> dict[str, dict]:
    """The file's plans by name; {} where there is no file or it does not parse as one."""
    try:
        plans = json.loads(store_path().read_text())["plans"]
        return plans if isinstance(plans, dict) else {}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def lookup(key: tuple, names: tuple[str, ...]) -> Plan | None:
    """The stored plan for `key` if its candidates are `names` (those measurable now: the C product built
    or not alike) and its times are lists of seconds, as `measure` takes them: one as long as another
    (plan.choose pairs them) and each finite and > 0; else None (to be measured)."""
    global _read
    if _read is None:
        _read = _file_plans()
    entry = _read.get(entry_name(key))
    try:
        chosen, times = entry["chosen"], entry["times"]
        if (
            tuple(times) == names
            and chosen in names
            and all(_seconds(t) for t in times.values())
            and len({len(t) for t in times.values()}) == 1
        ):
            return chosen, {n: [float(s) for s in t] for n, t in times.items()}
    except (TypeError, KeyError, AttributeError):
        pass
    return None


def _seconds(samples) -> bool:
    """Whether `samples` is a non-empty list of durations: numbers (not booleans), finite and > 0."""
    return (
        isinstance(samples, list)
        and bool(samples)
        and all(isinstance(s, (int, float)) and not isinstance(s, bool) and 0 < s < float("inf") for s in samples)
    )


def add(key: tuple, plan: Plan) -> None:
    """Add a measured plan to the file: read again and merged, written whole under another name and renamed,
    so that a reader never sees half a file (a process writing at the same moment may drop this plan, which
    is then measured again). A cache folder that cannot be written keeps nothing, without an error."""
    global _read
    path = store_path()
    merged = _file_plans() | {entry_name(key): {"chosen": plan[0], "times": plan[1]}}
    written = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name + ".", delete=False) as f:
            written = f.name
            json.dump({"plans": merged}, f)
        os.replace(written, path)
    except OSError:
        if written is not None:
            Path(written).unlink(missing_ok=True)
        return
    _read = merged


def forget(delete: bool = False) -> None:
    """Read the file again at the next lookup; `delete`: remove it first."""
    global _read
    _read = None
    if delete:
        store_path().unlink(missing_ok=True)
