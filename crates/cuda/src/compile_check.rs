//! Compiles every kernel program for a set of architectures: the CI check that a kernel change
//! does not break Volta (sm_70), Ampere (sm_80) or Hopper (sm_90). Needs NVRTC only, no GPU.

use crate::error::Result;
use crate::nvrtc::{Nvrtc, Target};
use crate::sources::Program;
use std::time::Duration;

/// The architectures CI compiles for.
pub const CI_ARCHS: [u32; 3] = [70, 80, 90];

pub struct CompileOutcome {
    pub program: Program,
    pub target: Target,
    pub elapsed: Duration,
    /// Ok(the cubin or PTX and NVRTC's log), or the error with NVRTC's log.
    pub result: Result<(Vec<u8>, String)>,
}

/// Compiles every program for every arch; never stops at the first failure.
pub fn compile_all(nvrtc: &Nvrtc, archs: &[u32]) -> Vec<CompileOutcome> {
    let targets: Vec<Target> = archs.iter().map(|&a| Target::Cubin(a)).collect();
    compile_programs(nvrtc, &targets, &Program::ALL)
}

/// Compiles `programs` for every target; never stops at the first failure.
pub fn compile_programs(
    nvrtc: &Nvrtc,
    targets: &[Target],
    programs: &[Program],
) -> Vec<CompileOutcome> {
    let mut out = Vec::new();
    for &target in targets {
        for &program in programs {
            let t = std::time::Instant::now();
            let result = nvrtc
                .compile_for(&program.program_source(), target, &[])
                .map(|c| (c.image, without_deprecation_notice(&c.log)));
            out.push(CompileOutcome {
                program,
                target,
                elapsed: t.elapsed(),
                result,
            });
        }
    }
    out
}

/// NVRTC 12.x notes that targets before sm_75 are deprecated; sm_70 is first-class for us, so
/// that one line is not a warning we act on (NVRTC has no option to silence it).
pub fn without_deprecation_notice(log: &str) -> String {
    log.lines()
        .filter(|l| !l.contains("are deprecated and may be removed in a future release"))
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string()
}
