"""A deployment checked from outside, over its OpenAI-compatible HTTP API (`verify --endpoint URL`), and a file of
outputs a user already has checked with no server at all (`verify --outputs FILE --target DIR`).

    client.py     the protocol: /v1/models, /v1/completions (token-id prompts), /metrics; each engine's fields
    expected.py   the requests and their reference runs (a bundle's, or spec_generate on the user's folders),
                  and the serving conditions they are sent under
    ties.py       the float64 replay: a divergence at a numeric tie or within the dtype's drift told from a bug
    control.py    the control: the target in the engine's dtype on the same prompts, the run's departures held to it
    semantics.py  the API's own fields on the speculative route (stop strings, max_tokens, finish_reason, n, echo,
                  seed, …), held to what the protocol gives for the reference's output, and to a plain route's
    check.py      sending (alone, or streamed as a scenario says) and judging each request
    report.py     the verdict

The kit only sends ordinary requests; it never changes the server's configuration. Every expectation is the
reference's single-sequence run; no tolerance is widened for serving.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch

from ...compat import check_request
from ...drafts.checkpoint import check_draft_folder, load_draft
from ...loading.folder import check_target_name, folder_stop_ids, load_target, load_tokenizer
from ...target.checkpoint import CheckpointError, check_device
from .check import ReplayUnavailable, Result, Runner, ending, first_fault
from .client import Endpoint, EndpointError
from .control import Departures, control_output, held_to_control
from .expected import (
    CONDITIONS,
    KV_BLOCK,
    LONG,
    LineError,
    Request,
    RequestsError,
    check_conditions,
    from_bundles,
    from_folders,
    is_id,
    json_line,
    parse_conditions,
    read_prompts,
    with_conditions,
)
from .report import EndpointReport
from .semantics import Prober, Texts
from .ties import DTYPES, Unreplayable, logprob_fault, replay, replay_limits

__all__ = [
    "CONDITIONS",
    "DTYPES",
    "Endpoint",
    "EndpointError",
    "LineError",
    "RequestsError",
    "UsageError",
    "parse_conditions",
    "verify_endpoint",
    "verify_outputs",
]


class UsageError(ValueError):
    """What the command line got wrong, found before any model loads or any request is sent (exit code 2)."""


def check_options(dtype: str, device: str) -> None:
    """The engine's dtype one DTYPES names; the device one torch has here (the reference and the replay run there)."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: choose from {', '.join(DTYPES)}")
    try:
        check_device(device, torch.float64)
    except CheckpointError as e:
        raise UsageError(f"--device: {e}") from None


def check_folders(target, draft, prompts) -> list[dict]:
    """What can be refused before the target loads: the prompt file (read, its prompts not empty), the draft
    folder (there, its config and weights load) and the target (a folder or a name, `check_target`) → the prompts
    (text still untokenized)."""
    if not (target and draft and prompts):
        raise UsageError("--target DIR, --draft DIR and --prompts FILE go together (or --bundle DIR)")
    try:
        entries = read_prompts(prompts)
    except LineError:
        raise
    except RequestsError as e:
        raise UsageError(str(e)) from None
    check_target(target)
    try:
        check_draft_folder(draft)
    except CheckpointError as e:
        raise UsageError(f"--draft {e}") from None
    return entries


def check_target(target) -> None:
    """--target as `generate --target` takes it: a model folder, or a target's name (loading.folder.TARGET_NAMES)."""
    try:
        check_target_name(target)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _tokenizer(folder):
    """The target folder's tokenizer, or None where it has none (ids are then said as numbers)."""
    try:
        return load_tokenizer(folder)
    except (CheckpointError, ImportError):
        return None


def _words(tokenizer):
    if tokenizer is None:
        return lambda t: f"#{t}"
    return lambda t: f"{tokenizer.decode([int(t)])!r} (#{t})"


class _Replayer:
    """ties.replay on the target loaded in float64 and in the engine's dtype (each departure's drift), once, at
    their first use; and the control on the latter (control.py)."""

    def __init__(self, folder, device: str, dtype: str) -> None:
        self.folder, self.device, self.dtype = folder, device, dtype
        self.target = self.target_d = None

    def load(self):
        """The target in float64 and in the engine's dtype (loaded at the first call) → the first; or
        ReplayUnavailable saying why not."""
        if self.target is None:
            try:
                self.target = load_target(self.folder, dtype=torch.float64, device=self.device)
                self.target_d = load_target(self.folder, dtype=DTYPES[self.dtype], device=self.device)
            except (ValueError, RuntimeError, MemoryError, ImportError, OSError) as e:  # said, never a traceback
                raise ReplayUnavailable(
                    f"the float64 replay of {self.folder} on {self.device} could not load it: {type(e).__name__}: {e}"
                ) from None
        return self.target

    def __call__(self, prompt_ids: list[int], output_ids: list[int]):
        return replay(self.load(), prompt_ids, output_ids, self.dtype, self.target_d)

    def logprobs(self, prompt_ids: list[int], output_ids: list[int], logprobs: list[float]) -> str:
        """ties.logprob_fault on the targets loaded here."""
        return logprob_fault(self.load(), self.target_d, prompt_ids, output_ids, logprobs)

    def control(self, requests: list[Request], progress=print) -> Departures:
        """The control's departures: each distinct request (prompt, max_tokens, stops) decoded by the target in the
        engine's dtype, its output replayed as a server's is."""
        self.load()
        control, seen = Departures("the control"), set()
        for r in requests:
            key = (tuple(r.prompt_ids), r.max_new_tokens, tuple(r.stop_ids))
            if key in seen:
                continue
            seen.add(key)
            progress(f"control: {r.name} decoded by the target in {self.dtype}, replayed in float64")
            output = control_output(self.target_d, r.prompt_ids, r.max_new_tokens, r.stop_ids)
            control.add(self(r.prompt_ids, output), len(output))
        return control


def _held(replayer: _Replayer, requests: list[Request], results: list[Result], progress) -> tuple[bool, str, dict]:
    """The server's departures (its outputs replayed) held to the control's → (failed, the sentence, both figures)."""
    server = Departures("the server")
    for r in results:
        if r.ids is not None:
            server.add(r.divergences, len(r.ids))
    try:
        control = replayer.control(requests, progress)
    except ReplayUnavailable as e:
        return False, f"no control run: {e}", {"server": server.to_dict()}
    failed, said = held_to_control(server, control)
    return failed, said, {"server": server.to_dict(), "control": control.to_dict()}


def verify_endpoint(
    url: str,
    bundle=None,
    target=None,
    draft=None,
    prompts=None,
    model: str | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    conditions: list[str] | None = None,
    max_new_tokens: int = 64,
    timeout: float | None = None,
    progress=print,
    outputs_only: bool = False,
    long: int = LONG,
    plain: str | None = None,
) -> EndpointReport:
    """The requests of `bundle` (a folder of bundles of one model pair), or of `prompts` on the folders `target` and
    `draft`, through the server at `url`, each held to the reference's run of it alone (module docstring);
    `outputs_only`: a request whose output is right passes without its speculation seen (check.py); `long`: the
    length of the "long" condition's prompt (expected.LONG); `plain`: the URL of the same model served without
    speculation, whose answers the API's fields are held to (semantics.py).
    UsageError: the arguments; EndpointError: the server; RequestsError: the bundles."""
    check_options(dtype, device)
    conditions = ["alone"] if conditions is None else conditions
    try:
        check_conditions(conditions)
    except RequestsError as e:
        raise UsageError(str(e)) from None
    if bundle is None:
        entries = check_folders(target, draft, prompts)
    elif target or draft or prompts:
        raise UsageError("--bundle carries its own target, draft and prompts: give it, or --target/--draft/--prompts")
    elif conditions != ["alone"]:
        raise UsageError("--serving goes with --prompts: a bundle folder's serving scenarios say how they are sent")
    endpoint = Endpoint(url, model, **({"timeout": timeout} if timeout else {}))
    progress(f"{endpoint.url}: {endpoint.engine}, model {endpoint.model}")
    plain_route = Endpoint(plain, None, **({"timeout": timeout} if timeout else {})) if plain else None
    if plain_route is not None:
        progress(f"{plain_route.url}: the plain route ({plain_route.engine}, model {plain_route.model})")
    if bundle is not None:
        requests, folder = from_bundles(bundle, list(endpoint.models))
        tokenizer = _tokenizer(folder)
    else:
        folder = target
        tokenizer = _tokenizer(folder)
        if tokenizer is None and any(e["prompt_ids"] is None for e in entries):
            raise UsageError(f"--prompts has text, and --target {target} has no tokenizer: give prompt_ids")
        entries = read_prompts(prompts, tokenizer, max_new_tokens)
        progress(f"loading the reference: target {target}, draft {draft}, float32 on {device}")
        try:  # a target that does not load, a draft that does not fit it: said
            draft_model = load_draft(draft, torch.float32, device)
            target_model = load_target(folder, dtype=torch.float32, device=device)
            stops = folder_stop_ids(folder, tokenizer) if tokenizer is not None else []
        except ValueError as e:
            raise UsageError(str(e)) from None
        positions = min(target_model.config.max_position_embeddings, draft_model.config.max_position_embeddings)
        for e in entries:  # a prompt the reference cannot run: its line, before any is run or sent
            try:
                check_request(torch.tensor([e["prompt_ids"]]), e["max_tokens"], positions,
                              target_model.config.vocab_size, stops)  # fmt: skip
            except ValueError as error:
                raise LineError(f"--prompts {prompts}, line {e['line']}: {error}") from None
        block = endpoint.kv_block()
        if any(c in ("repeat", "shared-prefix") for c in conditions):
            progress(f"a prefix to be cached spans twice {block or KV_BLOCK} tokens: the server's KV block"
                     + (" (its vllm:cache_config_info)" if block else f" is not said by it, {KV_BLOCK} is the "
                        "largest default we know (vLLM on a CPU)"))  # fmt: skip
        try:  # what a serving condition makes of them (a long prompt past the positions): said with its name
            sent = with_conditions(entries, conditions, long, block or KV_BLOCK)
            requests = from_folders(target_model, draft_model, sent, stops, progress)
        except ValueError as e:
            raise UsageError(f"--serving {','.join(conditions)}: {e}") from None
        del draft_model, target_model
        gc.collect()
    retokenize = (lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]) if tokenizer else None
    detokenize = (lambda ids: tokenizer.decode(ids)) if tokenizer else None
    replayer = _Replayer(folder, device, dtype)
    specials = set(getattr(tokenizer, "all_special_ids", None) or []) if tokenizer else set()
    runner = Runner(endpoint, replayer, _words(tokenizer), dtype, retokenize, detokenize, progress, outputs_only,
                    specials)  # fmt: skip
    results = runner.run(requests)
    probes = Prober(endpoint, Texts(tokenizer), plain_route, progress).run(results) if tokenizer else []
    reported = runner.counting or any(r.completion is not None and r.completion.accepted is not None for r in results)
    held = _held(replayer, requests, results, progress)
    header = [
        f"endpoint {endpoint.url} ({endpoint.engine}), model {endpoint.model}; engine dtype {dtype}",
        f"reference: {'the bundles at ' + str(bundle) if bundle else f'target {target}, draft {draft}'} "
        f"(float32, each request alone); acceptance from "
        + ("the server's counters around each request" if runner.counting else "each response, where it has it"),
    ]
    if tokenizer is None:
        header.append("the API's fields not probed: the target has no tokenizer to read texts with")
    return EndpointReport(header, results, runner.shared, reported, held=held, probes=probes)


def verify_outputs(path, target, dtype: str = "float32", device: str = "cpu", progress=print) -> EndpointReport:
    """A file of outputs (one JSON object a line: prompt_ids, output_ids, optionally logprobs, name, max_tokens,
    stop_token_ids) against the target's float64 argmax at every position: pass, tie or FAIL, as for a server. A
    line that cannot be judged (not JSON, a field of the wrong kind, an empty output, ids outside the target's
    vocabulary or past its positions) refuses the whole file, naming its line (LineError), before any is judged:
    never a run that leaves a line out, nor one whose verdicts are thrown away at a later line."""
    check_options(dtype, device)
    if not target:
        raise UsageError("--outputs needs --target DIR: the target the outputs came from")
    lines = _read_outputs(path)
    check_target(target)
    tokenizer = _tokenizer(target)
    words = _words(tokenizer)
    replayer = _Replayer(target, device, dtype)
    progress(f"loading {target} in float64 on {device}")
    try:
        model = replayer.load()
    except ReplayUnavailable as e:
        raise UsageError(f"--target {target}: {e}") from None
    for n, line in lines:
        problem = _outside(model, line["prompt_ids"], line["output_ids"])
        if problem:
            raise LineError(f"--outputs {path}, line {n}: {problem}")
    results = []
    for _, line in lines:
        progress(f"replaying {line['name']} ({len(line['output_ids'])} tokens) in float64")
        output, stops, max_tokens = line["output_ids"], line.get("stop_token_ids"), line.get("max_tokens")
        request = Request(line["name"], line["prompt_ids"], max_tokens or len(output), stops or [], [], [])
        divergences = replayer(line["prompt_ids"], output)
        # where the output ends: judged as far as the line says its limits (a stop past, max_tokens over; and
        # with both, an end at neither)
        at, wrong = ending(output, max_tokens or len(output), set(stops or []), None)
        if wrong.startswith("ended after") and not (max_tokens and stops is not None):
            at, wrong = None, ""
        fault = first_fault(divergences, at, wrong, words)
        first = next((d for d in divergences if not d.excused), divergences[0] if divergences else None)
        status = "FAIL" if fault else "tie" if divergences else "pass"
        said = fault or (first.said(words) if first else "the target's float64 argmax at every position")
        logprobs, note = line.get("logprobs"), ""
        if first is not None and logprobs is not None:
            note = f"its own logprob of its token there: {logprobs[first.index]}"
        results.append(Result(request, status, said, divergences=divergences, note=note, ids=list(output)))
    header = [f"outputs {path} against target {target} replayed in float64; their dtype {dtype}"]
    held = _held(replayer, [r.request for r in results], results, progress)
    return EndpointReport(header, results, reported=True, kind="outputs", held=held)


def _outside(model, prompt: list[int], output: list[int]) -> str:
    """What of a line the target cannot replay (ties.replay would refuse it), in words; "" where nothing."""
    try:
        replay_limits(model, prompt, output)
    except Unreplayable as e:
        return str(e)
    return ""


def _read_outputs(path) -> list[tuple[int, dict]]:
    """The outputs file → [(line number, entry)], every line checked (LineError naming the first that is not
    one), blank lines skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--outputs {path}: {e}") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"--outputs {path}, line {n}"
        entry = json_line(line, where)
        if not isinstance(entry, dict):
            raise LineError(f"{where}: not a JSON object")
        for key in ("prompt_ids", "output_ids"):
            ids = entry.get(key)
            if not isinstance(ids, list) or not all(is_id(t) for t in ids):
                raise LineError(f"{where}: {key} must be a list of token ids ≥ 0")
            if not ids:  # nothing to check is no pass
                raise LineError(f"{where}: an empty {key}: nothing to check")
        stops, limit, name = entry.get("stop_token_ids"), entry.get("max_tokens"), entry.get("name", f"line{n}")
        if stops is not None and not (isinstance(stops, list) and all(is_id(t) for t in stops)):
            raise LineError(f"{where}: stop_token_ids must be a list of token ids ≥ 0")
        if limit is not None and not (is_id(limit) and limit >= 1):
            raise LineError(f"{where}: max_tokens must be a whole number ≥ 1, got {limit!r}")
        if not isinstance(name, str) or not name.strip():
            raise LineError(f"{where}: name must be a non-empty string, got {json.dumps(name)[:40]}")
        logprobs = entry.get("logprobs")
        if logprobs is not None and not (
            isinstance(logprobs, list)
            and all(x is None or (isinstance(x, int | float) and not isinstance(x, bool)) for x in logprobs)
            and len(logprobs) == len(entry["output_ids"])
        ):
            raise LineError(f"{where}: logprobs must be a list of numbers, one per output token, got "
                            f"{json.dumps(logprobs)[:40]}")  # fmt: skip
        entry["name"] = name
        out.append((n, entry))
    if not out:
        raise UsageError(f"--outputs {path}: no output in it")
    return out
