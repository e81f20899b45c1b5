"""Issue 50's probes of the Tinker API as regression checks (test_tinker.py runs them): each failed
on the code before the issue.

  seq-ids           a refused call (save_state with a TTL under Tinker's bound) fails alone and the
                    next call runs; a call past a gap fails after the gap wait, the missing call then
                    arriving is answered as given up (not run), the next call runs at once, and a
                    retry of the failed call gets its future; a seq_id forged far ahead takes nobody's
                    place
  crossed-clips     ppo and cispo with per-token clip thresholds that cross fail as the user's
                    mistake (they had panicked), and the model goes on
  reused-step       another entity's sampling client of published sampler weights is a 404 once the
                    checkpoint was deleted through /v1/preview, even when a private save reuses its step
  model-cap         16 concurrent create_model calls of one entity leave it 4 models; another entity
                    still gets one
  bounded-results   a failed call's error keeps a bounded excerpt of a 10 MB config key; a protobuf
                    body of millions of empty datums is refused before it is decoded
  cookbook-losses   stable_reinforce, gspo and dro run; targets that are not the next input token
                    (rl_loop's token 0 at prompt positions) are scored as named
  sample-burst      160 compute_logprobs at once (past the entity's concurrency limit) all succeed
  heartbeats        a session whose client stopped beating is ended after --tinker-heartbeat-seconds,
                    its model released
  storage-quota     (issue 53) an entity given 1 MiB by `tandem quota set`: save_state and
                    save_weights_for_sampler fail as the user's (not retried), nothing is listed,
                    the model trains on; with `--unlimited` both saves succeed
"""

import concurrent.futures
import math
import subprocess
import time

import tinker
from tinker import types

from tinker_common import BASE, KEY, TOKENS, datum, logprobs, service

# Set by test_tinker.py for its server.
GAP_SECONDS = 3
HEARTBEAT_SECONDS = 25


def _raw(ctx, path, body, key=KEY):
    return ctx.server.api("POST", path, body, key=f"tml-{key}")


def _result(ctx, request_id, key=KEY, limit=120):
    """A future's outcome through retrieve_future, polling past try_again."""
    started = time.monotonic()
    while True:
        status, reply, _ = _raw(ctx, "/api/v1/retrieve_future", {"request_id": request_id}, key)
        assert status == 200, (status, reply)
        if reply.get("type") != "try_again":
            return reply
        assert time.monotonic() - started < limit, reply


def _raw_model(ctx, key=KEY, rank=4):
    """A session and a model driven by raw requests (their seq_ids are the test's own)."""
    status, session, _ = _raw(ctx, "/api/v1/create_session", {"tags": [], "sdk_version": "raw"}, key)
    assert status == 200, session
    sid = session["session_id"]
    status, reply, _ = _raw(ctx, "/api/v1/create_model", {
        "session_id": sid, "model_seq_id": 0, "base_model": BASE, "lora_config": {"rank": rank}}, key)
    assert status == 200, reply
    assert _result(ctx, reply["request_id"], key).get("model_id") == reply["model_id"]
    return sid, reply["model_id"]


def _step(ctx, model_id, seq_id, key=KEY):
    status, reply, _ = _raw(ctx, "/api/v1/optim_step", {
        "model_id": model_id, "seq_id": seq_id, "adam_params": {"learning_rate": 1e-4}}, key)
    assert status == 200 and reply.get("request_id"), (seq_id, status, reply)
    return reply["request_id"]


def _finish(ctx, sid, key=KEY):
    status, reply, _ = _raw(ctx, f"/api/v1/sessions/{sid}/finish", {}, key)
    assert status == 200, reply


def seq_ids(ctx):
    tc = ctx.tc
    d = datum(weights=1.0)
    # The SDK spends the seq_id before the server sees the TTL; the refusal takes it.
    try:
        tc.save_state("rolling", ttl_seconds=60).result()
    except tinker.RequestFailedError as e:
        assert "ttl_seconds 60" in str(e), e
        assert e.category == types.RequestErrorCategory.User, e.category
    else:
        raise AssertionError("a TTL under an hour was accepted")
    tc.forward([d], "cross_entropy").result()

    sid, model_id = _raw_model(ctx)
    try:
        second = _step(ctx, model_id, 2)
        failed = _result(ctx, second)
        assert failed.get("category") == "user" and "seq_id 1" in failed["error"], failed
        late = _result(ctx, _step(ctx, model_id, 1))
        assert late.get("category") == "user" and "not run" in late["error"], late
        started = time.monotonic()
        ok = _result(ctx, _step(ctx, model_id, 3))
        assert "metrics" in ok, ok
        assert time.monotonic() - started < GAP_SECONDS, "call 3 waited for a gap"
        assert _step(ctx, model_id, 2) == second, "a retry gets the first call's future"
        # Forged far ahead: it fails alone after the wait, and 4 still runs.
        far = _step(ctx, model_id, 10 ** 6)
        assert "metrics" in _result(ctx, _step(ctx, model_id, 4))
        assert "never came" in _result(ctx, far)["error"]
        assert "metrics" in _result(ctx, _step(ctx, model_id, 5))
    finally:
        _finish(ctx, sid)


def crossed_clips(ctx):
    tc = ctx.tc
    n = len(TOKENS) - 1
    sampled = logprobs(tc.forward([datum(weights=0.0)], "cross_entropy").result())
    for loss in ("ppo", "cispo"):
        bad = datum(logprobs=sampled, advantages=1.0, clip_low_threshold=1.5, clip_high_threshold=0.5)
        try:
            tc.forward_backward([bad], loss).result()
        except tinker.RequestFailedError as e:
            assert "above the clip_high_threshold" in str(e), e
            assert e.category == types.RequestErrorCategory.User, e.category
        else:
            raise AssertionError(f"{loss} accepted crossed thresholds")
    good = datum(logprobs=sampled, advantages=[1.0] * n)
    assert math.isfinite(tc.forward_backward([good], "ppo").result().metrics["loss:sum"])
    tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()


def reused_step(ctx):
    prompt = types.ModelInput.from_ints(TOKENS)
    d = datum(weights=1.0)
    with service(ctx.server) as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=11).result()
        public = tc.save_weights_for_sampler("pub").result().path
        sc.create_rest_client().publish_checkpoint_from_tinker_path(public).result()
        other = service(ctx.server, ctx.server.new_key("reused-step-other"))
        client = other.create_sampling_client(model_path=public).result()
        before = client.compute_logprobs(prompt).result()
        # The owner deletes the checkpoint through /v1/preview, trains on and saves privately:
        # the new save takes the same step number.
        session, _, seq = tc.model_id.split(":")
        status, models, _ = ctx.server.api("GET", f"/v1/preview/models?search={session}-train-{seq}")
        record = next(m for m in models["data"] if m["name"] == f"{session}-train-{seq}")
        status, reply, _ = ctx.server.api("DELETE", f"/v1/preview/models/{record['id']}/checkpoints", {"steps": [1]})
        assert status == 200, reply
        tc.forward_backward([d], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        tc.save_weights_for_sampler("secret").result()
        status, cps, _ = ctx.server.api("GET", f"/v1/preview/models/{record['id']}/checkpoints")
        assert [c["step"] for c in cps["data"]] == [1], cps
        try:
            leaked = client.compute_logprobs(prompt).result()
        except Exception as e:  # the SDK raises the 404 as it gets it
            assert "not found" in str(e).lower() or "404" in str(e), e
        else:
            raise AssertionError(f"the old sampler served the private step: {leaked[:3]} (was {before[:3]})")


def model_cap(ctx):
    key = ctx.server.new_key("cap-racer")
    status, session, _ = _raw(ctx, "/api/v1/create_session", {"tags": []}, key)
    sid = session["session_id"]

    def create(seq):
        return _raw(ctx, "/api/v1/create_model", {
            "session_id": sid, "model_seq_id": seq, "base_model": BASE, "lora_config": {"rank": 1}}, key)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(create, range(16)))
    created = [r for s, r, _ in answers if s == 200]
    assert len(created) == 4 and all(s in (200, 429) for s, _, _ in answers), [(s, r) for s, r, _ in answers]
    for r in created:
        assert "model_id" in _result(ctx, r["request_id"], key), r
    # Another entity is not refused by the server-wide cap.
    other = ctx.server.new_key("cap-other")
    sid2, _ = _raw_model(ctx, other)
    _finish(ctx, sid, key)
    _finish(ctx, sid2, other)


def bounded_results(ctx):
    tc = ctx.tc
    huge = "k" * (10 << 20)
    try:
        tc.forward_backward([datum(weights=1.0)], "ppo", loss_fn_config={huge: 1.0}).result()
    except tinker.RequestFailedError as e:
        assert len(str(e)) < 4096, len(str(e))
    else:
        raise AssertionError("an unknown config key was accepted")
    # Four million empty datums (field 3, length 0) in 8 MB: refused before decoding.
    body = b"\x0a\x01m\x10\x63" + b"\x1a\x00" * (4 << 20)
    status, reply, _ = ctx.server.api("POST", "/api/v1/forward_backward", raw_body=body, key=f"tml-{KEY}",
                                      headers={"Content-Type": "application/x-protobuf"})
    assert status == 422 and "datums" in str(reply), (status, str(reply)[:300])
    tc.forward([datum(weights=1.0)], "cross_entropy").result()


def cookbook_losses(ctx):
    tc = ctx.tc
    n = len(TOKENS) - 1
    sampled = logprobs(tc.forward([datum(weights=0.0)], "cross_entropy").result())
    # rl_loop's layout: token 0, logprob 0 and advantage 0 at the prompt's positions.
    prompt = 5
    targets = [0] * prompt + TOKENS[prompt + 1:]
    inputs = {"target_tokens": targets, "logprobs": [0.0] * prompt + sampled[prompt:],
              "advantages": [0.0] * prompt + [1.0] * (n - prompt),
              "sequence_ratio_mask": [0.0] * prompt + [1.0] * (n - prompt)}
    rl = types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:-1]), loss_fn_inputs=inputs)
    # Token 0's logprob at position 0 is what the base scores after TOKENS[0].
    zero = types.Datum(model_input=types.ModelInput.from_ints(TOKENS[:1]),
                       loss_fn_inputs={"target_tokens": [0], "weights": [0.0]})
    want = logprobs(tc.forward([zero], "cross_entropy").result())[0]
    for loss, config in (("importance_sampling", None), ("stable_reinforce", {"kl_coeff": 0.01}), ("gspo", None),
                         ("dro", {"beta": 0.05})):
        out = tc.forward_backward([rl], loss, loss_fn_config=config).result()
        got = logprobs(out)
        assert abs(got[0] - want) < 1e-4, (loss, got[0], want)
        assert max(abs(a - b) for a, b in zip(got[prompt:], sampled[prompt:])) < 1e-4, loss
        assert math.isfinite(out.metrics["loss:sum"]), (loss, out.metrics)
    tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()


def sample_burst(ctx):
    sampler = ctx.sc.create_sampling_client(base_model=BASE).result()
    prompts = [types.ModelInput.from_ints(TOKENS[: 4 + i % 9]) for i in range(160)]
    futures = [sampler.compute_logprobs(p) for p in prompts]
    got = [f.result() for f in futures]
    assert all(len(g) == len(p.to_ints()) for g, p in zip(got, prompts)), [len(g) for g in got[:5]]


def heartbeats(ctx):
    key = ctx.server.new_key("stops-beating")
    sid, model_id = _raw_model(ctx, key)
    status, reply, _ = _raw(ctx, "/api/v1/session_heartbeat", {"session_id": sid}, key)
    assert status == 200, reply
    time.sleep(HEARTBEAT_SECONDS + 12)  # the grace, and the reaper's 10 s round
    status, reply, _ = _raw(ctx, "/api/v1/get_info", {"model_id": model_id}, key)
    assert status == 404, (status, reply)
    status, reply, _ = _raw(ctx, "/api/v1/session_heartbeat", {"session_id": sid}, key)
    assert status == 404, (status, reply)


def storage_quota(ctx):
    entity = "tinker-quota"
    key = ctx.server.new_key(entity)

    def quota(*args):
        subprocess.run([ctx.server.binary, "quota", "set", entity, *args, "--data-dir", ctx.server.data],
                       check=True, capture_output=True)

    quota("--mib", "1")
    d = datum(weights=1.0)
    with service(ctx.server, key) as sc:
        tc = sc.create_lora_training_client(base_model=BASE, rank=4, seed=5).result()
        tc.forward_backward([d], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
        for save in (lambda: tc.save_state("full"), lambda: tc.save_weights_for_sampler("full")):
            try:
                save().result()
            except tinker.RequestFailedError as e:
                assert "storage quota exceeded" in str(e), e
                assert e.category == types.RequestErrorCategory.User, e.category
            except Exception as e:  # noqa: BLE001 - a refusal of the HTTP call itself
                assert "storage quota exceeded" in str(e), e
            else:
                raise AssertionError("a save past the entity's quota was kept")
        rest = sc.create_rest_client()
        listed = rest.list_checkpoints(tc.model_id).result().checkpoints
        assert listed == [], listed
        tc.forward_backward([d], "cross_entropy").result()  # the model trains on
        quota("--unlimited")
        assert tc.save_state("full").result().path.endswith("/weights/full")
        assert tc.save_weights_for_sampler("full").result().path.endswith("/sampler_weights/full")
        quota("--default")


CHECKS = [seq_ids, crossed_clips, reused_step, model_cap, bounded_results, cookbook_losses, sample_burst, heartbeats,
          storage_quota]
