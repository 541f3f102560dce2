"""Serving engines without the engines: each request's tensors out of batched, cached and chunked steps
(engines/serving.py, vllm_run.record_request), what the report says of a served request (its condition and
request; positions restored from a prefix cache; a server's own acceptance count), and llama-server driven
over HTTP (a stand-in server on the loopback speaking its protocol). Each mapping is checked by laying a
bundle's own expected tensors out as vLLM does (flat over a batch, with rejected rows, chunks, a prefix hit,
the paged cache's layout) and reading them back; readers that read the layout wrong must fail."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
import types

import numpy as np
import pytest

from dflash_ref.conformance.bundle import find_bundles
from dflash_ref.conformance.golden import generate_golden
from dflash_ref.conformance.judge import compare
from dflash_ref.conformance.ports.engines import llamacpp_server, serving, vllm, vllm_run
from dflash_ref.conformance.record import Recorder
from dflash_ref.conformance.report import NotApplicable, Report
from dflash_ref.conformance.stages import DRAFT_ACCEPTED

pytestmark = pytest.mark.usefixtures("one_thread_module")
OFFSET = 100.0  # the second request's floats: the first's + OFFSET, so that rows read from the wrong request show


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The tiny multi-round bundle (2 draft layers, 4 query and 2 KV heads, a prompt of 4): the readers are
    shape-blind."""
    out = tmp_path_factory.mktemp("golden")
    generate_golden(out, ["multiround"])
    return find_bundles(out)[0]


def _request(bundle, offset: float = 0.0) -> list[dict]:
    """The bundle's steps as one request's parts in vLLM's layouts (context rows, query rows, the K and V its
    queries attend in position order), every float + offset; each step's verify beside it."""
    e, layers = bundle.expected, bundle.config("draft")["num_hidden_layers"]
    steps, start = [], 0
    context_v: list[list[np.ndarray]] = [[] for _ in range(layers)]  # per layer: context V, position order
    for s in range(sum(k.endswith("/acceptance_length") for k in e)):
        p = f"step{s}/"
        rows = e[p + "draft.hook_target_hidden"].shape[0]
        n_q = e[p + "draft.hook_noise_embedding"].shape[0]
        part = {"positions": np.arange(start, start + rows), "target_hidden": e[p + "draft.hook_target_hidden"],
                "fc": e[p + "draft.context.hook_fc"], "noise_embedding": e[p + "draft.hook_noise_embedding"],
                "final_hidden": e[p + "draft.hook_out"], "logits": e[p + "draft.hook_logits"],
                "draft_tokens": e[p + "draft_tokens"]}  # fmt: skip
        k_ctx, v_ctx = [], []
        for i in range(layers):
            a = f"{p}draft.layers.{i}.self_attn."
            k_rot, v = e[a + "hook_k_rot"], e[a + "hook_v"]  # (H_kv, start + L_q, d_h), (H_kv, L_c + L_q, d_h)
            context_v[i].append(v[:, :rows])
            k_ctx.append(e[a + "hook_k_ctx"].transpose(1, 0, 2))  # (L_c, H_kv, d_h)
            v_ctx.append(v[:, :rows].transpose(1, 0, 2))
            flat = lambda x: x.transpose(1, 0, 2).reshape(x.shape[1], -1)  # noqa: E731 (H, L, d) → (L, H·d)
            attended_v = np.concatenate([*context_v[i], v[:, -n_q:]], axis=1)  # every position's V, in order
            part |= {f"q.{i}": e[a + "hook_q"].transpose(1, 0, 2),
                     f"k_noise.{i}": e[a + "hook_k_noise"].transpose(1, 0, 2),
                     f"q_rot.{i}": flat(e[a + "hook_q_rot"]), f"k_rot_noise.{i}": flat(k_rot[:, -n_q:]),
                     f"v_noise.{i}": flat(v[:, -n_q:]), f"attn_out.{i}": e[a + "hook_out"],
                     f"layer_out.{i}": e[f"{p}draft.layers.{i}.hook_resid_post"],
                     f"attended_k.{i}": k_rot.transpose(1, 0, 2),
                     f"attended_v.{i}": attended_v.transpose(1, 0, 2)}  # fmt: skip
        part |= {"k_ctx": np.stack(k_ctx), "v_ctx": np.stack(v_ctx)}
        part = {k: (x + offset if k not in ("positions", "draft_tokens") else x) for k, x in part.items()}
        verify = {"draft": e[p + "draft_tokens"], "posterior": e[p + "posterior"],
                  "target_logits": e[p + "target_logits"] + offset, "tau": int(e[p + "acceptance_length"]),
                  "bonus": int(e[p + "bonus"])}  # fmt: skip
        steps.append((part, verify))
        start += rows
    return steps


def _served(bundle, junk: np.random.Generator, cached: int = 2) -> tuple[list[dict], dict]:
    """Two requests as vLLM's engine steps batch them: "a" (the bundle) joins at engine step 1 with its first
    `cached` prompt positions restored from a prefix cache; "b" (the bundle + OFFSET) starts at step 0 with its
    prefill in two chunks, the first chunk's pass never verified. Each pass holds the batch flat: context rows
    with each verify's rejected rows (junk) after the valid ones, L_q query rows and L_q − 1 logit rows per
    request. → (the passes, each request's verifies with the pass count they followed)."""
    layers = bundle.config("draft")["num_hidden_layers"]
    a, b = _request(bundle), _request(bundle, OFFSET)
    a[0][0]["positions"] = a[0][0]["positions"][cached:]
    a[0][0].update({k: a[0][0][k][cached:] for k in ("target_hidden", "fc")})
    a[0][0].update({k: a[0][0][k][:, cached:] for k in ("k_ctx", "v_ctx")})
    first, _ = b[0]
    chunk = {**first, "draft_tokens": junk.integers(0, 6, size=first["draft_tokens"].shape)}  # never verified
    chunk |= {k: first[k][:2] for k in ("positions", "target_hidden", "fc")}
    chunk |= {k: first[k][:, :2] for k in ("k_ctx", "v_ctx")}
    b[0] = ({**first, **{k: first[k][2:] for k in ("positions", "target_hidden", "fc")},
             **{k: first[k][:, 2:] for k in ("k_ctx", "v_ctx")}}, b[0][1])  # fmt: skip
    timeline = {"b": [(chunk, None), *b], "a": [(None, None), *a]}  # per engine step: (part, verify) or nothing
    passes, verifies = [], {"a": [], "b": []}
    for t in range(max(len(v) for v in timeline.values())):
        present = [(r, timeline[r][t]) for r in ("b", "a") if t < len(timeline[r]) and timeline[r][t][0] is not None]
        batch = {"req_ids": [r for r, _ in present], "seq": 2 * t, "rejected": [], "context_start": [0]}
        rows = {k: [] for k in ("positions", *serving.CONTEXT)}
        per_layer = {k: [] for k in serving.CONTEXT_PER_LAYER}
        for request, (part, _) in present:
            prior = verifies[request][-1][1] if verifies[request] else None
            rejected = 0 if prior is None else len(prior["posterior"]) - prior["tau"] - 1
            for k in rows:
                rows[k].append(np.concatenate([part[k], junk.normal(size=(rejected, *part[k].shape[1:]))]))
            for k in per_layer:
                x = part[k]
                per_layer[k].append(np.concatenate([x, junk.normal(size=(x.shape[0], rejected, *x.shape[2:]))], axis=1))
            batch["rejected"].append(rejected)
            batch["context_start"].append(batch["context_start"][-1] + len(part["positions"]) + rejected)
        batch |= {k: np.concatenate(v) for k, v in rows.items()} | {
            k: np.concatenate(v, axis=1) for k, v in per_layer.items()
        }
        batch["context_positions"] = batch.pop("positions")
        for k in (
            "noise_embedding",
            "final_hidden",
            "logits",
            *(f"{q}.{i}" for q in serving.QUERY_PER_LAYER for i in range(layers)),
        ):
            batch[k] = np.concatenate([part[k] for _, (part, _) in present])
        batch["draft_tokens"] = np.stack([part["draft_tokens"] for _, (part, _) in present])
        for i in range(layers):
            batch[f"attended_k.{i}"] = [part[f"attended_k.{i}"] for _, (part, _) in present]
            batch[f"attended_v.{i}"] = [part[f"attended_v.{i}"] for _, (part, _) in present]
        passes.append(batch)
        for request, (_, verify) in present:
            if verify is not None:
                verifies[request].append((2 * t + 1, verify))
    return passes, {r: [{**v, "seq": seq} for seq, v in vs] for r, vs in verifies.items()}


def _read(bundle, passes, verifies) -> dict[str, dict]:
    """What vllm_run.serve makes of them: each request's parts, its steps, its keys (as a dump holds them)."""
    reader = vllm_run.Reader()
    reader.layers, reader.layer_ids = bundle.config("draft")["num_hidden_layers"], bundle.expected["prefill/layer_ids"]
    parts: dict[str, list] = {}
    for batch in passes:
        for request, part in serving.split_pass(batch, reader.layers, 4).items():
            parts.setdefault(request, []).append(part)
    recorder = Recorder()
    for request in ("a", "b"):
        with recorder.bundle(request):
            e = bundle.expected
            vllm_run.record_loop(
                recorder, bundle, e["output_ids"][len(bundle.inputs["input_ids"]) :].tolist(), verifies[request]
            )
            steps = serving.request_steps(parts[request], verifies[request])
            vllm_run.record_request(recorder, bundle, reader, steps, cached=2 if request == "a" else 0)
    out: dict[str, dict] = {"a": {}, "b": {}}
    for name, value in recorder.arrays.items():
        request, _, key = name.partition("/")
        out[request][key] = value
    return out


def _failures(bundle, produced: dict, offset: float = 0.0) -> list[str]:
    shifted = {k: (v - offset if np.issubdtype(np.asarray(v).dtype, np.floating) else v) for k, v in produced.items()}
    checks = compare(bundle, shifted, skip=list(vllm.VLLMPort.skip))
    return [c.line() for c in checks if c.status in ("FAIL", "missing", "error")]


def test_each_requests_tensors_come_out_of_batched_cached_and_chunked_steps(bundle):
    """Request a joins mid-decode after a prefix hit; b's prefill came in two chunks; rejected rows ride along:
    each reads back as the reference's run of it alone, a's restored positions said and left to the keys."""
    passes, verifies = _served(bundle, np.random.default_rng(0))
    produced = _read(bundle, passes, verifies)
    assert _failures(bundle, produced["a"]) == [] and _failures(bundle, produced["b"], OFFSET) == []
    assert int(produced["a"]["served/cached_prefix"]) == 2 and "served/cached_prefix" not in produced["b"]
    report = Report("vllm-serve")
    report.totals = {bundle.name: len(bundle.entries)}
    report.checks = checks = compare(bundle, produced["a"], report, skip=list(vllm.VLLMPort.skip))
    restored = [c for c in checks if c.note.startswith("positions 0–1 restored from the prefix cache")]
    assert {c.stage for c in restored} == {"target_hidden", "fc", "k_ctx"} and all(c.step == 0 for c in restored)
    assert report.cached == {bundle.name: 2}
    assert "served: prompt positions 0–1 restored from the prefix cache" in report.text()


@pytest.mark.parametrize(
    "mutation, named",
    [
        ("rejected rows read as context", "extracted features"),  # a reader that ignores what the verify rejected
        ("requests in the other order", "extracted features"),  # rows given to the other request
        ("the first chunk's rows lost", "extracted features"),  # a prefill's earlier chunk dropped: no prefix hit
        ("a pass given to the wrong step", "mapped"),  # a verify matched to a pass that did not propose its tokens
    ],
)
def test_a_reader_that_reads_the_batch_wrong_fails(bundle, mutation, named):
    passes, verifies = _served(bundle, np.random.default_rng(0))
    if mutation == "rejected rows read as context":
        for batch in passes:
            batch["rejected"] = [0] * len(batch["rejected"])
    elif mutation == "requests in the other order":
        both = next(batch for batch in passes if len(batch["req_ids"]) == 2)
        both["req_ids"] = both["req_ids"][::-1]
    elif mutation == "the first chunk's rows lost":
        passes[0]["rejected"] = [passes[0]["context_start"][1]]  # all of the chunk's rows cut
    else:
        verifies["a"][1]["seq"] = verifies["a"][2]["seq"]
    try:
        produced = _read(bundle, passes, verifies)
    except ValueError as e:  # the mapping refuses: never a wrong step compared
        assert named == "mapped" and ("not mapped to their requests" in str(e) or "no draft pass" in str(e))
        return
    failed = _failures(bundle, produced["a"]) + _failures(bundle, produced["b"], OFFSET)
    assert failed and any(named in line for line in failed), failed[:3]


def test_the_paged_cache_is_read_in_vllms_cpu_layout():
    """Per block and KV head: K transposed (d_h, block), then V (block, d_h), in a tensor shaped (blocks, H_kv,
    block, 2·d_h); a table that maps positions to blocks out of order."""
    rng = np.random.default_rng(0)
    blocks, heads, block, d_h, length = 5, 2, 4, 3, 10
    k, v = rng.normal(size=(length, heads, d_h)), rng.normal(size=(length, heads, d_h))
    table = np.array([3, 0, 4])
    memory = np.zeros((blocks, heads, 2 * block * d_h))
    for p in range(length):
        b, r = table[p // block], p % block
        memory[b, :, r + block * np.arange(d_h)] = k[p].T  # K transposed: (d_h, block), position r in each row
        memory[b, :, block * d_h + r * d_h + np.arange(d_h)] = v[p].T  # V: (block, d_h)
    cache = memory.reshape(blocks, heads, block, 2 * d_h)
    got_k, got_v = serving.attended(cache, table, length)
    assert np.array_equal(got_k, k) and np.array_equal(got_v, v)
    untransposed = memory[..., : block * d_h].reshape(blocks, heads, block, d_h)  # reading K as (block, d_h)
    assert not np.allclose(untransposed[table[0], :, 1], k[1])


def test_arrivals_hold_in_order_of_tokens_and_finishing():
    after_3 = {"request": "r1", "arrive": {"after": "r0", "tokens": 3}}
    after_done = {"request": "r1", "arrive": {"after": "r0", "done": True}}
    assert serving.arrives(None, {}, set()) and serving.arrives({"arrive": None}, {}, set())
    assert not serving.arrives(after_3, {}, set()) and not serving.arrives(after_3, {"r0": 2}, set())
    assert serving.arrives(after_3, {"r0": 3}, set()) and not serving.arrives(after_3, {"r0": 1}, {"r0"})
    assert not serving.arrives(after_done, {"r0": 30}, set()) and serving.arrives(after_done, {"r0": 30}, {"r0"})
    with pytest.raises(RuntimeError, match="r1 was due while r0 decoded, after its token 3, but r0 had finished"):
        serving.arrives(after_3, {"r0": 24}, {"r0"})  # seen only once r0 was done: no arrival mid-decode


def test_a_served_request_is_named_by_its_condition_and_an_engines_low_acceptance_fails(bundle):
    """`where` names scenario · condition · request; a server's count of accepted draft tokens below DFlash's
    (its output still the target's) fails with the hint; Σ τ over the steps but the last, plus 0 to max(τ, the
    tokens committed) at the last (where engines cut the block their own way), passes."""
    import copy

    served = copy.copy(bundle)
    served.manifest = {**bundle.manifest, "serving": {"scenario": "serve_x", "condition": "prefix-cache hit",
                                                      "request": "r1"}}  # fmt: skip
    e = bundle.expected
    taus = [int(e[k]) for k in sorted(k for k in e if k.endswith("/acceptance_length"))]
    skip = [s for s in llamacpp_server.LlamaServerPort.skip]
    base = {"output_ids": e["output_ids"], "prefill/first_token": e["prefill/first_token"]}
    low = sum(taus[:-1])
    last = len(e["output_ids"]) - len(bundle.inputs["input_ids"]) - 1 - low - (len(taus) - 1)  # its tokens
    hints = {}
    for got, status in ((sum(taus), "pass"), (low, "pass"), (low + last, "pass"), (low - 1, "FAIL"),
                        (low + max(last, taus[-1]) + 1, "FAIL")):  # fmt: skip
        checks = compare(served, {**base, DRAFT_ACCEPTED: np.array(got)}, skip=skip)
        counted = next(c for c in checks if c.stage == "draft_accepted")
        assert counted.status == status and counted.where.startswith("serve_x · prefix-cache hit · request r1")
        assert all(c.status != "FAIL" for c in checks if c.stage != "draft_accepted")
        hints[got] = counted.hint
    assert "its draft proposed other tokens than DFlash's" in hints[low - 1]
    assert "the engine counts differently" in hints[low + max(last, taus[-1]) + 1]


class _FakeServer(http.server.BaseHTTPRequestHandler):
    """llama-server's /health and streamed /completion, as it speaks them: each request's tokens the prompt's
    last token repeated (one chunk every 20 ms), then a chunk with its timings; a prompt of [999] is refused."""

    log: list = []  # (tokens streamed so far over all requests, body) per request, as it arrived
    sent = 0

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._send(200, b'{"status":"ok"}', "application/json")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/detokenize":
            return self._send(200, json.dumps({"content": "." if body["tokens"] == [1] else "?"}).encode(), "x")
        type(self).log.append((type(self).sent, body))
        if body["prompt"] == [999]:
            return self._send(400, b'{"error":{"message":"the prompt is refused"}}', "application/json")
        if body["prompt"] == [998]:
            return self._send(500, b'{"error":{"message":"out of memory"}}', "application/json")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(body["n_predict"]):
            self.wfile.write(b"data: " + json.dumps({"tokens": [body["prompt"][-1]]}).encode() + b"\n\n")
            self.wfile.flush()
            type(self).sent += 1
            time.sleep(0.02)
        timings = {} if body["prompt"] == [997] else {"draft_n_accepted": 2, "cache_n": 3}
        if "seed" in body:  # a sampled request: an odd seed drafts once more (the first step's τ was 0), 1 token
            timings.update(draft_n=2 + body["seed"] % 2, draft_n_accepted=2 - body["seed"] % 2)
            if body["seed"] == 99:  # a first draft shortened
                timings.update(draft_n=1, draft_n_accepted=1)
        final = {"tokens": [], "stop": True, "timings": timings}
        self.wfile.write(b"data: " + json.dumps(final).encode() + b"\n\n")

    def _send(self, code: int, data: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Bundle:
    def __init__(self, name, prompt, arrive=None, order=0):
        self.name = name
        self.inputs = {"input_ids": prompt, "max_new_tokens": 5, "stop_token_ids": [1]}
        serving_entry = {"scenario": "s", "request": name, "order": order, "arrive": arrive}
        self.manifest = {"serving": serving_entry, "tokenizer": {"tokens": ["<a>", "."]}}


def test_llama_server_is_driven_over_http_with_arrivals_and_its_refusal_said():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        first, second = _Bundle("r0", [4, 5]), _Bundle("r1", [6], {"after": "r0", "tokens": 3}, 1)
        out = llamacpp_server.serve(port, [first, second], prefix_cache=True)
        assert out["r0"]["output_ids"].tolist() == [4, 5] + [5] * 5 and out["r1"]["output_ids"].tolist() == [6] * 6
        assert int(out["r1"][DRAFT_ACCEPTED]) == 2 and int(out["r1"]["served/cached_prefix"]) == 3
        (_, b0), (sent, b1) = _FakeServer.log[:2]
        assert 3 <= sent < 5 and b0["cache_prompt"] and b0["stop"] == ["."] and b1["prompt"] == [6]  # r0 decoding
        failed = llamacpp_server.serve(
            port, [_Bundle("r0", [999]), _Bundle("r1", [998]), _Bundle("r2", [997]), _Bundle("r3", [3])], False
        )
        assert isinstance(failed["r0"], NotApplicable) and "refuses this request" in str(failed["r0"])
        assert "the prompt is refused" in str(failed["r0"])  # in its words; one request's refusal is its own
        assert isinstance(failed["r1"], RuntimeError) and "failed on r1: HTTPError: HTTP Error 500" in str(failed["r1"])
        assert isinstance(failed["r2"], RuntimeError) and "no draft_n_accepted" in str(failed["r2"])
        assert failed["r3"]["output_ids"].tolist() == [3] * 6
    finally:
        server.shutdown()


def test_a_server_that_cannot_start_or_answer_is_one_clear_error(tmp_path, monkeypatch):
    fails = tmp_path / "llama-server"
    fails.write_text("#!/bin/sh\necho 'error: failed to load model target.gguf' >&2\nexit 1\n")
    fails.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"exited \(code 1\) before serving: error: failed to load model"):
        with llamacpp_server.running_server(fails, [], llamacpp_server.free_port(), tmp_path / "log"):
            pass
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexec sleep 30\n")
    silent.chmod(0o755)
    monkeypatch.setattr(llamacpp_server, "START_TIMEOUT", 1)
    with pytest.raises(RuntimeError, match=r"did not answer http://127.0.0.1:\d+/health in 1 s"):
        with llamacpp_server.running_server(silent, [], llamacpp_server.free_port(), tmp_path / "log"):
            pass


def test_the_matrix_gives_each_port_a_column_per_serving_condition():
    from dflash_ref.conformance.matrix import conditions

    rows = {
        "vllm-serve": [{"bundle": "a.r0", "verdict": "fail"}, {"bundle": "a.r1", "verdict": "pass"},
                       {"bundle": "b.r0", "verdict": "pass"}, {"bundle": "plain", "verdict": "n/a"}],
        "llama-server": [{"bundle": "a.r0", "verdict": "pass"}, {"bundle": "a.r1", "verdict": "n/a"},
                         {"bundle": "b.r0", "verdict": "crash"}, {"bundle": "plain", "verdict": "pass"}],
    }  # fmt: skip
    lines = conditions(rows, {"a.r0": "prefix-cache hit", "a.r1": "prefix-cache hit", "b.r0": "chunked prefill"})
    assert "| port | one sequence | prefix-cache hit | chunked prefill |" in lines
    assert "| vllm-serve | n/a | fail (1 of 2) | pass |" in lines
    assert "| llama-server | pass | pass (1 of 2; the rest n/a) | crash (1 of 1) |" in lines


class _SamplingBundle:
    name = "engine_sampling"
    inputs = {"input_ids": [4]}
    manifest = {"sampling": {"input_ids": [4], "max_new_tokens": 4, "temperature": 1.5}}
    target_dir = draft_dir = None  # the stand-in server below loads no folder

    def config(self, which):
        return {"block_size": 3}


def test_llama_servers_sampler_seeds_each_request_and_reads_the_first_steps_tau_off_its_totals(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    @contextlib.contextmanager
    def stand_in(target_dir, draft_dir, slots, per_slot, batch=None):
        yield server.server_address[1], types.SimpleNamespace(poll=lambda: None), None

    monkeypatch.setattr(llamacpp_server, "server", stand_in)
    port = llamacpp_server.LlamaServerPort()
    try:
        _FakeServer.log.clear()
        out = port.sampler(_SamplingBundle(), "match").many(range(4))
        bodies = sorted((b for _, b in _FakeServer.log), key=lambda b: b["seed"])
        assert [b["seed"] for b in bodies] == [0, 1, 2, 3] and all(b["n_predict"] == 4 for b in bodies)
        assert all((b["temperature"], b["top_k"], b["top_p"], b["min_p"]) == (1.5, 0, 1.0, 0.0) for b in bodies)
        # 2 proposals drafted in all: the first step's τ is the count (2); once more: the first step kept none
        assert [tau for _, tau in out] == [2, 0, 2, 0] and out[0][0] == [4, 4, 4, 4, 4]
        assert all(b["ignore_eos"] and not b["cache_prompt"] for b in bodies)
        with pytest.raises(RuntimeError, match="drafted 1 tokens for a request, fewer than 2"):
            port.sampler(_SamplingBundle(), "match").many([99])
    finally:
        server.shutdown()
    with pytest.raises(ValueError, match="verify --sampling --verifier match"):
        port.sampler(_SamplingBundle(), "rejection")


def test_vllms_sampler_names_the_temperatures_it_divided_by():
    assert vllm.temperature_note(np.array([1.5, 1.5], dtype=np.float32), 1.5) == ""
    note = vllm.temperature_note(np.array([1.5, 4.6e-41, 6.7e17], dtype=np.float32), 1.5)
    assert "2 of 3 verified rows" in note and "4.6e-41" in note and "reports/vllm-cpu-sampling-temperature.md" in note


def test_the_matrix_checks_each_sampling_port_by_its_distributions_and_gives_them_a_column(tmp_path, monkeypatch):
    import functools

    from dflash_ref.conformance import exact, matrix

    generate_golden(tmp_path, ["multiround", "sampling"])
    monkeypatch.setattr(matrix, "verify_sampling", functools.partial(exact.verify_sampling, runs=300))
    monkeypatch.delenv("DFLASH_REF_VLLM_PYTHON", raising=False)  # the engines as on a machine without them
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    text, clean = matrix.matrix(tmp_path, ["reference", "vllm", "llamacpp"])
    assert clean, text  # n/a is neither a pass nor a failure
    assert "## Sampled decoding" in text and "| reference | sampling | match | χ² " in text
    assert "| vllm | sampling | match | | | n/a: vLLM is not installed" in text
    assert "| llamacpp |" not in text.split("## Sampled decoding")[1].split("## Serving")[0]  # it does not sample
    assert "| port | one sequence | sampled |" in text and "| reference | pass | pass |" in text
    assert "| vllm | n/a | n/a |" in text
