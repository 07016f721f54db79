//! Whole models on the GPU: the fixture models (tests/data/fixtures/<arch>/) through
//! `ModelOn<CudaBackend>` against transformers' float64 logits and greedy continuation, the
//! q8_0 conversions against the same top-1 tokens, and stories260K against the CPU backend.
//! Needs a GPU: `cargo test -p cuda --release --test backend_models -- --ignored`.

use std::path::PathBuf;
use std::sync::Arc;

use cuda::backend::CudaBackend;
use cuda::CudaOptions;
use model::{KvType, LoadOptions, ModelOn};

fn data(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data")).join(path)
}

fn fixture(arch: &str, file: &str) -> PathBuf {
    data("fixtures").join(arch).join(file)
}

#[path = "../../../tests/support/fixture_reference.rs"]
mod fixture_reference;
use fixture_reference::{argmax, reference, rel_l2};

fn opts(ubatch_size: usize) -> LoadOptions {
    LoadOptions {
        n_threads: 2,
        ubatch_size,
    }
}

fn load_gpu(path: &PathBuf, ubatch_size: usize) -> ModelOn<CudaBackend> {
    let b = CudaBackend::new(&CudaOptions::default()).expect("a CUDA device (--ignored test)");
    let file = gguf::GgufFile::open(path).unwrap();
    ModelOn::load_on(b, Arc::new(file), &opts(ubatch_size)).unwrap()
}

/// Every prompt position within `tol` relative L2 of transformers, then the greedy tokens
/// exactly.
fn check_f32(arch: &str, kv: KvType, tol: f64, ubatch_size: usize) {
    let r = reference(arch);
    let m = load_gpu(&fixture(arch, "model-f32.gguf"), ubatch_size);
    let n_vocab = m.config().n_vocab;
    let mut s = m.new_state(64, kv).unwrap();
    let logits = m.forward(&mut s, &r.prompt_ids, true).unwrap();
    assert_eq!(logits.len(), r.prompt_ids.len() * n_vocab);
    let mut worst = 0.0f64;
    for (p, want) in r.logits.iter().enumerate() {
        let e = rel_l2(&logits[p * n_vocab..(p + 1) * n_vocab], want);
        worst = worst.max(e);
        assert!(
            e <= tol,
            "{arch} kv {kv} ubatch {ubatch_size}: position {p}: relative L2 error {e:.3e} > {tol:.0e}"
        );
    }
    let mut next = argmax(&logits[(r.prompt_ids.len() - 1) * n_vocab..]);
    let mut got = vec![next];
    while got.len() < r.greedy_ids.len() {
        let l = m.forward(&mut s, &[next], false).unwrap();
        next = argmax(&l);
        got.push(next);
    }
    assert_eq!(got, r.greedy_ids, "{arch} kv {kv}: greedy continuation");
    println!(
        "{arch} f32 kv {kv} ubatch {ubatch_size}: worst rel L2 {worst:.2e}, {} greedy tokens equal",
        got.len()
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn fixtures_f32_match_reference_on_gpu() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        check_f32(arch, KvType::F32, 1e-3, 512);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn fixtures_micro_batched_prefill_on_gpu() {
    for arch in ["llama", "qwen35"] {
        check_f32(arch, KvType::F32, 1e-3, 4);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn fixtures_f16_kv_on_gpu() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        check_f32(arch, KvType::F16, 2e-3, 512);
    }
}

/// Same rule as the CPU's q8_0 fixture test: top-1 agrees with transformers wherever its
/// top-2 margin exceeds what quantization can flip; logits within 0.25 relative L2.
#[test]
#[ignore = "needs a CUDA device"]
fn fixtures_q8_0_agree_on_top1_on_gpu() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        let r = reference(arch);
        let m = load_gpu(&fixture(arch, "model-q8_0.gguf"), 512);
        let n_vocab = m.config().n_vocab;
        let mut s = m.new_state(64, KvType::F16).unwrap();
        let logits = m.forward(&mut s, &r.prompt_ids, true).unwrap();
        let mut agree = 0;
        for (p, want) in r.logits.iter().enumerate() {
            let want32: Vec<f32> = want.iter().map(|&x| x as f32).collect();
            let row = &logits[p * n_vocab..(p + 1) * n_vocab];
            let top = argmax(&want32);
            let mut sorted = want32.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let margin = sorted[0] - sorted[1];
            if argmax(row) == top {
                agree += 1;
            } else {
                assert!(
                    margin < 0.05,
                    "{arch} q8_0: top-1 differs at position {p} (reference margin {margin})"
                );
            }
            let e = rel_l2(row, want);
            assert!(e < 0.25, "{arch} q8_0: position {p}: relative L2 error {e}");
        }
        println!(
            "{arch} q8_0 on GPU: top-1 agrees at {agree}/{} positions",
            r.logits.len()
        );
    }
}

/// stories260K (f32 weights): GPU and CPU logits within 1e-3 relative L2 at every prompt
/// position, then 48 greedy tokens equal.
#[test]
#[ignore = "needs a CUDA device"]
fn stories260k_matches_cpu() {
    let path = data("../../models/stories260K.gguf");
    let cpu = model::Model::load(&path, &opts(512)).unwrap();
    let gpu = load_gpu(&path, 512);
    let n_vocab = cpu.config().n_vocab;
    let prompt = [1u32, 432, 383, 286, 261, 376];
    let mut sc = cpu.new_state(128, KvType::F32).unwrap();
    let mut sg = gpu.new_state(128, KvType::F32).unwrap();
    let lc = cpu.forward(&mut sc, &prompt, true).unwrap();
    let lg = gpu.forward(&mut sg, &prompt, true).unwrap();
    assert_eq!(lc.len(), lg.len());
    for p in 0..prompt.len() {
        let want: Vec<f64> = lc[p * n_vocab..(p + 1) * n_vocab]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let e = rel_l2(&lg[p * n_vocab..(p + 1) * n_vocab], &want);
        assert!(
            e <= 1e-3,
            "stories260K position {p}: relative L2 {e:.3e} vs CPU"
        );
    }
    let (mut nc, mut ng) = (
        argmax(&lc[(prompt.len() - 1) * n_vocab..]),
        argmax(&lg[(prompt.len() - 1) * n_vocab..]),
    );
    let (mut tc, mut tg) = (vec![nc], vec![ng]);
    for _ in 0..47 {
        nc = argmax(&cpu.forward(&mut sc, &[nc], false).unwrap());
        ng = argmax(&gpu.forward(&mut sg, &[ng], false).unwrap());
        tc.push(nc);
        tg.push(ng);
    }
    assert_eq!(tg, tc, "stories260K greedy tokens, GPU vs CPU");
    println!(
        "stories260K: {} greedy tokens equal on GPU and CPU",
        tg.len()
    );
}
