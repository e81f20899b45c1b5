"""OpenPipe ART 0.5.23's `TinkerNativeBackend`, unchanged, trains against tandem through the tinker
SDK it pins (0.34), offline, on the bundled model.

Usage: python test_art_tinker.py <path to tandem binary> <model gguf>

Run with a virtualenv that has `openpipe-art[tinker]==0.5.23` (`make test-cookbook` makes
target/arttinkerenv). ART finds tandem through `TINKER_BASE_URL` and `TINKER_API_KEY` (a `tml-`
key) and loads the base model's tokenizer by name from the hub cache the server writes
(`HF_HUB_CACHE=<data dir>/hf-hub`, `HF_HUB_OFFLINE=1`). Checks:

  register   `model.register(backend)` creates a LoRA model on tandem, saves step 0's sampler
             weights and starts ART's own OpenAI-compatible server, which samples through
             tandem's sampling sessions
  train      rollouts through `model.openai_client()` (ART's server, sampling on tandem), then
             `backend.train` (cispo, and importance_sampling with a checkpoint of the training
             state): two steps, each with a loss and a gradient norm from tandem
  serves     the new step answers through ART's server (`model@2`), and tandem serves the same
             sampler weights itself as a checkpoint of the model's record on /v1/chat/completions
  resume     a second backend on the same ART directory (a restarted program) lists the run's
             checkpoints on tandem and resumes from the saved training state (`load_state` into a
             new model, with its optimizer) at step 2

Prints 'art-tinker: N passed, M failed' and exits non-zero on any failure.
"""

import asyncio
import os
import sys
import time

KEY = "art-tinker-test-key"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
from tandem_server import finish, run_checks, scratch  # noqa: E402  (standard library only)

DATA = scratch("tandem-art-tinker-")
os.environ["HF_HUB_CACHE"] = os.path.join(DATA, "hf-hub")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TINKER_API_KEY"] = f"tml-{KEY}"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import art  # noqa: E402
from art.tinker_native import TinkerNativeBackend  # noqa: E402


QUESTIONS = ["Is the sky blue?", "Is water wet?", "Is fire cold?"]
CONFIG = {"tinker_native_args": {"renderer_name": "qwen3_instruct", "training_client_args": {"rank": 8}}}


def check(ok, msg):
    if not ok:
        raise AssertionError(msg)


def new_model():
    return art.TrainableModel(name="native", run_name="native", project="tinker-native", base_model=BASE,
                              _internal_config=CONFIG)


class Ctx:
    def __init__(self, server):
        self.server = server
        os.environ["TINKER_BASE_URL"] = server.url
        self.path = os.path.join(DATA, "art")
        self.backend = TinkerNativeBackend(path=self.path)
        self.model = new_model()


def run(coro):
    return asyncio.get_event_loop().run_until_complete(coro)


async def rollout(model, name, question):
    messages = [{"role": "user", "content": question}]
    completion = await model.openai_client().chat.completions.create(
        model=name, messages=messages, temperature=1.0, max_tokens=6, logprobs=True)
    choice = completion.choices[0]
    answer = (choice.message.content or "").strip().lower()
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=1.0 if answer.startswith("yes") else 0.0)


async def groups(model):
    name = model.get_inference_name()
    out = []
    for q in QUESTIONS:
        ts = await asyncio.gather(*(rollout(model, name, q) for _ in range(4)))
        if len({t.reward for t in ts}) == 1:  # mixed rewards, so the group trains
            ts[0].reward = 1.0 - ts[0].reward
        out.append(art.TrajectoryGroup(ts))
    return out


def register(ctx):
    run(ctx.model.register(ctx.backend))
    check(run(ctx.model.get_step()) == 0, "a new model starts at step 0")
    status, body, _ = ctx.server.api("GET", "/v1/preview/models?project=tinker")
    check(status == 200 and len(body["data"]) == 1, f"one tandem model record for the Tinker run: {status} {body}")


def train(ctx):
    for step, (loss, save) in enumerate((("cispo", False), ("importance_sampling", True)), start=1):
        started = time.monotonic()
        batch = run(groups(ctx.model))
        result = run(ctx.backend.train(ctx.model, batch, learning_rate=1e-4, loss_fn=loss, save_checkpoint=save))
        m = result.metrics
        print(f"     step {step} ({loss}) in {time.monotonic() - started:.1f}s: "
              + ", ".join(f"{k} {v:.4g}" for k, v in sorted(m.items()) if k in ("loss:sum", "grad_norm:mean")
                          or k.startswith(("loss/", "data/step_num_trajectories"))))
        # tandem's forward_backward and optim_step metrics, as ART passes them through.
        check("loss:sum" in m and m.get("grad_norm:mean", 0) > 0, f"no loss or gradient norm from tandem: {sorted(m)}")
        check(result.step == step, f"step {result.step}, expected {step}")
        check(run(ctx.model.get_step()) == step, "the model's step follows")


def serves(ctx):
    name = ctx.model.get_inference_name(2)
    reply = run(ctx.model.openai_client().chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Is the sky blue?"}], max_tokens=6))
    check(reply.choices[0].message.content is not None, f"ART's server on {name}: {reply}")
    status, body, _ = ctx.server.api("GET", "/v1/preview/models?project=tinker")
    record = body["data"][0]
    addr = f"{record['entity']}/tinker/{record['name']}"
    status, body, _ = ctx.server.api("POST", "/v1/chat/completions", {
        "model": addr, "messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 6})
    check(status == 200 and body["choices"][0]["message"]["content"] is not None, f"{addr}: {status} {body}")
    print(f"     {name} through ART's server: {reply.choices[0].message.content!r}; {addr} on tandem: "
          f"{body['choices'][0]['message']['content']!r}")


def resume(ctx):
    run(ctx.backend.close())
    backend = TinkerNativeBackend(path=ctx.path)
    model = new_model()
    run(model.register(backend))
    check(run(model.get_step()) == 2, f"resumed at step {run(model.get_step())}, expected 2")
    result = run(backend.train(model, run(groups(model)), learning_rate=1e-4))
    check(result.step == 3, f"a resumed run's next step is 3, not {result.step}")
    run(backend.close())


CHECKS = [register, train, serves, resume]


def main():
    binary, model = sys.argv[1], sys.argv[2]
    asyncio.set_event_loop(asyncio.new_event_loop())
    return run_checks("art-tinker", CHECKS, binary, model, KEY, Ctx, data=DATA)


if __name__ == "__main__":
    finish(main())
