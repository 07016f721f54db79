//! Speculation inside the scheduler against a fake target/drafter pair over a 4-token
//! vocabulary whose logits depend on the whole context (a rollback or row mix-up changes the
//! numbers): greedy output equals plain greedy decoding with several slots batched, and
//! sampled outputs follow exactly the target's distribution (chi-square over all 256
//! sequences of 4 tokens, 8000 requests through the scheduler, fixed seeds).

use std::sync::Arc;

use super::*;
use crate::sampler::{Sampler, SamplerConfig};
use crate::speculative::SpecOptions;

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

/// Agrees with the target often but not always.
fn draft_logits(ctx: &[u32]) -> Vec<f32> {
    let t = logits_of(ctx, 1);
    let noise = logits_of(ctx, 2);
    t.iter().zip(&noise).map(|(a, b)| a + 0.8 * b).collect()
}

struct SpecFake {
    opts: SpecOptions,
}

#[derive(Default)]
struct FakeSeq {
    tokens: Vec<u32>,
    /// The drafter's context in an open round.
    draft: Option<Vec<u32>>,
    /// Open verify pass: length before it, token count.
    verify: Option<(usize, usize)>,
}

impl BatchModel for SpecFake {
    type State = FakeSeq;

    fn n_vocab(&self) -> usize {
        V
    }
    fn new_state(&self, _n_ctx: usize) -> Result<FakeSeq, String> {
        Ok(FakeSeq::default())
    }
    fn state_len(&self, s: &FakeSeq) -> usize {
        s.tokens.len()
    }
    fn truncate(&self, s: &mut FakeSeq, pos: usize) -> Result<usize, String> {
        assert!(s.draft.is_none() && s.verify.is_none());
        s.tokens.truncate(pos);
        Ok(s.tokens.len())
    }
    fn prefill(&self, s: &mut FakeSeq, tokens: &[u32]) -> Result<Vec<f32>, String> {
        s.tokens.extend_from_slice(tokens);
        Ok(logits_of(&s.tokens, 1))
    }
    fn decode_batch(
        &self,
        states: &mut [&mut FakeSeq],
        tokens: &[u32],
    ) -> Result<Vec<f32>, String> {
        let mut out = Vec::new();
        for (s, &t) in states.iter_mut().zip(tokens) {
            out.extend(self.prefill(s, &[t])?);
        }
        Ok(out)
    }
    fn speculation(&self) -> Option<SpecOptions> {
        Some(self.opts.clone())
    }
    fn draft_step(&self, states: &mut [&mut FakeSeq], tokens: &[u32]) -> Result<Vec<f32>, String> {
        let mut out = Vec::new();
        for (s, &t) in states.iter_mut().zip(tokens) {
            let ctx = s.draft.get_or_insert_with(|| s.tokens.clone());
            ctx.push(t);
            out.extend(draft_logits(ctx));
        }
        Ok(out)
    }
    fn forward_verify(
        &self,
        states: &mut [&mut FakeSeq],
        tokens: &[&[u32]],
        verify: &[bool],
    ) -> Result<Vec<f32>, String> {
        let mut out = Vec::new();
        for ((s, t), &v) in states.iter_mut().zip(tokens).zip(verify) {
            if v {
                assert!(s.verify.is_none(), "a verify pass was not settled");
                s.verify = Some((s.tokens.len(), t.len()));
                for &x in t.iter() {
                    s.tokens.push(x);
                    out.extend(logits_of(&s.tokens, 1));
                }
            } else {
                out.extend(self.prefill(s, t)?);
            }
        }
        Ok(out)
    }
    fn settle(&self, states: &mut [&mut FakeSeq], keep: &[usize]) -> Result<(), String> {
        for (s, &k) in states.iter_mut().zip(keep) {
            let (base, n) = s.verify.take().ok_or("settle without verify")?;
            assert!(k >= 1 && k <= n);
            s.tokens.truncate(base + k);
            s.draft = None;
        }
        Ok(())
    }
}

const PROMPT: [u32; 3] = [1, 3, 0];

fn start(draft_max: usize, n_slots: usize) -> Scheduler {
    let model = Arc::new(SpecFake {
        opts: SpecOptions {
            draft_max,
            draft_min: 0,
            p_min: 0.0,
        },
    });
    let config = SchedulerConfig {
        n_slots,
        n_ctx_per_slot: 128,
        max_queue: 64,
        prefill_chunk: 2,
        eog_tokens: Vec::new(),
    };
    Scheduler::start(model, config).unwrap()
}

fn request(sampling: SamplingParams, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt: PROMPT.to_vec(),
        sampling,
        max_tokens,
        logprobs: None,
        ignore_eos: true,
        constraint: None,
    }
}

fn collect(mut rx: GenerationStream) -> (Vec<u32>, Usage) {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv() {
            Some(GenerationEvent::Token { id, .. }) => tokens.push(id),
            Some(GenerationEvent::Done { usage, .. }) => return (tokens, usage),
            other => panic!("{other:?}"),
        }
    }
}

fn sampler_config(p: &SamplingParams) -> SamplerConfig {
    SamplerConfig {
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
        min_p: p.min_p,
        repeat_penalty: 1.0,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        penalty_last_n: None,
        logit_bias: p.logit_bias.clone(),
        seed: p.seed.unwrap_or(0),
    }
}

#[test]
fn greedy_with_penalties_equals_plain_greedy_across_batched_slots() {
    let params = SamplingParams {
        temperature: 0.0,
        frequency_penalty: 0.7,
        ..Default::default()
    };
    // Plain greedy with the same pipeline: only generated tokens enter the penalty window.
    let mut plain = Sampler::new(sampler_config(&params));
    let mut ctx = PROMPT.to_vec();
    let mut want = Vec::new();
    for _ in 0..30 {
        let t = plain.sample(&logits_of(&ctx, 1));
        plain.accept(t);
        ctx.push(t);
        want.push(t);
    }
    for (draft_max, n_slots) in [(1, 1), (3, 3), (6, 2)] {
        let sched = start(draft_max, n_slots);
        let streams: Vec<_> = (0..5)
            .map(|_| sched.submit(request(params.clone(), 30)).unwrap())
            .collect();
        for rx in streams {
            let (got, usage) = collect(rx);
            assert_eq!(got, want, "draft_max {draft_max}, {n_slots} slots");
            let s = usage.speculative.unwrap();
            assert!(
                s.drafted > 0 && s.accepted > 0 && s.accepted < s.drafted,
                "{s:?}"
            );
            assert!(s.verify_passes < 30);
        }
    }
}

#[test]
fn sampled_sequences_follow_the_targets_distribution() {
    // 4 tokens: the first from the prompt's logits, then a verify pass of up to 2 drafts.
    const LEN: usize = 4;
    const N: usize = 8000;
    let params = |seed| SamplingParams {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        presence_penalty: 0.3,
        seed: Some(seed),
        ..Default::default()
    };
    // Exact probability of each of the V^LEN sequences.
    let mut probs = vec![0.0f64; V.pow(LEN as u32)];
    for (cell, p) in probs.iter_mut().enumerate() {
        let seq: Vec<u32> = (0..LEN)
            .map(|i| ((cell / V.pow((LEN - 1 - i) as u32)) % V) as u32)
            .collect();
        let mut s = Sampler::new(sampler_config(&params(0)));
        let mut ctx = PROMPT.to_vec();
        *p = 1.0;
        for &t in &seq {
            let dist = s.probabilities(&logits_of(&ctx, 1));
            *p *= dist
                .iter()
                .find(|(id, _)| *id == t)
                .map_or(0.0, |(_, q)| f64::from(*q));
            s.accept(t);
            ctx.push(t);
        }
    }
    let sched = start(2, 4);
    let mut counts = vec![0usize; probs.len()];
    let mut drafted = 0;
    for batch in 0..N / 50 {
        let streams: Vec<_> = (0..50)
            .map(|i| {
                sched
                    .submit(request(params((batch * 50 + i) as u64), LEN))
                    .unwrap()
            })
            .collect();
        for rx in streams {
            let (toks, usage) = collect(rx);
            assert_eq!(toks.len(), LEN);
            drafted += usage.speculative.unwrap().drafted;
            let cell = toks.iter().fold(0usize, |c, &t| c * V + t as usize);
            counts[cell] += 1;
        }
    }
    assert!(drafted > N, "speculation ran ({drafted} drafts)");
    eprintln!("{drafted} drafts");
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (&o, &p) in counts.iter().zip(&probs) {
        let e = p * N as f64;
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
    let dof = cells - 1;
    // chi² critical value at p = 0.001 (Wilson–Hilferty approximation).
    let z = 3.09;
    let k = dof as f64;
    let limit = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
    assert!(
        stat < limit,
        "chi² {stat:.1} at {dof} dof (limit {limit:.1})"
    );
}
