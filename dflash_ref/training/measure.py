"""Measuring a draft: the share of decode steps that accept block position k, and τ.

    a_k = #{whole-block steps with ≥ k proposals accepted and emitted} / #{whole-block steps},  k = 1 … b − 1
    τ   = tokens committed per step (bonus included), the steps pooled (`tally`) or per prompt, then
          averaged over prompts (`mean_of_prompts`, as `dflash`'s benchmark.py reports it)

What `train`'s held-out evaluation, `evaluate` and `bench trained` all report, and how they print it.
"""
from __future__ import annotations

from ..decoding import spec_generate
from ..target.smollm2 import chat_ids


def acceptance_by_position(draft, target, tokenizer, prompt_list, max_new_tokens=64, stop=(2,),
                           block_size: int | None = None, outputs: list | None = None,
                           verify_gate: float | None = None,
                           records: list | None = None, done=None) -> tuple[list[float | None], float | None]:
    """Greedy on each prompt: the fraction of full-block decode steps (the whole block drafted and
    verified) in which block position k (1 … b − 1) was accepted, and the mean tokens per step over
    all steps (the paper's τ): `tally` of every step. Each prompt's GenerationOutput is appended to
    `outputs` and its list of step records to `records`, if given; `done(i)` is called after the i-th."""
    b = block_size or draft.block_size
    steps = []
    for i, prompt in enumerate(prompt_list, 1):
        mine = []
        out = spec_generate(draft, target, chat_ids(tokenizer, prompt), max_new_tokens, list(stop), block_size=b,
                            verify_gate=verify_gate, on_step=mine.append)
        if outputs is not None:
            outputs.append(out)
        if records is not None:
            records.append(mine)
        steps += mine
        if done is not None:
            done(i)
    return tally(steps, b)


def tally(steps, block_size: int) -> tuple[list[float | None], float | None]:
    """From spec_generate's step records: a_k = the share of whole-block steps (all b tokens verified)
    with at least k proposals accepted and emitted, k = 1 … b − 1 (None when no step verified a whole
    block: too few tokens asked for one), and τ = tokens produced per step, the steps pooled (None: no
    step). A proposal the target accepted after a stop token is never emitted, so it is not counted:
    a step emits min(τ, produced) of its accepted proposals (`emitted`)."""
    whole = [emitted(r.acceptance_length, r.produced) for r in steps if len(r.block_ids) == block_size]
    by_position = [sum(a >= k for a in whole) / len(whole) if whole else None for k in range(1, block_size)]
    return by_position, sum(r.produced for r in steps) / len(steps) if steps else None


def emitted(accepted: int, produced: int) -> int:
    """Accepted proposals that a step emitted: all τ of them, unless a stop token among them cut the
    step to `produced` ≤ τ tokens (the token limit never does: a step drafts only what fits)."""
    return min(accepted, produced)


def mean_of_prompts(records: list[list]) -> float | None:
    """τ as dflash's benchmark.py averages it ("Average Acceptance length"): each prompt's tokens per
    step, then the mean over prompts (those with no step left out; None if none has one). `tally`
    pools the steps instead, so a prompt decoded in many short steps weighs more there."""
    per_prompt = [sum(r.produced for r in steps) / len(steps) for steps in records if steps]
    return sum(per_prompt) / len(per_prompt) if per_prompt else None


def number(value: float | None, digits: int = 3) -> str:
    """A measured value as the reports print it; n/a where nothing was measured (None)."""
    return "n/a" if value is None else f"{value:.{digits}f}"


def fractions(values, digits: int = 3) -> str:
    """Acceptance fractions as the reports print them: 0.525, 0.252, 0.111 (n/a: no step verified a
    whole block)."""
    return ", ".join(number(a, digits) for a in values)
