//! The trainer: ART trajectory groups (RL) or conversations (SFT) in, a LoRA checkpoint out.
//!
//! - [`advantage`]: group-relative advantages and token weights (pure).
//! - [`pack`]: trajectory sequences into rows, one optimizer step each, sequences that share a
//!   prefix as prefix trees, and rows into parts of bounded size (pure).
//! - [`loss`]: the PPO / CISPO policy loss and its gradient per token (pure).
//! - [`token_loss`]: Tinker's built-in losses per datum (cross-entropy, importance sampling, PPO,
//!   CISPO), summed over tokens, on `loss`'s per-token terms (pure).
//! - [`ops`]: candle custom ops with written backward passes (LoRA over a frozen weight, fused head).
//! - [`fused`]: RMS norm, RoPE, causal softmax and SiLU-mul as single ops with written backward.
//! - [`net`]: the Llama forward pass with LoRA on candle autograd.
//! - [`tree`]: forward and backward over a row's parts, a tree cut into parts running its prefix
//!   once.
//! - [`adapter`]: PEFT adapter files (init, load, save).
//! - [`adamw`]: AdamW whose moments can be written out and read back.
//! - [`held`]: a run's adapter and optimizer between steps, in memory or parked in a file.
//! - [`trainer`]: the RL job, end to end ([`LoraTrainer`]).
//! - [`session`]: a training session held between calls (Tinker's model): gradients summed
//!   over `forward_backward` calls until `optim_step`.
//! - [`tinker`]: the sessions the Tinker routes drive (`tandem_core::tinker::TinkerTrainer`),
//!   each call taking the trainer's turn.
//! - [`expiry`]: when Tinker checkpoints expire, kept beside each run's saved states.
//! - [`sft`]: the supervised fine-tuning job (conversations, mean cross-entropy).
//!
//! Tokenizing trajectories is in `tandem_core::sequences`, so the api can refuse a job whose
//! trajectories cannot be tokenized before it is queued.

pub mod adamw;
pub mod adapter;
pub mod advantage;
pub mod encrypt;
pub mod fused;
pub mod head_lora;
pub mod held;
pub mod linear;
pub mod loss;
pub mod net;
pub mod ops;
pub mod pack;
pub mod recompute;
pub mod session;
pub mod sft;
pub mod tinker;
pub mod token_loss;
pub mod trainer;
pub mod tree;

pub use trainer::{LoraTrainer, TrainBase};

use tandem_core::sequences::ChatTokenizer;
pub use tandem_core::sequences::ModelTokenizer;

/// A chat tokenizer the trainer can share across threads.
pub trait TrainTokenizer: ChatTokenizer + Send + Sync {}
impl<T: ChatTokenizer + Send + Sync> TrainTokenizer for T {}

/// candle's CPU backend runs elementwise ops of 64K values or more on a thread pool of its own
/// (one thread fewer than `RAYON_NUM_THREADS`), whose threads spin ~25,000 times after each op
/// before they sleep. On two cores that spinning took a fifth of a training job's samples from
/// the trainer's own threads (perf, session 26: a job of 8 x 340 tokens 4.7 s, 3.4 s with the
/// ops inline). Those ops (residual adds, casts, concatenations) are a small part of the work,
/// so they run on the calling thread: `CANDLE_NUM_THREADS=1` unless the environment sets it.
/// Call first thing in `main`, before any thread starts (candle reads it once, at first use).
pub fn run_candle_ops_inline() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
