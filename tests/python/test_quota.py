"""Per-entity storage quotas end to end (`--storage-quota-mib`, `tandem quota`).

One server with a 2 MiB default quota and two entities, alice and bob:
- trajectory logs past alice's quota are a 403 with the contract's body, nothing of them is kept,
  a new model record is refused too, and bob's logs still land;
- the attack's cost: bob's log appends while alice floods the server with refused 1 MiB logs,
  against bob's alone (printed; no timing assert);
- an RL job whose checkpoint would pass the quota fails saying so, keeps no checkpoint and leaves
  no files; with `tandem quota set alice --mib 64` the same job succeeds;
- datasets refused past the quota, `--unlimited` and `--default` per entity, `tandem quota list`;
- deleting a model frees what it stored, and the counts survive a restart.

Usage: test_quota.py TANDEM_BINARY MODEL.gguf
"""

import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tandem_server  # noqa: E402

KEY = "quota-test-key"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
        print(f"FAIL {message}")


def quota_cli(server, *args):
    out = subprocess.run([server.binary, "quota", *args, "--data-dir", server.data], capture_output=True,
                         text=True, env={**os.environ, "TANDEM_STORAGE_QUOTA_MIB": "2"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def listed(server):
    """{entity: (used MiB, quota column, source)} from `tandem quota list`."""
    rows = quota_cli(server, "list").splitlines()[1:]
    return {r.split()[0]: (float(r.split()[1]), r.split()[2], r.split()[3]) for r in rows}


def new_model(server, key, name):
    status, m, _ = server.api("POST", "/v1/preview/models", {"project": "q", "name": name, "base_model": BASE}, key=key)
    assert status == 200, m
    return m


def log_body(kib):
    text = "lorem ipsum " * (kib * 1024 // 12)
    return {"split": "train", "trajectory_groups": [{"trajectories": [
        {"reward": 1.0, "messages_and_choices": [{"role": "user", "content": text}]}]}]}


def logs_past_the_quota(server, alice, bob):
    m = new_model(server, alice, "logs")
    accepted, refused = 0, None
    for _ in range(20):
        status, body, _ = server.api("POST", f"/v1/preview/models/{m['id']}/log", log_body(256), key=alice)
        if status != 200:
            refused = (status, body)
            break
        accepted += 1
    check(refused is not None and refused[0] == 403, f"a log past the quota is a 403: {refused}")
    detail = refused[1].get("detail", "") if refused and isinstance(refused[1], dict) else ""
    check(detail.startswith("storage quota exceeded: this entity stores") and "of its 2.0 MiB quota" in detail,
          f"the 403 says why, in FastAPI's shape: {refused}")
    check(6 <= accepted <= 8, f"about 2 MiB of 256 KiB logs were kept: {accepted}")
    _, logs, _ = server.api("GET", f"/v1/preview/models/{m['id']}/logs?limit=100", key=alice)
    check(len(logs["data"]) == accepted, f"nothing of the refused log is kept: {len(logs['data'])} of {accepted}")
    quota_cli(server, "set", "alice", "--mib", "1")  # below what she stores: no room at all
    status, body, _ = server.api("POST", "/v1/preview/models", {"project": "q", "name": "more", "base_model": BASE},
                                 key=alice)
    check(status == 403, f"a model record counts too (models by the million): {status} {body}")
    quota_cli(server, "set", "alice", "--default")
    b = new_model(server, bob, "logs")
    status, body, _ = server.api("POST", f"/v1/preview/models/{b['id']}/log", log_body(256), key=bob)
    check(status == 200, f"bob's log lands while alice is at her quota: {status} {body}")
    print(f"ok   logs: alice kept {accepted} logs of 256 KiB, the next was {refused[0]}")
    return m, b


def attack_cost(server, alice, bob, alice_model, bob_model):
    """Bob's small log appends alone; while four threads of alice send 1 MiB logs her quota
    refuses; and, for scale, while they send the same logs to a model that is not hers (a 404
    after the same parsing): the medians, and alice's refusals per second."""
    def bob_appends(n=30):
        times, statuses = [], []
        for _ in range(n):
            t = time.monotonic()
            status, _, _ = server.api("POST", f"/v1/preview/models/{bob_model['id']}/log", log_body(1), key=bob)
            times.append(time.monotonic() - t)
            statuses.append(status)
        return statistics.median(times) * 1000, statuses

    def during_flood(path):
        stop, refusals, big = threading.Event(), [], log_body(1024)

        def flood():
            while not stop.is_set():
                refusals.append(server.api("POST", path, big, key=alice)[0])

        threads = [threading.Thread(target=flood) for _ in range(4)]
        start = time.monotonic()
        for t in threads:
            t.start()
        try:
            median, statuses = bob_appends()
        finally:
            stop.set()
            for t in threads:
                t.join()
        check(all(s == 200 for s in statuses), f"every one of bob's appends lands during the flood: {statuses}")
        return median, refusals, len(refusals) / (time.monotonic() - start)

    alone, _ = bob_appends()
    over, refusals, rate = during_flood(f"/v1/preview/models/{alice_model['id']}/log")
    check(refusals and all(s == 403 for s in refusals), f"every one of alice's is refused: {set(refusals)}")
    missing, refusals, missing_rate = during_flood(f"/v1/preview/models/{bob_model['id']}/log")
    check(refusals and all(s == 404 for s in refusals), f"bob's model is a 404 to alice: {set(refusals)}")
    print(f"ok   attack: bob's log append median {alone:.1f} ms alone; {over:.1f} ms while alice sent "
          f"{rate:.0f} 1 MiB logs/s her quota refused; {missing:.1f} ms while she sent {missing_rate:.0f}/s "
          f"to a model not hers (the parsing alone)")


def rl_job(server, key, model_id, seed):
    return tandem_server.rl_step(server, model_id, "Is the sky blue? Answer yes or no.", seed, base=BASE, key=key,
                                 must_succeed=False)


def checkpoint_over_the_quota(server, alice, alice_logs):
    status, _, _ = server.api("DELETE", f"/v1/preview/models/{alice_logs['id']}", key=alice)
    check(status in (200, 204), f"deleting alice's model: {status}")
    used = listed(server)["alice"][0]
    check(used < 0.1, f"deleting the model freed its logs: alice uses {used} MiB")
    m = new_model(server, alice, "trained")
    job = rl_job(server, alice, m["id"], seed=3)
    message = job.get("error_message") or ""
    check(job["status"] == "failed" and message.startswith("storage quota exceeded"),
          f"a job whose checkpoint would pass the quota fails saying so: {job['status']} {message!r}")
    _, cps, _ = server.api("GET", f"/v1/preview/models/{m['id']}/checkpoints", key=alice)
    check(cps["data"] == [], f"no checkpoint is recorded: {cps}")
    files = os.path.join(server.data, "checkpoints", m["id"])
    left = os.listdir(files) if os.path.isdir(files) else []
    check(left == [], f"no checkpoint files are left: {left}")
    print(f"ok   checkpoint: the job failed with {message[:90]!r}...")
    quota_cli(server, "set", "alice", "--mib", "64")
    job = rl_job(server, alice, m["id"], seed=4)
    check(job["status"] == "succeeded", f"with alice's own 64 MiB the job succeeds: {job}")
    alice_row = listed(server)["alice"]
    check(alice_row[1] == "64.0" and alice_row[2] == "own" and alice_row[0] > 1.0,
          f"`tandem quota list` shows alice's own quota and her checkpoint: {alice_row}")
    print(f"ok   checkpoint: with --mib 64 the job succeeded; alice stores {alice_row[0]} MiB")
    return m


def datasets_and_overrides(server, alice, bob):
    row = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "%s"}]}\n'
    data = (row % ("x" * 1000)) * 1100  # about 1.1 MiB
    upload = lambda key: server.api("POST", "/v1/preview/datasets?project=q&name=d", raw_body=data.encode(),  # noqa: E731
                                    key=key, headers={"Content-Type": "text/plain"})
    status, body, _ = upload(bob)
    check(status == 200, f"bob's first dataset fits his 2 MiB: {status} {body}")
    status, body, _ = upload(bob)
    check(status == 403, f"bob's second does not: {status} {body}")
    quota_cli(server, "set", "bob", "--unlimited")
    status, body, _ = upload(bob)
    check(status == 200, f"bob without a quota: {status} {body}")
    quota_cli(server, "set", "bob", "--default")
    status, body, _ = upload(bob)
    check(status == 403, f"bob back on the default: {status} {body}")
    rows = listed(server)
    check(rows["bob"][2] == "default" and rows["bob"][1] == "2.0" and rows["bob"][0] > 2.0,
          f"bob above the default after --unlimited: {rows['bob']}")
    _, page, _ = server.api("GET", "/v1/preview/datasets", key=bob)
    for d in page["data"]:
        server.api("DELETE", f"/v1/preview/datasets/{d['id']}", key=bob)
    status, body, _ = upload(bob)
    check(status == 200, f"deleting bob's datasets made room: {status} {body}")
    print(f"ok   datasets: refused past the quota, --unlimited and --default per entity ({rows['bob'][0]} MiB)")


def main():
    binary, model = sys.argv[1], sys.argv[2]
    server = tandem_server.Server(binary, model, KEY, ["--storage-quota-mib", "2"], prefix="tandem-quota-")
    try:
        alice, bob = server.new_key("alice"), server.new_key("bob")
        alice_logs, bob_logs = logs_past_the_quota(server, alice, bob)
        attack_cost(server, alice, bob, alice_logs, bob_logs)
        checkpoint_over_the_quota(server, alice, alice_logs)
        datasets_and_overrides(server, alice, bob)
        before = listed(server)
        server.stop()
        server = server.restart()
        check(listed(server) == before, f"the counts survive a restart: {listed(server)} vs {before}")
    except Exception as e:  # noqa: BLE001
        FAILURES.append(repr(e))
        import traceback
        traceback.print_exc()
        print(server.log_tail())
    finally:
        server.stop()
    print(f"quota: {'FAILED ' + str(len(FAILURES)) if FAILURES else 'passed'}")
    tandem_server.finish(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
