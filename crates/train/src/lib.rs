//! The RL trainer (issue 4): ART trajectory groups in, a LoRA checkpoint out.
//!
//! - [`advantage`]: group-relative advantages and token weights (pure).
//! - [`loss`]: the PPO / CISPO policy loss and its gradient per token (pure).
//! - [`pack`]: trajectory sequences into rows, one optimizer step each (pure).

pub mod advantage;
pub mod loss;
pub mod pack;
