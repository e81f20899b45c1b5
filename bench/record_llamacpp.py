"""Records what llama.cpp's server says on a GGUF, for tandem's parity tests to compare against.

    python bench/record_llamacpp.py LLAMA_URL FILE_LABEL OUT.json

Adds to OUT.json (created if missing, other files' entries kept), under FILE_LABEL:
- `tokenize`: the ids llama.cpp's `/tokenize` gives every text of tests/data/tokenizer_corpus.json
  (no BOS, special tokens written in text parsed), and which texts are not in NFC (llama.cpp skips
  Qwen's NFC normaliser, so there it parts from Hugging Face by design);
- `greedy`: for each prompt of PROMPTS, its token ids (llama.cpp's own tokenization), the greedy
  continuation (`ignore_eos`, which in llama.cpp forbids every end-of-generation token) and the 20
  likeliest next tokens with their log-probabilities at every step, read from the raw logits (not
  after sampling, so end-of-generation tokens appear in them).

tests/python/test_qwen.py replays the prompts through tandem and checks the greedy tokens agree up
to a near-tie and the log-probabilities are close (mean KL over llama.cpp's top 20). Run by
bench/run-qwen.sh (`make bench-qwen`), which builds llama.cpp's server from its PyPI sdist.
"""
import json
import os
import sys
import unicodedata
import urllib.request

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chatml(user):
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


PROMPTS = [
    chatml("Write a Python function that returns the n-th Fibonacci number."),
    chatml("What is the capital of France? Answer in one word."),
    chatml("Explain what a hash map is in two sentences."),
    chatml("Write a SQL query that counts the users older than 30."),
    "def quicksort(arr):\n",
    "// A C function that reverses a string in place\nvoid reverse(char *s) {\n",
    "The three primary colors are",
]
STEPS = 32
TOP = 20


def post(url, path, body):
    headers = {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ.get("LLAMA_KEY", "bench")}
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def main():
    url, label, out = sys.argv[1:4]
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    texts = json.load(open(os.path.join(root, "tests/data/tokenizer_corpus.json"), encoding="utf-8"))["texts"]
    ids = [post(url, "/tokenize", {"content": t, "add_special": False, "parse_special": True})["tokens"] for t in texts]
    not_nfc = [t for t in texts if unicodedata.normalize("NFC", t) != t]
    greedy = []
    for prompt in PROMPTS:
        prompt_ids = post(url, "/tokenize", {"content": prompt, "add_special": False, "parse_special": True})["tokens"]
        res = post(url, "/completion", {"prompt": prompt_ids, "n_predict": STEPS, "temperature": 0, "top_k": 1,
                                        "n_probs": TOP, "cache_prompt": False, "ignore_eos": True,
                                        "post_sampling_probs": False})
        steps = res["completion_probabilities"]
        greedy.append({"prompt": prompt, "prompt_ids": prompt_ids, "tokens": [s["id"] for s in steps],
                       "top": [[[t["id"], t["logprob"]] for t in s["top_logprobs"]] for s in steps]})
    data = json.load(open(out, encoding="utf-8")) if os.path.exists(out) else {}
    data.setdefault("about", "Recorded from llama.cpp's server by bench/record_llamacpp.py; see that script.")
    data["texts"] = texts
    data.setdefault("files", {})[label] = {"tokenize": ids, "not_nfc": not_nfc, "greedy": greedy}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    print(f"recorded llama.cpp on {label}: {len(texts)} texts, {len(PROMPTS)} greedy prompts -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
