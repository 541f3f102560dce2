"""An OpenAI-compatible server as the kit sees it from outside: ordinary requests over HTTP (the standard library's
urllib: nothing to install), never a change to the server's configuration.

    GET  /v1/models        the models it serves (`owned_by` names the engine: vllm, llamacpp, sglang, …)
    POST /v1/completions   one greedy (or seeded) completion, the prompt as token ids
    GET  /metrics          Prometheus counters (vLLM's `vllm:spec_decode_*`), read around a request

What a completion hands back, each engine in its own field:

    output ids     `choices[0].token_ids` (vLLM, asked with return_token_ids), else the ids of
                   `choices[0].logprobs.content` (llama-server, asked with logprobs), else none: the output is
                   then only text, and the kit re-tokenizes it with the target's tokenizer (said in the report)
    acceptance     `timings.draft_n` / `draft_n_accepted` (llama-server), `meta_info.spec_accept_token_num` /
                   `spec_draft_token_num` / `spec_verify_ct` (SGLang); vLLM reports none per request: its
                   counters are read before and after a request sent alone (`Endpoint.counters`)
    cached prefix  `usage.prompt_tokens_details.cached_tokens` (vLLM, llama-server), `timings.cache_n`
                   (llama-server), `meta_info.cached_tokens` (SGLang); vLLM's prefix-cache counters around a request
    prefill steps  vLLM's histogram of tokens per engine step around a request: a prompt prefilled in chunks
                   takes several steps of many tokens (SERVING_COUNTERS, STEP_TOKENS)
    KV block       vLLM's `vllm:cache_config_info{block_size=…}` (`Endpoint.kv_block`): what a cache hit is made of

Each failure is one EndpointError whose message is a line a person can act on: the URL unreachable, a 4xx or 5xx
with the server's own message, a timeout, an answer that is not the protocol's.
"""

from __future__ import annotations

import contextlib
import html
import http.client
import json
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

TIMEOUT = 600.0  # seconds for one request: a CPU server can take minutes on a long prompt
API_KEY = "OPENAI_API_KEY"  # sent as a bearer token where set, as OpenAI's clients do
# vLLM's speculative-decoding counters (Prometheus names, without the _total suffix a counter is exposed with)
VLLM_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}
# vLLM's counters of its serving conditions (tokens), and the histogram of tokens per engine step (its samples:
# `_bucket{le=…}`, `_count`): read beside the speculative ones, kept apart from them
SERVING_COUNTERS = {"prefix_queries": "vllm:prefix_cache_queries", "prefix_hits": "vllm:prefix_cache_hits"}
STEP_TOKENS = "vllm:iteration_tokens_total"


class EndpointError(RuntimeError):
    """What went wrong talking to the server, in one line; `refused`: the server answered 4xx (it will not take
    this request: a prompt too long, a model it does not serve), not a failure of its own; a 408 (timeout) or 429
    (too many requests) is the server's state, not a refusal."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


@dataclass
class Completion:
    """What the server returned for one request, as it said it: nothing recomputed."""

    output_ids: list[int] | None  # None: the server returned text only
    text: str
    finish_reason: str | None
    accepted: int | None = None  # draft tokens accepted, where the server reports it per request
    drafted: int | None = None  # draft tokens proposed, likewise
    cached: int | None = None  # prompt tokens taken from its prefix cache, where it says
    logprobs: list[float] | None = None  # its log-probability of each output token, where asked and given
    reported_by: str = ""  # which field the acceptance came from
    pieces: list[tuple[list[int], str]] | None = None  # streamed: each chunk's ids and text, where some lack ids
    chunks: list[int] | None = None  # streamed: how many tokens each chunk carried, where every chunk gave its ids
    raw: dict = field(default_factory=dict, repr=False)


ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1")  # a base URL given with a route after it


def _clean_url(url: str) -> str:
    """The server's base URL: `http://host:port` (a trailing route of the API, /v1/completions, /v1/models or /v1,
    and a trailing / dropped: a URL copied from a client's settings works); anything else is refused."""
    if not re.match(r"^https?://(\[[0-9a-fA-F:.]+\]|[^/\s:\[\]]+)(:\d+)?(/\S*)?$", url or ""):
        raise EndpointError(
            f"--endpoint {url!r} is not an http:// or https:// URL of a host and port (e.g. http://127.0.0.1:8000)"
        )
    url = url.rstrip("/")
    route = next((r for r in ROUTES if url.endswith(r)), "")
    return url[: len(url) - len(route)]


class Endpoint:
    """One server: `url` its base (http://host:port, with or without /v1), `model` the model to ask for (default:
    the only one it serves)."""

    def __init__(self, url: str, model: str | None = None, timeout: float = TIMEOUT) -> None:
        self.url, self.timeout = _clean_url(url), timeout
        self.models = self._models()
        if model is None:
            if len(self.models) != 1:
                raise EndpointError(
                    f"{self.url} serves {len(self.models)} models ({', '.join(self.models) or 'none'}): name one "
                    "with --model"
                )
            model = next(iter(self.models))
        elif model not in self.models:
            raise EndpointError(f"{self.url} does not serve the model {model!r}; it serves {', '.join(self.models)}")
        self.model = model
        self.engine = self.models[model] or "unknown"  # owned_by: vllm, llamacpp, sglang, …

    # -- the protocol -------------------------------------------------------------------------------------------
    def request(self, path: str, body: dict | None = None) -> urllib.request.Request:
        """A GET (no body) or a JSON POST to `path`, with the API key where one is set."""
        request = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        if os.environ.get(API_KEY):
            request.add_header("Authorization", f"Bearer {os.environ[API_KEY]}")
        return request

    def _call(self, path: str, body: dict | None = None, timeout: float | None = None) -> bytes:
        seconds = timeout or self.timeout
        try:
            with open_within(self.request(path, body), seconds) as response:
                return response.read()
        except urllib.error.HTTPError as e:
            raise http_error(e, self.url + path) from None
        except RequestExpired:
            raise EndpointError(f"{self.url}{path} did not answer in {seconds:g} s (its whole answer)") from None
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, TimeoutError) or "timed out" in str(reason):
                raise EndpointError(f"{self.url}{path} did not answer in {seconds:g} s") from None
            raise EndpointError(_unreachable(reason, self.url)) from None
        except (OSError, http.client.HTTPException, ValueError) as e:  # a timeout, a dropped or garbled answer
            if isinstance(e, TimeoutError) or "timed out" in str(e):
                raise EndpointError(f"{self.url}{path} did not answer in {seconds:g} s") from None
            if isinstance(e, ssl.SSLError):
                raise EndpointError(_unreachable(e, self.url)) from None
            raise EndpointError(f"{self.url}{path} failed: {type(e).__name__}: {e}") from None

    def _json(self, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        raw = self._call(path, body, timeout)
        try:
            answer = json.loads(raw)
        except json.JSONDecodeError:
            raise EndpointError(f"{self.url}{path} did not answer JSON: {raw[:120]!r}") from None
        if not isinstance(answer, dict):
            raise EndpointError(f"{self.url}{path} answered {type(answer).__name__}, not a JSON object")
        return answer

    def _models(self) -> dict[str, str]:
        """model id → owned_by, from /v1/models."""
        answer = self._json("/v1/models", timeout=min(self.timeout, 30))  # a host that drops packets: said soon
        data = answer.get("data")
        if not isinstance(data, list) or not all(isinstance(m, dict) and "id" in m for m in data):
            raise EndpointError(f"{self.url}/v1/models is not an OpenAI model list: {json.dumps(answer)[:160]}")
        return {m["id"]: str(m.get("owned_by") or "") for m in data}

    def complete(
        self,
        prompt: list[int] | str,
        max_tokens: int,
        stop_ids: list[int] | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        stop_texts: list[str] | None = None,
    ) -> Completion:
        """One completion of `prompt` (token ids, or text for a server that takes no ids): greedy at temperature 0,
        else sampled with `seed` and no top-k, top-p or min-p. The stop tokens go as ids (`stop_token_ids`, vLLM's
        and SGLang's field), the model's own EOS ignored (`ignore_eos`) so that only the stops asked for end the
        output, as they end the reference's; to a server that stops on strings only (llama-server) as their texts,
        its own EOS left on."""
        body = self.body(prompt, max_tokens, stop_ids, temperature, seed, stop_texts)
        return parse_completion(self._json("/v1/completions", body), f"{self.url}/v1/completions")

    def body(self, prompt, max_tokens, stop_ids, temperature, seed, stop_texts) -> dict:
        """A /v1/completions request (`complete`)."""
        body = {
            "model": self.model,
            "prompt": prompt if isinstance(prompt, str) else list(map(int, prompt)),
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
            "top_p": 1.0,
            "stream": False,
            "logprobs": 1,  # llama-server's only way to hand back token ids on this route
            "return_token_ids": True,  # vLLM's
            "stop_token_ids": [int(t) for t in stop_ids or []],
        }
        if stop_texts is not None:  # a server that stops on strings (llama-server) matches no special token's
            body["stop"] = stop_texts  # text: its own EOS must stay on, and the texts stop at the others
        else:
            body["ignore_eos"] = True
        if temperature > 0:  # the engines' ways to say "no top-k, no min-p"
            body.update(top_k=-1 if self.engine == "vllm" else 0, min_p=0.0)
        if seed is not None:
            body["seed"] = int(seed)
        return body

    def stream(self, prompt: list[int] | str, max_tokens: int, stop_ids=None, stop_texts=None) -> Streamed:
        """The greedy completion of `complete`, streamed in a thread (started): see Streamed."""
        body = self.body(prompt, max_tokens, stop_ids, 0.0, None, stop_texts)
        if self.engine == "llamacpp":  # its streamed chunks carry no logprobs for the draft tokens it accepted,
            body["verbose"] = True  # but with `verbose` each has the native chunk beside it (`__verbose.tokens`)
        streamed = Streamed(self, body)
        streamed.start()
        return streamed

    def detokenize(self, token: int) -> str | None:
        """A token's text in the server's own words (/detokenize: llama-server, vLLM), None where it has none."""
        try:
            answer = self._json("/detokenize", {"tokens": [int(token)], "model": self.model})
        except EndpointError:
            return None
        text = answer.get("content", answer.get("prompt"))
        return text if isinstance(text, str) else None

    def metrics(self) -> str | None:
        """/metrics' text, None where the server has none."""
        try:
            return self._call("/metrics", timeout=30).decode(errors="replace")
        except EndpointError:
            return None

    def counters(self) -> dict[str, float] | None:
        """vLLM's counters now (parse_counters), or None where /metrics has none of them."""
        text = self.metrics()
        return parse_counters(text) if text is not None else None

    def kv_block(self) -> int | None:
        """The tokens a KV cache block holds, as the server says it (vLLM's cache_config_info), else None."""
        text = self.metrics() or ""
        found = re.search(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', text, re.M)
        return int(found.group(1)) if found else None


EXCERPT = 160  # characters of a server's error body said at most


def _server_message(body: str) -> str:
    """The error a server put in its body (OpenAI's {"error": {"message"}}, vLLM's {"message"}), else its text: an
    HTML page (a proxy's or a web framework's 404) as its plain words, at most EXCERPT characters of them."""
    try:
        answer = json.loads(body)
    except json.JSONDecodeError:
        return _excerpt(_plain_text(body)) or "(no message)"
    if isinstance(answer, dict):
        error = answer.get("error", answer)
        if isinstance(error, dict):
            return _excerpt(str(error.get("message") or error.get("detail") or error))
        return _excerpt(str(error))
    return _excerpt(str(answer))


def _plain_text(body: str) -> str:
    """A body's words without its markup (HTML's scripts, styles and tags dropped, entities read), on one line."""
    if re.search(r"<(!doctype|html|head|body|title|h1|p)\b", body, re.IGNORECASE):
        body = re.sub(r"<(script|style)\b.*?</\1\s*>", " ", body, flags=re.IGNORECASE | re.DOTALL)
        body = html.unescape(re.sub(r"<[^>]*>", " ", body))
    return " ".join(body.split())


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT else text[: EXCERPT - 1].rstrip() + "…"


def parse_completion(answer: dict, where: str) -> Completion:
    """A /v1/completions answer → Completion: its ids, text and whatever acceptance it reports (module docstring);
    an answer whose fields are not what the protocol says is an EndpointError."""
    try:
        return _parse_completion(answer, where)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise EndpointError(f"{where} answered fields that are not the protocol's ({type(e).__name__}: {e})") from None


def _parse_completion(answer: dict, where: str) -> Completion:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EndpointError(f"{where} answered no choices: {json.dumps(answer)[:160]}")
    choice = choices[0]
    ids, logprobs = choice.get("token_ids"), None
    if ids is not None and not isinstance(ids, list):
        raise EndpointError(f"{where} answered token_ids that are no list: {json.dumps(ids)[:80]}")
    given = choice.get("logprobs")
    content = logprobs_content(choice, where)
    if content:
        if ids is None and all("id" in c for c in content):
            ids = [c["id"] for c in content]
        if all("logprob" in c for c in content):
            logprobs = [_logprob(c["logprob"], where) for c in content]
    elif isinstance(given, dict) and given.get("token_logprobs") is not None:
        if not isinstance(given["token_logprobs"], list):
            raise EndpointError(f"{where} answered logprobs.token_logprobs that are no list")
        logprobs = [_logprob(x, where) if x is not None else float("nan") for x in given["token_logprobs"]]
    out = Completion(
        token_ids(ids, where) if ids is not None else None,
        str(choice.get("text") or ""),
        choice.get("finish_reason"),
        logprobs=logprobs,
        raw=answer,
    )
    timings, meta = answer.get("timings") or {}, answer.get("meta_info") or choice.get("meta_info") or {}
    if "draft_n_accepted" in timings:  # llama-server
        out.accepted, out.reported_by = _count(timings, "draft_n_accepted", where), "timings"
        out.drafted = _count(timings, "draft_n", where) if "draft_n" in timings else None
    elif "spec_accept_token_num" in meta:  # SGLang
        out.accepted = _count(meta, "spec_accept_token_num", where)
        out.drafted = _count(meta, "spec_draft_token_num", where) if "spec_draft_token_num" in meta else None
        out.reported_by = "meta_info"
    elif "spec_verify_ct" in meta and "completion_tokens" in meta:  # SGLang without the counts: x_0 + Σ (τ + 1)
        out.accepted = _count(meta, "completion_tokens", where) - 1 - _count(meta, "spec_verify_ct", where)
        out.reported_by = "meta_info (completion_tokens − 1 − spec_verify_ct)"
    details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", meta.get("cached_tokens", timings.get("cache_n")))
    out.cached = int(cached) if isinstance(cached, int | float) else None
    return out


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def token_ids(values: list, where: str) -> list[int]:
    """A server's token ids, each a JSON whole number ≥ 0: a float (5.7, or 5.0) or a string is a malformed answer
    (EndpointError), never rounded into an id that would then be judged."""
    bad = [v for v in values if not _is_id(v)]
    if bad:
        raise EndpointError(f"{where} answered a token id that is not a whole number ≥ 0: {json.dumps(bad[0])[:40]}")
    return list(values)


def logprobs_content(choice: dict, where: str) -> list[dict]:
    """A choice's `logprobs.content` entries (llama-server's and OpenAI chat's), [] where it has none; logprobs that
    are neither absent, null nor an object of the protocol's shape are a malformed answer (EndpointError)."""
    given = choice.get("logprobs")
    if given is None:
        return []
    if not isinstance(given, dict):
        raise EndpointError(f"{where} answered logprobs that are no object: {json.dumps(given)[:60]}")
    content = given.get("content")
    if content is None:
        return []
    if not isinstance(content, list) or not all(isinstance(c, dict) for c in content):
        raise EndpointError(f"{where} answered logprobs.content that is no list of objects: {json.dumps(content)[:60]}")
    return content


def _logprob(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EndpointError(f"{where} answered a logprob that is no number: {json.dumps(value)[:40]}")
    return float(value)


def _count(fields: dict, name: str, where: str) -> int:
    """An acceptance count the server reports: a whole number ≥ 0, else a malformed answer."""
    if not _is_id(fields[name]):
        raise EndpointError(f"{where} answered {name} that is not a whole number ≥ 0: {json.dumps(fields[name])[:40]}")
    return fields[name]


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_counters(text: str) -> dict[str, float] | None:
    """Prometheus text → vLLM's counters (VLLM_COUNTERS and SERVING_COUNTERS), each summed over its other labels;
    per position as `accepted_per_pos.{i}`; the steps of STEP_TOKENS as `steps` and `steps_le.{bound}` (steps of
    at most that many tokens). None where none is there."""
    names = {v: k for k, v in (VLLM_COUNTERS | SERVING_COUNTERS).items()}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        if m.group(1) in (f"{STEP_TOKENS}_bucket", f"{STEP_TOKENS}_count"):
            bound = re.search(r'le="([^"]+)"', m.group(2) or "")
            key = "steps" if m.group(1).endswith("_count") else f"steps_le.{bound.group(1) if bound else '+Inf'}"
            out[key] = out.get(key, 0.0) + float(m.group(3))
            continue
        name = m.group(1).removesuffix("_total")
        if name not in names:
            continue
        key = names[name]
        if key == "accepted_per_pos":
            position = re.search(r'position="(\d+)"', m.group(2) or "")
            if not position:
                continue
            key = f"accepted_per_pos.{position.group(1)}"
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out or None


class Streamed(threading.Thread):
    """One completion streamed (server-sent events) in a thread of its own: `produced` counts the output tokens
    seen so far (ids where the chunks carry them, else one a chunk), so that other requests can be sent while it
    decodes; `completion` (a Completion) or `error` (an EndpointError) once it ends. `first_at` and `ended_at`:
    when its first token came and when it ended (time.monotonic), for when streams were in flight together."""

    def __init__(self, endpoint: Endpoint, body: dict) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        self.produced = 0
        self.completion: Completion | None = None
        self.error: EndpointError | None = None
        self.first_at: float | None = None
        self.ended_at: float | None = None

    def run(self) -> None:
        try:
            self._read()
        finally:
            self.ended_at = time.monotonic()

    def _read(self) -> None:
        pieces, contents, last, finish = [], [], {}, None  # pieces: each chunk's (ids, text)
        try:
            with open_within(self.endpoint.request("/v1/completions", self.body), self.endpoint.timeout) as response:
                for line in response:
                    line = line.decode(errors="replace").strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data:") :])
                    if "error" in chunk:
                        raise EndpointError(f"{self.endpoint.url}/v1/completions: {_server_message(line[5:])}")
                    last.update({k: chunk[k] for k in ("timings", "usage", "meta_info") if chunk.get(k)})
                    for choice in chunk.get("choices") or []:
                        content = logprobs_content(choice, f"{self.endpoint.url}/v1/completions")
                        native = (chunk.get("__verbose") or {}).get("tokens")  # llama-server's, asked for
                        got = choice.get("token_ids") or native or [c["id"] for c in content if "id" in c]
                        if not isinstance(got, list):
                            raise EndpointError(f"{self.endpoint.url}/v1/completions streamed token ids that are no "
                                                f"list: {json.dumps(got)[:60]}")  # fmt: skip
                        contents += content
                        pieces.append((got, choice.get("text") or ""))
                        finish = choice.get("finish_reason") or finish
                        self.produced += len(got) or bool(choice.get("text"))
                        if self.produced and self.first_at is None:
                            self.first_at = time.monotonic()
        except EndpointError as e:
            self.error = e
            return
        except urllib.error.HTTPError as e:
            self.error = http_error(e, self.endpoint.url + "/v1/completions")
            return
        except RequestExpired:
            self.error = EndpointError(
                f"{self.endpoint.url}/v1/completions did not finish streaming in {self.endpoint.timeout:g} s"
            )
            return
        except Exception as e:  # noqa: BLE001 - unreachable, a timeout, a chunk that is not the protocol's: one line
            self.error = EndpointError(f"{self.endpoint.url}/v1/completions failed while streaming: {e!r}")
            return
        # llama-server streams no logprobs (so no ids) for the draft tokens it accepted: ids with gaps are no output
        gaps = any(text and not got for got, text in pieces)
        ids = [t for got, _ in pieces for t in got]
        choice = {
            "text": "".join(t for _, t in pieces),
            "finish_reason": finish,
            "token_ids": None if gaps else ids or None,
        }
        if contents and not gaps:
            choice["logprobs"] = {"content": contents}
        try:
            self.completion = parse_completion({"choices": [choice], **last}, self.endpoint.url)
        except EndpointError as e:
            self.error = e
            return
        self.completion.pieces = pieces if gaps else None
        self.completion.chunks = None if gaps else [len(got) for got, _ in pieces if got] or None


def http_error(e: urllib.error.HTTPError, where: str) -> EndpointError:
    """A 4xx or 5xx answer as one line, in the server's own words (EndpointError.refused: a 4xx but 408 and 429); a
    404 says the route it was asked on, which a URL with a path of its own moves."""
    said = _server_message(e.read().decode(errors="replace"))
    hint = " (no such route there: give the server's base URL, e.g. http://host:8000)" if e.code == 404 else ""
    return EndpointError(
        f"{where} answered {e.code} {e.reason}{hint}: {said}", 400 <= e.code < 500 and e.code not in (408, 429)
    )


class RequestExpired(TimeoutError):
    """A request's deadline passed before its answer was whole (`open_within`)."""


@contextlib.contextmanager
def open_within(request: urllib.request.Request, seconds: float):
    """urlopen(request) whose whole exchange, connecting and every byte of the answer read in the block, must end
    within `seconds`: else RequestExpired. urlopen's own timeout bounds each read alone, so a server that trickles a
    byte a second would hold a request for as long as it likes; here a timer shuts the connection's socket when the
    time is up, whatever it is doing then."""
    expired, lock, sockets = threading.Event(), threading.Lock(), []

    def shut(sock) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed already
            pass

    def register(sock):
        with lock:
            sockets.append(sock)
            if expired.is_set():
                shut(sock)
        return sock

    def expire() -> None:
        with lock:
            expired.set()
            for sock in sockets:
                shut(sock)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    opener = urllib.request.build_opener(_Handler(register), _SecureHandler(register))
    timer.start()
    try:
        try:
            with opener.open(request, timeout=seconds) as response:
                yield response
        except (OSError, http.client.HTTPException, ValueError):
            if expired.is_set():
                raise RequestExpired(f"no whole answer in {seconds:g} s") from None
            raise
    finally:
        timer.cancel()
    if expired.is_set():  # a socket shut mid-answer may read as the answer's end: never taken as whole
        raise RequestExpired(f"no whole answer in {seconds:g} s")


def _registering(base: type, register) -> type:
    """`base` (an http.client connection class) whose socket is handed to `register` as soon as it is made."""

    class Connection(base):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = lambda *a, **k: register(socket.create_connection(*a, **k))

    return Connection


class _Handler(urllib.request.HTTPHandler):
    def __init__(self, register) -> None:
        super().__init__()
        self.connection = _registering(http.client.HTTPConnection, register)

    def http_open(self, req):
        return self.do_open(self.connection, req)


class _SecureHandler(urllib.request.HTTPSHandler):
    def __init__(self, register) -> None:
        super().__init__()
        self.connection = _registering(http.client.HTTPSConnection, register)

    def https_open(self, req):
        return self.do_open(self.connection, req, context=self._context)


def _unreachable(reason, url: str) -> str:
    """Why a server could not be reached, as one line one can act on; TLS asked of a server that speaks plain HTTP
    (OpenSSL's "wrong version number", "record layer failure", "packet length too long") said so."""
    said = str(reason)
    plain = ("WRONG_VERSION_NUMBER", "wrong version number", "RECORD_LAYER_FAILURE", "record layer failure",
             "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")  # fmt: skip
    if url.startswith("https://") and isinstance(reason, ssl.SSLError) and any(p in said for p in plain):
        return f"{url} does not speak TLS (https): it answered as a plain-HTTP server; try http://{url[8:]} ({said})"
    return f"{url} is unreachable: {said}"
