/* dashboard_load.js — loads the dashboard's job page in headless Chromium
 * RUNS times and prints, per load, the time from navigation start until
 * both charts are drawn (the page marks that moment), then the median.
 * Usage: node bench/dashboard_load.js URL TOKEN JOB_ID [RUNS] */
"use strict";

const path = require("path");
const { Browser } = require(path.join(__dirname, "..", "tests", "browser", "cdp.js"));

async function main() {
  const [url, token, job, runsArg] = process.argv.slice(2);
  const runs = parseInt(runsArg || "7", 10);
  const browser = await Browser.launch();
  try {
    const page = await browser.newPage(1280, 900);
    await page.goto(url + "/");
    await page.waitFor("document.readyState === 'complete'", "the first page");
    await page.eval(`sessionStorage.setItem('kiln.token', ${JSON.stringify(token)})`);
    const times = [];
    for (let i = 0; i < runs; i++) {
      await page.goto(url + "/?load=" + i + "#/jobs/" + job);
      const ms = Number(await page.waitFor("document.body && document.body.dataset.chartsDrawn",
        "the charts", 30000).catch(async (e) => {
        throw new Error(e.message + "; the page shows: " +
          (await page.eval("document.body.innerText.slice(0, 400)")));
      }));
      const points = await page.eval("document.querySelector('#chart-status').textContent");
      times.push(ms);
      if (process.env.KILN_BENCH_VERBOSE) {
        console.log(await page.eval(`JSON.stringify(performance.getEntries().map((e) =>
          [e.name.replace(location.origin, ""), Math.round(e.startTime),
           Math.round(e.responseEnd || e.startTime + e.duration)]))`));
      }
      console.log(`load ${i + 1}: charts drawn ${ms.toFixed(0)} ms after navigation (${points})`);
    }
    if (page.errors.length) throw new Error("page errors: " + page.errors.join(" | "));
    const sorted = times.slice().sort((a, b) => a - b);
    console.log(`job_page_first_load_ms=${times[0].toFixed(0)}`);
    console.log(`job_page_median_load_ms=${sorted[Math.floor(sorted.length / 2)].toFixed(0)}`);
    console.log(`job_page_max_load_ms=${sorted[sorted.length - 1].toFixed(0)}`);
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error("dashboard_load: " + e.message);
  process.exit(1);
});
