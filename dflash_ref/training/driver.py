"""The training driver behind `python -m dflash_ref train` (cli/train.py, its options and nothing more): self-distil
data from SmolLM2 (or `--target DIR`, any transformers chat model: loading/chat.py) on the prompts written in
training/prompts.py (`--prompt-set varied`: training/varied_prompts.py; or `--prompts-file`:
training/prompt_file.py), train a draft (`--version 2`: a DFlash 2 draft, training/dflash2_options.py) with the
paper's recipe (training/recipe.py), save official-format checkpoints, resume, and plot the loss and the acceptance
per block position on held-out prompts.

    out/data.jsonl           the target's own responses (resumable, training/distill.py)
    out/draft/               the draft, official format (config.json + model.safetensors), fp32, and
                             draft_vocab.json (not with --full-vocab): the training responses' tokens,
                             what it proposes among (extensions/draft_vocab.py); the held-out evaluation uses it
    out/draft-bf16/          the same in bf16 at the end, draft_vocab.json too (what ships as drafts/smollm2)
    out/optimizer.safetensors, out/state.json    AdamW moments, step, losses, the batch generator:
                             `--resume` continues exactly (training/state.py)
    out/train_config.json    every option of the run (training/options.py): what --resume holds it to, and
                             a file --config can start another run from
    figures/training/training.png    loss curve and held-out acceptance per block position (--figures)
    out/eval.json                    held-out tokens per step and acceptance per block position, and the same
                                     on the hand-written held-out styles ("heldout_styles", --eval-styles)
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from matplotlib.figure import Figure

from ..drafts.checkpoint import save_draft
from ..loading.chat import open_chat_target
from ..loading.folder import check_target_name
from ..loading.smollm2 import longest_chat_prompt
from ..trace.plots import save_figure
from . import distill
from . import options as train_options
from .dflash2_modules import proposing_by_argmax
from .dflash2_options import target_widths
from .features import target_features_batched
from .heldout_styles import heldout_styles
from .measure import acceptance_by_position, fractions, number
from .prompt_file import heldout_prompts, style_prompts, training_prompts
from .recipe import loss_weights, make_optimizer, sample_anchors, train_step
from .replay import find_errors, replay_batch
from .sampled_softmax import sampled_vocabulary, training_vocabulary
from .soft_labels import TOP_K, restrict_to_vocab
from .state import (
    batch_generator,
    read_moments,
    read_state,
    replay_errors,
    resume_optimizer,
    run_draft,
    save_state,
)


def progress(step: int, total: int, loss: float, seconds: float) -> str:
    """One progress-bar line: [#####.....] step/total, loss, elapsed and estimated remaining time."""
    filled = round(20 * step / total)
    eta = seconds / max(step, 1) * (total - step)
    return (
        f"[{'#' * filled}{'.' * (20 - filled)}] step {step}/{total}  loss {loss:.3f}  "
        f"{seconds / 60:.1f} min, ~{eta / 60:.1f} min left"
    )


def block_weights(block_size: int, gamma: float | None) -> torch.Tensor:
    """The loss weights w_k for the block size and γ; ValueError for a block size that cannot be
    trained or has no γ (checked before any work: `check_options`)."""
    # γ: the paper's for blocks 8, 10, 16; it trains no block 4, for which we take γ = 4 as for block 8.
    # γ = 1 was measured against it (figures/training/levers.md): better after 1000 steps, no better in a
    # whole from-scratch run (held-out τ + 1 = 1.648 against 1.659), so the default stays.
    return loss_weights(block_size, gamma if gamma is not None else {4: 4.0}.get(block_size))


def check_options(options: dict) -> dict:
    """`options.check_values` with the run's prompt counts (its prompt files' or the written ones) and the
    target's widths (for DFlash 2's sizes), the block's loss weights, the --target named and held-out
    prompts that are trained on: everything that can be refused before the target is loaded (`__main__`
    makes it a usage error)."""
    train_options.check_values(
        options,
        heldout_prompts=len(heldout_prompts(options)),
        training_prompts=len(training_prompts(options)),
        style_prompts=len(heldout_styles()),
        widths=target_widths(options["target"]),
    )
    block_weights(options["block_size"], options["gamma"])
    check_target_name(options["target"])
    trained = set(training_prompts(options)[: options["prompts"]])
    for name, count, held in (
        ("held-out", options["eval_prompts"], heldout_prompts(options)[: options["eval_prompts"]]),
        ("--eval-styles", options["eval_styles"], style_prompts(options)),
    ):
        shared = [p for p in held if p in trained]
        if shared:  # the evaluation would not be held out
            raise train_options.TrainOptionError(
                f"{len(shared)} of the {count} {name} prompts are also training "
                f"prompts, e.g. {shared[0]!r}: hold them out"
            )
    return options


def check_lengths(options: dict, tokenizer, max_positions: int) -> None:
    """--max-new-tokens after the longest training prompt used, and --eval-tokens after the longest
    held-out one, must fit the target's positions; refused once the target is loaded, before any distilling
    (an --eval-tokens too long would otherwise fail only after training)."""
    for key, name, prompt_list in (
        ("max_new_tokens", "training", training_prompts(options)[: options["prompts"]]),
        ("eval_tokens", "held-out", heldout_prompts(options)[: options["eval_prompts"]] + style_prompts(options)),
    ):
        longest = longest_chat_prompt(tokenizer, prompt_list)
        if longest + options[key] > max_positions:
            raise SystemExit(
                f"{train_options.flag(key)} {options[key]}: the longest {name} prompt ({longest} tokens) "
                f"+ {options[key]} exceeds the target's {max_positions} positions; at most "
                f"{max_positions - longest}"
            )


def run(args, say=print) -> int:
    """The whole run (the module's docstring), `args` the checked options (`check_options`) with `out` and
    `resume`; `say` each line of progress. The command line makes --out and --figures before calling it."""
    out, figures = Path(args.out), Path(args.figures)
    out.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    chat = open_chat_target(args.target)
    target, tokenizer, stop = chat.model, chat.tokenizer, chat.stop_token_ids
    check_lengths(vars(args), tokenizer, target.config.max_position_embeddings)
    state = read_state(out) if args.resume else {"step": 0, "losses": [], "seconds": 0.0}
    draft = run_draft(out, args, chat)  # before distilling: a checkpoint or --init that cannot work is
    moments = read_moments(out, draft) if args.resume else None  # refused in seconds, not after the data
    # the responses come from a bf16 copy of the target by default (faster with bf16 instructions); features and
    # evaluation use the fp32 target that inference uses
    generator = chat.copy_in(torch.bfloat16) if args.distill_dtype == "bf16" else target
    try:
        rows = distill.self_distill(
            generator,
            tokenizer,
            training_prompts(vars(args))[: args.prompts],
            out / "data.jsonl",
            args.max_new_tokens,
            batch_size=args.distill_batch,
            stop_token_ids=stop,
            say=say,
        )
    except distill.DataFileError as e:
        raise SystemExit(str(e)) from None
    rows = [r for r in rows if len(r["ids"]) - r["prompt_len"] >= args.block_size + 1]
    if not rows:
        raise SystemExit(
            f"none of the {args.prompts} responses has the {args.block_size + 1} tokens that training "
            f"with blocks of {args.block_size} keeps; distil more prompts"
        )
    # the run's options, once the data and (on a resume) the draft were found to fit them: a refused
    # resume leaves the saved options as they were
    train_options.save(out, vars(args))
    draft.train()
    # a draft trained before (--init DRAFT, --resume) keeps the tokens it was trained to propose
    kept = [] if draft.draft_vocab is None else draft.draft_vocab.tolist()
    vocab = (
        None if args.full_vocab else training_vocabulary([r["ids"][r["prompt_len"] :] for r in rows], [*stop, *kept])
    )
    # proposals over R only at inference (extensions/draft_vocab.py): the loss never had another token as a label
    draft.draft_vocab = vocab
    if vocab is not None and args.version == 2 and len(vocab) + args.negatives < args.selector_top_k:
        raise SystemExit(
            f"--selector-top-k {args.selector_top_k}: the loss's softmax runs over {len(vocab)} response "
            f"tokens + {args.negatives} sampled, fewer than the candidates; lower it or raise --negatives"
        )
    t0 = time.perf_counter()
    data = [(r["prompt_len"], torch.tensor([r["ids"]])) for r in rows]
    feats, soft = target_features_batched(
        target, [ids for _, ids in data], draft.target_layer_ids, say=say, top_k=TOP_K if args.soft_labels else 0
    )
    # soft labels (--soft-labels): the target's distribution at every position, over the loss's R
    carried = [()] * len(data) if soft is None else [(restrict_to_vocab(*top, vocab),) for top in soft]
    say(
        f"{len(data)} sequences ({sum(ids.shape[1] - n for n, ids in data)} response tokens), loss softmax over "
        f"{'all tokens' if vocab is None else f'{len(vocab)} response tokens + {args.negatives} sampled'}, "
        f"features in {time.perf_counter() - t0:.0f} s"
    )
    step, losses, seconds = state["step"], state["losses"], state.get("seconds", 0.0)
    # the warmup the run started with (5 % of its --steps then), also when a resume raises --steps (runs
    # from before state.json kept it: 5 % of the --steps given now)
    warmup_steps = state.get("warmup_steps", max(1, args.steps // 20))
    optimizer, schedule = make_optimizer(draft, args.lr, args.steps, warmup_steps)
    if args.resume:
        resume_optimizer(moments, draft, optimizer, schedule, step)
    weights, g = block_weights(args.block_size, args.gamma), batch_generator(state, args.seed)
    errors = replay_errors(state)  # --replay: the draft's errors last found (training/replay.py)
    argmax_only = args.modules == "conv"  # the convolutions' draft alone: no selector shaping or proposing
    t0 = time.perf_counter() - seconds
    while step < args.steps:
        if args.replay and step % args.replay_every == 0 and step > 0:
            with proposing_by_argmax(draft, argmax_only):  # its errors as its evaluation proposes
                errors = find_errors(draft, target, data, feats, args.replay_sequences, g)
        replayed = (
            replay_batch(errors, data, args.batch, args.replay, args.anchors, args.block_size, g) if args.replay else []
        )
        picks = torch.randint(len(data), (args.batch - len(replayed),), generator=g).tolist()
        batch = [(data[i][1], feats[i], anchors, *carried[i]) for i, anchors in replayed] + [
            (
                data[i][1],
                feats[i],
                sample_anchors(data[i][0], data[i][1].shape[1], args.block_size, args.anchors, g),
                *carried[i],
            )
            for i in picks
        ]
        ids, log_weight = (
            (None, None) if vocab is None else sampled_vocabulary(vocab, target.config.vocab_size, args.negatives, g)
        )
        losses.append(
            train_step(
                draft,
                target,
                batch,
                weights,
                optimizer,
                schedule,
                vocab=ids,
                vocab_log_weight=log_weight,
                bf16=args.train_dtype == "bf16",
                selector_detached=argmax_only,
                soft_weight=args.soft_labels,
            )
        )
        step += 1
        if step % 25 == 0 or step == args.steps:
            recent = losses[-50:]
            say(progress(step, args.steps, sum(recent) / len(recent), time.perf_counter() - t0))
        if step % args.save_every == 0 or step == args.steps:
            save_state(out, draft.eval(), optimizer, g, step, warmup_steps, losses, time.perf_counter() - t0, errors)
            draft.train()
    draft.eval()
    save_draft(draft, out / "draft-bf16", torch.bfloat16)  # what ships: official format, bf16
    say(f"trained {step} steps in {(time.perf_counter() - t0) / 60:.1f} min; bf16 draft in {out / 'draft-bf16'}")
    heldout = heldout_prompts(vars(args))[: args.eval_prompts]
    styles = {"prompts": style_prompts(vars(args)), "tokens_per_step": None, "acceptance_by_position": None}
    with proposing_by_argmax(draft, argmax_only):
        by_position, tokens_per_step = acceptance_by_position(draft, target, tokenizer, heldout, args.eval_tokens, stop)
        say(
            f"held-out: mean tokens per step {number(tokens_per_step, 2)}; acceptance by block position "
            f"{fractions(by_position, 2)}"
        )
        if styles["prompts"]:  # the hand-written prompts in styles no training prompt has
            styles["acceptance_by_position"], styles["tokens_per_step"] = acceptance_by_position(
                draft, target, tokenizer, styles["prompts"], args.eval_tokens, stop
            )
            say(
                f"held-out styles: mean tokens per step {number(styles['tokens_per_step'], 2)}; acceptance by block "
                f"position {fractions(styles['acceptance_by_position'], 2)}"
            )
    save_figure(_curves(losses, by_position, styles["acceptance_by_position"]), figures / "training.png")
    total = time.perf_counter() - started
    (out / "eval.json").write_text(
        json.dumps(
            {
                "tokens_per_step": tokens_per_step,
                "acceptance_by_position": by_position,
                "eval_prompts": heldout,
                "heldout_styles": styles,
                "proposals": "argmax" if argmax_only else "draft",
                "this_run_minutes": round(total / 60, 1),
                "config": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))},
            },
            indent=1,
        )
        + "\n"
    )
    say(f"done in {total / 60:.1f} min")
    return 0


def _curves(losses, by_position, by_position_styles=None):
    fig = Figure(figsize=(9, 3))
    a, b = fig.subplots(1, 2)
    smooth = [sum(losses[max(0, i - 49) : i + 1]) / len(losses[max(0, i - 49) : i + 1]) for i in range(len(losses))]
    a.plot(smooth)
    a.set_xlabel("step")
    a.set_ylabel("weighted CE (50-step mean)")
    a.set_yscale("log")
    sets = [("held-out topics", by_position)]
    if by_position_styles:
        sets.append(("held-out styles", by_position_styles))
    width = 0.8 / len(sets)
    for i, (label, fractions_k) in enumerate(sets):
        b.bar(
            [k + 1 + (i - (len(sets) - 1) / 2) * width for k in range(len(fractions_k))],
            [math.nan if a is None else a for a in fractions_k],
            width,
            label=label,
        )
    if len(sets) > 1:
        b.legend()
    b.set_xlabel("block position k")
    b.set_ylabel("accepted fraction (held-out)")
    fig.tight_layout()
    return fig
