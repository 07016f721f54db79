//! `convert_hf` on the Hugging Face fixture checkpoints (shared/fixtures-hf, beside the
//! checkout in CI) against the GGUFs llama.cpp's converter made from them
//! (tests/data/fixtures/<arch>/model-f32.gguf, model-q8_0.gguf).

use std::path::{Path, PathBuf};

use convert::{convert_hf, OutType};
use gguf::{GgufFile, Value};

const HF: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures-hf");

fn fixture(arch: &str, file: &str) -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/fixtures"
    ))
    .join(arch)
    .join(file)
}

fn convert(arch: &str, outtype: OutType) -> Option<PathBuf> {
    let dir = Path::new(HF).join(arch);
    if !dir.exists() {
        eprintln!(
            "skipping: {} is absent (shared/fixtures-hf is not beside the checkout)",
            dir.display()
        );
        return None;
    }
    let out = std::env::temp_dir().join(format!(
        "redline-convert-hf-{}-{arch}-{outtype:?}.gguf",
        std::process::id()
    ));
    convert_hf(&dir, &out, outtype, &mut |_, _| {}).unwrap();
    Some(out)
}

/// Keys whose values inference reads; `general.name` / `size_label` are labels.
fn inference_keys(f: &GgufFile) -> Vec<(String, Value)> {
    f.metadata()
        .iter()
        .filter(|(k, _)| !matches!(*k, "general.name" | "general.size_label"))
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect()
}

fn check(arch: &str, outtype: OutType, oracle: &str) {
    let Some(out) = convert(arch, outtype) else {
        return;
    };
    let ours = GgufFile::open(&out).unwrap();
    let theirs = GgufFile::open(fixture(arch, oracle)).unwrap();
    let names = |f: &GgufFile| {
        f.tensors()
            .iter()
            .map(|t| t.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&ours),
        names(&theirs),
        "{arch}: tensor names and order"
    );
    for (a, b) in ours.tensors().iter().zip(theirs.tensors()) {
        assert_eq!((&a.dims, a.ty), (&b.dims, b.ty), "{arch} {}", a.name);
        assert!(
            ours.tensor_data(a) == theirs.tensor_data(b),
            "{arch} {}: bytes differ",
            a.name
        );
    }
    let mut ours_md = inference_keys(&ours);
    let mut theirs_md = inference_keys(&theirs);
    ours_md.sort_by(|a, b| a.0.cmp(&b.0));
    theirs_md.sort_by(|a, b| a.0.cmp(&b.0));
    let keys = |m: &[(String, Value)]| m.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&ours_md), keys(&theirs_md), "{arch}: metadata keys");
    for ((k, a), (_, b)) in ours_md.iter().zip(&theirs_md) {
        assert_eq!(a, b, "{arch}: {k}");
    }
    let _ = std::fs::remove_file(out);
}

#[test]
fn f32_equals_llama_cpp_llama() {
    check("llama", OutType::F32, "model-f32.gguf");
}

#[test]
fn f32_equals_llama_cpp_qwen2() {
    check("qwen2", OutType::F32, "model-f32.gguf");
}

#[test]
fn f32_equals_llama_cpp_qwen3() {
    check("qwen3", OutType::F32, "model-f32.gguf");
}

#[test]
fn f32_equals_llama_cpp_qwen35() {
    check("qwen35", OutType::F32, "model-f32.gguf");
}

#[test]
fn q8_0_equals_llama_cpp_all() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        check(arch, OutType::Q8_0, "model-q8_0.gguf");
    }
}
