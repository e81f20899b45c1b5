"""`tandem serve` for Python tests: a free port, a data dir, stderr in a log file, direct API calls.

Used by test_art.py and the reliability suite (tests/reliability/). Standard library only.
"""

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request


class Server:
    """Starts `binary serve` with `--api-key key` on a free port. `data` may name an existing data
    dir (a restart); by default a new temporary one is made."""

    def __init__(self, binary, model_path, key, extra=(), data=None, prefix="tandem-"):
        self.binary, self.model_path, self.key, self.extra = binary, model_path, key, list(extra)
        self.data = data or tempfile.mkdtemp(prefix=prefix)
        self.log_path = os.path.join(self.data, "server.log")
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [binary, "serve", "--port", "0", "--data-dir", self.data, "--model", model_path, "--api-key", key,
             *self.extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env={**os.environ, "TANDEM_LOG": "warn"},
        )
        found = []

        def read_stdout():  # keep draining stdout so the server never blocks on a full pipe
            for line in self.proc.stdout:
                if not found and line.startswith("tandem listening on "):
                    found.append(line.split()[-1])

        threading.Thread(target=read_stdout, daemon=True).start()
        deadline = time.monotonic() + 120
        while not found and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not found:
            self.stop()
            raise RuntimeError(f"server did not start; its log:\n{self.log_tail()}")
        self.url = found[0].rstrip("/")
        self.host, self.port = self.url.split("//")[1].split(":")
        self.port = int(self.port)

    def restart(self):
        """The same data dir and flags, a new process (and port)."""
        return Server(self.binary, self.model_path, self.key, self.extra, data=self.data)

    def log_tail(self, lines=40):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def kill9(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()

    def stop(self):
        self.kill9()

    def api(self, method, path, body=None, key=None, timeout=300, raw_body=None, headers=None):
        """(status, parsed JSON or text, response headers) of a direct request."""
        data = raw_body if raw_body is not None else (None if body is None else json.dumps(body).encode())
        h = {"Content-Type": "application/json"}
        if key is not False:
            h["Authorization"] = f"Bearer {key or self.key}"
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw, hdrs = r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            status, raw, hdrs = e.code, e.read(), e.headers
        try:
            return status, json.loads(raw), hdrs
        except ValueError:
            return status, raw.decode(errors="replace"), hdrs

    def new_key(self, entity):
        """A key of another entity, made with `tandem keys create` against the same data dir."""
        out = subprocess.run([self.binary, "keys", "create", "--entity", entity, "--data-dir", self.data],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip().splitlines()[-1].strip()


def run_checks(suite, checks, binary, model_path, key, make_client):
    """Starts a server, runs each `check(client)` against `make_client(server)`, prints
    '<suite>: N passed, M failed', and returns the exit code (1 on any failure)."""
    import traceback

    server = Server(binary, model_path, key)
    try:
        client = make_client(server)
        passed = failed = 0
        for fn in checks:
            try:
                fn(client)
                passed += 1
                print(f"ok   {fn.__name__}")
            except Exception:
                failed += 1
                print(f"FAIL {fn.__name__}")
                traceback.print_exc()
        print(f"{suite}: {passed} passed, {failed} failed")
        return 1 if failed else 0
    finally:
        server.stop()
