"""The RL loop of bench/rl_trl.py's sums task through the Tinker API against the same loop through
ART 0.5.23's ServerlessBackend (the `/v1/preview` job path), both on one tandem server, one after
the other: per-step time (rollouts, training) and wall time to the same held-out gain.

    target/cookbookenv/bin/python bench/rl_tinker.py tinker URL KEY --json OUT [--steps N] [--runs R]
    python3 bench/rl_tinker.py compare ART.json TINKER.json [TRL.json]

The ART side is `bench/rl_trl.py tandem` unchanged. The Tinker side is the loop a tinker-cookbook
user writes, with the SDK 0.38.0: the same prompts x rollouts a step, MAX_TOKENS, temperature 1,
learning rate and steps, rollouts sampled from the latest weights (`save_weights_and_get_sampling_
client`), advantages as ART computes them (reward minus the group's mean, over its standard
deviation; groups of equal rewards left out), the sampler's logprobs sent with each datum
(`importance_sampling`: no old logprobs recomputed), one `forward_backward` + `optim_step` a step.
The prompt is rendered with the chat template of the tokenizer tandem writes (HF_HUB_CACHE).
Held-out reward: greedy completions of the held-out problems after each step, left out of the wall
clock, as on the ART side. With TRL's run (`bench/rl_trl.py trl`, run after the server stopped),
both sides' time to TRL's held-out gain is compared with TRL's.
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rl_trl  # noqa: E402  (the task: problems, question, answer, reward, the step sizes)
from rl_trl import LEARNING_RATE, MAX_TOKENS, PROMPTS, ROLLOUTS, STEPS  # noqa: E402


async def tinker_side(args):
    import tinker
    from tinker import types
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.base_model)
    service = tinker.ServiceClient(base_url=args.url, api_key=f"tml-{args.key}")
    train, held = rl_trl.problems()

    def prompt(a, b):
        ids = tok.apply_chat_template([{"role": "user", "content": rl_trl.question(a, b)}], tokenize=True,
                                      add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    async def run(index):
        tc = await service.create_lora_training_client(base_model=args.base_model, rank=8,
                                                       train_unembed=args.train_unembed)
        sampler = await tc.save_weights_and_get_sampling_client()

        async def evaluate(sampler):
            async def one(a, b):
                out = await sampler.sample(prompt=types.ModelInput.from_ints(prompt(a, b)), num_samples=1,
                                                 sampling_params=types.SamplingParams(max_tokens=MAX_TOKENS,
                                                                                      temperature=0.0))
                return rl_trl.reward(tok.decode(out.sequences[0].tokens, skip_special_tokens=True),
                                     rl_trl.answer(a, b))
            return sum(await asyncio.gather(*(one(a, b) for a, b in held))) / len(held)

        async def group(sampler, a, b):
            ids = prompt(a, b)
            out = await sampler.sample(prompt=types.ModelInput.from_ints(ids), num_samples=ROLLOUTS,
                                             sampling_params=types.SamplingParams(max_tokens=MAX_TOKENS,
                                                                                  temperature=1.0))
            rewards = [rl_trl.reward(tok.decode(s.tokens, skip_special_tokens=True), rl_trl.answer(a, b))
                       for s in out.sequences]
            return ids, out.sequences, rewards

        def datums(ids, sequences, rewards):
            mean = sum(rewards) / len(rewards)
            std = statistics.pstdev(rewards)
            if std == 0:
                return []
            out = []
            for seq, r in zip(sequences, rewards):
                if not seq.tokens:
                    continue
                tokens = ids + list(seq.tokens)
                n_prompt = len(ids) - 1
                out.append(types.Datum(
                    model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:],
                                    "logprobs": [0.0] * n_prompt + list(seq.logprobs),
                                    "advantages": [0.0] * n_prompt + [(r - mean) / std] * len(seq.tokens)}))
            return out

        curve, wall, rewards, phases = [(0, 0.0, await evaluate(sampler))], 0.0, [], []
        for step in range(args.steps):
            t = time.perf_counter()
            batch = train[step * PROMPTS:(step + 1) * PROMPTS]
            groups = await asyncio.gather(*(group(sampler, a, b) for a, b in batch))
            rolled = time.perf_counter()
            data = [d for g in groups for d in datums(*g)]
            if data:
                # Submitted back to back, then awaited: the SDK's pipelined form.
                fb = tc.forward_backward(data, "importance_sampling")
                opt = tc.optim_step(types.AdamParams(learning_rate=args.learning_rate))
                await fb
                await opt
            sampler = await tc.save_weights_and_get_sampling_client()
            wall += time.perf_counter() - t
            phases.append((rolled - t, time.perf_counter() - rolled))
            rewards.append(sum(r for g in groups for r in g[2]) / (PROMPTS * ROLLOUTS))
            curve.append((step + 1, wall, await evaluate(sampler)))
            print(f"tinker run {index} step {step + 1}: {wall:6.1f} s (rollouts {phases[-1][0]:.1f} s, "
                  f"train {phases[-1][1]:.1f} s), train reward {rewards[-1]:.3f}, held-out {curve[-1][2]:.3f}",
                  file=sys.stderr)
        return {"curve": curve, "train_reward": rewards, "phases": phases}

    runs = [await run(i) for i in range(args.runs)]
    return {"side": "tinker", "runs": runs}


def compare(art_run, tinker_run, trl_run=None):
    def median(xs):
        return sorted(xs)[len(xs) // 2]

    sides = (("ART job path", art_run), ("Tinker", tinker_run))
    rows = {}
    for name, side in sides:
        phases = [p for run in side["runs"] for p in run["phases"]]
        gains = [run["curve"][-1][2] - run["curve"][0][2] for run in side["runs"]]
        walls = [run["curve"][-1][1] for run in side["runs"]]
        rows[name] = (median([p[0] for p in phases]), median([p[1] for p in phases]), median(gains), median(walls))
        print(f"{name:13s} rollouts {rows[name][0]:.2f} s a step, training {rows[name][1]:.2f} s a step; "
              f"median over {len(side['runs'])} runs: held-out gain {rows[name][2]:+.3f} in {rows[name][3]:.1f} s")
    a, t = rows["ART job path"], rows["Tinker"]
    print(f"Tinker / job path: training {t[1] / a[1]:.2f}x the job's time a step, rollouts {t[0] / a[0]:.2f}x, "
          f"a whole step {(t[0] + t[1]) / (a[0] + a[1]):.2f}x")
    target = a[2]
    if target > 0:
        reached = []
        for run in tinker_run["runs"]:
            hit = next(((s, w) for s, w, r in run["curve"] if r - run["curve"][0][2] >= target), None)
            reached.append(hit[1] if hit else float("inf"))
        m = median(reached)
        print(f"the job path's median gain {target:+.3f}: Tinker's median time to reach it "
              + (f"{m:.1f} s against the job path's {a[3]:.1f} s" if m != float("inf") else "not reached"))
    if trl_run is not None:
        against_trl(sides, trl_run)


def against_trl(sides, trl_run):
    """Each side's median wall time to TRL's held-out gain (the rule of bench/rl_trl.py: the first
    evaluation at or above it), as a ratio of TRL's time to its own gain."""
    steps, trl_wall, final = trl_run["curve"][-1]
    gain = final - trl_run["curve"][0][2]
    print(f"TRL GRPOTrainer: held-out gain {gain:+.3f} after {steps} steps in {trl_wall:.1f} s "
          f"({trl_run['config']}), peak RSS {trl_run['peak_rss_mb']:.0f} MB")
    if gain <= 0:
        print("TRL gained nothing on the held-out problems: no equal-gain time to compare")
        return
    for name, side in sides:
        times = []
        for run in side["runs"]:
            first, _ = rl_trl.reach(run["curve"], gain)
            times.append(first[1] if first else float("inf"))
        m = sorted(times)[len(times) // 2]
        reached = sum(t != float("inf") for t in times)
        print(f"{name:13s} reaches TRL's gain in {reached} of {len(times)} runs; median "
              + (f"{m:.1f} s: {trl_wall / m:.2f}x faster than TRL" if m != float("inf") else "not reached"))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="side", required=True)
    t = sub.add_parser("tinker")
    t.add_argument("url")
    t.add_argument("key")
    t.add_argument("--steps", type=int, default=STEPS)
    t.add_argument("--runs", type=int, default=3)
    t.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    t.add_argument("--base-model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    t.add_argument("--json", required=True)
    t.add_argument("--no-train-unembed", dest="train_unembed", action="store_false",
                   help="train no LoRA on the output head (the SDK trains one by default; ART's jobs do not)")
    c = sub.add_parser("compare")
    c.add_argument("art_json")
    c.add_argument("tinker_json")
    c.add_argument("trl_json", nargs="?", help="TRL's run of bench/rl_trl.py trl, to compare both sides with")
    args = ap.parse_args()
    if args.side == "tinker":
        with open(args.json, "w") as f:
            json.dump(asyncio.run(tinker_side(args)), f)
    else:
        trl_run = None
        if args.trl_json:
            with open(args.trl_json) as f:
                trl_run = json.load(f)
        with open(args.art_json) as a, open(args.tinker_json) as b:
            compare(json.load(a), json.load(b), trl_run)


if __name__ == "__main__":
    main()
