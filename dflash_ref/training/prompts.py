"""The prompts written here for self-distillation (no download), split by topic so that the
held-out prompts are unseen in training:

    prompts = TEMPLATES × TOPICS, both hand-written in data/ (templates.txt, topics.txt); the last
    HELD_OUT_TOPICS topics are held out

The prompt sets are data, read from data/ beside this module (varied_prompts.py and heldout_styles.py read
theirs there too); this module and its two siblings hold only how they are combined and ordered. No torch
here: the command line reads these while it is built.
"""

from __future__ import annotations

import json
from importlib import resources


def data_text(name: str) -> str:
    """The text of data/<name>, a file of the package (UTF-8)."""
    return resources.files(__package__).joinpath("data", name).read_text(encoding="utf-8")


def read_data(name: str) -> list[str]:
    """The lines of data/<name>, but blank ones and comments (lines starting with "#")."""
    return [line for line in data_text(name).splitlines() if line.strip() and not line.startswith("#")]


def read_records(name: str) -> list[dict]:
    """The records of data/<name>, a JSONL file: one JSON object a line."""
    return [json.loads(line) for line in read_data(name)]


TOPICS = read_data("topics.txt")  # by group; the last HELD_OUT_TOPICS never trained on
TEMPLATES = read_data("templates.txt")  # {t}: the topic
HELD_OUT_TOPICS = 12


SPLITS = ("train", "heldout")


def prompts(split: str = "train") -> list[str]:
    """'train': the first topics; 'heldout': the last HELD_OUT_TOPICS topics; every topic × template once.

    Ordered so that any first n prompts spread over all the split's topics: prompt q·N + r is topic r
    with template (q + r) mod |TEMPLATES| (N topics), so `prompts()[:n]` is never a few topics only."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    topics = TOPICS[:-HELD_OUT_TOPICS] if split == "train" else TOPICS[-HELD_OUT_TOPICS:]
    return [
        TEMPLATES[(q + r) % len(TEMPLATES)].format(t=topic)
        for q in range(len(TEMPLATES))
        for r, topic in enumerate(topics)
    ]


def template_of(prompt: str) -> str:
    """The template a prompt of either split was written from, e.g. "What is {t}?"; ValueError for a
    prompt not written here."""
    for template in TEMPLATES:
        head, tail = template.split("{t}")
        if prompt.startswith(head) and prompt.endswith(tail) and prompt[len(head) : len(prompt) - len(tail)] in TOPICS:
            return template
    raise ValueError(f"{prompt!r} is none of the prompts written here (prompts.TEMPLATES × prompts.TOPICS)")


def eval_prompts(n: int = 12) -> list[str]:
    """The first n held-out prompts: by the order of `prompts`, spread over the held-out topics and the
    templates (with 12 held-out topics, the i-th is topic i mod 12 with template (i + i div 12) mod 12)."""
    return prompts("heldout")[:n]
