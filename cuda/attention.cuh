// attention.cuh - fused attention over the f16 KV cache (flash-attention style): for each query token
// and head, one pass over its visible cache cells with an online softmax, so no n_tokens x n_kv score
// matrix exists anywhere.
//
// One warp per (token, head); lane l scores positions l, l + 32, ... and sums dims l, l + 32, ... of the
// output. A cache
// cell holds n_head_kv heads of K (k_row f16 values per cell) and of V. Token t of sequence seq[t] sees
// its positions [lo, pos[t]] (lo = pos[t] - n_swa + 1 for a sliding window, else 0); position c lives
// in cell page_cells[seq[t] * pages_per_seq + c / page_size] + c % page_size (the host's page table).
#pragma once
#include "common.cuh"
#include "params.h"


// The cache cell of position c of the sequence whose page table row is `pages`.
__device__ __forceinline__ size_t cache_cell(const int* pages, int page_size, int c) { return size_t(pages[c / page_size]) + c % page_size; }

// K/V rows of the batch (n tokens x row values) into their cells of an f16 cache.
LLM_KERNEL void store_f16_rows(const float* rows, uint16_t* cache, const int* cells, int row) {
    for (int i = threadIdx.x; i < row; i += blockDim.x)
        cache[size_t(cells[blockIdx.x]) * row + i] = float_to_f16_bits(rows[size_t(blockIdx.x) * row + i]);
}

LLM_KERNEL void flash_attn_f16(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const int* pos, const int* seq,
                               const int* page_cells, float* out, AttnParams p) {
    constexpr int kWarps = kAttnThreads / 32, kPerLane = kAttnMaxHeadDim / 32;
    __shared__ float query[kWarps][kAttnMaxHeadDim];
    __shared__ float weights[kWarps][32];
    __shared__ size_t cells[kWarps][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int item = blockIdx.x * kWarps + warp;
    if (item >= p.n_tokens * p.n_head) return;
    const int t = item / p.n_head, hk = item % p.n_head / (p.n_head / p.n_head_kv);
    // The query in f16, as the CPU's f16 dot product converts it; every lane reads all of it.
    for (int d = lane; d < p.head_dim_k; d += 32) query[warp][d] = __half2float(__float2half(q[size_t(item) * p.head_dim_k + d]));
    __syncwarp();
    const int last = pos[t], first = p.n_swa > 0 && last - p.n_swa + 1 > 0 ? last - p.n_swa + 1 : 0;
    const int* pages = page_cells + size_t(seq[t]) * p.pages_per_seq;
    // Online softmax over chunks of 32 positions: lane l scores position c0 + l, then every lane adds
    // the chunk's weighted V rows into its own dims. running_max is the same in every lane; each lane
    // keeps its own part of the denominator.
    float acc[kPerLane] = {};
    float running_max = -INFINITY, denom_part = 0.0f;
    for (int c0 = first; c0 <= last; c0 += 32) {
        const int c = c0 + lane;
        float score = -INFINITY;
        size_t cell = 0;
        if (c <= last) {
            cell = cache_cell(pages, p.page_size, c);
            const uint16_t* k = k_cache + cell * p.k_row + size_t(hk) * p.head_dim_k;
            float dot = 0.0f;
            for (int d = 0; d < p.head_dim_k; d++) dot += query[warp][d] * f16_bits_to_float(k[d]);
            score = dot * p.scale;
        }
        const float new_max = fmaxf(running_max, warp_reduce(score, MaxOp()));
        const float rescale = expf(running_max - new_max), weight = c <= last ? expf(score - new_max) : 0.0f;
        denom_part = denom_part * rescale + weight;
        weights[warp][lane] = weight;
        cells[warp][lane] = cell;
        __syncwarp();
        const int n_valid = last - c0 + 1 < 32 ? last - c0 + 1 : 32;
        for (int j = 0; j < kPerLane; j++) {
            const int d = lane + 32 * j;
            if (d >= p.head_dim_v) break;
            float sum = acc[j] * rescale;
            for (int i = 0; i < n_valid; i++) sum += weights[warp][i] * f16_bits_to_float(v_cache[cells[warp][i] * p.v_row + size_t(hk) * p.head_dim_v + d]);
            acc[j] = sum;
        }
        __syncwarp();  // weights[] and cells[] are rewritten by the next chunk
        running_max = new_max;
    }
    const float denom = warp_sum(denom_part);
    for (int j = 0; j < kPerLane; j++) {
        const int d = lane + 32 * j;
        if (d < p.head_dim_v) out[size_t(item) * p.head_dim_v + d] = acc[j] / denom;
    }
}
