/* compare.js — the compare view (#/compare?jobs=a,b,...): the jobs' curves
 * overlaid on one chart per metric (a colour per job, validation dashed),
 * with the chart tools, and a table of the spec fields that differ. */
"use strict";

function viewCompare(main, params) {
  const abort = new AbortController();
  const signal = abort.signal;
  const ids = (params.get("jobs") || "").split(",").map((s) => s.trim()).filter(Boolean);
  const cards = new Map();
  const tools = chartToolbar(() => [...cards.values()].map((c) => c.chart));
  const chartsBox = el("div", { class: "grid2", id: "compare-charts" });
  const legend = el("div", { class: "row card", id: "compare-jobs" });
  const diffHead = el("tr");
  const diffBody = el("tbody");
  const adder = el("input", { type: "text", id: "compare-add", placeholder: "job id",
    "aria-label": "add a job by id" });
  main.append(el("h1", {}, "Compare jobs"), legend, tools.node, chartsBox,
    el("div", { class: "card" }, el("h2", {}, "Spec fields that differ"),
      el("div", { class: "scroll" }, el("table", { id: "compare-diff" }, el("thead", {}, diffHead),
        diffBody))));
  if (!ids.length) {
    legend.replaceChildren(el("p", { class: "muted" }, "Pick jobs in the jobs list, or add one: "),
      adder);
  }
  adder.addEventListener("change", () => {
    location.hash = "#/compare?jobs=" + ids.concat(adder.value.trim()).join(",");
  });

  (async () => {
    let jobs, docs;
    try {
      [jobs, docs] = await Promise.all([
        Promise.all(ids.map((id) => api("GET", jobPath(id), { signal }))),
        Promise.all(ids.map((id) => api("GET", jobPath(id) + "/metrics?max_points=" +
          CHART_POINTS, { signal }))),
      ]);
    } catch (e) {
      if (!signal.aborted) flash(e instanceof ApiError ? e.describe() : e.message);
      return;
    }
    const color = (i) => PALETTE[i % PALETTE.length];
    legend.replaceChildren(...jobs.map((j, i) => el("span", {},
      el("i", { class: "swatch", style: "background:" + color(i) }),
      el("a", { href: "#/jobs/" + encodeURIComponent(j.id) }, j.display_name || j.id), " ",
      badge(j.state))), adder);
    jobs.forEach((job, i) => overlayJob(cards, tools, job, color(i), docs[i].metrics));
    chartsBox.replaceChildren(...overlayCards(cards));
    whenAllDrawn([...cards.values()].map((c) => c.chart));

    // The spec fields whose values are not all the same.
    const flat = jobs.map((j) => new Map(flattenSpec(j.spec, true)));
    const fields = [...new Set(flat.flatMap((m) => [...m.keys()]))];
    const differ = fields.filter((f) => new Set(flat.map((m) => m.get(f))).size > 1);
    diffHead.replaceChildren(el("th", {}, "Field"), ...jobs.map((j, i) => el("th", {},
      el("i", { class: "swatch", style: "background:" + color(i) }), j.display_name || j.id)));
    diffBody.replaceChildren(...differ.map((f) => el("tr", { dataset: { field: f } },
      el("th", { scope: "row" }, f), flat.map((m) => el("td", {}, m.has(f) ? m.get(f) : "–")))));
    if (!differ.length) diffBody.append(el("tr", {}, el("td", { colspan: jobs.length + 1,
      class: "muted" }, jobs.length > 1 ? "The specs are the same." : "Add a job to compare.")));
  })();
  return () => abort.abort();
}
