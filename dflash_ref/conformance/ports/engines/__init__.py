"""Serving engines as ports: vLLM and llama.cpp run a golden bundle in their own process and environment,
and what they computed comes back as a dump that `verify` compares stage by stage.

    vllm.py       `verify --impl vllm`: vllm_run.py inside the Python that has vLLM
                  (DFLASH_REF_VLLM_PYTHON, else this one if it imports vllm)
    vllm_run.py   the program that runs there: vLLM's engine in-process, its tensors read by hooks
    llamacpp.py   `verify --impl llamacpp`: a llama.cpp tree (LLAMA_CPP_DIR), built if it has no build,
                  its own converter to GGUF, its speculative loop, its named tensors

An engine that is not installed, or that refuses a bundle, is "not applicable" in the report with its
own message (verify.NotApplicable), never a pass and never a traceback. The adapters only read: they
never change what an engine computes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ...report import NotApplicable

PACKAGE_ROOT = Path(__file__).resolve().parents[4]  # the folder that holds dflash_ref/, for PYTHONPATH
REFUSED = 3  # a runner's exit code when its engine refused the models, its reason on a line of stderr after:
REFUSAL_MARK = "engine refused: "


def engine_python(variable: str, module: str, what: str) -> str:
    """The Python that can import `module`: $variable if set, else this one if it can; else NotApplicable."""
    python = os.environ.get(variable) or sys.executable
    if os.environ.get(variable) and not (Path(python).is_file() or shutil.which(python)):
        raise NotApplicable(f"{what} is not installed: {variable}={python} is no Python")
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        raise NotApplicable(
            f"{what} is not installed ({python}: {last}); set {variable} to a Python that has it "
            "(dflash_ref/conformance/ENGINES.md)"
        )
    return python


def run_program(python: str, args: list[str], timeout: int, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m …` with this checkout of dflash_ref first on its path (its modules that need numpy only),
    `env` added to the environment."""
    path = os.pathsep.join([str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.run([python, *args], capture_output=True, text=True, timeout=timeout, env=env)
