//! The shared conformance suite on the CPU backend (fast kernels and reference kernels).

use backend::conformance;
use backend::cpu::CpuBackend;

#[test]
fn cpu_backend_passes_the_conformance_suite() {
    conformance::run_all(&CpuBackend::new(2).unwrap()).unwrap();
}

#[test]
fn cpu_reference_backend_passes_the_conformance_suite() {
    conformance::run_all(&CpuBackend::reference(1).unwrap()).unwrap();
}
