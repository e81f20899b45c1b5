"""Gemma 3 270M (the second real model, `make model-gemma`) end to end through tandem.

Usage: python test_gemma.py <path to tandem binary> <gemma gguf>

Run with the ART 0.5.23 virtualenv's Python (it has `openpipe-art` and the `openai` client it
pins). Starts a server with the Gemma file under the id `google/gemma-3-270m`, then checks:

  prompt-format     the built-in Gemma turn format (the file has no template): <bos>, turns, the
                    generation prompt, and the SentencePiece pieces of a known sentence
  chat              a greedy chat completion through the openai client, usage consistent
  stream            the streamed deltas of the same request join to the same text
  end-of-turn       <end_of_turn> ends generation as vLLM does with a generation-config EOS id:
                    finish_reason stop, stop_reason 106, no text
  structured        a JSON schema (response_format) is always met
  completions       /v1/completions on raw text
  art-rl-step       ART's own client: register a model on the Gemma base, roll out 2 x 4 with
                    logprobs through model.openai_client(), train one RL step, serve step 1

Prints 'gemma: N passed, M failed' and exits non-zero on any failure.
"""

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["WANDB_MODE"] = "disabled"
os.environ["WEAVE_DISABLED"] = "true"
os.environ.pop("WANDB_API_KEY", None)
os.environ.setdefault("TQDM_DISABLE", "1")

import asyncio  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import art  # noqa: E402

from real_model import ask, check, client, finished_json, greedy_chat, run, stream_matches  # noqa: E402
from tandem_server import Server, finish  # noqa: E402

KEY = "gemma-test-key"
MODEL = "google/gemma-3-270m"
END_OF_TURN = 106


def prompt_format(server):
    status, body, _ = server.api("POST", "/tokenize", {
        "model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, *ask("What is the capital of France?")],
        "add_generation_prompt": True})
    check(status == 200, f"/tokenize answered {status}: {body}")
    tokens = body["tokens"]
    # <bos> <start_of_turn> user \n ... <end_of_turn> \n <start_of_turn> model \n
    check(tokens[:2] == [2, 105] and tokens[-3:] == [105, 4368, 107], f"not Gemma's turn format: {tokens}")
    status, text, _ = server.api("POST", "/detokenize", {"model": MODEL, "tokens": tokens})
    check(status == 200, f"/detokenize answered {status}: {text}")
    want = ("<bos><start_of_turn>user\nBe brief.\n\nWhat is the capital of France?<end_of_turn>\n"
            "<start_of_turn>model\n")
    check(text["prompt"] == want, f"rendered {text['prompt']!r}")
    # SentencePiece pieces of plain text: "▁capital" and "▁France" are single pieces of Gemma's
    # vocabulary, and no prefix space is added (add_space_prefix is false in the file).
    status, body, _ = server.api("POST", "/tokenize", {"model": MODEL, "prompt": "The capital of France",
                                                      "add_special_tokens": False})
    check(status == 200, f"/tokenize answered {status}: {body}")
    check(body["tokens"] == [818, 5279, 529, 7001], f"pieces {body['tokens']}")


def chat(server):
    _, reply = greedy_chat(server, MODEL, "What is the capital of France?")
    check(reply.choices[0].finish_reason in ("stop", "length"), f"finish_reason {reply.choices[0].finish_reason}")
    check(reply.usage.prompt_tokens == 16, f"prompt_tokens {reply.usage.prompt_tokens}, Gemma's format makes 16")


def stream(server):
    stream_matches(server, MODEL, "What is the capital of France?")


def end_of_turn(server):
    status, body, _ = server.api("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": ask("Hi"), "max_tokens": 10, "logit_bias": {str(END_OF_TURN): 100}})
    check(status == 200, f"answered {status}: {body}")
    choice = body["choices"][0]
    check(choice["finish_reason"] == "stop" and choice["stop_reason"] == END_OF_TURN,
          f"<end_of_turn> did not end the turn: {choice}")
    check(choice["message"]["content"] == "" and body["usage"]["completion_tokens"] == 1, f"{body}")


def structured(server):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                               "confidence": {"type": "integer"}},
              "required": ["answer", "confidence"], "additionalProperties": False}
    reply = client(server).chat.completions.create(
        model=MODEL, messages=ask("Is the sky blue? Answer in JSON."), temperature=1.0, max_tokens=100, n=3, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    finished_json(reply, lambda v: v["answer"] in ("yes", "no") and isinstance(v["confidence"], int))


def completions(server):
    reply = client(server).completions.create(model=MODEL, prompt="The capital of France is", temperature=0,
                                              max_tokens=8)
    print(f"     {reply.choices[0].text!r}")
    check(reply.choices[0].text and reply.usage.prompt_tokens == 6, f"{reply}")


async def art_rl_step_async(server):
    backend = art.ServerlessBackend(base_url=server.url + "/v1", api_key=KEY)
    model = art.TrainableModel(name="gemma-yes", project="gemma-test", base_model=MODEL, run_name="gemma-yes")
    await model.register(backend)
    name = model.get_inference_name(0)

    async def rollout(question):
        messages = [{"role": "user", "content": question + " Answer yes or no."}]
        completion = await model.openai_client().chat.completions.create(
            model=name, messages=messages, temperature=1.0, max_tokens=6, logprobs=True)
        choice = completion.choices[0]
        answer = (choice.message.content or "").strip().lower()
        return art.Trajectory(messages_and_choices=[*messages, choice], reward=float(answer.startswith("yes")))

    groups = []
    for question in ["Is the sky blue?", "Is water wet?"]:
        trajectories = await asyncio.gather(*(rollout(question) for _ in range(4)))
        if len({t.reward for t in trajectories}) == 1:
            trajectories[0].reward = 1.0 - trajectories[0].reward  # both GRPO cases need a spread
        groups.append(art.TrajectoryGroup(trajectories))
    started = time.monotonic()
    result = await asyncio.wait_for(backend.train(model, groups, learning_rate=1e-4), 900)
    print(f"     train: step 0 -> {result.step} in {time.monotonic() - started:.1f}s,"
          f" loss {result.metrics.get('loss/train')}")
    check(result.step == 1, f"step {result.step}")
    status, body, _ = server.api("POST", "/v1/chat/completions", {
        "model": model.get_inference_name(1), "messages": ask("Is the sky blue?"), "max_tokens": 6})
    check(status == 200 and body["usage"]["completion_tokens"] > 0, f"step 1 answered {status}: {body}")


def art_rl_step(server):
    asyncio.run(art_rl_step_async(server))


CHECKS = [prompt_format, chat, stream, end_of_turn, structured, completions, art_rl_step]


def main():
    binary, model_path = sys.argv[1], sys.argv[2]
    server = Server(binary, model_path, KEY, extra=["--served-model-name", MODEL])
    counts = {"passed": 0, "failed": 0}
    try:
        run(server, [(fn.__name__.replace("_", "-"), fn) for fn in CHECKS], counts)
    finally:
        server.stop()
    print(f"gemma: {counts['passed']} passed, {counts['failed']} failed")
    finish(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
