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
// (a KV head's group of G heads is cut into ceil(G / FD_MAX_G) blocks along grid.y): the same
// tiles, splits and partials as flash_decode, with every thread busy in both products. Scores:
// thread (t, part) sums FD_PARTS-interleaved float4 columns of K row t against every head's q,
// then the parts meet by shuffles. P V: thread (column c, position part tq) accumulates
// float4 column c of every head over positions tq, tq + TQ, ...; the TQ parts are summed
// through shared memory once at the end. T = 32 positions (16 for D = 256).
#define FD_MAX_G 8

template <int D, int TYPE>
static __device__ void flash_decode_d(const float* __restrict__ q, const int* __restrict__ rows,
                                      const int* __restrict__ pos, const uint8_t* __restrict__ kc,
                                      const uint8_t* __restrict__ vc, float* __restrict__ out,
                                      float* __restrict__ part, int n_head, int n_kv_head, long long kpb,
                                      long long vpb, float scale) {
    constexpr int T = D > 128 ? 16 : 32;
    constexpr int PARTS = FD_THREADS / T;   // threads per K row in the scores
    constexpr int C4 = D / 4;               // float4 columns of a row
    constexpr int TQ = FD_THREADS / C4;     // position parts in P V
    constexpr int JS = C4 / PARTS;          // float4 columns per thread in the scores
    constexpr int LD = D + 16;              // rows 16 words apart: two K rows per 8-lane phase hit 32 banks
    extern __shared__ __align__(16) float fd_smem[];
    const int G = n_head / n_kv_head;
    const int n_sub = (G + FD_MAX_G - 1) / FD_MAX_G;
    const int s = blockIdx.x, S = gridDim.x, kvh = blockIdx.y / n_sub, sub = blockIdx.y % n_sub, i = blockIdx.z;
    const int Gb = min(FD_MAX_G, G - sub * FD_MAX_G);
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    float* q_s = fd_smem;                  // [FD_MAX_G][D], times scale
    float* k_s = q_s + FD_MAX_G * D;       // [T][LD]; at the end the P V reduction [FD_MAX_G][D]
    float* v_s = k_s + T * LD;             // [T][LD]
    float* p_s = v_s + T * LD;             // [FD_MAX_G][T]
    float* m_s = p_s + FD_MAX_G * T;       // [FD_MAX_G]
    float* l_s = m_s + FD_MAX_G;
    float* c_s = l_s + FD_MAX_G;

    const int r = rows[i];
    const int len = pos[i] + 1;
    const int n_tiles = (len + T - 1) / T;
    const int per = (n_tiles + S - 1) / S;
    const int t_begin = s * per, t_end = min(n_tiles, t_begin + per);
    {
        // This split's cached K/V rows (all but the newest, which the kernel before this one
        // stores) toward L2 before the wait (REDLINE_PDL): the positions come from the host and
        // the rows from earlier steps, so the tile loads below hit L2 instead of DRAM. A head's
        // slice of a cache row is pos_bytes / n_kv_head (whole blocks per head).
        const int p_lo = t_begin * T, p_hi = min(t_end * T, len - 1);
        const long long kh = kpb / n_kv_head, vh = vpb / n_kv_head;
        const int kl = (int)((kh + 127) / 128), vl = (int)((vh + 127) / 128);
        for (int e = tid; e < (p_hi - p_lo) * (kl + vl); e += FD_THREADS) {
            const int p = p_lo + e / (kl + vl), l = e % (kl + vl);
            const uint8_t* a = l < kl ? kc + p * kpb + kvh * kh + 128LL * l : vc + p * vpb + kvh * vh + 128LL * (l - kl);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
        }
    }
    pdl_wait();
    pdl_trigger();
    const int h0 = kvh * G + sub * FD_MAX_G;
    const float* qr = q + (long long)r * n_head * D + (long long)h0 * D;
    for (int e = tid; e < FD_MAX_G * D; e += FD_THREADS) q_s[e] = e < Gb * D ? qr[e] * scale : 0.0f;
    if (tid < FD_MAX_G) {
        m_s[tid] = NEG_INF;
        l_s[tid] = 0.0f;
    }
    const int st = tid / PARTS, sp = tid % PARTS;  // scores: row, part
    const int pc = tid % C4, pq = tid / C4;        // P V: column, position part
    float4 acc[FD_MAX_G];
#pragma unroll
    for (int g = 0; g < FD_MAX_G; g++) acc[g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    __syncthreads();

    for (int tile = t_begin; tile < t_end; tile++) {
        const int p0 = tile * T;
        const int tl = min(T, len - p0);
        fd_load_tile<TYPE>(kc, vc, kpb, vpb, (long long)kvh * D, (long long)kvh * D, D, D, p0, tl, k_s, LD, v_s, LD);
        __syncthreads();
        {
            float sc[FD_MAX_G];
#pragma unroll
            for (int g = 0; g < FD_MAX_G; g++) sc[g] = 0.0f;
#pragma unroll
            for (int j = 0; j < JS; j++) {
                const int c = sp + PARTS * j;
                const float4 k4 = *(const float4*)(k_s + st * LD + 4 * c);
#pragma unroll
                for (int g = 0; g < FD_MAX_G; g++) {
                    if (g < Gb) {
                        const float4 q4 = *(const float4*)(q_s + g * D + 4 * c);
                        sc[g] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < FD_MAX_G; g++) {
#pragma unroll
                for (int o = PARTS / 2; o > 0; o >>= 1) sc[g] += __shfl_xor_sync(FULL_MASK, sc[g], o);
                if (g < Gb && sp == 0) p_s[g * T + st] = st < tl ? sc[g] : NEG_INF;
            }
        }
        __syncthreads();
        for (int g = warp; g < Gb; g += FD_THREADS / 32) {
            float mx = NEG_INF;
            for (int t = lane; t < tl; t += 32) mx = fmaxf(mx, p_s[g * T + t]);
            mx = warp_max(mx);
            const float m_old = m_s[g];
            const float m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int t = lane; t < T; t += 32) {
                const float p = t < tl ? expf(p_s[g * T + t] - m_new) : 0.0f;
                p_s[g * T + t] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float c = expf(m_old - m_new);
                c_s[g] = c;
                l_s[g] = l_s[g] * c + sum;
                m_s[g] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < FD_MAX_G; g++) {
            if (g < Gb) {
                const float cr = c_s[g];
                acc[g].x *= cr;
                acc[g].y *= cr;
                acc[g].z *= cr;
                acc[g].w *= cr;
            }
        }
        for (int t = pq; t < tl; t += TQ) {
            const float4 v = *(const float4*)(v_s + t * LD + 4 * pc);
#pragma unroll
            for (int g = 0; g < FD_MAX_G; g++) {
                if (g < Gb) {
                    const float p = p_s[g * T + t];
                    acc[g].x += p * v.x;
                    acc[g].y += p * v.y;
                    acc[g].z += p * v.z;
                    acc[g].w += p * v.w;
                }
            }
        }
        __syncthreads();
    }

    // Sum the TQ position parts: part 0 stores, the others add in turn.
    float* red = k_s;  // [FD_MAX_G][D]
    for (int q0 = 0; q0 < TQ; q0++) {
        if (pq == q0) {
#pragma unroll
            for (int g = 0; g < FD_MAX_G; g++) {
                if (g < Gb) {
                    float4* d4 = (float4*)(red + g * D + 4 * pc);
                    if (q0 == 0) {
                        *d4 = acc[g];
                    } else {
                        const float4 a = *d4;
                        *d4 = make_float4(a.x + acc[g].x, a.y + acc[g].y, a.z + acc[g].z, a.w + acc[g].w);
                    }
                }
            }
        }
        __syncthreads();
    }
    for (int e = tid; e < Gb * D; e += FD_THREADS) {
        const int g = e / D, d = e % D;
        if (S == 1) {
            out[(long long)r * n_head * D + (long long)(h0 + g) * D + d] = red[e] / l_s[g];
        } else {
            float* pp = part + (((long long)i * n_head + h0 + g) * S + s) * (D + 2);
            pp[2 + d] = red[e];
            if (d == 0) {
                pp[0] = m_s[g];
                pp[1] = l_s[g];
            }
        }
    }
}

// Four blocks per SM (<= 128 registers): at 64 splits x 8 KV heads (Qwen2.5-32B at depth 4096)
// the 512 blocks then fit the H200's 132 SMs in one wave; at 149 registers only three fit, and
// a second wave of 116 blocks doubled the kernel's time.
#define FD_MIN_BLOCKS 4
#define FA_DECODE_D(NAME, D, TYPE)                                                                                 \
    extern "C" __global__ void __launch_bounds__(FD_THREADS, FD_MIN_BLOCKS)                                        \
        NAME(const float* __restrict__ q, const int* __restrict__ rows, const int* __restrict__ pos,                \
             const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc, float* __restrict__ out,              \
             float* __restrict__ part, int n_head, int n_kv_head, long long kpb, long long vpb, float scale,        \
             const unsigned long long* __restrict__ kvp) {                                                         \
        FD_ROW_CACHES(kvp, kc, vc);                                                                                \
        flash_decode_d<D, TYPE>(q, rows, pos, kc, vc, out, part, n_head, n_kv_head, kpb, vpb, scale);              \
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

#define FA_MAX_SPLITS 64

// grid (n_rows, n_head), block 128: merges the S <= FA_MAX_SPLITS partials of fa_decode_*
// (splits with sum 0 had no positions: weight 0; their partials are finite zeros) into out.
// Thread s reads split s's (max, sum) and the block reduces them, so no thread walks the
// splits serially; then thread d sums column d over the splits, loads independent of each
// other (at depth 4096 a decode step merges 64 splits per head in every attention layer).
extern "C" __global__ void __launch_bounds__(128)
    fa_merge(const float* __restrict__ part, const int* __restrict__ rows, float* __restrict__ out, int n_head, int dv,
             int S) {
    __shared__ float w_s[FA_MAX_SPLITS];
    __shared__ float red_s[2][4];
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const float* base = part + ((long long)i * n_head + h) * S * (dv + 2);
    float m = NEG_INF, l = 0.0f;
    if (tid < S) {
        l = base[tid * (dv + 2) + 1];
        if (l > 0.0f) m = base[tid * (dv + 2)];
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
    float* o = out + ((long long)rows[i] * n_head + h) * dv;
    for (int d = tid; d < dv; d += blockDim.x) {
        float a = 0.0f;
#pragma unroll 8
        for (int s = 0; s < S; s++) a += w_s[s] * base[s * (dv + 2) + 2 + d];
        o[d] = a * inv;
    }
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
