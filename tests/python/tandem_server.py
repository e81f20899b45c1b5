"""`tandem serve` for Python tests: a free port, a data dir, stderr in a log file, direct API calls.

Used by test_art.py and the reliability suite (tests/reliability/). Standard library only.
"""

import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

# Temporary directories a suite made (`scratch`): removed by `finish` when the suite passes, kept
# after a failure for its logs. Without it every run left ~2 GB of servers' data under /tmp.
_SCRATCH = []


def scratch(prefix="tandem-"):
    """A new temporary directory that `finish(0)` removes."""
    path = tempfile.mkdtemp(prefix=prefix)
    _SCRATCH.append(path)
    return path


def finish(code):
    """Exits with `code`, first removing the suite's scratch directories when it is 0."""
    if not code:
        for path in _SCRATCH:
            shutil.rmtree(path, ignore_errors=True)
    sys.exit(code)


class Server:
    """Starts `binary serve` with `--api-key key` on a free port. `data` may name an existing data
    dir (a restart); by default a new temporary one is made. The log goes to `log_dir` when given
    (a data dir that fills up), else into the data dir."""

    def __init__(self, binary, model_path, key, extra=(), data=None, prefix="tandem-", log_dir=None):
        self.binary, self.model_path, self.key, self.extra = binary, model_path, key, list(extra)
        self.data = data or scratch(prefix)
        self.log_dir = log_dir
        self.log_path = os.path.join(log_dir or self.data, "server.log")
        self.log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [binary, "serve", "--port", "0", "--data-dir", self.data, "--model", model_path, "--api-key", key,
             *self.extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "TANDEM_LOG": os.environ.get("TANDEM_TEST_LOG", "warn")},
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
        return Server(self.binary, self.model_path, self.key, self.extra, data=self.data, log_dir=self.log_dir)

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
        """(status, parsed JSON, text or, for an archive or a file, bytes, response headers) of a direct request."""
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
        if hdrs.get("content-type", "").startswith(("application/x-tar", "application/octet-stream")):
            return status, raw, hdrs
        try:
            return status, json.loads(raw), hdrs
        except ValueError:
            return status, raw.decode(errors="replace"), hdrs

    def new_key(self, entity):
        """A key of another entity, made with `tandem keys create` against the same store."""
        db = self.extra[self.extra.index("--database-url"):][:2] if "--database-url" in self.extra else []
        out = subprocess.run([self.binary, "keys", "create", "--entity", entity, "--data-dir", self.data, *db],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip().splitlines()[-1].strip()


class PrivatePostgres:
    """A PostgreSQL server of a test's own (initdb in a temporary directory, a free port), so
    that stopping it disturbs nothing else on the machine. `settings` are lines added to its
    postgresql.conf and `hba`, when given, replaces its pg_hba.conf, both before it first starts.
    Used by the reliability suite's R15 and by test_postgres_ops.py."""

    def __init__(self, settings=(), hba=None):
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        found = shutil.which("pg_ctl") or (bins[-1] if bins else None)
        if not found:
            raise NotImplementedError("no PostgreSQL server binaries (pg_ctl) on this machine")
        self.bin = os.path.dirname(found)
        self.root = scratch("tandem-pg-")
        self.data, self.port = os.path.join(self.root, "data"), free_port()
        # PostgreSQL refuses to run as root: then it runs as the postgres user.
        self.prefix = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")
        if settings:
            with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
                f.write("".join(f"{line}\n" for line in settings))
        if hba is not None:
            with open(os.path.join(self.data, "pg_hba.conf"), "w") as f:
                f.write(hba)
        self.start()

    def _run(self, tool, *args):
        # From `/`: the postgres user may not enter the caller's directory (CI's clone is private).
        subprocess.run([*self.prefix, os.path.join(self.bin, tool), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")

    @property
    def url(self):
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def start(self):
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run("pg_ctl", "-D", self.data, "-o", opts, "-l", os.path.join(self.root, "log"), "-w", "start")

    def stop(self, mode="fast"):
        # `fast`: what a restart by an operator or a failover does (sessions are ended);
        # `immediate`: a crash.
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def psql(self, *args):
        """psql as the superuser over the server's socket."""
        return [*self.prefix, "psql", "-h", self.root, "-p", str(self.port), "-U", "postgres",
                *args]

    def close(self):
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def run_checks(suite, checks, binary, model_path, key, make_client, extra=(), data=None):
    """Starts a server (with `extra` flags, in the data dir `data` if given), runs each `check(client)` (or `check(client, server)`
    for checks that take two arguments) against `make_client(server)`, prints
    '<suite>: N passed, M failed', and returns the exit code (1 on any failure). TANDEM_CHECKS=a,b
    runs only the checks so named (while working on them; `make test` runs them all)."""
    import traceback

    only = [c for c in os.environ.get("TANDEM_CHECKS", "").split(",") if c]
    if only:
        checks = [fn for fn in checks if fn.__name__ in only]

    server = Server(binary, model_path, key, extra, data=data)
    try:
        client = make_client(server)
        passed = failed = 0
        for fn in checks:
            try:
                fn(client, server) if fn.__code__.co_argcount == 2 else fn(client)
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


def rl_step(server, model_id, question, seed, base="HuggingFaceTB/SmolLM2-135M-Instruct", key=None,
            must_succeed=True):
    """One real RL step for the model (as `key`'s entity): two answers to `question` sampled from
    `base`, rewarded 0 and 1, trained as one group; waits for the job to end (to succeed, unless
    `must_succeed` is false) and returns it."""
    messages = [{"role": "user", "content": question}]
    status, r, _ = server.api("POST", "/v1/chat/completions",
                              {"model": base, "messages": messages, "n": 2, "temperature": 1.0, "max_tokens": 16,
                               "seed": seed, "logprobs": True, "return_token_ids": True}, key=key)
    assert status == 200, r
    trajectories = [{"messages_and_choices": messages + [c], "reward": float(i)} for i, c in enumerate(r["choices"])]
    status, job, _ = server.api("POST", "/v1/preview/training-jobs",
                                {"model_id": model_id, "trajectory_groups": [{"trajectories": trajectories}]}, key=key)
    assert status == 200, job
    deadline = time.monotonic() + 300
    while job["status"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
        _, job, _ = server.api("GET", f"/v1/preview/training-jobs/{job['id']}", key=key)
    assert job["status"] == "succeeded" or not must_succeed, job
    return job


def trained_step(server, base="HuggingFaceTB/SmolLM2-135M-Instruct"):
    """A real trained checkpoint, made once per server: model `sdk/trained` after one RL step on
    two sampled answers rewarded 0 and 1. Returns (its address `wandb-artifact:///{entity}/sdk/
    trained:step1`, the model id)."""
    if getattr(server, "trained", None):
        return server.trained
    status, model, _ = server.api("POST", "/v1/preview/models",
                                  {"project": "sdk", "name": "trained", "base_model": base, "return_existing": True})
    assert status == 200, model
    rl_step(server, model["id"], "Is the sky blue? Answer yes or no.", seed=3, base=base)
    server.trained = (f"wandb-artifact:///{model['entity']}/sdk/trained:step1", model["id"])
    return server.trained


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(python, bucket):
    """moto's S3 server (in the virtualenv of `python`) on a free port, with `bucket`: (process, port)."""
    port = free_port()
    proc = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            # moto does not check signatures: an unsigned PUT makes the bucket.
            urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/{bucket}", method="PUT"),
                                   timeout=2)
            return proc, port
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto's S3 server did not start")
            time.sleep(0.2)
