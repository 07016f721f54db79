//! One speculative step: draft, verify in one batch, accept (greedy match or rejection
//! sampling), settle the model. Knows nothing of text: [`super::generate`] wraps it.

use super::acceptance::{Draft, DraftSampler};
use super::{SpecError, SpecModel, SpecOptions, SpecStats};
use crate::sampler::Sampler;

/// Drives a [`SpecModel`] one step at a time.
pub struct SpeculativeDecoder<'a, S: SpecModel> {
    model: &'a mut S,
    /// The target pipeline: the same sampler plain generation would use.
    sampler: &'a mut Sampler,
    /// Proposals and acceptance tests (its own RNG streams and penalty window).
    drafts: DraftSampler,
    opts: SpecOptions,
    stats: SpecStats,
    /// Target logits for the token after the prompt (until the first step uses them).
    first_logits: Option<Vec<f32>>,
    /// The last decided token: already emitted, not yet run through the target.
    last: Option<u32>,
    /// Tokens that may be decided: the first `n_use` of each logits row (a model may pad its
    /// output head past the tokenizer's vocabulary).
    n_use: usize,
}

impl<'a, S: SpecModel> SpeculativeDecoder<'a, S> {
    pub fn new(model: &'a mut S, sampler: &'a mut Sampler, opts: SpecOptions) -> Self {
        let n_use = model.n_vocab();
        SpeculativeDecoder {
            model,
            drafts: DraftSampler::new(sampler.config()),
            sampler,
            opts,
            stats: SpecStats::default(),
            first_logits: None,
            last: None,
            n_use,
        }
    }

    /// Decides only among the first `n` token ids (the tokenizer's vocabulary), as the plain
    /// loop does with padded output heads.
    pub fn limit_vocab(&mut self, n: usize) {
        self.n_use = n.clamp(1, self.model.n_vocab());
    }

    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    pub fn model(&self) -> &S {
        self.model
    }

    /// Runs the prompt through the target (and drafter); records it in both penalty windows.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<(), SpecError> {
        let logits = self.model.prefill(prompt)?;
        self.check_logits(logits.len(), 1)?;
        for &t in prompt {
            self.sampler.accept(t);
            self.drafts.accept(t);
        }
        self.first_logits = Some(logits);
        self.last = None;
        Ok(())
    }

    fn check_logits(&self, got: usize, rows: usize) -> Result<(), SpecError> {
        let expected = rows * self.model.n_vocab();
        if got != expected {
            return Err(SpecError::BadLogits { got, expected });
        }
        Ok(())
    }

    fn decided(&mut self, token: u32) {
        self.sampler.accept(token);
        self.drafts.accept(token);
    }

    /// The next decided tokens, at most `budget` (>= 1) of them: the first call samples one
    /// token from the prompt's logits; each later call is one draft + verify step giving the
    /// accepted drafts plus the target's own token. Needs `target_len() < n_ctx()`.
    pub fn next_tokens(&mut self, budget: usize) -> Result<Vec<u32>, SpecError> {
        if let Some(logits) = self.first_logits.take() {
            let t = self.sampler.sample(&logits[..self.n_use]);
            self.decided(t);
            self.last = Some(t);
            return Ok(vec![t]);
        }
        let t = self
            .last
            .ok_or(SpecError::Protocol("next_tokens before prefill"))?;
        let room = self.model.n_ctx().saturating_sub(self.model.target_len());
        if room == 0 {
            return Err(SpecError::Protocol("the target's context is full"));
        }
        let k_max = self.opts.draft_max.min(room - 1).min(budget.max(1) - 1);
        let mut drafts = self.draft(t, k_max)?;
        if drafts.len() < self.opts.draft_min {
            drafts.clear();
        }
        let mut tokens = Vec::with_capacity(drafts.len() + 1);
        tokens.push(t);
        tokens.extend(drafts.iter().map(|d| d.token));
        let logits = self.model.verify(&tokens)?;
        self.check_logits(logits.len(), tokens.len())?;
        let out = self.accept_prefix(&drafts, &logits)?;
        let n_accepted = out.len() - 1;
        self.model.accept(1 + n_accepted)?;
        self.stats.steps += 1;
        self.stats.drafted += drafts.len();
        self.stats.accepted += n_accepted;
        if n_accepted < drafts.len() {
            self.stats.rollbacks += 1;
        }
        self.last = out.last().copied();
        Ok(out)
    }

    /// Up to `k_max` draft tokens after `t`, stopping early on low drafter confidence.
    fn draft(&mut self, t: u32, k_max: usize) -> Result<Vec<Draft>, SpecError> {
        let mut drafts = Vec::new();
        let mut cur = t;
        while drafts.len() < k_max {
            let logits = self.model.draft_step(cur)?;
            self.check_logits(logits.len(), 1)?;
            let Some(d) = self.drafts.propose(&logits[..self.n_use], self.opts.p_min) else {
                break;
            };
            cur = d.token;
            drafts.push(d);
        }
        Ok(drafts)
    }

    /// Walks the verify rows: returns the kept drafts followed by one target token.
    fn accept_prefix(&mut self, drafts: &[Draft], logits: &[f32]) -> Result<Vec<u32>, SpecError> {
        let n_vocab = self.model.n_vocab();
        let mut out = Vec::with_capacity(drafts.len() + 1);
        for (j, row) in logits.chunks_exact(n_vocab).enumerate() {
            let v = self
                .drafts
                .judge(self.sampler, &row[..self.n_use], drafts.get(j));
            self.decided(v.token);
            out.push(v.token);
            if !v.kept_draft {
                return Ok(out);
            }
        }
        Err(SpecError::Protocol("verify returned no rows"))
    }
}
