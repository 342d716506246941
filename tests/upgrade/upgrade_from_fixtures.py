#!/usr/bin/env python3
"""upgrade_from_fixtures.py KILND KILN_TRAIN FIXTURES_DIR STORAGE_H

Upgrades from every schema: each tests/fixtures/schemas/vN/ (a data
directory made by the kiln that wrote schema N, scripts/make-schema-fixtures.sh)
is copied to a temporary folder and opened with today's kilnd, which must
migrate it to STORE_SCHEMA_VERSION and serve every job of the manifest with
its state, name and tenant, every metric point with its value, every
checkpoint with its step, size, sha256 and pin (and its file, unchanged),
every uploaded data set, and the tokens of the time. Then a data directory
from a newer kiln (schema STORE_SCHEMA_VERSION + 1) must make kilnd exit
non-zero with a message naming both versions, leaving the file as it was.

Every version from 1 to the newest fixture's must have one; a schema
added since, before its fixture is made, is named in a warning (so the
test keeps passing while a new migration lands)."""

import hashlib
import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kilnd_proc import Kilnd, schema_version  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("  FAIL: " + what)
    return cond


def dump(db_path):
    """The database's rows and schema, whatever its pages look like."""
    with sqlite3.connect(db_path) as db:
        return "\n".join(db.iterdump())


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def all_metrics(k, job_id):
    points, token = [], ""
    while True:
        status, doc = k.call("GET", "/v1/jobs/%s/metrics?page_size=1000%s" % (
            job_id, "&page_token=" + token if token else ""))
        if not check(status == 200, "GET metrics of %s: %d %s" % (job_id, status, doc)):
            return points
        points += doc["metrics"]
        token = doc.get("next_page_token") or ""
        if not token:
            return points


def check_fixture(kilnd, trainer, fixture, work, current):
    manifest = json.load(open(os.path.join(fixture, "manifest.json")))
    version = manifest["schema_version"]
    data = os.path.join(work, "data")
    shutil.copytree(os.path.join(fixture, "data"), data, symlinks=True)
    check(schema_version(os.path.join(data, "kiln.db")) == version,
          "v%d: the fixture's kiln.db says schema %s" % (
              version, schema_version(os.path.join(data, "kiln.db"))))
    log = os.path.join(work, "kilnd.log")
    k = Kilnd(kilnd, trainer, data, log)
    t0 = time.time()
    if not k.wait_ready():
        check(False, "v%d: today's kilnd exited %s on the fixture:\n%s" % (
            version, k.proc.returncode, open(log).read()))
        return
    print("v%d (%s): kilnd serving after %.2f s" % (version, manifest.get("commit", "")[:10],
                                                    time.time() - t0))
    tokens = manifest["tokens"]
    for job in manifest["jobs"]:
        jid = job["id"]
        status, doc = k.call("GET", "/v1/jobs/" + jid)
        if not check(status == 200, "v%d: GET job %s: %d %s" % (version, jid, status, doc)):
            continue
        check(doc["state"] == job["state"], "v%d: job %s is %s, was %s" % (
            version, jid, doc["state"], job["state"]))
        check(doc.get("display_name") == job["display_name"], "v%d: job %s is named %r, was %r" % (
            version, jid, doc.get("display_name"), job["display_name"]))
        got = {(p["attempt"] if "attempt" in p else 1, p["step"], p["name"]): p["value"]
               for p in all_metrics(k, jid)}
        want = {(a, s, n): v for a, s, n, v in job["metrics"]}
        missing = [key for key in want if key not in got]
        check(not missing, "v%d: job %s lost %d of %d metric points, e.g. %s" % (
            version, jid, len(missing), len(want), missing[:3]))
        changed = [key for key in want if key in got and want[key] is not None and
                   (got[key] is None or abs(got[key] - want[key]) > 1e-12 * max(1, abs(want[key])))]
        check(not changed, "v%d: job %s metric values changed: %s" % (
            version, jid, [(key, want[key], got[key]) for key in changed[:3]]))
        check(len(got) == len(want), "v%d: job %s has %d metric points, the fixture %d" % (
            version, jid, len(got), len(want)))
        status, doc = k.call("GET", "/v1/jobs/%s/checkpoints" % jid)
        if not check(status == 200, "v%d: GET checkpoints of %s: %d" % (version, jid, status)):
            continue
        listed = {c["step"]: c for c in doc["checkpoints"]}
        check(len(listed) == len(job["checkpoints"]), "v%d: job %s lists %d checkpoints, had %d" % (
            version, jid, len(listed), len(job["checkpoints"])))
        for c in job["checkpoints"]:
            got_c = listed.get(c["step"])
            if not check(got_c is not None, "v%d: job %s lost its checkpoint at step %d" % (
                    version, jid, c["step"])):
                continue
            check(got_c.get("sha256") == c["sha256"] and got_c.get("bytes") == c["bytes"],
                  "v%d: job %s checkpoint %d is %s/%s, was %s/%s" % (
                      version, jid, c["step"], got_c.get("sha256"), got_c.get("bytes"),
                      c["sha256"], c["bytes"]))
            check(bool(got_c.get("pinned")) == c["pinned"], "v%d: job %s checkpoint %d pinned %s,"
                  " was %s" % (version, jid, c["step"], got_c.get("pinned"), c["pinned"]))
            status, body = k.call("GET", "/v1/jobs/%s/checkpoints/%s:download" % (
                jid, got_c["id"]), raw=True)
            check(status == 200 and hashlib.sha256(body).hexdigest() == c["sha256"],
                  "v%d: job %s checkpoint %d downloads as %d, %d bytes, sha256 %s" % (
                      version, jid, c["step"], status, len(body),
                      hashlib.sha256(body).hexdigest()))
            path = os.path.join(data, c["file"])
            check(os.path.exists(path) and sha256_file(path) == c["sha256"],
                  "v%d: checkpoint file %s is gone or changed" % (version, c["file"]))
        if job["tenant"] != "default" and job["tenant"] in tokens:
            # the tenant's own token still finds its job
            status, doc = k.call("GET", "/v1/jobs/" + jid, token=tokens[job["tenant"]])
            check(status == 200, "v%d: %s's token cannot read its job %s: %d" % (
                version, job["tenant"], jid, status))
    for ds in manifest["datasets"]:
        # Data sets were shared by every tenant until schema 5 gave each an
        # owner; migration 5 gives the earlier ones to the default tenant.
        owner = "team-a" if version >= 5 else "default"
        status, doc = k.call("GET", "/v1/datasets/" + ds["id"], token=tokens.get(owner))
        if check(status == 200, "v%d: GET data set %s as %s: %d %s" % (
                version, ds["id"], owner, status, doc)):
            check(doc.get("sha256") == ds["sha256"], "v%d: data set %s sha256 %s, was %s" % (
                version, ds["id"], doc.get("sha256"), ds["sha256"]))
        # the data set's folder: its upload, byte for byte
        folder = os.path.join(data, ds["file"])
        sums = [sha256_file(os.path.join(folder, f)) for f in
                (os.listdir(folder) if os.path.isdir(folder) else [])]
        check(ds["sha256"] in sums, "v%d: data set %s's upload is gone or changed" % (
            version, ds["file"]))
    if "admin" in tokens:
        status, _ = k.call("GET", "/v1/jobs", token=tokens["admin"])
        check(status == 200, "v%d: the fixture's admin token is refused: %d" % (version, status))
    rc = k.stop()
    check(rc == 0, "v%d: today's kilnd exited %s on SIGTERM" % (version, rc))
    check(schema_version(os.path.join(data, "kiln.db")) == current,
          "v%d: kiln.db was not migrated to schema %d" % (version, current))
    print("v%d: %d jobs, %d metric points, %d checkpoints, %d data sets upgraded to schema %d" % (
        version, len(manifest["jobs"]), sum(len(j["metrics"]) for j in manifest["jobs"]),
        sum(len(j["checkpoints"]) for j in manifest["jobs"]), len(manifest["datasets"]), current))


def check_newer_refused(kilnd, trainer, fixture, work, current):
    """A kiln.db one schema ahead: kilnd refuses it and leaves it alone."""
    data = os.path.join(work, "data")
    shutil.copytree(os.path.join(fixture, "data"), data, symlinks=True)
    db_path = os.path.join(data, "kiln.db")
    k = Kilnd(kilnd, trainer, data, os.path.join(work, "kilnd.log"))
    k.wait_ready()
    k.stop()
    with sqlite3.connect(db_path) as db:
        db.execute("INSERT INTO schema_version(version, applied_ms) VALUES (?, 0)", (current + 1,))
    before = dump(db_path)
    log = os.path.join(work, "newer.log")
    k = Kilnd(kilnd, trainer, data, log)
    ready = k.wait_ready(seconds=20)
    rc = k.stop()
    text = open(log).read()
    check(not ready and rc not in (0, None), "newer: kilnd served (or exited %s) on a schema %d "
          "database:\n%s" % (rc, current + 1, text))
    want = "database schema version %d is newer than version %d" % (current + 1, current)
    check(want in text, "newer: kilnd's message lacks %r:\n%s" % (want, text))
    check(dump(db_path) == before, "newer: kilnd changed the newer database")
    print("newer: kilnd exited %s: %s" % (rc, text.strip().splitlines()[-1] if text else ""))


def main():
    kilnd, trainer, fixtures, storage_h = sys.argv[1:5]
    current = int(re.search(r"#define STORE_SCHEMA_VERSION (\d+)", open(storage_h).read()).group(1))
    found = sorted(int(d[1:]) for d in os.listdir(fixtures) if re.fullmatch(r"v\d+", d))
    print("schema %d; fixtures of schemas %s" % (current, found))
    # Schemas 1 to the newest fixture's must all be there; a later one that
    # has none yet (a migration added since) is named, not failed on.
    for n in range(1, max(found) + 1):
        check(n in found, "no fixture of schema %d: run scripts/make-schema-fixtures.sh %d" % (n, n))
    for n in range(max(found) + 1, current):
        print("WARNING: no fixture of schema %d yet: run scripts/make-schema-fixtures.sh %d and "
              "commit tests/fixtures/schemas/v%d" % (n, n, n))
    for n in found:
        check(n <= current, "fixture v%d is newer than this build's schema %d" % (n, current))
    root = tempfile.mkdtemp(prefix="kiln-upgrade-")
    try:
        for n in found:
            if n <= current:
                check_fixture(kilnd, trainer, os.path.join(fixtures, "v%d" % n),
                              os.path.join(root, "v%d" % n), current)
        check_newer_refused(kilnd, trainer, os.path.join(fixtures, "v%d" % max(found)),
                            os.path.join(root, "newer"), current)
    finally:
        shutil.rmtree(root)
    if failures:
        print("%d failures" % len(failures))
        sys.exit(1)
    print("all %d fixtures upgraded; a newer schema is refused" % len(found))


if __name__ == "__main__":
    main()
