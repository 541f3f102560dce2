"""The official PyTorch code as a port: `dflash`'s DFlashDraftModel + dflash_generate with a
transformers Qwen3ForCausalLM target, read through forward hooks on its own submodules, its
attention kernel's inputs and its decoding loop's own variables (nothing of it re-implemented).

Two layouts of that code exist, and `ZLabAdapter` reads whichever `dflash.model` it finds (its
`layout` says which): the PyPI release 0.1.0 (`compute_logits`, `_crop_to`, a shrinking last block)
and the GitHub repository's current code (the target's `lm_head` applied in the loop, caches cropped
with `DynamicCache.crop`, every block drafted whole and the output truncated).
"""

from __future__ import annotations

import importlib
import sys
import time
import warnings

import numpy as np
import torch

from ...threads import one_thread
from ..bundle import Bundle
from ..port import Port, check_path, loop_values, outputs, pair_scores
from ..report import NotApplicable
from ..stages import key_for
from .torch_taps import Taps, attention_weights, bundle_dtype, load_target, quiet_transformers, to_numpy

DFLASH_HINT = "the official dflash is not installed: pip install --no-deps dflash==0.1.0"


def official_module(name: str = "model"):
    """`dflash.{name}` (model: the PyTorch code, model_mlx: the MLX backend); where `dflash` itself is not
    installed, NotApplicable saying how to install it (a module missing inside it is raised as it is)."""
    try:
        return importlib.import_module(f"dflash.{name}")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "dflash":
            raise
        raise NotApplicable(DFLASH_HINT) from None


class _OfficialReader(Taps):
    """Scoped hooks and patches around one `dflash.model.dflash_generate` call (the taps layer's, undone on
    exit); fills `out`, each tensor under the step under way (`step`)."""

    def __init__(self, official, draft, target) -> None:
        super().__init__()
        self.official, self.draft, self.target = official, draft, target
        self.layout = "0.1.0" if hasattr(official, "_crop_to") else "github"
        # 0.1.0 crops the target once after its prefill; the GitHub code first crops after a verify
        self.step, self.prefilled, self.ctx_len, self.draft_lengths = 0, self.layout == "github", 0, None
        self.target_before, self.in_target, self.target_passes = 0, False, 0

    @property
    def step(self) -> int:
        return self._step

    @step.setter
    def step(self, step: int) -> None:
        self._step = step
        self.at(step)

    def __enter__(self):
        d = self.draft

        def draft_inputs(mod, args, kwargs):
            self.ctx_len = kwargs["target_hidden"].shape[1]
            self.draft_lengths = [kwargs["past_key_values"].get_seq_length()]
            self.put("draft.hook_target_hidden", kwargs["target_hidden"][0])
            self.put("draft.hook_noise_embedding", kwargs["noise_embedding"][0])

        self.hook(d, draft_inputs, pre=True)

        def target_inputs(mod, args, kwargs):
            self.target_before, self.in_target = kwargs["past_key_values"].get_seq_length(), True

        self.hook(self.target, target_inputs, pre=True)
        self.hook(self.target, lambda m, a, o: self.target_output(o))
        self.hook(d.fc, lambda m, a, o: self.put("draft.context.hook_fc", o[0]))
        self.hook(d.hidden_norm, lambda m, a, o: self.put("draft.context.hook_context", o[0]))
        self.hook(d.norm, lambda m, a, o: self.put("draft.hook_out", o[0]))
        for i, layer in enumerate(d.layers):
            p = f"draft.layers.{i}."
            self.hook(
                layer.self_attn.q_norm, lambda m, a, o, p=p: self.put(p + "self_attn.hook_q", o[0].transpose(0, 1))
            )
            self.hook(layer.self_attn.k_norm, lambda m, a, o, p=p: self.put_k(p, o[0].transpose(0, 1)))
            self.hook(layer.self_attn.o_proj, lambda m, a, o, p=p: self.put(p + "self_attn.hook_out", o[0]))
            self.hook(layer, lambda m, a, o, p=p: self.put(p + "hook_resid_post", o[0]))
            layer.self_attn._conformance_prefix = p
            self._undo.append(lambda a=layer.self_attn: delattr(a, "_conformance_prefix"))
            for name in ("attention_conv", "mlp_conv"):  # DFlash 2
                if getattr(layer, name, None) is not None:
                    self.record_conv(getattr(layer, name), f"{p}{name}.")
        if getattr(d, "candidate_selector", None) is not None:
            self.record_selector(d.candidate_selector)
        kernel = self.official.ALL_ATTENTION_FUNCTIONS["sdpa"]
        self.patch(self.official, "ALL_ATTENTION_FUNCTIONS", {"sdpa": self.attention(kernel)})
        if self.layout == "0.1.0":
            logits_of = d.compute_logits
            self.patch(d, "compute_logits", lambda *a: self.put_logits(logits_of(*a)))
            crop_to = self.official._crop_to
            self.patch(self.official, "_crop_to", lambda cache, length: self.crop(cache, length, crop_to))
        else:  # the loop applies the target's lm_head to the draft's output, and crops caches itself
            self.hook(self.target.lm_head, lambda m, a, o: None if self.in_target else self.put_logits(o))
            recorder = self

            class Cropping(self.official.DynamicCache):
                def crop(self, length):
                    recorder.crop(self, length, lambda cache, n: super(Cropping, cache).crop(n))

            self.patch(self.official, "DynamicCache", Cropping)
        self.patch(self.official, "_cuda_time", time.perf_counter)  # it syncs CUDA even on a CPU
        return self

    def record_conv(self, conv, prefix: str) -> None:
        """Its dynamic taps (kernel_projection's output), and prepare's and finish's outputs."""
        self.hook(
            conv.kernel_projection,
            lambda m, a, o: self.put(prefix + "hook_taps", o[0].unflatten(-1, (2, conv.kernel_size, -1))),
        )  # (L_q, 2·K·G) → (L_q, 2, K, G)
        prepare, finish = conv.prepare, conv.finish

        def prepared(x):
            u, taps = prepare(x)
            self.put(prefix + "hook_prepared", u[0])
            return u, taps

        self.replace(conv, "prepare", prepared)
        self.replace(conv, "finish", lambda out, taps: self.put_out(prefix + "hook_finished", finish(out, taps)))

    def put_out(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        self.put(name, tensor[0])
        return tensor

    def record_selector(self, selector) -> None:
        """Its candidates and unary scores; the pair term from its own codebook and projection outputs."""
        seen = {"pred": [], "succ": [], "proj": None}
        self.hook(selector.predecessor_codebook, lambda m, a, o: seen["pred"].append(to_numpy(o[0])))
        self.hook(selector.successor_codebook, lambda m, a, o: seen["succ"].append(to_numpy(o[0])))
        self.hook(selector.hidden_projection, lambda m, a, o: seen.__setitem__("proj", to_numpy(o[0])))
        select = selector.select

        def selected(hidden, logits, anchor_ids, temperature):
            seen["pred"], seen["succ"] = [], []
            path, candidates, q = select(hidden, logits, anchor_ids, temperature)
            c, unary = to_numpy(candidates[0]), to_numpy(logits[0].gather(-1, candidates[0]))  # (γ, K) each
            pair = pair_scores(seen["pred"], seen["proj"], seen["succ"])
            if temperature == 0:
                check_path("zlab", to_numpy(path[0]), c, unary + pair)
            self.put("draft.candidate_selector.hook_candidates", candidates[0])
            self.put("draft.candidate_selector.hook_unary", torch.from_numpy(unary))
            self.put("draft.candidate_selector.hook_pair", torch.from_numpy(pair))
            return path, candidates, q

        self.replace(selector, "select", selected)

    def put_k(self, prefix: str, k: torch.Tensor) -> None:  # KNorm ran on [k_ctx; k_noise] at once
        self.put(prefix + "self_attn.hook_k_ctx", k[:, : self.ctx_len])
        self.put(prefix + "self_attn.hook_k_noise", k[:, self.ctx_len :])

    def target_output(self, output) -> None:
        """The target's own logits, as its forward returns them to the loop: its first pass is the prefill
        (the last position's row), each later one the verify of the step under way (every row it verified)."""
        self.in_target, logits = False, output.logits[0]  # (L, V)
        if self.target_passes == 0:
            self.out[key_for("prefill_logits")] = to_numpy(logits[-1])
        else:
            self.out[key_for("verify_logits", self.step)] = to_numpy(logits)  # (L_q, V): its rows as verified
        self.target_passes += 1

    def put_logits(self, logits: torch.Tensor) -> torch.Tensor:
        self.put("draft.hook_logits", logits[0])
        return logits

    def attention(self, kernel):
        """The official kernel, with its inputs recorded: q/k after RoPE (k with the cache), the new V,
        and the weights softmax(q kᵀ · scaling, masked), checked against the kernel's own output."""

        def wrapped(module, query, key, value, attention_mask, **kwargs):
            output = kernel(module, query, key, value, attention_mask, **kwargs)
            p = module._conformance_prefix
            new = self.ctx_len + query.shape[2]
            self.put(p + "self_attn.hook_q_rot", query[0])
            self.put(p + "self_attn.hook_k_rot", key[0])
            self.put(p + "self_attn.hook_v", value[0, :, -new:])
            weights = attention_weights(query, key, value, attention_mask, kwargs["scaling"], output[0], p)
            self.put(p + "self_attn.hook_pattern", weights[0])
            return output

        return wrapped

    def crop(self, cache, length: int, crop_to) -> None:
        """One of the official crops; at the target's crop after a verify, read the loop's own variables
        from dflash_generate's frame (two calls up: the loop called the crop that called this)."""
        before = cache.get_seq_length()
        crop_to(cache, length)
        loop = sys._getframe(2).f_locals
        if cache is loop["past_key_values_draft"]:
            self.draft_lengths += [before, cache.get_seq_length()]
        elif not self.prefilled:
            self.prefilled = True
        else:
            block, tau = loop["block_output_ids"][0].tolist(), int(loop["acceptance_length"])
            bonus = int(loop["bonus"]) if "bonus" in loop else int(loop["posterior"][0, tau])
            draft_lengths = self.draft_lengths or [loop["past_key_values_draft"].get_seq_length()] * 3
            loop_values(
                self.out,
                self.step,
                block[1:],
                loop["posterior"][0].tolist(),
                tau,
                bonus,
                draft_lengths + [self.target_before, before, cache.get_seq_length()],
            )
            self.out.update(linear_states(cache, self.step))
            self.step, self.draft_lengths = self.step + 1, None


def linear_states(cache, step: int) -> dict[str, np.ndarray]:
    """A hybrid target's DynamicCache after a crop: each linear layer's conv window (the last K − 1 of its
    K columns, (C, K − 1)) and recurrent state (H_v, d_k, d_v); nothing for a plain target."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    linear = [(i, c) for i, c in enumerate(cache.layers) if isinstance(c, LinearAttentionCacheLayerMixin)]
    return {
        **{key_for("conv_state", step, i): to_numpy(c.conv_states[0][0, :, 1:]) for i, c in linear},
        **{key_for("recurrent_state", step, i): to_numpy(c.recurrent_states[0][0]) for i, c in linear},
    }


class ZLabAdapter(Port):
    """The official PyTorch code (either layout): DFlashDraftModel + dflash_generate, a transformers target
    as its folder says (Qwen3.5 for a hybrid bundle: linear_states after each crop). `layout`: which it
    found, after a run."""

    name, layout = "zlab", None
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    package = "dflash"  # a crash is located at this package's innermost frame (crash.py)
    variants = {"sliding_window": "causal,symmetric"}  # it reads is_causal, not sliding_window_kind

    def load(self, bundle: Bundle):
        with warnings.catch_warnings():  # tqdm's notebook warning when transformers is first imported
            warnings.simplefilter("ignore")
            official = official_module()
        target = load_target(bundle)  # as its folder says: Qwen3, Qwen3.5, or the engine-shaped bundles' Llama
        architecture = (bundle.config("draft").get("architectures") or ["DFlashDraftModel"])[0]
        if not hasattr(official, architecture):  # the GitHub code has no DFlash 2
            raise NotImplementedError(f"this dflash.model has no {architecture}")
        with quiet_transformers():
            draft = getattr(official, architecture).from_pretrained(bundle.draft_dir, dtype=bundle_dtype(bundle))
        return target, draft.eval()

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        official = official_module()
        target, draft = self.load(bundle)
        inputs = bundle.inputs
        with one_thread(), _OfficialReader(official, draft, target) as recorder:
            stats = official.dflash_generate(
                draft,
                target,
                torch.tensor([inputs["input_ids"]]),
                inputs["max_new_tokens"],
                inputs.get("stop_token_ids"),
                temperature=0.0,
                block_size=inputs.get("block_size"),
                return_stats=True,
            )
        self.layout, out = recorder.layout, recorder.out
        ids, n = stats.output_ids[0].tolist(), len(inputs["input_ids"])  # x_0 is the token its loop sampled first
        outputs(out, ids[:n], ids[n:], draft.target_layer_ids)
        return out
