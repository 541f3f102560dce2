"""The sampling bundles: a vocabulary of 4 tokens, 3 new tokens, block 3, temperature 1.5, a DFlash 1
draft (`sampling`) and a DFlash 2 draft choosing among 2 of the 4 tokens (`sampling_dflash2`), with
their exact distributions (sampling.py), enumerated with the reference in float64 from the stored
weights; and the samplers of the shipped implementations (the reference, both verifiers; `dflash` 0.1.0).
An engine takes neither (no tokenizer, head_dim 4): `engine_sampling` (golden --engines) has engine shapes,
SmolLM2's 49152 tokens, of which its models (engine_scenarios.sampling_pair) give all but 6 a probability
below NEGLECT together; its outputs are enumerated over those 6, the rest one bin ("other", its exact mass).

    P(x_1 x_2 x_3) = Π_t p_T(x_t | prompt, x_<t)                   all 4³ outputs (of the 4 decoded)
    P(τ = k) of the first decode step, averaged over x_1 ~ p_T(· | prompt)         k = 0, 1, 2

With rejection, proposal d_i is kept with probability min(1, p_i(d_i) / q_i(d_i)), so P(τ ≥ 1) =
Σ_d min(p_1(d), q_1(d)) and P(τ ≥ 2) = Σ_d min(p_1(d), q_1(d)) · Σ_e min(p_2(e | d), q_2(e | d)), where
DFlash 2's q_2 is conditional on d (the selector's predecessor) and both are 0 off the candidates.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ..decoding import spec_generate
from ..dflash2 import selector_of
from ..drafts.checkpoint import load_draft, save_draft
from ..layer_sampling import extract_context_feature
from ..loading.folder import load_target
from ..target.checkpoint import save_target
from .bundle import FORMAT, Bundle, find_bundles, write_bundle_files
from .engine_scenarios import active_ids, sampling_pair, tokenizer, words  # SmolLM2's tokenizer: loaded when asked
from .port import as_port
from .ports.official import DFLASH_HINT, ZLabAdapter
from .ports.registry import resolve
from .report import NotApplicable
from .sampling import SamplingResult, judge_sampling
from .scenarios import tiny_pair

ENGINE_SAMPLING = "engine_sampling"  # engine shapes: SmolLM2's tokenizer and vocabulary, a DFlash 1 draft
NEGLECT = 1e-6  # the most probability any distribution of ENGINE_SAMPLING may put outside its 6 tokens

# 4 new tokens are decoded, the first 3 compared: so the first step's τ + 1 (at most 3) is never clipped
# by the length, and a sampler that reports tokens per step gives τ back exactly
SAMPLING = {
    "seed": 5,
    "vocab": 4,
    "input_ids": [0, 1, 2],
    "max_new_tokens": 4,
    "compared": 3,
    "block_size": 3,
    "temperature": 1.5,
    "runs": 2000,
}
DRAFTS = {
    "sampling": {},
    "sampling_dflash2": {
        "version": 2,
        "conv_kernel_size": 2,
        "conv_group_size": 4,
        "selector_rank": 4,
        "selector_top_k": 2,
    },
}  # K = 2 < V = 4
ENGINE_PROMPT = "the cat sat"  # ENGINE_SAMPLING's prompt, of its active words


def _tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in float64 (no top-p / top-k: the bundle asks for none)."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def _next_probs(target, ids: list[int], temperature: float) -> torch.Tensor:
    """p_T(· | ids) at every position: (len(ids), V), float64."""
    x = torch.tensor([ids])
    logits = target(x, torch.arange(len(ids))[None], target.make_cache(), output_hidden_states=False).logits
    return _tempered(logits, temperature)[0]


def _draft_pass(target, draft, prompt: list[int], x0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's final hidden (1, b − 1, d) and logits (1, b − 1, V) at block positions 1 … b − 1 for
    the first block [x_0, mask, …]."""
    out = target(
        torch.tensor([prompt]),
        torch.arange(len(prompt))[None],
        target.make_cache(),
        output_hidden_states=True,
        logits_to_keep=1,
    )
    context = extract_context_feature(out.hidden_states, draft.target_layer_ids)  # (1, P, k·d)
    block = torch.tensor([[x0] + [draft.mask_token_id] * (draft.block_size - 1)])  # (1, b)
    hidden = draft(
        torch.arange(len(prompt) + draft.block_size)[None],
        noise_embedding=target.embed(block),
        target_hidden=context,
        past_key_values=draft.make_cache(),
    )[:, 1:]
    return hidden, draft.compute_logits(hidden, target.output_head)


def _proposals(draft, hidden, logits, x0: int, temperature: float, first: int | None = None):
    """[(token, q)] of proposal position 1 (first None), or of position 2 after proposing `first` at 1: the
    draft's distribution over its tokens (DFlash 1: softmax(z / T) over V; DFlash 2: the selector's q over
    its candidates, walked from x_0 through `first`; it computes q in float32)."""
    selector = selector_of(draft)
    if selector is None:
        return list(enumerate(_tempered(logits[0, 0 if first is None else 1], temperature).tolist()))
    forced = []  # the candidate index chosen at position 1, if any
    choose = lambda q: torch.tensor([forced.pop(0) if forced else 0])  # noqa: E731
    _, candidates, q = selector.select(hidden, logits, torch.tensor([x0]), temperature, choose)  # (1, 2, K) each
    if first is not None:
        forced.append(candidates[0, 0].tolist().index(first))
        _, candidates, q = selector.select(hidden, logits, torch.tensor([x0]), temperature, choose)
    position = 0 if first is None else 1
    return list(zip(candidates[0, position].tolist(), q[0, position].double().tolist()))


def acceptance_distribution(
    target, draft, prompt: list[int], temperature: float, verifier: str, tokens: list[int], outside: list[float]
) -> list[float]:
    """[P(τ = 0), P(τ = 1), P(τ = 2)] of the first decode step (block 3), summed over `tokens` (every x_0 and
    proposal among them; all of the vocabulary but for ENGINE_SAMPLING): exact where they hold all the mass, else
    within 3 · max(outside), to which each distribution met adds its mass outside `tokens`."""
    keep = set(tokens)
    p0 = _next_probs(target, prompt, temperature)[-1]
    outside.append(1 - float(p0[tokens].sum()))
    at_least = np.zeros(3)
    for x0 in tokens:
        hidden, logits = _draft_pass(target, draft, prompt, x0)
        p1 = _next_probs(target, prompt + [x0], temperature)[-1]
        outside.append(1 - float(p1[tokens].sum()))
        if verifier == "rejection":
            proposals = _proposals(draft, hidden, logits, x0, temperature)
            outside.append(1 - sum(q for d, q in proposals if d in keep))
            kept = [(d, min(float(p1[d]), q)) for d, q in proposals if d in keep]
            first = sum(k for _, k in kept)
            both = 0.0
            for d, k in kept:
                p2 = _next_probs(target, prompt + [x0, d], temperature)[-1]
                then = _proposals(draft, hidden, logits, x0, temperature, d)
                outside.extend([1 - float(p2[tokens].sum()), 1 - sum(q for e, q in then if e in keep)])
                both += k * sum(min(float(p2[e]), q) for e, q in then if e in keep)
        else:  # match: greedy draft
            d1, d2 = (int(i) for i in draft.choose_tokens(hidden, logits, torch.tensor([x0]), 0.0, 1.0, 0)[0][0])
            first = float(p1[d1])
            both = first * float(_next_probs(target, prompt + [x0, d1], temperature)[-1, d2])
        at_least += float(p0[x0]) * np.array([1.0, first, both])
    return [at_least[0] - at_least[1], at_least[1] - at_least[2], at_least[2]]


def _models(name: str):
    """(target, draft, prompt, tokens) of a sampling bundle: a tiny pair over its 4 tokens, or for ENGINE_SAMPLING
    the engine-shaped pair over its 6 active tokens."""
    s = SAMPLING
    if name == ENGINE_SAMPLING:
        return (*sampling_pair(s["seed"]), words(ENGINE_PROMPT), list(active_ids()))
    target, draft = tiny_pair(s["seed"], vocab=s["vocab"], block_size=s["block_size"], **DRAFTS[name])
    return target, draft, s["input_ids"], list(range(s["vocab"]))


def write_sampling(folder: str | Path, index: int = 0, name: str = "sampling") -> Path:
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    s = SAMPLING
    target, draft, prompt, tokens = _models(name)
    save_target(target, folder / "target", torch.float32)
    save_draft(draft, folder / "draft", torch.float32)
    if name == ENGINE_SAMPLING:  # what an engine reads beside the weights
        tokenizer().save_pretrained(folder / "target")
    target, draft = load_target(folder / "target", torch.float64), load_draft(folder / "draft", torch.float64)
    t, n = s["temperature"], s["compared"]
    sequences = [list(x) for x in itertools.product(tokens, repeat=n)]
    outside: list[float] = []
    with torch.inference_mode():
        probabilities = []
        for seq in sequences:
            p = _next_probs(target, prompt + seq[:-1], t)  # (P + n − 1, V)
            probabilities.append(float(np.prod([float(p[len(prompt) - 1 + i, tok]) for i, tok in enumerate(seq)])))
        acceptance = {
            v: acceptance_distribution(target, draft, prompt, t, v, tokens, outside) for v in ("rejection", "match")
        }
    # where `tokens` are the whole vocabulary, `outside` is only float rounding (q is float32): nothing neglected
    neglected = max(0.0, *outside) if len(tokens) < target.config.vocab_size else 0.0
    if neglected > NEGLECT:
        raise ValueError(f"{name}: a distribution puts {neglected:.3g} outside its tokens (at most {NEGLECT})")
    manifest = {
        "format": FORMAT,
        "name": name,
        "kind": "sampling",
        "order": index,
        "description": "sampled decoding checked by its distribution: the exact probability of every output, "
        "and of the first step's τ for each verifier (conformance/sampling.py)"
        + ("; a DFlash 2 draft whose selector proposes 2 of the 4 tokens" if DRAFTS.get(name) else "")
        + (
            "; engine shapes (SmolLM2's tokenizer and vocabulary, a Llama target), outputs enumerated over its 6 "
            "active tokens, every other output one bin"
            if name == ENGINE_SAMPLING
            else ""
        ),
        "inputs": {
            "input_ids": prompt,
            "max_new_tokens": s["max_new_tokens"],
            "stop_token_ids": None,
            "block_size": None,
            "temperature": t,
        },
        "sampling": {
            **{k: s[k] for k in ("max_new_tokens", "compared", "temperature", "runs")},
            "input_ids": prompt,
            "vocab": target.config.vocab_size,
            "sequences": sequences,
            "probabilities": probabilities,
            "other": max(0.0, 1.0 - float(np.sum(probabilities))),  # every output with a token outside `sequences`
            "neglected": neglected,  # the acceptance's bound: exact within 3 × this
            "acceptance": acceptance,
        },
        "tensors": [],
    }
    write_bundle_files(folder, manifest, {})
    return folder


def reference_sampler(bundle: Bundle, verifier: str = "rejection"):
    """seed → (output ids, first-step τ) from the reference, seeded with torch.manual_seed(seed)."""
    target, draft = load_target(bundle.target_dir), load_draft(bundle.draft_dir)
    s, ids = bundle.manifest["sampling"], torch.tensor([bundle.manifest["sampling"]["input_ids"]])

    def sample(seed: int):
        torch.manual_seed(seed)
        out = spec_generate(draft, target, ids, s["max_new_tokens"], temperature=s["temperature"], verifier=verifier)
        return out.output_ids[0].tolist(), out.acceptance_lengths[0]

    return sample


def zlab_sampler(bundle: Bundle, verifier: str = "rejection"):
    """The official `dflash` 0.1.0 (rejection sampling only)."""
    if verifier != "rejection":
        raise ValueError("dflash 0.1.0 samples by rejection only")
    try:
        from dflash import model as official  # optional: the official package
    except ImportError:
        raise NotApplicable(DFLASH_HINT) from None
    target, draft = ZLabAdapter().load(bundle)
    s, ids = bundle.manifest["sampling"], torch.tensor([bundle.manifest["sampling"]["input_ids"]])

    def sample(seed: int):
        torch.manual_seed(seed)
        timer, official._cuda_time = official._cuda_time, time.perf_counter  # 0.1.0 syncs CUDA even on a CPU
        try:
            stats = official.dflash_generate(
                draft, target, ids, s["max_new_tokens"], None, temperature=s["temperature"], return_stats=True
            )
        finally:
            official._cuda_time = timer
        return stats.output_ids[0].tolist(), stats.acceptance_lengths[0] - 1  # it lists tokens per step, τ + 1

    return sample


SAMPLERS = {"reference": reference_sampler, "zlab": zlab_sampler}


def resolve_sampler(impl, bundle: Bundle, verifier: str):
    """ "reference" | "zlab" | "module:factory" (whose object has `sampler(bundle, verifier)`) | such an
    object | a function (bundle, verifier) → a sampler seed → (output ids, first-step τ)."""
    if isinstance(impl, str):
        if impl in SAMPLERS:
            return SAMPLERS[impl](bundle, verifier)
        impl = resolve(impl)
    if hasattr(impl, "run") or not callable(impl):  # a port: its sampler, or a greedy one's refusal
        return as_port(impl).sampler(bundle, verifier)
    return impl(bundle, verifier)


def verify_sampling(
    impl, bundle: str | Path | None = None, runs: int | None = None, verifier: str = "rejection"
) -> list[tuple[str, SamplingResult | NotApplicable]]:
    """Every sampling bundle at `bundle` against `impl`: its result, or NotApplicable where the implementation
    refuses the bundle (in its words). Default: fresh ones in a temporary folder, the tiny DFlash 1 and 2 ones, or
    for an engine (a port with `engine_shaped`) ENGINE_SAMPLING."""
    if verifier not in ("rejection", "match"):
        raise ValueError(f"unknown verifier {verifier!r}; choose rejection or match")
    if isinstance(impl, str) and impl not in SAMPLERS:
        impl = resolve(impl)
    if bundle is None:
        names = [ENGINE_SAMPLING] if (not isinstance(impl, str) and as_port(impl).engine_shaped) else list(DRAFTS)
        with tempfile.TemporaryDirectory() as folder:
            for i, name in enumerate(names):
                write_sampling(Path(folder) / f"{i:02d}_{name}", i, name)
            return verify_sampling(impl, folder, runs, verifier)
    bundles = [b for b in find_bundles(bundle) if b.manifest.get("kind") == "sampling"]
    if not bundles:
        raise ValueError(f"no sampling bundle at {bundle} (python -m dflash_ref golden --out DIR --only sampling)")
    results = []
    for b in bundles:
        try:
            sampler = resolve_sampler(impl, b, verifier)
            result = judge_sampling(b.manifest["sampling"], sampler, runs, verifier)
            result.note = getattr(sampler, "note", "")
            results.append((b.name, result))
        except NotApplicable as e:  # the engine refuses this bundle: said, neither a pass nor a failure
            results.append((b.name, e))
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001 - a crashing sampler is named, not a traceback
            raise ValueError(f"the sampler raised {type(e).__name__}: {e}") from None
    return results
