//! Per-sequence state of `CudaBackend` on the device: KV caches with attention, and Gated
//! DeltaNet recurrent states with conv1d and the delta rule. A batch may mix sequences: rows
//! are grouped by sequence and each sequence is one launch over its own buffers.

use backend::{AttentionParams, AttnBlock, BackendError, KvType, RecurrentShape, Row};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::step::Mode;
use super::{dev_err, shape_err, CudaBackend, CudaTensor, CudaWeight, HostInts};
use crate::attention;
use crate::pdl;

/// Largest head size the attention kernel keeps in registers (MO_ATT_MAX_DIM).
const MAX_HEAD_DIM: usize = 512;
/// Warps per attention block (MO_ATT_WARPS).
const ATT_WARPS: u32 = 4;
/// Inside a step, attention splits the context into chunks of about this many positions.
const ATT_SPLIT_POSITIONS: usize = 16;
/// Most attention splits.
const MAX_ATT_SPLITS: usize = 32;

/// The query / key preparation shapes both attention-block fusions take: `n` rows of q
/// (`n_head` heads `q_head_stride` apart, each at least a head of `head_dim_k`, a gate past the
/// head) and k, `n` positions, norms as f32 vectors of one head, RoPE within the head.
fn prep_shapes_ok(a: &AttnBlock<'_, CudaBackend>, p: &AttentionParams, n: usize) -> bool {
    let d = p.head_dim_k;
    let one_head =
        |w: Option<&CudaWeight>| w.is_none_or(|w| w.dense.is_some() && w.rows * w.cols == d);
    let r = a.rope;
    (a.q.rows, a.q.cols) == (n, p.n_head * a.q_head_stride)
        && a.q_head_stride >= d
        && a.gate_offset.is_none_or(|g| g >= d)
        && (a.k.rows, a.k.cols) == (n, p.n_kv_head * d)
        && a.positions.len() == n
        && one_head(a.q_norm)
        && one_head(a.k_norm)
        && r.n_rot.is_multiple_of(2)
        && r.n_rot <= d
        && r.freq_factors
            .as_ref()
            .is_none_or(|f| f.len() >= r.n_rot / 2)
}

/// K and V of one layer of one sequence: `n_ctx` positions of `n_kv_head * head_dim` values
/// each, stored as `kv_type` rows (ggml block layouts for q8_0 / q4_0).
pub struct CudaKvCache {
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    n_ctx: usize,
    n_kv_head: usize,
    head_dim_k: usize,
    head_dim_v: usize,
    kv_type: KvType,
    /// Bytes of one position's K (resp. V) row.
    k_pos_bytes: usize,
    v_pos_bytes: usize,
}

impl CudaKvCache {
    pub(super) fn bytes(&self) -> usize {
        self.n_ctx * (self.k_pos_bytes + self.v_pos_bytes)
    }

    /// The cache as the attention kernels read it (`row_caches`: see [`attention::KvRef`]).
    fn kv_ref(&self, row_caches: u64) -> attention::KvRef<'_> {
        attention::KvRef {
            k: &self.k,
            v: &self.v,
            k_pos_bytes: self.k_pos_bytes,
            v_pos_bytes: self.v_pos_bytes,
            kv_type: self.kv_type,
            row_caches,
        }
    }
}

/// Splits of a flash decode launch of `n_rows` rows: inside a step from the largest `n_ctx`
/// (a recorded launch fits every length), else from the longest row; at most 256 row-splits
/// per launch so the partials stay bounded.
fn flash_decode_splits(
    mode: Mode,
    max_ctx: usize,
    max_len: usize,
    tile: usize,
    n_rows: usize,
) -> usize {
    let bound = if mode != Mode::Off { max_ctx } else { max_len };
    attention::decode_splits(bound, tile).min((256 / n_rows.max(1)).max(1))
}

pub use super::recurrent::CudaRecurrentState;

/// The cache type as the kernels number it (mo_kv_store, mo_attention_split).
fn kv_type_code(t: KvType) -> i32 {
    match t {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Q8_0 => 2,
        KvType::Q4_0 => 3,
    }
}

/// The launch rows of [`CudaBackend::attend_flash`]: batch rows and positions on the device,
/// and `table` none (every row reads the given cache) or two u64 per row on the device (its
/// own K and V cache: the decode rows of several sequences in one launch).
struct FlashRows {
    n_rows: usize,
    row_ids: HostInts,
    pos: HostInts,
    table: Option<HostInts>,
    /// The longest row's length (splits outside a step) and the largest `n_ctx` (inside).
    max_len: usize,
    max_ctx: usize,
}

/// Whether ops over several sequences' caches and states (decode attention, conv1d, the
/// delta rule) run as one launch over all of them through a table of per-sequence buffers,
/// instead of one launch (or three) per sequence; `REDLINE_BATCHED_SEQS=0` turns it off.
pub(super) fn batched_seqs() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_BATCHED_SEQS").map_or(true, |v| v != "0"))
}

/// Whether a mixed step's decode rows of several sequences go to one batched launch beside the
/// prompt chunks (`REDLINE_MIXED_BATCHED=0`: every sequence on its own when any has a chunk, the
/// old path, for A/B measurements).
fn mixed_batched() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_MIXED_BATCHED").map_or(true, |v| v != "0"))
}

/// The decode tile when the rows of every sequence can go to the device in one batched
/// split-KV decode launch ([`CudaBackend::attend_flash_batched`]): two or more sequences with
/// rows, each with fewer rows than the prefill kernel takes, caches of one type and row size
/// with a flash decode kernel ([`batched_seqs`]).
fn batched_decode_tile(
    dev: &crate::device::CudaDevice,
    by_seq: &[Vec<usize>],
    caches: &[&mut CudaKvCache],
    p: &AttentionParams,
) -> Option<usize> {
    if !batched_seqs() {
        return None;
    }
    let used: Vec<(usize, &CudaKvCache)> = by_seq
        .iter()
        .zip(caches)
        .filter(|(idx, _)| !idx.is_empty())
        .map(|(idx, c)| (idx.len(), &**c))
        .collect();
    let &(_, c0) = used.first()?;
    if used.len() < 2
        || used.iter().any(|&(n, c)| {
            (c.kv_type, c.k_pos_bytes, c.v_pos_bytes)
                != (c0.kv_type, c0.k_pos_bytes, c0.v_pos_bytes)
                || prefill_takes(dev, p, n, c)
        })
    {
        return None;
    }
    attention::decode_tile_for(p, c0.kv_type)
}

/// Whether a sequence's `n` rows over `cache` go to the tensor-core prefill kernel (not to a
/// split-KV decode launch).
fn prefill_takes(
    dev: &crate::device::CudaDevice,
    p: &AttentionParams,
    n: usize,
    cache: &CudaKvCache,
) -> bool {
    n >= attention::PREFILL_MIN_ROWS && attention::prefill_supported(dev, p, cache.kv_type)
}

/// Batch rows grouped by sequence, in batch order (rows of one sequence keep their order).
fn rows_by_seq(rows: &[Row], n_seqs: usize) -> Result<Vec<Vec<usize>>, BackendError> {
    let mut by = vec![Vec::new(); n_seqs];
    for (i, r) in rows.iter().enumerate() {
        by.get_mut(r.seq)
            .ok_or(BackendError::BadSequence { seq: r.seq, n_seqs })?
            .push(i);
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

impl CudaBackend {
    /// The raw K and V bytes of a cache, `[n_ctx][n_kv_head * head_dim]` rows in the cache's
    /// type (ggml block layouts), for tests that compare them with the CPU quantizer.
    pub fn kv_cache_to_host(&self, c: &CudaKvCache) -> Result<(Vec<u8>, Vec<u8>), BackendError> {
        let s = self.dev.stream();
        let k = s.clone_dtoh(&c.k).map_err(dev_err)?;
        let v = s.clone_dtoh(&c.v).map_err(dev_err)?;
        Ok((k, v))
    }

    pub(super) fn new_kv_cache_impl(
        &self,
        n_ctx: usize,
        n_kv_head: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        kv_type: KvType,
    ) -> Result<CudaKvCache, BackendError> {
        let block = kv_type.ggml_type().block_size();
        for hd in [head_dim_k, head_dim_v] {
            if !hd.is_multiple_of(block) {
                return Err(BackendError::KvHeadDim {
                    kv_type,
                    head_dim: hd,
                    block,
                });
            }
            if hd == 0 || hd > MAX_HEAD_DIM {
                return Err(shape_err(
                    "new_kv_cache",
                    format!("head size {hd} (1..={MAX_HEAD_DIM})"),
                ));
            }
        }
        let row = |hd: usize| {
            kv_type
                .row_bytes(n_kv_head * hd)
                .ok_or_else(|| shape_err("new_kv_cache", format!("{n_kv_head} heads of {hd}")))
        };
        let (k_pos_bytes, v_pos_bytes) = (row(head_dim_k)?, row(head_dim_v)?);
        let alloc = |bytes: usize| {
            self.dev
                .stream()
                .alloc_zeros::<u8>(bytes.max(1))
                .map_err(|_| BackendError::Alloc {
                    what: "KV cache",
                    bytes: bytes as u128,
                })
        };
        let k = alloc(n_ctx.saturating_mul(k_pos_bytes))?;
        let v = alloc(n_ctx.saturating_mul(v_pos_bytes))?;
        Ok(CudaKvCache {
            k,
            v,
            n_ctx,
            n_kv_head,
            head_dim_k,
            head_dim_v,
            kv_type,
            k_pos_bytes,
            v_pos_bytes,
        })
    }

    /// Device f32 for `len` split partials (0: none): the step arena's shared scratch inside a
    /// step, else a buffer of its own (returned, to live until the launches are queued).
    fn split_partials(&self, len: usize) -> Result<(u64, Option<CudaSlice<f32>>), BackendError> {
        if len == 0 {
            Ok((0, None))
        } else if self.mode() == Mode::Off {
            let own = self.alloc_f32(len)?;
            Ok((super::step::dev_ptr(&own, self.dev.stream()), Some(own)))
        } else {
            Ok((self.step_ctl().shared_scratch(len)?, None))
        }
    }

    /// [`backend::Backend::attention_block`]: one fused launch where it applies
    /// ([`Self::fused_attention_takes`]), else the ops one by one.
    pub(super) fn attention_block_impl(
        &self,
        a: AttnBlock<'_, CudaBackend>,
        rows: &[Row],
        caches: &mut [&mut CudaKvCache],
        p: &AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        match self.fused_attention_takes(&a, rows, caches, p, out) {
            Some(kernel) => self.timed(
                || "attention_block".to_string(),
                || self.attention_block_fused(kernel, a, rows[0], caches[rows[0].seq], p, out),
            ),
            None if self.attn_prep_takes(&a, p) => {
                self.attention_block_rows(a, rows, caches, p, out)
            }
            None => backend::attention_block_each(self, a, rows, caches, p, out),
        }
    }

    /// Whether [`Self::attention_block_rows`] takes a block the fused one-row chain does not:
    /// the staged `attn_rows` fusion and the fused paths on, head sizes of a multiple of 32 up
    /// to 1024 (one thread per value), norms as f32 vectors of one head, RoPE within the head,
    /// a gate inside each head's stride. Shapes only.
    fn attn_prep_takes(&self, a: &AttnBlock<'_, CudaBackend>, p: &AttentionParams) -> bool {
        let d = p.head_dim_k;
        self.fused()
            && self.staged().attn_rows
            && d.is_multiple_of(32)
            && d <= 1024
            && prep_shapes_ok(a, p, a.k.rows)
            && a.gate_offset
                .is_none_or(|g| g + p.head_dim_v <= a.q_head_stride)
    }

    /// [`backend::attention_block_each`] with its query / key preparation (the query and gate
    /// heads copied out of a strided q, the q and k norms, RoPE: five launches) as one
    /// (kernels/model_ops.cu `mo_attn_prep_rows`, the same bits), then `attention` and the
    /// gate's `mul_sigmoid` as there. For any number of rows (verify passes, batched decode).
    fn attention_block_rows(
        &self,
        a: AttnBlock<'_, CudaBackend>,
        rows: &[Row],
        caches: &mut [&mut CudaKvCache],
        p: &AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        use backend::Backend;
        let n = a.k.rows;
        let (d, dv) = (p.head_dim_k, p.head_dim_v);
        // taken before the replay check: a replayed step must take the same arena blocks
        let mut gate = match a.gate_offset {
            Some(_) => Some(self.scratch_tensor(n, p.n_head * dv)?),
            None => None,
        };
        let mut own = if a.q_head_stride != d {
            Some(self.scratch_tensor(n, p.n_head * d)?)
        } else {
            None
        };
        self.timed(
            || "attn_prep_rows".to_string(),
            || self.attn_prep_rows_launch(&a, own.as_mut(), gate.as_mut(), p),
        )?;
        self.attn_rows
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let q: &CudaTensor = match &own {
            Some(t) => t,
            None => a.q,
        };
        self.attention(q, a.k, a.v, rows, caches, p, out)?;
        if let Some(g) = &gate {
            self.mul_sigmoid(out, g)?;
        }
        Ok(())
    }

    /// The `mo_attn_prep_rows` launch of [`Self::attention_block_rows`]: q into `qo` (or in
    /// place when None), the gate heads into `gate`, k in place.
    fn attn_prep_rows_launch(
        &self,
        a: &AttnBlock<'_, CudaBackend>,
        qo: Option<&mut CudaTensor>,
        gate: Option<&mut CudaTensor>,
        p: &AttentionParams,
    ) -> Result<(), BackendError> {
        let n = a.k.rows;
        if n == 0 {
            return Ok(());
        }
        let stream = self.dev.stream();
        let r = a.rope;
        let (pos, factors) = self.rope_host_inputs(a.positions, r)?;
        if self.replaying() {
            return Ok(());
        }
        let f = self.function("mo_attn_prep_rows")?;
        let d = p.head_dim_k;
        let dense = |w: Option<&CudaWeight>| {
            w.and_then(|w| w.dense.as_ref())
                .map_or(0, |x| super::step::dev_ptr(x, stream))
        };
        let q = super::step::dev_ptr(&*a.q.data, stream);
        let neox = i32::from(super::rope_neox(&r.mode));
        let cfg = LaunchConfig {
            grid_dim: (n as u32, (p.n_head + p.n_kv_head) as u32, 1),
            block_dim: (d as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut args = pdl::Args::new();
        args.push(q)
            .push(qo.map_or(q, |t| super::step::dev_ptr(&*t.data, stream)))
            .push(gate.map_or(0, |t| super::step::dev_ptr(&*t.data, stream)))
            .push(super::step::dev_ptr(&*a.k.data, stream))
            .push(dense(a.q_norm))
            .push(dense(a.k_norm))
            .push(pos.ptr)
            .push(factors.as_ref().map_or(0, |f| f.ptr))
            .push(p.n_head as i32)
            .push(p.n_kv_head as i32)
            .push(d as i32)
            .push(a.q_head_stride as i32)
            .push(a.gate_offset.unwrap_or(0) as i32)
            .push(p.head_dim_v as i32)
            .push(r.n_rot as i32)
            .push(r.freq_base)
            .push(r.freq_scale)
            .push(neox)
            .push(a.norm_eps);
        // SAFETY: matches mo_attn_prep_rows(q, qo, gate, k, qw, kw, pos, factors, n_heads_q,
        // n_heads_k, head_dim, q_stride, gate_off, dv, n_rot, freq_base, freq_scale, neox, eps);
        // attn_prep_takes checked the shapes: q holds n rows of n_head * q_stride, qo (q itself
        // when the stride is d) and gate n rows of n_head * d / dv, k n rows of n_kv_head * d,
        // the norms d values or none, n positions, the factors n_rot / 2; one block of d <= 1024
        // threads per row and head. With PDL it reads only weights and host inputs before its wait.
        unsafe { args.launch(stream, &f, cfg, self.pdl()) }.map_err(dev_err)
    }

    /// The fused decode chain's kernel when it takes this call: the fused paths and flash
    /// attention on (`REDLINE_FUSED_ATTENTION=0` turns just this off), one row (one sequence's
    /// decode step), an f16 cache with a fused kernel for the head size, norms as f32 vectors
    /// of one head, RoPE within the head. Shapes only, so every step of one recorded key decides
    /// alike. Several rows (batched decode of several sequences) take the separate ops: on the
    /// H200 the fused launch measured +0.9 % (32B) and +2.4 % (27B) at one stream but -2.4 % and
    /// -0.6 % at eight (BENCHMARKS.md, session 12).
    fn fused_attention_takes(
        &self,
        a: &AttnBlock<'_, CudaBackend>,
        rows: &[Row],
        caches: &[&mut CudaKvCache],
        p: &AttentionParams,
        out: &CudaTensor,
    ) -> Option<&'static str> {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on =
            *ON.get_or_init(|| std::env::var("REDLINE_FUSED_ATTENTION").map_or(true, |v| v != "0"));
        let ([row], true) = (rows, on && self.fused() && attention::enabled()) else {
            return None;
        };
        let kernel = attention::fused_decode_kernel(p, KvType::F16)?;
        let c = caches.get(row.seq)?;
        let d = p.head_dim_k;
        let takes = (c.kv_type, c.n_kv_head, c.head_dim_k, c.head_dim_v)
            == (KvType::F16, p.n_kv_head, d, p.head_dim_v)
            && prep_shapes_ok(a, p, 1)
            && a.gate_offset.is_none_or(|g| g + d <= a.q_head_stride)
            && (a.v.rows, a.v.cols) == (1, p.n_kv_head * d)
            && (out.rows, out.cols) == (1, p.n_head * d);
        takes.then_some(kernel)
    }

    /// The RoPE angle cache of these parameters for `fa_decode_fused_*` (kernels/flash_attn.cu
    /// `FdFuse::rc`: `n_rot / 2` entries of (position + 1, cos, sin), which the first attention
    /// layer of a step fills and the others read), made at first use outside a capture; 0
    /// (every launch computes its angles) when off ([`ROPE_CACHE`]) or inside a capture
    /// before an eager run made it.
    fn rope_cache(&self, rope: &backend::RopeParams) -> Result<u64, BackendError> {
        if !ROPE_CACHE.on() {
            return Ok(0);
        }
        let key = (
            rope.freq_base.to_bits(),
            rope.freq_scale.to_bits(),
            rope.n_rot,
            rope.freq_factors
                .as_ref()
                .map(|f| f.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()),
        );
        let stream = self.dev.stream();
        let mut m = self.rope_caches.lock().unwrap_or_else(|e| e.into_inner());
        if !m.contains_key(&key) {
            if self.mode() == Mode::Capture {
                return Ok(0);
            }
            let buf = stream
                .alloc_zeros::<f32>(4 * (rope.n_rot / 2).max(1))
                .map_err(dev_err)?;
            m.insert(key.clone(), buf);
        }
        Ok(super::step::dev_ptr(&m[&key], stream))
    }

    /// One launch of `kernel` for [`Self::attention_block_impl`]'s one row (see
    /// [`attention::launch_decode_fused`]); splits and partials as [`Self::attend_flash`].
    fn attention_block_fused(
        &self,
        kernel: &'static str,
        a: AttnBlock<'_, CudaBackend>,
        row: Row,
        cache: &mut CudaKvCache,
        p: &AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let stream = self.dev.stream();
        if row.pos >= cache.n_ctx {
            return Err(BackendError::PositionOutOfRange {
                pos: row.pos,
                n_ctx: cache.n_ctx,
            });
        }
        let row_ids = self.host_ints(&[0])?;
        let pos = self.host_ints(&[row.pos as i32])?;
        let (rope_pos, factors) = self.rope_host_inputs(&a.positions[..1], a.rope)?;
        let mode = self.mode();
        let tile = attention::decode_tile_for(p, KvType::F16)
            .ok_or_else(|| shape_err("attention_block", format!("no decode tile for {p:?}")))?;
        let splits = flash_decode_splits(mode, cache.n_ctx, row.pos + 1, tile, 1);
        let part_len = attention::partials_len(1, p, splits);
        // Taken before the replay check: a replayed step must take the same arena blocks.
        let (part_ptr, _part_own) = self.split_partials(part_len)?;
        self.fused_attention
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if mode == Mode::Replay {
            return Ok(());
        }
        // a prefetch hint given right before this op: the o-projection's weights
        self.issue_prefetch(u64::MAX)?;
        let dense = |w: Option<&CudaWeight>| {
            w.and_then(|w| w.dense.as_ref())
                .map_or(0, |x| super::step::dev_ptr(x, stream))
        };
        let f = attention::FusedInputs {
            k: super::step::dev_ptr(&*a.k.data, stream),
            v: super::step::dev_ptr(&*a.v.data, stream),
            q_norm: dense(a.q_norm),
            k_norm: dense(a.k_norm),
            eps: a.norm_eps,
            factors: factors.as_ref().map_or(0, |f| f.ptr),
            rope_pos: rope_pos.ptr,
            n_rot: a.rope.n_rot,
            neox: super::rope_neox(&a.rope.mode),
            freq_base: a.rope.freq_base,
            freq_scale: a.rope.freq_scale,
            q_stride: a.q_head_stride,
            gate_offset: a.gate_offset,
            q8: (0, 0),
            rope_cache: self.rope_cache(a.rope)?,
        };
        let kv = cache.kv_ref(0);
        let out_ptr = super::step::dev_ptr(&*out.data, stream);
        let launch = |q8: (u64, u64)| {
            attention::launch_decode_fused(
                &self.dev,
                kernel,
                super::step::dev_ptr(&*a.q.data, stream),
                row_ids.ptr,
                pos.ptr,
                1,
                &kv,
                out_ptr,
                part_ptr,
                splits,
                p,
                &attention::FusedInputs { q8, ..f },
            )
            .map_err(dev_err)
        };
        if self.staged().attn_q8 && p.head_dim_v.is_multiple_of(64) {
            // the o-projection after it reads this q8_1 copy (no quantize launch)
            self.with_q8_of(out, launch)?;
            self.attn_q8
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        launch((0, 0))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_impl(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        rows: &[Row],
        caches: &mut [&mut CudaKvCache],
        p: &AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let n = rows.len();
        if p.n_kv_head == 0 || p.n_head == 0 || !p.n_head.is_multiple_of(p.n_kv_head) {
            return Err(shape_err(
                "attention",
                format!("{} heads over {} KV heads", p.n_head, p.n_kv_head),
            ));
        }
        check_cols("attention q", q, n, p.n_head * p.head_dim_k)?;
        check_cols("attention k", k, n, p.n_kv_head * p.head_dim_k)?;
        check_cols("attention v", v, n, p.n_kv_head * p.head_dim_v)?;
        check_cols("attention out", out, n, p.n_head * p.head_dim_v)?;
        for c in caches.iter() {
            if (c.n_kv_head, c.head_dim_k, c.head_dim_v)
                != (p.n_kv_head, p.head_dim_k, p.head_dim_v)
            {
                return Err(shape_err(
                    "attention",
                    format!(
                        "cache of {} heads of {}/{} for {p:?}",
                        c.n_kv_head, c.head_dim_k, c.head_dim_v
                    ),
                ));
            }
        }
        let by_seq = rows_by_seq(rows, caches.len())?;
        let flash = attention::enabled();
        if flash {
            if let Some(tile) = batched_decode_tile(&self.dev, &by_seq, caches, p) {
                return self.attend_flash_batched(q, k, v, rows, &by_seq, caches, tile, p, out);
            }
        }
        // A mixed step (decode rows beside prompt chunks): the decode rows of every sequence in
        // one batched launch, each chunk on its own below. `batched`: the sequences it took.
        let mut batched = vec![false; by_seq.len()];
        let chunk =
            |(idx, c): (&Vec<usize>, &&mut CudaKvCache)| prefill_takes(&self.dev, p, idx.len(), c);
        if flash && mixed_batched() && by_seq.iter().zip(caches.iter()).any(chunk) {
            let decode: Vec<Vec<usize>> = by_seq
                .iter()
                .zip(caches.iter())
                .map(|e| if chunk(e) { Vec::new() } else { e.0.clone() })
                .collect();
            if let Some(tile) = batched_decode_tile(&self.dev, &decode, caches, p) {
                self.attend_flash_batched(q, k, v, rows, &decode, caches, tile, p, out)?;
                for (b, idx) in batched.iter_mut().zip(&decode) {
                    *b = !idx.is_empty();
                }
            }
        }
        for (s, idx) in by_seq.iter().enumerate() {
            if idx.is_empty() || batched[s] {
                continue;
            }
            let cache = &mut *caches[s];
            if let Some(r) = idx.iter().map(|&i| rows[i]).find(|r| r.pos >= cache.n_ctx) {
                return Err(BackendError::PositionOutOfRange {
                    pos: r.pos,
                    n_ctx: cache.n_ctx,
                });
            }
            let row_ids: Vec<i32> = idx.iter().map(|&i| i as i32).collect();
            let pos: Vec<i32> = idx.iter().map(|&i| rows[i].pos as i32).collect();
            let row_ids = self.host_ints(&row_ids)?;
            let pos = self.host_ints(&pos)?;
            let max_len = idx.iter().map(|&i| rows[i].pos + 1).max().unwrap_or(1);
            let flash_tile = flash
                .then(|| attention::decode_tile_for(p, cache.kv_type))
                .flatten();
            match flash_tile {
                Some(tile) => {
                    let rows = FlashRows {
                        n_rows: idx.len(),
                        row_ids,
                        pos,
                        table: None,
                        max_len,
                        max_ctx: cache.n_ctx,
                    };
                    self.attend_flash(q, k, v, cache, &rows, tile, p, out)?
                }
                None => self.attend_one_sequence(
                    q,
                    k,
                    v,
                    cache,
                    &row_ids,
                    &pos,
                    idx.len(),
                    max_len,
                    p,
                    out,
                )?,
            }
        }
        Ok(())
    }

    /// Decode rows of several sequences (each with fewer than
    /// [`attention::PREFILL_MIN_ROWS`] rows) in one store, one split-KV decode and one merge
    /// launch over all of them, each launch row reading its own sequence's cache through a
    /// table of cache addresses, instead of three launches per sequence (8 decode streams of
    /// a 64-layer model: 1 536 launches per step fewer).
    #[allow(clippy::too_many_arguments)]
    fn attend_flash_batched(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        rows: &[Row],
        by_seq: &[Vec<usize>],
        caches: &mut [&mut CudaKvCache],
        tile: usize,
        p: &AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let stream = self.dev.stream();
        let (mut row_ids, mut pos, mut table) = (Vec::new(), Vec::new(), Vec::new());
        let (mut max_len, mut max_ctx, mut first) = (1, 1, None);
        for (s, idx) in by_seq.iter().enumerate() {
            if idx.is_empty() {
                continue;
            }
            let cache = &*caches[s];
            if let Some(r) = idx.iter().map(|&i| rows[i]).find(|r| r.pos >= cache.n_ctx) {
                return Err(BackendError::PositionOutOfRange {
                    pos: r.pos,
                    n_ctx: cache.n_ctx,
                });
            }
            first.get_or_insert(s);
            max_ctx = max_ctx.max(cache.n_ctx);
            let (kp, vp) = (
                super::step::dev_ptr(&cache.k, stream),
                super::step::dev_ptr(&cache.v, stream),
            );
            for &i in idx {
                row_ids.push(i as i32);
                pos.push(rows[i].pos as i32);
                max_len = max_len.max(rows[i].pos + 1);
                // two little-endian u64 per launch row, as i32 words
                for a in [kp, vp] {
                    table.push(a as u32 as i32);
                    table.push((a >> 32) as u32 as i32);
                }
            }
        }
        let Some(first) = first else {
            return Ok(());
        };
        let rows = FlashRows {
            n_rows: row_ids.len(),
            row_ids: self.host_ints(&row_ids)?,
            pos: self.host_ints(&pos)?,
            table: Some(self.host_ints(&table)?),
            max_len,
            max_ctx,
        };
        self.attend_flash(q, k, v, caches[first], &rows, tile, p, out)
    }

    /// Stores the new K/V rows of one sequence, then runs the kernels of [`attention`]:
    /// the tensor-core prefill kernel for [`attention::PREFILL_MIN_ROWS`] rows or more where
    /// it takes the shape and cache type, else split-KV decode (splits from `n_ctx` inside a
    /// step, so a recorded launch fits every length; from the longest row otherwise), with
    /// at most 256 row-splits per call so the partials stay bounded.
    #[allow(clippy::too_many_arguments)]
    fn attend_flash(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        cache: &CudaKvCache,
        rows: &FlashRows,
        tile: usize,
        p: &AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let mode = self.mode();
        let (row_ids, pos, n_rows) = (&rows.row_ids, &rows.pos, rows.n_rows);
        let table = rows.table.as_ref().map_or(0, |t| t.ptr);
        // The prefill kernel reads one sequence's cache: never with a table.
        let prefill = table == 0
            && n_rows >= attention::PREFILL_MIN_ROWS
            && attention::prefill_supported(&self.dev, p, cache.kv_type);
        let splits = if prefill {
            1
        } else {
            flash_decode_splits(mode, rows.max_ctx, rows.max_len, tile, n_rows)
        };
        let part_len = attention::partials_len(n_rows, p, splits);
        // Taken before the replay check: a replayed step must take the same arena blocks.
        let (part_ptr, _part_own) = self.split_partials(part_len)?;
        if mode == Mode::Replay {
            return Ok(());
        }
        self.store_kv_rows_to(k, v, cache, row_ids, pos, n_rows, table)?;
        let kv = cache.kv_ref(table);
        if prefill {
            attention::launch_prefill(
                &self.dev,
                &q.data,
                row_ids.ptr,
                pos.ptr,
                n_rows,
                &kv,
                &mut out.data,
                p,
            )
        } else {
            attention::launch_decode(
                &self.dev,
                &q.data,
                row_ids.ptr,
                pos.ptr,
                n_rows,
                &kv,
                &mut out.data,
                part_ptr,
                splits,
                tile,
                p,
            )
        }
        .map_err(dev_err)
    }

    /// Stores the K and V rows `row_ids` of `k` / `v` at positions `pos` of the cache.
    fn store_kv_rows(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        cache: &mut CudaKvCache,
        row_ids: &HostInts,
        pos: &HostInts,
        n_rows: usize,
    ) -> Result<(), BackendError> {
        self.store_kv_rows_to(k, v, cache, row_ids, pos, n_rows, 0)
    }

    /// [`Self::store_kv_rows`]; with `table` non-zero (the device address of two u64 per
    /// launch row) each row goes to its own caches, all of `cache`'s shape and type.
    #[allow(clippy::too_many_arguments)]
    fn store_kv_rows_to(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        cache: &CudaKvCache,
        row_ids: &HostInts,
        pos: &HostInts,
        n_rows: usize,
        table: u64,
    ) -> Result<(), BackendError> {
        let store = self.function("mo_kv_store2")?;
        let (wk, wv) = (k.cols, v.cols);
        let cfg = LaunchConfig {
            grid_dim: (n_rows as u32, (wk.div_ceil(32) + wv.div_ceil(32)) as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = self.dev.stream();
        let mut a = pdl::Args::new();
        a.push(super::step::dev_ptr(&k.data, stream))
            .push(super::step::dev_ptr(&v.data, stream))
            .push(row_ids.ptr)
            .push(pos.ptr)
            .push(super::step::dev_ptr(&cache.k, stream))
            .push(super::step::dev_ptr(&cache.v, stream))
            .push(wk as i32)
            .push(wv as i32)
            .push(cache.k_pos_bytes as i64)
            .push(cache.v_pos_bytes as i64)
            .push(kv_type_code(cache.kv_type))
            .push(table);
        // SAFETY: matches mo_kv_store2(k, v, rows, pos, kc, vc, wk, wv, kpb, vpb, type, kvp);
        // rows < n, pos < n_ctx (checked), each cache holds n_ctx rows of its pos_bytes (a
        // table's caches too: same shape and type, checked by the caller); block types have
        // widths % 32 == 0 (checked at creation). With PDL the kernel waits for the
        // kernel that wrote k and v first.
        unsafe { a.launch(stream, &store, cfg, pdl::enabled(self.dev.arch())) }.map_err(dev_err)?;
        Ok(())
    }

    /// Stores the new K/V rows of one sequence, then runs split-KV attention for its rows.
    #[allow(clippy::too_many_arguments)]
    fn attend_one_sequence(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        cache: &mut CudaKvCache,
        row_ids: &HostInts,
        pos: &HostInts,
        n_rows: usize,
        max_len: usize,
        p: &AttentionParams,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let mode = self.mode();
        // Splits: inside a step a fixed count from n_ctx (the launch must not depend on the
        // length, graphs replay it); otherwise from the longest row, and one split for long
        // batches (prefill rows already fill the card, and partials would cost memory).
        let splits = if mode != Mode::Off {
            cache.n_ctx.div_ceil(ATT_SPLIT_POSITIONS)
        } else if n_rows <= 4 {
            max_len.div_ceil(8)
        } else {
            1
        }
        .clamp(1, MAX_ATT_SPLITS);
        let part_len = if splits > 1 {
            n_rows * p.n_head * splits * (p.head_dim_v + 2)
        } else {
            0
        };
        // Taken before the replay check: a replayed step must take the same arena blocks.
        let (part_ptr, _part_own) = self.split_partials(part_len)?;
        if mode == Mode::Replay {
            return Ok(());
        }
        let ty = kv_type_code(cache.kv_type);
        // Store this sequence's new K and V rows first: row r then attends 0..=pos[r].
        self.store_kv_rows(k, v, cache, row_ids, pos, n_rows)?;
        let attend = self.function("mo_attention_split")?;
        let cfg = LaunchConfig {
            grid_dim: (n_rows as u32, p.n_head as u32, splits as u32),
            block_dim: (32, ATT_WARPS, 1),
            shared_mem_bytes: 0,
        };
        let ints = [
            p.n_head as i32,
            p.n_kv_head as i32,
            p.head_dim_k as i32,
            p.head_dim_v as i32,
        ];
        let (kpb, vpb) = (cache.k_pos_bytes as i64, cache.v_pos_bytes as i64);
        let mut b = self.dev.stream().launch_builder(&attend);
        b.arg(&*q.data)
            .arg(&row_ids.ptr)
            .arg(&pos.ptr)
            .arg(&cache.k)
            .arg(&cache.v)
            .arg(&mut *out.data)
            .arg(&part_ptr);
        for i in &ints {
            b.arg(i);
        }
        b.arg(&kpb).arg(&vpb).arg(&ty).arg(&p.scale);
        // SAFETY: matches mo_attention_split(q, rows, pos, kc, vc, out, part, n_head,
        // n_kv_head, hdk, hdv, k_pos_bytes, v_pos_bytes, type, scale); head sizes <= 512
        // (checked at cache creation), positions < n_ctx, part holds n_rows * n_head *
        // splits * (hdv + 2) values when splits > 1 (unused otherwise).
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        if splits > 1 {
            let merge = self.function("mo_attention_merge")?;
            let cfg = LaunchConfig {
                grid_dim: (n_rows as u32, p.n_head as u32, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            };
            let (nh, hdv, sp) = (p.n_head as i32, p.head_dim_v as i32, splits as i32);
            let mut b = self.dev.stream().launch_builder(&merge);
            b.arg(&part_ptr)
                .arg(&row_ids.ptr)
                .arg(&mut *out.data)
                .arg(&nh)
                .arg(&hdv)
                .arg(&sp);
            // SAFETY: matches mo_attention_merge(part, rows, out, n_head, hdv, S); part was
            // filled by the launch above, rows < n.
            unsafe { b.launch(cfg) }.map_err(dev_err)?;
        }
        Ok(())
    }

    pub(super) fn new_recurrent_state_impl(
        &self,
        shape: &RecurrentShape,
    ) -> Result<CudaRecurrentState, BackendError> {
        self.new_recurrent_state_rec(shape)
    }

    pub(super) fn reset_recurrent_state_impl(&self, st: &mut CudaRecurrentState) {
        self.reset_recurrent_state_rec(st)
    }

    pub(super) fn conv1d_impl(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let (_, form) = super::recurrent::configured_forms();
        self.conv1d_with(x, w, rows, states, out, form)
    }

    pub(super) fn delta_rule_gates_impl(
        &self,
        alpha: &mut CudaTensor,
        beta: &mut CudaTensor,
        dt_bias: &CudaWeight,
        a: &CudaWeight,
    ) -> Result<(), BackendError> {
        self.delta_rule_gates_rec(alpha, beta, dt_bias, a)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn delta_rule_impl(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        g: &CudaTensor,
        beta: &CudaTensor,
        rows: &[Row],
        states: &mut [&mut CudaRecurrentState],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        let (form, _) = super::recurrent::configured_forms();
        self.delta_rule_with(q, k, v, g, beta, rows, states, out, form)
    }
}

/// Whether the fused one-row attention keeps the RoPE angles of a step for the layers after the
/// first ([`CudaBackend::rope_cache`]). `REDLINE_ROPE_CACHE=0` (a developer's knob for A/B runs):
/// every launch computes them, as before session 37. The same bits either way.
static ROPE_CACHE: crate::switch::Switch = crate::switch::Switch::new("REDLINE_ROPE_CACHE");

/// Forces whether the fused one-row attention keeps a step's RoPE angles for the layers after
/// the first (`None`: back to `REDLINE_ROPE_CACHE`). For tests and benchmarks.
pub fn set_rope_cache(on: Option<bool>) {
    ROPE_CACHE.set(on);
}
