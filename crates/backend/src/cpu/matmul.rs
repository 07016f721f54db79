//! Quantized matrix products and embedding lookup, reading weights in place.
//!
//! The fast path is `quant::matmul` (threaded, activations quantized per row to the weight's
//! paired dot format, weights read once per call for all rows). `matmul_reference` dequantizes
//! each weight row to f32 and accumulates in f64: the oracle the fast path is tested against.

use super::{check_shape, shape_err, CpuTensor, CpuWeight};
use crate::BackendError;

fn check_matmul(w: &CpuWeight, x: &CpuTensor, out: &CpuTensor) -> Result<(), BackendError> {
    if x.cols != w.cols {
        return Err(shape_err(
            "matmul",
            format!("x has {} columns, weight rows have {}", x.cols, w.cols),
        ));
    }
    check_shape("matmul", out, x.rows, w.rows)
}

/// `out = x · wᵀ`. w: `[m, k]`, x: `[n, k]`, out: `[n, m]`.
pub fn matmul(w: &CpuWeight, x: &CpuTensor, out: &mut CpuTensor) -> Result<(), BackendError> {
    check_matmul(w, x, out)?;
    if x.rows == 0 {
        return Ok(());
    }
    if !quant::dot::supports(w.ty) {
        return Err(BackendError::UnsupportedType {
            op: "matmul",
            ty: w.ty,
        });
    }
    quant::matmul(
        w.ty,
        w.bytes(),
        w.rows,
        w.cols,
        &x.data,
        x.rows,
        &mut out.data,
    );
    Ok(())
}

/// [`matmul`] of one token on the caller and `team`'s helpers (decode). x: `[1, k]`.
pub fn matvec_on(
    team: &quant::Team,
    w: &CpuWeight,
    x: &CpuTensor,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    check_matmul(w, x, out)?;
    if x.rows != 1 {
        return Err(shape_err("matvec", format!("{} rows, want 1", x.rows)));
    }
    if !quant::dot::supports(w.ty) {
        return Err(BackendError::UnsupportedType {
            op: "matmul",
            ty: w.ty,
        });
    }
    quant::matvec_on(
        team,
        w.ty,
        w.bytes(),
        w.rows,
        w.cols,
        &x.data,
        &mut out.data,
    );
    Ok(())
}

/// [`matmul`] with `w` already repacked (`quant::packed`), on `team` when given (else the
/// current rayon pool). x: `[n, k]`, out: `[n, m]`.
pub fn matmul_packed(
    w: &quant::PackedMatrix,
    team: Option<&quant::Team>,
    x: &CpuTensor,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    let (rows, cols) = w.shape();
    if x.cols != cols {
        return Err(shape_err(
            "matmul",
            format!("x has {} columns, weight rows have {cols}", x.cols),
        ));
    }
    check_shape("matmul", out, x.rows, rows)?;
    w.matmul(team, &x.data, x.rows, &mut out.data);
    Ok(())
}

/// Slow reference of [`matmul`]: dequantize each weight row, dot in f64.
pub fn matmul_reference(
    w: &CpuWeight,
    x: &CpuTensor,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    check_matmul(w, x, out)?;
    let row_bytes = w.bytes().len() / w.rows.max(1);
    let mut wrow = vec![0.0f32; w.cols];
    for r in 0..w.rows {
        let src = &w.bytes()[r * row_bytes..(r + 1) * row_bytes];
        quant::dequantize_row(w.ty, src, &mut wrow)
            .map_err(|e| BackendError::Quant(e.to_string()))?;
        for t in 0..x.rows {
            let dot: f64 = x
                .row(t)
                .iter()
                .zip(&wrow)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            out.data[t * w.rows + r] = dot as f32;
        }
    }
    Ok(())
}

/// `out[r] = table[tokens[r]]`, dequantizing only the rows used. table: `[n_vocab, n_embd]`.
pub fn embed(table: &CpuWeight, tokens: &[u32], out: &mut CpuTensor) -> Result<(), BackendError> {
    check_shape("embed", out, tokens.len(), table.cols)?;
    let bytes = table.bytes();
    let row_bytes = bytes.len() / table.rows.max(1);
    for (i, &t) in tokens.iter().enumerate() {
        let t = t as usize;
        if t >= table.rows {
            return Err(BackendError::TokenOutOfRange {
                token: t as u32,
                n_vocab: table.rows,
            });
        }
        let dst = &mut out.data[i * table.cols..(i + 1) * table.cols];
        quant::dequantize_row(table.ty, &bytes[t * row_bytes..(t + 1) * row_bytes], dst)
            .map_err(|e| BackendError::Quant(e.to_string()))?;
    }
    Ok(())
}
