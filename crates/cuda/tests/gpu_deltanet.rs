//! Gated DeltaNet on the GPU (crates/cuda/src/backend/recurrent.rs, kernels/deltanet.cu)
//! against the CPU backend's token-by-token reference (`backend::cpu::delta_net`, recurrent
//! form) on random inputs: every GPU form (legacy, warp-recurrent, chunked, auto) of the delta
//! rule, several head counts and sizes (Qwen3.5-27B: 16 key heads, 48 value heads, 128 each),
//! run lengths across chunk borders, a non-zero starting state, several sequences in one batch
//! (adjacent and interleaved rows); conv1d sequential vs parallel the same way. Relative L2 of
//! outputs and final states <= 1e-4. With `REDLINE_DELTANET_BENCH=1`, times one 512-token
//! prefill of a Qwen3.5-27B DeltaNet layer per form. Skipped (with a message) when no CUDA
//! device is present.

use std::time::Instant;

use backend::conformance::{gguf_with, rel_l2, Lcg};
use backend::cpu::delta_net::{self as cpu_dn, CpuRecurrentState, DeltaForm};
use backend::cpu::CpuTensor;
use backend::{Backend, RecurrentShape, Row};
use cuda::backend::{Conv1dForm, CudaBackend, DeltaRuleForm};
use cuda::CudaOptions;
use gguf::GgmlType;

const TOL: f64 = 1e-4;

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(&CudaOptions::default()) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

fn shape(n_k_heads: usize, n_v_heads: usize, d_k: usize, d_v: usize) -> RecurrentShape {
    RecurrentShape {
        d_conv: 4,
        conv_channels: 2 * n_k_heads * d_k + n_v_heads * d_v,
        n_k_heads,
        n_v_heads,
        d_k,
        d_v,
    }
}

/// Random delta-rule inputs of `n` rows: q, k L2-normed per head (as the model feeds them),
/// g <= 0 (log decay), beta in (0, 1).
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    b: Vec<f32>,
}

fn inputs(sh: &RecurrentShape, n: usize, rng: &mut Lcg) -> Inputs {
    let kd = sh.n_k_heads * sh.d_k;
    let mut l2 = |len: usize| {
        let mut x = rng.vec(len);
        for h in x.chunks_exact_mut(sh.d_k) {
            let norm = h.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            h.iter_mut().for_each(|v| *v /= norm);
        }
        x
    };
    let q = l2(n * kd);
    let k = l2(n * kd);
    let v = rng.vec(n * sh.n_v_heads * sh.d_v);
    // decays from ~0.37 to 1 per token; some heads nearly forget nothing
    let g = rng.vec(n * sh.n_v_heads).iter().map(|x| -x.abs()).collect();
    let b = rng
        .vec(n * sh.n_v_heads)
        .iter()
        .map(|x| 1.0 / (1.0 + (-3.0 * x).exp()))
        .collect();
    Inputs { q, k, v, g, b }
}

/// Batch rows of several sequences: `lens[s]` rows of sequence s starting at `starts[s]`,
/// either one sequence after the other or interleaved round-robin.
fn batch_rows(lens: &[usize], starts: &[usize], interleave: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    if interleave {
        let mut next = vec![0usize; lens.len()];
        while rows.len() < lens.iter().sum() {
            for s in 0..lens.len() {
                if next[s] < lens[s] {
                    rows.push(Row {
                        seq: s,
                        pos: starts[s] + next[s],
                    });
                    next[s] += 1;
                }
            }
        }
    } else {
        for (s, &l) in lens.iter().enumerate() {
            rows.extend((0..l).map(|p| Row {
                seq: s,
                pos: starts[s] + p,
            }));
        }
    }
    rows
}

fn cpu_t(rows: usize, cols: usize, d: &[f32]) -> CpuTensor {
    CpuTensor::from_vec(rows, cols, d.to_vec()).unwrap()
}

/// One delta-rule case: `n_seqs` sequences whose states start from a random state, a batch of
/// `lens` rows; GPU `form` vs the CPU recurrent reference. Returns (output error, state error).
fn delta_case(
    b: &CudaBackend,
    sh: &RecurrentShape,
    lens: &[usize],
    interleave: bool,
    form: DeltaRuleForm,
    seed: u64,
) -> (f64, f64) {
    let mut rng = Lcg(seed);
    let n: usize = lens.iter().sum();
    let inp = inputs(sh, n, &mut rng);
    let starts: Vec<usize> = (0..lens.len()).map(|s| 5 + 3 * s).collect();
    let rows = batch_rows(lens, &starts, interleave);
    let s_len = sh.n_v_heads * sh.d_v * sh.d_k;
    let conv_len = (sh.d_conv - 1) * sh.conv_channels;
    let s0: Vec<Vec<f32>> = (0..lens.len())
        .map(|_| rng.vec(s_len).iter().map(|x| x * 0.5).collect())
        .collect();
    let (kd, vd, hv) = (sh.n_k_heads * sh.d_k, sh.n_v_heads * sh.d_v, sh.n_v_heads);

    // CPU reference
    let mut cs: Vec<CpuRecurrentState> = s0
        .iter()
        .map(|s| {
            let mut st = CpuRecurrentState::new(sh).unwrap();
            st.s.copy_from_slice(s);
            st
        })
        .collect();
    let mut cout = CpuTensor::zeros(n, vd);
    {
        let mut refs: Vec<&mut CpuRecurrentState> = cs.iter_mut().collect();
        cpu_dn::delta_rule_with(
            &cpu_t(n, kd, &inp.q),
            &cpu_t(n, kd, &inp.k),
            &cpu_t(n, vd, &inp.v),
            &cpu_t(n, hv, &inp.g),
            &cpu_t(n, hv, &inp.b),
            &rows,
            &mut refs,
            &mut cout,
            DeltaForm::Recurrent,
            None,
        )
        .unwrap();
    }

    // GPU
    let up = |d: &[f32], c: usize| b.upload(d, n, c).unwrap();
    let mut gs: Vec<_> = s0
        .iter()
        .map(|s| {
            let mut st = b.new_recurrent_state(sh).unwrap();
            b.recurrent_state_from_host(&mut st, &vec![0.0; conv_len], s)
                .unwrap();
            st
        })
        .collect();
    let mut gout = b.zeros(n, vd);
    {
        let mut refs: Vec<_> = gs.iter_mut().collect();
        b.delta_rule_with(
            &up(&inp.q, kd),
            &up(&inp.k, kd),
            &up(&inp.v, vd),
            &up(&inp.g, hv),
            &up(&inp.b, hv),
            &rows,
            &mut refs,
            &mut gout,
            form,
        )
        .unwrap();
    }
    let out_err = rel_l2(&b.download(&gout), &cout.data);
    let mut st_err = 0.0f64;
    for (g, c) in gs.iter().zip(&cs) {
        let (_, s) = b.recurrent_state_to_host(g).unwrap();
        st_err = st_err.max(rel_l2(&s, &c.s));
    }
    (out_err, st_err)
}

const FORMS: [DeltaRuleForm; 4] = [
    DeltaRuleForm::Legacy,
    DeltaRuleForm::Recurrent,
    DeltaRuleForm::Chunked,
    DeltaRuleForm::Auto,
];

fn run_delta_cases(b: &CudaBackend, sh: &RecurrentShape, cases: &[(&[usize], bool)]) {
    let mut failures = Vec::new();
    for (ci, &(lens, interleave)) in cases.iter().enumerate() {
        for form in FORMS {
            let t = Instant::now();
            let (eo, es) = delta_case(b, sh, lens, interleave, form, 100 + ci as u64);
            let ok = eo <= TOL && es <= TOL && eo.is_finite() && es.is_finite();
            eprintln!(
                "{} hk={} hv={} dk={} dv={} lens={lens:?} interleave={interleave} {form:?}: out {eo:.2e} state {es:.2e} ({:.0} ms)",
                if ok { "ok  " } else { "FAIL" },
                sh.n_k_heads,
                sh.n_v_heads,
                sh.d_k,
                sh.d_v,
                t.elapsed().as_secs_f64() * 1e3
            );
            if !ok {
                failures.push(format!("{sh:?} {lens:?} {form:?}: {eo:.2e} {es:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "failures: {failures:#?}");
}

#[test]
fn delta_rule_small_heads_every_length() {
    let Some(b) = gpu() else { return };
    for sh in [
        shape(2, 6, 24, 20),
        shape(3, 3, 40, 72),
        shape(1, 2, 128, 96),
    ] {
        let cases: Vec<(&[usize], bool)> = vec![
            (&[1], false),
            (&[7], false),
            (&[63], false),
            (&[64], false),
            (&[65], false),
            (&[200], false),
            (&[513], false),
            (&[65, 1, 130], false),
            (&[40, 33], true),
        ];
        run_delta_cases(&b, &sh, &cases);
    }
}

#[test]
fn delta_rule_qwen35_27b_shape() {
    let Some(b) = gpu() else { return };
    let sh = shape(16, 48, 128, 128);
    let cases: Vec<(&[usize], bool)> = vec![
        (&[1], false),
        (&[7], false),
        (&[63], false),
        (&[64], false),
        (&[65], false),
        (&[200], false),
        (&[513], false),
        (&[1, 1, 1, 1], false),
        (&[100, 1, 37], false),
        (&[50, 50], true),
    ];
    run_delta_cases(&b, &sh, &cases);
}

/// conv1d: two sequences, a first call (window from zero) then a second call (window from the
/// first), parallel vs sequential vs the CPU.
#[test]
fn conv1d_parallel_matches_cpu() {
    let Some(b) = gpu() else { return };
    let mut rng = Lcg(7);
    for (ch, d_conv) in [(37usize, 4usize), (1024, 4), (10240, 4), (19, 2), (33, 1)] {
        let sh = RecurrentShape {
            d_conv,
            conv_channels: ch,
            ..shape(1, 1, 1, 1)
        };
        let w = rng.vec(ch * d_conv);
        let file = gguf_with(&[("conv", ch, d_conv, GgmlType::F32, &w)]);
        let wg = b.load_weight(&file, "conv").unwrap();
        for form in [
            Conv1dForm::Sequential,
            Conv1dForm::Parallel,
            Conv1dForm::Auto,
        ] {
            for interleave in [false, true] {
                let mut cs: Vec<CpuRecurrentState> = (0..2)
                    .map(|_| CpuRecurrentState::new(&sh).unwrap())
                    .collect();
                let mut gs: Vec<_> = (0..2)
                    .map(|_| b.new_recurrent_state(&sh).unwrap())
                    .collect();
                for (call, lens) in [[70usize, 2], [1, 130]].iter().enumerate() {
                    let starts = if call == 0 { [0, 0] } else { [70, 2] };
                    let rows = batch_rows(lens, &starts, interleave);
                    let n = rows.len();
                    let x = rng.vec(n * ch);
                    let mut cout = CpuTensor::zeros(n, ch);
                    {
                        let mut refs: Vec<&mut CpuRecurrentState> = cs.iter_mut().collect();
                        cpu_dn::conv1d(&cpu_t(n, ch, &x), &w, d_conv, &rows, &mut refs, &mut cout)
                            .unwrap();
                    }
                    let mut gout = b.zeros(n, ch);
                    {
                        let mut refs: Vec<_> = gs.iter_mut().collect();
                        b.conv1d_with(
                            &b.upload(&x, n, ch).unwrap(),
                            &wg,
                            &rows,
                            &mut refs,
                            &mut gout,
                            form,
                        )
                        .unwrap();
                    }
                    let e = rel_l2(&b.download(&gout), &cout.data);
                    assert!(
                        e <= 1e-6,
                        "conv1d ch={ch} d_conv={d_conv} {form:?} call {call}: {e:.2e}"
                    );
                    for (g, c) in gs.iter().zip(&cs) {
                        let (conv, _) = b.recurrent_state_to_host(g).unwrap();
                        let e = rel_l2(&conv, &c.conv);
                        assert!(
                            e <= 1e-6,
                            "conv1d window ch={ch} {form:?} call {call}: {e:.2e}"
                        );
                    }
                }
            }
        }
        eprintln!("ok   conv1d ch={ch} d_conv={d_conv}");
    }
}

/// A snapshot (state clone) taken before a chunked prefill and restored gives the same
/// outputs again (speculative rollback).
#[test]
fn snapshot_restore_then_chunked_again() {
    let Some(b) = gpu() else { return };
    let sh = shape(2, 4, 64, 64);
    let n = 150;
    let mut rng = Lcg(3);
    let inp = inputs(&sh, n, &mut rng);
    let rows: Vec<Row> = (0..n).map(|p| Row { seq: 0, pos: p }).collect();
    let (kd, vd, hv) = (128, 256, 4);
    let up = |d: &[f32], c: usize| b.upload(d, n, c).unwrap();
    let (q, k, v, g, be) = (
        up(&inp.q, kd),
        up(&inp.k, kd),
        up(&inp.v, vd),
        up(&inp.g, hv),
        up(&inp.b, hv),
    );
    let mut st = b.new_recurrent_state(&sh).unwrap();
    let run = |st: &mut cuda::backend::CudaRecurrentState| {
        let mut o = b.zeros(n, vd);
        b.delta_rule_with(
            &q,
            &k,
            &v,
            &g,
            &be,
            &rows,
            &mut [st],
            &mut o,
            DeltaRuleForm::Chunked,
        )
        .unwrap();
        b.download(&o)
    };
    let first = run(&mut st);
    let snap = st.clone();
    let second = run(&mut st);
    let after_second = b.recurrent_state_to_host(&st).unwrap().1;
    st.clone_from(&snap);
    let again = run(&mut st);
    assert_eq!(second, again, "restored snapshot gives other outputs");
    assert_eq!(after_second, b.recurrent_state_to_host(&st).unwrap().1);
    assert_ne!(first, second);
}

/// `REDLINE_DELTANET_BENCH=1`: one 512-token prefill of a Qwen3.5-27B DeltaNet layer's delta
/// rule per form, and conv1d sequential vs parallel (10240 channels).
#[test]
fn deltanet_prefill_timing() {
    if std::env::var("REDLINE_DELTANET_BENCH").as_deref() != Ok("1") {
        eprintln!("skipped: set REDLINE_DELTANET_BENCH=1");
        return;
    }
    let Some(b) = gpu() else { return };
    let sh = shape(16, 48, 128, 128);
    for n in [1usize, 16, 64, 512] {
        let mut rng = Lcg(9);
        let inp = inputs(&sh, n, &mut rng);
        let rows: Vec<Row> = (0..n).map(|p| Row { seq: 0, pos: p }).collect();
        let (kd, vd, hv) = (16 * 128, 48 * 128, 48);
        let up = |d: &[f32], c: usize| b.upload(d, n, c).unwrap();
        let (q, k, v, g, be) = (
            up(&inp.q, kd),
            up(&inp.k, kd),
            up(&inp.v, vd),
            up(&inp.g, hv),
            up(&inp.b, hv),
        );
        let mut st = b.new_recurrent_state(&sh).unwrap();
        let mut o = b.zeros(n, vd);
        for form in FORMS {
            let mut once = || {
                b.delta_rule_with(&q, &k, &v, &g, &be, &rows, &mut [&mut st], &mut o, form)
                    .unwrap();
            };
            once();
            b.device().synchronize().unwrap();
            let reps = 10;
            let t = Instant::now();
            for _ in 0..reps {
                once();
            }
            b.device().synchronize().unwrap();
            let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
            eprintln!("delta_rule n={n} {form:?}: {us:.1} us per layer");
        }
        let ch = sh.conv_channels;
        let w = rng.vec(ch * 4);
        let file = gguf_with(&[("conv", ch, 4, GgmlType::F32, &w)]);
        let wg = b.load_weight(&file, "conv").unwrap();
        let x = b.upload(&rng.vec(n * ch), n, ch).unwrap();
        let mut co = b.zeros(n, ch);
        for form in [Conv1dForm::Sequential, Conv1dForm::Parallel] {
            let mut once = || {
                b.conv1d_with(&x, &wg, &rows, &mut [&mut st], &mut co, form)
                    .unwrap();
            };
            once();
            b.device().synchronize().unwrap();
            let reps = 10;
            let t = Instant::now();
            for _ in 0..reps {
                once();
            }
            b.device().synchronize().unwrap();
            let us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
            eprintln!("conv1d n={n} {form:?}: {us:.1} us per layer");
        }
    }
}
