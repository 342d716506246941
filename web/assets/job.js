/* job.js — a job's page (#/jobs/ID): its head (state, time, progress,
 * the experiment it is a trial of, Cancel with a confirmation, Resume,
 * Clone into Submit), a chart per
 * metric it reports with the chart tools, why it waits, events,
 * checkpoints with their metrics and the best mark, the profile, the logs
 * (search, download) and its hyperparameters as a table. */
"use strict";

const CLONE_KEY = "kiln.clone";

function viewJob(main, params, id) {
  const abort = new AbortController();
  const signal = abort.signal;
  let job = null;
  let stopped = false;
  const head = el("div", { class: "card", id: "job-head" });
  const explain = el("div", { id: "job-explain" });
  const chartStatus = el("span", { class: "muted", id: "chart-status" });
  const cards = new Map(); // base name -> metricCard
  const chartsBox = el("div", { class: "grid2", id: "charts" });
  const tools = chartToolbar(() => [...cards.values()].map((c) => c.chart));
  const events = el("ol", { class: "timeline", id: "job-events" });
  const ckpts = el("tbody", { id: "job-checkpoints" });
  const ckptHead = el("tr");
  const ckptTitle = el("h2", {}, "Checkpoints");
  const ckptMsg = el("p", { class: "error", id: "checkpoint-error" });
  const logs = el("pre", { id: "job-logs", tabindex: 0 });
  const logFilter = el("input", { type: "search", id: "log-filter", placeholder: "search the log",
    "aria-label": "show only log lines containing" });
  const logCount = el("span", { class: "muted", id: "log-count" });
  const logDownload = el("button", { id: "log-download", type: "button" }, "Download log");
  const profile = el("div", { id: "job-profile" }, el("p", { class: "muted" }, "Loading…"));
  const hparams = el("tbody");
  const spec = el("pre", { id: "job-spec" });
  main.append(head, explain, tools.node, chartStatus, chartsBox,
    el("div", { class: "grid2" },
      el("div", { class: "card" }, el("h2", {}, "Events"), events),
      el("div", { class: "card" }, ckptTitle,
        scrollTable({}, [], ckpts), ckptMsg)),
    el("div", { class: "card" }, el("div", { class: "row" }, el("h2", { style: "margin:0" }, "Logs"),
      logFilter, logCount, logDownload), logs),
    el("div", { class: "grid2" },
      el("div", { class: "card" }, el("h2", {}, "Hyperparameters"),
        scrollTable({ id: "job-hparams", class: "kvtable" }, ["Field", "Value"], hparams),
        el("details", {}, el("summary", {}, "The spec as JSON"), spec)),
      el("div", { class: "card" }, el("h2", {}, "Profile"), profile)));
  ckpts.parentNode.tHead.replaceChildren(ckptHead);

  /* ---- charts ---- */
  let t0 = null, perEpoch = null;
  const cardFor = (name) => {
    const base = baseName(name);
    if (!cards.has(base)) {
      const card = metricCard(base, [
        { name: base, label: "train", color: PALETTE[0] },
        { name: "val_" + base, label: "validation", color: PALETTE[1], dots: true }]);
      if (base.startsWith("epoch_")) card.chart.series[0].label = "per epoch";
      tools.apply(card.chart);
      cards.set(base, card);
      // Loss first, then the job's metrics, then the rest by name.
      const order = [...cards.keys()].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
      chartsBox.replaceChildren(...order.map((k) => cards.get(k).node));
    }
    return cards.get(base);
  };
  const rank = (b) => (b === "loss" ? 0 : b.startsWith("epoch_") ? 2 : b === "learning_rate" ? 3
    : 1);
  let loaded = 0, streamed = 0, live = false;
  const counts = () => {
    chartStatus.textContent = loaded + " points loaded (the server thins each series to " +
      CHART_POINTS + ")" + (streamed ? ", " + streamed + " streamed" : "") +
      (live ? " · following live" : "");
    for (const c of cards.values()) {
      c.count.textContent = c.chart.points() + " points";
      c.paintLegend();
    }
  };
  const addPoint = (p) => {
    if (t0 === null) t0 = Date.parse(p.time);
    const card = cardFor(p.name);
    card.chart.add(p.name, chartPoint(p, t0, perEpoch));
  };

  /* ---- head ---- */
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
  const cancel = async () => {
    const ok = await confirmDialog("Cancel " + (job.display_name || id) + "? It stops now; " +
      "Resume continues it later from its newest checkpoint.", "Cancel job", "Keep it");
    if (ok) act("cancel");
  };
  const clone = () => {
    const s = Object.assign({}, job.spec);
    sessionStorage.setItem(CLONE_KEY, JSON.stringify(s, null, 2));
    location.hash = "#/submit";
  };
  let experimentName = null; // the display name of the job's experiment, once known
  const paintHead = () => {
    if (job.experiment && experimentName === null) {
      experimentName = "";
      api("GET", experimentPath(job.experiment), { signal }).then((x) => {
        experimentName = x.display_name || x.id;
        paintHead();
      }, () => {});
    }
    const active = !TERMINAL.includes(job.state);
    const t = jobTime(job);
    const p = job.progress;
    const kv = [
      ["Reason", el("dd", { id: "job-reason" }, job.reason + (job.message ? ": " + job.message
        : ""))],
      [t.label, el("dd", { id: t.label === "Queued for" ? "job-queued" : "job-trained",
        dataset: { seconds: t.seconds === undefined ? "" : String(t.seconds) } }, t.text)],
    ];
    if (t.label === "Trained for" && job.queue_seconds !== undefined)
      kv.push(["Waited", el("dd", {}, duration(job.queue_seconds * 1000) + " in the queue")]);
    if (p) {
      kv.push(["Progress", el("dd", { id: "job-progress" }, progressBar(job), " step " + p.step +
        " of " + p.total_steps + " · epoch " + p.epoch + " of " + p.epochs)]);
    }
    kv.push(["Attempt", el("dd", {}, job.attempt)], ["Created", el("dd", {}, when(job.create_time))],
      ["Latest", el("dd", {}, Object.entries(job.latest_metrics || {})
        .map(([k, v]) => k + " " + num(v)).join(" · "))]);
    head.replaceChildren(
      el("div", { class: "row" }, el("h1", { style: "margin:0" }, job.display_name || job.id),
        badge(job.state), el("span", { class: "muted" }, job.id)),
      job.experiment ? el("p", { id: "job-experiment", style: "margin:8px 0 0" },
        "Trial " + (job.trial ? job.trial.index : "") + " of experiment ",
        el("a", { href: "#/experiments/" + encodeURIComponent(job.experiment) },
          experimentName || job.experiment)) : null,
      el("dl", { class: "kv", style: "margin-top:10px" },
        kv.flatMap(([k, dd]) => [el("dt", {}, k), dd])),
      el("div", { class: "row", style: "margin-top:10px" },
        el("button", { class: "danger", id: "cancel", disabled: !active, onclick: cancel },
          "Cancel"),
        el("button", { id: "resume", disabled: !["CANCELLED", "FAILED"].includes(job.state),
          onclick: () => act("resume") }, "Resume"),
        el("button", { id: "clone", onclick: clone }, "Clone into Submit"),
        el("a", { href: "#/compare?jobs=" + encodeURIComponent(id) }, "Compare…")));
  };
  const paintEvents = (list) => {
    events.replaceChildren(...list.map((e) => el("li", { dataset: { to: e.to_state } },
      el("strong", {}, e.to_state), " ", el("span", { class: "muted" }, when(e.time) + " · " +
        e.reason), e.message ? el("div", {}, e.message) : null)));
  };
  const paintHparams = () => {
    hparams.replaceChildren(...flattenSpec(job.spec, false).map(([k, v]) =>
      el("tr", { dataset: { field: k } }, el("th", { scope: "row" }, k), el("td", {}, v))));
    spec.textContent = JSON.stringify(job.spec, null, 2);
  };

  /* ---- checkpoints ---- */
  const download = async (c) => {
    try {
      const res = await api("GET", jobPath(id) + "/checkpoints/" + c.id + ":download",
        { raw: true });
      saveBlob(await res.blob(), id + "-step" + c.step + ".safetensors");
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
    const doc = await api("GET", jobPath(id) + "/checkpoints", { signal });
    const list = doc.checkpoints;
    const names = [...new Set(list.flatMap((c) => Object.keys(c.metrics || {})))]
      .sort((a, b) => rank(baseName(a)) - rank(baseName(b)) || a.localeCompare(b));
    const ck = (job && job.spec && job.spec.checkpoint) || {};
    ckptTitle.textContent = "Checkpoints: " + list.length + " kept" +
      (ck.keep_last ? " (the newest " + ck.keep_last + ", the pinned" +
        (ck.keep_best ? ", the best " + ck.keep_best + " by " + (ck.monitor || "val_loss") : "") +
        ")" : "");
    ckptHead.replaceChildren(...["Step", ""].concat(names, ["Attempt", "Size", "SHA-256",
      "Pinned", ""]).map((h) => el("th", {}, h)));
    ckpts.replaceChildren(...list.map((c) => el("tr", { class: c.best ? "best" : null,
      dataset: { checkpoint: c.id } },
    el("td", { class: "num" }, c.step),
    el("td", {}, c.best ? el("span", { class: "badge best", title: "the best checkpoint by " +
        (ck.monitor || "the job's checkpoint metric") }, "★ best") : ""),
    names.map((n) => el("td", { class: "num", dataset: { metric: n,
      value: c.metrics && n in c.metrics ? String(c.metrics[n]) : "" } }, num((c.metrics || {})[n]))),
    el("td", {}, c.attempt), el("td", {}, bytes(c.bytes)),
    el("td", { title: c.sha256 }, (c.sha256 || "").slice(0, 12)),
    el("td", {}, c.pinned ? "yes" : "no"),
    el("td", { class: "actions" }, el("button", { class: "download", onclick: () => download(c),
      "aria-label": "download the checkpoint of step " + c.step }, "Download"), " ",
    c.pinned ? el("button", { class: "unpin", onclick: () => pin(c, "unpin") }, "Unpin")
      : el("button", { class: "pin", onclick: () => pin(c, "pin") }, "Pin")))));
    if (!list.length) ckpts.append(el("tr", {}, el("td", { colspan: 7, class: "muted" },
      "No checkpoints yet.")));
  };

  /* ---- logs ---- */
  let logText = "";
  const paintLogs = () => {
    const f = logFilter.value.trim().toLowerCase();
    const lines = f ? logText.split("\n").filter((l) => l.toLowerCase().includes(f)) : [];
    logs.textContent = !logText ? "(no output yet)" : f ? lines.join("\n") : logText;
    logCount.textContent = f ? lines.length + " matching lines" : "";
    if (!f) logs.scrollTop = logs.scrollHeight;
  };
  logFilter.addEventListener("input", paintLogs);
  logDownload.addEventListener("click", () =>
    saveBlob(new Blob([logText], { type: "text/plain" }), id + ".log"));

  /* ---- profile ---- */
  const loadProfile = async () => {
    let text;
    try {
      text = await api("GET", jobPath(id) + "/profile?format=table", { signal, text: true });
    } catch (e) {
      profile.replaceChildren(el("p", { class: "muted" }, e.status === 404
        ? "No profile: a spec's profile.steps ([first, last]) records one." : e.describe()));
      return false;
    }
    const lines = text.split("\n").filter(Boolean);
    const cols = ["Rank", "Node", "Pass", "Calls", "Total ms", "Mean ms", "% step", "Output bytes"];
    const rows = lines.slice(2).map((l) => l.trim().split(/\s+/));
    const trace = el("button", { id: "profile-trace", type: "button" }, "Download Chrome trace");
    trace.addEventListener("click", async () => {
      try {
        const res = await api("GET", jobPath(id) + "/profile", { raw: true });
        saveBlob(await res.blob(), id + "-profile.json");
      } catch (e) {
        flash("trace: " + e.describe());
      }
    });
    profile.replaceChildren(el("p", {}, lines[0] || ""),
      scrollTable({ id: "profile-table" }, cols, el("tbody", {}, rows.map((r) =>
        el("tr", {}, r.map((v, i) => el("td", { class: i === 1 || i === 2 ? null : "num" },
          v)))))),
      el("p", {}, trace, " ", el("span", { class: "muted" },
        "open it in chrome://tracing or ui.perfetto.dev")));
    return true;
  };

  /* ---- refresh ---- */
  let refreshing = false;
  let profiled = false, profileAsked = null;
  const refresh = async () => {
    if (refreshing) return;
    refreshing = true;
    try {
      job = await api("GET", jobPath(id), { signal });
      paintHead();
      const [ev, text] = await Promise.all([
        api("GET", jobPath(id) + "/events", { signal }),
        api("GET", jobPath(id) + "/logs", { signal, text: true }),
      ]);
      paintEvents(ev.events);
      if (text !== logText) {
        logText = text;
        paintLogs();
      }
      await loadCheckpoints();
      // The profile appears once its last step is done: ask at first, and
      // again once the job has ended.
      const profileState = TERMINAL.includes(job.state) ? "ended" : "running";
      if (!profiled && profileAsked !== profileState) {
        profileAsked = profileState;
        profiled = await loadProfile();
      }
      if (job.state === "QUEUED") {
        const why = await api("GET", jobPath(id) + ":explain", { signal });
        explain.replaceChildren(el("div", { class: "card" }, el("h2", {}, "Why it waits"),
          el("ul", {}, why.reasons.map((r) => el("li", {}, el("strong", {}, r.code), " ",
            r.message)))));
      } else {
        explain.replaceChildren();
      }
    } catch (e) {
      if (!signal.aborted) flash(e instanceof ApiError ? e.describe() : e.message);
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
      }, signal);
    } catch (e) {
      if (!signal.aborted) flash("live metrics: " + e.message);
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
    const metricsReq = api("GET", jobPath(id) + "/metrics?max_points=" + CHART_POINTS, { signal });
    metricsReq.catch(() => {}); // answered below
    try {
      job = await api("GET", jobPath(id), { signal });
    } catch (e) {
      if (!signal.aborted) main.replaceChildren(el("p", { class: "error" }, e.message));
      return;
    }
    paintHead();
    paintHparams();
    let doc;
    try {
      doc = await metricsReq;
    } catch (e) {
      if (!signal.aborted) flash("metrics: " + e.message);
      return;
    }
    const points = doc.metrics.slice().sort((a, b) => a.seq - b.seq);
    perEpoch = stepsPerEpoch(job, points);
    t0 = points.length ? Math.min(...points.map((p) => Date.parse(p.time))) : null;
    cardFor("loss");
    const byName = new Map();
    for (const p of points) {
      lastSeq = Math.max(lastSeq, p.seq || 0);
      if (!byName.has(p.name)) byName.set(p.name, []);
      byName.get(p.name).push(chartPoint(p, t0, perEpoch));
    }
    for (const [name, list] of byName) {
      list.sort((a, b) => a.step - b.step);
      cardFor(name).chart.set(name, list);
    }
    whenAllDrawn([...cards.values()].map((c) => c.chart));
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
