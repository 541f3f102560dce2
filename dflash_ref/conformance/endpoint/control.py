"""The control: the reference itself in the engine's dtype, on the same prompts: what a correct engine's rounding
does, measured, for the server's departures from the target's float64 argmax to be held to over the run.

Each departure is judged where it is (ties.py: a tie under one ulp, within the dtype's drift measured there, or a
FAIL). But a bug can hide in the drift: a target whose RoPE base is read wrongly departs at margins as
small as a correct engine's, at many more positions. So the control, the target decoded greedily in the engine's
dtype on each prompt (with its cache, as an engine decodes), is replayed in float64 as the server's outputs are,
and the server's departures are held to its rate:

    n, N   the server's departures, and the output positions replayed
    c, C   the control's, likewise
    FAIL   where P(Poisson(N · (c + 1) / C) ≥ n) < ALPHA: far more departures than the dtype's rounding makes

The figures of both (departures, requests with one, the earliest, the largest margin over its drift) go in the
report, so the verdict is stated with the measurement it rests on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ...decoding import generate

ALPHA = 1e-3  # a one-sided Poisson tail this unlikely at the control's rate is a FAIL


@dataclass
class Departures:
    """Where a run's outputs leave the float64 argmax (ties.Divergence lists): its figures."""

    name: str  # "the server", "the control"
    positions: int = 0  # output positions replayed
    requests: int = 0
    departed: int = 0  # requests with at least one departure
    count: int = 0  # departures, ties included
    earliest: int | None = None  # the earliest position of any request's first departure
    worst: float = 0.0  # the largest margin / drift of a departure past one ulp
    first: list[int] = field(default_factory=list)  # each departing request's first departure

    def add(self, divergences, length: int) -> None:
        """One request: its output of `length` tokens and its departures."""
        self.positions += length
        self.requests += 1
        self.count += len(divergences)
        if divergences:
            self.departed += 1
            self.first.append(divergences[0].index)
            self.earliest = min(divergences[0].index, self.earliest if self.earliest is not None else length)
        for d in divergences:
            if not d.tie and d.drift:
                self.worst = max(self.worst, d.margin / d.drift)

    def said(self) -> str:
        earliest = f", the first at {self.earliest}" if self.earliest is not None else ""
        worst = f", a margin up to {self.worst:.2f} × its measured drift" if self.worst else ""
        return (
            f"{self.name} departs from the float64 argmax at {self.count} of {self.positions} positions, in "
            f"{self.departed} of {self.requests} requests{earliest}{worst}"
        )

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def poisson_tail(n: int, rate: float) -> float:
    """P(X ≥ n) for X ~ Poisson(rate)."""
    if n <= 0:
        return 1.0
    term, below = math.exp(-rate), 0.0
    for k in range(n):
        below += term
        term *= rate / (k + 1)
    return max(0.0, 1.0 - below)


def held_to_control(server: Departures, control: Departures) -> tuple[bool, str]:
    """(failed, the sentence): the server's departures against the control's rate (module docstring)."""
    if control.positions == 0 or server.positions == 0:
        return False, "no departures compared with the control: no output positions replayed"
    rate = server.positions * (control.count + 1) / control.positions
    p = poisson_tail(server.count, rate)
    figures = f"{server.said()}; {control.said()}"
    if p < ALPHA:
        return True, (
            f"{figures}: far more often than its dtype's rounding does (P = {p:.1e} < {ALPHA:g} at the control's "
            "rate): a bug, whose departures may each look like rounding"
        )
    return False, f"{figures}: about as often as its dtype's rounding does (P = {p:.2f} at the control's rate)"


@torch.inference_mode()
def control_output(target_d, prompt_ids: list[int], max_new_tokens: int, stop_ids: list[int]) -> list[int]:
    """The control's output for one prompt: the target in the engine's dtype, greedy, with its cache."""
    device = next(target_d.parameters()).device
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)  # (1, L)
    return generate(target_d, ids, max_new_tokens, stop_ids).output_ids[0, len(prompt_ids) :].tolist()
