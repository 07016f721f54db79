//! Random test data shared by the dot / matvec tests: a small deterministic generator and
//! weight rows of every format with sane scales (random bits elsewhere).
#![allow(dead_code)]

use gguf::GgmlType;
use quant::blocks::to_f16_le;

/// The weight types that have a dot product.
pub const DOT_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
];

/// SplitMix64: deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    /// Activations: mostly small with a few outliers, like a hidden state.
    pub fn activations(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = self.f32();
                if self.next_u64().is_multiple_of(64) {
                    v * 20.0
                } else {
                    v
                }
            })
            .collect()
    }
}

/// Byte offsets of the f16 scale fields inside one block of `ty`.
pub fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL | IQ4XS => &[0],
        Q4_1 | Q5_1 | Q4K | Q5K => &[0, 2],
        Q2K => &[80, 82],
        Q3K => &[108],
        Q6K => &[208],
        _ => &[],
    }
}

/// `n_rows` random weight rows of `n_cols` elements of type `ty`: random quants, random
/// sub-block scales, and f16 super-scales in ±[0.001, 0.05].
pub fn random_weights(rng: &mut Rng, ty: GgmlType, n_rows: usize, n_cols: usize) -> Vec<u8> {
    let n = n_rows * n_cols;
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.f32().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n).flat_map(|_| to_f16_le(rng.f32())).collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| ((rng.f32().to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let bs = ty.type_size();
            let mut w = rng.bytes(n / ty.block_size() * bs);
            for block in w.chunks_exact_mut(bs) {
                for &off in scale_offsets(ty) {
                    let mag = 0.001 + 0.049 * (rng.f32() + 1.0) / 2.0;
                    let v = if rng.next_u64().is_multiple_of(2) {
                        mag
                    } else {
                        -mag
                    };
                    block[off..off + 2].copy_from_slice(&to_f16_le(v));
                }
            }
            w
        }
    }
}

/// Extra allowance for Q4_1 / Q5_1: the activation's block sum s = d * sum(q) is stored
/// as f16, so the min term m * s carries a relative error of up to 2^-11.
fn min_term_allowance(ty: GgmlType, w: &[u8], act: &[u8]) -> f64 {
    use quant::blocks::{f16_le, BlockQ4_1, BlockQ5_1, BlockQ8_1};
    let mins: Vec<f32> = match ty {
        GgmlType::Q4_1 => bytemuck::cast_slice::<u8, BlockQ4_1>(w)
            .iter()
            .map(|b| f16_le(b.m))
            .collect(),
        GgmlType::Q5_1 => bytemuck::cast_slice::<u8, BlockQ5_1>(w)
            .iter()
            .map(|b| f16_le(b.m))
            .collect(),
        _ => return 0.0,
    };
    let acts: &[BlockQ8_1] = bytemuck::cast_slice(act);
    mins.iter()
        .zip(acts)
        .map(|(&m, a)| (m as f64 * f16_le(a.s) as f64).abs() * 1e-3)
        .sum()
}

/// The f64 dot of one weight row with one quantized activation row, both dequantized by
/// the formats code (an independent decoding), and the tolerance a correct f32 kernel
/// meets: float rounding of the per-block scaling plus the f16 block sums of Q8_1.
pub fn reference_dot(ty: GgmlType, w: &[u8], act: &[u8], n: usize) -> (f64, f64) {
    let at = quant::vec_dot_type(ty);
    let mut wf = vec![0f32; n];
    let mut af = vec![0f32; n];
    quant::dequantize_row(ty, w, &mut wf).unwrap();
    quant::dequantize_row(at, act, &mut af).unwrap();
    let want: f64 = wf.iter().zip(&af).map(|(&a, &b)| a as f64 * b as f64).sum();
    let mag: f64 = wf
        .iter()
        .zip(&af)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    (want, 1e-5 * mag + min_term_allowance(ty, w, act) + 1e-7)
}
