//! AVX-512 (F + BW + VL, VNNI when present) dot kernels for the formats that dominate
//! decode time: Q4_K, Q6_K (Q4_K_M models), Q8_0, and with VNNI Q4_0. Other formats use
//! the AVX2 kernels.
//!
//! Design: the AVX2 scheme (see `avx2.rs`) at twice the width. A K-quant block is walked 64
//! elements at a time, two sub-blocks per 512-bit register, with the per-sub-block scales
//! spread over the i16 lanes by one `vpermw`; with VNNI the scale multiply and the add are
//! one `vpdpwssd`. Q8_0 takes two blocks per register. Q6_K's -32 offset is folded into one
//! product of the scales with the activation block sums (`bsums`) instead of a second
//! multiply per vector. Q4_0 with VNNI puts two blocks in a 256-bit register (Zen 4 splits
//! 512-bit ops in two, and a 512-bit Q4_0 was slower than AVX2 there).

use super::avx2::{cvt_f16x4, f16c, hsum_ps, k4_scales_mins, ld128, ld256};
use super::{check_lengths, DotFn};
use crate::blocks::*;
use bytemuck::cast_slice;
use gguf::GgmlType;
use std::arch::x86_64::*;

/// The AVX-512 kernel for `ty`, if this module has one.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL, AVX2, FMA and F16C.
pub(super) unsafe fn kernel(ty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    let vnni = std::is_x86_feature_detected!("avx512vnni");
    Some(match ty {
        Q4K if vnni => |w, a, n| {
            check_lengths(Q4K, w, a, n);
            // SAFETY: `kernel` is only called after AVX-512 F/BW/VL + AVX2/FMA/F16C were
            // detected, and VNNI was detected just above.
            unsafe { dot_q4_k_vnni(cast_slice(w), cast_slice(a)) }
        },
        Q6K if vnni => |w, a, n| {
            check_lengths(Q6K, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q6_k_vnni(cast_slice(w), cast_slice(a)) }
        },
        Q4K => |w, a, n| {
            check_lengths(Q4K, w, a, n);
            // SAFETY: `kernel` is only called after AVX-512 F/BW/VL + AVX2/FMA/F16C were detected.
            unsafe { dot_q4_k(cast_slice(w), cast_slice(a)) }
        },
        Q6K => |w, a, n| {
            check_lengths(Q6K, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q6_k(cast_slice(w), cast_slice(a)) }
        },
        Q4_0 if vnni => |w, a, n| {
            check_lengths(Q4_0, w, a, n);
            // SAFETY: AVX-512 F/BW/VL + AVX2/FMA/F16C detected by the caller, VNNI above.
            unsafe { dot_q4_0_vnni(cast_slice(w), cast_slice(a)) }
        },
        Q8_0 => |w, a, n| {
            check_lengths(Q8_0, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q8_0(cast_slice(w), cast_slice(a)) }
        },
        _ => return None,
    })
}

/// 64 bytes at `s[off..off + 64]` (bounds-checked; no alignment needed).
#[inline]
#[target_feature(enable = "avx512f")]
fn ld512(s: &[u8], off: usize) -> __m512i {
    let b = &s[off..off + 64];
    // SAFETY: `b` is 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// Two 256-bit halves as one register: `lo` in bytes 0..32, `hi` in 32..64.
#[inline]
#[target_feature(enable = "avx512f")]
fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Sum of the 16 f32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn hsum512(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    hsum_ps(_mm256_add_ps(lo, hi))
}

/// i16 lane indices selecting element `a` for lanes 0..16 and `a + 1` for 16..32.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_index(a: i16) -> __m512i {
    join(_mm256_set1_epi16(a), _mm256_set1_epi16(a + 1))
}

/// acc + madd(p, s): i16 pairs multiplied and added into i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn madd_add(acc: __m512i, p: __m512i, s: __m512i) -> __m512i {
    _mm512_add_epi32(acc, _mm512_madd_epi16(p, s))
}

/// The same with one VNNI `vpdpwssd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn madd_add_vnni(acc: __m512i, p: __m512i, s: __m512i) -> __m512i {
    _mm512_dpwssd_epi32(acc, p, s)
}

/// The K-quant kernels, once per way of accumulating scaled i16 products.
macro_rules! k_quant_kernels {
    ($q4k:ident, $q6k:ident, $features:literal, $madd_add:ident) => {
        #[target_feature(enable = $features)]
        fn $q4k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
            let m4 = _mm512_set1_epi8(0x0f);
            let idx = [pair_index(0), pair_index(2), pair_index(4), pair_index(6)];
            let mut acc = _mm512_setzero_ps();
            let mut acc_m = _mm256_setzero_ps();
            let min_pairs =
                _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
            for (xb, yb) in x.iter().zip(y) {
                let dy = f32::from_le_bytes(yb.d);
                let sm = k4_scales_mins(&xb.scales);
                let smv = ld128(&sm, 0);
                // Mins: dmin * sum_j m_j * (bsum_2j + bsum_2j+1): each min byte doubled
                // to sit over its two 16-sums, then one vpmaddwd against all 16 bsums.
                let mins2 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(smv, min_pairs));
                let prod = _mm256_madd_epi16(mins2, ld256(&yb.bsums, 0));
                acc_m = _mm256_fmadd_ps(
                    _mm256_set1_ps(-dy * f16c(xb.dmin)),
                    _mm256_cvtepi32_ps(prod),
                    acc_m,
                );
                // scales: 8 × i16 in lanes 0..8.
                let scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(smv));
                let mut sumi = _mm512_setzero_si512();
                for (c, idx_c) in idx.iter().enumerate() {
                    let q = ld256(&xb.qs, 32 * c);
                    // Low nibbles are sub-block 2c (elements 64c..64c+32), high nibbles 2c+1.
                    let qz = _mm512_and_si512(join(q, _mm256_srli_epi16::<4>(q)), m4);
                    let p = _mm512_maddubs_epi16(qz, ld512(cast_slice(&yb.qs), 64 * c));
                    let sc = _mm512_permutexvar_epi16(*idx_c, scales);
                    sumi = $madd_add(sumi, p, sc);
                }
                let d = dy * f16c(xb.d);
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
            }
            hsum512(acc) + hsum_ps(acc_m)
        }

        #[target_feature(enable = $features)]
        fn $q6k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
            let m4 = _mm512_set1_epi8(0x0f);
            let m2 = _mm512_set1_epi8(3);
            // i16 lane indices: sub-blocks 4j..4j+4, each over 8 lanes (16 elements).
            let idx: [__m512i; 4] = std::array::from_fn(|j| {
                let j = 4 * j as i16;
                join(
                    _mm256_set_m128i(_mm_set1_epi16(j + 1), _mm_set1_epi16(j)),
                    _mm256_set_m128i(_mm_set1_epi16(j + 3), _mm_set1_epi16(j + 2)),
                )
            });
            let mut acc = _mm256_setzero_ps();
            for (xb, yb) in x.iter().zip(y) {
                let scales16 = _mm256_cvtepi8_epi16(ld128(&xb.scales, 0));
                let scales = _mm512_castsi256_si512(scales16);
                let mut sumi = _mm512_setzero_si512();
                for h in 0..2 {
                    let ql = join(ld256(&xb.ql, 64 * h), ld256(&xb.ql, 64 * h + 32));
                    let qh = ld256(&xb.qh, 32 * h);
                    // Quarters 0,1 then 2,3 of this half (see scalar::q6_k_value for the layout).
                    let qh01 = join(qh, _mm256_srli_epi16::<2>(qh));
                    let qh23 = _mm512_srli_epi16::<4>(qh01);
                    let q01 = _mm512_or_si512(
                        _mm512_and_si512(ql, m4),
                        _mm512_slli_epi16::<4>(_mm512_and_si512(qh01, m2)),
                    );
                    let q23 = _mm512_or_si512(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                        _mm512_slli_epi16::<4>(_mm512_and_si512(qh23, m2)),
                    );
                    let a01 = ld512(cast_slice(&yb.qs), 128 * h);
                    let a23 = ld512(cast_slice(&yb.qs), 128 * h + 64);
                    let p01 = _mm512_maddubs_epi16(q01, a01);
                    let p23 = _mm512_maddubs_epi16(q23, a23);
                    let s01 = _mm512_permutexvar_epi16(idx[2 * h], scales);
                    let s23 = _mm512_permutexvar_epi16(idx[2 * h + 1], scales);
                    sumi = $madd_add(sumi, p01, s01);
                    sumi = $madd_add(sumi, p23, s23);
                }
                // The -32 offset: 32 * sum_sb scale_sb * bsum_sb.
                let corr = _mm256_madd_epi16(scales16, ld256(&yb.bsums, 0));
                let sum8 = _mm256_add_epi32(
                    _mm512_castsi512_si256(sumi),
                    _mm512_extracti64x4_epi64::<1>(sumi),
                );
                let sum8 = _mm256_sub_epi32(sum8, _mm256_slli_epi32::<5>(corr));
                let d = f32::from_le_bytes(yb.d) * f16c(xb.d);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sum8), acc);
            }
            hsum_ps(acc)
        }
    };
}

k_quant_kernels!(
    dot_q4_k,
    dot_q6_k,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    madd_add
);
k_quant_kernels!(
    dot_q4_k_vnni,
    dot_q6_k_vnni,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    madd_add_vnni
);

/// Signed int8 × int8 (`y` never -128), adjacent 4 products summed into 16 i32 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn mul_sum_i8_512(x: __m512i, y: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(x);
    let sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    let p = _mm512_maddubs_epi16(_mm512_abs_epi8(x), sy);
    _mm512_madd_epi16(p, _mm512_set1_epi16(1))
}

/// f32 lanes 0..8 = `a`, 8..16 = `b`.
#[inline]
#[target_feature(enable = "avx512f")]
fn scale_pair_ps(a: f32, b: f32) -> __m512 {
    _mm512_castsi512_ps(join(
        _mm256_castps_si256(_mm256_set1_ps(a)),
        _mm256_castps_si256(_mm256_set1_ps(b)),
    ))
}

/// Product of two f16 scales.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn d2(a: [u8; 2], b: [u8; 2]) -> f32 {
    f16c(a) * f16c(b)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn dot_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let mut xp = x.chunks_exact(2);
    let mut yp = y.chunks_exact(2);
    for (xs, ys) in (&mut xp).zip(&mut yp) {
        let q = join(ld256(&xs[0].qs, 0), ld256(&xs[1].qs, 0));
        let a = join(ld256(&ys[0].qs, 0), ld256(&ys[1].qs, 0));
        let p = mul_sum_i8_512(q, a);
        let d = scale_pair_ps(d2(xs[0].d, ys[0].d), d2(xs[1].d, ys[1].d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    let mut sum = hsum512(acc);
    for (xb, yb) in xp.remainder().iter().zip(yp.remainder()) {
        let q = _mm512_castsi256_si512(ld256(&xb.qs, 0));
        let a = _mm512_castsi256_si512(ld256(&yb.qs, 0));
        let p = _mm512_castsi512_si256(mul_sum_i8_512(q, a));
        sum += d2(xb.d, yb.d) * hsum_ps(_mm256_cvtepi32_ps(p));
    }
    sum
}

/// Q4_0 · Q8_0 with VNNI, two blocks per 256-bit register: the low nibbles of both
/// blocks meet activations 0..16 of each, the high nibbles 16..32. `vpdpbusd` takes the
/// nibbles unsigned, so the -8 offset is a second `vpdpbusd` of 8s against the
/// activations (no sign tricks, no `vpmaddwd`). Lanes 0..4 hold block 0, 4..8 block 1.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn dot_q4_0_vnni(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let eight = _mm256_set1_epi8(8);
    // f32 lanes [p0, _, p1, _] -> [p0 × 4, p1 × 4].
    let spread = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
    let mut acc = _mm256_setzero_ps();
    let mut xp = x.chunks_exact(2);
    let mut yp = y.chunks_exact(2);
    for (xs, ys) in (&mut xp).zip(&mut yp) {
        let raw = _mm256_set_m128i(ld128(&xs[1].qs, 0), ld128(&xs[0].qs, 0));
        let lo = _mm256_and_si256(raw, m4);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
        let a_lo = _mm256_set_m128i(ld128(&ys[1].qs, 0), ld128(&ys[0].qs, 0));
        let a_hi = _mm256_set_m128i(ld128(&ys[1].qs, 16), ld128(&ys[0].qs, 16));
        let s = _mm256_dpbusd_epi32(
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, a_lo),
            hi,
            a_hi,
        );
        let t = _mm256_dpbusd_epi32(
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), eight, a_lo),
            eight,
            a_hi,
        );
        let p = _mm256_cvtepi32_ps(_mm256_sub_epi32(s, t));
        let h = |d: [u8; 2]| u16::from_le_bytes(d) as u64;
        let f = cvt_f16x4(h(xs[0].d) | h(ys[0].d) << 16 | h(xs[1].d) << 32 | h(ys[1].d) << 48);
        let dd = _mm_mul_ps(f, _mm_movehdup_ps(f));
        let dd = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(dd), spread);
        acc = _mm256_fmadd_ps(dd, p, acc);
    }
    let mut sum = hsum_ps(acc);
    for (xb, yb) in xp.remainder().iter().zip(yp.remainder()) {
        let raw = ld128(&xb.qs, 0);
        let q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(raw), raw), m4);
        let a = ld256(&yb.qs, 0);
        let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, a);
        let t = _mm256_dpbusd_epi32(_mm256_setzero_si256(), eight, a);
        sum += d2(xb.d, yb.d) * hsum_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s, t)));
    }
    sum
}
