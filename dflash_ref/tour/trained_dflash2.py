"""Notebook 04's last part, on a real pair: SmolLM2-135M and the shipped DFlash 2 draft.

Greedy on held-out prompts of both kinds (the templates' held-out topics, the other styles): the
candidate lattice of one step with real tokens, and over every step what the selector's path got
against the argmax of the same draft logits (training/measure.py's `path_against_argmax`):

    accepted per step, path / argmax;  at the decisive positions (the path right up to there):
    y_t among the K candidates (recall), a_t = y_t, d_t = y_t, and where d_t ≠ a_t which was right
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..decoding import generate, spec_generate
from ..drafts.checkpoint import load_draft
from ..drafts.folder import SHIPPED_DFLASH2
from ..extensions.draft_vocab import draft_vocab_of
from ..loading.smollm2 import STOP_TOKEN_IDS, chat_ids, load_smollm2_own
from ..trace import Trace, tracing
from ..training.measure import acceptance_by_position, best_candidate, path_against_argmax, selector_log
from ..training.prompt_sets import split_prompts
from ..training.prompts import eval_prompts
from ..viewer import name_tokens
from .progress import DecodeProgress


class TokenTexts(Sequence):
    """id → the token's text as the tokenizer decodes it alone (a newline shown as \\n), decoded when
    asked: tick and cell labels for a 49152-word vocabulary without decoding all of it."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.tokenizer)

    def __getitem__(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)]).replace("\n", "\\n")


TRAINED_PROMPTS, TRAINED_TOKENS = 3, 64  # of each held-out set (templates', other styles), new tokens each


@dataclass
class TrainedDFlash2:
    prompt: str  # the first prompt, whose steps are traced
    trace: Trace  # its candidate selector's hook points, every step
    tokens: TokenTexts
    tally: dict  # path_against_argmax over every step of every prompt
    prompts: int
    sizes: str  # the draft's DFlash 2 sizes, as its config gives them


def trained_dflash2_example(progress: bool = False) -> TrainedDFlash2:
    """The shipped SmolLM2 DFlash 2 draft (fp32, proposing among its draft vocabulary) greedy on the first
    TRAINED_PROMPTS prompts of both held-out sets: its path against the argmax of its own logits at every
    step, and the first prompt's selector traced (its output checked equal to the target's own).
    `progress`: bars on stderr, token by token: the traced decode, then the prompts (progress.py)."""
    target, tokenizer = load_smollm2_own()  # the own Llama target: transformers' numbers, faster
    draft = load_draft(SHIPPED_DFLASH2, torch.float32)
    c = draft.config
    sizes = (
        f"J = {c.conv_kernel_size} taps, channels in groups of {c.conv_group_size}, selector rank r = "
        f"{c.selector_rank}, M = {c.selector_top_k} candidates, proposals among its "
        f"{len(draft.draft_vocab)}-token draft vocabulary (of V = {c.vocab_size})"
    )
    prompts = eval_prompts(TRAINED_PROMPTS) + split_prompts("heldout-styles")[:TRAINED_PROMPTS]
    ids = chat_ids(tokenizer, prompts[0])
    names = ["draft.candidate_selector.*", "draft.layers.*.self_attn.hook_pattern"]  # the lattice; the viewer's
    with (
        tracing(draft, names=names, meta={"prompt": prompts[0]}) as trace,
        DecodeProgress("traced decode", TRAINED_TOKENS, on=progress) as bar,
    ):
        out = spec_generate(
            draft, target, ids, TRAINED_TOKENS, STOP_TOKEN_IDS, extensions=draft_vocab_of(draft, target),
            on_step=lambda step: (trace.on_step(step), bar.on_step(step)),
        )  # fmt: skip
        bar.end_decode()
    assert torch.equal(out.output_ids, generate(target, ids, TRAINED_TOKENS, STOP_TOKEN_IDS).output_ids), (
        "speculative output must equal AR"
    )
    texts = TokenTexts(tokenizer)
    name_tokens(trace, lambda i: tokenizer.decode([i]), out.output_ids[0].tolist(), STOP_TOKEN_IDS)  # the viewer
    outputs, records = [], []
    with DecodeProgress(f"{len(prompts)} held-out prompts", TRAINED_TOKENS, len(prompts), on=progress) as bar:
        _, choices = selector_log(
            draft,
            lambda: acceptance_by_position(
                draft, target, tokenizer, prompts, TRAINED_TOKENS, STOP_TOKEN_IDS, outputs=outputs,
                records=records, done=lambda i: bar.end_decode(), on_step=bar.on_step,
            ),
        )  # fmt: skip
    tally = path_against_argmax(records, choices, outputs)
    return TrainedDFlash2(prompts[0], trace, texts, tally, len(prompts), sizes)


def first_moved_step(trace: Trace) -> int:
    """The first step whose path leaves the argmax of the draft logits (the candidate of best unary z)
    somewhere; 0 if none does."""
    name = "draft.candidate_selector."
    for step, acts in enumerate(trace.activations):
        if not torch.equal(
            best_candidate(acts[name + "hook_candidates"], acts[name + "hook_unary"]), acts[name + "hook_path"]
        ):
            return step
    return 0


def tell_trained_dflash2(ex: TrainedDFlash2, say: Callable[[str], None] = print) -> None:
    t = ex.tally
    say(f"The DFlash 2 draft shipped for SmolLM2-135M: {ex.sizes}")
    say(f"Greedy, {ex.prompts} held-out prompts, {TRAINED_TOKENS} tokens each, {t['steps']} steps")
    say(
        f"   accepted proposals per step: its path {t['accepted/step, path']:.3f}, the argmax of the same "
        f"logits {t['accepted/step, argmax']:.3f}"
    )
    n = max(t["decisive"], 1)
    say(
        f"   at the {t['decisive']} decisive positions (the path right up to there): the target's token among "
        f"the candidates {t['in candidates'] / n:.0%}, the argmax right {t['argmax right'] / n:.0%}, "
        f"the path right {t['path right'] / n:.0%}"
    )
    say(
        f"   the path left the argmax at {t['moved']} of them: right {t['moved, path right']} times, "
        f"where the argmax was right {t['moved, argmax right']} times"
    )
    step = first_moved_step(ex.trace)
    acts, record = ex.trace.activations[step], ex.trace.records[step]
    say(
        f"   step {step} of {ex.prompt!r}, accepted {record.acceptance_length}: the best 4 of the "
        f"{acts['draft.candidate_selector.hook_candidates'].shape[-1]} candidates by z + pair (the path takes the "
        f"first), the argmax (best z) after the bar"
    )
    candidates, unary, pair = (
        acts["draft.candidate_selector." + h] for h in ("hook_candidates", "hook_unary", "hook_pair")
    )
    for t, argmax in enumerate(best_candidate(candidates, unary).tolist()):
        ranked = sorted(zip(candidates[t].tolist(), unary[t].tolist(), pair[t].tolist()), key=lambda c: -(c[1] + c[2]))
        cells = ", ".join(f"{ex.tokens[c]!r} {u:.1f}{p:+.1f}" for c, u, p in ranked[:4])
        say(f"   d{t + 1}: {cells} | {ex.tokens[argmax]!r}")
