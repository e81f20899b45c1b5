"""Many adapters in one batch (issue 52, item 2): aggregate decode throughput of concurrent
streams on different LoRA adapters against the same streams on the base, side by side in one run.

    target/pyenv/bin/python bench/adapters.py target/release/tandem models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--counts 1,4,16,64] [--streams 16] [--tokens 64] [--rounds 5] [--rank 8]

Writes 64 random PEFT adapters (rank --rank on all seven projections of every layer, shapes from
the GGUF) into a --lora-root, loads them through `/v1/load_lora_adapter`, then for each count k
runs --streams concurrent completions of --tokens tokens (ignore_eos), stream i on adapter
(round * streams + i) mod k, alternating with a round on the base so that drift on the machine
lands on both. With 64 adapters and 16 streams, each round uses 16 others: the rotation a
multi-tenant service sees (every tenant's newest checkpoint). Prints tokens/s per configuration
(medians), the median over rounds of each round's ratio to the base's round after it, with their
range, and how many adapters the measured rounds read from
disk (`tandem:lora_adapter_loads_total`; 0 when the cache holds them all). With --read-gbs (the
read bandwidth measured in the same run, `matmul_bench read`; `make bench-adapters` passes it)
each line ends with the read bound: the base's step (streams over the base's tokens/s, which
counts the round's prefill too, so the bound is if anything loose) against that step plus the
bytes of the adapters the step's streams use (held bytes a loaded adapter, from /metrics), read
once at that bandwidth. No assertions: a measurement.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from gguf import GGUFReader
from safetensors.numpy import save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from tandem_server import Server  # noqa: E402

KEY = "bench-adapters-key"
MODULES = {  # PEFT path -> (in, out) in terms of the config
    "self_attn.q_proj": ("h", "q"), "self_attn.k_proj": ("h", "kv"), "self_attn.v_proj": ("h", "kv"),
    "self_attn.o_proj": ("q", "h"), "mlp.gate_proj": ("h", "f"), "mlp.up_proj": ("h", "f"),
    "mlp.down_proj": ("f", "h"),
}


def dims(gguf):
    r = GGUFReader(gguf)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()

    def field(name):
        return int(r.fields[f"{arch}.{name}"].parts[-1][0])

    heads, kv, h = field("attention.head_count"), field("attention.head_count_kv"), field("embedding_length")
    hd = field("attention.key_length") if f"{arch}.attention.key_length" in r.fields else h // heads
    return field("block_count"), {"h": h, "f": field("feed_forward_length"), "q": heads * hd, "kv": kv * hd}


def write_adapters(root, n, layers, size, rank):
    rng = np.random.default_rng(1)
    for i in range(n):
        d = os.path.join(root, f"a{i}")
        os.makedirs(d)
        tensors = {}
        for layer in range(layers):
            for path, (inp, out) in MODULES.items():
                p = f"base_model.model.model.layers.{layer}.{path}"
                tensors[f"{p}.lora_A.weight"] = (rng.standard_normal((rank, size[inp])) * 0.02).astype(np.float32)
                tensors[f"{p}.lora_B.weight"] = (rng.standard_normal((size[out], rank)) * 0.02).astype(np.float32)
        save_file(tensors, os.path.join(d, "adapter_model.safetensors"))
        with open(os.path.join(d, "adapter_config.json"), "w") as f:
            json.dump({"r": rank, "lora_alpha": 2 * rank, "peft_type": "LORA",
                       "target_modules": [m.split(".")[1] for m in MODULES]}, f)


def round_(server, models, tokens):
    """Aggregate completion tokens per second of one request per entry of `models`, all at once."""
    def one(model):
        status, reply, _ = server.api("POST", "/v1/completions", {
            "model": model, "prompt": "Once upon a time, in a town by the sea,", "max_tokens": tokens,
            "temperature": 0.8, "ignore_eos": True})
        assert status == 200, reply
        return reply["usage"]["completion_tokens"]

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(models)) as pool:
        done = sum(pool.map(one, models))
    return done / (time.perf_counter() - started)


def cache_state(server):
    """(adapters read from disk so far, bytes the adapter cache holds) from /metrics."""
    text = server.api("GET", "/metrics")[1]
    value = {}
    for line in text.splitlines():
        for name in ("tandem:lora_adapter_loads_total", "tandem:lora_adapter_cache_bytes"):
            if line.startswith(name + " "):
                value[name] = float(line.split()[1])
    return int(value["tandem:lora_adapter_loads_total"]), int(value["tandem:lora_adapter_cache_bytes"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("gguf")
    p.add_argument("--counts", default="1,4,16,64")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--read-gbs", type=float, help="read bandwidth (GB/s): prints each count's read bound")
    args = p.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    root = tempfile.mkdtemp(prefix="tandem-bench-adapters-")
    try:
        layers, size = dims(args.gguf)
        write_adapters(root, max(counts), layers, size, args.rank)
        server = Server(args.binary, args.gguf, KEY,
                        extra=["--lora-root", root, "--max-num-seqs", str(args.streams)])
        try:
            base = server.api("GET", "/v1/models")[1]["data"][0]["id"]
            for i in range(max(counts)):
                status, reply, _ = server.api("POST", "/v1/load_lora_adapter", {"lora_name": f"a{i}", "lora_path": f"a{i}"})
                assert status == 200, reply
            round_(server, [base] * args.streams, 8)  # warm-up
            rows = []
            for k in counts:
                ours, theirs = [], []
                loads_before = None
                for r in range(args.rounds + 1):
                    if r == 1:
                        loads_before = cache_state(server)[0]
                    models = [f"a{(r * args.streams + i) % k}" for i in range(args.streams)]
                    got = round_(server, models, args.tokens)
                    ref = round_(server, [base] * args.streams, args.tokens)
                    if r:  # the first round of each count warms its adapters up
                        ours.append(got)
                        theirs.append(ref)
                a, b = statistics.median(ours), statistics.median(theirs)
                # Each round against the base's round right after it: the host's drift (the base
                # alone moves 620-850 tok/s between rounds on the VMs here) lands on both halves of
                # a pair, so the median of the pairs' ratios is the steadier figure.
                paired = sorted(x / y for x, y in zip(ours, theirs))
                loads, held = cache_state(server)
                rows.append((k, a, b))
                bound = ""
                if args.read_gbs:
                    step = args.streams / b
                    step_bytes = min(k, args.streams) * held / max(counts)
                    read = step_bytes / (args.read_gbs * 1e9)
                    bound = (f"; read bound {step / (step + read):.2f} ({step_bytes / 1e6:.1f} MB "
                             f"a step at {args.read_gbs:.1f} GB/s over a {step * 1e3:.1f} ms base step)")
                print(f"{k:>3} adapters over {args.streams} streams: {a:7.1f} tok/s, base {b:7.1f} tok/s, "
                      f"ratio {statistics.median(paired):.2f} (rounds {paired[0]:.2f}-{paired[-1]:.2f}); "
                      f"{loads - loads_before} adapters read from disk in the measured rounds, "
                      f"cache holds {held / 2**20:.1f} MiB{bound}", flush=True)
        finally:
            server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
