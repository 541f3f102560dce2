"""The requests sent to a server and what each must return: the reference's single-sequence run of it, in float32.

From a bundle folder (`--bundle DIR`): each greedy bundle is one request, its expectation the bundle's own
(output ids and τ per step, written by the reference); a serving scenario's bundles keep their `serving` entry
(engine_scenarios.SERVING_MEANING), which says when each is sent beside the others. An endpoint serves one model
pair, so the bundles of the pair it serves are taken (all of them where the folder holds one pair).

From folders and a prompt file (`--target DIR --draft DIR --prompts FILE`): any checkpoint `load_target` /
`load_draft` read. The file holds one prompt a line: JSON (`{"prompt_ids": [...]}` or `{"prompt": "text"}`, each
optionally with "max_tokens" and "name") or plain text. The reference runs `spec_generate` on each prompt alone,
at temperature 0 in float32, with the target folder's stop tokens (generation_config.json's eos_token_id).

What the acceptance must be: with the same weights and greedy decoding, every step's proposals are the draft's
argmax given the committed tokens, so every step's τ is determined. A server counts the draft tokens it accepted;
every step but the last accepts as the reference's (Σ τ over them); the last is where engines cut the block to
what is left to generate each their own way (verify.accepted_bounds), so the count lies in [low, high].
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ...decoding import spec_generate
from ..bundle import find_bundles, model_digest
from ..judge import acceptance_parts, accepted_bounds


class RequestsError(ValueError):
    """The requests cannot be made: a prompt file, folder or bundle that is not usable (said in one line)."""


class LineError(RequestsError):
    """A line of a file an option names (--prompts, --outputs) that cannot be taken, said naming the file and the
    line. The whole file is refused before any line is judged or sent (never a run that silently drops one): the
    command line was right, the file not, so the command says this one line without its usage (exit code 2)."""


def json_line(line: str, where: str):
    """One line's JSON value, or a LineError naming `where` (the file and the line): JSON that does not parse, that
    nests deeper than the parser can follow, or holds a number Python will not read (more than 4300 digits)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise LineError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise LineError(f"{where}: not JSON it can read (nested too deeply)") from None
    except ValueError as e:
        raise LineError(f"{where}: not JSON it can read ({e})") from None


@dataclass
class Request:
    name: str
    prompt_ids: list[int]
    max_new_tokens: int
    stop_ids: list[int]
    expected: list[int]  # the reference's new tokens (x_0 first)
    taus: list[int]  # the reference's τ per decode step
    block_size: int | None = None  # the draft's
    serving: dict | None = None  # a serving scenario's entry (engine_scenarios.SERVING_MEANING), if any
    condition: str = "one sequence"  # the serving condition it is sent under, in the matrix's words

    def finish_reason(self, ids: list[int]) -> str:
        """The protocol's finish_reason for an output `ids` of this request: "stop" where it ends at a stop token,
        else "length" (cut by max_tokens)."""
        return "stop" if ids and ids[-1] in set(self.stop_ids) else "length"

    def accepted(self) -> tuple[int, int]:
        """The draft tokens a server may count as accepted for this request: [low, high]."""
        return accepted_bounds(self.taus, len(self.expected), self.block_size, self.max_new_tokens)

    def commits(self) -> list[int]:
        """Tokens committed at each step of the reference's run: x_0 at the prefill, then τ + 1 a step (the last cut
        where the length limit or a stop token ends the output). A server that streams a step at a time streams
        these."""
        out, left = [1], len(self.expected) - 1
        for tau in self.taus:
            if left <= 0:
                break
            out.append(min(tau + 1, left))
            left -= out[-1]
        return out

    def accepted_per_position(self) -> list[tuple[int, int]]:
        """Per draft position i (0: the first proposal), how many steps accepted it: [low, high] (vLLM's
        spec_decode_num_accepted_tokens_per_pos): the exact steps' count, plus one a step the rest may take at the
        positions it may reach (judge.acceptance_parts)."""
        exact, rest, steps = acceptance_parts(self.taus, len(self.expected), self.block_size, self.max_new_tokens)
        span = max(exact + [rest, 0])
        span = min(span, self.block_size - 1) if self.block_size else span  # a block proposes γ = block − 1
        return [(sum(t > i for t in exact), sum(t > i for t in exact) + steps * (rest > i)) for i in range(span)]


def from_bundles(path, served: list[str] | None = None) -> tuple[list[Request], Path]:
    """The greedy bundles at `path` as requests, and the target folder they share; where they hold several model
    pairs, the pair whose target folder is named by one of `served` (the server's model ids), else an error listing
    the pairs."""
    try:
        bundles = [b for b in find_bundles(path) if b.manifest.get("kind") != "sampling"]
    except (OSError, ValueError) as e:
        raise RequestsError(f"--bundle {path}: {e}") from None
    if not bundles:
        raise RequestsError(
            f"--bundle {path}: no greedy bundle there (python -m dflash_ref golden --engines --out DIR)"
        )
    pairs: dict[tuple, list] = {}
    for b in bundles:
        pairs.setdefault(model_digest(b), []).append(b)
    if len(pairs) > 1:
        named = [g for g in pairs.values() if any(_names(g[0].target_dir, m) for m in served or [])]
        if len(named) != 1:
            listed = "; ".join(", ".join(b.name for b in g) for g in pairs.values())
            raise RequestsError(
                f"--bundle {path} holds {len(pairs)} model pairs and a server serves one; point --bundle at the "
                f"bundles of the pair it serves (one folder a pair): {listed}"
            )
        bundles = named[0]
    return [_from_bundle(b) for b in bundles], bundles[0].target_dir


def _names(folder: Path, model: str) -> bool:
    """Whether a server's model id names this target folder (vLLM's id is the path it was started with)."""
    try:
        return Path(model).resolve() == folder.resolve()
    except (OSError, ValueError):
        return False


def _from_bundle(b) -> Request:
    prompt = [int(t) for t in b.inputs["input_ids"]]
    full = [int(t) for t in b.expected["output_ids"].reshape(-1)]
    taus = [int(b.expected[e["key"]]) for e in b.entries if e["stage"] == "acceptance_length"]
    return Request(
        b.name,
        prompt,
        int(b.inputs["max_new_tokens"]),
        [int(t) for t in b.inputs["stop_token_ids"] or []],
        full[len(prompt) :],
        taus,
        b.config("draft")["block_size"],
        b.manifest.get("serving"),
        (b.manifest.get("serving") or {}).get("condition", "one sequence"),
    )


def read_prompts(path, tokenizer=None, max_new_tokens: int = 64) -> list[dict]:
    """The prompt file → [{name, prompt_ids | prompt, max_tokens}] (module docstring). Text needs `tokenizer`
    (None: only checked, not tokenized). An empty file, an empty prompt or a bad line is a RequestsError."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RequestsError(f"--prompts {path}: {e}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"--prompts {path}, line {n}"
        entry = _parse_line(line, where)
        ids, text = entry.get("prompt_ids"), entry.get("prompt")
        if ids is not None:
            if not isinstance(ids, list) or not ids or not all(is_id(t) for t in ids):
                raise LineError(f"{where}: prompt_ids must be a non-empty list of token ids ≥ 0")
        elif not isinstance(text, str) or not text.strip():
            raise LineError(f"{where}: an empty prompt")
        max_tokens = entry.get("max_tokens", max_new_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise LineError(f"{where}: max_tokens must be a whole number ≥ 1, got {max_tokens!r}")
        name = entry.get("name", f"p{len(prompts)}")
        if not isinstance(name, str | int) or isinstance(name, bool) or not str(name).strip():
            raise LineError(f"{where}: name must be a non-empty string, got {json.dumps(name)[:40]}")
        if ids is None and tokenizer is not None:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if not ids:
                raise LineError(f"{where}: the prompt is no tokens")
        prompts.append({"name": str(name), "prompt_ids": ids, "max_tokens": max_tokens, "line": n})
    if not prompts:
        raise RequestsError(f"--prompts {path}: no prompt in it")
    names = [p["name"] for p in prompts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        lines = ", ".join(str(p["line"]) for p in prompts if p["name"] in twice)
        raise LineError(f"--prompts {path}, lines {lines}: names given to more than one prompt: {', '.join(twice)}")
    return prompts


def is_id(value) -> bool:
    """A token id as a file or a server gives it: a JSON whole number ≥ 0 (no float, no bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_line(line: str, where: str) -> dict:
    """A JSON object line, or plain text (a line that is not JSON)."""
    if line.lstrip().startswith("{"):
        entry = json_line(line, where)
        if not isinstance(entry, dict):  # "{" opens an object: what parses else is one
            raise LineError(f"{where}: not a JSON object")
        unknown = set(entry) - {"prompt", "prompt_ids", "max_tokens", "name"}
        if unknown:
            raise LineError(f"{where}: unknown fields {sorted(unknown)} (prompt, prompt_ids, max_tokens, name)")
        return entry
    return {"prompt": line}


CONDITIONS = {
    "alone": "each prompt alone, one at a time",
    "repeat": "each prompt, at least two of the server's KV blocks long (lengthened in front with the other prompts "
    "where shorter), sent twice: the second time its prefix can come from the server's cache",
    "shared-prefix": "the first prompt (at least two KV blocks long, lengthened likewise) alone, then followed by each "
    "other prompt, one at a time (prefix-cache hits on it)",
    "long": "all prompts joined and repeated to LONG tokens, longer than a server's usual tokens per step (a "
    "chunked prefill)",
    "concurrent": "every prompt again, each sent once the one before has streamed 2 tokens (arrivals mid-decode)",
}
LONG = 2304  # tokens: past vLLM's default 2048 tokens per step for online serving
KV_BLOCK = 128  # tokens a server caches per block where it does not say (vLLM's CPU default; its GPU one is 16,
# SGLang's and llama-server's caches go by the token): a prefix shorter than one block is never a cache hit
# each condition as the matrix's serving conditions name it (engine_scenarios.SERVINGS)
MATRIX_WORDS = {"alone": "one sequence", "repeat": "prefix-cache hit", "shared-prefix": "prefix-cache hit",
                "long": "chunked prefill", "concurrent": "arrivals mid-decode"}  # fmt: skip


def parse_conditions(text: str) -> list[str]:
    """--serving's comma-separated list → the condition names (CONDITIONS), each checked: an empty name (a comma too
    many) or an unknown one is a RequestsError, never dropped into the default."""
    names = [c.strip() for c in text.split(",")]
    if not all(names):
        raise RequestsError(f"--serving {text!r}: an empty condition name; choose from {', '.join(CONDITIONS)}")
    check_conditions(names)
    return names


def check_conditions(conditions: list[str]) -> None:
    """Each name one of CONDITIONS, and at least one, else a RequestsError."""
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown or not conditions:
        raise RequestsError(f"--serving {','.join(unknown)}: choose from {', '.join(CONDITIONS)}")


def lengthened(prompt: dict, prompts: list[dict], least: int) -> dict:
    """`prompt` at least `least` tokens long: the other prompts' tokens (then its own), repeated, put in front of
    it where it is shorter; its name says so."""
    ids = prompt["prompt_ids"]
    if len(ids) >= least:
        return prompt
    filler = [t for p in prompts if p is not prompt for t in p["prompt_ids"]] or ids
    front = (filler * (least // len(filler) + 1))[: least - len(ids)]
    return {**prompt, "name": f"{prompt['name']}.{least}", "prompt_ids": front + ids}


def with_conditions(prompts: list[dict], conditions: list[str], long: int = LONG, block: int = KV_BLOCK) -> list[dict]:
    """The prompts as sent under each serving condition (CONDITIONS), in that order: each entry a prompt dict, with
    a `serving` entry (engine_scenarios.SERVING_MEANING) where it is sent beside others. `block`: the server's KV
    cache block in tokens, which a repeated or shared prefix must span twice over to be a cache hit at all."""
    check_conditions(conditions)
    out, alone = [], MATRIX_WORDS["alone"]
    for condition in conditions:
        said = MATRIX_WORDS[condition]
        if condition == "alone":
            out += [{**p, "condition": said} for p in prompts]
        elif condition == "repeat":  # once to fill the cache, once to hit it
            for p in (lengthened(p, prompts, 2 * block) for p in prompts):
                out += [{**p, "name": f"{p['name']}.first", "condition": alone},
                        {**p, "name": f"{p['name']}.again", "condition": said}]  # fmt: skip
        elif condition == "shared-prefix":
            head = lengthened(prompts[0], prompts, 2 * block)
            out.append({**head, "name": f"{head['name']}.head", "condition": alone})
            out += [
                {**p, "name": f"{head['name']}+{p['name']}", "prompt_ids": head["prompt_ids"] + p["prompt_ids"],
                 "condition": said}
                for p in prompts[1:]
            ]  # fmt: skip
        elif condition == "long":
            joined = [t for p in prompts for t in p["prompt_ids"]]
            ids = (joined * (long // len(joined) + 1))[:long]
            out.append({"name": f"long{long}", "prompt_ids": ids, "max_tokens": prompts[0]["max_tokens"],
                        "condition": said})  # fmt: skip
        else:  # concurrent: one scenario, each request after the one before has streamed 2 tokens
            labels = [f"{p['name']}.concurrent" for p in prompts]
            out += [
                {**p, "name": label, "condition": said,
                 "serving": {"scenario": "concurrent", "request": label, "order": i, "condition": said,
                             "arrive": {"after": labels[i - 1], "tokens": 2} if i else None}}
                for i, (p, label) in enumerate(zip(prompts, labels, strict=True))
            ]  # fmt: skip
    return out


def from_folders(target, draft, prompts: list[dict], stop_ids: list[int], progress=print) -> list[Request]:
    """The reference's run of each prompt alone (spec_generate, greedy, float32) → requests; a prompt sent more
    than once is run once."""
    runs: dict[tuple, tuple[list[int], list[int]]] = {}
    out = []
    for i, p in enumerate(prompts):
        key = (tuple(p["prompt_ids"]), p["max_tokens"])
        if key not in runs:
            progress(f"reference {i + 1}/{len(prompts)}: {p['name']} ({len(p['prompt_ids'])} prompt tokens)")
            ids = torch.tensor([p["prompt_ids"]], dtype=torch.long, device=target.device)  # (1, L)
            result = spec_generate(draft, target, ids, p["max_tokens"], stop_ids)
            runs[key] = (result.output_ids[0, len(p["prompt_ids"]) :].tolist(), result.acceptance_lengths)
        new, taus = runs[key]
        out.append(
            Request(p["name"], list(p["prompt_ids"]), p["max_tokens"], list(stop_ids), new, taus, draft.block_size,
                    p.get("serving"), p.get("condition", "one sequence"))
        )  # fmt: skip
    return out
