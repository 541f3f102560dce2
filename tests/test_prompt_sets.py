"""The prompts written here beside the templates: the varied training prompts (many styles), the hand-written
held-out styles, and the sets by name (training/prompt_sets.py). No model is loaded."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from dflash_ref.training import heldout_styles as hand
from dflash_ref.training import varied_prompts as varied
from dflash_ref.training.prompt_sets import SPLITS, kind_of, split_prompts
from dflash_ref.training.prompts import HELD_OUT_TOPICS, TEMPLATES, TOPICS


def test_varied_prompts_are_distinct_and_cover_every_style_with_every_training_topic():
    written = varied.varied_prompts()
    topics = TOPICS[:-HELD_OUT_TOPICS]
    assert len(varied.STYLES) >= 40 and len({name for name, _ in varied.STYLES}) == len(varied.STYLES)
    assert len(written) == len(set(written)) == len(varied.STYLES) * len(topics)
    per_style = Counter(varied.style_of(p) for p in written)
    assert set(per_style.values()) == {len(topics)}  # each style once with each topic
    assert varied.varied_prompts() == written  # deterministic (and rebuilt equal)
    assert min(map(len, written)) < 40 < 200 < max(map(len, written))  # short chat to multi-sentence passages
    assert sum("\n" in p for p in written) > len(written) // 20  # passages, code and dialogue on lines


@pytest.mark.parametrize("n", [1, 7, 48, 100, 1860])
def test_any_first_n_varied_prompts_spread_over_the_styles_and_topics(n):
    first = varied.varied_prompts()[:n]
    counts = Counter(varied.style_of(p) for p in first)
    assert len(counts) == min(n, len(varied.STYLES))
    assert max(counts.values()) - min(counts.values()) <= 1
    assert max(counts.values()) == math.ceil(n / len(varied.STYLES))
    topics = TOPICS[:-HELD_OUT_TOPICS]
    named = {t for p in first for t in topics if f" {t}" in p or p.startswith(t)}
    assert len(named) >= min(n, len(topics)) * 0.9  # nearly as many topics as prompts, up to all


def test_the_hand_written_held_out_set_interleaves_its_styles():
    written = hand.heldout_styles()
    assert len(written) == len(set(written)) >= 48 and hand.heldout_styles() == written
    styles = list(hand.WRITTEN)
    assert [hand.style_of_heldout(p) for p in written[: len(styles)]] == styles
    for n in (1, 5, 12, 20, 48):
        counts = Counter(hand.style_of_heldout(p) for p in written[:n])
        assert max(counts.values()) - min(counts.values(), default=0) <= 1 and len(counts) == min(n, len(styles))


def test_held_out_sets_share_no_prompt_topic_or_style_with_the_training_prompts():
    training = set(split_prompts("train")) | set(split_prompts("varied"))
    for held in ("heldout", "heldout-styles"):
        assert not training & set(split_prompts(held))
    assert not set(hand.heldout_topics()) & set(TOPICS)  # topics no training prompt set is built on
    held_topics = TOPICS[-HELD_OUT_TOPICS:]  # prompts.py's held-out topics: never varied
    assert not [p for p in split_prompts("varied") for t in held_topics if t in p]
    trained_styles = {name for name, _ in varied.STYLES} | set(TEMPLATES)
    assert not set(hand.WRITTEN) & trained_styles


def test_each_split_names_the_template_or_style_of_its_prompts():
    assert SPLITS == ("train", "heldout", "varied", "mixed", "heldout-styles")
    assert kind_of(split_prompts("train")[0]) in TEMPLATES
    assert kind_of(split_prompts("varied")[1]) == varied.STYLES[1][0]
    assert kind_of(split_prompts("heldout-styles")[2]) == list(hand.WRITTEN)[2]
    with pytest.raises(ValueError, match="none of the prompts written here"):
        kind_of("What is love?")
    with pytest.raises(ValueError, match="split must be one of"):
        split_prompts("test")


def test_mixed_prompts_take_the_templates_and_the_varied_ones_in_turn():
    templates, written, mixed = split_prompts("train"), split_prompts("varied"), split_prompts("mixed")
    assert mixed[:6] == [templates[0], written[0], templates[1], written[1], templates[2], written[2]]
    assert sorted(mixed) == sorted(templates + written) and len(set(mixed)) == len(mixed)
    assert mixed[2 * len(templates) :] == written[len(templates) :]


def test_the_prompt_sets_are_data_files_of_the_package():
    """The topics, templates, styles, their slots and the hand-written held-out prompts are read from
    training/data/ (the code only combines and orders them), and ship with the package."""
    from pathlib import Path

    import tomllib

    from dflash_ref.training import prompts, varied_prompts

    data = Path(prompts.__file__).with_name("data")
    assert prompts.TOPICS[0] == "the sea" and len(prompts.TOPICS) == 607 and "# " not in "".join(prompts.TOPICS)
    assert prompts.TEMPLATES[0] == "What is {t}?" and len(varied_prompts.STYLES) == 48
    shipped = tomllib.loads((data.parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = shipped["dflash_ref.training"]
    assert sorted(p.name for p in data.iterdir()) == sorted(
        p.name for pattern in patterns for p in data.parent.glob(pattern)
    )
