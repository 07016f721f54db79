// elementwise.cu — the small per-token ops of a transformer layer, f32 activations.
//
// Simple, correct kernels (memory-bound, tiny next to the matvecs): RMS norm, RoPE (normal,
// NeoX, multi-section MRoPE and interleaved IMRoPE as in ggml), SwiGLU, residual add, and
// embedding-row lookup (get_rows) for F32 / F16 / BF16 and every block format decoded by
// quant_formats.cuh.
#include "quant_formats.cuh"

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w      x, y: [n_rows, d]; w: [d]
// grid n_rows, block 256.
extern "C" __global__ void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ y, int d, float eps) {
    __shared__ float partial[32];
    const float* xr = x + (long long)blockIdx.x * d;
    float* yr = y + (long long)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.0f;
        v = warp_sum(v);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    const float scale = rsqrtf(partial[0] / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

// RoPE in place on x: [n_tokens, n_heads, head_dim] (token stride head_dim * n_heads).
// The first n_dims of each head rotate; pair i (0 <= i < n_dims/2) has angle
// p * freq_scale * freq_base^(-2i/n_dims). mode 0: pairs (2i, 2i+1) (llama); 1: (i, i+n_dims/2)
// (NeoX); 2: MRoPE, NeoX pairs with p taken per section from pos [4][n_tokens] (ggml
// rope_multi: sector = i % sum(sections), contiguous sections t, h, w, e); 3: IMRoPE, sections
// interleaved t,h,w,t,h,w... (ggml GGML_ROPE_TYPE_IMROPE). pos: [n_tokens] (modes 0, 1) or
// [4, n_tokens] (modes 2, 3).
// grid (n_tokens, n_heads), block n_dims/2 (<= 1024).
extern "C" __global__ void rope_f32(float* __restrict__ x, const int* __restrict__ pos, int n_tokens, int n_heads,
                                    int head_dim, int n_dims, float freq_base, float freq_scale, int mode, int s0,
                                    int s1, int s2, int s3) {
    const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
    if (i >= n_dims / 2) return;
    float p;
    if (mode <= 1) {
        p = (float)pos[t];
    } else {
        const int sect = s0 + s1 + s2 + s3;
        const int sector = i % sect;
        int which;
        if (mode == 2) {
            which = sector < s0 ? 0 : sector < s0 + s1 ? 1 : sector < s0 + s1 + s2 ? 2 : 3;
        } else {
            which = (sector % 3 == 1 && sector < 3 * s1) ? 1
                    : (sector % 3 == 2 && sector < 3 * s2) ? 2
                    : (sector % 3 == 0 && sector < 3 * s0) ? 0
                                                           : 3;
        }
        p = (float)pos[which * n_tokens + t];
    }
    const float theta = p * powf(freq_base, -2.0f * (float)i / (float)n_dims) * freq_scale;
    float sn, cs;
    sincosf(theta, &sn, &cs);
    float* xh = x + ((long long)t * n_heads + h) * head_dim;
    const int a = mode == 0 ? 2 * i : i;
    const int b = mode == 0 ? 2 * i + 1 : i + n_dims / 2;
    const float x0 = xh[a], x1 = xh[b];
    xh[a] = x0 * cs - x1 * sn;
    xh[b] = x0 * sn + x1 * cs;
}

// y = silu(gate) * up = gate / (1 + exp(-gate)) * up      all [n]
extern "C" __global__ void swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// y = a + b      all [n] (y may alias a: in-place residual add)
extern "C" __global__ void add_f32(const float* a, const float* __restrict__ b, float* y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        y[i] = a[i] + b[i];
    }
}

// Embedding rows: y[t, :] = dequantize(table[ids[t], :]). table: [n_vocab, d] in GGUF layout
// (row_bytes per row); ids checked on the host. grid n_tokens, block 256.
template <typename F>
static __device__ __forceinline__ void get_rows_quant(const uint8_t* __restrict__ table, const int* __restrict__ ids,
                                                      float* __restrict__ y, int d, long long row_bytes) {
    const uint8_t* row = table + (long long)ids[blockIdx.x] * row_bytes;
    float* yr = y + (long long)blockIdx.x * d;
    const int n_units = d / 32;
    for (int uu = threadIdx.x; uu < n_units; uu += blockDim.x) {
        const int blk = uu / F::UNITS, u = uu % F::UNITS;
        int v[8];
        float s0, s1, m0, m1;
        F::decode(row + (long long)blk * F::BLOCK_BYTES, u, v, s0, s1, m0, m1);
#pragma unroll
        for (int e = 0; e < 32; e++) {
            const int q = (int)(int8_t)((v[e / 4] >> (8 * (e % 4))) & 0xFF);
            const bool second = e >= 16;
            float val = (second ? s1 : s0) * (float)q;
            if (F::HAS_MIN) val += m0;
            if (F::HALF_MIN) val += second ? m1 : m0;
            yr[uu * 32 + e] = val;
        }
    }
}

#define GET_ROWS(name, F)                                                                                    \
    extern "C" __global__ void get_rows_##name(const uint8_t* __restrict__ table, const int* __restrict__ ids, \
                                               float* __restrict__ y, int d, long long row_bytes) {            \
        get_rows_quant<F>(table, ids, y, d, row_bytes);                                                      \
    }
GET_ROWS(q4_0, FmtQ4_0)
GET_ROWS(q4_1, FmtQ4_1)
GET_ROWS(q5_0, FmtQ5_0)
GET_ROWS(q5_1, FmtQ5_1)
GET_ROWS(q8_0, FmtQ8_0)
GET_ROWS(iq4_nl, FmtIQ4_NL)
GET_ROWS(iq4_xs, FmtIQ4_XS)
GET_ROWS(q2_k, FmtQ2_K)
GET_ROWS(q3_k, FmtQ3_K)
GET_ROWS(q4_k, FmtQ4_K)
GET_ROWS(q5_k, FmtQ5_K)
GET_ROWS(q6_k, FmtQ6_K)

// kind: 0 f32, 1 f16, 2 bf16
extern "C" __global__ void get_rows_float(const uint8_t* __restrict__ table, const int* __restrict__ ids,
                                          float* __restrict__ y, int d, long long row_bytes, int kind) {
    const uint8_t* row = table + (long long)ids[blockIdx.x] * row_bytes;
    float* yr = y + (long long)blockIdx.x * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        yr[i] = kind == 0 ? ((const float*)row)[i]
                : kind == 1 ? f16_to_f32(((const uint16_t*)row)[i])
                            : bf16_to_f32(((const uint16_t*)row)[i]);
    }
}

// Order-preserving keys: a larger key is a larger value in f32::total_cmp's order (NaN read
// as -inf first), and back.
static __device__ __forceinline__ unsigned int topk_key(float v) {
    if (v != v) v = NEG_INF;
    const unsigned int u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static __device__ __forceinline__ float topk_value(unsigned int key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The greedy pick of logits rows, first pass: block (p, r) takes columns [p * per, (p + 1) * per)
// of the first `cols` of row r (rows `ld` apart) and writes (value, column as int bits, any
// finite as 0/1) to out[(r * parts + p) * 3 ..]: the largest value in f32::total_cmp's order
// (NaN read as -inf, +0 above -0: topk_key), the lowest column among equal ones (-1 for an
// empty range). The host combines the parts the same way (crates/cuda/src/ops.rs:
// argmax_rows). grid (parts, rows), block 256.
extern "C" __global__ void argmax_parts_f32(const float* __restrict__ x, long long ld, int cols, int per,
                                            float* __restrict__ out) {
    __shared__ unsigned int sk[8];
    __shared__ int si[8], sf[8];
    const float* xr = x + (long long)blockIdx.y * ld;
    const int lo = blockIdx.x * per, hi = min(cols, lo + per);
    unsigned int bk = 0;
    int bi = -1, fin = 0;
    // each thread walks its columns in increasing order: a later equal value never wins
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        const float v = xr[j];
        fin |= fabsf(v) <= 3.402823466e38f ? 1 : 0;  // false for +-inf and NaN
        const unsigned int key = topk_key(v);
        if (bi < 0 || key > bk) {
            bk = key;
            bi = j;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned int ok = __shfl_xor_sync(0xffffffffu, bk, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        fin |= __shfl_xor_sync(0xffffffffu, fin, o);
        if (oi >= 0 && (bi < 0 || ok > bk || (ok == bk && oi < bi))) {
            bk = ok;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sk[warp] = bk;
        si[warp] = bi;
        sf[warp] = fin;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) {
            const unsigned int ok = sk[w];
            const int oi = si[w];
            fin |= sf[w];
            if (oi >= 0 && (bi < 0 || ok > bk || (ok == bk && oi < bi))) {
                bk = ok;
                bi = oi;
            }
        }
        float* o = out + ((long long)blockIdx.y * gridDim.x + blockIdx.x) * 3;
        o[0] = topk_value(bk);
        o[1] = __int_as_float(bi);
        o[2] = fin ? 1.0f : 0.0f;
    }
}

// The top-k of logits rows, first pass (k <= TOPK_MAX): block (p, r) takes columns
// [p * per, (p + 1) * per) (per <= TOPK_PER) of the first `cols` of row r (rows `ld` apart) and
// writes to out[(r * parts + p) * (1 + 2 k) ..]: any finite value as 0/1, then k pairs (value,
// column as int bits) of its k best by value (NaN read as -inf; values ordered as Rust's
// f32::total_cmp, so -0 < +0), the lower column first among equal ones; column -1 past the
// range's end. Unordered: the host merges the parts and sorts (crates/cuda/src/ops.rs:
// top_k_rows). The k-th largest key comes from a radix select over the range in shared memory
// (four passes of 8 bits, per-warp histograms); the keys above it are all taken, and of the
// keys equal to it the lowest columns (in column order only when there are more of them than
// are taken). grid (parts, rows), block 256.
#define TOPK_MAX 64
#define TOPK_PER 8192
#define TOPK_THREADS 256
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    topk_parts_f32(const float* __restrict__ x, long long ld, int cols, int per, int k, float* __restrict__ out) {
    __shared__ unsigned int keys[TOPK_PER];
    __shared__ unsigned int hist[TOPK_THREADS / 32][256];
    __shared__ unsigned int s_prefix, s_need, s_eq;
    __shared__ int s_gt, s_eq_taken, s_wc[TOPK_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* xr = x + (long long)blockIdx.y * ld;
    const int lo = blockIdx.x * per, n = max(min(cols, lo + per) - lo, 0);
    float* o = out + ((long long)blockIdx.y * gridDim.x + blockIdx.x) * (1 + 2 * k);
    int fin = 0;
    // 8 loads in flight per thread
    for (int j0 = 0; j0 < n; j0 += 8 * TOPK_THREADS) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int j = j0 + u * TOPK_THREADS + tid;
            v[u] = j < n ? xr[lo + j] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int j = j0 + u * TOPK_THREADS + tid;
            if (j < n) {
                fin |= fabsf(v[u]) <= 3.402823466e38f ? 1 : 0;
                keys[j] = topk_key(v[u]);
            }
        }
    }
    fin = __syncthreads_or(fin);
    for (int s = tid; s < k; s += TOPK_THREADS) {
        o[1 + 2 * s] = NEG_INF;
        o[2 + 2 * s] = __int_as_float(-1);
    }
    if (tid == 0) o[0] = fin ? 1.0f : 0.0f;
    const int kk = min(k, n);
    if (kk == 0) return;
    // radix select: prefix / mask the bits fixed so far, need the rank among keys matching them
    unsigned int prefix = 0, mask = 0, need = kk, eq = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = lane; b < 256; b += 32) hist[warp][b] = 0;
        __syncthreads();
        for (int j = tid; j < ((n + 31) & ~31); j += TOPK_THREADS) {
            const bool live = j < n && (keys[j] & mask) == prefix;
            const unsigned int bin = live ? (keys[j] >> shift) & 255u : 256u + lane;
            // lanes of one bin add once (few bins hold most keys in the first pass)
            const unsigned int same = __match_any_sync(FULL_MASK, bin);
            if (live && lane == __ffs(same) - 1) atomicAdd(&hist[warp][bin], (unsigned int)__popc(same));
        }
        __syncthreads();
        if (tid < 32) {
            // warp 0: the bin holding the need-th largest, from the top
            unsigned int acc = 0, found = 0, before = 0, cnt = 0;
            for (int b0 = 224; b0 >= 0 && !found; b0 -= 32) {
                const int b = b0 + lane;
                unsigned int c = 0;
                for (int w = 0; w < TOPK_THREADS / 32; w++) c += hist[w][b];
                // counts of bins above b within this group of 32 (lanes above)
                unsigned int above = 0;
                for (int d = 1; d < 32; d++) {
                    const unsigned int cd = __shfl_down_sync(FULL_MASK, c, d);
                    if (lane + d < 32) above += cd;
                }
                const bool hit = acc + above < need && acc + above + c >= need;
                const unsigned int hits = __ballot_sync(FULL_MASK, hit);
                if (hits) {
                    const int hl = __ffs(hits) - 1;
                    before = acc + __shfl_sync(FULL_MASK, above, hl);
                    cnt = __shfl_sync(FULL_MASK, c, hl);
                    found = b0 + hl + 1;
                } else {
                    acc += __shfl_sync(FULL_MASK, above + c, 0);
                }
            }
            if (lane == 0) {
                s_prefix = prefix | ((unsigned int)(found - 1) << shift);
                s_need = need - before;
                s_eq = cnt;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        eq = s_eq;
        mask |= 255u << shift;
    }
    // prefix: the kk-th largest key; all keys above it are taken (kk - need of them), and
    // need of the eq keys equal to it
    if (tid == 0) {
        s_gt = 0;
        s_eq_taken = 0;
    }
    __syncthreads();
    const int n_gt = kk - (int)need;
    auto put = [&](int slot, unsigned int key, int j) {
        o[1 + 2 * slot] = topk_value(key);
        o[2 + 2 * slot] = __int_as_float(lo + j);
    };
    const bool all_eq = eq == need;
    for (int base = 0; base < n; base += TOPK_THREADS) {
        const int j = base + tid;
        const unsigned int key = j < n ? keys[j] : 0u;
        if (j < n && key > prefix) put(atomicAdd(&s_gt, 1), key, j);
        const bool is_eq = j < n && key == prefix;
        if (all_eq) {
            if (is_eq) put(n_gt + atomicAdd(&s_eq_taken, 1), key, j);
            continue;
        }
        // more keys equal the k-th than are taken: the lowest columns, in column order
        const unsigned int bal = __ballot_sync(FULL_MASK, is_eq);
        if (lane == 0) s_wc[warp] = __popc(bal);
        __syncthreads();
        int off = s_eq_taken + __popc(bal & ((1u << lane) - 1u));
        int total = 0;
        for (int w = 0; w < TOPK_THREADS / 32; w++) {
            if (w < warp) off += s_wc[w];
            total += s_wc[w];
        }
        if (is_eq && off < (int)need) put(n_gt + off, key, j);
        __syncthreads();
        if (tid == 0) s_eq_taken += total;
        __syncthreads();
        if (s_eq_taken >= (int)need && s_gt == n_gt) break;
    }
}

// The top-k's second pass: grid rows, block 256. Merges row r's `parts` part lists of
// topk_parts_f32 (parts * k <= TOPK_MERGE_MAX candidates) into out[r * (1 + 2 k) ..]: any
// finite as 0/1, then its k best, best first (value by total order, then the lower column):
// each candidate's place is the number of candidates before it, every column being unique;
// (-inf, -1) past the candidates.
#define TOPK_MERGE_MAX 4096
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    topk_merge_f32(const float* __restrict__ part, int parts, int k, float* __restrict__ out) {
    __shared__ unsigned int keys[TOPK_MERGE_MAX];
    __shared__ int col[TOPK_MERGE_MAX];
    const int tid = threadIdx.x, width = 1 + 2 * k, m = parts * k;
    const float* in = part + (long long)blockIdx.x * parts * width;
    float* o = out + (long long)blockIdx.x * width;
    int fin = 0;
    for (int e = tid; e < m; e += TOPK_THREADS) {
        const int p = e / k, s = e % k;
        keys[e] = topk_key(in[p * width + 1 + 2 * s]);
        col[e] = __float_as_int(in[p * width + 2 + 2 * s]);
    }
    for (int p = tid; p < parts; p += TOPK_THREADS) fin |= in[p * width] != 0.0f ? 1 : 0;
    fin = __syncthreads_or(fin);
    for (int s = tid; s < k; s += TOPK_THREADS) {
        o[1 + 2 * s] = NEG_INF;
        o[2 + 2 * s] = __int_as_float(-1);
    }
    if (tid == 0) o[0] = fin ? 1.0f : 0.0f;
    __syncthreads();
    for (int e = tid; e < m; e += TOPK_THREADS) {
        const int c = col[e];
        if (c < 0) continue;
        const unsigned int ke = keys[e];
        int before = 0;
        for (int f = 0; f < m; f++) {
            const int cf = col[f];
            const unsigned int kf = keys[f];
            before += (cf >= 0 && (kf > ke || (kf == ke && cf < c))) ? 1 : 0;
        }
        if (before < k) {
            o[1 + 2 * before] = topk_value(ke);
            o[2 + 2 * before] = __int_as_float(c);
        }
    }
}
