//! `cuda-bench [--nvrtc PATH] [--bw-gib 8] [--iters 30] [--types q4_K,q6_K,...]
//!             [--shapes 27648x5120,...] [--ns 1,2,4,8] [--rpw 0|2,4] [--ksplit 0|1,2,4]
//!             [--load-modes 0,2] [--csv PATH]`
//!
//! Measures the device's read bandwidth (a large read-only reduction), then times the matvec
//! kernels on the weight shapes of Qwen2.5-32B / Qwen3.5-27B (rows x cols: output features x
//! input features) for n tokens, sweeping the kernel variants (rows per warp, warps per row
//! set, weight-load cache policy; 0 = the per-shape default), and prints GB/s of weights read
//! and the % of the measured bandwidth for each, then the best variant per (type, shape, n).
//! Several copies of each matrix are cycled so the 50-60 MB L2 cannot serve repeated reads.
//! "same-size stream" is the read-only reduction kernel itself on cycled buffers of the
//! matrix's size: what one kernel launch of that many bytes can reach (ramp-up and tail
//! included), the fair ceiling for small matrices.

use cuda::bandwidth::measure_read_bandwidth;
use cuda::synthetic::{random_activations, random_matrix};
use cuda::{CudaDevice, CudaOptions};
use cudarc::driver::sys::CUevent_flags;
use gguf::GgmlType;
use std::fmt::Write as _;
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

/// Weight shapes (rows x cols) of the two target models: Qwen2.5-32B q/o 5120x5120, k/v
/// 1024x5120, ffn 27648x5120 / 5120x27648, head 152064x5120; Qwen3.5-27B ffn 17408x5120 /
/// 5120x17408, delta-net attn_qkv 10240x5120, attn_gate 6144x5120, ssm_out 5120x6144, gated
/// attention attn_q 12288x5120, head 248320x5120.
const DEFAULT_SHAPES: &[(usize, usize)] = &[
    (5120, 5120),
    (1024, 5120),
    (27648, 5120),
    (5120, 27648),
    (152064, 5120),
    (17408, 5120),
    (5120, 17408),
    (10240, 5120),
    (6144, 5120),
    (5120, 6144),
    (12288, 5120),
    (248320, 5120),
];

fn parse_list<T: std::str::FromStr>(flag: &str, v: &str) -> Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    v.split(',')
        .map(|m| m.trim().parse::<T>().map_err(|e| format!("{flag}: {e}")))
        .collect()
}

/// One timed configuration.
struct Row {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
    us: f64,
    gbs: f64,
    variant: String,
}

fn run() -> Result<(), String> {
    let mut opts = CudaOptions::default();
    let mut bw_gib = 8usize;
    let mut iters = 30usize;
    let mut load_modes: Vec<i32> = vec![cuda::device::DEFAULT_MATVEC_LOAD_MODE];
    let mut rpws: Vec<u32> = vec![0];
    let mut ksplits: Vec<u32> = vec![0];
    let mut ns: Vec<usize> = vec![1, 2, 4, 8];
    let mut shapes: Vec<(usize, usize)> = DEFAULT_SHAPES.to_vec();
    let mut csv_path: Option<PathBuf> = None;
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
            // weight-load cache policies of the block-format kernels, e.g. 0,1,2
            "--load-modes" => load_modes = parse_list("--load-modes", &val()?)?,
            // warps splitting one row set's columns: 0 = per-shape choice, 1, 2, 4
            "--ksplit" => ksplits = parse_list("--ksplit", &val()?)?,
            // rows per warp of the block-format kernels: 0 = per-shape choice, 2, 4
            "--rpw" => rpws = parse_list("--rpw", &val()?)?,
            "--ns" => ns = parse_list("--ns", &val()?)?,
            "--shapes" => {
                shapes = val()?
                    .split(',')
                    .map(|s| {
                        let (r, c) = s.split_once('x').ok_or(format!("shape {s}: want RxC"))?;
                        Ok((
                            r.parse().map_err(|e| format!("{s}: {e}"))?,
                            c.parse().map_err(|e| format!("{s}: {e}"))?,
                        ))
                    })
                    .collect::<Result<_, String>>()?
            }
            "--csv" => csv_path = Some(PathBuf::from(val()?)),
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
    if ns
        .iter()
        .any(|&n| n == 0 || n > cuda::matvec::MAX_TOKENS_PER_LAUNCH)
    {
        return Err(format!("--ns: 1..={}", cuda::matvec::MAX_TOKENS_PER_LAUNCH));
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
    print_kernel_resources(&dev, &types);

    let bw = measure_read_bandwidth(&dev, bw_gib << 30, 10).map_err(|e| e.to_string())?;
    println!("read bandwidth: {bw:.0} GB/s ({bw_gib} GiB read-only reduction, median of 10)");

    println!(
        "{:>7} {:>12} {:>3} {:>8} {:>8} {:>6} {:>7} {:>8} {:>4} {:>3} {:>3}",
        "type", "rows x cols", "n", "MB", "us", "GB/s", "% bw", "quant us", "load", "rpw", "ks"
    );
    let stream = dev.stream();
    let mut results: Vec<Row> = Vec::new();
    // same-size stream GB/s per weight size in bytes
    let mut stream_ref: Vec<(usize, f64)> = Vec::new();
    for &ty in &types {
        let quantized = cuda::matvec::quantizes_activations(ty);
        // (load mode, rows per warp, ksplit) variants of this type (0 = per-shape default)
        let mut variants: Vec<(i32, u32, u32)> = Vec::new();
        if quantized {
            for &m in &load_modes {
                for &r in &rpws {
                    variants.extend(ksplits.iter().map(|&k| (m, r, k)));
                }
                // the per-shape default is always timed (the summary reports it)
                if !variants.contains(&(m, 0, 0)) {
                    variants.push((m, 0, 0));
                }
            }
        } else {
            variants.push((cuda::device::DEFAULT_MATVEC_LOAD_MODE, 0, 0));
        }
        for &(rows, cols) in &shapes {
            if !cols.is_multiple_of(ty.block_size()) {
                continue;
            }
            let bytes = random_matrix(ty, rows, cols, 7);
            let mb = bytes.len() as f64 / 1e6;
            let copies = ((512e6 / bytes.len() as f64).ceil() as usize).clamp(2, 8);
            if !stream_ref.iter().any(|&(b, _)| b == bytes.len()) {
                let g = same_size_stream(&dev, bytes.len(), iters).map_err(|e| e.to_string())?;
                stream_ref.push((bytes.len(), g));
            }
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
            for &n in &ns {
                for &(load_mode, rpw, ks) in &variants {
                    dev.set_matvec_load_mode(load_mode);
                    cuda::matvec::set_rows_per_warp_override(rpw);
                    cuda::matvec::set_ksplit_override(ks);
                    // Block formats: x is quantized once (as a model does for Q/K/V or gate/up)
                    // and the matvec kernel alone is timed; the quantization is timed apart.
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
                    let us = start.elapsed_ms(&end).map_err(|e| e.to_string())? as f64 * 1e3
                        / iters as f64;
                    let q_us = if quantized {
                        let start = stream.record_event(flags).map_err(|e| e.to_string())?;
                        for _ in 0..iters {
                            dev.quantize_for_matvec(&x, n, cols, &mut scratch)
                                .map_err(|e| e.to_string())?;
                        }
                        let end = stream.record_event(flags).map_err(|e| e.to_string())?;
                        start.elapsed_ms(&end).map_err(|e| e.to_string())? as f64 * 1e3
                            / iters as f64
                    } else {
                        0.0
                    };
                    let gbs = mb * 1e3 / us;
                    let (r_used, ks_used) = if quantized {
                        let r = cuda::matvec::rows_per_warp(ty, rows, cols, n);
                        (r, cuda::matvec::ksplit())
                    } else {
                        (0, 0)
                    };
                    println!(
                        "{:>7} {:>12} {:>3} {:>8.1} {:>8.1} {:>6.0} {:>6.1}% {:>8.1} {:>4} {:>3} {:>3}",
                        ty.name(),
                        format!("{rows}x{cols}"),
                        n,
                        mb,
                        us,
                        gbs,
                        100.0 * gbs / bw,
                        q_us,
                        load_mode,
                        r_used,
                        ks_used
                    );
                    let auto = if rpw == 0 && ks == 0 { " auto" } else { "" };
                    results.push(Row {
                        ty,
                        rows,
                        cols,
                        n,
                        us,
                        gbs,
                        variant: format!("load{load_mode} rpw{r_used} ks{ks_used}{auto}"),
                    });
                }
            }
            cuda::matvec::set_rows_per_warp_override(0);
            cuda::matvec::set_ksplit_override(0);
        }
    }
    println!("\nsame-size stream (read-only reduction over cycled buffers of the matrix's size):");
    for &(b, g) in &stream_ref {
        println!(
            "{:>9.1} MB {:>6.0} GB/s {:>5.1}% of {bw:.0}",
            b as f64 / 1e6,
            g,
            100.0 * g / bw
        );
    }
    print_summary(&results, bw, &ns, &stream_ref);
    if let Some(p) = csv_path {
        let mut s = String::from("type,rows,cols,n,us,gbs,pct_bw,variant\n");
        for r in &results {
            let _ = writeln!(
                s,
                "{},{},{},{},{:.2},{:.0},{:.1},{}",
                r.ty.name(),
                r.rows,
                r.cols,
                r.n,
                r.us,
                r.gbs,
                100.0 * r.gbs / bw,
                r.variant
            );
        }
        std::fs::write(&p, s).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

/// Registers, spilled local memory and static shared memory of every block-format kernel.
fn print_kernel_resources(dev: &CudaDevice, types: &[GgmlType]) {
    for &ty in types {
        if !cuda::matvec::quantizes_activations(ty) {
            continue;
        }
        let stem = ty.name().to_lowercase();
        let mut line = format!("{stem:>7} regs/local/smem:");
        for (nt, r) in [
            (1, 2),
            (1, 4),
            (2, 2),
            (2, 4),
            (4, 2),
            (4, 4),
            (8, 2),
            (8, 4),
        ] {
            let name = format!("mv_{stem}_n{nt}_r{r}");
            if let Ok(f) = dev.function(cuda::Program::MatvecQuant, &name) {
                let _ = write!(
                    line,
                    " n{nt}r{r} {}/{}/{}",
                    f.num_regs().unwrap_or(-1),
                    f.local_size_bytes().unwrap_or(-1),
                    f.shared_size_bytes().unwrap_or(-1)
                );
            }
        }
        println!("{line}");
    }
}

/// Best variant per (type, shape, n), with the time of n tokens relative to one token, and
/// the per-shape default ("auto") at n = 1 against the same-size stream.
fn print_summary(results: &[Row], bw: f64, ns: &[usize], stream_ref: &[(usize, f64)]) {
    println!("\nbest variant per type, shape and n (GB/s of weights, % of {bw:.0} GB/s; xN = time / time at n=1)");
    let mut keys: Vec<(GgmlType, usize, usize)> = Vec::new();
    for r in results {
        if !keys.contains(&(r.ty, r.rows, r.cols)) {
            keys.push((r.ty, r.rows, r.cols));
        }
    }
    for &(ty, rows, cols) in &keys {
        let mut line = format!("{:>7} {:>12}", ty.name(), format!("{rows}x{cols}"));
        let best = |n: usize| {
            results
                .iter()
                .filter(|r| r.ty == ty && r.rows == rows && r.cols == cols && r.n == n)
                .min_by(|a, b| a.us.total_cmp(&b.us))
        };
        let t1 = best(1).map(|r| r.us);
        for &n in ns {
            if let Some(r) = best(n) {
                let ratio = t1.map(|t| r.us / t).unwrap_or(f64::NAN);
                let _ = write!(
                    line,
                    " | n={n} {:>7.1}us {:>5.0} {:>5.1}% x{ratio:.2} ({})",
                    r.us,
                    r.gbs,
                    100.0 * r.gbs / bw,
                    r.variant
                );
            }
        }
        println!("{line}");
    }
    println!("\ndefaults (auto) per type and shape: % of bandwidth, % of same-size stream; n = 1 / 2 / 4 / 8 us");
    for &(ty, rows, cols) in &keys {
        let auto = |n: usize| {
            results.iter().find(|r| {
                r.ty == ty
                    && r.rows == rows
                    && r.cols == cols
                    && r.n == n
                    && r.variant.ends_with("auto")
            })
        };
        let Some(a1) = auto(1) else { continue };
        let bytes = (a1.gbs * a1.us * 1e3) as usize;
        let sref = stream_ref
            .iter()
            .min_by_key(|(b, _)| b.abs_diff(bytes))
            .map(|&(_, g)| g)
            .unwrap_or(f64::NAN);
        let mut line = format!(
            "{:>7} {:>12} {:>6.0} GB/s {:>5.1}% bw {:>5.1}% same-size |",
            ty.name(),
            format!("{rows}x{cols}"),
            a1.gbs,
            100.0 * a1.gbs / bw,
            100.0 * a1.gbs / sref
        );
        for &n in ns {
            if let Some(a) = auto(n) {
                let _ = write!(line, " n={n} {:.1}us x{:.2}", a.us, a.us / a1.us);
            }
        }
        println!("{line}");
    }
}

/// GB/s of the read-only reduction kernel (kernels/bandwidth.cu, as `measure_read_bandwidth`)
/// over cycled buffers of `bytes` each (>= 512 MB in all, so L2 cannot serve them).
fn same_size_stream(dev: &CudaDevice, bytes: usize, iters: usize) -> cuda::Result<f64> {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let n16 = bytes / 16;
    let copies = (512e6 / bytes as f64).ceil().clamp(2.0, 64.0) as usize;
    let stream = dev.stream();
    let bufs = (0..copies)
        .map(|_| stream.alloc_zeros::<u8>(n16 * 16))
        .collect::<Result<Vec<_>, _>>()?;
    let blocks = dev.info().sm_count.max(1) as u32 * 8;
    let mut out = stream.alloc_zeros::<u32>(blocks as usize)?;
    let f = dev.function(cuda::Program::Bandwidth, "bandwidth_read")?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let n = n16 as i64;
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let mut launch = |i: usize| -> cuda::Result<()> {
        let mut b = stream.launch_builder(&f);
        b.arg(&bufs[i % copies]).arg(&n).arg(&mut out);
        // SAFETY: matches bandwidth_read(p, n16, out); each buffer holds n16 vectors, out
        // `blocks` words.
        unsafe { b.launch(cfg) }?;
        Ok(())
    };
    for i in 0..copies {
        launch(i)?;
    }
    let start = stream.record_event(flags)?;
    let total = iters.max(copies);
    for i in 0..total {
        launch(i)?;
    }
    let end = stream.record_event(flags)?;
    let us = start.elapsed_ms(&end)? as f64 * 1e3 / total as f64;
    Ok((n16 * 16) as f64 / us / 1e3)
}
