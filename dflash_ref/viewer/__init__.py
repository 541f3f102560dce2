"""Step through a decode: one self-contained HTML file for a saved trace (`python -m dflash_ref view TRACE`,
`trace.to_html(path)`), opened offline in any browser.

    payload.py   what is shown: the steps, the attention weights at reduced precision, the lattice; and the
                 checks that name what is wrong with a trace it cannot show
    page.py      the file: plotly.js inlined, the payload as JSON, viewer.js
    viewer.js    the page: a step slider, layer and head pickers, the panels
    browser.py   headless Chromium: a screenshot of a viewer (`view --screenshot`), and for the tests

The walkthrough notebooks write their viewers and show how a browser draws them (a committed screenshot): an
iframe of a file that a clone does not hold would be a dead link.
"""

from __future__ import annotations

from pathlib import Path

from . import page  # payload (torch) is imported where a trace is drawn: the kit's page needs page alone


def write_html(
    trace,
    path: str | Path,
    steps=None,
    layers=None,
    target_layers=None,
    precision: str = "float16",
    title: str | None = None,
) -> Path:
    """Write the viewer of `trace` (a dflash_ref.trace.Trace) to `path`: the given steps and recorded layers
    (default: all), attention weights stored as `precision` (float16 or float32). Returns the path."""
    from . import payload

    data = payload.build(trace, steps, layers, target_layers, precision)
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give the HTML file to write, e.g. {path / 'trace.html'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page.render(data, title or trace.meta.get("title") or "dflash_ref trace"), encoding="utf-8")
    return path


def name_tokens(trace, decode, output_ids=None, stop_token_ids=None) -> None:
    """Put into `trace.meta` what the viewer labels tokens with: the text of every token id the trace shows
    (`decode(id) → str`, e.g. `lambda i: tokenizer.decode([i])`), the decoded sequence's ids and the stop
    tokens (a step that committed one says so)."""
    from . import payload

    ids = set(output_ids or [])
    for r in trace.records:
        ids.update(r.block_ids, r.draft_tokens, r.posterior, [r.bonus])
    for acts in trace.activations:
        if payload.SELECTOR.format("candidates") in acts:
            ids.update(acts[payload.SELECTOR.format("candidates")].flatten().tolist())
    trace.meta["token_text"] = {str(i): decode(i) for i in sorted(ids)}
    if output_ids is not None:
        trace.meta["output_ids"] = list(output_ids)
    if stop_token_ids is not None:
        trace.meta["stop_token_ids"] = list(stop_token_ids)
