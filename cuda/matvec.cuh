// matvec.cuh - y = W x for a weight matrix in any supported type: decode's matrix-vector products.
//
// Four weight rows per warp, one grid row (blockIdx.y) per token: x and y hold n_tokens vectors of k
// and rows values (decode, and the small batches of a few slots). The float path reads each weight
// value through its type's value() and multiplies it by the f32 activations; the integer path
// (32-value types) multiplies the weight blocks by q8_1 activation blocks with dp4a, as the CPU
// multiplies them by q8_0/q8_1 blocks.
#pragma once
#include "params.h"
#include "quants.cuh"


// The warp's rows [row0, row0 + kMatvecRowsPerWarp) of W times token blockIdx.y's activations: each lane
// accumulates its share of every row through partial(w, lane), then the lanes' sums meet in shared
// memory and lane r adds up row r (one warp barrier for all the rows, not a shuffle tree per row).
template <class Partial>
__device__ void matvec_rows(const uint8_t* W, size_t row_bytes, float* y, int rows, Partial partial) {
    __shared__ float sums[kMatvecThreads / 32][kMatvecRowsPerWarp][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * (blockDim.x / 32) + warp) * kMatvecRowsPerWarp;
    if (row0 >= rows) return;  // the whole warp: no lane waits at the barrier below
    for (int r = 0; r < kMatvecRowsPerWarp; r++)
        sums[warp][r][lane] = row0 + r < rows ? partial(W + size_t(row0 + r) * row_bytes, lane) : 0.0f;
    __syncwarp();
    if (lane < kMatvecRowsPerWarp && row0 + lane < rows) {
        float sum = 0.0f;
        for (int l = 0; l < 32; l++) sum += sums[warp][lane][l];
        y[size_t(blockIdx.y) * rows + row0 + lane] = sum;
    }
}

// f32 activations (x: n_tokens x k), weights read through their type's value().
template <class T> __device__ void matvec_dequant(const uint8_t* W, size_t row_bytes, const float* x, float* y, int k, int rows) {
    x += size_t(blockIdx.y) * k;
    matvec_rows(W, row_bytes, y, rows, [=](const uint8_t* w, int lane) {
        float sum = 0.0f;
        for (int i = lane; i < k; i += 32) sum += row_value<T>(w, i) * x[i];
        return sum;
    });
}

// q8_1 activations (k / 32 blocks per token): each lane takes whole blocks through dp4a.
template <class T> __device__ void matvec_dp4a(const uint8_t* W, size_t row_bytes, const BlockQ8_1* x, float* y, int k, int rows) {
    x += size_t(blockIdx.y) * (k / 32);
    matvec_rows(W, row_bytes, y, rows, [=](const uint8_t* w, int lane) {
        float sum = 0.0f;
        for (int b = lane; b < k / 32; b += 32) sum += T::dot_q8_1(w + b * T::block_bytes, x + b);
        return sum;
    });
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
