//! Single-row dot kernels per instruction-set path on cache-resident rows (no memory
//! bound, no threads): the compute speed of each kernel, in GB/s of weights.
//!
//! `cargo bench -p quant --bench kernels`. Takes the best of many runs, so it stays
//! meaningful on a busy machine. Formats with a multi-token kernel also report its
//! multiply-adds per second.

use gguf::GgmlType;
use quant::dot::{dot_kernel, Isa};
use std::time::Instant;

const N: usize = 4096;
/// Rows per pass: ~150 KB of Q4_K, resident in L2.
const ROWS: usize = 64;

fn main() {
    let types = [
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
    let x: Vec<f32> = (0..N).map(|i| (i % 17) as f32 - 8.0).collect();
    // Activation quantization, once per matvec call.
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4K] {
        let mut out = Vec::new();
        let mut best = f64::MAX;
        for _ in 0..200 {
            let t = Instant::now();
            quant::quantize_activations(ty, std::hint::black_box(&x), &mut out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let at = quant::vec_dot_type(ty);
        println!("quantize {N} f32 -> {}: {:.2} us", at.name(), best * 1e6);
    }
    for ty in types {
        let rb = ty.bytes_for(N as u64).unwrap() as usize;
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        // Masking bit 2 and 6 keeps every f16/bf16/f32 field finite.
        let mut w: Vec<u8> = (0..rb * ROWS)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s as u8) & 0x3b
            })
            .collect();
        if ty == GgmlType::F32 {
            w.chunks_exact_mut(4).for_each(|c| c[3] = 0x3f);
        }
        let mut act = Vec::new();
        quant::quantize_activations(ty, &x, &mut act);
        let mut line = format!("{:7}", ty.name());
        for isa in Isa::all_available() {
            let k = dot_kernel(isa, ty).unwrap();
            let mut best = f64::MAX;
            let mut sink = 0.0f32;
            let reps = if isa == Isa::Scalar { 3 } else { 200 };
            for _ in 0..reps {
                let t = Instant::now();
                for r in w.chunks_exact(rb) {
                    sink += k(r, &act, N);
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            std::hint::black_box(sink);
            line += &format!("  {isa:?} {:6.1}", (rb * ROWS) as f64 / best / 1e9);
        }
        println!("{line}  GB/s");
        // Multi-token kernels: multiply-adds per second over MAX_TILE tokens.
        let tile_acts = act.repeat(quant::dot::MAX_TILE);
        let mut line = format!("{:7}", format!("{}x{}", ty.name(), quant::dot::MAX_TILE));
        let mut any = false;
        for isa in Isa::all_available() {
            let Some(k) = quant::dot::dot_tile_kernel(isa, ty) else {
                continue;
            };
            any = true;
            let mut out = [0f32; quant::dot::MAX_TILE];
            let mut best = f64::MAX;
            for _ in 0..200 {
                let t = Instant::now();
                for r in w.chunks_exact(rb) {
                    k(r, &tile_acts, quant::dot::MAX_TILE, N, &mut out);
                    std::hint::black_box(&out);
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let macs = (N * ROWS * quant::dot::MAX_TILE) as f64;
            line += &format!("  {isa:?} {:6.1}", macs / best / 1e9);
        }
        if any {
            println!("{line}  GMAC/s");
        }
    }
}
