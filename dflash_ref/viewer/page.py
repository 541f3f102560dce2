"""The viewer's one HTML file: plotly.js inlined (the `viewer` extra's plotly package ships it), the trace's
payload as JSON, and viewer.js, which wires the controls to plotly's plots. It opens offline, from disk, in
any browser; the same trace gives the same bytes.

Why plotly: it is a maintained plotting library whose whole JavaScript bundle can be inlined into one file,
with heatmaps whose hover shows each cell's value, and a JavaScript API (`Plotly.react`) to redraw one plot
when a control moves. CircuitsVis (what TransformerLens users reach for) has attention-pattern components,
but none for a decode's steps, caches or a candidate lattice, and no one control that moves all its panels;
hand-written canvas plotting would be code to keep that plotly already keeps. The controls and the step's
text are this package's own JavaScript (viewer.js)."""

from __future__ import annotations

import html
import json
from importlib import resources

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; }
.about { color: #555; margin-bottom: 10px; }
#controls { position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid #ddd; z-index: 10;
  display: flex; flex-wrap: wrap; gap: 12px; align-items: center; }
#step-slider { width: 320px; }
#step-number { min-width: 150px; font-weight: 600; }
section { margin-top: 14px; }
h2 { font-size: 15px; margin: 10px 0 4px; }
.note { color: #777; font-style: italic; padding: 12px 0; }
.row { margin: 4px 0; }
.row-name { display: inline-block; width: 130px; color: #555; }
.step-title { font-weight: 600; margin: 6px 0; }
.chip { display: inline-block; padding: 2px 7px; margin: 0 3px 3px 0; border-radius: 4px; font-family: monospace;
  border: 1px solid #ccc; white-space: pre; }
.x0 { background: #eee; }
.accepted { background: #d4f5d4; border-color: #2ecc40; }
.rejected { background: #fde0de; border-color: #ff4136; text-decoration: line-through; }
.bonus { background: #dbeafe; border-color: #0074d9; font-weight: 600; }
.unused { color: #999; }
.stop { background: #fff3cd; border-color: #e0a800; }
#error { color: #b00020; font-weight: 600; padding: 20px; border: 2px solid #b00020; }
"""

BODY = """
<h1>{title}</h1>
<div class="about">{about}</div>
<div id="error" hidden></div>
<div id="viewer">
<div id="controls">
  <button id="prev" title="previous step (←)">◀</button>
  <input id="step-slider" type="range" min="0" value="0" step="1" aria-label="step">
  <button id="next" title="next step (→)">▶</button>
  <span id="step-number"></span>
  <span id="draft-controls"><select id="layer" aria-label="draft layer"></select>
    <select id="head" aria-label="draft head"></select></span>
  <span id="target-controls"><select id="target-layer" aria-label="target layer"></select>
    <select id="target-head" aria-label="target head"></select></span>
</div>
<section><h2>The step</h2><div id="step-panel"></div></section>
<section><h2>The draft's attention</h2><div id="attention-note" class="note" hidden></div>
  <div id="attention"></div></section>
<section id="target-panel"><h2>The target's attention</h2><div id="target-attention-note" class="note" hidden></div>
  <div id="target-attention"></div></section>
<section id="lattice-panel"><h2>DFlash 2: the candidate lattice</h2><div id="lattice-note" class="note" hidden></div>
  <div id="lattice"></div></section>
<section><h2>The caches</h2><div id="caches"></div></section>
</div>
"""


def plotly_js() -> str:
    """plotly.js as the plotly package ships it; a clear error where the package is missing."""
    try:
        source = resources.files("plotly") / "package_data" / "plotly.min.js"
        return source.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise RuntimeError(
            "the trace viewer inlines plotly.js from the plotly package, which is not installed: "
            "pip install 'dflash-ref[viewer]' (or plotly)"
        ) from e


def render(payload: dict, title: str) -> str:
    """The whole page for one payload (payload.build)."""
    steps, draft, target = payload["steps"], payload["draft"]["layers"], payload["target"]["layers"]
    about = (
        f"{len(steps)} steps · draft attention: "
        + (f"layers {_spans(draft)}" if draft else "not recorded")
        + (f" · target attention: layers {_spans(target)}" if target else "")
        + (" · DFlash 2 candidate lattice" if payload["lattice"] else "")
        + f" · weights stored as {payload['precision']}"
        + (f" · prompt: {payload['meta']['prompt']!r}" if "prompt" in payload["meta"] else "")
        + " · ← → step through"
    )
    data = json.dumps(payload, separators=(",", ":"), sort_keys=True).replace("</", "<\\/")  # no early </script>
    script = (resources.files(__package__) / "viewer.js").read_text(encoding="utf-8")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n"
        f"<script>{plotly_js()}</script>\n</head>\n<body>\n"
        + BODY.format(title=html.escape(title), about=html.escape(about))
        + f'<script type="application/json" id="dflash-trace">{data}</script>\n'
        + f"<script>\n{script}</script>\n</body>\n</html>\n"
    )


def _spans(layers: list[int]) -> str:
    """[0, 1, 2, 5] → "0–2, 5"."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    return ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in runs)
