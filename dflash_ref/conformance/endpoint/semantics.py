"""The API's own semantics on the speculative route: what an OpenAI-compatible server must honour whatever decodes
for it, held to what the protocol gives for the reference's own output.

A server's DFlash path is a second code path beside its plain one, and its bugs live where it honours a request
otherwise: a stop string matched per token, not across the tokens a step commits together; a finish_reason set
before the block is cut to max_tokens; text detokenized without the special tokens the plain path keeps. So, for
a request whose output was the reference's (e, its tokens, committed in the reference's steps), the kit sends it
again with one field of the protocol set, each chosen from e itself:

    max_tokens mid-block       max_tokens m inside a step of several tokens: e[:m], finish_reason "length"
    stop inside a block        a stop string, a token of e inside such a step: the text before it, "stop"
    stop across a block's edge a stop string spanning the last token of one step and the first of the next
    include_stop_str_in_output the first stop with it set (vLLM's): the text through the stop string
    skip_special_tokens false  (vLLM's) the text with e's special tokens, where it has some
    n = 2                      both choices the reference's text (greedy)
    echo                       the prompt's text, then the output's
    seed                       sampled with one seed twice: the same text both times
    usage                      prompt_tokens and completion_tokens the prompt's and the output's lengths

Each answer is held to what the protocol gives for e, the field named where it is not. The texts are the target
tokenizer's decoding of e, where the server's own text of e is that; where it is not (another detokenization),
the probes of texts are n/a, said, and max_tokens is held to the tokens alone. The fields a server may
not know (the vLLM ones, n, echo, seed) are n/a where it refuses or ignores them, unless its plain route honours
them (`plain`: another URL serving the same model without speculation): then the two routes' answers are held to
each other field by field, and a difference is the speculative route's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .client import Endpoint, EndpointError, parse_completion
from .expected import Request

PROBED = 2  # requests probed: the first that passed with a step of several tokens


@dataclass
class Probe:
    """One field of the protocol set on a request: what it must give, what it gave."""

    request: str  # the request probed
    field: str  # the field set, in the protocol's words
    status: str  # pass | FAIL | n/a
    said: str


class Texts:
    """The target's tokenizer, as the probes need it: a token's text where it stands, and special tokens."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.specials = set(getattr(tokenizer, "all_special_ids", []) or [])

    def decode(self, ids: list[int], keep_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=not keep_special)

    def piece(self, ids: list[int], i: int) -> str:
        """Token i's text as it stands after ids[:i] (decoding is not always token by token)."""
        return self.decode(ids[: i + 1])[len(self.decode(ids[:i])) :]


def steps_of(request: Request) -> list[tuple[int, int]]:
    """(start, end) of each step's tokens in the reference's output (x_0 alone first)."""
    out, at = [], 0
    for n in request.commits():
        out.append((at, at + n))
        at += n
    return out


class Prober:
    """The probes of the module docstring, through `endpoint` (and `plain`, a plain route, if given)."""

    def __init__(self, endpoint: Endpoint, texts: Texts, plain: Endpoint | None = None, progress=print) -> None:
        self.endpoint, self.texts, self.plain, self.progress = endpoint, texts, plain, progress

    def run(self, results) -> list[Probe]:
        """The probes of the first PROBED requests whose output was the reference's (check.Result: its answer's
        text is the server's own of e) with a step of several tokens, sent alone."""
        chosen = [x for x in results if x.ids is not None and x.ids == x.request.expected and x.completion is not None
                  and max(x.request.commits()) > 1 and not x.request.serving][:PROBED]  # fmt: skip
        out = []
        for x in chosen:
            self.progress(f"probing the API's fields on {x.request.name}")
            out += self._probes(x.request, x.completion.text)
        return out

    def _send(
        self, endpoint: Endpoint, request: Request, max_tokens: int, temperature=0.0, seed=None, **fields
    ) -> dict:
        """`request` through `endpoint` (its own body: its engine's fields), greedy unless told, with `fields` set."""
        body = endpoint.body(request.prompt_ids, max_tokens, request.stop_ids, temperature, seed, None)
        body.update(fields)
        return endpoint._json("/v1/completions", body)

    def _both(self, request: Request, max_tokens: int, **fields) -> tuple[dict | None, dict | None, str]:
        """The speculative route's answer and the plain route's (None: refused), and the refusal in words."""
        answers, refused = [], ""
        for endpoint in (self.endpoint, self.plain):
            if endpoint is None:
                answers.append(None)
                continue
            try:
                answers.append(self._send(endpoint, request, max_tokens, **fields))
            except EndpointError as e:
                if not e.refused:
                    raise
                answers.append(None)
                refused = refused or str(e)
        return answers[0], answers[1], refused

    def _probes(self, r: Request, text: str) -> list[Probe]:
        e, texts, out = r.expected, self.texts, []
        steps = [(a, b) for a, b in steps_of(r) if b - a > 1]
        a, b = steps[0]
        full = texts.decode(e)

        def probe(field: str, max_tokens: int, expect_text: str | None, expect_finish: str | None,
                  ignored: str | None = None, expect_ids: list[int] | None = None, **fields) -> None:  # fmt: skip
            spec, plain, refused = self._both(r, max_tokens, **fields)
            out.append(self._judge(r.name, field, spec, plain, refused, expect_text, expect_finish, ignored,
                                   expect_ids))  # fmt: skip

        # max_tokens inside a step of several tokens
        cut = a + 1
        probe(
            f"max_tokens {cut} (inside the step of tokens {a}..{b - 1})",
            cut,
            texts.decode(e[:cut]) if text == full else None,
            r.finish_reason(e[:cut]),
            expect_ids=e[:cut],
        )
        if text != full:  # its texts are another detokenization's: the probes of texts cannot be held to ours
            out.append(
                Probe(
                    r.name,
                    "stop strings, echo, n, skip_special_tokens",
                    "n/a",
                    f"its text of the output, {text[:40]!r}, is not the target tokenizer's {full[:40]!r}",
                )
            )
            return out + [self._seeded(r)]  # fmt: skip
        # a stop string inside a step of several tokens, and one across the edge between two steps: the first of
        # each kind whose text first occurs where it stands (else the text would stop earlier, and prove nothing)
        stops = []

        def first_at(i: int, stop: str) -> bool:
            return bool(stop.strip()) and full.find(stop) == len(texts.decode(e[:i]))

        inside = [(j, texts.piece(e, j)) for a_, b_ in steps for j in range(a_ + 1, b_)]
        inside = next(((j, t) for j, t in inside if first_at(j, t)), None)
        if inside:
            j, stop = inside
            stops.append((f"stop {stop!r} (token {j}, inside a step)", stop, texts.decode(e[:j])))
        edges = [(b_ - 1, texts.piece(e, b_ - 1), texts.piece(e, b_)) for _, b_ in steps_of(r) if 0 < b_ < len(e)]
        edge = next(((j, x + y) for j, x, y in edges if x.strip() and y.strip() and first_at(j, x + y)), None)
        if edge:
            j, stop = edge
            stops.append((f"stop {stop!r} (tokens {j} and {j + 1}, across a step's edge)", stop, texts.decode(e[:j])))
        for field, stop, before in stops:
            probe(field, r.max_new_tokens, before, "stop", stop=[stop])
        if stops:
            field, stop, before = stops[0]
            probe(f"include_stop_str_in_output with {field}", r.max_new_tokens, before + stop, "stop", before,
                  stop=[stop], include_stop_str_in_output=True)  # fmt: skip
        if set(e) & texts.specials:
            probe("skip_special_tokens false", r.max_new_tokens, texts.decode(e, keep_special=True),
                  r.finish_reason(e), full, skip_special_tokens=False)  # fmt: skip
        probe("echo", r.max_new_tokens, texts.decode(r.prompt_ids) + full, r.finish_reason(e), full, echo=True)
        out.append(self._two_choices(r, full))
        out.append(self._seeded(r))
        return out

    def _judge(self, name, field, spec, plain, refused, expect_text, expect_finish, ignored, expect_ids) -> Probe:
        """The speculative route's answer `spec` (None: refused) to the probe of `field`, against the protocol's
        (`expect_*`) and the plain route's `plain`; `ignored`: the text it gives where a server ignores the field
        (one some servers do not know: n/a then, unless the plain route honours it)."""
        if spec is None:
            said = f"refused ({refused})" if plain is None else f"refused where the plain route takes it ({refused})"
            return Probe(name, field, "n/a" if plain is None else "FAIL", said)
        got = parse_completion(spec, f"{self.endpoint.url}/v1/completions")
        wrong = []
        if expect_ids is not None and got.output_ids is not None and got.output_ids != expect_ids:
            wrong.append(f"tokens {got.output_ids[-8:]} where the reference's output gives {expect_ids[-8:]}")
        if expect_text is not None and got.text != expect_text:
            wrong.append(f"text {got.text[-60:]!r} where the reference's output gives {expect_text[-60:]!r}")
        if expect_finish and got.finish_reason and got.finish_reason != expect_finish:
            wrong.append(f"finish_reason {got.finish_reason!r} where it is {expect_finish!r}")
        if plain is not None:
            base = parse_completion(plain, f"{self.plain.url}/v1/completions")
            differs = [f"{k} {x!r} against the plain route's {y!r}" for k, x, y in
                       (("text", got.text[-60:], base.text[-60:]), ("finish_reason", got.finish_reason,
                        base.finish_reason)) if x != y]  # fmt: skip
            if differs:
                return Probe(name, field, "FAIL", "; ".join(differs))
            if wrong:  # both routes alike: the field is the server's way, not the speculative route's bug
                return Probe(name, field, "n/a", f"both routes: {'; '.join(wrong)}")
        if wrong and plain is None and ignored is not None and got.text == ignored:
            return Probe(name, field, "n/a", "ignored: its text is what it gives without the field (some servers "
                         "do not know it)")  # fmt: skip
        return Probe(name, field, "FAIL" if wrong else "pass", "; ".join(wrong) or "as the protocol gives")

    def _two_choices(self, r: Request, full: str) -> Probe:
        """n = 2, greedy: both choices are the reference's text."""
        spec, plain, refused = self._both(r, r.max_new_tokens, n=2)
        if spec is None:
            return Probe(r.name, "n 2", "n/a" if plain is None else "FAIL", f"refused ({refused})")
        said = [f"choice {i}'s text {c.get('text', '')[-60:]!r}" for i, c in enumerate(spec.get("choices") or [])
                if c.get("text") != full]  # fmt: skip
        if len(spec.get("choices") or []) == 1 and not said and plain is None:
            return Probe(r.name, "n 2", "n/a", "ignored: one choice (some servers do not know n)")
        if len(spec.get("choices") or []) != 2:
            said.append(f"{len(spec.get('choices') or [])} choices")
        if said and plain is not None and [c.get("text") for c in plain.get("choices") or []] == [full, full]:
            return Probe(r.name, "n 2", "FAIL", "; ".join(said) + ", where the plain route gives the reference's")
        if said:
            return Probe(r.name, "n 2", "FAIL" if plain is None else "n/a",
                         "; ".join(said) + " where greedy decoding gives the reference's text twice")  # fmt: skip
        return Probe(r.name, "n 2", "pass", "both choices the reference's text")

    def _seeded(self, r: Request) -> Probe:
        """Sampled twice with one seed: the same text both times (the route draws its numbers from the seed)."""
        sampled = {"max_tokens": min(16, r.max_new_tokens), "temperature": 1.0, "seed": 1234}
        try:
            first, second = (self._send(self.endpoint, r, **sampled) for _ in range(2))
        except EndpointError as e:
            if not e.refused:
                raise
            return Probe(r.name, "seed 1234 at temperature 1", "n/a", f"refused ({e})")
        texts = [parse_completion(a, self.endpoint.url).text for a in (first, second)]
        if texts[0] != texts[1]:
            said = f"two requests with one seed gave {texts[0][:40]!r} and {texts[1][:40]!r}"
            if self.plain is None:
                return Probe(r.name, "seed 1234 at temperature 1", "n/a", f"{said} (the protocol's seed is best "
                             "effort; with --plain the plain route's answers are the measure)")  # fmt: skip
            again = [parse_completion(self._send(self.plain, r, **sampled), self.plain.url).text for _ in range(2)]
            status = "FAIL" if again[0] == again[1] else "n/a"
            return Probe(r.name, "seed 1234 at temperature 1", status,
                         f"{said}; the plain route's two {'agree' if status == 'FAIL' else 'differ too'}")  # fmt: skip
        return Probe(r.name, "seed 1234 at temperature 1", "pass", "the same text both times")
