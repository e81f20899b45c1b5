"""What an operator's managed PostgreSQL asks of tandem, against a PostgreSQL server of the test's
own (Debian's binaries, `initdb` into a temporary directory as the `postgres` user, a free port)
that accepts TLS connections only (`hostssl ... trust`, `hostnossl ... reject`) with a certificate
signed by a CA the test makes with openssl:

  verify-full     `sslmode=verify-full&sslrootcert=<CA>`: the server starts, chats, registers a
                  model; every connection it holds is encrypted (pg_stat_ssl); `tandem keys create`
                  works over the same URL
  wrong-ca        a CA that did not sign the server's certificate: `tandem serve` exits non-zero,
                  naming the certificate, within the connect timeout (no hang, no plaintext retry)
  plaintext       `sslmode=disable`: the server refuses it, and tandem exits saying so
  lease-outage    a job running when the database stops for 6 s (three times the 2 s lease): its
                  trainer keeps the lease (no trainer re-claims a lease until it has reached the
                  store for a whole lease again, and the holder renews first), and the job ends
                  `succeeded` on its first claim (`attempts` 1), with one `training_started` and
                  no `training_restarted`
  store-copy      a SQLite server's store (a key of a second entity, a model trained one RL step,
                  logs) copied by `tandem store copy` into PostgreSQL (over TLS) with its
                  checkpoint files into a `file://` blob store; a node on PostgreSQL with an
                  empty data directory then answers both keys, lists the same logs and serves
                  the trained step (fetched from the blob store); a second copy into it is
                  refused; and copied back into a new SQLite file, a node there serves it too
  stmt-timeout    `--db-statement-timeout 1s` while another session holds an exclusive lock on
                  the models table: listing models answers 503 with Retry-After in about a second
                  (instead of waiting on the lock), and 200 once the lock is released
  silent-drop     the server (one pooled connection) reaches PostgreSQL through a proxy that, at
                  the drop, kills every flow for good without closing it (a firewall or NAT
                  that forgets its flows): a listing whose statement was in flight answers 503
                  within the call's deadline (twice `--db-statement-timeout` 2s) instead of
                  waiting on TCP, and so do a log append and another key's lookup; once new
                  flows pass again, sixteen requests at once all answer 200 (the dead
                  connection's pool slot was given back) and a log written then is listed

Usage: python test_postgres_ops.py <tandem binary> <model gguf>
Prints 'postgres-ops: N passed, M failed'; exits non-zero on any failure.
"""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tandem_server import PrivatePostgres, Server, finish, rl_step, scratch  # noqa: E402

KEY = "tandem-pg-ops-key"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d):
    """A CA, a server certificate for localhost/127.0.0.1 signed by it, and an unrelated CA."""
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=tandem test {ca}",
                "-keyout", f"{ca}.key", "-out", f"{ca}.crt", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
            "-out", "server.csr", cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "server.crt", cwd=d)


class Postgres(PrivatePostgres):
    """The test's PostgreSQL: TLS connections only, with a certificate signed by a CA of the
    test's, and a database `tandem`."""

    def __init__(self):
        certs = scratch("tandem-pgops-certs-")
        make_certs(certs)
        self.ca, self.other_ca = os.path.join(certs, "ca.crt"), os.path.join(certs, "other-ca.crt")
        os.chmod(certs, 0o755)
        os.chmod(os.path.join(certs, "server.key"), 0o600)
        if os.geteuid() == 0:
            for name in ("server.key", "server.crt"):
                shutil.chown(os.path.join(certs, name), "postgres")
        super().__init__(
            settings=["ssl = on", f"ssl_cert_file = '{certs}/server.crt'", f"ssl_key_file = '{certs}/server.key'",
                      "fsync = off"],
            hba="local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n")
        self.sql("CREATE DATABASE tandem")

    def tls_url(self, query):
        return f"postgres://postgres@localhost:{self.port}/tandem?{query}"

    def sql(self, statement, db="postgres"):
        out = subprocess.run(self.psql("-d", db, "-Atqc", statement), check=True, capture_output=True, text=True,
                             cwd="/")
        return out.stdout.strip()

    def session(self, db="tandem"):
        """An interactive psql over the socket (stdin open), for holding a lock. From `/`: the
        postgres user may not enter the caller's directory, and psql would say so on its output."""
        return subprocess.Popen(self.psql("-d", db, "-Aqt"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd="/")

    def pause(self, seconds):
        """Stops the server (as a crash would: `immediate`) for `seconds`, then starts it again."""
        self.stop("immediate")
        time.sleep(seconds)
        self.start()


def failed_start(binary, model, url):
    """`tandem serve` on `url` that must fail: (seconds until it exited, its log)."""
    data = scratch("tandem-pgops-")
    started = time.monotonic()
    run = subprocess.run([binary, "serve", "--port", "0", "--data-dir", data, "--model", model, "--database-url", url],
                         capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert run.returncode != 0, f"tandem serve started on {url}"
    return took, run.stdout + run.stderr


def check_verify_full(ctx):
    pg, binary, model = ctx["pg"], ctx["binary"], ctx["model"]
    url = pg.tls_url(f"sslmode=verify-full&sslrootcert={pg.ca}")
    server = ctx["server"] = Server(binary, model, KEY, ["--database-url", url, "--db-statement-timeout", "1",
                                                         "--job-lease-seconds", "2"])
    status, body, _ = server.api("POST", "/v1/chat/completions", {"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                                 "messages": [{"role": "user", "content": "Hi."}],
                                                                 "max_tokens": 4})
    assert status == 200, body
    status, body, _ = server.api("POST", "/v1/preview/models", {"project": "ops", "name": "tls",
                                                              "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    assert status == 200, body
    plain = pg.sql("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                   "WHERE a.datname = 'tandem' AND a.backend_type = 'client backend' AND NOT s.ssl")
    encrypted = pg.sql("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                       "WHERE a.datname = 'tandem' AND a.backend_type = 'client backend' AND s.ssl")
    assert plain == "0" and int(encrypted) >= 1, (plain, encrypted)
    out = subprocess.run([binary, "keys", "create", "--entity", "tls-team", "--database-url", url,
                          "--data-dir", server.data], capture_output=True, text=True, check=True).stdout
    new_key = out.strip().splitlines()[-1].strip()
    status, body, _ = server.api("GET", "/v1/models", key=new_key)
    assert status == 200, body
    print(f"     {encrypted} connection(s), all TLS; a key made over the same URL works")


def check_wrong_ca(ctx):
    pg = ctx["pg"]
    took, log = failed_start(ctx["binary"], ctx["model"], pg.tls_url(f"sslmode=verify-full&sslrootcert={pg.other_ca}"))
    assert "certificate" in log.lower(), log[-2000:]
    print(f"     refused in {took:.1f}s: {next(line for line in log.splitlines() if 'certificate' in line.lower())[:160]}")


def check_plaintext(ctx):
    took, log = failed_start(ctx["binary"], ctx["model"], ctx["pg"].tls_url("sslmode=disable"))
    assert "pg_hba.conf" in log or "no encryption" in log, log[-2000:]
    print(f"     refused in {took:.1f}s")


def check_lease_outage(ctx):
    pg, server = ctx["pg"], ctx["server"]
    status, model, _ = server.api("POST", "/v1/preview/models", {"project": "ops", "name": "lease",
                                                               "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    assert status == 200, model
    groups = []
    for g in range(8):
        messages = [{"role": "user", "content": f"Count to {g + 3}."}]
        status, r, _ = server.api("POST", "/v1/chat/completions", {
            "model": "HuggingFaceTB/SmolLM2-135M-Instruct", "messages": messages, "n": 4, "temperature": 1.0,
            "max_tokens": 48, "seed": g, "logprobs": True, "return_token_ids": True})
        assert status == 200, r
        groups.append({"trajectories": [{"messages_and_choices": messages + [c], "reward": float(i)}
                                        for i, c in enumerate(r["choices"])]})
    # One sequence a row, so one optimizer step each: a job that trains for several seconds, past
    # the lease, while the database is away.
    status, job, _ = server.api("POST", "/v1/preview/training-jobs", {
        "model_id": model["id"], "trajectory_groups": groups, "experimental_config": {"packed_sequence_length": 128}})
    assert status == 200, job
    deadline = time.monotonic() + 120
    while (state := server.api("GET", f"/v1/preview/training-jobs/{job['id']}")[1]["status"]) == "queued":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    assert state == "running", f"the job ended before the database stopped: {state}"
    pg.pause(6)
    deadline = time.monotonic() + 300
    while (state := server.api("GET", f"/v1/preview/training-jobs/{job['id']}")[1])["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    kinds = [e["type"] for e in server.api("GET", f"/v1/preview/training-jobs/{job['id']}/events?limit=100")[1]["data"]]
    assert state["status"] == "succeeded", state
    assert kinds.count("training_started") == 1 and "training_restarted" not in kinds, kinds
    # A lost lease shows in the claims: a job re-claimed after a lapse runs a second attempt (whose
    # first run's buffered events were dropped, so the events alone may not show it).
    attempts = pg.sql(f"SELECT attempts FROM training_jobs WHERE id = '{job['id']}'", db="tandem")
    assert attempts == "1", f"the job was claimed {attempts} times: its lease was lost in the outage"
    print(f"     the job ran through a 6 s outage (lease 2 s): succeeded, {kinds.count('gradient_step')} steps, "
          "no restart")


def copy_store(binary, *args):
    run = subprocess.run([binary, "store", "copy", *args], capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout + run.stderr


def check_store_copy(ctx):
    pg, binary, model = ctx["pg"], ctx["binary"], ctx["model"]
    base = "HuggingFaceTB/SmolLM2-135M-Instruct"
    # A single node on SQLite, as `make run` leaves it: a trained checkpoint, logs, two entities.
    single = Server(binary, model, KEY)
    try:
        other_key = single.new_key("team-b")
        status, m, _ = single.api("POST", "/v1/preview/models", {"project": "copy", "name": "m", "base_model": base})
        assert status == 200, m
        rl_step(single, m["id"], "Is the sky blue? Answer yes or no.", seed=1)
        for i in range(3):
            groups = [{"trajectories": [{"reward": i, "messages_and_choices": [{"role": "user", "content": f"log {i} é"}]}]}]
            status, body, _ = single.api("POST", f"/v1/preview/models/{m['id']}/log", {"split": "val", "trajectory_groups": groups})
            assert status == 200, body
        logs_before = single.api("GET", f"/v1/preview/models/{m['id']}/logs?limit=100")[1]["data"]
        name = f"wandb-artifact:///{m['entity']}/copy/m:step1"
        chat = {"model": name, "messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 6,
                "temperature": 0}
        status, answer_before, _ = single.api("POST", "/v1/chat/completions", chat)
        assert status == 200, answer_before
    finally:
        single.stop()
    pg.sql("CREATE DATABASE tandem_copy")
    target = pg.tls_url(f"sslmode=verify-full&sslrootcert={pg.ca}").replace("/tandem?", "/tandem_copy?")
    blobs = f"file://{scratch('tandem-pgops-blobs-')}"
    code, out = copy_store(binary, "--from", f"sqlite://{single.data}/tandem.db", "--to", target,
                           "--data-dir", single.data, "--blob-store", blobs)
    assert code == 0, out
    assert "1 uploaded" in out and "verified" in out, out
    print("     " + "; ".join(line.strip() for line in out.splitlines() if "rows" in line and " 0 rows" not in line))
    code, again = copy_store(binary, "--from", f"sqlite://{single.data}/tandem.db", "--to", target,
                             "--data-dir", single.data, "--blob-store", blobs)
    assert code != 0 and "not empty" in again, again
    # A node on the copy, with an empty data directory: everything is there, the step from the blob store.
    node = Server(binary, model, KEY, ["--database-url", target, "--blob-store", blobs])
    try:
        assert node.api("GET", "/v1/models", key=other_key)[0] == 200
        assert node.api("GET", f"/v1/preview/models/{m['id']}/logs?limit=100")[1]["data"] == logs_before
        status, answer, _ = node.api("POST", "/v1/chat/completions", chat)
        assert status == 200 and answer["choices"][0]["message"] == answer_before["choices"][0]["message"], answer
    finally:
        node.stop()
    # And back into a new SQLite file (the files stay in the blob store).
    back = scratch("tandem-pgops-back-")
    code, out = copy_store(binary, "--from", target, "--to", f"sqlite://{back}/tandem.db", "--data-dir", back,
                           "--blob-store", blobs)
    assert code == 0 and "1 already in the blob store" in out, out
    node = Server(binary, model, KEY, ["--blob-store", blobs], data=back)
    try:
        status, answer, _ = node.api("POST", "/v1/chat/completions", chat)
        assert status == 200 and answer["choices"][0]["message"] == answer_before["choices"][0]["message"], answer
        assert node.api("GET", f"/v1/preview/models/{m['id']}/logs?limit=100")[1]["data"] == logs_before
    finally:
        node.stop()


def check_statement_timeout(ctx):
    pg, server = ctx["pg"], ctx["server"]
    holder = pg.session()
    try:
        holder.stdin.write("BEGIN; LOCK TABLE models IN ACCESS EXCLUSIVE MODE; SELECT 'locked';\n")
        holder.stdin.flush()
        line = holder.stdout.readline().strip()
        assert line == "locked", f"the session holding the lock said {line!r}"
        started = time.monotonic()
        status, body, headers = server.api("GET", "/v1/preview/models")
        took = time.monotonic() - started
        assert status == 503 and headers.get("retry-after"), (status, body)
        assert took < 10, took
        print(f"     a statement blocked on a lock: 503 in {took:.1f}s ({body.get('detail', body)!r:.120})")
    finally:
        holder.stdin.write("ROLLBACK;\n")
        holder.stdin.close()
        holder.wait(10)
    status, body, _ = server.api("GET", "/v1/preview/models")
    assert status == 200, body


class SilentProxy:
    """Passes TCP between a local port and `port` until `drop()`. From then on, as a firewall or
    NAT that forgets its flows does, every connection open at the drop or opened during it is
    dead for good: its bytes are held in both directions and nothing is closed (the sender's
    retransmissions never arrive). After `heal()` new connections pass again."""

    def __init__(self, port):
        self.target, self.down, self.flows = port, False, []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def drop(self):
        with self.lock:
            self.down = True
            for flow in self.flows:
                flow["dead"] = True

    def heal(self):
        with self.lock:
            self.down = False

    def _accept(self):
        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                flow = {"dead": self.down}
                self.flows.append(flow)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, flow), daemon=True).start()

    def _pump(self, src, dst, flow):
        try:
            src.settimeout(0.1)
            while True:
                if flow["dead"]:  # held for good: neither read nor closed
                    time.sleep(0.5)
                    continue
                try:
                    data = src.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    break
                if not flow["dead"]:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            if not flow["dead"]:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass


def check_silent_drop(ctx):
    pg, proxy = ctx["pg"], SilentProxy(ctx["pg"].port)
    url = f"postgres://postgres@localhost:{proxy.port}/tandem?sslmode=verify-full&sslrootcert={pg.ca}"
    # One connection only: were it kept by the dead flow, nothing would answer after the heal.
    server = Server(ctx["binary"], ctx["model"], "pgops-drop-key",
                    ["--database-url", url, "--db-statement-timeout", "2", "--db-acquire-timeout", "2",
                     "--db-pool-size", "1"])
    holder = pg.session()
    try:
        status, model, _ = server.api("POST", "/v1/preview/models",
                                      {"project": "drop", "name": "m", "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct"})
        assert status == 200, model
        log = {"split": "train", "trajectory_groups": [{"trajectories": [
            {"reward": 1.0, "messages_and_choices": [{"role": "user", "content": "hi"}]}]}]}
        other = server.new_key("drop-other")  # made before the drop: `tandem keys` has no deadline

        def timed(name, method, path, body=None, key=None):
            started = time.monotonic()
            status, answer, headers = server.api(method, path, body, key=key, timeout=120)
            return name, status, headers.get("retry-after"), time.monotonic() - started, answer

        # A statement in flight when the network goes: it waits on a lock (over the socket, not
        # through the proxy), the drop comes, then the lock goes; the answer never arrives.
        holder.stdin.write("BEGIN; LOCK TABLE models IN ACCESS EXCLUSIVE MODE; SELECT 'locked';\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "locked"
        with ThreadPoolExecutor(4) as pool:
            in_flight = pool.submit(timed, "a listing in flight", "GET", "/v1/preview/models")
            time.sleep(0.5)
            proxy.drop()
            holder.stdin.write("ROLLBACK;\n")
            holder.stdin.flush()
            later = [pool.submit(timed, *call) for call in [
                ("a log append", "POST", f"/v1/preview/models/{model['id']}/log", log),
                ("another key's lookup", "GET", "/v1/preview/models", None, other)]]
            results = [in_flight.result()] + [f.result() for f in later]
        for name, status, retry_after, took, answer in results:
            print(f"     dropped network, {name}: {status} in {took:.1f}s ({str(answer)[:80]})")
            assert status == 503 and retry_after, (name, status, answer)
            assert took < 12, f"{name} took {took:.1f}s: more than the deadline (4 s) and a bounded ping"
        # The connections the calls held are closed once their 5 s release ping goes unanswered.
        time.sleep(6)
        proxy.heal()
        deadline = time.monotonic() + 30
        while server.api("GET", "/v1/preview/models")[0] != 200:
            assert time.monotonic() < deadline, "the pool did not recover within 30 s of the network"
            time.sleep(0.5)
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(lambda _: server.api("GET", "/v1/preview/models")[0], range(16)))
        assert statuses == [200] * 16, statuses
        status, written, _ = server.api("POST", f"/v1/preview/models/{model['id']}/log", log)
        assert status == 200, written
        _, logs, _ = server.api("GET", f"/v1/preview/models/{model['id']}/logs")
        assert written["id"] in [entry["id"] for entry in logs["data"]], logs
        print(f"     healed: 16 requests at once all 200 in {time.monotonic() - started:.1f}s; a new log is listed")
    finally:
        holder.stdin.close()
        holder.wait(10)
        proxy.heal()
        server.stop()


CHECKS = [("verify-full", check_verify_full), ("wrong-ca", check_wrong_ca), ("plaintext", check_plaintext),
          ("lease-outage", check_lease_outage), ("store-copy", check_store_copy),
          ("stmt-timeout", check_statement_timeout), ("silent-drop", check_silent_drop)]


def main():
    binary, model = sys.argv[1], sys.argv[2]
    ctx = {"binary": binary, "model": model}
    passed = failed = 0
    try:
        ctx["pg"] = Postgres()
        print(f"PostgreSQL {ctx['pg'].sql('SHOW server_version')} on port {ctx['pg'].port}, TLS only")
        for name, fn in CHECKS:
            started = time.monotonic()
            try:
                fn(ctx)
                passed += 1
                print(f"ok   {name} ({time.monotonic() - started:.1f}s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {name} ({time.monotonic() - started:.1f}s)")
                traceback.print_exc()
                if ctx.get("server"):
                    print(ctx["server"].log_tail(10))
    except Exception:
        failed += 1
        traceback.print_exc()
    finally:
        if ctx.get("server"):
            ctx["server"].stop()
        if ctx.get("pg"):
            ctx["pg"].close()
    print(f"postgres-ops: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    finish(main())
