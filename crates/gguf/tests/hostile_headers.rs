//! Hand-built broken and hostile files: each must be rejected with the error naming the
//! problem, never a panic or a huge allocation. Also truncations of real files.

use gguf::{Array, GgmlType, GgufError, GgufFile, Value};

const STORIES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/stories260K.gguf");
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/fixtures");

/// Raw little-endian byte builder, independent of our writer.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    /// Magic, version, tensor count, metadata count.
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.0.extend_from_slice(b"GGUF");
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u8(&mut self, v: u8) -> &mut Raw {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut Raw {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor info entry.
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Raw {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    fn data(&mut self, align: usize, n: usize) -> &mut Raw {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0xAB, n));
        self
    }
    fn open(&self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0.clone())
    }
}

fn err(r: &Raw) -> GgufError {
    match r.open() {
        Ok(_) => panic!("hostile file was accepted"),
        Err(e) => e,
    }
}

#[test]
fn every_value_type_parses() {
    let mut r = Raw::header(3, 0, 16);
    r.str("u8").u32(0).u8(200);
    r.str("i8").u32(1).u8(0xFE);
    r.str("u16")
        .u32(2)
        .0
        .extend_from_slice(&65000u16.to_le_bytes());
    r.str("i16")
        .u32(3)
        .0
        .extend_from_slice(&(-300i16).to_le_bytes());
    r.str("u32").u32(4).u32(4_000_000_000);
    r.str("i32").u32(5).u32((-7i32) as u32);
    r.str("f32")
        .u32(6)
        .0
        .extend_from_slice(&1.5f32.to_le_bytes());
    r.str("bool").u32(7).u8(1);
    r.str("string").u32(8).str("héllo");
    r.str("u64").u32(10).u64(u64::MAX);
    r.str("i64").u32(11).u64((-9i64) as u64);
    r.str("f64")
        .u32(12)
        .0
        .extend_from_slice(&(-2.25f64).to_le_bytes());
    r.str("arr_i32")
        .u32(9)
        .u32(5)
        .u64(3)
        .u32(1)
        .u32(2)
        .u32(u32::MAX);
    r.str("arr_str").u32(9).u32(8).u64(2).str("a").str("");
    r.str("arr_bool").u32(9).u32(7).u64(2).u8(0).u8(1);
    // [[1u8, 2u8], ["x"], []] — nested arrays of different element types.
    r.str("nested").u32(9).u32(9).u64(3);
    r.u32(0).u64(2).u8(1).u8(2);
    r.u32(8).u64(1).str("x");
    r.u32(6).u64(0);
    let f = r.open().unwrap();
    let m = f.metadata();
    assert_eq!(m.get("u8"), Some(&Value::U8(200)));
    assert_eq!(m.get("i8"), Some(&Value::I8(-2)));
    assert_eq!(m.get("u16"), Some(&Value::U16(65000)));
    assert_eq!(m.get("i16"), Some(&Value::I16(-300)));
    assert_eq!(m.get("u32"), Some(&Value::U32(4_000_000_000)));
    assert_eq!(m.get("i32"), Some(&Value::I32(-7)));
    assert_eq!(m.get("f32"), Some(&Value::F32(1.5)));
    assert_eq!(m.get("bool"), Some(&Value::Bool(true)));
    assert_eq!(m.get_str("string"), Some("héllo"));
    assert_eq!(m.get("u64"), Some(&Value::U64(u64::MAX)));
    assert_eq!(m.get("i64"), Some(&Value::I64(-9)));
    assert_eq!(m.get("f64"), Some(&Value::F64(-2.25)));
    assert_eq!(m.get_array("arr_i32"), Some(&Array::I32(vec![1, 2, -1])));
    assert_eq!(m.get_str_array("arr_str").unwrap(), ["a", ""]);
    assert_eq!(
        m.get_array("arr_bool"),
        Some(&Array::Bool(vec![false, true]))
    );
    assert_eq!(
        m.get_array("nested"),
        Some(&Array::Array(vec![
            Array::U8(vec![1, 2]),
            Array::String(vec!["x".into()]),
            Array::F32(vec![]),
        ]))
    );
    // Typed accessors convert between integer widths only when the value fits.
    assert_eq!(m.get_u32("u8"), Some(200));
    assert_eq!(m.get_u32("i8"), None);
    assert_eq!(m.get_i64("i8"), Some(-2));
    assert_eq!(m.get_u32("u64"), None);
    assert_eq!(m.get_u64("u64"), Some(u64::MAX));
    assert_eq!(m.get_f32("f64"), Some(-2.25));
    assert_eq!(m.get_u32_vec("u16"), Some(vec![65000]));
    assert_eq!(m.get_u32_vec("arr_i32"), None); // -1 does not fit
    assert_eq!(m.get_str("u8"), None);
    let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
    assert_eq!(keys[..3], ["u8", "i8", "u16"]);
    assert_eq!(keys.last(), Some(&"nested"));
}

#[test]
fn rejects_bad_magic_and_versions() {
    let mut r = Raw::header(3, 0, 0);
    r.0[..4].copy_from_slice(b"GGML");
    assert!(matches!(err(&r), GgufError::BadMagic { .. }));
    let e = err(&Raw::header(1, 0, 0));
    assert!(matches!(e, GgufError::UnsupportedVersion(1)));
    assert!(e.to_string().contains("version 1"));
    assert!(matches!(
        err(&Raw::header(4, 0, 0)),
        GgufError::UnsupportedVersion(4)
    ));
    assert!(matches!(
        err(&Raw::header(0, 0, 0)),
        GgufError::UnsupportedVersion(0)
    ));
    assert!(Raw::header(2, 0, 0).open().is_ok());
    assert!(Raw::header(3, 0, 0).open().is_ok());
}

#[test]
fn detects_big_endian() {
    // gguf-py with endianess=BIG writes the magic as "GGUF" and the version byte-swapped.
    let e = err(&Raw::header(3u32.swap_bytes(), 0u64.swap_bytes(), 0));
    assert!(matches!(e, GgufError::BigEndian { .. }), "{e}");
    assert!(e.to_string().contains("big-endian"));
    let mut r = Raw::header(3, 0, 0);
    r.0[..4].copy_from_slice(b"FUGG");
    assert!(matches!(err(&r), GgufError::BigEndian { .. }));
}

#[test]
fn rejects_truncated_tiny_files() {
    for n in 0..24 {
        let r = Raw(Raw::header(3, 0, 0).0[..n].to_vec());
        assert!(matches!(err(&r), GgufError::Truncated { .. }), "len {n}");
    }
}

#[test]
fn hostile_counts_do_not_allocate() {
    let huge = 1u64 << 60;
    assert!(matches!(
        err(&Raw::header(3, 0, huge)),
        GgufError::CountTooLarge { .. }
    ));
    assert!(matches!(
        err(&Raw::header(3, huge, 0)),
        GgufError::CountTooLarge { .. }
    ));
    assert!(matches!(
        err(&Raw::header(3, u64::MAX, u64::MAX)),
        GgufError::CountTooLarge { .. }
    ));
    // String of length 2^60.
    let mut r = Raw::header(3, 0, 1);
    r.u64(huge).0.extend_from_slice(&[b'a'; 32]);
    assert!(matches!(err(&r), GgufError::Truncated { .. }));
    // Arrays of 2^60 elements of each type, including strings and nested arrays.
    for elem_ty in 0..=12u32 {
        let mut r = Raw::header(3, 0, 1);
        r.str("k").u32(9).u32(elem_ty).u64(huge).u64(0).u64(0);
        let e = err(&r);
        assert!(
            matches!(e, GgufError::CountTooLarge { .. }),
            "type {elem_ty}: {e}"
        );
        assert!(e.to_string().contains("\"k\""), "{e}");
    }
    // A count that fits the bytes left for 1-byte elements but overflows when multiplied.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(10).u64(u64::MAX / 4);
    assert!(matches!(err(&r), GgufError::CountTooLarge { .. }));
}

#[test]
fn rejects_bad_values() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    let e = err(&r);
    assert!(
        matches!(e, GgufError::UnknownValueType { type_id: 13, .. }),
        "{e}"
    );
    // Unknown element type inside an array.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(99).u64(0);
    assert!(matches!(
        err(&r),
        GgufError::UnknownValueType { type_id: 99, .. }
    ));
    // Invalid UTF-8 in a key and in a value.
    let mut r = Raw::header(3, 0, 1);
    r.u64(2).0.extend_from_slice(&[0xFF, 0xFE]);
    r.u32(4).u32(0);
    assert!(matches!(err(&r), GgufError::InvalidUtf8 { .. }));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1).u8(0xC0);
    assert!(matches!(err(&r), GgufError::InvalidUtf8 { .. }));
    // Duplicate key.
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("a.b", 1).kv_u32("a.b", 2);
    let e = err(&r);
    assert!(
        matches!(&e, GgufError::DuplicateKey { key, .. } if key == "a.b"),
        "{e}"
    );
}

#[test]
fn bounds_array_nesting() {
    let nest = |depth: usize| {
        let mut r = Raw::header(3, 0, 1);
        r.str("deep").u32(9);
        for _ in 0..depth - 1 {
            r.u32(9).u64(1);
        }
        r.u32(0).u64(0);
        r
    };
    assert!(nest(gguf::MAX_ARRAY_DEPTH).open().is_ok());
    assert!(matches!(
        err(&nest(gguf::MAX_ARRAY_DEPTH + 1)),
        GgufError::ArrayTooDeep { .. }
    ));
    assert!(matches!(
        err(&nest(100_000)),
        GgufError::ArrayTooDeep { .. }
    ));
}

#[test]
fn honours_and_checks_alignment() {
    // general.alignment = 64: data section and offsets must be multiples of 64.
    let mut r = Raw::header(3, 2, 1);
    r.kv_u32("general.alignment", 64);
    r.tensor("a", &[4], 0, 0)
        .tensor("b", &[4], 0, 64)
        .data(64, 128);
    let f = r.open().unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()), [0xAB; 16]);
    // Offset 32 is fine at the default alignment but not at 64.
    let mut r = Raw::header(3, 1, 1);
    r.kv_u32("general.alignment", 64);
    r.tensor("a", &[4], 0, 32).data(64, 64);
    let e = err(&r);
    assert!(
        matches!(&e, GgufError::MisalignedTensor { name, offset: 32, alignment: 64 } if name == "a"),
        "{e}"
    );
    for bad in [0, 3, 48] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", bad);
        assert!(matches!(err(&r), GgufError::BadAlignment(a) if a == bad as u64));
    }
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    assert!(matches!(err(&r), GgufError::WrongValueType { .. }));
}

/// One f32 tensor of shape `dims` with a valid layout, for tweaking one field at a time.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data: usize) -> Raw {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("blk.0.w", dims, ty, offset).data(32, data);
    r
}

#[test]
fn rejects_bad_tensor_infos() {
    assert!(one_tensor(&[8, 2], 0, 0, 64).open().is_ok());
    let e = err(&one_tensor(&[1, 1, 1, 1, 1], 0, 0, 64));
    assert!(matches!(&e, GgufError::TooManyDims { name, n_dims: 5, .. } if name == "blk.0.w"));
    let e = err(&one_tensor(&[8, 0], 0, 0, 64));
    assert!(
        matches!(
            e,
            GgufError::BadDim {
                index: 1,
                value: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = err(&one_tensor(&[8, 1 << 63], 0, 0, 64));
    assert!(matches!(e, GgufError::BadDim { index: 1, .. }), "{e}");
    // Each dim fits in i64 but the product does not: 2^32 * 2^32 wraps to 0 in u64.
    let e = err(&one_tensor(&[1 << 32, 1 << 32], 0, 0, 64));
    assert!(matches!(e, GgufError::ElementCountOverflow { .. }), "{e}");
    let e = err(&one_tensor(&[1 << 31, 1 << 31, 2], 0, 0, 64));
    assert!(matches!(e, GgufError::ElementCountOverflow { .. }), "{e}");
    // Element count fits, bytes do not: (2^62 f64 elements × 8 bytes).
    let e = err(&one_tensor(&[1 << 62], 28, 0, 64));
    assert!(matches!(e, GgufError::ElementCountOverflow { .. }), "{e}");
    for unknown in [4, 5, 31, 1000, u32::MAX] {
        let e = err(&one_tensor(&[8], unknown, 0, 64));
        assert!(matches!(e, GgufError::UnknownTensorType { type_id, .. } if type_id == unknown));
    }
    // q8_0 rows of 33 elements are not whole blocks, even with 32 rows (1056 = 33 blocks).
    let e = err(&one_tensor(&[33, 32], GgmlType::Q8_0 as u32, 0, 2048));
    assert!(
        matches!(
            e,
            GgufError::NotBlockAligned {
                ty: GgmlType::Q8_0,
                row_len: 33,
                ..
            }
        ),
        "{e}"
    );
    let e = err(&one_tensor(&[8], 0, 16, 64));
    assert!(
        matches!(e, GgufError::MisalignedTensor { offset: 16, .. }),
        "{e}"
    );
}

#[test]
fn rejects_tensor_data_outside_file() {
    // 16 f32 = 64 bytes, only 63 present.
    let e = err(&one_tensor(&[16], 0, 0, 63));
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { name, .. } if name == "blk.0.w"),
        "{e}"
    );
    // An offset so large that data_offset + offset overflows.
    let e = err(&one_tensor(&[8], 0, u64::MAX - 31, 64));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    let e = err(&one_tensor(&[8], 0, 1 << 40, 64));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
}

#[test]
fn rejects_duplicate_and_overlapping_tensors() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .data(32, 64);
    let e = err(&r);
    assert!(
        matches!(&e, GgufError::DuplicateTensor { name, index: 1 } if name == "w"),
        "{e}"
    );
    // b starts inside a (a covers [0, 64)).
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .data(32, 128);
    let e = err(&r);
    assert!(matches!(e, GgufError::OverlappingTensors { .. }), "{e}");
    // Same, listed in the other order.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("b", &[8], 0, 32)
        .tensor("a", &[16], 0, 0)
        .data(32, 128);
    assert!(matches!(err(&r), GgufError::OverlappingTensors { .. }));
    // Touching is fine, and file order need not be offset order.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("b", &[8], 0, 64)
        .tensor("a", &[16], 0, 0)
        .data(32, 96);
    let f = r.open().unwrap();
    assert_eq!(f.tensors()[0].name, "b");
}

/// Truncates `bytes` at every offset in the header region and at a sample of offsets in the
/// data region: every cut that loses tensor data must fail cleanly.
fn check_truncations(bytes: &[u8], label: &str) {
    let f = GgufFile::from_bytes(bytes.to_vec()).unwrap();
    let data_end = f
        .tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.n_bytes)
        .max()
        .unwrap();
    let header_end = f.data_offset() as usize;
    let step = ((data_end as usize - header_end) / 500).max(1);
    let cuts = (0..header_end).chain((header_end..data_end as usize).step_by(step));
    for cut in cuts.chain([data_end as usize - 1]) {
        if GgufFile::from_bytes(bytes[..cut].to_vec()).is_ok() {
            panic!(
                "{label}: truncated at {cut} of {} was accepted",
                bytes.len()
            );
        }
    }
    // Cutting only trailing padding after the last tensor leaves a valid file.
    assert!(GgufFile::from_bytes(bytes[..data_end as usize].to_vec()).is_ok());
}

#[test]
fn truncated_real_files_fail_cleanly() {
    check_truncations(&std::fs::read(STORIES).unwrap(), "stories260K");
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        let p = format!("{FIXTURES}/{arch}/model-q8_0.gguf");
        check_truncations(&std::fs::read(&p).unwrap(), &p);
    }
}

#[test]
fn corrupted_real_header_bytes_never_panic() {
    // Flip every byte of stories260K's header, one at a time, to a few values: any result is
    // fine as long as it is not a panic, and a file that opens still has consistent tensors.
    let bytes = std::fs::read(STORIES).unwrap();
    let header_end = GgufFile::from_bytes(bytes.clone()).unwrap().data_offset() as usize;
    let mut b = bytes.clone();
    for i in (0..header_end).step_by(3) {
        for v in [0x00, 0xFF, 0x7F, b[i] ^ 0x10] {
            let old = b[i];
            b[i] = v;
            if let Ok(f) = GgufFile::from_bytes(b.clone()) {
                for t in f.tensors() {
                    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
                }
            }
            b[i] = old;
        }
    }
}

#[test]
fn a_directory_is_a_clear_error() {
    let dir = std::env::temp_dir();
    let msg = match GgufFile::open(&dir) {
        Ok(_) => panic!("a directory must not open"),
        Err(e) => e.to_string(),
    };
    assert!(msg.contains("is a directory"), "{msg}");
}
