// mmq.cu — small-batch quantized matrix products y = W x on int8 tensor cores.
//
// For 2..32 tokens (speculative verify, several decode streams) the dp4a matvec is instruction
// bound: 8 dp4a per 32 weights per token plus the scale math. Here each weight is decoded once
// into int8 mma fragments and multiplied against all tokens by `mma.sync m16n8k32 s8` (sm_80+).
//
// Layout:
// - x: quantized to q8_1 by matvec_quant.cu's quantize_q8_1: xq [n_tokens, ncols] int8 and xds
//   [n_tokens, ncols / 32] float2 (d, d * sum q) per 32 elements.
// - W: [nrows, ncols] in GGUF block layout (rows of row_bytes bytes, >= 16 bytes of padding
//   after the last row), as matvec.rs uploads it.
// - y: [n_tokens, nrows] f32.
// - A thread block (32 x nw warps) owns 16 rows (the mma's m). The columns are cut into
//   "chunks" of 256 weights (one super-block, or eight 32-wide blocks); warp w takes chunks
//   w, w + nw, ... and the warps' partial sums meet in shared memory at the end. Per chunk a
//   warp stages its 16 rows' bytes through shared memory with 16-byte ld.global.nc loads (the
//   chunk's byte range rounded out to 16 bytes: blocks of 210 / 136 / 34 / 18 bytes are not
//   16-byte aligned); the loads of the next chunk are in flight while this one is computed.
// - Per 32-weight unit (one q8_1 block of x): thread (g = lane / 4, t = lane % 4) decodes
//   elements 8t .. 8t+7 of rows g and g+8 into the A fragment (the mma's k order is any
//   permutation as long as x's B fragment uses the same one: its b0/b1 are x's elements
//   8t .. 8t+7 of token g, one 8-byte load), one mma per 8 tokens gives the int32 dots of 16
//   rows x 8 tokens, and the per-unit scales apply to them in f32:
//       acc += (s_row * d_x) * dot + m_row * (d_x * sum x)      (m: the format's min term)
//   Q6_K has a scale per 16 weights: two m16n8k16 mmas per unit, combined in int32
//   (sc0 * dot0 + sc1 * dot1, exact) before the one f32 scale.
// - sm_70 (and `emulate` != 0 anywhere, for tests): the same fragments multiplied by warp
//   shuffles + dp4a, so the kernel is correct everywhere (slower than the matvec on sm_70).
// Block layouts: ggml-common.h; bit layouts: ggml-quants.c dequantize_row_* (own code).
#include "common.cuh"
#include "int8_mma.cuh"

#define MMQ_MAX_WARPS 8

// sm_80+: weights go global -> shared by cp.async, MMQ_STAGES chunks in flight per warp without
// holding registers; sm_70: one chunk staged through registers (loaded while the previous one
// is computed).
#if __CUDA_ARCH__ >= 800
#define MMQ_STAGES 4
#else
#define MMQ_STAGES 1
#endif

struct alignas(16) MqVec {
    uint32_t x, y, z, w;
};
struct alignas(8) MqPair {
    uint32_t x, y;
};
struct alignas(8) MqF2 {
    float x, y;
};

#if __CUDA_ARCH__ < 800
// Weights stream through once: bypass L1 so x (read by every block) stays there (sm_70's
// register-staged path; sm_80+ copies with cp.async).
static __device__ __forceinline__ MqVec mq_ld_stream(const MqVec* p) {
    MqVec v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
#endif

#if __CUDA_ARCH__ >= 800
// 16 bytes global -> shared, asynchronous, L2 only (.cg): the weights are read once.
static __device__ __forceinline__ void mq_cp16(MqVec* dst, const MqVec* src) {
    unsigned long long s;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)s), "l"(src) : "memory");
}
static __device__ __forceinline__ void mq_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void mq_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

// Little-endian u32 from shared memory at p, p aligned to A bytes (2 or >= 4).
template <int A>
static __device__ __forceinline__ uint32_t mq_w32(const uint8_t* p) {
    if constexpr (A >= 4) {
        return *(const uint32_t*)p;
    } else {
        const uint16_t* q = (const uint16_t*)p;
        return (uint32_t)q[0] | ((uint32_t)q[1] << 16);
    }
}

// Two consecutive little-endian u32 at p (aligned to A bytes).
template <int A>
static __device__ __forceinline__ void mq_w64(const uint8_t* p, uint32_t& a, uint32_t& b) {
    if constexpr (A >= 8) {
        const MqPair v = *(const MqPair*)p;
        a = v.x;
        b = v.y;
    } else {
        a = mq_w32<A>(p);
        b = mq_w32<A>(p + 4);
    }
}

// ---- the int8 products -------------------------------------------------------------------
//
// Fragment layouts and the sm_70 fallback: int8_mma.cuh.
// EMU (compile time, as mmv.cu's: one branch per chunk, not one beside every mma): by shuffles +
// dp4a (int8_mma.cuh; always below sm_80).
template <bool EMU>
static __device__ __forceinline__ void mq_mma_k32(int c[4], const uint32_t a[4], const uint32_t b[2]) {
#if __CUDA_ARCH__ >= 800
    if constexpr (!EMU) {
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
        return;
    }
#endif
    const MmaI4 r = mma_emul_k32(MmaI4{c[0], c[1], c[2], c[3]}, a[0], a[1], a[2], a[3], b[0], b[1]);
    c[0] = r.x;
    c[1] = r.y;
    c[2] = r.z;
    c[3] = r.w;
}

template <bool EMU>
static __device__ __forceinline__ void mq_mma_k16(int c[4], const uint32_t a[2], uint32_t b) {
#if __CUDA_ARCH__ >= 800
    if constexpr (!EMU) {
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(b));
        return;
    }
#endif
    const MmaI4 r = mma_emul_k16(MmaI4{c[0], c[1], c[2], c[3]}, a[0], a[1], b);
    c[0] = r.x;
    c[1] = r.y;
    c[2] = r.z;
    c[3] = r.w;
}

// ---- weight formats ----------------------------------------------------------------------
//
// Each format: CB bytes per 256-weight chunk, ALIGN = the alignment every chunk start has
// (row starts are chunk multiples from a 256-byte-aligned base), UNITS_PER_BLOCK (32-weight
// units of one block: 8 for super-blocks, 1 for 32-wide blocks).
// K32 formats: `Row row(p)` reads a chunk's shared scale fields, `unit(p, r, u, t, w0, w1, s, m)`
// gives elements 8t .. 8t+7 of unit u as int8 (w0: 8t..8t+3, w1: 8t+4..8t+7) with
// w = s * v + m for every element of the unit.

// ggml kvalues_iq4nl packed little-endian: {-127,-104,-83,-65}, {-49,-35,-22,-10},
// {1,13,25,38}, {53,69,89,113}.
#define MQ_IQ4NL_T0 0xBFAD9881u
#define MQ_IQ4NL_T1 0xF6EADDCFu
#define MQ_IQ4NL_T2 0x26190D01u
#define MQ_IQ4NL_T3 0x71594535u

// Four 4-bit indices (one per byte) -> four int8 kvalues_iq4nl entries.
static __device__ __forceinline__ uint32_t mq_iq4nl4(uint32_t idx) {
    const uint32_t sel = (idx & 0x7u) | ((idx >> 4) & 0x70u) | ((idx >> 8) & 0x700u) | ((idx >> 12) & 0x7000u);
    const uint32_t lo = prmt(MQ_IQ4NL_T0, MQ_IQ4NL_T1, sel);
    const uint32_t hi = prmt(MQ_IQ4NL_T2, MQ_IQ4NL_T3, sel);
    const uint32_t m = ((idx & 0x08080808u) >> 3) * 0xFFu;
    return (lo & ~m) | (hi & m);
}

struct MqEmpty {};

struct MqQ4_0 {  // block_q4_0: d f16, qs[16]: element j = qs[j] & 15, j + 16 = qs[j] >> 4; w = d (q - 8)
    static constexpr int CB = 8 * 18, ALIGN = 2, UNITS_PER_BLOCK = 1;
    static constexpr bool HAS_MIN = false, K16 = false;
    typedef MqEmpty Row;
    static __device__ __forceinline__ Row row(const uint8_t*) { return Row{}; }
    static __device__ __forceinline__ void unit(const uint8_t* p, const Row&, int u, int t, uint32_t& w0, uint32_t& w1,
                                                float& s, float& m) {
        const uint8_t* b = p + 18 * u;
        mq_w64<2>(b + 2 + 8 * (t & 1), w0, w1);
        const int sh = 4 * (t >> 1);
        w0 = sub_bytes_biased((w0 >> sh) & 0x0F0F0F0Fu, 0x08080808u);
        w1 = sub_bytes_biased((w1 >> sh) & 0x0F0F0F0Fu, 0x08080808u);
        s = f16_to_f32(ld_u16(b));
        m = 0.0f;
    }
};

struct MqQ8_0 {  // block_q8_0: d f16, qs[32] int8; w = d q
    static constexpr int CB = 8 * 34, ALIGN = 2, UNITS_PER_BLOCK = 1;
    static constexpr bool HAS_MIN = false, K16 = false;
    typedef MqEmpty Row;
    static __device__ __forceinline__ Row row(const uint8_t*) { return Row{}; }
    static __device__ __forceinline__ void unit(const uint8_t* p, const Row&, int u, int t, uint32_t& w0, uint32_t& w1,
                                                float& s, float& m) {
        const uint8_t* b = p + 34 * u;
        mq_w64<2>(b + 2 + 8 * t, w0, w1);
        s = f16_to_f32(ld_u16(b));
        m = 0.0f;
    }
};

// Q4_K / Q5_K shared scale fields: d, dmin f16, scales[12] (ggml get_scale_min_k4).
struct MqRowK4 {
    float d, dmin;
    uint32_t s0, s1, s2;
};
static __device__ __forceinline__ MqRowK4 mq_row_k4(const uint8_t* p) {
    MqRowK4 r;
    const uint32_t dd = mq_w32<4>(p);
    r.d = f16_to_f32((uint16_t)(dd & 0xFFFF));
    r.dmin = f16_to_f32((uint16_t)(dd >> 16));
    r.s0 = mq_w32<4>(p + 4);
    r.s1 = mq_w32<4>(p + 8);
    r.s2 = mq_w32<4>(p + 12);
    return r;
}
// Sub-block j: j < 4: sc = q[j] & 63, m = q[j+4] & 63; j >= 4: sc = q[j+4] & 15 | (q[j-4] >> 6) << 4,
// m = q[j+4] >> 4 | (q[j] >> 6) << 4 (q = scales[12] = words s0, s1, s2).
static __device__ __forceinline__ void mq_scale_k4(const MqRowK4& r, int j, float& s, float& m) {
    int sc, mn;
    if (j < 4) {
        sc = (r.s0 >> (8 * j)) & 63;
        mn = (r.s1 >> (8 * j)) & 63;
    } else {
        const int k = 8 * (j - 4);
        sc = ((r.s2 >> k) & 0xF) | (((r.s0 >> (k + 6)) & 3) << 4);
        mn = ((r.s2 >> (k + 4)) & 0xF) | (((r.s1 >> (k + 6)) & 3) << 4);
    }
    s = r.d * (float)sc;
    m = -r.dmin * (float)mn;
}

struct MqQ4_K {  // block_q4_K: d, dmin, scales[12], qs[128]; unit u: qs[32(u/2) + e] nibble u % 2
    static constexpr int CB = 144, ALIGN = 16, UNITS_PER_BLOCK = 8;
    static constexpr bool HAS_MIN = true, K16 = false;
    typedef MqRowK4 Row;
    static __device__ __forceinline__ Row row(const uint8_t* p) { return mq_row_k4(p); }
    static __device__ __forceinline__ void unit(const uint8_t* p, const Row& r, int u, int t, uint32_t& w0, uint32_t& w1,
                                                float& s, float& m) {
        mq_w64<8>(p + 16 + 32 * (u >> 1) + 8 * t, w0, w1);
        const int sh = 4 * (u & 1);
        w0 = (w0 >> sh) & 0x0F0F0F0Fu;
        w1 = (w1 >> sh) & 0x0F0F0F0Fu;
        mq_scale_k4(r, u, s, m);
    }
};

struct MqQ5_K {  // block_q5_K: d, dmin, scales[12], qh[32] (bit u of qh[e]), qs[128] as Q4_K
    static constexpr int CB = 176, ALIGN = 16, UNITS_PER_BLOCK = 8;
    static constexpr bool HAS_MIN = true, K16 = false;
    typedef MqRowK4 Row;
    static __device__ __forceinline__ Row row(const uint8_t* p) { return mq_row_k4(p); }
    static __device__ __forceinline__ void unit(const uint8_t* p, const Row& r, int u, int t, uint32_t& w0, uint32_t& w1,
                                                float& s, float& m) {
        uint32_t h0, h1;
        mq_w64<8>(p + 48 + 32 * (u >> 1) + 8 * t, w0, w1);
        mq_w64<8>(p + 16 + 8 * t, h0, h1);
        const int sh = 4 * (u & 1);
        w0 = ((w0 >> sh) & 0x0F0F0F0Fu) | (((h0 >> u) & 0x01010101u) << 4);
        w1 = ((w1 >> sh) & 0x0F0F0F0Fu) | (((h1 >> u) & 0x01010101u) << 4);
        mq_scale_k4(r, u, s, m);
    }
};

struct MqRowIQ4XS {
    float d;
    uint32_t sh, sl;
};

struct MqIQ4_XS {  // block_iq4_xs: d f16, scales_h u16, scales_l[4], qs[128]; unit u: qs[16u ..]
    static constexpr int CB = 136, ALIGN = 8, UNITS_PER_BLOCK = 8;
    static constexpr bool HAS_MIN = false, K16 = false;
    typedef MqRowIQ4XS Row;
    static __device__ __forceinline__ Row row(const uint8_t* p) {
        Row r;
        const uint32_t w = mq_w32<4>(p);
        r.d = f16_to_f32((uint16_t)(w & 0xFFFF));
        r.sh = w >> 16;
        r.sl = mq_w32<4>(p + 4);
        return r;
    }
    static __device__ __forceinline__ void unit(const uint8_t* p, const Row& r, int u, int t, uint32_t& w0, uint32_t& w1,
                                                float& s, float& m) {
        // elements e < 16: low nibble of qs[e], e >= 16: high nibble of qs[e - 16]
        mq_w64<8>(p + 8 + 16 * u + 8 * (t & 1), w0, w1);
        const int sh = 4 * (t >> 1);
        w0 = mq_iq4nl4((w0 >> sh) & 0x0F0F0F0Fu);
        w1 = mq_iq4nl4((w1 >> sh) & 0x0F0F0F0Fu);
        const int ls = (int)(((r.sl >> (4 * u)) & 0xF) | (((r.sh >> (2 * u)) & 3) << 4));
        s = r.d * (float)(ls - 32);
        m = 0.0f;
    }
};

// Q6_K (K16): block_q6_K: ql[128], qh[64], scales[16] int8, d f16. Unit u = 4n + k (n = 128-half,
// k = 0..3): element e = ql[64n + 32(k & 1) + e] nibble k >> 1, high 2 bits qh[32n + e] >> 2k,
// value q - 32, scale sc[8n + 2k + e / 16]. `unit16` gives elements 16h + 4t .. 16h + 4t + 3 of
// both halves h (w[h], as 4 (q - 32)) and the two scales.
struct MqQ6_K {
    static constexpr int CB = 210, ALIGN = 2, UNITS_PER_BLOCK = 8;
    static constexpr bool HAS_MIN = false, K16 = true;
    struct Row {
        float d;
    };
    // d / 4: unit16's weights are 4 (q - 32) (common.cuh q6k_weights4); exact, a power of two
    static __device__ __forceinline__ Row row(const uint8_t* p) { return Row{0.25f * f16_to_f32(ld_u16(p + 208))}; }
    static __device__ __forceinline__ void unit16(const uint8_t* p, int u, int t, uint32_t w[2], int sc[2]) {
        const int n = u >> 2, k = u & 3;
        const uint8_t* ql = p + 64 * n + 32 * (k & 1) + 4 * t;
        const uint8_t* qh = p + 128 + 32 * n + 4 * t;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            w[h] = q6k_weights4(mq_w32<2>(ql + 16 * h), mq_w32<2>(qh + 16 * h), k);
        }
        const uint16_t scs = ld_u16(p + 192 + 8 * n + 2 * k);
        sc[0] = (int)(int8_t)(scs & 0xFF);
        sc[1] = (int)(int8_t)(scs >> 8);
    }
};

// ---- the kernel --------------------------------------------------------------------------

// Vectors of 16 bytes staged per row per chunk (the chunk rounded out to 16 bytes), and per
// lane for the 16 * MT rows of a warp's stage.
template <typename F, int MT>
struct MqStage {
    static constexpr int VPR = (F::CB + (16 - F::ALIGN) + 15) / 16;
    static constexpr int L = (16 * MT * VPR + 31) / 32;  // vectors per lane
};

// One chunk of this warp's 16 * MT rows, staged in shared memory (rows 16 mt + g and + 8 of
// m-tile mt at pg[mt], pg8[mt]), times x of units U0 .. U0 + nvalid - 1, accumulated into
// acc[mt][tile][c-fragment]. x's fragments of a unit are loaded once for all MT m-tiles.
template <typename F, int NT, int MT, bool EMU>
static __device__ __forceinline__ void mq_chunk(const uint8_t* const (&pg)[MT], const uint8_t* const (&pg8)[MT],
                                                int U0, int nvalid, const int8_t* __restrict__ xq,
                                                const MqF2* __restrict__ xds, int ncols, int nunits, int n_tokens,
                                                float (&acc)[MT][NT][4]) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    typename F::Row rg[MT], rg8[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        rg[mt] = F::row(pg[mt]);
        rg8[mt] = F::row(pg8[mt]);
    }
#pragma unroll
    for (int u = 0; u < 8; u++) {
        if (u < nvalid) {
            const int U = U0 + u;
            if constexpr (F::K16) {
                uint32_t wg[MT][2], wg8[MT][2];
                int scg[MT][2], scg8[MT][2];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    F::unit16(pg[mt], u, t, wg[mt], scg[mt]);
                    F::unit16(pg8[mt], u, t, wg8[mt], scg8[mt]);
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int tb = min(8 * j + g, n_tokens - 1);
                    // x's elements 4t.. (half 0) and 16 + 4t.. (half 1) of token tb
                    const int8_t* xp = xq + (long long)tb * ncols + 32 * U + 4 * t;
                    const uint32_t xb[2] = {*(const uint32_t*)xp, *(const uint32_t*)(xp + 16)};
                    const MqF2 x0 = xds[(long long)min(8 * j + 2 * t, n_tokens - 1) * nunits + U];
                    const MqF2 x1 = xds[(long long)min(8 * j + 2 * t + 1, n_tokens - 1) * nunits + U];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        int c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
                        const uint32_t a0[2] = {wg[mt][0], wg8[mt][0]}, a1[2] = {wg[mt][1], wg8[mt][1]};
                        mq_mma_k16<EMU>(c0, a0, xb[0]);
                        mq_mma_k16<EMU>(c1, a1, xb[1]);
                        const float sg = rg[mt].d, sg8 = rg8[mt].d;
                        acc[mt][j][0] += (float)(scg[mt][0] * c0[0] + scg[mt][1] * c1[0]) * (sg * x0.x);
                        acc[mt][j][1] += (float)(scg[mt][0] * c0[1] + scg[mt][1] * c1[1]) * (sg * x1.x);
                        acc[mt][j][2] += (float)(scg8[mt][0] * c0[2] + scg8[mt][1] * c1[2]) * (sg8 * x0.x);
                        acc[mt][j][3] += (float)(scg8[mt][0] * c0[3] + scg8[mt][1] * c1[3]) * (sg8 * x1.x);
                    }
                }
            } else {
                uint32_t a[MT][4];
                float s[MT][2], m[MT][2];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    F::unit(pg[mt], rg[mt], u, t, a[mt][0], a[mt][2], s[mt][0], m[mt][0]);
                    F::unit(pg8[mt], rg8[mt], u, t, a[mt][1], a[mt][3], s[mt][1], m[mt][1]);
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int tb = min(8 * j + g, n_tokens - 1);
                    uint32_t xb[2];
                    const MqPair xv = *(const MqPair*)(xq + (long long)tb * ncols + 32 * U + 8 * t);
                    xb[0] = xv.x;
                    xb[1] = xv.y;
                    const MqF2 x0 = xds[(long long)min(8 * j + 2 * t, n_tokens - 1) * nunits + U];
                    const MqF2 x1 = xds[(long long)min(8 * j + 2 * t + 1, n_tokens - 1) * nunits + U];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        int c[4] = {0, 0, 0, 0};
                        mq_mma_k32<EMU>(c, a[mt], xb);
                        acc[mt][j][0] += (float)c[0] * (s[mt][0] * x0.x);
                        acc[mt][j][1] += (float)c[1] * (s[mt][0] * x1.x);
                        acc[mt][j][2] += (float)c[2] * (s[mt][1] * x0.x);
                        acc[mt][j][3] += (float)c[3] * (s[mt][1] * x1.x);
                        if constexpr (F::HAS_MIN) {
                            acc[mt][j][0] += m[mt][0] * x0.y;
                            acc[mt][j][1] += m[mt][0] * x1.y;
                            acc[mt][j][2] += m[mt][1] * x0.y;
                            acc[mt][j][3] += m[mt][1] * x1.y;
                        }
                    }
                }
            }
        }
    }
}

// grid (ceil(nrows / (16 MT))), block (32, nw <= MMQ_MAX_WARPS), dynamic shared memory
// max(nw * MMQ_STAGES * 16 MT * VPR * 16, nw * MT * NT * 4 * 32 * 4) bytes (MMQ_STAGES: 4 on
// sm_80+, 1 on sm_70). n_tokens <= 8 * NT. A block owns MT 16-row tiles (the mma's m): x's
// loads of a unit serve all of them (at 32 tokens a 16-row tile reads ~5x its weight bytes of
// x through L1, so MT > 1 cuts that traffic by MT).
template <typename F, int NT, int MT>
static __device__ __forceinline__ void mmq(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                           const float* __restrict__ xds_f, float* __restrict__ y, int nrows,
                                           int ncols, long long row_bytes, int n_tokens, int emulate) {
    constexpr int VPR = MqStage<F, MT>::VPR, L = MqStage<F, MT>::L, RS = 16 * VPR, SR = 16 * MT;
    extern __shared__ MqVec mq_smem[];
    const int lane = threadIdx.x, wid = threadIdx.y, nw = blockDim.y;
    const int g = lane >> 2;
    const int row0 = blockIdx.x * SR;
    const MqF2* xds = (const MqF2*)xds_f;
    MqVec* sv = mq_smem + wid * MMQ_STAGES * SR * VPR;  // this warp's stages
    const int nunits = ncols / 32;
    const int nchunks = (nunits + 7) / 8;

    // this lane's staging slots: vector v of row r for slot i = lane + 32k = r * VPR + v
    const uint8_t* slot_row[L];
#pragma unroll
    for (int k = 0; k < L; k++) {
        const int i = lane + 32 * k, r = min(i / VPR, SR - 1);
        slot_row[k] = W + (long long)min(row0 + r, nrows - 1) * row_bytes;
    }
    const uint8_t* row_g[MT];
    const uint8_t* row_g8[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        row_g[mt] = W + (long long)min(row0 + 16 * mt + g, nrows - 1) * row_bytes;
        row_g8[mt] = W + (long long)min(row0 + 16 * mt + g + 8, nrows - 1) * row_bytes;
    }

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][j][i] = 0.0f;

    // chunk c's byte range of this lane's slot rows: vector v of slot i = r * VPR + v is
    // copied when it holds bytes of the chunk (the range rounded out to 16 bytes)
    auto slot_src = [&](int c, int k, const MqVec*& src) -> bool {
        const long long cofs = (long long)c * F::CB;
        const int len = (int)min((long long)F::CB, row_bytes - cofs);
        const int i = lane + 32 * k, v = i % VPR;
        const uint8_t* start = slot_row[k] + cofs;
        const int off = (int)((unsigned long long)start & 15ull);
        src = (const MqVec*)(start - off) + v;
        return i < SR * VPR && v < ((off + len + 15) >> 4);
    };
    auto compute = [&](int c, const uint8_t* sb) {
        const long long cofs = (long long)c * F::CB;
        const uint8_t* pg[MT];
        const uint8_t* pg8[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            pg[mt] = sb + (16 * mt + g) * RS + (int)((unsigned long long)(row_g[mt] + cofs) & 15ull);
            pg8[mt] = sb + (16 * mt + g + 8) * RS + (int)((unsigned long long)(row_g8[mt] + cofs) & 15ull);
        }
        if (emulate)
            mq_chunk<F, NT, MT, true>(pg, pg8, 8 * c, min(8, nunits - 8 * c), xq, xds, ncols, nunits, n_tokens, acc);
        else
            mq_chunk<F, NT, MT, false>(pg, pg8, 8 * c, min(8, nunits - 8 * c), xq, xds, ncols, nunits, n_tokens, acc);
    };
#if __CUDA_ARCH__ >= 800
    constexpr int S = MMQ_STAGES;
    auto issue = [&](int c, MqVec* dst) {
#pragma unroll
        for (int k = 0; k < L; k++) {
            const MqVec* src;
            if (slot_src(c, k, src)) mq_cp16(dst + lane + 32 * k, src);
        }
    };
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (wid + s * nw < nchunks) issue(wid + s * nw, sv + s * SR * VPR);
        mq_cp_commit();
    }
    int it = 0;
    for (int c = wid; c < nchunks; c += nw, it++) {
        const int cn = c + (S - 1) * nw;
        if (cn < nchunks) issue(cn, sv + ((it + S - 1) % S) * SR * VPR);
        mq_cp_commit();
        mq_cp_wait<S - 1>();  // chunk c's group is complete
        __syncwarp();
        compute(c, (const uint8_t*)(sv + (it % S) * SR * VPR));
        __syncwarp();  // its stage is refilled next iteration
    }
    mq_cp_wait<0>();
#else
    const uint8_t* sb = (const uint8_t*)sv;
    MqVec st[L];
    auto load = [&](int c) {
#pragma unroll
        for (int k = 0; k < L; k++) {
            const MqVec* src;
            if (slot_src(c, k, src)) st[k] = mq_ld_stream(src);
        }
    };
    int c = wid;
    if (c < nchunks) load(c);
    for (; c < nchunks; c += nw) {
        __syncwarp();
#pragma unroll
        for (int k = 0; k < L; k++) {
            const int i = lane + 32 * k;
            if (i < SR * VPR) sv[i] = st[k];
        }
        __syncwarp();
        if (c + nw < nchunks) load(c + nw);
        compute(c, sb);
    }
#endif

    // the warps' partial sums: red[w][(mt * NT + j) * 4 + i][lane]
    constexpr int PW = MT * NT * 4 * 32;  // partials per warp
    __syncthreads();
    float* red = (float*)mq_smem;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[wid * PW + ((mt * NT + j) * 4 + i) * 32 + lane] = acc[mt][j][i];
    __syncthreads();
    for (int o = wid * 32 + lane; o < PW; o += nw * 32) {
        float s = 0.0f;
        for (int w = 0; w < nw; w++) s += red[w * PW + o];
        const int mji = o >> 5, ln = o & 31, mt = mji / (NT * 4), ji = mji % (NT * 4), j = ji >> 2, i = ji & 3;
        const int row = row0 + 16 * mt + (ln >> 2) + 8 * (i >> 1);
        const int tok = 8 * j + 2 * (ln & 3) + (i & 1);
        if (row < nrows && tok < n_tokens) y[(long long)tok * nrows + row] = s;
    }
}

// One kernel per (format, NT, MT): up to 8 * NT tokens, the weights read once, MT 16-row tiles a
// block. MT = 1 comes twice, as mmv.cu's: `name` with the int8 mma (the emulation compiled out,
// fewer registers) and `name_emu` with it emulated (sm_70, tests); `emulate` is ignored (the
// host picks the suffix). MT = 2 (`_m2`, 9..32 tokens) comes with the mma only: the host takes
// it on sm_80+ and never with the emulation.
#define MMQ_KERNEL1(name, F, NT, MT, SUFFIX, EMU)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_MAX_WARPS)                                   \
        mmq_##name##_t##NT##SUFFIX(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,       \
                                   const float* __restrict__ xds, float* __restrict__ y, int nrows,   \
                                   int ncols, long long row_bytes, int n_tokens, int emulate) {        \
        (void)emulate;                                                                                 \
        mmq<F, NT, MT>(W, xq, xds, y, nrows, ncols, row_bytes, n_tokens, EMU);                         \
    }
#define MMQ_KERNEL(name, F, NT) MMQ_KERNEL1(name, F, NT, 1, , 0) MMQ_KERNEL1(name, F, NT, 1, _emu, 1)
#define MMQ_FORMAT(name, F)                                                                              \
    MMQ_KERNEL(name, F, 1) MMQ_KERNEL(name, F, 2) MMQ_KERNEL(name, F, 3) MMQ_KERNEL(name, F, 4)          \
        MMQ_KERNEL1(name, F, 2, 2, _m2, 0) MMQ_KERNEL1(name, F, 3, 2, _m2, 0) MMQ_KERNEL1(name, F, 4, 2, _m2, 0)

MMQ_FORMAT(q4_0, MqQ4_0)
MMQ_FORMAT(q8_0, MqQ8_0)
MMQ_FORMAT(q4_k, MqQ4_K)
MMQ_FORMAT(q5_k, MqQ5_K)
MMQ_FORMAT(q6_k, MqQ6_K)
MMQ_FORMAT(iq4_xs, MqIQ4_XS)
