// matvec_quant.cu — y = W x for ggml block-quantized W, and the activation quantizer.
//
// Design (llama.cpp MMVQ-like, own code):
// - x: [n_tokens, ncols] f32 is first quantized on the device to q8_1-style int8
//   (`quantize_q8_1`): xq [n_tokens, ncols] int8 plus xds [n_tokens, ncols/32] float2
//   (d, d * sum(q)) per 32 elements, so every weight format dots with dp4a.
// - W: [nrows, ncols] in GGUF block layout, uploaded byte-for-byte (rows of row_bytes bytes;
//   the allocation has >= 16 bytes of padding after the last row). Blocks of odd sizes
//   (18, 22, 34, 110, 210 bytes) are not 16-byte aligned, so each warp stages a group of
//   blocks (2048 weights of a row) through shared memory with aligned, coalesced 16-byte loads
//   (the group's byte range rounded out to 16 bytes), then each lane decodes one "task" (two
//   32-element units, see quant_formats.cuh `Decode2`) from there.
// - One warp computes R rows at once (v3): per group it loads the R rows' bytes (R groups in
//   flight), loads this lane's x (q8_1 int8 + scales, XT tokens at a time) into registers once,
//   and dots it with each row's decoded task. v2 (R = 1) re-read x from L1 for every row: x is
//   1.25 bytes per weight against 0.56 for Q4_K, and the L1/shared pipe (128 B/clk/SM), not
//   DRAM, was the limit. The loads of group g+1 are issued right after group g is stored to
//   shared memory, so they are in flight while group g is computed.
// - The weights are read once for all n_tokens <= NT tokens (small-batch decode).
// y: [n_tokens, nrows] f32.
#include "matvec_common.cuh"
#include "quant_formats.cuh"

struct alignas(8) float2v {
    float x, y;
};

// Resident blocks per SM a kernel is compiled for (a register cap; 0: the compiler's choice),
// per format, tokens and rows per warp. The cheaper Q6_K decode (unsigned dp4a, x half sums)
// left to itself takes 175 registers at 4 rows (2 blocks per SM instead of 3) and 126 at 2
// (4 instead of 5): capped, and the 32B/27B decode steps ~2 % faster (BENCHMARKS.md). The cap at
// 2 rows leaves a 64-byte stack of spills (LDL / STL in the loop; scripts/sass-stats.sh).
// Two tokens at 4 rows took 250 registers (2 blocks an SM: the 27B's 320-block down projection
// in 1.2 waves of an H100's 264 places): capped at 3 blocks (168 registers, a 56-byte stack) the
// two-token down projection went from 45.8 to 36.8 µs (one token: 31.1) and the 27B's verify
// pass of 2 rows from 9.60 to 9.38 ms (session 27). 4 tokens at 2 rows: 212 -> 168 registers.
template <typename F, int NT, int R> struct MvMinBlocks { static constexpr int value = 0; };
template <> struct MvMinBlocks<FmtQ6_K, 1, 4> { static constexpr int value = 3; };
template <> struct MvMinBlocks<FmtQ6_K, 1, 2> { static constexpr int value = 5; };
template <> struct MvMinBlocks<FmtQ6_K, 2, 4> { static constexpr int value = 3; };
template <> struct MvMinBlocks<FmtQ6_K, 2, 2> { static constexpr int value = 4; };
template <> struct MvMinBlocks<FmtQ6_K, 4, 2> { static constexpr int value = 3; };

// x: [n_tokens, ncols] f32 -> xq int8 and xds (d, d*sum q) per 32 elements (xds may be tagged:
// the tiled layout, common.cuh q8_1_at).
// grid: (ncols/32 / 8 rounded up, n_tokens), block (32, 8): one warp per 32 elements.
static __device__ __forceinline__ void quantize_q8_1_body(const float* __restrict__ x, int8_t* __restrict__ xq,
                                                          float* xds, int ncols) {
    const int unit = blockIdx.x * blockDim.y + threadIdx.y;
    const int t = blockIdx.y;
    if (unit * 32 >= ncols) return;
    const long long i = (long long)t * ncols + unit * 32 + threadIdx.x;
    q8_1_unit(x[i], xq, xds, i, (long long)t * (ncols / 32) + unit);
}

extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, int8_t* __restrict__ xq, float* xds,
                                         int ncols) {
    quantize_q8_1_body(x, xq, xds, ncols);
}

// quantize_q8_1 for launches with programmatic serialization (REDLINE_PDL): waits for the
// kernel that wrote x.
extern "C" __global__ void quantize_q8_1_pdl(const float* __restrict__ x, int8_t* __restrict__ xq, float* xds,
                                             int ncols) {
    pdl_wait();
    pdl_trigger();
    quantize_q8_1_body(x, xq, xds, ncols);
}

// One staged group in registers: this lane's share of the group's 16-byte vectors.
template <int L>
struct Staged {
    u32x4 r[L];
    int off;   // offset of the group's first byte within its first vector
    int nvec;  // vectors in the group
};


template <int L>
static __device__ __forceinline__ void mv_load_group(const uint8_t* W, long long start, int len, int lane, Staged<L>& s,
                                                     int load_mode) {
    const long long a0 = start & ~15ll;
    s.off = (int)(start - a0);
    s.nvec = (s.off + len + 15) >> 4;
    const u32x4* src = (const u32x4*)(W + a0);
#pragma unroll
    for (int k = 0; k < L; k++) {
        const int i = lane + 32 * k;
        if (i < s.nvec) s.r[k] = ld_weights(src + i, load_mode);
    }
}

template <int L>
static __device__ __forceinline__ void mv_store_group(const Staged<L>& s, u32x4* sbuf, int lane) {
#pragma unroll
    for (int k = 0; k < L; k++) {
        const int i = lane + 32 * k;
        if (i < s.nvec) sbuf[i] = s.r[k];
    }
}

// This lane's x for one task (two 32-element units) and XT tokens, in registers; sx: the
// sums of q over each 16-element half, for the formats that need them (HALF_MIN, a BIAS).
template <int XT>
struct TaskX {
    int q[XT][2][8];
    float d[XT][2], s[XT][2];
    int sx[XT][2][2];
};

template <typename F>
static __device__ __forceinline__ constexpr bool needs_half_sums() {
    return F::HALF_MIN || Decode2Traits<F>::BIAS != 0;
}

// Sums of the int8 q over the two 16-element halves of a 32-element unit.
static __device__ __forceinline__ void half_sums(const int q[8], int sx[2]) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) s0 = dp4a(0x01010101, q[i], s0);
#pragma unroll
    for (int i = 4; i < 8; i++) s1 = dp4a(0x01010101, q[i], s1);
    sx[0] = s0;
    sx[1] = s1;
}

template <typename F>
static __device__ __forceinline__ float task_dot(const Task& tk, const int q[2][8], const float d[2], const float s[2],
                                                 const int sx[2][2], bool second_ok) {
    using Tr = Decode2Traits<F>;
    float r = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        if (j == 0 || second_ok) {
            int sumi0 = 0, sumi1 = 0;
            if constexpr (Tr::UNSIGNED) {
#pragma unroll
                for (int i = 0; i < 4; i++) sumi0 = dp4a_us((uint32_t)tk.v[j][i], q[j][i], sumi0);
#pragma unroll
                for (int i = 4; i < 8; i++) sumi1 = dp4a_us((uint32_t)tk.v[j][i], q[j][i], sumi1);
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) sumi0 = dp4a(tk.v[j][i], q[j][i], sumi0);
#pragma unroll
                for (int i = 4; i < 8; i++) sumi1 = dp4a(tk.v[j][i], q[j][i], sumi1);
            }
            if constexpr (Tr::BIAS != 0) {
                sumi0 -= Tr::BIAS * sx[j][0];
                sumi1 -= Tr::BIAS * sx[j][1];
            }
            float r_j;
            if constexpr (F::SPLIT) {
                r_j = d[j] * (tk.s0[j] * (float)sumi0 + tk.s1[j] * (float)sumi1);
            } else {
                r_j = d[j] * tk.s0[j] * (float)(sumi0 + sumi1);
            }
            if constexpr (F::HAS_MIN) r_j += tk.m0[j] * s[j];
            if constexpr (F::HALF_MIN) r_j += d[j] * (tk.m0[j] * (float)sx[j][0] + tk.m1[j] * (float)sx[j][1]);
            r += r_j;
        }
    }
    return r;
}

// Geometry of the staged groups of a format. A lane task is two 32-element units: two blocks
// of a 32-wide format, or 1/4 of a 256-wide super-block. A staged group is 32 tasks (2048
// weights), one per lane.
template <typename F>
struct MvGeom {
    static constexpr int TASKS_PER_BLOCK = F::UNITS == 1 ? 1 : F::UNITS / 2;
    static constexpr int BLOCKS_PER_TASK = F::UNITS == 1 ? 2 : 1;
    static constexpr int G = 32 * BLOCKS_PER_TASK / TASKS_PER_BLOCK;  // blocks per group
    static constexpr int BLOCK_ELEMS = 32 * F::UNITS;
    // 16-byte vectors per lane to cover a group plus up to 30 bytes of alignment slack
    static constexpr int L = ((G * F::BLOCK_BYTES + 30 + 15) / 16 + 31) / 32;
    // one staging buffer per row, plus one vector of slack for ldw_a2's over-read
    static constexpr int SV = 32 * L + 1;
};

// acc[r][t] += this lane's share of group g (nb blocks) of R rows staged in shared memory at
// sbytes + off[r], dotted with the q8_1 x of n_tokens <= NT tokens.
template <typename F, int NT, int R>
static __device__ __forceinline__ void mv_group_dot(const uint8_t* sbytes, const int (&off)[R],
                                                    const int8_t* __restrict__ xq, const float* __restrict__ xds,
                                                    int ncols, int n_tokens, int g, int nb, int lane,
                                                    bool tiled, float (&acc)[R][NT]) {
    using Ge = MvGeom<F>;
    // tokens whose x is held in registers at once (x of 4 tokens = 80 registers)
    constexpr int XT = NT < 4 ? NT : (R <= 2 ? 4 : 2);
    const int n_units_x = ncols / 32;
    const int blk = (lane / Ge::TASKS_PER_BLOCK) * Ge::BLOCKS_PER_TASK;  // this lane's block in the group
    const int task = lane % Ge::TASKS_PER_BLOCK;
    if (blk >= nb) return;
    int tu[2];
    Decode2<F>::units(task, tu);
    // the second block of a 32-wide task may lie past the row's end
    const bool second_ok = Ge::BLOCKS_PER_TASK == 1 || blk + 1 < nb;
    const int xu0 = (g * Ge::G + blk) * F::UNITS;  // first unit of this lane's block in the row
#pragma unroll
    for (int tp = 0; tp < NT; tp += XT) {
        if (tp < n_tokens) {
            TaskX<XT> xr;
#pragma unroll
            for (int t = 0; t < XT; t++) {
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int tt = min(tp + t, n_tokens - 1);
                    const int xu = xu0 + (j == 1 && !second_ok ? 0 : tu[j]);
                    // (tiled: ncols % 512 == 0, so the row-relative position is the flat one)
                    const int8_t* xrow = xq + (long long)tt * ncols;
                    const u32x4 xa = *(const u32x4*)(xrow + q8_1_at(32 * xu, tiled));
                    const u32x4 xb = *(const u32x4*)(xrow + q8_1_at(32 * xu + 16, tiled));
                    xr.q[t][j][0] = (int)xa.x; xr.q[t][j][1] = (int)xa.y;
                    xr.q[t][j][2] = (int)xa.z; xr.q[t][j][3] = (int)xa.w;
                    xr.q[t][j][4] = (int)xb.x; xr.q[t][j][5] = (int)xb.y;
                    xr.q[t][j][6] = (int)xb.z; xr.q[t][j][7] = (int)xb.w;
                    const float2v ds = ((const float2v*)xds)[(long long)tt * n_units_x + xu];
                    xr.d[t][j] = ds.x;
                    xr.s[t][j] = ds.y;
                    if constexpr (needs_half_sums<F>()) half_sums(xr.q[t][j], xr.sx[t][j]);
                }
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                Task tk;
                Decode2<F>::run(sbytes + off[r] + blk * F::BLOCK_BYTES, task, tk);
#pragma unroll
                for (int t = 0; t < XT; t++) {
                    if (tp + t < n_tokens) acc[r][tp + t] += task_dot<F>(tk, xr.q[t], xr.d[t], xr.s[t], xr.sx[t], second_ok);
                }
            }
        }
    }
}

// Copies x (q8_1 of n_tokens tokens: the int8 values, then from the next 16-byte boundary the
// (d, d * sum) pairs) into this block's dynamic shared memory, every thread of the block.
static __device__ __forceinline__ void mv_stage_x(const int8_t* __restrict__ xq, const float* __restrict__ xds,
                                                  int ncols, int n_tokens, uint8_t* xs) {
    const int tid = threadIdx.y * 32 + threadIdx.x, nth = 32 * MV_WARPS;
    const int qbytes = n_tokens * ncols;  // a multiple of 32
    for (int i = tid; i < qbytes / 16; i += nth) ((u32x4*)xs)[i] = ((const u32x4*)xq)[i];
    const int nds = n_tokens * (ncols / 32);
    float2v* ds = (float2v*)(xs + qbytes);
    for (int i = tid; i < nds; i += nth) ds[i] = ((const float2v*)xds)[i];
}

// This lane's partial dot products acc[r][t] of rows [row0, row0 + R) (rows past nrows
// are computed on a duplicate of the last row) over the groups g_first, g_first + g_step, ...
// of the rows. Only __syncwarp inside, but for XS's one __syncthreads after x is staged (every
// warp of the block must get there: mvm_quant's warps past the last row stage and meet it too).
// XS: x is staged in the block's dynamic shared memory (the two-token mvm _xs kernels,
// REDLINE_MV_XSMEM): its loads in the dot are then shared-memory loads, not L1/L2 round trips
// that queue behind the weight stream (ncu on the H200: 14 % of the one-token Q4_K gate/up
// kernel's stall samples were its first dp4a waiting for x, as many as its wait for weights).
template <typename F, int NT, int R, bool PDL = false, bool XS = false>
static __device__ __forceinline__ void mv_quant_rows(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                                     const float* __restrict__ xds, int nrows, int ncols,
                                                     long long row_bytes, int n_tokens, int load_mode, int row0,
                                                     int g_first, int g_step, float (&acc)[R][NT]) {
    using Ge = MvGeom<F>;
    TRACE_SCOPE(TRACE_MVM);
    // load_mode bit 8: x is in the tiled q8_1 layout (common.cuh q8_1_at)
    const bool tiled = (load_mode & 256) != 0;
    load_mode &= 255;
    constexpr int G = Ge::G, L = Ge::L, SV = Ge::SV;
    __shared__ u32x4 stage[MV_WARPS][R * SV];
    const int lane = threadIdx.x;
    u32x4* sbuf = stage[threadIdx.y];
    const uint8_t* sbytes = (const uint8_t*)sbuf;
    const int nblocks = ncols / Ge::BLOCK_ELEMS;
    const int ngroups = (nblocks + G - 1) / G;
    long long row_start[R];
#pragma unroll
    for (int r = 0; r < R; r++) row_start[r] = (long long)min(row0 + r, nrows - 1) * row_bytes;

#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    auto group_len = [&](int g) { return min(G, nblocks - g * G) * F::BLOCK_BYTES; };
    Staged<L> st[R];
    if (g_first < ngroups) {
        const long long gofs = (long long)g_first * G * F::BLOCK_BYTES;
#pragma unroll
        for (int r = 0; r < R; r++) mv_load_group(W, row_start[r] + gofs, group_len(g_first), lane, st[r], load_mode);
    }
    if constexpr (PDL) {
        // the first group's weights are in flight; x comes from the previous kernel
        pdl_wait();
        TRACE_WAITED(TRACE_MVM);
        pdl_trigger();
    }
    if constexpr (XS) {
        extern __shared__ u32x4 mv_xs[];
        mv_stage_x(xq, xds, ncols, n_tokens, (uint8_t*)mv_xs);
        __syncthreads();
        xq = (const int8_t*)mv_xs;
        xds = (const float*)((const uint8_t*)mv_xs + n_tokens * ncols);
    }
    for (int g = g_first; g < ngroups; g += g_step) {
        const int nb = min(G, nblocks - g * G);
        int off[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            mv_store_group(st[r], sbuf + r * SV, lane);
            off[r] = st[r].off + r * SV * 16;
        }
        __syncwarp();
        if (g + g_step < ngroups) {
            const long long gofs = (long long)(g + g_step) * G * F::BLOCK_BYTES;
#pragma unroll
            for (int r = 0; r < R; r++)
                mv_load_group(W, row_start[r] + gofs, group_len(g + g_step), lane, st[r], load_mode);
        }
        mv_group_dot<F, NT, R>(sbytes, off, xq, xds, ncols, n_tokens, g, nb, lane, tiled, acc);
        __syncwarp();
    }
}

// Block of MV_WARPS warps = MV_WARPS / ksplit row sets of R rows; the ksplit warps of a set
// split its rows' groups (g = k, k + ksplit, ...) and their partial sums meet in shared
// memory. ksplit > 1 shortens each warp's chain of dependent load rounds (a 5120-wide Q4_K
// row is 3 groups, a 27648-wide one 14); measured on the H200 it loses 5-40 % almost
// everywhere, so the host uses 1 and keeps 2 / 4 as a benchmark knob.
template <typename F, int NT, int R>
static __device__ __forceinline__ void mv_quant(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                                const float* __restrict__ xds, float* __restrict__ y, int nrows,
                                                int ncols, long long row_bytes, int n_tokens, int load_mode,
                                                int ksplit) {
    const int lane = threadIdx.x, wid = threadIdx.y;
    const int set = wid / ksplit, k = wid % ksplit;
    const int row0 = (blockIdx.x * (MV_WARPS / ksplit) + set) * R;
    float acc[R][NT];
    // a row set past the last row computes nothing (with ksplit > 1 it must still meet the
    // barrier below; with ksplit == 1 there is none and the warp leaves)
    if (ksplit == 1 && row0 >= nrows) return;
    const int g_first = row0 < nrows ? k : 1 << 30;
    mv_quant_rows<F, NT, R>(W, xq, xds, nrows, ncols, row_bytes, n_tokens, load_mode, min(row0, nrows - 1), g_first,
                            ksplit, acc);
    __shared__ float red[MV_WARPS][R][NT];
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = warp_sum(acc[r][t]);
            if (ksplit == 1) {
                if (lane == 0 && t < n_tokens && row0 + r < nrows) y[(long long)t * nrows + row0 + r] = s;
            } else if (lane == 0) {
                red[wid][r][t] = s;
            }
        }
    }
    if (ksplit == 1) return;
    __syncthreads();
    if (k == 0 && lane < R * NT) {
        const int r = lane / NT, t = lane % NT;
        float s = 0.0f;
        for (int j = 0; j < ksplit; j++) s += red[wid + j][r][t];
        if (t < n_tokens && row0 + r < nrows) y[(long long)t * nrows + row0 + r] = s;
    }
}

// One kernel per (format, NT, R); n_tokens <= NT tokens are computed, the weights read once,
// R rows per warp, ksplit (1, 2 or 4) warps per row set.
#define MV_KERNEL(name, F, NT, R)                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, (MvMinBlocks<F, NT, R>::value))                                       \
        mv_##name##_n##NT##_r##R(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,        \
                                 const float* __restrict__ xds, float* __restrict__ y, int nrows,      \
                                 int ncols, long long row_bytes, int n_tokens, int load_mode,          \
                                 int ksplit) {                                                         \
        mv_quant<F, NT, R>(W, xq, xds, y, nrows, ncols, row_bytes, n_tokens, load_mode, ksplit);      \
    }
#define MV_FORMAT(name, F)                                                                              \
    MV_KERNEL(name, F, 1, 2) MV_KERNEL(name, F, 1, 4)                                                   \
    MV_KERNEL(name, F, 2, 2) MV_KERNEL(name, F, 2, 4) MV_KERNEL(name, F, 4, 2) MV_KERNEL(name, F, 4, 4)  \
    MV_KERNEL(name, F, 8, 2) MV_KERNEL(name, F, 8, 4)

MV_FORMAT(q4_0, FmtQ4_0)
MV_FORMAT(q4_1, FmtQ4_1)
MV_FORMAT(q5_0, FmtQ5_0)
MV_FORMAT(q5_1, FmtQ5_1)
MV_FORMAT(q8_0, FmtQ8_0)
MV_FORMAT(iq4_nl, FmtIQ4_NL)
MV_FORMAT(iq4_xs, FmtIQ4_XS)
MV_FORMAT(q2_k, FmtQ2_K)
MV_FORMAT(q3_k, FmtQ3_K)
MV_FORMAT(q4_k, FmtQ4_K)
MV_FORMAT(q5_k, FmtQ5_K)
MV_FORMAT(q6_k, FmtQ6_K)

// ---- several matrices and an epilogue in one launch (decode fusion) -------------------------
//
// Products that read the same x (Q/K/V, gate/up, the DeltaNet input projections) and share a
// weight format run as one launch over their concatenated rows: more bytes per launch (a
// 15-50 MB launch spends much of its time ramping up and draining, BENCHMARKS.md matvec v3),
// one launch instead of several. Segment s owns blocks [block0[s], block0[s+1]); each keeps its
// own matrix, output, optional f32 bias and accumulate flag (y += W x: the residual add), so
// bias and residual adds need no launch of their own. n_tokens <= NT tokens (one for decode of
// one sequence; several for batched decode and speculative verify passes), the weights read
// once for all of them; y of token t is y + t * nrows.

template <typename F, int NT, int R, bool XS = false>
static __device__ __forceinline__ void mvm_quant(const MvSegs& p, const int8_t* __restrict__ xq,
                                                 const float* __restrict__ xds, int n_tokens, int load_mode) {
    const MvSegSel sel = mv_select(p);
    const int lane = threadIdx.x;
    const int row0 = (((int)blockIdx.x - sel.block0) * MV_WARPS + threadIdx.y) * R;
    if (row0 >= sel.nrows) {
        if constexpr (XS) {
            // a warp past the last row still helps stage x and meets the block's barrier
            extern __shared__ u32x4 mv_xs[];
            pdl_wait();
            pdl_trigger();
            mv_stage_x(xq, xds, p.ncols, n_tokens, (uint8_t*)mv_xs);
            __syncthreads();
        }
        return;
    }
    // the epilogue's bias (a weight) toward L2 now, so its DRAM round trip is not in the tail
    if (sel.bias && lane == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(sel.bias + row0));
    float acc[R][NT];
    mv_quant_rows<F, NT, R, true, XS>(sel.W, xq, xds, sel.nrows, p.ncols, p.row_bytes, n_tokens, load_mode, row0, 0,
                                      1, acc);
    mv_seg_store<NT, R>(sel, row0, acc, n_tokens, lane);
}

// NT = 1 keeps the one-token kernels' names (mvm_<fmt>_r<R>); n_tokens is then 1.
#define MVM_KERNEL(name, F, R)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, (MvMinBlocks<F, 1, R>::value))                                       \
        mvm_##name##_r##R(const MvSegs p, const int8_t* __restrict__ xq, const float* __restrict__ xds,  \
                          int load_mode) {                                                             \
        mvm_quant<F, 1, R>(p, xq, xds, 1, load_mode);                                                  \
    }
#define MVM_KERNEL_NT(name, F, NT, R)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, (MvMinBlocks<F, NT, R>::value))      \
        mvm_##name##_n##NT##_r##R(const MvSegs p, const int8_t* __restrict__ xq,                      \
                                  const float* __restrict__ xds, int n_tokens, int load_mode) {        \
        mvm_quant<F, NT, R>(p, xq, xds, n_tokens, load_mode);                                          \
    }
#define MVM_FORMAT(name, F)                                                                             \
    MVM_KERNEL(name, F, 2) MVM_KERNEL(name, F, 4)                                                       \
    MVM_KERNEL_NT(name, F, 2, 2) MVM_KERNEL_NT(name, F, 2, 4) MVM_KERNEL_NT(name, F, 4, 2)             \
    MVM_KERNEL_NT(name, F, 4, 4) MVM_KERNEL_NT(name, F, 8, 2) MVM_KERNEL_NT(name, F, 8, 4)

// Two-token Q4_K / Q6_K segment kernels with x staged in shared memory, mvm_<fmt>_n2_r<R>_xs,
// launched with the staged x's bytes of dynamic shared memory (the default for 2 tokens;
// REDLINE_MV_XSMEM=0: the kernels above). At one token the staging lost (H100: 32B 104.0 ->
// 102.8 tok/s); at two it won (27B two streams 188 -> 192, verify k = 2 10.56 -> 10.45 ms).
#define MVM_KERNEL_XS(name, F, R)                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, (MvMinBlocks<F, 2, R>::value))       \
        mvm_##name##_n2_r##R##_xs(const MvSegs p, const int8_t* __restrict__ xq,                      \
                                  const float* __restrict__ xds, int n_tokens, int load_mode) {        \
        mvm_quant<F, 2, R, true>(p, xq, xds, n_tokens, load_mode);                                     \
    }
MVM_KERNEL_XS(q4_k, FmtQ4_K, 2) MVM_KERNEL_XS(q4_k, FmtQ4_K, 4)
MVM_KERNEL_XS(q6_k, FmtQ6_K, 2) MVM_KERNEL_XS(q6_k, FmtQ6_K, 4)

MVM_FORMAT(q4_0, FmtQ4_0)
MVM_FORMAT(q4_1, FmtQ4_1)
MVM_FORMAT(q5_0, FmtQ5_0)
MVM_FORMAT(q5_1, FmtQ5_1)
MVM_FORMAT(q8_0, FmtQ8_0)
MVM_FORMAT(iq4_nl, FmtIQ4_NL)
MVM_FORMAT(iq4_xs, FmtIQ4_XS)
MVM_FORMAT(q2_k, FmtQ2_K)
MVM_FORMAT(q3_k, FmtQ3_K)
MVM_FORMAT(q4_k, FmtQ4_K)
MVM_FORMAT(q5_k, FmtQ5_K)
MVM_FORMAT(q6_k, FmtQ6_K)
