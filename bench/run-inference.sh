#!/usr/bin/env bash
# Inference benchmark, tandem vs llama.cpp's server, same GGUF (MODEL=..., default SmolLM2), 2 threads each,
# one run, then the first greedy tokens of a few prompts compared (bench/greedy_match.py).
# Builds llama.cpp once (from the source vendored in the llama-cpp-python sdist on PyPI, since
# Debian has no package) into target/llama, builds tandem in release, starts both on loopback,
# runs bench/inference.py against them and stops them. Prints medians and tandem/llama.cpp ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-3}
# TIER=avx2: both servers at AVX2 (tandem with TANDEM_CPU=avx2, llama.cpp built without AVX-512);
# TIER=avxvnni: both at AVX2 with AVX-VNNI (Intel's chips since Alder Lake; needs a CPU that has it).
TIER=${TIER:-native}
if [ "$TIER" = avxvnni ] && ! grep -qw avx_vnni /proc/cpuinfo; then
  echo "SKIPPED: TIER=avxvnni, and this CPU has no AVX-VNNI (nothing to compare)" >&2
  exit 0
fi
# Fetched by its own make target when missing (`make bench-avx2` and the others fetch theirs first:
# `make model MODEL=<a Qwen file>` would make warn of two recipes for one file).
[ -f "$MODEL" ] || make -s model MODEL="$MODEL"

source bench/setup.sh
server=$(llama_server "$TIER")
cargo build --release --bin tandem -q
# Decode's bound: two threads reading a buffer the size of the file, loads only.
cargo build --release -p tandem-model --example matmul_bench -q

data=$(mktemp -d)
tier_env=()
case $TIER in avx2 | avxvnni) tier_env=(TANDEM_CPU="$TIER") ;; esac
env "${tier_env[@]}" RAYON_NUM_THREADS=2 TANDEM_LOG=warn ./target/release/tandem serve --port 8101 --data-dir "$data" --model "$MODEL" \
  --api-key bench --max-num-seqs 16 >/dev/null &
tandem_pid=$!
"$server" -m "$MODEL" -t 2 -np 16 -cb -c 16384 --port 8102 --api-key bench >/dev/null 2>&1 &
llama_pid=$!
trap 'kill $tandem_pid $llama_pid 2>/dev/null; rm -rf "$data"' EXIT
wait_healthy 8101 && wait_healthy 8102
echo "kernel tier: $TIER"
read_gbs=$(target/release/examples/matmul_bench read 2 $(( $(stat -c %s "$MODEL") >> 20 )) | awk '{print $(NF-1)}')
compute=$(compute_limit "$MODEL" "${tier_env[@]}")
python3 bench/inference.py --rounds "$ROUNDS" --key bench --constrained --gguf "$MODEL" --read-gbs "$read_gbs" \
  ${compute:+--compute-limit "$compute"} \
  "tandem=http://127.0.0.1:8101@$tandem_pid" "llama.cpp=http://127.0.0.1:8102@$llama_pid"
# The first greedy tokens of a few prompts, side by side (docs/benchmarks.md: where they part).
python3 bench/greedy_match.py http://127.0.0.1:8101 http://127.0.0.1:8102 --key bench
