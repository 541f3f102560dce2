"""The golden scenarios, and writing their bundles: tiny models, run through the reference with every
hook point recorded (`tracing`), stored with their weights in the official formats.

`python -m dflash_ref golden --out DIR` writes the scenarios of scenarios.py; a rerun writes the same
bytes. Every float tensor's tolerance comes from its own rounding, measured against the same
reference run in float64 (TOLERANCE_RULE), and every decision must be the same in that run: a
scenario whose tokens hang on rounding is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from ..drafts.checkpoint import save_draft, save_muse_glimmer
from ..muse_glimmer import MODEL_TYPE as MUSE
from ..target import Qwen3_5Target
from ..target.checkpoint import save_target
from ..target.qwen3_5_checkpoint import save_hybrid_target
from .bundle import (
    FORMAT,
    Bundle,
    candidates_in_id_order,
    read_pending,
    write_bundle_files,
    write_pending,
)
from .engine_scenarios import ENGINE_NAMES, SERVING_NAMES, engine_scenarios, serving_scenarios
from .exact import DRAFTS, ENGINE_SAMPLING, write_sampling
from .ports.reference import ReferenceAdapter
from .scenarios import SCENARIOS, Scenario
from .stages import STAGE, STAGES, TARGET_LAYER_STAGES, parse_key, walk_order
from .tokenizer_folder import write_tokenizer_folder
from .variants import VARIANTS

# the floors: max|Δ| / max(1, max|expected|); integers exact. fp32: the official MLX backend on the CPU, a correct
# port whose matrix products sum in another order, is up to 3.25e-5 off a golden written on an Intel Xeon
# (long_context, K context after KNorm: a head dim of 4 magnifies the fc product's rounding, 5.6e-6 there, against
# the golden's own 1.0e-6 from float64) and 1.02e-5 off one written on an AMD EPYC; the floor is 3× the worst seen
TOLERANCE = {"float32": 1e-4, "bfloat16": 6e-2}
SLACK = 4  # a tensor's tolerance: SLACK × the golden's own error against its float64 twin, at least the floor
TOLERANCE_RULE = (
    f"tolerance = max(floor, {SLACK} × error_vs_float64), error_vs_float64 being the golden value's own "
    "max|Δ| / max(1, max|float64|) against the same reference run in float64 from the same weights "
    "(a correct port is off the exact value by about as much as the golden, so it is at most twice that "
    f"from the golden; {SLACK}× leaves room for another order of sums); floor: "
    + ", ".join(f"{k} {v:g}" for k, v in TOLERANCE.items())
)


class GoldenRun(ReferenceAdapter):
    """The reference in `dtype` (None: the bundle's own; float64: what each golden value's rounding is
    measured against, RoPE angles in transformers' float32 recipe as everywhere), keeping the logits of
    every target pass: the posterior's decisions."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype


def _decisions_agree(name: str, golden: dict, other: dict, how: str) -> None:
    """Every integer the golden holds (ids, τ, bonus, proposals, posterior, lengths) is the same in
    `other`: the scenario's decisions do not hang on rounding, else no tolerance could be fair."""
    differ = [
        k
        for k, v in golden.items()
        if np.issubdtype(v.dtype, np.integer) and (k not in other or not np.array_equal(other[k], v))
    ]
    if differ:
        raise AssertionError(f"scenario {name}: {how} decides otherwise at {differ[:3]}: choose another seed")


def _margin(golden: list[np.ndarray], exact: list[np.ndarray], rank: int = 1) -> float:
    """min over the decisions (rows) of gap / δ: gap the golden row's rank-th − (rank+1)-th largest logit
    (rank 1: the argmax; rank K: DFlash 2's set of K candidates), δ its largest distance from the float64
    row. A port within δ of float64 is within 2δ of the golden, so its own gap is at least gap − 4δ: above
    SLACK it makes the golden's decision. A tie (gap 0) is a decision each implementation breaks its own way."""
    ratios = []
    for g, e in zip(golden, exact):
        if rank >= g.shape[-1]:
            continue  # all V are candidates: no decision
        g, e = g.astype(np.float64).reshape(-1, g.shape[-1]), e.astype(np.float64).reshape(-1, e.shape[-1])  # (rows, V)
        top = np.sort(g, axis=-1)
        delta = np.abs(g - e).max(axis=-1)
        ratios += list((top[:, -rank] - top[:, -rank - 1]) / np.maximum(delta, 1e-300))
    return float(min(ratios)) if ratios else float("inf")


def _entry(key: str, array: np.ndarray, tolerance: float, sliding: set[int]) -> dict:
    stage, step, layer = parse_key(key)
    which = "target" if stage in TARGET_LAYER_STAGES else "draft"
    where = ", ".join(
        ([f"step {step}"] if step is not None else []) + ([f"{which} layer {layer}"] if layer is not None else [])
    )
    record = STAGE[stage]
    integer = np.issubdtype(array.dtype, np.integer)
    entry = {
        "key": key,
        "stage": stage,
        "step": step,
        "layer": layer,
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "meaning": f"{where + ': ' if where else ''}{record.title} {record.layout}",
        "kind": record.kind,
        "tolerance": 0.0 if integer else tolerance,
    }
    if layer in sliding and record.window_keys_axis is not None:  # keys no query can see may be evicted
        entry["evictable_axis"] = record.window_keys_axis
    if record.unread_rows_axis is not None:  # position 0's final hidden feeds no logit: a port may skip its row
        entry["evictable_axis"] = record.unread_rows_axis
    return entry


def _keep_one_spelling(folder: Path, spelling: str) -> None:
    """Rewrite both configs with the RoPE settings in one spelling only: "rope_scaling" (with a top-level
    rope_theta, as released checkpoints) or "rope_parameters" (as transformers 5): a port that reads
    one spelling alone fails the other's bundle."""
    for which in ("target", "draft"):
        path = folder / which / "config.json"
        config = json.loads(path.read_text())
        if spelling == "rope_scaling":
            config.pop("rope_parameters")
        else:
            config.pop("rope_scaling", None)
            config.pop("rope_theta")
        path.write_text(json.dumps(config, indent=2) + "\n")


def _stub_tokens(scenario: Scenario, draft) -> list[str]:
    """Token i's text: the scenario's, its real tokenizer's, else <t0>, <t1>, …"""
    if scenario.tokens:
        return list(scenario.tokens)
    if scenario.tokenizer:
        return scenario.tokenizer().convert_ids_to_tokens(list(range(draft.config.vocab_size)))
    return [f"<t{i}>" for i in range(draft.config.vocab_size)]


def write_scenario(scenario: Scenario, folder: str | Path, index: int = 0) -> Path:
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    target, draft = scenario.build()
    dtype = getattr(torch, scenario.dtype)
    hybrid = isinstance(target, Qwen3_5Target)
    if scenario.target_folder is not None:  # a real model's folder, as it is (engine_scenarios.py)
        folder.mkdir(parents=True)
        where = scenario.target_folder().resolve()
        if where.is_relative_to(folder.parent.resolve()):  # another bundle's: relative, so the folder can move
            where = Path(os.path.relpath(where, folder.resolve()))
        (folder / "target").symlink_to(where, target_is_directory=True)
    else:
        (save_hybrid_target if hybrid else save_target)(target, folder / "target", dtype)
        if scenario.tokenizer is not None:  # what an engine reads beside the weights
            scenario.tokenizer().save_pretrained(folder / "target")
        else:  # a real minimal one, for loaders that insist on a tokenizer folder
            write_tokenizer_folder(
                folder / "target", _stub_tokens(scenario, draft), draft.mask_token_id, scenario.stop_token_ids or []
            )
    (save_muse_glimmer if scenario.draft_format == MUSE else save_draft)(draft, folder / "draft", dtype)
    if scenario.rope_spelling:
        _keep_one_spelling(folder, scenario.rope_spelling)
    tolerance = TOLERANCE[scenario.dtype]
    sliding = {i for i in range(draft.config.num_hidden_layers) if draft.config.layer_type(i) == "sliding_attention"}
    manifest = {
        "format": FORMAT,
        "name": scenario.name,
        "order": index,
        "description": scenario.description,
        "dtype": "float32",
        "source_dtype": scenario.dtype,
        "inputs": {
            "input_ids": scenario.input_ids,
            "max_new_tokens": scenario.max_new_tokens,
            "stop_token_ids": scenario.stop_token_ids,
            "block_size": None,
            "temperature": 0.0,
        },
        "tokenizer": {
            "tokens": _stub_tokens(scenario, draft),
            "mask_token_id": draft.mask_token_id,
            "eos_token_ids": scenario.stop_token_ids or [],
            "meaning": "token i's text (for labels); target/ holds a real tokenizer folder of the same vocabulary "
            "(AutoTokenizer loads it); ids are the models' own, prompts are given as ids, nothing is ever decoded "
            "from text",
        },
        "comparison": "floats: max|got − expected| / max(1, max|expected|) ≤ tolerance; integers: equal; "
        "shapes: equal, except that on a sliding-window layer leading keys no query can see (attention "
        "weight exactly 0) may be left out along `evictable_axis` (of K, V, weights), and so may the "
        "final hidden's row at block position 0, which feeds no logit. Batch dimension dropped. "
        "Keys in the order of the data's walk.",
        "stages": [
            {"stage": s.name, "title": s.title, "meaning": s.meaning, "layout": s.layout, "kind": s.kind}
            for s in STAGES
            if hybrid or s.name not in TARGET_LAYER_STAGES
        ],  # a hybrid target's states: its bundles only
        "kinds": "semantic: what DFlash defines (a difference is a failure); observable: how the reference lays out "
        "its state (checked against the port's declared or detected design variant, else a note)",
        "variants": {key: {"reference": choices[0], "choices": list(choices)} for key, choices in VARIANTS.items()},
        "tensors": [],
    }
    if scenario.serving:  # a request of a serving scenario: how an engine submits it beside the others
        manifest["serving"] = scenario.serving
    if sliding:  # which of the three meanings the draft's config gives its window (attention.py)
        manifest["sliding_window"] = {
            "kind": draft.config.window_kind,
            "size": draft.config.sliding_window,
            "layers": sorted(sliding),
        }
    bundle, golden, float64 = Bundle(folder, manifest), GoldenRun(), GoldenRun(torch.float64)
    produced = candidates_in_id_order(golden.run(bundle))  # from the weights as stored
    scenario.check(produced)
    twin = candidates_in_id_order(float64.run(bundle))
    _decisions_agree(scenario.name, produced, twin, "the float64 twin")
    logits = sorted((k for k in produced if parse_key(k)[0] == "logits"), key=walk_order)
    margins = {
        "draft": _margin([produced[k] for k in logits], [twin[k] for k in logits]),
        "target": _margin(*([t.double().numpy() for t in run.target_logits] for run in (golden, float64))),
    }
    unary = sorted((k for k in produced if parse_key(k)[0] == "unary"), key=walk_order)
    if unary:  # DFlash 2: the candidates are the K largest logits, the path's decisions argmax_k (unary + pair)
        top_k = produced[unary[0]].shape[-1]
        margins["candidates"] = _margin([produced[k] for k in logits], [twin[k] for k in logits], rank=top_k)
        scores = [{k: d[k] + d[k.replace("hook_unary", "hook_pair")] for k in unary} for d in (produced, twin)]
        margins["selector"] = _margin(list(scores[0].values()), list(scores[1].values()))
    narrowest = min(margins, key=margins.get)
    if margins[narrowest] <= SLACK:
        raise AssertionError(
            f"scenario {scenario.name}: a decision's margin ({narrowest}) is only {margins[narrowest]:.3g}× "
            "its rounding: choose another seed"
        )
    manifest["tolerance_rule"] = TOLERANCE_RULE
    manifest["margins"] = {
        **{k: round(v, 1) if np.isfinite(v) else None for k, v in margins.items()},
        "meaning": f"min over the draft's (target's, the selector's) decisions of (top-1 − top-2 logit "
        "or score; for DFlash 2's candidates top-K − top-(K+1)) / (the logits' "
        f"distance from float64): above {SLACK}, a port as near float64 as the golden "
        "decides alike",
    }
    expected = {}
    for key in sorted(produced, key=walk_order):
        array = produced[key]
        array = array.astype(np.int64 if np.issubdtype(array.dtype, np.integer) else np.float32)
        entry = _entry(key, array, tolerance, sliding)
        if not np.issubdtype(array.dtype, np.integer):
            exact = twin[key].astype(np.float64)  # the float64 twin's value: the exact one, to the golden's precision
            entry["error_vs_float64"] = float(np.abs(array - exact).max() / max(1.0, np.abs(exact).max()))
            entry["tolerance"] = max(tolerance, SLACK * entry["error_vs_float64"])
        manifest["tensors"].append(entry)
        expected[key] = array
    write_bundle_files(folder, manifest, expected)
    return folder


def generate_golden(
    out: str | Path, names: list[str] | None = None, engines: bool = False, on_written=None
) -> list[Path]:
    """Write the bundles of the given scenarios (default: the tiny ones, then the sampling bundles, then with
    `engines` the engine-shaped ones, the serving scenarios' requests (engine_scenarios.py) and the engines' sampling
    bundle (exact.py)) to out/NN_name; `on_written(path)` is called as each is written (a long run shows progress).
    Before the first, the bundles asked for are listed in out/PENDING (bundle.py), each struck off once written
    (its manifest, written last, there), the file removed when none is left: a run cut short leaves it, and
    find_bundles names the bundles it never wrote."""
    known = [s.name for s in SCENARIOS] + list(DRAFTS) + list(ENGINE_NAMES) + list(SERVING_NAMES) + [ENGINE_SAMPLING]
    unknown = set(names or ()) - set(known)
    if unknown:
        raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {known}")
    engine = [
        n for n in (*ENGINE_NAMES, *SERVING_NAMES, ENGINE_SAMPLING) if (engines and not names) or n in (names or ())
    ]
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder for the bundles")
    plan = _plan(out, names, engine)
    out.mkdir(parents=True, exist_ok=True)
    pending = [p.name for p, _ in plan]
    try:
        earlier = read_pending(out)  # an earlier run's, cut short: still missing unless written now
    except ValueError:  # a list that cannot be read is replaced by this run's
        earlier = []
    pending += [n for n in earlier if n not in pending and not (out / n / "manifest.json").is_file()]
    write_pending(out, pending)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order whatever the machine's cores: the same bytes on a rerun
    try:
        written = []
        for folder, write in plan:
            written.append(write(folder))
            pending.remove(folder.name)
            write_pending(out, pending)
            if on_written is not None:
                on_written(written[-1])
        return written
    finally:
        torch.set_num_threads(threads)


def _plan(out: Path, names: list[str] | None, engine: list[str]) -> list[tuple[Path, object]]:
    """The bundles asked for, in the order they are written: (folder, write(folder) → folder). The engine-shaped and
    serving scenarios are built at their first bundle (they need SmolLM2's tokenizer)."""
    plan = [
        (out / f"{i:02d}_{s.name}", lambda f, s=s, i=i: write_scenario(s, f, i))
        for i, s in enumerate(SCENARIOS, 1)
        if not names or s.name in names
    ]
    for i, name in enumerate(DRAFTS, len(SCENARIOS) + 1):  # the sampling bundles after the tiny ones
        if not names or name in names:
            plan.append((out / f"{i:02d}_{name}", lambda f, name=name, i=i: write_sampling(f, i, name)))
    built: dict = {}

    def scenario(build, name: str) -> Scenario:
        if build not in built:
            built[build] = {s.name: s for s in build()}
        return built[build][name]

    first = len(SCENARIOS) + len(DRAFTS) + 1
    for i, name in enumerate(ENGINE_NAMES, first):
        if name in engine:
            plan.append(
                (out / f"{i:02d}_{name}", lambda f, n=name, i=i: write_scenario(scenario(engine_scenarios, n), f, i))
            )
    shared: dict[str, Path] = {}  # serving requests share their pair's target: written once, then linked

    def serve(folder: Path, name: str, i: int) -> Path:
        s = scenario(serving_scenarios, name)
        models = s.serving["models"]
        if models in shared:
            s = dataclasses.replace(s, target_folder=lambda where=shared[models]: where)
        written = write_scenario(s, folder, i)
        shared.setdefault(models, written / "target")
        return written

    for i, name in enumerate(SERVING_NAMES, first + len(ENGINE_NAMES)):
        if name in engine:
            plan.append((out / f"{i:02d}_{name}", lambda f, n=name, i=i: serve(f, n, i)))
    if ENGINE_SAMPLING in engine:  # the engines' sampling bundle, last
        i = first + len(ENGINE_NAMES) + len(SERVING_NAMES)
        plan.append((out / f"{i:02d}_{ENGINE_SAMPLING}", lambda f, i=i: write_sampling(f, i, ENGINE_SAMPLING)))
    return plan
