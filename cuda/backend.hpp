// backend.hpp - the host side of the GPU backend: llm::OffloadBackend over a Device (CUDA's driver API,
// or the SIMT emulator in tests), running the device layers of a dense transformer (llama, qwen2, qwen3,
// gemma3) with the kernels of cuda/*.cuh, launched by name.
//
// Weights are uploaded from the file's layout at context creation; the KV cache (f16) holds one row per
// cell of the context's pool, so the CPU's page tables address it. A batch uploads the activations once,
// runs every device layer, and downloads either the activations or the logits once.
#pragma once
#include "../llm.hpp"
#include "params.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llm_gpu {

struct Grid {
    unsigned x = 1, y = 1, z = 1;
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
// Types multiplied by q8_1 activations through dp4a, as the CPU multiplies them by 8-bit activations.
inline bool has_dp4a(llm::Type t) {
    return t == llm::Type::Q4_0 || t == llm::Type::Q4_1 || t == llm::Type::Q5_0 || t == llm::Type::Q5_1 ||
           t == llm::Type::Q8_0 || t == llm::Type::IQ4_NL;
}

// A weight on the device, in the file's layout.
struct DeviceTensor {
    Buffer data;
    llm::Type type = llm::Type::F32;
    int64_t k = 0, rows = 0;  // ne[0], the rest
    size_t row_bytes = 0;
    explicit operator bool() const { return data.get() != nullptr; }
};

struct DeviceLayer {
    DeviceTensor attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, post_attn_norm;
    DeviceTensor ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffn_norm;
    Buffer k_cache, v_cache;  // n_cells x (n_head_kv * head_dim) f16
};

// One slice of the placement (a range of layers, and maybe the output) on one device.
class Forward : public llm::OffloadBackend {
public:
    Forward(Device& dev, const llm::Model& model, const llm::ContextParams& cp, int n_cells, const llm::Placement::Slice& slice)
        : dev_(dev), model_(model), hp_(model.hp), n_cells_(n_cells), first_layer_(slice.first_layer), has_output_(slice.output) {
        check_supported(cp);
        for (int il = slice.first_layer; il < slice.end_layer; il++) layers_.push_back(upload_layer(il));
        if (has_output_) {
            output_norm_ = upload(model.output_norm);
            output_ = upload(model.output);
        }
        if (model.rope_freqs) rope_freqs_ = upload(model.rope_freqs);
    }

    size_t bytes_per_cell() const override { return layers_.size() * 2 * kv_row() * sizeof(uint16_t); }

    void forward(const llm::OffloadBatch& b, float* x, int n_logits, const int32_t* logit_rows, float* logits) override {
        const int n = (int)b.batch->size();
        const int64_t E = hp_.n_embd;
        reserve(n, has_output_ ? std::max(1, n_logits) : 0, b);
        dev_.upload(x_.get(), x, sizeof(float) * n * E);
        dev_.upload(pos_.get(), b.batch->pos.data(), sizeof(int32_t) * n);
        dev_.upload(seq_.get(), b.batch->seq.data(), sizeof(int32_t) * n);
        dev_.upload(cells_.get(), b.cells, sizeof(int32_t) * n);
        dev_.upload(pages_.get(), b.page_cells, sizeof(int32_t) * page_table_ints(b));
        for (size_t i = 0; i < layers_.size(); i++) run_layer(layers_[i], first_layer_ + (int)i, b, n);
        if (!has_output_) {
            dev_.download(x, x_.get(), sizeof(float) * n * E);
            return;
        }
        if (n_logits == 0) return;
        dev_.upload(logit_rows_.get(), logit_rows, sizeof(int32_t) * n_logits);
        launch(dev_, "gather_rows", {unsigned(n_logits)}, {256}, x_.get<const float>(), logit_rows_.get<const int>(), cur_.get<float>(), int(E));
        norm(output_norm_, cur_.get<float>(), n_logits, int(E));
        matmul(output_, cur_.get<const float>(), n_logits, logits_.get<float>());
        dev_.download(logits, logits_.get(), sizeof(float) * n_logits * hp_.n_vocab);
    }

    std::vector<uint8_t> read_cells(const std::vector<int32_t>& cells) override {
        std::vector<uint8_t> out(cells.size() * bytes_per_cell());
        uint8_t* p = out.data();
        const size_t row = kv_row() * sizeof(uint16_t);
        for (DeviceLayer& L : layers_)
            for (Buffer* cache : {&L.k_cache, &L.v_cache})
                for (int32_t c : cells) dev_.download(p, cache->get<uint8_t>() + c * row, row), p += row;
        return out;
    }
    void write_cells(const std::vector<int32_t>& cells, const uint8_t* bytes) override {
        const size_t row = kv_row() * sizeof(uint16_t);
        for (DeviceLayer& L : layers_)
            for (Buffer* cache : {&L.k_cache, &L.v_cache})
                for (int32_t c : cells) dev_.upload(cache->get<uint8_t>() + c * row, bytes, row), bytes += row;
    }

private:
    Device& dev_;
    const llm::Model& model_;
    const llm::HParams& hp_;
    int n_cells_;
    int first_layer_;
    bool has_output_;
    std::vector<DeviceLayer> layers_;
    DeviceTensor output_norm_, output_, rope_freqs_;
    // Activations and per-batch tables, grown to the largest batch seen.
    int capacity_ = 0, logit_capacity_ = 0;
    size_t page_capacity_ = 0;
    Buffer x_, cur_, tmp_, q_, k_, v_, attn_, gate_, up_, act_q8_, rope_cs_, logits_;
    Buffer pos_, seq_, cells_, pages_, logit_rows_;

    int64_t kv_row() const { return int64_t(hp_.n_head_kv) * hp_.head_dim_k; }
    static size_t page_table_ints(const llm::OffloadBatch& b) { return size_t(b.pages_per_seq) * b.n_seq; }

    void check_supported(const llm::ContextParams& cp) const {
        using llm::Arch;
        if (hp_.arch != Arch::Llama && hp_.arch != Arch::Qwen2 && hp_.arch != Arch::Qwen3 && hp_.arch != Arch::Gemma3)
            throw llm::Error(std::string("GPU offload: ") + llm::arch_name(hp_.arch) + " is not supported yet (llama, qwen2, qwen3, gemma3)");
        if (cp.type_k != llm::Type::F16 || cp.type_v != llm::Type::F16)
            throw llm::Error("GPU offload: only an f16 KV cache is supported yet");
        if (hp_.head_dim_k != hp_.head_dim_v || hp_.head_dim_k > 256 || hp_.n_embd % 32)
            throw llm::Error("GPU offload: head sizes above 256 or unequal K/V heads are not supported yet");
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

    DeviceLayer upload_layer(int il) {
        const llm::LayerWeights& W = model_.layers[il];
        if (W.gate_inp || W.wq_a || W.wkv_a) throw llm::Error("GPU offload: MoE and MLA layers are not supported yet");
        DeviceLayer L;
        L.attn_norm = upload(W.attn_norm);
        L.wq = upload(W.wq), L.wk = upload(W.wk), L.wv = upload(W.wv), L.wo = upload(W.wo);
        L.bq = upload(W.bq), L.bk = upload(W.bk), L.bv = upload(W.bv);
        L.q_norm = upload(W.q_norm), L.k_norm = upload(W.k_norm), L.post_attn_norm = upload(W.post_attn_norm);
        L.ffn_norm = upload(W.ffn_norm), L.ffn_gate = upload(W.ffn_gate), L.ffn_up = upload(W.ffn_up), L.ffn_down = upload(W.ffn_down);
        L.post_ffn_norm = upload(W.post_ffn_norm);
        L.k_cache = Buffer(dev_, size_t(n_cells_) * kv_row() * sizeof(uint16_t));
        L.v_cache = Buffer(dev_, size_t(n_cells_) * kv_row() * sizeof(uint16_t));
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
        const size_t E = hp.n_embd, F = hp.n_ff, Q = size_t(hp.n_head) * hp.head_dim_k, KV = size_t(hp.n_head_kv) * hp.head_dim_k;
        const size_t widest = std::max({E, F, Q}), f = sizeof(float);
        visit(&Forward::x_, N * E * f), visit(&Forward::cur_, N * std::max(E, Q) * f), visit(&Forward::tmp_, N * E * f);
        visit(&Forward::q_, N * Q * f), visit(&Forward::k_, N * KV * f), visit(&Forward::v_, N * KV * f), visit(&Forward::attn_, N * Q * f);
        visit(&Forward::gate_, N * F * f), visit(&Forward::up_, N * F * f);
        visit(&Forward::act_q8_, N * (widest / 32) * 36);
        visit(&Forward::rope_cs_, N * hp.n_rot * f);
        visit(&Forward::logits_, n_logits * hp.n_vocab * f);
        visit(&Forward::pos_, N * 4), visit(&Forward::seq_, N * 4), visit(&Forward::cells_, N * 4);
        visit(&Forward::pages_, std::max<size_t>(1, pages) * 4);
        visit(&Forward::logit_rows_, n_logits * 4);
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
        activation_buffers(hp_, 0, 0, 0, [&](Buffer Forward::*buffer, size_t) { this->*buffer = Buffer(); });
        activation_buffers(hp_, tokens, logit_rows, page_ints, [&](Buffer Forward::*buffer, size_t bytes) { this->*buffer = Buffer(dev_, bytes); });
        capacity_ = tokens, logit_capacity_ = logit_rows, page_capacity_ = page_ints;
    }

    // y (n x rows) = x (n x k) W^T. Up to kMaxMatvecTokens tokens (decode, a few slots): dp4a products
    // against q8_1 activations for the 32-value integer types (the CPU's 8-bit rounding), else the
    // float matvec; larger batches: the 32 x 32 tiles.
    static constexpr int kMaxMatvecTokens = 8;
    void matmul(const DeviceTensor& w, const float* x, int n, float* y) {
        const std::string type = kernel_type_name(w.type);
        const int k = int(w.k), rows = int(w.rows);
        const Grid per_row{unsigned((rows + kMatvecRowsPerBlock - 1) / kMatvecRowsPerBlock), unsigned(n)};
        if (has_dp4a(w.type) && n <= kMaxMatvecTokens) {
            launch(dev_, "quantize_q8_1", {unsigned((size_t(n) * k / 32 + 7) / 8)}, {256}, x, act_q8_.get<void>(), n * k);
            launch(dev_, ("matvec_q8_1_" + type).c_str(), per_row, {unsigned(kMatvecThreads)}, w.data.get<const uint8_t>(), w.row_bytes,
                   act_q8_.get<const void>(), y, k, rows);
        } else if (n <= kMaxMatvecTokens) {
            launch(dev_, ("matvec_" + type).c_str(), per_row, {unsigned(kMatvecThreads)}, w.data.get<const uint8_t>(), w.row_bytes, x, y, k, rows);
        } else {
            launch(dev_, ("matmul_" + type).c_str(), {unsigned((rows + kTile - 1) / kTile), unsigned((n + kTile - 1) / kTile)}, {unsigned(kMatmulThreads)},
                   w.data.get<const uint8_t>(), w.row_bytes, x, y, k, rows, n);
        }
    }

    // RMSNorm of n rows of dim values in place.
    void norm(const DeviceTensor& w, float* x, int n, int dim) {
        launch(dev_, "rms_norm", {unsigned(n)}, {256}, (const float*)x, w.data.get<const float>(), x, dim, dim, hp_.norm_eps);
    }
    void add(float* x, const float* y, long long n, long long period) {
        launch(dev_, "add", {unsigned(std::min<long long>(1024, (n + 255) / 256))}, {256}, x, y, n, period);
    }

    void rope(float* data, int n, int n_heads, float base) {
        const RopeParams p{hp_.n_rot, base, hp_.rope_freq_scale, hp_.rope_attn_factor, hp_.yarn_ext_factor, hp_.yarn_beta_fast,
            hp_.yarn_beta_slow, hp_.n_ctx_orig, rope_freqs_ ? rope_freqs_.data.get<const float>() : nullptr};
        launch(dev_, "rope_cache", {unsigned((n + 63) / 64)}, {64}, pos_.get<const int>(), rope_cs_.get<float>(), n, p);
        launch(dev_, "rope", {unsigned(n)}, {128}, data, rope_cs_.get<const float>(), n_heads, hp_.head_dim_k, 0, hp_.n_rot,
               int(hp_.rope_type == llm::RopeType::Neox));
    }

    void attention(DeviceLayer& L, int il, const llm::OffloadBatch& b, int n) {
        const int Q = hp_.n_head * hp_.head_dim_k;
        matmul(L.wq, cur_.get<const float>(), n, q_.get<float>());
        matmul(L.wk, cur_.get<const float>(), n, k_.get<float>());
        matmul(L.wv, cur_.get<const float>(), n, v_.get<float>());
        if (L.bq) add(q_.get<float>(), L.bq.data.get<const float>(), (long long)n * Q, Q);
        if (L.bk) add(k_.get<float>(), L.bk.data.get<const float>(), (long long)n * kv_row(), kv_row());
        if (L.bv) add(v_.get<float>(), L.bv.data.get<const float>(), (long long)n * kv_row(), kv_row());
        if (L.q_norm) {
            norm(L.q_norm, q_.get<float>(), n * hp_.n_head, hp_.head_dim_k);
            norm(L.k_norm, k_.get<float>(), n * hp_.n_head_kv, hp_.head_dim_k);
        }
        const bool swa = hp_.swa_layer[il];
        rope(q_.get<float>(), n, hp_.n_head, swa ? hp_.rope_base_swa : hp_.rope_base);
        rope(k_.get<float>(), n, hp_.n_head_kv, swa ? hp_.rope_base_swa : hp_.rope_base);
        for (auto [rows, cache] : {std::make_pair(&k_, &L.k_cache), std::make_pair(&v_, &L.v_cache)})
            launch(dev_, "store_f16_rows", {unsigned(n)}, {128}, rows->get<const float>(), cache->get<uint16_t>(), cells_.get<const int>(), int(kv_row()));
        const AttnParams p{n, hp_.n_head, hp_.n_head_kv, hp_.head_dim_k, hp_.head_dim_v, int(kv_row()), int(kv_row()), hp_.attn_scale,
            swa ? hp_.n_swa : 0, b.pages_per_seq, b.page_size};
        launch(dev_, "flash_attn_f16", {unsigned((n * hp_.n_head + kAttnThreads / 32 - 1) / (kAttnThreads / 32))}, {unsigned(kAttnThreads)}, q_.get<const float>(), L.k_cache.get<const uint16_t>(),
               L.v_cache.get<const uint16_t>(), pos_.get<const int>(), seq_.get<const int>(), pages_.get<const int>(), attn_.get<float>(), p);
        matmul(L.wo, attn_.get<const float>(), n, tmp_.get<float>());
    }

    void ffn(DeviceLayer& L, int n) {
        const long long F = hp_.n_ff;
        matmul(L.ffn_gate, cur_.get<const float>(), n, gate_.get<float>());
        matmul(L.ffn_up, cur_.get<const float>(), n, up_.get<float>());
        const char* act = hp_.arch == llm::Arch::Gemma3 ? "gelu_mul" : "silu_mul";
        launch(dev_, act, {unsigned(std::min<long long>(1024, (n * F + 255) / 256))}, {256}, gate_.get<float>(), up_.get<const float>(), n * F);
        matmul(L.ffn_down, gate_.get<const float>(), n, tmp_.get<float>());
    }

    // One block: x += attn(norm(x)) (post-normed for gemma), then x += ffn(norm(x)).
    void run_layer(DeviceLayer& L, int il, const llm::OffloadBatch& b, int n) {
        const int E = hp_.n_embd;
        for (int half = 0; half < 2; half++) {
            const DeviceTensor& pre = half == 0 ? L.attn_norm : L.ffn_norm;
            const DeviceTensor& post = half == 0 ? L.post_attn_norm : L.post_ffn_norm;
            launch(dev_, "rms_norm", {unsigned(n)}, {256}, x_.get<const float>(), pre.data.get<const float>(), cur_.get<float>(), E, E, hp_.norm_eps);
            if (half == 0) attention(L, il, b, n);
            else ffn(L, n);
            if (post) norm(post, tmp_.get<float>(), n, E);
            add(x_.get<float>(), tmp_.get<const float>(), (long long)n * E, (long long)n * E);
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
