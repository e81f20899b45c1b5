#!/usr/bin/env bash
# Training benchmark, tandem vs PyTorch + PEFT on the CPU, same GGUF, 2 threads each, one run:
# one training step (forward + backward + AdamW, ROWS x LEN tokens, LoRA r8 on every projection),
# alternating rounds, medians, peak RSS. Then how much a running training job slows inference.
# MODEL=... picks the GGUF (e.g. the Qwen2.5-Coder 0.5B of `make model-qwen`).
# PyTorch comes from PyPI into target/torchenv (the CUDA build: ~4 GB, runs on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-2}
ROWS=${ROWS:-4}
LEN=${LEN:-256}
make -s model MODEL="$MODEL"

source bench/setup.sh
python=$(torch_python)
cargo build --release -q -p tandem-train --example train_step
cargo build --release -q --bin tandem

rss() { grep "Maximum resident" | awk '{print $6 / 1024}'; }
tandem_json=(); torch_json=(); tandem_rss=0; torch_rss=0
for round in $(seq 1 "$ROUNDS"); do
  out=$( { RAYON_NUM_THREADS=2 TANDEM_MODEL="$MODEL" ROWS=$ROWS LEN=$LEN STEPS=3 /usr/bin/time -v ./target/release/examples/train_step 2>&1 1>&3 | rss >/tmp/tandem-rss.$$; } 3>&1 )
  tandem_json+=("$out"); tandem_rss=$(cat /tmp/tandem-rss.$$)
  out=$( { /usr/bin/time -v "$python" bench/training_torch.py "$MODEL" --rows "$ROWS" --len "$LEN" --steps 3 --threads 2 2>&1 1>&3 | rss >/tmp/torch-rss.$$; } 3>&1 )
  torch_json+=("$out"); torch_rss=$(cat /tmp/torch-rss.$$)
done
rm -f /tmp/tandem-rss.$$ /tmp/torch-rss.$$
python3 - "$ROWS" "$LEN" "$tandem_rss" "$torch_rss" "${tandem_json[@]}" -- "${torch_json[@]}" <<'PY'
import json, statistics, sys
rows, length, trss, prss = sys.argv[1:5]
rest = sys.argv[5:]
cut = rest.index("--")
def steps(outs):
    # The first step of each run warms up allocations; the rest are the steady state.
    xs = []
    for o in outs:
        line = [l for l in o.splitlines() if l.startswith("{")][-1]
        xs += json.loads(line)["step_seconds"][1:]
    return statistics.median(xs)
t, p = steps(rest[:cut]), steps(rest[cut + 1:])
print(f"training step, {rows} x {length} tokens, LoRA r8, 2 threads (median of steady-state steps):")
print(f"  tandem   {t:6.2f} s   peak RSS {float(trss):7.0f} MB")
print(f"  PyTorch  {p:6.2f} s   peak RSS {float(prss):7.0f} MB")
print(f"  tandem speed / PyTorch speed = {p / t:.2f}x   memory ratio {float(trss) / float(prss):.2f}")
PY

# Inference while a job trains: single-stream decode before and during a training job
# (INTERFERENCE=0 skips it).
[ "${INTERFERENCE:-1}" = 0 ] && exit 0
data=$(mktemp -d)
start_tandem 8103 "$data"
trap 'kill $tandem_pid 2>/dev/null; rm -rf "$data"' EXIT
wait_healthy 8103
python3 bench/training_interference.py http://127.0.0.1:8103 bench
