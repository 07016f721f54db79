//! AVX2 + FMA + F16C dot kernels.
//!
//! Design (after ggml's ggml-cpu/arch/x86/quants.c, our own code): weights are unpacked
//! to bytes in 256-bit registers, multiplied with the int8 activations by `vpmaddubsw`
//! (unsigned × signed → pairs summed to i16), widened to i32 by `vpmaddwd` against the
//! sub-block scales (or ones), and every block's integer sum is scaled into an f32
//! accumulator with one FMA. Signed × signed products use the sign trick
//! `maddubs(|x|, sign(y, x))`; activations never hold -128, so the i16 pairs cannot
//! overflow. Formats not listed in [`kernel`] use the scalar reference.
//!
//! Every kernel views its rows as blocks with `bytemuck::cast_slice` after
//! [`check_lengths`], so all loads are from fixed-size block fields.

use super::{check_lengths, DotFn};
use crate::blocks::*;
use bytemuck::cast_slice;
use gguf::GgmlType;
use std::arch::x86_64::*;

/// The AVX2 kernel for `ty`, if this module has one (Q4_0, Q8_0, Q4_K and Q6_K are the
/// single-token forms of the kernels in `avx2_tile.rs`).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C: the returned safe `fn`s run those instructions.
pub(super) unsafe fn kernel(ty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => |w, a, n| {
            check_lengths(F32, w, a, n);
            // SAFETY: `kernel` is only called after AVX2+FMA+F16C were detected.
            unsafe { dot_f32(w, a) }
        },
        F16 => |w, a, n| {
            check_lengths(F16, w, a, n);
            // SAFETY: as above.
            unsafe { dot_f16(w, a) }
        },
        BF16 => |w, a, n| {
            check_lengths(BF16, w, a, n);
            // SAFETY: as above.
            unsafe { dot_bf16(w, a) }
        },
        Q4_1 => |w, a, n| {
            check_lengths(Q4_1, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q4_1(cast_slice(w), cast_slice(a)) }
        },
        Q5_0 => |w, a, n| {
            check_lengths(Q5_0, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q5_0(cast_slice(w), cast_slice(a)) }
        },
        Q5_1 => |w, a, n| {
            check_lengths(Q5_1, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q5_1(cast_slice(w), cast_slice(a)) }
        },
        IQ4NL => |w, a, n| {
            check_lengths(IQ4NL, w, a, n);
            // SAFETY: as above.
            unsafe { dot_iq4_nl(cast_slice(w), cast_slice(a)) }
        },
        Q2K => |w, a, n| {
            check_lengths(Q2K, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q2_k(cast_slice(w), cast_slice(a)) }
        },
        Q3K => |w, a, n| {
            check_lengths(Q3K, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q3_k(cast_slice(w), cast_slice(a)) }
        },
        Q5K => |w, a, n| {
            check_lengths(Q5K, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q5_k(cast_slice(w), cast_slice(a)) }
        },
        IQ4XS => |w, a, n| {
            check_lengths(IQ4XS, w, a, n);
            // SAFETY: as above.
            unsafe { dot_iq4_xs(cast_slice(w), cast_slice(a)) }
        },
        _ => return None,
    })
}

// ---- loads and reductions -------------------------------------------------------------

/// 32 bytes at `s[off..off + 32]` (bounds-checked; no alignment needed).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ld256<T: bytemuck::Pod>(s: &[T], off: usize) -> __m256i {
    let b: &[u8] = cast_slice(s);
    let b = &b[off * size_of::<T>()..off * size_of::<T>() + 32];
    // SAFETY: `b` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// 16 bytes at `s[off..off + 16]` (bounds-checked; no alignment needed).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn ld128<T: bytemuck::Pod>(s: &[T], off: usize) -> __m128i {
    let b: &[u8] = cast_slice(s);
    let b = &b[off * size_of::<T>()..off * size_of::<T>() + 16];
    // SAFETY: `b` is 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Signed int8 × int8, adjacent 4 products summed into 8 i32 lanes (`y` never -128).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mul_sum_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// Unsigned bytes (< 128) × signed int8, adjacent 4 products summed into 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn mul_sum_u8_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// 16 packed bytes → 32 nibbles: low nibbles in bytes 0..16, high nibbles in 16..32.
#[inline]
#[target_feature(enable = "avx2")]
fn nibbles_32(qs: &[u8; 16]) -> __m256i {
    let x = ld128(qs, 0);
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(x, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), m4);
    _mm256_set_m128i(hi, lo)
}

/// 32 bits → 32 bytes, 0xFF where the bit is set (byte j ← bit j).
#[inline]
#[target_feature(enable = "avx2")]
fn bytes_from_bits_32(qh: [u8; 4]) -> __m256i {
    let bits = _mm256_set1_epi32(i32::from_le_bytes(qh));
    // Byte j takes source byte j / 8 ...
    let spread = _mm256_shuffle_epi8(
        bits,
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    // ... and keeps only bit j % 8 clear in a mask of all other bits.
    let mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, mask), _mm256_set1_epi64x(-1))
}

/// Low two lanes of `vcvtph2ps` of the 32-bit `bits`, through a zeroing `vmovd`.
///
/// Written in asm because LLVM, seeing only the low lanes used, narrows
/// `_mm_cvtsi32_si128` / `_mm_set1_epi16` to a `vpinsrw` that merges into an arbitrary
/// register, often the loop's accumulator, chaining every block onto the previous FMA
/// (measured: Q8_0 at half speed, Q4_K capped at ~17 GB/s).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn cvt_f16x2(bits: u32) -> __m128 {
    let out: __m128;
    // SAFETY: register-only instructions of the enabled F16C feature; no memory access.
    unsafe {
        std::arch::asm!(
            "vmovd {x}, {g:e}",
            "vcvtph2ps {x}, {x}",
            g = in(reg) bits,
            x = out(xmm_reg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// Four f16 (little-endian in `bits`) → 4 f32 lanes, through a zeroing `vmovq` (see
/// [`cvt_f16x2`] for why asm).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn cvt_f16x4(bits: u64) -> __m128 {
    let out: __m128;
    // SAFETY: register-only instructions of the enabled F16C feature; no memory access.
    unsafe {
        std::arch::asm!(
            "vmovq {x}, {g}",
            "vcvtph2ps {x}, {x}",
            g = in(reg) bits,
            x = out(xmm_reg) out,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    out
}

/// f16 bits → f32 with F16C (the `half` crate's portable conversion is far slower).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn f16c(b: [u8; 2]) -> f32 {
    _mm_cvtss_f32(cvt_f16x2(u16::from_le_bytes(b) as u32))
}

/// Product of two f16 scales, converted together.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn d2(a: [u8; 2], b: [u8; 2]) -> f32 {
    let v = cvt_f16x2(u32::from_le_bytes([a[0], a[1], b[0], b[1]]));
    _mm_cvtss_f32(_mm_mul_ss(v, _mm_movehdup_ps(v)))
}

// ---- float weights --------------------------------------------------------------------

/// F32 · f32, four independent accumulators.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len() / 4;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            let wv = _mm256_castsi256_ps(ld256(w, 4 * (i + 8 * k)));
            let av = _mm256_castsi256_ps(ld256(a, 4 * (i + 8 * k)));
            *acc_k = _mm256_fmadd_ps(wv, av, *acc_k);
        }
        i += 32;
    }
    while i + 8 <= n {
        let wv = _mm256_castsi256_ps(ld256(w, 4 * i));
        let av = _mm256_castsi256_ps(ld256(a, 4 * i));
        acc[0] = _mm256_fmadd_ps(wv, av, acc[0]);
        i += 8;
    }
    let mut sum = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        sum += f32::from_le_bytes(w[4 * j..4 * j + 4].try_into().unwrap())
            * f32::from_le_bytes(a[4 * j..4 * j + 4].try_into().unwrap());
    }
    sum
}

/// 8 f16 weights at element `i` widened to f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn ld_f16x8(w: &[u8], i: usize) -> __m256 {
    _mm256_cvtph_ps(ld128(w, 2 * i))
}

/// 8 bf16 weights at element `i` widened to f32 (bf16 is the top half of an f32).
#[inline]
#[target_feature(enable = "avx2")]
fn ld_bf16x8(w: &[u8], i: usize) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(ld128(
        w,
        2 * i,
    ))))
}

macro_rules! half_dot {
    ($name:ident, $load:ident, $scalar:expr) => {
        /// Half-precision weights · f32, four independent accumulators.
        #[target_feature(enable = "avx2,fma,f16c")]
        fn $name(w: &[u8], a: &[u8]) -> f32 {
            let n = w.len() / 2;
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for (k, acc_k) in acc.iter_mut().enumerate() {
                    let wv = $load(w, i + 8 * k);
                    let av = _mm256_castsi256_ps(ld256(a, 4 * (i + 8 * k)));
                    *acc_k = _mm256_fmadd_ps(wv, av, *acc_k);
                }
                i += 32;
            }
            while i + 8 <= n {
                let av = _mm256_castsi256_ps(ld256(a, 4 * i));
                acc[0] = _mm256_fmadd_ps($load(w, i), av, acc[0]);
                i += 8;
            }
            let mut sum = hsum_ps(_mm256_add_ps(
                _mm256_add_ps(acc[0], acc[1]),
                _mm256_add_ps(acc[2], acc[3]),
            ));
            for j in i..n {
                let wj: f32 = $scalar([w[2 * j], w[2 * j + 1]]);
                sum += wj * f32::from_le_bytes(a[4 * j..4 * j + 4].try_into().unwrap());
            }
            sum
        }
    };
}

half_dot!(dot_f16, ld_f16x8, f16_le);
half_dot!(dot_bf16, ld_bf16x8, |b: [u8; 2]| f32::from_bits(
    (u16::from_le_bytes(b) as u32) << 16
));

// ---- 32-wide block formats ------------------------------------------------------------

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q4_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let p = mul_sum_u8_i8(nibbles_32(&xb.qs), ld256(&yb.qs, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d2(xb.d, yb.d)), _mm256_cvtepi32_ps(p), acc);
        mins += d2(xb.m, yb.s);
    }
    hsum_ps(acc) + mins
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (xb, yb) in x.iter().zip(y) {
        // (nibble | 0xF0) read as i8 is nibble - 16, which is the value when the bit is clear.
        let hi = _mm256_andnot_si256(bytes_from_bits_32(xb.qh), _mm256_set1_epi8(0xf0u8 as i8));
        let q = _mm256_or_si256(nibbles_32(&xb.qs), hi);
        let p = mul_sum_i8(q, ld256(&yb.qs, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d2(xb.d, yb.d)), _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let hi = _mm256_and_si256(bytes_from_bits_32(xb.qh), _mm256_set1_epi8(0x10));
        let q = _mm256_or_si256(nibbles_32(&xb.qs), hi);
        let p = mul_sum_u8_i8(q, ld256(&yb.qs, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d2(xb.d, yb.d)), _mm256_cvtepi32_ps(p), acc);
        mins += d2(xb.m, yb.s);
    }
    hsum_ps(acc) + mins
}

/// The IQ4 code book in both 128-bit lanes, for `vpshufb` lookups.
#[inline]
#[target_feature(enable = "avx2")]
fn iq4_table() -> __m128i {
    ld128(&KVALUES_IQ4NL, 0)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq4_nl(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let table = _mm256_broadcastsi128_si256(iq4_table());
    let mut acc = _mm256_setzero_ps();
    for (xb, yb) in x.iter().zip(y) {
        let q = _mm256_shuffle_epi8(table, nibbles_32(&xb.qs));
        let p = mul_sum_i8(q, ld256(&yb.qs, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d2(xb.d, yb.d)), _mm256_cvtepi32_ps(p), acc);
    }
    hsum_ps(acc)
}

// ---- K-quants -------------------------------------------------------------------------

/// The 8 scales (bytes 0..8) and 8 mins (bytes 8..16) of a Q4_K / Q5_K block, unpacked
/// from 6 bits (ggml's kmask1..3 shuffle of `get_scale_min_k4`).
#[inline]
pub(super) fn k4_scales_mins(packed: &[u8; 12]) -> [u8; 16] {
    let u = |i: usize| u32::from_le_bytes(packed[4 * i..4 * i + 4].try_into().unwrap());
    let (u0, u1, u2) = (u(0), u(1), u(2));
    const M6: u32 = 0x3f3f_3f3f;
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let scales_lo = u0 & M6;
    let scales_hi = (u2 & M4) | (((u0 >> 6) & M2) << 4);
    let mins_lo = u1 & M6;
    let mins_hi = ((u2 >> 4) & M4) | (((u1 >> 6) & M2) << 4);
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&scales_lo.to_le_bytes());
    out[4..8].copy_from_slice(&scales_hi.to_le_bytes());
    out[8..12].copy_from_slice(&mins_lo.to_le_bytes());
    out[12..16].copy_from_slice(&mins_hi.to_le_bytes());
    out
}

/// dmin * sum_j min_j * (bsum_2j + bsum_2j+1) for one block, as 4 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn k4_min_term(mins: __m128i, yb: &BlockQ8K, dmin: f32, acc: __m128) -> __m128 {
    let bs = ld256(&yb.bsums, 0);
    let sums = _mm_hadd_epi16(
        _mm256_castsi256_si128(bs),
        _mm256_extracti128_si256::<1>(bs),
    );
    let prod = _mm_madd_epi16(_mm_cvtepu8_epi16(mins), sums);
    _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc)
}

#[inline]
#[target_feature(enable = "avx2")]
fn hsum_ps128(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q5_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let m4 = _mm256_set1_epi8(0x0f);
    let m1 = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (xb, yb) in x.iter().zip(y) {
        let dy = f32::from_le_bytes(yb.d);
        let sm = k4_scales_mins(&xb.scales);
        acc_m = k4_min_term(
            _mm_srli_si128::<8>(ld128(&sm, 0)),
            yb,
            -dy * f16c(xb.dmin),
            acc_m,
        );
        let hbits = ld256(&xb.qh, 0);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q4 = ld256(&xb.qs, 32 * j);
            // The 5th bit of sub-block s is bit s of each qh byte, moved to bit 4.
            let (hl, hh) = match j {
                0 => (hbits, _mm256_srli_epi16::<1>(hbits)),
                1 => (_mm256_srli_epi16::<2>(hbits), _mm256_srli_epi16::<3>(hbits)),
                2 => (_mm256_srli_epi16::<4>(hbits), _mm256_srli_epi16::<5>(hbits)),
                _ => (_mm256_srli_epi16::<6>(hbits), _mm256_srli_epi16::<7>(hbits)),
            };
            let hl = _mm256_slli_epi16::<4>(_mm256_and_si256(hl, m1));
            let hh = _mm256_slli_epi16::<4>(_mm256_and_si256(hh, m1));
            let lo = _mm256_or_si256(_mm256_and_si256(q4, m4), hl);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4), hh);
            let pl = _mm256_maddubs_epi16(lo, ld256(&yb.qs, 64 * j));
            let ph = _mm256_maddubs_epi16(hi, ld256(&yb.qs, 64 * j + 32));
            let pl = _mm256_madd_epi16(pl, _mm256_set1_epi16(sm[2 * j] as i16));
            let ph = _mm256_madd_epi16(ph, _mm256_set1_epi16(sm[2 * j + 1] as i16));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        let d = dy * f16c(xb.d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + hsum_ps128(acc_m)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_iq4_xs(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let table = iq4_table();
    let m4 = _mm_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_ps();
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let raw = ld128(&xb.qs, 16 * ib);
            let lo = _mm_shuffle_epi8(table, _mm_and_si128(raw, m4));
            let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
            let q = _mm256_set_m128i(hi, lo);
            let a = ld256(&yb.qs, 32 * ib);
            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
            let ls = super::scalar::iq4_xs_scale(xb, ib) as i16 - 32;
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(ls)));
        }
        let d = f32::from_le_bytes(yb.d) * f16c(xb.d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Shuffle masks picking, from i16 scales copied to both 128-bit lanes, scale `2k` for
/// the low lane and `2k + 1` for the high lane (k = quarter of a 128-element half).
#[inline]
#[target_feature(enable = "avx2")]
fn quarter_scale_masks() -> [__m256i; 4] {
    std::array::from_fn(|k| {
        let (a, b) = (2 * k, 2 * k + 1);
        let lo = _mm_set1_epi16((((2 * a + 1) << 8) | (2 * a)) as i16);
        let hi = _mm_set1_epi16((((2 * b + 1) << 8) | (2 * b)) as i16);
        _mm256_set_m128i(hi, lo)
    })
}

/// `v >> n` on 16-bit lanes, for a run-time `n`.
#[inline]
#[target_feature(enable = "avx2")]
fn srl16(v: __m256i, n: usize) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
}

/// The 16 6-bit Q3_K scales before the -32 offset, unpacked with 32-bit masks as ggml
/// does (same result as [`super::scalar::q3_k_scales`] + 32).
#[inline]
fn q3_k_scales_biased(packed: &[u8; 12]) -> [u8; 16] {
    let u = |i: usize| u32::from_le_bytes(packed[4 * i..4 * i + 4].try_into().unwrap());
    let (a0, a1, tmp) = (u(0), u(1), u(2));
    const M4: u32 = 0x0f0f_0f0f;
    const M2: u32 = 0x0303_0303;
    let words = [
        (a0 & M4) | ((tmp & M2) << 4),
        (a1 & M4) | (((tmp >> 2) & M2) << 4),
        ((a0 >> 4) & M4) | (((tmp >> 4) & M2) << 4),
        ((a1 >> 4) & M4) | (((tmp >> 6) & M2) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// Q3_K · Q8_K. With u = q + 4 = (2 low bits) | (high bit << 2) in 0..8 (unsigned for
/// `maddubs`), sum sc * q * a = sum sc * u * a - 4 * sum_sb sc_sb * bsum_sb.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q3_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m1 = _mm256_set1_epi8(1);
    let masks = quarter_scale_masks();
    let mut acc = _mm256_setzero_ps();
    for (xb, yb) in x.iter().zip(y) {
        let sc8 = q3_k_scales_biased(&xb.scales);
        let s16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(ld128(&sc8, 0), _mm_set1_epi8(32)));
        let halves = [
            _mm256_permute2x128_si256::<0x00>(s16, s16),
            _mm256_permute2x128_si256::<0x11>(s16, s16),
        ];
        let hmask = ld256(&xb.hmask, 0);
        let mut sumi = _mm256_setzero_si256();
        for (h, s_half) in halves.into_iter().enumerate() {
            let qs = ld256(&xb.qs, 32 * h);
            for (k, mask) in masks.iter().enumerate() {
                // Element 128h + 32k + l: bits 2k.. of qs[32h + l], high bit 4h+k of hmask[l].
                let low = _mm256_and_si256(srl16(qs, 2 * k), m3);
                let high = _mm256_and_si256(srl16(hmask, 4 * h + k), m1);
                let u = _mm256_or_si256(low, _mm256_slli_epi16::<2>(high));
                let p = _mm256_maddubs_epi16(u, ld256(&yb.qs, 128 * h + 32 * k));
                let sc = _mm256_shuffle_epi8(s_half, *mask);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
            }
        }
        let corr = _mm256_madd_epi16(s16, ld256(&yb.bsums, 0));
        let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<2>(corr));
        let d = f32::from_le_bytes(yb.d) * f16c(xb.d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q2_K · Q8_K: q in 0..4 with 4-bit scales (low nibbles) and mins (high nibbles), both
/// per sub-block of 16; the mins meet the activations through `bsums`.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_q2_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0f);
    let masks = quarter_scale_masks();
    let mut acc = _mm256_setzero_ps();
    for (xb, yb) in x.iter().zip(y) {
        let raw = ld128(&xb.scales, 0);
        let s16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
        let mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
        let halves = [
            _mm256_permute2x128_si256::<0x00>(s16, s16),
            _mm256_permute2x128_si256::<0x11>(s16, s16),
        ];
        let mut sumi = _mm256_setzero_si256();
        for (h, s_half) in halves.into_iter().enumerate() {
            let qs = ld256(&xb.qs, 32 * h);
            for (j, mask) in masks.iter().enumerate() {
                // Element 128h + 32j + l: bits 2j.. of qs[32h + l].
                let q = _mm256_and_si256(srl16(qs, 2 * j), m3);
                let p = _mm256_maddubs_epi16(q, ld256(&yb.qs, 128 * h + 32 * j));
                let sc = _mm256_shuffle_epi8(s_half, *mask);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
            }
        }
        let summs = _mm256_madd_epi16(mins16, ld256(&yb.bsums, 0));
        let dy = f32::from_le_bytes(yb.d);
        let d = _mm256_set1_ps(dy * f16c(xb.d));
        let dmin = _mm256_set1_ps(-dy * f16c(xb.dmin));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
        acc = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(summs), acc);
    }
    hsum_ps(acc)
}
