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

// f32 activations (x: n_tokens x k) for the float types, rounded to the weight's type as the CPU's
// dot product rounds them, weights read through their type's value().
template <class T> __device__ void matvec_dequant(const uint8_t* W, size_t row_bytes, const float* x, float* y, int k, int rows) {
    x += size_t(blockIdx.y) * k;
    matvec_rows(W, row_bytes, y, rows, [=](const uint8_t* w, int lane) {
        float sum = 0.0f;
        for (int i = lane; i < k; i += 32) sum += row_value<T>(w, i) * T::activation(x[i]);
        return sum;
    });
}

// A weight block's integer product with its activation block: q8_1 for the 32-value types, q8_K for
// the K-quants.
template <class T> __device__ __forceinline__ float block_dot(const uint8_t* w, const BlockQ8_1* x) { return T::dot_q8_1(w, x); }
template <class T> __device__ __forceinline__ float block_dot(const uint8_t* w, const BlockQ8_K* x) { return T::dot_q8_K(w, x); }

// Integer activations (k / block_size blocks per token, q8_1 or q8_K): each lane takes whole blocks
// through dp4a.
template <class T, class Act> __device__ void matvec_dp4a(const uint8_t* W, size_t row_bytes, const Act* x, float* y, int k, int rows) {
    x += size_t(blockIdx.y) * (k / T::block_size);
    matvec_rows(W, row_bytes, y, rows, [=](const uint8_t* w, int lane) {
        float sum = 0.0f;
        for (int b = lane; b < k / T::block_size; b += 32) sum += block_dot<T>(w + b * T::block_bytes, x + b);
        return sum;
    });
}

// x (n values, n % 32 == 0) to q8_1 blocks, one warp per block (quantize_warp_q8_1).
LLM_KERNEL void quantize_q8_1(const float* x, BlockQ8_1* out, int n) {
    const int block = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (block >= n / 32) return;
    quantize_warp_q8_1(x[block * 32 + lane], out + block, lane);
}
// x (n values, n % 256 == 0) to q8_K blocks, one warp per block (quantize_warp_q8_K).
LLM_KERNEL void quantize_q8_K(const float* x, BlockQ8_K* out, int n) {
    const int block = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (block >= n / 256) return;
    quantize_warp_q8_K(x + size_t(block) * 256 + 8 * lane, out + block, lane);
}

// One extern "C" kernel per type, the names the host looks up.
#define LLM_MATVEC_F32(name, T) \
    LLM_KERNEL void matvec_##name(const uint8_t* W, size_t row_bytes, const float* x, float* y, int k, int rows) { \
        matvec_dequant<T>(W, row_bytes, x, y, k, rows); \
    }
#define LLM_MATVEC_INT(act, Act, name, T) \
    LLM_KERNEL void matvec_##act##_##name(const uint8_t* W, size_t row_bytes, const Act* x, float* y, int k, int rows) { \
        matvec_dp4a<T>(W, row_bytes, x, y, k, rows); \
    }
#define LLM_MATVEC_Q8_1(name, T) LLM_MATVEC_INT(q8_1, BlockQ8_1, name, T)
#define LLM_MATVEC_Q8_K(name, T) LLM_MATVEC_INT(q8_K, BlockQ8_K, name, T)
LLM_FOR_EACH_FLOAT_TYPE(LLM_MATVEC_F32)
LLM_FOR_EACH_DP4A_TYPE(LLM_MATVEC_Q8_1)
LLM_FOR_EACH_Q8_K_TYPE(LLM_MATVEC_Q8_K)

// Expert-grouped products (MoE, matvec_id_* / matvec_q8_1_id_*; matmul_id_* in matmul.cuh): blockIdx.z
// is the expert, whose weights start expert_bytes * z into W and whose activations are the rows
// first[z] .. first[z + 1] of x (moe_group's order); the grid's y covers the most rows an expert can
// have, and blocks past an expert's own rows exit at once.
#define LLM_EXPERT_ROWS(per_row) \
    const int expert = blockIdx.z, begin = first[expert], count = first[expert + 1] - begin; \
    W += expert * expert_bytes; \
    x += size_t(begin) * (per_row); \
    y += size_t(begin) * rows
#define LLM_MATVEC_ID(name, T) \
    LLM_KERNEL void matvec_id_##name(const uint8_t* W, size_t expert_bytes, size_t row_bytes, const float* x, float* y, int k, int rows, const int* first) { \
        LLM_EXPERT_ROWS(k); \
        if (int(blockIdx.y) < count) matvec_dequant<T>(W, row_bytes, x, y, k, rows); \
    }
#define LLM_MATVEC_INT_ID(act, Act, name, T) \
    LLM_KERNEL void matvec_##act##_id_##name(const uint8_t* W, size_t expert_bytes, size_t row_bytes, const Act* x, float* y, int k, int rows, \
                                             const int* first) { \
        LLM_EXPERT_ROWS(k / T::block_size); \
        if (int(blockIdx.y) < count) matvec_dp4a<T>(W, row_bytes, x, y, k, rows); \
    }
#define LLM_MATVEC_Q8_1_ID(name, T) LLM_MATVEC_INT_ID(q8_1, BlockQ8_1, name, T)
#define LLM_MATVEC_Q8_K_ID(name, T) LLM_MATVEC_INT_ID(q8_K, BlockQ8_K, name, T)
LLM_FOR_EACH_FLOAT_TYPE(LLM_MATVEC_ID)
LLM_FOR_EACH_DP4A_TYPE(LLM_MATVEC_Q8_1_ID)
LLM_FOR_EACH_Q8_K_TYPE(LLM_MATVEC_Q8_K_ID)
