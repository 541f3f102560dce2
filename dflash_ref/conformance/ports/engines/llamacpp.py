"""llama.cpp as a port (`verify --impl llamacpp`): a llama.cpp source tree (LLAMA_CPP_DIR), built where it
has no build; each bundle converted by llama.cpp's own converter (`convert_hf_to_gguf.py`, the draft with
`--target-model-dir`), run through its own DFlash speculative implementation by a small program of ours
built against its API (llamacpp_run.cpp: the loop of its speculative-simple example, with the prefill as its
server does it), and read through its graph's own tensor names (cb_eval).

What llama.cpp names, and the kit's stages it gives:

    =target_features (its llama_get_embeddings_layer_inp)   target_hidden: the target layers' inputs it reads
    inp_g_embeddings                        C, after fc and the encoder norm
    Kcur_injected-{l}, Vcur_injected-{l}    the context's K (after KNorm and RoPE) and V, as injected
    inp_noise_embd                          the block's embedding
    Qcur-{l}, Kcur-{l}, Vcur-{l}            the block's Q and K after norm and RoPE, and V
    kq_soft_max-{l}                         the attention weights (flash attention off: `-fa off`)
    l_out-{l}, result_norm, result_output   layer output, final hidden, draft logits
    attn_conv_in/out-{l}, ffn_conv_in/out-{l}, dflash2_lattice    DFlash 2's convolutions and selector
    tgt/result_output                       the target's logits: at the prefill, the prompt's last row (x_0 is
                                            the first output id); at each verify, every verified row (their
                                            argmax: the posterior)

Not named in its graphs (computed inside other nodes), so skipped: fc alone, Q and K before RoPE, K of the
context before RoPE, the attention output before its residual, DFlash 2's dynamic taps; and the draft cache
lengths (its KV cells).
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ...crash import EngineFailed
from ...port import Port, outputs
from ...report import NotApplicable
from ...stages import key_for

VARIABLE = "LLAMA_CPP_DIR"
SOURCE = Path(__file__).with_name("llamacpp_run.cpp")
TIMEOUT = 3600  # seconds: a first build of llama.cpp on 2 cores is most of it
# llama.cpp keeps its KV caches in f16 unless told: the bundles are f32, as are what bench engines measures
F32_CACHES = ("-ctk", "f32", "-ctv", "f32", "-ctkd", "f32", "-ctvd", "f32")
# the stages llama.cpp does not name (see the module's docstring)
SKIP = ("fc", "attn_conv_taps", "q", "k_ctx", "k_noise", "attn_out", "mlp_conv_taps", "cache_lengths")


def tree() -> Path:
    """The llama.cpp source tree of LLAMA_CPP_DIR, or NotApplicable saying what to set."""
    where = os.environ.get(VARIABLE)
    if not where:
        raise NotApplicable(f"llama.cpp is not installed: set {VARIABLE} to a llama.cpp source tree (ENGINES.md)")
    root = Path(where)
    if not (root / "convert_hf_to_gguf.py").is_file() or not (root / "include" / "llama.h").is_file():
        raise NotApplicable(f"llama.cpp is not installed: {VARIABLE}={root} is not a llama.cpp source tree")
    return root


def _run(args: list, what: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["(no message)"])[-1]
        raise EngineFailed(f"{what} failed (exit {proc.returncode}): {said}")
    return proc


def program(root: Path) -> Path:
    """llamacpp_run built against the tree (and the tree built first where it has no build)."""
    build = root / "build"
    if not (build / "bin").is_dir() or not list((build / "bin").glob("libllama.*")):
        _run(["cmake", "-S", root, "-B", build, "-G", "Ninja", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release",
              "-DLLAMA_BUILD_TESTS=OFF"], "configuring llama.cpp")  # fmt: skip
        _run(["cmake", "--build", build, "--target", "llama-speculative-simple"], "building llama.cpp")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    binary = build / "bin" / f"dflash_ref-llamacpp-run-{digest}"
    if not binary.is_file():
        bin_ = build / "bin"
        includes = [f"-I{root / d}" for d in ("include", "src", "common", "ggml/include", "vendor")]
        libraries = ["-lllama-common", "-lllama", "-lggml", "-lggml-base", "-lggml-cpu"]
        _run(["c++", "-std=c++17", "-O2", "-o", binary, SOURCE, *includes, f"-L{bin_}", *libraries,
              f"-Wl,-rpath,{bin_}"], "building dflash_ref's llama.cpp reader")  # fmt: skip
    return binary


def failure(stderr: str) -> str:
    """What a failed llama.cpp run says went wrong: its assertion or error line, else its last line."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    told = [line for line in lines if "GGML_ASSERT" in line or " error" in line.lower() or line.startswith("error")]
    return (told or lines or ["(no message)"])[-1]


def convert(root: Path, target_dir: Path, draft_dir: Path, out: Path) -> tuple[Path, Path]:
    """(target.gguf, draft.gguf): a target and a draft folder (a bundle's) through llama.cpp's own converter, f32."""
    env = {"PYTHONPATH": os.pathsep.join([str(root / "gguf-py"), os.environ.get("PYTHONPATH", "")])}
    target, draft = out / "target.gguf", out / "draft.gguf"
    converter = [sys.executable, root / "convert_hf_to_gguf.py"]
    for args, what in (
        ([target_dir, "--outtype", "f32", "--outfile", target], "the target"),
        ([draft_dir, "--target-model-dir", target_dir, "--outtype", "f32", "--outfile", draft], "the draft"),
    ):
        try:
            _run([*converter, *args], f"converting {what}", env=env)
        except RuntimeError as e:
            raise NotApplicable(f"llama.cpp's converter refuses this bundle ({what}): {e}") from None
    return target, draft


# ggml's tensors are (ne0, ne1, ne2): ne0 fastest. In numpy's order: (ne2, ne1, ne0) for these, (ne1, ne0) else
THREE_D = ("Qcur", "Kcur", "Vcur", "Kcur_injected", "Vcur_injected", "kq_soft_max")


def read_dump(path: Path) -> list[tuple[str, np.ndarray]]:
    """llamacpp_run's records: (name, values), values in numpy's order: a named 3-d tensor (THREE_D) as
    (ne2, ne1, ne0), e.g. Qcur as (L, H, d_h) and kq_soft_max as (H, L_q, cells); any other as (ne1, ne0)."""
    records = []
    with open(path, "rb") as f:
        while header := f.read(4):
            (n,) = struct.unpack("<I", header)
            name = f.read(n).decode()
            f.read(4)  # n_dims: always 4
            ne = struct.unpack("<4q", f.read(32))
            (count,) = struct.unpack("<Q", f.read(8))
            values = np.frombuffer(f.read(4 * count), dtype="<f4")
            base = name.split("/", 1)[-1].rsplit("-", 1)[0]
            shape = (ne[2], ne[1], ne[0]) if base in THREE_D else (ne[1] * ne[2] * ne[3], ne[0])
            records.append((name, values.reshape(shape) if count else values))
    return records


class LlamaCppPort(Port):
    """run(bundle) → the tensors llama.cpp computed, keyed as the bundle's. Its DFlash implementation drafts
    every block whole (block_size positions) and keeps the proposals that fit: the last, shrunk block of
    the reference is a design variant, `last_block=full-then-truncate`."""

    name = "llamacpp"
    reads_muse = False  # a Muse Glimmer draft folder is transformers' format: n/a
    skip = SKIP
    variants = {"last_block": "full-then-truncate"}

    def sampler(self, bundle, verifier: str):
        raise ValueError(
            "llamacpp runs one greedy sequence through a loop of ours; llama.cpp's sampling is its server's: "
            "verify --sampling --impl llama-server --verifier match"
        )

    def run(self, bundle) -> dict:
        root = tree()
        binary = program(root)
        draft_config = bundle.config("draft")
        block = draft_config["block_size"]
        inputs = bundle.inputs
        with tempfile.TemporaryDirectory() as scratch:
            target, draft = convert(root, bundle.target_dir, bundle.draft_dir, Path(scratch))
            dump = Path(scratch) / "dump.bin"
            context = len(inputs["input_ids"]) + inputs["max_new_tokens"] + 2 * block + 16
            args = [binary, "--prompt-ids", ",".join(map(str, inputs["input_ids"])),
                    "--max-new", inputs["max_new_tokens"], "--dump", dump,
                    "--stop-ids", ",".join(map(str, inputs["stop_token_ids"] or [])) or "-1",
                    "-m", target, "-md", draft, "--spec-type", "draft-dflash", "--spec-draft-n-max", block - 1,
                    "--temp", "0", "-c", context, "-b", max(context, 512), "-ub", max(context, 512),
                    "-fa", "off", "-t", os.cpu_count() or 1, *F32_CACHES]  # fmt: skip
            proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=TIMEOUT)
            if proc.returncode == 3:
                said = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
                raise NotApplicable(f"llama.cpp refuses this bundle: {said}")
            if proc.returncode != 0:
                told = failure(proc.stderr)
                raise EngineFailed(f"llama.cpp failed on {bundle.name} (exit {proc.returncode}): {told}")
            return keyed(read_dump(dump), draft_config)


def keyed(records: list, draft_config: dict) -> dict:
    """The reference's keys from llama.cpp's records (llamacpp_run.cpp's file), step by step.

    The file's segments: the prefill (the target's pass and its features), the injection of its features
    into the draft's cache ("#process"), then per step the draft pass ("#draft", its proposals), the target's
    verify ("#verify", its logits and features) and the injection of the verified positions, closed by the
    tokens the verify kept (τ accepted, then the bonus): the first τ + 1 rows are the next context."""
    segments, current = [], {"#": "start"}
    for name, values in records:
        if name.startswith("#"):
            segments.append(current)
            current = {"#": name}
        else:
            current.setdefault(name, []).append(values)
    segments.append(current)

    def one(segment: dict, name: str) -> np.ndarray:
        return segment[name][0]

    def ids(segment: dict, name: str) -> list[int]:
        return [int(t) for t in one(segment, name).reshape(-1)]

    prompt, output = ids(segments[0], "=prompt"), ids(segments[-1], "=output")
    layer_ids = np.array(ids(segments[0], "=layer_ids"), dtype=np.int64) - 1  # it names the inputs of layer l + 1
    out = outputs({}, prompt, output, layer_ids)  # x_0: the first token it sampled, off the prefill's logits
    injections = [s for s in segments if s["#"] == "#process"]
    drafts = [s for s in segments if s["#"] == "#draft"]
    verifies = [s for s in segments if s["#"] == "#verify"]
    prefill = next(s for s in segments if s["#"] == "#prefill")
    features = [prefill, *verifies]  # the target pass feeding step s
    if "tgt/result_output" in prefill:  # the prompt's pass: its last row (the only one it outputs) is x_0's
        out[key_for("prefill_logits")] = one(prefill, "tgt/result_output")[-1]
    top_k = draft_config.get("dflash_config", {}).get("selector_top_k") or draft_config.get("selector_top_k")
    cached_k: list[list[np.ndarray]] = [[] for _ in range(draft_config["num_hidden_layers"])]
    for step, (drafted, verified) in enumerate(zip(drafts, verifies)):
        put = functools.partial(_put, out, step)
        valid = len(prompt) if step == 0 else len(ids(injections[step], "=accepted"))  # τ + 1 of the step before
        accepted = ids(injections[step + 1], "=accepted")
        injection = injections[step]
        put("target_hidden", one(features[step], "=target_features")[:valid])
        put("context", one(injection, "dft/inp_g_embeddings")[:valid])
        put("noise_embedding", one(drafted, "dft/inp_noise_embd"))
        for i, cached in enumerate(cached_k):
            cached.append(one(injection, f"dft/Kcur_injected-{i}")[:valid])  # (L_c, H_kv, d_h), after KNorm and RoPE
            keys = np.concatenate([*cached, one(drafted, f"dft/Kcur-{i}")])
            values = np.concatenate([one(injection, f"dft/Vcur_injected-{i}")[:valid], one(drafted, f"dft/Vcur-{i}")])
            put("q_rot", _heads_first(one(drafted, f"dft/Qcur-{i}")), i)
            put("k_rot", _heads_first(keys), i)
            put("v", _heads_first(values), i)
            put("pattern", one(drafted, f"dft/kq_soft_max-{i}")[:, :, : keys.shape[0]], i)  # KV cells in position order
            if f"dft/attn_conv_in-{i}" in drafted:  # DFlash 2
                put("attn_conv_in", one(drafted, f"dft/attn_conv_in-{i}"), i)
                put("attn_conv_out", one(drafted, f"dft/attn_conv_out-{i}"), i)
                put("mlp_conv_in", one(drafted, f"dft/ffn_conv_in-{i}"), i)
                put("mlp_conv_out", one(drafted, f"dft/ffn_conv_out-{i}"), i)
            put("layer_out", one(drafted, f"dft/l_out-{i}"), i)
        proposals = ids(drafted, "=draft")
        logits = one(drafted, "dft/result_output")  # (L_q, V)
        put("final_hidden", one(drafted, "dft/result_norm"))
        put("logits", logits[1 : 1 + len(proposals)])
        if top_k:
            _selector(put, one(drafted, "dft/dflash2_lattice"), logits, proposals, top_k)
        put("draft_tokens", np.array(proposals, dtype=np.int64))
        target_logits = one(verified, "tgt/result_output")  # (L_q, V): every verified row
        put("verify_logits", target_logits)
        put("posterior", target_logits.argmax(-1).astype(np.int64))
        put("acceptance_length", np.array(len(accepted) - 1, dtype=np.int64))
        put("bonus", np.array(accepted[-1], dtype=np.int64))
    return out


def _put(out: dict, step: int, stage: str, value: np.ndarray, layer: int | None = None) -> None:
    out[key_for(stage, step, layer)] = value


def _heads_first(x: np.ndarray) -> np.ndarray:
    """(L, H, d_h) → (H, L, d_h)."""
    return np.ascontiguousarray(x.transpose(1, 0, 2))


def _selector(put, lattice: np.ndarray, logits: np.ndarray, proposals: list[int], top_k: int) -> None:
    """DFlash 2's candidates, unary and pair scores from llama.cpp's lattice: each block position's row holds
    its K candidate ids, then score[predecessor][candidate] = unary + pair for each of the K candidates the
    position before could have chosen (one predecessor, the anchor, at position 1). The unary score is the
    logit at the candidate (its `result_output`), the pair score the rest of the score of the predecessor the
    path took."""
    candidates, unary, pair = [], [], []
    chosen = 0  # the anchor's row: all rows are the anchor's at position 1
    for t, token in enumerate(proposals, 1):
        row = lattice[t]
        ids = row[:top_k].astype(np.int64)
        scores = row[top_k : top_k + top_k * top_k].reshape(top_k, top_k)[chosen]
        z = logits[t, ids]
        candidates.append(ids), unary.append(z), pair.append(scores - z)
        chosen = int(np.flatnonzero(ids == token)[0])
    put("candidates", np.stack(candidates))
    put("unary", np.stack(unary).astype(np.float32))
    put("pair", np.stack(pair).astype(np.float32))
