//! Speculative decoding on real models (CPU): greedy output is token for token the plain
//! greedy output — stories260K drafting for itself (every draft must be accepted), and the
//! hybrid Qwen3.5 fixture (DeltaNet rollback) drafted by its own Q8_0 copy.

use std::ops::ControlFlow;
use std::path::Path;

use engine::generate::{generate, GenerateParams};
use engine::sampler::{Sampler, SamplerConfig};
use engine::speculative::{
    generate_speculative, DraftModelSpec, SpecModel, SpecOptions, SpeculativeDecoder,
};
use engine::Tokenizer;
use model::{KvType, LoadOptions, Model};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");
const STORIES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/stories260K.gguf");

fn load(path: &Path) -> Model {
    Model::load(path, &LoadOptions::default()).unwrap()
}

fn eager() -> SpecOptions {
    SpecOptions {
        draft_max: 6,
        draft_min: 0,
        p_min: 0.0,
    }
}

#[test]
fn stories260k_self_draft_is_identical_and_accepts_everything() {
    let m = load(Path::new(STORIES));
    let tok = Tokenizer::from_gguf(m.gguf().metadata()).unwrap();
    let prompt = tok.encode("Once upon a time", true, false).unwrap();
    let params = GenerateParams {
        max_tokens: 80,
        n_ctx: 256,
        stop: Vec::new(),
        ignore_eog: true,
    };
    let mut state = m.new_state(256, KvType::F16).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let plain = generate(
        |t: &[u32]| m.forward(&mut state, t, false),
        &tok,
        &mut sampler,
        &prompt,
        0,
        &params,
        |_| ControlFlow::Continue(()),
    )
    .unwrap();

    for draft_max in [1, 4, 8] {
        let mut spec = DraftModelSpec::new(
            &m,
            m.new_state(256, KvType::F16).unwrap(),
            &m,
            m.new_state(256, KvType::F16).unwrap(),
        )
        .unwrap();
        let mut sampler = Sampler::new(SamplerConfig::greedy());
        let opts = SpecOptions {
            draft_max,
            ..eager()
        };
        let (g, stats) = generate_speculative(
            &mut spec,
            &tok,
            &mut sampler,
            &prompt,
            &params,
            &opts,
            |_| ControlFlow::Continue(()),
        )
        .unwrap();
        assert_eq!(g.tokens, plain.tokens, "draft_max {draft_max}");
        assert_eq!(g.text, plain.text);
        assert_eq!(g.finish, plain.finish);
        assert!(stats.drafted > 0);
        assert_eq!(stats.accepted, stats.drafted, "a model agrees with itself");
        assert_eq!(stats.rollbacks, 0);
        // k drafts + 1 target token per verify pass (the last steps are cut by max_tokens).
        assert!(stats.steps <= params.max_tokens.div_ceil(draft_max + 1) + 2);
    }
}

#[test]
fn stories260k_sampling_with_a_stop_string_runs_to_the_limits() {
    let m = load(Path::new(STORIES));
    let tok = Tokenizer::from_gguf(m.gguf().metadata()).unwrap();
    let prompt = tok.encode("Lily", true, false).unwrap();
    let params = GenerateParams {
        max_tokens: 50,
        n_ctx: 40,
        stop: vec!["zzzz".into()],
        ignore_eog: true,
    };
    let mut spec = DraftModelSpec::new(
        &m,
        m.new_state(40, KvType::F16).unwrap(),
        &m,
        m.new_state(40, KvType::F16).unwrap(),
    )
    .unwrap();
    let mut sampler = Sampler::new(SamplerConfig {
        seed: 5,
        ..SamplerConfig::default()
    });
    let (g, stats) = generate_speculative(
        &mut spec,
        &tok,
        &mut sampler,
        &prompt,
        &params,
        &eager(),
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    // The context (40) ends it: the plain loop stops once 40 tokens are in the state.
    assert_eq!(g.finish, engine::generate::FinishReason::ContextFull);
    assert_eq!(prompt.len() + g.tokens.len() - 1, 40);
    assert!(spec.target_len() <= 40);
    assert!(stats.accepted > 0);
}

/// Plain greedy continuation of `prompt` for `n` tokens, one forward per token.
fn plain_greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut state = m.new_state(256, KvType::F32).unwrap();
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let mut logits = m.forward(&mut state, prompt, false).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = sampler.sample(&logits);
        out.push(t);
        logits = m.forward(&mut state, &[t], false).unwrap();
    }
    out
}

/// Greedy continuation through the speculative decoder.
pub fn spec_greedy<S: SpecModel>(
    spec: &mut S,
    prompt: &[u32],
    n: usize,
    opts: &SpecOptions,
) -> (Vec<u32>, engine::speculative::SpecStats) {
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let mut dec = SpeculativeDecoder::new(spec, &mut sampler, opts.clone());
    dec.prefill(prompt).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        out.extend(dec.next_tokens(n - out.len()).unwrap());
    }
    (out, dec.stats())
}

#[test]
fn qwen35_hybrid_target_with_q8_0_draft_is_identical() {
    let dir = Path::new(DATA).join("fixtures/qwen35");
    let target = load(&dir.join("model-f32.gguf"));
    let draft = load(&dir.join("model-q8_0.gguf"));
    let prompt = [1u32, 42, 7, 300, 9, 11];
    let want = plain_greedy(&target, &prompt, 48);
    for draft_max in [2, 5] {
        let mut spec = DraftModelSpec::new(
            &target,
            target.new_state(256, KvType::F32).unwrap(),
            &draft,
            draft.new_state(256, KvType::F32).unwrap(),
        )
        .unwrap();
        let opts = SpecOptions {
            draft_max,
            ..eager()
        };
        let (got, stats) = spec_greedy(&mut spec, &prompt, 48, &opts);
        assert_eq!(&got[..48], &want[..], "draft_max {draft_max}");
        eprintln!("qwen35 q8_0 draft, k={draft_max}: {stats:?}");
        assert!(stats.accepted > 0);
        // Deterministic: the Q8_0 draft disagrees somewhere, so the DeltaNet state was rolled
        // back at least once (k=2: 1 rollback, k=5: 3 when written).
        assert!(stats.rollbacks > 0);
    }
}

#[test]
fn draft_with_another_vocabulary_is_refused() {
    let target = load(Path::new(STORIES));
    let draft = load(&Path::new(DATA).join("fixtures/qwen35/model-q8_0.gguf"));
    let err = DraftModelSpec::new(
        &target,
        target.new_state(16, KvType::F16).unwrap(),
        &draft,
        draft.new_state(16, KvType::F16).unwrap(),
    )
    .err()
    .expect("different vocabularies");
    assert!(err.to_string().contains("vocabulary"), "{err}");
}

/// Sampling on the hybrid fixture: every step leaves the target holding exactly the decided
/// tokens but the last (rollbacks included), and the drafts are partly accepted.
#[test]
fn qwen35_sampling_keeps_the_target_in_step() {
    let dir = Path::new(DATA).join("fixtures/qwen35");
    let target = load(&dir.join("model-f32.gguf"));
    let draft = load(&dir.join("model-q8_0.gguf"));
    let prompt = [1u32, 42, 7, 300, 9, 11];
    let mut spec = DraftModelSpec::new(
        &target,
        target.new_state(256, KvType::F32).unwrap(),
        &draft,
        draft.new_state(256, KvType::F32).unwrap(),
    )
    .unwrap();
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.7,
        seed: 3,
        ..SamplerConfig::default()
    });
    let mut dec = SpeculativeDecoder::new(&mut spec, &mut sampler, eager());
    dec.prefill(&prompt).unwrap();
    let mut out = Vec::new();
    while out.len() < 60 {
        out.extend(dec.next_tokens(60 - out.len()).unwrap());
        assert_eq!(dec.model().target_len(), prompt.len() + out.len() - 1);
    }
    let stats = dec.stats();
    eprintln!("qwen35 sampled, q8_0 draft: {stats:?}");
    assert_eq!(out.len(), 60);
    assert!(stats.accepted > 0 && stats.rollbacks > 0, "{stats:?}");
}
