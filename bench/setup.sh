# Sourced by the bench scripts: builds llama.cpp's server and the PyTorch environment once, into
# target/. llama.cpp comes from the source vendored in the llama-cpp-python sdist on PyPI (Debian
# has no package); PyTorch, transformers and PEFT from PyPI (the CUDA build: ~4 GB, runs on the
# CPU), and TRL for `make bench-rl-trl`. Each function prints the path of what it built on stdout
# (everything else to stderr).
LLAMA_VERSION=${LLAMA_VERSION:-0.3.36}

# `llama_server avx2` builds a second server with AVX2 as its highest tier (AVX-512 off), to
# compare with tandem's `TANDEM_CPU=avx2` on the same machine; `llama_server avxvnni` a third,
# AVX2 with AVX-VNNI (as llama.cpp builds for Intel's chips since Alder Lake), for
# `TANDEM_CPU=avxvnni`.
llama_server() {
  local tier=${1:-native}
  local venv=target/benchenv
  if [ ! -x "$venv/bin/cmake" ]; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet cmake ninja scikit-build-core >&2
  fi
  local src=target/llama/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp
  local build=$src/build
  [ "$tier" = avx2 ] && build=$src/build-avx2
  [ "$tier" = avxvnni ] && build=$src/build-avxvnni
  local server=$build/bin/llama-server
  if [ ! -x "$server" ]; then
    mkdir -p target/llama
    [ -d "$src" ] || (cd target/llama && "../benchenv/bin/pip" download --quiet --no-deps --no-binary :all: --no-build-isolation "llama-cpp-python==$LLAMA_VERSION" \
       && tar xzf "llama_cpp_python-$LLAMA_VERSION.tar.gz") >&2
    # Not GGML_NATIVE: on CPUs that report AMX inside a VM that does not enable it, -march=native
    # code dies with SIGILL. The x86 features are listed instead (AMX left out), the AVX-512 ones
    # only where /proc/cpuinfo has them (an AVX2-only CPU would die on them too).
    local avx512=OFF vnni=OFF vbmi=OFF bf16=OFF avxvnni=OFF
    grep -qw avx512f /proc/cpuinfo && avx512=ON
    grep -qw avx512_vnni /proc/cpuinfo && vnni=ON
    grep -qw avx512vbmi /proc/cpuinfo && vbmi=ON
    grep -qw avx512_bf16 /proc/cpuinfo && bf16=ON
    grep -qw avx_vnni /proc/cpuinfo && avxvnni=ON
    case $tier in
      avx2) avx512=OFF vnni=OFF vbmi=OFF bf16=OFF avxvnni=OFF ;;
      avxvnni) avx512=OFF vnni=OFF vbmi=OFF bf16=OFF ;;
    esac
    PATH="$PWD/$venv/bin:$PATH" cmake -S "$src" -B "$build" -G Ninja -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \
      -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=$avx512 -DGGML_AVX512_VNNI=$vnni -DGGML_AVX512_VBMI=$vbmi \
      -DGGML_AVX512_BF16=$bf16 -DGGML_AVX_VNNI=$avxvnni -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
    PATH="$PWD/$venv/bin:$PATH" cmake --build "$build" --target llama-server -j2 >/dev/null
  fi
  echo "$server"
}

TRL_VERSION=${TRL_VERSION:-1.16.0}

torch_python() {
  local venv=target/torchenv
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, transformers, peft, gguf, trl; assert trl.__version__ == '$TRL_VERSION'" 2>/dev/null; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install --quiet torch transformers peft gguf accelerate "trl==$TRL_VERSION" >&2
  fi
  echo "$venv/bin/python"
}

# Starts the release build of tandem in the background as the benches run it (2 threads, key
# "bench", $MODEL) on port $1 with data directory $2, any further arguments as extra flags; its
# pid is left in $tandem_pid.
start_tandem() {
  local port=$1 data=$2
  shift 2
  RAYON_NUM_THREADS=2 TANDEM_LOG=warn ./target/release/tandem serve --port "$port" --data-dir "$data" \
    --model "$MODEL" --api-key bench "$@" >/dev/null 2>&1 &
  tandem_pid=$!
}

wait_healthy() {
  for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.5; done
  echo "the server on port $1 did not start" >&2
  return 1
}

# Prefill's and many streams' bound for the GGUF $1: the kernel tier's int8 multiply instruction
# alone on two threads over the model's multiply-adds a token (`matmul_bench peak`, built by the
# caller). Further arguments are environment settings for it (TANDEM_CPU=avx2: the tier the
# server runs). Prints the measurement to stderr and the limit in tok/s (nothing if none).
compute_limit() {
  local model=$1 peak
  shift
  peak=$(env "$@" target/release/examples/matmul_bench peak 2 "$model")
  echo "$peak" >&2
  sed -n 's/.*compute limit \([0-9.]*\) tok\/s.*/\1/p' <<<"$peak"
}
