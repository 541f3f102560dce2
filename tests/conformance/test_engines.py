"""The engine ports (conformance/ports/engines/) without the engines: an engine that is not installed is "not
applicable" with a line that says what to set; what the readers make of an engine's records is checked by
writing a bundle's own expected tensors in each engine's layout (llama.cpp's dump file, vLLM's per-pass
tensors) and reading them back: every stage must then agree. The engines themselves run in `.ci/engines`."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from dflash_ref.conformance.bundle import SHIPPED, find_bundles
from dflash_ref.conformance.golden import generate_golden
from dflash_ref.conformance.hints import hint
from dflash_ref.conformance.judge import compare
from dflash_ref.conformance.ports.engines import llamacpp, vllm, vllm_run
from dflash_ref.conformance.record import Recorder
from dflash_ref.conformance.verify import verify

pytestmark = pytest.mark.usefixtures("one_thread_module")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict:
    """A multi-round DFlash 1 bundle and a DFlash 2 one (the tiny scenarios: the readers are shape-blind)."""
    out = tmp_path_factory.mktemp("golden")
    generate_golden(out, ["multiround", "dflash2"])
    return {b.name: b for b in find_bundles(out)}


def test_an_engine_not_installed_is_not_applicable_and_says_what_to_set(monkeypatch):
    import sys

    monkeypatch.setenv("DFLASH_REF_VLLM_PYTHON", sys.executable)  # this Python: no vllm here
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    for impl, said in (
        ("vllm", "vLLM is not installed"),
        ("llamacpp", "llama.cpp is not installed: set LLAMA_CPP_DIR"),
    ):
        report = verify(impl, SHIPPED)
        assert not report.passed and f"not applicable: {said}" in report.text(), report.text()
        assert "NOT APPLICABLE" in report.text()
    monkeypatch.setenv("LLAMA_CPP_DIR", "/nonexistent")
    assert "is not a llama.cpp source tree" in verify("llamacpp", SHIPPED).text()


def test_vllms_refusal_is_said_in_its_own_words():
    class Refused(Exception):  # pydantic's ValidationError, as vLLM's config check raises it
        def errors(self):
            return [{"msg": "Value error, Model Runner V1 does not support: DFlash candidate-head drafts"}]

    assert vllm_run.refusal(Refused()) == "Model Runner V1 does not support: DFlash candidate-head drafts"
    assert vllm_run.refusal(ValueError("no tokenizer\nmore")) == "no tokenizer"


def test_a_shape_vllms_kernels_do_not_take_is_a_refusal_and_a_failure_says_its_last_error():
    from dflash_ref.conformance.ports.engines import vllm

    assert vllm_run.unsupported(RuntimeError("Unsupported CPU attention configuration: head_dim=4 isa=1"))
    assert not vllm_run.unsupported(RuntimeError("index out of range"))  # a failure, not a refusal
    stderr = "Traceback …\n[rank0]:   File x.py, line 3\n[rank0]: RuntimeError: index out of range\nINFO bye\n"
    assert vllm.last_error(stderr) == "RuntimeError: index out of range"


def test_a_refusal_by_model_runner_v1_is_retried_on_v2_and_both_are_said(monkeypatch):
    import subprocess

    from dflash_ref.conformance.ports.engines import REFUSAL_MARK, REFUSED, vllm
    from dflash_ref.conformance.report import NotApplicable

    calls = []

    def runner(python, args, timeout, env=None):  # vllm_run.py as it exits when vLLM refuses, logging after
        calls.append(env or {})
        said = (
            "Model Runner V2 requires Triton."
            if "VLLM_USE_V2_MODEL_RUNNER" in (env or {})
            else ("Model Runner V1 does not support: DFlash candidate-head drafts")
        )
        stderr = f"Traceback …\n{REFUSAL_MARK}{said}\nINFO engine shut down\n    For further information visit …\n"
        return subprocess.CompletedProcess(args, REFUSED, "", stderr)

    monkeypatch.setattr(vllm, "run_program", runner)
    with pytest.raises(NotApplicable) as refused:
        vllm.run_runner("python", [], "draft", {"OMP_NUM_THREADS": "2"})
    assert str(refused.value) == (
        "vLLM refuses this draft: Model Runner V1 does not support: DFlash candidate-head drafts; "
        "Model Runner V2 requires Triton."
    )
    assert [c.get("VLLM_USE_V2_MODEL_RUNNER") for c in calls] == [None, "1"]
    assert all(c["OMP_NUM_THREADS"] == "2" for c in calls)


def _steps(expected: dict) -> int:
    return sum(k.endswith("/acceptance_length") for k in expected)


def _llamacpp_dump(bundle, path: Path, junk: np.random.Generator) -> None:
    """The bundle's expected tensors as llamacpp_run.cpp writes llama.cpp's: every verified row injected
    (rejected rows junk), blocks whole, KV cells padded, DFlash 2's lattice packed."""
    e, records = bundle.expected, []

    def put(name, values):
        values = np.asarray(values, dtype=np.float32)
        ne = list(reversed(values.shape)) + [1] * (4 - values.ndim)
        records.append((name, ne, values.reshape(-1)))

    prompt, n_steps, draft = bundle.inputs["input_ids"], _steps(e), bundle.config("draft")
    layers, top_k = draft["num_hidden_layers"], draft.get("dflash_config", {}).get("selector_top_k")
    put("=prompt", prompt), put("=layer_ids", e["prefill/layer_ids"] + 1)

    def context(step, rows):
        """Step `step`'s new context (target features, C, K after RoPE, V) padded with junk to `rows`."""
        th, c = e[f"step{step}/draft.hook_target_hidden"], e[f"step{step}/draft.context.hook_context"]
        pad = lambda x: np.concatenate([x, junk.normal(size=(rows - len(x), *x.shape[1:]))])  # noqa: E731
        out = {"=target_features": pad(th), "dft/inp_g_embeddings": pad(c)}
        for i in range(layers):
            k_rot, v = (
                e[f"step{step}/draft.layers.{i}.self_attn.hook_k_rot"],
                e[f"step{step}/draft.layers.{i}.self_attn.hook_v"],
            )
            n_q = e[f"step{step}/draft.hook_noise_embedding"].shape[0]
            new = k_rot[:, k_rot.shape[1] - n_q - len(c) : k_rot.shape[1] - n_q]  # (H, L_c, d)
            out[f"dft/Kcur_injected-{i}"] = pad(new.transpose(1, 0, 2))
            out[f"dft/Vcur_injected-{i}"] = pad(v[:, : len(c)].transpose(1, 0, 2))
        return out

    first = context(0, len(prompt))
    records.append(("#prefill", [0] * 4, np.zeros(0, np.float32)))
    put("tgt/result_output", e["prefill/target_logits"][None])  # the prompt's pass: its last row only
    put("=target_features", first.pop("=target_features"))
    records.append(("#process", [0] * 4, np.zeros(0, np.float32)))
    [put(k, v) for k, v in first.items()]
    for s in range(n_steps):
        p = f"step{s}/"
        records.append(("#draft", [0] * 4, np.zeros(0, np.float32)))
        n_q = e[p + "draft.hook_noise_embedding"].shape[0]
        put("dft/inp_noise_embd", e[p + "draft.hook_noise_embedding"])
        for i in range(layers):
            a = f"{p}draft.layers.{i}."
            put(f"dft/Qcur-{i}", e[a + "self_attn.hook_q_rot"].transpose(1, 0, 2))
            put(f"dft/Kcur-{i}", e[a + "self_attn.hook_k_rot"][:, -n_q:].transpose(1, 0, 2))
            put(f"dft/Vcur-{i}", e[a + "self_attn.hook_v"][:, -n_q:].transpose(1, 0, 2))
            pattern = e[a + "self_attn.hook_pattern"]
            put(f"dft/kq_soft_max-{i}", np.concatenate([pattern, np.zeros((*pattern.shape[:2], 16))], axis=2))
            for ours, theirs in (("attention_conv.hook_prepared", "attn_conv_in"), ("attention_conv.hook_finished",
                                 "attn_conv_out"), ("mlp_conv.hook_prepared", "ffn_conv_in"),
                                 ("mlp_conv.hook_finished", "ffn_conv_out")):  # fmt: skip
                if a + ours in e:
                    put(f"dft/{theirs}-{i}", e[a + ours])
            put(f"dft/l_out-{i}", e[a + "hook_resid_post"])
        logits = e[p + "draft.hook_logits"]
        put("dft/result_norm", e[p + "draft.hook_out"])
        put("dft/result_output", np.concatenate([junk.normal(size=(1, logits.shape[1])), logits]))
        proposals = e[p + "draft_tokens"]
        if top_k:  # the lattice: per position, candidate ids then score[predecessor][candidate]
            lattice = junk.normal(size=(n_q, top_k + top_k * top_k))
            chosen = 0
            for t in range(1, n_q):
                cand = e[p + "draft.candidate_selector.hook_candidates"][t - 1]
                score = (
                    e[p + "draft.candidate_selector.hook_unary"][t - 1]
                    + e[p + "draft.candidate_selector.hook_pair"][t - 1]
                )
                lattice[t, :top_k] = cand
                lattice[t, top_k + chosen * top_k : top_k + (chosen + 1) * top_k] = score
                chosen = int(np.flatnonzero(cand == proposals[t - 1])[0])
            put("dft/dflash2_lattice", lattice)
        put("=draft", proposals)
        records.append(("#verify", [0] * 4, np.zeros(0, np.float32)))
        posterior, tau = e[p + "posterior"], int(e[p + "acceptance_length"])
        put("tgt/result_output", e[p + "target_logits"])  # the target's verify logits: their argmax the posterior
        rows = len(posterior)
        following = context(s + 1, rows) if s + 1 < n_steps else None
        put("=target_features", following.pop("=target_features") if following else junk.normal(size=(rows, 4)))
        records.append(("#process", [0] * 4, np.zeros(0, np.float32)))
        [put(k, v) for k, v in (following or {}).items()]
        put("=accepted", [*proposals[:tau], int(e[p + "bonus"])])
    put("=output", e["output_ids"][len(prompt) :])
    with open(path, "wb") as f:
        for name, ne, values in records:
            f.write(struct.pack("<I", len(name)) + name.encode() + struct.pack("<I", 4))
            f.write(struct.pack("<4q", *ne) + struct.pack("<Q", values.size) + values.tobytes())


@pytest.mark.parametrize("name", ["multiround", "dflash2"])
def test_the_llamacpp_reader_keys_llamacpps_records_as_the_reference(bundles, tmp_path, name):
    bundle = bundles[name]
    _llamacpp_dump(bundle, tmp_path / "dump.bin", np.random.default_rng(0))
    produced = llamacpp.keyed(llamacpp.read_dump(tmp_path / "dump.bin"), bundle.config("draft"))
    checks = compare(bundle, produced, skip=list(llamacpp.SKIP))
    assert not [c for c in checks if c.status in ("FAIL", "missing")], [c.line() for c in checks if c.status != "pass"][
        :5
    ]
    assert sum(c.status == "pass" for c in checks) > 50
    passed = {c.stage for c in checks if c.status == "pass"}
    assert {"prefill_logits", "first_token", "verify_logits"} <= passed


def test_the_llamacpp_reader_takes_the_verify_logits_as_llamacpp_computed_them(bundles, tmp_path):
    """A verify that computed one row fewer, or other values, than the reference's is said so at its logits."""
    bundle = bundles["multiround"]
    _llamacpp_dump(bundle, tmp_path / "dump.bin", np.random.default_rng(0))
    records = llamacpp.read_dump(tmp_path / "dump.bin")
    verifies = [i for i, (name, _) in enumerate(records) if name == "tgt/result_output"][1:]  # the prefill's first
    name, logits = records[verifies[0]]
    records[verifies[0]] = (name, logits[:-1])  # step 0: a row short
    name, logits = records[verifies[1]]
    records[verifies[1]] = (name, logits + 1.0)  # step 1: off (same argmax)
    produced = llamacpp.keyed(records, bundle.config("draft"))
    status = {c.key: c.status for c in compare(bundle, produced, skip=list(llamacpp.SKIP))}
    assert status["step0/target_logits"] == "FAIL" and status["step1/target_logits"] == "FAIL"
    assert status["step1/posterior"] == "pass" and status["step2/target_logits"] == "pass"


def test_the_vllm_reader_keys_vllms_tensors_as_the_reference(bundles):
    """vLLM's layouts: (L, H, d_h) per head, Q/K/V after RoPE flat (L, H·d_h), the context of every verified
    position (the rejected rows junk), the layers' context K stacked (layers, L_c, H_kv, d_h)."""
    bundle, junk = bundles["multiround"], np.random.default_rng(1)
    e, draft = bundle.expected, bundle.config("draft")
    layers, prompt = draft["num_hidden_layers"], bundle.inputs["input_ids"]
    reader = vllm_run.Reader()
    reader.layers, reader.layer_ids = layers, e["prefill/layer_ids"]
    steps, rows = [], len(prompt)
    for s in range(_steps(e)):
        p = f"step{s}/"
        c = e[p + "draft.context.hook_context"]
        pad = lambda x, n=rows: np.concatenate([x, junk.normal(size=(n - len(x), *x.shape[1:]))])  # noqa: E731
        n_q = e[p + "draft.hook_noise_embedding"].shape[0]
        draft_pass = {"target_hidden": pad(e[p + "draft.hook_target_hidden"]),
                      "fc": pad(e[p + "draft.context.hook_fc"]), "noise_embedding": e[p + "draft.hook_noise_embedding"],
                      "final_hidden": e[p + "draft.hook_out"], "logits": e[p + "draft.hook_logits"]}  # fmt: skip
        k_ctx, k_ctx_rot, v_ctx = [], [], []
        for i in range(layers):
            a = f"{p}draft.layers.{i}."
            flat = lambda x: x.transpose(1, 0, 2).reshape(x.shape[1], -1)  # noqa: E731 (H, L, d) → (L, H·d)
            k_rot, v = e[a + "self_attn.hook_k_rot"], e[a + "self_attn.hook_v"]
            k_ctx.append(pad(e[a + "self_attn.hook_k_ctx"].transpose(1, 0, 2)))
            k_ctx_rot.append(pad(k_rot[:, k_rot.shape[1] - n_q - len(c) : k_rot.shape[1] - n_q].transpose(1, 0, 2)))
            v_ctx.append(pad(v[:, : len(c)].transpose(1, 0, 2)))
            draft_pass |= {f"q.{i}": e[a + "self_attn.hook_q"].transpose(1, 0, 2),
                           f"k_noise.{i}": e[a + "self_attn.hook_k_noise"].transpose(1, 0, 2),
                           f"q_rot.{i}": flat(e[a + "self_attn.hook_q_rot"]), f"k_rot_noise.{i}": flat(k_rot[:, -n_q:]),
                           f"v_noise.{i}": flat(v[:, -n_q:]), f"attn_out.{i}": e[a + "self_attn.hook_out"],
                           f"layer_out.{i}": e[a + "hook_resid_post"]}  # fmt: skip
        draft_pass |= {"k_ctx": np.stack(k_ctx), "k_ctx_rot": np.stack(k_ctx_rot), "v_ctx": np.stack(v_ctx)}
        reader.passes.append(draft_pass)
        steps.append({"draft": e[p + "draft_tokens"], "posterior": e[p + "posterior"],
                      "target_logits": e[p + "target_logits"],
                      "tau": int(e[p + "acceptance_length"]), "bonus": int(e[p + "bonus"])})  # fmt: skip
        rows = len(e[p + "posterior"])
    recorder = Recorder()
    with recorder.bundle(bundle.name):
        vllm_run.record_loop(recorder, bundle, e["output_ids"][len(prompt) :].tolist(), steps)
        vllm_run.record_tensors(recorder, bundle, reader, steps)
    produced = {k.split("/", 1)[1]: v for k, v in recorder.arrays.items()}
    checks = compare(bundle, produced, skip=list(vllm.VLLMPort.skip))
    assert not [c for c in checks if c.status in ("FAIL", "missing")], [c.line() for c in checks if c.status != "pass"][
        :5
    ]
    passed = {c.stage for c in checks if c.status == "pass"}
    assert {"first_token", "verify_logits"} <= passed and "prefill_logits" not in passed  # not read yet: skipped
    assert {"prefill_logits", "first_token", "verify_logits"} <= set(vllm.VLLMBatchPort.skip)  # observables only


def test_a_norm_weight_off_by_a_factor_per_dimension_is_named_by_the_hint():
    rng = np.random.default_rng(0)
    expected = rng.normal(size=(2, 5, 8)).astype(np.float32)  # (H_kv, L_c, d_h)
    other = expected * rng.uniform(0.5, 1.5, size=8).astype(np.float32)  # another layer's weight over this one's
    assert hint("k_ctx", expected, other, {}).startswith("off by one constant factor per head dimension")
    assert not hint("k_ctx", expected, expected + 0.5, {}).startswith("off by one constant factor")


def test_the_engine_shaped_bundles_hold_what_they_are_for_and_the_official_code_passes_them(tmp_path):
    """golden --engines: SmolLM2's tokenizer beside the target, head_dim 64; each scenario's property checked
    as it is written (scenarios.py), and the official dflash 0.1.0 agrees with the reference on every tensor."""
    from dflash_ref.conformance.engine_scenarios import ENGINE_NAMES, SERVING_NAMES

    written = generate_golden(tmp_path, list(ENGINE_NAMES + SERVING_NAMES))
    assert [p.name.split("_", 1)[1] for p in written] == list(ENGINE_NAMES + SERVING_NAMES)
    engine = find_bundles(tmp_path / written[0].name)[0]
    assert (engine.target_dir / "tokenizer.json").is_file() and engine.config("draft")["head_dim"] == 64
    assert (tmp_path / written[len(ENGINE_NAMES) - 1].name / "target").is_symlink()  # the real SmolLM2: linked
    # the serving requests: one target per model pair (the first's, linked), each told how an engine submits it
    served = [b for b in find_bundles(tmp_path) if "serving" in b.manifest]
    assert [b.name for b in served] == list(SERVING_NAMES)
    for models in ("dflash1", "dflash2"):  # one target per model pair
        pair = [b for b in served if b.manifest["serving"]["models"] == models]
        assert len(pair) > 1 and len({b.target_dir.resolve() for b in pair}) == 1, models
    arrivals = [b.manifest["serving"] for b in served if b.name.startswith("serve_arrivals")]
    assert [a["arrive"] for a in arrivals][:2] == [None, {"after": "r0", "tokens": 3}]
    assert any(
        b.inputs["stop_token_ids"] and len(b.expected["output_ids"]) - len(b.inputs["input_ids"]) < 24 for b in served
    )  # fmt: skip  (a request that stops early)
    report = verify("zlab", tmp_path)  # the reference wrote them (golden checks each against its float64 twin)
    assert report.passed, report.text()


def test_a_target_whose_rope_differs_is_named_at_its_features_by_the_hint():
    """Another θ changes every prefill position's features but the first (rotated by nothing): the hint says
    RoPE. A layer read one off (hidden_states[l] for [l + 1]) differs at the first position too: it does not."""
    import dataclasses

    import torch

    from dflash_ref import Qwen3Target
    from dflash_ref.tour.demo import demo_models

    target = demo_models()[0]
    other = Qwen3Target(dataclasses.replace(target.config, rope_theta=target.config.rope_theta * 10))
    other.load_state_dict(target.state_dict())
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        right, wrong = target(ids).hidden_states, other(ids).hidden_states
    said = hint("target_hidden", right[2][0].numpy(), wrong[2][0].numpy(), {})
    assert said.startswith("the first position's features agree and the later ones' do not"), said
    assert not hint("target_hidden", right[2][0].numpy(), right[1][0].numpy(), {}).startswith("the first position")


def test_a_llamacpp_crash_is_said_by_its_assertion_not_its_backtrace():
    stderr = (
        "0.00.2 I common_speculative_impl_draft_dflash: - block_size=4\n"
        "/tree/src/llama-graph.cpp:1384: GGML_ASSERT(t_layer_inp[il] != nullptr) failed\n"
        "#0  0x00007f in __GI___wait4 (...)\n30\t../sysdeps/unix/sysv/linux/wait4.c: No such file or directory.\n"
    )
    assert llamacpp.failure(stderr) == "/tree/src/llama-graph.cpp:1384: GGML_ASSERT(t_layer_inp[il] != nullptr) failed"
    assert llamacpp.failure("loading\nsomething went wrong\n") == "something went wrong"
