//! Streaming calls: what one choice has sent of its content and calls, and the pieces a longer
//! output adds. Text before the calls streams as content (held only while it may still be the
//! opener), each call's name once it is written, its arguments as they grow; every front (Chat
//! Completions deltas, Responses events, Anthropic `input_json_delta`) renders these pieces.

use super::{Call, ToolMode};
use tandem_core::tool_calls::scan;

/// One piece of a stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Content(String),
    /// A call begins: its index among the choice's calls, id and name.
    Name {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments.
    Arguments {
        index: usize,
        text: String,
    },
}

/// What one choice has sent.
#[derive(Debug, Default)]
pub struct Streamed {
    content: usize,
    calls: Vec<Sent>,
}

#[derive(Debug)]
struct Sent {
    id: String,
    named: bool,
    arguments: usize,
}

impl Streamed {
    /// The pieces `text` (the content part of the output so far) adds; `last` when the output is
    /// whole, with the calls it holds. A call cut short (by `max_tokens`) has streamed what it
    /// wrote and is no call of the finished reply, as in vLLM.
    pub fn advance(&mut self, mode: &ToolMode, text: &str, last: bool) -> (Vec<Piece>, Vec<Call>) {
        let found = scan(mode.family, text, last, &mode.names());
        let mut out = Vec::new();
        let content_end = if last && found.calls.is_empty() && !self.calls.is_empty() {
            self.content // the text after a cut call is not content
        } else {
            found.content_end
        };
        if content_end > self.content {
            out.push(Piece::Content(text[self.content..content_end].to_string()));
            self.content = content_end;
        }
        let limit = if mode.parallel { found.calls.len() } else { found.calls.len().min(1) };
        let mut calls = Vec::new();
        for (index, call) in found.calls.iter().take(limit).enumerate() {
            if index == self.calls.len() {
                self.calls.push(Sent { id: mode.family.call_id(), named: false, arguments: 0 });
            }
            let sent = &mut self.calls[index];
            let Some(name) = &call.name else { continue };
            if !sent.named {
                sent.named = true;
                out.push(Piece::Name { index, id: sent.id.clone(), name: name.clone() });
            }
            if call.arguments.len() > sent.arguments && call.arguments.is_char_boundary(sent.arguments) {
                out.push(Piece::Arguments { index, text: call.arguments[sent.arguments..].to_string() });
                sent.arguments = call.arguments.len();
            }
            if last {
                calls.push(Call { name: name.clone(), arguments: call.arguments.clone() });
            }
        }
        (out, calls)
    }
}
