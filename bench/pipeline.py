"""ART's asynchronous `PipelineTrainer` against its synchronous loop, both through ART 0.5.23's
`ServerlessBackend` pointed at one tandem server: trained trajectories per minute.

    target/art23env/bin/python bench/pipeline.py URL KEY [--steps 6] [--pid PID]

The task: a yes/no/maybe prompt, reward by the first word (maybe 1, no 0.75, yes 0.5, else 0),
GROUPS groups of ROLLOUTS rollouts a step (n = ROLLOUTS in one request), up to 8 tokens each.
The synchronous loop rolls out a step's groups, trains on them, then rolls out the next (what
`model.train` users write); the pipeline keeps rolling out on the current checkpoint while the
previous batch trains (at most `max_steps_off_policy` behind). Both run the same number of steps
with the same batch size; each run's model is fresh. A trained trajectory is one in a group whose
rewards differ (the pipeline drops the others before training; the loop trains them, to no
effect). Prints both rates and their ratio, and with --pid (the server's) how busy each run kept the
machine: the server's CPU seconds over the wall time times the cores. A loop that already keeps
the cores busy leaves a pipeline nothing to overlap.
"""
import os

# Before `import art`, as tests/python/test_art.py: nothing goes to W&B or the network.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["WANDB_MODE"] = "disabled"
os.environ["WEAVE_DISABLED"] = "true"
os.environ.pop("WANDB_API_KEY", None)
os.environ.setdefault("TQDM_DISABLE", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import itertools  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import sys  # noqa: E402
import types  # noqa: E402

import art  # noqa: E402
from art.pipeline_trainer import PipelineTrainer  # noqa: E402
from art.pipeline_tuner import PipelineRuntimeConfig  # noqa: E402

# PipelineTrainer's backend check imports `art.local.backend` only to ask whether the backend is
# a LocalBackend, and that module imports torch, which `openpipe-art` does not install (a
# ServerlessBackend user would have to install PyTorch for that one isinstance check). Where
# torch is missing, a stand-in module answers the check: no backend is its `LocalBackend`, which
# is the truth for the ServerlessBackend used here; nothing else of ART is replaced.
try:
    import art.local.backend  # noqa: E402,F401
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
    stand_in = types.ModuleType("art.local.backend")
    stand_in.LocalBackend = type("LocalBackend", (), {})
    sys.modules["art.local.backend"] = stand_in

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GROUPS, ROLLOUTS, MAX_TOKENS, LEARNING_RATE = 4, 4, 8, 5e-5
SCENARIOS = [f"{p} with {' or '.join(w)}" for p in ("Respond", "Just respond", "Answer")
             for w in itertools.permutations(["yes", "no", "maybe"], 2)]


def reward(text):
    words = re.split(r"\s+", (text or "").strip().lower())
    first = words[0].strip(".,!?:;\"'()[]{}") if words else ""
    return {"maybe": 1.0, "no": 0.75, "yes": 0.5}.get(first, 0.0)


async def rollout(model, scenario, _config=None):
    messages = [{"role": "user", "content": scenario}]
    r = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=messages, max_tokens=MAX_TOKENS, n=ROLLOUTS,
        temperature=1.0, logprobs=True)
    return art.TrajectoryGroup([art.Trajectory(messages_and_choices=[*messages, c], reward=reward(c.message.content))
                                for c in r.choices])


async def fresh_model(backend, tag, base_path):
    name = f"bench-{tag}-{int(time.time() * 1000) % 10**9}"
    model = art.TrainableModel(name=name, run_name=name, project="bench-pipeline", base_model=BASE_MODEL,
                               base_path=base_path)
    await model.register(backend)
    return model


async def synchronous(backend, steps, base_path):
    model = await fresh_model(backend, "sync", base_path)
    scenarios = itertools.cycle(SCENARIOS)
    trained, t0 = 0, time.monotonic()
    for _ in range(steps):
        groups = await asyncio.gather(*(rollout(model, next(scenarios)) for _ in range(GROUPS)))
        await backend.train(model, groups, learning_rate=LEARNING_RATE)
        # Only groups whose rewards differ teach anything (GRPO); the pipeline drops the others
        # before training, so they are not counted here either.
        trained += sum(len(g.trajectories) for g in groups if len({t.reward for t in g.trajectories}) > 1)
    return trained, time.monotonic() - t0, await model.get_step()


async def pipelined(backend, steps, base_path):
    model = await fresh_model(backend, "pipe", base_path)
    trainer = PipelineTrainer(
        model=model, backend=backend, rollout_fn=rollout, scenarios=itertools.cycle(SCENARIOS), config=None,
        learning_rate=LEARNING_RATE, max_steps=steps,
        pipeline=PipelineRuntimeConfig(num_rollout_workers=GROUPS, min_batch_size=GROUPS, max_batch_size=GROUPS),
        eval_fn=None, eval_at_start=False, save_checkpoint=False, log_interval_seconds=3600.0)
    t0 = time.monotonic()
    await trainer.train()
    secs = time.monotonic() - t0
    step = await model.get_step()
    return step * GROUPS * ROLLOUTS, secs, step


def cpu_seconds(pid):
    """The process's user + system CPU time (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("key")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pid", type=int)
    args = ap.parse_args()
    backend = art.ServerlessBackend(base_url=args.url + "/v1", api_key=args.key)
    with tempfile.TemporaryDirectory() as base_path:
        # A warm-up step loads the trainer's base, so that neither run pays for it.
        await synchronous(backend, 1, base_path)
        results = {}
        for name, run in (("synchronous", synchronous), ("pipeline", pipelined)):
            cpu = cpu_seconds(args.pid) if args.pid else None
            trained, secs, step = await run(backend, args.steps, base_path)
            results[name] = trained / secs * 60
            busy = ""
            if cpu is not None:
                used = cpu_seconds(args.pid) - cpu
                busy = f", server CPU {used:.1f} s = {used / (secs * os.cpu_count()):.0%} of {os.cpu_count()} cores"
            print(f"{name:12} {trained} trajectories trained in {secs:6.1f} s (step {step}): "
                  f"{results[name]:6.1f} trajectories/min{busy}")
    print(f"pipeline / synchronous = {results['pipeline'] / results['synchronous']:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
