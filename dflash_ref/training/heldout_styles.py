"""A second held-out set, written by hand (data/heldout_styles.jsonl): prompts in styles that no training
prompt written here uses (neither prompts.TEMPLATES nor varied_prompts.STYLES), each on a topic that is none
of prompts.TOPICS (an everyday word of TOPICS, "milk" or "time", may still occur in its text). It asks what a
draft learnt beyond the shapes of answer it was trained on; the template held-out set (prompts.py) asks
only about unseen topics. `train` evaluates the first --eval-styles of them beside its held-out prompts
(eval.json's "heldout_styles"), `evaluate --sets heldout-styles:0:48` any slice.

    heldout_styles()[i] = the (i div S)-th prompt of style i mod S          (S styles, 4 prompts each)

so any first n spread over the styles. No torch here.
"""

from __future__ import annotations

from .prompts import read_records

WRITTEN: dict[str, list[tuple[str, str]]] = {}  # style: [(topic, prompt), …]; no topic is one of prompts.TOPICS
for _record in read_records("heldout_styles.jsonl"):
    WRITTEN.setdefault(_record["style"], []).append((_record["topic"], _record["prompt"]))


def heldout_styles() -> list[str]:
    """The hand-written held-out prompts, interleaved by style (the module's docstring)."""
    per_style = [[prompt for _, prompt in entries] for entries in WRITTEN.values()]
    return [group[i] for i in range(max(map(len, per_style))) for group in per_style if i < len(group)]


def style_of_heldout(prompt: str) -> str:
    """The style a hand-written held-out prompt is in; ValueError for another prompt."""
    for style, entries in WRITTEN.items():
        if any(prompt == p for _, p in entries):
            return style
    raise ValueError(f"{prompt[:60]!r} is none of the hand-written held-out prompts (heldout_styles.WRITTEN)")


def heldout_topics() -> list[str]:
    return [topic for entries in WRITTEN.values() for topic, _ in entries]
