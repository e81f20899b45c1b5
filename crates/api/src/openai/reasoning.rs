//! `--reasoning-parser`: the reasoning up to `</think>` is split off into `message.reasoning`
//! (streaming: `delta.reasoning`). With `think` (vLLM's qwen3 rule) only output that opens with
//! `<think>` reasons, other output is all content; with `deepseek_r1` the output starts inside the
//! reasoning (the template opened the tag, so writing it is optional) and, without `</think>`, is
//! all reasoning. Tool calls are parsed from the content part only.

use tandem_core::inference::{ConstraintKind, ReasoningParser};

const START: &str = "<think>";
const END: &str = "</think>";

/// Where the reasoning of `text` lies: (start of its body, end of the body, end of the block
/// with `</think>`), or None when the output does not reason.
fn block(parser: ReasoningParser, text: &str) -> Option<(usize, usize, usize)> {
    let lead = text.len() - text.trim_start().len();
    let start = match (parser, text[lead..].starts_with(START)) {
        (_, true) => lead + START.len(),
        (ReasoningParser::Think, false) => return None,
        (ReasoningParser::DeepSeekR1, false) => 0,
    };
    Some(match text[start..].find(END) {
        Some(i) => (start, start + i, start + i + END.len()),
        None => (start, text.len(), text.len()),
    })
}

/// (reasoning, content) of an output.
pub fn split(parser: ReasoningParser, text: &str) -> (Option<&str>, &str) {
    match block(parser, text) {
        Some((start, end, after)) => (Some(&text[start..end]), text[after..].trim_start()),
        None => (None, text),
    }
}

/// How many tokens wrote the reasoning block (its tags included) of `text`, where `ends[i]` is
/// the length of the text after token i: every token that starts before the block's end.
pub fn tokens(parser: ReasoningParser, text: &str, ends: &[usize]) -> usize {
    let Some((_, _, end)) = block(parser, text) else { return 0 };
    let mut start = 0;
    ends.iter()
        .take_while(|&&e| {
            let begins = start;
            start = e;
            begins < end
        })
        .count()
}

/// Whether a constraint spells out the reasoning block itself (a regex, grammar or tag that
/// writes `<think>`): it then covers the whole output, rather than what follows the reasoning.
pub fn scripts_reasoning(kind: &ConstraintKind) -> bool {
    match kind {
        ConstraintKind::Regex(text) | ConstraintKind::Grammar(text) => text.contains(START),
        ConstraintKind::StructuralTag(spec) => spec.to_string().contains(START),
        ConstraintKind::Choice(choices) => choices.iter().any(|c| c.contains(START)),
        ConstraintKind::Json(_) | ConstraintKind::JsonObject => false,
    }
}

/// What of a growing output can be shown while streaming: the text without a trailing partial
/// `<think>` or `</think>` (which the next token may complete).
pub fn stable(text: &str) -> &str {
    for marker in [START, END] {
        for k in (1..marker.len()).rev() {
            if text.ends_with(&marker[..k]) {
                return &text[..text.len() - k];
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    use ReasoningParser::{DeepSeekR1, Think};

    #[test]
    fn splits_reasoning_from_content() {
        for p in [Think, DeepSeekR1] {
            assert_eq!(split(p, "<think>2+2 is 4</think>\n\nFour."), (Some("2+2 is 4"), "Four."));
            assert_eq!(split(p, "\n<think>still thinking"), (Some("still thinking"), ""));
        }
        assert_eq!(split(Think, "No tags here </think>"), (None, "No tags here </think>"));
        assert_eq!(split(Think, ""), (None, ""));
        // DeepSeek-R1: the output starts inside the reasoning.
        assert_eq!(split(DeepSeekR1, "2+2 is 4</think>Four."), (Some("2+2 is 4"), "Four."));
        assert_eq!(split(DeepSeekR1, "still thinking"), (Some("still thinking"), ""));
        assert_eq!(split(DeepSeekR1, ""), (Some(""), ""));
    }

    #[test]
    fn reasoning_tokens_are_those_that_start_before_the_block_ends() {
        // Tokens: "<think>" "a b" "</think>" "\n\nFour" "." and an empty EOS.
        let text = "<think>a b</think>\n\nFour.";
        let ends = [7, 10, 18, 24, 25, 25];
        assert_eq!(tokens(Think, text, &ends), 3);
        // A token that straddles the end counts as reasoning.
        assert_eq!(tokens(Think, text, &[7, 12, 25, 25]), 3);
        // Unclosed: every token that wrote text; no block: none.
        assert_eq!(tokens(Think, "<think>still", &[5, 12, 12]), 2);
        assert_eq!(tokens(Think, "Four.", &[4, 5]), 0);
        assert_eq!(tokens(DeepSeekR1, "hm</think>Four.", &[2, 10, 15]), 2);
    }

    #[test]
    fn streaming_holds_back_partial_markers() {
        assert_eq!(stable("<thi"), "");
        assert_eq!(stable("<think>abc</th"), "<think>abc");
        assert_eq!(stable("a < b"), "a < b");
        assert_eq!(stable("x<"), "x");
    }
}
