//! The decoder against a fake target/drafter pair over a 4-token vocabulary whose logits
//! depend on the whole context (so a rollback bug changes the numbers): greedy output equals
//! plain greedy decoding, and sampled sequences follow exactly the target's distribution
//! (chi-square over all 64 sequences of 3 tokens, fixed seeds).

use super::*;
use crate::sampler::{Sampler, SamplerConfig};

const V: usize = 4;

/// Deterministic pseudo-random logits in [-2, 2) for a context.
fn logits_of(ctx: &[u32], salt: u64) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ salt;
    for &t in ctx {
        h = (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3);
    }
    (0..V)
        .map(|i| {
            let mut x = h ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 29;
            (x % 4000) as f32 / 1000.0 - 2.0
        })
        .collect()
}

/// Target: `logits_of(ctx, 1)`. Draft: target logits plus a context-dependent perturbation,
/// so it agrees often but not always.
struct Fake {
    target: Vec<u32>,
    draft: Vec<u32>,
    in_step: bool,
    base: usize,
    n_verified: usize,
    n_ctx: usize,
}

impl Fake {
    fn new() -> Fake {
        Fake {
            target: Vec::new(),
            draft: Vec::new(),
            in_step: false,
            base: 0,
            n_verified: 0,
            n_ctx: 1 << 20,
        }
    }
}

fn draft_logits(ctx: &[u32]) -> Vec<f32> {
    let t = logits_of(ctx, 1);
    let noise = logits_of(ctx, 2);
    t.iter().zip(&noise).map(|(a, b)| a + 0.8 * b).collect()
}

impl SpecModel for Fake {
    fn n_vocab(&self) -> usize {
        V
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn target_len(&self) -> usize {
        self.target.len()
    }
    fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>, SpecError> {
        self.target.extend_from_slice(prompt);
        Ok(logits_of(&self.target, 1))
    }
    fn draft_step(&mut self, token: u32) -> Result<Vec<f32>, SpecError> {
        if !self.in_step {
            self.draft = self.target.clone();
            self.in_step = true;
        }
        self.draft.push(token);
        Ok(draft_logits(&self.draft))
    }
    fn verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>, SpecError> {
        self.base = self.target.len();
        let mut out = Vec::new();
        for &t in tokens {
            self.target.push(t);
            out.extend(logits_of(&self.target, 1));
        }
        self.n_verified = tokens.len();
        Ok(out)
    }
    fn accept(&mut self, n_keep: usize) -> Result<(), SpecError> {
        assert!(n_keep >= 1 && n_keep <= self.n_verified);
        self.target.truncate(self.base + n_keep);
        self.in_step = false;
        Ok(())
    }
}

/// `n` tokens from a fresh speculative run.
fn run(
    config: &SamplerConfig,
    opts: &SpecOptions,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, SpecStats) {
    let mut fake = Fake::new();
    let mut sampler = Sampler::new(config.clone());
    let mut dec = SpeculativeDecoder::new(&mut fake, &mut sampler, opts.clone());
    dec.prefill(prompt).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        out.extend(dec.next_tokens(n - out.len()).unwrap());
    }
    out.truncate(n);
    let stats = dec.stats();
    (out, stats)
}

const PROMPT: [u32; 3] = [1, 3, 0];

#[test]
fn greedy_equals_plain_greedy() {
    let config = SamplerConfig {
        repeat_penalty: 1.2,
        ..SamplerConfig::greedy()
    };
    let mut plain = Sampler::new(config.clone());
    let mut ctx = PROMPT.to_vec();
    for &t in &PROMPT {
        plain.accept(t);
    }
    let mut want = Vec::new();
    for _ in 0..40 {
        let t = plain.sample(&logits_of(&ctx, 1));
        plain.accept(t);
        ctx.push(t);
        want.push(t);
    }
    for draft_max in [1, 3, 8] {
        let opts = SpecOptions {
            draft_max,
            draft_min: 0,
            p_min: 0.0,
        };
        let (got, stats) = run(&config, &opts, &PROMPT, 40);
        assert_eq!(got, want, "draft_max {draft_max}");
        assert!(stats.drafted > 0 && stats.accepted > 0 && stats.rollbacks > 0);
    }
}

/// Exact probability of every sequence of `len` tokens under the target + sampler pipeline.
fn exact_distribution(config: &SamplerConfig, len: usize) -> Vec<f64> {
    let mut probs = vec![0.0f64; V.pow(len as u32)];
    for (cell, p) in probs.iter_mut().enumerate() {
        let seq: Vec<u32> = (0..len)
            .map(|i| ((cell / V.pow((len - 1 - i) as u32)) % V) as u32)
            .collect();
        let mut s = Sampler::new(config.clone());
        let mut ctx = PROMPT.to_vec();
        for &t in &PROMPT {
            s.accept(t);
        }
        let mut prob = 1.0f64;
        for &t in &seq {
            let dist = s.probabilities(&logits_of(&ctx, 1));
            prob *= dist
                .iter()
                .find(|(id, _)| *id == t)
                .map_or(0.0, |(_, p)| f64::from(*p));
            s.accept(t);
            ctx.push(t);
        }
        *p = prob;
    }
    probs
}

/// Chi-square of `counts` against `probs` (cells with an expected count under 5 pooled);
/// returns (statistic, degrees of freedom).
fn chi_square(counts: &[usize], probs: &[f64], n: usize) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (&o, &p) in counts.iter().zip(probs) {
        let e = p * n as f64;
        if e < 5.0 {
            pool_o += o as f64;
            pool_e += e;
        } else {
            stat += (o as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e.max(1e-9);
        cells += 1;
    }
    (stat, cells.saturating_sub(1))
}

fn check_distribution(config: SamplerConfig, opts: SpecOptions) {
    const LEN: usize = 3;
    const N: usize = 40_000;
    let probs = exact_distribution(&config, LEN);
    assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-4);
    let mut counts = vec![0usize; probs.len()];
    let mut total = SpecStats::default();
    for seed in 0..N as u64 {
        let c = SamplerConfig {
            seed: seed * 7919 + 1,
            ..config.clone()
        };
        let (seq, stats) = run(&c, &opts, &PROMPT, LEN);
        let cell = seq.iter().fold(0usize, |a, &t| a * V + t as usize);
        counts[cell] += 1;
        total.drafted += stats.drafted;
        total.accepted += stats.accepted;
        total.rollbacks += stats.rollbacks;
    }
    for (c, p) in counts.iter().zip(&probs) {
        if *p == 0.0 {
            assert_eq!(
                *c, 0,
                "a sequence the target pipeline excludes was produced"
            );
        }
    }
    let (stat, dof) = chi_square(&counts, &probs, N);
    // 99.9th percentile of chi-square: dof + 3.1 sqrt(2 dof) + 5 bounds it for dof <= 63.
    let limit = dof as f64 + 3.1 * (2.0 * dof as f64).sqrt() + 5.0;
    let tv: f64 = counts
        .iter()
        .zip(&probs)
        .map(|(&c, &p)| (c as f64 / N as f64 - p).abs())
        .sum::<f64>()
        / 2.0;
    eprintln!(
        "chi2 {stat:.1} (dof {dof}, limit {limit:.1}), TV {tv:.4}, acceptance {:.2}, rollbacks {}",
        total.accepted as f64 / total.drafted.max(1) as f64,
        total.rollbacks
    );
    assert!(stat < limit, "chi-square {stat} over {limit} (dof {dof})");
    assert!(tv < 0.02, "total variation {tv}");
    assert!(total.drafted > 0 && total.accepted > 0 && total.rollbacks > 0);
}

#[test]
fn sampled_distribution_is_the_targets() {
    check_distribution(
        SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        },
        SpecOptions {
            draft_max: 3,
            draft_min: 0,
            p_min: 0.0,
        },
    );
}

#[test]
fn sampled_distribution_is_the_targets_through_the_whole_pipeline() {
    check_distribution(
        SamplerConfig {
            temperature: 0.7,
            top_k: 3,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.3,
            presence_penalty: 0.2,
            ..SamplerConfig::default()
        },
        SpecOptions {
            draft_max: 2,
            draft_min: 0,
            p_min: 0.1,
        },
    );
}

/// `Sampler::probabilities` (what the rejection rule uses) is the distribution
/// `Sampler::sample` (plain generation) draws from, through the whole pipeline.
#[test]
fn probabilities_match_the_frequencies_of_sample() {
    let logits: Vec<f32> = (0..12).map(|i| ((i * 7 % 5) as f32) * 0.6 - 1.0).collect();
    let config = SamplerConfig {
        temperature: 0.8,
        top_k: 8,
        top_p: 0.9,
        min_p: 0.05,
        repeat_penalty: 1.4,
        frequency_penalty: 0.3,
        logit_bias: vec![(3, 0.7), (5, f32::NEG_INFINITY)],
        seed: 11,
        ..SamplerConfig::default()
    };
    let mut s = Sampler::new(config);
    for t in [0u32, 2, 2, 9] {
        s.accept(t);
    }
    let probs = dense(s.probabilities(&logits), logits.len());
    assert!((probs.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    assert_eq!(probs[5], 0.0, "a banned token has no mass");
    let n = 40_000;
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(&logits) as usize] += 1;
    }
    let p64: Vec<f64> = probs.iter().map(|&p| f64::from(p)).collect();
    for (c, p) in counts.iter().zip(&p64) {
        if *p == 0.0 {
            assert_eq!(*c, 0);
        }
    }
    let (stat, dof) = chi_square(&counts, &p64, n);
    assert!(
        stat < dof as f64 + 3.1 * (2.0 * dof as f64).sqrt() + 5.0,
        "chi2 {stat} dof {dof}"
    );
}

fn dense(sparse: Vec<(u32, f32)>, n: usize) -> Vec<f32> {
    let mut v = vec![0.0; n];
    for (id, p) in sparse {
        v[id as usize] += p;
    }
    v
}

/// With the vocabulary limited (a padded output head), no draft, correction or bonus token
/// comes from past the limit, greedy or sampled.
#[test]
fn padded_head_tokens_are_never_decided() {
    for temperature in [0.0, 1.5] {
        for seed in 0..300u64 {
            let mut fake = Fake::new();
            let mut sampler = Sampler::new(SamplerConfig {
                temperature,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..SamplerConfig::default()
            });
            let opts = SpecOptions {
                draft_max: 3,
                draft_min: 0,
                p_min: 0.0,
            };
            let mut dec = SpeculativeDecoder::new(&mut fake, &mut sampler, opts);
            dec.limit_vocab(V - 1);
            dec.prefill(&PROMPT).unwrap();
            let mut out = Vec::new();
            while out.len() < 12 {
                out.extend(dec.next_tokens(12 - out.len()).unwrap());
            }
            assert!(out.iter().all(|&t| (t as usize) < V - 1), "{out:?}");
        }
    }
}
