"""Aggregate inference throughput of a tandem cluster with one and with two serving nodes, in one
run, on this machine.

    python bench/cluster.py BINARY MODEL PG_ADMIN_URL [--rounds 3] [--streams 16]

Each layout shares PostgreSQL (a fresh database `tandem_bench_cluster`) and a `file://` blob
store, as a cluster does; the client spreads its concurrent streams (64 generated tokens each,
fresh random prompts) round robin over the layout's nodes and counts generated tokens per second.

  1 node x 2 threads    the single serving node of a small cluster
  2 nodes x 1 thread    the same two cores split between two nodes: per-node efficiency
  2 nodes x 2 threads   two nodes each given the whole machine, as two machines would be, but
                        sharing these two cores (oversubscribed): what it costs to run more
                        node threads than cores

On one machine two nodes cannot be faster than one: the cores are the bound. What the run measures
is efficiency: the two-node layouts' aggregate over the one-node one. Rounds alternate between
layouts; medians are printed.

Then what routing by locality could win: a long prompt (~1,500 tokens) is sent to node A, and the
same prompt with a new ending to A again (its prefix cache holds the prompt) and to node B (which
never saw it); the time to the first token of each is printed. A load balancer with affinity by
session gets the first; spreading a conversation over nodes pays the second.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from inference import chat, prompt  # noqa: E402
from tandem_server import Server  # noqa: E402

DB = "tandem_bench_cluster"
KEY = "bench"


def aggregate(urls, streams, rng):
    prompts = [prompt(16, rng) for _ in range(streams)]
    done = []

    def run(i, p):
        _, usage = chat(urls[i % len(urls)], KEY, p, 64)
        done.append(usage["completion_tokens"])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def first_token_seconds(url, content):
    secs, _ = chat(url, KEY, content, 1)
    return secs


def locality(a, b, rounds, rng):
    hits, misses = [], []
    for _ in range(rounds):
        long = prompt(1100, rng)
        first_token_seconds(a, long)  # A computes the prompt and keeps it in its prefix cache
        hits.append(first_token_seconds(a, long + " and then one more line"))
        misses.append(first_token_seconds(b, long + " and then another line"))
    return statistics.median(hits), statistics.median(misses)


def start_layout(binary, model, db_url, blobs, nodes, threads):
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    try:
        return [Server(binary, model, KEY, ["--database-url", db_url, "--blob-store", blobs, "--role", "api",
                                            "--max-num-seqs", "16", "--node-name", f"bench-{nodes}x{threads}-{i}"],
                       prefix="tandem-bench-") for i in range(nodes)]
    finally:
        os.environ.pop("RAYON_NUM_THREADS", None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("pg_admin_url")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=16)
    args = ap.parse_args()
    subprocess.run(["psql", args.pg_admin_url, "-qc", f"DROP DATABASE IF EXISTS {DB}"], check=True)
    subprocess.run(["psql", args.pg_admin_url, "-qc", f"CREATE DATABASE {DB}"], check=True)
    db_url = args.pg_admin_url.rsplit("/", 1)[0] + "/" + DB
    blobs = "file://" + tempfile.mkdtemp(prefix="tandem-bench-blobs-")
    layouts = {"1 node x 2 threads": (1, 2), "2 nodes x 1 thread": (2, 1), "2 nodes x 2 threads": (2, 2)}
    started = {name: start_layout(args.binary, args.model, db_url, blobs, n, t) for name, (n, t) in layouts.items()}
    rng = random.Random(7)
    rates = {name: [] for name in layouts}
    hit = miss = None
    try:
        for name, nodes in started.items():  # warm-up: every node's first requests
            aggregate([n.url for n in nodes], 2 * len(nodes), rng)
        for r in range(args.rounds):
            for name, nodes in started.items():
                # Only this layout's nodes work during its measurement; the others sit idle.
                rates[name].append(aggregate([n.url for n in nodes], args.streams, rng))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()), flush=True)
        a, b = started["2 nodes x 1 thread"]
        hit, miss = locality(a.url, b.url, args.rounds, rng)
    finally:
        for nodes in started.values():
            for n in nodes:
                n.stop()
    base = statistics.median(rates["1 node x 2 threads"])
    print(f"\naggregate generated tokens/s, {args.streams} streams of 64 tokens, median of {args.rounds} rounds "
          f"(CPU: {os.cpu_count()} cores)")
    for name, values in rates.items():
        med = statistics.median(values)
        n = layouts[name][0]
        print(f"  {name:20s} {med:7.1f} tok/s  ({med / n:6.1f} per node)  efficiency {med / base:.2f} of one node")
    print(f"\nfirst token of a ~1,500-token prompt seen before (2 nodes x 1 thread, median of {args.rounds}): "
          f"{hit:.3f} s on the node that has its prefix, {miss:.3f} s on the other ({miss / hit:.1f}x)")


if __name__ == "__main__":
    main()
