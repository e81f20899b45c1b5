"""R13 and R14 (issue 32): one tenant saturates one resource within every documented limit while
a victim of another entity works beside it. The attacks and measurements are bench/fairness.py's;
these add the pass criteria of docs/reliability.md. Standard library only."""

import json
import os
import statistics
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import fairness  # noqa: E402

MAX_TTFT_S = 1.0
MIN_DECODE_SHARE = 0.4
MAX_HEALTH_MS = 100.0


def heavy_log(server, key, mib):
    """A model of `key`'s entity with one trajectory log of about `mib` MiB; returns the paths of
    the log and of the model's history."""
    model = fairness.call(server, key, "POST", "/v1/preview/models",
                          {"project": "heavy", "name": f"h-{uuid.uuid4().hex[:6]}", "base_model": fairness.MODEL})
    text = "lorem ipsum " * (1 << 16)  # 768 KiB
    groups = [{"trajectories": [{"reward": 1.0, "messages_and_choices": [{"role": "user", "content": text}]}]}
              for _ in range(int(mib * 1024 / 768))]
    log = fairness.call(server, key, "POST", f"/v1/preview/models/{model['id']}/log",
                        {"split": "train", "trajectory_groups": groups})
    return f"/v1/preview/models/{model['id']}/logs/{log['id']}", f"/v1/preview/models/{model['id']}/history"


def read_forever(server, key, path, stop, errors):
    while not stop.is_set():
        try:
            conn = fairness.http.client.HTTPConnection(server.host, server.port, timeout=600)
            conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
            r = conn.getresponse()
            r.read()
            conn.close()
        except (OSError, fairness.http.client.HTTPException) as e:
            if not stop.is_set():  # the server stops once the test has its figures
                errors.append(repr(e))
            return
        if r.status not in (200, 429):
            errors.append(r.status)
        if r.status == 429:
            time.sleep(0.05)


def r13(ctx, check):
    """The victim's first token, decode speed and /health while the attacker holds every decode
    slot, opens 32 streams, chains 8,000-token prompts, or re-reads a 60 MiB log six at a time."""
    server = ctx.server(["--max-num-seqs", "32"])
    victim = server.new_key("victim")
    fairness.stream_chat(server, victim, 8)
    attacks = dict(fairness.attacks(server, server.key, 600))
    log_path, _ = heavy_log(server, server.key, 60)
    failures = []
    for name in [*attacks, "60 MiB log reads"]:
        samples, _ = fairness.measure(server, victim, 5, 64)
        alone = statistics.median(s[1] for s in samples)
        stop, errors = threading.Event(), []
        if name in attacks:
            attack = fairness.Attack(*attacks[name]).__enter__()
        else:
            threads = [threading.Thread(target=read_forever, args=(server, server.key, log_path, stop, errors),
                                        daemon=True) for _ in range(6)]
            for t in threads:
                t.start()
        time.sleep(3)
        samples, health = fairness.measure(server, victim, 5, 64)
        health += [fairness.health_ms(server) for _ in range(15)]
        if name in attacks:
            attack.__exit__()
            errors = attack.errors
        stop.set()
        ttft = fairness.p95([s[0] for s in samples])
        share = statistics.median(s[1] for s in samples) / alone
        h95 = fairness.p95(health)
        print(f"     {name:<18} victim ttft p95 {ttft:5.2f} s, decode {share:4.2f}x alone, /health p95 "
              f"{h95:6.1f} ms, attacker errors {len(errors)}")
        if ttft > MAX_TTFT_S or share < MIN_DECODE_SHARE or h95 > MAX_HEALTH_MS or errors:
            failures.append(name)
        while fairness.health_ms(server) > 50 or fairness.busy(server):
            time.sleep(1)
    check(not failures, f"under {failures}: the victim must see its first token within {MAX_TTFT_S} s (p95), "
          f"decode at >= {MIN_DECODE_SHARE}x alone, /health within {MAX_HEALTH_MS} ms, the attacker no error")


def r14(ctx, check, rss_mib):
    """Trainer time, the job cap, job-input checks and abandoned merges under one attacker
    (`rss_mib` is the suite's reader of a process's resident memory)."""
    server = ctx.server()
    victim = server.new_key("victim")
    failures = []

    # The job cap holds under 60 concurrent creations.
    model = fairness.call(server, server.key, "POST", "/v1/preview/models",
                          {"project": "cap", "name": "cap", "base_model": fairness.MODEL})
    group = {"trajectories": [fairness.trajectory(fairness.random.Random(i), 20, float(i)) for i in range(2)]}
    statuses = []

    def create():
        conn = fairness.http.client.HTTPConnection(server.host, server.port, timeout=600)
        conn.request("POST", "/v1/preview/training-jobs", json.dumps({"model_id": model["id"],
                     "trajectory_groups": [group]}), {"Authorization": f"Bearer {server.key}",
                                                      "Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        conn.close()
        statuses.append(r.status)

    threads = [threading.Thread(target=create) for _ in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jobs = fairness.call(server, server.key, "GET", f"/v1/preview/models/{model['id']}/training-jobs?limit=100")
    pending = [j for j in jobs["data"] if j["status"] in ("queued", "running")]
    accepted = statuses.count(200)
    print(f"     60 concurrent creations: {accepted} accepted, {statuses.count(429)} refused (429), "
          f"{len(pending)} queued or running now")
    if accepted > 16 or set(statuses) - {200, 429}:
        failures.append("job cap")
    for j in pending:
        fairness.call(server, server.key, "POST", f"/v1/preview/training-jobs/{j['id']}/cancel")
    while any(j["status"] in ("queued", "running") for j in fairness.call(
            server, server.key, "GET", f"/v1/preview/models/{model['id']}/training-jobs?limit=100")["data"]):
        time.sleep(0.5)

    # A long job of the attacker's: the victim's one-step job runs within about one of its steps.
    first, done, step, status = fairness.training_attack(server, victim, 16, 8, 400)
    print(f"     long training job: the victim's job stepped after {first:.1f} s ({first / step:.2f} attacker "
          f"steps of {step:.2f} s), ended after {done:.1f} s; the attacker's was {status} meanwhile")
    # One step, plus the claim (a notification, or the 1 s poll) and the victim's own preparation.
    if first > 1.5 * step + 2.0 or status != "running":
        failures.append("trainer time")

    # Abandoned merged exports: each merge runs to its end one at a time, whoever left.
    model = fairness.call(server, server.key, "POST", "/v1/preview/models",
                          {"project": "merge", "name": "m", "base_model": fairness.MODEL})
    job = fairness.call(server, server.key, "POST", "/v1/preview/training-jobs",
                        {"model_id": model["id"], "trajectory_groups": [group]})
    while fairness.job_status(server, server.key, job["id"]) not in ("succeeded", "failed", "cancelled"):
        time.sleep(0.2)
    pid, before = server.proc.pid, rss_mib(server.proc.pid)
    peak = before
    for _ in range(6):
        conn = fairness.http.client.HTTPConnection(server.host, server.port, timeout=600)
        conn.request("GET", f"/v1/preview/models/{model['id']}/checkpoints/1/merged?format=f32",
                     headers={"Authorization": f"Bearer {server.key}"})
        time.sleep(0.3)
        conn.close()
    ttfts = []
    for _ in range(10):
        ttfts.append(fairness.stream_chat(server, victim, 16)[0])
        peak = max(peak, rss_mib(pid))
    # The merges go on after their clients left, one after another: watch them for a minute.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        peak = max(peak, rss_mib(pid))
        time.sleep(0.5)
    grew = peak - before
    print(f"     6 merged exports abandoned after 0.3 s: RSS {before:.0f} MiB before, peak +{grew:.0f} MiB; "
          f"victim ttft p95 {fairness.p95(ttfts):.2f} s meanwhile")
    # One merge of the bundled model in f32 at a time (about 0.7 GB), not six.
    if grew > 1200 or fairness.p95(ttfts) > MAX_TTFT_S:
        failures.append("merged exports")

    check(not failures, f"failed: {failures}")
