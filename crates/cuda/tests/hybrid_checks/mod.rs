//! Checks shared by the hybrid-backend tests: `tests/hybrid_cpu.rs` runs them with a second
//! `CpuBackend` standing in for the GPU (the placement and crossing logic, in CI without a
//! GPU), `tests/hybrid_gpu.rs` with the real `CudaBackend`.
//!
//! A model check loads one GGUF twice, on the plain CPU backend and on `Hybrid` with a given
//! placement, and asserts: every prompt position's logits within `tol` relative L2 of the CPU
//! run, the same greedy tokens, and per forward pass exactly `placement.boundaries()`
//! activation crossings, each carrying one hidden state (`n_embd` f32 per row), plus one
//! logits download when the output layer is on the GPU.

#![allow(dead_code)] // each test binary uses a subset

use std::path::PathBuf;
use std::sync::Arc;

use backend::conformance;
use backend::cpu::CpuBackend;
use backend::Backend;
use cuda::hybrid::{Hybrid, Placement, Transfers};
use gguf::{GgufFile, GgufWriter};
use model::{KvType, LoadOptions, ModelOn};

pub fn data(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data")).join(path)
}

pub fn fixture(arch: &str, file: &str) -> PathBuf {
    data("fixtures").join(arch).join(file)
}

#[path = "../../../../tests/support/fixture_reference.rs"]
mod fixture_reference;
pub use fixture_reference::{argmax, reference, rel_l2};

pub const FIXTURE_ARCHS: [&str; 4] = ["llama", "qwen2", "qwen3", "qwen35"];

pub fn open(path: &PathBuf) -> Arc<GgufFile> {
    Arc::new(GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

pub fn stories260k() -> Arc<GgufFile> {
    open(&data("../../models/stories260K.gguf"))
}

/// The prompt stories260K tests use elsewhere (BOS + "Once upon a time").
pub const STORIES_PROMPT: [u32; 6] = [1, 432, 383, 286, 261, 376];

/// A copy of `file` without `output.weight`: the head is then tied to `token_embd` (a
/// different model, but the CPU and the hybrid run must still agree).
pub fn without_output(file: &GgufFile) -> Arc<GgufFile> {
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        w.set_metadata(k, v.clone());
    }
    let kept: Vec<_> = file
        .tensors()
        .iter()
        .filter(|t| t.name != "output.weight")
        .collect();
    for t in &kept {
        w.add_tensor(&t.name, &t.dims, t.ty).unwrap();
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |i, _, out| {
        out.write_all(file.tensor_data(kept[i]))
    })
    .unwrap();
    Arc::new(GgufFile::from_bytes(bytes).unwrap())
}

/// The placements every model is checked with, for `n_layer` repeating layers: nothing
/// offloaded, the head only, the last half + head, everything (llama.cpp `-ngl`), and the
/// first half on the GPU with the head on the CPU (two boundaries).
pub fn placements(n_layer: usize) -> Vec<Placement> {
    vec![
        Placement::from_ngl(n_layer, 0),
        Placement::from_ngl(n_layer, 1),
        Placement::from_ngl(n_layer, n_layer / 2 + 1),
        Placement::from_ngl(n_layer, n_layer + 1),
        Placement::new(n_layer, 0..n_layer.div_ceil(2), false),
    ]
}

fn opts() -> LoadOptions {
    LoadOptions {
        n_threads: 2,
        ubatch_size: 512,
    }
}

/// The transfer counts one forward pass of `n_rows` output rows must show.
fn assert_one_pass<G: Backend>(
    what: &str,
    m: &ModelOn<Hybrid<CpuBackend, G>>,
    t: &Transfers,
    n_rows: usize,
) {
    let p = m.backend().placement();
    let n_embd = m.config().n_embd as u64;
    assert_eq!(
        t.crossings(),
        p.boundaries() as u64,
        "{what} [{p}]: crossings {t:?}"
    );
    assert_eq!(
        t.gpu_downloads,
        u64::from(p.output_on_gpu()),
        "{what} [{p}]: logits downloads {t:?}"
    );
    // Each crossing carries one hidden state per row (every row is an output row here).
    assert_eq!(
        t.bytes,
        t.crossings() * n_rows as u64 * n_embd * 4,
        "{what} [{p}]: bytes crossed in {} crossings of {n_rows}×{n_embd} f32",
        t.crossings()
    );
}

/// Loads `file` on the CPU and on `Hybrid(cpu, gpu, placement)`, runs `prompt` with every
/// position's logits and `n_decode` greedy steps on both, and asserts agreement and the
/// crossing counts. Returns a one-line summary.
pub fn check_model<G: Backend>(
    what: &str,
    file: Arc<GgufFile>,
    prompt: &[u32],
    n_decode: usize,
    placement: Placement,
    gpu: G,
    tol: f64,
) -> String {
    let cpu = ModelOn::load_on(CpuBackend::new(2).unwrap(), file.clone(), &opts()).unwrap();
    let hybrid = Hybrid::new(CpuBackend::new(2).unwrap(), gpu, placement.clone());
    let hy = ModelOn::load_on(hybrid, file, &opts()).unwrap();
    assert_eq!(hy.backend().placement().n_layer(), cpu.config().n_layer);
    let n_vocab = cpu.config().n_vocab;
    let mut sc = cpu.new_state(64, KvType::F32).unwrap();
    let mut sh = hy.new_state(64, KvType::F32).unwrap();
    assert_eq!(sc.bytes(), sh.bytes(), "{what}: state bytes");

    let lc = cpu.forward(&mut sc, prompt, true).unwrap();
    let t0 = hy.backend().transfers();
    let lh = hy.forward(&mut sh, prompt, true).unwrap();
    assert_one_pass(
        &format!("{what} prefill"),
        &hy,
        &hy.backend().transfers().since(&t0),
        prompt.len(),
    );
    assert_eq!(lc.len(), lh.len());
    let mut worst = 0.0f64;
    for p in 0..prompt.len() {
        let want: Vec<f64> = lc[p * n_vocab..(p + 1) * n_vocab]
            .iter()
            .map(|&x| x as f64)
            .collect();
        let e = rel_l2(&lh[p * n_vocab..(p + 1) * n_vocab], &want);
        worst = worst.max(e);
        assert!(
            e <= tol,
            "{what} [{placement}]: position {p}: relative L2 {e:.3e} > {tol:.0e} vs CPU"
        );
    }

    let last = (prompt.len() - 1) * n_vocab;
    let (mut nc, mut nh) = (argmax(&lc[last..]), argmax(&lh[last..]));
    let (mut tc, mut th) = (vec![nc], vec![nh]);
    for _ in 0..n_decode {
        nc = argmax(&cpu.forward(&mut sc, &[nc], false).unwrap());
        let t0 = hy.backend().transfers();
        let l = hy.forward(&mut sh, &[nh], false).unwrap();
        assert_one_pass(
            &format!("{what} decode"),
            &hy,
            &hy.backend().transfers().since(&t0),
            1,
        );
        nh = argmax(&l);
        tc.push(nc);
        th.push(nh);
    }
    assert_eq!(th, tc, "{what} [{placement}]: greedy tokens vs CPU");
    format!(
        "{what} [{placement}]: worst rel L2 {worst:.2e}, {} greedy tokens equal, {} crossings/token",
        th.len(),
        placement.boundaries()
    )
}

/// Every fixture model and stories260K (also with a tied head) under every placement.
pub fn check_all_models<G: Backend>(make_gpu: impl Fn() -> G, tol: f64) {
    for arch in FIXTURE_ARCHS {
        let r = reference(arch);
        let file = open(&fixture(arch, "model-f32.gguf"));
        let n_layer = cuda::hybrid::placement::n_layer_of(&file).unwrap();
        for p in placements(n_layer) {
            let n_decode = r.greedy_ids.len().saturating_sub(1);
            let s = check_model(
                arch,
                file.clone(),
                &r.prompt_ids,
                n_decode,
                p,
                make_gpu(),
                tol,
            );
            println!("{s}");
        }
    }
    let stories = stories260k();
    let tied = without_output(&stories);
    let n_layer = cuda::hybrid::placement::n_layer_of(&stories).unwrap();
    for p in placements(n_layer) {
        let s = check_model(
            "stories260K",
            stories.clone(),
            &STORIES_PROMPT,
            24,
            p.clone(),
            make_gpu(),
            tol,
        );
        println!("{s}");
        let s = check_model(
            "stories260K tied",
            tied.clone(),
            &STORIES_PROMPT,
            24,
            p,
            make_gpu(),
            tol,
        );
        println!("{s}");
    }
}

/// The conformance suite with nothing and everything offloaded (its weights are not layer
/// tensors: they follow the output layer). With everything offloaded the suite's
/// host-uploaded inputs must have crossed to the GPU.
pub fn check_conformance<G: Backend>(make_gpu: impl Fn() -> G) {
    for p in [Placement::all_cpu(4), Placement::all_gpu(4)] {
        let b = Hybrid::new(CpuBackend::new(2).unwrap(), make_gpu(), p.clone());
        conformance::run_all(&b).unwrap_or_else(|e| panic!("[{p}]: {e}"));
        let t = b.transfers();
        if p.output_on_gpu() {
            assert!(t.to_gpu > 0, "[{p}]: nothing ran on the GPU: {t:?}");
        } else {
            assert_eq!(t.crossings(), 0, "[{p}]: {t:?}");
        }
        println!("conformance [{p}]: ok, {t:?}");
    }
}
