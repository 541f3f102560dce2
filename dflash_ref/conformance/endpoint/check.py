"""The requests through a server, each held to its reference run alone: its output tokens and its acceptance.

Sending. Requests without a serving entry, and scenario requests that wait for the one before to finish, go one at a
time. A scenario whose requests arrive while others decode (`arrive` with `tokens`) is streamed: each request is
sent once the one it follows has streamed that many tokens (engines/serving.arrives). A server that reports no
acceptance per request (vLLM) has its counters read before and after: around each request sent alone, so each has
its own count, and around a streamed scenario, whose requests then share one count held to the sum of theirs.

Judging a request (`judge`):

    output       pass where the server's output tokens are the reference's. Else the float64 replay (ties.py) of
                 the server's output: every position where its token is not the target's float64 argmax is a tie
                 (margin below the dtype's resolution), within the dtype's drift measured there, or neither; an
                 output that ran past a stop token or max_tokens, or ended before either, is a FAIL whatever its
                 tokens. All rounding: "tie"; else "FAIL" at the first position that is not. (Over the run, the
                 departures are held to the control's: control.py.) A server that leaves out the stop token it
                 stopped on (finish_reason "stop", as the protocol's stop strings are) is taken as having
                 produced it.
    speculation  observed, never assumed: a server that decodes its plain way gives the same output. Evidence,
                 from every source the server has: its response's speculative fields (llama-server's `timings`,
                 SGLang's `meta_info`: tokens drafted), its counters around the request (vLLM's drafts), or its
                 stream (a server that commits a step at a time streams the reference's τ + 1 a step: for a
                 request sent alone without either, it is sent again streamed). Without evidence an output that
                 passes is "unobserved", not pass (unless the operator accepts outputs only: --outputs-only).
    acceptance   compared only where the output is the reference's (another output is another run): the count in
                 [low, high] (expected.Request.accepted, judge.acceptance_parts), and per draft position where
                 the server counts so. In float32 a count outside is a FAIL; in bfloat16 or float16 the draft's own
                 argmax may fall at a near-tie too, so the count is reported beside the reference's, not judged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..ports.engines import serving
from .client import Completion, Endpoint, EndpointError
from .expected import Request
from .ties import Divergence, Unreplayable


class ReplayUnavailable(RuntimeError):
    """The float64 replay could not run (its target did not load): the request's verdict cannot be given."""


SETTLE = 2.0  # seconds to wait for a server's counters to take a request's last step in
SPECULATIVE = ("drafts", "draft_tokens", "accepted")  # the counters that say a speculative decoder runs


@dataclass
class Result:
    """One request's verdict: `status` pass | tie | unobserved (outputs right, speculation not seen) | FAIL | n/a
    (the server refused it) | error."""

    request: Request
    status: str
    output: str  # the output's verdict in words
    completion: Completion | None = None
    divergences: list[Divergence] = field(default_factory=list)
    accepted: int | None = None  # the server's count, where it has one for this request alone
    acceptance: str = ""  # its verdict in words
    acceptance_failed: bool = False
    note: str = ""  # how the ids were had, the cached prefix, …
    ids: list[int] | None = None  # the output tokens judged (None: none were had)
    speculation: str = ""  # whether speculative decoding was seen to run for it, and from what
    observed: bool | None = None  # True: seen; False: seen not to; None: no sign either way
    condition: str = ""  # whether its serving condition happened, and from what ("" where it was sent alone)
    exercised: bool | None = None  # True: the server's own figures show it; False: they show it did not; None: no sign

    @property
    def bounds(self) -> tuple[int, int]:
        return self.request.accepted()


@dataclass
class Shared:
    """One acceptance count for requests that were in flight together (a streamed scenario, counters)."""

    names: list[str]
    accepted: int
    bounds: tuple[int, int]
    verdict: str
    failed: bool


def settled_counters(endpoint: Endpoint, before: dict | None) -> dict | None:
    """The counters once they stop moving (two reads 0.1 s apart agree), at most SETTLE seconds."""
    deadline, last = time.monotonic() + SETTLE, endpoint.counters()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = endpoint.counters()
        if now == last and now != before:
            return now
        last = now
    return last


def delta(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}


class Runner:
    """Sends the requests (`run`) and judges each (`judge`): `replay(prompt, output)` gives the float64
    divergences (ties.replay on a target loaded once; ReplayUnavailable where it cannot load), `words(id)` a
    token's text, `dtype` the engine's; `retokenize(text)` / `detokenize(ids)` the target's tokenizer both ways
    (None: none), for a server that answers text only or takes prompts as text only."""

    def __init__(
        self,
        endpoint: Endpoint,
        replay,
        words,
        dtype: str,
        retokenize=None,
        detokenize=None,
        progress=print,
        outputs_only: bool = False,
        specials: set[int] | None = None,
    ) -> None:
        self.endpoint, self.replay, self.words, self.dtype = endpoint, replay, words, dtype
        self.outputs_only = outputs_only  # the operator accepts outputs without seeing speculation
        self.specials = specials or set()  # the tokenizer's special tokens, which a server's text may leave out
        self.retokenize, self.detokenize, self.progress = retokenize, detokenize, progress
        self.as_text = False  # the server refused a token-id prompt and took its text: prompts go as text
        self.ids_taken = False  # a token-id prompt was answered: a later refusal is the request's own
        counters = endpoint.counters()  # vLLM's /metrics: its speculative counters, and its serving ones
        self.metered = counters is not None
        self.counting = self.metered and any(k in counters for k in SPECULATIVE)
        self.shared: list[Shared] = []
        self._stop_texts: dict[int, str | None] = {}

    # -- sending ------------------------------------------------------------------------------------------------
    def run(self, requests: list[Request]) -> list[Result]:
        results: dict[str, Result] = {}
        for group in _groups(requests):
            streamed = any((r.serving or {}).get("arrive", {}) and "tokens" in r.serving["arrive"] for r in group)
            label = group[0].serving["scenario"] if group[0].serving else group[0].name
            self.progress(f"sending {label}: {len(group)} request{'s' * (len(group) > 1)}{', streamed' * streamed}")
            if streamed:
                results.update(self._streamed(group))
            else:
                for request in group:
                    results[request.name] = self._alone(request)
        return [results[r.name] for r in requests]

    def _stops(self, request: Request) -> list[str] | None:
        """The stop tokens as texts, for a server that stops on strings only (llama-server)."""
        if self.endpoint.engine != "llamacpp" or not request.stop_ids:
            return None
        for t in request.stop_ids:
            if t not in self._stop_texts:
                self._stop_texts[t] = self.endpoint.detokenize(t)
        return [self._stop_texts[t] for t in request.stop_ids if self._stop_texts[t]]

    def _prompt(self, request: Request) -> list[int] | str:
        return self.detokenize(request.prompt_ids) if self.as_text else request.prompt_ids

    def _alone(self, request: Request) -> Result:
        before = self.endpoint.counters() if self.metered else None
        try:
            got = self.endpoint.complete(self._prompt(request), request.max_new_tokens, request.stop_ids,
                                         stop_texts=self._stops(request))  # fmt: skip
        except EndpointError as e:
            if not (e.refused and not self.as_text and not self.ids_taken and self.detokenize):
                return Result(request, "n/a" if e.refused else "error", str(e))
            try:  # "text otherwise": a refused request is tried as its text; once one is taken, every prompt goes so
                text = self.detokenize(request.prompt_ids)
                got = self.endpoint.complete(text, request.max_new_tokens, request.stop_ids,
                                             stop_texts=self._stops(request))  # fmt: skip
            except EndpointError:
                return Result(request, "n/a", str(e))
            self.as_text = True
            self.progress(f"{self.endpoint.url} refused a token-id prompt ({e}); prompts go as text from now on")
        self.ids_taken = self.ids_taken or not self.as_text
        counted = delta(before, settled_counters(self.endpoint, before)) if self.metered else None
        return self.judge(request, got, counted, probe=True)

    def _streamed(self, group: list[Request]) -> dict[str, Result]:
        before = self.endpoint.counters() if self.metered else None
        by_name = {r.name: r for r in group}
        streams, waiting = {}, list(group)  # request name → its Streamed
        deadline = time.monotonic() + self.endpoint.timeout
        while waiting or any(s.is_alive() for s in streams.values()):
            produced = {by_name[n].serving["request"]: s.produced for n, s in streams.items()}
            done = {by_name[n].serving["request"] for n, s in streams.items() if not s.is_alive()}
            try:
                while waiting and serving.arrives(waiting[0].serving, produced, done):
                    r = waiting.pop(0)
                    prompt, stops = self._prompt(r), self._stops(r)
                    streams[r.name] = self.endpoint.stream(prompt, r.max_new_tokens, r.stop_ids, stops)
            except RuntimeError as e:  # a request due mid-decode whose predecessor finished first
                return self._abandon(group, streams, f"the condition was not exercised: {e}", deadline)
            stuck = waiting and not any(s.is_alive() for s in streams.values())
            if stuck and not serving.arrives(waiting[0].serving, produced, done):
                return self._abandon(group, streams, f"{waiting[0].name} can never arrive", deadline)
            if time.monotonic() > deadline:
                return self._abandon(group, streams, f"not finished in {self.endpoint.timeout:g} s", deadline)
            time.sleep(0.005)
        counted = delta(before, settled_counters(self.endpoint, before)) if self.metered else None
        out = {}
        for name, s in streams.items():
            r = by_name[name]
            if s.error or s.completion is None:
                error = s.error or EndpointError("the stream ended without an answer")
                out[r.name] = Result(r, "n/a" if error.refused else "error", str(error))
            else:
                out[r.name] = self.judge(r, s.completion, counted, shared=True)
                out[r.name].exercised, out[r.name].condition = in_flight_together(name, streams)
        if counted is not None and all(out[r.name].status == "pass" for r in group):
            lows, highs = zip(*(r.accepted() for r in group), strict=True)
            self.shared.append(self._shared([r.name for r in group], int(counted["accepted"]), (sum(lows), sum(highs))))
        return out

    def _abandon(self, group: list[Request], streams: dict, why: str, deadline: float) -> dict[str, Result]:
        """Every request of the group an error for `why`, once the streams sent have ended (their tokens must not
        land in the counters read around later requests)."""
        for s in streams.values():
            s.join(max(0.0, deadline - time.monotonic()) + 1.0)
        return {r.name: Result(r, "error", why) for r in group}

    # -- judging ------------------------------------------------------------------------------------------------
    def judge(
        self, request: Request, got: Completion, counted: dict | None, shared: bool = False, probe: bool = False
    ) -> Result:
        """The request's verdict from the server's answer `got` and its counters' move around it (`counted`; with
        `shared`, around the requests in flight beside it); `probe`: where nothing else shows whether speculation
        ran, the request may be sent again streamed (a request sent alone)."""
        result = self._judge(request, got, None if shared else counted, shared)
        if not shared:
            result.exercised, result.condition = condition_seen(request, got, counted)
        if result.ids is None or result.status not in ("pass", "tie", "FAIL"):
            return result
        result.observed, result.speculation = observed(request, got, counted)
        if result.observed is None and probe and got.chunks is None and result.ids == request.expected:
            result.observed, result.speculation = self._stream_probe(request)
        if result.observed is not True and result.status != "FAIL":
            if self.outputs_only:
                result.speculation += "; taken as outputs only (--outputs-only)"
            else:
                result.status = "unobserved"
        return result

    def _stream_probe(self, request: Request) -> tuple[bool | None, str]:
        """The request again, streamed: its chunks against the reference's steps (`observed`)."""
        streamed = self.endpoint.stream(self._prompt(request), request.max_new_tokens, request.stop_ids,
                                        self._stops(request))  # fmt: skip
        streamed.join(self.endpoint.timeout + 1.0)
        if streamed.error is not None or streamed.completion is None:
            return None, f"no sign of it in its answer, and streamed it gave none ({streamed.error})"
        return observed(request, streamed.completion, None, again=True)

    def _judge(self, request: Request, got: Completion, counted: dict | None, shared: bool) -> Result:
        notes = []
        ids = got.output_ids
        if ids is None and self.retokenize is None:
            return Result(request, "error", "the server returned text only, and no tokenizer to read it with")
        if ids is None and got.pieces:  # streamed chunks, some without their ids: those read from their own text
            ids = [t for piece, text in got.pieces for t in (piece or self.retokenize(text))]
            unnamed = sum(not piece and bool(text) for piece, text in got.pieces)
            notes.append(f"the ids of {unnamed} streamed chunks it gave none for re-tokenized from their text")
        elif ids is None:
            ids = self.retokenize(got.text)
            notes.append("ids re-tokenized from the server's text (it returns no token ids)")
        ids = list(ids)
        expected, stops = request.expected, set(request.stop_ids)
        skipped = [t for t in expected if t not in self.specials]
        if got.output_ids is None and ids != expected and skipped != expected and ids == skipped:
            ids = list(expected)  # its text is the reference's but for the special tokens, which it leaves out
            notes.append("its text leaves out the output's special tokens (its detokenization: skip_special_tokens)")
        if (
            got.finish_reason == "stop"
            and len(ids) + 1 == len(expected)
            and ids == expected[:-1]
            and expected[-1] in stops
        ):
            ids.append(expected[len(ids)])  # the stop token the server stopped on and left out
            notes.append("its stop token left out of the output, as stop strings are")
        if self.as_text:
            notes.append("its prompt sent as text: the server's tokenization of it is what it ran")
        if got.cached:
            notes.append(f"{got.cached} prompt tokens from its prefix cache")
        result = Result(request, "pass", "the reference's output", got, note="; ".join(notes), ids=ids)
        if ids != expected:
            self._judge_output(result, ids)
        else:
            wrong = self._fields(request, got, ids)
            if wrong:
                result.status, result.output = "FAIL", f"the reference's tokens, but {wrong}"
        if result.status != "pass":
            result.acceptance = "not compared: the output is not the reference's"
            return result
        accepted = got.accepted
        if accepted is None and counted is not None and "accepted" in counted:
            accepted = int(counted["accepted"])
        if accepted is None:
            result.acceptance = (
                "counted with the requests in flight beside it" if shared else "not reported: outputs only"
            )
            return result
        result.accepted = accepted
        result.acceptance, result.acceptance_failed = self._acceptance(accepted, request.accepted())
        if counted is not None and got.accepted is None:
            per_pos = _per_position(counted)
            if per_pos:
                ranges = request.accepted_per_position()
                off = [i for i, n in enumerate(per_pos) if not _within(n, ranges[i] if i < len(ranges) else (0, 0))]
                if off and self.dtype == "float32":
                    result.acceptance_failed = True
                    result.acceptance += (
                        f"; per draft position {per_pos}, the reference's "
                        f"{[f'{a}–{b}' if a != b else a for a, b in ranges]}"
                    )
        if result.acceptance_failed:
            result.status = "FAIL"
        return result

    def _fields(self, request: Request, got: Completion, ids: list[int]) -> str:
        """What the answer's fields say wrongly of an output that is the reference's: its finish_reason ("stop" at a
        stop token, "length" where max_tokens cut it), its logprobs (the target's, ties.logprob_fault), its usage
        (the prompt's tokens, the output's)."""
        said = []
        finish = request.finish_reason(ids)
        if got.finish_reason is not None and got.finish_reason != finish:
            cause = "it ended at a stop token" if finish == "stop" else "max_tokens cut it"
            said.append(f"finish_reason {got.finish_reason!r} where {cause} (the protocol's {finish!r})")
        if got.logprobs is not None and got.output_ids is not None and len(got.logprobs) == len(got.output_ids):
            try:
                fault = self.replay.logprobs(request.prompt_ids, got.output_ids, got.logprobs)
            except ReplayUnavailable:
                fault = ""
            if fault:
                said.append(fault)
        usage = got.raw.get("usage") if isinstance(got.raw, dict) else None
        if isinstance(usage, dict):
            given = got.output_ids
            if given is not None and usage.get("completion_tokens") not in (None, len(given)):
                said.append(f"usage.completion_tokens {usage['completion_tokens']} for {len(given)} output tokens")
            if not self.as_text and usage.get("prompt_tokens") not in (None, len(request.prompt_ids)):
                said.append(f"usage.prompt_tokens {usage['prompt_tokens']} for {len(request.prompt_ids)} prompt tokens")
        return "; ".join(said)

    def _acceptance(self, accepted: int, bounds: tuple[int, int]) -> tuple[str, bool]:
        low, high = bounds
        expected = f"{low}" if low == high else f"{low}–{high}"
        said = f"{accepted} draft tokens accepted, the reference's {expected}"
        if low <= accepted <= high:
            return said, False
        if self.dtype != "float32":
            return said + f" (not judged in {self.dtype}: its draft's argmax may fall at a tie too)", False
        why = (
            "fewer: the draft saw another context than DFlash's (a prefix restored without its draft K/V, a "
            "prefill chunk's features lost, another request's rows) or another draft's weights"
            if accepted < low
            else "more than DFlash's draft accepts: its draft proposed other tokens than DFlash's (another context "
            "or computation, which happened to accept more here), or the server counts differently (its bonus token?)"
        )
        return f"{said}: {why}", True

    def _shared(self, names: list[str], accepted: int, bounds: tuple[int, int]) -> Shared:
        said, failed = self._acceptance(accepted, bounds)
        return Shared(names, accepted, bounds, said, failed)

    def _judge_output(self, result: Result, ids: list[int]) -> None:
        request, expected = result.request, result.request.expected
        stops = set(request.stop_ids)
        first = next(
            (i for i, (a, b) in enumerate(zip(ids, expected, strict=False)) if a != b), min(len(ids), len(expected))
        )
        try:
            result.divergences = self.replay(request.prompt_ids, ids)
        except Unreplayable as e:  # ids the target has no row for, more than its positions
            result.status, result.output = "FAIL", f"returned {e}"
            return
        except ReplayUnavailable as e:
            result.status, result.output = "error", f"differs from the reference's output; {e}"
            return
        finish = result.completion.finish_reason if result.completion else None
        fault = first_fault(result.divergences, *ending(ids, request.max_new_tokens, stops, finish), self.words)
        if fault:
            result.status, result.output = "FAIL", fault
        elif result.divergences:
            result.status = "tie"
            ties = "; ".join(d.said(self.words) for d in result.divergences[:3])
            more = f" (and {len(result.divergences) - 3} more)" if len(result.divergences) > 3 else ""
            where = "numeric ties" if all(d.tie for d in result.divergences) else f"{self.dtype}'s rounding"
            result.output = f"leaves the reference's output at {first}, at {where} only: {ties}{more}"
        else:  # the server's output is the float64 argmax everywhere: the float32 reference broke a tie
            result.status = "tie"
            result.output = (
                f"leaves the float32 reference's output at {first} ({self.words(expected[first])} there) where the "
                f"float64 target ranks the server's {self.words(ids[first])} first: the reference's own tie"
                if first < len(expected) and first < len(ids)
                else f"differs from the reference's output after {first} tokens, each the float64 target's argmax"
            )


def observed(request: Request, got: Completion, counted: dict | None, again: bool = False) -> tuple[bool | None, str]:
    """Whether speculative decoding ran for `request` (True, False, or None: no sign either way) and the evidence,
    from the server's own: its response's speculative fields, its counters' move (`counted`), its stream's chunks
    against the reference's steps (`again`: the chunks of a second, streamed sending)."""
    fields = got.reported_by
    if fields and ((got.drafted or 0) > 0 or (got.accepted or 0) > 0):
        return True, f"observed: its response's {fields} say {got.drafted} drafted, {got.accepted} accepted"
    if fields and got.drafted == 0:
        return False, f"not observed: its response's {fields} say it drafted nothing"
    if counted is not None and any(k in counted for k in SPECULATIVE):
        drafts = counted.get("drafts", 0.0) or counted.get("draft_tokens", 0.0)
        if drafts > 0:
            return True, f"observed: its counters moved by {int(drafts)} drafts"
        return False, "not observed: its speculative-decoding counters did not move"
    chunks, commits = got.chunks, request.commits()
    sent = "sent again streamed, it" if again else "it"
    if not chunks:
        return None, "not observed: no speculative field in its answer, no counters, no stream to read"
    if max(commits) == 1:
        return None, (f"not observed: {sent} streamed {len(chunks)} chunks, but the reference accepted no draft "
                      "token here, so no stream can show a step of several")  # fmt: skip
    if chunks == commits:
        return True, f"observed: {sent} streamed the reference's steps, τ + 1 tokens a chunk {_short(chunks)}"
    if max(chunks) == 1:
        return False, (f"not observed: {sent} streamed one token a chunk where the reference committed up to "
                       f"{max(commits)} a step {_short(commits)}")  # fmt: skip
    return None, (f"not observed: {sent} streamed chunks {_short(chunks)}, not the reference's steps "
                  f"{_short(commits)} (a server may batch its stream)")  # fmt: skip


def condition_seen(request: Request, got: Completion, counted: dict | None) -> tuple[bool | None, str]:
    """Whether the serving condition `request` was sent under happened, from the server's own figures: a prefix-cache
    hit (its response's cached tokens, or its prefix-cache counters), a chunked prefill (its steps of more tokens
    than a block around the request, sent alone: a decoding step verifies one block, so these are the prefill's;
    more than one). (None, "") where it was sent as one sequence."""
    if request.condition == "prefix-cache hit":
        if got.cached:
            return True, f"confirmed: its answer says {got.cached} prompt tokens came from its prefix cache"
        if counted is not None and "prefix_hits" in counted:
            hits, queried = int(counted["prefix_hits"]), int(counted.get("prefix_queries", 0))
            if hits:
                return True, f"confirmed: its counters say {hits} of {queried} prompt tokens hit its prefix cache"
            return False, f"not exercised: its counters say none of {queried} prompt tokens hit its prefix cache"
        if got.cached == 0:
            return False, "not exercised: its answer says no prompt token came from its prefix cache"
        return None, "not confirmed: the server shows no prefix-cache figure (no cached tokens, no counters)"
    if request.condition == "chunked prefill":
        block = request.block_size or 16
        bounds = sorted((_bound(k), k) for k in counted or {} if k.startswith("steps_le.") and _bound(k) >= block)
        if not bounds or "steps" not in counted:
            return None, "not confirmed: the server shows no count of its steps' tokens"
        least, key = bounds[0]
        prefill = int(counted["steps"] - counted[key])
        if prefill > 1:
            return (
                True,
                f"confirmed: its counters show the prompt prefilled in {prefill} steps of over {least:g} tokens",
            )
        if prefill == 1:
            return False, (f"not exercised: its counters show one step of over {least:g} tokens: the prompt was "
                           "prefilled whole (the server's budget per step is larger)")  # fmt: skip
        return None, f"not confirmed: its counters show no step of over {least:g} tokens, a block's"
    return None, ""


def in_flight_together(name: str, streams: dict) -> tuple[bool, str]:
    """Whether stream `name` was decoding while another of its scenario was (their first token to their end overlap):
    arrivals mid-decode, seen from this side."""
    me = streams[name]
    if me.first_at is None or me.ended_at is None:
        return False, "not exercised: it streamed no token"
    beside = [other for other, s in streams.items() if other != name and s.first_at is not None
              and s.first_at < me.ended_at and me.first_at < (s.ended_at or me.ended_at)]  # fmt: skip
    if beside:
        return True, f"confirmed: its tokens streamed while {', '.join(beside)} did too"
    return False, "not exercised: no other request of its scenario was streaming while it was"


def _bound(key: str) -> float:
    try:
        return float(key.split(".", 1)[1])
    except ValueError:
        return float("inf")


def _short(values: list[int], shown: int = 12) -> str:
    return str(values[:shown])[:-1] + (", …]" if len(values) > shown else "]")


def first_fault(divergences: list[Divergence], end_at: int | None, end_said: str, words) -> str | None:
    """The first thing wrong with an output, in its order: a divergence that is no tie, or where it ends (`ending`'s
    position and words) → said; None where there are only ties, or nothing."""
    bugs = [d for d in divergences if not d.excused]
    if end_said and (not bugs or end_at <= bugs[0].index):
        return end_said
    return f"diverges {bugs[0].said(words)}" if bugs else None


def ending(ids: list[int], max_new: int, stops: set[int], finish: str | None) -> tuple[int | None, str]:
    """What is wrong with where the output ends, and the position it went wrong at ((None, "") where nothing is):
    a token after a stop token, more than max_tokens, or an end at neither."""
    inside = next((i for i, t in enumerate(ids[:-1]) if t in stops), None)
    if inside is not None:
        return inside + 1, f"went on past the stop token {ids[inside]} at {inside} ({len(ids)} tokens)"
    if len(ids) > max_new:
        return max_new, f"returned {len(ids)} tokens, more than max_tokens {max_new}"
    if len(ids) < max_new and (not ids or ids[-1] not in stops):
        return len(ids), f"ended after {len(ids)} of {max_new} tokens at no stop token (finish_reason {finish!r})"
    return None, ""


def _within(n: int, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= n <= bounds[1]


def _per_position(counted: dict) -> list[int]:
    positions = sorted(int(k.split(".")[1]) for k in counted if k.startswith("accepted_per_pos."))
    return [int(counted[f"accepted_per_pos.{i}"]) for i in range(positions[-1] + 1)] if positions else []


def _groups(requests: list[Request]) -> list[list[Request]]:
    """The requests in sending order: a serving scenario's together, in its order; every other alone."""
    groups, scenarios = [], {}
    for r in requests:
        name = (r.serving or {}).get("scenario")
        if name is None:
            groups.append([r])
        elif name in scenarios:
            scenarios[name].append(r)
        else:
            scenarios[name] = [r]
            groups.append(scenarios[name])
    for g in groups:
        g.sort(key=lambda r: (r.serving or {}).get("order", 0))
    return groups
