"""The speculators adapter's mapping (conformance/ports/pypi/speculators.py, ports/torch_taps.py), without speculators
installed: the teacher-forced steps and inputs of a bundle the kit writes, the layer-id and config translation,
the reader's keys and layouts on a stand-in with the port's module names, and n/a with the install line where the
package is missing. One test runs the real port, where it is installed."""

from __future__ import annotations

import importlib
import importlib.util
import types

import numpy as np
import pytest
import torch
from torch import nn

from dflash_ref.conformance.bundle import find_bundles
from dflash_ref.conformance.golden import generate_golden
from dflash_ref.conformance.ports.pypi import speculators as sp
from dflash_ref.conformance.ports.torch_taps import (
    ForcedStep,
    Taps,
    concat_layers,
    forced_ids,
    per_head,
    teacher_forced_steps,
)
from dflash_ref.conformance.report import NotApplicable
from dflash_ref.conformance.stages import KINDS
from dflash_ref.conformance.variants import TEACHER_FORCED


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    generate_golden(out, ["walkthrough"])
    return find_bundles(out)[0]


# ---------------------------------------------------------------------------------------- teacher-forced steps


def test_steps_chain_the_reference_walk(walkthrough):
    b, steps = walkthrough, teacher_forced_steps(walkthrough)
    e, prompt = b.expected, len(b.inputs["input_ids"])
    assert [s.index for s in steps] == sorted({x["step"] for x in b.entries if x["stage"] == "posterior"})
    assert steps[0].start == prompt and steps[0].new_from == 0
    assert steps[0].anchor == int(e["prefill/first_token"])  # block 0's anchor is x_0
    for s in steps:
        assert s.anchor == int(e["output_ids"][s.start])
        assert s.block_len == e[f"step{s.index}/posterior"].shape[0]
        assert s.proposals == tuple(e[f"step{s.index}/draft_tokens"].tolist())
        # the kit's own layouts say the same: L_c new context rows, start + L_q keys attended
        assert e[f"step{s.index}/draft.hook_target_hidden"].shape[0] == s.start - s.new_from
        assert e[f"step{s.index}/draft.layers.0.self_attn.hook_k_rot"].shape[1] == s.start + s.block_len
    for before, after in zip(steps, steps[1:]):
        tau = int(e[f"step{before.index}/acceptance_length"])
        assert after.new_from == before.start and after.start == before.start + tau + 1
        assert after.anchor == int(e[f"step{before.index}/bonus"])  # the bonus anchors the next block


def test_forced_ids_hold_the_committed_context_then_the_block(walkthrough):
    for s in teacher_forced_steps(walkthrough):
        ids = forced_ids(walkthrough, s, fill=99)
        assert len(ids) == s.start + 1 + s.block_len  # one anchor whose block fits: start + 1 + L_q
        assert ids[: s.start + 1] == walkthrough.expected["output_ids"][: s.start + 1].tolist()
        assert ids[s.start + 1 :] == [99] * s.block_len
        forced = forced_ids(walkthrough, s, fill=99, block_tokens=True)
        assert forced[s.start + 1 : s.start + s.block_len] == list(s.proposals)  # the selector's predecessors
        assert forced[-1] == 99


def test_it_declares_itself_teacher_forced():
    # a training library has no loop: the target's and the loop's stages are not compared, the draft's are
    assert sp.SpeculatorsPort.variants == {"decoding": "teacher-forced"} and not getattr(sp.SpeculatorsPort, "skip", ())
    draft_side = {"target_hidden", "fc", "context", "q", "k_rot", "pattern", "logits", "draft_tokens", "layer_ids"}
    assert not draft_side & TEACHER_FORCED and TEACHER_FORCED <= set(KINDS)


# ---------------------------------------------------------------------------------------- translations


def test_layer_ids_in_the_kits_convention():
    # the port's aux ids index transformers' hidden_states (official id + 1), repeated ids kept as they are
    assert sp.kit_layer_ids([2, 4]) == [1, 3]
    assert sp.kit_layer_ids([2, 2]) == [1, 1]


def test_dflash2_is_told_and_its_fields_read():
    one = {"architectures": ["DFlashDraftModel"], "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1]}}
    two = {
        "architectures": ["DFlash2DraftModel"],
        "dflash_config": {"conv_kernel_size": 2, "conv_group_size": 4, "selector_rank": 4, "selector_top_k": 3},
    }
    assert not sp.is_dflash2(one) and sp.is_dflash2(two)
    assert sp.is_dflash2({"dflash_config": {"selector_top_k": 3}})  # by its fields alone
    assert sp.dflash2_fields(two) == two["dflash_config"]
    assert sp.dflash2_fields({"dflash_config": {"selector_rank": 4}}) == {"selector_rank": 4}  # the rest: defaults


def test_dflash2_config_is_the_converters_plus_its_own_fields(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["DFlash2DraftModel"], "dflash_config": '
                                          '{"conv_kernel_size": 2, "conv_group_size": 4, "selector_rank": 5, '
                                          '"selector_top_k": 3}}')  # fmt: skip
    seen = {}

    class Speculators:
        def model_copy(self, update):
            return {"copied": update}

    class Converter:
        def _build_config(self, source, base_model, ids):
            seen["build"] = (source["architectures"], base_model, ids)
            return types.SimpleNamespace(
                transformer_layer_config="tl", draft_vocab_size=8, block_size=4, aux_hidden_state_layer_ids=[2, 3],
                mask_token_id=7, speculators_config=Speculators(), sliding_window_non_causal=False,
            )  # fmt: skip

    modules = {
        "converter": types.SimpleNamespace(DFlashConverter=Converter),
        "dflash2": types.SimpleNamespace(DFlash2SpeculatorConfig=lambda **kw: kw),
    }
    config = sp.dflash2_config(modules, tmp_path, tmp_path / "target")
    assert seen["build"] == (["DFlash2DraftModel"], str(tmp_path / "target"), None)
    assert config == {
        "transformer_layer_config": "tl", "draft_vocab_size": 8, "block_size": 4, "aux_hidden_state_layer_ids": [2, 3],
        "mask_token_id": 7, "speculators_config": {"copied": {"algorithm": "dflash2"}},
        "conv_kernel_size": 2, "conv_group_size": 4, "selector_rank": 5, "selector_top_k": 3,
    }  # fmt: skip
    # (sliding_window_non_causal is left out: the DFlash 2 config's own default, not the DFlash 1 converter's)


# ---------------------------------------------------------------------------------------- n/a


def _without(monkeypatch, missing: str):
    real = importlib.import_module

    def imported(name, *args):
        if name.startswith("speculators"):
            raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)
        return real(name, *args)

    monkeypatch.setattr(sp.importlib, "import_module", imported)


def test_not_installed_is_na_with_the_install_line(monkeypatch, walkthrough):
    _without(monkeypatch, "speculators")
    with pytest.raises(NotApplicable) as e:
        sp.SpeculatorsPort().run(walkthrough)
    assert "pip install --no-deps speculators==0.9.0" in str(e.value) and "datasets" in str(e.value)


def test_a_missing_dependency_is_named(monkeypatch, walkthrough):
    _without(monkeypatch, "datasets")  # speculators installed --no-deps, a dependency of its import left out
    with pytest.raises(NotApplicable, match="missing: datasets"):
        sp.SpeculatorsPort().run(walkthrough)


def test_a_muse_draft_is_not_its_format():
    assert sp.SpeculatorsPort.reads_muse is False  # verify says n/a before running it (transformers' format)


def test_taps_record_under_the_step_and_undo_everything():
    lin, owner = nn.Linear(2, 3), types.SimpleNamespace(f=1)
    with Taps() as taps:
        taps.output(lin, "x.hook", lambda o: o[0])
        taps.patch(owner, "f", 2)
        taps.at(4)
        lin(torch.ones(1, 2))
        assert owner.f == 2
    assert set(taps.out) == {"step4/x.hook"} and taps.out["step4/x.hook"].shape == (3,)
    assert owner.f == 1 and not lin._forward_hooks


def test_per_head_and_concat_layouts():
    x = torch.arange(12.0).view(3, 4)  # (L, H·d_h), H = 2, d_h = 2
    assert torch.equal(per_head(x, 2)[1], x[:, 2:])  # (H, L, d_h): head 1 is columns 2, 3
    hs = [torch.full((1, 2, 3), float(i)) for i in range(4)]
    assert concat_layers(hs, [2, 2]).shape == (1, 2, 6)  # a repeated index is read twice


def _stand_in(d=4, heads=2, kv_heads=1, head_dim=2, vocab=5, k=2):
    """A module tree with the names speculators' DFlashDraftModel has (fc, hidden_norm, embed_tokens, norm, lm_head,
    layers[i].self_attn.{q_norm, k_norm, v_proj, o_proj}) and a forward that calls them in its order, with its
    shapes: keys over [every sequence position; the block], its eager kernel a module global."""
    definitions = types.SimpleNamespace()

    def eager_attention_forward(module, q, k_, v, mask, **kw):
        k_, v = (t.repeat_interleave(q.shape[1] // k_.shape[1], 1) for t in (k_, v))  # (1, H_q, L_k, d_h)
        w = (q @ k_.transpose(-1, -2) + mask).softmax(-1)  # (1, H_q, L_q, L_k)
        return (w @ v).transpose(1, 2), w

    definitions.eager_attention_forward = eager_attention_forward

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = head_dim
            self.q_proj, self.k_proj = nn.Linear(d, heads * head_dim), nn.Linear(d, kv_heads * head_dim)
            self.v_proj, self.o_proj = nn.Linear(d, kv_heads * head_dim), nn.Linear(heads * head_dim, d)
            self.q_norm, self.k_norm = nn.Identity(), nn.Identity()

        def forward(self, h, c, mask):
            q = self.q_norm(self.q_proj(h).view(1, h.shape[1], heads, head_dim)).transpose(1, 2)
            kk = torch.cat([self.k_proj(c), self.k_proj(h)], 1).view(1, -1, kv_heads, head_dim)
            v = torch.cat([self.v_proj(c), self.v_proj(h)], 1).view(1, -1, kv_heads, head_dim).transpose(1, 2)
            out, _ = definitions.eager_attention_forward(self, q, self.k_norm(kk).transpose(1, 2), v, mask)
            return self.o_proj(out.reshape(1, h.shape[1], -1))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attn()

        def forward(self, h, c, mask):
            return h + self.self_attn(h, c, mask)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.hidden_norm = nn.Linear(k * d, d), nn.Identity()
            self.embed_tokens, self.norm, self.lm_head = nn.Embedding(vocab, d), nn.Identity(), nn.Linear(d, vocab)
            self.layers = nn.ModuleList([Layer(), Layer()])

        def forward(self, features, block_ids, start):
            seq, block = features.shape[1], block_ids.shape[1]
            c = self.hidden_norm(self.fc(features))
            h = self.embed_tokens(block_ids)
            mask = torch.full((block, seq + block), float("-inf"))
            mask[:, :start] = 0.0  # the context before the anchor
            mask[:, seq:] = 0.0  # the block, non-causal
            for layer in self.layers:
                h = layer(h, c, mask)
            return self.lm_head(self.norm(h))

    return Model(), {"definitions": definitions}


def test_reader_keys_and_layouts_on_a_stand_in():
    torch.manual_seed(0)
    model, modules = _stand_in()
    step = ForcedStep(index=1, start=5, new_from=3, block_len=3, anchor=1, proposals=(2, 3))
    seq = step.start + 1 + step.block_len  # T = 9
    with torch.no_grad(), Taps() as taps:
        reader = sp._Reader(model, modules, taps)
        reader.step, reader.seq_len = step, seq
        taps.at(step.index)
        features = torch.randn(1, seq, 8)
        model(features, torch.tensor([[1, 4, 4]]), step.start)
    out, s = taps.out, "step1/"
    layouts = {
        "draft.hook_target_hidden": (2, 8),  # (L_c, k·d): the new context rows 3, 4
        "draft.context.hook_fc": (2, 4),
        "draft.context.hook_context": (2, 4),
        "draft.hook_noise_embedding": (3, 4),  # (L_q, d)
        "draft.layers.0.self_attn.hook_q": (2, 3, 2),  # (H_q, L_q, d_h)
        "draft.layers.0.self_attn.hook_k_ctx": (1, 2, 2),  # (H_kv, L_c, d_h)
        "draft.layers.0.self_attn.hook_k_noise": (1, 3, 2),
        "draft.layers.0.self_attn.hook_v": (1, 5, 2),  # (H_kv, L_c + L_q, d_h)
        "draft.layers.0.self_attn.hook_q_rot": (2, 3, 2),
        "draft.layers.0.self_attn.hook_k_rot": (1, 8, 2),  # (H_kv, start + L_q, d_h)
        "draft.layers.0.self_attn.hook_pattern": (2, 3, 8),  # (H_q, L_q, start + L_q)
        "draft.layers.0.self_attn.hook_out": (3, 4),
        "draft.layers.1.hook_resid_post": (3, 4),
        "draft.hook_out": (3, 4),
        "draft.hook_logits": (2, 5),  # (γ, V): block positions 1 …
    }
    for name, shape in layouts.items():
        assert out[s + name].shape == shape, name
    assert np.array_equal(out[s + "draft.hook_target_hidden"], features[0, 3:5].numpy())
    assert np.allclose(out[s + "draft.layers.1.self_attn.hook_pattern"].sum(-1), 1.0)  # nothing attended was cut
    assert not any(k.startswith("step1/draft.layers.0.attention_conv") for k in out)  # DFlash 1: no convolution
    assert modules["definitions"].eager_attention_forward.__name__ == "eager_attention_forward"  # undone on exit


def test_reader_refuses_weight_on_positions_after_the_anchor():
    model, modules = _stand_in()
    step = ForcedStep(index=0, start=4, new_from=0, block_len=2, anchor=1, proposals=(2,))
    forward = model.forward

    def leaking(features, block_ids, start):  # a block that also sees the sequence's positions after x_0
        return forward(features, block_ids, start + 2)

    with torch.no_grad(), Taps() as taps:
        reader = sp._Reader(model, modules, taps)
        reader.step, reader.seq_len = step, 7
        with pytest.raises(AssertionError, match="attends sequence positions"):
            leaking(torch.randn(1, 7, 8), torch.tensor([[1, 4]]), step.start)


# ---------------------------------------------------------------------------------------- the real port

HAS_SPECULATORS = importlib.util.find_spec("speculators") is not None


@pytest.mark.skipif(not HAS_SPECULATORS, reason="speculators is not installed (.ci/ports installs it)")
def test_the_real_port_passes_the_walkthrough_teacher_forced(walkthrough):
    from dflash_ref.conformance.verify import verify

    report = verify(sp.SpeculatorsPort(), walkthrough.path)
    assert report.status(walkthrough.name) == "pass", report.text()
    coverage = report.coverage(walkthrough.name)
    forced = sum(e["stage"] in TEACHER_FORCED for e in walkthrough.entries)
    assert coverage.not_compared["decoding=teacher-forced"] == forced and not coverage.waived
