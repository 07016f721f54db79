// bandwidth.cu — read-only streaming reduction to measure achievable DRAM read bandwidth.
//
// p: n16 16-byte vectors; every thread XOR-folds its grid-stride share (4 independent loads in
// flight per iteration) and writes one word per block to `out` so the reads cannot be elided.
#include "common.cuh"

struct alignas(16) bw_vec {
    uint32_t x, y, z, w;
};

extern "C" __global__ void bandwidth_read(const bw_vec* __restrict__ p, long long n16, uint32_t* __restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const bw_vec a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const bw_vec a = p[i];
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(FULL_MASK, acc, o);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}
