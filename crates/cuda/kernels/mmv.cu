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
#include "int8_mma.cuh"
#include "quant_formats.cuh"
#include "segments.cuh"

#define MMV_MAX_WARPS 8

struct alignas(16) MvV4 {
    uint32_t x, y, z, w;
};
struct alignas(8) MvV2 {
    uint32_t x, y;
};
struct alignas(8) MvF2 {
    float x, y;
};

// Weight loads. The weights stream through once; x (read by every warp) must stay in L1.
// load_mode 0: ld.global.nc (allocates in L1: the 8-byte loads of neighbouring instructions
// share 32-byte sectors); 2: ld.global.nc.L1::no_allocate (the weights bypass L1).
static __device__ __forceinline__ MvV4 mv_ld16(const uint8_t* p, int mode) {
    MvV4 v;
    if (mode == 2) {
        asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    } else {
        asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    }
    return v;
}
static __device__ __forceinline__ MvV2 mv_ld8(const uint8_t* p, int mode) {
    MvV2 v;
    if (mode == 2) {
        asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    } else {
        asm("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    }
    return v;
}
static __device__ __forceinline__ uint32_t mv_ld4(const uint8_t* p, int mode) {
    uint32_t v;
    if (mode == 2) {
        asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    } else {
        asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
    }
    return v;
}
static __device__ __forceinline__ uint16_t mv_ld2(const uint8_t* p, int mode) {
    uint16_t v;
    if (mode == 2) {
        asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    } else {
        asm("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    }
    return v;
}
// a little-endian u32 from 2-byte-aligned weights
static __device__ __forceinline__ uint32_t mv_ld2x2(const uint8_t* p, int mode) {
    return (uint32_t)mv_ld2(p, mode) | ((uint32_t)mv_ld2(p + 2, mode) << 16);
}

// c + A B for one m16n8k32 tile; EMU: by shuffles + dp4a (int8_mma.cuh; always below sm_80).
// The emulation is a compile-time choice: with a run-time flag every mma of an unrolled loop
// sat in its own basic block beside a call (mmv2_q6_k: 14 branches between its 16 mmas per
// super-block), and the call's registers counted for the kernel. Each kernel is now compiled
// twice (`name`, `name_emu`: MMV_KERNEL below), the flag a constant in each, so the run-time
// choices here (`_rt`, MV_EMU_SWITCH) fold away.
template <bool EMU>
static __device__ __forceinline__ MmaI4 mv_mma_k32(MmaI4 c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
    if constexpr (EMU) return mma_emul_k32(c, a0, a1, a2, a3, b0, b1);
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c.x), "+r"(c.y), "+r"(c.z), "+r"(c.w)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    return c;
#else
    return mma_emul_k32(c, a0, a1, a2, a3, b0, b1);
#endif
}

template <bool EMU>
static __device__ __forceinline__ MmaI4 mv_mma_k16(uint32_t a0, uint32_t a1, uint32_t b) {
    MmaI4 c{0, 0, 0, 0};
#if __CUDA_ARCH__ >= 800
    if constexpr (EMU) return mma_emul_k16(c, a0, a1, b);
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(c.x), "+r"(c.y), "+r"(c.z), "+r"(c.w)
        : "r"(a0), "r"(a1), "r"(b));
    return c;
#else
    return mma_emul_k16(c, a0, a1, b);
#endif
}

// c + A B with A's bytes unsigned (.u8: Q4_K high nibbles left in place, 16 q); emulated as
// 16 x the product of the shifted-down nibbles (the same integers).
template <bool EMU>
static __device__ __forceinline__ MmaI4 mv_mma_k32_u8(MmaI4 c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                     uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
    if constexpr (!EMU) {
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+r"(c.x), "+r"(c.y), "+r"(c.z), "+r"(c.w)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        return c;
    }
#endif
    const MmaI4 r = mma_emul_k32(MmaI4{0, 0, 0, 0}, a0 >> 4, a1 >> 4, a2 >> 4, a3 >> 4, b0, b1);
    return MmaI4{c.x + 16 * r.x, c.y + 16 * r.y, c.z + 16 * r.z, c.w + 16 * r.w};
}

// The choice per mma by a flag (Mv2Q4K: a constant in each kernel variant).
static __device__ __forceinline__ MmaI4 mv_mma_k32_rt(MmaI4 c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                     uint32_t b0, uint32_t b1, int emulate) {
    return emulate ? mv_mma_k32<true>(c, a0, a1, a2, a3, b0, b1) : mv_mma_k32<false>(c, a0, a1, a2, a3, b0, b1);
}
static __device__ __forceinline__ MmaI4 mv_mma_k32_u8_rt(MmaI4 c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                        uint32_t b0, uint32_t b1, int emulate) {
    return emulate ? mv_mma_k32_u8<true>(c, a0, a1, a2, a3, b0, b1)
                   : mv_mma_k32_u8<false>(c, a0, a1, a2, a3, b0, b1);
}

// Calls F<true>(args...) or F<false>(args...) by the run-time flag `emu`: one uniform branch per
// call, the unrolled body inside straight-line code.
#define MV_EMU_SWITCH(emu, F, ...)  \
    do {                            \
        if (emu)                    \
            F<true>(__VA_ARGS__);   \
        else                        \
            F<false>(__VA_ARGS__);  \
    } while (0)

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
    static __device__ __forceinline__ void load(const uint8_t* pg, const uint8_t* pg8, int t, int mode, Frag& f) {
        f.h[0] = mv_ld16(pg, mode);
        f.h[1] = mv_ld16(pg8, mode);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            f.q[0][j] = mv_ld8(pg + 16 + 32 * j + 8 * t, mode);
            f.q[1][j] = mv_ld8(pg8 + 16 + 32 * j + 8 * t, mode);
        }
    }
    static __device__ __forceinline__ void compute(const Frag& f, int U0, const MvX& x, int lane, float (&acc)[4]) {
        MV_EMU_SWITCH(x.emulate, compute_t, f, U0, x, lane, acc);
    }
    template <bool EMU>
    static __device__ __forceinline__ void compute_t(const Frag& f, int U0, const MvX& x, int lane, float (&acc)[4]) {
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
            const MmaI4 c = mv_mma_k32<EMU>(MmaI4{0, 0, 0, 0}, (wg.x >> sh) & 0x0F0F0F0Fu, (wg8.x >> sh) & 0x0F0F0F0Fu,
                                           (wg.y >> sh) & 0x0F0F0F0Fu, (wg8.y >> sh) & 0x0F0F0F0Fu, xb.x, xb.y);
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
    static __device__ __forceinline__ void load(const uint8_t* pg, const uint8_t* pg8, int t, int mode, Frag& f) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t* p = r == 0 ? pg : pg8;
#pragma unroll
            for (int i = 0; i < 8; i++) f.ql[r][i] = mv_ld2x2(p + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * t, mode);
#pragma unroll
            for (int i = 0; i < 4; i++) f.qh[r][i] = mv_ld2x2(p + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t, mode);
#pragma unroll
            for (int i = 0; i < 4; i++) f.sc[r][i] = mv_ld2x2(p + 192 + 4 * i, mode);
        }
        f.d = (uint32_t)mv_ld2(pg + 208, mode) | ((uint32_t)mv_ld2(pg8 + 208, mode) << 16);
    }
    static __device__ __forceinline__ void compute(const Frag& f, int U0, const MvX& x, int lane, float (&acc)[4]) {
        MV_EMU_SWITCH(x.emulate, compute_t, f, U0, x, lane, acc);
    }
    // TILED: x.q's token row in the tiled q8_1 layout (common.cuh q8_1_at; mmv2_q6_k_q81t): a
    // unit's 16-byte pieces at constant offsets from the super-block's place in its 512 values
    template <bool EMU, bool TILED = false>
    static __device__ __forceinline__ void compute_t(const Frag& f, int U0, const MvX& x, int lane, float (&acc)[4]) {
        // (tiled: super-block s = U0 / 8 is the low or high half of a 512-value tile)
        const int8_t* xs = TILED ? x.q - 4 * (lane & 3) + 512 * (U0 >> 4) + 64 * ((U0 >> 3) & 1)
                                 : x.q - 4 * (lane & 3) + 32 * U0;
        // d / 4: the weights are 4 (q - 32) (q6k_weights4); exact, a power of two
        const float dg = 0.25f * f16_to_f32((uint16_t)(f.d & 0xFFFF)), dg8 = 0.25f * f16_to_f32((uint16_t)(f.d >> 16));
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int n = u >> 2, k = u & 3;
            const int U = U0 + u;
            MmaI4 c[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t w[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    w[r] = q6k_weights4(f.ql[r][n * 4 + (k & 1) * 2 + h], f.qh[r][n * 2 + h], k);
                }
                // the piece of values 32 u + 16 h of the super-block (tiled: q8_1_at's map of
                // it within the half tile, a constant)
                const int e = 32 * u + 16 * h;
                const int eo = TILED ? ((e & 48) << 3) | ((e & 192) >> 2) : e;
                const uint32_t xb = *(const uint32_t*)(xs + eo);
                c[h] = mv_mma_k16<EMU>(w[0], w[1], xb);
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

// ---- the kernels -------------------------------------------------------------------------

// This block's 16-row tile of its segment; rg / rg8 = rows g and g + 8 (clamped to the last).
struct MvTile {
    MvSegSel sel;
    int row0;
    const uint8_t* rg;
    const uint8_t* rg8;
};
static __device__ __forceinline__ MvTile mv_tile_at(const MvSegs& p, int b) {
    MvTile tl;
    tl.sel = mv_select_at(p, b);
    const int g = (threadIdx.x & 31) >> 2;
    tl.row0 = (b - tl.sel.block0) * 16;
    tl.rg = tl.sel.W + (long long)min(tl.row0 + g, tl.sel.nrows - 1) * p.row_bytes;
    tl.rg8 = tl.sel.W + (long long)min(tl.row0 + g + 8, tl.sel.nrows - 1) * p.row_bytes;
    return tl;
}
static __device__ __forceinline__ MvTile mv_tile(const MvSegs& p) { return mv_tile_at(p, (int)blockIdx.x); }

// The warp's super-blocks sb = s0 + w, s0 + w + nw, ... (< nsb) of its tile through two
// fragment buffers: the next one loads while one computes; the first loads before the wait for
// x (PDL). compute(frag, first unit of the super-block) accumulates.
template <typename F, typename C>
static __device__ __forceinline__ void mv_stream(const MvTile& tl, int nsb, int load_mode, C&& compute,
                                                 int s0 = 0) {
    const int t = threadIdx.x & 3, wid = threadIdx.y, nw = blockDim.y;
    typename F::Frag f[2];
    auto load = [&](int s, typename F::Frag& fr) {
        F::load(tl.rg + (long long)s * F::SB, tl.rg8 + (long long)s * F::SB, t, load_mode, fr);
    };
    if (s0 + wid < nsb) load(s0 + wid, f[0]);
    pdl_wait();
    pdl_trigger();
    for (int s = s0 + wid; s < nsb; s += 2 * nw) {
        if (s + nw < nsb) load(s + nw, f[1]);
        compute(f[0], 8 * s);
        if (s + nw >= nsb) break;
        if (s + 2 * nw < nsb) load(s + 2 * nw, f[0]);
        compute(f[1], 8 * (s + nw));
    }
}

// The block's warps' partial sums acc[N] summed into warp 0; false in the other warps (done).
template <int N>
static __device__ __forceinline__ bool mv_reduce_warps(float (&acc)[N]) {
    const int lane = threadIdx.x, wid = threadIdx.y, nw = blockDim.y;
    if (nw == 1) return true;
    __shared__ float red[MMV_MAX_WARPS][N][32];
#pragma unroll
    for (int i = 0; i < N; i++) red[wid][i][lane] = acc[i];
    __syncthreads();
    if (wid != 0) return false;
#pragma unroll
    for (int i = 0; i < N; i++) {
        float s = 0.0f;
        for (int w = 0; w < nw; w++) s += red[w][i][lane];
        acc[i] = s;
    }
    return true;
}

// y (+)= v (+ bias) for token tok, row `row` of the segment (rows past its end: nothing).
static __device__ __forceinline__ void mv_store(const MvSegSel& sel, int tok, int row, float v) {
    if (row >= sel.nrows) return;
    float* yp = sel.y + (long long)tok * sel.nrows + row;
    if (sel.bias) v += sel.bias[row];
    if (sel.accumulate) v += *yp;
    *yp = v;
}

// Stores one lane's 8-column results (c-fragment order: rows g, g + 8 x tokens 2t, 2t + 1;
// tokens past n_tokens: nothing).
static __device__ __forceinline__ void mv_store8(const MvTile& tl, const float (&v)[4], int n_tokens) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int tok = 2 * t + (i & 1);
        if (tok < n_tokens) mv_store(tl.sel, tok, tl.row0 + g + 8 * (i >> 1), v[i]);
    }
}

// The 8-column kernels' results summed over the block's warps and stored by warp 0.
static __device__ __forceinline__ void mv_finish8(const MvTile& tl, float (&acc)[4], int n_tokens) {
    if (mv_reduce_warps(acc)) mv_store8(tl, acc, n_tokens);
}

// ---- K split (mmv2): a tile's super-blocks shared by `ks` blocks ---------------------------
//
// Why: a 5120-row matrix has 320 16-row tiles, 2.4 blocks per SM of the H200's 132: a third of
// the SMs run 3 blocks while the rest run 2 and wait. With ks blocks per tile (block b: tile
// b / ks, part b % ks, super-blocks [part nsb / ks, (part + 1) nsb / ks)), the parts write
// their sums to kpart and the last part of a tile to finish (a counter per tile, reset by it
// for the next launch) adds them in part order and stores: the same bits whichever finishes
// last.
struct MvKs {
    int tile, part, ks, s0, s1;  // s0 .. s1: this part's super-blocks
};
static __device__ __forceinline__ MvKs mv_ks(int ks, int nsb) {
    MvKs k;
    k.ks = ks;
    k.tile = (int)blockIdx.x / ks;
    k.part = (int)blockIdx.x - k.tile * ks;
    k.s0 = k.part * nsb / ks;
    k.s1 = (k.part + 1) * nsb / ks;
    return k;
}

// mv_finish8 for a K-split launch: kpart [tiles][ks][32 lanes][4], kcount [tiles] (0 between
// launches).
static __device__ __forceinline__ void mv_finish8_ks(const MvTile& tl, float (&acc)[4], int n_tokens, const MvKs& k,
                                                     float* __restrict__ kpart, int* __restrict__ kcount) {
    if (k.ks == 1) {
        mv_finish8(tl, acc, n_tokens);
        return;
    }
    if (!mv_reduce_warps(acc)) return;
    const int lane = threadIdx.x & 31;
    float* mine = kpart + ((long long)k.tile * k.ks + k.part) * 128 + 4 * lane;
    *(float4*)mine = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __threadfence();
    int last = 0;
    if (lane == 0) last = atomicAdd(kcount + k.tile, 1) == k.ks - 1;
    last = __shfl_sync(FULL_MASK, last, 0);
    if (!last) return;
    __threadfence();
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int q = 0; q < k.ks; q++) {
        const float4 v = __ldcg((const float4*)(kpart + ((long long)k.tile * k.ks + q) * 128 + 4 * lane));
        sum[0] += v.x;
        sum[1] += v.y;
        sum[2] += v.z;
        sum[3] += v.w;
    }
    if (lane == 0) kcount[k.tile] = 0;
    mv_store8(tl, sum, n_tokens);
}

// This thread's q8_1 x of a launch of n_tokens tokens (columns past n_tokens read the last
// token's): token g's row at + 8t, the (d, d * sum) pairs of tokens 2t and 2t + 1.
static __device__ __forceinline__ MvX mv_x(const int8_t* __restrict__ xq, const float* __restrict__ xds_f, int ncols,
                                           int n_tokens, int emulate) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nunits = ncols / 32;
    MvX x;
    x.q = xq + (long long)min(g, n_tokens - 1) * ncols + 8 * t;
    x.d0 = (const MvF2*)xds_f + (long long)min(2 * t, n_tokens - 1) * nunits;
    x.d1 = (const MvF2*)xds_f + (long long)min(2 * t + 1, n_tokens - 1) * nunits;
    x.emulate = emulate;
    return x;
}

// 8 token columns: C holds rows g, g + 8 x tokens 2t, 2t + 1 per unit.
template <typename F>
static __device__ __forceinline__ void mmv(const MvSegs& p, const int8_t* __restrict__ xq,
                                           const float* __restrict__ xds_f, int n_tokens, int load_mode, int emulate) {
    const MvTile tl = mv_tile(p);
    const int lane = threadIdx.x;
    const int ncols = p.ncols, nsb = ncols / 256;
    // (pointers only: x is read after the wait in mv_stream)
    const MvX x = mv_x(xq, xds_f, ncols, n_tokens, emulate);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mv_stream<F>(tl, nsb, load_mode, [&](const typename F::Frag& f, int U0) { F::compute(f, U0, x, lane, acc); });
    mv_finish8(tl, acc, n_tokens);
}

// ---- block-diagonal B for 1..4 tokens (Q4_K) -----------------------------------------------
//
// With n <= NP tokens (NP = 1, 2, 4), the 8 columns of B hold NP tokens x G = 8 / NP units:
// column (tau, v) is x of token tau restricted to unit v of a "group" of G units (CG = G / 2
// chunks of 32 qs bytes: the low and high nibble units of one chunk), zero in the k-slots of
// the other units. Then C[row][(tau, v)] summed over the group's M = 2 CG mmas is the dot of
// unit v alone, and no C value is wasted on padding tokens: the per-unit scale work (the cost
// that kept mmv_ at 4x the matvec's instructions per byte) is done for n real token columns,
// not for 8. k-slots: thread t (chunk c = t / TPC of the group, TPC = 4 / CG threads per
// chunk, slice s = t % TPC of BPT = 32 / TPC bytes) holds in mma m bytes s BPT + 4m .. + 3 of
// its chunk: a0/a1 = their low nibbles (rows g, g + 8), a2/a3 = their high nibbles. Its B words
// are x of column g at the same element offsets, kept only where column g's unit is that low
// (b0) or high (b1) unit. Its C values c0, c1 (c2, c3 for row g + 8) are columns 2t, 2t + 1:
// token 2t / G, the low and high unit of chunk (2t % G) / 2.

// Q4_K scales of sub-blocks j (0..7) as bytes, four per word (ggml get_scale_min_k4): words
// [sc 0..3, mn 0..3, sc 4..7, mn 4..7].
struct MvK4Scales {
    uint32_t sc_lo, mn_lo, sc_hi, mn_hi;
};
static __device__ __forceinline__ MvK4Scales mv_k4_scales(const MvV4& h) {
    MvK4Scales r;
    r.sc_lo = h.y & 0x3F3F3F3Fu;
    r.mn_lo = h.z & 0x3F3F3F3Fu;
    r.sc_hi = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    r.mn_hi = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
    return r;
}
// (d * sc_j, -dmin * mn_j) of sub-block j
static __device__ __forceinline__ void mv_k4_scale(const MvK4Scales& q, float d, float dmin, int j, float& sc,
                                                   float& mn) {
    const int sh = 8 * (j & 3);
    const uint32_t ws = j < 4 ? q.sc_lo : q.sc_hi, wm = j < 4 ? q.mn_lo : q.mn_hi;
    sc = d * (float)((ws >> sh) & 0xFF);
    mn = -dmin * (float)((wm >> sh) & 0xFF);
}

template <int NP>
struct MvQ4KBd {
    static constexpr int SB = 144;
    static constexpr int G = 8 / NP, CG = G / 2, TPC = 4 / CG, M = 2 * CG, BPT = 32 / TPC;
    struct Frag {
        MvV4 h[2];                // headers of rows g, g + 8
        uint32_t q[2][NP][M];     // [row][group][word]: BPT = 4 M bytes of this thread's chunk slice
    };
    static __device__ __forceinline__ void load(const uint8_t* pg, const uint8_t* pg8, int t, int mode, Frag& f) {
        f.h[0] = mv_ld16(pg, mode);
        f.h[1] = mv_ld16(pg8, mode);
        const int off = 16 + 32 * (t / TPC) + (t % TPC) * BPT;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t* p = (r == 0 ? pg : pg8) + off;
#pragma unroll
            for (int gr = 0; gr < NP; gr++) {
                const uint8_t* q = p + 32 * CG * gr;
                if constexpr (BPT == 32) {
                    const MvV4 a = mv_ld16(q, mode), b = mv_ld16(q + 16, mode);
                    f.q[r][gr][0] = a.x; f.q[r][gr][1] = a.y; f.q[r][gr][2] = a.z; f.q[r][gr][3] = a.w;
                    f.q[r][gr][4] = b.x; f.q[r][gr][5] = b.y; f.q[r][gr][6] = b.z; f.q[r][gr][7] = b.w;
                } else if constexpr (BPT == 16) {
                    const MvV4 a = mv_ld16(q, mode);
                    f.q[r][gr][0] = a.x; f.q[r][gr][1] = a.y; f.q[r][gr][2] = a.z; f.q[r][gr][3] = a.w;
                } else {
                    const MvV2 a = mv_ld8(q, mode);
                    f.q[r][gr][0] = a.x; f.q[r][gr][1] = a.y;
                }
            }
        }
    }
};

// x of this thread: B words of column g (token g / G) and the scales of its output token.
struct MvXBd {
    const int8_t* q;   // xq of column g's token, + its slice offset within a unit
    const MvF2* d;     // xds of this thread's output token
    uint32_t m0, m1;   // keep b0 / b1 (column g's unit is this thread's low / high unit)
    int emulate;
};

template <int NP, bool EMU>
static __device__ __forceinline__ void mvbd_compute_t(const typename MvQ4KBd<NP>::Frag& f, int U0, const MvXBd& x,
                                                      int t, float (&acc)[2]) {
    using F = MvQ4KBd<NP>;
    const int g = (threadIdx.x & 31) >> 2;
    const int cg = g % F::G;                 // column g's unit within its group
    const int cc = (2 * t % F::G) / 2;       // this thread's output chunk within a group
    MvK4Scales q[2];
    float d[2], dmin[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        q[r] = mv_k4_scales(f.h[r]);
        d[r] = f16_to_f32((uint16_t)(f.h[r].x & 0xFFFF));
        dmin[r] = f16_to_f32((uint16_t)(f.h[r].x >> 16));
    }
#pragma unroll
    for (int gr = 0; gr < NP; gr++) {
        // column g's x: unit (group gr, cg) of its token, this thread's slice
        const int8_t* xp = x.q + 32 * (U0 + 2 * F::CG * gr + cg);
        uint32_t xw[F::M];
        if constexpr (F::BPT == 32) {
            const MvV4 a = *(const MvV4*)xp, b = *(const MvV4*)(xp + 16);
            xw[0] = a.x; xw[1] = a.y; xw[2] = a.z; xw[3] = a.w; xw[4] = b.x; xw[5] = b.y; xw[6] = b.z; xw[7] = b.w;
        } else if constexpr (F::BPT == 16) {
            const MvV4 a = *(const MvV4*)xp;
            xw[0] = a.x; xw[1] = a.y; xw[2] = a.z; xw[3] = a.w;
        } else {
            const MvV2 a = *(const MvV2*)xp;
            xw[0] = a.x; xw[1] = a.y;
        }
        MmaI4 c{0, 0, 0, 0};
#pragma unroll
        for (int m = 0; m < F::M; m++) {
            const uint32_t wg = f.q[0][gr][m], wg8 = f.q[1][gr][m];
            c = mv_mma_k32<EMU>(c, wg & 0x0F0F0F0Fu, wg8 & 0x0F0F0F0Fu, (wg >> 4) & 0x0F0F0F0Fu,
                                (wg8 >> 4) & 0x0F0F0F0Fu, xw[m] & x.m0, xw[m] & x.m1);
        }
        // this thread's units: low / high nibble of chunk (group gr, cc)
        const int j = 2 * (F::CG * gr + cc);
        const MvV4 xs = *(const MvV4*)(x.d + U0 + j);  // (d, d sum) of units j, j + 1
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float s0, m0, s1, m1;
            mv_k4_scale(q[r], d[r], dmin[r], j, s0, m0);
            mv_k4_scale(q[r], d[r], dmin[r], j + 1, s1, m1);
            const int c0 = r == 0 ? c.x : c.z, c1 = r == 0 ? c.y : c.w;
            acc[r] += (float)c0 * (s0 * __uint_as_float(xs.x)) + m0 * __uint_as_float(xs.y) +
                      (float)c1 * (s1 * __uint_as_float(xs.z)) + m1 * __uint_as_float(xs.w);
        }
    }
}

template <int NP>
static __device__ __forceinline__ void mmvbd(const MvSegs& p, const int8_t* __restrict__ xq,
                                             const float* __restrict__ xds_f, int n_tokens, int load_mode,
                                             int emulate) {
    using F = MvQ4KBd<NP>;
    const MvTile tl = mv_tile(p);
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    const int ncols = p.ncols, nsb = ncols / 256, nunits = ncols / 32;
    const int cg = g % F::G, ctok = g / F::G;      // column g: unit in group, token
    const int tok = 2 * t / F::G;                  // this thread's output token
    const int chunk = t / F::TPC;                  // this thread's A chunk within a group
    // (pointers only: x is read after the wait in mv_stream)
    MvXBd x;
    x.q = xq + (long long)min(ctok, n_tokens - 1) * ncols + (t % F::TPC) * F::BPT;
    x.d = (const MvF2*)xds_f + (long long)min(tok, n_tokens - 1) * nunits;
    x.m0 = cg == 2 * chunk ? 0xFFFFFFFFu : 0u;
    x.m1 = cg == 2 * chunk + 1 ? 0xFFFFFFFFu : 0u;
    x.emulate = emulate;
    float acc[2] = {0.0f, 0.0f};
    mv_stream<F>(tl, nsb, load_mode, [&](const typename F::Frag& f, int U0) {
        if (x.emulate)
            mvbd_compute_t<NP, true>(f, U0, x, t, acc);
        else
            mvbd_compute_t<NP, false>(f, U0, x, t, acc);
    });
    // threads with the same output token hold other chunks of the same rows
#pragma unroll
    for (int o = 1; o < 4 / NP; o <<= 1) {
        acc[0] += __shfl_xor_sync(FULL_MASK, acc[0], o);
        acc[1] += __shfl_xor_sync(FULL_MASK, acc[1], o);
    }
    if (!mv_reduce_warps(acc)) return;
    if (t % (4 / NP) != 0 || tok >= n_tokens) return;
    mv_store(tl.sel, tok, tl.row0 + g, acc[0]);
    mv_store(tl.sel, tok, tl.row0 + g + 8, acc[1]);
}

// Every product kernel comes twice: `name` with the int8 mma (the emulation compiled out: on
// sm_90 the staged Q4_K kernel then takes 60 registers instead of 80, mmv2_q6_k 120 instead of
// 128) and `name_emu` with it emulated by shuffles + dp4a (sm_70, tests). Both take the same
// parameters; `emulate` is ignored (the suffix decides; the host picks it).
#define MMVBD_KERNEL1(NP, SUFFIX, EMU)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                     \
        mmv_q4_k_t##NP##SUFFIX(const MvSegs p, const int8_t* __restrict__ xq, const float* __restrict__ xds, \
                               int n_tokens, int load_mode, int emulate) {                                \
        (void)emulate;                                                                                   \
        mmvbd<NP>(p, xq, xds, n_tokens, load_mode, EMU);                                                  \
    }
#define MMVBD_KERNEL(NP) MMVBD_KERNEL1(NP, , 0) MMVBD_KERNEL1(NP, _emu, 1)
MMVBD_KERNEL(1)
MMVBD_KERNEL(2)
MMVBD_KERNEL(4)

// One kernel per format (8 token columns).
#define MMV_KERNEL1(name, F, SUFFIX, EMU)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                    \
        mmv_##name##SUFFIX(const MvSegs p, const int8_t* __restrict__ xq, const float* __restrict__ xds,  \
                           int n_tokens, int load_mode, int emulate) {                                  \
        (void)emulate;                                                                                   \
        mmv<F>(p, xq, xds, n_tokens, load_mode, EMU);                                                   \
    }
#define MMV_KERNEL(name, F) MMV_KERNEL1(name, F, , 0) MMV_KERNEL1(name, F, _emu, 1)

MMV_KERNEL(q4_k, MvQ4K)
MMV_KERNEL(q6_k, MvQ6K)

// ---- mmv2: q8_K activations, integer sums across each super-block ----------------------------
//
// Why: with q8_1 x (one float scale per 32 activations) the 8-column kernel above turns every
// C value into float and scales it per (row, token, unit): ~16 instructions per unit and thread
// whatever the token count, which keeps it instruction bound. With x quantized q8_K-style
// (llama.cpp's CPU format for K-quants: one f32 scale per 256 activations) the dot of one
// Q4_K super-block of a row with one token is
//     dy * (d * sum_u sc_u * (q4_u . q_u) - dmin * sum_u m_u * bsum_u)
// where q4_u . q_u is one C value of unit u's mma (|.| <= 32 * 15 * 127) and sc_u, m_u < 64
// (6-bit): integer until the one float step per super-block. Per unit and thread: the nibble
// masks, one 8-byte x load, one mma from a zero C, two scale byte extracts, 4 IMADs — for any
// token count 1..8 (C column = token). The mins meet the int16 sums of q per unit by dp2a, once per
// super-block. Q6_K (16-element sub-blocks, signed 8-bit scales, no mins: 4 (q - 32) goes into
// the mma as a signed byte, q6k_weights4) takes two m16n8k16 per unit, each C value times its
// sub-block's scale in int32 (|sum| <= 16 * 128 * 16 * 128 * 127 < 2^31), one float step per
// super-block.
//
// Layout (common.cuh q8k_q_at, q8k_sb_at): x8.q token-interleaved per 32-value unit,
// [ncols / 32][n_tokens][32] int8, so a warp's x load of one unit (token g's bytes 8t .. + 7
// at lane 4g + t, same k order as mmv_) reads the 8 tokens' 256 contiguous bytes, 2 cache lines
// (with rows of [n_tokens, ncols] it touched one line per token: at 8 tokens those L1
// wavefronts outnumbered the weights', and time grew with the token count: Q4_K 27648x5120
// 32.2 -> 38.8 µs, Q6_K 50.6 -> 66.0 from 1 to 8 tokens); x8.dy [ncols / 256][n_tokens] f32
// (x ~ dy * q), x8.bsum [ncols / 256][n_tokens][8] int16 (sum of q per unit; 16 bytes per
// super-block and token). W, y, segments, warps and fragments as mmv_ (MvQ4K / MvQ6K
// loads); one super-block in flight per warp while one computes (two, at ~128 registers, and
// the Q4_K headers shared by a quad were both slower or equal on the H200).

// x: [n_tokens, ncols] f32 (ncols % 256 == 0) -> q8_K as quant::activation::quantize_row_q8_k
// (ggml quantize_row_q8_K), bit for bit: per 256, iscale = -127 / (the first element of largest
// magnitude), q = min(127, rint(iscale x)), dy = 1 / iscale (all 0 for a zero block), plus bsum
// per 32, laid out (q8k_q_at) over nlay >= n_tokens tokens (n_tokens rounded up to 8 past 8
// tokens, for the n-tile kernels; the padding tokens are not written). grid (ceil(ncols / 256
// / 8), n_tokens), block (32, 8): a warp per 256, 8 consecutive elements per lane. Waits for
// the previous kernel first (PDL).
extern "C" __global__ void __launch_bounds__(256) quantize_q8_k(const float* __restrict__ x, int8_t* __restrict__ q,
                                                                float* __restrict__ dy,
                                                                int16_t* __restrict__ bsum, int ncols, int nlay) {
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x, sb = blockIdx.x * blockDim.y + threadIdx.y, tok = blockIdx.y;
    if (sb * 256 >= ncols) return;
    const long long row = (long long)tok * ncols + 256 * sb;
    const MvV4 a = *(const MvV4*)(x + row + 8 * lane), b = *(const MvV4*)(x + row + 8 * lane + 4);
    const float v[8] = {__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(a.z), __uint_as_float(a.w),
                        __uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w)};
    // the CPU's scan keeps the first element of strictly larger magnitude: the largest |v|,
    // ties to the lowest index
    float am = 0.0f, mx = 0.0f;
    int idx = 0x7FFFFFFF;
#pragma unroll
    for (int i = 0; i < 8; i++) q8k_pick(am, mx, idx, fabsf(v[i]), v[i], 8 * lane + i);
    q8k_pick_warp(am, mx, idx);
    uint32_t w[2] = {0u, 0u};
    int sum = 0;
    float d = 0.0f;
    if (am > 0.0f) {
        const float iscale = -127.0f / mx;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int qi = min(127, __float2int_rn(iscale * v[i]));
            sum += qi;
            w[i >> 2] |= ((uint32_t)qi & 0xFFu) << (8 * (i & 3));
        }
        d = 1.0f / iscale;
    }
    const int ntok = nlay;
    *(MvV2*)(q + q8k_q_at(tok, 256 * sb + 8 * lane, ntok)) = MvV2{w[0], w[1]};
    sum += __shfl_xor_sync(FULL_MASK, sum, 1);
    sum += __shfl_xor_sync(FULL_MASK, sum, 2);
    if ((lane & 3) == 0) bsum[8 * q8k_sb_at(tok, 256 * sb, ntok) + (lane >> 2)] = (int16_t)sum;
    if (lane == 0) dy[q8k_sb_at(tok, 256 * sb, ntok)] = d;
}

// quantize_q8_1 and quantize_q8_k of the same x in one launch (for a product whose x no kernel
// quantized yet, taken by mmv2): grid (ncols / 256, n_tokens), block 256, one value per thread.
// The same bits as the two kernels (common.cuh q8_1_unit, q8_k_unit_block).
extern "C" __global__ void __launch_bounds__(256)
    quantize_q8_1_k(const float* __restrict__ x, int8_t* __restrict__ xq, float* __restrict__ xds,
                    int8_t* __restrict__ q, float* __restrict__ dy, int16_t* __restrict__ bsum, int ncols) {
    pdl_wait();
    pdl_trigger();
    const long long col = 256LL * blockIdx.x + threadIdx.x;
    const long long i = (long long)blockIdx.y * ncols + col;
    const float v = x[i];
    q8_1_unit(v, xq, xds, i, i / 32);
    q8_k_unit_block(v, true, q, dy, bsum, blockIdx.y, col, gridDim.y);
}

// c + a.h0 * b.b0 + a.h1 * b.b1 (.lo: bytes 0, 1 of b; .hi: bytes 2, 3); a: two int16, b: u8.
static __device__ __forceinline__ int mv2_dp2a_lo(uint32_t a, uint32_t b, int c) {
    int r;
    asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
static __device__ __forceinline__ int mv2_dp2a_hi(uint32_t a, uint32_t b, int c) {
    int r;
    asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// x of this thread: B words of token g, super-block scales and unit sums of tokens 2t, 2t + 1
// (common.cuh q8k_q_at: unit U of token g at q + 32 (U n + g); super-block s's bsum / dy of
// token k at index s n + k).
struct Mv2X {
    const int8_t* q;    // q of token g in unit 0, + 8t
    const MvV4* bs0;    // bsum of token 2t in super-block 0 (8 int16); super-block s: + s n
    const MvV4* bs1;    // ... token 2t + 1
    const float* dy0;   // dy of token 2t in super-block 0; super-block s: + s n
    const float* dy1;
    int n;              // tokens of the launch (the stride between units' token groups)
    int emulate;
};

// This thread's q8_K x for a launch of n_tokens tokens (columns past n_tokens read the last
// token's, as mmv_ does).
static __device__ __forceinline__ Mv2X mv2_x(const int8_t* __restrict__ q, const float* __restrict__ dy,
                                             const int16_t* __restrict__ bsum, int n_tokens, int emulate) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int t0 = min(2 * t, n_tokens - 1), t1 = min(2 * t + 1, n_tokens - 1);
    Mv2X x;
    x.q = q + 32 * min(g, n_tokens - 1) + 8 * t;
    x.bs0 = (const MvV4*)bsum + t0;
    x.bs1 = (const MvV4*)bsum + t1;
    x.dy0 = dy + t0;
    x.dy1 = dy + t1;
    x.n = n_tokens;
    x.emulate = emulate;
    return x;
}

// sum_u m_u * bsum_u over a super-block: bsums (8 int16) against the packed 6-bit mins.
static __device__ __forceinline__ int mv2_min_dot(const MvV4& bs, const MvK4Scales& k) {
    return mv2_dp2a_lo(bs.x, k.mn_lo, mv2_dp2a_hi(bs.y, k.mn_lo, mv2_dp2a_lo(bs.z, k.mn_hi, mv2_dp2a_hi(bs.w, k.mn_hi, 0))));
}

// acc (c-fragment order) += the super-block's integer sums ai times the rows' scales (dg: row g,
// d8: row g + 8) times the tokens' dy (2t, 2t + 1) of super-block s: one float step per sum.
static __device__ __forceinline__ void mv2_add_scaled(const int (&ai)[4], float dg, float d8, int s, const Mv2X& x,
                                                      float (&acc)[4]) {
    const float y0 = x.dy0[s * x.n], y1 = x.dy1[s * x.n];
    acc[0] += (dg * y0) * (float)ai[0];
    acc[1] += (dg * y1) * (float)ai[1];
    acc[2] += (d8 * y0) * (float)ai[2];
    acc[3] += (d8 * y1) * (float)ai[3];
}

struct Mv2Q4K {
    using F = MvQ4K;
    // acc (c-fragment order) += super-block s of rows g, g + 8 against tokens 2t, 2t + 1
    static __device__ __forceinline__ void compute(const F::Frag& f, int s, const Mv2X& x, float (&acc)[4]) {
        const MvK4Scales k0 = mv_k4_scales(f.h[0]), k1 = mv_k4_scales(f.h[1]);
        const int us = 32 * x.n;  // bytes from one unit's tokens to the next unit's
        const int8_t* xs = x.q + (long long)(8 * s) * us;
        // Sums at 16x: the high-nibble (odd) units keep their nibbles in place (16 q, unsigned bytes
        // into the mma: no shift per word), the low-nibble (even) units take 16 x their scale
        // (extracted as sc << 4); |ai| <= 8 * 63 * 16 * 32 * 15 * 127 < 2^31, and ai >> 4 below is
        // exact.
        int ai[4] = {0, 0, 0, 0};
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const MvV2 wg = f.q[0][u >> 1], wg8 = f.q[1][u >> 1];
            const MvV2 xb = *(const MvV2*)(xs + u * us);
            const uint32_t m = (u & 1) ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
            const MmaI4 c = (u & 1) ? mv_mma_k32_u8_rt(MmaI4{0, 0, 0, 0}, wg.x & m, wg8.x & m, wg.y & m, wg8.y & m,
                                                       xb.x, xb.y, x.emulate)
                                    : mv_mma_k32_rt(MmaI4{0, 0, 0, 0}, wg.x & m, wg8.x & m, wg.y & m, wg8.y & m,
                                                    xb.x, xb.y, x.emulate);
            // the unit's 6-bit scales of both rows, byte u % 4: as is (one PRMT) for odd units,
            // times 16 for even ones
            const uint32_t w0 = u < 4 ? k0.sc_lo : k0.sc_hi, w8 = u < 4 ? k1.sc_lo : k1.sc_hi;
            const int j = u & 3;
            const int sg = (u & 1) ? (int)__byte_perm(w0, 0u, 0x4440u | j) : (int)(((w0 >> (8 * j)) << 4) & 0x3F0u);
            const int s8 = (u & 1) ? (int)__byte_perm(w8, 0u, 0x4440u | j) : (int)(((w8 >> (8 * j)) << 4) & 0x3F0u);
            ai[0] += sg * c.x;
            ai[1] += sg * c.y;
            ai[2] += s8 * c.z;
            ai[3] += s8 * c.w;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) ai[i] >>= 4;
        const MvV4 b0 = x.bs0[s * x.n], b1 = x.bs1[s * x.n];
        const float y0 = x.dy0[s * x.n], y1 = x.dy1[s * x.n];
        const float dg = f16_to_f32((uint16_t)(f.h[0].x & 0xFFFF)), mg = f16_to_f32((uint16_t)(f.h[0].x >> 16));
        const float d8 = f16_to_f32((uint16_t)(f.h[1].x & 0xFFFF)), m8 = f16_to_f32((uint16_t)(f.h[1].x >> 16));
        acc[0] += y0 * (dg * (float)ai[0] - mg * (float)mv2_min_dot(b0, k0));
        acc[1] += y1 * (dg * (float)ai[1] - mg * (float)mv2_min_dot(b1, k0));
        acc[2] += y0 * (d8 * (float)ai[2] - m8 * (float)mv2_min_dot(b0, k1));
        acc[3] += y1 * (d8 * (float)ai[3] - m8 * (float)mv2_min_dot(b1, k1));
    }
};

struct Mv2Q6K {
    using F = MvQ6K;
    static __device__ __forceinline__ void compute(const F::Frag& f, int s, const Mv2X& x, float (&acc)[4]) {
        MV_EMU_SWITCH(x.emulate, compute_t, f, s, x, acc);
    }
    template <bool EMU>
    static __device__ __forceinline__ void compute_t(const F::Frag& f, int s, const Mv2X& x, float (&acc)[4]) {
        const int t = threadIdx.x & 3;
        // this thread's k16 B words: bytes 16h + 4t of each unit
        const int us = 32 * x.n;  // bytes from one unit's tokens to the next unit's
        const int8_t* xs = x.q - 4 * t + (long long)(8 * s) * us;
        int ai[4] = {0, 0, 0, 0};
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int n = u >> 2, k = u & 3;
            MmaI4 c[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t w[2];
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    w[r] = q6k_weights4(f.ql[r][n * 4 + (k & 1) * 2 + h], f.qh[r][n * 2 + h], k);
                }
                const uint32_t xb = *(const uint32_t*)(xs + u * us + 16 * h);
                c[h] = mv_mma_k16<EMU>(w[0], w[1], xb);
            }
            // scales sc[8n + 2k + h] of both rows: byte (2k + h) % 4 of word 2n + k / 2
            const int wi = 2 * n + (k >> 1), b0 = 8 * ((2 * k) & 3);
            const int sg0 = (int)(int8_t)(f.sc[0][wi] >> b0), sg1 = (int)(int8_t)(f.sc[0][wi] >> (b0 + 8));
            const int s80 = (int)(int8_t)(f.sc[1][wi] >> b0), s81 = (int)(int8_t)(f.sc[1][wi] >> (b0 + 8));
            ai[0] += sg0 * c[0].x + sg1 * c[1].x;
            ai[1] += sg0 * c[0].y + sg1 * c[1].y;
            ai[2] += s80 * c[0].z + s81 * c[1].z;
            ai[3] += s80 * c[0].w + s81 * c[1].w;
        }
        // d / 4: the weights are 4 (q - 32) (q6k_weights4); exact, a power of two
        mv2_add_scaled(ai, 0.25f * f16_to_f32((uint16_t)(f.d & 0xFFFF)), 0.25f * f16_to_f32((uint16_t)(f.d >> 16)), s,
                       x, acc);
    }
};

// ---- mmv2 for 9..32 tokens: NT tiles of 8 tokens per warp ----------------------------------
//
// Why: mmq (q8_1 x, a float scale per 32 activations) spends ~60 SASS instructions per mma,
// a third of them per-unit float work, and moved the 32-token Q4_K 27648x5120 product at 0.44
// TB/s (H200, session 22); mmv2 at 8 tokens streams it at ~2 TB/s. Here a warp decodes each
// unit of its 16 rows once (nibble masks, the two rows' scales) and runs it against NT tiles
// of 8 tokens: per tile one 8-byte x load, one mma, 4 IMADs; the float step stays once per
// super-block, row and token. The x layout is q8k_q_at's over nl = n_tokens rounded up to 8
// tokens (quantize_q8_k's `nlay`, crate::mmv::q8k_layout_tokens): tile j of a unit sits 256 j
// bytes after tile 0, a constant offset from one address per unit. The padding tokens' values
// are whatever the scratch held (finite: only quantize writes there); their columns are not
// stored.
struct Mv2XN {
    const int8_t* q;     // token g's bytes 8t.. of unit 0
    const int16_t* bsum;  // token 2t's sums of super-block 0 (+ 1: token 2t + 1)
    const float* dy;      // ... its dy
    int nl;              // tokens of the layout
    int emulate;
};

static __device__ __forceinline__ Mv2XN mv2n_x(const int8_t* __restrict__ q, const float* __restrict__ dy,
                                               const int16_t* __restrict__ bsum, int n_tokens, int emulate) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    Mv2XN x;
    x.q = q + 32 * g + 8 * t;
    x.bsum = bsum + 8 * (2 * t);
    x.dy = dy + 2 * t;
    x.nl = (n_tokens + 7) & ~7;
    x.emulate = emulate;
    return x;
}

// Mv2Q4K::compute for NT tiles: acc[j] (c-fragment order) += super-block s of rows g, g + 8
// against tile j's tokens 8j + 2t, 8j + 2t + 1. The same integer sums per tile as compute.
template <int NT>
static __device__ __forceinline__ void mv2n_q4k(const MvQ4K::Frag& f, int s, const Mv2XN& x,
                                                float (&acc)[NT][4]) {
    const MvK4Scales k0 = mv_k4_scales(f.h[0]), k1 = mv_k4_scales(f.h[1]);
    const int us = 32 * x.nl;
    const int8_t* xs = x.q + (long long)(8 * s) * us;
    int ai[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) ai[j][0] = ai[j][1] = ai[j][2] = ai[j][3] = 0;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const MvV2 wg = f.q[0][u >> 1], wg8 = f.q[1][u >> 1];
        const uint32_t m = (u & 1) ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
        const uint32_t a0 = wg.x & m, a1 = wg8.x & m, a2 = wg.y & m, a3 = wg8.y & m;
        const uint32_t w0 = u < 4 ? k0.sc_lo : k0.sc_hi, w8 = u < 4 ? k1.sc_lo : k1.sc_hi;
        const int jb = u & 3;
        const int sg = (u & 1) ? (int)__byte_perm(w0, 0u, 0x4440u | jb) : (int)(((w0 >> (8 * jb)) << 4) & 0x3F0u);
        const int s8 = (u & 1) ? (int)__byte_perm(w8, 0u, 0x4440u | jb) : (int)(((w8 >> (8 * jb)) << 4) & 0x3F0u);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const MvV2 xb = *(const MvV2*)(xs + u * us + 256 * j);
            const MmaI4 c = (u & 1) ? mv_mma_k32_u8_rt(MmaI4{0, 0, 0, 0}, a0, a1, a2, a3, xb.x, xb.y, x.emulate)
                                    : mv_mma_k32_rt(MmaI4{0, 0, 0, 0}, a0, a1, a2, a3, xb.x, xb.y, x.emulate);
            ai[j][0] += sg * c.x;
            ai[j][1] += sg * c.y;
            ai[j][2] += s8 * c.z;
            ai[j][3] += s8 * c.w;
        }
    }
    const float dg = f16_to_f32((uint16_t)(f.h[0].x & 0xFFFF)), mg = f16_to_f32((uint16_t)(f.h[0].x >> 16));
    const float d8 = f16_to_f32((uint16_t)(f.h[1].x & 0xFFFF)), m8 = f16_to_f32((uint16_t)(f.h[1].x >> 16));
    const MvV4* bs = (const MvV4*)x.bsum + s * x.nl;
    const float* dys = x.dy + s * x.nl;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const MvV4 b0 = bs[8 * j], b1 = bs[8 * j + 1];
        const float y0 = dys[8 * j], y1 = dys[8 * j + 1];
        acc[j][0] += y0 * (dg * (float)(ai[j][0] >> 4) - mg * (float)mv2_min_dot(b0, k0));
        acc[j][1] += y1 * (dg * (float)(ai[j][1] >> 4) - mg * (float)mv2_min_dot(b1, k0));
        acc[j][2] += y0 * (d8 * (float)(ai[j][2] >> 4) - m8 * (float)mv2_min_dot(b0, k1));
        acc[j][3] += y1 * (d8 * (float)(ai[j][3] >> 4) - m8 * (float)mv2_min_dot(b1, k1));
    }
}

// Mv2Q6K::compute_t for NT tiles (the weights of each unit decoded once).
template <int NT, bool EMU>
static __device__ __forceinline__ void mv2n_q6k(const MvQ6K::Frag& f, int s, const Mv2XN& x,
                                                float (&acc)[NT][4]) {
    const int t = threadIdx.x & 3;
    const int us = 32 * x.nl;
    // this thread's k16 B words: bytes 16h + 4t of each unit
    const int8_t* xs = x.q - 4 * t + (long long)(8 * s) * us;
    int ai[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) ai[j][0] = ai[j][1] = ai[j][2] = ai[j][3] = 0;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int n = u >> 2, k = u & 3;
        uint32_t w[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int r = 0; r < 2; r++) w[h][r] = q6k_weights4(f.ql[r][n * 4 + (k & 1) * 2 + h], f.qh[r][n * 2 + h], k);
        }
        const int wi = 2 * n + (k >> 1), b0 = 8 * ((2 * k) & 3);
        const int sg0 = (int)(int8_t)(f.sc[0][wi] >> b0), sg1 = (int)(int8_t)(f.sc[0][wi] >> (b0 + 8));
        const int s80 = (int)(int8_t)(f.sc[1][wi] >> b0), s81 = (int)(int8_t)(f.sc[1][wi] >> (b0 + 8));
#pragma unroll
        for (int j = 0; j < NT; j++) {
            MmaI4 c[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t xb = *(const uint32_t*)(xs + u * us + 256 * j + 16 * h);
                c[h] = mv_mma_k16<EMU>(w[h][0], w[h][1], xb);
            }
            ai[j][0] += sg0 * c[0].x + sg1 * c[1].x;
            ai[j][1] += sg0 * c[0].y + sg1 * c[1].y;
            ai[j][2] += s80 * c[0].z + s81 * c[1].z;
            ai[j][3] += s80 * c[0].w + s81 * c[1].w;
        }
    }
    const float dg = 0.25f * f16_to_f32((uint16_t)(f.d & 0xFFFF)), d8 = 0.25f * f16_to_f32((uint16_t)(f.d >> 16));
    const float* dys = x.dy + s * x.nl;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const float y0 = dys[8 * j], y1 = dys[8 * j + 1];
        acc[j][0] += (dg * y0) * (float)ai[j][0];
        acc[j][1] += (dg * y1) * (float)ai[j][1];
        acc[j][2] += (d8 * y0) * (float)ai[j][2];
        acc[j][3] += (d8 * y1) * (float)ai[j][3];
    }
}

// The NT-tile results summed over the block's warps and stored by warp 0 (tile j: tokens
// 8j + 2t, 8j + 2t + 1; past n_tokens: nothing).
template <int NT>
static __device__ __forceinline__ void mv_finishn(const MvTile& tl, float (&acc)[NT][4], int n_tokens) {
    float(&flat)[4 * NT] = reinterpret_cast<float(&)[4 * NT]>(acc);
    if (!mv_reduce_warps(flat)) return;
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = 8 * j + 2 * t + (i & 1);
            if (tok < n_tokens) mv_store(tl.sel, tok, tl.row0 + g + 8 * (i >> 1), acc[j][i]);
        }
    }
}

// 8 token columns against q8_K x; C holds rows g, g + 8 x tokens 2t, 2t + 1 per unit. NT > 1
// (Q4_K only): NT tiles of 8 tokens (mv2n_q4k), no K split; the register-fragment kernel uses
// no shared memory for its weights, which leaves L1 more room for x.
template <typename M, int NT = 1>
static __device__ __forceinline__ void mmv2(const MvSegs& p, const int8_t* __restrict__ q, const float* __restrict__ dy,
                                            const int16_t* __restrict__ bsum, int n_tokens, int load_mode,
                                            int emulate, float* kpart, int* kcount, int ks) {
    using F = typename M::F;
    const int ncols = p.ncols, nsb = ncols / 256;
    const MvKs k = mv_ks(ks, nsb);
    const MvTile tl = mv_tile_at(p, k.tile);
    // (pointers only: x is read after the wait in mv_stream)
    const Mv2X x = mv2_x(q, dy, bsum, n_tokens, emulate);
    const Mv2XN xn = mv2n_x(q, dy, bsum, n_tokens, emulate);
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    mv_stream<F>(
        tl, k.s1, load_mode,
        [&](const typename F::Frag& f, int U0) {
            if constexpr (NT > 1)
                mv2n_q4k<NT>(f, U0 / 8, xn, acc);
            else
                M::compute(f, U0 / 8, x, acc[0]);
        },
        k.s0);
    if constexpr (NT > 1)
        mv_finishn<NT>(tl, acc, n_tokens);
    else
        mv_finish8_ks(tl, acc[0], n_tokens, k, kpart, kcount);
}

// The mmv2 kernels' parameters: segments, q8_K x (q, dy, bsum), tokens, weight load mode,
// emulated mma, and the K split (kpart, kcount, ks: see mv_finish8_ks; ks = 1: none).
#define MMV2_KERNEL1(name, M, SUFFIX, EMU)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                    \
        mmv2_##name##SUFFIX(const MvSegs p, const int8_t* __restrict__ q, const float* __restrict__ dy,  \
                            const int16_t* __restrict__ bsum, int n_tokens, int load_mode, int emulate, \
                            float* kpart, int* kcount, int ks) {                                        \
        (void)emulate;                                                                                   \
        mmv2<M>(p, q, dy, bsum, n_tokens, load_mode, EMU, kpart, kcount, ks);                          \
    }
#define MMV2_KERNEL(name, M) MMV2_KERNEL1(name, M, , 0) MMV2_KERNEL1(name, M, _emu, 1)

MMV2_KERNEL(q4_k, Mv2Q4K)

// 9..32 tokens (NT tiles of 8), register fragments, no K split (ks must be 1): mmv2_q4_k_n{NT}
#define MMV2N_KERNEL1(NT, SUFFIX, EMU)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                    \
        mmv2_q4_k_n##NT##SUFFIX(const MvSegs p, const int8_t* __restrict__ q, const float* __restrict__ dy, \
                                const int16_t* __restrict__ bsum, int n_tokens, int load_mode,          \
                                int emulate, float* kpart, int* kcount, int ks) {                       \
        (void)emulate;                                                                                   \
        mmv2<Mv2Q4K, NT>(p, q, dy, bsum, n_tokens, load_mode, EMU, kpart, kcount, ks);                  \
    }
#define MMV2N_KERNEL(NT) MMV2N_KERNEL1(NT, , 0) MMV2N_KERNEL1(NT, _emu, 1)
MMV2N_KERNEL(2)
MMV2N_KERNEL(3)
MMV2N_KERNEL(4)

// ---- mmv2 IQ4_XS (an experiment: dispatched only with REDLINE_MMV2_IQ4XS=1) ----------------
//
// block_iq4_xs: d f16, scales_h u16, scales_l[4], qs[128] (136 bytes: super-blocks 8-byte
// aligned). Unit u (32 weights): byte i of qs[16u .. 16u + 15] holds the kvalues_iq4nl indices of
// elements i (low nibble) and 16 + i (high nibble); its scale is ((scales_l[u / 2] >> 4 (u % 2))
// & 15 | ((scales_h >> 2u) & 3) << 4) - 32. This thread loads word t of each unit (bytes 4t ..
// 4t + 3) of rows g, g + 8: iq4nl_lookup8 turns it into elements 4t .. 4t + 3 and 16 + 4t ..
// 16 + 4t + 3, the mma's k-slots of a0 and a2 in the natural order, and x's B words are the same
// elements of token g (two 4-byte loads, at 4t and 16 + 4t of the unit). Per super-block the C
// values times the unit's signed scale sum in int32 (|.| <= 8 * 32 * 32 * 127 * 127 < 2^31); one
// float step (d * dy).
struct MvIQ4XS {
    static constexpr int SB = 136;
    struct Frag {
        MvV2 h[2];         // rows g, g + 8: d | scales_h << 16, scales_l
        uint32_t q[2][8];  // rows g, g + 8: word t of each unit's 16 qs bytes
    };
    static __device__ __forceinline__ void load(const uint8_t* pg, const uint8_t* pg8, int t, int mode, Frag& f) {
        f.h[0] = mv_ld8(pg, mode);
        f.h[1] = mv_ld8(pg8, mode);
#pragma unroll
        for (int u = 0; u < 8; u++) {
            f.q[0][u] = mv_ld4(pg + 8 + 16 * u + 4 * t, mode);
            f.q[1][u] = mv_ld4(pg8 + 8 + 16 * u + 4 * t, mode);
        }
    }
};

// the signed scale of unit u from a row's header words
static __device__ __forceinline__ int mv_iq4xs_scale(const MvV2& h, int u) {
    const int lo = (int)((h.y >> (4 * u)) & 0xFu);        // nibble u of scales_l
    const int hi = (int)((h.x >> (16 + 2 * u)) & 0x3u);   // bits 2u, 2u + 1 of scales_h
    return (lo | (hi << 4)) - 32;
}

struct Mv2IQ4XS {
    using F = MvIQ4XS;
    static __device__ __forceinline__ void compute(const F::Frag& f, int s, const Mv2X& x, float (&acc)[4]) {
        MV_EMU_SWITCH(x.emulate, compute_t, f, s, x, acc);
    }
    template <bool EMU>
    static __device__ __forceinline__ void compute_t(const F::Frag& f, int s, const Mv2X& x, float (&acc)[4]) {
        const int t = threadIdx.x & 3;
        const int us = 32 * x.n;  // bytes from one unit's tokens to the next unit's
        // token g's unit 0 of this super-block, at its first byte (x.q points 8t into it)
        const int8_t* xs = x.q - 8 * t + (long long)(8 * s) * us;
        int ai[4] = {0, 0, 0, 0};
#pragma unroll
        for (int u = 0; u < 8; u++) {
            uint32_t lo0, hi0, lo8, hi8;
            iq4nl_lookup8(f.q[0][u], lo0, hi0);
            iq4nl_lookup8(f.q[1][u], lo8, hi8);
            const uint32_t b0 = *(const uint32_t*)(xs + u * us + 4 * t);
            const uint32_t b1 = *(const uint32_t*)(xs + u * us + 16 + 4 * t);
            const MmaI4 c = mv_mma_k32<EMU>(MmaI4{0, 0, 0, 0}, lo0, lo8, hi0, hi8, b0, b1);
            const int sg = mv_iq4xs_scale(f.h[0], u), s8 = mv_iq4xs_scale(f.h[1], u);
            ai[0] += sg * c.x;
            ai[1] += sg * c.y;
            ai[2] += s8 * c.z;
            ai[3] += s8 * c.w;
        }
        mv2_add_scaled(ai, f16_to_f32((uint16_t)(f.h[0].x & 0xFFFF)), f16_to_f32((uint16_t)(f.h[1].x & 0xFFFF)), s, x,
                       acc);
    }
};

MMV2_KERNEL(iq4_xs, Mv2IQ4XS)

// ---- mmv2 Q6_K: super-blocks staged through shared memory --------------------------------
//
// Why: block_q6_K is 210 bytes, so a super-block is only 2-byte aligned and MvQ6K::load reads
// this thread's 34 words of it as 66 u16 loads, each touching 8 rows' cache lines: ~530 L1
// wavefronts per super-block and warp, which held 27648x5120 at ~100 µs whatever the token
// count. Here the warp stages its super-block of the tile's 16 rows through shared memory as
// matvec_quant.cu does: lane (h, i) (h = lane / 16, i = lane % 16) loads the aligned 16-byte
// vector i (i < 14: 224 bytes cover 210 + up to 14 of misalignment; the matrix has >= 16
// bytes of padding after its last row) of rows 2k + h, k = 0..7 (8 loads per lane, each two
// rows' 224 contiguous bytes), one super-block ahead of the one it computes. Storing, a row
// whose super-block starts 2 mod 4 is shifted down 2 bytes (prmt with the next lane's first
// word), so in shared memory every row's block starts 4-byte aligned at (start & 12) and the
// fragment words (MvQ6K::Frag: ql, qh, scales, d) are single aligned 4-byte loads: 34 per
// thread and super-block, the compute (Mv2Q6K::compute) unchanged.
// Shared memory: dynamic, blockDim.y * 16 rows * 240 bytes (15 vectors per row: a stride of
// 60 words keeps the 8 rows of a fragment load on distinct banks up to the row's (start & 12)).
#define MV6_ROW_VECS 15

//
// Q81 (mmv2_q6_k_q81, session 29): the same staging against q8_1 x (q = xq, dy = xds: float pairs
// (d, d * sum) per 32, bsum unused), MvQ6K::compute's per-unit float step (one scale per
// 32 activations). For few-token Q6_K products that must stay on the q8_1 grid (speculative
// verify passes: the one-token steps' dp4a matvec reads q8_1), where the dp4a matvec costs
// ~2x its one-token time at 3-4 tokens (H100, session 27: 5120 x 17408 31.1 -> 61.8 / 64.9 µs).
template <int NT = 1, bool EMU = false, bool Q81 = false, bool TILED = false>
static __device__ __forceinline__ void mmv2_q6k(const MvSegs& p, const int8_t* __restrict__ q,
                                                const float* __restrict__ dy, const int16_t* __restrict__ bsum,
                                                int n_tokens, int load_mode, int emulate, float* kpart, int* kcount,
                                                int ks) {
    extern __shared__ MvV4 mv6_stage[];  // [blockDim.y][16 rows][MV6_ROW_VECS]
    const int ncols = p.ncols;
    const MvKs k = mv_ks(ks, ncols / 256);
    const MvTile tl = mv_tile_at(p, k.tile);
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, wid = threadIdx.y, nw = blockDim.y;
    const int nsb = k.s1;
    // (pointers only: x is read after the wait; xn for NT tiles)
    const Mv2X x = mv2_x(q, dy, bsum, n_tokens, emulate);
    const Mv2XN xn = mv2n_x(q, dy, bsum, n_tokens, emulate);
    const MvX x1 = mv_x(q, dy, ncols, n_tokens, emulate);  // Q81: q = xq, dy = xds

    // staging: this lane's vector vi of tile rows 2k + hf (clamped to the last row, as mv_tile).
    // Lanes 14 and 15 load vector 13 again and store into slot 14, which nothing reads: the 14
    // vectors from a row's aligned start hold its 210 bytes, and no fragment reads past byte 223
    // of a staged row.
    const int li = lane & 15, vi = min(li, 13), hf = lane >> 4;
    // Offsets in 32-bit integers from the tile's 16-byte aligned base (< 16 rows * row_bytes + 16)
    const uint8_t* tile = tl.sel.W + (long long)tl.row0 * p.row_bytes;
    const int mis = (int)((unsigned long long)tile & 15);
    const uint8_t* tile_v = tile - mis + 16 * vi;  // this lane's vector of the aligned base
    int roff[8];  // byte offset of row 2k + hf's start from the aligned base
#pragma unroll
    for (int k = 0; k < 8; k++)
        roff[k] = mis + (min(tl.row0 + 2 * k + hf, tl.sel.nrows - 1) - tl.row0) * (int)p.row_bytes;
    MvV4* buf = mv6_stage + wid * 16 * MV6_ROW_VECS;
    MvV4 st[8];
    uint32_t shift2 = 0;  // bit k: row 2k + hf's super-block starts 2 mod 4
    // (the load mode tested once per super-block: inside mv_ld16 it made a branch per load)
    auto load = [&](int s) {
        const int so = s * MvQ6K::SB;
        shift2 = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) shift2 |= (uint32_t)(((roff[k] + so) >> 1) & 1) << k;
        if (load_mode == 2) {
#pragma unroll
            for (int k = 0; k < 8; k++) st[k] = mv_ld16(tile_v + (unsigned)((roff[k] + so) & ~15), 2);  // (>= 0)
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) st[k] = mv_ld16(tile_v + (unsigned)((roff[k] + so) & ~15), 0);
        }
    };
    auto stage = [&]() {
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t nx = __shfl_down_sync(FULL_MASK, st[k].x, 1);
            const uint32_t sel = ((shift2 >> k) & 1) ? 0x5432u : 0x3210u;
            const MvV4 v = st[k];
            // lanes 14 and 15 both write the row's unused slot 14 (no branch around the store)
            buf[(2 * k + hf) * MV6_ROW_VECS + min(li, 14)] =
                MvV4{__byte_perm(v.x, v.y, sel), __byte_perm(v.y, v.z, sel), __byte_perm(v.z, v.w, sel),
                     __byte_perm(v.w, nx, sel)};
        }
    };
    // where rows g and g + 8 start mod 16 in their first super-block
    const int o0g = (int)((unsigned long long)tl.rg & 15), o0g8 = (int)((unsigned long long)tl.rg8 & 15);
    // this thread's fragment words of super-block s (rows g, g + 8) from the staged rows
    auto fragment = [&](int s, MvQ6K::Frag& f) {
        uint32_t d[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int o = ((r == 0 ? o0g : o0g8) + s * MvQ6K::SB) & 12;
            const uint8_t* b = (const uint8_t*)(buf + (g + 8 * r) * MV6_ROW_VECS) + o;
#pragma unroll
            for (int i = 0; i < 8; i++)
                f.ql[r][i] = *(const uint32_t*)(b + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * t);
#pragma unroll
            for (int i = 0; i < 4; i++) f.qh[r][i] = *(const uint32_t*)(b + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t);
#pragma unroll
            for (int i = 0; i < 4; i++) f.sc[r][i] = *(const uint32_t*)(b + 192 + 4 * i);
            d[r] = *(const uint32_t*)(b + 208);
        }
        f.d = (d[0] & 0xFFFFu) | (d[1] << 16);
    };

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    if (k.s0 + wid < nsb) load(k.s0 + wid);
    pdl_wait();
    pdl_trigger();
    for (int s = k.s0 + wid; s < nsb; s += nw) {
        stage();
        __syncwarp();
        if (s + nw < nsb) load(s + nw);
        MvQ6K::Frag f;
        fragment(s, f);
        if constexpr (NT > 1)
            mv2n_q6k<NT, EMU>(f, s, xn, acc);
        else if constexpr (Q81) {
            if (x1.emulate)
                MvQ6K::compute_t<true, TILED>(f, 8 * s, x1, lane, acc[0]);
            else
                MvQ6K::compute_t<false, TILED>(f, 8 * s, x1, lane, acc[0]);
        }
        else
            Mv2Q6K::compute(f, s, x, acc[0]);
        __syncwarp();
    }
    if constexpr (NT > 1)
        mv_finishn<NT>(tl, acc, n_tokens);  // (no K split: ks = 1)
    else
        mv_finish8_ks(tl, acc[0], n_tokens, k, kpart, kcount);
}

#define MMV2_Q6K_KERNEL(SUFFIX, EMU)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                    \
        mmv2_q6_k##SUFFIX(const MvSegs p, const int8_t* __restrict__ q, const float* __restrict__ dy,   \
                          const int16_t* __restrict__ bsum, int n_tokens, int load_mode, int emulate,   \
                          float* kpart, int* kcount, int ks) {                                          \
        (void)emulate;                                                                                   \
        mmv2_q6k(p, q, dy, bsum, n_tokens, load_mode, EMU, kpart, kcount, ks);                          \
    }
MMV2_Q6K_KERNEL(, 0)
MMV2_Q6K_KERNEL(_emu, 1)

// q8_1 x (Q81 above): the mmv2 parameters with q = xq, dy = xds, bsum unused; n_tokens <= 8;
// mmv2_q6_k_q81t: xq in the tiled layout (1-2 tokens, rows of a multiple of 512 values)
#define MMV2_Q6K_Q81_KERNEL(T, TILED, SUFFIX, EMU)                                                       \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                    \
        mmv2_q6_k_q81##T##SUFFIX(const MvSegs p, const int8_t* __restrict__ xq,                         \
                                 const float* __restrict__ xds, const int16_t* __restrict__ bsum,       \
                                 int n_tokens, int load_mode, int emulate, float* kpart, int* kcount,   \
                                 int ks) {                                                              \
        (void)emulate;                                                                                   \
        mmv2_q6k<1, false, true, TILED>(p, xq, xds, bsum, n_tokens, load_mode, EMU, kpart, kcount, ks); \
    }
MMV2_Q6K_Q81_KERNEL(, false, , 0)
MMV2_Q6K_Q81_KERNEL(, false, _emu, 1)
MMV2_Q6K_Q81_KERNEL(t, true, , 0)
MMV2_Q6K_Q81_KERNEL(t, true, _emu, 1)

// 9..32 tokens (NT tiles of 8), no K split (ks must be 1): mmv2_q6_k_n{NT}
#define MMV2_Q6KN_KERNEL1(NT, SUFFIX, EMU)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                    \
        mmv2_q6_k_n##NT##SUFFIX(const MvSegs p, const int8_t* __restrict__ q, const float* __restrict__ dy, \
                                const int16_t* __restrict__ bsum, int n_tokens, int load_mode,          \
                                int emulate, float* kpart, int* kcount, int ks) {                       \
        (void)emulate;                                                                                   \
        mmv2_q6k<NT, EMU>(p, q, dy, bsum, n_tokens, load_mode, EMU, kpart, kcount, ks);                 \
    }
#define MMV2_Q6KN_KERNEL(NT) MMV2_Q6KN_KERNEL1(NT, , 0) MMV2_Q6KN_KERNEL1(NT, _emu, 1)
MMV2_Q6KN_KERNEL(2)
MMV2_Q6KN_KERNEL(3)
MMV2_Q6KN_KERNEL(4)

// ---- mmv2 Q4_K with the weights staged through shared memory (cp.async) ------------------
//
// Why: with x token-interleaved, most of mmv2_q4_k's L1 traffic is its weight fragment loads:
// every 8-byte load of a warp reads 32 bytes from each of 8 rows (8 cache lines for 256
// bytes), ~80 L1 wavefronts per warp and super-block against ~16 for x. Here each warp copies
// its super-block of the tile's 16 rows (16 x 144 contiguous-per-row bytes, 144 aligned
// 16-byte vectors) into shared memory with cp.async.cg (L2 -> shared, no registers, no L1:
// 32 lanes x 16 bytes of ~4 rows per instruction), NST - 1 super-blocks ahead of the one it
// computes, then reads the same fragments (MvQ4K::Frag) from shared memory (a header per row,
// conflict-free; the 8-byte quant words at the minimum 2 wavefronts) and runs Mv2Q4K::compute
// unchanged. Below sm_80 (no cp.async; never dispatched there, compiled for the tests'
// emulation) the copy is a plain load and store.
// Shared memory: dynamic, blockDim.y * NST * 16 rows * 144 bytes.
#define MV4S_SB 144
#define MV4S_STAGE (16 * MV4S_SB)

static __device__ __forceinline__ void mv_cp16(uint32_t dst_s, uint8_t* dst, const uint8_t* src) {
#if __CUDA_ARCH__ >= 800
    (void)dst;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst_s), "l"(src) : "memory");
#else
    (void)dst_s;
    *(MvV4*)dst = *(const MvV4*)src;
#endif
}

// XS (REDLINE_MMV2_XS=1, an experiment): each stage also holds the super-block's x, copied by
// cp.async with the weights (units 8s .. 8s + 7 of all n tokens: 256 n contiguous bytes; their
// int16 unit sums, 16 n bytes; their dy, 4 n bytes), and the compute reads it from there. Why:
// with x in global memory a warp's compute starts with x loads that miss L1 once x outgrows it
// (the 27648-wide down projections: 221 KB at 8 tokens, read again by every tile), so each
// super-block waits a second round trip after its weights (H100, session 20: the 8-token Q4_K
// 5120x27648 down projection at 1.25 TB/s, 2.9 µs per warp and super-block). The x copies wait
// for the previous kernel (PDL): the prologue's weight copies go first, the x of those stages
// after the wait in one more group. Stage: [16 rows x 144][x 8 x 256][bsum 8 x 16][dy 8 x 4].
#define MV4SX_X (16 * MV4S_SB)
#define MV4SX_BS (MV4SX_X + 8 * 256)
#define MV4SX_DY (MV4SX_BS + 8 * 16)
#define MV4SX_STAGE (MV4SX_DY + 8 * 4)

static __device__ __forceinline__ void mv_cp4(uint32_t dst_s, uint8_t* dst, const uint8_t* src) {
#if __CUDA_ARCH__ >= 800
    (void)dst;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst_s), "l"(src) : "memory");
#else
    (void)dst_s;
    *(uint32_t*)dst = *(const uint32_t*)src;
#endif
}

template <int NST, bool XS, int NT = 1>
static __device__ __forceinline__ void mmv2s_q4k(const MvSegs& p, const int8_t* __restrict__ q,
                                                 const float* __restrict__ dy, const int16_t* __restrict__ bsum,
                                                 int n_tokens, int emulate, float* kpart, int* kcount, int ks) {
    extern __shared__ MvV4 mv4s_stage[];  // [blockDim.y][NST][stage]
    constexpr int STAGE = XS ? MV4SX_STAGE : MV4S_STAGE;
    const MvKs k = mv_ks(ks, p.ncols / 256);
    const MvTile tl = mv_tile_at(p, k.tile);
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3, wid = threadIdx.y, nw = blockDim.y;
    const int nsb = k.s1;
    // (pointers only: x is read after the wait; xn for NT tiles)
    const Mv2X x = mv2_x(q, dy, bsum, n_tokens, emulate);
    const Mv2XN xn = mv2n_x(q, dy, bsum, n_tokens, emulate);

    // this lane's vectors v = lane + 32 k (k < 5, v < 144) of a super-block's 16 rows: row v / 9,
    // piece v % 9, as byte offsets from the tile's first row (rows clamped to the last, as mv_tile)
    const uint8_t* tile = tl.sel.W + (long long)tl.row0 * p.row_bytes;
    int off[5];
#pragma unroll
    for (int j = 0; j < 5; j++) {
        const int v = lane + 32 * j, r = v / 9, pc = v - 9 * r;
        off[j] = v < 144 ? (min(tl.row0 + r, tl.sel.nrows - 1) - tl.row0) * (int)p.row_bytes + 16 * pc : 0;
    }
    uint8_t* wbuf = (uint8_t*)(mv4s_stage + wid * NST * (STAGE / 16));
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(wbuf);
    auto issue = [&](int s, int b) {
        const uint8_t* src = tile + (long long)s * MV4S_SB;
#pragma unroll
        for (int j = 0; j < 5; j++) {
            const int v = lane + 32 * j;
            if (v < 144) mv_cp16(sbase + b * STAGE + 16 * v, wbuf + b * STAGE + 16 * v, src + off[j]);
        }
    };
    // XS: the super-block's x, unit sums and dy into stage b (after the wait)
    const int n = n_tokens;
    auto issue_x = [&](int s, int b) {
        const uint8_t* xq = (const uint8_t*)q + 256LL * n * s;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int v = lane + 32 * j;
            if (v < 16 * n) mv_cp16(sbase + b * STAGE + MV4SX_X + 16 * v, wbuf + b * STAGE + MV4SX_X + 16 * v, xq + 16 * v);
        }
        if (lane < n)
            mv_cp16(sbase + b * STAGE + MV4SX_BS + 16 * lane, wbuf + b * STAGE + MV4SX_BS + 16 * lane,
                    (const uint8_t*)bsum + 16LL * (n * s + lane));
        else if (lane >= 16 && lane < 16 + n)
            mv_cp4(sbase + b * STAGE + MV4SX_DY + 4 * (lane - 16), wbuf + b * STAGE + MV4SX_DY + 4 * (lane - 16),
                   (const uint8_t*)dy + 4LL * (n * s + lane - 16));
    };
#pragma unroll
    for (int i = 0; i < NST - 1; i++) {
        const int s = k.s0 + wid + i * nw;
        if (s < nsb) issue(s, i);
        cp_async_commit();
    }
    pdl_wait();
    pdl_trigger();
    if constexpr (XS) {
        // one more group: the x of the prologue's stages (the first iteration waits for it)
#pragma unroll
        for (int i = 0; i < NST - 1; i++) {
            const int s = k.s0 + wid + i * nw;
            if (s < nsb) issue_x(s, i);
        }
        cp_async_commit();
    }
    // XS: this thread's x words, unit sums and dy at a stage's offsets (mv2_x's, over the
    // stage's n tokens)
    const int xg = 32 * min(g, n - 1) + 8 * t, t0 = min(2 * t, n - 1), t1 = min(2 * t + 1, n - 1);
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    int b = 0;
    bool first = true;
    for (int s = k.s0 + wid; s < nsb; s += nw) {
        const int sn = s + (NST - 1) * nw;
        if (sn < nsb) {
            const int bn = b == 0 ? NST - 1 : b - 1;
            issue(sn, bn);
            if constexpr (XS) issue_x(sn, bn);
        }
        cp_async_commit();
        if (XS && first)
            cp_async_wait<1>();  // the prologue's weights and the x group after them
        else
            cp_async_wait<NST - 1>();
        first = false;
        __syncwarp();
        MvQ4K::Frag f;
        const uint8_t* st = wbuf + b * STAGE;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint8_t* row = st + (g + 8 * r) * MV4S_SB;
            f.h[r] = *(const MvV4*)row;
#pragma unroll
            for (int j = 0; j < 4; j++) f.q[r][j] = *(const MvV2*)(row + 16 + 32 * j + 8 * t);
        }
        if constexpr (NT > 1) {
            mv2n_q4k<NT>(f, s, xn, acc);
        } else if constexpr (XS) {
            Mv2X xl = x;
            xl.q = (const int8_t*)(st + MV4SX_X) + xg;
            xl.bs0 = (const MvV4*)(st + MV4SX_BS) + t0;
            xl.bs1 = (const MvV4*)(st + MV4SX_BS) + t1;
            xl.dy0 = (const float*)(st + MV4SX_DY) + t0;
            xl.dy1 = (const float*)(st + MV4SX_DY) + t1;
            Mv2Q4K::compute(f, 0, xl, acc[0]);
        } else {
            Mv2Q4K::compute(f, s, x, acc[0]);
        }
        __syncwarp();
        b = b + 1 == NST ? 0 : b + 1;
    }
    if constexpr (NT > 1)
        mv_finishn<NT>(tl, acc, n_tokens);  // (no K split: ks = 1)
    else
        mv_finish8_ks(tl, acc[0], n_tokens, k, kpart, kcount);
}

#define MMV2S_KERNEL1(NST, XS, XSUF, SUFFIX, EMU)                                                          \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                     \
        mmv2s_q4_k_s##NST##XSUF##SUFFIX(const MvSegs p, const int8_t* __restrict__ q,                     \
                                        const float* __restrict__ dy, const int16_t* __restrict__ bsum,  \
                                        int n_tokens, int load_mode, int emulate, float* kpart,          \
                                        int* kcount, int ks) {                                           \
        (void)load_mode;                                                                                 \
        (void)emulate;                                                                                   \
        mmv2s_q4k<NST, XS>(p, q, dy, bsum, n_tokens, EMU, kpart, kcount, ks);                            \
    }
#define MMV2S_KERNEL(NST) MMV2S_KERNEL1(NST, false, , , 0) MMV2S_KERNEL1(NST, false, , _emu, 1)
#define MMV2SX_KERNEL(NST) MMV2S_KERNEL1(NST, true, x, , 0) MMV2S_KERNEL1(NST, true, x, _emu, 1)
MMV2S_KERNEL(2)
MMV2S_KERNEL(3)
MMV2S_KERNEL(4)
MMV2SX_KERNEL(2)
MMV2SX_KERNEL(3)

// 9..32 tokens (NT tiles of 8), two stages, no K split (ks must be 1): mmv2s_q4_k_s2_n{NT}
#define MMV2SN_KERNEL1(NT, SUFFIX, EMU)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * MMV_MAX_WARPS)                                     \
        mmv2s_q4_k_s2_n##NT##SUFFIX(const MvSegs p, const int8_t* __restrict__ q,                         \
                                    const float* __restrict__ dy, const int16_t* __restrict__ bsum,      \
                                    int n_tokens, int load_mode, int emulate, float* kpart, int* kcount, \
                                    int ks) {                                                            \
        (void)load_mode;                                                                                 \
        (void)emulate;                                                                                   \
        mmv2s_q4k<2, false, NT>(p, q, dy, bsum, n_tokens, EMU, kpart, kcount, ks);                       \
    }
#define MMV2SN_KERNEL(NT) MMV2SN_KERNEL1(NT, , 0) MMV2SN_KERNEL1(NT, _emu, 1)
MMV2SN_KERNEL(2)
MMV2SN_KERNEL(3)
MMV2SN_KERNEL(4)
