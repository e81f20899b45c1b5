"""RL on tool use with `tool_choice: "auto"` (issue 51, item 5): ART's ServerlessBackend trains a
multi-turn tool task on a real model served by tandem, and the held-out reward is measured.

Usage: python bench/rl_tools.py <tandem binary> <gguf> <served name> [--steps N] [--lr X] [--json F]

Run with an ART 0.5.23 virtualenv (target/art23env). The task: every person has a secret code
that only a tool knows (random four-digit codes, fixed by a seed). The user asks for a person's
code; the model has two tools, `secret_code(name)` to look it up and `submit_code(code)` to give
its answer (a final-answer tool, as pydantic-ai's `final_result`), and `auto` on every turn, as
agents send it: tandem reads each call in the model's own syntax. Each lookup is answered; the
episode ends at a submission, a text reply or after four turns. Reward 1 when the submitted code
(or the text reply) is the person's code, else 0: guessing a four-digit code is hopeless, so
every point of reward is a lookup made, read and used. Held-out people are never trained on.

(A plain text answer after the lookup would be the simpler task, but Qwen2.5-Coder 0.5B almost
never writes one: given the tool's result it calls the tool again, 47 of 48 samples at
temperature 1, unconstrained too, so every group's rewards are equal and there is nothing to
learn from. With a tool to answer through, it submits the right code in ~60% of samples.)

Prints, per step, the train reward, the share of first turns that made a call tandem parsed, and
the held-out reward every `--eval-every` steps, sampled as in training (temperature 1: the greedy
policy of the 0.5B already solves most people, so the sampled policy is what RL has to improve)
and greedy; the last line is the before/after.
"""

import argparse
import asyncio
import json
import random
import sys
import time

sys.path.insert(0, "tests/python")
from tandem_server import Server  # noqa: E402

import art  # noqa: E402

KEY = "bench-rl-tools"
FIRST = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John", "Margaret", "Dennis",
         "Radia", "Ken", "Katherine", "Tim", "Hedy", "Linus", "Annie", "Claude", "Sophie", "Niklaus"]
LAST = ["Lovelace", "Turing", "Hopper", "Dijkstra", "Liskov", "Knuth", "Allen", "Backus", "Hamilton",
        "Ritchie", "Perlman", "Thompson", "Johnson", "Berners", "Lamarr", "Torvalds", "Easley", "Shannon"]
TOOLS = [
    {"type": "function", "function": {
        "name": "secret_code", "description": "Looks up the secret code of a person by their full name.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
    {"type": "function", "function": {
        "name": "submit_code", "description": "Gives the user the secret code you found. Call it once you know the code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
]
SYSTEM = ("You are a helpful assistant. You do not know anyone's secret code: look it up with secret_code, "
          "then give it with submit_code.")


def people(seed=51):
    rng = random.Random(seed)
    names = sorted({f"{f} {l}" for f in FIRST for l in LAST})
    rng.shuffle(names)
    return {n: f"{rng.randrange(1000, 10000)}" for n in names}


def tool_result(codes, arguments):
    try:
        name = str(json.loads(arguments).get("name", ""))
    except (ValueError, AttributeError):
        return "error: the arguments are not a JSON object with a name"
    hit = next((n for n in codes if n.lower() == name.strip().lower()), None)
    return f"The secret code of {hit} is {codes[hit]}." if hit else f"No person named {name!r} is known."


LIMIT = asyncio.Semaphore(32)


async def episode(client, model, codes, person, temperature, turns=4):
    """One conversation: up to `turns` model turns, each lookup answered, until a submission or a
    text reply. Returns the trajectory's messages and choices, whether the first turn made a
    call, and the reward."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is the secret code of {person}?"}]
    history, first_call, answer = list(messages), None, ""
    for _ in range(turns):
        async with LIMIT:  # under the server's per-entity bound on concurrent requests
            r = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="auto",
                                                     max_tokens=48, temperature=temperature, logprobs=True)
        choice = r.choices[0]
        history.append(choice)
        calls = choice.message.tool_calls or []
        if first_call is None:
            first_call = bool(calls)
        if not calls:
            answer = choice.message.content or ""
            break
        submitted = next((c for c in calls if c.function.name == "submit_code"), None)
        if submitted is not None:
            try:
                answer = str(json.loads(submitted.function.arguments).get("code", ""))
            except (ValueError, AttributeError):
                answer = ""
            break
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in calls:
            tool = {"role": "tool", "tool_call_id": call.id, "content": tool_result(codes, call.function.arguments)}
            messages.append(tool)
            history.append(tool)
    return history, first_call, float(codes[person] in answer)


async def train(args):
    server = Server(args.binary, args.gguf, KEY, extra=["--served-model-name", args.name])
    try:
        codes = people()
        names = list(codes)
        held, pool = names[:args.held_out], names[args.held_out:]
        backend = art.ServerlessBackend(base_url=server.url + "/v1", api_key=KEY)
        model = art.TrainableModel(name=f"rl-tools-{int(time.time()) % 10**6}", project="bench-rl-tools",
                                   base_model=args.name, run_name="rl-tools")
        await model.register(backend)
        client = model.openai_client()

        async def evaluate(step):
            """The held-out reward sampled as in training (temperature 1, `--eval-samples` per
            person), the share of first turns that called, and the greedy reward."""
            name = model.get_inference_name(step)
            sampled = await asyncio.gather(*(episode(client, name, codes, p, 1.0)
                                             for p in held for _ in range(args.eval_samples)))
            greedy = await asyncio.gather(*(episode(client, name, codes, p, 0.0) for p in held))
            return (sum(r for _, _, r in sampled) / len(sampled), sum(bool(c) for _, c, _ in sampled) / len(sampled),
                    sum(r for _, _, r in greedy) / len(greedy))

        started = time.monotonic()
        before, called, greedy = await evaluate(0)
        curve = [{"step": 0, "held_out": before, "held_out_calls": called, "held_out_greedy": greedy, "seconds": 0.0}]
        print(f"step 0: held-out reward {before:.3f} (greedy {greedy:.3f}), first-turn calls {called:.2f}", flush=True)
        rng = random.Random(7)
        step = 0
        for i in range(args.steps):
            batch = rng.sample(pool, args.prompts)
            groups, first_calls = [], 0
            for person in batch:
                runs = await asyncio.gather(*(episode(client, model.get_inference_name(step), codes, person, 1.0)
                                              for _ in range(args.rollouts)))
                groups.append(art.TrajectoryGroup([art.Trajectory(messages_and_choices=h, tools=TOOLS, reward=r)
                                                   for h, _, r in runs]))
                first_calls += sum(bool(c) for _, c, _ in runs)
            rewards = [t.reward for g in groups for t in g.trajectories]
            calls = first_calls / len(rewards)
            result = await backend.train(model, groups, learning_rate=args.lr)
            step = result.step
            point = {"step": step, "train_reward": sum(rewards) / len(rewards), "first_turn_calls": calls,
                     "seconds": time.monotonic() - started}
            if (i + 1) % args.eval_every == 0 or i + 1 == args.steps:
                point["held_out"], point["held_out_calls"], point["held_out_greedy"] = await evaluate(step)
            curve.append(point)
            print(f"step {step}: train reward {point['train_reward']:.3f}, first-turn calls {calls:.2f}"
                  + (f", held-out reward {point['held_out']:.3f} (greedy {point['held_out_greedy']:.3f}, "
                     f"first-turn calls {point['held_out_calls']:.2f})"
                     if "held_out" in point else "")
                  + f", {point['seconds']:.0f} s", flush=True)
        after = curve[-1]["held_out"]
        print(f"held-out reward: {before:.3f} before, {after:.3f} after {step} steps ({len(held)} held-out people "
              f"x {args.eval_samples} samples at temperature 1; greedy {greedy:.3f} -> {curve[-1]['held_out_greedy']:.3f}; "
              f"{time.monotonic() - started:.0f} s)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": args.name, "lr": args.lr, "curve": curve}, f, indent=1)
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("gguf")
    ap.add_argument("name")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=6)
    ap.add_argument("--held-out", type=int, default=24)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--json")
    asyncio.run(train(ap.parse_args()))


if __name__ == "__main__":
    main()
