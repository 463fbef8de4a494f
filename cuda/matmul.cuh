// matmul.cuh - Y = X W^T for a batch of tokens (prefill, several slots): 32 x 32 output tiles.
//
// Float types: a block of 256 threads loads a 32-row x 32-value slice of W (through the type's
// value()) and the matching 32-token slice of X into shared memory, then each thread accumulates four
// outputs (one weight row, four tokens). X is [n_tokens x k], Y is [n_tokens x rows], both row-major
// f32. Quantized types multiply q8_1 / q8_K activation blocks (matmul_dp4a).
#pragma once
#include "params.h"
#include "quants.cuh"
#include "matvec.cuh"  // LLM_EXPERT_ROWS


template <class T>
__device__ void matmul_tiled(const uint8_t* W, size_t row_bytes, const float* X, float* Y, int k, int rows, int n_tokens) {
    __shared__ float w_tile[kTile][kTile + 1];  // +1: no bank conflicts on the column reads
    __shared__ float x_tile[kTile][kTile + 1];
    const int row0 = blockIdx.x * kTile, tok0 = blockIdx.y * kTile, t = threadIdx.x;
    const int my_row = t % kTile, my_tok = (t / kTile) * 4;
    float acc[4] = {0, 0, 0, 0};
    for (int k0 = 0; k0 < k; k0 += kTile) {
        for (int e = t; e < kTile * kTile; e += kMatmulThreads) {
            const int r = e / kTile, c = e % kTile;
            w_tile[r][c] = row0 + r < rows ? row_value<T>(W + (row0 + r) * row_bytes, k0 + c) : 0.0f;
            x_tile[r][c] = tok0 + r < n_tokens ? T::activation(X[size_t(tok0 + r) * k + k0 + c]) : 0.0f;
        }
        __syncthreads();
        for (int c = 0; c < kTile; c++)
            for (int j = 0; j < 4; j++) acc[j] += w_tile[my_row][c] * x_tile[my_tok + j][c];
        __syncthreads();  // the tiles are reloaded next round
    }
    for (int j = 0; j < 4; j++)
        if (row0 + my_row < rows && tok0 + my_tok + j < n_tokens) Y[size_t(tok0 + my_tok + j) * rows + row0 + my_row] = acc[j];
}

// Integer activations (q8_1 / q8_K blocks, as matvec_dp4a) for the quantized types: each thread one
// weight row and four tokens of the 32 x 32 tile, whole blocks through dp4a, so prefill rounds
// activations to 8 bits as the CPU (and the reference) do.
template <class T, class Act>
__device__ void matmul_dp4a(const uint8_t* W, size_t row_bytes, const Act* X, float* Y, int k, int rows, int n_tokens) {
    const int row = blockIdx.x * kTile + threadIdx.x % kTile, tok0 = blockIdx.y * kTile + threadIdx.x / kTile * 4;
    if (row >= rows) return;
    const int n_blocks = k / T::block_size;
    const uint8_t* w = W + size_t(row) * row_bytes;
    for (int j = 0; j < 4 && tok0 + j < n_tokens; j++) {
        const Act* x = X + size_t(tok0 + j) * n_blocks;
        float sum = 0.0f;
        for (int b = 0; b < n_blocks; b++) sum += block_dot<T>(w + b * T::block_bytes, x + b);
        Y[size_t(tok0 + j) * rows + row] = sum;
    }
}

#define LLM_MATMUL(name, T) \
    LLM_KERNEL void matmul_##name(const uint8_t* W, size_t row_bytes, const float* X, float* Y, int k, int rows, int n_tokens) { \
        matmul_tiled<T>(W, row_bytes, X, Y, k, rows, n_tokens); \
    }
// An integer product's kernels `prefix act _name` (as matmul_q8_1_q4_0) and, expert-grouped as
// matmul_id_* below, `prefix act _id_name`: body<T>(W, row_bytes, X, Y, k, rows, n_tokens) over tiles of
// `tokens` tokens (blockIdx.y). The dp4a tiles here, the tensor-core ones in mma.cuh.
#define LLM_MATMUL_INT_KERNELS(prefix, body, tokens, act, Act, name, T) \
    LLM_KERNEL void prefix##act##_##name(const uint8_t* W, size_t row_bytes, const Act* X, float* Y, int k, int rows, int n_tokens) { \
        body<T>(W, row_bytes, X, Y, k, rows, n_tokens); \
    } \
    LLM_KERNEL void prefix##act##_id_##name(const uint8_t* W, size_t expert_bytes, size_t row_bytes, const Act* x, float* y, int k, int rows, \
                                            const int* first) { \
        LLM_EXPERT_ROWS(k / T::block_size); \
        if (int(blockIdx.y) * (tokens) < count) body<T>(W, row_bytes, x, y, k, rows, count); \
    }
#define LLM_MATMUL_Q8_1(name, T) LLM_MATMUL_INT_KERNELS(matmul_, matmul_dp4a, kTile, q8_1, BlockQ8_1, name, T)
#define LLM_MATMUL_Q8_K(name, T) LLM_MATMUL_INT_KERNELS(matmul_, matmul_dp4a, kTile, q8_K, BlockQ8_K, name, T)
LLM_FOR_EACH_FLOAT_TYPE(LLM_MATMUL)
LLM_FOR_EACH_DP4A_TYPE(LLM_MATMUL_Q8_1)
LLM_FOR_EACH_Q8_K_TYPE(LLM_MATMUL_Q8_K)

// Expert-grouped (MoE): as matvec_id_* (matvec.cuh), tiles of 32 of an expert's rows.
#define LLM_MATMUL_ID(name, T) \
    LLM_KERNEL void matmul_id_##name(const uint8_t* W, size_t expert_bytes, size_t row_bytes, const float* x, float* y, int k, int rows, \
                                     const int* first) { \
        LLM_EXPERT_ROWS(k); \
        if (int(blockIdx.y) * kTile < count) matmul_tiled<T>(W, row_bytes, x, y, k, rows, count); \
    }
LLM_FOR_EACH_FLOAT_TYPE(LLM_MATMUL_ID)
