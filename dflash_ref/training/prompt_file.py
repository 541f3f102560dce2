"""Prompts of one's own for `train` (`--prompts-file`, `--heldout-file`), instead of those written in
prompts.py: a draft learns the target's answers to the kind of prompts it will serve.

    .txt     one prompt per line; blank lines are skipped (a prompt cannot hold a newline here)
    .jsonl   one JSON object per line; its prompt is the first of
               "prompt":         a string
               "messages":       [{"role": "user", "content": …}, …]       (UltraChat, OpenAI's format)
               "conversations":  [{"from": "human", "value": …}, …]        (ShareGPT)
             taking the first user turn of a conversation

Only the first user turn is read: the responses are the target's own (self-distillation), so a file's
answers, and any later turns, are never used. No torch here (options.py counts the prompts before
anything is loaded). Which prompts a run uses:

    training   the first --prompts of --prompts-file (default: all of it), else of the --prompt-set
               (prompt_sets.py: templates, prompts.prompts("train"); varied, varied_prompts.py)
    held-out   the first --eval-prompts of --heldout-file (default: up to 12), else prompts.eval_prompts;
               beside them the first --eval-styles hand-written ones (heldout_styles.py)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .heldout_styles import heldout_styles
from .prompt_sets import PROMPT_SETS, split_prompts
from .prompts import prompts

SUFFIXES = (".txt", ".jsonl")
USER_ROLES = ("user", "human")


class PromptFileError(ValueError):
    """A prompts file that cannot be read as prompts; the message names the file (and line)."""


def read_prompts(path: str | Path, role: str = "") -> list[str]:
    """The prompts in a .txt or .jsonl file, in order (see the module's docstring); `role` (the option
    that named the file) opens any error message."""
    try:
        return list(_read(str(path)))
    except PromptFileError as e:
        raise PromptFileError(f"{role} {e}".strip()) from None


@functools.lru_cache(maxsize=4)
def _read(path: str) -> tuple[str, ...]:
    file = Path(path)
    if file.suffix not in SUFFIXES:
        raise PromptFileError(
            f"{path}: a prompts file must be {' or '.join(SUFFIXES)}, not {file.suffix or 'without a suffix'}"
        )
    lines = read_text(path).splitlines()
    if file.suffix == ".txt":
        found = [line.strip() for line in lines if line.strip()]
    else:
        found = [_prompt_of(line, f"{path} line {n}") for n, line in enumerate(lines, 1) if line.strip()]
    if not found:
        raise PromptFileError(f"{path}: holds no prompt")
    return tuple(found)


def read_text(path: str | Path) -> str:
    """A file's whole text, read as UTF-8: a prompts file's, or `generate --prompt-file`'s prompt. A file that
    is not there, cannot be read or is not UTF-8 is a PromptFileError naming it and the problem."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PromptFileError(f"{path}: cannot read it as UTF-8 text ({e})") from None


def _prompt_of(line: str, where: str) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptFileError(f"{where} is not JSON: {e}") from None
    if not isinstance(row, dict):
        raise PromptFileError(f"{where} is not a JSON object")
    if "prompt" in row:
        prompt = row["prompt"]
    elif isinstance(row.get("messages"), list) or isinstance(row.get("conversations"), list):
        turns = row["messages"] if isinstance(row.get("messages"), list) else row["conversations"]
        users = [t for t in turns if isinstance(t, dict) and (t.get("role") or t.get("from")) in USER_ROLES]
        if not users:
            raise PromptFileError(
                f"{where}: its conversation has no user turn (role or from: {' or '.join(USER_ROLES)})"
            )
        prompt = users[0].get("content", users[0].get("value"))
    else:
        raise PromptFileError(f'{where} has no "prompt", "messages" or "conversations"')
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptFileError(f"{where}: its prompt is not a non-empty string: {prompt!r}"[:300])
    return prompt


def training_prompts(options: dict) -> list[str]:
    """All the training prompts a run may take from (the first options["prompts"] are used)."""
    if options["prompts_file"]:
        return read_prompts(options["prompts_file"], "--prompts-file")
    return split_prompts(PROMPT_SETS[options["prompt_set"]])


def heldout_prompts(options: dict) -> list[str]:
    """All the held-out prompts a run may evaluate on (the first options["eval_prompts"] are used)."""
    return read_prompts(options["heldout_file"], "--heldout-file") if options["heldout_file"] else prompts("heldout")


def style_prompts(options: dict) -> list[str]:
    """The hand-written held-out prompts a run evaluates on beside the others (the first options["eval_styles"])."""
    return heldout_styles()[: options["eval_styles"]]


def file_counts(options: dict, requested: dict, resumed: bool, default_eval_prompts: int) -> dict:
    """options.resolve's last word on the counts: a new run takes all of a --prompts-file's prompts
    unless --prompts is given (a resumed run keeps its count), and up to the default --eval-prompts
    of a --heldout-file's unless --eval-prompts is given. `requested`: the options given, not defaulted."""
    if options["prompts_file"] and "prompts" not in requested and not resumed:
        options["prompts"] = len(read_prompts(options["prompts_file"], "--prompts-file"))
    if options["heldout_file"] and "eval_prompts" not in requested and "heldout_file" in requested:
        held = read_prompts(options["heldout_file"], "--heldout-file")
        options["eval_prompts"] = min(default_eval_prompts, len(held))
    return options
