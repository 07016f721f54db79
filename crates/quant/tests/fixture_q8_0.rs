//! End to end against a real converter: the fixture `model-q8_0.gguf` files were written by
//! llama.cpp's convert_hf_to_gguf.py (`--outtype q8_0`, gguf-py's quantizer) from the same
//! weights as `model-f32.gguf`. Quantizing each F32 tensor with `quantize_row` must give
//! the stored Q8_0 bytes, and dequantizing every tensor must succeed.

use gguf::{GgmlType, GgufFile};
use quant::{dequantize_row, quantize_rows};

fn fixture(arch: &str, file: &str) -> GgufFile {
    let path = format!(
        "{}/../../tests/data/fixtures/{arch}/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn q8_0_fixtures_match_converter_bytes() {
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        let f32_file = fixture(arch, "model-f32.gguf");
        let q8_file = fixture(arch, "model-q8_0.gguf");
        let mut n_q8 = 0;
        for t in q8_file.tensors() {
            let n = t.n_elements() as usize;
            let mut y = vec![0f32; n];
            dequantize_row(t.ty, q8_file.tensor_data(t), &mut y)
                .unwrap_or_else(|e| panic!("{arch} {}: {e}", t.name));
            if t.ty != GgmlType::Q8_0 {
                continue;
            }
            let src = f32_file
                .tensor(&t.name)
                .expect("same tensor in the f32 file");
            assert_eq!(src.ty, GgmlType::F32, "{arch} {}", t.name);
            assert_eq!(src.dims, t.dims);
            let x = f32s(f32_file.tensor_data(src));
            let mut q = vec![0u8; t.n_bytes as usize];
            quantize_rows(GgmlType::Q8_0, &x, t.dims[0] as usize, &mut q, None).unwrap();
            assert!(
                q == q8_file.tensor_data(t),
                "{arch} {}: bytes differ",
                t.name
            );
            n_q8 += 1;
        }
        assert!(n_q8 > 0, "{arch}: no Q8_0 tensors");
        eprintln!("{arch}: {n_q8} Q8_0 tensors byte-identical");
    }
}
