"""The Tinker SDK (`tinker` 0.38.0, unchanged) against a cluster: every record in PostgreSQL,
checkpoints in a `file://` blob store, one api node (`--role api`, which trains nothing) and two
trainer nodes. The client talks to the api node only, with no session affinity.

Usage: python test_tinker_cluster.py <tandem binary> <model gguf> <PostgreSQL admin URL>

Checks:
  train-and-sample  a LoRA model is created, trained (forward_backward + optim_step) and sampled
                    (save_weights_and_get_sampling_client) through the api node; the session is
                    held by one trainer node (its row in tinker_sessions) and the other holds nothing
  kill-holder       save_state, one more step, then `kill -9` of the trainer holding the session:
                    the next call waits out the registry (the SDK retries the api node's 503) and
                    runs on the other trainer, which rebuilt the model from the saved state: its
                    `forward` logprobs equal those right after save_state (the unsaved step is
                    lost), training goes on (the loss falls), and the session's row names the
                    new node
  any-node-rest     the RestClient lists the run's checkpoints through the api node
  finish            leaving `with ServiceClient(...)` finishes the session on its new node: the row goes

Prints 'tinker-cluster: N passed, M failed'; exits non-zero on any failure.
"""

import os
import re
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tandem_server import Server, finish, scratch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import tinker  # noqa: E402
from tinker import types  # noqa: E402
from tinker_common import BASE, KEY, TOKENS, datum, logprobs, service  # noqa: E402

DB = "tandem_tinker_cluster_test"


def psql(url, sql):
    out = subprocess.run(["psql", url, "-Atqc", sql], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def holder_pid(ctx, session):
    node = psql(ctx["db_url"], f"SELECT node FROM tinker_sessions WHERE id = '{session}'")
    return int(re.search(r"pid (\d+)", node).group(1)) if node else None


def check_train_and_sample(ctx):
    sc = ctx["service"]
    tc = sc.create_lora_training_client(base_model=BASE, rank=8, seed=3).result()
    ctx["tc"] = tc
    losses = []
    for _ in range(3):
        out = tc.forward_backward([datum(weights=1.0)], "cross_entropy").result()
        losses.append(out.metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert losses[-1] < losses[0], losses
    session = tc.model_id.split(":train:")[0]
    ctx["session"] = session
    pid = holder_pid(ctx, session)
    holder = next(t for t in ctx["trainers"] if t.proc.pid == pid)
    ctx["holder"] = holder
    print(f"     session {session} held by {holder.name}; losses {[round(x, 3) for x in losses]}")
    sampler = tc.save_weights_and_get_sampling_client(name="step3")
    res = sampler.sample(prompt=types.ModelInput.from_ints(TOKENS[:6]), num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0, seed=1)).result()
    assert len(res.sequences) == 2 and all(s.tokens and s.logprobs for s in res.sequences), res


def check_kill_holder(ctx):
    tc, holder = ctx["tc"], ctx["holder"]
    other = next(t for t in ctx["trainers"] if t is not holder)
    ctx["state"] = tc.save_state("before-kill").result().path
    saved = logprobs(tc.forward([datum(weights=1.0)], "cross_entropy").result())
    tc.forward_backward([datum(weights=1.0)], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    moved = logprobs(tc.forward([datum(weights=1.0)], "cross_entropy").result())
    assert max(abs(a - b) for a, b in zip(saved, moved)) > 1e-3, "the unsaved step changed nothing"
    holder.kill9()
    killed = time.monotonic()
    resumed = logprobs(tc.forward([datum(weights=1.0)], "cross_entropy").result())
    took = time.monotonic() - killed
    diff = max(abs(a - b) for a, b in zip(saved, resumed))
    print(f"     killed {holder.name}; the next call ran on {other.name} {took:.1f}s later; "
          f"max |logprob - saved state's| = {diff:.2e}")
    assert diff < 1e-4, (saved[:4], resumed[:4])
    assert holder_pid(ctx, ctx["session"]) == other.proc.pid
    # Training goes on there (the optimizer's moments came back with the state).
    before = tc.forward_backward([datum(weights=1.0)], "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = tc.forward_backward([datum(weights=1.0)], "cross_entropy").result().metrics["loss:sum"]
    assert after < before, (before, after)


def check_any_node_rest(ctx):
    api = ctx["api"]
    rest = tinker.RestClient(base_url=f"http://{api.host}:{api.port}", api_key=f"tml-{KEY}")
    listed = rest.list_checkpoints(ctx["tc"].model_id).result()
    paths = [c.tinker_path for c in listed.checkpoints]
    assert ctx["state"] in paths, paths


def check_finish(ctx):
    ctx["service"].__exit__(None, None, None)
    ctx["service"] = None
    deadline = time.monotonic() + 10
    while psql(ctx["db_url"], f"SELECT count(*) FROM tinker_sessions WHERE id = '{ctx['session']}'") != "0":
        assert time.monotonic() < deadline, "the finished session's row stayed"
        time.sleep(0.1)


CHECKS = [("train-and-sample", check_train_and_sample), ("kill-holder", check_kill_holder),
          ("any-node-rest", check_any_node_rest), ("finish", check_finish)]


def main():
    binary, model, admin = sys.argv[1], sys.argv[2], sys.argv[3]
    psql(admin, f"DROP DATABASE IF EXISTS {DB}")
    psql(admin, f"CREATE DATABASE {DB}")
    db_url = admin.rsplit("/", 1)[0] + "/" + DB
    blobs = f"file://{scratch('tandem-tinker-cluster-')}/blobs"
    common = ["--database-url", db_url, "--blob-store", blobs]
    nodes, passed, failed = [], 0, 0
    try:
        def start(role, name):
            node = Server(binary, model, KEY, common + ["--role", role, "--node-name", name], prefix=f"tandem-{name}-")
            node.name = name
            nodes.append(node)
            return node

        api = start("api", "api")
        trainers = [start("trainer", f"trainer{i}") for i in (1, 2)]
        deadline = time.monotonic() + 30
        while psql(db_url, "SELECT count(*) FROM nodes WHERE role = 'trainer' AND address <> ''") != "2":
            assert time.monotonic() < deadline, "the trainers never beat in the registry"
            time.sleep(0.2)
        ctx = {"db_url": db_url, "api": api, "trainers": trainers, "service": service(api)}
        ctx["service"].__enter__()
        print(f"tinker-cluster: 1 api + 2 trainer nodes, PostgreSQL {DB}, blob store {blobs}")
        for name, fn in CHECKS:
            started = time.monotonic()
            try:
                fn(ctx)
                passed += 1
                print(f"ok   {name} ({time.monotonic() - started:.1f}s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {name} ({time.monotonic() - started:.1f}s)")
                traceback.print_exc()
                for node in nodes:
                    tail = node.log_tail(8).strip() if not node.log.closed else ""
                    if tail:
                        print(f"     {node.name} log:\n{tail}")
    except Exception:
        failed += 1
        traceback.print_exc()
    finally:
        for node in nodes:
            node.stop()
    print(f"tinker-cluster: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    finish(main())
