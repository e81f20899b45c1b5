"""The `tandem-server` wheel as a user without Rust installs it: a fresh virtualenv, `pip install`
of the wheel (with its `art` extra), a PATH without cargo, then:

  command       `tandem --version` and `python -m tandem_server --help` run the wheel's binary
  fetch-model   `tandem_server.default_model()` fetches the default GGUF into an empty cache
  serve-chat    `tandem_server.start()` serves; the OpenAI SDK (ART's dependency) chats with the
                key the server wrote; `stop()` ends it with exit code 0
  art-step      ART's client through `tandem_server.art.TandemBackend()` (address and key from
                TANDEM_BASE_URL and TANDEM_API_KEY_FILE): register, roll out, one RL step, the
                new step answers

Usage: python test_wheel.py <wheel> <python for the virtualenv> [ART version]
Prints 'wheel: N passed, M failed'; exits non-zero on any failure.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

ART_VERSION = "0.5.23"

CHECKS = {
    "command": """
        import subprocess, sys, tandem_server
        exe = tandem_server.binary()
        assert exe.startswith(sys.prefix), (exe, sys.prefix)
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
        assert version.startswith("tandem "), version
        out = subprocess.run([sys.executable, "-m", "tandem_server", "--help"], capture_output=True, text=True,
                             check=True).stdout
        assert "serve" in out, out
        print("     ", exe, version.strip())
    """,
    "fetch-model": """
        import os, tandem_server
        path = tandem_server.default_model()
        assert path.startswith(os.environ["TANDEM_CACHE_DIR"]) and os.path.getsize(path) > 90_000_000, path
        with open(path, "rb") as f:
            assert f.read(4) == b"GGUF"
        assert tandem_server.default_model() == path  # the second call finds it
        print("     ", path, os.path.getsize(path), "bytes")
    """,
    "serve-chat": """
        import os, tandem_server, openai
        with tandem_server.start(data_dir=os.environ["DATA_DIR"]) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)
            r = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=8,
                                               messages=[{"role": "user", "content": "Say hi."}])
            assert r.usage.completion_tokens > 0, r
            print("     ", server.url, repr(r.choices[0].message.content))
        assert server.process.returncode == 0, server.process.returncode
    """,
    "art-step": """
        import asyncio, inspect, os, time, tandem_server
        from tandem_server.art import TandemBackend
        import art

        async def main(server):
            os.environ["TANDEM_BASE_URL"] = server.base_url
            os.environ["TANDEM_API_KEY_FILE"] = os.path.join(server.data_dir, "api-key")
            backend = TandemBackend()
            name = f"wheel-{int(time.time())}"
            kwargs = dict(name=name, project="wheel", base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
            if "run_name" in inspect.signature(art.TrainableModel.__init__).parameters:
                kwargs["run_name"] = name  # required from 0.5.19 or so
            model = art.TrainableModel(**kwargs)
            await model.register(backend)
            client = model.openai_client()
            messages = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
            trajectories = []
            for i in range(4):
                c = await client.chat.completions.create(model=model.get_inference_name(), messages=messages,
                                                         max_tokens=4, temperature=1.0, logprobs=True)
                trajectories.append(art.Trajectory(messages_and_choices=[*messages, c.choices[0]], reward=float(i % 2)))
            result = await backend.train(model, [art.TrajectoryGroup(trajectories)], learning_rate=1e-5)
            assert result.step == 1, result
            c = await client.chat.completions.create(model=model.get_inference_name(1), messages=messages, max_tokens=4)
            assert c.usage.completion_tokens > 0
            print("      step", result.step, "loss", result.metrics.get("loss/train"), repr(c.choices[0].message.content))
            await backend.close()

        with tandem_server.start(data_dir=os.environ["DATA_DIR"] + "-art") as server:
            asyncio.run(main(server))
    """,
}


def main():
    wheel, python = os.path.abspath(sys.argv[1]), sys.argv[2]
    art_version = sys.argv[3] if len(sys.argv) > 3 else ART_VERSION
    work = tempfile.mkdtemp(prefix="tandem-wheel-")
    venv = os.path.join(work, "venv")
    # A PATH with the virtualenv and the system's tools only: no cargo, no rustup.
    path = os.pathsep.join([os.path.join(venv, "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    env = {"PATH": path, "HOME": os.environ.get("HOME", work), "TANDEM_CACHE_DIR": os.path.join(work, "cache"),
           "DATA_DIR": os.path.join(work, "data"), "TANDEM_LOG": "warn"}
    passed = failed = 0
    try:
        assert shutil.which("cargo", path=path) is None, "cargo is on the test's PATH"
        started = time.monotonic()
        subprocess.run([python, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", f"{wheel}[art]", f"openpipe-art=={art_version}"],
                       check=True, env=env)
        print(f"installed {os.path.basename(wheel)} and openpipe-art {art_version} in {time.monotonic() - started:.0f}s")
        for name, code in CHECKS.items():
            started = time.monotonic()
            run = subprocess.run([os.path.join(venv, "bin", "python"), "-c", textwrap.dedent(code)], env=env,
                                 cwd=work, capture_output=True, text=True, timeout=900)
            if run.returncode == 0:
                passed += 1
                print(f"ok   {name} ({time.monotonic() - started:.1f}s)")
                print(run.stdout.rstrip()) if run.stdout.strip() else None
            else:
                failed += 1
                print(f"FAIL {name} ({time.monotonic() - started:.1f}s)\n{run.stdout}\n{run.stderr[-4000:]}")
    finally:
        if not failed:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work} for its logs")
    print(f"wheel: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
