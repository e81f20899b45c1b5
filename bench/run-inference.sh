#!/usr/bin/env bash
# Inference benchmark, tandem vs llama.cpp's server, same GGUF, 2 threads each, one run.
# Builds llama.cpp once (from the source vendored in the llama-cpp-python sdist on PyPI, since
# Debian has no package) into target/llama, builds tandem in release, starts both on loopback,
# runs bench/inference.py against them and stops them. Prints medians and tandem/llama.cpp ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-3}
LLAMA_VERSION=${LLAMA_VERSION:-0.3.36}
make -s model MODEL="$MODEL"

venv=target/benchenv
if [ ! -x "$venv/bin/cmake" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet cmake ninja scikit-build-core
fi
src=target/llama/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp
server=$src/build/bin/llama-server
if [ ! -x "$server" ]; then
  mkdir -p target/llama
  (cd target/llama && "../benchenv/bin/pip" download --quiet --no-deps --no-binary :all: --no-build-isolation "llama-cpp-python==$LLAMA_VERSION" \
     && tar xzf "llama_cpp_python-$LLAMA_VERSION.tar.gz")
  # Not GGML_NATIVE: on CPUs that report AMX inside a VM that does not enable it, -march=native
  # code dies with SIGILL. The x86 features are listed instead (AMX left out); on a CPU without
  # AVX-512 drop those flags.
  PATH="$PWD/$venv/bin:$PATH" cmake -S "$src" -B "$src/build" -G Ninja -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
    -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  PATH="$PWD/$venv/bin:$PATH" cmake --build "$src/build" --target llama-server -j2 >/dev/null
fi
cargo build --release --bin tandem -q

data=$(mktemp -d)
RAYON_NUM_THREADS=2 TANDEM_LOG=warn ./target/release/tandem serve --port 8101 --data-dir "$data" --model "$MODEL" \
  --api-key bench --max-num-seqs 16 >/dev/null &
tandem_pid=$!
"$server" -m "$MODEL" -t 2 -np 16 -cb -c 16384 --port 8102 --api-key bench >/dev/null 2>&1 &
llama_pid=$!
trap 'kill $tandem_pid $llama_pid 2>/dev/null; rm -rf "$data"' EXIT
for port in 8101 8102; do
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null || { echo "the server on port $port did not start" >&2; exit 1; }
done
python3 bench/inference.py --rounds "$ROUNDS" --key bench --constrained \
  "tandem=http://127.0.0.1:8101@$tandem_pid" "llama.cpp=http://127.0.0.1:8102@$llama_pid"
