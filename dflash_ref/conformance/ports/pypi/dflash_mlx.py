"""dflash-mlx 0.1.8 (PyPI `dflash-mlx`, module `dflash_mlx`, bstnxbt's MLX port of DFlash) as a port of the kit.

The bundle's folders are loaded by the port's own loader (`runtime.bundle.load_runtime_bundle`: mlx-lm's `load`
for the target and its tokenizer, its own `DFlashDraftModel` for the draft, its target ops bound to both) and
decoded by its own loop (`runtime.stream_dflash_generate`, the engine `dflash-generate` runs) with the runtime
defaults `dflash-generate` uses (`build_offline_runtime_context()`: verify mode "adaptive", a draft cache of 64 sink
and 1024 window positions, prefill chunks of 2048), greedily, the prompt handed over as token ids. Its tensors are
read through stand-ins for its own draft submodules, its draft backend, its target ops and the attention function
its draft calls, and its decode loop's own variables (`SpeculativeSession._run_decode_events`), read from its frame
at the target's rollback of each step.

How its loop maps onto the kit's steps: step s is one verify of the target and the draft pass whose proposals it
verifies. The port drafts step s + 1 ahead, right after step s's rollback and before it hands out step s's tokens
(a prefetch); a draft pass is therefore given to the step of the next verify. A prefetched pass no verify follows
(the loop ended at a stop token) is no step: it is kept in `discarded`, not reported. Where the port proposes by
lookup (its CopySpecIndex, for prompts of more than 6 tokens) the step has no draft pass: its proposals are the
tokens it verified. The draft cache never holds the block (context-only), so its length after the pass is its
length at the end of the step.

Its design, declared (`variants`): a context-only draft cache that keeps the first 64 context positions (sinks)
and the last 1024 (`ContextOnlyDraftKVCache`, its runtime's `draft_sink_size` and `draft_window_size` defaults); a
sliding window read as a causal window over positions (k ≤ q and q − k < W, over context and block alike:
`DFlashAttention._attention_mask`); blocks the "adaptive" verify mode shortens to 4 after low acceptance; and
proposals by prompt lookup where it finds one.

By design it takes DFlash 1 drafts only (its loader builds DFlashDraftModel for every draft) and Qwen (qwen3,
qwen3.5) and Gemma 4 targets only (its target ops); it has no sampler (its DFlash loop decodes greedily).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ...bundle import Bundle
from ...port import Port, loop_values, outputs
from ...report import NotApplicable
from ...stages import key_for
from ..mlx_states import cache_length, linear_states
from ..mlx_taps import (
    ContextThenBlock,
    Rows,
    Tap,
    Taps,
    as_numpy,
    attention_weights,
    heads_first,
    require,
    running_locals,
)

PORT = "dflash-mlx"
VERSION = "0.1.8"
INSTALL = f"pip install 'dflash-ref[mlx]' dflash-mlx=={VERSION}"
MODULES = ("mlx.core", "mlx_lm", "dflash_mlx")

# the function of the port whose frame holds a decode step's own variables (engine/spec_epoch.py)
LOOP = "_run_decode_events"

# a draft model's submodules whose outputs are stages, as the kit keys them (the model's, then each layer's
# self_attn's); k_norm and v_proj, which run twice per pass, on the context first, then on the block, are
# ContextThenBlock's
MODEL_OUTPUTS = {"fc": "draft.context.hook_fc", "hidden_norm": "draft.context.hook_context", "norm": "draft.hook_out"}
ATTENTION_OUTPUTS = {"q_norm": "self_attn.hook_q", "o_proj": "self_attn.hook_out"}

DFLASH2_ARCHITECTURES = ("DFlash2DraftModel",)


def refusal(draft_config: dict) -> str | None:
    """Why dflash-mlx cannot take a draft by design, from its config alone (None: it can): a DFlash 2 draft,
    whose convolution and candidate selector its DFlashDraftModel does not have."""
    architectures = draft_config.get("architectures") or []
    if any(a in DFLASH2_ARCHITECTURES for a in architectures):
        return (
            f"{PORT} {VERSION} implements DFlash 1 only: its loader builds DFlashDraftModel for every draft, which "
            "has no dynamic convolution or candidate selector, so a DFlash 2 draft's weights are refused"
        )
    return None


def step_values(posterior, tau: int, proposals) -> tuple[list[int], list[int], int, int]:
    """A decode step's loop values as the port's own variables hold them → (proposals d_1 … d_γ, posterior,
    τ, bonus): the bonus is posterior[τ], the token the port stages as the next block's x_0."""
    posterior = [int(t) for t in np.asarray(posterior).reshape(-1)]  # (L_q,)
    proposals = [int(t) for t in np.asarray(proposals).reshape(-1)]  # (γ,)
    return proposals, posterior, int(tau), posterior[int(tau)]


class _Reader:
    """The taps of one run: fills `out` (manifest key → numpy array) and `steps` (step → its six cache lengths
    and loop values), reading the port's draft, draft backend and target ops."""

    def __init__(self, taps: Taps, runtime) -> None:
        self.taps, self.out, self.steps, self.discarded = taps, {}, {}, []
        self.verifies, self.draft_step, self.layer = 0, None, 0  # draft_step: the step whose pass runs, else None
        self.in_verify, self.prefill_logits, self.pairs = False, None, ContextThenBlock()
        self.features, self.fc, self.context = Rows(), Rows(), Rows()  # prompt chunks, then each commit
        self.draft_lengths: dict[int, list[int]] = {}
        self.draft_cache = self.target_cache = None
        self.bind(runtime)

    def put(self, step: int, name: str, array) -> None:
        self.out[f"step{step}/{name}"] = array if isinstance(array, np.ndarray) else as_numpy(array)

    def drafting(self) -> bool:
        return self.draft_step is not None

    # -- the draft model -------------------------------------------------------------------------------
    def bind(self, runtime) -> None:
        import dflash_mlx.model as port_model

        taps, draft = self.taps, runtime.draft_model
        # the context projection (fc, then hidden_norm) runs when the target's features are committed
        # (TargetFeatureStore): its input is the features, its outputs fc and C, for the next draft pass
        taps.on(draft, "fc", after=lambda o, x: (self.features.add(x[0]), self.fc.add(o[0])))
        taps.on(draft, "hidden_norm", after=lambda o, x: self.context.add(o[0]))
        taps.on(
            draft, "norm", after=lambda o, x: self.drafting() and self.put(self.draft_step, MODEL_OUTPUTS["norm"], o[0])
        )
        layers = []
        for i, layer in enumerate(draft.layers):
            prefix, attn = f"draft.layers.{i}.", layer.self_attn
            for name, stage in ATTENTION_OUTPUTS.items():
                taps.on(
                    attn, name, after=lambda o, x, key=prefix + stage, name=name: self.attention_output(key, name, o)
                )
            for name in ("k_norm", "v_proj"):
                taps.on(attn, name, after=lambda o, x, n=prefix, m=name, h=attn.n_kv_heads: self.pair(n, m, o, h))
            layers.append(Tap(layer, after=partial(self.leave_layer, prefix), before=partial(self.enter_layer, i)))
        taps.replace(draft, "layers", layers)
        # the attention function its draft calls (mlx-lm's, a global of its model module)
        taps.on(port_model, "scaled_dot_product_attention", after=self.attention)

        backend, ops = runtime.draft_backend, runtime.target_ops
        taps.on(backend, "draft_greedy", before=self.start_pass, after=self.end_pass)
        taps.on(backend, "advance_context", before=self.start_lookup, after=self.end_lookup)
        taps.on(ops, "logits_from_hidden", after=self.logits)
        taps.on(ops, "forward_with_hidden_capture", after=self.target_pass)
        taps.on(ops, "verify_block", before=self.start_verify, after=self.end_verify)
        taps.on(ops, "restore_after_acceptance", after=self.rolled_back)

    def take_context(self, step: int) -> None:
        """The features committed since the last pass (the prompt's, in chunks; then a verify's τ + 1 rows), with
        their fc and C: this step's new context."""
        for rows, name in ((self.features, "draft.hook_target_hidden"), (self.fc, MODEL_OUTPUTS["fc"]),
                           (self.context, MODEL_OUTPUTS["hidden_norm"])):  # fmt: skip
            array = rows.take()
            if array is not None:
                self.put(step, name, array)  # (L_c, k·d) or (L_c, d)

    def start_pass(self, **kw) -> None:
        self.draft_cache, step = kw["draft_cache"], self.verifies
        if f"step{step}/draft_tokens" in self.out:  # a pass drafted before for this step and dropped: redone
            self.discarded.append(step)
        self.take_context(step)
        self.draft_step = step
        self.draft_lengths[step] = [_draft_length(self.draft_cache)]

    def end_pass(self, drafted, **kw) -> None:
        step, self.draft_step = self.draft_step, None
        self.put(step, "draft_tokens", as_numpy(drafted).reshape(-1).astype(np.int64))  # (γ,)
        self.draft_lengths[step].append(_draft_length(self.draft_cache))

    def start_lookup(self, **kw) -> None:
        """A step proposed by lookup: the context is still projected and written to the draft cache."""
        self.draft_cache, step = kw["draft_cache"], self.verifies
        self.take_context(step)
        self.draft_lengths[step] = [_draft_length(self.draft_cache)]

    def end_lookup(self, _out, **kw) -> None:
        self.draft_lengths[self.verifies].append(_draft_length(self.draft_cache))

    def enter_layer(self, i: int, hidden, **kwargs) -> None:
        """A draft decoder layer's input: which layer runs (for the attention kernel's inputs); layer 0's is a stage."""
        self.layer = i
        if i == 0 and self.drafting():  # layer 0's input: the block's embedding (× embed_scale), as the port uses it
            self.put(self.draft_step, "draft.hook_noise_embedding", hidden[0])  # (L_q, d)

    def leave_layer(self, prefix: str, out, hidden, **kwargs) -> None:
        if self.drafting():  # each draft layer's output
            self.put(self.draft_step, prefix + "hook_resid_post", out[0])  # (L_q, d)

    def attention_output(self, key: str, name: str, o) -> None:
        if not self.drafting():
            return
        if name == "q_norm":  # (1, L_q, H_q, d_h), before RoPE
            self.put(self.draft_step, key, heads_first(as_numpy(o[0])))
        else:
            self.put(self.draft_step, key, o[0])  # o_proj: (L_q, d)

    def pair(self, prefix: str, module: str, o, kv_heads: int) -> None:
        """k_norm and v_proj run on the context first, then on the block (DFlashAttention.__call__)."""
        if not self.drafting():  # the context written by a lookup step (append_projected_context_cache)
            return
        for name, array in self.pairs.add(prefix, module, o, kv_heads).items():
            self.put(self.draft_step, name, array)

    def attention(self, output, queries, keys, values, *args, scale, mask=None, **kwargs) -> None:
        """Inside a draft pass, the draft's attention kernel's own inputs: Q and K after RoPE (K: the cached
        context, this step's included, then the block), and the weights re-derived from them under its own mask."""
        if not self.drafting():
            return
        prefix = f"draft.layers.{self.layer}.self_attn."
        weights = attention_weights(queries, keys, values, scale, mask, output, where=f"{PORT} {prefix}")
        self.put(self.draft_step, prefix + "hook_q_rot", queries[0])  # (H_q, L_q, d_h)
        self.put(self.draft_step, prefix + "hook_k_rot", keys[0])  # (H_kv, start + L_q, d_h)
        self.put(self.draft_step, prefix + "hook_pattern", weights.astype(np.float32))  # (H_q, L_q, start + L_q)

    def logits(self, o, target_model, hidden) -> None:
        if self.drafting():  # the draft's logits through the target's head: block positions 1 … L_q − 1
            self.put(self.draft_step, "draft.hook_logits", o[0])  # (γ, V)

    # -- the target ------------------------------------------------------------------------------------
    def target_pass(self, out, *args, **kw) -> None:
        logits = out[0]
        if not self.in_verify and not self.verifies and logits is not None:  # a prefill chunk that made logits
            self.prefill_logits = as_numpy(logits[0, -1])  # (V,): the last one's is x_0's

    def start_verify(self, **kw) -> None:
        self.in_verify, self.target_cache = True, kw["target_cache"]
        self.target_before = cache_length(self.target_cache)

    def end_verify(self, out, **kw) -> None:
        self.in_verify = False
        step = self.verifies
        self.out[key_for("verify_logits", step)] = as_numpy(out[0][0])  # (L_q, V): every verified row
        self.target_lengths = [self.target_before, cache_length(self.target_cache)]
        self.verifies += 1

    def rolled_back(self, _ns, cache_entries, **kw) -> None:
        """After the target's rollback of a step: the loop's own posterior, τ and proposals (its frame), the
        cache lengths, and a hybrid target's linear states."""
        step, loop = self.verifies - 1, running_locals(LOOP)
        drafted = self.out.get(f"step{step}/draft_tokens")
        proposals = drafted if drafted is not None else as_numpy(loop["verify_token_ids"])[1:]
        values = step_values(as_numpy(loop["posterior"]), int(loop["acceptance_len"]), proposals)
        now = _draft_length(self.draft_cache)
        draft = self.draft_lengths.get(step, [now, now])  # a block of 1 (no pass, no lookup): the cache untouched
        lengths = [*draft[:2], now, *self.target_lengths, cache_length(cache_entries)]
        self.steps[step] = (values, lengths)
        self.out.update(linear_states(cache_entries, step, as_numpy))

    def finish(self) -> dict[str, np.ndarray]:
        """The loop values of every step, and the draft tensors of passes no verify followed left out."""
        for step, ((proposals, posterior, tau, bonus), lengths) in self.steps.items():
            loop_values(self.out, step, proposals, posterior, tau, bonus, lengths)
            if not proposals:  # a block of one token (its last bonus verified alone): γ = 0 proposals, said so
                self.out[f"step{step}/draft_tokens"] = np.zeros(0, np.int64)  # (0,)
        dangling = {k.split("/")[0] for k in self.out if k.startswith("step")} - {f"step{s}" for s in self.steps}
        for name in sorted(dangling):
            self.discarded.append(int(name[4:]))
            for key in [k for k in self.out if k.startswith(name + "/")]:
                del self.out[key]
        return self.out


def _draft_length(cache) -> int | None:
    """The positions the draft cache of layer 0 holds (its sink and window included); None before it exists."""
    return None if cache is None else int(cache[0].cache_length())


class DFlashMLXPort(Port):
    """dflash-mlx 0.1.8, greedy, through its own loader and loop (module docstring). `version`: the release that
    ran (None where it is not installed); `discarded`: the steps of the last run whose prefetched draft pass no
    verify followed, left out of its tensors."""

    name = PORT
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    package = "dflash_mlx"  # a crash is located at this package's innermost frame (crash.py)
    variants = {
        "draft_cache": "context-only",
        "sliding_window": "causal",
        "block_length": "adaptive",
        "proposals": "draft-or-lookup",
        "draft_context_window": "1024",  # its runtime's draft_window_size default
        "draft_context_sinks": "64",  # and draft_sink_size: ContextOnlyDraftKVCache keeps both
    }
    skip: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.discarded: list[int] = []
        self.version = self.release("dflash-mlx")  # the report names the release that ran

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        why = refusal(bundle.config("draft"))
        if why:
            raise NotApplicable(why)
        require(MODULES, INSTALL)
        import dflash_mlx.engine.target_qwen_gdn as qwen_ops
        from dflash_mlx.engine.events import TokenEvent
        from dflash_mlx.runtime import stream_dflash_generate
        from dflash_mlx.runtime.bundle import load_runtime_bundle
        from dflash_mlx.runtime.context import build_offline_runtime_context

        inputs, tokens = bundle.inputs, []
        with Taps() as taps:
            _undo_class_patches(taps, qwen_ops)
            context = build_offline_runtime_context()  # dflash-generate's defaults
            try:
                runtime = load_runtime_bundle(
                    model_ref=str(bundle.target_dir), draft_ref=str(bundle.draft_dir), verify_config=context.verify
                )
            except NotImplementedError as e:  # its target ops refuse the architecture, in its words
                raise NotApplicable(f"{PORT} refuses this target: {e}") from None
            recorder = _Reader(taps, runtime)
            stream = stream_dflash_generate(
                target_model=runtime.target_model,
                target_ops=runtime.target_ops,
                tokenizer=runtime.tokenizer,
                draft_model=runtime.draft_model,
                draft_backend=runtime.draft_backend,
                max_new_tokens=inputs["max_new_tokens"],
                block_tokens=inputs.get("block_size"),
                stop_token_ids=list(inputs.get("stop_token_ids") or ()),
                prompt_tokens_override=list(inputs["input_ids"]),
                runtime_context=context,
            )
            for event in stream:
                if isinstance(event, TokenEvent):
                    tokens.append(int(event.token_id))
            out = recorder.finish()
            self.discarded = recorder.discarded
        if recorder.prefill_logits is not None:
            out[key_for("prefill_logits")] = recorder.prefill_logits
        return outputs(out, inputs["input_ids"], tokens, runtime.draft_model.target_layer_ids)  # tokens: its stream's


def _undo_class_patches(taps: Taps, qwen_ops) -> None:
    """The port's target ops replace `__call__` of mlx-lm's attention and Gated DeltaNet classes for the whole
    process (and mark the class). Each class it patches gets its own `__call__` and marks back when the run ends,
    so that another port run in the same process (the official MLX backend in `matrix`) runs mlx-lm's own."""
    for installer in ("_install_full_attention_gqa_hook", "_install_speculative_linear_cache_hook"):
        original = getattr(qwen_ops, installer)

        def install(module, original=original):
            cls = type(module)
            for name in ("__call__", "_dflash_full_attention_gqa_installed", "_dflash_speculative_call_installed"):
                taps.keep(cls, name)
            return original(module)

        taps.replace(qwen_ops, installer, install)
