//! CPU references for the GPU kernels, in f64 over `quant::dequantize_row`: what the tests and
//! `redline selftest` compare against.

use crate::error::{CudaError, Result};
use gguf::GgmlType;

/// x as the q8_1 activation quantizer of kernels/matvec_quant.cu produces it, dequantized:
/// per 32 elements d = amax / 127, q = round-half-even(x / d), value d * q (all in f32).
pub fn q8_1_roundtrip(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (xs, os) in x.chunks(32).zip(out.chunks_mut(32)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        for (o, &v) in os.iter_mut().zip(xs) {
            *o = if amax == 0.0 {
                0.0
            } else {
                d * (v / d).round_ties_even()
            };
        }
    }
    out
}

/// y = W x in f64 with W dequantized by `quant::dequantize_row`. w: [rows, cols] in GGUF
/// layout; x: [n_tokens, cols]; returns ([n_tokens, rows] values, [n_tokens, rows] sums of
/// |w * x| for scaling tolerances). With `quantize_x`, x goes through `q8_1_roundtrip` first,
/// exactly as the GPU block-format path does.
pub fn matvec_reference(
    ty: GgmlType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    quantize_x: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    if rows == 0 || !w.len().is_multiple_of(rows) || x.len() < n_tokens * cols {
        return Err(CudaError::Shape(format!(
            "reference: {} weight bytes, {rows} rows, x {}",
            w.len(),
            x.len()
        )));
    }
    let rb = w.len() / rows;
    let mut wf = vec![0f32; cols];
    let xs: Vec<Vec<f32>> = (0..n_tokens)
        .map(|t| {
            let xt = &x[t * cols..(t + 1) * cols];
            if quantize_x {
                q8_1_roundtrip(xt)
            } else {
                xt.to_vec()
            }
        })
        .collect();
    let mut y = vec![0f64; n_tokens * rows];
    let mut mag = vec![0f64; n_tokens * rows];
    for r in 0..rows {
        quant::dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut wf)
            .map_err(|e| CudaError::Shape(format!("reference dequantize: {e}")))?;
        for (t, xt) in xs.iter().enumerate() {
            let (mut s, mut m) = (0f64, 0f64);
            for (&a, &b) in wf.iter().zip(xt) {
                let p = a as f64 * b as f64;
                s += p;
                m += p.abs();
            }
            y[t * rows + r] = s;
            mag[t * rows + r] = m;
        }
    }
    Ok((y, mag))
}
