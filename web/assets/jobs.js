/* jobs.js — the jobs list (#/jobs): state and name filters, progress in
 * steps, the key hyperparameters and the latest and best value of the
 * metrics chosen, every column sortable, and a checkbox per job to compare
 * the jobs picked (#/compare?jobs=a,b). */
"use strict";

const DEFAULT_METRIC_COLUMNS = "val_loss, val_accuracy";

/* A sortable column: key, its heading, the value it sorts by, its cell. */
function jobColumns(metrics, stats) {
  const spec = (j) => j.spec || {};
  const text = (v) => (v === undefined || v === null ? "" : String(v));
  const cols = [
    { key: "name", title: "Job", get: (j) => j.display_name || j.id,
      cell: (j) => [el("a", { href: "#/jobs/" + encodeURIComponent(j.id) },
        j.display_name || j.id), el("div", { class: "muted small" }, j.id)] },
    { key: "state", title: "State", get: (j) => j.state, cell: (j) => badge(j.state) },
    { key: "progress", title: "Progress", get: (j) => (j.progress ? j.progress.fraction : -1),
      cell: (j) => progressBar(j) },
    { key: "time", title: "Time", get: (j) => jobTime(j).seconds,
      cell: (j) => {
        const t = jobTime(j);
        return el("span", { title: t.label }, (t.label === "Queued for" ? "queued " : "") + t.text);
      } },
    { key: "optimizer", title: "Optimizer", get: (j) => text((spec(j).optimizer || {}).type) },
    { key: "lr", title: "Learning rate", num: true,
      get: (j) => (spec(j).optimizer || {}).learning_rate },
    { key: "batch", title: "Batch size", num: true,
      get: (j) => (spec(j).pipeline || {}).batch_size },
    { key: "precision", title: "Precision", get: (j) => spec(j).precision || "float32" },
    { key: "strategy", title: "Strategy", get: (j) => {
      const s = spec(j).strategy;
      return s ? s.type + (s.replicas > 1 ? " ×" + s.replicas : "") : "single";
    } },
  ];
  for (const m of metrics) {
    for (const kind of ["latest", "best"]) {
      cols.push({ key: kind + ":" + m, title: kind + " " + m, num: true, metric: true,
        get: (j) => (stats.get(j.id + "\n" + m) || {})[kind] });
    }
  }
  cols.push({ key: "created", title: "Created", get: (j) => j.create_time,
    cell: (j) => when(j.create_time) },
  { key: "tenant", title: "Tenant", get: (j) => j.tenant || "" });
  return cols;
}

/* The latest and best value of one metric over all of a job's points. */
function metricStats(name, points) {
  if (!points.length) return {};
  const last = points.reduce((a, p) => (p.step >= a.step ? p : a));
  const values = points.map((p) => p.value).filter(Number.isFinite);
  return { latest: last.value,
    best: lowerIsBetter(name) ? Math.min(...values) : Math.max(...values) };
}

function viewJobs(main, params) {
  const abort = new AbortController();
  const signal = abort.signal;
  const stateSel = el("select", { id: "filter-state" }, el("option", { value: "" }, "all states"),
    STATES.map((s) => el("option", { value: s, selected: params.get("state") === s }, s)));
  const text = el("input", { type: "search", id: "filter-text", placeholder: "name or id contains",
    "aria-label": "name or id contains", value: params.get("q") || "" });
  const metricInput = el("input", { type: "text", id: "metric-cols",
    value: params.get("metrics") || DEFAULT_METRIC_COLUMNS, size: 24 });
  const compare = el("button", { id: "compare", type: "button", disabled: true },
    "Compare selected");
  const headRow = el("tr");
  const body = el("tbody", { id: "jobs-body" });
  const more = el("p", { class: "muted" });
  main.append(el("h1", {}, "Jobs"),
    el("div", { class: "row card" }, el("label", {}, "State ", stateSel), text,
      el("label", {}, "Metric columns ", metricInput), compare,
      el("a", { href: "#/submit" }, "Submit a job")),
    el("div", { class: "card" }, el("div", { class: "scroll" }, el("table", { id: "jobs" },
      el("thead", {}, headRow), body)), more));
  let jobs = [];
  const picked = new Set();
  const stats = new Map(); // job id + "\n" + metric -> {latest, best}
  let sort = { key: params.get("sort") || "created", dir: params.get("sort") ? 1 : -1 };
  const metrics = () => metricInput.value.split(",").map((s) => s.trim()).filter(Boolean);

  const paint = () => {
    const cols = jobColumns(metrics(), stats);
    headRow.replaceChildren(el("th", {}, el("span", { class: "sr-only" }, "Select")),
      ...sortHeads(cols, sort, (next) => {
        sort = next;
        paint();
      }));
    const q = text.value.trim().toLowerCase();
    const col = cols.find((c) => c.key === sort.key) || cols[0];
    const key = (j) => col.get(j);
    const shown = jobs.filter((j) => !q || j.id.toLowerCase().includes(q) ||
      (j.display_name || "").toLowerCase().includes(q))
      .sort((a, b) => bySortValue(key(a), key(b), sort.dir));
    body.replaceChildren(...shown.map((j) => el("tr", { dataset: { job: j.id } },
      el("td", {}, el("input", { type: "checkbox", class: "pick", checked: picked.has(j.id),
        "aria-label": "select " + j.id + " to compare", onchange: (ev) => {
          if (ev.target.checked) picked.add(j.id);
          else picked.delete(j.id);
          compare.disabled = !picked.size;
        } })),
      cols.map((c) => {
        const v = c.get(j);
        return el("td", { class: c.num ? "num" : null, dataset: { col: c.key,
          value: v === undefined ? "" : String(v) } },
        c.cell ? c.cell(j) : c.metric ? num(v) : v === undefined ? "" : String(v));
      }))));
    if (!body.children.length) body.append(el("tr", {}, el("td", { colspan: cols.length + 1,
      class: "muted" }, "No jobs match.")));
  };
  /* Fetches the chosen metrics of the jobs that lack them or still run. */
  const loadStats = async () => {
    const todo = [];
    for (const j of jobs) {
      for (const m of metrics()) {
        const k = j.id + "\n" + m;
        if (!stats.has(k) || !TERMINAL.includes(j.state)) todo.push([j, m, k]);
      }
    }
    let changed = false;
    const worker = async () => {
      for (let t; (t = todo.shift());) {
        const [j, m, k] = t;
        const doc = await api("GET", jobPath(j.id) + "/metrics?name=" + encodeURIComponent(m),
          { signal });
        stats.set(k, metricStats(m, doc.metrics));
        changed = true;
      }
    };
    await Promise.all([worker(), worker(), worker(), worker()]);
    if (changed) paint();
  };
  const load = async () => {
    const filter = stateSel.value ? "&filter=" + encodeURIComponent("state=" + stateSel.value) : "";
    try {
      const doc = await api("GET", "/v1/jobs?page_size=200" + filter, { signal });
      jobs = doc.jobs;
      more.textContent = doc.next_page_token ? "Showing the newest 200 jobs." : "";
      paint();
      await loadStats();
    } catch (e) {
      if (!signal.aborted) flash(e instanceof ApiError ? e.describe() : e.message);
    }
  };
  const remember = () => {
    const p = new URLSearchParams();
    if (stateSel.value) p.set("state", stateSel.value);
    if (metricInput.value !== DEFAULT_METRIC_COLUMNS) p.set("metrics", metricInput.value);
    history.replaceState(null, "", "#/jobs" + (p.toString() ? "?" + p : ""));
  };
  stateSel.addEventListener("change", () => {
    remember();
    load();
  });
  metricInput.addEventListener("change", () => {
    remember();
    paint();
    loadStats();
  });
  text.addEventListener("input", paint);
  compare.addEventListener("click", () => {
    location.hash = "#/compare?jobs=" + [...picked].map(encodeURIComponent).join(",");
  });
  load();
  let busy = false;
  const timer = setInterval(async () => {
    if (busy) return;
    busy = true;
    await load();
    busy = false;
  }, 2000);
  return () => {
    clearInterval(timer);
    abort.abort();
  };
}
