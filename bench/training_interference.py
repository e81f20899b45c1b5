"""Single-stream decode tokens/s on an idle tandem server, then while a training job runs."""
import json, sys, time, urllib.request

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

idle = decode_rate()
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
job = call("POST", "/v1/preview/training-jobs", {"model_id": m["id"], "trajectory_groups": groups})
while call("GET", f"/v1/preview/training-jobs/{job['id']}")["status"] == "queued":
    time.sleep(0.1)
busy = decode_rate()
status = call("GET", f"/v1/preview/training-jobs/{job['id']}")["status"]
print(f"single-stream decode (64 tokens): idle {idle:.1f} tok/s, during training {busy:.1f} tok/s "
      f"({busy / idle:.2f}x; job {status} when the measurement ended)")
