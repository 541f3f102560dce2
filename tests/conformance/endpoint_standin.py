"""A stand-in OpenAI-compatible server for the protocol's tests (`verify --endpoint`): the real servers (vLLM's,
llama-server) run in .ci/engines; this one answers the same routes on the loopback in a thread, in the fields of
the engine it plays, and decodes with whatever `engine` it is given (the reference, or one with a bug).

    engine(prompt_ids, max_tokens, stop_ids, body) → (output ids, accepted draft tokens, τ per step; [] for an engine
                                                     that decodes a token a pass)
    flavor "vllm"      token_ids in the answer, acceptance only in /metrics (vllm:spec_decode_* counters), streamed a
                       step at a time (x_0, then τ + 1 tokens a chunk)
           "llamacpp"  ids in logprobs.content, acceptance in `timings`, stop tokens as strings (/detokenize),
                       streamed a token at a time
           "plain"     text only, no acceptance anywhere
    metrics_on = False a vLLM-like server without /metrics (its stream is then all that shows its steps)

Its serving conditions, as vLLM counts them in /metrics: a prefix cache of `kv_block`-token blocks (said in
`vllm:cache_config_info`; prefix_cache_queries / _hits in tokens), a per-step token budget (`budget`: a longer
prompt is prefilled in chunks) and the histogram of tokens per engine step; `on_hit`: another engine for a request
whose prefix came from the cache (a serving bug).

The protocol's fields, as an OpenAI server honours them: `stop` strings (the text cut before the first, or through
it with `include_stop_str_in_output`), finish_reason "stop" or "length", `n`, `echo`, `usage`, the special tokens
(`specials`) left out of the text unless `skip_special_tokens` is false; and the bugs a speculative route was seen
with: `ignores_stop` (stop strings not matched), `finish_stop` (finish_reason "stop" whatever ended it),
`drops_specials` (the special tokens left out whatever was asked).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandIn:
    def __init__(
        self, engine, flavor: str = "vllm", model: str = "stand-in", context: int = 4096, text=None, tokenize=None
    ) -> None:
        self.engine, self.flavor, self.model, self.context = engine, flavor, model, context
        self.tokenize = tokenize  # given: it takes text prompts only (a list of ids is a 400), read with it
        self.text = text or (lambda ids: "".join(f"<{t}>" for t in ids))  # ids → the answer's text
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.per_pos: dict[int, int] = {}
        self.requests: list[dict] = []  # every body received, for the tests to read
        self.lock = threading.Lock()
        self.delay = 0.0  # seconds per streamed token (arrivals need decoding to take a while)
        self.fail_with: tuple[int, str] | None = None  # (status, message): every completion answers it
        self.gaps = False  # llamacpp, streamed: every second chunk without logprobs (so without its id), as
        # llama-server streams the draft tokens it accepted
        self.trickle = 0.0  # seconds per byte of every answer's body: a server that trickles its answer
        self.html_404 = False  # an unknown route answered with a web framework's HTML page, not JSON
        self.metrics_on = True  # vllm: /metrics served
        self.kv_block = 4  # tokens per cached block
        self.budget: int | None = None  # tokens per engine step (None: any prompt in one step)
        self.on_hit = None  # an engine for requests that hit the prefix cache (a bug), else `engine`
        self.seen: list[list[int]] = []  # the prompts whose blocks are cached
        self.prefix = {"queries": 0, "hits": 0}
        self.steps: list[int] = []  # tokens of every engine step
        self.specials: set[int] = set()  # token ids whose text is left out unless skip_special_tokens is false
        self.ignores_stop = self.finish_stop = self.drops_specials = False  # a speculative route's bugs
        self.logprob_of = None  # output ids → a logprob each (llamacpp), or None: none given
        self.per_step = flavor == "vllm"  # streamed a step at a time (else a token at a time)

    def count(self, accepted: int, steps: list[int] | None = None) -> None:
        with self.lock:
            self.counters["accepted"] += accepted
            for tau in steps or []:
                self.counters["drafts"] += 1
                for i in range(tau):
                    self.per_pos[i] = self.per_pos.get(i, 0) + 1

    def cached(self, prompt: list[int]) -> int:
        """Tokens of `prompt` its cache holds: the longest prefix shared with a prompt seen, in whole blocks (the
        last token always recomputed); the prompt's blocks are cached from now on."""
        shared = max((next((i for i, (a, b) in enumerate(zip(prompt, seen)) if a != b), min(len(prompt), len(seen)))
                      for seen in self.seen), default=0)  # fmt: skip
        self.seen.append(list(prompt))
        return min(shared, len(prompt) - 1) // self.kv_block * self.kv_block

    def step(self, prompt_tokens: int, decode_steps: list[int]) -> None:
        """The engine steps of one request: its prefill in chunks of `budget`, then its decoding steps."""
        budget = self.budget or max(prompt_tokens, 1)
        self.steps += [min(budget, prompt_tokens - i) for i in range(0, prompt_tokens, budget)] + decode_steps

    def metrics(self) -> str:
        lines = [f'vllm:spec_decode_num_{k}_total{{model_name="{self.model}"}} {v}.0' for k, v in
                 (("drafts", self.counters["drafts"]), ("draft_tokens", self.counters["draft_tokens"]),
                  ("accepted_tokens", self.counters["accepted"]))]  # fmt: skip
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{self.model}",position="{i}"}} {n}.0'
            for i, n in sorted(self.per_pos.items())
        ]
        lines += [f'vllm:prefix_cache_{k}_total{{model_name="{self.model}"}} {v}.0' for k, v in self.prefix.items()]
        for bound in (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, float("inf")):
            le = "+Inf" if bound == float("inf") else f"{bound:.1f}"
            n = sum(t <= bound for t in self.steps)
            lines.append(f'vllm:iteration_tokens_total_bucket{{le="{le}",model_name="{self.model}"}} {n}.0')
        lines.append(f'vllm:iteration_tokens_total_count{{model_name="{self.model}"}} {len(self.steps)}.0')
        lines.append(f'vllm:cache_config_info{{block_size="{self.kv_block}",cache_dtype="auto"}} 1.0')
        return "# HELP vllm:spec_decode_num_drafts_total x\n" + "\n".join(lines) + "\n"


def _handler(standin: StandIn):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, status: int, body, content_type: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self._write(data)

        def _write(self, data: bytes) -> None:
            """The bytes at once, or one at a time `trickle` seconds apart (until the client hangs up)."""
            if not standin.trickle:
                self.wfile.write(data)
                return
            try:
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(standin.trickle)
            except OSError:  # the client gave up
                pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/v1/models":
                owner = {"plain": "someone"}.get(standin.flavor, standin.flavor)
                self._send(200, {"object": "list", "data": [{"id": standin.model, "owned_by": owner}]})
            elif self.path == "/metrics" and standin.flavor == "vllm" and standin.metrics_on:
                self._send(200, standin.metrics(), "text/plain")
            elif standin.html_404:
                page = "<!DOCTYPE html><html><head><title>404 Not Found</title><style>h1 {color: red}</style></head>"
                self._send(404, page + "<body><h1>Not Found</h1><p>The requested URL was not found.</p></body></html>"
                           * 20, "text/html")  # fmt: skip
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/detokenize":
                self._send(200, {"content": f"<{body['tokens'][0]}>"})
                return
            standin.requests.append(body)
            if standin.fail_with:
                self._send(standin.fail_with[0], {"error": {"message": standin.fail_with[1]}})
                return
            if body.get("model") != standin.model:
                self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
                return
            prompt = body["prompt"]
            if standin.tokenize is not None:
                if not isinstance(prompt, str):
                    self._send(400, {"error": {"message": "prompt must be a string"}})
                    return
                prompt = standin.tokenize(prompt)
            if len(prompt) + body["max_tokens"] > standin.context:
                self._send(400, {"error": {"message": f"maximum context length is {standin.context} tokens"}})
                return
            stops, texts = list(body.get("stop_token_ids") or []), list(body.get("stop") or [])
            if standin.flavor == "llamacpp":  # it stops on strings: a stop token's text read back to its id
                stops = [int(s.strip("<>")) for s in texts if s.startswith("<") and s.strip("<>").isdigit()]
                texts = [s for s in texts if not (s.startswith("<") and s.strip("<>").isdigit())]
            with standin.lock:
                hit = standin.cached(prompt)
                standin.prefix["queries"] += len(prompt)
                standin.prefix["hits"] += hit
            engine = standin.on_hit if hit and standin.on_hit is not None else standin.engine
            ids, accepted, steps = engine(prompt, body["max_tokens"], stops, body)
            with standin.lock:
                standin.step(len(prompt) - hit, [tau + 1 for tau in steps] or [1] * max(len(ids) - 1, 0))
            if standin.flavor == "vllm":
                standin.count(accepted, steps)
            finish = "stop" if standin.finish_stop or (ids and ids[-1] in stops) else "length"
            keep = body.get("skip_special_tokens", True) is False and not standin.drops_specials
            text = self._text(ids, keep)
            if texts and not standin.ignores_stop:
                ids, text, finish = self._stopped(ids, text, texts, bool(body.get("include_stop_str_in_output")), keep)
            if body.get("echo"):
                text = self._text(prompt, keep) + text
            if body.get("stream"):
                self._stream(ids, accepted, steps, finish)
            else:
                self._send(200, self._answer(ids, accepted, text, finish, int(body.get("n") or 1), len(prompt)))

        def _text(self, ids: list[int], keep_special: bool = False) -> str:
            return standin.text([t for t in ids if keep_special or t not in standin.specials])

        def _stopped(self, ids, text, stops, include, keep):
            """The output cut at the first stop string: the text before it (through it, `include`), the tokens whose
            text lies within that, finish_reason "stop"; unchanged where no stop string is in it."""
            found = [(text.find(s), s) for s in stops if s and s in text]
            if not found:
                return ids, text, "stop" if standin.finish_stop or (ids and ids[-1] in (stops or [])) else "length"
            at, stop = min(found)
            end = at + len(stop) if include else at
            kept = max((i for i in range(len(ids) + 1) if len(self._text(ids[:i], keep)) <= end), default=0)
            return ids[:kept], text[:end], "stop"

        def _choice(self, ids: list[int], finish, text: str | None = None) -> dict:
            choice = {"index": 0, "text": self._text(ids) if text is None else text, "finish_reason": finish}
            if standin.flavor == "vllm":
                choice["token_ids"] = ids
            elif standin.flavor == "llamacpp":  # its ids; a logprob each where `logprob_of` gives them
                lps = standin.logprob_of(ids) if standin.logprob_of else [None] * len(ids)
                choice["logprobs"] = {"content": [{"id": t, "token": f"<{t}>", **({"logprob": lp} if lp is not None
                                                  else {})} for t, lp in zip(ids, lps)]}  # fmt: skip
            return choice

        def _answer(self, ids: list[int], accepted: int, text: str, finish: str, n: int, prompt: int) -> dict:
            choices = [{**self._choice(ids, finish, text), "index": i} for i in range(n)]
            answer = {"object": "text_completion", "choices": choices,
                      "usage": {"prompt_tokens": prompt, "completion_tokens": len(ids)}}  # fmt: skip
            if standin.flavor == "llamacpp":
                answer["timings"] = {"draft_n": accepted + 1, "draft_n_accepted": accepted}
            return answer

        def _stream(self, ids: list[int], accepted: int, steps: list[int], finish: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            sizes = [1] * len(ids)  # a token a chunk, or x_0 and then each step's τ + 1 (the last one cut)
            if standin.per_step and steps:
                sizes, left = [1], len(ids) - 1
                for tau in steps:
                    if left > 0:
                        sizes.append(min(tau + 1, left))
                        left -= sizes[-1]
            at = 0
            for i, size in enumerate(sizes):
                time.sleep(standin.delay * size)
                piece, at = ids[at : at + size], at + size
                chunk = {"choices": [self._choice(piece, finish if i == len(sizes) - 1 else None)]}
                if standin.gaps and i % 2:
                    chunk["choices"][0]["logprobs"] = None
                if i == len(sizes) - 1 and standin.flavor == "llamacpp":
                    chunk["timings"] = {"draft_n": accepted + 1, "draft_n_accepted": accepted}
                self._write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self._write(b"data: [DONE]\n\n")

    return Handler


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that hung up (a timeout, a deadline) is the test's point, not an error: said nowhere (socketserver
        would print its traceback into whichever test's stderr is being captured then)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serving(standin: StandIn):
    """The stand-in on 127.0.0.1 (a free port) until the block ends → its base URL."""
    server = _Server(("127.0.0.1", 0), _handler(standin))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
