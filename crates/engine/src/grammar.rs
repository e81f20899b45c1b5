//! Structured outputs with llguidance: the token environment over our tokenizer, one parser
//! factory per model (its token trie takes ~0.4 s to build, so it is built on first use), and a
//! matcher per constrained sequence that masks the logits before each sample.
//!
//! Written against `toktrie` directly rather than `toktrie_hf_tokenizers`, which pins an older
//! `tokenizers` (a second copy to compile) and would re-read a tokenizer.json we do not have: the
//! trie only needs every token's bytes, which our tokenizer already keeps.

use crate::lark;
use crate::tokenizer::TextTokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};
use tandem_core::inference::{Constraint, ConstraintKind, ReasoningParser};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// llguidance's view of the model's vocabulary.
struct Env {
    trie: TokTrie,
    tok: Arc<TextTokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Valid UTF-8 runs through the tokenizer; any other byte as its byte-level token. (A lossy
    /// conversion would turn a forced partial character into U+FFFD's token, which the grammar
    /// then rejects: found by the random-regex test.)
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let mut out = Vec::new();
        for chunk in s.utf8_chunks() {
            if !chunk.valid().is_empty() {
                out.extend(self.tok.encode(chunk.valid()).unwrap_or_default());
            }
            out.extend(chunk.invalid().iter().filter_map(|b| self.tok.token_id_for_bytes(&[*b])));
        }
        out
    }
}

/// The factory of one model, built on the first constrained request.
pub struct Grammars {
    tok: Arc<TextTokenizer>,
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
    /// The special tokens' texts and ids, which structural tags write as tokens.
    special: OnceLock<Vec<(String, u32)>>,
}

impl Grammars {
    pub fn new(tok: Arc<TextTokenizer>) -> Self {
        Grammars { tok, factory: OnceLock::new(), special: OnceLock::new() }
    }

    fn special(&self) -> &[(String, u32)] {
        self.special.get_or_init(|| {
            (0..self.tok.vocab_size() as u32)
                .filter(|&id| self.tok.is_special(id))
                .filter_map(|id| std::str::from_utf8(self.tok.token_bytes(id)).ok().map(|t| (t.to_string(), id)))
                .filter(|(t, _)| !t.is_empty())
                .collect()
        })
    }

    fn factory(&self) -> Result<&Arc<ParserFactory>, String> {
        self.factory
            .get_or_init(|| {
                let tok = &self.tok;
                // Special tokens enter the trie behind llguidance's marker byte, so that grammar
                // text never matches them; normal tokens as their raw bytes.
                let words: Vec<Vec<u8>> = (0..tok.vocab_size() as u32)
                    .map(|id| {
                        let bytes = tok.token_bytes(id);
                        if tok.is_special(id) {
                            [&[TokTrie::SPECIAL_TOKEN_MARKER][..], bytes].concat()
                        } else {
                            bytes.to_vec()
                        }
                    })
                    .collect();
                let mut info = TokRxInfo::new(tok.vocab_size() as u32, tok.eos_id);
                info.tok_bos = tok.bos_id;
                let env: TokEnv = Arc::new(Env { trie: TokTrie::from(&info, &words), tok: tok.clone() });
                let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                factory.set_stderr_log_level(0);
                // Every constrained sequence's mask is computed on the shared engine step, so a
                // grammar gets less than llguidance's defaults: a constraint that needs more is
                // refused when it is compiled (a 400 at submission, off the engine thread), or
                // ends its own request with finish_reason "abort" if it hits a limit later.
                // Compile-time limits stay at llguidance's defaults (large JSON schemas need them).
                let limits = factory.limits_mut();
                limits.step_lexer_fuel = 100_000; // ~7 ms of lexing per token (default 200k)
                limits.step_max_items = 30_000; // ~1.5 ms of Earley items per token (default 50k)
                limits.max_lexer_states = 50_000; // ~100 MB of lexer states per sequence (default 250k)
                limits.verbose_errors = false; // errors go to the client: no parser internals
                Ok(Arc::new(factory))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Whether `c` accepts exactly `tokens` and then the end of the output (tests and benches
    /// hold a constraint against a real vocabulary with it).
    pub fn accepts(&self, c: &Constraint, tokens: &[u32]) -> Result<bool, String> {
        let mut m = self.compile(c)?;
        Ok(matches!(m.try_consume_tokens(tokens), Ok(n) if n == tokens.len()) && m.is_accepting().unwrap_or(false))
    }

    /// A fresh matcher for `c`, or why the constraint is invalid.
    pub fn compile(&self, c: &Constraint) -> Result<Matcher, String> {
        let grammar = top_level(c, self.special())?;
        let factory = self.factory()?;
        // A trial run of the first mask, here on the caller's thread: a constraint whose lexer
        // blows past its per-token limits (the regex `a{1000}{1000}`, say) is refused now rather
        // than on the engine step. The trial spends that step's lexer fuel, so the sequence gets
        // a fresh matcher of the same grammar.
        let mut trial = Matcher::new(Ok(factory.create_parser(grammar.clone()).map_err(|e| e.to_string())?));
        if trial.get_error().is_none() {
            let _ = trial.compute_mask();
        }
        if let Some(e) = trial.get_error() {
            return Err(e);
        }
        let matcher = Matcher::new(Ok(factory.create_parser(grammar).map_err(|e| e.to_string())?));
        match matcher.get_error() {
            Some(e) => Err(e),
            None => Ok(matcher),
        }
    }
}

/// The llguidance grammar of a constraint.
fn top_level(c: &Constraint, special: &[(String, u32)]) -> Result<TopLevelGrammar, String> {
    if let Some(parser) = c.after_reasoning {
        let leading = parser == ReasoningParser::DeepSeekR1;
        return Ok(TopLevelGrammar::from_lark(lark::after_reasoning(&as_lark(c, special)?, leading)));
    }
    Ok(match &c.kind {
        ConstraintKind::Json(schema) => TopLevelGrammar::from_json_schema(json_options(c, schema.clone())?),
        ConstraintKind::JsonObject => TopLevelGrammar::from_json_schema(json_options(c, json!({"type": "object"}))?),
        ConstraintKind::Regex(rx) => TopLevelGrammar::from_regex(rx),
        ConstraintKind::Choice(choices) => TopLevelGrammar::from_regex(&choice_regex(choices)?),
        ConstraintKind::Grammar(text) => TopLevelGrammar::from_lark(text.clone()),
        ConstraintKind::StructuralTag(spec) => {
            TopLevelGrammar::from_lark(lark::structural_tag(spec, &|schema| json_options(c, schema), special)?)
        }
    })
}

/// The same constraint as one Lark expression, to be embedded in a larger grammar.
fn as_lark(c: &Constraint, special: &[(String, u32)]) -> Result<String, String> {
    Ok(match &c.kind {
        ConstraintKind::Json(schema) => format!("%json {}", json_options(c, schema.clone())?),
        ConstraintKind::JsonObject => format!("%json {}", json_options(c, json!({"type": "object"}))?),
        ConstraintKind::Regex(rx) => lark::regex_literal(rx),
        ConstraintKind::Choice(choices) => {
            choice_regex(choices)?;
            choices.iter().map(|s| lark::literal(s)).collect::<Vec<_>>().join(" | ")
        }
        ConstraintKind::Grammar(text) => format!("%lark {{\n{text}\n}}"),
        ConstraintKind::StructuralTag(spec) => {
            format!("%lark {{\n{}\n}}", lark::structural_tag(spec, &|schema| json_options(c, schema), special)?)
        }
    })
}

fn choice_regex(choices: &[String]) -> Result<String, String> {
    if choices.is_empty() {
        return Err("choice needs at least one string".into());
    }
    Ok(choices.iter().map(|s| escape_regex(s)).collect::<Vec<_>>().join("|"))
}

/// The schema with the request's JSON options attached the way llguidance reads them.
fn json_options(c: &Constraint, mut schema: Value) -> Result<Value, String> {
    if !schema.is_object() {
        return Err("a JSON schema must be an object".into());
    }
    if c.disable_additional_properties {
        close_objects(&mut schema);
    }
    let mut opts = json!({"whitespace_flexible": !c.disable_any_whitespace});
    if let Some(ws) = &c.whitespace_pattern {
        opts["whitespace_pattern"] = json!(ws);
    }
    schema["x-guidance"] = opts;
    Ok(schema)
}

/// Sets `additionalProperties: false` on every object schema that does not say otherwise
/// (vLLM's `disable_additional_properties`).
fn close_objects(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let is_object = map.get("type").and_then(Value::as_str) == Some("object") || map.contains_key("properties");
            if is_object && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (key, child) in map.iter_mut() {
                // Enumerated values and defaults are data, not schemas.
                if !matches!(key.as_str(), "enum" | "const" | "default" | "examples") {
                    close_objects(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// `s` as a regex matching exactly itself (the `regex` crate's metacharacters escaped; `<` and
/// `>` are left alone, since escaped they mean word boundaries).
fn escape_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for ch in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(ch) {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn constraint(kind: ConstraintKind) -> Constraint {
        Constraint {
            kind,
            disable_any_whitespace: false,
            disable_additional_properties: false,
            whitespace_pattern: None,
            field: "structured_outputs".into(),
            after_reasoning: None,
        }
    }

    #[test]
    fn closing_objects_reaches_nested_schemas_but_not_data() {
        let mut s = json!({"type": "object", "properties": {"a": {"type": "object"}, "b": {"enum": [{"type": "object"}]}},
                           "additionalProperties": true});
        close_objects(&mut s);
        assert_eq!(s["additionalProperties"], json!(true));
        assert_eq!(s["properties"]["a"]["additionalProperties"], json!(false));
        assert_eq!(s["properties"]["b"]["enum"][0], json!({"type": "object"}));
    }

    #[test]
    fn choices_become_an_escaped_alternation() {
        assert_eq!(escape_regex("a.b|c (d)"), "a\\.b\\|c \\(d\\)");
        assert!(top_level(&constraint(ConstraintKind::Choice(vec![])), &[]).is_err());
        assert!(top_level(&constraint(ConstraintKind::Json(json!(true))), &[]).is_err());
    }

    #[test]
    fn json_options_reach_x_guidance() {
        let mut c = constraint(ConstraintKind::Json(json!({"type": "object"})));
        c.disable_any_whitespace = true;
        c.whitespace_pattern = Some(" ?".into());
        let s = json_options(&c, json!({"type": "object"})).unwrap();
        assert_eq!(s["x-guidance"], json!({"whitespace_flexible": false, "whitespace_pattern": " ?"}));
    }
}
