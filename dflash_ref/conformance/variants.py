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
                  causal | symmetric | rotating | block-start   a port that knows only these readings
                                    (comma-separated, e.g. causal,symmetric; block-start: the window
                                    measured from the block's first position for every query, a reading no
                                    bundle's config means): the bundles whose config means another are not
                                    compared (not applicable)
    block_length  fixed             the reference: every block has the draft's block size (the last shrunk)
                  adaptive          a port whose blocks change length from step to step
    draft_context_window  unbounded  the reference: the draft attends every context position
                  N                 a port whose draft cache keeps the last N context positions only
    proposals     draft             the reference: every step's proposals come from a draft pass
                  draft-or-lookup   a port that proposes by copy or lookup (no draft pass) at some steps
    accepted_count  drafted         the reference: τ counts every accepted draft token, and the bonus is
                                    posterior[τ], also at a step whose tokens max_new_tokens or a stop token cuts
                  committed         vLLM's and transformers' counters: a step the length limit or a stop token
                                    cuts reports only what it commits (τ = its committed tokens − 1, the bonus its
                                    last committed token). Invariant: at such a step, exactly those; elsewhere
                                    DFlash's

The last three part a port's run from the reference's at some step (a block of another length, a context
cut short, proposals from a lookup): up to that step everything is compared; at it, for the first two,
what comes before the block (features, fc, C, context K); from it on, the port's own steps are held to
what stays true of every DFlash step (verify.py, the loop's invariants: τ the leading run of matches, the
bonus posterior[τ] and the posterior the argmax of the port's own verify logits, the committed tokens the
target's own, no step after the output; a windowed cache attends exactly min(start, N) context keys and the
block, DFlash's own). Its output ids are always compared. All three are declared, never detected (a port
that loses context keys by mistake must not pass for a windowed one): the hints offer them.

A port declares a variant (an adapter's `variants` attribute, `verify --variant KEY=VALUE`, or a
profile `{"variants": {...}, "skip": [...]}` beside a dump); what it leaves undeclared is detected
where its tensors say so unambiguously, else taken as the reference's choice. A declared variant's
observables are checked (a failure); an undeclared one's are notes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .stages import stage_of
from .tensorfile import array_or_none, as_array

VARIANTS = {
    "draft_cache": ("crop-after-pass", "context-only", "crop-at-next-pass"),
    "last_block": ("shrink", "full-then-truncate"),
    "sliding_window": ("as-configured", "causal", "symmetric", "rotating", "block-start"),
    "block_length": ("fixed", "adaptive"),
    "draft_context_window": ("unbounded", "N"),  # N: a number of context positions
    "proposals": ("draft", "draft-or-lookup"),
    "accepted_count": ("drafted", "committed"),
}
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
        parts = value.split(",") if key == "sliding_window" and isinstance(value, str) else [value]
        if not all(part in VARIANTS[key] for part in parts) or (len(parts) > 1 and "as-configured" in parts):
            raise ValueError(f"{key} = {value!r} is no variant; choose one of {list(VARIANTS[key])}")
        checked[key] = value
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


# a draft pass's own stages: a step where a port produced none of them ran no draft pass
DRAFT_PASS = {"noise_embedding", "logits", "final_hidden", "q", "k_rot", "pattern"}


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
        drafted = {k.split("/")[0] for k in produced if stage_of(k) in DRAFT_PASS}
        found += [
            (s, "proposals=draft-or-lookup")
            for s in steps
            if f"step{s}/posterior" in produced and f"step{s}" not in drafted
        ][:1]
    window = variants["draft_context_window"][0]
    if window != "unbounded":
        found += [(s, f"draft_context_window={window}") for s in steps if context_keys(bundle, s) > int(window)][:1]
    return min(found) if found else (None, "")


def window_mismatch(bundle, declared: dict) -> str | None:
    """Why a bundle is not applicable to a port that reads every sliding window one way; None if it is."""
    readings, window = declared.get("sliding_window", "as-configured"), bundle.manifest.get("sliding_window")
    if readings == "as-configured" or not window or window["kind"] in readings.split(","):
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
