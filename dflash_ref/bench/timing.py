"""Timing: the machine a number comes from (machine(): its CPU, and a probe's speed), seconds spent inside a
module's forwards (Stopwatch, forward hooks, CUDA synchronised), and the side-by-side harness of the benchmarks
(variants interleaved round-robin, medians, paired ratios).

    clock = Stopwatch(draft, device); …run…; clock.seconds, clock.calls, clock.times; clock.remove()
    summarise(measure({"a": fn_a, "b": fn_b}, repeats), baseline="a")

On the opt-in fast CPU path (fast_cpu/), a pass's time leaves out what measuring its linear
plans took inside it (a first run on a machine measures them, later ones read them); clock.planning is
that time, all passes together (two clocks on nested modules would each count the inner one's).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..fast_cpu import measuring_seconds


class Stopwatch:
    def __init__(self, module: torch.nn.Module, device: torch.device | str = "cpu") -> None:
        self.times: list[float] = []
        self.planning = 0.0  # seconds of linear plans measured inside the passes
        self._t0 = self._planned = 0.0
        self._sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
        self._handles = [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._stop)]

    def _start(self, *_) -> None:
        self._sync()
        self._t0, self._planned = time.perf_counter(), measuring_seconds()

    def _stop(self, *_) -> None:
        self._sync()
        planned = measuring_seconds() - self._planned
        self.planning += planned
        self.times.append(time.perf_counter() - self._t0 - planned)

    @property
    def seconds(self) -> float:
        return sum(self.times)

    @property
    def calls(self) -> int:
        return len(self.times)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def measure(
    variants: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, list[float]]:
    """Seconds per call of each variant, interleaved so that drift hits all variants alike."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        progress(f"repeat {i + 1}/{repeats}")
    return times


def paired_ratio(times: list[float], baseline: list[float]) -> float:
    """The median of times[i] / baseline[i]: `measure` takes each repeat's samples of all variants in turn,
    moments apart, so a slow or quiet minute of a shared machine cancels out of each ratio."""
    return statistics.median(a / b for a, b in zip(times, baseline, strict=True))


def summarise(times: dict[str, list[float]], baseline: str) -> list[dict]:
    """A row per variant: its median, min and max seconds, and its ratio to the baseline, paired (paired_ratio)."""
    return [
        {
            "variant": name,
            "median_s": statistics.median(t),
            "min_s": min(t),
            "max_s": max(t),
            "ratio": paired_ratio(t, times[baseline]),
        }
        for name, t in times.items()
    ]


def machine_speed(repeats: int = 15) -> str:
    """One fixed product timed on this machine, so that tables run on different machines can be told
    apart: the ratios depend on it (a machine that streams weights slower makes the target's step
    dearer and a verify of a few tokens relatively cheaper). SmolLM2's lm_head shape, fp32, two
    columns: (49152, 576) · (576, 2), 113 MB of weights read."""
    weight, x = torch.randn(49152, 576), torch.randn(576, 2)
    median = statistics.median(measure({"probe": lambda: weight @ x}, repeats)["probe"])  # (49152, 2)
    return f"probe {median * 1e3:.1f} ms ({weight.numel() * 4 / median / 1e9:.0f} GB/s: 49152×576 fp32 by 2 columns)"


def cpu_model() -> str:
    """The CPU's model name as lscpu gives it (/proc/cpuinfo's `model name`), else platform's guess."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(speed: bool = True) -> str:
    """What a page or a table's footer says of the machine: CPU, threads, torch, Python, date, and (`speed`) the
    probe's speed: a benchmark's ratios depend on it, acceptance (evaluate) does not, so that one times nothing."""
    return (
        f"{cpu_model()} ({platform.machine()}), {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
        + (f", {machine_speed()}" if speed else "")
    )
