/* experiment.js — an experiment's page (#/experiments/ID): its head (state,
 * search, metric, trials, epochs trained, the best trial, Cancel with a
 * confirmation), its trials as a sortable table (each parameter's value,
 * the metric, trial and job state, epochs trained, rung; the best marked),
 * the metric against each parameter (a scatter per parameter, on a log x
 * axis for a log_uniform one), the learning curves of the trials picked
 * overlaid (as in Compare), and its events. Refreshed every 2 s while it or
 * a trial's job runs. */
"use strict";

const TRIAL_STATES = ["WAITING", "RUNNING", "PAUSED", "PROMOTED", "STOPPED", "DONE", "FAILED"];
const TRIAL_ENDED = ["STOPPED", "DONE", "FAILED"];
const CURVES_PICKED = 3; // trials whose curves show until the user picks

/* The sortable columns of the trials table for the experiment x. */
function trialColumns(x) {
  const search = x.search || {};
  const value = (v) => (v === undefined || v === null ? "" : typeof v === "number" ? num(v)
    : String(v));
  const cols = [{ key: "index", title: "#", num: true, get: (t) => t.index }];
  for (const p of Object.keys(search.parameters || {})) {
    cols.push({ key: "p:" + p, title: p, num: true, get: (t) => (t.values || {})[p],
      cell: (t) => value((t.values || {})[p]) });
  }
  cols.push({ key: "metric", title: search.metric || "metric", num: true, get: (t) => t.metric,
    cell: (t) => num(t.metric) },
  { key: "trial_state", title: "Trial", get: (t) => TRIAL_STATES.indexOf(t.trial_state),
    cell: (t) => badge(t.trial_state) },
  { key: "state", title: "Job state", get: (t) => STATES.indexOf(t.state),
    cell: (t) => (t.state ? badge(t.state) : "") },
  { key: "epochs", title: "Epochs", num: true, get: (t) => t.epochs_trained },
  { key: "rung", title: "Rung", num: true, get: (t) => t.rung },
  { key: "job", title: "Job", get: (t) => t.job || "",
    cell: (t) => (t.job ? el("a", { href: "#/jobs/" + encodeURIComponent(t.job) }, t.job) : "") });
  return cols;
}

/* How a scatter's x axis shows parameter p of the search: log for a
 * log_uniform one, the values in order for a categorical one. */
function parameterAxis(p) {
  if (p.type === "log_uniform") return { scale: "log" };
  if (p.type === "categorical") return { scale: "category", categories: p.values || [] };
  return { scale: "linear" };
}

function viewExperiment(main, params, id) {
  const abort = new AbortController();
  const signal = abort.signal;
  let x = null; // the experiment
  let trials = [];
  let sort = null;
  let picked = new Set(); // job ids whose curves show
  let userPicked = false;
  const head = el("div", { class: "card", id: "experiment-head" });
  const headRow = el("tr");
  const body = el("tbody", { id: "trials-body" });
  const scatterBox = el("div", { class: "grid2", id: "scatters" });
  const scatters = new Map(); // parameter -> KilnScatter
  let cards = new Map(); // the curves' charts by base metric name
  const tools = chartToolbar(() => [...cards.values()].map((c) => c.chart), "epoch");
  const chartsBox = el("div", { class: "grid2", id: "trial-charts" });
  const curvesNote = el("span", { class: "muted", id: "curves-note" });
  const clear = el("button", { id: "curves-clear", type: "button" }, "Clear");
  const compare = el("a", { id: "curves-compare" }, "Compare…");
  const events = el("ol", { class: "timeline", id: "experiment-events" });
  main.append(head,
    el("div", { class: "card" }, el("h2", { style: "margin-top:0" }, "Trials"),
      el("div", { class: "scroll" }, el("table", { id: "trials" }, el("thead", {}, headRow),
        body))),
    el("h2", {}, "The metric against each parameter"), scatterBox,
    el("div", { class: "row" }, el("h2", {}, "Learning curves"), curvesNote, clear, compare),
    tools.node, chartsBox,
    el("div", { class: "card" }, el("h2", { style: "margin-top:0" }, "Events"), events));

  const color = (t) => PALETTE[t.index % PALETTE.length];
  const isBest = (t) => !!(x.best_trial && t.job && x.best_trial.job === t.job);
  const better = (a, b) => (x.search.mode === "min" ? a.metric - b.metric : b.metric - a.metric);
  const running = () => !TERMINAL.includes(x.state) ||
    trials.some((t) => t.state && !TERMINAL.includes(t.state));

  /* ---- head ---- */
  const cancel = async () => {
    const ok = await confirmDialog("Cancel " + (x.display_name || id) + "? Its running trials " +
      "stop now and no new ones start.", "Cancel experiment", "Keep it");
    if (!ok) return;
    try {
      await api("POST", experimentPath(id) + ":cancel");
      refresh();
    } catch (e) {
      flash("cancel failed: " + e.describe());
    }
  };
  const paintHead = () => {
    const s = x.search || {};
    const a = s.asha;
    const best = x.best_trial;
    const bestIndex = !best ? null : best.index !== undefined ? best.index
      : (trials.find((t) => t.job === best.job) || {}).index;
    const kv = [
      x.message ? ["Message", el("span", { id: "experiment-message" }, x.message)] : null,
      ["Search", s.searcher + (a ? " (rungs from " + a.min_epochs + " to " + a.max_epochs +
        " epochs, reduction factor " + a.reduction_factor + ")" : "") + ", seed " + s.seed],
      ["Metric", s.metric + " (" + (s.mode === "min" ? "lower" : "higher") + " is better)"],
      ["Trials", el("span", { id: "experiment-trials" }, x.trial_count + " of at most " +
        s.max_trials + ", " + s.max_concurrent_trials + " at a time" +
        (trialCounts(x) ? ": " + trialCounts(x) : "") + (x.trials_done ? ", " + x.trials_done +
          " done" : ""))],
      ["Epochs trained", x.epochs_trained],
      ["Best trial", best ? el("span", { id: "experiment-best" },
        el("a", { href: "#/jobs/" + encodeURIComponent(best.job) }, bestIndex !== undefined
          ? "trial " + bestIndex : best.job), ": " + s.metric + " " + num(best.metric) + " after " +
        best.epochs + " epochs, " + Object.entries(best.values || {})
          .map(([k, v]) => k + " " + (typeof v === "number" ? num(v) : v)).join(", "))
        : el("span", { class: "muted" }, "none yet")],
      ["Created", when(x.create_time)],
      x.end_time ? ["Ended", when(x.end_time)] : null,
    ].filter(Boolean);
    head.replaceChildren(
      el("div", { class: "row" }, el("h1", { style: "margin:0" }, x.display_name || x.id),
        badge(x.state), el("span", { class: "muted" }, x.id)),
      el("dl", { class: "kv", style: "margin-top:10px" },
        kv.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
      el("div", { class: "row", style: "margin-top:10px" },
        el("button", { class: "danger", id: "experiment-cancel",
          disabled: TERMINAL.includes(x.state), onclick: cancel }, "Cancel experiment"),
        el("a", { href: "#/experiments" }, "All experiments")));
  };

  /* ---- the trials table ---- */
  const togglePick = (job, on) => {
    userPicked = true;
    if (on) picked.add(job);
    else picked.delete(job);
    paintTable();
    paintScatters();
    loadCurves();
  };
  const paintTable = () => {
    const cols = trialColumns(x);
    if (!sort) sort = { key: "metric", dir: x.search.mode === "min" ? 1 : -1 };
    headRow.replaceChildren(el("th", {}, el("span", { class: "sr-only" }, "Show curves")),
      ...sortHeads(cols, sort, (next) => {
        sort = next;
        paintTable();
      }));
    const col = cols.find((c) => c.key === sort.key) || cols[0];
    const shown = trials.slice().sort((a, b) => bySortValue(col.get(a), col.get(b), sort.dir) ||
      a.index - b.index);
    body.replaceChildren(...shown.map((t) => el("tr", { class: isBest(t) ? "best" : null,
      dataset: { job: t.job || "", index: String(t.index) } },
    el("td", {}, t.job ? el("label", { class: "pick-curve" }, el("input", { type: "checkbox",
      class: "pick", checked: picked.has(t.job), "aria-label": "show trial " + t.index +
        "'s curves", onchange: (ev) => togglePick(t.job, ev.target.checked) }),
    picked.has(t.job) ? el("i", { class: "swatch", style: "background:" + color(t) }) : "")
      : ""),
    cols.map((c) => {
      const v = c.get(t);
      return el("td", { class: c.num ? "num" : null, dataset: { col: c.key,
        value: v === undefined || v === null ? "" : String(v) } },
      c.cell ? c.cell(t) : v === undefined || v === null ? "" : String(v),
      c.key === "index" && isBest(t) ? [" ", el("span", { class: "badge best",
        title: "the best trial by " + x.search.metric }, "★ best")] : null);
    }))));
    if (!trials.length) body.append(el("tr", {}, el("td", { colspan: cols.length + 1,
      class: "muted" }, "No trials yet.")));
  };

  /* ---- the metric against each parameter ---- */
  const paintScatters = () => {
    const search = x.search || {};
    for (const [p, spec] of Object.entries(search.parameters || {})) {
      if (!scatters.has(p)) {
        const readout = el("div", { class: "readout muted" });
        const canvas = el("canvas", { class: "chart scatter", dataset: { param: p }, role: "img",
          "aria-label": search.metric + " against " + p + ", a point per trial" });
        const chart = new KilnScatter(canvas, Object.assign({ xLabel: p, yLabel: search.metric,
          readout, onPick: (pt) => togglePick(pt.key, !picked.has(pt.key)) },
        parameterAxis(spec)));
        scatters.set(p, chart);
        scatterBox.append(el("div", { class: "card" }, el("h2", { style: "margin:0" },
          search.metric + " against " + p), canvas, readout));
      }
      scatters.get(p).set(trials.filter((t) => t.metric !== null && t.metric !== undefined)
        .map((t) => {
          const v = (t.values || {})[p];
          return { key: t.job, x: v, y: t.metric, best: isBest(t),
            color: picked.has(t.job) ? color(t) : "#94a3b8",
            label: "trial " + t.index + " · " + p + " " + (typeof v === "number" ? num(v) : v) +
              " · " + search.metric + " " + num(t.metric) + " · " + t.epochs_trained +
              " epochs" };
        }));
    }
  };

  /* ---- the learning curves of the trials picked ---- */
  // job id -> {metrics: its points, final: fetched once its trial had ended}
  const docs = new Map();
  const loading = new Map(); // job id (+ " final") -> its points' request in flight, shared
  let drawnPicks = "";
  /* Until the user picks, the best trials so far (the first ones while
   * none has the metric). */
  const pickBest = () => {
    if (userPicked) return;
    const ranked = trials.filter((t) => t.job && Number.isFinite(t.metric)).sort(better);
    const first = (ranked.length ? ranked : trials.filter((t) => t.job)).slice(0, CURVES_PICKED);
    picked = new Set(first.map((t) => t.job));
  };
  const loadCurves = async () => {
    const chosen = trials.filter((t) => picked.has(t.job));
    curvesNote.textContent = chosen.length ? "trials " + chosen.map((t) => t.index).join(", ") +
      (userPicked ? "" : " (the best so far; tick others in the table)")
      : "tick trials in the table, or click their points, to draw their curves";
    compare.href = "#/compare?jobs=" + chosen.map((t) => encodeURIComponent(t.job)).join(",");
    const base = baseName(x.search.metric || "loss");
    const keep = (name) => [base, "loss"].includes(baseName(name));
    try {
      await Promise.all(chosen.map((t) => {
        if ((docs.get(t.job) || {}).final) return null;
        // Known before the points are asked for. A paused ASHA trial's job has
        // ended too, but resumes when promoted: only an ended trial is final.
        const ended = TERMINAL.includes(t.state) && TRIAL_ENDED.includes(t.trial_state);
        const key = t.job + (ended ? " final" : "");
        if (!loading.has(key)) {
          loading.set(key, api("GET", jobPath(t.job) + "/metrics?max_points=" + CHART_POINTS,
            { signal }).then((doc) => {
            if (ended || !(docs.get(t.job) || {}).final) {
              docs.set(t.job, { metrics: doc.metrics, final: ended });
            }
          }).finally(() => loading.delete(key)));
        }
        return loading.get(key);
      }));
    } catch (e) {
      if (!signal.aborted) flash("curves: " + (e instanceof ApiError ? e.describe() : e.message));
      return;
    }
    // The picks as they are now: they may have changed while this loaded.
    const draw = trials.filter((t) => picked.has(t.job) && docs.has(t.job));
    const now = draw.map((t) => t.job).join(",");
    if (now !== drawnPicks) {
      cards = new Map(); // a trial dropped: draw the charts anew
      drawnPicks = now;
    }
    for (const t of draw) {
      overlayJob(cards, tools, { id: t.job, display_name: "trial " + t.index }, color(t),
        docs.get(t.job).metrics, keep);
    }
    chartsBox.replaceChildren(...overlayCards(cards));
    whenAllDrawn([...cards.values()].map((c) => c.chart));
  };
  clear.addEventListener("click", () => {
    userPicked = true;
    picked = new Set();
    paintTable();
    paintScatters();
    loadCurves();
  });

  const paintEvents = (list) => {
    events.replaceChildren(...list.map((e) => el("li", { dataset: { reason: e.reason } },
      el("strong", {}, e.reason), " ", el("span", { class: "muted" }, when(e.time)),
      e.job ? [" ", el("a", { href: "#/jobs/" + encodeURIComponent(e.job) }, e.job)] : null,
      e.message ? el("div", {}, e.message) : null)));
    if (!list.length) events.append(el("li", { class: "muted" }, "No events yet."));
  };

  /* ---- refresh ---- */
  const allTrials = async () => {
    const out = [];
    let pageToken = "";
    do {
      const doc = await api("GET", experimentPath(id) + "/trials?page_size=1000" +
        (pageToken ? "&page_token=" + encodeURIComponent(pageToken) : ""), { signal });
      out.push(...doc.trials);
      pageToken = doc.next_page_token || "";
    } while (pageToken);
    return out.sort((a, b) => a.index - b.index);
  };
  let refreshing = false;
  const refresh = async () => {
    if (refreshing) return;
    refreshing = true;
    try {
      const [exp, list, ev] = await Promise.all([api("GET", experimentPath(id), { signal }),
        allTrials(), api("GET", experimentPath(id) + "/events", { signal })]);
      x = exp;
      trials = list;
      pickBest();
      paintHead();
      paintTable();
      paintScatters();
      paintEvents(ev.events || []);
      await loadCurves();
      document.body.dataset.experimentLoaded = String(performance.now());
    } catch (e) {
      if (signal.aborted) return;
      if (!x) main.replaceChildren(el("p", { class: "error" }, e instanceof ApiError
        ? e.describe() : e.message));
      else flash(e instanceof ApiError ? e.describe() : e.message);
    } finally {
      refreshing = false;
    }
  };
  refresh();
  const timer = setInterval(() => {
    if (x && running()) refresh();
  }, 2000);
  return () => {
    clearInterval(timer);
    abort.abort();
  };
}
