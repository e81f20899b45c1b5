"""tinker-cookbook 0.6.1's training loops, unchanged, against tandem, offline, on the bundled model.

Usage: python test_cookbook.py <path to tandem binary> <model gguf> [--full]

Run with a virtualenv that has `tinker-cookbook==0.6.1` and its dependencies (`make test-cookbook`
makes target/cookbookenv). Starts a server and points the cookbook at it with `base_url` and a
`tml-` key. Tokenizers load by the model's name from the hub cache the server writes
(`HF_HUB_CACHE=<data dir>/hf-hub`, `HF_HUB_OFFLINE=1`): nothing is downloaded. The renderer is the
cookbook's `qwen3_instruct` (ChatML, SmolLM2's format). Checks:

  math-rl   recipes/math_rl with env=arithmetic and loss_fn=importance_sampling (its `cli_main`,
            as its command line runs it): every step samples groups from the latest sampler
            weights, scores them and trains; afterwards the final sampler weights (loaded by
            their tinker:// path, after the run's session has ended) answer held-out problems
            better than the base model, greedily, scored by the recipe's own environment
  chat-sl   the supervised loop recipes/chat_sl runs (`supervised.train.main`) on the cookbook's
            bundled conversations.jsonl with 16 conversations held out: the cookbook's own
            test-set evaluator reports a lower test NLL after training than before

Sizes are small for `make test-cookbook`; `--full` runs the sizes docs/tinker.md reports.
Prints 'cookbook: N passed, M failed' and exits non-zero on any failure.
"""

import asyncio
import json
import os
import sys
import time

KEY = "cookbook-test-key"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
RENDERER = "qwen3_instruct"
FULL = "--full" in sys.argv

# The data directory is chosen before anything imports huggingface_hub: it reads HF_HUB_CACHE once.
from tandem_server import finish, run_checks, scratch  # noqa: E402  (standard library only)

DATA = scratch("tandem-cookbook-")
os.environ["HF_HUB_CACHE"] = os.path.join(DATA, "hf-hub")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TINKER_API_KEY"] = f"tml-{KEY}"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tinker  # noqa: E402
from tinker import types  # noqa: E402


def metrics(log_path):
    with open(os.path.join(log_path, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def final_sampler_path(log_path):
    """The sampler weights of the run's last save, from the checkpoints.jsonl the cookbook writes."""
    with open(os.path.join(log_path, "checkpoints.jsonl")) as f:
        saves = [json.loads(line) for line in f if line.strip()]
    paths = [s["sampler_path"] for s in saves if s.get("sampler_path")]
    assert paths, saves
    return paths[-1]


async def held_out_reward(sampling_client, renderer, problems, samples=4):
    """Mean reward, format and correctness of answers to `problems` as the cookbook's own test-set
    evaluator measures them: sampled at temperature 1 (`samples` a problem, seeded so a rerun on the
    same build repeats), scored by the recipe's ArithmeticEnv (reward = correct + 0.1 * (format - 1):
    an answer must end within max_tokens). Greedy answers made a poor yardstick: on 48 problems the
    base model's two or three lucky sums outweighed everything the run learned in one CI run."""
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv

    def env(x, y):
        return ArithmeticEnv(x, y, renderer=renderer, convo_prefix=ArithmeticEnv.standard_fewshot_prefix())

    async def one(i, x, y):
        prompt, stop = await env(x, y).initial_observation()
        out = await sampling_client.sample_async(
            prompt=prompt, num_samples=samples,
            sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, stop=stop, seed=1000 + i))
        steps = [await env(x, y).step(seq.tokens) for seq in out.sequences]
        return [(s.reward, s.metrics["format"], s.metrics["correct"]) for s in steps]

    scores = [s for group in await asyncio.gather(*(one(i, x, y) for i, (x, y) in enumerate(problems)))
              for s in group]
    return tuple(sum(s[i] for s in scores) / len(scores) for i in range(3))


def math_rl(server):
    import numpy as np
    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl import train
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    log_path = os.path.join(DATA, "math_rl")
    steps = 30 if FULL else 12
    config = train.CLIConfig(
        model_name=BASE, renderer_name=RENDERER, env="arithmetic", lora_rank=8, group_size=4,
        groups_per_batch=16 if FULL else 8, learning_rate=2e-4, max_tokens=5, loss_fn="importance_sampling",
        max_steps=steps, eval_every=0, save_every=0, base_url=server.url, log_path=log_path,
        behavior_if_log_dir_exists="delete")
    start = time.monotonic()
    asyncio.run(train.cli_main(config))
    took = time.monotonic() - start
    rows = metrics(log_path)
    curve = [r["env/all/reward/total"] for r in rows if "env/all/reward/total" in r]
    assert len(curve) == steps, (len(curve), rows[-1])

    # Held out: problems drawn from a seed the dataset's batches (seeded 0, 1, 2, ...) never use.
    rng = np.random.RandomState(987_654)
    problems = [(int(rng.randint(0, 101)), int(rng.randint(0, 101))) for _ in range(64 if FULL else 48)]
    renderer = renderers.get_renderer(RENDERER, tokenizer=get_tokenizer(BASE))
    trained_path = final_sampler_path(log_path)

    async def compare():
        service = tinker.ServiceClient(base_url=server.url)
        base = await service.create_sampling_client_async(base_model=BASE)
        trained = await service.create_sampling_client_async(model_path=trained_path)
        return await held_out_reward(base, renderer, problems), await held_out_reward(trained, renderer, problems)

    before, after = asyncio.run(compare())
    fmt = [r["env/all/format"] for r in rows if "env/all/format" in r]
    correct = [r["env/all/correct"] for r in rows if "env/all/correct" in r]
    print(f"     math_rl: {steps} steps in {took:.0f} s; train reward {curve[0]:.3f} -> {curve[-1]:.3f}, "
          f"format {fmt[0]:.3f} -> {fmt[-1]:.3f}, correct {correct[0]:.3f} -> {correct[-1]:.3f}; held-out sampled "
          f"(reward, format, correct) {tuple(round(v, 3) for v in before)} -> {tuple(round(v, 3) for v in after)} "
          f"on {len(problems)} problems x 4")
    # The recipe's reward rises on problems it never trained on. On the bundled 135M model what 12
    # steps reliably teach is the format (an answer that ends within five tokens); the sums come
    # later (the --full run's 30 steps of 16), and some short runs lose the base model's few.
    assert after[0] > before[0] and after[1] > before[1], (before, after)
    assert sum(curve[-3:]) > sum(curve[:3]), curve


def chat_sl(server):
    import importlib.resources

    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    conversations = str(importlib.resources.files("tinker_cookbook") / "example_data" / "conversations.jsonl")
    log_path = os.path.join(DATA, "chat_sl")
    batch = 8
    steps = 14 if FULL else 6
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=BASE, renderer_name=RENDERER, max_length=512,
                                            batch_size=batch)
    config = train.Config(
        log_path=log_path, model_name=BASE, recipe_name="recipe_chat_sl", renderer_name=RENDERER,
        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=conversations, test_size=16),
        learning_rate=2e-4, lr_schedule="linear", num_epochs=1, base_url=server.url, lora_rank=8,
        save_every=0, eval_every=steps - 1, max_steps=steps)
    start = time.monotonic()
    asyncio.run(train.main(config))
    took = time.monotonic() - start
    rows = metrics(log_path)
    nll = [(r["step"], r["test/nll"]) for r in rows if "test/nll" in r]
    train_nll = [r["train_mean_nll"] for r in rows if "train_mean_nll" in r]
    print(f"     chat_sl: {steps} steps of {batch} in {took:.0f} s; test NLL {nll}; train NLL "
          f"{train_nll[0]:.3f} -> {train_nll[-1]:.3f}")
    assert len(nll) >= 2 and nll[0][0] == 0, nll
    assert nll[-1][1] < nll[0][1] - 0.02, nll


CHECKS = [math_rl, chat_sl]


def main():
    binary, model = sys.argv[1], sys.argv[2]
    # The server's data directory is DATA, whose hf-hub the environment above points at.
    return run_checks("cookbook", CHECKS, binary, model, KEY, lambda server: server, data=DATA)


if __name__ == "__main__":
    finish(main())
