/* tools_test.js — issue #22's dashboard in headless Chromium against a real
 * kilnd and small real jobs: the compare view, the chart tools (a chart per
 * metric, hover read-out, smoothing, zoom, x axis, log ticks), checkpoints
 * with metrics and the best mark, the hyperparameter table, Clone into
 * Submit, the profile, log search and download, the phone width (390 px),
 * and each dashboard defect of the issue. Every section runs even when an
 * earlier one failed, so one run names every failure.
 * Usage: node tools_test.js URL TOKEN ARTIFACTS_DIR */
"use strict";

const { Browser } = require("./cdp.js");
const { q, fill, click, apiClient, report } = require("./helpers.js");

const [url, token, artifacts] = process.argv.slice(2);
if (!url || !token || !artifacts) {
  console.error("usage: node tools_test.js URL TOKEN ARTIFACTS_DIR");
  process.exit(2);
}
const api = apiClient(url, token);
const { check, section, finish } = report("tools test");

/* A small MLP on 2000 Fashion-MNIST images: under a second of training. */
function tinySpec(name, optimizer, lr, batch) {
  return {
    display_name: name,
    model: { input_shape: [28, 28, 1], layers: [{ type: "flatten" },
      { type: "dense", units: 32, activation: "relu" },
      { type: "dense", units: 10, activation: "softmax" }] },
    loss: "sparse_categorical_crossentropy", metrics: ["accuracy"],
    dataset: { name: "fashion-mnist", validation: "test" },
    pipeline: { batch_size: batch, shuffle: true, normalize: true, take: 2000 },
    optimizer: { type: optimizer, learning_rate: lr },
    epochs: 2, seed: 1, log_every_steps: 5,
    checkpoint: { every_steps: 20, keep_last: 2, keep_best: 1, monitor: "val_loss" },
    profile: { steps: [3, 5] },
    resources: { device_type: "cpu", devices: 1 },
  };
}

/* One epoch of all 60000 images in 1875 steps: long enough to cancel
 * after its first checkpoint (step 100), short enough to resume to its end. */
function heavySpec() {
  const s = tinySpec("one-epoch", "adam", 0.001, 32);
  s.model.layers[1].units = 256;
  s.pipeline.take = 60000;
  s.epochs = 1;
  s.log_every_steps = 50;
  s.checkpoint = { every_steps: 100, keep_last: 2 };
  delete s.profile;
  return s;
}

async function waitState(id, states, seconds) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const j = await api("GET", "/v1/jobs/" + id);
    if (states.includes(j.state)) return j;
    if (Date.now() > deadline) throw new Error("job " + id + " is " + j.state + ", not " + states);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* Pixels of colour rgb (within tol) in a canvas: their count and x extent. */
const inkOf = (canvas, rgb) => `(() => { const c = document.querySelector(${q(canvas)});
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0,
  lo = Infinity, hi = -Infinity; for (let i = 0; i < d.length; i += 4) {
  if (Math.abs(d[i] - ${rgb[0]}) < 40 && Math.abs(d[i + 1] - ${rgb[1]}) < 40 &&
  Math.abs(d[i + 2] - ${rgb[2]}) < 40 && d[i + 3] > 200) { n++; const x = (i / 4) % c.width;
  lo = Math.min(lo, x); hi = Math.max(hi, x); } } return {n, lo, hi, w: c.width}; })()`;

const text = (sel) => `(document.querySelector(${q(sel)}) || {}).textContent || ''`;

async function open(page, hash, ready) {
  await page.goto("about:blank");
  await page.goto(url + "/#" + hash);
  await page.waitFor(ready, "the page " + hash);
}

async function main() {
  const jobA = (await api("POST", "/v1/jobs", tinySpec("tiny-adam", "adam", 0.002, 64))).id;
  const jobB = (await api("POST", "/v1/jobs", tinySpec("tiny-sgd", "sgd", 0.05, 32))).id;
  await waitState(jobA, ["SUCCEEDED"], 120);
  await waitState(jobB, ["SUCCEEDED"], 120);
  const heavy = (await api("POST", "/v1/jobs", heavySpec())).id;
  await waitState(heavy, ["RUNNING"], 60);
  const waiting = (await api("POST", "/v1/jobs", tinySpec("waits-behind", "adam", 0.01, 64))).id;

  const browser = await Browser.launch({ verbose: !!process.env.KILN_BROWSER_VERBOSE });
  try {
    const page = await browser.newPage(1280, 900);
    await browser.send("Browser.setDownloadBehavior", { behavior: "deny" });
    await page.goto(url + "/");
    await page.waitFor("document.querySelector('#login-form')", "the login form");

    await section("defect 2: no nav links on the login page", async () => {
      const shown = await page.eval("getComputedStyle(document.querySelector('#nav')).display");
      check(shown === "none", "the nav is not displayed on the login page (display: " +
        shown + ")");
    });
    await page.eval(`sessionStorage.setItem('kiln.token', ${q(token)}), 1`);

    await section("defect 8 and 10: a queued job's label, and Cancel asks first", async () => {
      await open(page, "/jobs/" + waiting, "document.querySelector('#job-head dl')");
      const labels = await page.eval("[...document.querySelectorAll('#job-head dt')]" +
        ".map((d) => d.textContent).join('|')");
      check(/Queued for/.test(labels) && !/Duration|Trained for/.test(labels),
        "a queued job's page says 'Queued for', not Duration: " + labels);
      await click(page, "#cancel");
      await sleep(500);
      const still = await api("GET", "/v1/jobs/" + waiting);
      const asked = await page.eval("!!(document.querySelector('#confirm') || {}).open");
      check(still.state === "QUEUED" && asked, "Cancel asks before it cancels (state " +
        still.state + ", dialog open " + asked + ")");
      if (asked) {
        await click(page, "#confirm-yes");
        await waitState(waiting, ["CANCELLED"], 30);
        check(true, "confirming cancels the job");
      } else {
        await api("POST", "/v1/jobs/" + waiting + ":cancel").catch(() => {});
      }
    });

    await section("defect 9: progress counts steps (a 1-epoch job cancelled midway)", async () => {
      const deadline = Date.now() + 60000;
      while (!(await api("GET", "/v1/jobs/" + heavy + "/checkpoints")).checkpoints.length) {
        if (Date.now() > deadline) throw new Error("the heavy job wrote no checkpoint");
        await sleep(200);
      }
      await api("POST", "/v1/jobs/" + heavy + ":cancel");
      const j = await waitState(heavy, ["CANCELLED"], 60);
      const want = j.progress ? Math.round(j.progress.fraction * 100) : NaN;
      await open(page, "/jobs", `document.querySelector('#jobs-body tr[data-job=${q(heavy)}]')`);
      const shown = await page.waitFor(`(() => { const r = document.querySelector(
        '#jobs-body tr[data-job=${q(heavy)}] .progress'); return r && r.title; })()`,
      "the heavy job's progress");
      check(want > 0 && want < 100 && shown === want + "%",
        "the cancelled 1-epoch job's progress is its steps: shown " + shown + ", server " + want +
        "%");
    });

    await section("defect 5 and 7: a resumed job's time, a single validation point", async () => {
      await api("POST", "/v1/jobs/" + heavy + ":resume");
      const j = await waitState(heavy, ["SUCCEEDED"], 300);
      await open(page, "/jobs/" + heavy, "document.querySelector('#job-trained')");
      const secs = await page.eval("document.querySelector('#job-trained').dataset.seconds");
      check(j.run_seconds > 0 && Number(secs) === j.run_seconds,
        "the resumed job's 'Trained for' is run_seconds over both attempts: " + secs + " vs " +
        j.run_seconds);
      await page.waitFor("document.body.dataset.chartsDrawn", "the charts");
      await sleep(300);
      const val = await page.eval(inkOf("#chart-loss", [194, 65, 12]));
      check(val.n >= 20, "the one validation point is a visible dot (" + val.n + " pixels)");
      const ep = await page.eval(inkOf("#chart-epoch_loss", [29, 78, 216]));
      check(ep.n >= 20, "a one-point epoch_loss chart shows its point (" + ep.n + " pixels)");
    });

    await section("a chart for every metric, with tools", async () => {
      await open(page, "/jobs/" + jobA, "document.body.dataset.chartsDrawn");
      const doc = await api("GET", "/v1/jobs/" + jobA + "/metrics");
      const bases = [...new Set(doc.metrics.map((p) => p.name.replace(/^val_/, "")))].sort();
      const charts = await page.eval("[...document.querySelectorAll('#charts canvas')]" +
        ".map((c) => c.id.replace('chart-', '')).sort()");
      check(JSON.stringify(charts) === JSON.stringify(bases), "one chart per reported metric: " +
        charts + " (metrics " + bases + ")");
      // Hover read-out.
      const read = await page.eval(`(() => { const c = document.querySelector('#chart-loss');
        const r = c.getBoundingClientRect(); c.dispatchEvent(new MouseEvent('mousemove',
        {clientX: r.left + r.width * 0.6, clientY: r.top + r.height / 2, bubbles: true}));
        return document.querySelector('#chart-loss-readout').textContent; })()`);
      check(/step \d+/.test(read) && /loss [0-9.]+/.test(read), "hovering reads out: " + read);
      // Smoothing: TensorBoard's debiased exponential moving average.
      const sm = await page.eval("KilnChart.smooth([1, 2, 3], 0.5)");
      const want = [1, 1.25 / 0.75, 2.125 / 0.875];
      check(sm.length === 3 && sm.every((v, i) => Math.abs(v - want[i]) < 1e-9),
        "smoothing is the debiased EMA: " + sm);
      await fill(page, "#smoothing", "0.9");
      const smoothed = await page.eval("document.querySelector('#chart-loss').kilnChart" +
        ".smoothing");
      check(smoothed === 0.9, "the smoothing slider sets the charts' weight: " + smoothed);
      // Zoom by dragging, then reset.
      const full = await page.eval("document.querySelector('#chart-loss').kilnChart.xRange()");
      await page.eval(`(() => { const c = document.querySelector('#chart-loss');
        const r = c.getBoundingClientRect(); const y = r.top + r.height / 2;
        const ev = (t, f) => c.dispatchEvent(new MouseEvent(t, {clientX: r.left + r.width * f,
          clientY: y, bubbles: true, buttons: 1}));
        ev('mousedown', 0.4); ev('mousemove', 0.7); ev('mouseup', 0.7); return 1; })()`);
      const zoomed = await page.eval("document.querySelector('#chart-loss').kilnChart.xRange()");
      check(zoomed[0] > full[0] && zoomed[1] < full[1], "dragging zooms in: " + full + " -> " +
        zoomed);
      await click(page, "#zoom-reset");
      const back = await page.eval("document.querySelector('#chart-loss').kilnChart.xRange()");
      check(back[0] === full[0] && back[1] === full[1], "Reset zoom restores " + back);
      // The x axis: step, epoch or wall time, and labelled.
      for (const mode of ["epoch", "time", "step"]) {
        await fill(page, "#x-axis", mode);
        const lab = await page.eval("document.querySelector('#chart-loss').kilnChart.xLabel");
        check(lab.toLowerCase().includes(mode === "time" ? "time" : mode),
          "the x axis by " + mode + " is labelled " + lab);
      }
      const ylab = await page.eval("document.querySelector('#chart-loss').kilnChart.yLabel");
      check(ylab === "loss", "the y axis is labelled " + ylab);
      // Clean log ticks.
      const lt = await page.eval("KilnChart.logTicks(Math.log10(0.3), Math.log10(2.2))");
      check(JSON.stringify(lt.map((t) => Number(Math.pow(10, t).toPrecision(3)))) ===
        "[0.5,1,2]", "log ticks between 0.3 and 2.2 are 0.5, 1, 2: " + lt);
      await click(page, "#log-scale");
      await sleep(300);
      const labels = await page.eval("document.querySelector('#chart-loss').kilnChart.tickLabels");
      check(labels.length > 0 && labels.every((l) => /^[125](0*|e-?\d+)?$|^0\.0*[125]$/.test(l)),
        "the log scale's tick labels are 1, 2, 5 x 10^k: " + labels.join(" "));
      await click(page, "#log-scale");
    });

    await section("checkpoints: metrics and the best mark", async () => {
      const doc = await api("GET", "/v1/jobs/" + jobA + "/checkpoints");
      const best = doc.checkpoints.find((c) => c.best);
      const marked = await page.waitFor("[...document.querySelectorAll('#job-checkpoints " +
        "tr.best')].map((r) => r.dataset.checkpoint).join(',') || null", "a best checkpoint");
      check(best && marked === String(best.id), "the best checkpoint is marked: " + marked +
        " (server " + (best && best.id) + ")");
      const c0 = doc.checkpoints[0];
      const cell = await page.eval("(document.querySelector('#job-checkpoints " +
        `tr[data-checkpoint=\"${c0.id}\"] td[data-metric=\"val_loss\"]') || ` +
        "{dataset: {}}).dataset.value");
      check(Number(cell) === c0.metrics.val_loss, "a checkpoint row shows its val_loss " + cell);
    });

    await section("the hyperparameters as a table, Clone into Submit", async () => {
      const rows = await page.eval("[...document.querySelectorAll('#job-hparams tr')]" +
        ".map((r) => r.textContent).join('|')");
      check(/optimizer\.type\s*adam/.test(rows) && /optimizer\.learning_rate\s*0\.002/.test(rows) &&
        /pipeline\.batch_size\s*64/.test(rows), "the hyperparameter table reads " +
        rows.slice(0, 120));
      const json = await page.eval(text("#job-spec"));
      check(JSON.parse(json).optimizer.type === "adam", "the spec's JSON is one click away");
      await click(page, "#clone");
      const cloned = await page.waitFor("location.hash === '#/submit' && " +
        "document.querySelector('#spec').value", "the cloned spec");
      const spec = JSON.parse(cloned);
      check(spec.optimizer.learning_rate === 0.002 && spec.pipeline.batch_size === 64,
        "Clone into Submit fills the Submit form with the job's spec");
    });

    await section("the profile view and the logs' search and download", async () => {
      await open(page, "/jobs/" + jobA, "document.querySelector('#profile-table tbody tr')");
      const prof = await page.eval(text("#profile-table"));
      check(/matmul/.test(prof), "the profile table lists the job's nodes");
      await page.eval(`window.kilnTestBlobs = []; const made = URL.createObjectURL;
        URL.createObjectURL = (b) => { window.kilnTestBlobs.push(b.size); return made(b); }; 1`);
      await click(page, "#profile-trace");
      const traceLen = await page.waitFor("window.kilnTestBlobs[0]", "the trace download");
      const trace = await api("GET", "/v1/jobs/" + jobA + "/profile", undefined, true);
      check(traceLen === Buffer.byteLength(trace), "the Chrome trace downloads whole (" +
        traceLen + " bytes)");
      const logs = await api("GET", "/v1/jobs/" + jobA + "/logs", undefined, true);
      await fill(page, "#log-filter", "checkpoint");
      const shown = await page.eval(text("#job-logs"));
      const want = logs.split("\n").filter((l) => l.includes("checkpoint"));
      check(shown.split("\n").filter(Boolean).length === want.length && want.length > 0,
        "the log filter keeps the " + want.length + " lines with 'checkpoint'");
      await click(page, "#log-download");
      const logLen = await page.waitFor("window.kilnTestBlobs[1]", "the log download");
      check(logLen === Buffer.byteLength(logs), "Download saves the whole log (" + logLen + ")");
    });

    await section("defect 10: invalid JSON gets a line and column; errors once", async () => {
      await open(page, "/submit", "document.querySelector('#spec')");
      await fill(page, "#spec", '{\n  "a": 1,\n  "b": \n}');
      await click(page, "#validate");
      const msg = await page.waitFor(text("#submit-result"), "the JSON error");
      check(/line 4, column 1/.test(msg), "invalid JSON is placed: " + msg);
      const s = tinySpec("too-big", "adam", 0.01, 64);
      s.resources.devices = 64;
      await fill(page, "#spec", JSON.stringify(s));
      await click(page, "#validate");
      const err = await page.waitFor(`document.querySelector('#submit-result').dataset.ok === '0'
        && /could never start/.test(${text("#submit-result")}) && ${text("#submit-result")}`,
      "the placement error");
      const times = err.split("could never start").length - 1;
      check(times === 1, "an error whose detail repeats its message is shown once (" + times +
        " times)");
    });

    await section("the jobs list: metric and hyperparameter columns, sorting", async () => {
      await open(page, "/jobs", `document.querySelector('#jobs-body tr[data-job=${q(jobB)}]')`);
      const heads = await page.eval("[...document.querySelectorAll('#jobs th')]" +
        ".map((h) => h.textContent).join('|')");
      check(["Optimizer", "Learning rate", "Batch size", "Precision", "Strategy"].every((h) =>
        heads.includes(h)), "the list has the hyperparameter columns: " + heads);
      const pts = (await api("GET", "/v1/jobs/" + jobA + "/metrics?name=val_loss")).metrics;
      const best = Math.min(...pts.map((p) => p.value));
      const cell = await page.waitFor(`(document.querySelector('#jobs-body tr[data-job=${q(jobA)}] ' +
        'td[data-col="best:val_loss"]') || {dataset: {}}).dataset.value`, "best val_loss");
      check(Number(cell) === best, "the best val_loss column holds the minimum " + cell);
      const order = async () => page.eval("[...document.querySelectorAll('#jobs-body tr')]" +
        `.map((r) => r.dataset.job).filter((j) => [${q(jobA)}, ${q(jobB)}].includes(j)).join()`);
      await click(page, "#jobs th button[data-sort='lr']");
      const up = await order();
      await click(page, "#jobs th button[data-sort='lr']");
      const down = await order();
      check(up === jobA + "," + jobB && down === jobB + "," + jobA,
        "sorting by learning rate orders 0.002 then 0.05, and back: " + up + " / " + down);
    });

    await section("compare: overlaid curves and the spec fields that differ", async () => {
      for (const id of [jobA, jobB]) {
        await page.eval(`document.querySelector('#jobs-body tr[data-job=${q(id)}] input.pick')` +
          ".click()");
      }
      await click(page, "#compare");
      await page.waitFor("location.hash.startsWith('#/compare') && " +
        "document.body.dataset.chartsDrawn", "the compare view");
      const n = await page.eval("document.querySelector('#compare-charts canvas#chart-loss')" +
        ".kilnChart.series.filter((s) => s.xs.length).length");
      check(n >= 2, "the loss chart overlays both jobs (" + n + " series)");
      const diff = await page.eval("[...document.querySelectorAll('#compare-diff tbody tr')]" +
        ".map((r) => r.dataset.field).join()");
      check(/optimizer\.type/.test(diff) && /optimizer\.learning_rate/.test(diff) &&
        /pipeline\.batch_size/.test(diff) && !/(^|,)loss(,|$)/.test(diff),
      "the differing fields are listed, the shared ones not: " + diff);
    });

    await section("defect 1: nothing overflows a 390 px phone", async () => {
      await page.send("Emulation.setDeviceMetricsOverride",
        { width: 390, height: 844, deviceScaleFactor: 1, mobile: true });
      for (const [hash, ready] of [["/jobs", "#jobs-body tr"], ["/queue", "#queue-body tr"],
        ["/devices", "#devices-body tr"], ["/submit", "#spec"],
        ["/jobs/" + jobA, "#job-checkpoints tr"], ["/compare?jobs=" + jobA + "," + jobB,
          "#compare-diff tbody tr"]]) {
        await open(page, hash, `document.querySelector(${q(ready)})`);
        await sleep(500);
        const w = await page.eval("document.documentElement.scrollWidth");
        check(w <= 390, hash + " fits 390 px (scrollWidth " + w + ")");
      }
      await open(page, "/jobs/" + jobA, "document.querySelector('#job-logs')");
      const wb = await page.eval("getComputedStyle(document.querySelector('#job-logs')).wordBreak");
      check(wb !== "break-all", "log lines do not break mid-word (word-break: " + wb + ")");
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
