"""Conformance kit: golden bundles of every DFlash stage, and `verify`, which names the first stage
where an implementation (a PyTorch adapter, or a dump from any framework) departs from DFlash.

    bundle    the on-disk format, read and written with numpy alone
    tensorfile  safetensors and .npz with numpy alone
    judge     the stage-by-stage comparison (numpy alone)
    verify    the runner: a port run on the bundles, or a dump read, and judged
    port      the Port contract every adapter subclasses (numpy alone)
    adapters  the reference as a port (torch)
    golden    the scenarios, and writing their bundles from the reference (torch)

Importing this package (or bundle / verify) does not import torch.
"""

from .bundle import SHIPPED, Bundle, find_bundles, load_bundle
from .judge import compare
from .report import Check, Report
from .stages import key_for
from .tensorfile import read_arrays, read_safetensors
from .verify import verify, verify_dump

__all__ = [
    "SHIPPED",
    "Bundle",
    "Check",
    "Report",
    "compare",
    "find_bundles",
    "key_for",
    "load_bundle",
    "read_arrays",
    "read_safetensors",
    "verify",
    "verify_dump",
]
