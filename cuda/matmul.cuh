// matmul.cuh - Y = X W^T for a batch of tokens (prefill, several slots): 32 x 32 output tiles.
//
// A block of 256 threads loads a 32-row x 32-value slice of W (dequantized through the type's value())
// and the matching 32-token slice of X into shared memory, then each thread accumulates four outputs
// (one weight row, four tokens). X is [n_tokens x k], Y is [n_tokens x rows], both row-major f32.
#pragma once
#include "params.h"
#include "quants.cuh"


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
            x_tile[r][c] = tok0 + r < n_tokens ? X[size_t(tok0 + r) * k + k0 + c] : 0.0f;
        }
        __syncthreads();
        for (int c = 0; c < kTile; c++)
            for (int j = 0; j < 4; j++) acc[j] += w_tile[my_row][c] * x_tile[my_tok + j][c];
        __syncthreads();  // the tiles are reloaded next round
    }
    for (int j = 0; j < 4; j++)
        if (row0 + my_row < rows && tok0 + my_tok + j < n_tokens) Y[size_t(tok0 + my_tok + j) * rows + row0 + my_row] = acc[j];
}

#define LLM_MATMUL(name, T) \
    LLM_KERNEL void matmul_##name(const uint8_t* W, size_t row_bytes, const float* X, float* Y, int k, int rows, int n_tokens) { \
        matmul_tiled<T>(W, row_bytes, X, Y, k, rows, n_tokens); \
    }
LLM_FOR_EACH_WEIGHT_TYPE(LLM_MATMUL)
