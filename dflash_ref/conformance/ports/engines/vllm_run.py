"""One golden bundle through vLLM's own engine, its tensors read where vLLM computes them: the program
`verify --impl vllm` runs inside vLLM's Python (vllm.py), never imported by dflash_ref itself.

    python -m dflash_ref.conformance.ports.engines.vllm_run BUNDLE [BUNDLE …] --out DUMP.npz

vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) on the CPU, eager, greedy, the bundle's
target and draft folders as they are (`speculative_config={"method": "dflash", …}`). Forward hooks on
vLLM's own modules, and wrappers that record what a method of its DFlash drafter returned and then hand
it back unchanged, read (they never change what vLLM computes):

    drafter.model.model.fc                     its input: the target's aux hidden states (target_hidden); output: fc
    _project_context_kv / _normalize_context_k the context V, and K after KNorm (k_ctx), then after RoPE,
                                               which vLLM applies in place before writing its paged cache
    embed_input_ids                            the block's embedding (noise_embedding)
    layers.{i}.self_attn: q_norm, k_norm, attn (its inputs), o_proj    q, k_noise, q_rot, k_rot and v, attn_out
    layers.{i} (its (out, residual))           the layer output, out + residual as vLLM's next norm adds them
    model.norm, compute_logits, propose        final hidden, draft logits, the proposals
    the rejection sampler                      the target's verify logits (their rows of each request, and
                                               their argmax: the posterior) and what it accepted

vLLM's step structure differs from the reference's: a draft pass runs at the end of an engine step,
its verify in the next one, and the context states it gets are every verified position's, of which the
accepted ones (τ + 1, from the rejection sampler) count. The dump keys are the reference's.
What vLLM does not compute as a tensor of its own is left out (C after hidden_norm and the attention
weights are fused into its kernels; the draft cache is paged), and so are the prefill's logits, not read yet
(x_0 is: its first output id): VLLMPort.skip waives them.
Exit code 3 (REFUSED): vLLM refused the bundle, its message on the line of stderr marked REFUSAL_MARK.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, where hooks see it
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default grows the worker past 20 GB

import numpy as np  # noqa: E402

from dflash_ref.conformance.bundle import load_bundle  # noqa: E402 (numpy only)
from dflash_ref.conformance.ports.engines import REFUSAL_MARK, REFUSED, serving  # noqa: E402
from dflash_ref.conformance.record import Recorder  # noqa: E402


def cpu(t):
    """A copy, as numpy (vLLM rotates Q and K in place after its norms: a view would change under us)."""
    return (t.detach().float() if t.is_floating_point() else t.detach()).to("cpu", copy=True).numpy()


class Reader:
    """What vLLM's modules computed: `passes` (one dict per draft pass: one sequence's tensors) and
    `verifies` (per request, one entry per verify of its proposals: what the rejection sampler saw and kept)."""

    def __init__(self) -> None:
        self.passes: list[dict] = []
        self.verifies: dict[str, list[dict]] = {}
        self.current: dict = {}
        self.seq = 0  # one count over passes and verifies: which pass a verify checked (serving.request_steps)

    def attach(self, runner) -> None:
        self.runner = runner
        drafter, target = runner.drafter, runner.model
        model = drafter.model  # DFlashQwen3ForCausalLM
        inner = model.model
        self._around(drafter, "propose", self._propose)
        self._around(model, "compute_logits", lambda out, *a, **k: self._put("logits", out))
        self._around(inner, "_project_context_kv", self._context_kv)
        self._around(inner, "_normalize_context_k", self._context_k)
        self._around(inner, "embed_input_ids", lambda out, *a, **k: self._put("noise_embedding", out))
        inner.fc.register_forward_hook(self._fc)
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            attn.q_norm.register_forward_hook(self._layer(i, "q"))
            attn.k_norm.register_forward_hook(self._layer(i, "k_noise"))
            attn.attn.register_forward_pre_hook(self._attention_inputs(i))  # its own q, k after RoPE, v
            attn.o_proj.register_forward_hook(self._layer(i, "attn_out"))
            layer.register_forward_hook(self._layer(i, "layer_out"))
        inner.norm.register_forward_hook(lambda m, a, out: self._put("final_hidden", out))
        runner.rejection_sampler.register_forward_hook(self._verify)
        self.layers = len(inner.layers)
        # the target's hidden states vLLM hands the draft: index a is layer a − 1's output, as hidden_states[a]
        aux = next(m.aux_hidden_state_layers for m in target.modules() if hasattr(m, "aux_hidden_state_layers"))
        self.layer_ids = np.array(sorted(aux), dtype=np.int64) - 1

    # -- wrappers: call vLLM's own method, record what it returned, return it unchanged ------------------
    @staticmethod
    def _around(obj, name: str, record) -> None:
        original = getattr(obj, name)

        def wrapped(*args, **kwargs):
            out = original(*args, **kwargs)
            record(out, *args, **kwargs)
            return out

        setattr(obj, name, wrapped)

    def _put(self, key: str, out) -> None:
        tensor = out[0] if isinstance(out, tuple) else out
        self.current[key] = cpu(tensor)

    def _propose(self, out, *args, **kwargs) -> None:
        self.current["draft_tokens"] = cpu(out)
        # the context K, rotated in place by vLLM after KNorm and before its cache write: read now
        self.current["k_ctx_rot"] = cpu(self.current.pop("k_ctx_tensor"))
        self.current["seq"], self.seq = self.seq, self.seq + 1
        self.passes.append(self.current)
        self.current = {}

    def _fc(self, module, inputs, out) -> None:
        self.current["target_hidden"] = cpu(inputs[0])
        self.current["fc"] = cpu(out[0] if isinstance(out, tuple) else out)

    def _context_kv(self, out, *args, **kwargs) -> None:
        _, all_v = out  # (L, num_ctx, H_kv, d_h)
        self.current["v_ctx"] = cpu(all_v)

    def _context_k(self, out, *args, **kwargs) -> None:
        self.current["k_ctx"] = cpu(out)  # (L, num_ctx, H_kv, d_h), KNorm applied, RoPE not yet
        self.current["k_ctx_tensor"] = out  # rotated in place next, before the cache write: read after the pass

    def _layer(self, i: int, key: str):
        def hook(module, inputs, out):
            if key == "layer_out":
                hidden, residual = out
                self.current[f"{key}.{i}"] = cpu(hidden + residual)
            else:
                self.current[f"{key}.{i}"] = cpu(out[0] if isinstance(out, tuple) else out)

        return hook

    def _attention_inputs(self, i: int):
        def hook(module, args):  # vLLM's rotary module is one for every layer: read each layer's attention instead
            q, k, v = args[:3]
            self.current[f"q_rot.{i}"], self.current[f"k_rot_noise.{i}"], self.current[f"v_noise.{i}"] = (
                cpu(q),
                cpu(k),
                cpu(v),
            )

        return hook

    def _verify(self, module, inputs, out) -> None:
        """Each request's row of the rejection sampler's call: its proposals, the target's logits at them and at
        the bonus position (L_q rows: the verify logits) and their argmax (the posterior), and what it kept (τ
        accepted, then the bonus)."""
        metadata, logits = inputs[0], inputs[2]
        ends = metadata.cu_num_draft_tokens.tolist()
        for row, (request, n) in enumerate(zip(self.runner.input_batch.req_ids, metadata.num_draft_tokens)):
            if n == 0:  # the prefill's sample: no proposal to verify
                continue
            begin = ends[row] - n
            rows = [
                *metadata.target_logits_indices[begin : begin + n].tolist(),
                int(metadata.bonus_logits_indices[row]),
            ]
            kept = cpu(out.sampled_token_ids[row])
            tau = int((kept >= 0).sum()) - 1
            self.verifies.setdefault(request, []).append(
                {
                    "draft": cpu(metadata.draft_token_ids[begin : begin + n]).astype(np.int64),
                    "target_logits": cpu(logits[rows]),  # (L_q, V)
                    "posterior": cpu(logits[rows].argmax(dim=-1)).astype(np.int64),
                    "tau": tau,
                    "bonus": int(kept[tau]),
                    "seq": self.seq,
                }
            )
        self.seq += 1


class ServingReader(Reader):
    """Reader over batched steps: each draft pass also keeps its batch's layout (which requests, in which order;
    where each one's context rows start, how many its verify rejected, their positions) and, per draft layer and
    request, the K and V its queries attended, read from vLLM's paged cache right after the layer's attention
    (the context K/V of a prefix-cache hit are there, never recomputed). serving.py maps it back to requests."""

    unread = ""  # the attention backend whose paged cache is not read (serving.attended knows vLLM's CPU layout)

    def attach(self, runner) -> None:
        super().attach(runner)
        drafter = runner.drafter
        self._batch_args = inspect.signature(drafter.set_inputs_first_pass).bind
        self._around(drafter, "set_inputs_first_pass", self._batch)
        for i, layer in enumerate(drafter.model.model.layers):
            layer.self_attn.attn.register_forward_hook(self._attended(i))

    def _batch(self, out, *args, **kwargs) -> None:
        given = self._batch_args(*args, **kwargs).arguments
        cad, n = given["cad"], given["cad"].num_reqs
        rejected = given.get("num_rejected_tokens_gpu")
        self.current.update(
            req_ids=list(self.runner.input_batch.req_ids[:n]),
            context_start=cpu(cad.query_start_loc_cpu[: n + 1]),
            rejected=cpu(rejected)[:n] if rejected is not None else np.zeros(n, dtype=np.int64),
            context_positions=cpu(given["target_positions"]),
        )

    def _attended(self, i: int):
        def hook(module, args, out) -> None:
            from vllm.forward_context import get_forward_context

            metadata = get_forward_context().attn_metadata
            metadata = metadata.get(module.layer_name) if isinstance(metadata, dict) else metadata
            if metadata is None:  # a warm-up pass: nothing attended
                return
            if type(module.impl).__name__ != "CPUAttentionBackendImpl":  # serving.attended reads its layout only
                self.unread = type(module.impl).__name__
                return
            cache = module.kv_cache[0] if isinstance(module.kv_cache, (list, tuple)) else module.kv_cache
            size = cache.shape[2]  # (blocks, H_kv, block, 2·d_h): cpu_attn.py's shape
            keys, values = [], []
            for b, length in enumerate(metadata.seq_lens.tolist()):
                table = metadata.block_table[b, : -(-length // size)].long()
                k, v = serving.attended(cpu(cache[table]), np.arange(len(table)), length)  # this request's blocks
                keys.append(k), values.append(v)
            self.current[f"attended_k.{i}"], self.current[f"attended_v.{i}"] = keys, values

        return hook


def refusal(error: Exception) -> str:
    """vLLM's own words for why it will not take the bundle: a config validation's message, else the first line."""
    if hasattr(error, "errors"):  # pydantic's ValidationError: vLLM's config checks
        return "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in error.errors())
    return (str(error).splitlines() or [type(error).__name__])[0]


def unsupported(error: Exception) -> bool:
    """vLLM's kernels saying they do not take this configuration (on a CPU, e.g. "Unsupported CPU attention
    configuration: head_dim=4"): a refusal in its words, raised only once it runs."""
    return isinstance(error, NotImplementedError) or str(error).startswith("Unsupported")


def refuse(error: Exception) -> int:
    """Say the refusal on one marked line of stderr (vLLM may log more after it) and exit REFUSED."""
    print(REFUSAL_MARK + " ".join(refusal(error).split()), file=sys.stderr)
    return REFUSED


def run(paths: list[str], out: str) -> int:
    """One bundle: its tensors. Several (sharing their target and draft): their prompts as one batch, and
    each sequence's observables (output ids; per step proposals, posterior, τ, bonus)."""
    bundles = [load_bundle(p) for p in paths]
    first = bundles[0]
    block = first.config("draft")["block_size"]
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    try:
        llm = LLM(
            model=str(first.target_dir),
            tokenizer=str(first.target_dir),
            dtype="float32",
            enforce_eager=True,
            max_model_len=max(len(b.inputs["input_ids"]) + b.inputs["max_new_tokens"] for b in bundles) + 2 * block,
            max_num_batched_tokens=8192,
            max_num_seqs=len(bundles),
            seed=0,
            speculative_config={"method": "dflash", "model": str(first.draft_dir), "num_speculative_tokens": block - 1},
        )
    except Exception as e:  # noqa: BLE001 - vLLM's refusal, said as it said it
        print(traceback.format_exc(), file=sys.stderr)
        return refuse(e)
    reader = Reader()
    llm.collective_rpc(lambda worker: reader.attach(worker.model_runner))
    prompts = [TokensPrompt(prompt_token_ids=b.inputs["input_ids"]) for b in bundles]
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=b.inputs["max_new_tokens"],
            stop_token_ids=b.inputs["stop_token_ids"] or None,
            ignore_eos=True,
            detokenize=False,
        )  # fmt: skip
        for b in bundles
    ]
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    except Exception as e:  # noqa: BLE001 - a shape its kernels do not take is a refusal; anything else, a failure
        if not unsupported(e):
            raise
        print(traceback.format_exc(), file=sys.stderr)
        return refuse(e)
    recorder = Recorder()
    for bundle, output in zip(bundles, outputs):
        with recorder.bundle(bundle.name):
            steps = reader.verifies.get(_engine_id(reader.verifies, output.request_id), [])
            record_loop(recorder, bundle, list(output.outputs[0].token_ids), steps)
            if len(bundles) == 1:
                record_tensors(recorder, bundle, reader, steps)
    recorder.save(out)
    return 0


def record_loop(recorder: Recorder, bundle, output: list[int], steps: list[dict]) -> None:
    """The loop's observables of one sequence: output ids; per step proposals, posterior, τ and bonus. With
    them what the same reads give of the target's: x_0 (its first output id) and each step's verify logits."""
    recorder.record("output_ids", np.array(bundle.inputs["input_ids"] + output, dtype=np.int64))
    if output:
        recorder.record("first_token", np.array(output[0], dtype=np.int64))
    for step, verify in enumerate(steps):
        if "target_logits" in verify:
            recorder.record("verify_logits", verify["target_logits"], step=step)
        recorder.record("draft_tokens", verify["draft"], step=step)
        recorder.record("posterior", verify["posterior"], step=step)
        recorder.record("acceptance_length", np.array(verify["tau"], dtype=np.int64), step=step)
        recorder.record("bonus", np.array(verify["bonus"], dtype=np.int64), step=step)


def record_tensors(recorder: Recorder, bundle, reader: Reader, steps: list[dict]) -> None:
    """The draft's tensors of a single sequence, keyed as the reference's: step s is vLLM's draft pass s
    (after the prefill's sample, or after the verify of step s − 1), whose context rows are the positions
    that verify checked, of which the τ + 1 accepted ones are DFlash's new context."""
    prompt = bundle.inputs["input_ids"]
    recorder.record("layer_ids", reader.layer_ids)
    cached_k: list[list[np.ndarray]] = [[] for _ in range(reader.layers)]  # per layer: context K after RoPE
    for step, draft_pass in enumerate(reader.passes[: len(steps)]):  # a pass never verified is left out
        put = functools.partial(recorder.record, step=step)
        valid = len(prompt) if step == 0 else steps[step - 1]["tau"] + 1
        put("target_hidden", draft_pass["target_hidden"][:valid])
        put("fc", draft_pass["fc"][:valid])
        _record_block(put, draft_pass, reader.layers)
        for i, cached in enumerate(cached_k):
            n_q, h_kv, d_h = draft_pass[f"k_noise.{i}"].shape  # (L_q, H_kv, d_h)
            cached.append(draft_pass["k_ctx_rot"][i, :valid])  # (L_c, H_kv, d_h)
            block_v = draft_pass[f"v_noise.{i}"].reshape(n_q, h_kv, d_h)
            block_k = draft_pass[f"k_rot_noise.{i}"].reshape(n_q, h_kv, d_h)
            put("k_ctx", _heads_first(draft_pass["k_ctx"][i, :valid]), layer=i)
            put("v", _heads_first(np.concatenate([draft_pass["v_ctx"][i, :valid], block_v])), layer=i)
            put("k_rot", _heads_first(np.concatenate([*cached, block_k])), layer=i)


def _record_block(put, draft_pass: dict, layers: int) -> None:
    """One sequence's block rows of a pass, keyed as the reference's: its embedding; per layer Q after QNorm, the
    block's K after KNorm, Q after RoPE, the attention and layer outputs; the final hidden and the draft logits."""
    put("noise_embedding", draft_pass["noise_embedding"])
    for i in range(layers):
        q = draft_pass[f"q.{i}"]  # (L_q, H_q, d_h)
        put("q", _heads_first(q), layer=i)
        put("k_noise", _heads_first(draft_pass[f"k_noise.{i}"]), layer=i)
        put("q_rot", _heads_first(draft_pass[f"q_rot.{i}"].reshape(q.shape)), layer=i)  # (L_q, H_q·d_h) → per head
        put("attn_out", draft_pass[f"attn_out.{i}"], layer=i)
        put("layer_out", draft_pass[f"layer_out.{i}"], layer=i)
    put("final_hidden", draft_pass["final_hidden"])
    put("logits", draft_pass["logits"])


def _engine_id(ids, label: str) -> str | None:
    """vLLM's own id, among `ids`, of the request added as `label`: the same, or with a suffix ("0-890a2a26")."""
    return next((r for r in ids if r == label or r.startswith(label + "-")), None)


def _heads_first(x: np.ndarray) -> np.ndarray:
    """(L, H, d_h) → (H, L, d_h)."""
    return np.ascontiguousarray(x.transpose(1, 0, 2))


def serve(paths: list[str], out: str) -> int:
    """The requests of one serving scenario (bundles with a "serving" entry, one model pair) through vLLM's engine
    as a server meets them: with its settings (prefix caching, KV block size, tokens per step, sequences), each
    request added when its arrival holds (engine_scenarios.SERVING_MEANING), the engine stepped until all are
    done. Each request's tensors are read out of the batched steps (serving.py) and keyed as its bundle's."""
    bundles = sorted((load_bundle(p) for p in paths), key=lambda b: b.manifest["serving"]["order"])
    first, settings = bundles[0], bundles[0].manifest["serving"]["engine"]
    block = first.config("draft")["block_size"]
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    chunked = "max_batched_tokens" in settings
    try:
        llm = LLM(
            model=str(first.target_dir), tokenizer=str(first.target_dir), dtype="float32", enforce_eager=True, seed=0,
            max_model_len=max(len(b.inputs["input_ids"]) + b.inputs["max_new_tokens"] for b in bundles) + 2 * block,
            max_num_batched_tokens=settings.get("max_batched_tokens", 8192), enable_chunked_prefill=chunked,
            max_num_seqs=settings.get("max_seqs", len(bundles)),
            enable_prefix_caching=bool(settings.get("prefix_caching")), block_size=settings.get("kv_block_size"),
            speculative_config={"method": "dflash", "model": str(first.draft_dir), "num_speculative_tokens": block - 1},
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - vLLM's refusal, said as it said it
        print(traceback.format_exc(), file=sys.stderr)
        return refuse(e)
    reader = ServingReader()
    llm.collective_rpc(lambda worker: reader.attach(worker.model_runner))
    engine, waiting = llm.llm_engine, list(bundles)
    produced: dict[str, list[int]] = {}  # label → output ids so far
    cached: dict[str, int] = {}  # label → prompt tokens vLLM took from its prefix cache (its own count)
    finished: set[str] = set()

    while waiting or engine.has_unfinished_requests():
        counts = {label: len(ids) for label, ids in produced.items()}
        while waiting and serving.arrives(waiting[0].manifest["serving"], counts, finished):  # in order
            b = waiting.pop(0)
            label = b.manifest["serving"]["request"]
            produced[label] = []
            engine.add_request(
                label,
                TokensPrompt(prompt_token_ids=b.inputs["input_ids"]),
                SamplingParams(temperature=0.0, max_tokens=b.inputs["max_new_tokens"], ignore_eos=True,
                               stop_token_ids=b.inputs["stop_token_ids"] or None, detokenize=False),
            )  # fmt: skip
        if not engine.has_unfinished_requests():
            arrive = waiting[0].manifest["serving"]["arrive"]
            raise RuntimeError(f"request {waiting[0].name} can never arrive: {arrive}")
        for output in engine.step():
            label = output.request_id.split("-")[0] if output.request_id not in produced else output.request_id
            produced[label] = list(output.outputs[0].token_ids)
            cached[label] = output.num_cached_tokens or 0
            if output.finished:
                finished.add(label)
    if reader.unread:
        print(
            f"vllm_run: the paged cache of {reader.unread} is not read: K after RoPE and V left missing",
            file=sys.stderr,
        )
    parts: dict[str, list[dict]] = {}
    for batch in reader.passes:
        for request, part in serving.split_pass(batch, reader.layers, block).items():
            parts.setdefault(request, []).append(part)
    recorder = Recorder()
    for bundle in bundles:
        label = bundle.manifest["serving"]["request"]
        internal = _engine_id(reader.verifies, label) or label
        verifies = reader.verifies.get(internal, [])
        with recorder.bundle(bundle.name):
            record_loop(recorder, bundle, produced[label], verifies)
            steps = serving.request_steps(parts.get(internal, []), verifies)
            record_request(recorder, bundle, reader, steps, cached.get(label, 0))
    recorder.save(out)
    return 0


def record_request(recorder: Recorder, bundle, reader: Reader, steps: list[dict], cached: int = 0) -> None:
    """One request's draft tensors, keyed as the reference's, from its steps (serving.request_steps): the
    context rows it computed, its block's rows, and the K and V its queries attended as read from the cache.
    `cached`: the prompt tokens vLLM says it took from its prefix cache (RequestOutput.num_cached_tokens): the
    first step's context rows must then start there, which the comparison holds them to."""
    recorder.record("layer_ids", reader.layer_ids)
    if cached:
        recorder.served(cached_prefix=cached)
    for step, part in enumerate(steps):
        put = functools.partial(recorder.record, step=step)
        new = int(part["positions"][0]) if step else 0  # the reference's new positions: V of those (all, at step 0)
        put("target_hidden", part["target_hidden"])
        put("fc", part["fc"])
        _record_block(put, part, reader.layers)
        for i in range(reader.layers):
            put("k_ctx", _heads_first(part["k_ctx"][i]), layer=i)
            if f"attended_v.{i}" in part:  # read from the cache (vLLM's CPU backend): else left missing
                put("v", _heads_first(part[f"attended_v.{i}"][new:]), layer=i)
                put("k_rot", _heads_first(part[f"attended_k.{i}"]), layer=i)


def bench(target: str, draft: str, prompts: list[list[int]], max_new: int, stops: list[int], out: str) -> int:
    """`bench engines`: the prompts one at a time through vLLM (no hook: nothing read but its own counters), each
    generate timed after a warm-up; → JSON: outputs, seconds, vLLM's own drafts and accepted tokens, peak RSS."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    block = json.loads((Path(draft) / "config.json").read_text())["block_size"]
    try:
        llm = LLM(
            model=target, tokenizer=target, dtype="float32", enforce_eager=True, seed=0, disable_log_stats=False,
            max_model_len=max(map(len, prompts)) + max_new + 2 * block, max_num_seqs=1,
            speculative_config={"method": "dflash", "model": draft, "num_speculative_tokens": block - 1},
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - vLLM's refusal, said as it said it
        return refuse(e)
    params = SamplingParams(temperature=0.0, max_tokens=max_new, stop_token_ids=stops or None, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], params, use_tqdm=False)  # warm-up
    before = _spec_counters(llm)
    outputs, seconds = [], []
    for prompt in prompts:
        t0 = time.perf_counter()
        result = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        seconds.append(time.perf_counter() - t0)
        outputs.append(list(result[0].outputs[0].token_ids))
    after = _spec_counters(llm)
    drafts, accepted = (after[k] - before[k] for k in ("drafts", "accepted"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(out).write_text(json.dumps({"outputs": outputs, "seconds": seconds, "drafts": drafts, "accepted": accepted,
                                     "peak_rss_mb": peak}))  # fmt: skip
    return 0


# how vLLM's draft samples, for each of the kit's verifiers (sampling.py): the argmax, whose probabilities its
# rejection sampler then takes as one-hot (accept d with p(d), else draw from p without d: match's distribution),
# or a draw from its softmax at the request's temperature, whose probabilities it is given (rejection)
DRAFT_SAMPLE_METHOD = {"match": "greedy", "rejection": "probabilistic"}
NEVER, CUT = -1, -2  # a request's τ where vLLM never verified its proposals, or proposed fewer than γ at first


def sample(path: str, runs: int, verifier: str, out: str) -> int:
    """`verify --sampling`: the sampling bundle's prompt as `runs` requests, request i seeded with i, through one
    engine at the bundle's temperature (no top-k, top-p or min-p), vLLM's draft sampling as `verifier` asks; →
    .npz: each request's prompt and output (output_ids), its first verify's τ (tau, from the rejection sampler's
    own output; NEVER or CUT), whether vLLM handed the rejection sampler the draft's probabilities there
    (draft_probs), and the temperature it divided each verified row's logits by (temperatures:
    expand_batch_to_tokens' output)."""
    bundle = load_bundle(path)
    s = bundle.manifest["sampling"]
    block = bundle.config("draft")["block_size"]
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    try:
        llm = LLM(
            model=str(bundle.target_dir), tokenizer=str(bundle.target_dir), dtype="float32", enforce_eager=True,
            seed=0, max_model_len=len(s["input_ids"]) + s["max_new_tokens"] + 2 * block, max_num_seqs=256,
            speculative_config={"method": "dflash", "model": str(bundle.draft_dir), "num_speculative_tokens": block - 1,
                                "draft_sample_method": DRAFT_SAMPLE_METHOD[verifier]},
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - vLLM's refusal, said as it said it
        print(traceback.format_exc(), file=sys.stderr)
        return refuse(e)
    first_tau: dict[str, int] = {}  # request → its first verify's τ (CUT: vLLM proposed fewer than γ there)
    given: dict[str, bool] = {}  # request → whether its first verify got the draft's probabilities
    divided: list[np.ndarray] = []  # the temperatures vLLM divided the verify logits by, a row each

    def expanded(out, x, cu, n, replace_from=0, replace_to=0) -> None:  # per request → per verified row
        if n and x.is_floating_point() and replace_to == 1:  # the temperature's, not top-p's
            divided.append(cpu(out))

    import vllm.v1.sample.rejection_sampler as rejection  # noqa: PLC0415 - vLLM's, in its own Python

    Reader._around(rejection, "expand_batch_to_tokens", expanded)

    def verified(module, inputs, out) -> None:  # the rejection sampler: each request's first verify's τ
        metadata, runner = inputs[0], module.runner
        for row, (request, n) in enumerate(zip(runner.input_batch.req_ids, metadata.num_draft_tokens)):
            if n and request not in first_tau:
                first_tau[request] = int((out.sampled_token_ids[row] >= 0).sum()) - 1 if n == block - 1 else CUT
                given[request] = inputs[1] is not None

    def attach(worker) -> None:
        worker.model_runner.rejection_sampler.runner = worker.model_runner
        worker.model_runner.rejection_sampler.register_forward_hook(verified)

    llm.collective_rpc(attach)
    params = [
        SamplingParams(
            temperature=s["temperature"], seed=seed, max_tokens=s["max_new_tokens"], ignore_eos=True, detokenize=False
        )  # fmt: skip
        for seed in range(runs)
    ]
    prompt = TokensPrompt(prompt_token_ids=s["input_ids"])
    try:
        outputs = llm.generate([prompt] * runs, params, use_tqdm=False)
    except Exception as e:  # noqa: BLE001 - a shape its kernels do not take is a refusal; anything else, a failure
        if not unsupported(e):
            raise
        print(traceback.format_exc(), file=sys.stderr)
        return refuse(e)
    ids = np.array([s["input_ids"] + list(o.outputs[0].token_ids) for o in outputs], dtype=np.int64)
    engine_ids = [_engine_id(first_tau, o.request_id) or o.request_id for o in outputs]
    tau = np.array([first_tau.get(r, NEVER) for r in engine_ids])
    probs = np.array([given.get(r, False) for r in engine_ids])
    temperatures = np.concatenate(divided) if divided else np.zeros(0, dtype=np.float32)
    np.savez(out, output_ids=ids, tau=tau, draft_probs=probs, temperatures=temperatures)
    return 0


def _spec_counters(llm) -> dict:
    """vLLM's own spec-decode counters: drafts made and draft tokens accepted, so far."""
    counts = {"drafts": 0, "accepted": 0}
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            counts["drafts"] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            counts["accepted"] += metric.value
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_ref.conformance.ports.engines.vllm_run")
    p.add_argument("bundles", nargs="*", help="one bundle (its tensors), or several sharing their models (a batch)")
    p.add_argument("--out", required=True)
    p.add_argument("--serve", action="store_true", help="the bundles are one serving scenario's requests")
    p.add_argument("--bench", nargs=2, metavar=("TARGET", "DRAFT"), help="time these folders' decoding instead")
    p.add_argument("--prompts", help="with --bench: a JSON list of prompts (token ids)")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--stop", type=int, nargs="*", default=[])
    p.add_argument("--sample", type=int, metavar="RUNS", help="the sampling bundle's prompt, RUNS seeded requests")
    p.add_argument("--verifier", choices=sorted(DRAFT_SAMPLE_METHOD), default="rejection")
    args = p.parse_args(argv)
    if args.sample:
        return sample(args.bundles[0], args.sample, args.verifier, args.out)
    if args.bench:
        return bench(*args.bench, json.loads(Path(args.prompts).read_text()), args.max_new, args.stop, args.out)
    return (serve if args.serve else run)(args.bundles, args.out)


if __name__ == "__main__":
    sys.exit(main())
