"""Adapters: run one implementation of DFlash on a golden bundle; hand back its tensors by manifest key.

The protocol (what a PyTorch port implements; `verify --impl mypkg.mod:factory` calls `factory()`):

    class MyPort:
        name = "my-port"
        def run(self, bundle) -> dict[str, array]:
            # load bundle.target_dir / bundle.draft_dir (Hugging Face folders), decode
            # bundle.inputs greedily (input_ids, max_new_tokens, stop_token_ids, block_size) and
            # return what you computed, keyed as bundle.entries list them (bundle.key_for builds keys),
            # batch dimension dropped; numpy arrays, torch tensors or Python numbers.

Shipped: `reference` (this package, read through its hook points and StepRecords) and `zlab` (the
official `dflash` 0.1.0 with a transformers Qwen3ForCausalLM target, read through forward hooks on its
own submodules, its attention kernel's inputs and its decoding loop's own variables).
"""
from __future__ import annotations

import importlib
import sys
import time
import warnings

import numpy as np
import torch

from ..drafts.checkpoint import load_draft
from ..target.checkpoint import load_target
from ..decoding import spec_generate
from ..bench.timing import one_thread
from ..trace import tracing
from .bundle import LAYER_STAGES, MODEL_STAGES, Bundle, key_for

TRACED = list(MODEL_STAGES.values()) + [f"draft.layers.*.{name}" for name in LAYER_STAGES.values()]


def to_numpy(x) -> np.ndarray:
    """A tensor (any dtype; bf16 becomes float32, exactly), list or number → numpy."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.is_floating_point() else x.long()).numpy()
    return np.asarray(x, dtype=np.int64 if isinstance(x, (int, list)) else None)


def _loop_values(out: dict, step: int, draft_tokens, posterior, tau, bonus, cache_lengths) -> None:
    if len(draft_tokens):
        out[f"step{step}/draft_tokens"] = np.asarray(draft_tokens, np.int64)
    out[f"step{step}/posterior"] = np.asarray(posterior, np.int64)
    out[f"step{step}/acceptance_length"] = np.asarray(tau, np.int64)
    out[f"step{step}/bonus"] = np.asarray(bonus, np.int64)
    out[f"step{step}/cache_lengths"] = np.asarray(cache_lengths, np.int64)


class ReferenceAdapter:
    """This package. Subclass and override `load`, `generate` or `collect` to make a variant."""
    name, dtype = "reference", None       # dtype None: the bundle's own (torch.float64: its float64 twin)

    def load(self, bundle: Bundle):
        draft = load_draft(bundle.draft_dir, self.dtype)
        draft.draft_vocab = None          # bundles compare proposals over all V, as the official package makes them
        return load_target(bundle.target_dir, self.dtype), draft

    def generate(self, draft, target, input_ids: torch.Tensor, inputs: dict, on_step):
        return spec_generate(draft, target, input_ids, inputs["max_new_tokens"],
                             stop_token_ids=inputs.get("stop_token_ids"), block_size=inputs.get("block_size"),
                             on_step=on_step)

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        target, draft = self.load(bundle)
        input_ids = torch.tensor([bundle.inputs["input_ids"]])
        with one_thread(), tracing(draft, names=TRACED) as trace:
            output = self.generate(draft, target, input_ids, bundle.inputs, trace.on_step)
        return self.collect(draft, trace, output)

    def collect(self, draft, trace, output) -> dict[str, np.ndarray]:
        out = {key_for("layer_ids"): np.asarray(draft.target_layer_ids, np.int64)}
        for step, (r, acts) in enumerate(zip(trace.records, trace.activations)):
            out.update({f"step{step}/{name}": to_numpy(t) for name, t in acts.items()})
            _loop_values(out, step, r.draft_tokens, r.posterior, r.acceptance_length, r.bonus,
                         [r.draft_cache_before, r.draft_cache_after_draft, r.draft_cache_after,
                          r.target_cache_before, r.target_cache_after_verify, r.target_cache_after])
        out[key_for("output_ids")] = to_numpy(output.output_ids[0])
        return out


class _OfficialRecorder:
    """Scoped hooks and patches around one `dflash.model.dflash_generate` call; fills `out`."""

    def __init__(self, official, draft, target) -> None:
        self.official, self.draft, self.target = official, draft, target
        self.out: dict[str, np.ndarray] = {}
        self.step, self.prefilled, self.ctx_len, self.draft_lengths, self.target_before = 0, False, 0, None, 0
        self._undo: list = []

    def put(self, name: str, tensor: torch.Tensor) -> None:
        self.out[f"step{self.step}/{name}"] = to_numpy(tensor)

    def hook(self, module, fn, pre: bool = False) -> None:
        handle = (module.register_forward_pre_hook(fn, with_kwargs=True) if pre
                  else module.register_forward_hook(fn))
        self._undo.append(handle.remove)

    def patch(self, owner, name: str, value) -> None:
        old = getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old))

    def __enter__(self):
        d = self.draft

        def draft_inputs(mod, args, kwargs):
            self.ctx_len = kwargs["target_hidden"].shape[1]
            self.draft_lengths = [kwargs["past_key_values"].get_seq_length()]
            self.put("draft.hook_target_hidden", kwargs["target_hidden"][0])
            self.put("draft.hook_noise_embedding", kwargs["noise_embedding"][0])
        self.hook(d, draft_inputs, pre=True)

        def target_inputs(mod, args, kwargs):
            self.target_before = kwargs["past_key_values"].get_seq_length()
        self.hook(self.target, target_inputs, pre=True)
        self.hook(d.fc, lambda m, a, o: self.put("draft.context.hook_fc", o[0]))
        self.hook(d.hidden_norm, lambda m, a, o: self.put("draft.context.hook_context", o[0]))
        self.hook(d.norm, lambda m, a, o: self.put("draft.hook_out", o[0]))
        for i, layer in enumerate(d.layers):
            p = f"draft.layers.{i}."
            self.hook(layer.self_attn.q_norm, lambda m, a, o, p=p: self.put(p + "self_attn.hook_q", o[0].transpose(0, 1)))
            self.hook(layer.self_attn.k_norm, lambda m, a, o, p=p: self.put_k(p, o[0].transpose(0, 1)))
            self.hook(layer.self_attn.o_proj, lambda m, a, o, p=p: self.put(p + "self_attn.hook_out", o[0]))
            self.hook(layer, lambda m, a, o, p=p: self.put(p + "hook_resid_post", o[0]))
            layer.self_attn._conformance_prefix = p
            self._undo.append(lambda a=layer.self_attn: delattr(a, "_conformance_prefix"))
        kernel = self.official.ALL_ATTENTION_FUNCTIONS["sdpa"]
        self.patch(self.official, "ALL_ATTENTION_FUNCTIONS", {"sdpa": self.attention(kernel)})
        logits_of = d.compute_logits
        self.patch(d, "compute_logits", lambda *a: self.put_logits(logits_of(*a)))
        self.patch(self.official, "_crop_to", self.crop(self.official._crop_to))
        self.patch(self.official, "_cuda_time", time.perf_counter)  # 0.1.0 syncs CUDA even on CPU
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def put_k(self, prefix: str, k: torch.Tensor) -> None:  # KNorm ran on [k_ctx; k_noise] at once
        self.put(prefix + "self_attn.hook_k_ctx", k[:, :self.ctx_len])
        self.put(prefix + "self_attn.hook_k_noise", k[:, self.ctx_len:])

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
            groups = query.shape[1] // key.shape[1]
            k, v = (t.float().repeat_interleave(groups, dim=1) for t in (key, value))  # (B, H_q, L_k, d_h)
            scores = query.float() @ k.transpose(-1, -2) * kwargs["scaling"]
            if attention_mask is not None:
                scores = (scores.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool
                          else scores + attention_mask.float())
            weights = scores.softmax(-1)
            derived = (weights @ v).transpose(1, 2)                        # (B, L_q, H_q, d_h)
            tol = 3e-2 if query.dtype == torch.bfloat16 else 1e-4
            if not torch.allclose(derived, output[0].float(), atol=tol * max(1.0, float(derived.abs().max()))):
                raise AssertionError(f"{p}: re-derived attention weights do not reproduce the kernel's output")
            self.put(p + "self_attn.hook_pattern", weights[0])
            return output
        return wrapped

    def crop(self, crop_to):
        """The official crops; at the target's crop after a verify, read the loop's own variables."""
        def wrapped(cache, length):
            before = cache.get_seq_length()
            crop_to(cache, length)
            loop = sys._getframe(1).f_locals  # dflash_generate's frame: its τ, bonus, posterior, block
            if cache is loop["past_key_values_draft"]:
                self.draft_lengths += [before, cache.get_seq_length()]
            elif not self.prefilled:
                self.prefilled = True
            else:
                block = loop["block_output_ids"][0].tolist()
                draft_lengths = self.draft_lengths or [loop["past_key_values_draft"].get_seq_length()] * 3
                _loop_values(self.out, self.step, block[1:], loop["posterior"][0].tolist(),
                             int(loop["acceptance_length"]), int(loop["bonus"]),
                             draft_lengths + [self.target_before, before, cache.get_seq_length()])
                self.step, self.draft_lengths = self.step + 1, None
        return wrapped


class ZLabAdapter:
    """The official `dflash` 0.1.0: DFlashDraftModel + dflash_generate, transformers Qwen3 target."""
    name = "zlab"

    def load(self, bundle: Bundle):
        with warnings.catch_warnings():  # tqdm's notebook warning when transformers is first imported
            warnings.simplefilter("ignore")
            import transformers
            from dflash import model as official

        dtype = torch.bfloat16 if bundle.config("draft").get("dtype") == "bfloat16" else torch.float32
        log = transformers.utils.logging
        verbosity, bars = log.get_verbosity(), log.is_progress_bar_enabled()
        log.set_verbosity_error()
        log.disable_progress_bar()
        try:
            target = transformers.Qwen3ForCausalLM.from_pretrained(bundle.target_dir, dtype=dtype).eval()
            draft = official.DFlashDraftModel.from_pretrained(bundle.draft_dir, dtype=dtype).eval()
        finally:
            log.set_verbosity(verbosity)
            if bars:
                log.enable_progress_bar()
        return target, draft

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        from dflash import model as official

        target, draft = self.load(bundle)
        inputs = bundle.inputs
        with one_thread(), _OfficialRecorder(official, draft, target) as recorder:
            stats = official.dflash_generate(draft, target, torch.tensor([inputs["input_ids"]]),
                                             inputs["max_new_tokens"], inputs.get("stop_token_ids"),
                                             block_size=inputs.get("block_size"), return_stats=True)
        out = recorder.out
        out[key_for("layer_ids")] = np.asarray(draft.target_layer_ids, np.int64)
        out[key_for("output_ids")] = to_numpy(stats.output_ids[0])
        return out


ADAPTERS = {"reference": ReferenceAdapter, "zlab": ZLabAdapter}


def resolve(spec: str):
    """"reference" | "zlab" | "package.module:factory" (factory() returns an adapter or a run function)."""
    if spec in ADAPTERS:
        return ADAPTERS[spec]()
    if ":" not in spec:
        raise ValueError(f"unknown implementation {spec!r}: use one of {sorted(ADAPTERS)} or module:factory")
    module, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"implementation {spec!r}: no factory {attr!r} in module {module!r} ({e})") from None
    return factory()
