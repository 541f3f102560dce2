"""Port-agnostic pieces for reading a PyTorch port of DFlash teacher-forced: the steps of a bundle's reference
walk as inputs a draft's own forward can take, the bundle's target run with transformers for its hidden states,
and scoped forward hooks that record a module's output under a manifest key.

Teacher-forced (training/teacher_forced.py says what it means in this project) is how a port without a
decoding loop (a training library) is read: at every step s of the reference's walk, the draft is fed what
DFlash feeds it there, the committed context taken from the bundle's expected output ids,

    start_0     = len(prompt)                  start_{s+1} = start_s + τ_s + 1
    x_0         = output_ids[start_s]           (the prefill's first token, then each step's bonus)
    context     = output_ids[:start_s]          new at step s: positions start_{s−1} … start_s − 1 (0 … at s = 0)
    block       = [x_0, mask, …, mask]          L_q = the length of the reference's block at s (its posterior's)

so that the port's draft-side tensors of step s are the reference's of step s, whatever the port would have
decoded. The loop's own stages (the target's logits, posterior, τ, bonus, cache lengths, output ids) are not
the port's: an adapter built on this module does not produce them.

An adapter for another PyTorch port is then its mapping and little else: `teacher_forced_steps(bundle)`, one
`target_hidden_states` per step, and a `Taps` whose hooks put the port's own tensors under the manifest's keys.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...target.qwen3_5_checkpoint import is_hybrid_folder
from ..bundle import Bundle


def to_numpy(x) -> np.ndarray:
    """A tensor (any dtype; bf16 becomes float32, exactly), list or number → numpy, a copy: a port's buffer (a cache
    it updates in place, as transformers 5.2x does its recurrent states) must not change what was recorded."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        return (x.float() if x.is_floating_point() else x.long()).numpy().copy()
    return np.asarray(x, dtype=np.int64 if isinstance(x, (int, list)) else None)


@dataclass(frozen=True)
class ForcedStep:
    """One step of the reference's walk as a draft's input: the context and the block DFlash feeds the draft."""

    index: int  # s
    start: int  # the position of x_0: the number of context positions before the block
    new_from: int  # the first context position new at this step (the previous step's start; 0 at step 0)
    block_len: int  # L_q
    anchor: int  # x_0, the block's first token
    proposals: tuple[int, ...]  # the reference's d_1 … d_γ at this step (DFlash 2: the path its selector walked)

    @property
    def new_context(self) -> slice:
        """The context positions this step feeds the draft anew: the rows of the kit's (L_c, …) stages."""
        return slice(self.new_from, self.start)


def teacher_forced_steps(bundle: Bundle) -> list[ForcedStep]:
    """The reference's steps of `bundle` as ForcedSteps, read off its expected tensors: τ of each step, the
    length of its block (its posterior's), its proposals, and x_0 from the output ids. A ValueError where the
    expected tensors do not chain (x_0 of a step is not the output token at its start)."""
    expected, prompt_len = bundle.expected, len(bundle.inputs["input_ids"])
    output = expected["output_ids"]
    steps, start, new_from, s = [], prompt_len, 0, 0
    while f"step{s}/posterior" in expected:
        block_len = int(expected[f"step{s}/posterior"].shape[0])
        proposals = tuple(int(t) for t in expected.get(f"step{s}/draft_tokens", np.zeros(0, np.int64)))
        if start >= len(output):
            raise ValueError(f"{bundle.name}: step {s} starts at {start}, past the output's {len(output)} tokens")
        steps.append(ForcedStep(s, start, new_from, block_len, int(output[start]), proposals))
        new_from, start = start, start + int(expected[f"step{s}/acceptance_length"]) + 1
        s += 1
    return steps


def forced_ids(bundle: Bundle, step: ForcedStep, fill: int, block_tokens: bool = False) -> list[int]:
    """The token ids of a training-style sequence whose block anchored at `step.start` is this step's: the
    committed context and x_0 (output_ids[:start + 1]), then L_q more positions, which a draft's block mask
    keeps out of the block's view (positions after the anchor). Filled with `fill`, or, with `block_tokens`,
    with the reference's proposals d_1 … d_γ first (a port that reads a block's tokens as the selector's
    predecessors, teacher-forced on the reference's path), then `fill`. Length start + 1 + L_q."""
    ids = [int(t) for t in bundle.expected["output_ids"][: step.start + 1]]
    after = list(step.proposals) if block_tokens else []
    return ids + (after + [fill] * step.block_len)[: step.block_len]


def bundle_dtype(bundle: Bundle) -> torch.dtype:
    """The dtype the bundle's models run in: bf16 where the draft's config says so, else float32."""
    return torch.bfloat16 if bundle.config("draft").get("dtype") == "bfloat16" else torch.float32


@contextlib.contextmanager
def quiet_transformers():
    """transformers' loading messages and progress bars off, restored after (a report is no place for them)."""
    with warnings.catch_warnings():  # tqdm's notebook warning when transformers is first imported
        warnings.simplefilter("ignore")
        import transformers

    log = transformers.utils.logging
    verbosity, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        yield transformers
    finally:
        log.set_verbosity(verbosity)
        if bars:
            log.enable_progress_bar()


def load_target(bundle: Bundle, dtype: torch.dtype | None = None, **options):
    """The bundle's target with transformers, as its folder says (a Qwen3.5 folder as Qwen3_5ForCausalLM, else
    AutoModelForCausalLM: Qwen3, or the engine-shaped bundles' Llama), in `dtype` (default the bundle's), eval
    mode, quietly: the input a training library is given, not a stage of the port. `options` go to
    from_pretrained (e.g. attn_implementation)."""
    with quiet_transformers() as transformers:
        kind = (
            transformers.Qwen3_5ForCausalLM
            if is_hybrid_folder(bundle.target_dir)
            else transformers.AutoModelForCausalLM
        )
        return kind.from_pretrained(bundle.target_dir, dtype=dtype or bundle_dtype(bundle), **options).eval()


@torch.no_grad()
def target_hidden_states(target, ids: list[int]) -> tuple[torch.Tensor, ...]:
    """transformers' `output_hidden_states` of one sequence (1, T): index 0 the embedding output, index i the
    i-th layer's output (the last one after the final norm, as transformers gives it), each (1, T, d)."""
    return target(torch.tensor([ids]), output_hidden_states=True).hidden_states


def concat_layers(hidden_states, indices: list[int]) -> torch.Tensor:
    """hidden_states[i] for i in `indices`, concatenated on the last axis → (1, T, k·d)."""
    return torch.cat([hidden_states[i] for i in indices], dim=-1)


def first(output) -> torch.Tensor:
    """A module's output tensor: the output itself, or the first of a tuple (an attention's (output, weights))."""
    return output[0] if isinstance(output, tuple) else output


class Taps:
    """Scoped forward hooks and patches on a port's own modules, filling `out` keyed as the manifest: the
    current step's prefix (`at(step)`) before each key. Every hook is removed and every patch undone on exit.

        with Taps() as taps:
            taps.output(model.fc, "draft.context.hook_fc", lambda o: o[0])
            taps.at(0); model(...)
    """

    def __init__(self) -> None:
        self.out: dict[str, np.ndarray] = {}
        self.prefix = ""
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> Taps:
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def at(self, step: int) -> None:
        """Record what follows under step{step}/…"""
        self.prefix = f"step{step}/"

    def put(self, name: str, tensor) -> None:
        """`tensor` (any dtype; bf16 becomes float32, exactly) under the current step's `name`, a copy."""
        self.out[self.prefix + name] = to_numpy(tensor)

    def output(self, module, name: str, take: Callable = first) -> None:
        """Record take(module's output) under `name` after every call of `module`."""
        handle = module.register_forward_hook(lambda m, a, o: self.put(name, take(o)))
        self._undo.append(handle.remove)

    def hook(self, module, fn: Callable, pre: bool = False) -> None:
        """fn(module, args, output) after each call of `module` (or fn(module, args, kwargs) before it, `pre`)."""
        handle = module.register_forward_pre_hook(fn, with_kwargs=True) if pre else module.register_forward_hook(fn)
        self._undo.append(handle.remove)

    def call(self, module, fn: Callable, pre: bool = False) -> None:
        """fn(module, args, kwargs, output) after each call (or fn(module, args, kwargs) before it, `pre`)."""
        if pre:
            handle = module.register_forward_pre_hook(fn, with_kwargs=True)
        else:
            handle = module.register_forward_hook(fn, with_kwargs=True)
        self._undo.append(handle.remove)

    def patch(self, owner, name: str, value) -> None:
        """owner.name = value until exit (a module's global function, a class's method)."""
        old = getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old))

    def replace(self, instance, name: str, value) -> None:
        """A method stood in for on one instance, its class's own back on exit."""
        setattr(instance, name, value)
        self._undo.append(lambda: delattr(instance, name))


def per_head(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(L, H·d_h) → (H, L, d_h)."""
    return x.view(x.shape[0], -1, head_dim).transpose(0, 1)  # (L, H, d_h) → (H, L, d_h)


def attention_weights(query, key, value, attention_mask, scaling: float, output, where: str = "") -> torch.Tensor:
    """softmax(q kᵀ · scaling) under the kernel's own mask (boolean: True attended; else additive), from the
    tensors an attention kernel was handed: query (B, H_q, L_q, d_h), key and value (B, H_kv, L_k, d_h), its
    output (B, L_q, H_q, d_h). The kernel gives only its output, so the weights are re-derived in float32 and must
    reproduce that output (within 3e-2 in bf16, else 1e-4, × max(1, its largest value); else AssertionError,
    prefixed by `where`). Query head h reads KV head h // (H_q / H_kv). → (B, H_q, L_q, L_k). mlx_taps'
    attention_weights is the same for an MLX kernel."""
    groups = query.shape[1] // key.shape[1]
    k, v = (t.float().repeat_interleave(groups, dim=1) for t in (key, value))  # (B, H_q, L_k, d_h)
    scores = query.float() @ k.transpose(-1, -2) * scaling
    if attention_mask is not None:
        scores = (
            scores.masked_fill(~attention_mask, float("-inf"))
            if attention_mask.dtype == torch.bool
            else scores + attention_mask.float()
        )
    weights = scores.softmax(-1)
    derived = (weights @ v).transpose(1, 2)  # (B, L_q, H_q, d_h)
    tol = 3e-2 if query.dtype == torch.bfloat16 else 1e-4
    if not torch.allclose(derived, output.float(), atol=tol * max(1.0, float(derived.abs().max()))):
        raise AssertionError(f"{where}: re-derived attention weights do not reproduce the kernel's output")
    return weights
