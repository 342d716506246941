"""kilnd_proc.py: start a kilnd on loopback, talk JSON to it, stop it.

Shared by the schema fixtures' maker (make_fixture.py, run against old
kilnds) and the upgrade test (upgrade_from_fixtures.py, today's kilnd), so
it uses only what every kilnd since the first schema accepts: --listen,
--port-file, --data-dir, --trainer, and a bearer token from
DATA_DIR/admin.token when kilnd wrote one."""

import json
import os
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request


class Kilnd:
    def __init__(self, kilnd, trainer, data_dir, log_path, extra=()):
        self.data_dir = data_dir
        self.port_file = os.path.join(os.path.dirname(os.path.abspath(log_path)),
                                      "kilnd.port")
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [kilnd, "--listen", "127.0.0.1:0", "--port-file", self.port_file,
             "--data-dir", data_dir, "--trainer", trainer, *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        self.token = None

    def wait_ready(self, seconds=30):
        """Waits for the port file; returns False if kilnd exited first."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            if os.path.exists(self.port_file) and open(self.port_file).read().strip():
                self.port = int(open(self.port_file).read().strip())
                # kilnd writes admin.token before it listens; the first
                # schema's kilnd has no tokens at all
                token_path = os.path.join(self.data_dir, "admin.token")
                if os.path.exists(token_path):
                    self.token = open(token_path).read().strip()
                return True
            time.sleep(0.05)
        raise RuntimeError("kilnd did not write its port file in %d s" % seconds)

    def call(self, method, path, body=None, token=None, raw=False,
             content_type="application/json"):
        """Returns (status, parsed JSON or bytes)."""
        data = None
        headers = {}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        token = token or self.token
        if token:
            headers["Authorization"] = "Bearer " + token
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path),
                                     data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                payload = resp.read()
                status = resp.status
        except urllib.error.HTTPError as e:
            payload = e.read()
            status = e.code
        if raw:
            return status, payload
        return status, (json.loads(payload) if payload else None)

    def job(self, job_id):
        status, doc = self.call("GET", "/v1/jobs/" + job_id)
        if status != 200:
            raise RuntimeError("GET job %s: %d %s" % (job_id, status, doc))
        return doc

    def wait_state(self, job_id, states, seconds=300):
        deadline = time.time() + seconds
        while time.time() < deadline:
            doc = self.job(job_id)
            if doc["state"] in states:
                return doc
            time.sleep(0.2)
        raise RuntimeError("job %s still %s after %d s" % (job_id, doc["state"], seconds))

    def stop(self):
        """SIGTERM, as an operator stops it; returns kilnd's exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def schema_version(db_path):
    with sqlite3.connect(db_path) as db:
        return db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
