//! Element-wise activation functions over f32 slices — `silu(gate) · up` (SwiGLU), `silu`,
//! `x · sigmoid(gate)` — and the three loops of one attention head over cached keys and
//! values (scaled dot products, `exp(s − max)` with its sum, the weighted sum of value rows),
//! with an AVX2 path (8 lanes) chosen once at run time.
//!
//! Why: one decode token of a Qwen2.5-1.5B runs SwiGLU over 28 × 8960 values; with libm's
//! scalar `expf` and a division per value that was ~1.5 % of all decode samples (perf,
//! session 13), time in which no weights stream. The vector `exp` is the classic Cephes
//! single-precision scheme (own code): x = n ln 2 + r with |r| ≤ ln 2 / 2 (ln 2 split in two
//! for an exact product), a degree-6 polynomial for e^r, and 2^n built in the exponent bits.
//! Its error is ~1–2 ulp; the quotient is an exact IEEE division. Inputs are clamped to
//! [−87.34, 88.38], where e^x is a normal f32: beyond them the results differ from libm's
//! only by values below 1e-36 (libm's `x / (1 + inf)` = −0 there; this gives ~−1e-37).

use crate::dot::{best_isa, Isa};

/// `out[i] = silu(gate[i]) · up[i]` with silu(x) = x / (1 + e^−x).
///
/// # Panics
/// If the three slices differ in length.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_with(best_isa(), gate, up, out);
}

/// [`silu_mul`] on the path `isa` (the scalar code where `isa` has no vector path).
pub fn silu_mul_with(isa: Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len());
    #[cfg(target_arch = "x86_64")]
    if uses_avx2(isa) {
        // SAFETY: AVX2 + FMA are present (checked by `uses_avx2`); equal lengths asserted.
        unsafe { avx2::silu_mul(gate, up, out) };
        return;
    }
    let _ = isa;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// `x[i] = silu(x[i])`.
pub fn silu_in_place(x: &mut [f32]) {
    silu_in_place_with(best_isa(), x);
}

/// [`silu_in_place`] on the path `isa`.
pub fn silu_in_place_with(isa: Isa, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if uses_avx2(isa) {
        // SAFETY: AVX2 + FMA are present (checked by `uses_avx2`).
        unsafe { avx2::silu_in_place(x) };
        return;
    }
    let _ = isa;
    for v in x {
        *v = silu(*v);
    }
}

/// `x[i] *= sigmoid(gate[i])` with sigmoid(g) = 1 / (1 + e^−g).
///
/// # Panics
/// If the slices differ in length.
pub fn mul_sigmoid(x: &mut [f32], gate: &[f32]) {
    mul_sigmoid_with(best_isa(), x, gate);
}

/// [`mul_sigmoid`] on the path `isa`.
pub fn mul_sigmoid_with(isa: Isa, x: &mut [f32], gate: &[f32]) {
    assert_eq!(x.len(), gate.len());
    #[cfg(target_arch = "x86_64")]
    if uses_avx2(isa) {
        // SAFETY: AVX2 + FMA are present (checked by `uses_avx2`); equal lengths asserted.
        unsafe { avx2::mul_sigmoid(x, gate) };
        return;
    }
    let _ = isa;
    for (v, &g) in x.iter_mut().zip(gate) {
        *v *= 1.0 / (1.0 + (-g).exp());
    }
}

/// `out[j] = scale · (q · keys[j])` for the rows `keys[j]` of `[out.len()][q.len()]`: one
/// query head's attention scores over a run of cached keys.
///
/// # Panics
/// If `keys.len() != out.len() * q.len()`.
pub fn scaled_dots(q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
    scaled_dots_with(best_isa(), q, keys, scale, out);
}

/// [`scaled_dots`] on the path `isa`.
pub fn scaled_dots_with(isa: Isa, q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
    assert_eq!(keys.len(), out.len() * q.len(), "scaled_dots shapes");
    #[cfg(target_arch = "x86_64")]
    if uses_avx2(isa) && !q.is_empty() {
        // SAFETY: AVX2 + FMA present; shapes asserted.
        unsafe { avx2::scaled_dots(q, keys, scale, out) };
        return;
    }
    let _ = isa;
    for (o, k) in out.iter_mut().zip(keys.chunks_exact(q.len().max(1))) {
        *o = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
    }
}

/// `s[j] = e^(s[j] − max)` in place; returns their sum (a softmax's numerators and
/// denominator).
pub fn exp_shifted(s: &mut [f32], max: f32) -> f32 {
    exp_shifted_with(best_isa(), s, max)
}

/// [`exp_shifted`] on the path `isa`.
pub fn exp_shifted_with(isa: Isa, s: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if uses_avx2(isa) {
        // SAFETY: AVX2 + FMA present.
        return unsafe { avx2::exp_shifted(s, max) };
    }
    let _ = isa;
    let mut sum = 0.0f32;
    for v in s {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum
}

/// Attention outputs of several heads over the same cached value rows, in one pass: head `h`
/// adds `Σ_j w[h n + j] · vals[j]` to `out[h d .. (h + 1) d]` (`n = vals.len() / d` rows,
/// `d = out.len() / n_heads`). Each row of `vals` is read once per column strip for all
/// heads instead of once per head.
///
/// # Panics
/// If the lengths do not fit these shapes.
pub fn weighted_sum_heads(n_heads: usize, w: &[f32], vals: &[f32], out: &mut [f32]) {
    weighted_sum_heads_with(best_isa(), n_heads, w, vals, out);
}

/// [`weighted_sum_heads`] on the path `isa`.
pub fn weighted_sum_heads_with(isa: Isa, n_heads: usize, w: &[f32], vals: &[f32], out: &mut [f32]) {
    assert!(n_heads > 0 && out.len().is_multiple_of(n_heads) && w.len().is_multiple_of(n_heads));
    let (d, n) = (out.len() / n_heads, w.len() / n_heads);
    assert_eq!(vals.len(), n * d, "weighted_sum_heads shapes");
    #[cfg(target_arch = "x86_64")]
    if uses_avx2(isa) && d >= 16 {
        // SAFETY: AVX2 + FMA present; shapes asserted.
        unsafe { avx2::weighted_sum_heads(n_heads, w, vals, out) };
        return;
    }
    let _ = isa;
    for (wh, oh) in w.chunks_exact(n.max(1)).zip(out.chunks_exact_mut(d.max(1))) {
        for (&wj, v) in wh.iter().zip(vals.chunks_exact(d.max(1))) {
            oh.iter_mut().zip(v).for_each(|(a, b)| *a += wj * b);
        }
    }
}

/// The scalar silu (libm's `expf`).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[cfg(target_arch = "x86_64")]
fn uses_avx2(isa: Isa) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512) && isa.available()
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// e^x for 8 lanes (see the module comment).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(-87.336_55)),
            _mm256_set1_ps(88.376_26),
        );
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        // ln 2 = 0.693359375 − 2.12194440e-4: n · 0.693359375 is exact for |n| ≤ 128.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_2e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let e = _mm256_fmadd_ps(
            p,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        // 2^n, n in [−126, 127]: the exponent field n + 127.
        let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        )));
        _mm256_mul_ps(e, two_n)
    }

    /// x / (1 + e^−x) for 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn silu8(x: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        // SAFETY: same target features.
        let e = unsafe { exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)) };
        _mm256_div_ps(x, _mm256_add_ps(one, e))
    }

    /// Sum of the 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum8(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// AVX2 + FMA present; `keys.len() == out.len() * q.len()`, `q` not empty.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scaled_dots(q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
        let d = q.len();
        let d8 = d / 8 * 8;
        for (o, k) in out.iter_mut().zip(keys.chunks_exact(d)) {
            // two accumulators: a 128-wide row is 16 FMAs in two chains of 8
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            // SAFETY (loads): i + 8 (or + 16) <= d8 <= d = q.len() = k.len().
            unsafe {
                while i + 16 <= d8 {
                    a0 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(q.as_ptr().add(i)),
                        _mm256_loadu_ps(k.as_ptr().add(i)),
                        a0,
                    );
                    a1 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(q.as_ptr().add(i + 8)),
                        _mm256_loadu_ps(k.as_ptr().add(i + 8)),
                        a1,
                    );
                    i += 16;
                }
                if i < d8 {
                    a0 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(q.as_ptr().add(i)),
                        _mm256_loadu_ps(k.as_ptr().add(i)),
                        a0,
                    );
                }
            }
            // SAFETY: same target features.
            let mut dot = unsafe { hsum8(_mm256_add_ps(a0, a1)) };
            for j in d8..d {
                dot += q[j] * k[j];
            }
            *o = dot * scale;
        }
    }

    /// # Safety
    /// AVX2 + FMA present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_shifted(s: &mut [f32], max: f32) -> f32 {
        let n8 = s.len() / 8 * 8;
        let m = _mm256_set1_ps(max);
        let mut acc = _mm256_setzero_ps();
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= s.len().
            unsafe {
                let p = s.as_mut_ptr().add(i);
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), m));
                _mm256_storeu_ps(p, e);
                acc = _mm256_add_ps(acc, e);
            }
        }
        // SAFETY: same target features.
        let mut sum = unsafe { hsum8(acc) };
        for v in &mut s[n8..] {
            *v = (*v - max).exp();
            sum += *v;
        }
        sum
    }

    /// # Safety
    /// AVX2 + FMA present; `out.len() = n_heads d`, `w.len() = n_heads n`,
    /// `vals.len() = n d`, d >= 16.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn weighted_sum_heads(n_heads: usize, w: &[f32], vals: &[f32], out: &mut [f32]) {
        const HB: usize = 6; // heads per pass: 12 accumulators + 2 value registers
        let d = out.len() / n_heads;
        let n = w.len() / n_heads;
        let d16 = d / 16 * 16;
        for h0 in (0..n_heads).step_by(HB) {
            let nh = HB.min(n_heads - h0);
            for c in (0..d16).step_by(16) {
                // SAFETY (loads, stores): head h0 + h's columns c..c + 16 lie in its d, row
                // j's in vals[j d ..], weights w[(h0 + h) n + j] with j < n.
                unsafe {
                    let mut acc = [[_mm256_setzero_ps(); 2]; HB];
                    for (h, a) in acc.iter_mut().enumerate().take(nh) {
                        let o = out.as_ptr().add((h0 + h) * d + c);
                        *a = [_mm256_loadu_ps(o), _mm256_loadu_ps(o.add(8))];
                    }
                    for j in 0..n {
                        let row = vals.as_ptr().add(j * d + c);
                        let (v0, v1) = (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)));
                        for (h, a) in acc.iter_mut().enumerate().take(nh) {
                            let b = _mm256_broadcast_ss(&*w.as_ptr().add((h0 + h) * n + j));
                            a[0] = _mm256_fmadd_ps(b, v0, a[0]);
                            a[1] = _mm256_fmadd_ps(b, v1, a[1]);
                        }
                    }
                    for (h, a) in acc.iter().enumerate().take(nh) {
                        let o = out.as_mut_ptr().add((h0 + h) * d + c);
                        _mm256_storeu_ps(o, a[0]);
                        _mm256_storeu_ps(o.add(8), a[1]);
                    }
                }
            }
        }
        // columns past the last full strip
        if d16 < d {
            for h in 0..n_heads {
                for j in 0..n {
                    let wj = w[h * n + j];
                    for i in d16..d {
                        out[h * d + i] += wj * vals[j * d + i];
                    }
                }
            }
        }
    }

    /// # Safety
    /// AVX2 + FMA present; `gate`, `up` and `out` of equal length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n8 = out.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= each slice's length.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(silu8(g), u));
            }
        }
        for i in n8..out.len() {
            out[i] = super::silu(gate[i]) * up[i];
        }
    }

    /// # Safety
    /// AVX2 + FMA present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_in_place(x: &mut [f32]) {
        let n8 = x.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= x.len().
            unsafe {
                let p = x.as_mut_ptr().add(i);
                _mm256_storeu_ps(p, silu8(_mm256_loadu_ps(p)));
            }
        }
        for v in &mut x[n8..] {
            *v = super::silu(*v);
        }
    }

    /// # Safety
    /// AVX2 + FMA present; `x` and `gate` of equal length.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mul_sigmoid(x: &mut [f32], gate: &[f32]) {
        let one = _mm256_set1_ps(1.0);
        let n8 = x.len() / 8 * 8;
        for i in (0..n8).step_by(8) {
            // SAFETY: i + 8 <= n8 <= each slice's length.
            unsafe {
                let p = x.as_mut_ptr().add(i);
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
                let s = _mm256_div_ps(one, _mm256_add_ps(one, e));
                _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), s));
            }
        }
        for i in n8..x.len() {
            x[i] *= 1.0 / (1.0 + (-gate[i]).exp());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silu64(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    /// Values from −100 to 100 (dense near 0), odd lengths for the scalar tails, and
    /// the edges of the clamp.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..40_001)
            .map(|i| {
                let t = (i as f64 - 20_000.0) / 20_000.0;
                (100.0 * t * t * t) as f32
            })
            .collect();
        v.extend([
            0.0, -0.0, 1e-30, -1e-30, 87.3, -87.3, 88.3, -88.3, 88.8, -88.8, 103.0, -103.0,
        ]);
        v
    }

    /// Within `rel` of the f64 value, or both below 1e-30 in magnitude (the clamp region).
    fn close(got: f32, want: f64, rel: f64) -> bool {
        let g = got as f64;
        (g - want).abs() <= rel * want.abs() || (g.abs() < 1e-30 && want.abs() < 1e-30)
    }

    #[test]
    fn every_path_matches_f64_silu_and_sigmoid() {
        let x = inputs();
        let up: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        for isa in Isa::all_available() {
            let mut out = vec![0.0; x.len()];
            silu_mul_with(isa, &x, &up, &mut out);
            let mut s = x.clone();
            silu_in_place_with(isa, &mut s);
            let mut m = up.clone();
            mul_sigmoid_with(isa, &mut m, &x);
            let mut worst = 0.0f64;
            for i in 0..x.len() {
                let xs = x[i] as f64;
                let want = silu64(xs);
                let sig = 1.0 / (1.0 + (-xs).exp());
                for (got, w) in [
                    (out[i], want * up[i] as f64),
                    (s[i], want),
                    (m[i], up[i] as f64 * sig),
                ] {
                    assert!(close(got, w, 1e-6), "{isa:?} x={} got {got} want {w}", x[i]);
                    if w.abs() > 1e-30 {
                        worst = worst.max(((got as f64 - w) / w).abs());
                    }
                }
            }
            // a few ulp: the polynomial's error plus two roundings
            assert!(worst < 5e-7, "{isa:?}: worst relative error {worst:e}");
        }
    }

    #[test]
    fn attention_helpers_match_f64_on_every_path() {
        let mut seed = 5u64;
        let mut r = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for (d, n) in [
            (128usize, 37usize),
            (64, 8),
            (8, 5),
            (80, 3),
            (13, 1),
            (256, 20),
        ] {
            let q: Vec<f32> = (0..d).map(|_| r()).collect();
            let keys: Vec<f32> = (0..n * d).map(|_| r()).collect();
            let w: Vec<f32> = (0..n).map(|_| r().abs()).collect();
            let start: Vec<f32> = (0..d).map(|_| r()).collect();
            for isa in Isa::all_available() {
                let mut s = vec![0.0f32; n];
                scaled_dots_with(isa, &q, &keys, 0.125, &mut s);
                for (j, &got) in s.iter().enumerate() {
                    let want: f64 = q
                        .iter()
                        .zip(&keys[j * d..(j + 1) * d])
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * 0.125;
                    assert!(
                        (got as f64 - want).abs() < 1e-5,
                        "{isa:?} d {d}: {got} vs {want}"
                    );
                }
                let max = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let mut e = s.clone();
                let sum = exp_shifted_with(isa, &mut e, max);
                let want_sum: f64 = s.iter().map(|&x| ((x - max) as f64).exp()).sum();
                assert!(((sum as f64 - want_sum) / want_sum).abs() < 1e-6, "{isa:?}");
                for (x, y) in s.iter().zip(&e) {
                    let want = ((x - max) as f64).exp();
                    assert!((*y as f64 - want).abs() <= 1e-6 * want, "{isa:?}");
                }
                // several heads at once: head h's weights are w scaled by h + 1
                for n_heads in [1usize, 5, 7] {
                    let wh: Vec<f32> = (0..n_heads)
                        .flat_map(|h| w.iter().map(move |x| x * (h + 1) as f32))
                        .collect();
                    let mut outs: Vec<f32> = (0..n_heads).flat_map(|_| start.clone()).collect();
                    weighted_sum_heads_with(isa, n_heads, &wh, &keys, &mut outs);
                    for h in 0..n_heads {
                        for i in 0..d {
                            let want = start[i] as f64
                                + (0..n)
                                    .map(|j| wh[h * n + j] as f64 * keys[j * d + i] as f64)
                                    .sum::<f64>();
                            let got = outs[h * d + i] as f64;
                            assert!((got - want).abs() < 1e-4, "{isa:?} heads {n_heads} d {d}");
                        }
                    }
                }
                let mut out = start.clone();
                weighted_sum_heads_with(isa, 1, &w, &keys, &mut out);
                for (i, &got) in out.iter().enumerate() {
                    let want = start[i] as f64
                        + (0..n)
                            .map(|j| w[j] as f64 * keys[j * d + i] as f64)
                            .sum::<f64>();
                    assert!((got as f64 - want).abs() < 1e-5, "{isa:?} d {d} col {i}");
                }
            }
        }
    }

    #[test]
    fn nan_in_nan_out_and_no_panic_on_infinities() {
        for isa in Isa::all_available() {
            let mut v = vec![
                f32::NAN,
                f32::INFINITY,
                f32::NEG_INFINITY,
                1.0,
                2.0,
                3.0,
                4.0,
                5.0,
                6.0,
            ];
            silu_in_place_with(isa, &mut v);
            assert!(v[0].is_nan(), "{isa:?}");
            assert_eq!(v[1], f32::INFINITY, "{isa:?}");
            // the limit is 0; libm gives −inf / inf = NaN, the vector path −inf / 2.4e38
            assert!(v[2] <= 0.0 || v[2].is_nan(), "{isa:?}: {}", v[2]);
        }
    }

    #[test]
    #[ignore = "timing: cargo test -p quant --release --lib -- --ignored silu_timing --nocapture"]
    fn silu_timing() {
        let n = 8960;
        let g: Vec<f32> = (0..n)
            .map(|i| ((i * 37) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        let u = vec![1.0f32; n];
        let mut o = vec![0.0f32; n];
        for isa in Isa::all_available() {
            let t = std::time::Instant::now();
            for _ in 0..2000 {
                silu_mul_with(isa, &g, &u, &mut o);
                std::hint::black_box(&o);
            }
            let us = t.elapsed().as_secs_f64() / 2000.0 * 1e6;
            println!("{isa:?}: silu_mul of {n}: {us:.2} µs");
        }
    }
}
