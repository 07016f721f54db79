//! Matrix-vector (and small-batch matrix) products y = W x on the GPU for every GGUF weight
//! format, reading the weights once per call. Kernels: kernels/matvec_quant.cu (block formats,
//! dp4a against q8_1-quantized x), kernels/matvec_float.cu (F32 / F16 / BF16).

use crate::device::CudaDevice;
use crate::error::{CudaError, Result};
use crate::sources::Program;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use gguf::GgmlType;
use std::sync::atomic::{AtomicU32, Ordering};

/// Warps per thread block; must match MV_WARPS / MVF_WARPS in the kernels.
const WARPS_PER_BLOCK: u32 = 4;
/// Tokens per launch at most (the kernels are instantiated for 1, 2, 4 and 8 tokens, each
/// with 2 and 4 rows per warp).
pub const MAX_TOKENS_PER_LAUNCH: usize = 8;
/// Bytes after the last row: the staged 16-byte loads may read up to 15 bytes past it.
const PAD_BYTES: usize = 16;
/// Forced rows per warp of the block-format kernels (benchmark knob); 0 = per-shape choice.
static ROWS_PER_WARP_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forced warps per row set of the block-format kernels (benchmark knob); 0 = the default, 1.
static KSPLIT_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces the rows per warp of block-format matvecs (2 or 4) for every device of this
/// process; 0 restores the per-shape choice. For benchmarks and tests.
pub fn set_rows_per_warp_override(r: u32) {
    ROWS_PER_WARP_OVERRIDE.store(r, Ordering::Relaxed);
}

/// Forces how many warps split one row set's columns (1, 2 or 4) for every device of this
/// process; 0 restores the default (1). For benchmarks and tests.
pub fn set_ksplit_override(k: u32) {
    KSPLIT_OVERRIDE.store(k, Ordering::Relaxed);
}

/// The tiled q8_1 layout's switch (on unless `REDLINE_Q8_1_TILED=0`; [`set_q8_1_tiled`]
/// overrides).
static Q8_1_TILED: crate::switch::Switch = crate::switch::Switch::new("REDLINE_Q8_1_TILED");

/// Forces the tiled q8_1 layout on or off for every device of this process (`None`: back to
/// `REDLINE_Q8_1_TILED`). For tests and benchmarks; set it between steps, not between a
/// product's quantize and the product.
pub fn set_q8_1_tiled(on: Option<bool>) {
    Q8_1_TILED.set(on);
}

/// Whether the tiled q8_1 layout is switched on ([`set_q8_1_tiled`], else `REDLINE_Q8_1_TILED`,
/// on by default: an H100 measured the 27B's verify passes of 2 rows 0.4 ms faster, one-row
/// decode unchanged; BENCHMARKS.md session 18).
pub fn q8_1_tiled_enabled() -> bool {
    Q8_1_TILED.on()
}

/// Whether the q8_1 copy of x of `n_tokens` x `cols` is stored tiled (kernels/common.cuh
/// `q8_1_at`: in every 512 values the 16-byte pieces transposed, so the dp4a matvec's x loads
/// read one cache line per quarter warp instead of four). Only for 1-2 tokens, which only the
/// dp4a matvec reads ([`crate::mmv::dispatch`] and [`crate::mmq::dispatch`] leave them to it
/// while the switch is on), and rows of a multiple of 512 values.
pub fn q8_1_tiled(n_tokens: usize, cols: usize) -> bool {
    n_tokens <= 2 && cols.is_multiple_of(512) && q8_1_tiled_enabled()
}

/// Rows per warp of a block-format matvec of `n_rows` x `n_cols` for `n` tokens (n <= 8,
/// a power of two): one warp reads R rows at once and shares its x registers between them
/// (kernels/matvec_quant.cu), so a larger R reads x from L1 fewer times and has more bytes in
/// flight per warp, but takes more registers (fewer warps per SM), fewer warps for the grid,
/// and with 4 rows at n >= 4 decodes each row more than once (x of only 2 tokens fits in
/// registers beside 4 rows).
/// The rule is the H200 sweep's winner per case (BENCHMARKS.md, matvec v3), within ~5 %.
pub fn rows_per_warp(ty: GgmlType, n_rows: usize, n_cols: usize, n: usize) -> u32 {
    let forced = ROWS_PER_WARP_OVERRIDE.load(Ordering::Relaxed);
    if forced == 4 || forced == 2 {
        return forced;
    }
    use GgmlType::*;
    // formats whose decode is a few shifts and masks (no table lookups, no split scales)
    let light = matches!(ty, Q4K | Q4_0 | Q4_1 | Q5K | Q5_0 | Q5_1);
    let tall = n_rows >= 12288;
    let head = n_rows >= 100_000;
    // ~6144 rows: 2 rows per warp spill into a second wave of blocks, 4 do not
    let one_wave_at_4 = (5500..8000).contains(&n_rows);
    let four = match n {
        // few rows (k/v projections): keep the warps
        _ if n_rows < 4096 => false,
        1 => match ty {
            // the most bytes per row: x reuse pays everywhere
            Q5K => true,
            Q8_0 => n_rows < 12000 || n_cols >= 16384,
            Q6K => head || n_cols >= 16384,
            _ if light => tall || one_wave_at_4,
            _ => head || one_wave_at_4,
        },
        2 => ty != Q8_0,
        4 => light,
        _ => tall && matches!(ty, Q4K | Q4_0 | Q8_0),
    };
    if four {
        4
    } else {
        2
    }
}

/// Warps that split the column groups of one row set (1, 2 or 4; a benchmark knob, 1 by
/// default): splitting shortens each warp's chain of dependent load rounds, but on the H200
/// sweep it lost 5-40 % almost everywhere (the per-block reduction and idle warps cost more
/// than the shorter chains save; BENCHMARKS.md, matvec v3).
pub fn ksplit() -> u32 {
    let forced = KSPLIT_OVERRIDE.load(Ordering::Relaxed);
    if forced == 2 || forced == 4 {
        forced
    } else {
        1
    }
}

/// Whether the two-token Q4_K / Q6_K segment products stage x in shared memory (the
/// `mvm_*_n2_r*_xs` kernels; on unless `REDLINE_MV_XSMEM=0`, read once). The same arithmetic
/// on the same values: the same bits. H100 (session 19): 27B two streams 188 -> 192 tok/s,
/// verify k = 2 10.56 -> 10.45 ms; at one token the staging lost (32B 104.0 -> 102.8), so
/// one-token products keep reading x through L1.
fn x_in_shared() -> bool {
    X_IN_SHARED.on()
}

/// Whether two-token products whose x does not fit the default 48 KB beside the kernel's
/// staging buffers (the 17408- and 27648-wide down projections) opt in to more shared memory
/// for it where that keeps the blocks per SM (`REDLINE_MV_XSMEM_WIDE=1`; an experiment, off).
fn x_in_shared_wide() -> bool {
    static XS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *XS.get_or_init(|| std::env::var("REDLINE_MV_XSMEM_WIDE").is_ok_and(|v| v == "1"))
}

static X_IN_SHARED: crate::switch::Switch = crate::switch::Switch::new("REDLINE_MV_XSMEM");

/// Forces whether the two-token Q4_K / Q6_K segment products stage x in shared memory
/// (`None`: back to `REDLINE_MV_XSMEM`). For tests and benchmarks.
pub fn set_x_in_shared(on: Option<bool>) {
    X_IN_SHARED.set(on);
}

/// 0: `REDLINE_MV_DIRECT` decides; 1: off; 2: on.
static DIRECT_OVERRIDE: AtomicU32 = AtomicU32::new(0);
/// Forced rows per warp of the direct kernels (1, 2 or 4); 0: `REDLINE_MV_DIRECT_R`, else
/// the per-shape rule.
static DIRECT_ROWS_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Whether one- and two-token Q4_K, IQ4_XS and Q4_0 segment products run on the direct kernels
/// (kernels/matvec_direct.cu `mvd_*`: the weights loaded straight into registers, ~30-40 % fewer
/// instructions a weight byte than the staged kernels; `_t` for rows not a multiple of 1024
/// values). On unless `REDLINE_MV_DIRECT=0` ([`set_direct_kernels`] overrides): on an H100 the
/// 32B Q4_K_M one row +4.8 %, IQ4_XS +11 %, the 27B +1.5 % (BENCHMARKS.md, session 21).
pub fn direct_kernels() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match DIRECT_OVERRIDE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => *ENV.get_or_init(|| std::env::var("REDLINE_MV_DIRECT").map_or(true, |v| v != "0")),
    }
}

/// Whether a product of `n_tokens` tokens over `cols` columns of `ty` runs on the direct
/// kernels ([`direct_kernels`]).
pub(crate) fn direct_applies(ty: GgmlType, cols: usize, n_tokens: usize, rows: usize) -> bool {
    let tokens_ok = match n_tokens {
        1 | 2 => true,
        3 | 4 => match direct_four() {
            DirectFour::Off => false,
            // (IQ4_XS's 3-4-token direct kernels have not been measured on a card; at three
            // tokens the three-token kernels beat the tensor-core ones at every Q4_K size)
            DirectFour::Short => {
                // (Q6_K: `direct_q6k` decides below, 3-4 tokens only under `All`)
                (ty == GgmlType::Q4K
                    && (rows < DIRECT4_MAX_ROWS || (n_tokens == 3 && direct_three())))
                    || ty == GgmlType::Q6K
            }
            DirectFour::All => true,
        },
        _ => false,
    };
    let format_ok = match ty {
        GgmlType::Q4K | GgmlType::IQ4XS => true,
        GgmlType::Q4_0 => direct_q4_0(),
        // (whole 1024-value iterations only: `mvd_q6_k_*` have no `_t` kernels)
        GgmlType::Q6K => cols.is_multiple_of(1024) && direct_q6k().takes(n_tokens, rows),
        _ => false,
    };
    tokens_ok && format_ok && cols.is_multiple_of(256) && direct_kernels()
}

/// Which Q6_K products take the direct kernels (`mvd_q6_k_*`, session 33: the weights straight
/// into registers from aligned word loads, as Q4_0's; the staged `mvm_q6_k_*` hold 96-168
/// registers and shared-memory staging for the same work).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum DirectQ6K {
    Off,
    /// One-token launches of fewer than [`DIRECT_Q6K_MAX_ROWS`] rows: the per-layer products;
    /// the output heads (152064-248320 rows) keep the staged kernel, which streams them at
    /// ~97 % of the card's read bandwidth already.
    OneToken,
    /// One-token launches of any size.
    OneTokenHeads,
    /// One- and two-token launches of fewer than [`DIRECT_Q6K_MAX_ROWS`] rows (two-token ones
    /// otherwise go to the q8_1 tensor-core kernels, crate::mmv).
    TwoTokens,
    /// Every launch the direct kernels can take (1-4 tokens, any size; an experiment).
    All,
}

impl DirectQ6K {
    /// Every variant, in declaration order (the override's code is the index plus one).
    const ALL: [DirectQ6K; 5] = [
        DirectQ6K::Off,
        DirectQ6K::OneToken,
        DirectQ6K::OneTokenHeads,
        DirectQ6K::TwoTokens,
        DirectQ6K::All,
    ];

    fn takes(self, n_tokens: usize, rows: usize) -> bool {
        let short = rows < DIRECT_Q6K_MAX_ROWS;
        match self {
            DirectQ6K::Off => false,
            DirectQ6K::OneToken => n_tokens == 1 && short,
            DirectQ6K::OneTokenHeads => n_tokens == 1,
            DirectQ6K::TwoTokens => n_tokens <= 2 && short,
            DirectQ6K::All => true,
        }
    }
}

/// Rows from which a Q6_K launch is an output head and stays on the staged kernels under
/// [`DirectQ6K::OneToken`].
pub const DIRECT_Q6K_MAX_ROWS: usize = 100_000;

/// 0: `REDLINE_MV_DIRECT_Q6K` decides; else the [`DirectQ6K`] variant plus one.
static DIRECT_Q6K_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Which Q6_K products take the direct kernels: `REDLINE_MV_DIRECT_Q6K=1` one-token launches under
/// [`DIRECT_Q6K_MAX_ROWS`] rows, `=heads` one-token launches of any size, `=2` one and two tokens,
/// `=all` every launch they can take; unset (or `0`), none (read once; [`set_direct_q6k`]
/// overrides). Why off: on an H100 (session 33) they gave the staged kernels' results (the matvec
/// suite against the CPU reference, 1-4 tokens) but lost one row of the 32B 4.3 % at 2 rows a
/// warp and 3.2 % at one (its 5120 x 27648 down projections), and moved the 27B within noise
/// (-0.6 / +0.4 %).
pub fn direct_q6k() -> DirectQ6K {
    static ENV: std::sync::OnceLock<DirectQ6K> = std::sync::OnceLock::new();
    match DIRECT_Q6K_OVERRIDE.load(Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| match std::env::var("REDLINE_MV_DIRECT_Q6K").as_deref() {
            Ok("1") => DirectQ6K::OneToken,
            Ok("heads") => DirectQ6K::OneTokenHeads,
            Ok("2") => DirectQ6K::TwoTokens,
            Ok("all") => DirectQ6K::All,
            _ => DirectQ6K::Off,
        }),
        c => DirectQ6K::ALL[(c as usize - 1).min(DirectQ6K::ALL.len() - 1)],
    }
}

/// Forces which Q6_K products take the direct kernels (`None`: back to `REDLINE_MV_DIRECT_Q6K`).
/// For tests and benchmarks.
pub fn set_direct_q6k(v: Option<DirectQ6K>) {
    DIRECT_Q6K_OVERRIDE.store(v.map_or(0, |v| v as u32 + 1), Ordering::Relaxed);
}

/// Whether Q4_0 products take the direct kernels too (`mvd_q4_0_*`, session 28): on unless
/// `REDLINE_MV_DIRECT_Q4_0=0` (read once; the staged kernels against them on one card).
fn direct_q4_0() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENV.get_or_init(|| std::env::var("REDLINE_MV_DIRECT_Q4_0").map_or(true, |v| v != "0"))
}

/// Which 3-4-token products run on the direct kernels (`mvd_*_n4_r{1,2}`) instead of the
/// q8_1 tensor-core ones (crate::mmv).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DirectFour {
    Off,
    /// Q4_K launches of fewer than [`DIRECT4_MAX_ROWS`] rows (the default).
    Short,
    All,
}

/// Rows below which a 3-4-token launch takes the direct kernels by default. H100 (session 27,
/// µs at 3 tokens, direct 2 rows a warp / tensor cores): 5120 x 17408 30.0 / 36.1, 5120 x 6144
/// 14.3 / 15.2, 16384 x 5120 29.7 / 29.7, 2 x 17408 x 5120 57.3 / 53.5. Three-token Q4_K
/// launches of any size take the three-token kernels ([`direct_three`], session 30). Session
/// 32 (H100) moved the line from 12288 to 24576 rows, which puts the 27B's 4-token
/// in-projections (16384 x 5120) on the direct kernel: alone 30.6 µs against the tensor cores'
/// 30.5, and the 27B's verify pass of 4 rows 1.47 / 1.47 / 1.47x a step with it (three rounds),
/// 1.47-1.54x before in the same session's other window. Gate/up (2 x 17408 x 5120) stays on the
/// tensor cores: 54.6 µs against 58.4 direct.
pub const DIRECT4_MAX_ROWS: usize = 24576;

/// Rows from which a three-token Q4_K launch takes the x-group kernels (G = 2) by default
/// ([`direct_xgroup`]). H100, session 32 (µs at 3 / 4 tokens, 2 rows a warp, all-tokens kernel
/// / x-group kernel): 5120 x 17408 27.0 / 30.8 and 30.3 / 37.5, 5120 x 6144 12.9 / 14.0 and
/// 14.5 / 16.7, 16384 x 5120 27.5 / 25.0 and 30.6 / 28.5, 2 x 17408 x 5120 51.2 / 50.1 and
/// 58.4 / 56.3. At 5120 rows a launch is 640 blocks of 8 rows; at the x-group kernels' 4 blocks
/// an SM (128 registers) that is 1.2 waves on 132 SMs, and ncu shows 20 % occupancy achieved.
/// Four-token launches stay on the all-tokens kernels: with the in-projections on `n4_r2_g2`
/// the 27B's 4-row verify pass took 11.99 ms against 11.85 (means of three rounds), though the
/// kernel alone is the faster.
pub const XGROUP_MIN_ROWS: usize = 12288;

/// 0: `REDLINE_MV_DIRECT4` decides; 1: off; 2: short launches; 3: all.
static DIRECT4_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Which 3-4-token products run on the direct kernels: `REDLINE_MV_DIRECT4=0` none, `=1`
/// all (IQ4_XS too), else Q4_K launches of fewer than [`DIRECT4_MAX_ROWS`] rows
/// ([`set_direct_four`] overrides).
pub fn direct_four() -> DirectFour {
    static ENV: std::sync::OnceLock<DirectFour> = std::sync::OnceLock::new();
    match DIRECT4_OVERRIDE.load(Ordering::Relaxed) {
        1 => DirectFour::Off,
        2 => DirectFour::Short,
        3 => DirectFour::All,
        _ => *ENV.get_or_init(|| match std::env::var("REDLINE_MV_DIRECT4").as_deref() {
            Ok("0") => DirectFour::Off,
            Ok("1") => DirectFour::All,
            _ => DirectFour::Short,
        }),
    }
}

/// Forces which 3-4-token products take the direct kernels (`None`: back to
/// `REDLINE_MV_DIRECT4`). For tests and benchmarks.
pub fn set_direct_four(v: Option<DirectFour>) {
    let code = match v {
        None => 0,
        Some(DirectFour::Off) => 1,
        Some(DirectFour::Short) => 2,
        Some(DirectFour::All) => 3,
    };
    DIRECT4_OVERRIDE.store(code, Ordering::Relaxed);
}

/// Forces the direct Q4_K / IQ4_XS kernels on or off (`None`: back to `REDLINE_MV_DIRECT`), and
/// their rows per warp (1, 2 or 4; 0: `REDLINE_MV_DIRECT_R` or the per-shape rule). For tests
/// and benchmarks.
pub fn set_direct_kernels(on: Option<bool>, rows_per_warp: u32) {
    DIRECT_OVERRIDE.store(on.map_or(0, |b| 1 + b as u32), Ordering::Relaxed);
    DIRECT_ROWS_OVERRIDE.store(rows_per_warp, Ordering::Relaxed);
}

/// Rows per warp of a direct product: 2 (93 registers for Q4_K, 80 for IQ4_XS: 5-6 blocks per
/// SM). On an H100 the 32B one row took 110.33 tok/s with 2 everywhere, 109.60 with 4 for the
/// tall products (gate/up, 128 registers), 106.85 with 4 everywhere (session 21).
/// With more than two tokens only 1 and 2 are compiled; 0 where nothing forces a choice (then
/// [`CudaDevice::direct_rows`] decides).
fn direct_rows_forced(n_tokens: usize) -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    static ENV2: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let mut forced = match DIRECT_ROWS_OVERRIDE.load(Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| env_u32("REDLINE_MV_DIRECT_R")),
        r => r,
    };
    if forced == 0 && n_tokens == 2 {
        forced = *ENV2.get_or_init(|| env_u32("REDLINE_MV_DIRECT_R2"));
    }
    if forced == 0 && n_tokens > 2 {
        // (the x-group kernels at one row a warp: 72-94 registers, [`direct_xgroup`])
        static ENV34: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        forced = *ENV34.get_or_init(|| env_u32("REDLINE_MV_DIRECT_R34"));
    }
    match forced {
        4 if n_tokens > 2 => 2,
        1 | 2 | 4 => forced,
        _ => 0,
    }
}

/// A number from the environment, 0 when unset or unreadable.
fn env_u32(name: &str) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Whether three-token direct products take the three-token kernels (`mvd_*_n3_r*`) instead of
/// the four-token ones with the third token's x read twice, and three-token Q4_K launches of
/// every size take the direct kernels (under [`DirectFour::Short`]): on unless
/// `REDLINE_MV_DIRECT_N3=0` (read once). H100, session 30 (µs at 3 tokens, 2 rows a warp,
/// three-token kernel / four-token kernel / the q8_1 tensor-core kernel): 5120 x 17408 27.1 /
/// 30.2, 5120 x 6144 12.9 / 14.4, 16384 x 5120 27.6 / 30.0 / 29.8, 2 x 17408 x 5120 51.4 / 57.6
/// / 53.6; the 27B's verify pass of 3 rows 1.41-1.44x a step (mean 1.43, nine runs) -> 1.37-1.44x
/// (mean 1.40, eight runs).
fn direct_three() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match DIRECT3_OVERRIDE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => *ON.get_or_init(|| std::env::var("REDLINE_MV_DIRECT_N3").as_deref() != Ok("0")),
    }
}

/// 0: `REDLINE_MV_DIRECT_N3` decides; 1 off, 2 on.
static DIRECT3_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces the three-token direct kernels on or off (`None`: back to `REDLINE_MV_DIRECT_N3`).
/// For tests and benchmarks.
pub fn set_direct_three(on: Option<bool>) {
    DIRECT3_OVERRIDE.store(on.map_or(0, |o| if o { 2 } else { 1 }), Ordering::Relaxed);
}

/// Tokens whose x a direct Q4_K launch of `n_tokens` (3 or 4) tokens and `rows` rows holds at
/// once: 0, all of them for two iterations (`mvd_q4_k_n<NT>_r<R>`); 1 or 2, a group at a time,
/// the next group in flight (`mvd_q4_k_n<NT>_r<R>_g<G>`, session 31: 128 registers at 2 rows a
/// warp instead of 167, 4 blocks an SM instead of 3; 72-94 at one row; bit-identical results).
/// By default 2 for three tokens from [`XGROUP_MIN_ROWS`] rows, else 0;
/// `REDLINE_MV_DIRECT_XG=0|1|2` sets it for every launch (read once; [`set_direct_xgroup`]
/// overrides). The 27B's verify passes (H100, session 32, three rounds each, x a step): every
/// launch at G = 2 1.35-1.36 at 3 rows (all-tokens kernels 1.37-1.41), 1.55-1.60 at 4 rows
/// (1.47-1.54); G = 1 1.50-1.67 / 1.56-1.63; by size 10.86 ms a 3-row pass against 10.97.
pub fn direct_xgroup(n_tokens: usize, rows: usize) -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let code = match DIRECT_XG_OVERRIDE.load(Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| match std::env::var("REDLINE_MV_DIRECT_XG").as_deref() {
            Ok("0") => 1,
            Ok("1") => 2,
            Ok("2") => 3,
            _ => 0,
        }),
        c => c,
    };
    match code {
        0 if n_tokens == 3 && rows >= XGROUP_MIN_ROWS => 2,
        0 => 0,
        c => c - 1,
    }
}

/// 0: `REDLINE_MV_DIRECT_XG` decides (unset: by size); else the group plus one.
static DIRECT_XG_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Whether one-token Q4_K direct products that fit the card's resident blocks in one wave take
/// the staged kernels (`mvd_q4_k_n1_r<R>_s`: each warp copies its rows into shared memory
/// before the PDL wait; kernels/matvec_direct.cu, mvd_rows' ST; sm_90, where PDL is on): on
/// unless `REDLINE_MV_STAGE=0`, or the test override. Why (H100, session 35): with two kernels
/// of lookahead (`REDLINE_PDL_EARLY`'s default) the out / o projections' copies land while the
/// DeltaNet or attention chain in front of them runs: 27B +1.2 %, 32B +0.6 % one row.
fn stage_enabled() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match STAGE_OVERRIDE.load(Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| std::env::var("REDLINE_MV_STAGE").map_or(true, |v| v != "0")),
        c => c == 2,
    }
}

/// The most shared memory a staged block asks for (opted in past 48 KB).
const STAGE_MAX_BYTES: u32 = 96 * 1024;

/// Whether one-token direct products of more blocks than the card holds at once take the queue
/// kernels (`mvd_<fmt>_n1_r<R>_q`: a grid of the resident blocks, each warp's first group of rows
/// its own and every later one a ticket from one of the counters of the launch's queue slot
/// ([`CudaDevice::queue_slot`]); kernels/matvec_direct.cu `mvd_groups`): `REDLINE_MV_QUEUE=1`,
/// or the test override. Why: session 36's trace showed a multi-wave product's waves starting
/// and ending together, the weight stream stalling at each ramp; its persistent kernels (a fixed
/// list of groups a warp) lost 5-8 % to the slowest SM's share, where a queue hands the next
/// group to whichever warp is free. Measured (H100, session 39, two rounds): with 16 counters
/// 27B −2.2 %, 32B −3.2 % against one block a group (one counter: 27B −10 to −12.5 %). Stays
/// off.
fn queue_mode() -> u32 {
    static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    match QUEUE_OVERRIDE.load(Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| {
            std::env::var("REDLINE_MV_QUEUE").map_or(0, |v| u32::from(v.trim() == "1"))
        }),
        c => c - 1,
    }
}

/// 0: `REDLINE_MV_QUEUE` decides; 1 off; 2 on (multi-wave launches); 3 forced on every one-token
/// launch it can take, with a third of the blocks as the grid (tests).
static QUEUE_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces the queue one-token kernels (`Some(true)`: on every launch they can take, with a third
/// of the row blocks as the grid, for tests; `Some(false)`: off; `None`: back to
/// `REDLINE_MV_QUEUE`).
pub fn set_queue(on: Option<bool>) {
    QUEUE_OVERRIDE.store(on.map_or(0, |on| if on { 3 } else { 1 }), Ordering::Relaxed);
}

/// Launches of queue kernels whose counters the device may hold at once ([`CudaDevice::queue_slot`]
/// hands them out in turn; a slot is back to zero when its launch ends, so a slot reused by a
/// later launch, even one in the same graph, starts from zero).
pub(crate) const QUEUE_SLOTS: usize = 256;

/// u32 a queue slot holds: kernels/matvec_common.cuh `MVQ_LINES` (32) lines of a ticket counter
/// and its warps-ended counter, and a line counting the lines done; 128 bytes a line.
pub(crate) const QUEUE_SLOT_WORDS: usize = 33 * 32;

/// How many of a slot's counters hand out a queue launch's tickets (load_mode bits 16-21;
/// kernels/matvec_direct.cu `mvd_groups`): `REDLINE_MV_QUEUE_K` (1-32), else 16. Why several:
/// one counter, 17 408 tickets a 27B gate / up launch on one address, lost 12.5 % (session 39).
fn queue_counters() -> i32 {
    static K: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        std::env::var("REDLINE_MV_QUEUE_K")
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok())
            .map_or(16, |k| k.clamp(1, 32))
    })
}

/// 0: `REDLINE_MV_STAGE` decides; 1 off; 2 on.
static STAGE_OVERRIDE: AtomicU32 = AtomicU32::new(0);

/// Forces the staged one-token Q4_K kernels on or off wherever they fit (`None`: back to
/// `REDLINE_MV_STAGE`). For tests and benchmarks.
pub fn set_stage(on: Option<bool>) {
    STAGE_OVERRIDE.store(on.map_or(0, |on| if on { 2 } else { 1 }), Ordering::Relaxed);
}

/// Forces the x group of the 3-4-token direct Q4_K kernels at every size (`Some(0)`, `Some(1)`,
/// `Some(2)`; `None`: back to `REDLINE_MV_DIRECT_XG` or the size rule). For tests and
/// benchmarks.
pub fn set_direct_xgroup(g: Option<u32>) {
    DIRECT_XG_OVERRIDE.store(g.map_or(0, |g| g.min(2) + 1), Ordering::Relaxed);
}

/// The dp4a matvec kernels' load_mode bit for x in the tiled q8_1 layout.
fn tiled_bit(xq: &MatvecScratch) -> i32 {
    if xq.tiled {
        256
    } else {
        0
    }
}

/// Kernel name stem of a weight type, and whether x is quantized to q8_1 for it.
fn kernel_stem(ty: GgmlType) -> Option<(&'static str, bool)> {
    use GgmlType::*;
    Some(match ty {
        F32 => ("f32", false),
        F16 => ("f16", false),
        BF16 => ("bf16", false),
        Q4_0 => ("q4_0", true),
        Q4_1 => ("q4_1", true),
        Q5_0 => ("q5_0", true),
        Q5_1 => ("q5_1", true),
        Q8_0 => ("q8_0", true),
        IQ4NL => ("iq4_nl", true),
        IQ4XS => ("iq4_xs", true),
        Q2K => ("q2_k", true),
        Q3K => ("q3_k", true),
        Q4K => ("q4_k", true),
        Q5K => ("q5_k", true),
        Q6K => ("q6_k", true),
        _ => return None,
    })
}

/// Weight types `matvec` supports.
pub fn supports(ty: GgmlType) -> bool {
    kernel_stem(ty).is_some()
}

/// Whether `matvec` quantizes x to q8_1 for this weight type (all block formats).
pub fn quantizes_activations(ty: GgmlType) -> bool {
    kernel_stem(ty).is_some_and(|(_, q)| q)
}

/// A weight matrix in device memory, byte-for-byte as stored in GGUF.
/// Shape [n_rows, n_cols]: row r holds output r's weights over n_cols inputs.
pub struct DeviceMatrix {
    pub ty: GgmlType,
    pub n_rows: usize,
    pub n_cols: usize,
    row_bytes: usize,
    pub(crate) data: CudaSlice<u8>,
}

impl DeviceMatrix {
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Device bytes of the weights proper (what one matvec must read).
    pub fn weight_bytes(&self) -> usize {
        self.row_bytes * self.n_rows
    }
}

/// Device scratch for x quantized to q8_1: xq int8 [n, cols] and (d, d*sum) per 32.
pub struct MatvecScratch {
    xq: CudaSlice<i8>,
    xds: CudaSlice<f32>,
    /// Shape of the x last quantized into it.
    cols: usize,
    n_tokens: usize,
    /// Whether the q8_1 copy is in the tiled layout ([`q8_1_tiled`]).
    tiled: bool,
    /// The q8_K copy of the same x for the mmv2 kernels (crate::mmv), when made.
    pub(crate) q8k: crate::mmv::Q8kScratch,
}

impl MatvecScratch {
    /// The q8_1 buffers (xq, xds) and the shape (tokens, cols) of the x they hold.
    pub(crate) fn quantized(&self) -> (&CudaSlice<i8>, &CudaSlice<f32>, usize, usize) {
        (&self.xq, &self.xds, self.n_tokens, self.cols)
    }

    /// Whether the x it holds is in the tiled q8_1 layout (only the dp4a matvec reads that).
    pub(crate) fn tiled(&self) -> bool {
        self.tiled
    }

    /// The q8_1 buffers (xq int8 `[n, cols]`, xds `(d, d * sum)` per 32) for a kernel that
    /// writes x's quantization itself (norm / SwiGLU producers), after which the scratch
    /// holds x of `n_tokens` x `cols`, and whether the kernel must write the tiled layout
    /// ([`q8_1_tiled`]; the kernels take it as the low bit of the xds address, see
    /// [`CudaDevice::q8_1_xds_address`]). Errors if they are too small.
    pub(crate) fn buffers_for(
        &mut self,
        n_tokens: usize,
        cols: usize,
    ) -> Result<(&mut CudaSlice<i8>, &mut CudaSlice<f32>, bool)> {
        if !cols.is_multiple_of(32)
            || self.xq.len() < n_tokens * cols
            || self.xds.len() < n_tokens * cols / 16
        {
            return Err(CudaError::Shape(format!(
                "matvec scratch for {n_tokens}x{cols}"
            )));
        }
        self.cols = cols;
        self.n_tokens = n_tokens;
        self.tiled = q8_1_tiled(n_tokens, cols);
        self.q8k.forget();
        Ok((&mut self.xq, &mut self.xds, self.tiled))
    }
}

/// Most matrices one [`CudaDevice::matvec_segments`] launch takes (MVM_MAX_SEGS).
pub const MAX_SEGMENTS: usize = 4;

/// One matrix of a [`CudaDevice::matvec_segments`] launch: `y (+)= W x (+ bias)`.
pub struct Segment<'a> {
    pub w: &'a DeviceMatrix,
    /// Output, `w.n_rows` values.
    pub y: u64,
    /// f32 bias of `w.n_rows` values (device address), or none.
    pub bias: Option<u64>,
    /// `y += W x` instead of `y = W x`.
    pub accumulate: bool,
}

/// Kernel parameter of the mvm_ kernels (struct MvSeg / MvSegs in kernels/matvec_quant.cu,
/// and the same structs in kernels/mmv.cu).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct MvSeg {
    w: u64,
    y: u64,
    bias: u64,
    nrows: i32,
    block0: i32,
    accumulate: i32,
    pad: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct MvSegs {
    seg: [MvSeg; MAX_SEGMENTS],
    row_bytes: i64,
    n_segs: i32,
    ncols: i32,
}

// SAFETY: plain repr(C) data (addresses and integers) with the layout of the kernel's struct.
unsafe impl cudarc::driver::DeviceRepr for MvSegs {}

impl CudaDevice {
    /// The device address of a buffer (for [`Segment`] outputs and biases).
    pub fn device_address<T>(&self, s: &CudaSlice<T>) -> u64 {
        let (ptr, _sync) = s.device_ptr(self.stream());
        ptr
    }

    /// The address of a q8_1 scratch's xds as the q8_1 writers take it: its low bit set when
    /// they must write the tiled layout (kernels/common.cuh `q8_1_tagged`; f32 addresses are
    /// even).
    pub(crate) fn q8_1_xds_address(&self, xds: &CudaSlice<f32>, tiled: bool) -> u64 {
        self.device_address(xds) | tiled as u64
    }

    /// Uploads `bytes` (GGUF layout of a [n_rows, n_cols] tensor of type `ty`).
    pub fn upload_matrix(
        &self,
        ty: GgmlType,
        n_rows: usize,
        n_cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix> {
        if !supports(ty) {
            return Err(CudaError::UnsupportedType(ty.name()));
        }
        if !n_cols.is_multiple_of(ty.block_size()) {
            return Err(CudaError::Shape(format!(
                "{} columns is not a multiple of the {} block ({})",
                n_cols,
                ty.name(),
                ty.block_size()
            )));
        }
        let row_bytes = n_cols / ty.block_size() * ty.type_size();
        let total = row_bytes
            .checked_mul(n_rows)
            .ok_or_else(|| CudaError::Shape("matrix size overflows".into()))?;
        if bytes.len() != total {
            return Err(CudaError::Shape(format!(
                "{}x{} {} needs {} bytes, got {}",
                n_rows,
                n_cols,
                ty.name(),
                total,
                bytes.len()
            )));
        }
        if n_rows > i32::MAX as usize || n_cols > i32::MAX as usize {
            return Err(CudaError::Shape("dimension exceeds i32".into()));
        }
        let mut data = self.stream().alloc_zeros::<u8>(total + PAD_BYTES)?;
        self.stream()
            .memcpy_htod(bytes, &mut data.slice_mut(0..total))?;
        Ok(DeviceMatrix {
            ty,
            n_rows,
            n_cols,
            row_bytes,
            data,
        })
    }

    /// Scratch for x of up to `max_tokens` rows of `max_cols` (multiple of 32) columns.
    pub fn matvec_scratch(&self, max_tokens: usize, max_cols: usize) -> Result<MatvecScratch> {
        let n = max_tokens * max_cols.div_ceil(32) * 32;
        Ok(MatvecScratch {
            xq: self.stream().alloc_zeros::<i8>(n)?,
            xds: self.stream().alloc_zeros::<f32>(n / 16)?,
            cols: 0,
            n_tokens: 0,
            tiled: false,
            q8k: crate::mmv::Q8kScratch::new(self, n)?,
        })
    }

    /// y = W x for `n_tokens` tokens: x [n_tokens, n_cols] f32, y [n_tokens, n_rows] f32.
    /// For block formats x is first quantized to q8_1 into `scratch` (which must hold
    /// n_tokens rows). Weights are read once per group of up to 8 tokens. Asynchronous.
    pub fn matvec(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
        scratch: &mut MatvecScratch,
    ) -> Result<()> {
        let (_, quantized) = kernel_stem(w.ty).ok_or(CudaError::UnsupportedType(w.ty.name()))?;
        if quantized {
            self.quantize_for_matvec(x, n_tokens, w.n_cols, scratch)?;
            self.matvec_prequantized(w, scratch, y)
        } else {
            self.matvec_float(w, x, n_tokens, y)
        }
    }

    /// Quantizes x [n_tokens, cols] f32 to q8_1 into `scratch`, once for every block-format
    /// matvec that reads the same x (Q/K/V, gate/up).
    pub fn quantize_for_matvec(
        &self,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        cols: usize,
        scratch: &mut MatvecScratch,
    ) -> Result<()> {
        if !cols.is_multiple_of(32) || x.len() < n_tokens * cols {
            return Err(CudaError::Shape(format!(
                "x of {} for {n_tokens}x{cols} (cols % 32 == 0)",
                x.len()
            )));
        }
        if scratch.xq.len() < n_tokens * cols || scratch.xds.len() < n_tokens * cols / 16 {
            return Err(CudaError::Shape(format!(
                "matvec scratch too small for {n_tokens}x{cols}"
            )));
        }
        scratch.q8k.forget();
        if n_tokens == 0 {
            return Ok(());
        }
        let units = (cols / 32) as u32;
        let cfg = LaunchConfig {
            grid_dim: (units.div_ceil(8), n_tokens as u32, 1),
            block_dim: (32, 8, 1),
            shared_mem_bytes: 0,
        };
        let mut cols_i = cols as i32;
        let tiled = q8_1_tiled(n_tokens, cols);
        if crate::pdl::enabled(self.arch()) {
            let f = self.function(Program::MatvecQuant, "quantize_q8_1_pdl")?;
            let (mut px, mut pq, mut pd) = (
                self.device_address(x),
                self.device_address(&scratch.xq),
                self.q8_1_xds_address(&scratch.xds, tiled),
            );
            let mut params = [
                crate::pdl::arg(&mut px),
                crate::pdl::arg(&mut pq),
                crate::pdl::arg(&mut pd),
                crate::pdl::arg(&mut cols_i),
            ];
            // SAFETY: matches quantize_q8_1_pdl(x, xq, xds, ncols) (xds tagged with the
            // layout), which waits for the previous kernel before reading x; sizes checked above.
            unsafe { crate::pdl::launch(self.stream(), &f, cfg, &mut params, true) }?;
            scratch.cols = cols;
            scratch.n_tokens = n_tokens;
            scratch.tiled = tiled;
            return Ok(());
        }
        let f = self.function(Program::MatvecQuant, "quantize_q8_1")?;
        let pd = self.q8_1_xds_address(&scratch.xds, tiled);
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(&mut scratch.xq).arg(&pd).arg(&cols_i);
        // SAFETY: matches quantize_q8_1(x, xq, xds, ncols), xds as its address tagged with
        // the layout (same stream as every other use of the scratch); sizes checked above.
        unsafe { b.launch(cfg) }?;
        scratch.cols = cols;
        scratch.n_tokens = n_tokens;
        scratch.tiled = tiled;
        Ok(())
    }

    /// y = W x with x already quantized by `quantize_for_matvec` (block formats only).
    pub fn matvec_prequantized(
        &self,
        w: &DeviceMatrix,
        xq: &MatvecScratch,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (stem, quantized) = kernel_stem(w.ty).ok_or(CudaError::UnsupportedType(w.ty.name()))?;
        let (rows, cols, n_tokens) = (w.n_rows, w.n_cols, xq.n_tokens);
        if !quantized || xq.cols != cols || y.len() < n_tokens * rows {
            return Err(CudaError::Shape(format!(
                "{} {rows}x{cols} with x quantized as {n_tokens}x{} into y of {}",
                w.ty.name(),
                xq.cols,
                y.len()
            )));
        }
        if direct_applies(w.ty, cols, n_tokens, rows) {
            // the kernel the fused path's segments take, so both paths give the same bits
            let seg = Segment {
                w,
                y: self.device_address(y),
                bias: None,
                accumulate: false,
            };
            return self.matvec_segments(&[seg], xq);
        }
        let (rows_i, cols_i, row_bytes) = (rows as i32, cols as i32, w.row_bytes as i64);
        let load_mode = self.matvec_load_mode() | tiled_bit(xq);
        let mut t0 = 0;
        while t0 < n_tokens {
            let n = (n_tokens - t0).min(MAX_TOKENS_PER_LAUNCH);
            let n_i = n as i32;
            let nt = n.next_power_of_two();
            let r = rows_per_warp(w.ty, rows, cols, nt);
            let ks = ksplit();
            let ks_i = ks as i32;
            let f = self.function(Program::MatvecQuant, &format!("mv_{stem}_n{nt}_r{r}"))?;
            // WARPS_PER_BLOCK warps per block: WARPS_PER_BLOCK / ks row sets of r rows
            let rows_per_block = r * WARPS_PER_BLOCK / ks;
            let cfg = LaunchConfig {
                grid_dim: ((rows as u32).div_ceil(rows_per_block), 1, 1),
                block_dim: (32, WARPS_PER_BLOCK, 1),
                shared_mem_bytes: 0,
            };
            let xqs = xq.xq.slice(t0 * cols..(t0 + n) * cols);
            let xds = xq.xds.slice(t0 * cols / 16..(t0 + n) * cols / 16);
            let mut ys = y.slice_mut(t0 * rows..(t0 + n) * rows);
            let mut b = self.stream().launch_builder(&f);
            b.arg(&w.data).arg(&xqs).arg(&xds).arg(&mut ys);
            b.arg(&rows_i)
                .arg(&cols_i)
                .arg(&row_bytes)
                .arg(&n_i)
                .arg(&load_mode)
                .arg(&ks_i);
            // SAFETY: argument list matches mv_<fmt>_n<NT>_r<R>(W, xq, xds, y, nrows, ncols,
            // row_bytes, n_tokens, load_mode, ksplit); n <= NT tokens; ksplit divides the
            // block's warps; buffer sizes were checked above.
            unsafe { b.launch(cfg) }?;
            t0 += n;
        }
        Ok(())
    }

    /// The kernel parameter of a segment launch with `rows_per_block` rows per thread block,
    /// and the launch's block count (each segment starts on a block of its own).
    pub(crate) fn segment_params(
        &self,
        segs: &[Segment<'_>],
        rows_per_block: usize,
    ) -> (MvSegs, usize) {
        let first = &segs[0];
        let mut p = MvSegs {
            row_bytes: first.w.row_bytes as i64,
            n_segs: segs.len() as i32,
            ncols: first.w.n_cols as i32,
            ..MvSegs::default()
        };
        let mut blocks = 0usize;
        for (i, s) in segs.iter().enumerate() {
            p.seg[i] = MvSeg {
                w: {
                    let (ptr, _sync) = s.w.data.device_ptr(self.stream());
                    ptr
                },
                y: s.y,
                bias: s.bias.unwrap_or(0),
                nrows: s.w.n_rows as i32,
                block0: blocks as i32,
                accumulate: s.accumulate as i32,
                pad: 0,
            };
            blocks += s.w.n_rows.div_ceil(rows_per_block);
        }
        (p, blocks)
    }

    /// Products of several matrices of one block format and one width that read the same x
    /// (already quantized into `xq`, 1..=[`MAX_TOKENS_PER_LAUNCH`] tokens), in one launch
    /// over their concatenated rows, each with its own output, optional bias and accumulate
    /// flag (kernels/matvec_quant.cu, mvm_*). The caller guarantees every `y` holds
    /// `n_tokens * w.n_rows` f32 (token-major) and every `bias` `w.n_rows` (addresses, as
    /// the kernel takes them).
    pub fn matvec_segments(&self, segs: &[Segment<'_>], xq: &MatvecScratch) -> Result<()> {
        let Some(first) = segs.first() else {
            return Ok(());
        };
        let (ty, cols) = (first.w.ty, first.w.n_cols);
        let (stem, quantized) = kernel_stem(ty).ok_or(CudaError::UnsupportedType(ty.name()))?;
        if !quantized
            || segs.len() > MAX_SEGMENTS
            || !(1..=MAX_TOKENS_PER_LAUNCH).contains(&xq.n_tokens)
            || xq.cols != cols
            || segs.iter().any(|s| s.w.ty != ty || s.w.n_cols != cols)
        {
            return Err(CudaError::Shape(format!(
                "{} segments of {} x {cols} with x quantized as {}x{}",
                segs.len(),
                ty.name(),
                xq.n_tokens,
                xq.cols
            )));
        }
        let total_rows: usize = segs.iter().map(|s| s.w.n_rows).sum();
        let n_tokens = xq.n_tokens;
        let direct = direct_applies(ty, cols, n_tokens, total_rows);
        // (the direct kernels have a three-token variant: no fourth token's dots for nothing)
        let nt = if direct && n_tokens == 3 && direct_three() {
            3
        } else {
            n_tokens.next_power_of_two()
        };
        let r = if direct {
            self.direct_rows(stem, cols, segs, nt)?
        } else {
            rows_per_warp(ty, total_rows, cols, nt)
        };
        // one token, Q4_K: the rows staged in shared memory where the launch fits in one wave
        let stage = if direct && nt == 1 && ty == GgmlType::Q4K && cols.is_multiple_of(1024) {
            self.stage_rows(stem, segs, r)?
        } else {
            None
        };
        let r = stage.map_or(r, |(rs, _)| rs);
        let rows_per_block = (r * WARPS_PER_BLOCK) as usize;
        let (p, blocks) = self.segment_params(segs, rows_per_block);
        if blocks == 0 {
            return Ok(());
        }
        // one token, more row blocks than the card holds: the queue kernel on a grid of the
        // resident blocks (opt-in)
        let whole = direct && nt == 1 && stage.is_none() && cols.is_multiple_of(1024);
        let queue = if whole {
            self.queue_grid(stem, r, blocks, queue_mode())?
        } else {
            None
        };
        let mut slot = if queue.is_some() {
            self.queue_slot()
        } else {
            0
        };
        let grid = queue.unwrap_or(blocks);
        let base = if queue.is_some() {
            format!("mvd_{stem}_n1_r{r}_q")
        } else if let Some((rs, _)) = stage {
            format!("mvd_{stem}_n1_r{rs}_s")
        } else if direct {
            // `_t`: a partial last iteration of 1-3 super-blocks
            let t = if cols.is_multiple_of(1024) { "" } else { "_t" };
            let g = match direct_xgroup(nt, total_rows) {
                g @ (1 | 2) if nt > 2 && ty == GgmlType::Q4K => format!("_g{g}"),
                _ => String::new(),
            };
            format!("mvd_{stem}_n{nt}_r{r}{g}{t}")
        } else if nt == 1 {
            format!("mvm_{stem}_r{r}")
        } else {
            format!("mvm_{stem}_n{nt}_r{r}")
        };
        // two tokens: x staged in shared memory (the _xs kernels) where it fits beside the
        // kernel's own staging buffers in the 48 KB a launch gets without opting in, or, with
        // REDLINE_MV_XSMEM_WIDE=1, beyond that; either way only where the SM still holds as
        // many blocks
        let xs_bytes = (n_tokens * cols + n_tokens * (cols / 32) * 8) as u32;
        let mut f = None;
        if !direct && nt == 2 && matches!(ty, GgmlType::Q4K | GgmlType::Q6K) && x_in_shared() {
            let name = format!("{base}_xs");
            let fx = self.function(Program::MatvecQuant, &name)?;
            f = self.xs_launch_fits(&name, &fx, xs_bytes).then_some(fx);
        }
        let shared_mem_bytes = match (&f, stage) {
            (Some(_), _) => xs_bytes,
            (None, Some((_, bytes))) => bytes,
            (None, None) => 0,
        };
        let program = if direct {
            Program::MatvecDirect
        } else {
            Program::MatvecQuant
        };
        let f = match f {
            Some(f) => f,
            None => self.function(program, &base)?,
        };
        let mut n_i = n_tokens as i32;
        let cfg = LaunchConfig {
            grid_dim: (grid as u32, 1, 1),
            block_dim: (32, WARPS_PER_BLOCK, 1),
            shared_mem_bytes,
        };
        let mut load_mode = self.matvec_load_mode() | tiled_bit(xq);
        if queue.is_some() {
            load_mode |= queue_counters() << 16;
        }
        if crate::pdl::enabled(self.arch()) {
            let (mut pq, mut pd) = (self.device_address(&xq.xq), self.device_address(&xq.xds));
            let mut p = p;
            let mut params = vec![
                crate::pdl::arg(&mut p),
                crate::pdl::arg(&mut pq),
                crate::pdl::arg(&mut pd),
            ];
            if nt > 1 || direct {
                params.push(crate::pdl::arg(&mut n_i));
            }
            params.push(crate::pdl::arg(&mut load_mode));
            if queue.is_some() {
                params.push(crate::pdl::arg(&mut slot));
            }
            // SAFETY: as below; the mvm kernels wait for the previous kernel before reading
            // x or the outputs and before writing anything.
            unsafe { crate::pdl::launch(self.stream(), &f, cfg, &mut params, true) }?;
            return Ok(());
        }
        let mut b = self.stream().launch_builder(&f);
        b.arg(&p).arg(&xq.xq).arg(&xq.xds);
        if nt > 1 || direct {
            b.arg(&n_i);
        }
        b.arg(&load_mode);
        if queue.is_some() {
            b.arg(&slot);
        }
        // SAFETY: matches mvm_<fmt>_r<R>(MvSegs, xq, xds, load_mode) for one token and
        // mvm_<fmt>_n<NT>_r<R>(MvSegs, xq, xds, n_tokens, load_mode) for n_tokens <= NT, and
        // mvd_<fmt>_n<NT>_r<R>[_g<G>][_t](MvSegs, xq, xds, n_tokens, load_mode) (Q4_K / IQ4_XS, rows
        // of a multiple of 1024 values, or of 256 with _t, whose loads stay inside every row),
        // the _q ones with the address of a queue slot (QUEUE_SLOT_WORDS u32) at zero;
        // every segment's matrix is a live DeviceMatrix of this type and width, outputs hold
        // n_tokens * n_rows f32 and biases n_rows (the caller's contract), x was quantized
        // for n_tokens tokens of `cols`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Rows per warp of a direct segment launch of `nt` (1, 2 or 4) tokens: forced
    /// ([`set_direct_kernels`], `REDLINE_MV_DIRECT_R`, for two tokens `REDLINE_MV_DIRECT_R2`), else
    /// 2, except where 4 rows fill the card's resident blocks in fewer waves (the occupancy API's
    /// blocks an SM x the SMs). Why (H100, session 27): with x double-buffered the two-token
    /// 2-row kernel took 125 registers (4 blocks an SM instead of 5), so a 5120-row product's
    /// 640 blocks needed 1.2 waves of 528 places, and 4 rows (320 blocks in 396 places) took the
    /// 27B's two-token 5120-row products from 27.6 to 21.9 µs and 12.5 to 10.6. With x loaded
    /// just in time the 2-row kernel holds 5 blocks again (640 blocks in 660 places: 21.8 and
    /// 9.7 µs), and the rule picks 2 rows there; it still guards cards and kernels where the
    /// places fall the other way. Three and four tokens keep 2 rows (session 29: x just in time
    /// there too, with 1 or 2 rows by this rule, lost: the 27B's 4-row verify passes 11.81-12.00
    /// -> 12.49-12.56 ms on an H100).
    fn direct_rows(&self, stem: &str, cols: usize, segs: &[Segment<'_>], nt: usize) -> Result<u32> {
        let forced = direct_rows_forced(nt);
        if forced != 0 {
            return Ok(forced);
        }
        if stem == "q6_k" {
            // (ptxas, sm_90: one token 128 registers at 2 rows a warp, 4 blocks an SM; 79 at
            // one row, 6 blocks; held to 5 blocks the 2-row one spills)
            static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
            let r = *ENV.get_or_init(|| env_u32("REDLINE_MV_DIRECT_R_Q6K"));
            if r == 1 || r == 2 || (r == 4 && nt <= 2) {
                return Ok(r);
            }
        }
        if nt != 2 {
            return Ok(2);
        }
        let t = if cols.is_multiple_of(1024) { "" } else { "_t" };
        let sms = self.info().sm_count.max(1) as usize;
        // the share of the resident places the launch's waves keep busy
        let mut fill = [0f64; 2];
        for (k, r) in [2usize, 4].into_iter().enumerate() {
            let name = format!("mvd_{stem}_n{nt}_r{r}{t}");
            let per_sm = self.resident_blocks(&name, Program::MatvecDirect)?;
            let places = per_sm.max(1) * sms;
            let blocks: usize = segs
                .iter()
                .map(|s| s.w.n_rows.div_ceil(r * WARPS_PER_BLOCK as usize))
                .sum();
            fill[k] = blocks as f64 / (blocks.div_ceil(places) * places) as f64;
        }
        Ok(if fill[1] > fill[0] * 1.05 { 4 } else { 2 })
    }

    /// Rows a warp and shared-memory bytes a block of a staged one-token launch
    /// (`mvd_<stem>_n1_r<R>_s`), or None where staging is off or the launch does not fit the
    /// card's resident blocks in one wave. `r`: the unstaged rows a warp (1, 2 or 4), staged as
    /// they are; `REDLINE_MV_STAGE_R=4` stages 4 rows a warp instead (half the blocks, each with
    /// twice the shared memory, over the 48 KB a block gets without opting in past 4096 values
    /// a row).
    fn stage_rows(&self, stem: &str, segs: &[Segment<'_>], r: u32) -> Result<Option<(u32, u32)>> {
        if !stage_enabled() || !crate::pdl::enabled(self.arch()) {
            return Ok(None);
        }
        static ENV: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        let r = match *ENV.get_or_init(|| env_u32("REDLINE_MV_STAGE_R")) {
            4 => 4,
            _ => r,
        };
        let row_bytes = segs.first().map_or(0, |s| s.w.row_bytes());
        let bytes = WARPS_PER_BLOCK as usize * r as usize * row_bytes;
        if bytes > STAGE_MAX_BYTES as usize {
            return Ok(None);
        }
        let name = format!("mvd_{stem}_n1_r{r}_s");
        if bytes > 48 * 1024 {
            use cudarc::driver::sys::CUfunction_attribute as A;
            let f = self.function(Program::MatvecDirect, &name)?;
            if f.set_attribute(
                A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                STAGE_MAX_BYTES as i32,
            )
            .is_err()
            {
                return Ok(None);
            }
        }
        let blocks: usize = segs
            .iter()
            .map(|s| s.w.n_rows.div_ceil(r as usize * WARPS_PER_BLOCK as usize))
            .sum();
        let places = self.resident_blocks_smem(&name, Program::MatvecDirect, bytes as u32)?
            * self.info().sm_count.max(1) as usize;
        Ok((blocks <= places).then_some((r, bytes as u32)))
    }

    /// The grid of a queue one-token launch (`mvd_<stem>_n1_r<r>_q`) of `blocks` row blocks: the
    /// card's resident blocks, or None where `mode` is off, there is no queue kernel for these
    /// rows a warp, or the launch fits the resident blocks in one wave (`mode` 2, forced for
    /// tests: a third of the blocks).
    fn queue_grid(&self, stem: &str, r: u32, blocks: usize, mode: u32) -> Result<Option<usize>> {
        let has_kernel = match stem {
            "q4_k" | "q6_k" => r == 1 || r == 2,
            "iq4_xs" | "q4_0" => r == 2,
            _ => false,
        };
        if mode == 0 || !has_kernel {
            return Ok(None);
        }
        if mode == 2 {
            return Ok(Some(blocks.div_ceil(3).max(1)));
        }
        let places = self
            .resident_blocks(&format!("mvd_{stem}_n1_r{r}_q"), Program::MatvecDirect)?
            * self.info().sm_count.max(1) as usize;
        Ok((places > 0 && blocks > places).then_some(places))
    }

    /// Blocks of `WARPS_PER_BLOCK` warps of kernel `name` an SM holds at once (no dynamic shared
    /// memory), asked once per device and kernel.
    fn resident_blocks(&self, name: &str, program: Program) -> Result<usize> {
        self.resident_blocks_smem(name, program, 0)
    }

    /// As [`Self::resident_blocks`], each block with `smem` bytes of dynamic shared memory.
    fn resident_blocks_smem(&self, name: &str, program: Program, smem: u32) -> Result<usize> {
        type Key = (usize, String, u32);
        static KNOWN: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<Key, usize>>> =
            std::sync::OnceLock::new();
        let key = (self.info().ordinal, name.to_string(), smem);
        let known = KNOWN.get_or_init(Default::default);
        if let Some(&n) = known.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(n);
        }
        let f = self.function(program, name)?;
        let n = f.occupancy_max_active_blocks_per_multiprocessor(
            32 * WARPS_PER_BLOCK,
            smem as usize,
            None,
        )? as usize;
        known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, n);
        Ok(n)
    }

    /// Whether `_xs` kernel `f` (named `name`) takes `xs_bytes` of dynamic shared memory: beside
    /// its own staging buffers within the default 48 KB, or beyond it with
    /// `REDLINE_MV_XSMEM_WIDE=1` (opted in here: a host-side attribute, fine inside graph
    /// capture), and either way with as many blocks per SM as without (a V100's 96 KB per SM
    /// would lose a block to it where an H100's 228 KB does not). Decided once per device,
    /// kernel and size; a wide yes sets the opt-in again on every call (cheap), since a later
    /// device on the same ordinal loads the function anew.
    fn xs_launch_fits(&self, name: &str, f: &cudarc::driver::CudaFunction, xs_bytes: u32) -> bool {
        use cudarc::driver::sys::CUfunction_attribute as A;
        type Key = (usize, String, u32);
        // (fits, needs the opt-in)
        static DECIDED: std::sync::OnceLock<
            std::sync::Mutex<std::collections::HashMap<Key, (bool, bool)>>,
        > = std::sync::OnceLock::new();
        let key = (self.info().ordinal, name.to_string(), xs_bytes);
        let decided = DECIDED.get_or_init(Default::default);
        let known = decided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied();
        let opt_in = |f: &cudarc::driver::CudaFunction| {
            f.set_attribute(
                A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                xs_bytes as i32,
            )
            .is_ok()
        };
        let (fits, wide) = known.unwrap_or_else(|| {
            let block = 32 * WARPS_PER_BLOCK;
            let decide = || {
                let own = f
                    .get_attribute(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                    .ok()? as u32;
                let wide = own + xs_bytes > 48 * 1024;
                if wide && !(x_in_shared_wide() && opt_in(f)) {
                    return Some((false, wide));
                }
                let without = f
                    .occupancy_max_active_blocks_per_multiprocessor(block, 0, None)
                    .ok()?;
                let with = f
                    .occupancy_max_active_blocks_per_multiprocessor(block, xs_bytes as usize, None)
                    .ok()?;
                Some((with >= without && with > 0, wide))
            };
            let v = decide().unwrap_or((false, false));
            decided
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, v);
            v
        });
        fits && (!wide || opt_in(f))
    }

    fn matvec_float(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        n_tokens: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (stem, _) = kernel_stem(w.ty).ok_or(CudaError::UnsupportedType(w.ty.name()))?;
        let (rows, cols) = (w.n_rows, w.n_cols);
        if x.len() < n_tokens * cols || y.len() < n_tokens * rows {
            return Err(CudaError::Shape(format!(
                "x {} / y {} too small for {n_tokens} tokens of {rows}x{cols}",
                x.len(),
                y.len()
            )));
        }
        let grid = (rows as u32).div_ceil(WARPS_PER_BLOCK);
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (32, WARPS_PER_BLOCK, 1),
            shared_mem_bytes: 0,
        };
        let (rows_i, cols_i) = (rows as i32, cols as i32);
        let mut t0 = 0;
        while t0 < n_tokens {
            let n = (n_tokens - t0).min(MAX_TOKENS_PER_LAUNCH);
            let n_i = n as i32;
            let f = self.function(
                Program::MatvecFloat,
                &format!("mv_{stem}_n{}", n.next_power_of_two()),
            )?;
            let xs = x.slice(t0 * cols..(t0 + n) * cols);
            let mut ys = y.slice_mut(t0 * rows..(t0 + n) * rows);
            let mut b = self.stream().launch_builder(&f);
            b.arg(&w.data)
                .arg(&xs)
                .arg(&mut ys)
                .arg(&rows_i)
                .arg(&cols_i)
                .arg(&n_i);
            // SAFETY: matches mv_<f32|f16|bf16>_n<NT>(W, x, y, nrows, ncols, n_tokens).
            unsafe { b.launch(cfg) }?;
            t0 += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 27B's verify-pass launches take the kernels session 32 measured fastest in a pass:
    /// three-token launches of 12288+ rows the x-group kernels, four-token ones the all-tokens
    /// kernels, direct up to 24576 rows (the in-projections) and on the tensor cores beyond
    /// (gate/up); opted in, one-token Q6_K launches below the heads' size the direct kernels. The
    /// only test in this binary that touches these switches.
    #[test]
    fn few_token_q4_k_launches_take_the_measured_kernels() {
        let env_set = [
            "REDLINE_MV_DIRECT",
            "REDLINE_MV_DIRECT4",
            "REDLINE_MV_DIRECT_XG",
            "REDLINE_MV_DIRECT_Q6K",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
        if env_set {
            eprintln!("skipped: a REDLINE_MV_DIRECT* switch is set");
            return;
        }
        let q4k = |n, rows| direct_applies(GgmlType::Q4K, 5120, n, rows);
        // in-projections, gate/up, out, down
        assert!(q4k(3, 16384) && q4k(3, 34816) && q4k(3, 5120));
        assert!(q4k(4, 16384) && !q4k(4, 34816) && q4k(4, 5120));
        assert!(direct_applies(GgmlType::Q4K, 17408, 4, 5120));
        assert!(!direct_applies(GgmlType::IQ4XS, 5120, 4, 5120));
        assert_eq!(direct_xgroup(3, 16384), 2);
        assert_eq!(direct_xgroup(3, 34816), 2);
        assert_eq!(direct_xgroup(3, 5120), 0);
        assert_eq!(direct_xgroup(4, 16384), 0);
        set_direct_xgroup(Some(1));
        assert_eq!(direct_xgroup(4, 5120), 1);
        set_direct_xgroup(Some(0));
        assert_eq!(direct_xgroup(3, 16384), 0);
        set_direct_xgroup(None);
        assert_eq!(direct_xgroup(3, 16384), 2);
        // Q6_K (session 33): off by default (slower on an H100); opted in, one-token
        // launches of the per-layer products direct; not the output heads, not two tokens (the
        // q8_1 tensor-core kernels), not widths off the 1024-value grid (no `_t` kernels)
        let q6k = |cols, n, rows| direct_applies(GgmlType::Q6K, cols, n, rows);
        assert!(!q6k(17408, 1, 5120));
        set_direct_q6k(Some(DirectQ6K::OneToken));
        assert!(q6k(17408, 1, 5120) && q6k(5120, 1, 10240) && q6k(27648, 1, 5120));
        assert!(!q6k(5120, 1, 248320) && !q6k(5120, 2, 10240) && !q6k(2304, 1, 5120));
        set_direct_q6k(None);
        assert!(!q6k(17408, 1, 5120));
        for v in DirectQ6K::ALL {
            set_direct_q6k(Some(v));
            assert_eq!(direct_q6k(), v);
        }
        set_direct_q6k(None);
        assert_eq!(direct_q6k(), DirectQ6K::Off);
    }
}
