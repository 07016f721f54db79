//! Decode steps on the GPU (crates/cuda/src/backend/step.rs): CUDA-graph replay against eager
//! steps (logits within 1e-5 for 20 steps) and greedy tokens against the CPU backend, for every
//! fixture model and stories260K, single and batched, every KV type; the KV cache bytes against
//! the CPU quantizer; the backend conformance suite. With `REDLINE_DECODE_BENCH=1`, eager vs
//! graph decode speed on a synthetic Qwen2.5-1.5B Q4_K_M. Skipped (with a message) when no CUDA
//! device is present.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use backend::{Backend, KvType, Row};
use cuda::backend::{CudaBackend, StagedFusions};
use cuda::CudaOptions;
use model::{LoadOptions, ModelOn};

fn data(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data")).join(path)
}

fn fixture(arch: &str, file: &str) -> PathBuf {
    data("fixtures").join(arch).join(file)
}

#[path = "../../../tests/support/fixture_reference.rs"]
#[allow(dead_code)]
mod fixture_reference;
use fixture_reference::{argmax, reference};

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(&CudaOptions::default()) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

fn opts() -> LoadOptions {
    LoadOptions {
        n_threads: 2,
        ubatch_size: 512,
    }
}

fn load_gpu(path: &std::path::Path, graphs: bool) -> Option<ModelOn<CudaBackend>> {
    let b = gpu()?;
    b.set_graphs_enabled(graphs);
    let file = gguf::GgufFile::open(path).unwrap();
    Some(ModelOn::load_on(b, Arc::new(file), &opts()).unwrap())
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_nan() || y.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f32::max)
}

// The backend conformance suite (every op against f64 host code; attention over f32, f16,
// q8_0 and q4_0 caches), one test per part so a failure names its op.
#[test]
fn conformance_attention_every_kv_type() {
    let Some(b) = gpu() else { return };
    backend::conformance::attention(&b).unwrap();
}

#[test]
fn conformance_rope() {
    let Some(b) = gpu() else { return };
    backend::conformance::rope(&b).unwrap();
}

#[test]
fn conformance_norms_and_activations() {
    let Some(b) = gpu() else { return };
    backend::conformance::norms_and_activations(&b).unwrap();
}

#[test]
fn conformance_delta_net() {
    let Some(b) = gpu() else { return };
    backend::conformance::delta_net(&b).unwrap();
}

#[test]
fn conformance_matmul_and_embed() {
    let Some(b) = gpu() else { return };
    backend::conformance::matmul_and_embed(&b).unwrap();
}

/// One new K/V row stored through `attention`: the cache bytes equal the CPU quantizer's
/// (q8_0, q4_0: ggml's reference rounding) or conversion (f16, f32) of that row.
#[test]
fn kv_cache_bytes_match_cpu_quantizer() {
    let Some(b) = gpu() else { return };
    let (n_kv, hd) = (2usize, 64usize);
    let p = backend::AttentionParams {
        n_head: 4,
        n_kv_head: n_kv,
        head_dim_k: hd,
        head_dim_v: hd,
        scale: 0.125,
    };
    let mut g = backend::conformance::Lcg(7);
    for kv in [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        let mut c = b.new_kv_cache(4, n_kv, hd, hd, kv).unwrap();
        let (k, v) = (g.vec(n_kv * hd), g.vec(n_kv * hd));
        let q = g.vec(4 * hd);
        let mut out = b.zeros(1, 4 * hd);
        b.attention(
            &b.upload(&q, 1, 4 * hd).unwrap(),
            &b.upload(&k, 1, n_kv * hd).unwrap(),
            &b.upload(&v, 1, n_kv * hd).unwrap(),
            &[Row { seq: 0, pos: 2 }],
            &mut [&mut c],
            &p,
            &mut out,
        )
        .unwrap();
        let (kc, vc) = b.kv_cache_to_host(&c).unwrap();
        let row = kv.row_bytes(n_kv * hd).unwrap();
        for (name, src, got) in [("K", &k, &kc), ("V", &v, &vc)] {
            let mut want = vec![0u8; row];
            quant::quantize_row(kv.ggml_type(), src, &mut want).unwrap();
            let got = &got[2 * row..3 * row];
            let bad = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(
                bad, 0,
                "{kv} {name}: {bad} of {row} cache bytes differ from the CPU quantizer\n got {:?}\nwant {:?}",
                &got[..row.min(40)],
                &want[..row.min(40)]
            );
        }
    }
}

/// Decodes `steps` tokens greedily from `prompt` on the graph model, feeding the same tokens to
/// the eager model and comparing logits each step; returns the tokens.
fn graph_vs_eager(
    name: &str,
    graph: &ModelOn<CudaBackend>,
    eager: &ModelOn<CudaBackend>,
    prompt: &[u32],
    kv: KvType,
    steps: usize,
) -> Vec<u32> {
    let mut sg = graph.new_state(128, kv).unwrap();
    let mut se = eager.new_state(128, kv).unwrap();
    let lg = graph.forward(&mut sg, prompt, false).unwrap();
    let le = eager.forward(&mut se, prompt, false).unwrap();
    assert!(
        max_abs_diff(&lg, &le) <= 1e-5,
        "{name} {kv}: prefill logits differ"
    );
    let mut next = argmax(&lg);
    let mut toks = vec![next];
    let mut worst = 0f32;
    for step in 0..steps {
        let lg = graph.forward(&mut sg, &[next], false).unwrap();
        let le = eager.forward(&mut se, &[next], false).unwrap();
        let d = max_abs_diff(&lg, &le);
        worst = worst.max(d);
        assert!(
            d <= 1e-5,
            "{name} {kv}: decode step {step}: graph vs eager logits differ by {d}"
        );
        next = argmax(&lg);
        toks.push(next);
    }
    println!("{name} {kv}: {steps} decode steps, graph vs eager max |diff| {worst:.2e}");
    toks
}

fn cpu_greedy(path: &std::path::Path, prompt: &[u32], kv: KvType, steps: usize) -> Vec<u32> {
    let m = model::Model::load(path, &opts()).unwrap();
    let mut s = m.new_state(128, kv).unwrap();
    let mut next = argmax(&m.forward(&mut s, prompt, false).unwrap());
    let mut toks = vec![next];
    for _ in 0..steps {
        next = argmax(&m.forward(&mut s, &[next], false).unwrap());
        toks.push(next);
    }
    toks
}

fn check_model(name: &str, path: &std::path::Path, prompt: &[u32]) {
    let (Some(graph), Some(eager)) = (load_gpu(path, true), load_gpu(path, false)) else {
        return;
    };
    const STEPS: usize = 20;
    for kv in [KvType::F32, KvType::F16, KvType::Q8_0, KvType::Q4_0] {
        if graph.new_state(8, kv).is_err() {
            println!("{name}: KV {kv} does not fit the head size, skipped");
            continue;
        }
        let toks = graph_vs_eager(name, &graph, &eager, prompt, kv, STEPS);
        if matches!(kv, KvType::F32 | KvType::F16) {
            let cpu = cpu_greedy(path, prompt, kv, STEPS);
            assert_eq!(toks, cpu, "{name} {kv}: greedy tokens, GPU graphs vs CPU");
        }
    }
    let (captures, replays) = graph.backend().graph_counts();
    println!("{name}: {captures} steps captured, {replays} replayed");
    assert!(captures >= 1 && replays >= 16, "{name}: graphs not used");
    assert_eq!(eager.backend().graph_counts(), (0, 0));
    // Batched decode: three sequences of different lengths in one step, graph vs eager.
    let mut sg: Vec<_> = (0..3)
        .map(|_| graph.new_state(128, KvType::F16).unwrap())
        .collect();
    let mut se: Vec<_> = (0..3)
        .map(|_| eager.new_state(128, KvType::F16).unwrap())
        .collect();
    for (i, (a, b)) in sg.iter_mut().zip(se.iter_mut()).enumerate() {
        let p = &prompt[..prompt.len() - i];
        graph.forward(a, p, false).unwrap();
        eager.forward(b, p, false).unwrap();
    }
    let mut toks = vec![prompt[0]; 3];
    for step in 0..STEPS {
        let mut rg: Vec<&mut _> = sg.iter_mut().collect();
        let mut re: Vec<&mut _> = se.iter_mut().collect();
        let lg = graph.forward_batch(&mut rg, &toks).unwrap();
        let le = eager.forward_batch(&mut re, &toks).unwrap();
        let d = max_abs_diff(&lg, &le);
        assert!(
            d <= 1e-5,
            "{name}: batched step {step}: graph vs eager differ by {d}"
        );
        let nv = graph.config().n_vocab;
        toks = (0..3).map(|i| argmax(&lg[i * nv..(i + 1) * nv])).collect();
    }
    println!("{name}: {STEPS} batched (3 sequences) steps, graph == eager");
}

#[test]
fn fixtures_graph_replay_matches_eager_and_cpu() {
    if gpu().is_none() {
        return;
    }
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        let r = reference(arch);
        check_model(arch, &fixture(arch, "model-f32.gguf"), &r.prompt_ids);
    }
}

#[test]
fn stories260k_graph_replay_matches_eager_and_cpu() {
    if gpu().is_none() {
        return;
    }
    let path = data("../../models/stories260K.gguf");
    check_model("stories260K", &path, &[1, 432, 383, 286, 261, 376]);
}

/// Hybrid model: rolling back to a snapshot copies the saved recurrent state into the live
/// buffers; the redone steps (replayed recordings) give the same logits as the first time.
#[test]
fn qwen35_snapshot_restore_with_graphs() {
    let Some(m) = load_gpu(&fixture("qwen35", "model-f32.gguf"), true) else {
        return;
    };
    let r = reference("qwen35");
    let mut s = m.new_state(128, KvType::F16).unwrap();
    m.forward(&mut s, &r.prompt_ids, false).unwrap();
    let p0 = s.len();
    // Warm and capture this state's step before the snapshot.
    for t in [5u32, 6, 7] {
        m.forward(&mut s, &[t], false).unwrap();
    }
    s.snapshot();
    let feed = [11u32, 12, 13, 14, 15];
    let first: Vec<Vec<f32>> = feed
        .iter()
        .map(|&t| m.forward(&mut s, &[t], false).unwrap())
        .collect();
    s.truncate(p0 + 3).unwrap();
    for (i, &t) in feed.iter().enumerate() {
        let again = m.forward(&mut s, &[t], false).unwrap();
        let d = max_abs_diff(&again, &first[i]);
        assert!(d <= 1e-5, "step {i} after restore differs by {d}");
    }
}

/// Speculative verify passes as recorded steps: k rows of one sequence (every row's logits)
/// after a snapshot, a restore to it, then one accepted token, round after round; graph vs
/// eager logits at every pass. The restore copies into the live buffers, so the k-row key
/// replays. Then two sequences of 3 and 2 rows in one pass with the hidden states
/// (`forward_multi_rows`, the MTP drafter's input), graph vs eager.
fn verify_rounds(name: &str, path: &std::path::Path, prompt: &[u32]) {
    let (Some(graph), Some(eager)) = (load_gpu(path, true), load_gpu(path, false)) else {
        return;
    };
    let mut sg = graph.new_state(128, KvType::F16).unwrap();
    let mut se = eager.new_state(128, KvType::F16).unwrap();
    graph.forward(&mut sg, prompt, false).unwrap();
    eager.forward(&mut se, prompt, false).unwrap();
    let (c0, r0) = graph.backend().graph_counts();
    let mut worst = 0f32;
    for round in 0..8u32 {
        let draft = [3 + round, 7 + round, 11 + round];
        for s in [&mut sg, &mut se] {
            s.snapshot();
        }
        let base = sg.len();
        let lg = graph.forward(&mut sg, &draft, true).unwrap();
        let le = eager.forward(&mut se, &draft, true).unwrap();
        let d = max_abs_diff(&lg, &le);
        worst = worst.max(d);
        assert!(
            d <= 1e-5,
            "{name}: verify round {round}: graph vs eager logits differ by {d}"
        );
        sg.truncate(base).unwrap();
        se.truncate(base).unwrap();
        sg.drop_snapshot(base);
        se.drop_snapshot(base);
        let lg = graph.forward(&mut sg, &draft[..1], false).unwrap();
        let le = eager.forward(&mut se, &draft[..1], false).unwrap();
        let d = max_abs_diff(&lg, &le);
        assert!(
            d <= 1e-5,
            "{name}: accepted token of round {round}: graph vs eager differ by {d}"
        );
    }
    let (c1, r1) = graph.backend().graph_counts();
    println!(
        "{name}: 8 verify rounds of 3 rows, graph vs eager max |diff| {worst:.2e}; {} captured, {} replayed",
        c1 - c0,
        r1 - r0
    );
    // 8 three-row passes + 8 one-row steps: each key warms, records, then replays
    assert!(
        r1 - r0 >= 10,
        "{name}: multi-row verify passes were not replayed ({} replays)",
        r1 - r0
    );
    let mut g2: Vec<_> = (0..2)
        .map(|_| graph.new_state(128, KvType::F16).unwrap())
        .collect();
    let mut e2: Vec<_> = (0..2)
        .map(|_| eager.new_state(128, KvType::F16).unwrap())
        .collect();
    for (a, b) in g2.iter_mut().zip(e2.iter_mut()) {
        graph.forward(a, prompt, false).unwrap();
        eager.forward(b, prompt, false).unwrap();
    }
    for step in 0..5u32 {
        let t0 = [20 + step, 21 + step, 22 + step];
        let t1 = [30 + step, 31 + step];
        let toks: [&[u32]; 2] = [&t0, &t1];
        let mut rg: Vec<&mut _> = g2.iter_mut().collect();
        let mut re: Vec<&mut _> = e2.iter_mut().collect();
        let (lg, hg) = graph
            .forward_multi_rows(&mut rg, &toks, &[true, false], true)
            .unwrap();
        let (le, he) = eager
            .forward_multi_rows(&mut re, &toks, &[true, false], true)
            .unwrap();
        let (dl, dh) = (max_abs_diff(&lg, &le), max_abs_diff(&hg, &he));
        assert!(
            dl <= 1e-5 && dh <= 1e-5,
            "{name}: 3+2-row pass {step}: graph vs eager logits differ by {dl}, hidden by {dh}"
        );
    }
    println!("{name}: 5 passes of 3+2 rows with hidden states, graph == eager");
}

#[test]
fn verify_passes_replay_as_graphs() {
    if gpu().is_none() {
        return;
    }
    for arch in ["llama", "qwen35"] {
        let r = reference(arch);
        verify_rounds(arch, &fixture(arch, "model-f32.gguf"), &r.prompt_ids);
    }
}

/// Eager vs graph decode speed (tokens/s) on synthetic Q4_K_M models of real shapes: set
/// `REDLINE_DECODE_BENCH=1`; `REDLINE_DECODE_BENCH_SHAPES` lists `redline synth` presets
/// (default `qwen2.5-1.5b`). Files are written to the temp dir once and reused.
#[test]
fn decode_speed_eager_vs_graph() {
    if std::env::var("REDLINE_DECODE_BENCH").is_err() {
        eprintln!("skipped: set REDLINE_DECODE_BENCH=1 to measure decode speed");
        return;
    }
    if gpu().is_none() {
        return;
    }
    let shapes =
        std::env::var("REDLINE_DECODE_BENCH_SHAPES").unwrap_or_else(|_| "qwen2.5-1.5b".into());
    for name in shapes.split(',') {
        let shape = model::synth::Shape::preset(name).expect("a synth preset name");
        let path = std::env::temp_dir().join(format!("redline-decode-bench-{name}-q4km.gguf"));
        if !path.exists() {
            let t = Instant::now();
            let plan = model::synth::SynthPlan::new(shape, model::synth::FileType::Q4KM);
            let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
            plan.write(f, 42, |_| {}).unwrap();
            println!(
                "synthesized {} in {:.1} s",
                path.display(),
                t.elapsed().as_secs_f64()
            );
        }
        let file_gb = std::fs::metadata(&path).unwrap().len() as f64 / 1e9;
        for graphs in [false, true, false, true] {
            let m = load_gpu(&path, graphs).unwrap();
            let mut s = m.new_state(1024, KvType::F16).unwrap();
            let prompt: Vec<u32> = (0..16).map(|i| 100 + i).collect();
            m.forward(&mut s, &prompt, false).unwrap();
            let mut next = 7u32;
            for _ in 0..4 {
                next = argmax(&m.forward(&mut s, &[next], false).unwrap());
            }
            let n = 128;
            let t = Instant::now();
            for _ in 0..n {
                next = argmax(&m.forward(&mut s, &[next], false).unwrap());
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "decode {name} Q4_K_M ({file_gb:.2} GB file), {}: {n} tokens in {:.3} s = {:.1} tok/s ({:.3} ms/token, file bytes / time = {:.0} GB/s)",
                if graphs { "graph" } else { "eager" },
                secs,
                n as f64 / secs,
                secs * 1e3 / n as f64,
                file_gb * n as f64 / secs
            );
        }
    }
}

// ---- fused decode paths (crates/cuda/src/backend/fused.rs, REDLINE_FUSED) -------------------

fn load_gpu_fused(
    path: &std::path::Path,
    graphs: bool,
    fused: bool,
) -> Option<ModelOn<CudaBackend>> {
    let b = gpu()?;
    b.set_graphs_enabled(graphs);
    b.set_fused(fused);
    let file = gguf::GgufFile::open(path).unwrap();
    Some(ModelOn::load_on(b, Arc::new(file), &opts()).unwrap())
}

/// Max |a - b| relative to max |b| over the finite values; a value finite on one side only is
/// an infinite difference (random synthetic weights may overflow identically on both sides).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b
        .iter()
        .filter(|v| v.is_finite())
        .fold(1e-6f32, |m, v| m.max(v.abs()));
    let mut worst = 0f32;
    for (x, y) in a.iter().zip(b) {
        let d = match (x.is_finite(), y.is_finite()) {
            (true, true) => (x - y).abs(),
            (false, false) if x.is_nan() == y.is_nan() => 0.0,
            _ => f32::INFINITY,
        };
        worst = worst.max(d);
    }
    worst / scale
}

/// Fused + graphs against unfused + eager on one model: single-sequence decode (every step's
/// logits), then 3 sequences batched. Returns the fused model's greedy tokens.
fn fused_vs_unfused(name: &str, path: &std::path::Path, prompt: &[u32], steps: usize) -> Vec<u32> {
    let (Some(f), Some(u)) = (
        load_gpu_fused(path, true, true),
        load_gpu_fused(path, false, false),
    ) else {
        return vec![];
    };
    let mut sf = f.new_state(128, KvType::F16).unwrap();
    let mut su = u.new_state(128, KvType::F16).unwrap();
    let lf = f.forward(&mut sf, prompt, false).unwrap();
    let lu = u.forward(&mut su, prompt, false).unwrap();
    let d = rel_diff(&lf, &lu);
    assert!(
        d <= 1e-4,
        "{name}: prefill fused vs unfused differ by {d} (relative)"
    );
    let mut next = argmax(&lf);
    let mut toks = vec![next];
    let mut worst = 0f32;
    for step in 0..steps {
        let lf = f.forward(&mut sf, &[next], false).unwrap();
        let lu = u.forward(&mut su, &[next], false).unwrap();
        let d = rel_diff(&lf, &lu);
        worst = worst.max(d);
        assert!(
            d <= 1e-4,
            "{name}: decode step {step}: fused vs unfused logits differ by {d} (relative)"
        );
        next = argmax(&lf);
        toks.push(next);
    }
    let (captures, replays) = f.backend().graph_counts();
    assert!(
        captures >= 1 && replays >= 1,
        "{name}: fused steps not recorded"
    );
    println!(
        "{name}: {steps} fused (graph) vs unfused (eager) steps, max relative |diff| {worst:.2e}"
    );
    // batched: 3 sequences of different lengths
    let mut sf: Vec<_> = (0..3)
        .map(|_| f.new_state(128, KvType::F16).unwrap())
        .collect();
    let mut su: Vec<_> = (0..3)
        .map(|_| u.new_state(128, KvType::F16).unwrap())
        .collect();
    for (i, (a, b)) in sf.iter_mut().zip(su.iter_mut()).enumerate() {
        let p = &prompt[..prompt.len() - i.min(prompt.len() - 1)];
        f.forward(a, p, false).unwrap();
        u.forward(b, p, false).unwrap();
    }
    let mut bt = vec![prompt[0]; 3];
    for step in 0..steps.min(8) {
        let mut rf: Vec<&mut _> = sf.iter_mut().collect();
        let mut ru: Vec<&mut _> = su.iter_mut().collect();
        let lf = f.forward_batch(&mut rf, &bt).unwrap();
        let lu = u.forward_batch(&mut ru, &bt).unwrap();
        let d = rel_diff(&lf, &lu);
        assert!(
            d <= 1e-4,
            "{name}: batched step {step}: fused vs unfused differ by {d}"
        );
        let nv = f.config().n_vocab;
        bt = (0..3).map(|i| argmax(&lf[i * nv..(i + 1) * nv])).collect();
    }
    // speculative verify passes: 4 rows of one sequence, every row's logits (a recorded
    // multi-row step on the fused side), then back to the snapshot and one token on
    for round in 0..4 {
        let draft: Vec<u32> = (0..4).map(|j| bt[j % 3]).collect();
        let base = sf[0].len();
        sf[0].snapshot();
        su[0].snapshot();
        let lf = f.forward(&mut sf[0], &draft, true).unwrap();
        let lu = u.forward(&mut su[0], &draft, true).unwrap();
        let d = rel_diff(&lf, &lu);
        assert!(
            d <= 1e-4,
            "{name}: verify pass {round} (4 rows): fused vs unfused differ by {d}"
        );
        for st in [&mut sf[0], &mut su[0]] {
            st.truncate(base).unwrap();
            st.drop_snapshot(base);
        }
        let lf = f.forward(&mut sf[0], &draft[..1], false).unwrap();
        let lu = u.forward(&mut su[0], &draft[..1], false).unwrap();
        let d = rel_diff(&lf, &lu);
        assert!(
            d <= 1e-4,
            "{name}: step after verify pass {round}: fused vs unfused differ by {d}"
        );
    }
    toks
}

#[test]
fn fused_matches_unfused_and_cpu_on_fixtures() {
    if gpu().is_none() {
        return;
    }
    for arch in ["llama", "qwen2", "qwen3", "qwen35"] {
        let r = reference(arch);
        let f32_path = fixture(arch, "model-f32.gguf");
        let toks = fused_vs_unfused(&format!("{arch} f32"), &f32_path, &r.prompt_ids, 20);
        let cpu = cpu_greedy(&f32_path, &r.prompt_ids, KvType::F16, 20);
        assert_eq!(toks, cpu, "{arch}: fused GPU greedy tokens vs CPU");
        // q8_0 weights: the quantized products take the fused (one-launch) path
        let q8 = fixture(arch, "model-q8_0.gguf");
        if q8.exists() {
            fused_vs_unfused(&format!("{arch} q8_0"), &q8, &r.prompt_ids, 20);
        }
    }
}

#[test]
fn fused_matches_unfused_on_stories260k() {
    if gpu().is_none() {
        return;
    }
    let path = data("../../models/stories260K.gguf");
    let prompt = [1, 432, 383, 286, 261, 376];
    let toks = fused_vs_unfused("stories260K", &path, &prompt, 20);
    assert_eq!(toks, cpu_greedy(&path, &prompt, KvType::F16, 20));
}

/// Real layer shapes at Q4_K_M (q4_K with q6_K V/down, bias, DeltaNet in-projections): a
/// synthetic Qwen2.5-1.5B cut to 2 layers and a Qwen3.5-27B cut to 4 layers (3 DeltaNet + 1
/// gated attention) with a 32k vocabulary; fused + graphs vs unfused + eager.
#[test]
fn fused_matches_unfused_on_synth_q4_k_m_shapes() {
    if gpu().is_none() {
        return;
    }
    for (name, layers) in SYNTH_CUTS {
        let path = synth_q4_k_m(name, layers, "fused");
        let prompt: Vec<u32> = (0..9).map(|i| 100 + 31 * i).collect();
        fused_vs_unfused(name, &path, &prompt, 12);
        let _ = std::fs::remove_file(&path);
    }
}

/// The real layer shapes the fused-path tests run: a synthetic Qwen2.5-1.5B cut to 2 layers and
/// a Qwen3.5-27B cut to 4 (3 DeltaNet + 1 gated attention).
const SYNTH_CUTS: [(&str, usize); 2] = [("qwen2.5-1.5b", 2), ("qwen3.5-27b", 4)];

/// The tiled q8_1 layout (`REDLINE_Q8_1_TILED`: x of 1-2 tokens with rows of a multiple of 512
/// values stored with its 16-byte pieces transposed, kernels/common.cuh `q8_1_at`) against the
/// natural one, every staged fusion on (so every q8_1 writer runs: the quantize launch, the
/// norm, SwiGLU, gated-norm and attention writers): the values and their quantization are the
/// same, only where they sit differs, so the logits must be the same bits.
#[test]
fn q8_1_tiled_matches_natural_on_synth_q4_k_m_shapes() {
    same_logits_under_switch(
        "tiled",
        "tiled q8_1 logits equal the natural layout's",
        &|on| cuda::matvec::set_q8_1_tiled(on),
    );
}

/// The L2 prefetch hints (`CudaBackend::set_l2_prefetch`, `REDLINE_L2_PREFETCH`: a side
/// stream forked inside the recorded steps and joined at their segment ends) against none: a
/// hint moves bytes toward L2 and changes no value, so the logits must be the same bits, with
/// graphs (capture and replay of the forked stream), batched steps and verify passes. Off
/// below sm_90 (both models then run without).
#[test]
fn l2_prefetch_matches_none_on_synth_q4_k_m_shapes() {
    each_cut_side_by_side(
        "l2pf",
        &|b, is_s| b.set_l2_prefetch(if is_s { 24 << 20 } else { 0 }),
        &|_| {},
        &|name, _, _| println!("{name}: logits with L2 prefetch hints equal those without"),
    );
}

/// Two-token Q4_K / Q6_K products with x staged in shared memory (the default,
/// `cuda::matvec::set_x_in_shared`) against x read through L1: the same values and arithmetic,
/// so the same logits bit for bit over batched steps of 2 sequences and verify passes of 2 rows
/// (and everything else, which both share).
#[test]
fn x_in_shared_matches_l1_on_synth_q4_k_m_shapes() {
    same_logits_under_switch(
        "xsmem",
        "logits with x in shared memory equal those with x through L1",
        &|on| cuda::matvec::set_x_in_shared(on),
    );
}

/// The fused RMS norm with a row's writes spread over one block per pass (the default,
/// `cuda::backend::set_norm_split`) against one block a row: every block sums the whole row in
/// the same order, so the same logits bit for bit over one-row and batched steps and verify
/// passes.
#[test]
fn norm_split_matches_one_block_on_synth_q4_k_m_shapes() {
    same_logits_under_switch(
        "nsplit",
        "logits with the norm's writes split over blocks equal those of one block a row",
        &|on| cuda::backend::set_norm_split(on),
    );
}

/// Qwen3.5's f32 alpha / beta projections in the conv's launch (the default,
/// `cuda::backend::set_conv_gates`) against their own `mo_matvec_f32_rows` launch: each row's
/// sums in the same order, so the same logits bit for bit over one-row and batched steps and
/// verify passes; and on the Qwen3.5 cut the riding path must have run (never with it off).
#[test]
fn conv_gates_match_own_launch_on_synth_q4_k_m_shapes() {
    each_cut_side_by_side(
        "cgates",
        &|b, _| b.set_staged(StagedFusions::ALL),
        &|is_s| cuda::backend::set_conv_gates(Some(is_s)),
        &|name, d, s| {
            cuda::backend::set_conv_gates(None);
            let (off, on) = (
                d.backend().conv_gates_calls(),
                s.backend().conv_gates_calls(),
            );
            assert_eq!(off, 0, "{name}: gates rode in the conv with the switch off");
            assert_eq!(
                on > 0,
                name.starts_with("qwen3.5"),
                "{name}: calls whose gates rode in the conv: {on}"
            );
            println!("{name}: logits with the gates in the conv's launch equal those of their own ({on} calls)");
        },
    );
}

/// The fused one-row attention's RoPE angle cache (the default, `cuda::backend::set_rope_cache`:
/// the first attention layer of a step computes the angles, the others read them) against
/// computing them in every launch: a position's angles are the same function's bits whoever
/// computes them, so the same logits bit for bit (the 1.5B cut's second attention layer reads
/// the first's).
#[test]
fn rope_cache_matches_computed_angles_on_synth_q4_k_m_shapes() {
    same_logits_under_switch(
        "ropec",
        "logits with the RoPE angle cache equal those computed in every launch",
        &|on| cuda::backend::set_rope_cache(on),
    );
}

/// A decode row's whole query-head group in one block (`cuda::attention::set_whole_group_from`,
/// forced from the first position) against the default blocks of 3 heads (both cuts have groups
/// of 6, so two blocks a KV head): each head's arithmetic is the same in every block shape, so
/// the same logits bit for bit over one-row and batched steps and verify passes.
#[test]
fn whole_group_decode_matches_split_group_on_synth_q4_k_m_shapes() {
    same_logits_under_switch(
        "wholeg",
        "logits with each KV head's whole group in one decode block equal the split group's",
        &|on| cuda::attention::set_whole_group_from(on.map(u32::from)),
    );
}

/// The queue one-token direct kernels (`cuda::matvec::set_queue`, forced onto a third of the row
/// blocks, so each warp takes several groups from the launch's counter) against one block a row
/// group: the same dots per row, so the same logits bit for bit over one-row and batched steps
/// and verify passes (their one-token launches), replayed graphs among them (each replay must
/// find its counters back at zero).
#[test]
fn queue_matches_one_block_a_group_on_synth_q4_k_m_shapes() {
    same_logits_under_switch(
        "queue",
        "logits with the queue one-token kernels equal those of one block a row group",
        &|on| cuda::matvec::set_queue(on),
    );
}

/// Qwen3.5's gated output norm as the tail of the delta rule's launch (the staged `dn_norm`:
/// the last of each head's blocks normalizes the head) against the separate norm launch: the
/// same loads, sum order and expressions, so the same logits bit for bit over one-row and
/// batched steps and verify passes; and the fused path must have run.
#[test]
fn dn_norm_tail_matches_separate_norm_on_synth_q4_k_m_shapes() {
    each_cut_side_by_side(
        "dnnorm",
        &|b, is_s| {
            b.set_staged(StagedFusions {
                dn_norm: is_s,
                ..StagedFusions::ALL
            })
        },
        &|_| {},
        &|name, d, s| {
            assert_eq!(
                d.backend().dn_norm_calls(),
                0,
                "{name}: the plain model fused"
            );
            assert!(
                s.backend().dn_norm_calls() > 0 || !name.contains("27"),
                "{name}: the rule and norm never ran as one launch"
            );
            println!("{name}: logits with the norm in the rule's launch equal the separate norm's");
        },
    );
}

/// Batched steps of 12 and 32 sequences with their 9..32-token Q4_K / Q6_K products on the mmv2
/// n-tile kernels (`cuda::mmv::set_mmv2n`, x in q8_K) against mmq (x in q8_1), two models side
/// by side with graphs and the fused paths on. The activations are quantized differently, so
/// the logits differ a little; a product wired to the wrong rows, tokens or strides would differ
/// by the logits' own size.
#[test]
fn mmv2_n_tiles_match_mmq_on_synth_q4_k_m_shapes() {
    if gpu().is_none() {
        return;
    }
    for (name, layers) in SYNTH_CUTS {
        let path = synth_q4_k_m(name, layers, "mmv2n");
        let load = || load_gpu_fused(&path, true, true).unwrap();
        let (d, s) = (load(), load());
        let prompt: Vec<u32> = (0..9).map(|i| 100 + 31 * i).collect();
        let nv = d.config().n_vocab;
        for n_seq in [12usize, 32] {
            let mut bd: Vec<_> = (0..n_seq)
                .map(|_| d.new_state(64, KvType::F16).unwrap())
                .collect();
            let mut bs: Vec<_> = (0..n_seq)
                .map(|_| s.new_state(64, KvType::F16).unwrap())
                .collect();
            for (i, (a, b)) in bd.iter_mut().zip(bs.iter_mut()).enumerate() {
                let p = &prompt[..prompt.len() - i % 5];
                cuda::mmv::set_mmv2n(Some(false));
                d.forward(a, p, false).unwrap();
                cuda::mmv::set_mmv2n(Some(true));
                s.forward(b, p, false).unwrap();
            }
            let mut bt: Vec<u32> = (0..n_seq as u32).map(|i| 7 + 13 * i).collect();
            let (mut worst, mut agree) = (0f32, 0usize);
            for step in 0..4 {
                let mut rd: Vec<&mut _> = bd.iter_mut().collect();
                let mut rs: Vec<&mut _> = bs.iter_mut().collect();
                cuda::mmv::set_mmv2n(Some(false));
                let ld = d.forward_batch(&mut rd, &bt).unwrap();
                cuda::mmv::set_mmv2n(Some(true));
                let ls = s.forward_batch(&mut rs, &bt).unwrap();
                for i in 0..n_seq {
                    let (a, b) = (&ls[i * nv..(i + 1) * nv], &ld[i * nv..(i + 1) * nv]);
                    let r = rel_diff(a, b);
                    worst = worst.max(r);
                    assert!(
                        r <= 5e-2,
                        "{name}: batched step {step} of {n_seq} sequences, sequence {i}: mmv2 \
                         n-tiles vs mmq logits differ by {r} (relative)"
                    );
                    agree += usize::from(argmax(a) == argmax(b));
                }
                bt = (0..n_seq)
                    .map(|i| argmax(&ld[i * nv..(i + 1) * nv]))
                    .collect();
            }
            println!(
                "{name}: {n_seq} sequences x 4 steps, mmv2 n-tiles vs mmq: max relative |diff| \
                 {worst:.2e}, greedy tokens equal {agree}/{}",
                4 * n_seq
            );
        }
        cuda::mmv::set_mmv2n(None);
        let _ = std::fs::remove_file(&path);
    }
}

/// On each synthetic cut, two models (graphs, the fused paths and every staged fusion on) run
/// side by side with a process-wide switch off for one and on for the other
/// (`set(Some(false))` / `set(Some(true))`; `set(None)` after), asserting the same logits bit
/// for bit ([`same_logits_both_ways`]).
fn same_logits_under_switch(tag: &str, done: &str, set: &dyn Fn(Option<bool>)) {
    each_cut_side_by_side(
        tag,
        &|b, _| b.set_staged(StagedFusions::ALL),
        &|is_s| set(Some(is_s)),
        &|name, _, _| {
            set(None);
            println!("{name}: {done}");
        },
    );
}

/// A model on the GPU backend.
type GpuModel = ModelOn<CudaBackend>;

/// On each synthetic cut ([`SYNTH_CUTS`]), two models with graphs and the fused paths on, each
/// backend set up by `configure(b, is_s)` before its load, run side by side by
/// [`same_logits_both_ways`] (`before` as there: every logit the same bits); then `after(name,
/// d, s)`.
fn each_cut_side_by_side(
    tag: &str,
    configure: &dyn Fn(&CudaBackend, bool),
    before: &dyn Fn(bool),
    after: &dyn Fn(&str, &GpuModel, &GpuModel),
) {
    if gpu().is_none() {
        return;
    }
    for (name, layers) in SYNTH_CUTS {
        let path = synth_q4_k_m(name, layers, tag);
        let load = |is_s: bool| {
            let b = gpu().unwrap();
            b.set_graphs_enabled(true);
            b.set_fused(true);
            configure(&b, is_s);
            let file = gguf::GgufFile::open(&path).unwrap();
            ModelOn::load_on(b, Arc::new(file), &opts()).unwrap()
        };
        let (d, s) = (load(false), load(true));
        same_logits_both_ways(name, &d, &s, before);
        after(name, &d, &s);
        let _ = std::fs::remove_file(&path);
    }
}

/// Runs `d` and `s` side by side on the same tokens (a prompt, 12 steps, batched steps of 2, 3
/// and 8 sequences, verify passes of 4 and 2 rows and the steps after them) and asserts every
/// logit the same bits. `before(is_s)` runs before each of the two models' calls (a process-wide
/// switch that must differ between them).
fn same_logits_both_ways(
    name: &str,
    d: &ModelOn<CudaBackend>,
    s: &ModelOn<CudaBackend>,
    before: &dyn Fn(bool),
) {
    let same = |what: String, a: &[f32], b: &[f32]| {
        let differ = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            (a.len(), differ),
            (b.len(), 0),
            "{name}: {what}: logits that differ"
        );
    };
    let prompt: Vec<u32> = (0..9).map(|i| 100 + 31 * i).collect();
    let mut sd = d.new_state(128, KvType::F16).unwrap();
    let mut ss = s.new_state(128, KvType::F16).unwrap();
    before(false);
    let ld = d.forward(&mut sd, &prompt, false).unwrap();
    before(true);
    let ls = s.forward(&mut ss, &prompt, false).unwrap();
    same("prefill".into(), &ls, &ld);
    let mut next = argmax(&ld);
    for step in 0..12 {
        before(false);
        let ld = d.forward(&mut sd, &[next], false).unwrap();
        before(true);
        let ls = s.forward(&mut ss, &[next], false).unwrap();
        same(format!("step {step}"), &ls, &ld);
        next = argmax(&ld);
    }
    // batched steps of 2 (the dp4a matvec), 3 and 8 sequences (the most the q8_K path takes)
    let mut bt = Vec::new();
    for n_seq in [2usize, 3, 8] {
        let mut bd: Vec<_> = (0..n_seq)
            .map(|_| d.new_state(128, KvType::F16).unwrap())
            .collect();
        let mut bs: Vec<_> = (0..n_seq)
            .map(|_| s.new_state(128, KvType::F16).unwrap())
            .collect();
        for (i, (a, b)) in bd.iter_mut().zip(bs.iter_mut()).enumerate() {
            let p = &prompt[..prompt.len() - i];
            before(false);
            d.forward(a, p, false).unwrap();
            before(true);
            s.forward(b, p, false).unwrap();
        }
        bt = vec![prompt[0]; n_seq];
        for step in 0..8 {
            let mut rd: Vec<&mut _> = bd.iter_mut().collect();
            let mut rs: Vec<&mut _> = bs.iter_mut().collect();
            before(false);
            let ld = d.forward_batch(&mut rd, &bt).unwrap();
            before(true);
            let ls = s.forward_batch(&mut rs, &bt).unwrap();
            same(
                format!("batched step {step} of {n_seq} sequences"),
                &ls,
                &ld,
            );
            let nv = d.config().n_vocab;
            bt = (0..n_seq)
                .map(|i| argmax(&ld[i * nv..(i + 1) * nv]))
                .collect();
        }
    }
    let mut bd = [d.new_state(128, KvType::F16).unwrap()];
    let mut bs = [s.new_state(128, KvType::F16).unwrap()];
    before(false);
    d.forward(&mut bd[0], &prompt, false).unwrap();
    before(true);
    s.forward(&mut bs[0], &prompt, false).unwrap();
    // verify passes of 4 rows (mmv2) and of 2 (the dp4a matvec)
    for round in 0..4 {
        let k = if round % 2 == 0 { 4 } else { 2 };
        let draft: Vec<u32> = (0..k).map(|j| bt[j % bt.len()]).collect();
        let base = bd[0].len();
        bd[0].snapshot();
        bs[0].snapshot();
        before(false);
        let ld = d.forward(&mut bd[0], &draft, true).unwrap();
        before(true);
        let ls = s.forward(&mut bs[0], &draft, true).unwrap();
        same(format!("verify pass {round}"), &ls, &ld);
        for st in [&mut bd[0], &mut bs[0]] {
            st.truncate(base).unwrap();
            st.drop_snapshot(base);
        }
        before(false);
        let ld = d.forward(&mut bd[0], &draft[..1], false).unwrap();
        before(true);
        let ls = s.forward(&mut bs[0], &draft[..1], false).unwrap();
        same(format!("step after verify pass {round}"), &ls, &ld);
    }
}

/// Writes the synthetic Q4_K_M file of preset `name` cut to `layers` layers, with a vocabulary
/// of at most 32k, into the temporary folder (the caller removes it).
fn synth_q4_k_m(name: &str, layers: usize, tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("redline-{tag}-{name}-{layers}l.gguf"));
    model::synth::write_cut(name, layers, 32768, model::synth::FileType::Q4KM, &path)
        .expect("synth preset")
        .unwrap();
    path
}

/// The staged decode fusions (`StagedFusions::ALL`: dn_recurrent under PDL, the gates inside
/// it, the gated norm's and the attention chain's q8_1 copies, the q8_K copies of 3..8 rows)
/// against the default paths, both fused with graphs, on the synthetic Q4_K_M shapes: one
/// sequence's steps, 3 sequences batched (mmv2 products), verify passes of 4 rows. Every kernel
/// of the staged paths does the default's arithmetic, so the logits must be the same bits.
#[test]
fn staged_fusions_match_default_on_synth_q4_k_m_shapes() {
    let configure = |b: &CudaBackend, is_s: bool| {
        b.set_staged(if is_s {
            StagedFusions::ALL
        } else {
            StagedFusions::default()
        })
    };
    each_cut_side_by_side("staged", &configure, &|_| {}, &|name, d, s| {
        let (b, bdef) = (s.backend(), d.backend());
        println!(
                "{name}: staged calls: gates {}, gated norm q8 {}, attention q8 {}, q8_K {}, attention rows {}",
                b.fused_gates_calls(),
                b.norm_q8_calls(),
                b.attn_q8_calls(),
                b.q8k_calls(),
                b.attn_rows_calls()
            );
        assert_eq!(
            (
                bdef.fused_gates_calls(),
                bdef.norm_q8_calls(),
                bdef.attn_q8_calls(),
                bdef.q8k_calls()
            ),
            (0, 0, 0, 0),
            "{name}: the default paths took a staged one"
        );
        assert!(
            b.attn_q8_calls() > 0 && b.q8k_calls() > 0 && b.attn_rows_calls() > 0,
            "{name}: staged paths not taken"
        );
        assert_eq!(
            bdef.attn_rows_calls(),
            0,
            "{name}: the default took attn_rows"
        );
        if name.starts_with("qwen3.5") {
            assert!(
                b.fused_gates_calls() > 0 && b.norm_q8_calls() > 0,
                "{name}: DeltaNet staged paths not taken"
            );
        }
    });
}

/// The conformance suite's norm/activation, RoPE and matmul parts with the fused paths on
/// (the rms_norm / swiglu kernels that also write q8_1 must give the same f32 outputs).
#[test]
fn conformance_with_fused_paths() {
    let Some(b) = gpu() else { return };
    b.set_fused(true);
    backend::conformance::norms_and_activations(&b).unwrap();
    backend::conformance::rope(&b).unwrap();
    backend::conformance::matmul_and_embed(&b).unwrap();
}

/// `split_cols` in one launch (fused path) against host slicing: adjacent and gapped column
/// ranges, odd widths, several rows.
#[test]
fn fused_split_cols_matches_host_slices() {
    let Some(b) = gpu() else { return };
    b.set_fused(true);
    let (rows, cols) = (3usize, 41usize);
    let src: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5 - 7.0).collect();
    let x = b.upload(&src, rows, cols).unwrap();
    for (offsets, widths) in [
        (vec![0usize, 5, 16], vec![5usize, 11, 25]),
        (vec![1, 9, 30, 40], vec![7, 13, 9, 1]),
    ] {
        let mut outs: Vec<_> = widths.iter().map(|&w| b.zeros(rows, w)).collect();
        let mut refs: Vec<&mut _> = outs.iter_mut().collect();
        b.split_cols(&x, &offsets, &mut refs).unwrap();
        for (i, o) in outs.iter().enumerate() {
            let got = b.download(o);
            for r in 0..rows {
                for c in 0..widths[i] {
                    assert_eq!(
                        got[r * widths[i] + c],
                        src[r * cols + offsets[i] + c],
                        "dst {i} [{r}, {c}]"
                    );
                }
            }
        }
    }
}
