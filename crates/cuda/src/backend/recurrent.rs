//! Gated DeltaNet recurrent state on the device and its ops: conv1d with the rolling window,
//! the delta-rule gates and the gated delta rule (kernels/deltanet.cu, and the first kernels in
//! kernels/model_ops.cu that this file keeps as the `Legacy` form).
//!
//! A batch may mix sequences: rows are grouped by sequence (in batch order) and each group is
//! one run over its own state. How a run is computed:
//! - conv1d: one parallel launch over (token, channel) plus one launch that rolls the window,
//!   for runs of two or more tokens; one token keeps the single sequential launch.
//! - delta rule: runs of at least [`CHUNKED_MIN_RUN`] tokens outside a recorded decode step
//!   use the chunked (WY) form: `dn_chunk_prepare` over every (64-token chunk, head) at once,
//!   then `dn_chunk_state` walks the chunks per (head, 32 state rows). Shorter runs and decode
//!   steps use `dn_recurrent`, a warp per 4 state rows kept in registers across the run.
//!
//! These kernels are the default since they passed their GPU tests on the H200 (2026-12-02/03);
//! `REDLINE_CUDA_DELTANET=legacy` selects the sequential model_ops.cu kernels. The state layout is
//! the same for every form, so snapshots and decode steps do not care which form wrote it.

use std::sync::OnceLock;

use backend::{BackendError, RecurrentShape, Row};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::step::{dev_ptr, Mode};
use super::{dev_err, elems_cfg, shape_err, CudaBackend, CudaTensor, CudaWeight, HostInts};
use crate::pdl;
use crate::sources::Program;

/// Largest conv kernel (MO_CONV_MAX in model_ops.cu, the window array of dn_conv1d_state).
pub(super) const MAX_D_CONV: usize = 16;
/// Tokens per chunk of the chunked delta rule (DN_C).
const CHUNK: usize = 64;
/// Largest key head size of the chunked form (DN_MAX_DK); larger heads run recurrently.
const CHUNKED_MAX_DK: usize = 128;
/// State rows per `dn_chunk_state` block (DN_J).
const CHUNK_ROWS: usize = 32;
/// Largest key head size of `dn_recurrent` (32 * DN_REC_K).
const RECURRENT_MAX_DK: usize = 256;
/// State rows per `dn_recurrent` block (DN_REC_ROWS * DN_REC_WARPS).
const RECURRENT_BLOCK_ROWS: usize = 16;
/// Runs of at least this many tokens use the chunked form (its two launches cost about as
/// much as this many sequential tokens).
pub const CHUNKED_MIN_RUN: usize = 32;

/// One Gated DeltaNet layer's state of one sequence: the conv window `[d_conv - 1, channels]`
/// (oldest first) and the delta-rule matrices `[n_v_heads, d_v, d_k]`, f32. `Clone` copies on
/// the device (a snapshot); `clone_from` copies into the destination's own buffers when the
/// shapes agree, so a restored state keeps the addresses recorded decode steps point at
/// (`Backend::RESTORE_KEEPS_BUFFERS`).
pub struct CudaRecurrentState {
    conv: CudaSlice<f32>,
    s: CudaSlice<f32>,
    shape: RecurrentShape,
}

impl Clone for CudaRecurrentState {
    fn clone(&self) -> Self {
        CudaRecurrentState {
            conv: self.conv.clone(),
            s: self.s.clone(),
            shape: self.shape,
        }
    }

    fn clone_from(&mut self, src: &Self) {
        let same = self.shape == src.shape
            && self.conv.len() == src.conv.len()
            && self.s.len() == src.s.len();
        if !same {
            *self = src.clone();
            return;
        }
        // Device-to-device on the state's stream (the one every op of this backend uses).
        let stream = self.s.stream().clone();
        let copied = stream
            .memcpy_dtod(&src.conv, &mut self.conv)
            .and_then(|()| stream.memcpy_dtod(&src.s, &mut self.s));
        if copied.is_err() {
            // Same behaviour as `clone` (cudarc's CudaSlice::clone panics on a failed copy):
            // fall back to fresh buffers, which reports through the same path.
            *self = src.clone();
        }
    }
}

impl CudaRecurrentState {
    pub(super) fn bytes(&self) -> usize {
        4 * ((self.shape.d_conv.saturating_sub(1)) * self.shape.conv_channels
            + self.shape.n_v_heads * self.shape.d_v * self.shape.d_k)
    }
}

/// Which kernels run a sequence's rows of `delta_rule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaRuleForm {
    /// `mo_delta_rule` (model_ops.cu): a thread per state row, token by token.
    Legacy,
    /// `dn_recurrent`: token by token, a warp per 4 state rows.
    Recurrent,
    /// The chunked form for every run outside a decode step, whatever its length.
    Chunked,
    /// Chunked for runs of at least [`CHUNKED_MIN_RUN`] tokens, else `Recurrent`.
    Auto,
}

/// Which kernels run a sequence's rows of `conv1d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conv1dForm {
    /// `mo_conv1d`: a thread per channel walks the tokens.
    Sequential,
    /// `dn_conv1d_out` + `dn_conv1d_state`: a thread per (token, channel).
    Parallel,
    /// Parallel for two or more tokens.
    Auto,
}

/// The forms the `Backend` ops use: unset or `fast` → (Auto, Auto), `chunked` → (Chunked, Auto),
/// `legacy` / `off` → (Legacy, Sequential), the per-token kernels of model_ops.cu. Read once.
pub fn configured_forms() -> (DeltaRuleForm, Conv1dForm) {
    static FORMS: OnceLock<(DeltaRuleForm, Conv1dForm)> = OnceLock::new();
    *FORMS.get_or_init(|| match std::env::var("REDLINE_CUDA_DELTANET").as_deref() {
        Ok("fast") => (DeltaRuleForm::Auto, Conv1dForm::Auto),
        // every multi-token run chunked, whatever its length (tests on short prompts)
        Ok("chunked") => (DeltaRuleForm::Chunked, Conv1dForm::Auto),
        Ok("legacy") | Ok("off") => (DeltaRuleForm::Legacy, Conv1dForm::Sequential),
        _ => (DeltaRuleForm::Auto, Conv1dForm::Auto),
    })
}

/// Most rows per sequence `mo_conv1d_qkv_rows` takes (a speculative verify pass of up to 8
/// tokens; longer runs are prefill, where the separate ops' token-parallel conv is the better form).
const CONV_ROWS_MAX: usize = 8;

/// Row indices of each sequence, in batch order.
/// What a token-by-token launch (`mo_conv1d`, `dn_recurrent`, `mo_delta_rule`) walks: the
/// rows of one sequence with its state, or the runs of several sequences, each with its own
/// state through a table.
enum Runs<'a> {
    One {
        rows: &'a HostInts,
        n_rows: usize,
        state: u64,
    },
    Many(&'a SeqRuns),
}

/// The kernel arguments of [`Runs`]: rows, n_rows and state for one sequence (runs and tab
/// 0), or the concatenated rows, run offsets and state table (n_rows and state unused).
struct RunArgs {
    rows: u64,
    n_rows: i32,
    state: u64,
    runs: u64,
    tab: u64,
    n_seqs: u32,
}

impl Runs<'_> {
    fn args(&self) -> RunArgs {
        match self {
            Runs::One {
                rows,
                n_rows,
                state,
            } => RunArgs {
                rows: rows.ptr,
                n_rows: *n_rows as i32,
                state: *state,
                runs: 0,
                tab: 0,
                n_seqs: 1,
            },
            Runs::Many(r) => RunArgs {
                rows: r.rows.ptr,
                n_rows: 0,
                state: 0,
                runs: r.runs.ptr,
                tab: r.tab.ptr,
                n_seqs: r.n_seqs as u32,
            },
        }
    }
}

/// Rows, run offsets and a per-sequence pointer table on the device ([`CudaBackend::stage_runs`]).
struct SeqRuns {
    n_seqs: usize,
    rows: HostInts,
    runs: HostInts,
    tab: HostInts,
}

fn rows_by_seq(rows: &[Row], n_seqs: usize) -> Result<Vec<Vec<i32>>, BackendError> {
    let mut by = vec![Vec::new(); n_seqs];
    for (i, r) in rows.iter().enumerate() {
        by.get_mut(r.seq)
            .ok_or(BackendError::BadSequence { seq: r.seq, n_seqs })?
            .push(i as i32);
    }
    Ok(by)
}

fn check_cols(
    op: &'static str,
    t: &CudaTensor,
    rows: usize,
    cols: usize,
) -> Result<(), BackendError> {
    if (t.rows, t.cols) != (rows, cols) {
        return Err(shape_err(
            op,
            format!("[{}, {}], expected [{rows}, {cols}]", t.rows, t.cols),
        ));
    }
    Ok(())
}

/// A delta-rule gate weight (dt_bias or a): a dense vector of one value per value head.
fn gate_vector(w: &CudaWeight, h: usize) -> Result<&CudaSlice<f32>, BackendError> {
    match &w.dense {
        Some(d) if w.rows * w.cols == h => Ok(d),
        _ => Err(shape_err(
            "delta_rule_gates",
            format!("weight [{}, {}] for {h} heads", w.rows, w.cols),
        )),
    }
}

fn blocks_1d(n: usize, threads: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(threads) as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    fn deltanet_function(&self, name: &str) -> Result<cudarc::driver::CudaFunction, BackendError> {
        self.dev.function(Program::DeltaNet, name).map_err(dev_err)
    }

    pub(super) fn new_recurrent_state_rec(
        &self,
        shape: &RecurrentShape,
    ) -> Result<CudaRecurrentState, BackendError> {
        if shape.d_conv == 0 || shape.d_conv > MAX_D_CONV || shape.n_k_heads == 0 {
            return Err(shape_err(
                "new_recurrent_state",
                format!("{shape:?} (d_conv 1..={MAX_D_CONV})"),
            ));
        }
        let conv = self.alloc_f32((shape.d_conv - 1) * shape.conv_channels)?;
        let s = self.alloc_f32(shape.n_v_heads * shape.d_v * shape.d_k)?;
        Ok(CudaRecurrentState {
            conv,
            s,
            shape: *shape,
        })
    }

    pub(super) fn reset_recurrent_state_rec(&self, st: &mut CudaRecurrentState) {
        // The trait's reset cannot fail; a lost device here is fatal.
        let stream = self.dev.stream();
        stream
            .memset_zeros(&mut st.conv)
            .and_then(|_| stream.memset_zeros(&mut st.s))
            .unwrap_or_else(|e| panic!("cuda reset_recurrent_state: {e}"));
    }

    /// A state's conv window `[d_conv - 1, channels]` and delta-rule matrices
    /// `[n_v_heads, d_v, d_k]` on the host (tests; waits for the stream).
    pub fn recurrent_state_to_host(
        &self,
        st: &CudaRecurrentState,
    ) -> Result<(Vec<f32>, Vec<f32>), BackendError> {
        let stream = self.dev.stream();
        let mut conv = stream.clone_dtoh(&st.conv).map_err(dev_err)?;
        conv.truncate((st.shape.d_conv - 1) * st.shape.conv_channels);
        let mut s = stream.clone_dtoh(&st.s).map_err(dev_err)?;
        s.truncate(st.shape.n_v_heads * st.shape.d_v * st.shape.d_k);
        Ok((conv, s))
    }

    /// Overwrites a state with host values laid out as [`Self::recurrent_state_to_host`]
    /// returns them.
    pub fn recurrent_state_from_host(
        &self,
        st: &mut CudaRecurrentState,
        conv: &[f32],
        s: &[f32],
    ) -> Result<(), BackendError> {
        let sh = st.shape;
        if conv.len() != (sh.d_conv - 1) * sh.conv_channels
            || s.len() != sh.n_v_heads * sh.d_v * sh.d_k
        {
            return Err(shape_err(
                "recurrent_state_from_host",
                format!("{} + {} values for {sh:?}", conv.len(), s.len()),
            ));
        }
        let stream = self.dev.stream();
        if !conv.is_empty() {
            stream
                .memcpy_htod(conv, &mut st.conv.slice_mut(..conv.len()))
                .map_err(dev_err)?;
        }
        if !s.is_empty() {
            stream
                .memcpy_htod(s, &mut st.s.slice_mut(..s.len()))
                .map_err(dev_err)?;
        }
        Ok(())
    }

    /// `Backend::conv1d` with the form chosen by the caller (tests compare the forms).
    pub fn conv1d_with(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
        form: Conv1dForm,
    ) -> Result<(), BackendError> {
        let n = rows.len();
        let ch = x.cols;
        check_cols("conv1d x", x, n, ch)?;
        check_cols("conv1d out", out, n, ch)?;
        let wd = match &w.dense {
            Some(d) if w.rows == ch => d,
            _ => {
                return Err(shape_err(
                    "conv1d",
                    format!("weight [{}, {}] for {ch} channels", w.rows, w.cols),
                ))
            }
        };
        let d_conv = w.cols;
        for st in states.iter() {
            if st.shape.conv_channels != ch || st.shape.d_conv != d_conv {
                return Err(shape_err(
                    "conv1d",
                    format!("state {:?} for {ch} channels, d_conv {d_conv}", st.shape),
                ));
            }
        }
        let by_seq = rows_by_seq(rows, states.len())?;
        let parallel_for = |n: usize| match form {
            Conv1dForm::Sequential => false,
            Conv1dForm::Parallel => true,
            Conv1dForm::Auto => n >= 2,
        };
        let used: Vec<&Vec<i32>> = by_seq.iter().filter(|i| !i.is_empty()).collect();
        if ch > 0
            && used.len() >= 2
            && super::sequence::batched_seqs()
            && used.iter().all(|i| !parallel_for(i.len()))
        {
            let stream = self.dev.stream();
            let runs = self.stage_runs(&by_seq, |s| dev_ptr(&states[s].conv, stream))?;
            if self.replaying() {
                return Ok(());
            }
            return self.conv1d_sequential(x, wd, Runs::Many(&runs), out, ch, d_conv);
        }
        for (s, idx) in by_seq.iter().enumerate() {
            if idx.is_empty() || ch == 0 {
                continue;
            }
            let row_ids = self.host_ints(idx)?;
            if self.replaying() {
                continue;
            }
            let parallel = parallel_for(idx.len());
            let st = &mut *states[s];
            if parallel {
                self.conv1d_parallel(x, wd, &row_ids, idx.len(), &mut st.conv, out, ch, d_conv)?;
            } else {
                let one = Runs::One {
                    rows: &row_ids,
                    n_rows: idx.len(),
                    state: dev_ptr(&st.conv, self.dev.stream()),
                };
                self.conv1d_sequential(x, wd, one, out, ch, d_conv)?;
            }
        }
        Ok(())
    }

    /// `mo_conv1d`: a thread per channel walks the rows of one sequence, or with
    /// [`Runs::Many`] of each sequence (grid.y) with its own state.
    fn conv1d_sequential(
        &self,
        x: &CudaTensor,
        wd: &CudaSlice<f32>,
        runs: Runs,
        out: &mut CudaTensor,
        ch: usize,
        d_conv: usize,
    ) -> Result<(), BackendError> {
        let f = self.function("mo_conv1d")?;
        let a = runs.args();
        let ints = [a.n_rows, ch as i32, d_conv as i32];
        let cfg = LaunchConfig {
            grid_dim: (ch.div_ceil(128) as u32, a.n_seqs, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&*x.data)
            .arg(wd)
            .arg(&a.rows)
            .arg(&ints[0])
            .arg(&a.state)
            .arg(&mut *out.data)
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&a.runs)
            .arg(&a.tab);
        // SAFETY: matches mo_conv1d(x, w, rows, n_rows, state, out, ch, d_conv, runs, tab)
        // (RunArgs: one sequence's rows and state, or the per-sequence runs and state table);
        // w is [ch, d_conv], every state [d_conv - 1, ch] (checked by the caller), d_conv <= 16
        // (checked at creation), rows index rows of x and out (checked shapes).
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn conv1d_parallel(
        &self,
        x: &CudaTensor,
        wd: &CudaSlice<f32>,
        row_ids: &HostInts,
        n_rows: usize,
        conv: &mut CudaSlice<f32>,
        out: &mut CudaTensor,
        ch: usize,
        d_conv: usize,
    ) -> Result<(), BackendError> {
        let f = self.deltanet_function("dn_conv1d_out")?;
        let cfg = LaunchConfig {
            grid_dim: (ch.div_ceil(256) as u32, n_rows.min(65535) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = self.dev.stream();
        let pdl_on = pdl::enabled(self.dev.arch());
        let (px, prows, pstate) = (dev_ptr(&x.data, stream), row_ids.ptr, dev_ptr(conv, stream));
        let (n_i, ch_i, dc_i) = (n_rows as i32, ch as i32, d_conv as i32);
        let mut a = pdl::Args::new();
        a.push(px)
            .push(dev_ptr(wd, stream))
            .push(prows)
            .push(n_i)
            .push(pstate)
            .push(dev_ptr(&out.data, stream))
            .push(ch_i)
            .push(dc_i);
        // SAFETY: matches dn_conv1d_out(x, w, rows, n_rows, state, out, ch, d_conv): w is
        // [ch, d_conv], the state [d_conv - 1, ch], rows index rows of x and out; the kernel
        // loops over tokens beyond the grid's 65535. With PDL it reads only w before waiting.
        unsafe { a.launch(stream, &f, cfg, pdl_on) }.map_err(dev_err)?;
        let f = self.deltanet_function("dn_conv1d_state")?;
        let mut a = pdl::Args::new();
        a.push(px)
            .push(prows)
            .push(n_i)
            .push(pstate)
            .push(ch_i)
            .push(dc_i);
        // SAFETY: matches dn_conv1d_state(x, rows, n_rows, state, ch, d_conv); runs after
        // dn_conv1d_out on the same stream (it reads the old window, and with PDL this kernel
        // waits for it to finish before touching anything); d_conv <= 16.
        unsafe { a.launch(stream, &f, blocks_1d(ch, 256), pdl_on) }.map_err(dev_err)?;
        Ok(())
    }

    /// [`backend::Backend::conv1d_qkv`]: one `mo_conv1d_qkv` launch where it applies
    /// ([`Self::conv1d_qkv_takes`]), else the ops one by one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv1d_qkv_rec(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        norm: (usize, usize, f32),
        offsets: &[usize],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        let Some(by_seq) = self.conv1d_qkv_takes(x, w, rows, states, norm, offsets, outs)? else {
            return backend::conv1d_qkv_each(self, x, w, rows, states, norm, offsets, outs);
        };
        self.timed(
            || "conv1d_qkv".to_string(),
            || self.conv1d_qkv_fused(x, w, &by_seq, states, norm, offsets, outs, None),
        )
    }

    /// [`backend::Backend::in_proj_conv1d_qkv`]: the products, then the conv chain; where the
    /// chain takes one `mo_conv1d_qkv` launch (one row per sequence) with a norm group of 32,
    /// 64, 128 or 256, channels and normed channels in whole 256s, and the switch is on
    /// ([`super::fused::CONV_GATES`]), the f32 products
    /// after the first (Qwen3.5's alpha / beta, which only the delta rule reads) ride in that
    /// launch (`mo_conv1d_qkv_gates`: their rows as `mo_matvec_f32_rows` computes them, the
    /// same bits) and the others take `matmul_many`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn in_proj_conv_rec(
        &self,
        h: &CudaTensor,
        ws: &[&CudaWeight],
        projs: &mut [&mut CudaTensor],
        w: &CudaWeight,
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        norm: (usize, usize, f32),
        offsets: &[usize],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        use backend::Backend;
        if ws.is_empty() || ws.len() != projs.len() {
            return Err(shape_err(
                "in_proj_conv1d_qkv",
                format!("{} weights, {} outputs", ws.len(), projs.len()),
            ));
        }
        // the launch's blocks are the rows' 256 threads: whole blocks of channels and of normed
        // channels, whole norm groups in a block
        let ride: Vec<usize> = if super::fused::CONV_GATES.on()
            && self.fused()
            && [32, 64, 128, 256].contains(&norm.1)
            && projs[0].cols.is_multiple_of(256)
            && norm.0.is_multiple_of(256)
        {
            (1..ws.len())
                .filter(|&i| self.f32_rows_take(ws[i], h, projs[i]))
                .collect()
        } else {
            Vec::new()
        };
        let by_seq = if ride.is_empty() || ride.len() > super::fused::F32_MAX_SEGS {
            None
        } else {
            self.conv1d_qkv_takes(projs[0], w, rows, states, norm, offsets, outs)?
                .filter(|b| b.iter().all(|r| r.len() <= 1))
        };
        let Some(by_seq) = by_seq else {
            self.matmul_many(ws, &[], h, projs)?;
            self.pass_prefetch_on();
            return self.conv1d_qkv(projs[0], w, rows, states, norm, offsets, outs);
        };
        {
            let (rest_ws, mut rest): (Vec<&CudaWeight>, Vec<&mut CudaTensor>) = ws
                .iter()
                .zip(projs.iter_mut())
                .enumerate()
                .filter(|(i, _)| !ride.contains(i))
                .map(|(_, (w, p))| (*w, &mut **p))
                .unzip();
            self.matmul_many(&rest_ws, &[], h, &mut rest)?;
        }
        self.pass_prefetch_on();
        let gates = self.f32_rows_segs(&ride, ws, h, projs);
        let gx = super::step::dev_ptr(&*h.data, self.dev.stream());
        self.conv_gates
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.timed(
            || "conv1d_qkv+gates".to_string(),
            || {
                self.conv1d_qkv_fused(
                    projs[0],
                    w,
                    &by_seq,
                    states,
                    norm,
                    offsets,
                    outs,
                    Some((gates.0, gates.1, gx)),
                )
            },
        )
    }

    /// The batch rows by sequence when one launch takes the chain: the fused paths on
    /// (`REDLINE_FUSED_CONV=0` turns just this off), one row per sequence (a decode step) or,
    /// with `StagedFusions::conv_rows`, up to `CONV_ROWS_MAX` (norm groups of at most 256), f32
    /// taps of at most `MO_CONV_MAX`, norm groups of 32..=1024 (a multiple of 32) that divide
    /// the channels, the normed columns and three contiguous outputs covering them. Shapes
    /// only, so every step of one recorded key decides alike.
    #[allow(clippy::too_many_arguments)]
    fn conv1d_qkv_takes(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        rows: &[Row],
        states: &[&mut CudaRecurrentState],
        norm: (usize, usize, f32),
        offsets: &[usize],
        outs: &[&mut CudaTensor],
    ) -> Result<Option<Vec<Vec<i32>>>, BackendError> {
        static ON: OnceLock<bool> = OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("REDLINE_FUSED_CONV").map_or(true, |v| v != "0"));
        let (n, ch) = (rows.len(), x.cols);
        let (norm_cols, group, _) = norm;
        if !on || !self.fused() || n == 0 || x.rows != n || ch == 0 {
            return Ok(None);
        }
        let by_seq = rows_by_seq(rows, states.len())?;
        let widths: Vec<usize> = outs.iter().map(|o| o.cols).collect();
        // several rows of a sequence (mo_conv1d_qkv_rows, StagedFusions::conv_rows): groups of at
        // most 256 (mo_l2_norm's block size: one element per thread, the same sum order)
        let most = by_seq.iter().map(Vec::len).max().unwrap_or(0);
        let rows_ok =
            most <= 1 || (self.staged().conv_rows && most <= CONV_ROWS_MAX && group <= 256);
        let takes = rows_ok
            && w.dense.is_some()
            && w.rows == ch
            && (1..=MAX_D_CONV).contains(&w.cols)
            && states
                .iter()
                .all(|s| (s.shape.conv_channels, s.shape.d_conv) == (ch, w.cols))
            && group.is_multiple_of(32)
            && (32..=1024).contains(&group)
            && ch.is_multiple_of(group)
            && norm_cols.is_multiple_of(group)
            && norm_cols <= ch
            && outs.len() == 3
            && offsets == [0, widths[0], widths[0] + widths[1]]
            && widths.iter().sum::<usize>() == ch
            && widths.iter().all(|w| w.is_multiple_of(group))
            && outs.iter().all(|o| o.rows == n);
        Ok(takes.then_some(by_seq))
    }

    /// The `mo_conv1d_qkv` launch, or `mo_conv1d_qkv_rows` when a sequence has several rows;
    /// `by_seq`: the batch rows of each sequence. `gates` (one row per sequence only): f32
    /// products that ride in the launch (`mo_conv1d_qkv_gates`: their segments, rows and x).
    #[allow(clippy::too_many_arguments)]
    fn conv1d_qkv_fused(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        by_seq: &[Vec<i32>],
        states: &mut [&mut CudaRecurrentState],
        norm: (usize, usize, f32),
        offsets: &[usize],
        outs: &mut [&mut CudaTensor],
        gates: Option<(super::fused::F32Segs, usize, u64)>,
    ) -> Result<(), BackendError> {
        let (ch, d_conv) = (x.cols, w.cols);
        let (norm_cols, group, eps) = norm;
        let stream = self.dev.stream();
        let used: Vec<usize> = (0..by_seq.len())
            .filter(|&s| !by_seq[s].is_empty())
            .collect();
        // the same staging calls in every mode of a step (a replay re-stages them)
        let (a, _one_rows, _runs) = if used.len() == 1 {
            let r = self.host_ints(&by_seq[used[0]])?;
            let a = Runs::One {
                rows: &r,
                n_rows: by_seq[used[0]].len(),
                state: dev_ptr(&states[used[0]].conv, stream),
            }
            .args();
            (a, Some(r), None)
        } else {
            let runs = self.stage_runs(by_seq, |s| dev_ptr(&states[s].conv, stream))?;
            (Runs::Many(&runs).args(), None, Some(runs))
        };
        self.fused_conv
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.replaying() {
            return Ok(());
        }
        // a prefetch hint given right before this op: the out-projection's weights
        self.issue_prefetch(u64::MAX)?;
        let wd = w.dense.as_ref().expect("checked by conv1d_qkv_takes");
        let several = by_seq.iter().any(|i| i.len() > 1);
        if several && gates.is_some() {
            return Err(shape_err(
                "conv1d_qkv",
                "f32 products ride only in a launch of one row per sequence".into(),
            ));
        }
        let f = self.function(match (several, gates.is_some()) {
            (true, _) => "mo_conv1d_qkv_rows",
            (false, true) => "mo_conv1d_qkv_gates",
            (false, false) => "mo_conv1d_qkv",
        })?;
        // with gates: blocks of the rows' 256 threads, several norm groups a conv block
        let block = if gates.is_some() { 256 } else { group };
        let cfg = LaunchConfig {
            grid_dim: ((ch / block + gates.map_or(0, |g| g.1)) as u32, a.n_seqs, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut p = pdl::Args::new();
        p.push(dev_ptr(&x.data, stream))
            .push(dev_ptr(wd, stream))
            .push(a.rows);
        if several {
            p.push(a.n_rows);
        }
        p.push(a.state)
            .push(ch as i32)
            .push(d_conv as i32)
            .push(a.runs)
            .push(a.tab)
            .push(norm_cols as i32);
        if gates.is_some() {
            p.push(group as i32);
        }
        p.push(eps);
        for o in outs.iter() {
            p.push(dev_ptr(&o.data, stream));
        }
        p.push(offsets[1] as i32)
            .push(offsets[2] as i32)
            .push(outs[0].cols as i32)
            .push(outs[1].cols as i32)
            .push(outs[2].cols as i32);
        if let Some((segs, _, gx)) = gates {
            p.push_struct(segs).push(gx);
        }
        // SAFETY: matches mo_conv1d_qkv(x, w, rows, state, ch, d_conv, runs, tab, norm_cols,
        // eps, o0, o1, o2, off1, off2, w0, w1, w2), or with `several` mo_conv1d_qkv_rows (the
        // same with n_rows after rows; up to CONV_ROWS_MAX rows per sequence, its rows / n_rows
        // or runs / tab), or with `gates` mo_conv1d_qkv_gates (the same with the group after
        // norm_cols and F32Segs and their x after w2: live f32 matrices of cols % 4 == 0 and
        // their outputs, f32_rows_take checked by in_proj_conv_rec for x's 1..=8 rows; blocks of
        // 256 threads over ch and norm_cols in whole 256s, the group of 32..=256 dividing 256);
        // one row per sequence with its state
        // [d_conv - 1, ch] (one sequence: rows / state; several: runs / tab), w [ch, d_conv]
        // with d_conv <= MO_CONV_MAX, the block (the norm group, a multiple of 32) divides ch,
        // norm_cols and each output's range, outputs contiguous over [0, ch) with their rows
        // indexed like x's (conv1d_qkv_takes). Before its wait the kernel reads only the taps,
        // the host's rows / runs / tab and the window, which only this layer's conv writes (in
        // earlier steps: kernels two launches back have finished when it starts).
        unsafe { p.launch(stream, &f, cfg, pdl::enabled(self.dev.arch())) }.map_err(dev_err)?;
        Ok(())
    }

    pub(super) fn delta_rule_gates_rec(
        &self,
        alpha: &mut CudaTensor,
        beta: &mut CudaTensor,
        dt_bias: &CudaWeight,
        a: &CudaWeight,
    ) -> Result<(), BackendError> {
        let h = alpha.cols;
        if (beta.rows, beta.cols) != (alpha.rows, h) {
            return Err(shape_err(
                "delta_rule_gates",
                format!(
                    "alpha [{}, {h}], beta [{}, {}]",
                    alpha.rows, beta.rows, beta.cols
                ),
            ));
        }
        let (dt, av) = (gate_vector(dt_bias, h)?, gate_vector(a, h)?);
        let n = alpha.rows * h;
        if n == 0 {
            return Ok(());
        }
        let f = self.function("mo_delta_gates")?;
        let stream = self.dev.stream();
        let mut a = pdl::Args::new();
        a.push(dev_ptr(&alpha.data, stream))
            .push(dev_ptr(&beta.data, stream))
            .push(dev_ptr(dt, stream))
            .push(dev_ptr(av, stream))
            .push(n as i64)
            .push(h as i32);
        // SAFETY: matches mo_delta_gates(alpha, beta, dt_bias, a, n, n_heads); shapes checked.
        // With PDL it reads only dt_bias and a before waiting for the previous kernel.
        let on = pdl::enabled(self.dev.arch());
        unsafe { a.launch(stream, &f, elems_cfg(n), on) }.map_err(dev_err)?;
        Ok(())
    }

    /// `Backend::delta_rule` with the form chosen by the caller (tests compare the forms).
    #[allow(clippy::too_many_arguments)]
    pub fn delta_rule_with(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        g: &CudaTensor,
        beta: &CudaTensor,
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
        form: DeltaRuleForm,
    ) -> Result<(), BackendError> {
        let io = (q, k, v, g, beta);
        self.delta_rule_run(io, (0, 0), rows, states, out, form, None)
    }

    /// Whether a sequence's run of `n` rows takes the chunked form.
    fn chunked_run(&self, sh: &RecurrentShape, n: usize, form: DeltaRuleForm) -> bool {
        self.mode() == Mode::Off
            && sh.d_k <= CHUNKED_MAX_DK
            && match form {
                DeltaRuleForm::Chunked => true,
                DeltaRuleForm::Auto => n >= CHUNKED_MIN_RUN,
                DeltaRuleForm::Legacy | DeltaRuleForm::Recurrent => false,
            }
    }

    /// The token-by-token kernel of a shape and form.
    fn recurrent_kernel(sh: &RecurrentShape, form: DeltaRuleForm) -> &'static str {
        if form == DeltaRuleForm::Legacy || sh.d_k > RECURRENT_MAX_DK {
            "mo_delta_rule"
        } else {
            "dn_recurrent"
        }
    }

    /// Whether every run of a `delta_rule_gated` call goes to `dn_recurrent`, which can
    /// compute the gates itself.
    fn gates_fusable(
        &self,
        rows: &[Row],
        states: &[&mut CudaRecurrentState],
        form: DeltaRuleForm,
    ) -> bool {
        let Some(sh) = states.first().map(|s| s.shape) else {
            return false;
        };
        if Self::recurrent_kernel(&sh, form) != "dn_recurrent" {
            return false;
        }
        rows_by_seq(rows, states.len()).is_ok_and(|by| {
            by.iter()
                .all(|i| i.is_empty() || !self.chunked_run(&sh, i.len(), form))
        })
    }

    /// The delta rule; with `gates` set (dt_bias and a), g and beta are the raw projections,
    /// and every run must take `dn_recurrent` ([`CudaBackend::gates_fusable`]); with `norm`,
    /// `dn_recurrent` also runs the gated norm (delta_rule_gated_norm_rec's checks).
    #[allow(clippy::too_many_arguments)]
    fn delta_rule_run(
        &self,
        (q, k, v, g, beta): (
            &CudaTensor,
            &CudaTensor,
            &CudaTensor,
            &CudaTensor,
            &CudaTensor,
        ),
        gates: (u64, u64),
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
        form: DeltaRuleForm,
        norm: Option<GatedNormArgs>,
    ) -> Result<(), BackendError> {
        let n = rows.len();
        let Some(sh) = states.first().map(|s| s.shape) else {
            return if n == 0 {
                Ok(())
            } else {
                Err(BackendError::BadSequence { seq: 0, n_seqs: 0 })
            };
        };
        if states.iter().any(|s| s.shape != sh) {
            return Err(shape_err("delta_rule", "states of different shapes".into()));
        }
        check_cols("delta_rule q", q, n, sh.n_k_heads * sh.d_k)?;
        check_cols("delta_rule k", k, n, sh.n_k_heads * sh.d_k)?;
        check_cols("delta_rule v", v, n, sh.n_v_heads * sh.d_v)?;
        check_cols("delta_rule g", g, n, sh.n_v_heads)?;
        check_cols("delta_rule beta", beta, n, sh.n_v_heads)?;
        check_cols("delta_rule out", out, n, sh.n_v_heads * sh.d_v)?;
        let io = DeltaIo {
            q,
            k,
            v,
            g,
            beta,
            sh,
            gates,
            norm,
        };
        let by_seq = rows_by_seq(rows, states.len())?;
        let chunked_for = |n: usize| self.chunked_run(&sh, n, form);
        let kernel = Self::recurrent_kernel(&sh, form);
        let used: Vec<&Vec<i32>> = by_seq.iter().filter(|i| !i.is_empty()).collect();
        if gates != (0, 0)
            && (kernel != "dn_recurrent" || used.iter().any(|i| chunked_for(i.len())))
        {
            return Err(shape_err(
                "delta_rule",
                "raw gates need dn_recurrent for every run".into(),
            ));
        }
        if kernel == "dn_recurrent"
            && sh.n_v_heads > 0
            && sh.d_v > 0
            && used.len() >= 2
            && super::sequence::batched_seqs()
            && used.iter().all(|i| !chunked_for(i.len()))
        {
            let stream = self.dev.stream();
            let runs = self.stage_runs(&by_seq, |s| dev_ptr(&states[s].s, stream))?;
            if self.replaying() {
                return Ok(());
            }
            return self.delta_rule_recurrent(kernel, &io, Runs::Many(&runs), out);
        }
        for (s, idx) in by_seq.iter().enumerate() {
            if idx.is_empty() || sh.n_v_heads == 0 || sh.d_v == 0 {
                continue;
            }
            let chunked = chunked_for(idx.len());
            let row_ids = self.host_ints(idx)?;
            if self.replaying() {
                continue;
            }
            let st = &mut states[s].s;
            if chunked {
                self.delta_rule_chunked(&io, &row_ids, idx.len(), st, out)?;
            } else {
                let one = Runs::One {
                    rows: &row_ids,
                    n_rows: idx.len(),
                    state: dev_ptr(st, self.dev.stream()),
                };
                self.delta_rule_recurrent(kernel, &io, one, out)?;
            }
        }
        Ok(())
    }

    /// `Backend::delta_rule_gated_norm`: with the staged `dn_norm` fusion (and the gate and
    /// norm-q8 fusions it builds on) on, every run on `dn_recurrent` and value heads of 128
    /// (its block's threads: the separate norm's block size, so the same sum order), one
    /// launch runs the gates, the rule, and the gated norm with out's q8_1 copy (the last of
    /// each head's blocks; kernels/deltanet.cu `dn_gated_norm_tail`). `Ok(false)`: not taken,
    /// nothing done.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn delta_rule_gated_norm_rec(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        alpha: &mut CudaTensor,
        beta: &mut CudaTensor,
        (dt_bias, a): (&CudaWeight, &CudaWeight),
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
        (w, z, eps): (&CudaWeight, &CudaTensor, f32),
    ) -> Result<bool, BackendError> {
        let st = self.staged();
        let (form, _) = configured_forms();
        let Some(sh) = states.first().map(|s| s.shape) else {
            return Ok(false);
        };
        let Some(wv) = w.dense.as_ref() else {
            return Ok(false);
        };
        let n_seqs = rows_by_seq(rows, states.len()).map_or(usize::MAX, |by| by.len());
        let takes = self.fused()
            && st.dn_norm
            && st.gates
            && st.norm_q8
            && self.gates_fusable(rows, states, form)
            // one value per thread of dn_recurrent's 32 x 4 block (whole blocks of 16 rows)
            && sh.d_v == 4 * 32;
        if !takes
            || w.rows * w.cols != sh.d_v
            || (z.rows, z.cols) != (out.rows, out.cols)
            || out.cols != sh.n_v_heads * sh.d_v
            || !(1..=crate::matvec::MAX_TOKENS_PER_LAUNCH).contains(&out.rows)
            || n_seqs.saturating_mul(sh.n_v_heads) > DN_COUNTERS
        {
            return Ok(false);
        }
        let stream = self.dev.stream();
        let cnt = {
            let mut c = self.dn_counters.lock().unwrap_or_else(|e| e.into_inner());
            if c.is_none() {
                if self.mode() == Mode::Capture {
                    // (a capture follows its key's eager run, which made them)
                    return Ok(false);
                }
                *c = Some(stream.alloc_zeros::<u32>(DN_COUNTERS).map_err(dev_err)?);
            }
            dev_ptr(c.as_ref().expect("made above"), stream)
        };
        let h = alpha.cols;
        let (dt, av) = (gate_vector(dt_bias, h)?, gate_vector(a, h)?);
        let gates = (dev_ptr(dt, stream), dev_ptr(av, stream));
        let (wp, zp) = (dev_ptr(wv, stream), dev_ptr(&*z.data, stream));
        let io = (q, k, v, &*alpha, &*beta);
        self.fused_gates
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.dn_norm
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // (the gated norm with its q8_1 copy: counted as the separate one's fusion too)
        self.norm_q8
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.timed(
            || "delta_rule_gated".to_string(),
            || {
                if self.replaying() {
                    // (the host inputs only; nothing launches)
                    return self.delta_rule_run(io, gates, rows, states, out, form, None);
                }
                // the scratch now holds out's q8_1 copy as of this op (the launch below
                // writes it): the out-projection after skips its quantize launch
                let mut q8 = (0u64, 0u64);
                self.with_q8_of(out, |a| {
                    q8 = a;
                    Ok(())
                })?;
                let norm = GatedNormArgs {
                    w: wp,
                    z: zp,
                    eps,
                    xq: q8.0,
                    xds: q8.1,
                    cnt,
                };
                self.delta_rule_run(io, gates, rows, states, out, form, Some(norm))
            },
        )?;
        Ok(true)
    }

    /// `Backend::delta_rule_gated`: with the staged gate fusion on ([`StagedFusions`]) and
    /// every run on `dn_recurrent`, one launch computes the gates and the rule; else
    /// `mo_delta_gates` then the rule.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn delta_rule_gated_rec(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        alpha: &mut CudaTensor,
        beta: &mut CudaTensor,
        (dt_bias, a): (&CudaWeight, &CudaWeight),
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let (form, _) = configured_forms();
        if self.staged().gates && self.gates_fusable(rows, states, form) {
            // alpha's and beta's shapes are checked by delta_rule_run (as g and beta)
            let h = alpha.cols;
            let (dt, av) = (gate_vector(dt_bias, h)?, gate_vector(a, h)?);
            let stream = self.dev.stream();
            let gates = (dev_ptr(dt, stream), dev_ptr(av, stream));
            let io = (q, k, v, &*alpha, &*beta);
            self.fused_gates
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return self.timed(
                || "delta_rule_gated".to_string(),
                || self.delta_rule_run(io, gates, rows, states, out, form, None),
            );
        }
        if !self.replaying() {
            self.timed(
                || "delta_rule_gates".to_string(),
                || self.delta_rule_gates_rec(alpha, beta, dt_bias, a),
            )?;
        }
        self.timed(
            || "delta_rule".to_string(),
            || self.delta_rule_with(q, k, v, alpha, beta, rows, states, out, form),
        )
    }

    /// Token by token: `mo_delta_rule` (one sequence) or `dn_recurrent` (one sequence, or with
    /// [`Runs::Many`] each sequence on grid.z with its own state).
    fn delta_rule_recurrent(
        &self,
        kernel: &str,
        io: &DeltaIo,
        runs: Runs,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let sh = io.sh;
        let a = runs.args();
        let legacy = kernel == "mo_delta_rule";
        if legacy && a.tab != 0 {
            return Err(shape_err(
                "delta_rule",
                "mo_delta_rule takes one sequence".into(),
            ));
        }
        let (f, cfg) = if legacy {
            let threads = sh.d_v.div_ceil(32).clamp(1, 8) as u32 * 32;
            let cfg = LaunchConfig {
                grid_dim: (sh.n_v_heads as u32, 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            (self.function(kernel)?, cfg)
        } else {
            let cfg = LaunchConfig {
                grid_dim: (
                    sh.n_v_heads as u32,
                    sh.d_v.div_ceil(RECURRENT_BLOCK_ROWS) as u32,
                    a.n_seqs,
                ),
                block_dim: (32, 4, 1),
                shared_mem_bytes: 0,
            };
            (self.deltanet_function(kernel)?, cfg)
        };
        let ints = [
            a.n_rows,
            sh.n_k_heads as i32,
            sh.n_v_heads as i32,
            sh.d_k as i32,
            sh.d_v as i32,
        ];
        if !legacy {
            let stream = self.dev.stream();
            let mut p = pdl::Args::new();
            for t in [io.q, io.k, io.v, io.g, io.beta] {
                p.push(dev_ptr(&t.data, stream));
            }
            p.push(a.rows)
                .push(a.n_rows)
                .push(a.state)
                .push(dev_ptr(&out.data, stream));
            for &i in &ints[1..] {
                p.push(i);
            }
            p.push(a.runs).push(a.tab).push(io.gates.0).push(io.gates.1);
            let gn = io.norm.unwrap_or_default();
            p.push(gn.w)
                .push(gn.z)
                .push(gn.eps)
                .push(gn.xq)
                .push(gn.xds)
                .push(gn.cnt);
            let on = self.staged().dn_pdl && pdl::enabled(self.dev.arch());
            // SAFETY: matches dn_recurrent(q, k, v, g, beta, rows, n_rows, state, out,
            // n_k_heads, n_v_heads, d_k, d_v, runs, tab, dt_bias, a_gate, gn_w, gn_z, gn_eps,
            // gn_xq, gn_xds, gn_cnt) (gn_w 0: no norm; else delta_rule_gated_norm_rec's checks:
            // d_v == 128 == the block's threads, z shaped as out, the q8_1 copy sized for out,
            // DN_COUNTERS >= sequences x heads, all zero) (RunArgs: one
            // sequence's rows and state, or the per-sequence runs and state table; gates 0 or
            // two vectors of n_v_heads values); every tensor's shape checked by the caller,
            // every state holds n_v_heads * d_v * d_k values, d_k <= 256. Before its wait the
            // kernel reads only the state (written by no kernel still running: only this
            // kernel writes it, and copies of it are full dependencies), the gate weights and
            // the host-staged rows / runs / table.
            unsafe { p.launch(stream, &f, cfg, on) }.map_err(dev_err)?;
            return Ok(());
        }
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&*io.q.data)
            .arg(&*io.k.data)
            .arg(&*io.v.data)
            .arg(&*io.g.data)
            .arg(&*io.beta.data)
            .arg(&a.rows)
            .arg(&ints[0])
            .arg(&a.state)
            .arg(&mut *out.data);
        for i in &ints[1..] {
            b.arg(i);
        }
        // SAFETY: matches mo_delta_rule(q, k, v, g, beta, rows, n_rows, state, out, n_k_heads,
        // n_v_heads, d_k, d_v) (one sequence: no table, checked above); every tensor's shape
        // checked by the caller, every state holds n_v_heads * d_v * d_k values.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// The rows of every sequence that has rows, concatenated in sequence order, the offsets
    /// of each sequence's run, and a table of `ptr(s)` per such sequence (two i32 words per
    /// u64, little-endian), staged for one launch over all of them.
    fn stage_runs(
        &self,
        by_seq: &[Vec<i32>],
        ptr: impl Fn(usize) -> u64,
    ) -> Result<SeqRuns, BackendError> {
        let (mut rows, mut runs, mut tab) = (Vec::new(), vec![0i32], Vec::new());
        for (s, idx) in by_seq.iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            rows.extend_from_slice(idx);
            runs.push(rows.len() as i32);
            let a = ptr(s);
            tab.push(a as u32 as i32);
            tab.push((a >> 32) as u32 as i32);
        }
        Ok(SeqRuns {
            n_seqs: runs.len() - 1,
            rows: self.host_ints(&rows)?,
            runs: self.host_ints(&runs)?,
            tab: self.host_ints(&tab)?,
        })
    }

    /// One run in the chunked form. Scratch `[n_v_heads, n_chunks * 64, d_k + d_v + 65]` f32
    /// comes from the step arena's shared scratch block (reused by every call).
    fn delta_rule_chunked(
        &self,
        io: &DeltaIo,
        row_ids: &HostInts,
        n_rows: usize,
        state: &mut CudaSlice<f32>,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let sh = io.sh;
        let n_chunks = n_rows.div_ceil(CHUNK);
        let np = n_chunks * CHUNK;
        let hv = sh.n_v_heads;
        let (w_len, u_len, a_len) = (hv * np * sh.d_k, hv * np * sh.d_v, hv * np * CHUNK);
        let base = self
            .step_ctl()
            .shared_scratch(chunked_scratch_f32(&sh, n_rows))?;
        let w_ptr = base;
        let u_ptr = w_ptr + 4 * w_len as u64;
        let a_ptr = u_ptr + 4 * u_len as u64;
        let g_ptr = a_ptr + 4 * a_len as u64;
        let ints = [
            n_rows as i32,
            sh.n_k_heads as i32,
            sh.n_v_heads as i32,
            sh.d_k as i32,
            sh.d_v as i32,
        ];
        let f = self.deltanet_function("dn_chunk_prepare")?;
        let cfg = LaunchConfig {
            grid_dim: (n_chunks as u32, hv as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&*io.q.data)
            .arg(&*io.k.data)
            .arg(&*io.v.data)
            .arg(&*io.g.data)
            .arg(&*io.beta.data)
            .arg(&row_ids.ptr)
            .arg(&ints[0])
            .arg(&w_ptr)
            .arg(&u_ptr)
            .arg(&a_ptr)
            .arg(&g_ptr);
        for i in &ints[1..] {
            b.arg(i);
        }
        // SAFETY: matches dn_chunk_prepare(q, k, v, g, beta, rows, n_rows, w, u, aqk, g_out,
        // n_k_heads, n_v_heads, d_k, d_v); the scratch holds the four arrays back to back
        // (chunked_scratch_f32), d_k <= 128, shapes checked by the caller.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        let f = self.deltanet_function("dn_chunk_state")?;
        let cfg = LaunchConfig {
            grid_dim: (sh.d_v.div_ceil(CHUNK_ROWS) as u32, hv as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&*io.q.data)
            .arg(&*io.k.data)
            .arg(&row_ids.ptr)
            .arg(&ints[0])
            .arg(&w_ptr)
            .arg(&u_ptr)
            .arg(&a_ptr)
            .arg(&g_ptr)
            .arg(state)
            .arg(&mut *out.data);
        for i in &ints[1..] {
            b.arg(i);
        }
        // SAFETY: matches dn_chunk_state(q, k, rows, n_rows, w, u, aqk, g, state, out,
        // n_k_heads, n_v_heads, d_k, d_v); reads what dn_chunk_prepare wrote (same stream).
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }
}

/// f32 scratch of one chunked run of `n_rows` tokens: W, U, the chunk q·k matrices and the
/// cumulative gates, `n_v_heads * ceil(n_rows / 64) * 64 * (d_k + d_v + 64 + 1)`. (The memory
/// plan's compute buffers count this for n_rows = ubatch.)
pub fn chunked_scratch_f32(sh: &RecurrentShape, n_rows: usize) -> usize {
    sh.n_v_heads * n_rows.div_ceil(CHUNK) * CHUNK * (sh.d_k + sh.d_v + CHUNK + 1)
}

/// The inputs of one `delta_rule` call.
struct DeltaIo<'a> {
    q: &'a CudaTensor,
    k: &'a CudaTensor,
    v: &'a CudaTensor,
    g: &'a CudaTensor,
    beta: &'a CudaTensor,
    sh: RecurrentShape,
    /// Device addresses of dt_bias and a when g and beta are the raw projections and
    /// `dn_recurrent` computes the gates (0, 0: g and beta are the gates).
    gates: (u64, u64),
    /// `dn_recurrent` also runs the gated output norm (the staged `dn_norm`).
    norm: Option<GatedNormArgs>,
}

/// Device addresses of `dn_recurrent`'s gated-norm tail: the norm weights [d_v], the gate z
/// (shaped as out), the eps, out's q8_1 copy (xq, tagged xds) and the last-block counters.
/// (All zero: no norm.)
#[derive(Clone, Copy, Default)]
struct GatedNormArgs {
    w: u64,
    z: u64,
    eps: f32,
    xq: u64,
    xds: u64,
    cnt: u64,
}

/// Counters of [`GatedNormArgs::cnt`]: sequences x value heads of one launch at most.
const DN_COUNTERS: usize = 16384;
