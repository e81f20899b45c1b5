"""A victim's Tinker `forward_backward` behind an attacker's large calls (issue 50), on one server.

    target/tinkerenv/bin/python bench/tinker_victim.py target/release/tandem models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--attacker-datums 16] [--tokens 512] [--rounds 5]

Two entities, each with a rank-8 LoRA model through the tinker SDK (0.38, unchanged). The victim
times a 16-token `forward_backward` alone, then while the attacker keeps one call of
`--attacker-datums` x `--tokens` distinct tokens running at all times (each call is within
--max-job-tokens). Prints the victim's latency (median and max), the attacker's call time, and the
time of one slice (a part of --train-part-tokens, measured as the attacker's call time over its
parts): a call passes the trainer's turn at each part, so the victim's wait is bounded by about
one slice, not by the attacker's whole call.

With `--flood N`, a second phase: the attacker submits N `asample` calls at once (64 threads, raw
requests, 4 samples of 32 tokens each; they queue behind its per-entity gate) while the victim
streams chats; prints the victim's time to first token alone and during the flood, how long
the flood took to drain, and the server's RSS before and at its peak. No assertions: a
measurement.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from tandem_server import Server, finish, scratch  # noqa: E402

DATA = scratch("tandem-tinker-victim-")
os.environ["HF_HUB_CACHE"] = os.path.join(DATA, "hf-hub")
os.environ["HF_HUB_OFFLINE"] = "1"

import tinker  # noqa: E402
from tinker import types  # noqa: E402

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
PART_TOKENS = 512  # the trainer's default part (train/src/trainer.rs PART_TOKENS)


def datum(tokens):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


def client(server, key):
    sc = tinker.ServiceClient(base_url=f"http://{server.host}:{server.port}", api_key=f"tml-{key}")
    return sc, sc.create_lora_training_client(base_model=BASE, rank=8, seed=1).result()


def rss_mb(server):
    with open(f"/proc/{server.proc.pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024


def ttft(server, key):
    """Time to the first streamed token of a short chat."""
    import http.client
    conn = http.client.HTTPConnection(server.host, server.port, timeout=600)
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps({
        "model": BASE, "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 8,
        "stream": True, "temperature": 0.0}), {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    r = conn.getresponse()
    for raw in r:
        if raw.startswith(b"data: {") and b'"content":"' in raw:
            break
    first = time.monotonic() - t0
    r.read()
    conn.close()
    return first


def flood(server, n, rounds):
    key = server.new_key("flooder")
    raw = lambda path, body: server.api("POST", path, body, key=f"tml-{key}")  # noqa: E731
    _, session, _ = raw("/api/v1/create_session", {"tags": []})
    _, sampler, _ = raw("/api/v1/create_sampling_session", {
        "session_id": session["session_id"], "sampling_session_seq_id": 0, "base_model": BASE})
    body = {"sampling_session_id": sampler["sampling_session_id"], "num_samples": 4,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [504, 3458, 282, 4649, 314, 7042]}]},
            "sampling_params": {"max_tokens": 32, "temperature": 1.0}}
    alone = [ttft(server, server.key) for _ in range(rounds)]
    before = rss_mb(server)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda _: raw("/api/v1/asample", body), range(n)))
    submitted = time.monotonic() - t0
    accepted = [r["request_id"] for s, r, _ in answers if s == 200]
    during, peak = [], before
    for _ in range(rounds):
        during.append(ttft(server, server.key))
        peak = max(peak, rss_mb(server))
    pending = list(accepted)
    while pending:
        peak = max(peak, rss_mb(server))
        s, r, _ = raw("/api/v1/retrieve_future", {"request_id": pending[-1]})
        # A result is protobuf (read as text here); a pending one is JSON `try_again`.
        if not (isinstance(r, dict) and r.get("type") == "try_again"):
            pending.pop()
    drained = time.monotonic() - t0
    refused = {s for s, _, _ in answers if s != 200}
    print(f"flood: {len(accepted)} of {n} asample accepted in {submitted:.1f} s (others: {sorted(refused) or 'none'}), "
          f"drained in {drained:.1f} s")
    print(f"victim chat time to first token alone: median {statistics.median(alone) * 1000:.0f} ms, "
          f"max {max(alone) * 1000:.0f} ms; during the flood: median {statistics.median(during) * 1000:.0f} ms, "
          f"max {max(during) * 1000:.0f} ms")
    print(f"server RSS: {before:.0f} MB before, {peak:.0f} MB at the flood's peak")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--attacker-datums", type=int, default=16)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--flood", type=int, default=0)
    p.add_argument("--no-train", action="store_true", help="only the flood phase")
    a = p.parse_args()
    server = Server(a.binary, a.model, "victim-key", data=DATA)
    try:
        if a.no_train:
            flood(server, a.flood, a.rounds)
            return 0
        _, victim = client(server, "victim-key")
        _, attacker = client(server, server.new_key("attacker"))
        small = [datum([100 + i for i in range(17)])]
        victim.forward_backward(small, "cross_entropy").result()  # warm

        def timed(tc, data):
            t0 = time.monotonic()
            tc.forward_backward(data, "cross_entropy").result()
            return time.monotonic() - t0

        alone = [timed(victim, small) for _ in range(a.rounds)]
        big = [datum([100 + (i * 7 + k * 131) % 20000 for i in range(a.tokens + 1)]) for k in range(a.attacker_datums)]
        attack_alone = timed(attacker, big)
        stop, calls = threading.Event(), []

        def attack():
            while not stop.is_set():
                calls.append(timed(attacker, big))

        t = threading.Thread(target=attack)
        t.start()
        time.sleep(min(2.0, attack_alone / 3))
        behind = []
        for _ in range(a.rounds):
            behind.append(timed(victim, small))
            time.sleep(0.2)
        stop.set()
        t.join()
        parts = a.attacker_datums * (a.tokens + 1) / PART_TOKENS
        print(f"victim 16-token forward_backward alone: median {statistics.median(alone):.3f} s, max {max(alone):.3f} s")
        print(f"attacker's call ({a.attacker_datums} x {a.tokens} tokens) alone: {attack_alone:.2f} s "
              f"(~{parts:.0f} parts, ~{attack_alone / parts:.2f} s a slice)")
        print(f"victim behind the attacker: median {statistics.median(behind):.3f} s, max {max(behind):.3f} s "
              f"(attacker's calls meanwhile: {', '.join(f'{c:.1f}' for c in calls)} s)")
        print(f"victim's worst wait / one slice: {max(behind) / (attack_alone / parts):.2f}; "
              f"/ the attacker's whole call: {max(behind) / attack_alone:.2f}")
        if a.flood:
            flood(server, a.flood, a.rounds)
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    finish(main())
