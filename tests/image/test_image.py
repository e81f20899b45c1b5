#!/usr/bin/env python3
"""Runs tandem's OCI image (`make image`) with Debian's crun or runc and checks what a deployment
relies on.

    python3 tests/image/test_image.py [target/image/oci] [postgres://postgres@127.0.0.1:5432/postgres]

Needs root, umoci and crun or runc (`make test-image` installs them when missing; which one runs:
`runtime()` below), and for check b a PostgreSQL server that lets the admin URL create and drop
the database `tandem_image_test`.

Each container is a bundle made by `umoci unpack` from the image's `latest` tag, with its
config.json changed the way a deployment would: the host's network (no network namespace; the
server listens on a free port through TANDEM_PORT), a host directory owned by uid 10001 bind-mounted
at /data, and for some a read-only root filesystem with a tmpfs at /tmp and no capabilities, as
deploy/k8s's pods run. The checks, in the order they run:

  a. a container starts (seconds to /health 200), lists the model, and chats with the key it wrote
     to /data/api-key on its first start;
  d. SIGTERM (`crun kill ID TERM`, or runc's) while a streamed chat is in flight: the stream still
     ends with [DONE] and the process exits 0 within 60 s (README: SIGTERM stops the server
     gracefully);
  c. a new container from the same image on the same /data (SQLite), with a read-only root, has
     the first one's key, the key `tandem keys create` made inside the first (`crun exec`), and the
     model registered there;
  e. that container's process runs as uid and gid 10001 with no capabilities (/proc/PID/status),
     its root filesystem is mounted read-only (/proc/PID/mountinfo; a write to /usr fails with
     EROFS, /data and /tmp take one), curl inside it reaches /health (the Dockerfile's
     HEALTHCHECK), and a request-supplied chat template renders (the template jail's child
     process) under those limits;
  b. a container on PostgreSQL (read-only root as well) chats, runs one RL step (a trajectory log,
     a training job on two rewarded answers) and chats with the new checkpoint.

Containers and temporary directories are removed even on failure; the database is dropped at the
end. Prints PASS or FAIL with the seconds of each check and 'image: N passed, M failed'.
"""

import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from tandem_server import free_port, rl_step  # noqa: E402

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
UID = 10001
DB_NAME = "tandem_image_test"
START_TIMEOUT = 180


def runtime():
    """The OCI runtime: $TANDEM_IMAGE_RUNTIME if set, else crun where /sys/fs/cgroup is cgroup v2
    alone, else runc. crun 1.8 (bookworm's) refuses a hybrid hierarchy whose v2 part has
    controllers ("cgroups in hybrid mode not supported"), even with its cgroup manager off, and
    these machines have one (hugetlb in v2, the rest in v1); runc 1.1 runs there."""
    if os.environ.get("TANDEM_IMAGE_RUNTIME"):
        return os.environ["TANDEM_IMAGE_RUNTIME"]
    with open("/proc/mounts") as f:
        types = {fields[1]: fields[2] for fields in (line.split() for line in f) if len(fields) > 2}
    return "crun" if types.get("/sys/fs/cgroup") == "cgroup2" or not shutil.which("runc") else "runc"


CRUN = [runtime()]


class Container:
    """`crun run` (or runc's) of a fresh bundle unpacked from the image, on the host's network."""

    def __init__(self, work, image, name, data, env=None, readonly=False):
        self.id = f"tandem-image-test-{os.getpid()}-{name}"
        self.bundle = os.path.join(work, name)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = None
        self.stdout = []
        subprocess.run(["umoci", "unpack", "--image", image, self.bundle], check=True, capture_output=True)
        path = os.path.join(self.bundle, "config.json")
        with open(path) as f:
            config = json.load(f)
        config["process"]["terminal"] = False
        config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"] if n["type"] != "network"]
        variables = dict(e.split("=", 1) for e in config["process"]["env"])
        variables.update({"TANDEM_PORT": str(self.port), "TANDEM_LOG": "info"}, **(env or {}))
        config["process"]["env"] = [f"{k}={v}" for k, v in variables.items()]
        # umoci makes the image's VOLUME a directory of the bundle; the deployment's volume replaces it.
        config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/data"]
        config["mounts"].append({"destination": "/data", "type": "bind", "source": data, "options": ["rbind", "rw"]})
        if readonly:
            config["root"]["readonly"] = True
            config["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                                     "options": ["nosuid", "nodev", "mode=1777", "size=268435456"]})
            config["process"]["capabilities"] = {k: [] for k in config["process"]["capabilities"]}
        with open(path, "w") as f:
            json.dump(config, f, indent=1)
        self.log_path = os.path.join(work, name + ".log")
        self.log = open(self.log_path, "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*CRUN, "run", "--bundle", self.bundle, self.id], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read_stdout(self):  # the container's stdout, drained so it never blocks on a full pipe
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))

    def wait_healthy(self):
        """Seconds from `crun run` (or runc's) to the first 200 from /health."""
        deadline = self.started + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the container exited with {self.proc.returncode}; its log:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"/health did not answer 200 in {START_TIMEOUT} s; the log:\n{self.log_tail()}")

    def log_tail(self, lines=30):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def api(self, method, path, body=None, key=None, timeout=300):
        """(status, parsed JSON or text, headers), as tandem_server.Server.api answers (rl_step uses it)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key or self.key}"}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, raw, hdrs = r.status, r.read(), r.headers
        except urllib.error.HTTPError as e:
            status, raw, hdrs = e.code, e.read(), e.headers
        try:
            return status, json.loads(raw), hdrs
        except ValueError:
            return status, raw.decode(errors="replace"), hdrs

    def chat(self, model=BASE, content="Say hello.", **extra):
        status, r, _ = self.api("POST", "/v1/chat/completions",
                                {"model": model, "messages": [{"role": "user", "content": content}],
                                 "max_tokens": 8, "temperature": 0, **extra})
        assert status == 200, (status, r)
        assert r["choices"][0]["message"]["content"], r
        return r

    def exec(self, *argv):
        return subprocess.run([*CRUN, "exec", self.id, *argv], capture_output=True, text=True, timeout=60)

    def pid(self):
        out = subprocess.run([*CRUN, "state", self.id], capture_output=True, text=True, check=True).stdout
        return json.loads(out)["pid"]

    def kill(self, signal_name):
        subprocess.run([*CRUN, "kill", self.id, signal_name], check=True, capture_output=True)

    def remove(self):
        """Stops the container (SIGKILL if still running) and deletes it and its bundle."""
        if self.proc.poll() is None:
            subprocess.run([*CRUN, "kill", self.id, "KILL"], capture_output=True)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        subprocess.run([*CRUN, "delete", "-f", self.id], capture_output=True)
        self.log.close()
        shutil.rmtree(self.bundle, ignore_errors=True)


def data_dir(work, name):
    path = os.path.join(work, name)
    os.mkdir(path)
    os.chown(path, UID, UID)
    os.chmod(path, 0o750)
    return path


def read_key(data):
    with open(os.path.join(data, "api-key")) as f:
        return f.read().strip()


def stream_chat(c, body, result):
    """A streamed chat over a raw connection; appends (status, chunks, ended with [DONE]) to result."""
    conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                     {"Authorization": f"Bearer {c.key}", "Content-Type": "application/json"})
        r = conn.getresponse()
        chunks, done, buffer = 0, False, b""
        if r.status == 200:
            while piece := r.read1(65536):
                buffer += piece
                while b"\n\n" in buffer:
                    frame, buffer = buffer.split(b"\n\n", 1)
                    if frame.startswith(b"data: [DONE]"):
                        done = True
                    elif frame.startswith(b"data: "):
                        chunks += 1
                        result.setdefault("first_chunk", time.monotonic())
        result["end"] = (r.status, chunks, done)
    except Exception as e:  # noqa: BLE001 - reported by the check
        result["end"] = ("error", repr(e), False)
    finally:
        conn.close()


def psql(admin_url, sql):
    subprocess.run(["psql", admin_url, "-qc", sql], check=True, capture_output=True, text=True)


def main():
    image_dir = sys.argv[1] if len(sys.argv) > 1 else "target/image/oci"
    admin_url = sys.argv[2] if len(sys.argv) > 2 else "postgres://postgres@127.0.0.1:5432/postgres"
    image = f"{image_dir}:latest"
    if os.geteuid() != 0:
        print("error: the OCI runtime and umoci unpack need root here", file=sys.stderr)
        return 1
    for tool in ("umoci", CRUN[0], "psql"):
        if not shutil.which(tool):
            print(f"error: {tool} is missing", file=sys.stderr)
            return 1
    work = tempfile.mkdtemp(prefix="tandem-image-")
    os.chmod(work, 0o755)
    containers, results, state = [], [], {}
    db_made = False

    def start(name, data, **kw):
        c = Container(work, image, name, data, **kw)
        containers.append(c)
        return c

    def check(label, fn):
        t0 = time.monotonic()
        try:
            note = fn()
            results.append(True)
            print(f"PASS {label} ({time.monotonic() - t0:.1f} s){': ' + note if note else ''}", flush=True)
        except Exception:  # noqa: BLE001 - every failure is reported and counted
            results.append(False)
            print(f"FAIL {label} ({time.monotonic() - t0:.1f} s)", flush=True)
            traceback.print_exc()
            for c in containers:
                print(f"--- the log of {c.id}:\n{c.log_tail()}", file=sys.stderr)

    sqlite_data = data_dir(work, "data-sqlite")

    def a_start_and_chat():
        c = start("first", sqlite_data)
        state["first"] = c
        seconds = c.wait_healthy()
        state["start_seconds"] = seconds
        c.key = read_key(sqlite_data)
        assert any(line.strip() == c.key for line in c.stdout), "the first key was not printed on stdout"
        status, models, _ = c.api("GET", "/v1/models")
        assert status == 200 and BASE in [m["id"] for m in models["data"]], (status, models)
        c.chat()
        # Objects that must outlive the container (check c): a key made inside it, a registered model.
        out = c.exec("tandem", "keys", "create", "--data-dir", "/data", "--entity", "image-test")
        assert out.returncode == 0, out
        state["second_key"] = out.stdout.strip().splitlines()[-1].strip()
        status, model, _ = c.api("POST", "/v1/preview/models", {"project": "image", "name": "kept", "base_model": BASE})
        assert status == 200, (status, model)
        state["model_id"] = model["id"]
        return f"/health 200 {seconds:.1f} s after `{CRUN[0]} run`; /v1/models and a chat with /data/api-key's key"

    def d_sigterm_drains():
        c = state["first"]
        result = {}
        t = threading.Thread(target=stream_chat, args=(c, {
            "model": BASE, "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 96, "min_tokens": 96, "temperature": 0.8, "seed": 1}, result))
        t.start()
        deadline = time.monotonic() + 60
        while "first_chunk" not in result and "end" not in result:
            assert time.monotonic() < deadline, "no chunk of the stream in 60 s"
            time.sleep(0.02)
        assert "end" not in result, f"the stream ended before SIGTERM: {result}"
        sent = time.monotonic()
        c.kill("TERM")
        try:
            code = c.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("the container did not exit within 60 s of SIGTERM")
        exited = time.monotonic() - sent
        t.join(30)
        status, chunks, done = result.get("end", ("none", 0, False))
        assert status == 200 and done, f"the in-flight stream did not end with [DONE]: {result}"
        assert chunks >= 96, f"the stream ended after {chunks} chunks, not the 96 tokens asked for"
        assert code == 0, f"exit code {code} after SIGTERM"
        return f"the in-flight stream ended with [DONE] ({chunks} chunks); exit code 0 {exited:.1f} s after SIGTERM"

    def c_data_survives_restart():
        assert state.get("first") and state["first"].proc.poll() is not None, "the first container is still running"
        c = start("second", sqlite_data, readonly=True)
        state["second"] = c
        c.wait_healthy()
        c.key = read_key(sqlite_data)
        assert c.key == state["first"].key, "the data directory's api-key changed"
        assert not any(line.strip() == c.key for line in c.stdout), "the second start printed a new first key"
        c.chat()
        status, r, _ = c.api("GET", "/v1/models", key=state["second_key"])
        assert status == 200, ("the key made in the first container", status, r)
        status, model, _ = c.api("GET", f"/v1/preview/models/{state['model_id']}")
        assert status == 200 and model["name"] == "kept", (status, model)
        return "the first key, the key made by `tandem keys create` and the registered model are there"

    def e_non_root_read_only():
        c = state["second"]
        with open(f"/proc/{c.pid()}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        uids, gids = status["Uid"].split(), status["Gid"].split()
        assert uids == [str(UID)] * 4 and gids == [str(UID)] * 4, (uids, gids)
        assert int(status["CapEff"], 16) == 0, status["CapEff"]
        with open(f"/proc/{c.pid()}/mountinfo") as f:
            root = [line.split() for line in f if line.split()[4] == "/"]
        assert root and "ro" in root[-1][5].split(","), root
        out = c.exec("sh", "-c", "touch /usr/local/bin/x")
        assert out.returncode != 0 and "Read-only file system" in out.stderr, out
        out = c.exec("sh", "-c", "touch /data/probe && rm /data/probe && touch /tmp/probe")
        assert out.returncode == 0, out
        out = c.exec("curl", "-fsS", f"http://127.0.0.1:{c.port}/health")
        assert out.returncode == 0, out
        template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "<|im_start|>assistant\n")
        c.chat(chat_template=template)
        return "uid/gid 10001, no capabilities, / read-only, /data and /tmp writable, curl /health, jailed template"

    def b_postgres_rl_step():
        psql(admin_url, f"DROP DATABASE IF EXISTS {DB_NAME}")
        psql(admin_url, f"CREATE DATABASE {DB_NAME}")
        nonlocal db_made
        db_made = True
        database_url = admin_url.rsplit("/", 1)[0] + "/" + DB_NAME
        data = data_dir(work, "data-postgres")
        c = start("postgres", data, env={"TANDEM_DATABASE_URL": database_url}, readonly=True)
        seconds = c.wait_healthy()
        c.key = read_key(data)
        c.chat()
        status, model, _ = c.api("POST", "/v1/preview/models", {"project": "image", "name": "rl", "base_model": BASE})
        assert status == 200, (status, model)
        messages = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
        status, r, _ = c.api("POST", "/v1/chat/completions",
                             {"model": BASE, "messages": messages, "n": 2, "temperature": 1.0, "max_tokens": 8,
                              "seed": 5, "logprobs": True})
        assert status == 200, (status, r)
        groups = [{"trajectories": [{"messages_and_choices": messages + [ch], "reward": float(i)}
                                    for i, ch in enumerate(r["choices"])]}]
        status, log, _ = c.api("POST", f"/v1/preview/models/{model['id']}/log",
                               {"split": "train", "trajectory_groups": groups})
        assert status == 200 and log["num_trajectories"] == 2, (status, log)
        job = rl_step(c, model["id"], "Is the sky blue? Answer yes or no.", seed=3)
        status, checkpoints, _ = c.api("GET", f"/v1/preview/models/{model['id']}/checkpoints")
        assert status == 200 and [cp["step"] for cp in checkpoints["data"]] == [1], (status, checkpoints)
        c.chat(model=f"wandb-artifact:///{model['entity']}/image/rl:step1")
        return (f"/health 200 {seconds:.1f} s after `{CRUN[0]} run` on PostgreSQL; trajectory log, job {job['status']}, "
                "chat with step 1")

    print(f"runtime: {CRUN[0]}; image: {image}", flush=True)
    try:
        check("a. start, /v1/models, chat with the first key", a_start_and_chat)
        check("d. SIGTERM drains an in-flight stream, exit 0", d_sigterm_drains)
        check("c. /data survives a new container (SQLite)", c_data_survives_restart)
        check("e. uid 10001, read-only root, everything works", e_non_root_read_only)
        check("b. PostgreSQL: chat and an RL step", b_postgres_rl_step)
    finally:
        for c in containers:
            c.remove()
        if db_made:
            try:
                psql(admin_url, f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
            except subprocess.CalledProcessError as e:
                print(f"could not drop {DB_NAME}: {e.stderr}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    if "start_seconds" in state:
        print(f"start time ({CRUN[0]} run to /health 200, SQLite): {state['start_seconds']:.1f} s")
    passed, failed = results.count(True), results.count(False)
    print(f"image: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
