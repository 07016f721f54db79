//! Arbitrary bytes into the GGUF reader: it must return an error or a file whose every
//! tensor and metadata value can be used, never panic, hang or allocate without bound.
//! A file that opens is also re-written with our writer: reading that back and writing it
//! again must give the same bytes.

#![no_main]

use gguf::{GgufFile, GgufWriter};
use libfuzzer_sys::fuzz_target;

fn rewrite(f: &GgufFile) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.set_metadata(k, v.clone());
    }
    for t in f.tensors() {
        w.add_tensor(&t.name, &t.dims, t.ty)
            .expect("a validated tensor is a valid declaration");
    }
    let mut out = Vec::new();
    w.write(&mut out, |i, _, dst| dst.write_all(f.tensor_data(&f.tensors()[i])))
        .expect("writing to memory cannot fail");
    out
}

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let mut sum = 0u64;
    for t in f.tensors() {
        let bytes = f.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.n_bytes);
        sum = bytes.iter().fold(sum, |s, &b| s.wrapping_add(b as u64));
        assert_eq!(f.tensor(&t.name), Some(t));
        assert!(t.n_rows() <= t.n_elements());
        assert!(f.data_offset() + t.offset + t.n_bytes <= data.len() as u64);
    }
    let m = f.metadata();
    for (k, _) in m.iter() {
        let _ = (m.get_str(k), m.get_u32(k), m.get_u64(k), m.get_i64(k), m.get_f32(k));
        let _ = (m.get_bool(k), m.get_str_array(k), m.get_f32_array(k), m.get_i32_array(k));
        let _ = m.get_u32_vec(k);
    }
    let _ = f.architecture();
    std::hint::black_box(sum);

    let once = rewrite(&f);
    let g = GgufFile::from_bytes(once.clone()).expect("our writer's output must read back");
    assert_eq!(g.tensors().len(), f.tensors().len());
    for (a, b) in f.tensors().iter().zip(g.tensors()) {
        assert_eq!((&a.name, &a.dims, a.ty), (&b.name, &b.dims, b.ty));
        assert_eq!(f.tensor_data(a), g.tensor_data(b));
    }
    assert_eq!(rewrite(&g), once);
});
