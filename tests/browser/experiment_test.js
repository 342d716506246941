/* experiment_test.js — issue #21's experiment pages in headless Chromium
 * against a real kilnd: a small grid search (3 learning rates on a log
 * scale x 2 batch sizes, tiny real trials) created through the API and
 * followed live on its page; the trials table against the API's trials
 * (values, metric, states, epochs, rung), sorting by the metric, the best
 * trial marked, a scatter per parameter with a point per trial (a log x
 * axis for the learning rate), two trials' curves overlaid, a trial's job
 * page linking back, the experiments list, Cancel's confirmation, and the
 * pages at a phone's 390 px. Every section runs even when an earlier one
 * failed, so one run names every failure.
 * Usage: node experiment_test.js URL TOKEN ARTIFACTS_DIR */
"use strict";

const path = require("path");
const { Browser } = require("./cdp.js");
const { q, click, apiClient, report } = require("./helpers.js");

const [url, token, artifacts] = process.argv.slice(2);
if (!url || !token || !artifacts) {
  console.error("usage: node experiment_test.js URL TOKEN ARTIFACTS_DIR");
  process.exit(2);
}
const api = apiClient(url, token);
const { check, section, finish } = report("experiment test");

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* A small MLP on take images of Fashion-MNIST: about a second of training. */
function baseSpec(take, epochs) {
  return {
    model: { input_shape: [28, 28, 1], layers: [{ type: "flatten" },
      { type: "dense", units: 32, activation: "relu" },
      { type: "dense", units: 10, activation: "softmax" }] },
    loss: "sparse_categorical_crossentropy", metrics: ["accuracy"],
    dataset: { name: "fashion-mnist", validation: "test" },
    pipeline: { batch_size: 64, shuffle: true, normalize: true, take },
    optimizer: { type: "sgd", learning_rate: 0.01 },
    epochs, seed: 1, log_every_steps: 5,
    resources: { device_type: "cpu", devices: 1 },
  };
}

const LRS = [0.001, 0.01, 0.1];

async function waitExperiment(id, states, seconds) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const x = await api("GET", "/v1/experiments/" + id);
    if (states.includes(x.state)) return x;
    if (Date.now() > deadline) {
      throw new Error("experiment " + id + " is " + x.state + ", not " + states);
    }
    await sleep(300);
  }
}

async function allTrials(id) {
  const out = [];
  let token = "";
  do {
    const doc = await api("GET", "/v1/experiments/" + id + "/trials?page_size=1000" +
      (token ? "&page_token=" + encodeURIComponent(token) : ""));
    out.push(...doc.trials);
    token = doc.next_page_token || "";
  } while (token);
  return out;
}

async function open(page, hash, ready, ms) {
  await page.goto("about:blank");
  await page.goto(url + "/#" + hash);
  await page.waitFor(ready, "the page " + hash, ms);
}

/* The rows of the trials table: job, index and each cell's data-value. */
const rowsExpr = `[...document.querySelectorAll('#trials-body tr[data-job]')].map((r) => ({
  job: r.dataset.job, index: Number(r.dataset.index), best: r.classList.contains('best'),
  cells: Object.fromEntries([...r.querySelectorAll('td[data-col]')].map((td) =>
    [td.dataset.col, td.dataset.value])) }))`;

const scatterExpr = (param) => `(() => { const c = document.querySelector(
  ${q("canvas[data-param=\"" + param + "\"]")});
  if (!c || !c.kilnScatter) return null; const s = c.kilnScatter;
  return { scale: s.scale, data: s.data.map((p) => ({ key: p.key, x: p.x, y: p.y,
  best: p.best })), drawn: s.drawn, xTicks: s.xTickLabels }; })()`;

async function main() {
  const grid = await api("POST", "/v1/experiments", {
    display_name: "browser-grid",
    spec: baseSpec(1000, 2),
    search: {
      searcher: "grid", metric: "val_accuracy", mode: "max", max_concurrent_trials: 2, seed: 1,
      parameters: {
        "optimizer.learning_rate": { type: "log_uniform", min: LRS[0], max: LRS[2], count: 3 },
        "pipeline.batch_size": { type: "categorical", values: [32, 64] },
      },
    },
  });
  const id = grid.id;
  const browser = await Browser.launch({ verbose: !!process.env.KILN_BROWSER_VERBOSE });
  let x = null, trials = [];
  try {
    const page = await browser.newPage(1280, 900);
    await page.goto(url + "/");
    await page.eval(`sessionStorage.setItem('kiln.token', ${q(token)}), 1`);

    await section("the page follows the experiment live to its end", async () => {
      await open(page, "/experiments/" + id, "document.querySelector('#experiment-head .badge')");
      const first = await page.eval("document.querySelector('#experiment-head .badge')" +
        ".dataset.state");
      check(first === "RUNNING", "the new experiment's page shows it RUNNING: " + first);
      // No reload: the page's own refresh must bring every trial to its end.
      await page.waitFor(`document.querySelector('#experiment-head .badge').dataset.state ===
        'SUCCEEDED' && document.querySelectorAll('#trials-body tr[data-job]').length === 6 &&
        [...document.querySelectorAll('#trials-body td[data-col=state]')].every((td) =>
        td.textContent === 'SUCCEEDED')`, "the experiment to succeed on its page", 300000);
      check(true, "the page showed the experiment SUCCEEDED with its 6 trials, unreloaded");
      x = await waitExperiment(id, ["SUCCEEDED"], 10);
      trials = await allTrials(id);
      await sleep(2500); // one more refresh, if the page had any left
    });

    await section("the trials table equals the API's trials", async () => {
      const rows = await page.eval(rowsExpr);
      check(rows.length === trials.length && trials.length === 6,
        "a row per trial: " + rows.length + " rows, " + trials.length + " trials");
      let same = 0;
      for (const t of trials) {
        const r = rows.find((w) => w.job === t.job);
        const want = { "p:optimizer.learning_rate": String(t.values["optimizer.learning_rate"]),
          "p:pipeline.batch_size": String(t.values["pipeline.batch_size"]),
          metric: String(t.metric), epochs: String(t.epochs_trained), rung: String(t.rung) };
        const bad = !r ? "no row" : r.index !== t.index ? "index " + r.index
          : Object.entries(want).filter(([k, v]) => r.cells[k] !== v)
            .map(([k, v]) => k + " " + r.cells[k] + " != " + v).join(", ");
        if (!bad) same++;
        else console.log("  trial " + t.index + ": " + bad);
      }
      check(same === trials.length, same + " of " + trials.length + " rows hold their trial's " +
        "values, metric, epochs and rung");
      const values = trials.map((t) => [t.values["optimizer.learning_rate"],
        t.values["pipeline.batch_size"]]);
      const lrs = [...new Set(values.map((v) => Number(v[0].toPrecision(6))))].sort((a, b) => a -
        b);
      check(JSON.stringify(lrs) === JSON.stringify(LRS) && values.every((v) =>
        [32, 64].includes(v[1])), "the grid's trials are 3 learning rates x 2 batch sizes: " +
        JSON.stringify(values));
      const states = await page.eval("[...document.querySelectorAll('#trials-body " +
        "td[data-col=trial_state] .badge')].map((b) => b.dataset.state).join()");
      check(states === trials.map((t) => t.trial_state).join() && states.includes("DONE"),
        "each row's trial state is the API's: " + states);
    });

    await section("sorting by the metric orders the trials", async () => {
      const byMetric = (dir) => trials.slice().sort((a, b) => (a.metric - b.metric) * dir ||
        a.index - b.index).map((t) => t.job).join();
      const order = () => page.eval("[...document.querySelectorAll('#trials-body " +
        "tr[data-job]')].map((r) => r.dataset.job).join()");
      const sorted = () => page.eval("document.querySelector('#trials th[aria-sort]')" +
        ".textContent + ' ' + document.querySelector('#trials th[aria-sort]')" +
        ".getAttribute('aria-sort')");
      check(new Set(trials.map((t) => t.metric)).size > 1, "the trials' metrics differ: " +
        trials.map((t) => t.metric));
      await click(page, "#trials th button[data-sort=metric]");
      const s1 = await sorted(), o1 = await order();
      const dir1 = /ascending/.test(s1) ? 1 : -1;
      check(/val_accuracy/.test(s1) && o1 === byMetric(dir1), "sorted by " + s1 + ": " + o1);
      await click(page, "#trials th button[data-sort=metric]");
      const s2 = await sorted(), o2 = await order();
      check(/val_accuracy/.test(s2) && s1 !== s2 && o2 === byMetric(-dir1),
        "sorted again by " + s2 + ": " + o2);
    });

    await section("the best trial is marked", async () => {
      const top = Math.max(...trials.map((t) => t.metric));
      check(x.best_trial && x.best_trial.metric === top, "the API's best trial has the highest " +
        "val_accuracy " + top);
      const marked = await page.eval("[...document.querySelectorAll('#trials-body tr.best')]" +
        ".map((r) => r.dataset.job).join()");
      check(x.best_trial && marked === x.best_trial.job, "the best trial's row is marked: " +
        marked + " (API " + (x.best_trial && x.best_trial.job) + ")");
      const head = await page.eval("(document.querySelector('#experiment-best') || {})" +
        ".textContent || ''");
      const best = trials.find((t) => x.best_trial && t.job === x.best_trial.job);
      check(best && head.includes("trial " + best.index), "the head names the best trial: " +
        head);
    });

    await section("a scatter per parameter, a point per trial, log x for the learning rate",
      async () => {
        const lr = await page.eval(scatterExpr("optimizer.learning_rate"));
        const bs = await page.eval(scatterExpr("pipeline.batch_size"));
        const withMetric = trials.filter((t) => Number.isFinite(t.metric));
        for (const [name, s, param] of [["learning rate", lr, "optimizer.learning_rate"],
          ["batch size", bs, "pipeline.batch_size"]]) {
          const ok = s && s.data.length === withMetric.length && withMetric.every((t) =>
            s.data.some((p) => p.key === t.job && p.y === t.metric && p.x === t.values[param]));
          check(ok, "the " + name + " scatter has one point per trial at (value, metric): " +
            (s ? s.data.length : "none") + " points, " + withMetric.length + " trials");
          check(s && s.drawn.length === withMetric.length, "and draws each of them");
          const best = s && s.data.filter((p) => p.best).map((p) => p.key).join();
          check(x.best_trial && best === x.best_trial.job, "its best point is the best trial");
        }
        check(lr && lr.scale === "log" && bs && bs.scale === "category",
          "the learning rate's x axis is log, the batch size's categories: " +
          (lr && lr.scale) + ", " + (bs && bs.scale));
        // On a log axis 0.001, 0.01 and 0.1 are evenly spaced (on a linear
        // one the first gap would be a tenth of the second).
        const xs = LRS.map((v) => {
          const p = lr.data.find((d) => Math.abs(d.x / v - 1) < 1e-6);
          return p ? lr.drawn.find((d) => d.key === p.key).X : NaN;
        });
        const g1 = xs[1] - xs[0], g2 = xs[2] - xs[1];
        check(g1 > 20 && Math.abs(g1 - g2) < 1.5, "0.001, 0.01 and 0.1 lie evenly on the log " +
          "axis: x " + xs.map((v) => v.toFixed(1)).join(", "));
        check(["0.001", "0.01", "0.1"].every((l) => lr.xTicks.includes(l)),
          "the log axis is labelled at powers of ten: " + lr.xTicks.join(" "));
        check(JSON.stringify(bs.xTicks) === '["32","64"]', "the batch size axis is labelled " +
          "by its values: " + bs.xTicks.join(" "));
      });

    await section("picking two trials overlays their two curves", async () => {
      const top = trials.filter((t) => Number.isFinite(t.metric)).sort((a, b) => b.metric -
        a.metric || a.index - b.index).slice(0, 3).map((t) => t.job).sort().join();
      const ticked = await page.eval("[...document.querySelectorAll('#trials-body " +
        "input.pick:checked')].map((b) => b.closest('tr').dataset.job).sort().join()");
      check(ticked === top, "until one picks, the three best trials' curves show, ticked: " +
        ticked + " (best " + top + ")");
      await click(page, "#curves-clear");
      const picks = trials.slice(0, 2).map((t) => t.job);
      for (const job of picks) {
        await page.eval(`document.querySelector('#trials-body tr[data-job=${q(job)}] ` +
          "input.pick').click()");
      }
      const series = await page.waitFor(`(() => { const c = document.querySelector(
        '#trial-charts canvas#chart-loss'); if (!c) return null; const s = c.kilnChart.series
        .filter((x) => x.xs.length && x.name.startsWith('loss@')).map((x) => x.name).sort();
        return s.length === 2 ? s : null; })()`, "two loss curves").catch(async (e) => {
        throw new Error(e.message + "; the page shows: " + await page.eval(`[...document
          .querySelectorAll('#trial-charts canvas')].map((c) => c.id + ' ' + c.kilnChart.series
          .map((x) => x.name + ':' + x.xs.length)).join('; ') + ' | ' +
          document.querySelector('#curves-note').textContent + ' | flash: ' +
          document.querySelector('#flash').textContent`));
      });
      check(JSON.stringify(series) === JSON.stringify(picks.map((j) => "loss@" + j).sort()),
        "the loss chart overlays the two trials picked: " + series);
      const acc = await page.eval("(() => { const c = document.querySelector('#trial-charts " +
        "canvas#chart-accuracy'); return c ? c.kilnChart.series.filter((x) => x.xs.length)" +
        ".map((x) => x.name).sort().join() : ''; })()");
      check(picks.every((j) => acc.includes("val_accuracy@" + j)), "their val_accuracy, the " +
        "search's metric, is drawn too: " + acc);
      const pts = (await api("GET", "/v1/jobs/" + picks[0] + "/metrics?name=loss&max_points=" +
        "1000")).metrics.length;
      const drawn = await page.eval("document.querySelector('#trial-charts canvas#chart-loss')" +
        `.kilnChart.find(${q("loss@" + picks[0])}).xs.length`);
      check(pts > 0 && drawn === pts, "a curve holds its job's loss points: " + drawn + " of " +
        pts);
      const marks = await page.eval("document.querySelectorAll('#trials-body i.swatch').length");
      check(marks === 2, "the two picked rows carry their curve's colour: " + marks);
    });

    await section("a trial's job page links to its experiment", async () => {
      const t = trials[3];
      await open(page, "/jobs/" + t.job, "document.querySelector('#job-experiment a') && " +
        "/browser-grid/.test(document.querySelector('#job-experiment').textContent)");
      const textLink = await page.eval("document.querySelector('#job-experiment').textContent");
      const href = await page.eval("document.querySelector('#job-experiment a')" +
        ".getAttribute('href')");
      check(textLink === "Trial " + t.index + " of experiment browser-grid" &&
        href === "#/experiments/" + id, "the job page says '" + textLink + "' -> " + href);
      const job = await api("GET", "/v1/jobs/" + t.job);
      check(job.experiment === id && job.trial && job.trial.index === t.index,
        "the API's job carries its experiment and trial index");
      await click(page, "#job-experiment a");
      await page.waitFor(`location.hash === ${q("#/experiments/" + id)} &&
        document.querySelector('#experiment-head h1')`, "the experiment page from the link");
      check(true, "the link opens the experiment's page");
    });

    await section("the experiments list", async () => {
      await open(page, "/experiments", `document.querySelector(
        '#experiments-body tr[data-experiment=${q(id)}]')`);
      const row = await page.eval(`document.querySelector(
        '#experiments-body tr[data-experiment=${q(id)}]').textContent`);
      check(/browser-grid/.test(row) && /SUCCEEDED/.test(row) && /6 done of 6/.test(row),
        "the list shows the experiment, its state and trials: " + row);
      const nav = await page.eval("document.querySelector('nav a.active').textContent");
      check(nav === "Experiments", "the nav marks Experiments: " + nav);
    });

    await section("Cancel asks first, then cancels", async () => {
      // Trials of a whole 60000-image epoch each: still running when cancelled.
      const long = await api("POST", "/v1/experiments", {
        display_name: "browser-cancel", spec: baseSpec(60000, 1),
        search: { searcher: "grid", metric: "val_accuracy", mode: "max",
          parameters: { "optimizer.learning_rate": { type: "categorical",
            values: [0.01, 0.02] } } },
      });
      await open(page, "/experiments/" + long.id, "document.querySelector('#experiment-cancel')");
      await click(page, "#experiment-cancel");
      await sleep(500);
      const still = await api("GET", "/v1/experiments/" + long.id);
      const asked = await page.eval("!!(document.querySelector('#confirm') || {}).open");
      check(still.state === "RUNNING" && asked, "Cancel asks before it cancels (state " +
        still.state + ", dialog open " + asked + ")");
      if (asked) await click(page, "#confirm-yes");
      else await api("POST", "/v1/experiments/" + long.id + ":cancel");
      await waitExperiment(long.id, ["CANCELLED"], 60);
      const shown = await page.waitFor("(() => { const b = document.querySelector(" +
        "'#experiment-head .badge'); return b && b.dataset.state === 'CANCELLED' && " +
        "document.querySelector('#experiment-cancel').disabled; })()", "the cancelled state");
      check(asked && shown, "confirming cancels it; the page shows CANCELLED");
    });

    await section("nothing overflows a 390 px phone", async () => {
      await page.send("Emulation.setDeviceMetricsOverride",
        { width: 390, height: 844, deviceScaleFactor: 1, mobile: true });
      for (const [hash, ready] of [["/experiments", "#experiments-body tr[data-experiment]"],
        ["/experiments/" + id, "#trials-body tr[data-job] td[data-col=metric]"],
        ["/jobs/" + trials[0].job, "#job-experiment a"]]) {
        await open(page, hash, `document.querySelector(${q(ready)})`);
        await sleep(700);
        const w = await page.eval("document.documentElement.scrollWidth");
        check(w <= 390, hash + " fits 390 px (scrollWidth " + w + ")");
      }
      await page.screenshot(path.join(artifacts, "experiment-phone.png"));
      await page.send("Emulation.setDeviceMetricsOverride",
        { width: 1280, height: 900, deviceScaleFactor: 1, mobile: false });
    });

    check(page.errors.length === 0, "no script errors on the page" +
      (page.errors.length ? ": " + page.errors.join(" | ") : ""));
  } finally {
    await browser.close();
  }
}

finish(main());
