#!/usr/bin/env python3
"""RL with OpenPipe ART's own client against tandem: teach SmolLM2 to answer "yes".

ART's `ServerlessBackend` speaks the W&B-Training-style `/v1/preview` API, and
`model.openai_client()` sends chat completions to the same base URL, so
pointing `base_url` at tandem is the only change from a hosted ART run.

Setup with the newest ART (openpipe-art 0.5.23 needs Python >= 3.12; no pins):

    python3.12 -m venv target/art23
    target/art23/bin/pip install openpipe-art==0.5.23
    target/art23/bin/python examples/art_yes_no.py --art-path target/art

ART 0.5.18 (the newest release for Python 3.11) works too, with three pins
that work around that release's own loose requirements (examples/README.md):

    python3.11 -m venv target/art18
    target/art18/bin/pip install openpipe-art==0.5.18 "openai<3" "polars<2" wandb==0.25.0
"""

import argparse
import asyncio
import inspect
import json
import os
import pathlib
import time
import urllib.request

# Set before `import art`: ART imports litellm, which otherwise downloads its
# model price map at import time. ART only starts a wandb run when WANDB_API_KEY
# is set, so dropping it keeps everything local; WANDB_MODE and WEAVE_DISABLED
# make sure wandb/weave stay quiet even if something else imports them.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WEAVE_DISABLED", "true")
if os.environ.pop("WANDB_API_KEY", None):
    print("note: ignoring WANDB_API_KEY so that nothing is reported to W&B")

import art  # noqa: E402

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "Answer the question with a single word."
QUESTIONS = [
    "Is the sky blue?",
    "Is water wet?",
    "Can fish fly?",
    "Is 7 a prime number?",
    "Is the moon made of cheese?",
    "Do cats bark?",
    "Is Paris in France?",
    "Is ice cold?",
]


def default_api_key() -> str | None:
    key = os.environ.get("TANDEM_API_KEY")
    if key:
        return key
    path = pathlib.Path("data/api-key")  # written by `tandem serve` on first start
    return path.read_text().strip() if path.exists() else None


def add_common_args(parser: argparse.ArgumentParser, name_prefix: str) -> None:
    """The options both examples share (server, key, model name, sizes)."""
    parser.add_argument("--url", default=os.environ.get("TANDEM_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=default_api_key())
    parser.add_argument("--project", default="art-examples")
    # A fresh name per run, so every run starts from the base model (step 0).
    parser.add_argument("--name", default=f"{name_prefix}-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--art-path", default=".art", help="where ART keeps its local history")
    parser.add_argument("--questions", type=int, default=len(QUESTIONS),
                        help=f"how many of the {len(QUESTIONS)} questions to roll out on")
    # One TrajectoryGroup per question: GRPO compares samples of one prompt.
    parser.add_argument("--samples", type=int, default=8, help="rollouts per question")


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.api_key:
        parser.error("no API key: pass --api-key, set TANDEM_API_KEY or run from a dir with data/api-key")
    if not 1 <= args.questions <= len(QUESTIONS) or args.samples < 1:
        parser.error(f"--questions must be 1..{len(QUESTIONS)} and --samples at least 1")


async def connect(args: argparse.Namespace) -> tuple[art.TrainableModel, art.ServerlessBackend]:
    """Register the model `args.name` with tandem through ART's ServerlessBackend."""
    kwargs = dict(name=args.name, project=args.project, base_model=BASE_MODEL, base_path=args.art_path)
    # ART 0.5.23 stores the model under `run_name` (required there); 0.5.18 has no such argument.
    if "run_name" in inspect.signature(art.TrainableModel.__init__).parameters:
        kwargs["run_name"] = args.name
    model = art.TrainableModel(**kwargs)
    backend = art.ServerlessBackend(base_url=args.url.rstrip("/") + "/v1", api_key=args.api_key)
    await model.register(backend)  # POST /v1/preview/models; tandem fills in the entity
    print(f"registered {model.get_inference_name()} (id {model.id}) with openpipe-art {art_version()}")
    return model, backend


def art_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("openpipe-art")


def is_yes(answer: str | None) -> bool:
    return (answer or "").strip().lower().startswith("yes")


async def rollout(model: art.TrainableModel, inference_name: str, question: str) -> art.Trajectory:
    messages: art.Messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]
    completion = await model.openai_client().chat.completions.create(
        model=inference_name,
        messages=messages,
        temperature=1.0,  # sample from the policy itself, as the RL loss assumes
        max_tokens=6,
        logprobs=True,  # the trainer needs the sampling-time logprobs for its importance ratios
    )
    choice = completion.choices[0]
    # Appending the Choice (not a plain dict) marks these tokens as trainable. ART 0.5.23 also asks
    # for token ids, so tandem trains on exactly the sampled tokens.
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=1.0 if is_yes(choice.message.content) else 0.0,
    )


async def gather_groups(model: art.TrainableModel, step: int, args: argparse.Namespace) -> list[art.TrajectoryGroup]:
    """`args.samples` rollouts of each question, all from checkpoint `step` (pinned, so every
    sample of a batch comes from the same policy)."""
    name = model.get_inference_name(step)
    return await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(rollout(model, name, q) for _ in range(args.samples))
            for q in QUESTIONS[: args.questions]
        ),
        pbar_desc="rollout",
    )


def mean_reward(groups: list[art.TrajectoryGroup]) -> float:
    rewards = [t.reward for g in groups for t in g.trajectories]
    return sum(rewards) / len(rewards)


async def rl_steps(model: art.TrainableModel, backend: art.ServerlessBackend, args: argparse.Namespace,
                   **train_args) -> None:
    """`args.steps` GRPO steps: roll out on the latest step, record its reward, train."""
    for _ in range(args.steps):
        step = await model.get_step()
        groups = await gather_groups(model, step, args)
        reward = mean_reward(groups)
        # Record the reward of checkpoint `step` in ART's local history.jsonl: delete_checkpoints()
        # reads it to pick the best checkpoint. (Logging the groups themselves would need pyarrow
        # and numpy, which the plain openpipe-art install lacks.)
        await model.log(metrics={"reward": reward}, split="train", step=step)
        # Both releases train through the backend (0.5.18 has no TrainableModel.train()).
        result = await backend.train(model, groups, learning_rate=args.learning_rate, **train_args)
        # No loss when every group had equal rewards: GRPO has nothing to learn from.
        loss = result.metrics.get("loss/train")
        loss_text = f"loss {loss:.4f}" if loss is not None else "no gradient step"
        kl = result.metrics.get("loss/kl_policy_ref")
        kl_text = f", kl_policy_ref {kl:.4f}" if kl is not None else ""
        print(f"step {step}: mean reward {reward:.3f} -> trained step {result.step} ({loss_text}{kl_text})")


def checkpoint_steps(url: str, api_key: str, model_id: str) -> list[int]:
    """The model's live checkpoints, straight from the API (to show what the cleanup left)."""
    req = urllib.request.Request(
        f"{url.rstrip('/')}/v1/preview/models/{model_id}/checkpoints?limit=100",
        headers={"Authorization": f"Bearer {api_key}"},
    )
    with urllib.request.urlopen(req) as r:
        return sorted(c["step"] for c in json.load(r)["data"])


async def cleanup_and_report(model: art.TrainableModel, args: argparse.Namespace) -> float:
    """ART's cleanup (keep the latest checkpoint and the best by train/reward), then the reward of
    the latest step, which it returns."""
    before = await asyncio.to_thread(checkpoint_steps, args.url, args.api_key, model.id)
    await model.delete_checkpoints(best_checkpoint_metric="train/reward")
    after = await asyncio.to_thread(checkpoint_steps, args.url, args.api_key, model.id)
    print(f"checkpoints before cleanup: steps {before}; after: steps {after}")
    step = await model.get_step()
    reward = mean_reward(await gather_groups(model, step, args))
    print(f"step {step}: mean reward {reward:.3f} (final, after training)")
    return reward


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser, "yes-no")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    args = parser.parse_args()
    check_args(parser, args)

    started = time.monotonic()
    model, backend = await connect(args)
    await rl_steps(model, backend, args)
    await cleanup_and_report(model, args)
    print(f"done in {time.monotonic() - started:.0f}s")
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
