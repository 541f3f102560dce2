"""`python -m dflash_ref train`: self-distil data from SmolLM2, train a draft with the paper's recipe
(training.py), save official-format checkpoints, resume, and plot the loss and the acceptance per
block position on held-out prompts.

    out/data.jsonl           the target's own responses (resumable, distill.py)
    out/draft/               the draft, official format (config.json + model.safetensors)
    out/optimizer.safetensors, out/state.json    AdamW moments, step, losses: `--resume` continues
    out/train_loss.png, out/acceptance_by_position.png
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from . import distill
from .checkpoint import load_draft, save_draft
from .spec_generate import spec_generate
from .training import loss_weights, make_optimizer, sample_anchors, target_features, train_step


def _save_state(out: Path, draft, optimizer, step: int, losses: list[float]) -> None:
    save_draft(draft, out / "draft")
    names = {id(p): n for n, p in draft.named_parameters()}
    moments = {f"{names[id(p)]}.{k}": v.contiguous() for group in optimizer.param_groups for p in group["params"]
               for k, v in optimizer.state.get(p, {}).items() if k in ("exp_avg", "exp_avg_sq")}
    save_file(moments, str(out / "optimizer.safetensors"))
    (out / "state.json").write_text(json.dumps({"step": step, "losses": losses}) + "\n")


def _load_state(out: Path, draft, optimizer) -> tuple[int, list[float]]:
    state = json.loads((out / "state.json").read_text())
    moments = load_file(str(out / "optimizer.safetensors"))
    for name, p in draft.named_parameters():
        if f"{name}.exp_avg" in moments:
            optimizer.state[p] = {"step": torch.tensor(float(state["step"])),
                                  "exp_avg": moments[f"{name}.exp_avg"], "exp_avg_sq": moments[f"{name}.exp_avg_sq"]}
    return state["step"], state["losses"]


def acceptance_by_position(draft, target, tokenizer, prompt_list, max_new_tokens=64, stop=(2,)):
    """Fraction of decode steps in which block position k (1..γ) was accepted, and mean tokens/step."""
    from .smollm2 import chat_ids
    accepted, steps, produced = torch.zeros(draft.block_size - 1), 0, []
    for prompt in prompt_list:
        records = []
        spec_generate(draft, target, chat_ids(tokenizer, prompt), max_new_tokens, list(stop), on_step=records.append)
        for r in records:
            if len(r.draft_tokens) == draft.block_size - 1:
                accepted[:r.acceptance_length] += 1
                steps += 1
            produced.append(r.produced)
    return (accepted / max(steps, 1)).tolist(), sum(produced) / max(len(produced), 1)


def run(args, say=print) -> int:
    from .plots import save_figure
    from .smollm2 import STOP_TOKEN_IDS, load_smollm2, random_smollm2_draft
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    target, tokenizer = load_smollm2()
    rows = distill.self_distill(target, tokenizer, distill.prompts("train")[:args.prompts], out / "data.jsonl",
                                args.max_new_tokens, say=say)
    rows = [r for r in rows if len(r["ids"]) - r["prompt_len"] >= args.block_size + 1]
    draft = (load_draft(out / "draft") if args.resume else
             random_smollm2_draft(target, args.layers, args.block_size, args.seed)).train()
    t0 = time.perf_counter()
    data = [(r["prompt_len"], torch.tensor([r["ids"]])) for r in rows]
    feats = [target_features(target, ids, draft.target_layer_ids) for _, ids in data]
    say(f"{len(data)} sequences, features in {time.perf_counter() - t0:.0f} s")
    optimizer, schedule = make_optimizer(draft, args.lr, args.steps, max(1, args.steps // 20))
    step, losses = _load_state(out, draft, optimizer) if args.resume else (0, [])
    for _ in range(step):
        schedule.step()
    weights, g = loss_weights(args.block_size, args.gamma), torch.Generator().manual_seed(args.seed + step)
    t0 = time.perf_counter()
    while step < args.steps:
        i = int(torch.randint(len(data), (1,), generator=g))
        prompt_len, ids = data[i]
        anchors = sample_anchors(prompt_len, ids.shape[1], args.block_size, args.anchors, g)
        losses.append(train_step(draft, target, ids, feats[i], anchors, weights, optimizer, schedule))
        step += 1
        if step % 50 == 0 or step == args.steps:
            say(f"step {step}/{args.steps}: loss {sum(losses[-50:]) / len(losses[-50:]):.3f}, "
                f"lr {schedule.get_last_lr()[0]:.2e}, {time.perf_counter() - t0:.0f} s")
        if step % args.save_every == 0 or step == args.steps:
            _save_state(out, draft.eval(), optimizer, step, losses)
            draft.train()
    draft.eval()
    heldout = distill.prompts("heldout")[::4][:args.eval_prompts]
    by_position, tokens_per_step = acceptance_by_position(draft, target, tokenizer, heldout, args.max_new_tokens,
                                                          STOP_TOKEN_IDS)
    say(f"held-out: mean tokens per step {tokens_per_step:.2f}; acceptance by block position "
        f"{[round(x, 2) for x in by_position]}")
    save_figure(_curves(losses, by_position), out / "training.png")
    (out / "eval.json").write_text(json.dumps({"tokens_per_step": tokens_per_step,
                                               "acceptance_by_position": by_position}) + "\n")
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
    b.bar(range(1, len(by_position) + 1), by_position)
    b.set_xlabel("block position k")
    b.set_ylabel("accepted fraction (held-out)")
    fig.tight_layout()
    return fig
