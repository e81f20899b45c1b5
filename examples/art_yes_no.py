#!/usr/bin/env python3
"""RL with OpenPipe ART's own client against tandem: teach SmolLM2 to answer "yes".

ART's `ServerlessBackend` speaks the W&B-Training-style `/v1/preview` API, and
`model.openai_client()` sends chat completions to the same base URL, so
pointing `base_url` at tandem is the only change from a hosted ART run.

Setup (openpipe-art==0.5.18 is the newest release for Python 3.11). The pins
work around that release's own loose requirements: openai 3.x moved to httpx2
(ART passes an httpx Timeout -> TypeError), polars 2 refuses `mean` over the
string column in ART's history (delete_checkpoints fails), and
ServerlessBackend.train() always imports wandb, which the plain install lacks:

    python3 -m venv target/artenv
    target/artenv/bin/pip install openpipe-art==0.5.18 "openai<3" "polars<2" wandb==0.25.0
    target/artenv/bin/python examples/art_yes_no.py --url http://127.0.0.1:8000 --art-path target/art
"""

import argparse
import asyncio
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
SAMPLES_PER_QUESTION = 8  # one TrajectoryGroup per question: GRPO compares samples of one prompt


def default_api_key() -> str | None:
    key = os.environ.get("TANDEM_API_KEY")
    if key:
        return key
    path = pathlib.Path("data/api-key")  # written by `tandem serve` on first start
    return path.read_text().strip() if path.exists() else None


async def rollout(model: art.TrainableModel, inference_name: str, question: str) -> art.Trajectory:
    messages: art.Messages = [
        {"role": "system", "content": "Answer the question with a single word."},
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
    answer = (choice.message.content or "").strip().lower()
    # Appending the Choice (not a plain dict) marks these tokens as trainable.
    return art.Trajectory(
        messages_and_choices=[*messages, choice],
        reward=1.0 if answer.startswith("yes") else 0.0,
    )


async def gather_groups(model: art.TrainableModel, inference_name: str) -> list[art.TrajectoryGroup]:
    return await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(
                rollout(model, inference_name, q) for _ in range(SAMPLES_PER_QUESTION)
            )
            for q in QUESTIONS
        ),
        pbar_desc="rollout",
    )


def checkpoint_steps(url: str, api_key: str, model_id: str) -> list[int]:
    """The model's live checkpoints, straight from the API (to show what the cleanup left)."""
    req = urllib.request.Request(
        f"{url.rstrip('/')}/v1/preview/models/{model_id}/checkpoints?limit=100",
        headers={"Authorization": f"Bearer {api_key}"},
    )
    with urllib.request.urlopen(req) as r:
        return sorted(c["step"] for c in json.load(r)["data"])


def mean_reward(groups: list[art.TrajectoryGroup]) -> float:
    rewards = [t.reward for g in groups for t in g.trajectories]
    return sum(rewards) / len(rewards)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("TANDEM_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=default_api_key())
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--project", default="art-examples")
    # A fresh name per run, so every run starts from the base model (step 0).
    parser.add_argument("--name", default=f"yes-no-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--art-path", default=".art", help="where ART keeps its local history")
    args = parser.parse_args()
    if not args.api_key:
        parser.error("no API key: pass --api-key, set TANDEM_API_KEY or run from a dir with data/api-key")

    started = time.monotonic()
    model = art.TrainableModel(
        name=args.name,
        project=args.project,
        base_model=BASE_MODEL,
        base_path=args.art_path,
    )
    backend = art.ServerlessBackend(base_url=args.url.rstrip("/") + "/v1", api_key=args.api_key)
    await model.register(backend)  # POST /v1/preview/models; tandem fills in the entity
    print(f"registered {model.get_inference_name()} (id {model.id})")

    for _ in range(args.steps):
        step = await model.get_step()
        # Pin the step so every sample of this batch comes from the same policy.
        groups = await gather_groups(model, model.get_inference_name(step))
        reward = mean_reward(groups)
        # Record the reward of checkpoint `step` in ART's local history.jsonl:
        # delete_checkpoints() reads it to pick the best checkpoint. (Logging the
        # groups themselves would need pyarrow and numpy, which the plain
        # openpipe-art install lacks.)
        await model.log(metrics={"reward": reward}, split="train", step=step)
        # 0.5.18 has no TrainableModel.train(); training goes through the backend.
        result = await backend.train(model, groups, learning_rate=args.learning_rate)
        # No loss when every group had equal rewards: GRPO has nothing to learn from.
        loss = result.metrics.get("loss/train")
        loss_text = f"loss {loss:.4f}" if loss is not None else "no gradient step"
        print(f"step {step}: mean reward {reward:.3f} -> trained step {result.step} ({loss_text})")

    # ART's cleanup: keep the latest checkpoint and the best by train/reward, delete the rest.
    before = await asyncio.to_thread(checkpoint_steps, args.url, args.api_key, model.id)
    await model.delete_checkpoints(best_checkpoint_metric="train/reward")
    after = await asyncio.to_thread(checkpoint_steps, args.url, args.api_key, model.id)
    print(f"checkpoints before cleanup: steps {before}; after: steps {after}")

    step = await model.get_step()
    groups = await gather_groups(model, model.get_inference_name(step))
    print(f"step {step}: mean reward {mean_reward(groups):.3f} (final, after training)")
    print(f"done in {time.monotonic() - started:.0f}s")
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
