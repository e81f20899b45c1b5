use super::*;

const TOOLS: [&str; 3] = ["get_weather", "get_time", "f"];

const ARGS: &str = "{\"city\": \"Paris\", \"days\": [1, 2]}";

#[test]
fn templates_name_their_family() {
    assert_eq!(Family::detect("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}"), Family::Hermes);
    assert_eq!(Family::detect("{{- \"[TOOL_CALLS][\" }}"), Family::Mistral);
    assert_eq!(Family::detect("'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'"), Family::DeepSeek);
    assert_eq!(
        Family::detect("<|start_header_id|>system<|end_header_id|>Respond in the format {\"name\": function name, \"parameters\": ..}"),
        Family::Llama3
    );
    // Llama 3.0's template has headers but no tools.
    assert_eq!(Family::detect("{{ '<|start_header_id|>' + message['role'] }}"), Family::Generic);
    assert_eq!(Family::detect("<|im_start|>{{ message.content }}"), Family::Generic);
}

#[test]
fn each_family_reads_back_what_it_writes() {
    for family in Family::ALL {
        let text = family.write(&[("get_weather", ARGS), ("get_time", "{}")]);
        let s = scan(family, &text, true, &TOOLS);
        assert_eq!(s.content_end, 0, "{family:?}: {text}");
        let got: Vec<(String, String)> =
            s.calls.iter().map(|c| (c.name.clone().unwrap(), c.arguments.clone())).collect();
        assert_eq!(
            got,
            vec![("get_weather".to_string(), ARGS.to_string()), ("get_time".to_string(), "{}".to_string())],
            "{family:?}: {text}"
        );
        // Text before the calls is content (Generic calls are the whole reply).
        if family != Family::Generic {
            let lead = format!("Let me check. {text}");
            let s = scan(family, &lead, true, &TOOLS);
            assert_eq!(&lead[..s.content_end], "Let me check. ", "{family:?}");
            assert_eq!(s.calls.len(), 2, "{family:?}");
        }
    }
}

#[test]
fn every_prefix_streams_a_growing_view_of_the_same_calls() {
    for family in Family::ALL {
        let text = format!(
            "{}{}",
            if family == Family::Generic { "" } else { "Sure. " },
            family.write(&[("get_weather", ARGS)])
        );
        let mut last_content = 0;
        let mut last_args = String::new();
        for end in (0..=text.len()).filter(|&e| text.is_char_boundary(e)) {
            let s = scan(family, &text[..end], false, &TOOLS);
            assert!(s.content_end >= last_content, "{family:?} at {end}: content shrank");
            last_content = s.content_end;
            if let Some(c) = s.calls.first() {
                assert!(
                    c.arguments.starts_with(&last_args),
                    "{family:?} at {end}: {:?} after {last_args:?}",
                    c.arguments
                );
                last_args = c.arguments.clone();
                if let Some(n) = &c.name {
                    assert_eq!(n, "get_weather", "{family:?} at {end}");
                }
            }
            // No part of the opener is ever shown as content.
            let shown = &text[..s.content_end];
            assert!(!shown.contains('<') && !shown.contains('{') && !shown.contains('['), "{family:?}: {shown:?}");
        }
        assert_eq!(last_args, ARGS, "{family:?}");
    }
}

#[test]
fn a_call_cut_short_is_no_call_and_text_without_calls_is_content() {
    let cut = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par";
    let whole = scan(Family::Hermes, cut, true, &TOOLS);
    assert_eq!((whole.content_end, whole.calls.len()), (cut.len(), 0));
    let streaming = scan(Family::Hermes, cut, false, &TOOLS);
    assert_eq!(streaming.content_end, 0);
    assert_eq!(streaming.calls[0].arguments, "{\"city\": \"Par");
    assert!(!streaming.calls[0].complete);
    let plain = scan(Family::Hermes, "The weather is fine.", true, &TOOLS);
    assert_eq!((plain.content_end, plain.calls.len()), (20, 0));
    // A partial opener is held while streaming, shown when the output ends.
    assert_eq!(scan(Family::Hermes, "Hi <tool_", false, &TOOLS).content_end, 3);
    assert_eq!(scan(Family::Hermes, "Hi <tool_", true, &TOOLS).content_end, 9);
    assert_eq!(scan(Family::Llama3, "Hi {\"na", false, &TOOLS).content_end, 3);
    assert_eq!(scan(Family::Generic, "  ", false, &TOOLS).content_end, 0);
    assert_eq!(scan(Family::Generic, "Hello {", false, &TOOLS).content_end, 7);
}

#[test]
fn lenient_reading_takes_the_slips_models_make() {
    // No blanks, arguments before the name, arguments as a JSON string.
    let s = scan(Family::Hermes, "<tool_call>{\"arguments\":{\"a\":1},\"name\":\"f\"}</tool_call>", true, &TOOLS);
    assert_eq!((s.calls[0].name.as_deref(), s.calls[0].arguments.as_str()), (Some("f"), "{\"a\":1}"));
    let s = scan(
        Family::Hermes,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>",
        true,
        &TOOLS,
    );
    assert_eq!(s.calls[0].arguments, "{\"a\": 1}");
    let s = scan(
        Family::Mistral,
        "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcdefghi\"}]",
        true,
        &TOOLS,
    );
    assert_eq!(s.calls.len(), 1);
    // Arguments that are not an object are no call.
    let s = scan(Family::Llama3, "{\"name\": \"f\", \"parameters\": 3}", true, &TOOLS);
    assert!(s.calls.is_empty());
    // Braces and quotes inside strings do not end the arguments.
    let s = scan(Family::Llama3, "{\"name\": \"f\", \"parameters\": {\"q\": \"a } \\\" {\"}}", true, &TOOLS);
    assert_eq!(s.calls[0].arguments, "{\"q\": \"a } \\\" {\"}");
}

#[test]
fn mistral_ids_are_nine_alphanumerics() {
    let id = Family::Mistral.call_id();
    assert_eq!(id.len(), 9);
    assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
    assert!(Family::Hermes.call_id().starts_with("chatcmpl-tool-"));
}

#[test]
fn a_bare_call_object_counts_only_when_it_names_a_tool() {
    // Qwen's slip: the Hermes object without its tags, after some text.
    let slip = "Here you go:\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
    let s = scan(Family::Hermes, slip, true, &TOOLS);
    assert_eq!(&slip[..s.content_end], "Here you go:\n");
    assert_eq!(s.calls[0].arguments, "{\"city\": \"Oslo\"}");
    // JSON about something else stays content, whole and streaming.
    let person = "{\"name\": \"Ada\", \"age\": 36}";
    assert_eq!(scan(Family::Hermes, person, true, &TOOLS), Scan { content_end: person.len(), calls: vec![] });
    assert_eq!(scan(Family::Llama3, person, false, &TOOLS).content_end, person.len());
    // While the name may still be a tool's, it is held.
    assert_eq!(scan(Family::Llama3, "ok {\"name\": \"get_w", false, &TOOLS).content_end, 3);
    let other = "ok {\"name\": \"Ad";
    assert_eq!(scan(Family::Llama3, other, false, &TOOLS).content_end, other.len());
}

#[test]
fn a_code_fence_around_a_bare_call_is_not_content() {
    let fenced = "Sure.\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n```";
    let s = scan(Family::Hermes, fenced, true, &TOOLS);
    assert_eq!(&fenced[..s.content_end], "Sure.\n");
    assert_eq!(s.calls.len(), 1);
    // While streaming, the fence is held until it is known not to open a call.
    assert_eq!(scan(Family::Hermes, "Sure.\n```json\n", false, &TOOLS).content_end, 6);
    assert_eq!(scan(Family::Hermes, "Sure.\n```json\n{", false, &TOOLS).content_end, 6);
    let doubled = "{{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}}";
    assert_eq!(scan(Family::Hermes, doubled, true, &TOOLS).content_end, 0, "Qwen's doubled brace");
    let code = "Sure.\n```python\nprint(1)";
    assert_eq!(scan(Family::Hermes, code, false, &TOOLS).content_end, code.len());
}
