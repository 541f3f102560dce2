"""Real servers checked from outside (`verify --endpoint`): vLLM's OpenAI server, as shipped and with its CPU k_norm bug
patched out, and llama-server, each started on the loopback by conformance/endpoint/launch.py. They need the engines
set up (DFLASH_REF_VLLM_PYTHON, LLAMA_CPP_DIR: ENGINES.md) and minutes each, so .ci/engines runs this file, not
.ci/run; without the engines it skips."""

from __future__ import annotations

import json
import os

import pytest

from dflash_ref.conformance.endpoint import verify_endpoint
from dflash_ref.conformance.endpoint.launch import llama_server, vllm_server
from dflash_ref.conformance.golden import generate_golden
from dflash_ref.drafts.shipped import SHIPPED_DFLASH1
from dflash_ref.loading.smollm2 import chat_ids, converted_folder, load_smollm2_tokenizer

VLLM = pytest.mark.skipif(not os.environ.get("DFLASH_REF_VLLM_PYTHON"), reason="vLLM is not set up here")
LLAMA = pytest.mark.skipif(not os.environ.get("LLAMA_CPP_DIR"), reason="llama.cpp is not set up here")
CHATS = ("Write a short poem about the sea.", "Explain what a hash table is in two sentences.",
         "List three fruits that are red.", "What is the capital of France? Answer in one sentence.")  # fmt: skip
quiet = lambda line: None  # noqa: E731


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """SmolLM2-135M-Instruct and its shipped DFlash 1 draft, with 4 chat prompts of 48 new tokens."""
    tokenizer, path = load_smollm2_tokenizer(), tmp_path_factory.mktemp("chats") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"name": f"chat{i}", "prompt_ids": chat_ids(tokenizer, p)[0].tolist(),
                                        "max_tokens": 48}) + "\n" for i, p in enumerate(CHATS)))  # fmt: skip
    return converted_folder(), SHIPPED_DFLASH1, path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The engine-shaped DFlash 1 pair's bundles: one sequence, stops, and its serving scenarios."""
    out = tmp_path_factory.mktemp("pair")
    names = ["engine_multiround", "engine_stop_inside", "engine_stop_bonus", "serve_prefix_cache.r0",
             "serve_prefix_cache.r1", "serve_prefix_cache.r2", "serve_chunked_prefill.r0", "serve_arrivals.r0",
             "serve_arrivals.r1", "serve_arrivals.r2", "serve_arrivals.r3"]  # fmt: skip
    generate_golden(out, names)
    return out


def check(server, folders: tuple, **kwargs):
    target, draft, prompts = folders
    with server(target, draft) as url:
        return verify_endpoint(url, target=target, draft=draft, prompts=prompts, progress=quiet, **kwargs)


@VLLM
def test_vllm_as_shipped_gives_the_targets_output_and_its_k_norm_bug_shows_as_acceptance_below_dflashs(chats):
    report = check(vllm_server, chats)
    assert all(r.output == "the reference's output" for r in report.results), report.text()
    low = [r for r in report.results if r.status == "FAIL"]
    assert low and all(r.accepted < r.bounds[0] and "the draft saw another context" in r.acceptance for r in low)


@VLLM
def test_vllm_with_its_k_norm_bug_patched_out_is_dflash_under_every_condition(chats, pair):
    report = check(lambda t, d: vllm_server(t, d, fixed=True), chats, conditions=["alone", "repeat", "concurrent"])
    assert report.passed() and all(r.status == "pass" for r in report.results), report.text()
    first = next(b for b in sorted(pair.iterdir()) if b.is_dir())
    with vllm_server(first / "target", first / "draft", fixed=True) as url:
        bundles = verify_endpoint(url, pair, progress=quiet)
    assert bundles.passed() and all(r.status == "pass" for r in bundles.results), bundles.text()


@LLAMA
def test_llama_server_is_dflash_under_every_condition(chats, pair):
    report = check(llama_server, chats, conditions=["alone", "repeat", "concurrent"])
    assert report.passed() and all(r.status == "pass" for r in report.results), report.text()
    first = next(b for b in sorted(pair.iterdir()) if b.is_dir())
    with llama_server(first / "target", first / "draft") as url:
        bundles = verify_endpoint(url, pair, progress=quiet)
    assert bundles.passed(), bundles.text()
