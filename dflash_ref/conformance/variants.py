"""Design variants: choices DFlash leaves to an implementation, declared by a port or detected, each
checked by its own invariant instead of by the reference's numbers.

    draft_cache   crop-after-pass   the reference and `dflash` 0.1.0: the draft pass appends context
                                    and block K/V, then the cache is cropped back to `start`
                  context-only      the MLX ports: only context K/V are cached; the block's K/V are
                                    concatenated fresh in every pass. Invariant: the draft cache holds
                                    exactly `start` positions after every pass (and so after its crop)
                  crop-at-next-pass  transformers' DFlashCache: the block's K/V stay in the cache until the
                                    next pass crops them first, so a step ends with the cache as its pass left it.
                                    Invariant: after the step the draft cache holds what it held after its pass
    last_block    shrink            the reference and `dflash` 0.1.0: the last block is cut to
                                    L_q = max_length − start
                  full-then-truncate  the official repository's current code: every block is drafted
                                    whole and the output cut at max_length. Its last steps' proposals
                                    see more mask positions, so they may differ: the steps where the
                                    reference shrank its block are not compared, the output ids are
    sliding_window  as-configured   the reference: each bundle's config says which of the three meanings
                                    its window has (attention.py), and the port follows it
                  causal | symmetric | rotating   a port that knows only these readings (comma-separated,
                                    e.g. causal,symmetric): the bundles whose config means another are not
                                    compared (not applicable)
                  block-start       a port that measures every sliding window from the block's start: each
                                    query of a sliding layer attends the W context positions before x_0
                                    (kv_pos ≥ start − W) and the whole block; a reading no config means, so
                                    from the first step where it attends other keys than the config's, the
                                    port's own steps are held to the loop's invariants, its attended keys
                                    DFlash's last W
    block_length  fixed             the reference: every block has the draft's block size (the last shrunk)
                  adaptive          a port whose blocks change length from step to step
    draft_context_window  unbounded  the reference: the draft attends every context position
                  N                 a port whose draft cache keeps the last N context positions only (and may
                                    compute the new context's features, C and K/V for those alone)
    draft_context_sinks  0          the reference, and a windowed cache without sinks
                  S                 with draft_context_window=N: the cache also keeps the first S context
                                    positions (attention sinks): S + N keys attended once the context is longer
    proposals     draft             the reference: every step's proposals come from a draft pass
                  draft-or-lookup   a port that proposes by copy or lookup (no draft pass) at some steps
    decoding      loop              the reference and every serving port: the port decodes, its own loop
                                    deciding each step
                  teacher-forced    a training library (no loop): at each step of the reference's walk its draft
                                    is fed what DFlash feeds it (the committed context, x_0, the positions) and
                                    its draft's stages are compared, its proposals too; the target's and the
                                    loop's stages (TEACHER_FORCED) are not the port's: not compared
    accepted_count  drafted         the reference: τ counts every accepted draft token, and the bonus is
                                    posterior[τ], also at a step whose tokens max_new_tokens or a stop token cuts
                  committed         vLLM's and transformers' counters: a step the length limit or a stop token
                                    cuts reports only what it commits (τ = its committed tokens − 1, the bonus its
                                    last committed token). Invariant: at such a step, exactly those; elsewhere
                                    DFlash's

block_length, draft_context_window (with its sinks), proposals and the block-start window part a port's run
from the reference's at some step (a block of another length, a context cut short, proposals from a lookup,
other keys attended): up to that step everything is compared; at it, but for a lookup, what comes before the
block (features, fc, C, context K: under a context cut, the rows the port kept, S first and the last ones); from
it on, the port's own steps are held to what stays true of every DFlash step (judge.py, the loop's invariants: τ
the leading run of matches, the bonus posterior[τ] and the posterior the argmax of the port's own verify logits,
the committed tokens the target's own, no step after the output; a cut context attends exactly min(start, S + N)
context keys, the first S and the last ones, DFlash's own). Its output ids are always compared. All are
declared, never detected (a port that loses context keys by mistake must not pass for a windowed one): the hints
offer them.

A port declares a variant (an adapter's `variants` attribute, `verify --variant KEY=VALUE`, or a
profile `{"variants": {...}, "skip": [...]}` beside a dump); what it leaves undeclared is detected
where its tensors say so unambiguously, else taken as the reference's choice. A declared variant's
observables are checked (a failure); an undeclared one's are notes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .stages import STAGES, key_for, of_draft_pass
from .tensorfile import array_or_none, as_array

VARIANTS = {
    "draft_cache": ("crop-after-pass", "context-only", "crop-at-next-pass"),
    "last_block": ("shrink", "full-then-truncate"),
    "sliding_window": ("as-configured", "causal", "symmetric", "rotating", "block-start"),
    "block_length": ("fixed", "adaptive"),
    "draft_context_window": ("unbounded", "N"),  # N: a number of context positions
    "draft_context_sinks": ("0", "S"),  # S: a number of leading context positions kept (with a window)
    "proposals": ("draft", "draft-or-lookup"),
    "accepted_count": ("drafted", "committed"),
    "decoding": ("loop", "teacher-forced"),
}
# what a teacher-forced port does not compute (Stage.teacher_given): the target's stages and the loop's decisions
TEACHER_FORCED = frozenset(s.name for s in STAGES if s.teacher_given)
REFERENCE = {key: choices[0] for key, choices in VARIANTS.items()}


def check_variants(variants: dict) -> dict[str, str]:
    """A port's declaration, every key and value known (ValueError naming the choices)."""
    if not isinstance(variants, dict):
        raise ValueError(f"variants must be a mapping of {sorted(VARIANTS)} to a choice, got {variants!r}")
    checked = {}
    for key, value in variants.items():
        if key not in VARIANTS:
            raise ValueError(f"unknown design variant {key!r}; known: {sorted(VARIANTS)}")
        if key == "draft_context_window" and value != "unbounded":
            if not str(value).isdigit() or int(value) < 1:
                raise ValueError(f"draft_context_window = {value!r}: give the number of context positions the "
                                 "port's draft cache keeps (a whole number ≥ 1), or 'unbounded'")  # fmt: skip
            checked[key] = str(int(value))
            continue
        if key == "draft_context_sinks":
            if not str(value).isdigit():
                raise ValueError(f"draft_context_sinks = {value!r}: give the number of leading context positions "
                                 "the port's windowed cache keeps (a whole number ≥ 0)")  # fmt: skip
            checked[key] = str(int(value))
            continue
        parts = value.split(",") if key == "sliding_window" and isinstance(value, str) else [value]
        if not all(part in VARIANTS[key] for part in parts) or (len(parts) > 1 and "as-configured" in parts):
            raise ValueError(f"{key} = {value!r} is no variant; choose one of {list(VARIANTS[key])}")
        checked[key] = value
    if (
        checked.get("draft_context_sinks", "0") != "0"
        and checked.get("draft_context_window", "unbounded") == "unbounded"
    ):
        raise ValueError("draft_context_sinks goes with draft_context_window=N: the sinks a windowed cache keeps")
    return checked


def parse_variant(text: str) -> tuple[str, str]:
    """'draft_cache=context-only' → ('draft_cache', 'context-only')."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--variant {text!r}: write KEY=VALUE, e.g. draft_cache=context-only")
    check_variants({key: value})
    return key, value


def read_profile(path: str | Path) -> dict:
    """A profile file: {"variants": {...}, "skip": [stage, ...]} (both optional)."""
    try:
        profile = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"profile {path} cannot be read as JSON: {e}") from None
    if not isinstance(profile, dict) or set(profile) - {"variants", "skip"}:
        raise ValueError(f"profile {path} must be a JSON object with 'variants' and/or 'skip'")
    skip = profile.get("skip", [])
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        raise ValueError(f"profile {path}: 'skip' must be a list of stage names, got {skip!r}")
    return {"variants": check_variants(profile.get("variants", {})), "skip": skip}


def context_only_lengths(expected: np.ndarray) -> np.ndarray:
    """The reference's cache lengths [draft before, after the pass, after its crop, target before,
    after verify, after its crop] as a context-only cache has them: after the pass, `start`."""
    lengths = expected.copy()
    lengths[1] = lengths[2]
    return lengths


def expected_lengths(variant: str, expected: np.ndarray) -> np.ndarray:
    """The reference's six cache lengths as a draft cache of this variant has them."""
    if variant == "context-only":
        return context_only_lengths(expected)
    if variant == "crop-at-next-pass":  # no crop within the step: it ends with the pass's length
        lengths = expected.copy()
        lengths[2] = lengths[1]
        return lengths
    return expected


def block_size(bundle) -> int | None:
    """The block size the bundle decodes with: its inputs', else the draft's own."""
    return bundle.inputs.get("block_size") or bundle.config("draft").get("block_size")


def shrunk_steps(bundle) -> set[int]:
    """The steps whose block the reference cut below the block size (the last ones)."""
    block = block_size(bundle)
    steps = set()
    for entry in bundle.entries:
        if entry["stage"] == "posterior" and block and entry["shape"][0] < block:
            steps.add(entry["step"])
    return steps


def _shape(value) -> tuple | None:
    """The shape of what a port produced, None if it is no array (the comparison reports that)."""
    return getattr(array_or_none(value), "shape", None)


def detect(bundle, produced: dict) -> dict[str, str]:
    """The variants a candidate's own tensors show unambiguously; {} where they do not. Full-then-
    truncate needs the whole block's shapes at every shrunk step (posterior (b,), proposals (b − 1,)),
    so an off-by-one last block is not taken for it."""
    found = {}
    lengths = [
        (bundle.expected[e["key"]], produced[e["key"]])
        for e in bundle.entries
        if e["stage"] == "cache_lengths" and e["key"] in produced and _shape(produced[e["key"]]) == (6,)
    ]
    telling = [(e, as_array(g)) for e, g in lengths if e[1] != e[2]]  # a pass that cached a block
    if telling:
        for variant in VARIANTS["draft_cache"]:  # the last step's final crop is never used again: not telling
            if all(np.array_equal(g[:5], expected_lengths(variant, e)[:5]) for e, g in telling):
                found["draft_cache"] = variant
    shrunk, block = sorted(shrunk_steps(bundle)), block_size(bundle)
    if shrunk:
        shapes = [
            (_shape(produced.get(f"step{s}/posterior")), _shape(produced.get(f"step{s}/draft_tokens"))) for s in shrunk
        ]
        if all(p == (block,) and d in ((block - 1,), None) for p, d in shapes):
            found["last_block"] = "full-then-truncate"
        elif all(p == bundle.expected[f"step{s}/posterior"].shape for s, (p, _) in zip(shrunk, shapes)):
            found["last_block"] = "shrink"
    return found


def context_keys(bundle, step: int) -> int:
    """How many context keys DFlash's draft attends at `step`: K after RoPE's rows before the block's."""
    k_rot = bundle.expected[f"step{step}/draft.layers.0.self_attn.hook_k_rot"]  # (H_kv, L_c + L_q, d_h)
    return k_rot.shape[1] - bundle.expected[f"step{step}/posterior"].shape[0]


def reference_steps(bundle) -> list[int]:
    return sorted({e["step"] for e in bundle.entries if e["stage"] == "posterior"})


def cut_steps(bundle) -> dict[int, tuple[int, int]]:
    """{step: (tokens it commits, the last of them)} of the reference's steps that commit fewer than their τ + 1:
    the length limit, or a stop token among its accepted drafts, cut them."""
    output, inputs = bundle.expected["output_ids"], bundle.inputs
    stops = set(inputs.get("stop_token_ids") or ())
    end = len(inputs["input_ids"]) + inputs["max_new_tokens"]
    at, cut = len(inputs["input_ids"]) + 1, {}  # the prefill committed x_0
    for step in reference_steps(bundle):
        tau = int(bundle.expected[f"step{step}/acceptance_length"])
        window = output[at : at + min(tau + 1, end - at)].tolist()
        committed = next((i + 1 for i, t in enumerate(window) if t in stops), len(window))
        if committed < tau + 1:
            cut[step] = (committed, int(output[at + committed - 1]))
        at += committed
    return cut


def committed_count(stage: str, expected: np.ndarray, cut: tuple[int, int] | None) -> np.ndarray:
    """A step's τ or bonus as accepted_count=committed has them (`cut`: what the length limit left of it)."""
    if cut is None or stage not in ("acceptance_length", "bonus"):
        return expected
    committed, last = cut
    return np.asarray(committed - 1 if stage == "acceptance_length" else last, dtype=expected.dtype)


def reads_block_start(bundle, variants: dict) -> bool:
    """Whether a port declared to measure sliding windows from the block's start reads this bundle's so."""
    window, readings = bundle.manifest.get("sliding_window"), variants["sliding_window"][0].split(",")
    return bool(window) and "block-start" in readings and window["kind"] not in readings


def context_kept(bundle, variants: dict) -> dict[int, tuple[int, int]]:
    """{draft layer: (S, N)} where a declared variant cuts the context a layer attends to its first S and last N
    positions: draft_context_window=N (with draft_context_sinks=S) on every layer; sliding_window=block-start on
    the bundle's sliding layers, N its window W. A layer not listed attends the whole context."""
    layers = sorted({e["layer"] for e in bundle.entries if e["stage"] == "k_rot"})
    window, kept = variants["draft_context_window"][0], {}
    if window != "unbounded":
        kept = dict.fromkeys(layers, (int(variants["draft_context_sinks"][0]), int(window)))
    if reads_block_start(bundle, variants):
        sliding = bundle.manifest["sliding_window"]
        for layer in sliding["layers"]:
            sinks, n = kept.get(layer, (0, sliding["size"]))
            kept[layer] = (sinks, min(n, sliding["size"]))
    return kept


def _block_start_differs(bundle, step: int, layer: int, window: int) -> bool:
    """Whether DFlash's weights at this step and sliding layer attend other context keys than the block-start
    reading, whose every query sees the W context positions before the block."""
    pattern = bundle.expected[key_for("pattern", step, layer)]  # (H_q, L_q, L_k)
    q_len = pattern.shape[1]
    start = pattern.shape[2] - q_len
    seen = (pattern[:, :, :start] != 0).any(axis=0)  # (L_q, start): context keys each query attends
    meant = np.zeros_like(seen)
    meant[:, max(0, start - window) :] = True
    return not np.array_equal(seen, meant)


def departure(bundle, produced: dict, variants: dict) -> tuple[int | None, str]:
    """The first step from which a port following a departing variant runs otherwise than the reference
    (None: it never does on this bundle), and which variant it follows there."""
    found = []
    steps = reference_steps(bundle)
    if variants["block_length"][0] == "adaptive":
        found += [
            (s, "block_length=adaptive")
            for s in steps
            if _shape(produced.get(f"step{s}/posterior")) not in (bundle.expected[f"step{s}/posterior"].shape, None)
        ][:1]
    if variants["proposals"][0] == "draft-or-lookup":
        drafted = {k.split("/")[0] for k in produced if of_draft_pass(k)}
        found += [
            (s, "proposals=draft-or-lookup")
            for s in steps
            if f"step{s}/posterior" in produced and f"step{s}" not in drafted
        ][:1]
    window, sinks = variants["draft_context_window"][0], variants["draft_context_sinks"][0]
    if window != "unbounded":
        said = f"draft_context_window={window}" + (f", draft_context_sinks={sinks}" if sinks != "0" else "")
        found += [(s, said) for s in steps if context_keys(bundle, s) > int(window) + int(sinks)][:1]
    if reads_block_start(bundle, variants):
        sliding = bundle.manifest["sliding_window"]
        found += [
            (s, "sliding_window=block-start")
            for s in steps
            if any(_block_start_differs(bundle, s, layer, sliding["size"]) for layer in sliding["layers"])
        ][:1]
    return min(found) if found else (None, "")


def window_mismatch(bundle, declared: dict) -> str | None:
    """Why a bundle is not applicable to a port that reads every sliding window one way; None if it is (a
    block-start port takes every windowed bundle: its own steps are held to their invariants)."""
    readings, window = declared.get("sliding_window", "as-configured"), bundle.manifest.get("sliding_window")
    if readings == "as-configured" or not window or window["kind"] in readings.split(","):
        return None
    if "block-start" in readings.split(","):
        return None
    return (
        f"the port's sliding windows are {readings.replace(',', ' or ')}; this bundle's config means "
        f"{window['kind']} (window {window['size']} on draft layers {window['layers']})"
    )


def resolve_variants(bundle, produced: dict, declared: dict) -> dict[str, tuple[str, str]]:
    """{key: (choice, how: "declared" | "detected" | "reference")} for every variant."""
    detected = detect(bundle, produced)
    out = {}
    for key in VARIANTS:
        if key in declared:
            out[key] = (declared[key], "declared")
        elif key in detected:
            out[key] = (detected[key], "detected")
        else:
            out[key] = (REFERENCE[key], "reference")
    return out
