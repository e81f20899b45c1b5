//! Trajectories as a person reads them (the dashboard's trajectory browser): each trajectory's
//! conversation as chat messages with tool calls, whatever shape ART recorded it in
//! (`messages_and_choices`, `additional_histories` or 0.5.23's `exchanges`), and the token
//! sequences it trains on, with the sampled tokens' logprobs. Pure: the caller supplies the
//! sequences and the tokenizer's text for each token.

use serde::Serialize;
use serde_json::{Map, Value};
use tandem_core::chat::content_text;
use tandem_core::sequences::Sequence;
use utoipa::ToSchema;

/// A page of a log's or a job's groups.
#[derive(Debug, Serialize, ToSchema)]
pub struct TrajectoriesView {
    /// Groups in the log or job.
    pub total_groups: usize,
    /// The index of the first group of this page.
    pub offset: usize,
    pub groups: Vec<GroupView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GroupView {
    /// The group's index in the log or job.
    pub index: usize,
    /// The group's own `metrics` and `metadata`, as submitted.
    #[schema(value_type = Object)]
    pub metrics: Map<String, Value>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    pub trajectories: Vec<TrajectoryView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TrajectoryView {
    /// The trajectory's index in its group.
    pub index: usize,
    pub reward: f64,
    #[schema(value_type = Object)]
    pub metrics: Map<String, Value>,
    #[schema(value_type = Object)]
    pub metadata: Map<String, Value>,
    /// The main conversation first, then each additional history (or, for `exchanges`, the
    /// conversation of the last call to the trained model).
    pub histories: Vec<HistoryView>,
    /// Calls recorded in `exchanges` (0 for a `messages_and_choices` trajectory).
    pub exchanges: usize,
    /// The token sequences the trainer trains on, as runs: context text, and each sampled
    /// (trained) token with its logprob.
    pub sequences: Vec<Vec<TokenRun>>,
    /// Why there are no sequences, when they could not be made.
    pub sequences_error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryView {
    pub messages: Vec<MessageView>,
    /// The names of the tools offered.
    pub tools: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct MessageView {
    /// `system`, `user`, `assistant`, `tool`, or `prompt`/`completion` for a completions call
    /// and `reasoning` for reasoning output.
    pub role: String,
    pub content: String,
    pub tool_calls: Vec<ToolCallView>,
    /// A tool result's call id.
    pub tool_call_id: Option<String>,
    /// Sampled from the model (a Choice, or a recorded response), not written by the caller.
    pub sampled: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ToolCallView {
    pub name: String,
    pub arguments: String,
}

/// A run of tokens: context (not trained) merged into one run, or one trained token.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TokenRun {
    pub text: String,
    pub trained: bool,
    /// The sampling logprob of a trained token (absent when unknown).
    pub logprob: Option<f64>,
}

/// The runs of one sequence. `texts` holds each token's text, in order.
pub fn token_runs(seq: &Sequence, texts: &[String]) -> Vec<TokenRun> {
    let mut out: Vec<TokenRun> = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let trained = seq.trained.get(i).copied().unwrap_or(false);
        if trained {
            let lp = seq.old_lp.get(i).copied().filter(|l| l.is_finite());
            out.push(TokenRun { text: text.clone(), trained: true, logprob: lp });
            continue;
        }
        match out.last_mut() {
            Some(run) if !run.trained => run.text.push_str(text),
            _ => out.push(TokenRun { text: text.clone(), trained: false, logprob: None }),
        }
    }
    out
}

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

fn object(v: Option<&Value>) -> Map<String, Value> {
    v.and_then(Value::as_object).cloned().unwrap_or_default()
}

/// A value as text: strings as they are, anything else as compact JSON.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn message(role: &str, content: String, sampled: bool) -> MessageView {
    MessageView { role: role.to_string(), content, tool_calls: Vec::new(), tool_call_id: None, sampled }
}

/// An OpenAI chat message (what `messages_and_choices` and chat requests hold).
fn chat_message(m: &Value, sampled: bool) -> MessageView {
    let role = str_of(m, "role").unwrap_or_else(|| "assistant".into());
    let mut content = content_text(m.get("content").unwrap_or(&Value::Null));
    if let Some(reasoning) = m.get("reasoning_content").or_else(|| m.get("reasoning")).and_then(Value::as_str) {
        content = format!("<think>{reasoning}</think>{content}");
    }
    let tool_calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| ToolCallView {
                    name: str_of(&c["function"], "name").unwrap_or_default(),
                    arguments: text_of(&c["function"]["arguments"]),
                })
                .collect()
        })
        .unwrap_or_default();
    MessageView { role, content, tool_calls, tool_call_id: str_of(m, "tool_call_id"), sampled }
}

fn tool_names(tools: Option<&Value>) -> Vec<String> {
    let Some(list) = tools.and_then(Value::as_array) else { return Vec::new() };
    list.iter()
        .filter_map(|t| t["function"]["name"].as_str().or_else(|| t["name"].as_str()).map(str::to_string))
        .collect()
}

/// A Choice in `messages_and_choices` (ART's test: `index`, `finish_reason`, `message`, no
/// `role`).
fn is_choice(item: &Value) -> bool {
    item.get("message").is_some() && item.get("role").is_none()
}

fn history(items: &[Value], tools: Option<&Value>) -> HistoryView {
    let messages = items
        .iter()
        .map(|item| if is_choice(item) { chat_message(&item["message"], true) } else { chat_message(item, false) })
        .collect();
    HistoryView { messages, tools: tool_names(tools) }
}

/// Anthropic content blocks (a request message's or a response's).
fn anthropic_blocks(role: &str, content: &Value, sampled: bool, out: &mut Vec<MessageView>) {
    let Some(blocks) = content.as_array() else {
        out.push(message(role, text_of(content), sampled));
        return;
    };
    let mut m = message(role, String::new(), sampled);
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => m.content.push_str(b["text"].as_str().unwrap_or_default()),
            Some("thinking") => {
                m.content.push_str(&format!("<think>{}</think>", b["thinking"].as_str().unwrap_or_default()))
            }
            Some("tool_use") => m.tool_calls.push(ToolCallView {
                name: str_of(b, "name").unwrap_or_default(),
                arguments: b.get("input").map(Value::to_string).unwrap_or_default(),
            }),
            Some("tool_result") => {
                let mut r = message("tool", content_text(b.get("content").unwrap_or(&Value::Null)), sampled);
                r.tool_call_id = str_of(b, "tool_use_id");
                out.push(r);
            }
            _ => m.content.push_str(&b.to_string()),
        }
    }
    if !m.content.is_empty() || !m.tool_calls.is_empty() {
        out.push(m);
    }
}

/// A Responses input or output item.
fn responses_item(item: &Value, sampled: bool, out: &mut Vec<MessageView>) {
    match item["type"].as_str() {
        Some("function_call") => {
            let mut m = message("assistant", String::new(), sampled);
            m.tool_calls.push(ToolCallView {
                name: str_of(item, "name").unwrap_or_default(),
                arguments: text_of(&item["arguments"]),
            });
            out.push(m);
        }
        Some("function_call_output") => {
            let mut m = message("tool", text_of(&item["output"]), sampled);
            m.tool_call_id = str_of(item, "call_id");
            out.push(m);
        }
        Some("reasoning") => {
            let text: Vec<String> = ["content", "summary"]
                .iter()
                .filter_map(|k| item[*k].as_array())
                .flatten()
                .filter_map(|p| p["text"].as_str().map(str::to_string))
                .collect();
            out.push(message("reasoning", text.join("\n"), sampled));
        }
        _ => {
            let role = str_of(item, "role").unwrap_or_else(|| "assistant".into());
            out.push(message(&role, content_text(item.get("content").unwrap_or(&Value::Null)), sampled));
        }
    }
}

/// The conversation of one recorded call: its request, then what the model answered.
fn exchange_history(kind: &str, x: &Value) -> HistoryView {
    let (req, resp) = (&x["request"], &x["response"]);
    let mut messages = Vec::new();
    match kind {
        "chat_completions" => {
            messages.extend(req["messages"].as_array().into_iter().flatten().map(|m| chat_message(m, false)));
            if let Some(choice) = resp["choices"].as_array().and_then(|c| c.first()) {
                messages.push(chat_message(&choice["message"], true));
            }
        }
        "completions" => {
            messages.push(message("prompt", text_of(&req["prompt"]), false));
            if let Some(choice) = resp["choices"].as_array().and_then(|c| c.first()) {
                messages.push(message("completion", text_of(&choice["text"]), true));
            }
        }
        "responses" => {
            if let Some(instructions) = req["instructions"].as_str() {
                messages.push(message("system", instructions.to_string(), false));
            }
            match &req["input"] {
                Value::Array(items) => items.iter().for_each(|i| responses_item(i, false, &mut messages)),
                other => messages.push(message("user", text_of(other), false)),
            }
            resp["output"].as_array().into_iter().flatten().for_each(|i| responses_item(i, true, &mut messages));
        }
        _ => {
            if !req["system"].is_null() {
                messages.push(message("system", content_text(&req["system"]), false));
            }
            for m in req["messages"].as_array().into_iter().flatten() {
                anthropic_blocks(m["role"].as_str().unwrap_or("user"), &m["content"], false, &mut messages);
            }
            anthropic_blocks("assistant", &resp["content"], true, &mut messages);
        }
    }
    HistoryView { messages, tools: tool_names(req.get("tools")) }
}

/// The conversation(s) of one trajectory, and how many exchanges it recorded. Of `exchanges`,
/// the last call to the trained model (`is_trained`) is shown, as it holds the conversation so
/// far (or the last call of all, when none names the model).
pub fn histories(traj: &Value, is_trained: &dyn Fn(&str) -> bool) -> (Vec<HistoryView>, usize) {
    let mut calls: Vec<(&str, &Value)> = Vec::new();
    if let Some(x) = traj.get("exchanges").and_then(Value::as_object) {
        for kind in tandem_core::sequences::EXCHANGE_KINDS {
            calls.extend(x.get(kind).and_then(Value::as_array).into_iter().flatten().map(|c| (kind, c)));
        }
    }
    if !calls.is_empty() {
        // In time order, as the trainer takes them (RFC 3339 times do not sort as text).
        calls.sort_by_key(|(_, c)| tandem_core::sequences::exchange_times(c));
        let model = |c: &Value| c["request"]["model"].as_str().or(c["response"]["model"].as_str()).map(is_trained);
        let last = calls.iter().rev().find(|(_, c)| model(c) == Some(true)).or(calls.last());
        let shown = last.map(|(kind, c)| exchange_history(kind, c)).into_iter().collect();
        return (shown, calls.len());
    }
    let empty = Vec::new();
    let items = traj.get("messages_and_choices").and_then(Value::as_array).unwrap_or(&empty);
    let mut out = vec![history(items, traj.get("tools"))];
    for h in traj.get("additional_histories").and_then(Value::as_array).into_iter().flatten() {
        out.push(history(h.get("messages_and_choices").and_then(Value::as_array).unwrap_or(&empty), h.get("tools")));
    }
    (out, 0)
}

/// A trajectory's view without its sequences (the caller adds them).
pub fn trajectory(index: usize, traj: &Value, is_trained: &dyn Fn(&str) -> bool) -> TrajectoryView {
    let (histories, exchanges) = histories(traj, is_trained);
    TrajectoryView {
        index,
        reward: traj.get("reward").and_then(Value::as_f64).unwrap_or(0.0),
        metrics: object(traj.get("metrics")),
        metadata: object(traj.get("metadata")),
        histories,
        exchanges,
        sequences: Vec::new(),
        sequences_error: None,
    }
}

/// A group's view with its trajectories' (without sequences).
pub fn group(index: usize, g: &Value, is_trained: &dyn Fn(&str) -> bool) -> GroupView {
    let trajectories = g
        .get("trajectories")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| trajectory(i, t, is_trained))
        .collect();
    GroupView { index, metrics: object(g.get("metrics")), metadata: object(g.get("metadata")), trajectories }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn context_merges_and_sampled_tokens_keep_their_logprobs() {
        let seq = Sequence {
            tokens: vec![1, 2, 3, 4],
            trained: vec![false, false, true, true],
            old_lp: vec![f64::NAN, f64::NAN, -0.5, f64::NAN],
        };
        let texts: Vec<String> = ["<s>", "Hi", " yes", "!"].iter().map(|s| s.to_string()).collect();
        let runs = token_runs(&seq, &texts);
        assert_eq!(
            runs,
            vec![
                TokenRun { text: "<s>Hi".into(), trained: false, logprob: None },
                TokenRun { text: " yes".into(), trained: true, logprob: Some(-0.5) },
                TokenRun { text: "!".into(), trained: true, logprob: None },
            ]
        );
    }

    #[test]
    fn messages_and_choices_become_a_chat_with_tools_and_sampled_turns() {
        let traj = json!({
            "reward": 0.5,
            "metrics": {"correct": 1},
            "tools": [{"type": "function", "function": {"name": "lookup"}}],
            "messages_and_choices": [
                {"role": "user", "content": [{"type": "text", "text": "Find it"}]},
                {"index": 0, "finish_reason": "tool_calls", "logprobs": null,
                 "message": {"role": "assistant", "content": null,
                             "tool_calls": [{"id": "c1", "type": "function",
                                             "function": {"name": "lookup", "arguments": "{\"q\":1}"}}]}},
                {"role": "tool", "tool_call_id": "c1", "content": "found"}
            ],
            "additional_histories": [{"messages_and_choices": [{"role": "user", "content": "judge"}]}]
        });
        let v = trajectory(3, &traj, &|_| true);
        assert_eq!((v.index, v.reward, v.exchanges, v.histories.len()), (3, 0.5, 0, 2));
        let h = &v.histories[0];
        assert_eq!(h.tools, ["lookup"]);
        assert_eq!(
            (h.messages[0].role.as_str(), h.messages[0].content.as_str(), h.messages[0].sampled),
            ("user", "Find it", false)
        );
        assert!(h.messages[1].sampled);
        assert_eq!(h.messages[1].tool_calls, [ToolCallView { name: "lookup".into(), arguments: "{\"q\":1}".into() }]);
        assert_eq!((h.messages[2].role.as_str(), h.messages[2].tool_call_id.as_deref()), ("tool", Some("c1")));
        assert_eq!(v.histories[1].messages[0].content, "judge");
        assert_eq!(v.metrics["correct"], json!(1));
    }

    #[test]
    fn exchanges_show_the_last_call_to_the_trained_model() {
        let chat = |t: &str, model: &str, answer: &str| {
            json!({"start_time": t, "request": {"model": model, "messages": [{"role": "user", "content": "q"}]},
                   "response": {"choices": [{"message": {"role": "assistant", "content": answer}}]}})
        };
        let traj = json!({"reward": 1.0, "exchanges": {
            "chat_completions": [chat("2026-01-01T00:00:02Z", "judge", "graded"), chat("2026-01-01T00:00:01.5Z", "e/p/m", "mine"),
                                 chat("2026-01-01T00:00:01Z", "e/p/m", "earlier")],
            "messages": [{"start_time": "2026-01-01T00:00:00Z", "request": {"model": "e/p/m", "system": "s",
                "messages": [{"role": "user", "content": "hi"}]},
                "response": {"content": [{"type": "text", "text": "a"}, {"type": "tool_use", "name": "f", "input": {"x": 1}}]}}]
        }});
        let v = trajectory(0, &traj, &|m| m == "e/p/m");
        assert_eq!(v.exchanges, 4);
        let msgs = &v.histories[0].messages;
        assert_eq!(msgs.last().map(|m| (m.content.as_str(), m.sampled)), Some(("mine", true)));

        let only_messages = json!({"exchanges": {"messages": traj["exchanges"]["messages"]}});
        let v = trajectory(0, &only_messages, &|m| m == "e/p/m");
        let msgs = &v.histories[0].messages;
        assert_eq!(msgs.iter().map(|m| m.role.as_str()).collect::<Vec<_>>(), ["system", "user", "assistant"]);
        assert_eq!(msgs[2].tool_calls, [ToolCallView { name: "f".into(), arguments: "{\"x\":1}".into() }]);
    }

    #[test]
    fn responses_items_keep_calls_outputs_and_reasoning() {
        let x = json!({"request": {"model": "m", "instructions": "be brief", "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
                {"type": "function_call_output", "call_id": "c", "output": "42"}]},
            "response": {"output": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hmm"}]},
                                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}]}});
        let h = exchange_history("responses", &x);
        let roles: Vec<_> = h.messages.iter().map(|m| (m.role.as_str(), m.sampled)).collect();
        assert_eq!(
            roles,
            [
                ("system", false),
                ("user", false),
                ("assistant", false),
                ("tool", false),
                ("reasoning", true),
                ("assistant", true)
            ]
        );
        assert_eq!((h.messages[4].content.as_str(), h.messages[5].content.as_str()), ("hmm", "done"));
    }
}
