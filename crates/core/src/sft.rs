//! Supervised fine-tuning (ART's `train_sft`): datasets of conversations, the job's `config`,
//! the artifact URLs that name a dataset, and which tokens of a conversation are trained.
//!
//! A dataset is JSONL, one `{"messages": [...], "tools"?: [...]}` per line (what ART uploads).
//! A conversation is rendered with the served model's chat template; with `assistant_turns: all`
//! every assistant message is trained (its content and the template's closing tokens after it),
//! with `last` only the final one. Each assistant span is what rendering the conversation up to
//! and including that message adds to rendering it up to the message with the generation prompt,
//! so templates only need to render append-only, which is checked.

use crate::chat::messages_from_values;
use crate::sequences::{ChatTokenizer, Sequence};
use crate::validate::{optional, Validator};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Which assistant turns of a conversation are trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssistantTurns {
    All,
    Last,
}

/// The learning rate: one for every batch, or one per batch in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LearningRate {
    Constant(f64),
    PerBatch(Vec<f64>),
}

impl LearningRate {
    /// The rate of the `i`-th trained batch (`None` past the end of a list).
    pub fn at(&self, i: usize) -> Option<f64> {
        match self {
            LearningRate::Constant(lr) => Some(*lr),
            LearningRate::PerBatch(v) => v.get(i).copied(),
        }
    }
}

/// An SFT job's `config`, every default resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftConfig {
    pub batch_size: usize,
    pub learning_rate: LearningRate,
    pub assistant_turns: AssistantTurns,
    /// `metric_logging.target_training_step`, when logging was asked for (recorded, since the
    /// job's metrics go on the checkpoint it makes anyway).
    pub target_training_step: Option<i64>,
}

/// ART's local default batch size (its serverless client omits `batch_size` for "auto").
pub const DEFAULT_BATCH_SIZE: usize = 2;
/// ART's `TrainSFTConfig.learning_rate` default.
pub const DEFAULT_LEARNING_RATE: f64 = 5e-5;
const MAX_BATCH_SIZE: usize = 1024;
const MAX_RATES: usize = 1 << 20;

/// Parses `config` (the caller has stepped into its location). `None` on error.
pub fn parse_sft_config(v: &mut Validator, value: Option<&Value>) -> Option<SftConfig> {
    let empty = Map::new();
    let obj = match value.filter(|x| !x.is_null()) {
        Some(x) => v.object(x)?,
        None => &empty,
    };
    let before = v.error_count();
    let batch_size = match optional(obj, "batch_size") {
        Some(Value::String(s)) if s == "auto" => Some(DEFAULT_BATCH_SIZE),
        Some(x) => v.at("batch_size", |v| {
            let n = v.integer(x)?;
            v.range_i64(x, n, 1, MAX_BATCH_SIZE as i64).then_some(n as usize)
        }),
        None => Some(DEFAULT_BATCH_SIZE),
    };
    let rate = |v: &mut Validator, x: &Value| -> Option<f64> {
        let n = v.number(x)?;
        (v.greater_than(x, n, 0.0) && v.range_f64(x, n, None, Some(1.0))).then_some(n)
    };
    let learning_rate = match optional(obj, "learning_rate") {
        None => Some(LearningRate::Constant(DEFAULT_LEARNING_RATE)),
        Some(x @ Value::Array(_)) => v.at("learning_rate", |v| {
            let items = v.array_max(x, MAX_RATES)?;
            if items.is_empty() {
                v.value_error(x, "a list of learning rates must not be empty");
                return None;
            }
            let rates: Vec<Option<f64>> = items.iter().enumerate().map(|(i, r)| v.at(i, |v| rate(v, r))).collect();
            rates.into_iter().collect::<Option<Vec<f64>>>().map(LearningRate::PerBatch)
        }),
        Some(x) => v.at("learning_rate", |v| rate(v, x)).map(LearningRate::Constant),
    };
    let assistant_turns = match optional(obj, "assistant_turns") {
        None => Some(AssistantTurns::All),
        Some(x) => v.at("assistant_turns", |v| v.literal(x, &["all", "last"])).map(|t| {
            if t == "all" {
                AssistantTurns::All
            } else {
                AssistantTurns::Last
            }
        }),
    };
    let mut target_training_step = None;
    if let Some(m) = optional(obj, "metric_logging") {
        v.at("metric_logging", |v| {
            let Some(m) = v.object(m) else { return };
            let enabled = optional(m, "enabled").and_then(|x| v.at("enabled", |v| v.boolean(x))).unwrap_or(false);
            let step = optional(m, "target_training_step").and_then(|x| {
                v.at("target_training_step", |v| {
                    let n = v.integer(x)?;
                    v.range_i64(x, n, 0, i64::MAX).then_some(n)
                })
            });
            target_training_step = step.filter(|_| enabled);
        });
    }
    if v.error_count() != before {
        return None;
    }
    Some(SftConfig {
        batch_size: batch_size?,
        learning_rate: learning_rate?,
        assistant_turns: assistant_turns?,
        target_training_step,
    })
}

/// Limits on one uploaded dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetLimits {
    pub max_rows: usize,
    pub max_messages: usize,
}

impl Default for DatasetLimits {
    fn default() -> Self {
        DatasetLimits { max_rows: 100_000, max_messages: 4096 }
    }
}

/// Validates JSONL text: every non-blank line an object with `messages` (a non-empty list of
/// message objects with a string `role`) and optionally `tools` (a list); other keys are
/// ignored, as ART's reader does. Errors are located as `["body", line_index, ...]` (lines
/// counted from 0). Returns the rows as `{"messages", "tools"?}` objects.
pub fn parse_dataset(v: &mut Validator, text: &str, limits: &DatasetLimits) -> Option<Vec<Value>> {
    let before = v.error_count();
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if rows.len() == limits.max_rows {
            v.value_error(&Value::Null, &format!("a dataset holds at most {} rows", limits.max_rows));
            return None;
        }
        let row: Value = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(e) => {
                v.at(i, |v| {
                    v.error(
                        "json_invalid",
                        format!("Invalid JSON: {e}"),
                        &Value::String(line.chars().take(200).collect()),
                    )
                });
                continue;
            }
        };
        if let Some(r) = v.at(i, |v| dataset_row(v, &row, limits)) {
            rows.push(r);
        }
    }
    if rows.is_empty() && v.error_count() == before {
        v.value_error(&Value::Null, "the dataset has no rows");
    }
    (v.error_count() == before).then_some(rows)
}

fn dataset_row(v: &mut Validator, row: &Value, limits: &DatasetLimits) -> Option<Value> {
    let obj = v.object(row)?;
    let messages = v.required(obj, "messages")?;
    let ok = v.at("messages", |v| {
        let items = v.array_max(messages, limits.max_messages)?;
        if items.is_empty() {
            v.value_error(messages, "a conversation needs at least one message");
            return None;
        }
        let before = v.error_count();
        for (k, m) in items.iter().enumerate() {
            v.at(k, |v| {
                if let Some(m) = v.object(m) {
                    if let Some(role) = v.required(m, "role") {
                        v.at("role", |v| v.string(role));
                    }
                }
            });
        }
        (v.error_count() == before).then_some(())
    });
    let tools = optional(obj, "tools");
    if let Some(t) = tools {
        v.at("tools", |v| v.array(t))?;
    }
    ok?;
    let mut out = Map::new();
    out.insert("messages".into(), messages.clone());
    if let Some(t) = tools {
        out.insert("tools".into(), t.clone());
    }
    Some(Value::Object(out))
}

/// Which version of a dataset a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatasetVersion {
    Latest,
    V(i64),
}

/// `wandb-artifact:///{entity}/{project}/{name}[:vN | :latest]` (two slashes too): the URL ART
/// sends as `training_data_url`, and the one tandem's dataset upload returns.
pub fn parse_artifact_url(url: &str) -> Option<(&str, &str, &str, DatasetVersion)> {
    let path = url.strip_prefix("wandb-artifact:///").or_else(|| url.strip_prefix("wandb-artifact://"))?;
    let (path, version) = match path.rsplit_once(':') {
        Some((p, "latest")) => (p, DatasetVersion::Latest),
        Some((p, v)) => {
            let n = v.strip_prefix('v')?;
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.len() > 18 {
                return None;
            }
            (p, DatasetVersion::V(n.parse().ok()?))
        }
        None => (path, DatasetVersion::Latest),
    };
    let mut parts = path.split('/');
    let (e, p, n) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && !e.is_empty() && !p.is_empty() && !n.is_empty()).then_some((e, p, n, version))
}

/// One conversation as a training sequence: template-rendered tokens, the assistant spans
/// `turns` selects trained. `at` names the row in errors.
pub fn sft_sequence(row: &Value, turns: AssistantTurns, tok: &dyn ChatTokenizer, at: &str) -> Result<Sequence, String> {
    let empty = Vec::new();
    let messages = row.get("messages").and_then(Value::as_array).unwrap_or(&empty);
    let messages = messages_from_values(messages).map_err(|e| format!("{at}.{e}"))?;
    let tools = row.get("tools").filter(|t| !t.is_null());
    let assistant: Vec<usize> =
        messages.iter().enumerate().filter(|(_, m)| m.role == "assistant").map(|(i, _)| i).collect();
    let trained: Vec<usize> = match turns {
        AssistantTurns::All => assistant,
        AssistantTurns::Last => match messages.last() {
            Some(m) if m.role == "assistant" => vec![messages.len() - 1],
            _ => return Err(format!("{at}: assistant_turns 'last' needs the final message to be an assistant's")),
        },
    };
    if trained.is_empty() {
        return Err(format!("{at}: the conversation has no assistant message to train on"));
    }
    let render = |end: usize, generation: bool| {
        tok.render(&messages[..end], tools, generation)
            .map_err(|e| format!("{at}: cannot render the chat template: {e}"))
    };
    let mut seq = Sequence::default();
    for &i in &trained {
        let prompt = render(i, true)?;
        let full = render(i + 1, false)?;
        if !prompt.starts_with(&seq.tokens) || !full.starts_with(&prompt) || full.len() == prompt.len() {
            return Err(format!(
                "{at}.messages[{i}]: the chat template does not render this conversation append-only, so the assistant turn cannot be isolated"
            ));
        }
        let context = prompt[seq.tokens.len()..].to_vec();
        seq.push(&context, false, None);
        seq.push(&full[prompt.len()..], true, None);
    }
    Ok(seq)
}

/// The rows in batches of `batch_size` conversations, in order, as ART's local backend forms
/// them: a conversation longer than `context` tokens is dropped (the count is returned), a
/// batch left with nothing to train is skipped. Each batch is one optimizer step.
pub fn sft_batches(
    rows: &[Value],
    config: &SftConfig,
    tok: &dyn ChatTokenizer,
    context: usize,
) -> Result<(Vec<Vec<Sequence>>, usize), String> {
    let size = config.batch_size.max(1);
    let mut out = Vec::new();
    let mut dropped = 0;
    for (b, chunk) in rows.chunks(size).enumerate() {
        let mut batch = Vec::new();
        for (k, row) in chunk.iter().enumerate() {
            let s = sft_sequence(row, config.assistant_turns, tok, &format!("rows[{}]", b * size + k))?;
            if s.tokens.len() > context {
                dropped += 1;
            } else {
                batch.push(s);
            }
        }
        // Position 0 is never trained (nothing predicts it).
        if batch.iter().any(|s| s.trained.iter().skip(1).any(|t| *t)) {
            out.push(batch);
        }
    }
    Ok((out, dropped))
}

#[cfg(test)]
mod tests;
