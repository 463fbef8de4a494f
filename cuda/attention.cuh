// attention.cuh - fused attention over the device KV cache (flash-attention style): for each query token
// and head, one pass over its visible cache cells with an online softmax, so no n_tokens x n_kv score
// matrix exists anywhere. K and V rows are f16, q8_0, q4_0 or iq4_nl, each independently.
//
// One warp per (token, head); lane l scores positions l, l + 32, ... and sums dims l, l + 32, ... of the
// output. A cache cell holds n_head_kv heads of K (k_row bytes per cell) and of V (v_row bytes). Token
// t of sequence seq[t] sees its positions [lo, pos[t]] (lo = pos[t] - n_swa + 1 for a sliding window,
// else 0); position c lives in cell page_cells[seq[t] * pages_per_seq + c / page_size] + c % page_size
// (the host's page table).
//
// A quantized cache holds K and V rotated by a Walsh-Hadamard transform (hadamard below, as the CPU
// path does): the host rotates q and k the same way, which leaves q.k unchanged, and rotates the
// output back, which undoes V's rotation.
#pragma once
#include "common.cuh"
#include "params.h"
#include "quants.cuh"


// The cache cell of position c of the sequence whose page table row is `pages`.
__device__ __forceinline__ size_t cache_cell(const int* pages, int page_size, int c) { return size_t(pages[c / page_size]) + c % page_size; }

// K/V rows of the batch (n tokens x row_values) into their cells of a cache of type T, one block per
// token, one thread per quantization block.
template <class T> __device__ void store_rows(const float* rows, uint8_t* cache, const int* cells, int row_values, size_t row_bytes) {
    const float* src = rows + size_t(blockIdx.x) * row_values;
    uint8_t* dst = cache + size_t(cells[blockIdx.x]) * row_bytes;
    for (int b = threadIdx.x; b < row_values / T::block_size; b += blockDim.x) T::quantize(src + b * T::block_size, dst + b * T::block_bytes);
}

// In-place orthonormal Walsh-Hadamard transform of block blockIdx.x of n values (n a power of two, at
// most kAttnMaxHeadDim): the CPU's butterflies in its order, then its 1/sqrt(n) scale, so rotated
// rows are bit-identical to the CPU's.
LLM_KERNEL void hadamard(float* data, int n) {
    __shared__ float x[kAttnMaxHeadDim];
    float* values = data + size_t(blockIdx.x) * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = values[i];
    __syncthreads();
    for (int len = 1; len < n; len *= 2) {
        for (int pair = threadIdx.x; pair < n / 2; pair += blockDim.x) {
            const int j = pair / len * 2 * len + pair % len;
            const float u = x[j], w = x[j + len];
            x[j] = u + w;
            x[j + len] = u - w;
        }
        __syncthreads();
    }
    const float scale = 1.0f / sqrtf(float(n));
    for (int i = threadIdx.x; i < n; i += blockDim.x) values[i] = x[i] * scale;
}

// The query of one (token, head) as the K type's dot product takes it (the CPU converts it the same
// way): q8_0 blocks in the run-time rounding against a quantized cache, integer products per block;
// f16-rounded floats against an f16 cache (the specialization below). load() is a warp collective.
template <class KT> struct AttnQuery {
    BlockQ8_1 blocks[kAttnMaxHeadDim / 32];
    __device__ void load(const float* q, int dim, int lane) {
        for (int b = 0; b < dim / 32; b++) quantize_warp_q8_1(q[b * 32 + lane], &blocks[b], lane);
    }
    __device__ float dot(const uint8_t* k, int dim) const {
        float sum = 0.0f;
        for (int b = 0; b < dim / 32; b++) sum += KT::dot_q8_1(k + b * KT::block_bytes, &blocks[b]);
        return sum;
    }
};
template <> struct AttnQuery<TypeF16> {
    float values[kAttnMaxHeadDim];
    __device__ void load(const float* q, int dim, int lane) {
        for (int d = lane; d < dim; d += 32) values[d] = f16_bits_to_float(float_to_f16_bits(q[d]));
    }
    __device__ float dot(const uint8_t* k, int dim) const {
        float sum = 0.0f;
        for (int d = 0; d < dim; d++) sum += values[d] * TypeF16::value(k + 2 * d, 0);
        return sum;
    }
};

template <class T> constexpr bool kIsF16 = false;
template <> constexpr bool kIsF16<TypeF16> = true;

// Two modes (AttnParams::exact_softmax): the online softmax in one pass over the cells (-fa on / auto),
// or llama.cpp's attention without flash attention (-fa off): the softmax over all visible positions
// first (max, then the sum in double as the CPU), then the probabilities, rounded to f16 against an
// f16 V as its f16 product rounds them, times V; K is read three times.
template <class KT, class VT>
__device__ void flash_attn(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, const int* pos, const int* seq, const int* page_cells,
                           float* out, const AttnParams& p) {
    constexpr int kWarps = kAttnThreads / 32, kPerLane = kAttnMaxHeadDim / 32;
    __shared__ AttnQuery<KT> query[kWarps];
    __shared__ float weights[kWarps][32];
    __shared__ size_t cells[kWarps][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int item = blockIdx.x * kWarps + warp;
    if (item >= p.n_tokens * p.n_head) return;  // the whole warp
    const int t = item / p.n_head, hk = item % p.n_head / (p.n_head / p.n_head_kv);
    const size_t k_head = size_t(p.head_dim_k / KT::block_size) * KT::block_bytes, v_head = size_t(p.head_dim_v / VT::block_size) * VT::block_bytes;
    query[warp].load(q + size_t(item) * p.head_dim_k, p.head_dim_k, lane);
    __syncwarp();
    const int last = pos[t], first = p.n_swa > 0 && last - p.n_swa + 1 > 0 ? last - p.n_swa + 1 : 0;
    const int* pages = page_cells + size_t(seq[t]) * p.pages_per_seq;
    // Position c's scaled score (-inf past the last position) and its cell.
    auto score_at = [&](int c, size_t* cell) {
        if (c > last) return -INFINITY;
        *cell = cache_cell(pages, p.page_size, c);
        return query[warp].dot(k_cache + *cell * p.k_row + hk * k_head, p.head_dim_k) * p.scale;
    };
    // Every lane's dims: acc = acc * rescale + the chunk's V rows from c0, lane l's row weighted by `weight`.
    float acc[kPerLane] = {};
    auto accumulate = [&](int c0, float weight, size_t cell, float rescale) {
        weights[warp][lane] = weight;
        cells[warp][lane] = cell;
        __syncwarp();
        const int n_valid = last - c0 + 1 < 32 ? last - c0 + 1 : 32;
        for (int j = 0; j < kPerLane; j++) {
            const int d = lane + 32 * j;
            if (d >= p.head_dim_v) break;
            float sum = acc[j] * rescale;
            for (int i = 0; i < n_valid; i++) sum += weights[warp][i] * row_value<VT>(v_cache + cells[warp][i] * p.v_row + hk * v_head, d);
            acc[j] = sum;
        }
        __syncwarp();  // weights[] and cells[] are rewritten by the next chunk
    };
    float denom = 1.0f;
    size_t cell = 0;
    if (p.exact_softmax) {
        float mx = -INFINITY;
        for (int c0 = first; c0 <= last; c0 += 32) mx = fmaxf(mx, score_at(c0 + lane, &cell));
        mx = warp_reduce(mx, MaxOp());
        double sum = 0;
        for (int c0 = first; c0 <= last; c0 += 32) sum += c0 + lane <= last ? expf(score_at(c0 + lane, &cell) - mx) : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullMask, sum, offset);
        const float inv = float(1.0 / sum);
        for (int c0 = first; c0 <= last; c0 += 32) {
            const float prob = c0 + lane <= last ? expf(score_at(c0 + lane, &cell) - mx) * inv : 0.0f;
            accumulate(c0, kIsF16<VT> ? f16_bits_to_float(float_to_f16_bits(prob)) : prob, cell, 1.0f);
        }
    } else {
        // Online softmax over chunks of 32 positions. running_max is the same in every lane; each lane
        // keeps its own part of the denominator.
        float running_max = -INFINITY, denom_part = 0.0f;
        for (int c0 = first; c0 <= last; c0 += 32) {
            const float score = score_at(c0 + lane, &cell);
            const float new_max = fmaxf(running_max, warp_reduce(score, MaxOp()));
            const float rescale = expf(running_max - new_max), weight = c0 + lane <= last ? expf(score - new_max) : 0.0f;
            denom_part = denom_part * rescale + weight;
            accumulate(c0, weight, cell, rescale);
            running_max = new_max;
        }
        denom = warp_sum(denom_part);
    }
    for (int j = 0; j < kPerLane; j++) {
        const int d = lane + 32 * j;
        if (d < p.head_dim_v) out[size_t(item) * p.head_dim_v + d] = acc[j] / denom;
    }
}

// The cache types, and every (K, V) pair of them: the kernels the host looks up by name
// (store_rows_q8_0, flash_attn_f16_q4_0, ...).
#define LLM_FOR_EACH_KV_TYPE(X) X(f16, TypeF16) X(q8_0, TypeQ8_0) X(q4_0, TypeQ4_0) X(iq4_nl, TypeIQ4_NL)
#define LLM_FOR_EACH_KV_PAIR(X) \
    X(f16, TypeF16, f16, TypeF16) X(f16, TypeF16, q8_0, TypeQ8_0) X(f16, TypeF16, q4_0, TypeQ4_0) X(f16, TypeF16, iq4_nl, TypeIQ4_NL) \
    X(q8_0, TypeQ8_0, f16, TypeF16) X(q8_0, TypeQ8_0, q8_0, TypeQ8_0) X(q8_0, TypeQ8_0, q4_0, TypeQ4_0) X(q8_0, TypeQ8_0, iq4_nl, TypeIQ4_NL) \
    X(q4_0, TypeQ4_0, f16, TypeF16) X(q4_0, TypeQ4_0, q8_0, TypeQ8_0) X(q4_0, TypeQ4_0, q4_0, TypeQ4_0) X(q4_0, TypeQ4_0, iq4_nl, TypeIQ4_NL) \
    X(iq4_nl, TypeIQ4_NL, f16, TypeF16) X(iq4_nl, TypeIQ4_NL, q8_0, TypeQ8_0) X(iq4_nl, TypeIQ4_NL, q4_0, TypeQ4_0) \
    X(iq4_nl, TypeIQ4_NL, iq4_nl, TypeIQ4_NL)

#define LLM_STORE_ROWS(name, T) \
    LLM_KERNEL void store_rows_##name(const float* rows, uint8_t* cache, const int* cells, int row_values, size_t row_bytes) { \
        store_rows<T>(rows, cache, cells, row_values, row_bytes); \
    }
#define LLM_FLASH_ATTN(kname, KT, vname, VT) \
    LLM_KERNEL void flash_attn_##kname##_##vname(const float* q, const uint8_t* k_cache, const uint8_t* v_cache, const int* pos, const int* seq, \
                                                 const int* page_cells, float* out, AttnParams p) { \
        flash_attn<KT, VT>(q, k_cache, v_cache, pos, seq, page_cells, out, p); \
    }
LLM_FOR_EACH_KV_TYPE(LLM_STORE_ROWS)
LLM_FOR_EACH_KV_PAIR(LLM_FLASH_ATTN)
