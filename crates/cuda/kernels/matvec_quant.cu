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
#include "quant_formats.cuh"
#include "segments.cuh"

struct alignas(16) u32x4 {
    uint32_t x, y, z, w;
};
struct alignas(8) float2v {
    float x, y;
};

#define MV_WARPS 4

// Resident blocks per SM a one-token kernel is compiled for (a register cap; 0: the compiler's
// choice), per format and rows per warp. The cheaper Q6_K decode (unsigned dp4a, x half sums)
// left to itself takes 175 registers at 4 rows (2 blocks per SM instead of 3) and 126 at 2
// (4 instead of 5): capped, no spills, and the 32B/27B decode steps ~2 % faster (BENCHMARKS.md).
template <typename F, int NT, int R> struct MvMinBlocks { static constexpr int value = 0; };
template <> struct MvMinBlocks<FmtQ6_K, 1, 4> { static constexpr int value = 3; };
template <> struct MvMinBlocks<FmtQ6_K, 1, 2> { static constexpr int value = 5; };

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

// Weight loads. The weights stream through once; x (read by every row) must stay in L1.
// load_mode 0: plain ld.global; 1: ld.global.cs (evict-first); 2: ld.global.nc with
// L1::no_allocate (the weights bypass L1 entirely).
static __device__ __forceinline__ u32x4 ld_weights(const u32x4* p, int load_mode) {
    u32x4 v;
    if (load_mode == 2) {
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else if (load_mode == 1) {
        asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else {
        v = *p;
    }
    return v;
}

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
// Warp sums of acc and the stores of rows [row0, row0 + R) of segment sel (bias, residual).
template <int NT, int R>
static __device__ __forceinline__ void mv_seg_store(const MvSegSel& sel, int row0, const float (&acc)[R][NT],
                                                    int n_tokens, int lane) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = row0 + r;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float s = warp_sum(acc[r][t]);
            if (lane == 0 && row < sel.nrows && t < n_tokens) {
                float* yp = sel.y + (long long)t * sel.nrows + row;
                float v = s;
                if (sel.bias) v += sel.bias[row];
                if (sel.accumulate) v += *yp;
                *yp = v;
            }
        }
    }
}

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
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                       \
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
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                       \
        mvm_##name##_n2_r##R##_xs(const MvSegs p, const int8_t* __restrict__ xq,                      \
                                  const float* __restrict__ xds, int n_tokens, int load_mode) {        \
        mvm_quant<F, 2, R, true>(p, xq, xds, n_tokens, load_mode);                                     \
    }
MVM_KERNEL_XS(q4_k, FmtQ4_K, 2) MVM_KERNEL_XS(q4_k, FmtQ4_K, 4)
MVM_KERNEL_XS(q6_k, FmtQ6_K, 2) MVM_KERNEL_XS(q6_k, FmtQ6_K, 4)

// The two-token Q6_K kernel at 4 rows compiled for 3 blocks per SM (168 registers, 40 bytes of
// stack: 34 spill loads and stores) instead of the compiler's 255 registers (2 blocks): the
// 5120-row down projections' 320 blocks then fit an H100 / H200 in one wave instead of 1.2
// (REDLINE_MV_Q6_CAP=1, an experiment; session 18 found the 27B's Q6_K down at 2 tokens 41 %
// slower than at one, 35.8 -> 50.4 us, for this reason).
extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, 3)
    mvm_q6_k_n2_r4_xs_b3(const MvSegs p, const int8_t* __restrict__ xq, const float* __restrict__ xds, int n_tokens,
                         int load_mode) {
    mvm_quant<FmtQ6_K, 2, 4, true>(p, xq, xds, n_tokens, load_mode);
}

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

// ---- Q4_K / IQ4_XS with the weights loaded straight into registers (REDLINE_MV_DIRECT) ------
//
// Why: the kernels above are issue bound at one token (547 warp instructions a 4-row group
// iteration, 0.12 per weight byte for Q4_K; IQ4_XS ~0.23; BENCHMARKS.md sessions 11, 19): every
// weight byte is loaded, stored to shared memory and loaded again, and the decode's addresses
// come from run-time offsets into the staging buffers. Q4_K super-blocks are 144 = 9 x 16 bytes
// and IQ4_XS ones 136 = 17 x 8, so in rows of whole super-blocks each starts 16- (8-) byte
// aligned and a lane can load its share of the weights into the registers it computes from.
//
// A warp's iteration: 4 consecutive super-blocks of each of its R rows; lanes 8s .. 8s + 7 own
// super-block s, each loading the super-block's header (the 8 lanes load one address) and its
// own 16 bytes of quants (the format's MvdFmt below says which and how they decode). Every
// address is a pointer advanced by a constant: x's too, since within a 512-value tile a lane's
// pieces keep their place in every iteration, tiled q8_1 or not. Two iterations are in flight
// (registers, unrolled by two: the second's loads take immediate offsets). Rows of a multiple of
// 1024 values (whole iterations: every Q4_K / IQ4_XS product of the supported models);
// n_tokens <= NT tokens (1 or 2), the per-row decode shared by the tokens, the per-token
// arithmetic the same at both counts (so a row's result does not depend on the token count).

// v, passed through an empty asm: the compiler must keep it in a register. Without this it
// rebuilt every address from the row index and row_bytes, and the lane constants, in every
// iteration (~40 instructions).
template <typename T>
static __device__ __forceinline__ T* mvd_pin(T* p) {
    asm volatile("" : "+l"(p));
    return p;
}
static __device__ __forceinline__ void mvd_pin(uint32_t& v) { asm volatile("" : "+r"(v)); }

// x (read by every warp: through L1), as global loads (the pinned pointers lost their space).
static __device__ __forceinline__ u32x4 mvd_ld_x(const void* p) {
    u32x4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
static __device__ __forceinline__ float mvd_ld_xf(const float* p) {
    float v;
    asm("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
// weights (streamed once): ld.global.nc.L1::no_allocate (load mode 2, the default; the other
// modes are not compiled in here)
static __device__ __forceinline__ u32x4 mvd_ld_w16(const uint8_t* p) { return ld_weights((const u32x4*)p, 2); }
static __device__ __forceinline__ uint2 mvd_ld_w8(const uint8_t* p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// Q4_K: lane v = lane % 8 of a super-block takes qs bytes [16 v, 16 v + 16): elements 16 h ..
// 16 h + 15 of sub-block 2 j in the low nibbles and of sub-block 2 j + 1 in the high ones
// (j = v / 2, h = v % 2), and the 16-byte header (d, dmin, 12 scale bytes). The low nibbles dot
// with x's 16 bytes of sub-block 2 j, the high ones, left in place (16 x their value,
// dp4a.u32.s32; exact, the scale takes 1 / 16), with those of 2 j + 1; the min terms (dmin m
// times the q8_1 unit's d * sum q) are split between the pair's lanes (sub-block 2 j + h's each).
struct MvdQ4K {
    static constexpr int SB = 144;
    struct W {
        u32x4 q, hd;
    };
    struct X {  // one token
        u32x4 a, b;            // this lane's 16 x values of sub-blocks 2j and 2j + 1
        float d0, d1, s;       // q8_1 d of both units (d1 / 16), d * sum q of unit 2j + h
    };
    struct D {  // one row's decode
        float d, dmin, mh;
        int sc0, sc1;
        uint32_t lo[4], hi[4];
    };
    struct C {  // lane constants: prmt selectors of the sub-blocks' bytes in {hi4 : lo4}
        uint32_t sel0, sel1, selh;  // (zero-extended: sign replication of a byte < 64)
        bool h0;
    };
    static __device__ __forceinline__ C consts(int lane) {
        const int v = lane & 7, j = v >> 1, h = v & 1;
        const uint32_t i0 = (j < 2 ? 0 : 4) + 2 * (j & 1), i1 = i0 + 1;
        C c;
        c.sel0 = i0 | ((8 | i0) * 0x1110u);
        c.sel1 = i1 | ((8 | i1) * 0x1110u);
        c.selh = h == 0 ? c.sel0 : c.sel1;
        c.h0 = h == 0;
        mvd_pin(c.sel0);
        mvd_pin(c.sel1);
        mvd_pin(c.selh);
        return c;
    }
    // the lane's quants within its super-block; its x pieces (values within a 1024-value
    // iteration) and its (d, d * sum) pairs (floats from the iteration's first)
    static __device__ __forceinline__ int qofs(int lane) { return 16 + 16 * (lane & 7); }
    static __device__ __forceinline__ int xe0(int lane) {
        return 256 * (lane >> 3) + 64 * ((lane & 7) >> 1) + 16 * (lane & 1);
    }
    static __device__ __forceinline__ int xe1(int lane) { return xe0(lane) + 32; }
    static __device__ __forceinline__ int xd(int lane) { return 2 * (8 * (lane >> 3) + 2 * ((lane & 7) >> 1)); }
    static __device__ __forceinline__ void load_w(const uint8_t* ph, const uint8_t* pq, W& w) {
        w.hd = mvd_ld_w16(ph);
        w.q = mvd_ld_w16(pq);
    }
    static __device__ __forceinline__ void load_x(const int8_t* pa, const int8_t* pb, const float* pd, const C& c,
                                                  X& x) {
        x.a = mvd_ld_x(pa);
        x.b = mvd_ld_x(pb);
        const u32x4 ds = mvd_ld_x(pd);
        x.d0 = __uint_as_float(ds.x);
        x.d1 = __uint_as_float(ds.z) * 0.0625f;
        x.s = __uint_as_float(c.h0 ? ds.y : ds.w);
    }
    static __device__ __forceinline__ D decode(const W& w, const C& c) {
        D r;
        r.d = f16_to_f32((uint16_t)(w.hd.x & 0xFFFF));
        r.dmin = f16_to_f32((uint16_t)(w.hd.x >> 16));
        // ggml get_scale_min_k4, four sub-blocks a word: 0..3 the low 6 bits of scales[s] and
        // scales[s + 4]; 4..7 the nibbles of scales[s + 4] and the top 2 bits of scales[s - 4]
        // and scales[s]
        const uint32_t sc_lo = w.hd.y & 0x3F3F3F3Fu, m_lo = w.hd.z & 0x3F3F3F3Fu;
        const uint32_t sc_hi = (w.hd.w & 0x0F0F0F0Fu) | ((w.hd.y >> 2) & 0x30303030u);
        const uint32_t m_hi = ((w.hd.w >> 4) & 0x0F0F0F0Fu) | ((w.hd.z >> 2) & 0x30303030u);
        r.sc0 = (int)prmt(sc_lo, sc_hi, c.sel0);
        r.sc1 = (int)prmt(sc_lo, sc_hi, c.sel1);
        r.mh = (float)prmt(m_lo, m_hi, c.selh);
        const uint32_t q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            r.lo[i] = q[i] & 0x0F0F0F0Fu;
            r.hi[i] = q[i] & 0xF0F0F0F0u;
        }
        return r;
    }
    static __device__ __forceinline__ float dot(const D& r, const X& x, float acc) {
        const uint32_t xa[4] = {x.a.x, x.a.y, x.a.z, x.a.w}, xb[4] = {x.b.x, x.b.y, x.b.z, x.b.w};
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s0 = dp4a_us(r.lo[i], (int)xa[i], s0);
            s1 = dp4a_us(r.hi[i], (int)xb[i], s1);
        }
        const float f = fmaf(x.d1, (float)(s1 * r.sc1), x.d0 * (float)(s0 * r.sc0));
        return fmaf(-r.dmin, r.mh * x.s, fmaf(r.d, f, acc));
    }
};

// IQ4_XS: lane ib = lane % 8 of a super-block takes sub-block ib's 16 qs bytes (elements 0..15 in
// the low nibbles, 16..31 in the high ones, through the kvalues_iq4nl lookup) as two 8-byte
// loads (a super-block is 8-byte aligned), the 8-byte header (d, scales_h, scales_l) and x's 32
// values of its unit. The lookup (quant_formats.cuh iq4nl_lookup8 without its last two prmt)
// leaves each word's values interleaved, elements (4i, 16 + 4i, 4i + 1, 17 + 4i) and (4i + 2,
// 18 + 4i, 4i + 3, 19 + 4i); x is interleaved the same way once per token (shared by the R rows)
// instead of every row's values being put back in order.
struct MvdIQ4XS {
    static constexpr int SB = 136;
    struct W {
        uint2 q0, q1, hd;
    };
    struct X {
        uint32_t p[8];  // x values of the unit, interleaved as the lookup leaves the weights
        float d;
    };
    struct D {
        float dl;
        uint32_t v[8];
    };
    struct C {
        uint32_t shl, shh;  // the scale's bit positions in scales_l and in the header's first word
        uint32_t t0, t2;    // kvalues_iq4nl words 0 and 2 (prmt's first operand is a register)
        uint32_t k3210;     // the identity picks (one lop3 for the pick selectors)
    };
    static __device__ __forceinline__ C consts(int lane) {
        const int ib = lane & 7;
        C c;
        c.shl = 4 * ib;        // scales_l[ib / 2] >> 4 (ib % 2)
        c.shh = 16 + 2 * ib;   // scales_h >> 2 ib
        // per-thread values (threadIdx.x >> 5 is 0 here, unknown to the compiler): a uniform
        // register would cost a move into a vector register before every prmt (~16 a row and
        // iteration)
        c.t0 = IQ4NL_T0 | (threadIdx.x >> 5);
        c.t2 = IQ4NL_T2 | (threadIdx.x >> 5);
        c.k3210 = 0x32103210u | (threadIdx.x >> 5);
        mvd_pin(c.shl);
        mvd_pin(c.shh);
        mvd_pin(c.t0);
        mvd_pin(c.t2);
        mvd_pin(c.k3210);
        return c;
    }
    static __device__ __forceinline__ int qofs(int lane) { return 8 + 16 * (lane & 7); }
    static __device__ __forceinline__ int xe0(int lane) { return 256 * (lane >> 3) + 32 * (lane & 7); }
    static __device__ __forceinline__ int xe1(int lane) { return xe0(lane) + 16; }
    static __device__ __forceinline__ int xd(int lane) { return 2 * (8 * (lane >> 3) + (lane & 7)); }
    static __device__ __forceinline__ void load_w(const uint8_t* ph, const uint8_t* pq, W& w) {
        w.hd = mvd_ld_w8(ph);
        w.q0 = mvd_ld_w8(pq);
        w.q1 = mvd_ld_w8(pq + 8);
    }
    static __device__ __forceinline__ void load_x(const int8_t* pa, const int8_t* pb, const float* pd, const C&,
                                                  X& x) {
        const u32x4 a = mvd_ld_x(pa), b = mvd_ld_x(pb);
        const uint32_t xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x.p[2 * i] = prmt(xa[i], xb[i], 0x5140);
            x.p[2 * i + 1] = prmt(xa[i], xb[i], 0x7362);
        }
        x.d = mvd_ld_xf(pd);
    }
    static __device__ __forceinline__ D decode(const W& w, const C& c) {
        D r;
        const int ls = (int)(((w.hd.y >> c.shl) & 0xF) | (((w.hd.x >> c.shh) & 3) << 4));
        r.dl = f16_to_f32((uint16_t)(w.hd.x & 0xFFFF)) * (float)(ls - 32);
        const uint32_t q[4] = {w.q0.x, w.q0.y, w.q1.x, w.q1.y};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            // iq4nl_lookup8's steps: the packed nibbles as prmt selectors (bit 3 masked), bit 3
            // picking the 8..15 half
            const uint32_t sel = q[i] & 0x77777777u;
            const uint32_t pick = ((q[i] >> 1) & 0x44444444u) | c.k3210;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t a = prmt(c.t0, IQ4NL_T1, sel >> (16 * h));
                const uint32_t b = prmt(c.t2, IQ4NL_T3, sel >> (16 * h));
                r.v[2 * i + h] = prmt(a, b, pick >> (16 * h));
            }
        }
        return r;
    }
    static __device__ __forceinline__ float dot(const D& r, const X& x, float acc) {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) s = dp4a((int)r.v[i], (int)x.p[i], s);
        return fmaf(r.dl * x.d, (float)s, acc);
    }
};

// This lane's x of NT tokens at XO values / DO floats past the pointers (token t at + t * ncols
// values and + t * ncols / 16 floats).
template <typename F, int NT, int XO, int DO>
static __device__ __forceinline__ void mvd_load_x(const int8_t* pa, const int8_t* pb, const float* pd, int ncols,
                                                  int n_tokens, const typename F::C& c, typename F::X (&x)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const long long tt = NT == 1 ? 0 : min(t, n_tokens - 1);
        F::load_x(pa + tt * ncols + XO, pb + tt * ncols + XO, pd + tt * (ncols / 16) + DO, c, x[t]);
    }
}

template <typename F, int NT, int R>
static __device__ __forceinline__ void mvd_dot(const typename F::W (&w)[R], const typename F::X (&x)[NT],
                                               const typename F::C& c, float (&acc)[R][NT]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const typename F::D d = F::decode(w[r], c);
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = F::dot(d, x[t], acc[r][t]);
    }
}

// acc[r][t]: this lane's partial dot products of rows [row0, row0 + R) (rows past nrows are
// computed on the last row) with the q8_1 x of n_tokens <= NT tokens; ncols % 1024 == 0. PDL:
// the first iteration's weights are loaded before the wait, x after it.
template <typename F, int NT, int R>
static __device__ __forceinline__ void mvd_rows(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                                const float* __restrict__ xds, int nrows, int ncols,
                                                long long row_bytes, int n_tokens, int load_mode, int row0,
                                                float (&acc)[R][NT]) {
    constexpr int IT = 4 * F::SB;  // weight bytes of a row-iteration
    const bool tiled = (load_mode & 256) != 0;
    const int lane = threadIdx.x, nit = ncols / 1024;
    const typename F::C c = F::consts(lane);
    const uint8_t* ph[R];
    const uint8_t* pq[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        ph[r] = mvd_pin(W + (long long)min(row0 + r, nrows - 1) * row_bytes + (lane >> 3) * F::SB);
        pq[r] = mvd_pin(ph[r] + F::qofs(lane));
    }
    // the bits below 512 of a value's place are the same in every iteration, tiled or not
    const int8_t* pa = mvd_pin(xq + q8_1_at(F::xe0(lane), tiled));
    const int8_t* pb = mvd_pin(xq + q8_1_at(F::xe1(lane), tiled));
    const float* pd = mvd_pin(xds + F::xd(lane));
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    typename F::W wa[R], wb[R];
    typename F::X xa[NT], xb[NT];
#pragma unroll
    for (int r = 0; r < R; r++) F::load_w(ph[r], pq[r], wa[r]);
    pdl_wait();
    pdl_trigger();
    mvd_load_x<F, NT, 0, 0>(pa, pb, pd, ncols, n_tokens, c, xa);
    for (int it = 0; it < nit; it += 2) {
        const bool second = it + 1 < nit;
        if (second) {
#pragma unroll
            for (int r = 0; r < R; r++) F::load_w(ph[r] + IT, pq[r] + IT, wb[r]);
            mvd_load_x<F, NT, 1024, 64>(pa, pb, pd, ncols, n_tokens, c, xb);
        }
        mvd_dot<F, NT, R>(wa, xa, c, acc);
        if (!second) break;
#pragma unroll
        for (int r = 0; r < R; r++) {
            ph[r] += 2 * IT;
            pq[r] += 2 * IT;
        }
        pa += 2048;
        pb += 2048;
        pd += 128;
        if (it + 2 < nit) {
#pragma unroll
            for (int r = 0; r < R; r++) F::load_w(ph[r], pq[r], wa[r]);
            mvd_load_x<F, NT, 0, 0>(pa, pb, pd, ncols, n_tokens, c, xa);
        }
        mvd_dot<F, NT, R>(wb, xb, c, acc);
    }
}

// Segment kernel (as mvm_quant): MV_WARPS warps of R rows each per block.
template <typename F, int NT, int R>
static __device__ __forceinline__ void mvd_segments(const MvSegs& p, const int8_t* __restrict__ xq,
                                                    const float* __restrict__ xds, int n_tokens, int load_mode) {
    const MvSegSel sel = mv_select(p);
    const int lane = threadIdx.x;
    const int row0 = (((int)blockIdx.x - sel.block0) * MV_WARPS + threadIdx.y) * R;
    if (row0 >= sel.nrows) return;
    if (sel.bias && lane == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(sel.bias + row0));
    float acc[R][NT];
    mvd_rows<F, NT, R>(sel.W, xq, xds, sel.nrows, p.ncols, p.row_bytes, n_tokens, load_mode, row0, acc);
    mv_seg_store<NT, R>(sel, row0, acc, n_tokens, lane);
}

#define MVD_KERNEL(name, F, NT, R)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                       \
        mvd_##name##_n##NT##_r##R(const MvSegs p, const int8_t* __restrict__ xq,                      \
                                  const float* __restrict__ xds, int n_tokens, int load_mode) {        \
        mvd_segments<F, NT, R>(p, xq, xds, n_tokens, load_mode);                                       \
    }
#define MVD_FORMAT(name, F)                                                                             \
    MVD_KERNEL(name, F, 1, 1) MVD_KERNEL(name, F, 1, 2) MVD_KERNEL(name, F, 1, 4)                       \
    MVD_KERNEL(name, F, 2, 1) MVD_KERNEL(name, F, 2, 2) MVD_KERNEL(name, F, 2, 4)
MVD_FORMAT(q4_k, MvdQ4K)
MVD_FORMAT(iq4_xs, MvdIQ4XS)
