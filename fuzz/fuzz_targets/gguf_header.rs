//! Any bytes as a GGUF file: the header is parsed and the model's config and tokenizer are read
//! from its metadata, as `tandem serve --model` does. Must return an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(data).expect("write");
    if let Ok(gguf) = tandem_model::GgufFile::open(file.path()) {
        let _ = gguf.llama_config();
        let _ = gguf.tokenizer_meta();
    }
});
