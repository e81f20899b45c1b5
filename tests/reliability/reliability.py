"""tandem's reliability suite (../shared/design/reliability.md, R1-R12; R13-R14 are issue 32's, R15-R17 issue 35's), against the real binary
and the bundled model, loopback only. Standard library only.

Usage: python3 reliability.py <tandem binary> <model gguf> [--only R2,R3] [--soak-minutes 5]
       [--rounds 20]

Each test starts its own server(s) on free ports with temporary data dirs, prints its figures and
PASS or FAIL; the script exits non-zero if any test failed. Tests not built yet say so and count
as neither. `make reliability` runs it.
"""

import argparse
import asyncio
import http.client
import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from tandem_server import Server, finish  # noqa: E402
import fair_shares  # noqa: E402
import outages  # noqa: E402

KEY = "reliability-key"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


class Failed(AssertionError):
    pass


def check(cond, message):
    if not cond:
        raise Failed(message)


def user(text):
    return [{"role": "user", "content": text}]


def chat_body(text="Say hi.", max_tokens=8, **extra):
    return {"messages": user(text), "max_tokens": max_tokens, "temperature": 0, **extra}


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def metric(server, name):
    """A Prometheus series' value, summed over its labels."""
    status, text, _ = server.api("GET", "/metrics")
    check(status == 200, f"/metrics answered {status}")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def stream_chat(server, body, key=KEY, timeout=120, stop_after_first=False):
    """One streamed chat over a raw connection: (status, number of data chunks, ended with [DONE])."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                 {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        r.read()
        conn.close()
        return r.status, 0, False
    chunks, done = 0, False
    buffer = b""
    while True:
        piece = r.read1(65536) if hasattr(r, "read1") else r.read(1024)
        if not piece:
            break
        buffer += piece
        while b"\n\n" in buffer:
            frame, buffer = buffer.split(b"\n\n", 1)
            if frame.startswith(b"data: [DONE]"):
                done = True
            elif frame.startswith(b"data: "):
                chunks += 1
                if stop_after_first:
                    conn.sock.close()
                    return 200, chunks, False
    conn.close()
    return 200, chunks, done


def rollout_groups(server, n_groups=2, n=4, key=KEY, model=BASE):
    """Trajectory groups with real token ids, as ART 0.5.23 records them."""
    groups = []
    for g in range(n_groups):
        messages = user(f"Is {g} a number? Answer yes or no.")
        status, r, _ = server.api("POST", "/v1/chat/completions", {
            "model": model, "messages": messages, "n": n, "temperature": 1.0, "max_tokens": 4, "seed": g,
            "logprobs": True, "return_token_ids": True}, key=key)
        check(status == 200, f"rollout answered {status}: {r}")
        trajectories = []
        for i, c in enumerate(r["choices"]):
            choice = dict(c, prompt_token_ids=r["prompt_token_ids"])
            trajectories.append({"messages_and_choices": [*messages, choice], "reward": float(i % 2)})
        groups.append({"trajectories": trajectories})
    return groups


def create_model(server, key=KEY, name=None):
    status, m, _ = server.api("POST", "/v1/preview/models",
                              {"project": "rel", "name": name or f"m-{uuid.uuid4().hex[:8]}", "base_model": BASE},
                              key=key)
    check(status == 200, f"create model answered {status}: {m}")
    return m


# --- the tests ---------------------------------------------------------------------------------

TESTS = []


def test(rid, title):
    def add(fn):
        TESTS.append((rid, title, fn))
        return fn
    return add


@test("R1", "stream soak: 64 concurrent streaming chats")
def r1(ctx):
    server = ctx.server()
    pid = server.proc.pid
    deadline = time.monotonic() + ctx.args.soak_minutes * 60
    results, lock = {"ok": 0, "bad": [], "undone": 0}, threading.Lock()

    def worker(i):
        while time.monotonic() < deadline:
            status, _, done = stream_chat(server, chat_body(f"Count to {i % 10 + 3}.", max_tokens=24, seed=i))
            with lock:
                if status != 200:
                    results["bad"].append(status)
                elif not done:
                    results["undone"] += 1
                else:
                    results["ok"] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    samples = []
    while any(t.is_alive() for t in threads):
        samples.append(rss_mib(pid))
        time.sleep(10)
    for t in threads:
        t.join()
    time.sleep(1)
    running, waiting = metric(server, "vllm:num_requests_running"), metric(server, "vllm:num_requests_waiting")
    warm = samples[min(len(samples) - 1, 3)] if samples else 0
    print(f"     {results['ok']} streams ok, {len(results['bad'])} non-2xx, {results['undone']} without [DONE]; "
          f"RSS after warm-up {warm:.0f} MiB, at the end {samples[-1]:.0f} MiB, max {max(samples):.0f} MiB; "
          f"gauges at the end: running {running:.0f}, waiting {waiting:.0f}")
    check(not results["bad"] and results["undone"] == 0, "every stream must be 200 and end with [DONE]")
    check(samples[-1] <= warm * 1.25 + 50, "memory must stay flat after warm-up")
    check(running == 0 and waiting == 0, "the gauges must be back to zero")


@test("R2", "overload burst: 300 simultaneous requests over a queue of 16")
def r2(ctx):
    server = ctx.server(["--max-waiting", "16", "--max-num-seqs", "8", "--per-entity-limit", "1000"])
    results = asyncio.run(burst(server, 300))
    statuses = {}
    for s, _, _ in results:
        statuses[s] = statuses.get(s, 0) + 1
    rejected = [(s, lat, ra) for s, lat, ra in results if s != 200]
    lat = [x[1] * 1000 for x in rejected]
    # The server's own latency of each rejection (tower-http logs every 4xx/5xx answer with it):
    # the client's figure below also holds the time this one Python thread takes to get round to
    # reading 300 sockets.
    server_lat = [int(m) for m in re.findall(r"Status code: (?:429|503)[^\n]*latency\S*?(\d+) ms",
                                             re.sub(r"\x1b\[[0-9;]*m", "", server.log_tail(100000)))]
    print(f"     statuses {dict(sorted(statuses.items()))}; rejections: server-side latency max "
          f"{max(server_lat, default=float('nan'))} ms over {len(server_lat)} logged; client-observed p50 "
          f"{percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms (one client thread, 300 connections)")
    check(set(statuses) <= {200, 429, 503}, f"only 200, 429 and 503 are allowed: {statuses}")
    check(statuses.get(200, 0) >= 16, "at least the queue's worth must be served")
    check(all(ra for _, _, ra in rejected), "every rejection must carry Retry-After")
    check(len(server_lat) == len(rejected) and max(server_lat, default=0) <= 50,
          "every rejection must be answered within 50 ms")
    time.sleep(1)
    status, v, _ = server.api("POST", "/v1/chat/completions", chat_body())
    check(status == 200, f"1 s later a normal request answered {status}: {v}")


async def burst(server, n):
    """n connections opened first, then every request written at once; per request (status,
    seconds from its write to the status line, Retry-After)."""
    conns = [await asyncio.open_connection(server.host, server.port) for _ in range(n)]

    def request(i):
        body = json.dumps(chat_body("Write a long story.", max_tokens=32, seed=i)).encode()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.host}\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        return head.encode() + body

    async def one(i, reader, writer):
        writer.write(request(i))
        await writer.drain()
        sent = time.monotonic()
        status_line = await reader.readline()
        took = time.monotonic() - sent
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        await reader.read()
        writer.close()
        return int(status_line.split()[1]), took, headers.get("retry-after")

    return await asyncio.gather(*(one(i, r, w) for i, (r, w) in enumerate(conns)))


@test("R3", "disconnect: 50 streams closed after their first chunk")
def r3(ctx):
    server = ctx.server()
    threads = [threading.Thread(target=stream_chat, args=(server, chat_body("Tell a very long story.",
                                                                            max_tokens=400, seed=i)),
                                kwargs={"stop_after_first": True}) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    closed = time.monotonic()
    while metric(server, "vllm:num_requests_running") > 0 and time.monotonic() - closed < 5:
        time.sleep(0.05)
    drained = time.monotonic() - closed
    tokens = metric(server, "vllm:generation_tokens_total")
    time.sleep(1)
    later = metric(server, "vllm:generation_tokens_total")
    print(f"     running gauge at 0 {drained * 1000:.0f} ms after the last close; {later - tokens:.0f} tokens "
          f"generated in the second after")
    check(drained <= 1.0, "the running gauge must be back to 0 within 1 s")
    check(later == tokens, "no tokens may be generated for closed streams")


@test("R4", "limits: oversized body, over-long prompt, slow headers")
def r4(ctx):
    server = ctx.server(["--max-body-bytes", str(1 << 20)])
    status, v, _ = server.api("POST", "/v1/chat/completions", raw_body=b'{"messages": "' + b"x" * (2 << 20) + b'"}')
    check(status == 413, f"a 2 MiB body answered {status}")
    status, v, _ = server.api("POST", "/v1/chat/completions", chat_body("word " * 9000))
    check(status == 400, f"an over-long prompt answered {status}: {v}")
    # 50 connections that send half a request line and stop.
    slow = []
    for _ in range(50):
        s = socket.create_connection((server.host, server.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Len")
        slow.append(s)
    started = time.monotonic()
    status, v, _ = server.api("POST", "/v1/chat/completions", chat_body(), timeout=30)
    took = time.monotonic() - started
    for s in slow:
        s.close()
    print(f"     413 for 2 MiB, 400 for a 9000-word prompt; with 50 stalled connections a request took {took:.2f} s")
    check(status == 200, f"a normal request beside slow clients answered {status}")


@test("R5", "kill -9 during trajectory logging")
def r5(ctx):
    server = ctx.server()
    model = create_model(server)
    acked = {}
    lost = 0
    for round_ in range(ctx.args.rounds):
        stop = threading.Event()
        lock = threading.Lock()

        def writer(w):
            while not stop.is_set():
                groups = [{"trajectories": [{"reward": random.random(), "messages_and_choices": [
                    {"role": "user", "content": f"r{round_} w{w} {uuid.uuid4().hex}"}]}]}]
                try:
                    status, v, _ = server.api("POST", f"/v1/preview/models/{model['id']}/log",
                                              {"split": "train", "trajectory_groups": groups}, timeout=10)
                except OSError:
                    return
                if status == 200:
                    with lock:
                        acked[v["id"]] = groups

        writers = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in writers:
            t.start()
        time.sleep(random.uniform(0.3, 1.0))
        server.kill9()
        stop.set()
        for t in writers:
            t.join()
        server = server.restart()
        ctx.servers.append(server)
    for log_id, groups in acked.items():
        status, v, _ = server.api("GET", f"/v1/preview/models/{model['id']}/logs/{log_id}")
        if status != 200 or v.get("trajectory_groups") != groups:
            lost += 1
    server.kill9()
    if ctx.args.database_url:
        # PostgreSQL's own recovery keeps the heap and indexes whole; what matters is above.
        integrity = "ok (PostgreSQL: not SQLite's check)"
    else:
        db = sqlite3.connect(os.path.join(server.data, "tandem.db"))
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        db.close()
    print(f"     {ctx.args.rounds} rounds, {len(acked)} acknowledged logs, {lost} missing or different; "
          f"integrity_check: {integrity}")
    check(lost == 0, "every acknowledged log must survive with identical content")
    check(integrity.startswith("ok"), "the database must pass integrity_check")


def wait_job(server, job_id, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, job, _ = server.api("GET", f"/v1/preview/training-jobs/{job_id}")
        if status == 200 and job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.25)
    raise Failed(f"job {job_id} did not end within {timeout} s")


def events(server, job_id):
    out, after = [], None
    while True:
        path = f"/v1/preview/training-jobs/{job_id}/events?limit=100" + (f"&after={after}" if after else "")
        status, page, _ = server.api("GET", path)
        check(status == 200, f"events answered {status}: {page}")
        out += page["data"]
        if not page["has_more"]:
            return out
        after = page["data"][-1]["id"]


@test("R6", "kill -9 during a training job")
def r6(ctx):
    server = ctx.server()
    model = create_model(server)
    outcomes = {}
    for _ in range(ctx.args.rounds):
        groups = rollout_groups(server)
        status, job, _ = server.api("POST", "/v1/preview/training-jobs", {
            "model_id": model["id"], "trajectory_groups": groups, "experimental_config": {"learning_rate": 1e-4}})
        check(status == 200, f"job creation answered {status}: {job}")
        time.sleep(random.uniform(0.2, 4.0))
        server.kill9()
        server = server.restart()
        ctx.servers.append(server)
        started = time.monotonic()
        ended = wait_job(server, job["id"])
        outcomes[ended["status"]] = outcomes.get(ended["status"], 0) + 1
        evs = events(server, job["id"])
        ids = [e["id"] for e in evs]
        check(len(ids) == len(set(ids)), f"duplicate events: {ids}")
        check(evs and evs[0]["type"] == "training_started", "events must begin with training_started")
        check(evs[-1]["type"] in ("training_ended", "training_failed"), f"last event {evs[-1]['type']}")
        ctx.note(f"job ended {ended['status']} {time.monotonic() - started:.1f} s after the restart")
    status, cps, _ = server.api("GET", f"/v1/preview/models/{model['id']}/checkpoints?limit=100")
    steps = [c["step"] for c in cps["data"]]
    for step in steps:
        name = f"wandb-artifact:///{model['entity']}/{model['project']}/{model['name']}:step{step}"
        status, v, _ = server.api("POST", "/v1/chat/completions", chat_body(model=name, max_tokens=2))
        check(status == 200, f"checkpoint step {step} does not serve: {status} {v}")
    print(f"     {ctx.args.rounds} rounds: jobs {outcomes}; checkpoints {steps} all serve")


@test("R7", "SIGTERM with streams and a job running")
def r7(ctx):
    server = ctx.server()
    model = create_model(server)
    groups = rollout_groups(server)
    status, job, _ = server.api("POST", "/v1/preview/training-jobs", {"model_id": model["id"],
                                                                     "trajectory_groups": groups})
    check(status == 200, f"job creation answered {status}")
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(stream_chat(server, chat_body(
        "Tell a story.", max_tokens=48, seed=i)))) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=60)
    except Exception:
        raise Failed("the server did not exit within 60 s of SIGTERM")
    for t in threads:
        t.join()
    server.log.close()
    done = sum(1 for s, _, d in results if s == 200 and d)
    after = server.restart()
    ctx.servers.append(after)
    status, j, _ = after.api("GET", f"/v1/preview/training-jobs/{job['id']}")
    ended = wait_job(after, job["id"])
    print(f"     exit code {code}; {done} of {len(results)} streams finished with [DONE]; the job was {j['status']} "
          f"after the restart and ended {ended['status']}")
    check(code == 0, "SIGTERM must end the server with exit code 0")
    check(done == len(results), "every running stream must be drained to [DONE]")
    check(ended["status"] == "succeeded", "the job must be persisted and finish after the restart")


SCHEMATHESIS_VERSION = "4.32.5"
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def schemathesis():
    """schemathesis (pinned) in a virtualenv of its own under target/, made once (it needs Python
    3.11 or newer: this interpreter if it is, else the newest python3.1x found)."""
    venv = os.path.join(REPO, "target", "stvenv")
    marker = os.path.join(venv, f".ok-{SCHEMATHESIS_VERSION}")
    if not os.path.exists(marker):
        python = sys.executable if sys.version_info >= (3, 11) else next(
            (p for p in ("python3.13", "python3.12", "python3.11")
             if subprocess.run([p, "--version"], capture_output=True).returncode == 0), None)
        if python is None:
            raise NotImplementedError("schemathesis needs Python 3.11 or newer, and none was found")
        subprocess.run([python, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", f"schemathesis=={SCHEMATHESIS_VERSION}"], check=True)
        open(marker, "w").close()
    return os.path.join(venv, "bin", "schemathesis")


@test("R8", "schemathesis against the OpenAPI document")
def r8(ctx):
    exe = schemathesis()
    # A short context keeps each generated chat (whose default max_tokens fills the context) short.
    server = ctx.server(["--max-model-len", "512"])
    bob = server.new_key("bob")
    work = tempfile.mkdtemp(prefix="tandem-r8-")
    with open(os.path.join(work, "wfc.yaml"), "w") as f:
        f.write("auth:\n"
                f"  - {{name: alice, fixedHeaders: [{{name: Authorization, value: 'Bearer {KEY}'}}]}}\n"
                f"  - {{name: bob, fixedHeaders: [{{name: Authorization, value: 'Bearer {bob}'}}]}}\n")
    # Two identities as peers: object_level_authorization replays each one's reads as the other.
    # A schema-valid request may still be refused for what no schema states (a context length, a
    # trajectory without logprobs, an unknown dataset): 400/422 count as accepting it. The nested
    # trajectory schemas are large by nature (data_too_large). ensure_resource_availability is
    # left out: the stateful phase creates an object as one peer and reads it as the other, and
    # the 404 it gets is this suite's own rule (R9), not a lost object.
    with open(os.path.join(work, "schemathesis.toml"), "w") as f:
        f.write('suppress-health-check = ["data_too_large"]\n'
                '[auth.wfc]\npath = "wfc.yaml"\npeers = ["alice", "bob"]\n'
                '[checks]\npositive_data_acceptance.expected-statuses = '
                '["2xx", "3xx", "400", "401", "403", "404", "409", "422", "429"]\n'
                '[phases.stateful]\nmax-steps = 10\n')
    # Binary bodies (the Tinker area's protobuf `forward_backward`, a checkpoint's tar import) go
    # as drawn: the server must refuse what does not decode with a 4xx, never a 5xx.
    with open(os.path.join(work, "st_hooks.py"), "w") as f:
        f.write("import schemathesis\n\n"
                "@schemathesis.serializer('application/x-protobuf', 'application/x-tar')\n"
                "def raw(ctx, value):\n"
                "    return value if isinstance(value, bytes) else str(value).encode()\n")
    report = os.path.join(work, "report.json")
    started = time.monotonic()
    run = subprocess.run([exe, "run", f"{server.url}/openapi.json", "-n", "1000", "--max-time", str(ctx.args.st_seconds),
                          "--seed", "1",
                          "-w", "2", "--request-timeout", "120", "--exclude-checks", "ensure_resource_availability",
                          "--report", "json", "--report-json-path", report],
                         cwd=work, capture_output=True, text=True,
                         env={**os.environ, "SCHEMATHESIS_HOOKS": "st_hooks", "PYTHONPATH": work})
    took = time.monotonic() - started
    with open(report) as f:
        result = json.load(f)
    cases = result["test_cases"]
    failures = result.get("failures", [])
    errors = result.get("errors", [])
    print(f"     schemathesis {SCHEMATHESIS_VERSION}: {cases['generated']} cases over "
          f"{result['operations']['tested']} of {result['operations']['total']} operations in {took:.0f} s, "
          f"{cases.get('with_failures', 0)} failing, {cases.get('errored', 0)} errored; exit {run.returncode}")
    for fail in failures:
        print(f"     {fail['code']} {fail['title']}: {fail['count']} in {', '.join(fail['operations'][:5])}")
    for err in errors[:5]:
        print(f"     error: {json.dumps(err)[:300]}")
    five_xx = len(re.findall(r" 5\d\d ", open(server.log_path, errors="replace").read()))
    check(cases["generated"] >= 10_000 or ctx.args.st_seconds < 300, "at least 10,000 cases")
    check(not failures, "no check may fail (5xx, schema violations, cross-identity reads):\n" + run.stdout[-4000:])
    check(not errors, "no operation may error:\n" + run.stdout[-4000:])
    check(result["operations"]["tested"] == result["operations"]["total"], "every operation must be tested")
    check(run.returncode == 0, "schemathesis must exit 0")
    ctx.note(f"server log lines mentioning a 5xx status: {five_xx}")


def every_route(model_id, log_id, job_id, dataset_id, checkpoint_steps="1"):
    """(method, path, body) of every authenticated route, with these objects' ids."""
    return [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", chat_body()),
        ("POST", "/tokenize", {"prompt": "hi"}),
        ("POST", "/detokenize", {"tokens": [1, 2]}),
        ("GET", "/metrics", None),
        ("POST", "/v1/preview/models", {"project": "p", "name": "x", "base_model": BASE}),
        ("GET", "/v1/preview/models", None),
        ("GET", f"/v1/preview/models/{model_id}", None),
        ("DELETE", f"/v1/preview/models/{model_id}", None),
        ("GET", f"/v1/preview/models/{model_id}/checkpoints", None),
        ("DELETE", f"/v1/preview/models/{model_id}/checkpoints", {"steps": [int(checkpoint_steps)]}),
        ("POST", f"/v1/preview/models/{model_id}/log", {"split": "val", "trajectory_groups": []}),
        ("GET", f"/v1/preview/models/{model_id}/logs", None),
        ("GET", f"/v1/preview/models/{model_id}/logs/{log_id}", None),
        ("POST", "/v1/preview/datasets?project=p&name=d", None),
        ("GET", "/v1/preview/datasets", None),
        ("GET", f"/v1/preview/datasets/{dataset_id}", None),
        ("DELETE", f"/v1/preview/datasets/{dataset_id}", None),
        ("POST", "/v1/preview/sft-training-jobs", {"model_id": model_id,
                                                   "training_data_url": "wandb-artifact:///x/p/d:v0"}),
        ("POST", "/v1/preview/training-jobs", {"model_id": model_id, "trajectory_groups": []}),
        ("GET", f"/v1/preview/training-jobs/{job_id}", None),
        ("POST", f"/v1/preview/training-jobs/{job_id}/cancel", None),
        ("GET", f"/v1/preview/training-jobs/{job_id}/events", None),
    ]


@test("R9", "cross-tenant matrix")
def r9(ctx):
    server = ctx.server()
    bob = server.new_key("bob")
    model = create_model(server, name="alice-model")
    status, log, _ = server.api("POST", f"/v1/preview/models/{model['id']}/log", {
        "split": "val", "trajectory_groups": [{"trajectories": [{"reward": 1.0, "messages_and_choices": []}]}]})
    check(status == 200, f"log answered {status}: {log}")
    status, ds, _ = server.api("POST", "/v1/preview/datasets?project=rel&name=alice-data",
                               raw_body=b'{"messages": [{"role": "user", "content": "a"}, '
                                        b'{"role": "assistant", "content": "b"}]}\n')
    check(status == 200, f"dataset answered {status}: {ds}")
    status, job, _ = server.api("POST", "/v1/preview/training-jobs", {"model_id": model["id"],
                                                                     "trajectory_groups": rollout_groups(server)})
    check(status == 200, f"job answered {status}: {job}")
    wait_job(server, job["id"])
    before = {p: server.api("GET", p)[1] for p in (f"/v1/preview/models/{model['id']}",
                                                 f"/v1/preview/models/{model['id']}/checkpoints",
                                                 f"/v1/preview/models/{model['id']}/logs")}
    # Bob calls every route that names one of Alice's objects, and chats on her model's name.
    bad = []
    named = [r for r in every_route(model["id"], log["id"], job["id"], ds["id"])
             if any(x in r[1] or (r[2] and x in json.dumps(r[2])) for x in (model["id"], log["id"], job["id"], ds["id"]))]
    alias = f"wandb-artifact:///{model['entity']}/{model['project']}/{model['name']}"
    named += [("POST", "/v1/chat/completions", chat_body(model=alias)),
              ("POST", "/v1/chat/completions", chat_body(model=alias + ":step1")),
              ("POST", "/tokenize", {"model": alias, "prompt": "hi"}),
              ("POST", "/v1/preview/sft-training-jobs", {
                  "model_id": create_model(server, key=bob)["id"], "training_data_url": ds["url"]})]
    for method, path, body in named:
        status, v, _ = server.api(method, path, body, key=bob)
        if status != 404:
            bad.append((method, path, status, v))
    after = {p: server.api("GET", p)[1] for p in before}
    # Bob's lists never show Alice's objects.
    leaks = []
    for path in ("/v1/models", "/v1/preview/models", "/v1/preview/datasets"):
        _, v, _ = server.api("GET", path, key=bob)
        text = json.dumps(v)
        leaks += [f"{path} shows {x}" for x in (model["id"], model["name"], ds["id"], "alice-data") if x in text]
    print(f"     {len(named)} calls by another entity naming {model['entity']}'s objects: "
          f"{len(named) - len(bad)} answered 404; {len(leaks)} list leaks")
    for b in bad:
        print(f"     not 404: {b}")
    check(not bad, "every call naming another entity's object must be a 404")
    check(after == before, "the owner's data must be unchanged")
    check(not leaks, f"lists leaked: {leaks}")


@test("R10", "auth matrix")
def r10(ctx):
    server = ctx.server()
    revoked = server.new_key("carol")
    listing = subprocess.run([server.binary, "keys", "list", "--data-dir", server.data], capture_output=True,
                             text=True).stdout
    key_id = next(ln.split()[0] for ln in listing.splitlines() if " carol " in ln)
    subprocess.run([server.binary, "keys", "revoke", key_id, "--data-dir", server.data], capture_output=True,
                   check=True)
    fake = str(uuid.uuid4())
    credentials = {"none": False, "malformed": "", "unknown": "tk_" + uuid.uuid4().hex, "revoked": revoked}
    bad = []
    routes = every_route(fake, fake, fake, fake)
    for name, key in credentials.items():
        for method, path, body in routes:
            headers = {"Authorization": "Basic dXNlcjpwYXNz"} if name == "malformed" else None
            status, v, h = server.api(method, path, body, key=False if name in ("none", "malformed") else key,
                                      headers=headers)
            if status != 401 or (h.get("WWW-Authenticate") or "").split()[0:1] != ["Bearer"]:
                bad.append((name, method, path, status, h.get("WWW-Authenticate")))
    public = [(p, server.api("GET", p, key=False)[0]) for p in ("/health", "/v1/health", "/v1/system-check")]
    server.kill9()
    secrets = [revoked, credentials["unknown"], KEY]
    with open(server.log_path, errors="replace") as f:
        log = f.read()
    with open(os.path.join(server.data, "tandem.db"), "rb") as f:
        db = f.read()
    leaked = [s for s in secrets if s in log or s.encode() in db]
    print(f"     {len(routes) * len(credentials)} calls without a valid key: {len(routes) * len(credentials) - len(bad)} "
          f"were 401 with WWW-Authenticate: Bearer; public routes {public}; keys found in logs or database: {len(leaked)}")
    for b in bad[:10]:
        print(f"     wrong: {b}")
    check(not bad, "every route but the public ones must answer 401 with WWW-Authenticate: Bearer")
    check(all(s == 200 for _, s in public), "/health and /v1/system-check need no key")
    check(not leaked, "no key may appear in the logs or the database")


@test("R11", "pagination while items are appended")
def r11(ctx):
    server = ctx.server()
    model = create_model(server)
    path = f"/v1/preview/models/{model['id']}/logs"
    posted = []

    def append(n):
        for i in range(n):
            status, v, _ = server.api("POST", f"/v1/preview/models/{model['id']}/log", {
                "split": "train", "trajectory_groups": [{"trajectories": [{"reward": float(i)}]}]})
            if status == 200:
                posted.append(v["id"])

    append(30)
    report = []
    for limit in (1, 20, 100):
        first = list(posted)
        writer = threading.Thread(target=append, args=(40,))
        writer.start()
        seen, after = [], None
        while True:
            status, page, _ = server.api("GET", f"{path}?limit={limit}" + (f"&after={after}" if after else ""))
            check(status == 200, f"page answered {status}: {page}")
            seen += [x["id"] for x in page["data"]]
            if not page["has_more"]:
                if writer.is_alive():
                    writer.join()
                    after = seen[-1] if seen else None
                    continue
                break
            after = page["data"][-1]["id"]
        writer.join()
        check(len(seen) == len(set(seen)), f"limit {limit}: an item came twice")
        check(seen == [i for i in posted if i in set(seen)], f"limit {limit}: items out of order")
        check(set(first) <= set(seen), f"limit {limit}: an item that existed before paging was skipped")
        report.append(f"limit {limit}: {len(seen)} items once each, in order")
    wrong = [(lim, server.api("GET", f"{path}?limit={lim}")[0]) for lim in ("0", "-1", "101", "x", "1.5")]
    print(f"     {'; '.join(report)}; bad limits {wrong}")
    check(all(s == 422 for _, s in wrong), "an out-of-range limit must be a 422")


FUZZ_TARGETS = ["chat_request", "trajectory_groups", "chat_template", "gguf_header"]


@test("R12", "fuzzing (cargo fuzz) smoke run")
def r12(ctx):
    fuzz_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fuzz")
    if subprocess.run(["cargo", "fuzz", "--version"], capture_output=True).returncode != 0:
        raise NotImplementedError("cargo-fuzz is not installed (cargo install cargo-fuzz)")
    env = {**os.environ, "RUSTC_BOOTSTRAP": "1"}
    for target in FUZZ_TARGETS:
        started = time.monotonic()
        run = subprocess.run(["cargo", "fuzz", "run", target, "--", f"-max_total_time={ctx.args.fuzz_seconds}",
                              "-rss_limit_mb=4096", "-max_len=65536", "-timeout=10"],
                             cwd=fuzz_dir, env=env, capture_output=True, text=True)
        runs = re.findall(r"Done (\d+) runs", run.stderr)
        print(f"     {target}: {runs[-1] if runs else '?'} runs in {time.monotonic() - started:.0f} s, "
              f"exit {run.returncode}")
        check(run.returncode == 0, f"{target} found a crash, a hang or a leak:\n{run.stderr[-3000:]}")


# --- driver ------------------------------------------------------------------------------------


@test("R13", "one tenant saturates inference: slots, streams, long prompts, heavy reads")
def r13(ctx):
    fair_shares.r13(ctx, check)


@test("R14", "one tenant saturates training: the job cap, a long job, abandoned merges")
def r14(ctx):
    fair_shares.r14(ctx, check, rss_mib)


@test("R15", "PostgreSQL stopped under logs, jobs, reads and chats")
def r15(ctx):
    outages.r15(ctx, sys.modules[__name__], outage_s=ctx.args.outage_seconds)


@test("R16", "the S3 blob store unreachable during a publish and a first read")
def r16(ctx):
    outages.r16(ctx, sys.modules[__name__])


@test("R17", "the data directory's disk fills up")
def r17(ctx):
    outages.r17(ctx, sys.modules[__name__])


class Context:
    def __init__(self, args):
        self.args = args
        self.servers = []
        self.notes = []

    def server(self, extra=()):
        if self.args.database_url:
            # A restarted process waits out its predecessor's lease on a shared database: 2 s here.
            extra = [*extra, "--database-url", self.args.database_url, "--job-lease-seconds", "2"]
        s = Server(self.args.binary, self.args.model, KEY, extra, prefix="tandem-rel-")
        self.servers.append(s)
        return s

    def note(self, text):
        self.notes.append(text)

    def close(self):
        for s in self.servers:
            if s.proc.poll() is None:
                s.kill9()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--only", default="", help="comma-separated ids, e.g. R2,R3")
    p.add_argument("--soak-minutes", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=20, help="kill -9 rounds of R5 and R6")
    p.add_argument("--database-url", default=None,
                   help="run every server on this database (postgres://...; make reliability-postgres)")
    p.add_argument("--outage-seconds", type=float, default=12.0, help="how long R15 stops PostgreSQL")
    p.add_argument("--moto-python", default=None, help="a Python with moto[server], for R16")
    p.add_argument("--fuzz-seconds", type=int, default=60, help="per cargo-fuzz target in R12")
    p.add_argument("--st-seconds", type=int, default=300,
                   help="schemathesis time budget in R8 (300 s: more than 10,000 cases here)")
    args = p.parse_args()
    only = {x.strip().upper() for x in args.only.split(",") if x.strip()}
    passed, failed, missing = [], [], []
    for rid, title, fn in TESTS:
        if only and rid not in only:
            continue
        print(f"---- {rid} {title}", flush=True)
        ctx = Context(args)
        started = time.monotonic()
        try:
            fn(ctx)
            passed.append(rid)
            print(f"PASS {rid} ({time.monotonic() - started:.0f} s)", flush=True)
        except NotImplementedError as e:
            missing.append(rid)
            print(f"MISSING {rid}: {e}", flush=True)
        except Exception as e:
            failed.append(rid)
            print(f"FAIL {rid} ({time.monotonic() - started:.0f} s): {type(e).__name__}: {e}", flush=True)
            for s in ctx.servers[-1:]:
                tail = s.log_tail(10).strip()
                if tail:
                    print(f"     server log:\n{tail}")
        finally:
            for n in ctx.notes[-5:]:
                print(f"     {n}")
            ctx.close()
    print(f"reliability: passed {passed}, failed {failed}, not built {missing}")
    return 1 if failed else 0


if __name__ == "__main__":
    finish(main())
