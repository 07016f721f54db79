//! Importance-weighted quantizers of Q4_0, Q4_1, Q5_0, Q5_1 (what `llama-quantize
//! --imatrix` uses; ggml's `quantize_row_q4_0_impl` … in ggml/src/ggml-quants.c).
//!
//! Each element's weight is imatrix[j] * sqrt(sigma2 + x[j]²), with sigma2 the mean square
//! of the whole row, so these must be given one whole tensor row.

use crate::blocks::*;

use super::search::{make_qkx_quants, make_qx_quants, AffineParams, AffineSearch};

const AFFINE: fn(i32) -> AffineParams = |nmax| AffineParams {
    nmax,
    rmin: -0.9,
    rdelta: 0.05,
    nstep: 36,
    use_mad: false,
    kind: AffineSearch::Qkx3,
};

/// Mean square of the row.
pub fn row_sigma2(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |s, &v| s + v * v) / x.len() as f32
}

fn weights(xb: &[f32], qw: &[f32], sigma2: f32) -> [f32; 32] {
    let mut w = [0f32; 32];
    for j in 0..32 {
        w[j] = qw[j] * (sigma2 + xb[j] * xb[j]).sqrt();
    }
    w
}

fn pack_q5(l: &[u8; 32], qs: &mut [u8; 16]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (l[j] & 0x0F) | ((l[j + 16] & 0x0F) << 4);
        qh |= ((l[j] as u32 & 0x10) >> 4) << j;
        qh |= ((l[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    qh.to_le_bytes()
}

/// xb: [32], qw: [32] -> Q4_0.
pub fn quantize_block_q4_0_weighted(xb: &[f32], qw: &[f32], sigma2: f32, b: &mut BlockQ4_0) {
    let w = weights(xb, qw, sigma2);
    let mut l = [0i8; 32];
    let d = make_qx_quants(8, xb, &mut l, Some(&w));
    b.d = to_f16_le(d);
    for j in 0..16 {
        b.qs[j] = l[j] as u8 | ((l[j + 16] as u8) << 4);
    }
}

/// xb: [32], qw: [32] -> Q5_0.
pub fn quantize_block_q5_0_weighted(xb: &[f32], qw: &[f32], sigma2: f32, b: &mut BlockQ5_0) {
    let w = weights(xb, qw, sigma2);
    let mut l = [0i8; 32];
    let d = make_qx_quants(16, xb, &mut l, Some(&w));
    b.d = to_f16_le(d);
    b.qh = pack_q5(&l.map(|v| v as u8), &mut b.qs);
}

/// xb: [32], qw: [32] -> Q4_1.
pub fn quantize_block_q4_1_weighted(xb: &[f32], qw: &[f32], sigma2: f32, b: &mut BlockQ4_1) {
    let w = weights(xb, qw, sigma2);
    let (mut l, mut laux) = ([0u8; 32], [0u8; 32]);
    let (d, min) = make_qkx_quants(&AFFINE(15), xb, Some(&w), &mut l, &mut laux);
    b.d = to_f16_le(d);
    b.m = to_f16_le(-min);
    for j in 0..16 {
        b.qs[j] = l[j] | (l[j + 16] << 4);
    }
}

/// xb: [32], qw: [32] -> Q5_1.
pub fn quantize_block_q5_1_weighted(xb: &[f32], qw: &[f32], sigma2: f32, b: &mut BlockQ5_1) {
    let w = weights(xb, qw, sigma2);
    let (mut l, mut laux) = ([0u8; 32], [0u8; 32]);
    let (d, min) = make_qkx_quants(&AFFINE(31), xb, Some(&w), &mut l, &mut laux);
    b.d = to_f16_le(d);
    b.m = to_f16_le(-min);
    b.qh = pack_q5(&l, &mut b.qs);
}
