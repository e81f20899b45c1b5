"""Memory per held Tinker model (issue 50), at ranks 8, 32 and 256, with and without the trained
output head (`train_unembed`), on one server.

    target/tinkerenv/bin/python bench/tinker_memory.py target/release/tandem models/SmolLM2-135M-Instruct.Q4_1.gguf

Each configuration is a fresh entity with one model through the tinker SDK (0.38, unchanged). For
each it reads the server's `tandem:tinker_live_bytes` gauge (the adapter, its AdamW moments and
pending gradients, as the memory budget counts them) and its RSS: after `create_model`, after a
`forward_backward` of 4 x 128 tokens (gradients pending) and after the `optim_step`, once a rank-1
model has trained (the trainer's own first use is no model's). The budget
(`--tinker-memory-mib`) is set above the total so that nothing parks. Prints one row each. No
assertions: a measurement.
"""

import argparse
import os
import re
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from tandem_server import Server, finish, scratch  # noqa: E402

DATA = scratch("tandem-tinker-memory-")
os.environ["HF_HUB_CACHE"] = os.path.join(DATA, "hf-hub")
os.environ["HF_HUB_OFFLINE"] = "1"

import tinker  # noqa: E402
from tinker import types  # noqa: E402

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def gauge(server, key):
    req = urllib.request.Request(f"http://{server.host}:{server.port}/metrics", headers={"Authorization": f"Bearer {key}"})
    text = urllib.request.urlopen(req, timeout=60).read().decode()
    return int(float(re.search(r"^tandem:tinker_live_bytes (\S+)$", text, re.M).group(1)))


def rss_mb(server):
    with open(f"/proc/{server.proc.pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    a = p.parse_args()
    server = Server(a.binary, a.model, "memory-key", data=DATA,
                    extra=("--tinker-memory-mib", "16384", "--max-tinker-models", "12"))
    try:
        data = [types.Datum(model_input=types.ModelInput.from_ints([(7 * i + j) % 4000 + 10 for j in range(128)]),
                            loss_fn_inputs={"target_tokens": [(7 * i + j + 1) % 4000 + 10 for j in range(128)],
                                            "weights": [1.0] * 128}) for i in range(4)]
        # The trainer's own first use (its copy of the base weights, its activation buffers) is
        # not any model's: a rank-1 model trains once before anything is measured.
        warm_key = server.new_key("memory-warm-up")
        warm = tinker.ServiceClient(base_url=f"http://{server.host}:{server.port}", api_key=f"tml-{warm_key}")
        wtc = warm.create_lora_training_client(base_model=BASE, rank=1, seed=1, train_unembed=False).result()
        wtc.forward_backward(data, "cross_entropy").result()
        wtc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
        print(f"{'rank':>5} {'head':>5} | {'live MB: created':>16} {'grads':>8} {'stepped':>8} | {'RSS +MB: created':>16} {'grads':>8} {'stepped':>8}")
        for rank in (8, 32, 256):
            for head in (False, True):
                key = server.new_key(f"memory-r{rank}-{int(head)}")
                before = (gauge(server, key), rss_mb(server))
                sc = tinker.ServiceClient(base_url=f"http://{server.host}:{server.port}", api_key=f"tml-{key}")
                tc = sc.create_lora_training_client(base_model=BASE, rank=rank, seed=1, train_unembed=head).result()
                rows = [(gauge(server, key), rss_mb(server))]
                tc.forward_backward(data, "cross_entropy").result()
                rows.append((gauge(server, key), rss_mb(server)))
                tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
                rows.append((gauge(server, key), rss_mb(server)))
                live = [f"{(g - before[0]) / 2**20:8.1f}" for g, _ in rows]
                rss = [f"{r - before[1]:8.1f}" for _, r in rows]
                print(f"{rank:>5} {str(head):>5} | {live[0]:>16} {live[1]} {live[2]} | {rss[0]:>16} {rss[1]} {rss[2]}", flush=True)
    finally:
        server.stop()
    finish(0)


if __name__ == "__main__":
    main()
