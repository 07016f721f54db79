//! The sampling side of one speculative sequence, shared by the one-sequence decoder
//! ([`super::SpeculativeDecoder`]) and the server's slot scheduler: proposing draft tokens
//! from the drafter's logits and judging each verify row against the target.
//!
//! Greedy: a draft is the drafter's pick under the request's pipeline (bias, penalties) and is
//! kept iff the target picks the same token. Sampled: the draft `x ~ q` is kept with
//! probability `min(1, p(x) / q(x))`, else the token is drawn from `norm(max(0, p − q))`; a
//! row with no draft draws from `p` (Leviathan et al. 2023, Chen et al. 2023). `p` and `q` are
//! the full sampler pipeline's distributions ([`Sampler::probabilities`]).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::sampler::{Sampler, SamplerConfig};

/// A draft token and the drafter's distribution it was drawn from (`None`: greedy).
#[derive(Debug, Clone)]
pub struct Draft {
    pub token: u32,
    pub q: Option<Vec<f32>>,
}

/// Per-sequence drafting and acceptance state: the proposal sampler (same settings as the
/// target's, its own RNG, penalty window fed with decided tokens only) and the RNG of the
/// acceptance tests and residual / bonus draws.
pub struct DraftSampler {
    sampler: Sampler,
    draw_rng: StdRng,
    rng: StdRng,
}

/// What one verify row decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The decided token (the kept draft, or the target's own).
    pub token: u32,
    /// True if the row's draft was kept (the next row is judged too).
    pub kept_draft: bool,
}

impl DraftSampler {
    /// For a target sampled with `target` (its seed derives this one's streams).
    pub fn new(target: &SamplerConfig) -> DraftSampler {
        let seed = target.seed;
        let mut config = target.clone();
        config.seed = seed ^ 0x5eed_d4af;
        DraftSampler {
            sampler: Sampler::new(config),
            draw_rng: StdRng::seed_from_u64(seed ^ 0xd4af_0001),
            rng: StdRng::seed_from_u64(seed ^ 0xacce_9700),
        }
    }

    /// Records a decided token (prompt or output) in the proposal penalty window.
    pub fn accept(&mut self, token: u32) {
        self.sampler.accept(token);
    }

    fn greedy(&self) -> bool {
        self.sampler.config().temperature <= 0.0
    }

    /// The draft for the drafter's `logits` (`[n_use]`), or `None` when the drafter gives it
    /// less than `p_min` (drafting stops there).
    pub fn propose(&mut self, logits: &[f32], p_min: f32) -> Option<Draft> {
        let (d, confidence) = if self.greedy() {
            let d = self.sampler.sample(logits);
            (Draft { token: d, q: None }, softmax_at(logits, d as usize))
        } else {
            let q = dense(self.sampler.probabilities(logits), logits.len());
            let u: f32 = self.draw_rng.random();
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
        (confidence >= p_min).then_some(d)
    }

    /// Judges one verify row (`[n_use]` target logits scoring the token after the previous
    /// one) against its draft (`None`: the row after the last draft, or no drafts). Neither
    /// sampler's window is updated: the caller records the decided token in both.
    pub fn judge(&mut self, target: &mut Sampler, row: &[f32], draft: Option<&Draft>) -> Verdict {
        if self.greedy() {
            let token = target.sample(row);
            return Verdict {
                token,
                kept_draft: draft.is_some_and(|d| d.token == token),
            };
        }
        let p = dense(target.probabilities(row), row.len());
        let Some(d) = draft else {
            // Every draft kept: the bonus token comes from the target alone.
            let u: f32 = self.rng.random();
            return Verdict {
                token: draw_dense(&p, u),
                kept_draft: false,
            };
        };
        let Some(q) = d.q.as_ref() else {
            // A greedy draft under a sampled target cannot happen (one config for both);
            // treat it as a point mass, which the rule below handles exactly.
            let mut q = vec![0.0f32; p.len()];
            if let Some(x) = q.get_mut(d.token as usize) {
                *x = 1.0;
            }
            let d = Draft {
                token: d.token,
                q: Some(q),
            };
            return self.judge(target, row, Some(&d));
        };
        let x = d.token as usize;
        let u: f32 = self.rng.random();
        // Accept with probability min(1, p(x)/q(x)); q(x) > 0 since x was drawn from q.
        if x < p.len() && u * q[x] < p[x] {
            return Verdict {
                token: d.token,
                kept_draft: true,
            };
        }
        // Rejected: draw from norm(max(0, p − q)); p == q (up to rounding) leaves no mass,
        // and then p itself is the right distribution.
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
        Verdict {
            token: draw_dense(&r, u),
            kept_draft: false,
        }
    }
}

/// softmax(logits)[i] at temperature 1 (the drafter's confidence in a greedy pick).
pub(crate) fn softmax_at(logits: &[f32], i: usize) -> f32 {
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
pub(crate) fn dense(sparse: Vec<(u32, f32)>, n: usize) -> Vec<f32> {
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
pub(crate) fn draw_dense(p: &[f32], u: f32) -> u32 {
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
mod tests {
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
