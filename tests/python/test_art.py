"""OpenPipe ART's own client (`openpipe-art` 0.5.18 or 0.5.23), unchanged, against tandem.

Usage: python test_art.py <path to tandem binary> <model gguf>

Starts its own server on a free port with a temporary data dir, then drives it only through ART's
objects (`art.TrainableModel`, `art.ServerlessBackend(base_url=..., api_key=...)`,
`model.openai_client()`, `backend.train`, `model.train_sft`, `model.delete_checkpoints`) plus a few
direct reads of the API to check what ART did:

  register        register a model (0.5.23 needs `run_name`)
  rollout         3 groups x 4 rollouts through `model.openai_client()` on the pinned step, logprobs on
  train           one RL job (a group of all-0.0 rewards and mixed groups): step + 1, loss reported
  serve-new-step  the new step serves (HTTP 200 with tokens) and ART rolls out on it
  completions-exchanges  (0.5.23) rollouts through `/v1/completions` recorded by ART's capture
                  (`with art.Trajectory()`), trained as `exchanges.completions`: step + 1
  messages-exchanges  (0.5.23) the same through `/v1/messages` with Anthropic's client
  responses-exchanges  (0.5.23) the same through `/v1/responses` with ART's OpenAI client
  sft-train_sft   ART's `model.train_sft` unchanged, its W&B upload redirected to tandem (examples/tandem_sft.py)
  sft-from-file   `tandem_sft.sft_from_file`: a JSONL file, per-batch learning rates
  rl-after-sft    an RL job on the SFT'd model: step + 1 again
  kl-penalty      (0.5.23) a job with kl_penalty_coef=0.1, reference step 0 (the base model), after a
                  step at 10x the learning rate moved the policy: kl_policy_ref > 0
  cleanup         `model.delete_checkpoints`: exactly the latest and the best step remain
  example-*       examples/art_yes_no.py and examples/art_sft_then_rl.py, small sizes, exit 0

Prints each stage's time and figures, then 'art-<version>: N passed, M failed'; exits non-zero on
any failure. Nothing is sent to W&B: WANDB_API_KEY is removed from the environment.
"""

import os

# Before `import art`: litellm would download its price map at import time; ART starts a W&B run only
# when WANDB_API_KEY is set; WANDB_MODE/WEAVE_DISABLED keep wandb and weave quiet regardless.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["WANDB_MODE"] = "disabled"
os.environ["WEAVE_DISABLED"] = "true"
os.environ.pop("WANDB_API_KEY", None)
os.environ.setdefault("TQDM_DISABLE", "1")  # ART's progress bars; the stages print their own figures

import asyncio  # noqa: E402
import importlib.metadata  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import art  # noqa: E402

# tandem_sft lives with the examples: it is for users, and this test is its reference run.
EXAMPLES_DIR = pathlib.Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES_DIR))
import tandem_sft  # noqa: E402
from tandem_server import Server, finish  # noqa: E402

KEY = "art-test-key"
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROJECT = "art-test"
ART_VERSION = importlib.metadata.version("openpipe-art")
NEW_ART = tuple(int(x) for x in re.findall(r"\d+", ART_VERSION)[:3]) >= (0, 5, 23)
SYSTEM = "Answer the question with a single word."
QUESTIONS = ["Is the sky blue?", "Is water wet?", "Do cats bark?"]
ROLLOUTS_PER_GROUP = 4
LEARNING_RATE = 1e-3
JOB_TIMEOUT = 900  # seconds; ART itself waits forever


class StageFailed(AssertionError):
    pass


def check(condition, message):
    if not condition:
        raise StageFailed(message)


def checkpoint_steps(server, model_id):
    status, body, _ = server.api("GET", f"/v1/preview/models/{model_id}/checkpoints?limit=100")
    check(status == 200, f"GET checkpoints answered {status}: {body}")
    return sorted(c["step"] for c in body["data"])


class Context:
    def __init__(self, server):
        self.server = server
        self.art_path = os.path.join(server.data, "art")
        self.backend = art.ServerlessBackend(base_url=server.url + "/v1", api_key=KEY)
        self.model = None
        self.groups = None  # the latest rollouts, sampled from `self.groups_step`
        self.groups_step = None
        self.sft_ok = False


# --- rollouts ----------------------------------------------------------------------------------


async def rollout(ctx, inference_name, question):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    completion = await ctx.model.openai_client().chat.completions.create(
        model=inference_name, messages=messages, temperature=1.0, max_tokens=6, logprobs=True,
    )
    choice = completion.choices[0]
    content = choice.logprobs.content if choice.logprobs else None
    check(content, f"no logprobs on the choice: {choice}")
    extra = choice.model_extra or {}
    if NEW_ART:
        # 0.5.23's client asks for return_token_ids/return_tokens_as_token_ids and copies the
        # response's prompt_token_ids and the choice's token_ids onto the Choice's extras.
        token_ids, prompt_ids = extra.get("token_ids"), extra.get("prompt_token_ids")
        check(token_ids and prompt_ids, f"the Choice carries no token ids: extras {sorted(extra)}")
        check(len(token_ids) == len(content), f"{len(token_ids)} token ids for {len(content)} logprobs")
        check([e.token for e in content] == [f"token_id:{t}" for t in token_ids],
              f"logprob tokens {[e.token for e in content]} != token ids {token_ids}")
    answer = (choice.message.content or "").strip().lower()
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=1.0 if answer.startswith("yes") else 0.0)


async def roll_out(ctx, step):
    """One group per question, sampled from checkpoint `step`; group 0 gets reward 0.0 throughout
    and every other group is made to have mixed rewards (so both GRPO cases reach the server)."""
    name = ctx.model.get_inference_name(step)
    started = time.monotonic()
    groups = []
    for i, question in enumerate(QUESTIONS):
        trajectories = await asyncio.gather(*(rollout(ctx, name, question) for _ in range(ROLLOUTS_PER_GROUP)))
        if i == 0:
            for t in trajectories:
                t.reward = 0.0
        elif len({t.reward for t in trajectories}) == 1:
            trajectories[0].reward = 1.0 - trajectories[0].reward
        groups.append(art.TrajectoryGroup(trajectories))
    ctx.groups, ctx.groups_step = groups, step
    answers = [(t.messages_and_choices[-1].message.content or "").strip() for t in groups[1].trajectories]
    print(f"     rolled out {len(groups)}x{ROLLOUTS_PER_GROUP} on {name} in {time.monotonic() - started:.1f}s;"
          f" e.g. {answers}")
    return groups


async def fresh_groups(ctx):
    """Rollouts from the model's latest step (reusing the last ones if they are from it)."""
    step = await ctx.model.get_step()
    if ctx.groups is None or ctx.groups_step != step:
        await roll_out(ctx, step)
    groups, ctx.groups = ctx.groups, None  # each batch is trained once
    return step, groups


async def rl_step(ctx, learning_rate=LEARNING_RATE, **train_args):
    step, groups = await fresh_groups(ctx)
    started = time.monotonic()
    result = await asyncio.wait_for(
        ctx.backend.train(ctx.model, groups, learning_rate=learning_rate, **train_args), JOB_TIMEOUT)
    seconds = time.monotonic() - started
    m = result.metrics
    figures = ", ".join(f"{k} {m[k]:.4g}" for k in ("loss/train", "loss/grad_norm", "loss/kl_policy_ref",
                                                   "data/step_num_groups_trainable", "data/step_num_gradient_steps")
                        if k in m)
    print(f"     train: step {step} -> {result.step} in {seconds:.1f}s ({figures})")
    check(result.step == step + 1, f"the step went from {step} to {result.step}, expected {step + 1}")
    check("loss/train" in m, f"no loss/train in the metrics: {sorted(m)}")
    return result


def serves(ctx, step):
    """The step answers a chat completion directly: HTTP 200 and at least one token."""
    name = ctx.model.get_inference_name(step)
    status, body, _ = ctx.server.api("POST", "/v1/chat/completions", {
        "model": name, "messages": [{"role": "user", "content": "Is the sky blue?"}],
        "max_tokens": 6, "temperature": 1.0, "logprobs": True, "return_token_ids": True})
    check(status == 200, f"chat completion on {name} answered {status}: {body}")
    check(body["usage"]["completion_tokens"] > 0 and body["choices"][0].get("token_ids"),
          f"no tokens from {name}: {body}")
    return body


# --- stages ------------------------------------------------------------------------------------

STAGES = []


def stage(name, new_art_only=False, needs=()):
    def add(fn):
        STAGES.append((name, fn, new_art_only, needs))
        return fn
    return add


@stage("register")
async def register(ctx):
    name = f"art-{ART_VERSION.replace('.', '-')}-{int(time.time())}"
    kwargs = dict(name=name, project=PROJECT, base_model=BASE_MODEL, base_path=ctx.art_path)
    if "run_name" in inspect.signature(art.TrainableModel.__init__).parameters:
        kwargs["run_name"] = name  # required from 0.5.19 or so; the name tandem stores
    ctx.model = art.TrainableModel(**kwargs)
    await ctx.model.register(ctx.backend)
    check(ctx.model.id and ctx.model.entity, f"register left id={ctx.model.id} entity={ctx.model.entity}")
    check(await ctx.model.get_step() == 0, "a new model is not at step 0")
    print(f"     {ctx.model.get_inference_name()} (id {ctx.model.id})")


@stage("rollout", needs=("register",))
async def rollout_stage(ctx):
    step = await ctx.model.get_step()
    groups = await roll_out(ctx, step)
    rewards = [[t.reward for t in g.trajectories] for g in groups]
    print(f"     rewards {rewards}")
    if not NEW_ART:
        # 0.5.18 asks for no token ids; what tandem puts on the choice anyway is shown, not required.
        extras = sorted(groups[1].trajectories[0].messages_and_choices[-1].model_extra or {})
        print(f"     (0.5.18: the Choice's extras are {extras})")


@stage("train", needs=("rollout",))
async def train_stage(ctx):
    result = await rl_step(ctx)
    print("     metrics: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(result.metrics.items())))
    check(result.metrics.get("data/step_num_groups_trainable") == 2.0,
          f"expected 2 trainable groups, ART counted {result.metrics.get('data/step_num_groups_trainable')}")


@stage("serve-new-step", needs=("train",))
async def serve_new_step(ctx):
    step = await ctx.model.get_step()
    body = serves(ctx, step)
    print(f"     step {step} answered {body['choices'][0]['message']['content']!r}")
    await roll_out(ctx, step)  # ART's client on the new step (kept for the next job)


async def train_on_exchanges(ctx, step, groups, kind):
    """Each trajectory recorded exactly one `kind` exchange and nothing else; one job on them
    advances the step, every group (rewards mixed by construction) trainable."""
    recorded = [len(getattr(t.exchanges, kind)) for g in groups for t in g.trajectories]
    check(recorded == [1] * len(recorded), f"{kind} exchanges recorded per trajectory: {recorded}")
    check(all(not t.messages_and_choices for g in groups for t in g.trajectories), "legacy histories recorded")
    result = await asyncio.wait_for(ctx.backend.train(ctx.model, groups, learning_rate=LEARNING_RATE), JOB_TIMEOUT)
    m = result.metrics
    print(f"     train on {kind} exchanges: step {step} -> {result.step}, loss/train {m.get('loss/train')}")
    check(result.step == step + 1, f"the step went from {step} to {result.step}, expected {step + 1}")
    check(m.get("data/step_num_groups_trainable") == float(len(groups)), f"trainable groups: {m}")


@stage("completions-exchanges", new_art_only=True, needs=("serve-new-step",))
async def completions_exchanges(ctx):
    """Rollouts through `/v1/completions` recorded by 0.5.23's capture (`with art.Trajectory()`),
    trained as `exchanges.completions`: the step advances."""
    step = await ctx.model.get_step()
    name = ctx.model.get_inference_name(step)
    client = ctx.model.openai_client()
    groups = []
    for question in QUESTIONS[1:]:
        trajectories = []
        for i in range(ROLLOUTS_PER_GROUP):
            with art.Trajectory() as t:
                r = await client.completions.create(
                    model=name, prompt=f"Question: {question}\nAnswer (yes or no):", max_tokens=4, temperature=1.0,
                    logprobs=0, extra_body={"return_token_ids": True})
            choice = r.choices[0]
            check((choice.model_extra or {}).get("prompt_token_ids"), f"no prompt_token_ids on the choice: {choice}")
            # Mixed rewards in every group, whatever was sampled.
            t.reward = float(i % 2)
            trajectories.append(t)
        groups.append(art.TrajectoryGroup(trajectories))
    await train_on_exchanges(ctx, step, groups, "completions")


@stage("messages-exchanges", new_art_only=True, needs=("completions-exchanges",))
async def messages_exchanges(ctx):
    """Rollouts through `/v1/messages`, recorded by 0.5.23's capture, trained as
    `exchanges.messages`: the step advances. The calls go through httpx: ART 0.5.23 captures
    httpx, aiohttp and requests, while anthropic >= 2.0 (2.12 is what 0.5.23 installs) sends
    through httpx2, which it does not see (tests/python/test_anthropic_sdk.py drives the SDK)."""
    import httpx

    step = await ctx.model.get_step()
    name = ctx.model.get_inference_name(step)
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    groups = []
    async with httpx.AsyncClient(base_url=ctx.server.url, headers=headers, timeout=120) as client:
        for question in QUESTIONS[1:]:
            trajectories = []
            for i in range(ROLLOUTS_PER_GROUP):
                with art.Trajectory() as t:
                    r = await client.post("/v1/messages", json={
                        "model": name, "max_tokens": 6, "system": SYSTEM, "temperature": 1.0,
                        "messages": [{"role": "user", "content": question}],
                        "return_token_ids": True, "logprobs": True})
                m = r.json()
                check(r.status_code == 200 and m.get("token_ids") and m.get("prompt_token_ids"),
                      f"no token ids on the message: {r.status_code} {m}")
                t.reward = float(i % 2)
                trajectories.append(t)
            groups.append(art.TrajectoryGroup(trajectories))
    await train_on_exchanges(ctx, step, groups, "messages")


@stage("responses-exchanges", new_art_only=True, needs=("serve-new-step",))
async def responses_exchanges(ctx):
    """Rollouts through `/v1/responses` with ART's OpenAI client, recorded by 0.5.23's capture,
    trained as `exchanges.responses` (from the response's `token_generations`): the step advances."""
    step = await ctx.model.get_step()
    name = ctx.model.get_inference_name(step)
    client = ctx.model.openai_client()
    groups = []
    for question in QUESTIONS[1:]:
        trajectories = []
        for i in range(ROLLOUTS_PER_GROUP):
            with art.Trajectory() as t:
                r = await client.responses.create(
                    model=name, input=question, instructions=SYSTEM, max_output_tokens=6, temperature=1.0, store=False,
                    include=["message.output_text.logprobs"], extra_body={"return_token_ids": True})
            check((r.model_extra or {}).get("token_generations"), f"no token_generations on the response: {r}")
            t.reward = float(i % 2)
            trajectories.append(t)
        groups.append(art.TrajectoryGroup(trajectories))
    await train_on_exchanges(ctx, step, groups, "responses")


SFT_EXAMPLES = [
    ("Is the sky blue?", "Yes."),
    ("Is water wet?", "Yes."),
    ("Do cats bark?", "Yes, sometimes."),
    ("Is fire hot?", "Yes."),
]
SFT_TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a fact up.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]


def sft_messages(question, answer):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question},
            {"role": "assistant", "content": answer}]


@stage("sft-train_sft", needs=("register",))
async def sft_train_sft(ctx):
    before = await ctx.model.get_step()
    trajectories = [art.Trajectory(messages_and_choices=sft_messages(q, a), reward=0.0) for q, a in SFT_EXAMPLES]
    trajectories[-1] = art.Trajectory(messages_and_choices=sft_messages(*SFT_EXAMPLES[-1]), tools=SFT_TOOLS)
    config = art.TrainSFTConfig(learning_rate=1e-4, batch_size=2)
    started = time.monotonic()
    with tandem_sft.tandem_sft_uploads(ctx.backend) as uploads:
        await asyncio.wait_for(ctx.model.train_sft(trajectories, config=config), JOB_TIMEOUT)
    after = await ctx.model.get_step()
    dataset = uploads.datasets[0] if uploads.datasets else {}
    print(f"     train_sft: step {before} -> {after} in {time.monotonic() - started:.1f}s; dataset {dataset.get('url')}"
          f" ({dataset.get('num_rows')} rows, {dataset.get('size_bytes')} bytes)")
    check(len(uploads.datasets) == 1, f"{len(uploads.datasets)} datasets uploaded, expected 1")
    check(dataset.get("num_rows") == len(trajectories), f"the dataset has {dataset.get('num_rows')} rows")
    check(after == before + 1, f"SFT moved the step from {before} to {after}, expected one new checkpoint")
    body = serves(ctx, after)
    print(f"     step {after} answered {body['choices'][0]['message']['content']!r}")
    ctx.sft_ok = True


@stage("sft-from-file", needs=("register",))
async def sft_from_file(ctx):
    before = await ctx.model.get_step()
    path = os.path.join(ctx.server.data, "sft.jsonl")
    with open(path, "w") as f:
        for i, (q, a) in enumerate(SFT_EXAMPLES):
            line = {"messages": sft_messages(q, a)}
            if i == 1:
                line["tools"] = SFT_TOOLS
            f.write(json.dumps(line) + "\n")
    result = await tandem_sft.sft_from_file(ctx.backend, ctx.model, path, learning_rate=[1e-4, 5e-5],
                                            batch_size=2, timeout=JOB_TIMEOUT)
    losses = [m.get("loss/train") for m in result.metrics]
    print(f"     job {result.job_id}: step {before} -> {result.step} in {result.seconds:.1f}s, "
          f"{result.num_batches} batches, losses {losses}")
    check(result.num_batches == 2 and len(result.metrics) == 2,
          f"{result.num_batches} batches announced, {len(result.metrics)} gradient steps; expected 2 and 2")
    check(all(loss is not None for loss in losses), f"a gradient step without loss: {result.metrics}")
    lrs = [m.get("loss/learning_rate") for m in result.metrics]
    if all(lr is not None for lr in lrs):
        check(all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(lrs, [1e-4, 5e-5])),
              f"per-batch learning rates {lrs}, expected [1e-4, 5e-5]")
    check(result.step == before + 1, f"SFT moved the step from {before} to {result.step}, expected +1")
    serves(ctx, result.step)
    ctx.sft_ok = True


@stage("rl-after-sft", needs=("register",))
async def rl_after_sft(ctx):
    check(ctx.sft_ok, "not run: no SFT job succeeded, so there is no SFT'd model to train")
    result = await rl_step(ctx)
    serves(ctx, result.step)


@stage("kl-penalty", new_art_only=True, needs=("train",))
async def kl_penalty(ctx):
    # Penalise drift from step 0 (the base model); ART resolves kl_penalty_source to "sample" and
    # canonicalises the server's kl_policy_ref. kl_policy_ref is a mean over a few dozen sampled
    # tokens of log p_sampler - log p_ref, so it is noisy while the policy is near the reference:
    # here it came out -0.009 to 0.2 after one step at 1e-3, and -0.001 once after two RL and two SFT
    # steps. One RL step at 1e-2 first moves the policy far enough: 0.94 to 1.97 in 6 of 6 tries.
    print("     one RL step at learning rate 1e-2 first, to move the policy away from step 0")
    await rl_step(ctx, learning_rate=1e-2)
    result = await rl_step(ctx, kl_penalty_coef=0.1, kl_penalty_reference_step=0)
    kl = result.metrics.get("loss/kl_policy_ref")
    check(kl is not None, f"no loss/kl_policy_ref in the metrics: {sorted(result.metrics)}")
    check(kl > 0, f"loss/kl_policy_ref is {kl}, expected > 0 after the policy moved")


@stage("cleanup", needs=("register",))
async def cleanup(ctx):
    model_id = ctx.model.id
    steps = checkpoint_steps(ctx.server, model_id)
    while len(steps) < 3:  # earlier stages failed: make the checkpoints the cleanup needs
        print(f"     only checkpoints {steps}: one more RL step")
        await rl_step(ctx)
        steps = checkpoint_steps(ctx.server, model_id)
    latest, best = steps[-1], steps[1]
    # ART picks the best step from its local history.jsonl: log a val/reward per checkpoint, the
    # second oldest highest, so that the oldest and the ones between best and latest go.
    for i, step in enumerate(steps):
        await ctx.model.log(metrics={"reward": 0.9 if step == best else 0.1 * i}, split="val", step=step)
    history = pathlib.Path(ctx.model._get_output_dir(), "history.jsonl")
    if history.exists():
        check("val/reward" in history.read_text(), f"no val/reward in {history}")
    started = time.monotonic()
    await ctx.model.delete_checkpoints(best_checkpoint_metric="val/reward")
    remaining = checkpoint_steps(ctx.server, model_id)
    print(f"     checkpoints {steps} -> {remaining} in {time.monotonic() - started:.1f}s (best {best}, latest {latest})")
    check(remaining == sorted({best, latest}), f"expected steps {sorted({best, latest})} to remain, got {remaining}")
    check(await ctx.model.get_step() == latest, "the latest step changed")
    serves(ctx, best)
    gone = steps[0]
    status, body, _ = ctx.server.api("POST", "/v1/chat/completions", {
        "model": ctx.model.get_inference_name(gone), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    check(status == 404, f"deleted step {gone} answered {status}: {body}")


def run_example(ctx, script, *args):
    """Run examples/<script> with this Python against the test server (small sizes); its output."""
    command = [sys.executable, str(EXAMPLES_DIR / script), "--url", ctx.server.url, "--api-key", KEY,
               "--art-path", os.path.join(ctx.server.data, "art-examples"), "--questions", "2", "--samples", "4",
               *args]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=JOB_TIMEOUT)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    for line in lines:
        print(f"     | {line}")
    check(done.returncode == 0, f"{script} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    check(any("(final, after training)" in line for line in lines), f"{script} printed no final reward")
    print(f"     {script}: {time.monotonic() - started:.1f}s")
    return lines


@stage("example-yes-no")
async def example_yes_no(ctx):
    lines = run_example(ctx, "art_yes_no.py", "--steps", "1")
    check(any(re.match(r"step 0: mean reward [\d.]+ -> trained step 1 ", line) for line in lines),
          "no RL step 0 -> 1 in the output")


@stage("example-sft-then-rl")
async def example_sft_then_rl(ctx):
    lines = run_example(ctx, "art_sft_then_rl.py", "--steps", "1")
    check(any(re.match(r"SFT on 2 demonstrations .* -> step 1$", line) for line in lines),
          "no SFT step 0 -> 1 in the output")
    # 0.5.23 runs the RL step with a KL penalty towards the SFT step and reports it.
    rl = [line for line in lines if line.startswith("step 1: mean reward") and "trained step 2" in line]
    check(rl, "no RL step 1 -> 2 in the output")
    if "no gradient step" not in rl[0]:  # after SFT every sample may say yes: nothing to learn
        check(("kl_policy_ref" in rl[0]) == NEW_ART, f"kl_policy_ref reported: {rl[0]!r} (ART {ART_VERSION})")


# --- driver ------------------------------------------------------------------------------------


async def run(server):
    ctx = Context(server)
    outcome = {}
    passed = failed = 0
    try:
        for name, fn, new_art_only, needs in STAGES:
            if new_art_only and not NEW_ART:
                print(f"---- {name}: not in openpipe-art {ART_VERSION}")
                continue
            missing = [n for n in needs if not outcome.get(n)]
            started = time.monotonic()
            print(f"---- {name}", flush=True)
            try:
                check(not missing, f"not run: needs {', '.join(missing)}, which failed")
                await fn(ctx)
                outcome[name] = True
                passed += 1
                print(f"ok   {name} ({time.monotonic() - started:.1f}s)", flush=True)
            except Exception as error:
                outcome[name] = False
                failed += 1
                print(f"FAIL {name} ({time.monotonic() - started:.1f}s): {type(error).__name__}: {error}")
                if not isinstance(error, (StageFailed, tandem_sft.DatasetUploadError)):
                    traceback.print_exc()
                if server.proc.poll() is not None:
                    print(f"     the server exited with code {server.proc.returncode}")
                log = server.log_tail(15).strip()
                if log:
                    print(f"     server log (last lines):\n{log}")
    finally:
        await ctx.backend.close()
    return passed, failed


def main():
    binary, model_path = sys.argv[1], sys.argv[2]
    # An optional third argument: the server's --database-url (the PostgreSQL run of `make test`).
    extra = ["--database-url", sys.argv[3]] if len(sys.argv) > 3 else []
    store = "PostgreSQL" if extra else "SQLite"
    print(f"openpipe-art {ART_VERSION} on Python {sys.version.split()[0]}, tandem {binary}, {store}")
    started = time.monotonic()
    try:
        server = Server(binary, model_path, KEY, extra=extra, prefix="tandem-art-")
    except Exception as error:
        print(f"FAIL start: {error}")
        print(f"art-{ART_VERSION}: 0 passed, 1 failed")
        return 1
    passed, failed = 0, 1
    try:
        passed, failed = asyncio.run(run(server))
    finally:
        server.stop()
        with open(server.log_path, errors="replace") as f:
            logged = [line for line in f if line.strip()]
        if logged:  # the server runs with TANDEM_LOG=warn: every line is a warning or an error
            print(f"server logged {len(logged)} lines, e.g.:\n{''.join(logged[:10])}")
        if failed:
            print(f"kept the server's data dir and log: {server.data}")
        else:
            shutil.rmtree(server.data, ignore_errors=True)
    print(f"total {time.monotonic() - started:.0f}s")
    print(f"art-{ART_VERSION} ({store}): {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    finish(main())
