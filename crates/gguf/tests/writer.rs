//! The writer: round trips through our reader, and byte-identical rewrites of the fixture
//! files that gguf-py (llama.cpp's converter) wrote.

use std::io::Read;

use gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, Value};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(255)),
        ("t.i8", Value::I8(-128)),
        ("t.u16", Value::U16(65535)),
        ("t.i16", Value::I16(-32768)),
        ("t.u32", Value::U32(u32::MAX)),
        ("t.i32", Value::I32(i32::MIN)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(-0.1)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("ünïcødé ▁token\n".into())),
        ("t.empty_string", Value::String(String::new())),
        ("a.u8", Value::Array(Array::U8(vec![0, 1, 255]))),
        ("a.i8", Value::Array(Array::I8(vec![-1, 0, 1]))),
        ("a.u16", Value::Array(Array::U16(vec![1, 65535]))),
        ("a.i16", Value::Array(Array::I16(vec![-2, 2]))),
        ("a.u32", Value::Array(Array::U32(vec![7; 5]))),
        ("a.i32", Value::Array(Array::I32(vec![-7, 7]))),
        ("a.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        ("a.i64", Value::Array(Array::I64(vec![i64::MIN, i64::MAX]))),
        (
            "a.f32",
            Value::Array(Array::F32(vec![0.5, -0.0, f32::INFINITY])),
        ),
        ("a.f64", Value::Array(Array::F64(vec![1e300, -1e-300]))),
        ("a.bool", Value::Array(Array::Bool(vec![true, false, true]))),
        (
            "a.string",
            Value::Array(Array::String(vec!["a".into(), "".into(), "ç".into()])),
        ),
        ("a.empty", Value::Array(Array::F32(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2, 3]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::Bool(vec![false])]),
                Array::U8(vec![]),
            ])),
        ),
    ]
}

/// Deterministic bytes for tensor `i`.
fn pattern(i: usize, n: u64) -> Vec<u8> {
    (0..n).map(|j| (j as usize * 31 + i * 7) as u8).collect()
}

fn round_trip(alignment: Option<u32>) {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.set_metadata("general.alignment", Value::U32(a));
    }
    for (k, v) in every_value() {
        w.set_metadata(k, v);
    }
    // Replacing a key keeps its position.
    w.set_metadata("t.u8", Value::U8(3));
    let shapes: [(&str, &[u64], GgmlType); 5] = [
        ("odd.f32", &[3], GgmlType::F32),
        ("m.q8_0", &[64, 3], GgmlType::Q8_0),
        ("m.q4_k", &[256, 2, 1], GgmlType::Q4K),
        ("m.f16", &[5, 7], GgmlType::F16),
        ("m.i8", &[1, 1, 1, 9], GgmlType::I8),
    ];
    for (name, dims, ty) in shapes {
        w.add_tensor(name, dims, ty).unwrap();
    }
    let mut out = Vec::new();
    w.write(&mut out, |i, t, dst| dst.write_all(&pattern(i, t.n_bytes)))
        .unwrap();

    let f = GgufFile::from_bytes(out).unwrap();
    let align = alignment.unwrap_or(32) as u64;
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), align);
    let mut want = every_value();
    want[0].1 = Value::U8(3);
    if let Some(a) = alignment {
        want.insert(0, ("general.alignment", Value::U32(a)));
    }
    let got: Vec<(&str, &Value)> = f.metadata().iter().collect();
    assert_eq!(got.len(), want.len());
    for ((gk, gv), (wk, wv)) in got.iter().zip(&want) {
        assert_eq!(gk, wk);
        assert_eq!(*gv, wv, "{gk}");
    }
    assert_eq!(f.tensors().len(), shapes.len());
    for (i, (t, (name, dims, ty))) in f.tensors().iter().zip(shapes).enumerate() {
        assert_eq!((t.name.as_str(), t.dims.as_slice(), t.ty), (name, dims, ty));
        assert_eq!(t.offset % align, 0);
        assert_eq!(f.tensor_data(t), pattern(i, t.n_bytes));
    }
    assert_eq!(f.tensor("m.q8_0").unwrap().n_bytes, 3 * 2 * 34);
    assert_eq!(f.file_len() % align, 0);
}

#[test]
fn round_trips_every_value_type() {
    round_trip(None);
    round_trip(Some(64));
    round_trip(Some(1));
}

#[test]
fn rejects_bad_declarations_and_short_fills() {
    let mut w = GgufWriter::new();
    w.add_tensor("a", &[32], GgmlType::Q8_0).unwrap();
    assert!(matches!(
        w.add_tensor("a", &[32], GgmlType::F32),
        Err(GgufError::DuplicateTensor { .. })
    ));
    assert!(matches!(
        w.add_tensor("b", &[31], GgmlType::Q8_0),
        Err(GgufError::NotBlockAligned { .. })
    ));
    assert!(matches!(
        w.add_tensor("b", &[1, 2, 3, 4, 5], GgmlType::F32),
        Err(GgufError::TooManyDims { .. })
    ));
    assert!(matches!(
        w.add_tensor("b", &[0], GgmlType::F32),
        Err(GgufError::BadDim { .. })
    ));
    assert!(matches!(
        w.add_tensor("b", &[1 << 40, 1 << 40], GgmlType::F32),
        Err(GgufError::ElementCountOverflow { .. })
    ));
    let e = w
        .write(Vec::new(), |_, _, dst| dst.write_all(&[0; 33]))
        .unwrap_err();
    assert!(
        matches!(&e, GgufError::WrongTensorSize { name, written: 33, expected: 34 } if name == "a"),
        "{e}"
    );
    let mut w = GgufWriter::new();
    w.set_metadata("general.alignment", Value::U32(24));
    assert!(matches!(
        w.write(Vec::new(), |_, _, _| Ok(())),
        Err(GgufError::BadAlignment(24))
    ));
}

/// Re-writes `orig` with our writer: same metadata in the same order, same tensors, same data.
fn rewrite(orig: &GgufFile) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in orig.metadata().iter() {
        w.set_metadata(k, v.clone());
    }
    for t in orig.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
    }
    let mut out = Vec::new();
    w.write(&mut out, |i, t, dst| {
        let src = &orig.tensors()[i];
        assert_eq!((&t.name, t.offset), (&src.name, src.offset));
        dst.write_all(orig.tensor_data(src))
    })
    .unwrap();
    out
}

#[test]
fn rewrites_fixture_models_byte_identically() {
    let mut paths = vec![format!("{ROOT}/models/stories260K.gguf")];
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        for kind in ["f32", "q8_0"] {
            paths.push(format!(
                "{ROOT}/tests/data/fixtures/{arch}/model-{kind}.gguf"
            ));
        }
    }
    for path in paths {
        let bytes = std::fs::read(&path).unwrap();
        let orig = GgufFile::from_bytes(bytes.clone()).unwrap();
        let out = rewrite(&orig);
        assert_eq!(out.len(), bytes.len(), "{path}");
        if let Some(i) = out.iter().zip(&bytes).position(|(a, b)| a != b) {
            panic!("{path}: first difference at byte {i}");
        }
    }
}

#[test]
fn rewrites_vocab_files_identically_up_to_padding() {
    // Vocab-only files end right after the metadata (gguf-py's writer skips the tensor-info
    // padding when there are no tensors); ours pads to the alignment.
    for name in ["gpt-2", "llama-bpe", "llama-spm", "qwen2", "qwen35"] {
        let zst = format!("{ROOT}/tests/data/vocab/ggml-vocab-{name}.gguf.zst");
        let mut dec =
            ruzstd::decoding::StreamingDecoder::new(std::fs::File::open(zst).unwrap()).unwrap();
        let mut bytes = Vec::new();
        dec.read_to_end(&mut bytes).unwrap();
        let out = rewrite(&GgufFile::from_bytes(bytes.clone()).unwrap());
        assert_eq!(&out[..bytes.len()], &bytes[..], "{name}");
        assert!(out[bytes.len()..].iter().all(|&b| b == 0));
        assert!(
            out.len() - bytes.len() < 32 && out.len().is_multiple_of(32),
            "{name}"
        );
    }
}
