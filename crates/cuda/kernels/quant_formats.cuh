// quant_formats.cuh — decoders of ggml block formats into int8 lanes for dp4a dot products.
//
// Block layouts are ggml's `block_*` (ggml/src/ggml-common.h), read byte-for-byte as stored in
// GGUF; bit layouts follow ggml's `dequantize_row_*` (ggml/src/ggml-quants.c).
//
// Every format is seen as a sequence of 32-element "units" (1 per block for the 32-wide
// formats, 8 per 256-wide super-block). `decode(b, u, ...)` turns unit `u` of the block at
// `b` into 32 signed int8 values v (4 per int) and scales such that, for element e of the
// unit with half h = e / 16:
//     w[e] = s_h * v[e] + m_h                (m_h applies per half when HALF_MIN)
//     w[e] = s_h * v[e] + m0 (per unit)      (when HAS_MIN)
// so that dot(w, x) over the unit with x ~ xd * xq (q8_1) is
//     xd * (s0 * sumi0 + s1 * sumi1) + m0 * xs   (xs = xd * sum(xq)),
// which the matvec driver evaluates with dp4a.
//
// The driver gives each lane two units at a time ("a lane task"): `decode2(b, task, ...)`
// decodes units u[0], u[1] of one block, sharing the loads and scale decoding they have in common
// (e.g. the low and high nibbles of the same 32 Q4_K bytes). The 32-wide formats take two
// consecutive blocks per task (u = 0 of block b and of block b + BLOCK_BYTES).
#pragma once
#include "common.cuh"

// ggml `kvalues_iq4nl` as little-endian packed bytes: {-127,-104,-83,-65}, {-49,-35,-22,-10},
// {1,13,25,38}, {53,69,89,113}.
#define IQ4NL_T0 0xBFAD9881u
#define IQ4NL_T1 0xF6EADDCFu
#define IQ4NL_T2 0x26190D01u
#define IQ4NL_T3 0x71594535u

// Four 4-bit indices (one per byte, values 0..15) -> four int8 kvalues_iq4nl entries.
static __device__ __forceinline__ uint32_t iq4nl_lookup4(uint32_t idx) {
    const uint32_t t = idx & 0x07070707u;
    const uint32_t sel = (t & 0x7u) | ((t >> 4) & 0x70u) | ((t >> 8) & 0x700u) | ((t >> 12) & 0x7000u);
    const uint32_t lo = prmt(IQ4NL_T0, IQ4NL_T1, sel);
    const uint32_t hi = prmt(IQ4NL_T2, IQ4NL_T3, sel);
    const uint32_t m = ((idx & 0x08080808u) >> 3) * 0xFFu;
    return (lo & ~m) | (hi & m);
}

// Eight 4-bit kvalues_iq4nl indices packed in w (byte i: low nibble = element i, high nibble =
// element i + 16 of a 32-element unit, ggml block_iq4_nl / iq4_xs layout) -> int8 values:
// lo = elements 0..3 (bytes' low nibbles), hi = elements 16..19. 7 prmt instead of ~28 ops of
// iq4nl_lookup4 x 2: the packed nibbles are the prmt selectors directly (bit 3 masked off,
// since a set selector bit 3 means sign replication), bit 3 picks the 8..15 half afterwards.
// prmt reads only the low 16 bits of its selector, so both halves' selectors are masked (and
// the 8..15 picks built) once for the whole word and shifted down for the upper half.
static __device__ __forceinline__ void iq4nl_lookup8(uint32_t w, uint32_t& lo, uint32_t& hi) {
    const uint32_t sel = w & 0x77777777u;
    const uint32_t pick = ((w >> 1) & 0x44444444u) | 0x32103210u;
    uint32_t r[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        // nibbles lo(2h), hi(2h), lo(2h+1), hi(2h+1)
        const uint32_t a = prmt(IQ4NL_T0, IQ4NL_T1, sel >> (16 * h));
        const uint32_t b = prmt(IQ4NL_T2, IQ4NL_T3, sel >> (16 * h));
        r[h] = prmt(a, b, pick >> (16 * h));
    }
    lo = prmt(r[0], r[1], 0x6420u);
    hi = prmt(r[0], r[1], 0x7531u);
}

// Spreads bits 0..3 of hb into bit 4 of bytes 0..3 (Q5_0 / Q5_1 fifth bits).
static __device__ __forceinline__ uint32_t spread_bits_to_bit4(uint32_t hb) {
    return ((hb << 4) & 0x10u) | ((hb << 11) & 0x1000u) | ((hb << 18) & 0x100000u) | ((hb << 25) & 0x10000000u);
}

// ggml get_scale_min_k4: 6-bit scale and min j (0..7) of Q4_K / Q5_K packed in 12 bytes.
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Reads a little-endian u32 at p; p is 4-byte aligned when ALIGN4, else 2-byte aligned.
template <bool ALIGN4>
static __device__ __forceinline__ uint32_t ld32(const uint8_t* p) {
    if constexpr (ALIGN4) {
        return *(const uint32_t*)p;
    } else {
        return ld_u32_a2(p);
    }
}

struct FmtQ4_0 {  // block_q4_0: d f16, qs[16]; x = d * (q - 8)
    static constexpr int BLOCK_BYTES = 18, UNITS = 1;
    static constexpr bool HAS_MIN = true, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const float d = f16_to_f32(ld_u16(b));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32_a2(b + 2 + 4 * i);
            v[i] = w & 0x0F0F0F0F;
            v[4 + i] = (w >> 4) & 0x0F0F0F0F;
        }
        s0 = s1 = d;
        m0 = -8.0f * d;
        m1 = 0.0f;
    }
};

struct FmtQ4_1 {  // block_q4_1: d, m f16, qs[16]; x = d * q + m
    static constexpr int BLOCK_BYTES = 20, UNITS = 1;
    static constexpr bool HAS_MIN = true, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, int v[8], float& s0, float& s1, float& m0, float& m1) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld32<true>(b + 4 + 4 * i);
            v[i] = w & 0x0F0F0F0F;
            v[4 + i] = (w >> 4) & 0x0F0F0F0F;
        }
        s0 = s1 = f16_to_f32(ld_u16(b));
        m0 = f16_to_f32(ld_u16(b + 2));
        m1 = 0.0f;
    }
};

struct FmtQ5_0 {  // block_q5_0: d f16, qh[4] (bit j = 5th bit of element j), qs[16]; x = d * (q - 16)
    static constexpr int BLOCK_BYTES = 22, UNITS = 1;
    static constexpr bool HAS_MIN = true, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const float d = f16_to_f32(ld_u16(b));
        const uint32_t qh = ld_u32_a2(b + 2);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32_a2(b + 6 + 4 * i);
            v[i] = (w & 0x0F0F0F0F) | spread_bits_to_bit4(qh >> (4 * i));
            v[4 + i] = ((w >> 4) & 0x0F0F0F0F) | spread_bits_to_bit4(qh >> (16 + 4 * i));
        }
        s0 = s1 = d;
        m0 = -16.0f * d;
        m1 = 0.0f;
    }
};

struct FmtQ5_1 {  // block_q5_1: d, m f16, qh[4], qs[16]; x = d * q + m
    static constexpr int BLOCK_BYTES = 24, UNITS = 1;
    static constexpr bool HAS_MIN = true, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const uint32_t qh = ld32<true>(b + 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld32<true>(b + 8 + 4 * i);
            v[i] = (w & 0x0F0F0F0F) | spread_bits_to_bit4(qh >> (4 * i));
            v[4 + i] = ((w >> 4) & 0x0F0F0F0F) | spread_bits_to_bit4(qh >> (16 + 4 * i));
        }
        s0 = s1 = f16_to_f32(ld_u16(b));
        m0 = f16_to_f32(ld_u16(b + 2));
        m1 = 0.0f;
    }
};

struct FmtQ8_0 {  // block_q8_0: d f16, qs[32] int8; x = d * q
    static constexpr int BLOCK_BYTES = 34, UNITS = 1;
    static constexpr bool HAS_MIN = false, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, int v[8], float& s0, float& s1, float& m0, float& m1) {
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = ld_u32_a2(b + 2 + 4 * i);
        s0 = s1 = f16_to_f32(ld_u16(b));
        m0 = m1 = 0.0f;
    }
};

struct FmtIQ4_NL {  // block_iq4_nl: d f16, qs[16]; x = d * kvalues[q]
    static constexpr int BLOCK_BYTES = 18, UNITS = 1;
    static constexpr bool HAS_MIN = false, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int, int v[8], float& s0, float& s1, float& m0, float& m1) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld_u32_a2(b + 2 + 4 * i);
            v[i] = iq4nl_lookup4(w & 0x0F0F0F0F);
            v[4 + i] = iq4nl_lookup4((w >> 4) & 0x0F0F0F0F);
        }
        s0 = s1 = f16_to_f32(ld_u16(b));
        m0 = m1 = 0.0f;
    }
};

struct FmtIQ4_XS {  // block_iq4_xs: d f16, scales_h u16, scales_l[4], qs[128]; 8 sub-blocks of 32
    static constexpr int BLOCK_BYTES = 136, UNITS = 8;
    static constexpr bool HAS_MIN = false, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int u, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const float d = f16_to_f32(ld_u16(b));
        const uint32_t sh = ld_u16(b + 2);
        const int ls = ((b[4 + u / 2] >> (4 * (u % 2))) & 0xF) | (((sh >> (2 * u)) & 3) << 4);
        const uint8_t* q = b + 8 + 16 * u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t w = ld32<true>(q + 4 * i);
            v[i] = iq4nl_lookup4(w & 0x0F0F0F0F);
            v[4 + i] = iq4nl_lookup4((w >> 4) & 0x0F0F0F0F);
        }
        s0 = s1 = d * (float)(ls - 32);
        m0 = m1 = 0.0f;
    }
};

struct FmtQ2_K {  // block_q2_K: scales[16] (lo4 scale, hi4 min), qs[64], d, dmin f16
    static constexpr int BLOCK_BYTES = 84, UNITS = 8;
    static constexpr bool HAS_MIN = false, HALF_MIN = true, SPLIT = true;
    static __device__ __forceinline__ void decode(const uint8_t* b, int u, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const float d = f16_to_f32(ld_u16(b + 80));
        const float dmin = f16_to_f32(ld_u16(b + 82));
        const uint8_t* q = b + 16 + 32 * (u / 4);
        const int shift = 2 * (u % 4);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = (ld32<true>(q + 4 * i) >> shift) & 0x03030303;
        const int sc0 = b[2 * u], sc1 = b[2 * u + 1];
        s0 = d * (float)(sc0 & 0xF);
        s1 = d * (float)(sc1 & 0xF);
        m0 = -dmin * (float)(sc0 >> 4);
        m1 = -dmin * (float)(sc1 >> 4);
    }
};

struct FmtQ3_K {  // block_q3_K: hmask[32], qs[64], scales[12] (16 x 6 bits), d f16
    static constexpr int BLOCK_BYTES = 110, UNITS = 8;
    static constexpr bool HAS_MIN = false, HALF_MIN = false, SPLIT = true;
    static __device__ __forceinline__ int scale(const uint8_t* s, int k) {
        const int lo = k < 8 ? (s[k] & 0xF) : (s[k - 8] >> 4);
        const int hi = (s[8 + (k % 4)] >> (2 * (k / 4))) & 3;
        return (lo | (hi << 4)) - 32;
    }
    static __device__ __forceinline__ void decode(const uint8_t* b, int u, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const float d = f16_to_f32(ld_u16(b + 108));
        const uint8_t* q = b + 32 + 32 * (u / 4);
        const int shift = 2 * (u % 4);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t lo = (ld_u32_a2(q + 4 * i) >> shift) & 0x03030303u;
            const uint32_t h = (ld_u32_a2(b + 4 * i) >> u) & 0x01010101u;
            // q = lo - 4 where the high bit is clear (ggml: `(hm[l] & m) ? 0 : 4`)
            v[i] = sub_bytes_biased(lo, ((~h) & 0x01010101u) << 2);
        }
        s0 = d * (float)scale(b + 96, 2 * u);
        s1 = d * (float)scale(b + 96, 2 * u + 1);
        m0 = m1 = 0.0f;
    }
};

struct FmtQ4_K {  // block_q4_K: d, dmin f16, scales[12], qs[128]; x = d*sc*q - dmin*m
    static constexpr int BLOCK_BYTES = 144, UNITS = 8;
    static constexpr bool HAS_MIN = true, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int u, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const float d = f16_to_f32(ld_u16(b));
        const float dmin = f16_to_f32(ld_u16(b + 2));
        int sc, m;
        scale_min_k4(u, b + 4, sc, m);
        const uint8_t* q = b + 16 + 32 * (u / 2);
        const int shift = 4 * (u % 2);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = (ld32<true>(q + 4 * i) >> shift) & 0x0F0F0F0F;
        s0 = s1 = d * (float)sc;
        m0 = -dmin * (float)m;
        m1 = 0.0f;
    }
};

struct FmtQ5_K {  // block_q5_K: d, dmin, scales[12], qh[32] (bit u = 5th bit), qs[128]
    static constexpr int BLOCK_BYTES = 176, UNITS = 8;
    static constexpr bool HAS_MIN = true, HALF_MIN = false, SPLIT = false;
    static __device__ __forceinline__ void decode(const uint8_t* b, int u, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const float d = f16_to_f32(ld_u16(b));
        const float dmin = f16_to_f32(ld_u16(b + 2));
        int sc, m;
        scale_min_k4(u, b + 4, sc, m);
        const uint8_t* q = b + 48 + 32 * (u / 2);
        const int shift = 4 * (u % 2);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t lo = (ld32<true>(q + 4 * i) >> shift) & 0x0F0F0F0Fu;
            const uint32_t h = (ld32<true>(b + 16 + 4 * i) >> u) & 0x01010101u;
            v[i] = lo | (h << 4);
        }
        s0 = s1 = d * (float)sc;
        m0 = -dmin * (float)m;
        m1 = 0.0f;
    }
};

struct FmtQ6_K {  // block_q6_K: ql[128], qh[64], scales[16] int8, d f16; x = d*sc*(q - 32)
    static constexpr int BLOCK_BYTES = 210, UNITS = 8;
    static constexpr bool HAS_MIN = false, HALF_MIN = false, SPLIT = true;
    static __device__ __forceinline__ void decode(const uint8_t* b, int u, int v[8], float& s0, float& s1, float& m0, float& m1) {
        const int n = u / 4, k = u % 4;
        const uint8_t* ql = b + 64 * n + 32 * (k & 1);
        const uint8_t* qh = b + 128 + 32 * n;
        const int nshift = 4 * (k >> 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t lo = (ld_u32_a2(ql + 4 * i) >> nshift) & 0x0F0F0F0Fu;
            const uint32_t hi = ((ld_u32_a2(qh + 4 * i) >> (2 * k)) & 0x03030303u) << 4;
            v[i] = sub_bytes_biased(lo | hi, 0x20202020u);
        }
        const float d = f16_to_f32(ld_u16(b + 208));
        const int8_t* sc = (const int8_t*)(b + 192);
        s0 = d * (float)sc[8 * n + 2 * k];
        s1 = d * (float)sc[8 * n + 2 * k + 1];
        m0 = m1 = 0.0f;
    }
};

// (hi:lo) >> sh, low 32 bits (sh in 0..31): extracts a word at a byte offset across two words.
static __device__ __forceinline__ uint32_t funnel_r(uint32_t lo, uint32_t hi, uint32_t sh) {
    uint32_t r;
    asm("shf.r.wrap.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sh));
    return r;
}

// N little-endian u32 from a 2-byte-aligned p: N + 1 aligned word loads and N funnel shifts
// (instead of 2N 16-bit loads: half the shared-memory wavefronts). May read the aligned word
// that holds bytes p + 4N .. p + 4N + 1, so the buffer needs 4 bytes of slack after the data.
template <int N>
static __device__ __forceinline__ void ldw_a2(const uint8_t* p, uint32_t w[N]) {
    const unsigned long long a = (unsigned long long)p;
    const uint32_t* q = (const uint32_t*)(a & ~3ull);
    const uint32_t sh = (uint32_t)(a & 2ull) * 8u;
    uint32_t x[N + 1];
#pragma unroll
    for (int i = 0; i <= N; i++) x[i] = q[i];
#pragma unroll
    for (int i = 0; i < N; i++) w[i] = funnel_r(x[i], x[i + 1], sh);
}

// Eight little-endian u32 from p, with p aligned to A bytes (16: two vector loads).
template <int A>
static __device__ __forceinline__ void ld8(const uint8_t* p, uint32_t w[8]) {
    if constexpr (A >= 16) {
        struct alignas(16) v4 { uint32_t x, y, z, w; };
        const v4 a = ((const v4*)p)[0], b = ((const v4*)p)[1];
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
        w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else if constexpr (A >= 8) {
        struct alignas(8) v2 { uint32_t x, y; };
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const v2 a = ((const v2*)p)[i];
            w[2 * i] = a.x;
            w[2 * i + 1] = a.y;
        }
    } else if constexpr (A >= 4) {
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = ld32<true>(p + 4 * i);
    } else {
        ldw_a2<8>(p, w);
    }
}

// Q4_K / Q5_K 6-bit scale and min of sub-blocks 2k and 2k+1 (k = 0..3) from the 12 packed
// bytes at q (4-byte aligned), branch-free (ggml get_scale_min_k4: j < 4 takes the low 6 bits
// of q[j], q[j + 4]; j >= 4 combines q[j + 4] nibbles with the top 2 bits of q[j - 4], q[j]).
static __device__ __forceinline__ void scale_min_k4_pair(int k, const uint8_t* q, int sc[2], int m[2]) {
    const uint32_t s0 = ld32<true>(q), s1 = ld32<true>(q + 4), s2 = ld32<true>(q + 8);
    const uint32_t sh = 16 * (k & 1);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint32_t a = (s0 >> (sh + 8 * j)) & 0xFF, b = (s1 >> (sh + 8 * j)) & 0xFF;
        const uint32_t c = (s2 >> (sh + 8 * j)) & 0xFF;
        const bool lo = k < 2;
        sc[j] = lo ? (int)(a & 63) : (int)((c & 0xF) | ((a >> 6) << 4));
        m[j] = lo ? (int)(b & 63) : (int)((c >> 4) | ((b >> 6) << 4));
    }
}

// A decoded lane task: two 32-element units.
struct Task {
    int v[2][8];
    float s0[2], s1[2], m0[2], m1[2];
    int unit[2];  // unit index within the block (32-wide formats: block offset 0 / 1)
};

// Two consecutive blocks of a 32-wide format.
template <typename F>
static __device__ __forceinline__ void decode2_blocks(const uint8_t* b, Task& t) {
    F::decode(b, 0, t.v[0], t.s0[0], t.s1[0], t.m0[0], t.m1[0]);
    F::decode(b + F::BLOCK_BYTES, 0, t.v[1], t.s0[1], t.s1[1], t.m0[1], t.m1[1]);
    t.unit[0] = 0;
    t.unit[1] = 1;
}

// Q4_K task k (0..3): units 2k (low nibbles) and 2k+1 (high nibbles) of qs[32k .. 32k+32].
// Unsigned weights (Decode2Traits: dp4a.u32.s32): the high nibbles stay in place, i.e. 16x
// their value (one AND instead of a shift and an AND per word), and their unit's scale is
// d/16 * sc. Exact: the factor 16 is a power of two and |16 * sum| < 2^24, so the product is
// the same float as d * sc * sum.
static __device__ __forceinline__ void decode2_q4_k(const uint8_t* b, int k, Task& t) {
    const uint32_t dd = ld32<true>(b);
    const float d = f16_to_f32((uint16_t)(dd & 0xFFFF)), dmin = f16_to_f32((uint16_t)(dd >> 16));
    uint32_t w[8];
    ld8<16>(b + 16 + 32 * k, w);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        t.v[0][i] = w[i] & 0x0F0F0F0F;
        t.v[1][i] = w[i] & 0xF0F0F0F0;
    }
    int sc[2], m[2];
    scale_min_k4_pair(k, b + 4, sc, m);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        t.s0[j] = t.s1[j] = (j == 0 ? d : d * 0.0625f) * (float)sc[j];
        t.m0[j] = -dmin * (float)m[j];
        t.m1[j] = 0.0f;
        t.unit[j] = 2 * k + j;
    }
}

// Q5_K task k: as Q4_K, fifth bits from qh[0..32] bits 2k and 2k+1.
static __device__ __forceinline__ void decode2_q5_k(const uint8_t* b, int k, Task& t) {
    const uint32_t dd = ld32<true>(b);
    const float d = f16_to_f32((uint16_t)(dd & 0xFFFF)), dmin = f16_to_f32((uint16_t)(dd >> 16));
    uint32_t w[8], h[8];
    ld8<16>(b + 48 + 32 * k, w);
    ld8<16>(b + 16, h);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        t.v[0][i] = (w[i] & 0x0F0F0F0F) | (((h[i] >> (2 * k)) & 0x01010101) << 4);
        t.v[1][i] = ((w[i] >> 4) & 0x0F0F0F0F) | (((h[i] >> (2 * k + 1)) & 0x01010101) << 4);
    }
    int sc[2], m[2];
    scale_min_k4_pair(k, b + 4, sc, m);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        t.s0[j] = t.s1[j] = d * (float)sc[j];
        t.m0[j] = -dmin * (float)m[j];
        t.m1[j] = 0.0f;
        t.unit[j] = 2 * k + j;
    }
}

// Q6_K task k (0..3): n = k/2, c = k%2; units 4n+c (low nibbles of ql[64n+32c..]) and 4n+c+2
// (high nibbles of the same bytes); 2-bit highs from qh[32n..32n+32] at shifts 2c and 2c+4.
static __device__ __forceinline__ void decode2_q6_k(const uint8_t* b, int k, Task& t) {
    const int n = k >> 1, c = k & 1;
    uint32_t w[8], h[8];
    ld8<2>(b + 64 * n + 32 * c, w);
    ld8<2>(b + 128 + 32 * n, h);
    // unsigned 6-bit values q + 32 (Decode2Traits: the dot subtracts 32 * the x sums of each
    // 16-element half); the two high bits of each byte moved to bits 4..5 in place
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t hi0 = (h[i] << (4 - 2 * c)) & 0x30303030u;  // bits 2c, 2c+1
        const uint32_t hi1 = (h[i] >> (2 * c)) & 0x30303030u;       // bits 2c+4, 2c+5
        t.v[0][i] = (w[i] & 0x0F0F0F0Fu) | hi0;
        t.v[1][i] = ((w[i] >> 4) & 0x0F0F0F0Fu) | hi1;
    }
    const float d = f16_to_f32(ld_u16(b + 208));
    const int8_t* sc = (const int8_t*)(b + 192);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int u = 4 * n + c + 2 * j;
        t.s0[j] = d * (float)sc[2 * u];
        t.s1[j] = d * (float)sc[2 * u + 1];
        t.m0[j] = t.m1[j] = 0.0f;
        t.unit[j] = u;
    }
}

// Q2_K task k: n = k/2, units 4n + 2(k%2) + {0,1} from qs[32n..] at shifts 2j.
static __device__ __forceinline__ void decode2_q2_k(const uint8_t* b, int k, Task& t) {
    const int n = k >> 1, j0 = 2 * (k & 1);
    const uint32_t dd = ld32<true>(b + 80);
    const float d = f16_to_f32((uint16_t)(dd & 0xFFFF)), dmin = f16_to_f32((uint16_t)(dd >> 16));
    uint32_t w[8];
    ld8<4>(b + 16 + 32 * n, w);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        t.v[0][i] = (w[i] >> (2 * j0)) & 0x03030303;
        t.v[1][i] = (w[i] >> (2 * j0 + 2)) & 0x03030303;
    }
    const int u0 = 4 * n + j0;
    const uint32_t scs = ld32<true>(b + 2 * u0);  // scales[2u0 .. 2u0+4]
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int sc0 = (scs >> (16 * j)) & 0xFF, sc1 = (scs >> (16 * j + 8)) & 0xFF;
        t.s0[j] = d * (float)(sc0 & 0xF);
        t.s1[j] = d * (float)(sc1 & 0xF);
        t.m0[j] = -dmin * (float)(sc0 >> 4);
        t.m1[j] = -dmin * (float)(sc1 >> 4);
        t.unit[j] = u0 + j;
    }
}

// Q3_K task k: n = k/2, units 4n + 2(k%2) + {0,1}: 2 low bits from qs[32n..], high bit u of hmask.
static __device__ __forceinline__ void decode2_q3_k(const uint8_t* b, int k, Task& t) {
    const int n = k >> 1, j0 = 2 * (k & 1);
    const int u0 = 4 * n + j0;
    uint32_t w[8], h[8];
    ld8<2>(b + 32 + 32 * n, w);
    ld8<2>(b, h);
#pragma unroll
    for (int i = 0; i < 8; i++) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint32_t lo = (w[i] >> (2 * (j0 + j))) & 0x03030303u;
            const uint32_t hb = (h[i] >> (u0 + j)) & 0x01010101u;
            t.v[j][i] = sub_bytes_biased(lo, ((~hb) & 0x01010101u) << 2);
        }
    }
    const float d = f16_to_f32(ld_u16(b + 108));
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int u = u0 + j;
        t.s0[j] = d * (float)FmtQ3_K::scale(b + 96, 2 * u);
        t.s1[j] = d * (float)FmtQ3_K::scale(b + 96, 2 * u + 1);
        t.m0[j] = t.m1[j] = 0.0f;
        t.unit[j] = u;
    }
}

// IQ4_XS task k: units 2k and 2k+1 from qs[32k .. 32k+32] (16 bytes each).
static __device__ __forceinline__ void decode2_iq4_xs(const uint8_t* b, int k, Task& t) {
    const float d = f16_to_f32(ld_u16(b));
    const uint32_t sh = ld_u16(b + 2);
    const uint32_t sl = b[4 + k];
    uint32_t w[8];
    ld8<8>(b + 8 + 32 * k, w);
#pragma unroll
    for (int j = 0; j < 2; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo, hi;
            iq4nl_lookup8(w[4 * j + i], lo, hi);
            t.v[j][i] = (int)lo;
            t.v[j][4 + i] = (int)hi;
        }
        const int ls = ((sl >> (4 * j)) & 0xF) | (((sh >> (4 * k + 2 * j)) & 3) << 4);
        t.s0[j] = t.s1[j] = d * (float)(ls - 32);
        t.m0[j] = t.m1[j] = 0.0f;
        t.unit[j] = 2 * k + j;
    }
}

// Two consecutive 2-byte-aligned 32-wide blocks (Q4_0, IQ4_NL, Q5_0, Q8_0) read with aligned
// word loads + funnel shifts (ldw_a2): d f16 at the block start, the payload from byte 2.
template <typename F>
static __device__ __forceinline__ void decode2_a2(const uint8_t* b, Task& t) {
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint8_t* bj = b + j * F::BLOCK_BYTES;
        const float d = f16_to_f32(ld_u16(bj));
        if constexpr (F::BLOCK_BYTES == 34) {  // Q8_0: qs[32] int8
            uint32_t w[8];
            ldw_a2<8>(bj + 2, w);
#pragma unroll
            for (int i = 0; i < 8; i++) t.v[j][i] = (int)w[i];
            t.m0[j] = 0.0f;
        } else if constexpr (F::BLOCK_BYTES == 22) {  // Q5_0: qh[4], qs[16]
            uint32_t w[5];
            ldw_a2<5>(bj + 2, w);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                t.v[j][i] = (int)((w[1 + i] & 0x0F0F0F0F) | spread_bits_to_bit4(w[0] >> (4 * i)));
                t.v[j][4 + i] = (int)(((w[1 + i] >> 4) & 0x0F0F0F0F) | spread_bits_to_bit4(w[0] >> (16 + 4 * i)));
            }
            t.m0[j] = -16.0f * d;
        } else {  // Q4_0 / IQ4_NL: qs[16] nibbles, low = elements 0..15, high = 16..31
            uint32_t w[4];
            ldw_a2<4>(bj + 2, w);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint32_t lo = w[i] & 0x0F0F0F0F, hi = (w[i] >> 4) & 0x0F0F0F0F;
                if constexpr (F::HAS_MIN) {  // Q4_0: q - 8 through the min term
                    t.v[j][i] = (int)lo;
                    t.v[j][4 + i] = (int)hi;
                } else {
                    uint32_t vl, vh;
                    iq4nl_lookup8(w[i], vl, vh);
                    t.v[j][i] = (int)vl;
                    t.v[j][4 + i] = (int)vh;
                }
            }
            t.m0[j] = F::HAS_MIN ? -8.0f * d : 0.0f;
        }
        t.s0[j] = t.s1[j] = d;
        t.m1[j] = 0.0f;
        t.unit[j] = j;
    }
}

// How task_dot treats a format's decoded task: UNSIGNED: the weight bytes are unsigned
// (dp4a.u32.s32); BIAS: they hold q + BIAS, so the dot subtracts BIAS * the x sum of each
// 16-element half (exact integer arithmetic: the same sums as signed q).
template <typename F> struct Decode2Traits {
    static constexpr bool UNSIGNED = false;
    static constexpr int BIAS = 0;
};
template <> struct Decode2Traits<FmtQ4_K> {
    static constexpr bool UNSIGNED = true;
    static constexpr int BIAS = 0;
};
template <> struct Decode2Traits<FmtQ6_K> {
    static constexpr bool UNSIGNED = true;
    static constexpr int BIAS = 32;
};

// decode2 dispatch per format (formats with UNITS == 1 take two consecutive blocks).
// `units(k, u)` gives the two unit indices of task k without decoding (for loading x first);
// it must agree with the `unit` fields `run` fills in.
template <typename F> struct Decode2 {
    static __device__ __forceinline__ void units(int, int u[2]) { u[0] = 0; u[1] = 1; }
    static __device__ __forceinline__ void run(const uint8_t* b, int, Task& t) { decode2_blocks<F>(b, t); }
};
#define DECODE2_A2(F)                                                                               \
    template <> struct Decode2<F> {                                                                 \
        static __device__ __forceinline__ void units(int, int u[2]) { u[0] = 0; u[1] = 1; }         \
        static __device__ __forceinline__ void run(const uint8_t* b, int, Task& t) { decode2_a2<F>(b, t); } \
    };
DECODE2_A2(FmtQ4_0)
DECODE2_A2(FmtIQ4_NL)
DECODE2_A2(FmtQ5_0)
DECODE2_A2(FmtQ8_0)
template <> struct Decode2<FmtQ4_K> {
    static __device__ __forceinline__ void units(int k, int u[2]) { u[0] = 2 * k; u[1] = 2 * k + 1; }
    static __device__ __forceinline__ void run(const uint8_t* b, int k, Task& t) { decode2_q4_k(b, k, t); }
};
template <> struct Decode2<FmtQ5_K> {
    static __device__ __forceinline__ void units(int k, int u[2]) { u[0] = 2 * k; u[1] = 2 * k + 1; }
    static __device__ __forceinline__ void run(const uint8_t* b, int k, Task& t) { decode2_q5_k(b, k, t); }
};
template <> struct Decode2<FmtQ6_K> {
    static __device__ __forceinline__ void units(int k, int u[2]) {
        u[0] = 4 * (k >> 1) + (k & 1);
        u[1] = u[0] + 2;
    }
    static __device__ __forceinline__ void run(const uint8_t* b, int k, Task& t) { decode2_q6_k(b, k, t); }
};
template <> struct Decode2<FmtQ2_K> {
    static __device__ __forceinline__ void units(int k, int u[2]) {
        u[0] = 4 * (k >> 1) + 2 * (k & 1);
        u[1] = u[0] + 1;
    }
    static __device__ __forceinline__ void run(const uint8_t* b, int k, Task& t) { decode2_q2_k(b, k, t); }
};
template <> struct Decode2<FmtQ3_K> {
    static __device__ __forceinline__ void units(int k, int u[2]) {
        u[0] = 4 * (k >> 1) + 2 * (k & 1);
        u[1] = u[0] + 1;
    }
    static __device__ __forceinline__ void run(const uint8_t* b, int k, Task& t) { decode2_q3_k(b, k, t); }
};
template <> struct Decode2<FmtIQ4_XS> {
    static __device__ __forceinline__ void units(int k, int u[2]) { u[0] = 2 * k; u[1] = 2 * k + 1; }
    static __device__ __forceinline__ void run(const uint8_t* b, int k, Task& t) { decode2_iq4_xs(b, k, t); }
};
