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

/// The Q8_0 activation quantizers (scalar and fast) against gguf-py's Q8_0 quantizer, bit
/// for bit, on the formats engineer's vector file (layout: see gguf_py_vectors.rs):
/// "RLQQ", version, type id, n_elements, n_bytes, then f32 inputs, then quantized bytes.
#[test]
fn q8_0_activations_match_gguf_py() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/quant/quant_q8_0.bin"
    );
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let u32_at = |off: usize| u32::from_le_bytes(raw[off..off + 4].try_into().unwrap());
    assert_eq!(&raw[..4], b"RLQQ");
    assert_eq!(u32_at(8), GgmlType::Q8_0 as u32);
    let (n, n_bytes) = (u32_at(12) as usize, u32_at(16) as usize);
    let body = &raw[20..];
    assert_eq!(body.len(), 4 * n + n_bytes);
    let x: Vec<f32> = body[..4 * n]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want = &body[4 * n..];
    let mut got = vec![
        quant::blocks::BlockQ8_0 {
            d: [0; 2],
            qs: [0; 32]
        };
        n / 32
    ];
    quant::activation::quantize_row_q8_0(&x, &mut got);
    assert_eq!(bytemuck::cast_slice::<_, u8>(&got), want, "scalar");
    quant::activation::quantize_row_q8_0_fast(&x, &mut got);
    assert_eq!(bytemuck::cast_slice::<_, u8>(&got), want, "fast");
}
