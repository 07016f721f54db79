// matvec_common.cuh — what the dp4a matvec kernels (matvec_quant.cu, staged through shared
// memory) and the direct ones (matvec_direct.cu) share: the 16-byte vector, the block size, the
// weight loads and the segment kernels' epilogue.
#pragma once
#include "common.cuh"
#include "segments.cuh"

struct alignas(16) u32x4 {
    uint32_t x, y, z, w;
};

// Warps per block of the segment kernels; must match WARPS_PER_BLOCK in crates/cuda/src/matvec.rs.
#define MV_WARPS 4
// the queue products' ticket counters a slot holds (kernels/matvec_direct.cu mvd_groups), each on
// its own 128-byte line (word 0 the tickets, word 1 its warps ended), then the line of the lines
// done: MVQ_LINES + 1 lines a slot
// (crates/cuda/src/matvec.rs QUEUE_SLOT_WORDS)
#define MVQ_LINES 32

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
