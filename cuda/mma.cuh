// mma.cuh - prefill's integer products on the tensor cores (sm_80 and up): Y = X W^T for the quantized
// types through mma.sync's int8 shapes, the activations as matmul_dp4a takes them (q8_1 / q8_K blocks).
//
// A block of kMmaThreads (4 warps) computes a kMmaRows x kMmaTokens tile of Y. Each round covers
// kMmaChunk values of k: the block dequantizes its weight rows to int8 in shared memory (the types'
// quads, the operands of their dp4a products) with their scales, copies the tokens' activation quants
// and scales beside them, and each warp multiplies its 16 rows by the tile's tokens 8 at a time. The
// integer sums of one weight scale's span (32 values: m16n8k32; the K-quants with 16-value scales:
// m16n8k16) are scaled in float as the dp4a kernels scale them, so results are the CPU's vec_dot up to
// float rounding. Below sm_80 none of this is compiled: the host picks these kernels by compute capability.
#pragma once
#include "params.h"
#include "quants.cuh"
#include "matmul.cuh"  // LLM_MATMUL_INT_KERNELS

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define LLM_MMA_AVAILABLE 1
#endif
#ifdef LLM_MMA_AVAILABLE

#ifdef __CUDACC__  // the loops over a lane's fragments unrolled, so they stay in registers
#define LLM_UNROLL _Pragma("unroll")
#else
#define LLM_UNROLL
#endif

// One warp's C += A B in int8 (mma.sync.aligned.m16n8k{K}.row.col.s32.s8.s8.s32): a holds K / 8 registers
// of the 16 x K A, b K / 16 of the K x 8 B, c the 4 of the 16 x 8 sums, each lane its fragments in PTX's
// layout (tests/simt.hpp spells it out, and emulates the instruction lane by lane).
template <int K> __device__ __forceinline__ void mma_s8(int (&c)[4], const int* a, const int* b);
#ifdef __CUDACC__
template <> __device__ __forceinline__ void mma_s8<32>(int (&c)[4], const int* a, const int* b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void mma_s8<16>(int (&c)[4], const int* a, const int* b) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b[0]));
}
#else
template <int K> __device__ __forceinline__ void mma_s8(int (&c)[4], const int* a, const int* b) { simt::mma_s8<K>(c, a, b, c); }
#endif

constexpr int kMmaChunk = 256;              // values of k per round: one K-quant block, eight 32-value blocks
constexpr int kMmaStride = kMmaChunk + 16;  // bytes per shared row: a fragment load's 32 lanes hit 32 banks

// A round's int8 operands: the tile's weight rows and tokens over kMmaChunk values.
struct MmaTiles {
    alignas(16) int8_t w[kMmaRows][kMmaStride];
    alignas(16) int8_t x[kMmaTokens][kMmaStride];
};
// The 32-value types' scales of a round: per row and block the weight's d and min, per token and block
// the activations' d and s.
struct MmaScales32 {
    float w_d[kMmaRows][kMmaChunk / 32], w_m[kMmaRows][kMmaChunk / 32];
    float x_d[kMmaTokens][kMmaChunk / 32], x_s[kMmaTokens][kMmaChunk / 32];
};
// A K-quant round's (one block): per row d, dmin, the integer scale of each scale_width values and the
// min of each 16; per token the activations' d and sums of 16.
struct MmaScalesK {
    float w_d[kMmaRows], w_dmin[kMmaRows], x_d[kMmaTokens];
    int w_scale[kMmaRows][16], w_min[kMmaRows][16], x_bsum[kMmaTokens][16];
};

// Where element i (0..3) of this lane's 16 x 8 sums lies: its row in the tile (warp w's 16 rows) and,
// in 8-token piece p, its token.
__device__ __forceinline__ int mma_row(int i) { return threadIdx.x / 32 * 16 + threadIdx.x % 32 / 4 + 8 * (i / 2); }
__device__ __forceinline__ int mma_token(int p, int i) { return p * 8 + 2 * (threadIdx.x % 4) + i % 2; }

// The int at byte `offset` of a shared int8 row (a fragment register).
__device__ __forceinline__ int fragment_int(const int8_t* row, int offset) { return *reinterpret_cast<const int*>(row + offset); }

// Each warp's 16 weight rows times the tile's tokens over a round: for every span s of K values (one
// weight scale) and 8-token piece p, the 16 x 8 integer sums go to combine(s, p, sums).
template <int K, class Combine> __device__ __forceinline__ void mma_round(const MmaTiles& tiles, Combine combine) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int8_t* rows[2] = {tiles.w[threadIdx.x / 32 * 16 + g], tiles.w[threadIdx.x / 32 * 16 + g + 8]};
    for (int s = 0; s < kMmaChunk / K; s++) {
        int a[K / 8];
        LLM_UNROLL for (int r = 0; r < K / 8; r++) a[r] = fragment_int(rows[r % 2], s * K + 4 * t + 16 * (r / 2));
        LLM_UNROLL for (int p = 0; p < kMmaTokens / 8; p++) {
            int b[K / 16];
            LLM_UNROLL for (int r = 0; r < K / 16; r++) b[r] = fragment_int(tiles.x[p * 8 + g], s * K + 4 * t + 16 * r);
            int sums[4] = {0, 0, 0, 0};
            mma_s8<K>(sums, a, b);
            combine(s, p, sums);
        }
    }
}

// fn(r, j) for every r < n_rows and j < per_row, spread over the block's threads.
template <class Fn> __device__ __forceinline__ void for_each_cell(int n_rows, int per_row, Fn fn) {
    for (int e = threadIdx.x; e < n_rows * per_row; e += kMmaThreads) fn(e / per_row, e % per_row);
}
// Int q of a round's shared row (its values 4q..4q+3).
__device__ __forceinline__ int& tile_int(int8_t* row, int q) { return *reinterpret_cast<int*>(row + 4 * q); }

// The round's weights of 32-value type T from block `block0` on (kMmaChunk / 32 blocks) of rows row0..:
// rows past the matrix and blocks past its n_blocks are zeros.
template <class T>
__device__ void load_weights(MmaTiles& tiles, MmaScales32& scales, const uint8_t* W, size_t row_bytes, int row0, int rows, int block0, int n_blocks) {
    auto block = [&](int r, int j) { return row0 + r < rows && block0 + j < n_blocks ? W + size_t(row0 + r) * row_bytes + (block0 + j) * T::block_bytes : nullptr; };
    for_each_cell(kMmaRows, kMmaChunk / 4, [&](int r, int q) {
        const uint8_t* b = block(r, q / 8);
        tile_int(tiles.w[r], q) = b ? T::quad(b, q % 8) : 0;
    });
    for_each_cell(kMmaRows, kMmaChunk / 32, [&](int r, int j) {
        const uint8_t* b = block(r, j);
        scales.w_d[r][j] = b ? T::d(b) : 0.0f;
        if constexpr (T::has_min) scales.w_m[r][j] = b ? T::m(b) : 0.0f;
    });
}
// The tokens tok0.. of X's q8_1 blocks block0.. (n_blocks per token): quants, d and s; zeros past the ends.
__device__ __forceinline__ void load_activations(MmaTiles& tiles, MmaScales32& scales, const BlockQ8_1* X, int tok0, int n_tokens, int block0, int n_blocks) {
    auto block = [&](int tok, int j) { return tok0 + tok < n_tokens && block0 + j < n_blocks ? X + size_t(tok0 + tok) * n_blocks + block0 + j : nullptr; };
    for_each_cell(kMmaTokens, kMmaChunk / 4, [&](int tok, int q) {
        const BlockQ8_1* b = block(tok, q / 8);
        tile_int(tiles.x[tok], q) = b ? *reinterpret_cast<const int*>(b->qs + 4 * (q % 8)) : 0;
    });
    for_each_cell(kMmaTokens, kMmaChunk / 32, [&](int tok, int j) {
        const BlockQ8_1* b = block(tok, j);
        scales.x_d[tok][j] = b ? f16_bits_to_float(b->d) : 0.0f;
        scales.x_s[tok][j] = b ? f16_bits_to_float(b->s) : 0.0f;
    });
}

// The K-quant round's weights: block b of rows row0.., zeros past the matrix.
template <class T> __device__ void load_weights(MmaTiles& tiles, MmaScalesK& scales, const uint8_t* W, size_t row_bytes, int row0, int rows, int b) {
    auto block = [&](int r) { return row0 + r < rows ? W + size_t(row0 + r) * row_bytes + b * T::block_bytes : nullptr; };
    for_each_cell(kMmaRows, kMmaChunk / 4, [&](int r, int q) { tile_int(tiles.w[r], q) = block(r) ? kquant_quad<T>(block(r), 4 * q) : 0; });
    for_each_cell(kMmaRows, 16, [&](int r, int j) {
        const uint8_t* w = block(r);
        if (j < kMmaChunk / T::scale_width) scales.w_scale[r][j] = w ? T::scale16(w, j * T::scale_width / 16) : 0;
        scales.w_min[r][j] = w ? T::min16(w, j) : 0;
        if (j == 0) scales.w_d[r] = w ? T::d(w) : 0.0f, scales.w_dmin[r] = w ? T::dmin(w) : 0.0f;
    });
}
// The tokens tok0.. of X's q8_K block b (n_blocks per token): quants, d and the sums of 16; zeros past the end.
__device__ __forceinline__ void load_activations(MmaTiles& tiles, MmaScalesK& scales, const BlockQ8_K* X, int tok0, int n_tokens, int b, int n_blocks) {
    auto block = [&](int tok) { return tok0 + tok < n_tokens ? X + size_t(tok0 + tok) * n_blocks + b : nullptr; };
    for_each_cell(kMmaTokens, kMmaChunk / 4, [&](int tok, int q) { tile_int(tiles.x[tok], q) = block(tok) ? *reinterpret_cast<const int*>(block(tok)->qs + 4 * q) : 0; });
    for_each_cell(kMmaTokens, 16, [&](int tok, int j) {
        const BlockQ8_K* x = block(tok);
        scales.x_bsum[tok][j] = x ? x->bsums[j] : 0;
        if (j == 0) scales.x_d[tok] = x ? x->d : 0.0f;
    });
}

// This lane's sums of the tile into Y (n_tokens x rows), inside the matrix only.
__device__ __forceinline__ void store_tile(const float (&acc)[kMmaTokens / 8][4], float* Y, int row0, int tok0, int rows, int n_tokens) {
    LLM_UNROLL for (int p = 0; p < kMmaTokens / 8; p++)
        LLM_UNROLL for (int i = 0; i < 4; i++) {
            const int row = row0 + mma_row(i), tok = tok0 + mma_token(p, i);
            if (row < rows && tok < n_tokens) Y[size_t(tok) * rows + row] = acc[p][i];
        }
}

// The 32-value types against q8_1: each block's integer sum times d_w d_x, plus m_w s_x for the types
// with a min (the CPU's vec_dot, block by block).
template <class T> __device__ void matmul_mma(const uint8_t* W, size_t row_bytes, const BlockQ8_1* X, float* Y, int k, int rows, int n_tokens) {
    __shared__ MmaTiles tiles;
    __shared__ MmaScales32 scales;
    const int row0 = blockIdx.x * kMmaRows, tok0 = blockIdx.y * kMmaTokens, n_blocks = k / 32;
    float acc[kMmaTokens / 8][4] = {};
    for (int block0 = 0; block0 < n_blocks; block0 += kMmaChunk / 32) {
        load_weights<T>(tiles, scales, W, row_bytes, row0, rows, block0, n_blocks);
        load_activations(tiles, scales, X, tok0, n_tokens, block0, n_blocks);
        __syncthreads();
        mma_round<32>(tiles, [&](int s, int p, const int (&sums)[4]) {
            LLM_UNROLL for (int i = 0; i < 4; i++) {
                const int r = mma_row(i), tok = mma_token(p, i);
                acc[p][i] += scales.w_d[r][s] * scales.x_d[tok][s] * sums[i];
                if constexpr (T::has_min) acc[p][i] += scales.w_m[r][s] * scales.x_s[tok][s];
            }
        });
        __syncthreads();  // the tiles are reloaded next round
    }
    store_tile(acc, Y, row0, tok0, rows, n_tokens);
}

// The K-quants against q8_K: per block d_w d_x sum(scale * integer sum) - dmin_w d_x sum(min * bsum),
// the CPU's vec_dot.
template <class T> __device__ void matmul_mma(const uint8_t* W, size_t row_bytes, const BlockQ8_K* X, float* Y, int k, int rows, int n_tokens) {
    __shared__ MmaTiles tiles;
    __shared__ MmaScalesK scales;
    const int row0 = blockIdx.x * kMmaRows, tok0 = blockIdx.y * kMmaTokens, n_blocks = k / 256;
    float acc[kMmaTokens / 8][4] = {};
    for (int b = 0; b < n_blocks; b++) {
        load_weights<T>(tiles, scales, W, row_bytes, row0, rows, b);
        load_activations(tiles, scales, X, tok0, n_tokens, b, n_blocks);
        __syncthreads();
        int isum[kMmaTokens / 8][4] = {};
        mma_round<T::scale_width>(tiles, [&](int s, int p, const int (&sums)[4]) {
            LLM_UNROLL for (int i = 0; i < 4; i++) isum[p][i] += scales.w_scale[mma_row(i)][s] * sums[i];
        });
        LLM_UNROLL for (int p = 0; p < kMmaTokens / 8; p++)
            LLM_UNROLL for (int i = 0; i < 4; i++) {
                const int r = mma_row(i), tok = mma_token(p, i);
                acc[p][i] += scales.w_d[r] * scales.x_d[tok] * isum[p][i];
                if constexpr (T::has_min) {
                    int mins = 0;
                    for (int j = 0; j < 16; j++) mins += scales.w_min[r][j] * scales.x_bsum[tok][j];
                    acc[p][i] -= scales.w_dmin[r] * scales.x_d[tok] * mins;
                }
            }
        __syncthreads();  // the tiles are reloaded next round
    }
    store_tile(acc, Y, row0, tok0, rows, n_tokens);
}

// matmul_mma_q8_1_* / matmul_mma_q8_K_* and their _id_ forms, as matmul_q8_1_* (grid: row tiles x token
// tiles, of kMmaRows x kMmaTokens).
#define LLM_MATMUL_MMA_Q8_1(name, T) LLM_MATMUL_INT_KERNELS(matmul_mma_, matmul_mma, kMmaTokens, q8_1, BlockQ8_1, name, T)
#define LLM_MATMUL_MMA_Q8_K(name, T) LLM_MATMUL_INT_KERNELS(matmul_mma_, matmul_mma, kMmaTokens, q8_K, BlockQ8_K, name, T)
LLM_FOR_EACH_DP4A_TYPE(LLM_MATMUL_MMA_Q8_1)
LLM_FOR_EACH_Q8_K_TYPE(LLM_MATMUL_MMA_Q8_K)

#endif  // LLM_MMA_AVAILABLE
