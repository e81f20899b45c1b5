use super::*;

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

fn plan(body: Value) -> Result<(Option<ToolPlan>, ChatRender), ApiError> {
    let mut render = ChatRender::default();
    let p = validate(body.as_object().unwrap(), &mut render)?;
    Ok((p, render))
}

#[test]
fn tool_choice_rules_follow_vllm() {
    let param = |body: Value| plan(body).unwrap_err().param;
    assert_eq!(param(json!({"tool_choice": "auto"})).as_deref(), Some("tool_choice"));
    assert_eq!(param(json!({"tools": [weather()], "tool_choice": "sometimes"})).as_deref(), Some("tool_choice"));
    assert_eq!(
        param(json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}))
            .as_deref(),
        Some("tool_choice")
    );
    assert_eq!(param(json!({"tools": [weather()], "tool_choice": {}})).as_deref(), Some("tool_choice"));
    assert_eq!(
        param(json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]})).as_deref(),
        Some("tools")
    );
    assert_eq!(
        param(json!({"tools": [weather()], "parallel_tool_calls": "no"})).as_deref(),
        Some("parallel_tool_calls")
    );
    let (p, r) = plan(json!({"tools": [weather()], "tool_choice": "none"})).unwrap();
    assert!(p.is_none() && r.tools.is_some(), "none: tools reach the template, nothing is parsed");
    let (p, _) = plan(json!({"tools": [weather()]})).unwrap();
    assert_eq!(p.unwrap().choice, Choice::Auto, "tools without a choice mean auto");
    let (p, _) =
        plan(json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                             "parallel_tool_calls": false}))
        .unwrap();
    let p = p.unwrap();
    assert_eq!((p.choice, p.parallel), (Choice::Named("get_weather".into()), false));
}

#[test]
fn generic_path_describes_tools_and_constrains_the_reply() {
    let (p, _) = plan(json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": false})).unwrap();
    let p = p.unwrap();
    let mut render = ChatRender {
        messages: tandem_core::chat::messages_from_values(&[
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
        ])
        .unwrap(),
        ..ChatRender::default()
    };
    let (c, mode) = apply(&p, false, &mut render);
    let system = render.messages[0].text();
    assert!(system.starts_with("Be brief.") && system.contains("get_weather") && system.contains("tool_calls"));
    assert_eq!(
        render.messages[1].text(),
        "{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]}"
    );
    assert!(render.messages[1].tool_calls().is_none() && render.tools.is_none());
    let ConstraintKind::Json(schema) = c.unwrap().kind else { panic!("a JSON schema") };
    assert_eq!(schema["properties"]["tool_calls"]["maxItems"], json!(1));
    assert_eq!(
        schema["properties"]["tool_calls"]["items"]["anyOf"][0]["properties"]["name"],
        json!({"const": "get_weather"})
    );
    assert_eq!(mode, ToolMode { format: Format::Generic { required: true }, parallel: false });

    // A template that renders tools gets them, and auto needs no constraint (Hermes parsing).
    let (p, _) = plan(json!({"tools": [weather()]})).unwrap();
    let mut render = ChatRender::default();
    let (c, mode) = apply(&p.unwrap(), true, &mut render);
    assert!(c.is_none() && render.tools.is_some() && mode.format == Format::Hermes);
}

#[test]
fn outputs_parse_into_calls() {
    let generic = |required, parallel| ToolMode { format: Format::Generic { required }, parallel };
    let two = r#"{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]}"#;
    let (content, calls) = parse(&generic(false, true), two);
    assert_eq!(content, None);
    assert_eq!(
        calls,
        vec![
            Call { name: "a".into(), arguments: "{\"x\":1}".into() },
            Call { name: "b".into(), arguments: "{}".into() }
        ]
    );
    assert_eq!(parse(&generic(true, false), two).1.len(), 1, "parallel_tool_calls=false keeps the first");
    assert_eq!(parse(&generic(true, true), two).0, Some(String::new()), "required: content is empty");
    assert_eq!(parse(&generic(false, true), "Just text."), (Some("Just text.".into()), vec![]));
    assert_eq!(
        parse(&generic(false, true), "{\"tool_calls\": [{\"na"),
        (Some("{\"tool_calls\": [{\"na".into()), vec![])
    );
    let named = ToolMode { format: Format::Arguments("f".into()), parallel: true };
    assert_eq!(
        parse(&named, "{\"q\": 2}"),
        (Some(String::new()), vec![Call { name: "f".into(), arguments: "{\"q\": 2}".into() }])
    );
    let hermes = ToolMode { format: Format::Hermes, parallel: true };
    let text =
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let (content, calls) = parse(&hermes, text);
    assert_eq!(content.as_deref(), Some("Let me check.\n"));
    assert_eq!(calls, vec![Call { name: "get_weather".into(), arguments: "{\"city\":\"Oslo\"}".into() }]);
    assert_eq!(parse(&hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>").0, None);
}
