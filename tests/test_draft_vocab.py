"""A draft vocabulary (extensions/draft_vocab.py): proposals among V_d only, lossless, stored beside the checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_pair

from dflash_ref import generate, spec_generate
from dflash_ref.drafts.checkpoint import load_draft, save_draft
from dflash_ref.extensions.draft_vocab import FILE, DraftVocab, check_draft_vocab, draft_vocab_of
from dflash_ref.target.checkpoint import CheckpointError
from dflash_ref.trace import StepLog


@pytest.mark.parametrize(
    "ids,problem",
    [
        ([], r"shape \(0,\)"),
        ([[1, 2]], r"shape \(1, 2\)"),
        ([0.5, 2.0], "torch.float32"),
        ({0, 2}, "got set"),
        ([3, 1], "sorted and distinct"),
        ([1, 1], "sorted and distinct"),
        ([-1, 2], r"\[0, 16\)"),
        ([2, 16], r"\[0, 16\)"),
    ],
)
def test_a_bad_draft_vocabulary_is_refused_naming_the_problem(ids, problem):
    with pytest.raises(ValueError, match=problem):
        check_draft_vocab(ids, 16)


def test_the_head_gives_the_lm_heads_logits_on_the_draft_vocabulary_and_minus_infinity_elsewhere():
    target, _ = make_pair(0)
    ids = torch.tensor([0, 3, 4, 9])
    hidden = torch.randn(1, 5, target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    full, restricted = target.output_head(hidden), DraftVocab(target, ids)(hidden)
    assert restricted.shape == full.shape
    torch.testing.assert_close(restricted[..., ids], full[..., ids], rtol=1e-5, atol=1e-5)
    outside = torch.ones(full.shape[-1], dtype=torch.bool)
    outside[ids] = False
    assert torch.isneginf(restricted[..., outside]).all()
    assert torch.equal(ids[full[..., ids].argmax(-1)], restricted.argmax(-1))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculative_output_with_a_draft_vocabulary_proposes_only_from_it(seed, temperature):
    """Greedy: equal to AR. Sampled: only proposals of V_d (its distribution: test_lossless's chi-square case)."""
    target, draft = make_pair(seed, draft_overrides={"block_size": 4})
    vocab = target.config.vocab_size
    ids = torch.randint(0, vocab, (1, 4), generator=torch.Generator().manual_seed(seed))
    draft.draft_vocab = torch.arange(0, vocab, 2)  # the even ids only
    records = StepLog()
    torch.manual_seed(seed)
    extensions = draft_vocab_of(draft, target)
    out = spec_generate(draft, target, ids, 20, temperature=temperature, extensions=extensions, on_step=records)
    assert records and all(t % 2 == 0 for r in records for t in r.draft_tokens)
    if temperature == 0:
        assert torch.equal(out.output_ids, generate(target, ids, 20).output_ids)
    records.clear()
    spec_generate(draft, target, ids, 20, on_step=records)  # the plain loop: over all V, as the official
    assert any(t % 2 for r in records for t in r.draft_tokens)
    draft.draft_vocab = torch.tensor([vocab])  # not a token of this target
    with pytest.raises(ValueError, match="draft vocabulary ids must lie in"):
        draft_vocab_of(draft, target)


def test_a_draft_vocabulary_is_saved_beside_the_checkpoint_and_checked_on_load(tmp_path):
    _, draft = make_pair(1)
    save_draft(draft, tmp_path)
    assert load_draft(tmp_path).draft_vocab is None and not (tmp_path / FILE).exists()
    draft.draft_vocab = torch.tensor([5, 1])
    with pytest.raises(ValueError, match="sorted and distinct"):
        save_draft(draft, tmp_path)  # refused before it is written
    draft.draft_vocab = torch.tensor([1, 5, 7])
    save_draft(draft, tmp_path)
    assert torch.equal(load_draft(tmp_path).draft_vocab, torch.tensor([1, 5, 7]))
    (tmp_path / FILE).write_text(json.dumps({"token_ids": [1, draft.config.vocab_size]}))
    with pytest.raises(CheckpointError, match=f"{FILE}.*must lie in"):
        load_draft(tmp_path)
    (tmp_path / FILE).write_text("[1, 2")
    with pytest.raises(CheckpointError, match="is not a draft vocabulary"):
        load_draft(tmp_path)
    draft.draft_vocab = None
    save_draft(draft, tmp_path)  # no stale vocabulary left behind
    assert load_draft(tmp_path).draft_vocab is None and not (tmp_path / FILE).exists()


def test_the_shipped_drafts_propose_among_their_training_tokens():
    from dflash_ref.drafts.folder import SHIPPED_DRAFTS
    from dflash_ref.loading.smollm2 import STOP_TOKEN_IDS

    for folder in SHIPPED_DRAFTS.values():
        vocab = load_draft(folder).draft_vocab
        assert vocab is not None and 1000 < len(vocab) < 49152 and set(STOP_TOKEN_IDS) <= set(vocab.tolist())
