#!/usr/bin/env bash
# The sums task's RL loop through the Tinker API against the same loop through ART 0.5.23's
# ServerlessBackend (the /v1/preview job path), on one release server, one side after the other
# (bench/rl_tinker.py), then TRL's GRPOTrainer on the same task after the server stopped (so that
# nothing shares the two cores), all three compared. Arguments: the Python with openpipe-art
# 0.5.23, the Python with tinker 0.38.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
STEPS=${STEPS:-12}
RUNS=${RUNS:-3}
art_python=$1
tinker_python=$2
source bench/setup.sh
torch=$(torch_python)
cargo build --release --bin tandem -q
out=$(mktemp -d)
start_tandem 8110 "$out/data"
trap 'kill $tandem_pid 2>/dev/null || true; rm -rf "$out"' EXIT
wait_healthy 8110
"$art_python" bench/rl_trl.py tandem http://127.0.0.1:8110 bench $tandem_pid --steps "$STEPS" --runs "$RUNS" \
  --base-path "$out/art" --json "$out/art.json"
HF_HUB_CACHE="$out/data/hf-hub" HF_HUB_OFFLINE=1 "$tinker_python" bench/rl_tinker.py tinker http://127.0.0.1:8110 bench \
  --steps "$STEPS" --runs "$RUNS" --json "$out/tinker.json"
kill $tandem_pid && wait $tandem_pid 2>/dev/null || true
TQDM_DISABLE=1 "$torch" bench/rl_trl.py trl "$MODEL" --steps "$STEPS" --out "$out/trl" --json "$out/trl.json" >"$out/trl.log"
python3 bench/rl_tinker.py compare "$out/art.json" "$out/tinker.json" "$out/trl.json"
