"""A quick look at one build's speed on this machine: a server with the bundled model, prompts
of random token ids with `max_tokens: 1` (prefill), then 128 tokens decoded. No peer: for
comparing two builds of tandem back to back (bench/run-inference.sh compares with llama.cpp).

    python3 bench/quick_speed.py target/release/tandem [512,1000]

GGUF=path picks another model file; TANDEM_CPU=avx2 (or scalar) caps the kernel tier.
"""

import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from tandem_server import Server  # noqa: E402

GGUF = os.environ.get("GGUF") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    binary = sys.argv[1]
    lengths = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "512,1000").split(",")]
    server = Server(binary, GGUF, "speed-key", extra=["--max-num-seqs", "8"])
    try:
        rng = random.Random(3)
        model = server.api("GET", "/v1/models")[1]["data"][0]["id"]
        server.api("POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 4})
        for n in lengths:
            body = {"model": model, "prompt": [rng.randrange(100, 40000) for _ in range(n)], "max_tokens": 1}
            t = time.monotonic()
            status, _, _ = server.api("POST", "/v1/completions", body)
            dt = time.monotonic() - t
            assert status == 200, status
            print(f"prefill {n}: {dt:.2f} s, {n / dt:.0f} tokens/s", flush=True)
        body = {"model": model, "prompt": "Once upon a time", "max_tokens": 128, "ignore_eos": True}
        t = time.monotonic()
        status, _, _ = server.api("POST", "/v1/completions", body)
        dt = time.monotonic() - t
        assert status == 200, status
        print(f"decode 128: {dt:.2f} s, {128 / dt:.0f} tokens/s", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
