"""Measuring a draft: the share of decode steps that accept block position k, and τ + 1 (tokens per step).

    a_k   = #{whole-block steps with ≥ k proposals accepted and emitted} / #{whole-block steps},  k = 1 … b − 1
    τ + 1 = tokens committed per step (τ accepted proposals + the bonus), the steps pooled (`tally`) or per
            prompt, then averaged over prompts (`mean_of_prompts`, as `dflash`'s benchmark.py reports it)
    a DFlash 2 draft's path against the argmax of its own logits (`path_against_argmax`)

What `train`'s held-out evaluation, `evaluate` and `bench trained` all report, and how they print it.
"""

from __future__ import annotations

from ..decoding import spec_generate
from ..extensions import chosen_extensions
from ..hooks import hooks
from ..loading.smollm2 import chat_ids
from ..trace import StepLog


def acceptance_by_position(
    draft,
    target,
    tokenizer,
    prompt_list,
    max_new_tokens=64,
    stop=(2,),
    block_size: int | None = None,
    outputs: list | None = None,
    verify_gate: float | None = None,
    records: list | None = None,
    done=None,
    lookup: int | None = None,
    on_step=None,
) -> tuple[list[float | None], float | None]:
    """Greedy on each prompt: the fraction of full-block decode steps (the whole block drafted and
    verified) in which block position k (1 … b − 1) was accepted, and the mean tokens per step over
    all steps (τ + 1, the paper's acceptance length): `tally` of every step (with `lookup`,
    extensions/prompt_lookup.py, its steps count too: a_k and τ + 1 are then the decoder's, not the
    draft's alone). The draft proposes in its own vocabulary where it has one, as the commands decode it
    (extensions.chosen_extensions). Each prompt's GenerationOutput is appended to `outputs` and its list
    of step records to `records`, if given; `done(i)` is called after the i-th, and `on_step(step)` after
    each of its steps (spec_generate's)."""
    b = block_size or draft.block_size
    steps, extensions = [], chosen_extensions(draft, target, verify_gate, lookup)
    for i, prompt in enumerate(prompt_list, 1):
        mine = StepLog()
        out = spec_generate(
            draft,
            target,
            chat_ids(tokenizer, prompt),
            max_new_tokens,
            list(stop),
            block_size=b,
            extensions=extensions,
            on_step=mine if on_step is None else lambda step, mine=mine: (mine(step), on_step(step)),
        )
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
    block: too few tokens asked for one), and τ + 1 = tokens produced per step, the steps pooled (None:
    no step). A proposal the target accepted after a stop token is never emitted, so it is not counted:
    a step emits min(τ, produced) of its τ accepted proposals (`emitted`)."""
    whole = [emitted(r.acceptance_length, r.produced) for r in steps if len(r.block_ids) == block_size]
    by_position = [sum(a >= k for a in whole) / len(whole) if whole else None for k in range(1, block_size)]
    return by_position, sum(r.produced for r in steps) / len(steps) if steps else None


def emitted(accepted: int, produced: int) -> int:
    """Accepted proposals that a step emitted: all τ of them, unless a stop token among them cut the
    step to `produced` ≤ τ tokens (the token limit never does: a step drafts only what fits)."""
    return min(accepted, produced)


def mean_of_prompts(records: list[list]) -> float | None:
    """τ + 1 as dflash's benchmark.py averages it ("Average Acceptance length"): each prompt's tokens per
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


def best_candidate(candidates, unary):
    """The argmax of the draft logits, from the selector's top K: the candidate of largest unary z.
    candidates, unary (…, K) → (…)."""
    return candidates.gather(-1, unary.argmax(-1, keepdim=True))[..., 0]


def per_prompt(per_pass: list, outputs: list, what: str) -> list[list]:
    """A list with one entry per draft pass, logged over several prompts' greedy runs in order, split
    into each prompt's share: a prompt makes one pass per step, so output i takes the next
    len(acceptance_lengths) entries. Counts that do not add up are refused, naming `what` was logged."""
    rest, shares = list(per_pass), []
    for out in outputs:
        steps = len(out.acceptance_lengths)
        if out.num_draft_passes != steps or len(rest) < steps:
            raise ValueError(
                f"a prompt of {steps} steps made {out.num_draft_passes} draft passes, and "
                f"{len(rest)} {what} are left for it: these are not its passes"
            )
        shares.append(rest[:steps])
        rest = rest[steps:]
    if rest:
        raise ValueError(f"{len(rest)} {what} left over: they do not belong to these outputs' draft passes")
    return shares


def selector_log(draft, run) -> tuple[object, list[tuple]]:
    """(run()'s result, per pass of a DFlash 2 `draft` while it ran, in order: its candidates c_{t,k} (γ, K)
    and the argmax of its draft logits (γ,)), read at `draft.candidate_selector.hook_candidates` and
    `hook_unary`. The candidates are the top K of the logits, so their best unary z is the argmax."""
    candidates, unary = [], []

    def read(tensor, point):  # (1, γ, K), once per pass each
        (candidates if point.name.endswith("hook_candidates") else unary).append(tensor[0])

    names = ("draft.candidate_selector.hook_candidates", "draft.candidate_selector.hook_unary")
    with hooks(draft, read, lambda name: name in names):
        result = run()
    return result, [(c, best_candidate(c, z)) for c, z in zip(candidates, unary)]


def path_against_argmax(records: list[list], choices: list[tuple], outputs: list) -> dict[str, float | int]:
    """What the candidate selector's path did, against the argmax of the same draft logits (DFlash 1's
    proposal from this draft), over every step of greedy runs: `records` and `outputs` per prompt
    (acceptance_by_position's), `choices` per draft pass (`selector_log`). The draft logits do not
    depend on the path, and the output is the target's own greedy decoding (lossless), so its tokens
    y_1..y_γ after each step's anchor say what either proposal would have had accepted:

        accepted_path   = mean over steps of the matched prefix of the path    d_t = y_t
        accepted_argmax = mean over steps of the matched prefix of the argmax  a_t = y_t
        at the decisive positions (d_1..d_{t−1} matched, so position t decided how far the step went):
        recall = share with y_t among the K candidates (the most the selector can get right),
        argmax = share with a_t = y_t, path = share with d_t = y_t, and where d_t ≠ a_t ("moved")
        which of the two was y_t."""
    tally = dict.fromkeys(
        (
            "steps",
            "decisive",
            "in candidates",
            "argmax right",
            "path right",
            "moved",
            "moved, path right",
            "moved, argmax right",
        ),
        0,
    )
    matched = {"path": 0, "argmax": 0}
    for steps, out, mine in zip(records, outputs, per_prompt(choices, outputs, "selector records"), strict=True):
        if len(steps) != len(out.acceptance_lengths):
            raise ValueError(
                f"{len(steps)} step records for an output of {len(out.acceptance_lengths)} steps: "
                f"these are not its records"
            )
        for record, (candidates, argmax) in zip(steps, mine):
            truth = out.output_ids[0, record.start + 1 : record.start + 1 + len(record.draft_tokens)].tolist()
            path, argmax = record.draft_tokens[: len(truth)], argmax[: len(truth)].tolist()
            tally["steps"] += 1
            prefix = {
                name: next((t for t, (p, y) in enumerate(zip(proposal, truth)) if p != y), len(truth))
                for name, proposal in (("path", path), ("argmax", argmax))
            }
            if len(truth) == len(record.draft_tokens) and prefix["path"] != record.acceptance_length:
                raise ValueError(
                    f"step {record.step}: the output's tokens accept {prefix['path']} of the path, the "
                    f"step record {record.acceptance_length}: the output is not this run's"
                )
            for name in matched:
                matched[name] += prefix[name]
            for t, y in enumerate(truth):  # the decisive positions: the path's prefix right so far
                moved = path[t] != argmax[t]
                tally["decisive"] += 1
                tally["in candidates"] += y in candidates[t].tolist()
                tally["argmax right"] += argmax[t] == y
                tally["path right"] += path[t] == y
                tally["moved"] += moved
                tally["moved, path right"] += moved and path[t] == y
                tally["moved, argmax right"] += moved and argmax[t] == y
                if path[t] != y:
                    break
    steps = max(tally["steps"], 1)
    return {"accepted/step, path": matched["path"] / steps, "accepted/step, argmax": matched["argmax"] / steps, **tally}
