// params.h - the parameter blocks kernels take by value, shared with the host code that fills them
// (plain C++: the host side includes it without CUDA).
#pragma once
#ifndef __CUDACC_RTC__  // NVRTC has no C++ library headers; size_t is built in there
#include <cstddef>
#endif

// RoPE (rope_cache): YaRN is on when ext_factor != 0; freq_factors divide theta (nullptr: none).
struct RopeParams {
    int n_rot;
    float base, freq_scale, attn_factor;
    float ext_factor, beta_fast, beta_slow;
    int n_ctx_orig;
    const float* freq_factors;
};

// Fused attention (flash_attn_K_V).
struct AttnParams {
    int n_tokens, n_head, n_head_kv, head_dim_k, head_dim_v;
    int k_row, v_row;  // bytes per cache cell
    float scale;       // multiplies q.k
    int n_swa;         // sliding window in tokens, 0: none
    int pages_per_seq, page_size;
    int exact_softmax;  // -fa off: the softmax first, then V (else the online softmax)
};

// MoE routing (moe_route): the CPU's moe_route parameters.
struct MoeParams {
    int n_expert, n_used, n_groups, n_group_used;
    int sigmoid, normalize;  // gating: sigmoid (else softmax); renormalize the chosen weights
    float scale;             // multiplies the chosen weights
};
constexpr int kMaxExperts = 512, kMaxExpertsUsed = 64;

// Bytes of the integer activation blocks (q8_1: 32 values, q8_K: 256; quants.cuh checks them).
constexpr size_t kQ8_1Bytes = 36, kQ8_KBytes = 292;

// Launch geometry the host and the kernels agree on.
constexpr int kMatvecThreads = 256;    // 8 warps
constexpr int kMatvecRowsPerWarp = 4;  // and one reduction for the 4
constexpr int kMatvecRowsPerBlock = kMatvecThreads / 32 * kMatvecRowsPerWarp;
constexpr int kTile = 32, kMatmulThreads = 256;  // matmul: 32 x 32 output tiles
constexpr int kMmaRows = 64, kMmaTokens = 64, kMmaThreads = 128;  // tensor-core matmul (mma.cuh): 64 x 64 tiles, 4 warps
constexpr int kAttnThreads = 128;                // attention: 4 (token, head) pairs per block
constexpr int kAttnMaxHeadDim = 576;  // DeepSeek's latent rows: 512 + 64
