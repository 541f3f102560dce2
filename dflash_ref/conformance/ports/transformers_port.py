"""transformers' own DFlash as a port: `target.generate(..., assistant_model=drafter, speculation_type="dflash")`
(generation/candidate_generator.py's DFlashTokenCandidateGenerator, its DFlashCache, generation/utils.py's
`_assisted_decoding`) with a Muse Glimmer assistant as the drafter (muse_glimmer.py), read through hooks on
transformers' own modules, its eager attention kernel (whose own weights are the pattern) and its decoding loop's
own variables; nothing of it re-implemented.

A bundle's draft goes in as it is where it is a Muse folder; a DFlash 1 draft is written as a Muse folder first (the
same draft under Muse's names: drafts/checkpoint.save_muse_glimmer), where Muse can say its attention; a bundle it
cannot say (DFlash 2, a causal or rotating window) is not applicable. Runs on whichever transformers is installed:
`verify --impl transformers` says its version.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from ... import muse_glimmer
from ...config import ConfigError
from ...drafts.checkpoint import load_draft, save_muse_glimmer
from ...target.checkpoint import config_architectures
from ...threads import one_thread
from ..bundle import Bundle
from ..port import Port, loop_values
from ..report import NotApplicable
from ..stages import key_for
from .official import linear_states
from .torch_taps import Taps, load_target, per_head, quiet_transformers, to_numpy

# two softmaxes of the same float32 logits agree to a few ulps; a q computed from other logits differs by far more
Q_ROUNDING = 1e-5
TRANSFORMERS_HINT = "transformers' DFlash needs transformers ≥ 5.15: pip install 'dflash-ref[hf]'"


def _transformers():
    """transformers, with its DFlash candidate generator and the Muse Glimmer assistant; NotApplicable where this
    transformers has neither (before 5.15) or is not installed."""
    try:
        with warnings.catch_warnings():  # tqdm's notebook warning when transformers is first imported
            warnings.simplefilter("ignore")
            import transformers

            candidates = importlib.import_module("transformers.generation.candidate_generator")
            muse = importlib.import_module("transformers.models.muse_glimmer_assistant.modeling_muse_glimmer_assistant")
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "transformers" and "muse_glimmer" not in (e.name or ""):
            raise
        raise NotApplicable(TRANSFORMERS_HINT) from None
    if not hasattr(candidates, "DFlashTokenCandidateGenerator"):
        raise NotApplicable(f"transformers {transformers.__version__} has no DFlash generation: {TRANSFORMERS_HINT}")
    return transformers, candidates, muse


def _cache(kwargs: dict):
    """The cache a forward is given: `past_key_values` (transformers 5.15), `cache` (later); None if neither."""
    return kwargs["cache"] if kwargs.get("cache") is not None else kwargs.get("past_key_values")


def _output_cache(output):
    """A forward's cache as its output holds it: `cache` where the output has one (transformers after 5.15 renamed
    it), else `past_key_values`."""
    return getattr(output, "cache", None) or output.past_key_values


class _Reader(Taps):
    """Scoped hooks and patches around one `generate` call (torch_taps.Taps); fills `out` keyed as the manifest."""

    def __init__(self, target, draft, candidates, muse) -> None:
        super().__init__()
        self.target, self.draft, self.candidates, self.muse = target, draft, candidates, muse
        self.step, self.prefilled, self.ctx_len = 0, False, 0
        self.target_lengths: list[int] = []  # before and after the pass under way
        self.draft_lengths: list[int] = []
        self.at(0)

    def __enter__(self) -> _Reader:
        d, t = self.draft, self.target

        def draft_inputs(mod, args, kwargs):
            context = kwargs["context_hidden_states"][0]  # (L_c, k·d)
            self.ctx_len = context.shape[0]
            self.draft_lengths = [int(_cache(kwargs).get_seq_length())]
            self.put("draft.hook_target_hidden", context)
            self.put("draft.hook_noise_embedding", kwargs["noise_embeds"][0])

        self.call(d, draft_inputs, pre=True)
        self.call(d, lambda m, a, kw, o: self.draft_lengths.append(int(_cache(kw).get_seq_length())))
        self.output(d.encoder.fc, "draft.context.hook_fc", lambda o: o[0])
        self.output(d.encoder.output_norm_enc, "draft.context.hook_context", lambda o: o[0])
        self.output(d.norm, "draft.hook_out", lambda o: o[0])
        for i, layer in enumerate(d.layers):
            p = f"draft.layers.{i}."
            attn = layer.self_attn
            self.output(attn.q_norm, p + "self_attn.hook_q", lambda o: o[0])  # (H_q, L_q, d_h)
            self.call(attn.k_norm, lambda m, a, kw, o, p=p: self.put_k(p, o[0]))  # (H_kv, L_c + L_q, d_h)
            self.call(attn.v_proj, lambda m, a, kw, o, p=p, a_=attn: self.put_v(p, o[0], a_.head_dim))
            self.output(attn.o_proj, p + "self_attn.hook_out", lambda o: o[0])
            self.output(layer, p + "hook_resid_post", lambda o: o[0])
        kernel = self.muse.eager_attention_forward

        def attention(module, query, key, value, attention_mask, **kwargs):
            output, weights = kernel(module, query, key, value, attention_mask, **kwargs)
            p = f"draft.layers.{module.layer_idx}.self_attn."
            self.put(p + "hook_q_rot", query[0])  # (H_q, L_q, d_h)
            self.put(p + "hook_k_rot", key[0])  # (H_kv, L_k, d_h): the cache's keys, then the new ones
            self.put(p + "hook_pattern", weights[0])  # (H_q, L_q, L_k): its own softmax
            return output, weights

        self.patch(self.muse, "eager_attention_forward", attention)

        def target_inputs(mod, args, kwargs):
            cache = _cache(kwargs)
            # int(): a linear layer's length is a tensor the cache updates in place (transformers 5.2x)
            self.target_lengths = [int(cache.get_seq_length()) if cache is not None else 0]

        def target_output(mod, args, kwargs, output):
            logits = output.logits[0]  # (L, V): the prompt's last row at the prefill, every verified row after
            if not self.prefilled:
                self.out[key_for("prefill_logits")] = to_numpy(logits[-1])
            else:
                self.out[key_for("verify_logits", self.step)] = to_numpy(logits)
            self.target_lengths.append(int(_output_cache(output).get_seq_length()))

        self.call(t, target_inputs, pre=True)
        self.call(t, target_output)
        generator = self.candidates.DFlashTokenCandidateGenerator
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy
        recorder = self

        def candidates_of(gen, input_ids, *args, **kwargs):
            ids, logits = get_candidates(gen, input_ids, *args, **kwargs)
            if logits is not None:  # a draft pass: its proposals, and the logits they are the argmax of
                recorder.put("draft.hook_logits", logits[0])  # (γ, V)
                recorder.put("draft_tokens", ids[0, input_ids.shape[1] :])
            return ids, logits

        def verified(gen, input_ids, scores, num_matches):
            update(gen, input_ids, scores, num_matches)
            recorder.after_verify(sys._getframe(1).f_locals, gen)

        self.patch(generator, "get_candidates", candidates_of)
        self.patch(generator, "update_candidate_strategy", verified)
        return self

    def put_k(self, prefix: str, k: torch.Tensor) -> None:  # KNorm ran on [k_ctx; k_noise] at once
        self.put(prefix + "self_attn.hook_k_ctx", k[:, : self.ctx_len])
        self.put(prefix + "self_attn.hook_k_noise", k[:, self.ctx_len :])

    def put_v(self, prefix: str, v: torch.Tensor, head_dim: int) -> None:
        self.put(prefix + "self_attn.hook_v", per_head(v, head_dim))  # (L, H_kv·d_h) → (H_kv, L, d_h)

    def after_verify(self, loop: dict, generator) -> None:
        """After `_assisted_decoding` has taken its verdict and cropped the target's cache: the prefill's first
        token, or one step's loop values, read off the loop's own variables (the frame that called the update)."""
        valid = loop["valid_tokens"][0].tolist()
        if not self.prefilled:  # the first pass: the prompt, no candidates
            self.prefilled = True
            return
        tau = int(loop["n_matches"])
        posterior = loop["selected_tokens"][0].tolist() if "selected_tokens" in loop else []
        draft = self.draft_lengths if len(self.draft_lengths) == 2 else [int(generator.cache.get_seq_length())] * 2
        cache = _output_cache(loop["outputs"])
        target_after = int(cache.get_seq_length())
        loop_values(
            self.out,
            self.step,
            self.out.get(f"step{self.step}/draft_tokens", np.zeros(0, np.int64)).tolist(),
            posterior,
            tau,
            valid[-1],
            [*draft, int(generator.cache.get_seq_length()), *self.target_lengths[:2], target_after],
        )
        self.out.update(linear_states(cache, self.step))
        self.step, self.draft_lengths = self.step + 1, []
        self.at(self.step)


class TransformersPort(Port):
    """transformers' `generate(..., speculation_type="dflash")` on a bundle: its target as the folder says, its
    drafter a Muse Glimmer assistant (the bundle's, or its DFlash 1 draft under Muse's names), eager attention."""

    name = "transformers"
    package = "transformers"  # a crash is located at this package's innermost frame (crash.py)
    # its candidate generator drafts every block whole (block_size − 1 candidates), `_assisted_decoding` cuts what
    # passes max_new_tokens and counts n_matches after that cut; its DFlashCache crops the last block's K/V at the
    # start of the next draft pass
    variants = {"last_block": "full-then-truncate", "draft_cache": "crop-at-next-pass", "accepted_count": "committed"}

    def __init__(self) -> None:
        self.version = self.release("transformers")  # the report names the release that ran

    def load(self, bundle: Bundle, folder: Path):
        transformers, _, muse = _transformers()
        if muse_glimmer.ARCHITECTURE not in config_architectures(bundle.draft_dir):
            try:
                save_muse_glimmer(load_draft(bundle.draft_dir), folder)
            except ConfigError as e:
                raise NotApplicable(f"transformers' DFlash drafts with a Muse Glimmer assistant, and {e}") from None
        else:
            folder = bundle.draft_dir
        dtype = torch.bfloat16 if bundle.config("target").get("dtype") == "bfloat16" else torch.float32
        target = load_target(bundle, dtype, attn_implementation="eager")  # eager: its softmax is the pattern
        with quiet_transformers():
            draft = muse.MuseGlimmerAssistantModel.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
        return transformers, target, draft.eval()

    def sampler(self, bundle: Bundle, verifier: str = "rejection"):
        """`verify --sampling`: `generate(..., do_sample=True)` seeded with torch.manual_seed, its rejection sampling
        (`_speculative_sampling`), the drafter's candidates drawn from its own processed (tempered) logits."""
        if verifier != "rejection":
            raise NotApplicable("transformers' DFlash samples by rejection (`_speculative_sampling`) only")
        with tempfile.TemporaryDirectory() as scratch:
            transformers, target, draft = self.load(bundle, Path(scratch) / "draft")
        return _Sampler(bundle, transformers, target, draft)

    def run(self, bundle: Bundle) -> dict[str, np.ndarray]:
        with tempfile.TemporaryDirectory() as scratch:
            transformers, target, draft = self.load(bundle, Path(scratch) / "draft")
        _, candidates, muse = _transformers()
        inputs = bundle.inputs
        if inputs.get("block_size"):  # the generator reads the drafter's own block size
            draft.config.block_size = inputs["block_size"]
        prompt = torch.tensor([inputs["input_ids"]])
        stops = list(inputs.get("stop_token_ids") or [])
        config = transformers.GenerationConfig(
            max_new_tokens=inputs["max_new_tokens"], do_sample=False, eos_token_id=stops or None, pad_token_id=0,
            speculation_type="dflash",
        )  # fmt: skip
        with one_thread(), torch.no_grad(), _Reader(target, draft, candidates, muse) as recorder:
            try:
                output = target.generate(
                    prompt, attention_mask=torch.ones_like(prompt), generation_config=config, assistant_model=draft
                )
            except ValueError as e:  # a target its assisted decoding refuses (a stateful one, a Qwen3.5)
                if "not supported" not in str(e):
                    raise
                raise NotApplicable(f"transformers refuses this bundle: {e}") from None
        out = recorder.out
        out[key_for("layer_ids")] = np.asarray(draft.config.target_layer_ids, np.int64)
        out[key_for("output_ids")] = to_numpy(output[0])
        if output.shape[1] > prompt.shape[1]:
            out[key_for("first_token")] = to_numpy(output[0, prompt.shape[1]])
        return out


class _Sampler:
    """seed → (output ids, first-step τ). Beside the verdict (`note`), what transformers' own tensors say of the
    rejection rule's q: it must be the distribution each candidate was drawn from (the processed logits, at the
    request's temperature), read off the logits processor's output and the logits `get_candidates` returns."""

    def __init__(self, bundle: Bundle, transformers, target, draft) -> None:
        _, candidates, _ = _transformers()
        s = bundle.manifest["sampling"]
        self.target, self.draft, self.temperature = target, draft, s["temperature"]
        self.generator = candidates.DFlashTokenCandidateGenerator
        self.prompt = torch.tensor([s["input_ids"]])
        self.config = transformers.GenerationConfig(
            max_new_tokens=s["max_new_tokens"], do_sample=True, temperature=s["temperature"], top_k=None, top_p=1.0,
            pad_token_id=0, speculation_type="dflash",
        )  # fmt: skip
        self.q_gap = 0.0  # the largest |q_verifier − q_drawn| over every candidate of every run
        self.q_is_raw = False  # whether that q is the softmax of the logits before the processor
        self.note = ""

    def __call__(self, seed: int) -> tuple[list[int], int]:
        torch.manual_seed(seed)
        generator, matches = self.generator, []
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

        def candidates_of(gen, input_ids, *args, **kwargs):
            processor, raw, drawn = gen.logits_processor, [], []
            if processor is not None:  # each row the candidates are drawn from, and what the processor was given

                def recording(ids, scores):
                    raw.append(scores.clone())
                    drawn.append(processor(ids, scores).clone())
                    return drawn[-1]

                gen.logits_processor = recording
            try:
                ids, logits = get_candidates(gen, input_ids, *args, **kwargs)
            finally:
                gen.logits_processor = processor
            if drawn and logits is not None:
                q = torch.softmax(logits.float(), -1)  # (1, γ, V): what `_speculative_sampling` takes for q
                gap = float((q - torch.softmax(torch.stack(drawn, 1).float(), -1)).abs().max())
                if gap > self.q_gap:
                    self.q_gap = gap
                    self.q_is_raw = (
                        float((q - torch.softmax(torch.stack(raw, 1).float(), -1)).abs().max()) <= Q_ROUNDING
                    )
            return ids, logits

        generator.get_candidates = candidates_of
        generator.update_candidate_strategy = lambda gen, ids, scores, n: (
            matches.append(int(n)),
            update(gen, ids, scores, n),
        )[1]
        try:
            with torch.no_grad():
                out = self.target.generate(
                    self.prompt, attention_mask=torch.ones_like(self.prompt), generation_config=self.config,
                    assistant_model=self.draft,
                )  # fmt: skip
        finally:
            generator.get_candidates, generator.update_candidate_strategy = get_candidates, update
        if self.q_gap > Q_ROUNDING:
            handed = (
                "`_speculative_sampling` is handed the logits before the processor (q at temperature 1), so "
                "acceptance and the residual use the wrong q: DFlashTokenCandidateGenerator.get_candidates returns "
                "the logits it had before its logits processor"
                if self.q_is_raw
                else "`_speculative_sampling` is handed other logits than those the candidates were drawn from"
            )
            self.note = (
                f"transformers' own tensors: the q its rejection rule uses is not the distribution its candidates were "
                f"drawn from (they differ by up to {self.q_gap:.3f} in probability): the candidates are drawn from "
                f"the processed logits (temperature {self.temperature}); {handed}"
            )
        return out[0].tolist(), matches[1] if len(matches) > 1 else 0  # matches[0]: the prefill's pass
