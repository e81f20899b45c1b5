"""Inference benchmark through HTTP: the same client against every server given, in one run.

    python bench/inference.py NAME=URL [NAME=URL ...] [--rounds 3] [--key KEY]

For each server (OpenAI-compatible `/v1/chat/completions`, non-streaming): prefill tokens/s on a
~512-token prompt (max_tokens 1), single-stream decode tokens/s over 128 tokens, and aggregate
generated tokens/s with 1, 4 and 16 concurrent streams of 64 tokens. Rounds alternate between
servers and medians are reported; prompts start with a fresh random prefix so no prefix cache
helps. With two servers, the ratio first/second is the median over rounds of each round's ratio,
with their range. Peak RSS is read from
/proc/<pid>/status when a PID is given as NAME=URL@PID, after the workload every server runs;
`--constrained` then runs the JSON-schema phases on the first server alone and prints its peak
after them too.
"""
import argparse
import json
import random
import statistics
import threading
import time
import urllib.request

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()


def prompt(n_words, rng):
    salt = " ".join(str(rng.randrange(10**6)) for _ in range(4))
    return salt + " " + " ".join(rng.choice(WORDS) for _ in range(n_words))


# A schema the model can keep writing for a long time (a list of free strings), for the
# constrained-decoding metrics; the grammar may end the output early, so rates count what came.
SCHEMA = {"type": "object", "properties": {"lines": {"type": "array", "items": {"type": "string"}}}, "required": ["lines"]}


def chat(url, key, content, max_tokens, constrained=False):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": not constrained, "n_predict": max_tokens}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "lines", "schema": SCHEMA}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.load(r)
    return time.perf_counter() - t0, out["usage"]


def prefill_rate(url, key, rng):
    secs, usage = chat(url, key, prompt(430, rng), 1)
    return usage["prompt_tokens"] / secs


def decode_rate(url, key, rng, constrained=False):
    short = prompt(8, rng) + (" Write the lines of a long poem as JSON." if constrained else "")
    t1, _ = chat(url, key, short, 1, constrained)
    t128, usage = chat(url, key, short + " again", 129, constrained)
    return (usage["completion_tokens"] - 1) / max(t128 - t1, 1e-9)


def aggregate_rate(url, key, rng, streams, constrained=False):
    results = []
    prompts = [prompt(16, rng) + (" Write the lines of a long poem as JSON." if constrained else "") for _ in range(streams)]

    def run(p):
        _, usage = chat(url, key, p, 64, constrained)
        results.append(usage["completion_tokens"])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(results) / (time.perf_counter() - t0)


def copy_bandwidth_gbs(mb=256, reps=5):
    """Bytes moved per second by a large memcpy (read + write, as STREAM's copy counts them), best
    of `reps`: what one core can stream from memory."""
    src, dst = bytearray(mb << 20), bytearray(mb << 20)
    best = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        dst[:] = src
        best = max(best, 2 * len(src) / (time.perf_counter() - t) / 1e9)
    return best


def peak_rss_mb(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("servers", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--key", default="bench")
    ap.add_argument("--gguf", help="the model file: prints decode against the memory-bandwidth limit")
    ap.add_argument("--read-gbs", type=float,
                    help="the read bandwidth decode is bounded by (matmul_bench read); without it, a copy's")
    ap.add_argument("--compute-limit", type=float,
                    help="the tok/s the tier's int8 multiply instruction alone allows (matmul_bench peak): "
                         "prints prefill and 16 streams against it")
    ap.add_argument("--constrained", action="store_true",
                    help="also measure decode with a JSON-schema constraint (first server only)")
    args = ap.parse_args()
    servers = []
    for s in args.servers:
        name, rest = s.split("=", 1)
        url, _, pid = rest.partition("@")
        servers.append((name, url.rstrip("/"), pid or None))
    metrics = ["prefill_512", "decode_1", "aggregate_1", "aggregate_4", "aggregate_16"]
    json_metrics = ["decode_1_json", "aggregate_1_json", "aggregate_16_json"]
    samples = {name: {m: [] for m in metrics + json_metrics} for name, _, _ in servers}
    rng = random.Random(1)
    for name, url, _ in servers:  # warm-up
        chat(url, args.key, "hello", 4)
    for _ in range(args.rounds):
        for name, url, _ in servers:
            s = samples[name]
            s["prefill_512"].append(prefill_rate(url, args.key, rng))
            s["decode_1"].append(decode_rate(url, args.key, rng))
            for n in (1, 4, 16):
                s[f"aggregate_{n}"].append(aggregate_rate(url, args.key, rng, n))
    # The peak over the workload every server ran, before the constrained one only the first runs
    # (its grammar state is memory the others were never asked to hold).
    rss = [peak_rss_mb(pid) if pid else None for _, _, pid in servers]
    if args.constrained:
        name, url, pid = servers[0]
        s = samples[name]
        for _ in range(args.rounds):
            s["decode_1_json"].append(decode_rate(url, args.key, rng, True))
            for n in (1, 16):
                s[f"aggregate_{n}_json"].append(aggregate_rate(url, args.key, rng, n, True))
        rss_constrained = peak_rss_mb(pid) if pid else None
    # The ratio is the median over rounds of each round's ratio (the two servers ran one after the
    # other in a round, under the same load from the host), with their range: the host moved a
    # server's own figure by 10-20% between rounds, more than between two servers in one round.
    print(f"{'metric (tok/s, median)':<24}" + "".join(f"{n:>14}" for n, _, _ in servers)
          + ("     ratio (rounds)" if len(servers) == 2 else ""))
    for m in metrics:
        vals = [statistics.median(samples[n][m]) for n, _, _ in servers]
        ratio = ""
        if len(servers) == 2:
            paired = sorted(x / y for x, y in zip(samples[servers[0][0]][m], samples[servers[1][0]][m]))
            ratio = f"{statistics.median(paired):>10.2f} ({paired[0]:.2f}-{paired[-1]:.2f})"
        print(f"{m:<24}" + "".join(f"{v:>14.1f}" for v in vals) + ratio)
    if args.constrained:
        first = servers[0][0]
        print(f"\n{first} with a JSON-schema constraint (tok/s, median), and constrained / unconstrained:")
        for m in json_metrics:
            base = m.removesuffix("_json")
            v, u = statistics.median(samples[first][m]), statistics.median(samples[first][base])
            print(f"{m:<24}{v:>14.1f}{v / u:>10.2f}")
        if rss_constrained:
            print(f"{'peak RSS after (MB)':<24}{rss_constrained:>14.0f}")
    print(f"{'peak RSS (MB)':<24}" + "".join(f"{(r or float('nan')):>14.0f}" for r in rss)
          + (f"{rss[0] / rss[1]:>10.2f}" if len(rss) == 2 and all(rss) else ""))
    if args.gguf:
        # Decode reads every weight once per token: the file's size is what a token costs in memory
        # traffic (the tied embedding is read as the output head), whatever the in-memory layout.
        import os
        size = os.path.getsize(args.gguf)
        bw, how = (args.read_gbs, "read") if args.read_gbs else (copy_bandwidth_gbs(), "copy")
        limit = bw * 1e9 / size
        print(f"\nmemory: {how} bandwidth {bw:.1f} GB/s, weights {size / 1e6:.0f} MB per token -> decode limit "
              f"{limit:.0f} tok/s; " + ", ".join(
                  f"{n} decode_1 at {statistics.median(samples[n]['decode_1']) / limit:.0%} of it" for n, _, _ in servers))
    if args.compute_limit:
        # Prefill and many streams multiply every weight by many rows: compute, not memory, bounds
        # them. The limit is the multiply instruction's own rate (matmul_bench peak), so a kernel
        # that also unpacks, widens and scales stays well under it.
        lim = args.compute_limit
        print(f"compute: int8 multiply instruction alone -> limit {lim:.0f} tok/s; " + ", ".join(
            f"{n} prefill_512 at {statistics.median(samples[n]['prefill_512']) / lim:.0%} of it, "
            f"aggregate_16 at {statistics.median(samples[n]['aggregate_16']) / lim:.0%}" for n, _, _ in servers))


if __name__ == "__main__":
    main()
