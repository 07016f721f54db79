//! AVX-512 VNNI multi-token kernels for Q4_K, Q5_K and Q6_K (prefill of Q4_K_M / Q5_K_M
//! models) and for Q4_0 / Q8_0.
//!
//! Design: as `avx2_tile.rs`, but with 32 zmm registers a whole unpacked block fits in
//! registers: 4 × 64 weights as bytes plus their 4 per-lane scale vectors, reused for up
//! to 8 tokens. Per token and 64 weights the work is one `vpmaddubsw` (u8 × i8 → i16 pairs)
//! and one VNNI `vpdpwssd` (× scale, accumulated in i32).

use super::avx2::{cvt_f16x2, f16c, hsum_ps, k4_scales_mins, ld128, ld256};
use super::{row_lengths, DotTileFn};
use crate::blocks::*;
use bytemuck::cast_slice;
use gguf::GgmlType;
use std::arch::x86_64::*;

/// Most tokens per call of these kernels.
pub(super) const MAX_T: usize = 8;

/// 64 bytes at `s[off..off + 64]` (bounds-checked; no alignment needed).
#[inline]
#[target_feature(enable = "avx512f")]
fn ld512(s: &[i8], off: usize) -> __m512i {
    let b = &s[off..off + 64];
    // SAFETY: `b` is 64 readable bytes; loadu has no alignment requirement.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// `lo` in bytes 0..32, `hi` in 32..64.
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

/// i16 lane indices: element `a` for lanes 0..16, `a + 1` for 16..32.
#[inline]
#[target_feature(enable = "avx512f")]
fn pair_index(a: i16) -> __m512i {
    join(_mm256_set1_epi16(a), _mm256_set1_epi16(a + 1))
}

/// Q4_K / Q5_K row · `T` Q8_K rows: 4-bit quants (plus, for Q5_K, a 5th bit added by
/// `$high` to the 64 unpacked weights `$q` of chunk `$c` of block `$xb`), 6-bit scales
/// and mins.
macro_rules! k4_tile {
    ($name:ident, $block:ty, |$xb:ident, $c:ident, $q:ident| $high:expr) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        fn $name<const T: usize>(x: &[$block], ys: [&[BlockQ8K]; T]) -> [f32; T] {
            let m4 = _mm512_set1_epi8(0x0f);
            let idx = [pair_index(0), pair_index(2), pair_index(4), pair_index(6)];
            let mut acc = [_mm512_setzero_ps(); T];
            for (b, xb) in x.iter().enumerate() {
                let sm = k4_scales_mins(&xb.scales);
                let smv = ld128(&sm, 0);
                let scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(smv));
                // Each min doubled to sit over its two 16-sums (bsums) for one vpmaddwd per token.
                let mins2 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(
                    smv,
                    _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15),
                ));
                // Unpacked once: 64 weights (sub-blocks 2c, 2c+1) and their scales per c.
                let q: [__m512i; 4] = std::array::from_fn(|c| {
                    let raw = ld256(&xb.qs, 32 * c);
                    let $q = _mm512_and_si512(join(raw, _mm256_srli_epi16::<4>(raw)), m4);
                    let ($xb, $c) = (xb, c);
                    $high
                });
                let sc: [__m512i; 4] =
                    std::array::from_fn(|c| _mm512_permutexvar_epi16(idx[c], scales));
                let d = f16c(xb.d);
                let dmin = f16c(xb.dmin);
                for t in 0..T {
                    let yb = &ys[t][b];
                    let mut s = _mm512_setzero_si512();
                    for c in 0..4 {
                        let p = _mm512_maddubs_epi16(q[c], ld512(&yb.qs, 64 * c));
                        s = _mm512_dpwssd_epi32(s, p, sc[c]);
                    }
                    let dy = f32::from_le_bytes(yb.d);
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * dy), _mm512_cvtepi32_ps(s), acc[t]);
                    // Mins: -dmin * sum_j m_j * (bsum_2j + bsum_2j+1), in the low 8 lanes.
                    let prod = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins2, ld256(&yb.bsums, 0)));
                    let prod = _mm512_zextps256_ps512(prod);
                    acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(-dmin * dy), prod, acc[t]);
                }
            }
            acc.map(|v| hsum512(v))
        }
    };
}

k4_tile!(q4_k, BlockQ4K, |_xb, _c, q| q);
// Q5_K: the 5th bit of sub-block s is bit s of each qh byte (elements 32 s + l).
k4_tile!(q5_k, BlockQ5K, |xb, c, q| {
    let qh = ld256(&xb.qh, 0);
    let count = |s: usize| _mm_cvtsi32_si128(s as i32);
    let lo = _mm256_srl_epi16(qh, count(2 * c));
    let hi = _mm256_srl_epi16(qh, count(2 * c + 1));
    let bits = _mm512_and_si512(join(lo, hi), _mm512_set1_epi8(1));
    _mm512_or_si512(q, _mm512_slli_epi16::<4>(bits))
});

/// Q6_K row · `T` Q8_K rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q6_k<const T: usize>(x: &[BlockQ6K], ys: [&[BlockQ8K]; T]) -> [f32; T] {
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
    let mut acc = [_mm256_setzero_ps(); T];
    for (b, xb) in x.iter().enumerate() {
        let scales16 = _mm256_cvtepi8_epi16(ld128(&xb.scales, 0));
        let scales = _mm512_castsi256_si512(scales16);
        // Unpacked once: weights 64j..64j+64 (0..64, before the -32) and their scales.
        let mut q = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            let ql = join(ld256(&xb.ql, 64 * h), ld256(&xb.ql, 64 * h + 32));
            let qh = ld256(&xb.qh, 32 * h);
            let qh01 = join(qh, _mm256_srli_epi16::<2>(qh));
            let qh23 = _mm512_srli_epi16::<4>(qh01);
            q[2 * h] = _mm512_or_si512(
                _mm512_and_si512(ql, m4),
                _mm512_slli_epi16::<4>(_mm512_and_si512(qh01, m2)),
            );
            q[2 * h + 1] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                _mm512_slli_epi16::<4>(_mm512_and_si512(qh23, m2)),
            );
        }
        let sc: [__m512i; 4] = std::array::from_fn(|j| _mm512_permutexvar_epi16(idx[j], scales));
        let d = f16c(xb.d);
        for t in 0..T {
            let yb = &ys[t][b];
            let mut s = _mm512_setzero_si512();
            for j in 0..4 {
                let p = _mm512_maddubs_epi16(q[j], ld512(&yb.qs, 64 * j));
                s = _mm512_dpwssd_epi32(s, p, sc[j]);
            }
            // The -32 offset: 32 * sum_sb scale_sb * bsum_sb.
            let corr = _mm256_madd_epi16(scales16, ld256(&yb.bsums, 0));
            let s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
            let s8 = _mm256_sub_epi32(s8, _mm256_slli_epi32::<5>(corr));
            let dd = d * f32::from_le_bytes(yb.d);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(s8), acc[t]);
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// 32-wide signed-weight rows (Q4_0, Q8_0) · `T` Q8_0 rows, two blocks per zmm.
///
/// `vpdpbusd` wants one unsigned operand: the activations are made unsigned by flipping
/// their sign bit (a + 128 = a ^ 0x80), and the extra 128 · sum(w) of each group of 4 is
/// taken off once per block pair, not per token, by starting the accumulator at
/// -128 · sum(w). Weights are laid out per block as activations are: 32 bytes in
/// element order, block 0 in bytes 0..32 and block 1 in 32..64 of the register.
macro_rules! signed32_vnni {
    ($name:ident, $block:ty, |$xb:ident| $unpack:expr) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        fn $name<const T: usize>(x: &[$block], ys: [&[BlockQ8_0]; T]) -> [f32; T] {
            let flip = _mm512_set1_epi8(i8::MIN);
            // f32 lanes [s0, s1, ..] -> [s0 × 8, s1 × 8].
            let spread = join(_mm256_setzero_si256(), _mm256_set1_epi32(1));
            let mut acc = [_mm512_setzero_ps(); T];
            let pairs = x.len() / 2;
            for b in (0..2 * pairs).step_by(2) {
                let w0: __m256i = {
                    let $xb = &x[b];
                    $unpack
                };
                let w1: __m256i = {
                    let $xb = &x[b + 1];
                    $unpack
                };
                let w = join(w0, w1);
                let neg_corr = _mm512_sub_epi32(
                    _mm512_setzero_si512(),
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, w),
                );
                let dx = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
                    x[b].d[0],
                    x[b].d[1],
                    x[b + 1].d[0],
                    x[b + 1].d[1],
                ])));
                for t in 0..T {
                    let (y0, y1) = (&ys[t][b], &ys[t][b + 1]);
                    let a = join(ld256(&y0.qs, 0), ld256(&y1.qs, 0));
                    let s = _mm512_dpbusd_epi32(neg_corr, _mm512_xor_si512(a, flip), w);
                    let h = |d: [u8; 2]| u16::from_le_bytes(d) as u32;
                    let dy = cvt_f16x2(h(y0.d) | h(y1.d) << 16);
                    let dd =
                        _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_mul_ps(dx, dy)));
                    acc[t] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s), acc[t]);
                }
            }
            let mut out = acc.map(|v| hsum512(v));
            if x.len() % 2 == 1 {
                let b = x.len() - 1;
                let w: __m256i = {
                    let $xb = &x[b];
                    $unpack
                };
                let flip256 = _mm512_castsi512_si256(flip);
                let neg_corr = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_dpbusd_epi32(_mm256_setzero_si256(), flip256, w),
                );
                let dx = f16c(x[b].d);
                for t in 0..T {
                    let yb = &ys[t][b];
                    let a = _mm256_xor_si256(ld256(&yb.qs, 0), flip256);
                    let s = _mm256_dpbusd_epi32(neg_corr, a, w);
                    out[t] += dx * f16c(yb.d) * hsum_ps(_mm256_cvtepi32_ps(s));
                }
            }
            out
        }
    };
}

signed32_vnni!(q8_0, BlockQ8_0, |xb| ld256(&xb.qs, 0));
signed32_vnni!(q4_0, BlockQ4_0, |xb| {
    let raw = ld128(&xb.qs, 0);
    let m4 = _mm_set1_epi8(0x0f);
    let q = _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(raw), m4),
        _mm_and_si128(raw, m4),
    );
    _mm256_sub_epi8(q, _mm256_set1_epi8(8))
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
            macro_rules! run {
                ($t:literal) => {
                    // SAFETY: `tile_kernel` is only called after AVX-512 F/BW/VL/VNNI and
                    // AVX2/FMA/F16C were detected.
                    out[..$t].copy_from_slice(&unsafe {
                        $kernel::<$t>(x, std::array::from_fn(|t| y(t)))
                    })
                };
            }
            match n_tok {
                0 => {}
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                4 => run!(4),
                5 => run!(5),
                6 => run!(6),
                7 => run!(7),
                8 => run!(8),
                _ => panic!("tile of {n_tok} tokens (max {MAX_T})"),
            }
        }
    };
}

/// The AVX-512 VNNI multi-token kernel for `ty`, if this module has one.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C.
pub(super) unsafe fn tile_kernel(ty: GgmlType) -> Option<DotTileFn> {
    Some(match ty {
        GgmlType::Q4K => tile_entry!(GgmlType::Q4K, q4_k),
        GgmlType::Q5K => tile_entry!(GgmlType::Q5K, q5_k),
        GgmlType::Q6K => tile_entry!(GgmlType::Q6K, q6_k),
        GgmlType::Q4_0 => tile_entry!(GgmlType::Q4_0, q4_0),
        GgmlType::Q8_0 => tile_entry!(GgmlType::Q8_0, q8_0),
        _ => return None,
    })
}
