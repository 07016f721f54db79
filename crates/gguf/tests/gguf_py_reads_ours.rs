//! gguf-py (the reference reader) reads a file our writer made and sees the same keys, types,
//! values and tensor table. Skipped, with a note, where python3 has no `gguf` package
//! (`pip install gguf`).

use std::process::Command;

use gguf::{Array, GgmlType, GgufWriter, Value};
use serde_json::{json, Value as Json};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn gguf_py_available() -> bool {
    Command::new("python3")
        .args(["-c", "import gguf"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn gguf_py_reads_our_output() {
    if !gguf_py_available() {
        eprintln!("skipped: python3 with the gguf package is not installed (pip install gguf)");
        return;
    }
    // Values exactly representable in JSON and f32, so comparisons can be exact.
    let entries: Vec<(&str, Value, &str, Json)> = vec![
        (
            "general.architecture",
            Value::String("llama".into()),
            "string",
            json!("llama"),
        ),
        ("t.u8", Value::U8(250), "uint8", json!(250)),
        ("t.i8", Value::I8(-5), "int8", json!(-5)),
        ("t.u16", Value::U16(60000), "uint16", json!(60000)),
        ("t.i16", Value::I16(-30000), "int16", json!(-30000)),
        (
            "t.u32",
            Value::U32(4_000_000_000),
            "uint32",
            json!(4_000_000_000u32),
        ),
        (
            "t.i32",
            Value::I32(-2_000_000_000),
            "int32",
            json!(-2_000_000_000),
        ),
        ("t.u64", Value::U64(1 << 60), "uint64", json!(1u64 << 60)),
        (
            "t.i64",
            Value::I64(-(1 << 60)),
            "int64",
            json!(-(1i64 << 60)),
        ),
        ("t.f32", Value::F32(0.375), "float32", json!(0.375)),
        ("t.f64", Value::F64(-1.25e100), "float64", json!(-1.25e100)),
        ("t.bool", Value::Bool(false), "bool", json!(false)),
        (
            "t.str",
            Value::String("ünï ▁x".into()),
            "string",
            json!("ünï ▁x"),
        ),
        (
            "a.str",
            Value::Array(Array::String(vec!["a".into(), "ç".into()])),
            "array[string]",
            json!(["a", "ç"]),
        ),
        (
            "a.i32",
            Value::Array(Array::I32(vec![-1, 2])),
            "array[int32]",
            json!([-1, 2]),
        ),
        (
            "a.f32",
            Value::Array(Array::F32(vec![0.5, -2.0])),
            "array[float32]",
            json!([0.5, -2.0]),
        ),
        (
            "a.bool",
            Value::Array(Array::Bool(vec![true, false])),
            "array[bool]",
            json!([true, false]),
        ),
        (
            "a.u8",
            Value::Array(Array::U8(vec![1, 255])),
            "array[uint8]",
            json!([1, 255]),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v, _, _) in &entries {
        w.set_metadata(k, v.clone());
    }
    w.add_tensor("x.f32", &[5], GgmlType::F32).unwrap();
    w.add_tensor("y.q8_0", &[64, 3], GgmlType::Q8_0).unwrap();
    w.add_tensor("z.q4_k", &[256, 2], GgmlType::Q4K).unwrap();
    let path = std::env::temp_dir().join(format!("redline-gguf-py-{}.gguf", std::process::id()));
    let mut file = std::fs::File::create(&path).unwrap();
    w.write(&mut file, |i, t, dst| {
        dst.write_all(&vec![i as u8; t.n_bytes as usize])
    })
    .unwrap();
    drop(file);

    let out = Command::new("python3")
        .arg(format!("{ROOT}/scripts/gguf_reference_dump.py"))
        .arg("--check")
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Json = serde_json::from_slice(&out.stdout).unwrap();

    assert_eq!(got["version"], 3);
    let kv = got["metadata"].as_array().unwrap();
    assert_eq!(kv.len(), entries.len());
    for (g, (k, _, ty, value)) in kv.iter().zip(&entries) {
        assert_eq!(g["key"], *k);
        assert_eq!(g["type"], *ty, "{k}");
        assert_eq!(g["value"], *value, "{k}");
    }
    let tensors = got["tensors"].as_array().unwrap();
    let want = [
        ("x.f32", "f32", json!([5]), 0, 20),
        ("y.q8_0", "q8_0", json!([64, 3]), 32, 204),
        ("z.q4_k", "q4_k", json!([256, 2]), 256, 288),
    ];
    assert_eq!(tensors.len(), want.len());
    for (t, (name, ty, shape, offset, n_bytes)) in tensors.iter().zip(want) {
        assert_eq!(t["name"], name);
        assert_eq!(t["type"], ty);
        assert_eq!(t["shape"], shape);
        assert_eq!(t["offset"], offset);
        assert_eq!(t["n_bytes"], n_bytes);
    }
}
