"""Notebook 02's last part: a trained draft next to a random one of the same shape, on a real pair.

SmolLM2-135M-Instruct (the project's own Llama target, transformers' numbers) decodes the first held-out
prompt greedily with the shipped DFlash 1 draft, then with a random draft of its shape; the draft's attention
is traced in both, and both outputs are checked equal to the target's own greedy decoding.
"""

from __future__ import annotations

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
