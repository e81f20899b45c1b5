#!/usr/bin/env bash
# One RL step as users run it (8 groups x 4 rollouts of up to 128 tokens, then one training job),
# stage by stage: tandem alone against llama.cpp's server for the rollouts plus PyTorch + PEFT for
# the training, same GGUF, 2 threads each. Also tandem's peak RSS serving and training at once.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
make -s model MODEL="$MODEL"

source bench/setup.sh
server=$(llama_server)
python=$(torch_python)
cargo build --release --bin tandem -q

data=$(mktemp -d)
start_tandem 8104 "$data"
"$server" -m "$MODEL" -t 2 -np 32 -cb -c 16384 --port 8105 --api-key bench >/dev/null 2>&1 &
llama_pid=$!
trap 'kill $tandem_pid $llama_pid 2>/dev/null; rm -rf "$data"' EXIT
wait_healthy 8104 && wait_healthy 8105
python3 bench/rl_step.py --tandem "http://127.0.0.1:8104@$tandem_pid" --llama "http://127.0.0.1:8105@$llama_pid" \
  --torch "$python" "$MODEL"
