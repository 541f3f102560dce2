"""Golden bundles on disk, read and written with numpy alone (never torch): the kit's file format.

A bundle is one folder, one scenario:

    manifest.json          format, scenario, inputs, the stages, and one entry per expected tensor in
                           the order of the data's walk: key, stage, step, layer, shape, dtype,
                           meaning, tolerance
    target/                config.json + model.safetensors   (transformers' Qwen3ForCausalLM format)
    draft/                 config.json + model.safetensors   (the official DFlash draft format)
    expected.safetensors   the expected tensors, keyed as in the manifest (batch dimension dropped)

Keys: `prefill/layer_ids`, `step{s}/{name}` (name: a hook point of the reference, e.g.
`draft.layers.0.self_attn.hook_q`, or a loop value: `draft_tokens`, `posterior`, ...), `output_ids`.
A safetensors file is an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}}, then raw little-endian bytes; `tensorfile.read_safetensors` is a complete reader (BF16
comes back as float32, exactly). Expected tensors of a bf16 scenario are stored as float32 holding
exactly representable bf16 values (the manifest says `"source_dtype": "bfloat16"`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .tensorfile import array_or_none, read_safetensors, write_safetensors

FORMAT = "dflash_ref.golden/2"                 # /2: stage kinds and design variants in the manifest
READABLE = ("dflash_ref.golden/1", FORMAT)      # a /1 bundle reads the same (kinds from the stage)
SHIPPED = Path(__file__).resolve().parent / "bundles"  # the bundle(s) inside the package

# (stage id, title, meaning, layout), in the order of the data's walk. Per-layer stages are q..layer_out.
STAGES = [
    ("layer_ids", "layer ids", "target layers feeding the draft (target_layer_ids); layer l is read at "
     "hidden_states[l + 1], index 0 being the embedding output", "(k,) int64"),
    ("target_hidden", "extracted features", "concat over features of the sampled target layers' hidden "
     "states at the new context positions (the prefill's, then the first τ + 1 of each verify)", "(L_c, k·d)"),
    ("fc", "fc", "W_fc · target_hidden, no bias", "(L_c, d)"),
    ("context", "C", "C = RMSNorm_hidden(W_fc · target_hidden)", "(L_c, d)"),
    ("noise_embedding", "block embedding", "the target's embed_tokens of the block [x_0, mask, ..., mask]",
     "(L_q, d)"),
    ("attn_conv_taps", "attention conv taps", "DFlash 2: a_t = W_a x_t of the attention sublayer's convolution, x = "
     "RMSNorm_in(H); [:, 0] the prepare taps, [:, 1] the finish taps", "(L_q, 2, K, G)"),
    ("attn_conv_in", "attention conv input", "DFlash 2: u_t = Σ_j (w⁰_j + a⁰_{t,j,g}) ⊙ x_{t−j}, zero before the "
     "block's first position: what Q, K and V of the block are computed from", "(L_q, d)"),
    ("q", "Q after QNorm", "QNorm(H W_Q) per head, before RoPE", "(H_q, L_q, d_h)"),
    ("k_ctx", "K context after KNorm", "KNorm(C W_K) per head, before RoPE", "(H_kv, L_c, d_h)"),
    ("k_noise", "K block after KNorm", "KNorm(H W_K) per head, before RoPE", "(H_kv, L_q, d_h)"),
    ("v", "V", "[C W_V; H W_V] per head (new positions only)", "(H_kv, L_c + L_q, d_h)"),
    ("q_rot", "Q after RoPE", "Q rotated at the block's positions: the last L_q rows of the RoPE table",
     "(H_q, L_q, d_h)"),
    ("k_rot", "K after RoPE", "K rotated at all L_c + L_q new positions, the cached context K prepended",
     "(H_kv, L_k, d_h)"),
    ("pattern", "attention weights", "softmax(Q Kᵀ/√d_h) over every key (non-causal on full-attention "
     "layers; causal within the window on sliding ones), query head h reading KV head h // (H_q/H_kv)",
     "(H_q, L_q, L_k)"),
    ("attn_out", "attention output", "W_O · attention output", "(L_q, d)"),
    ("attn_conv_out", "attention conv output", "DFlash 2: W_O · attention output convolved with w¹ + a¹ (the taps "
     "of the sublayer's input)", "(L_q, d)"),
    ("mlp_conv_taps", "MLP conv taps", "DFlash 2: a_t = W_a x_t of the MLP sublayer's convolution, x = "
     "RMSNorm_post(H')", "(L_q, 2, K, G)"),
    ("mlp_conv_in", "MLP conv input", "DFlash 2: the MLP's input, convolved with w⁰ + a⁰", "(L_q, d)"),
    ("mlp_conv_out", "MLP conv output", "DFlash 2: the MLP's output convolved with w¹ + a¹", "(L_q, d)"),
    ("layer_out", "layer output", "H' = H + Attn(LN(H), C); H' + MLP(LN(H'))", "(L_q, d)"),
    ("final_hidden", "final hidden", "RMSNorm_final of the last layer's output, all L_q positions",
     "(L_q, d)"),
    ("logits", "draft logits", "the target's lm_head on the draft's last L_q − 1 positions", "(γ, V)"),
    ("candidates", "candidates", "DFlash 2: the top-K token ids of each proposal position's draft logits; a set: "
     "each row compared in increasing id order (unary and pair reordered alike)", "(γ, K) int64"),
    ("unary", "unary scores", "DFlash 2: z_{t,k}, the draft logits at the candidates", "(γ, K)"),
    ("pair", "pair scores", "DFlash 2: ⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩, x_{t−1} the candidate chosen "
     "at t − 1 (x_0 the block's anchor)", "(γ, K)"),
    ("draft_tokens", "draft tokens", "the proposals d_1..d_γ: the argmax of the draft logits (DFlash 1), the "
     "selector's path argmax_k (unary + pair) from the anchor (DFlash 2)", "(γ,) int64"),
    ("posterior", "posterior", "argmax of the target's logits at each verified block position", "(L_q,) int64"),
    ("acceptance_length", "acceptance length τ", "Σ_i Π_{j≤i} 1[d_j = posterior_{j−1}]", "() int64"),
    ("bonus", "bonus token", "posterior[τ], the target's token after the accepted run", "() int64"),
    ("cache_lengths", "cache lengths", "[draft before the pass, draft after the pass, draft after its crop "
     "(= start), target before verify, target after verify, target after its crop (= new start)]",
     "(6,) int64"),
    ("output_ids", "output ids", "prompt followed by every committed token", "(L,) int64"),
]
# semantic: what DFlash defines; observable: how an implementation lays out its state (variants.py)
KINDS = {s[0]: "observable" if s[0] == "cache_lengths" else "semantic" for s in STAGES}
STAGE_INDEX = {s[0]: i for i, s in enumerate(STAGES)}
TITLES = {s[0]: s[1] for s in STAGES}
LAYER_STAGES = {"q": "self_attn.hook_q", "k_ctx": "self_attn.hook_k_ctx", "k_noise": "self_attn.hook_k_noise",
                "v": "self_attn.hook_v", "q_rot": "self_attn.hook_q_rot", "k_rot": "self_attn.hook_k_rot",
                "pattern": "self_attn.hook_pattern", "attn_out": "self_attn.hook_out",
                "layer_out": "hook_resid_post", "attn_conv_taps": "attention_conv.hook_taps",
                "attn_conv_in": "attention_conv.hook_prepared", "attn_conv_out": "attention_conv.hook_finished",
                "mlp_conv_taps": "mlp_conv.hook_taps", "mlp_conv_in": "mlp_conv.hook_prepared",
                "mlp_conv_out": "mlp_conv.hook_finished"}
MODEL_STAGES = {"target_hidden": "draft.hook_target_hidden", "fc": "draft.context.hook_fc",
                "context": "draft.context.hook_context", "noise_embedding": "draft.hook_noise_embedding",
                "final_hidden": "draft.hook_out", "logits": "draft.hook_logits",
                "candidates": "draft.candidate_selector.hook_candidates", "unary": "draft.candidate_selector.hook_unary",
                "pair": "draft.candidate_selector.hook_pair"}
LOOP_STAGES = ("draft_tokens", "posterior", "acceptance_length", "bonus", "cache_lengths")
_BY_NAME = {v: k for k, v in MODEL_STAGES.items()}
_LAYER_NAME = re.compile(r"draft\.layers\.(\d+)\.(.+)")
_BY_SUFFIX = {v: k for k, v in LAYER_STAGES.items()}


def key_for(stage: str, step: int | None = None, layer: int | None = None) -> str:
    """The dump/manifest key of one tensor, e.g. key_for("q", 0, 1) = "step0/draft.layers.1.self_attn.hook_q"."""
    if stage == "layer_ids":
        return "prefill/layer_ids"
    if stage == "output_ids":
        return "output_ids"
    name = (f"draft.layers.{layer}.{LAYER_STAGES[stage]}" if stage in LAYER_STAGES
            else MODEL_STAGES.get(stage, stage))
    return f"step{step}/{name}"


def parse_key(key: str) -> tuple[str, int | None, int | None]:
    """key → (stage, step, layer); ValueError for a key that names no stage."""
    if key in ("prefill/layer_ids", "output_ids"):
        return key.rsplit("/", 1)[-1], None, None
    match = re.fullmatch(r"step(\d+)/(.+)", key)
    if match:
        step, name = int(match.group(1)), match.group(2)
        if name in LOOP_STAGES:
            return name, step, None
        if name in _BY_NAME:
            return _BY_NAME[name], step, None
        layer = _LAYER_NAME.fullmatch(name)
        if layer and layer.group(2) in _BY_SUFFIX:
            return _BY_SUFFIX[layer.group(2)], step, int(layer.group(1))
    raise ValueError(f"{key!r} names no stage of the conformance kit")


def walk_order(key: str) -> tuple:
    """Sort key following the data's walk: prefill, then per step (context, layers, outputs), then output."""
    stage, step, layer = parse_key(key)
    index = STAGE_INDEX[stage]
    if stage == "layer_ids":
        return (0,)
    if stage == "output_ids":
        return (2,)
    group = 1 if stage in LAYER_STAGES else (0 if index < STAGE_INDEX["q"] else 2)
    return (1, step, group, layer or 0, index)


def candidates_in_id_order(arrays: dict) -> dict:
    """The candidates are a set, their order an implementation's (torch's unsorted top-K, a sorted
    one, ...): each step's rows of candidates, unary and pair scores, reordered by increasing token id."""
    out = dict(arrays)
    for key, candidates in arrays.items():
        if not key.endswith(MODEL_STAGES["candidates"]):
            continue
        candidates = array_or_none(candidates)
        if candidates is None or candidates.ndim == 0 or not np.issubdtype(candidates.dtype, np.number):
            continue                                                   # left for the comparison to name
        order = np.argsort(candidates, axis=-1, kind="stable")                     # (γ, K)
        prefix = key[:-len(MODEL_STAGES["candidates"])]
        for stage in ("candidates", "unary", "pair"):
            value = array_or_none(arrays.get(prefix + MODEL_STAGES[stage]))
            if value is not None and value.shape == order.shape:   # a wrong shape is left for the comparison to name
                out[prefix + MODEL_STAGES[stage]] = np.take_along_axis(value, order, axis=-1)
    return out


# -- bundles ------------------------------------------------------------------------------------
@dataclass
class Bundle:
    """One scenario on disk. `entries` are the manifest's tensor entries, in walk order."""
    path: Path
    manifest: dict
    _expected: dict | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def inputs(self) -> dict:
        """input_ids, max_new_tokens, stop_token_ids, block_size, temperature."""
        return self.manifest["inputs"]

    @property
    def entries(self) -> list[dict]:
        return self.manifest["tensors"]

    @property
    def target_dir(self) -> Path:
        return self.path / "target"

    @property
    def draft_dir(self) -> Path:
        return self.path / "draft"

    @property
    def expected(self) -> dict[str, np.ndarray]:
        if self._expected is None:
            self._expected = read_safetensors(self.path / "expected.safetensors")
        return self._expected

    def weights(self, which: str) -> dict[str, np.ndarray]:
        """The target's or the draft's weights ("target" | "draft") as float32 numpy arrays."""
        return read_safetensors(self.path / which / "model.safetensors")

    def config(self, which: str) -> dict:
        return json.loads((self.path / which / "config.json").read_text())


def load_bundle(path: str | Path) -> Bundle:
    path = Path(path)
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"{path} is not a golden bundle (no manifest.json)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{manifest_path} is not JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path} is not a JSON object (a {type(manifest).__name__})")
    if manifest.get("format") not in READABLE:
        raise ValueError(f"{manifest_path} has format {manifest.get('format')!r}, expected one of {list(READABLE)}")
    missing = [k for k in ("name", "inputs", "tensors") if k not in manifest]      # what Bundle reads
    if missing:
        raise ValueError(f"{manifest_path} lacks {missing}")
    return Bundle(path, manifest)


def find_bundles(path: str | Path | None = None) -> list[Bundle]:
    """`path` is one bundle, or a folder of bundles (as `golden --out` writes, in name order);
    None: the bundle shipped inside the package."""
    path = Path(path) if path is not None else SHIPPED
    if (path / "manifest.json").is_file():
        return [load_bundle(path)]
    found = sorted(p for p in path.iterdir() if (p / "manifest.json").is_file()) if path.is_dir() else []
    if not found:
        raise FileNotFoundError(f"no golden bundle at {path} (run: python -m dflash_ref golden --out {path})")
    return [load_bundle(p) for p in found]


def write_bundle_files(path: Path, manifest: dict, expected: dict[str, np.ndarray]) -> None:
    """manifest.json and expected.safetensors (the weights are written by the caller)."""
    write_safetensors(path / "expected.safetensors", expected)
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
