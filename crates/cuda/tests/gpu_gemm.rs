//! The prefill GEMM path (crate::gemm: dequantize to f16 + cuBLAS) against the CPU reference,
//! for every weight format, odd token and row counts; the fixture models with every matmul
//! forced through it; and (ignored, release build) the 32B-shape benchmarks.
//! Skipped (with a message) when no CUDA device or no cuBLAS is present.
//!
//! Tolerances. The reference is `quant::dequantize_row` (f32) and an f64 dot with the f32 x.
//! The GPU rounds each weight and each scaled activation to f16 (round to nearest: relative
//! error <= u = 2^-11 each; the power-of-two scale of x is exact), so a product is off by at
//! most (2u + u^2)|w x|, and the f32 accumulation adds at most k * 2^-24 * sum|w x| (<= u for
//! k <= 8192, worst case). Hence |err| <= 3u * sum|w x| per output, a rigorous bound; and since
//! the roundings are independent, the relative L2 error of a whole output is ~u (checked at
//! <= 1e-3, 2x margin). F32 weights take a plain SGEMM: |err| <= k * 2^-24 * sum|w x|.
//! The dequantization itself is exact up to the final f16 rounding, checked bit for bit.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cuda::synthetic::{random_activations, random_matrix};
use cuda::{open_or_cpu, CudaDevice, CudaOptions};
use gguf::GgmlType;

const U: f64 = 1.0 / 2048.0; // f16 unit roundoff

fn device() -> Option<CudaDevice> {
    let dev = open_or_cpu(&CudaOptions::default())?;
    match dev.gemm_backend() {
        Ok(v) => {
            eprintln!("cuBLAS {v}");
            Some(dev)
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn dequantized(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let rb = bytes.len() / rows;
    let mut w = vec![0f32; rows * cols];
    for r in 0..rows {
        quant::dequantize_row(
            ty,
            &bytes[r * rb..(r + 1) * rb],
            &mut w[r * cols..(r + 1) * cols],
        )
        .unwrap();
    }
    w
}

/// f16 bits -> f32 (every f16 value is exact in f32).
fn f16_value(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f32;
    sign * if e == 0 {
        m * (2f32).powi(-24)
    } else {
        (1.0 + m / 1024.0) * (2f32).powi(e - 15)
    }
}

struct Case {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    tokens: usize,
    x_scale: f32,
}

fn check(dev: &CudaDevice, c: &Case, seed: u64) -> Result<(), String> {
    let wb = random_matrix(c.ty, c.rows, c.cols, seed);
    let mut x = random_activations(c.tokens * c.cols, seed ^ 0x5eed);
    for v in &mut x {
        *v *= c.x_scale;
    }
    let wf = dequantized(c.ty, &wb, c.rows, c.cols);
    let s = dev.stream();
    let w = dev
        .upload_matrix(c.ty, c.rows, c.cols, &wb)
        .map_err(|e| e.to_string())?;
    let xd = s.clone_htod(&x).map_err(|e| e.to_string())?;
    let mut y = s
        .clone_htod(&vec![f32::NAN; c.tokens * c.rows])
        .map_err(|e| e.to_string())?;
    dev.matmul_gemm(&w, &xd, c.tokens, &mut y)
        .map_err(|e| e.to_string())?;
    let y = s.clone_dtoh(&y).map_err(|e| e.to_string())?;

    // The dequantization alone, bit for bit against f16(reference).
    if !matches!(c.ty, GgmlType::F16 | GgmlType::F32) {
        let mut h = s
            .alloc_zeros::<u16>(c.rows * c.cols)
            .map_err(|e| e.to_string())?;
        dev.dequantize_to_f16(&w, &mut h)
            .map_err(|e| e.to_string())?;
        let h = s.clone_dtoh(&h).map_err(|e| e.to_string())?;
        for (i, (&got, &want)) in h.iter().zip(&wf).enumerate() {
            // Rounding to f16 is off by at most half a unit (2^-11 relative, 2^-25 absolute
            // below the normal range); fma contraction on the device may move the f32 value by
            // one f32 unit first, so the bound is padded slightly.
            let got = f16_value(got);
            let tol = want.abs() as f64 * (U + 1e-6) + 2f64.powi(-25);
            if ((got - want) as f64).abs() > tol {
                return Err(format!(
                    "{} dequantize: element {i} (row {}, col {}) = {got}, want {want}",
                    c.ty.name(),
                    i / c.cols,
                    i % c.cols
                ));
            }
        }
    }

    let f32_path = c.ty == GgmlType::F32;
    let (mut se, mut sr, mut worst) = (0f64, 0f64, 0f64);
    for t in 0..c.tokens {
        let xt = &x[t * c.cols..(t + 1) * c.cols];
        for r in 0..c.rows {
            let wr = &wf[r * c.cols..(r + 1) * c.cols];
            let (mut want, mut mag) = (0f64, 0f64);
            for i in 0..c.cols {
                let p = wr[i] as f64 * xt[i] as f64;
                want += p;
                mag += p.abs();
            }
            let got = y[t * c.rows + r] as f64;
            let tol = if f32_path {
                c.cols as f64 * f32::EPSILON as f64 * 0.5 * mag
            } else {
                3.0 * U * mag
            } + 1e-30;
            let err = (got - want).abs();
            if err.is_nan() || err > tol {
                return Err(format!(
                    "{} {}x{} n={} x*{}: y[{t},{r}] = {got}, reference {want} (err {err:.3e} > tol {tol:.3e})",
                    c.ty.name(), c.rows, c.cols, c.tokens, c.x_scale
                ));
            }
            se += err * err;
            sr += want * want;
            worst = worst.max(err / mag.max(1e-300));
        }
    }
    let rel = (se / sr.max(1e-300)).sqrt();
    let rel_tol = if f32_path { 1e-5 } else { 2.0 * U };
    if rel > rel_tol {
        return Err(format!(
            "{} {}x{} n={}: relative L2 error {rel:.3e} > {rel_tol:.1e}",
            c.ty.name(),
            c.rows,
            c.cols,
            c.tokens
        ));
    }
    eprintln!(
        "ok {:>7} {:>4}x{:<5} n={:<3} x*{:<8} rel L2 {rel:.2e}, max err/sum|wx| {worst:.2e}",
        c.ty.name(),
        c.rows,
        c.cols,
        c.tokens,
        c.x_scale
    );
    Ok(())
}

const ALL_TYPES: [GgmlType; 15] = {
    use GgmlType::*;
    [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q5K, Q6K, F16, BF16, F32,
    ]
};

#[test]
fn gemm_matches_cpu_reference_for_every_format() {
    let Some(dev) = device() else { return };
    let mut failures = Vec::new();
    for (i, ty) in ALL_TYPES.into_iter().enumerate() {
        for (j, &(rows, cols, tokens)) in
            [(67, 256, 17), (129, 512, 33), (300, 1024, 5), (1, 256, 64)]
                .iter()
                .enumerate()
        {
            let c = Case {
                ty,
                rows,
                cols,
                tokens,
                x_scale: 1.0,
            };
            if let Err(e) = check(&dev, &c, (i * 16 + j) as u64 + 1) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Activations far outside f16's range (and far below its normal range) come out right: the
/// power-of-two scaling of x, undone by alpha.
#[test]
fn gemm_scales_activations_beyond_f16_range() {
    let Some(dev) = device() else { return };
    for (ty, x_scale) in [
        (GgmlType::Q4K, 3.0e4), // outliers * 8 = 2.4e5 > 65504
        (GgmlType::Q8_0, 1.0e6),
        (GgmlType::F16, 2.0e4),
        (GgmlType::Q6K, 1.0e-7), // all below f16's normal range
    ] {
        let c = Case {
            ty,
            rows: 96,
            cols: 512,
            tokens: 19,
            x_scale,
        };
        check(&dev, &c, 99).unwrap();
    }
}

/// Below the threshold `try_matmul_gemm` declines (the caller's matvec runs); at it, it runs.
#[test]
fn threshold_selects_the_path() {
    let Some(dev) = device() else { return };
    let ty = GgmlType::Q4_0;
    let wb = random_matrix(ty, 64, 256, 5);
    let w = dev.upload_matrix(ty, 64, 256, &wb).unwrap();
    let x = dev
        .stream()
        .clone_htod(&random_activations(40 * 256, 6))
        .unwrap();
    let mut y = dev.stream().alloc_zeros::<f32>(40 * 64).unwrap();
    dev.set_gemm_min_tokens(32);
    assert!(!dev.try_matmul_gemm(&w, &x, 31, &mut y).unwrap());
    assert!(dev.try_matmul_gemm(&w, &x, 32, &mut y).unwrap());
    // An F32 matrix 40 wide (not a multiple of 32) stays on the matvec instead of failing.
    let wf = random_matrix(GgmlType::F32, 64, 40, 7);
    let wf = dev.upload_matrix(GgmlType::F32, 64, 40, &wf).unwrap();
    assert!(!dev.try_matmul_gemm(&wf, &x, 32, &mut y).unwrap());
    dev.set_gemm_min_tokens(cuda::gemm::DEFAULT_GEMM_MIN_TOKENS);
}

// ---- whole models ------------------------------------------------------------------------

fn fixture(arch: &str, file: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/fixtures"
    ))
    .join(arch)
    .join(file)
}

#[path = "../../../tests/support/fixture_reference.rs"]
mod fixture_reference;
use fixture_reference::{argmax, reference, rel_l2};

fn load(path: &PathBuf) -> model::ModelOn<cuda::backend::CudaBackend> {
    let dev = CudaDevice::open(&CudaOptions::default()).unwrap();
    let b = cuda::backend::CudaBackend::from_device(dev);
    let file = gguf::GgufFile::open(path).unwrap();
    let opts = model::LoadOptions {
        n_threads: 2,
        ubatch_size: 512,
    };
    model::ModelOn::load_on(b, Arc::new(file), &opts).unwrap()
}

/// Every fixture with every matmul forced through the GEMM path (threshold 1; recorded decode
/// steps keep the matvec, see backend/dense.rs): the f32 models (exact SGEMM) still meet
/// transformers' logits at 1e-3 relative L2 and its greedy tokens; the q8_0 models meet the
/// rule of the q8_0 fixture tests (backend_models.rs): top-1 equal to transformers' wherever
/// its top-2 margin is >= 0.05, logits within 0.25 relative L2. The gap to the matvec path
/// (whose x is quantized to q8_1, ~100x coarser than f16) is printed with both paths' errors.
#[test]
fn fixture_models_through_gemm() {
    if device().is_none() {
        return;
    }
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        let r = reference(arch);
        let m = load(&fixture(arch, "model-f32.gguf"));
        m.backend().device().set_gemm_min_tokens(1);
        let n_vocab = m.config().n_vocab;
        let mut s = m.new_state(64, model::KvType::F32).unwrap();
        let logits = m.forward(&mut s, &r.prompt_ids, true).unwrap();
        let mut worst = 0f64;
        for (p, want) in r.logits.iter().enumerate() {
            let e = rel_l2(&logits[p * n_vocab..(p + 1) * n_vocab], want);
            worst = worst.max(e);
            assert!(
                e <= 1e-3,
                "{arch} f32 via GEMM: position {p}: rel L2 {e:.3e}"
            );
        }
        let mut next = argmax(&logits[(r.prompt_ids.len() - 1) * n_vocab..]);
        let mut got = vec![next];
        while got.len() < r.greedy_ids.len() {
            next = argmax(&m.forward(&mut s, &[next], false).unwrap());
            got.push(next);
        }
        assert_eq!(got, r.greedy_ids, "{arch} f32 via GEMM: greedy tokens");

        let m = load(&fixture(arch, "model-q8_0.gguf"));
        let dev = m.backend().device();
        let run = |min_tokens: usize| {
            dev.set_gemm_min_tokens(min_tokens);
            let mut s = m.new_state(64, model::KvType::F32).unwrap();
            m.forward(&mut s, &r.prompt_ids, true).unwrap()
        };
        let (via_gemm, via_matvec) = (run(1), run(usize::MAX));
        let (mut gap, mut err_gemm, mut err_matvec) = (0f64, 0f64, 0f64);
        for (p, want) in r.logits.iter().enumerate() {
            let row = &via_gemm[p * n_vocab..(p + 1) * n_vocab];
            let row_mv = &via_matvec[p * n_vocab..(p + 1) * n_vocab];
            let want32: Vec<f32> = want.iter().map(|&x| x as f32).collect();
            let mut sorted = want32.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let margin = sorted[0] - sorted[1];
            assert!(
                argmax(row) == argmax(&want32) || margin < 0.05,
                "{arch} q8_0 via GEMM: top-1 differs at position {p} (reference margin {margin})"
            );
            let e = rel_l2(row, want);
            assert!(e < 0.25, "{arch} q8_0 via GEMM: position {p}: rel L2 {e}");
            err_gemm = err_gemm.max(e);
            err_matvec = err_matvec.max(rel_l2(row_mv, want));
            let mv64: Vec<f64> = row_mv.iter().map(|&v| v as f64).collect();
            gap = gap.max(rel_l2(row, &mv64));
        }
        println!(
            "{arch}: f32 via GEMM worst rel L2 {worst:.2e} vs transformers, greedy equal; q8_0 \
             worst rel L2 vs transformers: GEMM {err_gemm:.3e}, matvec {err_matvec:.3e}; \
             GEMM vs matvec {gap:.2e}"
        );
    }
}

// ---- benchmarks (release build; `--ignored --nocapture`) -------------------------------------

fn time_it(dev: &CudaDevice, iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    dev.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    dev.synchronize().unwrap();
    t.elapsed().as_secs_f64() / iters as f64
}

/// Qwen2.5-32B matrices at n = 512: dequantization GB/s (bytes read + f16 written), the GEMM
/// alone (F16 weights) in TFLOP/s, the whole Q4_K/Q6_K path; then matvec vs GEMM at small n
/// (the threshold).
#[test]
#[ignore = "benchmark: needs a CUDA device, run in release"]
fn gemm_bench_32b_shapes() {
    let Some(dev) = device() else { return };
    let s = dev.stream();
    let n = 512;
    println!("| matrix | type | n | dequant µs | dequant GB/s | GEMM µs (f16 W) | GEMM TFLOP/s | total µs | total TFLOP/s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, rows, cols, ty) in [
        ("attn_q/o", 5120, 5120, GgmlType::Q4K),
        ("attn_k/v", 1024, 5120, GgmlType::Q4K),
        ("attn_v", 1024, 5120, GgmlType::Q6K),
        ("ffn_gate/up", 27648, 5120, GgmlType::Q4K),
        ("ffn_down", 5120, 27648, GgmlType::Q4K),
        ("ffn_down", 5120, 27648, GgmlType::Q6K),
        ("ffn_gate/up", 27648, 5120, GgmlType::Q4_0),
        ("ffn_gate/up", 27648, 5120, GgmlType::IQ4XS),
        ("ffn_gate/up", 27648, 5120, GgmlType::Q8_0),
    ] {
        let w = dev
            .upload_matrix(ty, rows, cols, &random_matrix(ty, rows, cols, 1))
            .unwrap();
        let wh = dev
            .upload_matrix(
                GgmlType::F16,
                rows,
                cols,
                &random_matrix(GgmlType::F16, rows, cols, 2),
            )
            .unwrap();
        let x = s.clone_htod(&random_activations(n * cols, 3)).unwrap();
        let mut y = s.alloc_zeros::<f32>(n * rows).unwrap();
        let mut h = s.alloc_zeros::<u16>(rows * cols).unwrap();
        let t_dq = time_it(&dev, 10, || dev.dequantize_to_f16(&w, &mut h).unwrap());
        let t_f16 = time_it(&dev, 10, || dev.matmul_gemm(&wh, &x, n, &mut y).unwrap());
        let t_all = time_it(&dev, 10, || dev.matmul_gemm(&w, &x, n, &mut y).unwrap());
        let flop = 2.0 * (rows * cols * n) as f64;
        let bytes = (w.weight_bytes() + rows * cols * 2) as f64;
        println!(
            "| {name} {rows}x{cols} | {} | {n} | {:.1} | {:.0} | {:.1} | {:.0} | {:.1} | {:.0} |",
            ty.name(),
            t_dq * 1e6,
            bytes / t_dq / 1e9,
            t_f16 * 1e6,
            flop / t_f16 / 1e12,
            t_all * 1e6,
            flop / t_all / 1e12
        );
    }
    println!("\nthreshold: matvec vs GEMM, µs");
    println!("| matrix | type | n | matvec µs | GEMM µs |");
    println!("|---|---|---|---|---|");
    for (rows, cols, ty) in [
        (5120, 5120, GgmlType::Q4K),
        (27648, 5120, GgmlType::Q4K),
        (5120, 27648, GgmlType::Q6K),
    ] {
        let w = dev
            .upload_matrix(ty, rows, cols, &random_matrix(ty, rows, cols, 1))
            .unwrap();
        for n in [8, 12, 16, 24, 32, 64] {
            let x = s.clone_htod(&random_activations(n * cols, 3)).unwrap();
            let mut y = s.alloc_zeros::<f32>(n * rows).unwrap();
            let mut scratch = dev.matvec_scratch(n, cols).unwrap();
            let t_mv = time_it(&dev, 10, || {
                dev.matvec(&w, &x, n, &mut y, &mut scratch).unwrap()
            });
            let t_g = time_it(&dev, 10, || dev.matmul_gemm(&w, &x, n, &mut y).unwrap());
            println!(
                "| {rows}x{cols} | {} | {n} | {:.1} | {:.1} |",
                ty.name(),
                t_mv * 1e6,
                t_g * 1e6
            );
        }
    }
}

/// pp512 of a Qwen2.5-32B-shaped Q4_K_M model (random weights, `model::synth`), through the
/// whole model on the GPU. Built with 2 and 6 layers (a 64-layer file is 19 GB): the per-layer
/// time is the difference, and the full model's pp512 is projected as
/// 512 / (t(2) + 62 * per-layer), every non-layer cost (embedding, head) counted once.
#[test]
#[ignore = "benchmark: needs a CUDA device, run in release"]
fn prefill_bench_32b_q4_k_m() {
    if device().is_none() {
        return;
    }
    let n = 512;
    let mut times = Vec::new();
    for layers in [2usize, 6] {
        let mut shape = model::synth::Shape::preset("qwen2.5-32b").unwrap();
        shape.n_layer = layers;
        let ftype = model::synth::FileType::from_name("Q4_K_M").unwrap();
        let plan = model::synth::SynthPlan::new(shape, ftype);
        let mut bytes = Vec::with_capacity(plan.data_bytes() as usize + (64 << 20));
        plan.write(&mut bytes, 0, |_| {}).unwrap();
        let file = gguf::GgufFile::from_bytes(bytes).unwrap();
        let dev = CudaDevice::open(&CudaOptions::default()).unwrap();
        let b = cuda::backend::CudaBackend::from_device(dev);
        let opts = model::LoadOptions {
            n_threads: 8,
            ubatch_size: n,
        };
        let m = model::ModelOn::load_on(b, Arc::new(file), &opts).unwrap();
        // n/2 first: per-layer time growing ~linearly with n is the matmuls, ~quadratically
        // the attention.
        for len in [n / 2, n] {
            let tokens: Vec<u32> = (0..len as u32).map(|i| (i * 7919) % 150000).collect();
            let mut runs = Vec::new();
            for i in 0..4 {
                let mut st = m.new_state(n + 16, model::KvType::F16).unwrap();
                let t = Instant::now();
                m.forward(&mut st, &tokens, false).unwrap();
                if i > 0 {
                    runs.push(t.elapsed().as_secs_f64()); // the first run compiles and allocates
                }
            }
            let mean = runs.iter().sum::<f64>() / runs.len() as f64;
            println!(
                "{layers} layers: pp{len} {:.1} ms ({:.0} tok/s), runs {:?} ms",
                mean * 1e3,
                len as f64 / mean,
                runs.iter()
                    .map(|t| (t * 1e4).round() / 10.0)
                    .collect::<Vec<_>>()
            );
            times.push(mean);
        }
    }
    // times: [2 layers n/2, 2 layers n, 6 layers n/2, 6 layers n]
    let half_per_layer = (times[2] - times[0]) / 4.0;
    println!("per layer at pp{}: {:.3} ms", n / 2, half_per_layer * 1e3);
    let times = [times[1], times[3]];
    let per_layer = (times[1] - times[0]) / 4.0;
    let full = times[0] + 62.0 * per_layer;
    println!(
        "per layer {:.3} ms; projected 64-layer Qwen2.5-32B Q4_K_M pp{n}: {:.1} ms = {:.0} tok/s",
        per_layer * 1e3,
        full * 1e3,
        n as f64 / full
    );
}
