// mmv.cu — few-token (1..8) quantized products y (+)= W x (+ bias) on int8 tensor cores, with
// the weights loaded straight into mma fragments (no shared-memory staging).
//
// Why: the dp4a matvec (matvec_quant.cu) re-does its dot work for every token, so at 3..8
// tokens (speculative verify passes, several decode streams) it is issue bound and costs
// 2..4x its one-token time; mmq.cu stages 16-row chunks through shared memory and its
// per-chunk staging and address work cap it at ~1.5 TB/s. Here one warp owns a 16-row tile
// (the mma's m) and a share of its 256-weight super-blocks: every thread loads exactly the
// bytes of its own A fragments (rows g and g + 8, g = lane / 4) with 16- and 8-byte loads,
// one super-block ahead of the one it computes, and one `mma.sync m16n8k32 s8` per 32-weight
// unit multiplies them against all 8 token columns at once. The cost per weight byte is the
// same for 1 and 8 tokens.
//
// Layout (as matvec_quant.cu's mvm_ kernels, which it replaces for the formats it has):
// - x: q8_1 from quantize_q8_1: xq [n_tokens, ncols] int8, xds [n_tokens, ncols / 32] float2
//   (d, d * sum q) per 32 elements.
// - W: segments of [nrows, ncols] in GGUF block layout (rows of row_bytes bytes, 16 bytes of
//   padding after the last row), one matrix per segment; block b of the grid belongs to the
//   last segment with block0 <= b, and covers its rows 16 (b - block0) .. + 15.
// - y: [n_tokens, nrows] f32 per segment, plus an optional f32 bias, and y += W x when the
//   segment accumulates (the residual add).
// - blockDim (32, nw): the nw warps of a block split the tile's super-blocks (w, w + nw, ...)
//   and their partial sums meet in shared memory.
//
// Fragments (PTX ISA, mma.m16n8k32 .s8, g = lane / 4, t = lane % 4): a0 = A[g][4t..4t+3],
// a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]; b0 = B[4t..4t+3][g],
// b1 = B[16+4t..][g]; c0, c1 = C[g][2t], C[g][2t+1], c2, c3 = rows g + 8. The k order is free
// as long as A and B use the same one: k-slots 4t..4t+3 hold elements 8t..8t+3 of the unit and
// slots 16+4t.. elements 8t+4..8t+7, so a thread's A words are 8 consecutive weight bytes
// (nibbles) of its rows and its B words x's 8 bytes 8t..8t+7 of token g (one 8-byte load).
// m16n8k16 (Q6_K, a scale per 16 weights): a0 = A[g][4t..], a1 = A[g+8][4t..], b0 = B[4t..][g].
//
// sm_70 has no int8 mma: there (and with `emulate` != 0 anywhere, for tests) the products are
// done by warp shuffles + dp4a on the same fragments (correct, slower; the dispatch never
// picks this kernel below sm_80).
// Block layouts: ggml-common.h; bit layouts: ggml-quants.c dequantize_row_* (own code).
#include "common.cuh"
#include "quant_formats.cuh"

#define MMV_MAX_WARPS 8
#define MMV_MAX_SEGS 4

struct alignas(16) MvV4 {
    uint32_t x, y, z, w;
};
struct alignas(8) MvV2 {
    uint32_t x, y;
};
struct alignas(8) MvF2 {
    float x, y;
};

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
    MvSeg seg[MMV_MAX_SEGS];
    long long row_bytes;
    int n_segs;
    int ncols;
};

// Weights stream through once; they may allocate in L1 (the 8-byte loads of neighbouring
// instructions share 32-byte sectors).
static __device__ __forceinline__ MvV4 mv_ld16(const uint8_t* p) {
    MvV4 v;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
static __device__ __forceinline__ MvV2 mv_ld8(const uint8_t* p) {
    MvV2 v;
    asm("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
static __device__ __forceinline__ uint32_t mv_ld2x2(const uint8_t* p) {
    // a little-endian u32 from 2-byte-aligned weights
    uint16_t lo, hi;
    asm("ld.global.nc.u16 %0, [%1];" : "=h"(lo) : "l"(p));
    asm("ld.global.nc.u16 %0, [%1];" : "=h"(hi) : "l"(p + 2));
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

struct MvI4 {
    int x, y, z, w;
};

// The m16n8k32 product from the fragments by shuffles + dp4a: lane 4g+q holds A's k = 4q..
// (and 16+4q..) of rows g, g+8; lane 4n+q holds B's k = 4q.. (and 16+4q..) of column n.
static __device__ __noinline__ MvI4 mv_emul_k32(MvI4 c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
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

static __device__ __noinline__ MvI4 mv_emul_k16(MvI4 c, uint32_t a0, uint32_t a1, uint32_t b) {
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

// c = A B for one m16n8k32 tile (from zero).
static __device__ __forceinline__ MvI4 mv_mma_k32(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                  uint32_t b1, int emulate) {
    MvI4 c{0, 0, 0, 0};
#if __CUDA_ARCH__ >= 800
    if (emulate) return mv_emul_k32(c, a0, a1, a2, a3, b0, b1);
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c.x), "+r"(c.y), "+r"(c.z), "+r"(c.w)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    return c;
#else
    return mv_emul_k32(c, a0, a1, a2, a3, b0, b1);
#endif
}

static __device__ __forceinline__ MvI4 mv_mma_k16(uint32_t a0, uint32_t a1, uint32_t b, int emulate) {
    MvI4 c{0, 0, 0, 0};
#if __CUDA_ARCH__ >= 800
    if (emulate) return mv_emul_k16(c, a0, a1, b);
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(c.x), "+r"(c.y), "+r"(c.z), "+r"(c.w)
        : "r"(a0), "r"(a1), "r"(b));
    return c;
#else
    return mv_emul_k16(c, a0, a1, b);
#endif
}

// ---- formats -----------------------------------------------------------------------------
//
// Each format: SB bytes per 256-weight super-block; `Frag` holds this thread's bytes of one
// super-block for rows g and g + 8 (what `load` fetches); `compute` multiplies them against
// x of units U0 .. U0 + 7 and adds to acc[4] (c-fragment order: row g tokens 2t, 2t + 1, row
// g + 8 tokens 2t, 2t + 1).

// x of this thread for the mma: B words of token g, scales of tokens 2t and 2t + 1.
struct MvX {
    const int8_t* q;   // xq of token g, + 8t
    const MvF2* d0;    // xds of token 2t
    const MvF2* d1;    // xds of token 2t + 1
    int emulate;       // 1: mma by shuffles + dp4a
};

// block_q4_K: d, dmin f16, scales[12], qs[128]; sub-block u: qs[32 (u / 2) + e] nibble u % 2.
struct MvQ4K {
    static constexpr int SB = 144;
    struct Frag {
        MvV4 h[2];     // header (d, dmin, scales) of rows g, g + 8
        MvV2 q[2][4];  // qs bytes 32j + 8t .. + 7 of rows g, g + 8, j = 0..3
    };
    static __device__ __forceinline__ void load(const uint8_t* pg, const uint8_t* pg8, int t, Frag& f) {
        f.h[0] = mv_ld16(pg);
        f.h[1] = mv_ld16(pg8);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            f.q[0][j] = mv_ld8(pg + 16 + 32 * j + 8 * t);
            f.q[1][j] = mv_ld8(pg8 + 16 + 32 * j + 8 * t);
        }
    }
    static __device__ __forceinline__ void compute(const Frag& f, int U0, const MvX& x, int lane, float (&acc)[4]) {
        const int t = lane & 3;
        // this thread decodes the scales of sub-blocks t and t + 4 of both rows (ggml
        // get_scale_min_k4); sub-block u's come from lane 4g + u % 4 by shuffle
        float s_lo[2], m_lo[2], s_hi[2], m_hi[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const MvV4 h = f.h[r];
            const float d = f16_to_f32((uint16_t)(h.x & 0xFFFF)), dmin = f16_to_f32((uint16_t)(h.x >> 16));
            const int k = 8 * t;
            const int sc_lo = (h.y >> k) & 63, mn_lo = (h.z >> k) & 63;
            const int sc_hi = ((h.w >> k) & 0xF) | (((h.y >> (k + 6)) & 3) << 4);
            const int mn_hi = ((h.w >> (k + 4)) & 0xF) | (((h.z >> (k + 6)) & 3) << 4);
            s_lo[r] = d * (float)sc_lo;
            m_lo[r] = -dmin * (float)mn_lo;
            s_hi[r] = d * (float)sc_hi;
            m_hi[r] = -dmin * (float)mn_hi;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int src = (lane & ~3) | (u & 3);
            const float sg = __shfl_sync(FULL_MASK, u < 4 ? s_lo[0] : s_hi[0], src);
            const float mg = __shfl_sync(FULL_MASK, u < 4 ? m_lo[0] : m_hi[0], src);
            const float sg8 = __shfl_sync(FULL_MASK, u < 4 ? s_lo[1] : s_hi[1], src);
            const float mg8 = __shfl_sync(FULL_MASK, u < 4 ? m_lo[1] : m_hi[1], src);
            const int sh = 4 * (u & 1);
            const MvV2 wg = f.q[0][u >> 1], wg8 = f.q[1][u >> 1];
            const int U = U0 + u;
            const MvV2 xb = *(const MvV2*)(x.q + 32 * U);
            const MvI4 c = mv_mma_k32((wg.x >> sh) & 0x0F0F0F0Fu, (wg8.x >> sh) & 0x0F0F0F0Fu,
                                      (wg.y >> sh) & 0x0F0F0F0Fu, (wg8.y >> sh) & 0x0F0F0F0Fu, xb.x, xb.y, x.emulate);
            const MvF2 x0 = x.d0[U], x1 = x.d1[U];
            acc[0] += (float)c.x * (sg * x0.x) + mg * x0.y;
            acc[1] += (float)c.y * (sg * x1.x) + mg * x1.y;
            acc[2] += (float)c.z * (sg8 * x0.x) + mg8 * x0.y;
            acc[3] += (float)c.w * (sg8 * x1.x) + mg8 * x1.y;
        }
    }
};

// block_q6_K: ql[128], qh[64], scales[16] int8, d f16 (210 bytes: super-blocks are only
// 2-byte aligned, so the words are read as u16 pairs). Sub-block u = 4n + k (n = 128-half,
// k = 0..3): element e = ql[64n + 32(k & 1) + e] nibble k >> 1 | (qh[32n + e] >> 2k & 3) << 4,
// value q - 32, scale sc[8n + 2k + e / 16]. Per 16-element half h of sub-block u this thread
// holds elements 16h + 4t .. + 3 (one m16n8k16 each).
struct MvQ6K {
    static constexpr int SB = 210;
    struct Frag {
        uint32_t ql[2][8];  // [row][n * 4 + a * 2 + h]: ql[64n + 32a + 16h + 4t ..]
        uint32_t qh[2][4];  // [row][n * 2 + h]: qh[32n + 16h + 4t ..]
        uint32_t sc[2][4];  // [row]: scales[16]
        uint32_t d;         // d of row g (low half), row g + 8 (high half)
    };
    static __device__ __forceinline__ void load(const uint8_t* pg, const uint8_t* pg8, int t, Frag& f) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t* p = r == 0 ? pg : pg8;
#pragma unroll
            for (int i = 0; i < 8; i++) f.ql[r][i] = mv_ld2x2(p + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * t);
#pragma unroll
            for (int i = 0; i < 4; i++) f.qh[r][i] = mv_ld2x2(p + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t);
#pragma unroll
            for (int i = 0; i < 4; i++) f.sc[r][i] = mv_ld2x2(p + 192 + 4 * i);
        }
        uint16_t d0, d1;
        asm("ld.global.nc.u16 %0, [%1];" : "=h"(d0) : "l"(pg + 208));
        asm("ld.global.nc.u16 %0, [%1];" : "=h"(d1) : "l"(pg8 + 208));
        f.d = (uint32_t)d0 | ((uint32_t)d1 << 16);
    }
    static __device__ __forceinline__ void compute(const Frag& f, int U0, const MvX& x, int lane, float (&acc)[4]) {
        const float dg = f16_to_f32((uint16_t)(f.d & 0xFFFF)), dg8 = f16_to_f32((uint16_t)(f.d >> 16));
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int n = u >> 2, k = u & 3;
            const int U = U0 + u;
            MvI4 c[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t w[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const uint32_t lo = (f.ql[r][n * 4 + (k & 1) * 2 + h] >> (4 * (k >> 1))) & 0x0F0F0F0Fu;
                    const uint32_t hi = ((f.qh[r][n * 2 + h] >> (2 * k)) & 0x03030303u) << 4;
                    w[r] = sub_bytes_biased(lo | hi, 0x20202020u);
                }
                const uint32_t xb = *(const uint32_t*)(x.q - 4 * (lane & 3) + 32 * U + 16 * h);
                c[h] = mv_mma_k16(w[0], w[1], xb, x.emulate);
            }
            // scales sc[8n + 2k + h] of both rows: byte (2k + h) % 4 of word 2n + k / 2
            const int wi = 2 * n + (k >> 1), b0 = 8 * ((2 * k) & 3);
            const int sg0 = (int)(int8_t)(f.sc[0][wi] >> b0), sg1 = (int)(int8_t)(f.sc[0][wi] >> (b0 + 8));
            const int s80 = (int)(int8_t)(f.sc[1][wi] >> b0), s81 = (int)(int8_t)(f.sc[1][wi] >> (b0 + 8));
            const MvF2 x0 = x.d0[U], x1 = x.d1[U];
            acc[0] += (float)(sg0 * c[0].x + sg1 * c[1].x) * (dg * x0.x);
            acc[1] += (float)(sg0 * c[0].y + sg1 * c[1].y) * (dg * x1.x);
            acc[2] += (float)(s80 * c[0].z + s81 * c[1].z) * (dg8 * x0.x);
            acc[3] += (float)(s80 * c[0].w + s81 * c[1].w) * (dg8 * x1.x);
        }
    }
};

// ---- the kernel --------------------------------------------------------------------------

template <typename F>
static __device__ __forceinline__ void mmv(const MvSegs& p, const int8_t* __restrict__ xq,
                                           const float* __restrict__ xds_f, int n_tokens, int emulate) {
    // this block's segment (unrolled selects: no local-memory copy of the parameter struct)
    const uint8_t* W = p.seg[0].W;
    float* y = p.seg[0].y;
    const float* bias = p.seg[0].bias;
    int nrows = p.seg[0].nrows, block0 = 0, accumulate = p.seg[0].accumulate;
#pragma unroll
    for (int s = 1; s < MMV_MAX_SEGS; s++) {
        if (s < p.n_segs && (int)blockIdx.x >= p.seg[s].block0) {
            W = p.seg[s].W;
            y = p.seg[s].y;
            bias = p.seg[s].bias;
            nrows = p.seg[s].nrows;
            block0 = p.seg[s].block0;
            accumulate = p.seg[s].accumulate;
        }
    }
    const int lane = threadIdx.x, wid = threadIdx.y, nw = blockDim.y;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = ((int)blockIdx.x - block0) * 16;
    const int ncols = p.ncols, nsb = ncols / 256, nunits = ncols / 32;
    const long long row_bytes = p.row_bytes;
    const uint8_t* rg = W + (long long)min(row0 + g, nrows - 1) * row_bytes;
    const uint8_t* rg8 = W + (long long)min(row0 + g + 8, nrows - 1) * row_bytes;

    // the first super-block's weights are in flight before the wait for x (PDL)
    typename F::Frag fa, fb;
    int sb = wid;
    if (sb < nsb) F::load(rg + (long long)sb * F::SB, rg8 + (long long)sb * F::SB, t, fa);
    pdl_wait();
    pdl_trigger();

    MvX x;
    x.q = xq + (long long)min(g, n_tokens - 1) * ncols + 8 * t;
    x.d0 = (const MvF2*)xds_f + (long long)min(2 * t, n_tokens - 1) * nunits;
    x.d1 = (const MvF2*)xds_f + (long long)min(2 * t + 1, n_tokens - 1) * nunits;
    x.emulate = emulate;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // two fragment buffers: super-block sb + nw loads while sb computes
    for (; sb < nsb; sb += 2 * nw) {
        const int s1 = sb + nw, s2 = sb + 2 * nw;
        if (s1 < nsb) F::load(rg + (long long)s1 * F::SB, rg8 + (long long)s1 * F::SB, t, fb);
        F::compute(fa, 8 * sb, x, lane, acc);
        if (s1 >= nsb) break;
        if (s2 < nsb) F::load(rg + (long long)s2 * F::SB, rg8 + (long long)s2 * F::SB, t, fa);
        F::compute(fb, 8 * s1, x, lane, acc);
    }

    __shared__ float red[MMV_MAX_WARPS][4][32];
    if (nw > 1) {
#pragma unroll
        for (int i = 0; i < 4; i++) red[wid][i][lane] = acc[i];
        __syncthreads();
        if (wid != 0) return;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float s = 0.0f;
            for (int w = 0; w < nw; w++) s += red[w][i][lane];
            acc[i] = s;
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int row = row0 + g + 8 * (i >> 1), tok = 2 * t + (i & 1);
        if (row < nrows && tok < n_tokens) {
            float* yp = y + (long long)tok * nrows + row;
            float v = acc[i];
            if (bias) v += bias[row];
            if (accumulate) v += *yp;
            *yp = v;
        }
    }
}

#define MMV_KERNEL(name, F)                                                                               \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                    \
        mmv_##name(const MvSegs p, const int8_t* __restrict__ xq, const float* __restrict__ xds, int n_tokens, \
                   int emulate) {                                                                       \
        mmv<F>(p, xq, xds, n_tokens, emulate);                                                          \
    }

MMV_KERNEL(q4_k, MvQ4K)
MMV_KERNEL(q6_k, MvQ6K)
