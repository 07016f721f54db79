//! Small-batch quantized matrix products y = W x (2..32 tokens) on int8 tensor cores
//! (kernels/mmq.cu): each weight is decoded once into `mma.sync m16n8k32 s8` fragments and
//! multiplied against every token, where the dp4a matvec (crate::matvec) re-does its per-token
//! dot work for each token and is instruction bound beyond one or two tokens.
//!
//! x is quantized to q8_1 into the same [`MatvecScratch`] the matvec uses (so a producer that
//! writes q8_1 itself serves both). sm_80+ runs the tensor-core path; sm_70 runs the same
//! kernel with the mma emulated by warp shuffles + dp4a (correct, slower than the matvec there:
//! [`supports_device`] says no on sm_70).

use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use crate::matvec::{DeviceMatrix, MatvecScratch};
use crate::sources::Program;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use gguf::GgmlType;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Tokens per launch at most (kernels for 8, 16, 24 and 32 tokens); more are looped.
pub const MAX_TOKENS_PER_LAUNCH: usize = 32;
/// The token counts the dispatch should send here (beyond them the f16 GEMM path wins or
/// the matvec is as fast).
pub const MIN_TOKENS: usize = 2;
pub const MAX_TOKENS: usize = 32;
/// Most warps per block (MMQ_MAX_WARPS in the kernel).
const MAX_WARPS: u32 = 8;
/// Rows per block (the mma's m).
const ROWS_PER_BLOCK: usize = 16;

/// Forces the shuffle + dp4a emulation of the mma on every arch (tests: the sm_70 path).
static FORCE_EMULATION: AtomicBool = AtomicBool::new(false);
/// Forced warps per block (1..=8); 0 = per-shape choice.
static WARPS_OVERRIDE: AtomicU32 = AtomicU32::new(0);
/// Forced 16-row tiles per block (1 or 2); 0 = `REDLINE_MMQ_MT`, else the shape rule.
static MT_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces the 16-row tiles per block of the 9..32-token launches (`mmq_*_t{2,3,4}_m2` at 2;
/// 0: back to `REDLINE_MMQ_MT` and the shape rule). For tests and benchmarks.
pub fn set_m_tiles_override(mt: u32) {
    MT_OVERRIDE.store(mt.min(2), Ordering::Relaxed);
}

/// Rows from which a 9..32-token launch takes two 16-row tiles a block by default.
const MT2_MIN_ROWS: usize = 16384;

/// 16-row tiles per block for a launch of `tiles` 8-token tiles over `rows` rows of `ty`: 2 puts two
/// tiles of rows in a block so that one load of x's fragments serves both (at 32 tokens a
/// 16-row tile reads ~5x its weight bytes of x); 9..32 tokens with the int8 mma only. By
/// default for Q4_K matrices of [`MT2_MIN_ROWS`]+ rows (H200, session 22: 27648x5120 at 32
/// tokens 179.3 -> 137.3 us, at 16 106.3 -> 93.6; 17408x5120 at 32 111.8 -> 100.2; the
/// 5120-row products no faster, 5120x5120 at 16 slower: half as many blocks; the other formats
/// checked but not timed); `REDLINE_MMQ_MT=1|2` forces one or two everywhere.
fn m_tiles(ty: GgmlType, tiles: usize, rows: usize, emulate: bool) -> usize {
    if emulate || tiles < 2 {
        return 1;
    }
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let forced = match MT_OVERRIDE.load(Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| match std::env::var("REDLINE_MMQ_MT").as_deref() {
            Ok("1") => 1,
            Ok("2") => 2,
            _ => 0,
        }),
        m => m as usize,
    };
    match forced {
        0 if ty == GgmlType::Q4K && rows >= MT2_MIN_ROWS => 2,
        0 => 1,
        m => m,
    }
}

/// Runs the sm_70 fallback (warp shuffles + dp4a instead of mma) on every card, for tests.
pub fn set_force_emulation(on: bool) {
    FORCE_EMULATION.store(on, Ordering::Relaxed);
}

/// Forces the warps per block (1..=8; they split the columns of one 16-row tile); 0 restores
/// the per-shape choice. For benchmarks and tests.
pub fn set_warps_override(w: u32) {
    WARPS_OVERRIDE.store(w.min(MAX_WARPS), Ordering::Relaxed);
}

/// Per format: kernel stem, bytes per 256-weight chunk, and the alignment of chunk starts
/// (must match CB / ALIGN of the Mq* structs in kernels/mmq.cu).
fn format(ty: GgmlType) -> Option<(&'static str, usize, usize)> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => ("q4_0", 8 * 18, 2),
        Q8_0 => ("q8_0", 8 * 34, 2),
        Q4K => ("q4_k", 144, 16),
        Q5K => ("q5_k", 176, 16),
        Q6K => ("q6_k", 210, 2),
        IQ4XS => ("iq4_xs", 136, 8),
        _ => return None,
    })
}

/// Whether the tensor-core product handles weight type `ty` for `n` tokens (the dispatch's
/// question; other formats and counts stay on the matvec / GEMM paths).
pub fn supports(ty: GgmlType, n: usize) -> bool {
    format(ty).is_some() && (MIN_TOKENS..=MAX_TOKENS).contains(&n)
}

/// [`supports`] on this card: tensor cores (sm_80+) only; sm_70 keeps the matvec.
pub fn supports_device(dev: &CudaDevice, ty: GgmlType, n: usize) -> bool {
    dev.arch() >= 80 && supports(ty, n)
}

/// Whether the backend's matmul dispatch should use this path: on by default for batches
/// beyond the few-token kernels (9..32 tokens: more than 8 decode streams), `REDLINE_MMQ=0`
/// off. It was opt-in while `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` showed in 3-sequence
/// recorded steps (session 4, from 2 tokens); session 7 could not reproduce that (the same
/// test, graphs on, mmq from 2 tokens: every step recorded and equal to the unfused one).
/// Read once.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLINE_MMQ").map_or(true, |v| v != "0"))
}

/// Fewest tokens for which the backend's matmul takes this path instead of the matvec
/// (`REDLINE_MMQ_MIN` overrides; read once). Default 9: up to 8 tokens the fused few-token
/// kernels (dp4a segments, crate::mmv) are faster or as fast (H200, q4_K 27648x5120 n = 8:
/// mmv 70 µs, mmq v2 82, dp4a 114); from 9 the matvec needs a second pass over the weights.
pub fn dispatch_min_tokens() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("REDLINE_MMQ_MIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(9)
            .max(MIN_TOKENS)
    })
}

/// The backend's question: should a product of `n` tokens of weight type `ty` on `dev` take
/// the tensor-core path ([`enabled`], [`supports_device`], at least [`dispatch_min_tokens`]).
pub fn dispatch(dev: &CudaDevice, ty: GgmlType, n: usize) -> bool {
    n >= dispatch_min_tokens()
        && enabled()
        && supports_device(dev, ty, n)
        && !(n <= 2 && crate::matvec::q8_1_tiled_enabled())
}

/// Warps per block for a rows x cols product: the warps split the 256-weight chunks of one
/// 16-row tile, so few tiles (a 5120-row matrix is 320) want more warps to keep enough bytes in
/// flight per SM, many tiles fewer (less reduction, more blocks per SM).
pub fn warps_per_block(n_rows: usize, n_cols: usize) -> u32 {
    let forced = WARPS_OVERRIDE.load(Ordering::Relaxed);
    if forced > 0 {
        return forced;
    }
    let tiles = n_rows.div_ceil(ROWS_PER_BLOCK);
    let chunks = n_cols.div_ceil(256);
    let w = if tiles >= 1024 { 4 } else { 8 };
    // no idle warps: at least one chunk each
    (w as usize).min(chunks.max(1)) as u32
}

/// Chunks in flight per warp (MMQ_STAGES in the kernel): cp.async stages on sm_80+, one
/// register-staged chunk on sm_70.
fn stages(arch: u32) -> usize {
    if arch >= 80 {
        4
    } else {
        1
    }
}

/// Bytes of one warp's staging buffer for one chunk: 16 rows x VPR vectors of 16 bytes.
fn stage_bytes(chunk_bytes: usize, align: usize) -> usize {
    ROWS_PER_BLOCK * (chunk_bytes + (16 - align)).div_ceil(16) * 16
}

/// Most dynamic shared memory a block may ask for: 99 KiB, the opt-in limit of the smallest
/// sm_80+ parts (sm_86 / sm_89; A100 and H100/H200 allow more).
const MAX_SHARED_BYTES: usize = 99 * 1024;

/// Dynamic shared memory of one block of `mt` 16-row tiles: the warps' staging buffers, reused
/// for the partial sums (nw x MT x NT x 4 x 32 f32).
fn shared_bytes(
    chunk_bytes: usize,
    align: usize,
    warps: u32,
    tiles: usize,
    stages: usize,
    mt: usize,
) -> usize {
    let stage = warps as usize * stages * mt * stage_bytes(chunk_bytes, align);
    let red = warps as usize * mt * tiles * 4 * 32 * 4;
    stage.max(red)
}

impl CudaDevice {
    /// y = W x for `n_tokens` tokens on the int8 tensor-core path: x [n_tokens, n_cols] f32,
    /// y [n_tokens, n_rows] f32. x is first quantized to q8_1 into `scratch` (which must hold
    /// n_tokens rows). Weights are read once per group of up to 32 tokens. Asynchronous.
    pub fn mmq(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
        scratch: &mut MatvecScratch,
    ) -> Result<()> {
        if format(w.ty).is_none() {
            return Err(CudaError::UnsupportedType(w.ty.name()));
        }
        self.quantize_for_matvec(x, n_tokens, w.n_cols, scratch)?;
        self.mmq_prequantized(w, n_tokens, scratch, y)
    }

    /// y = W x with x (`n_tokens` rows of `w.n_cols`) already quantized into `scratch` by
    /// [`CudaDevice::quantize_for_matvec`] or a producer kernel that writes q8_1.
    pub fn mmq_prequantized(
        &self,
        w: &DeviceMatrix,
        n_tokens: usize,
        scratch: &mut MatvecScratch,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (stem, chunk_bytes, align) =
            format(w.ty).ok_or(CudaError::UnsupportedType(w.ty.name()))?;
        let (rows, cols) = (w.n_rows, w.n_cols);
        if y.len() < n_tokens * rows {
            return Err(CudaError::Shape(format!(
                "mmq {} {rows}x{cols} for {n_tokens} tokens into y of {}",
                w.ty.name(),
                y.len()
            )));
        }
        if n_tokens == 0 || rows == 0 {
            return Ok(());
        }
        // these kernels read the natural q8_1 layout only (the dispatch keeps tiled x away)
        if scratch.tiled() {
            return Err(CudaError::Shape(format!(
                "mmq of {n_tokens} tokens with x in the tiled q8_1 layout"
            )));
        }
        // checks cols % 32 and the buffer sizes; x is what the caller quantized into it
        let (xq, xds, _) = scratch.buffers_for(n_tokens, cols)?;
        let st = stages(self.arch());
        let emulate = i32::from(self.arch() < 80 || FORCE_EMULATION.load(Ordering::Relaxed));
        let (rows_i, cols_i, row_bytes) = (rows as i32, cols as i32, w.row_bytes() as i64);
        let mut t0 = 0;
        while t0 < n_tokens {
            let n = (n_tokens - t0).min(MAX_TOKENS_PER_LAUNCH);
            let tiles = n.div_ceil(8);
            let mt = m_tiles(w.ty, tiles, rows, emulate != 0);
            let per_warp = st * mt * stage_bytes(chunk_bytes, align);
            let warps = warps_per_block(rows.div_ceil(mt), cols)
                .min((MAX_SHARED_BYTES / per_warp) as u32)
                .max(1);
            let name = match mt {
                1 => format!("mmq_{stem}_t{tiles}{}", crate::mmv::emu_suffix(emulate)),
                _ => format!("mmq_{stem}_t{tiles}_m{mt}"),
            };
            let f = self.function(Program::Mmq, &name)?;
            let smem = shared_bytes(chunk_bytes, align, warps, tiles, st, mt);
            if smem > 48 * 1024 {
                // beyond the default 48 KiB a kernel must opt in (a host-side attribute, not a
                // stream operation: fine inside graph capture)
                f.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )?;
            }
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(ROWS_PER_BLOCK * mt) as u32, 1, 1),
                block_dim: (32, warps, 1),
                shared_mem_bytes: smem as u32,
            };
            let xqs = xq.slice(t0 * cols..(t0 + n) * cols);
            let xdss = xds.slice(t0 * cols / 16..(t0 + n) * cols / 16);
            let mut ys = y.slice_mut(t0 * rows..(t0 + n) * rows);
            let n_i = n as i32;
            let mut b = self.stream().launch_builder(&f);
            b.arg(&w.data).arg(&xqs).arg(&xdss).arg(&mut ys);
            b.arg(&rows_i)
                .arg(&cols_i)
                .arg(&row_bytes)
                .arg(&n_i)
                .arg(&emulate);
            // SAFETY: matches mmq_<fmt>_t<NT>[_m<MT>](W, xq, xds, y, nrows, ncols, row_bytes,
            // n_tokens, emulate) with n <= 8 * NT and a grid of ceil(rows / 16 MT) blocks; W is a live DeviceMatrix of this format with >= 16
            // bytes of padding (the rounded-out 16-byte loads); xq/xds/y slices hold n tokens
            // (sizes checked above and by buffers_for); the dynamic shared memory is what the
            // kernel indexes for `warps` warps and MT tiles at this arch's stage count (<= 99
            // KiB, opted in above when over 48 KiB).
            unsafe { b.launch(cfg) }?;
            t0 += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_fits_the_limits() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::IQ4XS,
        ] {
            let (_, cb, al) = format(ty).unwrap();
            // the most warps the launch allows at each arch's stage count
            for (arch, limit) in [
                (70, 48 * 1024),
                (80, MAX_SHARED_BYTES),
                (90, MAX_SHARED_BYTES),
            ] {
                let st = stages(arch);
                for mt in [1, 2] {
                    let w =
                        MAX_WARPS.min((MAX_SHARED_BYTES / (st * mt * stage_bytes(cb, al))) as u32);
                    assert!(w >= 2, "{} sm_{arch} mt {mt}: {w} warps", ty.name());
                    for tiles in 1..=4 {
                        let b = shared_bytes(cb, al, w, tiles, st, mt);
                        let limit = if mt == 1 { limit } else { MAX_SHARED_BYTES };
                        assert!(b <= limit, "{} sm_{arch} mt {mt}: {b} bytes", ty.name());
                    }
                }
            }
        }
    }

    #[test]
    fn supports_formats_and_counts() {
        assert!(supports(GgmlType::Q4K, 2));
        assert!(supports(GgmlType::Q6K, 32));
        assert!(!supports(GgmlType::Q4K, 1));
        assert!(!supports(GgmlType::Q4K, 33));
        assert!(!supports(GgmlType::Q3K, 8));
        assert!(!supports(GgmlType::F16, 8));
    }

    #[test]
    fn warps_split_at_least_one_chunk_each() {
        set_warps_override(0);
        assert_eq!(warps_per_block(5120, 27648), 8);
        assert_eq!(warps_per_block(27648, 5120), 4);
        assert_eq!(warps_per_block(100, 512), 2);
    }

    #[test]
    fn two_row_tiles_for_wide_products_of_nine_tokens_or_more() {
        set_m_tiles_override(0);
        let q4k = GgmlType::Q4K;
        assert_eq!(m_tiles(q4k, 4, 27648, false), 2);
        assert_eq!(m_tiles(q4k, 2, 17408, false), 2);
        assert_eq!(m_tiles(q4k, 4, 5120, false), 1);
        assert_eq!(m_tiles(q4k, 1, 27648, false), 1);
        assert_eq!(m_tiles(q4k, 4, 27648, true), 1);
        assert_eq!(m_tiles(GgmlType::Q6K, 4, 152064, false), 1);
    }
}
