//! The inference op set: a narrow, batch-oriented trait that every device implements, and its
//! CPU implementation.
//!
//! A forward pass is written once (in the `model` crate) as straight-line code over these ops;
//! a backend only has to provide them. Every op works on a *batch* of rows: row `r` of an
//! activation tensor belongs to the token described by `rows[r]` (which sequence, which
//! position), so one call serves the prefill of a prompt, the decode of many sequences, or a
//! mix of both, and reads each weight once.
//!
//! Shapes are given as `[rows, cols]` of row-major f32 tensors; `n` is the number of batch
//! rows. Head-structured activations keep heads side by side in a row: `[n, n_head * head_dim]`.

pub mod conformance;
pub mod cpu;
mod error;
mod params;

use std::sync::Arc;

pub use error::BackendError;
pub use gguf::GgufFile;
pub use params::{AttentionParams, ColumnCopy, KvType, RecurrentShape, RopeMode, RopeParams, Row};

/// How a backend runs a decode step (see [`Backend::begin_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMode {
    /// Ops run as they are called.
    Eager,
    /// Ops are recorded (not yet run); `end_step` runs the recording and keeps it.
    Capture,
    /// Ops only pass their host inputs; `end_step` replays the recording of this key.
    Replay,
}

/// Keeps the first `cols` of every row of `n` values (`v`: whole rows), in place: logits cut to a
/// tokenizer's vocabulary. Nothing happens for `cols >= n`.
pub fn cut_rows_in_place(v: &mut Vec<f32>, n: usize, cols: usize) {
    if cols >= n || n == 0 {
        return;
    }
    let rows = v.len() / n;
    for r in 1..rows {
        v.copy_within(r * n..r * n + cols, r * cols);
    }
    v.truncate(rows * cols);
}

/// The token a greedy sampler picks from one row of logits: [`top_k_row`]'s first (the largest
/// value by `f32::total_cmp`, so +0 above -0, NaN read as `-inf`, the lowest id among equal
/// ones); `None` when no value is finite (nothing can be sampled). [`Backend::argmax_cols`]
/// gives the same pick without bringing the row to the host.
pub fn greedy_pick(row: &[f32]) -> Option<u32> {
    top_k_row(row, 1).first().map(|&(id, _)| id)
}

/// Most candidates [`Backend::top_k_cols`] is asked for (a device keeps them in registers and
/// shared memory per row part).
pub const MAX_TOP_K: usize = 64;

/// The `k` best of one row of logits as a sampler's top-k takes them: `(id, value)` by value
/// highest first (NaN read as `-inf`, ordered as `f32::total_cmp`), the lower id first among
/// equal ones; empty when no value is finite (nothing can be sampled).
/// [`Backend::top_k_cols`] gives the same lists without bringing the row to the host.
pub fn top_k_row(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 || !row.iter().any(|l| l.is_finite()) {
        return Vec::new();
    }
    // (a, b): a comes first; ids only grow, so a later equal value never passes an earlier one
    let first = |a: (u32, f32), b: (u32, f32)| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)).is_gt();
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    for (i, &l) in row.iter().enumerate() {
        let c = (i as u32, if l.is_nan() { f32::NEG_INFINITY } else { l });
        if let Some(&last) = top.get(k - 1) {
            // one float compare passes over almost every value of a long row
            if c.1 < last.1 || !first(c, last) {
                continue;
            }
        }
        let at = top.partition_point(|&t| first(t, c));
        top.insert(at, c);
        top.truncate(k);
    }
    top
}

/// The op set of one device. Implementations: [`cpu::CpuBackend`] (a CUDA one lives in its own
/// crate).
pub trait Backend: Send + Sync + Sized {
    /// f32 activations, row-major `[rows, cols]`, resident on the device.
    type Tensor: Send;
    /// A weight tensor as stored in the GGUF file (matrix `[rows, cols]` of any ggml type, or a
    /// vector), resident where the device reads it.
    type Weight: Send + Sync;
    /// K and V of one attention layer of one sequence, `n_ctx` positions.
    type KvCache: Send;
    /// Conv window and delta-rule matrices of one Gated DeltaNet layer of one sequence.
    /// `Clone` makes snapshots (restore to an earlier position).
    type RecurrentState: Send + Clone;

    /// Whether `RecurrentState::clone_from` copies into the destination's own buffers (equal
    /// shapes), so restoring a snapshot keeps every address a recorded step
    /// ([`Backend::begin_step`]) points at, and the step's recording stays valid.
    const RESTORE_KEEPS_BUFFERS: bool = false;

    /// A short human-readable name ("cpu", "cuda:0").
    fn name(&self) -> String;

    /// Names the layer the next per-layer allocations (`new_kv_cache`, `new_recurrent_state`)
    /// belong to, `None` once done. A backend that spreads layers over devices (partial
    /// offload) puts each layer's caches and states on that layer's device; others ignore it.
    fn set_layer(&self, _layer: Option<usize>) {}

    /// Starts one step identified by `key`: a small batch in which every sequence has at least
    /// one row (decode: one each; a speculative verify pass: a few consecutive ones). Equal
    /// keys promise the same op calls with the same shapes on the same caches and states,
    /// differing only in host inputs (token ids, positions), so a backend
    /// may record the step once and replay it (CUDA graphs). Until [`Backend::end_step`],
    /// results may not be computed yet: no `download` in between. Default: run eagerly.
    fn begin_step(&self, _key: u64) -> StepMode {
        StepMode::Eager
    }

    /// Ends the step begun by [`Backend::begin_step`] (a recording backend launches the
    /// recorded work here).
    fn end_step(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// The end of a layer inside a step begun by [`Backend::begin_step`] (no-op outside one):
    /// a recording backend may start the work recorded so far here, so the device runs the
    /// first layers while the host walks the rest. An error aborts the step (the caller
    /// drops it with [`Backend::abort_step`]). Default: nothing.
    fn step_mark(&self) -> Result<(), BackendError> {
        Ok(())
    }

    /// A hint: the products after the next few ops read `weights`, in this order. A device may
    /// start moving their first bytes toward its cache while those ops run (the CUDA backend:
    /// into L2 from the next op that can take it, on sm_90). No effect on any result; not an
    /// op (it does not break the fused paths' chain). Default: nothing.
    fn prefetch(&self, _weights: &[&Self::Weight]) -> Result<(), BackendError> {
        Ok(())
    }

    /// Ends the step begun by [`Backend::begin_step`] after an op failed: whatever was
    /// recorded is dropped, nothing is kept for the key.
    fn abort_step(&self) {}

    // ---- memory ------------------------------------------------------------------------

    /// Makes the tensor `name` of `file` readable by this device. `dims` are ggml order
    /// (`dims[0]` = row length). The caller has checked the shape.
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Weight, BackendError>;
    /// `(rows, cols)` of a weight; a vector is `(1, len)`.
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);
    /// A zero tensor `[rows, cols]`.
    fn zeros(&self, rows: usize, cols: usize) -> Self::Tensor;
    /// A tensor `[rows, cols]` from host data (`data.len() == rows * cols`).
    fn upload(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor, BackendError>;
    /// The tensor's data on the host, row-major.
    fn download(&self, t: &Self::Tensor) -> Vec<f32>;
    /// The first `cols` values of every row of a `[rows, n]` tensor, row-major `[rows, cols]`
    /// (`cols >= n`: the whole tensor): logits cut to a tokenizer's vocabulary on their way to
    /// the host. The default downloads everything and moves the rows up in place.
    fn download_cols(&self, t: &Self::Tensor, cols: usize) -> Vec<f32> {
        let mut v = self.download(t);
        cut_rows_in_place(&mut v, self.shape(t).1, cols);
        v
    }
    /// [`greedy_pick`] of the first `cols` values of every row of a `[rows, n]` tensor: what a
    /// greedy sampler takes from [`Backend::download_cols`]'s rows, without the rows coming to
    /// the host (a device reduces them where they are). The default takes the first of
    /// [`Backend::top_k_cols`] with k = 1.
    fn argmax_cols(&self, t: &Self::Tensor, cols: usize) -> Vec<Option<u32>> {
        self.top_k_cols(t, cols, 1)
            .into_iter()
            .map(|top| top.first().map(|&(id, _)| id))
            .collect()
    }
    /// [`top_k_row`] of the first `cols` values of every row of a `[rows, n]` tensor, `k` at
    /// most [`MAX_TOP_K`]: the candidates a top-k sampler draws from, without the rows coming
    /// to the host. The default downloads and selects here.
    fn top_k_cols(&self, t: &Self::Tensor, cols: usize, k: usize) -> Vec<Vec<(u32, f32)>> {
        let (rows, n) = self.shape(t);
        let cols = cols.min(n);
        if cols == 0 {
            return vec![Vec::new(); rows];
        }
        self.download_cols(t, cols)
            .chunks(cols)
            .map(|r| top_k_row(r, k))
            .collect()
    }
    /// `(rows, cols)` of a tensor.
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);

    // ---- dense ops ---------------------------------------------------------------------

    /// `out[r] = table[tokens[r]]` (dequantized). table: `[n_vocab, n_embd]`, out: `[n, n_embd]`.
    fn embed(
        &self,
        table: &Self::Weight,
        tokens: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// `out = x · wᵀ`. w: `[m, k]` (any ggml type), x: `[n, k]`, out: `[n, m]`.
    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Several products of one input: `outs[i] = x · ws[i]ᵀ (+ biases[i])`. `biases` is empty
    /// (no biases) or one entry per weight. A device may run products that share a weight type
    /// as one launch over their concatenated rows, quantize x once and add the bias in the
    /// product's epilogue. Default: [`Backend::matmul`] then [`Backend::add_bias`] per weight.
    fn matmul_many(
        &self,
        ws: &[&Self::Weight],
        biases: &[Option<&Self::Weight>],
        x: &Self::Tensor,
        outs: &mut [&mut Self::Tensor],
    ) -> Result<(), BackendError> {
        matmul_many_each(self, ws, biases, x, outs)
    }
    /// `out += x · wᵀ` (a residual added in the product's epilogue). Shapes as
    /// [`Backend::matmul`]. Default: the product into a temporary, then [`Backend::add`].
    fn matmul_add(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        matmul_add_via_temp(self, w, x, out)
    }
    /// `x[r] += bias` for every row. bias: vector `[cols]`, x: `[n, cols]`.
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight) -> Result<(), BackendError>;
    /// `x += y`, both `[n, cols]`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<(), BackendError>;
    /// RMS norm over each group of `w.len()` consecutive columns, times `w`:
    /// `out = x / sqrt(mean(x²) + eps) * w`. x, out: `[n, g * w.len()]` (g groups per row, e.g.
    /// heads). `out` may not alias `x`; see [`Backend::rms_norm_inplace`].
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// [`Backend::rms_norm`] in place.
    fn rms_norm_inplace(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<(), BackendError>;
    /// L2 norm over each group of `group` consecutive columns within columns
    /// `[col0, col0 + len)`: `x = x / sqrt(sum(x²) + eps)`. Other columns are untouched.
    fn l2_norm(
        &self,
        x: &mut Self::Tensor,
        col0: usize,
        len: usize,
        group: usize,
        eps: f32,
    ) -> Result<(), BackendError>;
    /// Rotary embedding in place. x: `[n, n_heads * head_dim]`; row r is at `positions[r]`.
    /// Only the first `p.n_rot` dims of each head rotate.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError>;
    /// [`Backend::rope`] of q and k (same rows, positions and head size) in one call.
    /// Default: two `rope` calls.
    fn rope_qk(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        p: &RopeParams,
    ) -> Result<(), BackendError> {
        self.rope(q, positions, head_dim, p)?;
        self.rope(k, positions, head_dim, p)
    }
    /// `out = silu(gate) * up`, all `[n, n_ff]`.
    fn swiglu(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// `x = silu(x)` in place.
    fn silu(&self, x: &mut Self::Tensor) -> Result<(), BackendError>;
    /// `x *= sigmoid(gate)`, both `[n, cols]` (Qwen3.5 gated attention output).
    fn mul_sigmoid(&self, x: &mut Self::Tensor, gate: &Self::Tensor) -> Result<(), BackendError>;
    /// Gated RMS norm: `x = rms_norm(x, w, eps) * silu(z)` with the norm over each group of
    /// `w.len()` columns. x, z: `[n, g * w.len()]`.
    fn gated_rms_norm(
        &self,
        x: &mut Self::Tensor,
        w: &Self::Weight,
        z: &Self::Tensor,
        eps: f32,
    ) -> Result<(), BackendError>;
    /// Strided column copy: see [`ColumnCopy`]. Splits fused projections (QKV, query+gate).
    fn copy_cols(
        &self,
        src: &Self::Tensor,
        dst: &mut Self::Tensor,
        c: &ColumnCopy,
    ) -> Result<(), BackendError>;
    /// Contiguous column ranges of `src` into several tensors (splitting a fused projection):
    /// `dsts[i][r] = src[r][offsets[i] .. offsets[i] + cols(dsts[i])]`. Default: one
    /// [`Backend::copy_cols`] per destination.
    fn split_cols(
        &self,
        src: &Self::Tensor,
        offsets: &[usize],
        dsts: &mut [&mut Self::Tensor],
    ) -> Result<(), BackendError> {
        split_cols_each(self, src, offsets, dsts)
    }
    /// `out[i] = x[rows[i]]`. x: `[n, cols]`, out: `[rows.len(), cols]`.
    fn get_rows(
        &self,
        x: &Self::Tensor,
        rows: &[usize],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;

    // ---- attention over a KV cache -----------------------------------------------------

    /// A KV cache of one layer for one sequence: `n_ctx` positions of `n_kv_head` heads,
    /// K rows of `head_dim_k` and V rows of `head_dim_v` elements, stored as `kv_type`.
    fn new_kv_cache(
        &self,
        n_ctx: usize,
        n_kv_head: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        kv_type: KvType,
    ) -> Result<Self::KvCache, BackendError>;
    /// Bytes one KV cache of these dimensions takes.
    fn kv_cache_bytes(&self, cache: &Self::KvCache) -> usize;
    /// Causal attention with the cache. q: `[n, n_head * head_dim_k]` (already roped), k:
    /// `[n, n_kv_head * head_dim_k]`, v: `[n, n_kv_head * head_dim_v]`, out:
    /// `[n, n_head * head_dim_v]`. First stores k[r], v[r] at position `rows[r].pos` of
    /// `caches[rows[r].seq]`, then row r attends to positions `0..=rows[r].pos` of its
    /// sequence. Query head h reads KV head `h / (n_head / n_kv_head)`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        rows: &[Row],
        caches: &mut [&mut Self::KvCache],
        p: &AttentionParams,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;

    /// One attention layer from its projections to its output, in one call so a backend can
    /// fuse the chain of a decode step: per-head RMS norms of q and k, RoPE of both at
    /// `a.positions`, [`Backend::attention`] into `out`, and for a gated query `out *=
    /// sigmoid(gate)`. `a.q` and `a.k` hold unspecified values afterwards. Default:
    /// [`attention_block_each`], those ops one by one.
    fn attention_block(
        &self,
        a: AttnBlock<'_, Self>,
        rows: &[Row],
        caches: &mut [&mut Self::KvCache],
        p: &AttentionParams,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        attention_block_each(self, a, rows, caches, p, out)
    }

    // ---- Gated DeltaNet (linear attention) ---------------------------------------------

    /// A zeroed recurrent state of one layer for one sequence.
    fn new_recurrent_state(
        &self,
        shape: &RecurrentShape,
    ) -> Result<Self::RecurrentState, BackendError>;
    /// Bytes one recurrent state takes.
    fn recurrent_state_bytes(&self, s: &Self::RecurrentState) -> usize;
    /// Zeroes a recurrent state (the state at position 0).
    fn reset_recurrent_state(&self, s: &mut Self::RecurrentState);
    /// Causal depthwise conv1d over time with the rolling window in the state, no activation.
    /// x, out: `[n, channels]`; w: `[channels, d_conv]` (ggml `ssm_conv1d`, taps of one
    /// channel contiguous, oldest first). `out[t][c] = Σ_j w[c][j] · x[t - (d_conv-1) + j][c]`,
    /// where inputs before the batch come from the state, which then keeps the last
    /// `d_conv - 1` inputs. Rows of one sequence must be consecutive positions, in order.
    fn conv1d(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Gated DeltaNet's input chain in one call so a device can fuse it (decode steps):
    /// [`Backend::conv1d`] of `x` into a temporary, [`Backend::silu`], [`Backend::l2_norm`] of
    /// its first `norm_cols` columns in groups of `group` (eps), then [`Backend::split_cols`]
    /// into `outs` at `offsets`. Default: [`conv1d_qkv_each`], those ops one by one.
    #[allow(clippy::too_many_arguments)]
    fn conv1d_qkv(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        norm: (usize, usize, f32),
        offsets: &[usize],
        outs: &mut [&mut Self::Tensor],
    ) -> Result<(), BackendError> {
        conv1d_qkv_each(self, x, w, rows, states, norm, offsets, outs)
    }
    /// Gated DeltaNet's in-projections and input chain in one call so a device can fuse them
    /// (decode steps): [`Backend::matmul_many`] of `ws` (no biases) by `h` into `projs`, then
    /// [`Backend::conv1d_qkv`] of `projs[0]` (the q|k|v projection) into `outs`, as there.
    /// Default: the two calls.
    #[allow(clippy::too_many_arguments)]
    fn in_proj_conv1d_qkv(
        &self,
        h: &Self::Tensor,
        ws: &[&Self::Weight],
        projs: &mut [&mut Self::Tensor],
        w: &Self::Weight,
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        norm: (usize, usize, f32),
        offsets: &[usize],
        outs: &mut [&mut Self::Tensor],
    ) -> Result<(), BackendError> {
        self.matmul_many(ws, &[], h, projs)?;
        let Some(x) = projs.first() else {
            return Err(BackendError::Shape {
                op: "in_proj_conv1d_qkv",
                detail: "no projections (the first is the conv's input)".into(),
            });
        };
        self.conv1d_qkv(x, w, rows, states, norm, offsets, outs)
    }
    /// Turns the raw projections into the delta-rule gates, in place, both `[n, n_v_heads]`:
    /// `alpha ← softplus(alpha + dt_bias) · a` (log decay, ≤ 0; GGUF `ssm_a` = -exp(A_log)),
    /// `beta ← sigmoid(beta)`.
    fn delta_rule_gates(
        &self,
        alpha: &mut Self::Tensor,
        beta: &mut Self::Tensor,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
    ) -> Result<(), BackendError>;
    /// Gated delta rule. q, k: `[n, n_k_heads * d_k]` (L2-normed, q not yet scaled), v, out:
    /// `[n, n_v_heads * d_v]`, g (log decay), beta: `[n, n_v_heads]`. Value head h uses key
    /// head `h % n_k_heads` (llama.cpp's GGUF ordering). Per head, with state S `[d_v, d_k]`:
    /// `S ← exp(g)·S; S ← S + β (v − S k) kᵀ; o = S q / sqrt(d_k)`.
    /// Rows of one sequence must be consecutive positions, in order; long runs use the
    /// chunked (WY) form.
    #[allow(clippy::too_many_arguments)]
    fn delta_rule(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        g: &Self::Tensor,
        beta: &Self::Tensor,
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// [`Backend::delta_rule_gates`] with `gates = (dt_bias, a)`, then [`Backend::delta_rule`]:
    /// `alpha` and `beta` are the raw projections (their contents afterwards are unspecified).
    /// One call, which a device may fuse.
    #[allow(clippy::too_many_arguments)]
    fn delta_rule_gated(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        alpha: &mut Self::Tensor,
        beta: &mut Self::Tensor,
        gates: (&Self::Weight, &Self::Weight),
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError> {
        self.delta_rule_gates(alpha, beta, gates.0, gates.1)?;
        self.delta_rule(q, k, v, alpha, beta, rows, states, out)
    }
    /// [`Backend::delta_rule_gated`], then [`Backend::gated_rms_norm`] of `out` with `norm =
    /// (w, z, eps)` (Qwen3.5's output norm): one call, which a device may fuse.
    #[allow(clippy::too_many_arguments)]
    fn delta_rule_gated_norm(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        alpha: &mut Self::Tensor,
        beta: &mut Self::Tensor,
        gates: (&Self::Weight, &Self::Weight),
        rows: &[Row],
        states: &mut [&mut Self::RecurrentState],
        out: &mut Self::Tensor,
        norm: (&Self::Weight, &Self::Tensor, f32),
    ) -> Result<(), BackendError> {
        self.delta_rule_gated(q, k, v, alpha, beta, gates, rows, states, out)?;
        self.gated_rms_norm(out, norm.0, norm.1, norm.2)
    }
}

/// The inputs of [`Backend::attention_block`]: one attention layer's projections of `n` rows.
pub struct AttnBlock<'a, B: Backend> {
    /// Query rows `[n, n_head * q_head_stride]`: head h's `head_dim_k` query values start at
    /// column `h * q_head_stride`.
    pub q: &'a mut B::Tensor,
    pub q_head_stride: usize,
    /// Gated attention (Qwen3.5: query and gate side by side per head): head h's `head_dim_v`
    /// gate values start at column `h * q_head_stride + gate_offset` of `q`.
    pub gate_offset: Option<usize>,
    /// `[n, n_kv_head * head_dim_k]`.
    pub k: &'a mut B::Tensor,
    /// `[n, n_kv_head * head_dim_v]`.
    pub v: &'a B::Tensor,
    /// Per-head RMS norm weights (`head_dim_k` values) of q and of k, applied before RoPE
    /// (Qwen3, Qwen3.5), with their epsilon.
    pub q_norm: Option<&'a B::Weight>,
    pub k_norm: Option<&'a B::Weight>,
    pub norm_eps: f32,
    /// The RoPE position of each row.
    pub positions: &'a [u32],
    pub rope: &'a RopeParams,
}

/// [`Backend::attention_block`] as separate ops: the query (and gate) heads copied out of a
/// strided q, `rms_norm_inplace` of q and k, `rope_qk`, `attention`, `mul_sigmoid` (the
/// default, and a device's fallback for cases its fused launch does not take).
pub fn attention_block_each<B: Backend>(
    b: &B,
    a: AttnBlock<'_, B>,
    rows: &[Row],
    caches: &mut [&mut B::KvCache],
    p: &AttentionParams,
    out: &mut B::Tensor,
) -> Result<(), BackendError> {
    let (n, _) = b.shape(a.k);
    let (hd, stride) = (p.head_dim_k, a.q_head_stride);
    let heads = |src: &B::Tensor, offset: usize, width: usize| {
        let mut t = b.zeros(n, p.n_head * width);
        let c = ColumnCopy {
            n_blocks: p.n_head,
            width,
            src_offset: offset,
            src_stride: stride,
            dst_offset: 0,
            dst_stride: width,
        };
        b.copy_cols(src, &mut t, &c).map(|_| t)
    };
    let gate = match a.gate_offset {
        Some(off) => Some(heads(a.q, off, p.head_dim_v)?),
        None => None,
    };
    let mut own = None;
    let q = if stride == hd {
        a.q
    } else {
        own.insert(heads(a.q, 0, hd)?)
    };
    if let Some(w) = a.q_norm {
        b.rms_norm_inplace(q, w, a.norm_eps)?;
    }
    if let Some(w) = a.k_norm {
        b.rms_norm_inplace(a.k, w, a.norm_eps)?;
    }
    b.rope_qk(q, a.k, a.positions, hd, a.rope)?;
    b.attention(q, a.k, a.v, rows, caches, p, out)?;
    if let Some(g) = &gate {
        b.mul_sigmoid(out, g)?;
    }
    Ok(())
}

/// [`Backend::conv1d_qkv`] as separate ops (the default, and a device's fallback): `norm` is
/// `(norm_cols, group, eps)`.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_qkv_each<B: Backend>(
    b: &B,
    x: &B::Tensor,
    w: &B::Weight,
    rows: &[Row],
    states: &mut [&mut B::RecurrentState],
    norm: (usize, usize, f32),
    offsets: &[usize],
    outs: &mut [&mut B::Tensor],
) -> Result<(), BackendError> {
    let (n, ch) = b.shape(x);
    let mut conv = b.zeros(n, ch);
    b.conv1d(x, w, rows, states, &mut conv)?;
    b.silu(&mut conv)?;
    let (norm_cols, group, eps) = norm;
    b.l2_norm(&mut conv, 0, norm_cols, group, eps)?;
    b.split_cols(&conv, offsets, outs)
}

/// [`Backend::matmul_many`] as separate ops: `matmul` then `add_bias` per weight (the default,
/// and a device's fallback for cases its fused launch does not take).
pub fn matmul_many_each<B: Backend>(
    b: &B,
    ws: &[&B::Weight],
    biases: &[Option<&B::Weight>],
    x: &B::Tensor,
    outs: &mut [&mut B::Tensor],
) -> Result<(), BackendError> {
    if ws.len() != outs.len() || !(biases.is_empty() || biases.len() == ws.len()) {
        return Err(BackendError::Shape {
            op: "matmul_many",
            detail: format!(
                "{} weights, {} biases, {} outputs",
                ws.len(),
                biases.len(),
                outs.len()
            ),
        });
    }
    for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
        b.matmul(w, x, out)?;
        if let Some(Some(bias)) = biases.get(i) {
            b.add_bias(out, bias)?;
        }
    }
    Ok(())
}

/// [`Backend::matmul_add`] as separate ops: the product into a temporary, then `add`.
pub fn matmul_add_via_temp<B: Backend>(
    b: &B,
    w: &B::Weight,
    x: &B::Tensor,
    out: &mut B::Tensor,
) -> Result<(), BackendError> {
    let (rows, cols) = b.shape(out);
    let mut t = b.zeros(rows, cols);
    b.matmul(w, x, &mut t)?;
    b.add(out, &t)
}

/// [`Backend::split_cols`] as one [`Backend::copy_cols`] per destination.
pub fn split_cols_each<B: Backend>(
    b: &B,
    src: &B::Tensor,
    offsets: &[usize],
    dsts: &mut [&mut B::Tensor],
) -> Result<(), BackendError> {
    if offsets.len() != dsts.len() {
        return Err(BackendError::Shape {
            op: "split_cols",
            detail: format!("{} offsets for {} outputs", offsets.len(), dsts.len()),
        });
    }
    for (&off, dst) in offsets.iter().zip(dsts.iter_mut()) {
        let (_, width) = b.shape(dst);
        b.copy_cols(src, dst, &ColumnCopy::contiguous(off, width, 0))?;
    }
    Ok(())
}
