/* scatter.js — the experiment page's scatter plots on <canvas>: one point
 * per trial, a metric (y) against one parameter's value (x) on a linear,
 * log (log_uniform parameters) or category (categorical ones) x axis, the
 * best point ringed. Hover reads out the nearest point; a click on one
 * calls onPick. A KilnChart (chart.js) for its canvas, frame, axes, ticks
 * and drawing once per animation frame. */
"use strict";

class KilnScatter extends KilnChart {
  /* opts: {xLabel, yLabel, scale: "linear" | "log" | "category",
   * categories (the category axis' values, in order), readout (an element
   * the hover read-out goes to), onPick (called with a point clicked)}. */
  constructor(canvas, opts) {
    super(canvas, [], opts);
    canvas.kilnScatter = this;
    this.xLabel = opts.xLabel || "";
    this.scale = opts.scale || "linear";
    this.categories = opts.categories || [];
    this.onPick = opts.onPick || null;
    this.data = []; // {key, x, y, label, color, best}
    this.drawn = []; // {key, X, Y}: where each point was drawn last
    this.xTickLabels = [];
    this.hover = null; // the key of the point under the mouse
  }

  /* Replaces the points: {key, x (the parameter's value), y (the metric),
   * label (the read-out), color, best}; points without a finite y or x are
   * left out. */
  set(points) {
    this.data = points.filter((p) => Number.isFinite(p.y) && Number.isFinite(this.xOf(p.x)));
    this.schedule();
  }

  points() {
    return this.data.length;
  }

  /* A parameter's value on the x axis: log10 of it on a log axis, its
   * place on a category axis; NaN where it has none. */
  xOf(v) {
    if (this.scale === "category") {
      const i = this.categories.findIndex((c) => String(c) === String(v));
      return i < 0 ? NaN : i;
    }
    const x = Number(v);
    if (this.scale === "log") return x > 0 ? Math.log10(x) : NaN;
    return v === null || v === undefined || v === "" ? NaN : x;
  }

  xTicks(x0, x1, pw) {
    if (this.scale === "category") {
      return this.categories.map((c, i) => [i, typeof c === "number" ? KilnChart.format(c)
        : String(c)]);
    }
    if (this.scale === "log") {
      let ticks = KilnChart.logTicks(x0, x1);
      const decades = ticks.filter((t) => Math.abs(t - Math.round(t)) < 1e-9);
      if (ticks.length > pw / 50 && decades.length >= 2) ticks = decades; // room for each label
      return ticks.map((t) => [t, KilnChart.format(Math.pow(10, t))]);
    }
    return KilnChart.ticks(x0, x1, Math.max(2, Math.floor(pw / 80)))
      .map((t) => [t, KilnChart.format(t)]);
  }

  draw() {
    const f = this.frame();
    if (!f) return;
    const { g, w, h, pw, ph } = f;
    this.drawn = [];
    if (!this.data.length) {
      g.fillText("no trial has the metric yet", PAD.l + 8, PAD.t + 20);
      this.layout = null;
      this.finished();
      return;
    }
    const xs = this.data.map((p) => this.xOf(p.x)), ys = this.data.map((p) => p.y);
    let [x0, x1] = this.scale === "category" ? [-0.5, this.categories.length - 0.5]
      : KilnChart.padded(Math.min(...xs), Math.max(...xs));
    const [y0, y1] = KilnChart.padded(Math.min(...ys), Math.max(...ys));
    if (x1 <= x0) x1 = x0 + 1;
    const px = (x) => PAD.l + ((x - x0) / (x1 - x0)) * pw;
    const py = (y) => PAD.t + ph - ((y - y0) / (y1 - y0)) * ph;
    this.layout = { x0, x1, pw, ph, px, w };
    const xTicks = this.xTicks(x0, x1, pw);
    const yTicks = KilnChart.ticks(y0, y1, 5).map((t) => [t, KilnChart.format(t)]);
    this.xTickLabels = xTicks.map((t) => t[1]);
    this.tickLabels = yTicks.map((t) => t[1]);
    KilnChart.axes(g, { w, h, pw, ph, px, py, xTicks, yTicks,
      xLabel: this.xLabel + (this.scale === "log" ? " (log)" : ""), yLabel: this.yLabel });
    // The best last, so it is on top.
    const order = this.data.map((p, i) => i).sort((a, b) => this.data[a].best -
      this.data[b].best);
    for (const i of order) {
      const p = this.data[i];
      const X = px(xs[i]), Y = py(ys[i]);
      this.drawn.push({ key: p.key, X, Y });
      g.globalAlpha = 0.85;
      g.fillStyle = p.color || PALETTE[0];
      g.beginPath();
      g.arc(X, Y, 4.5, 0, 2 * Math.PI);
      g.fill();
      g.globalAlpha = 1;
      if (p.best || p.key === this.hover) {
        g.strokeStyle = p.best ? "#ca8a04" : "#1d2330";
        g.lineWidth = 2;
        g.beginPath();
        g.arc(X, Y, 8, 0, 2 * Math.PI);
        g.stroke();
      }
    }
    this.finished();
  }

  /* The point drawn nearest the mouse event, within 12 pixels; null if none. */
  pointAt(ev) {
    const r = this.canvas.getBoundingClientRect();
    const mx = ev.clientX - r.left, my = ev.clientY - r.top;
    let best = null, bestD = 144;
    for (const d of this.drawn) {
      const dd = (d.X - mx) ** 2 + (d.Y - my) ** 2;
      if (dd <= bestD) {
        best = d;
        bestD = dd;
      }
    }
    return best && this.data.find((p) => p.key === best.key);
  }

  listen() {
    const c = this.canvas;
    c.addEventListener("mousemove", (ev) => {
      const p = this.pointAt(ev);
      const key = p ? p.key : null;
      if (this.readout) this.readout.textContent = p ? p.label : "";
      c.style.cursor = p && this.onPick ? "pointer" : "";
      if (key !== this.hover) {
        this.hover = key;
        this.schedule();
      }
    });
    c.addEventListener("mouseleave", () => {
      this.hover = null;
      this.schedule();
    });
    c.addEventListener("click", (ev) => {
      const p = this.pointAt(ev);
      if (p && this.onPick) this.onPick(p);
    });
  }
}

window.KilnScatter = KilnScatter;
