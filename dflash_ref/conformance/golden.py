"""The golden scenarios, and writing their bundles: tiny models, run through the reference with every
hook point recorded (`tracing`), stored with their weights in the official formats.

    01_walkthrough   the seed's example: a 3-token prompt, block size 4 (walkthrough/demo.py's models)
    02_multiround    greedy, many rounds: τ = 0, partial and full; a mismatch followed by a match;
                     the mask token among the outputs
    03_stop_token    the same models, stopped by a stop token inside a step
    04_gqa_sliding   8 query heads on 2 KV heads; layer 0 a sliding window of 3 (causal), layer 1 full
    05_block16       the official shape in miniature: 36 target layers, 5 draft layers, block 16,
                     target_layer_ids [1, 9, 17, 25, 33], 4 query heads per KV head
    06_bf16          bfloat16 weights and compute (expected values stored as exact float32)

`python -m dflash_ref golden --out DIR` writes them; a rerun writes the same bytes. Each scenario
checks the property it exists for, so a change that loses it fails loudly.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..config import DraftConfig, TargetConfig
from ..draft_model import DFlashDraftModel
from ..drafts.checkpoint import save_draft
from ..drafts.random_draft import randomize_
from ..extensions.linear import use_rows_first
from ..target import Qwen3Target
from ..target.checkpoint import save_target
from ..walkthrough.demo import PROMPT, demo_models, encode
from .adapters import ReferenceAdapter
from .bundle import FORMAT, KINDS, STAGES, TITLES, Bundle, parse_key, walk_order, write_bundle_files
from .variants import VARIANTS

TOLERANCE = {"float32": 1e-5, "bfloat16": 6e-2}  # max|Δ| / max(1, max|expected|); integers exact


def tiny_pair(seed: int, vocab: int = 6, target_layers: int = 4, draft_layers: int = 2, heads: int = 4,
              kv_heads: int = 2, target_heads: tuple[int, int] = (4, 2), intermediate: int = 32,
              block_size: int = 4, **draft_fields) -> tuple[Qwen3Target, DFlashDraftModel]:
    shared = dict(vocab_size=vocab, hidden_size=16, head_dim=4, intermediate_size=intermediate,
                  max_position_embeddings=128, rope_theta=10000.0)
    target = Qwen3Target(TargetConfig(num_hidden_layers=target_layers, num_attention_heads=target_heads[0],
                                      num_key_value_heads=target_heads[1], **shared))
    draft = DFlashDraftModel(DraftConfig(num_hidden_layers=draft_layers, num_attention_heads=heads,
                                         num_key_value_heads=kv_heads, num_target_layers=target_layers,
                                         block_size=block_size, mask_token_id=vocab - 1, **shared,
                                         **draft_fields))
    use_rows_first(draft)           # as every draft that decodes here (extensions/linear.py)
    return randomize_(target, seed), randomize_(draft, seed + 1000)


@dataclass
class Scenario:
    name: str
    description: str
    build: Callable[[], tuple[Qwen3Target, DFlashDraftModel]]
    input_ids: list[int]
    max_new_tokens: int
    stop_token_ids: list[int] | None = None
    dtype: str = "float32"
    check: Callable[[dict], None] = lambda produced: None


def _steps(p: dict, what: str) -> list:
    return [p[k].tolist() for k in sorted((k for k in p if k.endswith("/" + what)), key=walk_order)]


def _check_multiround(p: dict) -> None:
    taus, gammas = _steps(p, "acceptance_length"), [len(d) for d in _steps(p, "draft_tokens")]
    assert 0 in taus and any(0 < t < 3 for t in taus) and 3 in taus and max(gammas) == 3, taus
    hops = [(d, q) for d, q in zip(_steps(p, "draft_tokens"), _steps(p, "posterior"))
            if any(d[i] != q[i] and d[j] == q[j] for i in range(len(d)) for j in range(i + 1, len(d)))]
    assert hops, "no step where a rejected draft token is followed by a matching one"
    assert 5 in p["output_ids"][4:], "the mask token (5) should be among the outputs"


def _check_stop(p: dict) -> None:
    out = p["output_ids"].tolist()
    assert len(out) < 4 + 20 and out[-1] == 2 and 2 not in out[4:-1], out
    assert any(t > 0 for t in _steps(p, "acceptance_length"))


def _check_block16(p: dict) -> None:
    assert p["prefill/layer_ids"].tolist() == [1, 9, 17, 25, 33]
    assert p["step0/draft.layers.4.self_attn.hook_pattern"].shape[1] == 16


SCENARIOS = [
    Scenario("walkthrough", "the seed's example: 3-token prompt 'the cat sat', block size 4, the demo models",
             lambda: demo_models(), encode(PROMPT)[0].tolist(), 4),
    Scenario("multiround", "greedy, 9 rounds: τ = 0, partial and full; a rejected draft token followed by a "
             "matching one (cumprod matters); the mask token (5) among the outputs",
             lambda: tiny_pair(8), [0, 1, 2, 3], 20, check=_check_multiround),
    Scenario("stop_token", "the multiround models, stopped by stop token 2 committed inside a step",
             lambda: tiny_pair(8), [0, 1, 2, 3], 20, stop_token_ids=[2], check=_check_stop),
    Scenario("gqa_sliding", "8 query heads on 2 KV heads; draft layer 0 a causal sliding window of 3, "
             "layer 1 full non-causal attention", lambda: tiny_pair(
                 3, vocab=8, heads=8, layer_types=["sliding_attention", "full_attention"], sliding_window=3),
             [1, 2, 3, 4, 5, 6, 0], 10),
    Scenario("block16", "the official shape in miniature: 36 target layers, 5 draft layers, block size 16, "
             "target_layer_ids [1, 9, 17, 25, 33], 4 query heads per KV head",
             lambda: tiny_pair(5, vocab=8, target_layers=36, draft_layers=5, heads=4, kv_heads=1,
                               target_heads=(4, 1), intermediate=16, block_size=16),
             [1, 2, 3, 4, 5], 20, check=_check_block16),
    Scenario("bf16", "the multiround shapes in bfloat16 (weights and compute)", lambda: tiny_pair(11),
             [0, 1, 2, 3], 12, dtype="bfloat16"),
]


def _entry(key: str, array: np.ndarray, tolerance: float, sliding: set[int]) -> dict:
    stage, step, layer = parse_key(key)
    where = ", ".join(([f"step {step}"] if step is not None else []) +
                      ([f"draft layer {layer}"] if layer is not None else []))
    layout = next(s[3] for s in STAGES if s[0] == stage)
    integer = np.issubdtype(array.dtype, np.integer)
    entry = {"key": key, "stage": stage, "step": step, "layer": layer, "shape": list(array.shape),
             "dtype": str(array.dtype), "meaning": f"{where + ': ' if where else ''}{TITLES[stage]} {layout}",
             "kind": KINDS[stage], "tolerance": 0.0 if integer else tolerance}
    if layer in sliding and stage in ("k_rot", "pattern"):  # keys no query can see may be evicted
        entry["evictable_axis"] = 1 if stage == "k_rot" else 2
    return entry


def write_scenario(scenario: Scenario, folder: str | Path, index: int = 0) -> Path:
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    target, draft = scenario.build()
    dtype = getattr(torch, scenario.dtype)
    save_target(target, folder / "target", dtype)
    save_draft(draft, folder / "draft", dtype)
    tolerance = TOLERANCE[scenario.dtype]
    sliding = {i for i in range(draft.config.num_hidden_layers) if draft.config.layer_type(i) == "sliding_attention"}
    manifest = {
        "format": FORMAT, "name": scenario.name, "order": index, "description": scenario.description,
        "dtype": "float32", "source_dtype": scenario.dtype,
        "inputs": {"input_ids": scenario.input_ids, "max_new_tokens": scenario.max_new_tokens,
                   "stop_token_ids": scenario.stop_token_ids, "block_size": None, "temperature": 0.0},
        "comparison": "floats: max|got − expected| / max(1, max|expected|) ≤ tolerance; integers: equal; "
                      "shapes: equal, except that on a sliding-window layer leading keys no query can see (attention "
                      "weight exactly 0) may be left out along `evictable_axis`. Batch dimension dropped. "
                      "Keys in the order of the data's walk.",
        "stages": [{"stage": s, "title": t, "meaning": m, "layout": lay, "kind": KINDS[s]} for s, t, m, lay in STAGES],
        "kinds": "semantic: what DFlash defines (a difference is a failure); observable: how the reference lays out "
                 "its state (checked against the port's declared or detected design variant, else a note)",
        "variants": {key: {"reference": choices[0], "choices": list(choices)} for key, choices in VARIANTS.items()},
        "tensors": [],
    }
    produced = ReferenceAdapter().run(Bundle(folder, manifest))  # from the weights as stored
    scenario.check(produced)
    expected = {}
    for key in sorted(produced, key=walk_order):
        array = produced[key]
        array = array.astype(np.int64 if np.issubdtype(array.dtype, np.integer) else np.float32)
        manifest["tensors"].append(_entry(key, array, tolerance, sliding))
        expected[key] = array
    write_bundle_files(folder, manifest, expected)
    return folder


def generate_golden(out: str | Path, names: list[str] | None = None) -> list[Path]:
    """Write the bundles of the given scenarios (default: all) to out/NN_name."""
    unknown = set(names or ()) - {s.name for s in SCENARIOS}
    if unknown:
        raise ValueError(f"unknown scenario(s) {sorted(unknown)}; choose from {[s.name for s in SCENARIOS]}")
    if Path(out).exists() and not Path(out).is_dir():
        raise ValueError(f"{out} is a file, not a folder for the bundles")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order whatever the machine's cores: the same bytes on a rerun
    try:
        return [write_scenario(s, Path(out) / f"{i:02d}_{s.name}", i)
                for i, s in enumerate(SCENARIOS, 1) if not names or s.name in names]
    finally:
        torch.set_num_threads(threads)
