// attention.cu — decode attention (one query token per sequence) over an f16 KV cache,
// split over the KV length (flash-decoding).
//
// q: [n_heads, head_dim] f32; k, v: [n_kv, n_kv_heads, head_dim] f16 (the cache as appended);
// grouped-query: head h reads kv head h / (n_heads / n_kv_heads). out: [n_heads, head_dim] f32.
// Phase 1 (grid (n_heads, n_splits), 4 warps): each block takes a contiguous chunk of
// positions, each warp a strided subset, with an online softmax per warp (lane l holds dims
// l, l+32, ...); the warps merge in shared memory and write (max, sum, acc[head_dim]).
// Phase 2 (grid n_heads, block 32): merges the splits. head_dim <= 256, a multiple of 32.
#include "common.cuh"

#define ATT_WARPS 4
#define ATT_MAX_DPL 8  // dims per lane: head_dim / 32 <= 8

extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS)
    attention_decode_split(const float* __restrict__ q, const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                           float* __restrict__ part_ml, float* __restrict__ part_acc, int n_kv, int n_heads,
                           int n_kv_heads, int head_dim, float scale, int chunk) {
    const int h = blockIdx.x, split = blockIdx.y;
    const int lane = threadIdx.x, warp = threadIdx.y;
    const int kvh = h / (n_heads / n_kv_heads);
    const int dpl = head_dim / 32;
    const long long pos_stride = (long long)n_kv_heads * head_dim;
    float qv[ATT_MAX_DPL], acc[ATT_MAX_DPL];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; i++) {
        qv[i] = i < dpl ? q[h * head_dim + lane + 32 * i] * scale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    const int p0 = split * chunk, p1 = min(n_kv, p0 + chunk);
    for (int p = p0 + warp; p < p1; p += ATT_WARPS) {
        const uint16_t* kp = k + p * pos_stride + kvh * head_dim;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; i++)
            if (i < dpl) s += qv[i] * f16_to_f32(kp[lane + 32 * i]);
        s = warp_sum(s);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // exp(-inf) = 0 on the first position
        const float e = expf(s - m_new);
        const uint16_t* vp = v + p * pos_stride + kvh * head_dim;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; i++)
            if (i < dpl) acc[i] = acc[i] * corr + e * f16_to_f32(vp[lane + 32 * i]);
        l = l * corr + e;
        m = m_new;
    }
    // merge the warps
    __shared__ float s_ml[ATT_WARPS][2];
    __shared__ float s_acc[ATT_WARPS][256];
    if (lane == 0) {
        s_ml[warp][0] = m;
        s_ml[warp][1] = l;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; i++)
        if (i < dpl) s_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float M = NEG_INF;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, s_ml[w][0]);
    float L = 0.0f;
    float out[ATT_MAX_DPL];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; i++) out[i] = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) {
        const float f = s_ml[w][1] > 0.0f ? expf(s_ml[w][0] - M) : 0.0f;
        L += s_ml[w][1] * f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; i++)
            if (i < dpl) out[i] += s_acc[w][lane + 32 * i] * f;
    }
    const long long pi = (long long)h * gridDim.y + split;
    if (lane == 0) {
        part_ml[2 * pi] = M;
        part_ml[2 * pi + 1] = L;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; i++)
        if (i < dpl) part_acc[pi * head_dim + lane + 32 * i] = out[i];
}

extern "C" __global__ void attention_decode_merge(const float* __restrict__ part_ml, const float* __restrict__ part_acc,
                                                  float* __restrict__ out, int n_splits, int head_dim) {
    const int h = blockIdx.x, lane = threadIdx.x;
    const int dpl = head_dim / 32;
    float M = NEG_INF;
    for (int s = 0; s < n_splits; s++) {
        const long long pi = (long long)h * n_splits + s;
        if (part_ml[2 * pi + 1] > 0.0f) M = fmaxf(M, part_ml[2 * pi]);
    }
    float L = 0.0f, acc[ATT_MAX_DPL];
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; i++) acc[i] = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        const long long pi = (long long)h * n_splits + s;
        const float ls = part_ml[2 * pi + 1];
        if (ls <= 0.0f) continue;
        const float f = expf(part_ml[2 * pi] - M);
        L += ls * f;
#pragma unroll
        for (int i = 0; i < ATT_MAX_DPL; i++)
            if (i < dpl) acc[i] += part_acc[pi * head_dim + lane + 32 * i] * f;
    }
#pragma unroll
    for (int i = 0; i < ATT_MAX_DPL; i++)
        if (i < dpl) out[(long long)h * head_dim + lane + 32 * i] = acc[i] / L;
}
