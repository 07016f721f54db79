//! AVX2 activation quantizers, bit-identical to the scalar ones in `activation.rs` (the
//! tests compare them): a matvec quantizes its input once per call, and for the narrow
//! layers of small models the scalar quantizer cost ~15% of the matvec.

use crate::blocks::{to_f16_le, BlockQ8K, BlockQ8_0, BlockQ8_1, QK_K};
use std::arch::x86_64::*;

/// 8 f32 at `x[i..i + 8]` (bounds-checked).
#[inline]
#[target_feature(enable = "avx2")]
fn ld(x: &[f32], i: usize) -> __m256 {
    let s = &x[i..i + 8];
    // SAFETY: `s` is 8 readable f32; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `roundf` (ties away from zero) of 8 lanes, exactly: trunc, then step away from zero
/// where the dropped fraction is at least one half.
#[inline]
#[target_feature(enable = "avx2")]
fn round_away(v: __m256) -> __m256 {
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
    let frac = _mm256_sub_ps(v, t);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let big = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_and_ps(frac, abs_mask), _mm256_set1_ps(0.5));
    let one = _mm256_or_ps(
        _mm256_set1_ps(1.0),
        _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN))),
    );
    _mm256_add_ps(t, _mm256_and_ps(big, one))
}

/// 32 i32 (4 vectors, in order) saturated to i8 and stored.
#[inline]
#[target_feature(enable = "avx2")]
fn store_i8x32(v: [__m256i; 4], out: &mut [i8; 32]) {
    let p01 = _mm256_packs_epi32(v[0], v[1]);
    let p23 = _mm256_packs_epi32(v[2], v[3]);
    let b = _mm256_packs_epi16(p01, p23);
    // packs work per 128-bit lane: restore element order.
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `out` is 32 writable bytes; storeu has no alignment requirement.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), b) }
}

/// Q8_0 / Q8_1 body for one block of 32: returns (d, q as 4 × 8 i32).
#[inline]
#[target_feature(enable = "avx2")]
fn q8_block(x: &[f32]) -> (f32, [__m256i; 4]) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let v: [__m256; 4] = std::array::from_fn(|k| ld(x, 8 * k));
    let m = v.iter().fold(_mm256_setzero_ps(), |m, &vk| {
        _mm256_max_ps(m, _mm256_and_ps(vk, abs_mask))
    });
    let d = hmax(m) / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    let q = v.map(|vk| _mm256_cvttps_epi32(round_away(_mm256_mul_ps(vk, id))));
    (d, q)
}

#[target_feature(enable = "avx2")]
pub(super) fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (d, q) = q8_block(xb);
        yb.d = to_f16_le(d);
        store_i8x32(q, &mut yb.qs);
    }
}

#[target_feature(enable = "avx2")]
pub(super) fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (d, q) = q8_block(xb);
        yb.d = to_f16_le(d);
        let sum = hsum_i32(_mm256_add_epi32(
            _mm256_add_epi32(q[0], q[1]),
            _mm256_add_epi32(q[2], q[3]),
        ));
        yb.s = to_f16_le(sum as f32 * d);
        store_i8x32(q, &mut yb.qs);
    }
}

#[target_feature(enable = "avx2")]
pub(super) fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut m = _mm256_setzero_ps();
        for i in (0..QK_K).step_by(8) {
            m = _mm256_max_ps(m, _mm256_and_ps(ld(xb, i), abs_mask));
        }
        let amax = hmax(m);
        if amax == 0.0 {
            *yb = bytemuck::Zeroable::zeroed();
            continue;
        }
        // The signed value of the first element of largest magnitude, as the scalar code.
        let max = *xb.iter().find(|v| v.abs() == amax).unwrap();
        let iscale = _mm256_set1_ps(-127.0 / max);
        let cap = _mm256_set1_epi32(127);
        for (c, qs) in yb.qs.chunks_exact_mut(32).enumerate() {
            let q: [__m256i; 4] = std::array::from_fn(|k| {
                let v = _mm256_mul_ps(ld(xb, 32 * c + 8 * k), iscale);
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                _mm256_min_epi32(_mm256_cvtps_epi32(r), cap)
            });
            yb.bsums[2 * c] = (hsum_i32(_mm256_add_epi32(q[0], q[1])) as i16).to_le_bytes();
            yb.bsums[2 * c + 1] = (hsum_i32(_mm256_add_epi32(q[2], q[3])) as i16).to_le_bytes();
            store_i8x32(q, qs.try_into().unwrap());
        }
        yb.d = (1.0 / (-127.0 / max)).to_le_bytes();
    }
}
