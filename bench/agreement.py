"""Sampler against trainer (issue 52, item 1): do the two engines score the same adapter alike?

    target/tinkerenv/bin/python bench/agreement.py target/release/tandem \
        models/SmolLM2-135M-Instruct.Q4_1.gguf=HuggingFaceTB/SmolLM2-135M-Instruct \
        models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf=Qwen/Qwen2.5-Coder-0.5B-Instruct [--json out.json]

For each model, through the tinker SDK: a rank-16 LoRA is trained two steps (so that it is not
zero), saved for the sampler, and 8 completions of 48 tokens are sampled from it at temperature 1.
Each completion is then scored three ways:
  sampled   the logprob the sampler reported as it drew each token (decode, one row a step),
  scored    the sampler's `compute_logprobs` of prompt + completion (one prefill),
  trainer   the training client's `forward` (cross_entropy) over the same tokens.
Printed per model: mean and max |difference| per token for each pair, and the importance ratio
exp(trainer - sampled) a PPO/CISPO first step would see (its range). No assertions: a measurement.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from tandem_server import Server  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"
import tinker  # noqa: E402
from tinker import types  # noqa: E402

KEY = "bench-agreement-key"


def pairs(a, b):
    d = [abs(x - y) for x, y in zip(a, b)]
    return {"mean": sum(d) / len(d), "max": max(d), "n": len(d)}


def measure(binary, gguf, name, args):
    server = Server(binary, gguf, KEY, extra=["--served-model-name", name])
    try:
        sc = tinker.ServiceClient(base_url=server.url, api_key=f"tml-{KEY}")
        tc = sc.create_lora_training_client(base_model=name, rank=16, seed=5).result()
        def encode(text):
            status, reply, _ = server.api("POST", "/tokenize", {"model": name, "prompt": text,
                                                                "add_special_tokens": False})
            assert status == 200, reply
            return reply["tokens"]

        text = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step."
        ids = encode(text)
        train = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
        for _ in range(2):
            tc.forward_backward([train], "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=args.lr)).result()
        path = tc.save_weights_for_sampler("agreement").result().path
        sampler = sc.create_sampling_client(model_path=path)
        prompt = encode("Write a short story about a robot who learns to paint.")
        got = sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=args.samples,
                             sampling_params=types.SamplingParams(max_tokens=args.tokens, temperature=1.0,
                                                                  seed=7)).result()
        sampled, scored, trained = [], [], []
        for seq in got.sequences:
            full = prompt + list(seq.tokens)
            n = len(seq.tokens)
            sampled += list(seq.logprobs)
            scored += sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()[-n:]
            d = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                            loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})
            out = tc.forward([d], "cross_entropy").result()
            trained += out.loss_fn_outputs[0]["logprobs"].tolist()[-n:]
        ratio = [math.exp(t - s) for t, s in zip(trained, sampled)]
        return {
            "model": name,
            "tokens": len(sampled),
            "sampled_vs_trainer": pairs(sampled, trained),
            "scored_vs_trainer": pairs(scored, trained),
            "sampled_vs_scored": pairs(sampled, scored),
            "ratio_min": min(ratio),
            "ratio_max": max(ratio),
        }
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("models", nargs="+", help="path=served-name")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    for m in args.models:
        gguf, name = m.split("=", 1)
        rows.append(measure(args.binary, gguf, name, args))
    print(f"{'model':<40} {'pair':<20} {'mean |d|':>10} {'max |d|':>10}")
    for r in rows:
        for k in ("sampled_vs_trainer", "scored_vs_trainer", "sampled_vs_scored"):
            print(f"{r['model']:<40} {k:<20} {r[k]['mean']:>10.2e} {r[k]['max']:>10.2e}")
        print(f"{r['model']:<40} {'ratio range':<20} {r['ratio_min']:>10.4f} {r['ratio_max']:>10.4f}"
              f"  ({r['tokens']} tokens)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
