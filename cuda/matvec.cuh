// matvec.cuh - y = W x for a weight matrix in any supported type: decode's matrix-vector products.
//
// One warp per weight row. The float path reads each weight value through its type's value() and
// multiplies it by the f32 activations; the integer path (32-value types) multiplies the weight blocks
// by q8_1 activation blocks with dp4a, as the CPU multiplies them by q8_0/q8_1 blocks.
#pragma once
#include "quants.cuh"

constexpr int kMatvecThreads = 256;  // 8 warps: 8 rows per block

// Row r of W (rows of row_bytes bytes, k values) times x, into y[r].
template <class T> __device__ void matvec_dequant(const uint8_t* W, size_t row_bytes, const float* x, float* y, int k, int rows) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const uint8_t* w = W + row * row_bytes;
    float sum = 0.0f;
    for (int i = lane; i < k; i += 32) sum += row_value<T>(w, i) * x[i];
    sum = warp_sum(sum);
    if (lane == 0) y[row] = sum;
}

// The same product against x quantized to q8_1 (k / 32 blocks): each lane takes whole blocks.
template <class T> __device__ void matvec_dp4a(const uint8_t* W, size_t row_bytes, const BlockQ8_1* x, float* y, int k, int rows) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const uint8_t* w = W + row * row_bytes;
    float sum = 0.0f;
    for (int b = lane; b < k / 32; b += 32) sum += T::dot_q8_1(w + b * T::block_bytes, x + b);
    sum = warp_sum(sum);
    if (lane == 0) y[row] = sum;
}

// x (n values, n % 32 == 0) to q8_1 blocks, one warp per block, rounded as the CPU's run-time
// quantizer: d = amax / 127, q = round-half-even(x * 127 / amax), s = d * sum(q) clamped to f16.
LLM_KERNEL void quantize_q8_1(const float* x, BlockQ8_1* out, int n) {
    const int block = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (block >= n / 32) return;
    const float v = x[block * 32 + lane];
    const float amax = warp_reduce(fabsf(v), MaxOp());
    const float d = amax / 127, inv = amax != 0.0f ? 127.f / amax : 0.0f;
    const int q = int(rintf(v * inv));
    const float sum = warp_sum(float(q));  // exact: |sum| <= 32 * 127
    out[block].qs[lane] = int8_t(q);
    if (lane == 0) {
        out[block].d = float_to_f16_bits(d);
        out[block].s = float_to_f16_bits(fminf(65504.0f, fmaxf(-65504.0f, sum * d)));
    }
}

// One extern "C" kernel per type, the names the host looks up.
#define LLM_MATVEC_F32(name, T) \
    LLM_KERNEL void matvec_##name(const uint8_t* W, size_t row_bytes, const float* x, float* y, int k, int rows) { \
        matvec_dequant<T>(W, row_bytes, x, y, k, rows); \
    }
#define LLM_MATVEC_Q8_1(name, T) \
    LLM_KERNEL void matvec_q8_1_##name(const uint8_t* W, size_t row_bytes, const BlockQ8_1* x, float* y, int k, int rows) { \
        matvec_dp4a<T>(W, row_bytes, x, y, k, rows); \
    }
LLM_FOR_EACH_WEIGHT_TYPE(LLM_MATVEC_F32)
LLM_FOR_EACH_DP4A_TYPE(LLM_MATVEC_Q8_1)
