//! The layer-split backend (`cuda::multi`): a model cut into consecutive runs of layers over
//! several cards must give the logits and greedy tokens of one card, with exactly one
//! hidden-state crossing per card boundary per forward pass.
//!
//! - CPU stand-ins (always run, CI): `Multi<CpuBackend>` with 2 and 3 cards against the plain
//!   CPU backend on every fixture model and stories260K (also with a tied head), and the
//!   backend conformance suite.
//! - One GPU as two *logical* cards (two `CudaBackend`s on device 0, each with its own stream,
//!   arena and CUDA graphs): the same against one `CudaBackend`, decode steps recorded and
//!   replayed on both cards, and a synthetic Llama-3-8B-shaped Q4_K_M model (8 layers)
//!   split 50/50 against one card, with decode speed printed. Without a GPU these say so and
//!   pass.

mod hybrid_checks;

use std::sync::Arc;

use backend::conformance;
use backend::cpu::CpuBackend;
use backend::Backend;
use cuda::backend::CudaBackend;
use cuda::multi::{CardLink, LayerSplit, Multi};
use cuda::CudaOptions;
use gguf::GgufFile;
use hybrid_checks::*;
use model::{KvType, LoadOptions, ModelOn};

fn opts() -> LoadOptions {
    LoadOptions {
        n_threads: 2,
        ubatch_size: 512,
    }
}

/// The splits every model is checked with (positions per card, `n_layer + 1` in all): the
/// output alone on the second card, about half and half, layer 0 alone on the first card,
/// three cards, and everything on one card of two.
fn splits(n_layer: usize) -> Vec<LayerSplit> {
    let n = n_layer + 1;
    let mut v = vec![
        LayerSplit::from_counts(n_layer, &[n - 1, 1]),
        LayerSplit::from_counts(n_layer, &[n.div_ceil(2), n / 2]),
        LayerSplit::from_counts(n_layer, &[1, n - 1]),
        LayerSplit::from_counts(n_layer, &[n, 0]),
    ];
    if n_layer >= 2 {
        v.push(LayerSplit::from_counts(n_layer, &[1, 1, n - 2]));
    }
    v.into_iter().map(|s| s.unwrap()).collect()
}

/// Loads `file` on `reference` and on `Multi(cards, split)`, runs `prompt` with every
/// position's logits and `n_decode` greedy steps on both, and asserts: logits within `tol`
/// relative L2 of the reference at every position, the same greedy tokens (and `want_ids`
/// when given: transformers' own), and `split.boundaries()` crossings per forward pass, each
/// carrying one hidden state per row. Returns the greedy tokens and a one-line summary.
#[allow(clippy::too_many_arguments)]
fn check_split<R: Backend, B: CardLink>(
    what: &str,
    file: Arc<GgufFile>,
    prompt: &[u32],
    n_decode: usize,
    reference: R,
    cards: Vec<B>,
    split: LayerSplit,
    tol: f64,
    want_ids: Option<&[u32]>,
) -> (ModelOn<Multi<B>>, String) {
    let one = ModelOn::load_on(reference, file.clone(), &opts()).unwrap();
    let multi = Multi::new(cards, split.clone()).unwrap();
    let mm = ModelOn::load_on(multi, file, &opts()).unwrap();
    let n_vocab = one.config().n_vocab;
    let n_embd = one.config().n_embd as u64;
    let mut so = one.new_state(64, KvType::F32).unwrap();
    let mut sm = mm.new_state(64, KvType::F32).unwrap();
    assert_eq!(so.bytes(), sm.bytes(), "{what}: state bytes");

    let crossed = |m: &ModelOn<Multi<B>>, before: (u64, u64), rows: usize, step: &str| {
        let (c, b) = m.backend().crossings();
        let (c, b) = (c - before.0, b - before.1);
        assert_eq!(
            c,
            split.boundaries() as u64,
            "{what} [{split}] {step}: crossings"
        );
        assert_eq!(
            b,
            c * rows as u64 * n_embd * 4,
            "{what} [{split}] {step}: bytes"
        );
    };
    let lo = one.forward(&mut so, prompt, true).unwrap();
    let c0 = mm.backend().crossings();
    let lm = mm.forward(&mut sm, prompt, true).unwrap();
    crossed(&mm, c0, prompt.len(), "prefill");
    assert_eq!(lo.len(), lm.len());
    let mut worst = 0.0f64;
    for p in 0..prompt.len() {
        let row = p * n_vocab..(p + 1) * n_vocab;
        let want: Vec<f64> = lo[row.clone()].iter().map(|&x| x as f64).collect();
        let e = rel_l2(&lm[row], &want);
        worst = worst.max(e);
        assert!(
            e <= tol,
            "{what} [{split}]: position {p}: relative L2 {e:.3e} > {tol:.0e} vs one card"
        );
    }
    let last = (prompt.len() - 1) * n_vocab;
    let (mut no, mut nm) = (argmax(&lo[last..]), argmax(&lm[last..]));
    let (mut to, mut tm) = (vec![no], vec![nm]);
    for i in 0..n_decode {
        let lo = one.forward(&mut so, &[no], false).unwrap();
        let c0 = mm.backend().crossings();
        let lm = mm.forward(&mut sm, &[nm], false).unwrap();
        crossed(&mm, c0, 1, "decode");
        let e = rel_l2(&lm, &lo.iter().map(|&x| x as f64).collect::<Vec<_>>());
        worst = worst.max(e);
        assert!(
            e <= tol,
            "{what} [{split}]: decode step {i}: relative L2 {e:.3e}"
        );
        no = argmax(&lo);
        nm = argmax(&lm);
        to.push(no);
        tm.push(nm);
    }
    assert_eq!(tm, to, "{what} [{split}]: greedy tokens vs one card");
    if let Some(want) = want_ids {
        let n = want.len().min(tm.len());
        assert_eq!(
            &tm[..n],
            &want[..n],
            "{what} [{split}]: greedy tokens vs transformers"
        );
    }
    let s = format!(
        "{what} [{split}]: worst rel L2 {worst:.2e}, {} greedy tokens equal, {} crossings/pass",
        tm.len(),
        split.boundaries()
    );
    drop(sm);
    (mm, s)
}

/// Every fixture model (f32: greedy tokens also against transformers) and stories260K (also
/// tied) under every split, with cards from `make_card`.
fn check_all_models<R: Backend, B: CardLink>(
    make_reference: impl Fn() -> R,
    make_card: impl Fn() -> B,
    tol: f64,
    after: impl Fn(&ModelOn<Multi<B>>, &LayerSplit),
) {
    for arch in FIXTURE_ARCHS {
        let r = reference(arch);
        let file = open(&fixture(arch, "model-f32.gguf"));
        let n_layer = cuda::hybrid::placement::n_layer_of(&file).unwrap();
        for split in splits(n_layer) {
            let cards = (0..split.n_cards()).map(|_| make_card()).collect();
            let n_decode = r.greedy_ids.len().saturating_sub(1);
            let (m, s) = check_split(
                arch,
                file.clone(),
                &r.prompt_ids,
                n_decode,
                make_reference(),
                cards,
                split.clone(),
                tol,
                Some(&r.greedy_ids),
            );
            after(&m, &split);
            println!("{s}");
        }
    }
    let stories = stories260k();
    let tied = without_output(&stories);
    let n_layer = cuda::hybrid::placement::n_layer_of(&stories).unwrap();
    for split in splits(n_layer) {
        for (what, f) in [("stories260K", &stories), ("stories260K tied", &tied)] {
            let cards = (0..split.n_cards()).map(|_| make_card()).collect();
            let (m, s) = check_split(
                what,
                f.clone(),
                &STORIES_PROMPT,
                24,
                make_reference(),
                cards,
                split.clone(),
                tol,
                None,
            );
            after(&m, &split);
            println!("{s}");
        }
    }
}

fn cpu() -> CpuBackend {
    CpuBackend::new(2).unwrap()
}

#[test]
fn cpu_cards_every_model_and_split_match_one_cpu() {
    // Every card runs the same CPU code, so agreement is exact up to thread scheduling.
    check_all_models(cpu, cpu, 1e-5, |_, _| {});
}

#[test]
fn cpu_cards_conformance_and_homes() {
    for split in [
        LayerSplit::from_counts(4, &[5, 0]).unwrap(),
        LayerSplit::from_counts(4, &[2, 3]).unwrap(),
    ] {
        let b = Multi::new(vec![cpu(), cpu()], split.clone()).unwrap();
        conformance::run_all(&b).unwrap_or_else(|e| panic!("[{split}]: {e}"));
    }
    let file = open(&fixture("qwen35", "model-f32.gguf"));
    let b = Multi::new(
        vec![cpu(), cpu()],
        LayerSplit::from_counts(4, &[2, 3]).unwrap(),
    )
    .unwrap();
    for (name, want) in [
        ("blk.0.attn_qkv.weight", vec![0]),
        ("blk.2.ssm_a", vec![1]),
        ("blk.3.attn_k.weight", vec![1]),
        ("output_norm.weight", vec![1]),
        ("token_embd.weight", vec![0]),
    ] {
        assert_eq!(b.load_weight(&file, name).unwrap().cards(), want, "{name}");
    }
    for (layer, want) in [(Some(1), 0), (Some(2), 1), (None, 1)] {
        b.set_layer(layer);
        let kv = b.new_kv_cache(8, 1, 4, 4, KvType::F32).unwrap();
        assert_eq!(kv.card(), want);
    }
    b.set_layer(None);
    assert!(Multi::new(vec![cpu()], LayerSplit::from_counts(4, &[2, 3]).unwrap()).is_err());
}

// ---- one GPU as two logical cards ---------------------------------------------------------

/// True (after a message) when there is no GPU to test on.
fn no_gpu(test: &str) -> bool {
    if cuda::device_count().unwrap_or(0) == 0 {
        eprintln!("{test}: skipped: no CUDA device");
        return true;
    }
    false
}

/// A logical card: its own `CudaBackend` (context handle, stream, arena, graphs) on GPU 0.
fn gpu() -> CudaBackend {
    CudaBackend::new(&CudaOptions::default()).expect("CUDA device")
}

#[test]
fn gpu_two_logical_cards_match_one_card() {
    if no_gpu("gpu_two_logical_cards_match_one_card") {
        return;
    }
    // Decode steps are recorded per card: with 23 greedy steps of one key, every active
    // card captured its part once and replayed it after.
    check_all_models(gpu, gpu, 1e-4, |m, split| {
        let b = m.backend();
        assert!(b.records_steps(), "one GPU: copies are recordable");
        for d in split.active_cards() {
            let (cap, rep) = b.cards()[d].graph_counts();
            if std::env::var("REDLINE_CUDA_GRAPHS").as_deref() != Ok("0") {
                assert!(
                    cap >= 1 && rep >= 10,
                    "[{split}] card {d}: {cap} captures, {rep} replays"
                );
            }
        }
    });
}

#[test]
fn gpu_conformance_on_two_logical_cards() {
    if no_gpu("gpu_conformance_on_two_logical_cards") {
        return;
    }
    let b = Multi::new(
        vec![gpu(), gpu()],
        LayerSplit::from_counts(4, &[2, 3]).unwrap(),
    )
    .unwrap();
    conformance::run_all(&b).unwrap();
}

/// A Llama-3-8B-shaped model cut to 8 layers (Q4_K_M, random weights, 32k vocabulary) split
/// 50/50 over two logical cards against one card: the same logits (1e-4) and 32 greedy tokens;
/// decode speed of both printed (the cost of one boundary per token).
#[test]
fn gpu_synthetic_split_matches_one_card() {
    use model::synth::{FileType, Shape, SynthPlan};
    use std::time::Instant;

    if no_gpu("gpu_synthetic_split_matches_one_card") {
        return;
    }
    let mut shape = Shape::llama3_8b();
    shape.n_layer = 8;
    shape.n_vocab = 32000;
    let path = std::env::temp_dir().join("redline-multi-llama3-8b-8l.gguf");
    let plan = SynthPlan::new(shape, FileType::Q4KM);
    let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    plan.write(f, 7, |_| {}).unwrap();
    let file = open(&path);
    let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 11) % 32000).collect();
    let split = LayerSplit::from_counts(8, &[5, 4]).unwrap();
    let (_, s) = check_split(
        "synthetic llama3-8b x8 Q4_K_M",
        file.clone(),
        &prompt,
        32,
        gpu(),
        vec![gpu(), gpu()],
        split.clone(),
        1e-4,
        None,
    );
    println!("{s}");

    let time = |step: &mut dyn FnMut(u32)| -> f64 {
        for t in 1..4 {
            step(t);
        }
        let n = 64;
        let t = Instant::now();
        for i in 0..n {
            step(100 + i);
        }
        n as f64 / t.elapsed().as_secs_f64()
    };
    let o = LoadOptions {
        n_threads: 0,
        ubatch_size: 512,
    };
    let one = ModelOn::load_on(gpu(), file.clone(), &o).unwrap();
    let mut so = one.new_state(512, KvType::F16).unwrap();
    one.forward(&mut so, &prompt, false).unwrap();
    let one_tok_s = time(&mut |t| {
        one.forward(&mut so, &[t], false).unwrap();
    });
    drop(so);
    drop(one);
    let mm = ModelOn::load_on(
        Multi::new(vec![gpu(), gpu()], split.clone()).unwrap(),
        file,
        &o,
    )
    .unwrap();
    let mut sm = mm.new_state(512, KvType::F16).unwrap();
    mm.forward(&mut sm, &prompt, false).unwrap();
    let split_tok_s = time(&mut |t| {
        mm.forward(&mut sm, &[t], false).unwrap();
    });
    println!(
        "decode: one card {one_tok_s:.1} tok/s, split [{split}] {split_tok_s:.1} tok/s ({:+.1} µs/token)",
        1e6 / split_tok_s - 1e6 / one_tok_s
    );
    drop(sm);
    drop(mm);
    let _ = std::fs::remove_file(&path);
}
