// attention.cuh - fused attention over the f16 KV cache (flash-attention style): for each query token
// and head, one pass over its visible cache cells with an online softmax, so no n_tokens x n_kv score
// matrix exists anywhere.
//
// One warp per (token, head); lane l holds dims l, l + 32, ... of the query and of the output. Cache
// cell c holds position c of the sequence: n_head_kv heads of K (k_row f16 values per cell) and of V.
// Token t sees cells [lo, pos[t]] (lo = pos[t] - n_swa + 1 for a sliding window, else 0).
#pragma once
#include "common.cuh"

constexpr int kAttnThreads = 128;    // 4 warps: 4 (token, head) pairs per block
constexpr int kAttnMaxHeadDim = 256; // 8 values per lane

struct AttnParams {
    int n_tokens, n_head, n_head_kv, head_dim_k, head_dim_v;
    int k_row, v_row;  // f16 values per cache cell
    float scale;       // multiplies q.k
    int n_swa;         // sliding window in tokens, 0: none
};

LLM_KERNEL void flash_attn_f16(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const int* pos, float* out, AttnParams p) {
    const int item = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (item >= p.n_tokens * p.n_head) return;
    const int t = item / p.n_head, h = item % p.n_head, hk = h / (p.n_head / p.n_head_kv);
    constexpr int kPerLane = kAttnMaxHeadDim / 32;
    // The query in f16, as the CPU's f16 dot product converts it.
    float qv[kPerLane], acc[kPerLane];
    for (int j = 0; j < kPerLane; j++) {
        const int d = lane + 32 * j;
        qv[j] = d < p.head_dim_k ? __half2float(__float2half(q[size_t(item) * p.head_dim_k + d])) : 0.0f;
        acc[j] = 0.0f;
    }
    const int last = pos[t], first = p.n_swa > 0 && last - p.n_swa + 1 > 0 ? last - p.n_swa + 1 : 0;
    float running_max = -INFINITY, denom = 0.0f;
    for (int c = first; c <= last; c++) {
        const uint16_t* k = k_cache + size_t(c) * p.k_row + size_t(hk) * p.head_dim_k;
        float dot = 0.0f;
        for (int j = 0; j < kPerLane; j++) {
            const int d = lane + 32 * j;
            if (d < p.head_dim_k) dot += qv[j] * f16_bits_to_float(k[d]);
        }
        const float score = warp_sum(dot) * p.scale;
        const float new_max = fmaxf(running_max, score);
        const float rescale = expf(running_max - new_max), weight = expf(score - new_max);
        denom = denom * rescale + weight;
        const uint16_t* v = v_cache + size_t(c) * p.v_row + size_t(hk) * p.head_dim_v;
        for (int j = 0; j < kPerLane; j++) {
            const int d = lane + 32 * j;
            acc[j] = acc[j] * rescale + (d < p.head_dim_v ? weight * f16_bits_to_float(v[d]) : 0.0f);
        }
        running_max = new_max;
    }
    for (int j = 0; j < kPerLane; j++) {
        const int d = lane + 32 * j;
        if (d < p.head_dim_v) out[size_t(item) * p.head_dim_v + d] = acc[j] / denom;
    }
}
