/* chart.js — kiln's line charts on <canvas>: a few series of (step, value)
 * points, linear or log y axis, drawn at most once per animation frame.
 * Long series are drawn as one min/max pair per pixel column, so drawing
 * stays fast however many points arrive live. */
"use strict";

class KilnChart {
  /* series: [{name: "loss", label: "train", color: "#1d4ed8", dots: false}] */
  constructor(canvas, series) {
    this.canvas = canvas;
    this.series = series.map((s) => Object.assign({ xs: [], ys: [] }, s));
    this.log = false;
    this.pending = false;
    this.onDrawn = null; // called once after the next draw
    new ResizeObserver(() => this.schedule()).observe(canvas);
  }

  find(name) {
    return this.series.find((s) => s.name === name);
  }

  /* Replaces a series' points; xs ascending is not required. */
  set(name, xs, ys) {
    const s = this.find(name);
    if (!s) return;
    s.xs = xs;
    s.ys = ys;
    this.schedule();
  }

  add(name, x, y) {
    const s = this.find(name);
    if (!s || y === null || !Number.isFinite(y)) return;
    s.xs.push(x);
    s.ys.push(y);
    this.schedule();
  }

  points() {
    return this.series.reduce((n, s) => n + s.xs.length, 0);
  }

  setLog(on) {
    this.log = on;
    this.schedule();
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.draw();
    });
  }

  yOf(v) {
    return this.log ? Math.log10(v) : v;
  }

  draw() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth, h = c.clientHeight;
    if (w === 0 || h === 0) return;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const pad = { l: 56, r: 12, t: 10, b: 26 };
    const pw = w - pad.l - pad.r, ph = h - pad.t - pad.b;

    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const s of this.series) {
      for (let i = 0; i < s.xs.length; i++) {
        const v = s.ys[i];
        if (!Number.isFinite(v) || (this.log && v <= 0)) continue;
        const y = this.yOf(v);
        if (s.xs[i] < x0) x0 = s.xs[i];
        if (s.xs[i] > x1) x1 = s.xs[i];
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
    g.font = "11px system-ui, sans-serif";
    g.fillStyle = "#6b7385";
    if (x0 === Infinity) {
      g.fillText("no points yet", pad.l + 8, pad.t + 20);
      this.finished();
      return;
    }
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) {
      y0 -= 0.5;
      y1 += 0.5;
    }
    const margin = (y1 - y0) * 0.05;
    y0 -= margin;
    y1 += margin;
    const px = (x) => pad.l + ((x - x0) / (x1 - x0)) * pw;
    const py = (y) => pad.t + ph - ((y - y0) / (y1 - y0)) * ph;

    // Axes and ticks.
    g.strokeStyle = "#dfe3ea";
    g.lineWidth = 1;
    g.beginPath();
    for (const t of ticks(y0, y1, 5)) {
      const yy = Math.round(py(t)) + 0.5;
      g.moveTo(pad.l, yy);
      g.lineTo(pad.l + pw, yy);
      const label = this.log ? formatNumber(Math.pow(10, t)) : formatNumber(t);
      g.fillText(label, 4, yy + 4);
    }
    for (const t of ticks(x0, x1, 6)) {
      const xx = Math.round(px(t)) + 0.5;
      g.moveTo(xx, pad.t);
      g.lineTo(xx, pad.t + ph);
      g.fillText(formatNumber(t), xx - 10, h - 8);
    }
    g.stroke();

    g.save();
    g.beginPath();
    g.rect(pad.l, pad.t, pw, ph);
    g.clip();
    for (const s of this.series) this.drawSeries(g, s, px, py, pw);
    g.restore();
    this.finished();
  }

  drawSeries(g, s, px, py, pw) {
    const n = s.xs.length;
    if (n === 0) return;
    g.strokeStyle = s.color;
    g.fillStyle = s.color;
    g.lineWidth = 1.5;
    g.beginPath();
    if (n <= pw * 2) {
      let first = true;
      for (let i = 0; i < n; i++) {
        const v = s.ys[i];
        if (!Number.isFinite(v) || (this.log && v <= 0)) continue;
        const X = px(s.xs[i]), Y = py(this.yOf(v));
        if (first) g.moveTo(X, Y);
        else g.lineTo(X, Y);
        first = false;
      }
      g.stroke();
      if (s.dots) {
        for (let i = 0; i < n; i++) {
          const v = s.ys[i];
          if (!Number.isFinite(v) || (this.log && v <= 0)) continue;
          g.fillRect(px(s.xs[i]) - 2, py(this.yOf(v)) - 2, 4, 4);
        }
      }
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
      const v = s.ys[i];
      if (!Number.isFinite(v) || (this.log && v <= 0)) continue;
      const X = Math.round(px(s.xs[i])), Y = py(this.yOf(v));
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
}

/* About n round tick values from lo to hi. */
function ticks(lo, hi, n) {
  const span = hi - lo;
  const step0 = Math.pow(10, Math.floor(Math.log10(span / n)));
  const err = (n * step0) / span;
  const step = err <= 0.15 ? step0 * 10 : err <= 0.35 ? step0 * 5 : err <= 0.75 ? step0 * 2 : step0;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) out.push(t);
  return out;
}

function formatNumber(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  if (a >= 100) return String(Math.round(v));
  return String(Number(v.toPrecision(3)));
}

window.KilnChart = KilnChart;
