"""Each request's own tensors out of an engine's batched, cached and chunked steps (numpy only): what turns a
serving engine's draft passes, read as the engine computed them, into one reference-keyed run per request.

A serving engine drafts for every running request in one pass. Its tensors are flat over the batch:

    context rows   the new target features of every request, one after another: request b's rows are
                   [context_start[b], context_start[b + 1]); the last `rejected[b]` of them are positions its
                   verify rejected (an engine may pass them and cut them by length), its valid rows the others
    query rows     L_q per request, in batch order: request b's are [b·L_q, (b + 1)·L_q); its draft logits
                   are L_q − 1 rows each
    the paged cache  what request b's queries attend: positions 0 … seq_len[b] − 1 of its block table, each in
                   block table[b][p // block], row p % block (read from the engine's cache after the pass)

A request's reference step s is the s-th of its draft passes whose proposals were verified. Passes that were
never verified (a prefill's earlier chunks, whose proposals an engine discards) only add context rows: the
step after them takes all context rows since the previous verified pass. After a prefix-cache hit the first
context row is past position 0: the positions the engine says it restored (vLLM's num_cached_tokens), not
computed by this request.
"""

from __future__ import annotations

import numpy as np

# per pass, what is flat over the context rows, over the query rows, and over the draft logits' rows
CONTEXT = ("target_hidden", "fc")
CONTEXT_PER_LAYER = ("k_ctx",)  # (layers, rows, H_kv, d_h)
QUERY = ("noise_embedding", "final_hidden")
QUERY_PER_LAYER = ("q", "k_noise", "q_rot", "attn_out", "layer_out")  # K after RoPE and V: from the paged cache


def split_pass(batch: dict, layers: int, query_len: int) -> dict[str, dict]:
    """One batched draft pass → {request id: its part}: context rows (valid ones only) with their positions,
    query rows, its draft logits and proposals, and the K and V its queries attended (from the cache reads
    `attended_k.{i}` / `attended_v.{i}`: one array per request, in batch order)."""
    starts, rejected = np.asarray(batch["context_start"]), np.asarray(batch["rejected"])
    parts = {}
    for b, request in enumerate(batch["req_ids"]):
        lo = int(starts[b])
        valid = int(starts[b + 1]) - lo - int(rejected[b])
        rows, block = slice(lo, lo + valid), slice(b * query_len, (b + 1) * query_len)
        part = {"positions": np.asarray(batch["context_positions"])[rows], "seq": batch["seq"]}
        part.update({k: batch[k][rows] for k in CONTEXT})
        part.update({k: batch[k][:, rows] for k in CONTEXT_PER_LAYER})
        part.update({k: batch[k][block] for k in QUERY})
        for i in range(layers):
            part.update({f"{k}.{i}": batch[f"{k}.{i}"][block] for k in QUERY_PER_LAYER})
            if f"attended_k.{i}" in batch:  # read from the paged cache, where its layout is known
                part[f"attended_k.{i}"], part[f"attended_v.{i}"] = (
                    batch[f"attended_k.{i}"][b],
                    batch[f"attended_v.{i}"][b],
                )
        part["logits"] = batch["logits"][b * (query_len - 1) : (b + 1) * (query_len - 1)]
        part["draft_tokens"] = np.asarray(batch["draft_tokens"])[b]
        parts[request] = part
    return parts


def request_steps(parts: list[dict], verifies: list[dict]) -> list[dict]:
    """A request's passes (its parts, in time order: `seq`) and its verifies (in time order, each with the
    `seq` it ran at) → one pass per verify, as the reference's steps: the last pass before that verify, with
    the context rows of every pass since the previous verified one. A verify whose proposals are not that
    pass's is a mapping error, raised: never a wrong step compared."""
    steps, used = [], -1
    for verify in verifies:
        before = [i for i, p in enumerate(parts) if p["seq"] < verify["seq"]]
        if not before or before[-1] <= used:
            raise ValueError(f"a verify at {verify['seq']} has no draft pass of its request before it")
        last = before[-1]
        step = dict(parts[last])
        chunks = parts[used + 1 : last + 1]
        for k in ("positions", *CONTEXT):
            step[k] = np.concatenate([p[k] for p in chunks])
        for k in CONTEXT_PER_LAYER:
            step[k] = np.concatenate([p[k] for p in chunks], axis=1)
        if not np.array_equal(np.asarray(verify["draft"]), np.asarray(step["draft_tokens"])[: len(verify["draft"])]):
            raise ValueError(
                f"the verify at {verify['seq']} checked {list(verify['draft'])}, its request's pass before it "
                f"proposed {list(step['draft_tokens'])}: the passes are not mapped to their requests"
            )
        steps.append(step)
        used = last
    return steps


def attended(cache: np.ndarray, table: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V of positions 0 … length − 1 from one layer's paged cache, as the engine's attention reads them.
    `cache` as vLLM's CPU attention shapes it, (blocks, H_kv, block, 2·d_h), whose memory holds per block and KV
    head the block's K transposed, (d_h, block), then its V, (block, d_h) (as its cache-writing kernel lays them
    out: read off the memory, where each K and V row of a pass landed); `table` the request's block table →
    two (length, H_kv, d_h) arrays."""
    blocks_, heads, block, twice = cache.shape
    d_h = twice // 2
    flat = cache.reshape(blocks_, heads, block * twice)  # (blocks, H_kv, 2·block·d_h): the memory per head
    k = flat[..., : block * d_h].reshape(blocks_, heads, d_h, block)  # (blocks, H_kv, d_h, block)
    v = flat[..., block * d_h :].reshape(blocks_, heads, block, d_h)  # (blocks, H_kv, block, d_h)
    positions = np.arange(length)
    blocks, rows = np.asarray(table)[positions // block], positions % block
    return k[blocks, :, :, rows], v[blocks, :, rows, :]  # (length, H_kv, d_h) each: the advanced axes first


def arrives(serving: dict | None, produced: dict[str, int], finished: set[str]) -> bool:
    """Whether a request may be added now (engine_scenarios.SERVING_MEANING): `serving` its bundle's entry (None:
    a bundle alone, at once), `produced` the output tokens so far of each request added, `finished` those done.
    A request due mid-decode whose predecessor finished first raises: its condition was not exercised."""
    arrive = (serving or {}).get("arrive")
    if not arrive:
        return True
    if arrive.get("done"):
        return arrive["after"] in finished
    if produced.get(arrive["after"], -1) < arrive["tokens"]:
        return False
    if arrive["after"] in finished:
        raise RuntimeError(
            f"request {serving.get('request')} was due while {arrive['after']} decoded, after its token "
            f"{arrive['tokens']}, but {arrive['after']} had finished: the condition was not exercised"
        )
    return True


def scenario_group(bundle, find) -> list:
    """The bundles of `bundle`'s serving scenario in their order (`find`: bundle.find_bundles), or [bundle] alone."""
    served = bundle.manifest.get("serving")
    if not served:
        return [bundle]
    mine = [
        b for b in find(bundle.path.parent) if (b.manifest.get("serving") or {}).get("scenario") == served["scenario"]
    ]
    return sorted(mine, key=lambda b: b.manifest["serving"]["order"])
