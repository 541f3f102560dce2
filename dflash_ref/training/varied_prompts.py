"""Training prompts of many shapes (`train --prompt-set varied`): STYLES, 48 hand-written styles with slots,
each filled with every training topic of prompts.py once:

    prompt q·S + s = STYLES[s] filled with topic (q + s·⌊N/S⌋) mod N and slot variant q       (S styles, N topics)

so the S·N prompts are all distinct (style s meets every topic once), and any first n spread over the
styles (each within one of n / S) and over the topics. The slots besides the topic — a second topic, an
audience, a word limit, numbers for a word problem, a short passage to rewrite — are picked by q, so one
style's prompts differ in more than the topic. The held-out topics of prompts.py are never used, and
heldout_styles.py holds prompts in styles none of these has. No torch here.
"""

from __future__ import annotations

import functools
import re

from .prompts import HELD_OUT_TOPICS, TOPICS

STYLES = [  # (name, template): {t} the topic, {T} it capitalised, {u} another topic; the other slots below
    ("three sentences", "Explain {t} in exactly three sentences."),
    ("word limit", "Describe {t} in fewer than {n0} words."),
    ("banned word", 'Write a short paragraph about {t} without using the word "{word}".'),
    ("audience", "Explain {t} to {who}."),
    ("museum guide", "You are a museum guide. Welcome a group of visitors and tell them about {t}."),
    ("pirate", "Pretend you are a pirate captain telling your crew about {t}. Stay in character."),
    ("teacher role", "Act as a friendly science teacher. A student asks: how does {t} affect our daily lives?"),
    ("news anchor", "You are a radio news presenter. Give a thirty-second report on something new about {t}."),
    ("simplify passage", 'Rewrite this in plain, simple words:\n\n"{passage}"'),
    ("formal passage", 'Rewrite the following so that it sounds formal and polished:\n\n"{casual}"'),
    ("summarise passage", "Summarise this passage in one sentence:\n\n{passage}"),
    ("bullets from passage", "Turn this paragraph into three short bullet points:\n\n{passage}"),
    ("python function", "Write a Python function that {task}. Add a short docstring."),
    (
        "explain code",
        "What does this Python code do? Explain it line by line.\n\n"
        '{ident} = ["{t}", "{u}"]\nfor i, name in enumerate({ident}):\n    print(i, name.upper())',
    ),
    (
        "javascript",
        'Write a small JavaScript function that shows the message "Today we learn about {t}" '
        'inside the page element with id "{ident}".',
    ),
    (
        "sql",
        "Write an SQL query that lists the ten newest rows of a table called {ident}_notes, which has the "
        "columns id, title and created_at.",
    ),
    (
        "sum problem",
        "A class collected {a} pictures of {t} on Monday and {b} more on Tuesday. They gave away {c}. "
        "How many pictures do they have now? Show your working.",
    ),
    (
        "sharing problem",
        "A club has {ab} stickers about {t} to share equally among {b} members. How many does "
        "each member get, and how many are left over?",
    ),
    (
        "percent problem",
        "A book about {t} costs {price} dollars. It is on sale for {pct} percent off. What is the "
        "sale price? Explain each step.",
    ),
    (
        "rate problem",
        "A video about {t} is {a} minutes long. If you watch it at 1.5 times the normal speed, "
        "how long does it take? Give the answer in minutes and seconds.",
    ),
    ("word list", "List {n} words that come to mind when you think of {t}."),
    ("question list", "Give me a numbered list of {n} questions a curious person might ask about {t}."),
    ("myths list", "List {n} common myths about {t}, and say in one line why each is wrong."),
    ("tips list", "What are {n} practical tips for someone who wants to learn more about {t}?"),
    ("compare two", "Compare {t} and {u}. How are they alike, and how are they different?"),
    ("pick one", "Which is more interesting to study, {t} or {u}? Give one reason for each, then choose."),
    ("connection", "What could {t} and {u} possibly have in common? Find at least two links."),
    ("casual curious", "hey, do you know much about {t}? kinda curious"),
    (
        "casual documentary",
        "I just watched a documentary about {t} and it blew my mind. Have you heard anything cool about it?",
    ),
    ("casual convince", "my friend says {t} is boring lol. convince me otherwise"),
    ("casual quick", "quick q: whats the deal with {t}?"),
    (
        "little brother",
        "My little brother asked me about {t} and I didn't know what to say. He is seven and "
        "loves stories. How should I explain it to him?",
    ),
    (
        "school report",
        "I'm writing a school report on {t}. I already have an introduction. What three main "
        "sections should the rest of it have, and what goes in each?",
    ),
    (
        "book club",
        "Our book club meets next week and the theme is {t}. There are five of us and we like short "
        "reads. What could we talk about for an hour?",
    ),
    (
        "trip planning",
        "We are visiting a town that is famous for {t}. We have one afternoon and two children "
        "with us. What should we look out for?",
    ),
    ("table", 'Make a table with two columns, "Fact" and "Why it matters", with four rows about {t}.'),
    ("faq", "Write a short FAQ about {t}: three questions, each with a two-sentence answer."),
    ("markdown", "Answer in Markdown, with a heading and exactly two bullet points: what is special about {t}?"),
    ("three lines", "Give a one-line definition of {t}, then one example, then one fun fact, each on its own line."),
    ("haiku", "Write a haiku about {t}."),
    ("limerick", "Write a funny limerick about {t}."),
    ("story opening", "Write the first paragraph of an adventure story in which {t} plays a big part."),
    ("misunderstanding", "What is one thing people often get wrong about {t}?"),
    ("beginner steps", "How can a complete beginner start learning about {t}? Give the steps in order."),
    ("quiz", "Write three multiple-choice quiz questions about {t}, each with four options, and give the answers."),
    ("then and now", "How have people's ideas about {t} changed over the last hundred years?"),
    ("key words", "Explain three words someone should know before reading a book about {t}."),
    ("metaphor", "Describe {t} using a metaphor from cooking, and explain the metaphor."),
]

AUDIENCES = [
    "a ten-year-old",
    "my grandmother",
    "a busy manager in two sentences",
    "a new student in class",
    "someone who has never heard of it",
    "a curious teenager",
]
WORDS = ["very", "thing", "good", "big", "important", "interesting"]
TASKS = [
    "returns the longest word in a sentence about {t}",
    'counts the vowels in the string "{t}"',
    "turns a list of facts about {t} into a numbered string",
    'checks whether the word "{t}" appears in a text, ignoring case',
    "sorts a list of (name, year) records about {t} by year",
]
PASSAGES = [
    "People have been curious about {t} for a very long time. Over the centuries many ideas about it came and "
    "went, and some of them turned out to be wrong, but each one helped the next generation ask better questions.",
    "{T} is something most of us meet without thinking about it. Yet when you look closely, it turns out to be "
    "full of small surprises, and learning about it changes the way you see ordinary days.",
    "Experts who study {t} often disagree about the details. What they agree on is that it is more complicated "
    "than it looks, and that careful observation matters more than quick conclusions.",
    "In many schools, children first hear about {t} in a short lesson. Some forget it the next week, while "
    "others stay interested for the rest of their lives and keep reading about it.",
]
CASUAL = [
    "hey so {t} is actually pretty cool, we should maybe look into it more at some point",
    "honestly i dont get why everyone is talking about {t} all of a sudden, can someone explain",
    "just a heads up, the meeting about {t} got moved to thursday, sorry for the late notice",
]


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
