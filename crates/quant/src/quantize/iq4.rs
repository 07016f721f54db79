//! IQ4_NL and IQ4_XS quantizers: 4-bit indices into the non-linear code book
//! `KVALUES_IQ4NL`, per 32 elements one scale (IQ4_NL: f16; IQ4_XS: 6 bits against an f16
//! super-block scale).
//!
//! Port of ggml's `quantize_row_iq4_nl_impl` (ggml/src/ggml-quants.c) as `quantize_iq4_nl` /
//! `quantize_iq4_xs` call it (ntry = 7, which is what `llama-quantize` produces).

use crate::blocks::*;

use super::search::{best_index_int8, nearest_int, GROUP_MAX_EPS};

const NTRY: i32 = 7;

/// Best scale for one 32-element group: starts from d = -max / -127 and tries the scales
/// mapping `max` to each of `-127 + itry`, itry in -7..=7, keeping the least-squares fit with
/// the largest gain. weight: [32]. Returns 0 for an all-(near-)zero group.
fn group_scale(xb: &[f32], weight: &[f32]) -> f32 {
    let values = &KVALUES_IQ4NL;
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let fit = |id: f32| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for (&x, &w) in xb.iter().zip(weight) {
            let q = values[best_index_int8(values, id * x)] as f32;
            sumqx += w * q * x;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d0 = -max / values[0] as f32;
    let (sumqx, sumq2) = fit(1.0 / d0);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let id = (itry + values[0] as i32) as f32 / max;
        let (sumqx, sumq2) = fit(id);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Element weights of one group: importance * sqrt(sigma2 + x²), or x² without importance.
fn group_weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32) -> [f32; 32] {
    let mut w = [0f32; 32];
    for j in 0..32 {
        w[j] = match qw {
            Some(q) => q[j] * (sigma2 + xb[j] * xb[j]).sqrt(),
            None => xb[j] * xb[j],
        };
    }
    w
}

/// 2 * mean square of the super-block (ggml computes the sum, then scales by 2 / n).
fn sigma2(x: &[f32]) -> f32 {
    let s = x.iter().fold(0f32, |s, &v| s + v * v);
    s * (2.0 / x.len() as f32)
}

/// Packs 32 indices of a group: low nibbles elements 0..16, high nibbles 16..32.
fn pack_group(l: &[u8], q4: &mut [u8]) {
    for j in 0..16 {
        q4[j] = l[j] | (l[16 + j] << 4);
    }
}

/// x: [32] -> IQ4_NL; `qw`: optional [32] importance.
pub fn quantize_block_iq4_nl(x: &[f32], qw: Option<&[f32]>, b: &mut BlockIQ4NL) {
    let w = group_weights(x, qw, sigma2(x));
    let d = group_scale(x, &w);
    b.d = to_f16_le(d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut l = [0u8; 32];
    for (lj, &v) in l.iter_mut().zip(x) {
        *lj = best_index_int8(&KVALUES_IQ4NL, id * v) as u8;
    }
    pack_group(&l, &mut b.qs);
}

/// x: [256] -> IQ4_XS; `qw`: optional [256] importance.
pub fn quantize_block_iq4_xs(x: &[f32], qw: Option<&[f32]>, b: &mut BlockIQ4XS) {
    let s2 = sigma2(x);
    let mut scales = [0f32; QK_K / 32];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..QK_K / 32 {
        let xb = &x[32 * ib..32 * ib + 32];
        let w = group_weights(xb, qw.map(|q| &q[32 * ib..32 * ib + 32]), s2);
        let d = group_scale(xb, &w);
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let d = -max_scale / 32.0;
    b.d = to_f16_le(d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    b.scales_l = [0; QK_K / 64];
    for ib in 0..QK_K / 32 {
        let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * ls as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        let xb = &x[32 * ib..32 * ib + 32];
        let mut l = [0u8; 32];
        for (lj, &v) in l.iter_mut().zip(xb) {
            *lj = best_index_int8(&KVALUES_IQ4NL, idl * v) as u8;
        }
        pack_group(&l, &mut b.qs[16 * ib..16 * ib + 16]);
        let ls = (ls + 32) as u16;
        b.scales_l[ib / 2] |= ((ls & 0xF) as u8) << (4 * (ib % 2));
        scales_h |= (ls >> 4) << (2 * ib);
    }
    b.scales_h = scales_h.to_le_bytes();
}
