//! Our reader against gguf-py: tests/data/gguf/*.json were written by
//! scripts/gguf_reference_dump.py (gguf-py's GGUFReader) from the same files.

use std::io::Read;
use std::path::Path;

use gguf::{Array, GgufFile, Value};
use serde_json::{json, Value as Json};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// Arrays longer than 2 × EDGE are summarised (must match the script).
const EDGE: usize = 4;

fn fnv1a64(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h = (*h ^ b as u64).wrapping_mul(0x100000001B3);
    }
}

/// The array's on-disk payload hash and, as JSON, every element.
fn array_elements(a: &Array) -> (u64, Vec<Json>) {
    let mut h = 0xCBF29CE484222325u64;
    macro_rules! nums {
        ($v:expr) => {{
            for x in $v {
                fnv1a64(&mut h, &x.to_le_bytes());
            }
            $v.iter().map(|&x| json!(x)).collect()
        }};
    }
    let elems = match a {
        Array::U8(v) => nums!(v),
        Array::I8(v) => nums!(v),
        Array::U16(v) => nums!(v),
        Array::I16(v) => nums!(v),
        Array::U32(v) => nums!(v),
        Array::I32(v) => nums!(v),
        Array::U64(v) => nums!(v),
        Array::I64(v) => nums!(v),
        Array::F32(v) => nums!(v),
        Array::F64(v) => nums!(v),
        Array::Bool(v) => {
            for &x in v {
                fnv1a64(&mut h, &[x as u8]);
            }
            v.iter().map(|&x| json!(x)).collect()
        }
        Array::String(v) => {
            for s in v {
                fnv1a64(&mut h, &(s.len() as u64).to_le_bytes());
                fnv1a64(&mut h, s.as_bytes());
            }
            v.iter().map(|s| json!(s)).collect()
        }
        Array::Array(_) => panic!("no nested arrays in the reference files"),
    };
    (h, elems)
}

/// Our value in the script's JSON form.
fn to_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => {
            let (hash, elems) = array_elements(a);
            if elems.len() <= 2 * EDGE {
                return Json::Array(elems);
            }
            let mut o = json!({
                "len": elems.len(),
                "first": elems[..EDGE],
                "last": elems[elems.len() - EDGE..],
                "fnv1a64": format!("{hash:016x}"),
            });
            if let Array::String(v) = a {
                o["total_bytes"] = json!(v.iter().map(|s| s.len()).sum::<usize>());
            }
            o
        }
    }
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("array[{}]", a.element_type().name()),
        v => v.value_type().name().to_owned(),
    }
}

/// Structural equality; numbers equal when within 1e-15 relative (JSON float parsing may
/// differ from Python's by an ulp).
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => {
            if x.is_f64() || y.is_f64() {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                x == y || (x - y).abs() <= 1e-15 * x.abs().max(y.abs())
            } else {
                x == y
            }
        }
        (Json::Array(x), Json::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Json::Object(x), Json::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn check(label: &str, f: &GgufFile) {
    let path = format!("{ROOT}/tests/data/gguf/{label}.json");
    let want: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json!(f.version()), want["version"], "{label}");
    assert_eq!(json!(f.alignment()), want["alignment"], "{label}");
    assert_eq!(json!(f.data_offset()), want["data_offset"], "{label}");

    let want_kv = want["metadata"].as_array().unwrap();
    let got_kv: Vec<(&str, &Value)> = f.metadata().iter().collect();
    assert_eq!(got_kv.len(), want_kv.len(), "{label}: key count");
    for ((key, value), w) in got_kv.iter().zip(want_kv) {
        assert_eq!(*key, w["key"], "{label}: key order");
        assert_eq!(json!(type_name(value)), w["type"], "{label}: type of {key}");
        let got = to_json(value);
        assert!(
            same(&got, &w["value"]),
            "{label}: {key}: ours {got} gguf-py {}",
            w["value"]
        );
    }

    let want_t = want["tensors"].as_array().unwrap();
    assert_eq!(f.tensors().len(), want_t.len(), "{label}: tensor count");
    for (t, w) in f.tensors().iter().zip(want_t) {
        assert_eq!(t.name, w["name"], "{label}");
        assert_eq!(json!(t.ty as u32), w["type_id"], "{label}: {}", t.name);
        assert!(t
            .ty
            .name()
            .eq_ignore_ascii_case(w["type"].as_str().unwrap()));
        assert_eq!(json!(t.dims), w["shape"], "{label}: {}", t.name);
        assert_eq!(json!(t.offset), w["offset"], "{label}: {}", t.name);
        assert_eq!(json!(t.n_bytes), w["n_bytes"], "{label}: {}", t.name);
        assert_eq!(
            json!(t.n_elements()),
            w["n_elements"],
            "{label}: {}",
            t.name
        );
    }
}

#[test]
fn fixture_models_match_gguf_py() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        for kind in ["f32", "q8_0"] {
            let path = format!("{ROOT}/tests/data/fixtures/{arch}/model-{kind}.gguf");
            check(
                &format!("{arch}-model-{kind}"),
                &GgufFile::open(path).unwrap(),
            );
        }
    }
    check(
        "stories260K",
        &GgufFile::open(format!("{ROOT}/models/stories260K.gguf")).unwrap(),
    );
}

#[test]
fn vocab_files_match_gguf_py() {
    for name in ["gpt-2", "llama-bpe", "llama-spm", "qwen2", "qwen35"] {
        let label = format!("ggml-vocab-{name}");
        let zst = Path::new(ROOT).join(format!("tests/data/vocab/{label}.gguf.zst"));
        let mut dec =
            ruzstd::decoding::StreamingDecoder::new(std::fs::File::open(zst).unwrap()).unwrap();
        let mut bytes = Vec::new();
        dec.read_to_end(&mut bytes).unwrap();
        check(&label, &GgufFile::from_bytes(bytes).unwrap());
    }
}
