/* app.js — the kiln dashboard's frame: one page, views chosen by the URL's
 * hash (#/jobs, #/jobs/ID, #/compare?jobs=..., #/experiments,
 * #/experiments/ID, #/queue, #/devices, #/submit); the login, queue and
 * devices views live here, the others in jobs.js, job.js, compare.js,
 * experiments.js, experiment.js and submit.js, on util.js, chart.js,
 * charts.js and scatter.js. The bearer token the user logs in with is kept in this tab's
 * sessionStorage only. */
"use strict";

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

function viewQueue(main) {
  const abort = new AbortController();
  const running = el("tbody", { id: "queue-running" });
  const queued = el("tbody", { id: "queue-body" });
  main.append(el("h1", {}, "Queue"),
    el("div", { class: "card" }, el("h2", {}, "Running"),
      scrollTable({}, ["Job", "Name", "State", "Trained for"], running)),
    el("div", { class: "card" }, el("h2", {}, "Waiting"),
      scrollTable({}, ["Job", "Name", "Priority", "Jobs ahead", "Queued for", "Why it waits"],
        queued)));
  const load = async () => {
    try {
      const list = (state) => api("GET", "/v1/jobs?page_size=1000&order_by=create_time&filter=" +
        encodeURIComponent("state=" + state), { signal: abort.signal }).then((d) => d.jobs);
      const [q, starting, run, stopping] = await Promise.all(
        ["QUEUED", "STARTING", "RUNNING", "STOPPING"].map(list));
      const active = starting.concat(run, stopping);
      running.replaceChildren(...active.map((j) => el("tr", {},
        el("td", {}, el("a", { href: "#/jobs/" + j.id }, j.id)), el("td", {}, j.display_name),
        el("td", {}, badge(j.state)), el("td", { class: "num" }, jobTime(j).text))));
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
        el("td", { class: "num" }, jobTime(j).text),
        el("td", {}, w.reasons.map((r) => el("div", {}, el("strong", {}, r.code), " ",
          r.message))))));
      if (!q.length) queued.append(el("tr", {}, el("td", { colspan: 6, class: "muted" },
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

/* What runs on a worker host: a link to each job of its allocations. */
function running(allocations) {
  if (!allocations.length) return ["none"];
  return allocations.flatMap((x, i) => [i ? ", " : "",
    el("a", { href: "#/jobs/" + x.job, title: x.id + ", attempt " + x.attempt }, x.job)]);
}

/* The agents rows: one per worker host (an admin's list; a user is told so). */
async function loadAgents(body, signal) {
  let list;
  try {
    list = (await api("GET", "/v1/agents?page_size=1000", { signal })).agents;
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 403) throw e;
    body.replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "muted" },
      "Worker hosts are listed for admin tokens.")));
    return;
  }
  body.replaceChildren(...list.map((a) => el("tr", { dataset: { agent: a.name } },
    el("td", {}, a.name), el("td", {}, a.hostname), el("td", {}, a.pool),
    el("td", {}, a.address), el("td", { class: "num" }, a.cpus),
    el("td", {}, a.gpus.length ? a.gpus.map((g) => g.name || "GPU " + g.index).join(", ") : "none"),
    el("td", {}, badge(a.state)),
    el("td", { title: when(a.last_seen_time) },
      duration(Date.now() - Date.parse(a.last_seen_time)) + " ago"),
    el("td", {}, ...running(a.allocations || [])))));
  if (!list.length) body.append(el("tr", {}, el("td", { colspan: 9, class: "muted" },
    "No kiln-agent has registered: every device is this server's own.")));
}

function viewDevices(main) {
  const abort = new AbortController();
  const pools = el("tbody", { id: "pools-body" });
  const devices = el("tbody", { id: "devices-body" });
  const agents = el("tbody", { id: "agents-body" });
  main.append(el("h1", {}, "Devices and pools"),
    el("div", { class: "card" }, el("h2", {}, "Pools"),
      scrollTable({}, ["Pool", "Device type", "Devices", "Busy"], pools)),
    el("div", { class: "card" }, el("h2", {}, "Devices"),
      scrollTable({}, ["Device", "Type", "Pool", "State", "Job"], devices)),
    el("div", { class: "card" }, el("h2", {}, "Worker hosts"),
      scrollTable({}, ["Agent", "Host", "Pool", "Address", "Cores", "GPUs", "State", "Last seen",
        "Running"],
        agents)));
  const load = async () => {
    try {
      const [p, d] = await Promise.all([api("GET", "/v1/pools", { signal: abort.signal }),
        api("GET", "/v1/devices", { signal: abort.signal }), loadAgents(agents, abort.signal)]);
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
  const views = { jobs: viewJobs, experiments: viewExperiments, queue: viewQueue,
    devices: viewDevices, submit: viewSubmit, compare: viewCompare };
  if (parts[0] === "jobs" && parts[1]) cleanup = viewJob(main, params, decodeURIComponent(parts[1]));
  else if (parts[0] === "experiments" && parts[1]) {
    cleanup = viewExperiment(main, params, decodeURIComponent(parts[1]));
  }
  else cleanup = (views[parts[0]] || viewJobs)(main, params) || null;
}

document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  location.hash = "#/login";
});
window.addEventListener("hashchange", route);
route();
