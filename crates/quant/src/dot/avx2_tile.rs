//! AVX2 multi-token dot kernels: one weight row against `T` (1..=4) activation rows.
//!
//! Design: prefill multiplies every weight row by many tokens. Unpacking a block (nibbles,
//! 6-bit scales, the Q6_K high bits, the sign of Q4_0 / Q8_0 weights) costs as much as the
//! multiply itself, so these kernels unpack each block once and reuse the unpacked
//! registers for `T` tokens, each with its own integer and float accumulators. With
//! `T = 1` they are also the single-row kernels for these formats. The per-sub-block scale
//! broadcasts are byte shuffles of scale vectors built once per block.

use super::avx2::{d2, f16c, hsum_ps, k4_scales_mins, ld128, ld256};
use super::{check_lengths, row_lengths, DotFn, DotTileFn};
use crate::blocks::*;
use bytemuck::cast_slice;
use gguf::GgmlType;
use std::arch::x86_64::*;

/// Most tokens per kernel instance (a call takes up to [`super::MAX_TILE`]).
pub(super) const MAX_T: usize = 4;

/// `vpshufb` mask broadcasting i16 lane `s` (0..8) of each 128-bit lane to all its lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn bcast16(s: usize) -> __m256i {
    _mm256_set1_epi16((((2 * s + 1) << 8) | (2 * s)) as i16)
}

/// Q4_K row · `T` Q8_K rows: out[t] = dot(x, ys[t]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_k<const T: usize>(x: &[BlockQ4K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); T];
    for (b, xb) in x.iter().enumerate() {
        let sm = k4_scales_mins(&xb.scales);
        let smv = ld128(&sm, 0);
        // scales as i16 in both 128-bit lanes; mins as i16.
        let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(smv));
        // Each min doubled to sit over its two 16-sums (bsums) for one vpmaddwd per token.
        let mins2 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
            smv,
            _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15),
        ));
        let mut sumi = [_mm256_setzero_si256(); T];
        for j in 0..4 {
            let q4 = ld256(&xb.qs, 32 * j);
            let lo = _mm256_and_si256(q4, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
            let scl = _mm256_shuffle_epi8(sc16, bcast16(2 * j));
            let sch = _mm256_shuffle_epi8(sc16, bcast16(2 * j + 1));
            for t in 0..T {
                let a = &ys[t][b].qs;
                let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld256(a, 64 * j)), scl);
                let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld256(a, 64 * j + 32)), sch);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
            }
        }
        let d = f16c(xb.d);
        let dmin = f16c(xb.dmin);
        for t in 0..T {
            let yb = &ys[t][b];
            let dy = f32::from_le_bytes(yb.d);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * dy), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
            // Mins: -dmin * sum_j m_j * (bsum_2j + bsum_2j+1).
            let prod = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins2, ld256(&yb.bsums, 0)));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * dy), prod, acc[t]);
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// Q6_K row · `T` Q8_K rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k<const T: usize>(x: &[BlockQ6K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(3);
    // Lane-dependent masks: low 128-bit lane takes i16 scale 2p, high lane 2p + 1.
    let pair_mask: [__m256i; 4] = std::array::from_fn(|p| {
        let (a, b) = (2 * p, 2 * p + 1);
        let lo = _mm_set1_epi16((((2 * a + 1) << 8) | (2 * a)) as i16);
        let hi = _mm_set1_epi16((((2 * b + 1) << 8) | (2 * b)) as i16);
        _mm256_set_m128i(hi, lo)
    });
    let mut acc = [_mm256_setzero_ps(); T];
    for (b, xb) in x.iter().enumerate() {
        let scales = ld128(&xb.scales, 0);
        let s16 = _mm256_cvtepi8_epi16(scales);
        // Scales 0..8 and 8..16 as i16, each copied to both 128-bit lanes.
        let s_lo = _mm256_permute2x128_si256::<0x00>(s16, s16);
        let s_hi = _mm256_permute2x128_si256::<0x11>(s16, s16);
        let mut sumi = [_mm256_setzero_si256(); T];
        for h in 0..2 {
            let ql0 = ld256(&xb.ql, 64 * h);
            let ql1 = ld256(&xb.ql, 64 * h + 32);
            let qh = ld256(&xb.qh, 32 * h);
            let s_half = if h == 0 { s_lo } else { s_hi };
            for (k, mask) in pair_mask.iter().enumerate() {
                // Quarter k of this half (see scalar::q6_k_value for the layout).
                let ql = if k % 2 == 0 { ql0 } else { ql1 };
                let low = if k < 2 {
                    ql
                } else {
                    _mm256_srli_epi16::<4>(ql)
                };
                let high = match k {
                    0 => qh,
                    1 => _mm256_srli_epi16::<2>(qh),
                    2 => _mm256_srli_epi16::<4>(qh),
                    _ => _mm256_srli_epi16::<6>(qh),
                };
                let q = _mm256_or_si256(
                    _mm256_and_si256(low, m4),
                    _mm256_slli_epi16::<4>(_mm256_and_si256(high, m2)),
                );
                let sc = _mm256_shuffle_epi8(s_half, *mask);
                for t in 0..T {
                    let a = ld256(&ys[t][b].qs, 128 * h + 32 * k);
                    let p = _mm256_maddubs_epi16(q, a);
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, sc));
                }
            }
        }
        let d = f16c(xb.d);
        for t in 0..T {
            let yb = &ys[t][b];
            // The -32 offset: 32 * sum_sb scale_sb * bsum_sb.
            let corr = _mm256_madd_epi16(s16, ld256(&yb.bsums, 0));
            let s = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32::<5>(corr));
            let dd = d * f32::from_le_bytes(yb.d);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// 32-wide signed-weight row · `T` Q8_0 rows, by the sign trick `maddubs(|w|, sign(a, w))`
/// with the weights unpacked to i8 (by `$unpack`, giving `(weights, f16 scale)`) once per
/// block.
macro_rules! signed32 {
    ($name:ident, $block:ty, |$xb:ident| $unpack:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn $name<const T: usize>(x: &[$block], ys: [&[BlockQ8_0]; T]) -> [f32; T] {
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); T];
            for (b, $xb) in x.iter().enumerate() {
                let (q, d): (__m256i, [u8; 2]) = $unpack;
                let aq = _mm256_sign_epi8(q, q);
                for t in 0..T {
                    let yb = &ys[t][b];
                    let sy = _mm256_sign_epi8(ld256(&yb.qs, 0), q);
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sy), ones);
                    let dd = _mm256_set1_ps(d2(d, yb.d));
                    acc[t] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(p), acc[t]);
                }
            }
            acc.map(|v| hsum_ps(v))
        }
    };
}

signed32!(q8_0, BlockQ8_0, |xb| (ld256(&xb.qs, 0), xb.d));

signed32!(q4_0, BlockQ4_0, |xb| {
    let x = ld128(&xb.qs, 0);
    let m4 = _mm_set1_epi8(0x0f);
    let q = _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(x), m4),
        _mm_and_si128(x, m4),
    );
    (_mm256_sub_epi8(q, _mm256_set1_epi8(8)), xb.d)
});

/// Expands to a [`DotTileFn`] that checks lengths and runs `$kernel::<T>` for `n_tok`.
macro_rules! tile_entry {
    ($ty:expr, $kernel:ident) => {
        |w: &[u8], acts: &[u8], n_tok: usize, n: usize, out: &mut [f32]| {
            let (wl, al) = row_lengths($ty, n);
            assert!(
                w.len() == wl && acts.len() == n_tok * al && out.len() >= n_tok,
                "{} tile dot: bad lengths",
                $ty.name()
            );
            let x = cast_slice(w);
            let y = |t: usize| cast_slice(&acts[t * al..(t + 1) * al]);
            assert!(n_tok <= super::MAX_TILE, "tile of {n_tok} tokens");
            // Runs of up to MAX_T tokens (the register budget of 16 ymm registers).
            let mut t0 = 0;
            while t0 < n_tok {
                let m = (n_tok - t0).min(MAX_T);
                let o = &mut out[t0..t0 + m];
                // SAFETY: `tile_kernel` is only called after AVX2+FMA+F16C were detected.
                unsafe {
                    match m {
                        1 => o.copy_from_slice(&$kernel::<1>(x, [y(t0)])),
                        2 => o.copy_from_slice(&$kernel::<2>(x, [y(t0), y(t0 + 1)])),
                        3 => o.copy_from_slice(&$kernel::<3>(x, [y(t0), y(t0 + 1), y(t0 + 2)])),
                        _ => o.copy_from_slice(&$kernel::<4>(
                            x,
                            [y(t0), y(t0 + 1), y(t0 + 2), y(t0 + 3)],
                        )),
                    }
                }
                t0 += m;
            }
        }
    };
}

/// The multi-token AVX2 kernel for `ty`, if this module has one.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
pub(super) unsafe fn tile_kernel(ty: GgmlType) -> Option<DotTileFn> {
    Some(match ty {
        GgmlType::Q4K => tile_entry!(GgmlType::Q4K, q4_k),
        GgmlType::Q6K => tile_entry!(GgmlType::Q6K, q6_k),
        GgmlType::Q4_0 => tile_entry!(GgmlType::Q4_0, q4_0),
        GgmlType::Q8_0 => tile_entry!(GgmlType::Q8_0, q8_0),
        _ => return None,
    })
}

/// The single-row form (`T = 1`) of the multi-token kernel for `ty`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
pub(super) unsafe fn row_kernel(ty: GgmlType) -> Option<DotFn> {
    macro_rules! one {
        ($ty:expr, $kernel:ident) => {
            |w: &[u8], a: &[u8], n: usize| {
                check_lengths($ty, w, a, n);
                // SAFETY: `row_kernel` is only called after AVX2+FMA+F16C were detected.
                unsafe { $kernel::<1>(cast_slice(w), [cast_slice(a)])[0] }
            }
        };
    }
    Some(match ty {
        GgmlType::Q4K => one!(GgmlType::Q4K, q4_k),
        GgmlType::Q6K => one!(GgmlType::Q6K, q6_k),
        GgmlType::Q4_0 => one!(GgmlType::Q4_0, q4_0),
        GgmlType::Q8_0 => one!(GgmlType::Q8_0, q8_0),
        _ => return None,
    })
}
