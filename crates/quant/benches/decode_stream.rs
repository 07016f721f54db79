//! Decode-shaped matvecs streaming from DRAM, in GB/s of weights: the Qwen2.5-1.5B layer
//! shapes, each call on the next of several copies (≥ 256 MB in all, far above the 32 MB
//! L3), on the default pool (all threads) and on one thread. Also the fixed cost per call
//! on a tiny L1-resident matrix (thread hand-off). Best of several passes, so it stays
//! meaningful on a busy machine.
//!
//! `cargo bench -p quant --bench decode_stream`.

use gguf::GgmlType;
use std::hint::black_box;
use std::time::Instant;

/// [rows, cols] of one layer's matrices (q, k, v, o, gate, up, down).
const SHAPES: [(usize, usize); 7] = [
    (1536, 1536),
    (256, 1536),
    (256, 1536),
    (1536, 1536),
    (8960, 1536),
    (8960, 1536),
    (1536, 8960),
];
const STREAM_BYTES: usize = 256 << 20;

fn weights(ty: GgmlType, n_bytes: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut w: Vec<u8> = (0..n_bytes)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let f16_fields: &[usize] = match ty {
        GgmlType::Q6K => &[208],
        GgmlType::Q4K => &[0, 2],
        _ => &[0],
    };
    for b in w.chunks_exact_mut(ty.type_size()) {
        for &o in f16_fields {
            b[o..o + 2].copy_from_slice(&quant::blocks::to_f16_le(0.01));
        }
    }
    w
}

fn layer_pass(
    team: Option<&quant::Team>,
    ty: GgmlType,
    layers: &[Vec<Vec<u8>>],
    x: &[Vec<f32>],
    y: &mut [f32],
) -> f64 {
    let t = Instant::now();
    for layer in layers {
        for ((m, &(r, c)), xi) in layer.iter().zip(&SHAPES).zip(x) {
            match team {
                Some(team) => quant::matvec_on(team, ty, black_box(m), r, c, xi, &mut y[..r]),
                None => quant::matvec(ty, black_box(m), r, c, xi, &mut y[..r]),
            }
        }
    }
    t.elapsed().as_secs_f64()
}

/// As `layer_pass` on the repacked copies (`quant::packed`), on the team.
fn packed_pass(
    team: &quant::Team,
    layers: &[Vec<quant::PackedMatrix>],
    x: &[Vec<f32>],
    y: &mut [f32],
) -> f64 {
    let t = Instant::now();
    for layer in layers {
        for ((m, &(r, _)), xi) in layer.iter().zip(&SHAPES).zip(x) {
            black_box(m).matmul(Some(team), xi, 1, &mut y[..r]);
        }
    }
    t.elapsed().as_secs_f64()
}

fn main() {
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let team = quant::Team::new(rayon::current_num_threads());
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q4_0] {
        let layer_bytes: usize = SHAPES
            .iter()
            .map(|&(r, c)| r * ty.bytes_for(c as u64).unwrap() as usize)
            .sum();
        let n_layers = STREAM_BYTES.div_ceil(layer_bytes);
        let layers: Vec<Vec<Vec<u8>>> = (0..n_layers)
            .map(|l| {
                SHAPES
                    .iter()
                    .enumerate()
                    .map(|(i, &(r, c))| {
                        let n = r * ty.bytes_for(c as u64).unwrap() as usize;
                        weights(ty, n, (l * 7 + i) as u64 * 0x9e37_79b9)
                    })
                    .collect()
            })
            .collect();
        let x: Vec<Vec<f32>> = SHAPES
            .iter()
            .map(|&(_, c)| {
                (0..c)
                    .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
                    .collect()
            })
            .collect();
        let mut y = vec![0f32; 8960];
        let total = (layer_bytes * n_layers) as f64;
        let packed: Vec<Vec<quant::PackedMatrix>> = if quant::packed::supports(ty, 16, 1536) {
            layers
                .iter()
                .map(|l| {
                    l.iter()
                        .zip(&SHAPES)
                        .map(|(m, &(r, c))| quant::PackedMatrix::pack(ty, m, r, c))
                        .collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        // Alternate them, so a burst of load from elsewhere hits all.
        let (mut all, mut teamed, mut pk) = (f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..6 {
            all = all.min(layer_pass(None, ty, &layers, &x, &mut y));
            teamed = teamed.min(layer_pass(Some(&team), ty, &layers, &x, &mut y));
            if !packed.is_empty() {
                pk = pk.min(packed_pass(&team, &packed, &x, &mut y));
            }
        }
        let single = one.install(|| {
            (0..3)
                .map(|_| layer_pass(None, ty, &layers, &x, &mut y))
                .fold(f64::MAX, f64::min)
        });
        println!(
            "{:6} {} layers x {:.1} MB: rayon {:.1} GB/s, team {:.1} GB/s, packed on the team {:.1} GB/s, one thread {:.1} GB/s",
            ty.name(),
            n_layers,
            layer_bytes as f64 / 1e6,
            total / all / 1e9,
            total / teamed / 1e9,
            total / pk / 1e9,
            total / single / 1e9
        );
        // Fixed cost per call: one 1536 x 1536 matrix over and over (L3 resident).
        let (r, c) = SHAPES[0];
        let m = &layers[0][0];
        let calls = 200;
        for use_team in [false, true] {
            let best = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..calls {
                        if use_team {
                            quant::matvec_on(&team, ty, black_box(m), r, c, &x[0], &mut y[..r]);
                        } else {
                            quant::matvec(ty, black_box(m), r, c, &x[0], &mut y[..r]);
                        }
                    }
                    t.elapsed().as_secs_f64() / calls as f64
                })
                .fold(f64::MAX, f64::min);
            println!(
                "{:6} 1536x1536 L3-resident, {}: {:.1} us/call, {:.1} GB/s",
                ty.name(),
                if use_team { "team" } else { "rayon" },
                best * 1e6,
                m.len() as f64 / best / 1e9
            );
        }
    }
}
