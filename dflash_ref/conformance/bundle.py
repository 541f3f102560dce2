"""Golden bundles on disk, read and written with numpy alone (never torch): the kit's file format.

A bundle is one folder, one scenario:

    manifest.json          format, scenario, inputs, the stages, and one entry per expected tensor in
                           the order of the data's walk: key, stage, step, layer, shape, dtype,
                           meaning, tolerance
    target/                config.json + model.safetensors   (transformers' Qwen3ForCausalLM format; a hybrid
                           target: Qwen3_5ForConditionalGeneration's, as Qwen3.5 is released)
    draft/                 config.json + model.safetensors   (the official DFlash draft format)
    expected.safetensors   the expected tensors, keyed as in the manifest (batch dimension dropped)

Keys and stages: stages.py (`prefill/layer_ids`, `step{s}/{name}`, `output_ids`).
A safetensors file is an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}}, then raw little-endian bytes; `tensorfile.read_safetensors` is a complete reader (BF16
comes back as float32, exactly). Expected tensors of a bf16 scenario are stored as float32 holding
exactly representable bf16 values (the manifest says `"source_dtype": "bfloat16"`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .stages import (
    KINDS,
    LAYER_STAGES,
    LOOP_STAGES,
    MODEL_STAGES,
    PREFILL_STAGES,
    STAGE_INDEX,
    STAGES,
    TARGET_LAYER_STAGES,
    TITLES,
    key_for,
    parse_key,
    walk_order,
)
from .tensorfile import array_or_none, read_safetensors, write_safetensors

FORMAT = "dflash_ref.golden/3"  # /2: stage kinds and design variants in the manifest; /3: checksums, target stages
READABLE = ("dflash_ref.golden/1", "dflash_ref.golden/2", FORMAT)  # older bundles read the same, unchecked
SHIPPED = Path(__file__).resolve().parent / "bundles"  # the bundle(s) inside the package
__all__ = [
    "FORMAT",
    "READABLE",
    "SHIPPED",
    "Bundle",
    "candidates_in_id_order",
    "find_bundles",
    "load_bundle",
    "write_bundle_files",
    "check_files",
    "checksums",  # and the stages' names, read from here as before (stages.py)
    "KINDS",
    "LAYER_STAGES",
    "LOOP_STAGES",
    "MODEL_STAGES",
    "PREFILL_STAGES",
    "STAGE_INDEX",
    "STAGES",
    "TARGET_LAYER_STAGES",
    "TITLES",
    "key_for",
    "parse_key",
    "walk_order",
]


def candidates_in_id_order(arrays: dict) -> dict:
    """The candidates are a set, their order an implementation's (torch's unsorted top-K, a sorted
    one, ...): each step's rows of candidates, unary and pair scores, reordered by increasing token id."""
    out = dict(arrays)
    for key, candidates in arrays.items():
        if not key.endswith(MODEL_STAGES["candidates"]):
            continue
        candidates = array_or_none(candidates)
        if candidates is None or candidates.ndim == 0 or not np.issubdtype(candidates.dtype, np.number):
            continue  # left for the comparison to name
        order = np.argsort(candidates, axis=-1, kind="stable")  # (γ, K)
        prefix = key[: -len(MODEL_STAGES["candidates"])]
        for stage in ("candidates", "unary", "pair"):
            value = array_or_none(arrays.get(prefix + MODEL_STAGES[stage]))
            if value is not None and value.shape == order.shape:  # a wrong shape is left for the comparison to name
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

    def draft_is_muse(self) -> bool:
        """Whether the draft folder is transformers' Muse Glimmer assistant (muse_glimmer.py) rather than a DFlash
        checkpoint: only transformers' own DFlash and the reference read it."""
        from ..muse_glimmer import is_muse  # here, not above: reading a bundle imports no torch

        return is_muse(self.config("draft"))


@functools.lru_cache(maxsize=64)
def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_digest(bundle: Bundle) -> tuple[str, ...]:
    """What identifies a bundle's target and draft (bundles of one model pair share it, as an engine serves them):
    their configs' and weights' digests."""
    files = [d / f for d in (bundle.target_dir, bundle.draft_dir) for f in ("config.json", "model.safetensors")]
    return tuple(_file_digest(f.resolve()) for f in files if f.exists())


def checksums(path: Path) -> dict[str, str]:
    """sha256 of every file a bundle's manifest vouches for: expected.safetensors and the files of target/ and
    draft/ (a linked target folder's too), by their path in the bundle."""
    files = [path / "expected.safetensors"]
    files += sorted(p for which in ("target", "draft") for p in (path / which).iterdir() if p.is_file())
    return {p.relative_to(path).as_posix(): _sha256(p) for p in files}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest itself but its checksums (its inputs, tensors, tolerances), canonical JSON."""
    rest = {k: v for k, v in manifest.items() if k != "checksums"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def check_files(path: Path, manifest: dict) -> None:
    """Every file the manifest lists is there with its checksum, no other file lies in target/ or draft/, and
    the manifest is as golden wrote it; else a ValueError beginning "bundle damaged": a damaged bundle must
    never read as a port's bug. A bundle of an older format has no checksums to check."""
    if manifest.get("format") != FORMAT:
        return
    sums = manifest.get("checksums")
    if not isinstance(sums, dict) or not isinstance(sums.get("files"), dict):
        raise ValueError(f"bundle damaged: {path / 'manifest.json'} has no checksums (a {FORMAT} bundle has)")
    if sums.get("manifest") != manifest_digest(manifest):
        raise ValueError(
            f"bundle damaged: {path / 'manifest.json'} is not the manifest golden wrote (its inputs, tensors or "
            "tolerances changed); write the bundle anew: python -m dflash_ref golden --out DIR"
        )
    listed = sums["files"]
    for which in ("target", "draft"):
        for file in sorted((path / which).iterdir()) if (path / which).is_dir() else []:
            if file.is_file() and f"{which}/{file.name}" not in listed:
                raise ValueError(f"bundle damaged: {file} is not one of the bundle's files (a loader might read it)")
    for name, expected in listed.items():
        file = path / name
        if not file.is_file():
            raise ValueError(f"bundle damaged: {file} is missing (the manifest lists it)")
        if _sha256(file) != expected:
            raise ValueError(
                f"bundle damaged: {file} is not the file golden wrote (its sha256 differs from the manifest's); "
                "write the bundle anew: python -m dflash_ref golden --out DIR"
            )


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
    missing = [k for k in ("name", "inputs", "tensors") if k not in manifest]  # what Bundle reads
    if missing:
        raise ValueError(f"{manifest_path} lacks {missing}")
    check_files(path, manifest)  # first: before any of its tensors is read
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
    """expected.safetensors, then manifest.json with every file's checksum (the weights, and a target's
    tokenizer, are written by the caller before)."""
    write_safetensors(path / "expected.safetensors", expected)
    manifest.pop("checksums", None)
    manifest["checksums"] = {
        "algorithm": "sha256",
        "files": checksums(path),
        "manifest": manifest_digest(manifest),
        "meaning": "each file as golden wrote it, and this manifest but its checksums; verify refuses a bundle "
        "that differs, or has other files in target/ or draft/ (bundle damaged)",
    }
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
