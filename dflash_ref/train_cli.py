"""`python -m dflash_ref train`: self-distil data from SmolLM2 (or `--target DIR`, any transformers chat
model: chat_target.py) on the prompts written in distill.py (or `--prompts-file`: prompt_file.py), train a
draft with the paper's recipe (training.py), save official-format checkpoints, resume, and plot the loss
and the acceptance per block position on held-out prompts.

    out/data.jsonl           the target's own responses (resumable, distill.py)
    out/draft/               the draft, official format (config.json + model.safetensors), fp32, and
                             draft_vocab.json (not with --full-vocab): the training responses' tokens,
                             what it proposes among (draft_vocab.py); the held-out evaluation uses it
    out/draft-bf16/          the same in bf16 at the end, draft_vocab.json too (what ships as drafts/smollm2)
    out/optimizer.safetensors, out/state.json    AdamW moments, step, losses, the batch generator:
                             `--resume` continues exactly (train_state.py)
    out/train_config.json    every option of the run (train_config.py): what --resume holds it to, and
                             a file --config can start another run from
    figures/training/training.png    loss curve and held-out acceptance per block position (--figures)
    out/eval.json                    held-out tokens per step and acceptance per block position
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from . import distill, train_config
from .chat_target import check_target_name, open_chat_target
from .checkpoint import save_draft
from .evaluate import fractions, number
from .prompt_file import heldout_prompts, training_prompts
from .spec_generate import spec_generate
from .train_state import batch_generator, read_moments, read_state, resume_optimizer, run_draft, save_state
from .training import (loss_weights, make_optimizer, sample_anchors, sampled_vocabulary, target_features_batched,
                       train_step, training_vocabulary)


def acceptance_by_position(draft, target, tokenizer, prompt_list, max_new_tokens=64, stop=(2,),
                           block_size: int | None = None, outputs: list | None = None,
                           verify_gate: float | None = None,
                           records: list | None = None, done=None) -> tuple[list[float | None], float | None]:
    """Greedy on each prompt: the fraction of full-block decode steps (the whole block drafted and
    verified) in which block position k (1 … b − 1) was accepted, and the mean tokens per step over
    all steps (the paper's τ): `tally` of every step. Each prompt's GenerationOutput is appended to
    `outputs` and its list of step records to `records`, if given; `done(i)` is called after the i-th."""
    from .smollm2 import chat_ids
    b = block_size or draft.block_size
    steps = []
    for i, prompt in enumerate(prompt_list, 1):
        mine = []
        out = spec_generate(draft, target, chat_ids(tokenizer, prompt), max_new_tokens, list(stop), block_size=b,
                            verify_gate=verify_gate, on_step=mine.append)
        if outputs is not None:
            outputs.append(out)
        if records is not None:
            records.append(mine)
        steps += mine
        if done is not None:
            done(i)
    return tally(steps, b)


def tally(steps, block_size: int) -> tuple[list[float | None], float | None]:
    """From spec_generate's step records: a_k = the share of whole-block steps (all b tokens verified)
    with at least k proposals accepted and emitted, k = 1 … b − 1 (None when no step verified a whole
    block: too few tokens asked for one), and τ = tokens produced per step, the steps pooled (None: no
    step). A proposal the target accepted after a stop token is never emitted, so it is not counted:
    a step emits min(τ, produced) of its accepted proposals (`emitted`)."""
    whole = [emitted(r.acceptance_length, r.produced) for r in steps if len(r.block_ids) == block_size]
    by_position = [sum(a >= k for a in whole) / len(whole) if whole else None for k in range(1, block_size)]
    return by_position, sum(r.produced for r in steps) / len(steps) if steps else None


def emitted(accepted: int, produced: int) -> int:
    """Accepted proposals that a step emitted: all τ of them, unless a stop token among them cut the
    step to `produced` ≤ τ tokens (the token limit never does: a step drafts only what fits)."""
    return min(accepted, produced)


def mean_of_prompts(records: list[list]) -> float | None:
    """τ as dflash's benchmark.py averages it ("Average Acceptance length"): each prompt's tokens per
    step, then the mean over prompts (those with no step left out; None if none has one). `tally`
    pools the steps instead, so a prompt decoded in many short steps weighs more there."""
    per_prompt = [sum(r.produced for r in steps) / len(steps) for steps in records if steps]
    return sum(per_prompt) / len(per_prompt) if per_prompt else None


def progress(step: int, total: int, loss: float, seconds: float) -> str:
    """One progress-bar line: [#####.....] step/total, loss, elapsed and estimated remaining time."""
    filled = round(20 * step / total)
    eta = seconds / max(step, 1) * (total - step)
    return (f"[{'#' * filled}{'.' * (20 - filled)}] step {step}/{total}  loss {loss:.3f}  "
            f"{seconds / 60:.1f} min, ~{eta / 60:.1f} min left")


def block_weights(block_size: int, gamma: float | None) -> torch.Tensor:
    """The loss weights w_k for the block size and γ; ValueError for a block size that cannot be
    trained or has no γ (checked before any work: `check_options`)."""
    # γ: the paper's for blocks 8, 10, 16; it trains no block 4, for which we take γ = 4 as for block 8.
    # γ = 1 was measured against it (README, "Training a draft"): better after 1000 steps, no better in a
    # whole from-scratch run (held-out τ 1.648 against 1.659), so the default stays.
    return loss_weights(block_size, gamma if gamma is not None else {4: 4.0}.get(block_size))


def check_options(options: dict) -> dict:
    """`train_config.check_values` with the run's prompt counts (its prompt files' or the written ones), the
    block's loss weights, the --target named and held-out prompts that are trained on: everything that can
    be refused before the target is loaded (`__main__` makes it a usage error)."""
    train_config.check_values(options, heldout_prompts=len(heldout_prompts(options)),
                              training_prompts=len(training_prompts(options)))
    block_weights(options["block_size"], options["gamma"])
    check_target_name(options["target"])
    trained = set(training_prompts(options)[:options["prompts"]])
    shared = [p for p in heldout_prompts(options)[:options["eval_prompts"]] if p in trained]
    if shared:      # the evaluation would not be held out
        raise train_config.TrainOptionError(f"{len(shared)} of the {options['eval_prompts']} held-out prompts are "
                                            f"also training prompts, e.g. {shared[0]!r}: hold them out")
    return options


def check_lengths(options: dict, tokenizer, max_positions: int) -> None:
    """--max-new-tokens after the longest training prompt used, and --eval-tokens after the longest
    held-out one, must fit the target's positions; refused once the target is loaded, before any distilling
    (an --eval-tokens too long would otherwise fail only after training)."""
    from .smollm2 import longest_chat_prompt
    for key, name, prompt_list in (("max_new_tokens", "training", training_prompts(options)[:options["prompts"]]),
                                   ("eval_tokens", "held-out", heldout_prompts(options)[:options["eval_prompts"]])):
        longest = longest_chat_prompt(tokenizer, prompt_list)
        if longest + options[key] > max_positions:
            raise SystemExit(f"{train_config.flag(key)} {options[key]}: the longest {name} prompt ({longest} tokens) "
                             f"+ {options[key]} exceeds the target's {max_positions} positions; at most "
                             f"{max_positions - longest}")


def run(args, say=print) -> int:
    from .folders import make_folder
    from .plots import save_figure
    out, figures = Path(args.out), Path(args.figures)
    for folder, flag in ((out, "--out"), (figures, "--figures")):      # now, not after the training
        try:
            make_folder(flag, folder)
        except ValueError as e:
            raise SystemExit(str(e)) from None
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    chat = open_chat_target(args.target)
    target, tokenizer, stop = chat.model, chat.tokenizer, chat.stop_token_ids
    check_lengths(vars(args), tokenizer, target.config.max_position_embeddings)
    state = read_state(out) if args.resume else {"step": 0, "losses": [], "seconds": 0.0}
    draft = run_draft(out, args, chat)        # before distilling: a checkpoint or --init that cannot work is
    moments = read_moments(out, draft) if args.resume else None   # refused in seconds, not after the data
    # the responses come from a bf16 copy of the target by default (1.5× faster here); features and
    # evaluation use the fp32 target that inference uses
    generator = chat.copy_in(torch.bfloat16) if args.distill_dtype == "bf16" else target
    try:
        rows = distill.self_distill(generator, tokenizer, training_prompts(vars(args))[:args.prompts],
                                    out / "data.jsonl", args.max_new_tokens, batch_size=args.distill_batch,
                                    stop_token_ids=stop, say=say)
    except distill.DataFileError as e:
        raise SystemExit(str(e)) from None
    rows = [r for r in rows if len(r["ids"]) - r["prompt_len"] >= args.block_size + 1]
    if not rows:
        raise SystemExit(f"none of the {args.prompts} responses has the {args.block_size + 1} tokens that training "
                         f"with blocks of {args.block_size} keeps; distil more prompts")
    # the run's options, once the data and (on a resume) the draft were found to fit them: a refused
    # resume leaves the saved options as they were
    train_config.save(out, vars(args))
    draft.train()
    vocab = None if args.full_vocab else training_vocabulary([r["ids"][r["prompt_len"]:] for r in rows], stop)
    # proposals over R only at inference (draft_vocab.py): the loss never had another token as a label
    draft.draft_vocab = vocab
    t0 = time.perf_counter()
    data = [(r["prompt_len"], torch.tensor([r["ids"]])) for r in rows]
    feats = target_features_batched(target, [ids for _, ids in data], draft.target_layer_ids, say=say)
    say(f"{len(data)} sequences ({sum(ids.shape[1] - n for n, ids in data)} response tokens), loss softmax over "
        f"{'all tokens' if vocab is None else f'{len(vocab)} response tokens + {args.negatives} sampled'}, "
        f"features in {time.perf_counter() - t0:.0f} s")
    step, losses, seconds = state["step"], state["losses"], state.get("seconds", 0.0)
    # the warmup the run started with (5 % of its --steps then), also when a resume raises --steps (runs
    # from before state.json kept it: 5 % of the --steps given now)
    warmup_steps = state.get("warmup_steps", max(1, args.steps // 20))
    optimizer, schedule = make_optimizer(draft, args.lr, args.steps, warmup_steps)
    if args.resume:
        resume_optimizer(moments, draft, optimizer, schedule, step)
    weights, g = block_weights(args.block_size, args.gamma), batch_generator(state, args.seed)
    t0 = time.perf_counter() - seconds
    while step < args.steps:
        picks = torch.randint(len(data), (args.batch,), generator=g).tolist()
        batch = [(data[i][1], feats[i], sample_anchors(data[i][0], data[i][1].shape[1], args.block_size,
                                                       args.anchors, g)) for i in picks]
        ids, log_weight = (None, None) if vocab is None else \
            sampled_vocabulary(vocab, target.config.vocab_size, args.negatives, g)
        losses.append(train_step(draft, target, batch, weights, optimizer, schedule, vocab=ids,
                                 vocab_log_weight=log_weight, bf16=args.train_dtype == "bf16"))
        step += 1
        if step % 25 == 0 or step == args.steps:
            recent = losses[-50:]
            say(progress(step, args.steps, sum(recent) / len(recent), time.perf_counter() - t0))
        if step % args.save_every == 0 or step == args.steps:
            save_state(out, draft.eval(), optimizer, g, step, warmup_steps, losses, time.perf_counter() - t0)
            draft.train()
    draft.eval()
    save_draft(draft, out / "draft-bf16", torch.bfloat16)      # what ships: official format, bf16
    say(f"trained {step} steps in {(time.perf_counter() - t0) / 60:.1f} min; bf16 draft in {out / 'draft-bf16'}")
    heldout = heldout_prompts(vars(args))[:args.eval_prompts]
    by_position, tokens_per_step = acceptance_by_position(draft, target, tokenizer, heldout, args.eval_tokens, stop)
    say(f"held-out: mean tokens per step {number(tokens_per_step, 2)}; acceptance by block position "
        f"{fractions(by_position, 2)}")
    save_figure(_curves(losses, by_position), figures / "training.png")
    total = time.perf_counter() - started
    (out / "eval.json").write_text(json.dumps({"tokens_per_step": tokens_per_step,
                                               "acceptance_by_position": by_position,
                                               "eval_prompts": heldout,
                                               "this_run_minutes": round(total / 60, 1),
                                               "config": {k: v for k, v in vars(args).items()
                                                          if isinstance(v, (int, float, str, bool))}},
                                              indent=1) + "\n")
    say(f"done in {total / 60:.1f} min")
    return 0


def _curves(losses, by_position):
    from matplotlib.figure import Figure
    fig = Figure(figsize=(9, 3))
    a, b = fig.subplots(1, 2)
    smooth = [sum(losses[max(0, i - 49):i + 1]) / len(losses[max(0, i - 49):i + 1]) for i in range(len(losses))]
    a.plot(smooth)
    a.set_xlabel("step")
    a.set_ylabel("weighted CE (50-step mean)")
    a.set_yscale("log")
    b.bar(range(1, len(by_position) + 1), [math.nan if a is None else a for a in by_position])
    b.set_xlabel("block position k")
    b.set_ylabel("accepted fraction (held-out)")
    fig.tight_layout()
    return fig
