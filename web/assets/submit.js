/* submit.js — the Submit page (#/submit): a spec pasted, picked from the
 * examples, loaded from a file or cloned from a job; invalid JSON is placed
 * at its line and column, and the server's validate_only names bad fields. */
"use strict";

/* Where text stops being JSON: {offset, line, column} (1-based), or null
 * when it parses. The browser's own message seldom says where. */
function jsonErrorAt(text) {
  let i = 0;
  const fail = () => {
    throw i;
  };
  const ws = () => {
    while (i < text.length && " \t\n\r".includes(text[i])) i++;
  };
  const lit = (word) => {
    for (const ch of word) if (text[i++] !== ch) {
      i--;
      fail();
    }
  };
  const string = () => {
    if (text[i] !== '"') fail();
    for (i++; i < text.length; i++) {
      const ch = text[i];
      if (ch === '"') {
        i++;
        return;
      }
      if (ch < " ") fail();
      if (ch === "\\") {
        i++;
        if (text[i] === "u") {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 1, i + 5))) fail();
          i += 4;
        } else if (!'"\\/bfnrt'.includes(text[i]) || i >= text.length) fail();
      }
    }
    fail();
  };
  const number = () => {
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i));
    if (!m) fail();
    i += m[0].length;
  };
  const value = () => {
    ws();
    const ch = text[i];
    if (ch === "{") {
      i++;
      ws();
      if (text[i] === "}") {
        i++;
        return;
      }
      for (;;) {
        ws();
        string();
        ws();
        if (text[i] !== ":") fail();
        i++;
        value();
        ws();
        if (text[i] === ",") i++;
        else if (text[i] === "}") {
          i++;
          return;
        } else fail();
      }
    } else if (ch === "[") {
      i++;
      ws();
      if (text[i] === "]") {
        i++;
        return;
      }
      for (;;) {
        value();
        ws();
        if (text[i] === ",") i++;
        else if (text[i] === "]") {
          i++;
          return;
        } else fail();
      }
    } else if (ch === '"') string();
    else if (ch === "t") lit("true");
    else if (ch === "f") lit("false");
    else if (ch === "n") lit("null");
    else number();
  };
  try {
    value();
    ws();
    if (i < text.length) fail();
    return null;
  } catch (at) {
    if (typeof at !== "number") throw at;
    const before = text.slice(0, at).split("\n");
    return { offset: at, line: before.length, column: before[before.length - 1].length + 1 };
  }
}

function viewSubmit(main) {
  const pick = el("select", { id: "example", "aria-label": "an example spec" },
    el("option", { value: "" }, "pick an example…"));
  const file = el("input", { type: "file", id: "spec-file", accept: ".json,application/json",
    "aria-label": "a spec file" });
  const area = el("textarea", { id: "spec", spellcheck: "false", "aria-label": "job spec (JSON)",
    placeholder: "paste a job spec (JSON), or pick an example or a file" });
  const result = el("div", { id: "submit-result", role: "status" });
  const validate = el("button", { id: "validate", type: "button" }, "Validate");
  const submit = el("button", { id: "submit", class: "primary", type: "button" }, "Submit");
  main.append(el("h1", {}, "Submit a job"),
    el("div", { class: "card" }, el("div", { class: "row" }, pick, file), el("p"), area,
      el("div", { class: "row", style: "margin-top:10px" }, validate, submit), result));
  const cloned = sessionStorage.getItem(CLONE_KEY);
  if (cloned) {
    sessionStorage.removeItem(CLONE_KEY);
    area.value = cloned;
  }

  const show = (ok, text, details) => {
    result.replaceChildren(el("p", { class: ok ? "" : "error" }, text),
      details && details.length ? el("ul", {}, details.map((d) =>
        el("li", {}, el("code", {}, d.field || ""), " ", d.description || ""))) : null);
    result.dataset.ok = ok ? "1" : "0";
  };
  const showError = (e) => {
    if (e instanceof ApiError) {
      // A detail that repeats the message is shown once, as the message.
      const more = e.details.filter((d) => d.description !== e.message);
      const same = e.details.find((d) => d.description === e.message);
      show(false, (same && same.field ? same.field + ": " : "") + e.message, more);
    } else {
      show(false, e.message);
    }
  };
  const check = async () => {
    try {
      JSON.parse(area.value);
    } catch (e) {
      const at = jsonErrorAt(area.value);
      show(false, "Not valid JSON" + (at ? " at line " + at.line + ", column " + at.column : "") +
        ": " + e.message);
      if (at) {
        area.focus();
        area.setSelectionRange(at.offset, Math.min(at.offset + 1, area.value.length));
      }
      return false;
    }
    try {
      await api("POST", "/v1/jobs?validate_only=true", { body: area.value });
      show(true, "The spec is valid.");
      return true;
    } catch (e) {
      showError(e);
      return false;
    }
  };
  fetch("/assets/examples/index.json").then((r) => r.json()).then((doc) => {
    for (const name of doc.examples) pick.append(el("option", { value: name }, name));
  });
  pick.addEventListener("change", async () => {
    if (!pick.value) return;
    area.value = await (await fetch("/assets/examples/" + pick.value)).text();
    result.replaceChildren();
  });
  file.addEventListener("change", async () => {
    if (file.files[0]) area.value = await file.files[0].text();
  });
  validate.addEventListener("click", check);
  submit.addEventListener("click", async () => {
    submit.disabled = true;
    try {
      if (!(await check())) return;
      const rid = "web-" + crypto.randomUUID();
      const job = await api("POST", "/v1/jobs?request_id=" + rid, { body: area.value });
      location.hash = "#/jobs/" + job.id;
    } catch (e) {
      showError(e);
    } finally {
      submit.disabled = false;
    }
  });
}
