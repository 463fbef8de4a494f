// ops.cuh - the element-wise and per-row operations of a transformer block: embedding lookup, RMSNorm,
// RoPE, gated activations, residual adds, scaling, softmax.
#pragma once
#include "params.h"
#include "quants.cuh"

constexpr int kRowThreads = 256;  // one block per row for the per-row kernels

// out[i] = row ids[i] of the embedding table (type T), times scale (Gemma: sqrt(n_embd)).
template <class T> __device__ void get_rows(const uint8_t* table, size_t row_bytes, const int* ids, float* out, int dim, float scale) {
    const uint8_t* row = table + size_t(ids[blockIdx.x]) * row_bytes;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[size_t(blockIdx.x) * dim + i] = row_value<T>(row, i) * scale;
}
#define LLM_GET_ROWS(name, T) \
    LLM_KERNEL void get_rows_##name(const uint8_t* table, size_t row_bytes, const int* ids, float* out, int dim, float scale) { \
        get_rows<T>(table, row_bytes, ids, out, dim, scale); \
    }
LLM_FOR_EACH_WEIGHT_TYPE(LLM_GET_ROWS)

// Row blockIdx.x (dim values, rows `stride` apart) = x / rms(x) * weight; in place when out == x.
// Serves the block norms, Q/K norms (rows = heads) and MLA's latent norm (stride > dim).
LLM_KERNEL void rms_norm(const float* x, const float* weight, float* out, int dim, int stride, float eps) {
    const float* in = x + size_t(blockIdx.x) * stride;
    float* o = out + size_t(blockIdx.x) * stride;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) sum += in[i] * in[i];
    sum = block_reduce(sum, SumOp());
    const float scale = rsqrtf(sum / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = in[i] * scale * weight[i];
}

// RoPE as the CPU computes it: cos/sin per token by repeated multiplication of theta in float
// (rope_cache, one thread per token), then the rotation of every head (rope).

// YaRN's correction dimension for n_rot_beta rotations over the original context.
__device__ __forceinline__ float yarn_corr_dim(const RopeParams& p, float n_rot_beta) {
    return p.n_rot * logf(p.n_ctx_orig / (n_rot_beta * 2 * 3.14159265358979323846f)) / (2 * logf(p.base));
}

// cs[t * n_rot + i0] = cos, [.. + i0 + 1] = sin of pair i0 / 2 at position pos[t].
LLM_KERNEL void rope_cache(const int* pos, float* cs, int n_tokens, RopeParams p) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tokens) return;
    const float theta_scale = powf(p.base, -2.0f / p.n_rot);
    float corr0 = 0.0f, corr1 = 0.0f;
    if (p.ext_factor != 0.0f) {
        corr0 = fmaxf(0.0f, floorf(yarn_corr_dim(p, p.beta_fast)));
        corr1 = fminf(float(p.n_rot - 1), ceilf(yarn_corr_dim(p, p.beta_slow)));
    }
    float theta = float(pos[t]);
    for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
        const float extrap = theta / (p.freq_factors ? p.freq_factors[i0 / 2] : 1.0f), interp = p.freq_scale * extrap;
        float angle = interp, mscale = p.attn_factor;
        if (p.ext_factor != 0.0f) {
            const float y = (i0 / 2 - corr0) / fmaxf(0.001f, corr1 - corr0);
            const float mix = (1 - fminf(1.0f, fmaxf(0.0f, y))) * p.ext_factor;
            angle = interp * (1 - mix) + extrap * mix;
            mscale *= 1.0f + 0.1f * logf(1.0f / p.freq_scale);
        }
        cs[size_t(t) * p.n_rot + i0] = cosf(angle) * mscale;
        cs[size_t(t) * p.n_rot + i0 + 1] = sinf(angle) * mscale;
        theta *= theta_scale;
    }
}

// Rotates n_rot dims from `offset` of every head of token blockIdx.x (head h at
// data + (t * n_heads + h) * head_stride); neox: pairs (i, i + n_rot / 2), else adjacent pairs.
LLM_KERNEL void rope(float* data, const float* cs, int n_heads, int head_stride, int offset, int n_rot, int neox) {
    const int t = blockIdx.x, pairs = n_rot / 2;
    for (int e = threadIdx.x; e < n_heads * pairs; e += blockDim.x) {
        const int h = e / pairs, i0 = 2 * (e % pairs);
        float* r = data + (size_t(t) * n_heads + h) * head_stride + offset;
        const int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + pairs : i0 + 1;
        const float x0 = r[a], x1 = r[b], c = cs[size_t(t) * n_rot + i0], s = cs[size_t(t) * n_rot + i0 + 1];
        r[a] = x0 * c - x1 * s;
        r[b] = x0 * s + x1 * c;
    }
}

// gate = silu(gate) * up (llama, qwen) or gelu(gate) * up (gemma: tanh GELU with the input and output
// rounded to f16, as ggml's table evaluates it).
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float round_f16(float x) { return __half2float(__float2half(x)); }
__device__ __forceinline__ float gelu_f16(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float xh = round_f16(x);
    return round_f16(0.5f * xh * (1.0f + tanhf(0.79788456080286535588f * xh * (1.0f + 0.044715f * xh * xh))));
}
// fn(i) for every i < n, the grid's threads striding over them (any grid size works).
template <class Fn> __device__ __forceinline__ void grid_stride(long long n, Fn fn) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) fn(i);
}
LLM_KERNEL void silu_mul(float* gate, const float* up, long long n) {
    grid_stride(n, [=](long long i) { gate[i] = silu(gate[i]) * up[i]; });
}
LLM_KERNEL void gelu_mul(float* gate, const float* up, long long n) {
    grid_stride(n, [=](long long i) { gate[i] = gelu_f16(gate[i]) * up[i]; });
}

// x[i] += y[i % period]: residual adds (period = n) and biases (period = row width).
LLM_KERNEL void add(float* x, const float* y, long long n, long long period) {
    grid_stride(n, [=](long long i) { x[i] += y[i % period]; });
}
LLM_KERNEL void scale(float* x, float factor, long long n) {
    grid_stride(n, [=](long long i) { x[i] *= factor; });
}

// Row blockIdx.x: width values from src_offset of a src row (src_stride apart) to dst_offset of a dst
// row (dst_stride apart): per-head slices gathered into dense blocks and scattered back (MLA).
LLM_KERNEL void copy_cols(const float* src, int src_stride, int src_offset, float* dst, int dst_stride, int dst_offset, int width) {
    const float* from = src + size_t(blockIdx.x) * src_stride + src_offset;
    float* to = dst + size_t(blockIdx.x) * dst_stride + dst_offset;
    for (int i = threadIdx.x; i < width; i += blockDim.x) to[i] = from[i];
}

// dst row i = src row rows[i] (dim values): the rows that want logits.
LLM_KERNEL void gather_rows(const float* src, const int* rows, float* dst, int dim) {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[size_t(blockIdx.x) * dim + i] = src[size_t(rows[blockIdx.x]) * dim + i];
}

// Row blockIdx.x of x (n values) = softmax(x * factor), max-subtracted.
LLM_KERNEL void softmax(float* x, int n, float factor) {
    float* row = x + size_t(blockIdx.x) * n;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, row[i] * factor);
    m = block_reduce(m, MaxOp());
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        row[i] = expf(row[i] * factor - m);
        sum += row[i];
    }
    sum = block_reduce(sum, SumOp());
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] /= sum;
}
