//! Scale searches shared by the K-quant and IQ4 quantizers.
//!
//! Ports of ggml's helpers in ggml/src/ggml-quants.c (`nearest_int`, `make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants` / `make_qkx3_quants`, `make_qp_quants`,
//! `best_index_int8`). Every float operation is f32 in ggml's order, without fused
//! multiply-add, so the output matches a ggml build with `-ffp-contract=off` byte for byte.
//! Each search picks quants `L` for `n` values `x` (and returns the scale) minimizing a
//! weighted squared (or absolute) error.

// Index loops over parallel arrays mirror ggml's code line by line, which keeps the port
// auditable against ggml-quants.c.
#![allow(clippy::needless_range_loop)]

/// Below this, a group's max magnitude counts as zero (ggml `GROUP_MAX_EPS`).
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, by ggml's magic-number trick (valid for |x| <= 4194303;
/// outside that the result is garbage exactly as ggml's).
#[inline(always)]
pub fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007F_FFFF) as i32 - 0x0040_0000
}

/// First value of largest magnitude (its sign kept), and that magnitude.
#[inline]
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// Symmetric quants `l in [-nmax, nmax)` stored as `l + nmax` in `out`; weights `qw`
/// (or x² without). Tries 19 scales around `-nmax / max` and refits the scale by least
/// squares (ggml `make_qx_quants` with rmse_type 1). Returns the scale.
pub fn make_qx_quants(nmax: i32, x: &[f32], out: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let n = x.len();
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        out[..n].fill(0);
        return 0.0;
    }
    let weight = |i: usize| match qw {
        Some(w) => w[i],
        None => x[i] * x[i],
    };
    let mut iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        out[i] = (l + nmax) as i8;
        let w = weight(i);
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            let w = weight(i);
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
                out[i] = (l + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's search: quants in [-nmax, nmax) (stored + nmax), x²-weighted coordinate descent on
/// single quants (ggml `make_q3_quants` with do_rmse). Returns the scale.
pub fn make_q3_quants(nmax: i32, x: &[f32], out: &mut [i8]) -> f32 {
    let n = x.len();
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        out[i] = l as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for o in out[..n].iter_mut() {
        *o += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Which asymmetric search: ggml's `make_qkx2_quants` (weights required, min <= 0 clamp
/// only on the start) or `make_qkx3_quants` (weights default to x², `max <= min` test).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum AffineSearch {
    Qkx2,
    Qkx3,
}

/// Parameters of the affine search: scales tried are `(rmin + rdelta * is + nmax) /
/// (max - min)` for is in 0..=nstep; `use_mad` minimizes |error| instead of error².
pub struct AffineParams {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
    pub kind: AffineSearch,
}

/// Affine quants x ≈ scale * l - the_min, l in [0, nmax], the_min >= 0. Writes `out`
/// (n values), returns (scale, the_min). `laux`: scratch of n.
pub fn make_qkx_quants(
    p: &AffineParams,
    x: &[f32],
    weights: Option<&[f32]>,
    out: &mut [u8],
    laux: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let weight = |i: usize| match weights {
        Some(w) => w[i],
        None => x[i] * x[i],
    };
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weight(0);
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weight(i);
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    let degenerate = match p.kind {
        AffineSearch::Qkx2 => max == min,
        AffineSearch::Qkx3 => max <= min,
    };
    if degenerate {
        out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if p.use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        out[i] = l as u8;
        let diff = scale * out[i] as f32 + min - x[i];
        best_error += weight(i) * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weight(i);
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weight(i) * err(diff);
            }
            if cur_error < best_error {
                out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Non-negative quants l in [0, nmax] for non-negative `x` (the sub-block scales / mins of
/// the imatrix K-quant paths), weighted by `qw` (ggml `make_qp_quants`). Returns the scale.
pub fn make_qp_quants(nmax: i32, x: &[f32], out: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let max = x.iter().fold(0.0f32, |m, &v| if m > v { m } else { v });
    if max < GROUP_MAX_EPS {
        out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * out[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        out[i] = l as u8;
        let w = qw[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = qw[i];
            let li = out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Index of the nearest entry of the sorted code book `val` (len a power of two); a value
/// exactly between two entries takes the upper one (ggml `best_index_int8`).
#[inline]
pub fn best_index_int8(val: &[i8], x: f32) -> usize {
    let x2 = x + x;
    let mut idx = 0usize;
    let mut step = val.len() >> 1;
    while step > 0 {
        let j = idx + step;
        if x2 >= (val[j - 1] as i32 + val[j] as i32) as f32 {
            idx = j;
        }
        step >>= 1;
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
    }

    #[test]
    fn best_index_matches_brute_force() {
        let book = crate::blocks::KVALUES_IQ4NL;
        for k in -3000..3000 {
            let x = k as f32 * 0.05;
            let got = best_index_int8(&book, x);
            // nearest; ties to the upper entry
            let mut best = 0;
            for (i, &v) in book.iter().enumerate() {
                let (d, db) = ((x - v as f32).abs(), (x - book[best] as f32).abs());
                if d < db || (d == db && i > best) {
                    best = i;
                }
            }
            assert_eq!(got, best, "x = {x}");
        }
    }
}
