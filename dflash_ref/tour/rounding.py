"""How close a notebook's recomputation must come to the library: float32's rounding in this run, measured.

A notebook recomputes each stage in a few lines of its own torch, in another order of operations than the
library's kernels (a `@` where the library calls F.linear, a fresh pass over the whole sequence where the
library read its cache), so the two agree to float32's rounding and no closer. How large that rounding is
depends on the shapes, on the knobs and on the CPU (one with AVX-512 sums in another order than one without),
so a fixed tolerance is either too tight on some machine or too loose to mean anything. The conformance kit
measures its tolerances against a float64 twin of each golden; the notebooks do the same, per run:

    ε      the run made again with both models in float64, the largest max|x_32 − x_64| / max(1, max|x_64|)
           over every tensor of the draft's hook points at every step both runs took alike, and over the
           target's hidden states and logits on the run's output. The twin runs the library's own code, so a
           library that computes a stage wrongly computes it wrongly in both: ε measures rounding, never the
           bug. (Its RMSNorms take their statistic in float32 whatever the input, as the library does: the
           twin is float64 but for that, about 2⁻²⁴ relative, below what float32 rounds elsewhere.)
    check  max|mine − library| / max(1, max|library|) ≤ FACTOR · ε                         (assert_close)
    choice a token chosen by an argmax is the argmax of the recomputed logits, or within FACTOR · ε of it
           (a tie that rounding may break either way)                               (assert_same_choice)

Two float32 computations of one value are each within about ε of the exact value, so they differ by about
2ε at most; FACTOR leaves room for a recomputation whose order rounds worse than the library's run did.
`python -m dflash_ref.tour.rounding` measures, over the knobs the notebooks offer, how far every check the
notebooks make came from its limit: the figures in walkthroughs/README.md. A library computed wrongly at any
stage misses by orders of magnitude more (the mutants of tests/test_walkthrough.py: 1e-3 and up), so a
check that fails still means the library is wrong, on any machine.
"""

from __future__ import annotations

import contextlib
import copy
import io
import tempfile
from dataclasses import dataclass, field

import torch

from ..decoding import spec_generate
from ..trace import tracing
from .cells import run_cells
from .demo import TOY_BLOCK_SIZES

FACTOR = 4.0  # the conformance kit's: a tensor's tolerance is 4 × its golden's own error against float64


def relative_error(mine: torch.Tensor, expected: torch.Tensor) -> float:
    """max|mine − expected| / max(1, max|expected|): the kit's measure (conformance/README.md), in float64."""
    mine, expected = torch.as_tensor(mine).double(), torch.as_tensor(expected).double()
    if mine.shape != expected.shape:
        raise AssertionError(f"shapes differ: {tuple(mine.shape)} against the library's {tuple(expected.shape)}")
    if expected.numel() == 0:
        return 0.0
    return float((mine - expected).abs().max()) / max(1.0, float(expected.abs().max()))


@dataclass
class Rounding:
    """float32's rounding in one run (ε, where it was largest) and the checks held to FACTOR · ε. `worst`
    keeps the largest ratio (error / tolerance) a check reached, for the sweep that reports it."""

    error: float  # ε
    where: str  # the tensor (and step) of the largest error
    factor: float = FACTOR
    worst: dict[str, float] = field(default_factory=dict)  # check → error / tolerance, its largest

    @property
    def tolerance(self) -> float:
        return self.factor * self.error

    def __str__(self) -> str:
        return (
            f"float32's rounding in this run, against its float64 twin: ε = {self.error:.1e} "
            f"(largest at {self.where}); "
            f"a recomputation must agree with the library within {self.factor:g} ε = {self.tolerance:.1e}, relative "
            "to max(1, max|x|)"
        )

    def _note(self, what: str, error: float) -> None:
        self.worst[what] = max(self.worst.get(what, 0.0), error / self.tolerance)

    def assert_close(self, mine, library, what: str = "") -> None:
        """`mine` (a recomputation) equals `library` (the library's tensor) up to this run's rounding."""
        error = relative_error(mine, library)
        self._note(what or "a tensor", error)
        if not error <= self.tolerance:  # (a NaN fails too)
            raise AssertionError(
                f"{what or 'the recomputation'} is {error:.1e} off the library's (relative to max(1, max|x|)), "
                f"beyond float32's rounding in this run ({self.factor:g} ε = {self.tolerance:.1e}): the library "
                "computes this stage otherwise than its equation"
            )

    def assert_same_choice(self, logits, chosen, what: str = "") -> None:
        """Each row of `logits` (…, V), recomputed, has the library's `chosen` token (…,) as its argmax, or
        within this run's rounding of it: a tie the two computations may break either way."""
        logits = torch.as_tensor(logits).double()
        chosen = torch.as_tensor(chosen).reshape(logits.shape[:-1])
        top = logits.max(dim=-1).values
        margin = (top - logits.gather(-1, chosen[..., None].long())[..., 0]) / logits.abs().amax(-1).clamp(min=1.0)
        worst = float(margin.max()) if margin.numel() else 0.0
        self._note(what or "a choice", worst)
        if worst > self.tolerance:
            row = tuple(int(i) for i in (margin == margin.max()).nonzero()[0])
            raise AssertionError(
                f"{what or 'a choice'}: at {row} the library chose token {int(chosen[row])}, "
                f"whose logit is {worst:.1e} "
                f"below the argmax {int(logits[row].argmax())} (relative to max(1, max|z|)): not a tie within "
                f"float32's rounding ({self.factor:g} ε = {self.tolerance:.1e})"
            )

    def assert_same_output(self, target, output_ids: torch.Tensor, reference_ids: torch.Tensor, what: str = "") -> None:
        """Two greedy decodes of one prompt are the same tokens, or part at a tie of the target's logits within
        this run's rounding (after which they need not agree: each continues its own text)."""
        if torch.equal(output_ids, reference_ids):
            return
        length = min(output_ids.shape[1], reference_ids.shape[1])
        differ = (output_ids[0, :length] != reference_ids[0, :length]).nonzero()
        if not len(differ):
            raise AssertionError(f"{what or 'the outputs'}: one is the other cut short ({output_ids.shape[1]} tokens "
                                 f"against {reference_ids.shape[1]})")  # fmt: skip
        at = int(differ[0])
        with torch.no_grad():
            logits = target(reference_ids[:, :at]).logits[0, -1]  # (V,) the target's next token after the prefix
        self.assert_same_choice(logits, output_ids[0, at], f"{what or 'the outputs'} part at position {at}")


def float64_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of `model` (the original untouched)."""
    return copy.deepcopy(model).double()


def measure_rounding(draft, target, input_ids: torch.Tensor, max_new_tokens: int, **options) -> Rounding:
    """ε for `spec_generate(draft, target, input_ids, max_new_tokens, **options)`: the run made in float32 and
    in float64 with the library's own code, every hook point of the draft recorded; steps compared while both
    runs verified the same block (a tie may part them), then the target's hidden states and logits over the
    float32 run's output."""
    draft64, target64 = float64_twin(draft), float64_twin(target)
    with torch.no_grad(), tracing(draft, names="draft.*") as trace32:
        output = spec_generate(draft, target, input_ids, max_new_tokens, on_step=trace32.on_step, **options)
    with torch.no_grad(), tracing(draft64, names="draft.*") as trace64:
        spec_generate(draft64, target64, input_ids, max_new_tokens, on_step=trace64.on_step, **options)
    errors = {}
    for step, (r32, r64) in enumerate(zip(trace32.records, trace64.records)):
        if r32.block_ids != r64.block_ids:
            break
        for key, value in trace32.activations[step].items():
            errors[f"{key}, step {step}"] = relative_error(value, trace64.activations[step][key])
    with torch.no_grad():
        out32, out64 = target(output.output_ids), target64(output.output_ids)
    for layer, (h32, h64) in enumerate(zip(out32.hidden_states, out64.hidden_states)):
        errors[f"the target's hidden_states[{layer}]"] = relative_error(h32, h64)
    errors["the target's logits"] = relative_error(out32.logits, out64.logits)
    where = max(errors, key=errors.get)
    return Rounding(errors[where], where)


SWEPT = ("01_kv_injection", "02_decode_loop", "04_dflash2")  # the notebooks whose checks take their tolerance here
SWEPT_PROMPTS = ("a cat sat", "the dog ran to the park", "then a mat")


def sweep(block_sizes=None, prompts=SWEPT_PROMPTS, say=print) -> dict[str, float]:
    """Every notebook of SWEPT (up to its SmolLM2 part) at every block size and prompt: each check's largest
    error / tolerance over all runs, and ε's range. → {check: its largest ratio}."""
    worst: dict[str, float] = {}
    errors = []
    for name in SWEPT:
        for block_size in block_sizes or TOY_BLOCK_SIZES:
            for prompt in prompts:
                with contextlib.redirect_stdout(io.StringIO()):
                    found = run_cells(name, {"block_size": block_size, "prompt": prompt, "figures": tempfile.mkdtemp()},
                                      until='require("smollm2")')  # fmt: skip
                rounding = found["rounding"]
                errors.append(rounding.error)
                for check, ratio in rounding.worst.items():
                    worst[f"{name[:2]} · {check}"] = max(worst.get(f"{name[:2]} · {check}", 0.0), ratio)
                say(f"{name} block {block_size} {prompt!r}: ε = {rounding.error:.1e}, largest check "
                    f"{max(rounding.worst.values()):.3f} of its tolerance")  # fmt: skip
    say(f"\nε over {len(errors)} runs: {min(errors):.1e} to {max(errors):.1e}; each check's largest error, as a "
        f"share of its tolerance {FACTOR:g} ε:")  # fmt: skip
    for check, ratio in sorted(worst.items(), key=lambda kv: -kv[1]):
        say(f"   {ratio:6.3f}  {check}")
    return worst


if __name__ == "__main__":
    sweep()
