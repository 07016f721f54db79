//! Row-wise and element-wise ops: norms, activations, residual adds, column copies.
//!
//! These are memory-bound and simple enough that the straightforward loop is both the
//! reference and the implementation, except the activations (silu, sigmoid), whose `exp`
//! has a vector path in `quant::vmath` (the reference backend keeps libm's).

use quant::vmath;
use quant::Isa;
use rayon::prelude::*;

use super::{check_shape, shape_err, CpuTensor};
use crate::{BackendError, ColumnCopy};

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn check_groups(op: &'static str, cols: usize, group: usize) -> Result<(), BackendError> {
    if group == 0 || !cols.is_multiple_of(group) {
        return Err(shape_err(
            op,
            format!("{cols} columns are not whole groups of {group}"),
        ));
    }
    Ok(())
}

/// x: `[n, cols]`, bias: `[cols]`.
pub fn add_bias(x: &mut CpuTensor, bias: &[f32]) -> Result<(), BackendError> {
    if bias.len() != x.cols {
        return Err(shape_err(
            "add_bias",
            format!("bias of {} for {} columns", bias.len(), x.cols),
        ));
    }
    for row in x.data.chunks_exact_mut(x.cols) {
        row.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
    }
    Ok(())
}

/// `x += y`.
pub fn add(x: &mut CpuTensor, y: &CpuTensor) -> Result<(), BackendError> {
    check_shape("add", y, x.rows, x.cols)?;
    x.data.iter_mut().zip(&y.data).for_each(|(a, b)| *a += b);
    Ok(())
}

/// RMS norm of one group, accumulated in f64 (the sums are short; accuracy is cheap here).
#[inline]
fn rms_scale(v: &[f32], eps: f32) -> f32 {
    let ss: f64 = v.iter().map(|&a| (a as f64) * (a as f64)).sum();
    (1.0 / (ss / v.len() as f64 + eps as f64).sqrt()) as f32
}

/// In place, over groups of `w.len()` columns. x: `[n, g * w.len()]`.
pub fn rms_norm(x: &mut CpuTensor, w: &[f32], eps: f32) -> Result<(), BackendError> {
    check_groups("rms_norm", x.cols, w.len())?;
    let norm = |g: &mut [f32]| {
        let s = rms_scale(g, eps);
        g.iter_mut().zip(w).for_each(|(a, &b)| *a = *a * s * b);
    };
    if x.rows <= 1 {
        // Decode: one row, on the calling thread (no pool hand-off for a few µs of work).
        x.data.chunks_mut(w.len()).for_each(norm);
    } else {
        x.data.par_chunks_mut(w.len()).for_each(norm);
    }
    Ok(())
}

/// `x = x / sqrt(sum(x²) + eps)` over groups of `group` within columns `[col0, col0 + len)`.
pub fn l2_norm(
    x: &mut CpuTensor,
    col0: usize,
    len: usize,
    group: usize,
    eps: f32,
) -> Result<(), BackendError> {
    check_groups("l2_norm", len, group)?;
    if col0 + len > x.cols {
        return Err(shape_err(
            "l2_norm",
            format!("columns {col0}..{} of {}", col0 + len, x.cols),
        ));
    }
    for row in x.data.chunks_exact_mut(x.cols) {
        for g in row[col0..col0 + len].chunks_exact_mut(group) {
            let ss: f64 = g.iter().map(|&a| (a as f64) * (a as f64)).sum();
            let s = (1.0 / (ss + eps as f64).sqrt()) as f32;
            g.iter_mut().for_each(|a| *a *= s);
        }
    }
    Ok(())
}

/// `out = silu(gate) * up`; `isa` picks the vector path (`quant::vmath`) or the scalar loop.
pub fn swiglu(
    isa: Isa,
    gate: &CpuTensor,
    up: &CpuTensor,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    check_shape("swiglu", up, gate.rows, gate.cols)?;
    check_shape("swiglu", out, gate.rows, gate.cols)?;
    vmath::silu_mul_with(isa, &gate.data, &up.data, &mut out.data);
    Ok(())
}

/// `x = silu(x)`.
pub fn silu_in_place(isa: Isa, x: &mut CpuTensor) {
    vmath::silu_in_place_with(isa, &mut x.data);
}

/// `x *= sigmoid(gate)`.
pub fn mul_sigmoid(isa: Isa, x: &mut CpuTensor, gate: &CpuTensor) -> Result<(), BackendError> {
    check_shape("mul_sigmoid", gate, x.rows, x.cols)?;
    vmath::mul_sigmoid_with(isa, &mut x.data, &gate.data);
    Ok(())
}

/// `x = rms_norm(x) * w * silu(z)` over groups of `w.len()`.
pub fn gated_rms_norm(
    isa: Isa,
    x: &mut CpuTensor,
    w: &[f32],
    z: &CpuTensor,
    eps: f32,
) -> Result<(), BackendError> {
    check_groups("gated_rms_norm", x.cols, w.len())?;
    check_shape("gated_rms_norm", z, x.rows, x.cols)?;
    let mut gate = vec![0.0f32; w.len()];
    for (g, zg) in x
        .data
        .chunks_exact_mut(w.len())
        .zip(z.data.chunks_exact(w.len()))
    {
        let s = rms_scale(g, eps);
        gate.copy_from_slice(zg);
        vmath::silu_in_place_with(isa, &mut gate);
        for ((a, &b), &sz) in g.iter_mut().zip(w).zip(&gate) {
            *a = *a * s * b * sz;
        }
    }
    Ok(())
}

/// See [`ColumnCopy`].
pub fn copy_cols(src: &CpuTensor, dst: &mut CpuTensor, c: &ColumnCopy) -> Result<(), BackendError> {
    if src.rows != dst.rows {
        return Err(shape_err(
            "copy_cols",
            format!("{} source rows, {} destination rows", src.rows, dst.rows),
        ));
    }
    if c.n_blocks == 0 {
        return Ok(());
    }
    let last = c.n_blocks - 1;
    if c.src_offset + last * c.src_stride + c.width > src.cols
        || c.dst_offset + last * c.dst_stride + c.width > dst.cols
    {
        return Err(shape_err(
            "copy_cols",
            format!(
                "{c:?} out of range for {} -> {} columns",
                src.cols, dst.cols
            ),
        ));
    }
    for (s, d) in src
        .data
        .chunks_exact(src.cols)
        .zip(dst.data.chunks_exact_mut(dst.cols))
    {
        for b in 0..c.n_blocks {
            let so = c.src_offset + b * c.src_stride;
            let dof = c.dst_offset + b * c.dst_stride;
            d[dof..dof + c.width].copy_from_slice(&s[so..so + c.width]);
        }
    }
    Ok(())
}

/// `out[i] = x[rows[i]]`.
pub fn get_rows(x: &CpuTensor, rows: &[usize], out: &mut CpuTensor) -> Result<(), BackendError> {
    check_shape("get_rows", out, rows.len(), x.cols)?;
    for (i, &r) in rows.iter().enumerate() {
        if r >= x.rows {
            return Err(shape_err("get_rows", format!("row {r} of {}", x.rows)));
        }
        out.data[i * x.cols..(i + 1) * x.cols].copy_from_slice(x.row(r));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_groups_match_formula() {
        let mut x = CpuTensor::from_vec(1, 4, vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        rms_norm(&mut x, &[1.0, 2.0], 0.0).unwrap();
        let s1 = 1.0 / (2.5f32).sqrt();
        let s2 = 1.0 / (12.5f32).sqrt();
        let want = [s1, 4.0 * s1, 3.0 * s2, 8.0 * s2];
        for (a, b) in x.data.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn copy_cols_splits_interleaved_heads() {
        // two heads of [q q g g]
        let src = CpuTensor::from_vec(1, 8, vec![1., 2., 3., 4., 5., 6., 7., 8.]).unwrap();
        let mut q = CpuTensor::zeros(1, 4);
        let c = ColumnCopy {
            n_blocks: 2,
            width: 2,
            src_offset: 0,
            src_stride: 4,
            dst_offset: 0,
            dst_stride: 2,
        };
        copy_cols(&src, &mut q, &c).unwrap();
        assert_eq!(q.data, vec![1., 2., 5., 6.]);
        let c = ColumnCopy { src_offset: 2, ..c };
        copy_cols(&src, &mut q, &c).unwrap();
        assert_eq!(q.data, vec![3., 4., 7., 8.]);
    }
}
