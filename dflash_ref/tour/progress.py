"""A progress bar for the walkthrough's decodes on SmolLM2, by tqdm, on stderr: the terminal redraws it in
place, and so does a notebook's output (the walkthrough drops it from the notebooks it writes), while
stdout keeps the story alone.

The bar counts tokens over one or more decodes of `tokens` new tokens each: the prefill's token, then each
step's τ + 1 as the step is committed. A decode that a stop token ends early takes the rest of its budget
at its end, so the bar always ends at its total.
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from ..decoding import Step


class DecodeProgress:
    """`with DecodeProgress(label, tokens, decodes) as bar:` then `spec_generate(..., on_step=bar.on_step)`
    and `bar.end_decode()` after each decode; `on=False` draws nothing (and still counts)."""

    def __init__(self, label: str, tokens: int, decodes: int = 1, on: bool = True) -> None:
        self.tokens, self.done, self.prompt_len = tokens, 0, None  # done: the decodes before this one, in tokens
        self.count = 0  # tokens counted so far (tqdm's own count stays 0 when the bar is off)
        self.bar = tqdm(total=tokens * decodes, desc=f"   {label}", unit="tok", file=sys.stderr, disable=not on,
                        mininterval=0.2, ncols=100)  # fmt: skip

    def on_step(self, step: Step) -> None:
        """After step `step`: x_0 (the prefill's token) and every token committed since, in this decode."""
        if step.index == 0:
            self.prompt_len = step.block.start  # x_0 sits right after the prompt
        self._count(self.done + step.block.start + step.produced + 1 - self.prompt_len)

    def end_decode(self) -> None:
        self.done += self.tokens
        self._count(self.done)

    def _count(self, count: int) -> None:
        self.bar.update(count - self.count)
        self.count = count

    def __enter__(self) -> DecodeProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
