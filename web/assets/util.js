/* util.js — what every dashboard page shares: building DOM, formatting
 * numbers and times, the API (bearer token from sessionStorage), the metric
 * stream (server-sent events read with fetch, so the token stays in a
 * header), saving a blob as a file, and the confirmation dialog. */
"use strict";

const TOKEN_KEY = "kiln.token";
const CHART_POINTS = 1000; // per series, thinned by the server
const TERMINAL = ["SUCCEEDED", "FAILED", "CANCELLED"];
const WAITING = ["QUEUED", "PREEMPTED"];
const STATES = ["QUEUED", "STARTING", "RUNNING", "STOPPING", "SUCCEEDED", "FAILED", "CANCELLED",
  "PREEMPTED"];

/* ---- DOM and formatting ---- */

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k === "style") e.style.cssText = v; // CSSOM: allowed by the page's CSP
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/* A table inside its own sideways-scrolling box, so a narrow screen scrolls
 * the table and never the page. */
function scrollTable(attrs, heads, body) {
  return el("div", { class: "scroll" }, el("table", attrs,
    el("thead", {}, el("tr", {}, heads.map((h) => h instanceof Node ? h : el("th", {}, h)))),
    body));
}

/* The headings of a table sorted by sort ({key, dir: 1 up, -1 down}): a
 * button per column of cols ({key, title}); a click calls onSort with the
 * new order (that column up, or the other way if it was sorted by it). */
function sortHeads(cols, sort, onSort) {
  return cols.map((c) => el("th", { "aria-sort": sort.key === c.key ? (sort.dir > 0 ? "ascending"
    : "descending") : null }, el("button", { class: "sort", type: "button",
    dataset: { sort: c.key }, onclick: () => onSort({ key: c.key,
      dir: sort.key === c.key ? -sort.dir : 1 }) },
  c.title, sort.key === c.key ? (sort.dir > 0 ? " ▲" : " ▼") : "")));
}

/* Compares two sort values in direction dir; blanks go last either way. */
function bySortValue(x, y, dir) {
  const missing = (v) => v === undefined || v === null || v === "";
  if (missing(x) || missing(y)) return missing(x) - missing(y);
  return (x < y ? -1 : x > y ? 1 : 0) * dir;
}

function badge(state) {
  return el("span", { class: "badge " + state, dataset: { state } }, state);
}

function duration(ms) {
  if (!(ms >= 0)) return "";
  if (ms < 10000) return Number((ms / 1000).toFixed(1)) + "s";
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}

/* What a job's time means now: how long it has waited while it waits, else
 * how long it has trained over every attempt (the server's run_seconds). */
function jobTime(job) {
  if (WAITING.includes(job.state)) {
    const s = job.queue_seconds !== undefined ? job.queue_seconds
      : (Date.now() - Date.parse(job.create_time)) / 1000;
    return { label: "Queued for", seconds: s, text: duration(s * 1000) };
  }
  let s = job.run_seconds;
  if (s === undefined && job.start_time) { // a server from before run_seconds
    const end = job.end_time ? Date.parse(job.end_time) : Date.now();
    s = (end - Date.parse(job.start_time)) / 1000;
  }
  return { label: "Trained for", seconds: s, text: s === undefined ? "" : duration(s * 1000) };
}

function bytes(n) {
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + " MiB";
  if (n >= 1024) return (n / 1024).toFixed(1) + " KiB";
  return n + " B";
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

/* A metric value for a table: four significant digits. */
function num(v) {
  return v === undefined || v === null || !Number.isFinite(Number(v)) ? ""
    : String(Number(Number(v).toPrecision(4)));
}

/* Whether smaller is better for a metric (losses and errors), as Keras's
 * mode "auto" decides it. */
function lowerIsBetter(name) {
  return !/acc|auc|precision|recall/.test(name);
}

function flash(message, ok) {
  const f = document.getElementById("flash");
  f.textContent = message;
  f.className = ok ? "ok" : "";
  f.hidden = !message;
}

/* The job's progress in steps (the server's progress.fraction); "–" where
 * the server does not say. */
function progressBar(job) {
  const p = job.progress;
  const f = p ? p.fraction : job.state === "SUCCEEDED" ? 1 : null;
  if (!(f >= 0)) return el("span", { class: "muted" }, "–");
  const pct = Math.round(f * 100);
  return el("span", { class: "progress", title: pct + "%" },
    el("span", { class: "bar", role: "progressbar", "aria-valuenow": pct, "aria-valuemin": 0,
      "aria-valuemax": 100 }, el("span", { style: "width:" + pct + "%" })), " " + pct + "%");
}

/* Saves a blob as a file named name. */
function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/* Asks a yes/no question in a modal dialog; resolves true for yes. */
function confirmDialog(question, yes, no) {
  return new Promise((resolve) => {
    const old = document.getElementById("confirm");
    if (old) old.remove();
    const d = el("dialog", { id: "confirm", "aria-labelledby": "confirm-text" },
      el("p", { id: "confirm-text" }, question),
      el("div", { class: "row" },
        el("button", { id: "confirm-yes", class: "danger", type: "button" }, yes),
        el("button", { id: "confirm-no", type: "button" }, no)));
    const done = (answer) => {
      d.close();
      d.remove();
      resolve(answer);
    };
    d.querySelector("#confirm-yes").addEventListener("click", () => done(true));
    d.querySelector("#confirm-no").addEventListener("click", () => done(false));
    d.addEventListener("cancel", (ev) => {
      ev.preventDefault();
      done(false);
    });
    document.body.append(d);
    d.showModal();
    d.querySelector("#confirm-no").focus();
  });
}

/* ---- the API ---- */

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || "HTTP " + status);
    this.status = status;
    this.details = e.details || [];
  }
  /* The message with the details that add to it (a detail repeating the
   * message only lends it its field). */
  describe() {
    const same = this.details.find((x) => x.description === this.message);
    const d = this.details.filter((x) => x.description !== this.message)
      .map((x) => (x.field ? x.field + ": " : "") + (x.description || ""));
    return (same && same.field ? same.field + ": " : "") + this.message +
      (d.length ? " (" + d.join("; ") + ")" : "");
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function authHeaders(extra) {
  return Object.assign({ Authorization: "Bearer " + token() }, extra || {});
}

async function api(method, path, opts) {
  opts = opts || {};
  const res = await fetch(path, {
    method,
    headers: authHeaders(opts.body !== undefined ? { "Content-Type": "application/json" } : {}),
    body: opts.body,
    signal: opts.signal,
  });
  if (res.status === 401 && !opts.login) {
    sessionStorage.removeItem(TOKEN_KEY);
    location.hash = "#/login";
    throw new ApiError(401, await res.json().catch(() => null));
  }
  if (!res.ok) throw new ApiError(res.status, await res.json().catch(() => null));
  if (opts.raw) return res;
  return opts.text ? res.text() : res.json();
}

const jobPath = (id) => "/v1/jobs/" + encodeURIComponent(id);
const experimentPath = (id) => "/v1/experiments/" + encodeURIComponent(id);

/* Reads the metric stream after lastId until the job ends or signal aborts;
 * reconnects with Last-Event-ID after a dropped connection. */
async function watchMetrics(jobId, lastId, onPoint, signal) {
  while (!signal.aborted) {
    try {
      const res = await fetch(jobPath(jobId) + "/metrics:watch", {
        headers: authHeaders({ "Last-Event-ID": String(lastId) }),
        signal,
      });
      if (!res.ok) throw new ApiError(res.status, await res.json().catch(() => null));
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const ev = { event: "message", data: "", id: null };
          for (const line of block.split("\n")) {
            const colon = line.indexOf(":");
            if (colon <= 0) continue; // a comment (keep-alive) or blank
            const field = line.slice(0, colon), val = line.slice(colon + 1).replace(/^ /, "");
            if (field === "data") ev.data += val;
            else if (field === "event") ev.event = val;
            else if (field === "id") ev.id = val;
          }
          if (ev.id !== null) lastId = Number(ev.id);
          if (ev.event === "metric") onPoint(JSON.parse(ev.data));
          if (ev.event === "end") return JSON.parse(ev.data || "{}");
        }
      }
    } catch (e) {
      if (signal.aborted) return null;
      if (e instanceof ApiError && e.status < 500) throw e;
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
  return null;
}

/* A spec as rows of [dotted path, value]; layers stay whole unless deep. */
function flattenSpec(spec, deep) {
  const rows = [];
  const walk = (v, path) => {
    if (!deep && path === "model.layers" && Array.isArray(v)) {
      v.forEach((l, i) => rows.push([path + "[" + i + "]", Object.entries(l)
        .filter(([k]) => !/^(name|use_bias|kernel_initializer|bias_initializer)$/.test(k))
        .map(([k, x]) => k === "type" ? x : k + "=" + JSON.stringify(x)).join(" ")]));
    } else if (Array.isArray(v) && v.some((x) => x && typeof x === "object")) {
      v.forEach((x, i) => walk(x, path + "[" + i + "]"));
    } else if (v && typeof v === "object" && !Array.isArray(v)) {
      for (const [k, x] of Object.entries(v)) walk(x, path ? path + "." + k : k);
    } else {
      rows.push([path, Array.isArray(v) ? JSON.stringify(v) : String(v)]);
    }
  };
  walk(spec || {}, "");
  return rows;
}
