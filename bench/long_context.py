"""Long prompts through HTTP: the same client against every server given, in one run.

    python bench/long_context.py NAME=URL@PID [NAME=URL@PID ...] [--rounds 2] [--key KEY]

For each server: prefill tokens/s of a ~4,096-token prompt (max_tokens 1), then 16 concurrent
streams, each a fresh ~2,048-token prompt and 32 generated tokens: their aggregate tokens/s
(prompt + generated over wall time). Then each server's peak resident memory over the run
(VmHWM: weights, KV caches and working buffers). Rounds
alternate between servers; medians. Prompts start with a fresh random prefix so no prefix cache
helps. With two servers, the ratios first/second are printed.
"""
import argparse
import random
import statistics
import threading
import time

from inference import chat, prompt  # the same prompts and request as `make bench`


def status_kb(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def prefill_rate(url, key, rng):
    # ~1.16 tokens per word of this vocabulary with SmolLM2's tokenizer: 3,500 words ~ 4,096 tokens.
    secs, usage = chat(url, key, prompt(3500, rng), 1)
    return usage["prompt_tokens"] / secs, usage["prompt_tokens"]


def streams(url, key, rng, n=16):
    prompts = [prompt(1750, rng) for _ in range(n)]
    results = []
    def one(p):
        results.append(chat(url, key, p, 32)[1])
    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    tokens = sum(u["prompt_tokens"] + u["completion_tokens"] for u in results)
    return tokens / secs, statistics.mean(u["prompt_tokens"] for u in results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("servers", nargs="+")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--key", default="bench")
    args = ap.parse_args()
    servers = []
    for s in args.servers:
        name, rest = s.split("=", 1)
        url, pid = rest.rsplit("@", 1)
        servers.append((name, url, int(pid)))
    rng = random.Random(7)
    got = {name: {"prefill_4096": [], "streams_16x2048": []} for name, _, _ in servers}
    lengths = {}
    for r in range(args.rounds):
        for name, url, pid in (servers if r % 2 == 0 else servers[::-1]):
            rate, n = prefill_rate(url, args.key, rng)
            got[name]["prefill_4096"].append(rate)
            agg, mean_prompt = streams(url, args.key, rng)
            got[name]["streams_16x2048"].append(agg)
            lengths[name] = (n, mean_prompt)
    names = [n for n, _, _ in servers]
    print(f"{'metric (median)':32}" + "".join(f"{n:>14}" for n in names) + ("         ratio" if len(names) == 2 else ""))
    for name, _, pid in servers:
        got[name]["peak_rss_mb"] = [status_kb(pid, "VmHWM") / 1024]
    for metric, unit in [("prefill_4096", "tok/s"), ("streams_16x2048", "tok/s"), ("peak_rss_mb", "MB")]:
        vals = [statistics.median(got[n][metric]) for n in names]
        line = f"{metric + ' (' + unit + ')':32}" + "".join(f"{v:14.1f}" for v in vals)
        if len(vals) == 2:
            line += f"{vals[0] / vals[1]:14.2f}"
        print(line)
    for n in names:
        print(f"{n}: prefill prompt {lengths[n][0]} tokens, stream prompts {lengths[n][1]:.0f} tokens on average")


if __name__ == "__main__":
    main()
