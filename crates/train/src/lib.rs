//! The RL trainer (issue 4): ART trajectory groups in, a LoRA checkpoint out.
//!
//! - [`advantage`]: group-relative advantages and token weights (pure).
//! - [`pack`]: trajectory sequences into rows, one optimizer step each (pure).
//! - [`loss`]: the PPO / CISPO policy loss and its gradient per token (pure).
//! - [`ops`]: candle custom ops with written backward passes (frozen linear, fused head).
//! - [`net`]: the Llama forward pass with LoRA on candle autograd.
//! - [`adapter`]: PEFT adapter files (init, load, save).
//! - [`trainer`]: the job, end to end ([`LoraTrainer`]).
//!
//! Tokenizing trajectories is in `tandem_core::sequences`, so the api can refuse a job whose
//! trajectories cannot be tokenized before it is queued.

pub mod adapter;
pub mod advantage;
pub mod loss;
pub mod net;
pub mod ops;
pub mod pack;
pub mod trainer;

pub use trainer::{LoraTrainer, TrainBase};

use serde_json::Value;
use tandem_core::inference::{ChatRender, SharedBackend};
use tandem_core::sequences::ChatTokenizer;

/// A chat tokenizer the trainer can share across threads.
pub trait TrainTokenizer: ChatTokenizer + Send + Sync {}
impl<T: ChatTokenizer + Send + Sync> TrainTokenizer for T {}

/// The inference engine's template and tokenizer for base model `base`, used to re-render
/// Choices that came without token ids (so training sees the prompt serving saw).
pub struct BackendTokenizer {
    pub backend: SharedBackend,
    pub base: usize,
}

impl ChatTokenizer for BackendTokenizer {
    fn render(&self, messages: &[Value], tools: Option<&Value>) -> Result<Vec<u32>, String> {
        let chat = ChatRender {
            messages: messages.to_vec(),
            add_generation_prompt: true,
            tools: tools.cloned(),
            ..ChatRender::default()
        };
        self.backend.render_chat(self.base, &chat)
    }

    fn tokenize(&self, text: &str) -> Result<Vec<u32>, String> {
        self.backend.tokenize(self.base, text, false)
    }
}
