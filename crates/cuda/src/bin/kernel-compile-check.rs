//! `kernel-compile-check --nvrtc <path to libnvrtc.so.N> [--arch 70,80,90]`
//!
//! Compiles every CUDA kernel of this crate with NVRTC for each architecture and exits non-zero
//! on any error or warning. Needs no GPU. CI passes the NVRTC from the PyPI wheel explicitly.

use cuda::compile_check::{compile_all, CI_ARCHS};
use cuda::nvrtc::Nvrtc;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut nvrtc_path: Option<PathBuf> = None;
    let mut archs: Vec<u32> = CI_ARCHS.to_vec();
    let mut resource_usage = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--nvrtc" => nvrtc_path = args.next().map(PathBuf::from),
            "--arch" => {
                let Some(list) = args.next() else {
                    return usage("--arch needs a list");
                };
                match list
                    .split(',')
                    .map(|s| s.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(v) if !v.is_empty() => archs = v,
                    _ => return usage("--arch: comma-separated numbers, e.g. 70,80,90"),
                }
            }
            // ptxas register / shared memory / spill report per kernel (printed, not a failure)
            "--resource-usage" => resource_usage = true,
            "-h" | "--help" => return usage(""),
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    let nvrtc = match Nvrtc::load(nvrtc_path.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("kernel-compile-check: {e}");
            return ExitCode::from(2);
        }
    };
    let (maj, min) = nvrtc.version();
    println!("NVRTC {maj}.{min} from {}", nvrtc.path().display());
    if resource_usage {
        for &arch in &archs {
            for p in cuda::Program::ALL {
                match nvrtc.compile(&p.program_source(), arch, &["--ptxas-options=-v"]) {
                    Ok(c) => println!("== sm_{arch} {}\n{}", p.file_name(), c.log),
                    Err(e) => println!("== sm_{arch} {}: {e}", p.file_name()),
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    let mut failed = 0;
    for o in compile_all(&nvrtc, &archs) {
        let ms = o.elapsed.as_secs_f64() * 1e3;
        match o.result {
            Ok((size, log)) if log.is_empty() => {
                println!(
                    "ok    sm_{} {:<18} {:>8} bytes  {:>7.0} ms",
                    o.arch,
                    o.program.file_name(),
                    size,
                    ms
                )
            }
            Ok((_, log)) => {
                failed += 1;
                println!(
                    "WARN  sm_{} {:<18} (warnings are errors here)\n{log}",
                    o.arch,
                    o.program.file_name()
                );
            }
            Err(e) => {
                failed += 1;
                println!("FAIL  sm_{} {:<18} {e}", o.arch, o.program.file_name());
            }
        }
    }
    if failed > 0 {
        eprintln!("kernel-compile-check: {failed} failure(s)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn usage(err: &str) -> ExitCode {
    if !err.is_empty() {
        eprintln!("kernel-compile-check: {err}");
    }
    eprintln!("usage: kernel-compile-check [--nvrtc PATH] [--arch 70,80,90] [--resource-usage]");
    if err.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}
