//! Packed (16-row interleaved) vs row-major products on the Qwen2.5-1.5B layer shapes:
//! `cargo bench -p quant --bench packed [-- TOKENS]`. Prints GMAC/s (prefill) or GB/s of
//! weights (one token), best of several runs, 2 threads (a team for the packed path, the
//! rayon pool for the row path as the CPU backend runs them).

use gguf::GgmlType;
use quant::{PackedMatrix, Team};
use std::time::Instant;

fn rand_bytes(n: usize, seed: &mut u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) as u8
        })
        .collect()
}

/// Random blocks with a sane f16 scale at each block's scale offsets.
fn weights(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
    let mut w = rand_bytes(rows * cols / ty.block_size() * ty.type_size(), seed);
    let offs: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4K => &[0, 2],
        _ => &[208],
    };
    for b in w.chunks_exact_mut(ty.type_size()) {
        for &o in offs {
            b[o..o + 2].copy_from_slice(&quant::blocks::to_f16_le(0.01));
        }
    }
    w
}

fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let n_tokens: usize = std::env::args()
        .filter_map(|a| a.parse().ok())
        .next()
        .unwrap_or(64);
    // `st`: one thread, best of many single calls (a busy machine still leaves some
    // calls uninterrupted): the kernels' own speed, packed vs row.
    // `cyc TYPE ROWS COLS row|packed`: one thread, 2000 one-token products, nothing else;
    // run under `perf stat -e cycles:u` for cycles per byte that other processes' load
    // does not disturb.
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "cyc") {
        let ty = GgmlType::from_name(&args[i + 1]).expect("type");
        let rows: usize = args[i + 2].parse().unwrap();
        let cols: usize = args[i + 3].parse().unwrap();
        let mut seed = 7;
        let w = weights(ty, rows, cols, &mut seed);
        let x: Vec<f32> = rand_bytes(cols, &mut seed)
            .iter()
            .map(|&b| b as f32 / 128.0 - 1.0)
            .collect();
        let mut y = vec![0f32; rows];
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        one.install(|| {
            if args[i + 4] == "row" {
                for _ in 0..2000 {
                    quant::matmul(ty, &w, rows, cols, &x, 1, &mut y);
                }
            } else {
                let p = PackedMatrix::pack(ty, &w, rows, cols);
                for _ in 0..2000 {
                    p.matmul(None, &x, 1, &mut y);
                }
            }
        });
        println!("{} bytes x 2000", w.len());
        return;
    }
    if std::env::args().any(|a| a == "st") {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let mut seed = 7;
        let shapes = [
            (GgmlType::Q4_0, 512, 1536),
            (GgmlType::Q8_0, 512, 1536),
            (GgmlType::Q4K, 512, 1536),
            (GgmlType::Q6K, 512, 1536),
            (GgmlType::Q4_0, 96, 8960),
            (GgmlType::Q4K, 96, 8960),
            (GgmlType::Q6K, 96, 8960),
        ];
        for (ty, rows, cols) in shapes {
            let w = weights(ty, rows, cols, &mut seed);
            let x: Vec<f32> = rand_bytes(n_tokens * cols, &mut seed)
                .iter()
                .map(|&b| b as f32 / 128.0 - 1.0)
                .collect();
            let mut y = vec![0f32; n_tokens * rows];
            let p = PackedMatrix::pack(ty, &w, rows, cols);
            let (t_row, t_packed) = one.install(|| {
                (
                    best(300, || {
                        quant::matmul(ty, &w, rows, cols, &x, n_tokens, &mut y)
                    }),
                    best(300, || p.matmul(None, &x, n_tokens, &mut y)),
                )
            });
            let gbs = |t: f64| w.len() as f64 * n_tokens as f64 / t / 1e9;
            println!(
                "one thread {ty:5} [{rows}, {cols}] x {n_tokens}: row {:.1}, packed {:.1} GB/s x tokens ({:.2}x)",
                gbs(t_row),
                gbs(t_packed),
                t_row / t_packed
            );
        }
        return;
    }
    let team = Team::new(2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut seed = 1;
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K] {
        for (rows, cols) in [(1536, 1536), (8960, 1536), (1536, 8960)] {
            let w = weights(ty, rows, cols, &mut seed);
            let x: Vec<f32> = rand_bytes(n_tokens * cols, &mut seed)
                .iter()
                .map(|&b| b as f32 / 128.0 - 1.0)
                .collect();
            let mut y = vec![0f32; n_tokens * rows];
            let p = PackedMatrix::pack(ty, &w, rows, cols);
            let reps = if n_tokens == 1 { 50 } else { 5 };
            let t_row = if n_tokens == 1 {
                best(reps, || {
                    quant::matvec_on(&team, ty, &w, rows, cols, &x, &mut y)
                })
            } else {
                best(reps, || {
                    pool.install(|| quant::matmul(ty, &w, rows, cols, &x, n_tokens, &mut y))
                })
            };
            let t_packed = best(reps, || p.matmul(Some(&team), &x, n_tokens, &mut y));
            let p2 = PackedMatrix::pack_with(quant::Isa::Avx2, ty, &w, rows, cols);
            let t_avx2 = best(reps, || p2.matmul(Some(&team), &x, n_tokens, &mut y));
            let unit = |t: f64| {
                if n_tokens == 1 {
                    format!("{:6.1} GB/s", w.len() as f64 / t / 1e9)
                } else {
                    format!("{:6.1} GMAC/s", (rows * cols * n_tokens) as f64 / t / 1e9)
                }
            };
            println!(
                "{ty:5} [{rows:5}, {cols:5}] x {n_tokens:3}: row {}  packed {} ({:.2}x)  packed AVX2 {}",
                unit(t_row),
                unit(t_packed),
                t_row / t_packed,
                unit(t_avx2),
            );
        }
    }
}
