/* cdp.js — drives the system's headless Chromium through the DevTools
 * protocol over a pipe (--remote-debugging-pipe: NUL-separated JSON on
 * file descriptors 3 and 4), so the browser tests and the dashboard
 * benchmark need only node and chromium: nothing is downloaded. */
"use strict";

const { spawn } = require("child_process");
const fs = require("fs");
const os = require("os");
const path = require("path");

/* The browser to use: $KILN_CHROMIUM, else the first of the usual names
 * found on PATH; null when there is none. */
function findChromium() {
  if (process.env.KILN_CHROMIUM) return process.env.KILN_CHROMIUM;
  for (const dir of (process.env.PATH || "").split(":")) {
    for (const name of ["chromium", "chromium-browser", "google-chrome"]) {
      const p = path.join(dir, name);
      try {
        fs.accessSync(p, fs.constants.X_OK);
        return p;
      } catch (e) {
        /* not here */
      }
    }
  }
  return null;
}

class Browser {
  static async launch(opts) {
    opts = opts || {};
    const exe = findChromium();
    if (!exe) throw new Error("no chromium found (install the Debian package 'chromium')");
    const profile = fs.mkdtempSync(path.join(os.tmpdir(), "kiln-chromium-"));
    const args = ["--headless", "--remote-debugging-pipe", "--no-first-run",
      "--no-default-browser-check", "--disable-gpu", "--disable-dev-shm-usage",
      "--disable-extensions", "--disable-background-networking", "--disable-sync",
      "--metrics-recording-only", "--mute-audio", "--user-data-dir=" + profile, "about:blank"];
    // Chromium's sandbox cannot start as root (CI containers); it is not
    // needed for a page served on loopback by the test itself.
    if (process.getuid && process.getuid() === 0) args.unshift("--no-sandbox");
    const child = spawn(exe, args, { stdio: ["ignore", "ignore", "pipe", "pipe", "pipe"] });
    const b = new Browser(child, profile, opts.verbose);
    await b.send("Target.setDiscoverTargets", { discover: false });
    return b;
  }

  constructor(child, profile, verbose) {
    this.child = child;
    this.profile = profile;
    this.nextId = 1;
    this.pending = new Map();
    this.listeners = [];
    this.stderr = "";
    this.exited = false;
    let buf = "";
    child.stdio[4].on("data", (chunk) => {
      buf += chunk.toString("utf8");
      let cut;
      while ((cut = buf.indexOf("\0")) >= 0) {
        const msg = JSON.parse(buf.slice(0, cut));
        buf = buf.slice(cut + 1);
        this.dispatch(msg);
      }
    });
    child.stderr.on("data", (d) => {
      this.stderr = (this.stderr + d.toString()).slice(-4000);
      if (verbose) process.stderr.write(d);
    });
    child.on("exit", (code) => {
      this.exited = true;
      for (const [, p] of this.pending) p.reject(new Error("chromium exited (" + code + "): " +
        this.stderr));
      this.pending.clear();
    });
  }

  dispatch(msg) {
    if (msg.id !== undefined) {
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      if (msg.error) p.reject(new Error(p.method + ": " + msg.error.message));
      else p.resolve(msg.result);
      return;
    }
    for (const l of this.listeners) l(msg);
  }

  send(method, params, sessionId) {
    if (this.exited) return Promise.reject(new Error("chromium has exited: " + this.stderr));
    const id = this.nextId++;
    const msg = { id, method, params: params || {} };
    if (sessionId) msg.sessionId = sessionId;
    this.child.stdio[3].write(JSON.stringify(msg) + "\0");
    return new Promise((resolve, reject) => this.pending.set(id, { resolve, reject, method }));
  }

  async newPage(width, height) {
    const { targetId } = await this.send("Target.createTarget", { url: "about:blank" });
    const { sessionId } = await this.send("Target.attachToTarget", { targetId, flatten: true });
    const page = new Page(this, sessionId);
    await page.send("Page.enable");
    await page.send("Runtime.enable");
    await page.send("Emulation.setDeviceMetricsOverride",
      { width: width || 1280, height: height || 900, deviceScaleFactor: 1, mobile: false });
    return page;
  }

  async close() {
    if (!this.exited) {
      const gone = new Promise((r) => this.child.once("exit", r));
      this.send("Browser.close").catch(() => {});
      const timer = setTimeout(() => this.child.kill("SIGKILL"), 5000);
      await gone;
      clearTimeout(timer);
    }
    fs.rmSync(this.profile, { recursive: true, force: true });
  }
}

class Page {
  constructor(browser, sessionId) {
    this.browser = browser;
    this.sessionId = sessionId;
    this.errors = []; // uncaught exceptions and console errors of the page
    browser.listeners.push((msg) => {
      if (msg.sessionId !== sessionId) return;
      if (msg.method === "Runtime.exceptionThrown") {
        const d = msg.params.exceptionDetails;
        this.errors.push((d.exception && d.exception.description) || d.text);
      } else if (msg.method === "Runtime.consoleAPICalled" && msg.params.type === "error") {
        this.errors.push(msg.params.args.map((a) => a.value || a.description).join(" "));
      }
    });
  }

  send(method, params) {
    return this.browser.send(method, params, this.sessionId);
  }

  async goto(url) {
    const r = await this.send("Page.navigate", { url });
    if (r.errorText) throw new Error("navigation to " + url + " failed: " + r.errorText);
  }

  /* The value of a JavaScript expression in the page (promises awaited). */
  async eval(expression) {
    const r = await this.send("Runtime.evaluate",
      { expression, awaitPromise: true, returnByValue: true });
    if (r.exceptionDetails) {
      const d = r.exceptionDetails;
      throw new Error("in page: " + ((d.exception && d.exception.description) || d.text));
    }
    return r.result.value;
  }

  /* Polls expression until it is truthy; returns its value. */
  async waitFor(expression, what, timeoutMs) {
    const deadline = Date.now() + (timeoutMs || 15000);
    let last = null;
    for (;;) {
      try {
        const v = await this.eval(expression);
        if (v) return v;
      } catch (e) {
        last = e;
      }
      if (Date.now() > deadline) {
        throw new Error("timed out waiting for " + (what || expression) +
          (last ? " (" + last.message + ")" : "") +
          (this.errors.length ? "; page errors: " + this.errors.join(" | ") : ""));
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /* The whole page as a PNG; with opts.viewport only what the viewport shows. */
  async screenshot(file, opts) {
    const viewport = opts && opts.viewport;
    const { data } = await this.send("Page.captureScreenshot",
      { format: "png", captureBeyondViewport: !viewport });
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, Buffer.from(data, "base64"));
  }
}

module.exports = { Browser, findChromium };
