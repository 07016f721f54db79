//! Broken or hostile model files are typed errors, never panics: the qwen3/qwen35 fixtures
//! rewritten with one thing wrong.

use std::path::PathBuf;

use gguf::{GgufFile, GgufWriter, Value};
use model::{LoadOptions, Model, ModelError};

fn fixture(arch: &str) -> GgufFile {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/fixtures"
    ))
    .join(arch)
    .join("model-f32.gguf");
    GgufFile::open(p).unwrap()
}

/// Rewrites `src`, letting `meta` edit each metadata value (None drops the key) and `tensor`
/// rename or reshape tensors (None drops the tensor; a reshape keeps the same element count).
fn rewrite(
    src: &GgufFile,
    meta: impl Fn(&str, &Value) -> Option<Value>,
    tensor: impl Fn(&str, &[u64]) -> Option<(String, Vec<u64>)>,
) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        if let Some(v) = meta(k, v) {
            w.set_metadata(k, v);
        }
    }
    // Keys the file lacks: offered to `meta` with a placeholder value.
    for k in ["qwen3.rope.dimension_count"] {
        if src.metadata().get(k).is_none() {
            match meta(k, &Value::Bool(false)) {
                Some(Value::Bool(false)) | None => {}
                Some(v) => w.set_metadata(k, v),
            }
        }
    }
    let mut kept = Vec::new();
    for t in src.tensors() {
        if let Some((name, dims)) = tensor(&t.name, &t.dims) {
            w.add_tensor(&name, &dims, t.ty).unwrap();
            kept.push(t.clone());
        }
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |i, _, out| {
        out.write_all(src.tensor_data(&kept[i]))
    })
    .unwrap();
    GgufFile::from_bytes(bytes).unwrap()
}

fn load(f: GgufFile) -> Result<Model, ModelError> {
    Model::load_from_gguf(
        f,
        &LoadOptions {
            n_threads: 1,
            ubatch_size: 8,
        },
    )
}

fn same(name: &str, dims: &[u64]) -> Option<(String, Vec<u64>)> {
    Some((name.to_owned(), dims.to_vec()))
}

#[test]
fn unchanged_rewrite_loads() {
    assert!(load(rewrite(&fixture("qwen3"), |_, v| Some(v.clone()), same)).is_ok());
}

#[test]
fn missing_tensor() {
    let f = rewrite(
        &fixture("qwen3"),
        |_, v| Some(v.clone()),
        |n, d| (n != "blk.1.attn_k_norm.weight").then(|| (n.to_owned(), d.to_vec())),
    );
    assert!(
        matches!(load(f), Err(ModelError::MissingTensor(n)) if n == "blk.1.attn_k_norm.weight")
    );
}

#[test]
fn transposed_tensor() {
    let f = rewrite(
        &fixture("qwen3"),
        |_, v| Some(v.clone()),
        |n, d| {
            let mut d = d.to_vec();
            if n == "blk.0.ffn_up.weight" {
                d.reverse();
            }
            Some((n.to_owned(), d))
        },
    );
    assert!(matches!(load(f), Err(ModelError::TensorShape { .. })));
}

#[test]
fn bad_metadata() {
    let cases: Vec<(&str, Option<Value>)> = vec![
        ("general.architecture", Some(Value::String("mamba9".into()))),
        ("qwen3.attention.head_count_kv", Some(Value::U32(3))),
        ("qwen3.attention.head_count", Some(Value::U32(0))),
        ("qwen3.embedding_length", None),
        (
            "qwen3.attention.layer_norm_rms_epsilon",
            Some(Value::String("x".into())),
        ),
        ("qwen3.rope.dimension_count", Some(Value::U32(1000))),
        ("qwen3.block_count", Some(Value::U64(1 << 40))),
    ];
    for (key, val) in cases {
        let f = rewrite(
            &fixture("qwen3"),
            |k, v| {
                if k == key {
                    val.clone()
                } else if matches!(v, Value::Bool(false)) {
                    None
                } else {
                    Some(v.clone())
                }
            },
            same,
        );
        let r = load(f);
        assert!(r.is_err(), "{key} = {val:?} was accepted");
    }
}

#[test]
fn bad_deltanet_metadata() {
    for (key, val) in [
        ("qwen35.ssm.time_step_rank", Value::U32(0)),
        ("qwen35.ssm.group_count", Value::U32(3)),
        ("qwen35.ssm.conv_kernel", Value::U32(9)),
        ("qwen35.ssm.inner_size", Value::U32(100)),
        ("qwen35.attention.recurrent_layers", Value::U32(7)),
    ] {
        let f = rewrite(
            &fixture("qwen35"),
            |k, v| Some(if k == key { val.clone() } else { v.clone() }),
            same,
        );
        let r = load(f);
        assert!(r.is_err(), "{key} = {val:?} was accepted");
    }
}
