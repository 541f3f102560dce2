"""The official MLX backend as a port: `dflash.model_mlx` (its DFlashDraftModel and stream_generate)
with an mlx-lm Qwen3 or Qwen3.5 target (its Gated DeltaNet states read before each verify: mlx_states.py),
run on the CPU (`pip install 'dflash-ref[mlx]'`, the `mlx-cpu` wheel),
read through wrappers around its own submodules and its decoding loop's own variables.

Its design, declared: the draft cache holds only context K/V (`context-only`), and a sliding window
bounds the context only (a rotating cache; the block sees all of its causal part: `rotating`).
It computes K/V only for the context its window keeps, and the final norm only for the positions
whose logits it takes: those leading rows are left out of its tensors (the kit allows it, manifest
`evictable_axis`).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..bundle import Bundle
from ..port import Port, check_path, loop_values, outputs, pair_scores
from ..report import NotApplicable
from ..stages import key_for
from .mlx_states import cache_length, linear_states
from .mlx_taps import Tap, Taps, as_numpy, attention_weights
from .official import official_module

MLX_HINT = "the official MLX backend needs MLX: pip install 'dflash-ref[mlx]'"


def _official():
    """dflash.model_mlx, MLX and mlx-lm imported; NotApplicable saying how to install what is missing (MLX, or
    `dflash` itself: official_module's hint)."""
    try:
        import mlx.core  # noqa: F401
        import mlx_lm.utils  # noqa: F401

        return official_module("model_mlx")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("mlx", "mlx_lm"):
            raise
        raise NotApplicable(MLX_HINT) from None


class _MLXReader(Taps):
    """Taps on one draft and target for one stream_generate call (the taps layer's, undone on exit); fills `out`
    keyed as the manifest, and `steps` with each decode step's loop values."""

    def __init__(self, draft, target) -> None:
        super().__init__()
        self.draft, self.out, self.step, self.steps = draft, {}, 0, []
        self.layer, self.in_draft, self.pending = 0, False, {}
        self.draft_lengths, self.draft_cache, self.target_cache = [], None, None
        self.target = Tap(target, self.verified, self.before_verify)  # what stream_generate is given

    def put(self, name: str, array) -> None:
        self.out[f"step{self.step}/{name}"] = array if isinstance(array, np.ndarray) else as_numpy(array)

    def tap(self, owner, name: str, seen) -> None:
        self.on(owner, name, after=lambda o, *a, **k: seen(o))

    def __enter__(self):
        import mlx.core as mx

        d = self.draft
        self.tap(d, "fc", lambda o: self.put("draft.context.hook_fc", o[0]))
        self.tap(d, "hidden_norm", lambda o: self.put("draft.context.hook_context", o[0]))
        self.tap(d, "norm", lambda o: self.put("draft.hook_out", o[0]))
        self.tap(d, "compute_logits", lambda o: self.put("draft.hook_logits", o[0]))
        taps = []
        for i, layer in enumerate(d.layers):
            p, attn = f"draft.layers.{i}.", layer.self_attn
            self.tap(attn, "q_norm", lambda o, p=p: self.put(p + "self_attn.hook_q", as_numpy(o[0].transpose(1, 0, 2))))
            self.tap(attn, "k_norm", lambda o, p=p: self.pair(p + "self_attn.hook_k_", o))
            self.tap(attn, "v_proj", lambda o, p=p: self.pair(p + "self_attn.hook_v", o))
            self.tap(attn, "o_proj", lambda o, p=p: self.put(p + "self_attn.hook_out", o[0]))
            taps.append(Tap(layer, lambda o, *a, p=p, **k: self.put(p + "hook_resid_post", o[0])))
            for name in ("attention_conv", "mlp_conv"):  # DFlash 2
                if getattr(layer, name, None) is not None:
                    self.record_conv(getattr(layer, name), f"{p}{name}.")
        self.replace(d, "layers", taps)
        if getattr(d, "candidate_selector", None) is not None:
            self.record_selector(d.candidate_selector)
        hidden_states, sdpa = d.hidden_states, mx.fast.scaled_dot_product_attention

        def draft_pass(inputs, target_hidden, cache, logits_start=0):
            self.in_draft, self.layer, self.draft_cache = True, 0, cache
            self.draft_lengths = [cache_length(cache)]
            self.put("draft.hook_target_hidden", target_hidden[0])
            self.put("draft.hook_noise_embedding", (d.embed_tokens(inputs) * d.embed_scale)[0])
            try:
                return hidden_states(inputs, target_hidden, cache, logits_start)
            finally:
                self.in_draft = False
                self.draft_lengths.append(cache_length(cache))

        self.replace(d, "hidden_states", draft_pass)

        def attention(queries, keys, values, *, scale, mask=None, **kw):
            output = sdpa(queries, keys, values, scale=scale, mask=mask, **kw)
            if self.in_draft:
                self.attention(queries, keys, values, scale, mask, output)
            return output

        self.replace(mx.fast, "scaled_dot_product_attention", attention)
        return self

    def record_conv(self, conv, prefix: str) -> None:
        """Its dynamic taps (kernel_projection's output), and prepare's and finish's outputs."""
        self.tap(
            conv,
            "kernel_projection",
            lambda o: self.put(prefix + "hook_taps", as_numpy(o[0]).reshape(o.shape[1], 2, conv.kernel_size, -1)),
        )  # (L_q, 2·K·G) → (L_q, 2, K, G)
        self.tap(conv, "prepare", lambda o: self.put(prefix + "hook_prepared", o[0][0]))
        self.tap(conv, "finish", lambda o: self.put(prefix + "hook_finished", o[0]))

    def record_selector(self, selector) -> None:
        """Its candidates and unary scores; the pair term from its own codebook and projection outputs."""
        seen = {"pred": [], "succ": [], "proj": None}
        self.tap(selector, "predecessor_codebook", lambda o: seen["pred"].append(as_numpy(o[0])))
        self.tap(selector, "successor_codebook", lambda o: seen["succ"].append(as_numpy(o[0])))
        self.tap(selector, "hidden_projection", lambda o: seen.__setitem__("proj", as_numpy(o[0])))

        def selected(out, hidden, logits, anchor_ids, temperature):
            path, candidates = as_numpy(out[0][0]), as_numpy(out[1][0])  # (γ,), (γ, K)
            unary = np.take_along_axis(as_numpy(logits[0]), candidates, axis=-1)  # (γ, K)
            pair = pair_scores(seen["pred"], seen["proj"], seen["succ"])
            seen["pred"], seen["succ"] = [], []
            if temperature == 0:
                check_path("mlx", path, candidates, unary + pair)
            self.put("draft.candidate_selector.hook_candidates", candidates)
            self.put("draft.candidate_selector.hook_unary", unary)
            self.put("draft.candidate_selector.hook_pair", pair.astype(np.float32))

        self.on(selector, "select", after=selected)

    def before_verify(self, inputs, cache=None, *args) -> None:
        """Before a decode step's verify: a hybrid's states after the previous step's rollback."""
        if self.step:
            self.out.update(linear_states(cache, self.step - 1, as_numpy))

    def verified(self, logits, inputs, cache=None, *args) -> None:
        """After each target pass: its own logits (the prefill's last position, or every row a decode step
        verified) and the cache lengths around a decode step's verify."""
        self.target_cache, length = cache, cache_length(cache)
        if self.steps and self.steps[-1][-1][5] is None:  # the previous step's crop, seen now
            self.steps[-1][-1][5] = length - inputs.shape[1]
        if self.draft_lengths:  # a decode step's verify, not the prefill
            self.out[key_for("verify_logits", self.step)] = as_numpy(logits[0])  # (L_q, V): its rows as verified
            self.draft_lengths.append(cache_length(self.draft_cache))
            self.target_lengths = [length - inputs.shape[1], length]
        else:  # a prefill chunk (it prefills in chunks, the last one position): the last chunk's is x_0's
            self.out[key_for("prefill_logits")] = as_numpy(logits[0, -1])

    def pair(self, name: str, o) -> None:
        """k_norm and v_proj run twice per layer, on the context first, then on the block."""
        self.pending.setdefault(name, []).append(o)
        if len(self.pending[name]) < 2:
            return
        ctx, block = self.pending.pop(name)
        if name.endswith("_k_"):  # (1, L, H_kv, d_h) each
            self.put(name + "ctx", as_numpy(ctx[0].transpose(1, 0, 2)))
            self.put(name + "noise", as_numpy(block[0].transpose(1, 0, 2)))
            return
        heads = self.draft.layers[0].self_attn.n_kv_heads
        both = np.concatenate([as_numpy(ctx[0]), as_numpy(block[0])], axis=0)  # (L_c + L_q, H_kv · d_h)
        self.put(name, both.reshape(both.shape[0], heads, -1).transpose(1, 0, 2))  # (H_kv, L_c + L_q, d_h)

    def attention(self, queries, keys, values, scale, mask, output) -> None:
        """q/k after RoPE as the kernel gets them, and softmax(q kᵀ · scale, masked), checked against
        the kernel's own output."""
        p, self.layer = f"draft.layers.{self.layer}.self_attn.", self.layer + 1
        weights = attention_weights(queries, keys, values, scale, mask, output, p)  # (H_q, L_q, L_k)
        q = as_numpy(queries[0])  # (H_q, L_q, d_h)
        self.put(p + "hook_q_rot", q)
        self.put(p + "hook_k_rot", as_numpy(keys[0]))
        self.put(p + "hook_pattern", weights.astype(np.float32))

    def decoded(self, loop: dict) -> None:
        """At a decode step's yield, from _stream_generate's frame: its proposals, posterior, τ, bonus."""
        lengths = self.draft_lengths + self.target_lengths + [None]  # the target's crop comes later
        self.steps.append([self.step, loop["d_list"], loop["t_list"], loop["accepted"], loop["bonus"], lengths])
        self.step += 1


@contextmanager
def _stub_tokenizer(official, stops: set[int]):
    """stream_generate wants an mlx-lm TokenizerWrapper for its stop ids and detokenizer; the bundles
    give ids only, so a stub of the kind is handed in (the wrapper class patched for its type check)."""

    class Detokenizer:
        last_segment = ""
        add_token = finalize = staticmethod(lambda *a: None)

    class Stub:
        eos_token_ids, bos_token, detokenizer = stops, None, Detokenizer()

    wrapper, official.TokenizerWrapper = official.TokenizerWrapper, Stub
    try:
        yield Stub()
    finally:
        official.TokenizerWrapper = wrapper


class MLXAdapter(Port):
    """The official MLX backend in `dflash` 0.1.0 (`dflash/model_mlx.py`), greedy. Its draft cache
    (context-only) is detected from its lengths; its sliding window is declared."""

    name = "mlx"
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    package = "dflash"  # a crash is located at this package's innermost frame (crash.py)
    variants = {"sliding_window": "rotating"}

    def load(self, bundle: Bundle):
        official = _official()
        from mlx_lm.utils import load_model

        target, _ = load_model(Path(bundle.target_dir))
        download, official.snapshot_download = official.snapshot_download, lambda repo, **kw: repo  # a local folder
        try:
            return target, official.load_draft(str(bundle.draft_dir))
        finally:
            official.snapshot_download = download

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        official = _official()
        target, draft = self.load(bundle)
        inputs, stops = bundle.inputs, set(bundle.inputs.get("stop_token_ids") or ())
        tokens = []
        with _MLXReader(draft, target) as recorder, _stub_tokenizer(official, stops) as tokenizer:
            stream = official.stream_generate(
                recorder.target,
                draft,
                tokenizer,
                inputs["input_ids"],
                block_size=inputs.get("block_size"),
                max_tokens=inputs["max_new_tokens"],
                temperature=0.0,
            )
            for response in stream:
                tokens += response.tokens
                if response.accepted is not None:  # a decode step (not the first token, not the end)
                    recorder.decoded(stream.gi_yieldfrom.gi_frame.f_locals)
        out = recorder.out
        if recorder.step:  # the last step's rollback, after its yield
            out.update(linear_states(recorder.target_cache, recorder.step - 1, as_numpy))
        for step, drafted, posterior, tau, bonus, lengths in recorder.steps:
            lengths[5] = cache_length(recorder.target_cache) if lengths[5] is None else lengths[5]
            loop_values(out, step, drafted, posterior, tau, bonus, lengths)
        return outputs(out, inputs["input_ids"], tokens, draft.config.target_layer_ids)  # x_0: its first response
