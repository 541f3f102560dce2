"""Tensor files with numpy alone (never torch), for the conformance kit: safetensors read and written
(an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}, then raw
little-endian bytes; BF16 comes back as float32, exactly), and a port's dump as .safetensors or .npz.
A file that cannot be read is a ValueError naming it."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np

_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as a numpy array (BF16 → float32, exact); a file that is not
    one (cut short, another format) is a ValueError naming it."""
    data = Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    try:
        if len(data) < 8 or 8 + n > len(data):
            raise ValueError(f"its header of {n} bytes does not fit in its {len(data)} bytes")
        header = json.loads(data[8 : 8 + n])
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        header.pop("__metadata__", None)
        body, out = data[8 + n :], {}
        for name, info in header.items():
            start, end = info["data_offsets"]
            if not 0 <= start <= end <= len(body):
                raise ValueError(f"tensor {name!r} lies at bytes {start}…{end} of a body of {len(body)}")
            raw = body[start:end]
            if info["dtype"] == "BF16":  # the top 16 bits of a float32
                array = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif info["dtype"] in _DTYPES:
                array = np.frombuffer(raw, _DTYPES[info["dtype"]])
            else:
                raise ValueError(f"tensor {name!r} has dtype {info['dtype']}, which this reader does not know")
            out[name] = array.reshape(tuple(info["shape"])).copy()
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not a readable safetensors file: {e}") from None
    return out


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    """Write numpy arrays as safetensors, deterministically (names sorted, no metadata)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        array = np.ascontiguousarray(array).reshape(array.shape)  # keeps 0-d arrays 0-d
        if array.dtype not in _NAMES:
            raise ValueError(f"cannot store {name!r} of dtype {array.dtype}")
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": _NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    Path(path).write_bytes(len(text).to_bytes(8, "little") + text + b"".join(chunks))


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """A dump from a port: .safetensors (any writer) or .npz (numpy.savez), keys as in the manifest."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no dump file {path}")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as f:
                return {k: f[k] for k in f.files}
        except (OSError, ValueError, zipfile.BadZipFile) as e:
            raise ValueError(f"{path} is not a readable .npz file: {e}") from None
    return read_safetensors(path)


def as_array(value) -> np.ndarray:
    """numpy arrays, lists, numbers, and (without importing torch) CPU-able torch tensors."""
    if hasattr(value, "detach"):  # a torch tensor: bf16 has no numpy twin, go through float32
        value = value.detach().cpu()
        value = value.float() if value.is_floating_point() else value
        return value.numpy()
    return np.asarray(value)


def array_or_none(value) -> np.ndarray | None:
    """as_array, or None for what is no array of numbers at all (ragged lists, objects)."""
    try:
        return as_array(value)
    except (TypeError, ValueError):
        return None
