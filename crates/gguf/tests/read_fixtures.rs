//! Opens every GGUF file shipped with the repository and checks what the reader returns.

use std::io::Read;
use std::path::{Path, PathBuf};

use gguf::{GgmlType, GgufFile};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");
const STORIES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/stories260K.gguf");

fn fixture_models() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for arch in std::fs::read_dir(Path::new(DATA).join("fixtures")).unwrap() {
        for f in std::fs::read_dir(arch.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_owned();
            if name.starts_with("model-") && name.ends_with(".gguf") {
                out.push(p);
            }
        }
    }
    out.sort();
    assert_eq!(out.len(), 8, "expected 4 architectures × {{f32, q8_0}}");
    out
}

fn vocab_bytes(name: &str) -> Vec<u8> {
    let f = std::fs::File::open(Path::new(DATA).join("vocab").join(name)).unwrap();
    let mut dec = ruzstd::decoding::StreamingDecoder::new(f).unwrap();
    let mut out = Vec::new();
    dec.read_to_end(&mut out).unwrap();
    out
}

/// Structural checks that hold for any valid file.
fn check_consistent(f: &GgufFile) {
    assert!(f.version() == 2 || f.version() == 3);
    assert_eq!(f.data_offset() % f.alignment(), 0);
    for t in f.tensors() {
        assert_eq!(f.tensor(&t.name), Some(t));
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
        assert_eq!(t.ty.bytes_for(t.n_elements()), Some(t.n_bytes));
        assert_eq!(t.offset % f.alignment(), 0);
    }
}

#[test]
fn opens_every_fixture_model() {
    for path in fixture_models() {
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        check_consistent(&f);
        let arch = f.architecture().expect("general.architecture");
        let dir_arch = path
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap();
        assert_eq!(arch, dir_arch, "{}", path.display());
        assert!(
            f.metadata()
                .get_u32(&format!("{arch}.block_count"))
                .unwrap()
                > 0
        );
        assert!(
            f.metadata()
                .get_str_array("tokenizer.ggml.tokens")
                .unwrap()
                .len()
                > 100
        );
        let emb = f.tensor("token_embd.weight").expect("token_embd.weight");
        assert_eq!(emb.dims.len(), 2);
        let n_embd = f
            .metadata()
            .get_u64(&format!("{arch}.embedding_length"))
            .unwrap();
        assert_eq!(emb.dims[0], n_embd);
        let is_q8 = path.to_str().unwrap().contains("q8_0");
        let want = if is_q8 { GgmlType::Q8_0 } else { GgmlType::F32 };
        assert!(
            f.tensors().iter().any(|t| t.ty == want),
            "{}",
            path.display()
        );
        // Norm weights stay f32 in both files.
        assert!(f
            .tensors()
            .iter()
            .filter(|t| t.dims.len() == 1)
            .all(|t| t.ty == GgmlType::F32));

        // from_bytes sees the same file.
        let g = GgufFile::from_bytes(std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(g.tensors(), f.tensors());
        assert_eq!(g.metadata(), f.metadata());
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t), g.tensor_data(t));
        }
    }
}

#[test]
fn opens_stories260k() {
    let f = GgufFile::open(STORIES).unwrap();
    check_consistent(&f);
    assert_eq!(f.architecture(), Some("llama"));
    let m = f.metadata();
    assert_eq!(m.get_u32("llama.embedding_length"), Some(64));
    assert_eq!(m.get_u32("llama.block_count"), Some(5));
    assert_eq!(m.get_str("tokenizer.ggml.model"), Some("llama"));
    assert_eq!(m.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 512);
    assert_eq!(m.get_f32_array("tokenizer.ggml.scores").unwrap().len(), 512);
    assert_eq!(
        m.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        512
    );
    assert_eq!(
        m.get_u32_vec("tokenizer.ggml.token_type").unwrap().len(),
        512
    );
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, vec![64, 512]);
    assert_eq!(emb.n_rows(), 512);
    assert_eq!(f.tensor_data(emb).len(), 64 * 512 * 4);
}

#[test]
fn opens_vocab_files() {
    for name in [
        "ggml-vocab-gpt-2.gguf.zst",
        "ggml-vocab-llama-bpe.gguf.zst",
        "ggml-vocab-llama-spm.gguf.zst",
        "ggml-vocab-qwen2.gguf.zst",
        "ggml-vocab-qwen35.gguf.zst",
    ] {
        let f = GgufFile::from_bytes(vocab_bytes(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_consistent(&f);
        let toks = f.metadata().get_str_array("tokenizer.ggml.tokens").unwrap();
        assert!(toks.len() > 1000, "{name}");
    }
}

#[test]
fn file_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<GgufFile>();
    assert_send_sync::<gguf::GgufWriter>();
}

#[test]
fn fuzz_seeds_read_as_expected() {
    let seeds = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/gguf_reader");
    // Written by gguf-py.
    let f = GgufFile::open(format!("{seeds}/tiny-gguf-py.gguf")).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(f.metadata().get_str_array("t.strs").unwrap(), ["a", "bc"]);
    // Hand-packed: every value type, nested arrays, general.alignment = 64.
    let f = GgufFile::open(format!("{seeds}/every-type-align64.gguf")).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert_eq!(
        f.metadata().get_array("t.nested"),
        Some(&gguf::Array::Array(vec![
            gguf::Array::U16(vec![1, 2]),
            gguf::Array::String(vec!["x".into()]),
            gguf::Array::Array(vec![gguf::Array::Bool(vec![true])]),
        ]))
    );
    // Offsets: a.f32 16 B at 0, b.q8_0 68 B at 64, c.f16 12 B at 192, d.q4_K at 256.
    let q4k = f.tensor("d.q4_K").unwrap();
    assert_eq!((q4k.ty, q4k.offset, q4k.n_bytes), (GgmlType::Q4K, 256, 144));
    // Headers without their data.
    for name in ["stories260K-header.gguf", "llama-q8_0-header.gguf"] {
        let e = GgufFile::open(format!("{seeds}/{name}")).unwrap_err();
        assert!(
            matches!(e, gguf::GgufError::TensorOutOfBounds { .. }),
            "{name}: {e}"
        );
    }
}
