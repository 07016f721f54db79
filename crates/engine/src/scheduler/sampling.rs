//! Per-request token sampling with OpenAI's knobs: logit bias, presence/frequency
//! penalties, temperature, top-k, top-p, min-p, seed; and log-probabilities for reporting.
//!
//! Order (as llama.cpp's default chain): bias, penalties, constraint mask, top-k,
//! temperature, softmax, top-p, min-p, draw.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::request::{SamplingParams, TokenConstraint, TokenLogprob};

/// Sampling state of one request: parameters, its random stream and the counts of the
/// tokens it generated (for the penalties).
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    counts: HashMap<u32, u32>,
    // Reused buffer of (token, logit) candidates; avoids an allocation per token.
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        Sampler {
            params,
            rng: StdRng::seed_from_u64(seed),
            counts: HashMap::new(),
            candidates: Vec::new(),
        }
    }

    /// Picks the next token from `logits` ([n_vocab], modified in place). `None` if no token
    /// is allowed (every logit masked to -inf or NaN).
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        constraint: Option<&mut (dyn TokenConstraint + '_)>,
    ) -> Option<u32> {
        let p = &self.params;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &n) in &self.counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
        if let Some(c) = constraint {
            c.mask(logits);
        }

        if p.temperature <= 0.0 || !p.temperature.is_finite() {
            return argmax(logits);
        }

        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i as u32, l)),
        );
        if cands.is_empty() {
            return None;
        }
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cands.len() {
            cands.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            cands.truncate(p.top_k);
        }
        let needs_order = p.top_p < 1.0 || p.min_p > 0.0;
        if needs_order {
            cands.sort_unstable_by(by_logit_desc);
        }

        // Softmax at temperature T over the survivors: weights exp((l - max) / T).
        let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let t = p.temperature;
        let mut weights: Vec<f64> = cands
            .iter()
            .map(|c| (((c.1 - max) / t) as f64).exp())
            .collect();
        let total: f64 = weights.iter().sum();

        let mut keep = weights.len();
        if needs_order {
            if p.top_p < 1.0 {
                let target = p.top_p.max(0.0) as f64 * total;
                let mut acc = 0.0;
                for (i, w) in weights.iter().enumerate() {
                    acc += w;
                    if acc >= target {
                        keep = i + 1;
                        break;
                    }
                }
            }
            if p.min_p > 0.0 {
                // weights[0] is the most likely token's weight.
                let floor = p.min_p.min(1.0) as f64 * weights[0];
                keep = keep.min(weights.iter().take_while(|&&w| w >= floor).count().max(1));
            }
        }
        weights.truncate(keep.max(1));
        let total: f64 = weights.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            r -= w;
            if r < 0.0 {
                return Some(cands[i].0);
            }
        }
        Some(cands[weights.len() - 1].0)
    }

    /// Records a generated token for the penalties.
    pub fn accept(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }
}

/// Index of the largest finite logit (lowest index on ties); `None` if there is none.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i as u32, l));
        }
    }
    best.map(|b| b.0)
}

/// Log-softmax of `logits` at `token`, plus the `n_top` most likely tokens, best first.
pub fn token_logprob(logits: &[f32], token: u32, n_top: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| ((l - max) as f64).exp())
        .sum();
    let log_z = max as f64 + sum.ln();
    let lp = |l: f32| {
        if l.is_finite() {
            (l as f64 - log_z) as f32
        } else {
            f32::NEG_INFINITY
        }
    };
    let logprob = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| lp(l));
    let mut idx: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let by_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let n_top = n_top.min(idx.len());
    if n_top > 0 && n_top < idx.len() {
        idx.select_nth_unstable_by(n_top - 1, by_desc);
    }
    idx.truncate(n_top);
    idx.sort_unstable_by(by_desc);
    TokenLogprob {
        logprob,
        top: idx.into_iter().map(|(i, l)| (i, lp(l))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(7),
            ..Default::default()
        }
    }

    #[test]
    fn greedy_picks_the_largest_and_bias_can_move_it() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample(&mut [0.1, 2.0, 1.5, f32::NAN], None), Some(1));
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(2, 1.0), (99, 5.0)],
            ..params(0.0)
        });
        assert_eq!(s.sample(&mut [0.1, 2.0, 1.5], None), Some(2));
        assert_eq!(
            Sampler::new(params(0.0)).sample(&mut [f32::NEG_INFINITY; 3], None),
            None
        );
        assert_eq!(
            Sampler::new(params(1.0)).sample(&mut [f32::NAN; 3], None),
            None
        );
    }

    #[test]
    fn frequency_penalty_grows_with_count() {
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.6,
            ..params(0.0)
        });
        s.accept(0);
        // 1.0 - 0.6 = 0.4 < 0.5
        assert_eq!(s.sample(&mut [1.0, 0.5], None), Some(1));
        let mut s = Sampler::new(SamplingParams {
            presence_penalty: 0.4,
            ..params(0.0)
        });
        s.accept(0);
        s.accept(0);
        // presence counts once: 1.0 - 0.4 = 0.6 > 0.5
        assert_eq!(s.sample(&mut [1.0, 0.5], None), Some(0));
    }

    #[test]
    fn same_seed_same_tokens_and_distribution_matches_softmax() {
        let logits = [0.0f32, 1.0, 2.0, -1.0];
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams {
                seed: Some(seed),
                ..params(1.0)
            });
            (0..4000)
                .map(|_| s.sample(&mut logits.clone(), None).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        let draws = draw(5);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        for (id, &l) in logits.iter().enumerate() {
            let expected = (l as f64).exp() / z;
            let got = draws.iter().filter(|&&t| t == id as u32).count() as f64 / draws.len() as f64;
            assert!(
                (got - expected).abs() < 0.03,
                "token {id}: {got} vs {expected}"
            );
        }
    }

    #[test]
    fn top_k_top_p_min_p_restrict_the_support() {
        let logits = [3.0f32, 2.9, 0.0, -5.0, 2.8];
        let support = |p: SamplingParams| {
            let mut s = Sampler::new(p);
            let mut seen: Vec<u32> = (0..500)
                .map(|_| s.sample(&mut logits.clone(), None).unwrap())
                .collect();
            seen.sort_unstable();
            seen.dedup();
            seen
        };
        assert_eq!(
            support(SamplingParams {
                top_k: 2,
                ..params(1.0)
            }),
            vec![0, 1]
        );
        assert_eq!(
            support(SamplingParams {
                top_p: 0.01,
                ..params(1.0)
            }),
            vec![0]
        );
        // p(2)/p(0) = e^-3 ≈ 0.05 < 0.1; p(4)/p(0) = e^-0.2 > 0.1
        assert_eq!(
            support(SamplingParams {
                min_p: 0.1,
                ..params(1.0)
            }),
            vec![0, 1, 4]
        );
    }

    #[test]
    fn logprobs_are_a_log_softmax() {
        let logits = [1.0f32, 2.0, 3.0];
        let lp = token_logprob(&logits, 1, 2);
        let z = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((lp.logprob as f64 - (2.0 - z)).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        assert!((lp.top[0].1 as f64 - (3.0 - z)).abs() < 1e-5);
        assert_eq!(token_logprob(&logits, 99, 50).top.len(), 3);
    }
}
