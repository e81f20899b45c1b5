"""Fair shares under attack (issue 32): a victim key's time to first token and decode speed, alone
and while an attacker key of another entity saturates one resource within every documented
limit, side by side in one run on one server. Also `/health`'s latency during each attack and
the attacker's own throughput alone and beside the victim (work conservation).

    python bench/fairness.py target/release/tandem models/SmolLM2-135M-Instruct.Q4_1.gguf [--rounds 5]
        [--only 8000]   # one attack; TANDEM_TEST_LOG=tandem_engine::step=debug logs every step
        [--compare OLD_BINARY]   # the attacker alone on both builds, in turns (work conservation)

`--check` runs a short version for `make test` that asserts orderings, not times: the victim's
request (or small training job) finishes while the attacker's, started first, still runs.
Standard library only (tests/python/tandem_server.py starts the server).
"""

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from tandem_server import Server, finish  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def post(server, key, path, body, stream=False, timeout=600):
    """Opens a request; returns the response (read it yourself) and its connection."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    return conn.getresponse(), conn


def stream_chat(server, key, max_tokens, prompt="Write a long story about a lighthouse keeper."):
    """(time to first token, decode tokens per second after it, tokens) of one streamed chat."""
    t0 = time.monotonic()
    r, conn = post(server, key, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "ignore_eos": True, "stream": True, "temperature": 0.7, "seed": 1})
    assert r.status == 200, (r.status, r.read()[:300])
    first, n = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
            n += 1
            if first is None:
                first = time.monotonic()
    end = time.monotonic()
    conn.close()
    ttft = (first or end) - t0
    rate = (n - 1) / (end - first) if first and n > 1 and end > first else float("nan")
    return ttft, rate, n


def health_ms(server):
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("GET", "/health")
    conn.getresponse().read()
    conn.close()
    return (time.monotonic() - t0) * 1000


class Attack:
    """Runs `fire()` in `width` threads over and over until stopped; counts completion tokens."""

    def __init__(self, fire, width):
        self.fire, self.width, self.stop_flag, self.tokens, self.errors = fire, width, False, 0, []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(width)]

    def loop(self):
        while not self.stop_flag:
            try:
                n = self.fire()
                with self.lock:
                    self.tokens += n
            except Exception as e:  # noqa: BLE001 - reported, not raised from a thread
                self.errors.append(repr(e))
                time.sleep(0.2)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag = True


def completion_tokens(server, key, body, path="/v1/chat/completions"):
    r, conn = post(server, key, path, body)
    data = json.loads(r.read())
    conn.close()
    assert r.status == 200, (r.status, data)
    return data["usage"]["completion_tokens"]


def attacks(server, key, long_tokens, key2=None):
    rng = random.Random(7)
    # With a second attacker key: each attacking thread keeps to one of the two keys, in turn.
    local, turn = threading.local(), iter(range(1 << 30))

    def either_key():
        if not hasattr(local, "key"):
            local.key = (key, key2)[next(turn) % 2]
        return local.key

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me everything."}],
            "max_tokens": long_tokens, "ignore_eos": True, "temperature": 1.0}
    # OpenAI's most tools (128), each an alternative of the request's grammar under `auto`.
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Tool number {i}.", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"enum": ["c", "f"]}},
            "required": ["city"]}}} for i in range(128)]
    with_tools = {**chat, "tools": tools, "tool_choice": "auto", "ignore_eos": False}
    return {
        # One request holding every decode slot: n = 32 choices.
        "n=32 choices": (lambda: completion_tokens(server, key, {**chat, "n": 32}), 1),
        # 32 separate long streams (half the per-entity concurrency limit).
        "32 streams": (lambda: completion_tokens(server, key, chat), 32),
        # Long random prompts (no prefix-cache hit), one token each, two at a time, chained.
        "8000-token prompts": (lambda: completion_tokens(server, key, {
            "model": MODEL, "prompt": [rng.randrange(100, 40000) for _ in range(8000)], "max_tokens": 1},
            "/v1/completions"), 2),
        # 32 streams of `auto` with 128 tools: every token of theirs masked by a 128-way grammar.
        "32 streams, 128 tools": (lambda: completion_tokens(server, key, with_tools), 32),
        # 128-tool grammars compiled back to back (one token each): the compile's CPU.
        "128-tool compiles": (lambda: completion_tokens(server, key, {**with_tools, "max_tokens": 1}), 4),
        # Two attacking entities at once, 32 streams each: the victim's fair share is a third.
        **({"2 attackers x 32 streams": (lambda: completion_tokens(server, either_key(), chat), 64)} if key2 else {}),
    }


def call(server, key, method, path, body=None):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    r = conn.getresponse()
    data = json.loads(r.read() or b"null")
    conn.close()
    assert r.status == 200, (method, path, r.status, data)
    return data


def trajectory(rng, tokens, reward):
    """A scored rollout as ART sends it: token ids with the sampler's logprobs."""
    ids = [rng.randrange(100, 40000) for _ in range(tokens)]
    lp = {"token": "x", "logprob": -1.0, "bytes": [120], "top_logprobs": []}
    return {"reward": reward, "messages_and_choices": [
        {"role": "user", "content": "Tell me something."},
        {"finish_reason": "length", "index": 0, "message": {"role": "assistant", "content": "x"},
         "prompt_token_ids": [1, 2, 3], "token_ids": ids, "logprobs": {"content": [lp] * tokens}}]}


def queue_job(server, key, name, groups, per_group, tokens, seed, config=None):
    """A model of the key's entity and an RL job on it; returns the job's id."""
    rng = random.Random(seed)
    model = call(server, key, "POST", "/v1/preview/models", {"project": "fair", "name": name, "base_model": MODEL})
    trajectory_groups = [{"trajectories": [trajectory(rng, tokens, float(i % 3)) for i in range(per_group)]}
                         for _ in range(groups)]
    job = call(server, key, "POST", "/v1/preview/training-jobs",
               {"model_id": model["id"], "trajectory_groups": trajectory_groups, "experimental_config": config or {}})
    return job["id"]


def job_events(server, key, job_id):
    page = call(server, key, "GET", f"/v1/preview/training-jobs/{job_id}/events?limit=100")
    return page["data"]


def job_status(server, key, job_id):
    return call(server, key, "GET", f"/v1/preview/training-jobs/{job_id}")["status"]


def training_attack(server, victim, groups, trajectories, tokens, row_tokens=None):
    """The attacker's long RL job runs (rows of `row_tokens`: its gradient steps' size); the
    victim queues a one-step job. Returns the victim's wait for its first gradient step and its
    whole job, and the attacker's median step time and status when the victim's job ended."""
    config = {"packed_sequence_length": row_tokens} if row_tokens else {}
    attacker_job = queue_job(server, server.key, "long", groups, trajectories, tokens, seed=11, config=config)
    while not any(e["type"] == "gradient_step" for e in job_events(server, server.key, attacker_job)):
        time.sleep(0.1)
    t0 = time.monotonic()
    victim_job = queue_job(server, victim, "small", 1, 2, 40, seed=12)
    first_step = None
    while True:
        status = job_status(server, victim, victim_job)
        if first_step is None and any(e["type"] == "gradient_step" for e in job_events(server, victim, victim_job)):
            first_step = time.monotonic() - t0
        if status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.05)
    done = time.monotonic() - t0
    assert status == "succeeded", status
    attacker_status = job_status(server, server.key, attacker_job)
    steps = [e["data"]["step_seconds"] for e in job_events(server, server.key, attacker_job)
             if e["type"] == "gradient_step" and "step_seconds" in e["data"]]
    call(server, server.key, "POST", f"/v1/preview/training-jobs/{attacker_job}/cancel")
    while job_status(server, server.key, attacker_job) not in ("succeeded", "failed", "cancelled"):
        time.sleep(0.2)
    return first_step or done, done, statistics.median(steps), attacker_status


def measure(server, victim, rounds, victim_tokens):
    samples = [stream_chat(server, victim, victim_tokens) for _ in range(rounds)]
    health = [health_ms(server) for _ in range(5)]
    return samples, health


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def report(name, samples, health, alone):
    ttft = [s[0] for s in samples]
    rate = statistics.median(s[1] for s in samples)
    print(f"{name:<20} ttft p50 {statistics.median(ttft):6.3f} s  p95 {p95(ttft):6.3f} s  "
          f"decode {rate:6.1f} tok/s ({rate / alone:4.2f}x alone)  /health p95 {p95(health):7.1f} ms")


def bench(args):
    server = Server(args.binary, args.model, "attacker-key", extra=["--max-num-seqs", "32"])
    try:
        victim = server.new_key("victim")
        attacker2 = server.new_key("attacker-two")
        stream_chat(server, victim, 8)  # warm up
        samples, health = measure(server, victim, args.rounds, args.victim_tokens)
        alone = statistics.median(s[1] for s in samples)
        print(f"victim: {args.victim_tokens} tokens a stream, {args.rounds} rounds; attacker: another entity")
        report("alone", samples, health, alone)
        for name, (fire, width) in attacks(server, server.key, args.long_tokens, attacker2).items():
            if args.only and args.only not in name:
                continue
            # The victim alone again right before each attack: a shared VM's speed drifts.
            samples, health = measure(server, victim, args.rounds, args.victim_tokens)
            alone = statistics.median(s[1] for s in samples)
            report("  alone before it", samples, health, alone)
            # The attacker alone first (its throughput without the victim), then with it.
            # Tokens served (prompt and generated, from /metrics) per second; the victim's own
            # are subtracted beside it (its prompts are ~40 tokens).
            with Attack(fire, width) as a:
                time.sleep(args.settle)
                t0, n0 = time.monotonic(), served_tokens(server)
                time.sleep(args.window)
                solo = (served_tokens(server) - n0) / (time.monotonic() - t0)
                t0, n0 = time.monotonic(), served_tokens(server)
                samples, health = measure(server, victim, args.rounds, args.victim_tokens)
                mine = sum(s[2] + 40 for s in samples)
                shared = (served_tokens(server) - n0 - mine) / (time.monotonic() - t0)
            report(name, samples, health, alone)
            print(f"{'':<20} attacker tokens served/s: alone {solo:7.1f}, beside the victim {shared:7.1f}"
                  f"  errors {len(a.errors)}")
            # Let the attacker's requests drain before the next attack.
            while health_ms(server) > 50 or busy(server):
                time.sleep(1)
        if args.only:
            return
        # Trainer time: the attacker's long RL job runs; the victim's one-step job waits for
        # at most one of its gradient steps (the time-slicing bound), not for the whole job.
        first, done, step, status = training_attack(server, victim, args.job_groups, 8, 400)
        print(f"{'long training job':<20} victim's job: first step after {first:5.1f} s, done after {done:5.1f} s;"
              f" attacker's step {step:5.2f} s (median): waited {first / step:4.2f} attacker steps;"
              f" attacker {status} meanwhile")
    finally:
        server.stop()


def compare(args):
    """Work conservation: the attacker alone (no victim) on this build and on `--compare`'s (a
    build from before the fair scheduler), tokens served per second over the same windows,
    the two servers taking turns so that a drifting VM's speed hits both alike."""
    results = {}
    names = [n for n in attacks(None, None, args.long_tokens) if not args.only or args.only in n]
    for rnd in range(args.rounds):
        for name in names:
            for label, binary in (("this build", args.binary), ("compared build", args.compare)):
                # A fresh server per window: nothing of the previous attack is left to drain.
                server = Server(binary, args.model, "attacker-key", extra=["--max-num-seqs", "32"])
                try:
                    fire, width = attacks(server, server.key, args.long_tokens)[name]
                    with Attack(fire, width) as a:
                        time.sleep(args.settle)
                        t0, n0 = time.monotonic(), served_tokens(server)
                        time.sleep(args.window)
                        rate = (served_tokens(server) - n0) / (time.monotonic() - t0)
                    assert not a.errors, a.errors[:3]
                    results.setdefault(name, {}).setdefault(label, []).append(rate)
                    print(f"round {rnd + 1} {label:<15} {name:<20} {rate:7.1f} tokens/s", flush=True)
                finally:
                    server.stop()
    for name, by in results.items():
        new, old = statistics.median(by["this build"]), statistics.median(by["compared build"])
        print(f"{name:<20} attacker alone: this build {new:7.1f}, compared build {old:7.1f} tokens/s "
              f"(median of {args.rounds}): {new / old:4.2f}x")


def metric_samples(server, *names):
    """The values of /metrics samples whose lines start with any of `names`."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {server.key}"})
    text = conn.getresponse().read().decode()
    conn.close()
    return [float(line.split()[-1]) for line in text.splitlines() if line.startswith(names)]


def served_tokens(server):
    """Prompt plus generated tokens the engine has served so far, over every entity."""
    return sum(metric_samples(server, "vllm:prompt_tokens_total", "vllm:generation_tokens_total"))


def busy(server):
    return any(v > 0 for v in metric_samples(server, "vllm:num_requests_running", "vllm:num_requests_waiting"))


def check(args):
    """Orderings only: with the attacker's long work started first, the victim's short request
    ends first, for each attack. One training job held in memory at a time, so the victim's job
    gets its turn by parking the attacker's (the adapter and optimizer go to a file and back)."""
    server = Server(args.binary, args.model, "attacker-key",
                    extra=["--max-num-seqs", "8", "--max-training-runs", "1"])
    failures = 0
    try:
        victim = server.new_key("victim")
        rng = random.Random(3)
        cases = {
            "n=8 choices hold every slot": ("/v1/chat/completions", {
                "model": MODEL, "messages": [{"role": "user", "content": "Go on."}], "n": 8,
                "max_tokens": 400, "ignore_eos": True}),
            "a 3000-token prompt": ("/v1/completions", {
                "model": MODEL, "prompt": [rng.randrange(100, 40000) for _ in range(3000)], "max_tokens": 1}),
        }
        for name, (path, body) in cases.items():
            done = {}

            def attacker():
                completion_tokens(server, server.key, body, path)
                done["attacker"] = time.monotonic()

            t = threading.Thread(target=attacker)
            t.start()
            while not busy(server):
                time.sleep(0.02)
            time.sleep(0.3)
            stream_chat(server, victim, 8, prompt="Hi")
            done["victim"] = time.monotonic()
            t.join()
            ok = done["victim"] < done["attacker"]
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name}: the victim's request ended "
                  f"{done['attacker'] - done['victim']:.1f} s before the attacker's")
        # A long training job of the attacker's: the victim's one-step job ends while it runs.
        # Steps of 1,024 tokens keep it short; the attacker's job is cancelled once the victim's
        # has ended.
        first, done, step, status = training_attack(server, victim, 12, 4, 400, row_tokens=1024)
        parks = sum(metric_samples(server, "tandem:training_runs_parked_total"))
        ok = status == "running" and parks >= 1
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} a long training job: the victim's job ran its step after "
              f"{first:.1f} s ({first / step:.2f} attacker steps) and ended while the attacker's was {status}"
              f" ({parks:.0f} parks)")
    finally:
        server.stop()
    print(f"fairness: {3 - failures} passed, {failures} failed")
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--victim-tokens", type=int, default=64)
    p.add_argument("--long-tokens", type=int, default=600)
    p.add_argument("--settle", type=float, default=3.0)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--job-groups", type=int, default=16, help="groups of 8 x 400 tokens in the attacker's job")
    p.add_argument("--check", action="store_true")
    p.add_argument("--only", help="run only the attacks whose name contains this (no training attack)")
    p.add_argument("--compare", metavar="OLD_BINARY",
                   help="only the attacker alone, on this binary and on OLD_BINARY in turns (work conservation)")
    args = p.parse_args()
    if args.compare:
        return compare(args)
    return check(args) if args.check else bench(args)


if __name__ == "__main__":
    finish(main() or 0)
