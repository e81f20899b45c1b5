use super::*;
use serde_json::json;

/// SmolLM2-135M-Instruct's template, as its GGUF carries it.
pub(crate) const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

fn inputs(add_generation_prompt: bool) -> RenderInputs {
    RenderInputs { add_generation_prompt, eos_token: "<|im_end|>".into(), ..Default::default() }
}

#[test]
fn smollm2_renders_chatml_with_default_system() {
    let t = ChatTemplate::new(SMOLLM2).unwrap();
    assert_eq!(t.format, ContentFormat::String);
    let out = t.render(&[json!({"role": "user", "content": "Hi"})], &inputs(true)).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let out = t
        .render(&[json!({"role": "system", "content": "S"}), json!({"role": "user", "content": "U"})], &inputs(false))
        .unwrap();
    assert_eq!(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

#[test]
fn parts_are_flattened_and_null_content_renders() {
    let t = ChatTemplate::new(SMOLLM2).unwrap();
    let msgs = [
        json!({"role": "system", "content": "S"}),
        json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
        json!({"role": "tool", "content": "42", "tool_call_id": "c1"}),
    ];
    let out = t.render(&msgs, &inputs(false)).unwrap();
    assert!(out.contains("<|im_start|>user\na\nb<|im_end|>"), "{out}");
    assert!(out.contains("<|im_start|>assistant\n<|im_end|>"), "{out}");
    assert!(out.contains("<|im_start|>tool\n42<|im_end|>"), "{out}");
}

#[test]
fn continue_final_message_cuts_the_end_of_turn() {
    let t = ChatTemplate::new(SMOLLM2).unwrap();
    let msgs = [json!({"role": "user", "content": "Hi"}), json!({"role": "assistant", "content": "Hello, I am"})];
    let mut i = inputs(false);
    i.continue_final_message = true;
    let out = t.render(&msgs, &i).unwrap();
    assert!(out.ends_with("<|im_start|>assistant\nHello, I am"), "{out}");
    i.add_generation_prompt = true;
    assert!(matches!(t.render(&msgs, &i), Err(TemplateError::Invalid(_))));
}

#[test]
fn kwargs_documents_tools_reach_the_template() {
    let src = "{{ greeting }}|{{ documents[0].title }}|{{ tools | length }}|{{ reasoning_effort }}|{{ 'AbC'.lower() }}|{{ {'a': 1} | tojson }}";
    let t = ChatTemplate::new(src).unwrap();
    let mut i = inputs(true);
    i.kwargs.insert("greeting".into(), json!("hey"));
    i.documents = Some(json!([{"title": "T", "text": "x"}]));
    i.tools = Some(json!([{"type": "function"}, {"type": "function"}]));
    i.reasoning_effort = Some("low".into());
    assert_eq!(t.render(&[], &i).unwrap(), "hey|T|2|low|abc|{\"a\": 1}");
}

#[test]
fn errors_are_reported_not_panics() {
    assert!(matches!(ChatTemplate::new("{% for x in %}"), Err(TemplateError::Syntax(_))));
    let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}").unwrap();
    match t.render(&[], &inputs(true)) {
        Err(TemplateError::Render(m)) => assert!(m.contains("roles must alternate"), "{m}"),
        other => panic!("{other:?}"),
    }
    // An endless loop runs out of fuel instead of hanging.
    let t = ChatTemplate::new("{% for i in range(100000000) %}{{ i }}{% endfor %}").unwrap();
    assert!(t.render(&[], &inputs(true)).is_err());
}

#[test]
fn openai_format_templates_get_parts() {
    let src = "{% for m in messages %}{% for p in m['content'] %}[{{ p.text }}]{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(src).unwrap();
    assert_eq!(t.format, ContentFormat::OpenAi);
    let out = t
        .render(
            &[json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})],
            &inputs(false),
        )
        .unwrap();
    assert_eq!(out, "[a][b]");
}

/// The output cap holds while rendering: the audit's template wrote 12 x 50 MB and grew the
/// server by 1.1 GB before the cap was checked; now the first oversized write ends the render.
#[test]
fn output_is_capped_while_rendering() {
    let t = ChatTemplate::new(r#"{% set s = "x" * 5000000 %}{% for i in range(12) %}{{ s }}{% endfor %}"#).unwrap();
    match t.render(&[], &inputs(true)) {
        Err(TemplateError::Render(m)) => assert!(m.contains("exceeds"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Just under the cap renders.
    let t = ChatTemplate::new(r#"{{ "x" * 4000000 }}"#).unwrap();
    assert_eq!(t.render(&[], &inputs(true)).unwrap().len(), 4_000_000);
}

/// The jail's child side: one job in, one answer out, errors as answers.
#[test]
fn jail_child_answers_rendered_text_or_the_error() {
    let run = |source: &str| {
        let job = jail::JailJob {
            source: source.into(),
            messages: vec![json!({"role": "user", "content": "hi"})],
            inputs: inputs(true),
        };
        let mut out = Vec::new();
        jail::serve_one(serde_json::to_vec(&job).unwrap().as_slice(), &mut out).unwrap();
        serde_json::from_slice::<serde_json::Value>(&out).unwrap()
    };
    assert_eq!(run("{{ messages[0].content }}!"), json!({"rendered": "hi!"}));
    assert!(run("{% for %}")["syntax"].as_str().is_some());
    assert!(run("{{ raise_exception('no') }}")["render"].as_str().unwrap().contains("no"));
}
