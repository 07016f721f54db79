// deltanet.cu — Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention) on the GPU: the causal
// conv1d over a run of tokens, the token-by-token gated delta rule (decode, short runs) and the
// chunked delta rule (prefill). The Rust side is crates/cuda/src/backend/recurrent.rs.
//
// Per value head h (key head h % n_k_heads) with state S [d_v, d_k] f32 (row j maps keys to
// value component j; the layout of CudaRecurrentState), for each token:
//   S <- exp(g) S;  u = beta (v - S k);  S <- S + u k^T;  o = S q / sqrt(d_k)
//
// Chunked form (flash-linear-attention's chunk_gated_delta_rule; our derivation in
// crates/backend/src/cpu/delta_net.rs). Per chunk of C tokens with G_t the cumulative log
// decay inside the chunk (G_t <= 0, every exponent below is <= 0) and S0 the state before it:
//   A[t][s]  = beta_t exp(G_t - G_s) (k_t . k_s)               s < t   (strictly lower)
//   (I + A) W = beta exp(G) k      (I + A) U = beta v           (forward substitution)
//   Vn  = U - W S0^T                                            [C, d_v] ("new values")
//   o_t = exp(G_t) S0 q_t / sqrt(d_k) + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) / sqrt(d_k) Vn_s
//   S   = exp(G_C) S0 + sum_s exp(G_C - G_s) Vn_s k_s^T
// dn_chunk_prepare computes A, W, U and the masked, decayed q.k matrix for every (chunk, head)
// at once (no dependence between chunks); dn_chunk_state then walks the chunks in order per
// (head, slice of d_v rows), holding the state slice in shared memory. Everything is f32 FMA
// (tf32 tensor cores would cost ~1e-3 relative error; the products here are small).
//
// Rows of the run are given by index (`rows`): row t of the run is row rows[t] of q/k/v/g/beta
// and out, so one sequence's rows need not be adjacent in the batch.

#include "common.cuh"

// ---- conv1d -----------------------------------------------------------------------------------

// Largest conv kernel (d_conv <= 16: the window array of dn_conv1d_state). Both kernels may be
// launched with programmatic serialization (REDLINE_PDL).
#define DN_CONV_MAX 16

// Thread per (token, channel): out[t][c] = sum_j w[c][j] x_{t-(d_conv-1)+j}[c], inputs before the
// run from the window `state` [d_conv-1, ch] (oldest first). grid (ceil(ch/256), <= n_rows).
extern "C" __global__ void dn_conv1d_out(const float* __restrict__ x, const float* __restrict__ w,
                                         const int* __restrict__ rows, int n_rows,
                                         const float* __restrict__ state, float* __restrict__ out, int ch,
                                         int d_conv) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    // the taps before the wait (REDLINE_PDL): weights, never written by a kernel
    float wt[DN_CONV_MAX];
#pragma unroll
    for (int j = 0; j < DN_CONV_MAX; j++) wt[j] = c < ch && j < d_conv ? w[(long long)c * d_conv + j] : 0.0f;
    pdl_wait();
    pdl_trigger();
    if (c >= ch) return;
    const int nw = d_conv - 1;
    for (int t = blockIdx.y; t < n_rows; t += gridDim.y) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < DN_CONV_MAX; j++) {
            if (j >= d_conv) break;
            const int i = t - nw + j;  // run index of the input this tap reads
            const float xv = i >= 0 ? x[(long long)rows[i] * ch + c] : state[(long long)(nw + i) * ch + c];
            s += wt[j] * xv;
        }
        out[(long long)rows[t] * ch + c] = s;
    }
}

// Thread per channel: the window after the run (the last d_conv-1 inputs). Runs after
// dn_conv1d_out, which reads the old window.
extern "C" __global__ void dn_conv1d_state(const float* __restrict__ x, const int* __restrict__ rows, int n_rows,
                                           float* state, int ch, int d_conv) {
    pdl_wait();
    pdl_trigger();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    const int nw = d_conv - 1;
    float win[16];
    for (int m = 0; m < nw && m < 16; m++) {
        const int i = n_rows - nw + m;
        win[m] = i >= 0 ? x[(long long)rows[i] * ch + c] : state[(long long)(nw + i) * ch + c];
    }
    for (int m = 0; m < nw && m < 16; m++) state[(long long)m * ch + c] = win[m];
}

// ---- token-by-token delta rule (decode and short runs) -----------------------------------------

#define DN_REC_K 8      // most key values per lane: d_k <= 256
#define DN_REC_ROWS 4   // state rows per warp (share the k and q loads)
#define DN_REC_WARPS 4  // warps per block

// grid (n_v_heads, ceil(d_v / (DN_REC_ROWS * DN_REC_WARPS)), n_seqs), block (32, DN_REC_WARPS).
// A warp keeps DN_REC_ROWS rows of S_h in registers (lane holds keys lane + 32 e) for the whole
// run: the state is read and written once per launch, and every load is coalesced.
// tab null: one sequence, its rows[0 .. n_rows) and `state`. Else the runs of several
// sequences in one launch: sequence z = blockIdx.z owns rows[runs[z] .. runs[z + 1]) and the
// state at tab[z] (state and n_rows unused).
// dt_bias null: g is the log decay and beta the sigmoid already (`mo_delta_gates` ran). Else g
// and beta are the raw projections and the gates are computed here (a_gate = GGUF `ssm_a`):
// one launch fewer per Gated DeltaNet layer.
// The state is loaded before the wait (REDLINE_PDL): only this kernel writes it, in earlier
// steps or calls, and those have finished; rows, runs and tab come from the host. So its
// ~3 MB per Qwen3.5-27B layer stream in while the kernels before this one drain.
// gn_w non-null (the host's staged `dn_norm` fusion; Qwen3.5's gated group norm of the
// rule's output, then its q8_1 copy for the out-projection): the last of a head's gridDim.y
// blocks to finish (a counter per (sequence, head) in gn_cnt, zero between launches: that
// block sets it back) normalizes the head's d_v values of every row of the run, as
// mo_group_rms_norm_q8 does with one block of group = d_v = 128 threads (the host checks): the
// same loads, sum order (dn_block_sum: block_sum's for a 32 x 4 block) and expressions, so
// the same bits. Why: session 36's trace put the separate gated norm at 0.9 µs of release
// plus 1.7 µs of run (5.3 with the staged out-projection's copies in flight) a layer.
// Called by every thread of the block (the block's barriers).
static __device__ __forceinline__ float dn_ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
// block_sum (model_ops.cu) of a DN_REC_WARPS x 32 block: warp sums, then added in warp order
static __device__ __forceinline__ float dn_block_sum(float v) {
    __shared__ float partial[DN_REC_WARPS];
    v = warp_sum(v);
    __syncthreads();
    if (threadIdx.x == 0) partial[threadIdx.y] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < DN_REC_WARPS; i++) t += partial[i];
    return t;
}
static __device__ __forceinline__ void dn_gated_norm_tail(float* out, const int* __restrict__ rows, int n_rows, int h,
                                                          int n_v_heads, int d_v, const float* __restrict__ w,
                                                          const float* __restrict__ z, float eps, int8_t* xq,
                                                          float* xds, unsigned int* cnt) {
    __shared__ unsigned int last;
    // this block's outputs (lane 0 of each warp wrote them) visible device-wide before its count
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        unsigned int* c = cnt + (long long)blockIdx.z * gridDim.x + h;
        const unsigned int prev = atomicAdd(c, 1u);
        last = prev == gridDim.y - 1;
        if (last) *c = 0u;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int tid = threadIdx.y * 32 + threadIdx.x;  // the group's element (d_v == blockDim)
    const float w0 = w[tid];
    const long long v_stride = (long long)n_v_heads * d_v;
    for (int t = 0; t < n_rows; t++) {
        const long long i = (long long)rows[t] * v_stride + (long long)h * d_v + tid;
        const float xv = dn_ld_cg(out + i);
        const float ss = dn_block_sum(xv * xv);
        const float sc = rsqrtf(ss / d_v + eps);
        float v = xv * sc * w0;
        v *= silu_f(z[i]);
        out[i] = v;
        q8_1_unit(v, xq, xds, i, i / 32);
    }
}

extern "C" __global__ void __launch_bounds__(32 * DN_REC_WARPS)
dn_recurrent(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
             const float* __restrict__ g, const float* __restrict__ beta, const int* __restrict__ rows,
             int n_rows, float* state, float* __restrict__ out, int n_k_heads, int n_v_heads, int d_k,
             int d_v, const int* __restrict__ runs, const unsigned long long* __restrict__ tab,
             const float* __restrict__ dt_bias, const float* __restrict__ a_gate, const float* __restrict__ gn_w,
             const float* __restrict__ gn_z, float gn_eps, int8_t* __restrict__ gn_xq, float* __restrict__ gn_xds,
             unsigned int* __restrict__ gn_cnt) {
    TRACE_SCOPE(TRACE_DELTA);
    if (tab) {
        const int z = blockIdx.z;
        rows += runs[z];
        n_rows = runs[z + 1] - runs[z];
        state = (float*)tab[z];
    }
    const int h = blockIdx.x;
    const int kh = h % n_k_heads;
    const int lane = threadIdx.x;
    const int j0 = (blockIdx.y * DN_REC_WARPS + threadIdx.y) * DN_REC_ROWS;
    if (j0 >= d_v) return;
    // raw gates (dt_bias set): this head's gate weights, read-only, before the wait too
    const float dtb = dt_bias ? dt_bias[h] : 0.0f, ag = dt_bias ? a_gate[h] : 0.0f;
    const float qscale = rsqrtf((float)d_k);
    float s[DN_REC_ROWS][DN_REC_K];
#pragma unroll
    for (int r = 0; r < DN_REC_ROWS; r++) {
#pragma unroll
        for (int e = 0; e < DN_REC_K; e++) {
            const int col = lane + 32 * e;
            s[r][e] = (j0 + r < d_v && col < d_k) ? state[((long long)h * d_v + j0 + r) * d_k + col] : 0.0f;
        }
    }
    pdl_enter<PDL_E_DELTA>();
    TRACE_WAITED(TRACE_DELTA);
    const long long qk_stride = (long long)n_k_heads * d_k;
    const long long v_stride = (long long)n_v_heads * d_v;
    for (int t = 0; t < n_rows; t++) {
        const long long row = rows[t];
        float kk[DN_REC_K], qq[DN_REC_K];
#pragma unroll
        for (int e = 0; e < DN_REC_K; e++) {
            const int col = lane + 32 * e;
            kk[e] = col < d_k ? k[row * qk_stride + (long long)kh * d_k + col] : 0.0f;
            qq[e] = col < d_k ? q[row * qk_stride + (long long)kh * d_k + col] : 0.0f;
        }
        float lg = g[row * n_v_heads + h], b = beta[row * n_v_heads + h];
        if (dt_bias) {
            // mo_delta_gates' expressions, in the same order: the same bits as the two launches
            const float x = lg + dtb;
            const float sp = x > 20.0f ? x : log1pf(expf(x));
            lg = sp * ag;
            b = sigmoid_f(b);
        }
        const float decay = expf(lg);
#pragma unroll
        for (int r = 0; r < DN_REC_ROWS; r++) {
            float kv = 0.0f;
#pragma unroll
            for (int e = 0; e < DN_REC_K; e++) {
                s[r][e] *= decay;
                kv += s[r][e] * kk[e];
            }
            kv = warp_sum(kv);
            const int j = j0 + r;
            const float vj = j < d_v ? v[row * v_stride + (long long)h * d_v + j] : 0.0f;
            const float delta = b * (vj - kv);
            float o = 0.0f;
#pragma unroll
            for (int e = 0; e < DN_REC_K; e++) {
                s[r][e] += delta * kk[e];
                o += s[r][e] * qq[e];
            }
            o = warp_sum(o);
            if (lane == 0 && j < d_v) out[row * v_stride + (long long)h * d_v + j] = o * qscale;
        }
    }
#pragma unroll
    for (int r = 0; r < DN_REC_ROWS; r++) {
#pragma unroll
        for (int e = 0; e < DN_REC_K; e++) {
            const int col = lane + 32 * e;
            if (j0 + r < d_v && col < d_k) state[((long long)h * d_v + j0 + r) * d_k + col] = s[r][e];
        }
    }
    if (gn_w) dn_gated_norm_tail(out, rows, n_rows, h, n_v_heads, d_v, gn_w, gn_z, gn_eps, gn_xq, gn_xds, gn_cnt);
}

// ---- chunked delta rule (prefill) --------------------------------------------------------------

#define DN_C 64          // tokens per chunk
#define DN_KT 32         // key columns per shared tile
#define DN_J 32          // state rows (value components) per dn_chunk_state block
#define DN_MAX_DK 128    // largest d_k of the chunked path
#define DN_THREADS 256

// Scratch layout for a run of n tokens, np = n_chunks * DN_C, per value head h:
//   W   [h][np][d_k]      U [h][np][d_v]
//   Aqk [h][n_chunks][DN_C][DN_C]   (exp(G_t - G_s) q_t.k_s / sqrt(d_k), s <= t, else 0)
//   G   [h][np]           (cumulative log decay inside the chunk; padding repeats the last)

// grid (n_chunks, n_v_heads), block DN_THREADS.
extern "C" __global__ void __launch_bounds__(DN_THREADS)
dn_chunk_prepare(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                 const float* __restrict__ g, const float* __restrict__ beta, const int* __restrict__ rows,
                 int n_rows, float* __restrict__ w_out, float* __restrict__ u_out, float* __restrict__ aqk_out,
                 float* __restrict__ g_out, int n_k_heads, int n_v_heads, int d_k, int d_v) {
    __shared__ float kt[DN_C][DN_KT + 1];
    __shared__ float qt[DN_C][DN_KT + 1];
    __shared__ float a[DN_C][DN_C];
    __shared__ float gc[DN_C];
    __shared__ float bt[DN_C];
    __shared__ int rid[DN_C];

    const int chunk = blockIdx.x;
    const int h = blockIdx.y;
    const int kh = h % n_k_heads;
    const int tid = threadIdx.x;
    const int t0 = chunk * DN_C;
    const int nc = min(DN_C, n_rows - t0);
    const int np = gridDim.x * DN_C;
    const long long qk_stride = (long long)n_k_heads * d_k;
    const long long v_stride = (long long)n_v_heads * d_v;
    const float qscale = rsqrtf((float)d_k);

    if (tid < DN_C) {
        const bool ok = tid < nc;
        const int r = ok ? rows[t0 + tid] : 0;
        rid[tid] = r;
        gc[tid] = ok ? g[(long long)r * n_v_heads + h] : 0.0f;
        bt[tid] = ok ? beta[(long long)r * n_v_heads + h] : 0.0f;
    }
    __syncthreads();
    if (tid == 0) {
        // Sequential f32 sum, as the CPU reference.
        float acc = 0.0f;
        for (int t = 0; t < DN_C; t++) {
            acc += gc[t];
            gc[t] = acc;
        }
    }
    __syncthreads();
    if (tid < DN_C) g_out[(long long)h * np + t0 + tid] = gc[tid];

    // k_t . k_s and q_t . k_s over key tiles. Thread owns t = ti + 16 a, s = si + 16 b.
    const int ti = tid / 16, si = tid % 16;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int x = 0; x < 4; x++)
#pragma unroll
        for (int y = 0; y < 4; y++) kk[x][y] = qk[x][y] = 0.0f;
    for (int k0 = 0; k0 < d_k; k0 += DN_KT) {
        for (int e = tid; e < DN_C * DN_KT; e += DN_THREADS) {
            const int t = e / DN_KT, c = e % DN_KT;
            const bool ok = t < nc && k0 + c < d_k;
            const long long off = (long long)rid[t] * qk_stride + (long long)kh * d_k + k0 + c;
            kt[t][c] = ok ? k[off] : 0.0f;
            qt[t][c] = ok ? q[off] : 0.0f;
        }
        __syncthreads();
#pragma unroll 4
        for (int c = 0; c < DN_KT; c++) {
            float kr[4], qr[4], ks[4];
#pragma unroll
            for (int x = 0; x < 4; x++) {
                kr[x] = kt[ti + 16 * x][c];
                qr[x] = qt[ti + 16 * x][c];
                ks[x] = kt[si + 16 * x][c];
            }
#pragma unroll
            for (int x = 0; x < 4; x++)
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    kk[x][y] += kr[x] * ks[y];
                    qk[x][y] += qr[x] * ks[y];
                }
        }
        __syncthreads();
    }
    float* aqk = aqk_out + ((long long)h * gridDim.x + chunk) * DN_C * DN_C;
#pragma unroll
    for (int x = 0; x < 4; x++)
#pragma unroll
        for (int y = 0; y < 4; y++) {
            const int t = ti + 16 * x, s = si + 16 * y;
            const float d = expf(gc[t] - gc[s]);
            a[t][s] = s < t ? bt[t] * d * kk[x][y] : 0.0f;
            aqk[t * DN_C + s] = s <= t ? d * qk[x][y] * qscale : 0.0f;
        }
    __syncthreads();

    // Forward substitution, one right-hand column per thread: columns 0..d_k-1 are
    // beta exp(G) k (-> W), d_k..d_k+d_v-1 are beta v (-> U). x[t] = b[t] - sum_{s<t} A[t][s] x[s].
    for (int col = tid; col < d_k + d_v; col += DN_THREADS) {
        const bool is_w = col < d_k;
        float xs[DN_C];
#pragma unroll
        for (int t = 0; t < DN_C; t++) {
            float b = 0.0f;
            if (t < nc) {
                const long long r = rid[t];
                b = is_w ? bt[t] * expf(gc[t]) * k[r * qk_stride + (long long)kh * d_k + col]
                         : bt[t] * v[r * v_stride + (long long)h * d_v + (col - d_k)];
            }
#pragma unroll
            for (int s = 0; s < t; s++) b -= a[t][s] * xs[s];
            xs[t] = b;
        }
        if (is_w) {
            float* dst = w_out + ((long long)h * np + t0) * d_k + col;
#pragma unroll
            for (int t = 0; t < DN_C; t++) dst[(long long)t * d_k] = xs[t];
        } else {
            float* dst = u_out + ((long long)h * np + t0) * d_v + (col - d_k);
#pragma unroll
            for (int t = 0; t < DN_C; t++) dst[(long long)t * d_v] = xs[t];
        }
    }
}

// grid (ceil(d_v / DN_J), n_v_heads), block DN_THREADS. Walks the chunks in order; the block's
// DN_J state rows stay in shared memory from the first chunk to the last.
extern "C" __global__ void __launch_bounds__(DN_THREADS)
dn_chunk_state(const float* __restrict__ q, const float* __restrict__ k, const int* __restrict__ rows,
               int n_rows, const float* __restrict__ w_in, const float* __restrict__ u_in,
               const float* __restrict__ aqk_in, const float* __restrict__ g_in, float* state,
               float* __restrict__ out, int n_k_heads, int n_v_heads, int d_k, int d_v) {
    __shared__ float ss[DN_J][DN_MAX_DK + 1];
    // Two [DN_C][DN_KT + 1] tiles, or the [DN_C][DN_C + 1] q.k matrix of the chunk.
    __shared__ float tiles[2 * DN_C * (DN_KT + 1)];
    __shared__ float vn[DN_C][DN_J + 1];
    __shared__ float gc[DN_C];
    __shared__ int rid[DN_C];
    float (*t1)[DN_KT + 1] = (float (*)[DN_KT + 1])tiles;
    float (*t2)[DN_KT + 1] = (float (*)[DN_KT + 1])(tiles + DN_C * (DN_KT + 1));
    float (*am)[DN_C + 1] = (float (*)[DN_C + 1])tiles;

    const int h = blockIdx.y;
    const int kh = h % n_k_heads;
    const int j0 = blockIdx.x * DN_J;
    const int tid = threadIdx.x;
    const int n_chunks = (n_rows + DN_C - 1) / DN_C;
    const int np = n_chunks * DN_C;
    const long long qk_stride = (long long)n_k_heads * d_k;
    const long long v_stride = (long long)n_v_heads * d_v;
    const float qscale = rsqrtf((float)d_k);
    float* st = state + ((long long)h * d_v + j0) * d_k;

    for (int e = tid; e < DN_J * DN_MAX_DK; e += DN_THREADS) {
        const int j = e / DN_MAX_DK, c = e % DN_MAX_DK;
        ss[j][c] = (j0 + j < d_v && c < d_k) ? st[(long long)j * d_k + c] : 0.0f;
    }
    // Phases 1-3: thread owns tokens t = tt, tt + 32 and rows j = 4 tj .. 4 tj + 3.
    const int tt = tid / 8, tj = tid % 8;
    // Phase 4: thread owns key column kc of the tile and rows jb + 8 y.
    const int kc = tid % 32, jb = tid / 32;

    for (int chunk = 0; chunk < n_chunks; chunk++) {
        const int t0 = chunk * DN_C;
        const int nc = min(DN_C, n_rows - t0);
        if (tid < DN_C) {
            rid[tid] = tid < nc ? rows[t0 + tid] : 0;
            gc[tid] = g_in[(long long)h * np + t0 + tid];
        }
        __syncthreads();

        // Phase 1: P = W S^T and QS = Q S^T over key tiles.
        float p[2][4], qs[2][4];
#pragma unroll
        for (int x = 0; x < 2; x++)
#pragma unroll
            for (int y = 0; y < 4; y++) p[x][y] = qs[x][y] = 0.0f;
        for (int k0 = 0; k0 < d_k; k0 += DN_KT) {
            for (int e = tid; e < DN_C * DN_KT; e += DN_THREADS) {
                const int t = e / DN_KT, c = e % DN_KT;
                const bool ok = t < nc && k0 + c < d_k;
                t1[t][c] = ok ? w_in[((long long)h * np + t0 + t) * d_k + k0 + c] : 0.0f;
                t2[t][c] = ok ? q[(long long)rid[t] * qk_stride + (long long)kh * d_k + k0 + c] : 0.0f;
            }
            __syncthreads();
#pragma unroll 4
            for (int c = 0; c < DN_KT; c++) {
                const float w0 = t1[tt][c], w1 = t1[tt + 32][c];
                const float q0 = t2[tt][c], q1 = t2[tt + 32][c];
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    const float sv = ss[4 * tj + y][k0 + c];
                    p[0][y] += w0 * sv;
                    p[1][y] += w1 * sv;
                    qs[0][y] += q0 * sv;
                    qs[1][y] += q1 * sv;
                }
            }
            __syncthreads();
        }
        // Phase 2: Vn = U - P; o starts as exp(G_t) S0 q_t / sqrt(d_k).
        float o[2][4];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const int t = tt + 32 * x;
            const float eg = expf(gc[t]) * qscale;
#pragma unroll
            for (int y = 0; y < 4; y++) {
                const int j = 4 * tj + y;
                const bool ok = t < nc && j0 + j < d_v;
                const float u = ok ? u_in[((long long)h * np + t0 + t) * d_v + j0 + j] : 0.0f;
                vn[t][j] = ok ? u - p[x][y] : 0.0f;
                o[x][y] = eg * qs[x][y];
            }
        }
        const float* aq = aqk_in + ((long long)h * n_chunks + chunk) * DN_C * DN_C;
        for (int e = tid; e < DN_C * DN_C; e += DN_THREADS) am[e / DN_C][e % DN_C] = aq[e];
        __syncthreads();
        // Phase 3: o += Aqk Vn (Aqk is zero above the diagonal).
        for (int s = 0; s <= tt + 32; s++) {
            const float a0 = am[tt][s], a1 = am[tt + 32][s];
#pragma unroll
            for (int y = 0; y < 4; y++) {
                const float vv = vn[s][4 * tj + y];
                o[0][y] += a0 * vv;
                o[1][y] += a1 * vv;
            }
        }
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const int t = tt + 32 * x;
            if (t < nc) {
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    const int j = j0 + 4 * tj + y;
                    if (j < d_v) out[(long long)rid[t] * v_stride + (long long)h * d_v + j] = o[x][y];
                }
            }
        }
        __syncthreads();
        // Phase 4: S = exp(G_C) S0 + sum_t exp(G_C - G_t) Vn_t k_t^T.
        const float glast = gc[nc - 1];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const int t = tt + 32 * x;
            const float f = expf(glast - gc[t]);
#pragma unroll
            for (int y = 0; y < 4; y++) vn[t][4 * tj + y] *= f;
        }
        const float el = expf(glast);
        for (int k0 = 0; k0 < d_k; k0 += DN_KT) {
            for (int e = tid; e < DN_C * DN_KT; e += DN_THREADS) {
                const int t = e / DN_KT, c = e % DN_KT;
                const bool ok = t < nc && k0 + c < d_k;
                t1[t][c] = ok ? k[(long long)rid[t] * qk_stride + (long long)kh * d_k + k0 + c] : 0.0f;
            }
            __syncthreads();
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int t = 0; t < nc; t++) {
                const float kv = t1[t][kc];
#pragma unroll
                for (int y = 0; y < 4; y++) acc[y] += vn[t][jb + 8 * y] * kv;
            }
#pragma unroll
            for (int y = 0; y < 4; y++) ss[jb + 8 * y][k0 + kc] = el * ss[jb + 8 * y][k0 + kc] + acc[y];
            __syncthreads();
        }
    }
    for (int e = tid; e < DN_J * DN_MAX_DK; e += DN_THREADS) {
        const int j = e / DN_MAX_DK, c = e % DN_MAX_DK;
        if (j0 + j < d_v && c < d_k) st[(long long)j * d_k + c] = ss[j][c];
    }
}
