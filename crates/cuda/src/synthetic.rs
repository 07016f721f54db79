//! Random weights and activations in GGUF block layout, for kernel tests, benchmarks and
//! `redline selftest`: random bytes for the quantized payload (every bit pattern appears), with
//! the f16 scale fields overwritten by finite values of a realistic size so sums stay finite.

use gguf::GgmlType;

/// xorshift64*: tiny, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

fn f16_bytes(x: f32) -> [u8; 2] {
    // Round-to-nearest f32 -> f16 for normal values in the range we generate (|x| in [1e-4, 2]).
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = bits & 0x7f_ffff;
    let h = if exp <= 0 {
        sign
    } else {
        let m = (mant + 0x1000) >> 13; // round half up
        sign | (((exp as u32) << 10) + m) as u16
    };
    h.to_le_bytes()
}

/// Byte offsets of the f16 scale fields (d, dmin, m) inside one block (ggml-common.h).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
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

/// A random [n_rows, n_cols] matrix of type `ty` in GGUF layout. `n_cols` must be a multiple of
/// the block size. Scales are ~N/n_cols-sized so that dot products stay O(1).
pub fn random_matrix(ty: GgmlType, n_rows: usize, n_cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let n = n_rows * n_cols;
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.uniform().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n).flat_map(|_| f16_bytes(rng.uniform())).collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| ((rng.uniform().to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let bs = ty.type_size();
            let blocks = n / ty.block_size();
            let mut out = vec![0u8; blocks * bs];
            rng.fill_bytes(&mut out);
            let offs = scale_offsets(ty);
            for b in out.chunks_exact_mut(bs) {
                for &o in offs {
                    // Magnitude in [0.001, 0.02], random sign: realistic for 4-8 bit weights.
                    let mag = 0.001 + 0.019 * (rng.uniform() * 0.5 + 0.5);
                    let s = if rng.next_u64() & 1 == 0 { mag } else { -mag };
                    b[o..o + 2].copy_from_slice(&f16_bytes(s));
                }
            }
            out
        }
    }
}

/// Random activations in [-1, 1), with a few larger outliers as real hidden states have.
pub fn random_activations(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let v = rng.uniform();
            if i % 97 == 0 {
                v * 8.0
            } else {
                v
            }
        })
        .collect()
}
