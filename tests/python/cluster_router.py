"""`vllm-router` (from PyPI, unchanged) in front of the cluster's three serving nodes: the `router`
check of test_cluster.py. Standard library and the OpenAI SDK only.

  fields    what the router adds to chat and completions bodies (captured by a recording worker
            behind a second router) is exactly the pinned version's list, and tandem answers a body
            with each added field, alone, as it answers the body without it (vLLM's meaning for its
            own fields; vLLM ignores SGLang's, and so does tandem)
  through   greedy chat (plain and streamed) and completions through the router equal the direct
            answers; a wrong key is still refused (the router passes the client's Authorization on
            these routes)
  sticky    multi-turn agent rollouts with `X-Session-ID` under `consistent_hash`: every turn of a
            session lands on one node (the nodes' request counters say which); other session
            ids reach other nodes (the header is what is hashed)
  affinity  first-token time of turns 2-4 of such rollouts under `consistent_hash` with the header,
            `cache_aware`, and `round_robin` (no affinity), with the nodes' prefix-cache hit rates:
            printed, not asserted (no timing assertions in tests)
"""

import http.client
import json
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tandem_server import free_port

# What vllm-router 0.1.17 adds to a body that leaves the field out (its request types' defaults;
# most are SGLang's, which vLLM ignores). Recorded here so a new router version that adds more
# fails this check and its fields get a test.
CHAT_ADDED = {"stream": False, "logprobs": False, "no_stop_trim": False, "ignore_eos": False,
              "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
              "stream_reasoning": True, "return_hidden_states": False, "include_reasoning": True}
COMPLETIONS_ADDED = {"stream": False, "echo": False, "no_stop_trim": False, "ignore_eos": False,
                     "skip_special_tokens": True, "return_hidden_states": False}
TURNS = 4


class Router:
    """`vllm-router` on a free port in front of `workers` with `policy`."""

    def __init__(self, binary, workers, policy):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", str(self.port), "--worker-urls", *workers,
             "--policy", policy, "--log-level", "warning", "--disable-retries",
             # Each router also serves its own metrics, by default on one fixed port.
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vllm-router ({policy}) did not become healthy")
            time.sleep(0.2)

    def post(self, path, body, key, headers=None):
        h = {"Content-Type": "application/json", "Authorization": f"Bearer {key}", **(headers or {})}
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST", headers=h)
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Recorder:
    """A worker that records each body it is sent and answers every request with a small JSON."""

    def __init__(self):
        self.bodies = {}
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                size = int(self.headers.get("content-length") or 0)
                if size:
                    recorder.bodies[self.path] = json.loads(self.rfile.read(size))
                out = b'{"object": "list", "data": []}'
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def added_fields(router_binary, key, chat, completions):
    """{route: the fields the router added to `chat` / `completions`, with their values}."""
    recorder = Recorder()
    router = Router(router_binary, [recorder.url], "round_robin")
    try:
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completions)):
            status, _ = router.post(path, body, key)
            assert status == 200, (path, status)
        return {path: {k: v for k, v in recorder.bodies[path].items() if k not in body}
                for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completions))}
    finally:
        router.stop()
        recorder.stop()


def answer(status, raw):
    """The parts of a greedy answer that must not change: texts, token ids, finish reasons."""
    assert status == 200, (status, raw[:400])
    body = json.loads(raw)
    return [(c.get("message", {}).get("content"), c.get("text"), c.get("token_ids"), c["finish_reason"])
            for c in body["choices"]]


def streamed_text(status, raw):
    assert status == 200, (status, raw[:400])
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += (choice.get("delta") or {}).get("content") or ""
    return text


def direct(node, path, body):
    status, parsed, _ = node.api("POST", path, body)
    return status, json.dumps(parsed).encode() if isinstance(parsed, (dict, list)) else parsed.encode()


def check_fields(router_binary, cluster, key, base):
    chat = {"model": base, "messages": [{"role": "user", "content": "Name three colours."}],
            "temperature": 0, "max_tokens": 12, "return_token_ids": True}
    completions = {"model": base, "prompt": "The colours of the rainbow are", "temperature": 0, "max_tokens": 12,
                   "return_token_ids": True}
    added = added_fields(router_binary, key, chat, completions)
    assert added["/v1/chat/completions"] == CHAT_ADDED, added["/v1/chat/completions"]
    assert added["/v1/completions"] == COMPLETIONS_ADDED, added["/v1/completions"]
    node = cluster.api[0]
    for path, body, fields in (("/v1/chat/completions", chat, CHAT_ADDED),
                               ("/v1/completions", completions, COMPLETIONS_ADDED)):
        want = answer(*direct(node, path, body))
        for field, value in fields.items():
            if field == "stream":
                continue  # stream: false is the body as sent (no stream field): `want` itself
            got = answer(*direct(node, path, {**body, field: value}))
            assert got == want, f"{path} with {field}={value!r}: {got} != {want}"
        got = answer(*direct(node, path, {**body, **fields}))
        assert got == want, f"{path} with every added field: {got} != {want}"
    # In a stream the router adds the same fields (stream_reasoning, separate_reasoning among them).
    streamed = {**chat, "stream": True}
    want = streamed_text(*direct(node, "/v1/chat/completions", streamed))
    got = streamed_text(*direct(node, "/v1/chat/completions", {**streamed, **{k: v for k, v in CHAT_ADDED.items()
                                                                                  if k != "stream"}}))
    assert got == want, (got, want)
    print(f"     vllm-router adds {len(CHAT_ADDED)} fields to chat, {len(COMPLETIONS_ADDED)} to completions; "
          "tandem answers each the same as without it")
    return chat, completions


def check_through(router, cluster, key, chat, completions):
    node = cluster.api[0]
    session = {"X-Session-ID": "through"}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", completions)):
        assert answer(*router.post(path, body, key, session)) == answer(*direct(node, path, body)), path
    streamed = {**chat, "stream": True}
    assert streamed_text(*router.post("/v1/chat/completions", streamed, key, session)) == \
        streamed_text(*direct(node, "/v1/chat/completions", streamed))
    status, _ = router.post("/v1/chat/completions", chat, "not-a-key", session)
    assert status == 401, status


def check_hashed(router, cluster, key, base):
    """The header is what is hashed: short requests under other session ids reach another node
    than `probe-0`'s (the chance that 30 ids all land on one of three nodes is 3^-29)."""
    body = {"model": base, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1}
    seen = []
    for k in range(30):
        before = [successes(n)["vllm:request_success_total"] for n in cluster.api]
        status, raw = router.post("/v1/chat/completions", body, key, {"X-Session-ID": f"probe-{k}"})
        assert status == 200, raw[:300]
        after = [successes(n)["vllm:request_success_total"] for n in cluster.api]
        seen.append(next(n.name for n, b, a in zip(cluster.api, before, after) if a > b))
        if len(set(seen)) > 1:
            return
    raise AssertionError(f"30 session ids all went to {seen[0]}: the router did not hash X-Session-ID")


def successes(node):
    """The node's finished requests (`vllm:request_success_total`, summed over reasons) and its
    prefix-cache queries and hits."""
    status, text, _ = node.api("GET", "/metrics")
    assert status == 200, text
    totals = {"vllm:request_success_total": 0.0, "vllm:prefix_cache_queries_total": 0.0,
              "vllm:prefix_cache_hits_total": 0.0}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def manual(nonce):
    """A long system prompt of an agent (~1,500 tokens), unique to one rollout so no other
    rollout's cache can serve it."""
    rules = [f"Rule {i}: when the customer asks about order {nonce}-{i}, look it up, confirm the address, "
             f"check the warehouse stock level, and answer politely in one short sentence." for i in range(40)]
    return f"You are support agent {nonce}.\n" + "\n".join(rules)


def first_token_seconds(url, key, body, headers):
    """Seconds from sending a streamed chat to its first content chunk, and the whole reply."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    started = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {key}", **headers})
    resp = conn.getresponse()
    assert resp.status == 200, (resp.status, resp.read()[:300])
    first, text = None, ""
    for raw in resp:
        line = raw.decode().strip()
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.monotonic() - started
                text += piece
    conn.close()
    return (first if first is not None else time.monotonic() - started), text


def rollouts(router, cluster, key, base, sessions, with_header):
    """`sessions` agent rollouts of TURNS turns each, one after another, through `router`.
    Returns ([first-token seconds of turns 2..TURNS], [nodes each session's turns landed on],
    the nodes' prefix-cache hit rate over the rollouts)."""
    seconds, placements = [], []
    before_all = [successes(n) for n in cluster.api]
    for s in range(sessions):
        nonce = uuid.uuid4().hex[:8]
        messages = [{"role": "system", "content": manual(nonce)}]
        # Fixed session ids: the router's hash, and so the nodes they land on, are the same each run.
        headers = {"X-Session-ID": f"agent-{s}"} if with_header else {}
        landed = []
        for turn in range(TURNS):
            messages.append({"role": "user", "content": f"Where is order {nonce}-{turn * 7}?"})
            before = [successes(n)["vllm:request_success_total"] for n in cluster.api]
            took, reply = first_token_seconds(router.url, key, {"model": base, "messages": messages,
                                                                "temperature": 0, "max_tokens": 8}, headers)
            after = [successes(n)["vllm:request_success_total"] for n in cluster.api]
            landed.append(next(n.name for n, b, a in zip(cluster.api, before, after) if a > b))
            messages.append({"role": "assistant", "content": reply})
            if turn:
                seconds.append(took)
        placements.append(landed)
    after_all = [successes(n) for n in cluster.api]
    queries = sum(a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
                  for a, b in zip(after_all, before_all))
    hits = sum(a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
               for a, b in zip(after_all, before_all))
    return seconds, placements, hits / queries if queries else 0.0


def check_router(router_binary, cluster, key, base):
    chat, completions = check_fields(router_binary, cluster, key, base)
    workers = [n.url for n in cluster.api]
    results = {}
    # Each session's first turn, and every turn without affinity, prefills the whole prompt: the
    # slow part of this check, so the sessions are few.
    for policy, with_header, sessions in (("consistent_hash", True, 3), ("cache_aware", False, 2),
                                          ("round_robin", False, 2)):
        router = Router(router_binary, workers, policy)
        try:
            if policy == "consistent_hash":
                check_through(router, cluster, key, chat, completions)
                check_hashed(router, cluster, key, base)
            results[policy] = rollouts(router, cluster, key, base, sessions=sessions, with_header=with_header)
        finally:
            router.stop()
    sticky = results["consistent_hash"][1]
    assert all(len(set(p)) == 1 for p in sticky), f"a session's turns moved between nodes: {sticky}"
    spread = results["round_robin"][1]
    assert all(len(set(p)) > 1 for p in spread), f"round_robin kept a session on one node: {spread}"
    for policy, (seconds, placements, hit_rate) in results.items():
        print(f"     {policy:16s} first token, turns 2-{TURNS}: median {statistics.median(seconds) * 1000:.0f} ms, "
              f"max {max(seconds) * 1000:.0f} ms; prefix-cache hit rate {hit_rate:.0%}; nodes {placements}")
    ratio = statistics.median(results["round_robin"][0]) / statistics.median(results["consistent_hash"][0])
    print(f"     round_robin / consistent_hash (X-Session-ID) median first token: {ratio:.1f}x")
