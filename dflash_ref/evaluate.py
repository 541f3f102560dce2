"""`python -m dflash_ref evaluate`: a SmolLM2 draft's acceptance on named sets of prompts, greedy,
measured exactly as a training run's held-out evaluation (`train_cli.acceptance_by_position`):

    τ      = mean tokens per decode step (accepted draft tokens + the bonus), over all steps
    a_k    = fraction of whole-block steps in which block position k (1 … b − 1) was accepted

A set is SPLIT:START:COUNT, the prompts distill.prompts(SPLIT)[START:START + COUNT]: `train` has 7140
prompts over 595 topics (the shipped draft was trained on the first 5580, the defaults on the first
1860), `heldout` 144 over 12 topics no draft here was trained on. So

    python -m dflash_ref evaluate --sets heldout:0:12 train:0:12 train:3000:12 train:6000:12

sets held-out prompts beside prompts the shipped draft was trained on and prompts it never saw on
topics it knows (README, "Training a draft")."""
from __future__ import annotations

import json
from pathlib import Path

SPLITS = ("train", "heldout")


def parse_set(spec: str) -> tuple[str, int, int]:
    """'SPLIT:START:COUNT' → (split, start, count), or a ValueError naming what is wrong."""
    from .distill import prompts
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in SPLITS or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"prompt set {spec!r}: expected SPLIT:START:COUNT with SPLIT one of {list(SPLITS)} "
                         "and START, COUNT whole numbers, e.g. heldout:0:12")
    split, start, count = parts[0], int(parts[1]), int(parts[2])
    available = len(prompts(split))
    if count < 1:
        raise ValueError(f"prompt set {spec!r}: COUNT must be at least 1")
    if start + count > available:
        raise ValueError(f"prompt set {spec!r}: prompts {start}…{start + count - 1} asked for, but the {split} "
                         f"split has {available} (0…{available - 1})")
    return split, start, count


def run(args, say=print) -> dict:
    """Evaluate args.draft (default: the shipped draft) on each of args.sets; write args.out if given."""
    import torch
    from . import distill
    from .checkpoint import CheckpointError, load_draft
    from .smollm2 import SHIPPED_DRAFT, STOP_TOKEN_IDS, load_smollm2
    from .train_cli import acceptance_by_position
    sets = [parse_set(s) for s in args.sets]
    folder = Path(args.draft) if args.draft else SHIPPED_DRAFT
    try:
        draft = load_draft(folder, torch.float32)
    except CheckpointError as e:
        raise SystemExit(f"--draft: {e}") from None
    block_size = args.block_size or draft.block_size
    if not 2 <= block_size <= draft.block_size:
        raise SystemExit(f"--block-size {block_size}: this draft drafts blocks of 2 … {draft.block_size} tokens")
    target, tokenizer = load_smollm2()
    results = {"draft": str(folder), "block_size": block_size, "tokens": args.tokens, "sets": {}}
    for spec, (split, start, count) in zip(args.sets, sets):
        chosen = distill.prompts(split)[start:start + count]
        with torch.no_grad():
            by_position, tau = acceptance_by_position(draft, target, tokenizer, chosen, args.tokens,
                                                      STOP_TOKEN_IDS, block_size)
        results["sets"][spec] = {"tau": tau, "acceptance_by_position": by_position, "prompts": chosen}
        say(f"{spec:>20}  τ {tau:.3f}  acceptance by block position "
            f"{', '.join(f'{a:.3f}' for a in by_position)}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        say(f"wrote {args.out}")
    return results
