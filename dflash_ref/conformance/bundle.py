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
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .stages import MODEL_STAGES
from .tensorfile import array_or_none, read_safetensors, write_safetensors

FORMAT = "dflash_ref.golden/3"  # /2: stage kinds and design variants in the manifest; /3: checksums, target stages
READABLE = ("dflash_ref.golden/1", "dflash_ref.golden/2", FORMAT)  # older bundles read the same, unchecked
SHIPPED = Path(__file__).resolve().parent / "bundles"  # the bundle(s) inside the package
PENDING = "golden-pending.json"  # in a golden folder: the bundles a golden run was asked for and has not written
BUNDLE_PARTS = ("target", "draft", "expected.safetensors")  # what golden writes into a bundle before its manifest
__all__ = [
    "FORMAT",
    "READABLE",
    "SHIPPED",
    "Bundle",
    "candidates_in_id_order",
    "find_bundles",
    "load_bundle",
    "read_pending",
    "write_pending",
    "write_bundle_files",
    "check_files",
    "checksums",
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
    None: the bundle shipped inside the package. A bundle folder without its manifest (golden writes it last:
    a run cut short) and a bundle a golden run was asked for and never wrote (PENDING) are said by name, as
    "bundle damaged: …" (a ValueError): never left out of a run that then reads as whole."""
    path = Path(path) if path is not None else SHIPPED
    if (path / "manifest.json").is_file():
        return [load_bundle(path)]
    if _unfinished(path):
        raise ValueError(f"bundle damaged: {_incomplete([path], [])}; write it anew: {_rewrite(path.parent, [path])}")
    folders = sorted(p for p in path.iterdir() if p.is_dir()) if path.is_dir() else []
    found = [p for p in folders if (p / "manifest.json").is_file()]
    cut = [p for p in folders if _unfinished(p)]
    never = [path / n for n in read_pending(path) if not (path / n / "manifest.json").is_file() and path / n not in cut]
    if cut or never:
        raise ValueError(
            f"bundle damaged: the golden folder {path} is incomplete: {_incomplete(cut, never)}; the rest was not "
            f"verified. Write them anew: {_rewrite(path, cut + never)}"
        )
    if not found:
        raise FileNotFoundError(f"no golden bundle at {path} (run: python -m dflash_ref golden --out {path})")
    return [load_bundle(p) for p in found]


def _unfinished(folder: Path) -> bool:
    """A folder golden began to write as a bundle (BUNDLE_PARTS) and left without its manifest."""
    return not (folder / "manifest.json").is_file() and any((folder / part).exists() for part in BUNDLE_PARTS)


def _incomplete(cut: list[Path], never: list[Path]) -> str:
    said = []
    if cut:
        said.append(f"{', '.join(p.name for p in cut)} without manifest.json (golden writes it last: cut short)")
    if never:
        said.append(f"{', '.join(p.name for p in never)} never written (asked for by a golden run, {PENDING})")
    return "; ".join(said)


def _rewrite(folder: Path, bundles: list[Path]) -> str:
    """The golden command that writes these bundles (NN_name) again into `folder`."""
    names = [p.name.split("_", 1)[1] if p.name[:2].isdigit() and "_" in p.name else p.name for p in bundles]
    return f"python -m dflash_ref golden --out {folder} --only {' '.join(names)}"


def read_pending(folder: Path) -> list[str]:
    """The bundle folders (NN_name) a golden run into `folder` was asked for and has not finished (PENDING), []
    where it has none. A file that is no such list is said (ValueError): it cannot tell what is missing."""
    file = Path(folder) / PENDING
    if not file.is_file():
        return []
    try:
        listed = json.loads(file.read_text(encoding="utf-8")).get("bundles")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ValueError(f"bundle damaged: {file} is not golden's list of the bundles it was asked for: {e}") from None
    if not isinstance(listed, list) or not all(isinstance(n, str) and n and "/" not in n for n in listed):
        raise ValueError(f"bundle damaged: {file} is not golden's list of the bundles it was asked for")
    return listed


def write_pending(folder: Path, names: list[str]) -> None:
    """PENDING in `folder` listing `names`, written whole (a temporary file renamed), or removed where none."""
    file = Path(folder) / PENDING
    if not names:
        file.unlink(missing_ok=True)
        return
    text = json.dumps(
        {
            "bundles": names,
            "meaning": "bundles a golden run into this folder was asked for and has not finished writing; removed "
            "once every one has its manifest. verify refuses the folder while one is missing",
        },
        indent=1,
    )
    _write_whole(file, text + "\n")


def _write_whole(file: Path, text: str) -> None:
    """`text` at `file`, whole or not at all: a process cut short leaves the old file, never half of the new."""
    partial = file.with_name(file.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, file)


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
    _write_whole(path / "manifest.json", json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")  # last: whole
