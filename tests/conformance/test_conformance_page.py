"""`verify --html` (conformance/page.py): the report as one self-contained page. Mutant ports of the reference
(a subclass each, never an edit of the library) diverge at the attention weights, at Q after RoPE, at a
missing tensor, at a shape and at a draft token; the page says where, shows both tensors with the tokens of
the walkthrough bundle on their axes, and gives the same bytes twice. In headless Chromium (Selenium, as
tests/test_viewer.py): no console error, the heatmaps drawn, the head picker redraws them, a screenshot.
The command line: --html writes the page and keeps the exit code; a path it cannot write is refused first.
"""

from __future__ import annotations

import base64
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dflash_ref.conformance import Check, Report, find_bundles, verify
from dflash_ref.conformance.golden import generate_golden
from dflash_ref.conformance.page import MAX_CHIPS, MAX_SIDE, MAX_VALUES, write_report_html
from dflash_ref.conformance.ports.reference import ReferenceAdapter
from dflash_ref.conformance.stages import STAGE, TITLES, key_for
from dflash_ref.viewer import browser

ROOT = Path(__file__).resolve().parents[2]
PATTERN = key_for("pattern", 0, 0)  # step 0, layer 0: where the causal mutant diverges first

pytestmark = pytest.mark.usefixtures("one_thread_module")


# -- mutant ports -----------------------------------------------------------------------------------------------


class CausalBlock(ReferenceAdapter):
    """The block attends causally: the first divergence is the attention weights (H_q, L_q, L_k)."""

    name = "causal-block"

    def load(self, bundle):
        target, draft = super().load(bundle)
        for layer in draft.layers:
            layer.self_attn.is_causal = True
        return target, draft


class WrongTheta(ReferenceAdapter):
    """RoPE at θ = 1e6 where the bundle says 1e4: the first divergence is Q after RoPE (H_q, L_q, d_h)."""

    name = "wrong-theta"

    def load(self, bundle):
        target, draft = super().load(bundle)
        draft.rotary_emb.rope_theta = 1e6
        draft.rotary_emb._inv_freq.clear()
        return target, draft


class Changed(ReferenceAdapter):
    """The reference, its tensors changed after the run by `change(out)`."""

    def __init__(self, name: str, change) -> None:
        self.name, self.change = name, change

    def run(self, bundle):
        out = super().run(bundle)
        self.change(out)
        return out


def without_q_rot(out):  # Q after RoPE never handed over: missing
    for key in [k for k in out if k.endswith("self_attn.hook_q_rot")]:
        del out[key]


def one_key_short(out):  # the first layer's weights over one key fewer: a shape that differs
    out[PATTERN] = out[PATTERN][:, :, 1:]


def second_proposal_off(out):  # step 0's second proposal one token off: integers, drawn as chips
    tokens = np.array(out["step0/draft_tokens"])
    tokens[1] += 1
    out["step0/draft_tokens"] = tokens


def crash(out):  # the port raises: no tensor at all
    raise RuntimeError("the port fell over")


PORTS = {
    "causal": CausalBlock(),
    "theta": WrongTheta(),
    "missing": Changed("missing-q-rot", without_q_rot),
    "shape": Changed("one-key-short", one_key_short),
    "tokens": Changed("wrong-proposal", second_proposal_off),
    "raises": Changed("raises", crash),
    "reference": "reference",
}


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("golden")
    generate_golden(out, names=["walkthrough", "multiround"])
    return out


@pytest.fixture(scope="module")
def bundles(golden):
    return {b.name: b for b in find_bundles(golden)}


@pytest.fixture(scope="module")
def reports(golden) -> dict[str, Report]:
    return {name: verify(port, golden) for name, port in PORTS.items()}


@pytest.fixture(scope="module")
def pages(golden, reports, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pages")
    return {name: write_report_html(r, find_bundles(golden), folder / f"{name}.html") for name, r in reports.items()}


def page_data(path: Path) -> dict:
    """The JSON the page's script draws from."""
    found = re.search(r'<script type="application/json" id="divergence-data">(.*?)</script>', path.read_text())
    return json.loads(found.group(1).replace("<\\/", "</"))


def stored(panel: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(panel["data"]), dtype="<f4").reshape(panel["shape"])


def label(bundle, p: int, start: int) -> str:
    """What the page should call position p of a step starting at `start`, from the manifest's tokens."""
    tokens, ids = bundle.manifest["tokenizer"]["tokens"], bundle.expected["output_ids"]
    token = ids[p] if p <= start else bundle.manifest["tokenizer"]["mask_token_id"]
    return f"{p} {tokens[token]}"


# -- the page's text --------------------------------------------------------------------------------------------


def test_the_causal_block_is_shown_at_the_attention_weights_with_the_tokens(reports, pages, bundles):
    report, text = reports["causal"], pages["causal"].read_text()
    first = report.first_failure
    assert (first.bundle, first.stage, first.step, first.layer) == ("walkthrough", "pattern", 0, 0)
    assert "First divergence: walkthrough · step 0 · layer 0 · attention weights" in text
    assert html.escape(first.hint) in text and "the block attends causally" in text
    meaning, layout = STAGE["pattern"].meaning, STAGE["pattern"].layout
    assert html.escape(meaning) in text and layout in text
    for stage in {c.stage for c in report.checks if c.bundle == "walkthrough"}:  # every stage's row, by title
        assert f"<td>{html.escape(TITLES[stage])}</td>" in text
    assert "attention weights</td>" in text and "FAIL ← first divergence" in text
    assert html.escape(report.text().rsplit("\n\n", 1)[-1].strip()) in text  # the verdict, as the terminal's

    walkthrough = bundles["walkthrough"]
    data = page_data(pages["causal"])
    expected, got = data["panels"]["expected"], data["panels"]["got"]
    assert np.array_equal(stored(expected), first.expected) and np.array_equal(stored(got), first.got)
    heads, queries, keys = first.expected.shape
    start = keys - queries  # 3: the prompt "the cat sat", then the block [x_0, mask, mask, mask]
    assert start == len(walkthrough.inputs["input_ids"]) == 3
    assert expected["x"]["text"] == [label(walkthrough, p, start) for p in range(keys)]
    assert expected["x"]["text"][:4] == ["0 the", "1 cat", "2 sat", "3 ran"]  # x_0 = "ran", the first committed
    assert expected["y"]["text"] == [label(walkthrough, start + i, start) for i in range(queries)]
    assert expected["y"]["text"][1] == "4 <mask>"
    assert expected["picks"] == ["query head 0", "query head 1"] and data["picker"]
    assert data["diff"] is not None and data["scale"] == "Viridis"
    assert re.search(r'<option value="1"( selected)?>query head 1</option>', text)
    assert "context 0–2: the cat sat" in text  # the positions, in words


def test_q_after_rope_is_shown_per_head_by_head_dimension(reports, pages, bundles):
    first, data = reports["theta"].first_failure, page_data(pages["theta"])
    assert (first.stage, first.step, first.layer) == ("q_rot", 0, 0)
    assert "rope_theta" in first.hint and html.escape(first.hint) in pages["theta"].read_text()
    expected = data["panels"]["expected"]
    assert np.array_equal(stored(expected), first.expected) and np.array_equal(stored(data["panels"]["got"]), first.got)
    heads, rows, head_dim = first.expected.shape
    assert expected["picks"] == [f"query head {h}" for h in range(heads)]
    assert expected["x"]["title"] == "head dim" and expected["x"]["text"] == [str(i) for i in range(head_dim)]
    assert expected["y"]["text"] == [label(bundles["walkthrough"], 3 + i, 3) for i in range(rows)]  # the block


def test_a_missing_tensor_shows_the_reference_alone(reports, pages, bundles):
    first, text = reports["missing"].first_failure, pages["missing"].read_text()
    assert (first.status, first.stage) == ("missing", "q_rot")
    assert "not produced by the candidate" in text and "the port gave no array here" in text
    data = page_data(pages["missing"])
    assert sorted(data["panels"]) == ["expected"] and data["diff"] is None
    assert np.array_equal(stored(data["panels"]["expected"]), bundles["walkthrough"].expected[first.key])


def test_shapes_that_differ_are_said_and_each_drawn_with_its_own_axes(reports, pages):
    first, text = reports["shape"].first_failure, pages["shape"].read_text()
    assert (first.stage, first.detail) == ("pattern", "shape (2, 4, 6), expected (2, 4, 7)")
    assert "The shapes differ: the reference&#x27;s is (2, 4, 7), the port&#x27;s (2, 4, 6) (axis 2: 7 vs 6)" in text
    data = page_data(pages["shape"])
    assert data["diff"] is None and 'id="panel-diff"' not in text
    assert data["panels"]["expected"]["x"]["text"][0] == "0 the"  # the reference's keys by token
    assert data["panels"]["got"]["x"]["text"] == [str(i) for i in range(6)]  # the port's by index alone
    assert np.array_equal(stored(data["panels"]["got"]), first.got)


def test_integers_are_chips_with_their_tokens_and_the_differing_one_marked(reports, pages, bundles):
    first, text = reports["tokens"].first_failure, pages["tokens"].read_text()
    assert first.stage == "draft_tokens" and 'id="divergence-data"' not in text  # chips: no heatmap, no data
    tokens = bundles["walkthrough"].manifest["tokenizer"]["tokens"]
    e, g = int(first.expected[1]), int(first.got[1])
    assert f'<span class="chip differ" title="index 1: {e}">{html.escape(tokens[e])}<sub>{e}</sub></span>' in text
    assert f'<span class="chip differ" title="index 1: {g}">{html.escape(tokens[g])}<sub>{g}</sub></span>' in text
    assert text.count("chip differ") == 2


def test_a_port_that_raised_is_said_without_tensors(reports, pages):
    text = pages["raises"].read_text()
    assert reports["raises"].first_failure.status == "error"
    assert "First divergence: walkthrough · " in text and "RuntimeError: the port fell over" in text
    assert "crashed: RuntimeError: the port fell over" in text  # in the bundle's summary too
    assert "divergence-data" not in text and 'class="chip' not in text


def test_a_passing_port_gets_the_summary_and_pass_alone(reports, pages):
    assert reports["reference"].passed
    text = pages["reference"].read_text().split("<body>", 1)[1]
    assert 'class="verdict pass"' in text and "PASS" in text
    assert 'id="divergence"' not in text and "divergence-data" not in text and "FAIL" not in text
    assert "<h2>bundle walkthrough</h2>" in text and "<h2>bundle multiround</h2>" in text


def test_the_same_report_gives_the_same_bytes_and_the_page_needs_no_network(golden, reports, pages, tmp_path):
    again = write_report_html(reports["causal"], golden, tmp_path / "again.html")
    assert again.read_bytes() == pages["causal"].read_bytes()
    rerun = write_report_html(verify(CausalBlock(), golden), golden, tmp_path / "rerun.html")
    assert rerun.read_bytes() == pages["causal"].read_bytes()  # a second run of the port: the same page
    text = again.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)  # everything inlined
    with pytest.raises(ValueError, match="is a folder"):
        write_report_html(reports["causal"], golden, tmp_path)


def test_a_large_tensor_is_shown_as_a_window_the_page_names(tmp_path):
    """Logits (γ, V) of a real vocabulary: a window around the largest difference, and the page says which;
    a long sequence: chips around the first difference. No bundle: positions by index."""
    rng = np.random.default_rng(0)
    expected = rng.standard_normal((3, 49152)).astype(np.float32)
    got = expected.copy()
    got[1, 30000] += 5.0
    logits = Check("big", key_for("logits", 0), "logits", 0, None, "FAIL", 5.0, 5.0, 1e-4, expected=expected, got=got)
    path = write_report_html(Report("big-port", [logits]), [], tmp_path / "big.html")
    data, text = page_data(path), path.read_text()
    assert data["panels"]["expected"]["shape"] == [1, 3, MAX_SIDE]
    columns = data["panels"]["expected"]["x"]["values"]
    assert columns == list(range(30000 - MAX_SIDE // 2, 30000 + MAX_SIDE // 2))
    assert f"columns {columns[0]}–{columns[-1]} of 49152 (around the largest |got − expected|)" in text
    assert f"at most {MAX_SIDE} rows and {MAX_SIDE} columns of a slice, {MAX_VALUES:,} values of a tensor" in text
    assert np.array_equal(stored(data["panels"]["got"])[0, 1], got[1, columns[0] : columns[-1] + 1])

    keys = rng.standard_normal((32, 1000, 128)).astype(np.float32)  # K after RoPE of a long context: 8 heads kept
    shifted = keys.copy()
    shifted[20, 600, 7] += 1.0
    k_rot = Check("big", key_for("k_rot", 0, 0), "k_rot", 0, 0, "FAIL", 1.0, 0.2, 1e-4, expected=keys, got=shifted)
    path = write_report_html(Report("big-port", [k_rot]), [], tmp_path / "k.html")
    data, text = page_data(path), path.read_text()
    got_panel = data["panels"]["got"]
    assert got_panel["shape"] == [MAX_VALUES // (MAX_SIDE * 128), MAX_SIDE, 128] == [8, 256, 128]
    assert got_panel["picks"] == [f"KV head {h}" for h in range(16, 24)]
    assert '<option value="4" selected>KV head 20</option>' in text  # opened at the head that differs
    assert got_panel["y"]["values"] == list(range(600 - 128, 600 + 128))
    assert np.array_equal(stored(got_panel), shifted[16:24, 472:728])

    ids = np.arange(1000, dtype=np.int64)
    wrong = ids.copy()
    wrong[700] = 1
    output = Check("big", "output_ids", "output_ids", None, None, "FAIL", expected=ids, got=wrong)
    text = write_report_html(Report("big-port", [output]), [], tmp_path / "ids.html").read_text()
    low = 700 - MAX_CHIPS // 2
    assert f"elements {low}–{low + MAX_CHIPS - 1} of 1000 shown" in text and text.count("chip differ") == 2
    assert text.count('<span class="chip') == 2 * MAX_CHIPS


def test_the_page_module_imports_no_torch(tmp_path):
    script = (
        "import sys\nimport dflash_ref.conformance.page\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nprint('numpy only: ok')"
    )
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and "numpy only: ok" in done.stdout, done.stderr


# -- the command line -------------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash_ref", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_verify_html_writes_the_page_and_keeps_the_exit_code(golden, bundles, tmp_path):
    dump = {f"{b.name}/{k}": v for b in bundles.values() for k, v in b.expected.items()}
    dump[f"walkthrough/{PATTERN}"] = dump[f"walkthrough/{PATTERN}"] * 0.9
    np.savez(tmp_path / "port.npz", **dump)
    out = tmp_path / "deep" / "report.html"  # its folder made
    done = run_cli("verify", "--dump", str(tmp_path / "port.npz"), "--bundle", str(golden), "--html", str(out))
    assert done.returncode == 1, done.stderr
    assert "FIRST DIVERGENCE: walkthrough · step 0 · layer 0 · attention weights" in done.stdout
    assert f"wrote {out}" in done.stdout
    text = out.read_text()
    assert "First divergence: walkthrough · step 0 · layer 0 · attention weights" in text
    assert page_data(out)["panels"]["expected"]["x"]["text"][:3] == ["0 the", "1 cat", "2 sat"]


@pytest.mark.parametrize("how", ["under a file", "a folder"])
def test_an_html_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, how):
    (tmp_path / "afile").write_text("")
    where = tmp_path / "afile" / "report.html" if how == "under a file" else tmp_path
    # the dump does not exist: had verify run first, the error would name it
    done = run_cli("verify", "--dump", str(tmp_path / "none.npz"), "--html", str(where))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"verify: --html {where}") and "none.npz" not in lines[0]
    assert "is a file, not a folder" in lines[0] if how == "under a file" else "is a folder" in lines[0]
    done = run_cli("verify", "--impl", "reference", "--sampling", "--html", str(tmp_path / "r.html"))
    assert done.returncode == 2 and "--html goes with verify impl and dump, not verify sampling impl" in done.stderr
    assert not (tmp_path / "r.html").exists()


# -- in a real browser ------------------------------------------------------------------------------------------


def errors(chrome) -> list[str]:
    return [e["message"] for e in chrome.get_log("browser") if e["level"] == "SEVERE"]


def z(chrome, panel: str) -> np.ndarray:
    return np.array(chrome.execute_script(f"return document.getElementById('panel-{panel}').data[0].z;"), float)


@pytest.mark.parametrize("which", ["causal", "theta"])
def test_the_heatmaps_are_drawn_and_the_head_picker_redraws_them(chrome, reports, pages, which):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    first = reports[which].first_failure
    chrome.get(pages[which].resolve().as_uri())
    assert errors(chrome) == []
    assert len(chrome.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 3  # reference, port, difference
    picker = Select(chrome.find_element(By.ID, "pick"))
    diff = np.abs(first.got.astype(np.float64) - first.expected)
    opened = int(np.unravel_index(np.argmax(diff), diff.shape)[0])  # the head of the largest difference
    assert picker.first_selected_option.text == f"query head {opened}"
    assert np.allclose(z(chrome, "expected"), first.expected[opened])
    other = 1 - opened
    picker.select_by_visible_text(f"query head {other}")
    assert np.allclose(z(chrome, "expected"), first.expected[other]) and np.allclose(z(chrome, "got"), first.got[other])
    assert np.allclose(z(chrome, "diff"), first.got[other].astype(np.float64) - first.expected[other], atol=1e-6)
    title = chrome.execute_script("return document.getElementById('panel-got').layout.title.text;")
    assert title == f"port (got: {reports[which].impl}) · query head {other}"
    assert errors(chrome) == []


def test_screenshot_of_the_causal_block(pages, tmp_path):
    """How Chromium draws the causal block's page (browser.screenshot, as `view --screenshot`): the weights'
    Viridis cells, the hint's yellow box."""
    if browser.chromium() is None:
        pytest.skip("no Chromium here: apt-get install chromium (as the README says)")
    from matplotlib.image import imread

    png = browser.screenshot(pages["causal"], tmp_path / "causal.png", width=1400, height=1000)
    pixels = imread(png)[..., :3]
    assert pixels.shape[:2] == (1000, 1400)
    viridis_dark = np.all(np.abs(pixels - np.array([0x44, 0x01, 0x54]) / 255) < 0.08, axis=-1)  # weight ≈ 0
    hint = np.all(np.abs(pixels - np.array([0xFF, 0xF3, 0xCD]) / 255) < 0.02, axis=-1)  # the hint's background
    assert viridis_dark.sum() > 500 and hint.sum() > 5000
