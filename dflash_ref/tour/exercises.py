"""The notebooks' exercises, of two kinds.

Predict, then run (`check`): the learner sets a variable to a prediction, and a cell runs the library and holds
the prediction to what it did.

Write it (`exercise`): the learner writes one function of DFlash in plain torch (the context projection, the
sliced-Q RoPE, the acceptance rule, DFlash 2's convolution), and the exercise holds it to the library's own on
cases made by hand and at random. The cases are float64, where a correct function agrees with the library to
~1e-15 and a wrong one misses by far more, so the limit (TOLERANCE) needs no taste; but where the library rounds
to float32 by design (an RMSNorm takes its statistic in float32 whatever its input, transformers' order), the
exercise allows float32's 2⁻²³ relative instead. A miss says the case, both answers and a hint;
`show_answer(name)` prints one answer (answers.py), only when asked.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..acceptance import acceptance_length
from ..context import project_context
from ..dynamic_conv import convolve
from ..rmsnorm import RMSNorm
from ..rope import apply_sliced_rope
from . import answers

TOLERANCE = 1e-9  # float64: a correct function is ~1e-15 off the library on these sizes
FLOAT32 = 2.0**-23 * 8  # a float32 statistic inside the library's computation: a few of float32's steps


def _same(prediction, actual) -> bool:
    """Equal as values: a list and a tuple of the same items are the same answer."""
    if isinstance(prediction, Sequence) and isinstance(actual, Sequence) and not isinstance(prediction, str):
        return not isinstance(actual, str) and list(prediction) == list(actual)
    return prediction == actual


def check(prediction, actual, why: str) -> None:
    """None: nothing predicted yet (said, the answer kept back). Else the prediction must equal what the run
    gave (as values: [2, 6] is (2, 6)): an AssertionError that says both and why, or a line that says it was
    right. (Nothing returned: the cell shows what it printed, nothing more.)"""
    if prediction is None:
        print("Predict first: set the variable above to your answer, then run this cell again.")
        return
    if not _same(prediction, actual):
        raise AssertionError(f"not quite: you predicted {prediction!r}, the run gave {actual!r}. {why}")
    print(f"right: {actual!r}. {why}")


@dataclass(frozen=True)
class Exercise:
    name: str
    library: Callable  # the library's answer, called with a case's arguments
    library_name: str  # where it lives, said when the learner's agrees
    cases: Callable[[torch.Generator], list[tuple[str, tuple]]]  # (what the case is, its arguments)
    hint: str
    answer: Callable  # answers.py's, shown by show_answer
    tolerance: float = TOLERANCE  # relative to max(1, max|expected|)


def _rms_norm(weight: torch.Tensor, eps: float) -> RMSNorm:
    norm = RMSNorm(weight.shape[0], eps).double()
    norm.weight.data.copy_(weight)
    return norm


def _library_context(target_hidden, fc_weight, norm_weight, eps):
    fc = torch.nn.Linear(fc_weight.shape[1], fc_weight.shape[0], bias=False).double()
    fc.weight.data.copy_(fc_weight)
    return project_context(target_hidden[None], fc, _rms_norm(norm_weight, eps))[0]


def _context_cases(g: torch.Generator) -> list[tuple[str, tuple]]:
    cases = []
    for length, k, d in ((1, 1, 4), (3, 2, 8), (5, 3, 6)):
        hidden = torch.randn(length, k * d, generator=g, dtype=torch.float64) * 3
        fc = torch.randn(d, k * d, generator=g, dtype=torch.float64) / (k * d) ** 0.5
        weight = 1 + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
        cases.append((f"L_c = {length}, k = {k}, d = {d}", (hidden, fc, weight, 1e-6)))
    return cases


def _library_rope(q, k, cos, sin):
    q_rot, k_rot = apply_sliced_rope(q[None], k[None], cos[None], sin[None])
    return q_rot[0], k_rot[0]


def _rope_cases(g: torch.Generator) -> list[tuple[str, tuple]]:
    cases = []
    for heads, kv_heads, q_len, k_len, d_h in ((1, 1, 1, 1, 2), (2, 1, 4, 7, 4), (4, 2, 3, 12, 8)):
        positions = torch.arange(k_len, dtype=torch.float64) + int(torch.randint(0, 50, (1,), generator=g))
        inv_freq = 10000.0 ** (-torch.arange(0, d_h, 2, dtype=torch.float64) / d_h)  # (d_h / 2,)
        angles = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)  # (L_k, d_h)
        q = torch.randn(heads, q_len, d_h, generator=g, dtype=torch.float64)
        k = torch.randn(kv_heads, k_len, d_h, generator=g, dtype=torch.float64)
        cases.append((f"H_q = {heads}, H_kv = {kv_heads}, L_q = {q_len}, L_k = {k_len}, d_h = {d_h}",
                      (q, k, angles.cos(), angles.sin())))  # fmt: skip
    return cases


def _library_acceptance(draft_tokens, posterior):
    return acceptance_length(torch.tensor([list(draft_tokens)]), torch.tensor([list(posterior)]))


def _acceptance_cases(g: torch.Generator) -> list[tuple[str, tuple]]:
    by_hand = [
        ("all three right", ([5, 9, 7], [5, 9, 7, 1])),
        ("the first wrong", ([4, 9, 7], [5, 9, 7, 1])),
        ("a miss, then a match that must not count", ([5, 8, 7], [5, 9, 7, 1])),
        ("one draft token, right", ([3], [3, 2])),
        ("the last wrong", ([1, 2, 3, 4], [1, 2, 3, 5, 6])),
    ]
    drawn = []
    for i in range(20):
        gamma = int(torch.randint(1, 8, (1,), generator=g))
        posterior = torch.randint(0, 3, (gamma + 1,), generator=g).tolist()  # few symbols: many matches
        draft = torch.randint(0, 3, (gamma,), generator=g).tolist()
        drawn.append((f"random case {i}", (draft, posterior)))
    return by_hand + drawn


def _library_convolve(x, taps, base, group_size):
    return convolve(x[None], taps[None], base, group_size)[0]


def _conv_cases(g: torch.Generator) -> list[tuple[str, tuple]]:
    cases = []
    for length, kernel, groups, width in ((1, 2, 1, 4), (4, 3, 2, 4), (6, 2, 4, 2), (2, 3, 1, 3)):
        d = groups * width
        x = torch.randn(length, d, generator=g, dtype=torch.float64)
        taps = torch.randn(length, kernel, groups, generator=g, dtype=torch.float64)
        base = torch.randn(kernel, d, generator=g, dtype=torch.float64)
        cases.append((f"L_q = {length}, J = {kernel}, G = {groups} groups of {width}", (x, taps, base, width)))
    return cases


EXERCISES = {
    e.name: e
    for e in [
        Exercise(
            "context projection",
            _library_context,
            "context.project_context",
            _context_cases,
            "C = RMSNorm(target_hidden @ W_fcᵀ), no bias; the RMSNorm is over the last dimension, "
            "w ⊙ x / √(mean(x²) + ε), with ε inside the root.",
            answers.context_projection,
            FLOAT32,  # the library's RMSNorm takes its statistic in float32
        ),
        Exercise(
            "sliced rope",
            _library_rope,
            "rope.apply_sliced_rope",
            _rope_cases,
            "K takes every row of cos and sin (one per key position); Q only the last L_q rows, the block's "
            "positions; rotate_half([a, b]) = [−b, a] over halves of d_h.",
            answers.sliced_rope,
        ),
        Exercise(
            "acceptance length",
            _library_acceptance,
            "acceptance.acceptance_length",
            _acceptance_cases,
            "compare d_j with posterior_{j−1}, the target's token at the position before it, and stop counting at "
            "the first miss: a later match does not count.",
            answers.acceptance_length,
        ),
        Exercise(
            "convolution",
            _library_convolve,
            "dynamic_conv.convolve",
            _conv_cases,
            "y_t = Σ_j (w_j + a_{t,j,g}) ⊙ x_{t−j}; a_{t,j,g} is one number per group g of group_size channels "
            "(repeat it over the group's channels); terms with t − j < 0 are 0: the block starts afresh.",
            answers.convolve,
        ),
    ]
}


def _agrees(mine, expected, tolerance: float) -> bool:
    if isinstance(expected, tuple):
        return (isinstance(mine, (tuple, list)) and len(mine) == len(expected)
                and all(_agrees(m, e, tolerance) for m, e in zip(mine, expected)))  # fmt: skip
    if isinstance(expected, torch.Tensor):
        mine = torch.as_tensor(mine, dtype=torch.float64)
        if mine.shape != expected.shape:
            return False
        scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
        return expected.numel() == 0 or float((mine - expected).abs().max()) / scale <= tolerance
    return mine == expected


def _shown(value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_shown, value)) + ")"
    if isinstance(value, torch.Tensor):
        first = ", ".join(f"{v:.4g}" for v in value.flatten()[:6].tolist())
        return f"a tensor of shape {tuple(value.shape)}: [{first}{', …' * (value.numel() > 6)}]"
    return repr(value)


def exercise(name: str, function: Callable) -> None:
    """Hold the learner's `function` to the library's on the exercise's cases. A function that returns None
    (not written yet) is said, and nothing is checked; a miss raises an AssertionError naming the case, both
    answers and a hint; agreement on every case is said."""
    if name not in EXERCISES:
        raise ValueError(f"no exercise named {name!r}; there are {sorted(EXERCISES)}")
    ex = EXERCISES[name]
    cases = ex.cases(torch.Generator().manual_seed(0))
    for i, (what, arguments) in enumerate(cases):
        try:
            mine = function(*[a.clone() if isinstance(a, torch.Tensor) else a for a in arguments])
        except Exception as e:  # noqa: BLE001 - whatever the learner's code raises is said with its case
            raise AssertionError(
                f"your function raised {type(e).__name__}: {e} on the case {what}. Hint: {ex.hint}"
            ) from e
        if mine is None and i == 0:
            print(f"Write the function first (it returned None), then run this cell again. "
                  f"show_answer({name!r}) shows one answer.")  # fmt: skip
            return
        with torch.no_grad():
            expected = ex.library(*arguments)
        if not _agrees(mine, expected, ex.tolerance):
            raise AssertionError(
                f"not quite, on the case {what}: yours gave {_shown(mine)}, the library {_shown(expected)}. "
                f"Hint: {ex.hint} (show_answer({name!r}) shows one answer.)"
            )
    print(f"right: yours agrees with the library's {ex.library_name} on all {len(cases)} cases (float64).")


def show_answer(name: str) -> None:
    """Print one answer to the exercise (answers.py), with the source line numbers."""
    if name not in EXERCISES:
        raise ValueError(f"no exercise named {name!r}; there are {sorted(EXERCISES)}")
    print(inspect.getsource(EXERCISES[name].answer).rstrip())
