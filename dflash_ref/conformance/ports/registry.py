"""The shipped ports, by name, and how `verify --impl` finds a port of your own."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from .. import crash
from .engines.llamacpp import LlamaCppPort
from .engines.llamacpp_server import LlamaServerPort
from .engines.vllm import VLLMBatchPort, VLLMPort, VLLMServePort
from .official import ZLabAdapter
from .official_mlx import MLXAdapter
from .pypi.dflash_mlx import DFlashMLXPort
from .pypi.mlx_dspark import MLXDSparkPort
from .pypi.speculators import SpeculatorsPort
from .reference import ReferenceAdapter
from .transformers_port import TransformersPort

ADAPTERS = {
    "reference": ReferenceAdapter,
    "zlab": ZLabAdapter,
    "mlx": MLXAdapter,
    "transformers": TransformersPort,
    "dflash-mlx": DFlashMLXPort,
    "mlx-dspark": MLXDSparkPort,
    "speculators": SpeculatorsPort,
    "vllm": VLLMPort,
    "vllm-batch": VLLMBatchPort,
    "vllm-serve": VLLMServePort,
    "llamacpp": LlamaCppPort,
    "llama-server": LlamaServerPort,
}


# where the shipped ports' modules were before the ports' wing (conformance/ports/): a factory named by its old
# module is refused in one line that names the new one
MOVED = {
    "dflash_ref.conformance.adapters": "dflash_ref.conformance.ports.reference",
    "dflash_ref.conformance.official": "dflash_ref.conformance.ports.official",
    "dflash_ref.conformance.official_mlx": "dflash_ref.conformance.ports.official_mlx",
    "dflash_ref.conformance.transformers_port": "dflash_ref.conformance.ports.transformers_port",
    "dflash_ref.conformance.pypi.dflash_mlx": "dflash_ref.conformance.ports.pypi.dflash_mlx",
    "dflash_ref.conformance.pypi.mlx_dspark": "dflash_ref.conformance.ports.pypi.mlx_dspark",
    "dflash_ref.conformance.pypi.speculators": "dflash_ref.conformance.ports.pypi.speculators",
    "dflash_ref.conformance.engines.vllm": "dflash_ref.conformance.ports.engines.vllm",
    "dflash_ref.conformance.engines.llamacpp": "dflash_ref.conformance.ports.engines.llamacpp",
    "dflash_ref.conformance.engines.llamacpp_server": "dflash_ref.conformance.ports.engines.llamacpp_server",
}


def resolve(spec: str):
    """A name of ADAPTERS ("reference", "zlab", "mlx", "transformers", "dflash-mlx", "mlx-dspark", "speculators",
    "vllm", "vllm-batch", "vllm-serve", "llamacpp", "llama-server") or
    "package.module:factory" or "path/to/file.py:factory" (factory() returns an adapter or a run function)."""
    if spec in ADAPTERS:
        return ADAPTERS[spec]()
    if ":" not in spec:
        raise ValueError(f"unknown implementation {spec!r}: use one of {sorted(ADAPTERS)} or module:factory")
    module, _, attr = spec.rpartition(":")
    if module in MOVED:
        raise ValueError(f"implementation {spec!r}: that module is now {MOVED[module]} (use {MOVED[module]}:{attr})")
    try:
        factory = getattr(_module(module), attr)
    except (ImportError, AttributeError, OSError) as e:
        raise ValueError(f"implementation {spec!r}: no factory {attr!r} in module {module!r} ({e})") from None
    try:
        return factory()
    except Exception as e:  # noqa: BLE001 - the user's factory: said in one line, where it raised
        raise ValueError(f"implementation {spec!r}: its factory {attr}() raised {crash.where(e)}") from None


def _module(name: str):
    """A module by its import name, or a Python file by its path (an adapter beside the port, not on sys.path)."""
    if not name.endswith(".py"):
        return importlib.import_module(name)
    path = Path(name).resolve()
    if not path.is_file():
        raise ImportError(f"no file {name}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # its own imports of itself (and pickling) find it
    spec.loader.exec_module(module)
    return module
