"""Tool calls on real models, before and after issue 51's constraints, side by side in one run.

Usage: python bench/tool_calls.py <tandem binary> <gguf> <served name> [<gguf> <name> ...]

For each model, over a fixed set of tool prompts (greedy, the model's own template):

  auto well-formed   the share of prompts that asked for a tool and got a call whose arguments
                     parse and match the schema. Before: the output with the tools rendered but
                     unconstrained (`tool_choice: "none"`), read as tandem read it until issue 51
                     (Hermes `<tool_call>` tags only, or the generic object). After: `auto`.
  named correct      the share of named calls whose arguments are the right values. Before: the
                     old named path (the tools rendered, the output constrained to the
                     arguments object alone, as a `response_format` schema). After: named.
  decode tok/s       completion tokens per second of `auto` (constrained lazily) against the same
                     prompts unconstrained, in the same run (each timed on its second run, the
                     prompt cached, so the time is the decode's).

Prints one table per model. Needs only the `openai` package (target/pyenv has it).
"""

import json
import re
import sys
import time

sys.path.insert(0, "tests/python")
from tandem_server import Server  # noqa: E402

KEY = "bench-tools"


def fn(tool, desc, **props):
    return {"type": "function", "function": {"name": tool, "description": desc, "parameters": {
        "type": "object", "properties": {k: {"type": v} for k, v in props.items()}, "required": list(props)}}}


WEATHER = fn("get_weather", "Get the current weather in a city.", city="string")
STOCK = fn("get_stock_price", "Get the latest price of a stock by its ticker.", ticker="string")
TIME = fn("get_time", "Get the current time in a timezone.", timezone="string")
PERSON = fn("Person", "A person and their age.", name="string", age="integer")
TOOLS = [WEATHER, STOCK, TIME]
# (prompt, tool expected, argument expected to appear)
AUTO = [
    ("What is the weather in Paris right now?", "get_weather", "Paris"),
    ("Is it raining in Tokyo at the moment?", "get_weather", "Tokyo"),
    ("How much does one ACME share cost now?", "get_stock_price", "ACME"),
    ("Look up the latest price of the ticker MSFT.", "get_stock_price", "MSFT"),
    ("What time is it in Europe/Berlin?", "get_time", "Berlin"),
    ("Tell me the current time in the America/New_York timezone.", "get_time", "New_York"),
    ("I'm flying to Oslo tomorrow. What's the weather there now?", "get_weather", "Oslo"),
    ("Check the weather in Lima for me, please.", "get_weather", "Lima"),
]
NAMED = [
    ("Ada Lovelace was 36 when she died.", "Ada Lovelace", 36),
    ("Alan Turing lived to 41.", "Alan Turing", 41),
    ("Grace Hopper reached the age of 85.", "Grace Hopper", 85),
    ("Marie Curie died aged 66.", "Marie Curie", 66),
]


def old_read(text):
    """The calls tandem found in `auto` output before issue 51: Hermes tags, or the generic object."""
    calls = []
    for body in re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text, re.S):
        try:
            v = json.loads(body.strip())
            calls.append((v["name"], v.get("arguments", v.get("parameters"))))
        except (ValueError, KeyError, TypeError):
            pass
    if not calls and text.strip().startswith("{"):
        try:
            calls = [(c["name"], c["arguments"]) for c in json.loads(text)["tool_calls"]]
        except (ValueError, KeyError, TypeError):
            pass
    return calls


def good(name, args, tool, needle):
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return False
    schema = next(t for t in TOOLS if t["function"]["name"] == name)["function"]["parameters"] if name in \
        [t["function"]["name"] for t in TOOLS] else None
    return (name == tool and isinstance(args, dict) and schema is not None and set(args) == set(schema["properties"])
            and needle.lower() in json.dumps(args).lower())


def chat(server, model, **body):
    """The reply, and the time of a second, identical request: its prompt is in the prefix cache,
    so the time is the decode's (and the constraint's), whichever request ran first."""
    body = {"model": model, "temperature": 0, "max_tokens": 80, **body}
    for _ in range(2):
        started = time.monotonic()
        status, r, _ = server.api("POST", "/v1/chat/completions", body)
        assert status == 200, r
    return r, time.monotonic() - started


def bench(server, model):
    rows = {"auto_before": 0, "auto_after": 0, "named_before": 0, "named_after": 0}
    tok = {"free": [0, 0.0], "auto": [0, 0.0]}
    for prompt, tool, needle in AUTO:
        msgs = [{"role": "user", "content": prompt}]
        free, t_free = chat(server, model, messages=msgs, tools=TOOLS, tool_choice="none")
        text = free["choices"][0]["message"]["content"] or ""
        rows["auto_before"] += any(good(n, a, tool, needle) for n, a in old_read(text))
        after, t_after = chat(server, model, messages=msgs, tools=TOOLS)
        calls = after["choices"][0]["message"].get("tool_calls") or []
        rows["auto_after"] += any(good(c["function"]["name"], c["function"]["arguments"], tool, needle) for c in calls)
        for key, r, t in (("free", free, t_free), ("auto", after, t_after)):
            tok[key][0] += r["usage"]["completion_tokens"]
            tok[key][1] += t
    schema = PERSON["function"]["parameters"]
    for prompt, name, age in NAMED:
        msgs = [{"role": "user", "content": prompt + " Record the person."}]
        old, _ = chat(server, model, messages=msgs, tools=[PERSON], tool_choice="none",
                      response_format={"type": "json_schema", "json_schema": {"name": "Person", "schema": schema}})
        try:
            v = json.loads(old["choices"][0]["message"]["content"])
            rows["named_before"] += v.get("name") == name and v.get("age") == age
        except ValueError:
            pass
        new, _ = chat(server, model, messages=msgs, tools=[PERSON],
                      tool_choice={"type": "function", "function": {"name": "Person"}})
        calls = new["choices"][0]["message"].get("tool_calls") or []
        if calls:
            v = json.loads(calls[0]["function"]["arguments"])
            rows["named_after"] += v.get("name") == name and v.get("age") == age
    rate = {k: v[0] / v[1] if v[1] else 0.0 for k, v in tok.items()}
    print(f"\n{model}")
    print("| measure | before | after |\n|---|---|---|")
    print(f"| auto: well-formed calls of {len(AUTO)} | {rows['auto_before']} | {rows['auto_after']} |")
    print(f"| named: correct arguments of {len(NAMED)} | {rows['named_before']} | {rows['named_after']} |")
    print(f"| decode tok/s (whole requests): unconstrained / auto | {rate['free']:.1f} | {rate['auto']:.1f} |")
    print(f"auto / unconstrained time per token: {(tok['auto'][1] / max(tok['auto'][0], 1)) / (tok['free'][1] / max(tok['free'][0], 1)):.2f}x")


def main():
    binary = sys.argv[1]
    pairs = sys.argv[2:]
    for path, name in zip(pairs[::2], pairs[1::2]):
        server = Server(binary, path, KEY, extra=["--served-model-name", name])
        try:
            bench(server, name)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
