#!/usr/bin/env bash
# ART's PipelineTrainer against its synchronous loop, both through ART 0.5.23's ServerlessBackend
# on one tandem server (bench/pipeline.py), 2 threads. Argument: the Python with openpipe-art.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
STEPS=${STEPS:-6}
python=$1
source bench/setup.sh
cargo build --release --bin tandem -q
data=$(mktemp -d)
start_tandem 8108 "$data"
trap 'kill $tandem_pid 2>/dev/null; rm -rf "$data"' EXIT
wait_healthy 8108
"$python" bench/pipeline.py http://127.0.0.1:8108 bench --steps "$STEPS" --pid $tandem_pid
