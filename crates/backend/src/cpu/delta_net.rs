//! Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention): the causal conv1d with its rolling
//! window, the gate transform, and the gated delta rule in two forms.
//!
//! Per value head h (key head `h % n_k_heads`, llama.cpp's GGUF head order) with state
//! S `[d_v, d_k]` (row j maps keys to value component j), for each token:
//!
//! ```text
//! S ← exp(g)·S
//! u = β (v − S k)            // [d_v]
//! S ← S + u kᵀ
//! o = S q / sqrt(d_k)
//! ```
//!
//! `delta_rule_recurrent` runs that loop token by token (the reference, and decode).
//! `delta_rule_chunked` processes a chunk of C tokens at once. With G_t the cumulative log
//! decay inside the chunk and S0 the state before it, unrolling the recurrence gives
//!
//! ```text
//! u_t = β_t (v_t − e^{G_t} S0 k_t) − Σ_{s<t} β_t e^{G_t−G_s} (k_t·k_s) u_s      (triangular solve)
//! o_t = e^{G_t} S0 q_t + Σ_{s≤t} e^{G_t−G_s} (k_s·q_t) u_s
//! S   = e^{G_C} S0 + Σ_s e^{G_C−G_s} u_s k_sᵀ
//! ```
//!
//! (the WY form transformers' `chunk_gated_delta_rule` and llama.cpp's
//! `build_delta_net_chunking` use): the state is read and written once per chunk instead of
//! once per token, and the rest are small dense products.

use rayon::prelude::*;
use std::sync::Mutex;

use super::elementwise::sigmoid;
use super::{check_shape, shape_err, CpuTensor};
use crate::{BackendError, RecurrentShape, Row};

/// Tokens per chunk of the chunked form (transformers and llama.cpp use 64).
pub const CHUNK: usize = 64;
/// Runs shorter than this go through the recurrent form.
const MIN_CHUNKED_RUN: usize = 4;

/// Recurrent state of one Gated DeltaNet layer for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuRecurrentState {
    pub shape: RecurrentShape,
    /// Last `d_conv - 1` conv inputs, oldest first: `[d_conv - 1][channels]`.
    pub conv: Vec<f32>,
    /// Delta-rule matrices: `[n_v_heads][d_v][d_k]`.
    pub s: Vec<f32>,
}

impl CpuRecurrentState {
    pub fn new(shape: &RecurrentShape) -> Result<CpuRecurrentState, BackendError> {
        if shape.d_conv == 0
            || shape.n_k_heads == 0
            || !shape.n_v_heads.is_multiple_of(shape.n_k_heads)
        {
            return Err(shape_err("recurrent state", format!("{shape:?}")));
        }
        let conv = (shape.d_conv - 1) * shape.conv_channels;
        let s = shape.n_v_heads * shape.d_v * shape.d_k;
        Ok(CpuRecurrentState {
            shape: *shape,
            conv: vec![0.0; conv],
            s: vec![0.0; s],
        })
    }

    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.s.len()) * 4
    }

    pub fn reset(&mut self) {
        self.conv.fill(0.0);
        self.s.fill(0.0);
    }
}

fn state<'a>(
    states: &'a mut [&mut CpuRecurrentState],
    seq: usize,
) -> Result<&'a mut CpuRecurrentState, BackendError> {
    let n_seqs = states.len();
    states
        .get_mut(seq)
        .map(|s| &mut **s)
        .ok_or(BackendError::BadSequence { seq, n_seqs })
}

/// See [`crate::Backend::conv1d`]. w: `[channels][d_conv]`.
pub fn conv1d(
    x: &CpuTensor,
    w: &[f32],
    d_conv: usize,
    rows: &[Row],
    states: &mut [&mut CpuRecurrentState],
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    let ch = x.cols;
    check_shape("conv1d", x, rows.len(), ch)?;
    check_shape("conv1d", out, rows.len(), ch)?;
    if w.len() != ch * d_conv || d_conv == 0 {
        return Err(shape_err(
            "conv1d",
            format!("kernel of {} for {ch} channels x {d_conv}", w.len()),
        ));
    }
    let win = d_conv - 1;
    for (r, row) in rows.iter().enumerate() {
        let st = state(states, row.seq)?;
        if st.shape.conv_channels != ch || st.shape.d_conv != d_conv {
            return Err(shape_err(
                "conv1d",
                format!("state {:?} for {ch} channels", st.shape),
            ));
        }
        let xr = x.row(r);
        let o = &mut out.data[r * ch..(r + 1) * ch];
        for c in 0..ch {
            let taps = &w[c * d_conv..(c + 1) * d_conv];
            let mut acc = taps[win] * xr[c];
            for (j, &tap) in taps[..win].iter().enumerate() {
                acc += tap * st.conv[j * ch + c];
            }
            o[c] = acc;
        }
        if win > 0 {
            st.conv.copy_within(ch.., 0);
            st.conv[(win - 1) * ch..].copy_from_slice(xr);
        }
    }
    Ok(())
}

#[inline]
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `alpha ← softplus(alpha + dt_bias) · a`, `beta ← sigmoid(beta)`; both `[n, n_v_heads]`.
pub fn gates(
    alpha: &mut CpuTensor,
    beta: &mut CpuTensor,
    dt_bias: &[f32],
    a: &[f32],
) -> Result<(), BackendError> {
    let h = alpha.cols;
    check_shape("delta_rule_gates", beta, alpha.rows, h)?;
    if dt_bias.len() != h || a.len() != h {
        return Err(shape_err(
            "delta_rule_gates",
            format!("{h} heads, dt_bias {}, a {}", dt_bias.len(), a.len()),
        ));
    }
    for row in alpha.data.chunks_exact_mut(h) {
        for ((x, &b), &aa) in row.iter_mut().zip(dt_bias).zip(a) {
            *x = softplus(*x + b) * aa;
        }
    }
    beta.data.iter_mut().for_each(|b| *b = sigmoid(*b));
    Ok(())
}

/// Inputs of one head over a run of tokens, gathered contiguous.
struct HeadRun {
    q: Vec<f32>, // [n][d_k], scaled
    k: Vec<f32>, // [n][d_k]
    v: Vec<f32>, // [n][d_v]
    g: Vec<f32>, // [n]
    b: Vec<f32>, // [n]
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Token-by-token gated delta rule for one head. s: `[d_v][d_k]`; returns o `[n][d_v]`.
pub fn head_recurrent(s: &mut [f32], d_k: usize, d_v: usize, h: &HeadRunRef) -> Vec<f32> {
    let n = h.g.len();
    let mut o = vec![0.0f32; n * d_v];
    for t in 0..n {
        let (q, k, v) = (
            &h.q[t * d_k..][..d_k],
            &h.k[t * d_k..][..d_k],
            &h.v[t * d_v..][..d_v],
        );
        let decay = h.g[t].exp();
        for (j, sj) in s.chunks_exact_mut(d_k).enumerate() {
            sj.iter_mut().for_each(|x| *x *= decay);
            let u = h.b[t] * (v[j] - dot(sj, k));
            sj.iter_mut().zip(k).for_each(|(x, &kk)| *x += u * kk);
            o[t * d_v + j] = dot(sj, q);
        }
    }
    o
}

/// Chunked gated delta rule for one head (see the module doc). Same contract as
/// [`head_recurrent`].
pub fn head_chunked(s: &mut [f32], d_k: usize, d_v: usize, h: &HeadRunRef) -> Vec<f32> {
    let n = h.g.len();
    let mut o = vec![0.0f32; n * d_v];
    let mut c0 = 0;
    while c0 < n {
        let c = CHUNK.min(n - c0);
        let q = &h.q[c0 * d_k..(c0 + c) * d_k];
        let k = &h.k[c0 * d_k..(c0 + c) * d_k];
        let v = &h.v[c0 * d_v..(c0 + c) * d_v];
        let b = &h.b[c0..c0 + c];
        // cumulative log decay inside the chunk
        let gc: Vec<f32> = h.g[c0..c0 + c]
            .iter()
            .scan(0.0f32, |acc, &g| {
                *acc += g;
                Some(*acc)
            })
            .collect();
        let kt = |t: usize| &k[t * d_k..(t + 1) * d_k];
        let qt = |t: usize| &q[t * d_k..(t + 1) * d_k];
        // u: [c][d_v] — solve the unit lower-triangular system row by row.
        let mut u = vec![0.0f32; c * d_v];
        for t in 0..c {
            let et = gc[t].exp();
            for (j, sj) in s.chunks_exact(d_k).enumerate() {
                u[t * d_v + j] = b[t] * (v[t * d_v + j] - et * dot(sj, kt(t)));
            }
            for sidx in 0..t {
                let a = b[t] * (gc[t] - gc[sidx]).exp() * dot(kt(t), kt(sidx));
                let (done, cur) = u.split_at_mut(t * d_v);
                let us = &done[sidx * d_v..(sidx + 1) * d_v];
                cur[..d_v]
                    .iter_mut()
                    .zip(us)
                    .for_each(|(x, &y)| *x -= a * y);
            }
        }
        // outputs
        for t in 0..c {
            let et = gc[t].exp();
            let ot = &mut o[(c0 + t) * d_v..(c0 + t + 1) * d_v];
            for (j, sj) in s.chunks_exact(d_k).enumerate() {
                ot[j] = et * dot(sj, qt(t));
            }
            for sidx in 0..=t {
                let a = (gc[t] - gc[sidx]).exp() * dot(kt(sidx), qt(t));
                ot.iter_mut()
                    .zip(&u[sidx * d_v..(sidx + 1) * d_v])
                    .for_each(|(x, &y)| *x += a * y);
            }
        }
        // state update
        let glast = gc[c - 1];
        let el = glast.exp();
        let w: Vec<f32> = (0..c).map(|t| (glast - gc[t]).exp()).collect();
        for (j, sj) in s.chunks_exact_mut(d_k).enumerate() {
            sj.iter_mut().for_each(|x| *x *= el);
            for t in 0..c {
                let f = w[t] * u[t * d_v + j];
                sj.iter_mut().zip(kt(t)).for_each(|(x, &kk)| *x += f * kk);
            }
        }
        c0 += c;
    }
    o
}

/// Borrowed view of [`HeadRun`].
pub struct HeadRunRef<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub b: &'a [f32],
}

impl HeadRun {
    fn as_ref(&self) -> HeadRunRef<'_> {
        HeadRunRef {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            b: &self.b,
        }
    }
}

/// Which form to use for a run of `n` tokens of one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaForm {
    Recurrent,
    Chunked,
    /// Chunked for runs of at least `MIN_CHUNKED_RUN` tokens.
    Auto,
}

/// See [`crate::Backend::delta_rule`].
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    g: &CpuTensor,
    beta: &CpuTensor,
    rows: &[Row],
    states: &mut [&mut CpuRecurrentState],
    out: &mut CpuTensor,
    team: Option<&quant::Team>,
) -> Result<(), BackendError> {
    delta_rule_with(q, k, v, g, beta, rows, states, out, DeltaForm::Auto, team)
}

/// [`delta_rule`] with the form chosen by the caller (tests compare the two), its per-head
/// work on `team` when given (one decode token: the caller and its spinning helpers, no
/// rayon hand-off), else on the current rayon pool.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_with(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    g: &CpuTensor,
    beta: &CpuTensor,
    rows: &[Row],
    states: &mut [&mut CpuRecurrentState],
    out: &mut CpuTensor,
    form: DeltaForm,
    team: Option<&quant::Team>,
) -> Result<(), BackendError> {
    let n = rows.len();
    let shape = match states.first() {
        Some(s) => s.shape,
        None if n == 0 => return Ok(()),
        None => {
            return Err(BackendError::BadSequence {
                seq: rows[0].seq,
                n_seqs: 0,
            })
        }
    };
    let RecurrentShape {
        n_k_heads,
        n_v_heads,
        d_k,
        d_v,
        ..
    } = shape;
    check_shape("delta_rule", q, n, n_k_heads * d_k)?;
    check_shape("delta_rule", k, n, n_k_heads * d_k)?;
    check_shape("delta_rule", v, n, n_v_heads * d_v)?;
    check_shape("delta_rule", g, n, n_v_heads)?;
    check_shape("delta_rule", beta, n, n_v_heads)?;
    check_shape("delta_rule", out, n, n_v_heads * d_v)?;
    let scale = 1.0 / (d_k as f32).sqrt();
    // Split the batch into runs of consecutive rows of one sequence.
    let mut start = 0;
    while start < n {
        let seq = rows[start].seq;
        let mut end = start + 1;
        while end < n && rows[end].seq == seq {
            end += 1;
        }
        let st = state(states, seq)?;
        if st.shape != shape {
            return Err(shape_err(
                "delta_rule",
                format!("state {:?} vs {shape:?}", st.shape),
            ));
        }
        let len = end - start;
        let chunked = match form {
            DeltaForm::Recurrent => false,
            DeltaForm::Chunked => true,
            DeltaForm::Auto => len >= MIN_CHUNKED_RUN,
        };
        let head = |h: usize, s: &mut [f32]| {
            let kh = h % n_k_heads;
            let gather = |t: &CpuTensor, off: usize, w: usize, sc: f32| -> Vec<f32> {
                (start..end)
                    .flat_map(|r| t.row(r)[off..off + w].iter().map(move |x| x * sc))
                    .collect()
            };
            let run = HeadRun {
                q: gather(q, kh * d_k, d_k, scale),
                k: gather(k, kh * d_k, d_k, 1.0),
                v: gather(v, h * d_v, d_v, 1.0),
                g: gather(g, h, 1, 1.0),
                b: gather(beta, h, 1, 1.0),
            };
            if chunked {
                head_chunked(s, d_k, d_v, &run.as_ref())
            } else {
                head_recurrent(s, d_k, d_v, &run.as_ref())
            }
        };
        let outs: Vec<Vec<f32>> = match team {
            Some(team) => {
                // one lock per head: uncontended, it only hands the head's &mut state over
                let heads: Vec<Mutex<&mut [f32]>> =
                    st.s.chunks_mut(d_v * d_k).map(Mutex::new).collect();
                team.map(heads.len(), |h| {
                    head(h, &mut heads[h].lock().unwrap_or_else(|e| e.into_inner()))
                })
            }
            None => {
                st.s.par_chunks_mut(d_v * d_k)
                    .enumerate()
                    .map(|(h, s)| head(h, s))
                    .collect()
            }
        };
        for (h, oh) in outs.iter().enumerate() {
            for t in 0..len {
                let dst = &mut out.data[(start + t) * n_v_heads * d_v + h * d_v..][..d_v];
                dst.copy_from_slice(&oh[t * d_v..(t + 1) * d_v]);
            }
        }
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn l2(v: &mut [f32], group: usize) {
        for g in v.chunks_exact_mut(group) {
            let n = g.iter().map(|x| x * x).sum::<f32>().sqrt();
            g.iter_mut().for_each(|x| *x /= n);
        }
    }

    /// Chunked vs token-by-token on random data, odd lengths (across chunk borders), two
    /// sequences interleaved, non-zero starting state.
    #[test]
    fn chunked_matches_recurrent() {
        let shape = RecurrentShape {
            d_conv: 4,
            conv_channels: 0,
            n_k_heads: 2,
            n_v_heads: 6,
            d_k: 24,
            d_v: 20,
        };
        let mut seed = 11u64;
        for &n in &[1usize, 5, 63, 64, 65, 150] {
            let mut gen = |len: usize| (0..len).map(|_| lcg(&mut seed)).collect::<Vec<f32>>();
            let mut qd = gen(n * 48);
            let mut kd = gen(n * 48);
            l2(&mut qd, 24);
            l2(&mut kd, 24);
            let vd = gen(n * 120);
            let gd: Vec<f32> = gen(n * 6).iter().map(|x| -(x.abs()) * 0.5).collect();
            let bd: Vec<f32> = gen(n * 6).iter().map(|x| sigmoid(*x * 3.0)).collect();
            let s0 = gen(6 * 20 * 24);
            let t = |d: &Vec<f32>, w: usize| CpuTensor::from_vec(n, w, d.clone()).unwrap();
            let rows: Vec<Row> = (0..n).map(|p| Row { seq: 0, pos: p }).collect();
            let mut results = Vec::new();
            for form in [DeltaForm::Recurrent, DeltaForm::Chunked] {
                let mut st = CpuRecurrentState::new(&shape).unwrap();
                st.s.copy_from_slice(&s0);
                let mut out = CpuTensor::zeros(n, 120);
                delta_rule_with(
                    &t(&qd, 48),
                    &t(&kd, 48),
                    &t(&vd, 120),
                    &t(&gd, 6),
                    &t(&bd, 6),
                    &rows,
                    &mut [&mut st],
                    &mut out,
                    form,
                    None,
                )
                .unwrap();
                results.push((out.data, st.s));
            }
            let rel = |a: &[f32], b: &[f32]| {
                let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
                let den: f32 = b.iter().map(|y| y * y).sum();
                (num / den.max(1e-30)).sqrt()
            };
            assert!(
                rel(&results[1].0, &results[0].0) < 1e-5,
                "n={n}: outputs differ"
            );
            assert!(
                rel(&results[1].1, &results[0].1) < 1e-5,
                "n={n}: states differ"
            );
        }
    }

    /// One decode token's heads on a 2-thread team give exactly the pool's outputs and
    /// state (the same per-head code), over several consecutive tokens.
    #[test]
    fn team_decode_matches_pool() {
        let shape = RecurrentShape {
            d_conv: 4,
            conv_channels: 0,
            n_k_heads: 2,
            n_v_heads: 6,
            d_k: 24,
            d_v: 20,
        };
        let team = quant::Team::new(2);
        let mut seed = 29u64;
        let mut gen = |len: usize| (0..len).map(|_| lcg(&mut seed)).collect::<Vec<f32>>();
        let s0 = gen(6 * 20 * 24);
        let mut pool = CpuRecurrentState::new(&shape).unwrap();
        let mut teamed = CpuRecurrentState::new(&shape).unwrap();
        pool.s.copy_from_slice(&s0);
        teamed.s.copy_from_slice(&s0);
        for pos in 0..4 {
            let mut qd = gen(48);
            let mut kd = gen(48);
            l2(&mut qd, 24);
            l2(&mut kd, 24);
            let vd = gen(120);
            let gd: Vec<f32> = gen(6).iter().map(|x| -(x.abs()) * 0.5).collect();
            let bd: Vec<f32> = gen(6).iter().map(|x| sigmoid(*x * 3.0)).collect();
            let t = |d: &Vec<f32>, w: usize| CpuTensor::from_vec(1, w, d.clone()).unwrap();
            let rows = [Row { seq: 0, pos }];
            let mut outs = Vec::new();
            for (st, tm) in [(&mut pool, None), (&mut teamed, Some(&team))] {
                let mut out = CpuTensor::zeros(1, 120);
                delta_rule(
                    &t(&qd, 48),
                    &t(&kd, 48),
                    &t(&vd, 120),
                    &t(&gd, 6),
                    &t(&bd, 6),
                    &rows,
                    &mut [st],
                    &mut out,
                    tm,
                )
                .unwrap();
                outs.push(out.data);
            }
            assert_eq!(outs[0], outs[1], "token {pos}: outputs differ");
            assert_eq!(pool.s, teamed.s, "token {pos}: states differ");
        }
    }

    #[test]
    fn conv1d_rolls_its_window_across_calls() {
        let shape = RecurrentShape {
            d_conv: 3,
            conv_channels: 2,
            n_k_heads: 1,
            n_v_heads: 1,
            d_k: 1,
            d_v: 1,
        };
        let mut st = CpuRecurrentState::new(&shape).unwrap();
        let w = [1.0, 10.0, 100.0, 2.0, 20.0, 200.0];
        let xs = [[1.0, 1.0], [2.0, 0.0], [3.0, -1.0]];
        let mut got = Vec::new();
        for (p, x) in xs.iter().enumerate() {
            let xt = CpuTensor::from_vec(1, 2, x.to_vec()).unwrap();
            let mut o = CpuTensor::zeros(1, 2);
            conv1d(
                &xt,
                &w,
                3,
                &[Row { seq: 0, pos: p }],
                &mut [&mut st],
                &mut o,
            )
            .unwrap();
            got.extend(o.data);
        }
        // channel 0: x = 1,2,3 → 100, 10+200, 1+20+300
        // channel 1: x = 1,0,-1 → 200, 20+0, 2+0-200
        assert_eq!(got, vec![100.0, 200.0, 210.0, 20.0, 321.0, -198.0]);
    }
}
