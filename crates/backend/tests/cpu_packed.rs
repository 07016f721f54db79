//! The CPU backend's repacked matmul (Q4_0 / Q8_0 / Q4_K / Q6_K matrices whose rows split into
//! 16-row groups are repacked at first use, `quant::packed`) against the row-major kernel
//! on the same quantized activations (`quant::matmul`, tight) and against the slow
//! reference (dequantized weights, f32 activations, f64 sums), for one token (decode, on
//! the backend's thread team) and several (prefill); `embed` of the same table still
//! reads the file's rows after the matrix was packed.

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

// (type, rows, cols): rows a multiple of 16 so the packed path runs (where the CPU has it).
const CASES: [(GgmlType, usize, usize); 5] = [
    (GgmlType::Q4_0, 48, 160),
    (GgmlType::Q8_0, 32, 96),
    (GgmlType::Q4K, 32, 512),
    (GgmlType::Q6K, 16, 768),
    (GgmlType::Q4_0, 16 * 48, 1024),
];

fn build_file(seed: &mut u64) -> Arc<GgufFile> {
    let mut w = GgufWriter::new();
    let mut data = Vec::new();
    for (i, &(ty, rows, cols)) in CASES.iter().enumerate() {
        w.add_tensor(&format!("w{i}"), &[cols as u64, rows as u64], ty)
            .unwrap();
        data.push((0..rows * cols).map(|_| lcg(seed)).collect::<Vec<f32>>());
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |i, info, out| {
        let (ty, rows, cols) = CASES[i];
        let row_bytes = info.n_bytes as usize / rows;
        let mut buf = vec![0u8; row_bytes];
        for r in 0..rows {
            quant::quantize_row(ty, &data[i][r * cols..(r + 1) * cols], &mut buf).unwrap();
            out.write_all(&buf)?;
        }
        Ok(())
    })
    .unwrap();
    Arc::new(GgufFile::from_bytes(bytes).unwrap())
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn packed_matmul_matches_row_kernels_and_reference() {
    let mut seed = 11;
    let file = build_file(&mut seed);
    let fast = CpuBackend::new(2).unwrap();
    let slow = CpuBackend::reference(1).unwrap();
    for (i, &(ty, rows, cols)) in CASES.iter().enumerate() {
        let name = format!("w{i}");
        let wf = fast.load_weight(&file, &name).unwrap();
        let ws = slow.load_weight(&file, &name).unwrap();
        let raw = file.tensor_data(file.tensor(&name).unwrap());
        for n in [1, 3, 8, 17] {
            let x = CpuTensor::from_vec(n, cols, (0..n * cols).map(|_| lcg(&mut seed)).collect())
                .unwrap();
            let mut yf = CpuTensor::zeros(n, rows);
            let mut ys = CpuTensor::zeros(n, rows);
            fast.matmul(&wf, &x, &mut yf).unwrap();
            slow.matmul(&ws, &x, &mut ys).unwrap();
            let mut yr = vec![0f32; n * rows];
            quant::matmul(ty, raw, rows, cols, &x.data, n, &mut yr);
            let e_row = rel_l2(&yf.data, &yr);
            let e_ref = rel_l2(&yf.data, &ys.data);
            assert!(
                e_row < 1e-5,
                "{ty} [{rows}x{cols}] n={n}: vs row kernel {e_row:.2e}"
            );
            assert!(
                e_ref < 2e-2,
                "{ty} [{rows}x{cols}] n={n}: vs reference {e_ref:.2e}"
            );
        }
        // Wrong shapes are errors, not panics, on the packed path too.
        let mut y = CpuTensor::zeros(2, rows);
        assert!(fast
            .matmul(&wf, &CpuTensor::zeros(2, cols + 1), &mut y)
            .is_err());
        assert!(fast
            .matmul(
                &wf,
                &CpuTensor::zeros(2, cols),
                &mut CpuTensor::zeros(2, rows + 1)
            )
            .is_err());
        // The table is still looked up from the file's rows after packing.
        let mut e = CpuTensor::zeros(1, cols);
        fast.embed(&wf, &[(rows - 1) as u32], &mut e).unwrap();
        let rb = raw.len() / rows;
        let mut want = vec![0f32; cols];
        quant::dequantize_row(ty, &raw[(rows - 1) * rb..], &mut want).unwrap();
        assert_eq!(e.data, want);
    }
}
