//! One speculative step: draft, verify in one batch, accept (greedy match or rejection
//! sampling), settle the model. Knows nothing of text: [`super::generate`] wraps it.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{SpecError, SpecModel, SpecOptions, SpecStats};
use crate::sampler::Sampler;

/// Drives a [`SpecModel`] one step at a time.
pub struct SpeculativeDecoder<'a, S: SpecModel> {
    model: &'a mut S,
    /// The target pipeline: the same sampler plain generation would use.
    sampler: &'a mut Sampler,
    /// Proposals: same settings, its own RNG (a draw must not share randomness with the
    /// acceptance test), penalty window fed with the accepted tokens only.
    draft_sampler: Sampler,
    draft_rng: StdRng,
    /// Acceptance tests and residual / bonus draws.
    rng: StdRng,
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

/// A draft token and the drafter's distribution it was drawn from (`None`: greedy).
struct Draft {
    token: u32,
    q: Option<Vec<f32>>,
}

impl<'a, S: SpecModel> SpeculativeDecoder<'a, S> {
    pub fn new(model: &'a mut S, sampler: &'a mut Sampler, opts: SpecOptions) -> Self {
        let seed = sampler.config().seed;
        let n_use = model.n_vocab();
        let mut draft_config = sampler.config().clone();
        draft_config.seed = seed ^ 0x5eed_d4af;
        SpeculativeDecoder {
            model,
            draft_sampler: Sampler::new(draft_config),
            sampler,
            draft_rng: StdRng::seed_from_u64(seed ^ 0xd4af_0001),
            rng: StdRng::seed_from_u64(seed ^ 0xacce_9700),
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

    fn greedy(&self) -> bool {
        self.sampler.config().temperature <= 0.0
    }

    /// Runs the prompt through the target (and drafter); records it in both penalty windows.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<(), SpecError> {
        let logits = self.model.prefill(prompt)?;
        self.check_logits(logits.len(), 1)?;
        for &t in prompt {
            self.sampler.accept(t);
            self.draft_sampler.accept(t);
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
        self.draft_sampler.accept(token);
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
        let greedy = self.greedy();
        while drafts.len() < k_max {
            let logits = self.model.draft_step(cur)?;
            self.check_logits(logits.len(), 1)?;
            let logits = &logits[..self.n_use];
            let (d, confidence) = if greedy {
                let d = self.draft_sampler.sample(logits);
                (Draft { token: d, q: None }, softmax_at(logits, d as usize))
            } else {
                let q = dense(self.draft_sampler.probabilities(logits), logits.len());
                let u: f32 = self.draft_rng.random();
                let d = draw_dense(&q, u);
                let c = q[d as usize];
                (
                    Draft {
                        token: d,
                        q: Some(q),
                    },
                    c,
                )
            };
            if confidence < self.opts.p_min {
                break;
            }
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
            let row = &row[..self.n_use];
            let draft = drafts.get(j);
            if self.greedy() {
                let tgt = self.sampler.sample(row);
                self.decided(tgt);
                out.push(tgt);
                if draft.is_some_and(|d| d.token == tgt) {
                    continue;
                }
                return Ok(out);
            }
            let p = dense(self.sampler.probabilities(row), self.n_use);
            let Some(d) = draft else {
                // Every draft kept: the bonus token comes from the target alone.
                let u: f32 = self.rng.random();
                let tok = draw_dense(&p, u);
                self.decided(tok);
                out.push(tok);
                return Ok(out);
            };
            let q = d.q.as_ref().ok_or(SpecError::Protocol(
                "sampled draft without its distribution",
            ))?;
            let x = d.token as usize;
            let u: f32 = self.rng.random();
            // Accept with probability min(1, p(x)/q(x)); q(x) > 0 since x was drawn from q.
            if u * q[x] < p[x] {
                self.decided(d.token);
                out.push(d.token);
                continue;
            }
            // Rejected: draw from norm(max(0, p − q)); p == q (up to rounding) leaves no
            // mass, and then p itself is the right distribution.
            let mut r: Vec<f32> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
            let sum: f32 = r.iter().sum();
            if sum > 0.0 {
                for v in &mut r {
                    *v /= sum;
                }
            } else {
                r = p;
            }
            let u: f32 = self.rng.random();
            let tok = draw_dense(&r, u);
            self.decided(tok);
            out.push(tok);
            return Ok(out);
        }
        Err(SpecError::Protocol("verify returned no rows"))
    }
}

/// softmax(logits)[i] at temperature 1 (the drafter's confidence in a greedy pick).
fn softmax_at(logits: &[f32], i: usize) -> f32 {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return 0.0;
    }
    let sum: f32 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| (l - max).exp())
        .sum();
    let li = logits[i];
    if li.is_nan() {
        0.0
    } else {
        (li - max).exp() / sum
    }
}

/// Sparse `(id, p)` pairs as a dense `[n]` vector.
fn dense(sparse: Vec<(u32, f32)>, n: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    for (id, p) in sparse {
        if let Some(x) = v.get_mut(id as usize) {
            *x += p;
        }
    }
    v
}

/// Inverse-CDF draw from a dense distribution with `u` in [0, 1); rounding that leaves `u`
/// past the total picks the last token with mass.
fn draw_dense(p: &[f32], u: f32) -> u32 {
    let mut cum = 0.0f32;
    let mut last = 0u32;
    for (i, &pi) in p.iter().enumerate() {
        if pi > 0.0 {
            last = i as u32;
            cum += pi;
            if u < cum {
                return i as u32;
            }
        }
    }
    last
}

#[cfg(test)]
mod unit_tests {
    use super::*;

    #[test]
    fn draw_dense_walks_the_cdf_and_skips_zero_mass() {
        let p = [0.0, 0.25, 0.0, 0.75];
        assert_eq!(draw_dense(&p, 0.0), 1);
        assert_eq!(draw_dense(&p, 0.2499), 1);
        assert_eq!(draw_dense(&p, 0.25), 3);
        assert_eq!(draw_dense(&p, 0.99999), 3);
        assert_eq!(draw_dense(&[0.5, 0.4999], 0.99999), 1);
    }

    #[test]
    fn softmax_at_matches_by_hand() {
        let l = [0.0f32, (3.0f32).ln()];
        assert!((softmax_at(&l, 1) - 0.75).abs() < 1e-6);
        assert_eq!(softmax_at(&[f32::NEG_INFINITY; 2], 0), 0.0);
    }
}
