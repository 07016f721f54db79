//! The 16-row interleaved (repacked) GEMM / GEMV against the scalar reference dot on the
//! file's row layout, on random weights and activations: every packed type, odd token
//! counts (every tile size 1..=8 and remainders), several row groups, and every way of
//! running it (one thread, a team, the rayon pool).

mod dot_common;

use dot_common::{random_weights, Rng};
use gguf::GgmlType;
use quant::dot::{vec_dot_with, Isa};
use quant::packed::{self, PackedMatrix};
use quant::Team;

#[allow(clippy::too_many_arguments)]
fn check(
    isa: Isa,
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    n_tokens: usize,
    team: Option<&Team>,
    seed: u64,
) {
    let mut rng = Rng::new(seed);
    let w = random_weights(&mut rng, ty, n_rows, n_cols);
    let x: Vec<f32> = (0..n_tokens)
        .flat_map(|_| rng.activations(n_cols))
        .collect();
    let p = PackedMatrix::pack_with(isa, ty, &w, n_rows, n_cols);
    assert_eq!(p.isa(), isa);
    let mut y = vec![f32::NAN; n_tokens * n_rows];
    p.matmul(team, &x, n_tokens, &mut y);
    let row_bytes = w.len() / n_rows;
    let mut act = Vec::new();
    for t in 0..n_tokens {
        quant::quantize_activations(ty, &x[t * n_cols..(t + 1) * n_cols], &mut act);
        for r in 0..n_rows {
            let wr = &w[r * row_bytes..(r + 1) * row_bytes];
            let want = vec_dot_with(Isa::Scalar, ty, wr, &act, n_cols) as f64;
            let (_, tol) = dot_common::reference_dot(ty, wr, &act, n_cols);
            let got = y[t * n_rows + r] as f64;
            assert!(
                (got - want).abs() <= 2.0 * tol,
                "{isa:?} {ty} [{n_rows}, {n_cols}] x {n_tokens} tokens: y[{t}, {r}] = {got}, scalar {want} (tol {tol})"
            );
        }
    }
}

fn types() -> Vec<GgmlType> {
    [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K]
        .into_iter()
        .filter(|&ty| packed::supports(ty, 16, 256))
        .collect()
}

/// Every packed-kernel path this CPU runs (each is forced in turn).
fn isas() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|&i| packed::isa_available(i))
        .collect()
}

#[test]
fn packed_matches_scalar_dot_for_every_tile_size() {
    if types().is_empty() {
        eprintln!("no packed kernels on this CPU: nothing to test");
        return;
    }
    for isa in isas() {
        for ty in types() {
            let bs = ty.block_size();
            for (i, &cols) in [bs, 3 * bs, 5 * bs].iter().enumerate() {
                for n_tokens in [1, 2, 3, 4, 5, 6, 7, 8, 9, 17] {
                    let seed = 100 * i as u64 + n_tokens as u64;
                    check(isa, ty, 32, cols, n_tokens, None, seed);
                }
            }
        }
    }
}

#[test]
fn packed_matches_scalar_dot_on_a_team_and_the_pool() {
    if types().is_empty() {
        return;
    }
    let team = Team::new(2);
    for isa in isas() {
        for ty in types() {
            let cols = 6 * ty.block_size().max(256);
            // Enough bytes that one token runs in parallel chunks too.
            let rows = 16 * 40;
            for n_tokens in [1, 11] {
                check(
                    isa,
                    ty,
                    rows,
                    cols,
                    n_tokens,
                    Some(&team),
                    7 + n_tokens as u64,
                );
                check(isa, ty, rows, cols, n_tokens, None, 9 + n_tokens as u64);
            }
        }
    }
}

#[test]
fn every_x86_path_with_the_features_has_packed_kernels() {
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(packed::isa_available(Isa::Avx2), Isa::Avx2.available());
        let vnni = Isa::Avx512.available() && std::is_x86_feature_detected!("avx512vnni");
        assert_eq!(packed::isa_available(Isa::Avx512), vnni);
        eprintln!("packed kernel paths on this CPU: {:?}", isas());
    }
    assert!(!packed::isa_available(Isa::Scalar));
}

#[test]
fn unsupported_shapes_are_refused() {
    assert!(!packed::supports(GgmlType::Q4_0, 8, 32));
    assert!(!packed::supports(GgmlType::Q4_0, 17, 32));
    assert!(!packed::supports(GgmlType::Q5_0, 16, 32));
    assert!(!packed::supports(GgmlType::Q8_0, 16, 48));
    assert!(!packed::supports(GgmlType::Q4K, 16, 0));
}

#[test]
fn packed_copy_costs_about_the_file_size() {
    if types().is_empty() {
        return;
    }
    let mut rng = Rng::new(3);
    for (ty, extra) in [
        (GgmlType::Q4_0, 1.0),
        (GgmlType::Q8_0, 1.0),
        (GgmlType::Q4K, 2368.0 / 2304.0),
        (GgmlType::Q6K, 3392.0 / 3360.0),
    ] {
        let w = random_weights(&mut rng, ty, 32, 512);
        let p = PackedMatrix::pack(ty, &w, 32, 512);
        assert_eq!(
            p.bytes().len(),
            (w.len() as f64 * extra).ceil() as usize,
            "{ty}"
        );
    }
}

/// `matvec_many` (one token through several matrices in one parallel run, x prepared once
/// per activation kind) gives each matrix exactly what its own `matmul` gives: mixed types
/// (Q/K/V of a Q4_K_M model are q4_K, q4_K, q6_K), small and large matrices, on a team, on
/// the pool and inline.
#[test]
fn matvec_many_equals_one_matmul_per_matrix() {
    if types().is_empty() {
        return;
    }
    let team = Team::new(2);
    for isa in isas() {
        let tys = types();
        for (case, shapes) in [
            vec![
                (tys[0], 16 * 40),
                (tys[tys.len() - 1], 16 * 8),
                (tys[0], 16 * 3),
            ],
            tys.iter().map(|&ty| (ty, 16 * 24)).collect::<Vec<_>>(),
            vec![(tys[tys.len() - 1], 16)],
        ]
        .into_iter()
        .enumerate()
        {
            let cols = 4 * 256;
            let mut rng = Rng::new(40 + case as u64);
            let x = rng.activations(cols);
            let ms: Vec<PackedMatrix> = shapes
                .iter()
                .map(|&(ty, rows)| {
                    let w = random_weights(&mut rng, ty, rows, cols);
                    PackedMatrix::pack_with(isa, ty, &w, rows, cols)
                })
                .collect();
            let refs: Vec<&PackedMatrix> = ms.iter().collect();
            for team in [Some(&team), None] {
                let mut ys: Vec<Vec<f32>> =
                    shapes.iter().map(|&(_, r)| vec![f32::NAN; r]).collect();
                {
                    let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| &mut y[..]).collect();
                    packed::matvec_many(team, &refs, &x, &mut outs);
                }
                for (m, y) in ms.iter().zip(&ys) {
                    let mut want = vec![f32::NAN; y.len()];
                    m.matmul(team, &x, 1, &mut want);
                    assert_eq!(
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{isa:?} case {case} {:?}",
                        m.shape()
                    );
                }
            }
        }
    }
}
