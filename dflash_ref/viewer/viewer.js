// The trace viewer's page logic: controls and panels over the trace's JSON (payload.py); every plot is drawn
// by plotly.js, inlined above this script. No network, no server.
(function () {
  "use strict";
  const FORMAT = "dflash_ref.view/1";
  const $ = (id) => document.getElementById(id);

  function fail(message) {
    $("error").textContent = message;
    $("error").hidden = false;
    $("viewer").hidden = true;
  }

  let data;
  try {
    data = JSON.parse($("dflash-trace").textContent);
  } catch (e) {
    fail("This file's trace data is damaged: " + e.message);
    return;
  }
  if (data.format !== FORMAT) {
    fail("This file holds trace data of format " + JSON.stringify(data.format) + "; this viewer reads " + FORMAT + ".");
    return;
  }

  // -- the stored weights: base64, little-endian float16 or float32 ------------------------------------------
  function half(h) {
    const sign = h & 0x8000 ? -1 : 1, exponent = (h >> 10) & 0x1f, fraction = h & 0x3ff;
    if (exponent === 0) return sign * Math.pow(2, -14) * (fraction / 1024);
    if (exponent === 31) return fraction ? NaN : sign * Infinity;
    return sign * Math.pow(2, exponent - 15) * (1 + fraction / 1024);
  }
  const decoded = new Map();
  function weights(stored) {
    if (!decoded.has(stored)) {
      const text = atob(stored.data), bytes = new Uint8Array(text.length);
      for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
      let values;
      if (data.precision === "float16") {
        const raw = new Uint16Array(bytes.buffer);
        values = new Float32Array(raw.length);
        for (let i = 0; i < raw.length; i++) values[i] = half(raw[i]);
      } else {
        values = new Float32Array(bytes.buffer);
      }
      decoded.set(stored, { shape: stored.shape, values: values });
    }
    return decoded.get(stored);
  }
  function head(stored, h) {  // (H, L_q, L_k) → rows of head h
    const w = weights(stored), rows = w.shape[1], cols = w.shape[2], out = [];
    for (let i = 0; i < rows; i++) out.push(Array.from(w.values.subarray((h * rows + i) * cols, (h * rows + i + 1) * cols)));
    return out;
  }

  // -- labels -------------------------------------------------------------------------------------------------
  const MASK = "[mask]";
  function atPosition(p) {
    const label = data.positions[p];
    return label === null || label === undefined ? "" : label;
  }
  function blockLabel(step, i, drafted) {  // what the draft saw at block position i: x_0, then masks
    return i === 0 ? step.block[0] : drafted ? MASK : step.block[i];
  }
  function keyLabel(step, p, drafted) {
    return p < step.start ? atPosition(p) : blockLabel(step, p - step.start, drafted);
  }
  function ticks(labels, positions) {
    const every = Math.max(1, Math.ceil(labels.length / 48));
    const vals = [], text = [];
    for (let j = 0; j < labels.length; j += every) {
      vals.push(j);
      text.push(positions[j] + " " + labels[j]);
    }
    return { tickvals: vals, ticktext: text };
  }

  // -- state and controls -------------------------------------------------------------------------------------
  const steps = data.steps;
  const state = { step: 0, layer: data.draft.layers[0], head: 0, targetLayer: data.target.layers[0], targetHead: 0 };
  function fill(select, values, label) {
    select.innerHTML = "";
    for (const v of values) {
      const option = document.createElement("option");
      option.value = v;
      option.textContent = label(v);
      select.appendChild(option);
    }
  }
  function headsOf(which, layer) {
    for (const key in data[which].patterns) if (key.endsWith("," + layer)) return data[which].patterns[key].shape[0];
    return 0;
  }
  const slider = $("step-slider");
  slider.max = steps.length - 1;
  fill($("layer"), data.draft.layers, (l) => "draft layer " + l);
  fill($("head"), [...Array(headsOf("draft", state.layer)).keys()], (h) => "head " + h);
  $("draft-controls").hidden = data.draft.layers.length === 0;
  if (data.target.layers.length) {
    fill($("target-layer"), data.target.layers, (l) => "target layer " + l);
    fill($("target-head"), [...Array(headsOf("target", state.targetLayer)).keys()], (h) => "head " + h);
  }
  $("target-controls").hidden = data.target.layers.length === 0;
  $("target-panel").hidden = data.target.layers.length === 0;
  $("lattice-panel").hidden = Object.keys(data.lattice).length === 0;

  function setStep(i) {
    state.step = Math.max(0, Math.min(steps.length - 1, i));
    slider.value = state.step;
    render();
  }
  slider.addEventListener("input", () => setStep(Number(slider.value)));
  $("prev").addEventListener("click", () => setStep(state.step - 1));
  $("next").addEventListener("click", () => setStep(state.step + 1));
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "SELECT" || e.target === slider) return;
    if (e.key === "ArrowLeft") setStep(state.step - 1);
    if (e.key === "ArrowRight") setStep(state.step + 1);
  });
  for (const [id, key] of [["layer", "layer"], ["head", "head"], ["target-layer", "targetLayer"], ["target-head", "targetHead"]]) {
    $(id).addEventListener("change", (e) => {
      state[key] = Number(e.target.value);
      render();
    });
  }

  // -- the step: the block, the proposals against the posterior, τ, the bonus, a stop -------------------------
  function chip(text, kind, title) {
    const span = document.createElement("span");
    span.className = "chip " + kind;
    span.textContent = text;
    if (title) span.title = title;
    return span;
  }
  function row(name, chips) {
    const div = document.createElement("div");
    div.className = "row";
    const label = document.createElement("span");
    label.className = "row-name";
    label.textContent = name;
    div.appendChild(label);
    chips.forEach((c) => div.appendChild(c));
    return div;
  }
  function renderStep(s) {
    const panel = $("step-panel");
    panel.innerHTML = "";
    const title = document.createElement("div");
    title.className = "step-title";
    title.textContent = "step " + s.step + " · x₀ at position " + s.start + " · τ = " + s.tau + " · bonus " + s.bonus +
      " · committed " + s.produced + (s.lookup ? " · proposed by prompt lookup (no draft pass)" : "") +
      (s.verify_size && s.verify_size < s.block.length ? " · verify gate shut: " + s.verify_size + " verified" : "");
    panel.appendChild(title);
    const proposed = [chip(s.block[0], "x0", "x₀, position " + s.start)];
    s.proposals.forEach((t, i) => {
      const kind = i < s.tau ? "accepted" : "rejected";
      proposed.push(chip(t, kind, "d" + (i + 1) + ", position " + (s.start + i + 1) + ": " + kind));
    });
    panel.appendChild(row("proposed", proposed));
    const posterior = s.posterior.map((t, i) => {
      const kind = i === s.tau ? "bonus" : i < s.tau ? "accepted" : "unused";
      return chip(t, kind, "the target's token after position " + (s.start + i) + (i === s.tau ? ": the bonus" : ""));
    });
    panel.appendChild(row("target posterior", posterior.length ? posterior : [chip("(not recorded: a sampled step)", "unused")]));
    if (s.stop !== null) panel.appendChild(row("stop", [chip(s.stop + " committed: the run ends", "stop")]));
    else if (s.clipped) panel.appendChild(row("end", [chip("committed " + s.produced + " of " + (s.tau + 1) + ": the length limit", "stop")]));
  }

  // -- attention heatmaps ---------------------------------------------------------------------------------------
  const layout = (title, xaxis, yaxis, shapes, height) => ({
    title: { text: title, font: { size: 14 } },
    margin: { l: 110, r: 20, t: 40, b: 110 },
    height: height,
    xaxis: Object.assign({ title: { text: "key (position, token)" }, tickangle: -60, tickfont: { size: 10 } }, xaxis),
    yaxis: Object.assign({ title: { text: "query" }, autorange: "reversed", tickfont: { size: 11 } }, yaxis),
    shapes: shapes,
  });
  function note(div, message) {  // a panel says why it has no plot at this step, or shows its plot
    $(div + "-note").textContent = message || "";
    $(div + "-note").hidden = !message;
    if (message) Plotly.purge(div);
    $(div).hidden = !!message;
  }
  function heatmap(div, z, rowLabels, rowPositions, keyLabels, keyPositions, boundary, title, empty) {
    note(div, z ? "" : empty);
    if (!z) return;
    const text = z.map((r, i) => r.map((_, j) => "key " + keyPositions[j] + " " + keyLabels[j] + "<br>query " +
      rowPositions[i] + " " + rowLabels[i]));
    const trace = {
      type: "heatmap", z: z, text: text, colorscale: "Viridis", zmin: 0, hoverongaps: false,
      hovertemplate: "%{text}<br>weight %{z:.5f}<extra></extra>", colorbar: { title: { text: "weight" } },
    };
    const shapes = [{ type: "line", x0: boundary - 0.5, x1: boundary - 0.5, y0: -0.5, y1: z.length - 0.5,
      line: { color: "#ff4136", width: 2 } }];
    const rows = { tickvals: rowLabels.map((_, i) => i), ticktext: rowLabels.map((l, i) => rowPositions[i] + " " + l) };
    Plotly.react(div, [trace], layout(title, ticks(keyLabels, keyPositions), rows, shapes, 200 + 26 * z.length),
      { responsive: true, displaylogo: false });
  }
  function renderDraft(i, s) {
    const stored = data.draft.patterns[i + "," + state.layer];
    const why = s.lookup ? "step " + s.step + ": proposed by prompt lookup, no draft pass, no draft attention"
      : "step " + s.step + ": draft layer " + state.layer + "'s attention was not recorded";
    if (!stored) return heatmap("attention", null, [], [], [], [], 0, "", why);
    const z = head(stored, Math.min(state.head, stored.shape[0] - 1));
    const keys = z[0].length, queries = z.length;
    const keyPositions = s.k_positions.slice(s.k_positions.length - keys);
    const keyLabels = keyPositions.map((p) => keyLabel(s, p, true));
    const rowLabels = s.q_positions.map((_, j) => blockLabel(s, j, true));
    heatmap("attention", z, rowLabels, s.q_positions, keyLabels, keyPositions, keys - queries,
      "draft attention · step " + s.step + " · layer " + state.layer + " · head " + state.head +
      " · context | block (non-causal)", "");
  }
  function renderTarget(i, s) {
    if (!data.target.layers.length) return;
    const stored = data.target.patterns[i + "," + state.targetLayer];
    if (!stored) return heatmap("target-attention", null, [], [], [], [], 0, "", "step " + s.step +
      ": target layer " + state.targetLayer + "'s attention was not recorded");
    const z = head(stored, Math.min(state.targetHead, stored.shape[0] - 1));
    const keys = z[0].length, queries = z.length;
    const keyPositions = [...Array(keys).keys()];
    const rowPositions = [...Array(queries).keys()].map((j) => s.start + j);
    heatmap("target-attention", z, rowPositions.map((p) => keyLabel(s, p, false)), rowPositions,
      keyPositions.map((p) => keyLabel(s, p, false)), keyPositions, keys - queries,
      "target attention at verify · step " + s.step + " · layer " + state.targetLayer + " · head " + state.targetHead +
      " · cache | verified block (causal)", "");
  }

  // -- DFlash 2: the candidate lattice and the path taken --------------------------------------------------------
  function renderLattice(i, s) {
    if ($("lattice-panel").hidden) return;
    const lattice = data.lattice[String(i)];
    note("lattice", lattice ? "" : "step " + s.step + ": no candidate lattice recorded (a lookup step)");
    if (!lattice) return;
    const gamma = lattice.labels.length, K = lattice.labels[0].length;
    const transpose = (m) => [...Array(K).keys()].map((k) => m.map((r) => r[k]));
    const x = [...Array(gamma).keys()].map((j) => "d" + (j + 1));
    const traces = [{
      type: "heatmap", x: x, y: [...Array(K).keys()], z: lattice.unary ? transpose(lattice.unary) : transpose(lattice.labels.map((r) => r.map(() => 0))),
      text: transpose(lattice.labels), texttemplate: "%{text}", textfont: { color: "#111" },
      colorscale: [[0, "#f7fbff"], [1, "#6baed6"]], showscale: !!lattice.unary,
      hovertemplate: "%{x} candidate %{y}: %{text}<br>unary score %{z:.3f}<extra></extra>",
      colorbar: { title: { text: "unary" } },
    }];
    const path = lattice.path.map((k, j) => (k === null ? null : { x: x[j], y: k })).filter((p) => p);
    traces.push({ type: "scatter", mode: "lines+markers", name: "path taken (the proposals)", x: path.map((p) => p.x),
      y: path.map((p) => p.y), line: { color: "rgba(255, 65, 54, 0.5)", width: 2 },
      marker: { symbol: "circle-open", size: 30, line: { width: 3 }, color: "#ff4136" }, hoverinfo: "skip" });
    if (lattice.unary) {
      const argmax = lattice.unary.map((r) => r.indexOf(Math.max(...r)));
      traces.push({ type: "scatter", mode: "markers", name: "argmax of the logits", x: x, y: argmax,
        marker: { symbol: "square-open", size: 38, line: { width: 2, dash: "dot" }, color: "#333" }, hoverinfo: "skip" });
    }
    Plotly.react("lattice", traces, {
      title: { text: "candidate lattice · step " + s.step + " · " + K + " candidates per position", font: { size: 14 } },
      margin: { l: 60, r: 20, t: 40, b: 40 }, height: 160 + 34 * K,
      yaxis: { title: { text: "candidate" }, range: [K - 0.5, -0.5], dtick: 1 }, legend: { orientation: "h", y: -0.15 },
    }, { responsive: true, displaylogo: false });
  }

  // -- the caches: their lengths before, after the pass, after the crop; the current step marked ---------------
  function renderCachesOnce() {
    const x = [], draft = [], target = [], text = [];
    steps.forEach((s) => {
      ["before", "after the pass", "after the crop"].forEach((when, k) => {
        x.push(s.step + 0.42 * k);
        draft.push(s.caches.draft[k]);
        target.push(s.caches.target[k]);
        text.push("step " + s.step + ", " + when);
      });
    });
    const line = (name, y, color) => ({ type: "scatter", mode: "lines+markers", name: name, x: x, y: y, text: text,
      line: { color: color }, hovertemplate: "%{text}: %{y}<extra>" + name + "</extra>" });
    Plotly.newPlot("caches", [line("draft cache", draft, "#0074d9"), line("target cache", target, "#2ecc40")], {
      title: { text: "cache lengths (positions held)", font: { size: 14 } }, height: 280,
      margin: { l: 60, r: 20, t: 40, b: 40 },
      xaxis: { title: { text: "step" }, range: [steps[0].step - 0.3, steps[steps.length - 1].step + 1.1],
        dtick: steps.length > 30 ? null : 1 },
      yaxis: { title: { text: "length" } }, legend: { orientation: "h", y: -0.25 },
    }, { responsive: true, displaylogo: false });
  }
  function markCaches(s) {
    Plotly.relayout("caches", { shapes: [{ type: "rect", xref: "x", yref: "paper", x0: s.step - 0.1, x1: s.step + 0.94,
      y0: 0, y1: 1, fillcolor: "rgba(255, 65, 54, 0.12)", line: { width: 0 } }] });
  }

  function render() {
    const i = state.step, s = steps[i];
    $("step-number").textContent = "step " + s.step + " (" + (i + 1) + " of " + steps.length + ")";
    renderStep(s);
    renderDraft(i, s);
    renderTarget(i, s);
    renderLattice(i, s);
    markCaches(s);
  }

  renderCachesOnce();
  render();
  window.dflashViewer = { setStep: setStep, state: state, data: data };
})();
