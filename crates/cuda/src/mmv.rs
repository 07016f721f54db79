//! Few-token (1..=8) quantized products on int8 tensor cores with the weights loaded straight
//! into `mma.sync` fragments (kernels/mmv.cu): the same segment interface as the dp4a `mvm_`
//! kernels ([`CudaDevice::matvec_segments`]: several matrices reading one x, each with its own
//! output, bias and residual add), at a cost per weight byte that does not grow with the token
//! count. The dp4a matvec re-does its dot work per token and costs 2..4x its one-token time at
//! 3..8 tokens; this path is what speculative verify passes and batched decode streams want.
//!
//! Formats: Q4_K and Q6_K kernels; where the q8_K mmv2 kernels (below) may not take them (mmv2
//! off, or a speculating run's verify passes, [`set_speculation`]) the dispatch sends Q4_K
//! products of 3..=8 tokens here, and Q6_K products of 2..=8 to mmv2's staged kernel on q8_1 x
//! ([`q6k_staged_q81`], session 29; the first Q6_K kernel here, `mmv_q6_k`, lost to the matvec).
//! For 1..4 tokens the B operand is block-diagonal (columns = tokens x units of a group), so no
//! C column is spent on padding tokens. sm_80+ only in the dispatch; the kernels compile for
//! sm_70 with the mma emulated by shuffles + dp4a (tests force that path on any card).
//!
//! Numerics: the same q8_1 x and exact int32 dots as the matvec, summed in another order
//! (H200: rms error vs the exact-q8_1 f64 result 1.1-1.3e-7 against the matvec's 8e-8), so a
//! step of 3+ tokens can round differently from one token by ~1e-7 relative.
//!
//! **mmv2** (on by default; `REDLINE_MMV2=0` off): x quantized q8_K-style (one f32 scale per 256
//! values, int16 sums per 32: llama.cpp's CPU activation format for K-quants) so the kernels
//! sum a whole super-block in int32 and do one float step per super-block and (row, token),
//! whatever the token count: Q4_K 27648x5120 at 1 / 3 / 4 / 8 tokens 32.9 / 35.0 / 35.9 /
//! 40.0 µs against mmv's 31.9 / 43.8 / 44.4 / 71.1, and Q6_K (super-blocks staged through
//! shared memory) 27648x5120 at 3 / 8 tokens 53.1 / 66.0 against the matvec's 78.3 / 130.8
//! (H200, session 10; [`dispatch2`]: Q4_K and Q6_K, 3..=8 tokens). The
//! coarser activation scale doubles the error against the unquantized x (rms 1.8e-2 against
//! 0.9e-2 for q8_1 on the tests' random activations with 8x outliers); the kernels' own
//! rounding is that of the matvec (7-8e-8).
//!
//! Session 15: the q8_K copy is token-interleaved per 32-value unit ([`Q8kScratch`]), so an
//! 8-token x load reads 2 cache lines instead of 8 (8 streams of the 32B +7 %), and Q4_K goes
//! through `mmv2s_q4_k_s2`, which copies the weights to shared memory by cp.async instead of
//! loading each fragment from 8 rows' cache lines (`stages2`; another +9 %). Experiments,
//! off by default: the K split (`ksplit2`), the carveout (`carveout2`) and one- and
//! two-token Q4_K products here (`min_tokens2`).

use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use crate::matvec::{MatvecScratch, Segment, MAX_SEGMENTS};
use crate::sources::Program;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use gguf::GgmlType;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Most tokens one launch takes (one 8-column mma tile).
pub const MAX_TOKENS: usize = 8;
/// Rows per thread block (the mma's m).
const ROWS_PER_BLOCK: usize = 16;
/// Most warps per block (MMV_MAX_WARPS in the kernel).
const MAX_WARPS: u32 = 8;

/// Forced warps per block (1..=8); 0 = per-shape choice.
static WARPS_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Warps per block forced for the mmv2 launches: the override ([`set_warps_override`]), else
/// `REDLINE_MMV2_WARPS` (1..=8, an experiment: the per-shape choice was timed on the H200 at
/// one to four tokens), else 0 (the per-shape choice).
fn forced_warps2() -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    match WARPS_OVERRIDE.load(Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| {
            std::env::var("REDLINE_MMV2_WARPS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|w| (1..=MAX_WARPS).contains(w))
                .unwrap_or(0)
        }),
        w => w,
    }
}
/// Runs the shuffle + dp4a emulation of the mma on every card (tests: the sm_70 path).
static FORCE_EMULATION: AtomicBool = AtomicBool::new(false);
/// Weight load mode (0: ld.global.nc, 2: L1::no_allocate); u32::MAX = the default.
static LOAD_MODE_OVERRIDE: AtomicU32 = AtomicU32::new(u32::MAX);

/// Forces the weight load mode (0: cached in L1, 2: L1::no_allocate); `None` restores the
/// default. For benchmarks.
pub fn set_load_mode_override(m: Option<u32>) {
    LOAD_MODE_OVERRIDE.store(m.unwrap_or(u32::MAX), Ordering::Relaxed);
}

/// Whether Q4_K products of 1..4 tokens use the block-diagonal kernels (mmv_q4_k_t{1,2,4}):
/// `REDLINE_MMV_BD=0` turns them off (then the 8-column kernel takes every count).
static BD_OFF: AtomicBool = AtomicBool::new(false);

/// Turns the block-diagonal 1..4-token Q4_K kernels off (true) or back on. For benchmarks.
pub fn set_block_diagonal_off(off: bool) {
    BD_OFF.store(off, Ordering::Relaxed);
}

fn block_diagonal() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !BD_OFF.load(Ordering::Relaxed)
        && *ENV.get_or_init(|| std::env::var("REDLINE_MMV_BD").map_or(true, |v| v != "0"))
}

/// The kernel of a product of `n` tokens (1..=8) of `stem`'s format: for Q4_K with 1..4 tokens
/// the block-diagonal kernel of the next power of two (no C column spent on padding), else the
/// 8-column kernel.
/// The name suffix of a product kernel's variant (kernels/mmv.cu): `_emu` with the int8 mma
/// emulated by shuffles + dp4a (sm_70, or forced for tests), none with the mma instructions.
pub(crate) fn emu_suffix(emulate: i32) -> &'static str {
    if emulate != 0 {
        "_emu"
    } else {
        ""
    }
}

fn kernel_name(stem: &str, n: usize) -> String {
    if stem == "q4_k" && n <= 4 && block_diagonal() {
        format!("mmv_q4_k_t{}", n.next_power_of_two())
    } else {
        format!("mmv_{stem}")
    }
}

/// Weight load mode: `REDLINE_MMV_LOAD` (0 or 2), else per format as timed on the H200
/// (session 7): Q4_K's 16- and 8-byte loads bypass L1 (2: x stays there; 53 vs 59 µs on
/// 27648x5120), Q6_K's u16 pairs are cached (0: neighbouring pairs share lines; 106 vs 122).
fn load_mode(stem: &str) -> i32 {
    static ENV: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    let env = *ENV.get_or_init(|| match std::env::var("REDLINE_MMV_LOAD").as_deref() {
        Ok("0") => Some(0),
        Ok("2") => Some(2),
        _ => None,
    });
    match LOAD_MODE_OVERRIDE.load(Ordering::Relaxed) {
        m @ (0 | 2) => m as i32,
        _ => env.unwrap_or(if stem == "q6_k" { 0 } else { 2 }),
    }
}

/// Forces the warps per block (1..=8, they split one 16-row tile's super-blocks); 0 restores
/// the per-shape choice. For benchmarks and tests.
pub fn set_warps_override(w: u32) {
    WARPS_OVERRIDE.store(w.min(MAX_WARPS), Ordering::Relaxed);
}

/// Runs the sm_70 fallback (warp shuffles + dp4a instead of mma) on every card, for tests.
pub fn set_force_emulation(on: bool) {
    FORCE_EMULATION.store(on, Ordering::Relaxed);
}

/// Kernel stem of a weight type this path has.
fn stem(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4K => Some("q4_k"),
        GgmlType::Q6K => Some("q6_k"),
        _ => None,
    }
}

/// Whether this path handles weight type `ty` for `n` tokens.
pub fn supports(ty: GgmlType, n: usize) -> bool {
    stem(ty).is_some() && (1..=MAX_TOKENS).contains(&n)
}

/// Whether the dispatch sends weight type `ty` here: Q4_K, and Q6_K unless `REDLINE_MMV_Q6K=0`
/// ([`q6k_staged_q81`]). The first Q6_K kernel (8 columns, u16 loads: super-blocks are 2-byte
/// aligned) lost to the dp4a matvec at every count below 8 on the H200 (session 7: 27648x5120
/// n = 4: 113 vs 81 µs); Q6_K products here now run mmv2's staged kernel on q8_1 x
/// (`mmv2_q6_k_q81`, session 29), as mmv2_q6_k stages them for q8_K x.
fn dispatched_format(ty: GgmlType) -> bool {
    ty == GgmlType::Q4K || (ty == GgmlType::Q6K && q6k_staged_q81())
}

/// Whether few-token Q6_K products that must stay on q8_1 x (speculative verify passes, or mmv2
/// off) take the staged tensor-core kernel `mmv2_q6_k_q81` (`_q81t` on tiled x; 2..=8 tokens,
/// sm_80+) instead of the dp4a matvec: on unless `REDLINE_MMV_Q6K=0` ([`set_q6k_staged_q81`]
/// overrides). Why: the dp4a matvec costs ~2x its one-token time at 3-4 tokens. H100, session
/// 29 (µs at 1 / 2 / 3 / 4 tokens, dp4a matvec against this kernel): 5120 x 17408 32.2 / 38.3 /
/// 63.8 / 66.9 against 34.4 / 34.8 / 35.7 / 37.0; the 27B's head 248320 x 5120 339.7 / 400.2 /
/// 697.4 / 722.3 against 367.0 / 371.5 / 375.3 / 379.4; the 27B's verify passes of 3 / 4 rows
/// 12.55 / 13.22 ms -> 11.45 / 12.08 (1.59 / 1.68x a step -> 1.47 / 1.55x).
pub fn q6k_staged_q81() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match Q6K_Q81_OVERRIDE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => *ENV.get_or_init(|| std::env::var("REDLINE_MMV_Q6K").as_deref() != Ok("0")),
    }
}

/// 0: `REDLINE_MMV_Q6K` decides; 1 off, 2 on.
static Q6K_Q81_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces [`q6k_staged_q81`] on or off (`None`: back to `REDLINE_MMV_Q6K`). For tests and
/// benchmarks; recorded steps made under the other setting must be dropped by the caller.
pub fn set_q6k_staged_q81(on: Option<bool>) {
    Q6K_Q81_OVERRIDE.store(on.map_or(0, |o| if o { 2 } else { 1 }), Ordering::Relaxed);
}

/// Fewest tokens of a Q6_K product this path takes ([`q6k_staged_q81`]): 2 (the dp4a matvec's
/// two-token Q6_K products cost 1.2x one token: H100, session 27, 5120 x 17408 31.1 / 36.8 µs).
const MIN_TOKENS_Q6K: usize = 2;

/// Whether the backend's few-token products use this path: on by default (sm_80+, Q4_K,
/// 3..=8 tokens; verified and timed on the H200 in session 7); `REDLINE_MMV=0` keeps every
/// few-token product on the dp4a matvec. Read once.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_MMV").map_or(true, |v| v != "0"))
}

/// Fewest tokens for which the backend takes this path instead of the dp4a matvec
/// (`REDLINE_MMV_MIN`, default 3; read once). H200, session 7, Q4_K (µs, dp4a / this path):
/// 27648x5120 n = 1: 28.2 / 32.2, n = 2: 35.3 / 34.9, n = 3: 53.5 / 43.6, n = 4: 55.8 / 44.3;
/// 5120x27648 n = 2: 34.3 / 42.3, n = 3: 68.9 / 55.2; 5120x5120 n = 2: 10.6 / 11.0, n = 3:
/// 17.9 / 13.7 — the matvec wins at 1-2 tokens, this path from 3.
pub fn dispatch_min_tokens() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("REDLINE_MMV_MIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3)
            .max(1)
    })
}

/// The backend's question: should a product of `n` tokens of weight type `ty` on `dev` take
/// this path ([`enabled`], sm_80+, a dispatched format, [`dispatch_min_tokens`]..=8 tokens, not
/// a launch of `rows` rows the direct dp4a kernels take: [`crate::matvec::direct_four`]).
pub fn dispatch(dev: &CudaDevice, ty: GgmlType, n: usize, rows: usize) -> bool {
    let min = if ty == GgmlType::Q6K {
        MIN_TOKENS_Q6K
    } else {
        dispatch_min_tokens()
    };
    enabled()
        && dev.arch() >= 80
        && n >= min
        && dispatched_format(ty)
        && supports(ty, n)
        // (Q6_K's kernel reads the tiled layout too: mmv2_q6_k_q81t)
        && !(n <= 2 && crate::matvec::q8_1_tiled_enabled() && ty != GgmlType::Q6K)
        // (K-quant rows are whole super-blocks: any width the direct kernels take, for Q6_K
        // those of whole 1024-value iterations)
        && !crate::matvec::direct_applies(ty, 1024, n, rows)
}

/// Warps per block for `tiles` 16-row tiles of `n_cols` columns and `n` tokens: the warps
/// split a tile's 256-weight super-blocks; never a warp without work. The H200 sweep
/// (session 7): 4 everywhere but 8 for >= 600 tiles at 3+ tokens (27648x5120 n = 4: 44.3 µs
/// at 8 vs 48.0 at 4; 5120x27648: 56.5 at 4 vs 63.9 at 8; 10240x5120 n = 3: 21.4 vs 23.9).
pub fn warps_per_block(tiles: usize, n_cols: usize, n: usize) -> u32 {
    let forced = WARPS_OVERRIDE.load(Ordering::Relaxed);
    let w = if forced > 0 {
        forced as usize
    } else if tiles >= 600 && n >= 3 {
        8
    } else {
        4
    };
    w.min((n_cols / 256).max(1)) as u32
}

impl CudaDevice {
    /// Few-token products of several matrices (one format and width, x already quantized
    /// into `xq`), on the path the dispatch picks: this module's tensor-core kernels when
    /// [`dispatch`] says so, the dp4a segment kernels otherwise. Same contract as
    /// [`CudaDevice::matvec_segments`].
    ///
    /// `x` is the f32 x that `xq`'s q8_1 copy was made from: the mmv2 kernels ([`dispatch2`])
    /// quantize it to q8_K into `xq` unless it already holds that copy.
    pub fn few_token_segments(
        &self,
        segs: &[Segment<'_>],
        xq: &mut MatvecScratch,
        x: &CudaSlice<f32>,
    ) -> Result<()> {
        let (_, _, n, cols) = xq.quantized();
        match segs.first() {
            Some(s) if dispatch2(self, s.w.ty, n) || small_on_mmv2(self, segs, n) => {
                self.ensure_q8_k(x, n, cols, xq)?;
                self.mmv2_segments(segs, xq)
            }
            Some(s) if dispatch(self, s.w.ty, n, segs.iter().map(|s| s.w.n_rows).sum()) => {
                self.mmv_segments(segs, xq)
            }
            _ => self.matvec_segments(segs, xq),
        }
    }

    /// `y (+)= W x (+ bias)` for every segment on the tensor-core path (kernels/mmv.cu), x of
    /// 1..=8 tokens already quantized into `xq`. The caller guarantees every `y` holds
    /// `n_tokens * w.n_rows` f32 (token-major) and every `bias` `w.n_rows`.
    pub fn mmv_segments(&self, segs: &[Segment<'_>], xq: &MatvecScratch) -> Result<()> {
        let Some(first) = segs.first() else {
            return Ok(());
        };
        let (ty, cols) = (first.w.ty, first.w.n_cols);
        if ty == GgmlType::Q6K {
            // (mmv_q6_k, the u16-load kernel, stays in the source for the record; session 29)
            return self.mmv2_launch(segs, xq, X2::Q81);
        }
        let (xqd, xds, n_tokens, xcols) = xq.quantized();
        let stem = stem(ty).ok_or(CudaError::UnsupportedType(ty.name()))?;
        // (these kernels read the natural q8_1 layout only: the dispatch keeps tiled x away)
        if segs.len() > MAX_SEGMENTS
            || !(1..=MAX_TOKENS).contains(&n_tokens)
            || xcols != cols
            || xq.tiled()
            || !cols.is_multiple_of(256)
            || segs.iter().any(|s| s.w.ty != ty || s.w.n_cols != cols)
            || xqd.len() < n_tokens * cols
            || xds.len() < n_tokens * cols / 16
        {
            return Err(CudaError::Shape(format!(
                "mmv: {} segments of {} x {cols} with x quantized as {n_tokens}x{xcols}",
                segs.len(),
                ty.name(),
            )));
        }
        let (p, blocks) = self.segment_params(segs, ROWS_PER_BLOCK);
        if blocks == 0 {
            return Ok(());
        }
        let total_rows: usize = segs.iter().map(|s| s.w.n_rows).sum();
        let warps = warps_per_block(total_rows.div_ceil(ROWS_PER_BLOCK), cols, n_tokens);
        let mut emulate = i32::from(self.arch() < 80 || FORCE_EMULATION.load(Ordering::Relaxed));
        let f = self.function(
            Program::Mmv,
            &format!("{}{}", kernel_name(stem, n_tokens), emu_suffix(emulate)),
        )?;
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (32, warps, 1),
            shared_mem_bytes: 0,
        };
        let mut n_i = n_tokens as i32;
        let mut mode = load_mode(stem);
        if crate::pdl::enabled(self.arch()) {
            let (mut p, mut pq, mut pd) = (p, self.device_address(xqd), self.device_address(xds));
            let mut params = [
                crate::pdl::arg(&mut p),
                crate::pdl::arg(&mut pq),
                crate::pdl::arg(&mut pd),
                crate::pdl::arg(&mut n_i),
                crate::pdl::arg(&mut mode),
                crate::pdl::arg(&mut emulate),
            ];
            // SAFETY: as below; the kernel waits for the previous kernel before reading x or
            // the outputs and before writing anything.
            unsafe { crate::pdl::launch(self.stream(), &f, cfg, &mut params, true) }?;
            return Ok(());
        }
        let mut b = self.stream().launch_builder(&f);
        b.arg(&p)
            .arg(xqd)
            .arg(xds)
            .arg(&n_i)
            .arg(&mode)
            .arg(&emulate);
        // SAFETY: matches mmv_<fmt> / mmv_q4_k_t<NP>(MvSegs, xq, xds, n_tokens, load_mode,
        // emulate) with n_tokens <= 8 (<= NP for the t<NP> kernels, kernel_name);
        // every segment's matrix is a live DeviceMatrix of this format and width (>= 16 bytes
        // of padding, rows of whole super-blocks), outputs hold n_tokens * n_rows f32 and
        // biases n_rows (the caller's contract), x was quantized for n_tokens tokens of cols.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `y = W x` for one matrix on the tensor-core path, x (1..=8 tokens) already quantized
    /// into `xq`; y holds at least `n_tokens * w.n_rows` f32.
    pub fn mmv_prequantized(
        &self,
        w: &crate::DeviceMatrix,
        xq: &MatvecScratch,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (_, _, n, _) = xq.quantized();
        if y.len() < n * w.n_rows {
            return Err(CudaError::Shape(format!(
                "mmv {}x{} for {n} tokens into y of {}",
                w.n_rows,
                w.n_cols,
                y.len()
            )));
        }
        let seg = Segment {
            w,
            y: self.device_address(y),
            bias: None,
            accumulate: false,
        };
        self.mmv_segments(&[seg], xq)
    }
}

// ---- mmv2: q8_K activations, integer sums per super-block (kernels/mmv.cu mmv2_*) ----------

/// x quantized q8_K-style for the mmv2 kernels (llama.cpp's CPU activation format for
/// K-quants), token-interleaved so that one unit of all n tokens is contiguous (an mmv2 x load
/// then touches 2 cache lines, not one per token): `q` int8 `[cols / 32, n, 32]`, `dy` f32
/// `[cols / 256, n]` (x ~ dy * q per 256 values), `bsum` int16 `[cols / 256, n, 8]` (sum of q
/// per 32; kernels/common.cuh `q8k_q_at`). It sits in [`MatvecScratch`] beside the q8_1 copy
/// and is allocated with it, so recorded decode steps keep its address.
pub struct Q8kScratch {
    q: CudaSlice<i8>,
    dy: CudaSlice<f32>,
    bsum: CudaSlice<i16>,
    /// K-split partial sums (`[tiles][ks][128]`) and per-tile counters (0 between launches) of
    /// the mmv2 kernels (kernels/mmv.cu `mv_finish8_ks`), for up to `KSPLIT_MAX_TILES` tiles.
    kpart: CudaSlice<f32>,
    kcount: CudaSlice<i32>,
    /// The x it holds (device address, tokens, cols); forgotten whenever the q8_1 copy beside
    /// it is rewritten, so it is fresh exactly when it was made from what the q8_1 copy holds.
    holds: Option<(u64, usize, usize)>,
}

impl Q8kScratch {
    /// Room for `elems` activations (tokens x cols).
    pub(crate) fn new(dev: &CudaDevice, elems: usize) -> Result<Self> {
        Ok(Self {
            q: dev.stream().alloc_zeros::<i8>(elems)?,
            dy: dev.stream().alloc_zeros::<f32>(elems.div_ceil(256))?,
            bsum: dev.stream().alloc_zeros::<i16>(elems.div_ceil(32))?,
            kpart: dev
                .stream()
                .alloc_zeros::<f32>(KSPLIT_MAX_TILES * KSPLIT_MAX * 128)?,
            kcount: dev.stream().alloc_zeros::<i32>(KSPLIT_MAX_TILES)?,
            holds: None,
        })
    }

    /// The q8_1 copy beside it was rewritten (see `holds`).
    pub(crate) fn forget(&mut self) {
        self.holds = None;
    }
}

/// Whether x of `n` tokens x `cols` could be read by mmv2 products, so that a kernel producing
/// it may write its q8_K copy too (the weight formats are not known there: for others the
/// copy goes unused).
pub fn q8k_wanted(dev: &CudaDevice, n: usize, cols: usize) -> bool {
    mmv2_enabled()
        && dev.arch() >= 80
        && (min_tokens2(GgmlType::Q4K).min(min_tokens2(GgmlType::Q6K))..=MAX_TOKENS).contains(&n)
        && cols.is_multiple_of(256)
}

impl MatvecScratch {
    /// Device addresses of the q8_K buffers (q, dy, bsum) for a kernel that writes x's q8_K
    /// copy itself, after the q8_1 copy's [`MatvecScratch::buffers_for`]; then
    /// [`MatvecScratch::q8k_made`]. Errors if they are too small.
    pub(crate) fn q8k_buffers_for(
        &self,
        dev: &CudaDevice,
        n_tokens: usize,
        cols: usize,
    ) -> Result<(u64, u64, u64)> {
        let k = &self.q8k;
        let elems = n_tokens * cols;
        if !cols.is_multiple_of(256)
            || k.q.len() < elems
            || k.dy.len() < elems / 256
            || k.bsum.len() < elems / 32
        {
            return Err(CudaError::Shape(format!(
                "q8_K scratch for {n_tokens}x{cols}"
            )));
        }
        Ok((
            dev.device_address(&k.q),
            dev.device_address(&k.dy),
            dev.device_address(&k.bsum),
        ))
    }

    /// The q8_K buffers now hold x (device address `x`) of `n_tokens` x `cols`, written by the
    /// kernel that wrote its q8_1 copy.
    pub(crate) fn q8k_made(&mut self, x: u64, n_tokens: usize, cols: usize) {
        self.q8k.holds = Some((x, n_tokens, cols));
    }

    /// The q8_K buffers (q, dy, bsum; layout at [`Q8kScratch`]) and the (tokens, cols) of
    /// the x they hold, if any. For tests.
    #[allow(clippy::type_complexity)]
    pub fn q8_k(
        &self,
    ) -> (
        &CudaSlice<i8>,
        &CudaSlice<f32>,
        &CudaSlice<i16>,
        Option<(usize, usize)>,
    ) {
        let k = &self.q8k;
        (&k.q, &k.dy, &k.bsum, k.holds.map(|(_, n, c)| (n, c)))
    }
}

/// Whether the backend's few-token Q4_K products take the mmv2 kernels: on by default
/// (H200, session 10: 8 decode streams of the 32B +34 %), `REDLINE_MMV2=0` keeps them on the
/// q8_1 mmv / matvec kernels, or [`set_mmv2`]. Read once.
fn mmv2_enabled() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match MMV2_OVERRIDE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => *ENV.get_or_init(|| std::env::var("REDLINE_MMV2").map_or(true, |v| v != "0")),
    }
}

/// Whether few-token products take the mmv2 kernels now (`REDLINE_MMV2`, [`set_mmv2`]).
pub fn mmv2_on() -> bool {
    mmv2_enabled()
}

/// 0: `REDLINE_MMV2` decides; 1: off; 2: on.
static MMV2_OVERRIDE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Turns the mmv2 dispatch on or off (`None`: back to `REDLINE_MMV2`). For tests and
/// benchmarks; recorded steps made under the other setting must be dropped by the caller.
pub fn set_mmv2(on: Option<bool>) {
    MMV2_OVERRIDE.store(on.map_or(0, |o| 1 + o as u8), Ordering::Relaxed);
}

/// Kernel stem of a weight type the mmv2 kernels have.
fn stem2(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4K => Some("q4_k"),
        GgmlType::Q6K => Some("q6_k"),
        GgmlType::IQ4XS => Some("iq4_xs"),
        _ => None,
    }
}

/// Weight load mode of the mmv2 kernels: the override ([`set_load_mode_override`]), else
/// `REDLINE_MMV_LOAD`, else per format as timed on the H200 (session 10, µs at the best warps):
/// Q4_K 0 (cached loads: 27648x5120 / 5120x27648 / 5120x5120 n = 1 32.9 / 35.0 / 10.4 against
/// 36.1 / 37.3 / 10.8 with L1::no_allocate: a super-block's header and first quants share a
/// sector); Q6_K 2 (its super-blocks go through shared memory once: 27648x5120 n = 4 53.9
/// against 70.2, the 152064x5120 head 227.6 against 316.5).
fn load_mode2(ty: GgmlType) -> i32 {
    static ENV: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    match LOAD_MODE_OVERRIDE.load(Ordering::Relaxed) {
        m @ (0 | 2) => m as i32,
        _ => ENV
            .get_or_init(|| match std::env::var("REDLINE_MMV_LOAD").as_deref() {
                Ok("0") => Some(0),
                Ok("2") => Some(2),
                _ => None,
            })
            .unwrap_or(if ty == GgmlType::Q6K { 2 } else { 0 }),
    }
}

/// Warps per block of the Q4_K mmv2 launches: `REDLINE_MMV2_Q4_WARPS` (1..=8; `0`: the
/// per-tile-count choice below, timed on the H200 at one to four tokens), else 8. H100, session
/// 20, 8 tokens: alone, 8 warps took gate/up 40.7 µs against 43.1 at 3, the 5120x27648 down
/// 45.6 against 57.0 at 5, o 11.8 against 12.6; 8 streams of the 32B 626.1 / 617.2 / 627.4
/// tok/s against 578.4 / 576.3 / 571.7 (+7-10 %, three rounds), the 27B +1 %, verify passes of
/// 3 and 4 rows even. (Q6_K is best at 4-5 and keeps its choice.) A function of the shape
/// only, as before, so a product's bits do not depend on the token count.
fn q4_warps2() -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| {
        std::env::var("REDLINE_MMV2_Q4_WARPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|w| *w <= MAX_WARPS)
            .unwrap_or(MAX_WARPS)
    })
}

/// Warps per block of the mmv2 kernels (they split a tile's super-blocks) for `tiles` 16-row
/// tiles of `n_cols` columns of `ty`: the override ([`set_warps_override`], else
/// `REDLINE_MMV2_WARPS`), for Q4_K [`q4_warps2`] (8 by default), else by the H200 sweeps
/// (session 10; at most 16 warps per SM, 4 per scheduler). Q4_K with `REDLINE_MMV2_Q4_WARPS=0`
/// (~103 registers): 3
/// for 600 tiles or more (27648x5120: 32.9 µs at 3 warps, 34.3 at 2, 34.6 at 4, 39.7 at 8, n = 1), 5
/// below (320 tiles fit one wave of 3 blocks per SM: 5120x27648 35.0 µs against 41.2 at 4 and
/// 52.1 at 6; 5120x5120 10.4 against 11.0), 8 under 200 (fewer blocks than SMs: the warps of a
/// block are all there is). Q6_K (125 registers, shared staging): 2 for >= 5000 tiles (the
/// 152064x5120 head n = 4: 227.6 µs against 231.2 at 4, 235.0 at 3), 4 for >= 600 (27648x5120
/// n = 4: 53.9 against 54.9 at 3, 55.1 at 5), 5 for >= 200 (5120x27648 n = 4: 68.2 against
/// 77.3 at 4; 5120x5120 15.9 against 17.5), 8 below. Never a warp without a super-block.
fn warps_per_block2(ty: GgmlType, tiles: usize, n_cols: usize) -> u32 {
    let forced = match (forced_warps2(), ty) {
        (0, GgmlType::Q4K) => q4_warps2(),
        (w, _) => w,
    } as usize;
    let q6 = ty == GgmlType::Q6K;
    let w = match (forced, tiles) {
        (f, _) if f > 0 => f,
        (_, t) if q6 && t >= 5000 => 2,
        (_, t) if t >= 600 => {
            if q6 {
                4
            } else {
                3
            }
        }
        (_, t) if t >= 200 => 5,
        _ => 8,
    };
    w.min((n_cols / 256).max(1)) as u32
}

/// Whether the mmv2 dispatch takes weight type `ty`: Q4_K and Q6_K. Q6_K's first kernel read
/// its 2-byte aligned 210-byte super-blocks as u16 pairs and lost to the dp4a matvec below 8
/// tokens (H200, 27648x5120 n = 1 / 4 / 8: 93 / 96 / 99 µs against 41 / 81 / 131); its
/// successor stages them through shared memory with aligned 16-byte loads (kernels/mmv.cu
/// mmv2_q6_k) and wins from 3 tokens (H200, session 10, µs, dp4a / mmv2 at n = 3 and 8:
/// 27648x5120 78.3 / 53.1 and 130.8 / 66.0; 5120x27648 70.8 / 65.6 and 141.9 / 72.9;
/// 5120x5120 20.3 / 15.5 and 29.9 / 16.7; the 152064x5120 head 401.0 / 224.8 and 676.3 /
/// 285.1; at one token it loses: 40.8 / 50.6).
fn dispatched2_format(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q6K) || (ty == GgmlType::IQ4XS && iq4xs2())
}

/// Whether the mmv2 dispatch takes IQ4_XS too: `REDLINE_MMV2_IQ4XS=1` (an experiment, off; the
/// kernel `mmv2_iq4_xs` is checked by the GPU tests either way). Read once.
fn iq4xs2() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_MMV2_IQ4XS").is_ok_and(|v| v == "1"))
}

/// Most tiles of an mmv2 launch split over K (`ksplit2`: launches of fewer tiles than this).
const KSPLIT_MAX_TILES: usize = 600;
/// Most parts a tile's super-blocks are split into.
const KSPLIT_MAX: usize = 4;

/// Parts of a tile's super-blocks (blocks per 16-row tile) for an mmv2 launch of `tiles` tiles of
/// `nsb` super-blocks per row: the override ([`set_mmv2_ksplit`]), else `REDLINE_MMV2_KSPLIT`
/// (1..=4), else 1; only below `KSPLIT_MAX_TILES` tiles (a 5120-row matrix is 320 tiles, 2.4
/// blocks per SM of 132) and never more parts than super-blocks.
fn ksplit2(tiles: usize, nsb: usize) -> u32 {
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let ks = match KSPLIT_OVERRIDE.load(Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| {
            std::env::var("REDLINE_MMV2_KSPLIT")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|k| (1..=KSPLIT_MAX).contains(k))
                .unwrap_or(1)
        }),
        k => k as usize,
    };
    if tiles >= KSPLIT_MAX_TILES {
        1
    } else {
        ks.min(KSPLIT_MAX).min(nsb).max(1) as u32
    }
}

/// 0: `REDLINE_MMV2_KSPLIT` decides.
static KSPLIT_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces the mmv2 K split (1..=4 parts per tile for launches under `KSPLIT_MAX_TILES` tiles;
/// `None`: back to `REDLINE_MMV2_KSPLIT`). For tests and benchmarks.
pub fn set_mmv2_ksplit(ks: Option<u32>) {
    KSPLIT_OVERRIDE.store(
        ks.map_or(0, |k| k.clamp(1, KSPLIT_MAX as u32)),
        Ordering::Relaxed,
    );
}

/// Shared memory per warp and pipeline stage of the staged Q4_K kernels (`mmv2s_q4_k_s*`: one
/// super-block of the tile's 16 rows, MV4S_STAGE in the kernel).
const STAGE_BYTES_Q4K: u32 = 16 * 144;

/// ... of the staged Q4_K kernels with x staged too (`mmv2s_q4_k_s*x`: the weights, then x of
/// the super-block's 8 units for up to 8 tokens, their int16 sums and dy; MV4SX_STAGE).
const STAGE_BYTES_Q4K_XS: u32 = 16 * 144 + 8 * 256 + 8 * 16 + 8 * 4;

/// Whether mmv2 launches of under two blocks per SM ask for more shared memory than they use,
/// so that at most their share of blocks fits on one SM and the blocks spread over all of
/// them (`REDLINE_MMV2_SPREAD=1`, an experiment). Why (H100, session 20, ncu): a launch of
/// 320 small blocks (the 5120-row products) that the SMs could hold 7 at a time reached 10-20 %
/// achieved occupancy; launched early behind the previous kernel (PDL), the blocks may crowd
/// onto the SMs that free up first. Measured: 8 streams +0.4-1 % (within noise), and the
/// x-staged down projection stayed as slow inside the step; 8 warps per Q4_K block
/// ([`q4_warps2`]) took the occupancy gain instead.
fn spread2() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| std::env::var("REDLINE_MMV2_SPREAD").as_deref() == Ok("1"))
}

/// Dynamic shared memory for a launch of `grid` blocks that use `smem` bytes each, so that no
/// SM can hold more than ceil(grid / SMs) of them ([`spread2`]); `smem` itself for launches of
/// two or more blocks per SM.
fn spread_smem(dev: &CudaDevice, grid: usize, smem: u32) -> u32 {
    use cudarc::driver::sys::CUdevice_attribute_enum as A;
    let sms = dev.info().sm_count.max(1) as usize;
    if grid >= 2 * sms {
        return smem;
    }
    let per_sm = grid.div_ceil(sms).max(1);
    let Ok(cap) = dev
        .context()
        .attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
    else {
        return smem;
    };
    // per_sm + 1 blocks of cap / (per_sm + 1) plus their static shared memory do not fit
    let target = (cap.max(0) as usize / (per_sm + 1)) as u32;
    let max = crate::attention::max_smem_per_block(dev) as u32;
    smem.max(target.min(max.saturating_sub(8 * 1024)))
}

/// Columns from which `REDLINE_MMV2_XS=wide` copies x into shared memory (x of 8 tokens past
/// ~128 KB: more than L1 keeps beside the staging buffers).
const XS_MIN_COLS: usize = 16384;

/// Whether the staged mmv2 kernels (2 or 3 stages) of a `cols`-wide product copy each
/// super-block's x into shared memory with its weights (`mmv2s_*_s*x`): the override
/// ([`set_mmv2_xs`]: on or off for every width), else `REDLINE_MMV2_XS` (`1` every width, `wide`
/// from [`XS_MIN_COLS`] columns), else never (an experiment). H100, session 20: with x read from
/// global memory each super-block's compute starts with x loads that miss L1 once x outgrows
/// it; the 8-token Q4_K 5120x27648 down projection took 57.3 µs alone (5 warps) and 43.4 with
/// x staged (3 warps), but 78.6 inside an 8-row step (see [`spread2`]), and 8 streams of the
/// 32B lost 2 %; it now takes the format's warps (8 for Q4_K), not yet measured that way. The
/// same values and sums: the same bits.
fn xs2(cols: usize) -> bool {
    static ENV: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    match XS_OVERRIDE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => ENV
            .get_or_init(|| match std::env::var("REDLINE_MMV2_XS").as_deref() {
                Ok("1") => Some(0),
                Ok("wide") => Some(XS_MIN_COLS),
                _ => None,
            })
            .is_some_and(|min| cols >= min),
    }
}

/// 0: `REDLINE_MMV2_XS` / the width decides; 1 off, 2 on.
static XS_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces x staged with the weights in the staged mmv2 kernels on or off (`None`: back to
/// `REDLINE_MMV2_XS` and the width). For tests and benchmarks.
pub fn set_mmv2_xs(on: Option<bool>) {
    XS_OVERRIDE.store(on.map_or(0, |o| if o { 2 } else { 1 }), Ordering::Relaxed);
}

/// Pipeline stages of the staged Q4_K mmv2 kernels (weights copied to shared memory by
/// cp.async, `stages - 1` super-blocks ahead), 0 = the register-fragment kernel: the override
/// ([`set_mmv2_stages`]), else `REDLINE_MMV2_STAGE` (0, 2, 3 or 4), else 2. The same bits
/// either way (the same fragments, super-block order and sums). H200, session 15, 8 decode
/// streams of the 32B Q4_K_M: 0 stages 616.4 / 612.9 tok/s, 2 stages 669.6, 3 stages 581.8 /
/// 590.7 (more shared memory per block leaves the carveout less L1 for x, which every warp
/// reads). (Session 20 measured the same for Q6_K, `mmv2s_q6_k_s2/s3`, against the
/// register-staged `mmv2_q6_k`: slower on an H100, the 8-token 5120x27648 down inside a step
/// 63.5 / 65.7 µs against 55.9, 54.4 against 49.9 alone; removed.)
fn stages2() -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    match STAGES_OVERRIDE.load(Ordering::Relaxed) {
        s @ (0 | 2..=4) => s,
        _ => *ENV.get_or_init(|| match std::env::var("REDLINE_MMV2_STAGE").as_deref() {
            Ok("0") => 0,
            Ok("3") => 3,
            Ok("4") => 4,
            _ => 2,
        }),
    }
}

/// u32::MAX: `REDLINE_MMV2_STAGE` decides.
static STAGES_OVERRIDE: AtomicU32 = AtomicU32::new(u32::MAX);

/// Preferred shared-memory carveout (percent of the unified L1 / shared memory) of the staged
/// Q4_K mmv2 kernels: the override ([`set_mmv2_carveout`]), else `REDLINE_MMV2_CARVEOUT`
/// (0..=100), else none (the driver's choice).
fn carveout2() -> Option<u32> {
    static ENV: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    match CARVEOUT_OVERRIDE.load(Ordering::Relaxed) {
        c @ 0..=100 => Some(c),
        u32::MAX => *ENV.get_or_init(|| {
            std::env::var("REDLINE_MMV2_CARVEOUT")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&c| c <= 100)
        }),
        _ => None,
    }
}

/// u32::MAX: `REDLINE_MMV2_CARVEOUT` decides; 101: none.
static CARVEOUT_OVERRIDE: AtomicU32 = AtomicU32::new(u32::MAX);

/// Forces the staged Q4_K mmv2 kernels' preferred shared-memory carveout (`Some(Some(pct))`),
/// or none (`Some(None)`), or back to `REDLINE_MMV2_CARVEOUT` (`None`). For tests and benchmarks.
pub fn set_mmv2_carveout(c: Option<Option<u32>>) {
    let v = match c {
        None => u32::MAX,
        Some(None) => 101,
        Some(Some(p)) => p.min(100),
    };
    CARVEOUT_OVERRIDE.store(v, Ordering::Relaxed);
}

/// Forces the staged Q4_K mmv2 kernels' pipeline stages (0 = the register-fragment kernel, 2..=4;
/// `None`: back to `REDLINE_MMV2_STAGE`). For tests and benchmarks.
pub fn set_mmv2_stages(stages: Option<u32>) {
    STAGES_OVERRIDE.store(stages.unwrap_or(u32::MAX), Ordering::Relaxed);
}

/// Dynamic shared memory of an mmv2 launch of `warps` warps: Q6_K stages one super-block of
/// the tile's 16 rows per warp (15 16-byte vectors per row, MV6_ROW_VECS in the kernel).
fn shared_bytes2(ty: GgmlType, warps: u32) -> u32 {
    if ty == GgmlType::Q6K {
        warps * 16 * 15 * 16
    } else {
        0
    }
}

/// Fewest tokens the mmv2 dispatch takes. H200, session 10, Q4_K (µs, dp4a matvec / mmv2 at
/// the default warps): 27648x5120 n = 2: 35.1 / 34.0, n = 3: 53.4 / 35.0; 5120x27648 n = 2:
/// 34.2 / 36.1, n = 3: 69.2 / 37.0; 5120x5120 n = 2: 10.5 / 10.6, n = 3: 18.0 / 10.7 — even at
/// 2 tokens before the q8_K quantize launch (~3 µs alone), a clear win from 3.
const MMV2_MIN_TOKENS: usize = 3;
/// Q6_K's: from 2 tokens. H100, session 26 (stage s26m, inside steps, tok/s, the q8_1 matvec
/// against mmv2 at 2 tokens): two streams of the 32B 181.4 / 176.1 against 192.0 / 192.3, of
/// the 27B 204.3 / 201.4 against 210.7 / 206.0; the 27B's Q6_K down products of 2 tokens took
/// 50 µs against 36 at one token.
const MMV2_MIN_TOKENS_Q6K: usize = 2;

/// Fewest tokens of a product the mmv2 dispatch takes: for Q4_K `REDLINE_MMV2_MIN` (default
/// [`MMV2_MIN_TOKENS`]), for Q6_K `REDLINE_MMV2_MIN_Q6K` (default [`MMV2_MIN_TOKENS_Q6K`];
/// 1..=3, experiments: the staged kernels against the dp4a matvec at one and two tokens),
/// else [`MMV2_MIN_TOKENS`] (session 10: mmv2_q6_k lost at one token).
fn min_tokens2(ty: GgmlType) -> usize {
    match MIN_TOKENS_OVERRIDE.load(Ordering::Relaxed) {
        0 => {}
        m => return m as usize,
    }
    static Q4: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    static Q6: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let read = |var: &str| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|m| (1..=MMV2_MIN_TOKENS).contains(m))
    };
    match ty {
        GgmlType::Q4K => Q4
            .get_or_init(|| read("REDLINE_MMV2_MIN"))
            .unwrap_or(MMV2_MIN_TOKENS),
        GgmlType::Q6K => Q6
            .get_or_init(|| read("REDLINE_MMV2_MIN_Q6K"))
            .unwrap_or(MMV2_MIN_TOKENS_Q6K),
        _ => MMV2_MIN_TOKENS,
    }
}

/// 0: `REDLINE_MMV2_MIN` / `REDLINE_MMV2_MIN_Q6K` decide.
static MIN_TOKENS_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces the fewest tokens the mmv2 dispatch takes, for both formats (1..=3; `None`: back to
/// the environment). For tests and benchmarks; recorded steps made under the other setting
/// must be dropped by the caller.
pub fn set_mmv2_min_tokens(min: Option<usize>) {
    MIN_TOKENS_OVERRIDE.store(
        min.map_or(0, |m| m.clamp(1, MMV2_MIN_TOKENS) as u32),
        Ordering::Relaxed,
    );
}

/// Whether the mmv2 kernels take every product of their formats from one token up: then a
/// one-token step and a speculative verify pass run the same kernels on the same q8_K grid (a
/// row's result does not depend on the token count: the same warps, super-block order and
/// sums), so verify passes may stay on them and still give plain decoding's tokens.
pub fn mmv2_every_token_count(dev: &CudaDevice) -> bool {
    mmv2_every_token_count_of(dev, GgmlType::Q4K) && mmv2_every_token_count_of(dev, GgmlType::Q6K)
}

/// Whether the mmv2 kernels take every product of format `ty` from one token up.
pub fn mmv2_every_token_count_of(dev: &CudaDevice, ty: GgmlType) -> bool {
    mmv2_enabled() && dev.arch() >= 80 && dispatched2_format(ty) && min_tokens2(ty) == 1
}

/// Whether verify passes must stay on the one-token steps' grids ([`set_speculation`]).
static SPECULATION: AtomicU32 = AtomicU32::new(0);

/// Puts the products on the kernels a speculating run needs: each format on one activation
/// grid at every token count, so that a verify pass's rows are its one-token steps' rows, which
/// are plain decoding's. While on, a format's products go to the mmv2 kernels (q8_K
/// activations) only where its one-token products go there too (its fewest mmv2 tokens is 1:
/// `REDLINE_MMV2_MIN_Q6K=1`, `REDLINE_MMV2_MIN=1`); every other few-token product stays on the
/// q8_1 kernels (the dp4a matvec, the direct kernels, the q8_1 tensor-core kernels), whose
/// rows do not depend on the token count's grid. By default no format's one-token products are
/// on mmv2, so none of a speculating run's are. With `REDLINE_MMV2_MIN_Q6K=1` (plain and
/// speculating runs alike) Q6_K's few-token products cost about what one token costs (H100,
/// session 27: the 27B's verify passes of 3 and 4 rows 1.60 / 1.66-1.73x a step -> 1.39-1.47 /
/// 1.46-1.49x) while a plain run's one-token step loses 2 % on the 32B (the 27B: within
/// noise). Set before the model's first step (recorded steps keep their kernels).
pub fn set_speculation(on: bool) {
    SPECULATION.store(on as u32, Ordering::Relaxed);
}

fn speculating() -> bool {
    SPECULATION.load(Ordering::Relaxed) != 0
}

/// Whether the mmv2 dispatch may take products of `ty` under [`set_speculation`].
fn grid_allows(ty: GgmlType) -> bool {
    !speculating() || min_tokens2(ty) == 1
}

/// What a speculating run's few-token products run on, for reports.
pub fn speculation_kernels_note(dev: &CudaDevice) -> String {
    if !mmv2_enabled() || dev.arch() < 80 {
        return "few-token products on the q8_1 kernels (mmv2 off)".into();
    }
    if !speculating() {
        return "few-token products on the tensor-core mmv2 kernels (q8_K activations) where they \
                take them: not what a speculating run verifies on"
            .into();
    }
    let on: Vec<&str> = [GgmlType::Q4K, GgmlType::Q6K, GgmlType::IQ4XS]
        .into_iter()
        .filter(|&t| mmv2_every_token_count_of(dev, t))
        .map(|t| t.name())
        .collect();
    if on.is_empty() {
        "few-token products on the q8_1 kernels, as the one-token steps".into()
    } else {
        format!(
            "few-token products on the one-token steps' kernels: {} on mmv2 (q8_K), the rest on \
             the q8_1 kernels",
            on.join(", ")
        )
    }
}

/// Most output rows of a launch that takes the mmv2 kernels below their fewest tokens:
/// `REDLINE_MMV2_SMALL` (an experiment, default 0: none). Why: the one-token products of
/// 5120-row matrices (o and the out-projections, 320 tiles of 16 rows) run at a third of the
/// bandwidth on the dp4a matvec (less than one wave of blocks, three dependent load rounds per
/// warp); the staged Q4_K kernel keeps two super-blocks in flight per warp without registers
/// (60 of them), and with `REDLINE_MMV2_KSPLIT` more blocks share the SMs.
fn small_rows2() -> usize {
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| {
        std::env::var("REDLINE_MMV2_SMALL")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// Whether a segment launch of fewer tokens than the mmv2 dispatch takes goes to it anyway:
/// [`small_rows2`] rows or fewer in all, every segment of a dispatched format.
fn small_on_mmv2(dev: &CudaDevice, segs: &[Segment<'_>], n: usize) -> bool {
    let limit = small_rows2();
    limit > 0
        && mmv2_enabled()
        && dev.arch() >= 80
        && (1..=MAX_TOKENS).contains(&n)
        && segs
            .iter()
            .all(|s| dispatched2_format(s.w.ty) && grid_allows(s.w.ty))
        && segs.iter().map(|s| s.w.n_rows).sum::<usize>() <= limit
}

/// The backend's question for the mmv2 kernels: [`mmv2_enabled`], sm_80+, a dispatched
/// format, `min_tokens2`..=8 tokens (fewer stay on the dp4a matvec).
pub fn dispatch2(dev: &CudaDevice, ty: GgmlType, n: usize) -> bool {
    grid_allows(ty)
        && mmv2_enabled()
        && dev.arch() >= 80
        && dispatched2_format(ty)
        && (min_tokens2(ty)..=MAX_TOKENS).contains(&n)
}

/// Tokens of the q8_K copy's layout for x of `n_tokens` (kernels/common.cuh `q8k_q_at`): past
/// [`MAX_TOKENS`] rounded up to a multiple of 8, so the n-tile kernels find each 8-token tile
/// of a unit at a constant offset (the padding tokens are never written nor stored).
pub fn q8k_layout_tokens(n_tokens: usize) -> usize {
    if n_tokens > MAX_TOKENS {
        n_tokens.next_multiple_of(8)
    } else {
        n_tokens
    }
}

/// Most tokens of an mmv2 launch: up to [`MAX_TOKENS`] one tile of 8 token columns, past it
/// (Q4_K and Q6_K) `ceil(n / 8)` tiles per warp (`mmv2s_q4_k_s2_n*`, `mmv2_q6_k_n*`).
pub const MAX_TOKENS_N: usize = 32;

/// Whether a product of 9..=[`MAX_TOKENS_N`] tokens goes to the mmv2 kernels with several
/// 8-token tiles per warp (the weights decoded once for all of them) instead of mmq: Q4_K and
/// Q6_K on sm_80+, when [`mmv2n_enabled`]. Why (session 22): mmq moved the 32-token Q4_K
/// 27648x5120 product at 0.44 TB/s on the H200 (~60 SASS instructions per mma, a third of them
/// q8_1's per-unit float scale work), mmv2 streams it at ~2 TB/s at 8 tokens.
pub fn dispatch2n(dev: &CudaDevice, ty: GgmlType, n: usize) -> bool {
    (MAX_TOKENS + 1..=MAX_TOKENS_N).contains(&n)
        && mmv2n_enabled()
        && grid_allows(ty)
        && mmv2_enabled()
        && dev.arch() >= 80
        && matches!(ty, GgmlType::Q4K | GgmlType::Q6K)
}

/// Whether [`dispatch2n`] may take 9..=32-token products: the override ([`set_mmv2n`]), else
/// on unless `REDLINE_MMV2_N=0`. On since session 24 (H100, the 32B Q4_K_M, `bench -p 0 -n 32
/// --parallel N`, tok/s against mmq: 32 rows 469.6 -> 684.5, 16 rows 490.7 -> 908.5).
pub fn mmv2n_enabled() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match MMV2N_OVERRIDE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => *ENV.get_or_init(|| std::env::var("REDLINE_MMV2_N").as_deref() != Ok("0")),
    }
}

/// 0: `REDLINE_MMV2_N` decides; 1 off, 2 on.
static MMV2N_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces [`dispatch2n`] on or off (`None`: back to `REDLINE_MMV2_N`). For tests and benchmarks;
/// recorded steps made under the other setting must be dropped by the caller.
pub fn set_mmv2n(on: Option<bool>) {
    MMV2N_OVERRIDE.store(on.map_or(0, |o| if o { 2 } else { 1 }), Ordering::Relaxed);
}

/// Where an mmv2 launch reads x.
#[derive(Clone, Copy, PartialEq, Eq)]
enum X2 {
    /// The q8_K copy (`MatvecScratch::q8k`).
    Q8k,
    /// The q8_1 copy, natural or tiled (`mmv2_q6_k_q81`, `mmv2_q6_k_q81t`).
    Q81,
}

impl CudaDevice {
    /// Quantizes x `[n_tokens, cols]` f32 (cols % 256 == 0) to q8_K into `s` (kernels/mmv.cu
    /// `quantize_q8_k`: bit for bit `quant::activation::quantize_row_q8_k`). Asynchronous.
    pub fn quantize_q8_k(
        &self,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        cols: usize,
        s: &mut MatvecScratch,
    ) -> Result<()> {
        let (xa, x_len) = (self.device_address(x), x.len());
        let k = &mut s.q8k;
        let nlay = q8k_layout_tokens(n_tokens);
        let elems = nlay * cols;
        if !cols.is_multiple_of(256)
            || cols > i32::MAX as usize
            || x_len < n_tokens * cols
            || k.q.len() < elems
            || k.dy.len() < elems / 256
            || k.bsum.len() < elems / 32
        {
            return Err(CudaError::Shape(format!(
                "q8_K of x {n_tokens}x{cols} (x holds {x_len}, scratch {})",
                k.q.len()
            )));
        }
        k.holds = None;
        if n_tokens == 0 {
            return Ok(());
        }
        let f = self.function(Program::Mmv, "quantize_q8_k")?;
        let cfg = LaunchConfig {
            grid_dim: ((cols / 256).div_ceil(8) as u32, n_tokens as u32, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        let mut a = crate::pdl::Args::new();
        a.push(xa)
            .push(self.device_address(&k.q))
            .push(self.device_address(&k.dy))
            .push(self.device_address(&k.bsum))
            .push(cols as i32)
            .push(nlay as i32);
        // SAFETY: matches quantize_q8_k(x, q, dy, bsum, ncols, nlay); x holds n_tokens * cols
        // f32 from xa (x_len >= n_tokens * cols, checked above) and the buffers their shares
        // of nlay * cols; cols % 256 == 0. With PDL the kernel waits for the previous kernel
        // before reading x or writing the scratch.
        unsafe { a.launch(self.stream(), &f, cfg, crate::pdl::enabled(self.arch())) }?;
        k.holds = Some((xa, n_tokens, cols));
        Ok(())
    }

    /// [`CudaDevice::quantize_for_matvec`] and [`CudaDevice::quantize_q8_k`] of the same x
    /// in one launch (kernels/mmv.cu `quantize_q8_1_k`, the same bits); cols % 256 == 0.
    pub fn quantize_q8_1_and_k(
        &self,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        cols: usize,
        s: &mut MatvecScratch,
    ) -> Result<()> {
        if x.len() < n_tokens * cols || !cols.is_multiple_of(256) || cols > i32::MAX as usize {
            return Err(CudaError::Shape(format!(
                "q8_1 and q8_K of x {n_tokens}x{cols} (x holds {})",
                x.len()
            )));
        }
        let (xq, xds, tiled) = s.buffers_for(n_tokens, cols)?;
        let (xq, xds) = (self.device_address(xq), self.q8_1_xds_address(xds, tiled));
        let (q, dy, bsum) = s.q8k_buffers_for(self, n_tokens, cols)?;
        if n_tokens == 0 {
            return Ok(());
        }
        let f = self.function(Program::Mmv, "quantize_q8_1_k")?;
        let cfg = LaunchConfig {
            grid_dim: ((cols / 256) as u32, n_tokens as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let xa = self.device_address(x);
        let mut a = crate::pdl::Args::new();
        a.push(xa)
            .push(xq)
            .push(xds)
            .push(q)
            .push(dy)
            .push(bsum)
            .push(cols as i32);
        // SAFETY: matches quantize_q8_1_k(x, xq, xds, q, dy, bsum, ncols) (xds tagged with the
        // q8_1 layout, common.cuh q8_1_tagged); x holds n_tokens *
        // cols f32, the scratch buffers their shares of it (buffers_for, q8k_buffers_for
        // checked); one 256-thread block per 256 values. It waits for the previous kernel
        // before reading x (PDL).
        unsafe { a.launch(self.stream(), &f, cfg, crate::pdl::enabled(self.arch())) }?;
        s.q8k_made(xa, n_tokens, cols);
        Ok(())
    }

    /// [`CudaDevice::quantize_q8_k`] unless `s` already holds x's q8_K copy (made since its
    /// q8_1 copy was last rewritten, see [`Q8kScratch`]).
    pub fn ensure_q8_k(
        &self,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        cols: usize,
        s: &mut MatvecScratch,
    ) -> Result<()> {
        if s.q8k.holds == Some((self.device_address(x), n_tokens, cols)) {
            return Ok(());
        }
        self.quantize_q8_k(x, n_tokens, cols, s)
    }

    /// `y (+)= W x (+ bias)` for every segment by the mmv2 kernels, x of 1..=8 tokens (Q4_K,
    /// Q6_K: 1..=32) already quantized to q8_K into `s` ([`CudaDevice::quantize_q8_k`]). Same
    /// contract as [`CudaDevice::mmv_segments`]: every `y` holds `n_tokens * w.n_rows` f32,
    /// every `bias` `w.n_rows`.
    pub fn mmv2_segments(&self, segs: &[Segment<'_>], s: &MatvecScratch) -> Result<()> {
        self.mmv2_launch(segs, s, X2::Q8k)
    }

    /// An mmv2 launch reading x from `s` in the layout `xf` says (q8_1: Q6_K only, up to
    /// [`MAX_TOKENS`], natural or tiled).
    fn mmv2_launch(&self, segs: &[Segment<'_>], s: &MatvecScratch, xf: X2) -> Result<()> {
        let Some(first) = segs.first() else {
            return Ok(());
        };
        let (ty, cols) = (first.w.ty, first.w.n_cols);
        let stem = stem2(ty).ok_or(CudaError::UnsupportedType(ty.name()))?;
        let k = &s.q8k;
        let q81 = xf == X2::Q81;
        let (n_tokens, xcols) = if q81 {
            let (xqd, xds, n, c) = s.quantized();
            // (an x too short for its shape is a shape error below)
            let fits = xqd.len() >= n * c && xds.len() >= n * c / 16;
            if fits {
                (n, c)
            } else {
                (0, c)
            }
        } else {
            k.holds.map_or((0, 0), |(_, n, c)| (n, c))
        };
        // 8-token tiles per warp: one up to MAX_TOKENS, else Q4_K / Q6_K only
        let nt = n_tokens.div_ceil(8);
        if segs.len() > MAX_SEGMENTS
            || !(1..=MAX_TOKENS_N).contains(&n_tokens)
            || (nt > 1 && !matches!(ty, GgmlType::Q4K | GgmlType::Q6K))
            || (q81 && (nt > 1 || ty != GgmlType::Q6K))
            || xcols != cols
            || !cols.is_multiple_of(256)
            || segs.iter().any(|s| s.w.ty != ty || s.w.n_cols != cols)
        {
            return Err(CudaError::Shape(format!(
                "mmv2: {} segments of {} x {cols} with x in {} as {n_tokens}x{xcols}",
                segs.len(),
                ty.name(),
                if q81 { "q8_1" } else { "q8_K" },
            )));
        }
        let (p, blocks) = self.segment_params(segs, ROWS_PER_BLOCK);
        if blocks == 0 {
            return Ok(());
        }
        let total_rows: usize = segs.iter().map(|s| s.w.n_rows).sum();
        // (the NT-tile kernels: Q4_K staged in two stages or the register-fragment kernel
        // (stages 0), no K split, x not staged)
        let stages = match ty {
            _ if q81 => 0,
            GgmlType::Q4K if nt > 1 => stages2().min(2),
            GgmlType::Q4K => stages2(),
            _ => 0,
        };
        let xs = nt == 1 && stages > 0 && stages <= 3 && xs2(cols);
        let nsuf = if nt > 1 {
            format!("_n{nt}")
        } else {
            String::new()
        };
        // (x staged, the same choice: alone the 8-token Q4_K 5120x27648 took 43.4 µs at 3 warps,
        // 46.1 at 8, but at 3 it was 78.6 inside a step, where 8 warps serve the plain kernel
        // best; session 20)
        let mut warps = warps_per_block2(ty, total_rows.div_ceil(ROWS_PER_BLOCK), cols);
        let mut emulate = i32::from(self.arch() < 80 || FORCE_EMULATION.load(Ordering::Relaxed));
        let emu = emu_suffix(emulate);
        let (f, smem) = if stages > 0 {
            let f = self.function(
                Program::Mmv,
                &format!(
                    "mmv2s_{stem}_s{stages}{}{nsuf}{emu}",
                    if xs { "x" } else { "" }
                ),
            )?;
            let per_stage = if xs {
                STAGE_BYTES_Q4K_XS
            } else {
                STAGE_BYTES_Q4K
            };
            let mut smem = warps * stages * per_stage;
            if smem > 40 * 1024 {
                // fewer warps where the device's shared memory per block cannot hold them all
                // (a V100's 96 KiB against 8 warps of 3 x-staged stages, in the tests)
                let max = crate::attention::max_smem_per_block(self) as u32;
                while warps > 1 && smem + 8 * 1024 > max {
                    warps -= 1;
                    smem = warps * stages * per_stage;
                }
            }
            if let Some(pct) = carveout2() {
                // the shared memory / L1 split the driver should prefer (x is read through L1)
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    pct as i32,
                )?;
            }
            (f, smem)
        } else {
            let xsuf = match (q81, s.tiled()) {
                (false, _) => "",
                (true, false) => "_q81",
                (true, true) => "_q81t",
            };
            let f = self.function(Program::Mmv, &format!("mmv2_{stem}{nsuf}{xsuf}{emu}"))?;
            (f, shared_bytes2(ty, warps))
        };
        let ks = if nt > 1 {
            1
        } else {
            ksplit2(blocks, cols / 256)
        };
        let smem = if spread2() {
            spread_smem(self, blocks * ks as usize, smem)
        } else {
            smem
        };
        // (beside the kernels' static shared memory: mv_reduce_warps' 4 KB per token tile and
        // a margin)
        if smem + 4096 * (nt as u32 - 1) > 40 * 1024 {
            // beyond the default 48 KiB a kernel must opt in (a host-side attribute, not a
            // stream operation: fine inside graph capture)
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )?;
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32 * ks, 1, 1),
            block_dim: (32, warps, 1),
            shared_mem_bytes: smem,
        };
        let mut n_i = n_tokens as i32;
        let mut mode = load_mode2(ty);
        let (mut p, mut pq, mut pd, mut pb) = if q81 {
            let (xqd, xds, _, _) = s.quantized();
            (
                p,
                self.device_address(xqd),
                self.device_address(xds),
                self.device_address(&k.bsum),
            )
        } else {
            (
                p,
                self.device_address(&k.q),
                self.device_address(&k.dy),
                self.device_address(&k.bsum),
            )
        };
        let (mut kp, mut kc) = (
            self.device_address(&k.kpart),
            self.device_address(&k.kcount),
        );
        let mut ks_i = ks as i32;
        let mut params = [
            crate::pdl::arg(&mut p),
            crate::pdl::arg(&mut pq),
            crate::pdl::arg(&mut pd),
            crate::pdl::arg(&mut pb),
            crate::pdl::arg(&mut n_i),
            crate::pdl::arg(&mut mode),
            crate::pdl::arg(&mut emulate),
            crate::pdl::arg(&mut kp),
            crate::pdl::arg(&mut kc),
            crate::pdl::arg(&mut ks_i),
        ];
        // SAFETY: matches mmv2_<fmt>(MvSegs, q, dy, bsum, n_tokens, load_mode, emulate, kpart,
        // kcount, ks) with n_tokens <= 8, or its `_n{nt}` variant (Q4_K / Q6_K, nt tiles of 8
        // tokens, n_tokens <= MAX_TOKENS_N = 32, ks = 1); the scratch holds x of n_tokens x
        // cols in q8_K, laid out over q8k_layout_tokens(n_tokens) tokens, the most the kernels
        // read (quantize_q8_k checked its sizes), or for mmv2_q6_k_q81 (xq, xds, unused bsum)
        // x of n_tokens <= 8 x cols in q8_1, natural or (_q81t) tiled (the lengths checked
        // above); every segment's matrix is a live DeviceMatrix of
        // this format and width (>= 16 bytes of padding, rows of whole super-blocks), outputs
        // hold n_tokens * n_rows f32 and biases n_rows (the caller's contract); Q6_K and the
        // staged Q4_K kernels get their shared memory; with ks > 1 there are fewer than
        // KSPLIT_MAX_TILES tiles and ks <= KSPLIT_MAX (kpart, kcount sized for that; the
        // counters are 0 between launches). The kernel waits for the previous kernel before
        // reading x or the outputs and before writing anything, so it may launch with PDL.
        let pdl = crate::pdl::enabled(self.arch());
        unsafe { crate::pdl::launch(self.stream(), &f, cfg, &mut params, pdl) }.map_err(|e| {
            // say which launch the driver refused (a bug report needs the variant and its shape)
            CudaError::Driver(format!(
                "{e} (mmv2 {} x {cols}, {n_tokens} tokens: grid {}, block 32x{warps}, {smem} B \
                 shared, {stages} stages, K split {ks}, PDL {pdl})",
                ty.name(),
                cfg.grid_dim.0
            ))
        })?;
        Ok(())
    }

    /// `y = W x` for one matrix by the mmv2 kernels, x (1..=8 tokens; Q4_K, Q6_K: 1..=32)
    /// already in q8_K in `s`; y holds at least `n_tokens * w.n_rows` f32.
    pub fn mmv2_prequantized(
        &self,
        w: &crate::DeviceMatrix,
        s: &MatvecScratch,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let n = s.q8k.holds.map_or(0, |(_, n, _)| n);
        if y.len() < n * w.n_rows {
            return Err(CudaError::Shape(format!(
                "mmv2 {}x{} for {n} tokens into y of {}",
                w.n_rows,
                w.n_cols,
                y.len()
            )));
        }
        let seg = Segment {
            w,
            y: self.device_address(y),
            bias: None,
            accumulate: false,
        };
        self.mmv2_segments(&[seg], s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supports_formats_and_counts() {
        assert!(supports(GgmlType::Q4K, 1));
        assert!(supports(GgmlType::Q6K, 8));
        assert!(!supports(GgmlType::Q4K, 9));
        assert!(!supports(GgmlType::Q4K, 0));
        assert!(!supports(GgmlType::Q4_0, 4));
    }

    #[test]
    fn q8k_layout_pads_past_one_tile_only() {
        // up to 8 tokens the layout is the tokens themselves (the 3..8-token kernels and the
        // fused writers read it so); past 8 a multiple of 8 (the n-tile kernels)
        for n in 0..=8 {
            assert_eq!(q8k_layout_tokens(n), n);
        }
        assert_eq!(q8k_layout_tokens(9), 16);
        assert_eq!(q8k_layout_tokens(16), 16);
        assert_eq!(q8k_layout_tokens(17), 24);
        assert_eq!(q8k_layout_tokens(25), 32);
        assert_eq!(q8k_layout_tokens(MAX_TOKENS_N), MAX_TOKENS_N);
    }

    #[test]
    fn kernel_names_by_token_count() {
        assert_eq!(kernel_name("q4_k", 1), "mmv_q4_k_t1");
        assert_eq!(kernel_name("q4_k", 3), "mmv_q4_k_t4");
        assert_eq!(kernel_name("q4_k", 5), "mmv_q4_k");
        assert_eq!(kernel_name("q6_k", 2), "mmv_q6_k");
    }

    #[test]
    fn mmv2_warps_by_tile_count() {
        set_warps_override(0);
        // Q4_K: 8 warps (q4_warps2, unless REDLINE_MMV2_Q4_WARPS says otherwise), never more
        // than the super-blocks of a row
        if std::env::var_os("REDLINE_MMV2_Q4_WARPS").is_none() {
            assert_eq!(warps_per_block2(GgmlType::Q4K, 1728, 5120), 8);
            assert_eq!(warps_per_block2(GgmlType::Q4K, 320, 27648), 8);
            assert_eq!(warps_per_block2(GgmlType::Q4K, 64, 5120), 8);
            assert_eq!(warps_per_block2(GgmlType::Q4K, 64, 512), 2);
        }
        assert_eq!(warps_per_block2(GgmlType::Q6K, 9504, 5120), 2);
        assert_eq!(warps_per_block2(GgmlType::Q6K, 1728, 5120), 4);
        assert_eq!(warps_per_block2(GgmlType::Q6K, 320, 27648), 5);
    }

    #[test]
    fn ksplit_only_below_the_tile_limit_and_never_past_the_super_blocks() {
        set_mmv2_ksplit(Some(3));
        assert_eq!(ksplit2(320, 108), 3);
        assert_eq!(ksplit2(599, 20), 3);
        assert_eq!(ksplit2(600, 20), 1);
        assert_eq!(ksplit2(1728, 20), 1);
        assert_eq!(ksplit2(4, 2), 2);
        set_mmv2_ksplit(Some(9));
        assert_eq!(ksplit2(320, 108), KSPLIT_MAX as u32);
        set_mmv2_ksplit(None);
    }

    // 8 warps (the most) x 2 stages (the default) x 16 rows x 144 bytes: under the 48 KiB a
    // launch gets without opting in (the host opts in above that)
    const _: () = assert!(8 * 2 * STAGE_BYTES_Q4K <= 48 * 1024);

    #[test]
    fn warps_never_outnumber_super_blocks() {
        set_warps_override(0);
        assert_eq!(warps_per_block(320, 27648, 4), 4);
        assert_eq!(warps_per_block(1728, 5120, 4), 8);
        assert_eq!(warps_per_block(1728, 5120, 2), 4);
        assert_eq!(warps_per_block(10, 512, 8), 2);
        assert_eq!(warps_per_block(10, 256, 1), 1);
    }
}
