"""The official `openai` Python package, unchanged, against a running tandem.

Usage: python test_openai_sdk.py <path to tandem binary> <model gguf>
Starts its own server (tandem_server.py) on a free port with a temporary data dir, runs the checks,
stops it, and prints 'N passed, M failed'.
"""
import io
import json
import os
import subprocess
import sys
import tarfile

import gguf
import numpy
import openai
import safetensors.numpy
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as classic_families

from tandem_server import Server, finish, rl_step, run_checks, scratch, trained_step

KEY = "sdk-test-key"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# The server's --lora-root (runtime_lora_adapter unpacks an exported checkpoint under it).
LORA_ROOT = scratch("tandem-loras-")
checks = []


def check(fn):
    checks.append(fn)
    return fn


@check
def non_streaming_with_logprobs_and_token_ids(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        temperature=0, max_tokens=16, logprobs=True, top_logprobs=2,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    extra = c.model_extra or {}
    token_ids = extra["token_ids"]
    assert len(token_ids) == r.usage.completion_tokens == len(c.logprobs.content)
    assert all(e.token == f"token_id:{t}" for e, t in zip(c.logprobs.content, token_ids))
    assert len((r.model_extra or {})["prompt_token_ids"]) == r.usage.prompt_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


@check
def streaming_matches_non_streaming(client):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Name a fruit."}], temperature=0, max_tokens=12)
    full = client.chat.completions.create(**args).choices[0].message.content
    text, usage = "", None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text == full, (text, full)
    assert usage is not None and usage.completion_tokens > 0


@check
def n_choices_and_seed(client):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Say a word."}], n=3, seed=5, temperature=1.0, max_tokens=8)
    a = client.chat.completions.create(**args)
    b = client.chat.completions.create(**args)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]


@check
def stop_strings(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count: 1, 2, 3"}], temperature=0,
                                       max_tokens=30, stop=[","])
    assert "," not in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


@check
def errors_raise_the_sdk_exceptions(client):
    try:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=9)
        raise AssertionError("expected BadRequestError")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "temperature" in str(e)
    try:
        client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected NotFoundError")
    except openai.NotFoundError:
        pass
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    try:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected AuthenticationError")
    except openai.AuthenticationError:
        pass


@check
def completions_text_tokens_and_lists(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=8,
                                  logprobs=2, extra_body={"return_token_ids": True})
    c = r.choices[0]
    assert r.object == "text_completion" and c.text and c.finish_reason in ("stop", "length")
    extra = c.model_extra or {}
    assert len(extra["token_ids"]) == r.usage.completion_tokens == len(c.logprobs.tokens) == len(c.logprobs.token_logprobs)
    assert len(extra["prompt_token_ids"]) == r.usage.prompt_tokens
    assert all(len(top) >= 1 for top in c.logprobs.top_logprobs)
    assert c.logprobs.text_offset == sorted(c.logprobs.text_offset)
    # The same prompt as token ids gives the same greedy text.
    again = client.completions.create(model=MODEL, prompt=extra["prompt_token_ids"], temperature=0, max_tokens=8,
                                      extra_body={"add_special_tokens": False})
    assert again.choices[0].text == c.text, (again.choices[0].text, c.text)
    # Two prompts, two choices each: numbered prompt by prompt.
    many = client.completions.create(model=MODEL, prompt=["One, two,", "Red, green,"], n=2, temperature=0.8, max_tokens=4,
                                     seed=3)
    assert [x.index for x in many.choices] == [0, 1, 2, 3]


@check
def completions_stream_and_echo(client):
    args = dict(model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=10)
    full = client.completions.create(echo=True, **args).choices[0].text
    assert full.startswith("Once upon a time")
    text, usage = "", None
    for chunk in client.completions.create(stream=True, echo=True, stream_options={"include_usage": True}, **args):
        if chunk.choices:
            text += chunk.choices[0].text
        if chunk.usage:
            usage = chunk.usage
    assert text == full, (text, full)
    assert usage is not None and usage.completion_tokens > 0
    # Echo-only scoring (max_tokens 0): the prompt and its logprobs, nothing generated.
    scored = client.completions.create(model=MODEL, prompt="Once upon a time", echo=True, max_tokens=0, logprobs=1)
    c = scored.choices[0]
    assert c.text == "Once upon a time" and c.finish_reason == "length", c
    assert scored.usage.completion_tokens == 0 and len(c.logprobs.tokens) == scored.usage.prompt_tokens, scored
    assert c.logprobs.token_logprobs[0] is None and all(lp <= 0 for lp in c.logprobs.token_logprobs[1:]), c.logprobs
    try:
        client.completions.create(model=MODEL, prompt="x", suffix="y")
        raise AssertionError("expected BadRequestError")
    except openai.BadRequestError as e:
        assert "suffix" in str(e)


@check
def responses_store_chain_and_delete(client):
    r = client.responses.create(model=MODEL, input="What is 2+2?", instructions="Answer briefly.", max_output_tokens=12,
                                temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.output_text, r
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    again = client.responses.retrieve(r.id)
    assert again.id == r.id and again.output_text == r.output_text
    nxt = client.responses.create(model=MODEL, input="And 3+3?", previous_response_id=r.id, max_output_tokens=8,
                                  temperature=0)
    assert nxt.previous_response_id == r.id and nxt.usage.input_tokens > r.usage.input_tokens
    client.responses.delete(r.id)
    try:
        client.responses.retrieve(r.id)
        raise AssertionError("expected NotFoundError")
    except openai.NotFoundError:
        pass


@check
def responses_stream_and_structured_output(client):
    args = dict(model=MODEL, input="Name a fruit.", max_output_tokens=10, temperature=0)
    full = client.responses.create(**args).output_text
    text, done = "", None
    for event in client.responses.create(stream=True, **args):
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            done = event.response
    assert text == full and done is not None and done.output_text == full, (text, full)
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Is the sky blue?", max_output_tokens=30,
                                text={"format": {"type": "json_schema", "name": "yn", "schema": schema, "strict": True}})
    assert json.loads(r.output_text)["answer"] in ("yes", "no"), r.output_text


@check
def responses_function_calls(client):
    tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                             "additionalProperties": False}}]
    r = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=tools, tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=120, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments), r.output
    follow = client.responses.create(model=MODEL, previous_response_id=r.id, tools=tools, max_output_tokens=16,
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "sunny"}])
    assert follow.status in ("completed", "incomplete"), follow


@check
def models_list(client):
    ids = [m.id for m in client.models.list()]
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in ids


@check
def trained_checkpoint_on_every_route(client, server):
    name, _ = trained_step(server)
    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Is snow white?"}],
                                          temperature=0, max_tokens=8, logprobs=True)
    assert chat.model == name and chat.choices[0].message.content and chat.choices[0].logprobs.content
    text = client.completions.create(model=name, prompt="The sky is", max_tokens=4, temperature=0, logprobs=1)
    assert text.model == name and text.choices[0].text and len(text.choices[0].logprobs.tokens) == 4
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=name, prompt="The sky is", max_tokens=4, temperature=0, stream=True) if c.choices)
    assert streamed == text.choices[0].text, (streamed, text.choices[0].text)
    resp = client.responses.create(model=name, input="Is snow white?", max_output_tokens=8, temperature=0)
    assert resp.model == name and resp.output_text
    ids = [m.id for m in client.models.list()]
    assert name in ids and name.rsplit(":", 1)[0] in ids, ids


@check
def runtime_lora_adapter(client, server):
    """A trained checkpoint out and back in: exported as a PEFT adapter (the archive route), its
    files checked with the `safetensors` package for PEFT's names, shapes and config, unpacked
    under the server's --lora-root and loaded with vLLM's /v1/load_lora_adapter: served under its
    name with the same tokens and logprobs as the checkpoint, listed with its parent, gone once
    unloaded."""
    name, model_id = trained_step(server)
    status, archive, headers = server.api("GET", f"/v1/preview/models/{model_id}/checkpoints/1/adapter")
    assert status == 200 and headers["content-type"] == "application/x-tar", (status, headers)
    folder = "sdk-trained-step1"
    assert headers["content-disposition"] == f'attachment; filename="{folder}.tar"', headers
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        assert sorted(tar.getnames()) == [f"{folder}/adapter_config.json", f"{folder}/adapter_model.safetensors"]
        tar.extractall(LORA_ROOT, filter="data")
    os.rename(os.path.join(LORA_ROOT, folder), os.path.join(LORA_ROOT, "step1"))
    config = json.load(open(os.path.join(LORA_ROOT, "step1", "adapter_config.json")))
    assert (config["peft_type"], config["base_model_name_or_path"]) == ("LORA", MODEL), config
    r = config["r"]
    tensors = safetensors.numpy.load_file(os.path.join(LORA_ROOT, "step1", "adapter_model.safetensors"))
    # SmolLM2-135M: 30 layers, hidden 576, 9 query and 3 key/value heads of 64, MLP 1536.
    dims = {"self_attn.q_proj": (576, 576), "self_attn.k_proj": (576, 192), "self_attn.v_proj": (576, 192),
            "self_attn.o_proj": (576, 576), "mlp.gate_proj": (576, 1536), "mlp.up_proj": (576, 1536),
            "mlp.down_proj": (1536, 576)}
    assert sorted(m.split(".")[-1] for m in dims) == sorted(config["target_modules"]), config["target_modules"]
    expected = {}
    for layer in range(30):
        for module, (n_in, n_out) in dims.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            expected[f"{prefix}.lora_A.weight"] = (r, n_in)
            expected[f"{prefix}.lora_B.weight"] = (n_out, r)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    assert all(v.dtype.name == "float32" for v in tensors.values())
    status, body, _ = server.api("POST", "/v1/load_lora_adapter", {"lora_name": "sdk-lora", "lora_path": "step1"})
    assert (status, body) == (200, "Success: LoRA adapter 'sdk-lora' added successfully."), (status, body)
    ask = dict(messages=[{"role": "user", "content": "Is snow white?"}], temperature=0, max_tokens=8, logprobs=True)
    loaded = client.chat.completions.create(model="sdk-lora", **ask)
    assert loaded.model == "sdk-lora"
    served = client.chat.completions.create(model=name, **ask)
    lps = lambda c: [(t.token, t.logprob) for t in c.choices[0].logprobs.content]
    assert lps(loaded) == lps(served), (lps(loaded), lps(served))
    cards = {m.id: m for m in client.models.list()}
    assert (cards["sdk-lora"].model_extra or {})["parent"] == MODEL, cards["sdk-lora"]
    status, body, _ = server.api("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "../etc"})
    assert status == 400 and body["error"]["param"] == "lora_path", body
    status, body, _ = server.api("POST", "/v1/unload_lora_adapter", {"lora_name": "sdk-lora"})
    assert status == 200, body
    try:
        client.chat.completions.create(model="sdk-lora", **ask)
        raise AssertionError("expected NotFoundError")
    except openai.NotFoundError:
        pass


@check
def an_exported_adapter_imports_as_a_checkpoint_and_trains_further(client, server):
    """A trained checkpoint's PEFT archive uploaded to another model: its step 1 at once, with the
    same tokens and logprobs as the original; then a real RL step continues from it (step 2).
    Archives that are not an adapter of this base model are 422s saying why."""
    name, model_id = trained_step(server)
    _, archive, _ = server.api("GET", f"/v1/preview/models/{model_id}/checkpoints/1/adapter")
    status, model, _ = server.api("POST", "/v1/preview/models",
                                  {"project": "sdk", "name": "imported", "base_model": MODEL})
    assert status == 200, model

    def upload(data):
        return server.api("POST", f"/v1/preview/models/{model['id']}/checkpoints", raw_body=data,
                          headers={"Content-Type": "application/x-tar"})

    status, cp, _ = upload(archive)
    assert (status, cp.get("step")) == (200, 1), (status, cp)
    ask = dict(messages=[{"role": "user", "content": "Is snow white?"}], temperature=0, max_tokens=8, logprobs=True)
    lps = lambda c: [(t.token, t.logprob) for t in c.choices[0].logprobs.content]
    imported = name.replace("/sdk/trained:step1", "/sdk/imported:step1")
    original = client.chat.completions.create(model=name, **ask)
    assert lps(client.chat.completions.create(model=imported, **ask)) == lps(original)

    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        files = {m.name.split("/")[-1]: tar.extractfile(m).read() for m in tar.getmembers()}

    def tar_of(entries, link=False):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for n, data in entries.items():
                info = tarfile.TarInfo(n)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            if link:
                info = tarfile.TarInfo("adapter_model.safetensors")
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
        return out.getvalue()

    wrong_rank = json.dumps({**json.loads(files["adapter_config.json"]), "r": 4}).encode()
    nan = safetensors.numpy.save({
        "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight": numpy.full((r := json.loads(
            files["adapter_config.json"])["r"], 576), numpy.nan, numpy.float32),
        "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight": numpy.zeros((192, r), numpy.float32)})
    for data, says in [(b"not an archive", "tar"),
                       (tar_of({"adapter_config.json": files["adapter_config.json"]}), "no adapter_model.safetensors"),
                       (tar_of({"adapter_config.json": files["adapter_config.json"]}, link=True), "plain files"),
                       (tar_of({"adapter_config.json": wrong_rank,
                                "adapter_model.safetensors": files["adapter_model.safetensors"]}), "does not fit"),
                       (tar_of({"adapter_config.json": files["adapter_config.json"], "adapter_model.safetensors": nan}),
                        "not finite")]:
        status, body, _ = upload(data)
        assert status == 422 and says in json.dumps(body), (says, status, body)
    # Nothing of a refused upload is kept: one directory, step 1's.
    kept = os.listdir(os.path.join(server.data, "checkpoints", model["id"]))
    assert len(kept) == 1, kept

    rl_step(server, model["id"], "Is snow white? Answer yes or no.", seed=5)
    _, cps, _ = server.api("GET", f"/v1/preview/models/{model['id']}/checkpoints")
    assert [c["step"] for c in cps["data"]] == [1, 2], cps


@check
def a_checkpoint_merges_into_a_gguf_that_answers_as_the_checkpoint(client, server):
    """`tandem export --merged` on the trained checkpoint: the file read back with the `gguf`
    package has the base's tensors (names, types, shapes) and metadata; a second tandem serving it
    as a plain base model gives the checkpoint's greedy answers (up to a near-tie); in f32 its
    projections are the base's plus (alpha / r) B A of the exported PEFT files, computed here with
    numpy."""
    name, model_id = trained_step(server)
    out = os.path.join(server.data, "merged.gguf")
    run = subprocess.run([server.binary, "export", "--data-dir", server.data, "--model", model_id, "--step", "1",
                          "--merged", out, "--base", server.model_path], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == out, run.stderr
    base_file, merged_file = gguf.GGUFReader(server.model_path), gguf.GGUFReader(out)
    layout = lambda r: {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in r.tensors}
    assert layout(merged_file) == layout(base_file)
    assert merged_file.fields["general.architecture"].contents() == "llama"
    assert merged_file.fields["tokenizer.chat_template"].contents() == base_file.fields["tokenizer.chat_template"].contents()
    second = Server(server.binary, out, KEY, prefix="tandem-merged-")
    try:
        merged_client = openai.OpenAI(base_url=second.url + "/v1", api_key=KEY)
        (served,) = [m.id for m in merged_client.models.list()]
        for q in ["Is snow white?", "Name a color."]:
            ask = dict(messages=[{"role": "user", "content": q}], temperature=0, max_tokens=8, logprobs=True,
                       top_logprobs=5)
            got = merged_client.chat.completions.create(model=served, **ask).choices[0].logprobs.content
            want = client.chat.completions.create(model=name, **ask).choices[0].logprobs.content
            # The merged file requantises W + BA into the base's Q4_1, and int8 activations turn
            # such differences into a few hundredths of a nat, so the greedy paths may part, but
            # only at a near-tie: where they first differ, the checkpoint's token is among the
            # merged model's top 5, within 0.5 nats of its choice.
            for i, (m, t) in enumerate(zip(got, want)):
                if m.token == t.token:
                    continue
                alt = {c.token: c.logprob for c in m.top_logprobs}
                assert t.token in alt and m.logprob - alt[t.token] < 0.5, (q, i, m.token, m.logprob, t.token, alt)
                break
            else:
                assert len(got) == len(want), (q, [m.token for m in got], [t.token for t in want])
    finally:
        second.stop()
    # In f32, independently of tandem's reader: merged - base = (alpha / r) B A, from the exported
    # PEFT files, on projections whose rows need no rotary reordering.
    f32_out = os.path.join(server.data, "merged-f32.gguf")
    run = subprocess.run([server.binary, "export", "--data-dir", server.data, "--model", model_id, "--merged",
                          f32_out, "--base", server.model_path, "--format", "f32"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    base_t = {t.name: t for t in base_file.tensors}
    merged_t = {t.name: t for t in gguf.GGUFReader(f32_out).tensors}
    _, archive, _ = server.api("GET", f"/v1/preview/models/{model_id}/checkpoints/1/adapter")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        files = {m.name.split("/")[-1]: tar.extractfile(m).read() for m in tar.getmembers()}
    lora = safetensors.numpy.load(files["adapter_model.safetensors"])
    config = json.loads(files["adapter_config.json"])
    scale = config["lora_alpha"] / config["r"]
    for layer, module, short in [(0, "self_attn.v_proj", "attn_v"), (7, "mlp.down_proj", "ffn_down")]:
        t = base_t[f"blk.{layer}.{short}.weight"]
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(numpy.float64)
        merged = numpy.asarray(merged_t[f"blk.{layer}.{short}.weight"].data, dtype=numpy.float64)
        prefix = f"base_model.model.model.layers.{layer}.{module}"
        delta = scale * (lora[f"{prefix}.lora_B.weight"].astype(numpy.float64) @ lora[f"{prefix}.lora_A.weight"])
        assert merged.shape == w.shape == delta.shape, (merged.shape, w.shape, delta.shape)
        assert numpy.abs(delta).max() > 0, "the trained adapter is not zero"
        # Up to the f32 rounding of the stored sum: one unit in the last place of each value.
        ulp = numpy.spacing(numpy.abs(merged).astype(numpy.float32)).astype(numpy.float64)
        excess = numpy.abs((merged - w) - delta) - ulp
        assert excess.max() <= 1e-3 * numpy.abs(delta).max(), (short, excess.max(), numpy.abs(delta).max())
    missing = subprocess.run([server.binary, "export", "--data-dir", server.data, "--model", model_id, "--step", "9",
                              "--merged", out + ".x", "--base", server.model_path], capture_output=True, text=True)
    assert missing.returncode != 0 and "no live checkpoint at step 9" in missing.stderr, missing.stderr
    assert not os.path.exists(out + ".x")
    # The API's merged download is the same file, byte for byte, in both formats.
    for path, fmt in [(out, "base"), (f32_out, "f32")]:
        status, body, headers = server.api("GET", f"/v1/preview/models/{model_id}/checkpoints/1/merged?format={fmt}")
        assert status == 200 and headers.get("content-type") == "application/octet-stream", (status, headers)
        with open(path, "rb") as f:
            assert body == f.read(), f"the {fmt} download differs from `tandem export`"


@check
def metrics_parse_as_openmetrics(client, server):
    """/metrics read by the Prometheus Python client's strict OpenMetrics parser, after the
    checks above sent traffic: vLLM's families with their types and samples."""
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    # Prometheus' own Accept header asks for OpenMetrics first.
    prometheus_accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                         "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    status, text, headers = server.api("GET", "/metrics", headers={"Accept": prometheus_accept})
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text"), (status, headers)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # Any other scraper gets the classic text format, as vLLM's server answers, which the
    # classic parser reads to the same families and samples.
    status, classic, headers = server.api("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4"), (status, headers)
    assert "# EOF" not in classic and "# TYPE http_requests_total counter" in classic, classic[:500]
    old = {f.name: f for f in classic_families(classic)}
    for name in ["vllm:prompt_tokens", "http_requests", "vllm:time_to_first_token_seconds", "tandem:training_jobs"]:
        assert old[name].type == families[name].type, (name, old[name].type, families[name].type)
    types = {name: f.type for name, f in families.items()}
    for name, kind in [("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prompt_tokens", "counter"),
                       ("vllm:generation_tokens", "counter"), ("vllm:request_success", "counter"),
                       ("vllm:time_to_first_token_seconds", "histogram"),
                       ("vllm:e2e_request_latency_seconds", "histogram"), ("tandem:training_jobs", "gauge"),
                       ("tandem:training_gradient_steps", "counter"), ("http_requests", "counter"),
                       ("http_request_duration_seconds", "histogram"), ("vllm:cache_config_info", "gauge"),
                       ("vllm:lora_requests_info", "gauge")]:
        assert types.get(name) == kind, (name, types.get(name))
    # What the Gateway API Inference Extension's endpoint picker reads: the KV capacity as
    # block_size * num_gpu_blocks, and the running adapters from the newest lora series.
    (cache,) = families["vllm:cache_config_info"].samples
    assert cache.value == 1 and int(cache.labels["block_size"]) * int(cache.labels["num_gpu_blocks"]) > 1000, cache
    (lora,) = families["vllm:lora_requests_info"].samples
    assert set(lora.labels) == {"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, lora
    assert lora.value > 1.7e9 and int(lora.labels["max_lora"]) >= 1, lora

    def total(family, sample, **labels):
        return sum(s.value for s in families[family].samples
                   if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))

    assert total("vllm:prompt_tokens", "vllm:prompt_tokens_total", model_name=MODEL) > 0
    assert total("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") > 0
    assert total("tandem:training_gradient_steps", "tandem:training_gradient_steps_total", kind="rl") >= 1
    assert total("http_requests", "http_requests_total", handler="/v1/chat/completions", status="2xx") > 0
    assert total("http_requests", "http_requests_total", handler="/v1/load_lora_adapter", status="4xx") >= 1


def main():
    return run_checks("openai-sdk", checks, sys.argv[1], sys.argv[2], KEY,
                      lambda server: openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120),
                      extra=["--lora-root", LORA_ROOT])


if __name__ == "__main__":
    finish(main())
