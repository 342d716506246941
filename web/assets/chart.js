/* chart.js — kiln's line charts on <canvas>: a few series of points, each
 * with its step, epoch and wall time, drawn against the x axis chosen
 * (step, epoch or time) on a linear or log y axis, at most once per
 * animation frame. Tools: smoothing (TensorBoard's debiased exponential
 * moving average), a hover read-out, drag to zoom, axis labels. Long series
 * are drawn as one min/max pair per pixel column, so drawing stays fast
 * however many points arrive live. */
"use strict";

const PAD = { l: 58, r: 14, t: 10, b: 40 };
const X_LABELS = { step: "step", epoch: "epoch", time: "wall time (s)" };

class KilnChart {
  /* series: [{name: "loss", label: "train", color: "#1d4ed8", dots: false}];
   * opts: {yLabel, readout (an element the hover read-out goes to)}. */
  constructor(canvas, series, opts) {
    opts = opts || {};
    this.canvas = canvas;
    canvas.kilnChart = this;
    this.series = [];
    for (const s of series) this.addSeries(s);
    this.log = false;
    this.smoothing = 0;
    this.mode = "step";
    this.xLabel = X_LABELS.step;
    this.yLabel = opts.yLabel || "";
    this.readout = opts.readout || null;
    this.view = null; // [x0, x1] while zoomed
    this.tickLabels = [];
    this.layout = null;
    this.hoverX = null;
    this.pending = false;
    this.onDrawn = null; // called once after the next draw
    this.onZoom = null; // called with the new range after a drag or reset
    new ResizeObserver(() => this.schedule()).observe(canvas);
    this.listen();
  }

  addSeries(s) {
    const out = Object.assign({ xs: [], ep: [], ts: [], ys: [] }, s);
    this.series.push(out);
    this.schedule();
    return out;
  }

  find(name) {
    return this.series.find((s) => s.name === name);
  }

  /* Replaces a series' points: {step, epoch, time (seconds), value} each. */
  set(name, points) {
    const s = this.find(name);
    if (!s) return;
    s.xs = points.map((p) => p.step);
    s.ep = points.map((p) => p.epoch);
    s.ts = points.map((p) => p.time);
    s.ys = points.map((p) => (p.value === undefined || p.value === null ? NaN : p.value));
    this.schedule();
  }

  add(name, p) {
    const s = this.find(name);
    if (!s || p.value === null || !Number.isFinite(p.value)) return;
    s.xs.push(p.step);
    s.ep.push(p.epoch);
    s.ts.push(p.time);
    s.ys.push(p.value);
    this.schedule();
  }

  points() {
    return this.series.reduce((n, s) => n + s.xs.length, 0);
  }

  setLog(on) {
    this.log = on;
    this.schedule();
  }

  setSmoothing(w) {
    this.smoothing = w;
    this.schedule();
  }

  /* x by "step", "epoch" or "time"; a zoom is dropped (its units change). */
  setMode(mode) {
    this.mode = mode;
    this.xLabel = X_LABELS[mode];
    this.view = null;
    this.schedule();
  }

  setView(range) {
    this.view = range;
    this.schedule();
  }

  xsOf(s) {
    return this.mode === "epoch" ? s.ep : this.mode === "time" ? s.ts : s.xs;
  }

  /* The x range the data spans (with a little room at each end). */
  dataRange() {
    let x0 = Infinity, x1 = -Infinity;
    for (const s of this.series) {
      const xs = this.xsOf(s);
      for (let i = 0; i < xs.length; i++) {
        if (!this.usable(s.ys[i])) continue;
        if (xs[i] < x0) x0 = xs[i];
        if (xs[i] > x1) x1 = xs[i];
      }
    }
    if (x0 === Infinity) return null;
    if (x1 === x0) return [x0 - 1, x1 + 1]; // one point: in the middle, not at an edge
    const room = (x1 - x0) * 0.02;
    return [x0 - room, x1 + room];
  }

  /* The x range shown: the zoom, else all the data. */
  xRange() {
    return this.view ? this.view.slice() : this.dataRange();
  }

  usable(v) {
    return Number.isFinite(v) && !(this.log && v <= 0);
  }

  yOf(v) {
    return this.log ? Math.log10(v) : v;
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.draw();
    });
  }

  /* The values drawn for series s: smoothed unless it is a dotted one. */
  shown(s) {
    return this.smoothing > 0 && !s.dots ? KilnChart.smooth(s.ys, this.smoothing) : s.ys;
  }

  /* The canvas cleared and sized to its box at the screen's pixel ratio:
   * {g (its 2D context), w, h, pw, ph (the plot inside PAD)}; null while
   * it is not laid out. */
  frame() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth, h = c.clientHeight;
    if (w === 0 || h === 0) return null;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    g.font = "11px system-ui, sans-serif";
    g.fillStyle = "#6b7385";
    return { g, w, h, pw: w - PAD.l - PAD.r, ph: h - PAD.t - PAD.b };
  }

  draw() {
    const f = this.frame();
    if (!f) return;
    const { g, w, h, pw, ph } = f;
    const range = this.xRange();
    if (!range) {
      g.fillText("no points yet", PAD.l + 8, PAD.t + 20);
      this.layout = null;
      this.finished();
      return;
    }
    const [x0, x1] = range;
    let y0 = Infinity, y1 = -Infinity;
    for (const s of this.series) {
      const xs = this.xsOf(s), ys = this.shown(s);
      for (let i = 0; i < xs.length; i++) {
        if (!this.usable(ys[i]) || xs[i] < x0 || xs[i] > x1) continue;
        const y = this.yOf(ys[i]);
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
    [y0, y1] = KilnChart.padded(y0, y1);
    const px = (x) => PAD.l + ((x - x0) / (x1 - x0)) * pw;
    const py = (y) => PAD.t + ph - ((y - y0) / (y1 - y0)) * ph;
    this.layout = { x0, x1, pw, ph, px, w };

    const yTicks = (this.log ? KilnChart.logTicks(y0, y1) : KilnChart.ticks(y0, y1, 5))
      .map((t) => [t, KilnChart.format(this.log ? Math.pow(10, t) : t)]);
    this.tickLabels = yTicks.map((t) => t[1]);
    KilnChart.axes(g, { w, h, pw, ph, px, py, yTicks,
      xTicks: KilnChart.ticks(x0, x1, Math.max(2, Math.floor(pw / 80)))
        .map((t) => [t, KilnChart.format(t)]),
      xLabel: this.xLabel, yLabel: this.yLabel + (this.log ? " (log)" : "") });

    g.save();
    g.beginPath();
    g.rect(PAD.l - 4, PAD.t - 4, pw + 8, ph + 8); // room for a dot on the edge
    g.clip();
    for (const s of this.series) {
      if (this.smoothing > 0 && !s.dots) this.drawSeries(g, s, s.ys, px, py, pw, 0.25);
      this.drawSeries(g, s, this.shown(s), px, py, pw, 1);
    }
    if (this.drag) {
      g.fillStyle = "rgba(29, 78, 216, 0.12)";
      g.fillRect(Math.min(this.drag.a, this.drag.b), PAD.t, Math.abs(this.drag.b - this.drag.a), ph);
    } else if (this.hoverX !== null) {
      g.strokeStyle = "#9ca3af";
      g.beginPath();
      g.moveTo(Math.round(px(this.hoverX)) + 0.5, PAD.t);
      g.lineTo(Math.round(px(this.hoverX)) + 0.5, PAD.t + ph);
      g.stroke();
    }
    g.restore();
    this.finished();
  }

  drawSeries(g, s, ys, px, py, pw, alpha) {
    const xs = this.xsOf(s);
    const n = xs.length;
    if (n === 0) return;
    g.globalAlpha = alpha;
    g.strokeStyle = s.color;
    g.fillStyle = s.color;
    g.lineWidth = 1.5;
    g.setLineDash(s.dash || []);
    let usable = 0;
    for (let i = 0; i < n && usable < 2; i++) if (this.usable(ys[i])) usable++;
    g.beginPath();
    if (n <= pw * 2) {
      let first = true;
      for (let i = 0; i < n; i++) {
        if (!this.usable(ys[i])) continue;
        const X = px(xs[i]), Y = py(this.yOf(ys[i]));
        if (first) g.moveTo(X, Y);
        else g.lineTo(X, Y);
        first = false;
      }
      g.stroke();
      g.setLineDash([]);
      if ((s.dots || usable === 1) && alpha === 1) { // a lone point is a dot, not nothing
        for (let i = 0; i < n; i++) {
          if (!this.usable(ys[i])) continue;
          g.beginPath();
          g.arc(px(xs[i]), py(this.yOf(ys[i])), 3.5, 0, 2 * Math.PI);
          g.fill();
        }
      }
      g.globalAlpha = 1;
      return;
    }
    // One vertical min..max stroke per pixel column.
    let col = -1, lo = 0, hi = 0;
    const flush = () => {
      if (col < 0) return;
      g.moveTo(col + 0.5, lo);
      g.lineTo(col + 0.5, hi + 1);
    };
    for (let i = 0; i < n; i++) {
      if (!this.usable(ys[i])) continue;
      const X = Math.round(px(xs[i])), Y = py(this.yOf(ys[i]));
      if (X !== col) {
        flush();
        col = X;
        lo = hi = Y;
      } else {
        if (Y < lo) lo = Y;
        if (Y > hi) hi = Y;
      }
    }
    flush();
    g.stroke();
    g.setLineDash([]);
    g.globalAlpha = 1;
  }

  /* The x value under a mouse event, or null outside the plot. */
  xAt(ev) {
    const L = this.layout;
    if (!L) return null;
    const r = this.canvas.getBoundingClientRect();
    const X = ev.clientX - r.left;
    if (X < PAD.l || X > PAD.l + L.pw) return null;
    return L.x0 + ((X - PAD.l) / L.pw) * (L.x1 - L.x0);
  }

  /* Each series' point nearest x, as the read-out's text. */
  readAt(x) {
    const parts = [];
    let at = null;
    for (const s of this.series) {
      const xs = this.xsOf(s), ys = this.shown(s);
      let best = -1;
      for (let i = 0; i < xs.length; i++) {
        if (!this.usable(ys[i])) continue;
        if (best < 0 || Math.abs(xs[i] - x) < Math.abs(xs[best] - x)) best = i;
      }
      if (best < 0) continue;
      if (at === null) at = s.xs[best];
      parts.push((s.readLabel || s.name) + " " + KilnChart.format(ys[best]));
    }
    if (at === null) return "";
    return "step " + at + " · " + parts.join(" · ");
  }

  listen() {
    const c = this.canvas;
    c.addEventListener("mousedown", (ev) => {
      const r = c.getBoundingClientRect();
      if (this.xAt(ev) !== null) this.drag = { a: ev.clientX - r.left, b: ev.clientX - r.left };
    });
    c.addEventListener("mousemove", (ev) => {
      const r = c.getBoundingClientRect();
      if (this.drag) this.drag.b = ev.clientX - r.left;
      const x = this.xAt(ev);
      this.hoverX = x;
      if (this.readout) this.readout.textContent = x === null ? "" : this.readAt(x);
      this.schedule();
    });
    c.addEventListener("mouseleave", () => {
      this.hoverX = null;
      this.drag = null;
      this.schedule();
    });
    c.addEventListener("mouseup", (ev) => {
      const d = this.drag;
      this.drag = null;
      const L = this.layout;
      if (!d || !L || Math.abs(d.b - d.a) < 5) {
        this.schedule();
        return;
      }
      const toX = (X) => L.x0 + ((Math.min(Math.max(X, PAD.l), PAD.l + L.pw) - PAD.l) / L.pw) *
        (L.x1 - L.x0);
      const range = [toX(Math.min(d.a, d.b)), toX(Math.max(d.a, d.b))];
      this.setView(range);
      if (this.onZoom) this.onZoom(range);
      ev.preventDefault();
    });
    // Keyboard: the canvas takes focus; + and - zoom, 0 resets.
    c.tabIndex = 0;
    c.addEventListener("keydown", (ev) => {
      const r = this.xRange();
      if (!r) return;
      const mid = (r[0] + r[1]) / 2, half = (r[1] - r[0]) / 2;
      let next = null;
      if (ev.key === "+" || ev.key === "=") next = [mid - half / 2, mid + half / 2];
      else if (ev.key === "-") next = [mid - half * 2, mid + half * 2];
      else if (ev.key === "0") next = null;
      else return;
      this.setView(next);
      if (this.onZoom) this.onZoom(next);
      ev.preventDefault();
    });
  }

  /* Calls fn once the points set so far are on the canvas. */
  whenDrawn(fn) {
    this.onDrawn = fn;
    this.schedule();
  }

  finished() {
    const fn = this.onDrawn;
    this.onDrawn = null;
    if (fn) fn();
  }

  /* The range lo..hi with 5% room at each end (0..1 when empty, one unit
   * wide around a single value). */
  static padded(lo, hi) {
    if (lo === Infinity) return [0, 1];
    if (hi === lo) return [lo - 0.5, hi + 0.5];
    const margin = (hi - lo) * 0.05;
    return [lo - margin, hi + margin];
  }

  /* The grid, tick labels and axis labels of a plot laid out by a: its size
   * (w, h; the plot pw by ph inside PAD), px and py (axis value to pixel),
   * xTicks and yTicks ([value on the axis, label] each), xLabel, yLabel. */
  static axes(g, a) {
    g.strokeStyle = "#dfe3ea";
    g.lineWidth = 1;
    g.fillStyle = "#6b7385";
    g.beginPath();
    g.textAlign = "right";
    for (const [t, label] of a.yTicks) {
      const yy = Math.round(a.py(t)) + 0.5;
      g.moveTo(PAD.l, yy);
      g.lineTo(PAD.l + a.pw, yy);
      g.fillText(label, PAD.l - 6, yy + 4);
    }
    g.textAlign = "center";
    for (const [t, label] of a.xTicks) {
      const xx = Math.round(a.px(t)) + 0.5;
      g.moveTo(xx, PAD.t);
      g.lineTo(xx, PAD.t + a.ph);
      g.fillText(label, xx, PAD.t + a.ph + 14);
    }
    g.stroke();
    g.fillText(a.xLabel, PAD.l + a.pw / 2, a.h - 6);
    g.save();
    g.translate(11, PAD.t + a.ph / 2);
    g.rotate(-Math.PI / 2);
    g.fillText(a.yLabel, 0, 0);
    g.restore();
    g.textAlign = "left";
  }

  /* TensorBoard's smoothing: an exponential moving average with weight w,
   * debiased (divided by 1 - w^n) so the first points are not pulled to 0. */
  static smooth(ys, w) {
    const out = new Array(ys.length);
    let last = 0, n = 0;
    for (let i = 0; i < ys.length; i++) {
      const v = ys[i];
      if (!Number.isFinite(v)) {
        out[i] = v;
        continue;
      }
      last = last * w + (1 - w) * v;
      n++;
      out[i] = w === 0 ? v : last / (1 - Math.pow(w, n));
    }
    return out;
  }

  /* About n round tick values from lo to hi. */
  static ticks(lo, hi, n) {
    const span = hi - lo;
    const step0 = Math.pow(10, Math.floor(Math.log10(span / n)));
    const err = (n * step0) / span;
    const step = err <= 0.15 ? step0 * 10 : err <= 0.35 ? step0 * 5 : err <= 0.75 ? step0 * 2
      : step0;
    const out = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) out.push(t);
    return out;
  }

  /* Log-axis ticks between log10 values lo and hi: 1, 2, 5 x 10^k, thinned
   * to the powers of ten (then every other one) when they would crowd; as
   * log10 values. */
  static logTicks(lo, hi) {
    const pick = (mantissas, every) => {
      const out = [];
      for (let k = Math.floor(lo); k <= Math.ceil(hi); k++) {
        if (k % every) continue;
        for (const m of mantissas) {
          const t = k + Math.log10(m);
          if (t >= lo - 1e-9 && t <= hi + 1e-9) out.push(t);
        }
      }
      return out;
    };
    let out = pick([1, 2, 5], 1);
    if (out.length > 7) out = pick([1], 1);
    for (let every = 2; out.length > 7; every *= 2) out = pick([1], every);
    if (out.length < 2) out = pick([1, 2, 3, 4, 5, 6, 7, 8, 9], 1);
    return out;
  }

  static format(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) {
      return Number(v.toPrecision(2)).toExponential().replace("e+", "e");
    }
    if (a >= 100) return String(Math.round(v));
    return String(Number(v.toPrecision(3)));
  }
}

window.KilnChart = KilnChart;
