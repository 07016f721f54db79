//! Every SIMD path against the scalar reference on random rows: many block counts
//! (odd ones included), float rows with tails shorter than a vector, extreme weights.

mod dot_common;

use dot_common::{random_weights, reference_dot, scale_offsets, Rng, DOT_TYPES};
use gguf::GgmlType;
use quant::dot::{vec_dot_with, Isa};

fn simd_paths() -> Vec<Isa> {
    Isa::all_available()
        .into_iter()
        .filter(|&i| i != Isa::Scalar)
        .collect()
}

/// Element counts to try for `ty`: 1..=9 and 17 blocks, plus vector-tail sizes for floats.
fn lengths(ty: GgmlType) -> Vec<usize> {
    let bs = ty.block_size();
    if bs == 1 {
        vec![1, 7, 8, 9, 31, 32, 33, 63, 65, 255, 256, 1000, 1537]
    } else {
        (1..=9)
            .chain([17])
            .map(|k| k * bs.max(256))
            .chain([bs, 3 * bs])
            .collect()
    }
}

#[test]
fn simd_matches_scalar_on_random_rows() {
    let paths = simd_paths();
    eprintln!("SIMD paths on this CPU: {paths:?}");
    let mut rng = Rng::new(1234);
    for isa in paths {
        for ty in DOT_TYPES {
            for n in lengths(ty) {
                for rep in 0..3 {
                    let w = random_weights(&mut rng, ty, 1, n);
                    let x = rng.activations(n);
                    let mut act = Vec::new();
                    quant::quantize_activations(ty, &x, &mut act);
                    let scalar = vec_dot_with(Isa::Scalar, ty, &w, &act, n) as f64;
                    let simd = vec_dot_with(isa, ty, &w, &act, n) as f64;
                    let (want, tol) = reference_dot(ty, &w, &act, n);
                    assert!(
                        (simd - scalar).abs() <= tol && (simd - want).abs() <= tol,
                        "{ty} {isa:?} n={n} rep={rep}: simd {simd} scalar {scalar} f64 {want} (tol {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn simd_matches_scalar_on_extreme_quants() {
    // All-ones / all-zero quant bytes hit the largest |q| of every format (e.g. Q8_0 -128,
    // Q6_K 63, Q4_K 15) against activations of ±127.
    let mut rng = Rng::new(99);
    for isa in simd_paths() {
        for ty in DOT_TYPES.into_iter().filter(|t| t.block_size() > 1) {
            let n = 4 * 256;
            for fill in [0x00u8, 0xff, 0x80, 0x7f] {
                let mut w = random_weights(&mut rng, ty, 1, n);
                // Keep the f16 scales of a valid row, saturate everything else.
                for block in w.chunks_exact_mut(ty.type_size()) {
                    let keep = scale_offsets(ty);
                    for (i, b) in block.iter_mut().enumerate() {
                        if !keep.iter().any(|&o| i == o || i == o + 1) {
                            *b = fill;
                        }
                    }
                }
                let x: Vec<f32> = (0..n)
                    .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                    .collect();
                let mut act = Vec::new();
                quant::quantize_activations(ty, &x, &mut act);
                let scalar = vec_dot_with(Isa::Scalar, ty, &w, &act, n) as f64;
                let simd = vec_dot_with(isa, ty, &w, &act, n) as f64;
                let (_, tol) = reference_dot(ty, &w, &act, n);
                assert!(
                    (simd - scalar).abs() <= tol,
                    "{ty} {isa:?} fill={fill:#x}: {simd} vs {scalar}"
                );
            }
        }
    }
}

#[test]
fn tile_kernels_match_scalar_for_every_token_count() {
    let mut rng = Rng::new(4321);
    for isa in Isa::all_available() {
        for ty in DOT_TYPES {
            let Some(tile) = quant::dot::dot_tile_kernel(isa, ty) else {
                continue;
            };
            // Odd block counts too (7 and 1 blocks of 32) for the pairwise kernels.
            let odd: &[usize] = if ty.block_size() == 32 {
                &[7 * 32, 32]
            } else {
                &[]
            };
            for n in [256, 5 * 256, 11 * 256]
                .into_iter()
                .chain(odd.iter().copied())
            {
                let w = random_weights(&mut rng, ty, 1, n);
                for n_tok in 1..=quant::dot::MAX_TILE {
                    let mut acts = Vec::new();
                    let mut one = Vec::new();
                    for _ in 0..n_tok {
                        quant::quantize_activations(ty, &rng.activations(n), &mut one);
                        acts.extend_from_slice(&one);
                    }
                    let mut out = vec![f32::NAN; n_tok];
                    tile(&w, &acts, n_tok, n, &mut out);
                    let ab = acts.len() / n_tok;
                    for (t, &got) in out.iter().enumerate() {
                        let a = &acts[t * ab..(t + 1) * ab];
                        let scalar = vec_dot_with(Isa::Scalar, ty, &w, a, n) as f64;
                        let (_, tol) = reference_dot(ty, &w, a, n);
                        assert!(
                            (got as f64 - scalar).abs() <= tol,
                            "{ty} {isa:?} n={n} n_tok={n_tok} t={t}: tile {got} vs scalar {scalar}"
                        );
                    }
                }
            }
        }
    }
}
