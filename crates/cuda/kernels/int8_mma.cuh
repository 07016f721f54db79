// int8_mma.cuh — the int8 mma products' accumulator fragment and the sm_70 fallback that
// computes them from the same fragments by warp shuffles + dp4a (mmq.cu, mmv.cu; also run on
// any card when a test forces the emulation).
//
// m16n8k32 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32", .s8): with g = lane / 4,
// t = lane % 4: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..];
// b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]; c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = rows g+8.
// m16n8k16: a0 = A[g][4t..], a1 = A[g+8][4t..], b0 = B[4t..][g], C as above.
#pragma once
#include "common.cuh"

struct MmaI4 {
    int x, y, z, w;
};

// The products from the fragments by warp shuffles + dp4a (sm_70, and `emulate` for tests):
// lane 4g+q holds A's k = 4q.. (and 16+4q..) of rows g, g+8; lane 4n+q holds B's k = 4q..
// (and 16+4q..) of column n. Not inlined: one copy instead of one per unrolled call keeps the
// compile time of this fallback small.
static __device__ __noinline__ MmaI4 mma_emul_k32(MmaI4 c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int a_src = 4 * g + q, b_src0 = 8 * t + q, b_src1 = 8 * t + 4 + q;
        const int ra0 = (int)__shfl_sync(FULL_MASK, a0, a_src), ra1 = (int)__shfl_sync(FULL_MASK, a1, a_src);
        const int ra2 = (int)__shfl_sync(FULL_MASK, a2, a_src), ra3 = (int)__shfl_sync(FULL_MASK, a3, a_src);
        const int b00 = (int)__shfl_sync(FULL_MASK, b0, b_src0), b01 = (int)__shfl_sync(FULL_MASK, b1, b_src0);
        const int b10 = (int)__shfl_sync(FULL_MASK, b0, b_src1), b11 = (int)__shfl_sync(FULL_MASK, b1, b_src1);
        c.x = dp4a(ra0, b00, dp4a(ra2, b01, c.x));
        c.y = dp4a(ra0, b10, dp4a(ra2, b11, c.y));
        c.z = dp4a(ra1, b00, dp4a(ra3, b01, c.z));
        c.w = dp4a(ra1, b10, dp4a(ra3, b11, c.w));
    }
    return c;
}

static __device__ __noinline__ MmaI4 mma_emul_k16(MmaI4 c, uint32_t a0, uint32_t a1, uint32_t b) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int a_src = 4 * g + q;
        const int ra0 = (int)__shfl_sync(FULL_MASK, a0, a_src), ra1 = (int)__shfl_sync(FULL_MASK, a1, a_src);
        const int rb0 = (int)__shfl_sync(FULL_MASK, b, 8 * t + q), rb1 = (int)__shfl_sync(FULL_MASK, b, 8 * t + 4 + q);
        c.x = dp4a(ra0, rb0, c.x);
        c.y = dp4a(ra0, rb1, c.y);
        c.z = dp4a(ra1, rb0, c.z);
        c.w = dp4a(ra1, rb1, c.w);
    }
    return c;
}
