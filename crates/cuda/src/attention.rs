//! Attention over a sequence's KV cache on the device (kernels/flash_attn.cu): which kernel a
//! batch takes, how it is cut, its shared-memory and scratch sizes, and the launches.
//!
//! - **Decode** (`fa_decode_*` + `fa_merge`): for rows that each attend to a long context. A
//!   block takes one row, one KV head (all `n_head / n_kv_head` query heads of its group read
//!   each K/V load) and one split of the row's positions. The head-size kernels
//!   (`fa_decode_d{64,128,256}_*`) give each split an even share of the positions and deal
//!   them in chunks of 8 (4 for D = 256) to the block's 4 warps, each with its own online
//!   softmax and its own ring of K/V chunks in shared f16 (`cp.async` for f16 caches on sm_80+,
//!   so a block's loads are in flight right after the wait); the warps meet once at the end.
//!   The generic kernel (other head sizes, f32 caches) loads tiles of `T` positions into shared
//!   f32. Splits write partials `(max, sum, acc[head_dim_v])` that one merge launch combines.
//!   The split count is chosen by the caller from a bound that does not change between decode
//!   steps (`n_ctx` inside a recorded step), so the launch replays in a CUDA graph at any
//!   depth. The decode rows of several sequences can share one launch: [`KvRef::row_caches`]
//!   then names each launch row's caches.
//! - **Prefill** (`fa_prefill_d{64,128,256}_*`): for many rows of one sequence. A block takes
//!   64 rows and one query head; Q goes to shared f16 once, then per tile of 32 positions
//!   S = Q K^T and O += P V on tensor cores (PTX wmma m16n16k16, f32 accumulation) with an
//!   online softmax and the causal mask by absolute positions: no n x n matrix anywhere.
//!   Rows need not be consecutive; the work per block is bounded by its largest position.
//!
//! Both read K/V from the cache as stored (f32, f16, q8_0, q4_0; the prefill kernel takes
//! f16/q8_0/q4_0 and converts tiles to f16; an f32 cache keeps f32 math on the decode kernel).
//!
//! Scratch: the decode partials, `partials_len` f32 — `n_rows * n_head * splits *
//! (head_dim_v + 2)` for `splits > 1`, at most [`MAX_SPLITS`] splits; the prefill kernel needs
//! none.
//!
//! `REDLINE_FLASH_ATTN=1` turns these kernels on, `0` off (the older per-row kernels of
//! kernels/model_ops.cu run instead); unset, [`DEFAULT_ENABLED`] decides (on since they passed
//! on a card); [`set_enabled`] does the same for tests.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use backend::{AttentionParams, KvType};
use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use crate::pdl;
use crate::sources::Program;

/// Threads of a decode block (FD_THREADS).
const DECODE_THREADS: usize = 128;
/// float4 accumulators per decode thread (FD_MAX_ITEMS): `G * head_dim_v / 4` must fit.
const DECODE_MAX_ITEMS: usize = 8;
/// Most decode splits (FA_MAX_SPLITS).
pub const MAX_SPLITS: usize = 64;
/// Decode splits are sized so each takes about this many tiles (fewer splits waste less merge
/// work; more fill the card when one row has few KV heads, and each block then walks a shorter
/// chain of tiles, four barriers each). `REDLINE_FA_TILES_PER_SPLIT` overrides (benchmark knob).
fn tiles_per_split() -> usize {
    static T: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("REDLINE_FA_TILES_PER_SPLIT")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&t| t >= 1)
            .unwrap_or(2)
    })
}
/// Query rows of a prefill block (FP_BM) and positions per K/V tile (FP_BN).
const PREFILL_ROWS: usize = 64;
const PREFILL_TILE: usize = 32;
/// Warps of a prefill block (FP_WARPS).
const PREFILL_WARPS: usize = 4;
/// Rows of one sequence in one call from which the prefill kernel is used (below, the decode
/// kernel runs once per row: a few rows re-read the cache from L2 at little cost).
pub const PREFILL_MIN_ROWS: usize = 8;
/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_SMEM_BYTES: usize = 48 << 10;

/// 0: not read yet, 1: off, 2: on.
static ENABLED: AtomicU8 = AtomicU8::new(0);

/// Whether the kernels of this module serve `CudaBackend::attention` (`REDLINE_FLASH_ATTN`:
/// `0` off, anything else on; unset: [`DEFAULT_ENABLED`]).
pub fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var("REDLINE_FLASH_ATTN").map_or(DEFAULT_ENABLED, |v| v != "0");
            ENABLED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Default of [`enabled`] when `REDLINE_FLASH_ATTN` is unset: on since tests/gpu_attention.rs,
/// the attention conformance suite and the fixture tests passed with the kernels on (H200,
/// 2026-12-02/03); `REDLINE_FLASH_ATTN=0` goes back to the kernels of model_ops.cu.
pub const DEFAULT_ENABLED: bool = true;

/// Turns the kernels of this module on or off for the whole process (tests, A/B benches).
pub fn set_enabled(on: bool) {
    ENABLED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Set: decode always takes the generic kernel (tests compare both).
static GENERIC_DECODE: AtomicBool = AtomicBool::new(false);

/// Makes decode take the generic kernel (`fa_decode_*`) even where a head-size kernel
/// (`fa_decode_d*`) exists: for tests that check both.
pub fn set_generic_decode(on: bool) {
    GENERIC_DECODE.store(on, Ordering::Relaxed);
}

/// Most query heads of one decode block of the head-size kernels (FD_MAX_G).
const DECODE_MAX_G: usize = 8;

/// Query heads a head-size decode block takes at most by default: the 32B's group of 5 in
/// blocks of 3 + 2 (16 blocks at one split instead of 8) decoded one row 0.9–1.7 % faster in
/// three H100 windows (session 34, BENCHMARKS.md); the 27B's 6 as 3 + 3 were within noise
/// (−0.7..+0.2 %).
const DECODE_HEADS_PER_BLOCK: usize = 3;

/// Blocks per KV head (along grid.y) of the head-size decode kernels: its group of query heads
/// in blocks of at most `REDLINE_FA_HEADS_PER_BLOCK` (1..=8, read once; default and otherwise
/// [`DECODE_HEADS_PER_BLOCK`]) heads. Fewer heads a block put a short context's decode chain on
/// more SMs; each head's arithmetic is the same in every block shape.
fn decode_sub_blocks(p: &AttentionParams) -> usize {
    static HPB: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let hpb = *HPB.get_or_init(|| {
        std::env::var("REDLINE_FA_HEADS_PER_BLOCK")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|h| (1..=DECODE_MAX_G).contains(h))
            .unwrap_or(DECODE_HEADS_PER_BLOCK)
    });
    group(p).div_ceil(hpb).max(1)
}

/// Rows of at least this many positions decode their KV head's whole group of query heads in
/// one block (kernels/flash_attn.cu `flash_decode_heads`' whole_from; 0: never): the test
/// override, else `REDLINE_FA_WHOLE_GROUP_FROM=N`, else [`WHOLE_GROUP_DEFAULT`] for the head
/// size `d`. The kernel takes the choice per row at run time, so recorded steps get both, and
/// the bits are the same either way.
fn whole_group_from(d: usize) -> i32 {
    static ENV: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    match WHOLE_GROUP_OVERRIDE.load(Ordering::Relaxed) {
        -1 => ENV
            .get_or_init(|| {
                std::env::var("REDLINE_FA_WHOLE_GROUP_FROM")
                    .ok()
                    .and_then(|v| v.trim().parse::<i32>().ok())
                    .filter(|&n| n >= 0)
            })
            .unwrap_or(if d > 128 {
                WHOLE_GROUP_DEFAULT.1
            } else {
                WHOLE_GROUP_DEFAULT.0
            }),
        n => n,
    }
}

/// The default of [`whole_group_from`]: (head size up to 128, larger). Session 40 (H100,
/// s40b): Qwen2.5-32B's shape (5 heads a KV head of 128) gains from the whole group at depth
/// 2048 (+2.0 %) and 4096 (+3.9 %) and loses at depth 0 (-1.8 %) and 1024 (-1.3 %) against
/// blocks of 3 + 2 heads; Qwen3.5-27B's (6 heads of 256) gains at every depth measured (0:
/// +0.5 %, 4096: +2.4 %).
pub const WHOLE_GROUP_DEFAULT: (i32, i32) = (2048, 1);

/// -1: `REDLINE_FA_WHOLE_GROUP_FROM` (or the default) decides; else the positions from which (0:
/// never).
static WHOLE_GROUP_OVERRIDE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Forces the length from which a decode row's whole query-head group runs in one block
/// (`Some(0)`: never; `None`: back to `REDLINE_FA_WHOLE_GROUP_FROM` or the default). For tests and
/// benchmarks.
pub fn set_whole_group_from(n: Option<u32>) {
    WHOLE_GROUP_OVERRIDE.store(
        n.map_or(-1, |n| n.min(i32::MAX as u32) as i32),
        Ordering::Relaxed,
    );
}

/// The head-size decode kernel for this shape and cache type, if there is one: K and V heads
/// of 64, 128 or 256, an f16/q8_0/q4_0 cache.
fn decode_d_kernel(p: &AttentionParams, kv_type: KvType) -> Option<&'static str> {
    if p.head_dim_k != p.head_dim_v || GENERIC_DECODE.load(Ordering::Relaxed) {
        return None;
    }
    Some(match (p.head_dim_k, kv_type) {
        (64, KvType::F16) => "fa_decode_d64_f16",
        (64, KvType::Q8_0) => "fa_decode_d64_q8_0",
        (64, KvType::Q4_0) => "fa_decode_d64_q4_0",
        (128, KvType::F16) => "fa_decode_d128_f16",
        (128, KvType::Q8_0) => "fa_decode_d128_q8_0",
        (128, KvType::Q4_0) => "fa_decode_d128_q4_0",
        (256, KvType::F16) => "fa_decode_d256_f16",
        (256, KvType::Q8_0) => "fa_decode_d256_q8_0",
        (256, KvType::Q4_0) => "fa_decode_d256_q4_0",
        _ => return None,
    })
}

/// Positions per tile of the head-size decode kernels (T).
fn decode_d_tile(d: usize) -> usize {
    if d > 128 {
        16
    } else {
        32
    }
}

/// Dynamic shared memory of a head-size decode block: q [8][d], K and V tiles [T][d + 16],
/// probabilities [8][T], three [8] arrays and the fused chain's scratch [4 d + 16], f32
/// (kernels/flash_attn.cu `FdShape::HOST_BYTES`).
pub fn decode_d_smem_bytes(d: usize) -> usize {
    let t = decode_d_tile(d);
    4 * (DECODE_MAX_G * d + 2 * t * (d + 16) + DECODE_MAX_G * t + 3 * DECODE_MAX_G + 4 * d + 16)
}

/// A KV cache as the kernels read it: `[n_ctx][n_kv_head * head_dim]` rows of `kv_type`.
pub struct KvRef<'a> {
    pub k: &'a CudaSlice<u8>,
    pub v: &'a CudaSlice<u8>,
    pub k_pos_bytes: usize,
    pub v_pos_bytes: usize,
    pub kv_type: KvType,
    /// Decode only: 0 when every launch row reads `k` / `v`; else the device address of a
    /// table of two u64 per launch row, that row's K and V cache (the rows of several
    /// sequences in one launch; every cache of `k`'s shape and type).
    pub row_caches: u64,
}

fn group(p: &AttentionParams) -> usize {
    p.n_head / p.n_kv_head.max(1)
}

/// Dynamic shared memory of a decode block: q [G][dk], K and V tiles [T][d + 4], scores
/// [G][T] and three [G] arrays, f32.
pub fn decode_smem_bytes(p: &AttentionParams, tile: usize) -> usize {
    let g = group(p);
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    4 * (g * dk + tile * (dk + 4) + tile * (dv + 4) + g * tile + 3 * g)
}

/// Positions per decode tile for this shape, or `None` where the decode kernel does not apply
/// (head sizes not a multiple of 8, a group too wide for its accumulators or shared memory).
pub fn decode_tile(p: &AttentionParams) -> Option<usize> {
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    if p.n_kv_head == 0
        || p.n_head == 0
        || !p.n_head.is_multiple_of(p.n_kv_head)
        || dk == 0
        || dv == 0
        || !dk.is_multiple_of(8)
        || !dv.is_multiple_of(8)
        || group(p) * dv / 4 > DECODE_THREADS * DECODE_MAX_ITEMS
    {
        return None;
    }
    [32, 16, 8]
        .into_iter()
        .find(|&t| decode_smem_bytes(p, t) <= DEFAULT_SMEM_BYTES)
}

/// Positions per decode tile for this shape and cache type (the head-size kernel's where it
/// applies, else [`decode_tile`]'s).
pub fn decode_tile_for(p: &AttentionParams, kv_type: KvType) -> Option<usize> {
    let generic = decode_tile(p)?;
    Some(match decode_d_kernel(p, kv_type) {
        Some(_) => decode_d_tile(p.head_dim_k),
        None => generic,
    })
}

/// Splits for rows of up to `positions` positions in tiles of `tile`: about
/// [`tiles_per_split`] tiles each, at most [`MAX_SPLITS`].
pub fn decode_splits(positions: usize, tile: usize) -> usize {
    positions
        .div_ceil(tile.max(1))
        .div_ceil(tiles_per_split())
        .clamp(1, MAX_SPLITS)
}

/// f32 values of decode partials for `n_rows` rows cut into `splits` (0 for one split: the
/// kernel then writes the output directly).
pub fn partials_len(n_rows: usize, p: &AttentionParams, splits: usize) -> usize {
    if splits <= 1 {
        0
    } else {
        n_rows * p.n_head * splits * (p.head_dim_v + 2)
    }
}

/// Dynamic shared memory of a prefill block for head size `d`: Q, K and V tiles in f16
/// ([64 + 32 + 32][d + 8]), per-warp scores [4][16][36] f32, per-row floats and ints.
pub fn prefill_smem_bytes(d: usize) -> usize {
    2 * (PREFILL_ROWS + 2 * PREFILL_TILE) * (d + 8)
        + 4 * PREFILL_WARPS * 16 * (PREFILL_TILE + 4)
        + 4 * PREFILL_WARPS * 16
        + 4 * (2 * PREFILL_ROWS + 1)
}

/// The prefill kernel's name for this shape and cache type, if there is one.
fn prefill_kernel(p: &AttentionParams, kv_type: KvType) -> Option<&'static str> {
    if p.head_dim_k != p.head_dim_v
        || p.n_kv_head == 0
        || p.n_head == 0
        || !p.n_head.is_multiple_of(p.n_kv_head)
    {
        return None;
    }
    Some(match (p.head_dim_k, kv_type) {
        (64, KvType::F16) => "fa_prefill_d64_f16",
        (64, KvType::Q8_0) => "fa_prefill_d64_q8_0",
        (64, KvType::Q4_0) => "fa_prefill_d64_q4_0",
        (128, KvType::F16) => "fa_prefill_d128_f16",
        (128, KvType::Q8_0) => "fa_prefill_d128_q8_0",
        (128, KvType::Q4_0) => "fa_prefill_d128_q4_0",
        (256, KvType::F16) => "fa_prefill_d256_f16",
        (256, KvType::Q8_0) => "fa_prefill_d256_q8_0",
        (256, KvType::Q4_0) => "fa_prefill_d256_q4_0",
        _ => return None,
    })
}

/// Whether the prefill kernel takes this shape and cache type on this device (head sizes
/// 64/128/256 equal for K and V, an f16/q8_0/q4_0 cache, its shared memory available).
pub fn prefill_supported(dev: &CudaDevice, p: &AttentionParams, kv_type: KvType) -> bool {
    prefill_kernel(p, kv_type).is_some()
        && prefill_smem_bytes(p.head_dim_k) <= max_smem_per_block(dev)
}

/// Largest dynamic shared memory per block this device allows after opting in.
pub(crate) fn max_smem_per_block(dev: &CudaDevice) -> usize {
    use cudarc::driver::sys::CUdevice_attribute_enum as A;
    dev.context()
        .attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_or(DEFAULT_SMEM_BYTES, |v| v.max(0) as usize)
}

fn kv_code(t: KvType) -> &'static str {
    match t {
        KvType::F32 => "f32",
        KvType::F16 => "f16",
        KvType::Q8_0 => "q8_0",
        KvType::Q4_0 => "q4_0",
    }
}

fn shape_check(p: &AttentionParams, kv: &KvRef<'_>) -> Result<()> {
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    let row = |d: usize| kv.kv_type.row_bytes(p.n_kv_head * d);
    if row(dk) != Some(kv.k_pos_bytes) || row(dv) != Some(kv.v_pos_bytes) {
        return Err(CudaError::Shape(format!(
            "attention cache rows of {}/{} bytes for {p:?} ({})",
            kv.k_pos_bytes, kv.v_pos_bytes, kv.kv_type
        )));
    }
    Ok(())
}

/// Decode attention for `n_rows` rows of one sequence: row i is batch row `rows[i]` of `q`
/// (`[*, n_head * head_dim_k]`) at position `pos[i]` (device i32 arrays), attending cache
/// positions `0..=pos[i]`; the result goes to the same row of `out` (`[*, n_head *
/// head_dim_v]`). `splits > 1` needs `part` (a device pointer) of [`partials_len`] f32 and
/// adds the merge launch. `tile` from [`decode_tile`]. Positions must be below the cache's
/// `n_ctx` (the caller checks).
#[allow(clippy::too_many_arguments)]
pub fn launch_decode(
    dev: &CudaDevice,
    q: &CudaSlice<f32>,
    rows: u64,
    pos: u64,
    n_rows: usize,
    kv: &KvRef<'_>,
    out: &mut CudaSlice<f32>,
    part: u64,
    splits: usize,
    tile: usize,
    p: &AttentionParams,
) -> Result<()> {
    if n_rows == 0 {
        return Ok(());
    }
    shape_check(p, kv)?;
    if decode_tile_for(p, kv.kv_type) != Some(tile) || splits == 0 || splits > MAX_SPLITS {
        return Err(CudaError::Shape(format!(
            "decode attention tile {tile} / {splits} splits for {p:?}"
        )));
    }
    if let Some(name) = decode_d_kernel(p, kv.kv_type) {
        return launch_decode_d(dev, name, q, rows, pos, n_rows, kv, out, part, splits, p);
    }
    let f = dev.function(
        Program::FlashAttn,
        &format!("fa_decode_{}", kv_code(kv.kv_type)),
    )?;
    let cfg = LaunchConfig {
        grid_dim: (splits as u32, p.n_kv_head as u32, n_rows as u32),
        block_dim: (DECODE_THREADS as u32, 1, 1),
        shared_mem_bytes: decode_smem_bytes(p, tile) as u32,
    };
    let mut a = pdl::Args::new();
    a.push(dev.device_address(q))
        .push(rows)
        .push(pos)
        .push(dev.device_address(kv.k))
        .push(dev.device_address(kv.v))
        .push(dev.device_address(out))
        .push(part)
        .push(p.n_head as i32)
        .push(p.n_kv_head as i32)
        .push(p.head_dim_k as i32)
        .push(p.head_dim_v as i32)
        .push(kv.k_pos_bytes as i64)
        .push(kv.v_pos_bytes as i64)
        .push(p.scale)
        .push(tile as i32)
        .push(kv.row_caches);
    // SAFETY: matches fa_decode_*(q, rows, pos, kc, vc, out, part, n_head, n_kv_head, dk, dv,
    // kpb, vpb, scale, T, kvp); kvp is 0 or a table of n_rows (K, V) caches like kv's;
    // cache rows checked against the shape, head sizes multiples of 8
    // and the group within the accumulators (decode_tile), positions < n_ctx (caller), part
    // holds partials_len values when splits > 1 (caller), shared memory sized for tile. The
    // kernel waits for the previous one first (PDL).
    unsafe { a.launch(dev.stream(), &f, cfg, pdl::enabled(dev.arch())) }?;
    launch_merge(dev, rows, n_rows, out, part, splits, p)
}

/// The head-size decode kernel `name` (fa_decode_d*), then the merge.
#[allow(clippy::too_many_arguments)]
fn launch_decode_d(
    dev: &CudaDevice,
    name: &str,
    q: &CudaSlice<f32>,
    rows: u64,
    pos: u64,
    n_rows: usize,
    kv: &KvRef<'_>,
    out: &mut CudaSlice<f32>,
    part: u64,
    splits: usize,
    p: &AttentionParams,
) -> Result<()> {
    let f = dev.function(Program::FlashAttn, name)?;
    let n_sub = decode_sub_blocks(p);
    let cfg = LaunchConfig {
        grid_dim: (splits as u32, (p.n_kv_head * n_sub) as u32, n_rows as u32),
        block_dim: (DECODE_THREADS as u32, 1, 1),
        shared_mem_bytes: decode_d_smem_bytes(p.head_dim_k) as u32,
    };
    let mut a = pdl::Args::new();
    a.push(dev.device_address(q))
        .push(rows)
        .push(pos)
        .push(dev.device_address(kv.k))
        .push(dev.device_address(kv.v))
        .push(dev.device_address(out))
        .push(part)
        .push(p.n_head as i32)
        .push(p.n_kv_head as i32)
        .push(kv.k_pos_bytes as i64)
        .push(kv.v_pos_bytes as i64)
        .push(p.scale)
        .push(kv.row_caches)
        .push(min_per(p.head_dim_k))
        .push(whole_group_from(p.head_dim_k));
    // SAFETY: matches fa_decode_d*(q, rows, pos, kc, vc, out, part, n_head, n_kv_head, kpb,
    // vpb, scale, kvp, min_per, whole_from); kvp is 0 or a table of n_rows (K, V) caches like kv's; dk == dv ==
    // the kernel's D and the cache type match it (decode_d_kernel),
    // cache rows checked against the shape, positions < n_ctx (caller), part holds
    // partials_len values when splits > 1 (caller), shared memory as the kernel lays it out.
    // The kernel waits for the previous one first (PDL).
    unsafe { a.launch(dev.stream(), &f, cfg, pdl::enabled(dev.arch())) }?;
    let out = dev.device_address(out);
    launch_merge_active(dev, rows, pos, n_rows, out, part, splits, p, None, (0, 0))
}

/// The fused decode chain's kernel for this shape and cache type (`fa_decode_fused_d*`: K and
/// V heads of 64, 128 or 256 over an f16 cache), if there is one.
pub fn fused_decode_kernel(p: &AttentionParams, kv_type: KvType) -> Option<&'static str> {
    if kv_type != KvType::F16 || decode_d_kernel(p, kv_type).is_none() {
        return None;
    }
    Some(match p.head_dim_k {
        64 => "fa_decode_fused_d64",
        128 => "fa_decode_fused_d128",
        256 => "fa_decode_fused_d256",
        _ => return None,
    })
}

/// What the fused decode chain takes beyond a decode launch (flash_attn.cu `FdFuse`); device
/// addresses, 0 for none.
#[derive(Clone, Copy)]
pub struct FusedInputs {
    /// `[*, n_kv_head * d]`: each launch row's new K (before norm and RoPE) and V.
    pub k: u64,
    pub v: u64,
    /// Per-head RMS norm weights of q and k (`d` f32 each), or 0.
    pub q_norm: u64,
    pub k_norm: u64,
    pub eps: f32,
    /// RoPE: frequency divisors (`n_rot / 2` f32) or 0, and each launch row's position.
    pub factors: u64,
    pub rope_pos: u64,
    pub n_rot: usize,
    pub neox: bool,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// Floats from one query head to the next in a q row, and the gate's offset within them.
    pub q_stride: usize,
    pub gate_offset: Option<usize>,
    /// Device addresses of a q8_1 copy of out (int8 values, f32 (d, d * sum) per 32) that the
    /// kernel writing out fills too, for the product after it; (0, 0): none.
    pub q8: (u64, u64),
    /// The RoPE angle cache of these RoPE parameters (`n_rot / 2` entries of 16 bytes, zeroed
    /// at first: flash_attn.cu `FdFuse::rc`), or 0: the angles computed in every launch.
    pub rope_cache: u64,
}

/// The fused decode chain of one new token per launch row (`fa_decode_fused_*`, kernel `name`
/// from [`fused_decode_kernel`]): per-head norms and RoPE of q and of the new K row, the new
/// K/V rows stored and split-KV attention in one launch, each split at least one decode split's
/// worth of positions (a short context has one active split, whose block writes `out` itself);
/// for `splits > 1` then `fa_merge_active` (a no-op while one split is active). `q`: `[*, n_head *
/// f.q_stride]`; `rows`, `pos`, `part` as [`launch_decode`] (positions below `n_ctx`, checked by
/// the caller).
#[allow(clippy::too_many_arguments)]
pub fn launch_decode_fused(
    dev: &CudaDevice,
    name: &str,
    q: u64,
    rows: u64,
    pos: u64,
    n_rows: usize,
    kv: &KvRef<'_>,
    out: u64,
    part: u64,
    splits: usize,
    p: &AttentionParams,
    f: &FusedInputs,
) -> Result<()> {
    shape_check(p, kv)?;
    if fused_decode_kernel(p, kv.kv_type) != Some(name)
        || splits == 0
        || splits > MAX_SPLITS
        || f.n_rot > p.head_dim_k
        || !f.n_rot.is_multiple_of(2)
        || f.q_stride < p.head_dim_k
        || f.gate_offset
            .is_some_and(|g| g < p.head_dim_k || g + p.head_dim_v > f.q_stride)
        || (f.q8 != (0, 0) && !p.head_dim_v.is_multiple_of(64))
    {
        return Err(CudaError::Shape(format!(
            "fused decode {name}, {splits} splits, n_rot {}, q stride {} for {p:?}",
            f.n_rot, f.q_stride
        )));
    }
    if n_rows == 0 {
        return Ok(());
    }
    let func = dev.function(Program::FlashAttn, name)?;
    let cfg = LaunchConfig {
        grid_dim: (
            splits as u32,
            (p.n_kv_head * decode_sub_blocks(p)) as u32,
            n_rows as u32,
        ),
        block_dim: (DECODE_THREADS as u32, 1, 1),
        shared_mem_bytes: decode_d_smem_bytes(p.head_dim_k) as u32,
    };
    let mut a = pdl::Args::new();
    a.push(q)
        .push(rows)
        .push(pos)
        .push(dev.device_address(kv.k))
        .push(dev.device_address(kv.v))
        .push(out)
        .push(part)
        .push(p.n_head as i32)
        .push(p.n_kv_head as i32)
        .push(kv.k_pos_bytes as i64)
        .push(kv.v_pos_bytes as i64)
        .push(p.scale)
        .push(kv.row_caches)
        .push(f.k)
        .push(f.v)
        .push(f.q_norm)
        .push(f.k_norm)
        .push(f.factors)
        .push(f.rope_pos)
        .push(min_per(p.head_dim_k))
        .push(f.q_stride as i32)
        .push(f.gate_offset.map_or(-1, |g| g as i32))
        .push(f.n_rot as i32)
        .push(i32::from(f.neox))
        .push(f.freq_base)
        .push(f.freq_scale)
        .push(f.eps)
        .push(f.q8.0)
        .push(f.q8.1)
        .push(f.rope_cache)
        .push(whole_group_from(p.head_dim_k));
    // SAFETY: matches fa_decode_fused_d*(q, rows, pos, kc, vc, out, part, n_head, n_kv_head,
    // kpb, vpb, scale, kvp, k, v, qn, kn, factors, rpos, min_per, q_stride, gate_off, n_rot,
    // neox, freq_base, freq_scale, eps, xq, xds, rc, whole_from); rc 0 or n_rot / 2 16-byte entries kept for
    // these RoPE parameters alone; the caller vouches for the device addresses: q of
    // n_head heads f.q_stride apart per row (the gate inside the stride, checked), k / v
    // [*, n_kv_head * d], norms of d f32 or 0, factors of n_rot / 2 or 0, rpos / pos / rows of
    // n_rows, part of partials_len when splits > 1, each cache (kvp: a table of n_rows K, V
    // pairs of this shape); dk == dv == the kernel's d over an f16 cache
    // (fused_decode_kernel), n_rot even and <= d (checked), f.q8 0 or n_rows * n_head * d int8
    // and n_rows * n_head * d / 16 f32. The kernel waits for the previous one first (PDL).
    unsafe { a.launch(dev.stream(), &func, cfg, pdl::enabled(dev.arch())) }?;
    launch_merge_active(
        dev,
        rows,
        pos,
        n_rows,
        out,
        part,
        splits,
        p,
        Some((q, f.q_stride, f.gate_offset)),
        f.q8,
    )
}

/// Positions a head-size decode split takes at least (per = max(ceil(len / S), this)): one
/// decode split's worth, so a short context has few active splits.
fn min_per(d: usize) -> i32 {
    (decode_d_tile(d) * tiles_per_split()) as i32
}

/// For `splits > 1`: merges the active splits of a head-size decode launch (`fa_decode_d*`,
/// `fa_decode_fused_*`) into `out` (device address), each head times the sigmoid of its gate
/// when `gate` is `(q, q_stride, Some(offset))` (q's device address, floats per head).
#[allow(clippy::too_many_arguments)]
fn launch_merge_active(
    dev: &CudaDevice,
    rows: u64,
    pos: u64,
    n_rows: usize,
    out: u64,
    part: u64,
    splits: usize,
    p: &AttentionParams,
    gate: Option<(u64, usize, Option<usize>)>,
    q8: (u64, u64),
) -> Result<()> {
    if splits <= 1 {
        return Ok(());
    }
    let (q, q_stride, gate_off) = match gate {
        Some((q, stride, Some(off))) => (q, stride as i32, off as i32),
        _ => (0, 0, -1),
    };
    let merge = dev.function(Program::FlashAttn, "fa_merge_active")?;
    let cfg = LaunchConfig {
        grid_dim: (n_rows as u32, p.n_head as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut a = pdl::Args::new();
    a.push(part)
        .push(rows)
        .push(pos)
        .push(out)
        .push(q)
        .push(p.n_head as i32)
        .push(p.head_dim_v as i32)
        .push(splits as i32)
        .push(min_per(p.head_dim_k))
        .push(q_stride)
        .push(gate_off)
        .push(q8.0)
        .push(q8.1);
    // SAFETY: matches fa_merge_active(part, rows, pos, out, q, n_head, dv, S, min_per,
    // q_stride, gate_off, xq, xds) (q8: 0 or out's q8_1 copy, dv a multiple of 64); part holds the S <= MAX_SPLITS partials per (row, head) the decode
    // launch before it wrote for its active splits (same S and min_per), rows / pos of n_rows,
    // out [*, n_head * dv], q (read only with gate_off >= 0) of n_head heads q_stride apart with
    // the gate inside the stride (the caller checked). Waits for the decode first (PDL).
    unsafe { a.launch(dev.stream(), &merge, cfg, pdl::enabled(dev.arch())) }?;
    Ok(())
}

/// Merges the partials of `splits > 1` decode splits into `out`.
fn launch_merge(
    dev: &CudaDevice,
    rows: u64,
    n_rows: usize,
    out: &mut CudaSlice<f32>,
    part: u64,
    splits: usize,
    p: &AttentionParams,
) -> Result<()> {
    if splits > 1 {
        let f = dev.function(Program::FlashAttn, "fa_merge")?;
        let cfg = LaunchConfig {
            grid_dim: (n_rows as u32, p.n_head as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut a = pdl::Args::new();
        a.push(part)
            .push(rows)
            .push(dev.device_address(out))
            .push(p.n_head as i32)
            .push(p.head_dim_v as i32)
            .push(splits as i32);
        // SAFETY: matches fa_merge(part, rows, out, n_head, dv, S); part filled above with
        // S <= FA_MAX_SPLITS partials per (row, head); the kernel waits for them first (PDL).
        unsafe { a.launch(dev.stream(), &f, cfg, pdl::enabled(dev.arch())) }?;
    }
    Ok(())
}

/// Prefill attention for `n_rows` rows of one sequence (same row/position convention as
/// [`launch_decode`]); needs [`prefill_supported`].
#[allow(clippy::too_many_arguments)]
pub fn launch_prefill(
    dev: &CudaDevice,
    q: &CudaSlice<f32>,
    rows: u64,
    pos: u64,
    n_rows: usize,
    kv: &KvRef<'_>,
    out: &mut CudaSlice<f32>,
    p: &AttentionParams,
) -> Result<()> {
    if n_rows == 0 {
        return Ok(());
    }
    shape_check(p, kv)?;
    let name = prefill_kernel(p, kv.kv_type).ok_or_else(|| {
        CudaError::Shape(format!(
            "no prefill attention kernel for {p:?} over {}",
            kv.kv_type
        ))
    })?;
    let f = dev.function(Program::FlashAttn, name)?;
    let smem = prefill_smem_bytes(p.head_dim_k);
    if smem > DEFAULT_SMEM_BYTES {
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )?;
    }
    let cfg = LaunchConfig {
        grid_dim: (n_rows.div_ceil(PREFILL_ROWS) as u32, p.n_head as u32, 1),
        block_dim: (32, PREFILL_WARPS as u32, 1),
        shared_mem_bytes: smem as u32,
    };
    let (n, nh, nkv) = (n_rows as i32, p.n_head as i32, p.n_kv_head as i32);
    let (kpb, vpb) = (kv.k_pos_bytes as i64, kv.v_pos_bytes as i64);
    let mut b = dev.stream().launch_builder(&f);
    b.arg(q)
        .arg(&rows)
        .arg(&pos)
        .arg(&n)
        .arg(kv.k)
        .arg(kv.v)
        .arg(&mut *out)
        .arg(&nh)
        .arg(&nkv)
        .arg(&kpb)
        .arg(&vpb)
        .arg(&p.scale);
    // SAFETY: matches fa_prefill_d*(q, rows, pos, n_rows, kc, vc, out, n_head, n_kv_head, kpb,
    // vpb, scale); dk == dv == the kernel's D, cache rows checked against the shape,
    // positions < n_ctx (caller), shared memory opted in above where it exceeds the default.
    unsafe { b.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(n_head: usize, n_kv_head: usize, dk: usize, dv: usize) -> AttentionParams {
        AttentionParams {
            n_head,
            n_kv_head,
            head_dim_k: dk,
            head_dim_v: dv,
            scale: 1.0,
        }
    }

    #[test]
    fn decode_tiles_fit_default_shared_memory() {
        // Qwen2.5-32B: 40 heads over 8, 128: G = 5, tiles of 32 positions.
        let p = params(40, 8, 128, 128);
        assert_eq!(decode_tile(&p), Some(32));
        assert_eq!(
            decode_smem_bytes(&p, 32),
            4 * (640 + 32 * 132 * 2 + 160 + 15)
        );
        // Qwen3.5-27B attention: 24 heads over 4 of 256: G = 6 -> 16 positions.
        assert_eq!(decode_tile(&params(24, 4, 256, 256)), Some(16));
        // head size not a multiple of 8, or a group too wide for the accumulators
        assert_eq!(decode_tile(&params(4, 1, 36, 36)), None);
        assert_eq!(decode_tile(&params(64, 1, 128, 128)), None);
        for (h, kv, d) in [
            (8, 8, 64),
            (32, 4, 128),
            (40, 5, 128),
            (16, 2, 256),
            (8, 1, 256),
        ] {
            let p = params(h, kv, d, d);
            let t = decode_tile(&p).expect("fits");
            assert!(decode_smem_bytes(&p, t) <= DEFAULT_SMEM_BYTES);
        }
    }

    #[test]
    fn head_size_decode_kernels() {
        for d in [64, 128, 256] {
            assert!(decode_d_smem_bytes(d) <= DEFAULT_SMEM_BYTES, "d {d}");
        }
        assert_eq!(
            decode_d_smem_bytes(128),
            4 * (1024 + 2 * 32 * 144 + 256 + 24 + 4 * 128 + 16)
        );
        let p = params(40, 8, 128, 128);
        assert_eq!(decode_tile_for(&p, KvType::F16), Some(32));
        assert_eq!(
            decode_tile_for(&params(24, 4, 256, 256), KvType::Q8_0),
            Some(16)
        );
        assert!(decode_d_kernel(&p, KvType::F32).is_none());
        assert!(decode_d_kernel(&params(6, 2, 32, 64), KvType::F16).is_none());
    }

    #[test]
    fn splits_and_partials() {
        assert_eq!(decode_splits(1, 32), 1);
        assert_eq!(decode_splits(64, 32), 1);
        assert_eq!(decode_splits(65, 32), 2);
        assert_eq!(decode_splits(4096 + 160, 32), MAX_SPLITS);
        let p = params(40, 8, 128, 128);
        assert_eq!(partials_len(1, &p, 1), 0);
        assert_eq!(partials_len(2, &p, 64), 2 * 40 * 64 * 130);
    }

    #[test]
    fn prefill_shared_memory() {
        // d = 128 stays under the default 48 KiB (no opt-in needed on any card).
        assert_eq!(prefill_smem_bytes(128), 256 * 136 + 9216 + 256 + 516);
        assert!(prefill_smem_bytes(128) <= DEFAULT_SMEM_BYTES);
        assert!(prefill_smem_bytes(256) <= 96 << 10);
        let p = params(8, 2, 128, 128);
        assert!(prefill_kernel(&p, KvType::F16).is_some());
        assert!(prefill_kernel(&p, KvType::F32).is_none());
        assert!(prefill_kernel(&params(8, 2, 128, 64), KvType::F16).is_none());
        assert!(prefill_kernel(&params(8, 2, 96, 96), KvType::Q8_0).is_none());
    }
}
