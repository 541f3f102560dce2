"""`python -m dflash_ref bench engines`: the engines a user would serve DFlash with, beside dflash_ref, on the
same weights and prompts (harness and reporting: cli/bench.py).

SmolLM2-135M-Instruct in fp32 with the shipped DFlash 1 draft (and the DFlash 2 one where an engine takes
it), the `baselines` benchmark's 8 hand-written held-out prompts, 64 new tokens, greedy, one sequence at a
time, every proposal over all V (the engines know no draft vocabulary). Each runs in a process of its own:

    dflash_ref   this module run as a program: AR, and spec_generate plain and with --fast-cpu
    vLLM         conformance/engines/vllm_run.py --bench, in vLLM's Python (DFLASH_REF_VLLM_PYTHON)
    llama.cpp    conformance/engines/llamacpp_run.cpp without --dump, in the tree of LLAMA_CPP_DIR

Each reports the seconds of its generate calls (model loading, warm-up and start-up left out), τ + 1 by its
own count (tokens per target pass, the bonus included), the peak resident memory of its process, and its
outputs, which must be dflash_ref's AR output. Runs are one after another, not interleaved: compare them on
one machine, in one run, as ratios to dflash_ref's AR. An engine not installed, or refusing a draft, is a row
that says so.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..conformance.ports.engines import engine_python, llamacpp, vllm
from ..conformance.report import NotApplicable
from ..decoding import generate, spec_generate
from ..drafts.checkpoint import load_draft
from ..drafts.shipped import SHIPPED_DFLASH1, SHIPPED_DFLASH2
from ..fast_cpu import use_fast_cpu
from ..loading.smollm2 import STOP_TOKEN_IDS, chat_ids, converted_folder, load_smollm2_own
from ..training.prompt_sets import split_prompts

PROMPTS, NEW_TOKENS = 8, 64  # as `bench baselines`
DRAFTS = {"DFlash 1": SHIPPED_DFLASH1, "DFlash 2": SHIPPED_DFLASH2}


def prompt_ids() -> list[list[int]]:
    tokenizer = load_smollm2_own()[1]
    return [chat_ids(tokenizer, p)[0].tolist() for p in split_prompts("heldout-styles")[:PROMPTS]]


def bench_engines(repeats: int, out: Path, progress) -> dict:
    """One row per decoder (see the module's docstring); `repeats` is not used: each engine runs its prompts once."""
    prompts = prompt_ids()
    threads = str(torch.get_num_threads())
    rows, expected = [], None
    ours = _ours(prompts, threads)
    expected = ours.pop("AR")["outputs"]
    rows.append(_row("dflash_ref generate (AR)", {"outputs": expected, **ours.pop("AR timing")}, expected))
    for name, result in ours.items():
        rows.append(_row(name, result, expected))
    progress("dflash_ref done; vLLM")
    for label, folder in DRAFTS.items():
        rows.append(_engine_row(f"vLLM, {label} draft", lambda f=folder: _vllm(prompts, f, threads), expected))
    progress("vLLM done; llama.cpp")
    for label, folder in DRAFTS.items():
        rows.append(_engine_row(f"llama.cpp, {label} draft", lambda f=folder: _llamacpp(prompts, f, threads), expected))
    ar = rows[0]["tokens/s"]
    for row in rows:
        if isinstance(row.get("tokens/s"), float):
            row["speed vs dflash_ref AR"] = row["tokens/s"] / ar
    return {f"engines · SmolLM2-135M fp32, {PROMPTS} hand-written held-out prompts, {NEW_TOKENS} tokens, greedy": rows}


def _row(name: str, result: dict, expected: list) -> dict:
    tokens = sum(len(o) for o in result["outputs"])
    row = {"decoder": name, "tokens/s": tokens / sum(result["seconds"])}
    if "steps" in result:
        row["τ + 1 (tokens/step)"] = tokens / result["steps"]
    row["peak RSS (MiB)"] = result["peak_rss_mb"]
    row["output = dflash_ref AR"] = result["outputs"] == expected
    return row


def _engine_row(name: str, run, expected: list) -> dict:
    try:
        return _row(name, run(), expected)
    except NotApplicable as e:
        return {"decoder": name, "tokens/s": f"n/a: {e}"}


def _ours(prompts: list[list[int]], threads: str) -> dict:
    """This module as a program, in a process of its own (its peak memory is dflash_ref's alone)."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "ours.json"
        (Path(scratch) / "prompts.json").write_text(json.dumps(prompts))
        proc = subprocess.run(
            [sys.executable, "-m", "dflash_ref.bench.engines", str(Path(scratch) / "prompts.json"), str(out)],
            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": threads},
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"dflash_ref's run failed: {proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def _vllm(prompts: list[list[int]], draft: Path, threads: str) -> dict:
    python = engine_python(vllm.VARIABLE, "vllm", "vLLM")
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "prompts.json").write_text(json.dumps(prompts))
        out = Path(scratch) / "vllm.json"
        args = ["-m", "dflash_ref.conformance.ports.engines.vllm_run", "--bench", str(converted_folder()), str(draft),
                "--prompts", str(Path(scratch) / "prompts.json"), "--max-new", str(NEW_TOKENS), "--out", str(out),
                "--stop", *map(str, STOP_TOKEN_IDS)]  # fmt: skip
        proc = vllm.run_runner(python, args, "draft", {"OMP_NUM_THREADS": threads})
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM failed (exit {proc.returncode}): {vllm.last_error(proc.stderr)}")
        result = json.loads(out.read_text())
    # vLLM's own count: drafts made, draft tokens accepted; a target pass per draft, plus each prefill's
    return {**result, "steps": result["drafts"] + len(prompts)} if result["drafts"] else result


def _llamacpp(prompts: list[list[int]], draft: Path, threads: str) -> dict:
    root = llamacpp.tree()
    binary = llamacpp.program(root)
    with tempfile.TemporaryDirectory() as scratch:
        target, draft_gguf = llamacpp.convert(root, converted_folder(), Path(draft), Path(scratch))
        block = json.loads((Path(draft) / "config.json").read_text())["block_size"]
        outputs, seconds, steps, peak = [], [], 0, 0.0
        for prompt in prompts:
            args = [binary, "--prompt-ids", ",".join(map(str, prompt)), "--max-new", NEW_TOKENS,
                    "--stop-ids", ",".join(map(str, STOP_TOKEN_IDS)), "-m", target, "-md", draft_gguf,
                    "--spec-type", "draft-dflash", "--spec-draft-n-max", block - 1, "--temp", "0",
                    "-c", len(prompt) + NEW_TOKENS + 16, "-t", threads, *llamacpp.F32_CACHES]  # fmt: skip
            proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=llamacpp.TIMEOUT)
            if proc.returncode != 0:
                said = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
                raise NotApplicable(f"llama.cpp refuses this draft: {said}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            outputs.append(result["output"])
            seconds.append(result["prefill_s"] + result["decode_s"])
            steps += result["steps"] + 1  # the prefill's target pass too
            peak = max(peak, result["peak_rss_mb"])
    return {"outputs": outputs, "seconds": seconds, "steps": steps, "peak_rss_mb": peak}


def run_ours(prompts: list[list[int]]) -> dict:
    """dflash_ref on the prompts, one at a time: AR, then spec_generate with each draft, plain and fast."""
    target, _ = load_smollm2_own()
    results: dict[str, dict] = {}

    def timed(decode) -> dict:
        decode(prompts[0])  # warm-up
        outputs, seconds, steps = [], [], 0
        for prompt in prompts:
            t0 = time.perf_counter()
            out = decode(prompt)
            seconds.append(time.perf_counter() - t0)
            outputs.append(out.output_ids[0, len(prompt) :].tolist())
            steps += out.num_target_passes
        return {"outputs": outputs, "seconds": seconds, "steps": steps}

    with torch.inference_mode():
        ar = timed(lambda p: generate(target, torch.tensor([p]), NEW_TOKENS, STOP_TOKEN_IDS))
        results["AR"], results["AR timing"] = {"outputs": ar["outputs"]}, {"seconds": ar["seconds"]}
        for label, folder in DRAFTS.items():
            draft = load_draft(folder, torch.float32)
            for fast in (False, True):
                use_fast_cpu(target, fast), use_fast_cpu(draft, fast)
                name = f"dflash_ref spec_generate, {label} draft" + (", --fast-cpu" if fast else "")
                results[name] = timed(
                    lambda p, d=draft: spec_generate(d, target, torch.tensor([p]), NEW_TOKENS, STOP_TOKEN_IDS)
                )
            use_fast_cpu(target, False)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {name: {**r, "peak_rss_mb": peak} for name, r in results.items()}


if __name__ == "__main__":  # `bench engines` runs dflash_ref's side here, in a process of its own
    prompts_file, out_file = sys.argv[1:3]
    Path(out_file).write_text(json.dumps(run_ours(json.loads(Path(prompts_file).read_text()))))
