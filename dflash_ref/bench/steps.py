"""`python -m dflash_ref bench steps` (harness and reporting: cli/bench.py): what one decoding step
costs on this machine, SmolLM2-135M fp32, 128 positions cached:

    t_q       one target forward of q new tokens: q = 1 is an AR step, q = b a verify of a block of b
    bound     the bytes of the weights one forward reads / the stream bandwidth (the probe's):
              no forward of few tokens can take less; t_1 / bound says how near an AR step is
    t_draft   one draft pass of a block of b and its b − 1 proposals through the lm_head

Four forwards on the same weight tensors: the model as transformers makes it (nn.Linear), HFTarget
(transformers' forward behind the target protocol, loading/hf.py), the project's own Llama target
(target/llama.py, what decoding runs on), and that target with the opt-in fast CPU path
(fast_cpu/). `own / HFTarget` is what the own forward saves; `verify / AR step` is t_b / t_1,
the number that decides what a block costs; its paired form is the median of each repeat's t_b / t_1
(timing.paired_ratio), which a noisy machine sways less.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from ..drafts.folder import SHIPPED_DFLASH1, open_draft
from ..drafts.random_draft import random_smollm2_draft
from ..extensions.draft_vocab import DraftVocab
from ..fast_cpu import use_fast_cpu
from ..fast_cpu.plan import plans
from ..loading.smollm2 import load_smollm2, load_smollm2_own
from ..target.llama import from_transformers
from .baselines import transformers_twin
from .suite import _draft_pass
from .timing import measure, paired_ratio

QS, CACHED = (1, 2, 3, 4, 8, 16), 128
FORWARDS = ("transformers", "HFTarget", "own", "own --fast-cpu")


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the nn.Linear weights one forward reads (a tied lm_head once: it is one tensor)."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(w.numel() * w.element_size() for w in weights.values())


def stream_bandwidth(repeats: int = 9) -> float:
    """Bytes per second this machine reads an fp32 weight at: W.sum() of a (49152, 576) matrix (113 MB,
    larger than the caches), the fastest of `repeats`; a product cannot read W faster. (The probe in
    the tables' footers, W by 2 contiguous columns, is a product, slower here than this read.)"""
    weight = torch.randn(49152, 576)
    seconds = min(measure({"read": weight.sum}, repeats)["read"])
    return weight.numel() * 4 / seconds


def bench_steps(repeats: int, out: Path, progress) -> dict:
    """t_q by forward (FORWARDS); t_draft of a random 3-layer draft (proposals over all V) and of the
    shipped 2-layer DFlash 1 one (over its vocabulary); the fast path's plans measured meanwhile."""
    adapter, _ = load_smollm2()  # HFTarget: transformers' forward
    target, _ = load_smollm2_own()  # the own Llama target (target/llama.py), the same weights
    twin = transformers_twin(adapter.model)
    fast = use_fast_cpu(from_transformers(twin))  # the own target again, on the fast path, the same weights
    g = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    prompt = torch.randint(0, vocab, (1, CACHED), generator=g)
    own = {"own": target, "own --fast-cpu": fast}
    caches = {"HFTarget": adapter.make_cache(), **{name: model.make_cache() for name, model in own.items()}}
    with torch.inference_mode():
        adapter(prompt, past_key_values=caches["HFTarget"], output_hidden_states=False)
        for name, model in own.items():
            model(prompt, past_key_values=caches[name], output_hidden_states=False)
    blocks = {q: torch.randint(0, vocab, (1, q), generator=g) for q in QS}

    def forward(q, name):
        with torch.inference_mode():
            if name == "transformers":  # the twin on the adapter's transformers cache
                twin(blocks[q], past_key_values=caches["HFTarget"].cache, use_cache=True)
                caches["HFTarget"].crop(CACHED)
            elif name == "HFTarget":
                adapter(blocks[q], past_key_values=caches["HFTarget"], output_hidden_states=q > 1)
                caches["HFTarget"].crop(CACHED)
            else:
                own[name](blocks[q], past_key_values=caches[name], output_hidden_states=q > 1)
                caches[name].crop(CACHED)

    variants = {(q, name): (lambda q=q, name=name: forward(q, name)) for q in QS for name in FORWARDS}
    raw = measure(variants, repeats, progress=progress)
    t = {k: statistics.median(v) for k, v in raw.items()}
    bound = weight_bytes(adapter.model) / stream_bandwidth()
    steps = [
        {
            "tokens q": q,
            **{f"{name} (ms)": 1e3 * t[q, name] for name in FORWARDS},
            "own / HFTarget (paired)": paired_ratio(raw[q, "own"], raw[q, "HFTarget"]),
            "own / transformers' AR step": t[q, "own"] / t[1, "transformers"],
            "verify / AR step (own, paired)": paired_ratio(raw[q, "own"], raw[1, "own"]),
            "--fast-cpu / own (paired)": paired_ratio(raw[q, "own --fast-cpu"], raw[q, "own"]),
            "verify / AR step (--fast-cpu, paired)": paired_ratio(raw[q, "own --fast-cpu"], raw[1, "own --fast-cpu"]),
            "own / bandwidth bound": t[q, "own"] / bound,
            "bound (ms)": 1e3 * bound,
        }
        for q in QS
    ]
    return {
        f"steps · SmolLM2-135M fp32, one forward of q tokens after {CACHED} cached": steps,
        "draft passes with their proposals (plain nn.Linear)": _draft_rows(target, t[1, "own"], repeats, progress),
        "--fast-cpu: the linear plan measured (µs per product, weights cold)": plans(),
    }


def _draft_rows(target, t_step: float, repeats: int, progress) -> list[dict]:
    """t_draft at b = 2, 3, 4, 8, 16: a pass (4 new context positions, 256 cached) and its γ = b − 1
    proposals' lm_head, for a random 3-layer draft over all V and the shipped DFlash 1 draft over its vocabulary."""
    shipped, _ = open_draft(SHIPPED_DFLASH1)
    drafts = {
        "random 3-layer, all V": (random_smollm2_draft(target, 3, 16), target.output_head),
        "shipped 2-layer, its vocabulary": (shipped, DraftVocab(target, shipped.draft_vocab)),
    }
    d, context = target.config.hidden_size, 256
    caches = {name: dr.make_cache() for name, (dr, _) in drafts.items()}
    with torch.inference_mode():
        for name, (dr, _) in drafts.items():
            _draft_pass(dr, d, context, 1, caches[name], context)
            caches[name].crop(context)
    rows = []
    for b in (2, 3, 4, 8, 16):
        hidden = torch.randn(1, b - 1, d)  # (1, γ, d)
        variants = {}
        for name, (dr, head) in drafts.items():

            def draft_pass(dr=dr, cache=caches[name], b=b):
                with torch.inference_mode():
                    _draft_pass(dr, d, 4, b, cache, context + 4)
                    cache.crop(context)

            def logits(head=head, hidden=hidden):
                with torch.inference_mode():
                    head(hidden)

            variants[name, "pass"], variants[name, "head"] = draft_pass, logits
        t = {k: statistics.median(v) for k, v in measure(variants, repeats, progress=progress).items()}
        row = {"block size b": b}
        for name in drafts:
            row.update(
                {
                    f"{name}: pass (ms)": 1e3 * t[name, "pass"],
                    f"{name}: lm_head (ms)": 1e3 * t[name, "head"],
                    f"{name}: t_draft / AR step": (t[name, "pass"] + t[name, "head"]) / t_step,
                }
            )
        rows.append(row)
    return rows
