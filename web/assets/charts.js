/* charts.js — the metric charts of the job page, the compare view and the
 * experiment page: one chart per metric (its validation twin drawn on it),
 * several jobs' curves overlaid on them, the toolbar every chart follows
 * (log scale, smoothing, x axis, zoom reset), and turning the server's
 * points into the chart's (step, epoch, wall time, value). */
"use strict";

const PALETTE = ["#1d4ed8", "#c2410c", "#15803d", "#7c3aed", "#0891b2", "#be185d", "#a16207",
  "#4b5563"];

/* The chart a metric belongs on: val_loss is drawn on loss's chart. */
function baseName(name) {
  return name.replace(/^val_/, "");
}

/* Steps in one epoch: from the server's progress, else from the step of a
 * point logged at an epoch's end; null when not known yet. */
function stepsPerEpoch(job, points) {
  const p = job.progress;
  if (p && p.total_steps > 0 && p.epochs > 0) return p.total_steps / p.epochs;
  const end = points.find((x) => /^(epoch_|val_)/.test(x.name) && x.epoch > 0);
  return end ? end.step / end.epoch : null;
}

/* The server's metric points as the chart's: the epoch as a fraction (step
 * over steps per epoch), time in seconds since t0 (ms). */
function chartPoint(p, t0, perEpoch) {
  return { step: p.step, epoch: perEpoch ? p.step / perEpoch : p.epoch,
    time: (Date.parse(p.time) - t0) / 1000, value: p.value === undefined ? NaN : p.value };
}

/* The toolbar: its settings apply to every chart charts() returns, and to
 * charts made later through apply(); the x axis starts by mode ("step"
 * unless given). */
function chartToolbar(charts, mode) {
  const state = { log: false, smoothing: 0, mode: mode || "step" };
  const apply = (c) => {
    c.setLog(state.log);
    c.setSmoothing(state.smoothing);
    if (c.mode !== state.mode) c.setMode(state.mode);
  };
  const logBox = el("input", { type: "checkbox", id: "log-scale" });
  const slider = el("input", { type: "range", id: "smoothing", min: 0, max: 0.99, step: 0.01,
    value: 0 });
  const sliderValue = el("output", { for: "smoothing", id: "smoothing-value" }, "0");
  const axis = el("select", { id: "x-axis" }, el("option", { value: "step" }, "step"),
    el("option", { value: "epoch" }, "epoch"), el("option", { value: "time" }, "wall time"));
  axis.value = state.mode;
  const reset = el("button", { id: "zoom-reset", type: "button" }, "Reset zoom");
  logBox.addEventListener("change", () => {
    state.log = logBox.checked;
    charts().forEach(apply);
  });
  slider.addEventListener("input", () => {
    state.smoothing = Number(slider.value);
    sliderValue.textContent = slider.value;
    charts().forEach(apply);
  });
  axis.addEventListener("change", () => {
    state.mode = axis.value;
    charts().forEach(apply);
  });
  reset.addEventListener("click", () => charts().forEach((c) => c.setView(null)));
  const node = el("div", { class: "row card tools", role: "toolbar", "aria-label": "chart tools" },
    el("label", {}, logBox, " log scale"),
    el("label", {}, "smoothing ", slider, " ", sliderValue),
    el("label", {}, "x axis ", axis), reset,
    el("span", { class: "muted" }, "drag across a chart to zoom; hover to read values"));
  return { node, apply };
}

/* One chart's card: title, point count, canvas, hover read-out, legend. */
function metricCard(base, series) {
  const readout = el("div", { class: "readout muted", id: "chart-" + base + "-readout",
    "aria-live": "polite" });
  const canvas = el("canvas", { class: "chart", id: "chart-" + base, role: "img",
    "aria-label": base + " chart; + and - zoom, 0 resets" });
  const chart = new KilnChart(canvas, series, { yLabel: base, readout });
  const legend = el("div", { class: "legend" });
  const count = el("span", { class: "muted", id: "chart-" + base + "-count" });
  const paintLegend = () => legend.replaceChildren(...chart.series.filter((s) => s.xs.length)
    .map((s) => el("span", {}, el("i", { style: "background:" + s.color }), s.label || s.name)));
  paintLegend();
  return { chart, count, paintLegend, node: el("div", { class: "card" },
    el("div", { class: "row" }, el("h2", { style: "margin:0" }, base), count), canvas, readout,
    legend) };
}

/* Calls fn when every chart has drawn what it holds, and marks the page. */
function whenAllDrawn(charts, fn) {
  let pending = charts.length;
  const drawn = () => {
    if (--pending) return;
    performance.mark("kiln-charts-drawn");
    document.body.dataset.chartsDrawn = String(performance.now());
    if (fn) fn();
  };
  if (!pending) {
    pending = 1;
    drawn();
  }
  for (const c of charts) c.whenDrawn(drawn);
}

/* Draws one job's curves on the overlay charts in cards (base metric name
 * -> metricCard; a card is made, and set up by tools, for a metric first
 * seen): its training curves in color, validation dashed, named after the
 * job. points are the job's metric points from the server; keep(name), when
 * given, chooses the metrics drawn. Drawing a job again replaces its
 * curves. */
function overlayJob(cards, tools, job, color, points, keep) {
  const sorted = points.slice().sort((a, b) => a.step - b.step);
  const perEpoch = stepsPerEpoch(job, sorted);
  const t0 = sorted.length ? Math.min(...sorted.map((p) => Date.parse(p.time))) : 0;
  const byName = new Map();
  for (const p of sorted) {
    if (keep && !keep(p.name)) continue;
    if (!byName.has(p.name)) byName.set(p.name, []);
    byName.get(p.name).push(chartPoint(p, t0, perEpoch));
  }
  const who = job.display_name || job.id;
  for (const [name, list] of byName) {
    const base = baseName(name);
    if (!cards.has(base)) {
      const card = metricCard(base, []);
      tools.apply(card.chart);
      cards.set(base, card);
    }
    const chart = cards.get(base).chart;
    const key = name + "@" + job.id;
    const val = name !== base;
    if (!chart.find(key)) {
      chart.addSeries({ name: key, color, dash: val ? [5, 4] : null,
        label: who + (val ? " (validation)" : ""), readLabel: who + (val ? " val" : "") });
    }
    chart.set(key, list);
  }
}

/* The overlay's cards in order (loss first, then by name), their legends
 * and point counts painted. */
function overlayCards(cards) {
  const order = [...cards.keys()].sort((a, b) => (a === "loss" ? -1 : b === "loss" ? 1
    : a.localeCompare(b)));
  return order.map((k) => {
    const card = cards.get(k);
    card.paintLegend();
    card.count.textContent = card.chart.points() + " points";
    return card.node;
  });
}
