//! Reference quantizers of the 32-element formats and of F16 / BF16.
//!
//! These follow ggml's `quantize_row_*_ref` (ggml/src/ggml-quants.c), which gguf-py
//! (gguf-py/gguf/quants.py) reproduces in numpy; the output is byte-identical to
//! `gguf.quants.quantize` (tests/gguf_py_vectors.rs). All arithmetic is f32, in ggml's order.

use crate::blocks::*;

/// First element of largest magnitude (ggml keeps the first on ties, as does numpy's argmax).
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline(always)]
fn inverse_or_zero(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// Truncation toward zero then clamp to `max`, as ggml's `MIN(max, (int8_t)(v))` for the
/// non-negative `v` these quantizers produce.
#[inline(always)]
fn trunc_clamp(v: f32, max: u8) -> u8 {
    (v.trunc() as u8).min(max)
}

/// x: [32] -> Q4_0 with d = max / -8, q = trunc(x / d + 8.5).
pub fn quantize_block_q4_0(x: &[f32], b: &mut BlockQ4_0) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse_or_zero(d);
    b.d = to_f16_le(d);
    for j in 0..16 {
        let q0 = trunc_clamp(x[j] * id + 8.5, 15);
        let q1 = trunc_clamp(x[j + 16] * id + 8.5, 15);
        b.qs[j] = q0 | (q1 << 4);
    }
}

/// x: [32] -> Q4_1 with d = (max - min) / 15, m = min, q = trunc((x - min) / d + 0.5).
pub fn quantize_block_q4_1(x: &[f32], b: &mut BlockQ4_1) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse_or_zero(d);
    b.d = to_f16_le(d);
    b.m = to_f16_le(min);
    for j in 0..16 {
        let q0 = trunc_clamp((x[j] - min) * id + 0.5, 15);
        let q1 = trunc_clamp((x[j + 16] - min) * id + 0.5, 15);
        b.qs[j] = q0 | (q1 << 4);
    }
}

/// x: [32] -> Q5_0 with d = max / -16, q = trunc(x / d + 16.5).
pub fn quantize_block_q5_0(x: &[f32], b: &mut BlockQ5_0) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse_or_zero(d);
    b.d = to_f16_le(d);
    let mut qh = 0u32;
    for j in 0..16 {
        let q0 = trunc_clamp(x[j] * id + 16.5, 31);
        let q1 = trunc_clamp(x[j + 16] * id + 16.5, 31);
        b.qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        qh |= ((q0 as u32) >> 4) << j;
        qh |= ((q1 as u32) >> 4) << (j + 16);
    }
    b.qh = qh.to_le_bytes();
}

/// x: [32] -> Q5_1 with d = (max - min) / 31, m = min.
pub fn quantize_block_q5_1(x: &[f32], b: &mut BlockQ5_1) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse_or_zero(d);
    b.d = to_f16_le(d);
    b.m = to_f16_le(min);
    let mut qh = 0u32;
    for j in 0..16 {
        let q0 = trunc_clamp((x[j] - min) * id + 0.5, 31);
        let q1 = trunc_clamp((x[j + 16] - min) * id + 0.5, 31);
        b.qs[j] = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        qh |= ((q0 as u32) >> 4) << j;
        qh |= ((q1 as u32) >> 4) << (j + 16);
    }
    b.qh = qh.to_le_bytes();
}

/// x: [32] -> Q8_0 with d = amax / 127, q = round-half-away(x / d).
pub fn quantize_block_q8_0(x: &[f32], b: &mut BlockQ8_0) {
    let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse_or_zero(d);
    b.d = to_f16_le(d);
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
}

/// f32 -> bf16 bits, round to nearest even; NaN forced quiet (ggml-impl.h
/// `ggml_compute_fp32_to_bf16`, as gguf-py's BF16.quantize_blocks).
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let n = x.to_bits();
    if n & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((n >> 16) | 64) as u16;
    }
    ((n as u64 + (0x7FFF + ((n >> 16) & 1)) as u64) >> 16) as u16
}
