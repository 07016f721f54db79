//! `kernel-compile-check --nvrtc <path to libnvrtc.so.N> [--arch 70,80,90]`
//!
//! Compiles every CUDA kernel of this crate with NVRTC for each architecture and exits non-zero
//! on any error or warning. Needs no GPU. CI passes the NVRTC from the PyPI wheel explicitly.
//!
//! `--write-cache DIR` also stores each cubin where redline looks for it at run time
//! (`DIR/redline/kernels/<key>.cubin`, DIR playing `$XDG_CACHE_HOME`), so a machine with the same
//! NVRTC version and card starts without compiling (first use otherwise takes a minute or more).
//!
//! `--ptx` compiles for `compute_XX` instead (PTX, which the driver compiles for the card): the
//! entries a run with `REDLINE_CUDA_ARCH=XX` loads (the older architecture's code paths on a
//! newer card).

use cuda::compile_check::{compile_programs, CI_ARCHS};
use cuda::kernel_cache::{cache_key, KernelCache};
use cuda::nvrtc::Nvrtc;
use cuda::nvrtc::Target;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut nvrtc_path: Option<PathBuf> = None;
    let mut archs: Vec<u32> = CI_ARCHS.to_vec();
    let mut resource_usage = false;
    let mut write_cache: Option<PathBuf> = None;
    let mut only: Option<String> = None;
    let mut ptx = false;
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
            "--write-cache" => write_cache = args.next().map(PathBuf::from),
            // one program only (e.g. mmv.cu)
            "--only" => only = args.next(),
            // PTX for compute_XX instead of cubins for sm_XX
            "--ptx" => ptx = true,
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
                if only.as_deref().is_some_and(|o| o != p.file_name()) {
                    continue;
                }
                match nvrtc.compile(&p.program_source(), arch, &["--ptxas-options=-v"]) {
                    Ok(c) => println!("== sm_{arch} {}\n{}", p.file_name(), c.log),
                    Err(e) => println!("== sm_{arch} {}: {e}", p.file_name()),
                }
            }
        }
        return ExitCode::SUCCESS;
    }
    let cache = write_cache.map(|d| KernelCache::new(Some(d.join("redline").join("kernels"))));
    let mut failed = 0;
    let programs: Vec<cuda::Program> = cuda::Program::ALL
        .into_iter()
        .filter(|p| only.as_deref().is_none_or(|o| o == p.file_name()))
        .collect();
    let targets: Vec<Target> = archs
        .iter()
        .map(|&a| {
            if ptx {
                Target::Ptx(a)
            } else {
                Target::Cubin(a)
            }
        })
        .collect();
    for o in compile_programs(&nvrtc, &targets, &programs) {
        let ms = o.elapsed.as_secs_f64() * 1e3;
        match o.result {
            Ok((cubin, log)) if log.is_empty() => {
                println!(
                    "ok    {:<10} {:<18} {:>8} bytes  {:>7.0} ms",
                    o.target.to_string(),
                    o.program.file_name(),
                    cubin.len(),
                    ms
                );
                if let Some(c) = &cache {
                    // The same key (and no extra options) as CudaDevice::module uses.
                    let key = cache_key(&o.program.program_source(), o.target, (maj, min), &[]);
                    if let Err(e) = c.put(&key, &cubin) {
                        failed += 1;
                        println!("FAIL  writing the cache entry {key}: {e}");
                    }
                }
            }
            Ok((_, log)) => {
                failed += 1;
                println!(
                    "WARN  {} {:<18} (warnings are errors here)\n{log}",
                    o.target,
                    o.program.file_name()
                );
            }
            Err(e) => {
                failed += 1;
                println!("FAIL  {} {:<18} {e}", o.target, o.program.file_name());
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
    eprintln!("usage: kernel-compile-check [--nvrtc PATH] [--arch 70,80,90] [--resource-usage] [--write-cache DIR] [--only FILE.cu] [--ptx]");
    if err.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}
