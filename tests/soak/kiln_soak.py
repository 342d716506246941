#!/usr/bin/env python3
"""kiln_soak.py — a real kilnd on loopback under churn, and the crash matrix.

  kiln_soak.py soak  --kilnd K --trainer T [--seconds 120] [--seed 1]
  kiln_soak.py crash --kilnd K --trainer T [--kills 20] [--seed 1]

soak: jobs created, cancelled and deleted, metric streams and :wait clients
that connect and vanish, data set uploads, and preemptions (kilnd
--preempt, two device slots, priorities 0..100), for --seconds. kilnd's
RSS, open files and threads are sampled every 2 s; at the end the last
quarter's medians must stay within bounds of the first quarter's, every
job created and not deleted must exist and reach a final state, and each
job's state must agree with its events.

crash: jobs that train, checkpoint and are preempted, and uploads, while
kilnd is SIGKILLed --kills times at seeded random moments and restarted on
the same data folder. After each restart no job may be lost; at the end
every job reaches a final state (none stuck), every checkpoint row names a
file whose bytes and sha256 agree, and each attempt's metric steps rise
without gaps or repeats.

The real kiln-train trains a small MLP on uploaded CSV data. Prints the
figures and 'N passed, N failed'; exits 0 only when every check passed.
Bounded: loopback only, everything under a temporary folder that is
removed, kilnd and its trainers stopped at the end.
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
LOG_EVERY = 5  # log_every_steps of every job: the metric step spacing


class Kilnd:
    """One kilnd process on a data folder, on a free loopback port."""

    def __init__(self, kilnd, trainer, data_dir, pools_file):
        self.kilnd, self.trainer, self.data_dir, self.pools_file = kilnd, trainer, data_dir, pools_file
        self.proc = None
        self.base = None
        self.token = None

    def start(self):
        port_file = os.path.join(self.data_dir, "port")
        if os.path.exists(port_file):
            os.remove(port_file)
        log = open(os.path.join(self.data_dir, "kilnd.log"), "ab")
        self.proc = subprocess.Popen(
            [self.kilnd, "--listen", "127.0.0.1:0", "--port-file", port_file, "--data-dir",
             self.data_dir, "--trainer", self.trainer, "--preempt", "--pools", self.pools_file],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("kilnd exited with %s; see %s/kilnd.log" %
                                   (self.proc.returncode, self.data_dir))
            try:
                with open(port_file) as f:
                    port = int(f.read().strip())
                with open(os.path.join(self.data_dir, "admin.token")) as f:
                    self.token = f.read().strip()
                self.base = "http://127.0.0.1:%d" % port
                if self.request("GET", "/healthz")[0] == 200:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError("kilnd did not serve within 30 s")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def request(self, method, path, body=None, timeout=10, content_type="application/json",
                headers=None):
        """(status, parsed JSON or None); status 0 when no answer came."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self.token)
        if data is not None:
            req.add_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw
        except (OSError, ValueError):
            return 0, None

    def vanish(self, path, method, linger_s):
        """Connects, sends a request, reads for linger_s, then drops the socket."""
        port = int(self.base.rsplit(":", 1)[1])
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        try:
            s.sendall(("%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                       "Content-Length: 0\r\n\r\n" % (method, path, self.token)).encode())
            s.settimeout(0.2)
            end = time.time() + linger_s
            while time.time() < end:
                try:
                    if not s.recv(4096):
                        break
                except socket.timeout:
                    pass
        finally:
            s.close()

    def sample(self):
        """kilnd's (RSS in KiB, open files, threads)."""
        pid = self.proc.pid
        rss = 0
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        return rss, len(os.listdir("/proc/%d/fd" % pid)), len(os.listdir("/proc/%d/task" % pid))


def csv_bytes(rng, rows=240):
    lines = ["a,b,c,label"]
    for _ in range(rows):
        label = rng.randrange(3)
        feats = [rng.gauss(1.5 if i == label else 0.0, 0.5) for i in range(3)]
        lines.append("%.4f,%.4f,%.4f,%d" % (*feats, label))
    return ("\n".join(lines) + "\n").encode()


def upload(k, rng, timeout=30):
    st, body = k.request("POST", "/v1/datasets?format=csv&label_column=label&display_name=soak",
                         csv_bytes(rng), timeout=timeout, content_type="text/csv")
    return body["id"] if st in (200, 201) and isinstance(body, dict) else None


def spec(dataset, rng, epochs, priority, units=16):
    return {
        "display_name": "soak",
        "model": {"input_shape": [3],
                  "layers": [{"type": "dense", "units": units, "activation": "relu"},
                             {"type": "dense", "units": units, "activation": "relu"},
                             {"type": "dense", "units": 3}]},
        "loss": "sparse_categorical_crossentropy",
        "metrics": ["accuracy"],
        "dataset": {"name": dataset, "validation_split": 0.2},
        "pipeline": {"batch_size": 8, "shuffle": True},
        "optimizer": {"type": "adam", "learning_rate": 0.01},
        "epochs": epochs,
        "seed": rng.randrange(1000),
        "priority": priority,
        "log_every_steps": LOG_EVERY,
        "checkpoint": {"every_steps": 20, "keep_last": 3},
        "resources": {"device_type": "cpu", "devices": 1},
    }


def preemptions(k, job):
    st, body = k.request("GET", "/v1/jobs/%s/events" % job, timeout=30)
    return sum(e["to_state"] == "PREEMPTED" for e in body["events"]) if st == 200 else 0


def all_jobs(k):
    ids, token = {}, ""
    while True:
        st, body = k.request("GET", "/v1/jobs?page_size=1000&page_token=" + token, timeout=30)
        if st != 200:
            raise RuntimeError("GET /v1/jobs answered %s" % st)
        for j in body["jobs"]:
            ids[j["id"]] = j
        token = body.get("next_page_token", "")
        if not token:
            return ids


class Checks:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print("%s: %s" % ("ok" if ok else "FAILED", what), flush=True)
        return ok


def wait_final(k, ids, limit_s):
    """Waits until every job in ids is final; the ones that are not."""
    deadline = time.time() + limit_s
    while True:
        jobs = all_jobs(k)
        open_ids = [i for i in ids if i in jobs and jobs[i]["state"] not in TERMINAL]
        if not open_ids or time.time() > deadline:
            return open_ids, jobs
        time.sleep(0.5)


def wait_states(k, ids, states, limit_s):
    """Waits until every job in ids is in one of states; whether they came."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        jobs = all_jobs(k)
        if all(i in jobs and jobs[i]["state"] in states for i in ids):
            return True
        time.sleep(0.2)
    return False


def events_agree(k, job):
    st, body = k.request("GET", "/v1/jobs/%s/events" % job["id"], timeout=30)
    if st != 200:
        return "events answered %s" % st
    ev = body["events"]
    if not ev:
        return "no events"
    for a, b in zip(ev, ev[1:]):
        if b["from_state"] != a["to_state"]:
            return "event chain breaks: %s -> %s then %s -> %s" % (
                a["from_state"], a["to_state"], b["from_state"], b["to_state"])
    if ev[-1]["to_state"] != job["state"]:
        return "state %s, last event to %s" % (job["state"], ev[-1]["to_state"])
    return None


def checkpoints_match(k, data_dir, job_id):
    """Problems with the job's checkpoint rows (kiln.db, as the API's list
    answers them) against the files; and the counts of rows and of files no
    row names."""
    st, body = k.request("GET", "/v1/jobs/%s/checkpoints" % job_id, timeout=30)
    if st != 200:
        return ["checkpoints answered %s" % st], 0, 0
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(data_dir, "kiln.db"), uri=True,
                         timeout=30)
    rows = {r[0]: r[1:] for r in db.execute(
        "SELECT id, step, path, bytes, sha256 FROM checkpoints WHERE job_id = ?", (job_id,))}
    db.close()
    bad = []
    if sorted(rows) != sorted(c["id"] for c in body["checkpoints"]):
        bad.append("the API lists checkpoints %s, the rows are %s" % (
            sorted(c["id"] for c in body["checkpoints"]), sorted(rows)))
    for step, path, size, sha in rows.values():
        path = path if os.path.isabs(path) else os.path.join(data_dir, path)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            bad.append("step %d: %s" % (step, e))
            continue
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            bad.append("step %d: %s holds %d bytes, sha256 %s; the row says %d, %s" % (
                step, path, len(data), hashlib.sha256(data).hexdigest()[:12], size, sha[:12]))
    # Files no row names (a kill between a file's rename and its row): a
    # figure, not a failure; retention only removes what rows name.
    named = {os.path.basename(r[1]) for r in rows.values()}
    folder = os.path.join(data_dir, "jobs", job_id, "checkpoints")
    extra = [f for f in (os.listdir(folder) if os.path.isdir(folder) else [])
             if f.endswith(".safetensors") and f not in named]
    return bad, len(rows), len(extra)


def metrics_contiguous(k, job_id):
    st, body = k.request("GET", "/v1/jobs/%s/metrics?name=loss" % job_id, timeout=30)
    if st != 200:
        return "metrics answered %s" % st
    by_attempt = {}
    for p in body["metrics"]:
        by_attempt.setdefault(p["attempt"], []).append(p["step"])
    for attempt, steps in by_attempt.items():
        for a, b in zip(steps, steps[1:]):
            if b <= a or b - a > LOG_EVERY:
                return "attempt %d: step %d then %d" % (attempt, a, b)
    return None


def pools_file(tmp):
    path = os.path.join(tmp, "pools.json")
    with open(path, "w") as f:
        json.dump({"pools": [{"name": "default", "device_type": "cpu", "devices": [0, 1]}]}, f)
    return path


# ---------------------------------------------------------------- soak --


def soak(args, tmp):
    rng = random.Random(args.seed)
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    k = Kilnd(args.kilnd, args.trainer, data_dir, pools_file(tmp))
    k.start()
    checks = Checks()
    datasets = [upload(k, rng)]
    if not checks.check(datasets[0] is not None, "a CSV data set uploads"):
        return checks
    created, deleted, lock = [], set(), threading.Lock()
    counts = {"created": 0, "cancelled": 0, "deleted": 0, "streams": 0, "waits": 0,
              "uploads": 1, "dataset_deletes": 0, "preempted": 0}
    # One preemption for certain before the random load (which brings a few
    # more, or none): two long priority-0 jobs hold both devices, a
    # priority-100 job arrives. The trio then joins the load.
    trio = []
    for epochs, priority in ((150, 0), (150, 0), (2, 100)):
        if priority == 100:
            running = wait_states(k, trio, ("RUNNING",), 60)
            checks.check(running, "two priority-0 jobs run on the pool's two devices")
        st, body = k.request("POST", "/v1/jobs", spec(datasets[0], rng, epochs, priority))
        if st not in (200, 201):
            checks.check(False, "create answered %s: %s" % (st, body))
            return checks
        trio.append(body["id"])
    deadline = time.time() + 60
    while time.time() < deadline and not any(preemptions(k, j) for j in trio[:2]):
        time.sleep(0.2)
    checks.check(any(preemptions(k, j) for j in trio[:2]),
                 "a priority-100 job preempts a priority-0 one")
    created += trio
    counts["created"] += len(trio)
    stop = threading.Event()
    samples = []
    t0 = time.time()
    end = t0 + args.seconds

    def sampler():
        while not stop.is_set():
            samples.append((time.time() - t0,) + k.sample())
            stop.wait(2)

    def vanishing_clients(seed):
        r = random.Random(seed)
        while not stop.is_set():
            with lock:
                ids = list(created[-20:])
            if not ids:
                time.sleep(0.1)
                continue
            j = r.choice(ids)
            try:
                if r.random() < 0.5:
                    k.vanish("/v1/jobs/%s/metrics:watch" % j, "GET", r.uniform(0.05, 1.5))
                    counts["streams"] += 1
                else:
                    k.vanish("/v1/jobs/%s:wait?timeout=30s" % j, "POST", r.uniform(0.05, 1.0))
                    counts["waits"] += 1
            except OSError:
                pass

    threads = [threading.Thread(target=sampler)]
    threads += [threading.Thread(target=vanishing_clients, args=(args.seed * 10 + i,))
                for i in range(3)]
    for t in threads:
        t.start()
    next_upload = time.time() + 10
    while time.time() < end:
        r = rng.random()
        if r < 0.45:
            epochs = rng.choice([2, 10, 150])
            st, body = k.request("POST", "/v1/jobs", spec(rng.choice(datasets), rng, epochs,
                                                          rng.randrange(101)))
            if st in (200, 201):
                with lock:
                    created.append(body["id"])
                counts["created"] += 1
            else:
                checks.check(False, "create answered %s: %s" % (st, body))
        elif r < 0.65 and created:
            st, _ = k.request("POST", "/v1/jobs/%s:cancel" % rng.choice(created[-6:]))
            counts["cancelled"] += st == 200
        elif r < 0.85 and created:
            j = rng.choice(created[:-5] or created)
            # A deleted job takes its events along: count its preemptions first.
            n_pre = preemptions(k, j)
            st, _ = k.request("DELETE", "/v1/jobs/%s" % j)
            if st == 200:
                with lock:
                    deleted.add(j)
                    created.remove(j)
                counts["deleted"] += 1
                counts["preempted"] += n_pre
        if time.time() > next_upload:
            d = upload(k, rng)
            if d:
                datasets.append(d)
                counts["uploads"] += 1
            if len(datasets) > 3:
                st, _ = k.request("DELETE", "/v1/datasets/%s" % datasets[0])
                if st == 200:
                    datasets.pop(0)
                    counts["dataset_deletes"] += 1
            next_upload = time.time() + 10
        time.sleep(rng.uniform(0.05, 0.3))
    stop.set()
    for t in threads:
        t.join()

    # Drain: cancel what is left, then every job must be final.
    for j in list(created):
        k.request("POST", "/v1/jobs/%s:cancel" % j)
    stuck, jobs = wait_final(k, created, 120)
    lost = [j for j in created if j not in jobs]
    checks.check(not lost, "no job lost: %d created and kept, %d missing %s" % (
        len(created), len(lost), lost[:5]))
    checks.check(not stuck, "every job reached a final state (%d not: %s)" % (len(stuck), stuck[:5]))
    back = [j for j in deleted if j in jobs]
    checks.check(not back, "deleted jobs stay deleted (%d back)" % len(back))
    disagree = []
    for j in created:
        if j in jobs:
            why = events_agree(k, jobs[j])
            if why:
                disagree.append("%s: %s" % (j, why))
            counts["preempted"] += preemptions(k, j)
    checks.check(not disagree, "every job's state agrees with its events (%d disagree: %s)" % (
        len(disagree), disagree[:3]))

    # Flatness, over the load's samples: the last quarter against the first
    # (after 10% warm-up).
    n = len(samples)
    warm = max(1, n // 10)
    q = max(1, (n - warm) // 4)
    first, last = samples[warm:warm + q], samples[-q:]
    med = lambda rows, i: statistics.median(r[i] for r in rows)
    rss0, rss1 = med(first, 1), med(last, 1)
    fd0, fd1 = med(first, 2), med(last, 2)
    th0, th1 = med(first, 3), med(last, 3)
    print("samples: %d over %.0f s; RSS KiB first-quarter median %d, last %d (max %d); "
          "open files %d -> %d (max %d); threads %d -> %d (max %d)" % (
              n, args.seconds, rss0, rss1, max(r[1] for r in samples), fd0, fd1,
              max(r[2] for r in samples), th0, th1, max(r[3] for r in samples)))
    print("load: %s" % ", ".join("%s %d" % kv for kv in counts.items()))
    checks.check(rss1 <= rss0 * 1.25 + 4096, "RSS flat: %d KiB -> %d KiB (bound +25%% +4 MiB)" %
                 (rss0, rss1))
    checks.check(fd1 <= fd0 + 8, "open files flat: %d -> %d (bound +8)" % (fd0, fd1))
    checks.check(th1 <= th0 + 8, "threads flat: %d -> %d (bound +8)" % (th0, th1))
    with open(os.path.join(data_dir, "kilnd.log"), errors="replace") as f:
        passes = sum('msg="preempting"' in line for line in f)
    checks.check(counts["preempted"] > 0, "preemptions happened (%d; kilnd logged %d preempting "
                 "passes)" % (counts["preempted"], passes))
    k.stop()
    return checks


# --------------------------------------------------------- crash matrix --


def crash(args, tmp):
    rng = random.Random(args.seed)
    data_dir = os.path.join(tmp, "data")
    os.makedirs(data_dir)
    k = Kilnd(args.kilnd, args.trainer, data_dir, pools_file(tmp))
    k.start()
    checks = Checks()
    datasets = [upload(k, rng)]
    if not checks.check(datasets[0] is not None, "a CSV data set uploads"):
        return checks
    created = []
    lost_total = 0
    during = {"kills with jobs running": 0, "jobs running at a kill": 0,
              "kills during an upload": 0, "preemptions": 0, "restarts after a kill": 0}
    t_start = time.time()
    for kill in range(args.kills):
        # Work in flight: a few jobs (high priorities preempt the rest), an
        # upload that the kill may cut.
        for _ in range(rng.randrange(1, 4)):
            st, body = k.request("POST", "/v1/jobs", spec(rng.choice(datasets), rng,
                                                          rng.choice([20, 80]),
                                                          rng.choice([0, 10, 50]),
                                                          units=384))
            if st in (200, 201):
                created.append(body["id"])
        # Kill while something trains: wait for a running job, then a
        # random moment of its training (steps, checkpoints, a preemption).
        deadline = time.time() + 10
        while time.time() < deadline and not any(
                j["state"] == "RUNNING" for j in all_jobs(k).values()):
            time.sleep(0.05)
        if rng.random() < 0.5:  # a job that outranks what runs: a preemption
            st, body = k.request("POST", "/v1/jobs", spec(datasets[0], rng, 20, 100, units=384))
            if st in (200, 201):
                created.append(body["id"])
        time.sleep(rng.uniform(0.1, 2.0))
        up_rng = random.Random(rng.random())  # its own stream: the thread races the loop
        up = threading.Thread(
            target=lambda: datasets.append(upload(k, up_rng, timeout=5) or datasets[0]))
        if rng.random() < 0.5:  # and half the time just after an upload began
            up.start()
            time.sleep(rng.uniform(0.0, 0.3))
        running = sum(j["state"] == "RUNNING" for j in all_jobs(k).values())
        uploading = up.is_alive()
        k.kill()
        if up.is_alive() or up.ident:
            up.join()
        during["kills with jobs running"] += running > 0
        during["jobs running at a kill"] += running
        during["kills during an upload"] += uploading
        k.start()
        jobs = all_jobs(k)
        lost = [j for j in created if j not in jobs]
        lost_total += len(lost)
        checks.check(not lost, "kill %d: after the restart all %d jobs exist (%d lost)" % (
            kill + 1, len(created), len(lost)))
    stuck, jobs = wait_final(k, created, 300)
    checks.check(not stuck, "no job stuck: every one of %d reached a final state (%d not: %s)" % (
        len(created), len(stuck), stuck[:5]))
    states = {}
    bad_ckpt, n_ckpt, n_extra, gaps, disagree, attempts = [], 0, 0, [], [], 0
    for j in created:
        job = jobs.get(j)
        if not job:
            continue
        states[job["state"]] = states.get(job["state"], 0) + 1
        attempts += job.get("attempt", 1)
        bad, n, extra = checkpoints_match(k, data_dir, j)
        bad_ckpt += ["%s %s" % (j, b) for b in bad]
        n_ckpt += n
        n_extra += extra
        why = metrics_contiguous(k, j)
        if why:
            gaps.append("%s: %s" % (j, why))
        why = events_agree(k, job)
        if why:
            disagree.append("%s: %s" % (j, why))
        st, body = k.request("GET", "/v1/jobs/%s/events" % j, timeout=30)
        for e in body["events"] if st == 200 else []:
            during["preemptions"] += e["to_state"] == "PREEMPTED"
            during["restarts after a kill"] += e["reason"] == "SERVER_RESTARTED"
    checks.check(not bad_ckpt, "checkpoint rows equal the files: %d rows, %d differ %s" % (
        n_ckpt, len(bad_ckpt), bad_ckpt[:3]))
    checks.check(not gaps, "metrics contiguous per attempt (%d jobs break: %s)" % (
        len(gaps), gaps[:3]))
    checks.check(not disagree, "every job's state agrees with its events (%d disagree: %s)" % (
        len(disagree), disagree[:3]))
    print("crash matrix: %d SIGKILLs in %.0f s, %d jobs (%s), %d attempts, %d checkpoint rows "
          "(%d files without a row), %d jobs lost" % (
              args.kills, time.time() - t_start, len(created),
              ", ".join("%s %d" % kv for kv in sorted(states.items())), attempts, n_ckpt, n_extra,
              lost_total))
    print("during: %s" % ", ".join("%s %d" % kv for kv in during.items()))
    k.stop()
    return checks


def stop_leftovers(tmp):
    """Kills, by pid, any process still running from this run's folder (a
    trainer a killed kilnd left behind)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if tmp.encode() in cmdline:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["soak", "crash"])
    ap.add_argument("--kilnd", required=True)
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kiln-%s-" % args.mode)
    checks = Checks()
    try:
        checks = soak(args, tmp) if args.mode == "soak" else crash(args, tmp)
    except Exception as e:  # a broken run is a failure with its reason
        checks.check(False, "the %s run broke: %s" % (args.mode, e))
    finally:
        stop_leftovers(tmp)
        if args.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (checks.passed, checks.failed))
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
