//! Any bytes as a chat template (up to the first NUL) and the messages to render with it (after
//! it, as JSON; a default conversation otherwise). Rendering is bounded by fuel and the output
//! cap; it must return a value or an error, never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use tandem_engine::template::{ChatTemplate, RenderInputs};

fuzz_target!(|data: &[u8]| {
    let (source, rest) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(source) = std::str::from_utf8(source) else { return };
    let messages = match serde_json::from_slice::<Value>(rest) {
        Ok(Value::Array(m)) => m,
        _ => vec![json!({"role": "system", "content": "s"}), json!({"role": "user", "content": "hi"})],
    };
    if let Ok(t) = ChatTemplate::new(source) {
        let inputs = RenderInputs { add_generation_prompt: true, ..RenderInputs::default() };
        let _ = t.render(&messages, &inputs);
    }
});
