// kernels.cuh - every kernel, and the list of the untyped ones by name (the typed ones are named by
// LLM_FOR_EACH_WEIGHT_TYPE / LLM_FOR_EACH_DP4A_TYPE): what a host looks up.
#pragma once
#include "matvec.cuh"
#include "matmul.cuh"
#include "ops.cuh"
#include "attention.cuh"

#define LLM_FOR_EACH_KERNEL(X) \
    X(quantize_q8_1) X(rms_norm) X(rope_cache) X(rope) X(silu_mul) X(gelu_mul) X(add) X(scale) X(softmax) \
    X(gather_rows) X(store_f16_rows) X(flash_attn_f16)
