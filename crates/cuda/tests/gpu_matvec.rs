//! GPU matvec against the CPU reference (`quant::dequantize_row` + f64 dot) on random inputs of
//! several shapes, odd ones included, for every weight format and batch sizes 1..11.
//! Skipped (with a message) when no CUDA device is present.
//!
//! Two checks per output:
//! 1. exact pipeline: x quantized to q8_1 on the CPU exactly as the kernel does (d = amax/127,
//!    round half to even), then dot(dequantized w, d*q) in f64. The kernel must agree to f32
//!    rounding: |err| <= 2e-5 * sum|w*xq| (+ a tiny absolute term). This catches any decode bug.
//! 2. end to end vs the unquantized x: |err| <= the worst-case q8_1 rounding bound
//!    sum_i |w_i| * d_block(i) / 2 (+ the same f32 term).

mod timing;

use cuda::synthetic::{random_activations, random_matrix};
use cuda::{open_or_cpu, CudaOptions};
use gguf::GgmlType;
use timing::time_us;

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

struct Case {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    tokens: usize,
}

fn check(dev: &cuda::CudaDevice, c: &Case, seed: u64) -> Result<(), String> {
    let quantized = !matches!(c.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let wbytes = random_matrix(c.ty, c.rows, c.cols, seed);
    let x = random_activations(c.tokens * c.cols, seed ^ 0xabc);
    let row_bytes = wbytes.len() / c.rows;
    let mut wf = vec![0f32; c.rows * c.cols];
    for r in 0..c.rows {
        quant::dequantize_row(
            c.ty,
            &wbytes[r * row_bytes..(r + 1) * row_bytes],
            &mut wf[r * c.cols..(r + 1) * c.cols],
        )
        .map_err(|e| e.to_string())?;
    }

    let w = dev
        .upload_matrix(c.ty, c.rows, c.cols, &wbytes)
        .map_err(|e| e.to_string())?;
    let xd = dev.stream().clone_htod(&x).map_err(|e| e.to_string())?;
    let mut y = dev
        .stream()
        .clone_htod(&vec![f32::NAN; c.tokens * c.rows])
        .map_err(|e| e.to_string())?;
    let mut scratch = dev
        .matvec_scratch(c.tokens, c.cols)
        .map_err(|e| e.to_string())?;
    dev.matvec(&w, &xd, c.tokens, &mut y, &mut scratch)
        .map_err(|e| e.to_string())?;
    let y = dev.stream().clone_dtoh(&y).map_err(|e| e.to_string())?;

    let mut worst = 0f64;
    for t in 0..c.tokens {
        let xt = &x[t * c.cols..(t + 1) * c.cols];
        let xq = if quantized {
            q8_1_reference(xt)
        } else {
            xt.to_vec()
        };
        for r in 0..c.rows {
            let wr = &wf[r * c.cols..(r + 1) * c.cols];
            let (mut exact, mut mag, mut full, mut bound) = (0f64, 0f64, 0f64, 0f64);
            for i in 0..c.cols {
                exact += wr[i] as f64 * xq[i] as f64;
                mag += (wr[i] as f64 * xq[i] as f64).abs();
                full += wr[i] as f64 * xt[i] as f64;
                bound += (wr[i] as f64).abs() * (xt[i] as f64 - xq[i] as f64).abs();
            }
            let got = y[t * c.rows + r] as f64;
            let tol = 2e-5 * mag + 1e-6;
            let err = (got - exact).abs();
            if err.is_nan() || err > tol {
                return Err(format!(
                    "{} {}x{} tokens {} : y[{t},{r}] = {got}, exact-q8_1 reference {exact} (err {err:.3e} > tol {tol:.3e})",
                    c.ty.name(), c.rows, c.cols, c.tokens
                ));
            }
            if (got - full).abs() > bound * 1.0001 + tol {
                return Err(format!(
                    "{} {}x{}: y[{t},{r}] = {got} vs f64 {full}: err beyond the q8_1 bound {bound:.3e}",
                    c.ty.name(), c.rows, c.cols
                ));
            }
            worst = worst.max(err / mag.max(1e-30));
        }
    }
    eprintln!(
        "ok {:>7} {:>4}x{:<5} n={:<2} max rel err {:.2e}",
        c.ty.name(),
        c.rows,
        c.cols,
        c.tokens,
        worst
    );
    Ok(())
}

#[test]
fn matvec_matches_cpu_reference_for_every_format() {
    let Some(dev) = open_or_cpu(&CudaOptions::default()) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    use GgmlType::*;
    let types = [
        Q4K, Q6K, Q4_0, Q8_0, IQ4XS, Q5K, Q4_1, Q5_0, Q5_1, IQ4NL, Q2K, Q3K, F32, F16, BF16,
    ];
    // compile (or load from the disk cache) up front, timed, so a slow first compile is told
    // apart from a slow or stuck kernel
    let t = std::time::Instant::now();
    for p in [cuda::Program::MatvecQuant, cuda::Program::MatvecFloat] {
        dev.module(p).expect("matvec kernels compile");
    }
    eprintln!("matvec kernels ready in {:.1} s", t.elapsed().as_secs_f64());
    let mut failures = Vec::new();
    let mut seed = 1u64;
    for ty in types {
        eprintln!("checking {}", ty.name());
        let bs = ty.block_size();
        // odd row counts (not multiples of the 4 rows per block), 1 block, odd block counts,
        // groups not filling the 32 lanes, and a long row; F32/F16/BF16 also get an odd column
        // count that takes the scalar path.
        let mut shapes = vec![
            (1, bs),
            (37, 3 * bs),
            (64, 9 * bs),
            (129, 4096 / bs * bs + 5 * bs),
        ];
        if bs == 1 {
            shapes.push((5, 7));
            shapes.push((9, 1000));
        } else {
            shapes.push((3, 33 * bs));
            // many groups per row (ksplit strides, partial last group), and a taller matrix
            // whose row sets end mid-block
            shapes.push((7, 77 * bs));
            shapes.push((523, 10 * bs));
            // rows of a multiple of 512 values: the tiled q8_1 layout at 1-2 tokens
            shapes.push((45, 4608));
        }
        for &(rows, cols) in &shapes {
            for tokens in [1, 2, 3, 8, 11] {
                // every rows-per-warp kernel, and the per-shape choice (0)
                let quantized = cuda::matvec::quantizes_activations(ty);
                let rpws: &[u32] = if quantized { &[0, 2, 4] } else { &[0] };
                for &rpw in rpws {
                    seed += 1;
                    // cycle the weight-load cache policies and the warps per row set (1, 2,
                    // 4) independently: every shape sees each
                    dev.set_matvec_load_mode((seed % 3) as i32);
                    // the tiled q8_1 layout on every other case (it applies to 1-2 tokens
                    // of rows of a multiple of 512 values)
                    cuda::matvec::set_q8_1_tiled(Some(seed.is_multiple_of(2)));
                    let ks = [1, 2, 4][(seed / 3 % 3) as usize];
                    cuda::matvec::set_rows_per_warp_override(rpw);
                    cuda::matvec::set_ksplit_override(ks);
                    if let Err(e) = check(
                        &dev,
                        &Case {
                            ty,
                            rows,
                            cols,
                            tokens,
                        },
                        seed,
                    ) {
                        failures.push(format!(
                            "{e} (rows/warp {rpw}, ksplit {ks}, tiled q8_1 {})",
                            cuda::matvec::q8_1_tiled(tokens, cols)
                        ));
                    }
                }
            }
        }
    }
    cuda::matvec::set_rows_per_warp_override(0);
    cuda::matvec::set_ksplit_override(0);
    cuda::matvec::set_q8_1_tiled(None);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Segment i's extras in the segment checks: its old output (`nt * r` values; accumulated into
/// when i % 3 == 1, else only the buffer's size), its bias (even i) and the accumulate flag.
fn seg_extras(i: usize, r: usize, nt: usize, seed: u64) -> (Vec<f32>, Option<Vec<f32>>, bool) {
    let y0 = random_activations(nt * r, seed ^ (i as u64 + 99));
    let bias = i
        .is_multiple_of(2)
        .then(|| random_activations(r, seed ^ 0x5eed));
    (y0, bias, i % 3 == 1)
}

/// The segment list of one launch: matrix i writes `ys[i]` with bias `biases[i]`, accumulating
/// where `accs[i]`.
fn seg_list<'a>(
    dev: &cuda::CudaDevice,
    mats: &'a [cuda::matvec::DeviceMatrix],
    ys: &[cudarc::driver::CudaSlice<f32>],
    biases: &[Option<cudarc::driver::CudaSlice<f32>>],
    accs: &[bool],
) -> Vec<cuda::matvec::Segment<'a>> {
    mats.iter()
        .enumerate()
        .map(|(i, w)| cuda::matvec::Segment {
            w,
            y: dev.device_address(&ys[i]),
            bias: biases[i].as_ref().map(|b| dev.device_address(b)),
            accumulate: accs[i],
        })
        .collect()
}

/// One `matvec_segments` launch over matrices of `rows` rows checked against the per-matrix
/// matvec of the same quantized x (the same per-row kernel code, so bit for bit), plus its
/// bias, plus the old output where it accumulates; failures are pushed as messages.
#[allow(clippy::too_many_arguments)]
fn check_segments(
    dev: &cuda::CudaDevice,
    ty: GgmlType,
    rows: &[usize],
    cols: usize,
    rpw: u32,
    nt: usize,
    seed: u64,
    what: &str,
    failures: &mut Vec<String>,
) {
    let up = |v: &[f32]| dev.stream().clone_htod(v).unwrap();
    cuda::matvec::set_rows_per_warp_override(rpw);
    let x = random_activations(nt * cols, seed);
    let xd = up(&x);
    let mut scratch = dev.matvec_scratch(nt, cols).unwrap();
    dev.quantize_for_matvec(&xd, nt, cols, &mut scratch)
        .unwrap();
    let mut mats = Vec::new();
    let mut want = Vec::new();
    let mut ys = Vec::new();
    let mut biases = Vec::new();
    for (i, &r) in rows.iter().enumerate() {
        let w = dev
            .upload_matrix(
                ty,
                r,
                cols,
                &random_matrix(ty, r, cols, seed + 7 * i as u64),
            )
            .unwrap();
        let mut yref = up(&vec![f32::NAN; nt * r]);
        dev.matvec_prequantized(&w, &scratch, &mut yref).unwrap();
        let yref = dev.stream().clone_dtoh(&yref).unwrap();
        let (y0, bias, acc) = seg_extras(i, r, nt, seed);
        let expect: Vec<f32> = (0..nt * r)
            .map(|j| {
                let mut v = yref[j];
                if let Some(b) = &bias {
                    v += b[j % r];
                }
                if acc {
                    v += y0[j];
                }
                v
            })
            .collect();
        want.push((expect, acc));
        ys.push(up(&if acc { y0 } else { vec![f32::NAN; nt * r] }));
        biases.push(bias.map(|b| up(&b)));
        mats.push(w);
    }
    let accs: Vec<bool> = want.iter().map(|w| w.1).collect();
    let segs = seg_list(dev, &mats, &ys, &biases, &accs);
    if let Err(e) = dev.matvec_segments(&segs, &scratch) {
        failures.push(format!(
            "{} {rows:?}x{cols} n={nt} {what}: launch: {e}",
            ty.name()
        ));
        return;
    }
    for (i, y) in ys.iter().enumerate() {
        let got = dev.stream().clone_dtoh(y).unwrap();
        let bad = got
            .iter()
            .zip(&want[i].0)
            .position(|(g, w)| !(g == w || (g - w).abs() <= 1e-6 * w.abs().max(1.0)));
        if let Some(j) = bad {
            failures.push(format!(
                "{} segments {rows:?} x {cols} (rows/warp {rpw}, {nt} tokens, {what}): segment {i} value {j}: {} vs {}",
                ty.name(),
                got[j],
                want[i].0[j]
            ));
        }
    }
}

/// Several matrices of one format in one launch (`matvec_segments`, the fused decode path):
/// each output equals the per-matrix matvec of the same quantized x — for every block format,
/// odd row counts, 1-4 segments, both rows-per-warp kernels, 1, 2, 3 and 8 tokens (batched
/// decode and verify passes: every token's row block of each output); two-token Q4_K / Q6_K
/// with x staged in shared memory and without, the tiled q8_1 layout on and off.
#[test]
fn matvec_segments_match_single_matvecs() {
    let Some(dev) = open_or_cpu(&CudaOptions::default()) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let t = std::time::Instant::now();
    dev.module(cuda::Program::MatvecQuant)
        .expect("matvec kernels compile");
    eprintln!("matvec kernels ready in {:.1} s", t.elapsed().as_secs_f64());
    use GgmlType::*;
    let types = [
        Q4K, Q6K, Q4_0, Q8_0, IQ4XS, Q5K, Q4_1, Q5_0, Q5_1, IQ4NL, Q2K, Q3K,
    ];
    // the staged segment kernels (the direct ones sum in another order; their own test checks
    // them against the CPU)
    cuda::matvec::set_direct_kernels(Some(false), 0);
    let mut failures = Vec::new();
    let mut seed = 1000u64;
    for ty in types {
        for &cols in &segment_widths(ty) {
            for (ri, rows) in SEGMENT_ROW_SETS.into_iter().enumerate() {
                for rpw in [0u32, 2, 4] {
                    // every row set at one token; two of them also at 3 and 8 tokens
                    let counts: &[usize] = if ri % 2 == 0 { &[1, 2, 3, 8] } else { &[1] };
                    for &nt in counts {
                        seed += 1;
                        // the tiled q8_1 layout on every other case (1-2 tokens, widths of
                        // a multiple of 512)
                        cuda::matvec::set_q8_1_tiled(Some(seed.is_multiple_of(2)));
                        // two tokens: x staged in shared memory or read through L1
                        cuda::matvec::set_x_in_shared(Some(seed % 4 < 2));
                        check_segments(
                            &dev,
                            ty,
                            rows,
                            cols,
                            rpw,
                            nt,
                            seed,
                            "default grid",
                            &mut failures,
                        );
                    }
                }
            }
        }
        eprintln!(
            "segments ok so far after {}: {} failures",
            ty.name(),
            failures.len()
        );
    }
    cuda::matvec::set_rows_per_warp_override(0);
    cuda::matvec::set_q8_1_tiled(None);
    cuda::matvec::set_x_in_shared(None);
    cuda::matvec::set_direct_kernels(None, 0);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Row counts of the segment checks: 1-4 segments, odd counts.
const SEGMENT_ROW_SETS: [&[usize]; 4] = [&[37], &[1, 129], &[64, 7, 523], &[5, 1, 33, 260]];

/// Widths of the segment checks: several groups with a partial last one; one block (32-wide
/// formats: an odd number).
fn segment_widths(ty: GgmlType) -> Vec<usize> {
    // (4608: a multiple of 512, which the tiled q8_1 layout needs)
    if ty.block_size() == 32 {
        vec![33 * 32, 5 * 256, 4608]
    } else {
        vec![5 * 256, 256, 4608]
    }
}

/// The direct Q4_K, IQ4_XS and Q4_0 segment kernels (`REDLINE_MV_DIRECT`, kernels/matvec_direct.cu
/// `mvd_*`)
/// against the CPU's exact q8_1 pipeline (dequantized rows · d * q, f64), bias and residual
/// included: 1, 2, 3 and 4 segments of odd row counts; rows of 1 and 5 iterations of 1024
/// values, and (the `_t` kernels) of 1 and 3 super-blocks only, of an odd and an even number of
/// whole iterations plus 2 or 1 super-blocks (1536, 2304, 3584); 1-4 tokens; 1, 2 and (up to two
/// tokens) 4 rows per warp; the tiled q8_1 layout on and off (where the width is a multiple of
/// 512; 3-4 tokens are never tiled).
#[test]
fn direct_segments_match_cpu_reference() {
    let Some(dev) = open_or_cpu(&CudaOptions::default()) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    for p in [cuda::Program::MatvecQuant, cuda::Program::MatvecDirect] {
        dev.module(p).expect("matvec kernels compile");
    }
    let up = |v: &[f32]| dev.stream().clone_htod(v).unwrap();
    let mut failures = Vec::new();
    let mut seed = 5000u64;
    // (Q6_K: the direct kernels take rows of whole 1024-value iterations; its other widths
    // check the staged kernels here)
    for (ty, cols) in [
        GgmlType::Q4K,
        GgmlType::IQ4XS,
        GgmlType::Q4_0,
        GgmlType::Q6K,
    ]
    .into_iter()
    .flat_map(|ty| [1024usize, 5120, 256, 768, 1536, 2304, 3584].map(|c| (ty, c)))
    {
        for rows in SEGMENT_ROW_SETS {
            for nt in [1usize, 2, 3, 4] {
                for rpw in [1u32, 2, 4] {
                    if nt > 2 && rpw == 4 {
                        continue; // (1 and 2 rows only past two tokens)
                    }
                    seed += 1;
                    let tiled = seed.is_multiple_of(2);
                    cuda::matvec::set_q8_1_tiled(Some(tiled));
                    cuda::matvec::set_direct_kernels(Some(true), rpw);
                    cuda::matvec::set_direct_four(Some(cuda::matvec::DirectFour::All));
                    cuda::matvec::set_direct_q6k(Some(cuda::matvec::DirectQ6K::All));
                    cuda::matvec::set_direct_xgroup(Some(0));
                    let x = random_activations(nt * cols, seed);
                    let mut scratch = dev.matvec_scratch(nt, cols).unwrap();
                    dev.quantize_for_matvec(&up(&x), nt, cols, &mut scratch)
                        .unwrap();
                    let xq: Vec<Vec<f32>> = (0..nt)
                        .map(|t| q8_1_reference(&x[t * cols..(t + 1) * cols]))
                        .collect();
                    let mut mats = Vec::new();
                    let mut want = Vec::new();
                    let mut ys = Vec::new();
                    let mut biases = Vec::new();
                    let mut y_inits = Vec::new();
                    for (i, &r) in rows.iter().enumerate() {
                        let wb = random_matrix(ty, r, cols, seed + 7 * i as u64);
                        let rb = wb.len() / r;
                        let (y0, bias, acc) = seg_extras(i, r, nt, seed);
                        let mut expect = vec![(0f64, 0f64); nt * r];
                        let mut wf = vec![0f32; cols];
                        for row in 0..r {
                            quant::dequantize_row(ty, &wb[row * rb..(row + 1) * rb], &mut wf)
                                .unwrap();
                            for t in 0..nt {
                                let (mut v, mut mag) = (0f64, 0f64);
                                for (w, q) in wf.iter().zip(&xq[t]) {
                                    v += *w as f64 * *q as f64;
                                    mag += (*w as f64 * *q as f64).abs();
                                }
                                if let Some(b) = &bias {
                                    v += b[row] as f64;
                                    mag += (b[row] as f64).abs();
                                }
                                if acc {
                                    v += y0[t * r + row] as f64;
                                    mag += (y0[t * r + row] as f64).abs();
                                }
                                expect[t * r + row] = (v, mag);
                            }
                        }
                        want.push(expect);
                        let y_init = if acc { y0 } else { vec![f32::NAN; nt * r] };
                        ys.push(up(&y_init));
                        y_inits.push(y_init);
                        biases.push(bias.map(|b| up(&b)));
                        mats.push(dev.upload_matrix(ty, r, cols, &wb).unwrap());
                    }
                    let accs: Vec<bool> = (0..rows.len()).map(|i| i % 3 == 1).collect();
                    let segs = seg_list(&dev, &mats, &ys, &biases, &accs);
                    let what = format!(
                        "{} {rows:?} x {cols}, {nt} tokens, {rpw} rows/warp, tiled {tiled}",
                        ty.name()
                    );
                    if let Err(e) = dev.matvec_segments(&segs, &scratch) {
                        failures.push(format!("{what}: launch: {e}"));
                        continue;
                    }
                    let mut got_all = Vec::new();
                    for (i, y) in ys.iter().enumerate() {
                        let got = dev.stream().clone_dtoh(y).unwrap();
                        got_all.push(got.clone());
                        if let Some((j, (g, (w, mag)))) =
                            got.iter()
                                .zip(&want[i])
                                .enumerate()
                                .find(|(_, (g, (w, mag)))| {
                                    let err = (**g as f64 - w).abs();
                                    err.is_nan() || err > 2e-5 * mag + 1e-6
                                })
                        {
                            failures.push(format!(
                                "{what}: segment {i} value {j}: {g} vs {w} (magnitude {mag:.3e})"
                            ));
                        }
                    }
                    // a rerun under another kernel that must give the same bits: `variant`
                    // names it, `against` the kernel above, `set` / `reset` its switch
                    let mut rerun = |variant: &str,
                                     against: &str,
                                     set: &dyn Fn(),
                                     reset: &dyn Fn()| {
                        set();
                        let res = rerun_bits(
                            &dev, &mats, &mut ys, &y_inits, &biases, &accs, &scratch, &got_all,
                        );
                        reset();
                        match res {
                            Err(e) => failures.push(format!("{what}, {variant}: launch: {e}")),
                            Ok(differ) => failures.extend(differ.into_iter().map(|i| {
                                format!("{what}, {variant}: segment {i} differs from the {against} kernel")
                            })),
                        }
                    };
                    // the x-group kernels (REDLINE_MV_DIRECT_XG): the same dots in the same
                    // order, so bit for bit the results above
                    if ty == GgmlType::Q4K && nt > 2 {
                        for g in [1u32, 2] {
                            rerun(
                                &format!("x group {g}"),
                                "all-tokens",
                                &|| cuda::matvec::set_direct_xgroup(Some(g)),
                                &|| cuda::matvec::set_direct_xgroup(Some(0)),
                            );
                        }
                    }
                    if nt == 1 && cols.is_multiple_of(1024) {
                        // the queue one-token kernels (REDLINE_MV_QUEUE), forced onto a third
                        // of the row blocks: each warp draws further groups from the launch's
                        // counters; twice, so the second launch finds its slot's counters back
                        // at zero (the slots go round: each launch takes the next)
                        for round in ["queue", "queue again"] {
                            rerun(
                                round,
                                "one-block-a-group",
                                &|| cuda::matvec::set_queue(Some(true)),
                                &|| cuda::matvec::set_queue(None),
                            );
                        }
                    }
                    // the staged one-token kernels (REDLINE_MV_STAGE; sm_90, where the launch
                    // fits in one wave): the same loop on a shared-memory copy of the rows, so
                    // bit for bit the results above
                    if ty == GgmlType::Q4K && nt == 1 && cols.is_multiple_of(1024) {
                        rerun(
                            "staged",
                            "unstaged",
                            &|| cuda::matvec::set_stage(Some(true)),
                            &|| cuda::matvec::set_stage(None),
                        );
                    }
                }
            }
        }
        eprintln!(
            "direct {} width {cols}: {} failures so far",
            ty.name(),
            failures.len()
        );
    }
    cuda::matvec::set_direct_kernels(None, 0);
    cuda::matvec::set_direct_four(None);
    cuda::matvec::set_direct_q6k(None);
    cuda::matvec::set_direct_xgroup(None);
    cuda::matvec::set_q8_1_tiled(None);
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The same segment launch again, each output reset to its initial value first (as the
/// switches set now pick the kernel): the segments whose results differ in any bit from
/// `want`'s, or the launch's error.
#[allow(clippy::too_many_arguments)]
fn rerun_bits(
    dev: &cuda::CudaDevice,
    mats: &[cuda::matvec::DeviceMatrix],
    ys: &mut [cudarc::driver::CudaSlice<f32>],
    y_inits: &[Vec<f32>],
    biases: &[Option<cudarc::driver::CudaSlice<f32>>],
    accs: &[bool],
    scratch: &cuda::matvec::MatvecScratch,
    want: &[Vec<f32>],
) -> Result<Vec<usize>, String> {
    for (y, init) in ys.iter_mut().zip(y_inits) {
        dev.stream().memcpy_htod(init, y).unwrap();
    }
    let segs = seg_list(dev, mats, ys, biases, accs);
    dev.matvec_segments(&segs, scratch)
        .map_err(|e| e.to_string())?;
    Ok(ys
        .iter()
        .enumerate()
        .filter(|(i, y)| {
            let got = dev.stream().clone_dtoh(*y).unwrap();
            !got.iter()
                .zip(&want[*i])
                .all(|(a, b)| a.to_bits() == b.to_bits())
        })
        .map(|(i, _)| i)
        .collect())
}

/// One segment launch of `w` over the quantized x in `s`, into `y`.
fn one_segment(
    dev: &cuda::CudaDevice,
    w: &cuda::matvec::DeviceMatrix,
    s: &cuda::MatvecScratch,
    y: &cudarc::driver::CudaSlice<f32>,
) -> cuda::Result<()> {
    let seg = cuda::matvec::Segment {
        w,
        y: dev.device_address(y),
        bias: None,
        accumulate: false,
    };
    dev.matvec_segments(&[seg], s)
}

/// The rows-per-warp variants of a format's few-token segment kernels: the direct kernels'
/// (Q4_K, Q4_0, 3-4 tokens too) or the staged ones' (Q6_K, with x staged in shared memory or not),
/// each as a name, a setter and the most tokens it takes.
#[allow(clippy::type_complexity)]
fn row_variants(ty: GgmlType) -> Vec<(String, Box<dyn Fn()>, usize)> {
    let mut v: Vec<(String, Box<dyn Fn()>, usize)> = Vec::new();
    if matches!(ty, GgmlType::Q4K | GgmlType::Q4_0) {
        // (rows a warp, three tokens on the three-token kernels (REDLINE_MV_DIRECT_N3), x group
        // of the 3-4-token Q4_K kernels (REDLINE_MV_DIRECT_XG, 0: all tokens), most tokens)
        let mut direct = vec![
            (1u32, false, 0u32, 4usize),
            (2, false, 0, 4),
            (4, false, 0, 2),
        ];
        direct.extend([(1, true, 0, 3), (2, true, 0, 3)]);
        if ty == GgmlType::Q4K {
            direct.extend([
                (1, true, 1, 4),
                (1, true, 2, 4),
                (2, true, 1, 4),
                (2, true, 2, 4),
            ]);
        }
        for (r, n3, g, most) in direct {
            let name = match (n3, g) {
                (false, _) => format!("direct r{r}"),
                (true, 0) => format!("direct r{r} n3"),
                (true, g) => format!("direct r{r} g{g}"),
            };
            let set = move || {
                cuda::matvec::set_direct_kernels(Some(true), r);
                cuda::matvec::set_direct_four(Some(cuda::matvec::DirectFour::All));
                cuda::matvec::set_direct_three(Some(n3));
                cuda::matvec::set_direct_xgroup(Some(g));
            };
            v.push((name, Box::new(set), most));
        }
    } else {
        for r in [2u32, 4] {
            for xs in [true, false] {
                v.push((
                    format!("staged r{r}{}", if xs { " xs" } else { "" }),
                    Box::new(move || {
                        cuda::matvec::set_rows_per_warp_override(r);
                        cuda::matvec::set_x_in_shared(Some(xs));
                    }),
                    if xs { 2 } else { 4 },
                ));
            }
        }
    }
    v
}

fn reset_row_variants() {
    cuda::matvec::set_direct_kernels(None, 0);
    cuda::matvec::set_direct_four(None);
    cuda::matvec::set_direct_three(None);
    cuda::matvec::set_direct_xgroup(None);
    cuda::matvec::set_rows_per_warp_override(0);
    cuda::matvec::set_x_in_shared(None);
}

/// Speculation's contract on the dp4a product kernels: a token's outputs in a few-token segment
/// launch are its one-token outputs bit for bit, for every rows-per-warp choice and x staged in
/// shared memory or not (a verify pass's rows must be the decode steps' rows; the q8_1
/// tensor-core kernels that take some verify products sum in another order, ~1e-7 apart, which
/// the speculative suite bounds). Q4_K and Q4_0 on the direct kernels (1-4 tokens), Q6_K on the
/// staged ones; widths where two tokens' x fits shared memory (5120) and where it does not
/// (17408, the 27B's down projection).
#[test]
fn few_token_rows_are_one_token_rows_bit_for_bit() {
    let Some(dev) = open_or_cpu(&CudaOptions::default()) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    let up = |v: &[f32]| dev.stream().clone_htod(v).unwrap();
    let mut failures = Vec::new();
    for (ty, rows, cols) in [
        (GgmlType::Q4K, 333usize, 5120usize),
        (GgmlType::Q4K, 130, 17408),
        (GgmlType::Q6K, 333, 5120),
        (GgmlType::Q6K, 130, 17408),
        (GgmlType::Q4_0, 333, 5120),
        (GgmlType::Q4_0, 130, 17408),
    ] {
        let w = dev
            .upload_matrix(ty, rows, cols, &random_matrix(ty, rows, cols, 77))
            .unwrap();
        let x = random_activations(4 * cols, 78);
        let s1: Vec<cuda::MatvecScratch> = (0..4)
            .map(|t| {
                let mut s = dev.matvec_scratch(1, cols).unwrap();
                dev.quantize_for_matvec(&up(&x[t * cols..(t + 1) * cols]), 1, cols, &mut s)
                    .unwrap();
                s
            })
            .collect();
        // the reference: each token alone, the default kernels
        reset_row_variants();
        let want: Vec<Vec<f32>> = s1
            .iter()
            .map(|s| {
                let y = up(&vec![f32::NAN; rows]);
                one_segment(&dev, &w, s, &y).unwrap();
                dev.stream().clone_dtoh(&y).unwrap()
            })
            .collect();
        for (name, set, most) in row_variants(ty) {
            set();
            for n in 1..=most {
                let mut sn = dev.matvec_scratch(n, cols).unwrap();
                dev.quantize_for_matvec(&up(&x[..n * cols]), n, cols, &mut sn)
                    .unwrap();
                let y = up(&vec![f32::NAN; n * rows]);
                one_segment(&dev, &w, &sn, &y).unwrap();
                let got = dev.stream().clone_dtoh(&y).unwrap();
                for t in 0..n {
                    let got = &got[t * rows..(t + 1) * rows];
                    if let Some(i) = (0..rows).find(|&i| got[i].to_bits() != want[t][i].to_bits()) {
                        failures.push(format!(
                            "{} {rows}x{cols} {name}, {n} tokens: token {t} row {i}: {} vs {}",
                            ty.name(),
                            got[i],
                            want[t][i]
                        ));
                    }
                }
            }
        }
    }
    reset_row_variants();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What 1-4-token segment products of the 27B's shapes cost on the kernels a verify pass takes
/// (issue 8; mmv2 off, as speculation runs) and on each rows-per-warp variant: µs a launch with
/// the weights cycled past L2, each count over one token, and the one-token weight stream in
/// GB/s. Gate/up runs as its two segments. `TIMING_SHAPES=down,out` narrows it.
#[test]
#[ignore = "timing on a real card: cargo test -p cuda --test gpu_matvec -- --ignored --nocapture"]
fn few_token_segment_timing() {
    let Some(dev) = open_or_cpu(&CudaOptions::default()) else {
        eprintln!("skipped: no CUDA device");
        return;
    };
    cuda::mmv::set_mmv2(Some(false));
    let only = std::env::var("TIMING_SHAPES").ok();
    let shapes = [
        ("down", GgmlType::Q6K, 1usize, 5120usize, 17408usize),
        ("down", GgmlType::Q4K, 1, 5120, 17408),
        ("out", GgmlType::Q4K, 1, 5120, 6144),
        ("gate/up", GgmlType::Q4K, 2, 17408, 5120),
        ("in-proj", GgmlType::Q4K, 1, 16384, 5120),
        ("head", GgmlType::Q6K, 1, 248320, 5120),
    ];
    println!(
        "{:>8} {:>5} {:>14} {:>14} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>7}",
        "op",
        "type",
        "shape",
        "variant",
        "n=1 µs",
        "n=2",
        "n=3",
        "n=4",
        "2/1",
        "3/1",
        "4/1",
        "GB/s 1"
    );
    for (op, ty, segs, rows, cols) in shapes {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|s| s == op))
        {
            continue;
        }
        let bytes = random_matrix(ty, rows, cols, 99);
        let nbytes = bytes.len() * segs;
        let copies = (400_000_000 / nbytes).clamp(2, 16);
        let mats: Vec<Vec<cuda::matvec::DeviceMatrix>> = (0..copies)
            .map(|_| {
                (0..segs)
                    .map(|_| dev.upload_matrix(ty, rows, cols, &bytes).unwrap())
                    .collect()
            })
            .collect();
        let ys: Vec<cudarc::driver::CudaSlice<f32>> = (0..segs)
            .map(|_| dev.stream().alloc_zeros::<f32>(4 * rows).unwrap())
            .collect();
        let x = dev
            .stream()
            .clone_htod(&random_activations(4 * cols, 5))
            .unwrap();
        let mut scratch: Vec<cuda::MatvecScratch> = (1..=4usize)
            .map(|n| dev.matvec_scratch(n, cols).unwrap())
            .collect();
        let mut variants = row_variants(ty);
        variants.insert(0, ("dispatch".to_string(), Box::new(reset_row_variants), 4));
        for (name, set, most) in variants {
            set();
            let mut us = [f64::NAN; 4];
            for n in 1..=most {
                let s = &mut scratch[n - 1];
                dev.quantize_for_matvec(&x, n, cols, s).unwrap();
                us[n - 1] = time_us(&dev, copies, 60, |i| {
                    let list: Vec<cuda::matvec::Segment> = mats[i]
                        .iter()
                        .zip(&ys)
                        .map(|(w, y)| cuda::matvec::Segment {
                            w,
                            y: dev.device_address(y),
                            bias: None,
                            accumulate: false,
                        })
                        .collect();
                    if name == "dispatch" {
                        dev.few_token_segments(&list, s, &x)
                    } else {
                        dev.matvec_segments(&list, s)
                    }
                })
                .unwrap_or(f64::NAN);
            }
            println!(
                "{op:>8} {:>5} {:>14} {name:>14} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>6.2} {:>6.2} {:>6.2} {:>7.0}",
                ty.name(),
                format!("{}{rows}x{cols}", if segs > 1 { "2x" } else { "" }),
                us[0],
                us[1],
                us[2],
                us[3],
                us[1] / us[0],
                us[2] / us[0],
                us[3] / us[0],
                nbytes as f64 / (us[0] * 1e3)
            );
            reset_row_variants();
        }
    }
    cuda::mmv::set_mmv2(None);
}
