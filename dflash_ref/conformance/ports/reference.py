"""The reference as a port (port.py's contract): this package run on a golden bundle, its tensors read through
its hook points and StepRecords; and a hybrid target's states as the loop's caches hold them.

Shipped (registry.py): `reference` (this package, read through its hook points and StepRecords, here),
`zlab` (the official PyTorch code, official.py) and `mlx` (the official MLX backend, official_mlx.py).
"""

from __future__ import annotations

import numpy as np
import torch

from ...decoding import spec_generate
from ...drafts.checkpoint import load_draft
from ...loading.folder import load_target
from ...target.hybrid_cache import HybridCache
from ...threads import one_thread
from ...trace import tracing
from ..bundle import Bundle
from ..port import Port, loop_values
from ..stages import LAYER_STAGES, MODEL_STAGES, key_for
from .torch_taps import to_numpy

TRACED = list(MODEL_STAGES.values()) + [f"draft.layers.*.{name}" for name in LAYER_STAGES.values()]


class TargetStates:
    """A hybrid target's linear-layer states after each step's crop, read off the cache the loop makes
    (its make_cache wrapped): `after(step)` from on_step, which the loop calls after the crop."""

    def __init__(self, target) -> None:
        self.cache, self.out, make = None, {}, target.make_cache

        def made():
            self.cache = make()
            return self.cache

        target.make_cache = made

    def after(self, step: int) -> None:
        if not isinstance(self.cache, HybridCache):
            return
        for layer in self.cache.linear:
            conv, recurrent = self.cache.linear_state(layer)
            self.out[key_for("conv_state", step, layer)] = to_numpy(conv[0])  # (C, K − 1)
            self.out[key_for("recurrent_state", step, layer)] = to_numpy(recurrent[0])  # (H_v, d_k, d_v)


class ReferenceAdapter(Port):
    """This package. Subclass and override `load`, `generate` or `collect` to make a variant."""

    name, dtype = "reference", None  # dtype None: the bundle's own (torch.float64: its float64 twin)

    def load(self, bundle: Bundle):
        draft = load_draft(bundle.draft_dir, self.dtype)
        return load_target(bundle.target_dir, self.dtype), draft

    def keep_target_logits(self, target) -> list[torch.Tensor]:
        """The logits of every target pass, in order (the prefill's last position, then each verify's block),
        read off the target's own forward: the target's stages."""
        kept, forward = [], target.forward

        def kept_forward(*args, **kwargs):
            out = forward(*args, **kwargs)
            kept.append(out.logits[0].detach())  # (L, V): L = 1 at the prefill (logits_to_keep=1), L_q at a verify
            return out

        target.forward = kept_forward
        return kept

    def generate(self, draft, target, input_ids: torch.Tensor, inputs: dict, on_step):
        return spec_generate(
            draft,
            target,
            input_ids,
            inputs["max_new_tokens"],
            stop_token_ids=inputs.get("stop_token_ids"),
            block_size=inputs.get("block_size"),
            on_step=on_step,
        )

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        target, draft = self.load(bundle)
        input_ids, states = torch.tensor([bundle.inputs["input_ids"]]), TargetStates(target)
        self.target_logits = self.keep_target_logits(target)
        with one_thread(), tracing(draft, names=TRACED) as trace:
            output = self.generate(
                draft,
                target,
                input_ids,
                bundle.inputs,
                lambda step: (trace.on_step(step), states.after(step.index)),
            )
        return {**self.collect(draft, trace, output), **states.out}

    def collect(self, draft, trace, output) -> dict[str, np.ndarray]:
        prefill, *verifies = self.target_logits  # one target pass per step after the prefill
        out = {
            key_for("prefill_logits"): to_numpy(prefill[-1]),  # (V,)
            key_for("first_token"): to_numpy(prefill[-1].argmax()),
            key_for("layer_ids"): np.asarray(draft.target_layer_ids, np.int64),
        }
        for step, logits in enumerate(verifies):
            out[key_for("verify_logits", step)] = to_numpy(logits)  # (L_q, V)
        for step, (r, acts) in enumerate(zip(trace.records, trace.activations)):
            out.update({f"step{step}/{name}": to_numpy(t) for name, t in acts.items()})
            loop_values(
                out,
                step,
                r.draft_tokens,
                r.posterior,
                r.acceptance_length,
                r.bonus,
                [
                    r.draft_cache_before,
                    r.draft_cache_after_draft,
                    r.draft_cache_after,
                    r.target_cache_before,
                    r.target_cache_after_verify,
                    r.target_cache_after,
                ],
            )
        out[key_for("output_ids")] = to_numpy(output.output_ids[0])
        return out
