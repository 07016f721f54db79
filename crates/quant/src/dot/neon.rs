//! aarch64 NEON dot kernels for F32, Q4_0, Q8_0, Q4_K and Q6_K (baseline NEON only:
//! `vmull_s8` + pairwise widening adds, no dot-product extension).
//!
//! Design: weights are unpacked to signed bytes 16 at a time, multiplied with the int8
//! activations into i16 and widened to i32, and each (sub-)block's integer sum is scaled
//! once, as in the scalar reference (`scalar.rs`), which gives the bit layouts. Other
//! formats use the scalar reference. Only compile-checked on x86 hosts: run the `dot_*`
//! tests on an aarch64 machine to exercise these.

use super::scalar::k4_scale_min;
use super::{check_lengths, DotFn};
use crate::blocks::*;
use bytemuck::cast_slice;
use gguf::GgmlType;
use std::arch::aarch64::*;

/// The NEON kernel for `ty`, if this module has one.
///
/// # Safety
/// The CPU must support NEON.
pub(super) unsafe fn kernel(ty: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => |w, a, n| {
            check_lengths(F32, w, a, n);
            // SAFETY: `kernel` is only called after NEON was detected.
            unsafe { dot_f32(w, a) }
        },
        Q4_0 => |w, a, n| {
            check_lengths(Q4_0, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q4_0(cast_slice(w), cast_slice(a)) }
        },
        Q8_0 => |w, a, n| {
            check_lengths(Q8_0, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q8_0(cast_slice(w), cast_slice(a)) }
        },
        Q4K => |w, a, n| {
            check_lengths(Q4K, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q4_k(cast_slice(w), cast_slice(a)) }
        },
        Q6K => |w, a, n| {
            check_lengths(Q6K, w, a, n);
            // SAFETY: as above.
            unsafe { dot_q6_k(cast_slice(w), cast_slice(a)) }
        },
        _ => return None,
    })
}

/// 16 bytes at `s[off..off + 16]` (bounds-checked).
#[inline]
#[target_feature(enable = "neon")]
fn ld_u8(s: &[u8], off: usize) -> uint8x16_t {
    let b = &s[off..off + 16];
    // SAFETY: `b` is 16 readable bytes; vld1q has no alignment requirement beyond 1.
    unsafe { vld1q_u8(b.as_ptr()) }
}

/// 16 signed bytes at `s[off..off + 16]` (bounds-checked).
#[inline]
#[target_feature(enable = "neon")]
fn ld_i8(s: &[i8], off: usize) -> int8x16_t {
    let b = &s[off..off + 16];
    // SAFETY: as in `ld_u8`.
    unsafe { vld1q_s8(b.as_ptr()) }
}

/// 4 f32 at element `i` of a little-endian f32 byte row (bounds-checked).
#[inline]
#[target_feature(enable = "neon")]
fn ld_f32(s: &[u8], i: usize) -> float32x4_t {
    vreinterpretq_f32_u8(ld_u8(s, 4 * i))
}

/// Sum of the 16 products a[i] * b[i] as i32 lanes (i8 × i8 fits i16; pairs widened).
#[inline]
#[target_feature(enable = "neon")]
fn dot16(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi))
}

#[target_feature(enable = "neon")]
fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    let n = w.len() / 4;
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            *acc_k = vfmaq_f32(*acc_k, ld_f32(w, i + 4 * k), ld_f32(a, i + 4 * k));
        }
        i += 16;
    }
    while i + 4 <= n {
        acc[0] = vfmaq_f32(acc[0], ld_f32(w, i), ld_f32(a, i));
        i += 4;
    }
    let mut sum = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    for j in i..n {
        sum += f32::from_le_bytes(w[4 * j..4 * j + 4].try_into().unwrap())
            * f32::from_le_bytes(a[4 * j..4 * j + 4].try_into().unwrap());
    }
    sum
}

#[target_feature(enable = "neon")]
fn dot_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let s = vaddq_s32(
            dot16(ld_i8(&xb.qs, 0), ld_i8(&yb.qs, 0)),
            dot16(ld_i8(&xb.qs, 16), ld_i8(&yb.qs, 16)),
        );
        sum += vaddvq_s32(s) as f32 * f16_le(xb.d) * f16_le(yb.d);
    }
    sum
}

#[target_feature(enable = "neon")]
fn dot_q4_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let eight = vdupq_n_s8(8);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let raw = ld_u8(&xb.qs, 0);
        // Low nibbles are elements 0..16, high nibbles 16..32; q = nibble - 8.
        let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, m4)), eight);
        let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)), eight);
        let s = vaddq_s32(dot16(lo, ld_i8(&yb.qs, 0)), dot16(hi, ld_i8(&yb.qs, 16)));
        sum += vaddvq_s32(s) as f32 * f16_le(xb.d) * f16_le(yb.d);
    }
    sum
}

#[target_feature(enable = "neon")]
fn dot_q4_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let (mut isum, mut summs) = (0i32, 0i32);
        for sb in 0..8 {
            let (sc, m) = k4_scale_min(&xb.scales, sb);
            let c = sb / 2;
            let mut s = vdupq_n_s32(0);
            for half in 0..2 {
                let raw = ld_u8(&xb.qs, 32 * c + 16 * half);
                // Sub-block 2c is the low nibbles of qs[32c..32c+32], 2c+1 the high ones.
                let q = if sb % 2 == 0 {
                    vandq_u8(raw, m4)
                } else {
                    vshrq_n_u8::<4>(raw)
                };
                s = vaddq_s32(
                    s,
                    dot16(vreinterpretq_s8_u8(q), ld_i8(&yb.qs, 32 * sb + 16 * half)),
                );
            }
            isum += sc as i32 * vaddvq_s32(s);
            let bs = |j: usize| i16::from_le_bytes(yb.bsums[j]) as i32;
            summs += m as i32 * (bs(2 * sb) + bs(2 * sb + 1));
        }
        let dy = f32::from_le_bytes(yb.d);
        sum += dy * f16_le(xb.d) * isum as f32 - dy * f16_le(xb.dmin) * summs as f32;
    }
    sum
}

#[target_feature(enable = "neon")]
fn dot_q6_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let m4 = vdupq_n_u8(0x0f);
    let m2 = vdupq_n_u8(3);
    let off = vdupq_n_s8(32);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut isum = 0i32;
        for h in 0..2 {
            for l0 in [0usize, 16] {
                let ql0 = ld_u8(&xb.ql, 64 * h + l0);
                let ql1 = ld_u8(&xb.ql, 64 * h + 32 + l0);
                let qh = ld_u8(&xb.qh, 32 * h + l0);
                // Quarter k: element 128h + 32k + l (see scalar::q6_k_value).
                let q = [
                    vorrq_u8(vandq_u8(ql0, m4), vshlq_n_u8::<4>(vandq_u8(qh, m2))),
                    vorrq_u8(
                        vandq_u8(ql1, m4),
                        vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m2)),
                    ),
                    vorrq_u8(
                        vshrq_n_u8::<4>(ql0),
                        vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m2)),
                    ),
                    vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
                ];
                for (k, qk) in q.into_iter().enumerate() {
                    let e = 128 * h + 32 * k + l0;
                    let qs = vsubq_s8(vreinterpretq_s8_u8(qk), off);
                    let s = vaddvq_s32(dot16(qs, ld_i8(&yb.qs, e)));
                    isum += xb.scales[e / 16] as i32 * s;
                }
            }
        }
        sum += f32::from_le_bytes(yb.d) * f16_le(xb.d) * isum as f32;
    }
    sum
}
