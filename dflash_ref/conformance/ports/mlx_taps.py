"""Port-agnostic pieces for reading an MLX port of DFlash from the inside (for the adapters of pypi/).

An MLX port is read the way the kit reads every port: through its own modules and its own loop, never by
recomputing a stage. What every MLX port needs for that lives here, so that one port's adapter is its own
mapping (which of its modules and variables is which manifest stage) and little else:

- `require`: import what a port needs, or `NotApplicable` with the line that installs it;
- `as_numpy`: an `mx.array` as a numpy copy (bf16 and fp16 as float32, exactly);
- `Tap`, `Gathered` and `Taps`: stand-ins for an `mlx.nn` submodule, a bound method, a module-level function
  (`Tap`: it calls the original and hands its arguments and output to the adapter) or a raw array the port
  indexes (`Gathered`), each put in place for one run and undone on exit;
- `Rows`: the outputs of one module gathered over several calls (a prompt prefilled in chunks), concatenated;
- `heads_first`, `values_by_head` and `ContextThenBlock`: a draft attention's per-head tensors in the kit's
  layout, its K and V projections of the context and of the block as the kit's stages;
- `mask_bias`, `kernel_tolerance` and `attention_weights`: the softmax an attention kernel computed inside
  (`mx.fast.scaled_dot_product_attention` gives only its output) re-derived from the kernel's own inputs and
  mask, and checked against its output within a tolerance set by their dtype;
- `running_locals`: a decoding loop's own variables, read off its frame while it calls out (a tap, a callback).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..report import NotApplicable


def require(modules: tuple[str, ...], install: str, installs: tuple[str, ...] | None = None) -> None:
    """Import each of `modules`; where one (or a package it imports) is missing, NotApplicable naming the
    missing module and `install`, the line that installs the port. `installs`, where given, are the top-level
    modules that line brings (the port and its requirements): a missing module outside them is the port's own
    import error, not a missing install, and is raised. Any other import error is the port's, and is raised."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            missing = e.name or name
            if installs is not None and missing.split(".")[0] not in installs:
                raise
            raise NotApplicable(f"{missing} is not installed: {install}") from None


def as_numpy(x) -> np.ndarray:
    """An mx.array (or anything numpy takes) as a numpy copy; bf16 and fp16 as float32, exactly, since numpy has
    no bf16. A copy: a port that updates a buffer in place must not change what was recorded."""
    if type(x).__module__.startswith("mlx"):
        import mlx.core as mx

        if x.dtype in (mx.bfloat16, mx.float16):
            x = x.astype(mx.float32)
    return np.array(x, copy=True)


class Tap:
    """A callable standing in for `target` (an mlx.nn submodule, a bound method, a function): `before(*args,
    **kwargs)` sees its arguments, then it runs, then `after(output, *args, **kwargs)` sees what it returned,
    which is handed on unchanged. Every other attribute is the target's, so the port's code that reads
    `self.q_norm.weight` (or calls `.as_linear`) through the stand-in still works."""

    def __init__(self, target, after: Callable | None = None, before: Callable | None = None) -> None:
        self.__dict__.update(target=target, after=after, before=before)

    def __call__(self, *args, **kwargs):
        if self.before is not None:
            self.before(*args, **kwargs)
        out = self.target(*args, **kwargs)
        if self.after is not None:
            self.after(out, *args, **kwargs)
        return out

    def __getattr__(self, name):
        return getattr(self.target, name)


class Gathered:
    """An array standing in for a table the port indexes (`table[ids]`): hands back the rows and shows them to
    `after(rows, ids)`. For raw parameter arrays, which no call can tap (a candidate selector's codebooks). Every
    other attribute is the table's."""

    def __init__(self, table, after: Callable) -> None:
        self.table, self.after = table, after

    def __getitem__(self, ids):
        rows = self.table[ids]
        self.after(rows, ids)
        return rows

    def __getattr__(self, name):
        return getattr(self.table, name)


class Taps:
    """Every stand-in of one run, undone in reverse order by `close()` (on exit of a `with`, also when the port
    raises).

    `on(owner, name, after=, before=)` puts a `Tap` in place of `owner.name` on that one object: an mlx.nn
    Module (a dict whose items are its children) gets an instance attribute, which Python's lookup finds before
    the Module's own `__getattr__`, so the parameters are untouched; a plain object (a port's helper class)
    gets the instance attribute too; a Python module (`mx.fast`, a port's module) gets its global replaced,
    which the port's code reads by name at call time. `replace(owner, name, value)` puts any value there (a list
    of tapped layers, a `Gathered` table)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self._kept: set[tuple[type, str]] = set()

    def __enter__(self) -> Taps:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        while self._undo:
            self._undo.pop()()

    def on(self, owner, name: str, after: Callable | None = None, before: Callable | None = None) -> Tap:
        tap = Tap(getattr(owner, name), after, before)
        self.replace(owner, name, tap)
        return tap

    def keep(self, cls: type, name: str) -> None:
        """Restore class attribute `cls.name` (present or absent now) on exit: for a port that patches a library's
        class for the whole process (an mlx-lm layer's `__call__`), so that the next run in this process gets the
        library's own. Kept once per class and name: the first state seen is the one restored."""
        if (cls, name) in self._kept:
            return
        self._kept.add((cls, name))
        had, original = name in cls.__dict__, cls.__dict__.get(name)
        self._undo.append(
            (lambda: setattr(cls, name, original)) if had else (lambda: name in cls.__dict__ and delattr(cls, name))
        )

    def replace(self, owner, name: str, value) -> None:
        if isinstance(owner, type(sys)):  # a Python module: its global, restored as it was
            original = getattr(owner, name)
            setattr(owner, name, value)
            self._undo.append(lambda: setattr(owner, name, original))
            return
        # an instance attribute, past the owner's __setattr__; restored if the instance held one itself (a bound
        # method a port stored on it), else deleted
        had = name in getattr(owner, "__dict__", {})
        original = owner.__dict__.get(name) if had else None
        object.__setattr__(owner, name, value)
        self._undo.append(
            (lambda: object.__setattr__(owner, name, original)) if had else (lambda: object.__delattr__(owner, name))
        )


class Rows:
    """A module's outputs gathered over the calls that make one stage (a prompt prefilled in chunks, each chunk
    through the same projection): `add(array)` keeps a numpy copy, `take()` hands back their concatenation
    along `axis` and empties it (None when nothing was added)."""

    def __init__(self, axis: int = 0) -> None:
        self.axis, self.parts = axis, []

    def add(self, array) -> None:
        self.parts.append(as_numpy(array))

    def take(self) -> np.ndarray | None:
        parts, self.parts = self.parts, []
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=self.axis)


def heads_first(x: np.ndarray) -> np.ndarray:
    """(L, H, d_h) → (H, L, d_h): a per-head tensor as an MLX layer computes it (positions, then heads) in the
    kit's layout (heads, then positions)."""
    return x.transpose(1, 0, 2)


def values_by_head(context: np.ndarray, block: np.ndarray, kv_heads: int) -> np.ndarray:
    """v_proj's two outputs, (L_c, H_kv·d_h) on the context and (L_q, H_kv·d_h) on the block → (H_kv, L_c + L_q,
    d_h), the new positions in order (context, then block)."""
    both = np.concatenate([context, block], axis=0)  # (L_c + L_q, H_kv·d_h)
    return heads_first(both.reshape(both.shape[0], kv_heads, -1))  # (L_c + L_q, H_kv, d_h) → (H_kv, L_c + L_q, d_h)


class ContextThenBlock:
    """k_norm's and v_proj's outputs in a DFlash draft's attention as MLX ports write it (`DFlashAttention`), which
    runs each twice per pass: on the new context first, then on the block. `add(prefix, module, output, kv_heads)`
    keeps the first call's output and, at the second, hands back the kit's stages of that layer (`prefix`:
    "draft.layers.{i}."): from k_norm, (1, L, H_kv, d_h) per call, K context and K block after KNorm, (H_kv, L_c,
    d_h) and (H_kv, L_q, d_h); from v_proj, (1, L, H_kv·d_h) per call, V, (H_kv, L_c + L_q, d_h). {} after the
    first call."""

    def __init__(self) -> None:
        self.pending: dict[str, list[np.ndarray]] = {}

    def add(self, prefix: str, module: str, output, kv_heads: int) -> dict[str, np.ndarray]:
        key = prefix + module
        seen = self.pending.setdefault(key, [])
        seen.append(as_numpy(output[0]))
        if len(seen) < 2:
            return {}
        context, block = self.pending.pop(key)
        if module == "k_norm":  # (L, H_kv, d_h) each, before RoPE
            return {
                prefix + "self_attn.hook_k_ctx": heads_first(context),
                prefix + "self_attn.hook_k_noise": heads_first(block),
            }
        return {prefix + "self_attn.hook_v": values_by_head(context, block, kv_heads)}


def mask_bias(mask, q_len: int, k_len: int) -> np.ndarray:
    """An `mx.fast.scaled_dot_product_attention` mask as what the kernel adds to its scores, (…, L_q, L_k): None
    (every key: 0), the string "causal" (aligned to the last key: query i sees keys ≤ L_k − L_q + i, as MLX's
    kernel reads it), a boolean array (True: attended, 0; False: −inf) or an additive float array (as it is). A
    mask with leading batch / head axes of size 1 is reduced to its last two."""
    if mask is None:
        return np.zeros((q_len, k_len))
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"attention mask {mask!r} is not understood")
        allowed = np.arange(k_len)[None, :] <= np.arange(q_len)[:, None] + (k_len - q_len)  # (L_q, L_k)
        return np.where(allowed, 0.0, -np.inf)
    m = as_numpy(mask)
    if m.ndim > 2 and all(s == 1 for s in m.shape[:-2]):
        m = m.reshape(m.shape[-2:])  # (1, …, 1, L_q, L_k) → (L_q, L_k)
    bias = np.where(m, 0.0, -np.inf) if m.dtype == bool else m.astype(np.float64)
    return np.broadcast_to(bias, bias.shape[:-2] + (q_len, k_len))


def kernel_tolerance(dtype) -> float:
    """How far a fused attention kernel's output may be from its float64 re-derivation, × max(1, max|V|), by the
    dtype of its inputs: 3e-2 in half precision (bf16, fp16: the kernel rounds its inputs and output), else 1e-4
    (float32: float32's own rounding)."""
    return 3e-2 if str(dtype).rsplit(".", 1)[-1] in ("bfloat16", "float16") else 1e-4


def attention_weights(queries, keys, values, scale: float, mask, output, where: str = "") -> np.ndarray:
    """softmax(q kᵀ · scale) under the kernel's own mask, from the arrays a fused attention kernel was handed,
    for one sequence: queries (1, H_q, L_q, d_h), keys and values (1, H_kv, L_k, d_h), mask as `mask_bias` reads
    it, output (1, H_q, L_q, d_v); mx or numpy arrays. The kernel gives only its output, so the weights are
    re-derived in float64 and must reproduce that output within `kernel_tolerance` of the queries' dtype (else
    AssertionError, prefixed by `where`: they are not the weights the port used). Query head h reads KV head
    h // (H_q / H_kv). → (H_q, L_q, L_k)."""
    q, k, v = (as_numpy(a[0]).astype(np.float64) for a in (queries, keys, values))  # (H, L, d_h) each
    groups = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, groups, axis=0), np.repeat(v, groups, axis=0)  # (H_q, L_k, d_h)
    scores = q @ k.transpose(0, 2, 1) * scale  # (H_q, L_q, L_k)
    scores = scores + mask_bias(mask, *scores.shape[1:])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    got = as_numpy(output[0]).astype(np.float64)  # (H_q, L_q, d_v)
    tol = kernel_tolerance(queries.dtype) * max(1.0, float(np.abs(v).max()))
    if not np.allclose(weights @ v, got, atol=tol):
        raise AssertionError(f"{where}: re-derived attention weights do not reproduce the kernel's output")
    return weights


def running_locals(function: str, depth_limit: int = 64) -> dict[str, Any]:
    """The local variables of the nearest frame on the current stack running a function named `function`:
    from inside a tap or a callback the port's loop called, that loop's own variables at that moment (its
    posterior, τ, …). A generator that is running has its frame on the stack like any function. KeyError if
    there is none."""
    frame = sys._getframe(1)
    for _ in range(depth_limit):
        if frame is None:
            break
        if frame.f_code.co_name == function:
            return dict(frame.f_locals)
        frame = frame.f_back
    raise KeyError(f"no frame of {function!r} on the stack: the port's loop is not where the adapter expects it")
