//! What a client asks the scheduler for, and what it gets back.

use tokio::sync::mpsc;

/// How to pick the next token. Values are checked by the server before they get here;
/// the sampler still clamps them so no input can make it misbehave.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 (or less) means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// OpenAI semantics: logit -= presence * [count > 0] + frequency * count, over generated tokens.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Added to the logit of each token id before sampling (OpenAI: -100..100).
    pub logit_bias: Vec<(u32, f32)>,
    /// Fixes the random stream; `None` draws a fresh seed.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

/// Restricts which tokens may come next (JSON schema, grammar). Called on the scheduler thread.
pub trait TokenConstraint: Send {
    /// Sets the logits of forbidden tokens to -inf. `logits`: [n_vocab].
    fn mask(&mut self, logits: &mut [f32]);
    /// Records the token that was sampled; returns false if the constraint rejects it.
    fn commit(&mut self, token: u32) -> bool;
    /// True once the constrained output is complete (generation stops with `Stop`).
    fn is_finished(&self) -> bool;
}

/// One generation job: a tokenized prompt and how to continue it.
pub struct GenerationRequest {
    /// Prompt token ids (BOS included if wanted). Must not be empty.
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// Upper bound on generated tokens; generation also stops when the slot's context is full.
    pub max_tokens: usize,
    /// Number of alternatives to report with each token's log-probability (0..=20);
    /// `None` reports no log-probabilities.
    pub logprobs: Option<usize>,
    /// Keep generating through end-of-generation tokens.
    pub ignore_eos: bool,
    pub constraint: Option<Box<dyn TokenConstraint>>,
}

impl std::fmt::Debug for GenerationRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenerationRequest")
            .field("prompt_len", &self.prompt.len())
            .field("sampling", &self.sampling)
            .field("max_tokens", &self.max_tokens)
            .field("logprobs", &self.logprobs)
            .field("constrained", &self.constraint.is_some())
            .finish()
    }
}

/// Log-probability of a generated token under the model (raw logits, temperature 1).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// The most likely alternatives, best first: (token id, logprob).
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token, or the constraint completed.
    Stop,
    /// `max_tokens` reached or the context is full.
    Length,
}

/// Token counts and timings of one finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens that were already in the slot's cache and were not computed again.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Seconds from admission to the first sampled token.
    pub prefill_seconds: f64,
    /// Seconds from the first to the last sampled token.
    pub decode_seconds: f64,
    /// Speculative decoding counters (`None`: the request decoded plainly).
    pub speculative: Option<SpecUsage>,
}

/// What speculation did for one request.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecUsage {
    /// Verify passes (steps) of the target.
    pub verify_passes: usize,
    /// Draft tokens proposed for verification, and how many the target kept.
    pub drafted: usize,
    pub accepted: usize,
}

impl SpecUsage {
    /// accepted / drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// What the scheduler sends back over a request's channel, in order: any number of
/// `Token`s, then exactly one `Done` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerationEvent {
    Token {
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Done {
        reason: FinishReason,
        usage: Usage,
    },
    Error(String),
}

/// The receiving end handed to the caller. Dropping it cancels the generation: the
/// scheduler sees the closed channel before its next step and frees the slot.
pub type GenerationStream = mpsc::UnboundedReceiver<GenerationEvent>;
