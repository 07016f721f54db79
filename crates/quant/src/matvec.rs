//! Threaded matrix-vector and matrix-matrix products over weight rows in any format.
//!
//! Weights `w` are `[n_rows, n_cols]` in their on-disk format (row-major, each row
//! `n_cols / block_size` blocks), read in place. Activations are quantized once per call
//! into the weight type's paired format, then rows are split into tasks across the rayon
//! pool. Decode (one token) is bound by the rate at which weights stream from memory, so
//! a task is a run of rows of roughly [`TASK_BYTES`] of weights: big enough to amortize
//! scheduling, small enough that both cores stay busy to the end.
//!
//! For several tokens (prefill), each task walks its rows once per tile of
//! [`TOKEN_TILE`] tokens; a task's rows are sized to stay in L2, so every weight byte
//! comes from memory once per call and from cache for the following tiles. Formats with a
//! multi-token kernel ([`crate::dot::dot_tile_kernel`]) also unpack each weight block
//! once per [`MAX_TILE`] tokens instead of once per token.

use crate::activation::quantize_activations_into;
use crate::dot::{
    best_isa, dot_kernel, dot_tile_kernel, row_lengths, DotFn, DotTileFn, Isa, MAX_TILE,
};
use crate::team::Team;
use gguf::GgmlType;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Weight bytes per decode task.
const TASK_BYTES: usize = 64 * 1024;
/// Weight bytes per chunk taken by a [`Team`] participant (an atomic add each).
const TEAM_TASK_BYTES: usize = 32 * 1024;
/// Below this many weight bytes a matvec runs on the calling thread: handing work to the
/// rayon pool from outside it costs a wake-up and a switch back (measured ~10-15 us on
/// the 2-core box, as long as a 256 × 1536 Q4_K matvec itself).
const INLINE_BYTES: usize = 96 * 1024;
/// Weight bytes per prefill task (kept in L2 while the token tiles pass over it).
const TILE_TASK_BYTES: usize = 192 * 1024;
/// Tokens whose activations are dotted against a weight row while it sits in L1.
const TOKEN_TILE: usize = 8;

/// `y[r] = dot(w[r, :], x)` on the fastest path.
///
/// w: `[n_rows, n_cols]` of type `ty`; x: `[n_cols]` f32; y: `[n_rows]` f32.
/// Panics on inconsistent sizes or a type without a dot product ([`crate::dot::supports`]).
pub fn matvec(ty: GgmlType, w: &[u8], n_rows: usize, n_cols: usize, x: &[f32], y: &mut [f32]) {
    matmul_with(best_isa(), ty, w, n_rows, n_cols, x, 1, y)
}

/// As [`matvec`], shared between the caller and `team`'s helpers instead of the rayon
/// pool (see [`crate::team`]: the hand-off per call is a cache-line write, not two futex
/// wake-ups). Decode calls this ~200 times per token.
///
/// w: `[n_rows, n_cols]` of type `ty`; x: `[n_cols]` f32; y: `[n_rows]` f32.
#[allow(clippy::too_many_arguments)]
pub fn matvec_on(
    team: &Team,
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    y: &mut [f32],
) {
    matvec_on_with(team, best_isa(), ty, w, n_rows, n_cols, x, y)
}

/// As [`matvec_on`] on a forced instruction-set path (panics if the CPU lacks it).
#[allow(clippy::too_many_arguments)]
pub fn matvec_on_with(
    team: &Team,
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    y: &mut [f32],
) {
    let (row_bytes, _) = row_lengths(ty, n_cols);
    assert_eq!(
        w.len(),
        n_rows * row_bytes,
        "{ty} weights [{n_rows}, {n_cols}]: byte length"
    );
    assert_eq!(y.len(), n_rows, "output [{n_rows}]: length");
    let act = quantize_activation_rows(ty, x, 1, n_cols);
    if n_rows == 0 {
        return;
    }
    if n_cols == 0 {
        y.fill(0.0);
        return;
    }
    let kernel = dot_kernel(isa, ty).unwrap_or_else(|| panic!("no dot product for {ty}"));
    if w.len() <= INLINE_BYTES || team.n_threads() == 1 {
        dot_rows(kernel, w, row_bytes, &act, n_cols, 0..n_rows, |r, v| {
            y[r] = v
        });
        return;
    }
    // Each participant streams its own contiguous region of rows (one sequential stream
    // per core suits the hardware prefetchers: interleaving small chunks between the cores
    // measured ~25 % slower from DRAM), in chunks of ~TEAM_TASK_BYTES taken from the
    // region's counter; once its region is drained it takes chunks from the others, so a
    // participant that starts late (parked, preempted) just ends up with less work.
    let n_parts = team.n_threads();
    let rpt = (TEAM_TASK_BYTES / row_bytes).clamp(1, n_rows.div_ceil(2 * n_parts));
    let n_chunks = n_rows.div_ceil(rpt);
    let bounds: Vec<usize> = (0..=n_parts).map(|p| p * n_chunks / n_parts).collect();
    let next: Vec<AtomicUsize> = bounds[..n_parts]
        .iter()
        .map(|&b| AtomicUsize::new(b))
        .collect();
    let ticket = AtomicUsize::new(0);
    let out = SharedRows(y.as_mut_ptr());
    team.run(&|| {
        let first = ticket.fetch_add(1, Ordering::Relaxed) % n_parts;
        for p in (0..n_parts).map(|i| (first + i) % n_parts) {
            loop {
                let c = next[p].fetch_add(1, Ordering::Relaxed);
                if c >= bounds[p + 1] {
                    break;
                }
                let r0 = c * rpt;
                let r1 = (r0 + rpt).min(n_rows);
                dot_rows(kernel, w, row_bytes, &act, n_cols, r0..r1, |r, v| {
                    // SAFETY: r < n_rows = y.len(), and chunk c (hence row r) is taken by
                    // exactly one participant; `y` outlives `team.run`, which waits for
                    // every participant that joined.
                    unsafe { out.write(r, v) };
                });
            }
        }
    });
}

/// `put(r, kernel(w[r], act))` for rows `r0..r1`. w: `[n_rows, row_bytes]`.
#[inline]
fn dot_rows(
    kernel: DotFn,
    w: &[u8],
    row_bytes: usize,
    act: &[u8],
    n_cols: usize,
    rows: std::ops::Range<usize>,
    mut put: impl FnMut(usize, f32),
) {
    for r in rows {
        put(
            r,
            kernel(&w[r * row_bytes..(r + 1) * row_bytes], act, n_cols),
        );
    }
}

/// The output rows of [`matvec_on_with`], written by several threads at distinct indices.
struct SharedRows(*mut f32);

impl SharedRows {
    /// # Safety
    /// `i` in bounds, and no other thread touches index `i` during the job.
    unsafe fn write(&self, i: usize, v: f32) {
        // SAFETY: per the contract above.
        unsafe { *self.0.add(i) = v };
    }
}

// SAFETY: used only through `write` at disjoint indices while the owner waits.
unsafe impl Sync for SharedRows {}

/// `y[t, r] = dot(w[r, :], x[t, :])` on the fastest path; weights are read once per call.
///
/// w: `[n_rows, n_cols]` of type `ty`; x: `[n_tokens, n_cols]` f32;
/// y: `[n_tokens, n_rows]` f32. Panics on inconsistent sizes or an unsupported type.
pub fn matmul(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) {
    matmul_with(best_isa(), ty, w, n_rows, n_cols, x, n_tokens, y)
}

/// As [`matmul`] on a forced instruction-set path (panics if the CPU lacks it).
#[allow(clippy::too_many_arguments)]
pub fn matmul_with(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
) {
    // Sizes are checked by `quantize_activation_rows` and `matmul_quantized_with`; check the weights
    // first so a wrong matrix is reported as such rather than as bad activations.
    let (row_bytes, _) = row_lengths(ty, n_cols);
    assert_eq!(
        w.len(),
        n_rows * row_bytes,
        "{ty} weights [{n_rows}, {n_cols}]: byte length"
    );
    let acts = quantize_activation_rows(ty, x, n_tokens, n_cols);
    matmul_quantized_with(isa, ty, w, n_rows, n_cols, &acts, n_tokens, y);
}

/// Quantizes `n_tokens` rows of activations for weights of type `ty`, once, so that
/// several matrices reading the same input (Q/K/V, gate/up) can share them through
/// [`matmul_quantized`]. Weight types with the same [`crate::vec_dot_type`] (e.g. Q4_K
/// and Q6_K, or Q4_0 and Q8_0) take the same activations.
///
/// x: `[n_tokens, n_cols]` f32; returns `[n_tokens, activation_row_bytes]`.
pub fn quantize_activation_rows(
    ty: GgmlType,
    x: &[f32],
    n_tokens: usize,
    n_cols: usize,
) -> Vec<u8> {
    assert_eq!(
        x.len(),
        n_tokens * n_cols,
        "activations [{n_tokens}, {n_cols}]: length"
    );
    let act_bytes = crate::activation::activation_row_bytes(ty, n_cols);
    let mut acts = vec![0u8; n_tokens * act_bytes];
    if act_bytes == 0 {
        return acts;
    }
    let quantize = |(a, xr): (&mut [u8], &[f32])| quantize_activations_into(ty, xr, a);
    if n_tokens >= 4 {
        acts.par_chunks_mut(act_bytes)
            .zip(x.par_chunks(n_cols))
            .for_each(quantize);
    } else {
        acts.chunks_mut(act_bytes)
            .zip(x.chunks(n_cols))
            .for_each(quantize);
    }
    acts
}

/// As [`matmul`], with activations already quantized by [`quantize_activation_rows`]`(ty, ..)` (or any
/// type with the same [`crate::vec_dot_type`]).
///
/// acts: `[n_tokens, activation_row_bytes(ty, n_cols)]`; y: `[n_tokens, n_rows]` f32.
pub fn matmul_quantized(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    acts: &[u8],
    n_tokens: usize,
    y: &mut [f32],
) {
    matmul_quantized_with(best_isa(), ty, w, n_rows, n_cols, acts, n_tokens, y)
}

/// As [`matmul_quantized`] on a forced instruction-set path.
#[allow(clippy::too_many_arguments)]
pub fn matmul_quantized_with(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    acts: &[u8],
    n_tokens: usize,
    y: &mut [f32],
) {
    let (row_bytes, act_bytes) = row_lengths(ty, n_cols);
    assert_eq!(
        w.len(),
        n_rows * row_bytes,
        "{ty} weights [{n_rows}, {n_cols}]: byte length"
    );
    assert_eq!(
        acts.len(),
        n_tokens * act_bytes,
        "quantized activations [{n_tokens}, {n_cols}]: byte length"
    );
    assert_eq!(
        y.len(),
        n_tokens * n_rows,
        "output [{n_tokens}, {n_rows}]: length"
    );
    if n_rows == 0 || n_tokens == 0 {
        return;
    }
    if n_cols == 0 {
        y.fill(0.0);
        return;
    }
    let kernel = dot_kernel(isa, ty).unwrap_or_else(|| panic!("no dot product for {ty}"));
    if n_tokens == 1 {
        matvec_rows(kernel, w, row_bytes, n_cols, acts, y);
    } else {
        let kernels = Kernels {
            row: kernel,
            tile: dot_tile_kernel(isa, ty),
        };
        matmul_rows(kernels, w, row_bytes, n_cols, acts, act_bytes, n_tokens, y);
    }
}

/// Rows per task: about `target` bytes of weights, but at least 4 tasks per thread so a
/// slow core does not hold up the rest.
fn rows_per_task(n_rows: usize, row_bytes: usize, target: usize) -> usize {
    let by_bytes = (target / row_bytes.max(1)).max(1);
    let min_tasks = 4 * rayon::current_num_threads();
    by_bytes.min(n_rows.div_ceil(min_tasks)).max(1)
}

/// y: `[n_rows]`; act: one activation row.
fn matvec_rows(
    kernel: DotFn,
    w: &[u8],
    row_bytes: usize,
    n_cols: usize,
    act: &[u8],
    y: &mut [f32],
) {
    if w.len() <= INLINE_BYTES {
        dot_rows(kernel, w, row_bytes, act, n_cols, 0..y.len(), |r, v| {
            y[r] = v
        });
        return;
    }
    let rpt = rows_per_task(y.len(), row_bytes, TASK_BYTES);
    y.par_chunks_mut(rpt)
        .zip(w.par_chunks(rpt * row_bytes))
        .for_each(|(yc, wc)| {
            dot_rows(kernel, wc, row_bytes, act, n_cols, 0..yc.len(), |r, v| {
                yc[r] = v
            });
        });
}

/// The single-row kernel and, where the format has one, the multi-token kernel.
#[derive(Clone, Copy)]
struct Kernels {
    row: DotFn,
    tile: Option<DotTileFn>,
}

/// y: `[n_tokens, n_rows]`; acts: `[n_tokens, act_bytes]`.
#[allow(clippy::too_many_arguments)]
fn matmul_rows(
    kernels: Kernels,
    w: &[u8],
    row_bytes: usize,
    n_cols: usize,
    acts: &[u8],
    act_bytes: usize,
    n_tokens: usize,
    y: &mut [f32],
) {
    let n_rows = y.len() / n_tokens;
    let rpt = rows_per_task(n_rows, row_bytes, TILE_TASK_BYTES);
    // yt: [n_rows, n_tokens], so each task owns a contiguous piece; transposed at the end.
    let mut yt = vec![0f32; n_rows * n_tokens];
    yt.par_chunks_mut(rpt * n_tokens)
        .zip(w.par_chunks(rpt * row_bytes))
        .for_each(|(yc, wc)| {
            for t0 in (0..n_tokens).step_by(TOKEN_TILE) {
                let t1 = (t0 + TOKEN_TILE).min(n_tokens);
                for (yr, wr) in yc
                    .chunks_exact_mut(n_tokens)
                    .zip(wc.chunks_exact(row_bytes))
                {
                    match kernels.tile {
                        Some(tile) => {
                            for s0 in (t0..t1).step_by(MAX_TILE) {
                                let s1 = (s0 + MAX_TILE).min(t1);
                                let a = &acts[s0 * act_bytes..s1 * act_bytes];
                                tile(wr, a, s1 - s0, n_cols, &mut yr[s0..s1]);
                            }
                        }
                        None => {
                            for t in t0..t1 {
                                let a = &acts[t * act_bytes..(t + 1) * act_bytes];
                                yr[t] = (kernels.row)(wr, a, n_cols);
                            }
                        }
                    }
                }
            }
        });
    y.par_chunks_mut(n_rows).enumerate().for_each(|(t, yrow)| {
        for (r, v) in yrow.iter_mut().enumerate() {
            *v = yt[r * n_tokens + t];
        }
    });
}
