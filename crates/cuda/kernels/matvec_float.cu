// matvec_float.cu — y = W x for F32 / F16 / BF16 weights (no activation quantization).
//
// W: [nrows, ncols] row-major as stored in GGUF; x: [n_tokens, ncols] f32;
// y: [n_tokens, nrows] f32. One warp per row; when ncols % 8 == 0 each lane reads 8 weights
// per step with 16-byte loads (2 for f32), else a scalar path. Weights read once for all
// n_tokens <= NT tokens. BF16 is widened by a shift (no bf16 math: V100 has none).
#include "common.cuh"

struct alignas(16) f32x4 {
    float x, y, z, w;
};
struct alignas(16) u32x4f {
    uint32_t x, y, z, w;
};

#define MVF_WARPS 4

struct WF32 {
    static constexpr int ELEM_BYTES = 4;
    static __device__ __forceinline__ void load8(const uint8_t* p, float w[8]) {
        const f32x4 a = ((const f32x4*)p)[0], b = ((const f32x4*)p)[1];
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
        w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    }
    static __device__ __forceinline__ float load1(const uint8_t* p) { return *(const float*)p; }
};

struct WF16 {
    static constexpr int ELEM_BYTES = 2;
    static __device__ __forceinline__ void load8(const uint8_t* p, float w[8]) {
        const u32x4f a = *(const u32x4f*)p;
        const uint32_t h[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = f16_to_f32((uint16_t)(h[i] & 0xFFFF));
            w[2 * i + 1] = f16_to_f32((uint16_t)(h[i] >> 16));
        }
    }
    static __device__ __forceinline__ float load1(const uint8_t* p) { return f16_to_f32(*(const uint16_t*)p); }
};

struct WBF16 {
    static constexpr int ELEM_BYTES = 2;
    static __device__ __forceinline__ void load8(const uint8_t* p, float w[8]) {
        const u32x4f a = *(const u32x4f*)p;
        const uint32_t h[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            w[2 * i] = __uint_as_float(h[i] << 16);
            w[2 * i + 1] = __uint_as_float(h[i] & 0xFFFF0000u);
        }
    }
    static __device__ __forceinline__ float load1(const uint8_t* p) { return bf16_to_f32(*(const uint16_t*)p); }
};

template <typename F, int NT>
static __device__ __forceinline__ void mv_float(const uint8_t* __restrict__ W, const float* __restrict__ x,
                                                float* __restrict__ y, int nrows, int ncols, int n_tokens) {
    const int lane = threadIdx.x;
    const int row = blockIdx.x * MVF_WARPS + threadIdx.y;
    if (row >= nrows) return;
    const uint8_t* wr = W + (long long)row * ncols * F::ELEM_BYTES;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    if ((ncols & 7) == 0) {
        for (int c = 8 * lane; c < ncols; c += 256) {
            float w[8];
            F::load8(wr + (long long)c * F::ELEM_BYTES, w);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n_tokens) {
                    const f32x4* xp = (const f32x4*)(x + (long long)t * ncols + c);
                    const f32x4 a = xp[0], b = xp[1];
                    acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y +
                              w[6] * b.z + w[7] * b.w;
                }
            }
        }
    } else {
        for (int c = lane; c < ncols; c += 32) {
            const float w = F::load1(wr + (long long)c * F::ELEM_BYTES);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < n_tokens) acc[t] += w * x[(long long)t * ncols + c];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < n_tokens) y[(long long)t * nrows + row] = s;
    }
}

#define MVF_KERNEL(name, F, NT)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * MVF_WARPS)                                      \
        mv_##name##_n##NT(const uint8_t* __restrict__ W, const float* __restrict__ x,                 \
                          float* __restrict__ y, int nrows, int ncols, int n_tokens) {                \
        mv_float<F, NT>(W, x, y, nrows, ncols, n_tokens);                                             \
    }
#define MVF_FORMAT(name, F) MVF_KERNEL(name, F, 1) MVF_KERNEL(name, F, 2) MVF_KERNEL(name, F, 4) MVF_KERNEL(name, F, 8)

MVF_FORMAT(f32, WF32)
MVF_FORMAT(f16, WF16)
MVF_FORMAT(bf16, WBF16)
