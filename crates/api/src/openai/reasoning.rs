//! `--reasoning-parser think`: output that opens with `<think>` has its reasoning up to
//! `</think>` split off into `message.reasoning` (streaming: `delta.reasoning`), as vLLM's qwen3
//! parser does. Output that does not open with the tag is all content. Tool calls are parsed from
//! the content part only.

const START: &str = "<think>";
const END: &str = "</think>";

/// (reasoning, content) of an output.
pub fn split(text: &str) -> (Option<&str>, &str) {
    let t = text.trim_start();
    let Some(body) = t.strip_prefix(START) else { return (None, text) };
    match body.find(END) {
        Some(i) => (Some(&body[..i]), body[i + END.len()..].trim_start()),
        None => (Some(body), ""),
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

    #[test]
    fn splits_reasoning_from_content() {
        assert_eq!(split("<think>2+2 is 4</think>\n\nFour."), (Some("2+2 is 4"), "Four."));
        assert_eq!(split("\n<think>still thinking"), (Some("still thinking"), ""));
        assert_eq!(split("No tags here </think>"), (None, "No tags here </think>"));
        assert_eq!(split(""), (None, ""));
    }

    #[test]
    fn streaming_holds_back_partial_markers() {
        assert_eq!(stable("<thi"), "");
        assert_eq!(stable("<think>abc</th"), "<think>abc");
        assert_eq!(stable("a < b"), "a < b");
        assert_eq!(stable("x<"), "x");
    }
}
