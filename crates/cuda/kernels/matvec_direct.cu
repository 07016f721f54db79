// matvec_direct.cu — one- to four-token Q4_K / IQ4_XS / Q4_0 (and, opt-in, Q6_K) segment products
// y (+)= W x (+ bias) with the weights loaded straight into registers (REDLINE_MV_DIRECT; host:
// crates/cuda/src/matvec.rs matvec_segments). Same launch, parameters and results contract as
// matvec_quant.cu's mvm_ segment kernels (x: q8_1 from quantize_q8_1, natural or tiled; W:
// segments in GGUF block layout; y: [n_tokens, nrows] f32 per segment, bias, accumulate).
#include "matvec_common.cuh"
#include "quant_formats.cuh"

// Why: matvec_quant.cu's staged kernels are issue bound at one token (547 warp instructions a
// 4-row group iteration, 0.12 per weight byte for Q4_K; IQ4_XS ~0.23; BENCHMARKS.md sessions 11,
// 19): every weight byte is loaded, stored to shared memory and loaded again, and the decode's
// addresses come from run-time offsets into the staging buffers. Q4_K super-blocks are 144 =
// 9 x 16 bytes and IQ4_XS ones 136 = 17 x 8, so in rows of whole super-blocks each starts 16-
// (8-) byte aligned and a lane can load its share of the weights into the registers it computes
// from.
//
// A warp's iteration: 4 consecutive super-blocks of each of its R rows; lanes 8s .. 8s + 7 own
// super-block s, each loading the super-block's header (the 8 lanes load one address) and its
// own 16 bytes of quants (the format's policy, MvdQ4K / MvdIQ4XS below, says which and how they
// decode). Every address is a pointer advanced by a constant: x's too, since within a 512-value
// tile a lane's pieces keep their place in every iteration, tiled q8_1 or not. Two iterations
// are in flight (registers, unrolled by two: the second's loads take immediate offsets), and a
// row's last 1-3 super-blocks, where its width is not a multiple of 1024, in one partial
// iteration after them. n_tokens <= NT tokens (1, 2, or 4 at 1-2 rows; 3-4 tokens for the
// launches crate::matvec::direct_applies names), the per-row decode shared by the tokens, the
// per-token arithmetic the same at every count (so a row's result does not depend on the token
// count).

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

// Q4_K's and Q4_0's dot of a lane's 16 quant bytes with its 32 x values: the low nibbles with
// x values 0..15 (s0), the high ones left in place (16 x their value) with 16..31 (s1).
static __device__ __forceinline__ void mvd_nibble_dots(const uint32_t (&lo)[4], const uint32_t (&hi)[4], const u32x4& a,
                                                       const u32x4& b, int& s0, int& s1) {
    const uint32_t xa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
    s0 = 0;
    s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s0 = dp4a_us(lo[i], (int)xa[i], s0);
        s1 = dp4a_us(hi[i], (int)xb[i], s1);
    }
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
    static __device__ __forceinline__ void load_w(const uint8_t* ph, const uint8_t* pq, const C&, W& w) {
        w.hd = mvd_ld_w16(ph);
        w.q = mvd_ld_w16(pq);
    }
    // the same bytes from the warp's staged copy in shared memory (mvd_rows' ST)
    static __device__ __forceinline__ void load_ws(const uint8_t* ph, const uint8_t* pq, const C&, W& w) {
        w.hd = *(const u32x4*)ph;
        w.q = *(const u32x4*)pq;
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
        int s0, s1;
        mvd_nibble_dots(r.lo, r.hi, x.a, x.b, s0, s1);
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
    static __device__ __forceinline__ void load_w(const uint8_t* ph, const uint8_t* pq, const C&, W& w) {
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

// Q4_0 (session 28): a "super-block" is 8 blocks of 18 bytes (d f16, 16 qs bytes: elements 0..15
// in the low nibbles, 16..31 in the high ones, each minus 8), 144 bytes = 9 x 16, so in rows of
// whole 256-value groups each group starts 16-byte aligned (row_bytes = 144 per 256 values).
// Lane v = lane % 8 of a group takes block v, bytes [18 v, 18 v + 18): 4-byte aligned at
// 18 v - 2 (v % 2), five word loads (L1-cached: the lanes' words share sectors, and the
// staged kernels' loss to these was their shared-memory round trip, not DRAM) cover it; the
// scale is the low or high half of the first word, the quants the words funnel-shifted by 16
// (even v) or 32 (odd v: the next word) bits. x as IQ4_XS (the unit's 32 values, two 16-byte
// loads) with the unit's (d, d * sum q): W x = d_w (d_x sum(n q) - 8 d_x sum q), the high
// nibbles left in place (16 x their value, as Q4_K's) and d_x / 16 applied to 16 s_lo + s_hi
// (exact integers).
struct MvdQ4_0 {
    static constexpr int SB = 144;
    struct W {
        uint32_t w[5];
    };
    struct X {
        u32x4 a, b;   // the unit's x values 0..15 and 16..31
        float d16, s; // q8_1 d / 16, d * sum q
    };
    struct D {
        float d;
        uint32_t lo[4], hi[4];
    };
    struct C {
        uint32_t shd, shq;  // the scale's bit position in the first word; the quants' funnel shift
    };
    static __device__ __forceinline__ C consts(int lane) {
        C c;
        c.shd = 16 * (lane & 1);
        c.shq = 16 + 16 * (lane & 1);
        mvd_pin(c.shd);
        mvd_pin(c.shq);
        return c;
    }
    static __device__ __forceinline__ int qofs(int lane) { return 18 * (lane & 7) - 2 * (lane & 1); }
    static __device__ __forceinline__ int xe0(int lane) { return 256 * (lane >> 3) + 32 * (lane & 7); }
    static __device__ __forceinline__ int xe1(int lane) { return xe0(lane) + 16; }
    static __device__ __forceinline__ int xd(int lane) { return 2 * (8 * (lane >> 3) + (lane & 7)); }
    static __device__ __forceinline__ void load_w(const uint8_t*, const uint8_t* pq, const C&, W& w) {
#pragma unroll
        for (int i = 0; i < 5; i++)
            asm("ld.global.nc.u32 %0, [%1];" : "=r"(w.w[i]) : "l"(pq + 4 * i));
    }
    static __device__ __forceinline__ void load_x(const int8_t* pa, const int8_t* pb, const float* pd, const C&,
                                                  X& x) {
        x.a = mvd_ld_x(pa);
        x.b = mvd_ld_x(pb);
        float d, s;
        asm("ld.global.nc.v2.f32 {%0, %1}, [%2];" : "=f"(d), "=f"(s) : "l"(pd));
        x.d16 = d * 0.0625f;
        x.s = s;
    }
    static __device__ __forceinline__ D decode(const W& w, const C& c) {
        D r;
        r.d = f16_to_f32((uint16_t)((w.w[0] >> c.shd) & 0xFFFFu));
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t q;
            asm("shf.r.clamp.b32 %0, %1, %2, %3;" : "=r"(q) : "r"(w.w[i]), "r"(w.w[i + 1]), "r"(c.shq));
            r.lo[i] = q & 0x0F0F0F0Fu;
            r.hi[i] = q & 0xF0F0F0F0u;
        }
        return r;
    }
    static __device__ __forceinline__ float dot(const D& r, const X& x, float acc) {
        int s0, s1;
        mvd_nibble_dots(r.lo, r.hi, x.a, x.b, s0, s1);
        return fmaf(r.d, fmaf(x.d16, (float)(16 * s0 + s1), -8.0f * x.s), acc);
    }
};

// Q6_K (session 33): super-blocks of 210 bytes (ql[128] the low 4 bits, qh[64] the high 2,
// scales[16] int8, d f16; x = d sc (q - 32), ggml dequantize_row_q6_K). Rows of whole
// 1024-value iterations only (4 super-blocks, 840 = 8 x 105 bytes: every row and iteration starts
// 8-byte aligned; no _t kernels), so super-block s of an iteration starts 2 (s odd) or 0 bytes
// past a 4-byte boundary. Lane v = lane % 8 of a super-block (half n = v / 4, A = (v / 2) % 2,
// h = v % 2) takes ql bytes [64 n + 32 A + 16 h, + 16): the low nibbles are elements 16 h ..
// 16 h + 15 of the half's group A, the high ones those of group A + 2 (a group: 32 values of one
// q8_1 unit); qh bytes [32 n + 16 h, + 16) carry both groups' top bits (bits 2 A and 4 + 2 A;
// the lanes of A = 0 and 1 share them). Each 16-byte run as five aligned word loads (L1-cached,
// the lanes' words share sectors) funnel-shifted by 16 bits in odd super-blocks, as Q4_0; the
// two scales (sc[8 n + 2 A + h] and + 4) as sign-extending byte loads, d as a 16-bit load. The
// 6-bit values dot unsigned (dp4a.u32.s32) with x; the - 32 comes off with the sums of the
// lane's 16 x values of each unit (per token, shared by the R rows): exact integers, as every
// product here ((q - 32) x sums of 16 times the scale stay below 2^24).
struct MvdQ6K {
    static constexpr int SB = 210;
    struct W {
        uint32_t ql[5], qh[5];
        int sc0, sc1;
        uint32_t d;
    };
    struct X {
        u32x4 a, b;       // the lane's 16 x values of the low group's unit and of the high one's
        float da, db;     // their units' q8_1 d
        int sa32, sb32;   // 32 x the sums of those 16 values
    };
    struct D {
        float d;
        int sc0, sc1;
        uint32_t lo[4], hi[4];
    };
    struct C {
        uint32_t sh;          // funnel shift of the quants (16 in odd super-blocks)
        uint32_t shl, shr;    // qh bits of the low group to bits 4-5 (<<), of the high group (>>)
        int dqh, jsc;         // qh past the lane's ql pointer; its first scale past the super-block
    };
    static __device__ __forceinline__ C consts(int lane) {
        const int v = lane & 7, n = v >> 2, A = (v >> 1) & 1, h = v & 1;
        C c;
        c.sh = 16 * ((lane >> 3) & 1);
        c.shl = 4 - 2 * A;
        c.shr = 2 * A;
        c.dqh = 128 - 32 * n - 32 * A;
        c.jsc = 192 + 8 * n + 2 * A + h;
        mvd_pin(c.sh);
        mvd_pin(c.shl);
        mvd_pin(c.shr);
        return c;
    }
    // the lane's ql bytes, from the 4-byte boundary at or before them
    static __device__ __forceinline__ int qofs(int lane) {
        const int v = lane & 7;
        return 64 * (v >> 2) + 32 * ((v >> 1) & 1) + 16 * (v & 1) - 2 * ((lane >> 3) & 1);
    }
    static __device__ __forceinline__ int xe0(int lane) {
        const int v = lane & 7;
        return 256 * (lane >> 3) + 128 * (v >> 2) + 32 * ((v >> 1) & 1) + 16 * (v & 1);
    }
    static __device__ __forceinline__ int xe1(int lane) { return xe0(lane) + 64; }
    static __device__ __forceinline__ int xd(int lane) {
        const int v = lane & 7;
        return 2 * (8 * (lane >> 3) + 4 * (v >> 2) + ((v >> 1) & 1));
    }
    static __device__ __forceinline__ void load_w(const uint8_t* ph, const uint8_t* pq, const C& c, W& w) {
        const uint8_t* ph2 = pq + c.dqh;
#pragma unroll
        for (int i = 0; i < 5; i++) {
            asm("ld.global.nc.u32 %0, [%1];" : "=r"(w.ql[i]) : "l"(pq + 4 * i));
            asm("ld.global.nc.u32 %0, [%1];" : "=r"(w.qh[i]) : "l"(ph2 + 4 * i));
        }
        const uint8_t* ps = ph + c.jsc;
        asm("ld.global.nc.s8 %0, [%1];" : "=r"(w.sc0) : "l"(ps));
        asm("ld.global.nc.s8 %0, [%1];" : "=r"(w.sc1) : "l"(ps + 4));
        asm("ld.global.nc.u16 %0, [%1];" : "=r"(w.d) : "l"(ph + 208));
    }
    static __device__ __forceinline__ void load_x(const int8_t* pa, const int8_t* pb, const float* pd, const C&,
                                                  X& x) {
        x.a = mvd_ld_x(pa);
        x.b = mvd_ld_x(pb);
        x.da = mvd_ld_xf(pd);
        x.db = mvd_ld_xf(pd + 4);
        int sa = dp4a((int)x.a.x, 0x01010101, 0);
        sa = dp4a((int)x.a.y, 0x01010101, sa);
        sa = dp4a((int)x.a.z, 0x01010101, sa);
        sa = dp4a((int)x.a.w, 0x01010101, sa);
        int sb = dp4a((int)x.b.x, 0x01010101, 0);
        sb = dp4a((int)x.b.y, 0x01010101, sb);
        sb = dp4a((int)x.b.z, 0x01010101, sb);
        sb = dp4a((int)x.b.w, 0x01010101, sb);
        x.sa32 = 32 * sa;
        x.sb32 = 32 * sb;
    }
    static __device__ __forceinline__ D decode(const W& w, const C& c) {
        D r;
        r.d = f16_to_f32((uint16_t)w.d);
        r.sc0 = w.sc0;
        r.sc1 = w.sc1;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t ql, qh;
            asm("shf.r.clamp.b32 %0, %1, %2, %3;" : "=r"(ql) : "r"(w.ql[i]), "r"(w.ql[i + 1]), "r"(c.sh));
            asm("shf.r.clamp.b32 %0, %1, %2, %3;" : "=r"(qh) : "r"(w.qh[i]), "r"(w.qh[i + 1]), "r"(c.sh));
            r.lo[i] = (ql & 0x0F0F0F0Fu) | ((qh << c.shl) & 0x30303030u);
            r.hi[i] = ((ql >> 4) & 0x0F0F0F0Fu) | ((qh >> c.shr) & 0x30303030u);
        }
        return r;
    }
    static __device__ __forceinline__ float dot(const D& r, const X& x, float acc) {
        int s0, s1;
        mvd_nibble_dots(r.lo, r.hi, x.a, x.b, s0, s1);
        const float f = fmaf(x.db, (float)((s1 - x.sb32) * r.sc1), x.da * (float)((s0 - x.sa32) * r.sc0));
        return fmaf(r.d, f, acc);
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

// One row-iteration's weights: from global memory, or (ST) from the staged copy.
template <typename F, bool ST>
static __device__ __forceinline__ void mvd_load_w(const uint8_t* ph, const uint8_t* pq, const typename F::C& c,
                                                  typename F::W& w) {
    if constexpr (ST)
        F::load_ws(ph, pq, c, w);
    else
        F::load_w(ph, pq, c, w);
}

// ST (REDLINE_MV_STAGE, sm_90, one token, Q4_K, whole 1024-value iterations): before the PDL
// wait each warp copies all of its R rows into its slice of the block's dynamic shared memory
// (MV_WARPS x R x row_bytes) with cp.async, then waits for the previous kernel, then for its
// copies, and runs the same loop on the copy (the same dots in the same order: bit for bit the
// unstaged results). Why: a 5120-row out-projection (17.7 MB: 134 KB an SM, 640 blocks in one
// wave of 660 places) is bound by its ramp and loads in flight after the wait, not by DRAM
// (session 34: 10.3 µs a call even when fed from L2); staged, all of its bytes can land while
// the chain in front of it runs (with REDLINE_PDL_EARLY, launched as that chain starts), and
// after the wait it reads only shared memory.
// acc[r][t]: this lane's partial dot products of rows [row0, row0 + R) (rows past nrows are
// computed on the last row) with the q8_1 x of n_tokens <= NT tokens. ncols % 1024 == 0, or with
// TAIL any multiple of 256 (whole super-blocks: a last, partial iteration of 1-3 super-blocks
// runs after the loop, its idle lanes on zero weights and x, which add exactly 0). PDL: the
// first iteration's weights are loaded before the wait, x after it.
template <typename F, int NT, int R, bool TAIL, bool ST = false>
static __device__ __forceinline__ void mvd_rows(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                                const float* __restrict__ xds, int nrows, int ncols,
                                                long long row_bytes, int n_tokens, int load_mode, int row0,
                                                float (&acc)[R][NT]) {
    static_assert(!ST || !TAIL, "staged rows are whole iterations");
    TRACE_SCOPE(TRACE_MVD);
    constexpr int IT = 4 * F::SB;  // weight bytes of a row-iteration
    const bool tiled = (load_mode & 256) != 0;
    const int lane = threadIdx.x, nit = ncols / 1024, tail = (ncols % 1024) / 256;
    const typename F::C c = F::consts(lane);
    const uint8_t* ph[R];
    const uint8_t* pq[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint8_t* row = W + (long long)min(row0 + r, nrows - 1) * row_bytes;
        if constexpr (ST) {
            extern __shared__ __align__(16) uint8_t mvd_stage[];
            uint8_t* dst = mvd_stage + ((long long)threadIdx.y * R + r) * row_bytes;
            for (int o = 16 * lane; o < row_bytes; o += 16 * 32) cp_async16(dst + o, row + o);
            row = dst;
        }
        ph[r] = mvd_pin(row + (lane >> 3) * F::SB);
        pq[r] = mvd_pin(ph[r] + F::qofs(lane));
    }
    if constexpr (ST) cp_async_commit();
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
    if (!ST && (!TAIL || nit > 0)) {
#pragma unroll
        for (int r = 0; r < R; r++) F::load_w(ph[r], pq[r], c, wa[r]);
    }
    pdl_wait();
    TRACE_WAITED(TRACE_MVD);
    pdl_trigger();
    if constexpr (ST) {
        // every lane's copies, then the warp's (the copy of a row is spread over its lanes)
        cp_async_wait<0>();
        __syncwarp();
#pragma unroll
        for (int r = 0; r < R; r++) F::load_ws(ph[r], pq[r], c, wa[r]);
    }
    // XJ (two tokens): x is loaded just before its dot, not an iteration ahead like the weights.
    // x is an L1/L2 hit, and one buffer of two tokens' x instead of two frees 22 registers: 5
    // blocks an SM instead of 4 (H100, session 27: the 27B's two-token down projection 28.1 ->
    // 21.8 µs at 2 rows, the same as one token; its verify pass of 2 rows 9.39 / 9.51 -> 9.29 /
    // 9.18 ms; two streams +2.7 %). One token keeps x an iteration ahead (session 28: just in
    // time there lost 0.2-1.2 %), and so do three and four (session 29: just in time there took
    // the 2-row kernel from 167 registers to 128 and lost, 5120 x 17408 at 3 tokens 30.2 -> 35.7
    // µs: four tokens' x loads in the dependent chain before each dot).
    constexpr bool XJ = NT == 2;
    if (!XJ && (!TAIL || nit > 0)) mvd_load_x<F, NT, 0, 0>(pa, pb, pd, ncols, n_tokens, c, xa);
    for (int it = 0; it < nit; it += 2) {
        const bool second = it + 1 < nit;
        if (second) {
#pragma unroll
            for (int r = 0; r < R; r++) mvd_load_w<F, ST>(ph[r] + IT, pq[r] + IT, c, wb[r]);
            if (!XJ) mvd_load_x<F, NT, 1024, 64>(pa, pb, pd, ncols, n_tokens, c, xb);
        }
        if (XJ) mvd_load_x<F, NT, 0, 0>(pa, pb, pd, ncols, n_tokens, c, xa);
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
            for (int r = 0; r < R; r++) mvd_load_w<F, ST>(ph[r], pq[r], c, wa[r]);
            if (!XJ) mvd_load_x<F, NT, 0, 0>(pa, pb, pd, ncols, n_tokens, c, xa);
        }
        if (XJ) {
            mvd_load_x<F, NT, -1024, -64>(pa, pb, pd, ncols, n_tokens, c, xb);
            mvd_dot<F, NT, R>(wb, xb, c, acc);
        } else {
            mvd_dot<F, NT, R>(wb, xb, c, acc);
        }
    }
    if (TAIL && tail > 0) {
        // addresses from scratch (the loop's pointers end with the loop: kept live past it,
        // they cost the loop ~40 instructions an iteration in rematerialized values), wa / xa
        // again, zeros for the idle lanes
#pragma unroll
        for (int r = 0; r < R; r++) wa[r] = typename F::W{};
#pragma unroll
        for (int t = 0; t < NT; t++) xa[t] = typename F::X{};
        if ((lane >> 3) < tail) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint8_t* h = W + (long long)min(row0 + r, nrows - 1) * row_bytes + (long long)nit * IT +
                                   (lane >> 3) * F::SB;
                F::load_w(h, h + F::qofs(lane), c, wa[r]);
            }
            const long long x0 = 1024LL * nit;
            mvd_load_x<F, NT, 0, 0>(xq + x0 + q8_1_at(F::xe0(lane), tiled), xq + x0 + q8_1_at(F::xe1(lane), tiled),
                                    xds + x0 / 16 + F::xd(lane), ncols, n_tokens, c, xa);
        }
        mvd_dot<F, NT, R>(wa, xa, c, acc);
    }
}

// ---- 3-4 tokens with x held a group of G tokens at a time (session 31; REDLINE_MV_DIRECT_XG) ------
//
// Why: mvd_rows holds x of all NT tokens for two iterations (11 registers a token for Q4_K: 88 at
// four tokens), which is most of the 167 registers of mvd_q4_k_n4_r2 (ncu, session 30: 18.75 %
// occupancy, 0.50 eligible warps a scheduler, long scoreboard the main stall). Here an
// iteration decodes its R rows' weights once (13 registers a row for Q4_K) and then runs the
// tokens in groups of G, each group's x loaded while the group before it computes, the next
// iteration's first group while the last one does: x of 2 G tokens live instead of 2 NT, the
// weights still an iteration ahead. Session 29's x "just in time" (every token's x loaded
// right before its dots: 128 registers, and slower) had no x in flight during any dot; here one
// group always is. Same dots in the same order per (row, token) as mvd_rows: bit-identical
// results.

// x of tokens [t0, t0 + G) within NT (token t at + t * ncols values, + t * ncols / 16 floats;
// clamped to n_tokens - 1), zeros where not `live`.
template <typename F, int NT, int G>
static __device__ __forceinline__ void mvd_load_xg(const int8_t* pa, const int8_t* pb, const float* pd, int ncols,
                                                   int n_tokens, int t0, bool live, const typename F::C& c,
                                                   typename F::X (&x)[G]) {
#pragma unroll
    for (int g = 0; g < G; g++) {
        x[g] = typename F::X{};
        if (t0 + g < NT && live) {
            const long long tt = min(t0 + g, n_tokens - 1);
            F::load_x(pa + tt * ncols, pb + tt * ncols, pd + tt * (ncols / 16), c, x[g]);
        }
    }
}

// One iteration: the R rows of w decoded once, then the tokens by groups. x: group 0's x (of the
// iteration at pa / pb / pd) on entry; on exit, if `next`, group 0 of the iteration after it
// (1024 values on). `live`: whether this lane's x exists (false for the idle lanes of a partial
// last iteration: its later groups stay zeros).
template <typename F, int NT, int R, int G>
static __device__ __forceinline__ void mvd_dot_xg(const typename F::W (&w)[R], typename F::X (&x)[G],
                                                  const int8_t* pa, const int8_t* pb, const float* pd, int ncols,
                                                  int n_tokens, bool next, bool live, const typename F::C& c,
                                                  float (&acc)[R][NT]) {
    typename F::D d[R];
#pragma unroll
    for (int r = 0; r < R; r++) d[r] = F::decode(w[r], c);
#pragma unroll
    for (int t0 = 0; t0 < NT; t0 += G) {
        typename F::X xn[G];
        if (t0 + G < NT)
            mvd_load_xg<F, NT, G>(pa, pb, pd, ncols, n_tokens, t0 + G, live, c, xn);
        else
            mvd_load_xg<F, NT, G>(pa + 1024, pb + 1024, pd + 64, ncols, n_tokens, 0, next && live, c, xn);
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (t0 + g < NT) {
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][t0 + g] = F::dot(d[r], x[g], acc[r][t0 + g]);
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) x[g] = xn[g];
    }
}

// As mvd_rows (same contract, results bit for bit), x held G tokens at a time.
template <typename F, int NT, int R, int G, bool TAIL>
static __device__ __forceinline__ void mvd_rows_xg(const uint8_t* __restrict__ W, const int8_t* __restrict__ xq,
                                                   const float* __restrict__ xds, int nrows, int ncols,
                                                   long long row_bytes, int n_tokens, int load_mode, int row0,
                                                   float (&acc)[R][NT]) {
    constexpr int IT = 4 * F::SB;
    const bool tiled = (load_mode & 256) != 0;
    const int lane = threadIdx.x, nit = ncols / 1024, tail = (ncols % 1024) / 256;
    const typename F::C c = F::consts(lane);
    const uint8_t* ph[R];
    const uint8_t* pq[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        ph[r] = mvd_pin(W + (long long)min(row0 + r, nrows - 1) * row_bytes + (lane >> 3) * F::SB);
        pq[r] = mvd_pin(ph[r] + F::qofs(lane));
    }
    const int8_t* pa = mvd_pin(xq + q8_1_at(F::xe0(lane), tiled));
    const int8_t* pb = mvd_pin(xq + q8_1_at(F::xe1(lane), tiled));
    const float* pd = mvd_pin(xds + F::xd(lane));
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    typename F::W wa[R], wb[R];
    typename F::X x[G];
    if (!TAIL || nit > 0) {
#pragma unroll
        for (int r = 0; r < R; r++) F::load_w(ph[r], pq[r], c, wa[r]);
    }
    pdl_wait();
    pdl_trigger();
    if (!TAIL || nit > 0) mvd_load_xg<F, NT, G>(pa, pb, pd, ncols, n_tokens, 0, true, c, x);
    for (int it = 0; it < nit; it += 2) {
        const bool second = it + 1 < nit;
        if (second) {
#pragma unroll
            for (int r = 0; r < R; r++) F::load_w(ph[r] + IT, pq[r] + IT, c, wb[r]);
        }
        mvd_dot_xg<F, NT, R, G>(wa, x, pa, pb, pd, ncols, n_tokens, second, true, c, acc);
        if (!second) break;
#pragma unroll
        for (int r = 0; r < R; r++) {
            ph[r] += 2 * IT;
            pq[r] += 2 * IT;
        }
        pa += 2048;
        pb += 2048;
        pd += 128;
        const bool third = it + 2 < nit;
        if (third) {
#pragma unroll
            for (int r = 0; r < R; r++) F::load_w(ph[r], pq[r], c, wa[r]);
        }
        mvd_dot_xg<F, NT, R, G>(wb, x, pa - 1024, pb - 1024, pd - 64, ncols, n_tokens, third, true, c, acc);
    }
    if (TAIL && tail > 0) {
        // as mvd_rows: addresses from scratch, zeros for the idle lanes
        const bool live = (lane >> 3) < tail;
#pragma unroll
        for (int r = 0; r < R; r++) wa[r] = typename F::W{};
        if (live) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint8_t* h = W + (long long)min(row0 + r, nrows - 1) * row_bytes + (long long)nit * IT +
                                   (lane >> 3) * F::SB;
                F::load_w(h, h + F::qofs(lane), c, wa[r]);
            }
        }
        const long long x0 = 1024LL * nit;
        const int8_t* ta = xq + x0 + q8_1_at(F::xe0(lane), tiled);
        const int8_t* tb = xq + x0 + q8_1_at(F::xe1(lane), tiled);
        const float* td = xds + x0 / 16 + F::xd(lane);
        mvd_load_xg<F, NT, G>(ta, tb, td, ncols, n_tokens, 0, live, c, x);
        mvd_dot_xg<F, NT, R, G>(wa, x, ta, tb, td, ncols, n_tokens, false, live, c, acc);
    }
}

// Resident blocks per SM a kernel is compiled for (a register cap; 0: the compiler's choice).
// Two tokens at 2 rows a warp: 94 registers with x loaded just before each dot (XJ below),
// capped so the compiler keeps it there: 5 blocks an SM, as at one token (125 registers and 4
// blocks with x double-buffered like the weights; capped to 5 that way it spilled 72 bytes).
template <typename F, int NT, int R> struct MvdMinBlocks { static constexpr int value = 0; };
template <> struct MvdMinBlocks<MvdQ4K, 2, 2> { static constexpr int value = 5; };
// Segment kernel (as mvm_quant): MV_WARPS warps of R rows each per block.
// G: 0, x of every token held (mvd_rows), else G tokens at a time (mvd_rows_xg).
template <typename F, int NT, int R, bool TAIL, int G = 0, bool ST = false>
static __device__ __forceinline__ void mvd_segments(const MvSegs& p, const int8_t* __restrict__ xq,
                                                    const float* __restrict__ xds, int n_tokens, int load_mode) {
    const MvSegSel sel = mv_select(p);
    const int lane = threadIdx.x;
    const int row0 = (((int)blockIdx.x - sel.block0) * MV_WARPS + threadIdx.y) * R;
    if (row0 >= sel.nrows) return;
    if (sel.bias && lane == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(sel.bias + row0));
    float acc[R][NT];
    if constexpr (G == 0)
        mvd_rows<F, NT, R, TAIL, ST>(sel.W, xq, xds, sel.nrows, p.ncols, p.row_bytes, n_tokens, load_mode, row0,
                                     acc);
    else
        mvd_rows_xg<F, NT, R, G, TAIL>(sel.W, xq, xds, sel.nrows, p.ncols, p.row_bytes, n_tokens, load_mode, row0,
                                       acc);
    mv_seg_store<NT, R>(sel, row0, acc, n_tokens, lane);
}

// ---- one token, groups handed out by a queue (REDLINE_MV_QUEUE; sessions 38-39) ------------------
//
// Why: the block-timeline trace (session 36, H100, 27B) showed the 4352 blocks of a gate/up
// product (6.6 waves of 660 places) finishing in bursts: a wave's blocks start together and end
// together, so every ~6 µs all warps of the card ramp up at once and the weight stream stalls.
// Session 36's persistent kernels (each warp a fixed list of groups; taken out in session 39)
// removed the ramps but lost 5-8 %: the slowest SM's warps ended up to 10 µs after the others.
// Here the grid is the card's resident blocks and a warp's first group of R rows is its own
// (block x MV_WARPS + warp, so nothing is asked of the queue before the weights are asked for,
// before the PDL wait); every later group is a ticket drawn from one of nk counters in global
// memory (each on its own line: warp v's is v % nk, and counter k hands out groups nwarps + k,
// + 2k, ...), drawn at the store of the group before the one that needs it, so its round trip
// hides behind a whole group's iterations. Why nk counters: with one, session 39's window
// measured the 27B 12.5 % slower (17 408 tickets a gate / up launch on one address); with 16,
// 2.2 % slower than one block a group (so opt-in). A warp whose ticket is past the last group
// ends; the last warp of the launch to end puts the counters back to zero (each counter's line
// counts its warps ended, line MVQ_LINES the lines done), so the next launch on this slot starts
// from zero. Tickets are drawn after
// the PDL wait only: every launch before this one has then ended, its resets done. Groups are
// numbered over the segments' rows in order (a segment's last group may be short: its rows past
// nrows computed on the last row and not stored, as mvd_rows does), the same dots in the same
// order per row and the same store: bit for bit mvd_rows' results. Whole 1024-value iterations.
template <typename F, int R>
static __device__ __forceinline__ void mvd_groups(const MvSegs& p, const int8_t* __restrict__ xq,
                                                  const float* __restrict__ xds, int load_mode,
                                                  unsigned int* __restrict__ q) {
    TRACE_SCOPE(TRACE_MVD);
    constexpr int IT = 4 * F::SB;
    const bool tiled = (load_mode & 256) != 0;
    const int lane = threadIdx.x, nit = p.ncols / 1024;
    const typename F::C c = F::consts(lane);
    const long long rb = p.row_bytes;
    const int nwarps = (int)gridDim.x * MV_WARPS;
    // the queue's counters (load_mode bits 16-21, 1..MVQ_LINES, and no more than the warps, so
    // every counter has warps drawing from it): a warp draws from counter v % nk of its first
    // group v, and counter k's n-th ticket is group nwarps + k + n * nk
    const int nk = min(min(max((load_mode >> 16) & 63, 1), MVQ_LINES), nwarps);
    int ng = 0;
#pragma unroll
    for (int s = 0; s < MV_MAX_SEGS; s++)
        if (s < p.n_segs) ng += (p.seg[s].nrows + R - 1) / R;
    // group g's segment and its first row there
    auto group_at = [&](int g, MvSegSel& sel) -> int {
        sel = mv_select_at(p, 0);
        int row0 = g * R;
#pragma unroll
        for (int s = 0; s < MV_MAX_SEGS; s++) {
            if (s + 1 < MV_MAX_SEGS && s + 1 < p.n_segs && row0 >= ((p.seg[s].nrows + R - 1) / R) * R) {
                row0 -= ((p.seg[s].nrows + R - 1) / R) * R;
                const MvSeg& n = p.seg[s + 1];
                sel = MvSegSel{n.W, n.y, n.bias, n.nrows, n.block0, n.accumulate};
            } else {
                break;
            }
        }
        return row0;
    };
    auto rows_at = [&](int g, const uint8_t* (&h)[R]) {
        MvSegSel sel;
        const int row0 = group_at(g, sel);
#pragma unroll
        for (int r = 0; r < R; r++)
            h[r] = sel.W + (long long)min(row0 + r, sel.nrows - 1) * rb + (lane >> 3) * F::SB;
    };
    // the store of group g's rows
    auto store = [&](int g, float (&acc)[R][1]) {
        MvSegSel sel;
        const int row0 = group_at(g, sel);
        mv_seg_store<1, R>(sel, row0, acc, 1, lane);
    };
    int v = (int)blockIdx.x * MV_WARPS + (int)threadIdx.y;
    const int kc = v % nk;
    unsigned int* const qc = q + 32 * kc;
    // a warp that ends counts itself on its counter's line (word 1; kw warps draw from counter
    // kc), the last of a line counts the line on line MVQ_LINES, and the warp that completes the
    // last line puts every counter back to zero. Two levels: one counter of all the warps ends
    // took ~2 640 same-address atomics into a launch's last microseconds.
    auto finish = [&]() {
        const int kw = nwarps / nk + (kc < nwarps % nk ? 1 : 0);
        bool last = false;
        if (lane == 0 && atomicAdd(qc + 1, 1u) == (unsigned int)kw - 1)
            last = atomicAdd(q + 32 * MVQ_LINES, 1u) == (unsigned int)nk - 1;
        if (__shfl_sync(0xffffffffu, (int)last, 0)) {
            if (lane < nk) {
                atomicExch(q + 32 * lane, 0u);
                atomicExch(q + 32 * lane + 1, 0u);
            }
            if (lane == 0) atomicExch(q + 32 * MVQ_LINES, 0u);
        }
    };
    const int8_t* pa0 = xq + q8_1_at(F::xe0(lane), tiled);
    const int8_t* pb0 = xq + q8_1_at(F::xe1(lane), tiled);
    const float* pd0 = xds + F::xd(lane);
    int it = 0;
    const uint8_t* ph[R];
    typename F::W wa[R], wb[R];
    typename F::X xa[1], xb[1];
    if (v < ng) {
        rows_at(v, ph);
#pragma unroll
        for (int r = 0; r < R; r++) F::load_w(ph[r], ph[r] + F::qofs(lane), c, wa[r]);
    }
    pdl_wait();
    TRACE_WAITED(TRACE_MVD);
    pdl_trigger();
    if (v >= ng) {
        finish();
        return;
    }
    // the ticket of the group after this one (lane 0's register until it is needed)
    unsigned int tk = 0;
    if (lane == 0) tk = atomicAdd(qc, 1u);
    mvd_load_x<F, 1, 0, 0>(pa0, pb0, pd0, p.ncols, 1, c, xa);
    float acc[R][1];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = 0.0f;
    auto step = [&](typename F::W(&wc)[R], typename F::X(&xc)[1], typename F::W(&wn)[R],
                    typename F::X(&xn)[1]) -> bool {
        const bool last = it + 1 == nit;
        int nv = v;
        if (last) {
            nv = nwarps + kc + nk * (int)__shfl_sync(0xffffffffu, tk, 0);
            if (nv >= ng) nv = -1;
        }
        const int nx = last ? 0 : it + 1;
        if (nv >= 0) {
            if (last) {
                rows_at(nv, ph);
            } else {
#pragma unroll
                for (int r = 0; r < R; r++) ph[r] += IT;
            }
#pragma unroll
            for (int r = 0; r < R; r++) F::load_w(ph[r], ph[r] + F::qofs(lane), c, wn[r]);
            mvd_load_x<F, 1, 0, 0>(pa0 + 1024LL * nx, pb0 + 1024LL * nx, pd0 + 64LL * nx, p.ncols, 1, c, xn);
        }
        mvd_dot<F, 1, R>(wc, xc, c, acc);
        if (last) {
            if (nv >= 0 && lane == 0) tk = atomicAdd(qc, 1u);
            store(v, acc);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][0] = 0.0f;
        }
        v = nv;
        it = nx;
        return nv >= 0;
    };
    while (step(wa, xa, wb, xb) && step(wb, xb, wa, xa)) {
    }
    finish();
}

// mvd_<fmt>_n<NT>_r<R>: rows of a multiple of 1024 values; mvd_<fmt>_n<NT>_r<R>_t: any whole
// number of super-blocks (the partial last iteration compiled in: its code alone took the
// one-token Q4_K 4-row kernel from 128 registers to 155, and capped at 128 it spilled and its
// loop grew by 10 %, so the whole-iteration kernels do without it).
#define MVD_KERNEL(name, F, NT, R)                                                                      \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, (MvdMinBlocks<F, NT, R>::value))      \
        mvd_##name##_n##NT##_r##R(const MvSegs p, const int8_t* __restrict__ xq,                      \
                                  const float* __restrict__ xds, int n_tokens, int load_mode) {        \
        mvd_segments<F, NT, R, false>(p, xq, xds, n_tokens, load_mode);                                \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, (MvdMinBlocks<F, NT, R>::value))      \
        mvd_##name##_n##NT##_r##R##_t(const MvSegs p, const int8_t* __restrict__ xq,                  \
                                      const float* __restrict__ xds, int n_tokens, int load_mode) {    \
        mvd_segments<F, NT, R, true>(p, xq, xds, n_tokens, load_mode);                                 \
    }
#define MVD_FORMAT(name, F)                                                                             \
    MVD_KERNEL(name, F, 1, 1) MVD_KERNEL(name, F, 1, 2) MVD_KERNEL(name, F, 1, 4)                       \
    MVD_KERNEL(name, F, 2, 1) MVD_KERNEL(name, F, 2, 2) MVD_KERNEL(name, F, 2, 4)                       \
    MVD_KERNEL(name, F, 3, 1) MVD_KERNEL(name, F, 3, 2)                                               \
    MVD_KERNEL(name, F, 4, 1) MVD_KERNEL(name, F, 4, 2)
MVD_FORMAT(q4_k, MvdQ4K)
MVD_FORMAT(iq4_xs, MvdIQ4XS)
MVD_FORMAT(q4_0, MvdQ4_0)

// mvd_q4_k_n1_r<R>_s: one token, the rows staged in shared memory before the PDL wait (ST in
// mvd_rows; REDLINE_MV_STAGE). Dynamic shared memory: MV_WARPS x R x row_bytes.
#define MVD_KERNEL_STAGED(name, F, R)                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                        \
        mvd_##name##_n1_r##R##_s(const MvSegs p, const int8_t* __restrict__ xq,                       \
                                 const float* __restrict__ xds, int n_tokens, int load_mode) {         \
        mvd_segments<F, 1, R, false, 0, true>(p, xq, xds, n_tokens, load_mode);                        \
    }
MVD_KERNEL_STAGED(q4_k, MvdQ4K, 1)
MVD_KERNEL_STAGED(q4_k, MvdQ4K, 2)
MVD_KERNEL_STAGED(q4_k, MvdQ4K, 4)

// mvd_<fmt>_n1_r<R>_q: one token, groups from a queue (mvd_groups; the host's REDLINE_MV_QUEUE).
// q: this launch's counters (MVQ_LINES + 1 lines; zero on entry, zero again at the end); load_mode bits
// 16-21: how many of them hand out tickets.
#define MVD_KERNEL_QUEUE(name, F, R)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS)                                        \
        mvd_##name##_n1_r##R##_q(const MvSegs p, const int8_t* __restrict__ xq,                       \
                                 const float* __restrict__ xds, int n_tokens, int load_mode,           \
                                 unsigned int* __restrict__ q) {                                       \
        mvd_groups<F, R>(p, xq, xds, load_mode, q);                                                    \
    }
MVD_KERNEL_QUEUE(q4_k, MvdQ4K, 1)
MVD_KERNEL_QUEUE(q4_k, MvdQ4K, 2)
MVD_KERNEL_QUEUE(iq4_xs, MvdIQ4XS, 2)
MVD_KERNEL_QUEUE(q4_0, MvdQ4_0, 2)
// Q6_K (the host's REDLINE_MV_DIRECT_Q6K): a down projection's 5120 rows of 17408-27648 values
// are one wave of the staged kernel's 320 blocks, 2-3 an SM, and its blocks end up to 7.6 µs
// apart (session 37's trace): one or two rows a warp from the queue instead.
MVD_KERNEL_QUEUE(q6_k, MvdQ6K, 1)
MVD_KERNEL_QUEUE(q6_k, MvdQ6K, 2)

// Q6_K: whole 1024-value iterations only (MvdQ6K), so no _t kernels.
#define MVD_KERNEL_WHOLE(name, F, NT, R)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, (MvdMinBlocks<F, NT, R>::value))      \
        mvd_##name##_n##NT##_r##R(const MvSegs p, const int8_t* __restrict__ xq,                      \
                                  const float* __restrict__ xds, int n_tokens, int load_mode) {        \
        mvd_segments<F, NT, R, false>(p, xq, xds, n_tokens, load_mode);                                \
    }
MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 1, 1) MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 1, 2) MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 1, 4)
MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 2, 1) MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 2, 2) MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 2, 4)
MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 3, 1) MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 3, 2)
MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 4, 1) MVD_KERNEL_WHOLE(q6_k, MvdQ6K, 4, 2)

// mvd_q4_k_n<NT>_r<R>_g<G>[_t]: the 3-4-token Q4_K kernels with x held G tokens at a time
// (mvd_rows_xg; the host's REDLINE_MV_DIRECT_XG). 2 rows a warp are held to 4 blocks an SM (128
// registers; ptxas, sm_90, NVRTC 13.0): uncapped they took 128-140, so the 4-token ones 3 blocks
// as mvd_q4_k_n4_r2's 167, the loads of later groups hoisted; the live state is ~100 (2 rows'
// decoded weights 26, the next iteration's 16, two tokens' x 22, the sums 8, addresses 14), and
// held to 5 blocks (96) they spilled 128-280 bytes. One row a warp: 72-94 uncapped, 6-7 blocks.
template <int R> struct MvdMinBlocksXG { static constexpr int value = R == 2 ? 4 : 0; };
#define MVD_KERNEL_XG(name, F, NT, R, G)                                                                \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, MvdMinBlocksXG<R>::value)             \
        mvd_##name##_n##NT##_r##R##_g##G(const MvSegs p, const int8_t* __restrict__ xq,               \
                                         const float* __restrict__ xds, int n_tokens, int load_mode) { \
        mvd_segments<F, NT, R, false, G>(p, xq, xds, n_tokens, load_mode);                             \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * MV_WARPS, MvdMinBlocksXG<R>::value)             \
        mvd_##name##_n##NT##_r##R##_g##G##_t(const MvSegs p, const int8_t* __restrict__ xq,           \
                                             const float* __restrict__ xds, int n_tokens,             \
                                             int load_mode) {                                          \
        mvd_segments<F, NT, R, true, G>(p, xq, xds, n_tokens, load_mode);                              \
    }
#define MVD_XG(name, F, G)                                                                              \
    MVD_KERNEL_XG(name, F, 3, 1, G) MVD_KERNEL_XG(name, F, 3, 2, G)                                     \
    MVD_KERNEL_XG(name, F, 4, 1, G) MVD_KERNEL_XG(name, F, 4, 2, G)
MVD_XG(q4_k, MvdQ4K, 1)
MVD_XG(q4_k, MvdQ4K, 2)
