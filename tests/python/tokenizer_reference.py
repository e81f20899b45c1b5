"""Hugging Face's references for the tokenizer and chat-template parity tests.

Writes one JSON file with:
- `families`: per family, the ids Hugging Face's own `tokenizers` gives each text of
  tests/data/tokenizer_corpus.json from the family's real tokenizer.json (no special tokens
  added, as tandem's `encode`);
- `templates`: per chat template (Qwen3's and Llama 3's from their tokenizer_config.json, and the
  Qwen2.5 GGUF's when given), each case of tests/data/template_cases.json rendered by Python's
  jinja2 the way transformers' `apply_chat_template` sets it up (sandboxed, trim_blocks,
  lstrip_blocks, loop controls, its `tojson`, `raise_exception`, `strftime_now`); a case the
  template refuses records the error.

crates/engine/tests/real_tokenizers.rs checks tandem against both.

    python tests/python/tokenizer_reference.py TOKENIZERS_DIR OUT [QWEN25_GGUF]
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def environment():
    # As transformers' _compile_jinja_template: the same options, filter and globals.
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render(source, case, bos):
    template = environment().from_string(source)
    try:
        return {"text": template.render(messages=case["messages"], tools=case.get("tools"),
                                         add_generation_prompt=case["add_generation_prompt"], bos_token=bos,
                                         eos_token="", **case.get("kwargs", {}))}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def main():
    root, out = sys.argv[1:3]
    texts = json.load(open(os.path.join(ROOT, "tests/data/tokenizer_corpus.json"), encoding="utf-8"))["texts"]
    cases = json.load(open(os.path.join(ROOT, "tests/data/template_cases.json"), encoding="utf-8"))["cases"]
    result = {"tokenizers_version": tokenizers.__version__, "jinja2_version": jinja2.__version__,
              "families": {}, "templates": {}}
    for name in ("qwen3", "llama3"):
        tok = tokenizers.Tokenizer.from_file(f"{root}/{name}/tokenizer.json")
        result["families"][name] = [tok.encode(t, add_special_tokens=False).ids for t in texts]
        config = json.load(open(f"{root}/{name}/tokenizer_config.json", encoding="utf-8"))
        bos = config.get("bos_token") or ""
        result["templates"][name] = {"source": config["chat_template"], "bos_token": bos,
                                     "renders": [render(config["chat_template"], c, bos) for c in cases]}
    if len(sys.argv) > 3 and os.path.exists(sys.argv[3]):
        from gguf import GGUFReader

        source = GGUFReader(sys.argv[3]).fields["tokenizer.chat_template"].contents()
        result["templates"]["qwen2.5"] = {"source": source, "bos_token": "",
                                          "renders": [render(source, c, "") for c in cases]}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)
    print(f"reference: {len(texts)} texts x {len(result['families'])} tokenizers ({tokenizers.__version__}), "
          f"{len(cases)} cases x {len(result['templates'])} templates (jinja2 {jinja2.__version__}) -> {out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
