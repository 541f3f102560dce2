"""Training data by self-distillation: the target's own answers to the prompts (prompts.py, or a
file of one's own: prompt_file.py), generated greedily, batched and resumable.

    responses: the target's greedy continuation of the chat-templated prompt, up to max_new_tokens,
               cut after the end-of-turn token; one JSON line per prompt {"prompt", "prompt_len", "ids"}
    features: recomputed from the ids by one target forward (training.target_features), not stored
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..loading.grouped_attention import GROUPED, UnsupportedAttention, register


class DataFileError(ValueError):
    """A data.jsonl that does not belong to the prompts or the length asked for; names file and line."""


def read_responses(
    out: Path,
    prompt_list: list[str],
    max_new_tokens: int,
    stop_token_ids: list[int] = (2,),
    say=print,
    vocab_size: int | None = None,
) -> list[dict]:
    """The rows already in `out` that answer the first prompts of `prompt_list`, checked line by line:
    row i must answer prompt i, and its response must end where a run with `max_new_tokens` ends
    it (at a stop token within the limit, else at exactly the limit), so that a file distilled
    from other prompts or with another limit is refused instead of mixed in. A last line without its
    end of line (a run stopped while writing) is dropped from the file; rows past `prompt_list` are
    left unused. Every row holds token ids (in [0, vocab_size) if given) and a prompt_len within them."""
    if not out.is_file():
        return []
    lines = out.read_text().splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        # a run stopped while writing its last line: whole or not, the line is dropped (rows are appended
        # after it, so a line kept without its newline would join the next one)
        say(f"{out}: line {len(lines)} has no end of line (a stopped run); dropped, distilling it again")
        lines.pop()
        out.write_text("".join(lines))
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            if not (
                isinstance(row, dict)
                and isinstance(row.get("prompt"), str)
                and isinstance(row.get("prompt_len"), int)
                and isinstance(row.get("ids"), list)
            ):
                raise ValueError("not a row {prompt, prompt_len, ids}")
            ids = row["ids"]
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                raise ValueError("ids holds something other than token ids (whole numbers ≥ 0)")
            if vocab_size is not None and ids and max(ids) >= vocab_size:
                raise ValueError(f"token id {max(ids)} is past the target's vocabulary of {vocab_size}")
            if not 0 < row["prompt_len"] <= len(ids):
                raise ValueError(f"prompt_len {row['prompt_len']} does not lie within its {len(ids)} ids")
        except ValueError as e:
            raise DataFileError(f"{out} line {n} is not a response row ({e}); use another --out") from None
        rows.append(row)
    for n, (row, prompt) in enumerate(zip(rows, prompt_list), 1):
        if row["prompt"] != prompt:
            raise DataFileError(
                f"{out} line {n} answers {row['prompt']!r}, but training prompt {n} is {prompt!r}: "
                f"the file was distilled from other prompts; use another --out"
            )
        response = row["ids"][row["prompt_len"] :]
        stopped = any(t in stop_token_ids for t in response)
        if len(response) > max_new_tokens or (not stopped and len(response) != max_new_tokens):
            raise DataFileError(
                f"{out} line {n} holds a response of {len(response)} tokens "
                f"{'ending at a stop token' if stopped else 'cut without a stop token'}, which "
                f"a run with --max-new-tokens {max_new_tokens} does not write: the file was "
                f"distilled with another limit; pass that --max-new-tokens or use another --out"
            )
    if len(rows) > len(prompt_list):
        say(f"{out}: using the first {len(prompt_list)} of its {len(rows)} responses")
    return rows[: len(prompt_list)]


def self_distill(
    target,
    tokenizer,
    prompt_list: list[str],
    out: str | Path | None,
    max_new_tokens: int = 96,
    batch_size: int = 16,
    stop_token_ids: list[int] = (2,),
    say=print,
    attention: str | None = GROUPED,
) -> list[dict]:
    """Greedy responses of a transformers-backed target (HFTarget) for every prompt, appended to
    `out` (JSON lines) batch by batch; a rerun continues where the file ends. `out=None`: returned only.
    A response ends with the first of `stop_token_ids` (SmolLM2's <|im_end|> by default) or at the limit.

    `attention`: the model's attention implementation while it generates (restored afterwards;
    None keeps its own). Batched decoding sends one query row per sequence, for which this torch's
    CPU SDPA kernel is slow, and "eager" copies every key/value head of the cache H/G times at every
    layer and token, a cost that grows with the response. So the default is eager's arithmetic without
    the copies (loading/grouped_attention.py), the same responses in less time. Each is the target's own
    greedy decoding; their roundings may differ in the last bits, and so, at a near tie, a text."""
    from transformers import GenerationConfig

    stop = [int(t) for t in stop_token_ids]
    done = (
        []
        if out is None
        else read_responses(Path(out), prompt_list, max_new_tokens, stop, say, target.config.vocab_size)
    )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:  # SmolLM2's GGUF tokenizer has none; pads are masked out anyway
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(0)
    pad = tokenizer.pad_token_id
    t0 = time.perf_counter()
    model = target.model
    previous, settings = model.config._attn_implementation, model.generation_config
    if attention == GROUPED:
        register()
    if attention is not None:
        model.set_attn_implementation(attention)
    # transformers' defaults alone while it generates: a model folder's generation_config.json (a repetition
    # penalty, sampling, …) would make the responses other than the target's greedy argmax
    model.generation_config = GenerationConfig()
    try:
        for i in range(len(done), len(prompt_list), batch_size):
            batch = prompt_list[i : i + batch_size]
            texts = [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
                )
                for p in batch
            ]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            try:
                generated = _greedy(model, enc, max_new_tokens, stop, pad)
            except UnsupportedAttention as e:  # a model with more in its attention (sinks, soft-capping, …)
                say(f"{e}; distilling with eager attention")
                model.set_attn_implementation("eager")
                generated = _greedy(model, enc, max_new_tokens, stop, pad)
            width = enc["input_ids"].shape[1]
            rows = []
            for j, prompt in enumerate(batch):
                prompt_len = int(enc["attention_mask"][j].sum())
                ids = generated[j, width - prompt_len :].tolist()  # left padding removed
                ends = [n for n, t in enumerate(ids[prompt_len:]) if t in stop]
                if ends:  # cut after the first stop token
                    ids = ids[: prompt_len + ends[0] + 1]
                rows.append({"prompt": prompt, "prompt_len": prompt_len, "ids": ids})
            if out is not None:
                with Path(out).open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
            done += rows
            say(f"self-distillation: {len(done)}/{len(prompt_list)} responses, {time.perf_counter() - t0:.0f} s")
    finally:
        model.set_attn_implementation(previous)
        model.generation_config = settings
    return done


def _greedy(model, enc, max_new_tokens: int, stop: list[int], pad: int) -> torch.Tensor:
    """transformers' batched greedy generate of the left-padded prompts `enc` → (n, width + new)."""
    with torch.no_grad():
        return model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop, pad_token_id=pad
        )
