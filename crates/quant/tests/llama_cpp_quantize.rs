//! Byte-exact agreement with llama.cpp's own quantizers (ggml/src/ggml-quants.c) for the
//! K-quants, IQ4_NL / IQ4_XS, and the importance-weighted (imatrix) paths.
//!
//! The vectors in tests/data/quant/kquant_*.bin were written by
//! scripts/gen_kquant_vectors.py, which runs ggml's `quantize_<type>` through
//! scripts/kquant_oracle.c (built without fused multiply-add); see it for the layout.

use gguf::GgmlType;
use quant::{dequantize_row, quantize_row_with_imatrix};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/quant");

struct Case {
    ty: GgmlType,
    n_rows: usize,
    n_per_row: usize,
    src: Vec<f32>,
    imatrix: Option<Vec<f32>>,
    expected: Vec<u8>,
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn load(file: &str) -> Case {
    let path = format!("{DATA}/{file}");
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(&raw[..4], b"RLQK");
    let h: Vec<u32> = raw[4..24]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(h[0], 1, "version");
    let ty = GgmlType::from_id(h[1]).unwrap();
    let (n_rows, n_per_row, has_imatrix) = (h[2] as usize, h[3] as usize, h[4] != 0);
    let mut off = 24;
    let n = n_rows * n_per_row;
    let src = f32s(&raw[off..off + 4 * n]);
    off += 4 * n;
    let imatrix = has_imatrix.then(|| {
        let v = f32s(&raw[off..off + 4 * n_per_row]);
        off += 4 * n_per_row;
        v
    });
    let expected = raw[off..].to_vec();
    assert_eq!(
        expected.len(),
        n_rows * ty.bytes_for(n_per_row as u64).unwrap() as usize
    );
    Case {
        ty,
        n_rows,
        n_per_row,
        src,
        imatrix,
        expected,
    }
}

fn check(file: &str, ty: GgmlType) {
    let c = load(file);
    assert_eq!(c.ty, ty);
    let row_bytes = c.expected.len() / c.n_rows;
    let bs = ty.type_size();
    let mut n_bad = 0;
    for r in 0..c.n_rows {
        let x = &c.src[r * c.n_per_row..(r + 1) * c.n_per_row];
        let mut out = vec![0u8; row_bytes];
        quantize_row_with_imatrix(ty, x, &mut out, c.imatrix.as_deref()).unwrap();
        let want = &c.expected[r * row_bytes..(r + 1) * row_bytes];
        for (b, (g, w)) in out.chunks_exact(bs).zip(want.chunks_exact(bs)).enumerate() {
            if g != w {
                if n_bad < 3 {
                    eprintln!("{file} row {r} block {b}:\n got  {g:02x?}\n want {w:02x?}");
                }
                n_bad += 1;
            }
        }
    }
    assert_eq!(n_bad, 0, "{file}: {n_bad} blocks differ from llama.cpp");
}

macro_rules! cases {
    ($($name:ident: $file:literal => $ty:expr;)*) => {
        $(#[test] fn $name() { check($file, $ty); })*
    };
}

cases! {
    q2_k: "kquant_q2_k.bin" => GgmlType::Q2K;
    q3_k: "kquant_q3_k.bin" => GgmlType::Q3K;
    q4_k: "kquant_q4_k.bin" => GgmlType::Q4K;
    q5_k: "kquant_q5_k.bin" => GgmlType::Q5K;
    q6_k: "kquant_q6_k.bin" => GgmlType::Q6K;
    iq4_nl: "kquant_iq4_nl.bin" => GgmlType::IQ4NL;
    iq4_xs: "kquant_iq4_xs.bin" => GgmlType::IQ4XS;
    q4_0_imatrix: "kquant_q4_0_imatrix.bin" => GgmlType::Q4_0;
    q4_1_imatrix: "kquant_q4_1_imatrix.bin" => GgmlType::Q4_1;
    q5_0_imatrix: "kquant_q5_0_imatrix.bin" => GgmlType::Q5_0;
    q5_1_imatrix: "kquant_q5_1_imatrix.bin" => GgmlType::Q5_1;
    q2_k_imatrix: "kquant_q2_k_imatrix.bin" => GgmlType::Q2K;
    q3_k_imatrix: "kquant_q3_k_imatrix.bin" => GgmlType::Q3K;
    q4_k_imatrix: "kquant_q4_k_imatrix.bin" => GgmlType::Q4K;
    q5_k_imatrix: "kquant_q5_k_imatrix.bin" => GgmlType::Q5K;
    q6_k_imatrix: "kquant_q6_k_imatrix.bin" => GgmlType::Q6K;
    iq4_nl_imatrix: "kquant_iq4_nl_imatrix.bin" => GgmlType::IQ4NL;
    iq4_xs_imatrix: "kquant_iq4_xs_imatrix.bin" => GgmlType::IQ4XS;
}

/// The dequantized llama.cpp output is finite (guards the vectors themselves).
#[test]
fn vectors_dequantize_finite() {
    for name in ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"] {
        let c = load(&format!("kquant_{name}.bin"));
        let mut y = vec![0f32; c.src.len()];
        dequantize_row(c.ty, &c.expected, &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "{name}");
    }
}
