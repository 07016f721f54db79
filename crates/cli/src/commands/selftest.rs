//! `redline selftest`: checks this machine's GPU path end to end. Finds the CUDA driver and
//! NVRTC (12.x or 13.x), compiles the kernels for the card (or loads them from the disk cache),
//! measures device read bandwidth, and checks a matvec of every weight format against the CPU
//! reference (quant::dequantize_row, f64), then the backend conformance suite (every op of
//! `run`/`serve`, KV caches of every type). With no GPU it says so and exits successfully: the
//! CPU backend is then what `run` and `serve` use.

use anyhow::{bail, Context};
use cuda::synthetic::{random_activations, random_matrix};
use cuda::{CudaDevice, CudaError, CudaOptions};
use gguf::GgmlType;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// libnvrtc to use (default: search for CUDA 13.x, then 12.x).
    #[arg(long)]
    nvrtc: Option<PathBuf>,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// GiB read by the bandwidth probe (0 skips it).
    #[arg(long, default_value_t = 2)]
    bw_gib: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let opts = CudaOptions {
        ordinal: args.device,
        nvrtc_path: args.nvrtc,
        ..CudaOptions::default()
    };
    let dev = match CudaDevice::open(&opts) {
        Ok(d) => d,
        Err(CudaError::NoDevice(why)) => {
            println!("no CUDA device found; running on the CPU ({why})");
            return Ok(());
        }
        Err(e) => return Err(e).context("opening the CUDA device"),
    };
    let info = dev.info();
    let (maj, min) = dev.nvrtc().version();
    println!(
        "GPU {}: {} (sm_{}), {} SMs, {:.1} GiB; NVRTC {maj}.{min} ({})",
        info.ordinal,
        info.name,
        dev.arch(),
        info.sm_count,
        info.total_mem_bytes as f64 / (1u64 << 30) as f64,
        dev.nvrtc().path().display()
    );
    let t = Instant::now();
    for p in cuda::Program::ALL {
        dev.module(p)
            .with_context(|| format!("kernels {}", p.file_name()))?;
    }
    println!(
        "kernels ready in {:.2} s (compiled, or from the disk cache)",
        t.elapsed().as_secs_f64()
    );
    if args.bw_gib > 0 {
        let bw = cuda::bandwidth::measure_read_bandwidth(&dev, args.bw_gib << 30, 10)?;
        println!(
            "read bandwidth {bw:.0} GB/s (datasheet {:.0} GB/s)",
            info.peak_bandwidth_gbs()
        );
    }

    use GgmlType::*;
    let types = [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q5K, Q6K,
    ];
    let (rows, cols, n_tokens) = (67usize, 4096usize, 3usize);
    let mut failed = Vec::new();
    for ty in types {
        let w = random_matrix(ty, rows, cols, 42);
        let x = random_activations(n_tokens * cols, 7);
        let quantized = cuda::matvec::quantizes_activations(ty);
        let (want, mag) =
            cuda::reference::matvec_reference(ty, &w, rows, cols, &x, n_tokens, quantized)?;
        let dm = dev.upload_matrix(ty, rows, cols, &w)?;
        let xd = dev.stream().clone_htod(&x)?;
        let mut yd = dev.stream().clone_htod(&vec![f32::NAN; n_tokens * rows])?;
        let mut scratch = dev.matvec_scratch(n_tokens, cols)?;
        dev.matvec(&dm, &xd, n_tokens, &mut yd, &mut scratch)?;
        let got = dev.stream().clone_dtoh(&yd)?;
        let worst = got
            .iter()
            .zip(want.iter().zip(&mag))
            .map(|(&g, (&w, &m))| {
                if g.is_nan() {
                    f64::INFINITY
                } else {
                    (g as f64 - w).abs() / m.max(1e-30)
                }
            })
            .fold(0.0, f64::max);
        let ok = worst <= 2e-5;
        println!(
            "matvec {:>7}: {} (max error {:.1e} of sum|w*x|)",
            ty.name(),
            if ok { "ok" } else { "FAIL" },
            worst
        );
        if !ok {
            failed.push(ty.name());
        }
    }
    // The backend op set that `run` and `serve` use, against the f64 host code of
    // backend::conformance (attention over every KV cache type included).
    let gpu = cuda::backend::CudaBackend::new(&opts).context("opening the CUDA backend")?;
    type Check = fn(&cuda::backend::CudaBackend) -> Result<(), String>;
    let parts: [(&'static str, Check); 5] = [
        ("matmul + embed", backend::conformance::matmul_and_embed),
        (
            "norms + activations",
            backend::conformance::norms_and_activations,
        ),
        ("rope", backend::conformance::rope),
        (
            "attention, KV f32/f16/q8_0/q4_0",
            backend::conformance::attention,
        ),
        ("delta net", backend::conformance::delta_net),
    ];
    for (name, check) in parts {
        match check(&gpu) {
            Ok(()) => println!("ops {name}: ok"),
            Err(e) => {
                println!("ops {name}: FAIL ({e})");
                failed.push(name);
            }
        }
    }
    if !failed.is_empty() {
        bail!(
            "GPU disagrees with the CPU reference for {}",
            failed.join(", ")
        );
    }
    println!("selftest passed");
    Ok(())
}
