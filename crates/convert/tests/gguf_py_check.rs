//! Every `redline quantize` output type, read back by gguf-py (llama.cpp's own Python GGUF
//! package, `pip install gguf`): header, metadata keys, tensor table (names, types, dims,
//! offsets, sizes) and the dequantized values must be what redline's reader and dequantizer
//! see. scripts/quality-gguf-check.py prints gguf-py's view as JSON.
//!
//! Skipped, with a message, where python3 or gguf-py is missing (.ci/run installs gguf).
//! That llama.cpp itself loads these files and measures them like its own is recorded in
//! BENCHMARKS.md (scripts/quality-table.py needs a llama.cpp build, which CI has not).

use std::path::{Path, PathBuf};
use std::process::Command;

use convert::{quantize_file, QuantizeOptions};
use gguf::{GgmlType, GgufFile};
use model::synth::FileType;

fn fixture(arch: &str, file: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/fixtures"
    ))
    .join(arch)
    .join(file)
}

/// gguf-py's description of `files`, or None when python3 / gguf-py is not installed.
fn gguf_py(files: &[PathBuf]) -> Option<serde_json::Value> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/quality-gguf-check.py"
    );
    let out = match Command::new("python3").arg(script).args(files).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: python3 not runnable ({e})");
            return None;
        }
    };
    if out.status.code() == Some(3) {
        eprintln!("SKIPPED: gguf-py not installed (pip install gguf)");
        return None;
    }
    assert!(
        out.status.success(),
        "quality-gguf-check.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

fn dequantized(file: &GgufFile, t: &gguf::TensorInfo) -> Vec<f32> {
    let mut v = vec![0f32; t.n_elements() as usize];
    quant::dequantize_row(t.ty, file.tensor_data(t), &mut v).unwrap();
    v
}

fn close(a: f64, b: f64, scale: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-5 * scale.max(1e-30),
        "{what}: redline {a} vs gguf-py {b}"
    );
}

/// Compares one file with gguf-py's description of it.
fn check(path: &Path, py: &serde_json::Value, ftype: FileType) -> usize {
    let f = GgufFile::open(path).unwrap();
    let name = path.display();
    assert_eq!(py["version"].as_u64(), Some(f.version() as u64), "{name}");
    let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k).collect();
    let py_keys: Vec<&str> = py["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(keys, py_keys, "{name}: metadata keys");
    assert_eq!(
        py["file_type"].as_u64(),
        Some(ftype.llama_ftype() as u64),
        "{name}: general.file_type"
    );
    let py_tensors = py["tensors"].as_array().unwrap();
    assert_eq!(py_tensors.len(), f.tensors().len(), "{name}: tensor count");
    let mut n_quantized = 0;
    for (t, p) in f.tensors().iter().zip(py_tensors) {
        let what = format!("{name} {}", t.name);
        assert_eq!(p["name"].as_str(), Some(t.name.as_str()), "{what}");
        assert!(
            p["type"]
                .as_str()
                .unwrap()
                .eq_ignore_ascii_case(t.ty.name()),
            "{what}: gguf-py type {} vs ours {}",
            p["type"],
            t.ty.name()
        );
        let dims: Vec<u64> = p["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(dims, t.dims, "{what}: dims");
        assert_eq!(p["offset"].as_u64(), Some(t.offset), "{what}: offset");
        assert_eq!(p["n_bytes"].as_u64(), Some(t.n_bytes), "{what}: bytes");
        let v = dequantized(&f, t);
        let sum_sq: f64 = v.iter().map(|&x| x as f64 * x as f64).sum();
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        let n = v.len() as f64;
        close(
            sum_sq,
            p["sum_sq"].as_f64().unwrap(),
            sum_sq,
            &format!("{what} sum_sq"),
        );
        // |sum| <= sqrt(n * sum_sq): a scale that does not vanish when the sum does.
        close(
            sum,
            p["sum"].as_f64().unwrap(),
            (n * sum_sq).sqrt(),
            &format!("{what} sum"),
        );
        let rms = (sum_sq / n).sqrt();
        let head = p["head"].as_array().unwrap();
        let tail = p["tail"].as_array().unwrap();
        for (i, h) in head.iter().enumerate() {
            close(
                v[i] as f64,
                h.as_f64().unwrap(),
                rms,
                &format!("{what} [{i}]"),
            );
        }
        let start = v.len() - tail.len();
        for (i, h) in tail.iter().enumerate() {
            close(
                v[start + i] as f64,
                h.as_f64().unwrap(),
                rms,
                &format!("{what} [{}]", start + i),
            );
        }
        if t.ty != GgmlType::F32 {
            n_quantized += 1;
        }
    }
    n_quantized
}

#[test]
fn every_quantize_type_reads_the_same_in_gguf_py() {
    let dir = std::env::temp_dir().join(format!("redline-gguf-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let types: Vec<FileType> = FileType::ALL
        .into_iter()
        .filter(|t| *t != FileType::F32)
        .collect();
    let mut files = Vec::new();
    for &ftype in &types {
        let out = dir.join(format!("qwen35-{}.gguf", ftype.name()));
        let opts = QuantizeOptions {
            ftype,
            imatrix: None,
            threads: Some(2),
            pure: false,
        };
        quantize_file(
            &fixture("qwen35", "model-f32.gguf"),
            &out,
            &opts,
            &mut |_, _| {},
        )
        .unwrap();
        files.push(out);
    }
    let Some(py) = gguf_py(&files) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    for (path, &ftype) in files.iter().zip(&types) {
        let n = check(path, &py[path.to_str().unwrap()], ftype);
        // The Qwen3.5 fixture has 26 weight matrices that every type quantizes.
        assert!(n >= 26, "{}: only {n} quantized tensors", path.display());
    }
    println!("gguf-py read {} files like redline", files.len());
    let _ = std::fs::remove_dir_all(&dir);
}
