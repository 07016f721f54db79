// matvec_quant.cu — y = W x for ggml block-quantized W, and the activation quantizer.
//
// Design (llama.cpp MMVQ-like, own code):
// - x: [n_tokens, ncols] f32 is first quantized on the device to q8_1-style int8
//   (`quantize_q8_1`): xq [n_tokens, ncols] int8 plus xds [n_tokens, ncols/32] float2
//   (d, d * sum(q)) per 32 elements, so every weight format dots with dp4a.
// - W: [nrows, ncols] in GGUF block layout, uploaded byte-for-byte (rows of row_bytes bytes;
//   the allocation has >= 16 bytes of padding after the last row). Blocks of odd sizes
//   (18, 22, 34, 110, 210 bytes) are not 16-byte aligned, so each warp stages a group of
//   blocks (2048 weights) through shared memory with aligned, coalesced 16-byte loads (the
//   group's byte range rounded out to 16 bytes), then each lane decodes two 32-element units
//   from there (see quant_formats.cuh `decode2`). Two groups are in flight per warp: the
//   loads of group g+2 are issued before group g is decoded.
// - One warp per row, WARPS rows per block; the weights are read once for all n_tokens <= NT
//   tokens (small-batch decode), so a step costs one pass over W.
// y: [n_tokens, nrows] f32.
#include "quant_formats.cuh"

struct alignas(16) u32x4 {
    uint32_t x, y, z, w;
};
struct alignas(8) float2v {
    float x, y;
};

#define MV_WARPS 4

// x: [n_tokens, ncols] f32 -> xq int8 and xds (d, d*sum q) per 32 elements.
// grid: (ncols/32 / 8 rounded up, n_tokens), block (32, 8): one warp per 32 elements.
extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, int8_t* __restrict__ xq,
                                         float* __restrict__ xds, int ncols) {
    const int unit = blockIdx.x * blockDim.y + threadIdx.y;
    const int t = blockIdx.y;
    if (unit * 32 >= ncols) return;
    const long long i = (long long)t * ncols + unit * 32 + threadIdx.x;
    const float v = x[i];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : __float2int_rn(v / d);
    xq[i] = (int8_t)q;
    const float sum = warp_sum((float)q);
    if (threadIdx.x == 0) {
        const long long u = (long long)t * (ncols / 32) + unit;
        xds[2 * u] = d;
        xds[2 * u + 1] = d * sum;
    }
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

// Decodes this lane's task of the staged group (first block g0 of the row, nb blocks) and
// accumulates its dot products for every token.
template <typename F, int NT>
static __device__ __forceinline__ void mv_compute_group(const uint8_t* sbytes, int off, int g0, int nb, int blk, int task,
                                                        const int8_t* __restrict__ xq, const float* __restrict__ xds,
                                                        int ncols, int n_tokens, float acc[NT]) {
    constexpr int BLOCKS_PER_TASK = F::UNITS == 1 ? 2 : 1;
    if (blk >= nb) return;
    const int n_units_x = ncols / 32;
    Task tk;
    Decode2<F>::run(sbytes + off + blk * F::BLOCK_BYTES, task, tk);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        // the second block of a 32-wide task may lie past the row's end
        if (BLOCKS_PER_TASK == 1 || blk + j < nb) {
            const int xunit = (g0 + blk) * F::UNITS + tk.unit[j];  // unit index in the row
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n_tokens) {
                    const u32x4* xp = (const u32x4*)(xq + (long long)t * ncols + 32 * xunit);
                    const u32x4 xa = xp[0], xb = xp[1];
                    const int xv[8] = {(int)xa.x, (int)xa.y, (int)xa.z, (int)xa.w,
                                       (int)xb.x, (int)xb.y, (int)xb.z, (int)xb.w};
                    int sumi0 = 0, sumi1 = 0;
#pragma unroll
                    for (int i = 0; i < 4; i++) sumi0 = dp4a(tk.v[j][i], xv[i], sumi0);
#pragma unroll
                    for (int i = 4; i < 8; i++) sumi1 = dp4a(tk.v[j][i], xv[i], sumi1);
                    const float2v ds = ((const float2v*)xds)[(long long)t * n_units_x + xunit];
                    float r_t;
                    if constexpr (F::SPLIT) {
                        r_t = ds.x * (tk.s0[j] * (float)sumi0 + tk.s1[j] * (float)sumi1);
                    } else {
                        r_t = ds.x * tk.s0[j] * (float)(sumi0 + sumi1);
                    }
                    if constexpr (F::HAS_MIN) r_t += tk.m0[j] * ds.y;
                    if constexpr (F::HALF_MIN) {
                        int sx0 = 0, sx1 = 0;
#pragma unroll
                        for (int i = 0; i < 4; i++) sx0 = dp4a(0x01010101, xv[i], sx0);
#pragma unroll
                        for (int i = 4; i < 8; i++) sx1 = dp4a(0x01010101, xv[i], sx1);
                        r_t += ds.x * (tk.m0[j] * (float)sx0 + tk.m1[j] * (float)sx1);
                    }
                    acc[t] += r_t;
                }
            }
        }
    }
}

template <typename F, int NT>
static __device__ __forceinline__ void mv_quant_row(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                                    const float* __restrict__ xds, float* __restrict__ y, int nrows,
                                                    int ncols, long long row_bytes, int n_tokens, int load_mode,
                                                    int row) {
    // A lane task is two 32-element units: two blocks of a 32-wide format, or 1/4 of a
    // 256-wide super-block. A staged group is 32 tasks (2048 weights), one per lane.
    constexpr int TASKS_PER_BLOCK = F::UNITS == 1 ? 1 : F::UNITS / 2;
    constexpr int BLOCKS_PER_TASK = F::UNITS == 1 ? 2 : 1;
    constexpr int G = 32 * BLOCKS_PER_TASK / TASKS_PER_BLOCK;  // blocks per group
    constexpr int BLOCK_ELEMS = 32 * F::UNITS;
    // 16-byte vectors per lane to cover a group plus up to 30 bytes of alignment slack
    constexpr int L = ((G * F::BLOCK_BYTES + 30 + 15) / 16 + 31) / 32;
    // Two groups in flight per warp (A and B alternate): loads of group g+2 are issued before
    // group g is decoded, so ~2 groups of bytes per warp are always outstanding.
    __shared__ u32x4 stage[MV_WARPS][32 * L];
    const int lane = threadIdx.x;
    u32x4* sbuf = stage[threadIdx.y];
    const uint8_t* sbytes = (const uint8_t*)sbuf;
    const int nblocks = ncols / BLOCK_ELEMS;
    const int ngroups = (nblocks + G - 1) / G;
    const long long row_start = row * row_bytes;
    const int blk = (lane / TASKS_PER_BLOCK) * BLOCKS_PER_TASK;  // this lane's block in the group
    const int task = lane % TASKS_PER_BLOCK;
    auto group_start = [&](int g) { return row_start + (long long)g * G * F::BLOCK_BYTES; };
    auto group_len = [&](int g) { return min(G, nblocks - g * G) * F::BLOCK_BYTES; };

    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;

    Staged<L> a, b;
    mv_load_group(W, group_start(0), group_len(0), lane, a, load_mode);
    if (ngroups > 1) mv_load_group(W, group_start(1), group_len(1), lane, b, load_mode);
    for (int g = 0; g < ngroups; g += 2) {
        mv_store_group(a, sbuf, lane);
        __syncwarp();
        int off = a.off;
        if (g + 2 < ngroups) mv_load_group(W, group_start(g + 2), group_len(g + 2), lane, a, load_mode);
        mv_compute_group<F, NT>(sbytes, off, g * G, min(G, nblocks - g * G), blk, task, xq, xds, ncols, n_tokens, acc);
        __syncwarp();
        if (g + 1 < ngroups) {
            mv_store_group(b, sbuf, lane);
            __syncwarp();
            off = b.off;
            if (g + 3 < ngroups) mv_load_group(W, group_start(g + 3), group_len(g + 3), lane, b, load_mode);
            mv_compute_group<F, NT>(sbytes, off, (g + 1) * G, min(G, nblocks - (g + 1) * G), blk, task, xq, xds, ncols,
                                    n_tokens, acc);
            __syncwarp();
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < n_tokens) y[(long long)t * nrows + row] = s;
    }
}

template <typename F, int NT>
static __device__ __forceinline__ void mv_quant(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                                const float* __restrict__ xds, float* __restrict__ y, int nrows,
                                                int ncols, long long row_bytes, int n_tokens, int load_mode) {
    const int row = blockIdx.x * MV_WARPS + threadIdx.y;
    if (row >= nrows) return;  // whole warp leaves together: only __syncwarp inside
    mv_quant_row<F, NT>(W, xq, xds, y, nrows, ncols, row_bytes, n_tokens, load_mode, row);
}

// Single-token variant with x in shared memory: persistent blocks (grid ~ a few per SM) copy
// x (ncols int8 + ncols/32 (d, s) pairs, dynamic shared memory) once, then loop over rows, so
// x is never re-read from L1/L2 per weight group.
template <typename F>
static __device__ __forceinline__ void mv_quant_xsmem(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                                      const float* __restrict__ xds, float* __restrict__ y, int nrows,
                                                      int ncols, long long row_bytes, int load_mode) {
    extern __shared__ u32x4 xs_dyn[];
    const int tid = threadIdx.y * 32 + threadIdx.x;
    const int nq = ncols / 16;      // xq vectors
    const int nd = ncols / 32 / 2;  // xds vectors (two (d, s) pairs each)
    const u32x4* gq = (const u32x4*)xq;
    const u32x4* gd = (const u32x4*)xds;
    for (int i = tid; i < nq + nd; i += 32 * MV_WARPS) xs_dyn[i] = i < nq ? gq[i] : gd[i - nq];
    __syncthreads();
    const int8_t* sq = (const int8_t*)xs_dyn;
    const float* sd = (const float*)(xs_dyn + nq);
    for (int row = blockIdx.x * MV_WARPS + threadIdx.y; row < nrows; row += gridDim.x * MV_WARPS) {
        mv_quant_row<F, 1>(W, sq, sd, y, nrows, ncols, row_bytes, 1, load_mode, row);
    }
}

// One kernel per (format, NT); n_tokens <= NT tokens are computed, the weights read once.
#define MV_KERNEL(name, F, NT)                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                       \
        mv_##name##_n##NT(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,               \
                          const float* __restrict__ xds, float* __restrict__ y, int nrows, int ncols,  \
                          long long row_bytes, int n_tokens, int load_mode) {                          \
        mv_quant<F, NT>(W, xq, xds, y, nrows, ncols, row_bytes, n_tokens, load_mode);                 \
    }
#define MV_XS_KERNEL(name, F)                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                       \
        mvx_##name##_n1(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,                 \
                        const float* __restrict__ xds, float* __restrict__ y, int nrows, int ncols,    \
                        long long row_bytes, int n_tokens, int load_mode) {                            \
        mv_quant_xsmem<F>(W, xq, xds, y, nrows, ncols, row_bytes, load_mode);                         \
    }
#define MV_FORMAT(name, F) \
    MV_KERNEL(name, F, 1) MV_KERNEL(name, F, 2) MV_KERNEL(name, F, 4) MV_KERNEL(name, F, 8) MV_XS_KERNEL(name, F)

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
