"""Instrumenting a port from inside its own loop: `record(stage, array, step=, layer=)` where the
port has the tensor, then `save` the dump that `verify --dump` reads. Numpy only: a port in JAX, MLX,
llama.cpp's Python bindings or PyTorch hands over whatever `numpy.asarray` takes (a torch tensor too).

    from dflash_ref.conformance.record import Recorder

    rec = Recorder()
    for bundle in find_bundles("golden/"):
        with rec.bundle(bundle.name):
            ... my_port.generate(...)                   # and inside it, where the values are:
            rec.record("draft_tokens", proposals, step=s)
            rec.record("q", q_after_norm, step=s, layer=i)          # (H_q, L_q, d_h), batch dropped
            rec.record("output_ids", ids)
    rec.save("my_port.npz")                               # then: verify --dump my_port.npz --bundle golden/

Start with the outputs (`output_ids`, and per step `draft_tokens`, `posterior`, `acceptance_length`,
`bonus`) and `verify --allow-missing`; add stages along the data's walk until nothing is missing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .stages import CACHED_PREFIX, LAYER_STAGES, PREFILL_STAGES, STAGE_INDEX, TARGET_LAYER_STAGES, key_for
from .tensorfile import as_array, write_safetensors


class Recorder:
    """Collects `{bundle}/{key}` → array; `bundle(name)` scopes the records that follow."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self._bundle: str | None = None

    @contextlib.contextmanager
    def bundle(self, name: str) -> Iterator[Recorder]:
        previous, self._bundle = self._bundle, name
        try:
            yield self
        finally:
            self._bundle = previous

    def record(self, stage: str, value, step: int | None = None, layer: int | None = None) -> str:
        """Keep one tensor under the manifest's key for (stage, step, layer); → the key."""
        if self._bundle is None:
            raise ValueError("record(...) outside `with recorder.bundle(name):`: which bundle is it for?")
        if stage not in STAGE_INDEX:
            raise ValueError(f"unknown stage {stage!r}; stages: {list(STAGE_INDEX)}")
        if (step is None) != (stage in PREFILL_STAGES or stage == "output_ids"):
            raise ValueError(f"stage {stage!r} " + ("is per step: give step=" if step is None else "has no step"))
        per_layer = "draft" if stage in LAYER_STAGES else "target" if stage in TARGET_LAYER_STAGES else None
        if (layer is None) == (per_layer is not None):
            raise ValueError(
                f"stage {stage!r} " + (f"is per {per_layer} layer: give layer=" if layer is None else "has no layer")
            )
        key = key_for(stage, step, layer)
        self.arrays[f"{self._bundle}/{key}"] = as_array(value)
        return key

    def served(self, cached_prefix: int) -> str:
        """How a serving port served this bundle's request, where that changes what it computed: `cached_prefix`,
        how many leading prompt positions it restored from a prefix cache instead of computing (stages.py)."""
        if self._bundle is None:
            raise ValueError("served(...) outside `with recorder.bundle(name):`: which bundle is it for?")
        self.arrays[f"{self._bundle}/{CACHED_PREFIX}"] = np.array(int(cached_prefix), dtype=np.int64)
        return CACHED_PREFIX

    def save(self, path: str | Path) -> Path:
        """A .npz or .safetensors dump of everything recorded."""
        path = Path(path) if Path(path).suffix in (".npz", ".safetensors") else Path(f"{path}.npz")
        if path.suffix == ".safetensors":
            write_safetensors(path, self.arrays)
        else:
            np.savez(path, **self.arrays)
        return path
