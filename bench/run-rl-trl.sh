#!/usr/bin/env bash
# The whole RL loop against Hugging Face TRL's GRPOTrainer (bench/rl_trl.py): tandem driven by ART
# 0.5.23's ServerlessBackend, then TRL on the CPU in target/torchenv, one after the other so that
# neither shares the two cores, then their held-out reward curves compared. Argument: the Python
# with openpipe-art 0.5.23.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
STEPS=${STEPS:-12}
art_python=$1
source bench/setup.sh
torch=$(torch_python)
cargo build --release --bin tandem -q
out=$(mktemp -d)
data=$out/data
RAYON_NUM_THREADS=2 TANDEM_LOG=warn ./target/release/tandem serve --port 8109 --data-dir "$data" --model "$MODEL" \
  --api-key bench >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$out"' EXIT
wait_healthy 8109
"$art_python" bench/rl_trl.py tandem http://127.0.0.1:8109 bench $pid --steps "$STEPS" --runs "${RUNS:-3}" --base-path "$out/art" --json "$out/tandem.json"
kill $pid && wait $pid 2>/dev/null || true
TQDM_DISABLE=1 "$torch" bench/rl_trl.py trl "$MODEL" --steps "$STEPS" --out "$out/trl" --json "$out/trl.json" >"$out/trl.log"
python3 bench/rl_trl.py compare "$out/tandem.json" "$out/trl.json"
