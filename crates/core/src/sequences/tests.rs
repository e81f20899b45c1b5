use super::*;
use serde_json::json;

/// A template that numbers messages: each message renders as [100 + index], plus [99] as the
/// generation prompt; text tokenizes to one id per byte.
struct Fake;

impl ChatTokenizer for Fake {
    fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&Value>,
        _generation: bool,
    ) -> Result<Vec<u32>, InputError> {
        if messages.iter().any(|m| m.text() == "boom") {
            return Err(InputError::Template("template failed".into()));
        }
        let mut out: Vec<u32> = (0..messages.len() as u32).map(|i| 100 + i).collect();
        if tools.is_some() {
            out.insert(0, 7);
        }
        out.push(99);
        Ok(out)
    }
    fn tokenize(&self, text: &str) -> Result<Vec<u32>, InputError> {
        Ok(text.bytes().map(u32::from).collect())
    }
    /// One-byte tokens are their byte; the bytes "<|im_end|>" are token 2.
    fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        match bytes {
            [b] => Some(u32::from(*b)),
            b"<|im_end|>" => Some(2),
            _ => None,
        }
    }
}

fn choice(prompt: &[u32], ids: &[u32], lps: &[f64]) -> Value {
    json!({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"},
           "prompt_token_ids": prompt, "token_ids": ids,
           "logprobs": {"content": lps.iter().zip(ids).map(|(l, i)| json!({"token": format!("token_id:{i}"), "logprob": l})).collect::<Vec<_>>()}})
}

#[test]
fn choices_with_ids_extend_or_start_sequences() {
    let items = vec![
        json!({"role": "user", "content": "hi"}),
        choice(&[1, 2], &[3, 4], &[-0.1, -0.2]),
        json!({"role": "user", "content": "more"}),
        // Extends [1, 2, 3, 4]: appended with [5] as context.
        choice(&[1, 2, 3, 4, 5], &[6], &[-0.3]),
        // Does not extend: a new sequence.
        choice(&[9, 9], &[8], &[-0.4]),
    ];
    let seqs = tokenize_history(&items, None, &Fake, false, "t").unwrap();
    assert_eq!(seqs.len(), 2);
    assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(seqs[0].trained, vec![false, false, true, true, false, true]);
    assert_eq!(seqs[0].old_lp[2..4], [-0.1, -0.2]);
    assert!(seqs[0].old_lp[4].is_nan());
    assert_eq!(seqs[0].trained_count(), 3);
    assert_eq!((seqs[1].tokens.clone(), seqs[1].old_lp[2]), (vec![9, 9, 8], -0.4));
}

#[test]
fn choices_without_logprobs_are_skipped_unless_allowed() {
    let mut c = choice(&[1], &[2], &[-0.5]);
    c["logprobs"] = Value::Null;
    let items = vec![json!({"role": "user", "content": "hi"}), c];
    assert!(tokenize_history(&items, None, &Fake, false, "t").unwrap().is_empty());
    let seqs = tokenize_history(&items, None, &Fake, true, "t").unwrap();
    assert_eq!(seqs[0].tokens, vec![1, 2]);
    assert!(seqs[0].old_lp[1].is_nan());
}

#[test]
fn older_clients_are_rendered_with_the_template() {
    // No token ids: prompt = render(user message) = [100, 99]; completion from token_id:N.
    let mut c = choice(&[], &[], &[]);
    c.as_object_mut().unwrap().remove("prompt_token_ids");
    c.as_object_mut().unwrap().remove("token_ids");
    c["logprobs"] =
        json!({"content": [{"token": "token_id:42", "logprob": -0.7}, {"token": "token_id:43", "logprob": -0.8}]});
    let items = vec![json!({"role": "user", "content": "hi"}), c.clone()];
    let seqs = tokenize_history(&items, Some(&json!([{"type": "function"}])), &Fake, false, "t").unwrap();
    assert_eq!(seqs[0].tokens, vec![7, 100, 99, 42, 43]);
    assert_eq!(seqs[0].old_lp[3..], [-0.7, -0.8]);
    // Tokens that are not ids map back through their raw bytes (EOS included, which the text
    // does not show), or through their text when there are no bytes (OpenAI clients drop none).
    c["logprobs"] = json!({"content": [{"token": "x", "bytes": [120], "logprob": -0.9}, {"token": "y", "logprob": -0.1},
                                       {"token": "<|im_end|>", "bytes": [60,124,105,109,95,101,110,100,124,62], "logprob": -0.2}]});
    let seqs =
        tokenize_history(&[json!({"role": "user", "content": "hi"}), c.clone()], None, &Fake, false, "t").unwrap();
    assert_eq!(seqs[0].tokens, vec![100, 99, 120, 121, 2]);
    assert_eq!(seqs[0].old_lp[2..], [-0.9, -0.1, -0.2]);
    // Entries that map to no token: the completion comes from the message text ("x" = 120).
    c["logprobs"] = json!({"content": [{"token": "xyz", "logprob": -0.9}]});
    let seqs = tokenize_history(&[json!({"role": "user", "content": "hi"}), c], None, &Fake, false, "t").unwrap();
    assert_eq!(seqs[0].tokens, vec![100, 99, 120]);
}

#[test]
fn errors_say_which_item_and_why() {
    let items = vec![json!({"role": "user", "content": "hi"}), choice(&[1], &[2, 3], &[-0.5])];
    let e = tokenize_history(&items, None, &Fake, false, "trajectory_groups[0].trajectories[1]").unwrap_err();
    assert!(e.starts_with("trajectory_groups[0].trajectories[1].messages_and_choices[1]: "), "{e}");
    assert!(e.contains("1 logprobs for 2 token ids"), "{e}");
    let mut c = choice(&[], &[], &[]);
    c.as_object_mut().unwrap().remove("token_ids");
    let e = tokenize_history(&[json!({"role": "user", "content": "boom"}), c], None, &Fake, false, "t").unwrap_err();
    assert!(e.contains("cannot render the chat template: template failed"), "{e}");
}

#[test]
fn additional_histories_belong_to_the_trajectory() {
    let traj = json!({"reward": 1.0, "messages_and_choices": [choice(&[1], &[2], &[-0.1])],
                      "additional_histories": [{"messages_and_choices": [choice(&[5], &[6, 7], &[-0.2, -0.3])]}]});
    let seqs = tokenize_trajectory(&traj, &Fake, &MODEL, false, "t").unwrap();
    assert_eq!(seqs.iter().map(|s| s.tokens.clone()).collect::<Vec<_>>(), vec![vec![1, 2], vec![5, 6, 7]]);
    // As in ART, a Choice of an additional history that continues the sequence extends it.
    let traj = json!({"messages_and_choices": [choice(&[1], &[2], &[-0.1])],
                      "additional_histories": [{"messages_and_choices": [choice(&[1, 2, 3], &[4], &[-0.2])]}]});
    let seqs = tokenize_trajectory(&traj, &Fake, &MODEL, false, "t").unwrap();
    assert_eq!(seqs.len(), 1);
    assert_eq!(seqs[0].tokens, vec![1, 2, 3, 4]);
}

const MODEL: TrainedModel = TrainedModel { entity: "e", project: "p", name: "m" };

#[test]
fn exchanges_or_histories_not_both() {
    let call = json!({"start_time": "2026-01-01T00:00:00Z", "end_time": "2026-01-01T00:00:00Z",
                      "request": {"model": "wandb-artifact:///e/p/m"},
                      "response": {"prompt_token_ids": [1], "choices": [choice(&[1], &[2], &[-0.1])]}});
    let traj = json!({"exchanges": {"chat_completions": [call]}});
    let seqs = tokenize_trajectory(&traj, &Fake, &MODEL, false, "t").unwrap();
    assert_eq!(seqs[0].tokens, vec![1, 2]);
    let both =
        json!({"exchanges": {"chat_completions": [call]}, "messages_and_choices": [choice(&[1], &[2], &[-0.1])]});
    assert!(tokenize_trajectory(&both, &Fake, &MODEL, false, "t").unwrap_err().contains("cannot have both"));
    // Empty exchange lists are no exchanges.
    let empty = json!({"exchanges": {"chat_completions": []}, "messages_and_choices": [choice(&[1], &[2], &[-0.1])]});
    assert_eq!(tokenize_trajectory(&empty, &Fake, &MODEL, false, "t").unwrap().len(), 1);
}
