//! The hybrid (partial offload) backend on the real GPU: the conformance suite with nothing
//! and everything offloaded, and every fixture model and stories260K under several splits
//! against the CPU (f32 weights: relative L2 ≤ 1e-3, identical greedy tokens, one hidden-state
//! crossing per boundary per token). Without a GPU each test says so and passes.
//! `tests/hybrid_cpu.rs` runs the same checks with a CPU standing in for the GPU.

mod hybrid_checks;

use cuda::backend::CudaBackend;
use cuda::CudaOptions;
use hybrid_checks::*;

/// True (after a message) when there is no GPU to test on.
fn no_gpu(test: &str) -> bool {
    if cuda::device_count().unwrap_or(0) == 0 {
        eprintln!("{test}: skipped: no CUDA device");
        return true;
    }
    false
}

fn gpu() -> CudaBackend {
    CudaBackend::new(&CudaOptions::default()).expect("CUDA device")
}

#[test]
fn gpu_conformance_with_nothing_and_everything_offloaded() {
    if no_gpu("gpu_conformance_with_nothing_and_everything_offloaded") {
        return;
    }
    check_conformance(gpu);
}

#[test]
fn gpu_every_model_and_split_matches_the_cpu() {
    if no_gpu("gpu_every_model_and_split_matches_the_cpu") {
        return;
    }
    check_all_models(gpu, 1e-3);
}

/// Decode speed by split on a Llama-3-8B-shaped model cut to 8 layers (Q4_K_M, random
/// weights, 32k vocabulary): everything on the GPU (plain `CudaBackend` and the hybrid), the
/// last half + head, the head only, nothing. Prints tok/s and crossings per token; asserts
/// only the crossing counts (timings are for BENCHMARKS.md).
#[test]
fn gpu_decode_speed_by_split() {
    use std::time::Instant;

    use backend::cpu::CpuBackend;
    use cuda::hybrid::{Hybrid, Placement};
    use model::synth::{FileType, Shape, SynthPlan};
    use model::{KvType, LoadOptions, ModelOn};

    if no_gpu("gpu_decode_speed_by_split") {
        return;
    }
    let mut shape = Shape::llama3_8b();
    shape.n_layer = 8;
    shape.n_vocab = 32000;
    let path = std::env::temp_dir().join("redline-hybrid-llama3-8b-8l.gguf");
    let t = Instant::now();
    let plan = SynthPlan::new(shape, FileType::Q4KM);
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    plan.write(f, 7, |_| {}).unwrap();
    println!(
        "synthetic llama3-8b x8 layers Q4_K_M: {:.2} GB written in {:.1}s",
        plan.data_bytes() as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    let file = open(&path);
    let opts = LoadOptions {
        n_threads: 0,
        ubatch_size: 512,
    };
    let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 11) % 32000).collect();
    let n_tokens = 16;
    let time_decode = |step: &mut dyn FnMut(u32)| -> f64 {
        step(1);
        step(2);
        let t = Instant::now();
        for i in 0..n_tokens {
            step(100 + i);
        }
        n_tokens as f64 / t.elapsed().as_secs_f64()
    };

    let m = ModelOn::load_on(gpu(), file.clone(), &opts).unwrap();
    let mut s = m.new_state(256, KvType::F16).unwrap();
    m.forward(&mut s, &prompt, false).unwrap();
    let tok_s = time_decode(&mut |tok| {
        m.forward(&mut s, &[tok], false).unwrap();
    });
    println!("split plain CudaBackend (9/9): {tok_s:.1} tok/s");
    drop(s);
    drop(m);

    for ngl in [9, 5, 1, 0] {
        let p = Placement::from_ngl(8, ngl);
        let b = Hybrid::new(CpuBackend::new(0).unwrap(), gpu(), p.clone());
        let m = ModelOn::load_on(b, file.clone(), &opts).unwrap();
        let mut s = m.new_state(256, KvType::F16).unwrap();
        m.forward(&mut s, &prompt, false).unwrap();
        let t0 = m.backend().transfers();
        let tok_s = time_decode(&mut |tok| {
            m.forward(&mut s, &[tok], false).unwrap();
        });
        let t = m.backend().transfers().since(&t0);
        let steps = n_tokens as u64 + 2;
        assert_eq!(t.crossings(), steps * p.boundaries() as u64, "[{p}] {t:?}");
        println!(
            "split hybrid [{p}]: {tok_s:.1} tok/s, {} crossings/token, {} B/token crossed",
            t.crossings() / steps,
            t.bytes / steps
        );
    }
    let _ = std::fs::remove_file(&path);
}
