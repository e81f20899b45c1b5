//! A model file's tokenizer as files a Hugging Face client loads offline, read from its header
//! (`tandem export --tokenizer`), and the chat template a model is served with. Where the files
//! go (a directory or a hub cache) is `tandem_core::hf_files`.

use crate::inspect;
use crate::template::{builtin, ChatTemplate};
use crate::tokenizer::TextTokenizer;
use crate::EngineError;
use std::path::Path;
use tandem_core::hf_files::File;
use tandem_model::Arch;

/// The chat template a model is served with: the file's own, else the architecture's built-in
/// one (whose end-of-turn token then also ends generation, which `tok` learns).
pub(crate) fn served_template(
    own: Option<&str>,
    arch: Arch,
    tok: &mut TextTokenizer,
) -> Result<(Option<ChatTemplate>, Option<String>), EngineError> {
    Ok(match (own, builtin::for_arch(arch)) {
        (Some(source), _) => (Some(ChatTemplate::new(source)?), Some(source.to_string())),
        (None, Some(b)) => {
            tok.add_end_token(b.end_of_turn);
            (Some(ChatTemplate::new(b.source)?), Some(b.source.to_string()))
        }
        (None, None) => (None, None),
    })
}

/// The tokenizer files of a model file (GGUF or Hugging Face directory) as `serve` would serve
/// it, read from its header: no weights load. `max_model_len` shortens the context as `serve`'s
/// flag does.
pub fn files_of(path: &Path, max_model_len: Option<usize>) -> Result<Vec<File>, EngineError> {
    let inspect::Checked { config, meta, tokenizer: mut tok } = inspect::preflight(path)?;
    let (_, template) = served_template(meta.chat_template.as_deref(), config.arch, &mut tok)?;
    let context = max_model_len.map_or(config.context_len, |n| config.context_len.min(n.max(1)));
    Ok(with_config(tok.hf_files(template.as_deref(), context), config.arch))
}

/// The tokenizer files plus a `config.json` naming the architecture's `model_type`: loading by
/// name from a hub cache reads `config.json` first (a directory does without), and finds the
/// tokenizer class in `tokenizer_config.json`.
pub(crate) fn with_config(mut files: Vec<File>, arch: Arch) -> Vec<File> {
    files.push((
        "config.json".into(),
        serde_json::json!({ "model_type": arch.hf_model_type() }).to_string().into_bytes(),
    ));
    files
}
