"""Single-stream decode tokens/s on an idle tandem server, then while a training job runs."""
import json, statistics, sys, time, urllib.request

url, key = sys.argv[1], sys.argv[2]

def call(method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)

def decode_rate(n=3):
    rates = []
    for i in range(n):
        t = time.time()
        r = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": f"Tell me a story {i}."}],
                                                  "max_tokens": 64, "ignore_eos": True, "temperature": 0})
        rates.append(r["usage"]["completion_tokens"] / (time.time() - t))
    return sorted(rates)[len(rates) // 2]

decode_rate()  # warms the engine (first requests allocate)
m = call("POST", "/v1/preview/models", {"project": "bench", "name": f"b{int(time.time())}",
                                         "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"})
# Rollouts to train on: 4 groups x 4 samples, rewards by length so every group has variance.
groups = []
for g in range(4):
    r = call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": f"Say something {g}."}], "n": 4,
                                              "temperature": 1.0, "max_tokens": 48, "logprobs": True, "return_token_ids": True, "seed": g})
    trajs = []
    for c in r["choices"]:
        c["prompt_token_ids"] = r["prompt_token_ids"]
        trajs.append({"messages_and_choices": [{"role": "user", "content": "x"}, c], "reward": len(c["message"]["content"]) % 7})
    groups.append({"trajectories": trajs})

def run_job(during=None):
    """Wall time of one training job on `groups` from `running` to its end; `during()` is called
    once the job runs (a decode burst) and its result returned too."""
    job = call("POST", "/v1/preview/training-jobs", {"model_id": m["id"], "trajectory_groups": groups})
    while call("GET", f"/v1/preview/training-jobs/{job['id']}")["status"] == "queued":
        time.sleep(0.02)
    t0 = time.time()
    got = during() if during else None
    while (status := call("GET", f"/v1/preview/training-jobs/{job['id']}")["status"]) in ("queued", "running"):
        time.sleep(0.05)
    return time.time() - t0, got, status

# A first job warms the trainer (loading, allocations); then the job alone and the same job with
# a second stream decoding (3 x 64 tokens) while it runs, alternating, twice each.
run_job()
idle = decode_rate(5)
burst, alones, shareds, busys = [], [], [], []
def timed_decode():
    t = time.time()
    rate = decode_rate()
    burst.append(time.time() - t)
    return rate
for _ in range(3):
    alones.append(run_job()[0])
    secs, rate, _ = run_job(timed_decode)
    shareds.append(secs)
    busys.append(rate)
alone, shared, busy = statistics.median(alones), statistics.median(shareds), statistics.median(busys)
print(f"single-stream decode (64 tokens): idle {idle:.1f} tok/s, during training {busy:.1f} tok/s ({busy / idle:.2f}x)")
print(f"training job (4 x 4 trajectories, median of 3): alone {alone:.1f} s, with a {statistics.median(burst):.1f} s "
      f"decode burst {shared:.1f} s ({shared / alone:.2f}x)")
