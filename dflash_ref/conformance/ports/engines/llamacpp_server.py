"""llama.cpp as people serve it (`verify --impl llama-server`): its `llama-server`, built from the same tree as
the `llamacpp` port (LLAMA_CPP_DIR), with several slots, its prompt cache and continuous batching, driven over
its HTTP API on the loopback.

A serving scenario's requests (engine_scenarios.SERVINGS) go to one server started with the scenario's settings:
`--parallel` slots (max_seqs), `-b`/`-ub` tokens per step (max_batched_tokens: a longer prompt is processed in
chunks), and `cache_prompt` on each request (prefix_caching: a slot keeps its KV and reuses the prompt's common
prefix). Each request is streamed and added when its arrival holds; any other engine bundle is one request
alone. What comes back is what the server returns, nothing recomputed:

    output_ids, first_token    the request's prompt and the tokens the server streamed back (`return_tokens`)
    served/cached_prefix       the prompt tokens its slot reused from the prompt cache (`timings.cache_n`)
    served/draft_accepted      its draft tokens accepted (`timings.draft_n_accepted`): with the draft DFlash's,
                               each step's proposals are DFlash's and so is their acceptance, so the count is
                               Σ τ over the reference's steps but the last, plus what the last step accepts (where
                               engines cut the block to what is left, each its own way: verify._draft_accepted);
                               fewer means the draft saw another context

The server computes its tensors inside its slots and has no eval callback: the stages are the `llamacpp`
port's, which runs the same implementation one sequence at a time. The server stops on strings, not token ids:
a bundle's stop tokens are given as their texts (the server's own /detokenize), and greedy decoding is the
server's own sampler chain at temperature 0. A request the server answers with a 4xx is not applicable, in its
words; any other failure, or a request for which it reports no draft count, is an error, never a pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ...bundle import find_bundles
from ...crash import EngineFailed
from ...port import Port, outputs
from ...report import NotApplicable
from ...stages import CACHED_PREFIX, DRAFT_ACCEPTED, STAGES, key_for
from . import serving
from .llamacpp import F32_CACHES, TIMEOUT, _run, convert, failure, tree

# what the server hands over: its output (and x_0 in it); every other stage is waived
OBSERVED = ("first_token", "output_ids")
START_TIMEOUT = 120  # seconds for the server to load its models and answer /health
EXTRA = "DFLASH_REF_LLAMA_SERVER_ARGS"  # more options for the server (on a GPU: "-ngl 99")
SAMPLING_SLOTS = 4  # `verify --sampling`: the server's slots, and requests in flight


def server_binary(root: Path) -> Path:
    """llama-server of the tree, built where it is not."""
    binary = root / "build" / "bin" / "llama-server"
    if not binary.is_file():
        if not (root / "build" / "CMakeCache.txt").is_file():
            _run(["cmake", "-S", root, "-B", root / "build", "-G", "Ninja", "-DLLAMA_CURL=OFF",
                  "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF"], "configuring llama.cpp")  # fmt: skip
        _run(["cmake", "--build", root / "build", "--target", "llama-server"], "building llama-server")
    return binary


def free_port() -> int:
    """A port on the loopback nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exited(proc, log: Path, when: str) -> EngineFailed:
    """The error of a server that exited (`when`: "before serving", …), in its own words (its log's error line):
    the engine's own crash, located in its process (crash.EngineFailed), not at the kit's line that noticed it."""
    said = failure(log.read_text(errors="replace"))
    return EngineFailed(f"llama-server exited (code {proc.returncode}) {when}: {said}")


@contextlib.contextmanager
def running_server(binary: Path, args: list, port: int, log: Path):
    """llama-server on 127.0.0.1:port until the block ends (the block gets its process); a server that exits or
    does not answer /health in START_TIMEOUT is an error with its last line of output."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(binary), *map(str, args), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise exited(proc, log, "before serving")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if json.loads(r.read()).get("status") == "ok":
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server did not answer http://127.0.0.1:{port}/health in {START_TIMEOUT} s")
            time.sleep(0.2)
        yield proc
    finally:
        stop(proc, 10)


def stop(proc: subprocess.Popen, grace: float) -> None:
    """A server process ended: asked to (SIGTERM), then killed if it has not within `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Stream(threading.Thread):
    """One /completion request, streamed: `tokens` grows as the server sends them; `timings` and `error` at the end."""

    def __init__(self, port: int, body: dict) -> None:
        super().__init__(daemon=True)
        self.port, self.body = port, {**body, "stream": True, "return_tokens": True}
        self.tokens: list[int] = []
        self.timings: dict = {}
        self.error: str | None = None
        self.refused = False  # the server answered 4xx: it refuses this request (else an error is a failure)

    def run(self) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(self.body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
                for line in r:
                    line = line.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        self.error = str(chunk["error"].get("message", chunk["error"]))
                        return
                    self.tokens += chunk.get("tokens", [])
                    self.timings = chunk.get("timings", self.timings)
        except Exception as e:  # noqa: BLE001 - said by the port: a 4xx is the server's refusal, the rest failures
            body = e.read().decode(errors="replace") if isinstance(e, urllib.error.HTTPError) else ""
            self.refused = isinstance(e, urllib.error.HTTPError) and 400 <= e.code < 500
            self.error = f"{type(e).__name__}: {e}{': ' + body if body else ''}"


def serve(port: int, bundles: list, prefix_cache: bool) -> dict[str, dict | Exception]:
    """The requests (in order, each when its arrival holds) through the server on `port` → bundle name → its keys,
    or the exception that request ended in (a refusal: NotApplicable; any other error: RuntimeError)."""
    streams: dict[str, Stream] = {}
    waiting = list(bundles)

    def arrived(bundle) -> bool:
        done = {label for label, s in streams.items() if not s.is_alive()}
        return serving.arrives(bundle.manifest.get("serving"), {k: len(s.tokens) for k, s in streams.items()}, done)

    deadline = time.monotonic() + TIMEOUT
    while waiting or any(s.is_alive() for s in streams.values()):
        while waiting and arrived(waiting[0]):
            b = waiting.pop(0)
            body = {
                "prompt": b.inputs["input_ids"],
                "n_predict": b.inputs["max_new_tokens"],
                "temperature": 0.0,
                "cache_prompt": prefix_cache,
                "stop": [detokenize(port, t) for t in b.inputs["stop_token_ids"] or []],
            }
            streams[_label(b)] = Stream(port, body)
            streams[_label(b)].start()
        if waiting and not any(s.is_alive() for s in streams.values()) and not arrived(waiting[0]):
            arrive = waiting[0].manifest["serving"]["arrive"]
            raise RuntimeError(f"request {waiting[0].name} can never arrive: {arrive}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"llama-server did not finish the requests in {TIMEOUT} s")
        time.sleep(0.005)
    return {b.name: _produced(b, streams[_label(b)]) for b in bundles}


def _label(bundle) -> str:
    """A request's name in its scenario ("r1"); a bundle alone is named by itself."""
    return (bundle.manifest.get("serving") or {}).get("request", bundle.name)


def _produced(bundle, stream: Stream) -> dict | Exception:
    """A request's keys from what the server streamed back, or the exception it ended in."""
    if stream.error:
        if stream.refused:
            return NotApplicable(f"llama-server refuses this request: {stream.error}")
        return RuntimeError(f"llama-server failed on {bundle.name}: {stream.error}")
    if "draft_n_accepted" not in stream.timings:  # no speculative decoding ran: never a pass on the output alone
        return RuntimeError(f"llama-server reported no draft_n_accepted for {bundle.name}: did it draft at all?")
    produced = outputs({DRAFT_ACCEPTED: np.array(stream.timings["draft_n_accepted"], dtype=np.int64)},
                       bundle.inputs["input_ids"], stream.tokens)  # fmt: skip
    if stream.timings.get("cache_n"):  # prompt tokens the slot reused from its cache
        produced[CACHED_PREFIX] = np.array(stream.timings["cache_n"], dtype=np.int64)
    return produced


def detokenize(port: int, token: int) -> str:
    """A stop token's text, in the server's own words (its /detokenize): it stops on strings, not ids."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/detokenize",
        data=json.dumps({"tokens": [token]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())["content"]


class LlamaServerPort(Port):
    """run(bundle) → what llama-server returned for the bundle's request: its serving scenario's requests run
    together on one server (each group once), any other bundle alone."""

    name = "llama-server"
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    engine_shaped = True
    skip = tuple(s.name for s in STAGES if s.name not in OBSERVED)

    def __init__(self) -> None:
        self._done: dict[tuple, dict] = {}

    def run(self, bundle) -> dict:
        group = serving.scenario_group(bundle, find_bundles)
        key = tuple(str(b.path) for b in group)
        if key not in self._done:  # once per group, its failure too
            try:
                self._done[key] = self._serve(group)
            except Exception as e:  # noqa: BLE001 - every request of the group ends in it
                self._done[key] = {b.name: e for b in group}
        done = self._done[key][bundle.name]
        if isinstance(done, Exception):
            raise done
        return done

    def _serve(self, group: list) -> dict[str, dict | Exception]:
        first = group[0]
        settings = (first.manifest.get("serving") or {}).get("engine", {})
        block = first.config("draft")["block_size"]
        per_slot = max(slot_tokens(b.inputs["input_ids"], b.inputs["max_new_tokens"], block) for b in group)
        slots, batch = settings.get("max_seqs", 1), settings.get("max_batched_tokens")
        with server(first.target_dir, first.draft_dir, slots, per_slot, batch) as (port, proc, log):
            done = serve(port, group, bool(settings.get("prefix_caching")))
            if proc.poll() is not None:  # it died serving: the requests it failed say so, in its words
                died = exited(proc, log, "while serving")
                done = {name: died if isinstance(d, Exception) else d for name, d in done.items()}
            return done

    def sampler(self, bundle, verifier: str):
        """`verify --sampling`: llama.cpp's server verifies as `match` does (its target samples each position with
        the request's sampler chain; a proposal, its draft's argmax, is kept while it equals that sample)."""
        if verifier != "match":
            raise ValueError(
                "llama.cpp verifies by matching (its draft proposes its argmax, its target samples each position "
                "and keeps a proposal while it equals the sample): verify --sampling --verifier match"
            )
        return ServerSampler(bundle)


def slot_tokens(prompt: list[int], max_new_tokens: int, block: int) -> int:
    """A slot's context for a request: its prompt, its new tokens, two blocks of drafts, and a margin."""
    return len(prompt) + max_new_tokens + 2 * block + 16


@contextlib.contextmanager
def server(target_dir: Path, draft_dir: Path, slots: int, per_slot: int, batch: int | None = None):
    """llama-server on a target and a draft folder (a bundle's; converted by llama.cpp's own converter) with `slots`
    slots of `per_slot` tokens and `batch` tokens per step (default: a slot's, at least 512) → (port, process, its
    log)."""
    root = tree()
    binary = server_binary(root)
    block = json.loads((Path(draft_dir) / "config.json").read_text())["block_size"]
    batch = batch or max(per_slot, 512)
    with tempfile.TemporaryDirectory() as scratch:
        target, draft = convert(root, Path(target_dir), Path(draft_dir), Path(scratch))
        args = ["-m", target, "-md", draft, "--spec-type", "draft-dflash", "--spec-draft-n-max", block - 1,
                "--spec-draft-n-min", 0, "--spec-draft-p-min", 0,  # every draft whole: DFlash's γ proposals
                "--parallel", slots, "-c", per_slot * slots, "-b", batch, "-ub", batch, "--temp", "0",
                "-fa", "off", "-t", os.cpu_count() or 1, "--no-webui", *F32_CACHES,
                *shlex.split(os.environ.get(EXTRA, ""))]  # fmt: skip
        port, log = free_port(), Path(scratch) / "server.log"
        with running_server(binary, args, port, log) as proc:
            yield port, proc, log


class ServerSampler:
    """The sampling bundle's prompt as one request per seed through llama-server (SAMPLING_SLOTS slots, as many
    requests in flight), each at the bundle's temperature with the seed, no top-k, top-p or min-p: → per request its
    prompt and output, and its first step's τ. The server reports only a request's totals (timings.draft_n,
    draft_n_accepted), but with max_new_tokens = 2 + γ (γ = block − 1 proposals) they tell it: it drafts at most
    n_remaining − 1 tokens, and every draft whole (server(): no minimum probability, no minimum length), so after
    x_0 it drafts γ, and again only if the first step kept τ + 1 ≤ 1 tokens (then 1 more). So τ = draft_n_accepted
    where draft_n = γ, and 0 where draft_n > γ; fewer than γ drafted is an error, and another max_new_tokens
    leaves τ unreported (None)."""

    def __init__(self, bundle) -> None:
        self.bundle = bundle

    def many(self, seeds) -> list[tuple[list[int], int | None]]:
        s, block = self.bundle.manifest["sampling"], self.bundle.config("draft")["block_size"]
        proposals = block - 1
        told = s["max_new_tokens"] == proposals + 2  # else the totals do not tell the first step's τ
        body = {"prompt": s["input_ids"], "n_predict": s["max_new_tokens"], "temperature": s["temperature"],
                "top_k": 0, "top_p": 1.0, "min_p": 0.0, "cache_prompt": False, "ignore_eos": True}  # fmt: skip
        per_slot = slot_tokens(s["input_ids"], s["max_new_tokens"], block)
        with server(self.bundle.target_dir, self.bundle.draft_dir, SAMPLING_SLOTS, per_slot) as (port, proc, log):
            with ThreadPoolExecutor(SAMPLING_SLOTS) as pool:
                streams = list(pool.map(lambda seed: _finished(Stream(port, {**body, "seed": seed})), seeds))
            if proc.poll() is not None:
                raise exited(proc, log, "while sampling")
        out = []
        for stream in streams:
            produced = _produced(self.bundle, stream)
            if isinstance(produced, Exception):
                raise produced
            tau = first_step_tau(stream.timings.get("draft_n", 0), int(produced[DRAFT_ACCEPTED]), proposals, told)
            out.append((produced[key_for("output_ids")].tolist(), tau))
        return out


def first_step_tau(drafted: int, accepted: int, proposals: int, told: bool) -> int | None:
    """The first step's τ from llama-server's totals of a request of max_new_tokens = 2 + γ (`told`; else None):
    ServerSampler's rule. A shortened first draft is an error: its totals tell no τ of DFlash's block."""
    if not told:
        return None
    if drafted < proposals:
        raise RuntimeError(f"llama-server drafted {drafted} tokens for a request, fewer than {proposals}")
    return accepted if drafted == proposals else 0


def _finished(stream: Stream) -> Stream:
    """The stream, run to its end in this thread."""
    stream.run()
    return stream
