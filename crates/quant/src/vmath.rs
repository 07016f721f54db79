//! Element-wise activation functions over f32 slices — `silu(gate) · up` (SwiGLU), `silu`,
//! `x · sigmoid(gate)` — with an AVX2 path (8 lanes) chosen once at run time.
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
