//! Speculative decoding on the GPU (`ModelOn<CudaBackend>`; `--ignored`, needs a CUDA device):
//! greedy output with speculation equals plain greedy output on the same device —
//! stories260K drafting for itself (every draft accepted), the hybrid Qwen3.5 fixture drafted
//! by its Q8_0 copy (DeltaNet snapshot/rollback on the device), synthetic Q4_K_M cuts of real
//! shapes drafting for themselves with the tensor-core mmv2 products at every token count, and, when
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

/// `target` speculating with `draft` (their own fresh states) for n greedy tokens, k drafts.
fn draft_model_greedy(
    target: &ModelOn<CudaBackend>,
    draft: &ModelOn<CudaBackend>,
    prompt: &[u32],
    n: usize,
    k: usize,
) -> (Vec<u32>, SpecStats) {
    let mut spec = DraftModelSpec::new(
        target,
        target.new_state(256, KvType::F32).unwrap(),
        draft,
        draft.new_state(256, KvType::F32).unwrap(),
    )
    .unwrap();
    spec_greedy(&mut spec, prompt, n, k)
}

#[test]
#[ignore]
fn gpu_stories260k_self_draft_is_identical_and_accepts_everything() {
    let path = PathBuf::from(ROOT).join("models/stories260K.gguf");
    let target = load_gpu(&path);
    let draft = load_gpu(&path);
    let prompt = [1u32, 403, 407, 261, 378];
    let want = plain_greedy(&target, &prompt, 60);
    let (got, stats) = draft_model_greedy(&target, &draft, &prompt, 60, 6);
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
        let (got, stats) = draft_model_greedy(&target, &draft, &prompt, 48, k);
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

/// Largest |a - b| over the largest |b| (the rows' scale).
fn rel_max_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// A model drafting for itself must give plain greedy's tokens when each weight format's
/// products run on one activation grid at every token count. Synthetic Q4_K_M cuts of real
/// shapes (q4_K with q6_K V/down/head): Qwen3.5-27B to 4 layers (3 DeltaNet + 1 gated attention),
/// Qwen2.5-1.5B to 2. The acceptance rate is printed: every draft is accepted only if the rest
/// of a verify pass (attention over several rows, the chunked delta rule) is bit-equal to
/// one-token steps too, which this check does not require. A random-weight cut may repeat one
/// token (the H100, session 17: a degenerate greedy run), so the same property is also checked
/// on given tokens: a 4-row pass against 4 one-token steps from the same state, row by row,
/// within float-order noise (the products' grids agree; with q8_1 steps against q8_K rows each
/// product differs by ~1e-2 of its scale) and with the same greedy token. `what` names the
/// kernel setting the caller made.
fn synth_self_draft_is_identical(what: &str) {
    for (name, layers) in [("qwen3.5-27b", 4), ("qwen2.5-1.5b", 2)] {
        let path = std::env::temp_dir().join(format!("redline-spec-{name}-{layers}l.gguf"));
        model::synth::write_cut(name, layers, 32768, model::synth::FileType::Q4KM, &path)
            .expect("a synth preset")
            .unwrap();
        let target = load_gpu(&path);
        let draft = load_gpu(&path);
        let prompt: Vec<u32> = (0..9).map(|i| 100 + 31 * i).collect();
        // given tokens: one 4-row pass against 4 one-token steps
        let forced = [5000u32, 17, 23456, 999];
        let mut a = target.new_state(256, KvType::F32).unwrap();
        let mut b = target.new_state(256, KvType::F32).unwrap();
        target.forward(&mut a, &prompt, false).unwrap();
        target.forward(&mut b, &prompt, false).unwrap();
        let rows = target.forward(&mut b, &forced, true).unwrap();
        let nv = rows.len() / forced.len();
        for (i, &t) in forced.iter().enumerate() {
            let step = target.forward(&mut a, &[t], false).unwrap();
            let row = &rows[i * nv..(i + 1) * nv];
            let d = rel_max_diff(row, &step);
            eprintln!(
                "{name} ({what}): 4-row pass row {i} vs one-token step: max |diff| {d:.2e} of the scale"
            );
            assert!(
                d <= 1e-3,
                "{name} ({what}): row {i} differs by {d:.2e} of the scale"
            );
            // the token greedy speculation would take from each
            let mut greedy = Sampler::new(SamplerConfig::greedy());
            assert_eq!(
                greedy.sample(row),
                greedy.sample(&step),
                "{name} ({what}): row {i}'s greedy token"
            );
        }
        let want = plain_greedy(&target, &prompt, 24);
        let mut distinct = want.clone();
        distinct.sort_unstable();
        distinct.dedup();
        eprintln!(
            "{name}: greedy run of 24 tokens, {} distinct",
            distinct.len()
        );
        for k in [2, 4] {
            let (got, stats) = draft_model_greedy(&target, &draft, &prompt, 24, k);
            eprintln!("{name} self-draft ({what}), k={k}: {stats:?}");
            assert_eq!(got, want, "{name} ({what}) k {k}");
            assert!(
                stats.accepted > 0,
                "{name} ({what}) k {k}: no draft accepted"
            );
        }
        drop((target, draft));
        let _ = std::fs::remove_file(&path);
    }
}

/// With the tensor-core mmv2 products taking Q4_K and Q6_K at every token count
/// (`REDLINE_MMV2_MIN=1 REDLINE_MMV2_MIN_Q6K=1`), one-token steps and verify passes run the same
/// product kernels on the same q8_K grid.
#[test]
#[ignore]
fn gpu_synth_q4_k_m_self_draft_on_mmv2_at_every_count_is_identical() {
    cuda::mmv::set_mmv2(Some(true));
    cuda::mmv::set_mmv2_min_tokens(Some(1));
    let dev = cuda::CudaDevice::open(&CudaOptions::default()).expect("a CUDA device");
    assert!(cuda::mmv::mmv2_every_token_count(&dev));
    drop(dev);
    synth_self_draft_is_identical("mmv2 at every count");
    cuda::mmv::set_mmv2_min_tokens(None);
    cuda::mmv::set_mmv2(None);
}

/// The kernels a speculating run sets (`cuda::mmv::set_speculation`, what `--md` / `--mtp`
/// do): every format on one grid at every token count — the mmv2 dispatch takes a format at
/// every count 1..=8 or at none (by default none: Q4_K and Q6_K on the q8_1 kernels; with
/// `REDLINE_MMV2_MIN_Q6K=1`, Q6_K on mmv2 from one token).
#[test]
#[ignore]
fn gpu_synth_q4_k_m_self_draft_on_speculation_kernels_is_identical() {
    cuda::mmv::set_speculation(true);
    let dev = cuda::CudaDevice::open(&CudaOptions::default()).expect("a CUDA device");
    for ty in [gguf::GgmlType::Q4K, gguf::GgmlType::Q6K] {
        let on: Vec<bool> = (1..=8).map(|n| cuda::mmv::dispatch2(&dev, ty, n)).collect();
        assert!(
            on.iter().all(|&o| o == on[0]),
            "{}: mmv2 at some token counts only: {on:?}",
            ty.name()
        );
        eprintln!("speculating: {} on mmv2: {}", ty.name(), on[0]);
    }
    drop(dev);
    synth_self_draft_is_identical("speculation's kernels");
    cuda::mmv::set_speculation(false);
}
