/* dashboard_test.js — the dashboard in headless Chromium against a real
 * kilnd: log in with a token (a wrong one is refused), submit a long job by
 * pasting its spec and the MLP example by picking it, watch the example wait
 * behind the long job (queue view, explain, devices, a registered worker
 * host among the agents), cancel the long job
 * from its page, see the example go QUEUED -> RUNNING -> SUCCEEDED with
 * points on its loss chart, download and try pinning a checkpoint, save a screenshot
 * of its job page.
 * Usage: node dashboard_test.js URL TOKEN ARTIFACTS_DIR */
"use strict";

const path = require("path");
const { Browser } = require("./cdp.js");
const { q, check, fill, click, apiClient } = require("./helpers.js");

const [url, token, artifacts] = process.argv.slice(2);
if (!url || !token || !artifacts) {
  console.error("usage: node dashboard_test.js URL TOKEN ARTIFACTS_DIR");
  process.exit(2);
}

const badgeState = "(document.querySelector('#job-head .badge') || {dataset: {}}).dataset.state";

/* Submits the spec in the submit page's text area; returns the new job's id. */
async function submitSpec(page) {
  await click(page, "#submit");
  const hash = await page.waitFor("location.hash.startsWith('#/jobs/') && location.hash",
    "the job page after submitting", 20000);
  return hash.slice("#/jobs/".length);
}

async function main() {
  const browser = await Browser.launch({ verbose: !!process.env.KILN_BROWSER_VERBOSE });
  try {
    const page = await browser.newPage(1280, 900);
    await browser.send("Browser.setDownloadBehavior", { behavior: "deny" });
    await page.goto(url + "/");
    await page.waitFor("document.querySelector('#login-form')", "the login form");
    check(true, "an unauthenticated visit shows the login form");

    await fill(page, "#token", "not-a-real-token");
    await page.eval("document.querySelector('#login-form').requestSubmit()");
    const refused = await page.waitFor("document.querySelector('#login-error').textContent",
      "the wrong token's error");
    check(/not valid/.test(refused), "a wrong token is refused with the server's message: " +
      refused);

    await fill(page, "#token", token);
    await page.eval("document.querySelector('#login-form').requestSubmit()");
    await page.waitFor("location.hash === '#/jobs' && document.querySelector('#jobs-body')",
      "the job list after login");
    check(await page.eval("sessionStorage.getItem('kiln.token') !== null"),
      "the token is kept in sessionStorage after login");

    // The long job, pasted; an invalid spec first shows the field's error.
    await page.goto(url + "/#/submit");
    await page.waitFor("document.querySelectorAll('#example option').length > 1", "the examples");
    const mlpText = await page.eval("fetch('/assets/examples/fmnist-mlp.json').then(r => r.text())");
    const bad = JSON.parse(mlpText);
    bad.model.layers[1].units = 0;
    await fill(page, "#spec", JSON.stringify(bad, null, 2));
    await click(page, "#validate");
    const why = await page.waitFor("document.querySelector('#submit-result').dataset.ok === '0' " +
      "&& document.querySelector('#submit-result').textContent", "the validation error");
    check(/model\.layers\[1\]\.units/.test(why), "validate_only names the bad field: " + why);

    const long = JSON.parse(mlpText);
    long.display_name = "long-to-cancel";
    long.epochs = 100;
    await fill(page, "#spec", JSON.stringify(long, null, 2));
    const longId = await submitSpec(page);
    await page.waitFor(badgeState + " === 'RUNNING'", "the long job to run", 60000);
    check(true, "the pasted long job " + longId + " runs");

    // The MLP example, picked from the list, waits behind it.
    await page.goto(url + "/#/submit");
    await page.waitFor("[...document.querySelectorAll('#example option')]" +
      ".some(o => o.value === 'fmnist-mlp.json')", "the MLP example in the list");
    await fill(page, "#example", "fmnist-mlp.json");
    await page.waitFor("document.querySelector('#spec').value.includes('\"fmnist-mlp\"')",
      "the example in the text area");
    const mlpId = await submitSpec(page);
    const seen = [];
    const record = async () => {
      const s = await page.eval(badgeState);
      if (s && seen[seen.length - 1] !== s) seen.push(s);
      return s;
    };
    // The page refreshes the explanation while the job waits: right after
    // submit it is NOT_YET_PLACED, after the scheduler's pass the reason.
    await page.waitFor(badgeState + " === 'QUEUED' && /WAITING_FOR_DEVICES/.test(" +
      "(document.querySelector('#job-explain') || {}).textContent || '')",
      "the example to wait with a reason");
    await record();
    const reason = await page.eval("document.querySelector('#job-explain').textContent");
    check(/WAITING_FOR_DEVICES/.test(reason) && /0 of 1 are free/.test(reason),
      "the waiting job's page says why it waits: " + reason.slice(0, 160));

    await page.goto(url + "/#/queue");
    const queueRow = await page.waitFor(`(() => { const r = document.querySelector(
      '#queue-body tr[data-job=${q(mlpId)}]'); return r && r.textContent; })()`,
    "the example in the queue view");
    check(/WAITING_FOR_DEVICES/.test(queueRow),
      "the queue view lists the example with its reason");

    // A worker host's kiln-agent registers with an agent token an admin made.
    const agentToken = (await apiClient(url, token)("POST", "/v1/tokens", { role: "agent" })).secret;
    await apiClient(url, agentToken)("POST", "/v1/agents", { name: "host-dash",
      hostname: "host-dash.lab", pool: "hosts", address: "10.77.0.5", cpus: 3,
      gpus: [{ index: 0, name: "NVIDIA H200", memory_bytes: 150000000000 }] });

    await page.goto(url + "/#/devices");
    const devices = await page.waitFor("document.querySelector('#devices-body a') && " +
      "document.querySelector('#devices-body').textContent", "a busy device");
    check(devices.includes(longId) && /busy/.test(devices),
      "the devices view shows the long job on a busy device");
    const agentCells = await page.waitFor(`(() => { const r = document.querySelector(
      '#agents-body tr[data-agent="host-dash"]');
      return r && [...r.cells].map((c) => c.textContent); })()`, "the worker host's row");
    check(JSON.stringify(agentCells.slice(0, 7)) === JSON.stringify(["host-dash", "host-dash.lab",
      "hosts", "10.77.0.5", "3", "NVIDIA H200", "ONLINE"]) && / ago$/.test(agentCells[7]) &&
      agentCells[8] === "none",
    "the devices view lists the worker host with its cores, GPU, state and (no) jobs: " +
      agentCells.join(" | "));

    // Cancel the long job from its page.
    await page.goto(url + "/#/jobs/" + longId);
    await page.waitFor(badgeState + " === 'RUNNING'", "the long job's page");
    await click(page, "#cancel");
    await click(page, "#confirm-yes"); // Cancel asks first
    await page.waitFor(badgeState + " === 'CANCELLED'", "the long job to be cancelled", 30000);
    const stopLog = await page.waitFor("/SIGTERM/.test(document.querySelector('#job-logs')" +
      ".textContent) && document.querySelector('#job-logs').textContent", "the stop in the logs");
    check(true, "the cancelled job's logs show the trainer's last words: " + stopLog.trim());
    check(await page.eval("!document.querySelector('#resume').disabled && " +
      "document.querySelector('#cancel').disabled"),
    "the cancelled job's page offers Resume and no longer Cancel");

    // The example now runs to the end.
    await page.goto(url + "/#/jobs/" + mlpId);
    await page.waitFor(badgeState, "the example's page");
    const deadline = Date.now() + 600000;
    while ((await record()) !== "SUCCEEDED") {
      if (Date.now() > deadline) throw new Error("the example never succeeded; saw " + seen);
      if (["FAILED", "CANCELLED"].includes(seen[seen.length - 1]))
        throw new Error("the example ended " + seen[seen.length - 1]);
      await new Promise((r) => setTimeout(r, 100));
    }
    const order = ["QUEUED", "RUNNING", "SUCCEEDED"].map((s) => seen.indexOf(s));
    check(order.every((i, k) => i >= 0 && (k === 0 || i > order[k - 1])),
      "the example's page showed " + seen.join(" -> "));
    const timeline = await page.waitFor("[...document.querySelectorAll('#job-events li')]" +
      ".map(li => li.dataset.to).join(' ').includes('SUCCEEDED') && " +
      "[...document.querySelectorAll('#job-events li')].map(li => li.dataset.to).join(' ')",
    "the event timeline");
    check(/QUEUED.*RUNNING.*SUCCEEDED/.test(timeline), "the timeline reads " + timeline);

    const points = await page.waitFor("parseInt(document.querySelector('#chart-loss-count')" +
      ".textContent, 10) > 0 && document.querySelector('#chart-loss-count').textContent",
    "points on the loss chart");
    check(true, "the loss chart has " + points);
    const status = await page.eval("document.querySelector('#chart-status').textContent");
    check(/[1-9]\d* streamed/.test(status), "the points came through the live stream: " + status);
    const inked = await page.eval(`(() => { const c = document.querySelector('#chart-loss');
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
      for (let i = 0; i < d.length; i += 4) if (d[i + 2] > 150 && d[i] < 80) n++; return n; })()`);
    check(inked > 50, "the train loss line is drawn (" + inked + " blue pixels)");
    await click(page, "#log-scale");
    check(await page.eval("document.querySelector('#log-scale').checked"), "log scale toggles");
    await click(page, "#log-scale");

    const logsShown = await page.eval("document.querySelector('#job-logs').textContent");
    const logsServed = await page.eval("fetch('/v1/jobs/" + mlpId + "/logs', {headers: " +
      "{Authorization: 'Bearer ' + sessionStorage.getItem('kiln.token')}}).then(r => r.text())");
    check(logsShown === (logsServed || "(no output yet)"), "the logs pane shows the job's log");
    check(await page.eval("document.querySelector('#job-spec').textContent.includes('fmnist-mlp')"),
      "the spec is shown");

    await page.waitFor("document.querySelector('#job-checkpoints button.pin, " +
      "#job-checkpoints button.unpin')", "a checkpoint row");
    await page.eval(`window.kilnTestBlobs = []; const made = URL.createObjectURL;
      URL.createObjectURL = (b) => { window.kilnTestBlobs.push(b.size); return made(b); }; 1`);
    await click(page, "#job-checkpoints button.download");
    const downloaded = await page.waitFor("window.kilnTestBlobs[0]", "the checkpoint download");
    const bytes = await page.eval("fetch('/v1/jobs/" + mlpId + "/checkpoints', {headers: " +
      "{Authorization: 'Bearer ' + sessionStorage.getItem('kiln.token')}}).then(r => r.json())" +
      ".then(d => d.checkpoints[0].bytes)");
    check(downloaded === bytes, "Download fetches the whole checkpoint (" + downloaded + " bytes)");
    await click(page, "#job-checkpoints button.pin");
    const pinned = await page.waitFor("document.querySelector('#checkpoint-error').textContent || " +
      "(document.querySelector('#job-checkpoints button.unpin') && 'pinned')",
    "the pin's outcome");
    check(pinned === "pinned" || /^pin failed: .+/.test(pinned),
      "pinning a checkpoint pins it or shows the server's answer: " + pinned);

    await page.eval("window.scrollTo(0, 0)");
    const shot = path.join(artifacts, "job-page.png");
    await page.screenshot(shot);
    check(true, "screenshot saved to " + shot);

    // The job list: state, progress and the state filter.
    await page.goto(url + "/#/jobs");
    const row = await page.waitFor(`(() => { const r = document.querySelector(
      '#jobs-body tr[data-job=${q(mlpId)}]'); return r && r.textContent.includes('100%') &&
      r.textContent; })()`, "the example's row at 100%");
    check(/SUCCEEDED/.test(row) && /fmnist-mlp/.test(row), "the job list shows the example: " +
      row);
    await fill(page, "#filter-state", "CANCELLED");
    await page.waitFor(`(() => { const ids = [...document.querySelectorAll('#jobs-body tr')]
      .map((r) => r.dataset.job); return ids.length === 1 && ids[0] === ${q(longId)}; })()`,
    "only the cancelled job under state=CANCELLED");
    check(true, "the state filter lists only the cancelled job");
    check(page.errors.length === 0, "no script errors on the page" +
      (page.errors.length ? ": " + page.errors.join(" | ") : ""));
  } finally {
    await browser.close();
  }
}

main().then(() => console.log("dashboard test passed"), (e) => {
  console.error("dashboard test FAILED: " + e.message);
  process.exit(1);
});
