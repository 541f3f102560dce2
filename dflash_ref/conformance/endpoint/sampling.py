"""Sampled decoding checked from outside (`verify --sampling --endpoint URL`): the sampling bundle's prompt sent once
per seed at its temperature (the request's `seed`, no top-k, top-p or min-p), and the outputs tested against the
bundle's exact distribution as `verify --sampling` tests an in-process sampler (sampling.judge_sampling).

The server must serve the sampling bundle's target and draft (`golden --engines` writes `engine_sampling`; start the
server on its folders). The first step's τ is tested where the server tells it per request: llama-server's totals
of a request of max_new_tokens = 2 + γ do (engines/llamacpp_server.first_step_tau); a server that counts only in
aggregate (vLLM's counters) is tested on its outputs alone, as the result says.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..ports.engines.llamacpp_server import first_step_tau
from .client import Endpoint, EndpointError

IN_FLIGHT = 4  # requests at once: a server batches them as it batches any users'


class EndpointSampler:
    """sampling.judge_sampling's sampler: `many(seeds)` → per seed (prompt + output ids, first-step τ or None)."""

    def __init__(self, endpoint: Endpoint, bundle) -> None:
        self.endpoint, self.bundle = endpoint, bundle
        self.note = ""

    def many(self, seeds) -> list[tuple[list[int], int | None]]:
        s = self.bundle.manifest["sampling"]
        proposals = self.bundle.config("draft")["block_size"] - 1
        told = s["max_new_tokens"] == proposals + 2

        def one(seed: int):
            return self.endpoint.complete(s["input_ids"], s["max_new_tokens"], None, s["temperature"], seed)

        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            completions = list(pool.map(one, seeds))
        out = []
        for c in completions:
            if c.output_ids is None:
                raise EndpointError(f"{self.endpoint.url} returns no token ids: its samples cannot be counted")
            per_request = c.reported_by == "timings"  # llama-server's totals tell it; nothing else's does here
            tau = first_step_tau(c.drafted or 0, c.accepted, proposals, told) if per_request else None
            out.append((list(s["input_ids"]) + c.output_ids, tau))
        if all(t is None for _, t in out):
            self.note = f"{self.endpoint.engine} reports no first-step τ per request: its outputs alone are tested"
        return out
