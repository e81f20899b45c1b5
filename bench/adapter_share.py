"""What one entity's adapter rotation costs another entity's adapter (issue 52, item 2; the
adapter cache's share per entity): a victim entity's stream on its one LoRA adapter, alone and
while an attacker entity keeps 16 streams going over its 64 adapters in rotation, with a cache
(`--adapter-cache-mib`, 32 by default) that holds only a few of them.

    target/pyenv/bin/python bench/adapter_share.py target/release/tandem models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--baseline OLD_BINARY] [--cache-mib 32] [--rounds 8] [--tokens 64]

Adapters are bench/adapters.py's random PEFT files (rank 8, all seven projections), loaded through
`/v1/load_lora_adapter` by each entity's key. Prints, per binary: the victim's tokens/s alone and
beside the attack (medians), the adapters read from disk while the attack ran
(`tandem:lora_adapter_loads_total`), and whether the victim's adapter was still held after it (its
next request read nothing). With --baseline the same runs against another binary in the same run,
alternating. No assertions: a measurement (the behaviour is tested in crates/engine).
"""

import argparse
import concurrent.futures
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from adapters import cache_state, dims, write_adapters  # noqa: E402
from tandem_server import Server  # noqa: E402

ATTACKER = "bench-share-attacker"


def complete(server, key, model, tokens):
    status, reply, _ = server.api("POST", "/v1/completions", {
        "model": model, "prompt": "Once upon a time, in a town by the sea,", "max_tokens": tokens,
        "temperature": 0.8, "ignore_eos": True}, key=key)
    assert status == 200, reply
    return reply["usage"]["completion_tokens"]


def victim_rate(server, key, tokens):
    t0 = time.perf_counter()
    n = complete(server, key, "v", tokens)
    return n / (time.perf_counter() - t0)


class Rotation:
    """The attacker's 16 streams at a time over its adapters, in rotation, until stopped."""

    def __init__(self, server, n_adapters, streams=16, tokens=16):
        self.server, self.n, self.streams, self.tokens = server, n_adapters, streams, tokens
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        r = 0
        with concurrent.futures.ThreadPoolExecutor(self.streams) as pool:
            while not self.stop.is_set():
                models = [f"a{(r * self.streams + i) % self.n}" for i in range(self.streams)]
                list(pool.map(lambda m: complete(self.server, ATTACKER, m, self.tokens), models))
                r += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def run(binary, gguf, root, n_adapters, args):
    server = Server(binary, gguf, ATTACKER, extra=[
        "--lora-root", root, "--max-num-seqs", "32", "--adapter-cache-mib", str(args.cache_mib)])
    try:
        victim = server.new_key("victim")
        status, reply, _ = server.api("POST", "/v1/load_lora_adapter",
                                      {"lora_name": "v", "lora_path": f"a{n_adapters}"}, key=victim)
        assert status == 200, reply
        for i in range(n_adapters):
            status, reply, _ = server.api("POST", "/v1/load_lora_adapter", {"lora_name": f"a{i}", "lora_path": f"a{i}"})
            assert status == 200, reply
        victim_rate(server, victim, 8)  # warm-up: the victim's adapter is held from here on
        alone = [victim_rate(server, victim, args.tokens) for _ in range(args.rounds)]
        before = cache_state(server)[0]
        with Rotation(server, n_adapters):
            time.sleep(2)
            beside = [victim_rate(server, victim, args.tokens) for _ in range(args.rounds)]
        during = cache_state(server)[0] - before
        loads = cache_state(server)[0]
        victim_rate(server, victim, 8)
        reread = cache_state(server)[0] - loads
        return statistics.median(alone), statistics.median(beside), during, reread, cache_state(server)[1]
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("gguf")
    p.add_argument("--baseline", help="another tandem binary, run the same way in the same run")
    p.add_argument("--cache-mib", type=int, default=32)
    p.add_argument("--adapters", type=int, default=64)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--passes", type=int, default=2, help="passes over the binaries, alternating")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="tandem-bench-share-")
    try:
        layers, size = dims(args.gguf)
        write_adapters(root, args.adapters + 1, layers, size, 8)
        binaries = [("this tree", args.binary)] + ([("baseline", args.baseline)] if args.baseline else [])
        print(f"cache {args.cache_mib} MiB; victim: one adapter, {args.tokens}-token streams, median of "
              f"{args.rounds}; attacker: 16 streams of 16 tokens over {args.adapters} adapters in rotation")
        for p_ in range(args.passes):
            for name, binary in binaries:
                alone, beside, during, reread, held = run(binary, args.gguf, root, args.adapters, args)
                print(f"pass {p_ + 1} {name:<10} victim alone {alone:6.1f} tok/s, beside the rotation "
                      f"{beside:6.1f} tok/s ({beside / alone:.2f}x); {during} adapters read from disk during "
                      f"the rotation; the victim's adapter {'read again' if reread else 'still held'} after "
                      f"it; cache holds {held / 2**20:.1f} MiB", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
