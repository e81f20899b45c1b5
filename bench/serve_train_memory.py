"""tandem's memory serving and training at once: the RSS after the model loads, then the peak
(VmHWM) over two RL steps of `rl_step.py` (8 groups x 4 rollouts, then a training job), with each
job's seconds. Run against one or more servers (e.g. two builds) started on the same model:

    python bench/serve_train_memory.py --base-model ID LABEL=URL@PID [LABEL=URL@PID ...]

Each server is measured in turn (never two at once on the 2 cores).
"""
import argparse, os, sys

sys.path.insert(0, os.path.dirname(__file__))
from rl_step import call, rollouts, tandem_train  # noqa: E402


def status_mb(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("servers", nargs="+", metavar="LABEL=URL@PID")
    ap.add_argument("--base-model", required=True)
    ap.add_argument("--key", default="bench")
    a = ap.parse_args()
    print(f"{'server':<14}{'RSS loaded (MB)':>17}{'peak RSS (MB)':>15}{'job 1 (s)':>11}{'job 2 (s)':>11}{'steps':>7}")
    for spec in a.servers:
        label, rest = spec.split("=", 1)
        url, pid = rest.split("@")
        call(url, a.key, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        loaded = status_mb(pid, "VmRSS")
        jobs = []
        for seed in (1, 2):
            _, done = rollouts(url, a.key, seed)
            jobs.append(tandem_train(url, a.key, done, a.base_model))
        peak = status_mb(pid, "VmHWM")
        print(f"{label:<14}{loaded:>17.0f}{peak:>15.0f}{jobs[0][0]:>11.2f}{jobs[1][0]:>11.2f}{jobs[1][1]:>7}")


if __name__ == "__main__":
    main()
