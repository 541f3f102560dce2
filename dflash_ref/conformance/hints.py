"""Hints for the first divergence: the usual causes at each stage (a hybrid target's state rolled back
by a crop alone among them), and a few causes the tensors themselves can tell (a causal block, keys
left over from an uncropped cache, tokens stripped or committed past a stop token). A hint is a guess to
check first, never a verdict."""

from __future__ import annotations

import numpy as np

BY_STAGE = {
    "layer_ids": "target_layer_ids: the official formula is round(1 + i·(L − 4)/(n − 1)) (n = 1: [L // 2]), "
    "unless the draft's config gives them",
    "target_hidden": "layer l is read at hidden_states[l + 1] (index 0 is the embedding output); after a "
    "verify only the first τ + 1 positions' features are new context",
    "fc": "fc takes the concatenated features of the sampled layers, in target_layer_ids' order, without bias",
    "context": "C = hidden_norm(fc(target_hidden)): fc first, then the RMSNorm",
    "noise_embedding": "the block is [x_0, mask, …, mask] embedded by the target's own embedding",
    "attn_conv_taps": "DFlash 2: the taps are kernel_projection(x) of the sublayer's normed input, (2, K, G) per "
    "position: [0] for prepare, [1] for finish",
    "attn_conv_in": "DFlash 2: u_t = Σ_j (w⁰_j + a⁰_{t,j,g}) ⊙ x_{t−j}, reading only x_t and earlier positions of "
    "this block (zero before its first)",
    "attn_conv_out": "DFlash 2: finish convolves the sublayer's output with w¹ and the taps a¹ computed from the "
    "sublayer's input, not from its output",
    "mlp_conv_taps": "DFlash 2: the MLP's taps come from its own normed input, RMSNorm_post(H')",
    "mlp_conv_in": "DFlash 2: the MLP's input convolved as the attention's: causal, restarted at the block start",
    "mlp_conv_out": "DFlash 2: the MLP's output convolved with w¹ and the taps of the MLP's input",
    "q": "Q = q_norm(H W_Q) per head, before RoPE: a missing q_norm shows here",
    "k_ctx": "K = k_norm([C W_K; H W_K]) per head, before RoPE: a missing k_norm, or context K from H, shows here",
    "k_noise": "K = k_norm([C W_K; H W_K]) per head, before RoPE: a missing k_norm shows here",
    "v": "V = [C W_V; H W_V], no norm",
    "q_rot": "Q is rotated at the block's positions, the last L_q rows of the RoPE tables; a wrong rope_theta "
    "or RoPE scaling shows here too",
    "k_rot": "K is rotated at all L_c + L_q new positions and appended to the cached context K",
    "pattern": "softmax(QKᵀ/√d_h) over context and block keys, non-causal inside the block on full-attention "
    "layers; query head h reads KV head h // (H_q / H_kv)",
    "attn_out": "o_proj of the attention output, heads concatenated in order",
    "layer_out": "pre-norm: H + Attn(LN(H)), then + MLP(LN(·))",
    "final_hidden": "the final norm of the last layer's output",
    "logits": "the target's lm_head on the draft's last L_q − 1 positions (`[:, 1:]`, position 0 is x_0)",
    "candidates": "DFlash 2: the selector_top_k largest draft logits at each proposal position (a set)",
    "unary": "DFlash 2: the unary score of a candidate is its draft logit",
    "pair": "DFlash 2: ⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩: both codebooks loaded (released checkpoints store "
    "them without `.weight`), P the rank projection of the final hidden",
    "draft_tokens": "greedy proposals are the argmax of the draft logits (DFlash 2: of unary + pair, walked from "
    "the anchor)",
    "posterior": "the target verifies [x_0, d_1, …] in one pass from its cache cropped to `start`",
    "acceptance_length": "τ = Σ_i Π_{j≤i} 1[d_j = posterior_{j−1}]: a cumulative product, not a count of matches",
    "bonus": "the bonus is the target's token after the accepted run, posterior[τ], never a draft token",
    "cache_lengths": "the draft cache is cropped back to `start` after every pass; the target's to the new start",
    "conv_state": "after a verify of L tokens and the crop to n + m, a linear layer's conv window is the last K − 1 "
    "committed inputs, [W_n; u_{n+1..n+L}][m : m + K − 1], not the verify's last K − 1",
    "recurrent_state": "a crop cannot cut a recurrent state back (a crop-only rollback, as transformers' "
    "DynamicCache.crop, trims the conv window and leaves S with the rejected tokens in): keep S "
    "per verified position and pick S_{n+m} (target/hybrid_cache.py), or snapshot S_n before "
    "the verify and replay the m accepted tokens (the official MLX backend)",
    "output_ids": "every committed token is kept (also one equal to mask_token_id), none after a stop token",
}


def hint(
    stage: str, expected: np.ndarray | None, got: np.ndarray | None, manifest: dict, layer: int | None = None
) -> str:
    """One line: what the tensors show, else the stage's usual causes."""
    told = None
    if expected is not None and got is not None:
        told = _window_read(expected, got, manifest.get("sliding_window"), layer) if stage == "pattern" else None
        told = told or _told(stage, expected, got, manifest)
    return told or BY_STAGE.get(stage, "")


def window_readings(q_len: int, k_len: int, window: int) -> dict[str, np.ndarray]:
    """Which keys each reading of a sliding window lets the block's queries see: bool (L_q, L_k) each,
    queries being the last L_q keys (attention.py states the three meanings)."""
    q = np.arange(k_len - q_len, k_len)[:, None]  # (L_q, 1)
    k = np.arange(k_len)[None, :]  # (1, L_k)
    context = (k < k_len - q_len) & (q - k < window)
    return {
        "causal": (k <= q) & (q - k < window),
        "symmetric": np.abs(q - k) < window,
        "rotating": context | ((k >= k_len - q_len) & (k <= q)),
        "rotating, non-causal": context | (k >= k_len - q_len),
        "not applied (causal)": np.broadcast_to(k <= q, (q_len, k_len)),
        "not applied (non-causal)": np.ones((q_len, k_len), bool),
    }


def _window_read(expected: np.ndarray, got: np.ndarray, window: dict | None, layer: int | None) -> str | None:
    """On a sliding-window layer: the reading of the window whose visible keys the port's weights show."""
    if not window or layer not in window["layers"] or got.shape != expected.shape or got.ndim != 3:
        return None
    seen, meant = (got != 0).any(axis=0), (expected != 0).any(axis=0)  # (L_q, L_k) over the heads
    readings = window_readings(*got.shape[1:], window["size"])
    found = [name for name, mask in readings.items() if np.array_equal(seen, mask) and not np.array_equal(meant, mask)]
    if not found:
        return None
    if found[0].startswith("not applied"):
        return f"the configured sliding window ({window['size']}) is not applied: every key is seen"
    return (
        f"the window is read as {found[0]} where this bundle's config means {window['kind']} "
        f"(attention.py: a sliding window's three meanings)"
    )


def _keys_out_of_order(expected: np.ndarray, got: np.ndarray) -> bool:
    """K after RoPE (H_kv, L_k, d_h): the port's keys are the expected last ones, in another order."""
    tail = expected[:, expected.shape[1] - got.shape[1] :]  # after any evicted keys
    if got.shape != tail.shape or np.allclose(got, tail, atol=1e-3):
        return False
    order = [
        np.flatnonzero(np.isclose(tail[:, :, None], got[:, i : i + 1, None], atol=1e-3).all(axis=(0, 2, 3)))
        for i in range(got.shape[1])
    ]
    return all(len(o) == 1 for o in order) and sorted(int(o[0]) for o in order) == list(range(got.shape[1]))


def _differing_rows(expected: np.ndarray, got: np.ndarray) -> np.ndarray | None:
    """The rows (first axis) where got is off expected by more than rounding, or None (shapes differ)."""
    if got.shape != expected.shape or got.ndim < 2:
        return None
    scale = max(1.0, float(np.abs(expected).max()))
    return np.flatnonzero((np.abs(got - expected) > 1e-4 * scale).reshape(got.shape[0], -1).any(axis=1))


def _told_dflash2(stage: str, expected: np.ndarray, got: np.ndarray) -> str | None:
    rows = _differing_rows(expected, got)
    if rows is None or not rows.size:
        return None
    if (
        stage in ("attn_conv_in", "mlp_conv_in")
        and rows[0] == 0
        and rows[-1] < len(expected) - 1
        and np.array_equal(rows, np.arange(rows.size))
    ):
        return (
            "only the block's first positions differ: the convolution reads positions before the block; it "
            "restarts at every block's first position (zero before it)"
        )
    if stage == "pair" and rows[0] > 0:
        return (
            "the first position's pair scores agree, later ones not: the predecessor must be the candidate "
            "chosen at the previous position (not the argmax of its logits)"
        )
    return None


def _scaled_per_dimension(expected: np.ndarray, got: np.ndarray) -> bool:
    """got = expected × c_j, one factor per last-axis element, the same in every row (and not all 1): what
    a norm weight other than its own gives (a norm is x / rms(x) ⊙ w)."""
    if got.shape != expected.shape or got.ndim < 2:
        return False
    rows_e, rows_g = expected.reshape(-1, expected.shape[-1]), got.reshape(-1, got.shape[-1])
    usable = np.abs(rows_e) > 1e-3 * np.abs(rows_e).max()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(usable, rows_g / rows_e, np.nan)
    factor = np.nanmedian(ratio, axis=0)  # (d_h,)
    return bool(
        np.isfinite(factor).all()
        and not np.allclose(factor, 1, atol=1e-3)
        and np.allclose(rows_g, rows_e * factor, rtol=1e-3, atol=1e-4 * np.abs(rows_e).max())
    )


def _only_first_row_agrees(expected: np.ndarray, got: np.ndarray) -> bool:
    """Row 0 equal up to float rounding, the later rows off by far more: what another RoPE gives the target's
    features at the prefill, since position 0 is rotated by nothing whatever θ or scaling."""
    if got.shape != expected.shape or got.ndim != 2 or got.shape[0] < 2:
        return False
    rows = np.abs(got - expected).max(-1) / max(1.0, float(np.abs(expected).max()))
    return bool(rows[0] <= 1e-5 and np.median(rows[1:]) > 100 * max(float(rows[0]), 1e-7))


def _told(stage: str, expected: np.ndarray, got: np.ndarray, manifest: dict) -> str | None:
    if stage == "target_hidden" and _only_first_row_agrees(expected, got):
        return (
            "the first position's features agree and the later ones' do not: the target encodes positions "
            "otherwise, its RoPE θ or scaling (position 0 is not rotated); e.g. a config that spells θ as "
            "transformers 5 writes it (`rope_parameters`) read for `rope_theta` alone, which falls back to 10⁴"
        )
    if stage in ("attn_conv_in", "mlp_conv_in", "pair"):
        return _told_dflash2(stage, expected, got)
    if stage in ("q", "k_ctx", "k_noise") and _scaled_per_dimension(expected, got):
        return (
            "off by one constant factor per head dimension, the same at every position: normalised with another "
            "norm weight than this layer's own (another layer's, or a weight shared or stacked wrongly)"
        )
    if stage == "k_rot" and got.ndim == 3 == expected.ndim and _keys_out_of_order(expected, got):
        return (
            "the right keys in the wrong order: a rotating (ring-buffer) cache read as stored, not in "
            "the order of positions that the mask assumes"
        )
    if (
        stage in ("k_rot", "pattern")
        and got.ndim == expected.ndim
        and got.shape[-2 if stage == "k_rot" else -1] > expected.shape[-2 if stage == "k_rot" else -1]
    ):
        return (
            "more keys than DFlash attends to: a draft cache that was not cropped back to `start` keeps "
            "the previous block's K/V"
        )
    if stage == "pattern" and got.shape == expected.shape and got.shape[-2] > 1:
        block = got[..., -got.shape[-2] :]  # (H_q, L_q, L_q): the block's columns
        upper = np.triu(np.ones(block.shape[-2:], dtype=bool), k=1)
        if np.all(block[..., upper] == 0) and np.any(expected[..., -got.shape[-2] :][..., upper] != 0):
            return "the block attends causally: DFlash's block is non-causal (every position sees every other)"
    if stage == "output_ids" and got.ndim == 1 and expected.ndim == 1:
        prompt = len(manifest["inputs"]["input_ids"])
        mask = manifest.get("mask_token_id")
        new = expected[prompt:]
        if (
            mask is not None
            and np.array_equal(got, np.concatenate([expected[:prompt], new[new != mask]]))
            and len(got) < len(expected)
        ):
            return (
                f"the output lacks the tokens equal to mask_token_id ({mask}): they are real tokens the "
                "target chose, never to be stripped"
            )
        stops = set(manifest["inputs"].get("stop_token_ids") or ())
        if len(got) > len(expected) and np.array_equal(got[: len(expected)], expected) and expected[-1] in stops:
            return "tokens were committed after the stop token: a step's output ends at its first stop token"
    return None
