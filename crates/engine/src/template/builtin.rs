//! Chat templates tandem supplies for model files that carry none.
//!
//! Gemma 3's GGUF files have no `tokenizer.chat_template`. Its turn format is documented by
//! Google: `<start_of_turn>{role}\n{text}<end_of_turn>\n`, the assistant's role named `model`,
//! a system prompt placed at the start of the next user turn followed by a blank line, `<bos>`
//! first, and `<start_of_turn>model\n` as the generation prompt; a turn ends generation with
//! `<end_of_turn>`. The template below writes that format (written for tandem, not copied). It is
//! more lenient than Google's: roles need not alternate, and other roles (`tool`) are written as
//! turns of their own, so agent histories render instead of failing.

use tandem_model::Arch;

/// A built-in template and the token that ends a turn in it (added to the end-of-generation ids).
pub struct Builtin {
    pub source: &'static str,
    pub end_of_turn: &'static str,
}

const GEMMA: &str = r#"{{- bos_token -}}
{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
  {%- if message.role == 'system' -%}
    {%- set ns.system = ns.system ~ (message.content | trim) ~ '\n\n' -%}
  {%- else -%}
    {{- '<start_of_turn>' ~ ('model' if message.role == 'assistant' else message.role) ~ '\n' -}}
    {%- if message.role == 'user' -%}
      {{- ns.system -}}
      {%- set ns.system = '' -%}
    {%- endif -%}
    {{- (message.content | trim) ~ '<end_of_turn>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\n' -}}
{%- endif -%}"#;

/// The template for a file of `arch` that has none.
pub fn for_arch(arch: Arch) -> Option<Builtin> {
    match arch {
        Arch::Gemma3 => Some(Builtin { source: GEMMA, end_of_turn: "<end_of_turn>" }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{ChatTemplate, RenderInputs};
    use serde_json::json;

    #[test]
    fn gemma_turns_with_the_system_prompt_in_the_first_user_turn() {
        let t = ChatTemplate::new(for_arch(Arch::Gemma3).unwrap().source).unwrap();
        let messages = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": " Hi! "}),
            json!({"role": "assistant", "content": "Hello."}),
            json!({"role": "user", "content": "Bye"}),
        ];
        let inputs = RenderInputs { add_generation_prompt: true, bos_token: "<bos>".into(), ..Default::default() };
        assert_eq!(
            t.render(&messages, &inputs).unwrap(),
            "<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let inputs = RenderInputs { bos_token: "<bos>".into(), ..Default::default() };
        assert_eq!(t.render(&messages[1..2], &inputs).unwrap(), "<bos><start_of_turn>user\nHi!<end_of_turn>\n");
    }
}
