//! Threaded matvec / matmul against the single-row dot and against an f64 product of the
//! dequantized weights with the dequantized (quantized-once) activations.

mod dot_common;

use dot_common::{random_weights, reference_dot, Rng, DOT_TYPES};
use gguf::GgmlType;
use quant::dot::{vec_dot_with, Isa};
use quant::matvec::matmul_with;

fn check(isa: Isa, ty: GgmlType, n_rows: usize, n_cols: usize, n_tokens: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let w = random_weights(&mut rng, ty, n_rows, n_cols);
    let x = rng.activations(n_tokens * n_cols);
    let mut y = vec![f32::NAN; n_tokens * n_rows];
    matmul_with(isa, ty, &w, n_rows, n_cols, &x, n_tokens, &mut y);
    let row_bytes = w.len() / n_rows;
    let mut act = Vec::new();
    for t in 0..n_tokens {
        quant::quantize_activations(ty, &x[t * n_cols..(t + 1) * n_cols], &mut act);
        for r in 0..n_rows {
            let got = y[t * n_rows + r];
            let wr = &w[r * row_bytes..(r + 1) * row_bytes];
            let single = vec_dot_with(isa, ty, wr, &act, n_cols);
            let (want, tol) = reference_dot(ty, wr, &act, n_cols);
            if n_tokens == 1 {
                // Decode runs exactly the single-row kernel.
                assert_eq!(
                    got.to_bits(),
                    single.to_bits(),
                    "{ty} {isa:?} r={r}: matvec vs vec_dot"
                );
            } else {
                // Prefill may use a multi-token kernel that adds in another order.
                let diff = (got - single).abs() as f64;
                assert!(
                    diff <= tol,
                    "{ty} {isa:?} t={t} r={r}: {got} vs vec_dot {single}"
                );
            }
            assert!(
                (got as f64 - want).abs() <= tol,
                "{ty} {isa:?} [{n_rows}x{n_cols}] t={t} r={r}: {got} vs f64 {want} (tol {tol})"
            );
        }
    }
}

#[test]
fn matvec_every_type_every_path() {
    for isa in Isa::all_available() {
        for (i, ty) in DOT_TYPES.into_iter().enumerate() {
            let n_cols = 3 * 256;
            check(isa, ty, 37, n_cols, 1, 100 + i as u64);
        }
    }
}

#[test]
fn matmul_every_type_every_path_odd_tokens() {
    for isa in Isa::all_available() {
        for (i, ty) in DOT_TYPES.into_iter().enumerate() {
            check(isa, ty, 19, 512, 11, 200 + i as u64);
        }
    }
}

#[test]
fn matvec_small_and_single_row() {
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
        check(Isa::Scalar, ty, 1, 32, 1, 7);
        check(quant::dot::best_isa(), ty, 3, 64, 2, 8);
    }
}

#[test]
fn matvec_many_rows_is_threaded_correctly() {
    // More rows than one task so several tasks and both threads take part.
    check(quant::dot::best_isa(), GgmlType::Q8_0, 1001, 1024, 1, 9);
    check(quant::dot::best_isa(), GgmlType::Q4K, 515, 1536, 5, 10);
}

#[test]
fn shared_quantized_activations_match_matmul() {
    // Q4_K and Q6_K both take Q8_K activations: quantize once, run both.
    let mut rng = Rng::new(11);
    let (n_rows, n_cols, n_tokens) = (23, 512, 3);
    let x = rng.activations(n_tokens * n_cols);
    let acts = quant::quantize_activation_rows(GgmlType::Q4K, &x, n_tokens, n_cols);
    for ty in [GgmlType::Q4K, GgmlType::Q6K] {
        let w = random_weights(&mut rng, ty, n_rows, n_cols);
        let mut y1 = vec![0f32; n_tokens * n_rows];
        let mut y2 = vec![0f32; n_tokens * n_rows];
        quant::matmul(ty, &w, n_rows, n_cols, &x, n_tokens, &mut y1);
        quant::matmul_quantized(ty, &w, n_rows, n_cols, &acts, n_tokens, &mut y2);
        assert_eq!(y1, y2, "{ty}");
    }
}

#[test]
#[should_panic(expected = "byte length")]
fn wrong_weight_size_panics_with_a_message() {
    let w = vec![0u8; 100];
    let mut y = vec![0f32; 2];
    quant::matvec(GgmlType::Q8_0, &w, 2, 64, &[0.0; 64], &mut y);
}

#[test]
fn matvec_on_team_equals_matvec_bit_for_bit() {
    // Every row is the single-row kernel on the same activations, whoever computes it.
    let teams: Vec<quant::Team> = [1, 2, 3].into_iter().map(quant::Team::new).collect();
    let mut rng = Rng::new(12);
    let shapes = [(1, 256), (37, 768), (1001, 1024), (515, 1536), (2053, 512)];
    for isa in Isa::all_available() {
        for (i, ty) in DOT_TYPES.into_iter().enumerate() {
            let (n_rows, n_cols): (usize, usize) = shapes[i % shapes.len()];
            let n_cols = n_cols.next_multiple_of(ty.block_size());
            let w = random_weights(&mut rng, ty, n_rows, n_cols);
            let x = rng.activations(n_cols);
            let mut want = vec![f32::NAN; n_rows];
            matmul_with(isa, ty, &w, n_rows, n_cols, &x, 1, &mut want);
            for team in &teams {
                for _ in 0..3 {
                    let mut got = vec![f32::NAN; n_rows];
                    quant::matvec::matvec_on_with(team, isa, ty, &w, n_rows, n_cols, &x, &mut got);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{ty} {isa:?} [{n_rows}x{n_cols}] team of {}",
                        team.n_threads()
                    );
                }
            }
        }
    }
}
