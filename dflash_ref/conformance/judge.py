"""The judge: a port's tensors against a golden bundle's, stage by stage, and where they first diverge.

Numpy only: it imports no port and no torch, and the runner (verify.py), the pages and the endpoint checks stand
on it. For every manifest entry, in the order of the data's walk:

    floats:   err = max|got − expected| / max(1, max|expected|)  ≤  tolerance    (the manifest's)
    integers: got == expected, element for element
    shape:    must be equal (a wrong context length shows up here first)

Semantic stages (what DFlash defines) fail; observables (the cache lengths) are checked against the
port's design variant, declared or detected (variants.py), and are a note where it declared none.
The first semantic entry that fails is the first stage where the candidate departs from DFlash.
"""

from __future__ import annotations

import numpy as np

from .bundle import Bundle, candidates_in_id_order
from .hints import hint, prompt_taken_for_the_end
from .report import Check, Report
from .stages import CACHED_PREFIX, DRAFT_ACCEPTED, KINDS, LOOP_STAGES, SERVED, STAGE, key_for, of_draft_pass, parse_key
from .tensorfile import array_or_none, as_array
from .variants import (
    TEACHER_FORCED,
    block_size,
    committed_count,
    context_kept,
    context_keys,
    cut_steps,
    departure,
    expected_lengths,
    reference_steps,
    resolve_variants,
    shrunk_steps,
    window_mismatch,
)


def _evicted(entry: dict, expected: np.ndarray, got: np.ndarray) -> int:
    """How many leading rows a candidate left out (0: none, −1: not allowed): keys on a sliding-window
    layer, or position 0's final hidden. Allowed only along the entry's `evictable_axis`, for weights
    only where they are exactly 0, for the final hidden only its first row."""
    axis = entry.get("evictable_axis")
    if (
        axis is None
        or got.ndim != expected.ndim
        or got.shape[axis] >= expected.shape[axis]
        or any(g != e for i, (g, e) in enumerate(zip(got.shape, expected.shape)) if i != axis)
    ):
        return -1
    dropped = expected.shape[axis] - got.shape[axis]
    if entry["stage"] == "pattern" and np.any(np.take(expected, range(dropped), axis=axis) != 0):
        return -1
    if entry["stage"] == "final_hidden" and dropped != 1:
        return -1
    return dropped


def compare_one(bundle: str, entry: dict, expected: np.ndarray, got) -> Check:
    stage, step, layer = entry["stage"], entry.get("step"), entry.get("layer")
    check = Check(bundle, entry["key"], stage, step, layer, "pass", tolerance=entry["tolerance"])
    if got is None:
        check.status, check.detail = "missing", "not produced by the candidate"
        return check
    try:
        got = as_array(got)
        if not np.issubdtype(got.dtype, np.number) and got.dtype != np.bool_:
            raise TypeError(f"of dtype {got.dtype}")
    except (TypeError, ValueError) as e:  # ragged lists, objects, strings: a result, not a crash of verify
        check.status, check.detail = "FAIL", f"not an array of numbers ({e})"
        return check
    if got.shape != expected.shape:
        dropped = _evicted(entry, expected, got)
        if dropped < 0:
            check.status, check.detail = "FAIL", f"shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
            return check
        expected = np.take(
            expected, range(dropped, expected.shape[entry["evictable_axis"]]), axis=entry["evictable_axis"]
        )
        check.note = (
            f"{dropped} keys outside the window left out"
            if stage != "final_hidden"
            else "position 0 (no logit) left out"
        )
    if expected.size == 0:
        return check
    if np.issubdtype(expected.dtype, np.integer):
        wrong = np.flatnonzero(got.reshape(-1) != expected.reshape(-1))
        if wrong.size:
            i = int(wrong[0])
            check.status = "FAIL"
            check.detail = (
                f"{wrong.size} of {expected.size} differ; first at flat index {i}: "
                f"got {got.reshape(-1)[i]}, expected {expected.reshape(-1)[i]}"
            )
        return check
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    check.max_abs = float(np.nanmax(diff)) if not np.isnan(diff).all() else float("nan")
    check.rel = check.max_abs / max(1.0, float(np.abs(expected).max()))
    if not np.isfinite(got).all() or not check.rel <= check.tolerance:
        check.status = "FAIL"
        bad = np.flatnonzero(~np.isfinite(got.reshape(-1)))
        if bad.size:  # what differs: how many, where first, and the finite part's error
            check.detail = (
                f"{bad.size} of {got.size} values non-finite, first at flat index {int(bad[0])} "
                f"({got.reshape(-1)[bad[0]]}); the finite ones off by max abs {check.max_abs:.2e}"
            )
    return check


def compare(
    bundle: Bundle, produced: dict, report: Report | None = None, declared: dict | None = None, skip: list[str] = ()
) -> list[Check]:
    """Every manifest entry of `bundle` against `produced` (key → array), in walk order, under the
    port's design variants (`declared`, the rest detected); `skip` names stages the port waives. The
    port's steps past the reference's are failures; keys that name no stage, and the variants used, go to
    `report`. Under a variant after which the port's run parts from the reference's (block_length,
    draft_context_window, proposals), its own steps from there on are held to the loop's invariants."""
    skip = skip if isinstance(skip, dict) else dict.fromkeys(skip, "waived")  # stage → who: "waived" (the port), "user"
    unread = window_mismatch(bundle, declared or {})
    if unread:
        return [Check(bundle.name, "bundle", "sliding_window", None, None, "skipped", detail=unread, skipped_by="n/a")]
    produced = candidates_in_id_order(produced)
    variants = resolve_variants(bundle, produced, declared or {})
    departed, departing = departure(bundle, produced, variants)
    extra, misspelt = _unlisted(bundle, produced)
    if report is not None:
        report.ignored[bundle.name] = misspelt
        report.variants[bundle.name] = variants
    truncated = shrunk_steps(bundle) if variants["last_block"][0] == "full-then-truncate" else set()
    draft = bundle.config("draft")
    context = {
        "inputs": bundle.inputs,
        "mask_token_id": draft.get("dflash_config", draft).get("mask_token_id"),
        "sliding_window": bundle.manifest.get("sliding_window"),
        "block_size": block_size(bundle),
        "rope": _rope_of(draft),
    }
    starts = {s: context_keys(bundle, s) for s in reference_steps(bundle)}  # each step's block start
    checks, last = [], max((e["step"] for e in bundle.entries if e["stage"] == "cache_lengths"), default=None)
    cut = cut_steps(bundle)
    context["cut"] = cut
    drafted = departed is not None and any(  # did the port run a draft pass where its run departs?
        k.startswith(f"step{departed}/") and of_draft_pass(k) for k in produced
    )
    teacher = variants["decoding"][0] == "teacher-forced"
    kept = context_kept(bundle, variants)  # {layer: (S, N)} where a declared variant cuts the context attended
    layers = {e["layer"] for e in bundle.entries if e["stage"] == "k_rot"}
    whole = next(iter(set(kept.values()))) if set(kept) == layers and len(set(kept.values())) == 1 else None
    counting = variants["accepted_count"]
    cached = _cached_prefix(bundle, produced)
    if report is not None and cached:
        report.cached[bundle.name] = cached
    for e in bundle.entries:
        expected, got, step = bundle.expected[e["key"]], produced.get(e["key"]), e.get("step")
        if e["stage"] == "output_ids" and DRAFT_ACCEPTED in produced:  # a server's own count, before its output
            checks.append(_draft_accepted(bundle, produced[DRAFT_ACCEPTED]))
        if e["stage"] == "output_ids":  # after every step: the port's own steps past DFlash's, or under a
            # departing variant all of its steps from the departure on, come first
            checks += (
                _loop_invariants(bundle, produced, departed, departing, variants)
                if departed is not None
                else _extra_steps(
                    bundle,
                    extra,
                    bool(truncated) or variants["last_block"][0] == "full-then-truncate",
                    parted=any(c.status == "FAIL" and c.stage in LOOP_STAGES for c in checks),
                )
            )
        if truncated and e["stage"] == "output_ids" and (got is None or "output_ids" in skip):
            checks.append(
                Check(
                    bundle.name,
                    e["key"],
                    e["stage"],
                    None,
                    None,
                    "FAIL",
                    detail="full-then-truncate is judged by its output ids, which the port did not give",
                )
            )
            continue
        not_compared = _not_compared(e, skip, truncated, departed, departing, drafted, teacher)
        if not_compared:
            checks.append(
                Check(
                    bundle.name,
                    e["key"],
                    e["stage"],
                    step,
                    e.get("layer"),
                    "skipped",
                    detail={"waived": "waived by the port", "user": "skipped by the user (--skip)"}.get(not_compared)
                    or f"not compared under {not_compared}"
                    + (
                        ""
                        if "full-then-truncate" in not_compared
                        else ": the port's own steps held to the loop's invariants"
                    ),
                    skipped_by=not_compared,
                )
            )
            continue
        if counting[0] == "committed":
            expected = committed_count(e["stage"], expected, cut.get(step))
        choice, how = variants["draft_cache"] if e["stage"] == "cache_lengths" else (None, None)
        if choice:
            expected = _final_crop_free(expected_lengths(choice, expected), got, step == last)
        restored = _restored(e, expected, got, cached) if step == 0 else 0
        if restored:
            axis = STAGE[e["stage"]].context_axis
            expected = np.take(expected, range(restored, expected.shape[axis]), axis=axis)
        left_out = 0
        if (
            step is not None
            and (step == departed or teacher and departed is not None and step > departed)
            and (_cuts_context(departing))
        ):
            window = kept.get(e.get("layer")) if e.get("layer") is not None else whole
            q_len = bundle.expected[f"step{step}/posterior"].shape[0]
            expected, left_out = _kept_rows(e["stage"], window, expected, got, q_len)
        check = compare_one(bundle.name, e, expected, got)
        if left_out:
            check.note = f"{left_out} context rows the port's cut context never attends left out ({departing})"
        if restored:
            check.note = (
                f"positions 0–{restored - 1} restored from the prefix cache, not computed by this request: the keys "
                "and values attended there are compared in full (K after RoPE, V)"
            )
        if choice and choice != "crop-after-pass":
            check.note = f"the {choice} variant's lengths"
        if KINDS.get(e["stage"]) == "observable":  # an implementation's layout: held to it where declared
            if check.status == "FAIL" and how != "declared":
                check.status = "note"  # an undeclared implementation choice: reported, not a failure
            elif check.status == "missing" and how == "declared":
                check.status = "FAIL"  # Report.failed excuses a missing observable: not a declared one
        if counting[0] == "committed" and step in cut and e["stage"] in ("acceptance_length", "bonus"):
            check.note = check.note or "accepted_count=committed: what this step commits"
        if check.status == "FAIL":
            check.hint = hint(
                e["stage"], expected, array_or_none(got), {**context, "step": step, "start": starts.get(step)},
                e.get("layer"),
            )  # fmt: skip
            check.expected, check.got = expected, array_or_none(got)
        if check.status == "missing" and e["stage"] == "first_token":
            check.hint = prompt_taken_for_the_end(bundle.inputs, array_or_none(produced.get("output_ids"))) or ""
        if check.status == "missing" and step is not None and f"step{step}/posterior" in produced:
            if not any(k.startswith(f"step{step}/") and of_draft_pass(k) for k in produced):
                check.hint = (
                    f"the port gave step {step}'s loop values but none of its draft pass: if it proposes by copy "
                    "or lookup at some steps by design, declare `--variant proposals=draft-or-lookup`"
                )
        checks.append(check)
    _keep_first_tensors(checks)
    served = bundle.manifest.get("serving")
    for c in checks if served else []:  # where in a serving scenario: its condition and request
        c.serving = f"{served['scenario']} · {served['condition']} · request {served['request']}"
    return checks


def _rope_of(config: dict) -> dict:
    """A config's RoPE as the hints read it: θ, the scaling's type and factor, and which spelling gives the
    scaling ("rope_parameters" alone, "rope_scaling", or None: no scaling)."""
    parameters, scaling = config.get("rope_parameters") or {}, config.get("rope_scaling")
    given = scaling or (parameters if parameters.get("rope_type", "default") != "default" else None)
    return {
        "theta": config.get("rope_theta", parameters.get("rope_theta", 10000.0)),
        "type": (given or {}).get("rope_type", (given or {}).get("type")),
        "factor": (given or {}).get("factor"),
        "spelled": None if given is None else "rope_scaling" if scaling else "rope_parameters",
    }


def acceptance_parts(
    taus: list[int], produced: int, block_size: int | None = None, max_new_tokens: int | None = None
) -> tuple[list[int], int, int]:
    """A request's reference run (τ per step, `produced` new tokens) as a serving engine's count of accepted draft
    tokens must match it → (the steps held exactly, the most the rest may add, the most steps the rest may take).

    With DFlash's draft every step drafted with a whole block proposes and accepts as the reference's. Where the
    length limit shortens the block (the reference drafts min(block, what is left): `block_size` and
    `max_new_tokens` given), the draft attends another block, and an engine that drafts it whole and counts before
    clipping its output (vLLM's counters) accepts another block's proposals there: from the first shortened step
    on, its steps may accept anything up to what is left − 1 plus a last whole block's γ = block − 1. Otherwise
    the last step alone is where engines cut the block each their own way: it adds 0 up to max(τ, the tokens it
    committed)."""
    if block_size is not None and max_new_tokens is not None:
        done = 0
        for s, tau in enumerate(taus):
            room = max_new_tokens - done  # tokens left before this step: its block is min(block, room)
            if room < block_size:
                return taus[:s], room - 1 + block_size - 1, room
            done += tau + 1
    committed = produced - 1 - sum(t + 1 for t in taus[:-1])  # the last step's tokens (after x_0 and the others)
    return taus[:-1], max(taus[-1:] + [committed, 0]), min(len(taus), 1)


def accepted_bounds(
    taus: list[int], produced: int, block_size: int | None = None, max_new_tokens: int | None = None
) -> tuple[int, int]:
    """The draft tokens a serving engine may count as accepted for this reference run: (low, high)
    (acceptance_parts)."""
    exact, rest, _ = acceptance_parts(taus, produced, block_size, max_new_tokens)
    return sum(exact), sum(exact) + rest


def _draft_accepted(bundle: Bundle, value) -> Check:
    """A serving engine's own count of the request's draft tokens accepted, against DFlash's (accepted_bounds)."""
    taus = [int(bundle.expected[e["key"]]) for e in bundle.entries if e["stage"] == "acceptance_length"]
    new = len(bundle.expected["output_ids"]) - len(bundle.inputs["input_ids"])
    low, high = accepted_bounds(taus, new, bundle.config("draft")["block_size"], bundle.inputs["max_new_tokens"])
    check = Check(bundle.name, DRAFT_ACCEPTED, "draft_accepted", None, None, "pass", manifest=False)
    got = array_or_none(value)
    if got is None or got.ndim != 0 or not np.issubdtype(got.dtype, np.integer):
        check.status, check.detail = "FAIL", f"not one integer ({value!r:.60})"
        return check
    check.detail = f"the engine accepted {int(got)} draft tokens; DFlash's draft accepts {low}–{high}"
    if not low <= int(got) <= high:
        check.status = "FAIL"
        check.hint = (
            "its output is the target's, but its draft proposed other tokens than DFlash's: the draft saw another "
            "context (a prefix restored from a cache without its draft K/V, a prefill chunk's features lost, "
            "another request's rows) or other weights; the engine's tensors of one sequence name the stage"
            if int(got) < low
            else "more accepted than DFlash's draft accepts: the engine counts differently (its bonus token?)"
        )
    return check


def _cached_prefix(bundle: Bundle, produced: dict) -> int:
    """How many leading prompt positions a serving port restored from a prefix cache (0: none, or not said). Those
    rows are excused only where the port gave the keys and values its draft attended at step 0 (K after RoPE, V,
    every layer), which hold them: else they would be compared nowhere."""
    value = array_or_none(produced.get(CACHED_PREFIX))
    if value is None or value.ndim != 0 or not np.issubdtype(value.dtype, np.integer) or value < 0:
        return 0
    attended = [e["key"] for e in bundle.entries if e["stage"] in ("k_rot", "v") and e.get("step") == 0]
    return int(value) if attended and all(k in produced for k in attended) else 0


def _restored(entry: dict, expected: np.ndarray, got, cached: int) -> int:
    """The leading rows of a first step's new-context stage a port restored from its prefix cache rather than
    computed: `cached` where it gave exactly the rest, else 0 (compared as they are)."""
    record = STAGE.get(entry["stage"])
    axis = record.context_axis if record and record.restorable else None
    got = array_or_none(got)
    if not cached or axis is None or got is None or got.ndim != expected.ndim:
        return 0
    rest = list(expected.shape)
    rest[axis] -= cached
    return cached if list(got.shape) == rest else 0


def _not_compared(
    entry: dict, skip: dict, truncated: set[int], departed: int | None, departing: str, drafted: bool, teacher: bool
) -> str | None:
    """Why an entry is not compared ("waived", "user", or the variant it is not compared under), None if it is: a
    waived stage; a step whose block full-then-truncate drafts whole (its first still compares what comes
    before the block); a step at or after a departing variant's departure (the departure's own step still
    compares what comes before the block, but where the port ran no draft pass there: `drafted` False, a
    proposal by lookup or a step of x_0 alone). A teacher-forced port (`teacher`) computes no target or loop
    stage, and every step of it is fed DFlash's context: each compares what the departure's step does."""
    stage, step = entry["stage"], entry.get("step")
    if stage in skip:
        return skip[stage]  # "waived" (the port's) or "user" (--skip)
    if teacher and stage in TEACHER_FORCED:
        return "decoding=teacher-forced"
    record = STAGE[stage]
    if step in truncated and not (record.block_free and step == min(truncated)):
        return "last_block=full-then-truncate"
    if departed is not None and step is not None and step >= departed:
        kept = record.block_free or record.window_free and _cuts_context(departing)
        at_departure = step == departed or teacher  # teacher-forced, every step starts from DFlash's context
        if not (at_departure and kept and drafted):
            return departing
        if at_departure and record.window_free and entry.get("layer") not in (0, None):
            return departing  # past layer 0 the block's rows come from attention over the cut context
    return None


def _cuts_context(departing: str) -> bool:
    """Whether the departing variant is one that attends only part of the context (context_kept)."""
    return departing.startswith(("draft_context_window", "sliding_window=block-start"))


def _kept_rows(
    stage: str, cut: tuple[int, int] | None, expected: np.ndarray, got, q_len: int
) -> tuple[np.ndarray, int]:
    """At the step a cut context departs (`cut`: the S first and N last positions kept, context_kept), the rows
    of a new-context stage a port kept (one that caches only those may compute only those): (the reference's
    same rows, how many the port left out), or (expected, 0) where its rows are not such a cut."""
    axis = STAGE[stage].context_axis
    got = array_or_none(got)
    if cut is None or axis is None or got is None or got.ndim != expected.ndim or got.shape == expected.shape:
        return expected, 0
    sinks, window = cut
    dropped = expected.shape[axis] - got.shape[axis]
    context = expected.shape[axis] - (q_len if stage == "v" else 0)  # V holds the block's rows after the context's
    if dropped <= 0 or context - dropped < min(context, sinks + window):
        return expected, 0
    rows = [*range(sinks), *range(sinks + dropped, expected.shape[axis])]
    return np.take(expected, rows, axis=axis), dropped


def _unlisted(bundle: Bundle, produced: dict) -> tuple[dict[int, list[str]], list[str]]:
    """The keys a port gave that the manifest does not list: {step: keys} of the steps the reference did not
    run, and the rest (most often a misspelt key, whose tensor then shows as missing; or a stage this
    bundle has no tensor of)."""
    listed = {e["key"] for e in bundle.entries}
    steps = set(reference_steps(bundle))
    extra, misspelt = {}, []
    for key in sorted(k for k in produced if k not in listed and k not in SERVED):
        try:
            _, step, _ = parse_key(key)
        except ValueError:
            step = None
        if step is not None and step not in steps:
            extra.setdefault(step, []).append(key)
        else:
            misspelt.append(key)
    return extra, misspelt


def _why_the_reference_ended(bundle: Bundle) -> str:
    output, inputs = bundle.expected["output_ids"], bundle.inputs
    steps = reference_steps(bundle)
    if int(output[-1]) in set(inputs.get("stop_token_ids") or ()):
        if not steps:
            return f"after the stop at the first token (x_0 = {int(output[-1])} is a stop token: DFlash runs no step)"
        return f"after the stop token {int(output[-1])} at step {steps[-1]}: a stop token ends the decode"
    return f"past max_new_tokens ({inputs['max_new_tokens']}): DFlash's last step is step {steps[-1]}"


def _extra_steps(bundle: Bundle, extra: dict[int, list[str]], truncating: bool, parted: bool) -> list[Check]:
    """A FAIL per step the port ran that DFlash does not (after a stop, past max_new_tokens). Under
    full-then-truncate a step past max_new_tokens is that variant's (the official repository's loop runs while
    x_0's position is below max_length, one step more, all of whose tokens the truncation cuts): not compared.
    Where the port's run `parted` from DFlash's at an earlier step (other proposals, so other steps), the extra
    steps follow from that divergence, and are said to."""
    why = _why_the_reference_ended(bundle) if extra else ""
    said = _why_the_port_went_on(bundle) if extra and not parted else ""
    if parted:
        why = "that DFlash does not: its run parted from DFlash's at an earlier step (the first divergence)"
    steps = reference_steps(bundle)
    first_past = (steps[-1] + 1) if steps else 0
    checks = []
    for step, keys in sorted(extra.items()):
        cut = truncating and why.startswith("past max_new_tokens") and step == first_past  # one step, no more
        checks.append(
            Check(
                bundle.name,
                f"step{step}",
                "extra_step",
                step,
                None,
                "skipped" if cut else "FAIL",
                detail=f"the port ran step {step} {why} ({len(keys)} tensors of it, e.g. {keys[0]})"
                + ("; under last_block=full-then-truncate its tokens are all cut away" if cut else ""),
                skipped_by="last_block=full-then-truncate" if cut else "",
                manifest=False,
                hint="" if cut else said,
            )
        )
    return checks


def _why_the_port_went_on(bundle: Bundle) -> str:
    """The hint of a step run after DFlash's output was complete: where DFlash's end came from (x_0, a step's
    bonus, an accepted draft token, or the length limit), so what the port's loop did not check."""
    output, inputs = bundle.expected["output_ids"], bundle.inputs
    steps, last = reference_steps(bundle), int(output[-1])
    if last in set(inputs.get("stop_token_ids") or ()):
        if not steps:
            return (
                f"x_0, the token the prefill commits, is the stop token {last}: DFlash ends there and runs no step. "
                "The port looks for a stop only in what a step commits, not in x_0"
            )
        s = steps[-1]
        if int(bundle.expected[f"step{s}/bonus"]) == last and len(output) - 1 == _end_of(bundle, s):
            return (
                f"step {s}'s bonus token (posterior[τ], the target's own after the accepted run) is the stop token "
                f"{last}: DFlash ends there. The port looks for a stop among the accepted draft tokens only, not in "
                "the bonus it commits"
            )
        return (
            f"the stop token {last} is among step {s}'s accepted draft tokens: DFlash commits up to it and ends. "
            "The port looks for a stop only after a further step"
        )
    return (
        f"DFlash's output is complete after step {steps[-1] if steps else 'the prefill'}: max_new_tokens "
        f"({inputs['max_new_tokens']}) is reached. The port ran another draft and verify pass: its loop counts its "
        "bound otherwise (x_0 not counted, positions for tokens), or it verifies once more to commit a token it "
        "already has"
    )


def _end_of(bundle: Bundle, step: int) -> int:
    """The output position of the last token `step` commits (x_0 at len(prompt), then each step's τ + 1)."""
    at = len(bundle.inputs["input_ids"])
    for s in reference_steps(bundle):
        at += int(bundle.expected[f"step{s}/acceptance_length"]) + 1
        if s == step:
            return at
    return at


def _loop_invariants(bundle: Bundle, produced: dict, departed: int, departing: str, variants: dict) -> list[Check]:
    """The port's own steps from `departed` on, where a declared variant parts its run from the reference's,
    held to what stays true of every DFlash step: τ is the leading run of proposals equal to the posterior,
    the bonus is posterior[τ], the posterior is the argmax of the port's own verify logits and (DFlash 1)
    the proposals the argmax of its own draft logits, where it gives them; the tokens a step commits
    (posterior[:τ + 1], cut at a stop token or at max_new_tokens) are the target's own (the reference's output
    there), and no step runs after the output is complete. A cut context (context_kept: draft_context_window=N
    with its sinks S, a block-start window) attends min(start, S + N) context keys and the block in each layer it
    cuts (_attended_keys), the whole context in the others."""
    output, inputs = bundle.expected["output_ids"], bundle.inputs
    stops = set(inputs.get("stop_token_ids") or ())
    at = (
        len(inputs["input_ids"])
        + 1
        + sum(  # where step `departed`'s first committed token goes
            int(bundle.expected[f"step{s}/acceptance_length"]) + 1 for s in reference_steps(bundle) if s < departed
        )
    )
    kept = context_kept(bundle, variants) if _cuts_context(departing) else {}
    layers = sorted({e["layer"] for e in bundle.entries if e["stage"] == "k_rot"})
    evicting = {e["layer"] for e in bundle.entries if e["stage"] == "k_rot" and "evictable_axis" in e}
    selector = any(e["stage"] == "candidates" for e in bundle.entries)  # DFlash 2: proposals are the path
    checks, step = [], departed

    def check(stage: str, ok: bool, detail: str, layer: int | None = None) -> None:
        key = f"step{step}/{stage}" if layer is None else key_for(stage, step, layer)
        checks.append(
            Check(bundle.name, key, stage, step, layer, "pass" if ok else "FAIL", detail="" if ok else detail,
                  note=f"invariant under {departing}", manifest=False)
        )  # fmt: skip

    def ids(name: str, rank: int) -> np.ndarray | None:
        """The port's integers of `name` at this step, of that rank, else None."""
        value = array_or_none(produced.get(f"step{step}/{name}"))
        if value is None or value.ndim != rank or not np.issubdtype(value.dtype, np.number):
            return None
        if not np.isfinite(value).all() or not np.array_equal(value, np.round(value)):
            return None
        return value.astype(np.int64)

    def ran_a_draft_pass() -> bool:  # a step proposed by lookup, or of x_0 alone, attends no keys
        return any(k.startswith(f"step{step}/") and of_draft_pass(k) for k in produced)

    if variants["decoding"][0] == "teacher-forced":  # no loop of its own: each step fed DFlash's context
        for step in (s for s in reference_steps(bundle) if s >= departed):
            q_len = bundle.expected[f"step{step}/posterior"].shape[0]
            for layer in layers if kept and ran_a_draft_pass() else ():
                _attended_keys(check, bundle, produced, step, layer, context_keys(bundle, step), q_len,
                               kept.get(layer), layer in evicting, first=True)  # fmt: skip
        return checks

    while f"step{step}/posterior" in produced:
        drafted, posterior, tau, bonus = (
            ids("draft_tokens", 1),
            ids("posterior", 1),
            ids("acceptance_length", 0),
            ids("bonus", 0),
        )
        if (
            drafted is None
            and posterior is not None
            and len(posterior) == 1
            and f"step{step}/draft_tokens" not in produced
        ):
            drafted = np.zeros(0, np.int64)  # an empty step: the block is x_0 alone, nothing to draft or propose
        if drafted is None or posterior is None or tau is None or bonus is None:
            lacking = [n for n, v in (("draft tokens (γ,)", drafted), ("posterior (L_q,)", posterior), ("τ", tau),
                                      ("bonus", bonus)) if v is None]  # fmt: skip
            check("posterior", False, f"a step is checked by its draft tokens (γ,), posterior (L_q,), τ and bonus, "
                  f"whole numbers (a step of x_0 alone may give no draft tokens): {', '.join(lacking)} missing or "
                  "not so")  # fmt: skip
            break
        tau, bonus = int(tau), int(bonus)
        if at >= len(output):
            check("posterior", False, f"the port ran step {step} after its output was complete ({len(output)} ids)")
            break
        run = next((i for i, (d, p) in enumerate(zip(drafted, posterior)) if d != p), min(len(drafted), len(posterior)))
        check("acceptance_length", tau == run, f"τ = {tau}, but its proposals {drafted.tolist()} match the posterior "
              f"{posterior.tolist()} for {run}: τ is the leading run of matches")  # fmt: skip
        check("bonus", 0 <= tau < len(posterior) and bonus == posterior[tau],
              f"bonus {bonus} is not posterior[τ] of {posterior.tolist()}, τ = {tau}")  # fmt: skip
        own = (
            ("target_logits", posterior, "posterior"),
            ("draft.hook_logits", None if selector else drafted, "draft_tokens"),
        )
        for logits_name, chosen, what in own:
            given = produced.get(f"step{step}/{logits_name}")
            logits = None if given is None else array_or_none(given)
            if chosen is not None and logits is not None:
                ok = logits.ndim == 2 and logits.shape[0] == len(chosen) and np.array_equal(logits.argmax(-1), chosen)
                check(what, ok, f"its {what} {chosen.tolist()} is not the argmax of its own {logits_name}")
        committed = posterior[: tau + 1].tolist()[: len(output) - at]
        if stops & set(committed):
            committed = committed[: next(i for i, t in enumerate(committed) if t in stops) + 1]
        check("posterior", committed == output[at : at + len(committed)].tolist(),
              f"it commits {committed} at positions {at}…, where the target's own decoding has "
              f"{output[at : at + len(committed)].tolist()}")  # fmt: skip
        for layer in layers if kept and ran_a_draft_pass() else ():  # a cut context: what each layer attends
            _attended_keys(check, bundle, produced, step, layer, at - 1, len(posterior), kept.get(layer),
                           layer in evicting, first=step == departed)  # fmt: skip
        at += len(committed)
        step += 1
    if at < len(output):
        check("posterior", False, f"the port's steps commit up to position {at}, its output runs to {len(output)}")
    return checks


def _attended_keys(check, bundle, produced, step, layer, start, q_len, cut, evicting: bool, first: bool) -> None:
    """One layer's keys at one step of a cut context: it attends exactly the first S and the last context keys,
    min(start, S + N) in all (`cut` (S, N); None: the whole context, fewer on a sliding layer that evicts), read
    off its weights where it gives them (a port may hold more keys than it attends, masking the rest), else off
    its K after RoPE; at the first cut step those keys are DFlash's own, value for value."""
    sinks, window = cut if cut is not None else (0, None)
    want = start if window is None else min(start, sinks + window)
    k_rot = array_or_none(produced.get(key_for("k_rot", step, layer)))  # (H_kv, L_k, d_h)
    keys = None if k_rot is None or k_rot.ndim != 3 else k_rot.shape[1] - q_len
    pattern = array_or_none(produced.get(key_for("pattern", step, layer)))  # (H_q, L_q, L_k)
    if keys is not None and pattern is not None and pattern.ndim == 3 and pattern.shape[2] == keys + q_len:
        seen = np.flatnonzero((pattern[:, :, :keys] != 0).any(axis=(0, 1)))  # the context keys attended
        head = min(sinks, want)
        meant = np.r_[np.arange(head), np.arange(keys - (want - head), keys)] if keys >= want else None
        ok = meant is not None and np.array_equal(seen, meant)
        said = f"it attends context keys {_spans(seen)} of its {keys}"
    else:
        seen = np.arange(keys or 0)  # every key it holds
        ok = keys is not None and (keys == want or (cut is None and evicting and 0 <= keys < want))
        said = f"{keys} context keys attended"
    cache = f"the first {sinks} and the last {window}" if sinks else f"the last {window}"
    where = f"a cache of {cache} context positions" if window else "the whole context"
    check("k_rot", ok, f"{said}, where {where} holds {want} of {start} before a block of {q_len}", layer)
    if not (ok and first and want):
        return
    entry = next(e for e in bundle.entries if e["key"] == key_for("k_rot", step, layer))
    expected = bundle.expected[entry["key"]]  # DFlash's keys at this step: its context, then the block
    context = expected.shape[1] - q_len
    head = min(sinks, want)
    rows = np.r_[np.arange(head), np.arange(context - (want - head), context)]
    tail = expected[:, rows].astype(np.float64)
    got = k_rot[:, seen].astype(np.float64)
    err = np.abs(got - tail).max() / max(1.0, float(np.abs(tail).max())) if got.shape == tail.shape else np.inf
    check("k_rot", err <= entry["tolerance"], f"its {want} context keys are not DFlash's (rel {err:.1e})", layer)


def _spans(index: np.ndarray) -> str:
    """0 1 2 7 8 → '0–2, 7–8'."""
    runs, out = np.split(index, np.flatnonzero(np.diff(index) != 1) + 1), []
    for run in runs:
        if run.size:
            out.append(f"{run[0]}" if run.size == 1 else f"{run[0]}–{run[-1]}")
    return ", ".join(out) or "none"


def _keep_first_tensors(checks: list[Check]) -> None:
    """Only the bundle's first divergence keeps its two tensors (for `verify --html`): the others are let go."""
    failing = [c for c in checks if c.status == "FAIL"]
    first = next((c for c in failing if c.kind == "semantic"), failing[0] if failing else None)
    for c in failing:
        if c is not first:
            c.expected = c.got = None


def _final_crop_free(expected: np.ndarray, got, last: bool) -> np.ndarray:
    """The expected cache lengths, except the target's crop after the last step (its cache is never
    used again: a port may skip that crop), which is taken as the port gave it."""
    got = array_or_none(got)
    if not last or got is None or got.shape != expected.shape:
        return expected
    expected = expected.copy()
    expected[5] = got[5]
    return expected
