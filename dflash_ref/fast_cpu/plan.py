"""Which exact fp32 kernel computes y = x · Wᵀ, (N, d_in) × (d_out, d_in)ᵀ → (N, d_out), fastest on
the machine at hand: measured once per (d_out, d_in, N) and thread count, at first use, kept for the
process and stored for the next ones (below). The kernels differ by float rounding only (the order
of the d_in-term sums):

    linear           F.linear(x, W)                          torch's own, the default: always a candidate
    duplicated-row   (W · [x; x]ᵀ)[:, 0]ᵀ                     N = 1: the matrix-matrix kernel, not gemv
    rows-first       (W · xᵀ)ᵀ                               N ≥ 2
    sliced           (Σ_j W[:, S_j] · x[:, S_j]ᵀ)ᵀ             N ≥ 2, d_in > 768: slices S_j of ≤ 768 columns
    transposed       x · W_t,  W_t = Wᵀ made contiguous once
    streamed         the C product of fast_cpu/streamed.py: W read once for all N rows, sums in
                     16 interleaved partial sums (where a C compiler built it)

`sliced` and `transposed` read copies of W that a PlannedLinear keeps (fast_cpu/linear.py), so
they are candidates only there, for a weight of at most 2²⁴ elements. Each candidate is timed with
the weight *cold*, as in a decoding forward, whose weights stream from memory: every call reads a
different copy of a W-shaped weight from a pool larger than twice the last-level cache (a weight
that large is timed as it is); the candidates take turns product by product, REPEATS rounds. A
kernel replaces F.linear only when it is at most MARGIN times as slow in the median pair (its i-th
sample over F.linear's i-th, taken moments apart: a slow or quiet minute of a shared machine hits
both), and a kernel that needs copies of W only when it beats the others so: ties and noise keep
F.linear, and memory is spent only where it pays; between the others, `candidates`' order decides a
tie. A plan measured is also written to the cache folder, and later processes on the same machine
read it instead of measuring again (fast_cpu/plan_store.py). DFLASH_REF_LINEAR (or
`set_linear_mode`) pins the plan: `measured` (the default), `linear` (F.linear everywhere), `rows-first`
(duplicated-row for one row, rows-first for 2 … 64: the rule this project used before it measured).
`measuring_seconds()`: what measuring and storing cost this process (bench.timing.Stopwatch leaves it out of a
pass's time).
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F

from . import plan_store, streamed

ENV = "DFLASH_REF_LINEAR"
MODES = ("measured", "linear", "rows-first")
MEASURED_ROWS = range(1, 65)  # row counts planned (decoding's); prefill's many rows keep F.linear
MARGIN = 0.95  # a kernel must be ≥ 5 % faster than F.linear (median pair) to replace it
REPEATS = 7  # rounds of interleaved products per candidate (after one warm-up round)
SPLIT_WIDTH = 768  # the widest slice of d_in
MAX_COPY = 1 << 24  # elements; a larger weight is not copied (sliced, transposed)
MAX_SLOTS = 256  # cold copies in the pool at most (tiny weights: overhead-bound anyway)


def _rows_first(flat: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """y = (W · xᵀ)ᵀ: x (N, d_in), parts [W] → (N, d_out)."""
    return (parts[0] @ flat.T).T.contiguous()  # (d_out, N) → (N, d_out)


def _duplicated_row(flat: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """y = (W · [x; x]ᵀ)[:, 0]ᵀ: x (1, d_in), parts [W] → (1, d_out)."""
    return (parts[0] @ torch.cat([flat, flat]).T)[:, :1].T.contiguous()  # (d_out, 2) → (1, d_out)


def _sliced(flat: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """y = (Σ_j W[:, S_j] · x[:, S_j]ᵀ)ᵀ: x (N, d_in), parts the slices W[:, S_j] in order → (N, d_out)."""
    y_t, start = parts[0] @ flat[:, : parts[0].shape[1]].T, parts[0].shape[1]  # (d_out, N)
    for piece in parts[1:]:  # yᵀ += W[:, S_j] · x[:, S_j]ᵀ
        y_t.addmm_(piece, flat[:, start : start + piece.shape[1]].T)
        start += piece.shape[1]
    return y_t.T.contiguous()  # (d_out, N) → (N, d_out)


KERNELS: dict[str, Callable[[torch.Tensor, list[torch.Tensor]], torch.Tensor]] = {
    "linear": lambda flat, parts: F.linear(flat, parts[0]),
    "duplicated-row": _duplicated_row,
    "rows-first": _rows_first,
    "sliced": _sliced,
    "transposed": lambda flat, parts: flat @ parts[0],  # (N, d_in) · (d_in, d_out)
    "streamed": lambda flat, parts: streamed.product(flat, parts[0]),  # checked by linear_product, candidates
}
COPIES: dict[str, Callable[[torch.Tensor], list[torch.Tensor]]] = {  # W → the parts a kernel reads
    "sliced": lambda w: [p.contiguous() for p in torch.tensor_split(w, -(-w.shape[1] // SPLIT_WIDTH), dim=1)],
    "transposed": lambda w: [w.T.contiguous()],  # (d_in, d_out)
}

_mode: str | None = None  # None: read DFLASH_REF_LINEAR at the next product
_plans: dict[tuple, plan_store.Plan] = {}  # key → (kernel, each candidate's samples)
_from_store: set[tuple] = set()  # keys of _plans read from the store, not measured here
_spent = [0.0]  # seconds spent measuring and storing plans (measuring_seconds)


def check_mode(mode: str, source: str = ENV) -> str:
    """`mode` if it is one of MODES, else a ValueError naming where it came from."""
    if mode not in MODES:
        raise ValueError(f"{source}={mode!r} is not a linear plan; choose one of {', '.join(MODES)}")
    return mode


def linear_mode() -> str:
    """The plan in force: set_linear_mode's, else DFLASH_REF_LINEAR's (read once), else `measured`."""
    global _mode
    if _mode is None:
        _mode = check_mode(os.environ.get(ENV, "measured"))
    return _mode


def set_linear_mode(mode: str | None) -> str | None:
    """Pin the plan (one of MODES), or None to read DFLASH_REF_LINEAR again; → the mode it replaces."""
    global _mode
    previous, _mode = _mode, None if mode is None else check_mode(mode, "set_linear_mode")
    return previous


@contextlib.contextmanager
def linear_mode_as(mode: str):
    """Products inside this block take `mode`'s plan (measured plans stay cached for later)."""
    previous = set_linear_mode(mode)
    try:
        yield
    finally:
        set_linear_mode(previous)


def candidates(d_in: int, rows: int, with_copies: bool, d_out: int = 1) -> tuple[str, ...]:
    """The kernels that may compute a product of `rows` rows, in the order `choose` walks them: F.linear,
    the C product, torch's other products, then those that read copies of W. The C product goes first among
    ties: timed alone, the duplicated row comes within a few per cent of it, while in a whole decoding step
    the C product's products left more time to the rest (`bench steps`: figures/bench/bench.md)."""
    sizes_fit = max(d_in, d_out) <= streamed.MAX_SIZE  # the C code's sizes are ints
    names = [
        "linear",
        *(["streamed"] if streamed.available() and sizes_fit else []),
        "duplicated-row" if rows == 1 else "rows-first",
    ]
    if with_copies:
        names += ["transposed"] + (["sliced"] if rows > 1 and d_in > SPLIT_WIDTH else [])
    return tuple(names)


def kernel_for(
    weight: torch.Tensor, rows: int, with_copies: bool, clock: Callable[[], float] = time.perf_counter
) -> str:
    """The kernel for x (rows, d_in) · weightᵀ under the plan in force; a measured one is read from
    the store, else timed, at its shape's first product in this process, and kept for the process.
    `clock` may be a fake (for tests): a plan it times is neither read from nor written to the store."""
    mode = _mode or linear_mode()
    if mode != "measured":
        return "linear" if mode == "linear" else "duplicated-row" if rows == 1 else "rows-first"
    key = (*weight.shape, rows, with_copies, weight.dtype, torch.get_num_threads())
    if key not in _plans:
        names = candidates(weight.shape[1], rows, with_copies, weight.shape[0])
        real = clock is time.perf_counter  # see the docstring
        stored = plan_store.lookup(key, names) if real else None
        if stored is not None:  # its samples decide, by today's rule
            _plans[key] = (choose(stored[1]), stored[1])
            _from_store.add(key)
        else:
            started, times = time.perf_counter(), measure(weight, rows, names, clock)
            _plans[key] = (choose(times), times)
            if real:
                plan_store.add(key, _plans[key])
            _spent[0] += time.perf_counter() - started
    return _plans[key][0]


def measuring_seconds() -> float:
    """Seconds this process has spent measuring plans and writing them to the store, all shapes together."""
    return _spent[0]


def choose(times: dict[str, list[float]], margin: float = MARGIN) -> str:
    """Walk the candidates in their order (F.linear, then the kernels that need no copy of W, then
    those that do) and take each one that is clearly faster than the one taken so far: the median of
    its samples' ratios to that one's, pair by pair (`measure` times the candidates in turn, so the
    i-th samples of two kernels are moments apart), at most `margin`. Pairs cancel what a shared
    machine's load does to both; a stall of one sample moves one ratio, not the median, so the paired
    median chooses alike more often than a comparison of the two medians."""
    chosen = "linear"
    for name, t in times.items():
        if statistics.median(a / b for a, b in zip(t, times[chosen])) <= margin:
            chosen = name
    return chosen


def measure(
    weight: torch.Tensor,
    rows: int,
    names: tuple[str, ...],
    clock: Callable[[], float] = time.perf_counter,
    repeats: int = REPEATS,
) -> dict[str, list[float]]:
    """Seconds of each product of each named kernel, weights cold (see the module's docstring): one
    warm-up round, then `repeats` rounds of `products_per_round` products per kernel, the kernels
    taking turns product by product (no kernel runs twice in a row, as in a forward), each product
    on the next copy of the pool."""
    x = torch.full((rows, weight.shape[1]), 1e-2, dtype=weight.dtype)  # (N, d_in); no draw from torch's RNG
    count = copies_in_pool(weight)
    buffer = torch.full((count * weight.numel(),), 1e-3, dtype=weight.dtype) if count >= 2 else None
    slots = {name: _cold_slots(weight, name, buffer) for name in names}  # name → [parts of one copy, …]
    times: dict[str, list[float]] = {name: [] for name in names}
    position = 0  # walks the pool round-robin
    for round_ in range(repeats + 1):
        for _ in range(products_per_round(weight)):
            for name in names:
                pool = slots[name]
                t0 = clock()
                KERNELS[name](x, pool[position % len(pool)])
                elapsed = clock() - t0
                if round_:
                    times[name].append(elapsed)
                position += 1
    return times


def copies_in_pool(weight: torch.Tensor) -> int:
    """How many copies of W fit in the pool (at most MAX_SLOTS); below 2, W itself is timed."""
    return min(MAX_SLOTS, pool_bytes() // (weight.element_size() * weight.numel()))


def products_per_round(weight: torch.Tensor) -> int:
    """Products per kernel in one round: 1 for a weight as large as the pool, up to 16 for small ones."""
    return min(16, max(1, copies_in_pool(weight) // 4))


def _cold_slots(weight: torch.Tensor, name: str, buffer: torch.Tensor | None) -> list[list[torch.Tensor]]:
    """Copies of the parts `name` reads (its COPIES layout, or W's shape) carved out of `buffer`, a
    pool of twice the last-level cache, so that each is cold when its turn comes round; without a
    buffer (a weight as large as the pool, cold by itself) W itself, or one copy of its parts."""
    if buffer is None:
        return [COPIES[name](weight.detach()) if name in COPIES else [weight]]
    shapes = (
        [p.shape for p in COPIES[name](torch.empty(weight.shape, device="meta"))] if name in COPIES else [weight.shape]
    )
    slots, offset = [], 0
    while offset + weight.numel() <= buffer.numel():
        parts = []
        for s in shapes:
            parts.append(buffer[offset : offset + math.prod(s)].view(s))  # (flat,) → a contiguous part
            offset += math.prod(s)
        slots.append(parts)
    return slots


def pool_bytes() -> int:
    """Twice the last-level cache this process sees, at least 64 MiB."""
    return max(64 << 20, 2 * plan_store.last_level_cache())


def plans() -> list[dict]:
    """Plans in use here: shape, rows, each kernel's median µs ("" if no candidate), the choice, measured
    now or stored."""
    return [
        {
            "d_out": key[0],
            "d_in": key[1],
            "rows": key[2],
            "threads": key[5],
            "chosen": name,
            "measured": "earlier (stored)" if key in _from_store else "now",
            **{f"{n} (µs)": 1e6 * statistics.median(times[n]) if n in times else "" for n in KERNELS},
        }
        for key, (name, times) in _plans.items()
    ]


def forget_plans(stored: bool = False) -> None:
    """Drop every plan of this process (each is read from the store, or measured, at its shape's next
    product); `stored`: delete the store file too, so that every plan is measured afresh."""
    _plans.clear()
    _from_store.clear()
    plan_store.forget(delete=stored)
