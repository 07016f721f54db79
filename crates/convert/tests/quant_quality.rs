//! Quantization error per type (relative RMSE = ||x - deq(q(x))|| / ||x||), ours against
//! llama.cpp's quantizer, for BENCHMARKS.md "Quantization quality". Run with --nocapture to
//! print the table.
//!
//! llama.cpp's side: tests/data/quant/kquant_<type>[_imatrix].bin hold inputs and the bytes of
//! ggml's own quantize_<type> (scripts/gen_kquant_vectors.py); quant_<type>.bin hold gguf-py's
//! (the reference quantizer for the legacy types). Both are dequantized with our dequantizer,
//! which is bit-exact against gguf-py.

use std::path::PathBuf;

use gguf::{GgmlType, GgufFile};
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
];

fn data(p: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data")).join(p)
}

fn u32_at(b: &[u8], i: usize) -> usize {
    u32::from_le_bytes(b[i..i + 4].try_into().unwrap()) as usize
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Sums of squared error and squared input over rows whose both reconstructions are finite.
fn err_sums(
    ty: GgmlType,
    x: &[f32],
    n_per_row: usize,
    theirs: &[u8],
    ours: &[u8],
) -> (f64, f64, f64) {
    let rb = ty.bytes_for(n_per_row as u64).unwrap() as usize;
    let (mut e_t, mut e_o, mut s) = (0.0, 0.0, 0.0);
    let mut yt = vec![0f32; n_per_row];
    let mut yo = vec![0f32; n_per_row];
    for (r, row) in x.chunks_exact(n_per_row).enumerate() {
        quant::dequantize_row(ty, &theirs[r * rb..(r + 1) * rb], &mut yt).unwrap();
        quant::dequantize_row(ty, &ours[r * rb..(r + 1) * rb], &mut yo).unwrap();
        if !row
            .iter()
            .chain(&yt)
            .chain(&yo)
            .all(|v| v.is_finite() && v.abs() < 1e6)
        {
            continue;
        }
        for i in 0..n_per_row {
            let xi = row[i] as f64;
            e_t += (xi - yt[i] as f64).powi(2);
            e_o += (xi - yo[i] as f64).powi(2);
            s += xi * xi;
        }
    }
    (e_t, e_o, s)
}

/// (llama.cpp rel RMSE, ours) on the oracle vectors of `ty`, with or without imatrix.
fn versus_llama_cpp(ty: GgmlType, imatrix: bool) -> Option<(f64, f64)> {
    let name = ty.name().to_ascii_lowercase();
    let k = data(&format!(
        "quant/kquant_{name}{}.bin",
        if imatrix { "_imatrix" } else { "" }
    ));
    if let Ok(b) = std::fs::read(&k) {
        let (rows, n) = (u32_at(&b, 12), u32_at(&b, 16));
        let mut o = 24;
        let x = f32s(&b[o..o + rows * n * 4]);
        o += rows * n * 4;
        let w = if u32_at(&b, 20) == 1 {
            let w = f32s(&b[o..o + n * 4]);
            o += n * 4;
            Some(w)
        } else {
            None
        };
        let theirs = &b[o..];
        let mut ours = vec![0u8; theirs.len()];
        quant::quantize_rows(ty, &x, n, &mut ours, w.as_deref()).unwrap();
        let (et, eo, s) = err_sums(ty, &x, n, theirs, &ours);
        return Some(((et / s).sqrt(), (eo / s).sqrt()));
    }
    if imatrix {
        return None;
    }
    let b = std::fs::read(data(&format!("quant/quant_{name}.bin"))).ok()?;
    let (ne, nb) = (u32_at(&b, 12), u32_at(&b, 16));
    let x = f32s(&b[20..20 + ne * 4]);
    let theirs = &b[20 + ne * 4..20 + ne * 4 + nb];
    let n = ty.block_size();
    let mut ours = vec![0u8; nb];
    quant::quantize_rows(ty, &x, n, &mut ours, None).unwrap();
    let (et, eo, s) = err_sums(ty, &x, n, theirs, &ours);
    Some(((et / s).sqrt(), (eo / s).sqrt()))
}

fn rel_rmse(ty: GgmlType, x: &[f32], n_per_row: usize) -> f64 {
    let rb = ty.bytes_for(n_per_row as u64).unwrap() as usize;
    let mut q = vec![0u8; rb * x.len() / n_per_row];
    quant::quantize_rows(ty, x, n_per_row, &mut q, None).unwrap();
    let mut y = vec![0f32; n_per_row];
    let (mut e, mut s) = (0.0, 0.0);
    for (r, row) in x.chunks_exact(n_per_row).enumerate() {
        quant::dequantize_row(ty, &q[r * rb..(r + 1) * rb], &mut y).unwrap();
        for (a, b) in row.iter().zip(&y) {
            e += ((a - b) as f64).powi(2);
            s += (*a as f64).powi(2);
        }
    }
    (e / s).sqrt()
}

/// The 2-D weights of the qwen35 fixture (every 256-multiple row), as (rows, row length).
fn fixture_weights() -> Vec<(Vec<f32>, usize)> {
    let f = GgufFile::open(data("fixtures/qwen35/model-f32.gguf")).unwrap();
    f.tensors()
        .iter()
        .filter(|t| t.dims.len() == 2 && t.dims[0] % 256 == 0 && !t.name.contains("conv1d"))
        .map(|t| (f32s(f.tensor_data(t)), t.dims[0] as usize))
        .collect()
}

#[test]
fn relative_rmse_table_no_worse_than_llama_cpp() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    // Synthetic: 64 rows of 4096 Gaussians (Box-Muller) with a few 8-sigma outliers.
    let mut synth: Vec<f32> = (0..64 * 4096)
        .map(|_| {
            let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32 * 0.02
        })
        .collect();
    for i in (0..synth.len()).step_by(997) {
        synth[i] *= 8.0;
    }
    let fixture = fixture_weights();
    println!("| type | bpw | synthetic (ours) | fixture qwen35 (ours) | llama.cpp vectors: llama.cpp | ours | with imatrix: llama.cpp | ours |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut prev_synth = f64::INFINITY;
    for ty in TYPES {
        let s = rel_rmse(ty, &synth, 4096);
        let (mut e, mut n) = (0.0, 0.0);
        for (w, row) in &fixture {
            let r = rel_rmse(ty, w, *row);
            let ss: f64 = w.iter().map(|v| (*v as f64).powi(2)).sum();
            e += r * r * ss;
            n += ss;
        }
        let fx = (e / n).sqrt();
        let cell = |v: Option<(f64, f64)>| match v {
            Some((t, o)) => {
                // Same algorithm, same bytes: never worse (tiny slack for summation order).
                assert!(
                    o <= t * (1.0 + 1e-6),
                    "{}: ours {o} > llama.cpp {t}",
                    ty.name()
                );
                format!("{t:.5} | {o:.5}")
            }
            None => "– | –".to_owned(),
        };
        let plain = cell(versus_llama_cpp(ty, false));
        let imat = cell(versus_llama_cpp(ty, true));
        println!(
            "| {} | {:.2} | {s:.5} | {fx:.5} | {plain} | {imat} |",
            ty.name(),
            ty.bits_per_weight()
        );
        // Sanity on the synthetic set: 8 bits ~0.4 %, 2 bits under 40 %.
        assert!(s < 0.4 && s > 1e-4, "{}: {s}", ty.name());
        if ty == GgmlType::Q8_0 {
            assert!(s < 0.01);
        }
        if matches!(
            ty,
            GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K
        ) {
            assert!(s < prev_synth, "{}: more bits, more error", ty.name());
        }
        prev_synth = if ty == GgmlType::Q8_0 {
            f64::INFINITY
        } else {
            s
        };
    }
}
