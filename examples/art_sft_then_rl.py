#!/usr/bin/env python3
"""SFT, then RL, with OpenPipe ART's own client against tandem.

The common recipe for an agent: supervised fine-tuning on a few demonstrations gets the model
into the right format, then RL sharpens it on its own rollouts. Here the task is the one of
art_yes_no.py (reward 1 for an answer that starts with "yes"):

1. roll out on the base model (step 0) and print its mean reward;
2. `model.train_sft(...)` on one demonstration per question (the user asks, the assistant says
   "Yes."): ART's own SFT call, unchanged. ART uploads SFT data to W&B as a dataset artifact;
   `tandem_sft.tandem_sft_uploads(backend)` sends that upload to tandem's datasets route instead;
3. roll out on the SFT checkpoint and print its mean reward;
4. `--steps` GRPO steps through `backend.train(...)`. With ART 0.5.23 they carry a KL penalty
   towards the SFT checkpoint (`kl_penalty_coef`, `kl_penalty_reference_step`), so RL does not
   wander far from what SFT taught; each step prints `loss/kl_policy_ref`;
5. ART's checkpoint cleanup, and the final mean reward.

Setup as in art_yes_no.py (openpipe-art 0.5.23 on Python 3.12, or 0.5.18 with its pins); then,
on a running `make run` server:

    target/art23/bin/python examples/art_sft_then_rl.py --art-path target/art
"""

import argparse
import asyncio
import inspect
import time

import art_yes_no as yn  # sets up the environment before importing art
import tandem_sft
from art_yes_no import art


async def mean_reward_at(model: art.TrainableModel, step: int, args: argparse.Namespace) -> float:
    return yn.mean_reward(await yn.gather_groups(model, step, args))


def demonstrations(args: argparse.Namespace) -> list[art.Trajectory]:
    """One SFT conversation per question. SFT trains on the assistant turns; the reward is unused."""
    return [
        art.Trajectory(
            messages_and_choices=[
                {"role": "system", "content": yn.SYSTEM},
                {"role": "user", "content": question},
                {"role": "assistant", "content": "Yes."},
            ],
            reward=0.0,
        )
        for question in yn.QUESTIONS[: args.questions]
    ]


def supports_kl_penalty(backend: art.ServerlessBackend) -> bool:
    return "kl_penalty_coef" in inspect.signature(backend.train).parameters  # 0.5.23, not 0.5.18


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    yn.add_common_args(parser, "sft-rl")
    parser.add_argument("--sft-learning-rate", type=float, default=1e-3)
    parser.add_argument("--sft-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2, help="RL steps after SFT")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="of the RL steps")
    parser.add_argument("--kl-coef", type=float, default=0.1,
                        help="KL penalty towards the SFT checkpoint during RL (ART 0.5.23; 0 for none)")
    args = parser.parse_args()
    yn.check_args(parser, args)

    started = time.monotonic()
    model, backend = await yn.connect(args)
    base = await mean_reward_at(model, 0, args)
    print(f"step 0 (base model): mean reward {base:.3f}")

    config = art.TrainSFTConfig(learning_rate=args.sft_learning_rate, batch_size=args.sft_batch_size)
    with tandem_sft.tandem_sft_uploads(backend) as uploads:
        await model.train_sft(demonstrations(args), config=config)
    sft_step = await model.get_step()
    dataset = uploads.datasets[0]
    print(f"SFT on {dataset['num_rows']} demonstrations (dataset {dataset['url']}) -> step {sft_step}")
    sft = await mean_reward_at(model, sft_step, args)
    print(f"step {sft_step} (after SFT): mean reward {sft:.3f}")

    train_args = {}
    if args.kl_coef > 0 and supports_kl_penalty(backend):
        train_args = dict(kl_penalty_coef=args.kl_coef, kl_penalty_reference_step=sft_step)
    elif args.kl_coef > 0:
        print(f"note: openpipe-art {yn.art_version()} has no KL penalty; RL runs without it")
    await yn.rl_steps(model, backend, args, **train_args)
    await yn.cleanup_and_report(model, args)
    print(f"done in {time.monotonic() - started:.0f}s")
    await backend.close()


if __name__ == "__main__":
    asyncio.run(main())
