"""A progress line on stderr for the main job's longer loops, so that stdout stays the story alone.

Hand-made rather than tqdm: tqdm comes only with transformers (the hf extra), and parts 1, 2 and 4 of
the walkthrough run without it. Every redraw starts with a carriage return and the line ends with a
bare newline, the two shapes notebooks.py's `_without_progress_noise` drops from committed notebooks.
"""

from __future__ import annotations

import sys
import time

from ..decoding import Step


class Progress:
    """`   label [#####.....] done/total unit, elapsed`, redrawn in place (at most every `every` s and at
    the end); `Progress(..., on=False)` draws nothing."""

    def __init__(self, label: str, total: int, unit: str = "", on: bool = True, every: float = 0.2) -> None:
        self.label, self.total, self.unit, self.on, self.every = label, max(total, 1), unit, on, every
        self.done, self.started, self.drawn = 0, time.perf_counter(), float("-inf")
        self._draw(force=True)

    def update(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self._draw(force=self.done == self.total)

    def on_step(self, step: Step) -> None:
        """A decode step's committed tokens (τ accepted + the bonus), for `spec_generate(on_step=...)`."""
        self.update(step.acceptance_length + 1)

    def close(self) -> None:
        if self.on:
            self._draw(force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.on = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.on or (not force and now - self.drawn < self.every):
            return
        self.drawn, filled = now, round(20 * self.done / self.total)
        unit = f" {self.unit}" if self.unit else ""
        sys.stderr.write(
            f"\r   {self.label} [{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total}{unit}, "
            f"{now - self.started:.0f} s"
        )
        sys.stderr.flush()
