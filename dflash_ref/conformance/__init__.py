"""Conformance kit: golden bundles of every DFlash stage, and `verify`, which names the first stage
where an implementation (a PyTorch adapter, or a dump from any framework) departs from DFlash.

    bundle    the on-disk format, read and written with numpy alone
    tensorfile  safetensors and .npz with numpy alone
    verify    the stage-by-stage comparison and its report (numpy alone)
    adapters  run the reference or the official dflash 0.1.0 on a bundle (torch)
    golden    the scenarios, and writing their bundles from the reference (torch)

Importing this package (or bundle / verify) does not import torch.
"""

from .bundle import SHIPPED, Bundle, find_bundles, key_for, load_bundle
from .report import Check, Report
from .tensorfile import read_arrays, read_safetensors
from .verify import compare, verify, verify_dump

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
