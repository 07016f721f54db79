// segments.cuh — several matrices in one product launch (decode fusion): the parameter
// struct of the segment kernels (matvec_quant.cu mvm_*, mmv.cu mmv_*) and the per-block
// segment select. Must match MvSeg / MvSegs in crates/cuda/src/matvec.rs.
//
// Segment s owns the blocks [block0[s], block0[s+1]) of the grid; each keeps its own matrix,
// output, optional f32 bias and accumulate flag (y += W x: the residual add).
#pragma once
#include "common.cuh"

#define MV_MAX_SEGS 4

struct MvSeg {
    const uint8_t* W;
    float* y;
    const float* bias;  // null: none
    int nrows;
    int block0;         // first block of this segment
    int accumulate;     // 1: y += W x
    int pad_;
};

struct MvSegs {
    MvSeg seg[MV_MAX_SEGS];
    long long row_bytes;
    int n_segs;
    int ncols;
};

// This block's segment (unrolled selects: no local-memory copy of the parameter struct).
struct MvSegSel {
    const uint8_t* W;
    float* y;
    const float* bias;
    int nrows, block0, accumulate;
};
// The segment of row block `b` (mv_select: this block's).
static __device__ __forceinline__ MvSegSel mv_select_at(const MvSegs& p, int b) {
    MvSegSel r{p.seg[0].W, p.seg[0].y, p.seg[0].bias, p.seg[0].nrows, 0, p.seg[0].accumulate};
#pragma unroll
    for (int s = 1; s < MV_MAX_SEGS; s++) {
        if (s < p.n_segs && b >= p.seg[s].block0) {
            r.W = p.seg[s].W;
            r.y = p.seg[s].y;
            r.bias = p.seg[s].bias;
            r.nrows = p.seg[s].nrows;
            r.block0 = p.seg[s].block0;
            r.accumulate = p.seg[s].accumulate;
        }
    }
    return r;
}
static __device__ __forceinline__ MvSegSel mv_select(const MvSegs& p) { return mv_select_at(p, (int)blockIdx.x); }
