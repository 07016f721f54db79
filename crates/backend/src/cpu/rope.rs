//! Rotary position embedding (ggml `rope_ext`): normal (adjacent pairs) and NeoX (halves)
//! layouts, partial rotation, linear scaling and Llama-3 frequency factors. Angles are computed
//! in f64 so long positions keep their precision.

use rayon::prelude::*;

use super::{shape_err, CpuTensor};
use crate::{BackendError, RopeMode, RopeParams};

/// `(cos, sin)` of every rotated pair at `pos`.
fn angles(p: &RopeParams, pos: u32) -> Vec<(f32, f32)> {
    (0..p.n_rot / 2)
        .map(|i| {
            let inv_freq = (p.freq_base as f64).powf(-2.0 * i as f64 / p.n_rot as f64);
            let f = p.freq_factors.as_ref().map_or(1.0, |f| f[i] as f64);
            let theta = pos as f64 * p.freq_scale as f64 * inv_freq / f;
            (theta.cos() as f32, theta.sin() as f32)
        })
        .collect()
}

/// Rotates each head of every row in place. x: `[n, n_heads * head_dim]`.
pub fn rope(
    x: &mut CpuTensor,
    positions: &[u32],
    head_dim: usize,
    p: &RopeParams,
) -> Result<(), BackendError> {
    if positions.len() != x.rows {
        return Err(shape_err(
            "rope",
            format!("{} positions for {} rows", positions.len(), x.rows),
        ));
    }
    if head_dim == 0
        || !x.cols.is_multiple_of(head_dim)
        || p.n_rot > head_dim
        || !p.n_rot.is_multiple_of(2)
    {
        return Err(shape_err(
            "rope",
            format!("{} columns, head_dim {head_dim}, n_rot {}", x.cols, p.n_rot),
        ));
    }
    if let Some(f) = &p.freq_factors {
        if f.len() < p.n_rot / 2 {
            return Err(shape_err(
                "rope",
                format!("{} frequency factors for {} pairs", f.len(), p.n_rot / 2),
            ));
        }
    }
    let half = p.n_rot / 2;
    let rotate = |(row, &pos): (&mut [f32], &u32)| {
        // Text tokens carry one position for every M-RoPE section, so M-RoPE pairs like NeoX.
        let cs = angles(p, pos);
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (a, b) = match p.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox | RopeMode::Mrope { .. } => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    };
    if positions.len() <= 1 {
        // Decode: one row, on the calling thread (no pool hand-off for a few µs of work).
        x.data
            .chunks_mut(x.cols)
            .zip(positions.iter())
            .for_each(rotate);
    } else {
        x.data
            .par_chunks_mut(x.cols)
            .zip(positions.par_iter())
            .for_each(rotate);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mode: RopeMode, n_rot: usize) -> RopeParams {
        RopeParams {
            mode,
            n_rot,
            freq_base: 10000.0,
            freq_scale: 1.0,
            freq_factors: None,
        }
    }

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let data: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 2.0).collect();
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            let mut x = CpuTensor::from_vec(2, 16, [data.clone(), data.clone()].concat()).unwrap();
            rope(&mut x, &[0, 7], 8, &params(mode, 6)).unwrap();
            assert_eq!(x.row(0), &data[..]);
            let n0: f32 = data.iter().map(|v| v * v).sum();
            let n1: f32 = x.row(1).iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3);
            // dims past n_rot are untouched
            assert_eq!(x.row(1)[6..8], data[6..8]);
        }
    }

    #[test]
    fn neox_rotates_halves() {
        // one pair (0, 1) at pos 1 with n_rot 2: angle 1 rad
        let mut x = CpuTensor::from_vec(1, 2, vec![1.0, 0.0]).unwrap();
        rope(&mut x, &[1], 2, &params(RopeMode::Neox, 2)).unwrap();
        assert!((x.data[0] - 1f32.cos()).abs() < 1e-6 && (x.data[1] - 1f32.sin()).abs() < 1e-6);
    }
}
