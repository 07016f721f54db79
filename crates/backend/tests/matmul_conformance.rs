//! The fast CPU matmul (quant::matmul, activations quantized as llama.cpp does) against the
//! slow reference (dequantized weights, f32 activations, f64 sums) on random weights of
//! several types and odd shapes, written to an in-memory GGUF and read in place.

use std::sync::Arc;

use backend::cpu::{CpuBackend, CpuTensor};
use backend::Backend;
use gguf::{GgmlType, GgufFile, GgufWriter};

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

const CASES: [(GgmlType, usize, usize, f64); 7] = [
    // (type, rows, cols, relative L2 tolerance)
    (GgmlType::F32, 37, 96, 1e-5),
    (GgmlType::F16, 37, 96, 2e-3),
    (GgmlType::Q8_0, 37, 96, 2e-2),
    (GgmlType::Q4_0, 5, 160, 2e-2),
    (GgmlType::Q8_0, 1, 32, 2e-2),
    (GgmlType::Q4K, 19, 256, 2e-2),
    (GgmlType::Q6K, 3, 512, 2e-2),
];

fn build_file(seed: &mut u64) -> (Arc<GgufFile>, Vec<Vec<f32>>) {
    let mut w = GgufWriter::new();
    let mut data = Vec::new();
    for (i, &(ty, rows, cols, _)) in CASES.iter().enumerate() {
        w.add_tensor(&format!("w{i}"), &[cols as u64, rows as u64], ty)
            .unwrap();
        data.push((0..rows * cols).map(|_| lcg(seed)).collect::<Vec<f32>>());
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |i, info, out| {
        let (ty, rows, cols, _) = CASES[i];
        let row_bytes = info.n_bytes as usize / rows;
        let mut buf = vec![0u8; row_bytes];
        for r in 0..rows {
            quant::quantize_row(ty, &data[i][r * cols..(r + 1) * cols], &mut buf).unwrap();
            out.write_all(&buf)?;
        }
        Ok(())
    })
    .unwrap();
    (Arc::new(GgufFile::from_bytes(bytes).unwrap()), data)
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn fast_matmul_matches_reference() {
    let mut seed = 3;
    let (file, _) = build_file(&mut seed);
    let fast = CpuBackend::new(2).unwrap();
    let slow = CpuBackend::reference(1).unwrap();
    for (i, &(ty, rows, cols, tol)) in CASES.iter().enumerate() {
        let wf = fast.load_weight(&file, &format!("w{i}")).unwrap();
        let ws = slow.load_weight(&file, &format!("w{i}")).unwrap();
        for n in [1, 3, 17] {
            let x = CpuTensor::from_vec(n, cols, (0..n * cols).map(|_| lcg(&mut seed)).collect())
                .unwrap();
            let mut yf = CpuTensor::zeros(n, rows);
            let mut ys = CpuTensor::zeros(n, rows);
            fast.matmul(&wf, &x, &mut yf).unwrap();
            slow.matmul(&ws, &x, &mut ys).unwrap();
            let e = rel_l2(&yf.data, &ys.data);
            assert!(
                e < tol,
                "{ty} [{rows}x{cols}] n={n}: relative error {e:.2e}"
            );
        }
        // Wrong shapes are errors, not panics.
        let x = CpuTensor::zeros(2, cols + 1);
        let mut y = CpuTensor::zeros(2, rows);
        assert!(fast.matmul(&wf, &x, &mut y).is_err());
    }
}

#[test]
fn embed_reads_the_dequantized_row() {
    let mut seed = 5;
    let (file, _) = build_file(&mut seed);
    let b = CpuBackend::new(1).unwrap();
    let (ty, rows, cols, _) = CASES[2];
    let w = b.load_weight(&file, "w2").unwrap();
    let mut out = CpuTensor::zeros(2, cols);
    b.embed(&w, &[4, (rows - 1) as u32], &mut out).unwrap();
    let info = file.tensor("w2").unwrap();
    let rb = info.n_bytes as usize / rows;
    let mut want = vec![0.0f32; cols];
    quant::dequantize_row(
        ty,
        &file.tensor_data(info)[(rows - 1) * rb..rows * rb],
        &mut want,
    )
    .unwrap();
    assert_eq!(out.row(1), &want[..]);
    assert!(b
        .embed(&w, &[rows as u32], &mut CpuTensor::zeros(1, cols))
        .is_err());
}
