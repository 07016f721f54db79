//! Random tensor data whose every value is finite and small.
//!
//! Quantized blocks are random bytes with their f16 scale fields overwritten by small positive
//! finite values (random bits there could be inf/NaN or huge). Scale magnitudes are chosen so a
//! dequantized weight has a standard deviation of roughly 0.02, like a trained model's, which
//! keeps activations finite through dozens of layers. Field offsets are ggml's `block_*`
//! layouts (ggml/src/ggml-common.h).

use gguf::GgmlType;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore};

/// Byte offsets of the f16 scale fields in one block, and the typical scale value that gives
/// weights of std ≈ 0.02 (scale × typical |quant| × typical sub-scale ≈ 0.02).
fn scale_fields(ty: GgmlType) -> Option<(&'static [usize], f32)> {
    use GgmlType::*;
    Some(match ty {
        // d · (q − 8), |q − 8| ≈ 4.6
        Q4_0 => (&[0], 4e-3),
        // d · q + m
        Q4_1 => (&[0, 2], 2e-3),
        Q5_0 => (&[0], 2e-3),
        Q5_1 => (&[0, 2], 1e-3),
        // d · q, |q| ≈ 74
        Q8_0 => (&[0], 3e-4),
        // scales/qs first, d and dmin at the end
        Q2K => (&[80, 82], 2e-3),
        Q3K => (&[108], 1e-3),
        // d, dmin, then 6-bit sub-scales (≈ 31) × q (≈ 4.3)
        Q4K | Q5K => (&[0, 2], 1.5e-4),
        // int8 sub-scales (≈ 64) × (q − 32) (≈ 18); d last
        Q6K => (&[208], 2e-5),
        // d · kvalue (≈ 60)
        IQ4NL => (&[0], 3e-4),
        // d · (ls − 32) (≈ 16) · kvalue (≈ 60)
        IQ4XS => (&[0], 2e-5),
        _ => return None,
    })
}

/// Whether [`fill_random`] can produce data of this type.
pub fn is_supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) || scale_fields(ty).is_some()
}

/// How the values of a float tensor should look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FloatInit {
    /// Uniform in [-a, a].
    Uniform(f32),
    /// Every element this constant (norm weights = 1).
    Constant(f32),
}

/// Fills `out` (whole blocks of `ty`) with random data. Float types follow `init`; quantized
/// types get random quants and small positive scales.
pub fn fill_random(ty: GgmlType, out: &mut [u8], init: FloatInit, rng: &mut SmallRng) {
    match ty {
        GgmlType::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&float_value(init, rng).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in out.chunks_exact_mut(2) {
                let h = half::f16::from_f32(float_value(init, rng));
                c.copy_from_slice(&h.to_bits().to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in out.chunks_exact_mut(2) {
                let h = half::bf16::from_f32(float_value(init, rng));
                c.copy_from_slice(&h.to_bits().to_le_bytes());
            }
        }
        _ => {
            let (fields, scale) =
                scale_fields(ty).expect("fill_random: caller checks is_supported");
            rng.fill_bytes(out);
            for block in out.chunks_exact_mut(ty.type_size()) {
                for &off in fields {
                    // Scale in [0.5, 1.5) × typical: positive, finite, a normal f16.
                    let v = scale * (0.5 + rng.random::<f32>());
                    let h = half::f16::from_f32(v).to_bits().to_le_bytes();
                    block[off..off + 2].copy_from_slice(&h);
                }
            }
        }
    }
}

fn float_value(init: FloatInit, rng: &mut SmallRng) -> f32 {
    match init {
        FloatInit::Uniform(a) => rng.random_range(-a..=a),
        FloatInit::Constant(c) => c,
    }
}

/// The value distribution for a float tensor, by its role.
pub fn float_init_for(name: &str) -> FloatInit {
    if name.ends_with("norm.weight") {
        FloatInit::Constant(1.0)
    } else if name.ends_with("ssm_a") {
        // A = −exp(A_log): negative decay rates.
        FloatInit::Constant(-1.0)
    } else {
        FloatInit::Uniform(0.03)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn scales_are_finite_small_and_positive() {
        let mut rng = SmallRng::seed_from_u64(1);
        for ty in GgmlType::ALL
            .into_iter()
            .filter(|&t| scale_fields(t).is_some())
        {
            let (fields, _) = scale_fields(ty).unwrap();
            let mut buf = vec![0u8; ty.type_size() * 64];
            fill_random(ty, &mut buf, FloatInit::Uniform(0.1), &mut rng);
            for block in buf.chunks_exact(ty.type_size()) {
                for &off in fields {
                    let v = half::f16::from_bits(u16::from_le_bytes([block[off], block[off + 1]]))
                        .to_f32();
                    assert!(v.is_finite() && v > 0.0 && v < 0.01, "{ty}: {v}");
                }
            }
        }
    }

    #[test]
    fn floats_follow_init() {
        let mut rng = SmallRng::seed_from_u64(2);
        let mut buf = vec![0u8; 4 * 100];
        fill_random(GgmlType::F32, &mut buf, FloatInit::Constant(1.0), &mut rng);
        assert!(buf
            .chunks_exact(4)
            .all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 1.0));
        let mut buf = vec![0u8; 2 * 100];
        fill_random(GgmlType::F16, &mut buf, FloatInit::Uniform(0.03), &mut rng);
        for c in buf.chunks_exact(2) {
            let v = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            assert!(v.abs() <= 0.0301);
        }
    }

    #[test]
    fn roles() {
        assert_eq!(
            float_init_for("blk.0.attn_norm.weight"),
            FloatInit::Constant(1.0)
        );
        assert_eq!(float_init_for("blk.0.ssm_a"), FloatInit::Constant(-1.0));
        assert_eq!(
            float_init_for("blk.0.attn_q.bias"),
            FloatInit::Uniform(0.03)
        );
    }
}
