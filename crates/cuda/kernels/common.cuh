// common.cuh — shared device helpers for every redline kernel.
//
// Kernels are compiled by NVRTC at run time with no CUDA headers at all (the NVRTC wheel in CI
// and a bare driver install at run time have none), so the few types and intrinsics we need are
// written here: fixed-width integers, f16/bf16 -> f32 via PTX `cvt`, `dp4a`, `prmt`.
// Everything must compile for compute_70 (V100): sm_80+ instructions only behind __CUDA_ARCH__.
#pragma once

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef unsigned long long uintptr_t;

#define WARP_SIZE 32
#define NEG_INF __int_as_float(0xff800000)
#define FULL_MASK 0xffffffffu

// Programmatic dependent launch (sm_90+; decode fusion, REDLINE_PDL): a kernel launched with the
// programmatic-serialization attribute may start while the previous kernel drains. It must call
// pdl_wait() before reading anything earlier kernels wrote (or writing anything they read);
// work before it may only touch read-only data (weights). Both are no-ops without the attribute
// and compile to nothing below sm_90.
static __device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// pdl_enter<BIT>(): the wait, then the trigger, as every other kernel does. With bit BIT of
// REDLINE_PDL_EARLY set, the trigger comes first, so the kernel after this one may start while
// the one before it still runs: two kernels of lookahead instead of one, and the next
// product's pre-wait work (the staged out / o projections, REDLINE_MV_STAGE) overlaps a whole
// chain of small kernels (the dependent still waits for this kernel to complete, which follows
// this kernel's own wait, so the order of the writes is unchanged). Bits: PDL_E_CONV 1 (conv1d
// qkv), PDL_E_DELTA 2 (dn_recurrent), PDL_E_GNORM 4 (gated norm), PDL_E_NORM 8 (RMS norm),
// PDL_E_SWIGLU 16, PDL_E_ATTN 32 (fused decode attention and its merge), PDL_E_F32 64 (the f32
// alpha/beta rows). Default 39: the DeltaNet and attention chains in front of the out / o
// projections (H100, session 35, with the staged projections: 27B +1.2 %, 32B +0.6 %; 127
// lost 1.8 % on the 32B: the next product's grid launched during the previous one's last
// wave). The environment variable REDLINE_PDL_EARLY (a kernel developer's knob; 0: the old
// order) makes the host prepend its own #define to the programs that use it.
#ifndef REDLINE_PDL_EARLY
#define REDLINE_PDL_EARLY 39
#endif
#define PDL_E_CONV 1
#define PDL_E_DELTA 2
#define PDL_E_GNORM 4
#define PDL_E_NORM 8
#define PDL_E_SWIGLU 16
#define PDL_E_ATTN 32
#define PDL_E_F32 64
template <int BIT> static __device__ __forceinline__ void pdl_enter() {
    if constexpr ((REDLINE_PDL_EARLY & BIT) != 0) {
        pdl_trigger();
        pdl_wait();
    } else {
        pdl_wait();
        pdl_trigger();
    }
}

// Block timeline trace (REDLINE_TRACE, a kernel developer's knob; crates/cuda/src/trace.rs):
// with the host's `#define REDLINE_TRACE` in front of every program, thread 0 of each block of
// the kernels that declare a TraceScope writes three records: its start, the return of its PDL
// wait (TRACE_WAITED) and its end, as (%globaltimer, tag | event << 8 | block << 16 | grid <<
// 40) into the region of the multiprocessor it runs on (a counter per SM, so the records of a
// step cost no global hot spot). The host sets redline_trace_ptr in every loaded module, zeroes
// the counters before the traced step and reads the records after it. Without the #define
// all of this compiles to nothing.
#define TRACE_MVD 1
#define TRACE_F32ROWS 2
#define TRACE_CONV 3
#define TRACE_DELTA 4
#define TRACE_GNORM 5
#define TRACE_NORM 6
#define TRACE_SWIGLU 7
#define TRACE_FA 8
#define TRACE_FA_MERGE 9
#define TRACE_HEAD 10
#define TRACE_QUANT 11
#define TRACE_OTHER 12
#define TRACE_MVM 13
#ifdef REDLINE_TRACE
#define TRACE_SMS 256            // counters (u32) at the start of the buffer, one per SM id
#define TRACE_CAP 32768          // records per SM
#define TRACE_HEADER_WORDS 128   // u64 words before the records (the counters)
extern "C" {
__device__ unsigned long long redline_trace_ptr;
}
static __device__ __forceinline__ void trace_event(int tag, int ev) {
    if ((threadIdx.x | threadIdx.y | threadIdx.z) != 0 || redline_trace_ptr == 0) return;
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    uint64_t* buf = (uint64_t*)redline_trace_ptr;
    const uint32_t i = atomicAdd((unsigned int*)buf + (sm % TRACE_SMS), 1u);
    if (i >= TRACE_CAP) return;
    const uint64_t block = blockIdx.x + (uint64_t)gridDim.x * (blockIdx.y + (uint64_t)gridDim.y * blockIdx.z);
    const uint64_t grid = (uint64_t)gridDim.x * gridDim.y * gridDim.z;
    uint64_t* r = buf + TRACE_HEADER_WORDS + 2 * ((uint64_t)(sm % TRACE_SMS) * TRACE_CAP + i);
    r[0] = t;
    r[1] = (uint64_t)tag | ((uint64_t)ev << 8) | ((block & 0xffffff) << 16) | ((grid & 0xffffff) << 40);
}
struct TraceScope {
    int tag;
    __device__ explicit TraceScope(int t) : tag(t) { trace_event(tag, 0); }
    __device__ ~TraceScope() { trace_event(tag, 2); }
};
#define TRACE_SCOPE(tag) TraceScope trace_scope_(tag)
#define TRACE_WAITED(tag) trace_event(tag, 1)
#define TRACE_MARK(tag, ev) trace_event(tag, ev)
#else
#define TRACE_SCOPE(tag)
#define TRACE_WAITED(tag)
#define TRACE_MARK(tag, ev)
#endif

// The next products' weights toward L2 (CudaBackend::prefetch, REDLINE_L2_PREFETCH): up to two
// byte ranges [p0, p0 + n0), [p1, p1 + n1) in 32 KiB pieces, piece c issued by thread c % nt
// (this one is t of nt). sm_90's bulk prefetch, which the thread does not wait for; nothing
// below sm_90 (the host passes no ranges there). Ranges start 16-byte aligned and are whole
// 16-byte units (the host's plan). The grid is not done until the pieces have landed.
static __device__ __forceinline__ void l2_prefetch2(uint64_t p0, uint64_t n0, uint64_t p1, uint64_t n1, int t,
                                                    int nt) {
#if __CUDA_ARCH__ >= 900
    const uint64_t piece = 32768;
    const uint64_t c0 = (n0 + piece - 1) / piece, c1 = (n1 + piece - 1) / piece;
    for (uint64_t c = (uint64_t)t; c < c0 + c1; c += (uint64_t)nt) {
        const bool first = c < c0;
        const uint64_t off = (first ? c : c - c0) * piece, n = first ? n0 : n1;
        const uint64_t rest = n - off;
        const unsigned size = (unsigned)(rest < piece ? rest : piece);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((first ? p0 : p1) + off), "r"(size)
                     : "memory");
    }
#endif
}

// IEEE half bits -> f32 (cvt.f32.f16 exists on every PTX target we build).
static __device__ __forceinline__ float f16_to_f32(uint16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

static __device__ __forceinline__ uint16_t f32_to_f16(float f) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// bf16 is the top half of an f32: no bf16 arithmetic needed (V100 has none).
static __device__ __forceinline__ float bf16_to_f32(uint16_t h) {
    return __uint_as_float(((uint32_t)h) << 16);
}

// Sum of the four signed byte products a.b plus c.
static __device__ __forceinline__ int dp4a(int a, int b, int c) {
#if __CUDA_ARCH__ >= 610
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    const int8_t* pa = (const int8_t*)&a;
    const int8_t* pb = (const int8_t*)&b;
    return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#endif
}

// Sum of the four products of the unsigned bytes of a with the signed bytes of b, plus c.
static __device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
#if __CUDA_ARCH__ >= 610
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    const uint8_t* pa = (const uint8_t*)&a;
    const int8_t* pb = (const int8_t*)&b;
    return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#endif
}

// Byte permute: result byte i = byte (selector nibble i & 7) of the 8 bytes {b:a}.
static __device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// Per-byte a - b for bytes where the result fits in int8 and a + 0x80 - b >= 0
// (SWAR: no borrow crosses a byte because each byte is biased by 0x80 first).
static __device__ __forceinline__ uint32_t sub_bytes_biased(uint32_t a, uint32_t b) {
    return ((a | 0x80808080u) - b) ^ 0x80808080u;
}

// Four Q6_K weights of sub-block k (0..3) of a 128-half as bytes 4 (q - 32) (int8, exact: -128
// .. 124): q's low nibble (of ql, nibble k / 2) at bits 2..5, its two high bits (of qh, bits
// 2k, 2k + 1) at 6..7, bit 7 flipped. Two shifts and two LOP3 per word, against six operations
// for q - 32 (mask, shift, merge, then a biased SWAR subtraction); the products come out 4x and
// the float step takes d / 4 (a power of two: the same bits as before).
static __device__ __forceinline__ uint32_t q6k_weights4(uint32_t ql, uint32_t qh, int k) {
    const uint32_t lo = (k >> 1) ? ql >> 2 : ql << 2;
    const uint32_t hi = qh << (6 - 2 * k);
    return ((lo & 0x3C3C3C3Cu) | (hi & 0xC0C0C0C0u)) ^ 0x80808080u;
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// The tiled q8_1 layout (REDLINE_Q8_1_TILED; the host takes it for x of 1-2 tokens whose rows
// are a multiple of 512 values, crate::matvec::q8_1_tiled): within every 512 values the 16-byte
// pieces are stored transposed, natural piece 4 i + k (i = 0..7, k = 0..3) at position 8 k + i.
// A dp4a matvec lane reads the 64 bytes of two consecutive units in four 16-byte loads (lane l:
// bytes [64 l, 64 l + 64) of a 2048-value group); naturally each load's 8 lanes of a quarter
// warp touch 4 cache lines (16 L1 wavefronts a warp), tiled they read one line (4 wavefronts).
// Pieces stay whole, so any aligned load of up to 16 bytes reads the same values at its mapped
// address. `i`: the value's index in the row (or the flat index: rows are multiples of 512).
static __device__ __forceinline__ long long q8_1_at(long long i, bool tiled) {
    return tiled ? (i & ~511ll) | ((i & 48) << 3) | ((i & 448) >> 2) | (i & 15) : i;
}

// The producers' xds pointer carries the layout in its low bit (f32 addresses are even): the
// host tags it (with_q8_of, quantize_for_matvec) and the writers below untag it.
static __device__ __forceinline__ bool q8_1_tagged(const float* xds) { return ((uintptr_t)xds & 1) != 0; }
static __device__ __forceinline__ float* q8_1_untag(float* xds) { return (float*)((uintptr_t)xds & ~(uintptr_t)1); }

// The q8_1 copy a product reads (matvec_quant.cu `quantize_q8_1`: int8 per value, (d, d * sum q)
// per 32 values), written by the kernel that produced the values. Max and the sum of integer
// q's are exact in any order, so these give quantize_q8_1's bits.
// One warp holds 32 consecutive values v (lane i: value 32u + i); writes their q8_1 unit u.
// xds may be tagged (tiled layout, above).
static __device__ __forceinline__ void q8_1_unit(float v, int8_t* xq, float* xds, long long i, long long u) {
    const bool tiled = q8_1_tagged(xds);
    xds = q8_1_untag(xds);
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : __float2int_rn(v / d);
    xq[q8_1_at(i, tiled)] = (int8_t)q;
    const float sum = warp_sum((float)q);
    if ((threadIdx.x & 31) == 0) {
        xds[2 * u] = d;
        xds[2 * u + 1] = d * sum;
    }
}

// q8_K's choice of scale value (mmv.cu `quantize_q8_k`, the CPU's scan): the value of largest
// magnitude, ties to the lowest index. (am, mx, idx) = (|value|, value, index), or (0, 0,
// INT_MAX) for none yet; a total order, so any reduction order picks the same one.
static __device__ __forceinline__ void q8k_pick(float& am, float& mx, int& idx, float am2, float mx2, int idx2) {
    if (am2 > am || (am2 == am && idx2 < idx)) {
        am = am2;
        mx = mx2;
        idx = idx2;
    }
}

// q8k_pick over the warp: every lane ends with the warp's pick.
static __device__ __forceinline__ void q8k_pick_warp(float& am, float& mx, int& idx) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float am2 = __shfl_xor_sync(FULL_MASK, am, o);
        const float mx2 = __shfl_xor_sync(FULL_MASK, mx, o);
        const int idx2 = __shfl_xor_sync(FULL_MASK, idx, o);
        q8k_pick(am, mx, idx, am2, mx2, idx2);
    }
}

// Where the q8_K copy keeps value `col` of token `tok` (of ntok): token-interleaved per unit,
// so the 8 tokens' 32 bytes of one unit are 256 contiguous bytes and an mmv2 x load touches 2
// cache lines instead of one per token. q: [cols / 32][ntok][32] int8; dy (one per 256 values)
// and bsum (8 int16 per 256 values, the sums of q per 32): [cols / 256][ntok] (x 8 for bsum).
static __device__ __forceinline__ long long q8k_q_at(int tok, long long col, int ntok) {
    return ((col >> 5) * ntok + tok) * 32 + (col & 31);
}
static __device__ __forceinline__ long long q8k_sb_at(int tok, long long col, int ntok) {
    return (col >> 8) * ntok + tok;
}

// The q8_K copy the mmv2 products read (mmv.cu `quantize_q8_k`: int8 q per value, dy per 256
// values, the int16 sum of q per 32; layout above), bit for bit: the scale from q8k_pick, then
// the same expressions. The 256 values of a unit are held one per thread, in order, by 8
// consecutive warps: blockDim.x a multiple of 256 and v the value `col` of token `tok` (the
// unit's first value at a thread with tid % 256 == 0). Every thread of the block calls it (it
// has barriers); ok is uniform over each unit (false: nothing written for that unit).
static __device__ __forceinline__ void q8_k_unit_block(float v, bool ok, int8_t* q, float* dy, int16_t* bsum,
                                                       int tok, long long col, int ntok) {
    __shared__ float k_am[32], k_mx[32];
    __shared__ int k_idx[32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, e = tid & 255;
    float am = 0.0f, mx = 0.0f;
    int idx = 0x7FFFFFFF;
    q8k_pick(am, mx, idx, fabsf(v), v, e);
    q8k_pick_warp(am, mx, idx);
    if (lane == 0) {
        k_am[warp] = am;
        k_mx[warp] = mx;
        k_idx[warp] = idx;
    }
    __syncthreads();
    const int w0 = warp & ~7;
#pragma unroll
    for (int w = 0; w < 8; w++) q8k_pick(am, mx, idx, k_am[w0 + w], k_mx[w0 + w], k_idx[w0 + w]);
    int qi = 0;
    float d = 0.0f;
    if (am > 0.0f) {
        const float iscale = -127.0f / mx;
        qi = min(127, __float2int_rn(iscale * v));
        d = 1.0f / iscale;
    }
    int sum = qi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
    if (ok) {
        q[q8k_q_at(tok, col, ntok)] = (int8_t)qi;
        if (lane == 0) bsum[8 * q8k_sb_at(tok, col, ntok) + ((col >> 5) & 7)] = (int16_t)sum;
        if (e == 0) dy[q8k_sb_at(tok, col, ntok)] = d;
    }
    __syncthreads();  // the shared arrays are read before a next call rewrites them
}

// The same for a pair of values per lane: the 16 lanes of a half warp hold the unit's 32 values
// (lane l: values 2 (l % 16) and 2 (l % 16) + 1 at i, i + 1). Every lane of the warp calls it.
// xds may be tagged (tiled layout).
static __device__ __forceinline__ void q8_1_unit_pairs(float a, float b, int8_t* xq, float* xds, long long i,
                                                       long long u) {
    const bool tiled = q8_1_tagged(xds);
    xds = q8_1_untag(xds);
    float amax = fmaxf(fabsf(a), fabsf(b));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
    const float d = amax / 127.0f;
    const int qa = amax == 0.0f ? 0 : __float2int_rn(a / d);
    const int qb = amax == 0.0f ? 0 : __float2int_rn(b / d);
    // i is even: both values are in one piece
    const long long at = q8_1_at(i, tiled);
    xq[at] = (int8_t)qa;
    xq[at + 1] = (int8_t)qb;
    float sum = (float)qa + (float)qb;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
    if ((threadIdx.x & 15) == 0) {
        xds[2 * u] = d;
        xds[2 * u + 1] = d * sum;
    }
}

// Little-endian loads from 2-byte-aligned memory (every GGUF block is 2-byte aligned).
static __device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) {
    return *(const uint16_t*)p;
}
static __device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t* p) {
    const uint16_t* q = (const uint16_t*)p;
    return (uint32_t)q[0] | ((uint32_t)q[1] << 16);
}

static __device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
static __device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// RoPE (ggml rope_ext): the cosine and sine of pair i's angle at position p,
// theta = p * freq_scale * freq_base^(-2i / n_rot) / factors[i] (factors may be null). In
// double: at large positions the f32 angle is off by more than the 1e-6 the conformance suite
// allows (measured 1.2e-5 on the H200). mo_rope, mo_rope_qk and the fused decode attention
// (fa_decode_fused_*) share it, so they rotate bit for bit alike.
static __device__ __forceinline__ void rope_cos_sin(float p, int i, int n_rot, float freq_base, float freq_scale,
                                                    const float* __restrict__ factors, float& c, float& s) {
    double theta = (double)p * freq_scale * pow((double)freq_base, -2.0 * i / (double)n_rot);
    if (factors) theta /= factors[i];
    c = (float)cos(theta);
    s = (float)sin(theta);
}

// One RoPE pair (a, b) rotated by the angle of (c, s): (a c - b s, a s + b c) with the FMAs
// spelled out — the contraction NVRTC chose for the plain expressions in mo_rope (SASS, sm_90:
// FFMA a, c, -(b s) and FFMA a, s, (b c)) — so every kernel that rotates gets the same bits
// whatever its compiler would have fused there.
static __device__ __forceinline__ void rope_rotate(float a, float b, float c, float s, float& o0, float& o1) {
    o0 = fmaf(a, c, -__fmul_rn(b, s));
    o1 = fmaf(a, s, __fmul_rn(b, c));
}

// cp.async groups (sm_80+; below, the copies are plain loads and stores and these do nothing).
// cp_async16: 16 bytes global -> shared (both 16-byte aligned), L2 only (.cg).
static __device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    unsigned long long s;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)s), "l"(src) : "memory");
#else
    ((uint64_t*)dst)[0] = ((const uint64_t*)src)[0];
    ((uint64_t*)dst)[1] = ((const uint64_t*)src)[1];
#endif
}
static __device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
