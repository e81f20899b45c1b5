"""The agent frameworks people build RL agents with, unchanged, against tandem (issue 51).

Usage: python test_agents.py <tandem binary> <qwen 1.5B gguf> <smollm2 gguf> [--instructor]

Run with target/agentsenv's Python (the pins are the Makefile's AGENTS_PINS); `--instructor` runs
only the instructor checks, with target/instructorenv's Python (instructor 1.17 needs an older
openai than the others). Each framework drives the real Qwen2.5-Coder 1.5B (temperature 0) on a
fact only a tool knows: the framework's own machinery must run the tool with the right argument
(the model's call parsed, in its own syntax, under `auto`) and carry its result back. Whether the
model then answers from the result: offered the tool again, the 1.5B at temperature 0 calls it
again (unconstrained too), so the answer is asked where the framework makes the tool's result the
output (openai-agents' stop_on_first_tool), asks for a structured result after the tool
(pydantic-ai), or of the model without tools after the tool's message (LangChain, LiteLLM): each
must hold the tool's result.

  openai-agents       Runner.run and Runner.run_streamed over chat completions, and over the
                      Responses API
  langchain-openai    ChatOpenAI.bind_tools through a tool round trip; with_structured_output by
                      function_calling, json_schema and json_mode
  langchain-anthropic ChatAnthropic.bind_tools through a tool round trip; with_structured_output
  litellm             hosted_vllm/: a tool round trip, and streamed
  pydantic-ai         a tool, then a structured result (tool output), and NativeOutput (tools and
                      response_format together)
  instructor          Mode.TOOLS, Mode.JSON and Mode.JSON_SCHEMA
  required-sampled    the bundled SmolLM2 with default sampling, many seeds: `required` (chat
                      completions, Responses), `{"type": "any"}` (Messages) and a named choice are
                      always a call whose arguments match the schema

Prints 'agents: N passed, M failed' and exits non-zero on any failure.
"""

import asyncio
import json
import os
import sys

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from real_model import check, run  # noqa: E402
from tandem_server import Server, finish  # noqa: E402

KEY = "agents-test-key"
QWEN = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CODE = "4817"
QUESTION = "What is the secret code of Ada Lovelace? Look it up with the tool, then tell me the code."
CALLS = []


def secret_code(name: str) -> str:
    """Looks up the secret code of a person by their name."""
    CALLS.append(name)
    return f"The secret code of {name} is {CODE}." if "ada" in name.lower() else f"{name} has no secret code."


def ran_the_tool(answer, quoted=False):
    """The tool ran for Ada; with `quoted`, the answer holds its result."""
    calls = list(CALLS)
    CALLS.clear()
    print(f"     tool calls: {calls}; answer: {str(answer)[:160]!r}")
    check(any("ada" in c.lower() for c in calls), f"the tool never ran for Ada: {calls}")
    if quoted:
        check(CODE in str(answer), f"the answer does not use the tool's result: {answer!r}")


def openai_url(server):
    return server.url + "/v1"


# --- openai-agents ---------------------------------------------------------------------------

def agents_sdk(server, responses=False, streamed=False):
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                        function_tool, set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=openai_url(server), api_key=server.key, max_retries=0)
    model = (OpenAIResponsesModel if responses else OpenAIChatCompletionsModel)(model=QWEN, openai_client=client)
    agent = Agent(name="assistant", instructions="You are a helpful assistant. Use the tools you are given.",
                  tools=[function_tool(secret_code)], model=model, tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(temperature=0, max_tokens=120))

    async def go():
        if not streamed:
            return (await Runner.run(agent, QUESTION, max_turns=4)).final_output
        result = Runner.run_streamed(agent, QUESTION, max_turns=4)
        kinds = set()
        async for event in result.stream_events():
            kinds.add(event.type)
        check("raw_response_event" in kinds, f"no raw events streamed: {kinds}")
        return result.final_output

    ran_the_tool(asyncio.run(go()), quoted=True)


# --- LangChain -------------------------------------------------------------------------------

class_defs = {}


def person_model():
    if "Person" not in class_defs:
        from pydantic import BaseModel

        class Person(BaseModel):
            """A person and their age."""
            name: str
            age: int

        class_defs["Person"] = Person
    return class_defs["Person"]


PERSON_PROMPT = "Ada Lovelace was 36 years old when she died. Extract the person."


def is_ada(p):
    print(f"     {p!r}")
    check("Ada" in p.name and p.age == 36, f"{p!r}")


def tool_round_trip(llm):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    lookup = tool(secret_code)
    bound = llm.bind_tools([lookup])
    messages = [HumanMessage(QUESTION)]
    ai = bound.invoke(messages)
    check(ai.tool_calls, f"no tool call: {ai!r}")
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(content=lookup.invoke(call["args"]), tool_call_id=call["id"]))
    # The framework's tool message goes back in the model's prompt. Offered the tool again, the
    # 1.5B calls it again (its habit, unconstrained too); the answer is asked of the model without
    # tools, as agents do for their final turn, and must use the tool's result.
    again = bound.invoke(messages)
    print(f"     offered the tool again: {(again.content or again.tool_calls)!r:.120}")
    ran_the_tool(llm.invoke(messages).content, quoted=True)


def langchain_openai(server):
    from langchain_openai import ChatOpenAI

    tool_round_trip(ChatOpenAI(model=QWEN, base_url=openai_url(server), api_key=server.key, temperature=0,
                               max_tokens=120, max_retries=0))


def langchain_structured(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=QWEN, base_url=openai_url(server), api_key=server.key, temperature=0, max_tokens=80,
                     max_retries=0)
    for method in ("function_calling", "json_schema", "json_mode"):
        prompt = PERSON_PROMPT + (" Reply in JSON with keys name and age." if method == "json_mode" else "")
        is_ada(llm.with_structured_output(person_model(), method=method).invoke(prompt))


def langchain_anthropic(server):
    from langchain_anthropic import ChatAnthropic

    llm = ChatAnthropic(model=QWEN, base_url=server.url, api_key=server.key, temperature=0, max_tokens=120,
                        max_retries=0)
    tool_round_trip(llm)
    is_ada(llm.with_structured_output(person_model()).invoke(PERSON_PROMPT))


# --- LiteLLM ---------------------------------------------------------------------------------

def litellm_tools(server):
    import litellm

    tools = [{"type": "function", "function": {
        "name": "secret_code", "description": "Looks up the secret code of a person by their name.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}]
    common = dict(model="hosted_vllm/" + QWEN, api_base=openai_url(server), api_key=server.key, temperature=0,
                  max_tokens=120, tools=tools)
    messages = [{"role": "user", "content": QUESTION}]
    reply = litellm.completion(messages=messages, **common)
    calls = reply.choices[0].message.tool_calls
    check(calls, f"no tool call: {reply.choices[0]}")
    messages.append(reply.choices[0].message.model_dump())
    for c in calls:
        messages.append({"role": "tool", "tool_call_id": c.id,
                         "content": secret_code(**json.loads(c.function.arguments))})
    # The result goes back, and the answer (asked without tools, as in tool_round_trip) streams.
    plain = {k: v for k, v in common.items() if k != "tools"}
    chunks = list(litellm.completion(messages=messages, stream=True, **plain))
    check(chunks and chunks[-1].choices[0].finish_reason in ("stop", "length"), f"{chunks[-1:]}")
    ran_the_tool("".join(c.choices[0].delta.content or "" for c in chunks), quoted=True)


# --- pydantic-ai -----------------------------------------------------------------------------

def pydantic_model(server):
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(QWEN, provider=OpenAIProvider(base_url=openai_url(server), api_key=server.key))


def pydantic_ai_tools(server):
    """A tool and a structured result, by a final_result tool (`required` on every step) and by
    NativeOutput (tools and response_format together), whose `code` must be the tool's. The run
    is capped at 3 model requests (a model that calls the tool again rather than finish ends it
    with UsageLimitExceeded, and fails)."""
    from pydantic import BaseModel
    from pydantic_ai import Agent, ModelSettings, NativeOutput
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.usage import UsageLimits

    class Answer(BaseModel):
        code: str

    settings = ModelSettings(temperature=0, max_tokens=120)
    for output in (Answer, NativeOutput(Answer)):
        agent = Agent(pydantic_model(server), output_type=output, tools=[secret_code], model_settings=settings,
                      instructions="Use the tools you are given.")
        try:
            answer = agent.run_sync(QUESTION, usage_limits=UsageLimits(request_limit=3)).output.code
        except UsageLimitExceeded as e:
            answer = f"({e})"
        # With one call per reply the structured result follows the tool's (the model copies it).
        ran_the_tool(answer, quoted=True)


# --- instructor ------------------------------------------------------------------------------

def instructor_modes(server):
    import instructor
    from openai import OpenAI

    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(OpenAI(base_url=openai_url(server), api_key=server.key, max_retries=0),
                                        mode=mode)
        person = client.chat.completions.create(model=QWEN, response_model=person_model(), temperature=0,
                                                max_tokens=80, max_retries=0,
                                                messages=[{"role": "user", "content": PERSON_PROMPT}])
        print(f"     {mode}: ", end="")
        is_ada(person)


# --- the bundled model, sampled ----------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SEEDS = range(12)


def city_args(arguments):
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    check(set(args) == {"city"} and isinstance(args["city"], str), f"arguments {args}")


def required_sampled(server):
    """Default sampling (temperature 1), a 64-token budget: every reply is a call."""
    for seed in SEEDS:
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            status, r, _ = server.api("POST", "/v1/chat/completions", {
                "model": SMOL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
                "tool_choice": choice, "max_tokens": 64, "seed": seed})
            check(status == 200, f"{status} {r}")
            calls = r["choices"][0]["message"].get("tool_calls")
            check(calls, f"seed {seed} {choice}: no call: {r['choices'][0]}")
            # Without parallel_tool_calls, one call per reply (llama.cpp's default).
            check(len(calls) == 1, f"seed {seed} {choice}: one call: {calls}")
            city_args(calls[0]["function"]["arguments"])
        status, r, _ = server.api("POST", "/v1/responses", {
            "model": SMOL, "input": "Weather in Paris?", "max_output_tokens": 64, "seed": seed,
            "tools": [{"type": "function", **WEATHER["function"]}], "tool_choice": "required"})
        check(status == 200, f"{status} {r}")
        calls = [o for o in r["output"] if o["type"] == "function_call"]
        check(len(calls) == 1, f"seed {seed} responses: {r['output']}")
        city_args(calls[0]["arguments"])
        # `seed` is one of the extras the Messages route passes to the chat request
        # (docs/messages-api.md); without it this draw was unseeded, and now and then SmolLM2
        # sampled a city name past the 64-token budget (a call cut at `max_tokens`).
        status, r, _ = server.api("POST", "/v1/messages", {
            "model": SMOL, "max_tokens": 64, "metadata": {"user_id": str(seed)}, "seed": seed,
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"name": "get_weather", "description": "Get the weather.",
                       "input_schema": WEATHER["function"]["parameters"]}], "tool_choice": {"type": "any"}})
        check(status == 200, f"{status} {r}")
        uses = [b for b in r["content"] if b["type"] == "tool_use"]
        check(len(uses) == 1 and r["stop_reason"] == "tool_use", f"seed {seed} messages: {r}")
        city_args(uses[0]["input"])
    print(f"     {len(SEEDS)} seeds x 4 ways: every reply a call")


def main():
    binary, qwen, smol = sys.argv[1:4]
    only_instructor = "--instructor" in sys.argv
    counts = {"passed": 0, "failed": 0}
    server = Server(binary, qwen, KEY, extra=["--served-model-name", QWEN])
    try:
        if only_instructor:
            checks = [("instructor", instructor_modes)]
        else:
            checks = [
                ("openai-agents-chat", agents_sdk),
                ("openai-agents-chat-streamed", lambda s: agents_sdk(s, streamed=True)),
                ("openai-agents-responses", lambda s: agents_sdk(s, responses=True)),
                ("openai-agents-responses-streamed", lambda s: agents_sdk(s, responses=True, streamed=True)),
                ("langchain-openai-tools", langchain_openai),
                ("langchain-openai-structured", langchain_structured),
                ("langchain-anthropic", langchain_anthropic),
                ("litellm", litellm_tools),
                ("pydantic-ai", pydantic_ai_tools),
            ]
        run(server, checks, counts)
    finally:
        server.stop()
    if not only_instructor:
        server = Server(binary, smol, KEY, extra=["--served-model-name", SMOL])
        try:
            run(server, [("required-sampled", required_sampled)], counts)
        finally:
            server.stop()
    print(f"agents: {counts['passed']} passed, {counts['failed']} failed")
    finish(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
