//! Per-request sampling for the scheduler: the OpenAI knobs of [`SamplingParams`] mapped onto
//! the engine's [`crate::sampler::Sampler`] (llama.cpp's default chain: bias, penalties,
//! top-k, top-p, min-p, temperature, draw), with the request's constraint mask applied
//! first, plus log-probabilities for reporting.

use rand::Rng;

use super::request::{SamplingParams, TokenConstraint, TokenLogprob};
use crate::sampler::{Sampler, SamplerConfig};

/// Sampling state of one request: the engine sampler, seeded from the request (a fresh seed
/// when it has none), whose penalty window holds every token the request generated.
pub struct RequestSampler {
    sampler: Sampler,
}

impl RequestSampler {
    pub fn new(params: SamplingParams) -> RequestSampler {
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        let config = SamplerConfig {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
            // OpenAI has no multiplicative repeat penalty.
            repeat_penalty: 1.0,
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            // OpenAI's penalties count all generated tokens (only those are accepted).
            penalty_last_n: None,
            logit_bias: params.logit_bias,
            seed,
        };
        RequestSampler {
            sampler: Sampler::new(config),
        }
    }

    /// Picks the next token from `logits` ([n_vocab], masked in place by `constraint`).
    /// `None` if no token is allowed (every logit -inf or NaN after the mask).
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        constraint: Option<&mut (dyn TokenConstraint + '_)>,
    ) -> Option<u32> {
        // Masking first is the same as masking after bias and penalties: a -inf logit stays
        // -inf under both (bias is finite, the repeat penalty is off).
        if let Some(c) = constraint {
            c.mask(logits);
        }
        // The engine sampler falls back to the raw argmax when everything is banned; here
        // that is a dead end the scheduler reports.
        if !logits.iter().any(|&l| l.is_finite()) {
            return None;
        }
        Some(self.sampler.sample(logits))
    }

    /// Whether this sampler only takes the argmax of the raw logits (greedy, no bias, no
    /// penalties): then [`backend::greedy_pick`] of a row is what [`RequestSampler::sample`]
    /// returns for it without a constraint.
    pub fn is_plain_greedy(&self) -> bool {
        self.sampler.top_needed(usize::MAX, 1) == Some(1)
    }

    /// How many of a row's best logits [`RequestSampler::sample_top`] needs to draw what
    /// [`RequestSampler::sample`] would from the whole row (without a constraint), at most
    /// `max`; `None`: the whole row ([`crate::sampler::Sampler::top_needed`]).
    pub fn top_needed(&self, n_vocab: usize, max: usize) -> Option<usize> {
        self.sampler.top_needed(n_vocab, max)
    }

    /// [`RequestSampler::sample`] from the row's [`backend::top_k_row`] (at least
    /// [`RequestSampler::top_needed`] of them; empty: no finite logit, `None`).
    pub fn sample_top(&mut self, top: &[(u32, f32)]) -> Option<u32> {
        self.sampler.sample_top(top)
    }

    /// The engine sampler's settings (with the seed actually used).
    pub fn config(&self) -> &SamplerConfig {
        self.sampler.config()
    }

    /// The engine sampler itself (speculative acceptance judges verify rows with it).
    pub fn engine_sampler(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// Records a generated token for the penalties.
    pub fn accept(&mut self, token: u32) {
        self.sampler.accept(token);
    }
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
        let mut s = RequestSampler::new(params(0.0));
        assert_eq!(s.sample(&mut [0.1, 2.0, 1.5, f32::NAN], None), Some(1));
        let mut s = RequestSampler::new(SamplingParams {
            logit_bias: vec![(2, 1.0), (99, 5.0)],
            ..params(0.0)
        });
        assert_eq!(s.sample(&mut [0.1, 2.0, 1.5], None), Some(2));
        assert_eq!(
            RequestSampler::new(params(0.0)).sample(&mut [f32::NEG_INFINITY; 3], None),
            None
        );
        assert_eq!(
            RequestSampler::new(params(1.0)).sample(&mut [f32::NAN; 3], None),
            None
        );
    }

    #[test]
    fn frequency_penalty_grows_with_count() {
        let mut s = RequestSampler::new(SamplingParams {
            frequency_penalty: 0.6,
            ..params(0.0)
        });
        s.accept(0);
        // 1.0 - 0.6 = 0.4 < 0.5
        assert_eq!(s.sample(&mut [1.0, 0.5], None), Some(1));
        let mut s = RequestSampler::new(SamplingParams {
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
            let mut s = RequestSampler::new(SamplingParams {
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
            let mut s = RequestSampler::new(p);
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

    /// Allows only the listed token ids.
    struct Only(Vec<u32>);

    impl TokenConstraint for Only {
        fn mask(&mut self, logits: &mut [f32]) {
            for (id, l) in logits.iter_mut().enumerate() {
                if !self.0.contains(&(id as u32)) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        fn commit(&mut self, _token: u32) -> bool {
            true
        }
        fn is_finished(&self) -> bool {
            false
        }
    }

    #[test]
    fn the_constraint_mask_comes_first_and_an_empty_mask_is_a_dead_end() {
        let logits = [5.0f32, 4.0, -3.0, 1.0];
        let mut s = RequestSampler::new(SamplingParams {
            logit_bias: vec![(0, 50.0)],
            ..params(2.0)
        });
        for _ in 0..200 {
            let t = s.sample(&mut logits.clone(), Some(&mut Only(vec![2, 3])));
            assert!(matches!(t, Some(2 | 3)), "{t:?}");
        }
        assert_eq!(s.sample(&mut logits.clone(), Some(&mut Only(vec![]))), None);
    }

    #[test]
    fn top_p_is_taken_before_temperature_as_in_llama_cpp() {
        // At T = 1 the probabilities are 0.665, 0.245, 0.090: top-p 0.7 keeps {0, 1}. Were
        // temperature 10 applied first (0.367, 0.332, 0.301) it would keep all three.
        let logits = [2.0f32, 1.0, 0.0];
        let mut s = RequestSampler::new(SamplingParams {
            top_p: 0.7,
            ..params(10.0)
        });
        let mut seen: Vec<u32> = (0..400)
            .map(|_| s.sample(&mut logits.clone(), None).unwrap())
            .collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, vec![0, 1]);
    }

    /// A small deterministic generator for the row tests (a 64-bit LCG's high bits).
    fn lcg(seed: u64) -> impl FnMut() -> u32 {
        let mut x = seed;
        move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u32
        }
    }

    /// `backend::greedy_pick` (what a device computes for greedy steps) is the plain greedy
    /// sampler's choice on every row: ties (the lowest id), NaN, -inf, +inf, nothing finite.
    #[test]
    fn greedy_pick_is_the_plain_greedy_samplers_choice() {
        let mut s = RequestSampler::new(params(0.0));
        assert!(s.is_plain_greedy());
        assert!(!RequestSampler::new(params(0.5)).is_plain_greedy());
        let mut next = lcg(12345);
        for case in 0..400 {
            let n = 1 + (next() % 300) as usize;
            let mut row: Vec<f32> = (0..n)
                .map(|_| match next() % 16 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 if case % 5 == 0 => f32::INFINITY,
                    // zeros of both signs (total order: -0 below +0)
                    3 => -0.0,
                    // few distinct values: many ties
                    _ => (next() % 8) as f32 * 0.5 - 2.0,
                })
                .collect();
            if case % 7 == 0 {
                row.fill(f32::NEG_INFINITY);
            }
            if case % 11 == 0 {
                // the largest value is zero, -0 before +0
                row.iter_mut().for_each(|v| *v = -v.abs() - 1.0);
                row[0] = -0.0;
                row[n - 1] = 0.0;
            }
            let want = s.sample(&mut row.clone(), None);
            assert_eq!(backend::greedy_pick(&row), want, "case {case}: {row:?}");
        }
    }

    /// Drawing from a row's best logits alone (what a device sends for top-k sampling) gives
    /// the same tokens as drawing from the whole row, draw after draw with one seed, for
    /// top-k, top-p, min-p and temperature settings; samplers that need the whole row say so.
    #[test]
    fn sampling_from_the_top_k_equals_sampling_from_the_row() {
        let mut next = lcg(99);
        for case in 0..60u64 {
            let p = SamplingParams {
                temperature: [0.0, 0.3, 0.8, 1.0, 1.7][case as usize % 5],
                top_k: [1, 2, 5, 40, 64][(case / 5) as usize % 5],
                top_p: [1.0, 0.95, 0.5][case as usize % 3],
                min_p: [0.0, 0.05, 0.2][(case / 3) as usize % 3],
                seed: Some(case),
                ..Default::default()
            };
            let (mut whole, mut top) = (RequestSampler::new(p.clone()), RequestSampler::new(p));
            let k = top.top_needed(500, 64).expect("a plain top-k sampler");
            for draw in 0..40 {
                let n = 200 + (next() % 300) as usize;
                let mut row: Vec<f32> = (0..n)
                    .map(|_| match next() % 50 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => -0.0,
                        3 => 0.0,
                        // a few distinct values near the top (ties), the rest spread out
                        4..=9 => 6.0 + (next() % 3) as f32 * 0.25,
                        _ => (next() % 1000) as f32 / 100.0 - 5.0,
                    })
                    .collect();
                if draw == 7 {
                    row.fill(f32::NEG_INFINITY);
                }
                let want = whole.sample(&mut row.clone(), None);
                let got = top.sample_top(&backend::top_k_row(&row, k));
                assert_eq!(got, want, "case {case} draw {draw}");
            }
        }
        let p = |f: fn(&mut SamplingParams)| {
            let mut p = params(0.8);
            p.top_k = 40;
            f(&mut p);
            RequestSampler::new(p).top_needed(1000, 64)
        };
        assert_eq!(p(|_| {}), Some(40));
        assert_eq!(p(|p| p.top_k = 0), None);
        assert_eq!(p(|p| p.top_k = 65), None);
        assert_eq!(p(|p| p.presence_penalty = 0.1), None);
        assert_eq!(p(|p| p.logit_bias = vec![(3, 1.0)]), None);
        assert_eq!(p(|p| p.temperature = 0.0), Some(1));
        assert_eq!(RequestSampler::new(params(0.8)).top_needed(1000, 64), None);
    }
}
