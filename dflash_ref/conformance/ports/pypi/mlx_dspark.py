"""mlx-dspark 0.20.3 (PyPI, module `mlx_dspark`) as a port of the kit: its DFlash path alone.

mlx-dspark is a speculative-decoding package for MLX whose main drafter is DeepSeek's DSpark; beside it, it runs
z-lab's DFlash checkpoints: `load_dflash` builds its `DFlashDraftModel` (a copy of an older official MLX draft
model), `load_target` wraps an mlx-lm model in its own `Target` (a replicated forward that taps the residual stream
after the `target_layer_ids` layers), and `dflash_generate` is its own draft / verify / accept loop. This adapter
loads a bundle the way `load_dflash_pair` does (local folders; the draft unquantized, `quantize=False`, its
documented full-precision option), runs `dflash_generate` greedily on `bundle.inputs`, and reads every tensor off
the port: stand-ins for its draft's submodules and its `Target`'s methods, `mx.fast.scaled_dot_product_attention`'s
own inputs (the attention weights re-derived from them and checked against the kernel's output), and the loop's own
variables (`drafted`, `tt`, `n`, `head`), read from `dflash_generate`'s frame at its `on_round` callback.

Its design, declared (`variants`):
- `draft_cache=context-only`: its draft caches hold context K/V only; the block's are concatenated fresh each pass.
- `last_block=full-then-truncate`: it always drafts and verifies the whole block ("the backbone always drafts
  the full block width"), also where fewer tokens remain.
- `sliding_window=causal`: a sliding draft layer keeps the last W − 1 context rows and masks k ≤ q, q − k < W over
  [context; block] (mlx-lm's `create_causal_mask` with `window_size`): the causal reading, its only one.
Stop tokens reach it as its tokenizer's end-of-turn ids (`generate.eos_token_ids`); the bundle's stop ids are
handed over as a tokenizer whose stop set is exactly theirs (`StopTokenizer`).
"""

from __future__ import annotations

import numpy as np

from ...bundle import Bundle
from ...port import Port, check_path, loop_values, outputs, pair_scores
from ...report import NotApplicable
from ...stages import key_for
from ..mlx_states import cache_length, linear_states
from ..mlx_taps import (
    ContextThenBlock,
    Gathered,
    Tap,
    Taps,
    as_numpy,
    attention_weights,
    heads_first,
    require,
    running_locals,
)

PORT = "mlx-dspark"
VERSION = "0.20.3"
INSTALL = f"pip install 'dflash-ref[mlx]' mlx-dspark=={VERSION}"
# The top-level modules the install line brings (mlx_dspark's DSpark drafter imports mlx-vlm's RoPE helper; pip
# brings mlx-vlm in as mlx-dspark's own requirement): a missing one is the same advice, the install line.
IMPORTS = ("mlx", "mlx_lm", "mlx_vlm", "mlx_dspark")


def port_modules():
    """(mlx_dspark, its generate module); NotApplicable with the install line where it, MLX or a requirement of
    it is missing (another missing module is its own import error, raised)."""
    require(("mlx.core", "mlx_dspark", "mlx_dspark.generate"), INSTALL, installs=IMPORTS)
    import mlx_dspark
    import mlx_dspark.generate as generate

    return mlx_dspark, generate


class StopTokenizer:
    """The tokenizer handed to `dflash_generate`: the target's own (mlx-lm's TokenizerWrapper, for decoding),
    with the bundle's stop ids as its whole stop set. The port collects stops from `eos_token_ids`,
    `eos_token_id` and a list of end-of-turn names looked up with `convert_tokens_to_ids` (`<|im_end|>`,
    `<|endoftext|>`, …); here the first is the bundle's, the second None, and no name resolves, so it stops
    where the bundle says and nowhere else."""

    def __init__(self, tokenizer, stops) -> None:
        self.__dict__.update(_tokenizer=tokenizer, eos_token_ids=set(int(t) for t in stops or ()))

    eos_token_id = None
    unk_token_id = None

    def convert_tokens_to_ids(self, token):
        raise KeyError(token)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def predecessor_rows(candidates: np.ndarray, path: np.ndarray) -> list[int]:
    """Which row of the port's predecessor gather each slot's chosen predecessor is: slot 0 reads the anchor
    (every row holds it: 0), slot t the candidate of slot t − 1 that its path took. candidates (γ, K), path (γ,)."""
    rows = [0]
    for t in range(1, len(path)):
        hits = np.flatnonzero(candidates[t - 1] == path[t - 1])
        if not len(hits):
            raise AssertionError(f"{PORT}: its path's token {int(path[t - 1])} is not among slot {t - 1}'s candidates")
        rows.append(int(hits[0]))
    return rows


def selector_pair(pred: np.ndarray, proj: np.ndarray, succ: np.ndarray, candidates, path) -> np.ndarray:
    """The pair term (γ, K) along the port's path from its own gathers: `pred` (γ, K, r) its predecessor codebook
    rows, `proj` (γ, r) its hidden projection, `succ` (γ, K, r) its successor codebook rows (port.pair_scores)."""
    rows = predecessor_rows(np.asarray(candidates), np.asarray(path))
    return pair_scores([pred[t, j] for t, j in enumerate(rows)], proj, list(succ))


def conv_taps(projection: np.ndarray, taps: int) -> np.ndarray:
    """Its `kernel_projection` output (L_q, 2·K·G) → (L_q, 2, K, G): [:, 0] prepare's taps, [:, 1] finish's
    (the order its `prepare` reshapes them in)."""
    return projection.reshape(projection.shape[0], 2, taps, -1)  # (L_q, 2, K, G)


class Reader:
    """Taps on one run of `dflash_generate`: fills `out` keyed as the manifest and `steps` with each round's loop
    values. Draft tensors are keyed by the round in progress (`step`), counted up at each `on_round`."""

    def __init__(self, target, drafter) -> None:
        self.target, self.drafter, self.cfg = target, drafter, drafter.config
        self.out, self.steps, self.step = {}, [], 0
        self.layer, self.in_draft, self.pairs = 0, False, ContextThenBlock()
        self.lengths: list = []
        self.selected: dict = {}
        self.taps = Taps()

    def put(self, name: str, array) -> None:
        self.out[f"step{self.step}/{name}"] = array if isinstance(array, np.ndarray) else as_numpy(array)

    # -- installing the taps --------------------------------------------------------------------------------

    def __enter__(self):
        import mlx.core as mx

        d, taps = self.drafter, self.taps
        taps.on(d, "forward_hidden", after=self.after_pass, before=self.before_pass)
        taps.on(d, "fc", after=lambda o, *a: self.put("draft.context.hook_fc", o[0]))  # (L_c, d)
        taps.on(d, "hidden_norm", after=lambda o, *a: self.put("draft.context.hook_context", o[0]))  # (L_c, d)
        taps.on(d, "norm", after=lambda o, *a: self.put("draft.hook_out", o[0]))  # (L_q − 1, d): it norms rows 1 …
        layers = []
        for i, layer in enumerate(d.layers):
            prefix, attn = f"draft.layers.{i}.", layer.self_attn
            taps.on(
                attn,
                "q_norm",
                after=lambda o, *a, n=prefix: self.put(n + "self_attn.hook_q", heads_first(as_numpy(o[0]))),
            )
            for name in ("k_norm", "v_proj"):
                taps.on(attn, name, after=lambda o, *a, n=prefix, m=name, h=attn.n_kv_heads: self.pair(n, m, o, h))
            taps.on(attn, "o_proj", after=lambda o, *a, n=prefix: self.put(n + "self_attn.hook_out", o[0]))  # (L_q, d)
            layers.append(  # its output (L_q, d); layer 0's input (entering)
                Tap(layer, lambda o, *a, n=prefix, **k: self.put(n + "hook_resid_post", o[0]), self.entering(i))
            )
            for name in ("attention_conv", "mlp_conv"):  # DFlash 2
                if getattr(layer, name, None) is not None:
                    self.conv(getattr(layer, name), f"{prefix}{name}.")
        taps.replace(d, "layers", layers)
        if getattr(d, "candidate_selector", None) is not None:
            self.selector(d.candidate_selector)
        taps.on(mx.fast, "scaled_dot_product_attention", after=self.attention)
        t = self.target
        taps.on(t, "prefill", after=self.prefilled)
        taps.on(t, "verify", after=self.verified, before=self.before_verify)
        taps.on(t, "rollback", after=self.rolled_back)
        return self

    def __exit__(self, *exc) -> None:
        self.taps.close()

    def entering(self, i: int):
        """Layer 0's input is the block embedding, embed_tokens([x_0, mask, …]) · embed_scale, as the port made it."""
        if i:
            return None
        return lambda x, *a, **k: self.put("draft.hook_noise_embedding", x[0])  # (L_q, d)

    def conv(self, conv, prefix: str) -> None:
        """DFlash 2's convolution: its dynamic taps (kernel_projection's output), prepare's and finish's outputs."""
        taps = self.taps
        taps.on(
            conv,
            "kernel_projection",
            after=lambda o, *a: self.put(prefix + "hook_taps", conv_taps(as_numpy(o[0]), conv.taps)),
        )
        taps.on(conv, "prepare", after=lambda o, *a: self.put(prefix + "hook_prepared", o[0][0]))  # (L_q, d)
        taps.on(conv, "finish", after=lambda o, *a: self.put(prefix + "hook_finished", o[0]))  # (L_q, d)

    def selector(self, sel) -> None:
        """DFlash 2's selector: candidates and unary scores as its lattice is given them, the draft logits its
        head computed, the pair term from its own codebook gathers and hidden projection along the path its greedy
        walk took (which the re-derived scores must reproduce)."""
        taps, seen = self.taps, self.selected

        def lattice(scores, candidates, unary, hidden, anchor_id):
            seen.update(candidates=as_numpy(candidates), unary=as_numpy(unary))  # (γ, K) each

        def walked(path, scores, candidates):
            path = as_numpy(path)  # (γ,)
            pair = selector_pair(seen["pred"], seen["proj"], seen["succ"], seen["candidates"], path)
            check_path(PORT, path, seen["candidates"], seen["unary"] + pair)
            self.put("draft.candidate_selector.hook_candidates", seen["candidates"].astype(np.int64))
            self.put("draft.candidate_selector.hook_unary", seen["unary"])
            self.put("draft.candidate_selector.hook_pair", pair.astype(np.float32))

        taps.on(sel, "lattice", after=lattice)
        taps.on(sel, "walk_greedy", after=walked)
        taps.on(sel, "hidden_projection", after=lambda o, *a: seen.__setitem__("proj", as_numpy(o)))  # (γ, r)
        for name, stage in (("predecessor_codebook", "pred"), ("successor_codebook", "succ")):  # (γ, K, r) rows
            rows = Gathered(getattr(sel, name), lambda r, i, stage=stage: seen.__setitem__(stage, as_numpy(r)))
            taps.replace(sel, name, rows)
        vocab = self.cfg.vocab_size
        # select_block's draft logits: the target's head on its post-norm rows (γ, V), cut to the vocabulary as it is
        taps.on(self.drafter, "lm_head", after=lambda o, *a: self.put("draft.hook_logits", as_numpy(o)[..., :vocab]))

    # -- the draft pass -------------------------------------------------------------------------------------

    def before_pass(self, inputs, target_hidden, cache, logits_start=0, **kw) -> None:
        self.in_draft, self.layer = True, 0
        self.lengths = [cache_length(cache)]  # the draft cache before this step's context is written
        self.put("draft.hook_target_hidden", target_hidden[0])  # (L_c, k·d): what the loop hands its draft

    def after_pass(self, out, inputs, target_hidden, cache, logits_start=0, **kw) -> None:
        self.in_draft = False
        self.lengths.append(cache_length(cache))  # after the pass
        self.lengths.append(cache_length(cache))  # its crop: none (context-only), so the same

    def pair(self, prefix: str, module: str, o, kv_heads: int) -> None:
        """k_norm and v_proj run twice per layer: on the context (append_ctx), then on the block."""
        for name, array in self.pairs.add(prefix, module, o, kv_heads).items():
            self.put(name, array)

    def attention(self, output, queries, keys, values, *args, scale, mask=None, **kwargs) -> None:
        """Inside a draft pass, the attention kernel's own inputs: Q and K after RoPE as it gets them; the weights
        re-derived from them and its mask (checked against its output)."""
        if not self.in_draft:
            return
        prefix, self.layer = f"draft.layers.{self.layer}.self_attn.", self.layer + 1
        weights = attention_weights(queries, keys, values, scale, mask, output, where=f"{PORT} {prefix}")
        self.put(prefix + "hook_q_rot", queries[0])  # (H_q, L_q, d_h)
        self.put(prefix + "hook_k_rot", keys[0])  # (H_kv, L_k, d_h)
        self.put(prefix + "hook_pattern", weights.astype(np.float32))  # (H_q, L_q, L_k)

    # -- the target ----------------------------------------------------------------------------------------

    def prefilled(self, out, ids, cache, *args, **kwargs) -> None:
        """The prefill's last chunk hands back its last position's logits (1, 1, V): x_0's."""
        logits = out[0]
        if logits is not None:
            self.out[key_for("prefill_logits")] = as_numpy(logits[0, -1])

    def before_verify(self, ids, cache, *args, **kwargs) -> None:
        self.lengths.append(cache_length(cache))

    def verified(self, out, ids, cache, *args, **kwargs) -> None:
        self.out[key_for("verify_logits", self.step)] = as_numpy(out[0][0])  # (L_q, V): every verified row
        self.lengths.append(cache_length(cache))

    def rolled_back(self, out, cache, *args, **kwargs) -> None:
        """After a round's rollback (the port calls it after on_round): the target's length, a hybrid's states."""
        self.steps[-1][-1].append(cache_length(cache))
        self.out.update(linear_states(cache, self.step - 1, as_numpy))

    # -- the loop ------------------------------------------------------------------------------------------

    def on_round(self, **info) -> None:
        """dflash_generate's on_round, called after a round's accept, before its rollback: its own variables."""
        if info.get("source") != "drafter":
            raise AssertionError(f"{PORT}: a round proposed by {info.get('source')!r}, not its DFlash drafter")
        loop = running_locals("dflash_generate")  # its caller's frame
        drafted, posterior, tau = list(loop["drafted"]), list(loop["tt"]), int(loop["n"])
        if self.drafter.candidate_selector is None:
            self.put("draft.hook_logits", as_numpy(loop["head"]))  # (γ, V): what it took the argmax of
        self.steps.append([self.step, drafted, posterior, tau, posterior[tau], list(self.lengths)])
        self.step += 1


class MLXDSparkPort(Port):
    """mlx-dspark's DFlash path, greedy (`dflash_generate`, temperature 0), read through taps; `sampler` runs it
    sampled. Its declared design: see the module's docstring. `version`: the release that ran (None where it is
    not installed)."""

    name = PORT
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    package = "mlx_dspark"  # a crash is located at this package's innermost frame (crash.py)
    variants = {"draft_cache": "context-only", "last_block": "full-then-truncate", "sliding_window": "causal"}
    skip: list[str] = []

    def __init__(self) -> None:
        self.version = self.release("mlx-dspark")  # the report names the release that ran

    def load(self, bundle: Bundle):
        """(Target, tokenizer, drafter) as `load_dflash_pair` loads them, from the bundle's folders: the target
        through `load_target` (mlx-lm, its tap probed: require_tap), the drafter unquantized, bound to the target's
        embedding and head. A bundle's block size, if it gives one, is set on the drafter's config, which the loop
        reads it from."""
        mlx_dspark, _ = port_modules()
        target, tokenizer = mlx_dspark.load_target(str(bundle.target_dir), require_tap=True)
        drafter, cfg = mlx_dspark.load_dflash(str(bundle.draft_dir), quantize=False)
        drafter.bind(target.model)
        if bundle.inputs.get("block_size"):
            cfg.block_size = int(bundle.inputs["block_size"])
        return target, tokenizer, drafter

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        target, tokenizer, drafter = self.load(bundle)
        _, generate = port_modules()
        inputs, stops = bundle.inputs, list(bundle.inputs.get("stop_token_ids") or ())
        tokenizer = StopTokenizer(tokenizer, stops)
        if generate.eos_token_ids(tokenizer) != set(stops):  # the port's own reading of its stop set
            raise AssertionError(f"{PORT} reads stop ids {generate.eos_token_ids(tokenizer)}, not {stops}")
        with Reader(target, drafter) as recorder:
            result = generate.dflash_generate(
                target,
                tokenizer,
                drafter,
                prompt_ids=list(inputs["input_ids"]),
                max_new_tokens=inputs["max_new_tokens"],
                temperature=0.0,
                apply_chat_template=False,
                on_round=recorder.on_round,
            )
        out = recorder.out
        for step, drafted, posterior, tau, bonus, lengths in recorder.steps:
            loop_values(out, step, drafted, posterior, tau, bonus, lengths)
        tokens = list(result.token_ids)
        return outputs(out, inputs["input_ids"], tokens, drafter.config.target_layer_ids)

    def sampler(self, bundle: Bundle, verifier: str = "rejection"):
        """`verify --sampling`: `dflash_generate(temperature=T, seed=seed)`, its speculative sampling
        (`_spec_sample_accept`: accept with min(1, p/q), residual resampling). seed → (output ids, first τ)."""
        if verifier != "rejection":
            raise NotApplicable(f"{PORT} samples by rejection (`_spec_sample_accept`) only")
        s = bundle.manifest["sampling"]
        target, tokenizer, drafter = self.load(bundle)
        _, generate = port_modules()
        tokenizer = StopTokenizer(tokenizer, s.get("stop_token_ids"))

        def run(seed: int) -> tuple[list[int], int | None]:
            taus: list[int] = []
            result = generate.dflash_generate(
                target,
                tokenizer,
                drafter,
                prompt_ids=list(s["input_ids"]),
                max_new_tokens=s["max_new_tokens"],
                temperature=s["temperature"],
                apply_chat_template=False,
                seed=seed,
                on_round=lambda **info: taus.append(int(info["accepted"])),
            )
            return list(s["input_ids"]) + list(result.token_ids), (taus[0] if taus else None)

        return run


def make() -> MLXDSparkPort:
    return MLXDSparkPort()


__all__ = ["MLXDSparkPort", "StopTokenizer", "make"]
