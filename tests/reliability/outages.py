"""R15-R17 (issue 35): the store goes away under load. PostgreSQL stopped (a private server this
test starts, so the machine's own is never touched), the S3 blob store unreachable (moto behind a
TCP proxy that can refuse connections, as a stopped server does, without losing moto's objects),
and the data directory on a tmpfs that fills up. Every answer during a fault is a 2xx or a quick
503/507 in its area's error shape, nothing acknowledged is lost, and everything recovers by itself.

Called from reliability.py, which passes its helpers as `rel`. Standard library only.
"""

import json
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
import uuid

from tandem_server import PrivatePostgres, free_port, scratch, start_moto

# A 503 from an unavailable store comes within the pool's acquire timeout (2 s) and a request's
# own work; from an unreachable blob store within its client's retries (5 s) and connect timeout.
DB_BOUND_S = 4.0
BLOB_BOUND_S = 9.0


class Proxy:
    """A TCP proxy to 127.0.0.1:`target`. `stop()` makes it look like a stopped server: every open
    connection is reset and new ones are refused; `start()` listens again on the same port."""

    def __init__(self, target):
        self.target, self.port = target, free_port()
        self.conns, self.lock, self.listener = set(), threading.Lock(), None
        self.start()

    def start(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(128)
        self.listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self):
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            conns, self.conns = self.conns, set()
        for c in conns:
            try:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                c.close()
            except OSError:
                pass


def shape_ok(area, body):
    """The error body of `area`: the OpenAI, Anthropic or FastAPI (preview, Tinker) shape."""
    if area == "openai":
        return isinstance(body, dict) and isinstance(body.get("error"), dict) and "message" in body["error"]
    if area == "anthropic":
        return isinstance(body, dict) and body.get("type") == "error" and "message" in body.get("error", {})
    return isinstance(body, dict) and isinstance(body.get("detail"), str)


class Recorder:
    """Every answer of the load: (route, area, sent at, seconds, status, shape ok, Retry-After)."""

    def __init__(self):
        self.rows, self.lock = [], threading.Lock()

    def call(self, server, route, area, method, path, body=None, key=None, headers=None, timeout=60):
        t0 = time.monotonic()
        try:
            status, reply, hdrs = server.api(method, path, body, key=key, headers=headers, timeout=timeout)
        except OSError as e:
            status, reply, hdrs = 0, str(e), {}
        took = time.monotonic() - t0
        ok_shape = status < 400 or shape_ok(area, reply)
        with self.lock:
            self.rows.append((route, area, t0, took, status, ok_shape, (hdrs or {}).get("retry-after")))
        return status, reply

    def between(self, t0, t1):
        return [r for r in self.rows if t0 <= r[2] < t1]


def judge(rel, rows, bound, label):
    """Checks every answer of `rows` is a 2xx or a quick, well-shaped 503/507 with Retry-After, and
    prints the figures per route."""
    bad = [r for r in rows if not (200 <= r[4] < 300 or r[4] in (503, 507))]
    rel.check(not bad, f"{label}: answers other than 2xx/503/507: {bad[:5]}")
    slow = [r for r in rows if r[4] in (503, 507) and r[3] > bound]
    rel.check(not slow, f"{label}: 503/507 slower than {bound} s: {slow[:5]}")
    shapeless = [r for r in rows if r[4] >= 400 and (not r[5] or not r[6])]
    rel.check(not shapeless, f"{label}: errors without their area's shape or Retry-After: {shapeless[:5]}")
    by_route = {}
    for r in rows:
        by_route.setdefault(r[0], []).append(r)
    for route, rs in sorted(by_route.items()):
        unavailable = [r for r in rs if r[4] in (503, 507)]
        took = sorted(r[3] for r in rs)
        print(f"     {label} {route}: {len(rs)} answers, {len(unavailable)} 503/507, "
              f"p50 {took[len(took) // 2]:.2f} s, max {took[-1]:.2f} s")


def r15(ctx, rel, outage_s=12.0):
    """PostgreSQL stopped for `outage_s` under logs, jobs, reads and chats."""
    pg = PrivatePostgres()
    try:
        _r15(ctx, rel, pg, outage_s)
    finally:
        pg.close()


def _r15(ctx, rel, pg, outage_s):
    server = rel.Server(ctx.args.binary, ctx.args.model, rel.KEY,
                        ["--database-url", pg.url, "--job-lease-seconds", "5"], prefix="tandem-rel-")
    ctx.servers.append(server)
    model = rel.create_model(server)
    groups = rel.rollout_groups(server, n_groups=1, n=2)
    big_groups = rel.rollout_groups(server, n_groups=8, n=4)
    # A trained checkpoint, served before the outage: its name and its file are known to the node.
    status, first = server.api("POST", "/v1/preview/training-jobs",
                               {"model_id": model["id"], "trajectory_groups": groups})[:2]
    rel.check(status == 200 and rel.wait_job(server, first["id"])["status"] == "succeeded", f"first job: {first}")
    trained = f"wandb-artifact:///{model['entity']}/{model['project']}/{model['name']}"
    for name in (trained, trained + ":step1"):
        status, reply = server.api("POST", "/v1/chat/completions", rel.chat_body(max_tokens=4, model=name))[:2]
        rel.check(status == 200, f"the checkpoint serves before the outage: {status} {reply}")
    rec, stop, acked, lock = Recorder(), threading.Event(), {}, threading.Lock()
    tinker = {"X-API-Key": f"tml-{rel.KEY}"}
    jobs_made, next_job, model_lists = [], [0.0], []

    def logger(w):
        while not stop.is_set():
            g = [{"trajectories": [{"reward": 0.5, "messages_and_choices": [
                {"role": "user", "content": f"w{w} {uuid.uuid4().hex}"}]}]}]
            status, v = rec.call(server, "POST log", "preview", "POST", f"/v1/preview/models/{model['id']}/log",
                                 {"split": "train", "trajectory_groups": g}, timeout=30)
            if status == 200:
                with lock:
                    acked[v["id"]] = g
            time.sleep(0.05)

    def chatter():
        while not stop.is_set():
            rec.call(server, "chat (base)", "openai", "POST", "/v1/chat/completions", rel.chat_body(max_tokens=4))
            rec.call(server, "chat (checkpoint)", "openai", "POST", "/v1/chat/completions",
                     rel.chat_body(max_tokens=4, model=random.choice((trained, trained + ":step1"))))
            rec.call(server, "messages (base)", "anthropic", "POST", "/v1/messages",
                     {"model": rel.BASE, "max_tokens": 4, "messages": rel.user("Hi")},
                     headers={"x-api-key": rel.KEY, "anthropic-version": "2023-06-01"})

    def lister():
        # On its own, so that a short outage sees several listings (the reader's other routes
        # each wait out the pool's acquire timeout meanwhile).
        while not stop.is_set():
            sent = time.monotonic()
            status, listed = rec.call(server, "GET /v1/models", "openai", "GET", "/v1/models")
            if status == 200:
                with lock:
                    model_lists.append((sent, {m["id"] for m in listed["data"]}))
            time.sleep(0.3)

    def reader():
        while not stop.is_set():
            rec.call(server, "GET models", "preview", "GET", "/v1/preview/models")
            rec.call(server, "GET model", "preview", "GET", f"/v1/preview/models/{model['id']}")
            rec.call(server, "tinker runs", "preview", "GET", "/api/v1/training_runs", key=False, headers=tinker)
            if time.monotonic() >= next_job[0]:
                # One job every 3 s: enough to see creation fail and recover, not a queue to drain.
                next_job[0] = time.monotonic() + 3
                status, job = rec.call(server, "POST job", "preview", "POST", "/v1/preview/training-jobs",
                                       {"model_id": model["id"], "trajectory_groups": groups})
                if status == 200:
                    jobs_made.append(job["id"])
            time.sleep(0.3)

    threads = [threading.Thread(target=logger, args=(w,)) for w in range(2)]
    threads += [threading.Thread(target=chatter), threading.Thread(target=reader), threading.Thread(target=lister)]
    for t in threads:
        t.start()
    time.sleep(2)
    # A job of several steps, running when the store stops: it must keep its lease through an
    # outage longer than the lease (5 s), and finish without being restarted.
    status, before = server.api("POST", "/v1/preview/training-jobs",
                                {"model_id": model["id"], "trajectory_groups": big_groups,
                                 "experimental_config": {"packed_sequence_length": 48}})[:2]
    rel.check(status == 200, f"job before the outage: {status} {before}")
    deadline = time.monotonic() + 120
    while server.api("GET", f"/v1/preview/training-jobs/{before['id']}")[1]["status"] == "queued":
        rel.check(time.monotonic() < deadline, "the job before the outage never started")
        time.sleep(0.05)
    state = server.api("GET", f"/v1/preview/training-jobs/{before['id']}")[1]["status"]
    rel.check(state == "running", f"the job before the outage ended before the store stopped: {state}")
    t_down = time.monotonic()
    pg.stop()
    health_during = []
    while time.monotonic() < t_down + outage_s:
        t0 = time.monotonic()
        status = server.api("GET", "/health", key=False, timeout=10)[0]
        health_during.append((status, time.monotonic() - t0))
        time.sleep(1)
    pg.start()
    t_up = time.monotonic()
    time.sleep(8)
    stop.set()
    for t in threads:
        t.join()
    t_end = time.monotonic()

    during = rec.between(t_down + 0.5, t_up)
    judge(rel, during, DB_BOUND_S, "outage")
    judge(rel, rec.between(t_up, t_end), DB_BOUND_S, "after")
    judge(rel, rec.between(0, t_down), DB_BOUND_S, "before")
    # /v1/models lists the base model and, while the store is down, the trained names this node
    # served before (they go on serving).
    chats = ("chat (base)", "messages (base)", "chat (checkpoint)", "GET /v1/models")
    listed_during = [ids for at, ids in model_lists if t_down + 0.5 <= at < t_up]
    rel.check(listed_during and all({rel.BASE, trained, trained + ":step1"} <= ids for ids in listed_during),
              f"/v1/models during the outage must list the base and the served checkpoint: {listed_during[:2]}")
    store_routes = [r for r in during if r[0] not in chats]
    rel.check(any(r[4] == 503 for r in store_routes), "no store route saw the outage (503)")
    inference = [r for r in during if r[0] in chats]
    rel.check(inference and all(r[4] == 200 for r in inference),
              f"inference on the base model and a served checkpoint, and /v1/models, must go on: "
              f"{[r for r in inference if r[4] != 200][:3]}")
    rel.check(all(s == 503 and took < 3 for s, took in health_during[1:]),
              f"/health during the outage: {health_during}")
    first_ack = min((r[2] + r[3] for r in rec.rows if r[0] == "POST log" and r[4] == 200 and r[2] >= t_up),
                    default=None)
    rel.check(first_ack is not None, "no log was acknowledged after PostgreSQL came back")
    print(f"     PostgreSQL down {t_up - t_down:.1f} s; {len(during)} answers during it; first log "
          f"acknowledged {first_ack - t_up:.2f} s after it came back; /health during: "
          f"{sorted({s for s, _ in health_during})} in <= {max(t for _, t in health_during):.2f} s")

    lost = 0
    for log_id, g in acked.items():
        status, v, _ = server.api("GET", f"/v1/preview/models/{model['id']}/logs/{log_id}")
        if status != 200 or v.get("trajectory_groups") != g:
            lost += 1
    print(f"     {len(acked)} acknowledged logs, {lost} missing or different")
    rel.check(lost == 0, "every acknowledged log must survive")
    ended = rel.wait_job(server, before["id"], timeout=300)
    rel.check(ended["status"] == "succeeded", f"the job running through the outage: {ended['status']}")
    kinds = [e["type"] for e in server.api("GET", f"/v1/preview/training-jobs/{before['id']}/events?limit=100")[1]["data"]]
    attempts = subprocess.run(["psql", pg.url, "-Atqc", f"SELECT attempts FROM training_jobs WHERE id = '{before['id']}'"],
                              capture_output=True, text=True).stdout.strip()
    rel.check("training_restarted" not in kinds and kinds.count("training_started") == 1 and attempts == "1",
              f"the job running through the outage kept its lease: claimed {attempts} times, events {kinds}")
    for job_id in jobs_made:
        rel.wait_job(server, job_id, timeout=600)
    t0 = time.monotonic()
    status, after = server.api("POST", "/v1/preview/training-jobs",
                               {"model_id": model["id"], "trajectory_groups": groups})[:2]
    rel.check(status == 200, f"job after the outage: {status} {after}")
    ended = rel.wait_job(server, after["id"], timeout=300)
    rel.check(ended["status"] == "succeeded", f"the job queued after the outage: {ended}")
    print(f"     jobs: the one running through the outage kept its lease and succeeded ({len(kinds)} events, "
          f"no restart); {len(jobs_made)} accepted by the load all ended; "
          f"one queued after it succeeded in {time.monotonic() - t0:.1f} s")
    rel.check(server.api("GET", "/health", key=False)[0] == 200, "/health after the outage")


def r16(ctx, rel, budget_s=15):
    """The S3 blob store unreachable during a checkpoint publish (back within the retry budget,
    and not), and during the first read of a checkpoint this node has not cached."""
    python = ctx.args.moto_python
    if not python or not os.path.exists(python):
        raise NotImplementedError("needs moto's S3 server: pass --moto-python (make reliability does)")
    moto, moto_port = start_moto(python, "tandem-rel")
    proxy = Proxy(moto_port)
    saved = dict(os.environ)
    os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT": f"http://127.0.0.1:{proxy.port}", "AWS_ALLOW_HTTP": "true"})
    try:
        _r16(ctx, rel, proxy, budget_s)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proxy.stop()
        moto.kill()
        moto.wait()


def _r16(ctx, rel, proxy, budget_s):
    extra = ["--blob-store", "s3://tandem-rel/r16", "--blob-retry-seconds", str(budget_s)]
    server = rel.Server(ctx.args.binary, ctx.args.model, rel.KEY, extra, prefix="tandem-rel-")
    ctx.servers.append(server)
    model = rel.create_model(server)
    groups = rel.rollout_groups(server, n_groups=1, n=2)

    def job():
        status, j = server.api("POST", "/v1/preview/training-jobs",
                               {"model_id": model["id"], "trajectory_groups": groups})[:2]
        rel.check(status == 200, f"job: {status} {j}")
        return j["id"]

    def steps():
        status, page = server.api("GET", f"/v1/preview/models/{model['id']}/checkpoints")[:2]
        rel.check(status == 200, f"checkpoints: {status} {page}")
        return sorted(c["step"] for c in page["data"])

    # 1. Unreachable while the job trains and publishes; back within the budget: it succeeds late.
    proxy.stop()
    job_id, t_down = job(), time.monotonic()
    time.sleep(budget_s / 2)
    rel.check(server.api("GET", f"/v1/preview/training-jobs/{job_id}")[1]["status"] != "succeeded",
              "a job succeeded while its checkpoint could not be uploaded")
    proxy.start()
    t_up = time.monotonic()
    ended = rel.wait_job(server, job_id, timeout=300)
    rel.check(ended["status"] == "succeeded", f"publish retried within the budget: {ended}")
    rel.check(steps() == [1], f"one checkpoint recorded: {steps()}")
    print(f"     blob store down {t_up - t_down:.1f} s during a job's publish: the job succeeded after "
          f"it came back (retried with backoff, budget {budget_s} s)")

    # 2. Unreachable for longer than the budget: the job fails with a clear event, no checkpoint.
    proxy.stop()
    t0 = time.monotonic()
    job_id = job()
    ended = rel.wait_job(server, job_id, timeout=budget_s + 240)
    took = time.monotonic() - t0
    proxy.start()
    rel.check(ended["status"] == "failed", f"a publish past the budget fails the job: {ended}")
    messages = [json.dumps(e.get("data")) for e in rel.events(server, job_id) if e["type"] == "training_failed"]
    rel.check(messages and "blob store did not answer" in messages[-1], f"the failure names the blob store: {messages}")
    rel.check("127.0.0.1" not in messages[-1], f"the failure does not say where the blob store is: {messages}")
    rel.check(took >= budget_s, f"the publish retried for its whole budget ({budget_s} s): {took:.1f} s")
    rel.check(steps() == [1], f"no checkpoint recorded for the failed publish: {steps()}")
    print(f"     blob store down past the budget: the job failed after {took:.1f} s with {messages[-1][:140]}")

    # 3. The first read of a checkpoint this node has not cached, while the store is unreachable.
    data = server.data
    server.kill9()
    shutil.rmtree(os.path.join(data, "checkpoints"))
    server = rel.Server(ctx.args.binary, ctx.args.model, rel.KEY, extra, data=data, prefix="tandem-rel-")
    ctx.servers.append(server)
    name = f"wandb-artifact:///{model['entity']}/{model['project']}/{model['name']}:step1"
    rec = Recorder()
    proxy.stop()
    for _ in range(3):
        rec.call(server, "chat (checkpoint)", "openai", "POST", "/v1/chat/completions",
                 rel.chat_body(max_tokens=4, model=name))
        rec.call(server, "chat (base)", "openai", "POST", "/v1/chat/completions", rel.chat_body(max_tokens=4))
    proxy.start()
    judge(rel, rec.rows, BLOB_BOUND_S, "blob store down")
    rel.check(all(r[4] == 503 for r in rec.rows if r[0] == "chat (checkpoint)"),
              "an uncached checkpoint's read is a 503 while the blob store is down")
    rel.check(all(r[4] == 200 for r in rec.rows if r[0] == "chat (base)"), "the base model serves on")
    status, reply = rec.call(server, "chat (checkpoint)", "openai", "POST", "/v1/chat/completions",
                             rel.chat_body(max_tokens=4, model=name))
    rel.check(status == 200, f"the checkpoint serves once the blob store is back: {status} {reply}")


def r17(ctx, rel, size_mb=64):
    """The data directory on a size-limited tmpfs that fills up."""
    mount = tempfile.mkdtemp(prefix="tandem-full-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", mount],
                          capture_output=True, text=True)
    if done.returncode != 0:
        os.rmdir(mount)
        raise NotImplementedError(f"cannot mount a size-limited tmpfs here ({done.stderr.strip()}): needs root")
    try:
        _r17(ctx, rel, mount)
    finally:
        for s in ctx.servers:
            if s.proc.poll() is None:
                s.kill9()
        subprocess.run(["umount", "-l", mount])
        os.rmdir(mount)


def _r17(ctx, rel, mount):
    data = os.path.join(mount, "data")
    os.makedirs(data, mode=0o700)
    logs = scratch("tandem-rel-log-")
    extra = ["--blob-retry-seconds", "5"]
    server = rel.Server(ctx.args.binary, ctx.args.model, rel.KEY, extra, data=data, log_dir=logs)
    ctx.servers.append(server)
    model = rel.create_model(server)
    groups = rel.rollout_groups(server, n_groups=1, n=2)
    rec, acked = Recorder(), {}

    def log(tag):
        g = [{"trajectories": [{"reward": 1.0, "messages_and_choices": [
            {"role": "user", "content": f"{tag} {uuid.uuid4().hex} " + "x" * 2000}]}]}]
        status, v = rec.call(server, "POST log", "preview", "POST", f"/v1/preview/models/{model['id']}/log",
                             {"split": "train", "trajectory_groups": g})
        if status == 200:
            acked[v["id"]] = g
        return status

    for i in range(10):
        rel.check(log(f"before {i}") == 200, "logs before the disk fills")
    # A job accepted just before the disk fills: it trains while the disk fills, so its checkpoint
    # write most likely finds no room (it retries for --blob-retry-seconds, then fails).
    big = rel.rollout_groups(server, n_groups=4, n=4)
    status, j = server.api("POST", "/v1/preview/training-jobs", {"model_id": model["id"], "trajectory_groups": big})[:2]
    rel.check(status == 200, f"job before the disk fills: {status} {j}")
    racing = j["id"]
    # Fill the disk: one file, written until the filesystem refuses.
    filler = os.path.join(mount, "filler")
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    try:
        with open(filler, "ab") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass
    t_full = time.monotonic()
    statuses = [log(f"full {i}") for i in range(40)]
    rec.call(server, "POST model", "preview", "POST", "/v1/preview/models",
             {"project": "rel", "name": f"full-{uuid.uuid4().hex[:6]}", "base_model": rel.BASE})
    status, j = rec.call(server, "POST job", "preview", "POST", "/v1/preview/training-jobs",
                         {"model_id": model["id"], "trajectory_groups": groups})
    job_during = j["id"] if status == 200 else None
    for _ in range(3):
        rec.call(server, "chat (base)", "openai", "POST", "/v1/chat/completions", rel.chat_body(max_tokens=4))
        # A request's own chat template renders in the jail (pipes, no temporary files).
        rec.call(server, "chat (template)", "openai", "POST", "/v1/chat/completions",
                 rel.chat_body(max_tokens=4, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}"))
    judge(rel, rec.between(t_full, time.monotonic()), 2.0, "disk full")
    rel.check(507 in statuses, f"writes on a full disk answer 507: {sorted(set(statuses))}")
    rel.check(all(r[4] == 200 for r in rec.rows if r[0].startswith("chat")), "inference serves on")
    # The racing job gives up its checkpoint write after --blob-retry-seconds (5 s here) of a full
    # disk; its failure is recorded once space returns.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(
            "gave up writing a checkpoint" in line for line in open(server.log_path, errors="replace")):
        time.sleep(0.5)
    # Space returns: writes succeed again without a restart.
    os.remove(filler)
    t_free = time.monotonic()
    for job_id in (racing, job_during):
        if not job_id:
            continue
        # It could not store its checkpoint (or its failure) while the disk was full; it ends now.
        ended = rel.wait_job(server, job_id, timeout=300)
        msgs = [json.dumps(e.get("data")) for e in rel.events(server, job_id) if e["type"] == "training_failed"]
        retried = sum("a checkpoint failed; retrying" in line for line in open(server.log_path, errors="replace"))
        print(f"     a job accepted {'before the disk filled' if job_id == racing else 'while full'} ended "
              f"{ended['status']} {msgs[-1][:150] if msgs else ''} (the log shows {retried} retried checkpoint "
              f"writes)")
        if job_id == racing:
            rel.check(ended["status"] == "failed" and msgs and "out of disk space" in msgs[-1] and retried > 0,
                      f"the job whose checkpoint found no room retried, then failed saying why: {ended} {msgs}")
        else:
            rel.check(ended["status"] == "succeeded" or (msgs and "out of disk space" in msgs[-1]),
                      f"the job succeeded or failed saying why: {ended} {msgs}")
    status = log("after")
    rel.check(status == 200, f"a log after space returned: {status}")
    status, j = server.api("POST", "/v1/preview/training-jobs", {"model_id": model["id"], "trajectory_groups": groups})[:2]
    rel.check(status == 200, f"a job after space returned: {status} {j}")
    rel.check(rel.wait_job(server, j["id"])["status"] == "succeeded", "the job after space returned succeeds")
    print(f"     disk full: {statuses.count(507)} of {len(statuses)} log writes answered 507, "
          f"{statuses.count(200)} acknowledged; recovered {time.monotonic() - t_free:.1f} s after space returned "
          f"(a log and a training job)")
    server.kill9()
    db = sqlite3.connect(os.path.join(data, "tandem.db"))
    integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
    db.close()
    server = server.restart()
    ctx.servers.append(server)
    lost = sum(1 for log_id, g in acked.items()
               if server.api("GET", f"/v1/preview/models/{model['id']}/logs/{log_id}")[1].get("trajectory_groups") != g)
    print(f"     integrity_check: {integrity}; {len(acked)} acknowledged logs, {lost} missing")
    rel.check(integrity == "ok", "the database must pass integrity_check")
    rel.check(lost == 0, "every acknowledged log must survive")
