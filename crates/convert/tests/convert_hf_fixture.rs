//! `convert_hf` on the Hugging Face fixture checkpoints (shared/fixtures-hf, beside the
//! checkout in CI) against the GGUFs llama.cpp's converter made from them
//! (tests/data/fixtures/<arch>/model-f32.gguf, model-q8_0.gguf).

use std::path::{Path, PathBuf};

use convert::{convert_hf, convert_hf_chunked, OutType};
use gguf::{GgufFile, Value};

#[path = "support/safetensors.rs"]
mod safetensors;
use safetensors::write_safetensors;

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
    assert_same_as(arch, &out, oracle);
    let _ = std::fs::remove_file(out);
}

/// `out` has the oracle fixture's tensors (names, order, types, bytes) and inference metadata.
fn assert_same_as(arch: &str, out: &Path, oracle: &str) {
    let ours = GgufFile::open(out).unwrap();
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
}

/// Real Qwen3.5 checkpoints are `Qwen3_5ForConditionalGeneration`: hyperparameters under
/// `text_config`, text tensors under `model.language_model.`, a vision tower under
/// `model.visual.` (llama.cpp puts it in a separate mmproj file). The fixture rewritten that
/// way converts to exactly the fixture's GGUF.
#[test]
fn qwen35_conditional_generation_text_part() {
    let src = Path::new(HF).join("qwen35");
    if !src.exists() {
        eprintln!("skipping: {} is absent", src.display());
        return;
    }
    let dir = std::env::temp_dir().join(format!("redline-cg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let text_cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let cfg = serde_json::json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_cfg,
        "vision_config": {"depth": 1, "hidden_size": 16},
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let st = convert::safetensors::StFile::open(&src.join("model.safetensors")).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = st
        .tensors
        .iter()
        .map(|t| {
            let name = match t.name.strip_prefix("model.") {
                Some(rest) => format!("model.language_model.{rest}"),
                None => t.name.clone(),
            };
            (name, t.shape.clone(), st.to_f32(t))
        })
        .collect();
    tensors.push((
        "model.visual.patch_embed.proj.weight".into(),
        vec![16, 12],
        vec![0.5; 16 * 12],
    ));
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    let out = dir.join("out.gguf");
    convert_hf(&dir, &out, OutType::F32, &mut |_, _| {}).unwrap();
    assert_same_as("qwen35", &out, "model-f32.gguf");
    let _ = std::fs::remove_dir_all(dir);
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

/// Qwen3.5 with one MTP layer, split over two shards with an index: the main tensors still
/// equal llama.cpp's, and the MTP head lands in block n_layer as llama.cpp's `nextn` tensors.
#[test]
fn qwen35_mtp_layer_and_sharded_index() {
    let src = Path::new(HF).join("qwen35");
    if !src.exists() {
        eprintln!("skipping: {} is absent", src.display());
        return;
    }
    let dir = std::env::temp_dir().join(format!("redline-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["mtp_num_hidden_layers"] = 1.into();
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        dir.join("model-00001-of-00002.safetensors"),
    )
    .unwrap();
    let ramp = |n: usize| {
        (0..n)
            .map(|i| (i as f32 * 0.37).sin() * 0.05)
            .collect::<Vec<_>>()
    };
    let mut mtp: Vec<(String, Vec<usize>, Vec<f32>)> = vec![
        ("mtp.fc.weight".into(), vec![256, 512], ramp(256 * 512)),
        (
            "mtp.pre_fc_norm_embedding.weight".into(),
            vec![256],
            ramp(256),
        ),
        ("mtp.pre_fc_norm_hidden.weight".into(), vec![256], ramp(256)),
        ("mtp.norm.weight".into(), vec![256], ramp(256)),
    ];
    for (n, s) in [
        ("input_layernorm.weight", vec![256]),
        ("post_attention_layernorm.weight", vec![256]),
        ("self_attn.q_proj.weight", vec![512, 256]),
        ("self_attn.k_proj.weight", vec![128, 256]),
        ("self_attn.v_proj.weight", vec![128, 256]),
        ("self_attn.o_proj.weight", vec![256, 256]),
        ("self_attn.q_norm.weight", vec![64]),
        ("self_attn.k_norm.weight", vec![64]),
        ("mlp.gate_proj.weight", vec![512, 256]),
        ("mlp.up_proj.weight", vec![512, 256]),
        ("mlp.down_proj.weight", vec![256, 512]),
    ] {
        let len = s.iter().product();
        mtp.push((format!("mtp.layers.0.{n}"), s, ramp(len)));
    }
    write_safetensors(&dir.join("model-00002-of-00002.safetensors"), &mtp);
    let mut map = serde_json::Map::new();
    for (n, _, _) in &mtp {
        map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
    }
    map.insert(
        "model.norm.weight".into(),
        "model-00001-of-00002.safetensors".into(),
    );
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();

    let out = dir.join("out.gguf");
    convert_hf(&dir, &out, OutType::F32, &mut |_, _| {}).unwrap();
    let ours = GgufFile::open(&out).unwrap();
    let theirs = GgufFile::open(fixture("qwen35", "model-f32.gguf")).unwrap();
    for b in theirs.tensors() {
        let a = ours.tensor(&b.name).unwrap();
        assert!(ours.tensor_data(a) == theirs.tensor_data(b), "{}", b.name);
    }
    assert_eq!(ours.tensors().len(), theirs.tensors().len() + mtp.len());
    let md = ours.metadata();
    assert_eq!(md.get_u32("qwen35.block_count"), Some(5));
    assert_eq!(md.get_u32("qwen35.nextn_predict_layers"), Some(1));
    assert_eq!(
        md.get_array("qwen35.attention.recurrent_layers"),
        Some(&gguf::Array::Bool(vec![true, false, true, false, false]))
    );
    let f32_of = |n: &str| {
        let t = ours.tensor(n).unwrap_or_else(|| panic!("{n} missing"));
        (
            t.dims.clone(),
            ours.tensor_data(t)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect::<Vec<_>>(),
        )
    };
    let (dims, eh) = f32_of("blk.4.nextn.eh_proj.weight");
    assert_eq!(dims, vec![512, 256]);
    assert_eq!(eh, mtp[0].2);
    // Qwen3.5 RMSNorm weights are stored minus one: +1 here too.
    let (_, enorm) = f32_of("blk.4.nextn.enorm.weight");
    assert_eq!(enorm[7], mtp[1].2[7] + 1.0);
    let (_, qn) = f32_of("blk.4.attn_q_norm.weight");
    assert_eq!(qn[3], ramp(64)[3] + 1.0);
    for n in [
        "blk.4.nextn.hnorm.weight",
        "blk.4.nextn.shared_head_norm.weight",
        "blk.4.attn_q.weight",
        "blk.4.ffn_down.weight",
        "blk.4.post_attention_norm.weight",
    ] {
        f32_of(n);
    }
    drop(ours);
    let _ = std::fs::remove_dir_all(dir);
}

/// Streaming in chunks of a few rows gives the same bytes as converting whole tensors.
#[test]
fn chunked_streaming_gives_the_same_file() {
    for (arch, outtype) in [("llama", OutType::Q8_0), ("qwen35", OutType::F32)] {
        let dir = Path::new(HF).join(arch);
        if !dir.exists() {
            eprintln!("skipping: {} is absent", dir.display());
            return;
        }
        let tmp = |s: &str| {
            std::env::temp_dir().join(format!(
                "redline-chunk-{}-{arch}-{s}.gguf",
                std::process::id()
            ))
        };
        let (whole, chunked) = (tmp("whole"), tmp("chunked"));
        convert_hf(&dir, &whole, outtype, &mut |_, _| {}).unwrap();
        convert_hf_chunked(&dir, &chunked, outtype, 1000, &mut |_, _| {}).unwrap();
        assert!(
            std::fs::read(&whole).unwrap() == std::fs::read(&chunked).unwrap(),
            "{arch}"
        );
        let _ = std::fs::remove_file(whole);
        let _ = std::fs::remove_file(chunked);
    }
}

/// `--outtype f16` / `bf16`: llama.cpp's converter picks the same tensors for the 16-bit type
/// as for Q8_0 (conversion/base.py: 1-D, norms, `ssm_conv1d` and non-`.weight` stay F32), and
/// stores `np.float16` / gguf-py's round-to-nearest-even bf16 of its F32 values. So the Q8_0
/// fixture says which tensors are 16-bit, and the F32 fixture (bit-equal to our F32 output)
/// gives their values through an independent rounding (the `half` crate).
#[test]
fn f16_and_bf16_follow_llama_cpp_type_choice_and_rounding() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        let f32_file = GgufFile::open(fixture(arch, "model-f32.gguf")).unwrap();
        let q8 = GgufFile::open(fixture(arch, "model-q8_0.gguf")).unwrap();
        for outtype in [OutType::F16, OutType::BF16] {
            let Some(out) = convert(arch, outtype) else {
                return;
            };
            let ours = GgufFile::open(&out).unwrap();
            assert_eq!(ours.tensors().len(), f32_file.tensors().len(), "{arch}");
            let mut n16 = 0;
            for t in ours.tensors() {
                let src = f32_file.tensor(&t.name).unwrap();
                let q = q8.tensor(&t.name).unwrap();
                assert_eq!(t.dims, src.dims, "{arch} {}", t.name);
                let x = f32_file.tensor_data(src);
                if q.ty == gguf::GgmlType::F32 {
                    assert_eq!(t.ty, gguf::GgmlType::F32, "{arch} {outtype:?} {}", t.name);
                    assert!(ours.tensor_data(t) == x, "{arch} {}", t.name);
                    continue;
                }
                let want: Vec<u8> = x
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .flat_map(|v| match outtype {
                        OutType::F16 => half::f16::from_f32(v).to_le_bytes(),
                        _ => half::bf16::from_f32(v).to_le_bytes(),
                    })
                    .collect();
                let ty = match outtype {
                    OutType::F16 => gguf::GgmlType::F16,
                    _ => gguf::GgmlType::BF16,
                };
                assert_eq!(t.ty, ty, "{arch} {}", t.name);
                assert!(
                    ours.tensor_data(t) == want.as_slice(),
                    "{arch} {outtype:?} {}: values",
                    t.name
                );
                n16 += 1;
            }
            assert!(n16 >= 9, "{arch}: {n16} 16-bit tensors");
            let ftype = ours.metadata().get_u32("general.file_type");
            let want_ftype = if outtype == OutType::F16 { 1 } else { 32 };
            assert_eq!(ftype, Some(want_ftype), "{arch}");
            drop(ours);
            let _ = std::fs::remove_file(out);
        }
    }
}
