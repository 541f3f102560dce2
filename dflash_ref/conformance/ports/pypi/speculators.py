"""speculators (vLLM project's training library for speculative-decoding drafts; PyPI `speculators` 0.9.0) as a
port of the kit, teacher-forced: its DFlash draft (`speculators.models.dflash.DFlashDraftModel`) and DFlash 2 draft
(`speculators.models.dflash2.DFlash2DraftModel`) run their own training forward on what DFlash feeds the draft at
each step of the bundle's reference walk, read through hooks on their own modules. A training library has no
decoding loop, so the loop's stages (the target's logits, posterior, τ, bonus, cache lengths, output ids) are not
the port's and are not produced: it declares `decoding=teacher-forced` (variants.py), under which they are not
compared and its draft's stages, its proposals included, are.

How a user gets a speculators model from a DFlash checkpoint, and so how the draft is loaded here:
DFlash 1 by the port's own converter (`speculators.convert.entrypoints.convert_model(..., algorithm="dflash")`,
what `SpeculatorModel.from_pretrained(dir, verifier=...)` runs on an external checkpoint), then
`DFlashDraftModel.from_pretrained` of what it wrote. The port has no DFlash 2 converter (its auto-conversion sends a
DFlash 2 checkpoint to the DFlash 1 converter, which refuses its keys): a DFlash 2 draft's config is translated
here (`dflash2_config`: the DFlash 1 converter's own translation of the shared fields, plus DFlash 2's four from
`dflash_config`, same names) and its weights loaded by name, which the port's modules share with the checkpoint.

At step s (torch_taps.ForcedStep) the port's forward gets one training sequence, its context the committed tokens
(the bundle's expected output ids up to x_0) and L_q positions after x_0, with one anchor, at x_0's position:

    hidden_states                (1, T, k·d)  transformers' hidden_states[i] of the bundle's target, i over the
                                              config's `aux_hidden_state_layer_ids` (the port's convention: the
                                              index into hidden_states, the official id + 1, its converter says)
    verifier_last_hidden_states  (1, T, d)    hidden_states[-1] (the port's loss only)
    input_ids                    (1, T)       output_ids[:start + 1] + L_q fillers (DFlash 2: d_1 … d_γ first)
    loss_mask                    (1, T)       1 at `start` alone: the port's anchor sampling can pick only it
    document_ids                 (1, T)       0: one document
    model.block_size             L_q          the step's block (DFlash shrinks the last one), for this call

The port's attention runs its eager path (`_attn_implementation = "eager"`: transformers' eager kernel returns
its weights, and the port's mask becomes a dense float mask), and its keys are [every position of the
sequence; the block]: the keys DFlash's block attends are the first `start` and the block's, the rest masked
(checked: exactly 0 weight there, else the adapter raises).

DFlash 2: the port has no greedy walk; its selector (`CandidateSelector.select`, its own inference method) scores
the unary top-K with the predecessors its training forward reads (`_predecessor_ids`: the block's own tokens, one
to the right), which are the reference's proposals here (teacher-forced on the reference's path), and the
proposals are the argmax of its scores.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from ....threads import one_thread
from ...bundle import Bundle
from ...port import Port
from ...report import NotApplicable
from ...stages import key_for
from ..torch_taps import (
    ForcedStep,
    Taps,
    bundle_dtype,
    concat_layers,
    forced_ids,
    load_target,
    per_head,
    quiet_transformers,
    target_hidden_states,
    teacher_forced_steps,
    to_numpy,
)

INSTALL = (
    "speculators is not installed: pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0 && "
    "pip install pydantic pydantic-settings loguru rich click typer openai huggingface-hub 'datasets>=4,<=5.1'"
)

# the DFlash 2 fields of a speculators DFlash2SpeculatorConfig, from the official config's `dflash_config`
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# the fields of a speculators DFlash config its converter sets (the rest are the port's defaults)
CONVERTED_FIELDS = (
    "transformer_layer_config",
    "draft_vocab_size",
    "block_size",
    "aux_hidden_state_layer_ids",
    "mask_token_id",
    "speculators_config",
)


def import_speculators():
    """The port's modules {name: module}; NotApplicable with the install line where `speculators` is missing."""
    names = {
        "dflash": "speculators.models.dflash",
        "dflash2": "speculators.models.dflash2",
        "definitions": "speculators.models.dflash.model_definitions",
        "converter": "speculators.convert.dflash.converter",
        "entrypoints": "speculators.convert.entrypoints",
    }
    try:
        with quiet_transformers():
            return {key: importlib.import_module(name) for key, name in names.items()}
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "speculators":
            # a dependency speculators imports (it was installed --no-deps): the same line, naming what is missing
            raise NotApplicable(f"{INSTALL} (missing: {e.name})") from None
        raise NotApplicable(INSTALL) from None


@contextlib.contextmanager
def quiet_port():
    """The port's own log lines (loguru's, its converter's) and transformers' messages off for the run."""
    from loguru import logger  # speculators' logging library: importable wherever speculators is

    logger.disable("speculators")
    try:
        with quiet_transformers():
            yield
    finally:
        logger.enable("speculators")


def kit_layer_ids(aux_ids: list[int]) -> list[int]:
    """The port's `aux_hidden_state_layer_ids` (indices into transformers' hidden_states) → the kit's layer ids
    (layer l read at hidden_states[l + 1])."""
    return [i - 1 for i in aux_ids]


def is_dflash2(draft_config: dict) -> bool:
    """Whether an official draft config is a DFlash 2 one (its architecture, or DFlash 2's fields)."""
    architectures = draft_config.get("architectures") or []
    fields = draft_config.get("dflash_config") or {}
    return "DFlash2DraftModel" in architectures or any(f in fields for f in DFLASH2_FIELDS)


def dflash2_fields(draft_config: dict) -> dict:
    """DFlash 2's fields of an official config (`dflash_config`'s conv_kernel_size, conv_group_size, selector_rank,
    selector_top_k, the same names in speculators' DFlash2SpeculatorConfig); those it lacks are left to the port's
    defaults."""
    fields = draft_config.get("dflash_config") or {}
    return {f: fields[f] for f in DFLASH2_FIELDS if f in fields}


def dflash2_config(modules, draft_dir: Path, target_dir: Path):
    """A speculators DFlash2SpeculatorConfig for an official DFlash 2 draft: the port's DFlash 1 converter's own
    translation of the fields both share (CONVERTED_FIELDS; algorithm "dflash2"), then DFlash 2's own."""
    source = json.loads((draft_dir / "config.json").read_text())
    converted = modules["converter"].DFlashConverter()._build_config(source, str(target_dir), None)
    shared = {f: getattr(converted, f) for f in CONVERTED_FIELDS}
    shared["speculators_config"] = shared["speculators_config"].model_copy(update={"algorithm": "dflash2"})
    return modules["dflash2"].DFlash2SpeculatorConfig(**shared, **dflash2_fields(source))


def load_draft(modules, bundle: Bundle, scratch: Path):
    """The bundle's draft as a speculators model, in the bundle's dtype, eval mode, eager attention."""
    dtype = bundle_dtype(bundle)
    if not is_dflash2(bundle.config("draft")):
        converted = scratch / "speculators_draft"
        modules["entrypoints"].convert_model(
            model=str(bundle.draft_dir), verifier=str(bundle.target_dir), algorithm="dflash", output_path=str(converted)
        )
        config = modules["dflash"].DFlashSpeculatorConfig.from_pretrained(converted)
        config.transformer_layer_config._attn_implementation = "eager"  # the kernel that returns its weights
        model = modules["dflash"].DFlashDraftModel.from_pretrained(converted, config=config, dtype=dtype)
        return model.eval()
    config = dflash2_config(modules, bundle.draft_dir, bundle.target_dir)
    config.transformer_layer_config._attn_implementation = "eager"
    model = modules["dflash2"].DFlash2DraftModel(config)
    missing, unexpected = model.load_state_dict(load_file(bundle.draft_dir / "model.safetensors"), strict=False)
    verifier_filled = {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
    if unexpected or set(missing) - verifier_filled:
        raise ValueError(f"the DFlash 2 draft's weights do not fit speculators' DFlash2DraftModel: "
                         f"unexpected {unexpected}, missing {sorted(set(missing) - verifier_filled)}")  # fmt: skip
    model.load_verifier_weights()  # embed_tokens, lm_head, verifier norm from the target, as the port does
    return model.to(dtype).eval()


class _Reader:
    """The hooks on one speculators draft: per step, its own tensors under the manifest's keys (Taps)."""

    def __init__(self, model, modules, taps: Taps) -> None:
        self.model, self.taps = model, taps
        self.step: ForcedStep | None = None
        self.seq_len = 0  # T, the training sequence's length this call
        self.logits: torch.Tensor | None = None  # (1, L_q, V), kept for the selector
        self.hidden: torch.Tensor | None = None  # (1, L_q, d)
        m = model
        taps.call(m.fc, lambda mod, a, kw: self.put_rows("draft.hook_target_hidden", a[0]), pre=True)
        taps.output(m.fc, "draft.context.hook_fc", self.context_rows)
        taps.output(m.hidden_norm, "draft.context.hook_context", self.context_rows)
        taps.output(m.embed_tokens, "draft.hook_noise_embedding", lambda o: o[0])  # (L_q, d): [x_0, mask, …]
        taps.call(m.norm, lambda mod, a, kw, o: self.keep("hidden", o))
        taps.output(m.norm, "draft.hook_out", lambda o: o[0])
        taps.call(m.lm_head, lambda mod, a, kw, o: self.keep("logits", o))
        taps.output(m.lm_head, "draft.hook_logits", lambda o: o[0, 1:])  # (γ, V): position 0 is x_0
        for i, layer in enumerate(m.layers):
            p, attn = f"draft.layers.{i}.", layer.self_attn
            attn._conformance_prefix = p
            taps._undo.append(lambda a=attn: delattr(a, "_conformance_prefix"))
            taps.output(attn.q_norm, p + "self_attn.hook_q", lambda o: o[0].transpose(0, 1))  # (H_q, L_q, d_h)
            taps.call(attn.k_norm, lambda mod, a, kw, o, p=p: self.put_k(p, o[0].transpose(0, 1)))
            taps.call(attn.v_proj, lambda mod, a, kw, o, p=p, d=attn.head_dim: self.put_v(p, o[0], d))
            taps.output(attn.o_proj, p + "self_attn.hook_out", lambda o: o[0])  # (L_q, d)
            taps.output(layer, p + "hook_resid_post", lambda o: o[0])  # (L_q, d)
            for name in ("attention_conv", "mlp_conv"):  # DFlash 2
                if getattr(layer, name, None) is not None:
                    self.record_conv(getattr(layer, name), f"{p}{name}.")
        taps.patch(modules["definitions"], "eager_attention_forward", self.attention(modules["definitions"]))
        self._v: dict[str, list[torch.Tensor]] = {}

    # --- rows of the training sequence the kit's layout keeps
    def context_rows(self, output) -> torch.Tensor:
        """(1, T, ·) → the step's new context rows (L_c, ·)."""
        return output[0, self.step.new_context]

    def put_rows(self, name: str, tensor: torch.Tensor) -> None:
        self.taps.put(name, self.context_rows(tensor))

    def keep(self, name: str, output) -> None:
        setattr(self, name, output.detach())

    def put_k(self, prefix: str, k: torch.Tensor) -> None:
        """KNorm of [every sequence position; the block] at once, (H_kv, T + L_q, d_h): the new context's rows and
        the block's."""
        self.taps.put(prefix + "self_attn.hook_k_ctx", k[:, self.step.new_context])
        self.taps.put(prefix + "self_attn.hook_k_noise", k[:, self.seq_len :])

    def put_v(self, prefix: str, v: torch.Tensor, head_dim: int) -> None:
        """v_proj runs twice: on the context features (T rows), then on the block (L_q rows); V is the new context's
        rows, then the block's, per head."""
        if v.shape[0] == self.seq_len:
            self._v[prefix] = [v[self.step.new_context]]  # (L_c, H_kv·d_h)
            return
        context = self._v.pop(prefix)[0]
        both = torch.cat([context, v])  # (L_c + L_q, H_kv·d_h)
        self.taps.put(prefix + "self_attn.hook_v", per_head(both, head_dim))  # (H_kv, L_c + L_q, d_h)

    def attended(self, x: torch.Tensor) -> torch.Tensor:
        """(…, T + L_q, ·) keys' axis −2 → the keys DFlash's block attends: positions 0 … start − 1, the block."""
        return torch.cat([x[..., : self.step.start, :], x[..., self.seq_len :, :]], dim=-2)

    def attention(self, definitions):
        """The port's eager kernel (its attention's module global), its inputs and weights recorded."""
        kernel = definitions.eager_attention_forward

        def wrapped(module, query, key, value, attention_mask, **kwargs):
            output, weights = kernel(module, query, key, value, attention_mask, **kwargs)
            p = module._conformance_prefix
            self.taps.put(p + "self_attn.hook_q_rot", query[0])  # (H_q, L_q, d_h)
            self.taps.put(p + "self_attn.hook_k_rot", self.attended(key[0]))  # (H_kv, start + L_q, d_h)
            w = weights[0].transpose(-1, -2)  # (H_q, T + L_q, L_q): keys on axis −2
            outside = w[:, self.step.start : self.seq_len]  # the sequence's positions from x_0's on
            if float(outside.abs().max()) != 0.0:
                raise AssertionError(
                    f"{p}: the port's block attends sequence positions ≥ start {self.step.start} "
                    f"(weight {float(outside.abs().max()):.3g}): keys DFlash's context does not hold"
                )
            self.taps.put(p + "self_attn.hook_pattern", self.attended(w).transpose(-1, -2))  # (H_q, L_q, start + L_q)
            return output, weights

        return wrapped

    def record_conv(self, conv, prefix: str) -> None:
        """DFlash 2: its dynamic taps (kernel_projection's output), prepare's and finish's outputs."""
        self.taps.output(
            conv.kernel_projection,
            prefix + "hook_taps",
            lambda o: o[0].unflatten(-1, (2, conv.kernel_size, -1)),  # (L_q, 2·K·G) → (L_q, 2, K, G)
        )
        prepare, finish = conv.prepare, conv.finish

        def prepared(x):
            u, taps = prepare(x)
            self.taps.put(prefix + "hook_prepared", u[0])  # (L_q, d)
            return u, taps

        def finished(out, taps):
            y = finish(out, taps)
            self.taps.put(prefix + "hook_finished", y[0])  # (L_q, d)
            return y

        self.taps.replace(conv, "prepare", prepared)
        self.taps.replace(conv, "finish", finished)


class SpeculatorsPort(Port):
    """speculators 0.9.0's DFlash and DFlash 2 drafts, teacher-forced on each bundle's reference walk (module
    docstring). `version`: the release that ran."""

    name = "speculators"
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    package = "speculators"  # a crash is located at this package's innermost frame (crash.py)
    # a training library has no decoding loop: the loop's stages (and the target's) are not the port's
    variants = {"decoding": "teacher-forced"}

    def __init__(self) -> None:
        self.version = self.release("speculators")  # the report names the release that ran

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        modules = import_speculators()
        steps = teacher_forced_steps(bundle)
        with tempfile.TemporaryDirectory() as scratch, quiet_port():
            draft = load_draft(modules, bundle, Path(scratch))
        out = {key_for("layer_ids"): np.asarray(kit_layer_ids(draft.target_layer_ids), np.int64)}
        if not steps:  # no decode step (x_0 a stop token): nothing for a draft to do
            return out
        target = load_target(bundle)
        mask = draft.mask_token_id
        dflash2 = getattr(draft, "candidate_selector", None) is not None
        with one_thread(), torch.no_grad(), Taps() as taps:
            reader = _Reader(draft, modules, taps)
            for step in steps:
                ids = forced_ids(bundle, step, mask, block_tokens=dflash2)
                out.update(self.forward(draft, target, reader, step, ids))
            out.update(taps.out)
        return out

    def forward(self, draft, target, reader: _Reader, step: ForcedStep, ids: list[int]) -> dict[str, np.ndarray]:
        """One training forward of the port with one anchor, at x_0's position; the step's proposals."""
        hidden = target_hidden_states(target, ids)
        seq_len = len(ids)  # T = start + 1 + L_q
        reader.step, reader.seq_len = step, seq_len
        reader.taps.at(step.index)
        loss_mask = torch.zeros(1, seq_len, dtype=torch.long)  # (1, T)
        loss_mask[0, step.start] = 1
        # the port's own trainer arguments (its eager losses: the fused ones need Triton), one anchor
        trainer = {**type(draft).get_trainer_kwargs(loss_fn="kl_div", loss_implementation="eager")[0], "max_anchors": 1}
        block_size = draft.block_size
        draft.block_size = step.block_len
        try:
            draft(
                hidden_states=concat_layers(hidden, draft.target_layer_ids),  # (1, T, k·d)
                input_ids=torch.tensor([ids]),  # (1, T)
                loss_mask=loss_mask,
                verifier_last_hidden_states=hidden[-1],  # (1, T, d)
                document_ids=torch.zeros(1, seq_len, dtype=torch.long),  # (1, T)
                **trainer,
            )
            if getattr(draft, "candidate_selector", None) is None:  # DFlash 1: the argmax of the draft logits
                return {f"step{step.index}/draft_tokens": to_numpy(reader.logits[0, 1:].argmax(-1))}
            return self.select(draft, reader, step, ids)
        finally:
            draft.block_size = block_size

    def select(self, draft, reader: _Reader, step: ForcedStep, ids: list[int]) -> dict[str, np.ndarray]:
        """DFlash 2: the port's selector on its own hidden states and logits, the predecessors its training forward
        reads (`_predecessor_ids`), its pair term read off its own `transition_scores`; proposals the argmax."""
        selector, seen = draft.candidate_selector, {}
        transition = selector.transition_scores

        def recorded(*args):
            seen["pair"] = transition(*args)
            return seen["pair"]

        block = torch.arange(step.start, step.start + step.block_len)  # (L_q,)
        predecessors = draft._predecessor_ids(torch.tensor([ids]), block)  # (1, L_q)
        selector.transition_scores = recorded
        try:
            candidates, scores = selector.select(reader.logits, reader.hidden, predecessors)  # (1, L_q, K) each
        finally:
            del selector.transition_scores
        candidates, scores, pair = candidates[0, 1:], scores[0, 1:], seen["pair"][0, 1:]  # (γ, K) each
        s = f"step{step.index}/"
        return {
            s + "draft.candidate_selector.hook_candidates": to_numpy(candidates),
            s + "draft.candidate_selector.hook_unary": to_numpy(reader.logits[0, 1:].gather(-1, candidates)),
            s + "draft.candidate_selector.hook_pair": to_numpy(pair),
            s + "draft_tokens": to_numpy(candidates.gather(-1, scores.argmax(-1, keepdim=True))[:, 0]),
        }
