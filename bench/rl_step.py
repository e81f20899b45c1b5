"""One RL step as users run it, stage by stage: 8 groups x 4 rollouts of up to 128 tokens through
chat completions (all 32 at once, sampled, with logprobs), then one training job on them.

    python bench/rl_step.py --tandem URL@PID --llama URL@PID --torch PYTHON GGUF [--key KEY]

tandem runs both stages itself (`POST /v1/preview/training-jobs`, timed until `training_ended`,
so checkpoint writing is included). The peer is llama.cpp's server for the rollouts and PyTorch +
PEFT for the training: the same token sequences packed the way tandem packs them (rows of up to
2048 tokens, one optimizer step per row), each row a padded batch, loss on the completion tokens,
in a persistent process (its model load is not counted). tandem runs one RL step first (its
trainer loads the base on the first job) and the second is compared. Prints a table of stage
times, their ratios, and peak RSS (tandem: serving + training in one process).
"""
import argparse, json, random, subprocess, sys, tempfile, threading, time, urllib.request

PROMPTS = [f"Question {i}: name a {w} and say why in one sentence." for i, w in
           enumerate(["colour", "fruit", "city", "river", "planet", "metal", "bird", "tree"])]


def call(url, key, method, path, body=None):
    req = urllib.request.Request(url + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=1200) as r:
        return json.load(r)


def rollouts(url, key, seed):
    """32 requests at once (8 prompts x 4); returns (seconds, [(prompt index, choice, prompt ids)])."""
    out, lock = [], threading.Lock()

    def one(g, i):
        body = {"messages": [{"role": "user", "content": PROMPTS[g]}], "max_tokens": 128, "temperature": 1.0,
                "seed": seed * 100 + g * 4 + i, "logprobs": True, "return_token_ids": True}
        r = call(url, key, "POST", "/v1/chat/completions", body)
        with lock:
            out.append((g, r["choices"][0], r.get("prompt_token_ids"), r["usage"]))

    t = time.perf_counter()
    threads = [threading.Thread(target=one, args=(g, i)) for g in range(8) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t, out


def reward(choice):
    # Any score with spread inside each group works for timing: shorter answers score higher.
    return 1.0 / (1 + len(choice["message"]["content"] or ""))


def tandem_train(url, key, done, base_model="HuggingFaceTB/SmolLM2-135M-Instruct"):
    m = call(url, key, "POST", "/v1/preview/models", {"project": "bench", "name": f"rl{int(time.time() * 1000)}",
                                                      "base_model": base_model})
    groups = {}
    for g, choice, prompt_ids, _ in done:
        choice = dict(choice, prompt_token_ids=prompt_ids)
        groups.setdefault(g, []).append({"messages_and_choices": [{"role": "user", "content": PROMPTS[g]}, choice],
                                         "reward": reward(choice)})
    t = time.perf_counter()
    job = call(url, key, "POST", "/v1/preview/training-jobs",
               {"model_id": m["id"], "trajectory_groups": [{"trajectories": ts} for ts in groups.values()]})
    while True:
        status = call(url, key, "GET", f"/v1/preview/training-jobs/{job['id']}")["status"]
        if status in ("completed", "succeeded", "failed", "cancelled"):
            break
        time.sleep(0.05)
    secs = time.perf_counter() - t
    events = call(url, key, "GET", f"/v1/preview/training-jobs/{job['id']}/events?limit=100")
    events = events.get("data", events) if isinstance(events, dict) else events
    steps = sum(1 for e in events if e.get("type") == "gradient_step")
    if status not in ("completed", "succeeded"):
        sys.exit(f"the tandem training job ended {status}: {events[-1] if events else ''}")
    return secs, steps


def rows_of(done):
    """The rollouts' token sequences packed as tandem packs them: rows of up to 2048 tokens."""
    seqs = [(ids, choice["token_ids"]) for _, choice, ids, _ in done]
    rows, row, used = [], [], 0
    for prompt, completion in seqs:
        n = len(prompt) + len(completion)
        if row and used + n > 2048:
            rows.append(row)
            row, used = [], 0
        row.append((prompt, completion))
        used += n
    if row:
        rows.append(row)
    return rows


TORCH_TRAINER = r'''
import json, sys, time, torch
torch.set_num_threads(2)
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
import os
d, f = os.path.split(os.path.abspath(sys.argv[1]))
rows = json.load(open(sys.argv[2]))
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, betas=(0.9, 0.99), weight_decay=0.1)
t = time.time()
for row in rows:
    width = max(len(p) + len(c) for p, c in row)
    ids = torch.zeros((len(row), width), dtype=torch.long)
    mask = torch.zeros((len(row), width), dtype=torch.long)
    target = torch.zeros((len(row), width), dtype=torch.bool)
    for i, (p, c) in enumerate(row):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        mask[i, :len(p) + len(c)] = 1
        target[i, len(p):len(p) + len(c)] = True
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    loss = -(logp * target[:, 1:]).sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.1)
    opt.step()
    opt.zero_grad()
import resource
print(json.dumps({"seconds": time.time() - t, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def torch_train(python, gguf, done):
    rows = rows_of(done)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(rows, f)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as s:
        s.write(TORCH_TRAINER)
    out = subprocess.run([python, s.name, gguf, f.name], capture_output=True, text=True, check=True).stdout
    r = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    return r["seconds"], len(rows), r["peak_rss_mb"]


def peak_rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--torch", nargs=2, metavar=("PYTHON", "GGUF"), required=True)
    ap.add_argument("--key", default="bench")
    a = ap.parse_args()
    (t_url, t_pid), (l_url, l_pid) = (s.split("@") for s in (a.tandem, a.llama))
    for url in (t_url, l_url):  # warm-up
        call(url, a.key, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    # A first RL step on tandem loads the trainer's base (once per server); the second is the
    # steady state users see, and the one compared (PyTorch's model load is not counted either).
    _, first_done = rollouts(t_url, a.key, 1)
    first_train, _ = tandem_train(t_url, a.key, first_done)
    t_roll, t_done = rollouts(t_url, a.key, 2)
    l_roll, l_done = rollouts(l_url, a.key, 2)
    t_train, t_steps = tandem_train(t_url, a.key, t_done)
    # The peer trains on the same sequences tandem generated (llama.cpp's may differ in length).
    p_train, p_steps, p_rss = torch_train(a.torch[0], a.torch[1], t_done)
    gen = lambda done: sum(u["completion_tokens"] for *_, u in done)
    print(f"RL step: 8 groups x 4 rollouts (<= 128 tokens, sampled, logprobs), then one training job")
    print(f"{'stage':<34}{'tandem':>10}{'llama.cpp + PyTorch':>22}{'ratio (peer / tandem)':>24}")
    print(f"{'rollouts (s)':<34}{t_roll:>10.2f}{l_roll:>22.2f}{l_roll / t_roll:>24.2f}")
    print(f"{'  generated tokens':<34}{gen(t_done):>10}{gen(l_done):>22}")
    print(f"{'training (s), optimizer steps':<34}{t_train:>7.2f} ({t_steps}){p_train:>18.2f} ({p_steps}){p_train / t_train:>20.2f}")
    total_t, total_p = t_roll + t_train, l_roll + p_train
    print(f"{'total (s)':<34}{total_t:>10.2f}{total_p:>22.2f}{total_p / total_t:>24.2f}")
    print(f"(tandem's first training job, which also loads the trainer's base: {first_train:.2f} s)")
    t_rss, l_rss = peak_rss_mb(t_pid), peak_rss_mb(l_pid)
    print(f"peak RSS (MB): tandem serving + training {t_rss:.0f} (issue 6 target < 2048); "
          f"llama.cpp {l_rss:.0f} + PyTorch {p_rss:.0f} = {l_rss + p_rss:.0f}")


if __name__ == "__main__":
    main()
