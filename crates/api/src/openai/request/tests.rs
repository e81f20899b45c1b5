use super::*;
use serde_json::json;
use tandem_core::inference::LogitsProcessor;

fn ok(body: Value) -> ChatPlan {
    validate(&body, true).unwrap_or_else(|e| panic!("{}: {}", e.message, body))
}

fn err(body: Value) -> (Option<String>, String) {
    let e = validate(&body, true).expect_err("should be rejected");
    (e.param.clone().or_else(|| e.fields.first().map(|f| format!("{:?}", f.loc))), e.message)
}

fn msgs() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

#[test]
fn defaults_follow_vllm() {
    let p = ok(json!({"messages": msgs()}));
    assert_eq!((p.sampling.n, p.sampling.stream, p.logprobs, p.sampling.priority), (1, false, false, 0));
    assert_eq!(p.sampling.params.temperature, 1.0);
    assert_eq!(p.sampling.params.top_k, 0);
    assert!(p.render.add_generation_prompt && !p.render.add_special_tokens);
    assert_eq!(p.sampling.max_tokens, None);
    assert_eq!(p.role, "assistant");
    assert!(p.sampling.params.skip_special_tokens);
}

#[test]
fn fields_map_onto_params() {
    let p = ok(json!({"messages": msgs(), "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.1,
        "max_tokens": 10, "max_completion_tokens": 7, "stop": "END", "seed": 3, "n": 2,
        "logprobs": true, "top_logprobs": 5, "logit_bias": {"5": 200}, "stop_token_ids": [2],
        "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        "return_token_ids": true, "return_tokens_as_token_ids": true, "nvext": {"x": 1},
        "chat_template_kwargs": {"preserve_thinking": true}, "priority": -3, "cache_salt": "abc"}));
    assert_eq!(p.sampling.max_tokens, Some(7), "max_completion_tokens wins");
    assert_eq!(p.sampling.params.stop, vec!["END".to_string()]);
    assert_eq!(p.sampling.params.logprobs, Some(5));
    assert_eq!(p.sampling.params.logit_bias, vec![(5, 100.0)], "bias clamped to 100");
    assert_eq!(
        (p.sampling.n, p.sampling.include_usage, p.sampling.continuous_usage, p.sampling.tokens_as_ids),
        (2, true, true, true)
    );
    assert_eq!(p.render.kwargs["preserve_thinking"], json!(true));
    assert_eq!(p.sampling.priority, -3);
}

#[test]
fn rejections_name_the_field() {
    let cases = [
        (json!({}), "messages"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": msgs(), "temperature": 3}), "temperature"),
        (json!({"messages": msgs(), "top_p": 0}), "top_p"),
        (json!({"messages": msgs(), "n": 2, "temperature": 0}), "n"),
        (json!({"messages": msgs(), "max_completion_tokens": 0}), "max_completion_tokens"),
        (json!({"messages": msgs(), "top_logprobs": 21, "logprobs": true}), "top_logprobs"),
        (json!({"messages": msgs(), "top_logprobs": 2}), "top_logprobs"),
        (json!({"messages": msgs(), "stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"messages": msgs(), "stop": [""]}), "stop"),
        (json!({"messages": msgs(), "stream_options": {"include_usage": true}}), "stream_options"),
        (json!({"messages": msgs(), "logit_bias": {"x": 1}}), "logit_bias"),
        (json!({"messages": msgs(), "allowed_token_ids": []}), "allowed_token_ids"),
        (json!({"messages": msgs(), "continue_final_message": true}), "continue_final_message"),
        (
            json!({"messages": msgs(), "continue_final_message": true, "add_generation_prompt": false}),
            "continue_final_message",
        ),
        (json!({"messages": msgs(), "cache_salt": ""}), "cache_salt"),
        (json!({"messages": msgs(), "tools": []}), "tools"),
        (json!({"messages": msgs(), "tool_choice": "auto"}), "tool_choice"),
        (json!({"messages": msgs(), "use_beam_search": true, "stop": ["x"]}), "stop"),
        (json!({"messages": msgs(), "use_beam_search": true, "top_p": 0.5}), "top_p"),
        (json!({"messages": msgs(), "use_beam_search": true, "prompt_logprobs": 1}), "prompt_logprobs"),
        (json!({"messages": msgs(), "use_beam_search": true, "bad_words": ["x"]}), "bad_words"),
        (json!({"messages": msgs(), "use_beam_search": "yes"}), "use_beam_search"),
        (json!({"messages": msgs(), "structured_outputs": {"regex": "a+", "choice": ["a"]}}), "structured_outputs"),
        (json!({"messages": msgs(), "structured_outputs": {"disable_any_whitespace": true}}), "structured_outputs"),
        (json!({"messages": msgs(), "structured_outputs": {"choice": []}}), "structured_outputs"),
        (json!({"messages": msgs(), "structured_outputs": {"json": "{not json"}}), "structured_outputs"),
        (json!({"messages": msgs(), "structured_outputs": {"structural_tag": "[1]"}}), "structured_outputs"),
        (json!({"messages": msgs(), "structured_outputs": {"regexp": "a"}}), "structured_outputs"),
        (
            json!({"messages": msgs(), "structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (json!({"messages": msgs(), "response_format": {"type": "json_schema"}}), "response_format"),
        (json!({"messages": msgs(), "response_format": {"type": "xml"}}), "response_format"),
        (json!({"messages": msgs(), "guided_regex": 5}), "guided_regex"),
        (json!({"messages": msgs(), "use_beam_search": true, "guided_choice": ["a"]}), "guided_choice"),
        (json!({"messages": msgs(), "logits_processors": ["my.mod.Proc"]}), "logits_processors"),
        (
            json!({"messages": msgs(), "logits_processors": [{"qualname": "no_repeat_ngram", "kwargs": {"n": 0}}]}),
            "logits_processors",
        ),
        (json!({"messages": msgs(), "prompt_logprobs": 1, "stream": true}), "prompt_logprobs"),
        (json!({"messages": msgs(), "prompt_logprobs": 21}), "prompt_logprobs"),
        (json!({"messages": msgs(), "min_tokens": 5, "max_tokens": 2}), "min_tokens"),
        (json!({"messages": msgs(), "repetition_penalty": 0}), "repetition_penalty"),
    ];
    for (body, param) in cases {
        let (got, msg) = err(body.clone());
        let got = got.unwrap_or_default();
        assert!(got.contains(param), "{body}: param {got:?} ({msg})");
    }
    let e = validate(&json!({"messages": [{"content": "x"}]}), true).unwrap_err();
    assert_eq!(serde_json::to_value(&e.fields[0].loc).unwrap(), json!(["body", "messages", 0, "role"]));
}

#[test]
fn priority_needs_priority_scheduling() {
    assert!(validate(&json!({"messages": msgs(), "priority": 1}), false).is_err());
    assert!(validate(&json!({"messages": msgs(), "priority": 0}), false).is_ok());
}

#[test]
fn role_and_tools_none() {
    let p = ok(json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                      "add_generation_prompt": false, "continue_final_message": true}));
    assert_eq!(p.role, "assistant");
    let p = ok(json!({"messages": msgs(), "add_generation_prompt": false}));
    assert_eq!(p.role, "user");
    let p = ok(
        json!({"messages": msgs(), "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"}),
    );
    assert!(p.render.tools.is_some());
}

#[test]
fn builtin_logits_processors_by_name() {
    let p = ok(json!({"messages": msgs(), "logits_processors": [
        {"qualname": "no_repeat_ngram", "kwargs": {"n": 3}},
        {"qualname": "suppress_tokens", "args": [[5, 6]]}]}));
    assert_eq!(
        p.sampling.params.processors,
        vec![LogitsProcessor::NoRepeatNgram { n: 3 }, LogitsProcessor::SuppressTokens { token_ids: vec![5, 6] }]
    );
}

#[test]
fn beam_search_takes_n_as_its_width() {
    // n > 1 with greedy defaults is fine for beam search (vLLM refuses it otherwise).
    let p = ok(json!({"messages": msgs(), "use_beam_search": true, "n": 3, "length_penalty": 0.5}));
    assert_eq!((p.sampling.n, p.sampling.beam), (3, Some(0.5)));
    let p = ok(json!({"messages": msgs(), "use_beam_search": true}));
    assert_eq!(p.sampling.beam, Some(1.0));
    assert_eq!(ok(json!({"messages": msgs()})).sampling.beam, None);
}

#[test]
fn structured_outputs_response_format_and_aliases_become_one_constraint() {
    use tandem_core::inference::ConstraintKind;
    let c = |body: serde_json::Value| ok(body).sampling.params.constraint;
    assert_eq!(c(json!({"messages": msgs()})), None);
    assert_eq!(c(json!({"messages": msgs(), "response_format": {"type": "text"}})), None);
    let so = c(json!({"messages": msgs(), "structured_outputs": {"json": "{\"type\": \"object\"}",
                      "disable_any_whitespace": true, "whitespace_pattern": " "}}))
    .unwrap();
    assert_eq!(so.kind, ConstraintKind::Json(json!({"type": "object"})));
    assert!(so.disable_any_whitespace && so.whitespace_pattern.as_deref() == Some(" "));
    assert_eq!(so.field, "structured_outputs");
    let rf = c(json!({"messages": msgs(), "response_format": {"type": "json_schema",
                      "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": true}},
                      "structured_outputs": {"disable_additional_properties": true}}))
    .unwrap();
    assert_eq!(
        (rf.kind, rf.field.as_str(), rf.disable_additional_properties),
        (ConstraintKind::Json(json!({"type": "integer"})), "response_format", true)
    );
    assert_eq!(
        c(json!({"messages": msgs(), "response_format": {"type": "json_object"}})).unwrap().kind,
        ConstraintKind::JsonObject
    );
    assert_eq!(
        c(json!({"messages": msgs(), "structured_outputs": {"json_object": true}})).unwrap().kind,
        ConstraintKind::JsonObject
    );
    let g = c(json!({"messages": msgs(), "guided_choice": ["yes", "no"]})).unwrap();
    assert_eq!((g.kind, g.field.as_str()), (ConstraintKind::Choice(vec!["yes".into(), "no".into()]), "guided_choice"));
    assert_eq!(
        c(json!({"messages": msgs(), "guided_grammar": "start: \"a\""})).unwrap().kind,
        ConstraintKind::Grammar("start: \"a\"".into())
    );
    let deep = (0..70).fold(json!({"type": "string"}), |acc, _| json!({"type": "object", "properties": {"a": acc}}));
    assert!(validate(&json!({"messages": msgs(), "structured_outputs": {"json": deep}}), true).is_err());
}
