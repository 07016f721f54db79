//! Matvec throughput per weight format, in bytes of weights per second.
//!
//! `cargo bench -p quant --bench dot` — a 4096 × 4096 matrix per format on the default
//! rayon pool (all cores) and on one thread, plus an 8-token matmul for the main
//! formats. Decode speed is weight bytes / (GB/s), so GB/s here is the number to watch.
//! Each iteration takes the next of several copies of the matrix (≥ 96 MB in all), so
//! weights stream from DRAM as in decode rather than sitting in the 32 MB L3.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gguf::GgmlType;
use std::hint::black_box;
use std::time::Duration;

const ROWS: usize = 4096;
const COLS: usize = 4096;
/// Bytes of weight copies cycled through, well above the L3 size.
const STREAM_BYTES: usize = 96 << 20;

const TYPES: [GgmlType; 15] = [
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::Q5K,
    GgmlType::IQ4XS,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::IQ4NL,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// Random bytes with every f16 in a sane range, so no NaN/denormal slows anything down.
fn weights(ty: GgmlType, n_rows: usize, n_cols: usize) -> Vec<u8> {
    let n_bytes = n_rows * ty.bytes_for(n_cols as u64).unwrap() as usize;
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut w: Vec<u8> = (0..n_bytes)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let f16_fields: &[usize] = match ty {
        GgmlType::F16 | GgmlType::BF16 => {
            for c in w.chunks_exact_mut(2) {
                c[1] = 0x3c; // ~1.0 with random mantissa bits
            }
            &[]
        }
        GgmlType::F32 => {
            for c in w.chunks_exact_mut(4) {
                c[3] = 0x3f;
            }
            &[]
        }
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        _ => &[0],
    };
    if !f16_fields.is_empty() {
        for b in w.chunks_exact_mut(ty.type_size()) {
            for &o in f16_fields {
                b[o..o + 2].copy_from_slice(&quant::blocks::to_f16_le(0.01));
            }
        }
    }
    w
}

fn bench_matvec(c: &mut Criterion) {
    let x: Vec<f32> = (0..COLS)
        .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
        .collect();
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut y = vec![0f32; ROWS];
    for (label, pool) in [("all_threads", None), ("one_thread", Some(&one_thread))] {
        let mut g = c.benchmark_group(format!("matvec_{ROWS}x{COLS}_{label}"));
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1));
        for ty in TYPES {
            let w = weights(ty, ROWS, COLS);
            let copies: Vec<Vec<u8>> = (0..STREAM_BYTES.div_ceil(w.len()))
                .map(|_| w.clone())
                .collect();
            let mut next = 0;
            g.throughput(Throughput::Bytes(w.len() as u64));
            g.bench_function(BenchmarkId::from_parameter(ty.name()), |b| {
                let mut run = || {
                    next = (next + 1) % copies.len();
                    quant::matvec(ty, black_box(&copies[next]), ROWS, COLS, &x, &mut y)
                };
                match pool {
                    Some(p) => p.install(|| b.iter(&mut run)),
                    None => b.iter(&mut run),
                }
            });
        }
        g.finish();
    }
}

fn bench_matmul(c: &mut Criterion) {
    const TOKENS: usize = 8;
    let x: Vec<f32> = (0..COLS * TOKENS)
        .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
        .collect();
    let mut y = vec![0f32; ROWS * TOKENS];
    let mut g = c.benchmark_group(format!("matmul_{ROWS}x{COLS}_{TOKENS}tok"));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q4_0, GgmlType::Q8_0] {
        let w = weights(ty, ROWS, COLS);
        // Elements (multiply-adds) per second: weights × tokens.
        g.throughput(Throughput::Elements((ROWS * COLS * TOKENS) as u64));
        g.bench_function(BenchmarkId::from_parameter(ty.name()), |b| {
            b.iter(|| quant::matmul(ty, black_box(&w), ROWS, COLS, &x, TOKENS, &mut y))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_matvec, bench_matmul);
criterion_main!(benches);
