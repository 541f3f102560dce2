"""Training prompts of many shapes (`train --prompt-set varied`): STYLES, 48 hand-written styles with slots
(data/styles.jsonl; the slots' values in data/slots.json), each filled with every training topic of prompts.py once:

    prompt q·S + s = STYLES[s] filled with topic (q + s·⌊N/S⌋) mod N and slot variant q       (S styles, N topics)

so the S·N prompts are all distinct (style s meets every topic once), and any first n spread over the
styles (each within one of n / S) and over the topics. The slots besides the topic — a second topic, an
audience, a word limit, numbers for a word problem, a short passage to rewrite — are picked by q, so one
style's prompts differ in more than the topic. The held-out topics of prompts.py are never used, and
heldout_styles.py holds prompts in styles none of these has. No torch here.
"""

from __future__ import annotations

import functools
import json
import re

from .prompts import HELD_OUT_TOPICS, TOPICS, data_text, read_records

STYLES = [(r["name"], r["template"]) for r in read_records("styles.jsonl")]  # (name, template): {t} the topic,
# {T} it capitalised, {u} another topic; the other slots: _slots
_SLOTS = json.loads(data_text("slots.json"))
AUDIENCES, WORDS, TASKS, PASSAGES, CASUAL = (_SLOTS[k] for k in ("audiences", "words", "tasks", "passages", "casual"))


def _topics() -> list[str]:
    return TOPICS[:-HELD_OUT_TOPICS]


def _slots(topic: str, other: str, q: int) -> dict:
    """The slot values of a prompt with this topic, second topic and variant q."""
    a, b = 12 + (7 * q) % 41, 3 + q % 7
    return {
        "t": topic,
        "T": topic[:1].upper() + topic[1:],
        "u": other,
        "n": 3 + q % 5,
        "n0": 30 + 10 * (q % 6),
        "word": WORDS[q % len(WORDS)],
        "who": AUDIENCES[q % len(AUDIENCES)],
        "passage": PASSAGES[q % len(PASSAGES)].format(t=topic, T=topic[:1].upper() + topic[1:]),
        "casual": CASUAL[q % len(CASUAL)].format(t=topic),
        "task": TASKS[q % len(TASKS)].format(t=topic),
        "ident": re.sub(r"\W+", "_", topic.lower()).strip("_") or "topic",
        "a": a,
        "b": b,
        "c": 1 + q % 5,
        "ab": a * b + q % b,
        "price": 8 + q % 23,
        "pct": (10, 20, 25, 50)[q % 4],
    }


@functools.lru_cache(maxsize=1)
def _written() -> tuple[tuple[str, str], ...]:
    """(prompt, style name) in the order of the module's docstring."""
    topics = _topics()
    n, s_count = len(topics), len(STYLES)
    stride = n // s_count
    out = []
    for q in range(n):
        for s, (name, template) in enumerate(STYLES):
            topic = topics[(q + s * stride) % n]
            other = topics[(q + s * stride + 1 + q % (n - 1)) % n]  # never the topic itself
            out.append((template.format(**_slots(topic, other, q)), name))
    return tuple(out)


def varied_prompts() -> list[str]:
    """All S·N varied training prompts, ordered so that any first n spread over the styles."""
    return [prompt for prompt, _ in _written()]


def style_of(prompt: str) -> str:
    """The style name a varied prompt was written in; ValueError for a prompt not written here."""
    styles = _style_index()
    if prompt not in styles:
        raise ValueError(f"{prompt[:60]!r} is none of the varied prompts written here (varied_prompts.STYLES)")
    return styles[prompt]


@functools.lru_cache(maxsize=1)
def _style_index() -> dict[str, str]:
    return dict(_written())
