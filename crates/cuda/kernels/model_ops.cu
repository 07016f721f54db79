// model_ops.cu — the remaining ops of the `backend::Backend` trait (crates/cuda/src/backend):
// norms, activations, column copies, RoPE with frequency factors, a plain f32 matmul for small
// weights, KV-cache append/attention (f32/f16/q8_0/q4_0 cache rows), conv1d and the gated delta
// rule. Simple, correct kernels first; every shape is checked on the host before launch.
// Activations are row-major f32. sm_70-safe: f32 math only.
#include "common.cuh"

// block_sum within groups of `group` threads (a multiple of 32 dividing blockDim.x): each group's
// warp sums added in warp order, so a group's sum is block_sum's for a block of that group.
static __device__ float group_sum(float v, int group) {
    __shared__ float partial[32];
    v = warp_sum(v);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int gw = group / 32, w0 = warp / gw * gw;
    float t = 0.0f;
    for (int i = 0; i < gw; i++) t += partial[w0 + i];
    return t;
}

// Sum over a block of blockDim.x threads (a multiple of 32, <= 1024): warp sums, then added in
// warp order.
static __device__ float block_sum(float v) { return group_sum(v, blockDim.x); }

// ---- element-wise --------------------------------------------------------------------------

// x[i] += b[i % cols]; x: [n, cols]
extern "C" __global__ void mo_add_bias(float* x, const float* __restrict__ b, long long n, int cols) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] += b[i % cols];
}

extern "C" __global__ void mo_add(float* x, const float* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" __global__ void mo_swiglu(const float* __restrict__ g, const float* __restrict__ u, float* out, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = silu_f(g[i]) * u[i];
}

extern "C" __global__ void mo_silu(float* x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = silu_f(x[i]);
}

extern "C" __global__ void mo_mul_sigmoid(float* x, const float* __restrict__ g, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] *= sigmoid_f(g[i]);
}

// alpha <- softplus(alpha + dt_bias[h]) * a[h]; beta <- sigmoid(beta); both [n, n_heads].
extern "C" __global__ void mo_delta_gates(float* alpha, float* beta, const float* __restrict__ dt_bias,
                                          const float* __restrict__ a, long long n, int n_heads) {
    // the first element's weights before the wait (REDLINE_PDL; decode has one element per thread)
    const long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const int h0 = (int)(i0 % n_heads);
    const float dt0 = i0 < n ? dt_bias[h0] : 0.0f, a0 = i0 < n ? a[h0] : 0.0f;
    pdl_wait();
    pdl_trigger();
    for (long long i = i0; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int h = (int)(i % n_heads);
        const float x = alpha[i] + (i == i0 ? dt0 : dt_bias[h]);
        const float sp = x > 20.0f ? x : log1pf(expf(x));
        alpha[i] = sp * (i == i0 ? a0 : a[h]);
        beta[i] = sigmoid_f(beta[i]);
    }
}

// ---- norms ---------------------------------------------------------------------------------

// One block per group of `group` consecutive values (groups of all rows back to back):
// out = x / sqrt(mean(x^2) + eps) * w [* silu(z) when z != null]. out may alias x. May be
// launched with programmatic serialization (waits for the kernel before it).
extern "C" __global__ void mo_group_rms_norm(const float* x, const float* __restrict__ w, const float* __restrict__ z,
                                             float* out, int group, float eps) {
    // weights before the wait (REDLINE_PDL): their round trip overlaps the previous kernel
    const float w0 = (int)threadIdx.x < group ? w[threadIdx.x] : 0.0f;
    pdl_wait();
    pdl_trigger();
    const long long base = (long long)blockIdx.x * group;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) {
        const float v = x[base + i];
        ss += v * v;
    }
    ss = block_sum(ss);
    const float s = rsqrtf(ss / group + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) {
        float v = x[base + i] * s * (i == (int)threadIdx.x ? w0 : w[i]);
        if (z) v *= silu_f(z[base + i]);
        out[base + i] = v;
    }
}

// grid (n_rows, len / group): x[r][col0 + g*group ..][..group] /= sqrt(sum(x^2) + eps)
extern "C" __global__ void mo_l2_norm(float* x, int cols, int col0, int group, float eps) {
    float* p = x + (long long)blockIdx.x * cols + col0 + (long long)blockIdx.y * group;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss += p[i] * p[i];
    ss = block_sum(ss);
    const float s = rsqrtf(ss + eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) p[i] *= s;
}

// ---- copies ---------------------------------------------------------------------------------

// For every row and block b: dst[row][dst_off + b*dst_stride + i] = src[row][src_off + b*src_stride + i], i < width.
extern "C" __global__ void mo_copy_cols(const float* __restrict__ src, float* dst, int n_rows, int src_cols, int dst_cols,
                                        int n_blocks, int width, int src_off, int src_stride, int dst_off, int dst_stride) {
    const long long total = (long long)n_rows * n_blocks * width;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(t % width);
        const int b = (int)((t / width) % n_blocks);
        const long long r = t / ((long long)width * n_blocks);
        dst[r * dst_cols + dst_off + (long long)b * dst_stride + i] = src[r * src_cols + src_off + (long long)b * src_stride + i];
    }
}

// out[i] = x[rows[i]]; grid (n_out), x and out of `cols` columns.
extern "C" __global__ void mo_gather_rows(const float* __restrict__ x, const int* __restrict__ rows, float* out, int cols) {
    const float* s = x + (long long)rows[blockIdx.x] * cols;
    float* d = out + (long long)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) d[i] = s[i];
}

// ---- RoPE (ggml rope_ext: theta = pos * scale * base^(-2i/n_rot) / factor[i]) ---------------

// grid (n_rows, n_heads); x: [n_rows, n_heads * head_dim]; neox: pairs (i, i + n_rot/2), else (2i, 2i+1).
extern "C" __global__ void mo_rope(float* x, const int* __restrict__ pos, const float* __restrict__ factors, int n_heads,
                                   int head_dim, int n_rot, float freq_base, float freq_scale, int neox) {
    float* h = x + ((long long)blockIdx.x * n_heads + blockIdx.y) * head_dim;
    const float p = (float)pos[blockIdx.x];
    const int half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c, s;
        rope_cos_sin(p, i, n_rot, freq_base, freq_scale, factors, c, s);
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + half : 2 * i + 1;
        const float a = h[i0], b = h[i1];
        rope_rotate(a, b, c, s, h[i0], h[i1]);
    }
}

// ---- small f32 matmul (weights that the quantized matvec does not take) ----------------------

// y[t][i] = sum_j w[i][j] x[t][j]; w: [m, k], x: [n, k], y: [n, m]; one warp per output.
extern "C" __global__ void mo_matmul_f32(const float* __restrict__ w, const float* __restrict__ x, float* y, int m, int k, int n) {
    const long long o = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (o >= (long long)m * n) return;
    const int t = (int)(o / m), i = (int)(o % m);
    const int lane = threadIdx.x % 32;
    float acc = 0.0f;
    for (int j = lane; j < k; j += 32) acc += w[(long long)i * k + j] * x[(long long)t * k + j];
    acc = warp_sum(acc);
    if (lane == 0) y[o] = acc;
}

// ---- KV cache (one sequence per launch) -----------------------------------------------------
// A cache holds n_ctx positions of `width` = n_kv_head * head_dim elements, `pos_bytes` each.
// Types: 0 f32, 1 f16, 2 q8_0 (per 32: f16 d, 32 x int8), 3 q4_0 (per 32: f16 d, 16 bytes:
// byte j = element j low nibble, element j+16 high nibble, value q - 8) — ggml block layouts.

static __device__ __forceinline__ float kv_load(const uint8_t* row, int i, int type) {
    if (type == 0) return ((const float*)row)[i];
    if (type == 1) return f16_to_f32(((const uint16_t*)row)[i]);
    const int b = i / 32, j = i % 32;
    if (type == 2) {
        const uint8_t* blk = row + b * 34;
        return f16_to_f32(ld_u16(blk)) * (float)(int8_t)blk[2 + j];
    }
    const uint8_t* blk = row + b * 18;
    const uint8_t q = blk[2 + (j % 16)];
    const int v = (j < 16 ? (q & 0xF) : (q >> 4)) - 8;
    return f16_to_f32(ld_u16(blk)) * (float)v;
}

// The f16 scale at the start of a q8_0/q4_0 block, as one 2-byte store (blocks of 34 / 18 bytes
// in rows of whole blocks start 2-byte aligned). Two byte stores of the converted half
// (`blk[0] = h & 0xFF`) lost the low byte on the H200 (sm_90, NVRTC 13): the cache held d with
// its low mantissa byte zeroed, a 9.5e-2 attention error for q8_0 in the conformance suite.
static __device__ __forceinline__ void st_f16_scale(uint8_t* blk, float d) {
    *(uint16_t*)blk = f32_to_f16(d);
}

// One warp stores elements [32 * blk, 32 * blk + 32) of row `src_row` of src (row stride
// src_cols) at cache row `cpos`. For the block types width is a multiple of 32, so one warp
// owns one block.
static __device__ __forceinline__ void kv_store_warp(const float* __restrict__ src, int src_cols, int src_row, int blk,
                                                     int cpos, uint8_t* cache, int width, long long pos_bytes,
                                                     int type) {
    const int i = blk * 32 + threadIdx.x;
    const bool live = i < width;
    const float v = live ? src[(long long)src_row * src_cols + i] : 0.0f;
    uint8_t* row = cache + (long long)cpos * pos_bytes;
    if (type == 0) {
        if (live) ((float*)row)[i] = v;
        return;
    }
    if (type == 1) {
        if (live) ((uint16_t*)row)[i] = f32_to_f16(v);
        return;
    }
    if (type == 2) {
        const float amax = warp_max(fabsf(v));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t* b8 = row + blk * 34;
        if (threadIdx.x == 0) st_f16_scale(b8, d);
        const int qi = (int)roundf(v * id);  // in [-127, 127]
        b8[2 + threadIdx.x] = (uint8_t)(qi & 0xFF);
        return;
    }
    // q4_0: d = (value of largest magnitude) / -8, q = min(15, (int)(x / d + 8.5))
    float best = v;
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(FULL_MASK, best, o);
        if (fabsf(other) > fabsf(best) || (fabsf(other) == fabsf(best) && other > best)) best = other;
    }
    const float d = best / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q = (int)(v * id + 8.5f);
    q = q < 0 ? 0 : (q > 15 ? 15 : q);
    const int hi = __shfl_down_sync(FULL_MASK, q, 16);
    uint8_t* b4 = row + blk * 18;
    if (threadIdx.x == 0) st_f16_scale(b4, d);
    if (threadIdx.x < 16) b4[2 + threadIdx.x] = (uint8_t)(q | (hi << 4));
}

// grid (n_rows, ceil(wk / 32) + ceil(wv / 32)), block 32: stores row rows[r] of k and of v at
// position pos[r] of the K and V caches (both of `type`), one launch for both. kvp non-null:
// launch row r has caches of its own (the rows of several sequences in one launch), K at
// kvp[2r] and V at kvp[2r + 1] instead of kc / vc. Waits for the kernel that wrote k and v
// when launched with programmatic serialization (REDLINE_PDL).
extern "C" __global__ void mo_kv_store2(const float* __restrict__ k, const float* __restrict__ v,
                                        const int* __restrict__ rows, const int* __restrict__ pos, uint8_t* kc,
                                        uint8_t* vc, int wk, int wv, long long kpb, long long vpb, int type,
                                        const unsigned long long* __restrict__ kvp) {
    pdl_wait();
    pdl_trigger();
    if (kvp) {
        kc = (uint8_t*)kvp[2 * blockIdx.x];
        vc = (uint8_t*)kvp[2 * blockIdx.x + 1];
    }
    const int nbk = (wk + 31) / 32;
    const int b = blockIdx.y;
    if (b < nbk) {
        kv_store_warp(k, wk, rows[blockIdx.x], b, pos[blockIdx.x], kc, wk, kpb, type);
    } else {
        kv_store_warp(v, wv, rows[blockIdx.x], b - nbk, pos[blockIdx.x], vc, wv, vpb, type);
    }
}

#define MO_ATT_MAX_DIM 512
#define MO_ATT_WARPS 4

// Split-KV attention (flash-decoding), for decode and prefill rows alike.
// grid (n_rows, n_head, S), block (32, MO_ATT_WARPS). Row i (batch row rows[i]) attends to
// positions 0..=pos[i] of the cache; split s takes the s-th of S equal chunks of them. The
// length is read here, not passed in, so one launch shape serves every step (a CUDA graph
// replays it at any length; splits past the end exit early). Warps take interleaved positions
// of the chunk, each with its own online softmax (lane owns dims lane, lane+32, ...), then
// merge through shared memory. S == 1: the normalized result goes to out; else
// (max, sum, acc[hdv]) to part[((i * n_head + h) * S + s) * (hdv + 2)] for mo_attention_merge.
extern "C" __global__ void __launch_bounds__(32 * MO_ATT_WARPS)
    mo_attention_split(const float* __restrict__ q, const int* __restrict__ rows, const int* __restrict__ pos,
                       const uint8_t* __restrict__ kc, const uint8_t* __restrict__ vc, float* out, float* part,
                       int n_head, int n_kv_head, int hdk, int hdv, long long k_pos_bytes, long long v_pos_bytes,
                       int type, float scale) {
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int i = blockIdx.x, h = blockIdx.y, s = blockIdx.z, S = gridDim.z;
    const int r = rows[i];
    const int kvh = h / (n_head / n_kv_head);
    const float* qh = q + ((long long)r * n_head + h) * hdk;
    float qreg[MO_ATT_MAX_DIM / 32];
    float acc[MO_ATT_MAX_DIM / 32];
#pragma unroll
    for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
        const int d = lane + 32 * j;
        qreg[j] = d < hdk ? qh[d] : 0.0f;
        acc[j] = 0.0f;
    }
    const int len = pos[i] + 1;
    const int chunk = (len + S - 1) / S;
    const int p0 = s * chunk;
    const int p1 = min(len, p0 + chunk);
    float m = NEG_INF, l = 0.0f;
    for (int t = p0 + warp; t < p1; t += MO_ATT_WARPS) {
        const uint8_t* krow = kc + (long long)t * k_pos_bytes;
        const uint8_t* vrow = vc + (long long)t * v_pos_bytes;
        float sc = 0.0f;
#pragma unroll
        for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
            const int d = lane + 32 * j;
            if (d < hdk) sc += qreg[j] * kv_load(krow, kvh * hdk + d, type);
        }
        sc = warp_sum(sc) * scale;
        const float m_new = fmaxf(m, sc);
        const float corr = expf(m - m_new);  // 0 on the warp's first position (m = -inf)
        const float p = expf(sc - m_new);
        l = l * corr + p;
#pragma unroll
        for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
            const int d = lane + 32 * j;
            if (d < hdv) acc[j] = acc[j] * corr + p * kv_load(vrow, kvh * hdv + d, type);
        }
        m = m_new;
    }
    __shared__ float s_m[MO_ATT_WARPS], s_l[MO_ATT_WARPS];
    __shared__ float s_acc[MO_ATT_WARPS][MO_ATT_MAX_DIM];
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
        const int d = lane + 32 * j;
        if (d < hdv) s_acc[warp][d] = acc[j];
    }
    __syncthreads();
    if (warp != 0) return;
    float M = NEG_INF;
    for (int w = 0; w < MO_ATT_WARPS; w++)
        if (s_l[w] > 0.0f) M = fmaxf(M, s_m[w]);
    float L = 0.0f;
#pragma unroll
    for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) acc[j] = 0.0f;
    for (int w = 0; w < MO_ATT_WARPS; w++) {
        if (s_l[w] <= 0.0f) continue;
        const float f = expf(s_m[w] - M);
        L += s_l[w] * f;
#pragma unroll
        for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
            const int d = lane + 32 * j;
            if (d < hdv) acc[j] += s_acc[w][d] * f;
        }
    }
    if (S == 1) {
        float* o = out + ((long long)r * n_head + h) * hdv;
        const float inv = 1.0f / L;
#pragma unroll
        for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
            const int d = lane + 32 * j;
            if (d < hdv) o[d] = acc[j] * inv;
        }
        return;
    }
    float* pp = part + (((long long)i * n_head + h) * S + s) * (hdv + 2);
    if (lane == 0) {
        pp[0] = M;
        pp[1] = L;
    }
#pragma unroll
    for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
        const int d = lane + 32 * j;
        if (d < hdv) pp[2 + d] = acc[j];
    }
}

// grid (n_rows, n_head), block 32: merges the S partial results of mo_attention_split
// (splits with no positions have sum 0 and are skipped) into out.
extern "C" __global__ void mo_attention_merge(const float* __restrict__ part, const int* __restrict__ rows, float* out,
                                              int n_head, int hdv, int S) {
    const int lane = threadIdx.x;
    const int i = blockIdx.x, h = blockIdx.y;
    const float* base = part + ((long long)i * n_head + h) * S * (hdv + 2);
    float M = NEG_INF;
    for (int s = 0; s < S; s++)
        if (base[s * (hdv + 2) + 1] > 0.0f) M = fmaxf(M, base[s * (hdv + 2)]);
    float L = 0.0f;
    float acc[MO_ATT_MAX_DIM / 32];
#pragma unroll
    for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) acc[j] = 0.0f;
    for (int s = 0; s < S; s++) {
        const float* pp = base + s * (hdv + 2);
        if (pp[1] <= 0.0f) continue;
        const float f = expf(pp[0] - M);
        L += pp[1] * f;
#pragma unroll
        for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
            const int d = lane + 32 * j;
            if (d < hdv) acc[j] += pp[2 + d] * f;
        }
    }
    float* o = out + ((long long)rows[i] * n_head + h) * hdv;
    const float inv = 1.0f / L;
#pragma unroll
    for (int j = 0; j < MO_ATT_MAX_DIM / 32; j++) {
        const int d = lane + 32 * j;
        if (d < hdv) o[d] = acc[j] * inv;
    }
}

// ---- Gated DeltaNet (one sequence per launch; its rows in position order) --------------------

#define MO_CONV_MAX 16

// Thread per channel. x, out: [*, ch]; w: [ch, d_conv] (oldest tap first); state: [d_conv-1, ch].
// grid (ceil(ch / block), n_seqs). tab null: one sequence, rows[0 .. n_rows) and `state`; else
// sequence z = blockIdx.y owns rows[runs[z] .. runs[z + 1]) and the state at tab[z].
extern "C" __global__ void mo_conv1d(const float* __restrict__ x, const float* __restrict__ w, const int* __restrict__ rows,
                                     int n_rows, float* state, float* out, int ch, int d_conv,
                                     const int* __restrict__ runs, const unsigned long long* __restrict__ tab) {
    if (tab) {
        const int z = blockIdx.y;
        rows += runs[z];
        n_rows = runs[z + 1] - runs[z];
        state = (float*)tab[z];
    }
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    float win[MO_CONV_MAX];
    const int nw = d_conv - 1;
    for (int j = 0; j < nw; j++) win[j] = state[(long long)j * ch + c];
    for (int t = 0; t < n_rows; t++) {
        const long long r = rows[t];
        const float xv = x[r * ch + c];
        float s = w[(long long)c * d_conv + nw] * xv;
        for (int j = 0; j < nw; j++) s += w[(long long)c * d_conv + j] * win[j];
        out[r * ch + c] = s;
        for (int j = 0; j + 1 < nw; j++) win[j] = win[j + 1];
        if (nw > 0) win[nw - 1] = xv;
    }
    for (int j = 0; j < nw; j++) state[(long long)j * ch + c] = win[j];
}

// The conv chain's tail for channel c of batch row r (mo_conv1d_qkv, mo_conv1d_qkv_rows,
// mo_conv1d_qkv_gates): silu, the L2 norm over the thread's group of `group` threads (one
// element per thread; `normed` block-uniform), and the split: channel c goes to column c - off_j
// of output j.
static __device__ __forceinline__ void conv_qkv_out(float s, bool normed, int group, float eps, long long r, int c,
                                                    float* o0, float* o1, float* o2, int off1, int off2, int w0,
                                                    int w1, int w2) {
    float v = silu_f(s);
    if (normed) {
        const float ss = group_sum(v * v, group);
        v *= rsqrtf(ss + eps);
    }
    if (c < off1)
        o0[r * w0 + c] = v;
    else if (c < off2)
        o1[r * w1 + (c - off1)] = v;
    else
        o2[r * w2 + (c - off2)] = v;
}

// Gated DeltaNet's input chain of a decode step in one launch (CudaBackend::conv1d_qkv): for
// one row per sequence (rows / state, or runs / tab, as mo_conv1d), mo_conv1d, silu, mo_l2_norm
// of the channels below norm_cols, and the split: channel c goes to column c - off_j of output
// j (off_0 = 0 <= off_1 <= off_2, widths w_j). grid (ch / blockDim.x, n_seqs), block = the norm
// group (a multiple of 32, dividing ch, norm_cols and every output's range): a block's channels
// are one group of one output. The arithmetic is the separate kernels' (the conv sum in
// mo_conv1d's order, silu_f, one element per thread into block_sum), so the results are theirs
// bit for bit. The conv taps are weights: loaded before the wait (REDLINE_PDL).
// mo_conv1d_qkv's block (blockIdx.x, blockIdx.y) with norm groups of `group` threads (its own
// launch: the block); also the conv blocks of mo_conv1d_qkv_gates.
static __device__ __forceinline__ void conv1d_qkv_block(const float* __restrict__ x, const float* __restrict__ w,
                                                        const int* __restrict__ rows, float* state, int ch,
                                                        int d_conv, const int* __restrict__ runs,
                                                        const unsigned long long* __restrict__ tab, int norm_cols,
                                                        int group, float eps, float* o0, float* o1, float* o2,
                                                        int off1, int off2, int w0, int w1, int w2) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;  // < ch: the host checks ch % blockDim.x == 0
    const int nw = d_conv - 1;
    float wt[MO_CONV_MAX];
    for (int j = 0; j <= nw; j++) wt[j] = w[(long long)c * d_conv + j];
    // the window before the wait too (as dn_recurrent's state): only this layer's conv writes
    // it, in an earlier step, and rows / runs / tab come from the host, so its DRAM round trip
    // (the weight stream evicts it) overlaps the in-projections' tail
    if (tab) {
        const int z = blockIdx.y;
        rows += runs[z];
        state = (float*)tab[z];
    }
    float win[MO_CONV_MAX];
    for (int j = 0; j < nw; j++) win[j] = state[(long long)j * ch + c];
    pdl_enter<PDL_E_CONV>();
    TRACE_WAITED(TRACE_CONV);
    const long long r = rows[0];
    const float xv = x[r * ch + c];
    float s = wt[nw] * xv;
    for (int j = 0; j < nw; j++) s += wt[j] * win[j];
    for (int j = 0; j + 1 < nw; j++) win[j] = win[j + 1];
    if (nw > 0) win[nw - 1] = xv;
    for (int j = 0; j < nw; j++) state[(long long)j * ch + c] = win[j];
    // block-uniform: norm_cols % blockDim.x == 0
    conv_qkv_out(s, (int)(blockIdx.x * blockDim.x) < norm_cols, group, eps, r, c, o0, o1, o2, off1, off2, w0, w1,
                 w2);
}

extern "C" __global__ void mo_conv1d_qkv(const float* __restrict__ x, const float* __restrict__ w,
                                         const int* __restrict__ rows, float* state, int ch, int d_conv,
                                         const int* __restrict__ runs, const unsigned long long* __restrict__ tab,
                                         int norm_cols, float eps, float* o0, float* o1, float* o2, int off1,
                                         int off2, int w0, int w1, int w2) {
    TRACE_SCOPE(TRACE_CONV);
    conv1d_qkv_block(x, w, rows, state, ch, d_conv, runs, tab, norm_cols, blockDim.x, eps, o0, o1, o2, off1, off2, w0,
                     w1, w2);
}

// mo_conv1d_qkv for runs of several rows per sequence (speculative verify passes: k <= 8 rows):
// rows / n_rows for one sequence (tab null), or sequence z = blockIdx.y owns rows[runs[z] ..
// runs[z + 1]) with the state at tab[z]. Each thread walks its channel through the sequence's
// rows in order, carrying the window. The arithmetic is the separate ops' at this row count
// (conv1d_qkv_each): a sequence of one row sums the conv as mo_conv1d (the newest tap first),
// one of several as dn_conv1d_out (Conv1dForm::Auto's parallel form: taps in order from 0),
// then silu_f and, per row, one element per thread into block_sum (mo_l2_norm's order when the
// group is at most 256, its block size): the same bits. Taps and the window loaded before the
// wait.
extern "C" __global__ void mo_conv1d_qkv_rows(const float* __restrict__ x, const float* __restrict__ w,
                                              const int* __restrict__ rows, int n_rows, float* state, int ch,
                                              int d_conv, const int* __restrict__ runs,
                                              const unsigned long long* __restrict__ tab, int norm_cols, float eps,
                                              float* o0, float* o1, float* o2, int off1, int off2, int w0, int w1,
                                              int w2) {
    TRACE_SCOPE(TRACE_CONV);
    const int c = blockIdx.x * blockDim.x + threadIdx.x;  // < ch: the host checks ch % blockDim.x == 0
    const int nw = d_conv - 1;
    float wt[MO_CONV_MAX];
    for (int j = 0; j <= nw; j++) wt[j] = w[(long long)c * d_conv + j];
    // the window before the wait (as mo_conv1d_qkv)
    if (tab) {
        const int z = blockIdx.y;
        rows += runs[z];
        n_rows = runs[z + 1] - runs[z];
        state = (float*)tab[z];
    }
    float win[MO_CONV_MAX];
    for (int j = 0; j < nw; j++) win[j] = state[(long long)j * ch + c];
    pdl_enter<PDL_E_CONV>();
    TRACE_WAITED(TRACE_CONV);
    const bool normed = (int)(blockIdx.x * blockDim.x) < norm_cols;  // block-uniform
    for (int t = 0; t < n_rows; t++) {
        const long long r = rows[t];
        const float xv = x[r * ch + c];
        float s;
        if (n_rows == 1) {
            s = wt[nw] * xv;
            for (int j = 0; j < nw; j++) s += wt[j] * win[j];
        } else {
            s = 0.0f;
            for (int j = 0; j < nw; j++) s += wt[j] * win[j];
            s += wt[nw] * xv;
        }
        for (int j = 0; j + 1 < nw; j++) win[j] = win[j + 1];
        if (nw > 0) win[nw - 1] = xv;
        conv_qkv_out(s, normed, blockDim.x, eps, r, c, o0, o1, o2, off1, off2, w0, w1, w2);
    }
    for (int j = 0; j < nw; j++) state[(long long)j * ch + c] = win[j];
}

// grid (n_v_heads), threads over d_v: thread i owns row i of S_h [d_v, d_k].
// S <- exp(g) S; S <- S + beta (v - S k) k^T; o = S q / sqrt(d_k). Value head h reads key head h % n_k_heads.
extern "C" __global__ void mo_delta_rule(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                         const float* __restrict__ g, const float* __restrict__ beta, const int* __restrict__ rows,
                                         int n_rows, float* state, float* out, int n_k_heads, int n_v_heads, int d_k, int d_v) {
    const int h = blockIdx.x;
    const int kh = h % n_k_heads;
    const float qscale = rsqrtf((float)d_k);
    for (int i = threadIdx.x; i < d_v; i += blockDim.x) {
        float* s = state + ((long long)h * d_v + i) * d_k;
        for (int t = 0; t < n_rows; t++) {
            const long long r = rows[t];
            const float* kr = k + r * n_k_heads * d_k + (long long)kh * d_k;
            const float* qr = q + r * n_k_heads * d_k + (long long)kh * d_k;
            const float decay = expf(g[r * n_v_heads + h]);
            const float b = beta[r * n_v_heads + h];
            float kv = 0.0f;
            for (int j = 0; j < d_k; j++) {
                const float sj = s[j] * decay;
                s[j] = sj;
                kv += sj * kr[j];
            }
            const float delta = b * (v[r * n_v_heads * d_v + (long long)h * d_v + i] - kv);
            float o = 0.0f;
            for (int j = 0; j < d_k; j++) {
                const float sj = s[j] + delta * kr[j];
                s[j] = sj;
                o += sj * qr[j];
            }
            out[r * n_v_heads * d_v + (long long)h * d_v + i] = o * qscale;
        }
    }
}

// ---- profiling -------------------------------------------------------------------------------

// Spins one thread for `ns` nanoseconds of device time (REDLINE_PROFILE_OPS: the host queues a
// whole decode step behind it, so the per-op events time kernels running back to back).
extern "C" __global__ void mo_spin_ns(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// ---- producers that also write the q8_1 copy of their output (decode fusion) ------------------
//
// The next consumer of these outputs is a quantized matvec, which reads x as q8_1 (int8 per
// value + (d, d * sum q) per 32 values; kernels/matvec_quant.cu `quantize_q8_1`). Writing that
// copy here saves the matvec's own quantize launch. The values and their quantization are the
// same as quantize_q8_1 of the f32 output (same expressions), so fused == unfused bit for bit.

// (q8_1_unit: common.cuh)

// mo_group_rms_norm with group == cols (one block per row, blockDim a multiple of 32, cols a
// multiple of 32), no gate, plus the q8_1 copy: xq [n, cols] int8, xds [n, cols/32] float2.
// Meant for wide blocks (up to 1024 threads): a 5120-wide row on 256 threads took 15 us on the
// H200 (40 dependent global round trips); here each thread loads its (up to RMS_REGS) values
// once, all loads in flight together, and keeps them in registers for the second pass.
#define RMS_REGS 8
// kq non-null (kdy, kbs with it): the q8_K copy too (common.cuh q8_k_unit_block), for rows
// read by the mmv2 products; needs cols % 256 == 0, blockDim.x % 256 == 0 and cols <=
// RMS_REGS * blockDim.x (the host checks).
// grid (n_rows, S): with S > 1 (the in-register path only) block (r, y) loads and sums the
// whole row as a one-block launch does (the same sum, bit for bit) but writes only its y-th
// pass of blockDim.x values: one q8_1 unit per warp instead of S one after another. Why: the
// block-timeline trace (session 36, H100) put a one-row norm at 4.3 µs after its wait, 128 a
// 27B / 32B step (0.56 ms); the writes' warp reductions ran five deep on one multiprocessor.
// Measured: 4.3 -> 2.7 µs a call, one row 27B +3.5-4.1 %, 32B +0.9-3.4 % (H100, two rounds).
extern "C" __global__ void mo_rms_norm_q8(const float* x, const float* __restrict__ w, float* out,
                                          int8_t* __restrict__ xq, float* __restrict__ xds, int cols, float eps,
                                          int8_t* __restrict__ kq, float* __restrict__ kdy,
                                          int16_t* __restrict__ kbs) {
    TRACE_SCOPE(TRACE_NORM);
    const long long base = (long long)blockIdx.x * cols;
    const int bd = blockDim.x;
    if (cols <= RMS_REGS * bd) {
        // the norm weights are never written by a kernel: loaded before the wait (PDL), so
        // their global round trip overlaps the previous kernel instead of following the sum
        float wr[RMS_REGS];
#pragma unroll
        for (int k = 0; k < RMS_REGS; k++) {
            const int i = threadIdx.x + k * bd;
            wr[k] = i < cols ? w[i] : 0.0f;
        }
        pdl_enter<PDL_E_NORM>();
        TRACE_WAITED(TRACE_NORM);
        float v[RMS_REGS];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < RMS_REGS; k++) {
            const int i = threadIdx.x + k * bd;
            v[k] = i < cols ? x[base + i] : 0.0f;
            ss += v[k] * v[k];
        }
        ss = block_sum(ss);
        const float s = rsqrtf(ss / cols + eps);
        const bool split = gridDim.y > 1;
#pragma unroll
        for (int k = 0; k < RMS_REGS; k++) {
            // block-uniform: this block's pass only when split
            if (split && k != (int)blockIdx.y) continue;
            const int i = threadIdx.x + k * bd;
            // warp-uniform: cols and blockDim.x are multiples of 32
            float o = 0.0f;
            if (i < cols) {
                o = v[k] * s * wr[k];
                out[base + i] = o;
                q8_1_unit(o, xq, xds, base + i, (base + i) / 32);
            }
            // block-uniform: every thread runs the same k
            if (kq && k * bd < cols) q8_k_unit_block(o, i < cols, kq, kdy, kbs, blockIdx.x, i, gridDim.x);
        }
        return;
    }
    pdl_enter<PDL_E_NORM>();
    TRACE_WAITED(TRACE_NORM);
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += bd) {
        const float v = x[base + i];
        ss += v * v;
    }
    ss = block_sum(ss);
    const float s = rsqrtf(ss / cols + eps);
    for (int i = threadIdx.x; i < cols; i += bd) {
        const float v = x[base + i] * s * w[i];
        out[base + i] = v;
        q8_1_unit(v, xq, xds, base + i, (base + i) / 32);
    }
}

// mo_group_rms_norm (with or without the gate z) plus the q8_1 copy of out, for groups of a
// multiple of 32 values and blockDim.x == group (the block size the separate kernel gets for
// such groups, so the squares are added in the same order): the same values and the same
// quantization as mo_group_rms_norm then quantize_q8_1, bit for bit. Rows are groups back to
// back, so unit (flat index) / 32 is the row's unit. out may alias x.
extern "C" __global__ void mo_group_rms_norm_q8(const float* x, const float* __restrict__ w,
                                                const float* __restrict__ z, float* out, int8_t* __restrict__ xq,
                                                float* __restrict__ xds, int group, float eps) {
    TRACE_SCOPE(TRACE_GNORM);
    const float w0 = w[threadIdx.x];
    pdl_enter<PDL_E_GNORM>();
    TRACE_WAITED(TRACE_GNORM);
    const long long i = (long long)blockIdx.x * group + threadIdx.x;
    const float xv = x[i];
    const float ss = block_sum(xv * xv);
    const float s = rsqrtf(ss / group + eps);
    float v = xv * s * w0;
    if (z) v *= silu_f(z[i]);
    out[i] = v;
    q8_1_unit(v, xq, xds, i, i / 32);
}

// mo_swiglu plus the q8_1 copy of out; n a multiple of 32 (rows are back to back, so unit
// i / 32 of the flat index is unit (i % cols) / 32 of row i / cols when cols % 32 == 0).
// kq non-null: the q8_K copy too (q8_k_unit_block; cols: the row length, a multiple of 256, so
// n / cols rows); needs n % 256 == 0 and blockDim.x == 256,
// so every block's pass covers one whole unit and every thread of a block loops alike.
extern "C" __global__ void mo_swiglu_q8(const float* __restrict__ g, const float* __restrict__ u, float* out,
                                        int8_t* __restrict__ xq, float* __restrict__ xds, long long n,
                                        int8_t* __restrict__ kq, float* __restrict__ kdy,
                                        int16_t* __restrict__ kbs, int cols) {
    TRACE_SCOPE(TRACE_SWIGLU);
    pdl_enter<PDL_E_SWIGLU>();
    TRACE_WAITED(TRACE_SWIGLU);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float v = silu_f(g[i]) * u[i];
        out[i] = v;
        q8_1_unit(v, xq, xds, i, i / 32);
        if (kq) q8_k_unit_block(v, true, kq, kdy, kbs, (int)(i / cols), i % cols, (int)(n / cols));
    }
}

// mo_rope of q and k in one launch: grid (n_rows, n_heads_q + n_heads_k); heads past the
// query heads rotate k.
extern "C" __global__ void mo_rope_qk(float* q, float* k, const int* __restrict__ pos, const float* __restrict__ factors,
                                      int n_heads_q, int n_heads_k, int head_dim, int n_rot, float freq_base,
                                      float freq_scale, int neox) {
    // The angles need only the positions (uploaded before the step's first kernel) and the
    // frequency factors (weights): computed before the wait (REDLINE_PDL), so the f64 pow / sin
    // / cos chain overlaps the previous kernel instead of following it.
    const float p = (float)pos[blockIdx.x];
    const int half = n_rot / 2;
    auto angle = [&](int i, float& c, float& s) { rope_cos_sin(p, i, n_rot, freq_base, freq_scale, factors, c, s); };
    float c0 = 1.0f, s0 = 0.0f;
    if ((int)threadIdx.x < half) angle(threadIdx.x, c0, s0);
    pdl_wait();
    pdl_trigger();
    const bool is_q = (int)blockIdx.y < n_heads_q;
    float* h = is_q ? q + ((long long)blockIdx.x * n_heads_q + blockIdx.y) * head_dim
                    : k + ((long long)blockIdx.x * n_heads_k + (blockIdx.y - n_heads_q)) * head_dim;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c = c0, s = s0;
        if (i != (int)threadIdx.x) angle(i, c, s);
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + half : 2 * i + 1;
        const float a = h[i0], b = h[i1];
        rope_rotate(a, b, c, s, h[i0], h[i1]);
    }
}

// The query / key preparation of an attention block for any number of rows in one launch
// (StagedFusions::attn_rows): for each row and head, the query head copied out of a strided q
// (and its gate head, Qwen3.5's gated attention, into `gate`), the per-head RMS norm (qw / kw,
// or none), RoPE — what mo_copy_cols, mo_group_rms_norm (one head per block of head_dim
// threads) and mo_rope_qk compute, with the same expressions and the same block sum, so the
// same bits. grid (n_rows, n_heads_q + n_heads_k), block head_dim threads (a multiple of 32,
// <= 1024); q: rows of n_heads_q * q_stride (head h at h * q_stride, its gate at + gate_off
// when gate is not null), qo: rows of n_heads_q * head_dim (may be q itself when q_stride ==
// head_dim), k: rows of n_heads_k * head_dim, in place.
extern "C" __global__ void mo_attn_prep_rows(const float* q, float* qo, float* __restrict__ gate, float* k,
                                             const float* __restrict__ qw, const float* __restrict__ kw,
                                             const int* __restrict__ pos, const float* __restrict__ factors,
                                             int n_heads_q, int n_heads_k, int head_dim, int q_stride, int gate_off,
                                             int dv, int n_rot, float freq_base, float freq_scale, int neox,
                                             float eps) {
    __shared__ float hs[1024];
    const int i = threadIdx.x, r = blockIdx.x;
    const bool is_q = (int)blockIdx.y < n_heads_q;
    const int h = is_q ? blockIdx.y : blockIdx.y - n_heads_q;
    const float* w = is_q ? qw : kw;
    // weights and angles before the wait (REDLINE_PDL), as mo_group_rms_norm and mo_rope_qk
    const float w0 = w ? w[i] : 0.0f;
    const float p = (float)pos[r];
    const int half = n_rot / 2;
    float c = 1.0f, sn = 0.0f;
    if (i < half) rope_cos_sin(p, i, n_rot, freq_base, freq_scale, factors, c, sn);
    pdl_wait();
    pdl_trigger();
    const float* src = is_q ? q + ((long long)r * n_heads_q + h) * q_stride : k + ((long long)r * n_heads_k + h) * head_dim;
    float* dst = is_q ? qo + ((long long)r * n_heads_q + h) * head_dim : k + ((long long)r * n_heads_k + h) * head_dim;
    float v = src[i];
    if (is_q && gate)
        for (int j = i; j < dv; j += blockDim.x) gate[((long long)r * n_heads_q + h) * dv + j] = src[gate_off + j];
    if (w) {
        const float ss = block_sum(v * v);
        const float s = rsqrtf(ss / head_dim + eps);
        v = v * s * w0;
    }
    hs[i] = v;
    __syncthreads();
    if (i < half) {
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + half : 2 * i + 1;
        const float a = hs[i0], b = hs[i1];
        rope_rotate(a, b, c, sn, hs[i0], hs[i1]);
    }
    __syncthreads();
    dst[i] = hs[i];
}

// ---- one-token products of small f32 matrices (decode fusion) --------------------------------

// y_s = W_s x for up to F32_MAX_SEGS f32 matrices [nrows_s, cols] that share x [n_tokens, cols]
// (1..=F32_MAX_TOKENS tokens: decode, batched decode, verify passes), one block per row, float4
// loads (cols % 4 == 0) all in flight, the row read once for every token: the DeltaNet
// alpha/beta projections (48 x 5120 f32) took 13 us each as one warp per row on 12 blocks.
// y of token t is y + t * nrows.
#define F32_MAX_SEGS 4
#define F32_MAX_TOKENS 8
struct alignas(16) f32x4 {
    float x, y, z, w;
};
struct F32Seg {
    const float* W;
    float* y;
    int nrows;
    int block0;
};
struct F32Segs {
    F32Seg seg[F32_MAX_SEGS];
    int n_segs;
    int cols;
    int n_tokens;
};

// Row `blk` of the segments, every token's, on a block of 256 threads. BIT: the PDL bit of the
// launch (pdl_enter), TAG: its trace tag.
#define F32_PRE 8
template <int BIT, int TAG>
static __device__ __forceinline__ void f32_rows_block(const F32Segs& p, const float* __restrict__ x, int blk) {
    const float* W = p.seg[0].W;
    float* y = p.seg[0].y;
    int block0 = 0, nrows = p.seg[0].nrows;
#pragma unroll
    for (int s = 1; s < F32_MAX_SEGS; s++) {
        if (s < p.n_segs && blk >= p.seg[s].block0) {
            W = p.seg[s].W;
            y = p.seg[s].y;
            block0 = p.seg[s].block0;
            nrows = p.seg[s].nrows;
        }
    }
    const int row = blk - block0;
    const int n4 = p.cols / 4;
    const int nt = min(p.n_tokens, F32_MAX_TOKENS);
    const f32x4* wr = (const f32x4*)(W + (long long)row * p.cols);
    const f32x4* x4 = (const f32x4*)x;
    float acc[F32_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < F32_MAX_TOKENS; t++) acc[t] = 0.0f;
    // the row's first F32_PRE vectors per thread before the wait (REDLINE_PDL): weights, so
    // their DRAM round trip overlaps the previous kernel (a 5120-wide row on 256 threads is 5)
    f32x4 pre[F32_PRE];
#pragma unroll
    for (int k = 0; k < F32_PRE; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        pre[k] = i < n4 ? wr[i] : f32x4{0.0f, 0.0f, 0.0f, 0.0f};
    }
    pdl_enter<BIT>();
    TRACE_WAITED(TAG);
    // acc[t] += row vector i . x_t vector i
    auto dot = [&](const f32x4 a, int i) {
#pragma unroll
        for (int t = 0; t < F32_MAX_TOKENS; t++) {
            if (t < nt) {
                const f32x4 b = x4[(long long)t * n4 + i];
                acc[t] += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
        }
    };
#pragma unroll
    for (int k = 0; k < F32_PRE; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4) dot(pre[k], i);
    }
#pragma unroll 4
    for (int i = threadIdx.x + F32_PRE * blockDim.x; i < n4; i += blockDim.x) dot(wr[i], i);
#pragma unroll
    for (int t = 0; t < F32_MAX_TOKENS; t++) {
        if (t < nt) {
            const float s = block_sum(acc[t]);
            if (threadIdx.x == 0) y[(long long)t * nrows + row] = s;
        }
    }
}

// grid (rows of all segments), block 256.
extern "C" __global__ void mo_matvec_f32_rows(const F32Segs p, const float* __restrict__ x) {
    TRACE_SCOPE(TRACE_F32ROWS);
    f32_rows_block<PDL_E_F32, TRACE_F32ROWS>(p, x, blockIdx.x);
}

// mo_conv1d_qkv and mo_matvec_f32_rows in one launch (CudaBackend::in_proj_conv1d_qkv; session
// 37): Gated DeltaNet's alpha / beta projections, which only the delta rule after the conv
// reads, ride in the conv's launch instead of a launch of their own between the in-projection
// and the conv (session 36's timeline: ~3.1 µs of run and ~0.9 µs of release a DeltaNet layer).
// grid (ch / 256 + the segments' rows, n_seqs), block 256 (mo_matvec_f32_rows' block; the host
// checks ch % 256 == 0, norm_cols % 256 == 0 and a norm group of 32..256 threads dividing 256).
// Blocks below ch / 256 are mo_conv1d_qkv's work for 256 channels, each norm group summed by
// group_sum (block_sum's order for a block of the group); the others, in grid row 0, are
// mo_matvec_f32_rows' blocks, row blockIdx.x - ch / 256, for every token of gx: the same bits.
// (A first version on the norm group's 128 threads, two of the rows' 256 threads per thread,
// lost 1.6-2.3 % on the 27B: its rows ran 5 µs against 3.1.)
extern "C" __global__ void __launch_bounds__(256)
    mo_conv1d_qkv_gates(const float* __restrict__ x, const float* __restrict__ w, const int* __restrict__ rows,
                        float* state, int ch, int d_conv, const int* __restrict__ runs,
                        const unsigned long long* __restrict__ tab, int norm_cols, int group, float eps, float* o0,
                        float* o1, float* o2, int off1, int off2, int w0, int w1, int w2, const F32Segs gp,
                        const float* __restrict__ gx) {
    const int n_conv = ch / blockDim.x;
    if ((int)blockIdx.x < n_conv) {
        TRACE_SCOPE(TRACE_CONV);
        conv1d_qkv_block(x, w, rows, state, ch, d_conv, runs, tab, norm_cols, group, eps, o0, o1, o2, off1, off2, w0,
                         w1, w2);
        return;
    }
    if (blockIdx.y != 0) return;
    TRACE_SCOPE(TRACE_F32ROWS);
    f32_rows_block<PDL_E_CONV, TRACE_F32ROWS>(gp, gx, (int)blockIdx.x - n_conv);
}

// ---- split of a fused projection into several tensors (decode fusion) ------------------------

// dst_i[r][c] = src[r][off_i + c], c < width_i, for up to SPLIT_MAX_SEGS destinations in one
// launch (the DeltaNet conv output into q, k, v: three copy launches before).
#define SPLIT_MAX_SEGS 4
struct SplitSeg {
    float* dst;
    int src_off;
    int width;
};
struct SplitSegs {
    SplitSeg seg[SPLIT_MAX_SEGS];
    int n_segs;
    int src_cols;
    int n_rows;
    int total;  // sum of the widths
};

extern "C" __global__ void mo_split_cols(const SplitSegs p, const float* __restrict__ src) {
    pdl_wait();
    pdl_trigger();
    const long long n = (long long)p.n_rows * p.total;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x) {
        const long long r = t / p.total;
        int c = (int)(t % p.total);
        float* dst = p.seg[0].dst;
        int off = p.seg[0].src_off, width = p.seg[0].width;
#pragma unroll
        for (int s = 1; s < SPLIT_MAX_SEGS; s++) {
            if (s < p.n_segs && c >= width) {
                c -= width;
                dst = p.seg[s].dst;
                off = p.seg[s].src_off;
                width = p.seg[s].width;
            }
        }
        dst[r * width + c] = src[r * p.src_cols + off + c];
    }
}

// grid G, block 32: the next products' weights toward L2 (CudaBackend::prefetch), launched on
// a side stream so nothing in the step waits for it (a grid counts as done only once its bulk
// prefetches have landed, and one SM's engine moves them at a few hundred GB/s: issued from the
// chain's own kernels they held the chain up, session 34). Piece c is thread c % (32 G)'s,
// spread over the blocks first.
extern "C" __global__ void mo_l2_prefetch(uint64_t p0, uint64_t n0, uint64_t p1, uint64_t n1) {
    l2_prefetch2(p0, n0, p1, n1, threadIdx.x * gridDim.x + blockIdx.x, gridDim.x * blockDim.x);
}
