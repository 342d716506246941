#!/usr/bin/env python3
"""make_fixture.py KILND KILN_TRAIN VERSION OUT_DIR [COMMIT]

Makes the data directory of schema VERSION with the kilnd and kiln-train of
the commit that wrote that schema (scripts/make-schema-fixtures.sh builds
them): jobs that succeeded (checkpoints and metrics), one cancelled while
it ran, a second tenant's job under a user token, an uploaded CSV data set
and a pinned checkpoint where the old kilnd had them. Writes OUT_DIR/data
(the data directory, stopped cleanly) and OUT_DIR/manifest.json: what the
old kilnd's database holds, read back with SQLite after it stopped, which
the upgrade test expects today's kilnd to serve."""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kilnd_proc import Kilnd, schema_version  # noqa: E402

# Small enough to keep each fixture's checkpoints at a few tens of KB.
TINY_MNIST = {
    "display_name": "fixture-mnist",
    "model": {"input_shape": [28, 28, 1],
              "layers": [{"type": "flatten"},
                         {"type": "dense", "units": 4, "activation": "relu"},
                         {"type": "dense", "units": 10, "activation": "softmax"}]},
    "loss": "sparse_categorical_crossentropy",
    "metrics": ["accuracy"],
    "dataset": {"name": "fashion-mnist", "validation": "test"},
    "pipeline": {"batch_size": 256, "shuffle": True, "normalize": True},
    "optimizer": {"type": "sgd", "learning_rate": 0.1},
    "epochs": 2,
    "seed": 7,
    "log_every_steps": 100,
    "resources": {"device_type": "cpu", "devices": 1},
}


def csv_body():
    lines = ["a,b,c,label"]
    for i in range(60):
        x = (i * 37 % 100) / 100.0
        y = (i * 53 % 100) / 100.0
        lines.append("%.2f,%.2f,%.2f,%d" % (x, y, x - y, 1 if x > y else 0))
    return ("\n".join(lines) + "\n").encode()


def submit(k, spec, token=None):
    status, doc = k.call("POST", "/v1/jobs", spec, token=token)
    if status not in (200, 201):
        raise RuntimeError("POST /v1/jobs %s: %d %s" % (spec["display_name"], status, doc))
    return doc["id"]


def main():
    kilnd, trainer, version, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    commit = sys.argv[5] if len(sys.argv) > 5 else ""
    work = tempfile.mkdtemp(prefix="kiln-fixture-")
    data = os.path.join(work, "data")
    k = Kilnd(kilnd, trainer, data, os.path.join(work, "kilnd.log"))
    if not k.wait_ready():
        sys.exit(open(os.path.join(work, "kilnd.log")).read())
    tokens = {}
    if k.token:
        tokens["admin"] = k.token
        # `kilnd token create` exists since tokens did (schema 2)
        made = subprocess.run([kilnd, "token", "create", "--tenant", "team-a", "--data-dir", data],
                              check=True, capture_output=True, text=True)
        tokens["team-a"] = made.stdout.strip().split()[-1]

    jobs = []
    mnist = submit(k, TINY_MNIST)
    k.wait_state(mnist, {"SUCCEEDED", "FAILED"})
    jobs.append(mnist)

    dataset = None
    if version >= 3:
        status, doc = k.call("POST", "/v1/datasets?format=csv&label_column=label"
                             "&display_name=fixture-csv", csv_body(),
                             token=tokens.get("team-a"),
                             content_type="application/octet-stream")
        if status not in (200, 201):
            raise RuntimeError("POST /v1/datasets: %d %s" % (status, doc))
        dataset = doc["id"]
    second = dict(TINY_MNIST, display_name="fixture-team-a", seed=8, epochs=1)
    if dataset:
        second.update(model={"input_shape": [3],
                             "layers": [{"type": "dense", "units": 4, "activation": "relu"},
                                        {"type": "dense", "units": 2, "activation": "softmax"}]},
                      dataset={"name": dataset, "validation_split": 0.25},
                      pipeline={"batch_size": 8, "shuffle": True, "normalize": True},
                      epochs=3, log_every_steps=2)
    team_job = submit(k, second, token=tokens.get("team-a"))
    k.wait_state(team_job, {"SUCCEEDED", "FAILED"})
    jobs.append(team_job)

    if version >= 2:  # :cancel came with schema 2
        long_job = submit(k, dict(TINY_MNIST, display_name="fixture-cancelled", epochs=50))
        k.wait_state(long_job, {"RUNNING"})
        status, doc = k.call("POST", "/v1/jobs/%s:cancel" % long_job, {})
        if status != 200:
            raise RuntimeError("cancel: %d %s" % (status, doc))
        k.wait_state(long_job, {"CANCELLED", "FAILED", "SUCCEEDED"})
        jobs.append(long_job)

    if version >= 4:  # pinned checkpoints
        status, doc = k.call("GET", "/v1/jobs/%s/checkpoints" % mnist)
        first = doc["checkpoints"][0]
        status, doc = k.call("POST", "/v1/jobs/%s/checkpoints/%s:pin" % (mnist, first["id"]), {})
        if status != 200:
            raise RuntimeError("pin: %d %s" % (status, doc))

    rc = k.stop()
    if rc != 0:
        sys.exit("the old kilnd exited %d on SIGTERM:\n%s" %
                 (rc, open(os.path.join(work, "kilnd.log")).read()))
    db_path = os.path.join(data, "kiln.db")
    got = schema_version(db_path)
    if got != version:
        sys.exit("the data directory has schema version %s, not %d" % (got, version))

    manifest = {"schema_version": version, "commit": commit, "data_dir": data, "tokens": tokens, "jobs": [],
                "datasets": []}
    with sqlite3.connect(db_path) as db:
        db.row_factory = sqlite3.Row
        cols = {r["name"] for r in db.execute("PRAGMA table_info(checkpoints)")}
        for job_id in jobs:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            job = {"id": job_id, "state": row["state"], "display_name": row["display_name"],
                   "tenant": row["tenant"] if "tenant" in row.keys() else "default",
                   "metrics": [[m["attempt"], m["step"], m["name"], m["value"]] for m in
                               db.execute("SELECT * FROM metrics WHERE job_id = ? "
                                          "ORDER BY seq", (job_id,))],
                   "checkpoints": []}
            for c in db.execute("SELECT * FROM checkpoints WHERE job_id = ? ORDER BY id",
                                (job_id,)):
                job["checkpoints"].append({
                    "step": c["step"], "bytes": c["bytes"], "sha256": c["sha256"],
                    "file": os.path.relpath(c["path"], data),
                    "pinned": bool(c["pinned"]) if "pinned" in cols else False})
            manifest["jobs"].append(job)
        if dataset:
            d = db.execute("SELECT * FROM datasets WHERE id = ?", (dataset,)).fetchone()
            manifest["datasets"].append({"id": d["id"], "sha256": d["sha256"],
                                         "bytes": d["bytes"], "examples": d["examples"],
                                         "file": os.path.relpath(d["path"], data)})
    # fold the WAL into kiln.db, so the fixture is that one file
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    for extra in ("kiln.db-wal", "kiln.db-shm"):
        p = os.path.join(data, extra)
        if os.path.exists(p) and (extra.endswith("shm") or os.path.getsize(p) == 0):
            os.unlink(p)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    shutil.copytree(data, os.path.join(out, "data"), symlinks=True)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    shutil.rmtree(work)
    print("schema %d: %d jobs (%s), %d checkpoints, %d metric points, %d data sets" % (
        version, len(manifest["jobs"]), ", ".join(j["state"] for j in manifest["jobs"]),
        sum(len(j["checkpoints"]) for j in manifest["jobs"]),
        sum(len(j["metrics"]) for j in manifest["jobs"]), len(manifest["datasets"])))


if __name__ == "__main__":
    main()
