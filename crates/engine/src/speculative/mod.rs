//! Speculative decoding: a cheap drafter proposes up to `draft_max` tokens, the target model
//! checks all of them in ONE batched forward (one pass over its weights for k + 1 tokens),
//! and the longest acceptable prefix is kept, plus one token from the target itself.
//!
//! One sequence: [`generate_speculative`] over a [`SpecModel`]. The server's slots:
//! [`SpecBatch`] (the scheduler's model with a drafter per slot; the scheduler drafts, verifies
//! and settles all slots in shared passes, `crate::scheduler`), judging rows with the same
//! [`DraftSampler`] as the one-sequence [`SpeculativeDecoder`].
//!
//! Two drafters over any backend (`model::ModelOn<B>`):
//! - [`DraftModelSpec`]: a separate small model with the same vocabulary (`-md DRAFT.gguf`);
//! - [`MtpSpec`]: Qwen3.5's own multi-token-prediction block (`model::arch::qwen35_mtp`),
//!   fed the target's hidden states.
//!
//! Acceptance ([`decoder`]): under greedy sampling a draft token is kept iff it equals the
//! target's own choice, so the output is token for token the plain greedy output. Under
//! sampling, the standard rule (Leviathan et al. 2023, Chen et al. 2023): keep draft token
//! `x ~ q` with probability `min(1, p(x) / q(x))`, else draw from `norm(max(0, p − q))`; when
//! every draft is kept, draw a bonus token from `p`. `p` is the target distribution after the
//! engine's whole sampler pipeline (bias, penalties, top-k/top-p/min-p, temperature:
//! [`crate::sampler::Sampler::probabilities`]), so the output distribution is exactly the
//! one plain sampling gives.
//!
//! Rollback of rejected tokens ([`target`]): KV caches truncate for free. A hybrid target
//! (Gated DeltaNet layers) cannot rewind its recurrent state, so the verify pass snapshots it
//! first (`SeqState::snapshot`); on a rejection the state is restored to the snapshot and the
//! kept tokens are run again (one more pass over the weights, only on steps with a
//! rejection; a fully accepted step needs no rollback). Per-position state capture inside the
//! delta-rule kernel would save that pass but needs a new backend op; the snapshot route is
//! exact and backend-generic. The draft model rolls back the same way, but lazily: its kept
//! tokens are re-fed together with the next draft step.

pub mod acceptance;
pub mod batch;
pub mod decoder;
pub mod draft_model;
pub mod generate;
pub mod mtp;
pub mod target;
#[cfg(test)]
mod tests;

pub use acceptance::{Draft, DraftSampler, Verdict};
pub use batch::{SlotDrafter, SpecBatch, SpecSeq};
pub use decoder::SpeculativeDecoder;
pub use draft_model::{check_same_vocab, DraftModelSpec};
pub use generate::generate_speculative;
pub use mtp::MtpSpec;
pub use target::TargetSession;

/// Drafting limits, named as llama.cpp's `--draft-max`, `--draft-min`, `--draft-p-min`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecOptions {
    /// Most tokens drafted per step.
    pub draft_max: usize,
    /// Drafts shorter than this are dropped (the step becomes a plain decode step).
    pub draft_min: usize,
    /// Drafting stops before a token the drafter gives less than this probability.
    pub p_min: f32,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            draft_max: 8,
            draft_min: 0,
            p_min: 0.75,
        }
    }
}

/// Counters of one speculative generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Verify passes of the target (one per step).
    pub steps: usize,
    /// Draft tokens proposed for verification.
    pub drafted: usize,
    /// Draft tokens the target accepted.
    pub accepted: usize,
    /// Steps with a rejected draft token (a rollback).
    pub rollbacks: usize,
}

impl SpecStats {
    /// accepted / drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens produced per target verify pass (1 = no gain).
    pub fn tokens_per_step(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            (self.steps + self.accepted) as f64 / self.steps as f64
        }
    }
}

/// Errors of speculative decoding.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error(transparent)]
    Model(#[from] model::ModelError),
    #[error("the draft model does not share the target's vocabulary: {0}")]
    VocabMismatch(String),
    #[error("the model has no MTP block (qwen35 files with nextn_predict_layers > 0)")]
    NoMtp,
    #[error("speculative decoding used out of order: {0}")]
    Protocol(&'static str),
    #[error("the model returned {got} logits, expected {expected}")]
    BadLogits { got: usize, expected: usize },
}

/// A target model paired with a drafter, as the decoder drives it. Implementations keep the
/// drafter in step with what the target accepted.
pub trait SpecModel {
    /// Vocabulary size (length of one logits row).
    fn n_vocab(&self) -> usize;
    /// Positions the target's state holds.
    fn n_ctx(&self) -> usize;
    /// Tokens the target's state holds.
    fn target_len(&self) -> usize;
    /// Appends `prompt` to the target (and prepares the drafter); returns the target logits
    /// of its last token, `[n_vocab]`.
    fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>, SpecError>;
    /// The drafter reads `token` (the first call of a step gets the last decided token,
    /// later calls the previous draft) and returns its logits for the next one, `[n_vocab]`.
    fn draft_step(&mut self, token: u32) -> Result<Vec<f32>, SpecError>;
    /// Runs `tokens` (the last decided token, then the drafts) through the target in one
    /// batched pass. Returns `[tokens.len(), n_vocab]`: row j scores the token after
    /// `tokens[j]`.
    fn verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SpecError>;
    /// Settles the step: the target keeps the first `n_keep` (1..=len) tokens of the last
    /// `verify` and drops the rest; the drafter follows.
    fn accept(&mut self, n_keep: usize) -> Result<(), SpecError>;
}
