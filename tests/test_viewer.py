"""The trace viewer (viewer/): what it takes from a trace, checked against the trace itself; the clear errors
for a trace it cannot show; and the page in a real browser (headless Chromium driven by Selenium): no
console error, the slider and the pickers redraw the heatmap, a screenshot with the plots drawn."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_ref.decoding import generate, spec_generate
from dflash_ref.drafts.oracle import OracleDraft
from dflash_ref.tour.demo import PROMPT, VOCAB, demo_models, encode
from dflash_ref.tour.dflash2 import dflash2_models
from dflash_ref.trace import Trace, tracing
from dflash_ref.viewer import browser, name_tokens, payload, write_html

ROOT = Path(__file__).resolve().parents[1]


def decode_loop() -> Trace:
    """The demo pair on the seed's prompt, 16 tokens: 6 steps, τ forced to 1, 3, 0, 2, 3, 0 (the draft network
    runs, OracleDraft replaces its proposals), draft and target attention traced."""
    target, draft = demo_models()
    ids = encode(PROMPT)
    reference = generate(target, ids, 16).output_ids
    with tracing(draft, target, ["*hook_pattern", "draft.hook_target_hidden"], meta={"vocab": VOCAB}) as trace:
        out = spec_generate(
            OracleDraft(draft, reference, accept=[1, 3, 0, 2, 3]), target, ids, 16, on_step=trace.on_step
        )
    trace.meta["output_ids"] = out.output_ids[0].tolist()  # the prompt's tokens too, for the labels
    return trace


@pytest.fixture(scope="module")
def loop():
    return decode_loop()


def stored(array: dict, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(array["data"]), dtype=np.dtype(dtype).newbyteorder("<")).reshape(
        array["shape"]
    )


def test_the_payload_says_what_the_trace_holds(loop):
    trace = loop
    data = payload.build(trace, precision="float32")
    assert len(data["steps"]) == len(trace) == 6
    assert [s["tau"] for s in data["steps"]] == [r.acceptance_length for r in trace.records] == [1, 3, 0, 2, 3, 0]
    step = data["steps"][1]
    record = trace.records[1]
    assert step["block"] == [VOCAB[t] for t in record.block_ids]
    assert step["bonus"] == VOCAB[record.bonus] and step["produced"] == record.produced
    assert step["caches"]["draft"] == [record.draft_cache_before, record.draft_cache_after_draft, record.start]
    # every position of the sequence labelled by its token, the prompt's too (meta output_ids)
    output = loop.meta["output_ids"]
    assert data["positions"][: len(output)] == [VOCAB[t] for t in output]
    assert data["draft"]["layers"] == [0, 1] and data["target"]["layers"] == list(range(6))
    for s in range(len(trace)):  # float32: the trace's weights exactly; float16: as rounded
        for which, name in (("draft", payload.DRAFT_PATTERN.format(1)), ("target", payload.TARGET_PATTERN.format(2))):
            exact = trace[name, s].numpy()
            assert np.array_equal(stored(data[which]["patterns"][f"{s},{1 if which == 'draft' else 2}"], "<f4"), exact)
    half = payload.build(trace)
    got = stored(half["draft"]["patterns"]["0,0"], "<f2")
    assert np.array_equal(got, trace.attention(0, 0).numpy().astype(np.float16))
    assert np.abs(got.astype(np.float32) - trace.attention(0, 0).numpy()).max() < 5e-4


def test_chosen_steps_and_layers_only(loop):
    data = payload.build(loop, steps=[4, 2], layers=[1], target_layers=[])
    assert [s["step"] for s in data["steps"]] == [2, 4]
    assert sorted(data["draft"]["patterns"]) == ["0,1", "1,1"] and data["target"]["patterns"] == {}


def test_a_dflash2_trace_carries_its_lattice_and_the_path_taken():
    target, draft, _ = dflash2_models()
    with tracing(draft, names=["draft.candidate_selector.*", "*hook_pattern"], meta={"vocab": VOCAB}) as trace:
        spec_generate(draft, target, encode(PROMPT), 16, on_step=trace.on_step)
    data = payload.build(trace)
    for i, record in enumerate(trace.records):
        lattice = data["lattice"][str(i)]
        candidates = trace["draft.candidate_selector.hook_candidates", i]
        assert lattice["labels"] == [[VOCAB[t] for t in row] for row in candidates.tolist()]
        chosen = [candidates[j, k].item() for j, k in enumerate(lattice["path"])]
        assert chosen == record.draft_tokens  # the path is the proposals, found among the candidates


def test_name_tokens_gives_the_labels_a_tokenizer_would():
    trace = decode_loop()
    trace.meta.pop("vocab")
    name_tokens(trace, lambda i: f"<{i}>", stop_token_ids=[5])
    data = payload.build(trace)
    assert data["steps"][0]["block"] == [f"<{t}>" for t in trace.records[0].block_ids]
    assert all(p is None or p.startswith("<") for p in data["positions"])


def test_viewing_changes_nothing_and_the_same_trace_gives_the_same_file(loop, tmp_path):
    loop.save(tmp_path / "trace")
    before = {f: (tmp_path / "trace" / f).read_bytes() for f in ("trace.json", "activations.safetensors")}
    loaded = Trace.load(tmp_path / "trace")
    one = loaded.to_html(tmp_path / "one.html")
    two = write_html(Trace.load(tmp_path / "trace"), tmp_path / "two.html")
    assert one.read_bytes() == two.read_bytes()
    loaded.save(tmp_path / "again")
    for f, data in before.items():
        assert (tmp_path / "again" / f).read_bytes() == data


def damaged(tmp_path: Path, loop, how: str) -> Path:
    folder = tmp_path / how
    loop.save(folder)
    doc = json.loads((folder / "trace.json").read_text())
    if how == "not-json":
        (folder / "trace.json").write_text('{"format": "dflash_ref.trace/3", "records": [')
    elif how == "newer":
        (folder / "trace.json").write_text(json.dumps({**doc, "format": "dflash_ref.trace/12"}))
    elif how == "records":
        doc["records"][0]["colour"] = "blue"
        (folder / "trace.json").write_text(json.dumps(doc))
    elif how == "tensors":
        (folder / "activations.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{bad")
    elif how == "empty":
        (folder / "trace.json").write_text(json.dumps({**doc, "records": []}))
        Trace().save(tmp_path / "blank")
        shutil.copy(tmp_path / "blank" / "activations.safetensors", folder / "activations.safetensors")
    elif how == "missing":
        (folder / "activations.safetensors").unlink()
    return folder


@pytest.mark.parametrize(
    "how, said",
    [
        ("not-json", "trace.json is damaged: it is not JSON"),
        ("newer", "written by a newer dflash_ref: upgrade to read it"),
        ("records", "its step records do not read"),
        ("tensors", "activations.safetensors is damaged"),
        ("empty", "the trace has no steps"),
        ("missing", "is not a saved trace: activations.safetensors is missing"),
    ],
)
def test_a_trace_the_viewer_cannot_show_is_refused_naming_the_problem(loop, tmp_path, how, said):
    folder = damaged(tmp_path, loop, how)
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "view", str(folder), "--out", str(tmp_path / "v.html")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode != 0 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "v.html").exists()


def test_options_that_name_nothing_in_the_trace_are_refused(loop, tmp_path):
    with pytest.raises(ValueError, match=r"steps \[9\] are not in this trace, which has steps 0 … 5"):
        payload.build(loop, steps=[9])
    with pytest.raises(ValueError, match=r"draft layers \[4\] have no attention weights in this trace"):
        payload.build(loop, layers=[4])
    with pytest.raises(ValueError, match="precision 'int8'"):
        payload.build(loop, precision="int8")
    with pytest.raises(ValueError, match="is a folder"):
        write_html(loop, tmp_path)
    trace = loop.filter()
    trace.activations[2][payload.DRAFT_PATTERN.format(0)] = torch.zeros(2, 3, 9)  # 3 queries where 4 were drafted
    with pytest.raises(ValueError, match=r"step 2's draft layer 0 attention weights have shape \(2, 3, 9\)"):
        payload.build(trace)


# -- in a real browser ------------------------------------------------------------------------------------------


def open_page(chrome, path: Path):
    chrome.get(path.resolve().as_uri())
    chrome.get_log("browser")  # what loading said is checked by the caller through errors()
    return chrome


def errors(chrome) -> list[str]:
    return [e["message"] for e in chrome.get_log("browser") if e["level"] == "SEVERE"]


def heatmap_z(chrome, div: str = "attention"):
    return chrome.execute_script(f"return document.getElementById('{div}').data[0].z;")


def test_the_page_steps_through_the_decode_in_a_browser(chrome, loop, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    path = loop.to_html(tmp_path / "loop.html")
    chrome.get(path.resolve().as_uri())
    assert errors(chrome) == []
    assert chrome.find_element(By.ID, "step-number").text == "step 0 (1 of 6)"
    first = heatmap_z(chrome)
    assert np.allclose(first, loop.attention(0, 0)[0].numpy(), atol=5e-4)  # head 0, decoded from float16
    chrome.find_element(By.ID, "step-slider").send_keys(Keys.ARROW_RIGHT)  # the slider, moved as a user would
    assert chrome.find_element(By.ID, "step-number").text == "step 1 (2 of 6)"
    moved = heatmap_z(chrome)
    assert moved != first and np.allclose(moved, loop.attention(1, 0)[0].numpy(), atol=5e-4)
    assert "τ = 3" in chrome.find_element(By.ID, "step-panel").text
    Select(chrome.find_element(By.ID, "layer")).select_by_visible_text("draft layer 1")
    Select(chrome.find_element(By.ID, "head")).select_by_visible_text("head 1")
    assert np.allclose(heatmap_z(chrome), loop.attention(1, 1)[1].numpy(), atol=5e-4)
    target = np.asarray(heatmap_z(chrome, "target-attention"))
    assert np.allclose(target, loop[payload.TARGET_PATTERN.format(0), 1][0].numpy(), atol=5e-4)
    hover = chrome.execute_script("return document.getElementById('attention').data[0].text[0][0];")
    assert hover.startswith("key 0 ")  # each cell says its key's position and token
    assert errors(chrome) == []


def test_a_damaged_page_says_so_instead_of_a_blank_page(chrome, loop, tmp_path):
    from selenium.webdriver.common.by import By

    path = loop.to_html(tmp_path / "v.html")
    text = path.read_text().replace('"format":"dflash_ref.view/1"', '"format":"dflash_ref.view/9"')
    (tmp_path / "newer.html").write_text(text)
    chrome.get((tmp_path / "newer.html").resolve().as_uri())
    said = chrome.find_element(By.ID, "error").text
    assert 'format "dflash_ref.view/9"; this viewer reads dflash_ref.view/1' in said


def test_screenshot_of_the_walkthrough_viewer(loop, tmp_path):
    """`view --screenshot`: the walkthrough's decode loop as Chromium draws it, its plots there: the heatmap's
    Viridis cells and the caches' lines, not a blank page."""
    if browser.chromium() is None:
        pytest.skip("no Chromium here: apt-get install chromium (as the README says)")
    from matplotlib.image import imread

    loop.save(tmp_path / "trace")
    done = subprocess.run(
        [sys.executable, "-m", "dflash_ref", "view", str(tmp_path / "trace"), "--screenshot", str(tmp_path / "s.png")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pixels = imread(tmp_path / "s.png")[..., :3]
    assert pixels.shape[:2] == (1500, 1400)
    viridis_dark = np.all(np.abs(pixels - np.array([0x44, 0x01, 0x54]) / 255) < 0.08, axis=-1)  # weight ≈ 0
    bluish = np.all(np.abs(pixels - np.array([0x00, 0x74, 0xD9]) / 255) < 0.08, axis=-1)  # the draft cache's line
    assert viridis_dark.sum() > 500 and bluish.sum() > 50
