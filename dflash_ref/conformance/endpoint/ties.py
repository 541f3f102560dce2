"""Is a divergence a numeric tie, the engine's dtype's rounding, or a bug? The target replayed in float64 over the
engine's own output, and in the engine's dtype beside it.

Greedy decoding takes x_{t+1} = argmax_v z_t(v), z_t the target's logits after x_≤t. An engine computes z_t in its
dtype; where two logits lie closer than that dtype resolves, either may come out on top, and a lossless engine may
leave the target-only output there without any bug (vLLM #54928, SGLang #38009, z-lab/dflash #159). So at every
position of the engine's output the target is run in float64, teacher-forced on the engine's own tokens (one
pass: prompt + output), and where the engine's token y_t is not the float64 argmax,

    margin_t     = z_t(argmax) − z_t(y_t)                       (float64: ≥ 0, 0 where y_t is the argmax)
    resolution_t = ulp_dtype(|z_t(argmax)|) = ε_dtype · 2^⌊log₂ |z_t(argmax)|⌋

the spacing of the engine's dtype at that logit's magnitude (ε = 2⁻⁷ bfloat16, 2⁻¹⁰ float16, 2⁻²³ float32: one
unit in the last place). A margin below it is a **tie**: the two logits round to the same or to adjacent values in
the engine's dtype, and the engine's choice is one of the near-equal top tokens: certainly rounding. Rounding
errors grow through the layers, so one ulp of the final logit is the least an engine can blur, not the most (a
correct bfloat16 engine departs at margins of several ulps). So beyond it, the target is also run in the engine's
dtype over the same tokens (one teacher-forced pass, `target_d`), and at each departure

    drift_t      = 2 · max over the LEADING logits v of z_t (by float64) of |z_d,t(v) − z_t(v)|

is how far that dtype moves the logits near the top there, twice (two logits, each moved as far, can cross by
their sum). A margin within drift_t is **within the dtype's measured drift**; beyond, a **FAIL**: the engine chose
a token the target does not rank first by more than its dtype blurs at that position. Not the two logits' own
moves: another engine's kernels move each logit otherwise, and a correct bfloat16 engine summing in another order
was seen to depart at 3.8 times the reference's move of those two (tests/conformance/test_endpoint.py's tiny
target), within 0.74 of drift_t; a RoPE base read as 10× smaller departed at up to 18 times it. (Over the run,
the engine's departures are held to a control's: control.py.)

The replay is float64 on the project's own Qwen3 and Llama targets but for RoPE's angles, which the target's
definition computes in float32 (transformers and the engines do too): their RMSNorms compute their statistics in
float32 whatever the input (as transformers' do), so for the replay they compute in float64 (`float64_norms`).
The hybrid Qwen3.5's Gated DeltaNet keeps its float32 decay, and a target run in transformers (HFTarget) its
float32 norms: their replay carries about 2⁻²⁴ relative error, far below bfloat16's and float16's resolution but as
large as float32's, so a float32 verdict on them near one ulp is not sure.
"""

from __future__ import annotations

import contextlib
import math
import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...rmsnorm import RMSNorm
from ...target.gated_deltanet import GatedRMSNorm
from ...target.qwen3_5 import OffsetRMSNorm

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
LEADING = 16  # the logits whose move in the engine's dtype is a departure's drift: the top 16 by float64


class Unreplayable(ValueError):
    """Ids the target cannot be run on: a token it has no row for, or more positions than it has."""


class OutsideVocabulary(Unreplayable):
    """An output token the target has no row for."""


class PastPositions(Unreplayable):
    """A prompt and output longer than the target's positions (max_position_embeddings)."""


def replay_limits(target64, prompt_ids: list[int], output_ids: list[int]) -> None:
    """What `replay` refuses before any compute: an id outside the target's vocabulary (OutsideVocabulary), more
    positions than the target has (PastPositions), each said in one line."""
    vocab = target64.config.vocab_size
    outside = [t for t in list(prompt_ids) + list(output_ids) if not 0 <= int(t) < vocab]
    if outside:
        raise OutsideVocabulary(f"token id {outside[0]} is outside the target's vocabulary of {vocab}")
    positions, total = target64.config.max_position_embeddings, len(prompt_ids) + len(output_ids)
    if total > positions:
        raise PastPositions(
            f"prompt ({len(prompt_ids)}) + output ({len(output_ids)}) = {total} positions, past the target's "
            f"max_position_embeddings {positions}"
        )


def resolution(scale: float, dtype: str) -> float:
    """ulp of `dtype` at |scale|: the gap between adjacent values of that dtype there (DTYPES); infinite where the
    scale is not finite (a logit that overflowed resolves nothing)."""
    eps = torch.finfo(DTYPES[dtype]).eps
    tiny = torch.finfo(DTYPES[dtype]).tiny
    scale = abs(scale)
    if not math.isfinite(scale):
        return math.inf
    return eps * 2.0 ** math.floor(math.log2(scale)) if scale >= tiny else eps * tiny


def _statistic(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _plain(self, x):  # rmsnorm.RMSNorm: w ⊙ x / rms(x)
    return self.weight * _statistic(x, self.eps)


def _offset(self, x):  # qwen3_5.OffsetRMSNorm: (1 + w) ⊙ x / rms(x)
    return _statistic(x, self.eps) * (1.0 + self.weight)


def _gated(self, x, z):  # gated_deltanet.GatedRMSNorm: w ⊙ x / rms(x) ⊙ SiLU(z)
    return self.weight * _statistic(x, self.eps) * F.silu(z)


@contextlib.contextmanager
def float64_norms(model):
    """The project's own RMSNorms in `model` computing in their input's dtype (float64 for the replay) instead of
    float32, until the block ends."""
    exact = {RMSNorm: _plain, OffsetRMSNorm: _offset, GatedRMSNorm: _gated}
    patched = [m for m in model.modules() if type(m) in exact]
    for m in patched:
        m.forward = types.MethodType(exact[type(m)], m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


@dataclass
class Divergence:
    """One position where the engine's token is not the target's float64 argmax."""

    index: int  # in the output (0: the first new token)
    token: int  # the engine's
    top: int  # the float64 argmax
    margin: float  # z(top) − z(token), float64
    resolution: float  # ulp of the engine's dtype at |z(top)|
    scale: float  # |z(top)|
    dtype: str
    drift: float | None = None  # the dtype's measured drift of these two logits here (None: not measured)

    @property
    def tie(self) -> bool:
        return self.margin < self.resolution

    @property
    def drifted(self) -> bool:
        """Past one ulp, within the dtype's measured drift here."""
        return not self.tie and self.drift is not None and self.margin <= self.drift

    @property
    def excused(self) -> bool:
        """Rounding, not a bug: a tie, or within the measured drift."""
        return self.tie or self.drifted

    def said(self, words=None) -> str:
        """`at 7: engine ' cat', target ' the' (float64 margin 3.1e-02 < bfloat16's resolution 6.25e-02 at
        |logit| 12.4): a tie`, or past it, against the measured drift; `words` turns ids into text."""
        name = words or (lambda t: str(t))
        head = f"at {self.index}: engine {name(self.token)}, target {name(self.top)} (float64 margin {self.margin:.2e}"
        if self.tie:
            return f"{head} < {self.dtype}'s resolution {self.resolution:.2e} at |logit| {self.scale:.3g}): a tie"
        ulp = f"≥ {self.dtype}'s resolution {self.resolution:.2e} at |logit| {self.scale:.3g}"
        if self.drift is None:
            return f"{head} {ulp}): not a tie"
        relation, verdict = ("≤", "within its measured drift") if self.drifted else (">", "beyond its measured drift")
        return f"{head} {ulp}, {relation} {self.dtype}'s measured drift {self.drift:.2e} there): {verdict}"


def _chose(target, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """The logits that chose each output token (n, V), float64, on `target`'s device: one teacher-forced pass of
    `target` over prompt + output."""
    device = next(target.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(output_ids)], dtype=torch.long, device=device)  # (1, L)
    logits = target(ids, past_key_values=target.make_cache(), output_hidden_states=False).logits  # (1, L, V)
    return logits[0, len(prompt_ids) - 1 : -1].double()


def drifts(z: torch.Tensor, z_d: torch.Tensor) -> torch.Tensor:
    """Each position's drift (n,): 2 · the largest |z_d − z| over its LEADING logits by float64 (module docstring)."""
    lead = z.topk(min(LEADING, z.shape[-1]), dim=-1).indices  # (n, LEADING)
    return 2.0 * (z_d.gather(1, lead) - z.gather(1, lead)).abs().amax(dim=-1)


@torch.inference_mode()
def replay(target64, prompt_ids: list[int], output_ids: list[int], dtype: str, target_d=None) -> list[Divergence]:
    """Every position of `output_ids` where it is not the float64 target's argmax after prompt + output before it
    (`target64`: the target loaded in float64). One teacher-forced pass; ids it cannot run on are Unreplayable.
    `target_d`: the target in the engine's dtype, whose teacher-forced pass gives each departure's drift."""
    if not output_ids:
        return []
    replay_limits(target64, prompt_ids, output_ids)
    with float64_norms(target64):
        z = _chose(target64, prompt_ids, output_ids)  # (n, V): the logits that chose each output token
    chosen = torch.tensor(output_ids, device=z.device)
    top_values, tops = z.max(dim=-1)
    mine = z.gather(1, chosen[:, None])[:, 0]
    departed = torch.nonzero(tops != chosen).flatten().tolist()
    drift = None
    if departed and target_d is not None:  # the same tokens through the engine's dtype: the drift there
        drift = drifts(z, _chose(target_d, prompt_ids, output_ids).to(z.device)).tolist()  # (n,)
    out = []
    for i in departed:
        scale = abs(float(top_values[i]))
        margin = float(top_values[i] - mine[i])
        if margin == 0.0:  # an exact tie in float64: the engine's token is an argmax too
            continue
        out.append(Divergence(i, int(chosen[i]), int(tops[i]), margin, resolution(scale, dtype), scale, dtype,
                              drift[i] if drift is not None else None))  # fmt: skip
    return out


@torch.inference_mode()
def logprob_fault(target64, target_d, prompt_ids: list[int], output_ids: list[int], logprobs: list[float]) -> str:
    """Where a server's logprob of its own output token is not the target's (its float64 log-softmax there), by more
    than the engine's dtype moves a logit anywhere in this output (2 · the largest move of the LEADING logits at any
    position: a logprob is a logit less a log-sum-exp, and another engine's kernels round each otherwise than ours,
    so one position's measure is too narrow): the first such position in words, "" where none is. A logprob that
    is the draft's, or of a distribution left untempered, is off by far more."""
    with float64_norms(target64):
        z = _chose(target64, prompt_ids, output_ids)  # (n, V)
    z_d = _chose(target_d, prompt_ids, output_ids).to(z.device)  # (n, V): the engine dtype's
    exact = z.log_softmax(-1).gather(1, torch.tensor(output_ids, device=z.device)[:, None])[:, 0]  # (n,)
    drift = float(drifts(z, z_d).max())
    for i, (given, want) in enumerate(zip(logprobs, exact.tolist())):
        if given is None or given != given:  # not given there (NaN)
            continue
        allowed = drift + resolution(abs(want), "float32")
        if abs(given - want) > allowed:
            return (f"logprobs: at {i} its logprob {given:.4g} of its own token, the target's {want:.4g} (beyond its "
                    f"dtype's measured drift {allowed:.2e} there): not the target's distribution")  # fmt: skip
    return ""
