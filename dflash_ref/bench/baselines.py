"""`python -m dflash_ref bench baselines` and `bench dflash2` (harness and reporting: cli/bench.py).

baselines: SmolLM2-135M-Instruct (fp32, greedy) decoded by transformers' own `model.generate`, the
honest baseline, on a twin of the model as transformers makes it (plain nn.Linear, the same weight
tensors); by dflash_ref's AR `generate` on its own Llama target (plain, then with the opt-in fast CPU
path, fast_cpu/); by the official `dflash_generate` (`dflash` 0.1.0, `from dflash import
model`, its own draft class loaded from the shipped DFlash 1 draft's folder, the target as transformers
made it); and by dflash_ref's `spec_generate` with the same draft: over all V as the official loop,
in the draft's own vocabulary (extensions/draft_vocab.py), plain and fast, and with the verify gate
(extensions/verify_gate.py) at bench trained's θ. All on the same weights, interleaved over the repeats,
every output checked token-identical to dflash_ref's AR before anything is timed; the ratios are over
transformers' generate.

dflash2: one DFlash 2 draft pass (the convolution around every sublayer, then the candidate
selector) against one DFlash 1 pass of the same size, at blocks 4 and 16, and the selector's
sequential walk alone.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ..decoding import generate, spec_generate
from ..drafts.folder import SHIPPED_DFLASH1, open_draft
from ..drafts.random_draft import random_smollm2_draft
from ..extensions import DraftVocab, VerifyGate
from ..fast_cpu import use_fast_cpu
from ..fast_cpu.plan import plans
from ..loading.grouped_attention import SDPA_GROUPED
from ..loading.smollm2 import STOP_TOKEN_IDS, chat_ids, load_smollm2, load_smollm2_own
from ..target.llama import from_transformers
from ..training.prompt_sets import split_prompts
from .suite import _draft_pass
from .timing import measure, summarise

PROMPTS, NEW_TOKENS = 8, 64  # the first 8 hand-written held-out prompts: 8 styles no training prompt has
VERIFY_GATE = 0.5  # extensions/verify_gate.py's θ, chosen on held-out prompts 9…24 (figures/bench/README.md)


@contextlib.contextmanager
def official_timer():
    """dflash 0.1.0 times with torch.cuda.synchronize() even on a CPU: perf_counter instead, meanwhile."""
    from dflash import model as official

    timer, official._cuda_time = official._cuda_time, time.perf_counter
    try:
        yield official
    finally:
        official._cuda_time = timer


def transformers_twin(model):
    """The same transformers model as transformers makes it (sdpa attention: HFTarget switched the
    original's to its grouped form), on the original's very weight tensors and buffers: no copy of the
    weights. Its config is a copy, so that the original keeps its own attention."""
    config = copy.deepcopy(model.config)
    if config._attn_implementation == SDPA_GROUPED:
        config._attn_implementation = "sdpa"
    with torch.device("meta"):
        twin = type(model)(config)
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in tensors:  # a tied weight: one tensor, two names
        module, _, leaf = name.rpartition(".")
        setattr(twin.get_submodule(module), leaf, tensor)
    twin.generation_config = model.generation_config
    return twin.eval()


def hf_generate(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' own greedy decoding: (1, L) → (1, L + up to n), stopping after a stop token."""
    return model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        eos_token_id=STOP_TOKEN_IDS,
        pad_token_id=STOP_TOKEN_IDS[0],
    )


def bench_baselines(repeats: int, out: Path, progress) -> dict:
    """The decoders above on PROMPTS hand-written held-out prompts (training/heldout_styles.py), NEW_TOKENS
    tokens each: seconds, the ratio to transformers' generate, speed (its time / theirs), τ + 1
    (tokens per target pass), identical output."""
    target, tokenizer = load_smollm2_own()  # the own Llama target (target/llama.py)
    model = transformers_twin(load_smollm2()[0].model)
    draft, _ = open_draft(SHIPPED_DFLASH1, proposing=True)  # the official DFlashDraftModel's kind
    with official_timer() as official:
        zlab = official.DFlashDraftModel.from_pretrained(SHIPPED_DFLASH1, dtype=torch.float32).eval()
    vocabulary = DraftVocab(target, draft.draft_vocab)  # the shipped draft's own (draft_vocab.json)
    # the fast CPU path on models of their own (the target on the same weight tensors), switched once
    fast = {"target": use_fast_cpu(from_transformers(model)), "draft": use_fast_cpu(copy.deepcopy(draft))}
    fast["vocabulary"] = use_fast_cpu(DraftVocab(fast["target"], draft.draft_vocab))
    plain = {"target": target, "draft": draft, "vocabulary": vocabulary}
    gate = VerifyGate(VERIFY_GATE)
    inputs = [chat_ids(tokenizer, p) for p in split_prompts("heldout-styles")[:PROMPTS]]
    b, n = draft.block_size, NEW_TOKENS

    def transformers_generate(ids):
        with torch.inference_mode():
            return hf_generate(model, ids, n), None

    def official_generate(ids):
        with official_timer() as official:
            stats = official.dflash_generate(zlab, model, ids, n, STOP_TOKEN_IDS, return_stats=True)
        return stats.output_ids, sum(stats.acceptance_lengths) / len(stats.acceptance_lengths)

    def ours(models: dict, extensions=None):
        """dflash_ref on these models: AR without extensions (None), else speculative with them."""

        def decode(ids):
            if extensions is None:
                return _ours(generate(models["target"], ids, n, STOP_TOKEN_IDS))
            chosen = [models["vocabulary"] if e is vocabulary else e for e in extensions]
            return _ours(spec_generate(models["draft"], models["target"], ids, n, STOP_TOKEN_IDS, extensions=chosen))

        return decode

    spec = f"dflash_ref spec_generate, shipped draft b={b}"
    decoders = {
        "transformers generate (nn.Linear)": transformers_generate,
        "dflash_ref generate (AR)": ours(plain),
        "dflash_ref generate (AR), --fast-cpu": ours(fast),
        f"official dflash_generate, shipped draft b={b} (all V)": official_generate,
        f"{spec} (all V)": ours(plain, []),
        f"{spec} (its vocabulary)": ours(plain, [vocabulary]),
        f"{spec} (its vocabulary), --fast-cpu": ours(fast, [vocabulary]),
        f"{spec} (its vocabulary, verify gate θ={VERIFY_GATE}), --fast-cpu": ours(fast, [vocabulary, gate]),
    }
    expected = [generate(target, ids, n, STOP_TOKEN_IDS).output_ids for ids in inputs]
    taus = {}
    for name, decode in decoders.items():  # one untimed pass: τ + 1 and the lossless check
        results = [decode(ids) for ids in inputs]
        if not all(torch.equal(o, e) for (o, _), e in zip(results, expected)):
            raise AssertionError(f"{name}: output differs from dflash_ref's AR (not token-identical)")
        taus[name] = sum(t or 1.0 for _, t in results) / len(results)
    progress("every output equals dflash_ref's AR; timing")
    rows = summarise(measure(over_inputs(decoders, inputs), repeats, progress=progress), next(iter(decoders)))
    for row in rows:
        row.update(
            {
                "speed vs transformers generate": 1 / row["ratio"],
                "τ + 1 (tokens/step)": taus[row["variant"]],
                "identical output": True,
            }
        )
    return {
        f"baselines · SmolLM2-135M fp32, {PROMPTS} hand-written held-out prompts, {n} tokens, greedy": rows,
        "--fast-cpu: the linear plan measured meanwhile (µs per product, weights cold)": plans(),
    }


def over_inputs(decoders: dict[str, Callable], inputs: list[torch.Tensor]) -> dict[str, Callable[[], list]]:
    """name → a call running that decoder over every input: what `measure` times, one variant per decoder
    (each lambda binds its own decoder: one that took the loop's variable would time the last one)."""
    return {name: (lambda decode=decode: [decode(ids) for ids in inputs]) for name, decode in decoders.items()}


def _ours(result) -> tuple[torch.Tensor, float | None]:
    """(output ids, tokens per target pass or None for AR) of a dflash_ref GenerationOutput."""
    return result.output_ids, (result.mean_tokens_per_step if result.num_draft_passes else None)


def bench_dflash2(repeats: int, out: Path, progress) -> dict:
    """One draft pass with its proposals, DFlash 2 (K = 4 taps in groups of 64; top 8 of 49152, rank
    32) against DFlash 1, both 3 SmolLM2-sized layers with 256 cached context positions, at blocks 4
    and 16; and the selector alone, fed logits already cut to its K candidates (so that what is
    left is its sequential walk, x_t chosen after x_{t−1}, and the small projection P h)."""
    target, _ = load_smollm2()
    drafts = {
        1: random_smollm2_draft(target, 3, 16),
        2: random_smollm2_draft(
            target, 3, 16, version=2, conv_kernel_size=4, conv_group_size=64, selector_rank=32, selector_top_k=8
        ),
    }
    d, context, rows = target.config.hidden_size, 256, []
    caches = {v: dr.make_cache() for v, dr in drafts.items()}
    with torch.inference_mode():
        for v, dr in drafts.items():
            _draft_pass(dr, d, context, 1, caches[v], context)
            caches[v].crop(context)
    selector = drafts[2].candidate_selector
    for b in (4, 16):
        hidden, anchor = torch.randn(1, b - 1, d), torch.tensor([5])

        def proposals(v, b=b, anchor=anchor):
            with torch.inference_mode():
                dr = drafts[v]
                h = dr(
                    torch.arange(context - 4, context + b)[None],
                    noise_embedding=torch.randn(1, b, d),
                    target_hidden=torch.randn(1, 4, len(dr.target_layer_ids) * d),
                    past_key_values=caches[v],
                )[:, 1:]  # (1, γ, d)
                caches[v].crop(context)
                logits = dr.compute_logits(h, target.output_head)  # (1, γ, V)
                return dr.choose_tokens(h, logits, anchor, 0.0, 1.0, 0)  # the argmax, or DFlash 2's greedy path

        def walk(hidden=hidden, anchor=anchor):
            with torch.inference_mode():
                return selector.select(hidden, torch.randn(1, hidden.shape[1], selector.top_k), anchor, 0.0)

        times = summarise(
            measure(
                {"DFlash 1": lambda: proposals(1), "DFlash 2": lambda: proposals(2), "selector walk": walk},
                repeats,
                progress=progress,
            ),
            "DFlash 1",
        )
        ms = {r["variant"]: 1e3 * r["median_s"] for r in times}
        rows.append(
            {
                "block size": b,
                "DFlash 1 pass + lm_head + argmax (ms)": ms["DFlash 1"],
                "DFlash 2 pass + lm_head + selector (ms)": ms["DFlash 2"],
                "DFlash 2 / DFlash 1": ms["DFlash 2"] / ms["DFlash 1"],
                "selector's sequential walk alone (ms)": ms["selector walk"],
            }
        )
    return {"dflash2 · SmolLM2-sized 3-layer drafts, 256 cached context, proposals included": rows}
