//! Per-row 8-bit quantization of activations, the right-hand side of every integer dot.
//!
//! Each weight format is paired with one activation format (ggml's `vec_dot_type`):
//! the 32-wide formats with Q8_0 (or Q8_1 when the weight has a min), the K-quants and
//! IQ4_XS with Q8_K, and the float formats with plain f32. The quantizers follow ggml's
//! `quantize_row_q8_0_ref`, `quantize_row_q8_1_ref` and `quantize_row_q8_K_ref`
//! (ggml/src/ggml-quants.c) so that our dots see the same integers as llama.cpp's.

use crate::blocks::{to_f16_le, BlockQ8K, BlockQ8_0, BlockQ8_1, QK8_0, QK8_1, QK_K};
use gguf::GgmlType;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Whether the AVX2 quantizers can run (detected once).
#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(|| std::is_x86_feature_detected!("avx2"))
}

/// The activation format that weights of type `ty` are dotted against.
///
/// Float weights (F32, F16, BF16) take f32 activations. Types without a dot kernel
/// return F32 as well; [`crate::dot::supports`] tells whether a dot exists.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2K | Q3K | Q4K | Q5K | Q6K | IQ4XS => Q8K,
        _ => F32,
    }
}

/// Bytes of one activation row of `n` elements in the format paired with weight type `ty`.
///
/// Panics if `n` is not a multiple of the activation block size.
pub fn activation_row_bytes(ty: GgmlType, n: usize) -> usize {
    let at = vec_dot_type(ty);
    assert!(
        n.is_multiple_of(at.block_size()),
        "row of {n} elements is not a multiple of the {} block size {}",
        at.name(),
        at.block_size()
    );
    n / at.block_size() * at.type_size()
}

/// Quantizes one row of activations `x` into the format paired with weight type `ty`,
/// replacing the contents of `out` (f32 little-endian bytes for float weights).
///
/// Panics if `x.len()` is not a multiple of the activation block size.
pub fn quantize_activations(ty: GgmlType, x: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.resize(activation_row_bytes(ty, x.len()), 0);
    quantize_activations_into(ty, x, out);
}

/// As [`quantize_activations`], into a slice of exactly
/// [`activation_row_bytes`]`(ty, x.len())` bytes.
pub fn quantize_activations_into(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    assert_eq!(
        out.len(),
        activation_row_bytes(ty, x.len()),
        "activation buffer size"
    );
    match vec_dot_type(ty) {
        GgmlType::Q8_0 => quantize_row_q8_0_fast(x, bytemuck::cast_slice_mut(out)),
        GgmlType::Q8_1 => quantize_row_q8_1_fast(x, bytemuck::cast_slice_mut(out)),
        GgmlType::Q8K => quantize_row_q8_k_fast(x, bytemuck::cast_slice_mut(out)),
        _ => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

macro_rules! fast_quantizer {
    ($fast:ident, $scalar:ident, $block:ty, $qk:expr) => {
        /// As the scalar quantizer of the same name (bit-identical), with AVX2 when present.
        pub fn $fast(x: &[f32], y: &mut [$block]) {
            assert_eq!(x.len(), y.len() * $qk, "activation row length");
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: AVX2 was detected.
                return unsafe { avx2::$scalar(x, y) };
            }
            $scalar(x, y)
        }
    };
}

fast_quantizer!(quantize_row_q8_0_fast, quantize_row_q8_0, BlockQ8_0, QK8_0);
fast_quantizer!(quantize_row_q8_1_fast, quantize_row_q8_1, BlockQ8_1, QK8_1);
fast_quantizer!(quantize_row_q8_k_fast, quantize_row_q8_k, BlockQ8K, QK_K);

/// x -> Q8_0: per block of 32, d = max|x| / 127, q = round(x / d) (ties away from zero).
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(x.len(), y.len() * QK8_0, "q8_0 row length");
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = to_f16_le(d);
        for (q, v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

/// x -> Q8_1: as Q8_0, plus s = d * sum(q) for the weight's min term.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(x.len(), y.len() * QK8_1, "q8_1 row length");
    for (xb, yb) in x.chunks_exact(QK8_1).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = to_f16_le(d);
        let mut sum = 0i32;
        for (q, v) in yb.qs.iter_mut().zip(xb) {
            let r = (v * id).round() as i8;
            *q = r;
            sum += r as i32;
        }
        yb.s = to_f16_le(sum as f32 * d);
    }
}

/// x -> Q8_K: per 256, scale by -127 / (the element of largest magnitude), round to
/// nearest even, keep the f32 scale and the sum of each 16 (used for the K-quant mins).
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(x.len(), y.len() * QK_K, "q8_K row length");
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = bytemuck::Zeroable::zeroed();
            continue;
        }
        // ggml uses -127 (not -128) so the AVX IQ2 kernels never see -128.
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (s, q) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            let sum: i32 = q.iter().map(|&v| v as i32).sum();
            *s = (sum as i16).to_le_bytes();
        }
        yb.d = (1.0 / iscale).to_le_bytes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytemuck::Zeroable;

    #[test]
    fn q8_0_round_trip_within_half_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut y = vec![bytemuck::Zeroable::zeroed(); 2];
        quantize_row_q8_0(&x, &mut y);
        for (xb, yb) in x.chunks(32).zip(&y) {
            let d = crate::blocks::f16_le(yb.d);
            for (v, q) in xb.iter().zip(yb.qs) {
                assert!(
                    (v - d * q as f32).abs() <= d * 0.5 + 1e-3 * d,
                    "{v} vs {}",
                    d * q as f32
                );
            }
            assert!(yb.qs.iter().any(|&q| q.abs() == 127));
        }
    }

    #[test]
    fn q8_k_extreme_is_minus_127_and_bsums_add_up() {
        let mut x: Vec<f32> = (0..256)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.1)
            .collect();
        x[77] = 3.0;
        let mut y = vec![bytemuck::Zeroable::zeroed(); 1];
        quantize_row_q8_k(&x, &mut y);
        let b: &BlockQ8K = &y[0];
        assert_eq!(b.qs[77], -127);
        let d = f32::from_le_bytes(b.d);
        assert!((d * -127.0 - 3.0).abs() < 1e-6);
        for (j, s) in b.bsums.iter().enumerate() {
            let want: i32 = b.qs[j * 16..j * 16 + 16].iter().map(|&v| v as i32).sum();
            assert_eq!(i16::from_le_bytes(*s) as i32, want);
        }
    }

    /// The fast quantizers against the scalar ones, bit for bit, on random rows and on
    /// rows full of exact rounding ties (x * id = k + 0.5).
    #[test]
    fn fast_quantizers_are_bit_identical() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut rows: Vec<Vec<f32>> = (0..20)
            .map(|r| (0..768).map(|_| rand() * (1 + r) as f32).collect())
            .collect();
        // amax 127 -> d = 1 and iscale = -1: odd multiples of 0.5 are exact ties.
        rows.push(
            (0..768)
                .map(|i| {
                    if i % 32 == 0 {
                        127.0
                    } else {
                        ((i * 7) % 201) as f32 * 0.5 - 50.0
                    }
                })
                .collect(),
        );
        // A row whose first block is all zero.
        rows.push(
            (0..768)
                .map(|i| ((i % 255) as f32 - 127.0) * 0.5 + if i % 32 == 0 { 127.0 } else { 0.0 })
                .collect(),
        );
        rows.push(
            (0..768)
                .map(|i| if i < 256 { 0.0 } else { (i % 7) as f32 - 3.5 })
                .collect(),
        );
        for x in &rows {
            let n = x.len();
            let (mut a, mut b) = (
                vec![BlockQ8_0::zeroed(); n / 32],
                vec![BlockQ8_0::zeroed(); n / 32],
            );
            quantize_row_q8_0(x, &mut a);
            quantize_row_q8_0_fast(x, &mut b);
            assert_eq!(
                bytemuck::cast_slice::<_, u8>(&a),
                bytemuck::cast_slice::<_, u8>(&b),
                "q8_0"
            );
            let (mut a, mut b) = (
                vec![BlockQ8_1::zeroed(); n / 32],
                vec![BlockQ8_1::zeroed(); n / 32],
            );
            quantize_row_q8_1(x, &mut a);
            quantize_row_q8_1_fast(x, &mut b);
            assert_eq!(
                bytemuck::cast_slice::<_, u8>(&a),
                bytemuck::cast_slice::<_, u8>(&b),
                "q8_1"
            );
            let (mut a, mut b) = (
                vec![BlockQ8K::zeroed(); n / 256],
                vec![BlockQ8K::zeroed(); n / 256],
            );
            quantize_row_q8_k(x, &mut a);
            quantize_row_q8_k_fast(x, &mut b);
            assert_eq!(
                bytemuck::cast_slice::<_, u8>(&a),
                bytemuck::cast_slice::<_, u8>(&b),
                "q8_K"
            );
        }
    }

    #[test]
    fn zero_rows_quantize_to_zero() {
        let x = vec![0.0f32; 256];
        let mut out = Vec::new();
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4K] {
            quantize_activations(ty, &x, &mut out);
            assert!(out.iter().all(|&b| b == 0), "{ty}");
        }
    }
}
