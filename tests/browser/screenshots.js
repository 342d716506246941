/* screenshots.js — the dashboard's screenshots in docs/screenshots/, taken
 * from a real kilnd with a few small real jobs (scripts/screenshots.sh
 * starts one and runs this): the jobs list, a job's page, the compare view,
 * the jobs list and a job's page at a phone's 390 px, and a small grid
 * search's experiment page.
 * Usage: node screenshots.js URL TOKEN OUT_DIR */
"use strict";

const path = require("path");
const { Browser } = require("./cdp.js");
const { q, apiClient } = require("./helpers.js");

const [url, token, out] = process.argv.slice(2);
if (!url || !token || !out) {
  console.error("usage: node screenshots.js URL TOKEN OUT_DIR");
  process.exit(2);
}
const api = apiClient(url, token);

/* A small MLP on 6000 Fashion-MNIST images, a few seconds of training. */
function spec(name, optimizer, lr, batch) {
  return {
    display_name: name,
    model: { input_shape: [28, 28, 1], layers: [{ type: "flatten" },
      { type: "dense", units: 64, activation: "relu" },
      { type: "dense", units: 10, activation: "softmax" }] },
    loss: "sparse_categorical_crossentropy", metrics: ["accuracy"],
    dataset: { name: "fashion-mnist", validation: "test" },
    pipeline: { batch_size: batch, shuffle: true, normalize: true, take: 6000 },
    optimizer: { type: optimizer, learning_rate: lr },
    epochs: 4, seed: 1, log_every_steps: 5,
    checkpoint: { every_steps: 100, keep_last: 2, keep_best: 1, monitor: "val_loss" },
    profile: { steps: [3, 5] },
    resources: { device_type: "cpu", devices: 1 },
  };
}

async function shoot(page, hash, ready, file, width, height) {
  await page.send("Emulation.setDeviceMetricsOverride",
    { width, height, deviceScaleFactor: 1, mobile: width < 600 });
  await page.goto("about:blank");
  await page.goto(url + "/#" + hash);
  await page.waitFor(ready, file, 30000);
  await new Promise((r) => setTimeout(r, 800)); // the charts' frame, the list's metrics
  await page.screenshot(path.join(out, file), { viewport: true });
  console.log("saved " + path.join(out, file));
}

/* A grid search over the learning rate (3, log-spaced) and batch size (2)
 * of a smaller spec, run to its end; its id. */
async function experiment() {
  const base = spec("", "adam", 0.002, 64);
  delete base.display_name;
  base.pipeline.take = 3000;
  base.epochs = 3;
  const x = await api("POST", "/v1/experiments", {
    display_name: "mlp-lr-batch-grid", spec: base,
    search: { searcher: "grid", metric: "val_accuracy", mode: "max", seed: 1,
      parameters: {
        "optimizer.learning_rate": { type: "log_uniform", min: 0.0001, max: 0.01, count: 3 },
        "pipeline.batch_size": { type: "categorical", values: [32, 128] } } },
  });
  for (const deadline = Date.now() + 600000; Date.now() < deadline;) {
    const now = await api("GET", "/v1/experiments/" + x.id);
    if (now.state !== "RUNNING") return x.id;
    await new Promise((r) => setTimeout(r, 500));
  }
  throw new Error("the experiment did not end in 10 minutes");
}

async function main() {
  const ids = [];
  for (const [name, opt, lr, batch] of [["mlp-adam-2e-3", "adam", 0.002, 64],
    ["mlp-sgd-5e-2", "sgd", 0.05, 32], ["mlp-adam-1e-2", "adam", 0.01, 128]]) {
    ids.push((await api("POST", "/v1/jobs", spec(name, opt, lr, batch))).id);
  }
  for (const id of ids) await api("POST", "/v1/jobs/" + id + ":wait?timeout=300s");
  const browser = await Browser.launch();
  try {
    const page = await browser.newPage(1280, 860);
    await page.goto(url + "/");
    await page.eval(`sessionStorage.setItem('kiln.token', ${q(token)}), 1`);
    const rows = `document.querySelectorAll('#jobs-body td[data-col="best:val_loss"]')
      .length === 3 && [...document.querySelectorAll('#jobs-body td[data-col="best:val_loss"]')]
      .every((t) => t.dataset.value)`;
    await shoot(page, "/jobs", rows, "jobs.png", 1280, 420);
    await shoot(page, "/jobs/" + ids[0], "document.body.dataset.chartsDrawn && " +
      "document.querySelector('#profile-table')", "job.png", 1280, 1150);
    await shoot(page, "/compare?jobs=" + ids.join(","), "document.body.dataset.chartsDrawn",
      "compare.png", 1280, 1000);
    await shoot(page, "/jobs", rows, "phone-jobs.png", 390, 700);
    await shoot(page, "/jobs/" + ids[0], "document.body.dataset.chartsDrawn", "phone-job.png",
      390, 1100);
    // Last, so its trials stay out of the jobs list's pictures.
    const x = await experiment();
    await shoot(page, "/experiments/" + x, "document.body.dataset.experimentLoaded && " +
      "document.body.dataset.chartsDrawn && document.querySelector('#trials-body tr.best')",
    "experiment.png", 1280, 1700);
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error("screenshots FAILED: " + e.message);
  process.exit(1);
});
