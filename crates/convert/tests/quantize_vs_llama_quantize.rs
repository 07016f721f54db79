//! `redline quantize` against llama-quantize (llama.cpp 0c1e570) on the same F32 files: for all
//! 16 output types and 5 models (the four fixtures and the trained stories260K), every tensor
//! gets the type llama-quantize gave it and the very same bytes; on Qwen3.5 also with an
//! importance matrix, from F16 / BF16 inputs and requantized from Q8_0.
//!
//! The oracle is tests/data/quant/llama_quantize_<model>.json
//! (scripts/gen_llama_quantize_manifest.py: per type, each tensor's type and an FNV-1a 64 hash
//! of its bytes in llama-quantize's output). This pins the whole mix, including the rules chosen
//! by measurement for Qwen3.5 (DeltaNet `attn_qkv` counted with `attn_v`, `ssm_alpha` /
//! `ssm_beta` quantized; see crates/model/src/synth/mix.rs and BENCHMARKS.md), llama.cpp's
//! has_imatrix rules and imatrix-weighted block search, and the row-length fallbacks of
//! stories260K (rows of 64 and 172: Q6_K -> Q8_0, Q4_K -> Q5_0, IQ4_XS -> IQ4_NL, F16 where no
//! block divides the row).

use std::path::{Path, PathBuf};

use convert::{load_imatrix, quantize_file, QuantizeOptions, QuantizeReport};
use gguf::GgufFile;
use model::synth::FileType;
use serde_json::{Map, Value};

fn repo(p: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(p)
}

fn manifest(model: &str) -> Value {
    let path = repo(&format!("tests/data/quant/llama_quantize_{model}.json"));
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn tmp(label: &str) -> PathBuf {
    std::env::temp_dir().join(format!("redline-vs-lq-{}-{label}.gguf", std::process::id()))
}

/// Quantizes `src` to `ftype` (with the imatrix file `imatrix`, if any) into `out`.
fn quantize(src: &Path, out: &Path, ftype: &str, imatrix: Option<&Path>) -> QuantizeReport {
    let opts = QuantizeOptions {
        ftype: FileType::from_name(ftype).unwrap(),
        imatrix: imatrix.map(|p| load_imatrix(p).unwrap()),
        threads: Some(2),
        pure: false,
    };
    quantize_file(src, out, &opts, &mut |_, _| {}).unwrap()
}

/// Tensors of `out` whose type or bytes differ from llama-quantize's (`want`: name -> [type,
/// hash]), as readable lines.
fn differences(label: &str, out: &Path, want: &Map<String, Value>) -> Vec<String> {
    let ours = GgufFile::open(out).unwrap();
    assert_eq!(ours.tensors().len(), want.len(), "{label}: tensor count");
    let mut bad = Vec::new();
    for t in ours.tensors() {
        let w = &want[&t.name];
        let (want_ty, want_hash) = (w[0].as_str().unwrap(), w[1].as_str().unwrap());
        let hash = format!("{:016x}", fnv1a64(ours.tensor_data(t)));
        if !t.ty.name().eq_ignore_ascii_case(want_ty) || hash != want_hash {
            bad.push(format!(
                "{label} {}: ours {} {hash}, llama-quantize {want_ty} {want_hash}",
                t.name,
                t.ty.name()
            ));
        }
    }
    bad
}

/// Every type of `section` ("types" or "imatrix_types") of `model`'s manifest.
fn check(model: &str, section: &str) {
    let m = manifest(model);
    let source = repo(m["source"].as_str().unwrap());
    let imatrix = match section {
        "imatrix_types" => Some(repo(m["imatrix"].as_str().unwrap())),
        _ => None,
    };
    let types = m[section].as_object().unwrap();
    assert_eq!(types.len(), 16, "{model}: types in the manifest");
    let mut bad = Vec::new();
    for (ty, want) in types {
        let label = format!("{model}-{section}-{ty}");
        let out = tmp(&label);
        quantize(&source, &out, ty, imatrix.as_deref());
        bad.extend(differences(&label, &out, want.as_object().unwrap()));
        let _ = std::fs::remove_file(out);
    }
    assert!(
        bad.is_empty(),
        "{model}: {} tensors differ from llama-quantize:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn qwen35_every_type_equals_llama_quantize() {
    check("qwen35", "types");
}

#[test]
fn llama_qwen2_qwen3_every_type_equals_llama_quantize() {
    for model in ["llama", "qwen2", "qwen3"] {
        check(model, "types");
    }
}

#[test]
fn stories260k_fallbacks_equal_llama_quantize() {
    check("stories260K", "types");
}

/// With an importance matrix (tests/data/quant/qwen35-imatrix.gguf, made by `redline imatrix`
/// on the fixture, read by both tools): llama.cpp's has_imatrix mix rules and its weighted
/// block search give the same bytes.
#[test]
fn qwen35_with_imatrix_every_type_equals_llama_quantize() {
    check("qwen35", "imatrix_types");
}

/// From a 16-bit file (F32 -> F16 / BF16 -> Q4_K_M) and requantized from Q8_0 (llama-quantize
/// --allow-requantize): each step by redline, compared with llama-quantize's chain. Only the
/// Q8_0 chain reports requantized tensors (16-bit inputs are read, not requantized).
#[test]
fn qwen35_from_16_bit_and_requantized_equal_llama_quantize() {
    let m = manifest("qwen35");
    let source = repo(m["source"].as_str().unwrap());
    let chains = m["chains"].as_object().unwrap();
    assert_eq!(chains.len(), 3);
    let mut bad = Vec::new();
    for (chain, want) in chains {
        let (first, second) = chain.split_once('>').unwrap();
        let (mid, out) = (tmp(first), tmp(&format!("{first}-{second}")));
        quantize(&source, &mid, first, None);
        let report = quantize(&mid, &out, second, None);
        assert_eq!(
            report.requantized.is_empty(),
            first != "Q8_0",
            "{chain}: requantized {:?}",
            report.requantized
        );
        bad.extend(differences(chain, &out, want.as_object().unwrap()));
        let _ = std::fs::remove_file(mid);
        let _ = std::fs::remove_file(out);
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
