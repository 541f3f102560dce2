"""Where a port crashed, in its author's terms, and a time limit on a port's run.

A traceback's innermost frame is most often a library's (an MLX `linear.py`, torch's `functional.py`): true, and
no help to the port's author, whose own line called it with the wrong shapes. So a crash is located at the
innermost frame of the port's own package, with the library frame beside it:

    ValueError: [matmul] shapes (1,4,64) and (96,64) … — in the port at dflash_mlx/model.py:212 (__call__);
    raised inside mlx/nn/layers/linear.py:55

The port's package is the adapter's `package` (its top-level module names), else every frame that is neither
the kit's, Python's own nor a known library's. A crash raised on the kit's own line, or with no frame of the port
in its traceback, is said to be the adapter's: a bug of the adapter or of the kit, not of the port (an adapter's
pass-through tap between the port's line and the library does not count).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sysconfig
import threading
import traceback
from pathlib import Path

KIT = Path(__file__).resolve().parents[1]  # dflash_ref/
# libraries a port calls into: a frame of theirs is where an error surfaced, rarely where it was made
LIBRARIES = {"torch", "numpy", "mlx", "mlx_lm", "safetensors", "einops", "scipy", "tokenizers", "huggingface_hub"}
STDLIB = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")}


class EngineFailed(RuntimeError):
    """Raised by an adapter that runs its port as a process of its own (an engine) when that process fails: the
    crash is the port's, located in its process (the exit code and its last error lines in the message), not at
    the adapter's line that noticed it."""


class OutOfTime(BaseException):
    """Raised into a port's run when its time is up: a BaseException, so the port's own `except Exception` does
    not swallow it."""


def _package_path(filename: str) -> tuple[str, str] | None:
    """(top-level module, path from site-packages) of an installed package's file, else None."""
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            rest = parts[parts.index(marker) + 1 :]
            return (rest[0].removesuffix(".py"), "/".join(rest)) if rest else None
    return None


def _kind(filename: str, package: tuple[str, ...]) -> str:
    """ "kit", "port", "library" or "python" for a frame's file."""
    path = Path(filename).resolve()
    installed = _package_path(filename)
    top = installed[0] if installed else None
    if package:
        if top in package or any(p in path.parts for p in package):
            return "port"
    if KIT in path.parents:
        return "kit"
    if any(root in path.parents for root in STDLIB) and installed is None:
        return "python"
    if top in LIBRARIES:
        return "library"
    return "library" if package else "port"  # a port that named its package: every other frame is a library's


def _short(frame: traceback.FrameSummary) -> str:
    installed = _package_path(frame.filename)
    path = Path(frame.filename)
    if installed:
        shown = installed[1]
    elif KIT in path.resolve().parents:
        shown = path.resolve().relative_to(KIT.parent).as_posix()
    else:
        shown = path.name
    return f"{shown}:{frame.lineno} ({frame.name})"


def where(error: BaseException, adapter=None) -> str:
    """The error and where it was made: `Type: message — in the port at FILE:LINE (function); raised inside
    LIBRARY_FILE:LINE` where a library raised it, or `— in the adapter at …` where the kit's own code did."""
    package = adapter.package if adapter is not None else ()
    package = (package,) if isinstance(package, str) else tuple(package)
    frames = traceback.extract_tb(error.__traceback__)
    said = f"{type(error).__name__}: {error}"
    if not frames:
        return said
    if isinstance(error, EngineFailed):
        return f"{said} — in the port's own process"
    kinds = [_kind(f.filename, package) for f in frames]
    innermost = frames[-1]
    # the kit's own line raised it: the adapter's; else the port's innermost line (an adapter's pass-through tap
    # may sit between it and the library that raised), else the adapter's that called the library
    inside = [f for f, k in zip(frames, kinds) if k == "port"] if kinds[-1] != "kit" else []
    own = (inside or [f for f, k in zip(frames, kinds) if k == "kit"] or [None])[-1]
    if own is None:
        return f"{said} — raised inside {_short(innermost)}"
    whose = "in the port at" if inside else "in the adapter (the kit's code) at"
    beside = f"; raised inside {_short(innermost)}" if own is not innermost else ""
    return f"{said} — {whose} {_short(own)}{beside}"


# names a port gives DFlash's values (its own spellings vary; these are the usual ones)
VALUE_NAMES = (
    "target_hidden", "hidden_states", "hidden", "context", "noise_embedding", "noise", "position_ids", "positions",
    "attention_mask", "mask", "past_key_values", "cache", "logits", "input_ids", "block", "layer_ids", "features",
)  # fmt: skip


def dimensions(configs: dict[str, dict], block_size: int | None = None) -> dict[int, str]:
    """A bundle's sizes by value → their names in DFlash's terms (d, k·d, V, H_q·d_h, …), from its configs
    ("target", "draft" config.json); a size two names share is said once with both."""
    draft = configs.get("draft") or {}
    target = configs.get("target") or {}
    target = target.get("text_config") or target
    inner = draft.get("dflash_config") or {}
    d = draft.get("hidden_size")
    heads, kv = draft.get("num_attention_heads"), draft.get("num_key_value_heads")
    head_dim = draft.get("head_dim") or (d // heads if d and heads else None)
    ids = inner.get("target_layer_ids") or draft.get("target_layer_ids") or []
    named = [
        (d, "d"),
        (len(ids) * d if d and ids else None, f"k·d (k = {len(ids)} target layers)"),
        (draft.get("vocab_size") or target.get("vocab_size"), "V"),
        (heads * head_dim if heads and head_dim else None, "H_q·d_h"),
        (kv * head_dim if kv and head_dim else None, "H_kv·d_h"),
        (head_dim, "d_h"),
        (draft.get("intermediate_size"), "the MLP's width"),
        (block_size or draft.get("block_size"), "L_q (the block)"),
        (target.get("num_hidden_layers"), "the target's layers"),
    ]
    out: dict[int, str] = {}
    for size, name in named:
        if size and size > 1:
            out[size] = f"{out[size]} = {name}" if size in out else name
    return out


def values_at_crash(error: BaseException, adapter, dims: dict[int, str]) -> str:
    """Which of DFlash's values the port held when it fell over, and in what shape, read off its own innermost
    frame (where() names it): every array-like local of that frame with a shape, each size named in DFlash's terms
    by `dims` (dimensions()), a multiple of d that is no size of this bundle said as n·d (the features of n layers,
    say, where fc takes k·d), and the DFlash values it held as None. "" where no frame of the port is in the
    traceback, or it held nothing of the kind."""
    package = adapter.package if adapter is not None else ()
    package = (package,) if isinstance(package, str) else tuple(package)
    tb, frames = error.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    own = [f for f in frames if _kind(f.f_code.co_filename, package) == "port"]
    if not own:
        return ""
    frame = own[-1]
    d = next((n for n, name in dims.items() if name == "d" or name.startswith("d = ")), None)

    def size(n: int) -> str:
        if n in dims:
            return f"{n} = {dims[n]}"
        if d and n % d == 0 and n > d:
            return f"{n} = {n // d}·d"
        return str(n)

    held, empty = [], []
    for name, value in frame.f_locals.items():
        shape = getattr(value, "shape", None)
        if name.startswith("_") or name == "self":
            continue
        if value is None and name in VALUE_NAMES:
            empty.append(name)
        elif isinstance(shape, tuple) and shape and all(isinstance(n, int) for n in shape):
            held.append((name in VALUE_NAMES, f"{name} ({', '.join(size(n) for n in shape)})"))  # (1, 3, 8 = d)
    held = [said for _, said in sorted(held, key=lambda h: not h[0])][:5]  # DFlash's values first
    if not held and not empty:
        return ""
    parts = [f"it held {'; '.join(held)}"] if held else []
    parts += [f"{', '.join(empty)} None"] if empty else []
    return f"when the port fell over in {frame.f_code.co_name}() " + ", and ".join(parts)


def timed_out(error: BaseException) -> bool:
    return isinstance(error, (OutOfTime, subprocess.TimeoutExpired, TimeoutError))


def timeout_detail(error: BaseException, seconds: float | None) -> str:
    if isinstance(error, OutOfTime):
        return f"the port's run did not finish in {seconds:g} s (verify --timeout)"
    return f"{type(error).__name__}: {error}"


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Raise OutOfTime into the body after `seconds` (None: no limit). A timer signal, so only on the main thread
    of a POSIX system; elsewhere the limit is not applied."""
    usable = (
        seconds is not None and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise OutOfTime()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
