#!/usr/bin/env bash
# `make bench-qwen`: the real Qwen2.5-Coder 0.5B and 1.5B files (make model-qwen), tandem against
# llama.cpp's server on the same file, 2 threads each, one run per file:
#  1. records what llama.cpp says on the file (bench/record_llamacpp.py: /tokenize of the tokenizer
#     corpus, greedy tokens and top-20 log-probabilities of a few prompts) into
#     tests/data/llamacpp_qwen.json, the fixture the parity tests in `make test` compare against
#     (commit it when it changes: it is what llama.cpp said, not what tandem says);
#  2. runs bench/inference.py (prefill, decode, 16 streams, peak RSS) against both servers, with
#     decode's bound from the read bandwidth (`matmul_bench read`), and prefill's and the 16
#     streams' from the int8 multiply instruction alone (`matmul_bench peak`).
# QWEN_FILES=... picks the files (default both); RECORD=0 skips step 1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
QWEN_FILES=${QWEN_FILES:-"models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"}
RECORD=${RECORD:-1}
make -s model-qwen

source bench/setup.sh
server=$(llama_server)
cargo build --release --bin tandem -q
# The read bandwidth decode is bounded by: two threads streaming through a buffer the size of the
# file, loads only (a copy understates it: one core, and writes).
cargo build --release -p tandem-model --example matmul_bench -q

for MODEL in $QWEN_FILES; do
  echo "== $(basename "$MODEL")"
  data=$(mktemp -d)
  start_tandem 8101 "$data" --max-num-seqs 16
  "$server" -m "$MODEL" -t 2 -np 16 -cb -c 16384 --port 8102 --api-key bench >/dev/null 2>&1 &
  llama_pid=$!
  trap 'kill $tandem_pid $llama_pid 2>/dev/null || true; rm -rf "$data"' EXIT
  wait_healthy 8101 && wait_healthy 8102
  if [ "$RECORD" = 1 ]; then
    python3 bench/record_llamacpp.py http://127.0.0.1:8102 "$(basename "$MODEL")" tests/data/llamacpp_qwen.json
  fi
  read_gbs=$(target/release/examples/matmul_bench read 2 $(( $(stat -c %s "$MODEL") >> 20 )) | awk '{print $(NF-1)}')
  compute=$(compute_limit "$MODEL")
  python3 bench/inference.py --rounds "$ROUNDS" --key bench --constrained --gguf "$MODEL" --read-gbs "$read_gbs" \
    ${compute:+--compute-limit "$compute"} \
    "tandem=http://127.0.0.1:8101@$tandem_pid" "llama.cpp=http://127.0.0.1:8102@$llama_pid"
  kill $tandem_pid $llama_pid 2>/dev/null; wait $tandem_pid $llama_pid 2>/dev/null || true
  rm -rf "$data"
done
