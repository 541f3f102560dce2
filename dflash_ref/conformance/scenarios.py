"""The golden scenarios: tiny models and inputs, each chosen for a property of DFlash it pins down,
and checking that property on the reference's own run, so that a change that loses it fails loudly.

    01_walkthrough   the seed's example: a 3-token prompt, block size 4 (drafts/toy.py's models)
    02_multiround    greedy, many rounds: τ = 0, partial and full; a mismatch followed by a match;
                     the mask token among the outputs
    03_stop_token    the same models, stopped by a stop token inside a step
    04_gqa_sliding   8 query heads on 2 KV heads; layer 0 a sliding window of 3 (causal), layer 1 full
    05_block16       the official shape in miniature: 36 target layers, 5 draft layers, block 16,
                     target_layer_ids [1, 9, 17, 25, 33], 4 query heads per KV head
    06_stop_inside   a stop token accepted inside a step's run, more accepted tokens after it
    07_stop_bonus    a stop token as a step's bonus
    08_stop_first    a stop token as the first generated token: no decode step
    09_long_context  a 4100-token prompt, θ = 1e6: draft positions past 4096
    10_bf16          bfloat16 weights and compute (expected values stored as exact float32), a seed whose
                     decisions keep a margin over bf16 rounding
    11_window_symmetric   layer 0 a symmetric (non-causal) window of 2: |q − k| < 2, block keys included
    12_window_rotating    layer 0 a rotating window of 3 (dflash_config.sliding_window_kind): the window
                          bounds the context only, the block of 4 sees all of its causal part
    13_rope_yarn          target and draft with YaRN RoPE (factor 4 over 32 positions), a 40-token
                          prompt; configs spelled as released checkpoints: rope_theta + rope_scaling only
    14_rope_linear        linear RoPE scaling (factor 2), spelled as transformers 5: rope_parameters only
    15_dflash2            a DFlash 2 draft: dynamic convolution (K = 2, groups of 4) around every sublayer,
                          the candidate selector (top 3 of 8, rank 4) choosing the proposals
    16_hybrid_target      a Qwen3.5-style hybrid target (3 Gated DeltaNet layers, then gated attention): its
                          linear layers' states after every crop, rejected tokens undone (target/hybrid_cache.py)
    17_muse_glimmer       the walkthrough's target with its trained draft written as a Muse Glimmer assistant
                          (transformers' own DFlash drafter, muse_glimmer.py): every layer Muse's default window,
                          |q − k| ≤ 2048, which no key leaves here
    18_muse_glimmer_window  the same as a Muse folder with layer 0 windowed |q − k| ≤ 2 and layer 1 full, on a
                          6-token prompt: the window bites on the context and on the block
(04, 11 and 12 are the three meanings of a sliding window: attention.py; 17 and 18 a Muse window, 11's kind.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import DraftConfig, TargetConfig
from ..dflash2 import make_draft
from ..draft_model import DFlashDraftModel
from ..drafts.random_draft import randomize_
from ..drafts.toy import PROMPT, VOCAB, demo_models, encode
from ..muse_glimmer import FULL, MODEL_TYPE, SLIDING
from ..target import HybridConfig, Qwen3_5Target, Qwen3Target
from .stages import walk_order


def tiny_pair(
    seed: int,
    vocab: int = 6,
    target_layers: int = 4,
    draft_layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    target_heads: tuple[int, int] = (4, 2),
    intermediate: int = 32,
    block_size: int = 4,
    positions: int = 128,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    target_layer_ids: list[int] | None = None,
    **draft_fields,
) -> tuple[Qwen3Target, DFlashDraftModel]:
    """A tiny target and draft. The draft reads target layers `target_layer_ids`; by default [1, 2] of the 4
    (the official formula gives [1, 1] there, a repeated layer a port that de-duplicates ids would read once:
    one bundle keeps it on purpose, `multiround`), else the formula's."""
    if target_layer_ids is None and (target_layers, draft_layers) == (4, 2):
        target_layer_ids = [1, 2]
    shared = dict(
        vocab_size=vocab,
        hidden_size=16,
        head_dim=4,
        intermediate_size=intermediate,
        max_position_embeddings=positions,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
    )
    target = Qwen3Target(
        TargetConfig(
            num_hidden_layers=target_layers,
            num_attention_heads=target_heads[0],
            num_key_value_heads=target_heads[1],
            **shared,
        )
    )
    draft = make_draft(
        DraftConfig(
            num_hidden_layers=draft_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            num_target_layers=target_layers,
            block_size=block_size,
            mask_token_id=vocab - 1,
            target_layer_ids=target_layer_ids or [],
            **shared,
            **draft_fields,
        )
    )
    return randomize_(target, seed), randomize_(draft, seed + 1000)


def muse_pair(windows: list[int | None]) -> tuple[Qwen3Target, DFlashDraftModel]:
    """The walkthrough's target and its trained toy draft (tour/toy_drafts.py) as a Muse Glimmer assistant
    (as_muse)."""
    target, draft = demo_models(trained=True)
    return target, as_muse(draft, windows)


def as_muse(draft: DFlashDraftModel, windows: list[int | None]) -> DFlashDraftModel:
    """A DFlash 1 draft with a Muse Glimmer assistant's attention, its weights unchanged: per layer a
    bidirectional window |q − k| ≤ W (a number: DFlash's symmetric window of W + 1), or full attention (None).
    One W for every windowed layer, as Muse's config has one."""
    sizes = {w for w in windows if w is not None}
    config = dataclasses.replace(
        draft.config,
        layer_types=[FULL if w is None else SLIDING for w in windows],
        sliding_window=(sizes.pop() + 1) if sizes else None,
        is_causal=False,
    )
    muse = make_draft(config)
    muse.load_state_dict(draft.state_dict())
    return muse.eval()


def hybrid_pair(seed: int) -> tuple[Qwen3_5Target, DFlashDraftModel]:
    """A tiny Qwen3.5 hybrid target (layers linear, linear, linear, full: mlx-lm's every-4th layout; partial
    RoPE on half of head_dim 8) and a DFlash 1 draft reading layers 0 and 2 (both Gated DeltaNet)."""
    shared = dict(vocab_size=8, hidden_size=16, intermediate_size=32, max_position_embeddings=128, rope_theta=10000.0)
    target = Qwen3_5Target(
        HybridConfig(
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=4,
            linear_value_head_dim=4,
            partial_rotary_factor=0.5,
            **shared,
        )
    )
    draft = make_draft(
        DraftConfig(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=4,
            num_target_layers=4,
            block_size=4,
            mask_token_id=7,
            target_layer_ids=[0, 2],
            **shared,
        )
    )
    return randomize_(target, seed), randomize_(draft, seed + 1000)


@dataclass
class Scenario:
    name: str
    description: str
    build: Callable[[], tuple[Qwen3Target, DFlashDraftModel]]
    input_ids: list[int]
    max_new_tokens: int
    stop_token_ids: list[int] | None = None
    dtype: str = "float32"
    tokens: list[str] | None = None  # the tokenizer stub's token texts (default <t0>, <t1>, …)
    rope_spelling: str | None = None  # "rope_scaling" | "rope_parameters": the configs keep only that one
    check: Callable[[dict], None] = lambda produced: None
    tokenizer: Callable[[], object] | None = None  # a real tokenizer, saved beside the target (engine_scenarios.py)
    target_folder: Callable[[], Path] | None = None  # an existing target folder, linked instead of written
    serving: dict | None = None  # a request of a serving scenario: how an engine submits it (engine_scenarios.py)
    draft_format: str = "dflash"  # or muse_glimmer.MODEL_TYPE: the draft folder as a Muse Glimmer assistant's


def _steps(p: dict, what: str) -> list:
    return [p[k].tolist() for k in sorted((k for k in p if k.endswith("/" + what)), key=walk_order)]


def check_rounds(p: dict) -> None:
    """τ = 0, partial and full acceptance among the steps (blocks of 4)."""
    taus, gammas = _steps(p, "acceptance_length"), [len(d) for d in _steps(p, "draft_tokens")]
    assert 0 in taus and any(0 < t < 3 for t in taus) and 3 in taus and max(gammas) == 3, taus


def _check_multiround(p: dict) -> None:
    check_rounds(p)
    hops = [
        (d, q)
        for d, q in zip(_steps(p, "draft_tokens"), _steps(p, "posterior"))
        if any(d[i] != q[i] and d[j] == q[j] for i in range(len(d)) for j in range(i + 1, len(d)))
    ]
    assert hops, "no step where a rejected draft token is followed by a matching one"
    assert 5 in p["output_ids"][4:], "the mask token (5) should be among the outputs"


def _check_stop(p: dict) -> None:
    out = p["output_ids"].tolist()
    assert len(out) < 4 + 20 and out[-1] == 2 and 2 not in out[4:-1], out
    assert any(t > 0 for t in _steps(p, "acceptance_length"))


def _last_step(p: dict) -> tuple[list[int], int, int]:
    """(the last step's proposals, τ, bonus)."""
    return _steps(p, "draft_tokens")[-1], _steps(p, "acceptance_length")[-1], _steps(p, "bonus")[-1]


def check_stop_inside(stop: int, prompt_len: int) -> Callable[[dict], None]:
    """The output ends at `stop`, which the last step drafted and accepted with more accepted tokens after it."""

    def check(p: dict) -> None:
        out, (drafted, tau, _) = p["output_ids"].tolist(), _last_step(p)
        assert out[-1] == stop and stop not in out[prompt_len:-1], out
        assert stop in drafted[:tau] and drafted[:tau].index(stop) < tau - 1, (drafted, tau)  # accepted ones follow

    return check


def check_stop_bonus(stop: int, prompt_len: int) -> Callable[[dict], None]:
    """The output ends at `stop`, the last step's bonus (none of its accepted proposals), after at least one
    accepted proposal."""

    def check(p: dict) -> None:
        out, (drafted, tau, bonus) = p["output_ids"].tolist(), _last_step(p)
        assert out[-1] == bonus == stop and tau >= 1 and stop not in out[prompt_len:-1], (out, tau, bonus)
        assert stop not in drafted[:tau], (drafted, tau)

    return check


def _check_stop_first(p: dict) -> None:
    assert p["output_ids"].tolist() == [0, 1, 2, 3, 6] and not any(k.startswith("step") for k in p), sorted(p)


LONG_PROMPT = [(7 * i + 3) % 8 for i in range(4100)]  # positions past 4096, where an offset error shows


def _check_long(p: dict) -> None:
    assert p["step0/draft.hook_target_hidden"].shape[0] == len(LONG_PROMPT) > 4096
    assert len(p["output_ids"]) == len(LONG_PROMPT) + 8


def _window_pattern(p: dict) -> np.ndarray:
    """Step 0's layer-0 pattern, averaged over heads: (L_q, L_k), context keys first."""
    return p["step0/draft.layers.0.self_attn.hook_pattern"].mean(axis=0)


def _check_symmetric(p: dict) -> None:
    seen = _window_pattern(p)[:, -4:] > 0  # the block's 4 keys
    assert seen[0].tolist() == [True, True, False, False] and seen[3].tolist() == [False, False, True, True]


def _check_rotating(p: dict) -> None:
    pattern = _window_pattern(p)
    assert (pattern[:, -4:] > 0).tolist() == np.tril(np.ones((4, 4), bool)).tolist()  # no window in the block
    assert (pattern[:, :-4] > 0).sum() == 3  # context keys 5, 6 seen by query 0, 6 by query 1


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
LONGER_THAN_32 = [(5 * i + 1) % 8 for i in range(40)]  # positions past the unscaled 32


def _check_long_prompt(p: dict) -> None:
    assert p["step0/draft.hook_target_hidden"].shape[0] == len(LONGER_THAN_32) > 32


def _check_dflash2(p: dict) -> None:
    """The selector matters: at some step its path is not the argmax of the draft logits."""
    steps = [k.split("/")[0] for k in p if k.endswith("/draft_tokens")]
    assert any(p[f"{s}/draft_tokens"].tolist() != p[f"{s}/draft.hook_logits"].argmax(-1).tolist() for s in steps)


def _check_hybrid(p: dict) -> None:
    """A rejection inside a verify (τ + 1 < L_q) at a step that another follows: its states are rolled back
    and the next step's posterior reads them."""
    taus, sizes = _steps(p, "acceptance_length"), [len(q) for q in _steps(p, "posterior")]
    assert any(t + 1 < n for t, n in zip(taus[:-1], sizes[:-1])), (taus, sizes)
    assert any(t > 0 for t in taus), taus
    assert sorted({k.split("/")[1] for k in p if "target.layers" in k}) == [
        f"target.layers.{i}.linear_attn.{s}" for i in range(3) for s in ("conv_state", "recurrent_state")
    ]


def _check_block16(p: dict) -> None:
    assert p["prefill/layer_ids"].tolist() == [1, 9, 17, 25, 33]
    assert p["step0/draft.layers.4.self_attn.hook_pattern"].shape[1] == 16


SCENARIOS = [
    Scenario(
        "walkthrough",
        "the seed's example: 3-token prompt 'the cat sat', block size 4, the demo models",
        lambda: demo_models(),
        encode(PROMPT)[0].tolist(),
        4,
        tokens=list(VOCAB),
    ),
    Scenario(
        "multiround",
        "greedy, 9 rounds: τ = 0, partial and full; a rejected draft token followed by a "
        "matching one (cumprod matters); the mask token (5) among the outputs; target_layer_ids [1, 1] on "
        "purpose (the official formula's for 4 target layers and 2 draft layers): a repeated layer is read twice",
        lambda: tiny_pair(8, target_layer_ids=[1, 1]),
        [0, 1, 2, 3],
        20,
        check=_check_multiround,
    ),
    Scenario(
        "stop_token",
        "the multiround models, stopped by stop token 2 committed inside a step",
        lambda: tiny_pair(8),
        [0, 1, 2, 3],
        20,
        stop_token_ids=[2],
        check=_check_stop,
    ),
    Scenario(
        "gqa_sliding",
        "8 query heads on 2 KV heads; draft layer 0 a causal sliding window of 3, layer 1 full non-causal attention",
        lambda: tiny_pair(3, vocab=8, heads=8, layer_types=["sliding_attention", "full_attention"], sliding_window=3),
        [1, 2, 3, 4, 5, 6, 0],
        10,
    ),
    Scenario(
        "block16",
        "the official shape in miniature: 36 target layers, 5 draft layers, block size 16, "
        "target_layer_ids [1, 9, 17, 25, 33], 4 query heads per KV head",
        lambda: tiny_pair(
            5,
            vocab=8,
            target_layers=36,
            draft_layers=5,
            heads=4,
            kv_heads=1,
            target_heads=(4, 1),
            intermediate=16,
            block_size=16,
        ),
        [1, 2, 3, 4, 5],
        20,
        check=_check_block16,
    ),
    Scenario(
        "stop_inside",
        "stop token 3 drafted and accepted inside a step's run, more accepted proposals after it: nothing after "
        "it is committed (neither they nor the bonus)",
        lambda: tiny_pair(2, vocab=8),
        [0, 1, 2, 3],
        20,
        stop_token_ids=[3],
        check=check_stop_inside(3, 4),
    ),
    Scenario(
        "stop_bonus",
        "stop token 5 as a step's bonus token, after 2 accepted proposals",
        lambda: tiny_pair(54, vocab=8),
        [0, 1, 2, 3],
        20,
        stop_token_ids=[5],
        check=check_stop_bonus(5, 4),
    ),
    Scenario(
        "stop_first",
        "stop token 6 as the first generated token (the prefill's): no decode step at all",
        lambda: tiny_pair(54, vocab=8),
        [0, 1, 2, 3],
        20,
        stop_token_ids=[6],
        check=_check_stop_first,
    ),
    Scenario(
        "long_context",
        "a 4100-token prompt, rope θ = 1e6: every draft position past 4096",
        lambda: tiny_pair(21, vocab=8, positions=8192, rope_theta=1e6),
        LONG_PROMPT,
        8,
        check=_check_long,
    ),
    Scenario(
        "bf16",
        "the multiround shapes in bfloat16 (weights and compute), with a seed whose every decision keeps "
        "a margin over bf16 rounding (golden.py: the manifest's margins), so a correct bf16 port that rounds "
        "otherwise cannot flip a token",
        lambda: tiny_pair(170),
        [0, 1, 2, 3],
        12,
        dtype="bfloat16",
    ),
    Scenario(
        "window_symmetric",
        "draft layer 0 a symmetric window of 2 (is_causal false, the reading of "
        "transformers' flash-attention path): a query sees keys with |q − k| < 2, in its block too",
        lambda: tiny_pair(
            3, vocab=8, layer_types=["sliding_attention", "full_attention"], sliding_window=2, is_causal=False
        ),
        [1, 2, 3, 4, 5, 6, 0],
        10,
        check=_check_symmetric,
    ),
    Scenario(
        "window_rotating",
        "draft layer 0 a rotating window of 3 (sliding_window_kind 'rotating', the "
        "official MLX backend's reading): context keys with q − k < 3, every block key k ≤ q (of 4)",
        lambda: tiny_pair(
            3,
            vocab=8,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=3,
            sliding_window_kind="rotating",
        ),
        [1, 2, 3, 4, 5, 6, 0],
        10,
        check=_check_rotating,
    ),
    Scenario(
        "rope_yarn",
        "target and draft with YaRN RoPE (factor 4 over 32 original positions, cos and sin "
        "scaled by its attention factor), a 40-token prompt; configs spelled as released checkpoints: "
        "rope_theta + rope_scaling only",
        lambda: tiny_pair(7, vocab=8, rope_scaling=YARN),
        LONGER_THAN_32,
        10,
        rope_spelling="rope_scaling",
        check=_check_long_prompt,
    ),
    Scenario(
        "rope_linear",
        "target and draft with linear RoPE scaling (factor 2), a 40-token prompt; configs "
        "spelled as transformers 5 writes them: rope_parameters only",
        lambda: tiny_pair(7, vocab=8, rope_scaling={"rope_type": "linear", "factor": 2.0}),
        LONGER_THAN_32,
        10,
        rope_spelling="rope_parameters",
        check=_check_long_prompt,
    ),
    Scenario(
        "dflash2",
        "a DFlash 2 draft: a dynamic causal convolution (K = 2, groups of 4) before and after every "
        "sublayer, the candidate selector (top 3 of 8 candidates, rank 4) choosing the proposals",
        lambda: tiny_pair(
            12, vocab=8, version=2, conv_kernel_size=2, conv_group_size=4, selector_rank=4, selector_top_k=3
        ),
        [1, 2, 3, 4, 5],
        12,
        check=_check_dflash2,
    ),
    Scenario(
        "hybrid_target",
        "a Qwen3.5-style hybrid target (Gated DeltaNet layers 0-2, gated attention layer 3): "
        "after every step's crop each linear layer's conv window and recurrent state over the committed tokens "
        "alone (a crop-only rollback keeps the rejected tokens in S), and the next step's posterior from them",
        lambda: hybrid_pair(4),
        [1, 2, 3, 4, 5],
        16,
        check=_check_hybrid,
    ),
    Scenario(
        "muse_glimmer",
        "transformers' own DFlash drafter: the walkthrough's target and trained toy draft, the draft folder a Muse "
        "Glimmer assistant's (its names, its config) with Muse's default attention, every layer windowed "
        "|q − k| ≤ 2048 both ways (no key leaves it here); accepted, partial and rejected steps",
        lambda: muse_pair([2048, 2048]),
        encode("a cat sat")[0].tolist(),
        12,
        tokens=list(VOCAB),
        draft_format=MODEL_TYPE,
    ),
    Scenario(
        "muse_glimmer_window",
        "the same draft as a Muse folder with layer 0 windowed |q − k| ≤ 2 both ways (DFlash's symmetric window "
        "of 3) and layer 1 full attention, a 6-token prompt: the window leaves out context keys and block keys",
        lambda: muse_pair([2, None]),
        encode("the dog ran to the park")[0].tolist(),
        12,
        tokens=list(VOCAB),
        draft_format=MODEL_TYPE,
    ),
]
