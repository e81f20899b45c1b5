#!/usr/bin/env bash
# Long-prompt benchmark, tandem vs llama.cpp's server, same GGUF, 2 threads each, one run
# (bench/long_context.py): prefill of a ~4,096-token prompt and 16 streams of ~2,048-token
# prompts, and each server's peak resident memory.
# llama.cpp allocates its KV cache when it starts (f16, every slot's whole context: ~1.6 GB
# here); tandem grows its caches (f16) with the positions it holds.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-2}
make -s model MODEL="$MODEL"

source bench/setup.sh
server=$(llama_server)
cargo build --release --bin tandem -q
TANDEM=${TANDEM:-./target/release/tandem}

data=$(mktemp -d)
RAYON_NUM_THREADS=2 TANDEM_LOG=warn "$TANDEM" serve --port 8106 --data-dir "$data" --model "$MODEL" \
  --api-key bench --max-num-seqs 16 >/dev/null &
tandem_pid=$!
# 16 slots of 4,352 positions: the 4,096-token prompt fits one, each stream's 2,048 + 32 another.
"$server" -m "$MODEL" -t 2 -np 16 -cb -c 69632 --port 8107 --api-key bench >/dev/null 2>&1 &
llama_pid=$!
trap 'kill $tandem_pid $llama_pid 2>/dev/null; rm -rf "$data"' EXIT
wait_healthy 8106 && wait_healthy 8107
python3 bench/long_context.py --rounds "$ROUNDS" --key bench \
  "tandem=http://127.0.0.1:8106@$tandem_pid" "llama.cpp=http://127.0.0.1:8107@$llama_pid"
