use super::*;
use crate::chat::ChatMessage;
use crate::inference::InputError;
use serde_json::json;

/// A template that renders each message as [50 + role code, content bytes..., 2] and the
/// generation prompt as [53]; `tools` puts a 7 first. "unstable" content renders differently
/// once followed by more messages (a template that is not append-only).
struct Fake;

impl ChatTokenizer for Fake {
    fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        generation: bool,
    ) -> Result<Vec<u32>, InputError> {
        let mut out = Vec::new();
        if tools.is_some() {
            out.push(7);
        }
        for (i, m) in messages.iter().enumerate() {
            let code = match m.role.as_str() {
                "system" => 1,
                "user" => 2,
                "assistant" => 3,
                _ => return Err(InputError::Template("unknown role".into())),
            };
            out.push(50 + code);
            let text = m.text();
            let text = text.as_str();
            if text == "unstable" && i + 1 < messages.len() {
                out.push(0);
            }
            out.extend(text.bytes().map(u32::from));
            out.push(2);
        }
        if generation {
            out.push(53);
        }
        Ok(out)
    }
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, InputError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn token_id(&self, _bytes: &[u8]) -> Option<u32> {
        None
    }
}

fn conv() -> Value {
    json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]})
}

#[test]
fn all_turns_train_every_assistant_span_with_its_closing_token() {
    let s = sft_sequence(&conv(), AssistantTurns::All, &Fake, "r").unwrap();
    assert_eq!(s.tokens, vec![52, 97, 2, 53, 98, 2, 52, 99, 2, 53, 100, 2]);
    let trained: Vec<usize> = (0..s.tokens.len()).filter(|i| s.trained[*i]).collect();
    assert_eq!(trained, vec![4, 5, 10, 11]);
    assert!(s.old_lp.iter().all(|x| x.is_nan()));
}

#[test]
fn last_turn_only() {
    let s = sft_sequence(&conv(), AssistantTurns::Last, &Fake, "r").unwrap();
    assert_eq!(s.tokens, vec![52, 97, 2, 53, 98, 2, 52, 99, 2, 53, 100, 2]);
    let trained: Vec<usize> = (0..s.tokens.len()).filter(|i| s.trained[*i]).collect();
    assert_eq!(trained, vec![10, 11]);
    let mut ends_with_user = conv();
    ends_with_user["messages"].as_array_mut().unwrap().pop();
    let e = sft_sequence(&ends_with_user, AssistantTurns::Last, &Fake, "r").unwrap_err();
    assert!(e.contains("final message to be an assistant"), "{e}");
}

#[test]
fn templates_that_rewrite_history_and_rows_without_assistants_are_refused() {
    let mut c = conv();
    c["messages"][1]["content"] = json!("unstable");
    let e = sft_sequence(&c, AssistantTurns::All, &Fake, "rows[3]").unwrap_err();
    assert!(e.starts_with("rows[3].messages[3]: the chat template does not render"), "{e}");
    let e = sft_sequence(&json!({"messages": [{"role": "user", "content": "a"}]}), AssistantTurns::All, &Fake, "r")
        .unwrap_err();
    assert!(e.contains("no assistant message"), "{e}");
}

#[test]
fn config_defaults_and_errors() {
    let parse = |x: Value| {
        let mut v = Validator::new("body");
        let c = v.at("config", |v| parse_sft_config(v, Some(&x)));
        (c, serde_json::to_value(v.into_errors()).unwrap())
    };
    let (c, _) = parse(json!({}));
    assert_eq!(
        c.unwrap(),
        SftConfig {
            batch_size: 2,
            learning_rate: LearningRate::Constant(5e-5),
            assistant_turns: AssistantTurns::All,
            target_training_step: None
        }
    );
    let (c, _) = parse(json!({"batch_size": 4, "learning_rate": [1e-4, 2e-4], "assistant_turns": "last",
                              "metric_logging": {"enabled": true, "target_training_step": 3}}));
    let c = c.unwrap();
    assert_eq!((c.batch_size, c.assistant_turns, c.target_training_step), (4, AssistantTurns::Last, Some(3)));
    assert_eq!((c.learning_rate.at(1), c.learning_rate.at(2)), (Some(2e-4), None));
    assert_eq!(parse(json!({"batch_size": "auto"})).0.unwrap().batch_size, 2);
    let (c, e) = parse(json!({"batch_size": 0, "learning_rate": [1e-4, -1], "assistant_turns": "first"}));
    assert!(c.is_none());
    let locs: Vec<Value> = e.as_array().unwrap().iter().map(|x| x["loc"].clone()).collect();
    assert_eq!(
        locs,
        vec![
            json!(["body", "config", "batch_size"]),
            json!(["body", "config", "learning_rate", 1]),
            json!(["body", "config", "assistant_turns"])
        ]
    );
    assert!(parse(json!({"learning_rate": []})).0.is_none());
}

#[test]
fn datasets_are_checked_line_by_line() {
    let text = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [], \"extra\": 1}\n\n\
                not json\n{\"messages\": []}\n{\"messages\": [{\"content\": \"x\"}]}\n";
    let mut v = Validator::new("body");
    assert!(parse_dataset(&mut v, text, &DatasetLimits::default()).is_none());
    let e = serde_json::to_value(v.into_errors()).unwrap();
    let locs: Vec<Value> = e.as_array().unwrap().iter().map(|x| x["loc"].clone()).collect();
    assert_eq!(
        locs,
        vec![json!(["body", 2]), json!(["body", 3, "messages"]), json!(["body", 4, "messages", 0, "role"])]
    );
    let mut v = Validator::new("body");
    let rows =
        parse_dataset(&mut v, "{\"messages\": [{\"role\": \"user\"}], \"extra\": 1}\n", &DatasetLimits::default());
    assert_eq!(rows.unwrap(), vec![json!({"messages": [{"role": "user"}]})]);
    let mut v = Validator::new("body");
    assert!(parse_dataset(&mut v, "\n", &DatasetLimits::default()).is_none());
    let mut v = Validator::new("body");
    let limits = DatasetLimits { max_rows: 1, ..DatasetLimits::default() };
    let two = "{\"messages\": [{\"role\": \"user\"}]}\n{\"messages\": [{\"role\": \"user\"}]}\n";
    assert!(parse_dataset(&mut v, two, &limits).is_none());
}

#[test]
fn artifact_urls() {
    assert_eq!(
        parse_artifact_url("wandb-artifact:///e/p/run-sft-data-abc:v0"),
        Some(("e", "p", "run-sft-data-abc", DatasetVersion::V(0)))
    );
    assert_eq!(parse_artifact_url("wandb-artifact://e/p/n:latest"), Some(("e", "p", "n", DatasetVersion::Latest)));
    assert_eq!(parse_artifact_url("wandb-artifact:///e/p/n"), Some(("e", "p", "n", DatasetVersion::Latest)));
    assert_eq!(parse_artifact_url("wandb-artifact:///e/p/n:x1"), None);
    assert_eq!(parse_artifact_url("wandb-artifact:///e/p/q/n:v1"), None);
    assert_eq!(parse_artifact_url("https://x/e/p/n:v1"), None);
    assert_eq!(parse_artifact_url("wandb-artifact:///e//n:v1"), None);
}

#[test]
fn batches_drop_long_rows_and_skip_empty_batches() {
    let short = conv();
    let long =
        json!({"messages": [{"role": "user", "content": "a".repeat(40)}, {"role": "assistant", "content": "b"}]});
    let rows = vec![long.clone(), long, short.clone(), short.clone(), short];
    let config = SftConfig { batch_size: 2, ..parse_default() };
    let (batches, dropped) = sft_batches(&rows, &config, &Fake, 20).unwrap();
    assert_eq!(dropped, 2);
    assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 1]);
}

fn parse_default() -> SftConfig {
    let mut v = Validator::new("body");
    parse_sft_config(&mut v, None).unwrap()
}
