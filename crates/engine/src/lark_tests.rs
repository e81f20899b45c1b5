//! Structural tags compiled and run through llguidance over a byte-level vocabulary (one token
//! per byte, plus EOS), so each test says exactly which strings the grammar accepts.

use super::*;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::json;
use std::sync::{Arc, OnceLock};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

const EOS: u32 = 256;
/// A special token, `[T]`, as Mistral's `[TOOL_CALLS]` is one.
const SPECIAL: u32 = 257;

struct Bytes(TokTrie);

impl TokenizerEnv for Bytes {
    fn tok_trie(&self) -> &TokTrie {
        &self.0
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        s.iter().map(|&b| b as u32).collect()
    }
}

fn factory() -> &'static ParserFactory {
    static F: OnceLock<ParserFactory> = OnceLock::new();
    F.get_or_init(|| {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(vec![TokTrie::SPECIAL_TOKEN_MARKER, b'E']);
        words.push([&[TokTrie::SPECIAL_TOKEN_MARKER][..], b"[T]"].concat());
        let info = TokRxInfo::new(words.len() as u32, EOS);
        let env: TokEnv = Arc::new(Bytes(TokTrie::from(&info, &words)));
        let mut f = ParserFactory::new_simple(&env).unwrap();
        f.set_stderr_log_level(0);
        f
    })
}

fn lark(spec: Value) -> String {
    structural_tag(&spec, &|s| Ok(s), &[]).unwrap()
}

/// Whether the grammar accepts exactly `text` (every byte allowed, then the end).
fn accepts(grammar: &str, text: &str) -> bool {
    accepts_tokens(grammar, &text.bytes().map(u32::from).collect::<Vec<_>>())
}

/// Whether the grammar accepts exactly these tokens.
fn accepts_tokens(grammar: &str, tokens: &[u32]) -> bool {
    let parser = factory().create_parser(TopLevelGrammar::from_lark(grammar.to_string())).unwrap();
    let mut m = Matcher::new(Ok(parser));
    assert_eq!(m.get_error(), None, "{grammar}");
    matches!(m.try_consume_tokens(tokens), Ok(n) if n == tokens.len()) && m.is_accepting().unwrap_or(false)
}

/// Text as byte tokens, with `[T]` written as the special token.
fn with_special(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for (k, part) in text.split("[T]").enumerate() {
        if k > 0 {
            out.push(SPECIAL);
        }
        out.extend(part.bytes().map(u32::from));
    }
    out
}

#[test]
fn a_special_tokens_text_in_a_tag_means_the_token() {
    let special = [("[T]".to_string(), SPECIAL)];
    let spec = json!({"format": {"type": "triggered_tags", "triggers": ["[T]"], "stop_after_first": true, "tags": [
        {"begin": "[T][", "content": {"type": "json_schema", "json_schema": call_schema()}, "end": "]"}]}});
    let g = structural_tag(&spec, &|s| Ok(s), &special).unwrap();
    assert!(accepts_tokens(&g, &with_special("sure [T][{\"city\": \"Oslo\"}]")));
    assert!(accepts_tokens(&g, &with_special("no call")));
    assert!(!accepts_tokens(&g, &with_special("[T][{\"town\": \"Oslo\"}]")), "the token commits to a call");
    // Spelled out as characters it is neither the token nor free text.
    assert!(!accepts(&g, "[T][{\"city\": \"Oslo\"}]"));
    let required = json!({"format": {"type": "sequence", "elements": [{"type": "const_string", "value": "[T]["},
        {"type": "json_schema", "json_schema": call_schema()}, {"type": "const_string", "value": "]"}]}});
    let g = structural_tag(&required, &|s| Ok(s), &special).unwrap();
    assert!(accepts_tokens(&g, &with_special("[T][{\"city\":\"Rome\"}]")));
    assert!(!accepts(&g, "[T][{\"city\":\"Rome\"}]"));
}

#[test]
fn a_whitespace_pattern_bounds_the_blank_space_between_json_tokens() {
    let mut schema = call_schema();
    schema["x-guidance"] = json!({"whitespace_flexible": true, "whitespace_pattern": "( |\\n[ \\t]{0,20})?"});
    let spec = json!({"format": {"type": "json_schema", "json_schema": schema}});
    let g = structural_tag(&spec, &|s| Ok(s), &[]).unwrap();
    assert!(accepts(&g, "{\"city\": \"Oslo\"}"));
    assert!(accepts(&g, "{\n  \"city\": \"Oslo\"\n}"));
    assert!(!accepts(&g, "{\n\n\"city\": \"Oslo\"}"), "one newline at most");
    assert!(!accepts(&g, &format!("{{\n{}\"city\": \"Oslo\"}}", " ".repeat(21))), "20 spaces at most");
}

fn call_schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false})
}

#[test]
fn legacy_triggers_open_their_structures_anywhere_in_free_text() {
    let g = lark(json!({
        "type": "structural_tag",
        "structures": [
            {"begin": "<function=weather>", "schema": call_schema(), "end": "</function>"},
            {"begin": "<function=time>", "schema": {"type": "object"}, "end": "</function>"}
        ],
        "triggers": ["<function="]
    }));
    assert!(accepts(&g, ""));
    assert!(accepts(&g, "no call at all, just text\nover lines"));
    assert!(accepts(&g, "<function=weather>{\"city\": \"Paris\"}</function>"));
    assert!(accepts(
        &g,
        "let me check <function=weather>{\"city\":\"Oslo\"}</function> and <function=time>{}</function> done"
    ));
    // The trigger commits to a structure: unknown name, bad arguments or no end are rejected.
    assert!(!accepts(&g, "see <function=other>{}</function>"));
    assert!(!accepts(&g, "<function=weather>{\"town\": \"Paris\"}</function>"));
    assert!(!accepts(&g, "<function=weather>{\"city\": \"Paris\"}"));
    // Text that merely resembles the trigger stays free.
    assert!(accepts(&g, "a <function is not a call"));
}

#[test]
fn tags_with_free_text_content_end_at_the_first_end_string() {
    let g = lark(json!({"format": {"type": "sequence", "elements": [
        {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
        {"type": "const_string", "value": "Answer: "},
        {"type": "regex", "pattern": "[0-9]+"}
    ]}}));
    assert!(accepts(&g, "<think>two plus two</think>Answer: 4"));
    assert!(accepts(&g, "<think></think>Answer: 42"));
    assert!(accepts(&g, "<think>a < b </thin k></think>Answer: 1"));
    assert!(!accepts(&g, "<think>x</think>y</think>Answer: 4"));
    assert!(!accepts(&g, "<think>x</think>Answer: four"));
    assert!(!accepts(&g, "Answer: 4"));
}

#[test]
fn excluded_strings_cannot_appear_in_free_text() {
    let g = lark(
        json!({"format": {"type": "tag", "begin": "[", "content": {"type": "any_text", "excluded_str": ["BAD"]}, "end": "]"}}),
    );
    assert!(accepts(&g, "[fine text]"));
    assert!(!accepts(&g, "[a BAD word]"));
    let g = lark(json!({"format": {"type": "any_text", "excluded_str": ["BAD"]}}));
    assert!(accepts(&g, "anything good"));
    assert!(!accepts(&g, "so BAD"));
}

#[test]
fn at_least_one_and_stop_after_first_shape_triggered_tags() {
    let tags = json!([{"begin": "<a>", "content": {"type": "const_string", "value": "x"}, "end": "</a>"}]);
    let build = |at_least_one: bool, stop: bool| {
        lark(json!({"format": {"type": "triggered_tags", "triggers": ["<a"], "tags": tags,
                               "at_least_one": at_least_one, "stop_after_first": stop}}))
    };
    let plain = build(false, false);
    assert!(accepts(&plain, "t <a>x</a> u <a>x</a> v"));
    let first = build(true, false);
    assert!(!accepts(&first, "text first"));
    assert!(accepts(&first, "<a>x</a> then text <a>x</a>"));
    let only = build(true, true);
    assert!(accepts(&only, "<a>x</a>"));
    assert!(!accepts(&only, "<a>x</a> more"));
    let at_most = build(false, true);
    assert!(accepts(&at_most, "text <a>x</a>"));
    assert!(accepts(&at_most, "just text"));
    assert!(!accepts(&at_most, "text <a>x</a> more"));
}

#[test]
fn tags_with_separator_allow_only_tags_and_separators() {
    let tag = json!({"begin": "{", "content": {"type": "json_schema", "json_schema": {"type": "integer"}}, "end": "}"});
    let g = lark(json!({"format": {"type": "tags_with_separator", "tags": [tag], "separator": ","}}));
    assert!(accepts(&g, ""));
    assert!(accepts(&g, "{1},{2},{3}"));
    assert!(!accepts(&g, "{1} {2}"));
    let g =
        lark(json!({"format": {"type": "tags_with_separator", "tags": [tag], "separator": ",", "at_least_one": true}}));
    assert!(!accepts(&g, ""));
}

#[test]
fn or_grammar_and_regex_with_slashes_compile() {
    let g = lark(json!({"format": {"type": "or", "elements": [
        {"type": "regex", "pattern": "a/b+"},
        {"type": "grammar", "grammar": "start: \"yes\" | \"no\""}
    ]}}));
    assert!(accepts(&g, "a/bbb"));
    assert!(accepts(&g, "no"));
    assert!(!accepts(&g, "maybe"));
}

#[test]
fn malformed_specs_say_what_is_wrong() {
    let err = |spec: Value| structural_tag(&spec, &|s| Ok(s), &[]).unwrap_err();
    assert!(err(json!({"type": "structural_tag"})).contains("format"));
    assert!(err(json!({"structures": [{"begin": "<b>", "schema": {}, "end": "</b>"}], "triggers": ["<a"]}))
        .contains("exactly one"));
    assert!(err(json!({"format": {"type": "sparkles"}})).contains("sparkles"));
    assert!(err(json!({"format": {"type": "sequence", "elements": []}})).contains("elements"));
    assert!(err(json!({"format": {"type": "triggered_tags", "triggers": [""], "tags": [{"begin": "", "content": {"type": "any_text"}, "end": ""}]}})).contains("empty"));
}

#[test]
fn a_reasoning_block_may_precede_any_constraint() {
    let choice = after_reasoning(&format!("{} | {}", literal("yes"), literal("no")), false);
    assert!(accepts(&choice, "yes"));
    assert!(accepts(&choice, "<think>is it? maybe</think>\n\nno"));
    assert!(accepts(&choice, "\n<think></think>yes"));
    assert!(!accepts(&choice, "<think>a</think>maybe"));
    assert!(!accepts(&choice, "<think>a</think>b</think>yes"));
    assert!(!accepts(&choice, "well, yes"));
    let rx = after_reasoning(&regex_literal("[0-9]+/[0-9]+"), false);
    assert!(accepts(&rx, "<think>a fraction</think> 3/4"));
    assert!(!accepts(&rx, "<think>a fraction</think> 3/x"));
    let json = after_reasoning(&format!("%json {}", call_schema()), false);
    assert!(accepts(&json, "<think>Paris, surely</think>\n{\"city\": \"Paris\"}"));
    assert!(!accepts(&json, "<think>Paris</think>{\"town\": \"Paris\"}"));
    let nested = structural_tag(&json!({"format": {"type": "const_string", "value": "ok"}}), &|s| Ok(s), &[]).unwrap();
    let nested = after_reasoning(&format!("%lark {{\n{nested}\n}}"), false);
    assert!(accepts(&nested, "<think>x</think>ok"));
    assert!(!accepts(&nested, "<think>x</think>ko"));
}

#[test]
fn deepseek_r1_output_reasons_first_with_or_without_the_opening_tag() {
    let g = after_reasoning(&format!("{} | {}", literal("yes"), literal("no")), true);
    assert!(accepts(&g, "hmm, blue sky</think>\n\nyes"));
    assert!(accepts(&g, "<think>hmm</think>no"));
    assert!(!accepts(&g, "yes"));
    assert!(!accepts(&g, "hmm</think>maybe"));
}

#[test]
fn where_the_output_may_end_every_end_token_is_allowed() {
    // The model's own end of turn (here `[T]`) ends a complete output as EOS does; before the
    // output is complete it is masked, and so is any other token after it.
    use crate::sequence::{constrain, Ends};
    let parser = factory().create_parser(TopLevelGrammar::from_lark("start: \"ab\"".into())).unwrap();
    let mut m = Matcher::new(Ok(parser));
    let ends = Ends { eos: EOS, others: &[EOS, SPECIAL], stops: &[] };
    let mut logits = vec![0.0f32; 258];
    constrain(&mut m, &mut logits, &ends).unwrap();
    assert_eq!(logits[b'a' as usize], 0.0);
    assert!(logits[SPECIAL as usize].is_infinite() && logits[EOS as usize].is_infinite());
    m.consume_tokens(&[u32::from(b'a'), u32::from(b'b')]).unwrap();
    let mut logits = vec![0.0f32; 258];
    constrain(&mut m, &mut logits, &ends).unwrap();
    assert_eq!((logits[SPECIAL as usize], logits[EOS as usize]), (0.0, 0.0));
    assert!(logits[b'a' as usize].is_infinite());
    // A request's stop id is an end too.
    let mut logits = vec![0.0f32; 258];
    constrain(&mut m, &mut logits, &Ends { eos: EOS, others: &[EOS], stops: &[b'z'.into()] }).unwrap();
    assert_eq!((logits[b'z' as usize], logits[SPECIAL as usize]), (0.0, f32::NEG_INFINITY));
}
