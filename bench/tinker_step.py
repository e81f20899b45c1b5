"""A Tinker training step's time through the SDK (issue 50: the service layer must cost nothing
measurable), side by side in one run: this tree's server against a baseline binary, and, with a
PostgreSQL URL, a step sent through an api node (forwarded to the trainer holding the session)
against one sent to that trainer directly.

    target/tinkerenv/bin/python bench/tinker_step.py target/release/tandem models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--baseline /path/to/older/tandem] [--pg postgres://postgres@127.0.0.1:5432/postgres] \
        [--steps 8] [--rounds 3] [--datums 4] [--tokens 256]

A step is one `forward_backward` (cross_entropy, `--datums` x `--tokens` tokens, rank-8 LoRA) and
one `optim_step`, each waited for. Rounds alternate between the servers compared, so drift on the
machine lands on both. Prints each configuration's median step time and the ratios. No
assertions: a measurement.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from tandem_server import Server, finish, scratch  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
import tinker  # noqa: E402
from tinker import types  # noqa: E402

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
KEY = "bench-step-key"
DB = "tandem_bench_tinker_step"


def steps(url, args):
    """Median seconds of `args.steps` steps (after one warm-up step) on a fresh model at `url`."""
    with tinker.ServiceClient(base_url=url, api_key=f"tml-{KEY}") as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=8, seed=1).result()
        data = []
        for d in range(args.datums):
            tokens = [(97 + 31 * d + 7 * i) % 49000 + 100 for i in range(args.tokens + 1)]
            data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * args.tokens}))
        times = []
        for i in range(args.steps + 1):
            started = time.perf_counter()
            tc.forward_backward(data, "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
            if i:
                times.append(time.perf_counter() - started)
        return statistics.median(times)


def single(binary, model, args):
    node = Server(binary, model, KEY, prefix="tandem-bench-step-")
    try:
        return steps(f"http://{node.host}:{node.port}", args)
    finally:
        node.stop()


def hop(api, trainer):
    """Median ms of a session heartbeat (a call that does nothing) sent through the api node and
    sent to the trainer holding the session: the forwarding hop's own cost."""
    import json
    import urllib.request

    def post(node, path, body):
        req = urllib.request.Request(f"http://{node.host}:{node.port}/api/v1/{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", "X-API-Key": f"tml-{KEY}"})
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())

    session = post(api, "create_session", {})["session_id"]
    out = []
    for node in (api, trainer):
        times = []
        for _ in range(200):
            started = time.perf_counter()
            post(node, "session_heartbeat", {"session_id": session})
            times.append(time.perf_counter() - started)
        out.append(statistics.median(times) * 1000)
    return out


def cluster(binary, model, args, flip):
    """(through the api node, directly at the trainer, the hop's ms through, the hop's ms direct),
    each step on a fresh model on the one trainer."""
    subprocess.run(["psql", args.pg, "-qc", f"DROP DATABASE IF EXISTS {DB}"], check=True)
    subprocess.run(["psql", args.pg, "-qc", f"CREATE DATABASE {DB}"], check=True)
    common = ["--database-url", args.pg.rsplit("/", 1)[0] + "/" + DB, "--blob-store",
              f"file://{scratch('tandem-bench-step-blobs-')}"]
    api = Server(binary, model, KEY, common + ["--role", "api"], prefix="tandem-bench-step-api-")
    trainer = Server(binary, model, KEY, common + ["--role", "trainer"], prefix="tandem-bench-step-trainer-")
    try:
        time.sleep(6)  # the trainer's first beat names its address
        if flip:
            direct = steps(f"http://{trainer.host}:{trainer.port}", args)
            via = steps(f"http://{api.host}:{api.port}", args)
        else:
            via = steps(f"http://{api.host}:{api.port}", args)
            direct = steps(f"http://{trainer.host}:{trainer.port}", args)
        return (via, direct, *hop(api, trainer))
    finally:
        api.stop()
        trainer.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("model")
    p.add_argument("--baseline")
    p.add_argument("--pg")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--datums", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    got = {}
    for r in range(args.rounds):
        runs = [("this tree", lambda: single(args.binary, args.model, args))]
        if args.baseline:
            runs.append(("baseline", lambda: single(args.baseline, args.model, args)))
        for name, run in (runs if r % 2 == 0 else runs[::-1]):
            got.setdefault(name, []).append(run())
            print(f"round {r + 1}: {name} {got[name][-1] * 1000:.0f} ms a step", flush=True)
        if args.pg:
            via, direct, hop_via, hop_direct = cluster(args.binary, args.model, args, r % 2 == 1)
            got.setdefault("cluster, through the api node", []).append(via)
            got.setdefault("cluster, at the trainer", []).append(direct)
            got.setdefault("heartbeat, through the api node", []).append(hop_via / 1000)
            got.setdefault("heartbeat, at the trainer", []).append(hop_direct / 1000)
            print(f"round {r + 1}: cluster {via * 1000:.0f} ms through the api node, {direct * 1000:.0f} ms at the trainer; "
                  f"a heartbeat {hop_via:.1f} ms through, {hop_direct:.1f} ms direct", flush=True)
    print(f"\nTinker step: {args.datums} x {args.tokens} tokens, rank 8, median of {args.steps} steps a round, "
          f"median of {args.rounds} rounds")
    med = {k: statistics.median(v) for k, v in got.items()}
    for k, v in med.items():
        print(f"  {k:32s} {v * 1000:8.1f} ms")
    if "baseline" in med:
        print(f"  this tree / baseline: {med['this tree'] / med['baseline']:.3f}")
    if args.pg:
        ratio = med["cluster, through the api node"] / med["cluster, at the trainer"]
        print(f"  through the api node / at the trainer: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    finish(main())
