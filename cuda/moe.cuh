// moe.cuh - mixture-of-experts routing on the device: each token's experts chosen as the CPU's
// moe_route chooses them (softmax or sigmoid gating, selection bias, group-limited selection, top-k,
// normalization, scale), the batch's (token, expert) pairs grouped by expert so the *_id products read
// each expert's weights once per batch, and the experts' outputs summed back per token.
#pragma once
#include "common.cuh"
#include "params.h"


// The index of the largest value among those not taken (the lowest index of equals), or -1.
__device__ __forceinline__ int best_untaken(const float* v, const bool* taken, int n) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

// One thread per token: logits (n_tokens x n_expert) -> the n_used experts (ascending, the order
// the CPU adds their outputs in) and their weights. Sums in double as the CPU's.
LLM_KERNEL void moe_route(const float* logits, const float* selection_bias, int* experts, float* weights, int n_tokens, MoeParams p) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tokens) return;
    const int X = p.n_expert, K = p.n_used;
    const float* l = logits + size_t(t) * X;
    float probs[kMaxExperts], select[kMaxExperts];
    bool taken[kMaxExperts];
    if (p.sigmoid) {
        for (int e = 0; e < X; e++) probs[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        float mx = l[0];
        for (int e = 1; e < X; e++) mx = fmaxf(mx, l[e]);
        double sum = 0;
        for (int e = 0; e < X; e++) sum += (probs[e] = expf(l[e] - mx));
        for (int e = 0; e < X; e++) probs[e] = float(probs[e] / sum);
    }
    for (int e = 0; e < X; e++) select[e] = probs[e] + (selection_bias ? selection_bias[e] : 0.0f), taken[e] = false;
    if (p.n_groups > 1) {  // keep the n_group_used groups whose two best experts score highest
        const int per = X / p.n_groups;
        float group_score[kMaxExperts];
        for (int g = 0; g < p.n_groups; g++) {
            float first = -INFINITY, second = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (select[e] > first) second = first, first = select[e];
                else if (select[e] > second) second = select[e];
            }
            group_score[g] = first + (per > 1 ? second : 0.0f);
        }
        bool kept[kMaxExperts];
        for (int g = 0; g < p.n_groups; g++) kept[g] = false;
        for (int i = 0; i < p.n_group_used; i++) kept[best_untaken(group_score, kept, p.n_groups)] = true;
        for (int e = 0; e < X; e++)
            if (!kept[e / per]) select[e] = -INFINITY;
    }
    int chosen[kMaxExpertsUsed];
    double sum = 0;
    for (int j = 0; j < K; j++) {
        chosen[j] = best_untaken(select, taken, X);
        taken[chosen[j]] = true;
        sum += probs[chosen[j]];
    }
    for (int e = 0, j = 0; e < X; e++) {  // ascending expert order
        if (!taken[e]) continue;
        float w = probs[e];
        if (p.normalize) w = float(w / sum);
        experts[size_t(t) * K + j] = e;
        weights[size_t(t) * K + j] = w * p.scale;
        j++;
    }
}

// Groups the n_tokens x n_used choices by expert, tokens ascending within each (one block): first[e]
// .. first[e + 1] are expert e's rows of the gathered activations, row_token[r] the token of row r, and
// slot[t * n_used + j] the row of token t's j-th expert.
LLM_KERNEL void moe_group(const int* experts, int n_tokens, int n_used, int n_expert, int* first, int* row_token, int* slot) {
    __shared__ int offset[kMaxExperts + 1];
    const int n_pairs = n_tokens * n_used;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        int count = 0;
        for (int i = 0; i < n_pairs; i++) count += experts[i] == e;
        offset[e + 1] = count;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        offset[0] = 0;
        for (int e = 0; e < n_expert; e++) offset[e + 1] += offset[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= n_expert; e += blockDim.x) first[e] = offset[e];
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        int row = offset[e];
        for (int i = 0; i < n_pairs; i++)
            if (experts[i] == e) row_token[row] = i / n_used, slot[i] = row++;
    }
}

// out row t (dim values) = sum over its experts j (ascending) of weights[t, j] * rows[slot[t, j]].
LLM_KERNEL void moe_combine(const float* rows, const int* slot, const float* weights, float* out, int dim, int n_used) {
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float sum = 0.0f;
        for (int j = 0; j < n_used; j++) sum += weights[t * n_used + j] * rows[size_t(slot[t * n_used + j]) * dim + i];
        out[size_t(t) * dim + i] = sum;
    }
}
