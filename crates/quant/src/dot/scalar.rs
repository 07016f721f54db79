//! Scalar reference dots: one weight row against one activation row.
//!
//! Each function follows the integer-sum formulation of ggml's generic
//! `ggml_vec_dot_<w>_<a>` (ggml/src/ggml-cpu/quants.c): integer products are summed per
//! (sub-)block and scaled once, so the SIMD kernels can reproduce them exactly up to the
//! order of the final float additions. These are the oracle every SIMD path is tested
//! against, and the fallback on CPUs without one.
//!
//! Every function takes `w` (the weight row's bytes, `n / block_size` blocks), `act`
//! (the activation row's bytes in the paired format of [`crate::vec_dot_type`]) and `n`
//! (elements); lengths are checked by the caller ([`super::check_lengths`]).

use crate::blocks::*;
use bytemuck::cast_slice;

#[inline]
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

#[inline]
fn q8k_d(b: &BlockQ8K) -> f32 {
    f32::from_le_bytes(b.d)
}

#[inline]
fn bsum(b: &BlockQ8K, j: usize) -> i32 {
    i16::from_le_bytes(b.bsums[j]) as i32
}

/// F32 weights · f32 activations.
pub fn dot_f32(w: &[u8], act: &[u8], n: usize) -> f32 {
    (0..n).map(|i| f32_at(w, i) * f32_at(act, i)).sum()
}

/// F16 weights · f32 activations.
pub fn dot_f16(w: &[u8], act: &[u8], n: usize) -> f32 {
    (0..n)
        .map(|i| f16_le([w[2 * i], w[2 * i + 1]]) * f32_at(act, i))
        .sum()
}

/// BF16 weights · f32 activations (bf16 is the top half of an f32).
pub fn dot_bf16(w: &[u8], act: &[u8], n: usize) -> f32 {
    (0..n)
        .map(|i| {
            let bits = (u16::from_le_bytes([w[2 * i], w[2 * i + 1]]) as u32) << 16;
            f32::from_bits(bits) * f32_at(act, i)
        })
        .sum()
}

/// Q4_0 · Q8_0: q = nibble - 8; low nibbles are elements 0..16, high 16..32.
pub fn dot_q4_0(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ4_0] = cast_slice(w);
    let y: &[BlockQ8_0] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK4_0) {
        let mut sumi = 0i32;
        for j in 0..16 {
            let v0 = (xb.qs[j] & 0x0f) as i32 - 8;
            let v1 = (xb.qs[j] >> 4) as i32 - 8;
            sumi += v0 * yb.qs[j] as i32 + v1 * yb.qs[j + 16] as i32;
        }
        sum += sumi as f32 * f16_le(xb.d) * f16_le(yb.d);
    }
    sum
}

/// Q4_1 · Q8_1: x = d q + m, so the min contributes m * s_y with s_y = d_y sum(q_y).
pub fn dot_q4_1(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ4_1] = cast_slice(w);
    let y: &[BlockQ8_1] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK4_1) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += (xb.qs[j] & 0x0f) as i32 * yb.qs[j] as i32
                + (xb.qs[j] >> 4) as i32 * yb.qs[j + 16] as i32;
        }
        sum += f16_le(xb.d) * f16_le(yb.d) * sumi as f32 + f16_le(xb.m) * f16_le(yb.s);
    }
    sum
}

/// The 5-bit value of element `j` (0..32) of a Q5 block, before the -16 offset.
#[inline]
fn q5_value(qs: &[u8; 16], qh: u32, j: usize) -> i32 {
    let lo = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    (lo as i32) | ((((qh >> j) & 1) as i32) << 4)
}

/// Q5_0 · Q8_0: q = (nibble | high bit << 4) - 16; bit j of `qh` belongs to element j.
pub fn dot_q5_0(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ5_0] = cast_slice(w);
    let y: &[BlockQ8_0] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK5_0) {
        let qh = u32::from_le_bytes(xb.qh);
        let sumi: i32 = (0..32)
            .map(|j| (q5_value(&xb.qs, qh, j) - 16) * yb.qs[j] as i32)
            .sum();
        sum += sumi as f32 * f16_le(xb.d) * f16_le(yb.d);
    }
    sum
}

/// Q5_1 · Q8_1: q in 0..32 plus the min term.
pub fn dot_q5_1(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ5_1] = cast_slice(w);
    let y: &[BlockQ8_1] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK5_1) {
        let qh = u32::from_le_bytes(xb.qh);
        let sumi: i32 = (0..32)
            .map(|j| q5_value(&xb.qs, qh, j) * yb.qs[j] as i32)
            .sum();
        sum += f16_le(xb.d) * f16_le(yb.d) * sumi as f32 + f16_le(xb.m) * f16_le(yb.s);
    }
    sum
}

/// Q8_0 · Q8_0.
pub fn dot_q8_0(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ8_0] = cast_slice(w);
    let y: &[BlockQ8_0] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK8_0) {
        let sumi: i32 = xb
            .qs
            .iter()
            .zip(&yb.qs)
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
        sum += sumi as f32 * f16_le(xb.d) * f16_le(yb.d);
    }
    sum
}

/// IQ4_NL · Q8_0: q = KVALUES_IQ4NL[nibble].
pub fn dot_iq4_nl(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockIQ4NL] = cast_slice(w);
    let y: &[BlockQ8_0] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK4_NL) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += KVALUES_IQ4NL[(xb.qs[j] & 0x0f) as usize] as i32 * yb.qs[j] as i32
                + KVALUES_IQ4NL[(xb.qs[j] >> 4) as usize] as i32 * yb.qs[j + 16] as i32;
        }
        sum += sumi as f32 * f16_le(xb.d) * f16_le(yb.d);
    }
    sum
}

/// Q2_K · Q8_K: 16 sub-blocks of 16, each with a 4-bit scale (low nibble) and 4-bit min
/// (high nibble); x = d * scale * q - dmin * min, q in 0..4.
/// Element `128 h + 32 j + l` is bits `2j..2j+2` of `qs[32 h + l]`.
pub fn dot_q2_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ2K] = cast_slice(w);
    let y: &[BlockQ8K] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK_K) {
        let summs: i32 = (0..16)
            .map(|j| bsum(yb, j) * (xb.scales[j] >> 4) as i32)
            .sum();
        let mut isum = 0i32;
        for e0 in (0..QK_K).step_by(16) {
            let (h, j, l0) = (e0 / 128, (e0 % 128) / 32, e0 % 32);
            let sc = (xb.scales[e0 / 16] & 0x0f) as i32;
            let s: i32 = (0..16)
                .map(|l| {
                    let q = (xb.qs[32 * h + l0 + l] >> (2 * j)) & 3;
                    q as i32 * yb.qs[e0 + l] as i32
                })
                .sum();
            isum += sc * s;
        }
        let dy = q8k_d(yb);
        sum += dy * f16_le(xb.d) * isum as f32 - dy * f16_le(xb.dmin) * summs as f32;
    }
    sum
}

/// The 16 signed 6-bit sub-block scales of a Q3_K block (ggml's kmask1/kmask2 unpacking):
/// low 4 bits from bytes 0..8, high 2 bits from bytes 8..12, minus 32.
pub fn q3_k_scales(packed: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = if j < 8 {
            packed[j] & 0x0f
        } else {
            packed[j - 8] >> 4
        };
        let hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (lo | (hi << 4)) as i8 - 32;
    }
    out
}

/// Q3_K · Q8_K: q = (2 low bits) - 4 * (high bit clear), in -4..4; scales from
/// [`q3_k_scales`]. Element `128 h + 32 j + l`: bits `2j..` of `qs[32 h + l]`, high bit
/// `hmask[l]` bit `4 h + j`.
pub fn dot_q3_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ3K] = cast_slice(w);
    let y: &[BlockQ8K] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK_K) {
        let scales = q3_k_scales(&xb.scales);
        let mut isum = 0i32;
        for e0 in (0..QK_K).step_by(16) {
            let (h, j, l0) = (e0 / 128, (e0 % 128) / 32, e0 % 32);
            let s: i32 = (0..16)
                .map(|l| {
                    let lo = ((xb.qs[32 * h + l0 + l] >> (2 * j)) & 3) as i32;
                    let high = (xb.hmask[l0 + l] >> (4 * h + j)) & 1;
                    let q = lo - if high == 0 { 4 } else { 0 };
                    q * yb.qs[e0 + l] as i32
                })
                .sum();
            isum += scales[e0 / 16] as i32 * s;
        }
        sum += q8k_d(yb) * f16_le(xb.d) * isum as f32;
    }
    sum
}

/// The 8 6-bit (scale, min) pairs of a Q4_K / Q5_K block (ggml's `get_scale_min_k4`).
#[inline]
pub fn k4_scale_min(q: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Q4_K · Q8_K: 8 sub-blocks of 32, x = d * sc * q - dmin * m, q in 0..16.
/// Sub-block `2c` is the low nibbles of `qs[32c..32c+32]`, `2c+1` the high nibbles.
pub fn dot_q4_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ4K] = cast_slice(w);
    let y: &[BlockQ8K] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK_K) {
        let (mut isum, mut summs) = (0i32, 0i32);
        for sb in 0..8 {
            let (sc, m) = k4_scale_min(&xb.scales, sb);
            let (c, shift) = (sb / 2, 4 * (sb % 2));
            let s: i32 = (0..32)
                .map(|l| ((xb.qs[32 * c + l] >> shift) & 0x0f) as i32 * yb.qs[32 * sb + l] as i32)
                .sum();
            isum += sc as i32 * s;
            summs += m as i32 * (bsum(yb, 2 * sb) + bsum(yb, 2 * sb + 1));
        }
        let dy = q8k_d(yb);
        sum += dy * f16_le(xb.d) * isum as f32 - dy * f16_le(xb.dmin) * summs as f32;
    }
    sum
}

/// Q5_K · Q8_K: as Q4_K with a 5th bit: element `32 sb + l` takes bit `sb` of `qh[l]`.
pub fn dot_q5_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ5K] = cast_slice(w);
    let y: &[BlockQ8K] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK_K) {
        let (mut isum, mut summs) = (0i32, 0i32);
        for sb in 0..8 {
            let (sc, m) = k4_scale_min(&xb.scales, sb);
            let (c, shift) = (sb / 2, 4 * (sb % 2));
            let s: i32 = (0..32)
                .map(|l| {
                    let lo = (xb.qs[32 * c + l] >> shift) & 0x0f;
                    let hi = (xb.qh[l] >> sb) & 1;
                    (lo | (hi << 4)) as i32 * yb.qs[32 * sb + l] as i32
                })
                .sum();
            isum += sc as i32 * s;
            summs += m as i32 * (bsum(yb, 2 * sb) + bsum(yb, 2 * sb + 1));
        }
        let dy = q8k_d(yb);
        sum += dy * f16_le(xb.d) * isum as f32 - dy * f16_le(xb.dmin) * summs as f32;
    }
    sum
}

/// The 6-bit value (0..64, before the -32 offset) of element `e` of a Q6_K block.
/// Element `128 h + 32 k + l` (k in 0..4): low 4 bits from `ql[64 h + l + 32 (k & 1)]`
/// (low nibble for k < 2, high for k >= 2), high 2 bits `2k..` of `qh[32 h + l]`.
#[inline]
pub fn q6_k_value(b: &BlockQ6K, e: usize) -> u8 {
    let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
    let ql = b.ql[64 * h + l + 32 * (k & 1)];
    let lo = if k < 2 { ql & 0x0f } else { ql >> 4 };
    let hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
    lo | (hi << 4)
}

/// Q6_K · Q8_K: 16 sub-blocks of 16 with signed 8-bit scales, q in -32..32.
pub fn dot_q6_k(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockQ6K] = cast_slice(w);
    let y: &[BlockQ8K] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK_K) {
        let mut isum = 0i32;
        for sb in 0..16 {
            let s: i32 = (16 * sb..16 * sb + 16)
                .map(|e| (q6_k_value(xb, e) as i32 - 32) * yb.qs[e] as i32)
                .sum();
            isum += xb.scales[sb] as i32 * s;
        }
        sum += q8k_d(yb) * f16_le(xb.d) * isum as f32;
    }
    sum
}

/// The 6-bit scale (0..64, before the -32 offset) of sub-block `ib` of an IQ4_XS block.
#[inline]
pub fn iq4_xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes(b.scales_h);
    let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
    let hi = ((scales_h >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i32
}

/// IQ4_XS · Q8_K: 8 sub-blocks of 32 with 6-bit scales; within a sub-block low nibbles
/// of `qs[16 ib..16 ib + 16]` are elements 0..16 and high nibbles 16..32.
pub fn dot_iq4_xs(w: &[u8], act: &[u8], n: usize) -> f32 {
    let x: &[BlockIQ4XS] = cast_slice(w);
    let y: &[BlockQ8K] = cast_slice(act);
    let mut sum = 0.0f32;
    for (xb, yb) in x.iter().zip(y).take(n / QK_K) {
        let mut isum = 0i32;
        for ib in 0..8 {
            let q = &xb.qs[16 * ib..16 * ib + 16];
            let a = &yb.qs[32 * ib..32 * ib + 32];
            let mut s = 0i32;
            for j in 0..16 {
                s += KVALUES_IQ4NL[(q[j] & 0x0f) as usize] as i32 * a[j] as i32
                    + KVALUES_IQ4NL[(q[j] >> 4) as usize] as i32 * a[j + 16] as i32;
            }
            isum += (iq4_xs_scale(xb, ib) - 32) * s;
        }
        sum += q8k_d(yb) * f16_le(xb.d) * isum as f32;
    }
    sum
}
