"""`verify --html FILE`: a verify Report as one self-contained HTML page, the first divergence drawn.

The page holds the verdict (the last paragraph of `Report.text()`), a table per bundle of its stages (passed /
total, worst relative error, status), and, where something failed, the first divergence: the reference's
tensor and the port's side by side with their difference (got − expected), the hint, and the stage's meaning
and layout (stages.STAGES). Why a page: the report's numbers say *that* a tensor differs, a picture says
*how*: a causal block is a triangle of zeros in the attention weights, RoPE taken from the wrong rows is a
band in Q, a wrong token is a red chip.

How a tensor is drawn follows its layout: float tensors of two axes or more as heatmaps (one slice at a time
of a stack, e.g. a head of (H, L, d_h), picked with a <select>), positions labelled with their tokens (the
bundle manifest's `tokenizer.tokens`, the context's tokens being the expected `output_ids`, the block's
[x_0, mask, …, mask]); integers and sequences of one axis as rows of chips, the differing ones marked.

It opens offline: plotly.js is inlined as the trace viewer does it (viewer/page.py `plotly_js`, with the
viewer's style). Float tensors are stored as little-endian float32, base64; a slice of more than MAX_SIDE rows
or columns, or a tensor of more than MAX_VALUES values, is shown as a window around its largest difference, and
the page says which. The same report gives the same bytes (no dates, no random ids).

This module imports numpy and the viewer's page helpers alone (`dflash_ref.conformance` imports no torch), so
`verify --dump … --html` runs where torch is not installed.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import json
import math
from pathlib import Path

import numpy as np

from ..viewer.page import STYLE as VIEWER_STYLE
from ..viewer.page import plotly_js
from .bundle import Bundle, find_bundles
from .report import Check, Report
from .report import title as stage_title
from .stages import STAGE, key_for

__all__ = ["MAX_CHIPS", "MAX_SIDE", "MAX_VALUES", "check_plotly", "render_report", "write_report_html"]

# past these, a window of the tensor around its largest difference: rows and columns of one slice (what a heatmap
# a third of the page wide still shows cell by cell), and values of a tensor (so many slices)
MAX_SIDE = 256
MAX_VALUES = 262_144
MAX_CHIPS = 256  # elements of a sequence drawn as chips; past that, a window around the first difference
MAX_TICKS = 48  # labelled ticks on one axis; past that, every k-th
TOKEN_STAGES = {"first_token", "draft_tokens", "posterior", "bonus", "output_ids", "candidates"}
# the roles an axis may have (each stage's are its record's, Stage.axes), as an axis' title says them
AXIS_TITLES = {
    "context": "context position · token",
    "block": "block position · token",
    "query": "query: block position · token",
    "key": "key: position · token",
    "proposal": "proposal d_i @ position",
    "vocab": "token id · text",
}

STYLE = """
.verdict { font: 13px/1.4 monospace; white-space: pre-wrap; padding: 8px 12px; border-radius: 4px; margin: 8px 0; }
.verdict.pass { background: #d4f5d4; border: 1px solid #2ecc40; }
.verdict.fail { background: #fde0de; border: 1px solid #ff4136; }
table.stages { border-collapse: collapse; margin: 4px 0 8px; font-size: 13px; }
table.stages th, table.stages td { padding: 2px 10px; border-bottom: 1px solid #eee; text-align: left; }
table.stages td.num { text-align: right; font-family: monospace; }
tr.FAIL td.status { color: #b00020; font-weight: 600; }
tr.note td.status { color: #a06000; }
tr.pass td.status { color: #1a7f37; }
tr.first { background: #fff3cd; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0; }
.facts dt { color: #555; } .facts dd { margin: 0; font-family: monospace; white-space: pre-wrap; }
.hint { background: #fff3cd; border-left: 4px solid #e0a800; padding: 6px 10px; margin: 8px 0; }
.shapes { font-weight: 600; color: #b00020; margin: 6px 0; }
.panels { display: flex; flex-wrap: wrap; gap: 8px; }
.panel { flex: 1 1 380px; min-width: 320px; }
.panel h3 { font-size: 13px; margin: 4px 0; }
.chip.differ { background: #fde0de; border-color: #ff4136; font-weight: 600; }
.chip.extra { background: #fde0de; border-color: #ff4136; border-style: dashed; }
.chip sub { color: #777; font-size: 10px; margin-left: 3px; }
.seq { margin: 6px 0 10px; } .seq .row-name { width: 170px; }
"""

SCRIPT = """
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("divergence-data").textContent);
  const picker = document.getElementById("pick");
  const values = {};
  for (const name in data.panels) {  // base64 little-endian float32
    const text = atob(data.panels[name].data), bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    values[name] = new Float32Array(bytes.buffer);
  }
  function rows(name, pick, minus) {  // one slice (pick) of a stack as rows; NaN and ±inf drawn as gaps
    const shape = data.panels[name].shape, r = shape[1], c = shape[2], out = [];
    if (pick >= shape[0]) return null;
    const v = values[name], w = minus ? values[minus] : null;
    for (let i = 0; i < r; i++) {
      const row = new Array(c);
      for (let j = 0; j < c; j++) {
        const k = (pick * r + i) * c + j, x = w ? v[k] - w[k] : v[k];
        row[j] = Number.isFinite(x) ? x : null;
      }
      out.push(row);
    }
    return out;
  }
  function axis(spec, reversed) {
    return { title: { text: spec.title }, tickvals: spec.ticks, ticktext: spec.text, automargin: true,
             autorange: reversed ? "reversed" : true, showgrid: false, zeroline: false };
  }
  function draw(div, panel, z, title, scale, range) {
    const layout = { title: { text: title, font: { size: 13 } }, margin: { t: 40, r: 10, b: 10, l: 10 },
                     height: panel.height, xaxis: axis(panel.x, false), yaxis: axis(panel.y, true) };
    if (z === null) {
      layout.annotations = [{ text: "no such slice in this tensor", showarrow: false, xref: "paper", yref: "paper" }];
      Plotly.react(div, [], layout, { displayModeBar: false, responsive: true });
      return;
    }
    const trace = { type: "heatmap", z: z, x: panel.x.values, y: panel.y.values, colorscale: scale,
                    zmin: range[0], zmax: range[1],
                    hovertemplate: panel.y.title + ": %{y}<br>" + panel.x.title + ": %{x}<br>%{z:.5g}<extra></extra>" };
    Plotly.react(div, [trace], layout, { displayModeBar: false, responsive: true });
  }
  function render() {
    const pick = picker ? Number(picker.value) : 0;
    const label = (name) => data.picker ? " · " + (data.panels[name].picks[pick] || "none") : "";
    for (const name of ["expected", "got"]) {
      if (data.panels[name]) {
        draw("panel-" + name, data.panels[name], rows(name, pick), data.titles[name] + label(name), data.scale,
             data.range);
      }
    }
    if (data.diff) {
      draw("panel-diff", data.panels.expected, rows("got", pick, "expected"), data.titles.diff + label("expected"),
           "RdBu", data.diff);
    }
  }
  if (picker) picker.addEventListener("change", render);
  render();
})();
"""


# -- the API --------------------------------------------------------------------------------------------------


def write_report_html(
    report: Report, bundles: list[Bundle] | str | Path | None, path: str | Path, title: str | None = None
) -> Path:
    """Write the page of `report` to `path` and return the path. `bundles`: the Bundles the report was made
    on, or their path as verify takes it (None: the bundle shipped in the package); they give the tokens
    that label the positions, and the reference's tensor where the port gave none."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give the HTML file to write, e.g. {path / 'report.html'}")
    text = render_report(report, bundles, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def render_report(report: Report, bundles: list[Bundle] | str | Path | None, title: str | None = None) -> str:
    """The whole page of `report` as text (write_report_html writes it)."""
    if bundles is None or isinstance(bundles, (str, Path)):
        bundles = find_bundles(bundles)
    by_name = {b.name: b for b in bundles}
    title = title or f"dflash_ref verify · {report.impl}"
    first = report.first_failure
    text = report.text()
    about, verdict = text.split("\n", 1)[0], text.rsplit("\n\n", 1)[-1].strip()  # its first line, its verdict
    divergence, data = ("", None) if first is None else _divergence(report, first, by_name.get(first.bundle))
    body = [
        f"<h1>{_e(title)}</h1>",
        f'<div class="about">{_e(about)}</div>',
        f'<div class="verdict {"pass" if report.passed else "fail"}" id="verdict">{_e(verdict)}</div>',
        divergence,
        '<section id="summary"><h2>Every stage, by bundle</h2>' + _summary(report, first) + "</section>",
    ]
    scripts = ""
    if data is not None:
        payload = json.dumps(data, separators=(",", ":"), sort_keys=True).replace("</", "<\\/")
        scripts = f'<script type="application/json" id="divergence-data">{payload}</script>\n'
        scripts += f"<script>{SCRIPT}</script>\n"
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_e(title)}</title>\n<style>{VIEWER_STYLE}{STYLE}</style>\n"
        f"<script>{plotly_js()}</script>\n</head>\n<body>\n" + "\n".join(body) + "\n" + scripts + "</body>\n</html>\n"
    )


def check_plotly(flag: str = "--html") -> None:
    """plotly (whose plotly.js the page inlines) is installed, else a ValueError saying how to install it: checked
    before a verification runs (the command line checks the path too, cli.folders.check_output_file)."""
    if importlib.util.find_spec("plotly") is None:
        raise ValueError(
            f"{flag} inlines plotly.js from the plotly package, which is not installed: "
            "pip install 'dflash-ref[viewer]' (or plotly)"
        )


# -- the summary ----------------------------------------------------------------------------------------------


def _summary(report: Report, first: Check | None) -> str:
    """One table per bundle, a row per stage in walk order (passed / total, worst rel error, status), with the
    lines that go with it: variants, an adapter that raised, a bundle not applicable, keys ignored."""
    parts = []
    for bundle in dict.fromkeys(c.bundle for c in report.checks):
        checks = [c for c in report.checks if c.bundle == bundle]
        lines = []
        variants = {k: (v, how) for k, (v, how) in report.variants.get(bundle, {}).items() if how != "reference"}
        if variants:  # declared or detected (the others are the reference's), as the report prints them
            lines.append("variants: " + ", ".join(f"{k} = {v} ({how})" for k, (v, how) in variants.items()))
        lines += [f"crashed: {c.detail}" for c in checks if c.key == "adapter" and c.status == "error"]
        lines += [f"timed out: {c.detail}" for c in checks if c.key == "adapter" and c.status == "timeout"]
        lines += [f"not applicable: {c.detail}" for c in checks if c.key == "bundle"]
        if report.ignored.get(bundle):
            lines.append(f"ignored {len(report.ignored[bundle])} key(s) that name no tensor of this bundle")
        own = report.first_failure_in(checks)
        if own is not None:
            lines.append(f"first divergence here: {own.where} · {stage_title(own.stage)}")
        rows = [_stage_row(row, first) for row in report.stage_rows(bundle)]
        table = (
            '<table class="stages"><tr><th>stage</th><th>passed / total</th><th>worst rel error</th>'
            "<th>status</th></tr>" + "".join(rows) + "</table>"
            if rows
            else ""
        )
        notes = "".join(f'<div class="note-line">{_e(line)}</div>' for line in lines)
        parts.append(f'<div class="bundle"><h2>bundle {_e(bundle)}</h2>{notes}{table}</div>')
    return "".join(parts)


def _stage_row(row: dict, first: Check | None) -> str:
    """One stage's row, as the terminal's report counts it (Report.stage_rows): passed of compared, the worst
    rel error, and its state; the first divergence marked."""
    is_first = first is not None and row["first"] is first
    worst = "" if not row["compared"] else "exact" if row["worst"] is None else f"{row['worst']:.1e}"
    said = row["state"] + (f" ({row['skipped']} not compared)" if row["skipped"] else "")
    said += f" ({row['missing']} missing)" if row["missing"] else ""
    return (
        f'<tr class="{row["state"]}{" first" if is_first else ""}"><td>{_e(stage_title(row["stage"]))}</td>'
        f'<td class="num">{row["passed"]} / {row["compared"]}</td>'
        f'<td class="num">{worst}</td><td class="status">{_e(said + (" ← first divergence" if is_first else ""))}</td>'
        "</tr>"
    )


# -- the first divergence -------------------------------------------------------------------------------------


def _divergence(report: Report, check: Check, bundle: Bundle | None) -> tuple[str, dict | None]:
    """The section of the first divergence, and the data its heatmaps are drawn from (None: no heatmap)."""
    title = stage_title(check.stage)
    record = STAGE.get(check.stage)
    meaning, layout = (record.meaning, record.layout) if record else ("", "")
    expected, got = _array(check.expected), _array(check.got)
    if expected is None and bundle is not None and check.key in bundle.expected:
        expected = bundle.expected[check.key]  # a missing tensor: the reference's alone
    positions = _Positions(bundle, check, expected)
    numbers = f"max abs {check.max_abs:.2e}   rel {check.rel:.2e}   tolerance {check.tolerance:.0e}"
    facts = [
        ("where", check.where),
        ("key", check.key),
        ("status", check.status),
        ("stage", title + (f": {meaning}" if meaning else "")),
        ("layout", layout),
        ("error", numbers if check.status == "FAIL" and check.tolerance and not check.detail else ""),
        ("detail", check.detail),
        ("allowed", check.note),
        ("positions", positions.summary()),
        ("reference", _describe(expected)),
        ("port", _describe(got) if got is not None else "gave no array" if check.status != "error" else ""),
    ]
    head = (
        f'<section id="divergence"><h2>First divergence: {_e(check.where)} · {_e(title)}</h2>'
        + '<dl class="facts">'
        + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts if v)
        + "</dl>"
        + (f'<div class="hint" id="hint"><b>hint:</b> {_e(check.hint)}</div>' if check.hint else "")
    )
    if expected is not None and expected.size == 0 or got is not None and got.size == 0:
        return head + '<div class="shapes">an empty tensor: nothing to draw</div></section>', None
    if check.status == "error" or (expected is None and got is None):
        return head + "</section>", None
    mismatch = ""
    if expected is not None and got is not None and expected.shape != got.shape:
        axes = [f"axis {i}: {a} vs {b}" for i, (a, b) in enumerate(zip(expected.shape, got.shape)) if a != b] or [
            f"{expected.ndim} axes vs {got.ndim}"
        ]
        said = (
            f"The shapes differ: the reference's is {tuple(expected.shape)}, the port's {tuple(got.shape)} "
            f"({'; '.join(axes)}). Each is drawn with its own axes; no difference can be taken."
        )
        mismatch = f'<div class="shapes" id="shapes">{_e(said)}</div>'
    leading = expected if expected is not None else got  # the reference's layout decides how both are drawn
    if np.issubdtype(leading.dtype, np.integer) or leading.ndim <= 1:
        return head + mismatch + _chips(check, expected, got, positions) + "</section>", None
    picker, data, notes = _heatmaps(check, report.impl, expected, got, positions)
    panels = "".join(
        f'<div class="panel"><h3>{_e(data["headings"][name])}</h3><div id="panel-{name}"></div></div>'
        for name in ("expected", "got", "diff")
        if name in data["panels"] or (name == "diff" and data["diff"])
    )
    if got is None:
        panels += '<div class="panel"><h3>port (got)</h3><div class="note">the port gave no array here</div></div>'
    notes_html = "".join(f'<div class="note">{_e(n)}</div>' for n in notes)
    return head + mismatch + picker + notes_html + f'<div class="panels">{panels}</div></section>', data


class _Positions:
    """Labels for the positions of the failing check's step: position p holds output_ids[p] (the expected
    ids: the prompt, then the committed tokens) before the block's start, x_0 = output_ids[start] at it, the
    mask token after it. start = L_k − L_q of the step's attention weights, or the target's cache length
    before verify; without them (or without a bundle) positions are labelled by index alone."""

    def __init__(self, bundle: Bundle | None, check: Check, expected: np.ndarray | None) -> None:
        tokenizer = bundle.manifest.get("tokenizer", {}) if bundle is not None else {}
        self.tokens = tokenizer.get("tokens") or []
        self.mask = tokenizer.get("mask_token_id")
        has_ids = bundle is not None and "output_ids" in bundle.expected
        self.output = [int(t) for t in bundle.expected["output_ids"]] if has_ids else []
        self.start, self.length = self._block(bundle, check, expected)

    @staticmethod
    def _block(bundle: Bundle | None, check: Check, expected: np.ndarray | None) -> tuple[int | None, int | None]:
        """(start, L_q) of the check's step."""
        if check.stage == "pattern" and expected is not None and expected.ndim == 3:
            return expected.shape[2] - expected.shape[1], expected.shape[1]
        if bundle is None or check.step is None:
            return None, None
        stored = bundle.expected
        pattern = stored.get(key_for("pattern", check.step, 0))
        if pattern is not None and pattern.ndim == 3:
            return pattern.shape[2] - pattern.shape[1], pattern.shape[1]
        lengths = stored.get(key_for("cache_lengths", check.step))
        block = stored.get(key_for("noise_embedding", check.step))
        if lengths is not None and block is not None and lengths.shape == (6,):
            return int(lengths[3]), block.shape[0]
        return None, None

    def summary(self) -> str:
        """What the step's positions hold, in words (empty where they are not known)."""
        if self.start is None or not self.output:
            return ""
        shown = range(max(0, self.start - 8), min(self.start, len(self.output)))
        context = " ".join(self.text(self.output[p]) for p in shown)
        x0 = self.text(self.output[self.start]) if self.start < len(self.output) else "?"
        return (
            f"context 0–{self.start - 1}: {'… ' if shown.start else ''}{context} (the prompt, then committed tokens); "
            f"block {self.start}–{self.start + self.length - 1}: [x_0 = {x0}"
            + (f", {self.text(self.mask)} × {self.length - 1}]" if self.length > 1 else "]")
        )

    def text(self, token: int | None) -> str:
        """A token id's text (the manifest's), else #id."""
        if token is None:
            return "?"
        return self.tokens[token] if 0 <= token < len(self.tokens) else f"#{token}"

    def labels(self, role: str, length: int, indices: range) -> list[str]:
        """Labels of the given indices of an axis of `length` whose role is `role` (Stage.axes)."""
        if role == "vocab":
            return [f"{i} {self.text(i)}" if self.tokens else str(i) for i in indices]
        if role not in AXIS_TITLES or self.start is None:
            return [str(i) for i in indices]
        end = self.start if role == "context" else self.start + self.length  # the axis ends there
        return [self._at(end - length + i, role) for i in indices]

    def _at(self, p: int, role: str) -> str:
        if role == "proposal":
            return f"d{p - self.start} @{p}"
        token = (
            (self.output[p] if 0 <= p < len(self.output) else None)
            if p <= self.start
            else self.mask  # the block after x_0: mask tokens
        )
        return f"{p} {self.text(token)}" if token is not None else str(p)


def _heatmaps(check: Check, impl: str, expected, got, positions: _Positions) -> tuple[str, dict, list[str]]:
    """(the picker's HTML, the data the script draws, notes on what is shown) for float tensors of two axes or
    more: each a stack of (rows, columns) slices."""
    record = STAGE.get(check.stage)
    pick_name, row_role, col_role = record.axes if record and record.axes else ("index", "row", "column")
    stacks = {name: _stack(a) for name, a in (("expected", expected), ("got", got)) if a is not None}
    same = expected is not None and got is not None and expected.shape == got.shape
    diff = np.abs(stacks["got"][0].astype(np.float64) - stacks["expected"][0]) if same else None
    centre = None
    if diff is not None and diff.size:
        centre = np.unravel_index(int(np.argmax(np.where(np.isnan(diff), np.inf, diff))), diff.shape)
    panels, notes = {}, []
    for name, (stack, lead) in stacks.items():
        window = _window(stack.shape, centre)
        piece = stack[tuple(slice(a, b) for a, b in window)]
        if piece.size < stack.size and (name == "expected" or not same):  # one note for two windows alike
            what = ", ".join(
                f"{axis} {a}–{b - 1} of {n}"
                for axis, (a, b), n in zip((pick_name or "slice", "rows", "columns"), window, stack.shape)
                if b - a < n
            )
            whose = "Both tensors are" if same else f"The {'reference' if name == 'expected' else 'port'}'s is"
            around = "around the largest |got − expected|" if centre is not None else "from the start"
            notes.append(
                f"{whose} shown in part: {what} ({around}); the page draws at most {MAX_SIDE} rows and "
                f"{MAX_SIDE} columns of a slice, {MAX_VALUES:,} values of a tensor."
            )
        own = same or name == "expected"  # a port's tensor of another shape is labelled by index alone
        rows, cols = (row_role, col_role) if own else ("row", "column")
        panels[name] = {
            "shape": list(piece.shape),
            "data": base64.b64encode(np.ascontiguousarray(piece, dtype="<f4").tobytes()).decode("ascii"),
            "picks": [_pick(pick_name, lead, i) for i in range(*window[0])],
            "y": _axis(positions, rows, stack.shape[1], range(*window[1])),
            "x": _axis(positions, cols, stack.shape[2], range(*window[2])),
            "height": int(min(620, max(280, 150 + 24 * piece.shape[1]))),
        }
    shown = [p for p in (panels.get("expected"), panels.get("got")) if p]
    values = np.concatenate([_decoded(p).ravel() for p in shown])
    values = values[np.isfinite(values)]
    top = float(np.abs(values).max()) if values.size else 0.0
    weights = check.stage == "pattern"
    data = {
        "panels": panels,
        "picker": pick_name is not None and any(len(p["picks"]) > 1 for p in shown),
        "scale": "Viridis" if weights else "RdBu",
        "range": [0.0, top or 1.0] if weights else [-(top or 1.0), top or 1.0],
        "diff": None,
        "titles": {"expected": "reference (expected)", "got": f"port (got: {impl})", "diff": "got − expected"},
        "headings": {
            "expected": f"reference (expected) · shape {tuple(expected.shape)}" if expected is not None else "",
            "got": f"port (got: {impl}) · shape {tuple(got.shape)}" if got is not None else "",
            "diff": "difference: got − expected (port − reference)",
        },
    }
    if same:
        d = _decoded(panels["got"]).astype(np.float64) - _decoded(panels["expected"])
        d = np.abs(d[np.isfinite(d)])
        spread = float(d.max()) if d.size else 0.0
        data["diff"] = [-(spread or 1e-12), spread or 1e-12]
    picker = ""
    if data["picker"]:  # it opens at the slice of the largest difference
        opened = int(centre[0]) - _window(stacks["expected"][0].shape, centre)[0][0] if centre is not None else 0
        longest = max(shown, key=lambda p: len(p["picks"]))
        options = "".join(
            f'<option value="{i}"{" selected" if i == opened else ""}>{_e(label)}</option>'
            for i, label in enumerate(longest["picks"])
        )
        picker = f'<div class="row"><label>{_e(pick_name)} <select id="pick">{options}</select></label></div>'
    return picker, data, notes


def _stack(a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """A tensor as a stack of (rows, columns) slices (float32), and the shape of its leading axes."""
    a = np.asarray(a, dtype=np.float32)
    if a.ndim < 2:
        a = a.reshape(1, -1)
    return a.reshape((-1, *a.shape[-2:])), a.shape[:-2]


def _window(shape: tuple[int, int, int], centre) -> list[tuple[int, int]]:
    """Per axis of a stack (slices, rows, columns), (start, stop): rows and columns at most MAX_SIDE each, then
    as many slices as keep it within MAX_VALUES values; each window around `centre` (None: from the start)."""
    keep = [shape[0], min(shape[1], MAX_SIDE), min(shape[2], MAX_SIDE)]
    keep[0] = max(1, min(shape[0], MAX_VALUES // max(1, keep[1] * keep[2])))
    bounds = []
    for axis, (n, k) in enumerate(zip(shape, keep)):
        middle = int(centre[axis]) if centre is not None else 0
        start = min(max(0, middle - k // 2), n - k)
        bounds.append((start, start + k))
    return bounds


def _pick(name: str | None, lead: tuple[int, ...], i: int) -> str:
    """The label of slice i of a stack whose leading axes have shape `lead`."""
    index = np.unravel_index(i, lead) if lead else ()
    return f"{name or 'slice'} {', '.join(str(int(j)) for j in index) or i}"


def _axis(positions: _Positions, role: str, length: int, indices: range) -> dict:
    """An axis for the script: its title, the values of its cells, and at most MAX_TICKS labelled ticks."""
    labels = positions.labels(role, length, indices)
    every = max(1, math.ceil(len(labels) / MAX_TICKS))
    return {
        "title": AXIS_TITLES.get(role, role),
        "values": list(indices),
        "ticks": list(indices)[::every],
        "text": labels[::every],
    }


def _decoded(panel: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(panel["data"]), dtype="<f4")


def _chips(check: Check, expected, got, positions: _Positions) -> str:
    """Integer tensors and sequences of one axis: the reference's and the port's as rows of chips (token ids
    with their text on a token stage), the differing ones marked; the rows of a 2-d tensor in turn."""
    tokens = check.stage in TOKEN_STAGES and bool(positions.tokens)
    scale = max(1.0, float(np.abs(expected).max())) if expected is not None and expected.size else 1.0
    flat = expected is not None and got is not None and expected.ndim != got.ndim  # no common rows: flattened

    def rows_of(a) -> list:
        if a is None:
            return []
        return [a.reshape(-1)] if a.ndim <= 1 or flat else list(a.reshape(-1, a.shape[-1]))

    ours, theirs = rows_of(expected), rows_of(got)
    count, out = max(len(ours), len(theirs)), []
    for r in range(count):
        e = ours[r] if r < len(ours) else None
        g = theirs[r] if r < len(theirs) else None
        marks = _marks(e, g, check.tolerance * scale)
        n = len(marks)
        first = int(np.flatnonzero(marks)[0]) if marks.any() else 0
        start = min(max(0, first - MAX_CHIPS // 2), max(0, n - MAX_CHIPS))
        shown = range(start, min(n, start + MAX_CHIPS))
        suffix = f", row {r}" if count > 1 else ""
        lines = [
            _chip_row(f"reference (expected){suffix}", e, marks, shown, tokens, positions),
            _chip_row(f"port (got){suffix}", g, marks, shown, tokens, positions),
        ]
        if e is not None and g is not None and len(e) == len(g) and not np.issubdtype(e.dtype, np.integer):
            lines.append(_chip_row(f"got − expected{suffix}", g.astype(np.float64) - e, marks, shown, False, positions))
        if len(shown) < n:
            lines.append(
                f'<div class="note">elements {shown.start}–{shown.stop - 1} of {n} shown (around the first '
                f"difference): the page draws at most {MAX_CHIPS} chips of a row</div>"
            )
        out.append('<div class="seq">' + "".join(lines) + "</div>")
    return "".join(out)


def _marks(e, g, tolerance: float) -> np.ndarray:
    """Per element of the longer of two rows: 0 alike, 1 different (beyond the tolerance for floats; NaN
    always), 2 only one of them has it. A row alone (the other gave nothing) is all 0: nothing to compare."""
    if e is None or g is None:
        alone = g if e is None else e
        return np.zeros(0 if alone is None else len(alone), np.int8)
    m = min(len(e), len(g))
    marks = np.full(max(len(e), len(g)), 2, np.int8)
    if np.issubdtype(e.dtype, np.integer) and np.issubdtype(g.dtype, np.integer):
        marks[:m] = e[:m] != g[:m]
    else:
        marks[:m] = ~(np.abs(g[:m].astype(np.float64) - e[:m].astype(np.float64)) <= tolerance)
    return marks


def _chip_row(name: str, row, marks: np.ndarray, shown: range, tokens: bool, positions: _Positions) -> str:
    """One row of chips: the elements `shown` of `row`, each marked as `marks` says."""
    if row is None:
        return f'<div class="row"><span class="row-name">{_e(name)}</span><span class="unused">none</span></div>'
    chips = []
    for i in shown:
        if i >= len(row):
            continue
        value = row[i]
        if np.issubdtype(row.dtype, np.integer):
            text = positions.text(int(value)) if tokens else str(int(value))
        else:
            text = f"{value:.4g}"
        sub = f"<sub>{int(value)}</sub>" if tokens and np.issubdtype(row.dtype, np.integer) else ""
        kind = ("", " differ", " extra")[int(marks[i])]
        chips.append(f'<span class="chip{kind}" title="index {i}: {_e(value)}">{_e(text)}{sub}</span>')
    return f'<div class="row"><span class="row-name">{_e(name)}</span>{"".join(chips)}</div>'


def _array(value) -> np.ndarray | None:
    """A check's tensor as numpy, or None."""
    if value is None:
        return None
    try:
        a = np.asarray(value)
    except (TypeError, ValueError):
        return None
    if a.dtype == np.bool_:
        return a.astype(np.int64)
    return a if np.issubdtype(a.dtype, np.number) else None


def _describe(a: np.ndarray | None) -> str:
    return "" if a is None else f"shape {tuple(a.shape)}, {a.dtype}"


def _e(text) -> str:
    return html.escape(str(text))
