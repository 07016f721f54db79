// flash_attn.cu — attention over the KV cache: decode split over the KV length with all query
// heads of a GQA group sharing each K/V load (fa_decode_*), and flash-style prefill on tensor
// cores with no n x n matrix in memory (fa_prefill_*). Host side: crates/cuda/src/attention.rs.
//
// Cache (crates/cuda/src/backend/sequence.rs): K and V of one layer of one sequence are
// [n_ctx][n_kv_head * head_dim] position rows in the cache type: f32, f16, or ggml's
// block_q8_0 {f16 d; int8 qs[32]} / block_q4_0 {f16 d; uint8 qs[16]} (ggml-common.h; q4_0
// element i < 16 is the low nibble of qs[i], element i >= 16 the high nibble of qs[i - 16],
// value d * (nibble - 8)). Blocks are 34 / 18 bytes, so only 2-byte aligned: quant bytes are
// read with 2-byte loads; f16/f32 rows with 16-byte loads.
//
// Launch row i is batch row rows[i] at absolute position pos[i]; it attends cache positions
// 0..=pos[i] (its own K/V were stored before the launch). q: [*, n_head * dk] f32,
// out: [*, n_head * dv] f32, head h reads KV head h / (n_head / n_kv_head). Lengths are read
// on the device, so a launch shape never depends on them (CUDA graphs replay it at any depth).
//
// Tensor cores: the PTX `wmma` m16n16k16 f16 instructions (sm_70+), f32 accumulation, written
// as inline asm because NVRTC runs here without the CUDA headers (no <mma.h>).
#include "common.cuh"

#define FA_F32 0
#define FA_F16 1
#define FA_Q8_0 2
#define FA_Q4_0 3

// ---- cache loads: 8 consecutive values per unit --------------------------------------------

// Raw bytes of 8 consecutive cache values, loaded first so a thread has all its loads of a
// tile in flight before it decodes any. F32 uses w[0..8), F16 w[0..4), q8_0/q4_0 w[0..2) (8
// quant bytes) and w[2] (the block scale).
struct Raw8 {
    uint32_t w[8];
};

// Values e..e+7 (e % 8 == 0, element index within the position row) of the row at `row`.
template <int TYPE>
static __device__ __forceinline__ Raw8 kv_raw8(const uint8_t* __restrict__ row, long long e) {
    Raw8 r;
    if (TYPE == FA_F32) {
        const uint4 a = *(const uint4*)(row + 4 * e);
        const uint4 b = *(const uint4*)(row + 4 * e + 16);
        r.w[0] = a.x; r.w[1] = a.y; r.w[2] = a.z; r.w[3] = a.w;
        r.w[4] = b.x; r.w[5] = b.y; r.w[6] = b.z; r.w[7] = b.w;
    } else if (TYPE == FA_F16) {
        const uint4 a = *(const uint4*)(row + 2 * e);
        r.w[0] = a.x; r.w[1] = a.y; r.w[2] = a.z; r.w[3] = a.w;
    } else if (TYPE == FA_Q8_0) {
        const uint8_t* b = row + (e / 32) * 34;
        const int j = (int)(e & 31);
        r.w[0] = ld_u32_a2(b + 2 + j);
        r.w[1] = ld_u32_a2(b + 6 + j);
        r.w[2] = ld_u16(b);
    } else {
        const uint8_t* b = row + (e / 32) * 18;
        const int j = (int)(e & 15);
        r.w[0] = ld_u32_a2(b + 2 + j);
        r.w[1] = ld_u32_a2(b + 6 + j);
        r.w[2] = ld_u16(b);
    }
    return r;
}

// Decodes a Raw8 of values e..e+7 into f32.
template <int TYPE>
static __device__ __forceinline__ void kv_decode8(const Raw8& r, long long e, float v[8]) {
    if (TYPE == FA_F32) {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = __uint_as_float(r.w[k]);
    } else if (TYPE == FA_F16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = f16_to_f32((uint16_t)(r.w[k] & 0xFFFF));
            v[2 * k + 1] = f16_to_f32((uint16_t)(r.w[k] >> 16));
        }
    } else if (TYPE == FA_Q8_0) {
        const float d = f16_to_f32((uint16_t)r.w[2]);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = d * (float)(int8_t)((r.w[k / 4] >> (8 * (k % 4))) & 0xFF);
    } else {
        const float d = f16_to_f32((uint16_t)r.w[2]);
        const int sh = (e & 16) ? 4 : 0;
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = d * (float)((int)((r.w[k / 4] >> (8 * (k % 4) + sh)) & 0xF) - 8);
    }
}

static __device__ __forceinline__ uint32_t pack_f16x2(float a, float b) {
    return (uint32_t)f32_to_f16(a) | ((uint32_t)f32_to_f16(b) << 16);
}

// ---- decode: split-KV, GQA group per block --------------------------------------------------

#define FD_THREADS 128

// Launch row blockIdx.z's caches: kc / vc for every row, or with kvp non-null (the rows of
// several sequences in one launch) K at kvp[2 i] and V at kvp[2 i + 1]. The pointer table is
// written by the host before the launch (no wait needed before reading it).
#define FD_ROW_CACHES(kvp, kc, vc)                                    \
    if (kvp) {                                                        \
        kc = (const uint8_t*)kvp[2 * blockIdx.z];                     \
        vc = (const uint8_t*)kvp[2 * blockIdx.z + 1];                 \
    }
// float4 accumulators per thread: G * dv / 4 <= FD_THREADS * FD_MAX_ITEMS (host-checked).
#define FD_MAX_ITEMS 8

// Loads positions p0..p0+tl-1 of one head (elements e0.. of each position row) of K and V as
// f32 into k_s [T][ldk] and v_s [T][ldv]. Units of 8 values; 4 K + 4 V loads in flight per
// thread per round.
template <int TYPE>
static __device__ __forceinline__ void fd_load_tile(const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                                                    long long kpb, long long vpb, long long ek, long long ev, int dk,
                                                    int dv, int p0, int tl, float* k_s, int ldk, float* v_s, int ldv) {
    const int uk = dk / 8, uv = dv / 8;
    const int nk = tl * uk, nv = tl * uv;
    const int n = max(nk, nv);
    for (int u0 = threadIdx.x; u0 < n; u0 += 4 * FD_THREADS) {
        Raw8 rk[4], rv[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int u = u0 + k * FD_THREADS;
            if (u < nk) rk[k] = kv_raw8<TYPE>(kc + (long long)(p0 + u / uk) * kpb, ek + (u % uk) * 8);
            if (u < nv) rv[k] = kv_raw8<TYPE>(vc + (long long)(p0 + u / uv) * vpb, ev + (u % uv) * 8);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int u = u0 + k * FD_THREADS;
            float x[8];
            if (u < nk) {
                kv_decode8<TYPE>(rk[k], ek + (u % uk) * 8, x);
                float4* o = (float4*)(k_s + (u / uk) * ldk + (u % uk) * 8);
                o[0] = make_float4(x[0], x[1], x[2], x[3]);
                o[1] = make_float4(x[4], x[5], x[6], x[7]);
            }
            if (u < nv) {
                kv_decode8<TYPE>(rv[k], ev + (u % uv) * 8, x);
                float4* o = (float4*)(v_s + (u / uv) * ldv + (u % uv) * 8);
                o[0] = make_float4(x[0], x[1], x[2], x[3]);
                o[1] = make_float4(x[4], x[5], x[6], x[7]);
            }
        }
    }
}

// grid (S, n_kv_head, n_rows), block FD_THREADS, dynamic shared memory
// 4 * (G*dk + T*(dk+4) + T*(dv+4) + G*T + 3*G) bytes (attention.rs: decode_smem_bytes).
// Block (s, kvh, i): row i, the G query heads of KV head kvh, tiles of T positions; the
// row's tiles are dealt to the S splits in equal contiguous runs (a split past the end
// writes an empty partial). Per tile: K and V to shared f32 (each byte read once for all G
// heads), scores G x T, an online softmax per head, then acc[g][:] += p V.
// S == 1: the normalized result goes to out; else (max, sum, acc[dv]) to
// part[((i * n_head + h) * S + s) * (dv + 2)] for fa_merge.
template <int TYPE>
static __device__ void flash_decode(const float* __restrict__ q, const int* __restrict__ rows,
                                    const int* __restrict__ pos, const uint8_t* __restrict__ kc,
                                    const uint8_t* __restrict__ vc, float* __restrict__ out, float* __restrict__ part,
                                    int n_head, int n_kv_head, int dk, int dv, long long kpb, long long vpb,
                                    float scale, int T) {
    extern __shared__ __align__(16) float fd_smem[];
    const int G = n_head / n_kv_head;
    const int s = blockIdx.x, S = gridDim.x, kvh = blockIdx.y, i = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int ldk = dk + 4, ldv = dv + 4;  // rows 4 words off a multiple of 32: float4 reads of 8 rows hit 32 banks
    float* q_s = fd_smem;        // [G][dk], times scale
    float* k_s = q_s + G * dk;   // [T][ldk]
    float* v_s = k_s + T * ldk;  // [T][ldv]
    float* p_s = v_s + T * ldv;  // [G][T] scores, then probabilities
    float* m_s = p_s + G * T;    // [G] running max
    float* l_s = m_s + G;        // [G] running sum
    float* c_s = l_s + G;        // [G] this tile's correction exp(m_old - m_new)

    const int r = rows[i];
    const int len = pos[i] + 1;
    const int n_tiles = (len + T - 1) / T;
    const int per = (n_tiles + S - 1) / S;
    const int t_begin = s * per, t_end = min(n_tiles, t_begin + per);
    const int h0 = kvh * G;
    const float* qr = q + (long long)r * n_head * dk + (long long)h0 * dk;
    for (int e = tid; e < G * dk; e += FD_THREADS) q_s[e] = qr[e] * scale;
    for (int g = tid; g < G; g += FD_THREADS) {
        m_s[g] = NEG_INF;
        l_s[g] = 0.0f;
    }
    const int dv4 = dv / 4;
    const int n_items = G * dv4;
    float4 acc[FD_MAX_ITEMS];
#pragma unroll
    for (int k = 0; k < FD_MAX_ITEMS; k++) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();

    for (int tile = t_begin; tile < t_end; tile++) {
        const int p0 = tile * T;
        const int tl = min(T, len - p0);
        fd_load_tile<TYPE>(kc, vc, kpb, vpb, (long long)kvh * dk, (long long)kvh * dv, dk, dv, p0, tl, k_s, ldk, v_s,
                           ldv);
        __syncthreads();
        for (int it = tid; it < G * T; it += FD_THREADS) {
            const int g = it / T, t = it - g * T;
            float sc = NEG_INF;
            if (t < tl) {
                const float4* qa = (const float4*)(q_s + g * dk);
                const float4* ka = (const float4*)(k_s + t * ldk);
                float a = 0.0f;
                for (int c = 0; c < dk / 4; c++) {
                    const float4 x = qa[c], y = ka[c];
                    a += x.x * y.x + x.y * y.y + x.z * y.z + x.w * y.w;
                }
                sc = a;
            }
            p_s[it] = sc;
        }
        __syncthreads();
        for (int g = warp; g < G; g += FD_THREADS / 32) {
            float mx = NEG_INF;
            for (int t = lane; t < tl; t += 32) mx = fmaxf(mx, p_s[g * T + t]);
            mx = warp_max(mx);
            const float m_old = m_s[g];
            const float m_new = fmaxf(m_old, mx);  // finite: the tile has a position
            float sum = 0.0f;
            for (int t = lane; t < T; t += 32) {
                const float p = t < tl ? expf(p_s[g * T + t] - m_new) : 0.0f;
                p_s[g * T + t] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float c = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
                c_s[g] = c;
                l_s[g] = l_s[g] * c + sum;
                m_s[g] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < FD_MAX_ITEMS; k++) {
            const int it = tid + k * FD_THREADS;
            if (it < n_items) {
                const int g = it / dv4, c = it - g * dv4;
                const float cr = c_s[g];
                float4 a = acc[k];
                a.x *= cr;
                a.y *= cr;
                a.z *= cr;
                a.w *= cr;
                const float* pg = p_s + g * T;
                for (int t = 0; t < tl; t++) {
                    const float p = pg[t];
                    const float4 v = *(const float4*)(v_s + t * ldv + 4 * c);
                    a.x += p * v.x;
                    a.y += p * v.y;
                    a.z += p * v.z;
                    a.w += p * v.w;
                }
                acc[k] = a;
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int k = 0; k < FD_MAX_ITEMS; k++) {
        const int it = tid + k * FD_THREADS;
        if (it >= n_items) continue;
        const int g = it / dv4, c = it - g * dv4;
        const float4 a = acc[k];
        if (S == 1) {
            const float inv = 1.0f / l_s[g];
            *(float4*)(out + (long long)r * n_head * dv + (long long)(h0 + g) * dv + 4 * c) =
                make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
        } else {
            float* pp = part + (((long long)i * n_head + h0 + g) * S + s) * (dv + 2);
            pp[2 + 4 * c] = a.x;
            pp[3 + 4 * c] = a.y;
            pp[4 + 4 * c] = a.z;
            pp[5 + 4 * c] = a.w;
        }
    }
    if (S > 1) {
        for (int g = tid; g < G; g += FD_THREADS) {
            float* pp = part + (((long long)i * n_head + h0 + g) * S + s) * (dv + 2);
            pp[0] = m_s[g];
            pp[1] = l_s[g];
        }
    }
}

#define FA_DECODE(NAME, TYPE)                                                                                      \
    extern "C" __global__ void __launch_bounds__(FD_THREADS)                                                       \
        NAME(const float* __restrict__ q, const int* __restrict__ rows, const int* __restrict__ pos,                \
             const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc, float* __restrict__ out,              \
             float* __restrict__ part, int n_head, int n_kv_head, int dk, int dv, long long kpb, long long vpb,     \
             float scale, int T, const unsigned long long* __restrict__ kvp) {                                     \
        pdl_wait();                                                                                                \
        pdl_trigger();                                                                                             \
        FD_ROW_CACHES(kvp, kc, vc);                                                                                \
        flash_decode<TYPE>(q, rows, pos, kc, vc, out, part, n_head, n_kv_head, dk, dv, kpb, vpb, scale, T);        \
    }
FA_DECODE(fa_decode_f32, FA_F32)
FA_DECODE(fa_decode_f16, FA_F16)
FA_DECODE(fa_decode_q8_0, FA_Q8_0)
FA_DECODE(fa_decode_q4_0, FA_Q4_0)

// Decode for head sizes D = dk = dv in {64, 128, 256} and up to FD_MAX_G query heads per block
// (a KV head's group of G heads is cut into n_sub blocks along grid.y, ceil(G / FD_MAX_G) unless
// the host asks for more): the same
// grid, partials and merge as flash_decode, but no tiles and no block barrier per tile. A
// split takes an even share of the row's positions (ceil(len / S), so at depth 4096 every one
// of 64 splits has ~65 positions instead of 43 splits of three 32-position tiles), cut into
// chunks of NP positions dealt round-robin to the four warps. Each warp walks its chunks with
// its own online softmax and keeps FD_STAGES chunks of K and V in flight in its own ring of
// shared memory (f16: on sm_80+ an f16 cache is copied by cp.async, without registers; quant
// caches and sm_70 load through registers and convert), so a split's bytes are requested up
// front rather than one tile per four barriers. The warps' (max, sum, acc) meet once at the end.
// Scores: lane (t, part) = (lane / LP, lane % LP) dots UL 16-byte units of K row t with every
// head's q (f32 in shared memory, times scale * log2 e so exp is one ex2), and the LP lanes of a
// row meet by shuffles. P V: lane owns DL = D / 32 contiguous columns of every head and walks
// the chunk's positions, probabilities broadcast from shared memory. The block's heads are
// padded to a body of GM heads (flash_decode_heads) with q = 0.
#define FD_MAX_G 8
#define FD_WARPS (FD_THREADS / 32)
#define FD_STAGES 2

template <int D>
struct FdShape {
    static constexpr int UPR = D / 8;           // 16-byte f16 units of a head's row
    // Positions per chunk (2 KB of f16 K + V for D >= 128; FD_STAGES of them in flight per warp
    // fill the host's shared memory). Smaller chunks deeper in flight (4 and 2 positions, 4
    // stages) measured within noise on the H200: 32B-shape tg at depth 4096 +0.2 %, 27B +1.2 %,
    // both about -1 % at depth 0.
    static constexpr int NP = D > 128 ? 4 : 8;
    static constexpr int LP = 32 / NP;          // lanes per position in the scores
    static constexpr int UL = UPR / LP;         // units per lane in the scores
    static constexpr int DL = D / 32;           // columns per lane in P V
    static constexpr int NU = NP * UPR / 32;    // units of K (and of V) a lane loads per chunk
    static constexpr int STAGE = NP * UPR;      // uint4 of K (or V) in one ring stage
    static constexpr int RING = FD_STAGES * 2 * STAGE;  // uint4 of a warp's ring [stage][K, V][NP][UPR]
    // Dynamic shared memory the host gives a block (attention.rs: decode_d_smem_bytes, sized
    // for its tile T) and what this kernel lays out in it: q [FD_MAX_G][2][UPR] float4, the
    // warps' rings, probabilities [FD_WARPS][NP][8], (max, sum) [2][FD_WARPS][FD_MAX_G] f32 and
    // the fused chain's scratch [FX] f32 (flash_decode_d: RoPE angles, norm weights, new K head,
    // norm factors; the rings are already loading while it is in use).
    static constexpr int T = D > 128 ? 16 : 32;
    static constexpr int FX = 4 * D + FD_MAX_G + 1;
    static constexpr int HOST_BYTES =
        4 * (FD_MAX_G * D + 2 * T * (D + 16) + FD_MAX_G * T + 3 * FD_MAX_G + 4 * D + 16);
    static constexpr int BYTES =
        4 * FD_MAX_G * D + 16 * FD_WARPS * RING + 4 * FD_WARPS * NP * 8 + 4 * 2 * FD_WARPS * FD_MAX_G + 4 * FX;
    static_assert(BYTES <= HOST_BYTES, "decode layout exceeds the host's shared memory");
    static_assert(4 * FD_MAX_G * D <= 16 * RING, "a warp's P V sums fit in its ring");
    static_assert(NU * 32 == NP * UPR && UL * LP == UPR, "chunk units divide among lanes");
    static_assert(((32 / UPR) * LP) % 8 == 0, "a lane's chunk rows share one K swizzle (fd_slot)");
};

// K units are stored XOR-swizzled so the 8 lanes of a 16-byte shared-memory phase (LP = 4: two
// rows, four parts) read 8 different bank groups.
template <int D>
static __device__ __forceinline__ int fd_slot(int t, int u) {
    return t * FdShape<D>::UPR + (u ^ ((t * FdShape<D>::LP) & 7));
}


// Two f16 (low half first) to f32.
static __device__ __forceinline__ float2 fd_h2(uint32_t h) {
    float2 f;
    asm("{.reg .f16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\tcvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;\n\t}"
        : "=f"(f.x), "=f"(f.y)
        : "r"(h));
    return f;
}

// 2^x (ex2.approx: 2 ulp; 2^-inf = 0).
static __device__ __forceinline__ float fd_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <int TYPE>
static __device__ __forceinline__ uint4 fd_f16x8(const Raw8& r, long long e) {
    if (TYPE == FA_F16) return make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
    float x[8];
    kv_decode8<TYPE>(r, e, x);
    return make_uint4(pack_f16x2(x[0], x[1]), pack_f16x2(x[2], x[3]), pack_f16x2(x[4], x[5]), pack_f16x2(x[6], x[7]));
}

// Positions p0.. of one head of K and V into a ring stage as f16, this lane's share: 16-byte
// unit u = lane % UPR (elements el = head offset + 8u of a row) of rows tr + RW * k, k < NU,
// with tr = lane / UPR and RW = 32 / UPR rows per warp-wide load; units with RW * k >= nt
// (rows past the chunk's n) are left alone. kr / vr: the cache at row tr; ks / vs: this lane's
// first unit in the stage (K swizzled by fd_slot: the same XOR for all of a lane's rows).
template <int D, int TYPE>
static __device__ __forceinline__ void fd_load_chunk(const uint8_t* kr, const uint8_t* vr,
                                                     long long kpb, long long vpb, long long el, int p0, int nt,
                                                     uint4* ks, uint4* vs) {
    using Sh = FdShape<D>;
    constexpr int RW = 32 / Sh::UPR;
    kr += p0 * kpb;
    vr += p0 * vpb;
#if __CUDA_ARCH__ >= 800
    constexpr bool ASYNC = TYPE == FA_F16;
#else
    constexpr bool ASYNC = false;
#endif
    if constexpr (ASYNC) {
        unsigned long long sk, sv;
        asm("cvta.to.shared.u64 %0, %1;" : "=l"(sk) : "l"(ks));
        asm("cvta.to.shared.u64 %0, %1;" : "=l"(sv) : "l"(vs));
#pragma unroll
        for (int k = 0; k < Sh::NU; k++) {
            if (RW * k < nt) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)sk + 16 * RW * Sh::UPR * k),
                             "l"(kr + RW * k * kpb + 2 * el)
                             : "memory");
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)sv + 16 * RW * Sh::UPR * k),
                             "l"(vr + RW * k * vpb + 2 * el)
                             : "memory");
            }
        }
    } else {
        Raw8 rk[Sh::NU], rv[Sh::NU];
#pragma unroll
        for (int k = 0; k < Sh::NU; k++) {
            if (RW * k < nt) {
                rk[k] = kv_raw8<TYPE>(kr + RW * k * kpb, el);
                rv[k] = kv_raw8<TYPE>(vr + RW * k * vpb, el);
            }
        }
#pragma unroll
        for (int k = 0; k < Sh::NU; k++) {
            if (RW * k < nt) {
                ks[RW * Sh::UPR * k] = fd_f16x8<TYPE>(rk[k], el);
                vs[RW * Sh::UPR * k] = fd_f16x8<TYPE>(rv[k], el);
            }
        }
    }
}

// The inputs of the fused decode chain (fa_decode_fused_*; host: attention.rs
// launch_decode_fused). Every launch row is the one new token of its sequence.
struct FdFuse {
    const float* k;        // [*, n_kv_head * D]: the rows' new K, before norm and RoPE
    const float* v;        // [*, n_kv_head * D]: their new V
    const float* qn;       // per-head RMS norm weights of q [D], or null
    const float* kn;       // of k, or null
    const float* factors;  // RoPE frequency divisors [n_rot / 2], or null
    const int* rpos;       // each launch row's RoPE position
    int q_stride;          // floats from one query head to the next in a q row (D, or 2D with a gate)
    int gate_off;          // the gate's offset within a head's stride, or -1
    int n_rot, neox;
    float freq_base, freq_scale, eps;
    int8_t* xq;            // the q8_1 copy of out for the product after (one split writing), or null
    float* xds;
    float4* rc;            // RoPE angles of these parameters [D / 2] (rpos + 1 as int bits, cos, sin), or null
};

// f32 loads through L2 (partials other blocks of the same launch wrote).
static __device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
static __device__ __forceinline__ float2 ld_cg2(const float* p) {
    float2 v;
    asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
    return v;
}

#define FA_MAX_SPLITS 64
// Column pairs a merge thread has in flight at once.
#define FM_BATCH 32

// Merges the S <= FA_MAX_SPLITS partials (max, sum, acc[dv]) of one (row, head) at `base`
// (row stride dv + 2) into o[0, dv), each value times sigmoid(gate[d]) when gate is not null;
// called by all 128 threads of a block (fa_merge, fa_merge_active).
// Splits with sum 0 had no positions: weight 0 (their partials are finite zeros). The sums: for
// dv <= 256, thread (pair c, group j) of 128 / (dv / 2) groups adds column pair c of splits j,
// j + groups, ...; its first FM_BATCH loads go out before the (max, sum) reduction, so at depth
// 4096 (64 splits) a head's merge waits for about one L2 round trip instead of one per 8 splits.
// xq / xds (or null): the q8_1 copy of o too (common.cuh; o's values sit at xq + i0, its units
// at xds + 2 (i0 / 32); dv a multiple of 64, so the pair writers are whole warps).
static __device__ __forceinline__ void fa_merge_head(const float* base, int S, int dv, float* o,
                                                     const float* gate, int8_t* xq = nullptr,
                                                     float* xds = nullptr, long long i0 = 0) {
    __shared__ float w_s[FA_MAX_SPLITS];
    __shared__ float red_s[2][4];
    __shared__ float2 sum_s[128];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const long long ld = dv + 2;
    const int np = dv / 2;  // dv is a multiple of 8
    const bool pairs = np <= 128;
    const int ng = pairs ? 128 / np : 1, c = tid % np, j = tid / np;
    __syncthreads();  // a previous head's reads of the shared arrays are done
    float2 v[FM_BATCH];
    if (pairs) {
#pragma unroll
        for (int k = 0; k < FM_BATCH; k++) {
            const int s = j + k * ng;
            v[k] = j < ng && s < S ? ld_cg2(base + s * ld + 2 + 2 * c) : make_float2(0.0f, 0.0f);
        }
    }
    float m = NEG_INF, l = 0.0f;
    if (tid < S) {
        l = ld_cg(base + tid * ld + 1);
        if (l > 0.0f) m = ld_cg(base + tid * ld);
    }
    const float wm = warp_max(m);
    if (lane == 0) red_s[0][warp] = wm;
    __syncthreads();
    const float M = fmaxf(fmaxf(red_s[0][0], red_s[0][1]), fmaxf(red_s[0][2], red_s[0][3]));
    const float w = l > 0.0f ? expf(m - M) : 0.0f;
    if (tid < S) w_s[tid] = w;
    const float wl = warp_sum(w * l);
    if (lane == 0) red_s[1][warp] = wl;
    __syncthreads();
    const float inv = 1.0f / (red_s[1][0] + red_s[1][1] + red_s[1][2] + red_s[1][3]);
    if (!pairs) {
        for (int d = tid; d < dv; d += blockDim.x) {
            float a = 0.0f;
#pragma unroll 8
            for (int s = 0; s < S; s++) a += w_s[s] * ld_cg(base + s * ld + 2 + d);
            float r = a * inv;
            if (gate) r *= sigmoid_f(gate[d]);
            o[d] = r;
        }
        return;
    }
    float2 a = make_float2(0.0f, 0.0f);
    for (int s0 = 0;; s0 += FM_BATCH * ng) {
#pragma unroll
        for (int k = 0; k < FM_BATCH; k++) {
            const int s = j + s0 + k * ng;
            if (s < S) {
                a.x += w_s[s] * v[k].x;
                a.y += w_s[s] * v[k].y;
            }
        }
        if (s0 + FM_BATCH * ng >= S) break;
#pragma unroll
        for (int k = 0; k < FM_BATCH; k++) {
            const int s = j + s0 + FM_BATCH * ng + k * ng;
            v[k] = j < ng && s < S ? ld_cg2(base + s * ld + 2 + 2 * c) : make_float2(0.0f, 0.0f);
        }
    }
    sum_s[tid] = a;
    __syncthreads();
    if (tid < np) {
        float2 t = make_float2(0.0f, 0.0f);
        for (int g = 0; g < ng; g++) {
            t.x += sum_s[g * np + tid].x;
            t.y += sum_s[g * np + tid].y;
        }
        float2 r = make_float2(t.x * inv, t.y * inv);
        if (gate) {
            r.x *= sigmoid_f(gate[2 * tid]);
            r.y *= sigmoid_f(gate[2 * tid + 1]);
        }
        *(float2*)(o + 2 * tid) = r;
        if (xq) q8_1_unit_pairs(r.x, r.y, xq, xds, i0 + 2 * tid, (i0 + 2 * tid) / 32);
    }
}

// grid (S, n_kv_head * n_sub, n_rows) (n_sub: flash_decode_heads), block FD_THREADS, dynamic
// shared memory FdShape<D>::HOST_BYTES. Block (s, kvh * n_sub + sub, i): row i, heads h0..h0+gb-1
// of KV head kvh (gb <= GM), positions [s * per, (s + 1) * per) of 0..pos[i] with per = ceil(len / S).
// S == 1: the normalized result to out; else (max, sum, acc[D]) to part as flash_decode.
//
// Splits take at least min_per positions (per = max(ceil(len / S), min_per)), so a short
// context has few active splits: splits past the end exit at once, and with one active split
// its block writes the result itself, else the active splits' partials go to fa_merge_active.
//
// FUSE (f16 caches; fa_decode_fused_*): q is the projection output as it comes (heads fz.q_stride
// apart, unnormed, unroped) and the newest position's K/V are not in the cache yet. Each block
// RMS-norms and rotates its query heads itself; the block whose split holds the newest position
// also norms and rotates the new K row and stores it and the V row (f16) before it reads the
// cache (several blocks of one KV head may store the same bytes). The arithmetic is
// mo_group_rms_norm's (one element per thread), mo_rope_qk's and mo_kv_store2's, and the
// splits are the non-fused launch's, so fused and separate ops give the same bits. The chain
// rope, store, decode (and for a gate, mul_sigmoid) is one launch, plus the merge where the
// context needs splits.
template <int D, int TYPE, int GM, bool FUSE>
static __device__ __forceinline__ void flash_decode_d(const float* __restrict__ q, const int* __restrict__ rows,
                                                      const int* __restrict__ pos, const uint8_t* kc,
                                                      const uint8_t* vc, float* __restrict__ out,
                                                      float* __restrict__ part, int n_head, int n_kv_head, int kvh,
                                                      int h0, int gb, long long kpb, long long vpb, float scale,
                                                      int min_per, const FdFuse& fz) {
    TRACE_SCOPE(TRACE_FA);
    using Sh = FdShape<D>;
    constexpr int NP = Sh::NP, LP = Sh::LP, UPR = Sh::UPR, DL = Sh::DL;
    extern __shared__ __align__(16) float fd_smem[];
    float4* q_s = (float4*)fd_smem;                             // [FD_MAX_G][2][UPR]: dims 8u + 4h..
    uint4* rings = (uint4*)(fd_smem + FD_MAX_G * D);             // [FD_WARPS][RING]
    float* p_all = (float*)(rings + FD_WARPS * Sh::RING);        // [FD_WARPS][NP][8]
    float* ml_s = p_all + FD_WARPS * NP * 8;                     // [2][FD_WARPS][FD_MAX_G]
    float* fx_s = ml_s + 2 * FD_WARPS * FD_MAX_G;                // [FX]: FUSE's scratch
    const int s = blockIdx.x, S = gridDim.x, i = blockIdx.z;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    // FUSE: what the pre-wait section reads besides rows / pos, asked for with them: the RoPE
    // position, this thread's angle-cache entry (pair tid) and its norm weights (registers
    // until the scratch below is laid out)
    constexpr int NWR = (D + FD_THREADS - 1) / FD_THREADS;
    int rpi = 0;
    float4 rce = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float qn_r[NWR], kn_r[NWR];
    if constexpr (FUSE) {
        rpi = fz.rpos[i];
        // through L2 (.cg): other blocks' and launches' stores
        if (fz.rc && tid < fz.n_rot / 2)
            asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(rce.x), "=f"(rce.y), "=f"(rce.z), "=f"(rce.w)
                         : "l"(fz.rc + tid));
#pragma unroll
        for (int u = 0; u < NWR; u++) {
            const int d = tid + u * FD_THREADS;
            qn_r[u] = fz.qn && d < D ? fz.qn[d] : 0.0f;
            kn_r[u] = fz.kn && d < D ? fz.kn[d] : 0.0f;
        }
    }
    const int r = rows[i];
    const int len = pos[i] + 1;
    const int per = max((len + S - 1) / S, min_per);
    const int p_lo = min(len, s * per), p_hi = min(len, p_lo + per);
    const int s_active = (len + per - 1) / per;  // splits with positions
    if (s >= s_active) return;                   // fa_merge_active reads only the active ones
    const long long ek = (long long)kvh * D;  // the head's first element in a cache row
    const int n_chunks = (p_hi - p_lo + NP - 1) / NP;
    uint4* ring = rings + warp * Sh::RING;
    // this lane's share of every chunk load (fd_load_chunk)
    const int tr = lane / UPR, ur = lane % UPR;
    const uint8_t* kr = kc + tr * kpb;
    const uint8_t* vr = vc + tr * vpb;
    const long long el = ek + 8 * ur;
    uint4* ks0 = ring + fd_slot<D>(tr, ur);
    uint4* vs0 = ring + Sh::STAGE + tr * UPR + ur;
    // The warps' first FD_STAGES chunks into their rings: FUSE before the wait, all rows but the
    // newest (this block stores that one itself after the wait and writes it into its ring
    // slot too); the other rows come from earlier steps, positions from the host. Without FUSE
    // the kernel before this one stores the launch's rows: after the wait (below).
    auto load_stages = [&](int hi) {
#pragma unroll 1
        for (int st = 0; st < FD_STAGES; st++) {
            const int c = warp + FD_WARPS * st;
            if (c < n_chunks) {
                const int p0 = p_lo + c * NP;
                fd_load_chunk<D, TYPE>(kr, vr, kpb, vpb, el, p0, min(NP, hi - p0) - tr, ks0 + 2 * st * Sh::STAGE,
                                       vs0 + 2 * st * Sh::STAGE);
            }
            cp_async_commit();
        }
    };
    if constexpr (FUSE) load_stages(min(p_hi, len - 1));
    {
        // This split's later cached K/V rows (all but the newest, which the kernel before this
        // one stores, or with FUSE this one) toward L2 before the wait (REDLINE_PDL): the
        // positions come from the host and the rows from earlier steps. A head's slice of a row
        // is pos_bytes / n_kv_head. With FUSE the first stages are loading already.
        const int q_hi = min(p_hi, len - 1);
        const int q_lo = FUSE ? min(q_hi, p_lo + FD_WARPS * FD_STAGES * NP) : p_lo;
        const long long kh = kpb / n_kv_head, vh = vpb / n_kv_head;
        const int kl = (int)((kh + 127) / 128), vl = (int)((vh + 127) / 128);
        for (int e = tid; e < (q_hi - q_lo) * (kl + vl); e += FD_THREADS) {
            const int p = q_lo + e / (kl + vl), x = e % (kl + vl);
            const uint8_t* a =
                x < kl ? kc + p * kpb + kvh * kh + 128LL * x : vc + p * vpb + kvh * vh + 128LL * (x - kl);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
        }
    }
    TRACE_MARK(TRACE_FA, 4);  // the K/V prefetches issued
    // FUSE: scratch fx_s: cos and sin of the RoPE pairs [2][D / 2], norm weights of q and k
    // [2][D], the new K head [D], norm factors; the query heads [FD_MAX_G][D] (each head's
    // values in order) in q_s's place until q_s is laid out from them.
    float* const cs_s = fx_s;
    float* const nw_s = cs_s + D;
    float* const kt_s = nw_s + 2 * D;
    float* const inv_s = kt_s + D;
    float* const qf = (float*)q_s;
    static_assert(3 * D + D + FD_MAX_G + 1 <= Sh::FX, "fused scratch fits fx_s");
    if constexpr (FUSE) {
        // (positions come from the host and norm weights are weights: all before the wait.)
        // The angles from the cache when an earlier layer of this step (the same parameters and
        // position: the key) left them there, else computed (the double-precision pow, cos and
        // sin: ~4.5 µs of one warp on the 27B, session 37's trace) and left for the next layer.
        // An entry is one 16-byte store and load, so a block reads a whole old or new entry,
        // and a key's values are the same bits whoever computed them: a stale or racing entry
        // only misses. Pairs past the block's threads (n_rot / 2 > FD_THREADS) load here.
        const float rp = (float)rpi;
        for (int j = tid; j < fz.n_rot / 2; j += FD_THREADS) {
            float4 e = rce;
            if (fz.rc && j != tid)
                asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                             : "=f"(e.x), "=f"(e.y), "=f"(e.z), "=f"(e.w)
                             : "l"(fz.rc + j));
            float c, sn;
            if (fz.rc && __float_as_int(e.x) == rpi + 1) {
                c = e.y;
                sn = e.z;
            } else {
                rope_cos_sin(rp, j, fz.n_rot, fz.freq_base, fz.freq_scale, fz.factors, c, sn);
                if (fz.rc) fz.rc[j] = make_float4(__int_as_float(rpi + 1), c, sn, 0.0f);
            }
            cs_s[j] = c;
            cs_s[D / 2 + j] = sn;
        }
        TRACE_MARK(TRACE_FA, 5);  // the RoPE angles in place
#pragma unroll
        for (int u = 0; u < NWR; u++) {
            const int d = tid + u * FD_THREADS;
            if (d < D) {
                if (fz.qn) nw_s[d] = qn_r[u];
                if (fz.kn) nw_s[D + d] = kn_r[u];
            }
        }
    }
    // (trace mark 3: the pre-wait section done; session 36: 8.9 µs from the block's start on
    // the 27B, 3.75 on the 32B, the same with its loads asked for together; marks 4 and 5 above
    // split it)
    TRACE_MARK(TRACE_FA, 3);
    pdl_enter<PDL_E_ATTN>();
    TRACE_WAITED(TRACE_FA);
    const float qs = scale * 1.44269504088896341f;  // scores in log2 units
    if constexpr (FUSE) {
        // The query heads (and, in the split that holds the newest position, its new K head):
        // raw values, per-head RMS norm, RoPE, in shared memory.
        const bool store = p_lo <= len - 1 && len - 1 < p_hi;
        const int nh = gb + (store ? 1 : 0);
        const float* qr = q + ((long long)r * n_head + h0) * fz.q_stride;
        const float* kr0 = fz.k + ((long long)r * n_kv_head + kvh) * D;
        for (int e = tid; e < nh * D; e += FD_THREADS) {
            const int g = e / D, d = e % D;
            if (g < gb)
                qf[g * D + d] = qr[(long long)g * fz.q_stride + d];
            else
                kt_s[d] = kr0[d];
        }
        __syncthreads();
        if (fz.qn || fz.kn) {  // (no norms, e.g. Qwen2.5: no sums, one barrier less)
            for (int g = warp; g < nh; g += FD_WARPS) {
                const float* x = g < gb ? qf + g * D : kt_s;
                // as block_sum over one thread per element: warp sums, then added in warp order
                float ss = 0.0f;
#pragma unroll
                for (int w = 0; w < D / 32; w++) ss += warp_sum(x[32 * w + lane] * x[32 * w + lane]);
                const bool normed = g < gb ? fz.qn != nullptr : fz.kn != nullptr;
                if (lane == 0) inv_s[g] = normed ? rsqrtf(ss / D + fz.eps) : 0.0f;
            }
            __syncthreads();
        }
        const int half = fz.n_rot / 2, per_head = half + (D - fz.n_rot);
        for (int e = tid; e < nh * per_head; e += FD_THREADS) {
            const int g = e / per_head, j = e % per_head;
            float* x = g < gb ? qf + g * D : kt_s;
            const float* w = g < gb ? nw_s : nw_s + D;
            const float sn = inv_s[g];
            const bool normed = g < gb ? fz.qn != nullptr : fz.kn != nullptr;
            // as mo_group_rms_norm, then mo_rope_qk
            auto val = [&](int d) { return normed ? x[d] * sn * w[d] : x[d]; };
            if (j < half) {
                const int i0 = fz.neox ? j : 2 * j, i1 = fz.neox ? j + half : 2 * j + 1;
                const float a = val(i0), b = val(i1), c = cs_s[j], s2 = cs_s[D / 2 + j];
                rope_rotate(a, b, c, s2, x[i0], x[i1]);
            } else {
                const int d = fz.n_rot + (j - half);
                x[d] = val(d);
            }
        }
        __syncthreads();
        if (store) {
            uint16_t* kd = (uint16_t*)(kc + (long long)(len - 1) * kpb) + (long long)kvh * D;
            uint16_t* vd = (uint16_t*)(vc + (long long)(len - 1) * vpb) + (long long)kvh * D;
            const float* vr0 = fz.v + ((long long)r * n_kv_head + kvh) * D;
            // the newest row's chunk: in a preloaded stage its ring slot gets the row here
            const int cn = (len - 1 - p_lo) / NP, tn = (len - 1 - p_lo) % NP;
            uint4* rk = cn < FD_WARPS * FD_STAGES ? rings + (cn % FD_WARPS) * Sh::RING + 2 * (cn / FD_WARPS) * Sh::STAGE
                                                   : nullptr;
            for (int d = tid; d < D; d += FD_THREADS) {
                const uint16_t kh = f32_to_f16(kt_s[d]), vh = f32_to_f16(vr0[d]);
                kd[d] = kh;
                vd[d] = vh;
                if (rk) {
                    ((uint16_t*)(rk + fd_slot<D>(tn, d / 8)))[d % 8] = kh;
                    ((uint16_t*)(rk + Sh::STAGE + tn * UPR + d / 8))[d % 8] = vh;
                }
            }
        }
        // q_s as the non-fused load lays it out: float4 e = (g, hh, u) holds dims 8u + 4hh ..,
        // in place of qf: all read, then written
        constexpr int NQS = (GM * 2 * UPR + FD_THREADS - 1) / FD_THREADS;
        float4 xs[NQS];
#pragma unroll
        for (int k = 0; k < NQS; k++) {
            const int e = tid + k * FD_THREADS;
            const int g = e / (2 * UPR), hh = (e / UPR) % 2, u = e % UPR;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (e < GM * 2 * UPR && g < gb) {
                const float* qg = qf + g * D + 8 * u + 4 * hh;
                x = make_float4(qg[0] * qs, qg[1] * qs, qg[2] * qs, qg[3] * qs);
            }
            xs[k] = x;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < NQS; k++) {
            const int e = tid + k * FD_THREADS;
            if (e < GM * 2 * UPR) q_s[e] = xs[k];
        }
        __syncthreads();  // q_s written, the newest row in its ring slot and visible to later chunk loads
    }
    float* p_w = p_all + warp * NP * 8;
    if constexpr (!FUSE) {
        load_stages(p_hi);
        const float* qr = q + ((long long)r * n_head + h0) * D;
        for (int e = tid; e < GM * 2 * UPR; e += FD_THREADS) {
            const int g = e / (2 * UPR), hh = (e / UPR) % 2, u = e % UPR;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (g < gb) {
                x = *(const float4*)(qr + g * D + 8 * u + 4 * hh);
                x = make_float4(x.x * qs, x.y * qs, x.z * qs, x.w * qs);
            }
            q_s[e] = x;
        }
        __syncthreads();
    }

    // (trace marks after the wait: 6 the query heads in place and the first loads issued, 7 warp
    // 0's positions done, 8 the warps' sums met)
    TRACE_MARK(TRACE_FA, 6);
    const int t = lane / LP, pt = lane % LP;
    float m[GM], l[GM], acc[GM][DL];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < DL; d++) acc[g][d] = 0.0f;
    }
    int k = 0;
    for (int c = warp; c < n_chunks; c += FD_WARPS, k++) {
        cp_async_wait<FD_STAGES - 1>();
        __syncwarp();
        const int st = k % FD_STAGES;
        const uint4* ks = ring + 2 * st * Sh::STAGE;
        const uint4* vs = ks + Sh::STAGE;
        const int p0 = p_lo + c * NP;
        const int n = min(NP, p_hi - p0);
        float sc[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) sc[g] = 0.0f;
        // rolled, as the P V loop below: a warp runs this body once or twice at short contexts
        // (ncu put 40 % of the stalls on instruction fetch); measured neutral on an H100, kept
        // for 10 % less code; the same FMAs in the same order
#pragma unroll 1
        for (int j = 0; j < Sh::UL; j++) {
            const int u = pt + LP * j;
            const uint4 kw = ks[fd_slot<D>(t, u)];
            const float2 k0 = fd_h2(kw.x), k1 = fd_h2(kw.y), k2 = fd_h2(kw.z), k3 = fd_h2(kw.w);
#pragma unroll
            for (int g = 0; g < GM; g++) {
                const float4 a = q_s[2 * g * UPR + u], b = q_s[(2 * g + 1) * UPR + u];
                float x = sc[g];
                x = fmaf(a.x, k0.x, x);
                x = fmaf(a.y, k0.y, x);
                x = fmaf(a.z, k1.x, x);
                x = fmaf(a.w, k1.y, x);
                x = fmaf(b.x, k2.x, x);
                x = fmaf(b.y, k2.y, x);
                x = fmaf(b.z, k3.x, x);
                x = fmaf(b.w, k3.y, x);
                sc[g] = x;
            }
        }
        float corr[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) {
#pragma unroll
            for (int o = 1; o < LP; o <<= 1) sc[g] += __shfl_xor_sync(FULL_MASK, sc[g], o);
            const float x = t < n ? sc[g] : NEG_INF;
            float mx = x;
#pragma unroll
            for (int o = LP; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
            const float mn = fmaxf(m[g], mx);  // finite: the chunk has a position
            corr[g] = fd_exp2(m[g] - mn);       // 0 on the warp's first chunk
            const float p = fd_exp2(x - mn);
            l[g] = l[g] * corr[g] + p;  // this lane's position slot; summed over slots at the end
            m[g] = mn;
            sc[g] = p;
        }
        if (pt == 0) {
#pragma unroll
            for (int g = 0; g < GM; g++) p_w[t * 8 + g] = sc[g];
        }
        __syncwarp();
#pragma unroll
        for (int g = 0; g < GM; g++)
#pragma unroll
            for (int d = 0; d < DL; d++) acc[g][d] *= corr[g];
#pragma unroll 1
        for (int tt = 0; tt < n; tt++) {
            float v[DL];
            const uint16_t* vr = (const uint16_t*)(vs + tt * UPR) + lane * DL;
            if constexpr (DL == 2) {
                const float2 a = fd_h2(*(const uint32_t*)vr);
                v[0] = a.x;
                v[1] = a.y;
            } else if constexpr (DL == 4) {
                const uint2 w = *(const uint2*)vr;
                const float2 a = fd_h2(w.x), b = fd_h2(w.y);
                v[0] = a.x;
                v[1] = a.y;
                v[2] = b.x;
                v[3] = b.y;
            } else {
                static_assert(DL == 8, "head sizes 64, 128, 256");
                const uint4 w = *(const uint4*)vr;
                const float2 a = fd_h2(w.x), b = fd_h2(w.y), c2 = fd_h2(w.z), d2 = fd_h2(w.w);
                v[0] = a.x;
                v[1] = a.y;
                v[2] = b.x;
                v[3] = b.y;
                v[4] = c2.x;
                v[5] = c2.y;
                v[6] = d2.x;
                v[7] = d2.y;
            }
            float pr[8];
            const float4 pa = *(const float4*)(p_w + tt * 8);
            pr[0] = pa.x;
            pr[1] = pa.y;
            pr[2] = pa.z;
            pr[3] = pa.w;
            if constexpr (GM > 4) {
                const float4 pb = *(const float4*)(p_w + tt * 8 + 4);
                pr[4] = pb.x;
                pr[5] = pb.y;
                pr[6] = pb.z;
                pr[7] = pb.w;
            }
#pragma unroll
            for (int g = 0; g < GM; g++)
#pragma unroll
                for (int d = 0; d < DL; d++) acc[g][d] = fmaf(pr[g], v[d], acc[g][d]);
        }
        __syncwarp();  // the stage and the probabilities are read before they are refilled
        const int cn = c + FD_WARPS * FD_STAGES;
        if (cn < n_chunks) {
            const int pn = p_lo + cn * NP;
            fd_load_chunk<D, TYPE>(kr, vr, kpb, vpb, el, pn, min(NP, p_hi - pn) - tr, ks0 + 2 * st * Sh::STAGE,
                                   vs0 + 2 * st * Sh::STAGE);
        }
        cp_async_commit();
    }
    cp_async_wait<0>();
    TRACE_MARK(TRACE_FA, 7);

    // The warps meet: each writes (max, sum) and its sums [GM][D] over its own (now idle) ring.
#pragma unroll
    for (int g = 0; g < GM; g++) {
#pragma unroll
        for (int o = LP; o < 32; o <<= 1) l[g] += __shfl_xor_sync(FULL_MASK, l[g], o);
    }
    __syncwarp();
    float* a_w = (float*)ring;
#pragma unroll
    for (int g = 0; g < GM; g++) {
#pragma unroll
        for (int d = 0; d < DL; d++) a_w[g * D + lane * DL + d] = acc[g][d];
        if (lane == 0) {
            ml_s[warp * FD_MAX_G + g] = m[g];
            ml_s[(FD_WARPS + warp) * FD_MAX_G + g] = l[g];
        }
    }
    __syncthreads();
    TRACE_MARK(TRACE_FA, 8);
    for (int e = tid; e < gb * D; e += FD_THREADS) {
        const int g = e / D, d = e % D;
        float mw[FD_WARPS], M = NEG_INF;
#pragma unroll
        for (int w = 0; w < FD_WARPS; w++) {
            mw[w] = ml_s[w * FD_MAX_G + g];
            M = fmaxf(M, mw[w]);
        }
        float L = 0.0f, a = 0.0f;
        if (M != NEG_INF) {  // else an empty split: weight 0, zero sums
#pragma unroll
            for (int w = 0; w < FD_WARPS; w++) {
                const float f = fd_exp2(mw[w] - M);  // 0 for a warp without positions
                L += f * ml_s[(FD_WARPS + w) * FD_MAX_G + g];
                a += f * ((const float*)(rings + w * Sh::RING))[g * D + d];
            }
        }
        if (s_active == 1) {
            float o = a / L;
            const long long oi = ((long long)r * n_head + h0 + g) * D + d;
            if constexpr (FUSE) {
                if (fz.gate_off >= 0) o *= sigmoid_f(q[((long long)r * n_head + h0 + g) * fz.q_stride + fz.gate_off + d]);
                // warp-uniform: gb * D and FD_THREADS are multiples of 32
                if (fz.xq) q8_1_unit(o, fz.xq, fz.xds, oi, oi / 32);
            }
            out[oi] = o;
        } else {
            float* pp = part + (((long long)i * n_head + h0 + g) * S + s) * (D + 2);
            pp[2 + d] = a;
            if (d == 0) {
                pp[0] = M * 0.69314718055994531f;  // natural-log units, as flash_decode
                pp[1] = L;
            }
        }
    }
}

// The block's gb query heads, padded to a body of GM heads: f16 caches (the common case) have
// bodies for 4, 5, 6 and 8 heads, the quant caches for 4 and 8 (each body adds compile time).
template <int D, int TYPE, bool FUSE>
static __device__ __forceinline__ void flash_decode_heads(const float* __restrict__ q, const int* __restrict__ rows,
                                                          const int* __restrict__ pos, const uint8_t* kc,
                                                          const uint8_t* vc, float* __restrict__ out,
                                                          float* __restrict__ part, int n_head, int n_kv_head,
                                                          long long kpb, long long vpb, float scale, int min_per,
                                                          int whole_from, const FdFuse& fz) {
    // grid.y = n_kv_head * n_sub, n_sub from the host (by default ceil(G / FD_MAX_G); fewer heads
    // a block with REDLINE_FA_HEADS_PER_BLOCK): a block takes ceil(G / n_sub) <= FD_MAX_G heads.
    // Each head's arithmetic is the same in every body, so the split does not change the bits.
    // whole_from > 0 (REDLINE_FA_WHOLE_GROUP_FROM): a row of at least that many positions has
    // its group in sub-block 0 alone (the others end at once), so each split's K/V are read by
    // one block (session 39: the 32B at depth 4096 +3.5 % with 5 heads a block, where 3 + 2
    // are 0.9-1.7 % faster at depth 0). pos is the host's: known before the PDL wait.
    const int G = n_head / n_kv_head, n_sub = gridDim.y / n_kv_head;
    const int kvh = blockIdx.y / n_sub, sub = blockIdx.y % n_sub;
    int gmax = (G + n_sub - 1) / n_sub;
    if (whole_from > 0 && n_sub > 1 && G <= FD_MAX_G && pos[blockIdx.z] + 1 >= whole_from) {
        if (sub != 0) return;
        gmax = G;
    }
    const int h0 = kvh * G + sub * gmax, gb = min(gmax, G - sub * gmax);
    if (gb <= 0) return;
#define FD_BODY(GM) \
    flash_decode_d<D, TYPE, GM, FUSE>(q, rows, pos, kc, vc, out, part, n_head, n_kv_head, kvh, h0, gb, kpb, vpb, scale, \
                                      min_per, fz)
    if constexpr (TYPE == FA_F16) {
        if (gb <= 4)
            FD_BODY(4);
        else if (gb == 5)
            FD_BODY(5);
        else if (gb == 6)
            FD_BODY(6);
        else
            FD_BODY(8);
    } else {
        if (gb <= 4)
            FD_BODY(4);
        else
            FD_BODY(8);
    }
#undef FD_BODY
}

// Blocks per SM: four for D <= 128 (<= 128 registers: at 64 splits x 8 KV heads, Qwen2.5-32B at
// depth 4096, the 512 blocks fit the H200's 132 SMs in one wave); three for D = 256 (<= 168
// registers, no spills; Qwen3.5-27B has 4 KV heads, 256 blocks at 64 splits).
#define FD_MIN_BLOCKS(D) ((D) > 128 ? 3 : 4)
#define FA_DECODE_D(NAME, D, TYPE)                                                                                 \
    extern "C" __global__ void __launch_bounds__(FD_THREADS, FD_MIN_BLOCKS(D))                                     \
        NAME(const float* __restrict__ q, const int* __restrict__ rows, const int* __restrict__ pos,                \
             const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc, float* __restrict__ out,              \
             float* __restrict__ part, int n_head, int n_kv_head, long long kpb, long long vpb, float scale,        \
             const unsigned long long* __restrict__ kvp, int min_per, int whole_from) {                            \
        FD_ROW_CACHES(kvp, kc, vc);                                                                                \
        flash_decode_heads<D, TYPE, false>(q, rows, pos, kc, vc, out, part, n_head, n_kv_head, kpb, vpb, scale,    \
                                           min_per, whole_from, FdFuse{});                                         \
    }
FA_DECODE_D(fa_decode_d64_f16, 64, FA_F16)
FA_DECODE_D(fa_decode_d64_q8_0, 64, FA_Q8_0)
FA_DECODE_D(fa_decode_d64_q4_0, 64, FA_Q4_0)
FA_DECODE_D(fa_decode_d128_f16, 128, FA_F16)
FA_DECODE_D(fa_decode_d128_q8_0, 128, FA_Q8_0)
FA_DECODE_D(fa_decode_d128_q4_0, 128, FA_Q4_0)
FA_DECODE_D(fa_decode_d256_f16, 256, FA_F16)
FA_DECODE_D(fa_decode_d256_q8_0, 256, FA_Q8_0)
FA_DECODE_D(fa_decode_d256_q4_0, 256, FA_Q4_0)

// The fused decode chain over an f16 cache (FUSE above): flash_decode_d's parameters plus the
// new K/V rows, the norms, RoPE and the merge counters' offset. kc / vc are written (the newest
// row), so they are not __restrict__.
#define FA_DECODE_FUSED(NAME, D)                                                                                   \
    extern "C" __global__ void __launch_bounds__(FD_THREADS, FD_MIN_BLOCKS(D))                                     \
        NAME(const float* __restrict__ q, const int* __restrict__ rows, const int* __restrict__ pos,                \
             const uint8_t* kc, const uint8_t* vc, float* __restrict__ out, float* __restrict__ part, int n_head,  \
             int n_kv_head, long long kpb, long long vpb, float scale, const unsigned long long* __restrict__ kvp,  \
             const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ qn,               \
             const float* __restrict__ kn, const float* __restrict__ factors, const int* __restrict__ rpos,         \
             int min_per, int q_stride, int gate_off, int n_rot, int neox, float freq_base, float freq_scale,       \
             float eps, int8_t* __restrict__ xq, float* __restrict__ xds, float4* __restrict__ rc, int whole_from) { \
        FD_ROW_CACHES(kvp, kc, vc);                                                                                \
        const FdFuse fz = {k,   v,     qn,   kn,        factors,    rpos, q_stride,                                \
                           gate_off, n_rot, neox, freq_base, freq_scale, eps,  xq, xds, rc};                      \
        flash_decode_heads<D, FA_F16, true>(q, rows, pos, kc, vc, out, part, n_head, n_kv_head, kpb, vpb, scale,   \
                                            min_per, whole_from, fz);                                              \
    }
FA_DECODE_FUSED(fa_decode_fused_d64, 64)
FA_DECODE_FUSED(fa_decode_fused_d128, 128)
FA_DECODE_FUSED(fa_decode_fused_d256, 256)

// grid (n_rows, n_head), block 128: the merge after an fa_decode_d* / fa_decode_fused_* launch
// of S > 1 splits. Row i's active splits (as the decode counts them: per = max(ceil(len / S),
// min_per)) merged into out, times the head's sigmoid gate (gate_off >= 0: q holds it, heads
// q_stride apart); nothing when one split was active (its block wrote out). xq / xds (or null):
// out's q8_1 copy too (dv a multiple of 64).
extern "C" __global__ void __launch_bounds__(128)
    fa_merge_active(const float* __restrict__ part, const int* __restrict__ rows, const int* __restrict__ pos,
                   float* __restrict__ out, const float* __restrict__ q, int n_head, int dv, int S, int min_per,
                   int q_stride, int gate_off, int8_t* __restrict__ xq, float* __restrict__ xds) {
    TRACE_SCOPE(TRACE_FA_MERGE);
    const int i = blockIdx.x, h = blockIdx.y;
    const int len = pos[i] + 1;  // host positions: before the wait
    const int per = max((len + S - 1) / S, min_per), active = (len + per - 1) / per;
    pdl_enter<PDL_E_ATTN>();
    TRACE_WAITED(TRACE_FA_MERGE);
    if (active <= 1) return;
    const long long hr = (long long)rows[i] * n_head + h;
    fa_merge_head(part + ((long long)i * n_head + h) * S * (dv + 2), active, dv, out + hr * dv,
                  gate_off >= 0 ? q + hr * q_stride + gate_off : nullptr, xq, xds, hr * dv);
}

// grid (n_rows, n_head), block 128: merges the S <= FA_MAX_SPLITS partials of fa_decode_* into
// out (fa_merge_head).
extern "C" __global__ void __launch_bounds__(128)
    fa_merge(const float* __restrict__ part, const int* __restrict__ rows, float* __restrict__ out, int n_head, int dv,
             int S) {
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x, h = blockIdx.y;
    fa_merge_head(part + ((long long)i * n_head + h) * S * (dv + 2), S, dv, out + ((long long)rows[i] * n_head + h) * dv,
                  nullptr);
}

// ---- prefill: flash attention on tensor cores -----------------------------------------------

// One 16x16 f16 operand (eight f16x2 registers) and one 16x16 f32 accumulator (eight f32)
// of PTX wmma .m16n16k16; the element-to-thread mapping is opaque but fixed per fragment type.
struct FragH {
    uint32_t x[8];
};
struct FragF {
    float x[8];
};

// p: 32-byte aligned; ld: elements, a multiple of 8 (f16) / 4 (f32). "memory": ordered with
// the plain shared-memory stores around them.
static __device__ __forceinline__ void wmma_load_a_row(FragH& f, const uint16_t* p, int ld) {
    asm volatile("wmma.load.a.sync.aligned.row.m16n16k16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3]), "=r"(f.x[4]), "=r"(f.x[5]), "=r"(f.x[6]),
                   "=r"(f.x[7])
                 : "l"(p), "r"(ld)
                 : "memory");
}
static __device__ __forceinline__ void wmma_load_b_col(FragH& f, const uint16_t* p, int ld) {
    asm volatile("wmma.load.b.sync.aligned.col.m16n16k16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3]), "=r"(f.x[4]), "=r"(f.x[5]), "=r"(f.x[6]),
                   "=r"(f.x[7])
                 : "l"(p), "r"(ld)
                 : "memory");
}
static __device__ __forceinline__ void wmma_load_b_row(FragH& f, const uint16_t* p, int ld) {
    asm volatile("wmma.load.b.sync.aligned.row.m16n16k16.f16 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=r"(f.x[0]), "=r"(f.x[1]), "=r"(f.x[2]), "=r"(f.x[3]), "=r"(f.x[4]), "=r"(f.x[5]), "=r"(f.x[6]),
                   "=r"(f.x[7])
                 : "l"(p), "r"(ld)
                 : "memory");
}
static __device__ __forceinline__ void wmma_load_c_row(FragF& f, const float* p, int ld) {
    asm volatile("wmma.load.c.sync.aligned.row.m16n16k16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, [%8], %9;"
                 : "=f"(f.x[0]), "=f"(f.x[1]), "=f"(f.x[2]), "=f"(f.x[3]), "=f"(f.x[4]), "=f"(f.x[5]), "=f"(f.x[6]),
                   "=f"(f.x[7])
                 : "l"(p), "r"(ld)
                 : "memory");
}
static __device__ __forceinline__ void wmma_store_d_row(float* p, const FragF& f, int ld) {
    asm volatile("wmma.store.d.sync.aligned.row.m16n16k16.f32 [%0], {%1,%2,%3,%4,%5,%6,%7,%8}, %9;"
                 :
                 : "l"(p), "f"(f.x[0]), "f"(f.x[1]), "f"(f.x[2]), "f"(f.x[3]), "f"(f.x[4]), "f"(f.x[5]), "f"(f.x[6]),
                   "f"(f.x[7]), "r"(ld)
                 : "memory");
}
// d += a b with a row-major and b column-major (K^T from K rows) ...
static __device__ __forceinline__ void wmma_mma_row_col(FragF& d, const FragH& a, const FragH& b) {
    asm volatile(
        "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19,%20,%21,%22,%23}, {%0,%1,%2,%3,%4,%5,%6,%7};"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3]), "+f"(d.x[4]), "+f"(d.x[5]), "+f"(d.x[6]), "+f"(d.x[7])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(a.x[4]), "r"(a.x[5]), "r"(a.x[6]), "r"(a.x[7]),
          "r"(b.x[0]), "r"(b.x[1]), "r"(b.x[2]), "r"(b.x[3]), "r"(b.x[4]), "r"(b.x[5]), "r"(b.x[6]), "r"(b.x[7]));
}
// ... or row-major (V rows).
static __device__ __forceinline__ void wmma_mma_row_row(FragF& d, const FragH& a, const FragH& b) {
    asm volatile(
        "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19,%20,%21,%22,%23}, {%0,%1,%2,%3,%4,%5,%6,%7};"
        : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3]), "+f"(d.x[4]), "+f"(d.x[5]), "+f"(d.x[6]), "+f"(d.x[7])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(a.x[4]), "r"(a.x[5]), "r"(a.x[6]), "r"(a.x[7]),
          "r"(b.x[0]), "r"(b.x[1]), "r"(b.x[2]), "r"(b.x[3]), "r"(b.x[4]), "r"(b.x[5]), "r"(b.x[6]), "r"(b.x[7]));
}

#define FP_WARPS 4
#define FP_BM (16 * FP_WARPS)  // query rows per block (16 per warp)
#define FP_BN 32               // positions per K/V tile
#define FP_LDS (FP_BN + 4)     // f32 stride of a warp's score tile (P aliases it as f16, stride 2 * FP_LDS)

// Loads positions kv0..kv0+FP_BN-1 of K and V (one head: elements ek.. / ev.. of each position
// row) as f16 into k_s / v_s [FP_BN][D + 8]; positions >= kv_len become zeros (their
// probabilities are 0, and 0 * stale data could be NaN).
template <int D, int TYPE>
static __device__ __forceinline__ void fp_load_kv(const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc,
                                                  long long kpb, long long vpb, long long ek, long long ev, int kv0,
                                                  int kv_len, uint16_t* k_s, uint16_t* v_s, int tid) {
    constexpr int LDH = D + 8;
    constexpr int UPR = D / 8;
    constexpr int N = FP_BN * UPR;
    constexpr int THREADS = 32 * FP_WARPS;
#pragma unroll
    for (int u0 = 0; u0 < N; u0 += 4 * THREADS) {
        Raw8 rk[4], rv[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int u = u0 + tid + k * THREADS;
            const int p = kv0 + u / UPR;
            if (u < N && p < kv_len) {
                rk[k] = kv_raw8<TYPE>(kc + (long long)p * kpb, ek + (u % UPR) * 8);
                rv[k] = kv_raw8<TYPE>(vc + (long long)p * vpb, ev + (u % UPR) * 8);
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int u = u0 + tid + k * THREADS;
            if (u >= N) continue;
            const int t = u / UPR, c = (u % UPR) * 8;
            uint4 ok = make_uint4(0, 0, 0, 0), ov = make_uint4(0, 0, 0, 0);
            if (kv0 + t < kv_len) {
                if (TYPE == FA_F16) {
                    ok = make_uint4(rk[k].w[0], rk[k].w[1], rk[k].w[2], rk[k].w[3]);
                    ov = make_uint4(rv[k].w[0], rv[k].w[1], rv[k].w[2], rv[k].w[3]);
                } else {
                    float x[8];
                    kv_decode8<TYPE>(rk[k], ek + c, x);
                    ok = make_uint4(pack_f16x2(x[0], x[1]), pack_f16x2(x[2], x[3]), pack_f16x2(x[4], x[5]),
                                    pack_f16x2(x[6], x[7]));
                    kv_decode8<TYPE>(rv[k], ev + c, x);
                    ov = make_uint4(pack_f16x2(x[0], x[1]), pack_f16x2(x[2], x[3]), pack_f16x2(x[4], x[5]),
                                    pack_f16x2(x[6], x[7]));
                }
            }
            *(uint4*)(k_s + t * LDH + c) = ok;
            *(uint4*)(v_s + t * LDH + c) = ov;
        }
    }
}

// grid (ceil(n_rows / FP_BM), n_head), block (32, FP_WARPS), dynamic shared memory
// fp_smem_bytes(D) (attention.rs: prefill_smem_bytes). dk == dv == D. Block (b, h): launch rows
// of tile b (the last tile first: causal rows near the end see the most keys) for query head h.
// Q tile to shared f16 once; then per K/V tile of FP_BN positions up to the tile's largest
// position: S = Q K^T (wmma, f32) per warp's 16 rows, scale + causal mask by absolute
// positions + online softmax in f32, P to f16, O = O * corr + P V (wmma, O in f32 accumulator
// fragments). Rows of a warp are rescaled through a row-index fragment: loading a matrix whose
// element (r, c) is r tells each thread the row of each of its accumulator elements.
template <int D, int TYPE>
static __device__ void flash_prefill(const float* __restrict__ q, const int* __restrict__ rows,
                                     const int* __restrict__ pos, int n_rows, const uint8_t* __restrict__ kc,
                                     const uint8_t* __restrict__ vc, float* __restrict__ out, int n_head,
                                     int n_kv_head, long long kpb, long long vpb, float scale) {
    constexpr int LDH = D + 8;  // f16 stride of the Q/K/V tiles: 16-byte rows, 16-row frags stay 32-byte aligned
    constexpr int NF = D / 16;  // output fragments per warp
    extern __shared__ __align__(128) uint8_t fp_smem[];
    uint16_t* q_s = (uint16_t*)fp_smem;                  // [FP_BM][LDH]
    uint16_t* k_s = q_s + FP_BM * LDH;                   // [FP_BN][LDH]
    uint16_t* v_s = k_s + FP_BN * LDH;                   // [FP_BN][LDH]
    float* s_all = (float*)(v_s + FP_BN * LDH);          // [FP_WARPS][16][FP_LDS]
    float* rowf_all = s_all + FP_WARPS * 16 * FP_LDS;    // [FP_WARPS][16]
    int* pos_s = (int*)(rowf_all + FP_WARPS * 16);       // [FP_BM]
    int* row_s = pos_s + FP_BM;                          // [FP_BM]
    int* len_s = row_s + FP_BM;                          // [1]

    const int lane = threadIdx.x, warp = threadIdx.y, tid = lane + 32 * warp;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * FP_BM;
    const int h = blockIdx.y;
    const int kvh = h / (n_head / n_kv_head);
    if (tid == 0) *len_s = 0;
    __syncthreads();
    for (int j = tid; j < FP_BM; j += 32 * FP_WARPS) {
        const bool ok = i0 + j < n_rows;
        const int p = ok ? pos[i0 + j] : -1;
        pos_s[j] = p;
        row_s[j] = ok ? rows[i0 + j] : -1;
        if (ok) atomicMax(len_s, p + 1);
    }
    __syncthreads();
    const long long ldq = (long long)n_head * D;
    for (int e = tid; e < FP_BM * (D / 2); e += 32 * FP_WARPS) {
        const int j = e / (D / 2), c = (e % (D / 2)) * 2;
        const int r = row_s[j];
        float2 x = make_float2(0.0f, 0.0f);
        if (r >= 0) x = *(const float2*)(q + r * ldq + (long long)h * D + c);
        *(uint32_t*)(q_s + j * LDH + c) = pack_f16x2(x.x, x.y);
    }
    const int kv_len = *len_s;

    float* sw = s_all + warp * 16 * FP_LDS;  // this warp's scores; P (f16) aliases it
    uint16_t* pw = (uint16_t*)sw;
    float* rowf = rowf_all + warp * 16;
    const uint16_t* qw = q_s + warp * 16 * LDH;
    for (int e = lane; e < 256; e += 32) sw[(e / 16) * FP_LDS + e % 16] = (float)(e / 16);
    __syncwarp();
    int rid[8];
    {
        FragF f;
        wmma_load_c_row(f, sw, FP_LDS);
#pragma unroll
        for (int k = 0; k < 8; k++) rid[k] = (int)f.x[k];
    }
    FragF o[NF];
#pragma unroll
    for (int f = 0; f < NF; f++)
#pragma unroll
        for (int k = 0; k < 8; k++) o[f].x[k] = 0.0f;
    const int my_row = lane >> 1, half = lane & 1;  // softmax: two lanes per row, 16 columns each
    const int my_pos = pos_s[warp * 16 + my_row];
    float m_r = NEG_INF, l_r = 0.0f;

    for (int kv0 = 0; kv0 < kv_len; kv0 += FP_BN) {
        __syncthreads();  // the previous tile's K/V (and on entry Q) are done with / written
        fp_load_kv<D, TYPE>(kc, vc, kpb, vpb, (long long)kvh * D, (long long)kvh * D, kv0, kv_len, k_s, v_s, tid);
        __syncthreads();
        FragF sc[2];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int k = 0; k < 8; k++) sc[n].x[k] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D; kk += 16) {
            FragH a, b;
            wmma_load_a_row(a, qw + kk, LDH);
#pragma unroll
            for (int n = 0; n < 2; n++) {
                wmma_load_b_col(b, k_s + n * 16 * LDH + kk, LDH);
                wmma_mma_row_col(sc[n], a, b);
            }
        }
        wmma_store_d_row(sw, sc[0], FP_LDS);
        wmma_store_d_row(sw + 16, sc[1], FP_LDS);
        __syncwarp();
        float x[16];
        float mx = NEG_INF;
#pragma unroll
        for (int c = 0; c < 16; c++) {
            const int col = half * 16 + c;
            float v = sw[my_row * FP_LDS + col] * scale;
            if (kv0 + col > my_pos) v = NEG_INF;
            x[c] = v;
            mx = fmaxf(mx, v);
        }
        mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
        const float m_new = fmaxf(m_r, mx);
        float corr = 1.0f, sum = 0.0f;
        if (m_new == NEG_INF) {  // nothing visible yet (rows past the end of the launch)
#pragma unroll
            for (int c = 0; c < 16; c++) x[c] = 0.0f;
        } else {
            corr = expf(m_r - m_new);
#pragma unroll
            for (int c = 0; c < 16; c++) {
                x[c] = expf(x[c] - m_new);
                sum += x[c];
            }
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        l_r = l_r * corr + sum;
        m_r = m_new;
        __syncwarp();  // every score read before P overwrites them
#pragma unroll
        for (int c = 0; c < 16; c += 2)
            *(uint32_t*)(pw + my_row * 2 * FP_LDS + half * 16 + c) = pack_f16x2(x[c], x[c + 1]);
        if (half == 0) rowf[my_row] = corr;
        __syncwarp();
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int k = 0; k < 8; k++) o[f].x[k] *= rowf[rid[k]];
#pragma unroll
        for (int kk = 0; kk < FP_BN; kk += 16) {
            FragH a, b;
            wmma_load_a_row(a, pw + kk, 2 * FP_LDS);
#pragma unroll
            for (int f = 0; f < NF; f++) {
                wmma_load_b_row(b, v_s + kk * LDH + f * 16, LDH);
                wmma_mma_row_row(o[f], a, b);
            }
        }
        __syncwarp();
    }

    __syncwarp();
    if (half == 0) rowf[my_row] = l_r > 0.0f ? 1.0f / l_r : 0.0f;
    __syncwarp();
    const int r_out = row_s[warp * 16 + my_row];
#pragma unroll
    for (int f = 0; f < NF; f++) {
#pragma unroll
        for (int k = 0; k < 8; k++) o[f].x[k] *= rowf[rid[k]];
        wmma_store_d_row(sw, o[f], FP_LDS);
        __syncwarp();
        if (r_out >= 0) {
            const float* src = sw + my_row * FP_LDS + half * 8;
            float4* dst = (float4*)(out + (long long)r_out * n_head * D + (long long)h * D + f * 16 + half * 8);
            dst[0] = make_float4(src[0], src[1], src[2], src[3]);
            dst[1] = make_float4(src[4], src[5], src[6], src[7]);
        }
        __syncwarp();
    }
}

#define FA_PREFILL(NAME, D, TYPE)                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * FP_WARPS)                                                    \
        NAME(const float* __restrict__ q, const int* __restrict__ rows, const int* __restrict__ pos, int n_rows,   \
             const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc, float* __restrict__ out, int n_head,  \
             int n_kv_head, long long kpb, long long vpb, float scale) {                                           \
        flash_prefill<D, TYPE>(q, rows, pos, n_rows, kc, vc, out, n_head, n_kv_head, kpb, vpb, scale);             \
    }
FA_PREFILL(fa_prefill_d64_f16, 64, FA_F16)
FA_PREFILL(fa_prefill_d64_q8_0, 64, FA_Q8_0)
FA_PREFILL(fa_prefill_d64_q4_0, 64, FA_Q4_0)
FA_PREFILL(fa_prefill_d128_f16, 128, FA_F16)
FA_PREFILL(fa_prefill_d128_q8_0, 128, FA_Q8_0)
FA_PREFILL(fa_prefill_d128_q4_0, 128, FA_Q4_0)
FA_PREFILL(fa_prefill_d256_f16, 256, FA_F16)
FA_PREFILL(fa_prefill_d256_q8_0, 256, FA_Q8_0)
FA_PREFILL(fa_prefill_d256_q4_0, 256, FA_Q4_0)
