//! `collect_imatrix` on the qwen2 fixture: the input of blk.0's q/k/v projections is
//! rms_norm(embedding) * attn_norm, computed here by hand from the file; then the imatrix
//! round-trips through the GGUF format and steers `quantize_file`.

use std::collections::HashMap;
use std::path::PathBuf;

use convert::{collect_imatrix, load_imatrix, quantize_file, save_imatrix, QuantizeOptions};
use gguf::GgufFile;
use model::synth::FileType;
use model::LoadOptions;

fn fixture(file: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/fixtures/qwen2"
    ))
    .join(file)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn imatrix_matches_hand_computed_sums_and_drives_quantize() {
    let path = fixture("model-f32.gguf");
    let chunks: Vec<Vec<u32>> = vec![
        (0..16).map(|i| (i * 31 + 7) % 500).collect(),
        (0..16).map(|i| (i * 13 + 1) % 500).collect(),
    ];
    let entries = collect_imatrix(
        GgufFile::open(&path).unwrap(),
        &chunks,
        &LoadOptions::default(),
        false,
        &mut |_, _| {},
    )
    .unwrap();
    let m: HashMap<_, _> = entries.iter().cloned().collect();
    for n in [
        "blk.0.attn_q.weight",
        "blk.0.attn_output.weight",
        "blk.1.ffn_down.weight",
        "blk.1.ffn_gate.weight",
    ] {
        assert_eq!(m[n].count, 32.0, "{n}");
    }
    assert!(!m.contains_key("output.weight"));

    // By hand: x = embd[t] / sqrt(mean(embd[t]²) + eps) * attn_norm.
    let f = GgufFile::open(&path).unwrap();
    let md = f.metadata();
    let eps = md
        .get_f32("qwen2.attention.layer_norm_rms_epsilon")
        .unwrap() as f64;
    let embd = f32s(f.tensor_data(f.tensor("token_embd.weight").unwrap()));
    let norm = f32s(f.tensor_data(f.tensor("blk.0.attn_norm.weight").unwrap()));
    let d = norm.len();
    let mut want = vec![0f64; d];
    for &t in chunks.iter().flatten() {
        let row = &embd[t as usize * d..(t as usize + 1) * d];
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
        let s = 1.0 / (ms + eps).sqrt();
        for i in 0..d {
            want[i] += (row[i] as f64 * s * norm[i] as f64).powi(2);
        }
    }
    for key in [
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.attn_v.weight",
    ] {
        let got = &m[key].sums;
        for i in 0..d {
            assert!(
                (got[i] as f64 - want[i]).abs() <= 1e-4 * want[i].abs() + 1e-6,
                "{key}[{i}]: {} vs {}",
                got[i],
                want[i]
            );
        }
    }

    // Round trip through the file format, then quantize with it.
    let dir = std::env::temp_dir();
    let imat = dir.join(format!("redline-imat-{}.gguf", std::process::id()));
    save_imatrix(&imat, &entries, 2, 16, "test").unwrap();
    let loaded = load_imatrix(&imat).unwrap();
    assert_eq!(loaded.len(), entries.len());
    let q_plain = dir.join(format!("redline-imat-plain-{}.gguf", std::process::id()));
    let q_imat = dir.join(format!("redline-imat-q-{}.gguf", std::process::id()));
    let mut opts = QuantizeOptions {
        ftype: FileType::Q4KM,
        imatrix: None,
        threads: Some(2),
        pure: false,
    };
    quantize_file(&path, &q_plain, &opts, &mut |_, _| {}).unwrap();
    opts.imatrix = Some(loaded);
    let report = quantize_file(&path, &q_imat, &opts, &mut |_, _| {}).unwrap();
    assert!(report.tensors.iter().filter(|t| t.used_imatrix).count() >= 14);
    let (a, b) = (
        GgufFile::open(&q_plain).unwrap(),
        GgufFile::open(&q_imat).unwrap(),
    );
    let t = a.tensor("blk.0.attn_q.weight").unwrap();
    assert!(a.tensor_data(t) != b.tensor_data(b.tensor("blk.0.attn_q.weight").unwrap()));
    for p in [imat, q_plain, q_imat] {
        let _ = std::fs::remove_file(p);
    }
}
