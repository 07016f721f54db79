//! Quality and robustness of `quantize_row` on random data: round-trip error per format,
//! ordering by bits per weight, imatrix benefit, re-quantization stability, and no panics
//! on hostile input.
//!
//! The K-quant / IQ4 quantizers are byte-identical to llama.cpp's (llama_cpp_quantize.rs),
//! so the error levels asserted here are the ones llama.cpp reaches on the same data.

use gguf::GgmlType;
use quant::{dequantize_row, has_quantizer, quantize_row, quantize_row_with_imatrix};

/// Deterministic standard normals (xorshift64* + Box-Muller): no rand dependency.
struct Gauss(u64);
impl Gauss {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn next(&mut self) -> f32 {
        let (u1, u2) = (self.uniform(), self.uniform());
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

const ALL: [GgmlType; 12] = [
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
    GgmlType::Q4K,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8_0,
];

fn round_trip(ty: GgmlType, x: &[f32], imatrix: Option<&[f32]>) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
    quantize_row_with_imatrix(ty, x, &mut q, imatrix).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y).unwrap();
    (q, y)
}

/// sqrt(sum w (x - y)²) / sqrt(sum w x²).
fn rel_rmse(x: &[f32], y: &[f32], w: Option<&[f32]>) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for i in 0..x.len() {
        let wi = w.map_or(1.0, |w| w[i] as f64);
        num += wi * (x[i] as f64 - y[i] as f64).powi(2);
        den += wi * (x[i] as f64).powi(2);
    }
    (num / den).sqrt()
}

/// Relative RMSE over 64 rows of 4096 standard normals.
fn gaussian_error(ty: GgmlType) -> f64 {
    let mut g = Gauss(0x1234_5678_9ABC_DEF1);
    let (mut num, mut den) = (0f64, 0f64);
    for _ in 0..64 {
        let x = g.vec(4096);
        let (_, y) = round_trip(ty, &x, None);
        let e = rel_rmse(&x, &y, None);
        num += e * e;
        den += 1.0;
    }
    (num / den).sqrt()
}

#[test]
fn gaussian_error_levels_and_ordering() {
    let errs: Vec<(GgmlType, f64)> = ALL.iter().map(|&t| (t, gaussian_error(t))).collect();
    for (t, e) in &errs {
        eprintln!("{t}: rel rmse {e:.5}");
    }
    // Upper bounds ~3% above what this (llama.cpp-identical) code measures on this data
    // (q2_K 0.2968, q3_K 0.1511, q4_0 0.0859, q4_1 0.0782, iq4_nl 0.0761, iq4_xs 0.0767,
    // q4_K 0.0714, q5_0 0.0427, q5_1 0.0378, q5_K 0.0362, q6_K 0.0177, q8_0 0.00537):
    // they catch a regression in any search, not just a broken format.
    let bound = |t: GgmlType| match t {
        GgmlType::Q2K => 0.305,
        GgmlType::Q3K => 0.156,
        GgmlType::Q4_0 => 0.088,
        GgmlType::Q4_1 => 0.080,
        GgmlType::IQ4NL => 0.078,
        GgmlType::IQ4XS => 0.079,
        GgmlType::Q4K => 0.0735,
        GgmlType::Q5_0 => 0.044,
        GgmlType::Q5_1 => 0.039,
        GgmlType::Q5K => 0.037,
        GgmlType::Q6K => 0.0183,
        GgmlType::Q8_0 => 0.0055,
        _ => unreachable!(),
    };
    for (t, e) in &errs {
        assert!(*e < bound(*t), "{t}: rel rmse {e} above {}", bound(*t));
    }
    let e = |t: GgmlType| errs.iter().find(|(u, _)| *u == t).unwrap().1;
    // more bits, lower error
    let ladder = [
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8_0,
    ];
    for w in ladder.windows(2) {
        assert!(e(w[0]) > e(w[1]), "{} !> {}", w[0], w[1]);
    }
    assert!(e(GgmlType::Q4_0) > e(GgmlType::Q5_0));
    assert!(e(GgmlType::Q4_1) > e(GgmlType::Q5_1));
    assert!(e(GgmlType::Q4_0) > e(GgmlType::IQ4NL));
    assert!(e(GgmlType::Q3K) > e(GgmlType::IQ4XS));
}

/// With an importance matrix, the importance-weighted error drops for every format with a
/// weighted search.
#[test]
fn imatrix_lowers_weighted_error() {
    let mut g = Gauss(42);
    let n = 4096;
    // heavy-tailed column importances, as real activations have
    let imatrix: Vec<f32> = (0..n).map(|_| (2.0 * g.next()).exp()).collect();
    for ty in [
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ] {
        let (mut plain, mut weighted) = (0f64, 0f64);
        for _ in 0..16 {
            let x = g.vec(n);
            let (_, y0) = round_trip(ty, &x, None);
            let (_, y1) = round_trip(ty, &x, Some(&imatrix));
            plain += rel_rmse(&x, &y0, Some(&imatrix)).powi(2);
            weighted += rel_rmse(&x, &y1, Some(&imatrix)).powi(2);
        }
        eprintln!(
            "{ty}: weighted rel rmse {:.5} -> {:.5}",
            plain.sqrt() / 4.0,
            weighted.sqrt() / 4.0
        );
        assert!(weighted < plain, "{ty}: imatrix did not help");
    }
}

/// Quantizing the dequantized values reproduces the same bytes for the formats whose scale
/// is a function of the block extremes.
#[test]
fn requantize_is_stable() {
    let mut g = Gauss(7);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::BF16,
    ] {
        for scale in [1e-3f32, 1.0, 100.0] {
            let x: Vec<f32> = g.vec(1024).iter().map(|v| v * scale).collect();
            let (q, y) = round_trip(ty, &x, None);
            let (q2, _) = round_trip(ty, &y, None);
            assert_eq!(q, q2, "{ty} at scale {scale}");
        }
    }
}

/// Rows of one block, many blocks, and edge values: no panic, lengths honoured, and finite
/// inputs give finite outputs.
#[test]
fn edge_inputs_do_not_panic() {
    let mut g = Gauss(99);
    for ty in ALL {
        assert!(has_quantizer(ty));
        let n = ty.block_size();
        let rows: Vec<Vec<f32>> = vec![
            vec![0.0; n],
            vec![1.0; n],
            vec![-3.5; 3 * n],
            vec![1e-30; n],
            vec![1e-40; n],
            (0..n).map(|i| if i == 5 { 1e30 } else { 0.0 }).collect(),
            g.vec(7 * n),
            (0..n)
                .map(|i| f32::MAX * if i % 2 == 0 { 1.0 } else { -1.0 })
                .collect(),
            vec![f32::NAN; n],
            (0..n)
                .map(|i| if i == 3 { f32::INFINITY } else { 1.0 })
                .collect(),
        ];
        for (k, x) in rows.iter().enumerate() {
            let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
            quantize_row(ty, x, &mut q).unwrap();
            let im = vec![0.0f32; x.len()];
            quantize_row_with_imatrix(ty, x, &mut q, Some(&im)).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y).unwrap();
            if k < 4 || k == 6 {
                let (_, y) = round_trip(ty, x, None);
                assert!(y.iter().all(|v| v.is_finite()), "{ty} row kind {k}");
            }
        }
    }
}

#[test]
fn zero_and_constant_rows_round_trip() {
    for ty in ALL {
        let n = 2 * GgmlType::Q2K.block_size();
        let (_, y) = round_trip(ty, &vec![0.0; n], None);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}: zeros");
        let (_, y) = round_trip(ty, &vec![0.25; n], None);
        let e = rel_rmse(&vec![0.25; n], &y, None);
        assert!(e < 0.2, "{ty}: constant row error {e}");
    }
}
