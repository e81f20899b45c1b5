use super::*;
use tandem_core::inference::ConstraintKind;

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
    let many: Vec<Value> =
        (0..=MAX_TOOLS).map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}})).collect();
    assert_eq!(param(json!({"tools": many})).as_deref(), Some("tools"), "OpenAI's limit of 128 tools");
    let (p, r) = plan(json!({"tools": [weather()], "tool_choice": "none"})).unwrap();
    assert!(p.is_none() && r.tools.is_some(), "none: tools reach the template, nothing is parsed");
    let (p, _) = plan(json!({"tools": [weather()]})).unwrap();
    let p = p.unwrap();
    assert_eq!((p.choice, p.parallel), (Choice::Auto, false), "tools alone: auto, one call per reply");
    let (p, _) = plan(json!({"tools": [weather()], "tool_choice": "required", "parallel_tool_calls": true})).unwrap();
    assert!(p.unwrap().parallel, "several calls when asked for");
    let (p, _) =
        plan(json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                             "parallel_tool_calls": false}))
        .unwrap();
    let p = p.unwrap();
    assert_eq!((p.choice, p.parallel), (Choice::Named("get_weather".into()), false));
}

fn template(renders_tools: bool, family: Family) -> ToolTemplate {
    ToolTemplate { renders_tools, family }
}

fn tree(c: &Constraint) -> &Value {
    let ConstraintKind::StructuralTag(spec) = &c.kind else { panic!("a structural tag") };
    &spec["format"]
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
    let (c, mode) = apply(&p, template(false, Family::Generic), &mut render, None).unwrap();
    let system = render.messages[0].text();
    assert!(system.starts_with("Be brief.") && system.contains("get_weather") && system.contains("tool_calls"));
    // The history's call is written as the model writes one, so the constraint accepts it.
    assert_eq!(
        render.messages[1].text(),
        "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}]}"
    );
    assert!(render.messages[1].tool_calls().is_none() && render.tools.is_none());
    assert_eq!(
        mode,
        ToolMode {
            family: Family::Generic,
            choice: Choice::Required,
            parallel: false,
            names: vec!["get_weather".into()]
        }
    );
    // Opener, one call (not parallel), closer, at most a newline; closed objects; bounded blanks.
    assert_eq!(tree(&c)["elements"][1], json!({"type": "regex", "pattern": "\\n?"}));
    let t = &tree(&c)["elements"][0];
    assert_eq!(t["elements"][0], json!({"type": "const_string", "value": "{\"tool_calls\": ["}));
    assert_eq!(t["elements"][1]["begin"], json!("{\"name\": \"get_weather\", \"arguments\": "));
    assert_eq!(t["elements"][2]["value"], json!("]}"));
    assert!(c.disable_additional_properties && c.whitespace_pattern.as_deref() == Some(grammar::WHITESPACE));
}

#[test]
fn each_choice_constrains_the_familys_own_syntax() {
    let two = json!([weather(), {"type": "function", "function": {"name": "Person", "parameters": {"type": "object",
                     "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}}}]);
    let build = |choice: Value, family: Family| {
        let parallel = choice == "required";
        let (p, _) = plan(json!({"tools": two, "tool_choice": choice, "parallel_tool_calls": parallel})).unwrap();
        let mut render = ChatRender::default();
        let (c, mode) = apply(&p.unwrap(), template(true, family), &mut render, None).unwrap();
        assert!(render.tools.is_some());
        (c, mode)
    };
    // Named: the model's opener and the name are written by the constraint, so a schema whose
    // first property is `name` gets its arguments, not the tool's name.
    let (c, _) = build(json!({"type": "function", "function": {"name": "Person"}}), Family::Hermes);
    assert_eq!(c.field, "tool_choice");
    let call = &tree(&c)["elements"][0];
    assert_eq!(call["begin"], json!("<tool_call>\n{\"name\": \"Person\", \"arguments\": "));
    assert_eq!(call["end"], json!("}\n</tool_call>"));
    // Required, parallel: one or more calls of any tool joined by the separator.
    let (c, _) = build(json!("required"), Family::Mistral);
    let t = &tree(&c)["elements"][0];
    assert_eq!(t["elements"][0]["value"], json!("[TOOL_CALLS]["));
    assert_eq!(t["elements"][1]["type"], json!("tags_with_separator"));
    assert_eq!(t["elements"][1]["separator"], json!(", "));
    // Auto: free text with the opener as the trigger.
    let (c, mode) = build(json!("auto"), Family::Hermes);
    assert_eq!(tree(&c)["type"], json!("triggered_tags"));
    assert_eq!(
        tree(&c)["triggers"],
        json!(["<tool_call>", "{\"name\": \"get_weather\"", "{\"name\": \"Person\""]),
        "the tag, or a bare object naming a tool"
    );
    assert!(!mode.forced());
    let (c, _) = build(json!("auto"), Family::DeepSeek);
    assert_eq!(tree(&c)["tags"][0]["begin"], json!("<｜tool▁calls▁begin｜>"));
    let (c, _) = build(json!("auto"), Family::Generic);
    assert_eq!(tree(&c)["type"], json!("or"));
}

#[test]
fn outputs_parse_into_calls() {
    let mode = |family, choice, parallel| ToolMode {
        family,
        choice,
        parallel,
        names: vec!["a".into(), "b".into(), "get_weather".into(), "f".into()],
    };
    let generic = |choice, parallel| mode(Family::Generic, choice, parallel);
    let two = r#"{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]}"#;
    let (content, calls) = parse(&generic(Choice::Auto, true), two);
    assert_eq!(content, None);
    assert_eq!(
        calls,
        vec![
            Call { name: "a".into(), arguments: "{\"x\": 1}".into() },
            Call { name: "b".into(), arguments: "{}".into() }
        ]
    );
    assert_eq!(parse(&generic(Choice::Required, false), two).1.len(), 1, "parallel_tool_calls=false keeps the first");
    assert_eq!(parse(&generic(Choice::Required, true), two).0, Some(String::new()), "required: content is empty");
    assert_eq!(parse(&generic(Choice::Auto, true), "Just text."), (Some("Just text.".into()), vec![]));
    assert_eq!(
        parse(&generic(Choice::Auto, true), "{\"tool_calls\": [{\"na"),
        (Some("{\"tool_calls\": [{\"na".into()), vec![])
    );
    let hermes = mode(Family::Hermes, Choice::Auto, true);
    let text =
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let (content, calls) = parse(&hermes, text);
    assert_eq!(content.as_deref(), Some("Let me check.\n"));
    assert_eq!(calls, vec![Call { name: "get_weather".into(), arguments: "{\"city\": \"Oslo\"}".into() }]);
    assert_eq!(parse(&hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>").0, None);
}

#[test]
fn a_stream_sends_content_then_each_call_as_it_grows() {
    let mode =
        ToolMode { family: Family::Hermes, choice: Choice::Auto, parallel: true, names: vec!["get_weather".into()] };
    let text = "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let mut s = Streamed::default();
    let mut pieces = Vec::new();
    for end in 1..text.len() {
        pieces.extend(s.advance(&mode, &text[..end], false).0);
    }
    let (last, calls) = s.advance(&mode, text, true);
    pieces.extend(last);
    let content: String =
        pieces.iter().filter_map(|p| if let Piece::Content(t) = p { Some(t.as_str()) } else { None }).collect();
    let args: String = pieces
        .iter()
        .filter_map(|p| if let Piece::Arguments { text, .. } = p { Some(text.as_str()) } else { None })
        .collect();
    let names: Vec<&Piece> = pieces.iter().filter(|p| matches!(p, Piece::Name { .. })).collect();
    assert_eq!(content, "Checking.");
    assert_eq!(args, "{\"city\": \"Oslo\"}");
    assert_eq!(names.len(), 1);
    assert!(matches!(names[0], Piece::Name { index: 0, name, .. } if name == "get_weather"));
    let first_args = pieces.iter().position(|p| matches!(p, Piece::Arguments { .. })).unwrap();
    let name_at = pieces.iter().position(|p| matches!(p, Piece::Name { .. })).unwrap();
    assert!(name_at < first_args, "the name goes before the arguments");
    assert_eq!(calls, vec![Call { name: "get_weather".into(), arguments: "{\"city\": \"Oslo\"}".into() }]);
    // Not parallel: a second call is never streamed.
    let one = ToolMode { parallel: false, ..mode.clone() };
    let two = format!("{text}\n{}", &text["Checking.".len()..]);
    let (p, calls) = Streamed::default().advance(&one, &two, true);
    assert_eq!(calls.len(), 1);
    assert_eq!(p.iter().filter(|p| matches!(p, Piece::Name { .. })).count(), 1);
}

#[test]
fn a_structured_output_beside_auto_tools_is_the_other_way_to_answer() {
    let (p, _) = plan(json!({"tools": [weather()]})).unwrap();
    let reply = Constraint {
        kind: ConstraintKind::Json(json!({"type": "object", "properties": {"answer": {"type": "string"}}})),
        disable_any_whitespace: false,
        disable_additional_properties: false,
        whitespace_pattern: None,
        field: "response_format".into(),
        after_reasoning: None,
    };
    let mut render = ChatRender::default();
    let (c, _) = apply(p.as_ref().unwrap(), template(true, Family::Hermes), &mut render, Some(&reply)).unwrap();
    assert_eq!(tree(&c)["type"], json!("or"));
    assert_eq!(tree(&c)["elements"][0]["type"], json!("json_schema"));
    // A forced choice is calls only.
    let (p, _) = plan(json!({"tools": [weather()], "tool_choice": "required"})).unwrap();
    let (c, _) = apply(p.as_ref().unwrap(), template(true, Family::Hermes), &mut render, Some(&reply)).unwrap();
    assert_ne!(tree(&c)["type"], json!("or"));
    // A structural tag cannot be nested as the reply's format.
    let (p, _) = plan(json!({"tools": [weather()]})).unwrap();
    let tag = Constraint { kind: ConstraintKind::StructuralTag(json!({})), ..reply };
    let e = apply(p.as_ref().unwrap(), template(true, Family::Hermes), &mut render, Some(&tag)).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("response_format"));
}
