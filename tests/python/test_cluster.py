"""tandem as a cluster on one machine: every record in PostgreSQL, checkpoints and datasets in a
shared blob store, one api node (`--role api`), two inference nodes (`--role inference`, the same
role: every serving node answers the whole API and serves inference itself) and two trainer nodes
(`--role trainer`), each process with its own data directory (its cache).

Usage: python test_cluster.py <tandem binary> <model gguf> <PostgreSQL admin URL> [file|s3 <moto python>]
                              [--router <vllm-router>]

With `s3`, the blob store is `s3://` on a local S3-compatible server (moto in server mode, run by
the given Python); otherwise `file://` on a temporary directory. A fresh database
`tandem_cluster_test` is made on the admin URL's server. Checks:

  roles           a trainer node answers /health and /metrics and nothing else; api nodes the API
  kill-trainer    `kill -9` of the trainer holding a job while it trains: the other trainer re-claims
                  it when the lease runs out and finishes it; the events have no duplicate, the
                  dead trainer wrote nothing after the restart, and exactly one terminal event ends them
  both-serve      the new checkpoint is served by every serving node right after `training_ended`
                  (the time from `training_ended` to both answers is printed)
  registry-drain  every node is in the registry (`GET /v1/nodes`); an api node's system check sees
                  the trainers; `tandem nodes drain trainer2` makes its /health 503 and the next job
                  goes to trainer1; `undrain` brings it back
  art-loop        OpenPipe ART's own client runs the RL loop (register, rollout, train, serve the new
                  step, SFT from a dataset file, delete checkpoints) through an api node, unchanged;
                  the dataset's bytes are in the blob store, not in the database
  router          (with `--router <vllm-router>`) vllm-router from PyPI in front of the three
                  serving nodes: the fields it adds, answers through it, session stickiness, and
                  first-token time with and without affinity (cluster_router.py)
  kill-api        `kill -9` of an inference node: the api node has every log it acknowledged and
                  serves the model's latest checkpoint

Prints 'cluster-<blob kind>: N passed, M failed'; exits non-zero on any failure.
"""

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_art  # noqa: E402  (sets ART's environment before importing it)
import cluster_router  # noqa: E402
from tandem_server import Server, finish, scratch, start_moto  # noqa: E402

KEY = test_art.KEY
BASE = test_art.BASE_MODEL
DB = "tandem_cluster_test"
LEASE_SECONDS = "2"
# sft-from-file uploads a dataset (kept in the blob store) through an api node, and a trainer reads it.
ART_STAGES = ("register", "rollout", "train", "serve-new-step", "sft-from-file", "cleanup")


def psql(url, sql):
    out = subprocess.run(["psql", url, "-Atqc", sql], capture_output=True, text=True, check=True)
    return out.stdout.strip()


class Cluster:
    def __init__(self, binary, model, db_url, blob_store):
        common = ["--database-url", db_url, "--blob-store", blob_store, "--job-lease-seconds", LEASE_SECONDS]
        self.nodes = []
        # The serving nodes: one `api`, two `inference` (the same role under its other name).
        self.api = [self._start(binary, model, common + ["--role", "api"], "api")] + [
            self._start(binary, model, common + ["--role", "inference"], f"inference{i}") for i in (1, 2)]
        self.trainers = [self._start(binary, model, common + ["--role", "trainer"], f"trainer{i}") for i in (1, 2)]

    def _start(self, binary, model, flags, name):
        node = Server(binary, model, KEY, flags + ["--node-name", name], prefix=f"tandem-{name}-")
        node.name = name
        self.nodes.append(node)
        return node

    def stop(self):
        for node in self.nodes:
            node.stop()


def events(node, job_id):
    out, after = [], ""
    while True:
        status, body, _ = node.api("GET", f"/v1/preview/training-jobs/{job_id}/events?limit=100{after}")
        assert status == 200, body
        out += body["data"]
        if not body["has_more"]:
            return out
        after = f"&after={body['last_id']}"


def wait_job(node, job_id, timeout=300):
    deadline = time.monotonic() + timeout
    while True:
        _, job, _ = node.api("GET", f"/v1/preview/training-jobs/{job_id}")
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"job still {job['status']} after {timeout}s"
        time.sleep(0.1)


def queue_rl_job(node, model_id, groups=6):
    """A job of several real groups (answers sampled from the base, rewards 0..3), so that it
    trains for several gradient steps."""
    trajectory_groups = []
    for g in range(groups):
        messages = [{"role": "user", "content": f"Count to {g + 3}, then say done."}]
        status, r, _ = node.api("POST", "/v1/chat/completions",
                                {"model": BASE, "messages": messages, "n": 4, "temperature": 1.0, "max_tokens": 48,
                                 "seed": g, "logprobs": True, "return_token_ids": True})
        assert status == 200, r
        trajectory_groups.append({"trajectories": [
            {"messages_and_choices": messages + [c], "reward": float(i)} for i, c in enumerate(r["choices"])]})
    status, job, _ = node.api("POST", "/v1/preview/training-jobs",
                              {"model_id": model_id, "trajectory_groups": trajectory_groups})
    assert status == 200, job
    return job


def check_roles(cluster, ctx):
    trainer = cluster.trainers[0]
    status, body, _ = trainer.api("GET", "/health")
    assert status == 200, body
    status, _, _ = trainer.api("GET", "/metrics")
    assert status == 200
    status, body, _ = trainer.api("GET", "/v1/models")
    assert status == 404 and "trainer node" in body["detail"], (status, body)
    for node in cluster.api:
        status, body, _ = node.api("GET", "/v1/models")
        assert status == 200 and body["data"][0]["id"] == BASE, body


def check_kill_trainer(cluster, ctx):
    api1 = cluster.api[0]
    status, model, _ = api1.api("POST", "/v1/preview/models",
                                {"project": "cluster", "name": "kill", "base_model": BASE, "return_existing": True})
    assert status == 200, model
    ctx["model"] = model
    job = queue_rl_job(api1, model["id"])
    # Wait until a trainer has started the job, then kill that one in its first step.
    deadline = time.monotonic() + 120
    while not events(api1, job["id"]):
        assert time.monotonic() < deadline, "the job never started training"
        time.sleep(0.05)
    owner = psql(ctx["db_url"], f"SELECT lease_owner FROM training_jobs WHERE id = '{job['id']}'")
    pid = int(re.search(r"pid (\d+)", owner).group(1))
    holder = next(t for t in cluster.trainers if t.proc.pid == pid)
    other = next(t for t in cluster.trainers if t is not holder)
    holder.kill9()
    killed_at = time.monotonic()
    done = wait_job(api1, job["id"])
    print(f"     killed {holder.name} (pid {pid}) mid-job; the job {done['status']} "
          f"{time.monotonic() - killed_at:.1f}s later (lease {LEASE_SECONDS}s)")
    assert done["status"] == "succeeded", done
    owner = psql(ctx["db_url"], f"SELECT lease_owner FROM training_jobs WHERE id = '{job['id']}'")
    assert f"pid {other.proc.pid}" in owner, (owner, other.proc.pid)
    evs = events(api1, job["id"])
    kinds = [e["type"] for e in evs]
    ids = [e["id"] for e in evs]
    assert len(set(ids)) == len(ids), "an event appears twice"
    assert kinds[0] == "training_started" and kinds[-1] == "training_ended", kinds
    assert sum(k in ("training_ended", "training_failed") for k in kinds) == 1, kinds
    assert "training_restarted" in kinds, kinds
    # After the last restart: one training_started, then exactly num_sequences gradient steps.
    last = len(kinds) - 1 - kinds[::-1].index("training_restarted")
    rerun = evs[last + 1:]
    assert rerun[0]["type"] == "training_started", [e["type"] for e in rerun]
    steps = [e for e in rerun if e["type"] == "gradient_step"]
    assert len(steps) == rerun[0]["data"]["num_sequences"], (len(steps), rerun[0]["data"])
    assert done["status"] == "succeeded" and [e["type"] for e in rerun][-1] == "training_ended"
    ctx["job"] = done
    ctx["ended"] = evs[-1]
    # The dead trainer is restarted, as an operator's supervisor would.
    cluster.trainers[cluster.trainers.index(holder)] = restarted = holder.restart()
    restarted.name = holder.name
    cluster.nodes.append(restarted)


def check_both_serve(cluster, ctx):
    model, step = ctx["model"], ctx["job"]["step"]
    # The checkpoint is addressed as ART does: the model's name and step.
    _, listed, _ = cluster.api[0].api("GET", f"/v1/preview/models/{model['id']}/checkpoints")
    assert [c["step"] for c in listed["data"]] == [step], listed
    name = f"wandb-artifact:///{model['entity']}/{model['project']}/{model['name']}:step{step}"
    body = {"model": name, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    started = time.monotonic()
    for node in cluster.api:
        status, r, _ = node.api("POST", "/v1/chat/completions", body)
        assert status == 200, (node.name, status, r)
        assert r["usage"]["completion_tokens"] > 0
    print(f"     step {step} served by all {len(cluster.api)} serving nodes {time.monotonic() - started:.2f}s after the test saw "
          "training_ended (each node caches it on the checkpoint's notice)")
    # Each api node holds its own cached copy now.
    for node in cluster.api:
        cached = os.path.join(node.data, "checkpoints", model["id"])
        assert os.path.isdir(cached) and os.listdir(cached), f"{node.name} has no cached copy"


def nodes_cli(ctx, *args):
    out = subprocess.run([ctx["binary"], "nodes", "--database-url", ctx["db_url"], *args],
                         capture_output=True, text=True, check=True)
    return out.stdout


def check_registry_and_drain(cluster, ctx):
    # Every node beats in the registry; an api node's system check counts the cluster's trainers.
    status, body, _ = cluster.api[0].api("GET", "/v1/nodes")
    assert status == 200, body
    alive = sorted((n["name"], n["role"]) for n in body["data"] if n["alive"])
    assert alive == [("api", "api"), ("inference1", "api"), ("inference2", "api"), ("trainer1", "trainer"),
                     ("trainer2", "trainer")], alive
    status, body, _ = cluster.api[0].api("GET", "/v1/nodes", key=False)
    assert status == 401, (status, body)
    status, body, _ = cluster.api[1].api("GET", "/v1/system-check")
    assert status == 200 and body["training_queue"]["success"], body
    # Drain trainer2: it says so on /health within a beat, and the next job goes to trainer1.
    drained, kept = cluster.trainers[1], cluster.trainers[0]
    # (A trainer2 killed earlier has a row of its own, gone, drained along with the live one.)
    assert re.match(r"draining [12] node", nodes_cli(ctx, "drain", "trainer2"))
    deadline = time.monotonic() + 15
    while drained.api("GET", "/health")[0] != 503:
        assert time.monotonic() < deadline, "the drain never reached trainer2"
        time.sleep(0.2)
    assert "drained (idle: safe to stop)" in nodes_cli(ctx, "list")
    job = queue_rl_job(cluster.api[0], ctx["model"]["id"], groups=2)
    assert wait_job(cluster.api[0], job["id"])["status"] == "succeeded"
    owner = psql(ctx["db_url"], f"SELECT lease_owner FROM training_jobs WHERE id = '{job['id']}'")
    assert f"pid {kept.proc.pid}" in owner, (owner, kept.proc.pid)
    nodes_cli(ctx, "undrain", "trainer2")
    deadline = time.monotonic() + 15
    while drained.api("GET", "/health")[0] != 200:
        assert time.monotonic() < deadline, "the undrain never reached trainer2"
        time.sleep(0.2)


def check_art_loop(cluster, ctx):
    # ART's own client, unchanged, through the api node (its stages need nothing else of a server).
    stages = [s for s in test_art.STAGES if s[0] in ART_STAGES]
    saved, test_art.STAGES[:] = list(test_art.STAGES), stages
    try:
        passed, failed = asyncio.run(test_art.run(cluster.api[0]))
    finally:
        test_art.STAGES[:] = saved
    assert failed == 0 and passed == len(ART_STAGES), f"ART: {passed} passed, {failed} failed"
    keys = psql(ctx["db_url"], "SELECT count(*) FROM datasets WHERE blob_key IS NOT NULL AND length(data) = 0")
    assert int(keys) >= 1, "the uploaded dataset should live in the blob store"


def check_kill_api(cluster, ctx):
    # What an api node acknowledged lives in the shared stores: after its kill -9, the other api
    # node has every log it took, and serves the model's latest checkpoint.
    doomed, survivor = cluster.api[1], cluster.api[0]
    model = ctx["model"]
    logged = []
    for i in range(5):
        groups = [{"trajectories": [{"reward": float(i), "messages_and_choices": [
            {"role": "user", "content": f"log {i}"}, {"role": "assistant", "content": "ok"}]}]}]
        status, body, _ = doomed.api("POST", f"/v1/preview/models/{model['id']}/log",
                                     {"split": "val", "trajectory_groups": groups})
        assert status == 200, body
        logged.append(body["id"])
    doomed.kill9()
    status, body, _ = survivor.api("GET", f"/v1/preview/models/{model['id']}/logs?limit=100")
    assert status == 200, body
    assert set(logged) <= {log["id"] for log in body["data"]}, "a log the killed node acknowledged is missing"
    name = f"wandb-artifact:///{model['entity']}/{model['project']}/{model['name']}"
    status, r, _ = survivor.api("POST", "/v1/chat/completions",
                                {"model": name, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2})
    assert status == 200, r


def check_router(cluster, ctx):
    cluster_router.check_router(ctx["router"], cluster, KEY, BASE)
    # ART's loop with its rollouts through the router (cache_aware) and its training API on the
    # api node: vllm-router forwards the client's Authorization only on the inference routes.
    router = cluster_router.Router(ctx["router"], [n.url for n in cluster.api], "cache_aware")

    async def via_router(art_ctx):
        # A user's one line after register(): the client is made on first use, from this URL.
        art_ctx.model.inference_base_url = router.url + "/v1"
        client = art_ctx.model.openai_client()
        assert str(client.base_url).startswith(router.url), client.base_url

    by_name = {s[0]: s for s in test_art.STAGES}
    stages = [by_name["register"], ("via-router", via_router, False, ("register",))] + [
        by_name[n] for n in ("rollout", "train", "serve-new-step")]
    saved, test_art.STAGES[:] = list(test_art.STAGES), stages
    try:
        passed, failed = asyncio.run(test_art.run(cluster.api[0]))
    finally:
        test_art.STAGES[:] = saved
        router.stop()
    assert failed == 0 and passed == len(stages), f"ART through vllm-router: {passed} passed, {failed} failed"


CHECKS = [("roles", check_roles), ("kill-trainer", check_kill_trainer), ("both-serve", check_both_serve),
          ("registry-drain", check_registry_and_drain), ("art-loop", check_art_loop), ("router", check_router),
          ("kill-api", check_kill_api)]


def main():
    args = sys.argv[1:]
    router = None
    if "--router" in args:
        at = args.index("--router")
        router = args[at + 1]
        del args[at:at + 2]
    binary, model, admin = args[0], args[1], args[2]
    kind = args[3] if len(args) > 3 else "file"
    psql(admin, f"DROP DATABASE IF EXISTS {DB}")
    psql(admin, f"CREATE DATABASE {DB}")
    db_url = admin.rsplit("/", 1)[0] + "/" + DB
    moto = None
    scratch_dir = scratch("tandem-cluster-")
    if kind == "s3":
        moto, moto_port = start_moto(args[4], "tandem-test")
        endpoint = f"http://127.0.0.1:{moto_port}"
        os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true"})
        blob_store = "s3://tandem-test/cluster"
    else:
        blob_store = f"file://{scratch_dir}/blobs"
    print(f"cluster: 1 api + 2 inference + 2 trainer nodes, PostgreSQL {DB}, blob store {blob_store}")
    passed = failed = 0
    cluster = None
    ctx = {"db_url": db_url, "binary": binary, "router": router}
    checks = [(name, fn) for name, fn in CHECKS if router or name != "router"]
    try:
        cluster = Cluster(binary, model, db_url, blob_store)
        for name, fn in checks:
            started = time.monotonic()
            try:
                fn(cluster, ctx)
                passed += 1
                print(f"ok   {name} ({time.monotonic() - started:.1f}s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {name} ({time.monotonic() - started:.1f}s)")
                traceback.print_exc()
                for node in cluster.nodes:
                    tail = node.log_tail(8).strip() if not node.log.closed else ""
                    if tail:
                        print(f"     {node.name} log:\n{tail}")
    except Exception:
        failed += 1
        traceback.print_exc()
    finally:
        if cluster:
            cluster.stop()
        if moto:
            moto.send_signal(signal.SIGTERM)
            moto.wait()
    print(f"cluster-{kind}: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    finish(main())
