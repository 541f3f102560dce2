"""What the viewer shows of a trace, as one JSON-able dict: per step the block, the proposals, the posterior,
τ, the bonus and the caches; the attention weights of the recorded layers (draft, and target where traced);
DFlash 2's candidate lattice. Labels are token texts where the trace says them (meta `vocab`, a list, or
`token_text`, id → text), else `#id`; a position's token comes from meta `output_ids` or from what the
records committed, else it is shown by position only.

Weights are stored as little-endian float16 (or float32), base64: a long SmolLM2 run stays a file a browser
opens. float16 keeps about 3 significant digits; the page says which precision it holds.
"""

from __future__ import annotations

import base64

import torch

VIEW_FORMAT = "dflash_ref.view/1"
PRECISIONS = {"float16": torch.float16, "float32": torch.float32}
DRAFT_PATTERN = "draft.layers.{}.self_attn.hook_pattern"
TARGET_PATTERN = "target.model.layers.{}.self_attn.hook_pattern"
SELECTOR = "draft.candidate_selector.hook_{}"


def build(trace, steps=None, layers=None, target_layers=None, precision: str = "float16") -> dict:
    """The payload of `trace` (a dflash_ref.trace.Trace) for the given steps and layers (default: all
    recorded). Raises ValueError naming what is wrong with a trace the viewer cannot show."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: choose one of {sorted(PRECISIONS)}")
    records = trace.records
    if not records:
        raise ValueError("the trace has no steps: nothing was decoded while it recorded (an empty trace)")
    if len(trace.activations) != len(records):
        raise ValueError(
            f"the trace is damaged: {len(records)} step records but activations for {len(trace.activations)} steps"
        )
    wanted = _steps(steps, len(records))
    text = _texts(trace.meta)
    positions = _sequence(trace.meta, records)
    draft_layers = _layers(trace, DRAFT_PATTERN, layers, "draft")
    target_layers = _layers(trace, TARGET_PATTERN, target_layers, "target")
    dtype = PRECISIONS[precision]
    out = {
        "format": VIEW_FORMAT,
        "precision": precision,
        "meta": {k: v for k, v in trace.meta.items() if k in ("prompt", "draft", "title") and isinstance(v, str)},
        "positions": [None if p not in positions else _label(positions[p], text) for p in range(_length(records))],
        "steps": [_step(records[s], text, trace.meta) for s in wanted],
        "draft": {"layers": draft_layers, "patterns": {}},
        "target": {"layers": target_layers, "patterns": {}},
        "lattice": {},
    }
    for i, s in enumerate(wanted):
        acts, record = trace.activations[s], records[s]
        for layer in draft_layers:
            weights = acts.get(DRAFT_PATTERN.format(layer))
            if weights is not None:
                _check_pattern(weights, len(record.q_position_ids), s, f"draft layer {layer}")
                out["draft"]["patterns"][f"{i},{layer}"] = _array(weights, dtype)
        for layer in target_layers:
            weights = acts.get(TARGET_PATTERN.format(layer))
            if weights is not None:
                _check_pattern(weights, record.verify_size or len(record.block_ids), s, f"target layer {layer}")
                out["target"]["patterns"][f"{i},{layer}"] = _array(weights, dtype)
        if SELECTOR.format("candidates") in acts:
            out["lattice"][str(i)] = _lattice(acts, record, text, s)
    return out


def _steps(steps, count: int) -> list[int]:
    if steps is None:
        return list(range(count))
    chosen = sorted(set(steps))
    bad = [s for s in chosen if not 0 <= s < count]
    if bad or not chosen:
        raise ValueError(f"steps {bad or '(none)'} are not in this trace, which has steps 0 … {count - 1}")
    return chosen


def _layers(trace, pattern: str, chosen, which: str) -> list[int]:
    recorded = sorted(layer for layer in (_layer_in(n, pattern) for n in trace.keys()) if layer is not None)
    if chosen is None:
        return recorded
    missing = sorted(set(chosen) - set(recorded))
    if missing:
        raise ValueError(
            f"{which} layers {missing} have no attention weights in this trace; recorded: {recorded or 'none'}"
        )
    return sorted(set(chosen))


def _layer_in(name: str, pattern: str) -> int | None:
    """The layer number of a hook name of the pattern's form ("….layers.{}.self_attn.hook_pattern"), else None."""
    head, tail = pattern.split("{}")
    middle = name[len(head) : len(name) - len(tail)]
    return int(middle) if name.startswith(head) and name.endswith(tail) and middle.isdigit() else None


def _check_pattern(weights: torch.Tensor, queries: int, step: int, where: str) -> None:
    if weights.dim() != 3 or weights.shape[1] != queries:
        raise ValueError(
            f"the trace is damaged: step {step}'s {where} attention weights have shape {tuple(weights.shape)}, "
            f"not (heads, {queries} queries, keys) as its record says"
        )


def _array(t: torch.Tensor, dtype: torch.dtype) -> dict:
    data = t.detach().to(torch.float32).to(dtype).contiguous().numpy()
    little = data.astype(data.dtype.newbyteorder("<"), copy=False)
    return {"shape": list(data.shape), "data": base64.b64encode(little.tobytes()).decode()}


def _texts(meta: dict):
    """id → its text, from the trace's meta (a vocabulary list, or an id → text map), else None."""
    vocab, table = meta.get("vocab"), meta.get("token_text")
    if isinstance(vocab, list):
        return lambda i: vocab[i] if 0 <= i < len(vocab) else None
    if isinstance(table, dict):
        return lambda i: table.get(str(i))
    return lambda i: None


def _label(token, text) -> str:
    said = token[1] if isinstance(token, tuple) else text(token)  # ("text", t): a text without its id
    if said is None:
        return f"#{token}"
    return said.replace("\n", "↵").replace(" ", "␣") or "∅"


def _sequence(meta: dict, records) -> dict:
    """position → token id, where the trace says it: meta output_ids, else meta tokens (texts: as generate
    saved them before it named ids), else what each step committed."""
    ids = meta.get("output_ids")
    known = dict(enumerate(ids)) if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else {}
    if not known and isinstance(meta.get("tokens"), list):  # a trace that says the sequence's texts only
        return {p: ("text", t) for p, t in enumerate(meta["tokens"])}
    for r in records:
        known.setdefault(r.start, r.block_ids[0])  # x_0, committed before the step
        for offset, token in enumerate(_committed(r), 1):
            known.setdefault(r.start + offset, token)
    return known


def _committed(r) -> list[int]:
    """What step r committed after x_0: the accepted proposals, then the bonus, clipped at a stop or the length."""
    return (r.block_ids[1 : r.acceptance_length + 1] + [r.bonus])[: r.produced]


def _length(records) -> int:
    return max(max(r.start + len(r.block_ids), r.start + r.produced + 1) for r in records)


def _step(r, text, meta: dict) -> dict:
    stops = set(meta.get("stop_token_ids") or [])
    stop = next((t for t in _committed(r) if t in stops), None)
    return {
        "step": r.step,
        "start": r.start,
        "block": [_label(t, text) for t in r.block_ids],
        "drafted": len(r.q_position_ids),
        "proposals": [_label(t, text) for t in r.draft_tokens],
        "posterior": [_label(t, text) for t in r.posterior],
        "tau": r.acceptance_length,
        "bonus": _label(r.bonus, text),
        "produced": r.produced,
        "stop": None if stop is None else _label(stop, text),
        "clipped": r.produced < r.acceptance_length + 1,
        "lookup": r.lookup,
        "verify_size": r.verify_size,
        "q_positions": r.q_position_ids,
        "k_positions": r.k_position_ids,
        "context_columns": r.draft_cache_before + r.ctx_len,
        "caches": {
            "draft": [r.draft_cache_before, r.draft_cache_after_draft, r.draft_cache_after],
            "target": [r.target_cache_before, r.target_cache_after_verify, r.target_cache_after],
        },
    }


def _lattice(acts: dict, r, text, step: int) -> dict:
    """DFlash 2's candidates (γ, K) with their unary scores, the path taken, and each row's argmax."""
    candidates = acts[SELECTOR.format("candidates")]
    unary = acts.get(SELECTOR.format("unary"))
    if candidates.dim() != 2 or (unary is not None and unary.shape != candidates.shape):
        raise ValueError(
            f"the trace is damaged: step {step}'s candidate lattice has shape {tuple(candidates.shape)}"
            + ("" if unary is None else f" and unary scores {tuple(unary.shape)}")
        )
    rows = candidates.tolist()
    path = [row.index(t) if t in row else None for row, t in zip(rows, r.draft_tokens)]
    return {
        "labels": [[_label(t, text) for t in row] for row in rows],
        "unary": None if unary is None else [[round(float(v), 4) for v in row] for row in unary],
        "path": path,
    }
