//! `redline quantize` against llama-quantize (llama.cpp 0c1e570) on the same F32 files: for all
//! 16 output types and 5 models (the four fixtures and the trained stories260K), every tensor
//! gets the type llama-quantize gave it and the very same bytes.
//!
//! The oracle is tests/data/quant/llama_quantize_<model>.json (scripts/gen_llama_quantize_manifest.py:
//! per type, each tensor's type and an FNV-1a 64 hash of its bytes in llama-quantize's output).
//! This pins the whole mix, including the rules chosen by measurement for Qwen3.5 (DeltaNet
//! `attn_qkv` counted with `attn_v`, `ssm_alpha` / `ssm_beta` quantized; see
//! crates/model/src/synth/mix.rs) and the row-length fallbacks of stories260K (rows of 64 and
//! 172: Q6_K -> Q8_0, Q4_K -> Q5_0, IQ4_XS -> IQ4_NL, F16 where no block divides the row).

use std::path::PathBuf;

use convert::{quantize_file, QuantizeOptions};
use gguf::GgufFile;
use model::synth::FileType;

fn repo(p: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(p)
}

fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn check(model: &str) {
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo(&format!(
            "tests/data/quant/llama_quantize_{model}.json"
        )))
        .unwrap(),
    )
    .unwrap();
    let source = repo(manifest["source"].as_str().unwrap());
    let types = manifest["types"].as_object().unwrap();
    assert_eq!(types.len(), 16, "{model}: types in the manifest");
    let mut mismatches = Vec::new();
    for (ty_name, tensors) in types {
        let ftype = FileType::from_name(ty_name).unwrap();
        let out = std::env::temp_dir().join(format!(
            "redline-vs-lq-{}-{model}-{ty_name}.gguf",
            std::process::id()
        ));
        let opts = QuantizeOptions {
            ftype,
            imatrix: None,
            threads: Some(2),
            pure: false,
        };
        quantize_file(&source, &out, &opts, &mut |_, _| {}).unwrap();
        let ours = GgufFile::open(&out).unwrap();
        let tensors = tensors.as_object().unwrap();
        assert_eq!(ours.tensors().len(), tensors.len(), "{model} {ty_name}");
        for t in ours.tensors() {
            let want = &tensors[&t.name];
            let (want_ty, want_hash) = (want[0].as_str().unwrap(), want[1].as_str().unwrap());
            let hash = format!("{:016x}", fnv1a64(ours.tensor_data(t)));
            if !t.ty.name().eq_ignore_ascii_case(want_ty) || hash != want_hash {
                mismatches.push(format!(
                    "{ty_name} {}: ours {} {hash}, llama-quantize {want_ty} {want_hash}",
                    t.name,
                    t.ty.name()
                ));
            }
        }
        drop(ours);
        let _ = std::fs::remove_file(out);
    }
    assert!(
        mismatches.is_empty(),
        "{model}: {} tensors differ from llama-quantize:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn qwen35_every_type_equals_llama_quantize() {
    check("qwen35");
}

#[test]
fn llama_qwen2_qwen3_every_type_equals_llama_quantize() {
    for model in ["llama", "qwen2", "qwen3"] {
        check(model);
    }
}

#[test]
fn stories260k_fallbacks_equal_llama_quantize() {
    check("stories260K");
}

/// From a 16-bit file (F32 -> F16 / BF16 -> Q4_K_M) and requantized from Q8_0 (llama-quantize
/// --allow-requantize): each step by redline, compared with llama-quantize's chain. Only the
/// Q8_0 chain reports requantized tensors (16-bit inputs are read, not requantized).
#[test]
fn qwen35_from_16_bit_and_requantized_equal_llama_quantize() {
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo("tests/data/quant/llama_quantize_qwen35.json")).unwrap(),
    )
    .unwrap();
    let source = repo(manifest["source"].as_str().unwrap());
    let chains = manifest["chains"].as_object().unwrap();
    assert_eq!(chains.len(), 3);
    let mut mismatches = Vec::new();
    for (chain, tensors) in chains {
        let (first, second) = chain.split_once('>').unwrap();
        let tmp = |s: &str| {
            std::env::temp_dir().join(format!("redline-chain-{}-{s}.gguf", std::process::id()))
        };
        let (mid, out) = (tmp(first), tmp(&format!("{first}-{second}")));
        let opts = |name: &str| QuantizeOptions {
            ftype: FileType::from_name(name).unwrap(),
            imatrix: None,
            threads: Some(2),
            pure: false,
        };
        quantize_file(&source, &mid, &opts(first), &mut |_, _| {}).unwrap();
        let report = quantize_file(&mid, &out, &opts(second), &mut |_, _| {}).unwrap();
        assert_eq!(
            report.requantized.is_empty(),
            first != "Q8_0",
            "{chain}: requantized {:?}",
            report.requantized
        );
        let ours = GgufFile::open(&out).unwrap();
        let tensors = tensors.as_object().unwrap();
        assert_eq!(ours.tensors().len(), tensors.len(), "{chain}");
        for t in ours.tensors() {
            let want = &tensors[&t.name];
            let (want_ty, want_hash) = (want[0].as_str().unwrap(), want[1].as_str().unwrap());
            let hash = format!("{:016x}", fnv1a64(ours.tensor_data(t)));
            if !t.ty.name().eq_ignore_ascii_case(want_ty) || hash != want_hash {
                mismatches.push(format!(
                    "{chain} {}: ours {}, llama-quantize {want_ty}",
                    t.name,
                    t.ty.name()
                ));
            }
        }
        drop(ours);
        let _ = std::fs::remove_file(mid);
        let _ = std::fs::remove_file(out);
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
