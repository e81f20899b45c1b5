"""The Tinker SDK (`tinker` 0.38.0, unchanged) against tandem: the routes served so far.

Usage: python test_tinker.py <path to tandem binary> <model gguf>

Run with a virtualenv that has `tinker==0.38.0` (`make test` makes target/tinkerenv). Starts a
server, points `tinker.ServiceClient` at it with a `tml-` key, and checks:

  sft-loop          create a LoRA model, then forward_backward (cross_entropy) + optim_step five
                    times: the loss falls; per-datum logprobs and `loss:sum` come back
  modules           train_attn=False trains the MLP projections only; the saved state's weights_info
                    says so and a client from it keeps the choice; both False is refused
  rl-losses         importance_sampling, ppo (with clip thresholds) and cispo each run; `forward`
                    gives the same logprobs as the forward_backward before any step
  sampler-weights   save_weights_for_sampler by name: a tinker:// path, and the adapter is the
                    next checkpoint of the model's tandem record (project `tinker`), served at
                    once by /v1/completions with logprobs that differ from the base model's
  sampling          a sampling client on the saved sampler weights (and one from
                    save_weights_and_get_sampling_client): n samples with per-token
                    logprobs and stop reasons, a stop token ending a sample (and included in it),
                    compute_logprobs equal to /v1/completions' prompt logprobs for the same step,
                    greedy sampling of the base model equal to /v1/completions' greedy text
  scores            topk_prompt_logprobs and topk_sample_logprobs (against /v1/completions' prompt
                    logprobs), target_prompt_logprobs dense and sparse CSR, prompt_alt_tokens_k
                    (greedy draws are the top token; seeded draws repeat); bad ones refused by name
  download          save_weights_external: signed URLs fetched without a key give the adapter's PEFT
                    files; TTL accepted; tampered URL 403, another entity 404, delete; the CLI's
                    `tinker checkpoint download` of a saved state
  saved-state       save_state, then create_training_client_from_state_with_optimizer and
                    create_training_client_from_state: the same weights; with the optimizer the
                    next step's result is identical, with fresh moments it is not; the RestClient
                    lists the run's checkpoints and deletes one by its tinker path
  pipelined         calls submitted without waiting for results run in seq_id order; one waiting
                    behind running work longer than the gap wait (GAP_SECONDS) still runs
  bad-input         a NaN advantage, an unknown loss (and `custom`, Tinker's uploaded losses),
                    a token id outside the vocabulary, a float target, a 2-D input and a length
                    mismatch and a batch over --max-job-tokens fail their own call (a user error,
                    not retried); a reused seq_id and one past a gap sent by another client move
                    nothing; the next call still runs, and the one past the gap fails alone after
                    the gap wait, naming the seq_id
  other-entity      another key's client cannot see the model (404)
  tokenizer         TrainingClient.get_tokenizer() loads the directory get_info names, offline:
                    its ids and chat template equal tandem's /tokenize
  session-end       leaving `with ServiceClient(...)` finishes the session cleanly; sampler weights
                    it saved by name still sample, list and delete by their tinker:// path afterwards
                    (the owner's only), and saving over a name deleted the checkpoint it named
  rest-runs         the RestClient lists the entity's runs (base model, rank, last checkpoints), gets
                    one by a tinker:// path, lists checkpoints across runs and a state's
                    weights_info; another entity sees none of them
  load-state        TrainingClient.load_state[_with_optimizer] into a held model: its weights become
                    the saved ones (a state of another rank is refused by name)
  curves            each optim_step writes train/loss, train/grad_norm, ... to the model record's
                    history, as the dashboard reads it
  publish           a published state and sampler weights load and sample for another entity (the
                    owner's weights and scores), nothing else of the run; unpublished or saved over,
                    they are a 404 to others again (a sampling client made before too)
  expiry            ttl_seconds on every kind of save and set_checkpoint_ttl: expires_at listed,
                    bounds checked; after a restart with the times moved into the past, the sweep
                    deletes what expired (the sampler checkpoint too) and keeps the rest (last:
                    it restarts the server)
  (issue 50)        tinker_probes.py's checks: seq_ids consumed by refusals and gaps, crossed clip
                    thresholds, a reused step behind a published sampler, the model cap under
                    concurrency, bounded results and bodies, the cookbook's losses and targets,
                    sampling bursts, sessions ended by missed heartbeats
  hub-tokenizer     SamplingClient.get_tokenizer() loads the base model by name from the hub cache
                    the server writes (HF_HUB_CACHE=<data>/hf-hub), and GET /v1/tokenizer gives
                    the same files as a tar archive (a directory, or a hub cache's layout)

Prints 'tinker: N passed, M failed' and exits non-zero on any failure.
"""

import io
import math
import os
import sqlite3
import sys
import tarfile
import time

# The data directory is chosen before anything imports huggingface_hub (it reads HF_HUB_CACHE once):
# the server writes its hub cache there.
from tandem_server import finish, run_checks, scratch  # noqa: E402  (standard library only)

DATA = scratch("tandem-tinker-")
os.environ["HF_HUB_CACHE"] = os.path.join(DATA, "hf-hub")
os.environ["HF_HUB_OFFLINE"] = "1"

import tinker  # noqa: E402
from tinker import types  # noqa: E402


from tinker_common import BASE, KEY, TOKENS, datum, logprobs, service  # noqa: E402
import tinker_probes  # noqa: E402


class Ctx:
    def __init__(self, server):
        self.server = server
        self.sc = service(server)
        self.tc = self.sc.create_lora_training_client(base_model=BASE, rank=8, seed=3).result()


def sft_loop(ctx):
    tc = ctx.tc
    caps = ctx.sc.create_rest_client().get_server_capabilities().result()
    names = [m.model_name for m in caps.supported_models]
    assert names == [BASE], names
    info = tc.get_info()
    assert info.model_data.model_name == BASE and info.lora_rank == 8, info
    d = datum(weights=1.0)
    losses = []
    for _ in range(5):
        out = tc.forward_backward([d], "cross_entropy").result()
        assert "loss:sum" in out.metrics, out.metrics
        lps = logprobs(out)
        assert len(lps) == len(TOKENS) - 1 and all(lp <= 0 for lp in lps), lps
        assert abs(out.metrics["loss:sum"] + sum(lps)) < 1e-3 * max(1.0, abs(out.metrics["loss:sum"]))
        losses.append(out.metrics["loss:sum"])
        step = tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        assert step.metrics["grad_norm:mean"] > 0, step
    assert losses[-1] < losses[0] - 1.0, losses


def modules(ctx):
    """train_attn=False trains the MLP projections (and, the SDK's default, the output head)
    only: the loss falls, the saved state says so through weights_info, a client created from it
    keeps the choice. The output head alone (train_unembed) trains too, and its sampler weights
    serve what the training forward computes. All three False is refused. In a session of its
    own, which leaving `with` finishes (an entity holds at most 4 models)."""
    with service(ctx.server) as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=5, train_attn=False).result()
        d = datum(weights=1.0)
        losses = []
        for _ in range(3):
            losses.append(tc.forward_backward([d], "cross_entropy").result().metrics["loss:sum"])
            tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        assert losses[-1] < losses[0], losses
        saved = tc.save_state("mlp-only").result().path
        rest = sc.create_rest_client()
        info = rest.get_weights_info_by_tinker_path(saved).result()
        assert info.train_attn is False and info.train_mlp is True and info.lora_rank == 4, info
        assert info.train_unembed is True, info
        again = sc.create_training_client_from_state_with_optimizer(saved).result()
        assert again.forward_backward([d], "cross_entropy").result().metrics["loss:sum"] < losses[-1]
        again.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        head = sc.create_lora_training_client(base_model=BASE, rank=4, seed=6, train_attn=False,
                                              train_mlp=False, train_unembed=True).result()
        fresh = logprobs(head.forward([d], "cross_entropy").result())
        losses = []
        for _ in range(3):
            losses.append(head.forward_backward([d], "cross_entropy").result().metrics["loss:sum"])
            head.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        assert losses[-1] < losses[0], losses
        path = head.save_weights_for_sampler("head-only").result().path
        info = rest.get_weights_info_by_tinker_path(path).result()
        assert (info.train_attn, info.train_mlp, info.train_unembed) == (False, False, True), info
        # Served, the head's pair moves each logprob as the trainer's forward says it does.
        trained = logprobs(head.forward([d], "cross_entropy").result())
        prompt = types.ModelInput.from_ints(TOKENS)
        base = sc.create_sampling_client(base_model=BASE).compute_logprobs(prompt).result()[1:]
        served = sc.create_sampling_client(model_path=path).compute_logprobs(prompt).result()[1:]
        moved = [t - f for t, f in zip(trained, fresh)]
        effect = max(abs(m) for m in moved)
        assert effect > 0.05, moved
        gap = max(abs((s - b) - m) for s, b, m in zip(served, base, moved))
        assert gap < 0.25 * effect, (gap, effect)
    # Training nothing: the SDK refuses it itself; sent anyway, so does the server.
    import json
    status, session, _ = ctx.server.api("POST", "/api/v1/create_session", {}, key=f"tml-{KEY}")
    assert status == 200, session
    status, reply, _ = ctx.server.api("POST", "/api/v1/create_model", {
        "session_id": session["session_id"], "model_seq_id": 0, "base_model": BASE,
        "lora_config": {"rank": 4, "train_attn": False, "train_mlp": False, "train_unembed": False}},
        key=f"tml-{KEY}")
    assert status in (400, 422) and "nothing would train" in json.dumps(reply), (status, reply)
    ctx.server.api("POST", f"/api/v1/sessions/{session['session_id']}/finish", {}, key=f"tml-{KEY}")


def download(ctx):
    """save_weights_external, its signed URLs fetched without a key (PEFT files of the adapter),
    the TTL accepted, another entity's 404, a tampered URL refused, the delete; then the CLI's
    `tinker checkpoint download` of a saved state, which goes through all of these."""
    import json
    import subprocess
    import urllib.error
    import urllib.request
    tc, rest = ctx.tc, ctx.sc.create_rest_client()
    path = tc.save_weights_external("exported").result().path
    assert path == f"tinker://{tc.model_id}/external_weights/exported", path
    signed = rest.get_external_weights_urls(path).result()
    assert sorted(signed.urls) == ["adapter_config.json", "adapter_model.safetensors"], signed.urls
    files = {name: urllib.request.urlopen(url).read() for name, url in signed.urls.items()}
    config = json.loads(files["adapter_config.json"])
    assert config["r"] == 8 and "q_proj" in config["target_modules"], config
    # The SDK trains the output head by default: its pair is PEFT's lm_head module.
    assert "lm_head" in config["target_modules"], config
    header = files["adapter_model.safetensors"]
    names = json.loads(header[8:8 + int.from_bytes(header[:8], "little")])
    assert any(n.endswith("layers.0.self_attn.q_proj.lora_A.weight") for n in names), list(names)[:4]
    assert names["base_model.model.lm_head.lora_B.weight"]["shape"] == [49152, 8], names.get(
        "base_model.model.lm_head.lora_B.weight")
    # Encrypted to two age recipients: each file `.age`, and either identity decrypts the same
    # PEFT files; a recipient that is not one is the caller's error.
    import pyrage
    alice, bob = pyrage.x25519.Identity.generate(), pyrage.x25519.Identity.generate()
    sealed = tc.save_weights_external("sealed", age_encryption_recipients=[
        str(alice.to_public()), str(bob.to_public())]).result().path
    urls = rest.get_external_weights_urls(sealed).result().urls
    assert sorted(urls) == ["adapter_config.json.age", "adapter_model.safetensors.age"], urls
    secret = {name: urllib.request.urlopen(url).read() for name, url in urls.items()}
    assert b"lora" not in secret["adapter_config.json.age"]
    opened = json.loads(pyrage.decrypt(secret["adapter_config.json.age"], [bob]))
    assert opened["target_modules"] == config["target_modules"], opened
    weights = pyrage.decrypt(secret["adapter_model.safetensors.age"], [alice])
    assert weights[:8] == header[:8] and len(weights) == len(header), "the encrypted file holds the adapter"
    try:
        tc.save_weights_external("sealed-bad", age_encryption_recipients=["age1notarecipient"]).result()
        raise AssertionError("a bad recipient was accepted")
    except tinker.RequestFailedError as e:
        assert "not an age recipient" in str(e), e
    rest.delete_checkpoint_from_tinker_path(sealed).result()
    rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    url = signed.urls["adapter_config.json"]
    token = url.split("/external_weights_files/")[1].split("/")[0]
    tampered = url.replace(token, token[:-1] + ("0" if token[-1] != "0" else "1"))
    for bad_url, code in ((tampered, 403), (url.replace("adapter_config.json", "other.bin"), 404)):
        try:
            urllib.request.urlopen(bad_url)
            raise AssertionError(f"{bad_url} was served")
        except urllib.error.HTTPError as e:
            assert e.code == code, (bad_url, e.code)
    other = service(ctx.server, key=ctx.server.new_key("downloader-else")).create_rest_client()
    try:
        other.get_external_weights_urls(path).result()
        raise AssertionError("another entity signed URLs of the export")
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001
        assert "404" in str(e) or "not found" in str(e).lower(), e
    rest.delete_checkpoint_from_tinker_path(path).result()
    try:
        urllib.request.urlopen(url)
        raise AssertionError("a deleted export was served")
    except urllib.error.HTTPError as e:
        assert e.code == 404, e.code
    # The CLI: a saved state exported through a training client of its own, fetched, cleaned up.
    state = tc.save_state("for-download").result().path
    out = scratch("tandem-download-")
    env = dict(os.environ, TINKER_BASE_URL=f"http://{ctx.server.host}:{ctx.server.port}", TINKER_API_KEY=f"tml-{KEY}")
    cli = os.path.join(os.path.dirname(sys.executable), "tinker")
    run = subprocess.run([cli, "checkpoint", "download", state, "--output", out], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, (run.stdout, run.stderr)
    got = os.listdir(os.path.join(out, state.replace("tinker://", "").replace("/", "_")))
    assert sorted(got) == ["adapter_config.json", "adapter_model.safetensors"], got


def rl_losses(ctx):
    tc = ctx.tc
    n = len(TOKENS) - 1
    fwd = tc.forward([datum(weights=0.0)], "cross_entropy").result()
    sampled = logprobs(fwd)
    # At ratio 1 the forward of an RL loss gives the same logprobs.
    rl = datum(logprobs=sampled, advantages=[1.0 if i % 2 else -0.5 for i in range(n)])
    for loss, config in (("importance_sampling", None), ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
                         ("cispo", None)):
        out = tc.forward_backward([rl], loss, loss_fn_config=config).result()
        got = logprobs(out)
        assert max(abs(a - b) for a, b in zip(got, sampled)) < 1e-4, (loss, got, sampled)
        assert math.isfinite(out.metrics["loss:sum"]), out.metrics
    tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()


def record_of(ctx, model_id):
    """The tandem model record of a Tinker model, found by name (not within one page)."""
    session, _, seq = model_id.split(":")
    name = f"{session}-train-{seq}"
    status, models, _ = ctx.server.api("GET", f"/v1/preview/models?search={name}")
    assert status == 200, models
    return next(m for m in models["data"] if m["name"] == name)


def sampler_weights(ctx):
    tc = ctx.tc
    saved = tc.save_weights_for_sampler("after-sft").result()
    assert saved.path == f"tinker://{tc.model_id}/sampler_weights/after-sft", saved.path
    record = record_of(ctx, tc.model_id)
    ctx.entity = record["entity"]
    status, cps, _ = ctx.server.api("GET", f"/v1/preview/models/{record['id']}/checkpoints")
    assert status == 200 and [c["step"] for c in cps["data"]] == [1], cps

    def prompt_logprobs(model):
        status, out, _ = ctx.server.api("POST", "/v1/completions", {
            "model": model, "prompt": TOKENS, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0})
        assert status == 200, out
        return [next(iter(p.values()))["logprob"] for p in out["choices"][0]["prompt_logprobs"][1:]]

    trained = prompt_logprobs(f"{record['entity']}/tinker/{record['name']}")
    base = prompt_logprobs(BASE)
    # The SFT steps raised the sentence's logprobs under the trained adapter.
    assert sum(trained) > sum(base) + 1.0, (sum(trained), sum(base))


def sampling(ctx):
    tc, sc = ctx.tc, ctx.sc
    path = f"tinker://{tc.model_id}/sampler_weights/after-sft"
    sampler = sc.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints(TOKENS[:5])
    res = sampler.sample(prompt=prompt, num_samples=3,
                         sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0, seed=1)).result()
    assert len(res.sequences) == 3, res
    for seq in res.sequences:
        assert 1 <= len(seq.tokens) <= 8 and len(seq.logprobs) == len(seq.tokens), seq
        assert all(lp <= 0 for lp in seq.logprobs) and seq.stop_reason in ("stop", "length"), seq
    # A stop token ends the sample and is part of it.
    first = res.sequences[0].tokens[0]
    stopped = sampler.sample(prompt=prompt, num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=8, temperature=1.0, seed=1, stop=[first])).result().sequences[0]
    assert stopped.tokens == [first] and stopped.stop_reason == "stop", stopped
    # compute_logprobs equals the chat engine's prompt logprobs for the same checkpoint.
    got = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    assert got[0] is None and len(got) == len(TOKENS), got
    session, _, seq = tc.model_id.split(":")
    status, out, _ = ctx.server.api("POST", "/v1/completions", {
        "model": f"{ctx.entity}/tinker/{session}-train-{seq}", "prompt": TOKENS, "max_tokens": 1,
        "prompt_logprobs": 0, "temperature": 0})
    assert status == 200, out
    want = [next(iter(p.values()))["logprob"] for p in out["choices"][0]["prompt_logprobs"][1:]]
    assert max(abs(a - b) for a, b in zip(got[1:], want)) < 1e-4, (got, want)
    # prompt_logprobs_last_n: only the last N scored (the SDK checks the rest are None).
    last = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS), prompt_logprobs_last_n=2).result()
    assert last[:-2] == [None] * (len(TOKENS) - 2) and last[-2:] == got[-2:], (last, got)
    # save_weights_and_get_sampling_client: the current weights, sampled at once.
    current = tc.save_weights_and_get_sampling_client()
    current = current.result() if hasattr(current, "result") else current
    now = current.sample(prompt=prompt, num_samples=2,
                         sampling_params=types.SamplingParams(max_tokens=4, temperature=1.0, seed=2)).result()
    assert len(now.sequences) == 2 and all(len(s.logprobs) == len(s.tokens) for s in now.sequences), now
    # Greedy base-model sampling equals /v1/completions' greedy tokens.
    base = sc.create_sampling_client(base_model=BASE).result()
    greedy = base.sample(prompt=prompt, num_samples=1,
                         sampling_params=types.SamplingParams(max_tokens=6, temperature=0.0)).result().sequences[0]
    status, out, _ = ctx.server.api("POST", "/v1/completions", {
        "model": BASE, "prompt": TOKENS[:5], "max_tokens": 6, "temperature": 0, "return_token_ids": True})
    assert status == 200 and greedy.tokens == out["choices"][0]["token_ids"][:len(greedy.tokens)], (greedy, out)


def scores(ctx):
    """Top-k prompt and sample logprobs, target prompt logprobs (dense and sparse CSR) and
    alternative prompt tokens, each checked against what /v1/completions says of the same
    prompt on the same model."""
    base = ctx.sc.create_sampling_client(base_model=BASE).result()
    prompt = types.ModelInput.from_ints(TOKENS)
    n = len(TOKENS)
    status, out, _ = ctx.server.api("POST", "/v1/completions", {
        "model": BASE, "prompt": TOKENS, "max_tokens": 1, "prompt_logprobs": 3, "temperature": 0})
    assert status == 200, out
    # vLLM's shape: the prompt token and the top 3, each with its rank.
    want = [None] + [sorted(((int(t), e["logprob"]) for t, e in p.items() if e["rank"] <= 3),
                            key=lambda c: -c[1]) for p in out["choices"][0]["prompt_logprobs"][1:]]
    res = base.sample(prompt=prompt, num_samples=2, include_prompt_logprobs=True, topk_prompt_logprobs=3,
                      topk_sample_logprobs=2,
                      sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=4)).result()
    top = res.topk_prompt_logprobs
    assert len(top) == n and top[0] is None, top
    for got, exp in zip(top[1:], want[1:]):
        assert [t for t, _ in got] == [t for t, _ in exp][:3], (got, exp)
        assert max(abs(a - b) for (_, a), (_, b) in zip(got, exp)) < 1e-4, (got, exp)
    for i in range(1, n):
        assert res.prompt_logprobs[i] <= top[i][0][1] + 1e-6, (i, res.prompt_logprobs[i], top[i])
    for seq in res.sequences:
        rows = seq.topk_logprobs
        assert len(rows) == len(seq.tokens), (rows, seq.tokens)
        for tok, lp, row in zip(seq.tokens, seq.logprobs, rows):
            assert len(row) == 2 and row[0][1] >= row[1][1] and lp <= row[0][1] + 1e-6, (tok, lp, row)
            if tok in [t for t, _ in row]:
                assert abs(dict(row)[tok] - lp) < 1e-5, (tok, lp, row)
    # Targets, dense: column 0 names the prompt token (its prompt logprob comes back), column 1
    # the most likely token (its top-1 logprob), -1 in the first row's column 1 asks nothing.
    ids = [[TOKENS[i + 1], top[i + 1][0][0]] for i in range(n - 1)]
    ids[0][1] = -1
    dense = types.TensorData(data=[t for row in ids for t in row], dtype="int64", shape=[n - 1, 2])
    res = base.sample(prompt=prompt, num_samples=1, include_prompt_logprobs=True, target_prompt_logprobs=dense,
                      sampling_params=types.SamplingParams(max_tokens=1)).result()
    got = res.target_prompt_logprobs.tolist()
    assert res.target_prompt_logprobs.shape == [n - 1, 2], res.target_prompt_logprobs
    for i in range(n - 1):
        assert abs(got[i][0] - res.prompt_logprobs[i + 1]) < 1e-5, (i, got[i], res.prompt_logprobs)
        assert got[i][1] == 0.0 if i == 0 else abs(got[i][1] - top[i + 1][0][1]) < 1e-4, (i, got[i], top[i + 1])
    # Sparse CSR: only the listed cells, answered in the same layout.
    sparse = types.TensorData(data=[TOKENS[2], TOKENS[-1]], dtype="int64", shape=[n - 1, 1],
                              sparse_crow_indices=[0, 0, 1] + [1] * (n - 4) + [2], sparse_col_indices=[0, 0])
    res2 = base.sample(prompt=prompt, num_samples=1, target_prompt_logprobs=sparse,
                       sampling_params=types.SamplingParams(max_tokens=1)).result()
    t = res2.target_prompt_logprobs
    assert t.sparse_crow_indices == sparse.sparse_crow_indices and t.sparse_col_indices == [0, 0], t
    assert max(abs(a - b) for a, b in zip(t.data, [res.prompt_logprobs[2], res.prompt_logprobs[-1]])) < 1e-5, t
    # Alternative tokens: greedy draws are the top-1 token at every position; tempered draws come
    # with their raw logprobs.
    res = base.sample(prompt=prompt, num_samples=1, prompt_alt_tokens_k=4,
                      sampling_params=types.SamplingParams(max_tokens=1, temperature=0.0)).result()
    alt = res.prompt_alt_tokens
    assert alt.tokens.shape == [n - 1, 4] and alt.logprobs.shape == [n - 1, 4], alt
    assert alt.tokens.tolist() == [[top[i + 1][0][0]] * 4 for i in range(n - 1)], alt.tokens.tolist()
    warm = base.sample(prompt=prompt, num_samples=1, prompt_alt_tokens_k=3,
                       sampling_params=types.SamplingParams(max_tokens=1, temperature=1.0, seed=9)).result()
    lps = warm.prompt_alt_tokens.logprobs.tolist()
    assert all(len(r) == 3 and all(lp <= 0 for lp in r) for r in lps), lps
    again = base.sample(prompt=prompt, num_samples=1, prompt_alt_tokens_k=3,
                        sampling_params=types.SamplingParams(max_tokens=1, temperature=1.0, seed=9)).result()
    assert again.prompt_alt_tokens.tokens.tolist() == warm.prompt_alt_tokens.tokens.tolist(), "seeded draws repeat"
    # Refused with the field's name: an id outside the vocabulary, the wrong number of rows, k > 20.
    for kwargs, word in [
        ({"target_prompt_logprobs": types.TensorData(data=[10**6] * (n - 1), dtype="int64", shape=[n - 1, 1])},
         "out of vocabulary"),
        ({"target_prompt_logprobs": types.TensorData(data=[1, 2], dtype="int64", shape=[2, 1])}, "rows"),
        ({"topk_sample_logprobs": 21}, "topk_sample_logprobs"),
    ]:
        try:
            base.sample(prompt=prompt, num_samples=1, sampling_params=types.SamplingParams(max_tokens=1),
                        **kwargs).result()
            raise AssertionError(f"{kwargs} was answered")
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001 (the SDK's error type for a 400 varies by layer)
            assert word in str(e), (kwargs, e)


def saved_state(ctx):
    tc, sc = ctx.tc, ctx.sc
    d = datum(weights=1.0)
    saved = tc.save_state("mid").result()
    assert saved.path == f"tinker://{tc.model_id}/weights/mid", saved.path
    ctx.state_path = saved.path
    restored = sc.create_training_client_from_state_with_optimizer(saved.path).result()
    fresh = ctx.fresh = sc.create_training_client_from_state(saved.path).result()
    assert restored.get_info().lora_rank == 8
    clients = (tc, restored, fresh)
    before = [logprobs(c.forward([d], "cross_entropy").result()) for c in clients]
    assert before[0] == before[1] == before[2], before
    for c in clients:
        c.forward_backward([d], "cross_entropy").result()
        c.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = [c.forward([d], "cross_entropy").result().metrics["loss:sum"] for c in clients]
    assert after[0] == after[1], f"the restored optimizer continued differently: {after}"
    assert abs(after[0] - after[2]) > 1e-4, f"fresh moments took the same step: {after}"
    # The RestClient lists the run's checkpoints and deletes one by its tinker path.
    rest = sc.create_rest_client()
    listed = rest.list_checkpoints(tc.model_id).result().checkpoints
    paths = {c.tinker_path: c.checkpoint_type for c in listed}
    assert paths.get(saved.path) == "training" and paths.get(f"tinker://{tc.model_id}/sampler_weights/after-sft") == "sampler", paths
    rest.save = tc.save_state("scratch").result().path
    rest.delete_checkpoint_from_tinker_path(rest.save).result()
    after_delete = {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
    assert rest.save not in after_delete and saved.path in after_delete, after_delete


def rest_runs(ctx):
    rest = tinker.RestClient(base_url=ctx.server.url, api_key=f"tml-{KEY}")
    runs = rest.list_training_runs(limit=50).result()
    mine = {r.training_run_id: r for r in runs.training_runs}
    run = mine[ctx.tc.model_id]
    assert run.base_model == BASE and run.is_lora and run.lora_rank == 8, run
    assert run.last_checkpoint is not None and run.last_sampler_checkpoint is not None, run
    assert runs.cursor.total_count >= len(runs.training_runs) >= 1, runs.cursor
    one = rest.get_training_run_by_tinker_path(ctx.state_path).result()
    assert one.training_run_id == ctx.tc.model_id, one
    everything = {c.tinker_path for c in rest.list_user_checkpoints().result().checkpoints}
    assert ctx.state_path in everything, everything
    info = rest.get_weights_info_by_tinker_path(ctx.state_path).result()
    assert info.base_model == BASE and info.lora_rank == 8, info
    # A page that is not a number is a 422 naming the field, in FastAPI's shape.
    status, reply, _ = ctx.server.api("GET", "/api/v1/training_runs?limit=abc", headers={"X-API-Key": f"tml-{KEY}"})
    assert status == 422 and reply["detail"][0]["loc"] == ["query", "limit"], (status, reply)
    # Another entity sees none of it.
    other = tinker.RestClient(base_url=ctx.server.url, api_key=f"tml-{ctx.server.new_key('runs-other')}")
    assert not [r for r in other.list_training_runs().result().training_runs if r.training_run_id == ctx.tc.model_id]
    try:
        other.get_training_run(ctx.tc.model_id).result()
    except tinker.NotFoundError:
        pass
    else:
        raise AssertionError("another entity read the run")


def pipelined(ctx):
    tc = ctx.tc
    d = datum(weights=1.0)
    # Submitted back to back; the server runs them strictly in seq_id order.
    futures = [tc.forward_backward([d], "cross_entropy"), tc.optim_step(types.AdamParams(learning_rate=1e-3)),
               tc.forward([d], "cross_entropy")]
    first, _, after = (f.result() for f in futures)
    assert after.metrics["loss:sum"] < first.metrics["loss:sum"], (first.metrics, after.metrics)
    # A call waiting its turn behind running work longer than the server's gap wait is not timed
    # out (only a seq_id never received is): a batch of distinct 400-token datums, then its
    # optim_step submitted at once behind it.
    started = time.monotonic()
    big = [datum(tokens=[100 + (i * 7 + k * 131) % 20000 for i in range(400)], weights=1.0) for k in range(8)]
    slow, behind = tc.forward_backward(big, "cross_entropy"), tc.optim_step(types.AdamParams(learning_rate=1e-4))
    slow.result()
    behind.result()
    waited = time.monotonic() - started
    assert waited > GAP_SECONDS, f"the batch took {waited:.1f} s: make it longer than the gap wait"


def bad_input(ctx):
    tc = ctx.tc
    n = len(TOKENS) - 1
    cases = [
        (lambda: tc.forward_backward([datum(logprobs=0.0, advantages=[float("nan")] * n)], "ppo"), "nan"),
        (lambda: tc.forward_backward([datum(weights=1.0)], "kto"), "not served"),
        (lambda: tc.forward_backward([datum(weights=1.0)], "custom"), "forward_backward_custom"),
        (lambda: tc.forward_backward([datum(tokens=[1, 2, 10 ** 6], weights=1.0)], "cross_entropy"),
         "outside the vocabulary"),
        # Wrong dtype, shape and length, as a client's own tensors can be.
        (lambda: tc.forward_backward([types.Datum(
            model_input=types.ModelInput.from_ints(TOKENS[:-1]),
            loss_fn_inputs={"target_tokens": types.TensorData(data=[float(t) for t in TOKENS[1:]], dtype="float32"),
                            "weights": [1.0] * n})], "cross_entropy"), "not an integer type"),
        (lambda: tc.forward_backward([types.Datum(
            model_input=types.ModelInput.from_ints(TOKENS[:-1]),
            loss_fn_inputs={"target_tokens": TOKENS[1:],
                            "weights": types.TensorData(data=[1.0] * n, dtype="float32", shape=[1, n])})],
            "cross_entropy"), "only 1-d tensors"),
        (lambda: tc.forward_backward([datum(weights=[1.0] * (n - 1))], "cross_entropy"), f"{n - 1} values for {n}"),
        # A batch over the tokens one call may train (--max-job-tokens, MAX_CALL_TOKENS here).
        (lambda: tc.forward_backward([datum(tokens=[100 + (i * 7 + k * 131) % 20000 for i in range(400)], weights=1.0)
                                      for k in range(MAX_CALL_TOKENS // 400 + 1)], "cross_entropy"),
         "more than one call may train"),
    ]
    for call, want in cases:
        try:
            call().result()
        except tinker.RequestFailedError as e:
            assert want in str(e).lower(), e
            assert e.category == types.RequestErrorCategory.User, e.category
        else:
            raise AssertionError(f"accepted a call that should fail with {want!r}")
    # The model goes on.
    before = tc.forward([datum(weights=1.0)], "cross_entropy").result().metrics["loss:sum"]
    # Another client sends an optim_step under a seq_id this model already ran (it gets that
    # call's future; nothing runs again) and one far ahead (it waits for a gap never filled, then
    # fails alone): neither moves the weights, and the SDK's own calls go on in order.
    futures = []
    for seq_id in (1, 10 ** 6):
        status, reply, _ = ctx.server.api("POST", "/api/v1/optim_step", {
            "model_id": tc.model_id, "seq_id": seq_id, "adam_params": {"learning_rate": 1.0}}, key=KEY)
        assert status == 200 and reply.get("request_id"), (seq_id, status, reply)
        futures.append(reply["request_id"])
    after = tc.forward([datum(weights=1.0)], "cross_entropy").result().metrics["loss:sum"]
    assert after == before, (before, after)
    # The far one fails once the server's gap wait (--tinker-seq-gap-seconds, GAP_SECONDS here)
    # is over, as a user error naming the seq_id it waited for; the SDK's calls that waited
    # their turn behind running work meanwhile were never timed out.
    started = time.monotonic()
    while True:
        status, reply, _ = ctx.server.api("POST", "/api/v1/retrieve_future", {"request_id": futures[1]}, key=KEY)
        if reply.get("type") != "try_again":
            break
        assert time.monotonic() - started < GAP_SECONDS + 60, reply
    assert status == 200 and reply.get("category") == "user", (status, reply)
    assert f"seq_id {10 ** 6} waited" in reply["error"] and "never came" in reply["error"], reply
    assert tc.forward([datum(weights=1.0)], "cross_entropy").result().metrics["loss:sum"] == before


def other_entity(ctx):
    other = ctx.server.new_key("someone-else")
    model_id = ctx.tc.model_id
    for path, body in (("/api/v1/get_info", {"model_id": model_id}),
                       ("/api/v1/optim_step", {"model_id": model_id, "seq_id": 1000,
                                               "adam_params": {"learning_rate": 1.0}})):
        status, reply, _ = ctx.server.api("POST", path, body, key=f"tml-{other}")
        assert status == 404 and reply == {"detail": "model not found"}, (path, status, reply)
    # Nor can it load the owner's saved state.
    status, reply, _ = ctx.server.api("POST", "/api/v1/load_weights", {
        "session_id": "x", "model_seq_id": 0, "path": ctx.state_path, "optimizer": True}, key=f"tml-{other}")
    assert status == 404 and reply == {"detail": "saved state not found"}, (status, reply)
    # The owner's key in any accepted form reaches it.
    status, reply, _ = ctx.server.api("POST", "/api/v1/get_info", {"model_id": model_id}, key=KEY)
    assert status == 200 and reply["lora_rank"] == 8, (status, reply)


def tokenizer(ctx):
    tok = ctx.tc.get_tokenizer()
    text = "Hello, world!  Numbers 7 12345 and accents: déjà vu, 漢字 🙂<|im_end|> end"
    status, out, _ = ctx.server.api("POST", "/tokenize", {"model": BASE, "prompt": text, "add_special_tokens": False})
    assert status == 200, out
    assert tok.encode(text, add_special_tokens=False) == out["tokens"], (tok.encode(text, add_special_tokens=False), out)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    rendered = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    status, out, _ = ctx.server.api("POST", "/tokenize", {"model": BASE, "messages": msgs, "add_generation_prompt": True})
    assert status == 200 and rendered == out["tokens"], (rendered, out)


def session_end(ctx):
    with service(ctx.server) as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4).result()
        tc.forward([datum(weights=1.0)], "cross_entropy").result()
        first = tc.save_weights_for_sampler("kept").result().path
        tc.forward_backward([datum(weights=1.0)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        path = tc.save_weights_for_sampler("kept").result().path
        model_id = tc.model_id
    assert first == path, (first, path)
    # Saving over the name deleted the checkpoint it named: one checkpoint is left.
    record = record_of(ctx, model_id)
    status, cps, _ = ctx.server.api("GET", f"/v1/preview/models/{record['id']}/checkpoints")
    assert status == 200 and [c["step"] for c in cps["data"]] == [2], cps
    # The session is over and its model released; the named sampler weights stay, the owner's only.
    other = service(ctx.server, ctx.server.new_key("late-other"))
    for attempt in (lambda: other.create_sampling_client(model_path=path).result(),
                    lambda: other.create_rest_client().get_weights_info_by_tinker_path(path).result(),
                    lambda: other.create_rest_client().delete_checkpoint_from_tinker_path(path).result()):
        try:
            attempt()
        except Exception as e:
            assert "not found" in str(e).lower() or "404" in str(e), e
        else:
            raise AssertionError("another entity reached the saved sampler weights")
    sc = service(ctx.server)
    sampler = sc.create_sampling_client(model_path=path).result()
    out = sampler.sample(prompt=types.ModelInput.from_ints(TOKENS[:5]), num_samples=1,
                         sampling_params=types.SamplingParams(max_tokens=3, temperature=0.0)).result()
    assert len(out.sequences[0].tokens) >= 1, out
    rest = sc.create_rest_client()
    listed = {c.tinker_path: c.checkpoint_type for c in rest.list_checkpoints(model_id).result().checkpoints}
    assert listed.get(path) == "sampler", listed
    rest.delete_checkpoint_from_tinker_path(path).result()
    assert path not in {c.tinker_path for c in rest.list_checkpoints(model_id).result().checkpoints}
    try:
        sc.create_sampling_client(model_path=path).result()
    except Exception as e:  # the SDK raises the 404 as it gets it
        assert "not found" in str(e).lower(), e
    else:
        raise AssertionError("deleted sampler weights still made a sampling client")


def load_state(ctx):
    tc, sc = ctx.tc, ctx.sc
    d = datum(weights=1.0)
    saved = tc.save_state("to-load").result().path
    want = logprobs(tc.forward([d], "cross_entropy").result())
    other = ctx.fresh  # saved_state's model (an entity holds at most four)
    assert logprobs(other.forward([d], "cross_entropy").result()) != want
    other.load_state_with_optimizer(saved).result()
    assert logprobs(other.forward([d], "cross_entropy").result()) == want
    # Both continue identically from there: the moments came along.
    for c in (tc, other):
        c.forward_backward([d], "cross_entropy").result()
        c.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    a, b = (c.forward([d], "cross_entropy").result().metrics["loss:sum"] for c in (tc, other))
    assert a == b, (a, b)
    other.load_state(saved).result()
    assert logprobs(other.forward([d], "cross_entropy").result()) == want
    # A state of another rank is refused by name (the path is the owner's: a model of the same
    # entity, under a second session so the entity's four places hold).
    with service(ctx.server) as sc2:
        small = sc2.create_lora_training_client(base_model=BASE, rank=4).result()
        try:
            small.load_state(saved).result()
        except tinker.RequestFailedError as e:
            assert "rank 8" in str(e), e
        else:
            raise AssertionError("a rank-8 state loaded into a rank-4 model")


def curves(ctx):
    record = record_of(ctx, ctx.tc.model_id)
    status, history, _ = ctx.server.api("GET", f"/v1/preview/models/{record['id']}/history")
    assert status == 200, history
    series = {s["key"]: s for s in history["series"]}
    for key in ("train/loss", "train/loss_per_token", "train/grad_norm", "train/learning_rate", "train/trained_tokens"):
        assert key in series, sorted(series)
    # sft_loop's five steps lowered the loss, and every optim_step with gradients left a point.
    loss = [p["value"] for p in series["train/loss"]["points"]]
    assert series["train/loss"]["total"] >= 5 and loss[4] < loss[0], series["train/loss"]


def hub_tokenizer(ctx):
    sampler = ctx.sc.create_sampling_client(base_model=BASE).result()
    tok = sampler.get_tokenizer()
    text = "Hello, world!  Numbers 7 12345 and accents: déjà vu"
    status, out, _ = ctx.server.api("POST", "/tokenize", {"model": BASE, "prompt": text, "add_special_tokens": False})
    assert status == 200 and tok.encode(text, add_special_tokens=False) == out["tokens"], out
    for layout, want in (("dir", "HuggingFaceTB--SmolLM2-135M-Instruct/tokenizer.json"),
                         ("hub", "models--HuggingFaceTB--SmolLM2-135M-Instruct/refs/main")):
        status, raw, headers = ctx.server.api("GET", f"/v1/tokenizer?model={BASE}&layout={layout}")
        assert status == 200 and headers["content-type"] == "application/x-tar", (status, raw)
        names = tarfile.open(fileobj=io.BytesIO(raw)).getnames()
        assert want in names, names
    # The hub layout is the cache the server wrote (the same revision).
    with open(os.path.join(DATA, "hf-hub", "models--HuggingFaceTB--SmolLM2-135M-Instruct", "refs", "main")) as f:
        revision = f.read()
    assert any(n.endswith(f"snapshots/{revision}/tokenizer.json") for n in names), (revision, names)
    status, reply, _ = ctx.server.api("GET", "/v1/tokenizer?model=no-such-model")
    assert status == 404, (status, reply)
    status, reply, _ = ctx.server.api("GET", "/v1/tokenizer")
    assert status == 400 and reply["error"]["param"] == "model", (status, reply)


def inflight(ctx):
    """kind="inflight" (the SDK's SamplingClientKind): an inflight sampling client follows the
    model's newest inflight save, a snapshot client keeps the weights it was made with, and an
    unknown kind is refused."""
    with service(ctx.server) as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=11).result()
        prompt = types.ModelInput.from_ints(TOKENS)

        def scores(client):
            return client.compute_logprobs(prompt).result()[1:]

        follower = tc.save_weights_and_get_sampling_client(kind="inflight").result()
        snapshot = tc.save_weights_and_get_sampling_client().result()
        first = scores(follower)
        assert first == scores(snapshot), "both sample the same weights at first"
        tc.forward_backward([datum(weights=1.0)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        newer = tc.save_weights_and_get_sampling_client(kind="inflight").result()
        moved = scores(follower)
        assert moved == scores(newer), "the earlier inflight client follows the newest inflight save"
        assert moved != first, "training moved the weights"
        assert scores(snapshot) == first, "a snapshot client keeps its weights"
        # Refused as the caller's mistake in its own future (its seq_id is spent either way).
        status, reply, _ = ctx.server.api("POST", "/api/v1/save_weights_for_sampler", {
            "model_id": tc.model_id, "seq_id": 99, "sampling_session_seq_id": 99, "kind": "rolling"},
            key=f"tml-{KEY}")
        assert status == 200, (status, reply)
        status, reply, _ = ctx.server.api("POST", "/api/v1/retrieve_future", {"request_id": reply["request_id"]},
                                          key=f"tml-{KEY}")
        assert reply.get("category") == "user" and "inflight" in reply["error"], (status, reply)


def catalog(server, model_id):
    """The Tinker catalog's rows of a run, read from the server's SQLite database: KIND/NAME -> row."""
    with sqlite3.connect(os.path.join(server.data, "tandem.db")) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT * FROM tinker_checkpoints WHERE model_id = ?", (model_id,)).fetchall()
    return {f"{r['kind']}/{r['name']}": dict(r) for r in rows}


def blob_dir(server, blob):
    """A catalog entry's files' directory in the server's checkpoint store."""
    return os.path.join(server.data, "checkpoints", blob)


def expiry(ctx):
    """ttl_seconds on each kind of save and set_checkpoint_ttl: listed as expires_at, removable, a
    TTL outside Tinker's bounds refused, another entity's 404; then, with the run's expiry times
    moved into the past (an hour going by), the restarted server's sweep deletes exactly those,
    the sampler weights' checkpoint with them, and keeps the state saved without a TTL. It
    restarts the server, so it runs last."""
    import datetime
    import json
    import time
    now = datetime.datetime.now(datetime.timezone.utc)
    with service(ctx.server) as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=9).result()
        tc.forward_backward([datum(weights=1.0)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        rolling = tc.save_state("rolling", ttl_seconds=7200).result().path
        kept = tc.save_state("final").result().path
        periodic = tc.save_weights_for_sampler("periodic", ttl_seconds=604800).result().path
        export = tc.save_weights_external("export", ttl_seconds=3600).result().path
        model_id = tc.model_id
        rest = sc.create_rest_client()
        # An ephemeral save given a TTL later is kept past its session, so the sweep finds it.
        tc.save_weights_and_get_sampling_client().result()
        ephemeral = next(p for p in (c.tinker_path for c in rest.list_checkpoints(model_id).result().checkpoints)
                         if "/sampler_weights/sampler-" in p)
        rest.set_checkpoint_ttl_from_tinker_path(ephemeral, 3600).result()
        # Saving over a name writes fresh files and then drops the old ones: the catalog's row
        # names the new directory, the old one is gone.
        before = catalog(ctx.server, model_id)
        tc.forward_backward([datum(weights=1.0)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        tc.save_state("rolling", ttl_seconds=7200).result()
        after = catalog(ctx.server, model_id)
        old_dir, new_dir = before["weights/rolling"]["blob"], after["weights/rolling"]["blob"]
        assert old_dir != new_dir and not os.path.exists(blob_dir(ctx.server, old_dir)), (old_dir, new_dir)
        assert os.path.exists(os.path.join(blob_dir(ctx.server, new_dir), "state.safetensors"))

        def listed():
            return {c.tinker_path: c for c in rest.list_checkpoints(model_id).result().checkpoints}

        cps = listed()
        for path, ttl in ((rolling, 7200), (periodic, 604800), (export, 3600)):
            assert cps[path].expires_at is not None, cps[path]
            assert abs((cps[path].expires_at - now).total_seconds() - ttl) < 120, (path, cps[path].expires_at)
        assert cps[kept].expires_at is None and cps[export].checkpoint_type == "external", cps
        rest.set_checkpoint_ttl_from_tinker_path(kept, 3600).result()
        assert listed()[kept].expires_at is not None
        rest.set_checkpoint_ttl_from_tinker_path(kept, None).result()
        assert listed()[kept].expires_at is None
        ttl_route = f"/api/v1/training_runs/{model_id}/checkpoints/weights/final/ttl"
        status, reply, _ = ctx.server.api("PUT", ttl_route, {"ttl_seconds": 60}, key=KEY)
        assert status == 422 and "ttl_seconds 60" in json.dumps(reply), (status, reply)
        other = f"tml-{ctx.server.new_key('ttl-other')}"
        status, reply, _ = ctx.server.api("PUT", ttl_route, {"ttl_seconds": 3600}, key=other)
        assert status == 404, (status, reply)
    record = record_of(ctx, model_id)["id"]
    status, before, _ = ctx.server.api("GET", f"/v1/preview/models/{record}/checkpoints")
    assert status == 200 and len(before["data"]) == 2, before
    # An hour goes by: the run's expiry times move into the past while the server is down.
    ctx.server.kill9()
    rows = catalog(ctx.server, model_id)
    ephemeral_name = "sampler_weights/" + ephemeral.rsplit("/", 1)[1]
    expiring = sorted(c for c, r in rows.items() if r["expires_at"] is not None)
    assert expiring == sorted(["external_weights/export", "sampler_weights/periodic", "weights/rolling",
                               ephemeral_name]), rows
    with sqlite3.connect(os.path.join(ctx.server.data, "tandem.db")) as db:
        db.execute("UPDATE tinker_checkpoints SET expires_at = ? WHERE model_id = ? AND expires_at IS NOT NULL",
                   (int(time.time() * 1000) - 1000, model_id))
    server = ctx.server.restart()
    try:
        rest = service(server).create_rest_client()
        deadline = time.monotonic() + 60
        while True:
            left = {c.tinker_path for c in rest.list_checkpoints(model_id).result().checkpoints}
            if left == {kept} or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert left == {kept}, left
        status, after, _ = server.api("GET", f"/v1/preview/models/{record}/checkpoints")
        assert status == 200 and after["data"] == [], after
        assert list(catalog(server, model_id)) == ["weights/final"], catalog(server, model_id)
        for c in ("weights/rolling", "external_weights/export"):
            assert not os.path.exists(blob_dir(server, rows[c]["blob"])), f"{c}'s files stayed"
    finally:
        server.stop()


def publish(ctx):
    """publish_checkpoint_from_tinker_path: another entity reaches a published state (weights_info,
    create_training_client_from_state: the same weights) and published sampler weights (a sampling
    client with the owner's scores), never the run's listing or deletes; publishing again is no
    error; after unpublish (also for a client made while public) and after saving over a published
    name, the paths are a 404 to others again; external weights are not published."""
    prompt = types.ModelInput.from_ints(TOKENS)
    d = datum(weights=1.0)

    def refused(call, what):
        try:
            call()
        except Exception as e:  # the SDK raises the 404 as it gets it
            assert "not found" in str(e).lower() or "404" in str(e), (what, e)
        else:
            raise AssertionError(what)

    with service(ctx.server) as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
        tc.forward_backward([d], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        state = tc.save_state("shared").result().path
        sampled = tc.save_weights_for_sampler("shared").result().path
        want = logprobs(tc.forward([d], "cross_entropy").result())
        want_scores = sc.create_sampling_client(model_path=sampled).result().compute_logprobs(prompt).result()
        rest = sc.create_rest_client()
        other = service(ctx.server, ctx.server.new_key("publish-other"))
        theirs = other.create_rest_client()
        for path in (state, sampled):
            refused(lambda: theirs.get_weights_info_by_tinker_path(path).result(), f"{path} read before publishing")
            refused(lambda: theirs.publish_checkpoint_from_tinker_path(path).result(), "another entity published")
        for path in (state, sampled):
            rest.publish_checkpoint_from_tinker_path(path).result()
        rest.publish_checkpoint_from_tinker_path(state).result()  # already public: no error
        listed = {c.tinker_path: c.public for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
        assert listed[state] is True and listed[sampled] is True, listed
        assert theirs.get_weights_info_by_tinker_path(state).result().lora_rank == 4
        assert theirs.get_weights_info_by_tinker_path(sampled).result().base_model == BASE
        client = other.create_sampling_client(model_path=sampled).result()
        assert client.compute_logprobs(prompt).result() == want_scores
        copy = other.create_training_client_from_state(state).result()
        assert logprobs(copy.forward([d], "cross_entropy").result()) == want
        refused(lambda: theirs.list_checkpoints(tc.model_id).result(), "another entity listed the run")
        refused(lambda: theirs.delete_checkpoint_from_tinker_path(state).result(), "another entity deleted")
        rest.unpublish_checkpoint_from_tinker_path(sampled).result()
        rest.unpublish_checkpoint_from_tinker_path(sampled).result()  # already private: no error
        refused(lambda: client.compute_logprobs(prompt).result(), "a client kept sampling unpublished weights")
        refused(lambda: other.create_sampling_client(model_path=sampled).result(), "unpublished weights sampled")
        # New weights under a published name are not what was published.
        tc.save_state("shared").result()
        refused(lambda: theirs.get_weights_info_by_tinker_path(state).result(), "a state saved over stayed public")
        listed = {c.tinker_path: c.public for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
        assert listed[state] is False and listed[sampled] is False, listed
        route = f"/api/v1/training_runs/{tc.model_id}/checkpoints/external_weights/any/publish"
        status, reply, _ = ctx.server.api("POST", route, {}, key=f"tml-{KEY}")
        assert status in (400, 422) and "external" in str(reply), (status, reply)


# The server's wait for a seq_id gap to fill (10 minutes by default): short here, so that the
# bad-input check sees a gap never filled fail, and `pipelined` a call that waits longer than it
# behind running work still run.
GAP_SECONDS = 3
# Tokens one forward_backward may hold (--max-job-tokens; 1,048,576 by default): small here, so
# that bad-input's huge batch is cheap to build.
MAX_CALL_TOKENS = 4096

# Sessions whose client stopped beating end this long after (the SDK beats every 10 s).
HEARTBEAT_SECONDS = 25
# Requests one entity may have in flight on the engine (--per-entity-limit): small here, so that
# sample_burst's compute_logprobs go past it.
PER_ENTITY = 16
tinker_probes.GAP_SECONDS = GAP_SECONDS
tinker_probes.HEARTBEAT_SECONDS = HEARTBEAT_SECONDS

CHECKS = [sft_loop, modules, curves, sampler_weights, sampling, scores, download, saved_state, rest_runs, load_state, rl_losses, pipelined, bad_input,
          other_entity, tokenizer, hub_tokenizer, session_end, inflight, publish, *tinker_probes.CHECKS, expiry]


def main():
    binary, model = sys.argv[1], sys.argv[2]
    return run_checks("tinker", CHECKS, binary, model, KEY, Ctx, data=DATA,
                      extra=("--tinker-seq-gap-seconds", str(GAP_SECONDS), "--max-job-tokens", str(MAX_CALL_TOKENS),
                             "--tinker-heartbeat-seconds", str(HEARTBEAT_SECONDS),
                             "--per-entity-limit", str(PER_ENTITY),
                             # The probes' models beside the suite's (the default is 8).
                             "--max-tinker-models", "12"))


if __name__ == "__main__":
    finish(main())
