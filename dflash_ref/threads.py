"""One intra-op thread for tiny models: their matrices are too small for torch's threads to pay for themselves,
and on a busy machine the threads' overhead dominates. Used by the conformance ports (bundles hold tiny models),
the hybrid-rollback benchmark and the tests."""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_thread():
    """torch's intra-op threads set to one inside the block, and back to what they were after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
