//! Every kernel compiles for sm_70 (the oldest, strictest target) with whatever NVRTC this
//! machine has; skipped with a message when none is installed. CI runs the full check
//! (sm_70/80/90, NVRTC from the PyPI wheel given by path) with the `kernel-compile-check`
//! binary in .ci/run.

use cuda::compile_check::compile_all;
use cuda::nvrtc::Nvrtc;

#[test]
fn every_kernel_compiles_for_sm70() {
    let nvrtc = match Nvrtc::load(None) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    if !nvrtc.supported_archs().contains(&70) {
        eprintln!(
            "skipped: NVRTC {:?} no longer targets sm_70",
            nvrtc.version()
        );
        return;
    }
    let failures: Vec<String> = compile_all(&nvrtc, &[70])
        .into_iter()
        .filter_map(|o| match o.result {
            Ok((_, log)) if log.is_empty() => None,
            Ok((_, log)) => Some(format!("{}: warnings:\n{log}", o.program.file_name())),
            Err(e) => Some(format!("{}: {e}", o.program.file_name())),
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
