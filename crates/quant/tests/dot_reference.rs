//! The scalar reference dots against an f64 product of the dequantized weights and the
//! dequantized activations (both from the formats code, an independent decoding).

mod dot_common;

use dot_common::{random_weights, reference_dot, Rng, DOT_TYPES};
use gguf::GgmlType;
use quant::dot::{vec_dot_with, Isa};

#[test]
fn scalar_dot_matches_f64_of_dequantized_rows() {
    let mut rng = Rng::new(42);
    for ty in DOT_TYPES {
        for n_blocks_k in [1usize, 3, 7] {
            let n = n_blocks_k * 256;
            for _ in 0..4 {
                let w = random_weights(&mut rng, ty, 1, n);
                let x = rng.activations(n);
                let mut act = Vec::new();
                quant::quantize_activations(ty, &x, &mut act);
                let (want, tol) = reference_dot(ty, &w, &act, n);
                let got = vec_dot_with(Isa::Scalar, ty, &w, &act, n) as f64;
                assert!(
                    (got - want).abs() <= tol,
                    "{ty} n={n}: {got} vs f64 {want} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn q8_0_dot_of_known_block() {
    // One Q8_0 block with d = 0.5 against activations 1..=32: 0.5 * q . x quantized.
    let x: Vec<f32> = (1..=32).map(|v| v as f32).collect();
    let mut w = vec![0u8; 34];
    w[..2].copy_from_slice(&quant::blocks::to_f16_le(0.5));
    for (i, b) in w[2..].iter_mut().enumerate() {
        *b = (i as i8 - 16) as u8;
    }
    let mut act = Vec::new();
    quant::quantize_activations(GgmlType::Q8_0, &x, &mut act);
    // sum_i 0.5 * (i - 16) * (i + 1) for i in 0..32 = 0.5 * 2464 = 1232 (up to activation rounding)
    let got = quant::vec_dot(GgmlType::Q8_0, &w, &act, 32);
    assert!((got - 1232.0).abs() < 1232.0 * 0.01, "{got}");
}

#[test]
fn wrong_lengths_panic_on_every_path() {
    let act = {
        let mut a = Vec::new();
        quant::quantize_activations(GgmlType::Q4K, &[0.5; 512], &mut a);
        a
    };
    for isa in Isa::all_available() {
        for ty in DOT_TYPES {
            let (wl, al) = quant::dot::row_lengths(ty, 512);
            let w = vec![0u8; wl - 1];
            let a = vec![0u8; al];
            let r = std::panic::catch_unwind(|| vec_dot_with(isa, ty, &w, &a, 512));
            assert!(r.is_err(), "{ty} {isa:?}: short weight row accepted");
            let k = quant::dot::dot_kernel(isa, ty).unwrap();
            let w = vec![0u8; wl];
            let r = std::panic::catch_unwind(|| k(&w, &a[..al - 1], 512));
            assert!(
                r.is_err(),
                "{ty} {isa:?}: kernel accepted a short activation row"
            );
        }
        // A Q4_K row is 2 blocks of 256; 512 Q8_K activations fit it exactly.
        let w = vec![0u8; 2 * 144];
        assert_eq!(vec_dot_with(isa, GgmlType::Q4K, &w, &act, 512), 0.0);
    }
}
