"""Hints for the first divergence: the usual causes at each stage (its record's, `Stage.causes`), and the causes
the two tensors themselves can tell (`READERS`: one small reader per cause, each saying in its docstring which
pattern it looks for and why that pattern means that cause). A hint is a guess to check first, never a verdict: a
reader speaks only where the port's tensor has its pattern exactly, else the stage's usual causes are given.
READERS is keyed by stage name here, not held by the stage's record: stages.py is below this module.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np

from .stages import STAGE, STAGES


def hint(
    stage: str, expected: np.ndarray | None, got: np.ndarray | None, manifest: dict, layer: int | None = None
) -> str:
    """One line: what the tensors show, else the stage's usual causes. `manifest`: what verify knows of the
    bundle (its inputs, mask_token_id, sliding_window; block_size where given)."""
    told = None
    if _numeric(expected) and _numeric(got):
        context = {**manifest, "layer": layer}
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN slices: a port's NaNs read as nothing shown
            for read in READERS.get(stage, ()):
                try:
                    told = read(np.asarray(expected), np.asarray(got), context)
                except (ValueError, TypeError, IndexError, OverflowError):  # a port's odd tensor: nothing read
                    told = None
                if told:
                    break
    return told or (STAGE[stage].causes if stage in STAGE else "")


# ------------------------------------------------------------------------------------------ crashes


def crash_hint(error: BaseException, configs: dict[str, dict]) -> str:
    """What a port's crash says about the bundle it crashed on, read off the error and the bundle's configs
    (`configs`: "target" and "draft" config.json): repeated or last-layer target_layer_ids where sizes clash, a
    config key read from a place this bundle's config does not have it; "" where nothing is read."""
    message = str(error)
    draft, target = configs.get("draft") or {}, configs.get("target") or {}
    ids = list((draft.get("dflash_config") or {}).get("target_layer_ids") or draft.get("target_layer_ids") or [])
    layers = (target.get("text_config") or target).get("num_hidden_layers")
    sizes = any(word in message.lower() for word in ("shape", "size", "dimension", "matmul", "broadcast"))
    if sizes and len(set(ids)) < len(ids):
        return (
            f"this bundle's target_layer_ids repeat ({ids}): DFlash concatenates one block of features per id, a "
            "repeated id twice (k·d columns for k ids); a port that taps each layer once (a set, or a dict by layer) "
            "hands fc fewer columns than its weight has"
        )
    if sizes and layers is not None and layers - 1 in ids:
        return (
            f"this bundle's target_layer_ids {ids} include the target's last layer ({layers - 1}, of "
            f"num_hidden_layers {layers}): a port that drops or clamps an id equal to the last layer (a range(L − 1), "
            "an id < L − 1 test) builds fc for fewer features than the checkpoint holds"
        )
    key = _missing_key(error)
    if key is None:
        return ""
    for which, config in (("draft", draft), ("target", target)):
        where = _nested(config, key)
        if where:
            return (
                f"the port reads `{key}` at the top level of the {which}'s config.json, where this bundle has it "
                f"under `{where}`" + _SPELLINGS.get(where.split(".")[0], "")
            )
    return ""


_SPELLINGS = {
    "rope_parameters": " (transformers 5's spelling of RoPE: rope_parameters alone, no rope_theta or rope_scaling)",
    "text_config": " (a Qwen3.5 / 3.6 folder as released: the text model's settings under text_config)",
    "dflash_config": " (the official DFlash format: the draft's own settings under dflash_config)",
}


def _missing_key(error: BaseException) -> str | None:
    """The config key a KeyError or an AttributeError names, else None."""
    if isinstance(error, KeyError) and error.args and isinstance(error.args[0], str):
        return error.args[0]
    if isinstance(error, AttributeError):
        name = getattr(error, "name", None)
        return name if isinstance(name, str) else None
    return None


def _nested(config: dict, key: str, path: str = "") -> str | None:
    """Where `key` sits below the top level of `config` ("rope_parameters", "text_config.rope_parameters"), None
    where it is at the top or nowhere."""
    for name, value in config.items():
        if isinstance(value, dict):
            inside = f"{path}.{name}" if path else name
            if key in value:
                return inside
            deeper = _nested(value, key, inside)
            if deeper:
                return deeper
    return None


def _numeric(x) -> bool:
    return isinstance(x, np.ndarray) and (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_)


def _agrees(expected: np.ndarray, got: np.ndarray, rel: float = 1e-3) -> bool:
    """Equal shapes and values within `rel` of the expected's scale (far looser than rounding, far tighter than
    any of the causes below: those move values by their own size)."""
    if got.shape != expected.shape:
        return False
    if expected.size == 0:
        return True
    scale = max(1.0, float(np.abs(expected).max()))
    return bool(np.all(np.abs(got.astype(np.float64) - expected) <= rel * scale))


def _block_size(context: dict) -> int | None:
    """L_q where verify says it (the bundle's block size), else None."""
    return context.get("block_size") or (context.get("inputs") or {}).get("block_size")


# ------------------------------------------------------------------------------------------ ids and features


def _ids_shifted(expected, got, context) -> str | None:
    """Every id off by one constant c ≠ 0: the ids themselves shifted (the + 1 of hidden_states[l + 1] applied to
    the ids, or ids counted from 1); the same ids in another order: fc's inputs permuted."""
    if got.shape != expected.shape or got.ndim != 1 or not got.size:
        return None
    shift = got.astype(np.int64) - expected.astype(np.int64)
    if np.all(shift == shift[0]) and shift[0] != 0:
        return (
            f"every layer id is DFlash's {int(shift[0]):+d}: the ids shifted; target_layer_ids are the target "
            "layers' own indices (official formula, or the draft's config), and the + 1 of hidden_states[l + 1] "
            "belongs to the read, not to the ids"
        )
    if sorted(got.tolist()) == sorted(expected.tolist()) and not np.array_equal(got, expected):
        return "the same layer ids in another order: fc's input is the features concatenated in target_layer_ids' order"
    return None


def _only_first_row_agrees(expected, got, context) -> str | None:
    """Row 0 equal up to float rounding, the later rows off by far more: what another RoPE gives the target's
    features at the prefill, since position 0 is rotated by nothing whatever θ or scaling."""
    if got.shape != expected.shape or got.ndim != 2 or got.shape[0] < 2:
        return None
    rows = np.abs(got - expected).max(-1) / max(1.0, float(np.abs(expected).max()))
    if not (rows[0] <= 1e-5 and np.median(rows[1:]) > 100 * max(float(rows[0]), 1e-7)):
        return None
    return (
        "the first position's features agree and the later ones' do not: the target encodes positions "
        "otherwise, its RoPE θ or scaling (position 0 is not rotated); e.g. a config that spells θ as "
        "transformers 5 writes it (`rope_parameters`) read for `rope_theta` alone, which falls back to 10⁴"
    )


def _per_layer(expected, got, least: int = 1):
    """Every way to cut (L_c, k·d) features into k ≥ `least` equal blocks, one per sampled layer (k unknown here):
    (k, [(expected block, got block) for each layer])."""
    width = got.shape[1]
    for layers in range(least, width // 2 + 1):
        if width % layers == 0:
            d = width // layers
            yield layers, [(expected[:, j * d : (j + 1) * d], got[:, j * d : (j + 1) * d]) for j in range(layers)]


def _features_one_layer_early(expected, got, context) -> str | None:
    """With the features cut into k equal blocks (one per sampled layer), the port's block j is DFlash's block
    j − 1 and its block j is not: where two sampled ids are one apart, layer l's features are what DFlash reads
    for layer l − 1, hidden_states[l] for hidden_states[l + 1] (the offset of the embedding output lost)."""
    if got.shape != expected.shape or got.ndim != 2:
        return None
    for layers, blocks in _per_layer(expected, got, least=2):
        for j in range(1, layers):
            (own, ours), (theirs, _) = blocks[j], blocks[j - 1]
            if _agrees(theirs, ours, rel=1e-5) and not _agrees(own, ours, rel=1e-5):
                return (
                    f"the port's features of sampled layer {j} are DFlash's of sampled layer {j - 1} (their ids one "
                    "apart): every layer read one too early, hidden_states[l] where DFlash reads hidden_states[l + 1] "
                    "(index 0 is the embedding output)"
                )
    return None


def _features_before_a_norm(expected, got, context) -> str | None:
    """With the features cut into k equal blocks (one per sampled layer), the other blocks agree and block j is
    DFlash's before an RMSNorm: its rows, each divided by its root mean square and scaled per channel by one
    weight, are DFlash's. DFlash reads transformers' hidden_states[L] for the target's last layer, the last entry
    of output_hidden_states: the final norm's output; a port that reads that layer's own output (its residual
    stream, as for every other layer) misses the norm there."""
    if got.shape != expected.shape or got.ndim != 2 or got.shape[0] < 2:
        return None
    for layers, blocks in _per_layer(expected, got):
        off = [j for j, (e, g) in enumerate(blocks) if not _agrees(e, g, rel=1e-5)]
        if len(off) != 1:
            continue
        e, g = (x.astype(np.float64) for x in blocks[off[0]])
        normed = g / np.sqrt((g**2).mean(axis=1, keepdims=True) + 1e-6)  # (L_c, d): each row at RMS 1
        weight = np.median(e / np.where(np.abs(normed) > 1e-6, normed, np.nan), axis=0)  # (d,): one per channel
        if np.isfinite(weight).all() and _agrees(e, normed * weight, rel=1e-3):
            which = "the last sampled layer" if off[0] == layers - 1 else f"sampled layer {off[0]}"
            return (
                f"the port's features of {which} are DFlash's before an RMSNorm (each row normalised and scaled per "
                "channel by one weight gives DFlash's): for the target's last layer DFlash reads hidden_states[L], "
                "the last entry of transformers' output_hidden_states, after the target's final norm; the port read "
                "that layer's own output"
            )
    return None


def _features_not_sliced(expected, got, context) -> str | None:
    """More feature rows than DFlash's, the first ones DFlash's: the features of every verified position fed back
    as context, where only the accepted run and its bonus (the first τ + 1) are new context."""
    if got.ndim != 2 or expected.ndim != 2 or got.shape[1] != expected.shape[1] or got.shape[0] <= expected.shape[0]:
        return None
    if not _agrees(expected, got[: expected.shape[0]]):
        return None
    return (
        f"{got.shape[0]} rows of features where DFlash has {expected.shape[0]}, and those {expected.shape[0]} "
        "agree: the features of every verified position fed back as context, where only the first τ + 1 (the "
        "accepted tokens' and the bonus's) are new: slice the verify's features to [:τ + 1]"
    )


# ------------------------------------------------------------------------------------------ norms


def _other_norm_weight(expected, got, context) -> str | None:
    """got = expected × c_j, one factor per last-axis element, the same in every row (and not all 1): what a
    norm weight other than its own gives (a norm is x / rms(x) ⊙ w)."""
    if got.shape != expected.shape or got.ndim < 2:
        return None
    rows_e, rows_g = expected.reshape(-1, expected.shape[-1]), got.reshape(-1, got.shape[-1])
    usable = np.abs(rows_e) > 1e-3 * np.abs(rows_e).max()
    ratio = np.where(usable, rows_g / rows_e, np.nan)
    if np.isnan(ratio).all(axis=0).any():
        return None
    factor = np.nanmedian(ratio, axis=0)  # (d_h,)
    if not (
        np.isfinite(factor).all()
        and not np.allclose(factor, 1, atol=1e-3)
        and np.allclose(rows_g, rows_e * factor, rtol=1e-3, atol=1e-4 * np.abs(rows_e).max())
    ):
        return None
    return (
        "off by one constant factor per head dimension, the same at every position: normalised with another "
        "norm weight than this layer's own (another layer's, or a weight shared or stacked wrongly)"
    )


def _not_normalised(name: str, what: str) -> Callable:
    def read(expected, got, context) -> str | None:
        """got = x where DFlash has x / rms(x) ⊙ w: each row of got over its own RMS is the expected row up to
        one factor per dimension (w), and got's rows are not of one RMS (a norm would have made them so)."""
        if got.shape != expected.shape or got.ndim < 2 or got.shape[-1] < 2:
            return None
        rows_e, rows_g = expected.reshape(-1, expected.shape[-1]), got.reshape(-1, got.shape[-1])
        rms = np.sqrt((rows_g.astype(np.float64) ** 2).mean(-1, keepdims=True))  # (rows, 1)
        if len(rows_g) < 2 or not np.all(rms > 0) or np.allclose(rms, rms[0], rtol=1e-2):
            return None
        unit = rows_g / rms
        usable = np.abs(unit) > 1e-3 * np.abs(unit).max()
        if not usable.any(axis=0).all():
            return None
        weight = np.nanmedian(np.where(usable, rows_e / unit, np.nan), axis=0)  # (d,): the norm's weight
        if not np.isfinite(weight).all() or not _agrees(rows_e, unit * weight, rel=1e-3):
            return None
        return (
            f"{what} is not normalised: each row of it, divided by its own RMS, is DFlash's (up to the norm's "
            f"weight), and its rows' RMS differ ({float(rms.min()):.3g} to {float(rms.max()):.3g}): {name} is "
            "missing (not applied, or a module that does not run)"
        )

    read.__name__ = f"_{name}_missing"
    return read


# ------------------------------------------------------------------------------------------ RoPE


def _rotation(expected: np.ndarray, got: np.ndarray, tol: float = 2e-3):
    """RoPE's frequency pairs (dimensions j and j + d_h/2) as complex numbers: when got is expected with each pair
    rotated by an angle that is the same in every head and scaled by one gain, (gain, angles (L, d_h/2), the
    angles as unit complex numbers, NaN where no head had a pair large enough to read), else None. RoPE rotates
    every pair of a row by p · θ_j and multiplies by its attention factor; it never mixes pairs or heads."""
    if got.shape != expected.shape or got.ndim != 3 or got.shape[-1] % 2 or got.shape[-1] < 2:
        return None
    half = got.shape[-1] // 2
    ze = expected[..., :half] + 1j * expected[..., half:]  # (H, L, d_h/2)
    zg = got[..., :half] + 1j * got[..., half:]
    usable = np.abs(ze) > 1e-2 * np.abs(ze).max()
    if not usable.any():
        return None
    ratio = np.where(usable, zg / np.where(usable, ze, 1), np.nan)
    gain = float(np.nanmedian(np.abs(ratio)))
    if not gain > 0 or not np.all(np.abs(np.abs(ratio[usable]) - gain) <= tol * gain):
        return None
    unit = ratio / np.abs(ratio)
    angle = np.nanmean(unit, axis=0)  # (L, d_h/2): one rotation per row and frequency, across heads
    angle = angle / np.abs(angle)
    if np.any(np.abs(unit - angle)[usable] > tol):  # the heads disagree: not one rotation
        return None
    return gain, angle


def _wrapped(angle: complex, turns: float) -> bool:
    """angle (a unit complex number) is a rotation by `turns` radians, modulo 2π."""
    return bool(abs(angle - complex(math.cos(turns), math.sin(turns))) < 2e-3)


def _rope_attention_factor(expected, got, context) -> str | None:
    """Every pair rotated, and every norm scaled by one factor g ≠ 1: RoPE tables with another attention factor.
    YaRN's is m = 0.1·ln(s) + 1 for its factor s, and it keeps the highest frequencies: g = 1/m with the first
    frequency's angles agreeing is YaRN not applied (the plain RoPE at the same θ)."""
    found = _rotation(expected, got)
    if found is None or abs(found[0] - 1) <= 2e-3:
        return None
    gain, angle = found
    first_agrees = bool(np.all(np.abs(angle[:, 0][~np.isnan(angle[:, 0])] - 1) < 2e-3))
    if gain < 1:
        m = 1 / gain
        s = math.exp(10 * (m - 1))
        return (
            f"Q's rows are DFlash's rotated and scaled by {gain:.4f}, one factor for all: the RoPE tables lack "
            f"an attention factor of {m:.4f} = 0.1·ln(s) + 1, YaRN's for a factor s = {s:.3g}"
            + (" (the highest frequency's angles agree, as YaRN leaves them)" if first_agrees else "")
            + ": the config's rope_scaling (YaRN) is not applied"
        )
    return (
        f"Q's rows are DFlash's rotated and scaled by {gain:.4f}, one factor for all: the RoPE tables carry an "
        "attention factor this config does not give (a RoPE scaling applied that it does not ask for)"
    )


def _rope_positions_shifted(expected, got, context) -> str | None:
    """Norms kept and the differing rows (a suffix: earlier rows may agree) all rotated by the same angles: Q
    rotated at positions a constant n off the block's. The first frequency is θ_0 = 1 for any base, so its angle
    is −n modulo 2π: n = the block's start (the prompt's length at step 0) is Q rotated from the front of the
    tables; n = 2^k with the earlier rows agreeing is a table of 2^k positions that wraps around."""
    found = _rotation(expected, got)
    if found is None or abs(found[0] - 1) > 2e-3:
        return None
    angle = found[1]
    moved = ~np.all(np.isnan(angle) | (np.abs(angle - 1) < 2e-3), axis=1)  # (L,) rows rotated at all
    if not moved.any():
        return None
    first = int(np.argmax(moved))
    if not moved[first:].all():
        return None
    rows = angle[first:]
    if np.any(np.abs(rows - rows[0])[~np.isnan(rows - rows[0])] > 2e-3) or np.isnan(rows[0, 0]):
        return None
    turn = rows[0, 0]  # the first frequency's rotation: −n radians
    if abs(turn - 1) < 2e-3:
        return None  # the first frequency agrees: not a shift of positions (another θ is read below)
    prompt = len((context.get("inputs") or {}).get("input_ids") or ())
    if first == 0 and prompt and _wrapped(turn, -prompt):
        return (
            f"Q is rotated at positions 0 … L_q − 1, the first rows of the RoPE tables, where DFlash rotates it "
            f"at the block's own (the last L_q rows: from {prompt} here), every row {prompt} positions off"
        )
    for k in range(8, 21):
        if _wrapped(turn, -(2**k)):
            agree = f" (the first {first} agree)" if first else ""
            return (
                f"every differing row is {2**k} positions off{agree}: positions from {2**k} on wrap around to 0: a "
                f"RoPE table (or a cache of cos/sin) of {2**k} positions"
            )
    return (
        "every row of Q is rotated by the same angles off DFlash's (norms kept): Q rotated at positions a constant "
        "off the block's, which are the last L_q rows of the RoPE tables"
    )


def _rope_theta(expected, got, context) -> str | None:
    """Norms kept, the first frequency's angles agree in every row (θ_0 = base⁰ = 1 whatever the base), the other
    frequencies' angles off by amounts that grow by a constant step from row to row (consecutive positions): the
    same positions with other frequencies: another rope_theta, or a scaling that keeps the highest frequency."""
    found = _rotation(expected, got)
    if found is None or abs(found[0] - 1) > 2e-3 or found[1].shape[1] < 2:
        return None
    angle = found[1]
    if np.isnan(angle).any() or np.any(np.abs(angle[:, 0] - 1) > 2e-3) or np.all(np.abs(angle[:, 1:] - 1) < 2e-3):
        return None
    if len(angle) > 2:
        step = angle[1:] / angle[:-1]  # (L − 1, d_h/2): the rotation from one row to the next
        if np.any(np.abs(step - step[0]) > 2e-3):
            return None
    return (
        "Q's norms agree and so do the highest frequency's angles (θ_0 = 1 whatever the base); the other "
        "frequencies' angles are off by more at every later position: another rope_theta than the config's (or "
        "a RoPE scaling applied or dropped that keeps the highest frequency)"
    )


def _rope_scaling_not_applied(expected, got, context) -> str | None:
    """Norms kept, every row p rotated by θ_j · p · (1 − 1/s) off DFlash's in every frequency j: the plain RoPE
    where the config asks for linear scaling by s (positions divided by s). Said with where the config gives the
    scaling: a config in transformers 5's spelling (`rope_parameters` alone) read for `rope_scaling` drops it."""
    rope, start = context.get("rope") or {}, context.get("start")
    found = _rotation(expected, got)
    if rope.get("type") != "linear" or start is None or found is None or abs(found[0] - 1) > 2e-3:
        return None
    factor, theta, half = float(rope["factor"]), float(rope["theta"]), got.shape[-1] // 2
    inverse = theta ** (-np.arange(half) / half)  # (d_h/2,): θ_j
    positions = start + np.arange(got.shape[1])  # (L_q,): the block's positions
    turns = positions[:, None] * inverse[None, :] * (1 - 1 / factor)  # (L_q, d_h/2)
    angle = found[1]
    if not np.all(np.isnan(angle) | (np.abs(angle - np.exp(1j * turns)) < 2e-3)):
        return None
    where = (
        " This config gives it in `rope_parameters` alone (transformers 5's spelling): a port that reads "
        "`rope_scaling` (or `rope_theta` alone) never sees it"
        if rope.get("spelled") == "rope_parameters"
        else ""
    )
    return (
        f"Q is rotated at p · θ_j where DFlash rotates it at (p / {factor:g}) · θ_j: the config's linear RoPE "
        f"scaling (factor {factor:g}) is not applied.{where}"
    )


# ------------------------------------------------------------------------------------------ keys and weights


def _keys_out_of_order(expected, got, context) -> str | None:
    """K after RoPE (H_kv, L_k, d_h): the port's keys are the expected last ones, in another order."""
    if got.ndim != 3 or expected.ndim != 3:
        return None
    tail = expected[:, expected.shape[1] - got.shape[1] :]  # after any evicted keys
    if got.shape != tail.shape or np.allclose(got, tail, atol=1e-3):
        return None
    order = [
        np.flatnonzero(np.isclose(tail[:, :, None], got[:, i : i + 1, None], atol=1e-3).all(axis=(0, 2, 3)))
        for i in range(got.shape[1])
    ]
    if not (all(len(o) == 1 for o in order) and sorted(int(o[0]) for o in order) == list(range(got.shape[1]))):
        return None
    return (
        "the right keys in the wrong order: a rotating (ring-buffer) cache read as stored, not in "
        "the order of positions that the mask assumes"
    )


def _keys_axis(expected, got) -> int | None:
    """The keys' axis where got and expected differ in it alone: −2 for K (H_kv, L_k, d_h), −1 for the
    weights (H_q, L_q, L_k); None otherwise."""
    if got.ndim != 3 or expected.ndim != 3:
        return None
    differ = [i for i in range(3) if got.shape[i] != expected.shape[i]]
    return differ[0] - 3 if len(differ) == 1 and differ[0] in (1, 2) else None


def _keys_not_cropped(axis: int) -> Callable:
    def read(expected, got, context) -> str | None:
        """More keys than DFlash attends to, nothing else of the shape changed: the previous block's K/V kept in
        the draft cache, which is cropped back to `start` after every pass."""
        if _keys_axis(expected, got) != axis or got.shape[axis] <= expected.shape[axis]:
            return None
        return (
            "more keys than DFlash attends to: a draft cache that was not cropped back to `start` keeps "
            "the previous block's K/V"
        )

    read.__name__ = "_keys_not_cropped"
    return read


def _context_window_in_k(expected, got, context) -> str | None:
    """K after RoPE with fewer keys than DFlash's, and those keys DFlash's last ones, value for value: the port
    attends only its newest keys, older context evicted (the block is always the last L_q keys): a draft cache
    that keeps the last N context positions."""
    if _keys_axis(expected, got) != -2 or got.shape[1] >= expected.shape[1]:
        return None
    if not _agrees(expected[:, expected.shape[1] - got.shape[1] :], got):
        return None
    q_len = _block_size(context)  # the bundle's block size (a shrunk last block is shorter)
    window = str(got.shape[1] - q_len) if q_len and got.shape[1] > q_len else None
    return (
        f"the port's K holds only DFlash's last {got.shape[1]} of its {expected.shape[1]} keys (those agree): it "
        f"attends only the last N = {window or f'{got.shape[1]} − L_q'} context keys, the older ones evicted: a "
        f"windowed draft context cache; if that is by design, declare `--variant draft_context_window={window or 'N'}`"
    )


def _context_window_in_weights(expected, got, context) -> str | None:
    """Attention weights over fewer keys than DFlash's, the same queries: the port attends only its newest keys
    (L_k = N + L_q), the older context evicted: a windowed draft context cache."""
    if _keys_axis(expected, got) != -1 or got.shape[2] >= expected.shape[2] or got.shape[2] <= got.shape[1]:
        return None
    window = got.shape[2] - got.shape[1]
    return (
        f"the port's weights cover {got.shape[2]} keys where DFlash's cover {expected.shape[2]}: it attends only "
        f"the last N = {window} context keys and the block: a windowed draft context cache; if that is by design, "
        f"declare `--variant draft_context_window={window}`"
    )


def _block_causal(expected, got, context) -> str | None:
    """Every weight above the block's diagonal 0 where DFlash's are not: a causal mask inside the block."""
    if got.shape != expected.shape or got.ndim != 3 or got.shape[-2] < 2:
        return None
    block = got[..., -got.shape[-2] :]  # (H_q, L_q, L_q): the block's columns
    upper = np.triu(np.ones(block.shape[-2:], dtype=bool), k=1)
    if np.all(block[..., upper] == 0) and np.any(expected[..., -got.shape[-2] :][..., upper] != 0):
        return "the block attends causally: DFlash's block is non-causal (every position sees every other)"
    return None


def _scores_scaled(expected, got, context) -> str | None:
    """The same keys seen, and each row's log-weights DFlash's times one factor r (plus the row's own constant):
    softmax(r·s) for DFlash's scores s, the same order of keys, a sharper or flatter softmax: the scores scaled
    otherwise; r = 1/√d_h is 1/d_h in place of 1/√d_h, r = √d_h no scaling at all."""
    if got.shape != expected.shape or got.ndim != 3:
        return None
    seen = got > 0
    if not np.array_equal(seen, expected > 0):
        return None
    log_e, log_g = np.log(np.where(seen, expected, 1.0)), np.log(np.where(seen, got, 1.0))
    count = np.maximum(seen.sum(-1, keepdims=True), 1)
    centred_e = (log_e - (log_e * seen).sum(-1, keepdims=True) / count) * seen
    centred_g = (log_g - (log_g * seen).sum(-1, keepdims=True) / count) * seen
    spread = float((centred_e**2).sum())
    if spread < 1e-8:
        return None
    r = float((centred_e * centred_g).sum()) / spread
    off = np.abs(centred_g - r * centred_e).max() / max(1.0, np.abs(centred_e).max())
    if r <= 0 or abs(r - 1) < 1e-2 or off > 1e-3:
        return None
    if r < 1 and abs(1 / r**2 - round(1 / r**2)) < 0.02 * r**-2 and round(1 / r**2) >= 2:
        why = f"1/d_h in place of 1/√d_h gives r = 1/√d_h (d_h = {round(1 / r**2)})"
    elif r > 1 and abs(r**2 - round(r**2)) < 0.02 * r**2 and round(r**2) >= 2:
        why = f"scores not scaled at all give r = √d_h (d_h = {round(r**2)})"
    else:
        why = "another scale than 1/√d_h"
    return (
        f"each row's log-weights are DFlash's times {r:.3g} (plus a constant): the same keys in the same order, a "
        f"{'flatter' if r < 1 else 'sharper'} softmax: the scores are scaled {r:.3g}× DFlash's 1/√d_h; {why}"
    )


def _heads_tiled(expected, got, context) -> str | None:
    """The query heads that agree are exactly those h with h // (H_q / H_kv) = h mod H_kv for some H_kv: the heads
    whose KV head is the same whether KV heads are repeated (DFlash: h reads KV head h // (H_q / H_kv)) or tiled
    (h reads h mod H_kv); every other head reads another KV head."""
    if got.shape != expected.shape or got.ndim != 3 or got.shape[0] < 4:
        return None
    heads = got.shape[0]
    agree = [bool(np.all(np.abs(got[h] - expected[h]) <= 1e-4)) for h in range(heads)]
    if all(agree) or not any(agree):
        return None
    for kv in range(2, heads):
        if heads % kv == 0 and agree == [h // (heads // kv) == h % kv for h in range(heads)]:
            same, other = [h for h in range(heads) if agree[h]], [h for h in range(heads) if not agree[h]]
            return (
                f"query heads {same} agree and {other} do not: exactly those whose KV head differs between "
                f"h // (H_q/H_kv) and h mod H_kv for H_kv = {kv}: the KV heads tiled (repeat / tile) where DFlash "
                "repeats each in place (repeat_interleave)"
            )
    return None


# ------------------------------------------------------------------------------------------ sliding windows


def window_readings(q_len: int, k_len: int, window: int) -> dict[str, np.ndarray]:
    """Which keys each reading of a sliding window lets the block's queries see: bool (L_q, L_k) each,
    queries being the last L_q keys (attention.py states the three meanings; the block-start one is a port's:
    the window measured once, from the block's first position, for every query: the W positions before it)."""
    q = np.arange(k_len - q_len, k_len)[:, None]  # (L_q, 1)
    k = np.arange(k_len)[None, :]  # (1, L_k)
    start = k_len - q_len
    context = (k < start) & (q - k < window)
    from_start = (k < start) & (start - k <= window)  # the W positions before x_0: kv_pos ≥ start − W
    return {
        "causal": (k <= q) & (q - k < window),
        "symmetric": np.abs(q - k) < window,
        "rotating": context | ((k >= start) & (k <= q)),
        "rotating, non-causal": context | (k >= start),
        "measured from the block start": np.broadcast_to(from_start | (k >= start), (q_len, k_len)),
        "measured from the block start, causal": from_start | ((k >= start) & (k <= q)),
        "not applied (causal)": np.broadcast_to(k <= q, (q_len, k_len)),
        "not applied (non-causal)": np.ones((q_len, k_len), bool),
    }


def _window_read(expected, got, context) -> str | None:
    """On a sliding-window layer: the reading of the window whose visible keys the port's weights show."""
    window, layer = context.get("sliding_window"), context.get("layer")
    if not window or layer not in window["layers"] or got.shape != expected.shape or got.ndim != 3:
        return None
    seen, meant = (got != 0).any(axis=0), (expected != 0).any(axis=0)  # (L_q, L_k) over the heads
    readings = window_readings(*got.shape[1:], window["size"])
    found = [name for name, mask in readings.items() if np.array_equal(seen, mask) and not np.array_equal(meant, mask)]
    if not found:
        return None
    if found[0].startswith("not applied"):
        return f"the configured sliding window ({window['size']}) is not applied: every key is seen"
    if found[0].startswith("measured from the block start"):
        return (
            f"the window is measured from the block's start, not from each query: every block query sees the "
            f"{window['size']} context keys before the block's first position (and the block), where this "
            f"bundle's config means {window['kind']}; if that is by design, declare "
            "`--variant sliding_window=block-start`"
        )
    return (
        f"the window is read as {found[0]} where this bundle's config means {window['kind']} "
        f"(attention.py: a sliding window's three meanings)"
    )


# ------------------------------------------------------------------------------------------ the block's length

# per stage with the block along an axis: (axis, L_q − its length there)
BLOCK_AXIS = {s.name: s.block_axis for s in STAGES if s.block_axis}


def _block_length(stage: str) -> Callable:
    axis, extra = BLOCK_AXIS[stage]

    def read(expected, got, context) -> str | None:
        """A shape that differs along the block's axis alone (the weights: along the keys too, by as much): the
        port's block has another length than DFlash's. The block embedding must agree on the rows both have
        ([x_0, mask, …]), which says it is the same block, only shorter or longer."""
        if got.ndim != expected.ndim or got.ndim <= axis or got.shape[axis] == expected.shape[axis]:
            return None
        differ = [i for i in range(got.ndim) if got.shape[i] != expected.shape[i]]
        delta = got.shape[axis] - expected.shape[axis]
        if differ != [axis] and not (
            stage == "pattern" and differ == [1, 2] and got.shape[2] - expected.shape[2] == delta
        ):
            return None
        both = min(got.shape[axis], expected.shape[axis])
        if stage == "noise_embedding" and not _agrees(expected[:both], got[:both]):
            return None
        ours, theirs = got.shape[axis] + extra, expected.shape[axis] + extra
        longer = (
            " (DFlash shrinks the last block to max_length − start: a port that drafts it whole and truncates "
            "the output declares `--variant last_block=full-then-truncate`)"
            if ours > theirs
            else ""
        )
        return (
            f"the port's block has L_q = {ours} where DFlash's has {theirs}{longer}: if its blocks adapt in length "
            "by design, declare `--variant block_length=adaptive`"
        )

    read.__name__ = f"_block_length_at_{stage}"
    return read


# ------------------------------------------------------------------------------------------ DFlash 2


def _differing_rows(expected: np.ndarray, got: np.ndarray) -> np.ndarray | None:
    """The rows (first axis) where got is off expected by more than rounding, or None (shapes differ)."""
    if got.shape != expected.shape or got.ndim < 2:
        return None
    scale = max(1.0, float(np.abs(expected).max()))
    return np.flatnonzero((np.abs(got - expected) > 1e-4 * scale).reshape(got.shape[0], -1).any(axis=1))


def _conv_reads_before_block(expected, got, context) -> str | None:
    """Only a leading run of the block's rows differs (never the last): the convolution reads positions before
    the block (a stream's state carried over), which only the first K − 1 rows reach back to."""
    rows = _differing_rows(expected, got)
    if rows is None or not rows.size:
        return None
    if rows[0] == 0 and rows[-1] < len(expected) - 1 and np.array_equal(rows, np.arange(rows.size)):
        return (
            "only the block's first positions differ: the convolution reads positions before the block; it "
            "restarts at every block's first position (zero before it)"
        )
    return None


def _conv_reads_later(expected, got, context) -> str | None:
    """At the first layer the block is [x_0, mask, …, mask]: the rows that read masks alone are all equal. In
    DFlash's causal convolution they are the last ones (t ≥ K − 1, from row a on); a convolution that reads x_{t+j}
    has them first, rows 1 … L_q − a, with the same value: the convolution runs the other way."""
    if got.shape != expected.shape or got.ndim != 2 or len(got) < 3:
        return None
    masks = expected[-1]
    same_e = [t for t in range(len(expected)) if _agrees(masks, expected[t], rel=1e-5)]
    same_g = [t for t in range(len(got)) if _agrees(masks, got[t], rel=1e-5)]
    first = len(expected) - len(same_e)  # DFlash's all-mask rows: first … L_q − 1
    if not (2 <= first < len(expected) and same_e == list(range(first, len(expected)))):
        return None
    if same_g != list(range(1, len(expected) - first + 1)):
        return None
    return (
        f"the rows that read only mask positions are the block's rows 1 … {len(expected) - first} here and its last "
        f"ones ({first} … {len(expected) - 1}) in DFlash: the convolution reads later positions x_{{t+j}}, not x_t and "
        "earlier (a padding on the wrong side, or a kernel applied flipped): it must be causal"
    )


def _predecessor_not_chosen(expected, got, context) -> str | None:
    """The first position's pair scores agree, a later one's not: the first predecessor is the anchor, which
    every reading shares; the later ones are what the selector chose before."""
    rows = _differing_rows(expected, got)
    if rows is None or not rows.size or rows[0] == 0:
        return None
    return (
        "the first position's pair scores agree, later ones not: the predecessor must be the candidate "
        "chosen at the previous position (not the argmax of its logits)"
    )


def _pair_free_of_position(expected, got, context) -> str | None:
    """A pair score recurs exactly at another position of the port's, never of DFlash's: the port's scores depend
    on (predecessor, candidate) alone, as ⟨E_pred, E_succ⟩ without the position's P h_t does."""

    def recurring(x: np.ndarray) -> bool:
        rows = x.reshape(len(x), -1)
        scale = max(1e-6, float(np.abs(x).max()))
        return any(
            np.any(np.abs(rows[t][:, None] - rows[u][None, :]) <= 1e-6 * scale)
            for t in range(len(rows))
            for u in range(t + 1, len(rows))
        )

    if got.shape != expected.shape or got.ndim != 2 or len(got) < 2 or not recurring(got) or recurring(expected):
        return None
    return (
        "the same pair score recurs at another position: the port's pair term depends on the predecessor and the "
        "candidate alone: P h_t, the rank projection of the position's final hidden, is missing from it"
    )


# ------------------------------------------------------------------------------------------ the draft's output


def _logits_rows_shifted(expected, got, context) -> str | None:
    """Each row is DFlash's previous (next) one: the logits taken at block positions 0 … γ − 1 (2 … γ + 1); one
    more row than DFlash's whose last γ agree: every position's logits, x_0's too."""
    if got.ndim != 2 or expected.ndim != 2 or got.shape[1] != expected.shape[1]:
        return None
    if got.shape[0] == expected.shape[0] + 1 and _agrees(expected, got[1:]):
        return "the logits of every block position, x_0's too: DFlash takes them at positions 1 … γ only (`[:, 1:]`)"
    if got.shape != expected.shape or len(got) < 2:
        return None
    if _agrees(expected[:-1], got[1:]):
        return (
            "each row of the port's logits is DFlash's previous one: the logits of block positions 0 … γ − 1, one "
            "too early; DFlash takes positions 1 … γ (`[:, 1:]`: position 0 holds x_0)"
        )
    if _agrees(expected[1:], got[:-1]):
        return "each row of the port's logits is DFlash's next one: positions 2 … γ + 1, one too late (`[:, 1:]`)"
    return None


# ------------------------------------------------------------------------------------------ the loop


def prompt_taken_for_the_end(inputs: dict, output) -> str | None:
    """A port that returned its prompt alone, where the prompt ends with a stop token: it took that token for the
    end of its own output (said where x_0 is missing)."""
    prompt, stops = list(inputs.get("input_ids") or ()), set(inputs.get("stop_token_ids") or ())
    output = None if output is None else np.asarray(output).reshape(-1).tolist()
    if output != prompt or not prompt or prompt[-1] not in stops:
        return None
    return (
        f"the port returned the prompt alone: the prompt ends with the stop token {prompt[-1]}, which the port took "
        "for the end of its output. A stop token ends a decode when it is generated, never in the prompt (DFlash "
        "and the target alone both decode this prompt)"
    )


def _tau_of_what_is_committed(expected, got, context) -> str | None:
    """At a step the length limit or a stop token cuts, τ = the tokens it commits − 1: a counter of committed tokens,
    not a bug."""
    cut = (context.get("cut") or {}).get(context.get("step"))
    if cut is None or got.size != 1 or int(got.reshape(-1)[0]) != cut[0] - 1:
        return None
    return (
        f"τ = {cut[0] - 1} where DFlash's is {int(expected.reshape(-1)[0])}, at a step whose tokens max_new_tokens or "
        f"a stop token cuts to {cut[0]}: the port counts only the accepted tokens it commits (as vLLM and transformers "
        "do); "
        "DFlash counts every accepted draft token, then commits what fits. A counting choice: declare "
        "`--variant accepted_count=committed`"
    )


def _committed_past_the_stop(expected, got, context) -> str | None:
    """A port that counts τ by what it commits (DFlash's τ here: the tokens to the stop, less one) and whose τ is
    larger: it committed tokens past a stop token inside the step's accepted run."""
    step = context.get("step")
    cut = (context.get("cut") or {}).get(step)
    stops = set((context.get("inputs") or {}).get("stop_token_ids") or ())
    if cut is None or cut[1] not in stops or got.size != 1 or expected.size != 1:
        return None
    ours, theirs = int(got.reshape(-1)[0]), int(expected.reshape(-1)[0])
    if theirs != cut[0] - 1 or ours <= theirs:
        return None
    return (
        f"τ = {ours} where DFlash's is {theirs}: step {step}'s accepted run reaches the stop token {cut[1]} at its "
        f"token {cut[0]}, where DFlash commits it and ends; the port committed {ours - theirs} token(s) of the same "
        "run after it. A stop token inside a step's committed block ends the output there: a stop looked for at "
        "the last committed token alone goes past it"
    )


def _tau_not_the_run(expected, got, context) -> str | None:
    """τ larger than DFlash's: matches after the first mismatch were counted (a sum, where DFlash's cumulative
    product stops at it); smaller: the run stops early, d_i compared with another posterior token."""
    if got.shape != expected.shape or got.size != 1:
        return None
    ours, theirs = int(got.reshape(-1)[0]), int(expected.reshape(-1)[0])
    if ours > theirs:
        return (
            f"τ = {ours} where DFlash's is {theirs}: matches after the first mismatch were counted: τ is the length "
            "of the leading run of matches (Σ_i Π_{j≤i} 1[d_j = posterior_{j−1}], a cumulative product), not a "
            "count of matches"
        )
    if ours < theirs:
        return (
            f"τ = {ours} where DFlash's is {theirs}: the accepted run stops early: d_i is compared with "
            "posterior[i − 1], the target's token after x_0, d_1, …, d_{i−1}"
        )
    return None


def _mask_tokens_stripped(expected, got, context) -> str | None:
    """The output equals DFlash's with the new tokens equal to mask_token_id taken out."""
    if got.ndim != 1 or expected.ndim != 1 or "inputs" not in context:
        return None
    prompt = len(context["inputs"]["input_ids"])
    mask = context.get("mask_token_id")
    new = expected[prompt:]
    if (
        mask is None
        or len(got) >= len(expected)
        or not np.array_equal(got, np.concatenate([expected[:prompt], new[new != mask]]))
    ):
        return None
    return (
        f"the output lacks the tokens equal to mask_token_id ({mask}): they are real tokens the "
        "target chose, never to be stripped"
    )


def _past_the_stop(expected, got, context) -> str | None:
    """The output is DFlash's and more, DFlash's ending at a stop token: tokens committed after it."""
    if got.ndim != 1 or expected.ndim != 1 or not expected.size:
        return None
    stops = set((context.get("inputs") or {}).get("stop_token_ids") or ())
    if len(got) > len(expected) and np.array_equal(got[: len(expected)], expected) and expected[-1] in stops:
        return "tokens were committed after the stop token: a step's output ends at its first stop token"
    return None


def _prompt_alone(expected, got, context) -> str | None:
    """The output is the prompt, which ends with a stop token (a missing x_0 says the same, judge.compare)."""
    return prompt_taken_for_the_end(context.get("inputs") or {}, got) if got.ndim == 1 else None


def _past_max_new_tokens(expected, got, context) -> str | None:
    """More new tokens than max_new_tokens, DFlash's output first: the length limit is not applied to the last step."""
    inputs = context.get("inputs") or {}
    if got.ndim != 1 or expected.ndim != 1 or "max_new_tokens" not in inputs or "input_ids" not in inputs:
        return None
    limit = len(inputs["input_ids"]) + inputs["max_new_tokens"]
    if len(got) <= limit or len(expected) > limit or not np.array_equal(got[: len(expected)], expected):
        return None
    return (
        f"{len(got) - len(inputs['input_ids'])} new tokens where max_new_tokens is {inputs['max_new_tokens']}, "
        "DFlash's output first: the port commits a whole step past the limit (the last step's τ + 1 tokens kept, "
        "or another step run), where a step commits at most what is left of max_new_tokens"
    )


READERS: dict[str, tuple[Callable, ...]] = {
    "layer_ids": (_ids_shifted,),
    "target_hidden": (_only_first_row_agrees, _features_one_layer_early, _features_before_a_norm, _features_not_sliced),
    "context": (_not_normalised("hidden_norm", "C"),),
    "attn_conv_in": (_conv_reads_before_block, _conv_reads_later),
    "mlp_conv_in": (_conv_reads_before_block, _conv_reads_later),
    "q": (_other_norm_weight, _not_normalised("q_norm", "Q")),
    "k_ctx": (_other_norm_weight, _not_normalised("k_norm", "K")),
    "k_noise": (_other_norm_weight, _not_normalised("k_norm", "K")),
    "q_rot": (_rope_attention_factor, _rope_scaling_not_applied, _rope_positions_shifted, _rope_theta),
    "k_rot": (_keys_out_of_order, _keys_not_cropped(-2), _context_window_in_k),
    "pattern": (
        _window_read,
        _keys_not_cropped(-1),
        _context_window_in_weights,
        _block_causal,
        _scores_scaled,
        _heads_tiled,
    ),
    "logits": (_logits_rows_shifted,),
    "pair": (_predecessor_not_chosen, _pair_free_of_position),
    "acceptance_length": (_tau_of_what_is_committed, _committed_past_the_stop, _tau_not_the_run),
    "output_ids": (_prompt_alone, _mask_tokens_stripped, _past_the_stop, _past_max_new_tokens),
}
for _stage in BLOCK_AXIS:  # last: a block of another length, where nothing above read the shapes
    READERS[_stage] = (*READERS.get(_stage, ()), _block_length(_stage))
