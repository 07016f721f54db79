//! Speculative decoding on the GPU (`ModelOn<CudaBackend>`; `--ignored`, needs a CUDA device):
//! greedy output with speculation equals plain greedy output on the same device —
//! stories260K drafting for itself (every draft accepted), the hybrid Qwen3.5 fixture drafted
//! by its Q8_0 copy (DeltaNet snapshot/rollback on the device), and, when
//! `REDLINE_MTP_FIXTURE` names a converted MTP fixture GGUF, MTP drafting.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cuda::backend::CudaBackend;
use cuda::CudaOptions;
use engine::sampler::{Sampler, SamplerConfig};
use engine::speculative::{
    DraftModelSpec, MtpSpec, SpecModel, SpecOptions, SpecStats, SpeculativeDecoder,
};
use model::{KvType, LoadOptions, ModelOn};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn load_gpu(path: &Path) -> ModelOn<CudaBackend> {
    let b = CudaBackend::new(&CudaOptions::default()).expect("a CUDA device (--ignored test)");
    let file = gguf::GgufFile::open(path).unwrap();
    ModelOn::load_on(b, Arc::new(file), &LoadOptions::default()).unwrap()
}

fn plain_greedy(m: &ModelOn<CudaBackend>, prompt: &[u32], n: usize) -> Vec<u32> {
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

fn spec_greedy<S: SpecModel>(
    spec: &mut S,
    prompt: &[u32],
    n: usize,
    k: usize,
) -> (Vec<u32>, SpecStats) {
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let opts = SpecOptions {
        draft_max: k,
        draft_min: 0,
        p_min: 0.0,
    };
    let mut dec = SpeculativeDecoder::new(spec, &mut sampler, opts);
    dec.prefill(prompt).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        out.extend(dec.next_tokens(n - out.len()).unwrap());
    }
    (out, dec.stats())
}

#[test]
#[ignore]
fn gpu_stories260k_self_draft_is_identical_and_accepts_everything() {
    let path = PathBuf::from(ROOT).join("models/stories260K.gguf");
    let target = load_gpu(&path);
    let draft = load_gpu(&path);
    let prompt = [1u32, 403, 407, 261, 378];
    let want = plain_greedy(&target, &prompt, 60);
    let mut spec = DraftModelSpec::new(
        &target,
        target.new_state(256, KvType::F32).unwrap(),
        &draft,
        draft.new_state(256, KvType::F32).unwrap(),
    )
    .unwrap();
    let (got, stats) = spec_greedy(&mut spec, &prompt, 60, 6);
    eprintln!("stories260K self-draft on the GPU: {stats:?}");
    assert_eq!(got, want);
    assert!(stats.drafted > 0);
    assert_eq!(stats.accepted, stats.drafted);
}

#[test]
#[ignore]
fn gpu_qwen35_with_q8_0_draft_is_identical() {
    let dir = PathBuf::from(ROOT).join("tests/data/fixtures/qwen35");
    let target = load_gpu(&dir.join("model-f32.gguf"));
    let draft = load_gpu(&dir.join("model-q8_0.gguf"));
    let prompt = [1u32, 42, 7, 300, 9, 11];
    let want = plain_greedy(&target, &prompt, 48);
    for k in [2, 5] {
        let mut spec = DraftModelSpec::new(
            &target,
            target.new_state(256, KvType::F32).unwrap(),
            &draft,
            draft.new_state(256, KvType::F32).unwrap(),
        )
        .unwrap();
        let (got, stats) = spec_greedy(&mut spec, &prompt, 48, k);
        eprintln!("qwen35 + q8_0 draft on the GPU, k={k}: {stats:?}");
        assert_eq!(got, want, "k {k}");
        assert!(stats.accepted > 0);
    }
}

#[test]
#[ignore]
fn gpu_mtp_fixture_is_identical() {
    let Some(path) = std::env::var_os("REDLINE_MTP_FIXTURE") else {
        eprintln!("skipping: REDLINE_MTP_FIXTURE is not set");
        return;
    };
    let m = load_gpu(Path::new(&path));
    assert!(m.load_mtp().unwrap());
    let prompt = [1u32, 42, 7, 300, 9, 11];
    let want = plain_greedy(&m, &prompt, 40);
    let mut spec = MtpSpec::new(&m, m.new_state(256, KvType::F32).unwrap(), KvType::F32).unwrap();
    let (got, stats) = spec_greedy(&mut spec, &prompt, 40, 3);
    eprintln!("MTP fixture on the GPU: {stats:?}");
    assert_eq!(got, want);
    assert!(stats.drafted > 0);
}
