/* app.js — the kiln dashboard: one page, views chosen by the URL's hash
 * (#/jobs, #/jobs/ID, #/queue, #/devices, #/submit). Every API call sends
 * the bearer token the user logged in with, kept in this tab's
 * sessionStorage only; live metrics are read with fetch() streaming
 * (server-sent events parsed here) so the token travels in the
 * Authorization header and never in a URL. */
"use strict";

const TOKEN_KEY = "kiln.token";
const CHART_POINTS = 1000; // per series, thinned by the server
const TERMINAL = ["SUCCEEDED", "FAILED", "CANCELLED"];
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

function badge(state) {
  return el("span", { class: "badge " + state, dataset: { state } }, state);
}

function duration(ms) {
  if (!(ms >= 0)) return "";
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}

/* Time the job has run (or waited, while queued). */
function jobDuration(job) {
  const t = (k) => (job[k] ? Date.parse(job[k]) : null);
  const start = t("start_time") || t("create_time");
  const end = t("end_time") || (TERMINAL.includes(job.state) ? start : Date.now());
  return duration(end - start);
}

function bytes(n) {
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + " MiB";
  if (n >= 1024) return (n / 1024).toFixed(1) + " KiB";
  return n + " B";
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

function flash(message, ok) {
  const f = document.getElementById("flash");
  f.textContent = message;
  f.className = ok ? "ok" : "";
  f.hidden = !message;
}

/* ---- the API ---- */

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || "HTTP " + status);
    this.status = status;
    this.details = e.details || [];
  }
  describe() {
    const d = this.details.filter((x) => x.description !== this.message)
      .map((x) => (x.field ? x.field + ": " : "") + (x.description || ""));
    return this.message + (d.length ? " (" + d.join("; ") + ")" : "");
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

/* Epochs finished (from the per-epoch points) over the spec's epochs. */
async function epochProgress(job, signal) {
  const epochs = (job.spec && job.spec.epochs) || 1;
  if (job.state === "SUCCEEDED") return 1;
  const doc = await api("GET", jobPath(job.id) + "/metrics?name=epoch_loss", { signal });
  const done = new Set(doc.metrics.map((p) => p.epoch)).size;
  return Math.min(1, done / epochs);
}

function progressBar(fraction) {
  if (fraction === null || fraction === undefined) return el("span", { class: "muted" }, "–");
  const pct = Math.round(fraction * 100);
  return el("span", { class: "progress", title: pct + "%" },
    el("span", { class: "bar" }, el("span", { style: "width:" + pct + "%" })), " " + pct + "%");
}

/* ---- views: each renders into main and returns a cleanup function ---- */

function viewLogin(main) {
  const input = el("input", { type: "password", id: "token", autocomplete: "off",
    placeholder: "paste a kiln bearer token" });
  const msg = el("p", { class: "error", id: "login-error" });
  const form = el("form", { class: "card login", id: "login-form" },
    el("h1", {}, "Log in to kiln"),
    el("p", { class: "muted" }, "The token stays in this browser tab (sessionStorage) and is sent " +
      "only to this server, as an Authorization header."),
    input, el("button", { class: "primary", type: "submit" }, "Log in"), msg);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    try {
      await api("GET", "/v1/pools", { login: true });
      location.hash = "#/jobs";
    } catch (e) {
      sessionStorage.removeItem(TOKEN_KEY);
      msg.textContent = e instanceof ApiError ? e.describe() : String(e);
    }
  });
  main.append(form);
  input.focus();
}

function viewJobs(main, params) {
  const abort = new AbortController();
  const stateSel = el("select", { id: "filter-state" }, el("option", { value: "" }, "all states"),
    STATES.map((s) => el("option", { value: s, selected: params.get("state") === s }, s)));
  const text = el("input", { type: "text", id: "filter-text", placeholder: "name or id contains",
    value: params.get("q") || "" });
  const body = el("tbody", { id: "jobs-body" });
  const more = el("p", { class: "muted" });
  main.append(el("h1", {}, "Jobs"),
    el("div", { class: "row card" }, el("label", {}, "State ", stateSel), text,
      el("a", { href: "#/submit" }, "Submit a job")),
    el("div", { class: "card" }, el("table", { id: "jobs" },
      el("thead", {}, el("tr", {}, ["Job", "Name", "State", "Progress", "Duration", "Created",
        "Tenant"].map((h) => el("th", {}, h)))), body), more));
  let jobs = [];
  const progress = new Map();

  const paint = () => {
    const q = text.value.trim().toLowerCase();
    body.replaceChildren(...jobs
      .filter((j) => !q || j.id.toLowerCase().includes(q) ||
        (j.display_name || "").toLowerCase().includes(q))
      .map((j) => el("tr", { dataset: { job: j.id } },
        el("td", {}, el("a", { href: "#/jobs/" + j.id }, j.id)),
        el("td", {}, j.display_name || ""),
        el("td", {}, badge(j.state)),
        el("td", {}, progressBar(progress.get(j.id))),
        el("td", { class: "num" }, jobDuration(j)),
        el("td", {}, when(j.create_time)),
        el("td", {}, j.tenant || ""))));
    if (!body.children.length) body.append(el("tr", {}, el("td", { colspan: 7, class: "muted" },
      "No jobs match.")));
  };
  const load = async () => {
    const filter = stateSel.value ? "&filter=" + encodeURIComponent("state=" + stateSel.value) : "";
    try {
      const doc = await api("GET", "/v1/jobs?page_size=200" + filter, { signal: abort.signal });
      jobs = doc.jobs;
      more.textContent = doc.next_page_token ? "Showing the newest 200 jobs." : "";
      // Progress moves only while a job runs: ask again for those, once for
      // the others (a cancelled or failed job keeps the epochs it finished).
      const ask = [];
      for (const j of jobs) {
        if (j.state === "SUCCEEDED") progress.set(j.id, 1);
        else if (["RUNNING", "STOPPING"].includes(j.state) || !progress.has(j.id)) ask.push(j);
      }
      paint();
      for (const j of ask) progress.set(j.id, await epochProgress(j, abort.signal));
      if (ask.length) paint();
    } catch (e) {
      if (!abort.signal.aborted) flash(e.message);
    }
  };
  stateSel.addEventListener("change", () => {
    history.replaceState(null, "", "#/jobs" + (stateSel.value ? "?state=" + stateSel.value : ""));
    load();
  });
  text.addEventListener("input", paint);
  load();
  const timer = setInterval(load, 2000);
  return () => {
    clearInterval(timer);
    abort.abort();
  };
}

/* The names a job's second chart shows: accuracy, or the regression metrics. */
function metricNames(job) {
  const m = (job.spec && job.spec.metrics) || ["accuracy"];
  return m.length ? m[0] : "accuracy";
}

function chartCard(id, title, series) {
  const canvas = el("canvas", { class: "chart", id });
  const chart = new KilnChart(canvas, series);
  const legend = el("div", { class: "legend" }, series.map((s) =>
    el("span", {}, el("i", { style: "background:" + s.color }), s.label)));
  const count = el("span", { class: "muted", id: id + "-count" });
  return { chart, count, node: el("div", { class: "card" },
    el("div", { class: "row" }, el("h2", { style: "margin:0" }, title), count), canvas, legend) };
}

function viewJob(main, params, id) {
  const abort = new AbortController();
  let job = null;
  let stopped = false;
  const head = el("div", { class: "card", id: "job-head" });
  const explain = el("div", { id: "job-explain" });
  const logToggle = el("input", { type: "checkbox", id: "log-scale" });
  const chartStatus = el("span", { class: "muted", id: "chart-status" });
  const metric = "accuracy";
  const loss = chartCard("chart-loss", "Loss", [
    { name: "loss", label: "train loss", color: "#1d4ed8" },
    { name: "val_loss", label: "validation loss", color: "#c2410c", dots: true }]);
  const acc = chartCard("chart-metric", "Accuracy", [
    { name: metric, label: "train", color: "#1d4ed8" },
    { name: "val_" + metric, label: "validation", color: "#c2410c", dots: true }]);
  const spec = el("pre", { id: "job-spec" });
  const events = el("ol", { class: "timeline", id: "job-events" });
  const logs = el("pre", { id: "job-logs" });
  const ckpts = el("tbody", { id: "job-checkpoints" });
  const ckptMsg = el("p", { class: "error", id: "checkpoint-error" });
  main.append(head, explain,
    el("div", { class: "row" }, el("label", {}, logToggle, " log scale"),
      chartStatus),
    el("div", { class: "grid2" }, loss.node, acc.node),
    el("div", { class: "grid2" },
      el("div", { class: "card" }, el("h2", {}, "Events"), events),
      el("div", { class: "card" }, el("h2", {}, "Checkpoints"),
        el("table", {}, el("thead", {}, el("tr", {}, ["Step", "Attempt", "Size", "SHA-256", "Pinned",
          ""].map((h) => el("th", {}, h)))), ckpts), ckptMsg)),
    el("div", { class: "card" }, el("h2", {}, "Logs"), logs),
    el("div", { class: "card" }, el("h2", {}, "Spec"), spec));
  logToggle.addEventListener("change", () => {
    loss.chart.setLog(logToggle.checked);
    acc.chart.setLog(logToggle.checked);
  });

  const charts = [loss.chart, acc.chart];
  let loaded = 0, streamed = 0, live = false;
  const counts = () => {
    chartStatus.textContent = loaded + " points loaded (the " +
      "server thins each series to " + CHART_POINTS + ")" + (streamed ? ", " + streamed +
      " streamed" : "") + (live ? " · following live" : "");
    loss.count.textContent = loss.chart.points() + " points";
    acc.count.textContent = acc.chart.points() + " points";
  };
  const addPoint = (p) => {
    for (const c of charts) c.add(p.name, p.step, p.value);
  };

  const act = async (verb) => {
    try {
      await api("POST", jobPath(id) + ":" + verb);
      flash("", true);
      refresh();
      if (verb === "resume") startWatch();
    } catch (e) {
      flash(verb + " failed: " + e.describe());
    }
  };
  const paintHead = () => {
    const active = !TERMINAL.includes(job.state);
    head.replaceChildren(
      el("div", { class: "row" }, el("h1", { style: "margin:0" }, job.display_name || job.id),
        badge(job.state), el("span", { class: "muted" }, job.id)),
      el("dl", { class: "kv", style: "margin-top:10px" },
        el("dt", {}, "Reason"), el("dd", { id: "job-reason" }, job.reason + (job.message ? ": " +
          job.message : "")),
        el("dt", {}, "Duration"), el("dd", {}, jobDuration(job)),
        el("dt", {}, "Attempt"), el("dd", {}, job.attempt),
        el("dt", {}, "Created"), el("dd", {}, when(job.create_time)),
        el("dt", {}, "Latest"), el("dd", {}, Object.entries(job.latest_metrics || {})
          .map(([k, v]) => k + " " + Number(v).toPrecision(4)).join(" · "))),
      el("div", { class: "row", style: "margin-top:10px" },
        el("button", { class: "danger", id: "cancel", disabled: !active,
          onclick: () => act("cancel") }, "Cancel"),
        el("button", { id: "resume", disabled: !["CANCELLED", "FAILED"].includes(job.state),
          onclick: () => act("resume") }, "Resume")));
  };
  const paintEvents = (list) => {
    events.replaceChildren(...list.map((e) => el("li", { dataset: { to: e.to_state } },
      el("strong", {}, e.to_state), " ", el("span", { class: "muted" }, when(e.time) + " · " +
        e.reason), e.message ? el("div", {}, e.message) : null)));
  };
  const download = async (c) => {
    try {
      const res = await api("GET", jobPath(id) + "/checkpoints/" + c.id + ":download",
        { raw: true });
      const url = URL.createObjectURL(await res.blob());
      const a = el("a", { href: url, download: id + "-step" + c.step + ".safetensors" });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      ckptMsg.textContent = "download failed: " + e.describe();
    }
  };
  const pin = async (c, verb) => {
    try {
      await api("POST", jobPath(id) + "/checkpoints/" + c.id + ":" + verb);
      ckptMsg.textContent = "";
      loadCheckpoints();
    } catch (e) {
      ckptMsg.textContent = verb + " failed: " + e.describe();
    }
  };
  const loadCheckpoints = async () => {
    const doc = await api("GET", jobPath(id) + "/checkpoints", { signal: abort.signal });
    ckpts.replaceChildren(...doc.checkpoints.map((c) => el("tr", { dataset: { checkpoint: c.id } },
      el("td", { class: "num" }, c.step), el("td", {}, c.attempt), el("td", {}, bytes(c.bytes)),
      el("td", { title: c.sha256 }, (c.sha256 || "").slice(0, 12)),
      el("td", {}, c.pinned ? "yes" : "no"),
      el("td", {}, el("button", { class: "download", onclick: () => download(c) }, "Download"), " ",
        c.pinned ? el("button", { class: "unpin", onclick: () => pin(c, "unpin") }, "Unpin")
          : el("button", { class: "pin", onclick: () => pin(c, "pin") }, "Pin")))));
    if (!doc.checkpoints.length) ckpts.append(el("tr", {}, el("td", { colspan: 6,
      class: "muted" }, "No checkpoints yet.")));
  };
  let refreshing = false;
  const refresh = async () => {
    if (refreshing) return;
    refreshing = true;
    try {
      job = await api("GET", jobPath(id), { signal: abort.signal });
      paintHead();
      const [ev, text] = await Promise.all([
        api("GET", jobPath(id) + "/events", { signal: abort.signal }),
        api("GET", jobPath(id) + "/logs", { signal: abort.signal, text: true }),
      ]);
      paintEvents(ev.events);
      logs.textContent = text || "(no output yet)";
      logs.scrollTop = logs.scrollHeight;
      await loadCheckpoints();
      if (job.state === "QUEUED") {
        const why = await api("GET", jobPath(id) + ":explain", { signal: abort.signal });
        explain.replaceChildren(el("div", { class: "card" }, el("h2", {}, "Why it waits"),
          el("ul", {}, why.reasons.map((r) => el("li", {}, el("strong", {}, r.code), " ",
            r.message)))));
      } else {
        explain.replaceChildren();
      }
    } catch (e) {
      if (!abort.signal.aborted) flash(e.message);
    }
    refreshing = false;
  };

  let watching = false;
  let lastSeq = 0;
  const startWatch = async () => {
    if (watching || stopped) return;
    watching = true;
    live = true;
    counts();
    try {
      await watchMetrics(id, lastSeq, (p) => {
        lastSeq = Math.max(lastSeq, p.seq || 0);
        streamed++;
        addPoint(p);
        counts();
        // Points mean it runs: show that now, not at the next poll.
        if (job && job.state !== "RUNNING") refresh();
      }, abort.signal);
    } catch (e) {
      if (!abort.signal.aborted) flash("live metrics: " + e.message);
    }
    watching = false;
    live = false;
    counts();
    if (!stopped) refresh();
  };

  // First paint: the job, then the charts from a thinned copy of the points,
  // then the live stream from the last point that copy holds.
  (async () => {
    // Both requests at once: the server's time for each is most of the load.
    const metricsReq = api("GET", jobPath(id) + "/metrics?max_points=" + CHART_POINTS,
      { signal: abort.signal });
    metricsReq.catch(() => {}); // answered below
    try {
      job = await api("GET", jobPath(id), { signal: abort.signal });
    } catch (e) {
      if (!abort.signal.aborted) main.replaceChildren(el("p", { class: "error" }, e.message));
      return;
    }
    paintHead();
    spec.textContent = JSON.stringify(job.spec, null, 2);
    const m = metricNames(job);
    acc.chart.series[0].name = m;
    acc.chart.series[1].name = "val_" + m;
    acc.node.querySelector("h2").textContent = m === "accuracy" ? "Accuracy" : m;
    let doc;
    try {
      doc = await metricsReq;
    } catch (e) {
      if (!abort.signal.aborted) flash("metrics: " + e.message);
      return;
    }
    const byName = new Map();
    for (const p of doc.metrics) {
      lastSeq = Math.max(lastSeq, p.seq || 0);
      if (!byName.has(p.name)) byName.set(p.name, { xs: [], ys: [] });
      const s = byName.get(p.name);
      s.xs.push(p.step);
      s.ys.push(p.value === undefined ? NaN : p.value);
    }
    let pending = charts.length;
    const drawn = () => {
      if (--pending) return;
      performance.mark("kiln-charts-drawn");
      document.body.dataset.chartsDrawn = String(performance.now());
    };
    for (const c of charts) {
      for (const s of c.series) {
        const got = byName.get(s.name);
        if (got) c.set(s.name, got.xs, got.ys);
      }
      c.whenDrawn(drawn);
    }
    loaded = doc.metrics.length;
    counts();
    refresh();
    if (!TERMINAL.includes(job.state)) startWatch();
  })();
  const timer = setInterval(() => {
    if (job && !TERMINAL.includes(job.state)) refresh();
  }, 1000);
  return () => {
    stopped = true;
    clearInterval(timer);
    abort.abort();
  };
}

function viewQueue(main) {
  const abort = new AbortController();
  const running = el("tbody", { id: "queue-running" });
  const queued = el("tbody", { id: "queue-body" });
  main.append(el("h1", {}, "Queue"),
    el("div", { class: "card" }, el("h2", {}, "Running"), el("table", {}, el("thead", {},
      el("tr", {}, ["Job", "Name", "State", "Duration"].map((h) => el("th", {}, h)))), running)),
    el("div", { class: "card" }, el("h2", {}, "Waiting"), el("table", {}, el("thead", {},
      el("tr", {}, ["Job", "Name", "Priority", "Jobs ahead", "Why it waits"].map((h) =>
        el("th", {}, h)))), queued)));
  const load = async () => {
    try {
      const list = (state) => api("GET", "/v1/jobs?page_size=1000&order_by=create_time&filter=" +
        encodeURIComponent("state=" + state), { signal: abort.signal }).then((d) => d.jobs);
      const [q, starting, run, stopping] = await Promise.all(
        ["QUEUED", "STARTING", "RUNNING", "STOPPING"].map(list));
      const active = starting.concat(run, stopping);
      running.replaceChildren(...active.map((j) => el("tr", {},
        el("td", {}, el("a", { href: "#/jobs/" + j.id }, j.id)), el("td", {}, j.display_name),
        el("td", {}, badge(j.state)), el("td", {}, jobDuration(j)))));
      if (!active.length) running.append(el("tr", {}, el("td", { colspan: 4, class: "muted" },
        "Nothing runs.")));
      const why = await Promise.all(q.map((j) => api("GET", jobPath(j.id) + ":explain",
        { signal: abort.signal }).catch((e) => ({ reasons: [{ code: "ERROR", message: e.message }]
      }))));
      const rows = q.map((j, i) => {
        const ahead = why[i].reasons.find((r) => r.code === "JOBS_AHEAD");
        return { j, why: why[i], ahead: ahead ? parseInt(ahead.message, 10) : 0 };
      }).sort((a, b) => a.ahead - b.ahead);
      queued.replaceChildren(...rows.map(({ j, why: w, ahead }) => el("tr", { dataset: { job: j.id } },
        el("td", {}, el("a", { href: "#/jobs/" + j.id }, j.id)), el("td", {}, j.display_name),
        el("td", { class: "num" }, j.priority), el("td", { class: "num" }, ahead),
        el("td", {}, w.reasons.map((r) => el("div", {}, el("strong", {}, r.code), " ",
          r.message))))));
      if (!q.length) queued.append(el("tr", {}, el("td", { colspan: 5, class: "muted" },
        "No job waits.")));
    } catch (e) {
      if (!abort.signal.aborted) flash(e.message);
    }
  };
  load();
  const timer = setInterval(load, 2000);
  return () => {
    clearInterval(timer);
    abort.abort();
  };
}

function viewDevices(main) {
  const abort = new AbortController();
  const pools = el("tbody", { id: "pools-body" });
  const devices = el("tbody", { id: "devices-body" });
  main.append(el("h1", {}, "Devices and pools"),
    el("div", { class: "card" }, el("h2", {}, "Pools"), el("table", {}, el("thead", {},
      el("tr", {}, ["Pool", "Device type", "Devices", "Busy"].map((h) => el("th", {}, h)))), pools)),
    el("div", { class: "card" }, el("h2", {}, "Devices"), el("table", {}, el("thead", {},
      el("tr", {}, ["Device", "Type", "Pool", "State", "Job"].map((h) => el("th", {}, h)))),
      devices)));
  const load = async () => {
    try {
      const [p, d] = await Promise.all([api("GET", "/v1/pools", { signal: abort.signal }),
        api("GET", "/v1/devices", { signal: abort.signal })]);
      pools.replaceChildren(...p.pools.map((x) => el("tr", {}, el("td", {}, x.id),
        el("td", {}, x.device_type), el("td", { class: "num" }, x.devices),
        el("td", { class: "num" }, x.devices_busy))));
      devices.replaceChildren(...d.devices.map((x) => el("tr", {}, el("td", {}, x.name),
        el("td", {}, x.type), el("td", {}, x.pool), el("td", {}, x.busy ? "busy" : "free"),
        el("td", {}, x.job ? el("a", { href: "#/jobs/" + x.job }, x.job) : ""))));
    } catch (e) {
      if (!abort.signal.aborted) flash(e.message);
    }
  };
  load();
  const timer = setInterval(load, 2000);
  return () => {
    clearInterval(timer);
    abort.abort();
  };
}

function viewSubmit(main) {
  const pick = el("select", { id: "example" }, el("option", { value: "" }, "pick an example…"));
  const file = el("input", { type: "file", id: "spec-file", accept: ".json,application/json" });
  const area = el("textarea", { id: "spec", spellcheck: "false",
    placeholder: "paste a job spec (JSON), or pick an example or a file" });
  const result = el("div", { id: "submit-result" });
  const validate = el("button", { id: "validate", type: "button" }, "Validate");
  const submit = el("button", { id: "submit", class: "primary", type: "button" }, "Submit");
  main.append(el("h1", {}, "Submit a job"),
    el("div", { class: "card" }, el("div", { class: "row" }, pick, file), el("p"), area,
      el("div", { class: "row", style: "margin-top:10px" }, validate, submit), result));

  const show = (ok, text, details) => {
    result.replaceChildren(el("p", { class: ok ? "" : "error" }, text),
      details && details.length ? el("ul", {}, details.map((d) =>
        el("li", {}, el("code", {}, d.field || ""), " ", d.description || ""))) : null);
    result.dataset.ok = ok ? "1" : "0";
  };
  const check = async () => {
    try {
      JSON.parse(area.value);
    } catch (e) {
      show(false, "Not valid JSON: " + e.message);
      return false;
    }
    try {
      await api("POST", "/v1/jobs?validate_only=true", { body: area.value });
      show(true, "The spec is valid.");
      return true;
    } catch (e) {
      show(false, e.message, e.details);
      return false;
    }
  };
  fetch("/assets/examples/index.json").then((r) => r.json()).then((doc) => {
    for (const name of doc.examples) pick.append(el("option", { value: name }, name));
  });
  pick.addEventListener("change", async () => {
    if (!pick.value) return;
    area.value = await (await fetch("/assets/examples/" + pick.value)).text();
    result.replaceChildren();
  });
  file.addEventListener("change", async () => {
    if (file.files[0]) area.value = await file.files[0].text();
  });
  validate.addEventListener("click", check);
  submit.addEventListener("click", async () => {
    submit.disabled = true;
    try {
      if (!(await check())) return;
      const rid = "web-" + crypto.randomUUID();
      const job = await api("POST", "/v1/jobs?request_id=" + rid, { body: area.value });
      location.hash = "#/jobs/" + job.id;
    } catch (e) {
      show(false, e.message, e.details);
    } finally {
      submit.disabled = false;
    }
  });
}

/* ---- routing ---- */

let cleanup = null;

function route() {
  if (cleanup) cleanup();
  cleanup = null;
  flash("");
  const main = document.getElementById("view");
  main.replaceChildren();
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  const loggedIn = !!token();
  document.getElementById("nav").hidden = !loggedIn;
  document.getElementById("logout").hidden = !loggedIn;
  if (!loggedIn || parts[0] === "login") {
    viewLogin(main);
    return;
  }
  for (const a of document.querySelectorAll("nav a"))
    a.classList.toggle("active", a.dataset.view === (parts[0] || "jobs"));
  const views = { jobs: viewJobs, queue: viewQueue, devices: viewDevices, submit: viewSubmit };
  if (parts[0] === "jobs" && parts[1]) cleanup = viewJob(main, params, decodeURIComponent(parts[1]));
  else cleanup = (views[parts[0]] || viewJobs)(main, params) || null;
}

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  location.hash = "#/login";
});
window.addEventListener("hashchange", route);
route();
