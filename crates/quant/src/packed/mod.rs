//! Weights repacked at load into 16-row interleaved groups, and the GEMM / GEMV over them
//! (prefill and decode of Q4_0, Q8_0, Q4_K and Q6_K on x86-64: AVX-512 VNNI kernels in
//! `avx512.rs`, AVX2 ones in `avx2.rs`, chosen at run time by [`best_isa`]).
//!
//! Why: the row-major kernels (`dot::avx512_tile`) compute one weight row at a time, so
//! every block ends in a horizontal sum and a scalar scale per (row, token), and the f16
//! scales are converted one at a time. In a 16-row group stored so that one zmm holds 4
//! consecutive weights of each of the 16 rows (one row per i32 lane), one `vpdpbusd`
//! with 4 broadcast activation bytes yields 16 row partial sums at once: the scales of 16
//! rows are one vector, nothing is summed horizontally, and the result is already laid
//! out as 16 consecutive outputs. Each unpacked weight vector is reused from registers for
//! up to [`MAX_T`] tokens. This is the idea of ggml-cpu's `repack.cpp` (q4_0_8x8 etc.);
//! the layouts and kernels here are our own.
//!
//! Layouts (one group = 16 rows `16g..16g+16`; every group starts 64-byte aligned). A
//! "chunk" is 64 bytes: 4 bytes of each of the 16 rows, row r at bytes `4r..4r+4`.
//! - Q4_0 (blocks of 32): pairs of blocks in 576 bytes = the 16 rows' f16 `d` of both
//!   blocks (64 bytes), then each block's 4 chunks of quants (chunk k = bytes `4k..4k+4`
//!   of each row's `qs`). Same size as the file's blocks (+32 bytes for an odd count).
//!   One sequential stream: scales in a region of their own streamed ~2x slower.
//! - Q8_0 (blocks of 32): pairs in 1088 bytes, as Q4_0 with 8 chunks per block.
//! - Q4_K (super-blocks of 256): per super-block 2368 bytes = 16 f16 `d`, 16 f16 `dmin`,
//!   scales `[8 sub-blocks][16 rows]` u8, mins `[4 pairs][16 rows][2]` u8, then 32
//!   chunks of `qs` (chunk j = bytes `4j..4j+4` of each row). 2.8 % larger than the file.
//! - Q6_K (super-blocks of 256): per super-block 3392 bytes = 16 f16 `d`, 32 bytes of
//!   padding (keeps everything aligned), scales `[16 sub-blocks][16 rows]` i8, then the 32
//!   chunks of `ql` and 16 of `qh` in the order the kernel reads them (`avx512::q6_k`).
//!   1 % larger than the file.
//!
//! Activations are quantized exactly as for the row kernels (Q8_0 / Q8_K, so the results
//! match [`crate::vec_dot`] up to float rounding) and then split into [`PackedActs`]: the
//! int8 values, the f32 scales and per-block integer sums that fold the weights' offsets
//! (Q4_0's −8, Q6_K's −32, the +128 that makes Q8_0 weights unsigned for `vpdpbusd`) and
//! Q4_K's mins into the integer accumulators.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use crate::activation::quantize_activations_into;
use crate::blocks::{f16_le, BlockQ4K, BlockQ4_0, BlockQ6K, BlockQ8K, BlockQ8_0};
use crate::dot::Isa;
use crate::team::Team;
use bytemuck::{cast_slice, cast_slice_mut, Pod, Zeroable};
use gguf::GgmlType;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 16;
/// Most tokens a kernel call takes (weights unpacked once per block for all of them).
pub const MAX_T: usize = 8;

/// Weight bytes per chunk of work taken by one thread in a one-token product.
const DECODE_CHUNK_BYTES: usize = 32 * 1024;
/// Below this many weight bytes a one-token product runs on the calling thread.
const INLINE_BYTES: usize = 96 * 1024;

/// 64 bytes, 64-byte aligned: the allocation unit of packed weights.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Bytes of one 16-row group of `nb` blocks / super-blocks (a multiple of 64).
fn group_bytes(ty: GgmlType, nb: usize) -> usize {
    match ty {
        // Pairs of blocks; an odd last block takes a pair's slot minus one block's quants.
        GgmlType::Q4_0 => 576 * (nb / 2) + 320 * (nb % 2),
        GgmlType::Q8_0 => 1088 * (nb / 2) + 576 * (nb % 2),
        GgmlType::Q4K => 2368 * nb,
        GgmlType::Q6K => 3392 * nb,
        _ => unreachable!("no packed layout for {ty}"),
    }
}

/// Whether this CPU runs the packed kernels of path `isa`: [`Isa::Avx512`] needs VNNI
/// on top of AVX-512 F/BW/VL; [`Isa::Avx2`] AVX2 + FMA + F16C. No other path has them.
pub fn isa_available(isa: Isa) -> bool {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            *OK.get_or_init(|| {
                Isa::Avx512.available() && std::is_x86_feature_detected!("avx512vnni")
            })
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Isa::Avx2.available(),
        _ => false,
    }
}

/// The fastest packed-kernel path of this CPU, if any.
pub fn best_isa() -> Option<Isa> {
    [Isa::Avx512, Isa::Avx2]
        .into_iter()
        .find(|&i| isa_available(i))
}

/// Whether a `[n_rows, n_cols]` matrix of `ty` can be packed and multiplied on this CPU:
/// a packed layout and kernel exist for `ty`, and the rows split into whole groups.
pub fn supports(ty: GgmlType, n_rows: usize, n_cols: usize) -> bool {
    best_isa().is_some() && shape_supported(ty, n_rows, n_cols)
}

fn shape_supported(ty: GgmlType, n_rows: usize, n_cols: usize) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q4K | GgmlType::Q6K
    ) && n_rows > 0
        && n_rows.is_multiple_of(GROUP_ROWS)
        && n_cols > 0
        && n_cols.is_multiple_of(ty.block_size())
}

/// A weight matrix `[n_rows, n_cols]` in the 16-row interleaved layout of its type.
pub struct PackedMatrix {
    /// Which kernels run it (the layout is the same for all).
    isa: Isa,
    ty: GgmlType,
    n_rows: usize,
    n_cols: usize,
    /// Bytes per 16-row group.
    group_bytes: usize,
    lines: Vec<Line>,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({} [{}, {}], {} bytes)",
            self.ty,
            self.n_rows,
            self.n_cols,
            self.bytes().len()
        )
    }
}

impl PackedMatrix {
    /// Repacks `w`: `[n_rows, n_cols]` of `ty` in the file's row-major block layout.
    /// Panics unless [`supports`]`(ty, n_rows, n_cols)` and `w` has the right length.
    pub fn pack(ty: GgmlType, w: &[u8], n_rows: usize, n_cols: usize) -> PackedMatrix {
        let isa = best_isa().expect("no packed kernels on this CPU");
        PackedMatrix::pack_with(isa, ty, w, n_rows, n_cols)
    }

    /// As [`PackedMatrix::pack`], run by the kernels of a forced path (for tests; panics
    /// unless [`isa_available`]`(isa)`).
    pub fn pack_with(
        isa: Isa,
        ty: GgmlType,
        w: &[u8],
        n_rows: usize,
        n_cols: usize,
    ) -> PackedMatrix {
        assert!(
            isa_available(isa),
            "no packed kernels for {isa:?} on this CPU"
        );
        assert!(
            shape_supported(ty, n_rows, n_cols),
            "{ty} [{n_rows}, {n_cols}] has no packed layout"
        );
        let (row_bytes, _) = crate::dot::row_lengths(ty, n_cols);
        assert_eq!(w.len(), n_rows * row_bytes, "{ty} weights: byte length");
        let nb = n_cols / ty.block_size();
        let group_bytes = group_bytes(ty, nb);
        let n_groups = n_rows / GROUP_ROWS;
        let mut lines = vec![Line([0; 64]); (n_groups * group_bytes).div_ceil(64)];
        advise_huge_pages(&mut lines);
        let out: &mut [u8] = cast_slice_mut(&mut lines);
        let rows = |g: usize| &w[g * GROUP_ROWS * row_bytes..(g + 1) * GROUP_ROWS * row_bytes];
        let pack_group: fn(&[u8], &mut [u8], usize) = match ty {
            GgmlType::Q4_0 => pack_q4_0,
            GgmlType::Q8_0 => pack_q8_0,
            GgmlType::Q4K => pack_q4_k,
            GgmlType::Q6K => pack_q6_k,
            _ => unreachable!(),
        };
        use rayon::prelude::*;
        out[..n_groups * group_bytes]
            .par_chunks_mut(group_bytes)
            .enumerate()
            .for_each(|(g, dst)| pack_group(rows(g), dst, nb));
        PackedMatrix {
            isa,
            ty,
            n_rows,
            n_cols,
            group_bytes,
            lines,
        }
    }

    /// The path whose kernels run this matrix.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// `(n_rows, n_cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.n_rows, self.n_cols)
    }

    /// The packed bytes (the memory this copy costs).
    pub fn bytes(&self) -> &[u8] {
        cast_slice(&self.lines)
    }

    /// `y[t, r] = dot(w[r, :], x[t, :])`, on `team` when given (else the current rayon
    /// pool). x: `[n_tokens, n_cols]` f32; y: `[n_tokens, n_rows]` f32.
    pub fn matmul(&self, team: Option<&Team>, x: &[f32], n_tokens: usize, y: &mut [f32]) {
        let acts = PackedActs::quantize(self.ty, x, n_tokens, self.n_cols);
        self.matmul_acts(team, &acts, y);
    }

    /// As [`PackedMatrix::matmul`] with activations already prepared for this type
    /// (several matrices of types with the same [`PackedActs::kind`] can share them).
    pub fn matmul_acts(&self, team: Option<&Team>, acts: &PackedActs, y: &mut [f32]) {
        assert_eq!(
            acts.kind,
            ActKind::of(self.ty),
            "activations for another type"
        );
        assert_eq!(acts.n_cols, self.n_cols, "activation row length");
        let n_tokens = acts.n_tokens;
        assert_eq!(
            y.len(),
            n_tokens * self.n_rows,
            "output [{n_tokens}, {}]",
            self.n_rows
        );
        if n_tokens == 0 {
            return;
        }
        let n_groups = self.n_rows / GROUP_ROWS;
        let total = self.bytes().len();
        // Groups per chunk of work: ~DECODE_CHUNK_BYTES for one token; for several tokens
        // one group (its weights stay in L1/L2 while every token tile passes over it).
        let gpc = if n_tokens == 1 {
            (DECODE_CHUNK_BYTES / self.group_bytes).clamp(1, n_groups.div_ceil(4).max(1))
        } else {
            1
        };
        let n_chunks = n_groups.div_ceil(gpc);
        let out = OutRows(y.as_mut_ptr());
        let run_chunk = |c: usize| {
            let g0 = c * gpc;
            let g1 = (g0 + gpc).min(n_groups);
            for g in g0..g1 {
                let w = &self.bytes()[g * self.group_bytes..(g + 1) * self.group_bytes];
                for t0 in (0..n_tokens).step_by(MAX_T) {
                    let nt = (n_tokens - t0).min(MAX_T);
                    // SAFETY: rows 16g..16g+16 of tokens t0..t0+nt are written by this chunk
                    // only; `y` outlives the parallel run, which waits for every participant.
                    unsafe { self.group(w, acts, t0, nt, &out, g * GROUP_ROWS) };
                }
            }
        };
        let single = n_chunks == 1
            || (n_tokens == 1 && total <= INLINE_BYTES)
            || team.is_some_and(|t| t.n_threads() == 1);
        if single {
            (0..n_chunks).for_each(run_chunk);
        } else {
            parallel_chunks(team, n_chunks, &run_chunk);
        }
    }

    /// One group `w` times tokens `t0..t0 + nt`, into rows `row0..row0 + 16` of `out`.
    ///
    /// # Safety
    /// No other thread writes those outputs during the call.
    #[allow(unused_variables)]
    unsafe fn group(
        &self,
        w: &[u8],
        acts: &PackedActs,
        t0: usize,
        nt: usize,
        out: &OutRows,
        row0: usize,
    ) {
        assert!(t0 + nt <= acts.n_tokens && (1..=MAX_T).contains(&nt));
        assert_eq!(w.len(), self.group_bytes);
        let n = acts.n_tokens;
        let (nd, ns) = (acts.d.len() / n, acts.sums.len() / n);
        let mut ptrs = [std::ptr::null_mut(); MAX_T];
        let tok: [Tok; MAX_T] = std::array::from_fn(|i| {
            let t = (t0 + i).min(n - 1);
            // SAFETY: t < n_tokens and row0 + 16 <= n_rows, so this is inside `y`.
            ptrs[i] = unsafe { out.0.add(t * self.n_rows + row0) };
            Tok {
                qs: acts.qs[t * acts.n_cols..].as_ptr(),
                d: acts.d[t * nd..].as_ptr(),
                sums: acts.sums[t * ns..].as_ptr(),
            }
        });
        let nb = self.n_cols / self.ty.block_size();
        // SAFETY: `isa` was checked available at packing; `w` is one whole group of `nb`
        // units (asserted above); each `tok` points at a token's activations of `n_cols`
        // (checked against this matrix by `matmul_acts`); the output pointers are valid
        // for 16 f32 each.
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { avx512::group(self.ty, w.as_ptr(), nb, &tok, nt, &ptrs) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2::group(self.ty, w.as_ptr(), nb, &tok, nt, &ptrs) },
            _ => unreachable!("no packed kernels for {:?}", self.isa),
        }
    }
}

/// Where one token's prepared activations start (pointers into a [`PackedActs`]).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Tok {
    qs: *const i8,
    d: *const f32,
    sums: *const i32,
}

/// Asks Linux to back `lines` with transparent huge pages (before they are first written,
/// so the page faults of packing allocate 2 MB pages where the range allows): a decode
/// step streams every packed byte once, and with 4 KB pages that is a TLB miss per 4 KB.
/// Advice only; THP off ("never") or a refusal changes nothing but speed.
fn advise_huge_pages(lines: &mut [Line]) {
    #[cfg(target_os = "linux")]
    {
        let bytes = std::mem::size_of_val(lines);
        let start = lines.as_mut_ptr() as usize;
        // madvise wants a page-aligned start: advise the whole pages inside the buffer.
        let page = 4096;
        let first = start.div_ceil(page) * page;
        let end = (start + bytes) / page * page;
        if end > first {
            // SAFETY: [first, end) lies inside `lines`, which we own; MADV_HUGEPAGE does not
            // change the contents or validity of the mapping.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = lines;
}

/// One token's products of several packed matrices that read the same x (Q/K/V, gate/up):
/// x prepared once per activation kind, and the decode chunks of all matrices dealt out in
/// one parallel run, so `team` wakes and joins once instead of once per matrix. `ys[i]`
/// receives matrix i's `[1, n_rows]`; the result equals [`PackedMatrix::matmul`] per matrix.
pub fn matvec_many(team: Option<&Team>, ms: &[&PackedMatrix], x: &[f32], ys: &mut [&mut [f32]]) {
    assert_eq!(ms.len(), ys.len(), "one output per matrix");
    let mut acts: Vec<PackedActs> = Vec::new();
    let mut act_of = Vec::with_capacity(ms.len());
    for m in ms {
        assert_eq!(x.len(), m.n_cols, "activations [1, {}]", m.n_cols);
        let kind = ActKind::of(m.ty);
        let i = match acts.iter().position(|a| a.kind == kind) {
            Some(i) => i,
            None => {
                acts.push(PackedActs::quantize(m.ty, x, 1, m.n_cols));
                acts.len() - 1
            }
        };
        act_of.push(i);
    }
    // (matrix, groups per chunk, first chunk) as matmul_acts deals a one-token product
    let mut plan = Vec::with_capacity(ms.len());
    let mut n_chunks = 0;
    for (i, (m, y)) in ms.iter().zip(ys.iter()).enumerate() {
        assert_eq!(y.len(), m.n_rows, "output [1, {}]", m.n_rows);
        let n_groups = m.n_rows / GROUP_ROWS;
        let gpc = (DECODE_CHUNK_BYTES / m.group_bytes).clamp(1, n_groups.div_ceil(4).max(1));
        plan.push((i, gpc, n_chunks));
        n_chunks += n_groups.div_ceil(gpc);
    }
    let outs: Vec<OutRows> = ys.iter_mut().map(|y| OutRows(y.as_mut_ptr())).collect();
    let run_chunk = |c: usize| {
        let k = plan.partition_point(|&(_, _, first)| first <= c) - 1;
        let (i, gpc, first) = plan[k];
        let m = ms[i];
        let g0 = (c - first) * gpc;
        let g1 = (g0 + gpc).min(m.n_rows / GROUP_ROWS);
        for g in g0..g1 {
            let w = &m.bytes()[g * m.group_bytes..(g + 1) * m.group_bytes];
            // SAFETY: rows 16g..16g+16 of matrix i are written by this chunk only; every
            // output outlives the parallel run, which waits for every participant.
            unsafe { m.group(w, &acts[act_of[i]], 0, 1, &outs[i], g * GROUP_ROWS) };
        }
    };
    let total: usize = ms.iter().map(|m| m.bytes().len()).sum();
    if n_chunks <= 1 || total <= INLINE_BYTES || team.is_some_and(|t| t.n_threads() == 1) {
        (0..n_chunks).for_each(run_chunk);
    } else {
        parallel_chunks(team, n_chunks, &run_chunk);
    }
}

/// Output rows `[n_tokens, n_rows]`, written by several threads at disjoint places.
struct OutRows(*mut f32);
// SAFETY: only written at disjoint (token, group) places while the owner waits.
unsafe impl Sync for OutRows {}

/// An atomic counter alone on its 128 bytes (two cache lines: the adjacent-line prefetcher
/// pairs them).
#[repr(align(128))]
struct PaddedCounter(AtomicUsize);

/// Runs `f(c)` for every chunk `c` in `0..n_chunks` exactly once, spread over `team`'s
/// participants (or the current rayon pool's threads): each takes chunks from its own
/// contiguous region first (one sequential stream per core), then helps the others.
fn parallel_chunks(team: Option<&Team>, n_chunks: usize, f: &(dyn Fn(usize) + Sync)) {
    let n_parts = team
        .map_or_else(rayon::current_num_threads, |t| t.n_threads())
        .max(1);
    let bounds: Vec<usize> = (0..=n_parts).map(|p| p * n_chunks / n_parts).collect();
    // one cache line pair per counter: each thread bumps its own part's counter once per chunk,
    // and counters sharing a line would bounce it between the cores on every chunk
    let next: Vec<PaddedCounter> = bounds[..n_parts]
        .iter()
        .map(|&b| PaddedCounter(AtomicUsize::new(b)))
        .collect();
    let ticket = PaddedCounter(AtomicUsize::new(0));
    let job = || {
        let first = ticket.0.fetch_add(1, Ordering::Relaxed) % n_parts;
        for p in (0..n_parts).map(|i| (first + i) % n_parts) {
            loop {
                let c = next[p].0.fetch_add(1, Ordering::Relaxed);
                if c >= bounds[p + 1] {
                    break;
                }
                f(c);
            }
        }
    };
    match team {
        Some(t) => t.run(&job),
        None => {
            rayon::broadcast(|_| job());
        }
    }
}

/// Which activation preparation a weight type takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActKind {
    /// Q8_0 blocks of 32; sums = −8 · Σq per block (Q4_0's offset).
    Q4_0,
    /// Q8_0 blocks of 32; sums = −128 · Σq per block (the AVX-512 kernel dots the
    /// weights + 128, unsigned).
    Q8_0,
    /// Q8_K super-blocks; sums = the 8 sub-block (32) sums as i16 pairs, 4 words each.
    Q4K,
    /// Q8_K super-blocks; sums = −32 · Σq per 16 (Q6_K's offset), 16 words each.
    Q6K,
}

impl ActKind {
    pub fn of(ty: GgmlType) -> ActKind {
        match ty {
            GgmlType::Q4_0 => ActKind::Q4_0,
            GgmlType::Q8_0 => ActKind::Q8_0,
            GgmlType::Q4K => ActKind::Q4K,
            GgmlType::Q6K => ActKind::Q6K,
            _ => panic!("no packed kernel for {ty}"),
        }
    }
}

/// Activations `[n_tokens, n_cols]` quantized for the packed kernels: the int8 values of
/// the paired row format (Q8_0 or Q8_K, bit-identical to [`crate::quantize_activations`]),
/// its scales as f32, and per-block integer sums (see [`ActKind`]).
pub struct PackedActs {
    pub(crate) kind: ActKind,
    pub(crate) n_tokens: usize,
    pub(crate) n_cols: usize,
    /// `[n_tokens, n_cols]`.
    pub(crate) qs: Vec<i8>,
    /// `[n_tokens, n_cols / block]`: the scale of each (super-)block.
    pub(crate) d: Vec<f32>,
    /// `[n_tokens, sums_per_row]`.
    pub(crate) sums: Vec<i32>,
}

impl PackedActs {
    /// Quantizes `x`: `[n_tokens, n_cols]` f32 for weights of type `ty`.
    pub fn quantize(ty: GgmlType, x: &[f32], n_tokens: usize, n_cols: usize) -> PackedActs {
        assert_eq!(
            x.len(),
            n_tokens * n_cols,
            "activations [{n_tokens}, {n_cols}]"
        );
        let kind = ActKind::of(ty);
        let bs = ty.block_size();
        assert!(n_cols.is_multiple_of(bs), "row of {n_cols} for {ty}");
        let nd = n_cols / bs;
        let ns = sums_per_row(kind, n_cols);
        let mut acts = PackedActs {
            kind,
            n_tokens,
            n_cols,
            qs: vec![0; n_tokens * n_cols],
            d: vec![0.0; n_tokens * nd],
            sums: vec![0; n_tokens * ns],
        };
        let row_bytes = crate::activation::activation_row_bytes(ty, n_cols);
        type Row<'a> = ((&'a [f32], &'a mut [i8]), (&'a mut [f32], &'a mut [i32]));
        let prep = |((x, qs), (d, sums)): Row| {
            let mut raw = vec![0u8; row_bytes];
            quantize_activations_into(ty, x, &mut raw);
            split_row(kind, &raw, qs, d, sums);
        };
        if n_tokens >= 4 {
            use rayon::prelude::*;
            x.par_chunks(n_cols)
                .zip(acts.qs.par_chunks_mut(n_cols))
                .zip(acts.d.par_chunks_mut(nd).zip(acts.sums.par_chunks_mut(ns)))
                .for_each(prep);
        } else {
            x.chunks(n_cols)
                .zip(acts.qs.chunks_mut(n_cols))
                .zip(acts.d.chunks_mut(nd).zip(acts.sums.chunks_mut(ns)))
                .for_each(prep);
        }
        acts
    }

    pub fn kind(&self) -> ActKind {
        self.kind
    }

    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }
}

fn sums_per_row(kind: ActKind, n_cols: usize) -> usize {
    match kind {
        ActKind::Q4_0 | ActKind::Q8_0 => n_cols / 32,
        ActKind::Q4K => n_cols / 256 * 4,
        ActKind::Q6K => n_cols / 16,
    }
}

/// One quantized activation row `raw` (Q8_0 or Q8_K blocks) into the packed fields.
fn split_row(kind: ActKind, raw: &[u8], qs: &mut [i8], d: &mut [f32], sums: &mut [i32]) {
    match kind {
        ActKind::Q4_0 | ActKind::Q8_0 => {
            let offset = if kind == ActKind::Q4_0 { 8 } else { 128 };
            let blocks: &[BlockQ8_0] = cast_slice(raw);
            for (b, blk) in blocks.iter().enumerate() {
                qs[32 * b..32 * b + 32].copy_from_slice(&blk.qs);
                d[b] = f16_le(blk.d);
                sums[b] = -offset * blk.qs.iter().map(|&q| q as i32).sum::<i32>();
            }
        }
        ActKind::Q4K | ActKind::Q6K => {
            let blocks: &[BlockQ8K] = cast_slice(raw);
            for (b, blk) in blocks.iter().enumerate() {
                qs[256 * b..256 * b + 256].copy_from_slice(&blk.qs);
                d[b] = f32::from_le_bytes(blk.d);
                let bsum = |i: usize| i16::from_le_bytes(blk.bsums[i]) as i32;
                if kind == ActKind::Q4K {
                    for k in 0..4 {
                        let s0 = (bsum(4 * k) + bsum(4 * k + 1)) as i16 as u16 as u32;
                        let s1 = (bsum(4 * k + 2) + bsum(4 * k + 3)) as i16 as u16 as u32;
                        sums[4 * b + k] = (s0 | s1 << 16) as i32;
                    }
                } else {
                    for s in 0..16 {
                        sums[16 * b + s] = -32 * bsum(s);
                    }
                }
            }
        }
    }
}

// ---- repacking (scalar, once per matrix) ----------------------------------------------

/// One group of 16 Q4_0 rows (`src`: 16 rows of `nb` blocks) into `dst`.
fn pack_q4_0(src: &[u8], dst: &mut [u8], nb: usize) {
    let blocks: &[BlockQ4_0] = cast_slice(src);
    for r in 0..GROUP_ROWS {
        for b in 0..nb {
            let blk = &blocks[r * nb + b];
            let pair = 576 * (b / 2);
            let d = pair + 32 * (b % 2) + 2 * r;
            dst[d..d + 2].copy_from_slice(&blk.d);
            for k in 0..4 {
                let o = pair + 64 + 256 * (b % 2) + 64 * k + 4 * r;
                dst[o..o + 4].copy_from_slice(&blk.qs[4 * k..4 * k + 4]);
            }
        }
    }
}

/// One group of 16 Q8_0 rows (`src`: 16 rows of `nb` blocks) into `dst`.
fn pack_q8_0(src: &[u8], dst: &mut [u8], nb: usize) {
    let blocks: &[BlockQ8_0] = cast_slice(src);
    for r in 0..GROUP_ROWS {
        for b in 0..nb {
            let blk = &blocks[r * nb + b];
            let pair = 1088 * (b / 2);
            let d = pair + 32 * (b % 2) + 2 * r;
            dst[d..d + 2].copy_from_slice(&blk.d);
            let q: &[u8] = cast_slice(&blk.qs);
            for k in 0..8 {
                let o = pair + 64 + 512 * (b % 2) + 64 * k + 4 * r;
                dst[o..o + 4].copy_from_slice(&q[4 * k..4 * k + 4]);
            }
        }
    }
}

/// Scale and min `j` (0..8) of a Q4_K block, 6 bits each (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// One group of 16 Q4_K rows into `dst` (`nb` super-blocks of 2368 bytes).
fn pack_q4_k(src: &[u8], dst: &mut [u8], nb: usize) {
    let blocks: &[BlockQ4K] = cast_slice(src);
    for r in 0..GROUP_ROWS {
        for b in 0..nb {
            let blk = &blocks[r * nb + b];
            let o = &mut dst[2368 * b..2368 * (b + 1)];
            o[2 * r..2 * r + 2].copy_from_slice(&blk.d);
            o[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&blk.dmin);
            for s in 0..8 {
                let (sc, m) = scale_min_k4(s, &blk.scales);
                o[64 + 16 * s + r] = sc;
                o[192 + 32 * (s / 2) + 2 * r + s % 2] = m;
            }
            for j in 0..32 {
                let q = 320 + 64 * j + 4 * r;
                o[q..q + 4].copy_from_slice(&blk.qs[4 * j..4 * j + 4]);
            }
        }
    }
}

/// One group of 16 Q6_K rows into `dst` (`nb` super-blocks of 3392 bytes; layout in
/// `avx512::q6_k`).
fn pack_q6_k(src: &[u8], dst: &mut [u8], nb: usize) {
    let blocks: &[BlockQ6K] = cast_slice(src);
    for r in 0..GROUP_ROWS {
        for b in 0..nb {
            let blk = &blocks[r * nb + b];
            let o = &mut dst[3392 * b..3392 * (b + 1)];
            o[2 * r..2 * r + 2].copy_from_slice(&blk.d);
            for s in 0..16 {
                o[64 + 16 * s + r] = blk.scales[s] as u8;
            }
            for q in 0..4 {
                let (h, lh) = (q / 2, q % 2);
                let base = 320 + 768 * q + 4 * r;
                for i in 0..4 {
                    let (ja, jb, jh) = (
                        16 * h + 4 * lh + i,
                        16 * h + 8 + 4 * lh + i,
                        8 * h + 4 * lh + i,
                    );
                    o[base + 64 * i..][..4].copy_from_slice(&blk.ql[4 * ja..4 * ja + 4]);
                    o[base + 256 + 64 * i..][..4].copy_from_slice(&blk.ql[4 * jb..4 * jb + 4]);
                    o[base + 512 + 64 * i..][..4].copy_from_slice(&blk.qh[4 * jh..4 * jh + 4]);
                }
            }
        }
    }
}
