//! `cuda-bench [--nvrtc PATH] [--bw-gib 8] [--iters 30] [--types q4_K,q6_K,...]`
//!
//! Measures the device's read bandwidth (a large read-only reduction), then times every matvec
//! kernel on 27648x5120 and 5120x27648 matrices (a 27-32B model's FFN shapes) for 1 and 8
//! tokens, and prints GB/s of weights read and the % of the measured bandwidth. Several copies
//! of each matrix are cycled so the 50-60 MB L2 cannot serve repeated reads.

use cuda::bandwidth::measure_read_bandwidth;
use cuda::synthetic::{random_activations, random_matrix};
use cuda::{CudaDevice, CudaOptions};
use cudarc::driver::sys::CUevent_flags;
use gguf::GgmlType;
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuda-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut opts = CudaOptions::default();
    let mut bw_gib = 8usize;
    let mut iters = 30usize;
    let mut load_modes: Vec<i32> = vec![cuda::device::DEFAULT_MATVEC_LOAD_MODE];
    let mut xsmem_modes: Vec<bool> = vec![cuda::device::DEFAULT_MATVEC_X_IN_SMEM];
    let mut types: Vec<GgmlType> = {
        use GgmlType::*;
        vec![
            Q4K, Q6K, Q4_0, Q8_0, IQ4XS, Q5K, Q4_1, Q5_0, Q5_1, IQ4NL, Q2K, Q3K, F16, BF16, F32,
        ]
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--nvrtc" => opts.nvrtc_path = Some(PathBuf::from(val()?)),
            "--bw-gib" => bw_gib = val()?.parse().map_err(|e| format!("--bw-gib: {e}"))?,
            // compare weight-load cache policies of the block-format kernels, e.g. 0,1,2
            "--load-modes" => {
                load_modes = val()?
                    .split(',')
                    .map(|m| m.parse::<i32>().map_err(|e| format!("--load-modes: {e}")))
                    .collect::<Result<_, _>>()?
            }
            // compare single-token x staging: 0 = x from global (L1), 1 = x in shared memory
            "--xsmem-modes" => {
                xsmem_modes = val()?.split(',').map(|m| m.trim() == "1").collect();
            }
            "--iters" => iters = val()?.parse().map_err(|e| format!("--iters: {e}"))?,
            "--types" => {
                types = val()?
                    .split(',')
                    .map(|s| GgmlType::from_name(s).ok_or(format!("unknown type {s}")))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown argument {a}")),
        }
    }
    let dev = CudaDevice::open(&opts).map_err(|e| e.to_string())?;
    let info = dev.info();
    let (nv_maj, nv_min) = dev.nvrtc().version();
    println!(
        "device {} (sm_{}), {} SMs, {:.1} GiB, datasheet {:.0} GB/s; NVRTC {nv_maj}.{nv_min} ({})",
        info.name,
        dev.arch(),
        info.sm_count,
        info.total_mem_bytes as f64 / (1u64 << 30) as f64,
        info.peak_bandwidth_gbs(),
        dev.nvrtc().path().display()
    );
    let t = std::time::Instant::now();
    for p in cuda::Program::ALL {
        dev.module(p).map_err(|e| e.to_string())?;
    }
    println!(
        "kernels ready in {:.2} s (compile or disk cache)",
        t.elapsed().as_secs_f64()
    );

    let bw = measure_read_bandwidth(&dev, bw_gib << 30, 10).map_err(|e| e.to_string())?;
    println!("read bandwidth: {bw:.0} GB/s ({bw_gib} GiB read-only reduction, median of 10)");

    println!(
        "{:>7} {:>12} {:>3} {:>9} {:>9} {:>9} {:>7} {:>8} {:>4} {:>5}",
        "type", "rows x cols", "n", "MB", "us", "GB/s", "% bw", "quant us", "load", "xsmem"
    );
    let stream = dev.stream();
    let mut runs: Vec<(GgmlType, i32, bool)> = Vec::new();
    for &ty in &types {
        if cuda::matvec::quantizes_activations(ty) {
            for &m in &load_modes {
                runs.extend(xsmem_modes.iter().map(|&x| (ty, m, x)));
            }
        } else {
            runs.push((ty, cuda::device::DEFAULT_MATVEC_LOAD_MODE, false));
        }
    }
    for (ty, load_mode, xsmem) in runs {
        dev.set_matvec_load_mode(load_mode);
        dev.set_matvec_x_in_smem(xsmem);
        for (rows, cols) in [(27648usize, 5120usize), (5120, 27648)] {
            let bytes = random_matrix(ty, rows, cols, 7);
            let mb = bytes.len() as f64 / 1e6;
            let copies = ((512e6 / bytes.len() as f64).ceil() as usize).clamp(2, 8);
            let ws = (0..copies)
                .map(|_| dev.upload_matrix(ty, rows, cols, &bytes))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            drop(bytes);
            let x = stream
                .clone_htod(&random_activations(8 * cols, 3))
                .map_err(|e| e.to_string())?;
            let mut y = stream
                .alloc_zeros::<f32>(8 * rows)
                .map_err(|e| e.to_string())?;
            let mut scratch = dev.matvec_scratch(8, cols).map_err(|e| e.to_string())?;
            for n in [1usize, 8] {
                // Block formats: x is quantized once (as a model does for Q/K/V or gate/up) and
                // the matvec kernel alone is timed; the quantization is timed separately.
                let quantized = cuda::matvec::quantizes_activations(ty);
                let run = |w: &cuda::DeviceMatrix,
                           y: &mut cuda::CudaSlice<f32>,
                           s: &mut cuda::MatvecScratch| {
                    if quantized {
                        dev.matvec_prequantized(w, s, y)
                    } else {
                        dev.matvec(w, &x, n, y, s)
                    }
                };
                if quantized {
                    dev.quantize_for_matvec(&x, n, cols, &mut scratch)
                        .map_err(|e| e.to_string())?;
                }
                for w in &ws {
                    run(w, &mut y, &mut scratch).map_err(|e| e.to_string())?;
                }
                let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
                let start = stream.record_event(flags).map_err(|e| e.to_string())?;
                for i in 0..iters {
                    run(&ws[i % copies], &mut y, &mut scratch).map_err(|e| e.to_string())?;
                }
                let end = stream.record_event(flags).map_err(|e| e.to_string())?;
                let us =
                    start.elapsed_ms(&end).map_err(|e| e.to_string())? as f64 * 1e3 / iters as f64;
                let q_us = if quantized {
                    let start = stream.record_event(flags).map_err(|e| e.to_string())?;
                    for _ in 0..iters {
                        dev.quantize_for_matvec(&x, n, cols, &mut scratch)
                            .map_err(|e| e.to_string())?;
                    }
                    let end = stream.record_event(flags).map_err(|e| e.to_string())?;
                    start.elapsed_ms(&end).map_err(|e| e.to_string())? as f64 * 1e3 / iters as f64
                } else {
                    0.0
                };
                let gbs = mb * 1e3 / us;
                println!(
                    "{:>7} {:>12} {:>3} {:>9.1} {:>9.1} {:>9.0} {:>6.1}% {:>8.1} {:>4} {:>5}",
                    ty.name(),
                    format!("{rows}x{cols}"),
                    n,
                    mb,
                    us,
                    gbs,
                    100.0 * gbs / bw,
                    q_us,
                    load_mode,
                    u8::from(xsmem && n == 1)
                );
            }
        }
    }
    Ok(())
}
