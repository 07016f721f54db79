//! The int8 tensor-core small-batch product (crate::mmq, kernels/mmq.cu) against the CPU
//! reference (`quant::dequantize_row` + f64 dot) on random weights of every supported format,
//! odd row counts (not multiples of the 16-row tile), partial 256-weight chunks, 1..40 tokens
//! (one launch takes 32: 40 loops), every warps-per-block split, on tensor cores and on the
//! sm_70 fallback (mma emulated by shuffles + dp4a, forced on any card).
//! Skipped (with a message) when no CUDA device is present.
//!
//! Two checks per output, as tests/gpu_matvec.rs:
//! 1. exact pipeline: x quantized to q8_1 on the CPU as the kernel's quantizer does, then
//!    dot(dequantized w, d*q) in f64; |err| <= 2e-5 * sum|w*xq| (+ tiny) — any decode or
//!    fragment-layout bug is far beyond that.
//! 2. end to end vs the unquantized x: |err| <= sum_i |w_i| * |x_i - xq_i| (+ the same term).
//!
//! `cargo test -p cuda --test gpu_mmq -- --ignored --nocapture` times the 32B / 27B FFN shapes
//! against the matvec in the same run.

mod timing;

use cuda::synthetic::{random_activations, random_matrix};
use cuda::{open_or_cpu, CudaDevice, CudaOptions};
use gguf::GgmlType;
use quant::blocks::BlockQ8K;
use timing::time_us;

const FORMATS: [GgmlType; 6] = [
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::IQ4XS,
    GgmlType::Q5K,
];

/// The device with x in the natural q8_1 layout: the products tested here read that layout
/// (the tiled one, the default for 1-2 tokens, is the dp4a matvec's, tested in gpu_matvec).
fn device() -> Option<cuda::CudaDevice> {
    cuda::matvec::set_q8_1_tiled(Some(false));
    open_or_cpu(&CudaOptions::default())
}

fn q8_1_reference(x: &[f32]) -> Vec<f32> {
    // what quantize_q8_1 in kernels/matvec_quant.cu produces, dequantized: d * q per element
    let mut out = vec![0f32; x.len()];
    for (xs, os) in x.chunks(32).zip(out.chunks_mut(32)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        for (o, &v) in os.iter_mut().zip(xs) {
            let q = if amax == 0.0 {
                0.0
            } else {
                (v / d).round_ties_even()
            };
            *o = d * q;
        }
    }
    out
}

/// Reference outputs of one matrix for `tokens` tokens: (exact q8_1 pipeline, magnitude,
/// unquantized f64, q8_1 error bound), each [tokens, rows].
struct Reference {
    exact: Vec<f64>,
    mag: Vec<f64>,
    full: Vec<f64>,
    bound: Vec<f64>,
}

fn reference(
    ty: GgmlType,
    wbytes: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    tokens: usize,
) -> Reference {
    reference_with(ty, wbytes, rows, cols, x, tokens, q8_1_reference)
}

/// What quantize_q8_k in kernels/mmv.cu produces (bit for bit the CPU's q8_K), dequantized:
/// dy * q per element.
fn q8_k_reference(x: &[f32]) -> Vec<f32> {
    let blocks = q8_k_blocks(x);
    let mut out = Vec::with_capacity(x.len());
    for b in &blocks {
        let d = f32::from_le_bytes(b.d);
        out.extend(b.qs.iter().map(|&q| d * q as f32));
    }
    out
}

/// The CPU's q8_K blocks of x (a multiple of 256 values).
fn q8_k_blocks(x: &[f32]) -> Vec<BlockQ8K> {
    let zero = BlockQ8K {
        d: [0; 4],
        qs: [0; 256],
        bsums: [[0; 2]; 16],
    };
    let mut blocks = vec![zero; x.len() / 256];
    quant::activation::quantize_row_q8_k(x, &mut blocks);
    blocks
}

/// [`reference`] with x quantized by `quantize` (q8_1 or q8_K, dequantized).
fn reference_with(
    ty: GgmlType,
    wbytes: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    tokens: usize,
    quantize: fn(&[f32]) -> Vec<f32>,
) -> Reference {
    let row_bytes = wbytes.len() / rows;
    let mut wf = vec![0f32; rows * cols];
    for r in 0..rows {
        quant::dequantize_row(
            ty,
            &wbytes[r * row_bytes..(r + 1) * row_bytes],
            &mut wf[r * cols..(r + 1) * cols],
        )
        .expect("dequantize");
    }
    let n = tokens * rows;
    let mut out = Reference {
        exact: vec![0.0; n],
        mag: vec![0.0; n],
        full: vec![0.0; n],
        bound: vec![0.0; n],
    };
    for t in 0..tokens {
        let xt = &x[t * cols..(t + 1) * cols];
        let xq = quantize(xt);
        for r in 0..rows {
            let wr = &wf[r * cols..(r + 1) * cols];
            let (mut exact, mut mag, mut full, mut bound) = (0f64, 0f64, 0f64, 0f64);
            for i in 0..cols {
                let (w, q, f) = (wr[i] as f64, xq[i] as f64, xt[i] as f64);
                exact += w * q;
                mag += (w * q).abs();
                full += w * f;
                bound += w.abs() * (f - q).abs();
            }
            let o = t * rows + r;
            out.exact[o] = exact;
            out.mag[o] = mag;
            out.full[o] = full;
            out.bound[o] = bound;
        }
    }
    out
}

/// Prints the first 40 failures and fails the test if there are any.
fn assert_no_failures(failures: &[String]) {
    for f in failures.iter().take(40) {
        eprintln!("FAIL {f}");
    }
    assert!(
        failures.is_empty(),
        "{} failures (first above)",
        failures.len()
    );
}

/// The product under test.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    Mmq,
    Mmv,
    /// q8_K x (`rf` must be a q8_K reference)
    Mmv2,
}

/// One checked shape: a random `ty` matrix (from `seed`), x of `max_n` random tokens, the CPU
/// reference with x quantized by `quantize`, both uploaded, and scratch for `max_n` tokens.
struct Case {
    w: cuda::DeviceMatrix,
    xd: cuda::CudaSlice<f32>,
    rf: Reference,
    scratch: cuda::MatvecScratch,
}

fn case(
    dev: &CudaDevice,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    max_n: usize,
    seed: u64,
    quantize: fn(&[f32]) -> Vec<f32>,
) -> Case {
    let wbytes = random_matrix(ty, rows, cols, seed);
    let x = random_activations(max_n * cols, seed ^ 0x5eed);
    Case {
        rf: reference_with(ty, &wbytes, rows, cols, &x, max_n, quantize),
        w: dev.upload_matrix(ty, rows, cols, &wbytes).expect("upload"),
        xd: dev.stream().clone_htod(&x).expect("upload x"),
        scratch: dev.matvec_scratch(max_n, cols).expect("scratch"),
    }
}

/// Runs the product for the first `n` tokens and checks it; returns the worst relative error.
#[allow(clippy::too_many_arguments)]
fn check(
    dev: &CudaDevice,
    w: &cuda::DeviceMatrix,
    xd: &cuda::CudaSlice<f32>,
    rf: &Reference,
    n: usize,
    scratch: &mut cuda::MatvecScratch,
    path: Path,
) -> Result<f64, String> {
    let (rows, cols) = (w.n_rows, w.n_cols);
    // one row of NaN past the outputs: nothing may be written there
    let mut y = dev
        .stream()
        .clone_htod(&vec![f32::NAN; (n + 1) * rows])
        .map_err(|e| e.to_string())?;
    match path {
        Path::Mmv => dev
            .quantize_for_matvec(xd, n, cols, scratch)
            .and_then(|_| dev.mmv_prequantized(w, scratch, &mut y)),
        Path::Mmv2 => dev
            .quantize_q8_k(xd, n, cols, scratch)
            .and_then(|_| dev.mmv2_prequantized(w, scratch, &mut y)),
        Path::Mmq => dev.mmq(w, xd, n, &mut y, scratch),
    }
    .map_err(|e| e.to_string())?;
    let y = dev.stream().clone_dtoh(&y).map_err(|e| e.to_string())?;
    let name = w.ty.name();
    let mut worst = 0f64;
    for t in 0..n {
        for r in 0..rows {
            let o = t * rows + r;
            let got = y[o] as f64;
            let tol = 2e-5 * rf.mag[o] + 1e-6;
            let err = (got - rf.exact[o]).abs();
            if err.is_nan() || err > tol {
                return Err(format!(
                    "{name} {rows}x{cols} n={n}: y[{t},{r}] = {got}, exact-q8_1 reference {} (err {err:.3e} > tol {tol:.3e})",
                    rf.exact[o]
                ));
            }
            if (got - rf.full[o]).abs() > rf.bound[o] * 1.0001 + tol {
                return Err(format!(
                    "{name} {rows}x{cols} n={n}: y[{t},{r}] = {got} vs f64 {}: beyond the q8_1 bound {:.3e}",
                    rf.full[o], rf.bound[o]
                ));
            }
            worst = worst.max(err / rf.mag[o].max(1e-30));
        }
    }
    if let Some(i) = y[n * rows..].iter().position(|v| !v.is_nan()) {
        return Err(format!(
            "{name} {rows}x{cols} n={n}: wrote y[{n},{i}] past the outputs"
        ));
    }
    Ok(worst)
}

#[test]
fn mmq_matches_cpu_reference_for_every_format() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let t = std::time::Instant::now();
    dev.module(cuda::Program::Mmq).expect("mmq kernels compile");
    dev.module(cuda::Program::MatvecQuant)
        .expect("matvec kernels compile");
    eprintln!("mmq kernels ready in {:.1} s", t.elapsed().as_secs_f64());
    const MAX_N: usize = 40;
    let token_counts = [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 24, 25, 31, 32, 40];
    let mut failures = Vec::new();
    let mut seed = 7u64;
    for ty in FORMATS {
        let bs = ty.block_size();
        // 16-row tiles: 1 row, 15, 17, 37, 129, 523 rows; columns: one block, partial 256-weight
        // chunks (32-wide formats), more chunks than warps, a long row
        let mut shapes = vec![
            (1, bs),
            (15, 3 * bs),
            (17, 9 * bs),
            (37, 33 * bs),
            (523, 10 * bs),
        ];
        shapes.push((129, (4096 / bs + 5) * bs));
        for &(rows, cols) in &shapes {
            seed += 1;
            let Case {
                w,
                xd,
                rf,
                mut scratch,
            } = case(&dev, ty, rows, cols, MAX_N, seed, q8_1_reference);
            let mut worst = 0f64;
            for (i, &n) in token_counts.iter().enumerate() {
                // the emulated mma, the mma with one 16-row tile a block, with two (9+ tokens)
                for (emulate, mt) in [(false, 1), (true, 1), (false, 2)] {
                    // cycle the warps per block: the per-shape choice, 1, 3 (not a power of
                    // two), 8
                    let warps = [0, 1, 3, 8][(i + emulate as usize + mt as usize) % 4];
                    cuda::mmq::set_force_emulation(emulate);
                    cuda::mmq::set_warps_override(warps);
                    cuda::mmq::set_m_tiles_override(mt);
                    match check(&dev, &w, &xd, &rf, n, &mut scratch, Path::Mmq) {
                        Ok(e) => worst = worst.max(e),
                        Err(e) => failures.push(format!(
                            "{e} ({}, warps {warps}, {mt} tiles a block)",
                            if emulate { "emulated mma" } else { "mma" }
                        )),
                    }
                }
            }
            eprintln!(
                "checked {:>7} {:>4}x{:<5} n=1..{MAX_N}: max rel err {worst:.2e}",
                ty.name(),
                rows,
                cols
            );
        }
    }
    cuda::mmq::set_force_emulation(false);
    cuda::mmq::set_warps_override(0);
    cuda::mmq::set_m_tiles_override(0);
    assert_no_failures(&failures);
}

#[test]
#[ignore = "timing on a real card: cargo test -p cuda --test gpu_mmq -- --ignored --nocapture"]
fn mmq_timing_vs_matvec() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    dev.module(cuda::Program::Mmq).expect("mmq kernels compile");
    dev.module(cuda::Program::MatvecQuant)
        .expect("matvec kernels compile");
    let shapes = [
        (27648usize, 5120usize),
        (5120, 27648),
        (5120, 5120),
        (17408, 5120),
    ];
    let counts = [1usize, 2, 3, 4, 8, 16, 32];
    let only: Option<Vec<String>> = std::env::var("MMQ_TYPES")
        .ok()
        .map(|s| s.split(',').map(|t| t.to_string()).collect());
    println!(
        "{:>7} {:>12} {:>3} {:>9} {:>9} {:>7} {:>7} {:>6}  warps sweep (mmq µs)",
        "type", "shape", "n", "matvec", "mmq", "mv/mv1", "mmq/mv1", "best"
    );
    for ty in FORMATS {
        if let Some(o) = &only {
            if !o.iter().any(|t| t.eq_ignore_ascii_case(ty.name())) {
                continue;
            }
        }
        for &(rows, cols) in &shapes {
            let TimingSetup {
                ws,
                copies,
                x,
                mut y,
                mut s,
                ..
            } = timing_setup(&dev, ty, rows, cols, *counts.last().unwrap());
            let mut mv1 = 0.0;
            for &n in &counts {
                dev.quantize_for_matvec(&x, n, cols, &mut s)
                    .expect("quantize");
                let mv = time_us(&dev, copies, 40, |i| {
                    dev.matvec_prequantized(&ws[i], &s, &mut y)
                })
                .expect("matvec timing");
                if n == 1 {
                    mv1 = mv;
                }
                let mut sweep = Vec::new();
                for warps in [0u32, 2, 4, 8] {
                    cuda::mmq::set_warps_override(warps);
                    let us = time_us(&dev, copies, 40, |i| {
                        dev.mmq_prequantized(&ws[i], n, &mut s, &mut y)
                    })
                    .expect("mmq timing");
                    sweep.push((warps, us));
                }
                cuda::mmq::set_warps_override(0);
                // two 16-row tiles a block (9+ tokens), the per-shape warps
                let m2 = if n > 8 {
                    cuda::mmq::set_m_tiles_override(2);
                    let us = time_us(&dev, copies, 40, |i| {
                        dev.mmq_prequantized(&ws[i], n, &mut s, &mut y)
                    })
                    .expect("mmq timing");
                    cuda::mmq::set_m_tiles_override(0);
                    format!(" m2 {us:.1}")
                } else {
                    String::new()
                };
                let mq = sweep[0].1;
                let best =
                    sweep
                        .iter()
                        .skip(1)
                        .fold((0, f64::MAX), |b, &(w, t)| if t < b.1 { (w, t) } else { b });
                println!(
                    "{:>7} {:>12} {:>3} {:>9.1} {:>9.1} {:>7.2} {:>7.2} {:>6}  {}{m2}",
                    ty.name(),
                    format!("{rows}x{cols}"),
                    n,
                    mv,
                    mq,
                    mv / mv1,
                    mq / mv1,
                    format!("w{}", best.0),
                    sweep
                        .iter()
                        .skip(1)
                        .map(|(w, t)| format!("{w} {t:.1}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
        }
    }
}

// ---- the few-token tensor-core path (crate::mmv, kernels/mmv.cu) ---------------------------

const MMV_FORMATS: [GgmlType; 2] = [GgmlType::Q4K, GgmlType::Q6K];

#[test]
fn mmv_matches_cpu_reference() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    dev.module(cuda::Program::Mmv).expect("mmv kernels compile");
    const MAX_N: usize = 8;
    let mut failures = Vec::new();
    let mut seed = 70u64;
    for ty in MMV_FORMATS {
        // 16-row tiles: 1 row, 15, 17, 37, 129, 523 rows; 1..21 super-blocks per row (fewer
        // and more than the warps of a block, odd counts: the two-buffer loop's tail)
        let shapes = [
            (1, 256),
            (15, 768),
            (17, 2304),
            (37, 8448),
            (523, 2560),
            (129, 5376),
        ];
        for &(rows, cols) in &shapes {
            seed += 1;
            let Case {
                w,
                xd,
                rf,
                mut scratch,
            } = case(&dev, ty, rows, cols, MAX_N, seed, q8_1_reference);
            let mut worst = 0f64;
            for n in 1..=MAX_N {
                for (emulate, bd_off) in [(false, false), (true, false), (false, true)] {
                    cuda::mmv::set_block_diagonal_off(bd_off);
                    let warps = [0, 1, 3, 8][(n + emulate as usize + bd_off as usize) % 4];
                    cuda::mmv::set_force_emulation(emulate);
                    cuda::mmv::set_warps_override(warps);
                    cuda::mmv::set_load_mode_override(Some(2 * (n / 4 % 2) as u32));
                    // (Q6_K here is mmv2_q6_k_q81: its K split too, and at 1-2 tokens of
                    // 2560 columns x in the tiled q8_1 layout (mmv2_q6_k_q81t) or not)
                    cuda::mmv::set_mmv2_ksplit(Some([1, 2, 3, 4][(n + bd_off as usize) % 4]));
                    cuda::matvec::set_q8_1_tiled(Some(ty == GgmlType::Q6K && !bd_off));
                    match check(&dev, &w, &xd, &rf, n, &mut scratch, Path::Mmv) {
                        Ok(e) => worst = worst.max(e),
                        Err(e) => failures.push(format!(
                            "{e} ({}, warps {warps}, block-diagonal off {bd_off})",
                            if emulate { "emulated mma" } else { "mma" }
                        )),
                    }
                }
            }
            cuda::mmv::set_block_diagonal_off(false);
            cuda::matvec::set_q8_1_tiled(Some(false));
            eprintln!(
                "mmv checked {:>5} {:>4}x{:<5} n=1..{MAX_N}: max rel err {worst:.2e}",
                ty.name(),
                rows,
                cols
            );
        }
    }
    cuda::mmv::set_force_emulation(false);
    cuda::mmv::set_warps_override(0);
    cuda::mmv::set_load_mode_override(None);
    cuda::mmv::set_mmv2_stages(None);
    cuda::mmv::set_mmv2_ksplit(None);
    cuda::mmv::set_mmv2_xs(None);
    assert_no_failures(&failures);
}

/// Three matrices in one launch (Q/K/V-like: 40, 17 and 1 rows), one with a bias, one that
/// accumulates into its output (the residual add), 3 tokens: each output equals its own
/// product plus bias / old value.
#[test]
#[allow(clippy::needless_range_loop)] // rows index several parallel arrays
fn mmv_segments_with_bias_and_accumulate() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let (cols, n) = (1024usize, 3usize);
    for ty in MMV_FORMATS {
        let rows = [40usize, 17, 1];
        let x = random_activations(n * cols, 11);
        let xd = dev.stream().clone_htod(&x).expect("x");
        let mut scratch = dev.matvec_scratch(n, cols).expect("scratch");
        dev.quantize_for_matvec(&xd, n, cols, &mut scratch)
            .expect("quantize");
        let mut ws = Vec::new();
        let mut refs = Vec::new();
        for (i, &r) in rows.iter().enumerate() {
            let b = random_matrix(ty, r, cols, 100 + i as u64);
            refs.push(reference(ty, &b, r, cols, &x, n));
            ws.push(dev.upload_matrix(ty, r, cols, &b).expect("upload"));
        }
        let bias: Vec<f32> = (0..rows[0]).map(|i| 0.25 * i as f32 - 3.0).collect();
        let bias_d = dev.stream().clone_htod(&bias).expect("bias");
        let old: Vec<f32> = (0..n * rows[1]).map(|i| (i as f32).sin() * 5.0).collect();
        let mut ys: Vec<cuda::CudaSlice<f32>> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let init = if i == 1 {
                    old.clone()
                } else {
                    vec![f32::NAN; n * r]
                };
                dev.stream().clone_htod(&init).expect("y")
            })
            .collect();
        let segs: Vec<cuda::matvec::Segment<'_>> = ws
            .iter()
            .enumerate()
            .map(|(i, w)| cuda::matvec::Segment {
                w,
                y: dev.device_address(&ys[i]),
                bias: (i == 0).then(|| dev.device_address(&bias_d)),
                accumulate: i == 1,
            })
            .collect();
        dev.mmv_segments(&segs, &scratch).expect("mmv segments");
        drop(segs);
        for (i, &r) in rows.iter().enumerate() {
            let got = dev.stream().clone_dtoh(&ys[i]).expect("y back");
            for t in 0..n {
                for row in 0..r {
                    let o = t * r + row;
                    let mut want = refs[i].exact[o];
                    if i == 0 {
                        want += bias[row] as f64;
                    }
                    if i == 1 {
                        want += old[o] as f64;
                    }
                    let tol = 2e-5 * refs[i].mag[o] + 1e-5 * want.abs() + 1e-5;
                    assert!(
                        (got[o] as f64 - want).abs() <= tol,
                        "{} segment {i} y[{t},{row}] = {} want {want}",
                        ty.name(),
                        got[o]
                    );
                }
            }
        }
        ys.clear();
    }
}

#[test]
#[ignore = "timing on a real card: cargo test -p cuda --test gpu_mmq -- --ignored --nocapture"]
fn mmv_timing_vs_matvec() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    dev.module(cuda::Program::Mmv).expect("mmv kernels compile");
    dev.module(cuda::Program::MatvecQuant)
        .expect("matvec kernels compile");
    let shapes = [
        (27648usize, 5120usize),
        (5120, 27648),
        (5120, 5120),
        (17408, 5120),
        (5120, 17408),
        (10240, 5120),
    ];
    let counts = [1usize, 2, 3, 4, 6, 8];
    println!(
        "{:>5} {:>12} {:>2} {:>8} {:>8} {:>7} {:>7} {:>8}  warps sweep (mmv µs)",
        "type", "shape", "n", "matvec", "mmv", "mv/mv1", "mmv/mv1", "mmv GB/s"
    );
    for ty in MMV_FORMATS {
        for &(rows, cols) in &shapes {
            let TimingSetup {
                ws,
                nbytes,
                copies,
                x,
                mut y,
                mut s,
            } = timing_setup(&dev, ty, rows, cols, 8);
            let mut mv1 = 0.0;
            for &n in &counts {
                dev.quantize_for_matvec(&x, n, cols, &mut s)
                    .expect("quantize");
                let mv = time_us(&dev, copies, 40, |i| {
                    dev.matvec_prequantized(&ws[i], &s, &mut y)
                })
                .expect("matvec timing");
                if n == 1 {
                    mv1 = mv;
                }
                // (warps, load mode, block-diagonal off): the defaults first
                let mut sweep = Vec::new();
                for (warps, mode, bd_off) in [
                    (0u32, None, false),
                    (0, None, true),
                    (0, Some(0u32), false),
                    (2, None, false),
                    (4, None, false),
                    (8, None, false),
                ] {
                    cuda::mmv::set_block_diagonal_off(bd_off);
                    cuda::mmv::set_warps_override(warps);
                    cuda::mmv::set_load_mode_override(mode);
                    let us = time_us(&dev, copies, 40, |i| {
                        dev.mmv_prequantized(&ws[i], &s, &mut y)
                    })
                    .expect("mmv timing");
                    let tag = format!(
                        "w{warps}m{}{}",
                        mode.map_or(9, |m| m),
                        if bd_off { "-nobd" } else { "" }
                    );
                    sweep.push((tag, us));
                }
                cuda::mmv::set_block_diagonal_off(false);
                cuda::mmv::set_warps_override(0);
                cuda::mmv::set_load_mode_override(None);
                let mm = sweep[0].1;
                println!(
                    "{:>5} {:>12} {:>2} {:>8.1} {:>8.1} {:>7.2} {:>7.2} {:>8.0}  {}",
                    ty.name(),
                    format!("{rows}x{cols}"),
                    n,
                    mv,
                    mm,
                    mv / mv1,
                    mm / mv1,
                    nbytes as f64 / (mm * 1e3),
                    sweep
                        .iter()
                        .skip(1)
                        .map(|(w, t)| format!("{w} {t:.1}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
        }
    }
}

/// The tensor-core path rounds no worse than the dp4a matvec: both against the exact-q8_1
/// f64 reference on the same quantized x, RMS of the error over all outputs (relative to the
/// RMS output), for every kernel the dispatch can pick (1..8 tokens, both formats).
#[test]
fn mmv_rounds_no_worse_than_the_matvec() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let (rows, cols) = (1024usize, 5120usize);
    for ty in MMV_FORMATS {
        let wbytes = random_matrix(ty, rows, cols, 5);
        let x = random_activations(8 * cols, 6);
        let rf = reference(ty, &wbytes, rows, cols, &x, 8);
        let w = dev.upload_matrix(ty, rows, cols, &wbytes).expect("upload");
        let xd = dev.stream().clone_htod(&x).expect("x");
        let mut s = dev.matvec_scratch(8, cols).expect("scratch");
        let mut y = dev.stream().alloc_zeros::<f32>(8 * rows).expect("y");
        for n in 1..=8 {
            dev.quantize_for_matvec(&xd, n, cols, &mut s)
                .expect("quantize");
            let rms_err = |y: &[f32]| {
                let (mut e, mut r) = (0f64, 0f64);
                for (&got, &want) in y.iter().zip(&rf.exact).take(n * rows) {
                    e += (got as f64 - want).powi(2);
                    r += want.powi(2);
                }
                (e / r).sqrt()
            };
            dev.matvec_prequantized(&w, &s, &mut y).expect("matvec");
            let mv = rms_err(&dev.stream().clone_dtoh(&y).expect("y"));
            dev.mmv_prequantized(&w, &s, &mut y).expect("mmv");
            let mm = rms_err(&dev.stream().clone_dtoh(&y).expect("y"));
            eprintln!(
                "{} {rows}x{cols} n={n}: rms relative error matvec {mv:.2e}, mmv {mm:.2e}",
                ty.name()
            );
            assert!(
                mm <= 2.0 * mv + 1e-8,
                "{} n={n}: mmv rms error {mm:.2e} vs matvec {mv:.2e}",
                ty.name()
            );
        }
    }
}

// ---- mmv2: q8_K activations, integer sums per super-block (crate::mmv mmv2_*) ---------------

/// The GPU q8_K quantizer is bit for bit the CPU's `quantize_row_q8_k` (q, dy) and its unit
/// sums are the CPU's 16-value sums pairwise: random x, a zero block, and magnitude ties
/// (the first element of largest |x| sets the sign of dy).
#[test]
fn quantize_q8_k_matches_cpu() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    // (12 and 25 tokens: the layout pads to 16 and 32, crate::mmv::q8k_layout_tokens)
    for &(n, cols) in &[
        (1usize, 256usize),
        (3, 5120),
        (8, 2304),
        (5, 27648),
        (12, 2304),
        (25, 512),
    ] {
        let mut x = random_activations(n * cols, 40 + cols as u64);
        x[..256].fill(0.0);
        let last = (n - 1) * cols;
        if cols >= 512 {
            x[256 + 3] = 9.5;
            x[256 + 200] = -9.5;
        }
        x[last + 17] = -11.25;
        x[last + 90] = 11.25;
        let xd = dev.stream().clone_htod(&x).expect("x");
        let nl = cuda::mmv::q8k_layout_tokens(n);
        let mut s = dev.matvec_scratch(nl, cols).expect("scratch");
        dev.quantize_q8_k(&xd, n, cols, &mut s).expect("quantize");
        let (q, dy, bsum, holds) = s.q8_k();
        assert_eq!(holds, Some((n, cols)));
        let q = dev.stream().clone_dtoh(q).expect("q");
        let dy = dev.stream().clone_dtoh(dy).expect("dy");
        let bsum = dev.stream().clone_dtoh(bsum).expect("bsum");
        let blocks = q8_k_blocks(&x);
        // the GPU copy is token-interleaved (common.cuh q8k_q_at) over nl tokens: unit U of
        // token t at 32 (U nl + t), super-block s's dy / bsum of token t at s nl + t
        let nsb = cols / 256;
        for (j, b) in blocks.iter().enumerate() {
            let (tok, sb) = (j / nsb, j % nsb);
            let at = sb * nl + tok;
            let d = f32::from_le_bytes(b.d);
            assert_eq!(
                dy[at].to_bits(),
                d.to_bits(),
                "{n}x{cols} block {j}: dy {} vs CPU {d}",
                dy[at]
            );
            for (i, &want) in b.qs.iter().enumerate() {
                let unit = 8 * sb + i / 32;
                assert_eq!(
                    q[32 * (unit * nl + tok) + i % 32],
                    want,
                    "{n}x{cols} block {j} q[{i}]"
                );
            }
            for u in 0..8 {
                let half = |h: usize| i16::from_le_bytes(b.bsums[h]) as i32;
                let want = half(2 * u) + half(2 * u + 1);
                assert_eq!(
                    bsum[8 * at + u] as i32,
                    want,
                    "{n}x{cols} block {j} bsum[{u}]"
                );
            }
        }
        // a later q8_1 quantization of the scratch forgets the q8_K copy
        dev.quantize_for_matvec(&xd, n, cols, &mut s).expect("q8_1");
        assert_eq!(s.q8_k().3, None);
    }
}

const MMV2_FORMATS: [GgmlType; 3] = [GgmlType::Q4K, GgmlType::Q6K, GgmlType::IQ4XS];
/// The mmv2 formats the q8_1 tensor-core kernels (mmv) have too: the rounding comparison and the
/// timing sweep put the paths side by side.
const MMV2_AND_MMV_FORMATS: [GgmlType; 2] = [GgmlType::Q4K, GgmlType::Q6K];

#[test]
fn mmv2_matches_cpu_reference() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    dev.module(cuda::Program::Mmv).expect("mmv kernels compile");
    const MAX_N: usize = 8;
    let mut failures = Vec::new();
    let mut seed = 170u64;
    for ty in MMV2_FORMATS {
        // rows: 1, 15, 17, 33, 37, 129, 523 (not multiples of the 16-row tile); 1..33
        // super-blocks per row (fewer and more than the warps of a block, odd counts: the
        // two-buffer tail). Q6_K rows are 210 * n_sb bytes: with 1, 3, 9, 21 or 33 super-blocks
        // the rows of a tile start at every even offset mod 16 (mmv2_q6_k's staging shifts
        // and (start & 12) placements), with 10 at multiples of 4, with 8 all 16-byte aligned.
        let shapes = [
            (1, 256),
            (15, 768),
            (17, 2304),
            (33, 2048),
            (37, 8448),
            (523, 2560),
            (129, 5376),
        ];
        for &(rows, cols) in &shapes {
            seed += 1;
            let Case {
                w,
                xd,
                rf,
                mut scratch,
            } = case(&dev, ty, rows, cols, MAX_N, seed, q8_k_reference);
            let mut worst = 0f64;
            for n in 1..=MAX_N {
                for emulate in [false, true] {
                    // Q4_K: the register-fragment kernel and the staged ones (cp.async, 2..4
                    // stages; Q6_K has one kernel)
                    let stage_set: &[u32] = if ty == GgmlType::Q4K {
                        &[0, 2, 3, 4]
                    } else {
                        &[0]
                    };
                    for &stages in stage_set {
                        let warps =
                            [0, 1, 3, 8, 5, 2][(2 * n + emulate as usize + stages as usize) % 6];
                        // Q4_K at 2 and 3 stages: x staged with the weights on every other n
                        cuda::mmv::set_mmv2_xs(Some(n % 2 == 1));
                        cuda::mmv::set_force_emulation(emulate);
                        cuda::mmv::set_warps_override(warps);
                        cuda::mmv::set_load_mode_override(Some(2 * (n % 2) as u32));
                        cuda::mmv::set_mmv2_stages(Some(stages));
                        // K split into 1..4 parts per tile (every shape here has few tiles)
                        let ks = 1 + ((n + stages as usize + emulate as usize) % 4) as u32;
                        cuda::mmv::set_mmv2_ksplit(Some(ks));
                        match check(&dev, &w, &xd, &rf, n, &mut scratch, Path::Mmv2) {
                            Ok(e) => worst = worst.max(e),
                            Err(e) => failures.push(format!(
                                "{e} ({}, warps {warps}, stages {stages}, ksplit {ks})",
                                if emulate { "emulated mma" } else { "mma" }
                            )),
                        }
                    }
                }
            }
            eprintln!(
                "mmv2 checked {:>5} {:>4}x{:<5} n=1..{MAX_N}: max rel err {worst:.2e}",
                ty.name(),
                rows,
                cols
            );
        }
    }
    cuda::mmv::set_force_emulation(false);
    cuda::mmv::set_warps_override(0);
    cuda::mmv::set_load_mode_override(None);
    cuda::mmv::set_mmv2_stages(None);
    cuda::mmv::set_mmv2_ksplit(None);
    cuda::mmv::set_mmv2_xs(None);
    assert_no_failures(&failures);
}

/// 9..32 tokens on the mmv2 kernels with 2..4 tiles of 8 tokens per warp (`mmv2s_q4_k_s2_n*`,
/// `mmv2_q6_k_n*`): every token's outputs against the q8_K reference, full and partial last
/// tiles (the padding token columns must not be stored), rows not a multiple of the 16-row
/// tile, mma and emulated, several warps per block, Q4_K staged and in registers.
#[test]
fn mmv2_n_tiles_match_cpu_reference() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    dev.module(cuda::Program::Mmv).expect("mmv kernels compile");
    const MAX_N: usize = 32;
    let mut failures = Vec::new();
    let mut seed = 370u64;
    for ty in [GgmlType::Q4K, GgmlType::Q6K] {
        for &(rows, cols) in &[(17, 2304), (37, 8448), (523, 2560), (129, 5376)] {
            seed += 1;
            let Case {
                w,
                xd,
                rf,
                mut scratch,
            } = case(&dev, ty, rows, cols, MAX_N, seed, q8_k_reference);
            let mut worst = 0f64;
            for (i, n) in [9, 12, 16, 17, 23, 24, 25, 31, 32].into_iter().enumerate() {
                for emulate in [false, true] {
                    let warps = [0, 1, 3, 8, 5, 2][(i + 3 * emulate as usize) % 6];
                    // Q4_K: the staged kernel (2 stages) and the register-fragment one
                    let stages = [2, 0][(i + emulate as usize) % 2];
                    cuda::mmv::set_mmv2_stages(Some(stages));
                    cuda::mmv::set_force_emulation(emulate);
                    cuda::mmv::set_warps_override(warps);
                    cuda::mmv::set_load_mode_override(Some(2 * (n % 2) as u32));
                    match check(&dev, &w, &xd, &rf, n, &mut scratch, Path::Mmv2) {
                        Ok(e) => worst = worst.max(e),
                        Err(e) => failures.push(format!(
                            "{e} ({}, warps {warps}, stages {stages})",
                            if emulate { "emulated mma" } else { "mma" }
                        )),
                    }
                }
            }
            eprintln!(
                "mmv2 n-tiles checked {:>5} {:>4}x{:<5} n=9..{MAX_N}: max rel err {worst:.2e}",
                ty.name(),
                rows,
                cols
            );
        }
    }
    cuda::mmv::set_force_emulation(false);
    cuda::mmv::set_warps_override(0);
    cuda::mmv::set_load_mode_override(None);
    cuda::mmv::set_mmv2_stages(None);
    assert_no_failures(&failures);
}

/// Three matrices in one mmv2 launch (40, 17 and 1 rows), one with a bias, one accumulating
/// into its output, for 2, 5 and 8 tokens, and (Q4_K, Q6_K: the n-tile kernels, as the
/// backend's 9..32-row `matmul_many` / `matmul_add` run them) 12 and 32. Q4_K of 3..8 tokens
/// goes through the backend's entry (`few_token_segments` with mmv2 switched on: it quantizes
/// x to q8_K itself) on sm_80+.
#[test]
#[allow(clippy::needless_range_loop)] // rows index several parallel arrays
fn mmv2_segments_with_bias_and_accumulate() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let cols = 1280usize;
    cuda::mmv::set_mmv2(Some(true));
    for ty in MMV2_FORMATS {
        for n in [2usize, 5, 8, 12, 32] {
            if n > 8 && !matches!(ty, GgmlType::Q4K | GgmlType::Q6K) {
                continue;
            }
            // the K split (parts of a tile meeting in the last one to finish: bias and the
            // accumulated output applied once) and, for Q4_K, the staged kernel at 5 tokens
            cuda::mmv::set_mmv2_ksplit(Some(match n {
                2 => 2,
                5 => 4,
                _ => 3,
            }));
            // (n-tiles: the register kernel at 12 tokens, the staged one at 32)
            cuda::mmv::set_mmv2_stages(Some(if n == 5 || n == 32 { 2 } else { 0 }));
            // and at 5 tokens with x staged too
            cuda::mmv::set_mmv2_xs(Some(n == 5));
            let rows = [40usize, 17, 1];
            let x = random_activations(n * cols, 11 + n as u64);
            let xd = dev.stream().clone_htod(&x).expect("x");
            let lay = cuda::mmv::q8k_layout_tokens(n);
            let mut scratch = dev.matvec_scratch(lay, cols).expect("scratch");
            dev.quantize_for_matvec(&xd, n, cols, &mut scratch)
                .expect("quantize");
            let mut ws = Vec::new();
            let mut refs = Vec::new();
            for (i, &r) in rows.iter().enumerate() {
                let b = random_matrix(ty, r, cols, 200 + i as u64);
                refs.push(reference_with(ty, &b, r, cols, &x, n, q8_k_reference));
                ws.push(dev.upload_matrix(ty, r, cols, &b).expect("upload"));
            }
            let bias: Vec<f32> = (0..rows[0]).map(|i| 0.25 * i as f32 - 3.0).collect();
            let bias_d = dev.stream().clone_htod(&bias).expect("bias");
            let old: Vec<f32> = (0..n * rows[1]).map(|i| (i as f32).sin() * 5.0).collect();
            let mut ys: Vec<cuda::CudaSlice<f32>> = rows
                .iter()
                .enumerate()
                .map(|(i, &r)| {
                    let init = if i == 1 {
                        old.clone()
                    } else {
                        vec![f32::NAN; n * r]
                    };
                    dev.stream().clone_htod(&init).expect("y")
                })
                .collect();
            let segs: Vec<cuda::matvec::Segment<'_>> = ws
                .iter()
                .enumerate()
                .map(|(i, w)| cuda::matvec::Segment {
                    w,
                    y: dev.device_address(&ys[i]),
                    bias: (i == 0).then(|| dev.device_address(&bias_d)),
                    accumulate: i == 1,
                })
                .collect();
            // (IQ4_XS is dispatched only with REDLINE_MMV2_IQ4XS=1)
            let iq4xs_on = std::env::var("REDLINE_MMV2_IQ4XS").as_deref() == Ok("1");
            // (Q6_K from 2 tokens since session 26, the others from 3)
            let min = if ty == GgmlType::Q6K { 2 } else { 3 };
            let backend_entry =
                dev.arch() >= 80 && (min..=8).contains(&n) && (ty != GgmlType::IQ4XS || iq4xs_on);
            assert_eq!(
                cuda::mmv::dispatch2(&dev, ty, n),
                backend_entry,
                "{} n={n}",
                ty.name()
            );
            if backend_entry {
                dev.few_token_segments(&segs, &mut scratch, &xd)
                    .expect("few-token segments");
                assert_eq!(scratch.q8_k().3, Some((n, cols)));
            } else {
                dev.quantize_q8_k(&xd, n, cols, &mut scratch)
                    .and_then(|_| dev.mmv2_segments(&segs, &scratch))
                    .expect("mmv2 segments");
            }
            drop(segs);
            for (i, &r) in rows.iter().enumerate() {
                let got = dev.stream().clone_dtoh(&ys[i]).expect("y back");
                for t in 0..n {
                    for row in 0..r {
                        let o = t * r + row;
                        let mut want = refs[i].exact[o];
                        if i == 0 {
                            want += bias[row] as f64;
                        }
                        if i == 1 {
                            want += old[o] as f64;
                        }
                        let tol = 2e-5 * refs[i].mag[o] + 1e-5 * want.abs() + 1e-5;
                        assert!(
                            (got[o] as f64 - want).abs() <= tol,
                            "{} n={n} segment {i} y[{t},{row}] = {} want {want}",
                            ty.name(),
                            got[o]
                        );
                    }
                }
            }
            ys.clear();
        }
    }
    cuda::mmv::set_mmv2(None);
    cuda::mmv::set_mmv2_ksplit(None);
    cuda::mmv::set_mmv2_stages(None);
    cuda::mmv::set_mmv2_xs(None);
}

/// RMS error over all outputs (relative to the RMS output) of the dp4a matvec, mmv (both q8_1
/// x) and mmv2 (q8_K x): against the exact f64 product of the unquantized x (what the model
/// sees), and against the exact product of each path's own quantized x (the kernel's own
/// rounding). mmv2's own rounding must stay that of an f32 sum; its total error is reported
/// (per-256 activation scales are coarser than per-32 ones).
#[test]
fn mmv2_rounding_vs_the_q8_1_paths() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let (rows, cols) = (1024usize, 5120usize);
    // the mmv (q8_1 tensor-core) kernels read the natural q8_1 layout only (the dispatch keeps
    // the tiled one, on by default for 1-2 tokens, away from them)
    cuda::matvec::set_q8_1_tiled(Some(false));
    for ty in MMV2_AND_MMV_FORMATS {
        let wbytes = random_matrix(ty, rows, cols, 5);
        let x = random_activations(8 * cols, 6);
        let r1 = reference(ty, &wbytes, rows, cols, &x, 8);
        let rk = reference_with(ty, &wbytes, rows, cols, &x, 8, q8_k_reference);
        let w = dev.upload_matrix(ty, rows, cols, &wbytes).expect("upload");
        let xd = dev.stream().clone_htod(&x).expect("x");
        let mut s = dev.matvec_scratch(8, cols).expect("scratch");
        let mut y = dev.stream().alloc_zeros::<f32>(8 * rows).expect("y");
        for n in 1..=8 {
            let rms = |y: &[f32], want: &[f64]| {
                let (mut e, mut r) = (0f64, 0f64);
                for (&got, &want) in y.iter().zip(want).take(n * rows) {
                    e += (got as f64 - want).powi(2);
                    r += want.powi(2);
                }
                (e / r).sqrt()
            };
            dev.quantize_for_matvec(&xd, n, cols, &mut s)
                .expect("quantize");
            dev.matvec_prequantized(&w, &s, &mut y).expect("matvec");
            let yv = dev.stream().clone_dtoh(&y).expect("y");
            let (mv_own, mv_full) = (rms(&yv, &r1.exact), rms(&yv, &r1.full));
            dev.mmv_prequantized(&w, &s, &mut y).expect("mmv");
            let yv = dev.stream().clone_dtoh(&y).expect("y");
            let (mm_own, mm_full) = (rms(&yv, &r1.exact), rms(&yv, &r1.full));
            dev.quantize_q8_k(&xd, n, cols, &mut s).expect("q8_K");
            dev.mmv2_prequantized(&w, &s, &mut y).expect("mmv2");
            let yv = dev.stream().clone_dtoh(&y).expect("y");
            let (m2_own, m2_full) = (rms(&yv, &rk.exact), rms(&yv, &rk.full));
            eprintln!(
                "{} {rows}x{cols} n={n}: rms rel err vs f64 of unquantized x: matvec {mv_full:.2e}, mmv {mm_full:.2e}, mmv2 {m2_full:.2e}; vs own quantized x: matvec {mv_own:.2e}, mmv {mm_own:.2e}, mmv2 {m2_own:.2e}",
                ty.name()
            );
            assert!(
                m2_own <= 2.0 * mv_own + 1e-7,
                "{} n={n}: mmv2 own rounding {m2_own:.2e} vs matvec {mv_own:.2e}",
                ty.name()
            );
            assert!(
                m2_full <= 4.0 * mv_full,
                "{} n={n}: mmv2 total error {m2_full:.2e} vs matvec {mv_full:.2e}",
                ty.name()
            );
        }
    }
    cuda::matvec::set_q8_1_tiled(None);
}

#[test]
#[ignore = "timing on a real card: cargo test -p cuda --test gpu_mmq -- --ignored --nocapture"]
fn mmv2_timing_vs_matvec_and_mmv() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    dev.module(cuda::Program::Mmv).expect("mmv kernels compile");
    dev.module(cuda::Program::MatvecQuant)
        .expect("matvec kernels compile");
    // FFN up / down of the 32B, a square, and the Qwen2.5-32B output head (Q6_K only)
    // MMV2_SWEEP_SHAPES ("ROWSxCOLS,...", e.g. the 27B's Q6_K shapes "5120x17408,248320x5120")
    // replaces them
    let shapes: Vec<(usize, usize)> = std::env::var("MMV2_SWEEP_SHAPES")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|s| {
                    let (r, c) = s.trim().split_once('x')?;
                    Some((r.parse().ok()?, c.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_else(|| vec![(27648, 5120), (5120, 27648), (5120, 5120), (152064, 5120)]);
    // MMV2_SWEEP_TYPES (e.g. "Q6_K") and MMV2_SWEEP_COUNTS (e.g. "4,8") narrow the sweep for a
    // short device window
    let types: Vec<GgmlType> = match std::env::var("MMV2_SWEEP_TYPES") {
        Ok(v) => MMV2_FORMATS
            .into_iter()
            .filter(|t| {
                v.split(',')
                    .any(|n| n.trim().eq_ignore_ascii_case(t.name()))
            })
            .collect(),
        Err(_) => MMV2_FORMATS.to_vec(),
    };
    let counts: Vec<usize> = std::env::var("MMV2_SWEEP_COUNTS")
        .ok()
        .map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2, 3, 4, 8]);
    // the mmv (q8_1 tensor-core) kernels read the natural q8_1 layout only
    cuda::matvec::set_q8_1_tiled(Some(false));
    println!(
        "{:>5} {:>12} {:>2} {:>7} {:>7} {:>7} {:>6} {:>6} {:>8} {:>6} {:>6}  best mmv2 (warps, load mode)",
        "type", "shape", "n", "matvec", "mmv", "mmv2", "m2/mv1", "mv/mv1", "m2 GB/s", "q8_1", "q8_K"
    );
    let mut sweeps = Vec::new();
    for &ty in &types {
        for &(rows, cols) in &shapes {
            if rows > 100_000 && ty != GgmlType::Q6K {
                continue;
            }
            let TimingSetup {
                ws,
                nbytes,
                copies,
                x,
                mut y,
                mut s,
            } = timing_setup(&dev, ty, rows, cols, 8);
            let mut mv1 = 0.0;
            for &n in &counts {
                let q1 = time_us(&dev, 1, 40, |_| {
                    dev.quantize_for_matvec(&x, n, cols, &mut s)
                })
                .expect("q8_1 timing");
                let mv = time_us(&dev, copies, 40, |i| {
                    dev.matvec_prequantized(&ws[i], &s, &mut y)
                })
                .expect("matvec timing");
                if n == 1 {
                    mv1 = mv;
                }
                // (IQ4_XS has no q8_1 tensor-core kernel)
                let mm = if cuda::mmv::supports(ty, n) {
                    time_us(&dev, copies, 40, |i| {
                        dev.mmv_prequantized(&ws[i], &s, &mut y)
                    })
                    .expect("mmv timing")
                } else {
                    f64::NAN
                };
                let qk = time_us(&dev, 1, 40, |_| dev.quantize_q8_k(&x, n, cols, &mut s))
                    .expect("q8_K timing");
                // a launch the driver refuses (a variant's shared memory, say) times as NaN
                let mut time2 = || {
                    time_us(&dev, copies, 40, |i| {
                        dev.mmv2_prequantized(&ws[i], &s, &mut y)
                    })
                    .unwrap_or_else(|e| {
                        eprintln!("mmv2 {} {rows}x{cols} n={n}: {e}", ty.name());
                        f64::NAN
                    })
                };
                let m2 = time2();
                // warps x load mode
                let mut best = (m2, "defaults".to_string());
                let warps: &[u32] = &[2, 3, 4, 5, 8];
                let mut line = format!("{} {rows}x{cols} n={n}:", ty.name());
                for &w in warps {
                    for mode in [0u32, 2] {
                        cuda::mmv::set_warps_override(w);
                        cuda::mmv::set_load_mode_override(Some(mode));
                        let us = time2();
                        line += &format!(" w{w}m{mode} {us:.1}");
                        if us < best.0 {
                            best = (us, format!("w{w} m{mode}"));
                        }
                    }
                }
                // Q4_K: the staged kernels (cp.async, 2..4 stages) at every warp count
                if ty == GgmlType::Q4K {
                    let stage_set: &[u32] = &[2, 3, 4];
                    for &stages in stage_set {
                        cuda::mmv::set_mmv2_stages(Some(stages));
                        // at 2 and 3 stages also with x staged (the "x" rows)
                        let xs_set: &[bool] = if stages <= 3 {
                            &[false, true]
                        } else {
                            &[false]
                        };
                        for &xs in xs_set {
                            cuda::mmv::set_mmv2_xs(Some(xs));
                            for carve in [None, Some(50u32)] {
                                cuda::mmv::set_mmv2_carveout(Some(carve));
                                for &w in warps {
                                    cuda::mmv::set_warps_override(w);
                                    let us = time2();
                                    let c = carve.map_or(String::new(), |c| format!("c{c}"))
                                        + if xs { "x" } else { "" };
                                    line += &format!(" s{stages}{c}w{w} {us:.1}");
                                    if us < best.0 {
                                        best = (us, format!("s{stages}{c} w{w}"));
                                    }
                                }
                            }
                        }
                    }
                    cuda::mmv::set_mmv2_carveout(None);
                    cuda::mmv::set_mmv2_xs(None);
                    cuda::mmv::set_warps_override(0);
                    // the K split (launches under 600 tiles), two stages, default warps
                    for ks in [2u32, 3] {
                        cuda::mmv::set_mmv2_stages(Some(2));
                        cuda::mmv::set_mmv2_ksplit(Some(ks));
                        let us = time2();
                        line += &format!(" s2k{ks} {us:.1}");
                        if us < best.0 {
                            best = (us, format!("s2 ks{ks}"));
                        }
                    }
                    cuda::mmv::set_mmv2_ksplit(None);
                    cuda::mmv::set_mmv2_stages(None);
                }
                sweeps.push(line);
                cuda::mmv::set_warps_override(0);
                cuda::mmv::set_load_mode_override(None);
                println!(
                    "{:>5} {:>12} {:>2} {:>7.1} {:>7.1} {:>7.1} {:>6.2} {:>6.2} {:>8.0} {:>6.1} {:>6.1}  {:.1} ({})",
                    ty.name(),
                    format!("{rows}x{cols}"),
                    n,
                    mv,
                    mm,
                    m2,
                    m2 / mv1,
                    mv / mv1,
                    nbytes as f64 / (m2 * 1e3),
                    q1,
                    qk,
                    best.0,
                    best.1
                );
            }
        }
    }
    cuda::matvec::set_q8_1_tiled(None);
    println!("mmv2 sweep (µs):");
    for l in sweeps {
        println!("{l}");
    }
}

/// 9..32 tokens: mmq (x quantized q8_1 in the launch) against the mmv2 n-tile kernels (x
/// quantized q8_K first, timed apart), µs a launch with the weights cycled past L2, and the
/// weight stream in GB/s; "w" = warps of the default kernel, "r" = Q4_K's register-fragment
/// kernel (stages 0) at those warps. `MMV2N_SHAPES=q4` / `q6` narrows it for a short window.
#[test]
#[ignore = "timing on a real card: cargo test -p cuda --test gpu_mmq -- --ignored --nocapture"]
fn mmv2n_timing_vs_mmq() {
    let Some(dev) = device() else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    dev.module(cuda::Program::Mmv).expect("mmv kernels compile");
    dev.module(cuda::Program::Mmq).expect("mmq kernels compile");
    // the 32B's gate/up, down (Q4_K and Q6_K), o / the square, and the output head
    let shapes = [
        (GgmlType::Q4K, 34816usize, 5120usize),
        (GgmlType::Q4K, 5120, 27648),
        (GgmlType::Q4K, 5120, 5120),
        (GgmlType::Q6K, 5120, 27648),
        (GgmlType::Q6K, 152064, 5120),
    ];
    let only = std::env::var("MMV2N_SHAPES").unwrap_or_default();
    println!(
        "{:>5} {:>12} {:>3} {:>8} {:>8} {:>8} {:>8}  mmv2 by warps (µs)",
        "type", "shape", "n", "mmq", "mmv2", "GB/s", "q8_K"
    );
    for (ty, rows, cols) in shapes {
        let tag = if ty == GgmlType::Q4K { "q4" } else { "q6" };
        if !only.is_empty() && only != tag {
            continue;
        }
        let TimingSetup {
            ws,
            nbytes,
            copies,
            x,
            mut y,
            mut s,
        } = timing_setup(&dev, ty, rows, cols, 32);
        for n in [8usize, 16, 24, 32] {
            let mq = if n > 8 {
                time_us(&dev, copies, 20, |i| dev.mmq(&ws[i], &x, n, &mut y, &mut s))
                    .unwrap_or(f64::NAN)
            } else {
                f64::NAN
            };
            let qk = time_us(&dev, 1, 20, |_| dev.quantize_q8_k(&x, n, cols, &mut s))
                .expect("q8_K timing");
            let mut time2 = |warps: u32| {
                cuda::mmv::set_warps_override(warps);
                let us = time_us(&dev, copies, 20, |i| {
                    dev.mmv2_prequantized(&ws[i], &s, &mut y)
                })
                .unwrap_or_else(|e| {
                    eprintln!("mmv2 {} {rows}x{cols} n={n} w{warps}: {e}", ty.name());
                    f64::NAN
                });
                cuda::mmv::set_warps_override(0);
                us
            };
            let m2 = time2(0);
            let mut sweep: Vec<String> = [2u32, 3, 4, 6, 8]
                .iter()
                .map(|&w| format!("w{w} {:.1}", time2(w)))
                .collect();
            if ty == GgmlType::Q4K {
                // the register-fragment kernel (no shared memory for weights: more L1 for x)
                cuda::mmv::set_mmv2_stages(Some(0));
                sweep.extend(
                    [0u32, 3, 4, 8]
                        .iter()
                        .map(|&w| format!("r{w} {:.1}", time2(w))),
                );
                cuda::mmv::set_mmv2_stages(None);
            }
            println!(
                "{:>5} {:>12} {n:>3} {mq:>8.1} {m2:>8.1} {:>8.0} {qk:>8.1}  {}",
                ty.name(),
                format!("{rows}x{cols}"),
                nbytes as f64 / m2 / 1e3,
                sweep.join(" ")
            );
        }
    }
}

/// What a timing sweep of one shape needs: copies of a random matrix (>= 400 MB together: L2,
/// 50 MB on the H200, cannot hold them; `nbytes` each), x of `n` random tokens, y and scratch.
struct TimingSetup {
    ws: Vec<cuda::DeviceMatrix>,
    nbytes: usize,
    copies: usize,
    x: cuda::CudaSlice<f32>,
    y: cuda::CudaSlice<f32>,
    s: cuda::MatvecScratch,
}

fn timing_setup(dev: &CudaDevice, ty: GgmlType, rows: usize, cols: usize, n: usize) -> TimingSetup {
    let bytes = random_matrix(ty, rows, cols, 99);
    let nbytes = bytes.len();
    let copies = (400_000_000 / nbytes).clamp(2, 16);
    let ws = (0..copies)
        .map(|_| dev.upload_matrix(ty, rows, cols, &bytes).expect("upload"))
        .collect();
    let x = dev
        .stream()
        .clone_htod(&random_activations(n * cols, 5))
        .expect("x");
    TimingSetup {
        ws,
        nbytes,
        copies,
        x,
        y: dev.stream().alloc_zeros::<f32>(n * rows).expect("y"),
        s: dev.matvec_scratch(n, cols).expect("scratch"),
    }
}
