/* helpers.js — what the browser tests share: checks, form filling and
 * clicking in the page, and calls to the API from node with the token. */
"use strict";

const q = (s) => JSON.stringify(s);

/* A check that stops the test at its first failure. */
function check(cond, what) {
  if (!cond) throw new Error("check failed: " + what);
  console.log("ok - " + what);
}

/* A test's report: checks that go on after a failure, sections that each
 * run whatever an earlier one did (an exception fails only its own), and
 * finish(main()) that prints the verdict and sets the exit status, so one
 * run names every failure. */
function report(name) {
  const failures = [];
  function check(cond, what) {
    if (cond) console.log("ok - " + what);
    else {
      console.log("not ok - " + what);
      failures.push(what);
    }
  }
  async function section(title, fn) {
    console.log("# " + title);
    try {
      await fn();
    } catch (e) {
      console.log("not ok - " + title + ": " + e.message);
      failures.push(title + ": " + e.message);
    }
  }
  function finish(done) {
    done.then(() => {
      if (failures.length) {
        console.error(name + " FAILED, " + failures.length + " check(s):\n  " +
          failures.join("\n  "));
        process.exit(1);
      }
      console.log(name + " passed");
    }, (e) => {
      console.error(name + " FAILED: " + e.message);
      process.exit(1);
    });
  }
  return { check, section, finish };
}

/* Sets a form field's value the way typing does and tells the page. */
async function fill(page, selector, value) {
  await page.eval(`(() => { const e = document.querySelector(${q(selector)});
    e.value = ${q(value)}; e.dispatchEvent(new Event('input', {bubbles: true}));
    e.dispatchEvent(new Event('change', {bubbles: true})); return true; })()`);
}

async function click(page, selector) {
  await page.waitFor(`(() => { const e = document.querySelector(${q(selector)});
    return e && !e.disabled; })()`, selector + " to be clickable");
  await page.eval(`document.querySelector(${q(selector)}).click()`);
}

/* Calls the API from node; returns the parsed answer (text when asked). */
function apiClient(url, token) {
  return async (method, path, body, text) => {
    const res = await fetch(url + path, {
      method,
      headers: { Authorization: "Bearer " + token, "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const out = text ? await res.text() : await res.json();
    if (!res.ok) throw new Error(method + " " + path + ": " + JSON.stringify(out));
    return out;
  };
}

module.exports = { q, check, report, fill, click, apiClient };
