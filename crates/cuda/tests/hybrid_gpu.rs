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
