// kernels.cuh - every kernel, and the list of the untyped ones by name (the typed ones are named by
// LLM_FOR_EACH_WEIGHT_TYPE / _DP4A_TYPE / _Q8_K_TYPE / _KV_TYPE / _KV_PAIR):
// what a host looks up. The tensor-core matmul_mma_* exist from sm_80 on.
#pragma once
#include "matvec.cuh"
#include "matmul.cuh"
#include "mma.cuh"  // sm_80 and up
#include "ops.cuh"
#include "attention.cuh"
#include "moe.cuh"

#define LLM_FOR_EACH_KERNEL(X) \
    X(quantize_q8_1) X(quantize_q8_K) X(rms_norm) X(rope_cache) X(rope) X(silu_mul) X(gelu_mul) X(add) X(scale) X(softmax) \
    X(gather_rows) X(copy_cols) X(hadamard) X(moe_route) X(moe_group) X(moe_combine)
