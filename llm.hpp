// llm.hpp - a single-header inference engine for GGUF language models.
//
// Use: in exactly one translation unit
//     #define LLM_IMPLEMENTATION
//     #include "llm.hpp"
// and include it plainly everywhere else. Depends on the C++17 standard library only.
//
// Table of contents
//   1. Public API            errors, tensor types, GGUF reader, vocabulary, model, context, sampler
//   -- implementation (LLM_IMPLEMENTATION) --
//   2. Utilities             half/bfloat conversions, checked arithmetic, timing
//   3. GGUF                  mmap reader with bounds checks, split files, metadata
//   4. Types and quants      block layouts, dequantization, activation/KV quantization, scalar dot products
//   5. CPU features and SIMD run-time dispatch (XCR0-checked), AVX2 / AVX-512 dot products
//   6. Thread pool           persistent workers, parallel-for over rows
//   7. Tokenizer             unicode tables, SentencePiece, byte-level BPE with pre-tokenizers, specials
//   8. Model                 hyperparameters from metadata, tensor binding per architecture
//   9. KV cache              per-sequence cells in f32/f16/q8_0/q4_0/iq4_nl
//  10. Forward pass          llama, qwen2, qwen3, gemma3 (one code path for prefill and decode)
//  11. Sampling              penalties, top-k, top-p, min-p, temperature, seeded RNG
#ifndef LLM_HPP
#define LLM_HPP

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace llm {

// ============================================================================================
// 1. Public API
// ============================================================================================

// Every failure the caller can cause (bad file, bad argument, context full) is an llm::Error with a
// one-line message. The engine never aborts the process for bad input.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Tensor element types, numbered as in GGUF (ggml_type).
enum class Type : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ4_NL = 20, BF16 = 30,
};
constexpr int kTypeCount = 40;  // upper bound of the numeric values above, for tables

struct TypeInfo {
    const char* name;   // "q4_K", as ggml spells it
    int block_size;     // elements per block (1 for float types)
    size_t block_bytes; // bytes per block
    bool supported;     // false for ids that GGUF defines but we do not implement
};
const TypeInfo& type_info(Type t);               // throws Error for an unknown id
bool type_known(uint32_t id);
Type type_from_name(const std::string& name);    // case-insensitive; throws Error
size_t row_bytes(Type t, int64_t n);             // bytes of a row of n elements (n % block_size == 0)

// ---- GGUF ----------------------------------------------------------------------------------
enum class GGUFValueType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

// A metadata value. Scalars are widened to the fields below; arrays hold their elements
// (arrays of arrays are allowed by the format and kept as such).
struct GGUFValue {
    GGUFValueType type = GGUFValueType::UINT8;
    GGUFValueType elem_type = GGUFValueType::UINT8;  // for ARRAY
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    std::string str;
    std::vector<GGUFValue> arr;
    // Fast paths for the big tokenizer arrays: strings, float32 scores and int32 types are also
    // stored flat so a 150k-entry vocabulary does not cost 150k GGUFValue objects.
    std::vector<std::string> arr_str;
    std::vector<double> arr_num;

    bool is_array() const { return type == GGUFValueType::ARRAY; }
    size_t size() const;  // element count of an array
};

struct TensorInfo {
    std::string name;
    Type type = Type::F32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
    uint64_t offset = 0;           // relative to its file's data section
    int file_index = 0;            // which split part holds it
    const uint8_t* data = nullptr; // mapped bytes
    size_t nbytes = 0;
    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

class MappedFile;  // implementation detail

// A GGUF file (or a split set opened by its first part), memory-mapped. Tensor data pointers stay
// valid for the lifetime of this object.
class GGUF {
public:
    static std::unique_ptr<GGUF> open(const std::string& path, bool use_mmap = true);
    ~GGUF();
    uint32_t version = 0;
    uint64_t alignment = 32;
    std::vector<std::pair<std::string, GGUFValue>> kv;   // in file order
    std::vector<TensorInfo> tensors;                     // in file order, all parts
    size_t total_file_bytes = 0;

    const GGUFValue* find(const std::string& key) const;
    const TensorInfo* tensor(const std::string& name) const;
    std::string get_str(const std::string& key, const std::string& def = "") const;
    int64_t get_int(const std::string& key, int64_t def) const;
    double get_float(const std::string& key, double def) const;
    bool get_bool(const std::string& key, bool def) const;
    bool has(const std::string& key) const { return find(key) != nullptr; }

private:
    std::vector<std::unique_ptr<MappedFile>> files_;
    std::map<std::string, size_t> kv_index_, tensor_index_;
    friend struct GGUFParser;
    friend std::unique_ptr<GGUF> gguf_parse_memory(const uint8_t*, size_t);
};

// Parse a GGUF image held in memory (no mmap, no split). Used by the fuzzer and tests; throws Error.
std::unique_ptr<GGUF> gguf_parse_memory(const uint8_t* data, size_t size);

#include "wip/quants_api.inc"
#include "wip/quantize_api.inc"

// ---- Tokenizer -----------------------------------------------------------------------------
#include "wip/tokenizer_api.inc"

// ---- Chat templates ------------------------------------------------------------------------
#include "wip/chat_api.inc"

// ---- Model ---------------------------------------------------------------------------------
enum class Arch { Llama, Qwen2, Qwen3, Gemma3, Qwen3Moe, Deepseek2 };
const char* arch_name(Arch a);

// Rotary embedding flavours: NORM rotates adjacent pairs (x0,x1), NEOX rotates halves (x_i, x_i+d/2).
enum class RopeType { Norm, Neox };

enum class ExpertGating { Softmax = 1, Sigmoid = 2 };

// Hyperparameters, all read from GGUF metadata (ARCH.* keys).
struct HParams {
    Arch arch = Arch::Llama;
    int n_vocab = 0, n_ctx_train = 0, n_embd = 0, n_layer = 0, n_ff = 0;
    int n_head = 0, n_head_kv = 0, head_dim_k = 0, head_dim_v = 0;  // as attention runs (MLA: latent sizes)
    float norm_eps = 1e-5f;
    RopeType rope_type = RopeType::Norm;
    int n_rot = 0;                       // rotated dimensions per head
    float rope_base = 10000.f, rope_base_swa = 10000.f, rope_freq_scale = 1.f;
    // YaRN (rope.scaling.type = yarn): extrapolation mix, original context, attention temperature.
    float yarn_ext_factor = 0.f, yarn_beta_fast = 32.f, yarn_beta_slow = 1.f, yarn_log_mul = 0.f;
    float rope_attn_factor = 1.f;        // multiplies cos/sin
    int n_ctx_orig = 0;
    int n_swa = 0;                       // sliding window (tokens), 0 = none
    std::vector<uint8_t> swa_layer;      // per layer: 1 = sliding-window layer
    float attn_scale = 0;                // multiplies q.k
    float embd_scale = 1.f;              // multiplies the token embeddings (gemma: sqrt(n_embd))
    // Mixture of experts.
    int n_expert = 0, n_expert_used = 0, n_expert_shared = 0, n_ff_exp = 0, n_layer_dense_lead = 0;
    int n_expert_groups = 0, n_group_used = 0;
    ExpertGating expert_gating = ExpertGating::Softmax;
    bool expert_weights_norm = false;
    float expert_weights_scale = 1.f;
    // Multi-head latent attention (deepseek2): the cache holds kv_lora_rank latent values and n_rot
    // rope values per token; heads see qk_nope + n_rot query/key dims and v_head_dim value dims.
    bool mla = false;
    int q_lora_rank = 0, kv_lora_rank = 0, qk_nope = 0, v_head_dim = 0;
    int n_embd_k_gqa() const { return n_head_kv * head_dim_k; }
    int n_embd_v_gqa() const { return n_head_kv * head_dim_v; }
};

// Weights of one block; nullptr where the architecture has no such tensor.
struct LayerWeights {
    const TensorInfo *attn_norm = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    const TensorInfo *bq = nullptr, *bk = nullptr, *bv = nullptr;
    const TensorInfo *q_norm = nullptr, *k_norm = nullptr, *post_attn_norm = nullptr;
    const TensorInfo *ffn_norm = nullptr, *ffn_gate = nullptr, *ffn_up = nullptr, *ffn_down = nullptr;
    const TensorInfo *post_ffn_norm = nullptr;
    // MLA: optional low-rank query, the joint latent/rope projection and its norm, and per-head
    // views of the absorbed matrices (k_b: kv_lora_rank rows of qk_nope; v_b: v_head_dim rows of kv_lora_rank).
    const TensorInfo *wq_a = nullptr, *q_a_norm = nullptr, *wq_b = nullptr, *wkv_a = nullptr, *kv_a_norm = nullptr;
    std::vector<TensorInfo> k_b, v_b;
    // MoE: router, selection bias, per-expert views of the stacked expert tensors, shared expert.
    const TensorInfo *gate_inp = nullptr, *exp_probs_b = nullptr;
    std::vector<TensorInfo> gate_exp, up_exp, down_exp;
    const TensorInfo *gate_shexp = nullptr, *up_shexp = nullptr, *down_shexp = nullptr;
};

struct ModelOptions {
    bool use_mmap = true;
    bool mlock = false;
    bool vocab_only = false;     // tokenizer only: no architecture or tensors required
    bool metadata_only = false;  // tokenizer and hyperparameters, no tensors bound (for --plan)
};

class Model {
public:
    static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& opt = {});
    std::unique_ptr<GGUF> gguf;
    std::string arch_str;        // general.architecture as written
    HParams hp;
    Vocab vocab;
    const TensorInfo *tok_embd = nullptr, *output_norm = nullptr, *output = nullptr, *rope_freqs = nullptr;
    std::vector<LayerWeights> layers;
    std::vector<std::vector<uint8_t>> derived;  // tensors made at load (legacy MLA k_b, transposed)
    size_t weight_bytes() const;  // bytes of all tensors
    size_t n_params() const;
};

// ---- Context: KV cache and evaluation -------------------------------------------------------
struct ContextParams {
    int n_ctx = 0;           // total cells; 0 = the model's training context capped at 4096
    int n_seq = 1;           // independent sequences (server slots); each gets n_ctx / n_seq cells
    int n_threads = 0;       // 0 = physical cores
    Type type_k = Type::F16, type_v = Type::F16;
    bool kv_unified = false;  // one pool for all sequences instead of n_ctx / n_seq each
    bool moe_grouped = true;  // MoE prefill runs each expert once over all its tokens (false: token by token)
};

// A batch of tokens to evaluate. Tokens of one sequence must come in increasing positions, and a
// sequence's first position in a batch must continue it (no gaps), so prefill and decode are the
// same call.
struct Batch {
    std::vector<int32_t> token, pos, seq;
    std::vector<uint8_t> want_logits;
    void add(int32_t tok, int32_t p, int32_t s, bool logits) {
        token.push_back(tok); pos.push_back(p); seq.push_back(s); want_logits.push_back(logits);
    }
    void clear() { token.clear(); pos.clear(); seq.clear(); want_logits.clear(); }
    size_t size() const { return token.size(); }
};

class Context {
public:
    Context(const Model& model, const ContextParams& params);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    // Evaluates the batch and stores the logits of the entries that asked for them.
    void decode(const Batch& batch);
    // Logits of the i-th entry that asked for them in the last decode (n_vocab floats).
    const float* logits(int i) const;
    int n_logits() const;

    int n_ctx() const;                    // total cells
    int n_ctx_seq() const;                // most positions one sequence may hold
    int n_cells_used() const;             // cells holding tokens, all sequences
    int n_cells_free() const;             // cells in pages no sequence holds
    int kv_page_size() const;             // cells per page: sequences hold whole pages
    int n_seq() const;
    int seq_len(int seq) const;           // tokens cached for seq
    void seq_truncate(int seq, int n);    // keep the first n positions of seq
    // The cached K/V rows of positions [0, n) of seq as one blob (for a host-RAM prompt cache), and
    // back: restore replaces seq's cache with the blob's n positions. Blobs fit only contexts of the
    // same model and cache types.
    std::vector<uint8_t> seq_save(int seq, int n) const;
    void seq_restore(int seq, const std::vector<uint8_t>& blob);
    // Copies the first n positions of src into dst (dst's cache is replaced).
    void seq_copy(int src, int dst, int n);
    size_t kv_bytes() const;              // whole cache
    size_t kv_bytes_per_token() const;    // all layers, K and V
    int n_threads() const;
    const Model& model() const;

    struct Impl;
private:
    std::unique_ptr<Impl> impl_;
};

// ---- Sampling ------------------------------------------------------------------------------
struct SamplerParams {
    float temperature = 0.8f;  // <= 0: greedy
    int top_k = 40;            // <= 0: off
    float top_p = 0.95f;       // >= 1: off
    float min_p = 0.05f;       // <= 0: off
    int penalty_last_n = 64;   // window of previous tokens the penalties look at (0 = off, -1 = context)
    float repeat_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
    uint64_t seed = 0xFFFFFFFF;  // 0xFFFFFFFF = random
};

class Sampler {
public:
    explicit Sampler(const SamplerParams& p = {});
    int32_t sample(const float* logits, int n_vocab);
    void accept(int32_t token);  // record a token (prompt or generated) for the penalties
    void reset();
    const SamplerParams& params() const { return p_; }
    // Probabilities of the most likely candidates after the last sample (for n_probs).
    std::vector<std::pair<int32_t, float>> top_probs(const float* logits, int n_vocab, int n) const;

private:
    SamplerParams p_;
    std::mt19937_64 rng_;
    std::vector<int32_t> history_;
};

int physical_core_count();

// ---- Evaluation: perplexity and KL divergence ----------------------------------------------
#include "wip/eval_api.inc"

// ---- Memory planning -----------------------------------------------------------------------
// What a deployment needs, computed from metadata alone (nothing is allocated): the calculator our
// users otherwise keep in a spreadsheet.
struct MemoryPlan {
    size_t weight_bytes = 0;        // tensor data in the file(s)
    size_t kv_bytes_per_token = 0;  // all layers, K and V (MLA: the latent row once)
    size_t kv_bytes_per_slot = 0;   // for n_ctx_slot tokens
    size_t kv_bytes_total = 0;      // for all slots
    size_t compute_bytes = 0;       // activations and scratch for one batch (estimate)
    size_t total_bytes = 0;
    size_t mem_available = 0;       // MemAvailable, capped by a cgroup memory limit; 0 if unknown
    bool fits = false;
};
size_t kv_bytes_per_token(const HParams& hp, Type type_k, Type type_v);
MemoryPlan plan_memory(const Model& model, int n_ctx_slot, int n_slots, Type type_k, Type type_v, int n_batch = 512);
size_t memory_available();

// Expert routing of one token (exposed for tests): writes hp.n_expert_used expert ids and weights.
void moe_route(const HParams& hp, const float* router_logits, const float* selection_bias, int32_t* experts, float* weights);

} // namespace llm


#endif // LLM_HPP

// ============================================================================================
// Implementation
// ============================================================================================
#if defined(LLM_IMPLEMENTATION) && !defined(LLM_IMPLEMENTATION_DONE)
#define LLM_IMPLEMENTATION_DONE

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <type_traits>
#include <unordered_map>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace llm {

// ============================================================================================
// 2. Utilities
// ============================================================================================

[[noreturn]] inline void fail(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw Error(buf);
}

// IEEE half <-> float, bit-exact with the F16C instructions (round to nearest even), so scalar and
// SIMD paths agree.
inline float fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalize
            int e = -1;
            do { mant <<= 1; e++; } while (!(mant & 0x400));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | mant << 13;
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to infinity
    if (absx < 0x38800000u) {  // result is subnormal or zero
        if (absx < 0x33000000u) return (uint16_t)sign;
        uint32_t e = absx >> 23, m = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e;  // 14 + (113 - e)
        uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

inline float bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t fp32_to_bf16(float f) {  // round to nearest even, quiet NaNs, as ggml does
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000u) return (uint16_t)((x >> 16) | 64);
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

inline double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ============================================================================================
// 4a. Block layouts (ggml's, byte for byte). QK_K-blocks are 256 values, the rest 32.
// ============================================================================================
constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32, QK4_NL = 32;
constexpr int QK_K = 256, K_SCALE_SIZE = 12;

struct block_q4_0 { uint16_t d; uint8_t qs[QK4_0 / 2]; };
struct block_q4_1 { uint16_t d, m; uint8_t qs[QK4_1 / 2]; };
struct block_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; };
struct block_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; };
struct block_q8_0 { uint16_t d; int8_t qs[QK8_0]; };
struct block_q8_1 { uint16_t d, s; int8_t qs[QK8_1]; };  // s = d * sum(qs)
struct block_q2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
struct block_q3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
struct block_q4_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; };
struct block_q5_K { uint16_t d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
struct block_iq4_nl { uint16_t d; uint8_t qs[QK4_NL / 2]; };

static_assert(sizeof(block_q4_0) == 18 && sizeof(block_q4_1) == 20 && sizeof(block_q5_0) == 22 &&
              sizeof(block_q5_1) == 24 && sizeof(block_q8_0) == 34 && sizeof(block_q8_1) == 36 &&
              sizeof(block_q2_K) == 84 && sizeof(block_q3_K) == 110 && sizeof(block_q4_K) == 144 &&
              sizeof(block_q5_K) == 176 && sizeof(block_q6_K) == 210 && sizeof(block_q8_K) == 292 &&
              sizeof(block_iq4_nl) == 18, "block layouts must match ggml");

constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

inline const TypeInfo* type_table() {
    static TypeInfo table[kTypeCount] = {};
    static bool init = [] {
        auto set = [](Type t, const char* n, int bs, size_t bb) { table[(int)t] = {n, bs, bb, true}; };
        set(Type::F32, "f32", 1, 4);
        set(Type::F16, "f16", 1, 2);
        set(Type::BF16, "bf16", 1, 2);
        set(Type::Q4_0, "q4_0", QK4_0, sizeof(block_q4_0));
        set(Type::Q4_1, "q4_1", QK4_1, sizeof(block_q4_1));
        set(Type::Q5_0, "q5_0", QK5_0, sizeof(block_q5_0));
        set(Type::Q5_1, "q5_1", QK5_1, sizeof(block_q5_1));
        set(Type::Q8_0, "q8_0", QK8_0, sizeof(block_q8_0));
        set(Type::Q8_1, "q8_1", QK8_1, sizeof(block_q8_1));
        set(Type::Q2_K, "q2_K", QK_K, sizeof(block_q2_K));
        set(Type::Q3_K, "q3_K", QK_K, sizeof(block_q3_K));
        set(Type::Q4_K, "q4_K", QK_K, sizeof(block_q4_K));
        set(Type::Q5_K, "q5_K", QK_K, sizeof(block_q5_K));
        set(Type::Q6_K, "q6_K", QK_K, sizeof(block_q6_K));
        set(Type::Q8_K, "q8_K", QK_K, sizeof(block_q8_K));
        set(Type::IQ4_NL, "iq4_nl", QK4_NL, sizeof(block_iq4_nl));
        return true;
    }();
    (void)init;
    return table;
}

bool type_known(uint32_t id) { return id < (uint32_t)kTypeCount && type_table()[id].supported; }

const TypeInfo& type_info(Type t) {
    if (!type_known((uint32_t)t)) fail("unsupported tensor type id %u", (unsigned)t);
    return type_table()[(int)t];
}

Type type_from_name(const std::string& name) {
    std::string lower;
    for (char c : name) lower += (char)tolower((unsigned char)c);
    for (int i = 0; i < kTypeCount; i++) {
        if (!type_table()[i].supported) continue;
        std::string n = type_table()[i].name;
        for (char& c : n) c = (char)tolower((unsigned char)c);
        if (n == lower) return (Type)i;
    }
    fail("unknown type name '%s'", name.c_str());
}

size_t row_bytes(Type t, int64_t n) {
    const TypeInfo& ti = type_info(t);
    return (size_t)(n / ti.block_size) * ti.block_bytes;
}

// ============================================================================================
// 3. GGUF
// ============================================================================================
// The file is: magic "GGUF", version, tensor count, kv count, kv pairs, tensor infos, padding to
// general.alignment, tensor data. Every read goes through Cursor, which checks the bytes exist; every
// count is checked against the bytes that remain before anything is allocated for it, so a hostile
// header cannot make us allocate more than the file's own size.

class MappedFile {
public:
    // mmap the file (or read it into memory when use_mmap is false, for --no-mmap).
    MappedFile(const std::string& path, bool use_mmap) : path_(path) {
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) fail("%s: cannot open: %s", path.c_str(), strerror(errno));
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            ::close(fd);
            fail("%s: not a regular file", path.c_str());
        }
        size_ = (size_t)st.st_size;
        if (size_ == 0) {
            ::close(fd);
            fail("%s: file is empty", path.c_str());
        }
        if (use_mmap) {
            void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) {
                ::close(fd);
                fail("%s: mmap failed: %s", path.c_str(), strerror(errno));
            }
            data_ = (const uint8_t*)p;
            mapped_ = true;
        } else {
            owned_.resize(size_);
            size_t got = 0;
            while (got < size_) {
                ssize_t r = ::read(fd, owned_.data() + got, size_ - got);
                if (r <= 0) {
                    ::close(fd);
                    fail("%s: read failed", path.c_str());
                }
                got += (size_t)r;
            }
            data_ = owned_.data();
        }
        ::close(fd);
    }
    MappedFile(const uint8_t* data, size_t size) : path_("<memory>"), data_(data), size_(size) {}
    ~MappedFile() {
        if (mapped_) munmap((void*)data_, size_);
    }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }
    // Lock pages in RAM (--mlock); returns false when the OS refuses (e.g. RLIMIT_MEMLOCK).
    bool lock() const { return mlock(data_, size_) == 0; }

private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    bool mapped_ = false;
    std::vector<uint8_t> owned_;
};

size_t GGUFValue::size() const { return arr_str.size() + arr_num.size() + arr.size(); }

struct GGUFParser {
    const uint8_t* p;
    size_t size, pos = 0;
    const std::string& path;

    [[noreturn]] void bad(const char* what) const {
        fail("%s: invalid GGUF: %s (at byte %zu of %zu)", path.c_str(), what, pos, size);
    }
    size_t remaining() const { return size - pos; }
    void need(size_t n, const char* what) const {
        if (n > remaining()) bad(what);
    }
    template <class T> T read(const char* what) {
        need(sizeof(T), what);
        T v;
        memcpy(&v, p + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
    std::string read_string(const char* what) {
        uint64_t n = read<uint64_t>(what);
        need(n, what);
        std::string s((const char*)p + pos, (size_t)n);
        pos += (size_t)n;
        return s;
    }
    static size_t min_bytes(GGUFValueType t) {  // smallest encoding of one value of type t
        switch (t) {
            case GGUFValueType::UINT8: case GGUFValueType::INT8: case GGUFValueType::BOOL: return 1;
            case GGUFValueType::UINT16: case GGUFValueType::INT16: return 2;
            case GGUFValueType::UINT32: case GGUFValueType::INT32: case GGUFValueType::FLOAT32: return 4;
            case GGUFValueType::UINT64: case GGUFValueType::INT64: case GGUFValueType::FLOAT64: return 8;
            case GGUFValueType::STRING: return 8;
            case GGUFValueType::ARRAY: return 12;
        }
        return 1;
    }
    GGUFValueType read_type(const char* what) {
        uint32_t t = read<uint32_t>(what);
        if (t > (uint32_t)GGUFValueType::FLOAT64) bad("unknown metadata value type");
        return (GGUFValueType)t;
    }
    // Reads a scalar into v (numbers widened to u/i/f).
    void read_scalar(GGUFValueType t, GGUFValue& v) {
        v.type = t;
        switch (t) {
            case GGUFValueType::UINT8: v.u = read<uint8_t>("u8"); break;
            case GGUFValueType::INT8: v.u = (uint64_t)(v.i = read<int8_t>("i8")); break;
            case GGUFValueType::UINT16: v.u = read<uint16_t>("u16"); break;
            case GGUFValueType::INT16: v.u = (uint64_t)(v.i = read<int16_t>("i16")); break;
            case GGUFValueType::UINT32: v.u = read<uint32_t>("u32"); break;
            case GGUFValueType::INT32: v.u = (uint64_t)(v.i = read<int32_t>("i32")); break;
            case GGUFValueType::UINT64: v.u = read<uint64_t>("u64"); break;
            case GGUFValueType::INT64: v.u = (uint64_t)(v.i = read<int64_t>("i64")); break;
            case GGUFValueType::FLOAT32: v.f = read<float>("f32"); break;
            case GGUFValueType::FLOAT64: v.f = read<double>("f64"); break;
            case GGUFValueType::BOOL: {
                uint8_t b = read<uint8_t>("bool");
                if (b > 1) bad("bool value is neither 0 nor 1");
                v.u = b;
                break;
            }
            case GGUFValueType::STRING: v.str = read_string("string"); return;
            case GGUFValueType::ARRAY: bad("internal: array read as scalar");
        }
        bool is_signed = t == GGUFValueType::INT8 || t == GGUFValueType::INT16 || t == GGUFValueType::INT32 ||
                         t == GGUFValueType::INT64;
        bool is_float = t == GGUFValueType::FLOAT32 || t == GGUFValueType::FLOAT64;
        if (is_float) {
            v.i = std::isfinite(v.f) && std::fabs(v.f) < 9e18 ? (int64_t)v.f : 0;
            v.u = (uint64_t)v.i;
        } else if (is_signed) {
            v.f = (double)v.i;
        } else {
            v.i = (int64_t)v.u;
            v.f = (double)v.u;
        }
    }
    void read_value(GGUFValueType t, GGUFValue& v, int depth) {
        if (t != GGUFValueType::ARRAY) return read_scalar(t, v);
        if (depth > 8) bad("arrays nested too deeply");
        v.type = t;
        v.elem_type = read_type("array element type");
        uint64_t n = read<uint64_t>("array length");
        if (n > remaining() / min_bytes(v.elem_type)) bad("array length exceeds file size");
        if (v.elem_type == GGUFValueType::STRING) {
            v.arr_str.reserve((size_t)n);
            for (uint64_t k = 0; k < n; k++) v.arr_str.push_back(read_string("array string"));
        } else if (v.elem_type == GGUFValueType::ARRAY) {
            v.arr.resize((size_t)n);
            for (auto& e : v.arr) read_value(GGUFValueType::ARRAY, e, depth + 1);
        } else {
            v.arr_num.resize((size_t)n);
            GGUFValue e;
            for (auto& x : v.arr_num) {
                read_scalar(v.elem_type, e);
                x = e.f;
            }
        }
    }

    void parse(GGUF& g, int file_index) {
        need(4, "file too short for the magic");
        if (memcmp(p, "GGUF", 4) != 0) bad("wrong magic (not a GGUF file)");
        pos = 4;
        g.version = read<uint32_t>("version");
        if (g.version < 2 || g.version > 3) {
            fail("%s: unsupported GGUF version %u (2 and 3 are supported)", path.c_str(), g.version);
        }
        uint64_t n_tensors = read<uint64_t>("tensor count");
        uint64_t n_kv = read<uint64_t>("metadata count");
        if (n_kv > remaining() / 12) bad("metadata count exceeds file size");
        if (n_tensors > remaining() / 24) bad("tensor count exceeds file size");
        for (uint64_t k = 0; k < n_kv; k++) {
            std::string key = read_string("metadata key");
            GGUFValue v;
            read_value(read_type("metadata type"), v, 0);
            if (file_index == 0) {
                if (g.kv_index_.count(key)) bad(("duplicate metadata key " + key).c_str());
                g.kv_index_[key] = g.kv.size();
                g.kv.emplace_back(std::move(key), std::move(v));
            }
        }
        if (const GGUFValue* a = g.find("general.alignment")) {
            if (a->type != GGUFValueType::UINT32 && a->type != GGUFValueType::UINT64) bad("general.alignment is not an integer");
            if (a->u == 0 || (a->u & (a->u - 1)) || a->u > (1u << 20)) bad("general.alignment is not a power of two");
            g.alignment = a->u;
        }
        size_t first = g.tensors.size();
        for (uint64_t k = 0; k < n_tensors; k++) {
            TensorInfo t;
            t.name = read_string("tensor name");
            if (t.name.size() >= 64) bad("tensor name longer than 63 bytes");
            uint32_t n_dims = read<uint32_t>("tensor dimension count");
            if (n_dims < 1 || n_dims > 4) bad("tensor dimension count not in 1..4");
            t.n_dims = (int)n_dims;
            int64_t total = 1;
            for (uint32_t d = 0; d < n_dims; d++) {
                uint64_t ne = read<uint64_t>("tensor dimension");
                if (ne > (uint64_t)INT64_MAX / 2) bad("tensor dimension too large");
                t.ne[d] = (int64_t)ne;
                if (t.ne[d] != 0 && total > INT64_MAX / 2 / t.ne[d]) bad("tensor element count overflows");
                total *= t.ne[d];
            }
            uint32_t type = read<uint32_t>("tensor type");
            if (!type_known(type)) {
                fail("%s: tensor '%s' has unsupported type id %u", path.c_str(), t.name.c_str(), type);
            }
            t.type = (Type)type;
            const TypeInfo& ti = type_info(t.type);
            if (t.ne[0] % ti.block_size != 0) bad(("row length of tensor " + t.name + " is not a multiple of its block size").c_str());
            t.nbytes = row_bytes(t.type, t.ne[0]) * (size_t)(t.ne[1] * t.ne[2] * t.ne[3]);
            t.offset = read<uint64_t>("tensor offset");
            if (t.offset % g.alignment) bad(("tensor " + t.name + " offset is not aligned").c_str());
            t.file_index = file_index;
            if (g.tensor_index_.count(t.name)) bad(("duplicate tensor name " + t.name).c_str());
            g.tensor_index_[t.name] = g.tensors.size();
            g.tensors.push_back(std::move(t));
        }
        size_t data_start = (pos + g.alignment - 1) / g.alignment * g.alignment;
        if (n_tensors > 0 && data_start > size) bad("tensor data section is missing");
        for (size_t k = first; k < g.tensors.size(); k++) {
            TensorInfo& t = g.tensors[k];
            size_t avail = size - std::min(size, data_start);
            if (t.offset > avail || t.nbytes > avail - t.offset) {
                fail("%s: tensor '%s' data (offset %llu, %zu bytes) lies beyond the end of the file (truncated?)",
                     path.c_str(), t.name.c_str(), (unsigned long long)t.offset, t.nbytes);
            }
            t.data = p + data_start + t.offset;
        }
    }
};

GGUF::~GGUF() = default;

const GGUFValue* GGUF::find(const std::string& key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv[it->second].second;
}
const TensorInfo* GGUF::tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors[it->second];
}
std::string GGUF::get_str(const std::string& key, const std::string& def) const {
    const GGUFValue* v = find(key);
    if (!v) return def;
    if (v->type != GGUFValueType::STRING) fail("metadata %s is not a string", key.c_str());
    return v->str;
}
static const GGUFValue* find_scalar(const GGUF& g, const std::string& key) {
    const GGUFValue* v = g.find(key);
    if (v && (v->type == GGUFValueType::STRING || v->type == GGUFValueType::ARRAY)) {
        fail("metadata %s is not a number", key.c_str());
    }
    return v;
}
int64_t GGUF::get_int(const std::string& key, int64_t def) const {
    const GGUFValue* v = find_scalar(*this, key);
    return v ? v->i : def;
}
double GGUF::get_float(const std::string& key, double def) const {
    const GGUFValue* v = find_scalar(*this, key);
    return v ? v->f : def;
}
bool GGUF::get_bool(const std::string& key, bool def) const {
    const GGUFValue* v = find_scalar(*this, key);
    return v ? v->u != 0 : def;
}

// Split models are written as PREFIX-00001-of-00003.gguf; opening the first part opens them all.
static std::string split_part_path(const std::string& first, int index, int count) {
    char suffix[32];
    snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", 1, count);
    std::string s = first;
    if (s.size() < strlen(suffix) || s.compare(s.size() - strlen(suffix), std::string::npos, suffix) != 0) {
        fail("%s: split model (%d parts) must be opened by its first part, named *%s", first.c_str(), count, suffix);
    }
    snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", index + 1, count);
    return s.substr(0, s.size() - strlen(suffix)) + suffix;
}

std::unique_ptr<GGUF> GGUF::open(const std::string& path, bool use_mmap) {
    auto g = std::make_unique<GGUF>();
    g->files_.push_back(std::make_unique<MappedFile>(path, use_mmap));
    GGUFParser{g->files_[0]->data(), g->files_[0]->size(), 0, path}.parse(*g, 0);
    g->total_file_bytes = g->files_[0]->size();
    int64_t n_split = g->get_int("split.count", 1);
    if (n_split < 1 || n_split > 9999) fail("%s: bad split.count %lld", path.c_str(), (long long)n_split);
    for (int k = 1; k < n_split; k++) {
        std::string part = split_part_path(path, k, (int)n_split);
        g->files_.push_back(std::make_unique<MappedFile>(part, use_mmap));
        GGUFParser{g->files_[k]->data(), g->files_[k]->size(), 0, part}.parse(*g, k);
        g->total_file_bytes += g->files_[k]->size();
    }
    int64_t expect = g->get_int("split.tensors.count", (int64_t)g->tensors.size());
    if (expect != (int64_t)g->tensors.size()) {
        fail("%s: split model declares %lld tensors but its parts hold %zu", path.c_str(), (long long)expect, g->tensors.size());
    }
    return g;
}

std::unique_ptr<GGUF> gguf_parse_memory(const uint8_t* data, size_t size) {
    auto g = std::make_unique<GGUF>();
    g->files_.push_back(std::make_unique<MappedFile>(data, size));
    static const std::string name = "<memory>";
    GGUFParser{data, size, 0, name}.parse(*g, 0);
    g->total_file_bytes = size;
    return g;
}

#include "wip/quants.inc"
#include "wip/quantize.inc"
#include "wip/gguf_writer.inc"
#include "wip/quantize_mix.inc"
#include "wip/tokenizer.inc"
#include "wip/chat.inc"

// ============================================================================================
// 6. Thread pool
// ============================================================================================
// Workers live as long as the context. A job is published by bumping `generation_`; workers spin
// briefly before sleeping so the many small jobs of a decode step do not pay a wake-up each.

int physical_core_count() {
    // Unique (physical id, core id) pairs, so hyper-threads do not count twice.
    int cores = 0;
    if (FILE* f = fopen("/proc/cpuinfo", "r")) {
        char line[256];
        int phys = 0;
        std::vector<std::pair<int, int>> seen;
        while (fgets(line, sizeof line, f)) {
            int v;
            if (sscanf(line, "physical id : %d", &v) == 1) phys = v;
            if (sscanf(line, "core id : %d", &v) == 1) {
                if (std::find(seen.begin(), seen.end(), std::make_pair(phys, v)) == seen.end()) seen.emplace_back(phys, v);
            }
        }
        fclose(f);
        cores = (int)seen.size();
    }
    int online = (int)std::thread::hardware_concurrency();
    if (cores <= 0) cores = online > 0 ? online : 1;
    // A container's CPU quota (cgroup v2 cpu.max "QUOTA PERIOD") caps what we may use.
    if (FILE* f = fopen("/sys/fs/cgroup/cpu.max", "r")) {
        char quota[32] = {0};
        long period = 0;
        if (fscanf(f, "%31s %ld", quota, &period) == 2 && strcmp(quota, "max") != 0 && period > 0) {
            int q = (int)((atol(quota) + period - 1) / period);
            if (q > 0) cores = std::min(cores, q);
        }
        fclose(f);
    }
    return std::max(1, cores);
}

class ThreadPool {
public:
    using Fn = std::function<void(int64_t begin, int64_t end, int thread)>;

    explicit ThreadPool(int n_threads) : n_(std::max(1, n_threads)) {
        for (int i = 1; i < n_; i++) workers_.emplace_back([this, i] { worker_loop(i); });
    }
    ~ThreadPool() {
        {
            std::lock_guard<std::mutex> lk(mutex_);
            stop_ = true;
            generation_.fetch_add(1);
        }
        cv_.notify_all();
        for (auto& t : workers_) t.join();
    }
    int size() const { return n_; }

    // Calls fn over [0, n) in chunks of about `grain` items (at least one chunk per thread when n
    // allows); returns when every chunk is done. fn must not throw.
    void parallel_for(int64_t n, int64_t grain, const Fn& fn) {
        if (n <= 0) return;
        grain = std::max<int64_t>(1, grain);
        if (n_ == 1 || n <= grain) {
            fn(0, n, 0);
            return;
        }
        fn_ = &fn;
        n_items_ = n;
        chunk_ = std::max<int64_t>(grain, std::min<int64_t>(n / n_, (n + 8 * n_ - 1) / (8 * n_)));
        next_.store(0);
        done_.store(0);
        {
            std::lock_guard<std::mutex> lk(mutex_);
            generation_.fetch_add(1, std::memory_order_release);
        }
        cv_.notify_all();
        run_chunks(0);
        while (done_.load(std::memory_order_acquire) != n_ - 1) std::this_thread::yield();
    }

private:
    void run_chunks(int thread) {
        for (;;) {
            int64_t b = next_.fetch_add(chunk_);
            if (b >= n_items_) break;
            (*fn_)(b, std::min(n_items_, b + chunk_), thread);
        }
    }
    void worker_loop(int thread) {
        uint64_t seen = 0;
        for (;;) {
            uint64_t g;
            int spins = 0;
            while ((g = generation_.load(std::memory_order_acquire)) == seen && spins < 20000) {
                spins++;
                if ((spins & 63) == 0) std::this_thread::yield();
            }
            if (g == seen) {
                std::unique_lock<std::mutex> lk(mutex_);
                cv_.wait(lk, [&] { return generation_.load() != seen; });
                g = generation_.load();
            }
            seen = g;
            if (stop_) return;
            run_chunks(thread);
            done_.fetch_add(1, std::memory_order_release);
        }
    }

    int n_;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int64_t> next_{0};
    std::atomic<int> done_{0};
    bool stop_ = false;
    const Fn* fn_ = nullptr;
    int64_t n_items_ = 0, chunk_ = 1;
};

// ============================================================================================
// 8. Model
// ============================================================================================

const char* arch_name(Arch a) {
    switch (a) {
        case Arch::Llama: return "llama";
        case Arch::Qwen2: return "qwen2";
        case Arch::Qwen3: return "qwen3";
        case Arch::Gemma3: return "gemma3";
        case Arch::Qwen3Moe: return "qwen3moe";
        case Arch::Deepseek2: return "deepseek2";
    }
    return "?";
}

static Arch arch_from_string(const std::string& s) {
    for (Arch a : {Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3, Arch::Qwen3Moe, Arch::Deepseek2}) {
        if (s == arch_name(a)) return a;
    }
    fail("unsupported model architecture '%s' (supported: llama, qwen2, qwen3, gemma3, qwen3moe, deepseek2)", s.c_str());
}

// Reads ARCH.key as a positive int; a per-layer array is accepted when all layers agree.
static int64_t hparam_int(const GGUF& g, const std::string& key, int64_t def, bool required) {
    const GGUFValue* v = g.find(key);
    if (!v) {
        if (required) fail("model metadata lacks %s", key.c_str());
        return def;
    }
    if (v->is_array()) {
        if (v->arr_num.empty()) fail("metadata %s is an empty or non-numeric array", key.c_str());
        for (double x : v->arr_num) {
            if (x != v->arr_num[0]) fail("metadata %s varies per layer, which is not supported", key.c_str());
        }
        return (int64_t)v->arr_num[0];
    }
    return g.get_int(key, def);
}

size_t Model::weight_bytes() const {
    size_t n = 0;
    for (const auto& t : gguf->tensors) n += t.nbytes;
    return n;
}

size_t Model::n_params() const {
    size_t n = 0;
    for (const auto& t : gguf->tensors) n += (size_t)t.nelements();
    return n;
}

// Finds a tensor and checks its shape; a missing required tensor or a wrong shape is a load error.
struct TensorBinder {
    const GGUF& g;
    const TensorInfo* get(const std::string& name, std::initializer_list<int64_t> shape, bool required = true) const {
        const TensorInfo* t = g.tensor(name);
        if (!t) {
            if (required) fail("model is missing tensor %s", name.c_str());
            return nullptr;
        }
        int d = 0;
        for (int64_t want : shape) {
            if (t->ne[d] != want) {
                fail("tensor %s has shape [%lld, %lld, %lld] where [%s] was expected", name.c_str(), (long long)t->ne[0],
                     (long long)t->ne[1], (long long)t->ne[2], shape_str(shape).c_str());
            }
            d++;
        }
        for (; d < 4; d++) {
            if (t->ne[d] != 1) fail("tensor %s has more dimensions than expected", name.c_str());
        }
        return t;
    }
    static std::string shape_str(std::initializer_list<int64_t> shape) {
        std::string s;
        for (int64_t x : shape) s += (s.empty() ? "" : ", ") + std::to_string(x);
        return s;
    }
};

static void load_hparams(Model& m) {
    const GGUF& g = *m.gguf;
    HParams& hp = m.hp;
    const std::string a = m.arch_str + ".";
    hp.arch = arch_from_string(m.arch_str);
    hp.n_embd = (int)hparam_int(g, a + "embedding_length", 0, true);
    hp.n_layer = (int)hparam_int(g, a + "block_count", 0, true);
    hp.n_ff = (int)hparam_int(g, a + "feed_forward_length", 0, false);
    hp.n_head = (int)hparam_int(g, a + "attention.head_count", 0, true);
    hp.n_head_kv = (int)hparam_int(g, a + "attention.head_count_kv", hp.n_head, false);
    hp.n_ctx_train = (int)hparam_int(g, a + "context_length", 2048, false);
    if (hp.n_embd <= 0 || hp.n_embd > (1 << 20) || hp.n_layer <= 0 || hp.n_layer > 4096 || hp.n_head <= 0 ||
        hp.n_head > 4096 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0 || hp.n_ff < 0 || hp.n_ctx_train <= 0) {
        fail("model hyperparameters are out of range (n_embd %d, n_layer %d, n_head %d, n_head_kv %d)", hp.n_embd,
             hp.n_layer, hp.n_head, hp.n_head_kv);
    }
    hp.head_dim_k = (int)hparam_int(g, a + "attention.key_length", hp.n_embd / hp.n_head, false);
    hp.head_dim_v = (int)hparam_int(g, a + "attention.value_length", hp.n_embd / hp.n_head, false);
    if (hp.head_dim_k <= 0 || hp.head_dim_v <= 0 || hp.head_dim_k > 4096 || hp.head_dim_v > 4096 || hp.head_dim_k % 2) {
        fail("model head dimensions are out of range");
    }
    hp.norm_eps = (float)g.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5);
    hp.n_rot = (int)hparam_int(g, a + "rope.dimension_count", hp.head_dim_k, false);
    if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim_k || hp.n_rot % 2) fail("rope.dimension_count out of range");
    hp.rope_base = (float)g.get_float(a + "rope.freq_base", 10000.0);
    // Sliding-window layers of gemma3 use base 10000 unless the file says otherwise.
    hp.rope_base_swa = (float)g.get_float(a + "rope.freq_base_swa", hp.arch == Arch::Gemma3 ? 10000.0 : hp.rope_base);
    std::string scaling = g.get_str(a + "rope.scaling.type", "none");
    double factor = g.get_float(a + "rope.scaling.factor", 0.0);
    if (scaling == "linear" && factor > 0) hp.rope_freq_scale = (float)(1.0 / factor);
    hp.rope_type = hp.arch == Arch::Llama || hp.arch == Arch::Deepseek2 ? RopeType::Norm : RopeType::Neox;
    hp.attn_scale = 1.0f / std::sqrt((float)hp.head_dim_k);
    hp.swa_layer.assign(hp.n_layer, 0);
    if (hp.arch == Arch::Gemma3) {
        hp.embd_scale = std::sqrt((float)hp.n_embd);
        hp.n_swa = (int)hparam_int(g, a + "attention.sliding_window", 0, false);
        // Every `pattern`-th layer is global, the others slide (gemma3's default pattern is 6).
        int pattern = (int)hparam_int(g, a + "attention.sliding_window_pattern", 6, false);
        if (pattern < 0) fail("sliding_window_pattern out of range");
        for (int il = 0; il < hp.n_layer; il++) {
            hp.swa_layer[il] = hp.n_swa > 0 && (pattern == 0 || il % pattern < pattern - 1);
        }
    }
    if (hp.arch == Arch::Qwen3Moe || hp.arch == Arch::Deepseek2) {
        hp.n_expert = (int)hparam_int(g, a + "expert_count", 0, true);
        hp.n_expert_used = (int)hparam_int(g, a + "expert_used_count", 0, true);
        hp.n_ff_exp = (int)hparam_int(g, a + "expert_feed_forward_length", hp.n_ff, false);
        hp.n_expert_shared = (int)hparam_int(g, a + "expert_shared_count", 0, false);
        hp.n_layer_dense_lead = (int)hparam_int(g, a + "leading_dense_block_count", 0, false);
        hp.n_expert_groups = (int)hparam_int(g, a + "expert_group_count", 0, false);
        hp.n_group_used = (int)hparam_int(g, a + "expert_group_used_count", 0, false);
        int gating = (int)hparam_int(g, a + "expert_gating_func", (int)ExpertGating::Softmax, false);
        if (gating != 1 && gating != 2) fail("unknown expert_gating_func %d", gating);
        hp.expert_gating = (ExpertGating)gating;
        // qwen3moe always renormalizes the chosen experts' weights; deepseek2 says so in metadata.
        hp.expert_weights_norm = hp.arch == Arch::Qwen3Moe || g.get_bool(a + "expert_weights_norm", false);
        hp.expert_weights_scale = (float)g.get_float(a + "expert_weights_scale", 1.0);
        if (hp.n_expert <= 0 || hp.n_expert > 4096 || hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert ||
            hp.n_ff_exp <= 0 || hp.n_layer_dense_lead < 0 || hp.n_layer_dense_lead > hp.n_layer || hp.n_expert_shared < 0) {
            fail("model expert hyperparameters are out of range");
        }
        if (hp.n_expert_groups > 1 && (hp.n_expert % hp.n_expert_groups || hp.n_group_used <= 0 ||
                                       hp.n_group_used > hp.n_expert_groups ||
                                       hp.n_expert_used > hp.n_group_used * (hp.n_expert / hp.n_expert_groups))) {
            fail("model expert group hyperparameters are out of range");
        }
    }
    if (hp.arch == Arch::Deepseek2) {
        hp.mla = true;
        hp.q_lora_rank = (int)hparam_int(g, a + "attention.q_lora_rank", 0, false);
        hp.kv_lora_rank = (int)hparam_int(g, a + "attention.kv_lora_rank", 0, true);
        // Current files give the per-head sizes as key/value_length_mla (key/value_length then describe
        // the absorbed MQA view); older files give them as key/value_length.
        const int head_k = (int)hparam_int(g, a + "attention.key_length_mla", hp.head_dim_k, false);
        hp.v_head_dim = (int)hparam_int(g, a + "attention.value_length_mla", hp.head_dim_v, false);
        hp.qk_nope = head_k - hp.n_rot;
        if (hp.kv_lora_rank <= 0 || hp.kv_lora_rank > 65536 || hp.qk_nope <= 0 || hp.v_head_dim <= 0 || hp.q_lora_rank < 0) {
            fail("model MLA hyperparameters are out of range");
        }
        // Attention runs in latent space: one shared "kv head" of kv_lora_rank + n_rot dims.
        hp.n_head_kv = 1;
        hp.head_dim_k = hp.kv_lora_rank + hp.n_rot;
        hp.head_dim_v = hp.kv_lora_rank;
        hp.attn_scale = 1.0f / std::sqrt((float)head_k);
    }
    if (scaling == "yarn" && factor > 0) {
        hp.rope_freq_scale = (float)(1.0 / factor);
        hp.yarn_ext_factor = 1.0f;
        hp.yarn_beta_fast = (float)g.get_float(a + "rope.scaling.yarn_beta_fast", 32.0);
        hp.yarn_beta_slow = (float)g.get_float(a + "rope.scaling.yarn_beta_slow", 1.0);
        hp.yarn_log_mul = (float)g.get_float(a + "rope.scaling.yarn_log_multiplier", 0.0);
        hp.n_ctx_orig = (int)hparam_int(g, a + "rope.scaling.original_context_length", hp.n_ctx_train, false);
        if (hp.arch == Arch::Deepseek2) {
            // DeepSeek folds the YaRN magnitude into the attention scale instead of cos/sin.
            const float mscale = 1.0f + hp.yarn_log_mul * std::log(1.0f / hp.rope_freq_scale);
            hp.attn_scale *= mscale * mscale;
            hp.rope_attn_factor = 1.0f / (1.0f + 0.1f * std::log(1.0f / hp.rope_freq_scale));
        }
    }
    const TensorInfo* embd = g.tensor("token_embd.weight");
    int64_t vocab_meta = hparam_int(g, a + "vocab_size", 0, false);
    hp.n_vocab = (int)(vocab_meta > 0 ? vocab_meta : (embd ? embd->ne[1] : 0));
    if (hp.n_vocab <= 0) fail("cannot determine the vocabulary size");
}

// A view of slice `index` of a stacked tensor (experts, heads): `rows` rows of ne[0] elements.
static TensorInfo slice_view(const TensorInfo& t, int64_t index, int64_t rows) {
    TensorInfo v = t;
    v.n_dims = 2;
    v.ne[1] = rows;
    v.ne[2] = v.ne[3] = 1;
    v.nbytes = row_bytes(t.type, t.ne[0]) * rows;
    v.data = t.data + v.nbytes * index;
    v.name = t.name + "[" + std::to_string(index) + "]";
    return v;
}

static std::vector<TensorInfo> slice_views(const TensorInfo* t, int64_t count, int64_t rows) {
    std::vector<TensorInfo> views;
    if (t) for (int64_t i = 0; i < count; i++) views.push_back(slice_view(*t, i, rows));
    return views;
}

// Older deepseek2 files hold one attn_kv_b [kv_lora, n_head * (qk_nope + v_head)]. The latent cache
// needs k_b per head as kv_lora rows of qk_nope (the transpose of the k rows), and v_b as the v rows
// in place. The transpose is stored in f32 (f16 for 16-bit sources: exact).
static void split_legacy_kv_b(Model& m, LayerWeights& L, const TensorInfo* kv_b) {
    const HParams& hp = m.hp;
    const int64_t R = hp.kv_lora_rank, nope = hp.qk_nope, vd = hp.v_head_dim, per_head = nope + vd;
    const Type t = kv_b->type == Type::F16 ? Type::F16 : Type::F32;
    std::vector<uint8_t> buf(row_bytes(t, nope) * R * hp.n_head);
    std::vector<float> row(R), col(nope);
    TensorInfo kb;
    kb.name = kv_b->name + ".k_b";
    kb.type = t;
    kb.n_dims = 3;
    kb.ne[0] = nope;
    kb.ne[1] = R;
    kb.ne[2] = hp.n_head;
    kb.nbytes = buf.size();
    const size_t src_row = row_bytes(kv_b->type, R);
    std::vector<float> k_rows(nope * R);
    for (int h = 0; h < hp.n_head; h++) {
        for (int64_t i = 0; i < nope; i++) dequantize_row(kv_b->type, kv_b->data + src_row * (h * per_head + i), &k_rows[i * R], R);
        for (int64_t r = 0; r < R; r++) {
            for (int64_t i = 0; i < nope; i++) col[i] = k_rows[i * R + r];
            quantize_row(t, col.data(), buf.data() + row_bytes(t, nope) * (h * R + r), nope);
        }
    }
    m.derived.push_back(std::move(buf));
    kb.data = m.derived.back().data();
    L.k_b = slice_views(&kb, hp.n_head, R);
    for (int h = 0; h < hp.n_head; h++) {
        TensorInfo v = slice_view(*kv_b, 0, vd);
        v.data = kv_b->data + src_row * (h * per_head + nope);
        v.name = kv_b->name + ".v_b[" + std::to_string(h) + "]";
        L.v_b.push_back(v);
    }
}

static void bind_tensors(Model& m) {
    const HParams& hp = m.hp;
    TensorBinder b{*m.gguf};
    const int64_t E = hp.n_embd, V = hp.n_vocab, F = hp.n_ff, H = hp.n_head;
    m.tok_embd = b.get("token_embd.weight", {E, V});
    m.output_norm = b.get("output_norm.weight", {E});
    m.output = b.get("output.weight", {E, V}, false);
    if (!m.output) m.output = m.tok_embd;  // tied embeddings
    m.rope_freqs = b.get("rope_freqs.weight", {hp.n_rot / 2}, false);
    const bool qk_norm = hp.arch == Arch::Qwen3 || hp.arch == Arch::Gemma3 || hp.arch == Arch::Qwen3Moe;
    const bool qkv_bias = hp.arch == Arch::Qwen2;
    m.layers.resize(hp.n_layer);
    for (int il = 0; il < hp.n_layer; il++) {
        LayerWeights& L = m.layers[il];
        auto name = [&](const char* n) { return "blk." + std::to_string(il) + "." + n; };
        L.attn_norm = b.get(name("attn_norm.weight"), {E});
        if (hp.mla) {
            const int64_t R = hp.kv_lora_rank, QK = hp.qk_nope + hp.n_rot;
            if (hp.q_lora_rank > 0) {
                L.wq_a = b.get(name("attn_q_a.weight"), {E, hp.q_lora_rank});
                L.q_a_norm = b.get(name("attn_q_a_norm.weight"), {hp.q_lora_rank});
                L.wq_b = b.get(name("attn_q_b.weight"), {hp.q_lora_rank, H * QK});
            } else {
                L.wq = b.get(name("attn_q.weight"), {E, H * QK});
            }
            L.wkv_a = b.get(name("attn_kv_a_mqa.weight"), {E, R + hp.n_rot});
            L.kv_a_norm = b.get(name("attn_kv_a_norm.weight"), {R});
            if (const TensorInfo* kv_b = b.get(name("attn_kv_b.weight"), {R, H * (hp.qk_nope + hp.v_head_dim)}, false)) {
                split_legacy_kv_b(m, L, kv_b);
            } else {
                L.k_b = slice_views(b.get(name("attn_k_b.weight"), {hp.qk_nope, R, H}), H, R);
                L.v_b = slice_views(b.get(name("attn_v_b.weight"), {R, hp.v_head_dim, H}), H, hp.v_head_dim);
            }
            L.wo = b.get(name("attn_output.weight"), {H * hp.v_head_dim, E});
        } else {
            const int64_t QD = H * hp.head_dim_k, KD = hp.n_embd_k_gqa(), VD = hp.n_embd_v_gqa();
            L.wq = b.get(name("attn_q.weight"), {E, QD});
            L.wk = b.get(name("attn_k.weight"), {E, KD});
            L.wv = b.get(name("attn_v.weight"), {E, VD});
            L.wo = b.get(name("attn_output.weight"), {H * hp.head_dim_v, E});
            L.bq = b.get(name("attn_q.bias"), {QD}, qkv_bias);
            L.bk = b.get(name("attn_k.bias"), {KD}, qkv_bias);
            L.bv = b.get(name("attn_v.bias"), {VD}, qkv_bias);
            L.q_norm = b.get(name("attn_q_norm.weight"), {hp.head_dim_k}, qk_norm);
            L.k_norm = b.get(name("attn_k_norm.weight"), {hp.head_dim_k}, qk_norm);
        }
        L.ffn_norm = b.get(name("ffn_norm.weight"), {E});
        if (hp.n_expert > 0 && il >= hp.n_layer_dense_lead) {
            const int64_t X = hp.n_expert, FE = hp.n_ff_exp;
            L.gate_inp = b.get(name("ffn_gate_inp.weight"), {E, X});
            L.exp_probs_b = b.get(name("exp_probs_b.bias"), {X}, false);
            L.gate_exp = slice_views(b.get(name("ffn_gate_exps.weight"), {E, FE, X}), X, FE);
            L.up_exp = slice_views(b.get(name("ffn_up_exps.weight"), {E, FE, X}), X, FE);
            L.down_exp = slice_views(b.get(name("ffn_down_exps.weight"), {FE, E, X}), X, E);
            if (hp.n_expert_shared > 0) {
                const int64_t FS = FE * hp.n_expert_shared;
                L.gate_shexp = b.get(name("ffn_gate_shexp.weight"), {E, FS});
                L.up_shexp = b.get(name("ffn_up_shexp.weight"), {E, FS});
                L.down_shexp = b.get(name("ffn_down_shexp.weight"), {FS, E});
            }
        } else {
            L.ffn_gate = b.get(name("ffn_gate.weight"), {E, F});
            L.ffn_up = b.get(name("ffn_up.weight"), {E, F});
            L.ffn_down = b.get(name("ffn_down.weight"), {F, E});
        }
        if (hp.arch == Arch::Gemma3) {
            L.post_attn_norm = b.get(name("post_attention_norm.weight"), {E});
            L.post_ffn_norm = b.get(name("post_ffw_norm.weight"), {E});
        }
    }
    // Norms, biases and the router are read as f32 directly.
    auto need_f32 = [](const TensorInfo* t) {
        if (t && t->type != Type::F32) fail("tensor %s must be f32, is %s", t->name.c_str(), type_info(t->type).name);
    };
    for (const auto& L : m.layers) {
        for (const TensorInfo* t : {L.attn_norm, L.bq, L.bk, L.bv, L.q_norm, L.k_norm, L.post_attn_norm, L.ffn_norm,
                                    L.post_ffn_norm, L.q_a_norm, L.kv_a_norm, L.exp_probs_b}) {
            need_f32(t);
        }
    }
    need_f32(m.output_norm);
    need_f32(m.rope_freqs);
}

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& opt) {
    auto m = std::make_unique<Model>();
    m->gguf = GGUF::open(path, opt.use_mmap);
    m->vocab = Vocab(*m->gguf);
    if (opt.vocab_only) return m;
    m->arch_str = m->gguf->get_str("general.architecture", "");
    if (m->arch_str.empty()) fail("%s: no general.architecture (a vocabulary-only file?)", path.c_str());
    load_hparams(*m);
    if (opt.metadata_only) return m;
    bind_tensors(*m);
    if (opt.mlock) {
        // Best effort: the mapping stays usable when the OS refuses to pin it.
        for (const auto& t : m->gguf->tensors) {
            if (mlock(t.data, t.nbytes) != 0) {
                fprintf(stderr, "warning: mlock failed (%s); continuing without\n", strerror(errno));
                break;
            }
        }
    }
    return m;
}

// ============================================================================================
// 9. KV cache
// ============================================================================================
// Each layer keeps one row of K and one of V per cell, quantized to the cache type. A sequence's
// positions map to cells through its page table (pages of 16 cells), so sequences can share one
// pool and a truncated sequence returns its pages. Memory is reserved once, untouched until used.

struct KVCache {
    static constexpr int kBlock = 16;    // cells per page
    Type type_k = Type::F16, type_v = Type::F16;
    int n_layer = 0, n_seq = 1, n_blocks = 0;
    int seq_cap = 0;                     // most positions one sequence may hold
    int64_t dim_k = 0, dim_v = 0;        // row widths (elements)
    size_t row_k = 0, row_v = 0;         // row widths (bytes)
    std::vector<std::unique_ptr<uint8_t[]>> k, v;  // per layer: n_blocks * kBlock rows
    std::vector<int> seq_len;
    std::vector<std::vector<int>> pages;  // per sequence: the blocks holding positions 0, 16, 32, ...
    std::vector<int> free_blocks;
    // A quantized cache stores K and V rotated by a Walsh-Hadamard transform (blocks of rot_k / rot_v
    // values, 0 = off), as the reference does since 2026: rotation spreads outliers over a block so
    // 4- and 8-bit rows lose less, and it cancels in q.k and in the attention output.
    int rot_k = 0, rot_v = 0;

    // Cells live in pages of kBlock tokens taken from one pool. Split mode gives every sequence
    // n_cells / n_seq positions and a pool large enough that it can always have them; unified mode
    // (kv_unified) lets any sequence grow to the whole pool while others leave room.
    void init(const HParams& hp, const ContextParams& cp, int n_cells_total) {
        for (Type t : {cp.type_k, cp.type_v}) {
            if (t != Type::F32 && t != Type::F16 && t != Type::Q8_0 && t != Type::Q4_0 && t != Type::IQ4_NL) {
                fail("KV cache type %s is not supported (f32, f16, q8_0, q4_0, iq4_nl)", type_info(t).name);
            }
        }
        type_k = cp.type_k;
        type_v = cp.type_v;
        n_layer = hp.n_layer;
        n_seq = cp.n_seq;
        seq_cap = cp.kv_unified ? n_cells_total : n_cells_total / n_seq;
        n_blocks = cp.kv_unified ? (n_cells_total + kBlock - 1) / kBlock : n_seq * ((seq_cap + kBlock - 1) / kBlock);
        dim_k = hp.n_embd_k_gqa();
        dim_v = hp.mla ? 0 : hp.n_embd_v_gqa();  // a latent cache has no separate V
        for (auto [t, d] : {std::make_pair(type_k, hp.head_dim_k), std::make_pair(type_v, hp.mla ? 0 : hp.head_dim_v)}) {
            if (d % type_info(t).block_size) fail("head size %d is not a multiple of the %s block size", d, type_info(t).name);
        }
        row_k = row_bytes(type_k, dim_k);
        row_v = row_bytes(type_v, dim_v);
        auto quantized = [](Type t) { return t != Type::F32 && t != Type::F16; };
        if (!hp.mla && quantized(type_k) && hp.head_dim_k % 64 == 0) {
            rot_k = 64;  // the largest power of two dividing the head size
            while (hp.head_dim_k % (rot_k * 2) == 0) rot_k *= 2;
        }
        if (!hp.mla && quantized(type_v) && hp.head_dim_v % 64 == 0) rot_v = 64;
        const size_t cells = (size_t)n_blocks * kBlock;
        for (int il = 0; il < n_layer; il++) {
            // new[] without value-initialization: pages are only committed as tokens are written.
            k.emplace_back(new uint8_t[cells * row_k]);
            v.emplace_back(row_v ? new uint8_t[cells * row_v] : nullptr);
        }
        seq_len.assign(n_seq, 0);
        pages.assign(n_seq, {});
        for (int b = n_blocks - 1; b >= 0; b--) free_blocks.push_back(b);
    }
    size_t bytes_per_token() const { return (row_k + row_v) * n_layer; }
    size_t bytes() const { return bytes_per_token() * n_blocks * kBlock; }
    int cells_used() const {
        int n = 0;
        for (int len : seq_len) n += len;
        return n;
    }
    static int blocks_for(int n_pos) { return (n_pos + kBlock - 1) / kBlock; }
    // Gives seq the pages for positions [0, n_pos); the caller checked there are enough free.
    void reserve(int seq, int n_pos) {
        while ((int)pages[seq].size() < blocks_for(n_pos)) {
            pages[seq].push_back(free_blocks.back());
            free_blocks.pop_back();
        }
    }
    void truncate(int seq, int n) {
        seq_len[seq] = std::max(0, std::min(seq_len[seq], n));
        while ((int)pages[seq].size() > blocks_for(seq_len[seq])) {
            free_blocks.push_back(pages[seq].back());
            pages[seq].pop_back();
        }
    }
    size_t cell(int seq, int pos) const { return (size_t)pages[seq][pos / kBlock] * kBlock + pos % kBlock; }
    uint8_t* k_row(int il, int seq, int pos) { return k[il].get() + cell(seq, pos) * row_k; }
    uint8_t* v_row(int il, int seq, int pos) { return v[il].get() + cell(seq, pos) * row_v; }
};

// ============================================================================================
// 10. Forward pass
// ============================================================================================
// One code path for every batch size: activations are [n_tokens x width] row-major f32. Matrix
// products convert the activations once to the weight's dot-product type (as the reference does, so
// rounding matches), then split the weight rows over the threads.

struct Context::Impl {
    const Model& model;
    ContextParams params;
    ThreadPool pool;
    KVCache kv;
    std::vector<float> logits;  // n_logits x n_vocab
    int n_logits = 0;
    // Scratch, reused between calls.
    std::vector<float> x, cur, q, k, v, attn, tmp, qa, gathered, gathered_out;
    std::vector<float> ffn_gate, ffn_up, moe_out, router;
    std::vector<std::vector<uint8_t>> act;     // activations converted for matmuls
    std::vector<std::vector<float>> thread_scratch;
    std::vector<std::vector<uint8_t>> thread_bytes;

    Impl(const Model& m, const ContextParams& p) : model(m), params(p), pool(p.n_threads), thread_scratch(p.n_threads), thread_bytes(p.n_threads) {}

    // One product out[n x rows(w)] = x[n x k] * w^T. Several are run together so that a decode step
    // with many small products (heads, experts) pays one thread hand-off, not one per product.
    struct MatMul {
        const TensorInfo* w;
        const float* x;
        int n;
        float* out;
    };

    void matmul(std::initializer_list<MatMul> jobs) { matmul(std::vector<MatMul>(jobs)); }
    void matmul(const std::vector<MatMul>& jobs) {
        // Convert each distinct input once to the dot-product type of its weight.
        struct Conv { const float* x; Type t; int n; int64_t k; size_t row; };
        std::vector<Conv> convs;
        std::vector<int> conv_of(jobs.size());
        for (size_t j = 0; j < jobs.size(); j++) {
            const Type t = vec_dot_type(jobs[j].w->type);
            const int64_t k = jobs[j].w->ne[0];
            size_t c = 0;
            while (c < convs.size() && !(convs[c].x == jobs[j].x && convs[c].t == t && convs[c].n == jobs[j].n)) c++;
            if (c == convs.size()) convs.push_back({jobs[j].x, t, jobs[j].n, k, row_bytes(t, k)});
            conv_of[j] = (int)c;
        }
        if (act.size() < convs.size()) act.resize(convs.size());
        std::vector<std::pair<int, int>> conv_rows;  // (conversion, token)
        for (size_t c = 0; c < convs.size(); c++) {
            if (act[c].size() < convs[c].row * convs[c].n) act[c].resize(convs[c].row * convs[c].n);
            for (int i = 0; i < convs[c].n; i++) conv_rows.emplace_back((int)c, i);
        }
        pool.parallel_for((int64_t)conv_rows.size(), 1, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; r++) {
                const Conv& c = convs[conv_rows[r].first];
                const int i = conv_rows[r].second;
                quantize_row(c.t, c.x + i * c.k, act[conv_rows[r].first].data() + i * c.row, c.k);
            }
        });
        // Split all weight rows into tasks of similar cost (rows x columns), about 16 per thread, so
        // jobs of different sizes (experts with few or many tokens) still balance across threads.
        struct Task { int job; int64_t r0, r1; };
        std::vector<Task> tasks;
        double total_cost = 0;
        for (const MatMul& m : jobs) total_cost += (double)m.w->ne[1] * m.n;
        const double task_cost = total_cost / (pool.size() * 16);
        for (size_t j = 0; j < jobs.size(); j++) {
            const int64_t rows = jobs[j].w->ne[1];
            const int64_t chunk = (std::max<int64_t>(16, (int64_t)(task_cost / std::max(1, jobs[j].n))) + 15) / 16 * 16;
            for (int64_t r = 0; r < rows; r += chunk) tasks.push_back({(int)j, r, std::min(rows, r + chunk)});
        }
        pool.parallel_for((int64_t)tasks.size(), 1, [&](int64_t b, int64_t e, int) {
            for (int64_t t = b; t < e; t++) {
                const MatMul& m = jobs[tasks[t].job];
                const Conv& c = convs[conv_of[tasks[t].job]];
                matmul_rows(m.w->type, m.w->data, row_bytes(m.w->type, c.k), c.k, tasks[t].r0, tasks[t].r1,
                            act[conv_of[tasks[t].job]].data(), c.row, m.n, m.out, m.w->ne[1]);
            }
        });
    }

    // y = x / rms(x) * w for n rows of `dim` values spaced `stride` apart (sum of squares in double, as
    // the reference).
    static void rms_norm(float* data, const TensorInfo* w, float eps, int n, int64_t dim, int64_t stride = 0) {
        if (stride == 0) stride = dim;
        const float* wt = (const float*)w->data;
        for (int i = 0; i < n; i++) {
            float* r = data + i * stride;
            double sum = 0;
            for (int64_t j = 0; j < dim; j++) sum += (double)r[j] * r[j];
            const float scale = 1.0f / std::sqrt((float)(sum / dim) + eps);
            for (int64_t j = 0; j < dim; j++) r[j] = r[j] * scale * wt[j];
        }
    }
    static void rms_norm_to(const float* in, const TensorInfo* w, float eps, int n, int64_t dim, float* out) {
        std::copy(in, in + n * dim, out);
        rms_norm(out, w, eps, n, dim);
    }

    // cos/sin of every rotated pair at one position, as ggml's rope cache computes them: theta_i =
    // pos * base^(-2i/n_rot) accumulated by repeated multiplication in float, divided by the
    // frequency factor, then YaRN's interpolation/extrapolation mix where configured.
    void rope_angles(int pos, float base, float* cs) const {
        const HParams& hp = model.hp;
        const int n_rot = hp.n_rot;
        const float theta_scale = std::pow(base, -2.0f / n_rot);
        const float* ff = model.rope_freqs ? (const float*)model.rope_freqs->data : nullptr;
        float corr[2] = {0, 0};
        if (hp.yarn_ext_factor != 0.0f) {
            auto corr_dim = [&](float n_rot_beta) {
                return n_rot * std::log(hp.n_ctx_orig / (n_rot_beta * 2 * 3.14159265358979323846f)) / (2 * std::log(base));
            };
            corr[0] = std::max(0.0f, std::floor(corr_dim(hp.yarn_beta_fast)));
            corr[1] = std::min((float)(n_rot - 1), std::ceil(corr_dim(hp.yarn_beta_slow)));
        }
        float theta = (float)pos;
        for (int i0 = 0; i0 < n_rot; i0 += 2) {
            const float extrap = theta / (ff ? ff[i0 / 2] : 1.0f), interp = hp.rope_freq_scale * extrap;
            float t = interp, mscale = hp.rope_attn_factor;
            if (hp.yarn_ext_factor != 0.0f) {
                const float y = (i0 / 2 - corr[0]) / std::max(0.001f, corr[1] - corr[0]);
                const float mix = (1 - std::min(1.0f, std::max(0.0f, y))) * hp.yarn_ext_factor;
                t = interp * (1 - mix) + extrap * mix;
                mscale *= 1.0f + 0.1f * std::log(1.0f / hp.rope_freq_scale);
            }
            cs[i0] = std::cos(t) * mscale;
            cs[i0 + 1] = std::sin(t) * mscale;
            theta *= theta_scale;
        }
    }

    // Rotates n_rot dims starting at `offset` of each head; head h of token i starts at
    // data + (i * n_heads + h) * head_stride.
    void rope(float* data, int n, int n_heads, int64_t head_stride, int offset, const int32_t* pos, float base) {
        const HParams& hp = model.hp;
        const int n_rot = hp.n_rot;
        std::vector<float> cs(n_rot);
        for (int i = 0; i < n; i++) {
            rope_angles(pos[i], base, cs.data());
            for (int h = 0; h < n_heads; h++) {
                float* r = data + ((int64_t)i * n_heads + h) * head_stride + offset;
                for (int i0 = 0; i0 < n_rot; i0 += 2) {
                    const int a = hp.rope_type == RopeType::Norm ? i0 : i0 / 2;
                    const int b = hp.rope_type == RopeType::Norm ? i0 + 1 : i0 / 2 + n_rot / 2;
                    const float x0 = r[a], x1 = r[b], c = cs[i0], s = cs[i0 + 1];
                    r[a] = x0 * c - x1 * s;
                    r[b] = x0 * s + x1 * c;
                }
            }
        }
    }

    // In-place orthonormal Walsh-Hadamard transform of every block of n values (n a power of two):
    // the Sylvester matrix scaled by 1/sqrt(n), which is its own inverse.
    static void hadamard(float* data, int64_t count, int n) {
        const float scale = 1.0f / std::sqrt((float)n);
        for (int64_t b = 0; b + n <= count; b += n) {
            float* x = data + b;
            for (int len = 1; len < n; len *= 2) {
                for (int i = 0; i < n; i += 2 * len) {
                    for (int j = i; j < i + len; j++) {
                        const float u = x[j], w = x[j + len];
                        x[j] = u + w;
                        x[j + len] = u - w;
                    }
                }
            }
            for (int i = 0; i < n; i++) x[i] *= scale;
        }
    }

    static void add_bias(float* data, const TensorInfo* b, int n) {
        if (!b) return;
        const float* bv = (const float*)b->data;
        for (int i = 0; i < n; i++) {
            for (int64_t j = 0; j < b->ne[0]; j++) data[i * b->ne[0] + j] += bv[j];
        }
    }

    // Copies `width` values at `offset` of each of n rows spaced `stride` apart into a dense [n x width]
    // block, or back (scatter).
    static void gather(const float* src, int n, int64_t stride, int64_t offset, int64_t width, float* dst) {
        for (int i = 0; i < n; i++) std::copy(src + i * stride + offset, src + i * stride + offset + width, dst + i * width);
    }
    static void scatter(const float* src, int n, int64_t stride, int64_t offset, int64_t width, float* dst) {
        for (int i = 0; i < n; i++) std::copy(src + i * width, src + (i + 1) * width, dst + i * stride + offset);
    }

    // Attention of every batch token over its own sequence's cached positions [lo, pos]. q holds
    // n x n_head x head_dim_k, the result goes to attn as n x n_head x head_dim_v. In latent (MLA)
    // caches there is no V: the first head_dim_v values of each K row serve as V.
    void attention(int il, const Batch& batch, int n) {
        const HParams& hp = model.hp;
        const int hd_k = hp.head_dim_k, hd_v = hp.head_dim_v, group = hp.n_head / hp.n_head_kv;
        const bool swa = hp.swa_layer[il];
        std::vector<int> seqs(batch.seq.begin(), batch.seq.begin() + n);
        std::sort(seqs.begin(), seqs.end());
        seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
        for (int s : seqs) {
            std::vector<int> idx;
            int n_kv = 0;
            for (int i = 0; i < n; i++) {
                if (batch.seq[i] != s) continue;
                idx.push_back(i);
                n_kv = std::max(n_kv, batch.pos[i] + 1);
            }
            // Scores are dot products straight on the cache rows, with the query converted to the
            // cache type's dot-product type as the reference does; the heads that share a KV head
            // go through one matmul_rows call, so each K row is read once for all of them. V rows
            // (in a latent cache: the tail of the K rows) are summed straight from the cache.
            const bool v_from_k = kv.dim_v == 0;
            const Type vt = v_from_k ? kv.type_k : kv.type_v;
            const size_t v_stride = v_from_k ? kv.row_k : kv.row_v, v_head = row_bytes(vt, hd_v);
            const size_t v_in_k = v_from_k ? row_bytes(kv.type_k, hp.n_rot) : 0;  // latent rows: [rope | latent]
            auto v_row = [&](int c) { return v_from_k ? kv.k_row(il, s, c) + v_in_k : kv.v_row(il, s, c); };
            // Positions [lo, hi) as runs of cells that are adjacent in the cache (pages may not be).
            auto for_runs = [&](int lo, int hi, auto&& fn) {
                for (int c0 = lo; c0 < hi;) {
                    int c1 = std::min(hi, (c0 / KVCache::kBlock + 1) * KVCache::kBlock);
                    while (c1 < hi && kv.cell(s, c1) == kv.cell(s, c1 - 1) + 1) c1 = std::min(hi, c1 + KVCache::kBlock);
                    fn(c0, c1);
                    c0 = c1;
                }
            };
            // With an f16 V the reference multiplies V by the probabilities rounded to f16; doing the
            // same keeps the next layer's 8-bit activation rounding in step with it.
            const bool round_p = vt == Type::F16;
            const Type qt = vec_dot_type(kv.type_k);
            const size_t q_row = row_bytes(qt, hd_k), k_head = row_bytes(kv.type_k, hd_k);
            // Work items: (token, KV head, slice of its query heads); slices only split a group when
            // there would otherwise be fewer items than threads (decode).
            int slices = 1;
            while ((int64_t)idx.size() * hp.n_head_kv * slices < pool.size() && slices < group) slices++;
            const int per_slice = (group + slices - 1) / slices;
            const int64_t n_work = (int64_t)idx.size() * hp.n_head_kv * slices;
            pool.parallel_for(n_work, 1, [&](int64_t b, int64_t e, int thread) {
                std::vector<float>& sc = thread_scratch[thread];
                if (sc.size() < (size_t)per_slice * n_kv + hd_v) sc.resize((size_t)per_slice * n_kv + hd_v);
                float* deq = sc.data() + (size_t)per_slice * n_kv;
                std::vector<uint8_t>& qc = thread_bytes[thread];
                qc.resize(q_row * per_slice);
                for (int64_t w_ = b; w_ < e; w_++) {
                    // Late tokens see the most positions: hand them out first so the threads finish together.
                    const int64_t w = n_work - 1 - w_;
                    const int i = idx[w / (hp.n_head_kv * slices)];
                    const int hk = (int)(w / slices % hp.n_head_kv);
                    const int h0 = hk * group + (int)(w % slices) * per_slice;
                    const int nh = std::min(per_slice, (hk + 1) * group - h0);
                    if (nh <= 0) continue;
                    const int p = batch.pos[i];
                    const int lo = swa ? std::max(0, p - hp.n_swa + 1) : 0;
                    const float* qrow = q.data() + ((int64_t)i * hp.n_head + h0) * hd_k;
                    for (int j = 0; j < nh; j++) quantize_row(qt, qrow + j * hd_k, qc.data() + j * q_row, hd_k);
                    // sc[j * n_kv + c] = K row c . query j
                    for_runs(lo, p + 1, [&](int c0, int c1) {
                        matmul_rows(kv.type_k, kv.k_row(il, s, c0) + hk * k_head, kv.row_k, hd_k, 0, c1 - c0, qc.data(), q_row, nh,
                                    sc.data() + c0, n_kv);
                    });
                    for (int j = 0; j < nh; j++) {
                        float* sj = sc.data() + (size_t)j * n_kv;
                        softmax_scaled(sj + lo, p + 1 - lo, hp.attn_scale, round_p);
                        float* o = attn.data() + ((int64_t)i * hp.n_head + h0 + j) * hd_v;
                        for_runs(lo, p + 1, [&](int c0, int c1) {
                            weighted_row_sum(vt, v_row(c0) + hk * v_head, v_stride, sj + c0, c1 - c0, hd_v, o, deq, c0 > lo);
                        });
                    }
                }
            });
        }
    }

    void store_kv(int il, const Batch& batch, int n, const float* krows, const float* vrows) {
        for (int i = 0; i < n; i++) {
            quantize_row(kv.type_k, krows + i * kv.dim_k, kv.k_row(il, batch.seq[i], batch.pos[i]), kv.dim_k);
            if (kv.dim_v) quantize_row(kv.type_v, vrows + i * kv.dim_v, kv.v_row(il, batch.seq[i], batch.pos[i]), kv.dim_v);
        }
    }

    // Grouped-query attention (llama, qwen2/3, gemma3): cur -> tmp (n x n_embd).
    void attention_gqa(int il, const Batch& batch, int n) {
        const HParams& hp = model.hp;
        const LayerWeights& L = model.layers[il];
        matmul({{L.wq, cur.data(), n, q.data()}, {L.wk, cur.data(), n, k.data()}, {L.wv, cur.data(), n, v.data()}});
        add_bias(q.data(), L.bq, n);
        add_bias(k.data(), L.bk, n);
        add_bias(v.data(), L.bv, n);
        if (L.q_norm) {
            rms_norm(q.data(), L.q_norm, hp.norm_eps, n * hp.n_head, hp.head_dim_k);
            rms_norm(k.data(), L.k_norm, hp.norm_eps, n * hp.n_head_kv, hp.head_dim_k);
        }
        const float base = hp.swa_layer[il] ? hp.rope_base_swa : hp.rope_base;
        rope(q.data(), n, hp.n_head, hp.head_dim_k, 0, batch.pos.data(), base);
        rope(k.data(), n, hp.n_head_kv, hp.head_dim_k, 0, batch.pos.data(), base);
        if (kv.rot_k) {
            hadamard(q.data(), (int64_t)n * hp.n_head * hp.head_dim_k, kv.rot_k);
            hadamard(k.data(), (int64_t)n * kv.dim_k, kv.rot_k);
        }
        if (kv.rot_v) hadamard(v.data(), (int64_t)n * kv.dim_v, kv.rot_v);
        store_kv(il, batch, n, k.data(), v.data());
        attention(il, batch, n);
        if (kv.rot_v) hadamard(attn.data(), (int64_t)n * hp.n_head * hp.head_dim_v, kv.rot_v);
        matmul({{L.wo, attn.data(), n, tmp.data()}});
    }

    // Multi-head latent attention in absorbed form (deepseek2). The cache row of a token is its roped
    // key part (n_rot) followed by its normalized latent (kv_lora_rank), the order the reference
    // uses (so f16 dot products sum in the same order); the query is folded into latent space per
    // head (q_nope * k_b), attention runs there, and v_b maps the result back.
    void attention_mla(int il, const Batch& batch, int n) {
        const HParams& hp = model.hp;
        const LayerWeights& L = model.layers[il];
        const int H = hp.n_head, R = hp.kv_lora_rank, nope = hp.qk_nope, rot = hp.n_rot, vd = hp.v_head_dim;
        const int64_t qh = nope + rot, row = R + rot;
        std::vector<float>& qp = ffn_gate;  // projected query, n x H x qh (scratch reuse)
        qp.resize((size_t)n * H * qh);
        std::vector<float>& kv_a = ffn_up;  // [latent | rope] as projected, n x row
        kv_a.resize((size_t)n * row);
        if (L.wq_a) {
            qa.resize((size_t)n * hp.q_lora_rank);
            matmul({{L.wq_a, cur.data(), n, qa.data()}, {L.wkv_a, cur.data(), n, kv_a.data()}});
            rms_norm(qa.data(), L.q_a_norm, hp.norm_eps, n, hp.q_lora_rank);
            matmul({{L.wq_b, qa.data(), n, qp.data()}});
        } else {
            matmul({{L.wq, cur.data(), n, qp.data()}, {L.wkv_a, cur.data(), n, kv_a.data()}});
        }
        rope(qp.data(), n, H, qh, nope, batch.pos.data(), hp.rope_base);
        rope(kv_a.data(), n, 1, row, R, batch.pos.data(), hp.rope_base);
        rms_norm(kv_a.data(), L.kv_a_norm, hp.norm_eps, n, R, row);
        for (int i = 0; i < n; i++) {
            std::copy(kv_a.data() + i * row + R, kv_a.data() + (i + 1) * row, k.data() + i * row);
            std::copy(kv_a.data() + i * row, kv_a.data() + i * row + R, k.data() + i * row + rot);
        }
        store_kv(il, batch, n, k.data(), nullptr);

        // q (n x H x (rot + R)) = [q_rope, q_nope * k_b_h] per head.
        gathered.resize((size_t)n * H * std::max<int64_t>(nope, R));
        gathered_out.resize((size_t)n * H * R);
        std::vector<MatMul> jobs;
        for (int h = 0; h < H; h++) {
            gather(qp.data(), n, H * qh, h * qh, nope, gathered.data() + (size_t)h * n * nope);
            jobs.push_back({&L.k_b[h], gathered.data() + (size_t)h * n * nope, n, gathered_out.data() + (size_t)h * n * R});
        }
        matmul(jobs);
        for (int h = 0; h < H; h++) {
            scatter(gathered_out.data() + (size_t)h * n * R, n, H * row, h * row + rot, R, q.data());
            for (int i = 0; i < n; i++) {
                std::copy(qp.data() + (i * H + h) * qh + nope, qp.data() + (i * H + h) * qh + qh, q.data() + (i * H + h) * row);
            }
        }
        attention(il, batch, n);
        // attn (n x H x R) -> per head v_b -> (n x H x vd) -> wo.
        jobs.clear();
        for (int h = 0; h < H; h++) {
            gather(attn.data(), n, (int64_t)H * R, (int64_t)h * R, R, gathered.data() + (size_t)h * n * R);
            jobs.push_back({&L.v_b[h], gathered.data() + (size_t)h * n * R, n, gathered_out.data() + (size_t)h * n * vd});
        }
        matmul(jobs);
        for (int h = 0; h < H; h++) scatter(gathered_out.data() + (size_t)h * n * vd, n, (int64_t)H * vd, (int64_t)h * vd, vd, qa.data());
        matmul({{L.wo, qa.data(), n, tmp.data()}});
    }

    static float gelu(float x) {
        // ggml evaluates GELU (tanh form) through an f16 table: round the input and the output to f16.
        if (x <= -10.0f) return 0.0f;
        if (x >= 10.0f) return x;
        const float xh = fp16_to_fp32(fp32_to_fp16(x));
        const float y = 0.5f * xh * (1.0f + std::tanh(0.79788456080286535588f * xh * (1.0f + 0.044715f * xh * xh)));
        return fp16_to_fp32(fp32_to_fp16(y));
    }
    static float silu(float x) { return x / (1.0f + std::exp(-x)); }

    void gated_activation(float* gate, const float* up, int64_t count) {
        const bool use_gelu = model.hp.arch == Arch::Gemma3;
        pool.parallel_for(count, 16384, [&](int64_t b, int64_t e, int) {
            for (int64_t j = b; j < e; j++) gate[j] = (use_gelu ? gelu(gate[j]) : silu(gate[j])) * up[j];
        });
    }

    // Dense gated FFN: out = down(act(gate(x)) * up(x)).
    void ffn_dense(const TensorInfo* gate, const TensorInfo* up, const TensorInfo* down, const float* xin, int n, float* out) {
        const int64_t F = gate->ne[1];
        ffn_gate.resize((size_t)n * F);
        ffn_up.resize((size_t)n * F);
        matmul({{gate, xin, n, ffn_gate.data()}, {up, xin, n, ffn_up.data()}});
        gated_activation(ffn_gate.data(), ffn_up.data(), n * F);
        matmul({{down, ffn_gate.data(), n, out}});
    }

    // Mixture of experts, grouped by expert: every token is routed first, then each chosen expert runs
    // once over all the tokens that chose it, so its weights are read once per batch.
    void ffn_moe(const LayerWeights& L, const float* xin, int n, float* out) {
        const int64_t E = model.hp.n_embd;
        if (params.moe_grouped || n == 1) {
            moe_routed(L, xin, n, out);
        } else {
            // Token by token (the baseline that --moe-per-token measures): each token's experts run
            // on their own, so every expert is read once per token that chose it.
            for (int i = 0; i < n; i++) moe_routed(L, xin + i * E, 1, out + i * E);
        }
        if (L.gate_shexp) {
            std::vector<float> shared((size_t)n * E);
            ffn_dense(L.gate_shexp, L.up_shexp, L.down_shexp, xin, n, shared.data());
            for (int64_t j = 0; j < n * E; j++) out[j] += shared[j];
        }
    }
    void moe_routed(const LayerWeights& L, const float* xin, int n, float* out) {
        const HParams& hp = model.hp;
        const int X = hp.n_expert, K = hp.n_expert_used;
        const int64_t E = hp.n_embd, FE = hp.n_ff_exp;
        router.resize((size_t)n * X);
        matmul({{L.gate_inp, xin, n, router.data()}});
        std::vector<std::vector<std::pair<int, float>>> users(X);  // expert -> (token, weight)
        std::vector<int32_t> chosen(K);
        std::vector<float> weights(K);
        const float* bias = L.exp_probs_b ? (const float*)L.exp_probs_b->data : nullptr;
        for (int i = 0; i < n; i++) {
            moe_route(hp, router.data() + (size_t)i * X, bias, chosen.data(), weights.data());
            for (int j = 0; j < K; j++) users[chosen[j]].emplace_back(i, weights[j]);
        }
        // Row offsets of each expert's tokens in the gathered buffers.
        std::vector<int> first(X + 1, 0);
        for (int e = 0; e < X; e++) first[e + 1] = first[e] + (int)users[e].size();
        const int total = first[X];
        gathered.resize((size_t)total * E);
        ffn_gate.resize((size_t)total * FE);
        ffn_up.resize((size_t)total * FE);
        moe_out.resize((size_t)total * E);
        std::vector<MatMul> jobs;
        for (int e = 0; e < X; e++) {
            if (users[e].empty()) continue;
            for (size_t u = 0; u < users[e].size(); u++) {
                std::copy(xin + users[e][u].first * E, xin + (users[e][u].first + 1) * E, gathered.data() + (first[e] + u) * E);
            }
            const int m = (int)users[e].size();
            jobs.push_back({&L.gate_exp[e], gathered.data() + first[e] * E, m, ffn_gate.data() + first[e] * FE});
            jobs.push_back({&L.up_exp[e], gathered.data() + first[e] * E, m, ffn_up.data() + first[e] * FE});
        }
        matmul(jobs);
        gated_activation(ffn_gate.data(), ffn_up.data(), (int64_t)total * FE);
        jobs.clear();
        for (int e = 0; e < X; e++) {
            if (!users[e].empty()) jobs.push_back({&L.down_exp[e], ffn_gate.data() + first[e] * FE, (int)users[e].size(), moe_out.data() + first[e] * E});
        }
        matmul(jobs);
        std::fill(out, out + n * E, 0.0f);
        for (int e = 0; e < X; e++) {
            for (size_t u = 0; u < users[e].size(); u++) {
                const float w = users[e][u].second;
                const float* src = moe_out.data() + (first[e] + u) * E;
                float* dst = out + users[e][u].first * E;
                for (int64_t j = 0; j < E; j++) dst[j] += w * src[j];
            }
        }
    }

    // Checks the batch and reserves the cache pages it needs, all or nothing.
    void validate(const Batch& batch) {
        const int n = (int)batch.size();
        if (n == 0) fail("empty batch");
        if (batch.pos.size() != batch.size() || batch.seq.size() != batch.size() || batch.want_logits.size() != batch.size()) {
            fail("batch arrays have different lengths");
        }
        std::vector<int> next(kv.seq_len);
        for (int i = 0; i < n; i++) {
            const int s = batch.seq[i], p = batch.pos[i];
            if (batch.token[i] < 0 || batch.token[i] >= model.hp.n_vocab) fail("token id %d out of range [0, %d)", batch.token[i], model.hp.n_vocab);
            if (s < 0 || s >= kv.n_seq) fail("sequence id %d out of range", s);
            if (p >= kv.seq_cap) fail("context is full: position %d needs more than the %d cells of a sequence", p, kv.seq_cap);
            if (p != next[s]) fail("position %d of sequence %d does not continue its cache (expected %d)", p, s, next[s]);
            next[s]++;
        }
        int needed = 0;
        for (int s = 0; s < kv.n_seq; s++) needed += std::max(0, KVCache::blocks_for(next[s]) - (int)kv.pages[s].size());
        if (needed > (int)kv.free_blocks.size()) {
            fail("KV cache is full: the batch needs %d more cells than are free (%d of %d used)", needed * KVCache::kBlock,
                 kv.cells_used(), kv.n_blocks * KVCache::kBlock);
        }
        for (int s = 0; s < kv.n_seq; s++) kv.reserve(s, next[s]);
    }

    void decode(const Batch& batch) {
        validate(batch);
        const Model& m = model;
        const HParams& hp = m.hp;
        const int n = (int)batch.size();
        const int64_t E = hp.n_embd;
        x.resize(n * E);
        cur.resize(n * E);
        tmp.resize(n * E);
        q.resize((size_t)n * hp.n_head * hp.head_dim_k);
        attn.resize((size_t)n * hp.n_head * hp.head_dim_v);
        k.resize((size_t)n * kv.dim_k);
        v.resize((size_t)n * kv.dim_v);
        if (hp.mla) qa.resize((size_t)n * std::max<int64_t>(hp.q_lora_rank, (int64_t)hp.n_head * hp.v_head_dim));

        for (int i = 0; i < n; i++) {
            const uint8_t* row = m.tok_embd->data + row_bytes(m.tok_embd->type, E) * batch.token[i];
            dequantize_row(m.tok_embd->type, row, x.data() + i * E, E);
            if (hp.embd_scale != 1.0f) for (int64_t j = 0; j < E; j++) x[i * E + j] *= hp.embd_scale;
        }
        for (int il = 0; il < hp.n_layer; il++) {
            const LayerWeights& L = m.layers[il];
            rms_norm_to(x.data(), L.attn_norm, hp.norm_eps, n, E, cur.data());
            if (hp.mla) attention_mla(il, batch, n); else attention_gqa(il, batch, n);
            if (L.post_attn_norm) rms_norm(tmp.data(), L.post_attn_norm, hp.norm_eps, n, E);
            for (int64_t j = 0; j < n * E; j++) x[j] += tmp[j];

            rms_norm_to(x.data(), L.ffn_norm, hp.norm_eps, n, E, cur.data());
            if (L.gate_inp) ffn_moe(L, cur.data(), n, tmp.data());
            else ffn_dense(L.ffn_gate, L.ffn_up, L.ffn_down, cur.data(), n, tmp.data());
            if (L.post_ffn_norm) rms_norm(tmp.data(), L.post_ffn_norm, hp.norm_eps, n, E);
            for (int64_t j = 0; j < n * E; j++) x[j] += tmp[j];
        }
        for (int i = 0; i < n; i++) kv.seq_len[batch.seq[i]] = batch.pos[i] + 1;

        // Output: only the rows that asked for logits.
        n_logits = 0;
        for (int i = 0; i < n; i++) {
            if (!batch.want_logits[i]) continue;
            std::copy(x.begin() + i * E, x.begin() + (i + 1) * E, x.begin() + n_logits * E);
            n_logits++;
        }
        if (n_logits == 0) return;
        rms_norm_to(x.data(), m.output_norm, hp.norm_eps, n_logits, E, cur.data());
        logits.resize((size_t)n_logits * hp.n_vocab);
        matmul({{m.output, cur.data(), n_logits, logits.data()}});
    }
};

// Chooses the experts of one token: gating (softmax or sigmoid), optional selection bias, optional
// group-limited selection (keep the groups whose two best experts score highest), top-k, then the
// chosen experts' gate probabilities, optionally renormalized and scaled.
void moe_route(const HParams& hp, const float* logits, const float* selection_bias, int32_t* experts, float* weights) {
    const int X = hp.n_expert, K = hp.n_expert_used;
    std::vector<float> probs(X), select(X);
    if (hp.expert_gating == ExpertGating::Softmax) {
        const float mx = *std::max_element(logits, logits + X);
        double sum = 0;
        for (int e = 0; e < X; e++) sum += (probs[e] = std::exp(logits[e] - mx));
        for (int e = 0; e < X; e++) probs[e] = (float)(probs[e] / sum);
    } else {
        for (int e = 0; e < X; e++) probs[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    }
    for (int e = 0; e < X; e++) select[e] = probs[e] + (selection_bias ? selection_bias[e] : 0.0f);
    if (hp.n_expert_groups > 1) {
        const int G = hp.n_expert_groups, per = X / G;
        std::vector<std::pair<float, int>> group_score(G);
        for (int g = 0; g < G; g++) {
            std::vector<float> v(select.begin() + g * per, select.begin() + (g + 1) * per);
            std::partial_sort(v.begin(), v.begin() + std::min(2, per), v.end(), std::greater<float>());
            group_score[g] = {v[0] + (per > 1 ? v[1] : 0.0f), g};
        }
        std::partial_sort(group_score.begin(), group_score.begin() + hp.n_group_used, group_score.end(),
                          [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
        std::vector<uint8_t> keep(G, 0);
        for (int g = 0; g < hp.n_group_used; g++) keep[group_score[g].second] = 1;
        for (int e = 0; e < X; e++) if (!keep[e / per]) select[e] = -INFINITY;
    }
    std::vector<int32_t> order(X);
    for (int e = 0; e < X; e++) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int a, int b) { return select[a] > select[b] || (select[a] == select[b] && a < b); });
    double sum = 0;
    for (int j = 0; j < K; j++) {
        experts[j] = order[j];
        weights[j] = probs[order[j]];
        sum += weights[j];
    }
    for (int j = 0; j < K; j++) {
        if (hp.expert_weights_norm) weights[j] = (float)(weights[j] / sum);
        weights[j] *= hp.expert_weights_scale;
    }
}

Context::Context(const Model& model, const ContextParams& params) {
    if (model.layers.empty()) fail("model was loaded without weights (vocab_only)");
    ContextParams p = params;
    if (p.n_threads <= 0) p.n_threads = physical_core_count();
    if (p.n_seq <= 0 || p.n_seq > 256) fail("number of sequences must be in 1..256");
    if (p.n_ctx <= 0) p.n_ctx = std::min(model.hp.n_ctx_train, 4096);
    if (p.n_ctx < p.n_seq) fail("context of %d cells cannot hold %d sequences", p.n_ctx, p.n_seq);
    impl_ = std::make_unique<Impl>(model, p);
    impl_->kv.init(model.hp, p, p.n_ctx);
}
Context::~Context() = default;
void Context::decode(const Batch& batch) { impl_->decode(batch); }
const float* Context::logits(int i) const {
    if (i < 0 || i >= impl_->n_logits) fail("no logits for output %d", i);
    return impl_->logits.data() + (size_t)i * impl_->model.hp.n_vocab;
}
int Context::n_logits() const { return impl_->n_logits; }
int Context::n_ctx() const { return impl_->kv.n_blocks * KVCache::kBlock; }
int Context::n_ctx_seq() const { return impl_->kv.seq_cap; }
int Context::n_cells_used() const { return impl_->kv.cells_used(); }
int Context::n_cells_free() const { return (int)impl_->kv.free_blocks.size() * KVCache::kBlock; }
int Context::kv_page_size() const { return KVCache::kBlock; }
int Context::n_seq() const { return impl_->kv.n_seq; }
int Context::seq_len(int seq) const { return impl_->kv.seq_len.at(seq); }
void Context::seq_truncate(int seq, int n) {
    if (seq < 0 || seq >= impl_->kv.n_seq) fail("sequence id %d out of range", seq);
    impl_->kv.truncate(seq, n);
}
std::vector<uint8_t> Context::seq_save(int seq, int n) const {
    KVCache& kv = impl_->kv;
    if (seq < 0 || seq >= kv.n_seq || n < 0 || n > kv.seq_len[seq]) fail("seq_save: no positions [0, %d) in sequence %d", n, seq);
    std::vector<uint8_t> blob(sizeof(int32_t) + kv.bytes_per_token() * n);
    memcpy(blob.data(), &n, sizeof(int32_t));
    uint8_t* p = blob.data() + sizeof(int32_t);
    for (int il = 0; il < kv.n_layer; il++) {
        for (int pos = 0; pos < n; pos++, p += kv.row_k) memcpy(p, kv.k_row(il, seq, pos), kv.row_k);
        for (int pos = 0; pos < n && kv.row_v; pos++, p += kv.row_v) memcpy(p, kv.v_row(il, seq, pos), kv.row_v);
    }
    return blob;
}
void Context::seq_restore(int seq, const std::vector<uint8_t>& blob) {
    KVCache& kv = impl_->kv;
    int32_t n = -1;
    if (blob.size() >= sizeof n) memcpy(&n, blob.data(), sizeof n);
    if (seq < 0 || seq >= kv.n_seq || n < 0 || n > kv.seq_cap || blob.size() != sizeof n + kv.bytes_per_token() * n) {
        fail("seq_restore: blob does not fit sequence %d of this context", seq);
    }
    kv.truncate(seq, 0);
    if (KVCache::blocks_for(n) > (int)kv.free_blocks.size()) fail("seq_restore: KV cache is full");
    kv.reserve(seq, n);
    const uint8_t* p = blob.data() + sizeof n;
    for (int il = 0; il < kv.n_layer; il++) {
        for (int pos = 0; pos < n; pos++, p += kv.row_k) memcpy(kv.k_row(il, seq, pos), p, kv.row_k);
        for (int pos = 0; pos < n && kv.row_v; pos++, p += kv.row_v) memcpy(kv.v_row(il, seq, pos), p, kv.row_v);
    }
    kv.seq_len[seq] = n;
}
void Context::seq_copy(int src, int dst, int n) {
    if (src != dst) seq_restore(dst, seq_save(src, n));
}
size_t Context::kv_bytes() const { return impl_->kv.bytes(); }
size_t Context::kv_bytes_per_token() const { return impl_->kv.bytes_per_token(); }
int Context::n_threads() const { return impl_->pool.size(); }
const Model& Context::model() const { return impl_->model; }

// Memory planning -----------------------------------------------------------------------------

size_t kv_bytes_per_token(const HParams& hp, Type type_k, Type type_v) {
    const size_t k = row_bytes(type_k, hp.n_embd_k_gqa());
    const size_t v = hp.mla ? 0 : row_bytes(type_v, hp.n_embd_v_gqa());
    return (k + v) * hp.n_layer;
}

size_t memory_available() {
    size_t avail = 0;
    if (FILE* f = fopen("/proc/meminfo", "r")) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (size_t)kb * 1024;
        }
        fclose(f);
    }
    // In a container the cgroup limit is what counts (v2: memory.max, v1: memory.limit_in_bytes).
    for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
        if (FILE* f = fopen(path, "r")) {
            unsigned long long limit;
            if (fscanf(f, "%llu", &limit) == 1 && limit > 0 && limit < (1ull << 60)) avail = avail ? std::min(avail, (size_t)limit) : (size_t)limit;
            fclose(f);
        }
    }
    return avail;
}

MemoryPlan plan_memory(const Model& model, int n_ctx_slot, int n_slots, Type type_k, Type type_v, int n_batch) {
    const HParams& hp = model.hp;
    if (n_ctx_slot <= 0 || n_slots <= 0 || n_batch <= 0) fail("plan: context, slots and batch must be positive");
    MemoryPlan p;
    p.weight_bytes = model.weight_bytes();
    p.kv_bytes_per_token = kv_bytes_per_token(hp, type_k, type_v);
    p.kv_bytes_per_slot = p.kv_bytes_per_token * (size_t)n_ctx_slot;
    p.kv_bytes_total = p.kv_bytes_per_slot * (size_t)n_slots;
    // Scratch of one forward pass of n_batch tokens (the buffers of Context::Impl): residual stream
    // and norms, q/k/v and attention output, the FFN (dense or the routed experts' rows), one
    // sequence's V dequantized for attention, converted activations, and one row of logits.
    const size_t B = (size_t)n_batch, f = sizeof(float);
    const size_t ffn = hp.n_expert ? (size_t)hp.n_expert_used * std::max(hp.n_ff_exp, hp.n_ff) : (size_t)hp.n_ff;
    size_t c = B * hp.n_embd * 3 * f;
    c += B * ((size_t)hp.n_head * (hp.head_dim_k + hp.head_dim_v) + 2 * (size_t)hp.n_embd_k_gqa()) * f;
    c += B * ffn * 3 * f + (hp.n_expert ? B * hp.n_expert_used * (size_t)hp.n_embd * 2 * f : 0);
    c += (size_t)n_ctx_slot * std::max(hp.n_embd_v_gqa(), hp.head_dim_v) * f;
    c += B * std::max<size_t>(hp.n_embd, ffn) * 2;
    c += (size_t)hp.n_vocab * f * 2;
    p.compute_bytes = c;
    p.total_bytes = p.weight_bytes + p.kv_bytes_total + p.compute_bytes;
    p.mem_available = memory_available();
    p.fits = p.mem_available == 0 || p.total_bytes <= p.mem_available;
    return p;
}

// ============================================================================================
// 11. Sampling
// ============================================================================================
// The order follows llama.cpp's default chain: penalties, top-k, top-p, min-p, temperature, draw.

Sampler::Sampler(const SamplerParams& p) : p_(p) { reset(); }

void Sampler::reset() {
    history_.clear();
    rng_.seed(p_.seed == 0xFFFFFFFF ? std::random_device{}() : p_.seed);
}

void Sampler::accept(int32_t token) {
    history_.push_back(token);
    if (history_.size() > 4096) history_.erase(history_.begin(), history_.begin() + 2048);
}

int32_t Sampler::sample(const float* logits, int n_vocab) {
    struct Cand { int32_t id; float logit; };
    std::vector<Cand> c(n_vocab);
    for (int i = 0; i < n_vocab; i++) c[i] = {i, logits[i]};
    // Penalties over the last penalty_last_n accepted tokens.
    size_t window = p_.penalty_last_n < 0 ? history_.size() : std::min(history_.size(), (size_t)p_.penalty_last_n);
    if (window > 0 && (p_.repeat_penalty != 1.0f || p_.frequency_penalty != 0.0f || p_.presence_penalty != 0.0f)) {
        std::unordered_map<int32_t, int> count;
        for (size_t i = history_.size() - window; i < history_.size(); i++) count[history_[i]]++;
        for (auto [id, cnt] : count) {
            if (id < 0 || id >= n_vocab) continue;
            float& l = c[id].logit;
            l = l <= 0 ? l * p_.repeat_penalty : l / p_.repeat_penalty;
            l -= cnt * p_.frequency_penalty + p_.presence_penalty;
        }
    }
    auto by_logit = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
    if (p_.temperature <= 0) return std::min_element(c.begin(), c.end(), by_logit)->id;
    size_t keep = c.size();
    if (p_.top_k > 0 && (size_t)p_.top_k < keep) keep = p_.top_k;
    std::partial_sort(c.begin(), c.begin() + keep, c.end(), by_logit);
    c.resize(keep);
    // Probabilities (before temperature, as llama.cpp's top-p and min-p see them).
    std::vector<double> prob(c.size());
    double sum = 0;
    for (size_t i = 0; i < c.size(); i++) sum += (prob[i] = std::exp((double)c[i].logit - c[0].logit));
    if (p_.top_p < 1.0f) {
        double acc = 0;
        size_t i = 0;
        for (; i < c.size(); i++) {
            acc += prob[i] / sum;
            if (acc >= p_.top_p) { i++; break; }
        }
        c.resize(std::max<size_t>(1, std::min(i, c.size())));
    }
    if (p_.min_p > 0) {
        size_t i = 1;
        while (i < c.size() && prob[i] >= p_.min_p * prob[0]) i++;
        c.resize(i);
    }
    std::vector<double> w(c.size());
    for (size_t i = 0; i < c.size(); i++) w[i] = std::exp(((double)c[i].logit - c[0].logit) / p_.temperature);
    std::discrete_distribution<size_t> dist(w.begin(), w.end());
    return c[dist(rng_)].id;
}

std::vector<std::pair<int32_t, float>> Sampler::top_probs(const float* logits, int n_vocab, int n) const {
    std::vector<int32_t> ids(n_vocab);
    for (int i = 0; i < n_vocab; i++) ids[i] = i;
    n = std::max(0, std::min(n, n_vocab));
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    float mx = logits[ids[0]];
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += std::exp((double)logits[i] - mx);
    std::vector<std::pair<int32_t, float>> out;
    for (int i = 0; i < n; i++) out.emplace_back(ids[i], (float)(std::exp((double)logits[ids[i]] - mx) / sum));
    return out;
}

#include "wip/eval.inc"

} // namespace llm
#endif // LLM_IMPLEMENTATION
