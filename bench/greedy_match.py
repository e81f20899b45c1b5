"""Greedy output of tandem against llama.cpp's server on the same GGUF: the first tokens of a few
raw-text prompts, token by token.

    python bench/greedy_match.py TANDEM_URL LLAMA_URL [--key KEY] [--model ID] [--tokens 16]

For each prompt both servers decode greedily (tandem through `/v1/completions` with `logprobs`,
llama.cpp through its `/completion` with `n_probs`) and the script prints how many leading tokens
agree. Where they part, it prints both servers' two likeliest tokens there: two int8
implementations may swap a near-tie, and the margins show whether that is what happened.
Exits 0 always: this is a report, not a test.
"""
import argparse
import json
import urllib.request

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]


def post(url, path, body, key):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def tandem(url, key, model, text, n):
    out = post(url, "/v1/completions", {"model": model, "prompt": text, "max_tokens": n, "temperature": 0,
                                        "logprobs": 2, "ignore_eos": True}, key)
    lp = out["choices"][0]["logprobs"]
    return [(t, sorted(top.items(), key=lambda kv: -kv[1])) for t, top in zip(lp["tokens"], lp["top_logprobs"])]


def llama(url, key, text, n):
    out = post(url, "/completion", {"prompt": text, "n_predict": n, "temperature": 0, "top_k": 1, "n_probs": 2,
                                    "cache_prompt": False, "ignore_eos": True}, key)
    return [(p["token"], [(t["token"], t["logprob"]) for t in p["top_logprobs"]]) for p in out["completion_probabilities"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tandem")
    ap.add_argument("llama")
    ap.add_argument("--key", default="bench")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    model = args.model
    if model is None:
        req = urllib.request.Request(args.tandem + "/v1/models", headers={"Authorization": f"Bearer {args.key}"})
        with urllib.request.urlopen(req) as r:
            model = json.load(r)["data"][0]["id"]
    total = 0
    for text in PROMPTS:
        ours, theirs = tandem(args.tandem, args.key, model, text, args.tokens), llama(args.llama, args.key, text, args.tokens)
        agree = 0
        while agree < min(len(ours), len(theirs)) and ours[agree][0] == theirs[agree][0]:
            agree += 1
        total += agree
        line = f"{agree:2d}/{args.tokens} greedy tokens agree  {text!r} -> {''.join(t for t, _ in ours[:agree])!r}"
        if agree < min(len(ours), len(theirs)):
            fmt = lambda top: ", ".join(f"{t!r} {lp:.3f}" for t, lp in top[:2])  # noqa: E731
            line += f"\n      then tandem [{fmt(ours[agree][1])}] vs llama.cpp [{fmt(theirs[agree][1])}]"
        print(line)
    print(f"greedy agreement: {total}/{len(PROMPTS) * args.tokens} tokens")


if __name__ == "__main__":
    main()
