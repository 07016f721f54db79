//! One conformance suite for every backend: each op on random inputs (odd sizes, several
//! sequences, split batches) against a naive host implementation written here from the op's
//! documented contract, accumulating in f64. `run_all(&backend)` is what a new backend (CUDA)
//! calls from its tests; the CPU backend runs it in `tests/cpu_conformance.rs`.

use std::sync::Arc;

use gguf::{GgmlType, GgufFile, GgufWriter};

use crate::{
    AttentionParams, AttnBlock, Backend, ColumnCopy, KvType, RecurrentShape, RopeMode, RopeParams,
    Row,
};

/// Deterministic uniform values in [-1, 1).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn uniform(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// Relative L2 distance of `got` from `want`.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den.max(1e-300)).sqrt()
}

fn check(op: &str, got: &[f32], want: &[f32], tol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{op}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    let e = rel_l2(got, want);
    if e.is_nan() || e > tol {
        return Err(format!("{op}: relative L2 error {e:.3e} > {tol:.0e}"));
    }
    Ok(())
}

/// An in-memory GGUF holding `tensors` (name, rows, cols, type, f32 values).
pub fn gguf_with(tensors: &[(&str, usize, usize, GgmlType, &[f32])]) -> Arc<GgufFile> {
    let mut w = GgufWriter::new();
    for &(name, rows, cols, ty, _) in tensors {
        let dims: Vec<u64> = if rows == 1 {
            vec![cols as u64]
        } else {
            vec![cols as u64, rows as u64]
        };
        w.add_tensor(name, &dims, ty).expect("tensor declaration");
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |i, info, out| {
        let (_, rows, cols, ty, data) = tensors[i];
        let mut buf = vec![0u8; info.n_bytes as usize / rows];
        for r in 0..rows {
            quant::quantize_row(ty, &data[r * cols..(r + 1) * cols], &mut buf).expect("quantize");
            out.write_all(&buf)?;
        }
        Ok(())
    })
    .expect("in-memory GGUF");
    Arc::new(GgufFile::from_bytes(bytes).expect("in-memory GGUF reads back"))
}

fn dequantized(ty: GgmlType, data: &[f32], cols: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(data.len());
    let mut buf = vec![0u8; ty.bytes_for(cols as u64).unwrap_or(0) as usize];
    let mut row = vec![0.0f32; cols];
    for r in data.chunks_exact(cols) {
        quant::quantize_row(ty, r, &mut buf).expect("quantize");
        quant::dequantize_row(ty, &buf, &mut row).expect("dequantize");
        out.extend_from_slice(&row);
    }
    out
}

fn up<B: Backend>(b: &B, data: &[f32], rows: usize, cols: usize) -> Result<B::Tensor, String> {
    b.upload(data, rows, cols).map_err(|e| e.to_string())
}

/// Runs every check; the first failure is returned.
pub fn run_all<B: Backend>(b: &B) -> Result<(), String> {
    matmul_and_embed(b)?;
    norms_and_activations(b)?;
    rope(b)?;
    attention(b)?;
    attention_block(b)?;
    delta_net(b)?;
    conv1d_qkv(b)?;
    in_proj_conv1d_qkv(b)?;
    delta_tail(b)?;
    download_cols(b)?;
    argmax_cols(b)?;
    top_k_cols(b)?;
    Ok(())
}

/// `download_cols`: the head of every row, in order (exact: a copy), for several widths and
/// row counts, against the full download.
pub fn download_cols<B: Backend>(b: &B) -> Result<(), String> {
    let mut g = Lcg(7);
    for (rows, n) in [(1, 37), (3, 37), (8, 1000), (5, 4)] {
        let data = g.vec(rows * n);
        let t = up(b, &data, rows, n)?;
        for cols in [1, n - 3, n, n + 5] {
            let got = b.download_cols(&t, cols);
            let w = cols.min(n);
            let want: Vec<f32> = data.chunks(n).flat_map(|r| r[..w].to_vec()).collect();
            if got != want {
                return Err(format!(
                    "download_cols of [{rows}, {n}] keeping {cols}: {} values, want {}",
                    got.len(),
                    want.len()
                ));
            }
        }
    }
    Ok(())
}

/// `argmax_cols`: the greedy pick of every row's head ([`crate::greedy_pick`] of the
/// downloaded values) for rows with ties across the row (the lowest column wins), NaN, -inf
/// and +inf values, a largest value of zero with -0 before +0 (+0 wins), rows with nothing
/// finite, and widths that cut the maximum off.
pub fn argmax_cols<B: Backend>(b: &B) -> Result<(), String> {
    let mut g = Lcg(11);
    for (rows, n) in [(1, 37), (4, 1000), (6, 152_064), (3, 20_000)] {
        let mut data = g.vec(rows * n);
        for (r, row) in data.chunks_mut(n).enumerate() {
            match r % 6 {
                // the maximum twice, far apart (different blocks of a long row)
                0 => {
                    row[n - 2] = 9.0;
                    row[n / 3] = 9.0;
                }
                // NaN everywhere but a few, and -inf
                1 => {
                    for (i, v) in row.iter_mut().enumerate() {
                        *v = match i % 3 {
                            0 => f32::NAN,
                            1 => f32::NEG_INFINITY,
                            _ => *v,
                        };
                    }
                }
                // nothing finite
                2 => row.fill(f32::NEG_INFINITY),
                // +inf beats everything
                3 => row[n / 2] = f32::INFINITY,
                // all NaN but one -inf and one +inf: nothing finite
                4 => {
                    row.fill(f32::NAN);
                    row[1] = f32::NEG_INFINITY;
                    row[n - 1] = f32::INFINITY;
                }
                // the largest value is zero: -0 first, +0 (above it in total order) later
                _ => {
                    row.iter_mut().for_each(|v| *v = -v.abs() - 1.0);
                    row[1] = -0.0;
                    row[n - 2] = 0.0;
                }
            }
        }
        let t = up(b, &data, rows, n)?;
        for cols in [1, n / 2, n - 1, n, n + 3] {
            let got = b.argmax_cols(&t, cols);
            let w = cols.min(n);
            let want: Vec<Option<u32>> = data
                .chunks(n)
                .map(|r| crate::greedy_pick(&r[..w]))
                .collect();
            if got != want {
                return Err(format!(
                    "argmax_cols of [{rows}, {n}] over {cols} columns: {got:?}, want {want:?}"
                ));
            }
        }
    }
    Ok(())
}

/// `top_k_cols`: every row's head's [`crate::top_k_row`] for k of 1 to 64: rows whose k-th
/// value is shared by many columns across the row (the lowest columns win), NaN, -inf, +inf,
/// -0 beside +0, fewer finite values than k, nothing finite.
pub fn top_k_cols<B: Backend>(b: &B) -> Result<(), String> {
    let mut g = Lcg(13);
    for (rows, n) in [(2, 37), (5, 3000), (7, 152_064)] {
        let mut data = g.vec(rows * n);
        for (r, row) in data.chunks_mut(n).enumerate() {
            match r % 7 {
                // 100 columns of one value above the rest, spread over the row
                0 => {
                    for i in 0..100.min(n) {
                        row[(i * 7919) % n] = 5.0;
                    }
                }
                // NaN and -inf everywhere but a few finite values
                1 => {
                    for (i, v) in row.iter_mut().enumerate() {
                        if i % 11 != 3 {
                            *v = if i % 2 == 0 {
                                f32::NAN
                            } else {
                                f32::NEG_INFINITY
                            };
                        }
                    }
                }
                2 => row.fill(f32::NEG_INFINITY),
                // +inf twice, -0 and +0 at the top
                3 => {
                    row.iter_mut().for_each(|v| *v = -v.abs() - 1.0);
                    row[n / 2] = f32::INFINITY;
                    row[n / 5] = f32::INFINITY;
                    row[1] = -0.0;
                    row[n - 1] = 0.0;
                }
                // coarse values: ties everywhere
                4 => row.iter_mut().for_each(|v| *v = (*v * 4.0).round()),
                _ => {}
            }
        }
        let t = up(b, &data, rows, n)?;
        for k in [1, 2, 40, 64] {
            for cols in [n / 2, n - 1, n, n + 3] {
                let got = b.top_k_cols(&t, cols, k);
                let w = cols.min(n);
                let want: Vec<Vec<(u32, f32)>> = data
                    .chunks(n)
                    .map(|r| crate::top_k_row(&r[..w], k))
                    .collect();
                let same = got.len() == want.len()
                    && got.iter().zip(&want).all(|(a, b)| {
                        a.len() == b.len()
                            && a.iter()
                                .zip(b)
                                .all(|(x, y)| x.0 == y.0 && x.1.to_bits() == y.1.to_bits())
                    });
                if !same {
                    return Err(format!(
                        "top_k_cols of [{rows}, {n}] over {cols} columns, k {k}: {:?}, want {:?}",
                        got.iter().map(|r| &r[..r.len().min(4)]).collect::<Vec<_>>(),
                        want.iter()
                            .map(|r| &r[..r.len().min(4)])
                            .collect::<Vec<_>>()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// matmul of several weight types and odd shapes against dequantized f64 products; embed.
pub fn matmul_and_embed<B: Backend>(b: &B) -> Result<(), String> {
    let mut g = Lcg(1);
    let cases = [
        (GgmlType::F32, 37, 96, 1e-5),
        (GgmlType::F16, 29, 64, 3e-3),
        (GgmlType::Q8_0, 37, 96, 2e-2),
        (GgmlType::Q4_0, 5, 160, 3e-2),
        (GgmlType::Q4K, 19, 256, 3e-2),
        (GgmlType::Q6K, 3, 512, 2e-2),
    ];
    let datas: Vec<Vec<f32>> = cases.iter().map(|&(_, r, c, _)| g.vec(r * c)).collect();
    let names: Vec<String> = (0..cases.len()).map(|i| format!("w{i}")).collect();
    let specs: Vec<(&str, usize, usize, GgmlType, &[f32])> = cases
        .iter()
        .zip(&datas)
        .zip(&names)
        .map(|((&(ty, r, c, _), d), n)| (n.as_str(), r, c, ty, d.as_slice()))
        .collect();
    let file = gguf_with(&specs);
    for (i, &(ty, rows, cols, tol)) in cases.iter().enumerate() {
        let w = b.load_weight(&file, &names[i]).map_err(|e| e.to_string())?;
        if b.weight_shape(&w) != (rows, cols) {
            return Err(format!("weight_shape {ty}: {:?}", b.weight_shape(&w)));
        }
        let wd = dequantized(ty, &datas[i], cols);
        for n in [1, 2, 17] {
            let x = g.vec(n * cols);
            let want: Vec<f32> = (0..n)
                .flat_map(|t| {
                    let xr = &x[t * cols..(t + 1) * cols];
                    wd.chunks_exact(cols)
                        .map(|wr| {
                            wr.iter()
                                .zip(xr)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>() as f32
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            let mut y = b.zeros(n, rows);
            b.matmul(&w, &up(b, &x, n, cols)?, &mut y)
                .map_err(|e| e.to_string())?;
            check(
                &format!("matmul {ty} [{rows}x{cols}] n={n}"),
                &b.download(&y),
                &want,
                tol,
            )?;
        }
        let toks = [0u32, (rows - 1) as u32, (rows / 2) as u32];
        let mut e = b.zeros(toks.len(), cols);
        b.embed(&w, &toks, &mut e).map_err(|e| e.to_string())?;
        let want: Vec<f32> = toks
            .iter()
            .flat_map(|&t| wd[t as usize * cols..][..cols].to_vec())
            .collect();
        check(&format!("embed {ty}"), &b.download(&e), &want, 1e-6)?;
        if b.embed(&w, &[rows as u32], &mut b.zeros(1, cols)).is_ok() {
            return Err(format!("embed {ty}: out-of-range token accepted"));
        }
    }
    Ok(())
}

/// rms_norm (grouped), l2_norm, add, add_bias, swiglu, silu, mul_sigmoid, gated_rms_norm,
/// copy_cols, get_rows.
pub fn norms_and_activations<B: Backend>(b: &B) -> Result<(), String> {
    let mut g = Lcg(2);
    let (n, group, groups) = (5, 24, 3);
    let cols = group * groups;
    let wv = g.vec(group);
    let bias = g.vec(cols);
    let file = gguf_with(&[
        ("norm", 1, group, GgmlType::F32, &wv),
        ("bias", 1, cols, GgmlType::F32, &bias),
    ]);
    let w = b.load_weight(&file, "norm").map_err(|e| e.to_string())?;
    let bw = b.load_weight(&file, "bias").map_err(|e| e.to_string())?;
    let x = g.vec(n * cols);
    let z = g.vec(n * cols);
    let eps = 1e-5f32;
    let rms = |v: &[f32]| {
        1.0 / (v.iter().map(|a| (*a as f64).powi(2)).sum::<f64>() / v.len() as f64 + eps as f64)
            .sqrt()
    };
    let silu = |a: f32| a as f64 / (1.0 + (-(a as f64)).exp());
    let sig = |a: f32| 1.0 / (1.0 + (-(a as f64)).exp());
    let want_norm: Vec<f32> = x
        .chunks_exact(group)
        .flat_map(|c| {
            let s = rms(c);
            c.iter()
                .zip(&wv)
                .map(move |(a, w)| (*a as f64 * s * *w as f64) as f32)
                .collect::<Vec<_>>()
        })
        .collect();
    let xt = up(b, &x, n, cols)?;
    let mut out = b.zeros(n, cols);
    b.rms_norm(&xt, &w, eps, &mut out)
        .map_err(|e| e.to_string())?;
    check("rms_norm", &b.download(&out), &want_norm, 1e-6)?;
    let mut t = up(b, &x, n, cols)?;
    b.rms_norm_inplace(&mut t, &w, eps)
        .map_err(|e| e.to_string())?;
    check("rms_norm_inplace", &b.download(&t), &want_norm, 1e-6)?;

    // l2 over the middle group only
    let mut t = up(b, &x, n, cols)?;
    b.l2_norm(&mut t, group, group, 8, 1e-6)
        .map_err(|e| e.to_string())?;
    let mut want = x.clone();
    for r in 0..n {
        for c in want[r * cols + group..r * cols + 2 * group].chunks_exact_mut(8) {
            let s = 1.0 / (c.iter().map(|a| (*a as f64).powi(2)).sum::<f64>() + 1e-6).sqrt();
            c.iter_mut().for_each(|a| *a = (*a as f64 * s) as f32);
        }
    }
    check("l2_norm", &b.download(&t), &want, 1e-6)?;

    let mut t = up(b, &x, n, cols)?;
    b.add(&mut t, &up(b, &z, n, cols)?)
        .map_err(|e| e.to_string())?;
    b.add_bias(&mut t, &bw).map_err(|e| e.to_string())?;
    let want: Vec<f32> = (0..n * cols)
        .map(|i| x[i] + z[i] + bias[i % cols])
        .collect();
    check("add/add_bias", &b.download(&t), &want, 1e-7)?;

    let mut t = b.zeros(n, cols);
    b.swiglu(&xt, &up(b, &z, n, cols)?, &mut t)
        .map_err(|e| e.to_string())?;
    let want: Vec<f32> = (0..n * cols)
        .map(|i| (silu(x[i]) * z[i] as f64) as f32)
        .collect();
    check("swiglu", &b.download(&t), &want, 1e-6)?;

    let mut t = up(b, &x, n, cols)?;
    b.silu(&mut t).map_err(|e| e.to_string())?;
    let want: Vec<f32> = x.iter().map(|&a| silu(a) as f32).collect();
    check("silu", &b.download(&t), &want, 1e-6)?;

    let mut t = up(b, &x, n, cols)?;
    b.mul_sigmoid(&mut t, &up(b, &z, n, cols)?)
        .map_err(|e| e.to_string())?;
    let want: Vec<f32> = (0..n * cols)
        .map(|i| (x[i] as f64 * sig(z[i])) as f32)
        .collect();
    check("mul_sigmoid", &b.download(&t), &want, 1e-6)?;

    let mut t = up(b, &x, n, cols)?;
    b.gated_rms_norm(&mut t, &w, &up(b, &z, n, cols)?, eps)
        .map_err(|e| e.to_string())?;
    let want: Vec<f32> = want_norm
        .iter()
        .zip(&z)
        .map(|(a, zz)| (*a as f64 * silu(*zz)) as f32)
        .collect();
    check("gated_rms_norm", &b.download(&t), &want, 1e-6)?;

    let c = ColumnCopy {
        n_blocks: 3,
        width: 5,
        src_offset: 2,
        src_stride: 24,
        dst_offset: 1,
        dst_stride: 6,
    };
    let mut t = b.zeros(n, 19);
    b.copy_cols(&xt, &mut t, &c).map_err(|e| e.to_string())?;
    let mut want = vec![0.0f32; n * 19];
    for r in 0..n {
        for blk in 0..3 {
            for i in 0..5 {
                want[r * 19 + 1 + blk * 6 + i] = x[r * cols + 2 + blk * 24 + i];
            }
        }
    }
    check("copy_cols", &b.download(&t), &want, 0.0)?;

    let mut t = b.zeros(2, cols);
    b.get_rows(&xt, &[4, 1], &mut t)
        .map_err(|e| e.to_string())?;
    let want = [&x[4 * cols..5 * cols], &x[cols..2 * cols]].concat();
    check("get_rows", &b.download(&t), &want, 0.0)?;
    Ok(())
}

/// Normal and NeoX layouts, partial rotation, linear scaling, frequency factors.
pub fn rope<B: Backend>(b: &B) -> Result<(), String> {
    let mut g = Lcg(3);
    let (n, heads, hd) = (4, 3, 16);
    let x = g.vec(n * heads * hd);
    let pos = [0u32, 1, 17, 4000];
    for (mode, n_rot, scale, factors) in [
        (RopeMode::Normal, 16, 1.0, None),
        (RopeMode::Neox, 16, 1.0, None),
        (RopeMode::Neox, 6, 0.25, Some(vec![1.0, 2.0, 8.0])),
        (
            RopeMode::Mrope {
                sections: [1, 1, 1, 0],
                interleaved: true,
            },
            6,
            1.0,
            None,
        ),
    ] {
        let p = RopeParams {
            mode,
            n_rot,
            freq_base: 10000.0,
            freq_scale: scale,
            freq_factors: factors.clone(),
        };
        let mut want = x.clone();
        for (r, &ps) in pos.iter().enumerate() {
            naive_rope(
                &mut want[r * heads * hd..(r + 1) * heads * hd],
                hd,
                ps as usize,
                &p,
            );
        }
        let mut t = up(b, &x, n, heads * hd)?;
        b.rope(&mut t, &pos, hd, &p).map_err(|e| e.to_string())?;
        check(
            &format!("rope {mode:?} n_rot {n_rot}"),
            &b.download(&t),
            &want,
            1e-6,
        )?;
    }
    Ok(())
}

/// Naive causal GQA attention of one sequence over all its rows, f64.
pub fn naive_attention(q: &[f32], k: &[f32], v: &[f32], n: usize, p: &AttentionParams) -> Vec<f32> {
    let (hk, hv) = (p.head_dim_k, p.head_dim_v);
    let group = p.n_head / p.n_kv_head;
    let mut out = vec![0.0f32; n * p.n_head * hv];
    for t in 0..n {
        for h in 0..p.n_head {
            let kvh = h / group;
            let qh = &q[t * p.n_head * hk + h * hk..][..hk];
            let s: Vec<f64> = (0..=t)
                .map(|u| {
                    let kr = &k[u * p.n_kv_head * hk + kvh * hk..][..hk];
                    qh.iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * p.scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let zsum: f64 = e.iter().sum();
            for d in 0..hv {
                let acc: f64 = (0..=t)
                    .map(|u| e[u] / zsum * v[u * p.n_kv_head * hv + kvh * hv + d] as f64)
                    .sum();
                out[t * p.n_head * hv + h * hv + d] = acc as f32;
            }
        }
    }
    out
}

/// Two sequences of different lengths, fed as a mixed prefill batch and then a batched
/// decode step, against naive attention; every KV type.
pub fn attention<B: Backend>(b: &B) -> Result<(), String> {
    let mut g = Lcg(4);
    let p = AttentionParams {
        n_head: 6,
        n_kv_head: 2,
        head_dim_k: 32,
        head_dim_v: 64,
        scale: 0.3,
    };
    let lens = [9usize, 4];
    let data: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = lens
        .iter()
        .map(|&n| (g.vec(n * 6 * 32), g.vec(n * 2 * 32), g.vec(n * 2 * 64)))
        .collect();
    let want: Vec<Vec<f32>> = lens
        .iter()
        .zip(&data)
        .map(|(&n, (q, k, v))| naive_attention(q, k, v, n, &p))
        .collect();
    for (kv, tol) in [
        (KvType::F32, 1e-5),
        (KvType::F16, 2e-3),
        (KvType::Q8_0, 2e-2),
        (KvType::Q4_0, 0.2),
    ] {
        let mut c0 = b
            .new_kv_cache(16, 2, 32, 64, kv)
            .map_err(|e| e.to_string())?;
        let mut c1 = b
            .new_kv_cache(16, 2, 32, 64, kv)
            .map_err(|e| e.to_string())?;
        // Step 1: seq0 rows 0..8 and seq1 rows 0..3 in one batch. Step 2: one row each.
        let mut got = [Vec::new(), Vec::new()];
        for (ranges, _) in [([(0usize, 8usize), (0, 3)], 0), ([(8, 9), (3, 4)], 1)] {
            let mut rows = Vec::new();
            let (mut qb, mut kb, mut vb) = (Vec::new(), Vec::new(), Vec::new());
            for (s, &(a, e)) in ranges.iter().enumerate() {
                let (q, k, v) = &data[s];
                rows.extend((a..e).map(|pos| Row { seq: s, pos }));
                qb.extend_from_slice(&q[a * 192..e * 192]);
                kb.extend_from_slice(&k[a * 64..e * 64]);
                vb.extend_from_slice(&v[a * 128..e * 128]);
            }
            let m = rows.len();
            let mut out = b.zeros(m, 6 * 64);
            b.attention(
                &up(b, &qb, m, 192)?,
                &up(b, &kb, m, 64)?,
                &up(b, &vb, m, 128)?,
                &rows,
                &mut [&mut c0, &mut c1],
                &p,
                &mut out,
            )
            .map_err(|e| e.to_string())?;
            let o = b.download(&out);
            for (r, row) in rows.iter().enumerate() {
                got[row.seq].extend_from_slice(&o[r * 384..(r + 1) * 384]);
            }
        }
        for s in 0..2 {
            check(&format!("attention {kv} seq {s}"), &got[s], &want[s], tol)?;
        }
        let z = b.zeros(1, 192);
        let r = b.attention(
            &z,
            &b.zeros(1, 64),
            &b.zeros(1, 128),
            &[Row { seq: 0, pos: 16 }],
            &mut [&mut c0],
            &p,
            &mut b.zeros(1, 384),
        );
        if r.is_ok() {
            return Err(format!("attention {kv}: position past the cache accepted"));
        }
    }
    Ok(())
}

/// `x` rotated in place as [`RopeParams`] documents (f64 angles), each head of `hd` values.
fn naive_rope(x: &mut [f32], hd: usize, pos: usize, p: &RopeParams) {
    for head in x.chunks_exact_mut(hd) {
        for i in 0..p.n_rot / 2 {
            let f = p.freq_factors.as_ref().map_or(1.0, |f| f[i] as f64);
            let theta = pos as f64
                * p.freq_scale as f64
                * (p.freq_base as f64).powf(-2.0 * i as f64 / p.n_rot as f64)
                / f;
            let (a, c) = match p.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                _ => (i, i + p.n_rot / 2),
            };
            let (x0, x1) = (head[a] as f64, head[c] as f64);
            head[a] = (x0 * theta.cos() - x1 * theta.sin()) as f32;
            head[c] = (x0 * theta.sin() + x1 * theta.cos()) as f32;
        }
    }
}

/// Each head of `w.len()` values of `x` RMS-normed with weights `w` (f64).
fn naive_head_norm(x: &mut [f32], w: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(w.len()) {
        let ms = head.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / w.len() as f64;
        let s = 1.0 / (ms + eps as f64).sqrt();
        head.iter_mut()
            .zip(w)
            .for_each(|(v, g)| *v = (*v as f64 * s * *g as f64) as f32);
    }
}

/// [`Backend::attention_block`] against naive host code, two layer kinds over an f16 cache:
/// Qwen3.5's gated query (query and gate side by side per head, q/k norms, partial NeoX RoPE)
/// and a plain one (normal RoPE with frequency factors). Two sequences: a prompt batch (many
/// rows of one sequence), then single-token decode steps of both together and of one alone —
/// the calls a device may fuse — out to lengths where decode splits the cache.
pub fn attention_block<B: Backend>(b: &B) -> Result<(), String> {
    attention_block_outputs(b).map(|_| ())
}

/// [`attention_block`], returning every output row it checked (for comparing two paths of one
/// backend bit for bit).
pub fn attention_block_outputs<B: Backend>(b: &B) -> Result<Vec<f32>, String> {
    attention_block_with_products(b).map(|(o, _)| o)
}

/// [`attention_block_outputs`] and, after each call, the call's output through an
/// o-projection (`matmul_add` of a Q8_0 weight onto zeros, as a layer's residual add), checked
/// against f64 products of the same output rows: every output row, then every product row.
pub fn attention_block_with_products<B: Backend>(b: &B) -> Result<(Vec<f32>, Vec<f32>), String> {
    let (n_head, n_kv, d) = (6usize, 2usize, 64usize);
    let p = AttentionParams {
        n_head,
        n_kv_head: n_kv,
        head_dim_k: d,
        head_dim_v: d,
        scale: 0.125,
    };
    let gated_rope = RopeParams {
        mode: RopeMode::Neox,
        n_rot: 32,
        freq_base: 10000.0,
        freq_scale: 1.0,
        freq_factors: None,
    };
    let plain_rope = RopeParams {
        mode: RopeMode::Normal,
        n_rot: d,
        freq_base: 500000.0,
        freq_scale: 0.5,
        freq_factors: Some((0..d / 2).map(|i| 1.0 + (i % 5) as f32).collect()),
    };
    let eps = 1e-6;
    let mut g = Lcg(11);
    let (qn, kn) = (g.vec(d), g.vec(d));
    let wfile = gguf_with(&[
        ("qn", 1, d, gguf::GgmlType::F32, &qn),
        ("kn", 1, d, gguf::GgmlType::F32, &kn),
    ]);
    let load = |n: &str| b.load_weight(&wfile, n).map_err(|e| e.to_string());
    let (qn_w, kn_w) = (load("qn")?, load("kn")?);
    let (n_o, w_in) = (40usize, n_head * d);
    let wo = g.vec(n_o * w_in);
    let ofile = gguf_with(&[("wo", n_o, w_in, gguf::GgmlType::Q8_0, &wo)]);
    let wo_w = b.load_weight(&ofile, "wo").map_err(|e| e.to_string())?;
    let wo_deq = dequantized(gguf::GgmlType::Q8_0, &wo, w_in);
    // sequence 0: prompt of 60 then 80 single steps; sequence 1: prompt of 9, steps alongside
    let (prompt, steps) = ([60usize, 9], 80usize);
    let mut all = Vec::new();
    let mut products = Vec::new();
    for gated in [true, false] {
        let rope = if gated { &gated_rope } else { &plain_rope };
        let stride = if gated { 2 * d } else { d };
        let lens = [prompt[0] + steps, prompt[1] + steps / 2];
        // raw projections of every token of both sequences
        let data: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = lens
            .iter()
            .map(|&n| {
                let mut q = g.vec(n * n_head * stride);
                q.iter_mut().for_each(|x| *x *= 3.0);
                (q, g.vec(n * n_kv * d), g.vec(n * n_kv * d))
            })
            .collect();
        let want: Vec<Vec<f32>> = lens
            .iter()
            .zip(&data)
            .map(|(&n, (qg, k, v))| {
                let mut q = Vec::with_capacity(n * n_head * d);
                let mut gate = Vec::with_capacity(n * n_head * d);
                for head in qg.chunks_exact(stride) {
                    q.extend_from_slice(&head[..d]);
                    gate.extend_from_slice(&head[stride - d..]);
                }
                let mut k = k.clone();
                if gated {
                    naive_head_norm(&mut q, &qn, eps);
                    naive_head_norm(&mut k, &kn, eps);
                }
                for t in 0..n {
                    naive_rope(&mut q[t * n_head * d..(t + 1) * n_head * d], d, t, rope);
                    naive_rope(&mut k[t * n_kv * d..(t + 1) * n_kv * d], d, t, rope);
                }
                let mut o = naive_attention(&q, &k, v, n, &p);
                if gated {
                    o.iter_mut()
                        .zip(&gate)
                        .for_each(|(x, z)| *x = (*x as f64 / (1.0 + (-*z as f64).exp())) as f32);
                }
                o
            })
            .collect();
        let mut caches = [
            b.new_kv_cache(256, n_kv, d, d, KvType::F16)
                .map_err(|e| e.to_string())?,
            b.new_kv_cache(256, n_kv, d, d, KvType::F16)
                .map_err(|e| e.to_string())?,
        ];
        let mut got = [Vec::new(), Vec::new()];
        // (sequence, first position, end) per call: prompts, then steps of both, then of seq 0
        let mut calls: Vec<Vec<(usize, usize, usize)>> =
            vec![vec![(0, 0, prompt[0])], vec![(1, 0, prompt[1])]];
        for t in 0..steps {
            let mut c = vec![(0, prompt[0] + t, prompt[0] + t + 1)];
            if t < steps / 2 {
                c.push((1, prompt[1] + t, prompt[1] + t + 1));
            }
            calls.push(c);
        }
        for call in &calls {
            let mut rows = Vec::new();
            let (mut qb, mut kb, mut vb) = (Vec::new(), Vec::new(), Vec::new());
            for &(s, a, e) in call {
                let (q, k, v) = &data[s];
                rows.extend((a..e).map(|pos| Row { seq: s, pos }));
                qb.extend_from_slice(&q[a * n_head * stride..e * n_head * stride]);
                kb.extend_from_slice(&k[a * n_kv * d..e * n_kv * d]);
                vb.extend_from_slice(&v[a * n_kv * d..e * n_kv * d]);
            }
            let m = rows.len();
            let positions: Vec<u32> = rows.iter().map(|r| r.pos as u32).collect();
            let (mut qt, mut kt) = (up(b, &qb, m, n_head * stride)?, up(b, &kb, m, n_kv * d)?);
            let vt = up(b, &vb, m, n_kv * d)?;
            let mut out = b.zeros(m, n_head * d);
            let [c0, c1] = &mut caches;
            b.attention_block(
                AttnBlock {
                    q: &mut qt,
                    q_head_stride: stride,
                    gate_offset: gated.then_some(d),
                    k: &mut kt,
                    v: &vt,
                    q_norm: gated.then_some(&qn_w),
                    k_norm: gated.then_some(&kn_w),
                    norm_eps: eps,
                    positions: &positions,
                    rope,
                },
                &rows,
                &mut [c0, c1],
                &p,
                &mut out,
            )
            .map_err(|e| e.to_string())?;
            let mut proj = b.zeros(m, n_o);
            b.matmul_add(&wo_w, &out, &mut proj)
                .map_err(|e| e.to_string())?;
            let o = b.download(&out);
            let w = n_head * d;
            for (r, row) in rows.iter().enumerate() {
                got[row.seq].extend_from_slice(&o[r * w..(r + 1) * w]);
            }
            let pr = b.download(&proj);
            let want_pr: Vec<f32> = o
                .chunks_exact(w_in)
                .flat_map(|orow| {
                    wo_deq.chunks_exact(w_in).map(move |wrow| {
                        wrow.iter()
                            .zip(orow)
                            .map(|(a, x)| *a as f64 * *x as f64)
                            .sum::<f64>() as f32
                    })
                })
                .collect();
            // the product may quantize its activations (q8)
            check(
                &format!("attention_block gated {gated} o-projection, {m} rows"),
                &pr,
                &want_pr,
                1e-2,
            )?;
            products.extend_from_slice(&pr);
        }
        for s in 0..2 {
            check(
                &format!("attention_block gated {gated} seq {s}"),
                &got[s],
                &want[s],
                2e-3,
            )?;
            // the decode rows alone (the prompt rows dominate the whole-sequence error)
            let w = n_head * d;
            check(
                &format!("attention_block gated {gated} seq {s} decode rows"),
                &got[s][prompt[s] * w..],
                &want[s][prompt[s] * w..],
                2e-3,
            )?;
        }
        all.extend(got.into_iter().flatten());
    }
    Ok((all, products))
}

/// [`Backend::conv1d_qkv`] against naive host code: conv1d with the rolling state, silu, L2
/// norm of the q and k groups, split into q, k, v. Two sequences: prompts (several rows of one
/// sequence), decode steps of both together, then of one alone.
pub fn conv1d_qkv<B: Backend>(b: &B) -> Result<(), String> {
    conv1d_qkv_outputs(b).map(|_| ())
}

/// [`conv1d_qkv`], returning every output row it checked.
pub fn conv1d_qkv_outputs<B: Backend>(b: &B) -> Result<Vec<f32>, String> {
    let (kd, dv, group, d_conv, eps) = (64usize, 128usize, 32usize, 4usize, 1e-6f32);
    let ch = 2 * kd + dv;
    let sh = conv_shape(kd, dv, group, d_conv);
    let mut g = Lcg(21);
    let wconv = g.vec(ch * d_conv);
    let file = gguf_with(&[("conv", ch, d_conv, GgmlType::F32, &wconv)]);
    let wc = b.load_weight(&file, "conv").map_err(|e| e.to_string())?;
    let (prompt, steps) = ([5usize, 3], 6usize);
    let lens = [prompt[0] + steps, prompt[1] + steps / 2];
    let xs: Vec<Vec<f32>> = lens.iter().map(|&n| g.vec(n * ch)).collect();
    let want: Vec<Vec<f32>> = xs
        .iter()
        .zip(&lens)
        .map(|(x, &n)| conv_qkv_naive(x, n, &wconv, d_conv, 2 * kd, group, eps))
        .collect();
    let mut s0 = b.new_recurrent_state(&sh).map_err(|e| e.to_string())?;
    let mut s1 = b.new_recurrent_state(&sh).map_err(|e| e.to_string())?;
    let calls = conv_calls(prompt, steps);
    let mut got = [Vec::new(), Vec::new()];
    for call in &calls {
        let (rows, xb) = call_rows(call, &xs, ch);
        let m = rows.len();
        let (mut q, mut k, mut v) = (b.zeros(m, kd), b.zeros(m, kd), b.zeros(m, dv));
        b.conv1d_qkv(
            &up(b, &xb, m, ch)?,
            &wc,
            &rows,
            &mut [&mut s0, &mut s1],
            (2 * kd, group, eps),
            &[0, kd, 2 * kd],
            &mut [&mut q, &mut k, &mut v],
        )
        .map_err(|e| e.to_string())?;
        let (q, k, v) = (b.download(&q), b.download(&k), b.download(&v));
        for (r, row) in rows.iter().enumerate() {
            got[row.seq].extend_from_slice(&q[r * kd..(r + 1) * kd]);
            got[row.seq].extend_from_slice(&k[r * kd..(r + 1) * kd]);
            got[row.seq].extend_from_slice(&v[r * dv..(r + 1) * dv]);
        }
    }
    for s in 0..2 {
        check(&format!("conv1d_qkv seq {s}"), &got[s], &want[s], 1e-5)?;
    }
    Ok(got.into_iter().flatten().collect())
}

/// conv1d_qkv's naive host code for the `n` rows `x` `[n, ch]` of one sequence from a zero
/// window: conv1d, silu, L2 norm of the first `norm_cols` columns in groups of `group`.
fn conv_qkv_naive(
    x: &[f32],
    n: usize,
    wconv: &[f32],
    d_conv: usize,
    norm_cols: usize,
    group: usize,
    eps: f32,
) -> Vec<f32> {
    let ch = wconv.len() / d_conv;
    let mut out = Vec::with_capacity(n * ch);
    for t in 0..n {
        let mut row: Vec<f64> = (0..ch)
            .map(|c| {
                let s: f64 = (0..d_conv)
                    .map(|j| {
                        let src = t as i64 - (d_conv as i64 - 1) + j as i64;
                        if src < 0 {
                            0.0
                        } else {
                            wconv[c * d_conv + j] as f64 * x[src as usize * ch + c] as f64
                        }
                    })
                    .sum();
                s / (1.0 + (-s).exp())
            })
            .collect();
        for grp in row[..norm_cols].chunks_exact_mut(group) {
            let ss: f64 = grp.iter().map(|v| v * v).sum();
            let sc = 1.0 / (ss + eps as f64).sqrt();
            grp.iter_mut().for_each(|v| *v *= sc);
        }
        out.extend(row.iter().map(|&v| v as f32));
    }
    out
}

/// The calls of the conv checks, each a list of (sequence, first position, end): both
/// sequences' prompts in one call, then `steps` decode steps of sequence 0, sequence 1 beside
/// it in the first half.
fn conv_calls(prompt: [usize; 2], steps: usize) -> Vec<Vec<(usize, usize, usize)>> {
    let mut calls: Vec<Vec<(usize, usize, usize)>> =
        vec![vec![(0, 0, prompt[0]), (1, 0, prompt[1])]];
    for t in 0..steps {
        let mut c = vec![(0, prompt[0] + t, prompt[0] + t + 1)];
        if t < steps / 2 {
            c.push((1, prompt[1] + t, prompt[1] + t + 1));
        }
        calls.push(c);
    }
    calls
}

/// The recurrent state of the conv checks: q|k of `kd` and v of `dv` channels in heads of `group`.
fn conv_shape(kd: usize, dv: usize, group: usize, d_conv: usize) -> RecurrentShape {
    RecurrentShape {
        d_conv,
        conv_channels: 2 * kd + dv,
        n_k_heads: kd / group,
        n_v_heads: dv / group,
        d_k: group,
        d_v: group,
    }
}

/// One call of [`conv_calls`]: its batch rows and their inputs, row t of sequence s being
/// `xs[s][t * width..]`.
fn call_rows(
    call: &[(usize, usize, usize)],
    xs: &[Vec<f32>],
    width: usize,
) -> (Vec<Row>, Vec<f32>) {
    let rows = call
        .iter()
        .flat_map(|&(s, a, e)| (a..e).map(move |pos| Row { seq: s, pos }))
        .collect();
    let x = call
        .iter()
        .flat_map(|&(s, a, e)| xs[s][a * width..e * width].to_vec())
        .collect();
    (rows, x)
}

/// [`Backend::in_proj_conv1d_qkv`] against naive host code: the products of an f32 q|k|v
/// projection and two small f32 gate matrices (alpha / beta of 4 rows), then the conv chain of
/// the first product, over [`conv1d_qkv`]'s calls. Returns the gate products and the conv
/// outputs of every call, in call order.
pub fn in_proj_conv1d_qkv<B: Backend>(b: &B) -> Result<Vec<f32>, String> {
    // channels and normed channels in whole 256s (a device may then run the gate products in
    // the conv's launch), norm groups of 32
    let (kd, dv, group, d_conv, eps, e, nh) = (128usize, 256usize, 32usize, 4usize, 1e-6f32, 96, 4);
    let ch = 2 * kd + dv;
    let sh = conv_shape(kd, dv, group, d_conv);
    let mut g = Lcg(23);
    let (wconv, wqkv, wa, wb) = (
        g.vec(ch * d_conv),
        g.vec(ch * e),
        g.vec(nh * e),
        g.vec(nh * e),
    );
    let file = gguf_with(&[
        ("conv", ch, d_conv, GgmlType::F32, &wconv),
        ("qkv", ch, e, GgmlType::F32, &wqkv),
        ("a", nh, e, GgmlType::F32, &wa),
        ("b", nh, e, GgmlType::F32, &wb),
    ]);
    let load = |n: &str| b.load_weight(&file, n).map_err(|e| e.to_string());
    let (lc, lq, la, lb) = (load("conv")?, load("qkv")?, load("a")?, load("b")?);
    let (prompt, steps) = ([5usize, 3], 6usize);
    let lens = [prompt[0] + steps, prompt[1] + steps / 2];
    let hs: Vec<Vec<f32>> = lens.iter().map(|&n| g.vec(n * e)).collect();
    // w [r, e] times every row of h [n, e], in f64
    let prod = |w: &[f32], h: &[f32], r: usize| -> Vec<f32> {
        h.chunks_exact(e)
            .flat_map(|x| {
                (0..r).map(move |i| {
                    let row = &w[i * e..(i + 1) * e];
                    row.iter()
                        .zip(x)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>() as f32
                })
            })
            .collect()
    };
    let want_conv: Vec<Vec<f32>> = hs
        .iter()
        .zip(&lens)
        .map(|(h, &n)| conv_qkv_naive(&prod(&wqkv, h, ch), n, &wconv, d_conv, 2 * kd, group, eps))
        .collect();
    let mut s0 = b.new_recurrent_state(&sh).map_err(|e| e.to_string())?;
    let mut s1 = b.new_recurrent_state(&sh).map_err(|e| e.to_string())?;
    let (mut all, mut got_conv, mut got_ab, mut want_ab) =
        (Vec::new(), [Vec::new(), Vec::new()], Vec::new(), Vec::new());
    for call in &conv_calls(prompt, steps) {
        let (rows, hb) = call_rows(call, &hs, e);
        let m = rows.len();
        let (mut pq, mut pa, mut pb) = (b.zeros(m, ch), b.zeros(m, nh), b.zeros(m, nh));
        let (mut q, mut k, mut v) = (b.zeros(m, kd), b.zeros(m, kd), b.zeros(m, dv));
        b.in_proj_conv1d_qkv(
            &up(b, &hb, m, e)?,
            &[&lq, &la, &lb],
            &mut [&mut pq, &mut pa, &mut pb],
            &lc,
            &rows,
            &mut [&mut s0, &mut s1],
            (2 * kd, group, eps),
            &[0, kd, 2 * kd],
            &mut [&mut q, &mut k, &mut v],
        )
        .map_err(|e| e.to_string())?;
        let (ga, gb) = (b.download(&pa), b.download(&pb));
        want_ab.extend(prod(&wa, &hb, nh));
        want_ab.extend(prod(&wb, &hb, nh));
        got_ab.extend_from_slice(&ga);
        got_ab.extend_from_slice(&gb);
        all.extend(ga.into_iter().chain(gb));
        let (q, k, v) = (b.download(&q), b.download(&k), b.download(&v));
        for (r, row) in rows.iter().enumerate() {
            for (t, w) in [(&q, kd), (&k, kd), (&v, dv)] {
                got_conv[row.seq].extend_from_slice(&t[r * w..(r + 1) * w]);
                all.extend_from_slice(&t[r * w..(r + 1) * w]);
            }
        }
    }
    check("in_proj_conv1d_qkv gate products", &got_ab, &want_ab, 1e-5)?;
    for s in 0..2 {
        check(
            &format!("in_proj_conv1d_qkv conv seq {s}"),
            &got_conv[s],
            &want_conv[s],
            1e-4,
        )?;
    }
    Ok(all)
}

/// Token-by-token gated delta rule of one sequence (the documented recurrence), f64 state.
#[allow(clippy::too_many_arguments)]
pub fn naive_delta_rule(
    sh: &RecurrentShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    gg: &[f32],
    beta: &[f32],
    n: usize,
    state: &mut [f64],
) -> Vec<f32> {
    let (dk, dv, hk, hv) = (sh.d_k, sh.d_v, sh.n_k_heads, sh.n_v_heads);
    let mut out = vec![0.0f32; n * hv * dv];
    let scale = 1.0 / (dk as f64).sqrt();
    for t in 0..n {
        for h in 0..hv {
            let kh = h % hk;
            let qv = &q[t * hk * dk + kh * dk..][..dk];
            let kv = &k[t * hk * dk + kh * dk..][..dk];
            let s = &mut state[h * dv * dk..(h + 1) * dv * dk];
            let decay = (gg[t * hv + h] as f64).exp();
            for j in 0..dv {
                let row = &mut s[j * dk..(j + 1) * dk];
                row.iter_mut().for_each(|x| *x *= decay);
                let sk: f64 = row.iter().zip(kv).map(|(a, b)| a * *b as f64).sum();
                let u = beta[t * hv + h] as f64 * (v[t * hv * dv + h * dv + j] as f64 - sk);
                row.iter_mut()
                    .zip(kv)
                    .for_each(|(a, b)| *a += u * *b as f64);
                out[t * hv * dv + h * dv + j] =
                    (row.iter().zip(qv).map(|(a, b)| a * *b as f64).sum::<f64>() * scale) as f32;
            }
        }
    }
    out
}

/// conv1d across calls and sequences, delta_rule_gates, and the delta rule over a long
/// prefill (chunked) then single steps, two sequences in one batch.
pub fn delta_net<B: Backend>(b: &B) -> Result<(), String> {
    let mut g = Lcg(5);
    let sh = RecurrentShape {
        d_conv: 4,
        conv_channels: 0,
        n_k_heads: 2,
        n_v_heads: 4,
        d_k: 16,
        d_v: 16,
    };
    // conv1d: 7 channels, seq lens 70 and 3, in two calls (prefill then one step each)
    let ch = 7;
    let csh = RecurrentShape {
        conv_channels: ch,
        ..sh
    };
    let wconv = g.vec(ch * 4);
    let dtb = g.vec(4);
    let a: Vec<f32> = g.vec(4).iter().map(|x| -(x.abs() + 0.1)).collect();
    let file = gguf_with(&[
        ("conv", ch, 4, GgmlType::F32, &wconv),
        ("dt", 1, 4, GgmlType::F32, &dtb),
        ("a", 1, 4, GgmlType::F32, &a),
    ]);
    let wc = b.load_weight(&file, "conv").map_err(|e| e.to_string())?;
    let lens = [71usize, 4];
    let xs: Vec<Vec<f32>> = lens.iter().map(|&n| g.vec(n * ch)).collect();
    let want: Vec<Vec<f32>> = xs
        .iter()
        .zip(&lens)
        .map(|(x, &n)| {
            (0..n)
                .flat_map(|t| {
                    (0..ch)
                        .map(|c| {
                            (0..4)
                                .map(|j| {
                                    let src = t as i64 - 3 + j as i64;
                                    if src < 0 {
                                        0.0
                                    } else {
                                        wconv[c * 4 + j] as f64 * x[src as usize * ch + c] as f64
                                    }
                                })
                                .sum::<f64>() as f32
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .collect();
    let mut s0 = b.new_recurrent_state(&csh).map_err(|e| e.to_string())?;
    let mut s1 = b.new_recurrent_state(&csh).map_err(|e| e.to_string())?;
    let mut got = [Vec::new(), Vec::new()];
    for ranges in [[(0usize, 70usize), (0, 3)], [(70, 71), (3, 4)]] {
        let rows: Vec<Row> = ranges
            .iter()
            .enumerate()
            .flat_map(|(s, &(a, e))| (a..e).map(move |pos| Row { seq: s, pos }))
            .collect();
        let xb: Vec<f32> = ranges
            .iter()
            .enumerate()
            .flat_map(|(s, &(a, e))| xs[s][a * ch..e * ch].to_vec())
            .collect();
        let mut out = b.zeros(rows.len(), ch);
        b.conv1d(
            &up(b, &xb, rows.len(), ch)?,
            &wc,
            &rows,
            &mut [&mut s0, &mut s1],
            &mut out,
        )
        .map_err(|e| e.to_string())?;
        let o = b.download(&out);
        for (r, row) in rows.iter().enumerate() {
            got[row.seq].extend_from_slice(&o[r * ch..(r + 1) * ch]);
        }
    }
    for s in 0..2 {
        check(&format!("conv1d seq {s}"), &got[s], &want[s], 1e-6)?;
    }

    // gates
    let n = 6;
    let al = g.vec(n * 4);
    let be = g.vec(n * 4);
    let mut at = up(b, &al, n, 4)?;
    let mut bt = up(b, &be, n, 4)?;
    let dt = b.load_weight(&file, "dt").map_err(|e| e.to_string())?;
    let aw = b.load_weight(&file, "a").map_err(|e| e.to_string())?;
    b.delta_rule_gates(&mut at, &mut bt, &dt, &aw)
        .map_err(|e| e.to_string())?;
    let want_g: Vec<f32> = (0..n * 4)
        .map(|i| ((1.0 + ((al[i] + dtb[i % 4]) as f64).exp()).ln() * a[i % 4] as f64) as f32)
        .collect();
    let want_b: Vec<f32> = be
        .iter()
        .map(|&x| (1.0 / (1.0 + (-(x as f64)).exp())) as f32)
        .collect();
    check("delta_rule_gates g", &b.download(&at), &want_g, 1e-6)?;
    check("delta_rule_gates beta", &b.download(&bt), &want_b, 1e-6)?;

    // delta rule: seq0 prefill 70 (chunked) + 1 step, seq1 3 + 1
    let l2 = |v: &mut Vec<f32>| {
        for c in v.chunks_exact_mut(16) {
            let s = c.iter().map(|x| x * x).sum::<f32>().sqrt();
            c.iter_mut().for_each(|x| *x /= s);
        }
    };
    let mut seqs = Vec::new();
    for &n in &lens {
        let (mut q, mut k) = (g.vec(n * 32), g.vec(n * 32));
        l2(&mut q);
        l2(&mut k);
        let v = g.vec(n * 64);
        let gg: Vec<f32> = g.vec(n * 4).iter().map(|x| -x.abs() * 0.3).collect();
        let bb: Vec<f32> = g.vec(n * 4).iter().map(|x| 0.5 + 0.5 * x).collect();
        seqs.push((q, k, v, gg, bb));
    }
    let want: Vec<Vec<f32>> = seqs
        .iter()
        .zip(&lens)
        .map(|((q, k, v, gg, bb), &n)| {
            naive_delta_rule(&sh, q, k, v, gg, bb, n, &mut vec![0.0; 4 * 16 * 16])
        })
        .collect();
    let mut s0 = b.new_recurrent_state(&sh).map_err(|e| e.to_string())?;
    let mut s1 = b.new_recurrent_state(&sh).map_err(|e| e.to_string())?;
    let mut got = [Vec::new(), Vec::new()];
    let mut snapshot = None;
    for (step, ranges) in [[(0usize, 70usize), (0, 3)], [(70, 71), (3, 4)]]
        .iter()
        .enumerate()
    {
        let rows: Vec<Row> = ranges
            .iter()
            .enumerate()
            .flat_map(|(s, &(a, e))| (a..e).map(move |pos| Row { seq: s, pos }))
            .collect();
        let cat = |field: usize, w: usize| -> Vec<f32> {
            let mut out = Vec::new();
            for (s, &(a, e)) in ranges.iter().enumerate() {
                let (q, k, v, gg, bb) = &seqs[s];
                let d: &[f32] = [q, k, v, gg, bb][field];
                out.extend_from_slice(&d[a * w..e * w]);
            }
            out
        };
        let m = rows.len();
        let q = up(b, &cat(0, 32), m, 32)?;
        let k = up(b, &cat(1, 32), m, 32)?;
        let v = up(b, &cat(2, 64), m, 64)?;
        let gt = up(b, &cat(3, 4), m, 4)?;
        let bt = up(b, &cat(4, 4), m, 4)?;
        if step == 1 {
            snapshot = Some(s0.clone());
        }
        let mut out = b.zeros(m, 64);
        b.delta_rule(
            &q,
            &k,
            &v,
            &gt,
            &bt,
            &rows,
            &mut [&mut s0, &mut s1],
            &mut out,
        )
        .map_err(|e| e.to_string())?;
        let o = b.download(&out);
        for (r, row) in rows.iter().enumerate() {
            got[row.seq].extend_from_slice(&o[r * 64..(r + 1) * 64]);
        }
        if step == 1 {
            // Restoring the snapshot and replaying the step gives the same output.
            let mut again = snapshot.take().expect("snapshot");
            let mut dummy = b.new_recurrent_state(&sh).map_err(|e| e.to_string())?;
            let mut out2 = b.zeros(m, 64);
            b.delta_rule(
                &q,
                &k,
                &v,
                &gt,
                &bt,
                &rows,
                &mut [&mut again, &mut dummy],
                &mut out2,
            )
            .map_err(|e| e.to_string())?;
            check(
                "delta_rule replay from snapshot",
                &b.download(&out2)[..64],
                &o[..64],
                1e-6,
            )?;
        }
    }
    for s in 0..2 {
        check(&format!("delta_rule seq {s}"), &got[s], &want[s], 1e-5)?;
    }
    Ok(())
}

/// The tail of a Gated DeltaNet layer, checked against naive f64 code: `delta_rule_gated` on the
/// raw gate projections, Qwen3.5's gated group norm, then the out-projection added to the
/// residual (`matmul_add`, a Q8_0 weight).
pub fn delta_tail<B: Backend>(b: &B) -> Result<(), String> {
    delta_tail_outputs(b).map(|_| ())
}

/// [`delta_tail`]'s outputs, every call's normed rows then its residual rows, for comparing
/// two paths of one backend bit for bit. Two sequences: a prompt of 40 and one of 3 rows in one
/// call (the first long enough for a chunked form), two steps of both, two of the first alone.
pub fn delta_tail_outputs<B: Backend>(b: &B) -> Result<Vec<f32>, String> {
    let mut g = Lcg(11);
    let sh = RecurrentShape {
        d_conv: 4,
        conv_channels: 0,
        n_k_heads: 2,
        n_v_heads: 4,
        d_k: 32,
        d_v: 32,
    };
    let (hk, hv, dk, dv) = (sh.n_k_heads, sh.n_v_heads, sh.d_k, sh.d_v);
    let (kd, inner, e, eps) = (hk * dk, hv * dv, 48usize, 1e-6f32);
    let dtb = g.vec(hv);
    let a: Vec<f32> = g.vec(hv).iter().map(|x| -(x.abs() + 0.1)).collect();
    let normw: Vec<f32> = g.vec(dv).iter().map(|x| 1.0 + 0.5 * x).collect();
    let wout = g.vec(e * inner);
    let file = gguf_with(&[
        ("dt", 1, hv, GgmlType::F32, &dtb),
        ("a", 1, hv, GgmlType::F32, &a),
        ("norm", 1, dv, GgmlType::F32, &normw),
        ("out", e, inner, GgmlType::Q8_0, &wout),
    ]);
    let load = |name: &str| b.load_weight(&file, name).map_err(|e| e.to_string());
    let (dt_w, a_w, norm_w, out_w) = (load("dt")?, load("a")?, load("norm")?, load("out")?);
    let wdeq = dequantized(GgmlType::Q8_0, &wout, inner);

    // per sequence and token: q, k (L2-normed per head), v, raw alpha and beta, z, residual x
    struct Seq {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        al: Vec<f32>,
        be: Vec<f32>,
        z: Vec<f32>,
        x: Vec<f32>,
    }
    let calls: [&[(usize, usize)]; 5] = [
        &[(0, 40), (1, 3)],
        &[(0, 1), (1, 1)],
        &[(0, 1), (1, 1)],
        &[(0, 1)],
        &[(0, 1)],
    ];
    let lens = [44usize, 5];
    let seqs: Vec<Seq> = lens
        .iter()
        .map(|&n| {
            let mut unit = |w: usize| {
                let mut v = g.vec(n * w);
                for c in v.chunks_exact_mut(dk) {
                    let s = c.iter().map(|x| x * x).sum::<f32>().sqrt();
                    c.iter_mut().for_each(|x| *x /= s);
                }
                v
            };
            let (q, k) = (unit(kd), unit(kd));
            Seq {
                q,
                k,
                v: g.vec(n * inner),
                al: g.vec(n * hv),
                be: g.vec(n * hv),
                z: g.vec(n * inner),
                x: g.vec(n * e),
            }
        })
        .collect();

    // naive: the gates, the rule over each whole sequence, the gated norm, the projection
    let want: Vec<(Vec<f32>, Vec<f32>)> = seqs
        .iter()
        .zip(&lens)
        .map(|(s, &n)| {
            let gg: Vec<f32> = (0..n * hv)
                .map(|i| {
                    let x = (s.al[i] + dtb[i % hv]) as f64;
                    ((1.0 + x.exp()).ln() * a[i % hv] as f64) as f32
                })
                .collect();
            let bb: Vec<f32> =
                s.be.iter()
                    .map(|&x| (1.0 / (1.0 + (-(x as f64)).exp())) as f32)
                    .collect();
            let mut st = vec![0.0f64; hv * dv * dk];
            let o = naive_delta_rule(&sh, &s.q, &s.k, &s.v, &gg, &bb, n, &mut st);
            let mut normed = vec![0.0f32; n * inner];
            for (gi, (og, ng)) in o
                .chunks_exact(dv)
                .zip(normed.chunks_exact_mut(dv))
                .enumerate()
            {
                let ms = og.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / dv as f64;
                let r = 1.0 / (ms + eps as f64).sqrt();
                for (j, y) in ng.iter_mut().enumerate() {
                    let zv = s.z[gi * dv + j] as f64;
                    *y = (og[j] as f64 * r * normw[j] as f64 * zv / (1.0 + (-zv).exp())) as f32;
                }
            }
            let mut x = s.x.clone();
            for t in 0..n {
                for (r, xv) in x[t * e..(t + 1) * e].iter_mut().enumerate() {
                    let dot: f64 = wdeq[r * inner..(r + 1) * inner]
                        .iter()
                        .zip(&normed[t * inner..(t + 1) * inner])
                        .map(|(w, y)| *w as f64 * *y as f64)
                        .sum();
                    *xv = (*xv as f64 + dot) as f32;
                }
            }
            (normed, x)
        })
        .collect();

    let mut states = Vec::new();
    for _ in 0..2 {
        states.push(b.new_recurrent_state(&sh).map_err(|e| e.to_string())?);
    }
    let mut done = [0usize; 2];
    let mut got = [(Vec::new(), Vec::new()), (Vec::new(), Vec::new())];
    let mut outputs = Vec::new();
    for call in calls {
        let mut rows = Vec::new();
        let cat = |f: &dyn Fn(&Seq) -> &Vec<f32>, w: usize| -> Vec<f32> {
            call.iter()
                .flat_map(|&(s, n)| f(&seqs[s])[done[s] * w..(done[s] + n) * w].to_vec())
                .collect()
        };
        let m: usize = call.iter().map(|&(_, n)| n).sum();
        let q = up(b, &cat(&|s| &s.q, kd), m, kd)?;
        let k = up(b, &cat(&|s| &s.k, kd), m, kd)?;
        let v = up(b, &cat(&|s| &s.v, inner), m, inner)?;
        let mut al = up(b, &cat(&|s| &s.al, hv), m, hv)?;
        let mut be = up(b, &cat(&|s| &s.be, hv), m, hv)?;
        let z = up(b, &cat(&|s| &s.z, inner), m, inner)?;
        let mut x = up(b, &cat(&|s| &s.x, e), m, e)?;
        for &(s, n) in call {
            rows.extend((done[s]..done[s] + n).map(|pos| Row { seq: s, pos }));
        }
        let mut o = b.zeros(m, inner);
        let mut st: Vec<&mut B::RecurrentState> = states.iter_mut().collect();
        b.delta_rule_gated(
            &q,
            &k,
            &v,
            &mut al,
            &mut be,
            (&dt_w, &a_w),
            &rows,
            &mut st,
            &mut o,
        )
        .map_err(|e| e.to_string())?;
        b.gated_rms_norm(&mut o, &norm_w, &z, eps)
            .map_err(|e| e.to_string())?;
        b.matmul_add(&out_w, &o, &mut x)
            .map_err(|e| e.to_string())?;
        let (on, xn) = (b.download(&o), b.download(&x));
        for (r, row) in rows.iter().enumerate() {
            got[row.seq]
                .0
                .extend_from_slice(&on[r * inner..(r + 1) * inner]);
            got[row.seq].1.extend_from_slice(&xn[r * e..(r + 1) * e]);
        }
        outputs.extend_from_slice(&on);
        outputs.extend_from_slice(&xn);
        for &(s, n) in call {
            done[s] += n;
        }
    }
    for s in 0..2 {
        check(
            &format!("delta tail norm, seq {s}"),
            &got[s].0,
            &want[s].0,
            1e-4,
        )?;
        // the product quantizes its activations (q8) on some backends
        check(
            &format!("delta tail residual, seq {s}"),
            &got[s].1,
            &want[s].1,
            1e-2,
        )?;
    }
    Ok(outputs)
}
