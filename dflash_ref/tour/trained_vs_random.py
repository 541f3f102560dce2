"""Notebook 02's last part: a trained draft next to a random one of the same shape, on a real pair.

SmolLM2-135M-Instruct (the project's own Llama target, transformers' numbers) decodes the first held-out
prompt greedily with the shipped DFlash 1 draft, then with a random draft of its shape; the draft's attention
is traced in both, and both outputs are checked equal to the target's own greedy decoding. `tell_attention`
says, from the traces, where each block position of each draft looks at step 0, so the notebook's reading of
its figure is computed, not written by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..decoding import GenerationOutput, generate, spec_generate
from ..drafts.checkpoint import load_draft
from ..drafts.folder import SHIPPED_DFLASH1
from ..drafts.random_draft import random_smollm2_draft
from ..extensions.draft_vocab import draft_vocab_of
from ..loading.smollm2 import STOP_TOKEN_IDS, chat_ids, load_smollm2_own
from ..trace import Trace, tracing
from ..training.prompts import eval_prompts
from .progress import DecodeProgress
from .trained_dflash2 import TokenTexts


@dataclass
class Comparison:
    prompt: str
    tokens: list[str]  # the prompt and the (shared) output, each token's own text
    text: str  # the output, decoded
    outputs: dict[str, GenerationOutput]
    traces: dict[str, Trace]


def trained_vs_random_example(max_new_tokens: int = 64, progress: bool = False) -> Comparison:
    """The shipped SmolLM2 DFlash 1 draft and a random draft of its shape, greedy on the first held-out
    prompt, draft attention traced; both outputs are the target's own (checked). `progress`: a bar per
    decode, token by token, on stderr (progress.py)."""
    target, tokenizer = load_smollm2_own()
    trained = load_draft(SHIPPED_DFLASH1, torch.float32)
    drafts = {
        "trained": trained,
        "random": random_smollm2_draft(target, trained.config.num_hidden_layers, trained.block_size),
    }
    prompt = eval_prompts(1)[0]
    ids = chat_ids(tokenizer, prompt)
    outputs, traces = {}, {}
    for name, draft in drafts.items():
        vocabulary = draft_vocab_of(draft, target)  # the trained draft proposes among its own (draft_vocab.json)
        with (
            tracing(draft, names=["*hook_pattern"], meta={"draft": name, "prompt": prompt}) as trace,
            DecodeProgress(f"{name} draft", max_new_tokens, on=progress) as bar,
        ):
            outputs[name] = spec_generate(
                draft, target, ids, max_new_tokens, STOP_TOKEN_IDS, extensions=vocabulary,
                on_step=lambda step, trace=trace, bar=bar: (trace.on_step(step), bar.on_step(step)),
            )  # fmt: skip
            bar.end_decode()
        traces[name] = trace
    reference = generate(target, ids, max_new_tokens, STOP_TOKEN_IDS).output_ids
    assert all(torch.equal(o.output_ids, reference) for o in outputs.values()), "speculative output must equal AR"
    texts = TokenTexts(tokenizer)  # each token decoded alone ("Ġheart" is " heart"): ticks
    pieces = [texts[i] for i in reference[0].tolist()]
    return Comparison(
        prompt, pieces, tokenizer.decode(reference[0, ids.shape[1] :], skip_special_tokens=True), outputs, traces
    )


def tell_attention(pair: Comparison, layers=(0, 1), head: int = 0, say: Callable[[str], None] = print) -> None:
    """At step 0, for each draft, layer and block position: the key it attends most (position:token, as the draft
    saw it: the block's masks as masks) and that key's weight; then each draft's mean largest weight against the
    even share 1 / L_k."""
    largest = {}
    for name, trace in pair.traces.items():
        record = trace.records[0]

        def seen(position: int, start: int = record.start) -> str:  # the draft's input there: masks after x_0
            return f"{position}:{pair.tokens[position]!r}" if position <= start else f"{position}:<mask>"

        for layer in layers:
            weights = trace.attention(0, layer)[head].float()  # (L_q, L_k)
            tops = weights.max(dim=-1)
            rows = [
                f"{seen(q)} → {seen(int(k))} {float(w):.2f}"
                for q, k, w in zip(record.q_position_ids, tops.indices, tops.values)
            ]
            say(f"{name:>8} · layer {layer}, head {head}:  " + ";  ".join(rows))
            largest.setdefault(name, []).extend(tops.values.tolist())
    keys = len(next(iter(pair.traces.values())).records[0].k_position_ids)
    means = ", ".join(f"{name} draft {sum(v) / len(v):.2f}" for name, v in largest.items())
    say(f"a block row's largest weight, on average: {means}; spread evenly over the {keys} keys: {1 / keys:.2f}")
