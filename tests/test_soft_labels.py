"""Soft labels (training/soft_labels.py): the loss by hand, its one-hot case equal to the hard loss,
the target's top-k from the batched feature pass, and a training step that mixes them."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_pair

from dflash_ref import generate
from dflash_ref.training.features import target_features, target_features_batched
from dflash_ref.training.recipe import dflash_loss, loss_weights, make_optimizer, train_step, training_logits
from dflash_ref.training.sampled_softmax import positions_in, sampled_vocabulary
from dflash_ref.training.soft_labels import (
    SoftTargets,
    block_soft_targets,
    restrict_to_vocab,
    soft_label_loss,
    top_k_distribution,
)

pytestmark = pytest.mark.usefixtures("one_thread_module")


def test_soft_label_loss_by_hand():
    # one block (m = 1) of b = 3: two proposal positions over a vocabulary of 3, weights 1 and 0.5
    logits = torch.tensor([[[0.0, 1.0, 2.0], [1.0, 1.0, 0.0]]])
    ids = torch.tensor([[[2, 0], [1, 2]]])
    probs = torch.tensor([[[0.75, 0.25], [1.0, 0.0]]])
    w = torch.tensor([1.0, 0.5])
    z0, z1 = math.log(1 + math.e + math.e**2), math.log(2 * math.e + 1)
    ce0 = 0.75 * (z0 - 2.0) + 0.25 * (z0 - 0.0)
    ce1 = 1.0 * (z1 - 1.0)
    assert float(soft_label_loss(logits, ids, probs, w)) == pytest.approx((ce0 + 0.5 * ce1) / 1.5, rel=1e-6)


def test_one_hot_soft_labels_give_the_hard_loss_over_a_sampled_vocabulary():
    g = torch.Generator().manual_seed(0)
    vocab, log_weight = sampled_vocabulary(torch.tensor([2, 5, 9, 11, 30]), 40, 6, g)
    logits = torch.randn(3, 2, len(vocab), generator=g) + log_weight  # (m, b − 1, V')
    labels = torch.tensor([[2, 9], [30, 5], [11, 11]])  # token ids, all in R
    ids = torch.stack([labels, torch.full_like(labels, 7)], dim=-1)  # (m, b − 1, 2): 7 has no mass
    probs = torch.stack([torch.ones(3, 2), torch.zeros(3, 2)], dim=-1)
    w = loss_weights(3, gamma=2.0)
    hard = dflash_loss(logits, positions_in(vocab, labels), w)
    assert float(soft_label_loss(logits, ids, probs, w, vocab)) == pytest.approx(float(hard), rel=1e-6)
    with pytest.raises(ValueError, match="outside the loss's vocabulary"):  # mass on an id not in V'
        soft_label_loss(logits, ids, probs.flip(-1), w, vocab[vocab != 7])


def test_restricting_to_the_vocabulary_renormalises():
    ids = torch.tensor([[4, 1, 8], [8, 9, 6]])
    probs = torch.tensor([[0.5, 0.3, 0.1], [0.6, 0.2, 0.1]])
    soft = restrict_to_vocab(ids, probs, torch.tensor([1, 4, 5]))
    assert torch.allclose(soft.probs, torch.tensor([[0.625, 0.375, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(soft.ids, ids)
    assert torch.allclose(restrict_to_vocab(ids, probs, None).probs.sum(-1), torch.ones(2))


def test_top_k_distribution_is_the_softmax_head():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    ids, probs = top_k_distribution(logits, 2)
    full = torch.softmax(logits, -1)
    assert ids.tolist() == [[0, 2]] and torch.allclose(probs, full[:, [0, 2]])


def test_block_soft_targets_take_the_target_before_each_label():
    soft = SoftTargets(torch.arange(20).reshape(10, 2), torch.rand(10, 2))
    ids, probs = block_soft_targets(soft, torch.tensor([2, 6]), 3)  # proposals at 3, 4 and 7, 8
    assert ids[..., 0].tolist() == [[4, 6], [12, 14]]  # rows 2, 3 and 6, 7
    assert torch.equal(probs, soft.probs[torch.tensor([[2, 3], [6, 7]])])


def _sequences(target, specs):
    return [
        generate(
            target, torch.randint(0, target.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(s)), n
        ).output_ids
        for s, n in specs
    ]


def test_the_batched_feature_pass_gives_each_sequence_its_own_top_k():
    target, draft = make_pair(4)
    sequences = _sequences(target, [(0, 5), (1, 17), (2, 9)])
    features, soft = target_features_batched(target, sequences, draft.target_layer_ids, batch_size=2, top_k=3)
    for tokens, got, top in zip(sequences, features, soft):
        with torch.no_grad():
            logits = target(tokens).logits[0]  # (T, V), one sequence alone
        ids, probs = top_k_distribution(logits, 3)
        assert torch.equal(top.ids, ids) and torch.allclose(top.probs, probs, atol=1e-6)
        assert torch.allclose(got, target_features(target, tokens, draft.target_layer_ids), atol=1e-5)
        # the greedy responses are the argmax of the target's distribution one position before
        prompt = 4
        assert torch.equal(top.ids[prompt - 1 : -1, 0], tokens[0, prompt:])


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_a_step_with_one_hot_soft_labels_is_the_hard_step(alpha):
    target, draft = make_pair(2, draft_overrides={"block_size": 4})
    tokens = _sequences(target, [(5, 20)])[0]
    features, anchors = target_features(target, tokens, draft.target_layer_ids), torch.tensor([4, 10])
    one_hot = SoftTargets(torch.cat([tokens[0, 1:], tokens[0, :1]])[:, None], torch.ones(tokens.shape[1], 1))
    w = loss_weights(4, gamma=2.0)
    grads, losses = [], []
    for item, weight in (((tokens, features, anchors), 0.0), ((tokens, features, anchors, one_hot), alpha)):
        optimizer, schedule = make_optimizer(draft, lr=0.0, total_steps=10, warmup_steps=1)
        losses.append(train_step(draft, target, [item], w, optimizer, schedule, soft_weight=weight))
        grads.append(torch.cat([p.grad.reshape(-1) for p in draft.parameters() if p.grad is not None]))
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert torch.allclose(grads[1], grads[0], atol=1e-6)
    with pytest.raises(ValueError, match="needs every batch item's SoftTargets"):
        train_step(
            draft, target, [(tokens, features, anchors)], w, *make_optimizer(draft, 0.0, 10, 1), soft_weight=alpha
        )


def test_soft_labels_move_the_draft_toward_the_target_distribution():
    # α = 1 on the target's top 8: the step lowers the soft loss of the blocks it trains on
    target, draft = make_pair(3, draft_overrides={"block_size": 4})
    tokens = _sequences(target, [(7, 24)])[0]
    (features,), (soft,) = target_features_batched(target, [tokens], draft.target_layer_ids, top_k=8)
    soft, anchors, w = restrict_to_vocab(*soft, None), torch.tensor([4, 9, 14]), loss_weights(4, gamma=2.0)

    def loss() -> float:
        with torch.no_grad():
            logits, _ = training_logits(draft, target, tokens, features, anchors)
            return float(soft_label_loss(logits, *block_soft_targets(soft, anchors, 4), w))

    before = loss()
    optimizer, schedule = make_optimizer(draft, lr=1e-2, total_steps=40, warmup_steps=1)
    for _ in range(20):
        train_step(draft, target, [(tokens, features, anchors, soft)], w, optimizer, schedule, soft_weight=1.0)
    assert loss() < 0.8 * before
