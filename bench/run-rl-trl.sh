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
start_tandem 8109 "$out/data"
trap 'kill $tandem_pid 2>/dev/null || true; rm -rf "$out"' EXIT
wait_healthy 8109
"$art_python" bench/rl_trl.py tandem http://127.0.0.1:8109 bench $tandem_pid --steps "$STEPS" --runs "${RUNS:-3}" \
  --task "${TASK:-sums}" --base-path "$out/art" --json "$out/tandem.json"
kill $tandem_pid && wait $tandem_pid 2>/dev/null || true
TQDM_DISABLE=1 "$torch" bench/rl_trl.py trl "$MODEL" --steps "$STEPS" --task "${TASK:-sums}" --out "$out/trl" --json "$out/trl.json" >"$out/trl.log"
python3 bench/rl_trl.py compare "$out/tandem.json" "$out/trl.json"
