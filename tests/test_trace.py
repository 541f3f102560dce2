"""The trace: what it records must be exactly what the loop did, and survive save/load bit for bit."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from conftest import make_pair

from dflash_ref import generate, spec_generate
from dflash_ref.drafts.oracle import OracleDraft
from dflash_ref.hooks import hook_points
from dflash_ref.trace import Trace, tracing
from dflash_ref.trace.plots import (
    plot_acceptance,
    plot_attention,
    plot_attention_grid,
    plot_attention_steps,
    plot_cache_timeline,
    plot_rope_alignment,
)

CASES = [  # (seed, draft overrides, oracle accept pattern or None)
    (0, {}, None),
    (1, {"block_size": 6}, [5, 0, 2, 5, 1]),
    (2, {"num_attention_heads": 4, "num_key_value_heads": 1}, [1, 1, 3]),
    (3, {"block_size": 3, "num_hidden_layers": 3}, None),
]


def traced_run(seed, overrides, accept, max_new_tokens=23, **trace_kw):
    target, draft = make_pair(seed, draft_overrides=overrides)
    ids = torch.randint(0, target.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(seed))
    runner = draft
    if accept is not None:
        runner = OracleDraft(draft, generate(target, ids, max_new_tokens).output_ids, accept)
    with tracing(draft, **trace_kw) as trace:
        out = spec_generate(runner, target, ids, max_new_tokens, on_step=trace.on_step)
    return target, draft, ids, out, trace


@pytest.mark.parametrize("seed,overrides,accept", CASES)
def test_attention_rows_sum_to_one_and_key_length_follows_the_cache(seed, overrides, accept):
    _, draft, _, out, trace = traced_run(seed, overrides, accept)
    assert len(trace) == len(out.acceptance_lengths) > 1
    heads = draft.config.num_attention_heads
    for r in trace.records:
        if not r.draft_tokens:
            continue
        for layer in range(draft.config.num_hidden_layers):
            w = trace.attention(r.step, layer)
            q_len = len(r.q_position_ids)
            assert w.shape == (heads, q_len, r.draft_cache_before + r.ctx_len + q_len)
            assert torch.allclose(w.sum(-1), torch.ones(heads, q_len), atol=1e-6)
            assert (w > 0).all(), "non-causal: every block row sees every key"
        assert trace.context_columns(r.step) == r.draft_cache_before + r.ctx_len
        assert r.k_position_ids == list(range(r.start + len(r.q_position_ids)))
        assert r.q_position_ids == list(range(r.start, r.start + len(r.q_position_ids)))


@pytest.mark.parametrize("seed,overrides,accept", CASES)
def test_cache_lengths_follow_the_crop_rules(seed, overrides, accept):
    target, _, ids, out, trace = traced_run(seed, overrides, accept)
    prompt_len = ids.shape[1]
    for i, r in enumerate(trace.records):
        q_len = len(r.q_position_ids)
        assert r.target_cache_before == r.start
        assert r.target_cache_after_verify == r.start + q_len
        assert r.target_cache_after == r.start + r.produced
        assert r.draft_cache_before == r.start - r.ctx_len
        if r.draft_tokens:
            assert r.draft_cache_after_draft == r.start + q_len
        assert r.draft_cache_after == r.start, "draft cache is cropped back to start"
        assert r.ctx_len == (prompt_len if i == 0 else trace.records[i - 1].produced)
        assert r.produced == out.tokens_per_step[i] and r.acceptance_length == out.acceptance_lengths[i]
        if accept is not None and i < len(accept) and i + 1 < len(trace):
            assert r.acceptance_length == min(accept[i], len(r.draft_tokens))
        assert trace["draft.hook_target_hidden", i].shape[0] == r.ctx_len


def test_tracing_changes_nothing_and_leaves_no_hooks():
    target, draft = make_pair(5)
    ids = torch.tensor([[1, 2, 3]])
    plain = spec_generate(draft, target, ids, 20)
    with tracing(draft, target) as trace:
        traced = spec_generate(draft, target, ids, 20, on_step=trace.on_step)
    assert torch.equal(plain.output_ids, traced.output_ids)
    assert plain.acceptance_lengths == traced.acceptance_lengths
    for point in hook_points(draft, target).values():
        assert not point._forward_hooks, f"{point.name} kept a hook after tracing"
        assert not point.active


def test_target_attention_is_optional_and_prefill_is_kept_apart():
    target, draft = make_pair(6)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with tracing(draft) as draft_only:
        spec_generate(draft, target, ids, 9, on_step=draft_only.on_step)
    assert not any(k.startswith("target.") for k in draft_only.keys()) and not draft_only.prefill
    with tracing(draft, target, names="target.*hook_pattern") as trace:
        spec_generate(draft, target, ids, 9, on_step=trace.on_step)
    prefill = trace.prefill["target.model.layers.0.self_attn.hook_pattern"]
    assert prefill.shape == (target.config.num_attention_heads, 5, 5)
    assert torch.equal(prefill[0].triu(1), torch.zeros(5, 5)), "the target is causal"
    first = trace["target.model.layers.0.self_attn.hook_pattern", 0]
    r = trace.records[0]
    assert first.shape[-2:] == (len(r.q_position_ids), r.target_cache_before + len(r.q_position_ids))


def test_filters_by_name_and_step():
    _, _, _, _, trace = traced_run(1, {"block_size": 6}, [5, 0, 2, 5, 1], names=["*hook_pattern"], steps=[0, 2])
    assert trace.keys() and all(k.endswith("hook_pattern") for k in trace.keys())
    assert trace.activations[1] == {} and trace.activations[0] and trace.activations[2]
    small = trace.filter(names="draft.layers.0.*", steps=[2])
    assert len(small) == 1 and small.records[0].step == 2
    assert small.keys() == ["draft.layers.0.self_attn.hook_pattern"]
    with pytest.raises(KeyError, match="not recorded at step 1"):
        trace["draft.layers.0.self_attn.hook_pattern", 1]
    with pytest.raises(KeyError, match="no hook named"):
        trace["draft.nothing"]
    assert "Trace(steps=" in repr(trace)


def test_save_load_round_trip_is_bit_identical(tmp_path):
    target, _, _, _, trace = traced_run(1, {"block_size": 6}, [5, 0, 2, 5, 1])
    trace.meta["note"] = "round trip"
    trace.save(tmp_path / "t")
    back = Trace.load(tmp_path / "t")
    assert back.records == trace.records and back.meta == trace.meta and back.keys() == trace.keys()
    for a, b in zip(trace.activations, back.activations):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name])
    with pytest.raises(FileNotFoundError, match="not a saved trace"):
        Trace.load(tmp_path / "missing")


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_saved_tensors_get_the_usual_file_mode_not_safetensors_0600(tmp_path, umask):
    """safetensors' save_file writes 0600: a trace's activations, a bundle's target and draft weights were unreadable
    to the others sharing them. Every one now gets the mode of any new file under the umask (0644 under 022)."""
    import os
    import stat

    from dflash_ref import save_draft, save_target

    target, draft, _, _, trace = traced_run(1, {"block_size": 4}, [5, 0, 2])
    previous = os.umask(umask)
    try:
        trace.save(tmp_path / "t")
        save_target(target, tmp_path / "target")
        save_draft(draft, tmp_path / "draft")
    finally:
        os.umask(previous)
    for file in ("t/activations.safetensors", "target/model.safetensors", "draft/model.safetensors"):
        mode = stat.S_IMODE((tmp_path / file).stat().st_mode)
        assert mode == 0o666 & ~umask == (tmp_path / "t" / "trace.json").stat().st_mode & 0o777, (file, oct(mode))


def test_a_trace_saved_before_the_verify_gate_or_lookup_still_loads(tmp_path):
    """Format /1 had no StepRecord.verify_size, /2 no StepRecord.lookup: they load as 0 ("not recorded") and
    False (no lookup existed); a newer format is refused by name."""
    import json

    _, _, _, _, trace = traced_run(1, {"block_size": 4}, [3, 0, 1])
    trace.save(tmp_path / "t")
    doc = json.loads((tmp_path / "t" / "trace.json").read_text())
    assert doc["format"] == "dflash_ref.trace/3"
    assert all(r["verify_size"] == len(r["q_position_ids"]) and r["lookup"] is False for r in doc["records"])
    for old in ("dflash_ref.trace/2", "dflash_ref.trace/1"):
        doc["format"] = old
        for r in doc["records"]:
            r.pop("lookup", None)
            if old.endswith("/1"):
                del r["verify_size"]
        (tmp_path / "t" / "trace.json").write_text(json.dumps(doc))
        back = Trace.load(tmp_path / "t")
        assert [r.verify_size for r in back.records] == (
            [0] * len(trace.records) if old.endswith("/1") else [r.verify_size for r in trace.records]
        )
        assert [r.block_ids for r in back.records] == [r.block_ids for r in trace.records]
        assert not any(r.lookup for r in back.records)
    doc["format"] = "dflash_ref.trace/9"
    (tmp_path / "t" / "trace.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="written by a newer dflash_ref"):
        Trace.load(tmp_path / "t")


def test_every_plot_returns_a_figure():
    _, _, _, out, trace = traced_run(1, {"block_size": 6}, [5, 0, 2, 5, 1])
    figures = [
        plot_attention(trace, 1, 0, 0),
        plot_attention_grid(trace, 0),
        plot_attention_steps(trace),
        plot_cache_timeline(trace),
        plot_acceptance(trace),
        plot_rope_alignment(trace.records[0]),
    ]
    for fig in figures:
        assert isinstance(fig, matplotlib.figure.Figure) and fig.axes
    with pytest.raises(KeyError, match="hook_pattern"):
        plot_attention_grid(trace.filter(names="draft.hook_out"), 0)
