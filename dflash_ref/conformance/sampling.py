"""Sampling conformance: is a port's sampled output the target's own distribution, and is its
acceptance that of lossless speculative sampling with this draft at this temperature?

The sampling bundle holds a vocabulary so small that every output of N tokens can be enumerated (or,
engine-shaped, a vocabulary whose every token but a few has a negligible probability: the outputs over those
few are enumerated, and every other output is one bin, "other", of exact mass): its exact probability
P(x_1..x_N) = Π_t p_T(x_t | prompt, x_<t) (the target in float64, at temperature T), and the exact
distribution of the first decode step's τ for each verifier:

    rejection   d_i ~ q_i;  P(τ ≥ 1 | x_0) = Σ_v min(p_1(v), q_1(v)),
                P(τ ≥ 2 | x_0) = Σ_v [min(p_1(v), q_1(v)) · Σ_w min(p_2(w | v), q_2(w))]
    match       d_i = argmax q_i;  P(τ ≥ 1 | x_0) = p_1(d_1),  P(τ ≥ 2 | x_0) = p_1(d_1) · p_2(d_2 | d_1)

(q_i: the draft's distributions at block position i, drawn in one parallel pass from [x_0, mask, …];
p_i: the target's at the verified position). `judge_sampling` runs the port's sampler R times with
seeds 0 … R − 1 (`sampler(seed)`, or `sampler.many(seeds)` for an engine that serves them at once) and tests
both: a chi-square test of the outputs' counts against R · P (bins of expected count below 5 pooled; the
"other" bin, too rare to be tested so, also by its Poisson tail alone: the smaller p-value counts, so a correct
sampler fails at most 2 runs in 1000), and a z-test of the mean first-step τ against its exact mean (not made
where the port reports no τ at all). A sampler that keeps the draft's tokens without the rejection rule, or
samples p instead of the residual norm(max(p − q, 0)) after a rejection, fails the first; a draft that ignores
the temperature, or another verifier than the one declared, keeps the distribution but fails the second.
Numpy only; the port returns (output_ids, first-step τ) per run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

P_MIN = 1e-3  # a p-value below this fails (a correct sampler fails 1 run in 1000; 2 with the other bin's test)
Z_MAX = 4.0  # a mean τ more than 4 standard errors off fails (about 6e-5 for a correct one)


def upper_gamma_regularized(a: float, x: float) -> float:
    """Q(a, x) = Γ(a, x) / Γ(a): by its series below a + 1, by its continued fraction above."""
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:  # P(a, x) = e^{-x} x^a / Γ(a + 1) · Σ x^n / (a+1)…(a+n)
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-15 * abs(total):
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)  # Lentz's continued fraction for Γ(a, x)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > 1e-300 else 1e-300)
        c = b + an / c
        c = c if abs(c) > 1e-300 else 1e-300
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return h * math.exp(log_front)


def chi_square(observed: np.ndarray, expected: np.ndarray) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value): the bins with expected count < 5 pooled into one, and
    that one, if still under 5, into the smallest other bin. A count where nothing is expected: p = 0."""
    if np.any(observed[expected == 0] > 0):  # an output the target cannot produce
        return math.inf, len(expected) - 1, 0.0
    small = expected < 5
    obs, exp = list(observed[~small]), list(expected[~small])
    if small.any():
        obs.append(observed[small].sum())
        exp.append(expected[small].sum())
        if exp[-1] < 5 and len(exp) > 1:
            smallest = int(np.argmin(exp[:-1]))
            obs[smallest] += obs.pop()
            exp[smallest] += exp.pop()
    obs, exp = np.array(obs, dtype=float), np.array(exp, dtype=float)
    keep = exp > 0
    statistic, df = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1
    if df < 1 or not math.isfinite(statistic):
        return statistic, df, 1.0 if df < 1 else 0.0
    return statistic, df, upper_gamma_regularized(df / 2, statistic / 2)


@dataclass
class SamplingResult:
    runs: int
    chi2: float
    df: int
    p_value: float
    mean_tau: float
    expected_tau: float
    z: float
    verifier: str
    note: str = ""  # what the implementation's own tensors say beside the verdict (an engine's sampler sets it)

    @property
    def distribution_ok(self) -> bool:
        return self.p_value >= P_MIN

    @property
    def acceptance_ok(self) -> bool:
        return math.isnan(self.z) or abs(self.z) <= Z_MAX  # nan: τ not reported, not tested

    @property
    def passed(self) -> bool:
        return self.distribution_ok and self.acceptance_ok

    def text(self) -> str:
        lines = [
            f"outputs: chi-square {self.chi2:.1f} on {self.df} df, p = {self.p_value:.3g} "
            f"({'pass' if self.distribution_ok else 'FAIL'}, {self.runs} runs)",
            f"first-step τ ({self.verifier}): mean {self.mean_tau:.3f}, exact {self.expected_tau:.3f}, "
            f"z = {self.z:+.2f} ({'pass' if self.acceptance_ok else 'FAIL'})"
            if not math.isnan(self.z)
            else f"first-step τ ({self.verifier}): exact mean {self.expected_tau:.3f}; not tested: the "
            "implementation does not report it",
        ]
        if self.note:
            lines.append(self.note)
        elif not self.distribution_ok:
            lines.append(
                "the outputs are not the target's distribution: check the rejection rule (accept d_i only "
                "if u·q_i(d_i) < p_i(d_i)) and that a rejection samples the residual norm(max(p − q, 0)), not p"
            )
        elif not self.acceptance_ok:
            lines.append(
                "the outputs are the target's distribution, but the acceptance is not that of this draft at "
                "this temperature: check that the draft samples at the request's temperature, and the verifier"
            )
        return "\n".join(lines)


def judge_sampling(sampling: dict, sampler, runs: int | None = None, verifier: str = "rejection") -> SamplingResult:
    """Run `sampler(seed)` for seeds 0 … runs − 1 (or `sampler.many(seeds)`, for an engine that serves them at
    once) and test it against the bundle's exact distributions (`sampling`: the manifest's section). Its outputs
    outside `sequences` (the vocabulary's tokens beyond those enumerated) count in one bin of mass `other`. A
    first-step τ of None is one the implementation does not report: the acceptance test is then not made."""
    runs = sampling["runs"] if runs is None else runs
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a whole number ≥ 1, got {runs!r}")
    steps = len(sampling["acceptance"][verifier]) - 1  # τ of the first step lies in 0 … γ
    index = {tuple(s): i for i, s in enumerate(sampling["sequences"])}
    other, vocab = sampling.get("other", 0.0), sampling.get("vocab")
    prompt = len(sampling["input_ids"])
    counts, taus = np.zeros(len(index) + 1), []  # the last bin: outputs outside `sequences`
    samples = list(sampler.many(range(runs)) if hasattr(sampler, "many") else (sampler(seed) for seed in range(runs)))
    if len(samples) != runs:
        raise ValueError(f"the sampler returned {len(samples)} runs, not {runs}")
    untold = sum(tau is None for _, tau in samples)
    if 0 < untold < runs:  # which runs lack it could depend on their outcome: the mean of the rest is biased
        raise ValueError(f"the sampler reported the first-step τ of {runs - untold} runs of {runs}: all or none")
    for output_ids, tau in samples:
        new = tuple(int(t) for t in np.asarray(output_ids).reshape(-1)[prompt : prompt + sampling["compared"]])
        valid = len(new) == sampling["compared"] and all(0 <= t < (vocab or 0) for t in new)
        if new not in index and not valid:
            raise ValueError(
                f"the sampler returned {list(new)}, not {sampling['compared']} tokens of the "
                f"vocabulary after the prompt"
            )
        counts[index.get(new, len(index))] += 1
        if tau is None:
            continue
        if not 0 <= int(tau) <= steps:
            raise ValueError(
                f"the sampler's first-step τ {tau} is outside 0 … {steps} (the accepted proposals, "
                "not tokens per step, which is τ + 1)"
            )
        taus.append(int(tau))
    expected = runs * np.append(np.asarray(sampling["probabilities"]), other)
    chi2, df, p = chi_square(counts, expected)
    if counts[-1] and expected[-1] < 5:  # too rare to be a bin of its own: how likely so many are, alone
        p = min(p, poisson_tail(int(counts[-1]), float(expected[-1])))
    dist = np.asarray(sampling["acceptance"][verifier])  # P(τ = 0), P(τ = 1), …
    values = np.arange(len(dist))
    mean, var = float(values @ dist), float(((values - values @ dist) ** 2) @ dist)
    if not taus:
        return SamplingResult(runs, chi2, df, p, math.nan, mean, math.nan, verifier)
    observed = float(np.mean(taus))
    z = (observed - mean) / math.sqrt(var / len(taus)) if var > 0 else (0.0 if observed == mean else math.inf)
    return SamplingResult(runs, chi2, df, p, observed, mean, z, verifier)


def poisson_tail(k: int, mean: float) -> float:
    """P(X ≥ k) for X ~ Poisson(mean): summed term by term from k up where k is above the mean (so that it
    keeps its precision for a small mean, about mean^k / k!), else 1 − P(X < k)."""
    if mean <= 0:
        return 0.0 if k > 0 else 1.0
    log_pmf = lambda j: j * math.log(mean) - mean - math.lgamma(j + 1)  # noqa: E731
    if k <= mean:
        return max(0.0, 1.0 - sum(math.exp(log_pmf(j)) for j in range(k)))
    term, total, j = math.exp(log_pmf(k)), 0.0, k
    while term > 1e-300 and (total == 0.0 or term > 1e-17 * total):
        total += term
        j += 1
        term *= mean / j
    return min(1.0, total)
