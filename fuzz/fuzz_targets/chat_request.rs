//! Any bytes as a chat-completion body: parsed as JSON, then validated exactly as the server
//! validates it. Must never panic (a bad body is an error value, then a 400).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = tandem_api::openai::request::validate(&body, true);
        let _ = tandem_api::openai::request::validate(&body, false);
    }
});
