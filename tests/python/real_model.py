"""What the real-model suites (test_gemma.py, test_qwen.py) share: the assertion, a greedy chat
answer checked against its own stream, the tolerant check of sampled structured output, and the
runner that prints PASS/FAIL lines and 'SUITE: N passed, M failed'. Standard library and the
`openai` client only."""
import json
import time
import traceback

import openai


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def ask(question):
    return [{"role": "user", "content": question}]


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.key, max_retries=0)


def greedy_chat(server, model, question, max_tokens=24):
    """A greedy answer through the openai client, printed; returns (text, the reply)."""
    reply = client(server).chat.completions.create(model=model, messages=ask(question), temperature=0,
                                                   max_tokens=max_tokens)
    text = reply.choices[0].message.content
    print(f"     greedy: {text!r} ({reply.choices[0].finish_reason})")
    check(text and reply.usage.completion_tokens > 0, f"empty answer: {reply}")
    return text, reply


def stream_matches(server, model, question, max_tokens=24):
    """The streamed deltas of a greedy request join to the text of the same request whole."""
    whole, _ = greedy_chat(server, model, question, max_tokens)
    chunks = client(server).chat.completions.create(model=model, messages=ask(question), temperature=0,
                                                    max_tokens=max_tokens, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check(text == whole, f"streamed {text!r} != whole {whole!r}")


def finished_json(reply, valid, at_least=2):
    """Sampled JSON-schema choices: a choice cut by max_tokens is a valid prefix, not a whole value.
    The schema's JSON allows any whitespace between tokens, and at temperature near 1 small models
    sometimes keep choosing it (a sampled path that moves with the kernels' rounding), so a cut
    choice is shown, not failed, as long as `at_least` finish; each finished one must parse and
    satisfy `valid`."""
    finished = [c for c in reply.choices if c.finish_reason == "stop"]
    for choice in reply.choices:
        if choice.finish_reason != "stop":
            print(f"     (cut by max_tokens: {choice.message.content[:60]!r}...)")
    check(len(finished) >= at_least, f"{len(finished)} of {len(reply.choices)} choices finished")
    for choice in finished:
        value = json.loads(choice.message.content)
        check(valid(value), f"{value}")
    print(f"     e.g. {finished[0].message.content}")


def run(server, checks, counts):
    """Runs each (name, fn(server)) and counts it in `counts` ({"passed", "failed"})."""
    for name, fn in checks:
        started = time.monotonic()
        try:
            fn(server)
            counts["passed"] += 1
            print(f"PASS {name} ({time.monotonic() - started:.1f}s)")
        except Exception:
            counts["failed"] += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
            print(server.log_tail())
