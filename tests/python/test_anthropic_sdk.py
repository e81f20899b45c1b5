"""The official `anthropic` Python package, unchanged, against a running tandem's `/v1/messages`.

Usage: python test_anthropic_sdk.py <path to tandem binary> <model gguf>
Starts its own server (tandem_server.py) on a free port with a temporary data dir, runs the checks,
stops it, and prints 'anthropic-sdk: N passed, M failed'.
"""
import json
import sys

import anthropic

from tandem_server import finish, run_checks, trained_step

KEY = "anthropic-test-key"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
checks = []


def check(fn):
    checks.append(fn)
    return fn


@check
def text_message(client):
    m = client.messages.create(model=MODEL, max_tokens=12, extra_body={"temperature": 0}, system="Answer briefly.",
                               messages=[{"role": "user", "content": "What is 2+2?"}])
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.content and m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 12
    counted = client.messages.count_tokens(model=MODEL, system="Answer briefly.",
                                           messages=[{"role": "user", "content": "What is 2+2?"}])
    assert counted.input_tokens == m.usage.input_tokens, (counted, m.usage)


@check
def stop_sequences_and_token_ids(client):
    m = client.messages.create(model=MODEL, max_tokens=40, stop_sequences=[","],
                               messages=[{"role": "user", "content": "Count: 1, 2, 3, 4"}],
                               extra_body={"temperature": 0, "return_token_ids": True, "logprobs": True})
    extra = m.model_extra or {}
    assert len(extra["token_ids"]) == len(extra["logprobs"]) == m.usage.output_tokens
    assert len(extra["prompt_token_ids"]) == m.usage.input_tokens
    if m.stop_reason == "stop_sequence":
        assert m.stop_sequence == ","


@check
def streaming_matches_non_streaming(client):
    args = dict(model=MODEL, max_tokens=16, extra_body={"temperature": 0}, messages=[{"role": "user", "content": "Name a fruit."}])
    full = client.messages.create(**args)
    with client.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full.content[0].text, (text, full.content[0].text)
    assert final.stop_reason == full.stop_reason and final.usage.output_tokens == full.usage.output_tokens


@check
def tools_are_called(client):
    tools = [{"name": "get_weather", "description": "The weather in a city.",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                               "additionalProperties": False}}]
    m = client.messages.create(model=MODEL, max_tokens=100, extra_body={"temperature": 0}, tools=tools,
                               tool_choice={"type": "tool", "name": "get_weather"},
                               messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and uses[0].name == "get_weather" and isinstance(uses[0].input, dict), m.content
    # The tool's result goes back as a tool_result block, and the model answers.
    follow = client.messages.create(model=MODEL, max_tokens=20, extra_body={"temperature": 0}, tools=tools, messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [u.model_dump() for u in uses]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"}]},
    ])
    assert follow.content, follow
    with client.messages.stream(model=MODEL, max_tokens=120, extra_body={"temperature": 0}, tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                messages=[{"role": "user", "content": "Weather in Rome?"}]) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] and final.stop_reason == "tool_use", final


@check
def structured_output_through_output_config(client):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    m = client.messages.create(model=MODEL, max_tokens=30, messages=[{"role": "user", "content": "Is the sky blue?"}],
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    # Compact JSON (no free whitespace), so a sampled answer closes well inside max_tokens.
    text = m.content[0].text
    assert json.loads(text)["answer"] in ("yes", "no") and not any(c.isspace() for c in text), m.content


@check
def errors_raise_the_sdk_exceptions(client):
    try:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}],
                               extra_body={"temperature": 9})
        raise AssertionError("expected BadRequestError")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and "temperature" in str(e)
        assert e.body["error"]["type"] == "invalid_request_error", e.body
    try:
        client.messages.create(model="missing", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected NotFoundError")
    except anthropic.NotFoundError:
        pass
    bad = anthropic.Anthropic(base_url=str(client.base_url), api_key="wrong", max_retries=0)
    try:
        bad.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected AuthenticationError")
    except anthropic.AuthenticationError:
        pass


@check
def trained_checkpoint(client, server):
    name, _ = trained_step(server)
    args = dict(model=name, max_tokens=8, messages=[{"role": "user", "content": "Is snow white?"}],
                extra_body={"temperature": 0})
    m = client.messages.create(**args)
    assert m.model == name and m.content[0].text, m
    with client.messages.stream(**args) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == m.content[0].text, (streamed, m.content[0].text)


def main():
    # The SDK sends the key as `x-api-key` and posts to {base_url}/v1/messages.
    return run_checks("anthropic-sdk", checks, sys.argv[1], sys.argv[2], KEY,
                      lambda server: anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=120))


if __name__ == "__main__":
    finish(main())
