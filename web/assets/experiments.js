/* experiments.js — the experiments list (#/experiments): each search's
 * state, searcher, metric, trials done of all, the best value so far and
 * the epochs trained, a page at a time (the server's page tokens), filtered
 * by state, refreshed every 2 s. */
"use strict";

const EXPERIMENT_STATES = ["RUNNING", "SUCCEEDED", "CANCELLED", "FAILED"];
const EXPERIMENTS_PAGE = 50;

/* What an experiment's trials are doing, in a few words. */
function trialCounts(x) {
  return [["waiting", x.trials_waiting], ["running", x.trials_running],
    ["paused", x.trials_paused], ["stopped", x.trials_stopped], ["failed", x.trials_failed]]
    .filter(([, n]) => n > 0).map(([w, n]) => n + " " + w).join(" · ");
}

function viewExperiments(main, params) {
  const abort = new AbortController();
  const signal = abort.signal;
  const stateSel = el("select", { id: "experiments-state" },
    el("option", { value: "" }, "all states"),
    EXPERIMENT_STATES.map((s) => el("option", { value: s, selected: params.get("state") === s },
      s)));
  const body = el("tbody", { id: "experiments-body" });
  const newer = el("button", { id: "experiments-newer", type: "button", disabled: true },
    "← Previous page");
  const older = el("button", { id: "experiments-older", type: "button", disabled: true },
    "Next page →");
  const where = el("span", { class: "muted", id: "experiments-page" });
  main.append(el("h1", {}, "Experiments"),
    el("div", { class: "row card" }, el("label", {}, "State ", stateSel),
      el("span", { class: "muted" }, "Start one with POST /v1/experiments or kiln exp create.")),
    el("div", { class: "card" },
      scrollTable({ id: "experiments" }, ["Experiment", "State", "Searcher", "Metric", "Trials",
        "Best", "Epochs trained", "Created"], body),
      el("div", { class: "row", style: "margin-top:10px" }, newer, where, older)));
  const tokens = [""]; // the page token of each page up to the one shown
  let page = 0;

  const paint = (list) => {
    body.replaceChildren(...list.map((x) => {
      const s = x.search || {};
      return el("tr", { dataset: { experiment: x.id } },
        el("td", {}, el("a", { href: "#/experiments/" + encodeURIComponent(x.id) },
          x.display_name || x.id), el("div", { class: "muted small" }, x.id)),
        el("td", {}, badge(x.state)), el("td", {}, s.searcher || ""),
        el("td", {}, (s.metric || "") + (s.mode ? " (" + s.mode + ")" : "")),
        el("td", { class: "num" }, (x.trials_done || 0) + " done of " + (x.trial_count || 0),
          el("div", { class: "muted small" }, trialCounts(x))),
        el("td", { class: "num", dataset: { value: x.best_trial ? String(x.best_trial.metric)
          : "" } }, x.best_trial ? num(x.best_trial.metric) : ""),
        el("td", { class: "num" }, x.epochs_trained || 0), el("td", {}, when(x.create_time)));
    }));
    if (!list.length) body.append(el("tr", {}, el("td", { colspan: 8, class: "muted" },
      page ? "No more experiments." : "No experiments yet.")));
  };
  const load = async () => {
    const q = new URLSearchParams({ page_size: String(EXPERIMENTS_PAGE) });
    if (tokens[page]) q.set("page_token", tokens[page]);
    if (stateSel.value) q.set("filter", "state=" + stateSel.value);
    try {
      const doc = await api("GET", "/v1/experiments?" + q, { signal });
      paint(doc.experiments || []);
      tokens.length = page + 1;
      if (doc.next_page_token) tokens.push(doc.next_page_token);
      newer.disabled = page === 0;
      older.disabled = !doc.next_page_token;
      where.textContent = page || doc.next_page_token ? "page " + (page + 1) : "";
    } catch (e) {
      if (!signal.aborted) flash(e instanceof ApiError ? e.describe() : e.message);
    }
  };
  newer.addEventListener("click", () => {
    page = Math.max(0, page - 1);
    load();
  });
  older.addEventListener("click", () => {
    if (tokens[page + 1]) page++;
    load();
  });
  stateSel.addEventListener("change", () => {
    tokens.length = 1;
    page = 0;
    history.replaceState(null, "", "#/experiments" + (stateSel.value ? "?state=" +
      stateSel.value : ""));
    load();
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
