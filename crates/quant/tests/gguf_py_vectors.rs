//! Bit-exact agreement with gguf-py (the PyPI `gguf` package).
//!
//! The vectors in tests/data/quant/ were written by scripts/gen_quant_vectors.py from
//! `gguf.quants.dequantize` / `gguf.quants.quantize`; see that script for the file layout
//! and the pinned versions.

use gguf::GgmlType;
use quant::{dequantize_row, quantize_row};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/quant");

/// One vector file: (type, n_elements, quantized bytes, f32 values).
struct Vectors {
    ty: GgmlType,
    n_elements: usize,
    bytes: Vec<u8>,
    floats: Vec<f32>,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn load(file: &str, magic: &[u8; 4]) -> Vectors {
    let path = format!("{DATA}/{file}");
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(&raw[..4], magic, "{path}: bad magic");
    assert_eq!(u32_at(&raw, 4), 1, "{path}: version");
    let ty = GgmlType::from_id(u32_at(&raw, 8)).expect("known type id");
    let n_elements = u32_at(&raw, 12) as usize;
    let n_bytes = u32_at(&raw, 16) as usize;
    let body = &raw[20..];
    assert_eq!(body.len(), n_bytes + 4 * n_elements, "{path}: size");
    let (bytes, floats) = if magic == b"RLQV" {
        (&body[..n_bytes], &body[n_bytes..])
    } else {
        (&body[4 * n_elements..], &body[..4 * n_elements])
    };
    let floats = floats
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Vectors {
        ty,
        n_elements,
        bytes: bytes.to_vec(),
        floats,
    }
}

fn check_dequant(name: &str, ty: GgmlType) {
    let v = load(&format!("dequant_{name}.bin"), b"RLQV");
    assert_eq!(v.ty, ty);
    let mut out = vec![0f32; v.n_elements];
    dequantize_row(ty, &v.bytes, &mut out).unwrap();
    let block = ty.block_size();
    let mut n_bad = 0;
    for (i, (got, want)) in out.iter().zip(&v.floats).enumerate() {
        if got.to_bits() != want.to_bits() {
            if n_bad < 5 {
                let b = i / block;
                let bytes = &v.bytes[b * ty.type_size()..(b + 1) * ty.type_size()];
                eprintln!(
                    "{ty} element {i} (block {b}): got {got:e} want {want:e}; block {bytes:02x?}"
                );
            }
            n_bad += 1;
        }
    }
    assert_eq!(
        n_bad, 0,
        "{ty}: {n_bad} of {} elements differ from gguf-py",
        v.n_elements
    );
    // Many rows of one block each give the same values as one long row.
    let bs = ty.type_size();
    for (b, chunk) in v.bytes.chunks_exact(bs).enumerate().take(8) {
        let mut y = vec![0f32; block];
        dequantize_row(ty, chunk, &mut y).unwrap();
        assert_eq!(
            y.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
            v.floats[b * block..(b + 1) * block]
                .iter()
                .map(|f| f.to_bits())
                .collect::<Vec<_>>()
        );
    }
}

fn check_quant(name: &str, ty: GgmlType) {
    let v = load(&format!("quant_{name}.bin"), b"RLQQ");
    assert_eq!(v.ty, ty);
    let mut out = vec![0u8; v.bytes.len()];
    quantize_row(ty, &v.floats, &mut out).unwrap();
    let bs = ty.type_size();
    let n_blocks = v.bytes.len() / bs;
    let mut n_bad = 0;
    for b in 0..n_blocks {
        let (got, want) = (&out[b * bs..(b + 1) * bs], &v.bytes[b * bs..(b + 1) * bs]);
        if got != want {
            if n_bad < 5 {
                let n = ty.block_size();
                eprintln!(
                    "{ty} block {b}: got {got:02x?}\n want {want:02x?}\n input {:?}",
                    &v.floats[b * n..(b + 1) * n]
                );
            }
            n_bad += 1;
        }
    }
    assert_eq!(
        n_bad, 0,
        "{ty}: {n_bad} of {n_blocks} blocks differ from gguf-py"
    );
}

#[test]
fn dequantize_f32() {
    check_dequant("f32", GgmlType::F32);
}
#[test]
fn dequantize_f16() {
    check_dequant("f16", GgmlType::F16);
}
#[test]
fn dequantize_bf16() {
    check_dequant("bf16", GgmlType::BF16);
}
#[test]
fn dequantize_q4_0() {
    check_dequant("q4_0", GgmlType::Q4_0);
}
#[test]
fn dequantize_q4_1() {
    check_dequant("q4_1", GgmlType::Q4_1);
}
#[test]
fn dequantize_q5_0() {
    check_dequant("q5_0", GgmlType::Q5_0);
}
#[test]
fn dequantize_q5_1() {
    check_dequant("q5_1", GgmlType::Q5_1);
}
#[test]
fn dequantize_q8_0() {
    check_dequant("q8_0", GgmlType::Q8_0);
}
#[test]
fn dequantize_q2_k() {
    check_dequant("q2_k", GgmlType::Q2K);
}
#[test]
fn dequantize_q3_k() {
    check_dequant("q3_k", GgmlType::Q3K);
}
#[test]
fn dequantize_q4_k() {
    check_dequant("q4_k", GgmlType::Q4K);
}
#[test]
fn dequantize_q5_k() {
    check_dequant("q5_k", GgmlType::Q5K);
}
#[test]
fn dequantize_q6_k() {
    check_dequant("q6_k", GgmlType::Q6K);
}
#[test]
fn dequantize_iq4_nl() {
    check_dequant("iq4_nl", GgmlType::IQ4NL);
}
#[test]
fn dequantize_iq4_xs() {
    check_dequant("iq4_xs", GgmlType::IQ4XS);
}

#[test]
fn quantize_q4_0() {
    check_quant("q4_0", GgmlType::Q4_0);
}
#[test]
fn quantize_q4_1() {
    check_quant("q4_1", GgmlType::Q4_1);
}
#[test]
fn quantize_q5_0() {
    check_quant("q5_0", GgmlType::Q5_0);
}
#[test]
fn quantize_q5_1() {
    check_quant("q5_1", GgmlType::Q5_1);
}
#[test]
fn quantize_q8_0() {
    check_quant("q8_0", GgmlType::Q8_0);
}
#[test]
fn quantize_f16() {
    check_quant("f16", GgmlType::F16);
}
#[test]
fn quantize_bf16() {
    check_quant("bf16", GgmlType::BF16);
}
