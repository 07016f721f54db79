//! Decode fusion (issue #4 point 4): fewer launches and passes per layer. On by default since
//! the H200 runs of 2026-12-02/03 (fixtures vs transformers, graph replay, 32B tg 78.5 -> 110
//! tok/s); `REDLINE_FUSED=0` / [`CudaBackend::set_fused`] turn it off.
//!
//! - **x quantized once**: the matvec scratch remembers which tensor its q8_1 copy was made
//!   from ([`Holds`]) and at which op; a later quantized product of the same tensor reuses it
//!   if no other op ran in between (every backend op bumps `ops`, so an op that wrote the
//!   tensor, or anything else, breaks the chain — no per-writer bookkeeping needed). A freshly
//!   allocated tensor at the remembered address (the old one died) also forgets it.
//! - **producers write q8_1**: `rms_norm` over whole rows and `swiglu` also write the q8_1 copy
//!   of their output into the scratch (kernels/model_ops.cu `mo_rms_norm_q8`, `mo_swiglu_q8`),
//!   so the next product (Q/K/V, gate/up, down) launches no quantize kernel at all.
//! - **several matrices per launch**: `matmul_many` runs the products (1..=8 tokens) of one
//!   weight format as one `mvm_` launch over the concatenated rows, the bias in the epilogue;
//!   `matmul_add` adds the residual in the epilogue ([`crate::matvec::Segment`]).
//! - **RoPE of q and k in one launch** (`mo_rope_qk`).
//! - **9..=32 tokens** (batched decode of 9+ sequences): `matmul_many` and `matmul_add` of
//!   Q4_K / Q6_K matrices go to the n-tile kernels ([`crate::mmv::dispatch2n`]) as segments,
//!   x quantized to q8_K once per op, one launch per weight format, the bias and the residual
//!   add in the epilogue ([`CudaBackend::ntile_segments`]).
//!
//! Every decision here is host-side and depends only on the op sequence and tensor addresses,
//! which repeat between a decode step's warm run, its capture and its replays.

use std::sync::atomic::Ordering;

use backend::{BackendError, RopeParams};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use gguf::GgmlType;

use super::step::{dev_ptr, Mode};
use super::{dev_err, elems_cfg, shape_err, CudaBackend, CudaTensor, CudaWeight, Scratch};
use crate::matvec::{self, MatvecScratch, Segment, MAX_SEGMENTS};
use crate::pdl;

/// Which tensor the matvec scratch holds the q8_1 copy of, and the op that made or last
/// used it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Holds {
    ptr: u64,
    rows: usize,
    cols: usize,
    seq: u64,
}

/// Most matrices of one `mo_matvec_f32_rows` launch (F32_MAX_SEGS in kernels/model_ops.cu).
pub(super) const F32_MAX_SEGS: usize = 4;

/// Values per thread of `mo_rms_norm_q8`'s in-register path (RMS_REGS in kernels/model_ops.cu).
const RMS_REGS: usize = 8;

/// Whether `mo_rms_norm_q8` spreads a row's writes over one block per pass of the block
/// (grid.y; the kernel's note says why). `REDLINE_NORM_SPLIT=0` (a developer's knob for A/B
/// runs): one block a row, as before session 36. The results are the same bits either way.
static NORM_SPLIT: crate::switch::Switch = crate::switch::Switch::new("REDLINE_NORM_SPLIT");

/// Forces whether the fused RMS norm spreads a row's writes over several blocks (`None`: back
/// to `REDLINE_NORM_SPLIT`). For tests and benchmarks.
pub fn set_norm_split(on: Option<bool>) {
    NORM_SPLIT.set(on);
}

/// Whether Gated DeltaNet's f32 alpha / beta projections of a decode step ride in the conv's
/// launch (`mo_conv1d_qkv_gates`, [`backend::Backend::in_proj_conv1d_qkv`]) instead of a
/// `mo_matvec_f32_rows` launch of their own. `REDLINE_CONV_GATES=0` (a developer's knob for
/// A/B runs): their own launch, as before session 37. The same bits either way.
pub(super) static CONV_GATES: crate::switch::Switch =
    crate::switch::Switch::new("REDLINE_CONV_GATES");

/// Forces whether the f32 alpha / beta projections ride in the conv's launch (`None`: back to
/// `REDLINE_CONV_GATES`). For tests and benchmarks.
pub fn set_conv_gates(on: Option<bool>) {
    CONV_GATES.set(on);
}

/// Kernel parameter of `mo_matvec_f32_rows` (struct F32Seg / F32Segs in kernels/model_ops.cu).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct F32Seg {
    w: u64,
    y: u64,
    nrows: i32,
    block0: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct F32Segs {
    seg: [F32Seg; F32_MAX_SEGS],
    n_segs: i32,
    cols: i32,
    n_tokens: i32,
}

// SAFETY: plain repr(C) data (addresses and integers) with the layout of the kernel's struct.
unsafe impl cudarc::driver::DeviceRepr for F32Segs {}

/// Most destinations of one `mo_split_cols` launch (SPLIT_MAX_SEGS in kernels/model_ops.cu).
const SPLIT_MAX_SEGS: usize = 4;

/// Kernel parameter of `mo_split_cols` (struct SplitSeg / SplitSegs in kernels/model_ops.cu).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SplitSeg {
    dst: u64,
    src_off: i32,
    width: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SplitSegs {
    seg: [SplitSeg; SPLIT_MAX_SEGS],
    n_segs: i32,
    src_cols: i32,
    n_rows: i32,
    total: i32,
}

// SAFETY: plain repr(C) data (addresses and integers) with the layout of the kernel's struct.
unsafe impl cudarc::driver::DeviceRepr for SplitSegs {}

/// Tokens at most for the fused paths (x quantized once, the segment kernels and the
/// per-matrix kernels take up to 8 per launch).
const MAX_FUSED_TOKENS: usize = matvec::MAX_TOKENS_PER_LAUNCH;

/// Whether products of 2..=8 tokens go through the segment kernels (default on;
/// `REDLINE_MULTI_TOKEN_SEGMENTS=0` sends them to one launch per matrix plus separate bias and
/// residual adds, as before). Read once.
fn multi_token_segments() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_MULTI_TOKEN_SEGMENTS").map_or(true, |v| v != "0"))
}

/// `segs` grouped by weight format, in order of first appearance, at most [`MAX_SEGMENTS`]
/// a group: the segment kernels take one format and width a launch.
fn by_format<'a>(segs: Vec<Segment<'a>>) -> Vec<Vec<Segment<'a>>> {
    let mut groups: Vec<Vec<Segment<'a>>> = Vec::new();
    for s in segs {
        match groups
            .iter_mut()
            .find(|g| g.len() < MAX_SEGMENTS && g[0].w.ty == s.w.ty)
        {
            Some(g) => g.push(s),
            None => groups.push(vec![s]),
        }
    }
    groups
}

impl CudaBackend {
    /// Turns the fused decode paths on or off (default on; `REDLINE_FUSED=0` off). Recorded steps are
    /// dropped (their op sequence changes).
    pub fn set_fused(&self, on: bool) {
        self.fused.store(on, Ordering::Relaxed);
        self.step_ctl().forget_graphs();
        self.forget_q8();
    }

    /// Whether the fused kernels launch with programmatic serialization ([`crate::pdl`]).
    pub(super) fn pdl(&self) -> bool {
        pdl::enabled(self.dev.arch())
    }

    /// Whether the fused decode paths are on.
    pub fn fused(&self) -> bool {
        self.fused.load(Ordering::Relaxed)
    }

    fn lock_scratch(&self) -> std::sync::MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets which tensor the scratch holds (step boundaries, knob changes).
    pub(super) fn forget_q8(&self) {
        self.lock_scratch().holds = None;
    }

    /// A fresh tensor now lives at `t`'s address: whatever the scratch held of the tensor
    /// that was there is stale.
    pub(super) fn forget_q8_at(&self, t: &CudaTensor) {
        let ptr = dev_ptr(&*t.data, self.dev.stream());
        let mut s = self.lock_scratch();
        if s.holds.is_some_and(|h| h.ptr == ptr) {
            s.holds = None;
        }
    }

    /// Runs `f` with the scratch grown to hold x of `n_tokens × cols` and its `holds`.
    fn with_q8<T>(
        &self,
        n_tokens: usize,
        cols: usize,
        f: impl FnOnce(&mut MatvecScratch, &mut Option<Holds>) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut s = self.lock_scratch();
        let need = n_tokens.max(1) * cols.div_ceil(32) * 32;
        if s.buf.is_none() || s.capacity < need {
            // Recorded steps point at the old scratch.
            self.step_ctl().forget_graphs();
            s.buf = Some(
                self.dev
                    .matvec_scratch(n_tokens.max(1), cols)
                    .map_err(dev_err)?,
            );
            s.capacity = need;
            s.holds = None;
        }
        let Scratch { buf, holds, .. } = &mut *s;
        f(buf.as_mut().expect("scratch allocated above"), holds)
    }

    /// Whether x's quantization should also make the q8_K copy in the same launch (the staged
    /// `q8k` fusion): a product of one of `tys` takes the mmv2 kernels for x.
    fn q8k_with(&self, x: &CudaTensor, tys: impl IntoIterator<Item = GgmlType>) -> bool {
        self.staged().q8k
            && crate::mmv::q8k_wanted(&self.dev, x.rows, x.cols)
            && tys
                .into_iter()
                .any(|ty| crate::mmv::dispatch2(&self.dev, ty, x.rows))
    }

    /// Quantizes x into the scratch unless it already holds x's copy from this op or the one
    /// before (with `with_k`, the q8_K copy too, in one launch); records that it holds x as of
    /// this op.
    fn ensure_q8(
        &self,
        x: &CudaTensor,
        s: &mut MatvecScratch,
        holds: &mut Option<Holds>,
        with_k: bool,
    ) -> Result<(), BackendError> {
        let seq = self.ops.load(Ordering::Relaxed);
        let ptr = dev_ptr(&*x.data, self.dev.stream());
        let fresh = holds.is_some_and(|h| {
            h.ptr == ptr && h.rows == x.rows && h.cols == x.cols && h.seq + 1 >= seq
        });
        if !fresh && with_k {
            self.dev
                .quantize_q8_1_and_k(&x.data, x.rows, x.cols, s)
                .map_err(dev_err)?;
            self.q8k.fetch_add(1, Ordering::Relaxed);
        } else if !fresh {
            self.dev
                .quantize_for_matvec(&x.data, x.rows, x.cols, s)
                .map_err(dev_err)?;
        }
        *holds = Some(Holds {
            ptr,
            rows: x.rows,
            cols: x.cols,
            seq,
        });
        Ok(())
    }

    /// The quantized matrix of `w` when a fused product can take it for x of `n` tokens.
    fn fusable<'w>(
        &self,
        w: &'w CudaWeight,
        x: &CudaTensor,
    ) -> Option<&'w crate::matvec::DeviceMatrix> {
        let m = w.matrix.as_ref()?;
        let ok = matvec::quantizes_activations(m.ty)
            && x.cols == w.cols
            && (1..=MAX_FUSED_TOKENS).contains(&x.rows)
            // prefill outside steps may take the GEMM (matmul_impl decides)
            && !(self.mode() == Mode::Off && x.rows > 1);
        ok.then_some(m)
    }

    /// `matmul` with x quantized once (see the module notes); other cases: `matmul_impl`.
    pub(super) fn matmul_fused_impl(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let Some(m) = self.fusable(w, x) else {
            return self.matmul_impl(w, x, out);
        };
        if (out.rows, out.cols) != (x.rows, w.rows) {
            return self.matmul_impl(w, x, out); // reports the shape error
        }
        let with_k = self.q8k_with(x, [m.ty]);
        self.with_q8(x.rows, x.cols, |s, holds| {
            self.ensure_q8(x, s, holds, with_k)?;
            if crate::mmq::dispatch(&self.dev, m.ty, x.rows) {
                return self
                    .dev
                    .mmq_prequantized(m, x.rows, s, &mut out.data)
                    .map_err(dev_err);
            }
            if crate::mmv::dispatch2(&self.dev, m.ty, x.rows) {
                return self
                    .dev
                    .ensure_q8_k(&x.data, x.rows, x.cols, s)
                    .and_then(|_| self.dev.mmv2_prequantized(m, s, &mut out.data))
                    .map_err(dev_err);
            }
            if crate::mmv::dispatch(&self.dev, m.ty, x.rows, m.n_rows) {
                return self
                    .dev
                    .mmv_prequantized(m, s, &mut out.data)
                    .map_err(dev_err);
            }
            self.dev
                .matvec_prequantized(m, s, &mut out.data)
                .map_err(dev_err)
        })
    }

    pub(super) fn matmul_many_impl(
        &self,
        ws: &[&CudaWeight],
        biases: &[Option<&CudaWeight>],
        x: &CudaTensor,
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        if ws.len() != outs.len() || !(biases.is_empty() || biases.len() == ws.len()) {
            return Err(shape_err(
                "matmul_many",
                format!(
                    "{} weights, {} biases, {} outputs",
                    ws.len(),
                    biases.len(),
                    outs.len()
                ),
            ));
        }
        let bias_of = |i: usize| biases.get(i).copied().flatten();
        // Few-token products of quantized matrices as segments (1..=8 tokens: the mvm / mmv /
        // mmv2 kernels on q8_1; 9..=32: the n-tile kernels on q8_K); everything else one by one.
        let stream = self.dev.stream();
        let segment = |i: usize, m| Segment {
            w: m,
            y: dev_ptr(&*outs[i].data, stream),
            bias: bias_of(i)
                .and_then(|b| b.dense.as_ref())
                .map(|d| dev_ptr(d, stream)),
            accumulate: false,
        };
        let mut segs = Vec::new();
        let mut ntile = Vec::new();
        let mut rest: Vec<usize> = Vec::new();
        for (i, w) in ws.iter().enumerate() {
            let takes = (outs[i].rows, outs[i].cols) == (x.rows, w.rows)
                && bias_of(i).is_none_or(|b| b.dense.is_some() && b.rows * b.cols == w.rows);
            match (self.ntile_takes(w, x), self.fusable(w, x)) {
                (Some(m), _) if takes => ntile.push(segment(i, m)),
                (_, Some(m)) if takes && self.segments_take(m, x.rows) => segs.push(segment(i, m)),
                _ => rest.push(i),
            }
        }
        if !segs.is_empty() {
            self.matmul_segments(segs, x)?;
        }
        if !ntile.is_empty() {
            self.ntile_segments(ntile, x)?;
        }
        // few-token f32 matrices (DeltaNet alpha/beta) without bias: one launch, a block per
        // row (prefill outside steps keeps the GEMM / per-matrix path)
        let (f32_rows, rest): (Vec<usize>, Vec<usize>) = rest
            .into_iter()
            .partition(|&i| bias_of(i).is_none() && self.f32_rows_take(ws[i], x, outs[i]));
        for chunk in f32_rows.chunks(F32_MAX_SEGS) {
            self.matvec_f32_rows(chunk, ws, x, outs)?;
        }
        // after the segments: a float matrix's matvec may reuse the scratch
        for i in rest {
            self.matmul_fused_impl(ws[i], x, outs[i])?;
            if let Some(b) = bias_of(i) {
                self.add_bias_impl(outs[i], b)?;
            }
        }
        Ok(())
    }

    /// Whether `out = w x` (no bias) takes [`Self::matvec_f32_rows`]: an f32 matrix and one
    /// token, or 2..=8 inside a recorded step (prefill outside steps keeps the GEMM /
    /// per-matrix path). The unfused `matmul` asks too, so both paths give the same bits.
    pub(super) fn f32_rows_take(&self, w: &CudaWeight, x: &CudaTensor, out: &CudaTensor) -> bool {
        let few =
            x.rows == 1 || ((2..=MAX_FUSED_TOKENS).contains(&x.rows) && self.mode() != Mode::Off);
        few && w.cols == x.cols
            && x.cols.is_multiple_of(4)
            && (out.rows, out.cols) == (x.rows, w.rows)
            && w.matrix.as_ref().is_some_and(|m| m.ty == GgmlType::F32)
    }

    /// The segments of `outs[i] = ws[i] x` for the f32 matrices `idx` (at most F32_MAX_SEGS,
    /// 1..=8 tokens; [`Self::f32_rows_take`] checked by the caller) and their row count.
    pub(super) fn f32_rows_segs(
        &self,
        idx: &[usize],
        ws: &[&CudaWeight],
        x: &CudaTensor,
        outs: &[&mut CudaTensor],
    ) -> (F32Segs, usize) {
        let stream = self.dev.stream();
        let mut p = F32Segs {
            n_segs: idx.len() as i32,
            cols: x.cols as i32,
            n_tokens: x.rows as i32,
            ..F32Segs::default()
        };
        let mut blocks = 0usize;
        for (k, &i) in idx.iter().enumerate() {
            let m = ws[i].matrix.as_ref().expect("checked by the caller");
            p.seg[k] = F32Seg {
                w: self.dev.device_address(&m.data),
                y: dev_ptr(&*outs[i].data, stream),
                nrows: m.n_rows as i32,
                block0: blocks as i32,
            };
            blocks += m.n_rows;
        }
        (p, blocks)
    }

    /// `outs[i] = ws[i] x` for the f32 matrices `idx` (at most F32_MAX_SEGS, 1..=8 tokens).
    pub(super) fn matvec_f32_rows(
        &self,
        idx: &[usize],
        ws: &[&CudaWeight],
        x: &CudaTensor,
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        let stream = self.dev.stream();
        let (p, blocks) = self.f32_rows_segs(idx, ws, x, outs);
        if blocks == 0 {
            return Ok(());
        }
        let f = self.function("mo_matvec_f32_rows")?;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        if self.pdl() {
            let (mut p, mut px) = (p, dev_ptr(&*x.data, stream));
            let mut params = [pdl::arg(&mut p), pdl::arg(&mut px)];
            // SAFETY: as below; the kernel waits for the previous one before reading x.
            return unsafe { pdl::launch(stream, &f, cfg, &mut params, true) }.map_err(dev_err);
        }
        let mut b = stream.launch_builder(&f);
        b.arg(&p).arg(&*x.data);
        // SAFETY: matches mo_matvec_f32_rows(F32Segs, x); each segment is a live f32 matrix of
        // n_rows x cols (cols % 4 == 0, rows 16-byte aligned) and its output holds
        // n_tokens * n_rows f32 (checked by the caller); x holds n_tokens * cols f32,
        // n_tokens <= 8 = F32_MAX_TOKENS.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// Whether the segment kernels (`mvm_*`, several matrices and the bias / residual add in
    /// one launch) take a product of `m` for `n` tokens: one token always; 2..=8 unless
    /// `REDLINE_MULTI_TOKEN_SEGMENTS=0` or the int8 tensor-core path takes that many tokens.
    fn segments_take(&self, m: &crate::matvec::DeviceMatrix, n: usize) -> bool {
        n == 1
            || (n <= MAX_FUSED_TOKENS
                && multi_token_segments()
                && !crate::mmq::dispatch(&self.dev, m.ty, n))
    }

    /// The segment launches of `matmul_many` (1..=8 tokens, quantized matrices).
    fn matmul_segments(&self, segs: Vec<Segment<'_>>, x: &CudaTensor) -> Result<(), BackendError> {
        let with_k = self.q8k_with(x, segs.iter().map(|s| s.w.ty));
        self.with_q8(x.rows, x.cols, |s, holds| {
            self.ensure_q8(x, s, holds, with_k)?;
            for group in by_format(segs) {
                self.dev
                    .few_token_segments(&group, s, &x.data)
                    .map_err(dev_err)?;
            }
            Ok(())
        })
    }

    pub(super) fn matmul_add_impl(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        if let Some(m) = self.ntile_takes(w, x) {
            if (out.rows, out.cols) == (x.rows, w.rows) {
                let seg = Segment {
                    w: m,
                    y: dev_ptr(&*out.data, self.dev.stream()),
                    bias: None,
                    accumulate: true,
                };
                return self.ntile_segments(vec![seg], x);
            }
        }
        match self.fusable(w, x) {
            Some(m) if !self.matmul_add_uses_temp(w, x, out) => {
                let y = dev_ptr(&*out.data, self.dev.stream());
                let with_k = self.q8k_with(x, [m.ty]);
                self.with_q8(x.rows, x.cols, |s, holds| {
                    self.ensure_q8(x, s, holds, with_k)?;
                    let seg = Segment {
                        w: m,
                        y,
                        bias: None,
                        accumulate: true,
                    };
                    self.dev
                        .few_token_segments(&[seg], s, &x.data)
                        .map_err(dev_err)
                })
            }
            _ => {
                let mut t = self.scratch_tensor(out.rows, out.cols)?;
                self.matmul_fused_impl(w, x, &mut t)?;
                self.add_impl(out, &t)
            }
        }
    }

    /// Whether `matmul_add_impl` goes through a step temporary (anything the segment kernels
    /// do not take): the arena block a replay of the step must take too.
    pub(super) fn matmul_add_uses_temp(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &CudaTensor,
    ) -> bool {
        !((self
            .fusable(w, x)
            .is_some_and(|m| self.segments_take(m, x.rows))
            || self.ntile_takes(w, x).is_some())
            && (out.rows, out.cols) == (x.rows, w.rows))
    }

    /// The quantized matrix of `w` when the n-tile segments take its product with x: 9..=32
    /// tokens inside a decode step (prefill outside steps may take the GEMM), a format and
    /// card [`crate::mmv::dispatch2n`] takes.
    fn ntile_takes<'w>(
        &self,
        w: &'w CudaWeight,
        x: &CudaTensor,
    ) -> Option<&'w crate::matvec::DeviceMatrix> {
        let m = w.matrix.as_ref()?;
        let ok = (MAX_FUSED_TOKENS + 1..=crate::mmv::MAX_TOKENS_N).contains(&x.rows)
            && self.mode() != Mode::Off
            && x.cols == w.cols
            && crate::mmv::dispatch2n(&self.dev, m.ty, x.rows);
        ok.then_some(m)
    }

    /// `y (+)= W x (+ bias)` for each of `segs`, x of 9..=32 tokens of a format
    /// [`crate::mmv::dispatch2n`] takes (every `y` holds `x.rows × W.rows`, every bias
    /// `W.rows`): x quantized to q8_K once, one n-tile launch per weight format.
    pub(super) fn ntile_segments(
        &self,
        segs: Vec<Segment<'_>>,
        x: &CudaTensor,
    ) -> Result<(), BackendError> {
        let n = x.rows;
        // (the q8_K copy's layout pads the tokens to a multiple of 8)
        self.with_scratch(crate::mmv::q8k_layout_tokens(n), x.cols, |s| {
            self.dev
                .quantize_q8_k(&x.data, n, x.cols, s)
                .map_err(dev_err)?;
            for group in by_format(segs) {
                self.dev.mmv2_segments(&group, s).map_err(dev_err)?;
            }
            Ok(())
        })
    }

    /// `rms_norm` of whole rows that also writes the q8_1 copy of `out`; `Ok(false)` when
    /// the case is not taken (the caller runs the plain kernel).
    pub(super) fn rms_norm_q8_impl(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &mut CudaTensor,
    ) -> Result<bool, BackendError> {
        let cols = out.cols;
        let Some(wv) = w.dense.as_ref() else {
            return Ok(false);
        };
        if w.rows * w.cols != cols
            || !cols.is_multiple_of(32)
            || (x.rows, x.cols) != (out.rows, out.cols)
            || !(1..=MAX_FUSED_TOKENS).contains(&out.rows)
        {
            return Ok(false);
        }
        let f = self.function("mo_rms_norm_q8")?;
        // wide blocks: the row sits in registers (RMS_REGS per thread), loads in flight together
        let threads = cols.min(1024);
        // each pass of `threads` values written by its own block (the same sum in each)
        let split = if NORM_SPLIT.on() && cols <= RMS_REGS * threads {
            cols.div_ceil(threads)
        } else {
            1
        };
        let cfg = LaunchConfig {
            grid_dim: (out.rows as u32, split as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // the q8_K copy needs whole 256-value units per 8 warps and the row in registers
        let with_k = self.staged().q8k
            && crate::mmv::q8k_wanted(&self.dev, out.rows, cols)
            && threads.is_multiple_of(256)
            && cols <= RMS_REGS * threads;
        // a prefetch hint given right before this op: the layer's first product
        self.issue_prefetch(self.norm_prefetch_cap())?;
        let stream = self.dev.stream();
        let (px, pw, po) = (
            dev_ptr(&*x.data, stream),
            dev_ptr(wv, stream),
            dev_ptr(&*out.data, stream),
        );
        self.with_q8_k_of(out, with_k, |(xq, xds), k| {
            let mut a = pdl::Args::new();
            a.push(px)
                .push(pw)
                .push(po)
                .push(xq)
                .push(xds)
                .push(cols as i32)
                .push(eps)
                .push(k.0)
                .push(k.1)
                .push(k.2);
            // SAFETY: matches mo_rms_norm_q8(x, w, out, xq, xds, cols, eps, kq, kdy, kbs); x and
            // out hold rows * cols values, w cols, the scratch rows * cols int8 and rows * cols
            // / 16 f32 (with_q8_k_of), the q8_K buffers 0 or their shares (cols % 256 == 0,
            // blockDim % 256 == 0, cols <= RMS_REGS * blockDim, checked above); block size a
            // multiple of 32, cols % 32 == 0. With PDL it reads only w before its wait.
            unsafe { a.launch(stream, &f, cfg, self.pdl()) }.map_err(dev_err)
        })?;
        Ok(true)
    }

    /// Runs `launch` with the device addresses of the q8_1 scratch grown for `out`, for a
    /// kernel that writes `out` and its q8_1 copy; the scratch then holds `out`'s copy as of
    /// this op, so a product of `out` right after skips its quantize launch.
    pub(super) fn with_q8_of(
        &self,
        out: &CudaTensor,
        launch: impl FnOnce((u64, u64)) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        self.with_q8_k_of(out, false, |q8, _| launch(q8))
    }

    /// [`CudaBackend::with_q8_of`], plus the q8_K buffers' device addresses (q, dy, bsum) when
    /// `with_k` ((0, 0, 0) otherwise), which then hold `out`'s q8_K copy too.
    fn with_q8_k_of(
        &self,
        out: &CudaTensor,
        with_k: bool,
        launch: impl FnOnce((u64, u64), (u64, u64, u64)) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let (rows, cols) = (out.rows, out.cols);
        let seq = self.ops.load(Ordering::Relaxed);
        let ptr = dev_ptr(&*out.data, self.dev.stream());
        self.with_q8(rows, cols, |s, holds| {
            // xds tagged with the layout the writer must use (common.cuh q8_1_tagged)
            let (xq, xds, tiled) = s.buffers_for(rows, cols).map_err(dev_err)?;
            let q8 = (
                self.dev.device_address(xq),
                self.dev.q8_1_xds_address(xds, tiled),
            );
            let k = if with_k {
                s.q8k_buffers_for(&self.dev, rows, cols).map_err(dev_err)?
            } else {
                (0, 0, 0)
            };
            launch(q8, k)?;
            if with_k {
                s.q8k_made(ptr, rows, cols);
                self.q8k.fetch_add(1, Ordering::Relaxed);
            }
            *holds = Some(Holds {
                ptr,
                rows,
                cols,
                seq,
            });
            Ok(())
        })
    }

    /// `gated_rms_norm` in place that also writes the q8_1 copy of `x` (the staged
    /// `norm_q8` fusion: the out-projection after it then skips its quantize launch);
    /// `Ok(false)` when the case is not taken (the caller runs the plain kernel).
    pub(super) fn group_norm_q8_impl(
        &self,
        w: &CudaWeight,
        z: &CudaTensor,
        eps: f32,
        x: &mut CudaTensor,
    ) -> Result<bool, BackendError> {
        let group = w.rows * w.cols;
        let Some(wv) = w.dense.as_ref() else {
            return Ok(false);
        };
        let (rows, cols) = (x.rows, x.cols);
        // the separate kernel's block for such groups is `group` threads: the same sum order
        if group == 0
            || !group.is_multiple_of(32)
            || group > 1024
            || !cols.is_multiple_of(group)
            || (z.rows, z.cols) != (rows, cols)
            || !(1..=MAX_FUSED_TOKENS).contains(&rows)
        {
            return Ok(false);
        }
        let f = self.function("mo_group_rms_norm_q8")?;
        let stream = self.dev.stream();
        let xp = dev_ptr(&*x.data, stream);
        self.with_q8_of(x, |(xq, xds)| {
            let cfg = LaunchConfig {
                grid_dim: ((rows * cols / group) as u32, 1, 1),
                block_dim: (group as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut a = pdl::Args::new();
            a.push(xp)
                .push(dev_ptr(wv, stream))
                .push(dev_ptr(&*z.data, stream))
                .push(xp)
                .push(xq)
                .push(xds)
                .push(group as i32)
                .push(eps);
            // SAFETY: matches mo_group_rms_norm_q8(x, w, z, out, xq, xds, group, eps); x (in
            // place) and z hold rows * cols values, w group, the scratch rows * cols int8 and
            // rows * cols / 16 f32 (with_q8_of); one block of `group` threads (a multiple of
            // 32, <= 1024) per group. With PDL it reads only w before its wait.
            unsafe { a.launch(stream, &f, cfg, self.pdl()) }.map_err(dev_err)
        })?;
        self.norm_q8.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// `swiglu` that also writes the q8_1 copy of `out` (and with the staged `q8k`, its q8_K
    /// copy); `Ok(false)` when not taken.
    pub(super) fn swiglu_q8_impl(
        &self,
        gate: &CudaTensor,
        up: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<bool, BackendError> {
        let (rows, cols) = (out.rows, out.cols);
        if (gate.rows, gate.cols) != (rows, cols)
            || (up.rows, up.cols) != (rows, cols)
            || !cols.is_multiple_of(32)
            || !(1..=MAX_FUSED_TOKENS).contains(&rows)
        {
            return Ok(false);
        }
        let f = self.function("mo_swiglu_q8")?;
        let n = rows * cols;
        // elems_cfg: blocks of 256 threads, so each block pass covers one 256-value unit
        let with_k = self.staged().q8k && crate::mmv::q8k_wanted(&self.dev, rows, cols);
        let stream = self.dev.stream();
        let (pg, pu, po) = (
            dev_ptr(&*gate.data, stream),
            dev_ptr(&*up.data, stream),
            dev_ptr(&*out.data, stream),
        );
        self.with_q8_k_of(out, with_k, |(xq, xds), k| {
            let mut a = pdl::Args::new();
            a.push(pg)
                .push(pu)
                .push(po)
                .push(xq)
                .push(xds)
                .push(n as i64)
                .push(k.0)
                .push(k.1)
                .push(k.2)
                .push(cols as i32);
            // SAFETY: matches mo_swiglu_q8(g, u, out, xq, xds, n, kq, kdy, kbs, cols); all three
            // hold n = rows * cols values, the scratch n int8 and n / 16 f32, the q8_K buffers 0
            // or their shares (cols % 256 == 0 with them); n % 32 == 0, and the grid-stride loop of
            // 256-thread blocks keeps every warp on 32 consecutive values (every block on 256).
            unsafe { a.launch(stream, &f, elems_cfg(n), self.pdl()) }.map_err(dev_err)
        })?;
        Ok(true)
    }

    /// RoPE of q and k in one launch (same checks as `rope_impl` for both).
    pub(super) fn rope_qk_impl(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        let bad = |x: &CudaTensor| {
            head_dim == 0
                || !x.cols.is_multiple_of(head_dim)
                || positions.len() != x.rows
                || !p.n_rot.is_multiple_of(2)
                || p.n_rot > head_dim
        };
        if bad(q)
            || bad(k)
            || p.freq_factors
                .as_ref()
                .is_some_and(|f| f.len() < p.n_rot / 2)
        {
            return Err(shape_err(
                "rope_qk",
                format!(
                    "q [{}, {}], k [{}, {}], {} positions, head_dim {head_dim}, n_rot {}",
                    q.rows,
                    q.cols,
                    k.rows,
                    k.cols,
                    positions.len(),
                    p.n_rot
                ),
            ));
        }
        let (hq, hk) = (q.cols / head_dim, k.cols / head_dim);
        if q.rows == 0 || hq + hk == 0 || p.n_rot == 0 {
            return Ok(());
        }
        let (pos, factors) = self.rope_host_inputs(positions, p)?;
        if self.replaying() {
            return Ok(());
        }
        let neox = i32::from(super::rope_neox(&p.mode));
        let f = self.function("mo_rope_qk")?;
        let cfg = LaunchConfig {
            grid_dim: (q.rows as u32, (hq + hk) as u32, 1),
            block_dim: ((p.n_rot / 2).clamp(1, 256) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut ints = [hq as i32, hk as i32, head_dim as i32, p.n_rot as i32];
        let null = 0u64;
        if self.pdl() {
            let stream = self.dev.stream();
            let mut a = [
                dev_ptr(&*q.data, stream),
                dev_ptr(&*k.data, stream),
                pos.ptr,
                factors.as_ref().map_or(0, |f| f.ptr),
            ];
            let (mut base, mut scale, mut nx) = (p.freq_base, p.freq_scale, neox);
            let [a0, a1, a2, a3] = &mut a;
            let [i0, i1, i2, i3] = &mut ints;
            let mut params = [
                pdl::arg(a0),
                pdl::arg(a1),
                pdl::arg(a2),
                pdl::arg(a3),
                pdl::arg(i0),
                pdl::arg(i1),
                pdl::arg(i2),
                pdl::arg(i3),
                pdl::arg(&mut base),
                pdl::arg(&mut scale),
                pdl::arg(&mut nx),
            ];
            // SAFETY: as below; the kernel waits for the previous one first.
            return unsafe { pdl::launch(stream, &f, cfg, &mut params, true) }.map_err(dev_err);
        }
        let mut b = self.dev.stream().launch_builder(&f);
        b.arg(&mut *q.data).arg(&mut *k.data).arg(&pos.ptr);
        match &factors {
            Some(fs) => b.arg(&fs.ptr),
            None => b.arg(&null),
        };
        b.arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&ints[3])
            .arg(&p.freq_base)
            .arg(&p.freq_scale)
            .arg(&neox);
        // SAFETY: matches mo_rope_qk(q, k, pos, factors, n_heads_q, n_heads_k, head_dim,
        // n_rot, freq_base, freq_scale, neox); q and k have positions.len() rows of hq / hk
        // heads, factors n_rot / 2 (checked) or null.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// `split_cols` as one launch (at most SPLIT_MAX_SEGS destinations, every range inside
    /// `src`); `Ok(false)` when not taken.
    pub(super) fn split_cols_impl(
        &self,
        src: &CudaTensor,
        offsets: &[usize],
        dsts: &mut [&mut CudaTensor],
    ) -> Result<bool, BackendError> {
        if offsets.len() != dsts.len()
            || dsts.is_empty()
            || dsts.len() > SPLIT_MAX_SEGS
            || dsts
                .iter()
                .zip(offsets)
                .any(|(d, &o)| d.rows != src.rows || o + d.cols > src.cols)
        {
            return Ok(false);
        }
        let total: usize = dsts.iter().map(|d| d.cols).sum();
        let n = src.rows * total;
        if n == 0 {
            return Ok(true);
        }
        if n > i32::MAX as usize || src.cols > i32::MAX as usize {
            return Ok(false);
        }
        let stream = self.dev.stream();
        let mut p = SplitSegs {
            n_segs: dsts.len() as i32,
            src_cols: src.cols as i32,
            n_rows: src.rows as i32,
            total: total as i32,
            ..SplitSegs::default()
        };
        for (k, (d, &o)) in dsts.iter().zip(offsets).enumerate() {
            p.seg[k] = SplitSeg {
                dst: dev_ptr(&*d.data, stream),
                src_off: o as i32,
                width: d.cols as i32,
            };
        }
        let f = self.function("mo_split_cols")?;
        let cfg = elems_cfg(n);
        if self.pdl() {
            let mut ps = dev_ptr(&*src.data, stream);
            let mut params = [pdl::arg(&mut p), pdl::arg(&mut ps)];
            // SAFETY: as below; the kernel waits for the previous one first.
            unsafe { pdl::launch(stream, &f, cfg, &mut params, true) }.map_err(dev_err)?;
            return Ok(true);
        }
        let mut b = stream.launch_builder(&f);
        b.arg(&p).arg(&*src.data);
        // SAFETY: matches mo_split_cols(SplitSegs, src); every destination holds rows x width
        // f32 and its range lies inside src's columns (checked above).
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(true)
    }
}
