// backend.hpp - the host side of the GPU backend: llm::OffloadBackend over a Device (CUDA's driver API,
// or the SIMT emulator in tests), running the device layers of a transformer (llama, qwen2, qwen3,
// gemma3; qwen3moe and deepseek2 with MoE FFNs, deepseek2 with MLA attention) with the kernels of
// cuda/*.cuh, launched by name.
//
// Weights are uploaded from the file's layout at context creation; the KV cache (f16, q8_0, q4_0 or
// iq4_nl, K and V independently, rows rotated as the CPU's are) holds one row per cell of the context's
// pool, so the CPU's page tables address it. A batch uploads the activations once,
// runs every device layer, and downloads either the activations or the logits once.
#pragma once
#include "../llm.hpp"
#include "params.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace llm_gpu {

struct Grid {
    unsigned x = 1, y = 1, z = 1;
};

// A device's record of a batch's launches (Device::capture), freed with it.
class Graph {
public:
    virtual ~Graph() = default;
};

// What the backend needs of a device: memory, copies, launches of the kernels by their extern "C" name
// (args: pointers to each argument, as cuLaunchKernel takes them). Errors throw llm::Error naming the
// operation (and kernel); alloc throws llm::DeviceMemoryError when the device is out of memory.
class Device {
public:
    virtual ~Device() = default;
    virtual std::string name() const = 0;         // "CUDA0"
    virtual std::string description() const = 0;  // "NVIDIA H200"
    virtual size_t total_bytes() const = 0;
    virtual size_t free_bytes() const = 0;
    virtual void* alloc(size_t bytes) = 0;
    virtual void release(void* p) = 0;
    virtual void upload(void* dst, const void* src, size_t bytes) = 0;
    virtual void download(void* dst, const void* src, size_t bytes) = 0;
    virtual void launch(const char* kernel, Grid grid, Grid block, void** args) = 0;
    // major * 10 + minor ("80": sm_80), which picks the kernels a batch uses (0: unknown, none of the
    // architecture-specific ones).
    virtual int compute_capability() const { return 0; }
    // Decode graphs (CUDA graphs): calls `launches` with this thread's launches recorded, not run, and
    // returns the record, which replay() runs as one launch (the kernels read their per-token inputs
    // from device memory, so one record serves every token of its shape). nullptr and why_not when the
    // device cannot record them: nothing ran, the caller launches one by one.
    virtual std::unique_ptr<Graph> capture(const std::function<void()>& launches, std::string& why_not) = 0;
    virtual void replay(Graph& graph) = 0;
};

template <class... Args> void launch(Device& d, const char* kernel, Grid grid, Grid block, Args... args) {
    void* ptrs[] = {&args..., nullptr};
    d.launch(kernel, grid, block, ptrs);
}

// Device memory owned by one object.
class Buffer {
public:
    Buffer() = default;
    Buffer(Device& d, size_t bytes) : dev_(&d), bytes_(bytes), ptr_(bytes ? d.alloc(bytes) : nullptr) {}
    Buffer(Buffer&& o) noexcept { *this = std::move(o); }
    Buffer& operator=(Buffer&& o) noexcept {
        std::swap(dev_, o.dev_);
        std::swap(bytes_, o.bytes_);
        std::swap(ptr_, o.ptr_);
        return *this;
    }
    ~Buffer() { if (ptr_) dev_->release(ptr_); }
    template <class T = void> T* get() const { return static_cast<T*>(ptr_); }
    size_t bytes() const { return bytes_; }

private:
    Device* dev_ = nullptr;
    size_t bytes_ = 0;
    void* ptr_ = nullptr;
};

// The kernel-name suffix of a weight type ("q4_K"), or nullptr when no kernel reads it.
inline const char* kernel_type_name(llm::Type t) {
    switch (t) {
    case llm::Type::F32: case llm::Type::F16: case llm::Type::BF16: case llm::Type::Q4_0: case llm::Type::Q4_1:
    case llm::Type::Q5_0: case llm::Type::Q5_1: case llm::Type::Q8_0: case llm::Type::IQ4_NL: case llm::Type::Q2_K:
    case llm::Type::Q3_K: case llm::Type::Q4_K: case llm::Type::Q5_K: case llm::Type::Q6_K:
        return llm::type_info(t).name;
    default: return nullptr;
    }
}
// The integer activations a type's matvec multiplies by through dp4a, as the CPU multiplies it by
// 8-bit activations: "q8_1" for the 32-value integer types, "q8_K" for the K-quants, nullptr (f32
// activations) for the float types.
inline const char* int_activation(llm::Type t) {
    switch (t) {
    case llm::Type::Q4_0: case llm::Type::Q4_1: case llm::Type::Q5_0: case llm::Type::Q5_1: case llm::Type::Q8_0: case llm::Type::IQ4_NL:
        return "q8_1";
    case llm::Type::Q2_K: case llm::Type::Q3_K: case llm::Type::Q4_K: case llm::Type::Q5_K: case llm::Type::Q6_K: return "q8_K";
    default: return nullptr;
    }
}

// A weight on the device, in the file's layout: one matrix, or all experts' (expert_bytes apart, rows
// per expert).
struct DeviceTensor {
    Buffer data;
    llm::Type type = llm::Type::F32;
    int64_t k = 0, rows = 0;  // ne[0], the rest
    size_t row_bytes = 0, expert_bytes = 0;
    explicit operator bool() const { return data.get() != nullptr; }
};

struct DeviceLayer {
    DeviceTensor attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, post_attn_norm;
    DeviceTensor ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffn_norm;
    DeviceTensor gate_inp, exp_probs_b, gate_exps, up_exps, down_exps, gate_shexp, up_shexp, down_shexp;  // MoE
    DeviceTensor wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm;  // MLA, with per-head k_b / v_b
    std::vector<DeviceTensor> k_b, v_b;
    Buffer k_cache, v_cache;  // n_cells rows of n_head_kv * head_dim values, in the cache types
};

// A cache type's kernel-name suffix ("q8_0"), or nullptr when no kernel stores it.
inline const char* kv_kernel_type_name(llm::Type t) {
    return t == llm::Type::F16 || t == llm::Type::Q8_0 || t == llm::Type::Q4_0 || t == llm::Type::IQ4_NL ? llm::type_info(t).name : nullptr;
}

// One slice of the placement (a range of layers, and maybe the output) on one device.
class Forward : public llm::OffloadBackend {
public:
    Forward(Device& dev, const llm::Model& model, const llm::ContextParams& cp, int n_cells, const llm::Placement::Slice& slice)
        : dev_(dev), model_(model), hp_(model.hp), n_cells_(n_cells), first_layer_(slice.first_layer), has_output_(slice.output), type_k_(cp.type_k),
          type_v_(cp.type_v), exact_softmax_(cp.flash_attn == llm::FlashAttn::Off), rot_k_(llm::kv_rotation(cp.type_k, hp_.head_dim_k, true, hp_.mla)),
          rot_v_(llm::kv_rotation(cp.type_v, hp_.head_dim_v, false, hp_.mla)), tensor_cores_(uses_tensor_cores(dev)),
          graphs_on_(!std::getenv("GGML_CUDA_DISABLE_GRAPHS")) {
        check_supported();
        for (int il = slice.first_layer; il < slice.end_layer; il++) layers_.push_back(upload_layer(il));
        if (has_output_) {
            output_norm_ = upload(model.output_norm);
            output_ = upload(model.output);
        }
        if (model.rope_freqs) rope_freqs_ = upload(model.rope_freqs);
    }

    size_t bytes_per_cell() const override { return layers_.size() * (k_row_bytes() + v_row_bytes()); }

    // The batch's inputs go over in two copies (the activations, then one table of positions,
    // sequences, cells, logits rows and pages), its launches run one by one or as the decode graph of
    // its shape, and the activations or the logits come back in one copy.
    void forward(const llm::OffloadBatch& b, float* x, int n_logits, const int32_t* logit_rows, float* logits) override {
        const int n = (int)b.batch->size(), n_output_rows = has_output_ ? n_logits : 0;
        const int64_t embd = hp_.n_embd;
        llm::OffloadBatch padded = b;  // the device's page table: rows at a bucketed stride
        padded.pages_per_seq = page_table_stride(b);
        reserve(n, has_output_ ? std::max(1, n_logits) : 0, padded);
        dev_.upload(x_.get(), x, sizeof(float) * n * embd);
        upload_tables(b, padded.pages_per_seq, n_output_rows, logit_rows);
        run_launches(padded, n, n_output_rows);
        if (!has_output_) dev_.download(x, x_.get(), sizeof(float) * n * embd);
        else if (n_logits > 0) dev_.download(logits, logits_.get(), sizeof(float) * n_logits * hp_.n_vocab);
    }

    std::vector<uint8_t> read_cells(const std::vector<int32_t>& cells) override {
        std::vector<uint8_t> out(cells.size() * bytes_per_cell());
        uint8_t* p = out.data();
        for_each_cache_row(cells, [&](uint8_t* row, size_t bytes) { dev_.download(p, row, bytes), p += bytes; });
        return out;
    }
    void write_cells(const std::vector<int32_t>& cells, const uint8_t* bytes) override {
        for_each_cache_row(cells, [&](uint8_t* row, size_t n) { dev_.upload(row, bytes, n), bytes += n; });
    }

private:
    Device& dev_;
    const llm::Model& model_;
    const llm::HParams& hp_;
    int n_cells_;
    int first_layer_;
    bool has_output_;
    llm::Type type_k_, type_v_;
    bool exact_softmax_;  // -fa off: llama.cpp's attention without flash attention (attention.cuh)
    int rot_k_, rot_v_;  // the Walsh-Hadamard blocks of a quantized cache's rows (0: none)
    bool tensor_cores_;  // prefill's integer products through mma.cuh (sm_80 and up)
    std::vector<DeviceLayer> layers_;
    DeviceTensor output_norm_, output_, rope_freqs_;
    // Activations and per-batch tables, grown to the largest batch seen.
    int capacity_ = 0, logit_capacity_ = 0;
    size_t page_capacity_ = 0;
    Buffer x_, cur_, tmp_, q_, k_, v_, attn_, gate_, up_, act_q8_, rope_cs_, logits_;
    // One table per batch, uploaded at once (upload_tables): positions, sequences, cells, logits rows,
    // page table; where this batch's parts start in it (the same places for every batch of a shape).
    Buffer tables_;
    std::vector<int32_t> host_tables_;
    const int *pos_ = nullptr, *seq_ = nullptr, *cells_ = nullptr, *logit_rows_ = nullptr, *pages_ = nullptr;
    // Decode graphs by shape (tokens, logits rows, page table stride); a shape seen once maps to nullptr
    // until it comes again. Cleared when reserve() reallocates the buffers they read.
    bool graphs_on_;
    std::map<std::tuple<int, int, int>, std::unique_ptr<Graph>> graphs_;
    static constexpr size_t kMaxGraphs = 16;
    // MoE: router logits, each token's experts and weights, the expert-sorted rows (moe_group).
    Buffer router_, experts_, expert_weights_, expert_first_, row_token_, slot_, gathered_, expert_out_, shexp_out_;
    // MLA: the projected query and [latent | rope] rows, the low-rank query, one head's slice in and
    // out of its k_b / v_b product, and the heads' v_b outputs side by side.
    Buffer mla_q_, mla_kv_a_, mla_q_a_, mla_head_in_, mla_head_out_, mla_v_;

    // fn(device row, bytes) for the K then V row of every cell, layer by layer (seq_save's order).
    template <class Fn> void for_each_cache_row(const std::vector<int32_t>& cells, Fn fn) {
        for (DeviceLayer& L : layers_)
            for (const std::pair<Buffer*, size_t>& cache : {std::make_pair(&L.k_cache, k_row_bytes()), std::make_pair(&L.v_cache, v_row_bytes())})
                for (int32_t c : cells)
                    if (cache.second) fn(cache.first->get<uint8_t>() + c * cache.second, cache.second);
    }

    int64_t kv_row() const { return int64_t(hp_.n_head_kv) * hp_.head_dim_k; }
    size_t k_row_bytes() const { return llm::row_bytes(type_k_, kv_row()); }
    size_t v_row_bytes() const { return hp_.mla ? 0 : llm::row_bytes(type_v_, kv_row()); }  // a latent cache has no V
    static size_t page_table_ints(const llm::OffloadBatch& b) { return size_t(b.pages_per_seq) * b.n_seq; }

    void check_supported() const {
        using llm::Arch;
        if (hp_.arch != Arch::Llama && hp_.arch != Arch::Qwen2 && hp_.arch != Arch::Qwen3 && hp_.arch != Arch::Gemma3 && hp_.arch != Arch::Qwen3Moe &&
            hp_.arch != Arch::Deepseek2)
            throw llm::Error(std::string("GPU offload: ") + llm::arch_name(hp_.arch) + " is not supported yet (llama, qwen2, qwen3, gemma3, qwen3moe, deepseek2)");
        if (hp_.n_expert > kMaxExperts || hp_.n_expert_used > kMaxExpertsUsed)
            throw llm::Error("GPU offload: at most " + std::to_string(kMaxExperts) + " experts, " + std::to_string(kMaxExpertsUsed) + " per token");
        for (llm::Type t : {type_k_, hp_.mla ? type_k_ : type_v_})
            if (!kv_kernel_type_name(t))
                throw llm::Error(std::string("GPU offload: KV cache type ") + llm::type_info(t).name + " is not supported (f16, q8_0, q4_0, iq4_nl)");
        if ((!hp_.mla && hp_.head_dim_k != hp_.head_dim_v) || hp_.head_dim_k > kAttnMaxHeadDim || hp_.n_embd % 32)
            throw llm::Error("GPU offload: head sizes above " + std::to_string(kAttnMaxHeadDim) + " or unequal K/V heads are not supported");
    }

    DeviceTensor upload(const llm::TensorInfo* t) {
        DeviceTensor d;
        if (!t) return d;
        if (!kernel_type_name(t->type)) throw llm::Error("GPU offload: tensor " + t->name + " has unsupported type " + llm::type_info(t->type).name);
        if (t->interleaved) throw llm::Error("GPU offload: tensor " + t->name + " was repacked for the CPU");
        d.type = t->type;
        d.k = t->ne[0];
        d.rows = t->ne[1] * t->ne[2] * t->ne[3];
        d.row_bytes = llm::row_bytes(t->type, d.k);
        d.data = Buffer(dev_, t->nbytes);
        dev_.upload(d.data.get(), t->data, t->nbytes);
        return d;
    }

    // All experts' slices of one tensor (contiguous in the file) as one device tensor.
    DeviceTensor upload_experts(const std::vector<llm::TensorInfo>& slices) {
        for (size_t e = 1; e < slices.size(); e++)
            if (slices[e].data != slices[0].data + e * slices[0].nbytes) throw llm::Error("GPU offload: the experts of " + slices[0].name + " are not contiguous");
        llm::TensorInfo all = slices[0];
        all.nbytes *= slices.size();
        all.ne[2] *= int64_t(slices.size());
        DeviceTensor d = upload(&all);
        d.rows /= int64_t(slices.size());
        d.expert_bytes = slices[0].nbytes;
        return d;
    }

    DeviceLayer upload_layer(int il) {
        const llm::LayerWeights& W = model_.layers[il];
        DeviceLayer L;
        L.attn_norm = upload(W.attn_norm);
        L.wq = upload(W.wq), L.wk = upload(W.wk), L.wv = upload(W.wv), L.wo = upload(W.wo);
        L.bq = upload(W.bq), L.bk = upload(W.bk), L.bv = upload(W.bv);
        L.q_norm = upload(W.q_norm), L.k_norm = upload(W.k_norm), L.post_attn_norm = upload(W.post_attn_norm);
        L.ffn_norm = upload(W.ffn_norm), L.ffn_gate = upload(W.ffn_gate), L.ffn_up = upload(W.ffn_up), L.ffn_down = upload(W.ffn_down);
        L.post_ffn_norm = upload(W.post_ffn_norm);
        if (W.wkv_a) {
            L.wq_a = upload(W.wq_a), L.q_a_norm = upload(W.q_a_norm), L.wq_b = upload(W.wq_b);
            L.wkv_a = upload(W.wkv_a), L.kv_a_norm = upload(W.kv_a_norm);
            for (const llm::TensorInfo& t : W.k_b) L.k_b.push_back(upload(&t));
            for (const llm::TensorInfo& t : W.v_b) L.v_b.push_back(upload(&t));
        }
        if (W.gate_inp) {
            L.gate_inp = upload(W.gate_inp), L.exp_probs_b = upload(W.exp_probs_b);
            L.gate_exps = upload_experts(W.gate_exp), L.up_exps = upload_experts(W.up_exp), L.down_exps = upload_experts(W.down_exp);
            L.gate_shexp = upload(W.gate_shexp), L.up_shexp = upload(W.up_shexp), L.down_shexp = upload(W.down_shexp);
        }
        L.k_cache = Buffer(dev_, size_t(n_cells_) * k_row_bytes());
        L.v_cache = Buffer(dev_, size_t(n_cells_) * v_row_bytes());
        return L;
    }

public:
    // Bytes of the activation buffers a batch of n_tokens needs (all of them logits rows on the output's
    // slice): what the load log and --plan report.
    static size_t compute_bytes(const llm::HParams& hp, const llm::Placement::Slice& slice, int n_tokens) {
        size_t total = 0;
        activation_buffers(hp, n_tokens, slice.output ? n_tokens : 0, 1, [&](Buffer Forward::*, size_t bytes) { total += bytes; });
        return total;
    }

private:
    // Every activation buffer and table with its bytes for n tokens, n_logits logits rows and a page table
    // of `pages` ints: reserve() allocates them, compute_bytes() adds them up.
    template <class Visit> static void activation_buffers(const llm::HParams& hp, size_t N, size_t n_logits, size_t pages, Visit visit) {
        const size_t embd = hp.n_embd, q_width = size_t(hp.n_head) * hp.head_dim_k, kv_width = size_t(hp.n_head_kv) * hp.head_dim_k;
        const size_t n_expert = hp.n_expert, n_used = std::max(1, hp.n_expert_used), ff_expert = hp.n_ff_exp, f = sizeof(float);
        // Rows of the FFN's hidden buffers per token: the dense FFN's, the shared experts', or the
        // n_used chosen experts' (moe_group's gathered rows).
        const size_t ff = std::max({size_t(hp.n_ff), ff_expert * hp.n_expert_shared, n_used * ff_expert});
        // The most values per token any product quantizes (MoE: the n_used gathered rows of a token).
        const size_t widest = std::max({embd, ff, q_width, size_t(hp.q_lora_rank), size_t(hp.n_head) * hp.v_head_dim, n_expert ? n_used * embd : 0});
        visit(&Forward::x_, N * embd * f), visit(&Forward::cur_, N * std::max(embd, q_width) * f), visit(&Forward::tmp_, N * embd * f);
        visit(&Forward::q_, N * q_width * f), visit(&Forward::k_, N * kv_width * f), visit(&Forward::v_, N * kv_width * f);
        visit(&Forward::attn_, N * q_width * f);
        visit(&Forward::gate_, N * ff * f), visit(&Forward::up_, N * ff * f);
        visit(&Forward::act_q8_, N * std::max((widest + 31) / 32 * kQ8_1Bytes, (widest + 255) / 256 * kQ8_KBytes));
        visit(&Forward::rope_cs_, N * hp.n_rot * f);
        visit(&Forward::logits_, n_logits * hp.n_vocab * f);
        visit(&Forward::tables_, (3 * N + n_logits + std::max<size_t>(1, pages)) * 4);  // upload_tables' layout
        if (hp.mla) {
            const size_t heads = hp.n_head, rank = hp.kv_lora_rank, rot = hp.n_rot, nope = hp.qk_nope, v_dim = hp.v_head_dim;
            visit(&Forward::mla_q_, N * heads * (nope + rot) * f), visit(&Forward::mla_kv_a_, N * (rank + rot) * f);
            visit(&Forward::mla_q_a_, N * std::max<size_t>(1, hp.q_lora_rank) * f);
            visit(&Forward::mla_head_in_, N * std::max(nope, rank) * f), visit(&Forward::mla_head_out_, N * std::max(rank, v_dim) * f);
            visit(&Forward::mla_v_, N * heads * v_dim * f);
        }
        if (!n_expert) return;
        visit(&Forward::router_, N * n_expert * f), visit(&Forward::expert_weights_, N * n_used * f);
        visit(&Forward::gathered_, N * n_used * embd * f), visit(&Forward::expert_out_, N * n_used * embd * f), visit(&Forward::shexp_out_, N * embd * f);
        visit(&Forward::experts_, N * n_used * 4), visit(&Forward::row_token_, N * n_used * 4), visit(&Forward::slot_, N * n_used * 4);
        visit(&Forward::expert_first_, (n_expert + 1) * 4);
    }

    // Grows the activation buffers to n tokens (and the tables to this batch's page table). When the
    // device runs out of memory the buffers are all released (the next batch starts over) and the
    // error goes to the caller: that batch fails, the context stays usable.
    void reserve(int n, int n_logits, const llm::OffloadBatch& b) {
        const size_t pages = page_table_ints(b);
        if (n <= capacity_ && n_logits <= logit_capacity_ && pages <= page_capacity_) return;
        const int tokens = std::max(n, capacity_), logit_rows = std::max(n_logits, logit_capacity_);
        const size_t page_ints = std::max(pages, page_capacity_);
        capacity_ = logit_capacity_ = 0, page_capacity_ = 0;
        graphs_.clear();  // they read the buffers released here
        activation_buffers(hp_, 0, 0, 0, [&](Buffer Forward::*buffer, size_t) { this->*buffer = Buffer(); });
        activation_buffers(hp_, tokens, logit_rows, page_ints, [&](Buffer Forward::*buffer, size_t bytes) { this->*buffer = Buffer(dev_, bytes); });
        capacity_ = tokens, logit_capacity_ = logit_rows, page_capacity_ = page_ints;
    }

    // The int8 tensor-core products (mma.cuh) from sm_80 on, unless LLM_CUDA_MMA=0 asks for the dp4a
    // tiles (scripts/device-check compares the two).
    static bool uses_tensor_cores(const Device& dev) {
        const char* env = std::getenv("LLM_CUDA_MMA");
        return dev.compute_capability() >= 80 && !(env && std::string(env) == "0");
    }

    // The page table's row stride for b: its pages per sequence rounded up to a power of two (at most
    // the cache's pages), so a decode graph stays valid while its sequences grow within the bucket.
    int page_table_stride(const llm::OffloadBatch& b) const {
        const int cache_pages = (n_cells_ + b.page_size - 1) / b.page_size;
        int stride = 1;
        while (stride < b.pages_per_seq) stride *= 2;
        return std::max(b.pages_per_seq, std::min(stride, cache_pages));
    }

    // b's positions, sequences, cells, the n_output_rows logits rows and its page table (rows at
    // page_stride, padded) in one upload, in that order.
    void upload_tables(const llm::OffloadBatch& b, int page_stride, int n_output_rows, const int32_t* logit_rows) {
        const size_t n = b.batch->size(), pages_at = 3 * n + n_output_rows;
        host_tables_.assign(pages_at + size_t(page_stride) * b.n_seq, 0);
        int32_t* table = host_tables_.data();
        std::copy(b.batch->pos.begin(), b.batch->pos.end(), table);
        std::copy(b.batch->seq.begin(), b.batch->seq.end(), table + n);
        std::copy(b.cells, b.cells + n, table + 2 * n);
        std::copy(logit_rows, logit_rows + n_output_rows, table + 3 * n);
        for (int s = 0; s < b.n_seq; s++)
            std::copy(b.page_cells + size_t(s) * b.pages_per_seq, b.page_cells + size_t(s + 1) * b.pages_per_seq, table + pages_at + size_t(s) * page_stride);
        dev_.upload(tables_.get(), table, sizeof(int32_t) * host_tables_.size());
        const int* device_table = tables_.get<const int>();
        pos_ = device_table, seq_ = device_table + n, cells_ = device_table + 2 * n, logit_rows_ = device_table + 3 * n;
        pages_ = device_table + pages_at;
    }

    // Every launch of the batch: one by one, or, for decode (at most kMaxMatvecTokens tokens), as the
    // graph of its shape, recorded the second time the shape comes (a one-off short prompt is not
    // worth a capture) and replayed from then on.
    void run_launches(const llm::OffloadBatch& b, int n, int n_output_rows) {
        const std::function<void()> launches = [&] {
            for (size_t i = 0; i < layers_.size(); i++) run_layer(layers_[i], first_layer_ + (int)i, b, n);
            if (n_output_rows > 0) output(n_output_rows);
        };
        if (!graphs_on_ || n > kMaxMatvecTokens) return launches();
        const auto shape = std::make_tuple(n, n_output_rows, b.pages_per_seq);
        auto graph = graphs_.find(shape);
        if (graph == graphs_.end()) {
            if (graphs_.size() >= kMaxGraphs) graphs_.clear();
            graphs_.emplace(shape, nullptr);
            return launches();
        }
        if (!graph->second) {
            std::string why_not;
            graph->second = dev_.capture(launches, why_not);
            if (!graph->second) {
                fprintf(stderr, "llm: %s: no CUDA graphs (%s): kernels launched one by one\n", dev_.name().c_str(), why_not.c_str());
                graphs_on_ = false;
                return launches();
            }
        }
        dev_.replay(*graph->second);
    }

    // The logits of the n_rows rows logit_rows_ names (the output's slice).
    void output(int n_rows) {
        const int embd = int(hp_.n_embd);
        launch(dev_, "gather_rows", {unsigned(n_rows)}, {256}, x_.get<const float>(), logit_rows_, cur_.get<float>(), embd);
        norm(output_norm_, cur_.get<float>(), n_rows, embd);
        matmul(output_, cur_.get<const float>(), n_rows, logits_.get<float>());
    }

    // y (n x rows) = x (n x k) W^T: quantized types against q8_1 / q8_K activations through dp4a (the
    // CPU's 8-bit rounding), float types against f32 activations; up to kMaxMatvecTokens tokens
    // (decode, a few slots) the matvec kernels, larger batches the 32 x 32 tiles, or for the quantized
    // types from kMinMmaTokens on the tensor cores' 64 x 64 tiles where the device has them.
    static constexpr int kMaxMatvecTokens = 8, kMinMmaTokens = 16;
    void matmul(const DeviceTensor& w, const float* x, int n, float* y) { product(w, x, n, n, y, nullptr); }
    // The same for all experts of w at once (MoE): x holds n_rows rows grouped by expert as
    // expert_first says, at most n_per_expert of them per expert.
    void matmul_experts(const DeviceTensor& w, const float* x, int n_rows, int n_per_expert, float* y) {
        product(w, x, n_rows, n_per_expert, y, expert_first_.get<const int>());
    }
    void product(const DeviceTensor& w, const float* x, int n_rows, int n_per_expert, float* y, const int* expert_first) {
        const std::string type_name = kernel_type_name(w.type), expert_infix = expert_first ? "id_" : "";
        const int row_values = int(w.k), rows = int(w.rows);
        const unsigned n_experts = expert_first ? unsigned(hp_.n_expert) : 1;
        const uint8_t* weights = w.data.get<const uint8_t>();
        const Grid per_row{unsigned((rows + kMatvecRowsPerBlock - 1) / kMatvecRowsPerBlock), unsigned(n_per_expert), n_experts};
        const Grid tiles{unsigned((rows + kTile - 1) / kTile), unsigned((n_per_expert + kTile - 1) / kTile), n_experts};
        const bool matvec = n_per_expert <= kMaxMatvecTokens;
        const char* activation_type = int_activation(w.type);
        const bool dp4a = activation_type != nullptr;
        if (dp4a) {  // one warp per activation block
            const size_t blocks = size_t(n_rows) * row_values / (std::string(activation_type) == "q8_K" ? 256 : 32);
            launch(dev_, ("quantize_" + std::string(activation_type)).c_str(), {unsigned((blocks + 7) / 8)}, {256}, x, act_q8_.get<void>(), n_rows * row_values);
        }
        const bool mma = dp4a && tensor_cores_ && n_per_expert >= kMinMmaTokens;
        const std::string name = (matvec ? "matvec_" : mma ? "matmul_mma_" : "matmul_") + (dp4a ? std::string(activation_type) + "_" : "") + expert_infix + type_name;
        const Grid mma_tiles{unsigned((rows + kMmaRows - 1) / kMmaRows), unsigned((n_per_expert + kMmaTokens - 1) / kMmaTokens), n_experts};
        const Grid grid = matvec ? per_row : mma ? mma_tiles : tiles, block{unsigned(matvec ? kMatvecThreads : mma ? kMmaThreads : kMatmulThreads)};
        const void* activations = dp4a ? act_q8_.get<const void>() : x;
        if (expert_first) launch(dev_, name.c_str(), grid, block, weights, w.expert_bytes, w.row_bytes, activations, y, row_values, rows, expert_first);
        else if (matvec) launch(dev_, name.c_str(), grid, block, weights, w.row_bytes, activations, y, row_values, rows);
        else launch(dev_, name.c_str(), grid, block, weights, w.row_bytes, activations, y, row_values, rows, n_rows);
    }

    // RMSNorm of n rows of dim values in place.
    void norm(const DeviceTensor& w, float* x, int n, int dim) {
        launch(dev_, "rms_norm", {unsigned(n)}, {256}, (const float*)x, w.data.get<const float>(), x, dim, dim, hp_.norm_eps);
    }
    void add(float* x, const float* y, long long n, long long period) {
        launch(dev_, "add", {unsigned(std::min<long long>(1024, (n + 255) / 256))}, {256}, x, y, n, period);
    }

    // The in-place Walsh-Hadamard rotation of `count` values in blocks of `block`.
    void hadamard(float* data, long long count, int block) {
        launch(dev_, "hadamard", {unsigned(count / block)}, {128}, data, block);
    }

    // RoPE of n_rot dims from `offset` of every head (head_stride values apart) of n tokens.
    void rope(float* data, int n, int n_heads, int head_stride, int offset, float base) {
        const RopeParams p{hp_.n_rot, base, hp_.rope_freq_scale, hp_.rope_attn_factor, hp_.yarn_ext_factor, hp_.yarn_beta_fast,
            hp_.yarn_beta_slow, hp_.n_ctx_orig, rope_freqs_ ? rope_freqs_.data.get<const float>() : nullptr};
        launch(dev_, "rope_cache", {unsigned((n + 63) / 64)}, {64}, pos_, rope_cs_.get<float>(), n, p);
        launch(dev_, "rope", {unsigned(n)}, {128}, data, rope_cs_.get<const float>(), n_heads, head_stride, offset, hp_.n_rot,
               int(hp_.rope_type == llm::RopeType::Neox));
    }

    void attention(DeviceLayer& L, int il, const llm::OffloadBatch& b, int n) {
        const int q_width = hp_.n_head * hp_.head_dim_k;
        matmul(L.wq, cur_.get<const float>(), n, q_.get<float>());
        matmul(L.wk, cur_.get<const float>(), n, k_.get<float>());
        matmul(L.wv, cur_.get<const float>(), n, v_.get<float>());
        if (L.bq) add(q_.get<float>(), L.bq.data.get<const float>(), (long long)n * q_width, q_width);
        if (L.bk) add(k_.get<float>(), L.bk.data.get<const float>(), (long long)n * kv_row(), kv_row());
        if (L.bv) add(v_.get<float>(), L.bv.data.get<const float>(), (long long)n * kv_row(), kv_row());
        if (L.q_norm) {
            norm(L.q_norm, q_.get<float>(), n * hp_.n_head, hp_.head_dim_k);
            norm(L.k_norm, k_.get<float>(), n * hp_.n_head_kv, hp_.head_dim_k);
        }
        const bool swa = hp_.swa_layer[il];
        rope(q_.get<float>(), n, hp_.n_head, hp_.head_dim_k, 0, swa ? hp_.rope_base_swa : hp_.rope_base);
        rope(k_.get<float>(), n, hp_.n_head_kv, hp_.head_dim_k, 0, swa ? hp_.rope_base_swa : hp_.rope_base);
        if (rot_k_) {
            hadamard(q_.get<float>(), (long long)n * q_width, rot_k_);
            hadamard(k_.get<float>(), (long long)n * kv_row(), rot_k_);
        }
        if (rot_v_) hadamard(v_.get<float>(), (long long)n * kv_row(), rot_v_);
        store_rows(type_k_, k_.get<const float>(), L.k_cache, n, k_row_bytes());
        store_rows(type_v_, v_.get<const float>(), L.v_cache, n, v_row_bytes());
        fused_attention(type_k_, type_v_, L.k_cache.get<const uint8_t>(), L.v_cache.get<const uint8_t>(), v_row_bytes(), b, n, swa ? hp_.n_swa : 0);
        if (rot_v_) hadamard(attn_.get<float>(), (long long)n * hp_.n_head * hp_.head_dim_v, rot_v_);
        matmul(L.wo, attn_.get<const float>(), n, tmp_.get<float>());
    }

    // gate = act(gate) * up over count values: GELU for gemma, SiLU else.
    void gated_activation(long long count) {
        const char* act = hp_.arch == llm::Arch::Gemma3 ? "gelu_mul" : "silu_mul";
        launch(dev_, act, {unsigned(std::min<long long>(1024, (count + 255) / 256))}, {256}, gate_.get<float>(), up_.get<const float>(), count);
    }

    // out = down(act(gate(x)) * up(x)) for the n rows of x.
    // n rows of kv_row() values into their cells of a cache of type t.
    void store_rows(llm::Type t, const float* rows, Buffer& cache, int n, size_t row_bytes) {
        launch(dev_, ("store_rows_" + std::string(kv_kernel_type_name(t))).c_str(), {unsigned(n)}, {128}, rows, cache.get<uint8_t>(), cells_,
               int(kv_row()), row_bytes);
    }

    // attn_ = softmax(q_ K^T * scale) V over the cache (flash_attn_K_V), V rows v_row bytes apart.
    void fused_attention(llm::Type tk, llm::Type tv, const uint8_t* k_cache, const uint8_t* v_cache, size_t v_row, const llm::OffloadBatch& b, int n, int n_swa) {
        const AttnParams p{n, hp_.n_head, hp_.n_head_kv, hp_.head_dim_k, hp_.head_dim_v, int(k_row_bytes()), int(v_row), hp_.attn_scale, n_swa, b.pages_per_seq,
            b.page_size, int(exact_softmax_)};
        const std::string kernel = std::string("flash_attn_") + kv_kernel_type_name(tk) + "_" + kv_kernel_type_name(tv);
        launch(dev_, kernel.c_str(), {unsigned((n * hp_.n_head + kAttnThreads / 32 - 1) / (kAttnThreads / 32))}, {unsigned(kAttnThreads)}, q_.get<const float>(),
               k_cache, v_cache, pos_, seq_, pages_, attn_.get<float>(), p);
    }

    // Row by row: width values from src_offset of src's rows to dst_offset of dst's.
    void copy_cols(const float* src, int src_stride, int src_offset, float* dst, int dst_stride, int dst_offset, int width, int rows) {
        launch(dev_, "copy_cols", {unsigned(rows)}, {128}, src, src_stride, src_offset, dst, dst_stride, dst_offset, width);
    }

    // Multi-head latent attention in absorbed form (deepseek2, cur_ -> tmp_), as the CPU's
    // attention_mla: the cache row of a token is its roped key part followed by its normalized latent;
    // each head's query is folded into latent space (q_nope k_b), attention runs there with the
    // latent as V, and v_b maps the result back.
    void attention_mla(DeviceLayer& L, const llm::OffloadBatch& b, int n) {
        const int n_head = hp_.n_head, rank = hp_.kv_lora_rank, nope = hp_.qk_nope, rot = hp_.n_rot, v_dim = hp_.v_head_dim;
        const int q_head = nope + rot, row = rank + rot;
        float* q_proj = mla_q_.get<float>();
        float* kv_a = mla_kv_a_.get<float>();
        if (L.wq_a) {
            matmul(L.wq_a, cur_.get<const float>(), n, mla_q_a_.get<float>());
            norm(L.q_a_norm, mla_q_a_.get<float>(), n, hp_.q_lora_rank);
            matmul(L.wq_b, mla_q_a_.get<const float>(), n, q_proj);
        } else {
            matmul(L.wq, cur_.get<const float>(), n, q_proj);
        }
        matmul(L.wkv_a, cur_.get<const float>(), n, kv_a);
        rope(q_proj, n, n_head, q_head, nope, hp_.rope_base);
        rope(kv_a, n, 1, row, rank, hp_.rope_base);
        launch(dev_, "rms_norm", {unsigned(n)}, {256}, (const float*)kv_a, L.kv_a_norm.data.get<const float>(), kv_a, rank, row, hp_.norm_eps);
        copy_cols(kv_a, row, rank, k_.get<float>(), row, 0, rot, n);  // cache row: [rope | latent]
        copy_cols(kv_a, row, 0, k_.get<float>(), row, rot, rank, n);
        store_rows(type_k_, k_.get<const float>(), L.k_cache, n, k_row_bytes());
        // q (n x n_head x row) = [q_rope, q_nope k_b_h] per head.
        copy_cols(q_proj, q_head, nope, q_.get<float>(), row, 0, rot, n * n_head);
        for (int h = 0; h < n_head; h++) {
            copy_cols(q_proj, n_head * q_head, h * q_head, mla_head_in_.get<float>(), nope, 0, nope, n);
            matmul(L.k_b[h], mla_head_in_.get<const float>(), n, mla_head_out_.get<float>());
            copy_cols(mla_head_out_.get<const float>(), rank, 0, q_.get<float>(), n_head * row, h * row + rot, rank, n);
        }
        // The latent part of the K rows serves as V.
        const uint8_t* k_cache = L.k_cache.get<const uint8_t>();
        fused_attention(type_k_, type_k_, k_cache, k_cache + llm::row_bytes(type_k_, rot), k_row_bytes(), b, n, 0);
        // attn (n x n_head x rank) -> per head v_b -> (n x n_head x v_dim) -> wo.
        for (int h = 0; h < n_head; h++) {
            copy_cols(attn_.get<const float>(), n_head * rank, h * rank, mla_head_in_.get<float>(), rank, 0, rank, n);
            matmul(L.v_b[h], mla_head_in_.get<const float>(), n, mla_head_out_.get<float>());
            copy_cols(mla_head_out_.get<const float>(), v_dim, 0, mla_v_.get<float>(), n_head * v_dim, h * v_dim, v_dim, n);
        }
        matmul(L.wo, mla_v_.get<const float>(), n, tmp_.get<float>());
    }

    void ffn_dense(const DeviceTensor& gate, const DeviceTensor& up, const DeviceTensor& down, const float* x, int n, float* out) {
        matmul(gate, x, n, gate_.get<float>());
        matmul(up, x, n, up_.get<float>());
        gated_activation((long long)n * gate.rows);
        matmul(down, gate_.get<const float>(), n, out);
    }

    // Mixture of experts (cur_ -> tmp_): route every token on the device, gather its rows by expert,
    // run each expert once over its rows, sum the weighted outputs back per token, add the shared experts.
    void ffn_moe(DeviceLayer& L, int n) {
        const int n_expert = hp_.n_expert, n_used = hp_.n_expert_used, embd = hp_.n_embd;
        matmul(L.gate_inp, cur_.get<const float>(), n, router_.get<float>());
        const MoeParams p{n_expert, n_used, hp_.n_expert_groups, hp_.n_group_used, int(hp_.expert_gating == llm::ExpertGating::Sigmoid), int(hp_.expert_weights_norm),
            hp_.expert_weights_scale};
        launch(dev_, "moe_route", {unsigned((n + 63) / 64)}, {64}, router_.get<const float>(), L.exp_probs_b.data.get<const float>(), experts_.get<int>(),
               expert_weights_.get<float>(), n, p);
        launch(dev_, "moe_group", {1}, {256}, experts_.get<const int>(), n, n_used, n_expert, expert_first_.get<int>(), row_token_.get<int>(), slot_.get<int>());
        launch(dev_, "gather_rows", {unsigned(n * n_used)}, {256}, cur_.get<const float>(), row_token_.get<const int>(), gathered_.get<float>(), embd);
        matmul_experts(L.gate_exps, gathered_.get<const float>(), n * n_used, n, gate_.get<float>());
        matmul_experts(L.up_exps, gathered_.get<const float>(), n * n_used, n, up_.get<float>());
        gated_activation((long long)n * n_used * L.gate_exps.rows);
        matmul_experts(L.down_exps, gate_.get<const float>(), n * n_used, n, expert_out_.get<float>());
        launch(dev_, "moe_combine", {unsigned(n)}, {256}, expert_out_.get<const float>(), slot_.get<const int>(), expert_weights_.get<const float>(),
               tmp_.get<float>(), embd, n_used);
        if (!L.gate_shexp) return;
        ffn_dense(L.gate_shexp, L.up_shexp, L.down_shexp, cur_.get<const float>(), n, shexp_out_.get<float>());
        add(tmp_.get<float>(), shexp_out_.get<const float>(), (long long)n * embd, (long long)n * embd);
    }

    // One block: x += attn(norm(x)) (post-normed for gemma), then x += ffn(norm(x)).
    void run_layer(DeviceLayer& L, int il, const llm::OffloadBatch& b, int n) {
        const int embd = hp_.n_embd;
        for (int half = 0; half < 2; half++) {
            const DeviceTensor& pre = half == 0 ? L.attn_norm : L.ffn_norm;
            const DeviceTensor& post = half == 0 ? L.post_attn_norm : L.post_ffn_norm;
            launch(dev_, "rms_norm", {unsigned(n)}, {256}, x_.get<const float>(), pre.data.get<const float>(), cur_.get<float>(), embd, embd, hp_.norm_eps);
            if (half == 0 && hp_.mla) attention_mla(L, b, n);
            else if (half == 0) attention(L, il, b, n);
            else if (L.gate_inp) ffn_moe(L, n);
            else ffn_dense(L.ffn_gate, L.ffn_up, L.ffn_down, cur_.get<const float>(), n, tmp_.get<float>());
            if (post) norm(post, tmp_.get<float>(), n, embd);
            add(x_.get<float>(), tmp_.get<const float>(), (long long)n * embd, (long long)n * embd);
        }
    }
};

// Several slices on their devices, one after the other: the activations go device to device through
// the host, once per boundary; the cache rows are each slice's, in layer order.
class SplitForward : public llm::OffloadBackend {
public:
    explicit SplitForward(std::vector<std::unique_ptr<Forward>> parts) : parts_(std::move(parts)) {}
    size_t bytes_per_cell() const override {
        size_t bytes = 0;
        for (const auto& p : parts_) bytes += p->bytes_per_cell();
        return bytes;
    }
    void forward(const llm::OffloadBatch& b, float* x, int n_logits, const int32_t* logit_rows, float* logits) override {
        for (size_t i = 0; i + 1 < parts_.size(); i++) parts_[i]->forward(b, x, 0, nullptr, nullptr);
        parts_.back()->forward(b, x, n_logits, logit_rows, logits);
    }
    std::vector<uint8_t> read_cells(const std::vector<int32_t>& cells) override {
        std::vector<uint8_t> out;
        for (const auto& p : parts_) {
            const std::vector<uint8_t> part = p->read_cells(cells);
            out.insert(out.end(), part.begin(), part.end());
        }
        return out;
    }
    void write_cells(const std::vector<int32_t>& cells, const uint8_t* bytes) override {
        for (const auto& p : parts_) {
            p->write_cells(cells, bytes);
            bytes += p->bytes_per_cell() * cells.size();
        }
    }

private:
    std::vector<std::unique_ptr<Forward>> parts_;
};

// The driver of a device family: `devices` (created on first use, after a successful probe) are the
// driver's list, in order; a context gets one Forward per slice of its model's placement.
inline llm::OffloadDriver make_driver(const std::string& name, std::function<bool(std::string&)> probe, std::function<std::vector<Device*>()> devices) {
    llm::OffloadDriver d;
    d.name = name;
    d.probe = std::move(probe);
    d.list = [devices] {
        std::vector<llm::OffloadDevice> out;
        for (Device* dev : devices()) out.push_back({dev->name(), dev->description(), dev->total_bytes(), dev->free_bytes()});
        return out;
    };
    d.compute_bytes = Forward::compute_bytes;
    d.create = [devices](const llm::Model& m, const llm::ContextParams& cp, int n_cells) -> std::unique_ptr<llm::OffloadBackend> {
        const std::vector<Device*> found = devices();
        std::vector<std::unique_ptr<Forward>> parts;
        for (const llm::Placement::Slice& s : m.placement.slices) parts.push_back(std::make_unique<Forward>(*found.at(s.device), m, cp, n_cells, s));
        if (parts.size() == 1) return std::move(parts[0]);
        return std::make_unique<SplitForward>(std::move(parts));
    };
    return d;
}

} // namespace llm_gpu
