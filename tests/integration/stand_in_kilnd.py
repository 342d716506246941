#!/usr/bin/env python3
"""A stand-in for kilnd's side of the agent contract, for kiln-agent's own
tests: the /v1/agents routes (register, long-poll commands, :done) and the
/v1/allocations routes (progress, checkpoints, data set, resume, exit,
relay), every request recorded in order. The test drives it through
/test/queue (a command for an agent by name), /test/lose (mark an agent
LOST), /test/end (end an allocation: its routes answer 403) and reads
/test/state. Loopback or a test's own network namespace only.
Usage: stand_in_kilnd.py HOST PORT AGENT_TOKEN DIR"""
import hashlib
import io
import json
import os
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

HOST, PORT, AGENT_TOKEN, DIR = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
lock = threading.Condition()
agents = {}  # name -> {"id", "body", "state", "commands": [..], "done": {seq: body}, "registrations"}
allocs = {}  # alloc -> {"token", "ended", "relays": {id: {...}}}
events = []  # everything in order: ("progress", line) ("checkpoint", step, file) ("exit", body) ...


def record(*what):
    with lock:
        events.append(list(what))
        lock.notify_all()


def dataset_tar():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = b"stand-in data set\n"
        info = tarfile.TarInfo("toy/records.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


DATASET = dataset_tar()
DATASET_SHA = hashlib.sha256(DATASET).hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, body=None, headers=None, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def error(self, status, message):
        self.reply(status, {"error": {"code": status, "message": message}})

    def body(self):
        n = int(self.headers.get("Content-Length", "0"))
        return self.rfile.read(n) if n else b""

    def token(self):
        h = self.headers.get("Authorization", "")
        return h[7:] if h.startswith("Bearer ") else ""

    def alloc_auth(self, alloc):
        a = allocs.get(alloc)
        if not a or self.token() != a["token"]:
            self.error(401, "bad allocation token")
            return None
        if a["ended"]:
            self.error(403, "allocation %s has ended" % alloc)
            return None
        return a

    def route(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        p = url.path.split("/")[1:]
        m = self.command
        if p[0] == "test":
            return self.test_route(m, p[1], json.loads(self.body() or b"{}"))
        if p[:2] == ["v1", "agents"]:
            if self.token() != AGENT_TOKEN:
                record("unauthorized", self.path)
                return self.error(401, "unauthenticated")
            if m == "POST" and len(p) == 2:
                b = json.loads(self.body())
                with lock:
                    a = agents.setdefault(b["name"], {"id": "agent-" + b["name"], "commands": [],
                                                      "done": {}, "registrations": 0})
                    a["body"], a["state"] = b, "ONLINE"
                    a["registrations"] += 1
                    a["last_seen"] = time.time()
                    lock.notify_all()
                record("register", b["name"], b)
                return self.reply(200, {"id": a["id"], "name": b["name"], "next_seq": 1,
                                        "heartbeat_s": 5, "grace_s": 25})
            name = next((n for n, a in agents.items() if a["id"] == p[2]), None)
            if not name:
                return self.error(404, "no agent " + p[2])
            a = agents[name]
            if m == "GET" and p[3] == "commands":
                after = int(q.get("after", ["0"])[0])
                wait = float(q.get("wait", ["30s"])[0].rstrip("s"))
                deadline = time.time() + wait
                with lock:
                    a["last_seen"] = time.time()
                    a["polls"] = a.get("polls", 0) + 1
                    a["last_wait"] = wait
                    while True:
                        if a["state"] == "LOST":
                            return self.reply(200, {"commands": [], "state": "LOST"})
                        cmds = [c for c in a["commands"] if c["seq"] > after]
                        if cmds or time.time() >= deadline:
                            break
                        lock.wait(deadline - time.time())
                return self.reply(200, {"commands": cmds, "state": a["state"]})
            if m == "POST" and p[3] == "commands" and p[4].endswith(":done"):
                seq = int(p[4][:-5])
                b = json.loads(self.body())
                with lock:
                    a["done"].setdefault(seq, b)
                    for al in allocs.values():
                        for r in al["relays"].values():
                            if r["agent"] == name and r["seq"] == seq:
                                r["done"], r["exit_code"] = True, b.get("exit_code", 1)
                    lock.notify_all()
                record("done", name, seq, b)
                return self.reply(200, {})
        if p[:2] == ["v1", "allocations"]:
            alloc = p[2]
            a = self.alloc_auth(alloc)
            if not a:
                self.body()
                return
            what = p[3]
            if m == "POST" and what == "progress":
                for line in self.body().decode().splitlines():
                    record("progress", alloc, line)
                return self.reply(204)
            if m == "PUT" and what == "checkpoints":
                data = self.body()
                sha = q.get("sha256", [""])[0]
                part = q.get("part", [""])[0]
                if hashlib.sha256(data).hexdigest() != sha:
                    return self.error(400, "sha256 does not match the body")
                os.makedirs(os.path.join(DIR, alloc), exist_ok=True)
                path = os.path.join(DIR, alloc, "ckpt-%s.%s" % (p[4], "state" if part else "safetensors"))
                with open(path, "wb") as f:
                    f.write(data)
                record("checkpoint", alloc, int(p[4]), part or "weights", path)
                return self.reply(200, {"path": path, "bytes": len(data), "sha256": sha})
            if m in ("GET", "HEAD") and what == "dataset":
                record("dataset", alloc, m)
                # /test/alloc "corrupt": the archive differs from its announced hash
                raw = DATASET + b"x" if a.get("corrupt") else DATASET
                return self.reply(200, raw=raw, headers={"X-Kiln-Content-Sha256": DATASET_SHA})
            if m == "GET" and what == "resume":
                r = a.get("resume")
                if not r:
                    return self.error(404, "no checkpoint")
                part = q.get("part", [""])[0]
                record("resume", alloc, part or "weights")
                if a.get("slow_resume"):  # the Nth download takes slow_resume[N] s
                    with lock:
                        nth = a["gets"] = a.get("gets", 0) + 1
                    delays = a["slow_resume"]
                    time.sleep(delays[nth - 1] if nth <= len(delays) else 0)
                with open(r[1] if part == "state" else r[0], "rb") as f:
                    data = f.read()
                return self.reply(200, raw=data, headers={"X-Kiln-Step": str(r[2]),
                                                          "X-Kiln-Sha256": hashlib.sha256(data).hexdigest()})
            if m == "POST" and what == "exit":
                record("exit", alloc, json.loads(self.body()))
                return self.reply(204)
            if m == "POST" and what == "relay" and len(p) == 4:
                b = json.loads(self.body())
                if os.path.basename(b["argv"][0]) not in ("orted", "prted"):
                    return self.error(403, "argv[0] must be orted")
                with lock:
                    ag = agents[b["host"]]
                    seq = len(ag["commands"]) + 1
                    rid = "relay-%d" % (sum(len(x["relays"]) for x in allocs.values()) + 1)
                    ag["commands"].append({"seq": seq, "kind": "exec", "alloc": alloc, "relay": rid,
                                           "argv": b["argv"]})
                    a["relays"][rid] = {"agent": b["host"], "seq": seq, "done": False}
                    lock.notify_all()
                record("relay", alloc, b["host"], b["argv"][0])
                return self.reply(200, {"relay": rid})
            if m == "GET" and what == "relay":
                rid = p[4].split(":")[0]
                deadline = time.time() + 30
                with lock:
                    r = a["relays"][rid]
                    while not r["done"] and time.time() < deadline:
                        lock.wait(deadline - time.time())
                    body = {"done": True, "exit_code": r["exit_code"]} if r["done"] else {"done": False}
                return self.reply(200, body)
        return self.error(404, "no route " + self.path)

    def test_route(self, m, what, b):
        with lock:
            if what == "state":
                return self.reply(200, {"agents": agents, "events": events,
                                        "allocs": {k: {x: y for x, y in v.items() if x != "token"}
                                                   for k, v in allocs.items()}})
            if what == "alloc":  # {"alloc","token","resume":[weights,state,step]}
                allocs.setdefault(b["alloc"], {"token": b["token"], "ended": False, "relays": {}})
                if "resume" in b:
                    allocs[b["alloc"]]["resume"] = b["resume"]
                allocs[b["alloc"]]["corrupt"] = b.get("corrupt", False)
                allocs[b["alloc"]]["slow_resume"] = b.get("slow_resume", [])
                return self.reply(200, {})
            if what == "queue":  # {"agent": name, "command": {...}} ; seq given or next
                ag = agents[b["agent"]]
                c = dict(b["command"])
                c.setdefault("seq", len(ag["commands"]) + 1)
                ag["commands"].append(c)
                lock.notify_all()
                return self.reply(200, {"seq": c["seq"]})
            if what == "lose":
                agents[b["agent"]]["state"] = "LOST"
                lock.notify_all()
                return self.reply(200, {})
            if what == "end":
                allocs[b["alloc"]]["ended"] = True
                return self.reply(200, {})
        return self.error(404, "no test route")

    do_GET = do_POST = do_PUT = do_HEAD = route


ThreadingHTTPServer.daemon_threads = True
server = ThreadingHTTPServer((HOST, PORT), Handler)
print("listening", flush=True)
server.serve_forever()
