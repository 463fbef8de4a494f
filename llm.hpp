// llm.hpp - a single-header inference engine for GGUF language models.
//
// Use: in exactly one translation unit
//     #define LLM_IMPLEMENTATION
//     #include "llm.hpp"
// and include it plainly everywhere else. Depends on the C++17 standard library only.
//
// Table of contents
//   1. Public API            errors, tensor types, GGUF reader, quantized rows, quantizer, vocabulary,
//                            chat templates, model (and its -ngl placement), pooling, context (KV cache,
//                            batches with an attention mask, embeddings), offload backends (the GPU seam),
//                            sampler and GBNF grammar, speculative decoding (drafts), evaluation,
//                            memory planning
//   -- implementation (LLM_IMPLEMENTATION) --
//   2. Utilities             errors, half/bfloat conversions, timing
//   3. Block layouts         ggml's quantized blocks, byte for byte, the type table, interleaved groups
//   4. GGUF reader           mmap, bounds-checked parser, split files, metadata access
//   5. Quantized rows        dequantization, activation/KV quantization, scalar dot products
//   6. SIMD kernels          run-time dispatch (cpuid + XCR0, $LLM_ISA), AVX2 / AVX-VNNI / AVX-512 tiles,
//                            16-row interleaved weights and their AVX-512 VNNI, AVX-VNNI and AVX2 kernels,
//                            BF16 weights' vdpbf16ps tiles, AMX tile products for prefill (6x, INT8 and
//                            BF16, arch_prctl-granted), attention scores and weighted sums
//   7. Weight quantizers     K-quants and IQ4_NL as llama-quantize writes them
//   8. GGUF writer           streamed v3 output; its temp file removed on errors, on signals
//                            (remove_unfinished_outputs) and, for dead processes, by the next writer
//   9. Model quantizer       per-tensor type choice of each mix, the streaming driver
//  10. Tokenizer             unicode tables, SentencePiece, byte-level BPE with pre-tokenizers, WordPiece,
//                            specials
//  11. Chat templates        the JSON reader (the schema converter's too); Jinja interpreter (values
//                            and JSON, lexer, parser, evaluation, builtins)
//                            with transformers' apply_chat_template semantics; tool-call and
//                            reasoning parsers of generated text; family renderers (fallback)
//  12. Thread pool           persistent workers, parallel-for (a draft model shares its target's)
//  13. Model                 hyperparameters from metadata (read_hparams, shared with the quantizer),
//                            tensor binding per architecture, layer placement (offload driver),
//                            load-time repacking of the CPU's matmul weights
//  14. KV cache              paged cells in f32/f16/q8_0/q4_0/iq4_nl (quantized rows Hadamard-rotated,
//                            kv_rotation), per-sequence or unified; chunks moved to earlier positions,
//                            keys re-rotated (seq_move, in 15)
//  15. Forward pass          ops (norms, Hadamard, gather/scatter, activations), batched matmuls,
//                            GQA and MLA attention, dense and MoE FFN, one path for prefill and decode;
//                            the device layers' hand-off to an offload backend; the bert encoder,
//                            embeddings and pooling (mean/cls/last/rank head)
//  16. Memory planning       KV bytes per token, the --plan calculator
//  17. Sampling              llama.cpp's chain (logit bias, penalties, DRY, top-n-sigma, top-k, typical,
//                            top-p, min-p, XTC, (dynamic) temperature, mirostat), GBNF grammars
//                            (lazy ones started by a trigger word, for tool calls), JSON schemas as
//                            grammars (integer ranges, regex patterns, excluded keys)
//  18. Evaluation            perplexity and KL divergence
//  19. Speculative decoding  prompt lookup (n-gram drafts), the draft model and its vocabulary check,
//                            the cost model that sizes drafts (DraftCost)
#ifndef LLM_HPP
#define LLM_HPP

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
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
// An offload device ran out of memory: the request that needed it fails (llama-server answers 503), the
// context and the device stay usable.
struct DeviceMemoryError : Error {
    using Error::Error;
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

// Rows of a shape: every dimension but the first. A zero dimension is legal, so a row count is never
// nelements / ne[0]; the parser bounds the product of the non-zero dimensions, so this cannot overflow.
inline int64_t shape_rows(const int64_t ne[4]) { return ne[1] * ne[2] * ne[3]; }

struct TensorInfo {
    std::string name;
    Type type = Type::F32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous (row) dimension
    uint64_t offset = 0;           // relative to its file's data section
    int file_index = 0;            // which split part holds it
    const uint8_t* data = nullptr; // mapped bytes
    size_t nbytes = 0;
    bool interleaved = false;      // repacked at load, 16 rows at a time (see interleave_rows16)
    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return shape_rows(ne); }
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

// ---- Quantized rows and dot products (public so tests and tools can use them) --------------

// Row conversions; n must be a multiple of the type's block size. dequantize_row handles every
// supported type; quantize_row handles F32/F16/BF16, Q8_0/Q8_1/Q8_K, Q4_0/Q4_1/Q5_0/Q5_1, IQ4_NL
// (ggml's reference quantizers, bit-exact) and forwards K-quants to quantize_row_kquant.
void dequantize_row(Type t, const void* src, float* dst, int64_t n);
void quantize_row(Type t, const float* src, void* dst, int64_t n);
// Q8_0 with the reference rounding model files use (quantize_row uses ggml's run-time rounding).
void quantize_row_q8_0_reference(const float* src, void* dst, int64_t n);

// The type activations are converted to before a dot product with a weight of type `weight`.
Type vec_dot_type(Type weight);

// x: n values of type `weight`; y: n values of vec_dot_type(weight).
float vec_dot(Type weight, int64_t n, const void* x, const void* y);

// What the tile kernels read of an activation matrix besides its quants: the q8_0/q8_1 blocks'
// scales as floats (q8_1: then the s values; `stride` floats per column) and, when asked for, each
// q8_0 block's sum of quants (the interleaved types stored with an offset subtract it). A caller that
// runs several row ranges over the same activations computes it once and passes it along.
struct ActInfo {
    std::vector<float> scales;
    int64_t stride = 0;
    std::vector<int32_t> sums;
};
void act_info(Type act_type, const uint8_t* act, size_t act_row_bytes, int64_t n_act, int64_t k, bool with_sums, ActInfo& out);

// out[j*ld_out + i] = vec_dot(wt, k, W + i*w_row_bytes, act + j*act_row_bytes)
// for rows i in [r0, r1) and activation columns j in [0, n_act). The caller splits rows across
// threads; info: act_info of the activations, or nullptr to compute it here.
void matmul_rows(Type wt, const uint8_t* W, size_t w_row_bytes, int64_t k, int64_t r0, int64_t r1,
                 const uint8_t* act, size_t act_row_bytes, int64_t n_act, float* out, int64_t ld_out,
                 const ActInfo* info = nullptr);

// SIMD level used by vec_dot / matmul_rows, chosen once from cpuid + XCR0. AVXVNNI: the AVX2 kernels
// with AVX-VNNI's 256-bit vpdpbusd (Alder Lake and newer, Zen 5); not below AVX512 in the sense of a
// subset (most AVX-512 CPUs lack AVX-VNNI), hence isa_supported.
enum class Isa { Scalar = 0, AVX2 = 1, AVX512 = 2, AVXVNNI = 3 };
Isa isa_best();                  // the best instruction set this CPU and OS support (AVX-512 VNNI > AVX-VNNI > AVX-512 > AVX2)
bool isa_supported(Isa isa);     // by this CPU and OS
Isa isa_current();               // the one in use (initially isa_best(), or $LLM_ISA: scalar|avx2|avxvnni|avx512|amx)
void isa_set(Isa isa);           // force one (tests, benchmarks); throws Error if unsupported
std::string isa_name(Isa isa);   // avx512: "avx512-vnni+amx" while amx_enabled()
// AMX tile products for prefill, on top of AVX-512 VNNI (Sapphire Rapids and newer): on by default
// where available; $LLM_ISA=avx512 turns them off, $LLM_ISA=amx asks for them explicitly.
bool amx_available();            // CPU (cpuid, XCR0) and OS (arch_prctl grants the tile state)
bool amx_enabled();              // in use: available, not turned off, and the ISA in use is AVX-512 VNNI
void amx_set(bool on);           // tests, benchmarks; throws Error when turning on what is unavailable

// Interleaved weights: matmul weights repacked at load for the interleaved kernels. Each group of 16
// rows is stored so that one 512-bit register holds four consecutive values of each of the 16 rows,
// the operand of vpdpbusd against four broadcast activation bytes, so a row group is multiplied by a
// column without any horizontal sums; on AVX2 (and AVX-512 without VNNI) each half of such a line is
// a 256-bit register of 8 rows for vpmaddubsw, with bit-identical results. A group keeps exactly the bytes of its 16 rows (tensor sizes
// and expert offsets do not change), and the repacking is lossless (deinterleave gives the file's
// bytes back). Types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL.
constexpr int kInterleaveRows = 16;
bool interleave_supported(Type t, int64_t k, int64_t rows);  // this type and shape, on this CPU and ISA
void interleave_rows16(Type t, const uint8_t* src, uint8_t* dst, int64_t k, int64_t rows);
void deinterleave_rows16(Type t, const uint8_t* src, uint8_t* dst, int64_t k, int64_t rows);
// dequantize_row of row `row` of interleaved weights (a tied token embedding's lookups).
void dequantize_interleaved_row(Type t, const uint8_t* W, int64_t k, int64_t row, float* dst);
// matmul_rows for interleaved weights; r0 and r1 are multiples of 16; info (if given) with the sums
// when interleave_needs_sums(wt).
bool interleave_needs_sums(Type t);
void matmul_rows_interleaved(Type wt, const uint8_t* W, int64_t k, int64_t r0, int64_t r1, const uint8_t* act,
                             size_t act_row_bytes, int64_t n_act, float* out, int64_t ld_out, const ActInfo* info = nullptr);
// ---- Quantizer ----------------------------------------------------------------------------
// Model quantization as llama-quantize does it (no importance matrix): the same per-tensor type choice for
// each file type ("mix") and bit-identical quantized data.

// llama.cpp's file types (LLAMA_FTYPE_MOSTLY_*), numbered as in general.file_type.
enum class FileType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 7, Q5_0 = 8, Q5_1 = 9, Q2_K = 10,
    Q3_K_S = 11, Q3_K_M = 12, Q3_K_L = 13, Q4_K_S = 14, Q4_K_M = 15, Q5_K_S = 16, Q5_K_M = 17, Q6_K = 18,
    IQ4_NL = 25, BF16 = 32,
};
// Accepts the names llama-quantize accepts (case-insensitive, "Q4_K" = Q4_K_M, "Q3_K" = Q3_K_M, "Q5_K" =
// Q5_K_M) and the numeric ids; throws Error for anything else.
FileType file_type_from_name(const std::string& name);
const char* file_type_name(FileType ft);
Type file_type_default(FileType ft);  // the type most tensors get

struct QuantizeOptions {
    FileType ftype = FileType::Q8_0;
    int n_threads = 0;                 // 0: all hardware threads
    bool pure = false;                 // every quantizable tensor gets the default type (--pure)
    bool allow_requantize = false;     // accept already-quantized input tensors
    bool leave_output_tensor = false;  // keep output.weight as it is
    bool dry_run = false;              // plan and report sizes, write nothing
    bool has_output_tensor_type = false;
    Type output_tensor_type = Type::F16;
    bool has_token_embedding_type = false;
    Type token_embedding_type = Type::F16;
    bool verbose = true;               // progress and summary on stderr
};

// One tensor of the output, in output order (the reference's: non-layer tensors by name, then by layer).
struct QuantizePlanEntry {
    const TensorInfo* src = nullptr;
    Type type = Type::F32;  // type in the output
    size_t nbytes = 0;      // its size in the output
};

struct QuantizeResult {
    std::vector<QuantizePlanEntry> plan;
    size_t bytes_in = 0, bytes_out = 0;  // tensor data only
    int64_t n_elements = 0;
    int n_fallback = 0;                  // tensors whose row length forced another type
    double seconds = 0;
};

// The per-tensor type choice alone (llama_tensor_get_type and its fallbacks). Throws Error for a tensor
// that cannot be quantized as asked.
QuantizeResult quantize_plan(const GGUF& in, const QuantizeOptions& opt);

// Quantizes in_path to out_path (written to a temporary file renamed at the end: no partial output is left
// behind on error). Validates the hyperparameters as Model::load does first; removes the OUT.tmp.PID files
// of processes that no longer exist. Throws Error.
QuantizeResult quantize_model(const std::string& in_path, const std::string& out_path, const QuantizeOptions& opt);

// Deletes the temporary file of every GGUF output being written right now. Async-signal-safe: call it from
// a SIGTERM/SIGINT/SIGHUP handler, then let the signal kill the process (see quantize.cpp).
void remove_unfinished_outputs();

// Quantizes n values (n a multiple of 256) to Q2_K..Q6_K, bit-exact with ggml's reference quantizers.
void quantize_row_kquant(Type t, const float* src, void* dst, int64_t n);
// One row of model weights exactly as llama-quantize writes it without an importance matrix: K-quants
// as above, IQ4_NL with ggml's scale search (quantize_iq4_nl, not the _ref used for the KV cache), the
// other types through quantize_row.
void quantize_row_weights(Type t, const float* src, void* dst, int64_t n);

// ---- Vocabulary and tokenizer --------------------------------------------------------------
// Token attributes, bit flags (as llama.cpp's llama_token_attr). GGUF stores a token *type* per
// token (tokenizer.ggml.token_type); the vocabulary turns it into these and adds a few by name.
enum TokenAttr : uint32_t {
    TOKEN_ATTR_UNDEFINED = 0,
    TOKEN_ATTR_UNKNOWN = 1u << 0,
    TOKEN_ATTR_UNUSED = 1u << 1,
    TOKEN_ATTR_NORMAL = 1u << 2,
    TOKEN_ATTR_CONTROL = 1u << 3,       // <s>, <|im_end|>: never produced from plain text
    TOKEN_ATTR_USER_DEFINED = 1u << 4,  // added tokens: always split out of the text first
    TOKEN_ATTR_BYTE = 1u << 5,          // <0x0A> byte-fallback tokens
    TOKEN_ATTR_LSTRIP = 1u << 7,        // eat whitespace before the token when parsing specials
    TOKEN_ATTR_RSTRIP = 1u << 8,        // eat whitespace after it
};

struct VocabData;  // implementation detail

// The tokenizer of a model, read from its tokenizer.ggml.* metadata. Supports SentencePiece-style
// ("llama": Llama 2, Phi-3, Gemma, Baichuan, ...) and byte-level BPE ("gpt2": GPT-2, Llama 3, Qwen2,
// SmolLM, StarCoder, Falcon, MPT, DeepSeek, ...) with the pre-tokenizer named by tokenizer.ggml.pre,
// token for token identical to llama.cpp. A default-constructed Vocab, or one from a file whose
// tokenizer.ggml.model is "no_vocab", has no tokenizer (tokenize throws; n_tokens may still be set).
// Immutable after construction, so one Vocab may be used from several threads; copies are cheap.
class Vocab {
public:
    Vocab() = default;
    explicit Vocab(const GGUF& gguf);  // throws Error on missing or inconsistent metadata

    // add_special: add BOS / EOS as the model asks (add_bos() / add_eos()).
    // parse_special: text that spells a control token ("<|im_end|>") becomes that token; otherwise it
    // is tokenized as plain text. User-defined tokens are always matched, as in llama.cpp.
    std::vector<int32_t> tokenize(const std::string& text, bool add_special, bool parse_special) const;
    // The bytes a token stands for (may be part of a UTF-8 sequence). Control / unknown tokens give
    // their text when special is true and "" otherwise.
    std::string token_to_piece(int32_t id, bool special = true) const;
    // Concatenated pieces, with the tokenizer's cleanups (SentencePiece leading space removed, BPE
    // " ," / " 's" spacing cleaned where the model asks). special: render control tokens.
    std::string detokenize(const std::vector<int32_t>& ids, bool special = false) const;

    int32_t n_tokens() const;
    int32_t bos() const;  // -1 if none
    int32_t eos() const;
    int32_t eot() const;
    int32_t eom() const;
    int32_t unk() const;
    int32_t pad() const;
    int32_t sep() const;
    // Fill-in-the-middle tokens (tokenizer.ggml.fim_*_token_id, or recognized by their text): prefix,
    // suffix, middle, pad, repository name, file separator; -1 if none.
    int32_t fim_pre() const;
    int32_t fim_suf() const;
    int32_t fim_mid() const;
    int32_t fim_pad() const;
    int32_t fim_rep() const;
    int32_t fim_sep() const;
    bool add_bos() const;
    bool add_eos() const;
    bool add_sep() const;  // WordPiece: [SEP] closes the text
    bool add_space_prefix() const;
    bool clean_spaces() const;  // detokenize removes the space in " ," " ." " 's" ... (most BPE models)
    bool is_eog(int32_t id) const;  // end of generation: eos, eot, <|im_end|>, <end_of_turn>, ...
    const std::vector<int32_t>& eog_ids() const;  // sorted
    bool is_control(int32_t id) const;
    uint32_t token_attr(int32_t id) const;  // TokenAttr bits; 0 for an id out of range
    const std::string& token_text(int32_t id) const;  // as stored (Ġ/▁ forms); "" if out of range
    float token_score(int32_t id) const;
    int32_t find_token(const std::string& text) const;  // id of the token with exactly this text, or -1

    const std::string& model_type() const;  // tokenizer.ggml.model: "llama", "gpt2", "no_vocab", ...
    const std::string& pre_type() const;    // tokenizer.ggml.pre as used ("default" when absent)
    bool has_tokenizer() const;

private:
    std::shared_ptr<const VocabData> d_;
};

// ---- Chat templates ------------------------------------------------------------------------
// A model's `tokenizer.chat_template` is a Jinja program, rendered as is by JinjaTemplate (below).
// For files without a template (or to force one), the common families are also recognized from
// distinctive substrings and rendered by hand-written code that
// produces byte for byte what Hugging Face's apply_chat_template (Jinja2, trim_blocks, lstrip_blocks)
// produces for plain text system/user/assistant turns (plus simple `tool` turns where the family
// has them). Errors the template itself raises (e.g. Gemma 2 rejecting the system role) are thrown
// as llm::Error carrying the template's own message, unless ChatOptions::fold_system asks for
// llama-server's fallback.

struct ChatMessage {
    std::string role;     // "system", "user", "assistant", "tool"
    std::string content;
};

enum class ChatFamily {
    Unknown,
    ChatML,          // <|im_start|>role\n...<|im_end|>\n, no default system (OpenHermes, many fine-tunes)
    Qwen2,           // ChatML + default system "You are a helpful assistant."
    Qwen25,          // ChatML + default system "You are Qwen, created by Alibaba Cloud. ..."
    Qwen3,           // ChatML, <think> handling for assistant turns after the last user query
    SmolLM2,         // ChatML + default system "You are a helpful AI assistant named SmolLM, ..."
    SmolLM3,         // ChatML with the "## Metadata" system block and /think, /no_think
    Llama3,          // Llama 3.0: header per turn, no date block
    Llama31,         // Llama 3.1 / 3.3: "Cutting Knowledge Date" block, date fixed to "26 Jul 2024"
    Llama32,         // Llama 3.2: same block with today's date (ChatOptions::date_string)
    Gemma2,          // Gemma 1/2: no system role (raises, or folds with fold_system)
    Gemma3,          // Gemma 3: system folded into the first user turn by the template itself
    DeepSeekR1,      // R1 / R1-Distill: generation prompt "<｜Assistant｜><think>\n"
    DeepSeekR1Switch,// R1-Distill variant whose prompt closes </think> unless enable_thinking is true
    DeepSeekV3,      // V3 (0324): "<｜User｜>...<｜Assistant｜>"
    DeepSeekV31,     // V3.1: "<think></think>" after each user turn unless thinking
    DeepSeekCoder,   // deepseek-coder-instruct: "### Instruction:" / "### Response:"
    MistralNemo,     // Mistral Nemo (v3-tekken): [INST]...[/INST], system joined into the last user turn
    Phi3,            // Phi-3 / 3.5: <|user|>\n...<|end|>\n
};

struct ChatOptions {
    bool add_generation_prompt = true;
    std::string bos_token, eos_token;  // as the template receives them (from the vocabulary)
    std::string date_string;           // today's date as strftime("%d %b %Y"), e.g. "29 Nov 2026";
                                       // only Llama 3.2 prints it ("" -> the template's "26 Jul 2024")
    int enable_thinking = -1;          // chat_template_kwargs.enable_thinking: -1 undefined (the
                                       // template's own default), 0 false, 1 true
    bool fold_system = false;          // families without a system role (Gemma 2): instead of throwing,
                                       // fold system text into the next user turn like llama-server
                                       // (joined with "\n"; a system turn not followed by a user turn
                                       // becomes a user turn of its own)
};

std::string chat_family_name(ChatFamily f);                     // canonical name, "unknown" for Unknown
ChatFamily chat_detect_family(const std::string& jinja_template); // Unknown if not recognized
ChatFamily chat_family_from_name(const std::string& name);      // "chatml", "llama3.2", ...; throws Error
std::vector<std::string> chat_family_names();                   // canonical names, for --help

// Renders the prompt; throws Error where the real template raises, and for an empty conversation.
std::string chat_render(ChatFamily f, const std::vector<ChatMessage>& msgs, const ChatOptions& opt);
std::string chat_render(ChatFamily f, const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                        const std::string& bos_token, const std::string& eos_token,
                        const std::string& date_string);

// ---- Jinja chat templates ------------------------------------------------------------------
// A Jinja interpreter with Hugging Face transformers' apply_chat_template semantics: Jinja2's
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop controls, transformers'
// tojson (json.dumps: ensure_ascii, indent, separators, sort_keys), raise_exception, strftime_now
// and the {% generation %} tag. Values keep Python's semantics (a dict prints as its repr, none as
// None). The limits bound what a hostile template in a GGUF can cost: each failure, the template's
// own raise_exception included, is an llm::Error raised in bounded time.
struct JinjaLimits {
    size_t max_output = 8u << 20;          // bytes of rendered text, and of any one string value
    uint64_t max_steps = 1'000'000;        // statements, loop iterations, calls, filters and tests run
    uint64_t max_work_bytes = 256u << 20;  // bytes of strings built, in total
    int max_call_depth = 100;              // macro calls nested in each other
};

class JinjaTemplate {
public:
    explicit JinjaTemplate(const std::string& source);  // parses; a syntax error throws Error("template line N: ...")

    // Renders with the members of a JSON object as the variables. `now` is the time strftime_now
    // formats, as Unix seconds shown in UTC; -1 reads the clock (local time, as transformers does).
    std::string render(const std::string& variables_json, int64_t now = -1, const JinjaLimits& limits = {}) const;

    struct Program;

private:
    std::shared_ptr<const Program> program_;
    friend std::string chat_apply_template(const JinjaTemplate&, const std::string&, int64_t, const JinjaLimits&);
};

// transformers' apply_chat_template(tokenize=False) for a request given as JSON text:
// {"messages", "tools", "add_generation_prompt", "chat_template_kwargs", "bos_token", "eos_token"}
// (all but "messages" optional). Messages are preprocessed as transformers does (null members
// dropped; reasoning_content / thinking / reasoning given as both `thinking` and
// `reasoning_content`); the template sees messages, tools (none if absent), documents (none),
// add_generation_prompt, bos_token, eos_token and each chat_template_kwargs member.
std::string chat_apply_template(const JinjaTemplate& tpl, const std::string& request_json, int64_t now = -1,
                                const JinjaLimits& limits = {});

// ---- Tool calls and reasoning in generated text ----------------------------------------------
// Splits a model's output into content, reasoning_content and OpenAI-style tool calls, for the
// tool-call syntax of each family. Streaming: ChatOutputParser takes the text as it is generated and
// returns what became certain since the last call; text that may still turn into a tool-call or
// reasoning marker is held back until it is decided.
enum class ToolCallFormat {
    None,            // no tool calls: everything is content
    Hermes,          // <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes 2 Pro, Qwen 2.5/3)
    Llama3,          // {"name": ..., "parameters": {...}} alone, or <|python_tag|> (Llama 3.1-3.3)
    Mistral,         // [TOOL_CALLS][{"name", "arguments", "id"}] or [TOOL_CALLS]name[ARGS]{...}
    DeepSeek,        // <｜tool▁call▁begin｜>[function<｜tool▁sep｜>]name...<｜tool▁call▁end｜> (R1, V3, V3.1)
    FunctionaryV31,  // <function=name>{...}</function>, <|python_tag|>code (Functionary v3.1)
    FunctionaryV32,  // >>>name\n{...} or >>>all\ntext (Functionary v3.2; the prompt opens the first >>>)
    CommandR7B,      // <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|>
    GptOss,          // harmony: <|channel|>commentary to=functions.name ... <|message|>{...}<|call|>
    KimiK2,          // <|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}<|tool_call_end|>
    Glm,             // <tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value></tool_call> (GLM 4.5/4.6)
    Qwen3Coder,      // <tool_call><function=name><parameter=k>v</parameter></function></tool_call>
};

const char* tool_call_format_name(ToolCallFormat f);
ToolCallFormat tool_call_format_from_name(const std::string& name);  // throws Error
ToolCallFormat chat_detect_tool_call_format(const std::string& jinja_template);

struct ChatToolCall {
    std::string id;         // as the model wrote it (Mistral, Kimi, Command R7B), else ""
    std::string name;
    std::string arguments;  // JSON text, as generated (parameters of XML formats built into an object)
};

struct ChatParsed {
    std::string content, reasoning_content;
    std::vector<ChatToolCall> tool_calls;
};

// One step of a tool call in a stream, OpenAI's delta shape: the first delta of a call carries its
// id and name, later ones pieces of the arguments.
struct ChatToolCallDelta {
    size_t index = 0;
    bool first = false;     // id and name are set
    std::string id, name, arguments;
};
struct ChatDelta {
    std::string content, reasoning_content;
    std::vector<ChatToolCallDelta> tool_calls;
    bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
};

struct ChatParseOptions {
    ToolCallFormat format = ToolCallFormat::None;
    bool extract_reasoning = true;  // false (--reasoning-format none): thinking stays in content
    bool thinking_open = false;     // the prompt ended inside a thinking block (e.g. "<think>\n")
    // XML formats (Qwen3-Coder, GLM): each tool's parameters whose declared schema is a string keep
    // their text as a JSON string; other values are parsed as JSON (text that does not parse stays a
    // string), as llama.cpp's parser types them from the declared schema.
    std::map<std::string, std::vector<std::string>> string_parameters;
};

// Whole output at once (the final result of a non-streamed completion).
ChatParsed chat_parse_output(const std::string& text, const ChatParseOptions& opt);

class ChatOutputParser {
public:
    explicit ChatOutputParser(const ChatParseOptions& opt) : opt_(opt) {}
    ChatDelta push(const std::string& text);  // newly generated text; returns what is now certain
    ChatDelta finish();                       // end of generation: the rest, held back text included
    const ChatParsed& parsed() const { return sent_; }

private:
    ChatDelta advance(bool partial);
    ChatParseOptions opt_;
    std::string text_;
    ChatParsed sent_;
};

// The thinking block's tags a template writes ({"<think>", "</think>"} for most families; the end
// tag is what a reasoning budget forces), or {"", ""} if it has none.
std::pair<std::string, std::string> chat_thinking_tags(const std::string& jinja_template);
// Whether a rendered prompt ends inside an open thinking block (the template opened it).
bool chat_prompt_opens_thinking(const std::string& prompt);

// ---- Model ---------------------------------------------------------------------------------
enum class Arch { Llama, Qwen2, Qwen3, Gemma3, Qwen3Moe, Deepseek2, Bert };
const char* arch_name(Arch a);

// How the token embeddings of a sequence become one vector: llama.cpp's numbering, as GGUF stores it
// (ARCH.pooling_type). Rank runs the model's classification head on the first token (rerankers).
enum class Pooling { Unspecified = -1, None = 0, Mean = 1, Cls = 2, Last = 3, Rank = 4 };
const char* pooling_name(Pooling p);                  // "none", "mean", ...
Pooling pooling_from_name(const std::string& name);   // none|mean|cls|last|rank; throws Error

// Scales an embedding as llama-server's --embd-normalize: -1 none, 0 max-abs to the int16 range
// (x * 32760 / max|x|), 1 taxicab, 2 Euclidean, p > 2 the p-norm. An all-zero vector stays zero.
void embd_normalize(const float* in, float* out, int n, int norm);

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
    // Encoders (bert): bidirectional attention, no rotary embedding (learned positions), LayerNorm
    // (norm_eps is its epsilon), token types. pooling: the file's ARCH.pooling_type.
    bool causal = true, use_rope = true;
    int n_token_types = 0;
    Pooling pooling = Pooling::None;
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
    // Encoders (bert): output projection and FFN biases, and the post-norms (LayerNorm weight, bias).
    const TensorInfo *bo = nullptr, *ffn_up_b = nullptr, *ffn_down_b = nullptr;
    const TensorInfo *attn_out_norm = nullptr, *attn_out_norm_b = nullptr, *out_norm = nullptr, *out_norm_b = nullptr;
};

// Which layers run on an offload device, as llama.cpp's -ngl N places them: the last N repeating
// layers, and the output layer (final norm and logits) too when N > n_layer (-ngl 99: everything).
// Token embeddings stay on the CPU. The CPU repacks only the layers it runs.
struct Placement {
    int first_device_layer = 1 << 30;  // layers [first_device_layer, n_layer) run on the device
    bool output_on_device = false;
    int n_layer = 0;
    // Over several devices (-ts), llama.cpp's layer split: each device runs a consecutive range of the
    // device layers, the output runs on the last one. One slice per device that runs anything.
    struct Slice {
        int device = 0;                  // index in the driver's device list (OffloadDriver::list)
        int first_layer = 0, end_layer = 0;
        bool output = false;
        std::string describe() const {  // "layers 0-2", "layers 3-3 and the output", "the output"
            const std::string layers = "layers " + std::to_string(first_layer) + "-" + std::to_string(end_layer - 1);
            return end_layer > first_layer ? layers + (output ? " and the output" : "") : "the output";
        }
    };
    std::vector<Slice> slices;
    std::vector<float> split;            // per device used: the cumulative share (last 1), to re-place with
    std::vector<int> devices;            // another -ngl (the largest that fits)
    bool any() const { return first_device_layer < n_layer || output_on_device; }
    bool on_device(int il) const { return il >= first_device_layer; }
};
Placement offload_placement(int n_layer, int n_gpu_layers);  // n_gpu_layers < 0: all; device 0 only
// Over `devices` (driver indices) in proportion to `shares` (one per device; all 0: equal), as llama.cpp's
// -ts: the device layers and the output (as layer n_layer) each go to the device whose cumulative share
// first exceeds their fraction of the offloaded layers.
Placement offload_placement(int n_layer, int n_gpu_layers, const std::vector<int>& devices, const std::vector<float>& shares);
struct ModelOptions;
struct OffloadDevice;
// The placement -ngl, -ts, -sm, -mg and --device (in opt) give over the devices a driver found.
Placement place_on_devices(int n_layer, const ModelOptions& opt, const std::vector<OffloadDevice>& found);

struct ModelOptions {
    int n_gpu_layers = 0;        // -ngl: layers to offload (< 0: all); needs an offload driver (below)
    std::vector<float> tensor_split;   // -ts: each device's share of the offloaded layers (empty: by free memory)
    int main_gpu = 0;                  // -mg: the device used with split_layers off
    bool split_layers = true;          // -sm layer (off: -sm none, everything on main_gpu)
    std::vector<std::string> devices;  // --device: the devices' names to use (empty: all; {"none"}: none, never probed)
    bool use_mmap = true;
    bool mlock = false;
    bool vocab_only = false;     // tokenizer only: no architecture or tensors required
    bool metadata_only = false;  // tokenizer and hyperparameters, no tensors bound (for --plan)
    bool interleave = true;      // repack matmul weights for this CPU's fastest kernels (needs use_mmap)
};

// The file's hyperparameters (general.architecture and ARCH.* keys), validated: the one check Model::load
// and the quantizer share, so neither accepts a file the other rejects. Throws Error.
HParams read_hparams(const GGUF& g);

// Bytes on 64-byte cache lines, not value-initialized (pages are committed as they are first written:
// the repacked weights by the repacking, a KV cache's as tokens arrive). Why lines: see LineAllocator.
constexpr std::align_val_t kLineAlign{64};
struct LineFree {
    void operator()(uint8_t* p) const { ::operator delete[](p, kLineAlign); }
};
using LineBytes = std::unique_ptr<uint8_t[], LineFree>;
inline LineBytes line_bytes(size_t n) { return LineBytes(new (kLineAlign) uint8_t[n]); }

class Model {
public:
    static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& opt = {});
    std::unique_ptr<GGUF> gguf;
    std::string arch_str;        // general.architecture as written
    HParams hp;
    Vocab vocab;
    const TensorInfo *tok_embd = nullptr, *output_norm = nullptr, *output = nullptr, *rope_freqs = nullptr;
    // Encoders: learned positions, token types, the embeddings' LayerNorm; the classification head of
    // rerankers (cls: dense + tanh, cls_out: the scores), either may be absent.
    const TensorInfo *pos_embd = nullptr, *tok_types = nullptr, *tok_norm = nullptr, *tok_norm_b = nullptr;
    const TensorInfo *cls = nullptr, *cls_b = nullptr, *cls_out = nullptr, *cls_out_b = nullptr;
    std::vector<LayerWeights> layers;
    Placement placement;         // none unless ModelOptions::n_gpu_layers and a driver that found a device
    std::vector<std::vector<uint8_t>> derived;  // tensors made at load (legacy MLA k_b, transposed)
    std::vector<std::unique_ptr<TensorInfo>> interleaved;  // repacked dense weights (the layers point here)
    LineBytes interleaved_data;                             // all repacked weights' bytes, groups on cache lines
    size_t interleaved_bytes = 0;
    size_t weight_bytes() const;  // bytes of all tensors
    size_t n_params() const;
};

// ---- Context: KV cache and evaluation -------------------------------------------------------
// llama.cpp's -fa: attention always runs fused (CPU and GPU); Off refuses a quantized V cache, as
// llama.cpp does without flash attention.
enum class FlashAttn { Auto, On, Off };

// The Walsh-Hadamard block a KV cache of type t rotates its K (key) or V rows by, for heads of
// head_dim values: 0 (none) for f32/f16, MLA's latent cache and heads not a multiple of 64.
int kv_rotation(Type t, int head_dim, bool key, bool mla);

struct ContextParams {
    int n_ctx = 0;           // total cells; 0 = the model's training context capped at 4096
    int n_seq = 1;           // independent sequences (server slots); each gets n_ctx / n_seq cells
    int n_threads = 0;       // 0 = physical cores
    int n_threads_batch = 0; // threads for batches of more than one token (prefill); 0 = n_threads
    int poll = 50;           // 0..100: how long idle workers busy-wait for the next job before they
                             // sleep (llama.cpp's --poll; 0 sleeps at once, spares a shared host's quota)
    Type type_k = Type::F16, type_v = Type::F16;
    bool kv_unified = false;  // one pool for all sequences instead of n_ctx / n_seq each
    int n_batch = 512;        // the largest batch given to decode (what an offload device's buffers are planned for)
    bool moe_grouped = true;  // MoE prefill runs each expert once over all its tokens (false: token by token)
    bool embeddings = false;  // decode keeps embeddings (per output entry and pooled per sequence), no logits
    Pooling pooling = Pooling::Unspecified;  // embeddings' pooling; Unspecified: the model's own
    FlashAttn flash_attn = FlashAttn::Auto;
    // Logits only for token ids [0, head_vocab) (rounded up to a 16-row group, at most n_vocab), the
    // others -inf: a draft model's cheaper, frequency-ranked LM head (FR-Spec; BPE ids come roughly in
    // merge, i.e. frequency, order). 0 = the whole vocabulary. An output on an offload device computes all.
    int head_vocab = 0;
};

// A batch of tokens to evaluate. Tokens of one sequence must come in increasing positions, and a
// sequence's first position in a batch must continue it (no gaps), so prefill and decode are the
// same call. want_logits marks the output entries (logits, or per-token embeddings).
//
// Attention mask (optional): entry i attends to positions [0, attn_end[i]) of its sequence (sliding
// layers still limit the start). Empty means causal (pos + 1 for each entry). An end past pos + 1 lets
// a token see later tokens of its sequence in this batch (at most the sequence's end after it):
// set_non_causal() gives every entry its whole sequence, as encoders (bert) need, which is what they
// get by default; a run of image tokens would give each the end of its image.
struct Batch {
    std::vector<int32_t> token, pos, seq;
    std::vector<uint8_t> want_logits;
    std::vector<int32_t> attn_end;
    void add(int32_t tok, int32_t p, int32_t s, bool logits) {
        token.push_back(tok); pos.push_back(p); seq.push_back(s); want_logits.push_back(logits);
    }
    void clear() { token.clear(); pos.clear(); seq.clear(); want_logits.clear(); attn_end.clear(); }
    size_t size() const { return token.size(); }
    void set_non_causal();  // attn_end of each entry = its sequence's last position in the batch + 1
};

class ThreadPool;  // implementation detail

class Context {
public:
    Context(const Model& model, const ContextParams& params);
    // Runs on share_threads's worker threads instead of starting its own (a draft model beside its
    // target: the two never decode at the same time, and their own pools would fight for the cores).
    // The pool lives while either context does.
    Context(const Model& model, const ContextParams& params, const Context& share_threads);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    // Evaluates the batch and stores the logits of the entries that asked for them (embeddings mode:
    // their embeddings, and each sequence's pooled one). Encoders keep no state between calls: each
    // sequence of the batch is evaluated whole from position 0, replacing what its cache held.
    void decode(const Batch& batch);
    // Logits of the i-th entry that asked for them in the last decode (n_vocab floats).
    const float* logits(int i) const;
    int n_logits() const;
    // Embeddings mode: the final hidden state (after the output norm) of the i-th output entry of the
    // last decode (n_embd floats), and the pooled vector of a sequence in it (n_embd_out() floats: the
    // classifier's scores for rank pooling). Not normalized (see embd_normalize); Pooling::None has no
    // pooled vectors.
    const float* embeddings(int i) const;
    const float* seq_embeddings(int seq) const;
    int n_embd_out() const;
    Pooling pooling() const;

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
    // Moves the rows of positions [src, src + n) of seq to [dst, dst + n) (dst <= src, src + n at most
    // its length), the keys re-rotated by dst - src: a cached chunk reused at an earlier position
    // (llama-server's --cache-reuse). Every cache type; a quantized row is dequantized, rotated and
    // quantized again. Positions from dst + n on keep their rows (the caller moves more chunks or
    // truncates). False, with nothing moved, when layers run on an offload device.
    bool seq_move(int seq, int src, int dst, int n);
    size_t kv_bytes() const;              // whole cache
    size_t kv_bytes_per_token() const;    // all layers, K and V
    int n_threads() const;
    const Model& model() const;
    int head_vocab() const;               // ids whose logits decode computes (ContextParams::head_vocab, rounded)

    struct Impl;
private:
    Context(const Model& model, const ContextParams& params, std::shared_ptr<ThreadPool> pool);
    std::unique_ptr<Impl> impl_;
};

// ---- Offload backends ----------------------------------------------------------------------
// The seam a device backend (CUDA, or the SIMT emulator in tests) implements in its own translation
// unit. A Context whose model has device layers runs the CPU layers, hands the activations over once,
// and the backend runs the rest (and the output when placed there); its KV cache holds the device
// layers' rows at the cells the Context's page tables assign, so sequence bookkeeping stays here.
struct OffloadBatch {
    const Batch* batch = nullptr;
    const int32_t* cells = nullptr;       // per token: the cache cell its K/V rows go to
    const int32_t* page_cells = nullptr;  // n_seq x pages_per_seq: first cell of each page of a sequence
    int n_seq = 0, pages_per_seq = 0, page_size = 0;
};

class OffloadBackend {
public:
    virtual ~OffloadBackend() = default;
    // x: n_tokens x n_embd, the input of the first device layer. Without the output on the device, x
    // comes back as the last layer's output; with it, the logits of rows logit_rows[0..n_logits) go
    // to logits (n_logits x n_vocab) and x is left as it is.
    virtual void forward(const OffloadBatch& b, float* x, int n_logits, const int32_t* logit_rows, float* logits) = 0;
    // The device layers' K/V rows of `cells`, in order, as bytes (for seq_save) and back.
    virtual std::vector<uint8_t> read_cells(const std::vector<int32_t>& cells) = 0;
    virtual void write_cells(const std::vector<int32_t>& cells, const uint8_t* bytes) = 0;
    virtual size_t bytes_per_cell() const = 0;
};

// One device of a driver, as llama.cpp lists them ("CUDA0: NVIDIA H200 (143167 MiB, 142500 MiB free)").
struct OffloadDevice {
    std::string name, description;
    size_t total_bytes = 0, free_bytes = 0;
};
// A device family: probed once when a model asks for -ngl (no device: one line on stderr, CPU only).
struct OffloadDriver {
    std::string name;                                // "CUDA", "SIMT emulator"
    std::function<bool(std::string& why_not)> probe;  // true when a device is usable
    std::function<std::vector<OffloadDevice>()> list;  // after a successful probe: the usable devices
    // Bytes of the activation buffers a device slice allocates for a batch of n_tokens.
    std::function<size_t(const HParams&, const Placement::Slice&, int n_tokens)> compute_bytes;
    // Runs model.placement's slices (each on its device) for a context of n_cells cache cells.
    std::function<std::unique_ptr<OffloadBackend>(const Model&, const ContextParams&, int n_cells)> create;
};
void set_offload_driver(const OffloadDriver& driver);  // replaces the previous one
const OffloadDriver& offload_driver();
// What each slice of a placement holds in device memory: its layers' weights (and the output's), their
// KV cache for n_cells cells, and the activations of a batch of n_tokens (0 when the driver has none).
struct DeviceMemory {
    int device = 0;
    size_t weights = 0, kv = 0, compute = 0;
    size_t total() const { return weights + kv + compute; }
};
std::vector<DeviceMemory> offload_memory(const Model& model, const Placement& placement, int n_cells, Type type_k, Type type_v, int n_tokens);

// ---- Sampling ------------------------------------------------------------------------------
// The stages of the sampling chain, named as llama.cpp's common_sampler_type. The chain always starts
// with logit_bias (and the grammar) and ends with a draw from the remaining distribution.
enum class SamplerStage { Penalties, Dry, TopNSigma, TopK, TypicalP, TopP, MinP, Xtc, Temperature };
const std::vector<SamplerStage>& default_sampler_stages();  // llama-server's order (above)
const char* sampler_stage_name(SamplerStage s);             // "penalties", "dry", "top_k", "typ_p", ...
// llama.cpp's names ("top_k", "typ_p", ... and the alternates "top-k", "nucleus", "typical", "temp", ...)
// and letters ("edskypmxt"); names or letters it does not know are skipped, as llama.cpp does.
std::vector<SamplerStage> sampler_stages_from_names(const std::vector<std::string>& names);
std::vector<SamplerStage> sampler_stages_from_chars(const std::string& chars);

struct SamplerParams {
    float temperature = 0.8f;  // <= 0: greedy
    int top_k = 40;            // <= 0: off
    float top_p = 0.95f;       // >= 1: off
    float min_p = 0.05f;       // <= 0: off
    float typical_p = 1.0f;    // >= 1: off (locally typical sampling)
    float top_n_sigma = -1.0f; // <= 0: off; keeps logits within n standard deviations of the best
    float xtc_probability = 0.0f, xtc_threshold = 0.1f;  // exclude top choices: off at probability 0
    float dynatemp_range = 0.0f, dynatemp_exponent = 1.0f;  // entropy-scaled temperature in t +- range
    int penalty_last_n = 64;   // window of previous tokens the penalties look at (0 = off, -1 = context)
    float repeat_penalty = 1.0f, frequency_penalty = 0.0f, presence_penalty = 0.0f;
    // DRY ("don't repeat yourself"): a token that would extend a repeat of >= allowed_length tokens is
    // penalized by multiplier * base^(length - allowed_length); breakers end the repeat search.
    float dry_multiplier = 0.0f, dry_base = 1.75f;
    int dry_allowed_length = 2, dry_penalty_last_n = -1;  // -1: the whole history
    std::vector<std::string> dry_sequence_breakers = {"\n", ":", "\"", "*"};
    int mirostat = 0;          // 1 or 2: mirostat v1/v2 replace the stages (after temperature)
    float mirostat_tau = 5.0f, mirostat_eta = 0.1f;
    int min_keep = 0;          // top_p, min_p, typical_p and xtc keep at least this many candidates
    bool ignore_eos = false;   // end-of-generation tokens are banned (needs the vocabulary)
    std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits; -inf bans a token
    std::vector<SamplerStage> samplers = default_sampler_stages();
    std::string grammar;       // GBNF; generated text must be a sentence of its "root" (needs the vocabulary)
    // Lazy grammar (llama-server's grammar_lazy, for tool calls): the generated text is free until one
    // of these words appears in it; the grammar then starts at that word (the text before it stays free;
    // a word may begin at the end of the prompt, the generated text completing it).
    bool grammar_lazy = false;
    std::vector<std::string> grammar_triggers;
    uint64_t seed = 0xFFFFFFFF;  // 0xFFFFFFFF = random
};

// A GBNF grammar (llama.cpp's grammar format: rules `name ::= ...`, alternatives `|`, groups, `*` `+`
// `?` `{m,n}`, "literals", [character classes] with ranges and ^negation, `.`, escapes, # comments).
// Parsing throws Error naming the problem; sizes are bounded (rules, elements, nesting, repetition
// counts), and left recursion is refused, so a hostile grammar is an error rather than a hang.
class Grammar {
public:
    explicit Grammar(const std::string& gbnf, const std::string& root = "root");
    bool matches(const std::string& text) const;  // the whole text is a sentence of the grammar
    size_t rule_count() const;
    struct Rules;
    struct State;
    std::shared_ptr<const Rules> rules() const { return rules_; }
private:
    std::shared_ptr<const Rules> rules_;
};

// A JSON schema as a GBNF grammar, as llama.cpp's json-schema-to-grammar converts it: objects
// (properties in order, required, additionalProperties whose keys are none of the declared ones,
// allOf with its anyOf members optional and its enums intersected), arrays (items, prefixItems or
// an items array as tuples, items false, minItems/maxItems), strings (pattern, minLength/maxLength,
// formats date, time, date-time, uuid and uuid1-5), integers with minimum/maximum/exclusiveMinimum/
// exclusiveMaximum (digit-range rules; a bound past +-10^18 is an error), numbers, booleans, null,
// enum/const (number literals as written), anyOf/oneOf, type lists, local $ref as JSON pointers
// (#/$defs/..., #/properties/..., "#"; recursion allowed; $defs nested anywhere are found). A pattern
// is an ECMAScript regex matched as a search (^ and $ anchor it): literals, ., classes, \d \w \s and
// their negations, groups, |, * + ? {m,n}; lookarounds, backreferences and \b are errors. "{}" or
// "true" is any JSON value; number bounds are not enforced. Throws Error for invalid JSON or an
// unsupported or invalid schema (the message says which).
std::string json_schema_to_grammar(const std::string& schema_json);

// The chain llama-server runs: logit_bias, then the stages in params.samplers (or temperature and
// mirostat), then a seeded draw. With a grammar, the drawn token is checked first and only when it is
// rejected is the whole vocabulary masked and the chain run again (as llama.cpp does).
class Sampler {
public:
    // vocab: needed by grammar, DRY's sequence breakers and ignore_eos (Error if they are asked for
    // without it); it must outlive the sampler. Throws Error for an invalid grammar.
    explicit Sampler(const SamplerParams& p = {}, const Vocab* vocab = nullptr);
    ~Sampler();
    Sampler(Sampler&&) noexcept;
    Sampler& operator=(Sampler&&) noexcept;
    // Throws Error when nothing can be sampled (the grammar and logit_bias exclude every token).
    int32_t sample(const float* logits, int n_vocab);
    // Records a token (prompt or generated) for the penalties and DRY; accept_grammar advances the
    // grammar too (generated tokens; prompt tokens are not part of the grammar's text, except the
    // start of a lazy grammar's trigger word that generated text completes).
    void accept(int32_t token, bool accept_grammar = true);
    void reset();
    // The penalty history can be rolled back (speculative decoding): truncate to n accepted tokens.
    size_t history_size() const { return history_.size(); }
    void truncate_history(size_t n);
    bool grammar_accepts_eog() const;  // no grammar, or the grammar's text is complete
    // The whole chain's state: penalty history (DRY reads it too), mirostat's mu, the grammar's stacks
    // and the random generator, to roll back tokens a caller accepted tentatively.
    struct Snapshot {
        std::vector<int32_t> history;
        float mirostat_mu = 0;
        std::mt19937_64 rng;
        std::shared_ptr<const Grammar::State> grammar;  // null without a grammar
        bool grammar_waiting = false;                    // a lazy grammar's wait for its trigger
        std::string trigger_tail;
        size_t trigger_prompt_chars = 0;
    };
    Snapshot snapshot() const;
    void restore(const Snapshot& s);
    const SamplerParams& params() const { return p_; }
    // Probabilities of the most likely candidates after the last sample (for n_probs).
    std::vector<std::pair<int32_t, float>> top_probs(const float* logits, int n_vocab, int n) const;

    struct Chain;
private:
    SamplerParams p_;
    const Vocab* vocab_ = nullptr;
    std::mt19937_64 rng_;
    std::vector<int32_t> history_;
    float mirostat_mu_ = 0;
    std::unique_ptr<Chain> chain_;  // grammar state, DRY breakers, token pieces
};

int physical_core_count();

// ---- Speculative decoding ------------------------------------------------------------------
// Drafts: tokens a cheap predictor expects next, which the target then evaluates in one batch. The
// caller verifies them: it samples each position from the target's logits with its own sampler and
// keeps a drafted token only while it equals that sample, so the output follows the target exactly
// (greedy: token for token; sampled: the same distribution, and with a seeded sampler the same tokens).
struct DraftParams {
    int n_max = 16;       // most tokens per draft (--draft-max)
    int n_min = 0;        // a shorter draft is dropped (--draft-min)
    float p_min = 0.75f;  // a draft model stops before a token it gives less than this (--draft-p-min)
};

// Prompt lookup (n-gram speculation): the tokens that followed the latest earlier occurrence of the
// last n tokens of `tokens`, for n from ngram_n down to 2 (the longest match wins); at most n_max.
std::vector<int32_t> ngram_draft(const std::vector<int32_t>& tokens, int ngram_n, int n_max);

// Prompt lookup that follows a rewrite's renames (n-gram speculation for "rewrite it with better
// names"): like ngram_draft, but it learns substitutions (an old name of the prompt -> the output's new
// one) from where its proposals went wrong, and looks up and proposes through them. It follows the
// text token by token, whoever drafted it (a draft model's tokens too): where no proposal of its own is
// in force it proposes anew, so every departure from the prompt's text is seen. Stateful, one per
// sequence; the first draft() call's tokens but the last are the prompt, what may be renamed.
class NgramLookup {
public:
    static constexpr int kMaxSubstitutions = 64;  // the oldest goes first
    static constexpr int kMaxFailures = 2;        // a substitution contradicted this often in a row goes
    static constexpr int kMaxOldTokens = 3;       // a substitution replaces 1..3 tokens of the prompt
    static constexpr int kMaxNewTokens = 4;       //   by 1..4 tokens of the output
    static constexpr int kGiveUpAfter = 8;        // output tokens after a divergence that may re-join
    // Up to n_max tokens expected after `tokens` (the whole sequence so far, the same as last call's
    // and then what followed). First the tokens that followed teach the map; then the longest suffix
    // (ngram_n..2 tokens) of the tail read with old names is looked up in the prompt and its
    // continuation proposed with new names, unless the plain tail (ngram_draft) matches longer.
    std::vector<int32_t> draft(const std::vector<int32_t>& tokens, int ngram_n, int n_max);
    // The substitutions learnt and kept: the old tokens -> the new ones.
    std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> substitutions() const;

private:
    struct Substitution {
        std::vector<int32_t> old_tokens, new_tokens;
        int failures = 0;
        uint64_t id = 0;  // larger: learnt later
    };
    struct Proposed {
        int32_t token;
        size_t source;     // the token of the sequence it was copied from (for a substitution: its first)
        uint64_t through;  // the substitution that made it, 0: copied as is
    };
    void follow(const std::vector<int32_t>& tokens, int ngram_n, int n_max);
    void propose(const std::vector<int32_t>& tokens, size_t end, int ngram_n, int n_max);
    void resolve_divergence(const std::vector<int32_t>& tokens, size_t end);
    void learn(std::vector<int32_t> old_tokens, std::vector<int32_t> new_tokens);
    std::vector<int32_t> tail_with_old_names(const std::vector<int32_t>& tokens, size_t end, int n) const;
    const Substitution* substitution_at(const std::vector<int32_t>& tokens, size_t at) const;
    void propose_from_prompt(const std::vector<int32_t>& tokens, size_t from, int n_max);
    void propose_from_sequence(const std::vector<int32_t>& tokens, size_t end, size_t from, int n_max);
    bool started_ = false;            // a first call set prompt_end_:
    size_t prompt_end_ = 0;           //   the tokens before it are the prompt
    std::vector<Substitution> substitutions_;
    uint64_t next_id_ = 1;
    std::vector<Proposed> proposal_;  // the proposal in force, made after proposal_at_ tokens
    size_t proposal_at_ = 0;
    size_t followed_ = 0;             // the tokens compared with the proposals so far
    bool diverged_ = false;           // the output left the prompt's text at divergence_at_ where the
    size_t divergence_source_ = 0;    //   proposal copied the prompt's token divergence_source_
    size_t divergence_at_ = 0;
};

// Throws Error unless the draft's tokens mean what the target's do: the same tokenizer, ids of the
// shared range with the same text, at most 128 ids more or fewer (llama.cpp's rule), the same BOS/EOS.
void check_draft_vocab(const Model& target, const Model& draft);

// A draft model: its own KV cache (one sequence per target sequence) that follows the target's tokens.
class DraftModel {
public:
    // target_vocab: the ids a draft may hold (drafting stops at a token outside); params.n_seq
    // sequences. share_threads: the target's context, whose workers this one borrows.
    DraftModel(const Model& draft, int target_vocab, const ContextParams& params, const Context& share_threads);
    // Up to p.n_max tokens the draft expects after `tokens`, greedily, stopping before a token of
    // probability < p.p_min (its softmax over the context's head_vocab() ids: a restricted head never
    // proposes an id beyond) or at the sequence's end; fewer than p.n_min: none. The tokens that
    // sequence seq already caches are reused (the common prefix); the rest is fed n_batch at a time.
    // A proposal (the n-gram lookup's) is evaluated in one batch with the last token: its leading
    // tokens that the draft would draft itself (p >= p_min) are taken without a decode each, and the
    // draft goes on alone from the first it disagrees with. n_own_max: the most tokens it drafts alone.
    std::vector<int32_t> draft(int seq, const std::vector<int32_t>& tokens, const DraftParams& p, int n_batch,
                               const std::vector<int32_t>& proposal = {}, int n_own_max = INT32_MAX);
    // Of the last draft(): its tokens confirmed from the proposal, and its decodes (the catch-up's not counted).
    int last_confirmed() const { return last_confirmed_; }
    int last_decodes() const { return last_decodes_; }
    // Brings sequence seq to `tokens` (what draft() does first), so a prompt can be read ahead of time;
    // the last token's logits are then in context().logits(0).
    void feed(int seq, const std::vector<int32_t>& tokens, int n_batch);
    // How many leading tokens of `tokens` sequence seq caches (what draft() need not feed again).
    size_t cached_prefix(int seq, const std::vector<int32_t>& tokens) const;
    Context& context() { return ctx_; }

private:
    void decode(int seq, const Batch& batch);
    void feed_with(int seq, const std::vector<int32_t>& tokens, const std::vector<int32_t>& extra, int n_batch);
    Context ctx_;
    int target_vocab_;
    std::vector<std::vector<int32_t>> cached_;  // per sequence: the tokens in ctx_'s cache
    int last_confirmed_ = 0, last_decodes_ = 0;
};

// What speculation costs and yields, to choose how much to draft: the target's decode time by batch
// size (measured, moving averages; sizes not measured yet are scaled from the nearest measured one by
// a CPU-like prior: flat up to ~8 tokens, then linear), and the geometric model of acceptance (each
// drafted token kept with probability alpha, once every token before it was).
class DraftCost {
public:
    static constexpr int kMaxTokens = 64;  // batch sizes tracked (larger batches are prompt chunks)
    // One target decode of n_tokens (all of the step's entries, its sampling included) took ms.
    void record_decode(int n_tokens, double ms);
    bool measured() const { return n_measured_ > 0; }
    // The expected time of a decode of n_tokens; 0 before any measurement.
    double decode_ms(int n_tokens) const;
    // Drafted tokens expected to be kept from a draft of k, each with probability alpha.
    static double expected_kept(double alpha, int k);
    // The draft length in [0, n_max] with the most tokens per ms, when `base` entries are in the batch
    // anyway (each yielding a token) and drafting costs ms_per_token per drafted token; 0 when no
    // draft beats none. Before any measurement: n_max.
    int best_length(double alpha, int n_max, int base, double ms_per_token) const;
    // Tokens per ms of steps whose drafts keep `kept` tokens of `drafted`, after `draft_ms` of
    // drafting, with `base` entries in the batch besides; 0 before any measurement.
    double rate(double kept, double drafted, double draft_ms, int base) const;
    // Whether such drafting makes more tokens per ms than no draft. Before any measurement: true.
    bool pays(double kept, double drafted, double draft_ms, int base) const;

private:
    double ms_[kMaxTokens + 1] = {};
    int n_measured_ = 0;
};

// ---- Evaluation: perplexity and KL divergence ----------------------------------------------
// As llama.cpp's llama-perplexity: the text is tokenized once (with BOS if the model adds one), cut
// into chunks of n_ctx tokens, and each chunk is evaluated from an empty cache with its first token
// replaced by BOS (when the model adds one). Only the second half of a chunk is scored (positions
// [n_ctx/2, n_ctx-1) predicting the next token), so every scored token has at least n_ctx/2 tokens of
// context. With a base model, the same chunks also go through the base and each scored position
// compares the two full-vocabulary distributions: KL(base || model) and whether the argmaxes agree
// (llama-perplexity --kl-divergence, in one run with both models loaded).
struct PerplexityParams {
    int n_ctx = 512;     // tokens per chunk
    int n_batch = 512;   // tokens per decode call
    int n_chunks = -1;   // evaluate at most this many chunks (< 0: all that fit)
    int n_threads = 0;   // 0 = physical cores
};

struct PerplexityResult {
    double ppl = 0, ppl_err = 0;              // exp(mean NLL) and its standard error
    int n_chunks = 0, n_scored = 0;           // chunks evaluated, positions scored
    int n_ctx = 0, n_tokens = 0;              // chunk length; tokens in the whole text
    bool has_kl = false;                      // a base model was given; the fields below are set
    double base_ppl = 0, base_ppl_err = 0;    // the base model's perplexity on the same positions
    double mean_kl = 0, mean_kl_err = 0, max_kl = 0;
    double top1_agree = 0, top1_agree_err = 0;  // percent of positions where the argmaxes agree
    double seconds = 0;                       // evaluation time (both models)
};

// Called after each chunk with the number of chunks done (1-based), the total, and the running PPL.
using PerplexityProgress = std::function<void(int chunk, int n_chunks, double ppl_so_far)>;

// Throws Error when the text has fewer than 2 * n_ctx tokens, when the model has no tokenizer (text
// form), or when the base model's vocabulary differs from the model's.
PerplexityResult evaluate_perplexity(const Model& model, const Model* base, const std::string& text,
                                     const PerplexityParams& params = {}, const PerplexityProgress& progress = {});
// Same on token ids (for models without a tokenizer); BOS handling as above.
PerplexityResult evaluate_perplexity(const Model& model, const Model* base, const std::vector<int32_t>& tokens,
                                     const PerplexityParams& params = {}, const PerplexityProgress& progress = {});

// llama-perplexity's output: a progress callback printing "[1]12.3456,[2]11.9876,..." (newline after
// the last chunk), and the final report ("Final estimate: PPL = X +/- Y", KL and top-1 lines).
PerplexityProgress perplexity_progress_printer(FILE* out);
void print_perplexity_report(const PerplexityResult& r, FILE* out);

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
// RoPE's cos/sin of every rotated pair at one position (exposed for tests): hp.n_rot values, as ggml's
// rope cache, with freq_factors (nullptr: none) and YaRN as hp configures them.
void rope_angles(const HParams& hp, const float* freq_factors, int pos, float base, float* cs);

} // namespace llm


#endif // LLM_HPP

// ============================================================================================
// Implementation
// ============================================================================================
#if defined(LLM_IMPLEMENTATION) && !defined(LLM_IMPLEMENTATION_DONE)
#define LLM_IMPLEMENTATION_DONE

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <cctype>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <type_traits>
#include <unordered_map>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>  // arch_prctl (AMX tile state)
#endif

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
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

// Buffers on 64-byte cache lines. A matmul's 16-row group of outputs is 64 bytes per column, whole
// lines only on an aligned buffer; malloc's large blocks start 16 bytes into a page, so each output
// line was shared by two row groups written far apart and came from L3 twice in a prompt. The AVX2
// tiles (which store 8-row halves) lost most: SmolLM2 pp512 on avx2 rose 12-25 % once aligned (the
// AVX-512 tiles store whole groups and did not change). A KV cache row of 128 bytes also touched
// three lines instead of two.
template <class T>
struct LineAllocator {
    using value_type = T;
    LineAllocator() = default;
    template <class U> LineAllocator(const LineAllocator<U>&) {}
    T* allocate(size_t n) { return (T*)::operator new(n * sizeof(T), kLineAlign); }
    void deallocate(T* p, size_t) { ::operator delete(p, kLineAlign); }
    template <class U> bool operator==(const LineAllocator<U>&) const { return true; }
    template <class U> bool operator!=(const LineAllocator<U>&) const { return false; }
};
// The forward pass's scratch.
using Scratch = std::vector<float, LineAllocator<float>>;

// Asks for transparent huge pages over [p, p + n) before its first write, where the kernel leaves them to
// madvise (a common default): decode and short prompts stream the weights (the repacked copy, or the
// --no-mmap buffer), and 2 MiB pages spare that stream most of its TLB misses.
inline void advise_huge_pages(void* p, size_t n) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = 2u << 20, b = ((uintptr_t)p + huge - 1) & ~(huge - 1), e = ((uintptr_t)p + n) & ~(huge - 1);
    if (e > b) madvise((void*)b, e - b, MADV_HUGEPAGE);  // best effort: refused or unsupported keeps 4 KiB pages
#else
    (void)p, (void)n;
#endif
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
// 3. Block layouts (ggml's, byte for byte; then our 16-row interleaved ones). QK_K-blocks are 256
//    values, the rest 32.
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

// Q4_K interleaved (section 6): one 256-value block of 16 rows, 2304 bytes like the 16 blocks it
// replaces. The 6-bit scales and mins are numbered so SIMD unpacking yields them in the order the
// kernel consumes: scale e = sub-block * 16 + row, min e = (sub-block / 2) * 32 + row * 2 + sub-block % 2.
// Value e < 64 sits in the low nibble of lo[e], e >= 64 in the high nibble of lo[e - 64]; hi[e % 64]
// has their top two bits (bits 0-1 / 2-3 for scales e < 64 / e >= 64, bits 4-5 / 6-7 for mins).
// qs[sb][c] holds sub-block sb's values 4c..4c+3 (low nibbles) and 4c+16..4c+19 (high), four bytes
// per row, rows in order.
struct block_q4_K_x16 {
    uint16_t d[16], dmin[16];
    uint8_t scales_lo[64], mins_lo[64], hi[64];
    uint8_t qs[8][4][64];
};
// Q5_K: the same, and the fifth bits of sub-block sb's values 4i..4i+3 as a mask qh[sb][i] (bit
// 4 * row + j).
struct block_q5_K_x16 {
    uint16_t d[16], dmin[16];
    uint8_t scales_lo[64], mins_lo[64], hi[64];
    uint8_t qs[8][4][64];
    uint64_t qh[8][8];
};
// Q6_K: scales of the 16-value sub-blocks in pairs (scales[p][row][h] = sub-block 2p + h); four-value
// groups g = 0..63 (values 4g..4g+3) of the 16 rows: low four bits in ql[g % 32] (nibble g / 32),
// top two bits in qh[g % 16] (bits 2 * (g / 16) and up).
struct block_q6_K_x16 {
    uint16_t d[16];
    int8_t scales[8][16][2];
    uint8_t ql[32][64], qh[16][64];
};

// Q3_K: the 16-value sub-blocks' 6-bit scales (+32), numbered e = pair * 32 + row * 2 + (sub-block
// % 2) and stored as Q4_K's are (low nibble of lo[e % 128] or high for e >= 128, top two bits at
// 2 * (e / 64) of hi[e % 64]); value + 4 (0..7) as its low two bits in ql (as Q6_K's qh) and the
// third bit as a mask per group (bit 4 * row + j).
struct block_q3_K_x16 {
    uint16_t d[16];
    uint8_t scales_lo[128], scales_hi[64];
    uint8_t ql[16][64];
    uint64_t qh[64];
};

// Q2_K: d and dmin per row, the scale/min bytes of the 16 sub-blocks numbered as Q3_K's scales, and
// the two-bit values in ql as Q3_K's low bits.
struct block_q2_K_x16 {
    uint16_t d[16], dmin[16];
    uint8_t scales[256];
    uint8_t ql[16][64];
};

// 32-value types interleaved: the 16 rows' scales (and mins), then four-value groups g = 0..7 (values
// 4g..4g+3) of the 16 rows as unsigned bytes: 4-bit types keep a row's nibble bytes as they are (low
// nibble: group c, high: group c + 4 of qs[c]), Q5 types add the fifth bits as bit planes in the
// bytes' order (qh[4 * row + j], bit g: value 4g + j of the row; a 16-bit shift brings group g's bits
// to bit 4 of 32 bytes at once), Q8_0 stores value + 128.
struct block_q4_0_x16 { uint16_t d[16]; uint8_t qs[4][64]; };              // also IQ4_NL (indices)
struct block_q4_1_x16 { uint16_t d[16], m[16]; uint8_t qs[4][64]; };
struct block_q5_0_x16 { uint16_t d[16]; uint8_t qh[64]; uint8_t qs[4][64]; };
struct block_q5_1_x16 { uint16_t d[16], m[16]; uint8_t qh[64]; uint8_t qs[4][64]; };
struct block_q8_0_x16 { uint16_t d[16]; uint8_t qs[8][64]; };
// BF16, 32-value blocks of 16 rows: line p holds values 2p, 2p + 1 of each row (row r at bytes 4r..4r+3),
// as TDPBF16PS and vdpbf16ps take their weight operand.
struct block_bf16_x16 { uint16_t v[16][16][2]; };
static_assert(sizeof(block_q4_K_x16) == 16 * sizeof(block_q4_K) && sizeof(block_q5_K_x16) == 16 * sizeof(block_q5_K) &&
              sizeof(block_q6_K_x16) == 16 * sizeof(block_q6_K) && sizeof(block_q3_K_x16) == 16 * sizeof(block_q3_K) &&
              sizeof(block_q2_K_x16) == 16 * sizeof(block_q2_K) &&
              sizeof(block_q4_0_x16) == 16 * sizeof(block_q4_0) &&
              sizeof(block_q4_1_x16) == 16 * sizeof(block_q4_1) && sizeof(block_q5_0_x16) == 16 * sizeof(block_q5_0) &&
              sizeof(block_q5_1_x16) == 16 * sizeof(block_q5_1) && sizeof(block_q8_0_x16) == 16 * sizeof(block_q8_0) &&
              sizeof(block_bf16_x16) == 16 * 32 * sizeof(uint16_t),
              "an interleaved group keeps its rows' bytes");

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
// 4. GGUF reader
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
            owned_ = line_bytes(size_);
            advise_huge_pages(owned_.get(), size_);
            size_t got = 0;
            while (got < size_) {
                ssize_t r = ::read(fd, owned_.get() + got, size_ - got);
                if (r <= 0) {
                    ::close(fd);
                    fail("%s: read failed", path.c_str());
                }
                got += (size_t)r;
            }
            data_ = owned_.get();
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
    LineBytes owned_;
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
            // Every partial product of the dimensions (rows, elements, bytes at <= 4 per element) must fit:
            // bound the product of the non-zero ones, since a zero dimension would hide the others.
            const int64_t max_elements = INT64_MAX / 8;
            int64_t nonzero_product = 1;
            for (uint32_t d = 0; d < n_dims; d++) {
                uint64_t ne = read<uint64_t>("tensor dimension");
                if (ne > (uint64_t)max_elements) bad("tensor dimension too large");
                t.ne[d] = (int64_t)ne;
                if (t.ne[d] == 0) continue;
                if (nonzero_product > max_elements / t.ne[d]) bad("tensor element count overflows");
                nonzero_product *= t.ne[d];
            }
            uint32_t type = read<uint32_t>("tensor type");
            if (!type_known(type)) {
                fail("%s: tensor '%s' has unsupported type id %u", path.c_str(), t.name.c_str(), type);
            }
            t.type = (Type)type;
            const TypeInfo& ti = type_info(t.type);
            if (t.ne[0] % ti.block_size != 0) bad(("row length of tensor " + t.name + " is not a multiple of its block size").c_str());
            t.nbytes = row_bytes(t.type, t.ne[0]) * (size_t)t.n_rows();
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

// ============================================================================================
// 5. Quantized rows: dequantization, quantization (KV cache / activations), scalar dot products.
//     Numerics follow ggml's CPU backend: dequantize_row_* and quantize_row_*_ref are reproduced
//     operation for operation (bit-exact when compiled without FMA contraction, i.e. baseline
//     x86-64 flags), and the scalar dot products follow ggml's *_generic versions.
// ============================================================================================

// K-quant weight quantizers (Q2_K..Q6_K) live with the model-writing code.
void quantize_row_kquant(Type t, const float* src, void* dst, int64_t n);

namespace qimpl {

// ---- scale unpacking shared by dequantization, scalar and SIMD dot products ----------------

// Q4_K/Q5_K 6-bit scale and min packing (the inverse of get_scale_min_k4; s zeroed first).
inline void pack_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t* s) {
    if (j < 4) {
        s[j] = ls;
        s[j + 4] = lm;
    } else {
        s[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        s[j - 4] |= (uint8_t)((ls >> 4) << 6);
        s[j - 0] |= (uint8_t)((lm >> 4) << 6);
    }
}
// Q4_K / Q5_K: eight 6-bit scales and eight 6-bit mins packed into 12 bytes.
inline void unpack_scale_min_k4(const uint8_t* q, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            sc[j] = q[j] & 63;
            mn[j] = q[j + 4] & 63;
        } else {
            sc[j] = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
            mn[j] = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
        }
    }
}

// Q3_K: sixteen 6-bit scales (stored with a +32 bias) packed into 12 bytes; returns them unbiased.
inline void unpack_scales_q3k(const uint8_t* s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        int lo = (j < 8) ? (s[j] & 0xF) : (s[j - 8] >> 4);
        int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

// ---- dequantization (one block each) --------------------------------------------------------

inline void deq_q4_0(const block_q4_0* x, float* y) {
    const float d = fp16_to_fp32(x->d);
    for (int j = 0; j < 16; j++) {
        y[j] = ((x->qs[j] & 0x0F) - 8) * d;
        y[j + 16] = ((x->qs[j] >> 4) - 8) * d;
    }
}
inline void deq_q4_1(const block_q4_1* x, float* y) {
    const float d = fp16_to_fp32(x->d), m = fp16_to_fp32(x->m);
    for (int j = 0; j < 16; j++) {
        y[j] = (x->qs[j] & 0x0F) * d + m;
        y[j + 16] = (x->qs[j] >> 4) * d + m;
    }
}
inline uint32_t load_u32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
inline void deq_q5_0(const block_q5_0* x, float* y) {
    const float d = fp16_to_fp32(x->d);
    const uint32_t qh = load_u32(x->qh);
    for (int j = 0; j < 16; j++) {
        const int x0 = ((x->qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
        const int x1 = ((x->qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        y[j] = x0 * d;
        y[j + 16] = x1 * d;
    }
}
inline void deq_q5_1(const block_q5_1* x, float* y) {
    const float d = fp16_to_fp32(x->d), m = fp16_to_fp32(x->m);
    const uint32_t qh = load_u32(x->qh);
    for (int j = 0; j < 16; j++) {
        const int x0 = (x->qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10);
        const int x1 = (x->qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
    }
}
inline void deq_q8_0(const block_q8_0* x, float* y) {
    const float d = fp16_to_fp32(x->d);
    for (int j = 0; j < 32; j++) y[j] = x->qs[j] * d;
}
inline void deq_iq4_nl(const block_iq4_nl* x, float* y) {
    const float d = fp16_to_fp32(x->d);
    for (int j = 0; j < 16; j++) {
        y[j] = d * kIQ4NLValues[x->qs[j] & 0xf];
        y[j + 16] = d * kIQ4NLValues[x->qs[j] >> 4];
    }
}
inline void deq_q2_K(const block_q2_K* x, float* y) {
    const float d = fp16_to_fp32(x->d), mn = fp16_to_fp32(x->dmin);
    const uint8_t* q = x->qs;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half = 0; half < 2; half++) {  // two 16-value sub-blocks with their own scale
                const uint8_t sc = x->scales[is++];
                const float dl = d * (sc & 0xF), ml = mn * (sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
            }
        }
    }
}
inline void deq_q3_K(const block_q3_K* x, float* y) {
    const float d_all = fp16_to_fp32(x->d);
    int8_t scales[16];
    unpack_scales_q3k(x->scales, scales);
    const uint8_t* q = x->qs;
    uint8_t m = 1;
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
            for (int half = 0; half < 2; half++) {
                const float dl = d_all * scales[is++];
                for (int l = 16 * half; l < 16 * half + 16; l++)
                    *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((x->hmask[l] & m) ? 0 : 4));
            }
        }
    }
}
// Q4_K and Q5_K share everything but the fifth bit.
template <bool HasHigh>
inline void deq_q45_K(uint16_t dh, uint16_t dminh, const uint8_t* scales, const uint8_t* qh, const uint8_t* ql,
                      float* y) {
    const float d = fp16_to_fp32(dh), mn = fp16_to_fp32(dminh);
    uint8_t sc[8], m[8];
    unpack_scale_min_k4(scales, sc, m);
    for (int j = 0; j < 4; j++, ql += 32) {
        for (int half = 0; half < 2; half++) {
            const int is = 2 * j + half;
            const float d1 = d * sc[is], m1 = mn * m[is];
            for (int l = 0; l < 32; l++) {
                int q = half ? (ql[l] >> 4) : (ql[l] & 0xF);
                if (HasHigh) q += (qh[l] & (1u << is)) ? 16 : 0;
                *y++ = d1 * q - m1;
            }
        }
    }
}
inline void deq_q4_K(const block_q4_K* x, float* y) { deq_q45_K<false>(x->d, x->dmin, x->scales, nullptr, x->qs, y); }
inline void deq_q5_K(const block_q5_K* x, float* y) { deq_q45_K<true>(x->d, x->dmin, x->scales, x->qh, x->qs, y); }
inline void deq_q6_K(const block_q6_K* x, float* y) {
    const float d = fp16_to_fp32(x->d);
    const uint8_t* ql = x->ql;
    const uint8_t* qh = x->qh;
    const int8_t* sc = x->scales;
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
    }
}
inline void deq_q8_K(const block_q8_K* x, float* y) {
    for (int j = 0; j < QK_K; j++) y[j] = x->d * x->qs[j];
}

template <class B, int QK>
inline void deq_row(void (*f)(const B*, float*), const void* src, float* dst, int64_t n) {
    const B* x = (const B*)src;
    for (int64_t i = 0; i < n / QK; i++) f(x + i, dst + i * QK);
}

// ---- quantization (ggml's reference quantizers) ----------------------------------------------

// Round to nearest, ties to even, for |f| < 2^22 (ggml's nearest_int).
inline int nearest_int(float f) {
    float v = f + 12582912.f;
    int i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

// Value with the largest magnitude (the first one on ties), as ggml's amax/max scan.
inline float signed_absmax(const float* x, int n) {
    float amax = 0, mx = 0;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); mx = x[j]; }
    return mx;
}

// Q4_0 and Q5_0: symmetric, d = max / -(2^(bits-1)).
template <int Bits>
inline void quant_sym(const float* x, uint16_t* dh, uint8_t* qs, uint8_t* qh_out) {
    constexpr int half = 1 << (Bits - 1), qmax = (1 << Bits) - 1;
    const float d = signed_absmax(x, 32) / -half;
    const float id = d ? 1.0f / d : 0.0f;
    *dh = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        const uint8_t xi0 = (uint8_t)std::min(qmax, (int)(int8_t)(x[j] * id + (half + 0.5f)));
        const uint8_t xi1 = (uint8_t)std::min(qmax, (int)(int8_t)(x[j + 16] * id + (half + 0.5f)));
        qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << j;
        qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    if (qh_out) memcpy(qh_out, &qh, 4);
}

// Q4_1 and Q5_1: affine, d = (max - min) / (2^bits - 1).
template <int Bits>
inline void quant_affine(const float* x, uint16_t* dh, uint16_t* mh, uint8_t* qs, uint8_t* qh_out) {
    constexpr int qmax = (1 << Bits) - 1;
    float mn = 3.402823466e+38f, mx = -3.402823466e+38f;
    for (int j = 0; j < 32; j++) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    const float d = (mx - mn) / qmax;
    const float id = d ? 1.0f / d : 0.0f;
    *dh = fp32_to_fp16(d);
    *mh = fp32_to_fp16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        // ggml: MIN(15, (int8_t)v) for 4 bits, (uint8_t)v for 5 bits; identical for v in [0, 32).
        const uint8_t xi0 = (uint8_t)std::min(qmax, (int)(uint8_t)((x[j] - mn) * id + 0.5f));
        const uint8_t xi1 = (uint8_t)std::min(qmax, (int)(uint8_t)((x[j + 16] - mn) * id + 0.5f));
        qs[j] = (uint8_t)((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
        qh |= ((xi0 & 0x10u) >> 4) << j;
        qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
    }
    if (qh_out) memcpy(qh_out, &qh, 4);
}

// Q8_0 / Q8_1: returns the sum of the quants (for q8_1's s field). Two roundings exist in ggml and
// both matter for matching it: model files use the reference quantizer (d = amax/127, id = 1/d,
// round half away from zero); at run time (activations, KV cache) ggml's x86 code computes
// id = 127/amax and rounds half to even. They differ in the last bit of id, which flips quants.
enum class Q8Rounding { Reference, Runtime };
inline int quant_q8(const float* x, uint16_t* dh, int8_t* qs, Q8Rounding mode, float* d_out = nullptr) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = std::max(amax, fabsf(x[j]));
    const float d = amax / 127;
    float id;
    if (mode == Q8Rounding::Reference) id = d ? 1.0f / d : 0.0f;
    else id = amax != 0.0f ? 127.f / amax : 0.0f;
    *dh = fp32_to_fp16(d);
    if (d_out) *d_out = d;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        qs[j] = (int8_t)(mode == Q8Rounding::Reference ? roundf(x[j] * id) : nearbyintf(x[j] * id));
        sum += qs[j];
    }
    return sum;
}

inline void quant_q8_K(const float* x, block_q8_K* y) {
    float amax = 0, mx = 0;
    for (int j = 0; j < QK_K; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); mx = x[j]; }
    if (!amax) {
        memset(y, 0, sizeof *y);
        return;
    }
    const float iscale = -127.f / mx;
    for (int j = 0; j < QK_K; j++) y->qs[j] = (int8_t)std::min(127, nearest_int(iscale * x[j]));
    for (int j = 0; j < QK_K / 16; j++) {
        int sum = 0;
        for (int i = 0; i < 16; i++) sum += y->qs[j * 16 + i];
        y->bsums[j] = (int16_t)sum;
    }
    y->d = 1 / iscale;
}

inline int best_index_iq4nl(float x) {
    const int8_t* v = kIQ4NLValues;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid; else lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

// ggml's quantize_row_iq4_nl_ref: quantize_row_iq4_nl_impl(32, 32, ..., no imatrix, ntry = -1),
// i.e. one least-squares scale refit with weights x^2 and no scale search.
inline void quant_iq4_nl(const float* x, block_iq4_nl* y) {
    uint8_t L[32] = {};
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); mx = x[j]; }
    float d = 0;
    if (amax >= 1e-15f) {  // ggml's GROUP_MAX_EPS; below it the block is stored as zero
        d = mx / kIQ4NLValues[0];
        const float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            const int l = best_index_iq4nl(id * x[j]);
            L[j] = (uint8_t)l;
            const float q = kIQ4NLValues[l], w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        d = sumqx / sumq2;
    }
    y->d = fp32_to_fp16(d);
    for (int j = 0; j < 16; j++) y->qs[j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

// ---- scalar dot products (ggml's *_generic) ---------------------------------------------------

inline float dot_f32(int64_t n, const void* vx, const void* vy) {
    const float* x = (const float*)vx;
    const float* y = (const float*)vy;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)(x[i] * y[i]);
    return (float)s;
}
template <float (*Cvt)(uint16_t)>
inline float dot_half(int64_t n, const void* vx, const void* vy) {
    const uint16_t* x = (const uint16_t*)vx;
    const uint16_t* y = (const uint16_t*)vy;
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)(Cvt(x[i]) * Cvt(y[i]));
    return (float)s;
}

inline float dot_q4_0(int64_t n, const void* vx, const void* vy) {
    const block_q4_0* x = (const block_q4_0*)vx;
    const block_q8_0* y = (const block_q8_0*)vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) {
            s0 += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
            s1 += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        }
        sumf += (s0 + s1) * fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d);
    }
    return sumf;
}
inline float dot_q4_1(int64_t n, const void* vx, const void* vy) {
    const block_q4_1* x = (const block_q4_1*)vx;
    const block_q8_1* y = (const block_q8_1*)vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) {
            s0 += (x[i].qs[j] & 0x0F) * y[i].qs[j];
            s1 += (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        }
        sumf += (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)) * (s0 + s1) +
                fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
    }
    return sumf;
}
inline float dot_q5_0(int64_t n, const void* vx, const void* vy) {
    const block_q5_0* x = (const block_q5_0*)vx;
    const block_q8_0* y = (const block_q8_0*)vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const uint32_t qh = load_u32(x[i].qh);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) {
            const int x0 = (int8_t)(((x[i].qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16);
            const int x1 = (int8_t)(((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
            s0 += x0 * y[i].qs[j];
            s1 += x1 * y[i].qs[j + 16];
        }
        sumf += (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)) * (s0 + s1);
    }
    return sumf;
}
inline float dot_q5_1(int64_t n, const void* vx, const void* vy) {
    const block_q5_1* x = (const block_q5_1*)vx;
    const block_q8_1* y = (const block_q8_1*)vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const uint32_t qh = load_u32(x[i].qh);
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 16; j++) {
            const int x0 = (x[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
            const int x1 = (x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
            s0 += x0 * y[i].qs[j];
            s1 += x1 * y[i].qs[j + 16];
        }
        sumf += (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d)) * (s0 + s1) +
                fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
    }
    return sumf;
}
inline float dot_q8_0(int64_t n, const void* vx, const void* vy) {
    const block_q8_0* x = (const block_q8_0*)vx;
    const block_q8_0* y = (const block_q8_0*)vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int s = 0;
        for (int j = 0; j < 32; j++) s += x[i].qs[j] * y[i].qs[j];
        sumf += s * (fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d));
    }
    return sumf;
}
inline float dot_iq4_nl(int64_t n, const void* vx, const void* vy) {
    const block_iq4_nl* x = (const block_iq4_nl*)vx;
    const block_q8_0* y = (const block_q8_0*)vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        const float d = fp16_to_fp32(y[i].d) * fp16_to_fp32(x[i].d);
        int s1 = 0, s2 = 0;
        for (int j = 0; j < 16; j++) {
            s1 += y[i].qs[j] * kIQ4NLValues[x[i].qs[j] & 0xf];
            s2 += y[i].qs[j + 16] * kIQ4NLValues[x[i].qs[j] >> 4];
        }
        sumf += d * (s1 + s2);
    }
    return sumf;
}
inline float dot_q2_K(int64_t n, const void* vx, const void* vy) {
    const block_q2_K* x = (const block_q2_K*)vx;
    const block_q8_K* y = (const block_q8_K*)vy;
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t* q2 = x[i].qs;
        const int8_t* q8 = y[i].qs;
        const uint8_t* sc = x[i].scales;
        int summs = 0;
        for (int j = 0; j < 16; j++) summs += y[i].bsums[j] * (sc[j] >> 4);
        const float dall = y[i].d * fp16_to_fp32(x[i].d);
        const float dmin = y[i].d * fp16_to_fp32(x[i].dmin);
        int isum = 0, is = 0;
        for (int k = 0; k < QK_K / 128; k++, q2 += 32) {
            for (int shift = 0; shift < 8; shift += 2, q8 += 32) {
                for (int half = 0; half < 2; half++) {
                    const int d = sc[is++] & 0xF;
                    int isuml = 0;
                    for (int l = 16 * half; l < 16 * half + 16; l++) isuml += q8[l] * ((q2[l] >> shift) & 3);
                    isum += d * isuml;
                }
            }
        }
        sumf += dall * isum - dmin * summs;
    }
    return sumf;
}

// Q3_K..Q6_K generic versions share a shape: expand the block to int8 values a[256], accumulate
// scale * q8 * a in eight int32 lanes per 16-value sub-block, then combine in float.
// `expand` writes a[256] and the 16 per-16-value scales; Mins (Q4_K/Q5_K) also gives the 8 mins.
template <class Block, bool Mins, class Expand>
inline float dot_kquant_generic(int64_t n, const void* vx, const void* vy, Expand expand) {
    const Block* x = (const Block*)vx;
    const block_q8_K* y = (const block_q8_K*)vy;
    float sums[8] = {};
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t a[QK_K];
        int scales[16];
        uint8_t mins[8] = {};
        expand(x[i], a, scales, mins);
        const int8_t* q8 = y[i].qs;
        int32_t aux32[8] = {};
        for (int j = 0; j < 16; j++) {
            for (int h = 0; h < 2; h++) {
                for (int l = 0; l < 8; l++) {
                    const int16_t aux16 = (int16_t)(q8[16 * j + 8 * h + l] * a[16 * j + 8 * h + l]);
                    aux32[l] += scales[j] * aux16;
                }
            }
        }
        const float d = fp16_to_fp32(x[i].d) * y[i].d;
        for (int l = 0; l < 8; l++) sums[l] += d * aux32[l];
        if constexpr (Mins) {
            int sumi = 0;
            for (int j = 0; j < 16; j++) sumi += y[i].bsums[j] * mins[j / 2];
            const float dmin = fp16_to_fp32(x[i].dmin) * y[i].d;
            sumf -= dmin * sumi;
        }
    }
    for (int l = 0; l < 8; l++) sumf += sums[l];
    return sumf;
}
template <class Block>
inline float dot_q45_K(int64_t n, const void* vx, const void* vy) {
    return dot_kquant_generic<Block, true>(n, vx, vy, [](const Block& b, int8_t* a, int* scales, uint8_t* mins) {
        uint8_t sc[8];
        unpack_scale_min_k4(b.scales, sc, mins);
        for (int j = 0; j < 16; j++) scales[j] = sc[j / 2];
        for (int e = 0; e < QK_K; e++) {
            const int sub = e / 32;
            const uint8_t byte = b.qs[32 * (sub / 2) + e % 32];
            int q = (sub & 1) ? (byte >> 4) : (byte & 0xF);
            if constexpr (std::is_same<Block, block_q5_K>::value) q += (b.qh[e % 32] >> sub & 1) ? 16 : 0;
            a[e] = (int8_t)q;
        }
    });
}
inline float dot_q3_K(int64_t n, const void* vx, const void* vy) {
    return dot_kquant_generic<block_q3_K, false>(n, vx, vy, [](const block_q3_K& b, int8_t* a, int* scales, uint8_t*) {
        int8_t sc[16];
        unpack_scales_q3k(b.scales, sc);
        for (int j = 0; j < 16; j++) scales[j] = sc[j];
        for (int e = 0; e < QK_K; e++) {
            const int sub = e / 32, l = e % 32;  // 32-value group: bits 2*(sub%4) of qs[32*(sub/4)+l]
            const int q = (b.qs[32 * (sub / 4) + l] >> (2 * (sub % 4))) & 3;
            a[e] = (int8_t)(q - ((b.hmask[l] >> sub & 1) ? 0 : 4));
        }
    });
}
inline float dot_q6_K(int64_t n, const void* vx, const void* vy) {
    return dot_kquant_generic<block_q6_K, false>(n, vx, vy, [](const block_q6_K& b, int8_t* a, int* scales, uint8_t*) {
        for (int j = 0; j < 16; j++) scales[j] = b.scales[j];
        for (int e = 0; e < QK_K; e++) {
            const int chunk = e / 128, sub = (e % 128) / 32, l = e % 32;
            const uint8_t lo = b.ql[64 * chunk + l + 32 * (sub & 1)];
            const int q4 = (sub & 2) ? (lo >> 4) : (lo & 0xF);
            const int q2 = (b.qh[32 * chunk + l] >> (2 * sub)) & 3;
            a[e] = (int8_t)((q4 | (q2 << 4)) - 32);
        }
    });
}

} // namespace qimpl

// ---- public entry points -------------------------------------------------------------------

static void check_row(Type t, int64_t n, const char* what) {
    const int bs = type_info(t).block_size;
    if (n < 0 || n % bs != 0) fail("%s: row of %lld values is not a multiple of the %s block size %d", what, (long long)n,
                                   type_info(t).name, bs);
}

void dequantize_row(Type t, const void* src, float* dst, int64_t n) {
    using namespace qimpl;
    check_row(t, n, "dequantize_row");
    switch (t) {
    case Type::F32: memcpy(dst, src, (size_t)n * 4); return;
    case Type::F16: for (int64_t i = 0; i < n; i++) dst[i] = fp16_to_fp32(((const uint16_t*)src)[i]); return;
    case Type::BF16: for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_fp32(((const uint16_t*)src)[i]); return;
    case Type::Q4_0: return deq_row<block_q4_0, 32>(deq_q4_0, src, dst, n);
    case Type::Q4_1: return deq_row<block_q4_1, 32>(deq_q4_1, src, dst, n);
    case Type::Q5_0: return deq_row<block_q5_0, 32>(deq_q5_0, src, dst, n);
    case Type::Q5_1: return deq_row<block_q5_1, 32>(deq_q5_1, src, dst, n);
    case Type::Q8_0: return deq_row<block_q8_0, 32>(deq_q8_0, src, dst, n);
    case Type::IQ4_NL: return deq_row<block_iq4_nl, 32>(deq_iq4_nl, src, dst, n);
    case Type::Q2_K: return deq_row<block_q2_K, QK_K>(deq_q2_K, src, dst, n);
    case Type::Q3_K: return deq_row<block_q3_K, QK_K>(deq_q3_K, src, dst, n);
    case Type::Q4_K: return deq_row<block_q4_K, QK_K>(deq_q4_K, src, dst, n);
    case Type::Q5_K: return deq_row<block_q5_K, QK_K>(deq_q5_K, src, dst, n);
    case Type::Q6_K: return deq_row<block_q6_K, QK_K>(deq_q6_K, src, dst, n);
    case Type::Q8_K: return deq_row<block_q8_K, QK_K>(deq_q8_K, src, dst, n);
    default: fail("dequantize_row: type %s not supported", type_info(t).name);
    }
}

namespace qimpl {
bool quantize_act_simd(Type t, const float* src, void* dst, int64_t n);  // section 5
}

void quantize_row(Type t, const float* src, void* dst, int64_t n) {
    using namespace qimpl;
    check_row(t, n, "quantize_row");
    if (quantize_act_simd(t, src, dst, n)) return;
    const int64_t nb32 = n / 32;
    switch (t) {
    case Type::F32: memcpy(dst, src, (size_t)n * 4); return;
    case Type::F16: for (int64_t i = 0; i < n; i++) ((uint16_t*)dst)[i] = fp32_to_fp16(src[i]); return;
    case Type::BF16: for (int64_t i = 0; i < n; i++) ((uint16_t*)dst)[i] = fp32_to_bf16(src[i]); return;
    case Type::Q4_0:
        for (int64_t i = 0; i < nb32; i++) {
            block_q4_0& y = ((block_q4_0*)dst)[i];
            quant_sym<4>(src + 32 * i, &y.d, y.qs, nullptr);
        }
        return;
    case Type::Q5_0:
        for (int64_t i = 0; i < nb32; i++) {
            block_q5_0& y = ((block_q5_0*)dst)[i];
            quant_sym<5>(src + 32 * i, &y.d, y.qs, y.qh);
        }
        return;
    case Type::Q4_1:
        for (int64_t i = 0; i < nb32; i++) {
            block_q4_1& y = ((block_q4_1*)dst)[i];
            quant_affine<4>(src + 32 * i, &y.d, &y.m, y.qs, nullptr);
        }
        return;
    case Type::Q5_1:
        for (int64_t i = 0; i < nb32; i++) {
            block_q5_1& y = ((block_q5_1*)dst)[i];
            quant_affine<5>(src + 32 * i, &y.d, &y.m, y.qs, y.qh);
        }
        return;
    case Type::Q8_0:
        for (int64_t i = 0; i < nb32; i++) {
            block_q8_0& y = ((block_q8_0*)dst)[i];
            quant_q8(src + 32 * i, &y.d, y.qs, Q8Rounding::Runtime);
        }
        return;
    case Type::Q8_1:
        for (int64_t i = 0; i < nb32; i++) {
            block_q8_1& y = ((block_q8_1*)dst)[i];
            float d;
            const int sum = quant_q8(src + 32 * i, &y.d, y.qs, Q8Rounding::Runtime, &d);
            // s = d * sum, clamped to the fp16 range as current ggml does so it stays finite
            y.s = fp32_to_fp16(std::min(65504.0f, std::max(-65504.0f, sum * d)));
        }
        return;
    case Type::IQ4_NL:
        for (int64_t i = 0; i < nb32; i++) quant_iq4_nl(src + 32 * i, (block_iq4_nl*)dst + i);
        return;
    case Type::Q8_K:
        for (int64_t i = 0; i < n / QK_K; i++) quant_q8_K(src + QK_K * i, (block_q8_K*)dst + i);
        return;
    default: quantize_row_kquant(t, src, dst, n); return;
    }
}

// Q8_0 as model files hold it (the reference rounding; see quant_q8).
void quantize_row_q8_0_reference(const float* src, void* dst, int64_t n) {
    if (n % QK8_0) fail("quantize: row length %lld is not a multiple of %d for q8_0", (long long)n, QK8_0);
    for (int64_t i = 0; i < n / QK8_0; i++) {
        block_q8_0& y = ((block_q8_0*)dst)[i];
        qimpl::quant_q8(src + QK8_0 * i, &y.d, y.qs, qimpl::Q8Rounding::Reference);
    }
}

Type vec_dot_type(Type weight) {
    switch (weight) {
    case Type::F32: case Type::F16: case Type::BF16: return weight;
    case Type::Q4_0: case Type::Q5_0: case Type::Q8_0: case Type::IQ4_NL: return Type::Q8_0;
    case Type::Q4_1: case Type::Q5_1: return Type::Q8_1;
    case Type::Q2_K: case Type::Q3_K: case Type::Q4_K: case Type::Q5_K: case Type::Q6_K: return Type::Q8_K;
    default: fail("no dot product for weight type %s", type_info(weight).name);
    }
}

// ============================================================================================
// 6. SIMD kernels: CPU features and run-time dispatch (XCR0-checked), AVX2 / AVX-512 dot products
//
// The library is built for baseline x86-64; every SIMD function carries a target attribute and is
// only called after cpuid + xgetbv say the CPU and OS support it. The kernels are written once,
// as always-inline AVX2 templates, and instantiated inside four wrappers: AVX2, AVX-VNNI (the same
// 256-bit code with VEX-encoded vpdpbusd for the byte products), AVX-512 (same 256-bit code, but
// the compiler may use 32 registers and EVEX encodings) and AVX-512 VNNI (byte dot products via
// vpdpbusd). Needs <immintrin.h> included at global scope.
// ============================================================================================


// Define LLM_NO_SIMD before including to build the portable engine only (scalar kernels, as on
// non-x86 targets); tests/consumer_portable is built that way.
#if !defined(LLM_NO_SIMD) && (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define LLM_X86 1
#endif

namespace qimpl {

struct CpuFeatures {
    bool avx2 = false;     // AVX2 + FMA + F16C, OS saves YMM state
    bool avx512 = false;   // AVX-512 F/BW/VL/DQ, OS saves ZMM state
    bool vnni = false;     // AVX-512 VNNI
    bool avxvnni = false;  // AVX-VNNI (VEX-encoded vpdpbusd on 256-bit registers)
    bool zen2 = false;     // AMD family 17h (Zen to Zen 2) or Hygon 18h: the AVX2 tiles' prefetch hint
    bool amd = false;      // AMD or Hygon: the K-quant tiles' near prefetch (prefetch_near)
};

inline CpuFeatures detect_cpu() {
    CpuFeatures f;
#ifdef LLM_X86
    auto cpuid = [](uint32_t leaf, uint32_t sub, uint32_t r[4]) {
        __asm__ __volatile__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
    };
    uint32_t r[4];
    cpuid(0, 0, r);
    const uint32_t max_leaf = r[0];
    const bool amd = (r[1] == 0x68747541 && r[3] == 0x69746e65 && r[2] == 0x444d4163) ||  // "Auth" "enti" "cAMD"
                     (r[1] == 0x6f677948 && r[3] == 0x6e65476e && r[2] == 0x656e6975);    // "Hygo" "nGen" "uine"
    if (max_leaf < 7) return f;
    cpuid(1, 0, r);
    const uint32_t family = (r[0] >> 8 & 0xF) + ((r[0] >> 8 & 0xF) == 0xF ? (r[0] >> 20 & 0xFF) : 0);
    f.zen2 = amd && (family == 0x17 || family == 0x18);
    f.amd = amd;
    const bool osxsave = r[2] >> 27 & 1, avx = r[2] >> 28 & 1, fma = r[2] >> 12 & 1, f16c = r[2] >> 29 & 1;
    if (!osxsave || !avx) return f;
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    const uint64_t xcr0 = ((uint64_t)hi << 32) | lo;
    const bool os_ymm = (xcr0 & 0x6) == 0x6;     // SSE + AVX state
    const bool os_zmm = (xcr0 & 0xE6) == 0xE6;   // + opmask, ZMM_Hi256, Hi16_ZMM
    cpuid(7, 0, r);
    const uint32_t b = r[1], c = r[2];
    f.avx2 = os_ymm && fma && f16c && (b >> 5 & 1);
    f.avx512 = f.avx2 && os_zmm && (b >> 16 & 1) && (b >> 17 & 1) && (b >> 30 & 1) && (b >> 31 & 1);
    f.vnni = f.avx512 && (c >> 11 & 1);
    cpuid(7, 1, r);
    f.avxvnni = f.avx2 && (r[0] >> 4 & 1);
#endif
    return f;
}

inline const CpuFeatures& cpu() {
    static const CpuFeatures f = detect_cpu();
    return f;
}

using DotFn = float (*)(int64_t n, const void* x, const void* y);

inline DotFn scalar_dot(Type t) {
    switch (t) {
    case Type::F32: return dot_f32;
    case Type::F16: return dot_half<fp16_to_fp32>;
    case Type::BF16: return dot_half<bf16_to_fp32>;
    case Type::Q4_0: return dot_q4_0;
    case Type::Q4_1: return dot_q4_1;
    case Type::Q5_0: return dot_q5_0;
    case Type::Q5_1: return dot_q5_1;
    case Type::Q8_0: return dot_q8_0;
    case Type::IQ4_NL: return dot_iq4_nl;
    case Type::Q2_K: return dot_q2_K;
    case Type::Q3_K: return dot_q3_K;
    case Type::Q4_K: return dot_q45_K<block_q4_K>;
    case Type::Q5_K: return dot_q45_K<block_q5_K>;
    case Type::Q6_K: return dot_q6_K;
    default: fail("no dot product for weight type %s", type_info(t).name);
    }
}

// A tile kernel computes out[c*ld] = dot(the weight row W, column c of A) for NC activation columns.
// For q8_0 / q8_1 activations, S holds each column's block scales as floats (S + c*s_stride: the nb
// values of d, then for q8_1 the nb values of s), converted once per matmul instead of per row.
using TileFn = void (*)(int64_t n, const uint8_t* W, const uint8_t* A, size_t a_stride, const float* S, int64_t s_stride,
                        float* out, int64_t ld);
constexpr int kTileWidths[] = {1, 2, 4, 8};  // NC of tile[type][0..3]
struct IsaKernels {
    TileFn tile[kTypeCount][4] = {};
};

#ifdef LLM_X86
#define LLM_AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define LLM_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#define LLM_AVXVNNI_FN __attribute__((target("avx2,fma,f16c,avxvnni")))
#define LLM_AVX512_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define LLM_AVX512VNNI_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define LLM_AVX512_INLINE __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) inline
#define LLM_AVX512VNNI_INLINE \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"), always_inline)) inline
// GCC 12 warns about the _mm512_undefined_* inside its 512-bit conversion and broadcast intrinsics
// (a false alarm); the 512-bit kernels are wrapped in these. Clang has no -Wmaybe-uninitialized (and
// warns about the unknown group).
#if defined(__clang__)
#define LLM_AVX512_WARNINGS_OFF \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#else
#define LLM_AVX512_WARNINGS_OFF                                                                    \
    _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")      \
        _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#endif
#define LLM_AVX512_WARNINGS_ON _Pragma("GCC diagnostic pop")

// Sum of unsigned bytes a times signed bytes b, in groups of four, into eight int32 lanes.
// madd_add: acc + pairwise sums of int16 a times int16 b, into eight int32 lanes.
// kVnni: dpbusd(acc, a, b) (acc + the same sums, exact in int32) exists.
struct OpsAVX2 {
    static constexpr bool kVnni = false;
    static constexpr int kLocality = 2;  // of the weight stream's prefetches (prefetch_ahead)
    static constexpr bool kNear = false;  // the K16 tiles' near prefetch (prefetch_near)
    static constexpr bool kHardwareStreamQ8 = false;  // Q8_0's one-column tile without prefetches (RowsB32::run)
    static LLM_AVX2_INLINE __m256i dot_us(__m256i a, __m256i b) {
        return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
    }
    static LLM_AVX2_INLINE __m256i madd_add(__m256i acc, __m256i a, __m256i b) {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
    }
};
struct OpsAVX2Nta : OpsAVX2 {
    static constexpr int kLocality = 0;  // prefetchnta, on Zen 2 and older (see prefetch_ahead)
};
struct OpsAVX2Near : OpsAVX2 {  // AMD after Zen 2
    static constexpr bool kNear = true;  // the K16 tiles (see prefetch_near)
    static constexpr bool kHardwareStreamQ8 = true;
};
struct OpsVNNI {
    // Not always_inline: they become inlinable only once the AVX2 kernel around them has been
    // inlined into the VNNI wrapper.
    static inline LLM_AVX512VNNI_FN __m256i dot_us(__m256i a, __m256i b) {
        return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
    }
    static inline LLM_AVX512VNNI_FN __m256i madd_add(__m256i acc, __m256i a, __m256i b) {
        return _mm256_dpwssd_epi32(acc, a, b);
    }
};
// AVX-VNNI: the same instructions VEX-encoded (no AVX-512 needed); wrappers as in OpsVNNI.
struct OpsAVXVNNI {
    static constexpr bool kVnni = true;
    static constexpr int kLocality = 2;
    static constexpr bool kNear = false;
    static constexpr bool kHardwareStreamQ8 = false;
    static inline LLM_AVXVNNI_FN __m256i dpbusd(__m256i acc, __m256i a, __m256i b) { return _mm256_dpbusd_avx_epi32(acc, a, b); }
    static inline LLM_AVXVNNI_FN __m256i dot_us(__m256i a, __m256i b) { return dpbusd(_mm256_setzero_si256(), a, b); }
    static inline LLM_AVXVNNI_FN __m256i madd_add(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
};

LLM_AVX2_INLINE float h2f(uint16_t h) { return _cvtsh_ss(h); }

LLM_AVX2_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Signed x signed byte dot: move x's sign onto y so the unsigned x signed instruction applies.
template <class Ops>
LLM_AVX2_INLINE __m256i dot_ss(__m256i x, __m256i y) {
    return Ops::dot_us(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

// 16 bytes of nibbles -> 32 bytes: low nibbles (values 0..15) first, then high nibbles.
LLM_AVX2_INLINE __m256i nibbles32(const uint8_t* qs) {
    const __m128i t = _mm_loadu_si128((const __m128i*)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

// 32 bits -> 32 bytes, 0xFF where the bit is set.
LLM_AVX2_INLINE __m256i bits32(const uint8_t* p) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)load_u32(p)), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

LLM_AVX2_INLINE __m256i load256(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }

// ---- per-type kernels ------------------------------------------------------------------------
// Every weight type K supplies
//   D decode(const X* x)                     the weight block unpacked into registers
//   dot<Ops>(d, y, s, nb, acc, macc)         acc (8 lanes) += (block) . (activation block y); s:
//                                            the column's float scales at this block (q8_0/q8_1
//                                            activations only), macc: a scalar side sum (min terms)
// so that a tile unpacks each weight block once and reuses it for all its activation columns.
// The per-(row, column) arithmetic does not depend on the tile width, so every tile gives the
// bit-identical result of vec_dot.

struct NoTail {
    static constexpr bool kActScales = false;  // reads the float scales S (q8_0 / q8_1 activations)
    static float tail(const uint8_t*, const uint8_t*, int64_t, int64_t) { return 0; }
};

// 32-value blocks (Q4_0 .. IQ4_NL): the quants become 32 bytes. Signed types keep |q| and q (whose
// signs are moved onto the activations); affine types (Q4_1, Q5_1) keep unsigned q and a min.
template <class B, class Act, bool Affine>
struct Block32 : NoTail {
    using X = B; using Y = Act; static constexpr int kBlock = 32;
    static constexpr bool kActScales = true;
    struct D { __m256i q, sign; __m256 d; float m; };  // d: the block scale in every lane
    static LLM_AVX2_INLINE D signed_block(__m256i q, uint16_t d) {
        return {_mm256_sign_epi8(q, q), q, _mm256_set1_ps(h2f(d)), 0.0f};
    }
    static LLM_AVX2_INLINE D affine_block(__m256i q, uint16_t d, uint16_t m) {
        return {q, _mm256_setzero_si256(), _mm256_set1_ps(h2f(d)), h2f(m)};
    }
    // s: this column's scales at this block (s[0] = d, s[nb] = s of q8_1); the min terms m * s go to
    // their own scalar sum. The rounding steps are ggml's (d_x * d_y first), which the golden
    // tests see: a last-bit difference here flips later activation quants.
    template <class Ops>
    static LLM_AVX2_INLINE void dot(const D& d, const Y* y, const float* s, int64_t nb, __m256& acc, float& macc) {
        __m256i p;
        if constexpr (Affine) p = Ops::dot_us(d.q, load256(y->qs));
        else p = Ops::dot_us(d.q, _mm256_sign_epi8(load256(y->qs), d.sign));
        // d_x * d_y as a vector product (the same rounding as the scalar one, no shuffle needed)
        acc = _mm256_fmadd_ps(_mm256_mul_ps(d.d, _mm256_broadcast_ss(s)), _mm256_cvtepi32_ps(p), acc);
        if constexpr (Affine) macc += d.m * s[nb];
    }
};
struct K_q4_0 : Block32<block_q4_0, block_q8_0, false> {
    static LLM_AVX2_INLINE D decode(const X* x) {
        return signed_block(_mm256_sub_epi8(nibbles32(x->qs), _mm256_set1_epi8(8)), x->d);
    }
};
struct K_q4_1 : Block32<block_q4_1, block_q8_1, true> {
    static LLM_AVX2_INLINE D decode(const X* x) { return affine_block(nibbles32(x->qs), x->d, x->m); }
};
struct K_q5_0 : Block32<block_q5_0, block_q8_0, false> {
    static LLM_AVX2_INLINE D decode(const X* x) {
        // a clear fifth bit means value - 16 < 0: set the byte's high nibble to make it negative
        const __m256i hi = _mm256_andnot_si256(bits32(x->qh), _mm256_set1_epi8((char)0xF0));
        return signed_block(_mm256_or_si256(nibbles32(x->qs), hi), x->d);
    }
};
struct K_q5_1 : Block32<block_q5_1, block_q8_1, true> {
    static LLM_AVX2_INLINE D decode(const X* x) {
        const __m256i hi = _mm256_and_si256(bits32(x->qh), _mm256_set1_epi8(0x10));
        return affine_block(_mm256_or_si256(nibbles32(x->qs), hi), x->d, x->m);
    }
};
struct K_q8_0 : Block32<block_q8_0, block_q8_0, false> {
    static LLM_AVX2_INLINE D decode(const X* x) { return signed_block(load256(x->qs), x->d); }
};
struct K_iq4_nl : Block32<block_iq4_nl, block_q8_0, false> {
    static LLM_AVX2_INLINE D decode(const X* x) {
        const __m128i values = _mm_loadu_si128((const __m128i*)kIQ4NLValues);
        const __m128i q4 = _mm_loadu_si128((const __m128i*)x->qs), m4 = _mm_set1_epi8(0x0F);
        const __m256i q = _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q4, 4), m4)),
                                           _mm_shuffle_epi8(values, _mm_and_si128(q4, m4)));
        return signed_block(q, x->d);
    }
};

// K-quants: a block unpacks to eight vectors of 32 unsigned quants (values 32k..32k+31), eight
// vectors of int16 scales (one scale per 16-value half), and 16 int16 "mins" that multiply the q8_K
// block's 16-value sums (bsums). The mins either are subtracted in float with their own factor
// (Q2_K, Q4_K, Q5_K: dmin) or, for types stored with an offset (Q3_K +4, Q6_K +32), are the scales
// themselves and come off the integer sum shifted by log2(offset).
struct UnpackedKQuant {
    __m256i q[8], sc[8], mins;
    __m256 vd, vdmin;  // d and dmin in every lane
};
LLM_AVX2_INLINE __m256i shr_mask(__m256i v, int shift, char mask) {
    return _mm256_and_si256(_mm256_srli_epi16(v, shift), _mm256_set1_epi8(mask));
}
// Scales from 16 int16 values, one per 16-value half.
LLM_AVX2_INLINE void scales16(UnpackedKQuant& d, const int16_t* sc16) {
    for (int k = 0; k < 8; k++) d.sc[k] = _mm256_set_m128i(_mm_set1_epi16(sc16[2 * k + 1]), _mm_set1_epi16(sc16[2 * k]));
}

template <int OffsetShift>  // 0: float mins; else the integer offset 2^OffsetShift
struct KQuant : NoTail {
    using Y = block_q8_K; static constexpr int kBlock = QK_K;
    using D = UnpackedKQuant;
    template <class Ops>
    static LLM_AVX2_INLINE void dot(const D& d, const Y* y, const float*, int64_t, __m256& acc, float&) {
        __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) sumi = Ops::madd_add(sumi, d.sc[k], _mm256_maddubs_epi16(d.q[k], load256(y->qs + 32 * k)));
        const __m256i mins = _mm256_madd_epi16(d.mins, load256(y->bsums));
        // y->d * d.d as a vector product of a memory broadcast and the block's scale in every
        // lane: the same rounding as the scalar product, without a scalar multiply and a
        // register broadcast per column.
        const __m256 yd = _mm256_broadcast_ss(&y->d);
        if constexpr (OffsetShift) {
            sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(mins, OffsetShift));
            acc = _mm256_fmadd_ps(_mm256_mul_ps(yd, d.vd), _mm256_cvtepi32_ps(sumi), acc);
        } else {
            acc = _mm256_fmadd_ps(_mm256_mul_ps(yd, d.vd), _mm256_cvtepi32_ps(sumi), acc);
            acc = _mm256_fnmadd_ps(_mm256_mul_ps(yd, d.vdmin), _mm256_cvtepi32_ps(mins), acc);
        }
    }
};

struct K_q2_K : KQuant<0> {
    using X = block_q2_K;
    static LLM_AVX2_INLINE D decode(const X* x) {
        D d;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) d.q[k] = shr_mask(load256(x->qs + 32 * (k / 4)), 2 * (k % 4), 3);
        const __m128i s = _mm_loadu_si128((const __m128i*)x->scales), m4 = _mm_set1_epi8(0x0F);
        alignas(16) int16_t sc16[16];
        _mm256_store_si256((__m256i*)sc16, _mm256_cvtepu8_epi16(_mm_and_si128(s, m4)));
        scales16(d, sc16);
        d.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
        d.vd = _mm256_set1_ps(h2f(x->d));
        d.vdmin = _mm256_set1_ps(h2f(x->dmin));
        return d;
    }
};
struct K_q3_K : KQuant<2> {
    using X = block_q3_K;
    // value + 4 = low two bits | high bit << 2, in 0..7
    static LLM_AVX2_INLINE D decode(const X* x) {
        D d;
        const __m256i hm = load256(x->hmask);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m256i lo = shr_mask(load256(x->qs + 32 * (k / 4)), 2 * (k % 4), 3);
            d.q[k] = _mm256_or_si256(lo, _mm256_slli_epi16(shr_mask(hm, k, 1), 2));
        }
        int8_t sc8[16];
        unpack_scales_q3k(x->scales, sc8);
        alignas(32) int16_t sc16[16];
        for (int j = 0; j < 16; j++) sc16[j] = sc8[j];
        scales16(d, sc16);
        d.mins = _mm256_load_si256((const __m256i*)sc16);
        d.vd = _mm256_set1_ps(h2f(x->d));
        d.vdmin = _mm256_setzero_ps();
        return d;
    }
};
// Q4_K / Q5_K: the 12 scale bytes hold eight 6-bit scales and eight 6-bit mins; unpacked four at a
// time in 32-bit words (the layout of unpack_scale_min_k4).
template <class B, bool HasHigh>
struct K_q45_K : KQuant<0> {
    using X = B;
    static LLM_AVX2_INLINE D decode(const X* x) {
        D d;
        uint32_t a[3];
        memcpy(a, x->scales, 12);
        const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
        const uint64_t sc = (uint64_t)(a[0] & lo6) | (uint64_t)((a[2] & lo4) | ((a[0] >> 6) & lo2) << 4) << 32;
        const uint64_t mn = (uint64_t)(a[1] & lo6) | (uint64_t)(((a[2] >> 4) & lo4) | ((a[1] >> 6) & lo2) << 4) << 32;
        const __m256i v[4] = {load256(x->qs), load256(x->qs + 32), load256(x->qs + 64), load256(x->qs + 96)};
        __m256i qh = _mm256_setzero_si256();
        if constexpr (HasHigh) qh = load256(x->qh);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i r = (k & 1) ? shr_mask(v[k / 2], 4, 0x0F) : _mm256_and_si256(v[k / 2], _mm256_set1_epi8(0x0F));
            if constexpr (HasHigh) r = _mm256_or_si256(r, _mm256_slli_epi16(shr_mask(qh, k, 1), 4));
            d.q[k] = r;
            d.sc[k] = _mm256_set1_epi16((int16_t)((sc >> (8 * k)) & 0xFF));
        }
        // each min covers two 16-value sums
        const __m128i dup = _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
        d.mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128((long long)mn), dup));
        d.vd = _mm256_set1_ps(h2f(x->d));
        d.vdmin = _mm256_set1_ps(h2f(x->dmin));
        return d;
    }
};
using K_q4_K = K_q45_K<block_q4_K, false>;
using K_q5_K = K_q45_K<block_q5_K, true>;
struct K_q6_K : KQuant<5> {
    using X = block_q6_K;
    // value + 32 = low nibble | two high bits << 4, in 0..63
    static LLM_AVX2_INLINE D decode(const X* x) {
        D d;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const int chunk = k / 4, sub = k % 4;
            const __m256i lo = load256(x->ql + 64 * chunk + 32 * (sub & 1));
            const __m256i q4 = (sub & 2) ? shr_mask(lo, 4, 0x0F) : _mm256_and_si256(lo, _mm256_set1_epi8(0x0F));
            const __m256i q2 = shr_mask(load256(x->qh + 32 * chunk), 2 * sub, 3);
            d.q[k] = _mm256_or_si256(q4, _mm256_slli_epi16(q2, 4));
            d.sc[k] = _mm256_set_m128i(_mm_set1_epi16(x->scales[2 * k + 1]), _mm_set1_epi16(x->scales[2 * k]));
        }
        d.mins = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)x->scales));
        d.vd = _mm256_set1_ps(h2f(x->d));
        d.vdmin = _mm256_setzero_ps();
        return d;
    }
};

// Float types: 8 values per "block"; a row tail that is not a multiple of 8 goes through the
// scalar dot product.
template <class E, DotFn Scalar, int Bytes, class Self>
struct K_float {
    struct X { E v[8]; };
    using Y = X;
    using D = __m256;
    static constexpr int kBlock = 8;
    static constexpr bool kActScales = false;
    static float tail(const uint8_t* x, const uint8_t* y, int64_t from, int64_t n) {
        return Scalar(n - from, x + from * Bytes, y + from * Bytes);
    }
    static LLM_AVX2_INLINE D decode(const X* x) { return Self::load(x->v); }
    template <class Ops>
    static LLM_AVX2_INLINE void dot(D d, const Y* y, const float*, int64_t, __m256& acc, float&) {
        acc = _mm256_fmadd_ps(d, Self::load(y->v), acc);
    }
};
struct K_f32 : K_float<float, dot_f32, 4, K_f32> {
    static LLM_AVX2_INLINE __m256 load(const float* p) { return _mm256_loadu_ps(p); }
};
struct K_f16 : K_float<uint16_t, dot_half<fp16_to_fp32>, 2, K_f16> {
    static LLM_AVX2_INLINE __m256 load(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
};
struct K_bf16 : K_float<uint16_t, dot_half<bf16_to_fp32>, 2, K_bf16> {
    static LLM_AVX2_INLINE __m256 load(const uint16_t* p) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
    }
};

// The tile: one weight row against NC activation columns; each weight block is unpacked once, the
// activation blocks come from L1 after the first row of a row group.
// 8 KiB: on Zen 2 decode's 1-column tiles streamed Q6_K / Q4_K 13-17 % / 8-14 % faster than at 2 KiB
// (Llama-3.2-1B tg +12 %, docs/performance.md session 13); on the Intel host 6 KiB changed nothing.
constexpr int kPrefetchBytes = 8192;
// Prefetches the cache lines of `bytes` bytes, kPrefetchBytes ahead of p (the interleaved kernels'
// weight stream: a group's blocks are consecutive, and the next group follows), with
// __builtin_prefetch's locality (2: prefetcht1, into L2; 0: prefetchnta).
// prefetcht1 rather than t0: on a Sapphire Rapids-class Xeon, 1-column tiles streaming 1 GiB from
// DRAM (bench-kernels STREAM_MIB=1024, one thread) read Q4_K 11.6 -> 14.2-15.3 GB/s, Q8_0 10.2 -> 14.2
// (AVX2) and 14.3 -> 15.3 (AVX-512), Q4_1 +30-35 %, Q6_K +5 %; -t 2 tg64 Llama-1B shape 24 -> 31,
// MoE bench 114-119 -> 139-143, Gemma 3 107 -> 119; pp512 unchanged, MoE pp8 +17 %
// (docs/performance.md, session 15). On Zen 2 t1 was no better than t0 (session 14).
template <size_t Bytes, int Locality = 2, int Distance = kPrefetchBytes>
LLM_AVX2_INLINE void prefetch_ahead(const void* p) {
#pragma GCC unroll 64
    for (size_t o = 0; o < Bytes; o += 64) __builtin_prefetch((const char*)p + Distance + o, 0, Locality);
}
// Prefetches, kPrefetchBytes ahead, each line whose first byte lies in [p, p + bytes), so consecutive
// spans prefetch every line once: the 16-value K types' sub-blocks (210 / 110 / 84 bytes for Q6_K /
// Q3_K / Q2_K) split lines, and prefetch_ahead's whole-line steps issue 22 / 16 / 52 % more prefetches
// than lines. Sapphire Rapids-class Xeon, one column streaming 1 GiB: Q6_K 11.3 -> 13.1-13.3 GB/s (AVX2),
// 12.8 -> 13.9-14.2 (AVX-512), Q2_K +10 %, Q3_K +3-6 %; Llama-1B shape tg +2-5 % (session 15). Not for
// the 32-value types: there the same change lost up to 15 % (Q5_0 on AVX2).
template <int Locality = 2, int Distance = kPrefetchBytes>
LLM_AVX2_INLINE void prefetch_span(const void* p, size_t bytes) {
    const uintptr_t from = (uintptr_t)p + Distance, to = from + bytes;
    for (uintptr_t a = (from + 63) & ~(uintptr_t)63; a < to; a += 64) __builtin_prefetch((const void*)a, 0, Locality);
}
// With Near (the AVX-512 K-quant tiles on AMD), the lines of [p, p + bytes) kNearPrefetchBytes ahead
// once more, into L1 (prefetcht0), beside the far prefetch into L2. Zen 4, one column over 96 MiB on
// two threads, alternating pass by pass with a stream sum of the same buffer: Q6_K 83-84 -> 93 % of
// the sum's bandwidth, Q4_K 86-87 -> 88-89 %; Llama-1B shape decode in one process, alternating every
// 32 tokens for 10 rounds: 31.8 / 31.2 -> 33.0 / 32.4 t/s (session 27). 1 KiB ahead did as well, 256
// and 512 bytes a little less. The AVX2 K16 tiles (RowsK16 on OpsAVX2Near) do the same on AMD after
// Zen 2, measured with LLM_ISA=avx2 on that Zen 4: Q6_K 85 -> 94 % of the sum; the AVX2 Q4_K tile lost
// 1-3 % with it and goes without. Not measured on Intel or Zen 2, whose tiles are unchanged.
constexpr int kNearPrefetchBytes = 2048;
template <bool Near>
LLM_AVX2_INLINE void prefetch_near(const void* p, size_t bytes) {
    if constexpr (Near) prefetch_span<3, kNearPrefetchBytes>(p, bytes);
}
// Sub-block sb of the 16 in a K16 group B, by spans; with prefetchnta (Zen 2's AVX2 tiles) whole-line
// steps as measured on Zen 2 in session 14 (the spans are unmeasured there).
template <int Locality = 2, class G>
LLM_AVX2_INLINE void prefetch_sub_block16(const G& B, int sb) {
    const char* sub_block = (const char*)&B + sb * (sizeof(G) / 16);
    if constexpr (Locality == 0) prefetch_ahead<sizeof(G) / 16, 0>(sub_block);
    else prefetch_span<Locality>(sub_block, sizeof(G) / 16);
}
// The AVX2 tiles' prefetches take their locality from the Ops: prefetcht1, and prefetchnta on AMD
// family 17h (OpsAVX2Nta, chosen where the tiles are picked, avx2_tiles). Zen 2, -t 2, interleaved against
// prefetcht0: tg64 SmolLM2 Q4_1 +5 %, Gemma 3 +3 %, SmolLM2-shape Q8_0 / Q4_K_M +3 %, Llama-1B shape
// equal; pp512 SmolLM2 shape +2-8 % (docs/performance.md, session 14). On the Xeon prefetchnta made
// LLM_ISA=avx2 decode 2.7x slower on SmolLM2 Q4_1 and 1.6x on the Llama-1B shape (session 15). On a
// Zen 4 EPYC (family 19h, as Zen 3), LLM_ISA=avx2 decode: beside a compile job on the same cores
// prefetcht1 was well ahead (tg64 Llama-1B shape 20-21.5 -> 25-29, SmolLM2 Q4_1 133-156 -> 167-184, MoE
// 90 -> 102-108); quiet, alternating every 16-64 tokens in one process, level (Llama-1B 38.1 / 36.7 ->
// 40.3 / 37.2, SmolLM2 Q4_1 150 -> 158, Gemma 3 108 -> 101; session 26). A run-time test of the vendor
// per group instead of two instantiations cost Llama-1B tg 10 % there.
// hsum8 of eight registers at once, in its order of additions (lane k + lane k + 4, then
// (0 + 2) + (1 + 3)): element e of the result is hsum8(v[kHsum8x8Order[e]]). The last two steps take
// s[i], the s_k = lane k + lane k + 4 of v[2i] (low half) and v[2i + 1] (high half), so a caller
// that forms those its own way (AVX-512's store_sums4) shares them.
constexpr int kHsum8x8Order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
LLM_AVX2_INLINE __m256 hsum8x8_of_halves(const __m256 s[4]) {
    // per half: [s0 + s2, s1 + s3] of s[2j]'s, then of s[2j + 1]'s
    __m256 t[2];
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++)
        t[j] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * j], s[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(s[2 * j], s[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
LLM_AVX2_INLINE __m256 hsum8x8(const __m256 v[8]) {
    __m256 s[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        s[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20), _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    return hsum8x8_of_halves(s);
}
// NR > 1: NR weight rows, w_stride bytes apart, at once (each activation block is loaded once per
// row from L1, and the NR x NC sums are independent chains); out[c * ld + r]. The per-(row, column)
// arithmetic is that of NR = 1.
template <class K, class Ops, int NC, int NR = 1>
LLM_AVX2_INLINE void tile(int64_t n, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss, float* out,
                          int64_t ld, size_t w_stride = 0) {
    using X = typename K::X;
    using Y = typename K::Y;
    const int64_t nb = n / K::kBlock;
    __m256 acc[NR][NC];
    float macc[NR][NC];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) acc[r][c] = _mm256_setzero_ps(), macc[r][c] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const X* x = (const X*)(W + r * w_stride);
            // Weight rows are streamed once (decode) or a few times; prefetch ahead of the hardware
            // prefetcher, which only ramps up slowly on these short runs. Past the row end this runs
            // into the next row, which is the one read next.
            _mm_prefetch((const char*)(x + b) + kPrefetchBytes, _MM_HINT_T0);
            if constexpr (sizeof(X) > 64) _mm_prefetch((const char*)(x + b) + kPrefetchBytes + 64, _MM_HINT_T0);
            if constexpr (sizeof(X) > 128) _mm_prefetch((const char*)(x + b) + kPrefetchBytes + 128, _MM_HINT_T0);
            const typename K::D d = K::decode(x + b);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                const float* s = K::kActScales ? S + c * ss + b : nullptr;
                K::template dot<Ops>(d, (const Y*)(A + c * as) + b, s, nb, acc[r][c], macc[r][c]);
            }
        }
    }
    if constexpr (NR * NC == 8) {
        if (nb * K::kBlock == n) {  // no tail: the eight sums in one shuffle network (short rows: attention scores)
            alignas(32) float sums[8], added[8];
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) added[e] = macc[kHsum8x8Order[e] / NC][kHsum8x8Order[e] % NC];
            _mm256_store_ps(sums, _mm256_add_ps(hsum8x8(&acc[0][0]), _mm256_load_ps(added)));
#pragma GCC unroll 8
            for (int e = 0; e < 8; e++) out[kHsum8x8Order[e] % NC * ld + kHsum8x8Order[e] / NC] = sums[e];
            return;
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            float s = hsum8(acc[r][c]) + macc[r][c];
            if (nb * K::kBlock < n) s += K::tail(W + r * w_stride, A + c * as, nb * K::kBlock, n);
            out[c * ld + r] = s;
        }
}

template <class K, int NC>
LLM_AVX2_FN void tile_avx2(int64_t n, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss, float* out,
                           int64_t ld) {
    tile<K, OpsAVX2, NC>(n, W, A, as, S, ss, out, ld);
}
template <class K, int NC>
LLM_AVXVNNI_FN void tile_avxvnni(int64_t n, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss, float* out,
                                 int64_t ld) {
    tile<K, OpsAVXVNNI, NC>(n, W, A, as, S, ss, out, ld);
}
template <class K, int NC>
LLM_AVX512_FN void tile_avx512(int64_t n, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                               float* out, int64_t ld) {
    tile<K, OpsAVX2, NC>(n, W, A, as, S, ss, out, ld);
}
template <class K, int NC>
LLM_AVX512VNNI_FN void tile_avx512vnni(int64_t n, const uint8_t* W, const uint8_t* A, size_t as, const float* S,
                                       int64_t ss, float* out, int64_t ld) {
    tile<K, OpsVNNI, NC>(n, W, A, as, S, ss, out, ld);
}

// ---- activation quantizers (q8_0 / q8_1 with the run-time rounding, q8_K), bit-exact with the
// scalar ones: the same float products, and cvtps rounds half to even like nearbyintf/nearest_int.

LLM_AVX2_INLINE __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
LLM_AVX2_INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
// Rounds 32 floats times `scale` to int8 (|values| <= 127.5 after scaling) at q; returns their sum.
LLM_AVX2_INLINE __m256i round32(const float* x, __m256 scale, int8_t* q) {
    __m256i v[4];
    for (int u = 0; u < 4; u++) v[u] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * u), scale));
    for (int u = 0; u < 4; u++) v[u] = _mm256_min_epi32(v[u], _mm256_set1_epi32(127));
    // packs work within 128-bit lanes; the permute restores the order
    const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    const __m256i bytes = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i*)q, bytes);
    return bytes;
}
LLM_AVX2_FN void quant_q8_rt_avx2(const float* x, int64_t nb, block_q8_0* y0, block_q8_1* y1) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        __m256 m = abs8(_mm256_loadu_ps(x));
        for (int u = 1; u < 4; u++) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + 8 * u)));
        const float amax = hmax8(m), d = amax / 127, id = amax != 0.0f ? 127.f / amax : 0.0f;
        int8_t* qs = y0 ? y0[i].qs : y1[i].qs;
        const __m256i bytes = round32(x, _mm256_set1_ps(id), qs);
        if (y0) {
            y0[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);  // as fp32_to_fp16 (both round to nearest even)
        } else {
            y1[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
            const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes);
            const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
            const int sum = _mm_cvtsi128_si32(t);
            y1[i].s = _cvtss_sh(std::min(65504.0f, std::max(-65504.0f, sum * d)), _MM_FROUND_TO_NEAREST_INT);
        }
    }
}
// The same, a block in two 512-bit registers: vpmovsdb saturates as min(127) and the packs do (the
// scaled values are >= -127.5, so nothing reaches the low end).
LLM_AVX512_WARNINGS_OFF
LLM_AVX512_FN void quant_q8_rt_avx512(const float* x, int64_t nb, block_q8_0* y0, block_q8_1* y1) {
    for (int64_t i = 0; i < nb; i++, x += 32) {
        const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        const float d = amax / 127, id = amax != 0.0f ? 127.f / amax : 0.0f;
        const __m512 scale = _mm512_set1_ps(id);
        const __m512i q_lo = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(lo, scale)), _mm512_set1_epi32(127));
        const __m512i q_hi = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(hi, scale)), _mm512_set1_epi32(127));
        int8_t* qs = y0 ? y0[i].qs : y1[i].qs;
        _mm_storeu_si128((__m128i*)qs, _mm512_cvtsepi32_epi8(q_lo));
        _mm_storeu_si128((__m128i*)(qs + 16), _mm512_cvtsepi32_epi8(q_hi));
        if (y0) {
            y0[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        } else {
            y1[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
            const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
            y1[i].s = _cvtss_sh(std::min(65504.0f, std::max(-65504.0f, sum * d)), _MM_FROUND_TO_NEAREST_INT);
        }
    }
}
LLM_AVX512_WARNINGS_ON
LLM_AVX2_FN void quant_f16_avx2(const float* x, int64_t n, uint16_t* y) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i*)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = fp32_to_fp16(x[i]);
}
LLM_AVX2_FN void quant_q8_K_avx2(const float* x, int64_t nb, block_q8_K* y) {
    for (int64_t i = 0; i < nb; i++, x += QK_K, y++) {
        __m256 m = _mm256_setzero_ps();
        for (int u = 0; u < QK_K / 8; u++) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + 8 * u)));
        const float amax = hmax8(m);
        if (!amax) {
            memset(y, 0, sizeof *y);
            continue;
        }
        // the first value of largest magnitude, as the scalar scan picks it
        int j = 0;
        for (int u = 0; u < QK_K / 8; u++) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(x + 8 * u)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (hit) {
                j = 8 * u + __builtin_ctz(hit);
                break;
            }
        }
        const float iscale = -127.f / x[j];
        for (int g = 0; g < QK_K / 32; g++) {
            const __m256i bytes = round32(x + 32 * g, _mm256_set1_ps(iscale), y->qs + 32 * g);
            // two 16-value sums per 32 quants
            const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes);   // 16 pairs
            const __m128i s = _mm_add_epi16(_mm256_castsi256_si128(s16), _mm_srli_si128(_mm256_castsi256_si128(s16), 8));
            const __m128i h = _mm_add_epi16(_mm256_extracti128_si256(s16, 1), _mm_srli_si128(_mm256_extracti128_si256(s16, 1), 8));
            // s: four partial sums of values 0..15 (lanes 0..3); h: of values 16..31
            __m128i both = _mm_unpacklo_epi64(s, h);
            both = _mm_hadd_epi16(both, both);
            both = _mm_hadd_epi16(both, both);
            y->bsums[2 * g] = (int16_t)_mm_extract_epi16(both, 0);
            y->bsums[2 * g + 1] = (int16_t)_mm_extract_epi16(both, 1);
        }
        y->d = 1 / iscale;
    }
}

enum Variant { kAVX2, kAVXVNNI, kAVX512, kAVX512VNNI };
template <class K, int V, int NC>
TileFn pick_tile() {
    if constexpr (V == kAVX2) return tile_avx2<K, NC>;
    else if constexpr (V == kAVXVNNI) return tile_avxvnni<K, NC>;
    else if constexpr (V == kAVX512) return tile_avx512<K, NC>;
    else return tile_avx512vnni<K, NC>;
}
template <class K, int V>
void set_tiles(IsaKernels& k, Type t) {
    static_assert(kTileWidths[0] == 1 && kTileWidths[1] == 2 && kTileWidths[2] == 4 && kTileWidths[3] == 8, "tile widths");
    k.tile[(int)t][0] = pick_tile<K, V, 1>();
    k.tile[(int)t][1] = pick_tile<K, V, 2>();
    k.tile[(int)t][2] = pick_tile<K, V, 4>();
    k.tile[(int)t][3] = pick_tile<K, V, 8>();
}
template <int V>
IsaKernels make_kernels() {
    IsaKernels k;
    set_tiles<K_f32, V>(k, Type::F32);
    set_tiles<K_f16, V>(k, Type::F16);
    set_tiles<K_bf16, V>(k, Type::BF16);
    set_tiles<K_q4_0, V>(k, Type::Q4_0);
    set_tiles<K_q4_1, V>(k, Type::Q4_1);
    set_tiles<K_q5_0, V>(k, Type::Q5_0);
    set_tiles<K_q5_1, V>(k, Type::Q5_1);
    set_tiles<K_q8_0, V>(k, Type::Q8_0);
    set_tiles<K_iq4_nl, V>(k, Type::IQ4_NL);
    set_tiles<K_q2_K, V>(k, Type::Q2_K);
    set_tiles<K_q3_K, V>(k, Type::Q3_K);
    set_tiles<K_q4_K, V>(k, Type::Q4_K);
    set_tiles<K_q5_K, V>(k, Type::Q5_K);
    set_tiles<K_q6_K, V>(k, Type::Q6_K);
    return k;
}
#endif // LLM_X86

// nullptr for the scalar path.
inline const IsaKernels* kernels_for(Isa isa) {
#ifdef LLM_X86
    static const IsaKernels avx2 = make_kernels<kAVX2>();
    static const IsaKernels avxvnni = make_kernels<kAVXVNNI>();
    static const IsaKernels avx512 = cpu().vnni ? make_kernels<kAVX512VNNI>() : make_kernels<kAVX512>();
    if (isa == Isa::AVX2) return &avx2;
    if (isa == Isa::AVXVNNI) return &avxvnni;
    if (isa == Isa::AVX512) return &avx512;
#else
    (void)isa;
#endif
    return nullptr;
}

inline std::atomic<int>& isa_state() {
    static std::atomic<int> s{-1};  // -1: not chosen yet
    return s;
}

} // namespace qimpl

bool qimpl::quantize_act_simd(Type t, const float* src, void* dst, int64_t n) {
#ifdef LLM_X86
    if (isa_current() == Isa::Scalar) return false;
    const bool wide = isa_current() == Isa::AVX512;
    switch (t) {
    case Type::Q8_0: (wide ? qimpl::quant_q8_rt_avx512 : qimpl::quant_q8_rt_avx2)(src, n / 32, (block_q8_0*)dst, nullptr); return true;
    case Type::Q8_1: (wide ? qimpl::quant_q8_rt_avx512 : qimpl::quant_q8_rt_avx2)(src, n / 32, nullptr, (block_q8_1*)dst); return true;
    case Type::Q8_K: qimpl::quant_q8_K_avx2(src, n / QK_K, (block_q8_K*)dst); return true;
    case Type::F16: qimpl::quant_f16_avx2(src, n, (uint16_t*)dst); return true;
    default: return false;
    }
#else
    (void)t, (void)src, (void)dst, (void)n;
    return false;
#endif
}

// AVX-512 VNNI's 512-bit kernels first; AVX-VNNI's 256-bit ones beat AVX-512 without VNNI.
Isa isa_best() {
    const qimpl::CpuFeatures& f = qimpl::cpu();
    if (f.avx512 && f.vnni) return Isa::AVX512;
    return f.avxvnni ? Isa::AVXVNNI : f.avx512 ? Isa::AVX512 : f.avx2 ? Isa::AVX2 : Isa::Scalar;
}

bool isa_supported(Isa isa) {
    const qimpl::CpuFeatures& f = qimpl::cpu();
    switch (isa) {
    case Isa::Scalar: return true;
    case Isa::AVX2: return f.avx2;
    case Isa::AVX512: return f.avx512;
    case Isa::AVXVNNI: return f.avxvnni;
    }
    return false;
}

// The initial choice: isa_best(), or what the environment variable LLM_ISA names (scalar, avx2,
// avxvnni or avx512) when the CPU supports it, so benchmarks and tests can run a lower tier in any program.
static Isa isa_initial() {
    const char* env = getenv("LLM_ISA");
    if (!env || !*env) return isa_best();
    for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVXVNNI, Isa::AVX512}) {
        const std::string name = isa == Isa::AVX512 ? "avx512" : isa_name(isa);
        if (name != env && !(isa == Isa::AVX512 && strcmp(env, "amx") == 0)) continue;  // amx: AVX-512 and AMX
        if (isa_supported(isa)) return isa;
        fprintf(stderr, "llm: LLM_ISA=%s is not supported by this CPU, using %s\n", env, isa_name(isa_best()).c_str());
        return isa_best();
    }
    fprintf(stderr, "llm: LLM_ISA=%s is not one of scalar, avx2, avxvnni, avx512, amx; using %s\n", env, isa_name(isa_best()).c_str());
    return isa_best();
}

Isa isa_current() {
    int s = qimpl::isa_state().load(std::memory_order_relaxed);
    if (s < 0) {
        s = (int)isa_initial();
        qimpl::isa_state().store(s, std::memory_order_relaxed);
    }
    return (Isa)s;
}

void isa_set(Isa isa) {
    if ((int)isa < 0 || (int)isa > (int)Isa::AVXVNNI || !isa_supported(isa))
        fail("instruction set %d is not supported by this CPU (best: %s)", (int)isa, isa_name(isa_best()).c_str());
    qimpl::isa_state().store((int)isa, std::memory_order_relaxed);
}

std::string isa_name(Isa isa) {
    switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::AVX2: return "avx2";
    case Isa::AVXVNNI: return "avxvnni";
    case Isa::AVX512: return !qimpl::cpu().vnni ? "avx512" : amx_enabled() ? "avx512-vnni+amx" : "avx512-vnni";
    }
    return "?";
}

// The float block scales of q8_0 / q8_1 activation rows that the tiles read (see TileFn); returns
// the per-row stride, 0 for other types (nothing written).
void act_info(Type at, const uint8_t* act, size_t act_row_bytes, int64_t n_act, int64_t k, bool with_sums, ActInfo& out) {
    out.stride = 0;
    out.sums.clear();
    if (at != Type::Q8_0 && at != Type::Q8_1) return;
    const int64_t nb = k / 32, stride = at == Type::Q8_1 ? 2 * nb : nb;
    out.stride = stride;
    out.scales.resize((size_t)(n_act * stride));
    for (int64_t j = 0; j < n_act; j++) {
        float* s = out.scales.data() + j * stride;
        for (int64_t b = 0; b < nb; b++) {
            if (at == Type::Q8_1) {
                const block_q8_1& y = ((const block_q8_1*)(act + j * act_row_bytes))[b];
                s[b] = fp16_to_fp32(y.d);
                s[nb + b] = fp16_to_fp32(y.s);
            } else {
                s[b] = fp16_to_fp32(((const block_q8_0*)(act + j * act_row_bytes))[b].d);
            }
        }
    }
    if (!with_sums || at != Type::Q8_0) return;
    out.sums.resize((size_t)(n_act * nb));
    for (int64_t j = 0; j < n_act; j++) {
        const block_q8_0* y = (const block_q8_0*)(act + j * act_row_bytes);
        for (int64_t b = 0; b < nb; b++) {
            int32_t sum = 0;
            for (int i = 0; i < QK8_0; i++) sum += y[b].qs[i];
            out.sums[j * nb + b] = sum;
        }
    }
}

float vec_dot(Type weight, int64_t n, const void* x, const void* y) {
    check_row(weight, n, "vec_dot");
    if (const qimpl::IsaKernels* k = qimpl::kernels_for(isa_current())) {
        if (qimpl::TileFn f = k->tile[(int)weight][0]) {
            ActInfo info;
            act_info(vec_dot_type(weight), (const uint8_t*)y, 0, 1, n, false, info);
            float r;
            f(n, (const uint8_t*)x, (const uint8_t*)y, 0, info.scales.data(), 0, &r, 1);
            return r;
        }
    }
    return qimpl::scalar_dot(weight)(n, x, y);
}

void matmul_rows(Type wt, const uint8_t* W, size_t w_row_bytes, int64_t k, int64_t r0, int64_t r1, const uint8_t* act,
                 size_t act_row_bytes, int64_t n_act, float* out, int64_t ld_out, const ActInfo* info) {
    const qimpl::IsaKernels* ks = qimpl::kernels_for(isa_current());
    const qimpl::TileFn* tiles = ks ? ks->tile[(int)wt] : nullptr;
    if (!tiles || !tiles[0]) {
        const qimpl::DotFn dot = qimpl::scalar_dot(wt);
        for (int64_t j = 0; j < n_act; j++)
            for (int64_t i = r0; i < r1; i++) out[j * ld_out + i] = dot(k, W + i * w_row_bytes, act + j * act_row_bytes);
        return;
    }
    thread_local ActInfo local;
    if (!info) act_info(vec_dot_type(wt), act, act_row_bytes, n_act, k, false, local), info = &local;
    const std::vector<float>& scales = info->scales;
    const int64_t ss = info->stride;
    // Rows in groups small enough to stay in L1 while the activation columns stream past them, 8
    // columns at a time (those stay in L1 across the group's rows).
    constexpr int64_t kRowGroup = 16;
    // A tail of 3..7 columns after full 8-column tiles (an expert's share of a prompt, say) costs 2-3
    // more passes over the weights in narrower tiles; instead it runs as one 8-column tile over a
    // zero-padded copy of those columns, whose extra results are dropped.
    const int64_t tail = n_act > 8 && n_act % 8 >= 3 ? n_act % 8 : 0, j_tail = n_act - tail;
    thread_local std::vector<uint8_t> pad_act;
    thread_local std::vector<float> pad_scales;
    if (tail) {
        pad_act.assign(8 * act_row_bytes, 0);
        memcpy(pad_act.data(), act + j_tail * act_row_bytes, tail * act_row_bytes);
        pad_scales.assign(8 * std::max<int64_t>(ss, 1), 0.0f);
        if (ss) std::copy(scales.data() + j_tail * ss, scales.data() + n_act * ss, pad_scales.begin());
    }
    for (int64_t g = r0; g < r1; g += kRowGroup) {
        const int64_t ge = std::min(r1, g + kRowGroup);
        int64_t j = 0;
        for (int w = 3; w >= 0; w--) {
            const int nc = qimpl::kTileWidths[w];
            for (; j + nc <= (tail ? j_tail : n_act); j += nc) {
                for (int64_t i = g; i < ge; i++) {
                    tiles[w](k, W + i * w_row_bytes, act + j * act_row_bytes, act_row_bytes, scales.data() + j * ss, ss,
                             out + j * ld_out + i, ld_out);
                }
            }
        }
        for (int64_t i = g; i < ge && tail; i++) {
            float r8[8];
            tiles[3](k, W + i * w_row_bytes, pad_act.data(), act_row_bytes, pad_scales.data(), ss, r8, 1);
            for (int64_t c = 0; c < tail; c++) out[(j_tail + c) * ld_out + i] = r8[c];
        }
    }
}

// ---- interleaved weights (16 rows per group, see block_q4_K_x16) ------------------------------

namespace qimpl {
// 6-bit values in the interleaved layouts: N values (128 or 256) with value e's low four bits in
// nibble e / (N / 2) of lo[e % (N / 2)] and its top two bits at bit base + 2 * (e / 64) of hi[e % 64]
// (Q4_K: scales base 0 and mins base 4 share one hi array; Q3_K: 256 scales).
template <int N>
inline void put6(uint8_t* lo, uint8_t* hi, int e, int base, uint8_t v) {
    lo[e % (N / 2)] |= (uint8_t)((v & 15) << (4 * (e / (N / 2))));
    hi[e % 64] |= (uint8_t)((v >> 4) << (base + 2 * (e / 64)));
}
template <int N>
inline uint8_t get6(const uint8_t* lo, const uint8_t* hi, int e, int base) {
    return (uint8_t)(((lo[e % (N / 2)] >> (4 * (e / (N / 2)))) & 15) | (((hi[e % 64] >> (base + 2 * (e / 64))) & 3) << 4));
}
// Element numbers of a row's per-sub-block values: by sub-block (Q4_K scales), or in pairs of
// sub-blocks, row by row, so a pair of a row is one int16 pair (Q4_K mins, Q3_K and Q2_K scales).
inline int scale_elt(int sb, int r) { return sb * 16 + r; }
inline int pair_elt(int sb, int r) { return (sb / 2) * 32 + r * 2 + sb % 2; }

template <class G> constexpr bool kHasMin = std::is_same_v<G, block_q4_1_x16> || std::is_same_v<G, block_q5_1_x16>;
template <class G>
constexpr bool kHasHigh = std::is_same_v<G, block_q5_0_x16> || std::is_same_v<G, block_q5_1_x16> || std::is_same_v<G, block_q5_K_x16>;
template <class G> constexpr bool kHasBytes = std::is_same_v<G, block_q8_0_x16>;

// One block of row r into / out of an interleaved block. In a row, sub-block sb's values 0..31 are
// nibble sb % 2 of qs[32 * (sb / 2) .. + 31], so four values map to four bytes of a 32-bit word.
template <class X, class G>
inline void interleave_q45_K(const X& x, int r, G& y) {
    y.d[r] = x.d;
    y.dmin[r] = x.dmin;
    uint8_t sc[8], mn[8];
    unpack_scale_min_k4(x.scales, sc, mn);
    for (int sb = 0; sb < 8; sb++) {
        put6<128>(y.scales_lo, y.hi, scale_elt(sb, r), 0, sc[sb]);
        put6<128>(y.mins_lo, y.hi, pair_elt(sb, r), 4, mn[sb]);
        const uint8_t* q = x.qs + 32 * (sb / 2);
        const int shift = 4 * (sb % 2);
        for (int c = 0; c < 4; c++) {
            uint32_t lo, hi;
            memcpy(&lo, q + 4 * c, 4);
            memcpy(&hi, q + 16 + 4 * c, 4);
            const uint32_t w = ((lo >> shift) & 0x0F0F0F0F) | (((hi >> shift) & 0x0F0F0F0F) << 4);
            memcpy(y.qs[sb][c] + 4 * r, &w, 4);
        }
        if constexpr (kHasHigh<G>)  // a row's fifth bits: bit sb of qh[l] for value l of sub-block sb
            for (int i = 0; i < 8; i++)
                for (int j = 0; j < 4; j++) y.qh[sb][i] |= (uint64_t)((x.qh[4 * i + j] >> sb) & 1) << (4 * r + j);
    }
}
template <class X, class G>
inline void deinterleave_q45_K(const G& y, int r, X& x) {
    x.d = y.d[r];
    x.dmin = y.dmin[r];
    memset(x.scales, 0, sizeof x.scales);
    memset(x.qs, 0, sizeof x.qs);
    if constexpr (kHasHigh<G>) memset(x.qh, 0, sizeof x.qh);
    for (int sb = 0; sb < 8; sb++) {
        pack_scale_min_k4(sb, get6<128>(y.scales_lo, y.hi, scale_elt(sb, r), 0), get6<128>(y.mins_lo, y.hi, pair_elt(sb, r), 4),
                          x.scales);
        uint8_t* q = x.qs + 32 * (sb / 2);
        const int shift = 4 * (sb % 2);
        for (int c = 0; c < 4; c++) {
            uint32_t w, lo, hi;
            memcpy(&w, y.qs[sb][c] + 4 * r, 4);
            memcpy(&lo, q + 4 * c, 4);
            memcpy(&hi, q + 16 + 4 * c, 4);
            lo |= (w & 0x0F0F0F0F) << shift;
            hi |= ((w >> 4) & 0x0F0F0F0F) << shift;
            memcpy(q + 4 * c, &lo, 4);
            memcpy(q + 16 + 4 * c, &hi, 4);
        }
        if constexpr (kHasHigh<G>)
            for (int i = 0; i < 8; i++)
                for (int j = 0; j < 4; j++) x.qh[4 * i + j] |= (uint8_t)(((y.qh[sb][i] >> (4 * r + j)) & 1) << sb);
    }
}

// Two-bit fields of Q2_K/Q3_K values and Q6_K's top bits: in a row, values 128n + 32j + l (l = 0..31)
// sit at bit 2j of qs[32n + l]; interleaved, group g (values 4g..4g+3) of row r sits at bit
// 2 * (g / 16) of the four bytes ql[g % 16][4r..]. Four values share the shifts, so they move as a word.
inline void put_low2(const uint8_t* qs, int g, int r, uint8_t (*ql)[64]) {
    const int n = g / 32, j = (g % 32) / 8, l = 4 * (g % 8);
    uint32_t lo, a;
    memcpy(&lo, qs + 32 * n + l, 4);
    memcpy(&a, ql[g % 16] + 4 * r, 4);
    a |= ((lo >> (2 * j)) & 0x03030303) << (2 * (g / 16));
    memcpy(ql[g % 16] + 4 * r, &a, 4);
}
inline void get_low2(const uint8_t (*ql)[64], int g, int r, uint8_t* qs) {
    const int n = g / 32, j = (g % 32) / 8, l = 4 * (g % 8);
    uint32_t a, lo;
    memcpy(&a, ql[g % 16] + 4 * r, 4);
    memcpy(&lo, qs + 32 * n + l, 4);
    lo |= ((a >> (2 * (g / 16))) & 0x03030303) << (2 * j);
    memcpy(qs + 32 * n + l, &lo, 4);
}
// Q6_K: in a row, values 128n + 32k + l have their low bits in nibble k / 2 of ql[64n + 32(k % 2) + l]
// (interleaved: nibble g / 32 of ql[g % 32]) and their top bits as the two-bit fields above.
inline int q6_K_low4_at(int g) { return 64 * (g / 32) + 32 * ((g % 32) / 8 % 2) + 4 * (g % 8); }
inline void interleave_q6_K(const block_q6_K& x, int r, block_q6_K_x16& y) {
    y.d[r] = x.d;
    for (int sb = 0; sb < 16; sb++) y.scales[sb / 2][r][sb % 2] = x.scales[sb];
    for (int g = 0; g < 64; g++) {
        uint32_t lo, a;
        memcpy(&lo, x.ql + q6_K_low4_at(g), 4);
        memcpy(&a, y.ql[g % 32] + 4 * r, 4);
        a |= ((lo >> (4 * ((g % 32) / 16))) & 0x0F0F0F0F) << (4 * (g / 32));
        memcpy(y.ql[g % 32] + 4 * r, &a, 4);
        put_low2(x.qh, g, r, y.qh);
    }
}
inline void deinterleave_q6_K(const block_q6_K_x16& y, int r, block_q6_K& x) {
    x.d = y.d[r];
    for (int sb = 0; sb < 16; sb++) x.scales[sb] = y.scales[sb / 2][r][sb % 2];
    memset(x.ql, 0, sizeof x.ql);
    memset(x.qh, 0, sizeof x.qh);
    for (int g = 0; g < 64; g++) {
        uint32_t a, lo;
        memcpy(&a, y.ql[g % 32] + 4 * r, 4);
        memcpy(&lo, x.ql + q6_K_low4_at(g), 4);
        lo |= ((a >> (4 * (g / 32))) & 0x0F0F0F0F) << (4 * ((g % 32) / 16));
        memcpy(x.ql + q6_K_low4_at(g), &lo, 4);
        get_low2(y.qh, g, r, x.qh);
    }
}

// Q3_K: the low two bits as above, the third bit of values 128n + 32j + l at bit 4n + j of
// hmask[l]; scales as unpack_scales_q3k reads them.
inline void interleave_q2_K(const block_q2_K& x, int r, block_q2_K_x16& y) {
    y.d[r] = x.d;
    y.dmin[r] = x.dmin;
    for (int sb = 0; sb < 16; sb++) y.scales[pair_elt(sb, r)] = x.scales[sb];
    for (int g = 0; g < 64; g++) put_low2(x.qs, g, r, y.ql);
}
inline void deinterleave_q2_K(const block_q2_K_x16& y, int r, block_q2_K& x) {
    x.d = y.d[r];
    x.dmin = y.dmin[r];
    for (int sb = 0; sb < 16; sb++) x.scales[sb] = y.scales[pair_elt(sb, r)];
    memset(x.qs, 0, sizeof x.qs);
    for (int g = 0; g < 64; g++) get_low2(y.ql, g, r, x.qs);
}
inline void interleave_q3_K(const block_q3_K& x, int r, block_q3_K_x16& y) {
    y.d[r] = x.d;
    int8_t sc[16];
    unpack_scales_q3k(x.scales, sc);
    for (int sb = 0; sb < 16; sb++) put6<256>(y.scales_lo, y.scales_hi, pair_elt(sb, r), 0, (uint8_t)(sc[sb] + 32));
    for (int g = 0; g < 64; g++) {
        put_low2(x.qs, g, r, y.ql);
        const int n = g / 32, j = (g % 32) / 8, l = 4 * (g % 8);
        uint32_t hm;
        memcpy(&hm, x.hmask + l, 4);
        const uint32_t m = (hm >> (4 * n + j)) & 0x01010101;  // one bit per byte -> four bits
        y.qh[g] |= (uint64_t)((m | m >> 7 | m >> 14 | m >> 21) & 15) << (4 * r);
    }
}
inline void deinterleave_q3_K(const block_q3_K_x16& y, int r, block_q3_K& x) {
    x.d = y.d[r];
    memset(x.scales, 0, sizeof x.scales);
    memset(x.qs, 0, sizeof x.qs);
    memset(x.hmask, 0, sizeof x.hmask);
    for (int sb = 0; sb < 16; sb++) {
        const int v = get6<256>(y.scales_lo, y.scales_hi, pair_elt(sb, r), 0);
        // the packing unpack_scales_q3k reads: low nibbles in bytes 0..7, top bits in bytes 8..11
        x.scales[sb % 8] |= (uint8_t)((v & 15) << (4 * (sb / 8)));
        x.scales[8 + sb % 4] |= (uint8_t)((v >> 4) << (2 * (sb / 4)));
    }
    for (int g = 0; g < 64; g++) {
        get_low2(y.ql, g, r, x.qs);
        const int n = g / 32, j = (g % 32) / 8, l = 4 * (g % 8);
        uint32_t hm;
        memcpy(&hm, x.hmask + l, 4);
        const uint32_t bits = (uint32_t)(y.qh[g] >> (4 * r)) & 15;
        hm |= ((bits & 1) | (bits & 2) << 7 | (bits & 4) << 14 | (bits & 8) << 21) << (4 * n + j);
        memcpy(x.hmask + l, &hm, 4);
    }
}

// The 32-value types: 4-bit types copy a row's four nibble bytes of group c, c + 4 as they are.
template <class X, class G>
inline void interleave_b32(const X& x, int r, G& g) {
    g.d[r] = x.d;
    if constexpr (kHasMin<G>) g.m[r] = x.m;
    if constexpr (kHasBytes<G>) {
        for (int grp = 0; grp < 8; grp++) {  // four values as one word, each + 128
            uint32_t w;
            memcpy(&w, x.qs + 4 * grp, 4);
            w ^= 0x80808080u;
            memcpy(g.qs[grp] + 4 * r, &w, 4);
        }
    } else {
        for (int c = 0; c < 4; c++) memcpy(g.qs[c] + 4 * r, x.qs + 4 * c, 4);
    }
    if constexpr (kHasHigh<G>) {  // bit planes: value 4 * grp + j's fifth bit at bit grp of qh[4r + j]
        uint32_t qh;
        memcpy(&qh, x.qh, 4);
        for (int j = 0; j < 4; j++)
            for (int grp = 0; grp < 8; grp++) g.qh[4 * r + j] |= (uint8_t)(((qh >> (4 * grp + j)) & 1) << grp);
    }
}
template <class X, class G>
inline void deinterleave_b32(const G& g, int r, X& x) {
    x.d = g.d[r];
    if constexpr (kHasMin<G>) x.m = g.m[r];
    if constexpr (kHasBytes<G>) {
        for (int grp = 0; grp < 8; grp++) {
            uint32_t w;
            memcpy(&w, g.qs[grp] + 4 * r, 4);
            w ^= 0x80808080u;
            memcpy(x.qs + 4 * grp, &w, 4);
        }
    } else {
        for (int c = 0; c < 4; c++) memcpy(x.qs + 4 * c, g.qs[c] + 4 * r, 4);
    }
    if constexpr (kHasHigh<G>) {
        uint32_t qh = 0;
        for (int j = 0; j < 4; j++)
            for (int grp = 0; grp < 8; grp++) qh |= (uint32_t)((g.qh[4 * r + j] >> grp) & 1) << (4 * grp + j);
        memcpy(x.qh, &qh, 4);
    }
}

// Copies 16 rows of nb blocks between the row layout (src_rows / dst_rows) and an interleaved group.
template <class X, class G, void (*Fn)(const X&, int, G&)>
void interleave_group(const uint8_t* rows, size_t row_stride, int64_t nb, uint8_t* group) {
    G* g = (G*)group;
    memset(g, 0, sizeof(G) * nb);
    for (int r = 0; r < kInterleaveRows; r++)
        for (int64_t b = 0; b < nb; b++) Fn(((const X*)(rows + r * row_stride))[b], r, g[b]);
}
template <class X, class G, void (*Fn)(const G&, int, X&)>
void deinterleave_group(const uint8_t* group, int64_t nb, uint8_t* rows, size_t row_stride) {
    const G* g = (const G*)group;
    for (int r = 0; r < kInterleaveRows; r++)
        for (int64_t b = 0; b < nb; b++) Fn(g[b], r, ((X*)(rows + r * row_stride))[b]);
}

#ifdef LLM_X86
// Each byte's bit `bit` (0..7) moved to bit 4 by one 16-bit shift (none for bit 4). What crosses into
// the neighbouring byte lands at its bits 0..3 (a left shift) or from bit 8 - s on (a right shift by
// s <= 3), so a mask of bit 4 takes exactly bit `bit` (Q5's fifth bits), and with `bit` even (s <= 2)
// a mask of bits 4..5 exactly the two-bit field there (Q6_K's high value bits and the top bits of
// 6-bit scales, at the place they take in the value: one shift where extracting the field and shifting
// it up took two).
LLM_AVX2_INLINE __m256i shift_to_bit4(__m256i v, int bit) {
    return bit == 4 ? v : bit < 4 ? _mm256_slli_epi16(v, 4 - bit) : _mm256_srli_epi16(v, bit - 4);
}
// Each byte's two-bit field at (even) `bit`, at bits 4..5.
LLM_AVX2_INLINE __m256i two_bits_at4(__m256i v, int bit) { return _mm256_and_si256(shift_to_bit4(v, bit), _mm256_set1_epi8(0x30)); }
// All N 6-bit values of a put6 layout, as bytes in element order (32-byte steps, so both the AVX2 and
// the AVX-512 kernels use it).
template <int N>
LLM_AVX2_INLINE void unpack6(const uint8_t* lo, const uint8_t* hi, int base, uint8_t* out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 8
    for (int q = 0; q < N / 32; q++) {  // elements 32q..32q+31
        const __m256i l = load256(lo + 32 * (q % (N / 64)));
        const __m256i low = _mm256_and_si256(q < N / 64 ? l : _mm256_srli_epi16(l, 4), m4);
        const __m256i h = load256(hi + 32 * (q % 2));
        _mm256_store_si256((__m256i*)(out + 32 * q), _mm256_or_si256(low, two_bits_at4(h, base + 2 * (q / 2))));
    }
}
// 16 interleaved Q4_K (Q5_K) rows times NC q8_K columns: out[c * ld + r]. Per sub-block and column, eight
// vpdpbusd give the 16 rows' integer dot products; these are scaled in int32 and summed over the
// block, and the mins' term comes from the column's 16-value sums (bsums) in pairs of sub-blocks, so
// each row gets ggml's integer block sums exactly and the same float steps per block (d_y * d_x,
// then one fma); only the order in which blocks are summed differs from the row kernels.
LLM_AVX512_WARNINGS_OFF
// acc + u . (the four bytes at `four`, in every 32-bit lane): vpdpbusd with an embedded broadcast, so
// the broadcast rides on the instruction's own load. GCC 12 emits a separate vpbroadcastd for
// _mm512_set1_epi32 instead, one more instruction per product. Zen 4, one thread, weights in L2,
// alternating: Q4_K 1 column +21 %, 2 / 8 columns +6 / +4 %; Q4_1, Q5_0, Q8_0 and Q6_K at 2 or 8
// columns +2-11 %; the 1-column 32-value tiles, bound by their chain's latency, level (session 27).
LLM_AVX512VNNI_INLINE __m512i dpbusd_broadcast(__m512i acc, __m512i u, const void* four) {
    __asm__("vpdpbusd {%2%{1to16%}, %1, %0|%0, %1, %2%{1to16%}}" : "+v"(acc) : "v"(u), "m"(*(const int32_t*)four));
    return acc;
}
// Values 4ch..4ch+3 (lo) and 4ch+16..4ch+19 (hi) of sub-block sb of the 16 rows, as bytes.
template <class G>
LLM_AVX512_INLINE void unpack_q45_K(const G& B, int sb, int ch, __m512i& lo, __m512i& hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i q = _mm512_loadu_si512(B.qs[sb][ch]);
    lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    if constexpr (kHasHigh<G>) {
        lo = _mm512_mask_add_epi8(lo, (__mmask64)B.qh[sb][ch], lo, _mm512_set1_epi8(16));
        hi = _mm512_mask_add_epi8(hi, (__mmask64)B.qh[sb][ch + 4], hi, _mm512_set1_epi8(16));
    }
}
// A block's float step for one column y (VNNI and AMX kernels alike): isum (the scaled sub-block
// sums) times d_x * d_y into acc, the mins' term sum(min * bsum) times dmin_x * d_y into accm; mn:
// the block's unpacked mins.
LLM_AVX512VNNI_INLINE void accumulate_q45_K(const block_q8_K& y, const uint8_t* mn, __m512i isum, __m512 dx, __m512 mx, __m512& acc,
                                        __m512& accm) {
    // sums of 32 values per sub-block, two sub-blocks per 32-bit word
    const __m256i bs = _mm256_loadu_si256((const __m256i*)y.bsums);
    alignas(16) int32_t pair[4];
    _mm_store_si128((__m128i*)pair, _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
    __m512i msum = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++)
        msum = _mm512_dpwssd_epi32(msum, _mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)(mn + 32 * p))), _mm512_set1_epi32(pair[p]));
    const __m512 yd = _mm512_set1_ps(y.d);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dx, yd), acc);
    accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(mx, yd), accm);
}
// isum + a * scales16's low int16 + b * its high int16, row by row, for int32 dots a and b within
// int16: vpackssdw gives each 128-bit lane a's four rows, then b's; a vpshufb pairs them up row by
// row for one vpdpwssd.
LLM_AVX512VNNI_INLINE __m512i add_scaled_pair(__m512i isum, __m512i a, __m512i b, __m512i scales16) {
    const __m512i by_row = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
    return _mm512_dpwssd_epi32(isum, _mm512_shuffle_epi8(_mm512_packs_epi32(a, b), by_row), scales16);
}
// isum + each row's sub-block dot times the row's scale (int32). Q4_K's dot comes in its 16-value
// halves (dot: values 0..15, dot_hi: 16..31), each within int16 (15 x 128 x 16 = 30720), so they are
// packed to one int16 pair per row and scaled and added by one vpdpwssd, not vpmulld's two uops (8
// columns +4-12 %, 1 column +7 %); Q5_K's halves may not fit (31 x 127 x 16): its whole dot is in dot
// (two chains and an add cost it 2-3 %), scaled by vpmulld.
template <class G>
LLM_AVX512VNNI_INLINE __m512i add_scaled_dot(__m512i isum, __m512i dot, __m512i dot_hi, __m512i scale) {
    if constexpr (kHasHigh<G>) return _mm512_add_epi32(isum, _mm512_mullo_epi32(dot, scale));
    return add_scaled_pair(isum, dot, dot_hi, _mm512_or_si512(scale, _mm512_slli_epi32(scale, 16)));
}
template <class G, int NC, bool Near>
LLM_AVX512VNNI_FN void tile16_q45_K(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float*, int64_t,
                                    const int32_t*, float* out, int64_t ld) {
    const int64_t nb = k / QK_K;
    const G* x = (const G*)W;
    __m512 acc[NC], accm[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) acc[c] = accm[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const G& B = x[b];
        alignas(64) uint8_t sc[128], mn[128];
        unpack6<128>(B.scales_lo, B.hi, 0, sc);
        unpack6<128>(B.mins_lo, B.hi, 4, mn);
        const block_q8_K* y[NC];
        __m512i isum[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) y[c] = (const block_q8_K*)(A + c * as) + b, isum[c] = _mm512_setzero_si512();
        for (int sb = 0; sb < 8; sb++) {
            const char* sub_block = (const char*)&B + sb * (sizeof(G) / 8);
            prefetch_ahead<sizeof(G) / 8>(sub_block);
            prefetch_near<Near>(sub_block, sizeof(G) / 8);
            __m512i dot[NC], dot_hi[NC];  // see add_scaled_dot
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) dot[c] = dot_hi[c] = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int ch = 0; ch < 4; ch++) {
                __m512i lo, hi;
                unpack_q45_K(B, sb, ch, lo, hi);
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) {
                    const int8_t* yq = y[c]->qs + 32 * sb + 4 * ch;
                    dot[c] = dpbusd_broadcast(dot[c], lo, yq);
                    __m512i& to = kHasHigh<G> ? dot[c] : dot_hi[c];
                    to = dpbusd_broadcast(to, hi, yq + 16);
                }
            }
            const __m512i scale = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i*)(sc + 16 * sb)));
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) isum[c] = add_scaled_dot<G>(isum[c], dot[c], dot_hi[c], scale);
        }
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.d));
        const __m512 mx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.dmin));
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) accumulate_q45_K(*y[c], mn, isum[c], dx, mx, acc[c], accm[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + c * ld, _mm512_sub_ps(acc[c], accm[c]));
}

// The 16-value-sub-block K-quants: Q6_K (value + 32, 0..63), Q3_K (value + 4, 0..7) and Q2_K (0..3
// with mins). Each gives its rows' scales as int16 pairs (sub-blocks 2p, 2p + 1) and a group's
// 16 x 4 unsigned values.
// Group g's two-bit fields (see put_low2) of the 16 rows, as bytes.
LLM_AVX512_INLINE __m512i two_bits(const uint8_t (*q)[64], int g) {
    return _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(q[g % 16]), 2 * (g / 16)), _mm512_set1_epi8(3));
}
LLM_AVX2_INLINE __m256i two_bits_half(const uint8_t (*q)[64], int g, int h) { return shr_mask(load256(q[g % 16] + 32 * h), 2 * (g / 16), 3); }
// The bytes of half h of a 64-bit per-row mask (bit 4 * row + j; rows 8h..8h+7), 0xFF where set.
LLM_AVX2_INLINE __m256i mask_half(const uint64_t& m, int h) { return bits32((const uint8_t*)&m + 4 * h); }
// two_bits_at4 on 512-bit registers (see shift_to_bit4).
LLM_AVX512_INLINE __m512i two_bits_at4(__m512i v, int bit) {
    const __m512i at4 = bit == 4 ? v : bit < 4 ? _mm512_slli_epi16(v, 4 - bit) : _mm512_srli_epi16(v, bit - 4);
    return _mm512_and_si512(at4, _mm512_set1_epi8(0x30));
}
// Group g's fifth bits from 32 bit-plane bytes of Q5_0 / Q5_1 (bit g), as 0x10 where set.
LLM_AVX2_INLINE __m256i fifth_bits_half(__m256i planes, int g) { return _mm256_and_si256(shift_to_bit4(planes, g), _mm256_set1_epi8(0x10)); }
struct I16Q6K {
    using G = block_q6_K_x16;
    static constexpr int kOffsetShift = 5;
    static LLM_AVX512_INLINE void scales(const G& B, __m512i sc16[8]) {
        for (int p = 0; p < 8; p++) sc16[p] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)B.scales[p]));
    }
    static LLM_AVX512_INLINE __m512i group(const G& B, int g) {
        const __m512i lo = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(B.ql[g % 32]), 4 * (g / 32)), _mm512_set1_epi8(0x0F));
        return _mm512_or_si512(lo, two_bits_at4(_mm512_loadu_si512(B.qh[g % 16]), 2 * (g / 16)));
    }
    // The same for rows 8h..8h+7 (the AVX2 kernels, see tile16_avx2).
    static constexpr int kMaxValue = 63;
    static LLM_AVX2_INLINE void scales_half(const G& B, int h, __m256i sc16[8]) {
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) sc16[p] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)B.scales[p][8 * h]));
    }
    static LLM_AVX2_INLINE __m256i group_half(const G& B, int g, int h) {
        const __m256i lo = shr_mask(load256(B.ql[g % 32] + 32 * h), 4 * (g / 32), 0x0F);
        return _mm256_or_si256(lo, two_bits_at4(load256(B.qh[g % 16] + 32 * h), 2 * (g / 16)));
    }
};
struct I16Q3K {
    using G = block_q3_K_x16;
    static constexpr int kOffsetShift = 2;
    static LLM_AVX512_INLINE void scales(const G& B, __m512i sc16[8]) {
        alignas(64) uint8_t sc[256];
        unpack6<256>(B.scales_lo, B.scales_hi, 0, sc);
        for (int p = 0; p < 8; p++)
            sc16[p] = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm256_load_si256((const __m256i*)(sc + 32 * p))), _mm512_set1_epi16(32));
    }
    static LLM_AVX512_INLINE __m512i group(const G& B, int g) {
        const __m512i lo = two_bits(B.ql, g);
        return _mm512_mask_add_epi8(lo, (__mmask64)B.qh[g], lo, _mm512_set1_epi8(4));
    }
    static constexpr int kMaxValue = 7;
    static LLM_AVX2_INLINE void scales_half(const G& B, int h, __m256i sc16[8]) {
        alignas(32) uint8_t sc[256];
        unpack6<256>(B.scales_lo, B.scales_hi, 0, sc);
        for (int p = 0; p < 8; p++)
            sc16[p] = _mm256_sub_epi16(_mm256_cvtepu8_epi16(_mm_load_si128((const __m128i*)(sc + 32 * p + 16 * h))), _mm256_set1_epi16(32));
    }
    static LLM_AVX2_INLINE __m256i group_half(const G& B, int g, int h) {
        return _mm256_or_si256(two_bits_half(B.ql, g, h), _mm256_and_si256(mask_half(B.qh[g], h), _mm256_set1_epi8(4)));
    }
};
struct I16Q2K {  // unsigned 0..3 with a scale and a min per sub-block (no offset)
    using G = block_q2_K_x16;
    static constexpr int kOffsetShift = 0;
    static LLM_AVX512_INLINE void scales(const G& B, __m512i sc16[8]) {
        for (int p = 0; p < 8; p++)
            sc16[p] = _mm512_and_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(B.scales + 32 * p))), _mm512_set1_epi16(15));
    }
    static LLM_AVX512_INLINE void mins(const G& B, __m512i mn16[8]) {
        for (int p = 0; p < 8; p++) mn16[p] = _mm512_srli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(B.scales + 32 * p))), 4);
    }
    static LLM_AVX512_INLINE __m512i group(const G& B, int g) { return two_bits(B.ql, g); }
    static constexpr int kMaxValue = 3;
    static LLM_AVX2_INLINE __m256i scale_bytes(const G& B, int h, int p) {
        return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(B.scales + 32 * p + 16 * h)));
    }
    static LLM_AVX2_INLINE void scales_half(const G& B, int h, __m256i sc16[8]) {
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) sc16[p] = _mm256_and_si256(scale_bytes(B, h, p), _mm256_set1_epi16(15));
    }
    static LLM_AVX2_INLINE void mins_half(const G& B, int h, __m256i mn16[8]) {
#pragma GCC unroll 8
        for (int p = 0; p < 8; p++) mn16[p] = _mm256_srli_epi16(scale_bytes(B, h, p), 4);
    }
    static LLM_AVX2_INLINE __m256i group_half(const G& B, int g, int h) { return two_bits_half(B.ql, g, h); }
};
template <class G>
using I16Of = std::conditional_t<std::is_same_v<G, block_q6_K_x16>, I16Q6K, std::conditional_t<std::is_same_v<G, block_q3_K_x16>, I16Q3K, I16Q2K>>;
// 16 interleaved rows of such a type times NC q8_K columns: per 16-value sub-block the exact dot
// product dot(u, y) scaled in int32, and offset * sum(scale * bsum) off the block's sum once (the
// activation's bsums are its 16-value sums); then d_x * d_y and one fma per block, as ggml. Q2_K's
// min term sum(min * bsum) goes to its own float sum with dmin_x * d_y, as in Q4_K.
// Sub-block sb's int32 scales of the 16 rows from the int16 pairs.
LLM_AVX512_INLINE __m512i k16_scale(const __m512i sc16[8], int sb) {
    return sb % 2 ? _mm512_srai_epi32(sc16[sb / 2], 16) : _mm512_srai_epi32(_mm512_slli_epi32(sc16[sb / 2], 16), 16);
}
// A block's float step for one column y: the offset (or Q2_K's min)
// term from the 16-value bsums, then d_x * d_y (dmin_x * d_y) and one fma per sum.
template <class T>
LLM_AVX512VNNI_INLINE void accumulate_k16(const typename T::G& B, const block_q8_K& y, const __m512i sc16[8], const __m512i mn16[8],
                                      __m512i isum, __m512 dx, __m512& acc, __m512& accm) {
    constexpr bool kMins = std::is_same_v<T, I16Q2K>;
    __m512i off = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        int32_t pair;  // bsums of sub-blocks 2p and 2p + 1
        memcpy(&pair, y.bsums + 2 * p, 4);
        off = _mm512_dpwssd_epi32(off, kMins ? mn16[p] : sc16[p], _mm512_set1_epi32(pair));
    }
    const __m512 yd = _mm512_set1_ps(y.d);
    if constexpr (kMins) {
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dx, yd), acc);
        const __m512 mx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.dmin));
        accm = _mm512_fmadd_ps(_mm512_cvtepi32_ps(off), _mm512_mul_ps(mx, yd), accm);
    } else {
        const __m512i sumi = _mm512_sub_epi32(isum, _mm512_slli_epi32(off, T::kOffsetShift));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(dx, yd), acc);
    }
}
template <class T, int NC, bool Near>
LLM_AVX512VNNI_FN void tile16_k16(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float*, int64_t,
                                  const int32_t*, float* out, int64_t ld) {
    using G = typename T::G;
    const int64_t nb = k / QK_K;
    const G* x = (const G*)W;
    constexpr bool kMins = std::is_same_v<T, I16Q2K>;
    // Q3_K's and Q2_K's 16-value dots fit int16 (7 x 128 x 16), so a pair of sub-blocks is scaled by
    // one vpdpwssd with the rows' int16 scale pairs; Q6_K's (63 x 128 x 16) by vpmulld each
    constexpr bool kDotsInInt16 = T::kMaxValue * 128 * 16 <= 32767;
    __m512 acc[NC], accm[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) acc[c] = accm[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const G& B = x[b];
        const block_q8_K* y[NC];
        __m512i isum[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) y[c] = (const block_q8_K*)(A + c * as) + b, isum[c] = _mm512_setzero_si512();
        __m512i sc16[8], mn16[8];
        T::scales(B, sc16);
        if constexpr (kMins) T::mins(B, mn16);
        __m512i dot_even[NC];  // kDotsInInt16: the even sub-block's dots, scaled with the odd one's
#pragma GCC unroll 16  // constant shift counts in group / group_half (variable ones cost a vpsrlw by xmm each)
        for (int sb = 0; sb < 16; sb++) {
            prefetch_sub_block16(B, sb);
            prefetch_near<Near>((const char*)&B + sb * (sizeof(G) / 16), sizeof(G) / 16);
            __m512i u[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) u[j] = T::group(B, 4 * sb + j);
            const __m512i scale = k16_scale(sc16, sb);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) dot = dpbusd_broadcast(dot, u[j], y[c]->qs + 16 * sb + 4 * j);
                if constexpr (!kDotsInInt16) isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(dot, scale));
                else if (sb % 2 == 0) dot_even[c] = dot;
                else isum[c] = add_scaled_pair(isum[c], dot_even[c], dot, sc16[sb / 2]);
            }
        }
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.d));
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) accumulate_k16<T>(B, *y[c], sc16, mn16, isum[c], dx, acc[c], accm[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + c * ld, _mm512_sub_ps(acc[c], accm[c]));
}

// 16 interleaved rows of a 32-value type times NC q8_0 (q8_1 for Q4_1/Q5_1) columns. The weights are
// unsigned bytes u = value + Offset (vpdpbusd's unsigned operand), so each block's dot product is
// dot(u, y) - Offset * sum(y), exact in int32; S holds the columns' block scales as floats (q8_1: then
// the s values), ysum their block sums. Per block: d_x * d_y, one fma, as ggml; affine types add
// m_x * s_y to a second sum.
// IQ4_NL's value table + Offset in every 128-bit lane (the index bytes' vpshufb table).
template <int Offset>
LLM_AVX512_INLINE __m512i iq4nl_table512() {
    alignas(16) uint8_t t[16];
    for (int i = 0; i < 16; i++) t[i] = (uint8_t)(kIQ4NLValues[i] + Offset);
    return _mm512_broadcast_i32x4(_mm_load_si128((const __m128i*)t));
}
// A block's 16 rows as unsigned bytes u = value + Offset, four-value group i in u[i] (the VNNI
// kernel's operands and the AMX kernel's B tile lines).
template <class G, bool Table>
LLM_AVX512_INLINE void unpack_b32(const G& B, __m512i table, __m512i u[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    // Unrolled: a rolled loop writes u to the stack and reads it back (GCC 12), which cost the 1-column
    // tiles 20-45 % of their speed in L2 (Zen 4).
    if constexpr (kHasBytes<G>) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) u[i] = _mm512_loadu_si512(B.qs[i]);
    } else {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m512i q = _mm512_loadu_si512(B.qs[c]);
            u[c] = _mm512_and_si512(q, m4);
            u[c + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        }
    }
    if constexpr (kHasHigh<G>) {  // group i's fifth bits: bit i of the 64 plane bytes
        const __m512i planes = _mm512_loadu_si512(B.qh);
#pragma GCC unroll 8  // constant bit masks (a loop shifts and broadcasts each)
        for (int i = 0; i < 8; i++)
            u[i] = _mm512_mask_add_epi8(u[i], _mm512_test_epi8_mask(planes, _mm512_set1_epi8((char)(1 << i))), u[i], _mm512_set1_epi8(16));
    }
    if constexpr (Table) {
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) u[i] = _mm512_shuffle_epi8(table, u[i]);
    }
}
// One block's float step for one column (shared by the VNNI and AMX kernels, so both round alike):
// dot(u, y) less the offset term, times d_x * d_y into acc; affine types add m_x * s_y to accm.
// Column c, block b of nb; S, ss, ysum: see tile16_b32; dx / mx: the rows' d and m.
template <class G, int Offset>
LLM_AVX512_INLINE void accumulate_b32(__m512i dot, __m512 dx, __m512 mx, const float* S, int64_t ss, const int32_t* ysum, int c,
                                      int64_t b, int64_t nb, __m512& acc, __m512& accm) {
    if constexpr (Offset != 0) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(Offset * ysum[c * nb + b]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dx, _mm512_set1_ps(S[c * ss + b])), acc);
    if constexpr (kHasMin<G>) accm = _mm512_fmadd_ps(mx, _mm512_set1_ps(S[c * ss + nb + b]), accm);
}
// The rows' m of an affine block as floats (zero for the others).
template <class G>
LLM_AVX512_INLINE __m512 mins_b32(const G& B) {
    if constexpr (kHasMin<G>) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.m));
    else return _mm512_setzero_ps();
}
// Distance: of the weight stream's prefetch (see b32_tiles).
template <class G, int Offset, bool Table, int NC, int Distance = kPrefetchBytes>
LLM_AVX512VNNI_FN void tile16_b32(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                                  const int32_t* ysum, float* out, int64_t ld) {
    using Y = std::conditional_t<kHasMin<G>, block_q8_1, block_q8_0>;
    const int64_t nb = k / 32;
    const G* x = (const G*)W;
    const __m512i table = Table ? iq4nl_table512<Offset>() : _mm512_setzero_si512();
    __m512 acc[NC], accm[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) acc[c] = accm[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const G& B = x[b];
        prefetch_ahead<sizeof(G), 2, Distance>(&B);
        __m512i u[8];
        unpack_b32<G, Table>(B, table, u);
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.d)), mx = mins_b32(B);
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) {
            const Y& y = ((const Y*)(A + c * as))[b];
            __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) dot = dpbusd_broadcast(dot, u[i], y.qs + 4 * i);
            accumulate_b32<G, Offset>(dot, dx, mx, S, ss, ysum, c, b, nb, acc[c], accm[c]);
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + c * ld, _mm512_add_ps(acc[c], accm[c]));
}
LLM_AVX512_WARNINGS_ON

// ---- the same groups on AVX2 hosts (and AVX-512 ones without VNNI) ----
// A group's 64-byte lines hold four values of each of its 16 rows; a line's halves (bytes 32h..32h+31)
// are rows 8h..8h+7, so one 256-bit register advances 8 rows per instruction. Without VNNI the byte
// products come from vpmaddubsw (unsigned x signed pairs summed in int16, saturating): four-value
// groups are summed in int16 in runs short enough never to saturate, then multiplied by the rows'
// scales with vpmaddwd into int32 (exact). Q8_0 and IQ4_NL, whose stored bytes are too large for
// that, multiply |w| by y with w's sign. The integer block sums and the float steps are those of the
// AVX-512 kernels above, so both tiers give bit-identical results.

// Groups per int16 run for unsigned weight values up to UMax against activations |y| <= 128.
constexpr int safe_run(int umax) { return 32767 / (2 * 128 * umax); }

// v as computed, a barrier to reordering: GCC otherwise reassociates a run's chain of adds into a
// tree that keeps every group's (and column's) products live at once, spilled to the stack.
LLM_AVX2_INLINE __m256i in_order(__m256i v) {
    __asm__("" : "+x"(v));
    return v;
}
// Per row (8 lanes): sum plus, over i < N, u[i] . (the four activation bytes at y + 4i) times scale16
// (each row's scale in both int16 halves of its lane), in int16 runs of Run groups, each run taken
// into the sum by Ops::madd_add (AVX-VNNI: one vpdpwssd, where vpdpbusd's int32 dot would need a
// vpmulld of two uops for its scale).
template <class Ops, int N, int Run>
LLM_AVX2_INLINE __m256i dot_runs(__m256i sum, const __m256i* u, const int8_t* y, __m256i scale16) {
    __m256i run = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int i = 0; i < N; i++) {
        run = _mm256_add_epi16(run, _mm256_maddubs_epi16(u[i], _mm256_set1_epi32((int)load_u32((const uint8_t*)y + 4 * i))));
        if constexpr (N == 8) run = in_order(run);  // a 32-value block's run (the K16 tiles' four groups fare better left alone)
        if ((i + 1) % Run == 0 || i == N - 1) {
            sum = Ops::madd_add(sum, run, scale16);
            run = _mm256_setzero_si256();
        }
    }
    return sum;
}
// dot_runs for both halves of 16 interleaved rows and NC columns at once: for each half h and column
// c, isum[h][c] plus the dot of sub-block sb's NG four-value groups Unpack::group_half(B, sb, g, h) and
// the column's bytes at y[c] + 4g, in int16 runs of Run groups scaled by scale16[h]. Group-major: a group's
// two halves are unpacked once and multiplied by one broadcast of each column's bytes, so the loads are
// half of a half-at-a-time kernel's (which they bound, with one broadcast per vpmaddubsw) and the
// 2 x NC chains of adds interleave.
template <class Ops, class Unpack, int NC, int NG, int Run, class G>
LLM_AVX2_INLINE void dot_runs_rows16(__m256i (*isum)[NC], const G& B, int sb, const int8_t* const* y, const __m256i* scale16) {
    __m256i run[2][NC];
#pragma GCC unroll 8
    for (int g = 0; g < NG; g++) {
        // Several columns: the group's place in the sub-block is a constant, so each load's address is
        // too. One column: group sb * NG + g of sub-block 0, whose address GCC computes group by group
        // (4 scalar instructions). Zen 4, Q4_K, weights in L2: the constant address makes 1, 2, 4 and 8
        // columns 14, 8, 4 and 4 % faster (Llama-1B shape pp256 +2 %, in one process), but that
        // shape's decode 4 % slower where memory is fast (60 t/s; level at 40): one column streams its
        // weights from memory, where the faster loop fetched them more slowly.
        const int s = NC == 1 ? 0 : sb, i = NC == 1 ? sb * NG + g : g;
        const __m256i u[2] = {Unpack::group_half(B, s, i, 0), Unpack::group_half(B, s, i, 1)};
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++) {
            const __m256i yg = _mm256_set1_epi32((int)load_u32((const uint8_t*)y[c] + 4 * g));
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i p = _mm256_maddubs_epi16(u[h], yg);
                run[h][c] = g % Run == 0 ? p : in_order(_mm256_add_epi16(run[h][c], p));
                if (g % Run == Run - 1 || g == NG - 1) isum[h][c] = Ops::madd_add(isum[h][c], run[h][c], scale16[h]);
            }
        }
    }
}
// The same unscaled sum on the AVX-VNNI tier (vpdpbusd: exact in int32 for unsigned u up to 255), in
// two chains so that one column's decode is not bound by the instruction's latency.
template <class Ops, int N>
LLM_AVX2_INLINE __m256i dot_bytes(const __m256i* u, const int8_t* y) {
    __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
    for (int i = 0; i < N; i++) sum[i % 2] = Ops::dpbusd(sum[i % 2], u[i], _mm256_set1_epi32((int)load_u32((const uint8_t*)y + 4 * i)));
    return _mm256_add_epi32(sum[0], sum[1]);
}
// sum + each row's 32-value dot of u (values 0..15) and y times its int16 scale16 (in both halves of
// the row's lane), on AVX-VNNI: the dot in two 16-value halves (each within int16: 15 x 128 x 16 =
// 30720), packed and interleaved so a row's halves are one int16 pair, then scaled and added by one
// vpdpwssd. The same integer as vpmulld's product of the whole dot, without its two uops on the
// multiply ports.
template <class Ops>
LLM_AVX2_INLINE __m256i dot_halves_scaled(__m256i sum, const __m256i* u, const int8_t* y, __m256i scale16) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        lo = Ops::dpbusd(lo, u[i], _mm256_set1_epi32((int)load_u32((const uint8_t*)y + 4 * i)));
        hi = Ops::dpbusd(hi, u[i + 4], _mm256_set1_epi32((int)load_u32((const uint8_t*)y + 16 + 4 * i)));
    }
    // vpackssdw gives each 128-bit lane lo's four rows, then hi's; pair them up row by row
    const __m256i by_row = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,  //
                                            0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    return Ops::madd_add(sum, _mm256_shuffle_epi8(_mm256_packs_epi32(lo, hi), by_row), scale16);
}
// The same for signed weights w (|w| <= 127, w_abs = |w|), each group summed in int32.
template <int N>
LLM_AVX2_INLINE __m256i dot_signed(const __m256i* w, const __m256i* w_abs, const int8_t* y) {
    __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int i = 0; i < N; i++) {
        const __m256i yi = _mm256_set1_epi32((int)load_u32((const uint8_t*)y + 4 * i));
        sum = in_order(_mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs[i], _mm256_sign_epi8(yi, w[i])), _mm256_set1_epi16(1))));
    }
    return sum;
}

// Columns up to which a kernel takes both halves in one pass (RowsQ45K: all, see there).
template <class Rows>
constexpr int kBothHalvesColumns = 2;
// Columns up to which run_rows16 takes a kernel's tiles (both halves group by group, up to 4 columns a
// pass; AVX2's Q4_K, Q5_K and unsigned 32-value types).
template <class Rows>
constexpr int kRows16Columns = 0;
// Each kernel below computes NC columns for the NH halves from h0: up to kRows16Columns columns by
// run_rows16 (both halves group by group, in passes of up to 4 columns); else up to kBothHalvesColumns
// columns both halves in one pass over the group (run), with more a pass per half, the second from cache; up to
// Rows::kGroupMajorColumns columns group-major (run_half: 4-column tiles 1.04-1.18x faster, equal at 8;
// docs/performance.md, round 10). Its Ops (OpsAVX2 or OpsAVXVNNI) give the byte products.
template <class Rows, int NC>
LLM_AVX2_INLINE void tile16_halves(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                                   const int32_t* ysum, float* out, int64_t ld) {
    if constexpr (NC <= kRows16Columns<Rows>) {
        constexpr int kPass = NC < 4 ? NC : 4;
        for (int c0 = 0; c0 < NC; c0 += kPass)
            Rows::template run_rows16<kPass>(k, W, A + c0 * as, as, S + c0 * ss, ss, ysum ? ysum + c0 * (k / 32) : nullptr, out + c0 * ld, ld);
    } else if constexpr (NC <= kBothHalvesColumns<Rows>) Rows::template run<NC, 2>(k, W, A, as, S, ss, ysum, out, ld, 0);
    else if constexpr (NC <= Rows::kGroupMajorColumns)
        for (int h = 0; h < 2; h++) Rows::template run_half<NC>(k, W, A, as, S, ss, ysum, out, ld, h);
    else for (int h = 0; h < 2; h++) Rows::template run<NC, 1>(k, W, A, as, S, ss, ysum, out, ld, h);
}
template <class Rows, int NC>
LLM_AVX2_FN void tile16_avx2(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                             const int32_t* ysum, float* out, int64_t ld) {
    tile16_halves<Rows, NC>(k, W, A, as, S, ss, ysum, out, ld);
}
template <class Rows, int NC>
LLM_AVXVNNI_FN void tile16_avxvnni(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                                   const int32_t* ysum, float* out, int64_t ld) {
    tile16_halves<Rows, NC>(k, W, A, as, S, ss, ysum, out, ld);
}

// The float accumulators of the kernels below, per half and column: the scaled block sums and the
// min terms (affine types add theirs, Q4_K/Q5_K/Q2_K subtract them).
template <int NH, int NC>
struct RowsAcc {
    __m256 sum[NH][NC], min[NH][NC];
    LLM_AVX2_INLINE void clear() {
        for (int hh = 0; hh < NH; hh++)
            for (int c = 0; c < NC; c++) sum[hh][c] = min[hh][c] = _mm256_setzero_ps();
    }
    template <bool SubtractMins>
    LLM_AVX2_INLINE void store(float* out, int64_t ld, int h0) const {
        for (int hh = 0; hh < NH; hh++)
            for (int c = 0; c < NC; c++)
                _mm256_storeu_ps(out + c * ld + 8 * (h0 + hh),
                                 SubtractMins ? _mm256_sub_ps(sum[hh][c], min[hh][c]) : _mm256_add_ps(sum[hh][c], min[hh][c]));
    }
};

// tile16_b32 on AVX2 (AVX-VNNI: the stored unsigned bytes u = value + Offset against y, as AVX-512).
template <class G, int Offset, bool Table, class Ops>
struct RowsB32 {
    // AVX2: the unsigned types take run_rows16 at every column count (kRows16Columns), the signed ones run_half
    // up to 4 columns and run beyond; AVX-VNNI takes run throughout.
    static constexpr int kGroupMajorColumns = Ops::kVnni ? 0 : 4;
    static constexpr bool kSigned = Offset == 128 && !Ops::kVnni;  // |w| times y with w's sign
    // Four-value group g (0..7) of half h of a block: the values as signed bytes (signed types) or
    // value + Offset (the others).
    static LLM_AVX2_INLINE __m256i group_half(const G& B, int g, int h, __m256i table) {
        __m256i v;
        if constexpr (kHasBytes<G>) v = _mm256_xor_si256(load256(B.qs[g] + 32 * h), _mm256_set1_epi8((char)0x80));
        else v = shr_mask(load256(B.qs[g % 4] + 32 * h), 4 * (g / 4), 0x0F);
        if constexpr (kHasHigh<G>) v = _mm256_or_si256(v, fifth_bits_half(load256(B.qh + 32 * h), g));
        if constexpr (Table) v = _mm256_shuffle_epi8(table, v);
        return v;
    }
    // The signed types on AVX2, rows 8h..8h+7 times NC columns, group-major: each four-value group is
    // unpacked once and multiplied into every column's int32 sum before the next, so only one group,
    // the columns' sums and float accumulators are live. The same exact block sums and float steps as
    // run (and the AVX-512 kernel).
    template <int NC>
    static LLM_AVX2_INLINE void run_half(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                                         const int32_t*, float* out, int64_t ld, int h) {
        static_assert(kSigned);
        const int64_t nb = k / 32;
        const G* x = (const G*)W;
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)kIQ4NLValues));
        const __m256i ones = _mm256_set1_epi16(1);
        __m256 acc[NC];
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const G& B = x[b];
            if (h == 0) prefetch_ahead<sizeof(G), Ops::kLocality>(&B);
            const int8_t* yq[NC];
            __m256i sum[NC];
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) yq[c] = ((const block_q8_0*)(A + c * as))[b].qs, sum[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m256i v = group_half(B, g, h, table), u = _mm256_abs_epi8(v);
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) {
                    const __m256i yg = _mm256_set1_epi32((int)load_u32((const uint8_t*)yq[c] + 4 * g));
                    sum[c] = in_order(_mm256_add_epi32(sum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(yg, v)), ones)));
                }
            }
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.d + 8 * h)));
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++)
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[c]), _mm256_mul_ps(dx, _mm256_set1_ps(S[c * ss + b])), acc[c]);
        }
#pragma GCC unroll 8
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + c * ld + 8 * h, acc[c]);
    }
    static LLM_AVX2_INLINE __m256i group_half(const G& B, int /*sb: a block is one*/, int g, int h) {  // dot_runs_rows16's
        static_assert(!Table);
        return group_half(B, g, h, _mm256_setzero_si256());
    }
    // AVX2, the unsigned types: both halves group by group (dot_runs_rows16), NC <= 4 columns, each
    // block's exact dot then the same float steps as run. Zen 4, one thread, weights in L2, two runs
    // each, against run (run_half at 4 columns; Q5_0 / Q5_1 at 1-2 columns against a group-by-group
    // kernel of one half at a time): Q4_0 / Q4_1 1, 2, 4, 8 columns +11, +33, +16, +28 %; Q5_0 / Q5_1
    // +6, +16, +13, +10 %.
    template <int NC>
    static LLM_AVX2_INLINE void run_rows16(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                                           const int32_t* ysum, float* out, int64_t ld) {
        using Y = std::conditional_t<kHasMin<G>, block_q8_1, block_q8_0>;
        const int64_t nb = k / 32;
        const G* x = (const G*)W;
        const __m256i ones[2] = {_mm256_set1_epi16(1), _mm256_set1_epi16(1)};
        RowsAcc<2, NC> acc;
        acc.clear();
        for (int64_t b = 0; b < nb; b++) {
            const G& B = x[b];
            prefetch_ahead<sizeof(G), Ops::kLocality>(&B);
            const int8_t* ys[NC];
            __m256i dot[2][NC];
#pragma GCC unroll 4
            for (int c = 0; c < NC; c++) ys[c] = ((const Y*)(A + c * as))[b].qs, dot[0][c] = dot[1][c] = _mm256_setzero_si256();
            dot_runs_rows16<Ops, RowsB32, NC, 8, safe_run(kHasHigh<G> ? 31 : 15)>(dot, B, 0, ys, ones);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.d + 8 * h)));
#pragma GCC unroll 4
                for (int c = 0; c < NC; c++) {
                    if constexpr (Offset != 0) dot[h][c] = _mm256_sub_epi32(dot[h][c], _mm256_set1_epi32(Offset * ysum[c * nb + b]));
                    acc.sum[h][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[h][c]), _mm256_mul_ps(dx, _mm256_set1_ps(S[c * ss + b])), acc.sum[h][c]);
                    if constexpr (kHasMin<G>)
                        acc.min[h][c] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.m + 8 * h))),
                                                       _mm256_set1_ps(S[c * ss + nb + b]), acc.min[h][c]);
                }
            }
        }
        acc.template store<false>(out, ld, 0);
    }
    // Half h of block b of the signed types (|w| times y with w's sign) for NC columns into sum, four
    // groups at a time: their values and magnitudes (8 registers) stay in registers and the first
    // four's dot products wait in memory. All eight groups at once (16 registers) made GCC recompute
    // |w| for every column: one thread in cache, Q8_0 8 columns 134 -> 142 GOP/s, 2 columns 117 ->
    // 128, IQ4_NL +4-7 % (docs/performance.md, session 21).
    template <int NC>
    static LLM_AVX2_INLINE void signed_half(const G& B, int64_t b, const uint8_t* A, size_t as, const float* S, int64_t ss,
                                            __m256i table, int h, __m256* sum) {
        alignas(32) int32_t first[NC][8];
        const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.d + 8 * h)));
#pragma GCC unroll 2
        for (int part = 0; part < 2; part++) {
            __m256i w[4], w_abs[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) w[i] = group_half(B, 4 * part + i, h, table), w_abs[i] = _mm256_abs_epi8(w[i]);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                const block_q8_0& y = ((const block_q8_0*)(A + c * as))[b];
                const __m256i dot = dot_signed<4>(w, w_abs, y.qs + 16 * part);
                if (part == 0) {
                    _mm256_store_si256((__m256i*)first[c], dot);
                } else {
                    const __m256i total = _mm256_add_epi32(_mm256_load_si256((const __m256i*)first[c]), dot);
                    sum[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(dx, _mm256_set1_ps(S[c * ss + b])), sum[c]);
                }
            }
        }
    }
    template <int NC, int NH>
    static LLM_AVX2_INLINE void run(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                                    const int32_t* ysum, float* out, int64_t ld, int h0) {
        using Y = std::conditional_t<kHasMin<G>, block_q8_1, block_q8_0>;
        const int64_t nb = k / 32;
        const G* x = (const G*)W;
        alignas(16) uint8_t values[16];  // IQ4_NL's table, + Offset where the values stay unsigned
        for (int i = 0; i < 16; i++) values[i] = (uint8_t)(kIQ4NLValues[i] + (kSigned ? 0 : Offset));
        const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)values));
        RowsAcc<NH, NC> acc;
        acc.clear();
        // On AMD after Zen 2, Q8_0's one-column tile leaves its stream to the hardware prefetchers
        // (8 KiB ahead it streamed 22-28 GB/s on one Zen 4 thread, its AVX-512 sibling 31-39). Zen 4,
        // LLM_ISA=avx2, decode in one process against 8 KiB ahead, rounds alternating: Gemma 3 (its
        // output matrix is Q8_0) +5-10 % in phases where the host's bandwidth was halved (35 against
        // 65 GB/s) and +7-16 % in the others, SmolLM2-135M Q4_1 (Q8_0 output) +11 %, SmolLM2 shape Q8_0 +2-6 %,
        // DeepSeek-V2-Lite shape +1-5 % (pp8 +2 %). 256 or 512 bytes ahead did as well, 1 KiB was
        // erratic (0.85-1.08), 2 KiB lost 7 % (the AVX-512 tile's best, which loses 6 % without); the
        // 2-column tile, and the unsigned types' one column (run_rows16), were level without (session 33).
        constexpr bool kPrefetch = !(Ops::kHardwareStreamQ8 && kHasBytes<G> && NC == 1);
        for (int64_t b = 0; b < nb; b++) {
            const G& B = x[b];
            if constexpr (kPrefetch) prefetch_ahead<sizeof(G), Ops::kLocality>(&B);
#pragma GCC unroll 2
            for (int hh = 0; hh < NH; hh++) {
                const int h = h0 + hh;
                if constexpr (kSigned) {
                    signed_half<NC>(B, b, A, as, S, ss, table, h, acc.sum[hh]);
                } else {  // AVX-VNNI (AVX2 takes the unsigned types by run_rows16)
                    __m256i u[8];
                    if constexpr (kHasBytes<G>) {
#pragma GCC unroll 8
                        for (int i = 0; i < 8; i++) u[i] = load256(B.qs[i] + 32 * h);
                    } else {
#pragma GCC unroll 4  // rolled, GCC sent the eight groups through the stack (Zen 2: 5-12 % of the tile)
                        for (int c = 0; c < 4; c++) {
                            const __m256i q = load256(B.qs[c] + 32 * h);
                            u[c] = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
                            u[c + 4] = shr_mask(q, 4, 0x0F);
                        }
                    }
                    if constexpr (kHasHigh<G>) {
                        const __m256i planes = load256(B.qh + 32 * h);
#pragma GCC unroll 8  // constant shift counts
                        for (int i = 0; i < 8; i++) u[i] = _mm256_or_si256(u[i], fifth_bits_half(planes, i));
                    }
                    if constexpr (Table)
#pragma GCC unroll 8
                        for (int i = 0; i < 8; i++) u[i] = _mm256_shuffle_epi8(table, u[i]);
                    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.d + 8 * h)));
#pragma GCC unroll 8
                    for (int c = 0; c < NC; c++) {
                        const Y& y = ((const Y*)(A + c * as))[b];
                        __m256i dot = dot_bytes<Ops, 8>(u, y.qs);
                        if constexpr (Offset != 0) dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(Offset * ysum[c * nb + b]));
                        acc.sum[hh][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dx, _mm256_set1_ps(S[c * ss + b])), acc.sum[hh][c]);
                        if constexpr (kHasMin<G>)
                            acc.min[hh][c] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.m + 8 * h))),
                                                             _mm256_set1_ps(S[c * ss + nb + b]), acc.min[hh][c]);
                    }
                }
            }
        }
        acc.template store<false>(out, ld, h0);
    }
};

template <class G, int Offset, bool Table, class Ops>
constexpr int kRows16Columns<RowsB32<G, Offset, Table, Ops>> = !Ops::kVnni && !Table && Offset != 128 ? 8 : 0;

// tile16_q45_K on AVX2 (run_rows16; Q5_K's 8 columns run) and AVX-VNNI (run: each sub-block's exact
// dot times its scale by vpdpwssd, Q5_K's by vpmulld).
template <class G, class Ops>
struct RowsQ45K {
    static constexpr int kGroupMajorColumns = 0;
    // Q5_K on AVX-VNNI: a 16-value half of a dot may leave int16 (31 x 127 x 16), so its whole dot is
    // scaled by vpmulld
    static constexpr bool kMulDot = Ops::kVnni && kHasHigh<G>;
    // Rows 8h..8h+7 of sub-block sb's scales, each in both int16 halves of its row's lane (vpmaddwd's
    // or vpdpwssd's operand) or as int32 (kMulDot: vpmulld's); sc: unpack6's scales.
    static LLM_AVX2_INLINE __m256i scales_half(const uint8_t* sc, int sb, int h) {
        const uint8_t* s = sc + 16 * sb + 8 * h;
        if constexpr (kMulDot) return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)s));
        uint64_t eight;
        memcpy(&eight, s, 8);
        const __m256i twice = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,  //
                                               4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
        return _mm256_shuffle_epi8(_mm256_set1_epi64x((int64_t)eight), twice);
    }
    // Four-value group i of sub-block sb and on (values 4i..4i+3 of sub-block sb while i < 8), rows
    // 8h..8h+7.
    static LLM_AVX2_INLINE __m256i group_half(const G& B, int sb, int i, int h) {
        const unsigned s = sb + (unsigned)i / 8, j = (unsigned)i % 8;  // i >= 0: shifts, not signed division
        const __m256i v = shr_mask(load256(B.qs[s][j % 4] + 32 * h), 4 * (j / 4), 0x0F);
        if constexpr (!kHasHigh<G>) return v;
        else return _mm256_or_si256(v, _mm256_and_si256(mask_half(B.qh[s][j], h), _mm256_set1_epi8(16)));
    }
    // A block's scales and mins (unpack6's) and its NC columns with, per column, the sums of 32 values
    // per sub-block, two sub-blocks per 32-bit word (both halves').
    template <int NC>
    struct Block {
        alignas(32) uint8_t sc[128], mn[128];
        alignas(16) int32_t pair[NC][4];
        const block_q8_K* y[NC];
        LLM_AVX2_INLINE Block(const G& B, const uint8_t* A, size_t as, int64_t b) {
            unpack6<128>(B.scales_lo, B.hi, 0, sc);
            unpack6<128>(B.mins_lo, B.hi, 4, mn);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                y[c] = (const block_q8_K*)(A + c * as) + b;
                const __m256i bs = load256(y[c]->bsums);
                _mm_store_si128((__m128i*)pair[c], _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
            }
            // read back from memory: broadcasts of stored words are loads, where GCC would otherwise keep
            // each column's words in a register and spread them with two shuffles each
            __asm__("" : : "r"(pair) : "memory");
        }
        // Half h's float step for the columns: d_x * d_y times the scaled dots isum, the mins times the
        // pair sums (dmin_x * d_y) into the min sums.
        LLM_AVX2_INLINE void accumulate(const G& B, int h, const __m256i* isum, __m256* sum, __m256* min) const {
            const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.d + 8 * h)));
            const __m256 mx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.dmin + 8 * h)));
            __m256i mins16[4];  // the rows' mins of sub-blocks 2p, 2p + 1 as int16 pairs
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) mins16[p] = _mm256_cvtepu8_epi16(_mm_load_si128((const __m128i*)(mn + 32 * p + 16 * h)));
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                __m256i msum = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) msum = Ops::madd_add(msum, mins16[p], _mm256_set1_epi32(pair[c][p]));
                const __m256 yd = _mm256_set1_ps(y[c]->d);
                sum[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(dx, yd), sum[c]);
                min[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(mx, yd), min[c]);
            }
        }
    };
    template <int NC, int NH>
    static LLM_AVX2_INLINE void run(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float*, int64_t, const int32_t*,
                                    float* out, int64_t ld, int h0) {
        const int64_t nb = k / QK_K;
        const G* x = (const G*)W;
        RowsAcc<NH, NC> acc;
        acc.clear();
        for (int64_t b = 0; b < nb; b++) {
            const G& B = x[b];
            const Block<NC> blk(B, A, as, b);
#pragma GCC unroll 2
            for (int hh = 0; hh < NH; hh++) {
                const int h = h0 + hh;
                __m256i isum[NC];
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
                for (int sb = 0; sb < 8; sb++) {
                    // Both halves in one call: each pass prefetches half of what is ahead,
                    // so the stream keeps going while the second half computes. One thread over 64 MiB
                    // (L3 here), interleaved: AVX-VNNI 1 column +11-14 %, AVX2 2 columns +7-10 %; the
                    // same for Q6_K's RowsK16 measured level (docs/performance.md, session 20).
                    prefetch_ahead<sizeof(G) / (8 * NH), Ops::kLocality>((const char*)&B + (8 * hh + sb) * (sizeof(G) / (8 * NH)));
                    // values 4i..4i+3 of the sub-block, two groups from each load (eight group_half calls: Q5_K
                    // 8 columns 10 % slower on AVX2)
                    __m256i u[8];
#pragma GCC unroll 4
                    for (int ch = 0; ch < 4; ch++) {
                        const __m256i q = load256(B.qs[sb][ch] + 32 * h);
                        u[ch] = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
                        u[ch + 4] = shr_mask(q, 4, 0x0F);
                        if constexpr (kHasHigh<G>) {
                            u[ch] = _mm256_or_si256(u[ch], _mm256_and_si256(mask_half(B.qh[sb][ch], h), _mm256_set1_epi8(16)));
                            u[ch + 4] = _mm256_or_si256(u[ch + 4], _mm256_and_si256(mask_half(B.qh[sb][ch + 4], h), _mm256_set1_epi8(16)));
                        }
                    }
                    const __m256i scale = scales_half(blk.sc, sb, h);
#pragma GCC unroll 8
                    for (int c = 0; c < NC; c++) {
                        if constexpr (kMulDot)
                            isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(dot_bytes<Ops, 8>(u, blk.y[c]->qs + 32 * sb), scale));
                        else if constexpr (Ops::kVnni)
                            isum[c] = dot_halves_scaled<Ops>(isum[c], u, blk.y[c]->qs + 32 * sb, scale);
                        else  // AVX2's Q5_K at 8 columns
                            isum[c] = dot_runs<Ops, 8, safe_run(31)>(isum[c], u, blk.y[c]->qs + 32 * sb, scale);
                    }
                }
                blk.accumulate(B, h, isum, acc.sum[hh], acc.min[hh]);
            }
        }
        acc.template store<true>(out, ld, h0);
    }
    // AVX2: both halves group by group (dot_runs_rows16), NC <= 4 columns. Zen 4, one thread, weights
    // in L2, two runs each against run: Q4_K 1, 2, 4, 8 columns +0, +3, +10, +8 %; Q5_K 1, 2, 4 columns
    // +14, +4, +0 % (8: -11 %, see kRows16Columns). The 16-value K-quants (RowsK16) lost 5-25 % so:
    // their unpacking takes more per group, and run_rows16 shares it among 4 columns where their run
    // shares it among 8.
    template <int NC>
    static LLM_AVX2_INLINE void run_rows16(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float*, int64_t, const int32_t*,
                                           float* out, int64_t ld) {
        const int64_t nb = k / QK_K;
        const G* x = (const G*)W;
        RowsAcc<2, NC> acc;
        acc.clear();
        for (int64_t b = 0; b < nb; b++) {
            const G& B = x[b];
            const Block<NC> blk(B, A, as, b);
            __m256i isum[2][NC];
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) isum[0][c] = isum[1][c] = _mm256_setzero_si256();
            for (int sb = 0; sb < 8; sb++) {
                // Kept at one column, unlike Q8_0's (RowsB32::run): on Zen 4 Q4_K without it decoded 2-9 %
                // faster in phases of halved bandwidth but 3-6 % slower in the others (session 33).
                prefetch_ahead<sizeof(G) / 8, Ops::kLocality>((const char*)&B + sb * (sizeof(G) / 8));
                const __m256i scale16[2] = {scales_half(blk.sc, sb, 0), scales_half(blk.sc, sb, 1)};
                const int8_t* ys[NC];
#pragma GCC unroll 4
                for (int c = 0; c < NC; c++) ys[c] = blk.y[c]->qs + 32 * sb;
                dot_runs_rows16<Ops, RowsQ45K, NC, 8, safe_run(kHasHigh<G> ? 31 : 15)>(isum, B, sb, ys, scale16);
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) blk.accumulate(B, h, isum[h], acc.sum[h], acc.min[h]);
        }
        acc.template store<true>(out, ld, 0);
    }
};
// Q5_K's 8 columns stay with run: its groups take more to unpack (the fifth bits), which run shares
// among 8 columns and run_rows16 among 4 (8 columns -11 %, see there).
template <class G, class Ops>
constexpr int kRows16Columns<RowsQ45K<G, Ops>> = Ops::kVnni ? 0 : kHasHigh<G> ? 4 : 8;
// run (AVX-VNNI, and AVX2's Q5_K at 8 columns): every tile both halves in one pass: the group's weights stream evenly (a pass per
// half reads them all in the first and leaves memory idle in the second), and each block's scales,
// mins and column pair sums are unpacked once, not once per half (measured when AVX2 ran it too, 8
// columns: Llama-3.2-1B shape pp512 +2-3 %, requantized to Q5_K_M +3-5 %; docs/performance.md, session 25).
template <class G, class Ops>
constexpr int kBothHalvesColumns<RowsQ45K<G, Ops>> = 8;

// tile16_k16 on AVX2 and AVX-VNNI alike: each 16-value sub-block in int16 runs times its scale
// (dot_runs; on AVX-VNNI one vpdpwssd per run: Q2_K 8-column tiles +9 % over vpdpbusd's int32 dot and
// a vpmulld by the scale, Q6_K / Q3_K level, docs/performance.md, session 24).
template <class T, class Ops>
struct RowsK16 {
    static constexpr int kGroupMajorColumns = 0;
    template <int NC, int NH>
    static LLM_AVX2_INLINE void run(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float*, int64_t, const int32_t*,
                                    float* out, int64_t ld, int h0) {
        using G = typename T::G;
        constexpr bool kMins = std::is_same_v<T, I16Q2K>;
        // vpshufb patterns giving each 32-bit lane its int16 of the even / the odd sub-block twice
        const __m256i even = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
        const __m256i odd = _mm256_add_epi8(even, _mm256_set1_epi8(2));
        const int64_t nb = k / QK_K;
        const G* x = (const G*)W;
        RowsAcc<NH, NC> acc;
        acc.clear();
        for (int64_t b = 0; b < nb; b++) {
            const G& B = x[b];
            const block_q8_K* y[NC];
            for (int c = 0; c < NC; c++) y[c] = (const block_q8_K*)(A + c * as) + b;
#pragma GCC unroll 2
            for (int hh = 0; hh < NH; hh++) {
                const int h = h0 + hh;
                __m256i sc16[8], mn16[8];
                T::scales_half(B, h, sc16);
                if constexpr (kMins) T::mins_half(B, h, mn16);
                // kept in memory (each is read once per sub-block pair and per column at the end): in
                // registers they crowd out the weights and the column sums, which GCC then spills
                __asm__("" : : "r"(sc16), "r"(mn16) : "memory");
                __m256i isum[NC];
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) isum[c] = _mm256_setzero_si256();
#pragma GCC unroll 16  // constant shift counts in group / group_half (variable ones cost a vpsrlw by xmm each)
                for (int sb = 0; sb < 16; sb++) {
                    if (hh == 0) {
                        prefetch_sub_block16<Ops::kLocality>(B, sb);
                        prefetch_near<Ops::kNear>((const char*)&B + sb * (sizeof(G) / 16), sizeof(G) / 16);
                    }
                    __m256i u[4];
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) u[j] = T::group_half(B, 4 * sb + j, h);
                    const __m256i scale16 = _mm256_shuffle_epi8(sc16[sb / 2], sb % 2 ? odd : even);
#pragma GCC unroll 8
                    for (int c = 0; c < NC; c++) isum[c] = dot_runs<Ops, 4, safe_run(T::kMaxValue)>(isum[c], u, y[c]->qs + 16 * sb, scale16);
                }
                const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.d + 8 * h)));
#pragma GCC unroll 8
                for (int c = 0; c < NC; c++) {
                    __m256i off = _mm256_setzero_si256();  // bsums of sub-blocks 2p and 2p + 1 times the pairs
#pragma GCC unroll 8
                    for (int p = 0; p < 8; p++)
                        off = Ops::madd_add(off, kMins ? mn16[p] : sc16[p], _mm256_set1_epi32((int)load_u32((const uint8_t*)(y[c]->bsums + 2 * p))));
                    const __m256 yd = _mm256_set1_ps(y[c]->d);
                    if constexpr (kMins) {
                        acc.sum[hh][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(dx, yd), acc.sum[hh][c]);
                        const __m256 mx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(B.dmin + 8 * h)));
                        acc.min[hh][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(off), _mm256_mul_ps(mx, yd), acc.min[hh][c]);
                    } else {
                        const __m256i sumi = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(off, T::kOffsetShift));
                        acc.sum[hh][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dx, yd), acc.sum[hh][c]);
                    }
                }
            }
        }
        acc.template store<true>(out, ld, h0);
    }
};
// Up to 4 columns both halves in one pass (4 columns: Q6_K and Q2_K +2-5 %, Q3_K level); 8 would
// spill (Q6_K and Q3_K -35 % on AVX2).
template <class T, class Ops>
constexpr int kBothHalvesColumns<RowsK16<T, Ops>> = 4;
#endif

// ---- BF16 weights interleaved (block_bf16_x16) and their vdpbf16ps tiles (AVX512-BF16) -----------
// The activations are bf16 already (vec_dot_type), so every product is the row kernels' (exact in
// f32); only the order of the f32 sums differs, and bf16 subnormals count as zero. Without
// AVX512-BF16 BF16 weights are not repacked: they keep the file's rows and the FMA row kernels.
// Calls fn(offset in the rows, offset in the group) for each row's value pair of k values (k % 32 == 0).
template <class Fn>
inline void for_bf16_pairs(size_t row_stride, int64_t k, Fn fn) {
    for (int r = 0; r < kInterleaveRows; r++)
        for (int64_t b = 0; b < k / 32; b++)
            for (int p = 0; p < 16; p++) fn(r * row_stride + 64 * b + 4 * p, b * sizeof(block_bf16_x16) + 64 * p + 4 * r);
}
inline void interleave_bf16(const uint8_t* rows, size_t row_stride, int64_t k, uint8_t* group) {
    for_bf16_pairs(row_stride, k, [&](size_t in_rows, size_t in_group) { memcpy(group + in_group, rows + in_rows, 4); });
}
inline void deinterleave_bf16(const uint8_t* group, int64_t k, uint8_t* rows, size_t row_stride) {
    for_bf16_pairs(row_stride, k, [&](size_t in_rows, size_t in_group) { memcpy(rows + in_rows, group + in_group, 4); });
}
// cpuid.(7, 1):EAX[5], AVX512_BF16, on top of the AVX-512 tier (the OS saves the ZMM state).
inline bool avx512_bf16() {
#ifdef LLM_X86
    static const bool has = [] {
        uint32_t a, b, c, d;
        __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
        if (a < 7 || !cpu().avx512) return false;
        __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        if (a < 1) return false;  // no subleaf 1
        __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
        return (a >> 5 & 1) != 0;
    }();
    return has;
#else
    return false;
#endif
}
#ifdef LLM_X86
#define LLM_AVX512BF16_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
LLM_AVX512_WARNINGS_OFF
// 16 rows times NC bf16 columns: each line against the column's value pair, broadcast (vdpbf16ps: two
// products per lane); even and odd lines in separate sums, so each column has two fma chains.
template <int NC>
LLM_AVX512BF16_FN void tile16_bf16(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float*, int64_t,
                                   const int32_t*, float* out, int64_t ld) {
    const block_bf16_x16* x = (const block_bf16_x16*)W;
    __m512 acc[2][NC];
    for (int h = 0; h < 2; h++)
        for (int c = 0; c < NC; c++) acc[h][c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / 32; b++) {
        prefetch_ahead<sizeof(block_bf16_x16)>(&x[b]);
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) {
            const __m512bh w = (__m512bh)_mm512_loadu_si512(x[b].v[p]);
#pragma GCC unroll 8
            for (int c = 0; c < NC; c++) {
                const __m512bh y = (__m512bh)_mm512_set1_epi32((int)load_u32(A + c * as + 64 * b + 4 * p));
                acc[p & 1][c] = _mm512_dpbf16_ps(acc[p & 1][c], w, y);
            }
        }
    }
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + c * ld, _mm512_add_ps(acc[0][c], acc[1][c]));
}
LLM_AVX512_WARNINGS_ON
#endif
// out[c * ld + r] for the 16 rows of the group at W and NC columns; S / ysum: see tile16_b32.
using Tile16Fn = void (*)(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                          const int32_t* ysum, float* out, int64_t ld);

struct InterleavedType {
    bool needs_sums;  // the kernel wants the columns' block sums (weights stored with an offset)
    void (*interleave)(const uint8_t*, size_t, int64_t, uint8_t*);
    void (*deinterleave)(const uint8_t*, int64_t, uint8_t*, size_t);
    std::array<Tile16Fn, 4> tile;       // NC = 1, 2, 4, 8 (AVX-512 VNNI)
    std::array<Tile16Fn, 4> tile_avx2;  // the same on AVX2 (and AVX-512 without VNNI)
    std::array<Tile16Fn, 4> tile_avxvnni;  // and on AVX-VNNI
};
#ifdef LLM_X86
template <class Rows>
std::array<Tile16Fn, 4> avx2_tiles_of() {
    return {tile16_avx2<Rows, 1>, tile16_avx2<Rows, 2>, tile16_avx2<Rows, 4>, tile16_avx2<Rows, 8>};
}
// The AVX2 tiles: RowsNta (the same rows on OpsAVX2Nta) on Zen 2 and older, RowsNear on later AMD CPUs
// (the K16 and Q8_0 tiles on OpsAVX2Near, see prefetch_near and RowsB32::run; the others keep Rows),
// Rows (on OpsAVX2) elsewhere.
template <class Rows, class RowsNta, class RowsNear = Rows>
std::array<Tile16Fn, 4> avx2_tiles() {
    return cpu().zen2 ? avx2_tiles_of<RowsNta>() : cpu().amd ? avx2_tiles_of<RowsNear>() : avx2_tiles_of<Rows>();
}
template <class Rows>
std::array<Tile16Fn, 4> avxvnni_tiles() {
    return {tile16_avxvnni<Rows, 1>, tile16_avxvnni<Rows, 2>, tile16_avxvnni<Rows, 4>, tile16_avxvnni<Rows, 8>};
}
// The AVX-512 VNNI tiles of a 32-value type. On AMD, Q8_0's 1-column tile prefetches 2 KiB ahead, not
// 8: Zen 4, SmolLM2 shape Q8_0 decode in one process, both tiles in symmetric order (ABBA), four runs
// of 40 rounds: +3.2, +4.3, +5.4 and +4.2 %. An added prefetch 2 KiB ahead (into L1 or L2) beside
// the 8 KiB one, or prefetching a task's first 8 KiB before it starts, were level; Q5_0 at 2 KiB lost
// 2 %, Q4_1 was level, and the AVX2 tiles at 2 KiB lost 7 % (session 29). Zen 5 is unmeasured.
template <class G, int Offset, bool Table>
std::array<Tile16Fn, 4> b32_tiles() {
    const bool short_prefetch = kHasBytes<G> && cpu().amd;  // Q8_0 on AMD: the near prefetch's distance
    return {short_prefetch ? tile16_b32<G, Offset, Table, 1, kNearPrefetchBytes> : tile16_b32<G, Offset, Table, 1>,
            tile16_b32<G, Offset, Table, 2>, tile16_b32<G, Offset, Table, 4>, tile16_b32<G, Offset, Table, 8>};
}
// The AVX-512 VNNI tiles of Q4_K / Q5_K and of the K16 types, with or without the near prefetch (on AMD).
// On AMD, Q4_K's 1-column tile is the AVX2 one: slower in L2 (Zen 4, one thread: 34 against 41 GB/s)
// but it streams decode's weights faster. Zen 4, two threads, alternating in one process with the
// AVX-512 tile: Llama-3.2-1B shape tg +0.4-5.9 % (median of nine runs +2.3 %), DeepSeek-V2-Lite shape
// tg +3.0 / +4.6 %, pp8 +1.9 %; one column over 96 MiB 0.93 -> 0.96 of a stream sum's bandwidth. Q5_K's
// AVX2 tile streamed slower (0.91 -> 0.88) and is not used; a 4 KiB prefetch distance for the AVX-512
// tile did as well in decode but lost 2 % in pp8 (session 29). Zen 5 is unmeasured.
template <class G, bool Near>
std::array<Tile16Fn, 4> q45_K_tiles() {
    constexpr bool kAvx2Column = Near && !kHasHigh<G>;
    return {kAvx2Column ? tile16_avx2<RowsQ45K<G, OpsAVX2>, 1> : tile16_q45_K<G, 1, Near>, tile16_q45_K<G, 2, Near>,
            tile16_q45_K<G, 4, Near>, tile16_q45_K<G, 8, Near>};
}
template <class T, bool Near>
std::array<Tile16Fn, 4> k16_tiles() {
    return {tile16_k16<T, 1, Near>, tile16_k16<T, 2, Near>, tile16_k16<T, 4, Near>, tile16_k16<T, 8, Near>};
}
#endif
template <class X, class G, int Offset, bool Table>
InterleavedType interleaved_b32() {
    return {Offset != 0, interleave_group<X, G, interleave_b32<X, G>>, deinterleave_group<X, G, deinterleave_b32<X, G>>,
#ifdef LLM_X86
            b32_tiles<G, Offset, Table>(),
            avx2_tiles<RowsB32<G, Offset, Table, OpsAVX2>, RowsB32<G, Offset, Table, OpsAVX2Nta>,
                       RowsB32<G, Offset, Table, std::conditional_t<kHasBytes<G>, OpsAVX2Near, OpsAVX2>>>(),
            avxvnni_tiles<RowsB32<G, Offset, Table, OpsAVXVNNI>>()};
#else
            {}, {}, {}};
#endif
}
template <class X, class G>
InterleavedType interleaved_q45_K() {
    return {false, interleave_group<X, G, interleave_q45_K<X, G>>, deinterleave_group<X, G, deinterleave_q45_K<X, G>>,
#ifdef LLM_X86
            cpu().amd ? q45_K_tiles<G, true>() : q45_K_tiles<G, false>(),
            avx2_tiles<RowsQ45K<G, OpsAVX2>, RowsQ45K<G, OpsAVX2Nta>>(),
            avxvnni_tiles<RowsQ45K<G, OpsAVXVNNI>>()};
#else
            {}, {}, {}};
#endif
}
template <class X, class G, void (*In)(const X&, int, G&), void (*Out)(const G&, int, X&)>
InterleavedType interleaved_k16() {
    return {false, interleave_group<X, G, In>, deinterleave_group<X, G, Out>,
#ifdef LLM_X86
            cpu().amd ? k16_tiles<I16Of<G>, true>() : k16_tiles<I16Of<G>, false>(),
            avx2_tiles<RowsK16<I16Of<G>, OpsAVX2>, RowsK16<I16Of<G>, OpsAVX2Nta>, RowsK16<I16Of<G>, OpsAVX2Near>>(),
            avxvnni_tiles<RowsK16<I16Of<G>, OpsAVXVNNI>>()};
#else
            {}, {}, {}};
#endif
}
// BF16's layout and tiles where the CPU has vdpbf16ps; elsewhere the layout only (no tiles: not used).
inline InterleavedType interleaved_bf16() {
#ifdef LLM_X86
    if (avx512_bf16())
        return {false, interleave_bf16, deinterleave_bf16, {tile16_bf16<1>, tile16_bf16<2>, tile16_bf16<4>, tile16_bf16<8>}, {}, {}};
#endif
    return {false, interleave_bf16, deinterleave_bf16, {}, {}, {}};
}
// Every interleaved type's entry, built together on the first lookup.
struct InterleavedTypes {
    InterleavedType bf16 = interleaved_bf16();
    InterleavedType q4_K = interleaved_q45_K<block_q4_K, block_q4_K_x16>();
    InterleavedType q5_K = interleaved_q45_K<block_q5_K, block_q5_K_x16>();
    InterleavedType q6_K = interleaved_k16<block_q6_K, block_q6_K_x16, interleave_q6_K, deinterleave_q6_K>();
    InterleavedType q3_K = interleaved_k16<block_q3_K, block_q3_K_x16, interleave_q3_K, deinterleave_q3_K>();
    InterleavedType q2_K = interleaved_k16<block_q2_K, block_q2_K_x16, interleave_q2_K, deinterleave_q2_K>();
    InterleavedType q4_0 = interleaved_b32<block_q4_0, block_q4_0_x16, 8, false>();
    InterleavedType q4_1 = interleaved_b32<block_q4_1, block_q4_1_x16, 0, false>();
    InterleavedType q5_0 = interleaved_b32<block_q5_0, block_q5_0_x16, 16, false>();
    InterleavedType q5_1 = interleaved_b32<block_q5_1, block_q5_1_x16, 0, false>();
    InterleavedType q8_0 = interleaved_b32<block_q8_0, block_q8_0_x16, 128, false>();
    InterleavedType iq4_nl = interleaved_b32<block_iq4_nl, block_q4_0_x16, 128, true>();
    __attribute__((noinline)) InterleavedTypes() {}
};
// One guarded static, its constructor out of line: the lookup runs for every matmul task (thousands
// per decoded token), and with twelve guarded statics and their builders inlined it was 3 KiB of code
// and 1.2 % of the SmolLM2 shape's decode samples (session 29).
inline const InterleavedType* interleaved_type(Type t) {
    static const InterleavedTypes all;
    switch (t) {
    case Type::Q4_K: return &all.q4_K;
    case Type::Q5_K: return &all.q5_K;
    case Type::Q6_K: return &all.q6_K;
    case Type::Q3_K: return &all.q3_K;
    case Type::Q2_K: return &all.q2_K;
    case Type::Q4_0: return &all.q4_0;
    case Type::Q4_1: return &all.q4_1;
    case Type::Q5_0: return &all.q5_0;
    case Type::Q5_1: return &all.q5_1;
    case Type::Q8_0: return &all.q8_0;
    case Type::IQ4_NL: return &all.iq4_nl;
    case Type::BF16: return &all.bf16;
    default: return nullptr;
    }
}
} // namespace qimpl

// ---- 6x. AMX tiles for prefill (Sapphire Rapids and newer) ------------------------------------
// The interleaved groups' 64-byte lines (four values of each of 16 rows, row r at bytes 4r..4r+3)
// are already the B operand of AMX's byte tile products, so AMX reuses the repacked weights as they
// are (lossless, same size, no second layout). One tile product C[col][row] = A[col] . B[row] covers
// one 32-value block (Q4_K / Q5_K: one 32-value sub-block) of 16 activation columns and 16 rows:
// the activations' signed quants are A, loaded in place (one line per column, the activation row
// as stride), the unsigned weight bytes u = value + offset are B (TDPBSUD), unpacked to a 512-byte
// buffer first except for Q8_0. The int32 products are exact, so each block's sum equals the VNNI
// kernel's; the products of a few blocks are stored, then every column runs the VNNI kernel's float
// steps (the shared accumulate_* functions) in the same block order: results are bit-identical.
// The OS must grant the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once).
namespace qimpl {
#if defined(LLM_X86) && defined(__linux__)
// cpuid: AMX-TILE and AMX-INT8; XCR0: XTILECFG and XTILEDATA enabled; then the permission request.
inline bool amx_granted() {
    uint32_t a, b, c, d;
    __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7 || !cpu().vnni) return false;
    __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!(d >> 24 & 1) || !(d >> 25 & 1)) return false;
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x60000) != 0x60000) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#else
inline bool amx_granted() { return false; }
#endif

// -1: not chosen yet, else whether AMX is on (when available and the ISA in use is AVX-512 VNNI).
inline std::atomic<int>& amx_state() {
    static std::atomic<int> s{-1};
    return s;
}

#if defined(LLM_X86) && defined(__linux__)
#define LLM_AMX_FN \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))
#define LLM_AMX_INLINE \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8"), always_inline)) inline

// Palette 1: tiles 0, 1, 3 = A (16 columns x line_bytes), 2 = B (line_bytes / 4 lines of 64), 4..7 = C
// (16 x 16 int32 or f32). Loaded once per matmul_rows_interleaved call, not per kernel call: ldtilecfg
// took 17% of the INT8 kernels' time when every 16/32-column call loaded it (docs/performance.md).
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
LLM_AMX_FN inline void amx_configure(int line_bytes) {
    TileConfig cfg;
    for (int t : {0, 1, 3}) cfg.rows[t] = 16, cfg.colsb[t] = (uint16_t)line_bytes;
    cfg.rows[2] = (uint8_t)(line_bytes / 4), cfg.colsb[2] = 64;
    for (int t = 4; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    // ldtilecfg reads all 64 bytes; GCC 12's _tile_loadconfig names an 8-byte operand, so the stores
    // past it were dropped as dead once this function was no longer inlined (tiles unconfigured: SIGILL).
    __asm__ __volatile__("ldtilecfg %0" : : "m"(cfg));
}
// dots[c][r] = (activation column c: the A line at a + c * as) . (weight row r: the B tile at w) for
// NT * 16 columns; the weight bytes signed or unsigned.
template <int NT, bool Signed>
LLM_AMX_INLINE void amx_product(const uint8_t* w, const uint8_t* a, size_t as, int32_t (*dots)[16]) {
    _tile_loadd(2, w, 64);
    _tile_loadd(0, a, (long)as);
    _tile_zero(4);
    if constexpr (Signed) _tile_dpbssd(4, 0, 2);
    else _tile_dpbsud(4, 0, 2);
    if constexpr (NT == 2) {
        _tile_loadd(1, a + 16 * as, (long)as);
        _tile_zero(5);
        if constexpr (Signed) _tile_dpbssd(5, 1, 2);
        else _tile_dpbsud(5, 1, 2);
        _tile_stored(5, dots[16], 64);
    }
    _tile_stored(4, dots[0], 64);
}

LLM_AVX512_WARNINGS_OFF
// 32-value types (see tile16_b32): kAmxBlocks blocks' products, then each column's float steps. Types
// stored with an offset go back to signed values (TDPBSSD), so the offset term drops out: the same
// integer as dot(u, y) - Offset * sum(y).
constexpr int kAmxBlocks = 8;
template <class G, int Offset, bool Table, int NT>
LLM_AMX_FN void amx16_b32(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float* S, int64_t ss,
                          const int32_t* ysum, float* out, int64_t ld) {
    using Y = std::conditional_t<kHasMin<G>, block_q8_1, block_q8_0>;
    constexpr int NC = 16 * NT;
    const int64_t nb = k / 32;
    const G* x = (const G*)W;
    const __m512i table = Table ? iq4nl_table512<Offset>() : _mm512_setzero_si512();
    __m512 acc[NC], accm[NC];
    for (int c = 0; c < NC; c++) acc[c] = accm[c] = _mm512_setzero_ps();
    alignas(64) int32_t dots[kAmxBlocks][NC][16];
    alignas(64) uint8_t unpacked[kAmxBlocks][8][64];
    for (int64_t b0 = 0; b0 < nb; b0 += kAmxBlocks) {
        const int n = (int)std::min<int64_t>(kAmxBlocks, nb - b0);
        __m512 dx[kAmxBlocks], mx[kAmxBlocks];
        const uint8_t* w[kAmxBlocks];
        for (int i = 0; i < n; i++) {  // the vector work first, then the tile products
            const G& B = x[b0 + i];
            prefetch_ahead<sizeof(G)>(&B);
            w[i] = (const uint8_t*)B.qs;
            if constexpr (!kHasBytes<G> || Offset != 0) {
                __m512i u[8];
                unpack_b32<G, Table>(B, table, u);
                for (int l = 0; l < 8; l++) _mm512_store_si512(unpacked[i][l], _mm512_sub_epi8(u[l], _mm512_set1_epi8((char)Offset)));
                w[i] = unpacked[i][0];
            }
            dx[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.d)), mx[i] = mins_b32(B);
        }
        for (int i = 0; i < n; i++) amx_product<NT, Offset != 0>(w[i], A + (b0 + i) * sizeof(Y) + offsetof(Y, qs), as, dots[i]);
        for (int c = 0; c < NC; c += 4)  // four columns' sums at a time (independent fma chains)
            for (int i = 0; i < n; i++)
#pragma GCC unroll 4
                for (int cc = c; cc < c + 4; cc++)
                    accumulate_b32<G, 0>(_mm512_load_si512(dots[i][cc]), dx[i], mx[i], S, ss, ysum, cc, b0 + i, nb, acc[cc], accm[cc]);
    }
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + c * ld, _mm512_add_ps(acc[c], accm[c]));
}

// Q4_K / Q5_K (see tile16_q45_K): a block's eight 32-value sub-blocks, then per column the scaled
// integer sum and the block's float steps.
template <class G, int NT>
LLM_AMX_FN void amx16_q45_K(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float*, int64_t, const int32_t*,
                            float* out, int64_t ld) {
    constexpr int NC = 16 * NT;
    const int64_t nb = k / QK_K;
    const G* x = (const G*)W;
    __m512 acc[NC], accm[NC];
    for (int c = 0; c < NC; c++) acc[c] = accm[c] = _mm512_setzero_ps();
    alignas(64) int32_t dots[8][NC][16];
    alignas(64) uint8_t unpacked[8][8][64];
    for (int64_t b = 0; b < nb; b++) {
        const G& B = x[b];
        alignas(64) uint8_t sc[128], mn[128];
        unpack6<128>(B.scales_lo, B.hi, 0, sc);
        unpack6<128>(B.mins_lo, B.hi, 4, mn);
        for (int sb = 0; sb < 8; sb++) {
            prefetch_ahead<sizeof(G) / 8>((const char*)&B + sb * (sizeof(G) / 8));
            for (int ch = 0; ch < 4; ch++) {
                __m512i lo, hi;
                unpack_q45_K(B, sb, ch, lo, hi);
                _mm512_store_si512(unpacked[sb][ch], lo);
                _mm512_store_si512(unpacked[sb][ch + 4], hi);
            }
        }
        for (int sb = 0; sb < 8; sb++)
            amx_product<NT, false>(unpacked[sb][0], A + b * sizeof(block_q8_K) + offsetof(block_q8_K, qs) + 32 * sb, as, dots[sb]);
        __m512i scale[8];
        for (int sb = 0; sb < 8; sb++) scale[sb] = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i*)(sc + 16 * sb)));
        const __m512 dx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.d));
        const __m512 mx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)B.dmin));
        for (int c = 0; c < NC; c += 4) {  // four columns at a time (independent chains)
            __m512i isum[4] = {};
            for (int sb = 0; sb < 8; sb++)
#pragma GCC unroll 4
                for (int cc = 0; cc < 4; cc++)
                    isum[cc] = _mm512_add_epi32(isum[cc], _mm512_mullo_epi32(_mm512_load_si512(dots[sb][c + cc]), scale[sb]));
#pragma GCC unroll 4
            for (int cc = 0; cc < 4; cc++)
                accumulate_q45_K(((const block_q8_K*)(A + (c + cc) * as))[b], mn, isum[cc], dx, mx, acc[c + cc], accm[c + cc]);
        }
    }
    for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + c * ld, _mm512_sub_ps(acc[c], accm[c]));
}

LLM_AVX512_WARNINGS_ON

#define LLM_AMXBF16_FN \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8,amx-bf16")))
#define LLM_AMXBF16_INLINE \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8,amx-bf16"), always_inline)) inline
// cpuid.(7, 0):EDX[22], AMX-BF16 (the tile state itself: amx_granted).
inline bool amx_bf16() {
    uint32_t a, b, c, d;
    __asm__ __volatile__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    return (d >> 22 & 1) != 0;
}
// BF16 (block_bf16_x16, see tile16_bf16): one TDPBF16PS per 32-value block and 16 columns (the bf16
// activations in place, as A), summed in f32 in the C tiles over the whole row and stored straight
// into the output, whose column stride is the C tile's. Up to four column tiles share each B tile
// (every tile 16 rows of 64 bytes: A in 0, 1, 3, B in 2, C in 4..7); the fourth reuses A tile 0.
enum class Bf16TileOp { Zero, Product, Store };
template <int T, Bf16TileOp Op>
LLM_AMXBF16_INLINE void amx_bf16_tile(const uint8_t* a, size_t as, float* out, int64_t ld) {
    constexpr bool zero = Op == Bf16TileOp::Zero, product = Op == Bf16TileOp::Product;
    a += 16 * T * as, out += 16 * T * ld;
    const long out_stride = (long)(ld * sizeof(float));
    if constexpr (T == 0) {
        if constexpr (zero) _tile_zero(4);
        else if constexpr (product) { _tile_loadd(0, a, (long)as); _tile_dpbf16ps(4, 0, 2); }
        else _tile_stored(4, out, out_stride);
    } else if constexpr (T == 1) {
        if constexpr (zero) _tile_zero(5);
        else if constexpr (product) { _tile_loadd(1, a, (long)as); _tile_dpbf16ps(5, 1, 2); }
        else _tile_stored(5, out, out_stride);
    } else if constexpr (T == 2) {
        if constexpr (zero) _tile_zero(6);
        else if constexpr (product) { _tile_loadd(3, a, (long)as); _tile_dpbf16ps(6, 3, 2); }
        else _tile_stored(6, out, out_stride);
    } else {
        if constexpr (zero) _tile_zero(7);
        else if constexpr (product) { _tile_loadd(0, a, (long)as); _tile_dpbf16ps(7, 0, 2); }
        else _tile_stored(7, out, out_stride);
    }
}
template <int NT, Bf16TileOp Op>
LLM_AMXBF16_INLINE void amx_bf16_tiles(const uint8_t* a, size_t as, float* out, int64_t ld) {
    amx_bf16_tile<0, Op>(a, as, out, ld);
    if constexpr (NT > 1) amx_bf16_tile<1, Op>(a, as, out, ld);
    if constexpr (NT > 2) amx_bf16_tile<2, Op>(a, as, out, ld), amx_bf16_tile<3, Op>(a, as, out, ld);
}
template <int NT>
LLM_AMXBF16_FN void amx16_bf16(int64_t k, const uint8_t* W, const uint8_t* A, size_t as, const float*, int64_t, const int32_t*,
                               float* out, int64_t ld) {
    static_assert(NT == 1 || NT == 2 || NT == 4, "column tiles");
    const block_bf16_x16* x = (const block_bf16_x16*)W;
    amx_bf16_tiles<NT, Bf16TileOp::Zero>(A, as, out, ld);
    for (int64_t b = 0; b < k / 32; b++) {
        _tile_loadd(2, x[b].v, 64);
        amx_bf16_tiles<NT, Bf16TileOp::Product>(A + 64 * b, as, out, ld);
    }
    amx_bf16_tiles<NT, Bf16TileOp::Store>(A, as, out, ld);
}
#endif

// Fewer columns go to the vector tiles (measured: see docs/performance.md).
constexpr int64_t kAmxMinColumns = 16;
// The AMX tiles of a weight type for 16 and 32 columns (nullptr: none), or nullptr. The K-quants'
// products of 32 columns (16 or 32 KiB) crowd L1 out: measured slower than twice 16 columns. The
// 16-value K-quants (Q6_K, Q3_K, Q2_K) have none: a tile product of K = 16 (a quarter of its depth)
// per sub-block, each stored and scaled per column, ran 10-16 % slower end to end than the VNNI tiles
// (Llama-3.2-1B shape pp512, docs/performance.md, session 23).
inline const Tile16Fn* amx_tiles(Type t) {
#if defined(LLM_X86) && defined(__linux__)
    static const Tile16Fn q4_0[2] = {amx16_b32<block_q4_0_x16, 8, false, 1>, amx16_b32<block_q4_0_x16, 8, false, 2>};
    static const Tile16Fn q4_1[2] = {amx16_b32<block_q4_1_x16, 0, false, 1>, amx16_b32<block_q4_1_x16, 0, false, 2>};
    static const Tile16Fn q5_0[2] = {amx16_b32<block_q5_0_x16, 16, false, 1>, amx16_b32<block_q5_0_x16, 16, false, 2>};
    static const Tile16Fn q5_1[2] = {amx16_b32<block_q5_1_x16, 0, false, 1>, amx16_b32<block_q5_1_x16, 0, false, 2>};
    static const Tile16Fn q8_0[2] = {amx16_b32<block_q8_0_x16, 128, false, 1>, amx16_b32<block_q8_0_x16, 128, false, 2>};
    static const Tile16Fn iq4_nl[2] = {amx16_b32<block_q4_0_x16, 128, true, 1>, amx16_b32<block_q4_0_x16, 128, true, 2>};
    static const Tile16Fn q4_K[2] = {amx16_q45_K<block_q4_K_x16, 1>, nullptr};
    static const Tile16Fn q5_K[2] = {amx16_q45_K<block_q5_K_x16, 1>, nullptr};
    static const Tile16Fn bf16[2] = {amx16_bf16<1>, amx16_bf16<2>};
    static const bool has_bf16 = amx_bf16();
    switch (t) {
    case Type::Q4_0: return q4_0;
    case Type::Q4_1: return q4_1;
    case Type::Q5_0: return q5_0;
    case Type::Q5_1: return q5_1;
    case Type::Q8_0: return q8_0;
    case Type::IQ4_NL: return iq4_nl;
    case Type::Q4_K: return q4_K;
    case Type::Q5_K: return q5_K;
    case Type::BF16: return has_bf16 ? bf16 : nullptr;
    default: return nullptr;
    }
#else
    (void)t;
    return nullptr;
#endif
}

// A type's AMX tile for 64 columns, or nullptr (BF16 only: its C tiles hold the sums, so four column
// tiles fit beside one B tile; measured 1.15-1.5x the 32-column tile, see docs/performance.md).
inline Tile16Fn amx_tile64(Type t) {
#if defined(LLM_X86) && defined(__linux__)
    return t == Type::BF16 && amx_tiles(t) ? amx16_bf16<4> : nullptr;
#else
    (void)t;
    return nullptr;
#endif
}

// The A tiles' line bytes of a type's AMX kernels (see amx_configure): a 32-value block of bytes, a
// 16-value sub-block (Q6_K, Q3_K, Q2_K), or a 32-value block of bf16.
inline int amx_line_bytes(Type t) {
    return t == Type::Q6_K || t == Type::Q3_K || t == Type::Q2_K ? 16 : t == Type::BF16 ? 64 : 32;
}
// Frees the tile state (a thread that used AMX keeps 8 KiB of it in every context switch otherwise).
#if defined(LLM_X86) && defined(__linux__)
LLM_AMX_FN inline void amx_release() { _tile_release(); }
#else
inline void amx_configure(int) {}
inline void amx_release() {}
#endif
} // namespace qimpl

bool amx_available() {
    static const bool granted = qimpl::amx_granted();
    return granted;
}

// The initial choice: on where available, off under $LLM_ISA=avx512 (or a lower tier).
static bool amx_initial() {
    const char* env = getenv("LLM_ISA");
    if (env && strcmp(env, "amx") == 0 && !amx_available())
        fprintf(stderr, "llm: LLM_ISA=amx is not supported by this CPU (or the OS refused the tile state), using %s\n",
                isa_name(isa_best()).c_str());
    return amx_available() && (!env || !*env || strcmp(env, "amx") == 0);
}

bool amx_enabled() {
    int s = qimpl::amx_state().load(std::memory_order_relaxed);
    if (s < 0) {
        s = amx_initial();
        qimpl::amx_state().store(s, std::memory_order_relaxed);
    }
    return s && isa_current() == Isa::AVX512 && qimpl::cpu().vnni;
}

void amx_set(bool on) {
    if (on && !amx_available()) fail("AMX is not supported by this CPU (or the OS refused the tile state)");
    qimpl::amx_state().store(on, std::memory_order_relaxed);
}

namespace qimpl {
// What k must be a multiple of: the type's block, or BF16's 32-value tile blocks.
inline int64_t interleave_k_unit(Type t) { return t == Type::BF16 ? 32 : type_info(t).block_size; }
// The interleaved tiles of the ISA in use: AVX-512 VNNI's, AVX-VNNI's, else AVX2's; nullptr on the scalar path.
inline const Tile16Fn* interleaved_tiles(const InterleavedType& it) {
    const Isa isa = isa_current();
    if (isa == Isa::AVX512 && cpu().vnni && it.tile[0]) return it.tile.data();
    if (isa == Isa::AVXVNNI && it.tile_avxvnni[0]) return it.tile_avxvnni.data();
    if (isa != Isa::Scalar && it.tile_avx2[0]) return it.tile_avx2.data();
    return nullptr;
}
} // namespace qimpl

bool interleave_supported(Type t, int64_t k, int64_t rows) {
    const qimpl::InterleavedType* it = qimpl::interleaved_type(t);
    return it && qimpl::interleaved_tiles(*it) && rows % kInterleaveRows == 0 && k % qimpl::interleave_k_unit(t) == 0;
}

static const qimpl::InterleavedType& interleaved_or_fail(Type t, int64_t k, int64_t rows) {
    const qimpl::InterleavedType* it = qimpl::interleaved_type(t);
    if (!it || rows % kInterleaveRows || k % qimpl::interleave_k_unit(t))
        fail("cannot interleave %lld rows of %lld %s values", (long long)rows, (long long)k, type_info(t).name);
    return *it;
}

void interleave_rows16(Type t, const uint8_t* src, uint8_t* dst, int64_t k, int64_t rows) {
    const qimpl::InterleavedType& it = interleaved_or_fail(t, k, rows);
    const size_t rb = row_bytes(t, k);
    for (int64_t g = 0; g < rows; g += kInterleaveRows) it.interleave(src + g * rb, rb, k / type_info(t).block_size, dst + g * rb);
}

void deinterleave_rows16(Type t, const uint8_t* src, uint8_t* dst, int64_t k, int64_t rows) {
    const qimpl::InterleavedType& it = interleaved_or_fail(t, k, rows);
    const size_t rb = row_bytes(t, k);
    for (int64_t g = 0; g < rows; g += kInterleaveRows) it.deinterleave(src + g * rb, k / type_info(t).block_size, dst + g * rb, rb);
}

void dequantize_interleaved_row(Type t, const uint8_t* W, int64_t k, int64_t row, float* dst) {
    const int64_t g = row - row % kInterleaveRows;
    const size_t rb = row_bytes(t, k);
    thread_local std::vector<uint8_t> rows;
    rows.resize(kInterleaveRows * rb);
    interleaved_or_fail(t, k, kInterleaveRows).deinterleave(W + g * rb, k / type_info(t).block_size, rows.data(), rb);
    dequantize_row(t, rows.data() + (row - g) * rb, dst, k);
}

bool interleave_needs_sums(Type t) {
    const qimpl::InterleavedType* it = qimpl::interleaved_type(t);
    return it && it->needs_sums;
}

void matmul_rows_interleaved(Type wt, const uint8_t* W, int64_t k, int64_t r0, int64_t r1, const uint8_t* act,
                             size_t act_row_bytes, int64_t n_act, float* out, int64_t ld_out, const ActInfo* info) {
    const qimpl::InterleavedType& it = interleaved_or_fail(wt, k, r1 - r0);
    const size_t rb = row_bytes(wt, k);
    if (!interleave_supported(wt, k, r1 - r0)) {
        // The ISA was lowered after the weights were repacked (tests): restore rows, then the row kernels.
        thread_local std::vector<uint8_t> rows;
        rows.resize(kInterleaveRows * rb);
        for (int64_t g = r0; g < r1; g += kInterleaveRows) {
            it.deinterleave(W + g * rb, k / type_info(wt).block_size, rows.data(), rb);
            matmul_rows(wt, rows.data(), rb, k, 0, kInterleaveRows, act, act_row_bytes, n_act, out + g, ld_out, info);
        }
        return;
    }
    thread_local ActInfo local;
    if (!info || (it.needs_sums && info->sums.empty()))
        act_info(vec_dot_type(wt), act, act_row_bytes, n_act, k, it.needs_sums, local), info = &local;
    const int64_t ss = info->stride;
    const qimpl::Tile16Fn* tiles = qimpl::interleaved_tiles(it);
    const qimpl::Tile16Fn* amx = n_act >= qimpl::kAmxMinColumns && amx_enabled() ? qimpl::amx_tiles(wt) : nullptr;
    const qimpl::Tile16Fn amx64 = amx ? qimpl::amx_tile64(wt) : nullptr;
    if (amx) qimpl::amx_configure(qimpl::amx_line_bytes(wt));
    // Per row group, every column (the group's weights stay in L1/L2 across column tiles): AMX's
    // 64 (BF16), 32 and 16 columns first, then the vector tiles.
    for (int64_t g = r0; g < r1; g += kInterleaveRows) {
        int64_t j = 0;
        auto run = [&](qimpl::Tile16Fn tile, int nc) {
            for (; j + nc <= n_act; j += nc)
                tile(k, W + g * rb, act + j * act_row_bytes, act_row_bytes, info->scales.data() + j * ss, ss,
                     it.needs_sums ? info->sums.data() + j * (k / QK8_0) : nullptr, out + j * ld_out + g, ld_out);
        };
        if (amx64) run(amx64, 64);
        if (amx && amx[1]) run(amx[1], 32);
        if (amx) run(amx[0], 16);
        for (int w = 3; w >= 0; w--) run(tiles[w], qimpl::kTileWidths[w]);
    }
    if (amx) qimpl::amx_release();
}

// ---- attention's weighted sum of cache rows --------------------------------------------------

namespace qimpl {
#ifdef LLM_X86
struct LoadF32 {
    static LLM_AVX2_INLINE __m256 load(const uint8_t* row, int64_t d) { return _mm256_loadu_ps((const float*)row + d); }
};
struct LoadF16 {
    static LLM_AVX2_INLINE __m256 load(const uint8_t* row, int64_t d) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)((const uint16_t*)row + d)));
    }
};
// out = sum over r of w[r] * row r for the first dim values (a multiple of 8) of f32/f16 rows; 64
// output values stay in registers while the rows stream past; each sum runs in row order.
template <class L>
LLM_AVX2_INLINE void weighted_sum_simd(const uint8_t* rows, size_t stride, const float* w, int64_t n_rows, int64_t dim,
                                       float* out, bool accumulate) {
    int64_t d = 0;
    for (; d + 64 <= dim; d += 64) {
        __m256 acc[8];
        for (int u = 0; u < 8; u++) acc[u] = accumulate ? _mm256_loadu_ps(out + d + 8 * u) : _mm256_setzero_ps();
        for (int64_t r = 0; r < n_rows; r++) {
            const __m256 wr = _mm256_set1_ps(w[r]);
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) acc[u] = _mm256_fmadd_ps(wr, L::load(rows + r * stride, d + 8 * u), acc[u]);
        }
        for (int u = 0; u < 8; u++) _mm256_storeu_ps(out + d + 8 * u, acc[u]);
    }
    for (; d + 8 <= dim; d += 8) {
        __m256 acc = accumulate ? _mm256_loadu_ps(out + d) : _mm256_setzero_ps();
        for (int64_t r = 0; r < n_rows; r++) acc = _mm256_fmadd_ps(_mm256_set1_ps(w[r]), L::load(rows + r * stride, d), acc);
        _mm256_storeu_ps(out + d, acc);
    }
}
LLM_AVX2_FN void weighted_sum_f32(const uint8_t* rows, size_t stride, const float* w, int64_t n_rows, int64_t dim, float* out,
                                  bool accumulate) {
    weighted_sum_simd<LoadF32>(rows, stride, w, n_rows, dim, out, accumulate);
}
LLM_AVX2_FN void weighted_sum_f16(const uint8_t* rows, size_t stride, const float* w, int64_t n_rows, int64_t dim, float* out,
                                  bool accumulate) {
    weighted_sum_simd<LoadF16>(rows, stride, w, n_rows, dim, out, accumulate);
}
// The same for HB weight vectors at once (attention heads sharing a KV head: a latent cache's 16
// heads read the same rows) over kValues values from d, so each row is converted once per HB heads;
// every sum keeps its row order, so the results are those of weighted_sum_simd. Written once over a
// vector width: Lanes16 (AVX-512, 64 values per step) and Lanes8 (AVX2, 32).
LLM_AVX512_WARNINGS_OFF
// Not always_inline (like OpsVNNI): they inline once the AVX2-targeted body has been inlined into
// its AVX-512 wrapper.
struct Lanes16 {
    using F = __m512;
    static constexpr int kValues = 64;
    static inline LLM_AVX512_FN F zero() { return _mm512_setzero_ps(); }
    static inline LLM_AVX512_FN F set1(float v) { return _mm512_set1_ps(v); }
    static inline LLM_AVX512_FN F load(const float* p) { return _mm512_loadu_ps(p); }
    static inline LLM_AVX512_FN void store(float* p, F v) { _mm512_storeu_ps(p, v); }
    static inline LLM_AVX512_FN F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static inline LLM_AVX512_FN F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    // the softmax's (see softmax_body)
    static inline LLM_AVX512_FN F add(F a, F b) { return _mm512_add_ps(a, b); }
    static inline LLM_AVX512_FN F fms(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
    static inline LLM_AVX512_FN F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
    static inline LLM_AVX512_FN F max(F a, F b) { return _mm512_max_ps(a, b); }
    static inline LLM_AVX512_FN float hmax(F v) { return _mm512_reduce_max_ps(v); }
    static inline LLM_AVX512_FN F round(F v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    // 2^n for integral n in [-126, 127], through the exponent bits
    static inline LLM_AVX512_FN F exp2i(F n) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    }
    // v where x >= limit, else 0
    static inline LLM_AVX512_FN F where_at_least(F v, F x, float limit) {
        return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(limit), _CMP_GE_OQ), v);
    }
    static inline LLM_AVX512_FN F round_f16(F v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
    static inline LLM_AVX512_FN F half(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
    static inline LLM_AVX512_FN F ints(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p))); }
    // the 16 values of nibble (hi) of 16 bytes, minus 8 (Q4_0) or through the IQ4_NL table
    static inline LLM_AVX512_FN F nibbles(const uint8_t* p, bool hi, bool table) {
        __m512i n = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
        n = _mm512_and_si512(hi ? _mm512_srli_epi32(n, 4) : n, _mm512_set1_epi32(15));
        return table ? _mm512_permutexvar_ps(n, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)kIQ4NLValues))))
                     : _mm512_cvtepi32_ps(_mm512_sub_epi32(n, _mm512_set1_epi32(8)));
    }
};
struct Lanes8 {
    using F = __m256;
    static constexpr int kValues = 32;
    static LLM_AVX2_INLINE F zero() { return _mm256_setzero_ps(); }
    static LLM_AVX2_INLINE F set1(float v) { return _mm256_set1_ps(v); }
    static LLM_AVX2_INLINE F load(const float* p) { return _mm256_loadu_ps(p); }
    static LLM_AVX2_INLINE void store(float* p, F v) { _mm256_storeu_ps(p, v); }
    static LLM_AVX2_INLINE F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static LLM_AVX2_INLINE F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    // the softmax's (see softmax_body)
    static LLM_AVX2_INLINE F add(F a, F b) { return _mm256_add_ps(a, b); }
    static LLM_AVX2_INLINE F fms(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
    static LLM_AVX2_INLINE F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
    static LLM_AVX2_INLINE F max(F a, F b) { return _mm256_max_ps(a, b); }
    static LLM_AVX2_INLINE float hmax(F v) { return hmax8(v); }
    static LLM_AVX2_INLINE F round(F v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static LLM_AVX2_INLINE F exp2i(F n) {
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    }
    static LLM_AVX2_INLINE F where_at_least(F v, F x, float limit) {
        return _mm256_and_ps(v, _mm256_cmp_ps(x, _mm256_set1_ps(limit), _CMP_GE_OQ));
    }
    static LLM_AVX2_INLINE F round_f16(F v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
    static LLM_AVX2_INLINE F half(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
    static LLM_AVX2_INLINE F ints(const int8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p))); }
    static LLM_AVX2_INLINE F nibbles(const uint8_t* p, bool hi, bool table) {
        __m256i n = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
        n = _mm256_and_si256(hi ? _mm256_srli_epi32(n, 4) : n, _mm256_set1_epi32(15));
        if (!table) return _mm256_cvtepi32_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(8)));
        const __m128i v = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)kIQ4NLValues), _mm_packus_epi16(_mm_packus_epi32(
                              _mm256_castsi256_si128(n), _mm256_extracti128_si256(n, 1)), _mm_setzero_si128()));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    }
};
// The two bodies below are stamped out once per tier (TIER_INLINE: that tier's target attribute):
// clang, unlike GCC, rejects a function that passes 512-bit vectors unless it carries avx512f itself,
// and an AVX2 caller cannot inline a function that does.
// kValues values of a V row from value d on, as floats: f16/f32, or a quantized cache type's blocks
// dequantized exactly as dequantize_row does (d x q is exact in float); Q4_0 / IQ4_NL hold value j in
// the low nibble of qs[j] and value j + 16 in the high one.
// out_h[d..d+kValues) (+)= sum over rows of w_h[r] * row r for HB heads, one fma per row and value:
// float rows as weighted_sum_simd; quantized rows' values are exact, so each step rounds once where
// the scalar dequantizing path (a multiply, then an add) rounds twice.
#define LLM_V_SUM_BODIES(TIER_INLINE, SUFFIX) \
template <class L, Type T> \
TIER_INLINE void load_values##SUFFIX(const uint8_t* row, int64_t d, typename L::F v[4]) { \
    constexpr int kStep = L::kValues / 4; \
    /* d is a multiple of kValues, itself of 32: each step's block is known here, and each block's */ \
    /* scale is converted once (F16C), not once per step in software */ \
    using B = std::conditional_t<T == Type::Q8_0, block_q8_0, block_q4_0>; \
    static_assert(sizeof(block_q4_0) == sizeof(block_iq4_nl), "same nibble layout"); \
    [[maybe_unused]] const B* blocks = (const B*)row + d / 32; \
    [[maybe_unused]] typename L::F scale[L::kValues / 32]; \
    if constexpr (T != Type::F16 && T != Type::F32) \
        for (int i = 0; i < L::kValues / 32; i++) scale[i] = L::set1(h2f(blocks[i].d)); \
_Pragma("GCC unroll 4") \
    for (int u = 0; u < 4; u++) { \
        const int e = kStep * u;  /* from d */ \
        if constexpr (T == Type::F16) { \
            v[u] = L::half((const uint16_t*)row + d + e); \
        } else if constexpr (T == Type::F32) { \
            v[u] = L::load((const float*)row + d + e); \
        } else if constexpr (T == Type::Q8_0) { \
            v[u] = L::mul(L::ints(blocks[e / 32].qs + e % 32), scale[e / 32]); \
        } else { \
            v[u] = L::mul(L::nibbles(blocks[e / 32].qs + e % 16, e % 32 >= 16, T == Type::IQ4_NL), scale[e / 32]); \
        } \
    } \
} \
template <class L, Type T> \
TIER_INLINE void dequantize_rows_body##SUFFIX(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, float* out) { \
    for (int64_t r = 0; r < n_rows; r++) \
        for (int64_t d = 0; d < dim; d += L::kValues) { \
            typename L::F v[4]; \
            load_values##SUFFIX<L, T>(rows + r * stride, d, v); \
_Pragma("GCC unroll 4") \
            for (int u = 0; u < 4; u++) L::store(out + r * dim + d + L::kValues / 4 * u, v[u]); \
        } \
} \
template <class L, int HB, Type T> \
TIER_INLINE void weighted_sum_heads_body##SUFFIX(const uint8_t* rows, size_t stride, const float* w, int64_t w_stride, int64_t n_rows, \
                                             int64_t d, float* out, int64_t out_stride, bool accumulate) { \
    constexpr int kStep = L::kValues / 4; \
    typename L::F acc[HB][4]; \
_Pragma("GCC unroll 8") \
    for (int h = 0; h < HB; h++) \
_Pragma("GCC unroll 4") \
        for (int u = 0; u < 4; u++) acc[h][u] = accumulate ? L::load(out + h * out_stride + d + kStep * u) : L::zero(); \
    for (int64_t r = 0; r < n_rows; r++) { \
        typename L::F v[4]; \
        load_values##SUFFIX<L, T>(rows + r * stride, d, v); \
_Pragma("GCC unroll 8") \
        for (int h = 0; h < HB; h++) { \
            const typename L::F wr = L::set1(w[h * w_stride + r]); \
_Pragma("GCC unroll 4") \
            for (int u = 0; u < 4; u++) acc[h][u] = L::fma(wr, v[u], acc[h][u]); \
        } \
    } \
_Pragma("GCC unroll 8") \
    for (int h = 0; h < HB; h++) \
_Pragma("GCC unroll 4") \
        for (int u = 0; u < 4; u++) L::store(out + h * out_stride + d + kStep * u, acc[h][u]); \
}
LLM_V_SUM_BODIES(LLM_AVX2_INLINE, _avx2)
LLM_V_SUM_BODIES(LLM_AVX512_INLINE, _avx512)
#undef LLM_V_SUM_BODIES
template <int HB, Type T>
LLM_AVX512_FN void weighted_sum_heads(const uint8_t* rows, size_t stride, const float* w, int64_t w_stride, int64_t n_rows,
                                      int64_t d, float* out, int64_t out_stride, bool accumulate) {
    weighted_sum_heads_body_avx512<Lanes16, HB, T>(rows, stride, w, w_stride, n_rows, d, out, out_stride, accumulate);
}
template <int HB, Type T>
LLM_AVX2_FN void weighted_sum_heads_avx2(const uint8_t* rows, size_t stride, const float* w, int64_t w_stride, int64_t n_rows,
                                         int64_t d, float* out, int64_t out_stride, bool accumulate) {
    weighted_sum_heads_body_avx2<Lanes8, HB, T>(rows, stride, w, w_stride, n_rows, d, out, out_stride, accumulate);
}
// n_rows rows of dim values (a multiple of kValues) as floats, rows dim apart, exactly as dequantize_row
template <Type T>
LLM_AVX512_FN void dequantize_rows(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, float* out) {
    dequantize_rows_body_avx512<Lanes16, T>(rows, stride, n_rows, dim, out);
}
template <Type T>
LLM_AVX2_FN void dequantize_rows_avx2(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, float* out) {
    dequantize_rows_body_avx2<Lanes8, T>(rows, stride, n_rows, dim, out);
}
LLM_AVX512_WARNINGS_ON
using DequantizeRowsFn = void (*)(const uint8_t*, size_t, int64_t, int64_t, float*);
template <Type T>
DequantizeRowsFn dequantize_rows_for(bool avx512) {
    return avx512 ? dequantize_rows<T> : dequantize_rows_avx2<T>;
}
// the V types with a kernel but F32 (read as they are); nullptr for the others
inline DequantizeRowsFn dequantize_rows_fn(Type t, bool avx512) {
    switch (t) {
    case Type::F16: return dequantize_rows_for<Type::F16>(avx512);
    case Type::Q8_0: return dequantize_rows_for<Type::Q8_0>(avx512);
    case Type::Q4_0: return dequantize_rows_for<Type::Q4_0>(avx512);
    case Type::IQ4_NL: return dequantize_rows_for<Type::IQ4_NL>(avx512);
    default: return nullptr;
    }
}
using WeightedSumHeadsFn = void (*)(const uint8_t*, size_t, const float*, int64_t, int64_t, int64_t, float*, int64_t, bool);
template <Type T>
WeightedSumHeadsFn weighted_sum_heads_for(int heads, bool avx512) {
    static const WeightedSumHeadsFn wide[] = {weighted_sum_heads<1, T>, weighted_sum_heads<2, T>, weighted_sum_heads<3, T>,
                                              weighted_sum_heads<4, T>, weighted_sum_heads<5, T>, weighted_sum_heads<6, T>};
    static const WeightedSumHeadsFn narrow[] = {weighted_sum_heads_avx2<1, T>, weighted_sum_heads_avx2<2, T>,
                                                weighted_sum_heads_avx2<3, T>};
    return avx512 ? wide[heads - 1] : narrow[heads - 1];
}
// nullptr for types without a kernel; avx512: the 64-value kernels for up to 6 heads, else the
// 32-value AVX2 ones for up to 3
inline WeightedSumHeadsFn weighted_sum_heads_fn(Type t, int heads, bool avx512) {
    switch (t) {
    case Type::F16: return weighted_sum_heads_for<Type::F16>(heads, avx512);
    case Type::F32: return weighted_sum_heads_for<Type::F32>(heads, avx512);
    case Type::Q8_0: return weighted_sum_heads_for<Type::Q8_0>(heads, avx512);
    case Type::Q4_0: return weighted_sum_heads_for<Type::Q4_0>(heads, avx512);
    case Type::IQ4_NL: return weighted_sum_heads_for<Type::IQ4_NL>(heads, avx512);
    default: return nullptr;
    }
}
#endif
} // namespace qimpl

#ifdef LLM_X86
namespace qimpl {
// Attention scores for query heads in pairs: out[h * out_stride + r] = row r . q_h. Each 512-bit
// register holds the 8-lane sums of two heads, so a row is converted once for all heads and each
// instruction serves two; every dot product keeps the row tile's 8 lanes, order and final sum, so
// the scores are bit-identical to matmul_rows'. qp: the queries in pairs (see attention_scores).
// f16 cache, f16 queries as floats: 8 values per step, 8 floats of each head.
struct ScoresF16 {
    static constexpr int kValues = 8;
    template <int NP>
    static LLM_AVX512VNNI_INLINE void add(const uint8_t* row, int64_t d, int64_t dim, const float* qp, __m512* acc) {
        const __m512 kv = _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)((const uint16_t*)row + d))));
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[p] = _mm512_fmadd_ps(kv, _mm512_loadu_ps(qp + (p * dim + d) * 2), acc[p]);
    }
};
LLM_AVX512_WARNINGS_OFF
// The 8-lane sums of four rows' pair registers (rows[i]: row i's lanes of heads 2p and 2p + 1), all
// eight at once in hsum8's order (hsum8x8's last steps), plus 0.0f as scores_rows adds: rows 0..3 of
// the first head to out, of the second to second (when there is one).
LLM_AVX512_INLINE void store_sums4(const __m512 rows[4], float* out, float* second) {
    constexpr int kLow = _MM_SHUFFLE(2, 0, 2, 0), kHigh = _MM_SHUFFLE(3, 1, 3, 1);
    // s_k = lane k + lane k + 4 of [row 0 h0, row 0 h1 | row 1 h0, row 1 h1], then of rows 2 and 3
    const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(rows[0], rows[1], kLow), _mm512_shuffle_f32x4(rows[0], rows[1], kHigh));
    const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(rows[2], rows[3], kLow), _mm512_shuffle_f32x4(rows[2], rows[3], kHigh));
    // as hsum8x8's v[2 * row + head]: elements 0..3 are the first head's rows, 4..7 the second's
    const __m256 s[4] = {_mm512_castps512_ps256(s01), _mm512_extractf32x8_ps(s01, 1), _mm512_castps512_ps256(s23),
                         _mm512_extractf32x8_ps(s23, 1)};
    const __m256 sums = _mm256_add_ps(hsum8x8_of_halves(s), _mm256_setzero_ps());
    _mm_storeu_ps(out, _mm256_castps256_ps128(sums));
    if (second) _mm_storeu_ps(second, _mm256_extractf128_ps(sums, 1));
}
// NR rows at a time: a head's sum over one row is a chain of dependent fmas, so several rows give
// the core independent chains to overlap.
template <class S, int NP, int NR>
LLM_AVX512VNNI_FN void scores_rows(const uint8_t* rows, size_t stride, int64_t dim, const float* qp, int heads, float* out,
                                   int64_t out_stride) {
    __m512 acc[NR][NP];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[i][p] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d += S::kValues)
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) S::template add<NP>(rows + i * stride, d, dim, qp, acc[i]);
    if constexpr (NR == 4) {
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const __m512 rows[4] = {acc[0][p], acc[1][p], acc[2][p], acc[3][p]};
            store_sums4(rows, out + 2 * p * out_stride, 2 * p + 1 < heads ? out + (2 * p + 1) * out_stride : nullptr);
        }
        return;
    }
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            out[2 * p * out_stride + i] = hsum8(_mm512_castps512_ps256(acc[i][p])) + 0.0f;
            if (2 * p + 1 < heads) out[(2 * p + 1) * out_stride + i] = hsum8(_mm512_extractf32x8_ps(acc[i][p], 1)) + 0.0f;
        }
}
LLM_AVX512_WARNINGS_ON
template <class S, int NP>
LLM_AVX512VNNI_FN void scores_pairs(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, const float* qp, int heads,
                                    float* out, int64_t out_stride) {
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) scores_rows<S, NP, 4>(rows + r * stride, stride, dim, qp, heads, out + r, out_stride);
    for (; r < n_rows; r++) scores_rows<S, NP, 1>(rows + r * stride, stride, dim, qp, heads, out + r, out_stride);
}
// f16 caches on AVX2 hosts (and AVX-512 ones without VNNI): the tile of matmul_rows over NR cache
// rows and NC query heads at once, so a row is unpacked once for all heads and NR x NC sums run side
// by side; the same arithmetic per (row, head), hence bit-identical to matmul_rows (S, the tile's
// block scales of 8-bit queries, unused). AVX-VNNI: the same with its byte products.
template <class K, class Ops, int NC, int NR>
LLM_AVX2_INLINE void scores_heads_256(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, const uint8_t* qc,
                                      size_t q_row, const float* S, int64_t s_stride, float* out, int64_t out_stride) {
    int64_t r = 0;
    for (; r + NR <= n_rows; r += NR)
        tile<K, Ops, NC, NR>(dim, rows + r * stride, qc, q_row, S, s_stride, out + r, out_stride, stride);
    for (; r < n_rows; r++) tile<K, Ops, NC, 1>(dim, rows + r * stride, qc, q_row, S, s_stride, out + r, out_stride);
}
template <class K, int NC, int NR>
LLM_AVX2_FN void scores_heads_avx2(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, const uint8_t* qc, size_t q_row,
                                   const float* S, int64_t s_stride, float* out, int64_t out_stride) {
    scores_heads_256<K, OpsAVX2, NC, NR>(rows, stride, n_rows, dim, qc, q_row, S, s_stride, out, out_stride);
}
template <class K, int NC, int NR>
LLM_AVXVNNI_FN void scores_heads_avxvnni(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, const uint8_t* qc,
                                         size_t q_row, const float* S, int64_t s_stride, float* out, int64_t out_stride) {
    scores_heads_256<K, OpsAVXVNNI, NC, NR>(rows, stride, n_rows, dim, qc, q_row, S, s_stride, out, out_stride);
}
using ScoresHeadsFn = void (*)(const uint8_t*, size_t, int64_t, int64_t, const uint8_t*, size_t, const float*, int64_t, float*,
                               int64_t);
constexpr int kScoreHeadsAVX2 = 4;  // heads per pass: NC x NR accumulators fit the 16 registers
template <class K>
ScoresHeadsFn scores_heads_avx2_for(int heads, bool avxvnni) {
    static const ScoresHeadsFn f[] = {scores_heads_avx2<K, 1, 4>, scores_heads_avx2<K, 2, 4>, scores_heads_avx2<K, 3, 2>,
                                      scores_heads_avx2<K, 4, 2>};
    static const ScoresHeadsFn vnni[] = {scores_heads_avxvnni<K, 1, 4>, scores_heads_avxvnni<K, 2, 4>,
                                         scores_heads_avxvnni<K, 3, 2>, scores_heads_avxvnni<K, 4, 2>};
    return (avxvnni ? vnni : f)[heads - 1];
}
// q8_0 cache, 16 rows at a time: the rows' blocks transposed so register j holds the 4-byte group j
// of every row (biased by 128 to be unsigned), a query's group j broadcast to all lanes, so one
// vpdpbusd adds group j's integer products for 16 rows. A block's exact integer dot product (the bias
// taken back out in integers) is then scaled and added in two roundings, a multiply and an add, as the
// scalar dot_q8_0 does: the scores equal the scalar tier's bit for bit, with one float step per block
// where the vector matmul_rows (ggml's AVX2 order) takes one per four-value group.
// A query's block: its quants, |quants| (the AVX2 kernel's unsigned operand), -128 x their sum, its scale.
struct QueryBlockQ8 {
    int32_t groups[8], magnitudes[8];
    int32_t unbias;
    float d;
};
// v as computed: keeps GCC from fusing the multiply that made v into the add that takes it.
LLM_AVX2_INLINE __m256 rounded(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}
LLM_AVX512_INLINE __m512 rounded(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}
constexpr int kScoresQ8MaxBlocks = 32;  // head dims up to 1024 (a latent cache's rows are 576)
// Block b of 8 rows (row(r): row r's first block) as groups[j * group_stride + r] = row r's 4-byte
// group j, each byte xor bias (0x80: biased by 128 to be unsigned), and scales[r] = row r's scale:
// one 8 x 8 transpose of 32-bit groups.
template <class RowFn>
LLM_AVX2_INLINE void transpose_q8_0_rows8(RowFn row, int64_t b, char bias, int32_t* groups, int64_t group_stride, float* scales) {
    alignas(16) uint16_t d[8];
    __m256i z[8], t[8], u[8];
    for (int r = 0; r < 8; r++)
        d[r] = row(r)[b].d, z[r] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)row(r)[b].qs), _mm256_set1_epi8(bias));
    _mm256_storeu_ps(scales, _mm256_cvtph_ps(_mm_load_si128((const __m128i*)d)));
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_epi32(z[i], z[i + 1]), t[i + 1] = _mm256_unpackhi_epi32(z[i], z[i + 1]);
    for (int i = 0; i < 8; i += 4) {  // u[i + j]: in each 128 bits, group j (or j + 4) of 4 rows
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]), u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]), u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int j = 0; j < 4; j++) {
        _mm256_storeu_si256((__m256i*)(groups + j * group_stride), _mm256_permute2x128_si256(u[j], u[j + 4], 0x20));
        _mm256_storeu_si256((__m256i*)(groups + (j + 4) * group_stride), _mm256_permute2x128_si256(u[j], u[j + 4], 0x31));
    }
}
LLM_AVX512_WARNINGS_OFF
LLM_AVX512VNNI_FN void scores_q8_0_rows16(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t nb, const QueryBlockQ8* queries,
                                          int heads, float* out, int64_t out_stride) {
    alignas(64) int32_t group[kScoresQ8MaxBlocks][8][16];
    alignas(64) float scale[kScoresQ8MaxBlocks][16];
    const __mmask16 live = n_rows >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n_rows) - 1);
    // past the last row: the last again
    auto row = [&](int r) { return (const block_q8_0*)(rows + std::min<int64_t>(r, n_rows - 1) * stride); };
    auto second = [&](int r) { return row(r + 8); };
    for (int64_t b = 0; b < nb; b++) {  // rows 0-7 to lanes 0-7, rows 8-15 to lanes 8-15
        transpose_q8_0_rows8(row, b, (char)0x80, &group[b][0][0], 16, scale[b]);
        transpose_q8_0_rows8(second, b, (char)0x80, &group[b][0][8], 16, scale[b] + 8);
    }
    for (int h = 0; h < heads; h++) {
        const QueryBlockQ8* q = queries + h * nb;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m512i sum[2] = {_mm512_set1_epi32(q[b].unbias), _mm512_setzero_si512()};  // two chains
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                sum[j % 2] = dpbusd_broadcast(sum[j % 2], _mm512_load_si512(group[b][j]), &q[b].groups[j]);
            const __m512 d = _mm512_mul_ps(_mm512_load_ps(scale[b]), _mm512_set1_ps(q[b].d));
            acc = _mm512_add_ps(acc, rounded(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sum[0], sum[1])), d)));
        }
        _mm512_mask_storeu_ps(out + h * out_stride, live, acc);
    }
}
LLM_AVX512_WARNINGS_ON
// The same on 256-bit registers, 8 rows at a time, one transpose. AVX-VNNI: as above. AVX2, without
// the bias: the query's |quants| broadcast are the unsigned operand and the rows' groups take the
// query's signs (vpsignb), so vpmaddubsw's pairs stay below 2^15 as in the row tiles.
template <class Ops>
LLM_AVX2_INLINE void scores_q8_0_rows8(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t nb, const QueryBlockQ8* queries,
                                       int heads, float* out, int64_t out_stride) {
    alignas(32) int32_t group[kScoresQ8MaxBlocks][8][8];
    alignas(32) float scale[kScoresQ8MaxBlocks][8];
    auto row = [&](int r) { return (const block_q8_0*)(rows + std::min<int64_t>(r, n_rows - 1) * stride); };
    for (int64_t b = 0; b < nb; b++) transpose_q8_0_rows8(row, b, Ops::kVnni ? (char)0x80 : 0, &group[b][0][0], 8, scale[b]);
    for (int h = 0; h < heads; h++) {
        const QueryBlockQ8* q = queries + h * nb;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m256i sum[2] = {_mm256_set1_epi32(Ops::kVnni ? q[b].unbias : 0), _mm256_setzero_si256()};  // two chains
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const __m256i rows_j = _mm256_load_si256((const __m256i*)group[b][j]);
                if constexpr (Ops::kVnni) sum[j % 2] = Ops::dpbusd(sum[j % 2], rows_j, _mm256_set1_epi32(q[b].groups[j]));
                else
                    sum[j % 2] = _mm256_add_epi32(sum[j % 2], Ops::dot_us(_mm256_set1_epi32(q[b].magnitudes[j]),
                                                                          _mm256_sign_epi8(rows_j, _mm256_set1_epi32(q[b].groups[j]))));
            }
            const __m256 d = _mm256_mul_ps(_mm256_load_ps(scale[b]), _mm256_set1_ps(q[b].d));
            acc = _mm256_add_ps(acc, rounded(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(sum[0], sum[1])), d)));
        }
        if (n_rows >= 8) {  // (std::copy's call to memmove was ~10 % of this kernel's time)
            _mm256_storeu_ps(out + h * out_stride, acc);
        } else {
            alignas(32) float sums[8];
            _mm256_store_ps(sums, acc);
            std::copy(sums, sums + n_rows, out + h * out_stride);
        }
    }
}
LLM_AVX2_FN void scores_q8_0_rows8_avx2(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t nb, const QueryBlockQ8* queries,
                                        int heads, float* out, int64_t out_stride) {
    scores_q8_0_rows8<OpsAVX2>(rows, stride, n_rows, nb, queries, heads, out, out_stride);
}
LLM_AVXVNNI_FN void scores_q8_0_rows8_avxvnni(const uint8_t* rows, size_t stride, int64_t n_rows, int64_t nb,
                                              const QueryBlockQ8* queries, int heads, float* out, int64_t out_stride) {
    scores_q8_0_rows8<OpsAVXVNNI>(rows, stride, n_rows, nb, queries, heads, out, out_stride);
}
// f16 queries in pairs of heads (zeros past the last) for scores_pairs: for each 8 values, 8 floats
// of the first head then 8 of the second (F16C converts exactly, as fp16_to_fp32 does).
LLM_AVX2_FN void pair_queries_f16(const uint8_t* qc, size_t q_row, int heads, int64_t dim, float* out) {
    for (int h = 0; h < heads; h += 2)
        for (int j = 0; j < 2; j++) {
            const uint16_t* q = (const uint16_t*)(qc + (h + j) * q_row);
            for (int64_t d = 0; d < dim; d += 8)
                _mm256_storeu_ps(out + (h / 2 * dim + d) * 2 + 8 * j,
                                 h + j < heads ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(q + d))) : _mm256_setzero_ps());
        }
}
using ScoresFn = void (*)(const uint8_t*, size_t, int64_t, int64_t, const float*, int, float*, int64_t);
inline ScoresFn scores_pairs_fn(int pairs) {
    static const ScoresFn f16[] = {scores_pairs<ScoresF16, 1>, scores_pairs<ScoresF16, 2>, scores_pairs<ScoresF16, 3>,
                                   scores_pairs<ScoresF16, 4>};
    return f16[pairs - 1];
}
} // namespace qimpl
#endif

// Attention scores: out[h * out_stride + r] = (cache row r of type kt) . (query h) for `heads` queries
// in the cache type's dot-product type (qc, q_row bytes apart), exactly as matmul_rows computes them
// (q8_0: as it does on the scalar tier, one float step per block; see QueryBlockQ8); scratch:
// 2 * (heads + 1) * dim floats. False when there is no kernel for this type and ISA (the caller then
// uses matmul_rows).
bool attention_scores(Type kt, const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, const uint8_t* qc, size_t q_row,
                      int heads, float* out, int64_t out_stride, float* scratch) {
#ifdef LLM_X86
    if (isa_current() == Isa::Scalar || (kt != Type::F16 && kt != Type::Q8_0) || dim % 32) return false;
    const bool wide = isa_current() == Isa::AVX512 && qimpl::cpu().vnni;
    if (kt == Type::Q8_0) {
        const int64_t nb = dim / 32;
        if (nb > qimpl::kScoresQ8MaxBlocks) return false;
        qimpl::QueryBlockQ8* queries = (qimpl::QueryBlockQ8*)scratch;
        for (int h = 0; h < heads; h++)
            for (int64_t b = 0; b < nb; b++) {
                const block_q8_0& y = ((const block_q8_0*)(qc + h * q_row))[b];
                qimpl::QueryBlockQ8& qb = queries[h * nb + b];
                memcpy(qb.groups, y.qs, 32);
                int32_t sum = 0;
                for (int i = 0; i < 32; i++) sum += y.qs[i], ((uint8_t*)qb.magnitudes)[i] = (uint8_t)std::abs(y.qs[i]);
                qb.unbias = -128 * sum;
                qb.d = fp16_to_fp32(y.d);
            }
        const int64_t step = wide ? 16 : 8;  // rows per kernel call
        const auto kernel = wide ? qimpl::scores_q8_0_rows16
                                 : isa_current() == Isa::AVXVNNI ? qimpl::scores_q8_0_rows8_avxvnni : qimpl::scores_q8_0_rows8_avx2;
        for (int64_t r0 = 0; r0 < n_rows; r0 += step)
            kernel(rows + r0 * stride, stride, std::min(step, n_rows - r0), nb, queries, heads, out + r0, out_stride);
        return true;
    }
    if (!wide) {
        const int64_t block = std::max<int64_t>(1, 32768 / (int64_t)stride);  // rows that stay in L1 (as below)
        const bool vnni = isa_current() == Isa::AVXVNNI;
        for (int64_t r0 = 0; r0 < n_rows; r0 += block)
            for (int h = 0; h < heads; h += qimpl::kScoreHeadsAVX2) {
                const int nc = std::min(qimpl::kScoreHeadsAVX2, heads - h);
                qimpl::scores_heads_avx2_for<qimpl::K_f16>(nc, vnni)(rows + r0 * stride, stride, std::min(block, n_rows - r0), dim,
                                                                     qc + h * q_row, q_row, nullptr, 0, out + h * out_stride + r0,
                                                                     out_stride);
            }
        return true;
    }
    qimpl::pair_queries_f16(qc, q_row, heads, dim, scratch);
    const int64_t pair_floats = 2 * dim;  // per pair of heads
    // Rows in blocks that stay in L1 while each group of up to 8 heads passes over them.
    const int64_t block = std::max<int64_t>(1, 32768 / (int64_t)stride);
    for (int64_t r0 = 0; r0 < n_rows; r0 += block)
        for (int h = 0; h < heads; h += 8)
            qimpl::scores_pairs_fn((std::min(8, heads - h) + 1) / 2)(rows + r0 * stride, stride, std::min(block, n_rows - r0), dim,
                                                                        scratch + h / 2 * pair_floats, std::min(8, heads - h),
                                                                        out + h * out_stride + r0, out_stride);
    return true;
#else
    (void)kt, (void)rows, (void)stride, (void)n_rows, (void)dim, (void)qc, (void)q_row, (void)heads, (void)out, (void)out_stride,
        (void)scratch;
    return false;
#endif
}

// out[0..dim) (+)= sum over r < n_rows of w[r] * (row r of type t, rows `stride` bytes apart): added
// to out when `accumulate`, else replacing it. scratch: dim floats, for types dequantized row by row.
void weighted_row_sum(Type t, const uint8_t* rows, size_t stride, const float* w, int64_t n_rows, int64_t dim, float* out,
                      float* scratch, bool accumulate = false);

// Floats of scratch weighted_row_sums needs for rows of dim values: a block of rows converted to
// floats once for all heads (32 KiB, so it stays in L1), or one row for the scalar path.
int64_t weighted_row_sums_scratch(int64_t dim) { return std::max<int64_t>(dim, 8192); }

// weighted_row_sum for `heads` weight vectors (w + h * w_stride) into out + h * out_stride;
// scratch: weighted_row_sums_scratch(dim) floats.
void weighted_row_sums(Type t, const uint8_t* rows, size_t stride, const float* w, int64_t w_stride, int heads, int64_t n_rows,
                       int64_t dim, float* out, int64_t out_stride, float* scratch, bool accumulate) {
#ifdef LLM_X86
    const bool avx512 = isa_current() == Isa::AVX512;
    const int64_t step = avx512 ? qimpl::Lanes16::kValues : qimpl::Lanes8::kValues;
    if (isa_current() != Isa::Scalar && qimpl::weighted_sum_heads_fn(t, 1, avx512) && dim % step == 0) {
        // Heads per pass: their accumulators and a row's values fill the registers (AVX-512: 6 x 4 + 4
        // of 32; AVX2: 3 x 4 + 4 of 16, one row value reloaded). Rows in blocks that stay in L1 while
        // every slice of every head passes over them. With more heads than one pass serves, rows not
        // in f32 are converted once per block (exactly, so the sums are the same), not once per pass.
        const int per_pass = avx512 ? 6 : 3;
        const qimpl::DequantizeRowsFn convert = heads > per_pass ? qimpl::dequantize_rows_fn(t, avx512) : nullptr;
        const int64_t block = std::max<int64_t>(1, convert ? weighted_row_sums_scratch(dim) / dim : 32768 / (int64_t)stride);
        const Type rt = convert ? Type::F32 : t;  // the type of the rows the kernels read
        for (int64_t r0 = 0; r0 < n_rows; r0 += block) {
            const int64_t nr = std::min(block, n_rows - r0);
            const uint8_t* src = rows + r0 * stride;
            size_t src_stride = stride;
            if (convert) convert(src, stride, nr, dim, scratch), src = (const uint8_t*)scratch, src_stride = dim * sizeof(float);
            for (int64_t d = 0; d < dim; d += step) {
                for (int h = 0; h < heads; h += per_pass) {
                    const int hb = std::min(per_pass, heads - h);
                    qimpl::weighted_sum_heads_fn(rt, hb, avx512)(src, src_stride, w + h * w_stride + r0, w_stride, nr, d,
                                                                 out + h * out_stride, out_stride, accumulate || r0 > 0);
                }
            }
        }
        return;
    }
#endif
    for (int h = 0; h < heads; h++) weighted_row_sum(t, rows, stride, w + h * w_stride, n_rows, dim, out + h * out_stride, scratch, accumulate);
}

void weighted_row_sum(Type t, const uint8_t* rows, size_t stride, const float* w, int64_t n_rows, int64_t dim, float* out,
                      float* scratch, bool accumulate) {
    int64_t done = 0;
#ifdef LLM_X86
    if (isa_current() != Isa::Scalar && (t == Type::F16 || t == Type::F32)) {
        done = dim / 8 * 8;
        (t == Type::F16 ? qimpl::weighted_sum_f16 : qimpl::weighted_sum_f32)(rows, stride, w, n_rows, done, out, accumulate);
        if (done == dim) return;
    }
#endif
    if (!accumulate) std::fill(out + done, out + dim, 0.0f);
    for (int64_t r = 0; r < n_rows; r++) {
        dequantize_row(t, rows + r * stride, scratch, dim);
        for (int64_t d = done; d < dim; d++) out[d] += w[r] * scratch[d];
    }
}

// ---- attention's softmax ---------------------------------------------------------------------

namespace qimpl {
#ifdef LLM_X86
// Stamped once per tier, as the V sums above.
// exp_nonpos: e^x for x <= 0 (attention scores minus their maximum): x = n ln2 + r with |r| <= ln2/2,
// e^r by its degree-6 Taylor polynomial (relative error ~2e-7), 2^n through the exponent bits; below
// -87.3 (where floats run out) the result is 0. Lane by lane the same operations at either width.
// softmax_body: x[0..n) = softmax(x * scale) for scale > 0. The maximum is taken on the unscaled
// scores (rounding is monotonic, so max(x) * scale is the maximum of the scaled ones) and
// x * scale - max is formed in the exp pass in one rounding (an fma: the same bits from every
// compiler); the sum runs over 16 float lanes (two 8-float vectors on AVX2, so both tiers give the
// same bits) in chunks of 256 values, each lane's chunk sums added in double: within 16 float
// roundings of the exact sum at any length. The last n % 16 values go through std::exp.
#define LLM_SOFTMAX_BODIES(TIER_INLINE, SUFFIX) \
template <class L> \
TIER_INLINE typename L::F exp_nonpos##SUFFIX(typename L::F x) { \
    const typename L::F n = L::round(L::mul(x, L::set1(1.44269504088896341f))); \
    typename L::F r = L::fnma(n, L::set1(0.693145751953125f), x);  /* ln2 split in two parts */ \
    r = L::fnma(n, L::set1(1.428606765330187045e-06f), r); \
    typename L::F p = L::fma(L::set1(1.0f / 720), r, L::set1(1.0f / 120)); \
    p = L::fma(p, r, L::set1(1.0f / 24)); \
    p = L::fma(p, r, L::set1(1.0f / 6)); \
    p = L::fma(p, r, L::set1(0.5f)); \
    p = L::fma(p, r, L::set1(1.0f)); \
    p = L::fma(p, r, L::set1(1.0f)); \
    return L::where_at_least(L::mul(p, L::exp2i(n)), x, -87.3f); \
} \
template <class L> \
TIER_INLINE void softmax_body##SUFFIX(float* x, int64_t n, float scale, bool round_f16) { \
    constexpr int kLanes = sizeof(typename L::F) / 4, kPerSixteen = 16 / kLanes; \
    const int64_t n16 = n / 16 * 16; \
    /* four chains (max's latency, not its rate), named so they stay in registers */ \
    typename L::F top0 = L::set1(-INFINITY), top1 = top0, top2 = top0, top3 = top0; \
    int64_t i = 0; \
    for (; i + 4 * kLanes <= n16; i += 4 * kLanes) { \
        top0 = L::max(top0, L::load(x + i)); \
        top1 = L::max(top1, L::load(x + i + kLanes)); \
        top2 = L::max(top2, L::load(x + i + 2 * kLanes)); \
        top3 = L::max(top3, L::load(x + i + 3 * kLanes)); \
    } \
    for (; i < n16; i += kLanes) top0 = L::max(top0, L::load(x + i)); \
    float mx = L::hmax(L::max(L::max(top0, top1), L::max(top2, top3))); \
    for (i = n16; i < n; i++) mx = std::max(mx, x[i]); \
    mx *= scale; \
    const typename L::F vscale = L::set1(scale), vmx = L::set1(mx); \
    double lane_totals[16] = {}; \
    for (int64_t c0 = 0; c0 < n16; c0 += 256) { \
        typename L::F lane_sums[kPerSixteen]; \
        for (int v = 0; v < kPerSixteen; v++) lane_sums[v] = L::zero(); \
        for (i = c0; i < std::min(n16, c0 + 256); i += 16) \
_Pragma("GCC unroll 2")  /* so lane_sums stay in registers */ \
            for (int v = 0; v < kPerSixteen; v++) { \
                float* at = x + i + kLanes * v; \
                const typename L::F e = exp_nonpos##SUFFIX<L>(L::fms(L::load(at), vscale, vmx)); \
                L::store(at, e); \
                lane_sums[v] = L::add(lane_sums[v], e); \
            } \
        float lanes[16]; \
        for (int v = 0; v < kPerSixteen; v++) L::store(lanes + kLanes * v, lane_sums[v]); \
        for (int l = 0; l < 16; l++) lane_totals[l] += lanes[l]; \
    } \
    double sum = 0; \
    for (double t : lane_totals) sum += t; \
    for (i = n16; i < n; i++) sum += (x[i] = std::exp(std::fma(x[i], scale, -mx))); \
    const float inv = (float)(1.0 / sum); \
    const typename L::F vinv = L::set1(inv); \
    for (i = 0; i < n16; i += kLanes) { \
        const typename L::F p = L::mul(L::load(x + i), vinv); \
        L::store(x + i, round_f16 ? L::round_f16(p) : p); \
    } \
    for (i = n16; i < n; i++) x[i] = round_f16 ? fp16_to_fp32(fp32_to_fp16(x[i] * inv)) : x[i] * inv; \
}
LLM_SOFTMAX_BODIES(LLM_AVX2_INLINE, _avx2)
LLM_AVX512_WARNINGS_OFF
LLM_SOFTMAX_BODIES(LLM_AVX512_INLINE, _avx512)
LLM_AVX512_WARNINGS_ON
#undef LLM_SOFTMAX_BODIES
LLM_AVX2_FN void softmax_avx2(float* x, int64_t n, float scale, bool round_f16) {
    softmax_body_avx2<Lanes8>(x, n, scale, round_f16);
}
LLM_AVX512_WARNINGS_OFF
LLM_AVX512_FN void softmax_avx512(float* x, int64_t n, float scale, bool round_f16) {
    softmax_body_avx512<Lanes16>(x, n, scale, round_f16);
}
LLM_AVX512_WARNINGS_ON
// One n-value block (n a power of two, >= 8) of hadamard below with the same butterflies in the same
// order, so bit-identical: stages 1, 2 and 4 inside each 8-float vector (the partner lanes by a shuffle,
// u + w where a lane keeps the sum, w - u where it keeps the difference), the wider stages across vectors.
LLM_AVX2_FN void hadamard_avx2(float* x, int n, float scale) {
    for (int i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 w = _mm256_permute_ps(v, 0xB1);  // stage 1: lanes 2k and 2k + 1
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xAA);
        w = _mm256_permute_ps(v, 0x4E);  // stage 2: lanes 4k + j and 4k + j + 2
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xCC);
        w = _mm256_permute2f128_ps(v, v, 0x01);  // stage 4: the two halves
        v = _mm256_blend_ps(_mm256_add_ps(v, w), _mm256_sub_ps(w, v), 0xF0);
        _mm256_storeu_ps(x + i, v);
    }
    for (int len = 8; len < n; len *= 2)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j += 8) {
                const __m256 u = _mm256_loadu_ps(x + j), w = _mm256_loadu_ps(x + j + len);
                _mm256_storeu_ps(x + j, _mm256_add_ps(u, w));
                _mm256_storeu_ps(x + j + len, _mm256_sub_ps(u, w));
            }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
}
#endif
} // namespace qimpl

// x[0..n) = softmax(x * scale), the sum in double (the vector tiers: in float chunks, see
// softmax_body); with round_f16 each probability is rounded to f16 (what the reference does before
// multiplying an f16 V).
void softmax_scaled(float* x, int64_t n, float scale, bool round_f16) {
#ifdef LLM_X86
    if (isa_current() != Isa::Scalar && scale > 0)
        return (isa_current() == Isa::AVX512 ? qimpl::softmax_avx512 : qimpl::softmax_avx2)(x, n, scale, round_f16);
#endif
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = std::max(mx, x[i] *= scale);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (x[i] = std::exp(x[i] - mx));
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] = round_f16 ? fp16_to_fp32(fp32_to_fp16(x[i] * inv)) : x[i] * inv;
}
// ============================================================================================
// 7. Weight quantizers: K-quants (Q2_K .. Q6_K) and IQ4_NL's searching variant, bit-exact with ggml's reference quantizers without an importance
// matrix (quantize_row_qN_K_ref), which is what llama-quantize runs for these types when no imatrix
// is given (quantize_qN_K -> quantize_row_qN_K_ref).
//
// Bit-exactness rules followed here:
//  - every intermediate is a float (never double) and every expression keeps ggml's evaluation order;
//  - no fused multiply-add: ggml builds these functions for the baseline ISA, where a*b+c is always two
//    rounded operations. fp-contraction is switched off below so a -march=native build of this file
//    still rounds the same way;
//  - fp16 rounding is round-to-nearest-even (fp32_to_fp16), as ggml's.
// ============================================================================================

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace kquant {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: a group below this is all zero

// Round to nearest (ties to even) for |f| < 2^22, by adding 1.5*2^23 and reading the mantissa, exactly as
// ggml does. The trick is part of the reference's rounding, so it is kept (lrintf would agree, but this is
// what the reference does and costs nothing).
inline int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

template <typename T> inline T clampv(T v, T lo, T hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Symmetric quantization of n values to integers in [-nmax, nmax-1], weights x^2 (ggml make_qx_quants with
// rmse_type 1 and no quant weights): start from the scale mapping the largest magnitude to -nmax, then try
// 18 nearby scales and keep the one maximizing sum(w*x*l)^2 / sum(w*l^2). Stores l + nmax in L.
inline float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    // Sums for the levels a given inverse scale produces; optionally stores them.
    auto fit = [&](float iscale, float& sumlx, float& suml2, bool store) {
        sumlx = 0;
        suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = clampv(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            if (store) L[i] = (int8_t)(l + nmax);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
    };
    float sumlx, suml2;
    fit(-nmax / max, sumlx, suml2, true);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        float iscale = -(nmax + 0.1f * is) / max;
        fit(iscale, sumlx, suml2, false);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            fit(iscale, sumlx, suml2, true);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q3_K's per-group search (ggml make_q3_quants with do_rmse): round with the max-magnitude scale, then up to
// 5 passes of coordinate descent moving single levels while that improves sum(w*x*l)^2 / sum(w*l^2),
// weights x^2. Stores l + nmax in L, levels in [-nmax, nmax-1].
inline float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = clampv(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = clampv(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric quantization x ~ scale*l - the_min with l in [0, nmax] (ggml make_qkx2_quants): start from the
// min/max range, then try nstep+1 scales around it, each with the least-squares (scale, min) for its
// levels, and keep the lowest weighted error (absolute error when use_mad). Returns the scale; *the_min >= 0.
inline float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                              uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    auto error_of = [&](float scale, float mn, const uint8_t* Lq) {
        float err = 0;
        for (int i = 0; i < n; ++i) {
            float diff = scale * Lq[i] + mn - x[i];
            diff = use_mad ? fabsf(diff) : diff * diff;
            err += weights[i] * diff;
        }
        return err;
    };
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)clampv(nearest_int(iscale * (x[i] - min)), 0, nmax);
    float best_error = error_of(scale, min, L);
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = clampv(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = error_of(this_scale, this_min, Laux);
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// Packs 2-bit levels of a 256-value super-block: byte l of each 32-byte group holds values l, l+32, l+64,
// l+96 of its 128-value half (Q2_K and Q3_K low bits).
inline void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}


inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

// ---- Q2_K: 16 groups of 16, 2-bit levels, 4-bit scales and mins -----------------------------------------
inline void quantize_block_q2_K(const float* x, block_q2_K& y) {
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    float max_scale = 0, max_min = 0;  // as the min is deducted, scales are positive
    for (int j = 0; j < QK_K / 16; ++j) {
        for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
        float iscale = q4scale / max_scale;
        for (int j = 0; j < QK_K / 16; ++j) y.scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
        y.d = fp32_to_fp16(max_scale / q4scale);
    } else {
        for (int j = 0; j < QK_K / 16; ++j) y.scales[j] = 0;
        y.d = fp32_to_fp16(0.f);
    }
    if (max_min > 0) {
        float iscale = q4scale / max_min;
        for (int j = 0; j < QK_K / 16; ++j) y.scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
        y.dmin = fp32_to_fp16(max_min / q4scale);
    } else {
        y.dmin = fp32_to_fp16(0.f);
    }
    // Requantize against the rounded scales.
    for (int j = 0; j < QK_K / 16; ++j) {
        const float d = fp16_to_fp32(y.d) * (y.scales[j] & 0xF);
        if (!d) continue;
        const float dm = fp16_to_fp32(y.dmin) * (y.scales[j] >> 4);
        for (int ii = 0; ii < 16; ++ii)
            L[16 * j + ii] = (uint8_t)clampv(nearest_int((x[16 * j + ii] + dm) / d), 0, 3);
    }
    pack_2bit(L, y.qs);
}

// ---- Q3_K: 16 groups of 16, 3-bit signed levels, 6-bit signed scales --------------------------------------
inline void quantize_block_q3_K(const float* x, block_q3_K& y) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
        scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
        float scale = fabsf(scales[j]);
        if (scale > amax) { amax = scale; max_scale = scales[j]; }
    }
    memset(y.scales, 0, 12);
    if (max_scale) {
        float iscale = -32.f / max_scale;
        for (int j = 0; j < QK_K / 16; ++j) {
            int8_t l = (int8_t)nearest_int(iscale * scales[j]);  // ggml narrows to int8 before clamping
            l = (int8_t)(clampv<int>(l, -32, 31) + 32);
            if (j < 8) y.scales[j] = (uint8_t)(l & 0xF);
            else y.scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
            l >>= 4;
            y.scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
        }
        y.d = fp32_to_fp16(1 / iscale);
    } else {
        y.d = fp32_to_fp16(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
        int sc = j < 8 ? y.scales[j] & 0xF : y.scales[j - 8] >> 4;
        sc = (sc | (((y.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
        float d = fp16_to_fp32(y.d) * sc;
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii)
            L[16 * j + ii] = (int8_t)(clampv(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
    }
    // High bit of value j goes to bit j/32 of hmask[j%32]; the low two bits are packed like Q2_K.
    memset(y.hmask, 0, QK_K / 8);
    uint8_t low[QK_K];
    for (int j = 0; j < QK_K; ++j) {
        int l = L[j];
        if (l > 3) {
            y.hmask[j % (QK_K / 8)] |= (uint8_t)(1 << (j / (QK_K / 8)));
            l -= 4;
        }
        low[j] = (uint8_t)l;
    }
    pack_2bit(low, y.qs);
}

// ---- Q4_K / Q5_K: 8 groups of 32, asymmetric levels, 6-bit scales and mins --------------------------------
template <int NMAX, typename Block>
inline void quantize_block_q45_K(const float* x, Block& y, float rmin, int nstep, uint8_t* L) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, NMAX, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);  // narrowed to uint8 first, as in ggml
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        qimpl::pack_scale_min_k4(j, std::min<uint8_t>(63, ls), std::min<uint8_t>(63, lm), y.scales);
    }
    y.d = fp32_to_fp16(max_scale / 63.f);
    y.dmin = fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, y.scales, sc, m);
        const float d = fp16_to_fp32(y.d) * sc;
        if (!d) continue;
        const float dm = fp16_to_fp32(y.dmin) * m;
        for (int ii = 0; ii < 32; ++ii)
            L[32 * j + ii] = (uint8_t)clampv(nearest_int((x[32 * j + ii] + dm) / d), 0, NMAX);
    }
}

inline void quantize_block_q4_K(const float* x, block_q4_K& y) {
    uint8_t L[QK_K];
    quantize_block_q45_K<15>(x, y, -1.f, 20, L);
    uint8_t* q = y.qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

inline void quantize_block_q5_K(const float* x, block_q5_K& y) {
    uint8_t L[QK_K];
    quantize_block_q45_K<31>(x, y, -0.5f, 15, L);
    // Low nibbles like Q4_K; bit 4 of value n+j (n = 64*k) goes to bit 2k of qh[j], of n+j+32 to bit 2k+1.
    memset(y.qh, 0, QK_K / 8);
    uint8_t* ql = y.qs;
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32, m1 <<= 2, m2 <<= 2) {
        for (int j = 0; j < 32; ++j) {
            int l1 = L[n + j], l2 = L[n + j + 32];
            if (l1 > 15) { l1 -= 16; y.qh[j] |= m1; }
            if (l2 > 15) { l2 -= 16; y.qh[j] |= m2; }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
    }
}

// ---- Q6_K: 16 groups of 16, 6-bit signed levels, int8 scales ----------------------------------------------
inline void quantize_block_q6_K(const float* x, block_q6_K& y) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
        const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
        scales[ib] = scale;
        const float abs_scale = fabsf(scale);
        if (abs_scale > max_abs_scale) { max_abs_scale = abs_scale; max_scale = scale; }
    }
    if (max_abs_scale < kGroupMaxEps) {
        memset(&y, 0, sizeof y);
        return;
    }
    float iscale = -128.f / max_scale;
    y.d = fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) y.scales[ib] = (int8_t)std::min(127, nearest_int(iscale * scales[ib]));
    for (int j = 0; j < QK_K / 16; ++j) {
        float d = fp16_to_fp32(y.d) * y.scales[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii)
            L[16 * j + ii] = (int8_t)(clampv(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
    }
    uint8_t* ql = y.ql;
    uint8_t* qh = y.qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t* v = (const uint8_t*)L + j + l;  // values l, l+32, l+64, l+96 of this half
            ql[l + 0] = (uint8_t)((v[0] & 0xF) | ((v[64] & 0xF) << 4));
            ql[l + 32] = (uint8_t)((v[32] & 0xF) | ((v[96] & 0xF) << 4));
            qh[l] = (uint8_t)((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
        }
    }
}

// ---- IQ4_NL as llama-quantize writes weights (ggml quantize_iq4_nl without imatrix: ntry = 7) -----------
// This is not quantize_row_iq4_nl_ref (ntry = -1, used for the KV cache): it starts from the opposite sign
// of the scale, searches 15 scales, and re-picks every level with the final (unrounded) scale.

// Index of the table value nearest to x (ties to the larger), for a sorted table of 16: branch-free
// binary search on midpoints; doubling x keeps the comparison exact.
inline int best_index_iq4nl(float x) {
    const float x2 = x + x;
    int idx = 0;
    for (int step = 8; step > 0; step >>= 1) {
        const int j = idx + step;
        idx = x2 >= (float)(kIQ4NLValues[j - 1] + kIQ4NLValues[j]) ? j : idx;
    }
    return idx;
}

inline void quantize_block_iq4_nl_search(const float* x, block_iq4_nl& y) {
    const int8_t* values = kIQ4NLValues;
    const int ntry = 7;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
        float ax = fabsf(x[j]);
        if (ax > amax) { amax = ax; max = x[j]; }
    }
    float scale = 0;  // an all-zero block keeps 0 and its levels are re-picked for 0 below
    if (amax >= kGroupMaxEps) {
        // Least-squares scale for the levels inverse scale id gives, weights x^2; returns sum(w*q*x).
        auto fit = [&](float id, float& sumqx, float& sumq2) {
            sumqx = 0;
            sumq2 = 0;
            for (int j = 0; j < 32; ++j) {
                float q = values[best_index_iq4nl(id * x[j])];
                float w = x[j] * x[j];
                sumqx += w * q * x[j];
                sumq2 += w * q * q;
            }
        };
        float sumqx, sumq2;
        float d = -max / values[0];
        fit(1 / d, sumqx, sumq2);
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; ++itry) {
            fit((itry + values[0]) / max, sumqx, sumq2);
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scale = d;
    }
    y.d = fp32_to_fp16(scale);
    const float id = scale ? 1 / scale : 0;
    uint8_t L[32];
    for (int j = 0; j < 32; ++j) L[j] = (uint8_t)best_index_iq4nl(id * x[j]);
    for (int j = 0; j < 16; ++j) y.qs[j] = (uint8_t)(L[j] | (L[16 + j] << 4));
}

template <typename Block, void (*QuantizeBlock)(const float*, Block&), int BlockSize = QK_K>
inline void quantize_blocks(const float* src, void* dst, int64_t n) {
    Block* y = (Block*)dst;
    for (int64_t i = 0; i < n / BlockSize; ++i) QuantizeBlock(src + i * BlockSize, y[i]);
}

} // namespace kquant

// Quantizes one row of model weights as llama-quantize does without an importance matrix
// (ggml_quantize_chunk): K-quants and IQ4_NL through the model quantizers here, every other type through
// quantize_row (their reference quantizers, the same ones the KV cache uses).
void quantize_row_weights(Type t, const float* src, void* dst, int64_t n) {
    if (t == Type::IQ4_NL) {
        if (n % QK4_NL != 0) fail("quantize: row length %lld is not a multiple of %d for iq4_nl", (long long)n, QK4_NL);
        return kquant::quantize_blocks<block_iq4_nl, kquant::quantize_block_iq4_nl_search, QK4_NL>(src, dst, n);
    }
    if (type_info(t).block_size == QK_K) return quantize_row_kquant(t, src, dst, n);
    if (t == Type::Q8_0) return quantize_row_q8_0_reference(src, dst, n);
    quantize_row(t, src, dst, n);
}

// Quantizes n floats (n a multiple of 256) to a K-quant type, bit-exact with ggml's reference quantizer.
void quantize_row_kquant(Type t, const float* src, void* dst, int64_t n) {
    if (n % QK_K != 0) fail("quantize: row length %lld is not a multiple of %d for %s", (long long)n, QK_K, type_info(t).name);
    using namespace kquant;
    switch (t) {
        case Type::Q2_K: return quantize_blocks<block_q2_K, quantize_block_q2_K>(src, dst, n);
        case Type::Q3_K: return quantize_blocks<block_q3_K, quantize_block_q3_K>(src, dst, n);
        case Type::Q4_K: return quantize_blocks<block_q4_K, quantize_block_q4_K>(src, dst, n);
        case Type::Q5_K: return quantize_blocks<block_q5_K, quantize_block_q5_K>(src, dst, n);
        case Type::Q6_K: return quantize_blocks<block_q6_K, quantize_block_q6_K>(src, dst, n);
        default: fail("quantize_row_kquant: %s is not a K-quant type", type_info(t).name);
    }
}

#if defined(__clang__)
#pragma STDC FP_CONTRACT DEFAULT
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
// ============================================================================================
// 8. GGUF writer (v3), laid out as ggml's gguf writer does: header, metadata, tensor infos, zero padding
// to the alignment, then each tensor's data padded to the alignment. Tensor data is streamed: the
// header is written first (all sizes are known up front), then the caller appends each tensor in order.
// Output goes to PATH.tmp.PID and is renamed to PATH by finish(); an unfinished writer deletes its file,
// and a signal handler can delete it too (remove_unfinished_outputs). Temp files of dead processes
// (killed by SIGKILL, a power cut) are removed when the next writer opens the same PATH.
// ============================================================================================

// Temp paths being written, readable from a signal handler: fixed storage, one atomic state per entry.
namespace unfinished {
constexpr int kFree = 0, kClaimed = 1, kActive = 2;
struct Entry {
    std::atomic<int> state{kFree};
    char path[4096];
};
inline Entry g_entries[16];

// Claims an entry for path; nullptr when all are taken or the path is too long (then only normal exits
// and errors clean it up).
inline Entry* add(const std::string& path) {
    if (path.size() >= sizeof(Entry::path)) return nullptr;
    for (Entry& e : g_entries) {
        int expected = kFree;
        if (!e.state.compare_exchange_strong(expected, kClaimed)) continue;
        memcpy(e.path, path.c_str(), path.size() + 1);
        e.state.store(kActive);
        return &e;
    }
    return nullptr;
}

inline void release(Entry*& e) {
    if (e) e->state.store(kFree);
    e = nullptr;
}
}  // namespace unfinished

void remove_unfinished_outputs() {
    for (unfinished::Entry& e : unfinished::g_entries)
        if (e.state.load() == unfinished::kActive) unlink(e.path);
}

// Deletes PATH.tmp.PID files whose process is gone (kill(pid, 0) says ESRCH): leftovers of a writer that
// could not clean up. Files of live processes, ours included, are kept.
static void remove_stale_temp_files(const std::string& path) {
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
    DIR* d = opendir(dir.c_str());
    if (!d) return;
    while (const dirent* ent = readdir(d)) {
        const std::string name = ent->d_name;
        if (name.size() <= prefix.size() || name.size() > prefix.size() + 9 || name.compare(0, prefix.size(), prefix)) continue;
        const std::string digits = name.substr(prefix.size());
        if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
        const long pid = std::stol(digits);
        if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH) unlink((dir + name).c_str());
    }
    closedir(d);
}

class GGUFWriter {
public:
    explicit GGUFWriter(uint64_t alignment = 32) : alignment_(alignment) {}
    ~GGUFWriter() { abandon(); }
    GGUFWriter(const GGUFWriter&) = delete;
    GGUFWriter& operator=(const GGUFWriter&) = delete;

    // Metadata. Setting a key that exists removes it and appends it at the end, as gguf_set_val_* does.
    void set_kv(const std::vector<std::pair<std::string, GGUFValue>>& kv) {
        for (const auto& e : kv) set(e.first, e.second);
    }
    void set(const std::string& key, const GGUFValue& v) {
        remove(key);
        kv_.emplace_back(key, v);
    }
    void set_u32(const std::string& key, uint32_t val) {
        GGUFValue v;
        v.type = GGUFValueType::UINT32;
        v.u = val;
        v.i = val;
        v.f = val;
        set(key, v);
    }
    void remove(const std::string& key) {
        kv_.erase(std::remove_if(kv_.begin(), kv_.end(), [&](const auto& e) { return e.first == key; }), kv_.end());
    }

    // Tensor infos, in data order. Returns the tensor's data size.
    size_t add_tensor(const std::string& name, Type type, const int64_t ne[4]) {
        if (name.size() >= 64) fail("gguf writer: tensor name '%s' is longer than 63 bytes", name.c_str());
        Info t;
        t.name = name;
        t.type = type;
        for (int d = 0; d < 4; d++) t.ne[d] = ne[d];
        t.nbytes = row_bytes(type, ne[0]) * (size_t)shape_rows(ne);
        t.offset = data_size_;
        data_size_ += pad(t.nbytes);
        tensors_.push_back(t);
        return t.nbytes;
    }
    size_t data_size() const { return data_size_; }
    size_t meta_size() const { return pad(meta_bytes().size()); }

    // Streaming output.
    void open(const std::string& path) {
        path_ = path;
        tmp_ = path + ".tmp." + std::to_string((long)getpid());
        remove_stale_temp_files(path);
        registered_ = unfinished::add(tmp_);  // before the file exists: a signal in between finds nothing to delete
        f_ = fopen(tmp_.c_str(), "wb");
        if (!f_) fail("cannot create output file %s (as %s): %s", path.c_str(), tmp_.c_str(), strerror(errno));
        std::vector<uint8_t> meta = meta_bytes();
        write(meta.data(), meta.size());
        write_zeros(pad(meta.size()) - meta.size());
        next_ = 0;
    }
    // Appends the data of the next tensor (in add_tensor order), possibly in several pieces.
    void write_data(const void* data, size_t n) {
        if (next_ >= tensors_.size()) fail("gguf writer: more tensor data than tensors");
        Info& t = tensors_[next_];
        if (written_ + n > t.nbytes) fail("gguf writer: tensor %s: too much data", t.name.c_str());
        write(data, n);
        written_ += n;
        if (written_ == t.nbytes) {
            write_zeros(pad(t.nbytes) - t.nbytes);
            written_ = 0;
            next_++;
        }
    }
    void finish() {
        if (next_ != tensors_.size()) fail("gguf writer: %zu of %zu tensors written", next_, tensors_.size());
        if (fflush(f_) != 0 || fsync(fileno(f_)) != 0) fail("writing %s: %s", tmp_.c_str(), strerror(errno));
        FILE* f = f_;
        f_ = nullptr;
        if (fclose(f) != 0) fail("writing %s: %s", tmp_.c_str(), strerror(errno));
        if (rename(tmp_.c_str(), path_.c_str()) != 0) {
            int e = errno;
            unlink(tmp_.c_str());
            unfinished::release(registered_);
            fail("cannot rename %s to %s: %s", tmp_.c_str(), path_.c_str(), strerror(e));
        }
        unfinished::release(registered_);
        tmp_.clear();
    }
    // Drops an unfinished output file.
    void abandon() {
        if (f_) fclose(f_);
        f_ = nullptr;
        if (!tmp_.empty()) unlink(tmp_.c_str());
        unfinished::release(registered_);
        tmp_.clear();
    }

private:
    struct Info {
        std::string name;
        Type type;
        int64_t ne[4];
        size_t nbytes, offset;
    };
    uint64_t alignment_;
    std::vector<std::pair<std::string, GGUFValue>> kv_;
    std::vector<Info> tensors_;
    size_t data_size_ = 0;
    std::string path_, tmp_;
    unfinished::Entry* registered_ = nullptr;  // tmp_ as the signal handler sees it
    FILE* f_ = nullptr;
    size_t next_ = 0, written_ = 0;

    size_t pad(size_t n) const {
        if (alignment_ == 0 || (alignment_ & (alignment_ - 1))) fail("gguf writer: bad alignment %llu", (unsigned long long)alignment_);
        return (n + alignment_ - 1) / alignment_ * alignment_;
    }
    void write(const void* p, size_t n) {
        if (n && fwrite(p, 1, n, f_) != n) fail("writing %s: %s", tmp_.c_str(), strerror(errno));
    }
    void write_zeros(size_t n) {
        static const uint8_t zeros[256] = {};
        for (size_t k = 0; k < n; k += sizeof zeros) write(zeros, std::min(n - k, sizeof zeros));
    }

    // Little-endian serialization into a byte buffer.
    struct Out {
        std::vector<uint8_t> b;
        template <class T> void put(T v) {
            uint8_t tmp[sizeof(T)];
            memcpy(tmp, &v, sizeof(T));
            b.insert(b.end(), tmp, tmp + sizeof(T));
        }
        void str(const std::string& s) {
            put<uint64_t>(s.size());
            b.insert(b.end(), s.begin(), s.end());
        }
    };
    // A number of type t from its widened value (integers from u/i, floats from f).
    static void put_number(Out& o, GGUFValueType t, uint64_t u, int64_t i, double f) {
        switch (t) {
            case GGUFValueType::UINT8: o.put<uint8_t>((uint8_t)u); break;
            case GGUFValueType::INT8: o.put<int8_t>((int8_t)i); break;
            case GGUFValueType::UINT16: o.put<uint16_t>((uint16_t)u); break;
            case GGUFValueType::INT16: o.put<int16_t>((int16_t)i); break;
            case GGUFValueType::UINT32: o.put<uint32_t>((uint32_t)u); break;
            case GGUFValueType::INT32: o.put<int32_t>((int32_t)i); break;
            case GGUFValueType::UINT64: o.put<uint64_t>(u); break;
            case GGUFValueType::INT64: o.put<int64_t>(i); break;
            case GGUFValueType::FLOAT32: o.put<float>((float)f); break;
            case GGUFValueType::FLOAT64: o.put<double>(f); break;
            case GGUFValueType::BOOL: o.put<uint8_t>(u ? 1 : 0); break;
            default: fail("gguf writer: %u is not a number type", (unsigned)t);
        }
    }
    static void put_value(Out& o, const GGUFValue& v) {
        if (v.type == GGUFValueType::STRING) return o.str(v.str);
        if (v.type != GGUFValueType::ARRAY) return put_number(o, v.type, v.u, v.i, v.f);
        o.put<uint32_t>((uint32_t)v.elem_type);
        o.put<uint64_t>(v.size());
        if (v.elem_type == GGUFValueType::STRING) {
            for (const auto& s : v.arr_str) o.str(s);
        } else if (v.elem_type == GGUFValueType::ARRAY) {
            for (const auto& e : v.arr) put_value(o, e);  // each is element type, count, elements
        } else {
            // The reader keeps number arrays as doubles: exact for every type but 64-bit integers > 2^53.
            for (double d : v.arr_num) {
                bool is_signed = v.elem_type == GGUFValueType::INT8 || v.elem_type == GGUFValueType::INT16 ||
                                 v.elem_type == GGUFValueType::INT32 || v.elem_type == GGUFValueType::INT64;
                int64_t i = std::isfinite(d) ? (int64_t)d : 0;
                uint64_t u = is_signed ? (uint64_t)i : (std::isfinite(d) && d > 0 ? (uint64_t)d : 0);
                put_number(o, v.elem_type, u, i, d);
            }
            for (const auto& e : v.arr) put_number(o, v.elem_type, e.u, e.i, e.f);
        }
    }
    std::vector<uint8_t> meta_bytes() const {
        Out o;
        o.put<uint32_t>(0x46554747u);  // "GGUF"
        o.put<uint32_t>(3);
        o.put<uint64_t>(tensors_.size());
        o.put<uint64_t>(kv_.size());
        for (const auto& e : kv_) {
            o.str(e.first);
            o.put<uint32_t>((uint32_t)e.second.type);
            put_value(o, e.second);
        }
        for (const auto& t : tensors_) {
            o.str(t.name);
            int n_dims = 1;  // ggml_n_dims: trailing dimensions of 1 are not written
            for (int d = 1; d < 4; d++)
                if (t.ne[d] > 1) n_dims = d + 1;
            o.put<uint32_t>((uint32_t)n_dims);
            for (int d = 0; d < n_dims; d++) o.put<uint64_t>((uint64_t)t.ne[d]);
            o.put<uint32_t>((uint32_t)t.type);
            o.put<uint64_t>(t.offset);
        }
        return o.b;
    }
};
// ============================================================================================
// 9. Model quantizer: the per-tensor type choice of each file type (llama.cpp's llama_tensor_get_type,
// upstream 81ff7abe5) and the driver that streams a GGUF through the quantizers.
// Uses quantize_row_weights / dequantize_row (sections 5, 7) and GGUFWriter (section 8).
// ============================================================================================

namespace qmix {

struct FileTypeInfo {
    FileType ft;
    const char* name;
    Type type;  // default tensor type
};
// In llama-quantize's order, so a numeric id resolves to the same name it prints.
constexpr FileTypeInfo kFileTypes[] = {
    {FileType::Q4_0, "Q4_0", Type::Q4_0},       {FileType::Q4_1, "Q4_1", Type::Q4_1},
    {FileType::Q5_0, "Q5_0", Type::Q5_0},       {FileType::Q5_1, "Q5_1", Type::Q5_1},
    {FileType::Q2_K, "Q2_K", Type::Q2_K},       {FileType::Q3_K_S, "Q3_K_S", Type::Q3_K},
    {FileType::Q3_K_M, "Q3_K_M", Type::Q3_K},   {FileType::Q3_K_L, "Q3_K_L", Type::Q3_K},
    {FileType::IQ4_NL, "IQ4_NL", Type::IQ4_NL}, {FileType::Q4_K_S, "Q4_K_S", Type::Q4_K},
    {FileType::Q4_K_M, "Q4_K_M", Type::Q4_K},   {FileType::Q5_K_S, "Q5_K_S", Type::Q5_K},
    {FileType::Q5_K_M, "Q5_K_M", Type::Q5_K},   {FileType::Q6_K, "Q6_K", Type::Q6_K},
    {FileType::Q8_0, "Q8_0", Type::Q8_0},       {FileType::F16, "F16", Type::F16},
    {FileType::BF16, "BF16", Type::BF16},       {FileType::F32, "F32", Type::F32},
};

const FileTypeInfo& info(FileType ft) {
    for (const auto& e : kFileTypes)
        if (e.ft == ft) return e;
    fail("unsupported file type %u", (unsigned)ft);
}

inline bool is_quantized(Type t) { return type_info(t).block_size > 1; }
inline bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Broad tensor roles the type rules talk about (llama-quant.cpp tensor_category).
enum class Category { TokenEmbd, AttnQ, AttnV, AttnK, AttnQKV, AttnKVB, AttnOutput, FfnUp, FfnGate, FfnDown, Output, Other };

Category category_of(const std::string& name) {
    if (name == "output.weight") return Category::Output;
    if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Category::TokenEmbd;
    if (contains(name, "attn_qkv.weight")) return Category::AttnQKV;
    if (contains(name, "attn_kv_b.weight")) return Category::AttnKVB;
    if (contains(name, "attn_v.weight")) return Category::AttnV;
    if (contains(name, "attn_k.weight")) return Category::AttnK;
    if (contains(name, "attn_q.weight")) return Category::AttnQ;
    if (contains(name, "attn_output.weight")) return Category::AttnOutput;
    if (contains(name, "ffn_up")) return Category::FfnUp;
    if (contains(name, "ffn_gate")) return Category::FfnGate;
    if (contains(name, "ffn_down")) return Category::FfnDown;
    return Category::Other;
}
// attn_v-like tensors (more sensitive to quantization) share the attn_v rules and its layer counter.
inline bool is_attn_v_like(Category c) { return c == Category::AttnV || c == Category::AttnQKV || c == Category::AttnKVB; }

int n_dims_of(const TensorInfo& t) {  // ggml_n_dims
    int n = 1;
    for (int d = 1; d < 4; d++)
        if (t.ne[d] > 1) n = d + 1;
    return n;
}

// Which tensors are quantized at all: 2-D and 3-D weights, minus norms, routers, embeddings of positions
// and token types, and small special-purpose matrices (llama-quant.cpp tensor_allows_quantization).
bool allows_quantization(const TensorInfo& t, const QuantizeOptions& opt) {
    if (n_dims_of(t) < 2) return false;
    const std::string& name = t.name;
    if (name.size() < 6 || name.compare(name.size() - 6, 6, "weight") != 0) return false;
    if (contains(name, "_norm.weight")) return false;
    if (opt.leave_output_tensor && name == "output.weight") return false;
    static const char* const kKeep[] = {
        "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
        "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
        "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
        "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
        "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
        "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
        "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
        ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd",
    };
    for (const char* k : kKeep)
        if (contains(name, k)) return false;
    return name != "position_embd.weight" && name != "token_types.weight";
}

// Model facts the rules use, and the running layer counters (llama-quant.cpp quantize_state_impl).
struct MixState {
    std::string arch;
    int n_layer = 0, n_expert = 0, n_gqa = 0;
    bool is_70b = false;
    bool has_tied_embeddings = true;  // until output.weight is seen
    int n_attention_wv = 0, i_attention_wv = 0;
    int i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;
    int n_fallback = 0;
};

// First element of a per-layer array, or the scalar.
int64_t first_int(const GGUF& g, const std::string& key, int64_t def) {
    const GGUFValue* v = g.find(key);
    if (!v) return def;
    if (v->is_array()) return v->arr_num.empty() ? def : (int64_t)v->arr_num[0];
    if (v->type == GGUFValueType::STRING) fail("metadata %s is not a number", key.c_str());
    return v->i;
}

MixState model_facts(const GGUF& in) {
    MixState s;
    s.arch = in.get_str("general.architecture");
    if (s.arch.empty()) fail("quantize: the model has no general.architecture");
    s.n_layer = (int)in.get_int(s.arch + ".block_count", 0);
    s.n_expert = (int)in.get_int(s.arch + ".expert_count", 0);
    int64_t n_head = first_int(in, s.arch + ".attention.head_count", 0);
    int64_t n_head_kv = first_int(in, s.arch + ".attention.head_count_kv", n_head);
    s.n_gqa = n_head_kv > 0 ? (int)(n_head / n_head_kv) : 0;
    s.is_70b = s.arch == "llama" && s.n_layer == 80 && n_head != n_head_kv;  // llama.cpp's LLM_TYPE_70B
    return s;
}

// The mix rules proper (llama_tensor_get_type_impl): new_type is the default type on entry.
Type mix_type(MixState& qs, const QuantizeOptions& opt, Type new_type, const TensorInfo& t, Category cat) {
    using F = FileType;
    const F ft = opt.ftype;
    const std::string& name = t.name;
    const bool falcon = qs.arch == "falcon";
    auto use_more_bits = [](int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
    // Layer of an FFN tensor: the running count, or for MoE models (whose expert tensors need not come in
    // layer order) the number in the name.
    auto layer_of = [&](int counter) {
        int il = counter;
        if (qs.n_expert > 1) {
            if (sscanf(name.c_str(), "blk.%d.", &il) != 1) fail("quantize: cannot determine the layer of tensor %s", name.c_str());
            if (il < 0 || il >= qs.n_layer) fail("quantize: bad layer %d for tensor %s (model has %d)", il, name.c_str(), qs.n_layer);
        }
        return il;
    };
    const int n_layer = qs.n_layer;

    if (cat == Category::Output || (qs.has_tied_embeddings && cat == Category::TokenEmbd)) {
        // The output matrix (or the embedding that doubles as it) gets at least 6 bits.
        if (opt.has_output_tensor_type) {
            new_type = opt.output_tensor_type;
        } else if (falcon || t.ne[0] % type_info(new_type).block_size != 0) {
            new_type = Type::Q8_0;
        } else if (new_type != Type::Q8_0) {
            new_type = Type::Q6_K;
        }
    } else if (cat == Category::TokenEmbd) {
        if (opt.has_token_embedding_type) new_type = opt.token_embedding_type;
    } else if (is_attn_v_like(cat)) {
        if (ft == F::Q2_K) new_type = qs.n_gqa >= 4 ? Type::Q4_K : Type::Q3_K;
        else if (ft == F::Q3_K_M) new_type = qs.i_attention_wv < 2 ? Type::Q5_K : Type::Q4_K;
        else if (ft == F::Q3_K_L) new_type = Type::Q5_K;
        else if (ft == F::IQ4_NL && qs.n_gqa >= 4) new_type = Type::Q5_K;
        else if ((ft == F::Q4_K_M || ft == F::Q5_K_M) && use_more_bits(qs.i_attention_wv, qs.n_attention_wv)) new_type = Type::Q6_K;
        else if (ft == F::Q4_K_S && qs.i_attention_wv < 4) new_type = Type::Q5_K;
        // 70B: 8 heads share each attn_v, so more bits there cost little.
        if (qs.is_70b && (new_type == Type::Q3_K || new_type == Type::Q4_K)) new_type = Type::Q5_K;
        if (qs.n_expert == 8) new_type = Type::Q8_0;
        ++qs.i_attention_wv;
    } else if (cat == Category::AttnK) {
        if (qs.n_expert == 8) new_type = Type::Q8_0;
    } else if (cat == Category::FfnDown) {
        const int il = layer_of(qs.i_ffn_down);
        if (ft == F::Q2_K) new_type = Type::Q3_K;
        else if (ft == F::Q3_K_M) {
            new_type = il < n_layer / 16 ? Type::Q5_K : !falcon || use_more_bits(il, n_layer) ? Type::Q4_K : Type::Q3_K;
        } else if (ft == F::Q3_K_L) {
            new_type = falcon ? Type::Q4_K : Type::Q5_K;
        } else if (ft == F::Q4_K_M) {
            if (falcon) new_type = il < n_layer / 16 ? Type::Q6_K : use_more_bits(il, n_layer) ? Type::Q5_K : Type::Q4_K;
            else if (use_more_bits(il, n_layer)) new_type = Type::Q6_K;
        } else if (il < n_layer / 8 && ft == F::IQ4_NL) {  // (no imatrix)
            new_type = Type::Q5_K;
        } else if (ft == F::Q5_K_M && use_more_bits(il, n_layer)) {
            new_type = Type::Q6_K;
        } else if (ft == F::Q4_K_S && !falcon && il < n_layer / 8) {
            new_type = Type::Q5_K;
        }
        ++qs.i_ffn_down;
    } else if (cat == Category::AttnOutput) {
        if (!falcon) {
            if (qs.n_expert == 8) {
                if (ft == F::Q2_K || ft == F::Q3_K_S || ft == F::Q3_K_M || ft == F::IQ4_NL || ft == F::Q4_K_S || ft == F::Q4_K_M)
                    new_type = Type::Q5_K;
            } else {
                if (ft == F::Q2_K) new_type = Type::Q3_K;
                else if (ft == F::Q3_K_M) new_type = Type::Q4_K;
                else if (ft == F::Q3_K_L) new_type = Type::Q5_K;
            }
        } else if (ft == F::Q3_K_L) {
            new_type = Type::Q4_K;
        }
    } else if (cat == Category::FfnGate) {
        layer_of(qs.i_ffn_gate);  // validates the name as the reference does; no rule for these mixes
        ++qs.i_ffn_gate;
    } else if (cat == Category::FfnUp) {
        layer_of(qs.i_ffn_up);
        ++qs.i_ffn_up;
    }
    return new_type;
}

// A row length the chosen type cannot hold falls back to a type with 32-element blocks, or to F16.
Type fallback_type(MixState& qs, const TensorInfo& t, Type type) {
    const int64_t bs = type_info(type).block_size;
    if (t.ne[0] % bs == 0) return type;
    ++qs.n_fallback;
    Type r;
    switch (type) {
        case Type::Q2_K: case Type::Q3_K: r = Type::IQ4_NL; break;  // as llama-quant.cpp: the nearest 32-block type
        case Type::Q4_K: r = Type::Q5_0; break;
        case Type::Q5_K: r = Type::Q5_1; break;
        case Type::Q6_K: r = Type::Q8_0; break;
        default: fail("quantize: tensor %s: row length %lld is not a multiple of %lld and %s has no fallback type",
                      t.name.c_str(), (long long)t.ne[0], (long long)bs, type_info(type).name);
    }
    if (t.ne[0] % type_info(r).block_size != 0) r = Type::F16;
    return r;
}

// llama_tensor_get_type: the options that name a type win, then the mix rules, then the fallback.
Type tensor_type(MixState& qs, const QuantizeOptions& opt, const TensorInfo& t, Category cat) {
    if (!allows_quantization(t, opt)) return t.type;
    if (opt.has_token_embedding_type && cat == Category::TokenEmbd) return opt.token_embedding_type;
    if (opt.has_output_tensor_type && cat == Category::Output) return opt.output_tensor_type;
    Type new_type = info(opt.ftype).type;
    if (!is_quantized(new_type)) return new_type;
    if (!opt.pure) new_type = mix_type(qs, opt, new_type, t, cat);
    return fallback_type(qs, t, new_type);
}

// The reference's tensor order (llama_model_loader's weight map): tensors outside the layers first, by
// name, then by layer number, by name within a layer.
std::vector<const TensorInfo*> output_order(const GGUF& in) {
    std::vector<const TensorInfo*> v;
    for (const auto& t : in.tensors) v.push_back(&t);
    auto layer = [](const std::string& n) {
        int il = -1;
        sscanf(n.c_str(), "blk.%d.", &il);
        return il;
    };
    std::stable_sort(v.begin(), v.end(), [&](const TensorInfo* a, const TensorInfo* b) {
        int la = layer(a->name), lb = layer(b->name);
        return la != lb ? la < lb : a->name < b->name;
    });
    return v;
}

size_t tensor_bytes(Type t, const TensorInfo& ti) { return row_bytes(t, ti.ne[0]) * (size_t)ti.n_rows(); }

// Converts one row of any input type to float.
void row_to_f32(const TensorInfo& t, int64_t row, float* out) {
    const int64_t n = t.ne[0];
    const uint8_t* src = t.data + (size_t)row * row_bytes(t.type, n);
    switch (t.type) {
        case Type::F32: memcpy(out, src, (size_t)n * 4); break;
        case Type::F16: for (int64_t i = 0; i < n; i++) out[i] = fp16_to_fp32(((const uint16_t*)src)[i]); break;
        case Type::BF16: for (int64_t i = 0; i < n; i++) out[i] = bf16_to_fp32(((const uint16_t*)src)[i]); break;
        default: dequantize_row(t.type, src, out, n); break;
    }
}

// ggml_validate_row_data for what we produce: no NaN or infinity in float data or in block scales.
bool valid_output(Type t, const uint8_t* p, size_t nbytes) {
    auto bad_f16 = [](const uint8_t* q) {
        uint16_t h;
        memcpy(&h, q, 2);
        return (h & 0x7c00) == 0x7c00;
    };
    switch (t) {
        case Type::F32:
            for (size_t i = 0; i < nbytes; i += 4) {
                float f;
                memcpy(&f, p + i, 4);
                if (!std::isfinite(f)) return false;
            }
            return true;
        case Type::F16:
            for (size_t i = 0; i < nbytes; i += 2)
                if (bad_f16(p + i)) return false;
            return true;
        case Type::BF16:
            for (size_t i = 0; i < nbytes; i += 2) {
                uint16_t h;
                memcpy(&h, p + i, 2);
                if ((h & 0x7f80) == 0x7f80) return false;
            }
            return true;
        default: break;
    }
    // Offsets of the fp16 scale fields within a block.
    std::vector<size_t> fields;
    switch (t) {
        case Type::Q4_0: case Type::Q5_0: case Type::Q8_0: case Type::IQ4_NL: fields = {0}; break;
        case Type::Q4_1: case Type::Q5_1: case Type::Q4_K: case Type::Q5_K: fields = {0, 2}; break;
        case Type::Q2_K: fields = {offsetof(block_q2_K, d), offsetof(block_q2_K, dmin)}; break;
        case Type::Q3_K: fields = {offsetof(block_q3_K, d)}; break;
        case Type::Q6_K: fields = {offsetof(block_q6_K, d)}; break;
        default: return true;
    }
    const size_t bb = type_info(t).block_bytes;
    for (size_t b = 0; b + bb <= nbytes; b += bb)
        for (size_t f : fields)
            if (bad_f16(p + b + f)) return false;
    return true;
}

// Quantizes rows [r0, r1) of t to `type` into out, on n_threads threads.
void quantize_rows(const TensorInfo& t, Type type, int64_t r0, int64_t r1, uint8_t* out, int n_threads) {
    const int64_t n = t.ne[0];
    const size_t rb = row_bytes(type, n);
    std::atomic<int64_t> next{r0};
    const int64_t chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));  // rows per claim; n may be 0
    std::exception_ptr error;
    std::mutex error_mutex;
    auto work = [&] {
        try {
            std::vector<float> f32((size_t)n);
            for (;;) {
                int64_t a = next.fetch_add(chunk);
                if (a >= r1) break;
                for (int64_t r = a; r < std::min(r1, a + chunk); r++) {
                    uint8_t* dst = out + (size_t)(r - r0) * rb;
                    if (type == Type::F32) {
                        row_to_f32(t, r, (float*)dst);
                    } else {
                        row_to_f32(t, r, f32.data());
                        quantize_row_weights(type, f32.data(), dst, n);
                    }
                }
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!error) error = std::current_exception();
        }
    };
    int64_t n_chunks = (r1 - r0 + chunk - 1) / chunk;
    int nt = (int)std::max<int64_t>(1, std::min<int64_t>(n_threads, n_chunks));
    std::vector<std::thread> threads;
    for (int i = 1; i < nt; i++) threads.emplace_back(work);
    work();
    for (auto& th : threads) th.join();
    if (error) std::rethrow_exception(error);
}

} // namespace qmix

FileType file_type_from_name(const std::string& name) {
    std::string up;
    for (char c : name) up += (char)toupper((unsigned char)c);
    if (up == "Q3_K") return FileType::Q3_K_M;  // llama-quantize's aliases
    if (up == "Q4_K") return FileType::Q4_K_M;
    if (up == "Q5_K") return FileType::Q5_K_M;
    for (const auto& e : qmix::kFileTypes)
        if (up == e.name) return e.ft;
    if (!up.empty() && up.size() < 4 && std::all_of(up.begin(), up.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        int id = std::stoi(up);
        for (const auto& e : qmix::kFileTypes)
            if ((int)e.ft == id) return e.ft;
    }
    std::string known;
    for (const auto& e : qmix::kFileTypes) known += std::string(" ") + e.name;
    fail("unknown quantization type '%s' (known:%s, Q3_K, Q4_K, Q5_K)", name.c_str(), known.c_str());
}

const char* file_type_name(FileType ft) { return qmix::info(ft).name; }
Type file_type_default(FileType ft) { return qmix::info(ft).type; }

QuantizeResult quantize_plan(const GGUF& in, const QuantizeOptions& opt) {
    using namespace qmix;
    QuantizeResult res;
    MixState qs = model_facts(in);
    std::vector<const TensorInfo*> order = output_order(in);
    for (const TensorInfo* t : order) {
        Category c = category_of(t->name);
        if (is_attn_v_like(c)) qs.n_attention_wv++;
        if (c == Category::Output) qs.has_tied_embeddings = false;
    }
    for (const TensorInfo* t : order) {
        QuantizePlanEntry e;
        e.src = t;
        e.type = tensor_type(qs, opt, *t, category_of(t->name));
        e.nbytes = tensor_bytes(e.type, *t);
        if (e.type != t->type && is_quantized(t->type) && !opt.allow_requantize) {
            fail("tensor %s is already quantized (%s): requantizing is disabled (use --allow-requantize)",
                 t->name.c_str(), type_info(t->type).name);
        }
        res.bytes_in += t->nbytes;
        res.bytes_out += e.nbytes;
        res.n_elements += t->nelements();
        res.plan.push_back(e);
    }
    res.n_fallback = qs.n_fallback;
    return res;
}

QuantizeResult quantize_model(const std::string& in_path, const std::string& out_path, const QuantizeOptions& opt) {
    using namespace qmix;
    const double t0 = now_seconds();
    std::unique_ptr<GGUF> in = GGUF::open(in_path);
    read_hparams(*in);  // no output for a file the loader would reject
    QuantizeResult res = quantize_plan(*in, opt);
    int n_threads = opt.n_threads > 0 ? opt.n_threads : (int)std::max(1u, std::thread::hardware_concurrency());

    GGUFWriter w(in->alignment);
    w.set_kv(in->kv);
    w.set_u32("general.quantization_version", 2);
    w.set_u32("general.file_type", (uint32_t)opt.ftype);
    for (const char* k : {"split.no", "split.count", "split.tensors.count"}) w.remove(k);
    for (const auto& e : res.plan) w.add_tensor(e.src->name, e.type, e.src->ne);
    if (!opt.dry_run) w.open(out_path);

    const size_t kBatchBytes = 64u << 20;  // output buffered per step: bounds memory for any tensor size
    std::vector<uint8_t> buf;
    const size_t n = res.plan.size();
    for (size_t i = 0; i < n; i++) {
        const QuantizePlanEntry& e = res.plan[i];
        const TensorInfo& t = *e.src;
        const double ts = now_seconds();
        if (!opt.dry_run) {
            if (e.type == t.type) {
                w.write_data(t.data, t.nbytes);
            } else {
                const int64_t nrows = t.n_rows();
                const size_t rb = row_bytes(e.type, t.ne[0]);
                const int64_t batch = std::max<int64_t>(1, (int64_t)(kBatchBytes / std::max<size_t>(rb, 1)));
                for (int64_t r0 = 0; r0 < nrows; r0 += batch) {
                    const int64_t r1 = std::min(nrows, r0 + batch);
                    buf.resize((size_t)(r1 - r0) * rb);
                    quantize_rows(t, e.type, r0, r1, buf.data(), n_threads);
                    if (!valid_output(e.type, buf.data(), buf.size())) {
                        fail("tensor %s: quantized data contains NaN or infinity (is the input finite?)", t.name.c_str());
                    }
                    w.write_data(buf.data(), buf.size());
                }
            }
        }
        if (opt.verbose) {
            char shape[96];
            snprintf(shape, sizeof shape, "%lld x %lld x %lld x %lld", (long long)t.ne[0], (long long)t.ne[1],
                     (long long)t.ne[2], (long long)t.ne[3]);
            fprintf(stderr, "[%4zu/%4zu] %-36s [%s] %6s -> %-6s %9.3f MiB -> %9.3f MiB  %.2f s\n", i + 1, n,
                    t.name.c_str(), shape, type_info(t.type).name, type_info(e.type).name, t.nbytes / 1048576.0,
                    e.nbytes / 1048576.0, now_seconds() - ts);
        }
    }
    buf = std::vector<uint8_t>();
    if (!opt.dry_run) w.finish();
    res.seconds = now_seconds() - t0;
    if (opt.verbose) {
        const double ne = (double)std::max<int64_t>(1, res.n_elements);
        fprintf(stderr, "%s: %s %s -> %s%s\n", opt.dry_run ? "dry run" : "quantized", file_type_name(opt.ftype),
                in_path.c_str(), opt.dry_run ? "(nothing written)" : out_path.c_str(), opt.pure ? " (pure)" : "");
        fprintf(stderr, "  input  %10.2f MiB tensor data (%.2f bits per weight)\n", res.bytes_in / 1048576.0, res.bytes_in * 8.0 / ne);
        fprintf(stderr, "  output %10.2f MiB tensor data (%.2f bits per weight), file %.2f MiB\n", res.bytes_out / 1048576.0,
                res.bytes_out * 8.0 / ne, (w.meta_size() + w.data_size()) / 1048576.0);
        if (res.n_fallback) fprintf(stderr, "  %d of %zu tensors needed a fallback type (row length not a multiple of the block size)\n", res.n_fallback, n);
        fprintf(stderr, "  time %.2f s, %d threads\n", res.seconds, n_threads);
    }
    return res;
}
// ============================================================================================
// 10. Tokenizer
// ============================================================================================
// Reproduces llama.cpp's tokenizers token for token (src/llama-vocab.cpp, src/unicode.cpp):
//  - SentencePiece ("llama"): bigram merges by score over UTF-8 characters, byte fallback <0xXX>.
//  - byte-level BPE ("gpt2"): a pre-tokenizer splits the text into words (per tokenizer.ggml.pre),
//    each word's bytes are mapped to printable code points (GPT-2's bytes_to_unicode), then merged by
//    merge rank.
// The pre-tokenizers are regular expressions in the reference. Instead of a regex engine, each
// expression is a hand-written matcher below that returns the length of the match at a position,
// following ECMAScript semantics (ordered alternation, greedy quantifiers with backtracking) and the
// reference's character classes exactly, including its quirks: \p{..} is evaluated on a "collapsed"
// text where every non-ASCII code point stands for its category (so \p{S} misses ASCII '~'), and
// \s is the Unicode White_Space property.

namespace tokenizer_impl {

// BEGIN generated unicode tables (scripts/gen-unicode-tables.py)
// Generated by scripts/gen-unicode-tables.py from Python 3.11.7's unicodedata (Unicode 14.0.0).
// Do not edit; rerun the script instead.

// (first code point << 8) | flags; a run lasts until the next entry's first code point.
// flags: bits 0-2 UCat (other, number, letter, mark, punct, symbol, control), bit 3 White_Space.
static const uint32_t kUnicodeRanges[] = {
    0x0000006, 0x000090E, 0x0000E06, 0x0002008, 0x0002104, 0x0002405, 0x0002504, 0x0002B05,
    0x0002C04, 0x0003001, 0x0003A04, 0x0003C05, 0x0003F04, 0x0004102, 0x0005B04, 0x0005E05,
    0x0005F04, 0x0006005, 0x0006102, 0x0007B04, 0x0007C05, 0x0007D04, 0x0007E05, 0x0007F06,
    0x000850E, 0x0008606, 0x000A008, 0x000A104, 0x000A205, 0x000A704, 0x000A805, 0x000AA02,
    0x000AB04, 0x000AC05, 0x000AD06, 0x000AE05, 0x000B201, 0x000B405, 0x000B502, 0x000B604,
    0x000B805, 0x000B901, 0x000BA02, 0x000BB04, 0x000BC01, 0x000BF04, 0x000C002, 0x000D705,
    0x000D802, 0x000F705, 0x000F802, 0x002C205, 0x002C602, 0x002D205, 0x002E002, 0x002E505,
    0x002EC02, 0x002ED05, 0x002EE02, 0x002EF05, 0x0030003, 0x0037002, 0x0037505, 0x0037602,
    0x0037800, 0x0037A02, 0x0037E04, 0x0037F02, 0x0038000, 0x0038405, 0x0038602, 0x0038704,
    0x0038802, 0x0038B00, 0x0038C02, 0x0038D00, 0x0038E02, 0x003A200, 0x003A302, 0x003F605,
    0x003F702, 0x0048205, 0x0048303, 0x0048A02, 0x0053000, 0x0053102, 0x0055700, 0x0055902,
    0x0055A04, 0x0056002, 0x0058904, 0x0058B00, 0x0058D05, 0x0059000, 0x0059103, 0x005BE04,
    0x005BF03, 0x005C004, 0x005C103, 0x005C304, 0x005C403, 0x005C604, 0x005C703, 0x005C800,
    0x005D002, 0x005EB00, 0x005EF02, 0x005F304, 0x005F500, 0x0060006, 0x0060605, 0x0060904,
    0x0060B05, 0x0060C04, 0x0060E05, 0x0061003, 0x0061B04, 0x0061C06, 0x0061D04, 0x0062002,
    0x0064B03, 0x0066001, 0x0066A04, 0x0066E02, 0x0067003, 0x0067102, 0x006D404, 0x006D502,
    0x006D603, 0x006DD06, 0x006DE05, 0x006DF03, 0x006E502, 0x006E703, 0x006E905, 0x006EA03,
    0x006EE02, 0x006F001, 0x006FA02, 0x006FD05, 0x006FF02, 0x0070004, 0x0070E00, 0x0070F06,
    0x0071002, 0x0071103, 0x0071202, 0x0073003, 0x0074B00, 0x0074D02, 0x007A603, 0x007B102,
    0x007B200, 0x007C001, 0x007CA02, 0x007EB03, 0x007F402, 0x007F605, 0x007F704, 0x007FA02,
    0x007FB00, 0x007FD03, 0x007FE05, 0x0080002, 0x0081603, 0x0081A02, 0x0081B03, 0x0082402,
    0x0082503, 0x0082802, 0x0082903, 0x0082E00, 0x0083004, 0x0083F00, 0x0084002, 0x0085903,
    0x0085C00, 0x0085E04, 0x0085F00, 0x0086002, 0x0086B00, 0x0087002, 0x0088805, 0x0088902,
    0x0088F00, 0x0089006, 0x0089200, 0x0089803, 0x008A002, 0x008CA03, 0x008E206, 0x008E303,
    0x0090402, 0x0093A03, 0x0093D02, 0x0093E03, 0x0095002, 0x0095103, 0x0095802, 0x0096203,
    0x0096404, 0x0096601, 0x0097004, 0x0097102, 0x0098103, 0x0098400, 0x0098502, 0x0098D00,
    0x0098F02, 0x0099100, 0x0099302, 0x009A900, 0x009AA02, 0x009B100, 0x009B202, 0x009B300,
    0x009B602, 0x009BA00, 0x009BC03, 0x009BD02, 0x009BE03, 0x009C500, 0x009C703, 0x009C900,
    0x009CB03, 0x009CE02, 0x009CF00, 0x009D703, 0x009D800, 0x009DC02, 0x009DE00, 0x009DF02,
    0x009E203, 0x009E400, 0x009E601, 0x009F002, 0x009F205, 0x009F401, 0x009FA05, 0x009FC02,
    0x009FD04, 0x009FE03, 0x009FF00, 0x00A0103, 0x00A0400, 0x00A0502, 0x00A0B00, 0x00A0F02,
    0x00A1100, 0x00A1302, 0x00A2900, 0x00A2A02, 0x00A3100, 0x00A3202, 0x00A3400, 0x00A3502,
    0x00A3700, 0x00A3802, 0x00A3A00, 0x00A3C03, 0x00A3D00, 0x00A3E03, 0x00A4300, 0x00A4703,
    0x00A4900, 0x00A4B03, 0x00A4E00, 0x00A5103, 0x00A5200, 0x00A5902, 0x00A5D00, 0x00A5E02,
    0x00A5F00, 0x00A6601, 0x00A7003, 0x00A7202, 0x00A7503, 0x00A7604, 0x00A7700, 0x00A8103,
    0x00A8400, 0x00A8502, 0x00A8E00, 0x00A8F02, 0x00A9200, 0x00A9302, 0x00AA900, 0x00AAA02,
    0x00AB100, 0x00AB202, 0x00AB400, 0x00AB502, 0x00ABA00, 0x00ABC03, 0x00ABD02, 0x00ABE03,
    0x00AC600, 0x00AC703, 0x00ACA00, 0x00ACB03, 0x00ACE00, 0x00AD002, 0x00AD100, 0x00AE002,
    0x00AE203, 0x00AE400, 0x00AE601, 0x00AF004, 0x00AF105, 0x00AF200, 0x00AF902, 0x00AFA03,
    0x00B0000, 0x00B0103, 0x00B0400, 0x00B0502, 0x00B0D00, 0x00B0F02, 0x00B1100, 0x00B1302,
    0x00B2900, 0x00B2A02, 0x00B3100, 0x00B3202, 0x00B3400, 0x00B3502, 0x00B3A00, 0x00B3C03,
    0x00B3D02, 0x00B3E03, 0x00B4500, 0x00B4703, 0x00B4900, 0x00B4B03, 0x00B4E00, 0x00B5503,
    0x00B5800, 0x00B5C02, 0x00B5E00, 0x00B5F02, 0x00B6203, 0x00B6400, 0x00B6601, 0x00B7005,
    0x00B7102, 0x00B7201, 0x00B7800, 0x00B8203, 0x00B8302, 0x00B8400, 0x00B8502, 0x00B8B00,
    0x00B8E02, 0x00B9100, 0x00B9202, 0x00B9600, 0x00B9902, 0x00B9B00, 0x00B9C02, 0x00B9D00,
    0x00B9E02, 0x00BA000, 0x00BA302, 0x00BA500, 0x00BA802, 0x00BAB00, 0x00BAE02, 0x00BBA00,
    0x00BBE03, 0x00BC300, 0x00BC603, 0x00BC900, 0x00BCA03, 0x00BCE00, 0x00BD002, 0x00BD100,
    0x00BD703, 0x00BD800, 0x00BE601, 0x00BF305, 0x00BFB00, 0x00C0003, 0x00C0502, 0x00C0D00,
    0x00C0E02, 0x00C1100, 0x00C1202, 0x00C2900, 0x00C2A02, 0x00C3A00, 0x00C3C03, 0x00C3D02,
    0x00C3E03, 0x00C4500, 0x00C4603, 0x00C4900, 0x00C4A03, 0x00C4E00, 0x00C5503, 0x00C5700,
    0x00C5802, 0x00C5B00, 0x00C5D02, 0x00C5E00, 0x00C6002, 0x00C6203, 0x00C6400, 0x00C6601,
    0x00C7000, 0x00C7704, 0x00C7801, 0x00C7F05, 0x00C8002, 0x00C8103, 0x00C8404, 0x00C8502,
    0x00C8D00, 0x00C8E02, 0x00C9100, 0x00C9202, 0x00CA900, 0x00CAA02, 0x00CB400, 0x00CB502,
    0x00CBA00, 0x00CBC03, 0x00CBD02, 0x00CBE03, 0x00CC500, 0x00CC603, 0x00CC900, 0x00CCA03,
    0x00CCE00, 0x00CD503, 0x00CD700, 0x00CDD02, 0x00CDF00, 0x00CE002, 0x00CE203, 0x00CE400,
    0x00CE601, 0x00CF000, 0x00CF102, 0x00CF300, 0x00D0003, 0x00D0402, 0x00D0D00, 0x00D0E02,
    0x00D1100, 0x00D1202, 0x00D3B03, 0x00D3D02, 0x00D3E03, 0x00D4500, 0x00D4603, 0x00D4900,
    0x00D4A03, 0x00D4E02, 0x00D4F05, 0x00D5000, 0x00D5402, 0x00D5703, 0x00D5801, 0x00D5F02,
    0x00D6203, 0x00D6400, 0x00D6601, 0x00D7905, 0x00D7A02, 0x00D8000, 0x00D8103, 0x00D8400,
    0x00D8502, 0x00D9700, 0x00D9A02, 0x00DB200, 0x00DB302, 0x00DBC00, 0x00DBD02, 0x00DBE00,
    0x00DC002, 0x00DC700, 0x00DCA03, 0x00DCB00, 0x00DCF03, 0x00DD500, 0x00DD603, 0x00DD700,
    0x00DD803, 0x00DE000, 0x00DE601, 0x00DF000, 0x00DF203, 0x00DF404, 0x00DF500, 0x00E0102,
    0x00E3103, 0x00E3202, 0x00E3403, 0x00E3B00, 0x00E3F05, 0x00E4002, 0x00E4703, 0x00E4F04,
    0x00E5001, 0x00E5A04, 0x00E5C00, 0x00E8102, 0x00E8300, 0x00E8402, 0x00E8500, 0x00E8602,
    0x00E8B00, 0x00E8C02, 0x00EA400, 0x00EA502, 0x00EA600, 0x00EA702, 0x00EB103, 0x00EB202,
    0x00EB403, 0x00EBD02, 0x00EBE00, 0x00EC002, 0x00EC500, 0x00EC602, 0x00EC700, 0x00EC803,
    0x00ECE00, 0x00ED001, 0x00EDA00, 0x00EDC02, 0x00EE000, 0x00F0002, 0x00F0105, 0x00F0404,
    0x00F1305, 0x00F1404, 0x00F1505, 0x00F1803, 0x00F1A05, 0x00F2001, 0x00F3405, 0x00F3503,
    0x00F3605, 0x00F3703, 0x00F3805, 0x00F3903, 0x00F3A04, 0x00F3E03, 0x00F4002, 0x00F4800,
    0x00F4902, 0x00F6D00, 0x00F7103, 0x00F8504, 0x00F8603, 0x00F8802, 0x00F8D03, 0x00F9800,
    0x00F9903, 0x00FBD00, 0x00FBE05, 0x00FC603, 0x00FC705, 0x00FCD00, 0x00FCE05, 0x00FD004,
    0x00FD505, 0x00FD904, 0x00FDB00, 0x0100002, 0x0102B03, 0x0103F02, 0x0104001, 0x0104A04,
    0x0105002, 0x0105603, 0x0105A02, 0x0105E03, 0x0106102, 0x0106203, 0x0106502, 0x0106703,
    0x0106E02, 0x0107103, 0x0107502, 0x0108203, 0x0108E02, 0x0108F03, 0x0109001, 0x0109A03,
    0x0109E05, 0x010A002, 0x010C600, 0x010C702, 0x010C800, 0x010CD02, 0x010CE00, 0x010D002,
    0x010FB04, 0x010FC02, 0x0124900, 0x0124A02, 0x0124E00, 0x0125002, 0x0125700, 0x0125802,
    0x0125900, 0x0125A02, 0x0125E00, 0x0126002, 0x0128900, 0x0128A02, 0x0128E00, 0x0129002,
    0x012B100, 0x012B202, 0x012B600, 0x012B802, 0x012BF00, 0x012C002, 0x012C100, 0x012C202,
    0x012C600, 0x012C802, 0x012D700, 0x012D802, 0x0131100, 0x0131202, 0x0131600, 0x0131802,
    0x0135B00, 0x0135D03, 0x0136004, 0x0136901, 0x0137D00, 0x0138002, 0x0139005, 0x0139A00,
    0x013A002, 0x013F600, 0x013F802, 0x013FE00, 0x0140004, 0x0140102, 0x0166D05, 0x0166E04,
    0x0166F02, 0x0168008, 0x0168102, 0x0169B04, 0x0169D00, 0x016A002, 0x016EB04, 0x016EE01,
    0x016F102, 0x016F900, 0x0170002, 0x0171203, 0x0171600, 0x0171F02, 0x0173203, 0x0173504,
    0x0173700, 0x0174002, 0x0175203, 0x0175400, 0x0176002, 0x0176D00, 0x0176E02, 0x0177100,
    0x0177203, 0x0177400, 0x0178002, 0x017B403, 0x017D404, 0x017D702, 0x017D804, 0x017DB05,
    0x017DC02, 0x017DD03, 0x017DE00, 0x017E001, 0x017EA00, 0x017F001, 0x017FA00, 0x0180004,
    0x0180B03, 0x0180E06, 0x0180F03, 0x0181001, 0x0181A00, 0x0182002, 0x0187900, 0x0188002,
    0x0188503, 0x0188702, 0x018A903, 0x018AA02, 0x018AB00, 0x018B002, 0x018F600, 0x0190002,
    0x0191F00, 0x0192003, 0x0192C00, 0x0193003, 0x0193C00, 0x0194005, 0x0194100, 0x0194404,
    0x0194601, 0x0195002, 0x0196E00, 0x0197002, 0x0197500, 0x0198002, 0x019AC00, 0x019B002,
    0x019CA00, 0x019D001, 0x019DB00, 0x019DE05, 0x01A0002, 0x01A1703, 0x01A1C00, 0x01A1E04,
    0x01A2002, 0x01A5503, 0x01A5F00, 0x01A6003, 0x01A7D00, 0x01A7F03, 0x01A8001, 0x01A8A00,
    0x01A9001, 0x01A9A00, 0x01AA004, 0x01AA702, 0x01AA804, 0x01AAE00, 0x01AB003, 0x01ACF00,
    0x01B0003, 0x01B0502, 0x01B3403, 0x01B4502, 0x01B4D00, 0x01B5001, 0x01B5A04, 0x01B6105,
    0x01B6B03, 0x01B7405, 0x01B7D04, 0x01B7F00, 0x01B8003, 0x01B8302, 0x01BA103, 0x01BAE02,
    0x01BB001, 0x01BBA02, 0x01BE603, 0x01BF400, 0x01BFC04, 0x01C0002, 0x01C2403, 0x01C3800,
    0x01C3B04, 0x01C4001, 0x01C4A00, 0x01C4D02, 0x01C5001, 0x01C5A02, 0x01C7E04, 0x01C8002,
    0x01C8900, 0x01C9002, 0x01CBB00, 0x01CBD02, 0x01CC004, 0x01CC800, 0x01CD003, 0x01CD304,
    0x01CD403, 0x01CE902, 0x01CED03, 0x01CEE02, 0x01CF403, 0x01CF502, 0x01CF703, 0x01CFA02,
    0x01CFB00, 0x01D0002, 0x01DC003, 0x01E0002, 0x01F1600, 0x01F1802, 0x01F1E00, 0x01F2002,
    0x01F4600, 0x01F4802, 0x01F4E00, 0x01F5002, 0x01F5800, 0x01F5902, 0x01F5A00, 0x01F5B02,
    0x01F5C00, 0x01F5D02, 0x01F5E00, 0x01F5F02, 0x01F7E00, 0x01F8002, 0x01FB500, 0x01FB602,
    0x01FBD05, 0x01FBE02, 0x01FBF05, 0x01FC202, 0x01FC500, 0x01FC602, 0x01FCD05, 0x01FD002,
    0x01FD400, 0x01FD602, 0x01FDC00, 0x01FDD05, 0x01FE002, 0x01FED05, 0x01FF000, 0x01FF202,
    0x01FF500, 0x01FF602, 0x01FFD05, 0x01FFF00, 0x0200008, 0x0200B06, 0x0201004, 0x0202808,
    0x0202A06, 0x0202F08, 0x0203004, 0x0204405, 0x0204504, 0x0205205, 0x0205304, 0x0205F08,
    0x0206006, 0x0206500, 0x0206606, 0x0207001, 0x0207102, 0x0207200, 0x0207401, 0x0207A05,
    0x0207D04, 0x0207F02, 0x0208001, 0x0208A05, 0x0208D04, 0x0208F00, 0x0209002, 0x0209D00,
    0x020A005, 0x020C100, 0x020D003, 0x020F100, 0x0210005, 0x0210202, 0x0210305, 0x0210702,
    0x0210805, 0x0210A02, 0x0211405, 0x0211502, 0x0211605, 0x0211902, 0x0211E05, 0x0212402,
    0x0212505, 0x0212602, 0x0212705, 0x0212802, 0x0212905, 0x0212A02, 0x0212E05, 0x0212F02,
    0x0213A05, 0x0213C02, 0x0214005, 0x0214502, 0x0214A05, 0x0214E02, 0x0214F05, 0x0215001,
    0x0218302, 0x0218501, 0x0218A05, 0x0218C00, 0x0219005, 0x0230804, 0x0230C05, 0x0232904,
    0x0232B05, 0x0242700, 0x0244005, 0x0244B00, 0x0246001, 0x0249C05, 0x024EA01, 0x0250005,
    0x0276804, 0x0277601, 0x0279405, 0x027C504, 0x027C705, 0x027E604, 0x027F005, 0x0298304,
    0x0299905, 0x029D804, 0x029DC05, 0x029FC04, 0x029FE05, 0x02B7400, 0x02B7605, 0x02B9600,
    0x02B9705, 0x02C0002, 0x02CE505, 0x02CEB02, 0x02CEF03, 0x02CF202, 0x02CF400, 0x02CF904,
    0x02CFD01, 0x02CFE04, 0x02D0002, 0x02D2600, 0x02D2702, 0x02D2800, 0x02D2D02, 0x02D2E00,
    0x02D3002, 0x02D6800, 0x02D6F02, 0x02D7004, 0x02D7100, 0x02D7F03, 0x02D8002, 0x02D9700,
    0x02DA002, 0x02DA700, 0x02DA802, 0x02DAF00, 0x02DB002, 0x02DB700, 0x02DB802, 0x02DBF00,
    0x02DC002, 0x02DC700, 0x02DC802, 0x02DCF00, 0x02DD002, 0x02DD700, 0x02DD802, 0x02DDF00,
    0x02DE003, 0x02E0004, 0x02E2F02, 0x02E3004, 0x02E5005, 0x02E5204, 0x02E5E00, 0x02E8005,
    0x02E9A00, 0x02E9B05, 0x02EF400, 0x02F0005, 0x02FD600, 0x02FF005, 0x02FFC00, 0x0300008,
    0x0300104, 0x0300405, 0x0300502, 0x0300701, 0x0300804, 0x0301205, 0x0301404, 0x0302005,
    0x0302101, 0x0302A03, 0x0303004, 0x0303102, 0x0303605, 0x0303801, 0x0303B02, 0x0303D04,
    0x0303E05, 0x0304000, 0x0304102, 0x0309700, 0x0309903, 0x0309B05, 0x0309D02, 0x030A004,
    0x030A102, 0x030FB04, 0x030FC02, 0x0310000, 0x0310502, 0x0313000, 0x0313102, 0x0318F00,
    0x0319005, 0x0319201, 0x0319605, 0x031A002, 0x031C005, 0x031E400, 0x031F002, 0x0320005,
    0x0321F00, 0x0322001, 0x0322A05, 0x0324801, 0x0325005, 0x0325101, 0x0326005, 0x0328001,
    0x0328A05, 0x032B101, 0x032C005, 0x0340002, 0x04DC005, 0x04E0002, 0x0A48D00, 0x0A49005,
    0x0A4C700, 0x0A4D002, 0x0A4FE04, 0x0A50002, 0x0A60D04, 0x0A61002, 0x0A62001, 0x0A62A02,
    0x0A62C00, 0x0A64002, 0x0A66F03, 0x0A67304, 0x0A67403, 0x0A67E04, 0x0A67F02, 0x0A69E03,
    0x0A6A002, 0x0A6E601, 0x0A6F003, 0x0A6F204, 0x0A6F800, 0x0A70005, 0x0A71702, 0x0A72005,
    0x0A72202, 0x0A78905, 0x0A78B02, 0x0A7CB00, 0x0A7D002, 0x0A7D200, 0x0A7D302, 0x0A7D400,
    0x0A7D502, 0x0A7DA00, 0x0A7F202, 0x0A80203, 0x0A80302, 0x0A80603, 0x0A80702, 0x0A80B03,
    0x0A80C02, 0x0A82303, 0x0A82805, 0x0A82C03, 0x0A82D00, 0x0A83001, 0x0A83605, 0x0A83A00,
    0x0A84002, 0x0A87404, 0x0A87800, 0x0A88003, 0x0A88202, 0x0A8B403, 0x0A8C600, 0x0A8CE04,
    0x0A8D001, 0x0A8DA00, 0x0A8E003, 0x0A8F202, 0x0A8F804, 0x0A8FB02, 0x0A8FC04, 0x0A8FD02,
    0x0A8FF03, 0x0A90001, 0x0A90A02, 0x0A92603, 0x0A92E04, 0x0A93002, 0x0A94703, 0x0A95400,
    0x0A95F04, 0x0A96002, 0x0A97D00, 0x0A98003, 0x0A98402, 0x0A9B303, 0x0A9C104, 0x0A9CE00,
    0x0A9CF02, 0x0A9D001, 0x0A9DA00, 0x0A9DE04, 0x0A9E002, 0x0A9E503, 0x0A9E602, 0x0A9F001,
    0x0A9FA02, 0x0A9FF00, 0x0AA0002, 0x0AA2903, 0x0AA3700, 0x0AA4002, 0x0AA4303, 0x0AA4402,
    0x0AA4C03, 0x0AA4E00, 0x0AA5001, 0x0AA5A00, 0x0AA5C04, 0x0AA6002, 0x0AA7705, 0x0AA7A02,
    0x0AA7B03, 0x0AA7E02, 0x0AAB003, 0x0AAB102, 0x0AAB203, 0x0AAB502, 0x0AAB703, 0x0AAB902,
    0x0AABE03, 0x0AAC002, 0x0AAC103, 0x0AAC202, 0x0AAC300, 0x0AADB02, 0x0AADE04, 0x0AAE002,
    0x0AAEB03, 0x0AAF004, 0x0AAF202, 0x0AAF503, 0x0AAF700, 0x0AB0102, 0x0AB0700, 0x0AB0902,
    0x0AB0F00, 0x0AB1102, 0x0AB1700, 0x0AB2002, 0x0AB2700, 0x0AB2802, 0x0AB2F00, 0x0AB3002,
    0x0AB5B05, 0x0AB5C02, 0x0AB6A05, 0x0AB6C00, 0x0AB7002, 0x0ABE303, 0x0ABEB04, 0x0ABEC03,
    0x0ABEE00, 0x0ABF001, 0x0ABFA00, 0x0AC0002, 0x0D7A400, 0x0D7B002, 0x0D7C700, 0x0D7CB02,
    0x0D7FC00, 0x0D80006, 0x0F90002, 0x0FA6E00, 0x0FA7002, 0x0FADA00, 0x0FB0002, 0x0FB0700,
    0x0FB1302, 0x0FB1800, 0x0FB1D02, 0x0FB1E03, 0x0FB1F02, 0x0FB2905, 0x0FB2A02, 0x0FB3700,
    0x0FB3802, 0x0FB3D00, 0x0FB3E02, 0x0FB3F00, 0x0FB4002, 0x0FB4200, 0x0FB4302, 0x0FB4500,
    0x0FB4602, 0x0FBB205, 0x0FBC300, 0x0FBD302, 0x0FD3E04, 0x0FD4005, 0x0FD5002, 0x0FD9000,
    0x0FD9202, 0x0FDC800, 0x0FDCF05, 0x0FDD000, 0x0FDF002, 0x0FDFC05, 0x0FE0003, 0x0FE1004,
    0x0FE1A00, 0x0FE2003, 0x0FE3004, 0x0FE5300, 0x0FE5404, 0x0FE6205, 0x0FE6304, 0x0FE6405,
    0x0FE6700, 0x0FE6804, 0x0FE6905, 0x0FE6A04, 0x0FE6C00, 0x0FE7002, 0x0FE7500, 0x0FE7602,
    0x0FEFD00, 0x0FEFF06, 0x0FF0000, 0x0FF0104, 0x0FF0405, 0x0FF0504, 0x0FF0B05, 0x0FF0C04,
    0x0FF1001, 0x0FF1A04, 0x0FF1C05, 0x0FF1F04, 0x0FF2102, 0x0FF3B04, 0x0FF3E05, 0x0FF3F04,
    0x0FF4005, 0x0FF4102, 0x0FF5B04, 0x0FF5C05, 0x0FF5D04, 0x0FF5E05, 0x0FF5F04, 0x0FF6602,
    0x0FFBF00, 0x0FFC202, 0x0FFC800, 0x0FFCA02, 0x0FFD000, 0x0FFD202, 0x0FFD800, 0x0FFDA02,
    0x0FFDD00, 0x0FFE005, 0x0FFE700, 0x0FFE805, 0x0FFEF00, 0x0FFF906, 0x0FFFC05, 0x0FFFE00,
    0x1000002, 0x1000C00, 0x1000D02, 0x1002700, 0x1002802, 0x1003B00, 0x1003C02, 0x1003E00,
    0x1003F02, 0x1004E00, 0x1005002, 0x1005E00, 0x1008002, 0x100FB00, 0x1010004, 0x1010300,
    0x1010701, 0x1013400, 0x1013705, 0x1014001, 0x1017905, 0x1018A01, 0x1018C05, 0x1018F00,
    0x1019005, 0x1019D00, 0x101A005, 0x101A100, 0x101D005, 0x101FD03, 0x101FE00, 0x1028002,
    0x1029D00, 0x102A002, 0x102D100, 0x102E003, 0x102E101, 0x102FC00, 0x1030002, 0x1032001,
    0x1032400, 0x1032D02, 0x1034101, 0x1034202, 0x1034A01, 0x1034B00, 0x1035002, 0x1037603,
    0x1037B00, 0x1038002, 0x1039E00, 0x1039F04, 0x103A002, 0x103C400, 0x103C802, 0x103D004,
    0x103D101, 0x103D600, 0x1040002, 0x1049E00, 0x104A001, 0x104AA00, 0x104B002, 0x104D400,
    0x104D802, 0x104FC00, 0x1050002, 0x1052800, 0x1053002, 0x1056400, 0x1056F04, 0x1057002,
    0x1057B00, 0x1057C02, 0x1058B00, 0x1058C02, 0x1059300, 0x1059402, 0x1059600, 0x1059702,
    0x105A200, 0x105A302, 0x105B200, 0x105B302, 0x105BA00, 0x105BB02, 0x105BD00, 0x1060002,
    0x1073700, 0x1074002, 0x1075600, 0x1076002, 0x1076800, 0x1078002, 0x1078600, 0x1078702,
    0x107B100, 0x107B202, 0x107BB00, 0x1080002, 0x1080600, 0x1080802, 0x1080900, 0x1080A02,
    0x1083600, 0x1083702, 0x1083900, 0x1083C02, 0x1083D00, 0x1083F02, 0x1085600, 0x1085704,
    0x1085801, 0x1086002, 0x1087705, 0x1087901, 0x1088002, 0x1089F00, 0x108A701, 0x108B000,
    0x108E002, 0x108F300, 0x108F402, 0x108F600, 0x108FB01, 0x1090002, 0x1091601, 0x1091C00,
    0x1091F04, 0x1092002, 0x1093A00, 0x1093F04, 0x1094000, 0x1098002, 0x109B800, 0x109BC01,
    0x109BE02, 0x109C001, 0x109D000, 0x109D201, 0x10A0002, 0x10A0103, 0x10A0400, 0x10A0503,
    0x10A0700, 0x10A0C03, 0x10A1002, 0x10A1400, 0x10A1502, 0x10A1800, 0x10A1902, 0x10A3600,
    0x10A3803, 0x10A3B00, 0x10A3F03, 0x10A4001, 0x10A4900, 0x10A5004, 0x10A5900, 0x10A6002,
    0x10A7D01, 0x10A7F04, 0x10A8002, 0x10A9D01, 0x10AA000, 0x10AC002, 0x10AC805, 0x10AC902,
    0x10AE503, 0x10AE700, 0x10AEB01, 0x10AF004, 0x10AF700, 0x10B0002, 0x10B3600, 0x10B3904,
    0x10B4002, 0x10B5600, 0x10B5801, 0x10B6002, 0x10B7300, 0x10B7801, 0x10B8002, 0x10B9200,
    0x10B9904, 0x10B9D00, 0x10BA901, 0x10BB000, 0x10C0002, 0x10C4900, 0x10C8002, 0x10CB300,
    0x10CC002, 0x10CF300, 0x10CFA01, 0x10D0002, 0x10D2403, 0x10D2800, 0x10D3001, 0x10D3A00,
    0x10E6001, 0x10E7F00, 0x10E8002, 0x10EAA00, 0x10EAB03, 0x10EAD04, 0x10EAE00, 0x10EB002,
    0x10EB200, 0x10F0002, 0x10F1D01, 0x10F2702, 0x10F2800, 0x10F3002, 0x10F4603, 0x10F5101,
    0x10F5504, 0x10F5A00, 0x10F7002, 0x10F8203, 0x10F8604, 0x10F8A00, 0x10FB002, 0x10FC501,
    0x10FCC00, 0x10FE002, 0x10FF700, 0x1100003, 0x1100302, 0x1103803, 0x1104704, 0x1104E00,
    0x1105201, 0x1107003, 0x1107102, 0x1107303, 0x1107502, 0x1107600, 0x1107F03, 0x1108302,
    0x110B003, 0x110BB04, 0x110BD06, 0x110BE04, 0x110C203, 0x110C300, 0x110CD06, 0x110CE00,
    0x110D002, 0x110E900, 0x110F001, 0x110FA00, 0x1110003, 0x1110302, 0x1112703, 0x1113500,
    0x1113601, 0x1114004, 0x1114402, 0x1114503, 0x1114702, 0x1114800, 0x1115002, 0x1117303,
    0x1117404, 0x1117602, 0x1117700, 0x1118003, 0x1118302, 0x111B303, 0x111C102, 0x111C504,
    0x111C903, 0x111CD04, 0x111CE03, 0x111D001, 0x111DA02, 0x111DB04, 0x111DC02, 0x111DD04,
    0x111E000, 0x111E101, 0x111F500, 0x1120002, 0x1121200, 0x1121302, 0x1122C03, 0x1123804,
    0x1123E03, 0x1123F00, 0x1128002, 0x1128700, 0x1128802, 0x1128900, 0x1128A02, 0x1128E00,
    0x1128F02, 0x1129E00, 0x1129F02, 0x112A904, 0x112AA00, 0x112B002, 0x112DF03, 0x112EB00,
    0x112F001, 0x112FA00, 0x1130003, 0x1130400, 0x1130502, 0x1130D00, 0x1130F02, 0x1131100,
    0x1131302, 0x1132900, 0x1132A02, 0x1133100, 0x1133202, 0x1133400, 0x1133502, 0x1133A00,
    0x1133B03, 0x1133D02, 0x1133E03, 0x1134500, 0x1134703, 0x1134900, 0x1134B03, 0x1134E00,
    0x1135002, 0x1135100, 0x1135703, 0x1135800, 0x1135D02, 0x1136203, 0x1136400, 0x1136603,
    0x1136D00, 0x1137003, 0x1137500, 0x1140002, 0x1143503, 0x1144702, 0x1144B04, 0x1145001,
    0x1145A04, 0x1145C00, 0x1145D04, 0x1145E03, 0x1145F02, 0x1146200, 0x1148002, 0x114B003,
    0x114C402, 0x114C604, 0x114C702, 0x114C800, 0x114D001, 0x114DA00, 0x1158002, 0x115AF03,
    0x115B600, 0x115B803, 0x115C104, 0x115D802, 0x115DC03, 0x115DE00, 0x1160002, 0x1163003,
    0x1164104, 0x1164402, 0x1164500, 0x1165001, 0x1165A00, 0x1166004, 0x1166D00, 0x1168002,
    0x116AB03, 0x116B802, 0x116B904, 0x116BA00, 0x116C001, 0x116CA00, 0x1170002, 0x1171B00,
    0x1171D03, 0x1172C00, 0x1173001, 0x1173C04, 0x1173F05, 0x1174002, 0x1174700, 0x1180002,
    0x1182C03, 0x1183B04, 0x1183C00, 0x118A002, 0x118E001, 0x118F300, 0x118FF02, 0x1190700,
    0x1190902, 0x1190A00, 0x1190C02, 0x1191400, 0x1191502, 0x1191700, 0x1191802, 0x1193003,
    0x1193600, 0x1193703, 0x1193900, 0x1193B03, 0x1193F02, 0x1194003, 0x1194102, 0x1194203,
    0x1194404, 0x1194700, 0x1195001, 0x1195A00, 0x119A002, 0x119A800, 0x119AA02, 0x119D103,
    0x119D800, 0x119DA03, 0x119E102, 0x119E204, 0x119E302, 0x119E403, 0x119E500, 0x11A0002,
    0x11A0103, 0x11A0B02, 0x11A3303, 0x11A3A02, 0x11A3B03, 0x11A3F04, 0x11A4703, 0x11A4800,
    0x11A5002, 0x11A5103, 0x11A5C02, 0x11A8A03, 0x11A9A04, 0x11A9D02, 0x11A9E04, 0x11AA300,
    0x11AB002, 0x11AF900, 0x11C0002, 0x11C0900, 0x11C0A02, 0x11C2F03, 0x11C3700, 0x11C3803,
    0x11C4002, 0x11C4104, 0x11C4600, 0x11C5001, 0x11C6D00, 0x11C7004, 0x11C7202, 0x11C9000,
    0x11C9203, 0x11CA800, 0x11CA903, 0x11CB700, 0x11D0002, 0x11D0700, 0x11D0802, 0x11D0A00,
    0x11D0B02, 0x11D3103, 0x11D3700, 0x11D3A03, 0x11D3B00, 0x11D3C03, 0x11D3E00, 0x11D3F03,
    0x11D4602, 0x11D4703, 0x11D4800, 0x11D5001, 0x11D5A00, 0x11D6002, 0x11D6600, 0x11D6702,
    0x11D6900, 0x11D6A02, 0x11D8A03, 0x11D8F00, 0x11D9003, 0x11D9200, 0x11D9303, 0x11D9802,
    0x11D9900, 0x11DA001, 0x11DAA00, 0x11EE002, 0x11EF303, 0x11EF704, 0x11EF900, 0x11FB002,
    0x11FB100, 0x11FC001, 0x11FD505, 0x11FF200, 0x11FFF04, 0x1200002, 0x1239A00, 0x1240001,
    0x1246F00, 0x1247004, 0x1247500, 0x1248002, 0x1254400, 0x12F9002, 0x12FF104, 0x12FF300,
    0x1300002, 0x1342F00, 0x1343006, 0x1343900, 0x1440002, 0x1464700, 0x1680002, 0x16A3900,
    0x16A4002, 0x16A5F00, 0x16A6001, 0x16A6A00, 0x16A6E04, 0x16A7002, 0x16ABF00, 0x16AC001,
    0x16ACA00, 0x16AD002, 0x16AEE00, 0x16AF003, 0x16AF504, 0x16AF600, 0x16B0002, 0x16B3003,
    0x16B3704, 0x16B3C05, 0x16B4002, 0x16B4404, 0x16B4505, 0x16B4600, 0x16B5001, 0x16B5A00,
    0x16B5B01, 0x16B6200, 0x16B6302, 0x16B7800, 0x16B7D02, 0x16B9000, 0x16E4002, 0x16E8001,
    0x16E9704, 0x16E9B00, 0x16F0002, 0x16F4B00, 0x16F4F03, 0x16F5002, 0x16F5103, 0x16F8800,
    0x16F8F03, 0x16F9302, 0x16FA000, 0x16FE002, 0x16FE204, 0x16FE302, 0x16FE403, 0x16FE500,
    0x16FF003, 0x16FF200, 0x1700002, 0x187F800, 0x1880002, 0x18CD600, 0x18D0002, 0x18D0900,
    0x1AFF002, 0x1AFF400, 0x1AFF502, 0x1AFFC00, 0x1AFFD02, 0x1AFFF00, 0x1B00002, 0x1B12300,
    0x1B15002, 0x1B15300, 0x1B16402, 0x1B16800, 0x1B17002, 0x1B2FC00, 0x1BC0002, 0x1BC6B00,
    0x1BC7002, 0x1BC7D00, 0x1BC8002, 0x1BC8900, 0x1BC9002, 0x1BC9A00, 0x1BC9C05, 0x1BC9D03,
    0x1BC9F04, 0x1BCA006, 0x1BCA400, 0x1CF0003, 0x1CF2E00, 0x1CF3003, 0x1CF4700, 0x1CF5005,
    0x1CFC400, 0x1D00005, 0x1D0F600, 0x1D10005, 0x1D12700, 0x1D12905, 0x1D16503, 0x1D16A05,
    0x1D16D03, 0x1D17306, 0x1D17B03, 0x1D18305, 0x1D18503, 0x1D18C05, 0x1D1AA03, 0x1D1AE05,
    0x1D1EB00, 0x1D20005, 0x1D24203, 0x1D24505, 0x1D24600, 0x1D2E001, 0x1D2F400, 0x1D30005,
    0x1D35700, 0x1D36001, 0x1D37900, 0x1D40002, 0x1D45500, 0x1D45602, 0x1D49D00, 0x1D49E02,
    0x1D4A000, 0x1D4A202, 0x1D4A300, 0x1D4A502, 0x1D4A700, 0x1D4A902, 0x1D4AD00, 0x1D4AE02,
    0x1D4BA00, 0x1D4BB02, 0x1D4BC00, 0x1D4BD02, 0x1D4C400, 0x1D4C502, 0x1D50600, 0x1D50702,
    0x1D50B00, 0x1D50D02, 0x1D51500, 0x1D51602, 0x1D51D00, 0x1D51E02, 0x1D53A00, 0x1D53B02,
    0x1D53F00, 0x1D54002, 0x1D54500, 0x1D54602, 0x1D54700, 0x1D54A02, 0x1D55100, 0x1D55202,
    0x1D6A600, 0x1D6A802, 0x1D6C105, 0x1D6C202, 0x1D6DB05, 0x1D6DC02, 0x1D6FB05, 0x1D6FC02,
    0x1D71505, 0x1D71602, 0x1D73505, 0x1D73602, 0x1D74F05, 0x1D75002, 0x1D76F05, 0x1D77002,
    0x1D78905, 0x1D78A02, 0x1D7A905, 0x1D7AA02, 0x1D7C305, 0x1D7C402, 0x1D7CC00, 0x1D7CE01,
    0x1D80005, 0x1DA0003, 0x1DA3705, 0x1DA3B03, 0x1DA6D05, 0x1DA7503, 0x1DA7605, 0x1DA8403,
    0x1DA8505, 0x1DA8704, 0x1DA8C00, 0x1DA9B03, 0x1DAA000, 0x1DAA103, 0x1DAB000, 0x1DF0002,
    0x1DF1F00, 0x1E00003, 0x1E00700, 0x1E00803, 0x1E01900, 0x1E01B03, 0x1E02200, 0x1E02303,
    0x1E02500, 0x1E02603, 0x1E02B00, 0x1E10002, 0x1E12D00, 0x1E13003, 0x1E13702, 0x1E13E00,
    0x1E14001, 0x1E14A00, 0x1E14E02, 0x1E14F05, 0x1E15000, 0x1E29002, 0x1E2AE03, 0x1E2AF00,
    0x1E2C002, 0x1E2EC03, 0x1E2F001, 0x1E2FA00, 0x1E2FF05, 0x1E30000, 0x1E7E002, 0x1E7E700,
    0x1E7E802, 0x1E7EC00, 0x1E7ED02, 0x1E7EF00, 0x1E7F002, 0x1E7FF00, 0x1E80002, 0x1E8C500,
    0x1E8C701, 0x1E8D003, 0x1E8D700, 0x1E90002, 0x1E94403, 0x1E94B02, 0x1E94C00, 0x1E95001,
    0x1E95A00, 0x1E95E04, 0x1E96000, 0x1EC7101, 0x1ECAC05, 0x1ECAD01, 0x1ECB005, 0x1ECB101,
    0x1ECB500, 0x1ED0101, 0x1ED2E05, 0x1ED2F01, 0x1ED3E00, 0x1EE0002, 0x1EE0400, 0x1EE0502,
    0x1EE2000, 0x1EE2102, 0x1EE2300, 0x1EE2402, 0x1EE2500, 0x1EE2702, 0x1EE2800, 0x1EE2902,
    0x1EE3300, 0x1EE3402, 0x1EE3800, 0x1EE3902, 0x1EE3A00, 0x1EE3B02, 0x1EE3C00, 0x1EE4202,
    0x1EE4300, 0x1EE4702, 0x1EE4800, 0x1EE4902, 0x1EE4A00, 0x1EE4B02, 0x1EE4C00, 0x1EE4D02,
    0x1EE5000, 0x1EE5102, 0x1EE5300, 0x1EE5402, 0x1EE5500, 0x1EE5702, 0x1EE5800, 0x1EE5902,
    0x1EE5A00, 0x1EE5B02, 0x1EE5C00, 0x1EE5D02, 0x1EE5E00, 0x1EE5F02, 0x1EE6000, 0x1EE6102,
    0x1EE6300, 0x1EE6402, 0x1EE6500, 0x1EE6702, 0x1EE6B00, 0x1EE6C02, 0x1EE7300, 0x1EE7402,
    0x1EE7800, 0x1EE7902, 0x1EE7D00, 0x1EE7E02, 0x1EE7F00, 0x1EE8002, 0x1EE8A00, 0x1EE8B02,
    0x1EE9C00, 0x1EEA102, 0x1EEA400, 0x1EEA502, 0x1EEAA00, 0x1EEAB02, 0x1EEBC00, 0x1EEF005,
    0x1EEF200, 0x1F00005, 0x1F02C00, 0x1F03005, 0x1F09400, 0x1F0A005, 0x1F0AF00, 0x1F0B105,
    0x1F0C000, 0x1F0C105, 0x1F0D000, 0x1F0D105, 0x1F0F600, 0x1F10001, 0x1F10D05, 0x1F1AE00,
    0x1F1E605, 0x1F20300, 0x1F21005, 0x1F23C00, 0x1F24005, 0x1F24900, 0x1F25005, 0x1F25200,
    0x1F26005, 0x1F26600, 0x1F30005, 0x1F6D800, 0x1F6DD05, 0x1F6ED00, 0x1F6F005, 0x1F6FD00,
    0x1F70005, 0x1F77400, 0x1F78005, 0x1F7D900, 0x1F7E005, 0x1F7EC00, 0x1F7F005, 0x1F7F100,
    0x1F80005, 0x1F80C00, 0x1F81005, 0x1F84800, 0x1F85005, 0x1F85A00, 0x1F86005, 0x1F88800,
    0x1F89005, 0x1F8AE00, 0x1F8B005, 0x1F8B200, 0x1F90005, 0x1FA5400, 0x1FA6005, 0x1FA6E00,
    0x1FA7005, 0x1FA7500, 0x1FA7805, 0x1FA7D00, 0x1FA8005, 0x1FA8700, 0x1FA9005, 0x1FAAD00,
    0x1FAB005, 0x1FABB00, 0x1FAC005, 0x1FAC600, 0x1FAD005, 0x1FADA00, 0x1FAE005, 0x1FAE800,
    0x1FAF005, 0x1FAF700, 0x1FB0005, 0x1FB9300, 0x1FB9405, 0x1FBCB00, 0x1FBF001, 0x1FBFA00,
    0x2000002, 0x2A6E000, 0x2A70002, 0x2B73900, 0x2B74002, 0x2B81E00, 0x2B82002, 0x2CEA200,
    0x2CEB002, 0x2EBE100, 0x2F80002, 0x2FA1E00, 0x3000002, 0x3134B00, 0xE000106, 0xE000200,
    0xE002006, 0xE008000, 0xE010003, 0xE01F000, 0xF000006, 0xFFFFE00, 0x10000006, 0x10FFFE00,
};

// DeepSeek LLM pre-tokenizer letter class, inclusive [lo, hi] pairs.
static const uint32_t kDeepseekLetterRanges[][2] = {
    {0x00041, 0x0005A}, {0x00061, 0x0007A}, {0x000B5, 0x000B5}, {0x000C0, 0x000D6}, {0x000D8, 0x000F6},
    {0x000F8, 0x001BA}, {0x001BC, 0x001BF}, {0x001C4, 0x00293}, {0x00295, 0x002AF}, {0x00370, 0x00373},
    {0x00376, 0x00377}, {0x0037B, 0x0037D}, {0x0037F, 0x0037F}, {0x00386, 0x00386}, {0x00388, 0x0038A},
    {0x0038C, 0x0038C}, {0x0038E, 0x003A1}, {0x003A3, 0x003F5}, {0x003F7, 0x00481}, {0x0048A, 0x0052F},
    {0x00531, 0x00556}, {0x010A0, 0x010C5}, {0x013A0, 0x013F5}, {0x013F8, 0x013FD}, {0x01C90, 0x01CBA},
    {0x01CBD, 0x01CBF}, {0x01D00, 0x01D2B}, {0x01D6B, 0x01D77}, {0x01D79, 0x01D9A}, {0x01E00, 0x01F15},
    {0x01F18, 0x01F1D}, {0x01F20, 0x01F45}, {0x01F48, 0x01F4D}, {0x01F50, 0x01F57}, {0x01F59, 0x01F59},
    {0x01F5B, 0x01F5B}, {0x01F5D, 0x01F5D}, {0x01F5F, 0x01F7D}, {0x01F80, 0x01FB4}, {0x01FB6, 0x01FBC},
    {0x01FBE, 0x01FBE}, {0x01FC2, 0x01FC4}, {0x01FC6, 0x01FCC}, {0x01FD0, 0x01FD3}, {0x01FD6, 0x01FDB},
    {0x01FE0, 0x01FEC}, {0x01FF2, 0x01FF4}, {0x01FF6, 0x01FFC}, {0x02102, 0x02102}, {0x02107, 0x02107},
    {0x0210A, 0x02113}, {0x02115, 0x02115}, {0x02119, 0x0211D}, {0x02124, 0x02124}, {0x02126, 0x02126},
    {0x02128, 0x02128}, {0x0212A, 0x0212D}, {0x0212F, 0x02134}, {0x02139, 0x02139}, {0x0213C, 0x0213F},
    {0x02145, 0x02149}, {0x0214E, 0x0214E}, {0x02183, 0x02184}, {0x02C00, 0x02C7B}, {0x02C7E, 0x02CE4},
    {0x02CEB, 0x02CEE}, {0x02CF2, 0x02CF3}, {0x0A640, 0x0A66D}, {0x0A680, 0x0A69B}, {0x0A722, 0x0A76F},
    {0x0A771, 0x0A787}, {0x0A78B, 0x0A78E}, {0x0AB70, 0x0ABBF}, {0x0FB00, 0x0FB06}, {0x0FB13, 0x0FB17},
    {0x0FF21, 0x0FF3A}, {0x0FF41, 0x0FF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

// (code point, lowercase code point) where they differ, sorted.
static const uint32_t kUnicodeLower[][2] = {
    {0x00041, 0x00061}, {0x00042, 0x00062}, {0x00043, 0x00063}, {0x00044, 0x00064}, {0x00045, 0x00065}, {0x00046, 0x00066},
    {0x00047, 0x00067}, {0x00048, 0x00068}, {0x00049, 0x00069}, {0x0004A, 0x0006A}, {0x0004B, 0x0006B}, {0x0004C, 0x0006C},
    {0x0004D, 0x0006D}, {0x0004E, 0x0006E}, {0x0004F, 0x0006F}, {0x00050, 0x00070}, {0x00051, 0x00071}, {0x00052, 0x00072},
    {0x00053, 0x00073}, {0x00054, 0x00074}, {0x00055, 0x00075}, {0x00056, 0x00076}, {0x00057, 0x00077}, {0x00058, 0x00078},
    {0x00059, 0x00079}, {0x0005A, 0x0007A}, {0x000C0, 0x000E0}, {0x000C1, 0x000E1}, {0x000C2, 0x000E2}, {0x000C3, 0x000E3},
    {0x000C4, 0x000E4}, {0x000C5, 0x000E5}, {0x000C6, 0x000E6}, {0x000C7, 0x000E7}, {0x000C8, 0x000E8}, {0x000C9, 0x000E9},
    {0x000CA, 0x000EA}, {0x000CB, 0x000EB}, {0x000CC, 0x000EC}, {0x000CD, 0x000ED}, {0x000CE, 0x000EE}, {0x000CF, 0x000EF},
    {0x000D0, 0x000F0}, {0x000D1, 0x000F1}, {0x000D2, 0x000F2}, {0x000D3, 0x000F3}, {0x000D4, 0x000F4}, {0x000D5, 0x000F5},
    {0x000D6, 0x000F6}, {0x000D8, 0x000F8}, {0x000D9, 0x000F9}, {0x000DA, 0x000FA}, {0x000DB, 0x000FB}, {0x000DC, 0x000FC},
    {0x000DD, 0x000FD}, {0x000DE, 0x000FE}, {0x00100, 0x00101}, {0x00102, 0x00103}, {0x00104, 0x00105}, {0x00106, 0x00107},
    {0x00108, 0x00109}, {0x0010A, 0x0010B}, {0x0010C, 0x0010D}, {0x0010E, 0x0010F}, {0x00110, 0x00111}, {0x00112, 0x00113},
    {0x00114, 0x00115}, {0x00116, 0x00117}, {0x00118, 0x00119}, {0x0011A, 0x0011B}, {0x0011C, 0x0011D}, {0x0011E, 0x0011F},
    {0x00120, 0x00121}, {0x00122, 0x00123}, {0x00124, 0x00125}, {0x00126, 0x00127}, {0x00128, 0x00129}, {0x0012A, 0x0012B},
    {0x0012C, 0x0012D}, {0x0012E, 0x0012F}, {0x00130, 0x00069}, {0x00132, 0x00133}, {0x00134, 0x00135}, {0x00136, 0x00137},
    {0x00139, 0x0013A}, {0x0013B, 0x0013C}, {0x0013D, 0x0013E}, {0x0013F, 0x00140}, {0x00141, 0x00142}, {0x00143, 0x00144},
    {0x00145, 0x00146}, {0x00147, 0x00148}, {0x0014A, 0x0014B}, {0x0014C, 0x0014D}, {0x0014E, 0x0014F}, {0x00150, 0x00151},
    {0x00152, 0x00153}, {0x00154, 0x00155}, {0x00156, 0x00157}, {0x00158, 0x00159}, {0x0015A, 0x0015B}, {0x0015C, 0x0015D},
    {0x0015E, 0x0015F}, {0x00160, 0x00161}, {0x00162, 0x00163}, {0x00164, 0x00165}, {0x00166, 0x00167}, {0x00168, 0x00169},
    {0x0016A, 0x0016B}, {0x0016C, 0x0016D}, {0x0016E, 0x0016F}, {0x00170, 0x00171}, {0x00172, 0x00173}, {0x00174, 0x00175},
    {0x00176, 0x00177}, {0x00178, 0x000FF}, {0x00179, 0x0017A}, {0x0017B, 0x0017C}, {0x0017D, 0x0017E}, {0x00181, 0x00253},
    {0x00182, 0x00183}, {0x00184, 0x00185}, {0x00186, 0x00254}, {0x00187, 0x00188}, {0x00189, 0x00256}, {0x0018A, 0x00257},
    {0x0018B, 0x0018C}, {0x0018E, 0x001DD}, {0x0018F, 0x00259}, {0x00190, 0x0025B}, {0x00191, 0x00192}, {0x00193, 0x00260},
    {0x00194, 0x00263}, {0x00196, 0x00269}, {0x00197, 0x00268}, {0x00198, 0x00199}, {0x0019C, 0x0026F}, {0x0019D, 0x00272},
    {0x0019F, 0x00275}, {0x001A0, 0x001A1}, {0x001A2, 0x001A3}, {0x001A4, 0x001A5}, {0x001A6, 0x00280}, {0x001A7, 0x001A8},
    {0x001A9, 0x00283}, {0x001AC, 0x001AD}, {0x001AE, 0x00288}, {0x001AF, 0x001B0}, {0x001B1, 0x0028A}, {0x001B2, 0x0028B},
    {0x001B3, 0x001B4}, {0x001B5, 0x001B6}, {0x001B7, 0x00292}, {0x001B8, 0x001B9}, {0x001BC, 0x001BD}, {0x001C4, 0x001C6},
    {0x001C5, 0x001C6}, {0x001C7, 0x001C9}, {0x001C8, 0x001C9}, {0x001CA, 0x001CC}, {0x001CB, 0x001CC}, {0x001CD, 0x001CE},
    {0x001CF, 0x001D0}, {0x001D1, 0x001D2}, {0x001D3, 0x001D4}, {0x001D5, 0x001D6}, {0x001D7, 0x001D8}, {0x001D9, 0x001DA},
    {0x001DB, 0x001DC}, {0x001DE, 0x001DF}, {0x001E0, 0x001E1}, {0x001E2, 0x001E3}, {0x001E4, 0x001E5}, {0x001E6, 0x001E7},
    {0x001E8, 0x001E9}, {0x001EA, 0x001EB}, {0x001EC, 0x001ED}, {0x001EE, 0x001EF}, {0x001F1, 0x001F3}, {0x001F2, 0x001F3},
    {0x001F4, 0x001F5}, {0x001F6, 0x00195}, {0x001F7, 0x001BF}, {0x001F8, 0x001F9}, {0x001FA, 0x001FB}, {0x001FC, 0x001FD},
    {0x001FE, 0x001FF}, {0x00200, 0x00201}, {0x00202, 0x00203}, {0x00204, 0x00205}, {0x00206, 0x00207}, {0x00208, 0x00209},
    {0x0020A, 0x0020B}, {0x0020C, 0x0020D}, {0x0020E, 0x0020F}, {0x00210, 0x00211}, {0x00212, 0x00213}, {0x00214, 0x00215},
    {0x00216, 0x00217}, {0x00218, 0x00219}, {0x0021A, 0x0021B}, {0x0021C, 0x0021D}, {0x0021E, 0x0021F}, {0x00220, 0x0019E},
    {0x00222, 0x00223}, {0x00224, 0x00225}, {0x00226, 0x00227}, {0x00228, 0x00229}, {0x0022A, 0x0022B}, {0x0022C, 0x0022D},
    {0x0022E, 0x0022F}, {0x00230, 0x00231}, {0x00232, 0x00233}, {0x0023A, 0x02C65}, {0x0023B, 0x0023C}, {0x0023D, 0x0019A},
    {0x0023E, 0x02C66}, {0x00241, 0x00242}, {0x00243, 0x00180}, {0x00244, 0x00289}, {0x00245, 0x0028C}, {0x00246, 0x00247},
    {0x00248, 0x00249}, {0x0024A, 0x0024B}, {0x0024C, 0x0024D}, {0x0024E, 0x0024F}, {0x00370, 0x00371}, {0x00372, 0x00373},
    {0x00376, 0x00377}, {0x0037F, 0x003F3}, {0x00386, 0x003AC}, {0x00388, 0x003AD}, {0x00389, 0x003AE}, {0x0038A, 0x003AF},
    {0x0038C, 0x003CC}, {0x0038E, 0x003CD}, {0x0038F, 0x003CE}, {0x00391, 0x003B1}, {0x00392, 0x003B2}, {0x00393, 0x003B3},
    {0x00394, 0x003B4}, {0x00395, 0x003B5}, {0x00396, 0x003B6}, {0x00397, 0x003B7}, {0x00398, 0x003B8}, {0x00399, 0x003B9},
    {0x0039A, 0x003BA}, {0x0039B, 0x003BB}, {0x0039C, 0x003BC}, {0x0039D, 0x003BD}, {0x0039E, 0x003BE}, {0x0039F, 0x003BF},
    {0x003A0, 0x003C0}, {0x003A1, 0x003C1}, {0x003A3, 0x003C3}, {0x003A4, 0x003C4}, {0x003A5, 0x003C5}, {0x003A6, 0x003C6},
    {0x003A7, 0x003C7}, {0x003A8, 0x003C8}, {0x003A9, 0x003C9}, {0x003AA, 0x003CA}, {0x003AB, 0x003CB}, {0x003CF, 0x003D7},
    {0x003D8, 0x003D9}, {0x003DA, 0x003DB}, {0x003DC, 0x003DD}, {0x003DE, 0x003DF}, {0x003E0, 0x003E1}, {0x003E2, 0x003E3},
    {0x003E4, 0x003E5}, {0x003E6, 0x003E7}, {0x003E8, 0x003E9}, {0x003EA, 0x003EB}, {0x003EC, 0x003ED}, {0x003EE, 0x003EF},
    {0x003F4, 0x003B8}, {0x003F7, 0x003F8}, {0x003F9, 0x003F2}, {0x003FA, 0x003FB}, {0x003FD, 0x0037B}, {0x003FE, 0x0037C},
    {0x003FF, 0x0037D}, {0x00400, 0x00450}, {0x00401, 0x00451}, {0x00402, 0x00452}, {0x00403, 0x00453}, {0x00404, 0x00454},
    {0x00405, 0x00455}, {0x00406, 0x00456}, {0x00407, 0x00457}, {0x00408, 0x00458}, {0x00409, 0x00459}, {0x0040A, 0x0045A},
    {0x0040B, 0x0045B}, {0x0040C, 0x0045C}, {0x0040D, 0x0045D}, {0x0040E, 0x0045E}, {0x0040F, 0x0045F}, {0x00410, 0x00430},
    {0x00411, 0x00431}, {0x00412, 0x00432}, {0x00413, 0x00433}, {0x00414, 0x00434}, {0x00415, 0x00435}, {0x00416, 0x00436},
    {0x00417, 0x00437}, {0x00418, 0x00438}, {0x00419, 0x00439}, {0x0041A, 0x0043A}, {0x0041B, 0x0043B}, {0x0041C, 0x0043C},
    {0x0041D, 0x0043D}, {0x0041E, 0x0043E}, {0x0041F, 0x0043F}, {0x00420, 0x00440}, {0x00421, 0x00441}, {0x00422, 0x00442},
    {0x00423, 0x00443}, {0x00424, 0x00444}, {0x00425, 0x00445}, {0x00426, 0x00446}, {0x00427, 0x00447}, {0x00428, 0x00448},
    {0x00429, 0x00449}, {0x0042A, 0x0044A}, {0x0042B, 0x0044B}, {0x0042C, 0x0044C}, {0x0042D, 0x0044D}, {0x0042E, 0x0044E},
    {0x0042F, 0x0044F}, {0x00460, 0x00461}, {0x00462, 0x00463}, {0x00464, 0x00465}, {0x00466, 0x00467}, {0x00468, 0x00469},
    {0x0046A, 0x0046B}, {0x0046C, 0x0046D}, {0x0046E, 0x0046F}, {0x00470, 0x00471}, {0x00472, 0x00473}, {0x00474, 0x00475},
    {0x00476, 0x00477}, {0x00478, 0x00479}, {0x0047A, 0x0047B}, {0x0047C, 0x0047D}, {0x0047E, 0x0047F}, {0x00480, 0x00481},
    {0x0048A, 0x0048B}, {0x0048C, 0x0048D}, {0x0048E, 0x0048F}, {0x00490, 0x00491}, {0x00492, 0x00493}, {0x00494, 0x00495},
    {0x00496, 0x00497}, {0x00498, 0x00499}, {0x0049A, 0x0049B}, {0x0049C, 0x0049D}, {0x0049E, 0x0049F}, {0x004A0, 0x004A1},
    {0x004A2, 0x004A3}, {0x004A4, 0x004A5}, {0x004A6, 0x004A7}, {0x004A8, 0x004A9}, {0x004AA, 0x004AB}, {0x004AC, 0x004AD},
    {0x004AE, 0x004AF}, {0x004B0, 0x004B1}, {0x004B2, 0x004B3}, {0x004B4, 0x004B5}, {0x004B6, 0x004B7}, {0x004B8, 0x004B9},
    {0x004BA, 0x004BB}, {0x004BC, 0x004BD}, {0x004BE, 0x004BF}, {0x004C0, 0x004CF}, {0x004C1, 0x004C2}, {0x004C3, 0x004C4},
    {0x004C5, 0x004C6}, {0x004C7, 0x004C8}, {0x004C9, 0x004CA}, {0x004CB, 0x004CC}, {0x004CD, 0x004CE}, {0x004D0, 0x004D1},
    {0x004D2, 0x004D3}, {0x004D4, 0x004D5}, {0x004D6, 0x004D7}, {0x004D8, 0x004D9}, {0x004DA, 0x004DB}, {0x004DC, 0x004DD},
    {0x004DE, 0x004DF}, {0x004E0, 0x004E1}, {0x004E2, 0x004E3}, {0x004E4, 0x004E5}, {0x004E6, 0x004E7}, {0x004E8, 0x004E9},
    {0x004EA, 0x004EB}, {0x004EC, 0x004ED}, {0x004EE, 0x004EF}, {0x004F0, 0x004F1}, {0x004F2, 0x004F3}, {0x004F4, 0x004F5},
    {0x004F6, 0x004F7}, {0x004F8, 0x004F9}, {0x004FA, 0x004FB}, {0x004FC, 0x004FD}, {0x004FE, 0x004FF}, {0x00500, 0x00501},
    {0x00502, 0x00503}, {0x00504, 0x00505}, {0x00506, 0x00507}, {0x00508, 0x00509}, {0x0050A, 0x0050B}, {0x0050C, 0x0050D},
    {0x0050E, 0x0050F}, {0x00510, 0x00511}, {0x00512, 0x00513}, {0x00514, 0x00515}, {0x00516, 0x00517}, {0x00518, 0x00519},
    {0x0051A, 0x0051B}, {0x0051C, 0x0051D}, {0x0051E, 0x0051F}, {0x00520, 0x00521}, {0x00522, 0x00523}, {0x00524, 0x00525},
    {0x00526, 0x00527}, {0x00528, 0x00529}, {0x0052A, 0x0052B}, {0x0052C, 0x0052D}, {0x0052E, 0x0052F}, {0x00531, 0x00561},
    {0x00532, 0x00562}, {0x00533, 0x00563}, {0x00534, 0x00564}, {0x00535, 0x00565}, {0x00536, 0x00566}, {0x00537, 0x00567},
    {0x00538, 0x00568}, {0x00539, 0x00569}, {0x0053A, 0x0056A}, {0x0053B, 0x0056B}, {0x0053C, 0x0056C}, {0x0053D, 0x0056D},
    {0x0053E, 0x0056E}, {0x0053F, 0x0056F}, {0x00540, 0x00570}, {0x00541, 0x00571}, {0x00542, 0x00572}, {0x00543, 0x00573},
    {0x00544, 0x00574}, {0x00545, 0x00575}, {0x00546, 0x00576}, {0x00547, 0x00577}, {0x00548, 0x00578}, {0x00549, 0x00579},
    {0x0054A, 0x0057A}, {0x0054B, 0x0057B}, {0x0054C, 0x0057C}, {0x0054D, 0x0057D}, {0x0054E, 0x0057E}, {0x0054F, 0x0057F},
    {0x00550, 0x00580}, {0x00551, 0x00581}, {0x00552, 0x00582}, {0x00553, 0x00583}, {0x00554, 0x00584}, {0x00555, 0x00585},
    {0x00556, 0x00586}, {0x010A0, 0x02D00}, {0x010A1, 0x02D01}, {0x010A2, 0x02D02}, {0x010A3, 0x02D03}, {0x010A4, 0x02D04},
    {0x010A5, 0x02D05}, {0x010A6, 0x02D06}, {0x010A7, 0x02D07}, {0x010A8, 0x02D08}, {0x010A9, 0x02D09}, {0x010AA, 0x02D0A},
    {0x010AB, 0x02D0B}, {0x010AC, 0x02D0C}, {0x010AD, 0x02D0D}, {0x010AE, 0x02D0E}, {0x010AF, 0x02D0F}, {0x010B0, 0x02D10},
    {0x010B1, 0x02D11}, {0x010B2, 0x02D12}, {0x010B3, 0x02D13}, {0x010B4, 0x02D14}, {0x010B5, 0x02D15}, {0x010B6, 0x02D16},
    {0x010B7, 0x02D17}, {0x010B8, 0x02D18}, {0x010B9, 0x02D19}, {0x010BA, 0x02D1A}, {0x010BB, 0x02D1B}, {0x010BC, 0x02D1C},
    {0x010BD, 0x02D1D}, {0x010BE, 0x02D1E}, {0x010BF, 0x02D1F}, {0x010C0, 0x02D20}, {0x010C1, 0x02D21}, {0x010C2, 0x02D22},
    {0x010C3, 0x02D23}, {0x010C4, 0x02D24}, {0x010C5, 0x02D25}, {0x010C7, 0x02D27}, {0x010CD, 0x02D2D}, {0x013A0, 0x0AB70},
    {0x013A1, 0x0AB71}, {0x013A2, 0x0AB72}, {0x013A3, 0x0AB73}, {0x013A4, 0x0AB74}, {0x013A5, 0x0AB75}, {0x013A6, 0x0AB76},
    {0x013A7, 0x0AB77}, {0x013A8, 0x0AB78}, {0x013A9, 0x0AB79}, {0x013AA, 0x0AB7A}, {0x013AB, 0x0AB7B}, {0x013AC, 0x0AB7C},
    {0x013AD, 0x0AB7D}, {0x013AE, 0x0AB7E}, {0x013AF, 0x0AB7F}, {0x013B0, 0x0AB80}, {0x013B1, 0x0AB81}, {0x013B2, 0x0AB82},
    {0x013B3, 0x0AB83}, {0x013B4, 0x0AB84}, {0x013B5, 0x0AB85}, {0x013B6, 0x0AB86}, {0x013B7, 0x0AB87}, {0x013B8, 0x0AB88},
    {0x013B9, 0x0AB89}, {0x013BA, 0x0AB8A}, {0x013BB, 0x0AB8B}, {0x013BC, 0x0AB8C}, {0x013BD, 0x0AB8D}, {0x013BE, 0x0AB8E},
    {0x013BF, 0x0AB8F}, {0x013C0, 0x0AB90}, {0x013C1, 0x0AB91}, {0x013C2, 0x0AB92}, {0x013C3, 0x0AB93}, {0x013C4, 0x0AB94},
    {0x013C5, 0x0AB95}, {0x013C6, 0x0AB96}, {0x013C7, 0x0AB97}, {0x013C8, 0x0AB98}, {0x013C9, 0x0AB99}, {0x013CA, 0x0AB9A},
    {0x013CB, 0x0AB9B}, {0x013CC, 0x0AB9C}, {0x013CD, 0x0AB9D}, {0x013CE, 0x0AB9E}, {0x013CF, 0x0AB9F}, {0x013D0, 0x0ABA0},
    {0x013D1, 0x0ABA1}, {0x013D2, 0x0ABA2}, {0x013D3, 0x0ABA3}, {0x013D4, 0x0ABA4}, {0x013D5, 0x0ABA5}, {0x013D6, 0x0ABA6},
    {0x013D7, 0x0ABA7}, {0x013D8, 0x0ABA8}, {0x013D9, 0x0ABA9}, {0x013DA, 0x0ABAA}, {0x013DB, 0x0ABAB}, {0x013DC, 0x0ABAC},
    {0x013DD, 0x0ABAD}, {0x013DE, 0x0ABAE}, {0x013DF, 0x0ABAF}, {0x013E0, 0x0ABB0}, {0x013E1, 0x0ABB1}, {0x013E2, 0x0ABB2},
    {0x013E3, 0x0ABB3}, {0x013E4, 0x0ABB4}, {0x013E5, 0x0ABB5}, {0x013E6, 0x0ABB6}, {0x013E7, 0x0ABB7}, {0x013E8, 0x0ABB8},
    {0x013E9, 0x0ABB9}, {0x013EA, 0x0ABBA}, {0x013EB, 0x0ABBB}, {0x013EC, 0x0ABBC}, {0x013ED, 0x0ABBD}, {0x013EE, 0x0ABBE},
    {0x013EF, 0x0ABBF}, {0x013F0, 0x013F8}, {0x013F1, 0x013F9}, {0x013F2, 0x013FA}, {0x013F3, 0x013FB}, {0x013F4, 0x013FC},
    {0x013F5, 0x013FD}, {0x01C90, 0x010D0}, {0x01C91, 0x010D1}, {0x01C92, 0x010D2}, {0x01C93, 0x010D3}, {0x01C94, 0x010D4},
    {0x01C95, 0x010D5}, {0x01C96, 0x010D6}, {0x01C97, 0x010D7}, {0x01C98, 0x010D8}, {0x01C99, 0x010D9}, {0x01C9A, 0x010DA},
    {0x01C9B, 0x010DB}, {0x01C9C, 0x010DC}, {0x01C9D, 0x010DD}, {0x01C9E, 0x010DE}, {0x01C9F, 0x010DF}, {0x01CA0, 0x010E0},
    {0x01CA1, 0x010E1}, {0x01CA2, 0x010E2}, {0x01CA3, 0x010E3}, {0x01CA4, 0x010E4}, {0x01CA5, 0x010E5}, {0x01CA6, 0x010E6},
    {0x01CA7, 0x010E7}, {0x01CA8, 0x010E8}, {0x01CA9, 0x010E9}, {0x01CAA, 0x010EA}, {0x01CAB, 0x010EB}, {0x01CAC, 0x010EC},
    {0x01CAD, 0x010ED}, {0x01CAE, 0x010EE}, {0x01CAF, 0x010EF}, {0x01CB0, 0x010F0}, {0x01CB1, 0x010F1}, {0x01CB2, 0x010F2},
    {0x01CB3, 0x010F3}, {0x01CB4, 0x010F4}, {0x01CB5, 0x010F5}, {0x01CB6, 0x010F6}, {0x01CB7, 0x010F7}, {0x01CB8, 0x010F8},
    {0x01CB9, 0x010F9}, {0x01CBA, 0x010FA}, {0x01CBD, 0x010FD}, {0x01CBE, 0x010FE}, {0x01CBF, 0x010FF}, {0x01E00, 0x01E01},
    {0x01E02, 0x01E03}, {0x01E04, 0x01E05}, {0x01E06, 0x01E07}, {0x01E08, 0x01E09}, {0x01E0A, 0x01E0B}, {0x01E0C, 0x01E0D},
    {0x01E0E, 0x01E0F}, {0x01E10, 0x01E11}, {0x01E12, 0x01E13}, {0x01E14, 0x01E15}, {0x01E16, 0x01E17}, {0x01E18, 0x01E19},
    {0x01E1A, 0x01E1B}, {0x01E1C, 0x01E1D}, {0x01E1E, 0x01E1F}, {0x01E20, 0x01E21}, {0x01E22, 0x01E23}, {0x01E24, 0x01E25},
    {0x01E26, 0x01E27}, {0x01E28, 0x01E29}, {0x01E2A, 0x01E2B}, {0x01E2C, 0x01E2D}, {0x01E2E, 0x01E2F}, {0x01E30, 0x01E31},
    {0x01E32, 0x01E33}, {0x01E34, 0x01E35}, {0x01E36, 0x01E37}, {0x01E38, 0x01E39}, {0x01E3A, 0x01E3B}, {0x01E3C, 0x01E3D},
    {0x01E3E, 0x01E3F}, {0x01E40, 0x01E41}, {0x01E42, 0x01E43}, {0x01E44, 0x01E45}, {0x01E46, 0x01E47}, {0x01E48, 0x01E49},
    {0x01E4A, 0x01E4B}, {0x01E4C, 0x01E4D}, {0x01E4E, 0x01E4F}, {0x01E50, 0x01E51}, {0x01E52, 0x01E53}, {0x01E54, 0x01E55},
    {0x01E56, 0x01E57}, {0x01E58, 0x01E59}, {0x01E5A, 0x01E5B}, {0x01E5C, 0x01E5D}, {0x01E5E, 0x01E5F}, {0x01E60, 0x01E61},
    {0x01E62, 0x01E63}, {0x01E64, 0x01E65}, {0x01E66, 0x01E67}, {0x01E68, 0x01E69}, {0x01E6A, 0x01E6B}, {0x01E6C, 0x01E6D},
    {0x01E6E, 0x01E6F}, {0x01E70, 0x01E71}, {0x01E72, 0x01E73}, {0x01E74, 0x01E75}, {0x01E76, 0x01E77}, {0x01E78, 0x01E79},
    {0x01E7A, 0x01E7B}, {0x01E7C, 0x01E7D}, {0x01E7E, 0x01E7F}, {0x01E80, 0x01E81}, {0x01E82, 0x01E83}, {0x01E84, 0x01E85},
    {0x01E86, 0x01E87}, {0x01E88, 0x01E89}, {0x01E8A, 0x01E8B}, {0x01E8C, 0x01E8D}, {0x01E8E, 0x01E8F}, {0x01E90, 0x01E91},
    {0x01E92, 0x01E93}, {0x01E94, 0x01E95}, {0x01E9E, 0x000DF}, {0x01EA0, 0x01EA1}, {0x01EA2, 0x01EA3}, {0x01EA4, 0x01EA5},
    {0x01EA6, 0x01EA7}, {0x01EA8, 0x01EA9}, {0x01EAA, 0x01EAB}, {0x01EAC, 0x01EAD}, {0x01EAE, 0x01EAF}, {0x01EB0, 0x01EB1},
    {0x01EB2, 0x01EB3}, {0x01EB4, 0x01EB5}, {0x01EB6, 0x01EB7}, {0x01EB8, 0x01EB9}, {0x01EBA, 0x01EBB}, {0x01EBC, 0x01EBD},
    {0x01EBE, 0x01EBF}, {0x01EC0, 0x01EC1}, {0x01EC2, 0x01EC3}, {0x01EC4, 0x01EC5}, {0x01EC6, 0x01EC7}, {0x01EC8, 0x01EC9},
    {0x01ECA, 0x01ECB}, {0x01ECC, 0x01ECD}, {0x01ECE, 0x01ECF}, {0x01ED0, 0x01ED1}, {0x01ED2, 0x01ED3}, {0x01ED4, 0x01ED5},
    {0x01ED6, 0x01ED7}, {0x01ED8, 0x01ED9}, {0x01EDA, 0x01EDB}, {0x01EDC, 0x01EDD}, {0x01EDE, 0x01EDF}, {0x01EE0, 0x01EE1},
    {0x01EE2, 0x01EE3}, {0x01EE4, 0x01EE5}, {0x01EE6, 0x01EE7}, {0x01EE8, 0x01EE9}, {0x01EEA, 0x01EEB}, {0x01EEC, 0x01EED},
    {0x01EEE, 0x01EEF}, {0x01EF0, 0x01EF1}, {0x01EF2, 0x01EF3}, {0x01EF4, 0x01EF5}, {0x01EF6, 0x01EF7}, {0x01EF8, 0x01EF9},
    {0x01EFA, 0x01EFB}, {0x01EFC, 0x01EFD}, {0x01EFE, 0x01EFF}, {0x01F08, 0x01F00}, {0x01F09, 0x01F01}, {0x01F0A, 0x01F02},
    {0x01F0B, 0x01F03}, {0x01F0C, 0x01F04}, {0x01F0D, 0x01F05}, {0x01F0E, 0x01F06}, {0x01F0F, 0x01F07}, {0x01F18, 0x01F10},
    {0x01F19, 0x01F11}, {0x01F1A, 0x01F12}, {0x01F1B, 0x01F13}, {0x01F1C, 0x01F14}, {0x01F1D, 0x01F15}, {0x01F28, 0x01F20},
    {0x01F29, 0x01F21}, {0x01F2A, 0x01F22}, {0x01F2B, 0x01F23}, {0x01F2C, 0x01F24}, {0x01F2D, 0x01F25}, {0x01F2E, 0x01F26},
    {0x01F2F, 0x01F27}, {0x01F38, 0x01F30}, {0x01F39, 0x01F31}, {0x01F3A, 0x01F32}, {0x01F3B, 0x01F33}, {0x01F3C, 0x01F34},
    {0x01F3D, 0x01F35}, {0x01F3E, 0x01F36}, {0x01F3F, 0x01F37}, {0x01F48, 0x01F40}, {0x01F49, 0x01F41}, {0x01F4A, 0x01F42},
    {0x01F4B, 0x01F43}, {0x01F4C, 0x01F44}, {0x01F4D, 0x01F45}, {0x01F59, 0x01F51}, {0x01F5B, 0x01F53}, {0x01F5D, 0x01F55},
    {0x01F5F, 0x01F57}, {0x01F68, 0x01F60}, {0x01F69, 0x01F61}, {0x01F6A, 0x01F62}, {0x01F6B, 0x01F63}, {0x01F6C, 0x01F64},
    {0x01F6D, 0x01F65}, {0x01F6E, 0x01F66}, {0x01F6F, 0x01F67}, {0x01F88, 0x01F80}, {0x01F89, 0x01F81}, {0x01F8A, 0x01F82},
    {0x01F8B, 0x01F83}, {0x01F8C, 0x01F84}, {0x01F8D, 0x01F85}, {0x01F8E, 0x01F86}, {0x01F8F, 0x01F87}, {0x01F98, 0x01F90},
    {0x01F99, 0x01F91}, {0x01F9A, 0x01F92}, {0x01F9B, 0x01F93}, {0x01F9C, 0x01F94}, {0x01F9D, 0x01F95}, {0x01F9E, 0x01F96},
    {0x01F9F, 0x01F97}, {0x01FA8, 0x01FA0}, {0x01FA9, 0x01FA1}, {0x01FAA, 0x01FA2}, {0x01FAB, 0x01FA3}, {0x01FAC, 0x01FA4},
    {0x01FAD, 0x01FA5}, {0x01FAE, 0x01FA6}, {0x01FAF, 0x01FA7}, {0x01FB8, 0x01FB0}, {0x01FB9, 0x01FB1}, {0x01FBA, 0x01F70},
    {0x01FBB, 0x01F71}, {0x01FBC, 0x01FB3}, {0x01FC8, 0x01F72}, {0x01FC9, 0x01F73}, {0x01FCA, 0x01F74}, {0x01FCB, 0x01F75},
    {0x01FCC, 0x01FC3}, {0x01FD8, 0x01FD0}, {0x01FD9, 0x01FD1}, {0x01FDA, 0x01F76}, {0x01FDB, 0x01F77}, {0x01FE8, 0x01FE0},
    {0x01FE9, 0x01FE1}, {0x01FEA, 0x01F7A}, {0x01FEB, 0x01F7B}, {0x01FEC, 0x01FE5}, {0x01FF8, 0x01F78}, {0x01FF9, 0x01F79},
    {0x01FFA, 0x01F7C}, {0x01FFB, 0x01F7D}, {0x01FFC, 0x01FF3}, {0x02126, 0x003C9}, {0x0212A, 0x0006B}, {0x0212B, 0x000E5},
    {0x02132, 0x0214E}, {0x02160, 0x02170}, {0x02161, 0x02171}, {0x02162, 0x02172}, {0x02163, 0x02173}, {0x02164, 0x02174},
    {0x02165, 0x02175}, {0x02166, 0x02176}, {0x02167, 0x02177}, {0x02168, 0x02178}, {0x02169, 0x02179}, {0x0216A, 0x0217A},
    {0x0216B, 0x0217B}, {0x0216C, 0x0217C}, {0x0216D, 0x0217D}, {0x0216E, 0x0217E}, {0x0216F, 0x0217F}, {0x02183, 0x02184},
    {0x024B6, 0x024D0}, {0x024B7, 0x024D1}, {0x024B8, 0x024D2}, {0x024B9, 0x024D3}, {0x024BA, 0x024D4}, {0x024BB, 0x024D5},
    {0x024BC, 0x024D6}, {0x024BD, 0x024D7}, {0x024BE, 0x024D8}, {0x024BF, 0x024D9}, {0x024C0, 0x024DA}, {0x024C1, 0x024DB},
    {0x024C2, 0x024DC}, {0x024C3, 0x024DD}, {0x024C4, 0x024DE}, {0x024C5, 0x024DF}, {0x024C6, 0x024E0}, {0x024C7, 0x024E1},
    {0x024C8, 0x024E2}, {0x024C9, 0x024E3}, {0x024CA, 0x024E4}, {0x024CB, 0x024E5}, {0x024CC, 0x024E6}, {0x024CD, 0x024E7},
    {0x024CE, 0x024E8}, {0x024CF, 0x024E9}, {0x02C00, 0x02C30}, {0x02C01, 0x02C31}, {0x02C02, 0x02C32}, {0x02C03, 0x02C33},
    {0x02C04, 0x02C34}, {0x02C05, 0x02C35}, {0x02C06, 0x02C36}, {0x02C07, 0x02C37}, {0x02C08, 0x02C38}, {0x02C09, 0x02C39},
    {0x02C0A, 0x02C3A}, {0x02C0B, 0x02C3B}, {0x02C0C, 0x02C3C}, {0x02C0D, 0x02C3D}, {0x02C0E, 0x02C3E}, {0x02C0F, 0x02C3F},
    {0x02C10, 0x02C40}, {0x02C11, 0x02C41}, {0x02C12, 0x02C42}, {0x02C13, 0x02C43}, {0x02C14, 0x02C44}, {0x02C15, 0x02C45},
    {0x02C16, 0x02C46}, {0x02C17, 0x02C47}, {0x02C18, 0x02C48}, {0x02C19, 0x02C49}, {0x02C1A, 0x02C4A}, {0x02C1B, 0x02C4B},
    {0x02C1C, 0x02C4C}, {0x02C1D, 0x02C4D}, {0x02C1E, 0x02C4E}, {0x02C1F, 0x02C4F}, {0x02C20, 0x02C50}, {0x02C21, 0x02C51},
    {0x02C22, 0x02C52}, {0x02C23, 0x02C53}, {0x02C24, 0x02C54}, {0x02C25, 0x02C55}, {0x02C26, 0x02C56}, {0x02C27, 0x02C57},
    {0x02C28, 0x02C58}, {0x02C29, 0x02C59}, {0x02C2A, 0x02C5A}, {0x02C2B, 0x02C5B}, {0x02C2C, 0x02C5C}, {0x02C2D, 0x02C5D},
    {0x02C2E, 0x02C5E}, {0x02C2F, 0x02C5F}, {0x02C60, 0x02C61}, {0x02C62, 0x0026B}, {0x02C63, 0x01D7D}, {0x02C64, 0x0027D},
    {0x02C67, 0x02C68}, {0x02C69, 0x02C6A}, {0x02C6B, 0x02C6C}, {0x02C6D, 0x00251}, {0x02C6E, 0x00271}, {0x02C6F, 0x00250},
    {0x02C70, 0x00252}, {0x02C72, 0x02C73}, {0x02C75, 0x02C76}, {0x02C7E, 0x0023F}, {0x02C7F, 0x00240}, {0x02C80, 0x02C81},
    {0x02C82, 0x02C83}, {0x02C84, 0x02C85}, {0x02C86, 0x02C87}, {0x02C88, 0x02C89}, {0x02C8A, 0x02C8B}, {0x02C8C, 0x02C8D},
    {0x02C8E, 0x02C8F}, {0x02C90, 0x02C91}, {0x02C92, 0x02C93}, {0x02C94, 0x02C95}, {0x02C96, 0x02C97}, {0x02C98, 0x02C99},
    {0x02C9A, 0x02C9B}, {0x02C9C, 0x02C9D}, {0x02C9E, 0x02C9F}, {0x02CA0, 0x02CA1}, {0x02CA2, 0x02CA3}, {0x02CA4, 0x02CA5},
    {0x02CA6, 0x02CA7}, {0x02CA8, 0x02CA9}, {0x02CAA, 0x02CAB}, {0x02CAC, 0x02CAD}, {0x02CAE, 0x02CAF}, {0x02CB0, 0x02CB1},
    {0x02CB2, 0x02CB3}, {0x02CB4, 0x02CB5}, {0x02CB6, 0x02CB7}, {0x02CB8, 0x02CB9}, {0x02CBA, 0x02CBB}, {0x02CBC, 0x02CBD},
    {0x02CBE, 0x02CBF}, {0x02CC0, 0x02CC1}, {0x02CC2, 0x02CC3}, {0x02CC4, 0x02CC5}, {0x02CC6, 0x02CC7}, {0x02CC8, 0x02CC9},
    {0x02CCA, 0x02CCB}, {0x02CCC, 0x02CCD}, {0x02CCE, 0x02CCF}, {0x02CD0, 0x02CD1}, {0x02CD2, 0x02CD3}, {0x02CD4, 0x02CD5},
    {0x02CD6, 0x02CD7}, {0x02CD8, 0x02CD9}, {0x02CDA, 0x02CDB}, {0x02CDC, 0x02CDD}, {0x02CDE, 0x02CDF}, {0x02CE0, 0x02CE1},
    {0x02CE2, 0x02CE3}, {0x02CEB, 0x02CEC}, {0x02CED, 0x02CEE}, {0x02CF2, 0x02CF3}, {0x0A640, 0x0A641}, {0x0A642, 0x0A643},
    {0x0A644, 0x0A645}, {0x0A646, 0x0A647}, {0x0A648, 0x0A649}, {0x0A64A, 0x0A64B}, {0x0A64C, 0x0A64D}, {0x0A64E, 0x0A64F},
    {0x0A650, 0x0A651}, {0x0A652, 0x0A653}, {0x0A654, 0x0A655}, {0x0A656, 0x0A657}, {0x0A658, 0x0A659}, {0x0A65A, 0x0A65B},
    {0x0A65C, 0x0A65D}, {0x0A65E, 0x0A65F}, {0x0A660, 0x0A661}, {0x0A662, 0x0A663}, {0x0A664, 0x0A665}, {0x0A666, 0x0A667},
    {0x0A668, 0x0A669}, {0x0A66A, 0x0A66B}, {0x0A66C, 0x0A66D}, {0x0A680, 0x0A681}, {0x0A682, 0x0A683}, {0x0A684, 0x0A685},
    {0x0A686, 0x0A687}, {0x0A688, 0x0A689}, {0x0A68A, 0x0A68B}, {0x0A68C, 0x0A68D}, {0x0A68E, 0x0A68F}, {0x0A690, 0x0A691},
    {0x0A692, 0x0A693}, {0x0A694, 0x0A695}, {0x0A696, 0x0A697}, {0x0A698, 0x0A699}, {0x0A69A, 0x0A69B}, {0x0A722, 0x0A723},
    {0x0A724, 0x0A725}, {0x0A726, 0x0A727}, {0x0A728, 0x0A729}, {0x0A72A, 0x0A72B}, {0x0A72C, 0x0A72D}, {0x0A72E, 0x0A72F},
    {0x0A732, 0x0A733}, {0x0A734, 0x0A735}, {0x0A736, 0x0A737}, {0x0A738, 0x0A739}, {0x0A73A, 0x0A73B}, {0x0A73C, 0x0A73D},
    {0x0A73E, 0x0A73F}, {0x0A740, 0x0A741}, {0x0A742, 0x0A743}, {0x0A744, 0x0A745}, {0x0A746, 0x0A747}, {0x0A748, 0x0A749},
    {0x0A74A, 0x0A74B}, {0x0A74C, 0x0A74D}, {0x0A74E, 0x0A74F}, {0x0A750, 0x0A751}, {0x0A752, 0x0A753}, {0x0A754, 0x0A755},
    {0x0A756, 0x0A757}, {0x0A758, 0x0A759}, {0x0A75A, 0x0A75B}, {0x0A75C, 0x0A75D}, {0x0A75E, 0x0A75F}, {0x0A760, 0x0A761},
    {0x0A762, 0x0A763}, {0x0A764, 0x0A765}, {0x0A766, 0x0A767}, {0x0A768, 0x0A769}, {0x0A76A, 0x0A76B}, {0x0A76C, 0x0A76D},
    {0x0A76E, 0x0A76F}, {0x0A779, 0x0A77A}, {0x0A77B, 0x0A77C}, {0x0A77D, 0x01D79}, {0x0A77E, 0x0A77F}, {0x0A780, 0x0A781},
    {0x0A782, 0x0A783}, {0x0A784, 0x0A785}, {0x0A786, 0x0A787}, {0x0A78B, 0x0A78C}, {0x0A78D, 0x00265}, {0x0A790, 0x0A791},
    {0x0A792, 0x0A793}, {0x0A796, 0x0A797}, {0x0A798, 0x0A799}, {0x0A79A, 0x0A79B}, {0x0A79C, 0x0A79D}, {0x0A79E, 0x0A79F},
    {0x0A7A0, 0x0A7A1}, {0x0A7A2, 0x0A7A3}, {0x0A7A4, 0x0A7A5}, {0x0A7A6, 0x0A7A7}, {0x0A7A8, 0x0A7A9}, {0x0A7AA, 0x00266},
    {0x0A7AB, 0x0025C}, {0x0A7AC, 0x00261}, {0x0A7AD, 0x0026C}, {0x0A7AE, 0x0026A}, {0x0A7B0, 0x0029E}, {0x0A7B1, 0x00287},
    {0x0A7B2, 0x0029D}, {0x0A7B3, 0x0AB53}, {0x0A7B4, 0x0A7B5}, {0x0A7B6, 0x0A7B7}, {0x0A7B8, 0x0A7B9}, {0x0A7BA, 0x0A7BB},
    {0x0A7BC, 0x0A7BD}, {0x0A7BE, 0x0A7BF}, {0x0A7C0, 0x0A7C1}, {0x0A7C2, 0x0A7C3}, {0x0A7C4, 0x0A794}, {0x0A7C5, 0x00282},
    {0x0A7C6, 0x01D8E}, {0x0A7C7, 0x0A7C8}, {0x0A7C9, 0x0A7CA}, {0x0A7D0, 0x0A7D1}, {0x0A7D6, 0x0A7D7}, {0x0A7D8, 0x0A7D9},
    {0x0A7F5, 0x0A7F6}, {0x0FF21, 0x0FF41}, {0x0FF22, 0x0FF42}, {0x0FF23, 0x0FF43}, {0x0FF24, 0x0FF44}, {0x0FF25, 0x0FF45},
    {0x0FF26, 0x0FF46}, {0x0FF27, 0x0FF47}, {0x0FF28, 0x0FF48}, {0x0FF29, 0x0FF49}, {0x0FF2A, 0x0FF4A}, {0x0FF2B, 0x0FF4B},
    {0x0FF2C, 0x0FF4C}, {0x0FF2D, 0x0FF4D}, {0x0FF2E, 0x0FF4E}, {0x0FF2F, 0x0FF4F}, {0x0FF30, 0x0FF50}, {0x0FF31, 0x0FF51},
    {0x0FF32, 0x0FF52}, {0x0FF33, 0x0FF53}, {0x0FF34, 0x0FF54}, {0x0FF35, 0x0FF55}, {0x0FF36, 0x0FF56}, {0x0FF37, 0x0FF57},
    {0x0FF38, 0x0FF58}, {0x0FF39, 0x0FF59}, {0x0FF3A, 0x0FF5A}, {0x10400, 0x10428}, {0x10401, 0x10429}, {0x10402, 0x1042A},
    {0x10403, 0x1042B}, {0x10404, 0x1042C}, {0x10405, 0x1042D}, {0x10406, 0x1042E}, {0x10407, 0x1042F}, {0x10408, 0x10430},
    {0x10409, 0x10431}, {0x1040A, 0x10432}, {0x1040B, 0x10433}, {0x1040C, 0x10434}, {0x1040D, 0x10435}, {0x1040E, 0x10436},
    {0x1040F, 0x10437}, {0x10410, 0x10438}, {0x10411, 0x10439}, {0x10412, 0x1043A}, {0x10413, 0x1043B}, {0x10414, 0x1043C},
    {0x10415, 0x1043D}, {0x10416, 0x1043E}, {0x10417, 0x1043F}, {0x10418, 0x10440}, {0x10419, 0x10441}, {0x1041A, 0x10442},
    {0x1041B, 0x10443}, {0x1041C, 0x10444}, {0x1041D, 0x10445}, {0x1041E, 0x10446}, {0x1041F, 0x10447}, {0x10420, 0x10448},
    {0x10421, 0x10449}, {0x10422, 0x1044A}, {0x10423, 0x1044B}, {0x10424, 0x1044C}, {0x10425, 0x1044D}, {0x10426, 0x1044E},
    {0x10427, 0x1044F}, {0x104B0, 0x104D8}, {0x104B1, 0x104D9}, {0x104B2, 0x104DA}, {0x104B3, 0x104DB}, {0x104B4, 0x104DC},
    {0x104B5, 0x104DD}, {0x104B6, 0x104DE}, {0x104B7, 0x104DF}, {0x104B8, 0x104E0}, {0x104B9, 0x104E1}, {0x104BA, 0x104E2},
    {0x104BB, 0x104E3}, {0x104BC, 0x104E4}, {0x104BD, 0x104E5}, {0x104BE, 0x104E6}, {0x104BF, 0x104E7}, {0x104C0, 0x104E8},
    {0x104C1, 0x104E9}, {0x104C2, 0x104EA}, {0x104C3, 0x104EB}, {0x104C4, 0x104EC}, {0x104C5, 0x104ED}, {0x104C6, 0x104EE},
    {0x104C7, 0x104EF}, {0x104C8, 0x104F0}, {0x104C9, 0x104F1}, {0x104CA, 0x104F2}, {0x104CB, 0x104F3}, {0x104CC, 0x104F4},
    {0x104CD, 0x104F5}, {0x104CE, 0x104F6}, {0x104CF, 0x104F7}, {0x104D0, 0x104F8}, {0x104D1, 0x104F9}, {0x104D2, 0x104FA},
    {0x104D3, 0x104FB}, {0x10570, 0x10597}, {0x10571, 0x10598}, {0x10572, 0x10599}, {0x10573, 0x1059A}, {0x10574, 0x1059B},
    {0x10575, 0x1059C}, {0x10576, 0x1059D}, {0x10577, 0x1059E}, {0x10578, 0x1059F}, {0x10579, 0x105A0}, {0x1057A, 0x105A1},
    {0x1057C, 0x105A3}, {0x1057D, 0x105A4}, {0x1057E, 0x105A5}, {0x1057F, 0x105A6}, {0x10580, 0x105A7}, {0x10581, 0x105A8},
    {0x10582, 0x105A9}, {0x10583, 0x105AA}, {0x10584, 0x105AB}, {0x10585, 0x105AC}, {0x10586, 0x105AD}, {0x10587, 0x105AE},
    {0x10588, 0x105AF}, {0x10589, 0x105B0}, {0x1058A, 0x105B1}, {0x1058C, 0x105B3}, {0x1058D, 0x105B4}, {0x1058E, 0x105B5},
    {0x1058F, 0x105B6}, {0x10590, 0x105B7}, {0x10591, 0x105B8}, {0x10592, 0x105B9}, {0x10594, 0x105BB}, {0x10595, 0x105BC},
    {0x10C80, 0x10CC0}, {0x10C81, 0x10CC1}, {0x10C82, 0x10CC2}, {0x10C83, 0x10CC3}, {0x10C84, 0x10CC4}, {0x10C85, 0x10CC5},
    {0x10C86, 0x10CC6}, {0x10C87, 0x10CC7}, {0x10C88, 0x10CC8}, {0x10C89, 0x10CC9}, {0x10C8A, 0x10CCA}, {0x10C8B, 0x10CCB},
    {0x10C8C, 0x10CCC}, {0x10C8D, 0x10CCD}, {0x10C8E, 0x10CCE}, {0x10C8F, 0x10CCF}, {0x10C90, 0x10CD0}, {0x10C91, 0x10CD1},
    {0x10C92, 0x10CD2}, {0x10C93, 0x10CD3}, {0x10C94, 0x10CD4}, {0x10C95, 0x10CD5}, {0x10C96, 0x10CD6}, {0x10C97, 0x10CD7},
    {0x10C98, 0x10CD8}, {0x10C99, 0x10CD9}, {0x10C9A, 0x10CDA}, {0x10C9B, 0x10CDB}, {0x10C9C, 0x10CDC}, {0x10C9D, 0x10CDD},
    {0x10C9E, 0x10CDE}, {0x10C9F, 0x10CDF}, {0x10CA0, 0x10CE0}, {0x10CA1, 0x10CE1}, {0x10CA2, 0x10CE2}, {0x10CA3, 0x10CE3},
    {0x10CA4, 0x10CE4}, {0x10CA5, 0x10CE5}, {0x10CA6, 0x10CE6}, {0x10CA7, 0x10CE7}, {0x10CA8, 0x10CE8}, {0x10CA9, 0x10CE9},
    {0x10CAA, 0x10CEA}, {0x10CAB, 0x10CEB}, {0x10CAC, 0x10CEC}, {0x10CAD, 0x10CED}, {0x10CAE, 0x10CEE}, {0x10CAF, 0x10CEF},
    {0x10CB0, 0x10CF0}, {0x10CB1, 0x10CF1}, {0x10CB2, 0x10CF2}, {0x118A0, 0x118C0}, {0x118A1, 0x118C1}, {0x118A2, 0x118C2},
    {0x118A3, 0x118C3}, {0x118A4, 0x118C4}, {0x118A5, 0x118C5}, {0x118A6, 0x118C6}, {0x118A7, 0x118C7}, {0x118A8, 0x118C8},
    {0x118A9, 0x118C9}, {0x118AA, 0x118CA}, {0x118AB, 0x118CB}, {0x118AC, 0x118CC}, {0x118AD, 0x118CD}, {0x118AE, 0x118CE},
    {0x118AF, 0x118CF}, {0x118B0, 0x118D0}, {0x118B1, 0x118D1}, {0x118B2, 0x118D2}, {0x118B3, 0x118D3}, {0x118B4, 0x118D4},
    {0x118B5, 0x118D5}, {0x118B6, 0x118D6}, {0x118B7, 0x118D7}, {0x118B8, 0x118D8}, {0x118B9, 0x118D9}, {0x118BA, 0x118DA},
    {0x118BB, 0x118DB}, {0x118BC, 0x118DC}, {0x118BD, 0x118DD}, {0x118BE, 0x118DE}, {0x118BF, 0x118DF}, {0x16E40, 0x16E60},
    {0x16E41, 0x16E61}, {0x16E42, 0x16E62}, {0x16E43, 0x16E63}, {0x16E44, 0x16E64}, {0x16E45, 0x16E65}, {0x16E46, 0x16E66},
    {0x16E47, 0x16E67}, {0x16E48, 0x16E68}, {0x16E49, 0x16E69}, {0x16E4A, 0x16E6A}, {0x16E4B, 0x16E6B}, {0x16E4C, 0x16E6C},
    {0x16E4D, 0x16E6D}, {0x16E4E, 0x16E6E}, {0x16E4F, 0x16E6F}, {0x16E50, 0x16E70}, {0x16E51, 0x16E71}, {0x16E52, 0x16E72},
    {0x16E53, 0x16E73}, {0x16E54, 0x16E74}, {0x16E55, 0x16E75}, {0x16E56, 0x16E76}, {0x16E57, 0x16E77}, {0x16E58, 0x16E78},
    {0x16E59, 0x16E79}, {0x16E5A, 0x16E7A}, {0x16E5B, 0x16E7B}, {0x16E5C, 0x16E7C}, {0x16E5D, 0x16E7D}, {0x16E5E, 0x16E7E},
    {0x16E5F, 0x16E7F}, {0x1E900, 0x1E922}, {0x1E901, 0x1E923}, {0x1E902, 0x1E924}, {0x1E903, 0x1E925}, {0x1E904, 0x1E926},
    {0x1E905, 0x1E927}, {0x1E906, 0x1E928}, {0x1E907, 0x1E929}, {0x1E908, 0x1E92A}, {0x1E909, 0x1E92B}, {0x1E90A, 0x1E92C},
    {0x1E90B, 0x1E92D}, {0x1E90C, 0x1E92E}, {0x1E90D, 0x1E92F}, {0x1E90E, 0x1E930}, {0x1E90F, 0x1E931}, {0x1E910, 0x1E932},
    {0x1E911, 0x1E933}, {0x1E912, 0x1E934}, {0x1E913, 0x1E935}, {0x1E914, 0x1E936}, {0x1E915, 0x1E937}, {0x1E916, 0x1E938},
    {0x1E917, 0x1E939}, {0x1E918, 0x1E93A}, {0x1E919, 0x1E93B}, {0x1E91A, 0x1E93C}, {0x1E91B, 0x1E93D}, {0x1E91C, 0x1E93E},
    {0x1E91D, 0x1E93F}, {0x1E91E, 0x1E940}, {0x1E91F, 0x1E941}, {0x1E920, 0x1E942}, {0x1E921, 0x1E943},
};

// Inclusive runs [first, last] of code points whose NFD decomposition starts with `base`, sorted.
static const uint32_t kUnicodeNfdFirst[][3] = {
    {0x000C0, 0x000C5, 0x00041}, {0x000C7, 0x000C7, 0x00043}, {0x000C8, 0x000CB, 0x00045}, {0x000CC, 0x000CF, 0x00049},
    {0x000D1, 0x000D1, 0x0004E}, {0x000D2, 0x000D6, 0x0004F}, {0x000D9, 0x000DC, 0x00055}, {0x000DD, 0x000DD, 0x00059},
    {0x000E0, 0x000E5, 0x00061}, {0x000E7, 0x000E7, 0x00063}, {0x000E8, 0x000EB, 0x00065}, {0x000EC, 0x000EF, 0x00069},
    {0x000F1, 0x000F1, 0x0006E}, {0x000F2, 0x000F6, 0x0006F}, {0x000F9, 0x000FC, 0x00075}, {0x000FD, 0x000FD, 0x00079},
    {0x000FF, 0x000FF, 0x00079}, {0x00100, 0x00100, 0x00041}, {0x00101, 0x00101, 0x00061}, {0x00102, 0x00102, 0x00041},
    {0x00103, 0x00103, 0x00061}, {0x00104, 0x00104, 0x00041}, {0x00105, 0x00105, 0x00061}, {0x00106, 0x00106, 0x00043},
    {0x00107, 0x00107, 0x00063}, {0x00108, 0x00108, 0x00043}, {0x00109, 0x00109, 0x00063}, {0x0010A, 0x0010A, 0x00043},
    {0x0010B, 0x0010B, 0x00063}, {0x0010C, 0x0010C, 0x00043}, {0x0010D, 0x0010D, 0x00063}, {0x0010E, 0x0010E, 0x00044},
    {0x0010F, 0x0010F, 0x00064}, {0x00112, 0x00112, 0x00045}, {0x00113, 0x00113, 0x00065}, {0x00114, 0x00114, 0x00045},
    {0x00115, 0x00115, 0x00065}, {0x00116, 0x00116, 0x00045}, {0x00117, 0x00117, 0x00065}, {0x00118, 0x00118, 0x00045},
    {0x00119, 0x00119, 0x00065}, {0x0011A, 0x0011A, 0x00045}, {0x0011B, 0x0011B, 0x00065}, {0x0011C, 0x0011C, 0x00047},
    {0x0011D, 0x0011D, 0x00067}, {0x0011E, 0x0011E, 0x00047}, {0x0011F, 0x0011F, 0x00067}, {0x00120, 0x00120, 0x00047},
    {0x00121, 0x00121, 0x00067}, {0x00122, 0x00122, 0x00047}, {0x00123, 0x00123, 0x00067}, {0x00124, 0x00124, 0x00048},
    {0x00125, 0x00125, 0x00068}, {0x00128, 0x00128, 0x00049}, {0x00129, 0x00129, 0x00069}, {0x0012A, 0x0012A, 0x00049},
    {0x0012B, 0x0012B, 0x00069}, {0x0012C, 0x0012C, 0x00049}, {0x0012D, 0x0012D, 0x00069}, {0x0012E, 0x0012E, 0x00049},
    {0x0012F, 0x0012F, 0x00069}, {0x00130, 0x00130, 0x00049}, {0x00134, 0x00134, 0x0004A}, {0x00135, 0x00135, 0x0006A},
    {0x00136, 0x00136, 0x0004B}, {0x00137, 0x00137, 0x0006B}, {0x00139, 0x00139, 0x0004C}, {0x0013A, 0x0013A, 0x0006C},
    {0x0013B, 0x0013B, 0x0004C}, {0x0013C, 0x0013C, 0x0006C}, {0x0013D, 0x0013D, 0x0004C}, {0x0013E, 0x0013E, 0x0006C},
    {0x00143, 0x00143, 0x0004E}, {0x00144, 0x00144, 0x0006E}, {0x00145, 0x00145, 0x0004E}, {0x00146, 0x00146, 0x0006E},
    {0x00147, 0x00147, 0x0004E}, {0x00148, 0x00148, 0x0006E}, {0x0014C, 0x0014C, 0x0004F}, {0x0014D, 0x0014D, 0x0006F},
    {0x0014E, 0x0014E, 0x0004F}, {0x0014F, 0x0014F, 0x0006F}, {0x00150, 0x00150, 0x0004F}, {0x00151, 0x00151, 0x0006F},
    {0x00154, 0x00154, 0x00052}, {0x00155, 0x00155, 0x00072}, {0x00156, 0x00156, 0x00052}, {0x00157, 0x00157, 0x00072},
    {0x00158, 0x00158, 0x00052}, {0x00159, 0x00159, 0x00072}, {0x0015A, 0x0015A, 0x00053}, {0x0015B, 0x0015B, 0x00073},
    {0x0015C, 0x0015C, 0x00053}, {0x0015D, 0x0015D, 0x00073}, {0x0015E, 0x0015E, 0x00053}, {0x0015F, 0x0015F, 0x00073},
    {0x00160, 0x00160, 0x00053}, {0x00161, 0x00161, 0x00073}, {0x00162, 0x00162, 0x00054}, {0x00163, 0x00163, 0x00074},
    {0x00164, 0x00164, 0x00054}, {0x00165, 0x00165, 0x00074}, {0x00168, 0x00168, 0x00055}, {0x00169, 0x00169, 0x00075},
    {0x0016A, 0x0016A, 0x00055}, {0x0016B, 0x0016B, 0x00075}, {0x0016C, 0x0016C, 0x00055}, {0x0016D, 0x0016D, 0x00075},
    {0x0016E, 0x0016E, 0x00055}, {0x0016F, 0x0016F, 0x00075}, {0x00170, 0x00170, 0x00055}, {0x00171, 0x00171, 0x00075},
    {0x00172, 0x00172, 0x00055}, {0x00173, 0x00173, 0x00075}, {0x00174, 0x00174, 0x00057}, {0x00175, 0x00175, 0x00077},
    {0x00176, 0x00176, 0x00059}, {0x00177, 0x00177, 0x00079}, {0x00178, 0x00178, 0x00059}, {0x00179, 0x00179, 0x0005A},
    {0x0017A, 0x0017A, 0x0007A}, {0x0017B, 0x0017B, 0x0005A}, {0x0017C, 0x0017C, 0x0007A}, {0x0017D, 0x0017D, 0x0005A},
    {0x0017E, 0x0017E, 0x0007A}, {0x001A0, 0x001A0, 0x0004F}, {0x001A1, 0x001A1, 0x0006F}, {0x001AF, 0x001AF, 0x00055},
    {0x001B0, 0x001B0, 0x00075}, {0x001CD, 0x001CD, 0x00041}, {0x001CE, 0x001CE, 0x00061}, {0x001CF, 0x001CF, 0x00049},
    {0x001D0, 0x001D0, 0x00069}, {0x001D1, 0x001D1, 0x0004F}, {0x001D2, 0x001D2, 0x0006F}, {0x001D3, 0x001D3, 0x00055},
    {0x001D4, 0x001D4, 0x00075}, {0x001D5, 0x001D5, 0x00055}, {0x001D6, 0x001D6, 0x00075}, {0x001D7, 0x001D7, 0x00055},
    {0x001D8, 0x001D8, 0x00075}, {0x001D9, 0x001D9, 0x00055}, {0x001DA, 0x001DA, 0x00075}, {0x001DB, 0x001DB, 0x00055},
    {0x001DC, 0x001DC, 0x00075}, {0x001DE, 0x001DE, 0x00041}, {0x001DF, 0x001DF, 0x00061}, {0x001E0, 0x001E0, 0x00041},
    {0x001E1, 0x001E1, 0x00061}, {0x001E2, 0x001E2, 0x000C6}, {0x001E3, 0x001E3, 0x000E6}, {0x001E6, 0x001E6, 0x00047},
    {0x001E7, 0x001E7, 0x00067}, {0x001E8, 0x001E8, 0x0004B}, {0x001E9, 0x001E9, 0x0006B}, {0x001EA, 0x001EA, 0x0004F},
    {0x001EB, 0x001EB, 0x0006F}, {0x001EC, 0x001EC, 0x0004F}, {0x001ED, 0x001ED, 0x0006F}, {0x001EE, 0x001EE, 0x001B7},
    {0x001EF, 0x001EF, 0x00292}, {0x001F0, 0x001F0, 0x0006A}, {0x001F4, 0x001F4, 0x00047}, {0x001F5, 0x001F5, 0x00067},
    {0x001F8, 0x001F8, 0x0004E}, {0x001F9, 0x001F9, 0x0006E}, {0x001FA, 0x001FA, 0x00041}, {0x001FB, 0x001FB, 0x00061},
    {0x001FC, 0x001FC, 0x000C6}, {0x001FD, 0x001FD, 0x000E6}, {0x001FE, 0x001FE, 0x000D8}, {0x001FF, 0x001FF, 0x000F8},
    {0x00200, 0x00200, 0x00041}, {0x00201, 0x00201, 0x00061}, {0x00202, 0x00202, 0x00041}, {0x00203, 0x00203, 0x00061},
    {0x00204, 0x00204, 0x00045}, {0x00205, 0x00205, 0x00065}, {0x00206, 0x00206, 0x00045}, {0x00207, 0x00207, 0x00065},
    {0x00208, 0x00208, 0x00049}, {0x00209, 0x00209, 0x00069}, {0x0020A, 0x0020A, 0x00049}, {0x0020B, 0x0020B, 0x00069},
    {0x0020C, 0x0020C, 0x0004F}, {0x0020D, 0x0020D, 0x0006F}, {0x0020E, 0x0020E, 0x0004F}, {0x0020F, 0x0020F, 0x0006F},
    {0x00210, 0x00210, 0x00052}, {0x00211, 0x00211, 0x00072}, {0x00212, 0x00212, 0x00052}, {0x00213, 0x00213, 0x00072},
    {0x00214, 0x00214, 0x00055}, {0x00215, 0x00215, 0x00075}, {0x00216, 0x00216, 0x00055}, {0x00217, 0x00217, 0x00075},
    {0x00218, 0x00218, 0x00053}, {0x00219, 0x00219, 0x00073}, {0x0021A, 0x0021A, 0x00054}, {0x0021B, 0x0021B, 0x00074},
    {0x0021E, 0x0021E, 0x00048}, {0x0021F, 0x0021F, 0x00068}, {0x00226, 0x00226, 0x00041}, {0x00227, 0x00227, 0x00061},
    {0x00228, 0x00228, 0x00045}, {0x00229, 0x00229, 0x00065}, {0x0022A, 0x0022A, 0x0004F}, {0x0022B, 0x0022B, 0x0006F},
    {0x0022C, 0x0022C, 0x0004F}, {0x0022D, 0x0022D, 0x0006F}, {0x0022E, 0x0022E, 0x0004F}, {0x0022F, 0x0022F, 0x0006F},
    {0x00230, 0x00230, 0x0004F}, {0x00231, 0x00231, 0x0006F}, {0x00232, 0x00232, 0x00059}, {0x00233, 0x00233, 0x00079},
    {0x00340, 0x00340, 0x00300}, {0x00341, 0x00341, 0x00301}, {0x00343, 0x00343, 0x00313}, {0x00344, 0x00344, 0x00308},
    {0x00374, 0x00374, 0x002B9}, {0x0037E, 0x0037E, 0x0003B}, {0x00385, 0x00385, 0x000A8}, {0x00386, 0x00386, 0x00391},
    {0x00387, 0x00387, 0x000B7}, {0x00388, 0x00388, 0x00395}, {0x00389, 0x00389, 0x00397}, {0x0038A, 0x0038A, 0x00399},
    {0x0038C, 0x0038C, 0x0039F}, {0x0038E, 0x0038E, 0x003A5}, {0x0038F, 0x0038F, 0x003A9}, {0x00390, 0x00390, 0x003B9},
    {0x003AA, 0x003AA, 0x00399}, {0x003AB, 0x003AB, 0x003A5}, {0x003AC, 0x003AC, 0x003B1}, {0x003AD, 0x003AD, 0x003B5},
    {0x003AE, 0x003AE, 0x003B7}, {0x003AF, 0x003AF, 0x003B9}, {0x003B0, 0x003B0, 0x003C5}, {0x003CA, 0x003CA, 0x003B9},
    {0x003CB, 0x003CB, 0x003C5}, {0x003CC, 0x003CC, 0x003BF}, {0x003CD, 0x003CD, 0x003C5}, {0x003CE, 0x003CE, 0x003C9},
    {0x003D3, 0x003D4, 0x003D2}, {0x00400, 0x00401, 0x00415}, {0x00403, 0x00403, 0x00413}, {0x00407, 0x00407, 0x00406},
    {0x0040C, 0x0040C, 0x0041A}, {0x0040D, 0x0040D, 0x00418}, {0x0040E, 0x0040E, 0x00423}, {0x00419, 0x00419, 0x00418},
    {0x00439, 0x00439, 0x00438}, {0x00450, 0x00451, 0x00435}, {0x00453, 0x00453, 0x00433}, {0x00457, 0x00457, 0x00456},
    {0x0045C, 0x0045C, 0x0043A}, {0x0045D, 0x0045D, 0x00438}, {0x0045E, 0x0045E, 0x00443}, {0x00476, 0x00476, 0x00474},
    {0x00477, 0x00477, 0x00475}, {0x004C1, 0x004C1, 0x00416}, {0x004C2, 0x004C2, 0x00436}, {0x004D0, 0x004D0, 0x00410},
    {0x004D1, 0x004D1, 0x00430}, {0x004D2, 0x004D2, 0x00410}, {0x004D3, 0x004D3, 0x00430}, {0x004D6, 0x004D6, 0x00415},
    {0x004D7, 0x004D7, 0x00435}, {0x004DA, 0x004DA, 0x004D8}, {0x004DB, 0x004DB, 0x004D9}, {0x004DC, 0x004DC, 0x00416},
    {0x004DD, 0x004DD, 0x00436}, {0x004DE, 0x004DE, 0x00417}, {0x004DF, 0x004DF, 0x00437}, {0x004E2, 0x004E2, 0x00418},
    {0x004E3, 0x004E3, 0x00438}, {0x004E4, 0x004E4, 0x00418}, {0x004E5, 0x004E5, 0x00438}, {0x004E6, 0x004E6, 0x0041E},
    {0x004E7, 0x004E7, 0x0043E}, {0x004EA, 0x004EA, 0x004E8}, {0x004EB, 0x004EB, 0x004E9}, {0x004EC, 0x004EC, 0x0042D},
    {0x004ED, 0x004ED, 0x0044D}, {0x004EE, 0x004EE, 0x00423}, {0x004EF, 0x004EF, 0x00443}, {0x004F0, 0x004F0, 0x00423},
    {0x004F1, 0x004F1, 0x00443}, {0x004F2, 0x004F2, 0x00423}, {0x004F3, 0x004F3, 0x00443}, {0x004F4, 0x004F4, 0x00427},
    {0x004F5, 0x004F5, 0x00447}, {0x004F8, 0x004F8, 0x0042B}, {0x004F9, 0x004F9, 0x0044B}, {0x00622, 0x00623, 0x00627},
    {0x00624, 0x00624, 0x00648}, {0x00625, 0x00625, 0x00627}, {0x00626, 0x00626, 0x0064A}, {0x006C0, 0x006C0, 0x006D5},
    {0x006C2, 0x006C2, 0x006C1}, {0x006D3, 0x006D3, 0x006D2}, {0x00929, 0x00929, 0x00928}, {0x00931, 0x00931, 0x00930},
    {0x00934, 0x00934, 0x00933}, {0x00958, 0x00958, 0x00915}, {0x00959, 0x00959, 0x00916}, {0x0095A, 0x0095A, 0x00917},
    {0x0095B, 0x0095B, 0x0091C}, {0x0095C, 0x0095C, 0x00921}, {0x0095D, 0x0095D, 0x00922}, {0x0095E, 0x0095E, 0x0092B},
    {0x0095F, 0x0095F, 0x0092F}, {0x009CB, 0x009CC, 0x009C7}, {0x009DC, 0x009DC, 0x009A1}, {0x009DD, 0x009DD, 0x009A2},
    {0x009DF, 0x009DF, 0x009AF}, {0x00A33, 0x00A33, 0x00A32}, {0x00A36, 0x00A36, 0x00A38}, {0x00A59, 0x00A59, 0x00A16},
    {0x00A5A, 0x00A5A, 0x00A17}, {0x00A5B, 0x00A5B, 0x00A1C}, {0x00A5E, 0x00A5E, 0x00A2B}, {0x00B48, 0x00B48, 0x00B47},
    {0x00B4B, 0x00B4C, 0x00B47}, {0x00B5C, 0x00B5C, 0x00B21}, {0x00B5D, 0x00B5D, 0x00B22}, {0x00B94, 0x00B94, 0x00B92},
    {0x00BCA, 0x00BCA, 0x00BC6}, {0x00BCB, 0x00BCB, 0x00BC7}, {0x00BCC, 0x00BCC, 0x00BC6}, {0x00C48, 0x00C48, 0x00C46},
    {0x00CC0, 0x00CC0, 0x00CBF}, {0x00CC7, 0x00CC8, 0x00CC6}, {0x00CCA, 0x00CCB, 0x00CC6}, {0x00D4A, 0x00D4A, 0x00D46},
    {0x00D4B, 0x00D4B, 0x00D47}, {0x00D4C, 0x00D4C, 0x00D46}, {0x00DDA, 0x00DDA, 0x00DD9}, {0x00DDC, 0x00DDE, 0x00DD9},
    {0x00F43, 0x00F43, 0x00F42}, {0x00F4D, 0x00F4D, 0x00F4C}, {0x00F52, 0x00F52, 0x00F51}, {0x00F57, 0x00F57, 0x00F56},
    {0x00F5C, 0x00F5C, 0x00F5B}, {0x00F69, 0x00F69, 0x00F40}, {0x00F73, 0x00F73, 0x00F71}, {0x00F75, 0x00F75, 0x00F71},
    {0x00F76, 0x00F76, 0x00FB2}, {0x00F78, 0x00F78, 0x00FB3}, {0x00F81, 0x00F81, 0x00F71}, {0x00F93, 0x00F93, 0x00F92},
    {0x00F9D, 0x00F9D, 0x00F9C}, {0x00FA2, 0x00FA2, 0x00FA1}, {0x00FA7, 0x00FA7, 0x00FA6}, {0x00FAC, 0x00FAC, 0x00FAB},
    {0x00FB9, 0x00FB9, 0x00F90}, {0x01026, 0x01026, 0x01025}, {0x01B06, 0x01B06, 0x01B05}, {0x01B08, 0x01B08, 0x01B07},
    {0x01B0A, 0x01B0A, 0x01B09}, {0x01B0C, 0x01B0C, 0x01B0B}, {0x01B0E, 0x01B0E, 0x01B0D}, {0x01B12, 0x01B12, 0x01B11},
    {0x01B3B, 0x01B3B, 0x01B3A}, {0x01B3D, 0x01B3D, 0x01B3C}, {0x01B40, 0x01B40, 0x01B3E}, {0x01B41, 0x01B41, 0x01B3F},
    {0x01B43, 0x01B43, 0x01B42}, {0x01E00, 0x01E00, 0x00041}, {0x01E01, 0x01E01, 0x00061}, {0x01E02, 0x01E02, 0x00042},
    {0x01E03, 0x01E03, 0x00062}, {0x01E04, 0x01E04, 0x00042}, {0x01E05, 0x01E05, 0x00062}, {0x01E06, 0x01E06, 0x00042},
    {0x01E07, 0x01E07, 0x00062}, {0x01E08, 0x01E08, 0x00043}, {0x01E09, 0x01E09, 0x00063}, {0x01E0A, 0x01E0A, 0x00044},
    {0x01E0B, 0x01E0B, 0x00064}, {0x01E0C, 0x01E0C, 0x00044}, {0x01E0D, 0x01E0D, 0x00064}, {0x01E0E, 0x01E0E, 0x00044},
    {0x01E0F, 0x01E0F, 0x00064}, {0x01E10, 0x01E10, 0x00044}, {0x01E11, 0x01E11, 0x00064}, {0x01E12, 0x01E12, 0x00044},
    {0x01E13, 0x01E13, 0x00064}, {0x01E14, 0x01E14, 0x00045}, {0x01E15, 0x01E15, 0x00065}, {0x01E16, 0x01E16, 0x00045},
    {0x01E17, 0x01E17, 0x00065}, {0x01E18, 0x01E18, 0x00045}, {0x01E19, 0x01E19, 0x00065}, {0x01E1A, 0x01E1A, 0x00045},
    {0x01E1B, 0x01E1B, 0x00065}, {0x01E1C, 0x01E1C, 0x00045}, {0x01E1D, 0x01E1D, 0x00065}, {0x01E1E, 0x01E1E, 0x00046},
    {0x01E1F, 0x01E1F, 0x00066}, {0x01E20, 0x01E20, 0x00047}, {0x01E21, 0x01E21, 0x00067}, {0x01E22, 0x01E22, 0x00048},
    {0x01E23, 0x01E23, 0x00068}, {0x01E24, 0x01E24, 0x00048}, {0x01E25, 0x01E25, 0x00068}, {0x01E26, 0x01E26, 0x00048},
    {0x01E27, 0x01E27, 0x00068}, {0x01E28, 0x01E28, 0x00048}, {0x01E29, 0x01E29, 0x00068}, {0x01E2A, 0x01E2A, 0x00048},
    {0x01E2B, 0x01E2B, 0x00068}, {0x01E2C, 0x01E2C, 0x00049}, {0x01E2D, 0x01E2D, 0x00069}, {0x01E2E, 0x01E2E, 0x00049},
    {0x01E2F, 0x01E2F, 0x00069}, {0x01E30, 0x01E30, 0x0004B}, {0x01E31, 0x01E31, 0x0006B}, {0x01E32, 0x01E32, 0x0004B},
    {0x01E33, 0x01E33, 0x0006B}, {0x01E34, 0x01E34, 0x0004B}, {0x01E35, 0x01E35, 0x0006B}, {0x01E36, 0x01E36, 0x0004C},
    {0x01E37, 0x01E37, 0x0006C}, {0x01E38, 0x01E38, 0x0004C}, {0x01E39, 0x01E39, 0x0006C}, {0x01E3A, 0x01E3A, 0x0004C},
    {0x01E3B, 0x01E3B, 0x0006C}, {0x01E3C, 0x01E3C, 0x0004C}, {0x01E3D, 0x01E3D, 0x0006C}, {0x01E3E, 0x01E3E, 0x0004D},
    {0x01E3F, 0x01E3F, 0x0006D}, {0x01E40, 0x01E40, 0x0004D}, {0x01E41, 0x01E41, 0x0006D}, {0x01E42, 0x01E42, 0x0004D},
    {0x01E43, 0x01E43, 0x0006D}, {0x01E44, 0x01E44, 0x0004E}, {0x01E45, 0x01E45, 0x0006E}, {0x01E46, 0x01E46, 0x0004E},
    {0x01E47, 0x01E47, 0x0006E}, {0x01E48, 0x01E48, 0x0004E}, {0x01E49, 0x01E49, 0x0006E}, {0x01E4A, 0x01E4A, 0x0004E},
    {0x01E4B, 0x01E4B, 0x0006E}, {0x01E4C, 0x01E4C, 0x0004F}, {0x01E4D, 0x01E4D, 0x0006F}, {0x01E4E, 0x01E4E, 0x0004F},
    {0x01E4F, 0x01E4F, 0x0006F}, {0x01E50, 0x01E50, 0x0004F}, {0x01E51, 0x01E51, 0x0006F}, {0x01E52, 0x01E52, 0x0004F},
    {0x01E53, 0x01E53, 0x0006F}, {0x01E54, 0x01E54, 0x00050}, {0x01E55, 0x01E55, 0x00070}, {0x01E56, 0x01E56, 0x00050},
    {0x01E57, 0x01E57, 0x00070}, {0x01E58, 0x01E58, 0x00052}, {0x01E59, 0x01E59, 0x00072}, {0x01E5A, 0x01E5A, 0x00052},
    {0x01E5B, 0x01E5B, 0x00072}, {0x01E5C, 0x01E5C, 0x00052}, {0x01E5D, 0x01E5D, 0x00072}, {0x01E5E, 0x01E5E, 0x00052},
    {0x01E5F, 0x01E5F, 0x00072}, {0x01E60, 0x01E60, 0x00053}, {0x01E61, 0x01E61, 0x00073}, {0x01E62, 0x01E62, 0x00053},
    {0x01E63, 0x01E63, 0x00073}, {0x01E64, 0x01E64, 0x00053}, {0x01E65, 0x01E65, 0x00073}, {0x01E66, 0x01E66, 0x00053},
    {0x01E67, 0x01E67, 0x00073}, {0x01E68, 0x01E68, 0x00053}, {0x01E69, 0x01E69, 0x00073}, {0x01E6A, 0x01E6A, 0x00054},
    {0x01E6B, 0x01E6B, 0x00074}, {0x01E6C, 0x01E6C, 0x00054}, {0x01E6D, 0x01E6D, 0x00074}, {0x01E6E, 0x01E6E, 0x00054},
    {0x01E6F, 0x01E6F, 0x00074}, {0x01E70, 0x01E70, 0x00054}, {0x01E71, 0x01E71, 0x00074}, {0x01E72, 0x01E72, 0x00055},
    {0x01E73, 0x01E73, 0x00075}, {0x01E74, 0x01E74, 0x00055}, {0x01E75, 0x01E75, 0x00075}, {0x01E76, 0x01E76, 0x00055},
    {0x01E77, 0x01E77, 0x00075}, {0x01E78, 0x01E78, 0x00055}, {0x01E79, 0x01E79, 0x00075}, {0x01E7A, 0x01E7A, 0x00055},
    {0x01E7B, 0x01E7B, 0x00075}, {0x01E7C, 0x01E7C, 0x00056}, {0x01E7D, 0x01E7D, 0x00076}, {0x01E7E, 0x01E7E, 0x00056},
    {0x01E7F, 0x01E7F, 0x00076}, {0x01E80, 0x01E80, 0x00057}, {0x01E81, 0x01E81, 0x00077}, {0x01E82, 0x01E82, 0x00057},
    {0x01E83, 0x01E83, 0x00077}, {0x01E84, 0x01E84, 0x00057}, {0x01E85, 0x01E85, 0x00077}, {0x01E86, 0x01E86, 0x00057},
    {0x01E87, 0x01E87, 0x00077}, {0x01E88, 0x01E88, 0x00057}, {0x01E89, 0x01E89, 0x00077}, {0x01E8A, 0x01E8A, 0x00058},
    {0x01E8B, 0x01E8B, 0x00078}, {0x01E8C, 0x01E8C, 0x00058}, {0x01E8D, 0x01E8D, 0x00078}, {0x01E8E, 0x01E8E, 0x00059},
    {0x01E8F, 0x01E8F, 0x00079}, {0x01E90, 0x01E90, 0x0005A}, {0x01E91, 0x01E91, 0x0007A}, {0x01E92, 0x01E92, 0x0005A},
    {0x01E93, 0x01E93, 0x0007A}, {0x01E94, 0x01E94, 0x0005A}, {0x01E95, 0x01E95, 0x0007A}, {0x01E96, 0x01E96, 0x00068},
    {0x01E97, 0x01E97, 0x00074}, {0x01E98, 0x01E98, 0x00077}, {0x01E99, 0x01E99, 0x00079}, {0x01E9B, 0x01E9B, 0x0017F},
    {0x01EA0, 0x01EA0, 0x00041}, {0x01EA1, 0x01EA1, 0x00061}, {0x01EA2, 0x01EA2, 0x00041}, {0x01EA3, 0x01EA3, 0x00061},
    {0x01EA4, 0x01EA4, 0x00041}, {0x01EA5, 0x01EA5, 0x00061}, {0x01EA6, 0x01EA6, 0x00041}, {0x01EA7, 0x01EA7, 0x00061},
    {0x01EA8, 0x01EA8, 0x00041}, {0x01EA9, 0x01EA9, 0x00061}, {0x01EAA, 0x01EAA, 0x00041}, {0x01EAB, 0x01EAB, 0x00061},
    {0x01EAC, 0x01EAC, 0x00041}, {0x01EAD, 0x01EAD, 0x00061}, {0x01EAE, 0x01EAE, 0x00041}, {0x01EAF, 0x01EAF, 0x00061},
    {0x01EB0, 0x01EB0, 0x00041}, {0x01EB1, 0x01EB1, 0x00061}, {0x01EB2, 0x01EB2, 0x00041}, {0x01EB3, 0x01EB3, 0x00061},
    {0x01EB4, 0x01EB4, 0x00041}, {0x01EB5, 0x01EB5, 0x00061}, {0x01EB6, 0x01EB6, 0x00041}, {0x01EB7, 0x01EB7, 0x00061},
    {0x01EB8, 0x01EB8, 0x00045}, {0x01EB9, 0x01EB9, 0x00065}, {0x01EBA, 0x01EBA, 0x00045}, {0x01EBB, 0x01EBB, 0x00065},
    {0x01EBC, 0x01EBC, 0x00045}, {0x01EBD, 0x01EBD, 0x00065}, {0x01EBE, 0x01EBE, 0x00045}, {0x01EBF, 0x01EBF, 0x00065},
    {0x01EC0, 0x01EC0, 0x00045}, {0x01EC1, 0x01EC1, 0x00065}, {0x01EC2, 0x01EC2, 0x00045}, {0x01EC3, 0x01EC3, 0x00065},
    {0x01EC4, 0x01EC4, 0x00045}, {0x01EC5, 0x01EC5, 0x00065}, {0x01EC6, 0x01EC6, 0x00045}, {0x01EC7, 0x01EC7, 0x00065},
    {0x01EC8, 0x01EC8, 0x00049}, {0x01EC9, 0x01EC9, 0x00069}, {0x01ECA, 0x01ECA, 0x00049}, {0x01ECB, 0x01ECB, 0x00069},
    {0x01ECC, 0x01ECC, 0x0004F}, {0x01ECD, 0x01ECD, 0x0006F}, {0x01ECE, 0x01ECE, 0x0004F}, {0x01ECF, 0x01ECF, 0x0006F},
    {0x01ED0, 0x01ED0, 0x0004F}, {0x01ED1, 0x01ED1, 0x0006F}, {0x01ED2, 0x01ED2, 0x0004F}, {0x01ED3, 0x01ED3, 0x0006F},
    {0x01ED4, 0x01ED4, 0x0004F}, {0x01ED5, 0x01ED5, 0x0006F}, {0x01ED6, 0x01ED6, 0x0004F}, {0x01ED7, 0x01ED7, 0x0006F},
    {0x01ED8, 0x01ED8, 0x0004F}, {0x01ED9, 0x01ED9, 0x0006F}, {0x01EDA, 0x01EDA, 0x0004F}, {0x01EDB, 0x01EDB, 0x0006F},
    {0x01EDC, 0x01EDC, 0x0004F}, {0x01EDD, 0x01EDD, 0x0006F}, {0x01EDE, 0x01EDE, 0x0004F}, {0x01EDF, 0x01EDF, 0x0006F},
    {0x01EE0, 0x01EE0, 0x0004F}, {0x01EE1, 0x01EE1, 0x0006F}, {0x01EE2, 0x01EE2, 0x0004F}, {0x01EE3, 0x01EE3, 0x0006F},
    {0x01EE4, 0x01EE4, 0x00055}, {0x01EE5, 0x01EE5, 0x00075}, {0x01EE6, 0x01EE6, 0x00055}, {0x01EE7, 0x01EE7, 0x00075},
    {0x01EE8, 0x01EE8, 0x00055}, {0x01EE9, 0x01EE9, 0x00075}, {0x01EEA, 0x01EEA, 0x00055}, {0x01EEB, 0x01EEB, 0x00075},
    {0x01EEC, 0x01EEC, 0x00055}, {0x01EED, 0x01EED, 0x00075}, {0x01EEE, 0x01EEE, 0x00055}, {0x01EEF, 0x01EEF, 0x00075},
    {0x01EF0, 0x01EF0, 0x00055}, {0x01EF1, 0x01EF1, 0x00075}, {0x01EF2, 0x01EF2, 0x00059}, {0x01EF3, 0x01EF3, 0x00079},
    {0x01EF4, 0x01EF4, 0x00059}, {0x01EF5, 0x01EF5, 0x00079}, {0x01EF6, 0x01EF6, 0x00059}, {0x01EF7, 0x01EF7, 0x00079},
    {0x01EF8, 0x01EF8, 0x00059}, {0x01EF9, 0x01EF9, 0x00079}, {0x01F00, 0x01F07, 0x003B1}, {0x01F08, 0x01F0F, 0x00391},
    {0x01F10, 0x01F15, 0x003B5}, {0x01F18, 0x01F1D, 0x00395}, {0x01F20, 0x01F27, 0x003B7}, {0x01F28, 0x01F2F, 0x00397},
    {0x01F30, 0x01F37, 0x003B9}, {0x01F38, 0x01F3F, 0x00399}, {0x01F40, 0x01F45, 0x003BF}, {0x01F48, 0x01F4D, 0x0039F},
    {0x01F50, 0x01F57, 0x003C5}, {0x01F59, 0x01F59, 0x003A5}, {0x01F5B, 0x01F5B, 0x003A5}, {0x01F5D, 0x01F5D, 0x003A5},
    {0x01F5F, 0x01F5F, 0x003A5}, {0x01F60, 0x01F67, 0x003C9}, {0x01F68, 0x01F6F, 0x003A9}, {0x01F70, 0x01F71, 0x003B1},
    {0x01F72, 0x01F73, 0x003B5}, {0x01F74, 0x01F75, 0x003B7}, {0x01F76, 0x01F77, 0x003B9}, {0x01F78, 0x01F79, 0x003BF},
    {0x01F7A, 0x01F7B, 0x003C5}, {0x01F7C, 0x01F7D, 0x003C9}, {0x01F80, 0x01F87, 0x003B1}, {0x01F88, 0x01F8F, 0x00391},
    {0x01F90, 0x01F97, 0x003B7}, {0x01F98, 0x01F9F, 0x00397}, {0x01FA0, 0x01FA7, 0x003C9}, {0x01FA8, 0x01FAF, 0x003A9},
    {0x01FB0, 0x01FB4, 0x003B1}, {0x01FB6, 0x01FB7, 0x003B1}, {0x01FB8, 0x01FBC, 0x00391}, {0x01FBE, 0x01FBE, 0x003B9},
    {0x01FC1, 0x01FC1, 0x000A8}, {0x01FC2, 0x01FC4, 0x003B7}, {0x01FC6, 0x01FC7, 0x003B7}, {0x01FC8, 0x01FC9, 0x00395},
    {0x01FCA, 0x01FCC, 0x00397}, {0x01FCD, 0x01FCF, 0x01FBF}, {0x01FD0, 0x01FD3, 0x003B9}, {0x01FD6, 0x01FD7, 0x003B9},
    {0x01FD8, 0x01FDB, 0x00399}, {0x01FDD, 0x01FDF, 0x01FFE}, {0x01FE0, 0x01FE3, 0x003C5}, {0x01FE4, 0x01FE5, 0x003C1},
    {0x01FE6, 0x01FE7, 0x003C5}, {0x01FE8, 0x01FEB, 0x003A5}, {0x01FEC, 0x01FEC, 0x003A1}, {0x01FED, 0x01FEE, 0x000A8},
    {0x01FEF, 0x01FEF, 0x00060}, {0x01FF2, 0x01FF4, 0x003C9}, {0x01FF6, 0x01FF7, 0x003C9}, {0x01FF8, 0x01FF9, 0x0039F},
    {0x01FFA, 0x01FFC, 0x003A9}, {0x01FFD, 0x01FFD, 0x000B4}, {0x02000, 0x02000, 0x02002}, {0x02001, 0x02001, 0x02003},
    {0x02126, 0x02126, 0x003A9}, {0x0212A, 0x0212A, 0x0004B}, {0x0212B, 0x0212B, 0x00041}, {0x0219A, 0x0219A, 0x02190},
    {0x0219B, 0x0219B, 0x02192}, {0x021AE, 0x021AE, 0x02194}, {0x021CD, 0x021CD, 0x021D0}, {0x021CE, 0x021CE, 0x021D4},
    {0x021CF, 0x021CF, 0x021D2}, {0x02204, 0x02204, 0x02203}, {0x02209, 0x02209, 0x02208}, {0x0220C, 0x0220C, 0x0220B},
    {0x02224, 0x02224, 0x02223}, {0x02226, 0x02226, 0x02225}, {0x02241, 0x02241, 0x0223C}, {0x02244, 0x02244, 0x02243},
    {0x02247, 0x02247, 0x02245}, {0x02249, 0x02249, 0x02248}, {0x02260, 0x02260, 0x0003D}, {0x02262, 0x02262, 0x02261},
    {0x0226D, 0x0226D, 0x0224D}, {0x0226E, 0x0226E, 0x0003C}, {0x0226F, 0x0226F, 0x0003E}, {0x02270, 0x02270, 0x02264},
    {0x02271, 0x02271, 0x02265}, {0x02274, 0x02274, 0x02272}, {0x02275, 0x02275, 0x02273}, {0x02278, 0x02278, 0x02276},
    {0x02279, 0x02279, 0x02277}, {0x02280, 0x02280, 0x0227A}, {0x02281, 0x02281, 0x0227B}, {0x02284, 0x02284, 0x02282},
    {0x02285, 0x02285, 0x02283}, {0x02288, 0x02288, 0x02286}, {0x02289, 0x02289, 0x02287}, {0x022AC, 0x022AC, 0x022A2},
    {0x022AD, 0x022AD, 0x022A8}, {0x022AE, 0x022AE, 0x022A9}, {0x022AF, 0x022AF, 0x022AB}, {0x022E0, 0x022E0, 0x0227C},
    {0x022E1, 0x022E1, 0x0227D}, {0x022E2, 0x022E2, 0x02291}, {0x022E3, 0x022E3, 0x02292}, {0x022EA, 0x022EA, 0x022B2},
    {0x022EB, 0x022EB, 0x022B3}, {0x022EC, 0x022EC, 0x022B4}, {0x022ED, 0x022ED, 0x022B5}, {0x02329, 0x02329, 0x03008},
    {0x0232A, 0x0232A, 0x03009}, {0x02ADC, 0x02ADC, 0x02ADD}, {0x0304C, 0x0304C, 0x0304B}, {0x0304E, 0x0304E, 0x0304D},
    {0x03050, 0x03050, 0x0304F}, {0x03052, 0x03052, 0x03051}, {0x03054, 0x03054, 0x03053}, {0x03056, 0x03056, 0x03055},
    {0x03058, 0x03058, 0x03057}, {0x0305A, 0x0305A, 0x03059}, {0x0305C, 0x0305C, 0x0305B}, {0x0305E, 0x0305E, 0x0305D},
    {0x03060, 0x03060, 0x0305F}, {0x03062, 0x03062, 0x03061}, {0x03065, 0x03065, 0x03064}, {0x03067, 0x03067, 0x03066},
    {0x03069, 0x03069, 0x03068}, {0x03070, 0x03071, 0x0306F}, {0x03073, 0x03074, 0x03072}, {0x03076, 0x03077, 0x03075},
    {0x03079, 0x0307A, 0x03078}, {0x0307C, 0x0307D, 0x0307B}, {0x03094, 0x03094, 0x03046}, {0x0309E, 0x0309E, 0x0309D},
    {0x030AC, 0x030AC, 0x030AB}, {0x030AE, 0x030AE, 0x030AD}, {0x030B0, 0x030B0, 0x030AF}, {0x030B2, 0x030B2, 0x030B1},
    {0x030B4, 0x030B4, 0x030B3}, {0x030B6, 0x030B6, 0x030B5}, {0x030B8, 0x030B8, 0x030B7}, {0x030BA, 0x030BA, 0x030B9},
    {0x030BC, 0x030BC, 0x030BB}, {0x030BE, 0x030BE, 0x030BD}, {0x030C0, 0x030C0, 0x030BF}, {0x030C2, 0x030C2, 0x030C1},
    {0x030C5, 0x030C5, 0x030C4}, {0x030C7, 0x030C7, 0x030C6}, {0x030C9, 0x030C9, 0x030C8}, {0x030D0, 0x030D1, 0x030CF},
    {0x030D3, 0x030D4, 0x030D2}, {0x030D6, 0x030D7, 0x030D5}, {0x030D9, 0x030DA, 0x030D8}, {0x030DC, 0x030DD, 0x030DB},
    {0x030F4, 0x030F4, 0x030A6}, {0x030F7, 0x030F7, 0x030EF}, {0x030F8, 0x030F8, 0x030F0}, {0x030F9, 0x030F9, 0x030F1},
    {0x030FA, 0x030FA, 0x030F2}, {0x030FE, 0x030FE, 0x030FD}, {0x0AC00, 0x0AE4B, 0x01100}, {0x0AE4C, 0x0B097, 0x01101},
    {0x0B098, 0x0B2E3, 0x01102}, {0x0B2E4, 0x0B52F, 0x01103}, {0x0B530, 0x0B77B, 0x01104}, {0x0B77C, 0x0B9C7, 0x01105},
    {0x0B9C8, 0x0BC13, 0x01106}, {0x0BC14, 0x0BE5F, 0x01107}, {0x0BE60, 0x0C0AB, 0x01108}, {0x0C0AC, 0x0C2F7, 0x01109},
    {0x0C2F8, 0x0C543, 0x0110A}, {0x0C544, 0x0C78F, 0x0110B}, {0x0C790, 0x0C9DB, 0x0110C}, {0x0C9DC, 0x0CC27, 0x0110D},
    {0x0CC28, 0x0CE73, 0x0110E}, {0x0CE74, 0x0D0BF, 0x0110F}, {0x0D0C0, 0x0D30B, 0x01110}, {0x0D30C, 0x0D557, 0x01111},
    {0x0D558, 0x0D7A3, 0x01112}, {0x0F900, 0x0F900, 0x08C48}, {0x0F901, 0x0F901, 0x066F4}, {0x0F902, 0x0F902, 0x08ECA},
    {0x0F903, 0x0F903, 0x08CC8}, {0x0F904, 0x0F904, 0x06ED1}, {0x0F905, 0x0F905, 0x04E32}, {0x0F906, 0x0F906, 0x053E5},
    {0x0F907, 0x0F908, 0x09F9C}, {0x0F909, 0x0F909, 0x05951}, {0x0F90A, 0x0F90A, 0x091D1}, {0x0F90B, 0x0F90B, 0x05587},
    {0x0F90C, 0x0F90C, 0x05948}, {0x0F90D, 0x0F90D, 0x061F6}, {0x0F90E, 0x0F90E, 0x07669}, {0x0F90F, 0x0F90F, 0x07F85},
    {0x0F910, 0x0F910, 0x0863F}, {0x0F911, 0x0F911, 0x087BA}, {0x0F912, 0x0F912, 0x088F8}, {0x0F913, 0x0F913, 0x0908F},
    {0x0F914, 0x0F914, 0x06A02}, {0x0F915, 0x0F915, 0x06D1B}, {0x0F916, 0x0F916, 0x070D9}, {0x0F917, 0x0F917, 0x073DE},
    {0x0F918, 0x0F918, 0x0843D}, {0x0F919, 0x0F919, 0x0916A}, {0x0F91A, 0x0F91A, 0x099F1}, {0x0F91B, 0x0F91B, 0x04E82},
    {0x0F91C, 0x0F91C, 0x05375}, {0x0F91D, 0x0F91D, 0x06B04}, {0x0F91E, 0x0F91E, 0x0721B}, {0x0F91F, 0x0F91F, 0x0862D},
    {0x0F920, 0x0F920, 0x09E1E}, {0x0F921, 0x0F921, 0x05D50}, {0x0F922, 0x0F922, 0x06FEB}, {0x0F923, 0x0F923, 0x085CD},
    {0x0F924, 0x0F924, 0x08964}, {0x0F925, 0x0F925, 0x062C9}, {0x0F926, 0x0F926, 0x081D8}, {0x0F927, 0x0F927, 0x0881F},
    {0x0F928, 0x0F928, 0x05ECA}, {0x0F929, 0x0F929, 0x06717}, {0x0F92A, 0x0F92A, 0x06D6A}, {0x0F92B, 0x0F92B, 0x072FC},
    {0x0F92C, 0x0F92C, 0x090CE}, {0x0F92D, 0x0F92D, 0x04F86}, {0x0F92E, 0x0F92E, 0x051B7}, {0x0F92F, 0x0F92F, 0x052DE},
    {0x0F930, 0x0F930, 0x064C4}, {0x0F931, 0x0F931, 0x06AD3}, {0x0F932, 0x0F932, 0x07210}, {0x0F933, 0x0F933, 0x076E7},
    {0x0F934, 0x0F934, 0x08001}, {0x0F935, 0x0F935, 0x08606}, {0x0F936, 0x0F936, 0x0865C}, {0x0F937, 0x0F937, 0x08DEF},
    {0x0F938, 0x0F938, 0x09732}, {0x0F939, 0x0F939, 0x09B6F}, {0x0F93A, 0x0F93A, 0x09DFA}, {0x0F93B, 0x0F93B, 0x0788C},
    {0x0F93C, 0x0F93C, 0x0797F}, {0x0F93D, 0x0F93D, 0x07DA0}, {0x0F93E, 0x0F93E, 0x083C9}, {0x0F93F, 0x0F93F, 0x09304},
    {0x0F940, 0x0F940, 0x09E7F}, {0x0F941, 0x0F941, 0x08AD6}, {0x0F942, 0x0F942, 0x058DF}, {0x0F943, 0x0F943, 0x05F04},
    {0x0F944, 0x0F944, 0x07C60}, {0x0F945, 0x0F945, 0x0807E}, {0x0F946, 0x0F946, 0x07262}, {0x0F947, 0x0F947, 0x078CA},
    {0x0F948, 0x0F948, 0x08CC2}, {0x0F949, 0x0F949, 0x096F7}, {0x0F94A, 0x0F94A, 0x058D8}, {0x0F94B, 0x0F94B, 0x05C62},
    {0x0F94C, 0x0F94C, 0x06A13}, {0x0F94D, 0x0F94D, 0x06DDA}, {0x0F94E, 0x0F94E, 0x06F0F}, {0x0F94F, 0x0F94F, 0x07D2F},
    {0x0F950, 0x0F950, 0x07E37}, {0x0F951, 0x0F951, 0x0964B}, {0x0F952, 0x0F952, 0x052D2}, {0x0F953, 0x0F953, 0x0808B},
    {0x0F954, 0x0F954, 0x051DC}, {0x0F955, 0x0F955, 0x051CC}, {0x0F956, 0x0F956, 0x07A1C}, {0x0F957, 0x0F957, 0x07DBE},
    {0x0F958, 0x0F958, 0x083F1}, {0x0F959, 0x0F959, 0x09675}, {0x0F95A, 0x0F95A, 0x08B80}, {0x0F95B, 0x0F95B, 0x062CF},
    {0x0F95C, 0x0F95C, 0x06A02}, {0x0F95D, 0x0F95D, 0x08AFE}, {0x0F95E, 0x0F95E, 0x04E39}, {0x0F95F, 0x0F95F, 0x05BE7},
    {0x0F960, 0x0F960, 0x06012}, {0x0F961, 0x0F961, 0x07387}, {0x0F962, 0x0F962, 0x07570}, {0x0F963, 0x0F963, 0x05317},
    {0x0F964, 0x0F964, 0x078FB}, {0x0F965, 0x0F965, 0x04FBF}, {0x0F966, 0x0F966, 0x05FA9}, {0x0F967, 0x0F967, 0x04E0D},
    {0x0F968, 0x0F968, 0x06CCC}, {0x0F969, 0x0F969, 0x06578}, {0x0F96A, 0x0F96A, 0x07D22}, {0x0F96B, 0x0F96B, 0x053C3},
    {0x0F96C, 0x0F96C, 0x0585E}, {0x0F96D, 0x0F96D, 0x07701}, {0x0F96E, 0x0F96E, 0x08449}, {0x0F96F, 0x0F96F, 0x08AAA},
    {0x0F970, 0x0F970, 0x06BBA}, {0x0F971, 0x0F971, 0x08FB0}, {0x0F972, 0x0F972, 0x06C88}, {0x0F973, 0x0F973, 0x062FE},
    {0x0F974, 0x0F974, 0x082E5}, {0x0F975, 0x0F975, 0x063A0}, {0x0F976, 0x0F976, 0x07565}, {0x0F977, 0x0F977, 0x04EAE},
    {0x0F978, 0x0F978, 0x05169}, {0x0F979, 0x0F979, 0x051C9}, {0x0F97A, 0x0F97A, 0x06881}, {0x0F97B, 0x0F97B, 0x07CE7},
    {0x0F97C, 0x0F97C, 0x0826F}, {0x0F97D, 0x0F97D, 0x08AD2}, {0x0F97E, 0x0F97E, 0x091CF}, {0x0F97F, 0x0F97F, 0x052F5},
    {0x0F980, 0x0F980, 0x05442}, {0x0F981, 0x0F981, 0x05973}, {0x0F982, 0x0F982, 0x05EEC}, {0x0F983, 0x0F983, 0x065C5},
    {0x0F984, 0x0F984, 0x06FFE}, {0x0F985, 0x0F985, 0x0792A}, {0x0F986, 0x0F986, 0x095AD}, {0x0F987, 0x0F987, 0x09A6A},
    {0x0F988, 0x0F988, 0x09E97}, {0x0F989, 0x0F989, 0x09ECE}, {0x0F98A, 0x0F98A, 0x0529B}, {0x0F98B, 0x0F98B, 0x066C6},
    {0x0F98C, 0x0F98C, 0x06B77}, {0x0F98D, 0x0F98D, 0x08F62}, {0x0F98E, 0x0F98E, 0x05E74}, {0x0F98F, 0x0F98F, 0x06190},
    {0x0F990, 0x0F990, 0x06200}, {0x0F991, 0x0F991, 0x0649A}, {0x0F992, 0x0F992, 0x06F23}, {0x0F993, 0x0F993, 0x07149},
    {0x0F994, 0x0F994, 0x07489}, {0x0F995, 0x0F995, 0x079CA}, {0x0F996, 0x0F996, 0x07DF4}, {0x0F997, 0x0F997, 0x0806F},
    {0x0F998, 0x0F998, 0x08F26}, {0x0F999, 0x0F999, 0x084EE}, {0x0F99A, 0x0F99A, 0x09023}, {0x0F99B, 0x0F99B, 0x0934A},
    {0x0F99C, 0x0F99C, 0x05217}, {0x0F99D, 0x0F99D, 0x052A3}, {0x0F99E, 0x0F99E, 0x054BD}, {0x0F99F, 0x0F99F, 0x070C8},
    {0x0F9A0, 0x0F9A0, 0x088C2}, {0x0F9A1, 0x0F9A1, 0x08AAA}, {0x0F9A2, 0x0F9A2, 0x05EC9}, {0x0F9A3, 0x0F9A3, 0x05FF5},
    {0x0F9A4, 0x0F9A4, 0x0637B}, {0x0F9A5, 0x0F9A5, 0x06BAE}, {0x0F9A6, 0x0F9A6, 0x07C3E}, {0x0F9A7, 0x0F9A7, 0x07375},
    {0x0F9A8, 0x0F9A8, 0x04EE4}, {0x0F9A9, 0x0F9A9, 0x056F9}, {0x0F9AA, 0x0F9AA, 0x05BE7}, {0x0F9AB, 0x0F9AB, 0x05DBA},
    {0x0F9AC, 0x0F9AC, 0x0601C}, {0x0F9AD, 0x0F9AD, 0x073B2}, {0x0F9AE, 0x0F9AE, 0x07469}, {0x0F9AF, 0x0F9AF, 0x07F9A},
    {0x0F9B0, 0x0F9B0, 0x08046}, {0x0F9B1, 0x0F9B1, 0x09234}, {0x0F9B2, 0x0F9B2, 0x096F6}, {0x0F9B3, 0x0F9B3, 0x09748},
    {0x0F9B4, 0x0F9B4, 0x09818}, {0x0F9B5, 0x0F9B5, 0x04F8B}, {0x0F9B6, 0x0F9B6, 0x079AE}, {0x0F9B7, 0x0F9B7, 0x091B4},
    {0x0F9B8, 0x0F9B8, 0x096B8}, {0x0F9B9, 0x0F9B9, 0x060E1}, {0x0F9BA, 0x0F9BA, 0x04E86}, {0x0F9BB, 0x0F9BB, 0x050DA},
    {0x0F9BC, 0x0F9BC, 0x05BEE}, {0x0F9BD, 0x0F9BD, 0x05C3F}, {0x0F9BE, 0x0F9BE, 0x06599}, {0x0F9BF, 0x0F9BF, 0x06A02},
    {0x0F9C0, 0x0F9C0, 0x071CE}, {0x0F9C1, 0x0F9C1, 0x07642}, {0x0F9C2, 0x0F9C2, 0x084FC}, {0x0F9C3, 0x0F9C3, 0x0907C},
    {0x0F9C4, 0x0F9C4, 0x09F8D}, {0x0F9C5, 0x0F9C5, 0x06688}, {0x0F9C6, 0x0F9C6, 0x0962E}, {0x0F9C7, 0x0F9C7, 0x05289},
    {0x0F9C8, 0x0F9C8, 0x0677B}, {0x0F9C9, 0x0F9C9, 0x067F3}, {0x0F9CA, 0x0F9CA, 0x06D41}, {0x0F9CB, 0x0F9CB, 0x06E9C},
    {0x0F9CC, 0x0F9CC, 0x07409}, {0x0F9CD, 0x0F9CD, 0x07559}, {0x0F9CE, 0x0F9CE, 0x0786B}, {0x0F9CF, 0x0F9CF, 0x07D10},
    {0x0F9D0, 0x0F9D0, 0x0985E}, {0x0F9D1, 0x0F9D1, 0x0516D}, {0x0F9D2, 0x0F9D2, 0x0622E}, {0x0F9D3, 0x0F9D3, 0x09678},
    {0x0F9D4, 0x0F9D4, 0x0502B}, {0x0F9D5, 0x0F9D5, 0x05D19}, {0x0F9D6, 0x0F9D6, 0x06DEA}, {0x0F9D7, 0x0F9D7, 0x08F2A},
    {0x0F9D8, 0x0F9D8, 0x05F8B}, {0x0F9D9, 0x0F9D9, 0x06144}, {0x0F9DA, 0x0F9DA, 0x06817}, {0x0F9DB, 0x0F9DB, 0x07387},
    {0x0F9DC, 0x0F9DC, 0x09686}, {0x0F9DD, 0x0F9DD, 0x05229}, {0x0F9DE, 0x0F9DE, 0x0540F}, {0x0F9DF, 0x0F9DF, 0x05C65},
    {0x0F9E0, 0x0F9E0, 0x06613}, {0x0F9E1, 0x0F9E1, 0x0674E}, {0x0F9E2, 0x0F9E2, 0x068A8}, {0x0F9E3, 0x0F9E3, 0x06CE5},
    {0x0F9E4, 0x0F9E4, 0x07406}, {0x0F9E5, 0x0F9E5, 0x075E2}, {0x0F9E6, 0x0F9E6, 0x07F79}, {0x0F9E7, 0x0F9E7, 0x088CF},
    {0x0F9E8, 0x0F9E8, 0x088E1}, {0x0F9E9, 0x0F9E9, 0x091CC}, {0x0F9EA, 0x0F9EA, 0x096E2}, {0x0F9EB, 0x0F9EB, 0x0533F},
    {0x0F9EC, 0x0F9EC, 0x06EBA}, {0x0F9ED, 0x0F9ED, 0x0541D}, {0x0F9EE, 0x0F9EE, 0x071D0}, {0x0F9EF, 0x0F9EF, 0x07498},
    {0x0F9F0, 0x0F9F0, 0x085FA}, {0x0F9F1, 0x0F9F1, 0x096A3}, {0x0F9F2, 0x0F9F2, 0x09C57}, {0x0F9F3, 0x0F9F3, 0x09E9F},
    {0x0F9F4, 0x0F9F4, 0x06797}, {0x0F9F5, 0x0F9F5, 0x06DCB}, {0x0F9F6, 0x0F9F6, 0x081E8}, {0x0F9F7, 0x0F9F7, 0x07ACB},
    {0x0F9F8, 0x0F9F8, 0x07B20}, {0x0F9F9, 0x0F9F9, 0x07C92}, {0x0F9FA, 0x0F9FA, 0x072C0}, {0x0F9FB, 0x0F9FB, 0x07099},
    {0x0F9FC, 0x0F9FC, 0x08B58}, {0x0F9FD, 0x0F9FD, 0x04EC0}, {0x0F9FE, 0x0F9FE, 0x08336}, {0x0F9FF, 0x0F9FF, 0x0523A},
    {0x0FA00, 0x0FA00, 0x05207}, {0x0FA01, 0x0FA01, 0x05EA6}, {0x0FA02, 0x0FA02, 0x062D3}, {0x0FA03, 0x0FA03, 0x07CD6},
    {0x0FA04, 0x0FA04, 0x05B85}, {0x0FA05, 0x0FA05, 0x06D1E}, {0x0FA06, 0x0FA06, 0x066B4}, {0x0FA07, 0x0FA07, 0x08F3B},
    {0x0FA08, 0x0FA08, 0x0884C}, {0x0FA09, 0x0FA09, 0x0964D}, {0x0FA0A, 0x0FA0A, 0x0898B}, {0x0FA0B, 0x0FA0B, 0x05ED3},
    {0x0FA0C, 0x0FA0C, 0x05140}, {0x0FA0D, 0x0FA0D, 0x055C0}, {0x0FA10, 0x0FA10, 0x0585A}, {0x0FA12, 0x0FA12, 0x06674},
    {0x0FA15, 0x0FA15, 0x051DE}, {0x0FA16, 0x0FA16, 0x0732A}, {0x0FA17, 0x0FA17, 0x076CA}, {0x0FA18, 0x0FA18, 0x0793C},
    {0x0FA19, 0x0FA19, 0x0795E}, {0x0FA1A, 0x0FA1A, 0x07965}, {0x0FA1B, 0x0FA1B, 0x0798F}, {0x0FA1C, 0x0FA1C, 0x09756},
    {0x0FA1D, 0x0FA1D, 0x07CBE}, {0x0FA1E, 0x0FA1E, 0x07FBD}, {0x0FA20, 0x0FA20, 0x08612}, {0x0FA22, 0x0FA22, 0x08AF8},
    {0x0FA25, 0x0FA25, 0x09038}, {0x0FA26, 0x0FA26, 0x090FD}, {0x0FA2A, 0x0FA2A, 0x098EF}, {0x0FA2B, 0x0FA2B, 0x098FC},
    {0x0FA2C, 0x0FA2C, 0x09928}, {0x0FA2D, 0x0FA2D, 0x09DB4}, {0x0FA2E, 0x0FA2E, 0x090DE}, {0x0FA2F, 0x0FA2F, 0x096B7},
    {0x0FA30, 0x0FA30, 0x04FAE}, {0x0FA31, 0x0FA31, 0x050E7}, {0x0FA32, 0x0FA32, 0x0514D}, {0x0FA33, 0x0FA33, 0x052C9},
    {0x0FA34, 0x0FA34, 0x052E4}, {0x0FA35, 0x0FA35, 0x05351}, {0x0FA36, 0x0FA36, 0x0559D}, {0x0FA37, 0x0FA37, 0x05606},
    {0x0FA38, 0x0FA38, 0x05668}, {0x0FA39, 0x0FA39, 0x05840}, {0x0FA3A, 0x0FA3A, 0x058A8}, {0x0FA3B, 0x0FA3B, 0x05C64},
    {0x0FA3C, 0x0FA3C, 0x05C6E}, {0x0FA3D, 0x0FA3D, 0x06094}, {0x0FA3E, 0x0FA3E, 0x06168}, {0x0FA3F, 0x0FA3F, 0x0618E},
    {0x0FA40, 0x0FA40, 0x061F2}, {0x0FA41, 0x0FA41, 0x0654F}, {0x0FA42, 0x0FA42, 0x065E2}, {0x0FA43, 0x0FA43, 0x06691},
    {0x0FA44, 0x0FA44, 0x06885}, {0x0FA45, 0x0FA45, 0x06D77}, {0x0FA46, 0x0FA46, 0x06E1A}, {0x0FA47, 0x0FA47, 0x06F22},
    {0x0FA48, 0x0FA48, 0x0716E}, {0x0FA49, 0x0FA49, 0x0722B}, {0x0FA4A, 0x0FA4A, 0x07422}, {0x0FA4B, 0x0FA4B, 0x07891},
    {0x0FA4C, 0x0FA4C, 0x0793E}, {0x0FA4D, 0x0FA4D, 0x07949}, {0x0FA4E, 0x0FA4E, 0x07948}, {0x0FA4F, 0x0FA4F, 0x07950},
    {0x0FA50, 0x0FA50, 0x07956}, {0x0FA51, 0x0FA51, 0x0795D}, {0x0FA52, 0x0FA52, 0x0798D}, {0x0FA53, 0x0FA53, 0x0798E},
    {0x0FA54, 0x0FA54, 0x07A40}, {0x0FA55, 0x0FA55, 0x07A81}, {0x0FA56, 0x0FA56, 0x07BC0}, {0x0FA57, 0x0FA57, 0x07DF4},
    {0x0FA58, 0x0FA58, 0x07E09}, {0x0FA59, 0x0FA59, 0x07E41}, {0x0FA5A, 0x0FA5A, 0x07F72}, {0x0FA5B, 0x0FA5B, 0x08005},
    {0x0FA5C, 0x0FA5C, 0x081ED}, {0x0FA5D, 0x0FA5E, 0x08279}, {0x0FA5F, 0x0FA5F, 0x08457}, {0x0FA60, 0x0FA60, 0x08910},
    {0x0FA61, 0x0FA61, 0x08996}, {0x0FA62, 0x0FA62, 0x08B01}, {0x0FA63, 0x0FA63, 0x08B39}, {0x0FA64, 0x0FA64, 0x08CD3},
    {0x0FA65, 0x0FA65, 0x08D08}, {0x0FA66, 0x0FA66, 0x08FB6}, {0x0FA67, 0x0FA67, 0x09038}, {0x0FA68, 0x0FA68, 0x096E3},
    {0x0FA69, 0x0FA69, 0x097FF}, {0x0FA6A, 0x0FA6A, 0x0983B}, {0x0FA6B, 0x0FA6B, 0x06075}, {0x0FA6C, 0x0FA6C, 0x242EE},
    {0x0FA6D, 0x0FA6D, 0x08218}, {0x0FA70, 0x0FA70, 0x04E26}, {0x0FA71, 0x0FA71, 0x051B5}, {0x0FA72, 0x0FA72, 0x05168},
    {0x0FA73, 0x0FA73, 0x04F80}, {0x0FA74, 0x0FA74, 0x05145}, {0x0FA75, 0x0FA75, 0x05180}, {0x0FA76, 0x0FA76, 0x052C7},
    {0x0FA77, 0x0FA77, 0x052FA}, {0x0FA78, 0x0FA78, 0x0559D}, {0x0FA79, 0x0FA79, 0x05555}, {0x0FA7A, 0x0FA7A, 0x05599},
    {0x0FA7B, 0x0FA7B, 0x055E2}, {0x0FA7C, 0x0FA7C, 0x0585A}, {0x0FA7D, 0x0FA7D, 0x058B3}, {0x0FA7E, 0x0FA7E, 0x05944},
    {0x0FA7F, 0x0FA7F, 0x05954}, {0x0FA80, 0x0FA80, 0x05A62}, {0x0FA81, 0x0FA81, 0x05B28}, {0x0FA82, 0x0FA82, 0x05ED2},
    {0x0FA83, 0x0FA83, 0x05ED9}, {0x0FA84, 0x0FA84, 0x05F69}, {0x0FA85, 0x0FA85, 0x05FAD}, {0x0FA86, 0x0FA86, 0x060D8},
    {0x0FA87, 0x0FA87, 0x0614E}, {0x0FA88, 0x0FA88, 0x06108}, {0x0FA89, 0x0FA89, 0x0618E}, {0x0FA8A, 0x0FA8A, 0x06160},
    {0x0FA8B, 0x0FA8B, 0x061F2}, {0x0FA8C, 0x0FA8C, 0x06234}, {0x0FA8D, 0x0FA8D, 0x063C4}, {0x0FA8E, 0x0FA8E, 0x0641C},
    {0x0FA8F, 0x0FA8F, 0x06452}, {0x0FA90, 0x0FA90, 0x06556}, {0x0FA91, 0x0FA91, 0x06674}, {0x0FA92, 0x0FA92, 0x06717},
    {0x0FA93, 0x0FA93, 0x0671B}, {0x0FA94, 0x0FA94, 0x06756}, {0x0FA95, 0x0FA95, 0x06B79}, {0x0FA96, 0x0FA96, 0x06BBA},
    {0x0FA97, 0x0FA97, 0x06D41}, {0x0FA98, 0x0FA98, 0x06EDB}, {0x0FA99, 0x0FA99, 0x06ECB}, {0x0FA9A, 0x0FA9A, 0x06F22},
    {0x0FA9B, 0x0FA9B, 0x0701E}, {0x0FA9C, 0x0FA9C, 0x0716E}, {0x0FA9D, 0x0FA9D, 0x077A7}, {0x0FA9E, 0x0FA9E, 0x07235},
    {0x0FA9F, 0x0FA9F, 0x072AF}, {0x0FAA0, 0x0FAA0, 0x0732A}, {0x0FAA1, 0x0FAA1, 0x07471}, {0x0FAA2, 0x0FAA2, 0x07506},
    {0x0FAA3, 0x0FAA3, 0x0753B}, {0x0FAA4, 0x0FAA4, 0x0761D}, {0x0FAA5, 0x0FAA5, 0x0761F}, {0x0FAA6, 0x0FAA6, 0x076CA},
    {0x0FAA7, 0x0FAA7, 0x076DB}, {0x0FAA8, 0x0FAA8, 0x076F4}, {0x0FAA9, 0x0FAA9, 0x0774A}, {0x0FAAA, 0x0FAAA, 0x07740},
    {0x0FAAB, 0x0FAAB, 0x078CC}, {0x0FAAC, 0x0FAAC, 0x07AB1}, {0x0FAAD, 0x0FAAD, 0x07BC0}, {0x0FAAE, 0x0FAAE, 0x07C7B},
    {0x0FAAF, 0x0FAAF, 0x07D5B}, {0x0FAB0, 0x0FAB0, 0x07DF4}, {0x0FAB1, 0x0FAB1, 0x07F3E}, {0x0FAB2, 0x0FAB2, 0x08005},
    {0x0FAB3, 0x0FAB3, 0x08352}, {0x0FAB4, 0x0FAB4, 0x083EF}, {0x0FAB5, 0x0FAB5, 0x08779}, {0x0FAB6, 0x0FAB6, 0x08941},
    {0x0FAB7, 0x0FAB7, 0x08986}, {0x0FAB8, 0x0FAB8, 0x08996}, {0x0FAB9, 0x0FAB9, 0x08ABF}, {0x0FABA, 0x0FABA, 0x08AF8},
    {0x0FABB, 0x0FABB, 0x08ACB}, {0x0FABC, 0x0FABC, 0x08B01}, {0x0FABD, 0x0FABD, 0x08AFE}, {0x0FABE, 0x0FABE, 0x08AED},
    {0x0FABF, 0x0FABF, 0x08B39}, {0x0FAC0, 0x0FAC0, 0x08B8A}, {0x0FAC1, 0x0FAC1, 0x08D08}, {0x0FAC2, 0x0FAC2, 0x08F38},
    {0x0FAC3, 0x0FAC3, 0x09072}, {0x0FAC4, 0x0FAC4, 0x09199}, {0x0FAC5, 0x0FAC5, 0x09276}, {0x0FAC6, 0x0FAC6, 0x0967C},
    {0x0FAC7, 0x0FAC7, 0x096E3}, {0x0FAC8, 0x0FAC8, 0x09756}, {0x0FAC9, 0x0FAC9, 0x097DB}, {0x0FACA, 0x0FACA, 0x097FF},
    {0x0FACB, 0x0FACB, 0x0980B}, {0x0FACC, 0x0FACC, 0x0983B}, {0x0FACD, 0x0FACD, 0x09B12}, {0x0FACE, 0x0FACE, 0x09F9C},
    {0x0FACF, 0x0FACF, 0x2284A}, {0x0FAD0, 0x0FAD0, 0x22844}, {0x0FAD1, 0x0FAD1, 0x233D5}, {0x0FAD2, 0x0FAD2, 0x03B9D},
    {0x0FAD3, 0x0FAD3, 0x04018}, {0x0FAD4, 0x0FAD4, 0x04039}, {0x0FAD5, 0x0FAD5, 0x25249}, {0x0FAD6, 0x0FAD6, 0x25CD0},
    {0x0FAD7, 0x0FAD7, 0x27ED3}, {0x0FAD8, 0x0FAD8, 0x09F43}, {0x0FAD9, 0x0FAD9, 0x09F8E}, {0x0FB1D, 0x0FB1D, 0x005D9},
    {0x0FB1F, 0x0FB1F, 0x005F2}, {0x0FB2A, 0x0FB2D, 0x005E9}, {0x0FB2E, 0x0FB30, 0x005D0}, {0x0FB31, 0x0FB31, 0x005D1},
    {0x0FB32, 0x0FB32, 0x005D2}, {0x0FB33, 0x0FB33, 0x005D3}, {0x0FB34, 0x0FB34, 0x005D4}, {0x0FB35, 0x0FB35, 0x005D5},
    {0x0FB36, 0x0FB36, 0x005D6}, {0x0FB38, 0x0FB38, 0x005D8}, {0x0FB39, 0x0FB39, 0x005D9}, {0x0FB3A, 0x0FB3A, 0x005DA},
    {0x0FB3B, 0x0FB3B, 0x005DB}, {0x0FB3C, 0x0FB3C, 0x005DC}, {0x0FB3E, 0x0FB3E, 0x005DE}, {0x0FB40, 0x0FB40, 0x005E0},
    {0x0FB41, 0x0FB41, 0x005E1}, {0x0FB43, 0x0FB43, 0x005E3}, {0x0FB44, 0x0FB44, 0x005E4}, {0x0FB46, 0x0FB46, 0x005E6},
    {0x0FB47, 0x0FB47, 0x005E7}, {0x0FB48, 0x0FB48, 0x005E8}, {0x0FB49, 0x0FB49, 0x005E9}, {0x0FB4A, 0x0FB4A, 0x005EA},
    {0x0FB4B, 0x0FB4B, 0x005D5}, {0x0FB4C, 0x0FB4C, 0x005D1}, {0x0FB4D, 0x0FB4D, 0x005DB}, {0x0FB4E, 0x0FB4E, 0x005E4},
    {0x1109A, 0x1109A, 0x11099}, {0x1109C, 0x1109C, 0x1109B}, {0x110AB, 0x110AB, 0x110A5}, {0x1112E, 0x1112E, 0x11131},
    {0x1112F, 0x1112F, 0x11132}, {0x1134B, 0x1134C, 0x11347}, {0x114BB, 0x114BC, 0x114B9}, {0x114BE, 0x114BE, 0x114B9},
    {0x115BA, 0x115BA, 0x115B8}, {0x115BB, 0x115BB, 0x115B9}, {0x11938, 0x11938, 0x11935}, {0x1D15E, 0x1D15E, 0x1D157},
    {0x1D15F, 0x1D164, 0x1D158}, {0x1D1BB, 0x1D1BB, 0x1D1B9}, {0x1D1BC, 0x1D1BC, 0x1D1BA}, {0x1D1BD, 0x1D1BD, 0x1D1B9},
    {0x1D1BE, 0x1D1BE, 0x1D1BA}, {0x1D1BF, 0x1D1BF, 0x1D1B9}, {0x1D1C0, 0x1D1C0, 0x1D1BA}, {0x2F800, 0x2F800, 0x04E3D},
    {0x2F801, 0x2F801, 0x04E38}, {0x2F802, 0x2F802, 0x04E41}, {0x2F803, 0x2F803, 0x20122}, {0x2F804, 0x2F804, 0x04F60},
    {0x2F805, 0x2F805, 0x04FAE}, {0x2F806, 0x2F806, 0x04FBB}, {0x2F807, 0x2F807, 0x05002}, {0x2F808, 0x2F808, 0x0507A},
    {0x2F809, 0x2F809, 0x05099}, {0x2F80A, 0x2F80A, 0x050E7}, {0x2F80B, 0x2F80B, 0x050CF}, {0x2F80C, 0x2F80C, 0x0349E},
    {0x2F80D, 0x2F80D, 0x2063A}, {0x2F80E, 0x2F80E, 0x0514D}, {0x2F80F, 0x2F80F, 0x05154}, {0x2F810, 0x2F810, 0x05164},
    {0x2F811, 0x2F811, 0x05177}, {0x2F812, 0x2F812, 0x2051C}, {0x2F813, 0x2F813, 0x034B9}, {0x2F814, 0x2F814, 0x05167},
    {0x2F815, 0x2F815, 0x0518D}, {0x2F816, 0x2F816, 0x2054B}, {0x2F817, 0x2F817, 0x05197}, {0x2F818, 0x2F818, 0x051A4},
    {0x2F819, 0x2F819, 0x04ECC}, {0x2F81A, 0x2F81A, 0x051AC}, {0x2F81B, 0x2F81B, 0x051B5}, {0x2F81C, 0x2F81C, 0x291DF},
    {0x2F81D, 0x2F81D, 0x051F5}, {0x2F81E, 0x2F81E, 0x05203}, {0x2F81F, 0x2F81F, 0x034DF}, {0x2F820, 0x2F820, 0x0523B},
    {0x2F821, 0x2F821, 0x05246}, {0x2F822, 0x2F822, 0x05272}, {0x2F823, 0x2F823, 0x05277}, {0x2F824, 0x2F824, 0x03515},
    {0x2F825, 0x2F825, 0x052C7}, {0x2F826, 0x2F826, 0x052C9}, {0x2F827, 0x2F827, 0x052E4}, {0x2F828, 0x2F828, 0x052FA},
    {0x2F829, 0x2F829, 0x05305}, {0x2F82A, 0x2F82A, 0x05306}, {0x2F82B, 0x2F82B, 0x05317}, {0x2F82C, 0x2F82C, 0x05349},
    {0x2F82D, 0x2F82D, 0x05351}, {0x2F82E, 0x2F82E, 0x0535A}, {0x2F82F, 0x2F82F, 0x05373}, {0x2F830, 0x2F830, 0x0537D},
    {0x2F831, 0x2F833, 0x0537F}, {0x2F834, 0x2F834, 0x20A2C}, {0x2F835, 0x2F835, 0x07070}, {0x2F836, 0x2F836, 0x053CA},
    {0x2F837, 0x2F837, 0x053DF}, {0x2F838, 0x2F838, 0x20B63}, {0x2F839, 0x2F839, 0x053EB}, {0x2F83A, 0x2F83A, 0x053F1},
    {0x2F83B, 0x2F83B, 0x05406}, {0x2F83C, 0x2F83C, 0x0549E}, {0x2F83D, 0x2F83D, 0x05438}, {0x2F83E, 0x2F83E, 0x05448},
    {0x2F83F, 0x2F83F, 0x05468}, {0x2F840, 0x2F840, 0x054A2}, {0x2F841, 0x2F841, 0x054F6}, {0x2F842, 0x2F842, 0x05510},
    {0x2F843, 0x2F843, 0x05553}, {0x2F844, 0x2F844, 0x05563}, {0x2F845, 0x2F846, 0x05584}, {0x2F847, 0x2F847, 0x05599},
    {0x2F848, 0x2F848, 0x055AB}, {0x2F849, 0x2F849, 0x055B3}, {0x2F84A, 0x2F84A, 0x055C2}, {0x2F84B, 0x2F84B, 0x05716},
    {0x2F84C, 0x2F84C, 0x05606}, {0x2F84D, 0x2F84D, 0x05717}, {0x2F84E, 0x2F84E, 0x05651}, {0x2F84F, 0x2F84F, 0x05674},
    {0x2F850, 0x2F850, 0x05207}, {0x2F851, 0x2F851, 0x058EE}, {0x2F852, 0x2F852, 0x057CE}, {0x2F853, 0x2F853, 0x057F4},
    {0x2F854, 0x2F854, 0x0580D}, {0x2F855, 0x2F855, 0x0578B}, {0x2F856, 0x2F856, 0x05832}, {0x2F857, 0x2F857, 0x05831},
    {0x2F858, 0x2F858, 0x058AC}, {0x2F859, 0x2F859, 0x214E4}, {0x2F85A, 0x2F85A, 0x058F2}, {0x2F85B, 0x2F85B, 0x058F7},
    {0x2F85C, 0x2F85C, 0x05906}, {0x2F85D, 0x2F85D, 0x0591A}, {0x2F85E, 0x2F85E, 0x05922}, {0x2F85F, 0x2F85F, 0x05962},
    {0x2F860, 0x2F860, 0x216A8}, {0x2F861, 0x2F861, 0x216EA}, {0x2F862, 0x2F862, 0x059EC}, {0x2F863, 0x2F863, 0x05A1B},
    {0x2F864, 0x2F864, 0x05A27}, {0x2F865, 0x2F865, 0x059D8}, {0x2F866, 0x2F866, 0x05A66}, {0x2F867, 0x2F867, 0x036EE},
    {0x2F868, 0x2F868, 0x036FC}, {0x2F869, 0x2F869, 0x05B08}, {0x2F86A, 0x2F86B, 0x05B3E}, {0x2F86C, 0x2F86C, 0x219C8},
    {0x2F86D, 0x2F86D, 0x05BC3}, {0x2F86E, 0x2F86E, 0x05BD8}, {0x2F86F, 0x2F86F, 0x05BE7}, {0x2F870, 0x2F870, 0x05BF3},
    {0x2F871, 0x2F871, 0x21B18}, {0x2F872, 0x2F872, 0x05BFF}, {0x2F873, 0x2F873, 0x05C06}, {0x2F874, 0x2F874, 0x05F53},
    {0x2F875, 0x2F875, 0x05C22}, {0x2F876, 0x2F876, 0x03781}, {0x2F877, 0x2F877, 0x05C60}, {0x2F878, 0x2F878, 0x05C6E},
    {0x2F879, 0x2F879, 0x05CC0}, {0x2F87A, 0x2F87A, 0x05C8D}, {0x2F87B, 0x2F87B, 0x21DE4}, {0x2F87C, 0x2F87C, 0x05D43},
    {0x2F87D, 0x2F87D, 0x21DE6}, {0x2F87E, 0x2F87E, 0x05D6E}, {0x2F87F, 0x2F87F, 0x05D6B}, {0x2F880, 0x2F880, 0x05D7C},
    {0x2F881, 0x2F881, 0x05DE1}, {0x2F882, 0x2F882, 0x05DE2}, {0x2F883, 0x2F883, 0x0382F}, {0x2F884, 0x2F884, 0x05DFD},
    {0x2F885, 0x2F885, 0x05E28}, {0x2F886, 0x2F886, 0x05E3D}, {0x2F887, 0x2F887, 0x05E69}, {0x2F888, 0x2F888, 0x03862},
    {0x2F889, 0x2F889, 0x22183}, {0x2F88A, 0x2F88A, 0x0387C}, {0x2F88B, 0x2F88B, 0x05EB0}, {0x2F88C, 0x2F88C, 0x05EB3},
    {0x2F88D, 0x2F88D, 0x05EB6}, {0x2F88E, 0x2F88E, 0x05ECA}, {0x2F88F, 0x2F88F, 0x2A392}, {0x2F890, 0x2F890, 0x05EFE},
    {0x2F891, 0x2F892, 0x22331}, {0x2F893, 0x2F893, 0x08201}, {0x2F894, 0x2F895, 0x05F22}, {0x2F896, 0x2F896, 0x038C7},
    {0x2F897, 0x2F897, 0x232B8}, {0x2F898, 0x2F898, 0x261DA}, {0x2F899, 0x2F899, 0x05F62}, {0x2F89A, 0x2F89A, 0x05F6B},
    {0x2F89B, 0x2F89B, 0x038E3}, {0x2F89C, 0x2F89C, 0x05F9A}, {0x2F89D, 0x2F89D, 0x05FCD}, {0x2F89E, 0x2F89E, 0x05FD7},
    {0x2F89F, 0x2F89F, 0x05FF9}, {0x2F8A0, 0x2F8A0, 0x06081}, {0x2F8A1, 0x2F8A1, 0x0393A}, {0x2F8A2, 0x2F8A2, 0x0391C},
    {0x2F8A3, 0x2F8A3, 0x06094}, {0x2F8A4, 0x2F8A4, 0x226D4}, {0x2F8A5, 0x2F8A5, 0x060C7}, {0x2F8A6, 0x2F8A6, 0x06148},
    {0x2F8A7, 0x2F8A7, 0x0614C}, {0x2F8A8, 0x2F8A8, 0x0614E}, {0x2F8A9, 0x2F8A9, 0x0614C}, {0x2F8AA, 0x2F8AA, 0x0617A},
    {0x2F8AB, 0x2F8AB, 0x0618E}, {0x2F8AC, 0x2F8AC, 0x061B2}, {0x2F8AD, 0x2F8AD, 0x061A4}, {0x2F8AE, 0x2F8AE, 0x061AF},
    {0x2F8AF, 0x2F8AF, 0x061DE}, {0x2F8B0, 0x2F8B0, 0x061F2}, {0x2F8B1, 0x2F8B1, 0x061F6}, {0x2F8B2, 0x2F8B2, 0x06210},
    {0x2F8B3, 0x2F8B3, 0x0621B}, {0x2F8B4, 0x2F8B4, 0x0625D}, {0x2F8B5, 0x2F8B5, 0x062B1}, {0x2F8B6, 0x2F8B6, 0x062D4},
    {0x2F8B7, 0x2F8B7, 0x06350}, {0x2F8B8, 0x2F8B8, 0x22B0C}, {0x2F8B9, 0x2F8B9, 0x0633D}, {0x2F8BA, 0x2F8BA, 0x062FC},
    {0x2F8BB, 0x2F8BB, 0x06368}, {0x2F8BC, 0x2F8BC, 0x06383}, {0x2F8BD, 0x2F8BD, 0x063E4}, {0x2F8BE, 0x2F8BE, 0x22BF1},
    {0x2F8BF, 0x2F8BF, 0x06422}, {0x2F8C0, 0x2F8C0, 0x063C5}, {0x2F8C1, 0x2F8C1, 0x063A9}, {0x2F8C2, 0x2F8C2, 0x03A2E},
    {0x2F8C3, 0x2F8C3, 0x06469}, {0x2F8C4, 0x2F8C4, 0x0647E}, {0x2F8C5, 0x2F8C5, 0x0649D}, {0x2F8C6, 0x2F8C6, 0x06477},
    {0x2F8C7, 0x2F8C7, 0x03A6C}, {0x2F8C8, 0x2F8C8, 0x0654F}, {0x2F8C9, 0x2F8C9, 0x0656C}, {0x2F8CA, 0x2F8CA, 0x2300A},
    {0x2F8CB, 0x2F8CB, 0x065E3}, {0x2F8CC, 0x2F8CC, 0x066F8}, {0x2F8CD, 0x2F8CD, 0x06649}, {0x2F8CE, 0x2F8CE, 0x03B19},
    {0x2F8CF, 0x2F8CF, 0x06691}, {0x2F8D0, 0x2F8D0, 0x03B08}, {0x2F8D1, 0x2F8D1, 0x03AE4}, {0x2F8D2, 0x2F8D2, 0x05192},
    {0x2F8D3, 0x2F8D3, 0x05195}, {0x2F8D4, 0x2F8D4, 0x06700}, {0x2F8D5, 0x2F8D5, 0x0669C}, {0x2F8D6, 0x2F8D6, 0x080AD},
    {0x2F8D7, 0x2F8D7, 0x043D9}, {0x2F8D8, 0x2F8D8, 0x06717}, {0x2F8D9, 0x2F8D9, 0x0671B}, {0x2F8DA, 0x2F8DA, 0x06721},
    {0x2F8DB, 0x2F8DB, 0x0675E}, {0x2F8DC, 0x2F8DC, 0x06753}, {0x2F8DD, 0x2F8DD, 0x233C3}, {0x2F8DE, 0x2F8DE, 0x03B49},
    {0x2F8DF, 0x2F8DF, 0x067FA}, {0x2F8E0, 0x2F8E0, 0x06785}, {0x2F8E1, 0x2F8E1, 0x06852}, {0x2F8E2, 0x2F8E2, 0x06885},
    {0x2F8E3, 0x2F8E3, 0x2346D}, {0x2F8E4, 0x2F8E4, 0x0688E}, {0x2F8E5, 0x2F8E5, 0x0681F}, {0x2F8E6, 0x2F8E6, 0x06914},
    {0x2F8E7, 0x2F8E7, 0x03B9D}, {0x2F8E8, 0x2F8E8, 0x06942}, {0x2F8E9, 0x2F8E9, 0x069A3}, {0x2F8EA, 0x2F8EA, 0x069EA},
    {0x2F8EB, 0x2F8EB, 0x06AA8}, {0x2F8EC, 0x2F8EC, 0x236A3}, {0x2F8ED, 0x2F8ED, 0x06ADB}, {0x2F8EE, 0x2F8EE, 0x03C18},
    {0x2F8EF, 0x2F8EF, 0x06B21}, {0x2F8F0, 0x2F8F0, 0x238A7}, {0x2F8F1, 0x2F8F1, 0x06B54}, {0x2F8F2, 0x2F8F2, 0x03C4E},
    {0x2F8F3, 0x2F8F3, 0x06B72}, {0x2F8F4, 0x2F8F4, 0x06B9F}, {0x2F8F5, 0x2F8F5, 0x06BBA}, {0x2F8F6, 0x2F8F6, 0x06BBB},
    {0x2F8F7, 0x2F8F7, 0x23A8D}, {0x2F8F8, 0x2F8F8, 0x21D0B}, {0x2F8F9, 0x2F8F9, 0x23AFA}, {0x2F8FA, 0x2F8FA, 0x06C4E},
    {0x2F8FB, 0x2F8FB, 0x23CBC}, {0x2F8FC, 0x2F8FC, 0x06CBF}, {0x2F8FD, 0x2F8FD, 0x06CCD}, {0x2F8FE, 0x2F8FE, 0x06C67},
    {0x2F8FF, 0x2F8FF, 0x06D16}, {0x2F900, 0x2F900, 0x06D3E}, {0x2F901, 0x2F901, 0x06D77}, {0x2F902, 0x2F902, 0x06D41},
    {0x2F903, 0x2F903, 0x06D69}, {0x2F904, 0x2F904, 0x06D78}, {0x2F905, 0x2F905, 0x06D85}, {0x2F906, 0x2F906, 0x23D1E},
    {0x2F907, 0x2F907, 0x06D34}, {0x2F908, 0x2F908, 0x06E2F}, {0x2F909, 0x2F909, 0x06E6E}, {0x2F90A, 0x2F90A, 0x03D33},
    {0x2F90B, 0x2F90B, 0x06ECB}, {0x2F90C, 0x2F90C, 0x06EC7}, {0x2F90D, 0x2F90D, 0x23ED1}, {0x2F90E, 0x2F90E, 0x06DF9},
    {0x2F90F, 0x2F90F, 0x06F6E}, {0x2F910, 0x2F910, 0x23F5E}, {0x2F911, 0x2F911, 0x23F8E}, {0x2F912, 0x2F912, 0x06FC6},
    {0x2F913, 0x2F913, 0x07039}, {0x2F914, 0x2F914, 0x0701E}, {0x2F915, 0x2F915, 0x0701B}, {0x2F916, 0x2F916, 0x03D96},
    {0x2F917, 0x2F917, 0x0704A}, {0x2F918, 0x2F918, 0x0707D}, {0x2F919, 0x2F919, 0x07077}, {0x2F91A, 0x2F91A, 0x070AD},
    {0x2F91B, 0x2F91B, 0x20525}, {0x2F91C, 0x2F91C, 0x07145}, {0x2F91D, 0x2F91D, 0x24263}, {0x2F91E, 0x2F91E, 0x0719C},
    {0x2F91F, 0x2F91F, 0x243AB}, {0x2F920, 0x2F920, 0x07228}, {0x2F921, 0x2F921, 0x07235}, {0x2F922, 0x2F922, 0x07250},
    {0x2F923, 0x2F923, 0x24608}, {0x2F924, 0x2F924, 0x07280}, {0x2F925, 0x2F925, 0x07295}, {0x2F926, 0x2F926, 0x24735},
    {0x2F927, 0x2F927, 0x24814}, {0x2F928, 0x2F928, 0x0737A}, {0x2F929, 0x2F929, 0x0738B}, {0x2F92A, 0x2F92A, 0x03EAC},
    {0x2F92B, 0x2F92B, 0x073A5}, {0x2F92C, 0x2F92D, 0x03EB8}, {0x2F92E, 0x2F92E, 0x07447}, {0x2F92F, 0x2F92F, 0x0745C},
    {0x2F930, 0x2F930, 0x07471}, {0x2F931, 0x2F931, 0x07485}, {0x2F932, 0x2F932, 0x074CA}, {0x2F933, 0x2F933, 0x03F1B},
    {0x2F934, 0x2F934, 0x07524}, {0x2F935, 0x2F935, 0x24C36}, {0x2F936, 0x2F936, 0x0753E}, {0x2F937, 0x2F937, 0x24C92},
    {0x2F938, 0x2F938, 0x07570}, {0x2F939, 0x2F939, 0x2219F}, {0x2F93A, 0x2F93A, 0x07610}, {0x2F93B, 0x2F93B, 0x24FA1},
    {0x2F93C, 0x2F93C, 0x24FB8}, {0x2F93D, 0x2F93D, 0x25044}, {0x2F93E, 0x2F93E, 0x03FFC}, {0x2F93F, 0x2F93F, 0x04008},
    {0x2F940, 0x2F940, 0x076F4}, {0x2F941, 0x2F941, 0x250F3}, {0x2F942, 0x2F942, 0x250F2}, {0x2F943, 0x2F943, 0x25119},
    {0x2F944, 0x2F944, 0x25133}, {0x2F945, 0x2F945, 0x0771E}, {0x2F946, 0x2F947, 0x0771F}, {0x2F948, 0x2F948, 0x0774A},
    {0x2F949, 0x2F949, 0x04039}, {0x2F94A, 0x2F94A, 0x0778B}, {0x2F94B, 0x2F94B, 0x04046}, {0x2F94C, 0x2F94C, 0x04096},
    {0x2F94D, 0x2F94D, 0x2541D}, {0x2F94E, 0x2F94E, 0x0784E}, {0x2F94F, 0x2F94F, 0x0788C}, {0x2F950, 0x2F950, 0x078CC},
    {0x2F951, 0x2F951, 0x040E3}, {0x2F952, 0x2F952, 0x25626}, {0x2F953, 0x2F953, 0x07956}, {0x2F954, 0x2F954, 0x2569A},
    {0x2F955, 0x2F955, 0x256C5}, {0x2F956, 0x2F956, 0x0798F}, {0x2F957, 0x2F957, 0x079EB}, {0x2F958, 0x2F958, 0x0412F},
    {0x2F959, 0x2F959, 0x07A40}, {0x2F95A, 0x2F95A, 0x07A4A}, {0x2F95B, 0x2F95B, 0x07A4F}, {0x2F95C, 0x2F95C, 0x2597C},
    {0x2F95D, 0x2F95E, 0x25AA7}, {0x2F95F, 0x2F95F, 0x07AEE}, {0x2F960, 0x2F960, 0x04202}, {0x2F961, 0x2F961, 0x25BAB},
    {0x2F962, 0x2F962, 0x07BC6}, {0x2F963, 0x2F963, 0x07BC9}, {0x2F964, 0x2F964, 0x04227}, {0x2F965, 0x2F965, 0x25C80},
    {0x2F966, 0x2F966, 0x07CD2}, {0x2F967, 0x2F967, 0x042A0}, {0x2F968, 0x2F968, 0x07CE8}, {0x2F969, 0x2F969, 0x07CE3},
    {0x2F96A, 0x2F96A, 0x07D00}, {0x2F96B, 0x2F96B, 0x25F86}, {0x2F96C, 0x2F96C, 0x07D63}, {0x2F96D, 0x2F96D, 0x04301},
    {0x2F96E, 0x2F96E, 0x07DC7}, {0x2F96F, 0x2F96F, 0x07E02}, {0x2F970, 0x2F970, 0x07E45}, {0x2F971, 0x2F971, 0x04334},
    {0x2F972, 0x2F972, 0x26228}, {0x2F973, 0x2F973, 0x26247}, {0x2F974, 0x2F974, 0x04359}, {0x2F975, 0x2F975, 0x262D9},
    {0x2F976, 0x2F976, 0x07F7A}, {0x2F977, 0x2F977, 0x2633E}, {0x2F978, 0x2F978, 0x07F95}, {0x2F979, 0x2F979, 0x07FFA},
    {0x2F97A, 0x2F97A, 0x08005}, {0x2F97B, 0x2F97B, 0x264DA}, {0x2F97C, 0x2F97C, 0x26523}, {0x2F97D, 0x2F97D, 0x08060},
    {0x2F97E, 0x2F97E, 0x265A8}, {0x2F97F, 0x2F97F, 0x08070}, {0x2F980, 0x2F980, 0x2335F}, {0x2F981, 0x2F981, 0x043D5},
    {0x2F982, 0x2F982, 0x080B2}, {0x2F983, 0x2F983, 0x08103}, {0x2F984, 0x2F984, 0x0440B}, {0x2F985, 0x2F985, 0x0813E},
    {0x2F986, 0x2F986, 0x05AB5}, {0x2F987, 0x2F987, 0x267A7}, {0x2F988, 0x2F988, 0x267B5}, {0x2F989, 0x2F989, 0x23393},
    {0x2F98A, 0x2F98A, 0x2339C}, {0x2F98B, 0x2F98B, 0x08201}, {0x2F98C, 0x2F98C, 0x08204}, {0x2F98D, 0x2F98D, 0x08F9E},
    {0x2F98E, 0x2F98E, 0x0446B}, {0x2F98F, 0x2F98F, 0x08291}, {0x2F990, 0x2F990, 0x0828B}, {0x2F991, 0x2F991, 0x0829D},
    {0x2F992, 0x2F992, 0x052B3}, {0x2F993, 0x2F993, 0x082B1}, {0x2F994, 0x2F994, 0x082B3}, {0x2F995, 0x2F995, 0x082BD},
    {0x2F996, 0x2F996, 0x082E6}, {0x2F997, 0x2F997, 0x26B3C}, {0x2F998, 0x2F998, 0x082E5}, {0x2F999, 0x2F999, 0x0831D},
    {0x2F99A, 0x2F99A, 0x08363}, {0x2F99B, 0x2F99B, 0x083AD}, {0x2F99C, 0x2F99C, 0x08323}, {0x2F99D, 0x2F99D, 0x083BD},
    {0x2F99E, 0x2F99E, 0x083E7}, {0x2F99F, 0x2F99F, 0x08457}, {0x2F9A0, 0x2F9A0, 0x08353}, {0x2F9A1, 0x2F9A1, 0x083CA},
    {0x2F9A2, 0x2F9A2, 0x083CC}, {0x2F9A3, 0x2F9A3, 0x083DC}, {0x2F9A4, 0x2F9A4, 0x26C36}, {0x2F9A5, 0x2F9A5, 0x26D6B},
    {0x2F9A6, 0x2F9A6, 0x26CD5}, {0x2F9A7, 0x2F9A7, 0x0452B}, {0x2F9A8, 0x2F9A8, 0x084F1}, {0x2F9A9, 0x2F9A9, 0x084F3},
    {0x2F9AA, 0x2F9AA, 0x08516}, {0x2F9AB, 0x2F9AB, 0x273CA}, {0x2F9AC, 0x2F9AC, 0x08564}, {0x2F9AD, 0x2F9AD, 0x26F2C},
    {0x2F9AE, 0x2F9AE, 0x0455D}, {0x2F9AF, 0x2F9AF, 0x04561}, {0x2F9B0, 0x2F9B0, 0x26FB1}, {0x2F9B1, 0x2F9B1, 0x270D2},
    {0x2F9B2, 0x2F9B2, 0x0456B}, {0x2F9B3, 0x2F9B3, 0x08650}, {0x2F9B4, 0x2F9B4, 0x0865C}, {0x2F9B5, 0x2F9B5, 0x08667},
    {0x2F9B6, 0x2F9B6, 0x08669}, {0x2F9B7, 0x2F9B7, 0x086A9}, {0x2F9B8, 0x2F9B8, 0x08688}, {0x2F9B9, 0x2F9B9, 0x0870E},
    {0x2F9BA, 0x2F9BA, 0x086E2}, {0x2F9BB, 0x2F9BB, 0x08779}, {0x2F9BC, 0x2F9BC, 0x08728}, {0x2F9BD, 0x2F9BD, 0x0876B},
    {0x2F9BE, 0x2F9BE, 0x08786}, {0x2F9BF, 0x2F9BF, 0x045D7}, {0x2F9C0, 0x2F9C0, 0x087E1}, {0x2F9C1, 0x2F9C1, 0x08801},
    {0x2F9C2, 0x2F9C2, 0x045F9}, {0x2F9C3, 0x2F9C3, 0x08860}, {0x2F9C4, 0x2F9C4, 0x08863}, {0x2F9C5, 0x2F9C5, 0x27667},
    {0x2F9C6, 0x2F9C6, 0x088D7}, {0x2F9C7, 0x2F9C7, 0x088DE}, {0x2F9C8, 0x2F9C8, 0x04635}, {0x2F9C9, 0x2F9C9, 0x088FA},
    {0x2F9CA, 0x2F9CA, 0x034BB}, {0x2F9CB, 0x2F9CB, 0x278AE}, {0x2F9CC, 0x2F9CC, 0x27966}, {0x2F9CD, 0x2F9CD, 0x046BE},
    {0x2F9CE, 0x2F9CE, 0x046C7}, {0x2F9CF, 0x2F9CF, 0x08AA0}, {0x2F9D0, 0x2F9D0, 0x08AED}, {0x2F9D1, 0x2F9D1, 0x08B8A},
    {0x2F9D2, 0x2F9D2, 0x08C55}, {0x2F9D3, 0x2F9D3, 0x27CA8}, {0x2F9D4, 0x2F9D4, 0x08CAB}, {0x2F9D5, 0x2F9D5, 0x08CC1},
    {0x2F9D6, 0x2F9D6, 0x08D1B}, {0x2F9D7, 0x2F9D7, 0x08D77}, {0x2F9D8, 0x2F9D8, 0x27F2F}, {0x2F9D9, 0x2F9D9, 0x20804},
    {0x2F9DA, 0x2F9DA, 0x08DCB}, {0x2F9DB, 0x2F9DB, 0x08DBC}, {0x2F9DC, 0x2F9DC, 0x08DF0}, {0x2F9DD, 0x2F9DD, 0x208DE},
    {0x2F9DE, 0x2F9DE, 0x08ED4}, {0x2F9DF, 0x2F9DF, 0x08F38}, {0x2F9E0, 0x2F9E0, 0x285D2}, {0x2F9E1, 0x2F9E1, 0x285ED},
    {0x2F9E2, 0x2F9E2, 0x09094}, {0x2F9E3, 0x2F9E3, 0x090F1}, {0x2F9E4, 0x2F9E4, 0x09111}, {0x2F9E5, 0x2F9E5, 0x2872E},
    {0x2F9E6, 0x2F9E6, 0x0911B}, {0x2F9E7, 0x2F9E7, 0x09238}, {0x2F9E8, 0x2F9E8, 0x092D7}, {0x2F9E9, 0x2F9E9, 0x092D8},
    {0x2F9EA, 0x2F9EA, 0x0927C}, {0x2F9EB, 0x2F9EB, 0x093F9}, {0x2F9EC, 0x2F9EC, 0x09415}, {0x2F9ED, 0x2F9ED, 0x28BFA},
    {0x2F9EE, 0x2F9EE, 0x0958B}, {0x2F9EF, 0x2F9EF, 0x04995}, {0x2F9F0, 0x2F9F0, 0x095B7}, {0x2F9F1, 0x2F9F1, 0x28D77},
    {0x2F9F2, 0x2F9F2, 0x049E6}, {0x2F9F3, 0x2F9F3, 0x096C3}, {0x2F9F4, 0x2F9F4, 0x05DB2}, {0x2F9F5, 0x2F9F5, 0x09723},
    {0x2F9F6, 0x2F9F6, 0x29145}, {0x2F9F7, 0x2F9F7, 0x2921A}, {0x2F9F8, 0x2F9F8, 0x04A6E}, {0x2F9F9, 0x2F9F9, 0x04A76},
    {0x2F9FA, 0x2F9FA, 0x097E0}, {0x2F9FB, 0x2F9FB, 0x2940A}, {0x2F9FC, 0x2F9FC, 0x04AB2}, {0x2F9FD, 0x2F9FD, 0x29496},
    {0x2F9FE, 0x2F9FF, 0x0980B}, {0x2FA00, 0x2FA00, 0x09829}, {0x2FA01, 0x2FA01, 0x295B6}, {0x2FA02, 0x2FA02, 0x098E2},
    {0x2FA03, 0x2FA03, 0x04B33}, {0x2FA04, 0x2FA04, 0x09929}, {0x2FA05, 0x2FA05, 0x099A7}, {0x2FA06, 0x2FA06, 0x099C2},
    {0x2FA07, 0x2FA07, 0x099FE}, {0x2FA08, 0x2FA08, 0x04BCE}, {0x2FA09, 0x2FA09, 0x29B30}, {0x2FA0A, 0x2FA0A, 0x09B12},
    {0x2FA0B, 0x2FA0B, 0x09C40}, {0x2FA0C, 0x2FA0C, 0x09CFD}, {0x2FA0D, 0x2FA0D, 0x04CCE}, {0x2FA0E, 0x2FA0E, 0x04CED},
    {0x2FA0F, 0x2FA0F, 0x09D67}, {0x2FA10, 0x2FA10, 0x2A0CE}, {0x2FA11, 0x2FA11, 0x04CF8}, {0x2FA12, 0x2FA12, 0x2A105},
    {0x2FA13, 0x2FA13, 0x2A20E}, {0x2FA14, 0x2FA14, 0x2A291}, {0x2FA15, 0x2FA15, 0x09EBB}, {0x2FA16, 0x2FA16, 0x04D56},
    {0x2FA17, 0x2FA17, 0x09EF9}, {0x2FA18, 0x2FA18, 0x09EFE}, {0x2FA19, 0x2FA19, 0x09F05}, {0x2FA1A, 0x2FA1A, 0x09F0F},
    {0x2FA1B, 0x2FA1B, 0x09F16}, {0x2FA1C, 0x2FA1C, 0x09F3B}, {0x2FA1D, 0x2FA1D, 0x2A600},
};
// END generated unicode tables

// ---- Unicode properties ----------------------------------------------------------------------
enum UCat : uint8_t { UCAT_OTHER, UCAT_NUMBER, UCAT_LETTER, UCAT_MARK, UCAT_PUNCT, UCAT_SYMBOL, UCAT_CONTROL };
constexpr uint8_t kFlagWhitespace = 0x08;
constexpr uint8_t kFlagValid = 0x10;  // set for positions inside the current chunk (see Chunk::flags)

inline uint8_t unicode_flags(uint32_t cp) {
    static const std::vector<uint8_t> ascii = [] {
        std::vector<uint8_t> t(128);
        for (uint32_t c = 0; c < 128; c++) {
            const uint32_t* it = std::upper_bound(std::begin(kUnicodeRanges), std::end(kUnicodeRanges), (c << 8) | 0xFF);
            t[c] = (uint8_t)(it[-1] & 0xFF);
        }
        return t;
    }();
    if (cp < 128) return ascii[cp];
    if (cp >= 0x110000) return UCAT_OTHER;
    const uint32_t* it = std::upper_bound(std::begin(kUnicodeRanges), std::end(kUnicodeRanges), (cp << 8) | 0xFF);
    return (uint8_t)(it[-1] & 0xFF);
}

inline UCat ucat(uint32_t cp) { return (UCat)(unicode_flags(cp) & 7); }
inline bool is_ws(uint32_t cp) { return (unicode_flags(cp) & kFlagWhitespace) != 0; }

// Simple (one code point) lowercase, as the reference's unicode_tolower.
inline uint32_t unicode_lower(uint32_t cp) {
    if (cp < 128) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    auto it = std::lower_bound(std::begin(kUnicodeLower), std::end(kUnicodeLower), cp,
                               [](const uint32_t (&e)[2], uint32_t c) { return e[0] < c; });
    return it != std::end(kUnicodeLower) && (*it)[0] == cp ? (*it)[1] : cp;
}

// The first code point of cp's NFD decomposition (accents dropped), as the reference's WordPiece normalizer.
inline uint32_t unicode_nfd_first(uint32_t cp) {
    if (cp < 0xC0) return cp;
    auto it = std::upper_bound(std::begin(kUnicodeNfdFirst), std::end(kUnicodeNfdFirst), cp,
                               [](uint32_t c, const uint32_t (&e)[3]) { return c < e[0]; });
    if (it == std::begin(kUnicodeNfdFirst)) return cp;
    --it;
    return cp <= (*it)[1] ? (*it)[2] : cp;
}

// CJK ideographs, which WordPiece splits into words of their own (the ranges of BERT's tokenizer,
// with its 0x2B920 for 0x2B820, as the reference has them).
inline bool is_cjk_ideograph(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// ---- UTF-8 -------------------------------------------------------------------------------------
// Sequence length from the lead byte (continuation bytes count as 1), as the reference splits symbols.
inline size_t utf8_len(char c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[(uint8_t)c >> 4];
}

// Decodes one code point; a malformed sequence yields U+FFFD and consumes one byte (reference behaviour:
// only lead/continuation bit patterns are checked, not overlong forms or surrogates).
inline uint32_t utf8_decode(const std::string& s, size_t& off) {
    const size_t n = s.size();
    const uint8_t c = (uint8_t)s[off];
    auto cont = [&](size_t i) { return off + i < n && ((uint8_t)s[off + i] & 0xC0) == 0x80; };
    auto byte = [&](size_t i) { return (uint32_t)((uint8_t)s[off + i] & 0x3F); };
    if (!(c & 0x80)) { off += 1; return c; }
    if ((c & 0x40) && !(c & 0x20) && cont(1)) { uint32_t r = (c & 0x1Fu) << 6 | byte(1); off += 2; return r; }
    if ((c & 0x60) == 0x60 && !(c & 0x10) && cont(1) && cont(2)) {
        uint32_t r = (c & 0x0Fu) << 12 | byte(1) << 6 | byte(2);
        off += 3;
        return r;
    }
    if ((c & 0x70) == 0x70 && !(c & 0x08) && cont(1) && cont(2) && cont(3)) {
        uint32_t r = (c & 0x07u) << 18 | byte(1) << 12 | byte(2) << 6 | byte(3);
        off += 4;
        return r;
    }
    off += 1;
    return 0xFFFD;
}

inline std::vector<uint32_t> utf8_to_cps(const std::string& s) {
    std::vector<uint32_t> out;
    out.reserve(s.size());
    for (size_t off = 0; off < s.size();) out.push_back(utf8_decode(s, off));
    return out;
}

inline void utf8_append(std::string& out, uint32_t cp) {
    if (cp > 0x10FFFF) cp = 0xFFFD;  // the reference throws here; a replacement char is kinder
    if (cp < 0x80) {
        out += (char)cp;
    } else if (cp < 0x800) {
        out += (char)(0xC0 | cp >> 6);
        out += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += (char)(0xE0 | cp >> 12);
        out += (char)(0x80 | (cp >> 6 & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    } else {
        out += (char)(0xF0 | cp >> 18);
        out += (char)(0x80 | (cp >> 12 & 0x3F));
        out += (char)(0x80 | (cp >> 6 & 0x3F));
        out += (char)(0x80 | (cp & 0x3F));
    }
}

// ---- GPT-2 byte <-> printable code point mapping ---------------------------------------------------
// Bytes that are printable Latin-1 map to themselves, the other 68 to U+0100.. in byte order.
struct ByteMap {
    std::string encoded[256];     // byte -> UTF-8 of its code point
    int16_t decoded[0x144];       // code point -> byte, -1 if none
    ByteMap() {
        std::fill(std::begin(decoded), std::end(decoded), (int16_t)-1);
        int next = 256;
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            uint32_t cp = printable ? (uint32_t)b : (uint32_t)next++;
            utf8_append(encoded[b], cp);
            decoded[cp] = (int16_t)b;
        }
    }
};
inline const ByteMap& byte_map() {
    static const ByteMap m;
    return m;
}

// ---- Pre-tokenizer ------------------------------------------------------------------------------
// One pass per regular expression of the reference; each pass refines the chunks of the previous one.
enum class Pass : uint8_t {
    Gpt2,               // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)  (reference's hand-written matcher)
    Llama3,             // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    Qwen2,              // the same with \p{N} instead of \p{N}{1,3}
    Number,             // \p{N}
    NumberRun,          // \p{N}+
    Number3,            // \p{N}{1,3}
    PunctFalcon,        // [\p{P}\$\+<=>\^~\|`]+
    PunctDefault,       // [\p{P}\$\+<=>\^~\|]+
    Digits3,            // [0-9][0-9][0-9]
    CrLf,               // [\r\n]
    WsLetters,          // \s?\p{L}+
    WsPunct,            // \s?\p{P}+
    CjkDeepseek,        // [一-龥ࠀ-一가-퟿]+
    WsLettersDeepseek,  // \s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+   (kDeepseekLetterRanges)
    WsPunctDeepseek,    // \s?[!-/:-~！-／：-～‘-‟　-。]+
    TrailingWs,         // \s+$
    CjkDeepseekV3,      // [一-龥぀-ゟ゠-ヿ]+
    DeepseekV3,         // [!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    Gpt4o,              // [^\r\n\p{L}\p{N}]?U*W+C?|[^\r\n\p{L}\p{N}]?U+W*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
                        //   U = ((?=[\p{L}])([^a-z])), W = ((?=[\p{L}])([^A-Z])), C = the contractions of Llama3
    Tekken,             // the same without C and with \p{N}
};

// The code points of one chunk, [begin, end) of the text; reads past the end give kOutOfRange.
struct Chunk {
    const uint32_t* cp;
    size_t end;
    static constexpr uint32_t kOutOfRange = 0xFFFFFFFF;
    uint32_t at(size_t i) const { return i < end ? cp[i] : kOutOfRange; }
    // Category and whitespace bits, plus kFlagValid inside the chunk (0 outside: matches no class).
    uint8_t flags(size_t i) const { return i < end ? (uint8_t)(unicode_flags(cp[i]) | kFlagValid) : 0; }
    // Run of positions from i satisfying pred.
    template <class Pred> size_t run(size_t i, Pred pred) const {
        size_t j = i;
        while (j < end && pred(cp[j])) j++;
        return j - i;
    }
};

inline bool f_letter(uint8_t f) { return (f & 7) == UCAT_LETTER && (f & kFlagValid); }
inline bool f_number(uint8_t f) { return (f & 7) == UCAT_NUMBER && (f & kFlagValid); }
inline bool f_ws(uint8_t f) { return (f & kFlagWhitespace) != 0; }
inline bool f_other(uint8_t f) { return (f & kFlagValid) && !f_ws(f) && !f_letter(f) && !f_number(f); }  // [^\s\p{L}\p{N}]

// Classes as the reference's std::regex sees them on collapsed text (see file comment).
inline bool c_letter(uint32_t cp) { return ucat(cp) == UCAT_LETTER; }
inline bool c_number(uint32_t cp) { return ucat(cp) == UCAT_NUMBER; }
inline bool c_punct(uint32_t cp) { return ucat(cp) == UCAT_PUNCT; }
inline bool c_symbol(uint32_t cp) { return cp != '~' && ucat(cp) == UCAT_SYMBOL; }
inline bool c_mark(uint32_t cp) { return ucat(cp) == UCAT_MARK; }
inline bool is_crlf(uint32_t cp) { return cp == '\r' || cp == '\n'; }
inline bool in_ranges(uint32_t cp, std::initializer_list<std::pair<uint32_t, uint32_t>> r) {
    for (auto& p : r) if (cp >= p.first && cp <= p.second) return true;
    return false;
}
inline bool ds_letter(uint32_t cp) {  // the reference matches these with std::wregex; whitespace never qualifies
    auto it = std::upper_bound(std::begin(kDeepseekLetterRanges), std::end(kDeepseekLetterRanges), cp,
                               [](uint32_t v, const uint32_t (&r)[2]) { return v < r[0]; });
    return it != std::begin(kDeepseekLetterRanges) && cp <= it[-1][1];
}

// "X?Y+" with backtracking: the optional prefix is taken only if a Y follows it.
template <class Opt, class Run>
inline size_t opt_then_run(const Chunk& c, size_t pos, Opt opt, Run run) {
    if (opt(c.cp[pos]) && pos + 1 < c.end && run(c.cp[pos + 1])) return 1 + c.run(pos + 1, run);
    return c.run(pos, run);
}

// Whitespace alternatives shared by the Llama 3 style expressions: \s*[\r\n]+|\s+(?!\S)|\s+
inline size_t match_whitespace(const Chunk& c, size_t pos) {
    size_t n = 0, last_crlf = 0;
    while (f_ws(c.flags(pos + n))) {
        if (is_crlf(c.cp[pos + n])) last_crlf = n + 1;
        n++;
    }
    if (last_crlf) return last_crlf;                 // \s*[\r\n]+
    if (n > 1 && pos + n < c.end) return n - 1;      // \s+(?!\S): leave the last space to the next word
    return n;                                        // \s+
}

// The reference's GPT-2 matcher: never fails (an unmatched character is a chunk of its own).
inline size_t match_gpt2(const Chunk& c, size_t pos) {
    const uint32_t cp = c.cp[pos];
    if (cp == '\'' && pos + 1 < c.end) {
        uint32_t n1 = c.cp[pos + 1];
        if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return 2;
        uint32_t n2 = c.at(pos + 2);
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) return 3;
    }
    size_t p = pos + (cp == ' ');  // optional leading space
    for (auto cls : {f_letter, f_number, f_other}) {
        if (cls(c.flags(p))) {
            while (cls(c.flags(p))) p++;
            return p - pos;
        }
    }
    size_t n = 0;
    while (f_ws(c.flags(pos + n))) n++;
    if (n > 1 && pos + n < c.end) return n - 1;
    return n ? n : 1;
}

// The reference's Llama 3 matcher (max_digits 3); with max_digits 1 it is the Qwen2 expression.
inline size_t match_llama3(const Chunk& c, size_t pos, size_t max_digits) {
    const uint32_t cp = c.cp[pos];
    const uint8_t f = c.flags(pos);
    if (cp == '\'' && pos + 1 < c.end) {  // case-insensitive contractions (no non-ASCII letter lowercases to these)
        auto lower = [](uint32_t x) { return x >= 'A' && x <= 'Z' ? x + 32 : x; };
        uint32_t n1 = lower(c.cp[pos + 1]), n2 = lower(c.at(pos + 2));
        if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return 2;
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) return 3;
    }
    if (!is_crlf(cp) && !f_number(f) && (f_letter(f) || f_letter(c.flags(pos + 1)))) {  // [^\r\n\p{L}\p{N}]?\p{L}+
        size_t p = pos + 1;
        while (f_letter(c.flags(p))) p++;
        return p - pos;
    }
    if (f_number(f)) {  // \p{N}{1,max_digits}
        size_t p = pos;
        while (p - pos < max_digits && f_number(c.flags(p))) p++;
        return p - pos;
    }
    size_t p = pos + (cp == ' ');  //  ?[^\s\p{L}\p{N}]+[\r\n]*
    if (f_other(c.flags(p))) {
        while (f_other(c.flags(p))) p++;
        while (p < c.end && is_crlf(c.cp[p])) p++;
        return p - pos;
    }
    size_t n = match_whitespace(c, pos);
    return n ? n : 1;
}

inline size_t match_deepseek_v3(const Chunk& c, size_t pos) {
    const uint32_t cp = c.cp[pos];
    auto ascii_alpha = [](uint32_t x) { return (x >= 'A' && x <= 'Z') || (x >= 'a' && x <= 'z'); };
    auto ascii_punct = [](uint32_t x) { return (x >= 0x21 && x <= 0x2F) || (x >= 0x3A && x <= 0x40) || (x >= 0x5B && x <= 0x60) || (x >= 0x7B && x <= 0x7E); };
    if (ascii_punct(cp) && pos + 1 < c.end && ascii_alpha(c.cp[pos + 1])) return 1 + c.run(pos + 1, ascii_alpha);
    auto letter_mark = [](uint32_t x) { return c_letter(x) || c_mark(x); };
    auto prefix = [](uint32_t x) { return !is_crlf(x) && !c_letter(x) && !c_punct(x) && !c_symbol(x); };
    if (size_t n = opt_then_run(c, pos, prefix, letter_mark)) return n;
    auto punct_sym = [](uint32_t x) { return c_punct(x) || c_symbol(x); };
    if (size_t n = opt_then_run(c, pos, [](uint32_t x) { return x == ' '; }, punct_sym)) return n + c.run(pos + n, is_crlf);
    return match_whitespace(c, pos);
}

// Llama 4 / GPT-4o and Mistral Tekken: words split at lower-to-upper case changes. "Upper" is any letter but
// a-z and "lower" any letter but A-Z (the reference's rewrite of \p{Lu}.. / \p{Ll}..), so a non-ASCII
// letter is both.
inline size_t match_cased(const Chunk& c, size_t pos, size_t max_digits, bool contractions) {
    auto upper = [](uint32_t x) { return c_letter(x) && !(x >= 'a' && x <= 'z'); };
    auto lower = [](uint32_t x) { return c_letter(x) && !(x >= 'A' && x <= 'Z'); };
    auto contraction = [&](size_t e) -> size_t {
        if (!contractions || c.at(e) != '\'') return 0;
        auto lc = [](uint32_t x) { return x >= 'A' && x <= 'Z' ? x + 32 : x; };
        uint32_t n1 = lc(c.at(e + 1)), n2 = lc(c.at(e + 2));
        if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') return 2;
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) return 3;
        return 0;
    };
    const uint32_t cp = c.cp[pos];
    const bool prefix_ok = !is_crlf(cp) && !c_letter(cp) && !c_number(cp);
    // Alternative 1, U*W+: the longest upper run that a lower letter can follow (backtracking over U*).
    for (size_t s : {pos + 1, pos}) {  // with the optional prefix first, as the greedy ? tries
        if (s == pos + 1 && (!prefix_ok || s >= c.end)) continue;
        const size_t nu = c.run(s, upper);
        for (size_t k = nu + 1; k-- > 0;) {
            if (s + k < c.end && lower(c.cp[s + k])) {
                size_t e = s + k + c.run(s + k, lower);
                return e + contraction(e) - pos;
            }
        }
    }
    // Alternative 2, U+W*.
    for (size_t s : {pos + 1, pos}) {
        if (s == pos + 1 && (!prefix_ok || s >= c.end)) continue;
        if (size_t nu = c.run(s, upper)) {
            size_t e = s + nu + c.run(s + nu, lower);
            return e + contraction(e) - pos;
        }
    }
    if (c_number(cp)) return std::min(max_digits, c.run(pos, c_number));
    size_t p = pos + (cp == ' ');  //  ?[^\s\p{L}\p{N}]+[\r\n/]*
    if (f_other(c.flags(p))) {
        while (f_other(c.flags(p))) p++;
        while (p < c.end && (is_crlf(c.cp[p]) || c.cp[p] == '/')) p++;
        return p - pos;
    }
    return match_whitespace(c, pos);
}

// Length of the match of `pass` at pos (0: no match; the characters then join the gap before the
// next match, as std::regex_iterator leaves them).
inline size_t match_at(Pass pass, const Chunk& c, size_t pos) {
    const uint32_t cp = c.cp[pos];
    auto ws = [](uint32_t x) { return is_ws(x); };
    switch (pass) {
        case Pass::Gpt2: return match_gpt2(c, pos);
        case Pass::Llama3: return match_llama3(c, pos, 3);
        case Pass::Qwen2: return match_llama3(c, pos, 1);
        case Pass::Number: return c_number(cp) ? 1 : 0;
        case Pass::NumberRun: return c.run(pos, c_number);
        case Pass::Number3: return std::min<size_t>(3, c.run(pos, c_number));
        case Pass::PunctFalcon:
        case Pass::PunctDefault: {
            const char* extra = pass == Pass::PunctFalcon ? "$+<=>^~|`" : "$+<=>^~|";
            return c.run(pos, [extra](uint32_t x) { return c_punct(x) || (x < 128 && x && strchr(extra, (int)x)); });
        }
        case Pass::Digits3: {
            auto digit = [&](size_t i) { uint32_t x = c.at(i); return x >= '0' && x <= '9'; };
            return digit(pos) && digit(pos + 1) && digit(pos + 2) ? 3 : 0;
        }
        case Pass::CrLf: return is_crlf(cp) ? 1 : 0;
        case Pass::WsLetters: return opt_then_run(c, pos, ws, c_letter);
        case Pass::WsPunct: return opt_then_run(c, pos, ws, c_punct);
        case Pass::CjkDeepseek:
            return c.run(pos, [](uint32_t x) { return in_ranges(x, {{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}}); });
        case Pass::WsLettersDeepseek: return opt_then_run(c, pos, ws, ds_letter);
        case Pass::WsPunctDeepseek:
            return opt_then_run(c, pos, ws, [](uint32_t x) {
                return in_ranges(x, {{0x21, 0x2F}, {0x3A, 0x7E}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3001, 0x3002}});
            });
        case Pass::CjkDeepseekV3:
            return c.run(pos, [](uint32_t x) { return in_ranges(x, {{0x4E00, 0x9FA5}, {0x3040, 0x309F}, {0x30A0, 0x30FF}}); });
        case Pass::DeepseekV3: return match_deepseek_v3(c, pos);
        case Pass::Gpt4o: return match_cased(c, pos, 3, true);
        case Pass::Tekken: return match_cased(c, pos, 1, false);
        case Pass::TrailingWs: break;  // handled by split_pass
    }
    return 0;
}

// Refines chunk lengths `lens` (in code points) by one pass.
inline void split_pass(const std::vector<uint32_t>& cps, std::vector<size_t>& lens, Pass pass) {
    std::vector<size_t> out;
    out.reserve(lens.size() * 2);
    size_t begin = 0;
    for (size_t len : lens) {
        const size_t end = begin + len;
        auto emit = [&](size_t a, size_t b) { if (b > a) out.push_back(b - a); };
        if (pass == Pass::TrailingWs) {  // \s+$: only the final whitespace run can match
            size_t r = end;
            while (r > begin && is_ws(cps[r - 1])) r--;
            emit(begin, r);
            emit(r, end);
        } else {
            const Chunk c{cps.data(), end};
            size_t gap = begin, pos = begin;
            while (pos < end) {
                size_t n = match_at(pass, c, pos);
                if (n == 0) { pos++; continue; }
                emit(gap, pos);
                emit(pos, pos + n);
                pos += n;
                gap = pos;
            }
            emit(gap, end);
        }
        begin = end;
    }
    lens.swap(out);
}

struct PreTokenizer {
    std::vector<Pass> passes;
    bool clean_spaces = true;
    bool ignore_merges = false;
    bool add_bos = false;
    bool no_bos = false;  // the reference drops the BOS id for this family
};

// The pre-tokenizer of each tokenizer.ggml.pre name the reference knows (the subset whose expressions
// are implemented here). Throws for others.
inline PreTokenizer pre_tokenizer_for(const std::string& name) {
    using P = Pass;
    PreTokenizer t;
    auto is = [&](std::initializer_list<const char*> names) {
        for (const char* n : names) if (name == n) return true;
        return false;
    };
    if (name.empty() || name == "default") {
        t.passes = {P::PunctDefault, P::Gpt2, P::NumberRun, P::Digits3};
    } else if (is({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"})) {
        t.passes = {P::Llama3};
        t.ignore_merges = true;
        t.add_bos = true;
    } else if (is({"dbrx", "smaug-bpe"})) {
        t.passes = {P::Llama3};
    } else if (is({"chatglm-bpe", "glm4"})) {
        t.passes = {P::Llama3};
        t.no_bos = true;
    } else if (name == "deepseek-llm") {
        t.passes = {P::CrLf, P::WsLettersDeepseek, P::WsPunctDeepseek, P::TrailingWs, P::CjkDeepseek, P::NumberRun};
        t.clean_spaces = false;
    } else if (name == "deepseek-coder") {
        t.passes = {P::CrLf, P::WsLetters, P::WsPunct, P::CjkDeepseek, P::Number};
        t.clean_spaces = false;
    } else if (is({"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"})) {
        t.passes = {P::Number3, P::CjkDeepseekV3, P::DeepseekV3};
        t.clean_spaces = false;
    } else if (name == "falcon") {
        t.passes = {P::PunctFalcon, P::Gpt2, P::Digits3};
    } else if (is({"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"})) {
        t.passes = {P::Number, P::Gpt2};
    } else if (is({"smollm", "command-r"})) {
        t.passes = {P::Number, P::Gpt2};
        t.clean_spaces = false;
    } else if (is({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
                   "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4"})) {
        t.passes = {P::Gpt2};
    } else if (is({"trillion", "granite-docling"})) {
        t.passes = {P::Gpt2};
        t.clean_spaces = false;
    } else if (is({"stablelm2", "megrez"})) {
        t.passes = {P::Qwen2};
    } else if (is({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"})) {
        t.passes = {P::Qwen2};
        t.clean_spaces = false;
    } else if (name == "tekken") {
        t.passes = {P::Tekken};
        t.clean_spaces = false;
        t.ignore_merges = true;
        t.add_bos = true;
    } else if (is({"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"})) {
        t.passes = {P::Gpt4o};
        t.clean_spaces = false;
    } else {
        fail("unsupported pre-tokenizer type '%s'", name.c_str());
    }
    return t;
}

// Splits text into words and, for byte-level BPE, maps their bytes to the printable alphabet.
inline std::vector<std::string> pre_tokenize(const std::string& text, const std::vector<Pass>& passes, bool byte_encode) {
    const std::vector<uint32_t> cps = utf8_to_cps(text);
    std::vector<size_t> lens = {cps.size()};
    for (Pass p : passes) split_pass(cps, lens, p);
    std::vector<std::string> words;
    words.reserve(lens.size());
    const ByteMap& bm = byte_map();
    size_t start = 0;
    std::string raw;
    for (size_t len : lens) {
        raw.clear();
        for (size_t i = start; i < start + len; i++) utf8_append(raw, cps[i]);
        start += len;
        if (!byte_encode) {
            words.push_back(raw);
            continue;
        }
        std::string enc;
        enc.reserve(raw.size() * 2);
        for (char ch : raw) enc += bm.encoded[(uint8_t)ch];
        words.push_back(std::move(enc));
    }
    return words;
}

enum class Kind : uint8_t { None, SPM, BPE, WPM };

inline bool is_c_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }  // isspace() in the C locale

} // namespace tokenizer_impl

// ---- Vocabulary data ---------------------------------------------------------------------------
struct VocabData {
    tokenizer_impl::Kind kind = tokenizer_impl::Kind::None;
    std::string model = "no_vocab", pre = "default";
    int32_t n_tokens = 0;
    std::vector<std::string> text;
    std::vector<float> score;
    std::vector<uint32_t> attr;
    std::unordered_map<std::string, int32_t> to_id;
    std::unordered_map<std::string, int32_t> merge_rank;  // "left right" -> rank
    tokenizer_impl::PreTokenizer pretok;
    bool byte_encode = true, escape_whitespaces = false;
    bool add_space_prefix = false, add_bos = false, add_eos = false, add_sep = false, clean_spaces = false;
    size_t max_token_bytes = 0;  // longest token text (WordPiece's match window)
    int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, mask = -1;
    int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
    std::vector<int32_t> eog;       // sorted
    std::vector<int32_t> specials;  // control / user-defined / unknown tokens, longest text first
    // Byte trie over the special tokens' texts, to find which of them occur in a text in one scan.
    std::unordered_map<uint64_t, int32_t> trie_next;  // (node << 8 | byte) -> node
    std::vector<int32_t> trie_token;                  // node -> special token ending there, or -1
    std::vector<std::string> pieces;                  // token_to_piece(id, true)

    int32_t find(const std::string& s) const {
        auto it = to_id.find(s);
        return it == to_id.end() ? -1 : it->second;
    }
    bool valid(int32_t id) const { return id >= 0 && id < (int32_t)text.size(); }
    int32_t byte_to_token(uint8_t b) const;
    std::string piece(int32_t id) const;
    void spm_tokenize(const std::string& text, std::vector<int32_t>& out) const;
    void bpe_tokenize(const std::string& text, std::vector<int32_t>& out) const;
    void wpm_tokenize(const std::string& text, std::vector<int32_t>& out) const;
    struct Fragment { int32_t token; size_t off, len; };  // token -1: raw text [off, off + len)
    std::vector<Fragment> partition(const std::string& text, bool parse_special) const;
};

int32_t VocabData::byte_to_token(uint8_t b) const {
    if (kind == tokenizer_impl::Kind::BPE) return find(tokenizer_impl::byte_map().encoded[b]);
    static const char* hex = "0123456789ABCDEF";
    const char buf[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
    int32_t id = find(buf);
    return id >= 0 ? id : find(std::string(1, (char)b));
}

// token_to_piece with special = true.
std::string VocabData::piece(int32_t id) const {
    const uint32_t a = attr[id];
    const std::string& t = text[id];
    if (a & (TOKEN_ATTR_UNKNOWN | TOKEN_ATTR_CONTROL | TOKEN_ATTR_USER_DEFINED)) return t;
    if (a & TOKEN_ATTR_NORMAL) {
        if (kind == tokenizer_impl::Kind::SPM || kind == tokenizer_impl::Kind::WPM || escape_whitespaces) {  // ▁ = space
            std::string r;
            for (size_t i = 0; i < t.size(); i++) {
                if (t.compare(i, 3, "\xE2\x96\x81") == 0) { r += ' '; i += 2; } else r += t[i];
            }
            return r;
        }
        // byte-level: each code point of the token text is one byte
        std::string r;
        const auto& bm = tokenizer_impl::byte_map();
        for (size_t off = 0; off < t.size();) {
            uint32_t cp = tokenizer_impl::utf8_decode(t, off);
            if (cp < 0x144 && bm.decoded[cp] >= 0) {
                r += (char)bm.decoded[cp];
            } else {  // not a byte-level code point: the reference writes a marker
                std::string u;
                tokenizer_impl::utf8_append(u, cp);
                r += "[UNK_BYTE_0x";
                char buf[4];
                for (char ch : u) { snprintf(buf, sizeof buf, "%02x", (uint8_t)ch); r += buf; }
                r += t + "]";
            }
        }
        return r;
    }
    if (a & TOKEN_ATTR_BYTE) {
        auto hex = [](char h) { return h >= 'a' ? h - 'a' + 10 : h >= 'A' ? h - 'A' + 10 : h - '0'; };
        if (t.size() >= 6) return std::string(1, (char)(hex(t[3]) * 16 + hex(t[4])));  // "<0xAB>"
        return t;
    }
    return "";
}

// SentencePiece: start from UTF-8 characters, repeatedly merge the adjacent pair whose concatenation is
// the highest-scoring token (ties: leftmost), then emit tokens, splitting unknown pieces back along the
// merges that made them and finally into byte tokens.
void VocabData::spm_tokenize(const std::string& s, std::vector<int32_t>& out) const {
    struct Sym { int prev, next; size_t off, n; };
    struct Bigram { int left, right; float score; size_t size; };
    struct Cmp {
        bool operator()(const Bigram& l, const Bigram& r) const {
            return l.score < r.score || (l.score == r.score && l.left > r.left);
        }
    };
    std::vector<Sym> sym;
    for (size_t off = 0; off < s.size();) {
        size_t n = std::min(tokenizer_impl::utf8_len(s[off]), s.size() - off);
        int idx = (int)sym.size();
        sym.push_back({idx - 1, off + n == s.size() ? -1 : idx + 1, off, n});
        off += n;
    }
    std::vector<Bigram> queue;  // a max-heap under Cmp
    std::unordered_map<std::string, std::pair<int, int>> rev_merge;
    auto try_add = [&](int left, int right) {
        if (left < 0 || right < 0) return;
        std::string t = s.substr(sym[left].off, sym[left].n + sym[right].n);
        int32_t id = find(t);
        if (id < 0) return;
        queue.push_back({left, right, score[id], t.size()});
        std::push_heap(queue.begin(), queue.end(), Cmp());
        rev_merge[t] = {left, right};
    };
    for (int i = 1; i < (int)sym.size(); i++) try_add(i - 1, i);
    while (!queue.empty()) {
        std::pop_heap(queue.begin(), queue.end(), Cmp());
        const Bigram b = queue.back();
        queue.pop_back();
        Sym& l = sym[b.left];
        Sym& r = sym[b.right];
        if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
        l.n += r.n;
        r.n = 0;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = b.left;
        try_add(l.prev, b.left);
        try_add(b.left, l.next);
    }
    // Emit symbols left to right; a symbol that is not a token is split along the merge that last produced
    // its text (depth first), and failing that into byte tokens.
    std::vector<int> stack;
    for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
        stack.push_back(i);
        while (!stack.empty()) {
            const int k = stack.back();
            stack.pop_back();
            const std::string t = s.substr(sym[k].off, sym[k].n);
            const int32_t id = find(t);
            if (id >= 0) { out.push_back(id); continue; }
            auto it = rev_merge.find(t);
            if (it != rev_merge.end()) {
                stack.push_back(it->second.second);
                stack.push_back(it->second.first);
                continue;
            }
            for (char ch : t) {
                const int32_t b = byte_to_token((uint8_t)ch);
                if (b >= 0) out.push_back(b);
                else if (unk >= 0) out.push_back(unk);
            }
        }
    }
}

// Byte-level BPE over each pre-tokenized word: merge the adjacent pair with the lowest merge rank
// (ties: leftmost) until none applies.
void VocabData::bpe_tokenize(const std::string& text_in, std::vector<int32_t>& out) const {
    struct Sym { int prev, next; size_t off, n; };
    struct Bigram { int left, right; int rank; size_t size; };
    struct Cmp {
        bool operator()(const Bigram& l, const Bigram& r) const {
            return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
        }
    };
    std::vector<Sym> sym;
    std::vector<Bigram> queue;  // a min-heap on (rank, left) under Cmp
    std::string key;
    for (const std::string& w : tokenizer_impl::pre_tokenize(text_in, pretok.passes, byte_encode)) {
        if (pretok.ignore_merges) {
            int32_t id = find(w);
            if (id >= 0) { out.push_back(id); continue; }
        }
        sym.clear();
        for (size_t off = 0; off < w.size();) {
            size_t n = std::min(tokenizer_impl::utf8_len(w[off]), w.size() - off);
            int idx = (int)sym.size();
            sym.push_back({idx - 1, off + n == w.size() ? -1 : idx + 1, off, n});
            off += n;
        }
        queue.clear();
        auto try_add = [&](int left, int right) {
            if (left < 0 || right < 0) return;
            key.assign(w, sym[left].off, sym[left].n);
            key += ' ';
            key.append(w, sym[right].off, sym[right].n);
            auto it = merge_rank.find(key);
            if (it == merge_rank.end()) return;
            queue.push_back({left, right, it->second, sym[left].n + sym[right].n});
            std::push_heap(queue.begin(), queue.end(), Cmp());
        };
        for (int i = 1; i < (int)sym.size(); i++) try_add(i - 1, i);
        while (!queue.empty()) {
            std::pop_heap(queue.begin(), queue.end(), Cmp());
            const Bigram b = queue.back();
            queue.pop_back();
            Sym& l = sym[b.left];
            Sym& r = sym[b.right];
            // Symbols only grow, so an unchanged total size means the pair is still current.
            if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
            l.n += r.n;
            r.n = 0;
            l.next = r.next;
            if (r.next >= 0) sym[r.next].prev = b.left;
            try_add(l.prev, b.left);
            try_add(b.left, l.next);
        }
        for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
            std::string t = w.substr(sym[i].off, sym[i].n);
            int32_t id = find(t);
            if (id >= 0) { out.push_back(id); continue; }
            // Not a token: the reference looks up each byte of the (encoded) text on its own.
            for (char ch : t) {
                int32_t b;
                if (byte_encode) {
                    b = find(std::string(1, ch));
                } else {
                    static const char* hex = "0123456789ABCDEF";
                    const char buf[7] = {'<', '0', 'x', hex[(uint8_t)ch >> 4], hex[ch & 15], '>', 0};
                    b = find(buf);
                }
                if (b >= 0) out.push_back(b);
            }
        }
    }
}

// Splits text around special tokens: longest token text first, each claiming all its occurrences in the
// remaining raw fragments (llama.cpp's tokenizer_st_partition). Control and unknown tokens only when
// parse_special; user-defined ones always.
std::vector<VocabData::Fragment> VocabData::partition(const std::string& s, bool parse_special) const {
    std::vector<Fragment> frags;
    if (s.empty()) return frags;
    frags.push_back({-1, 0, s.size()});
    if (specials.empty()) return frags;
    // Which special tokens occur at all? One trie walk from every position.
    std::vector<uint8_t> present(text.size(), 0);
    bool any = false;
    for (size_t i = 0; i < s.size(); i++) {
        int32_t node = 0;
        for (size_t j = i; j < s.size(); j++) {
            auto it = trie_next.find((uint64_t)node << 8 | (uint8_t)s[j]);
            if (it == trie_next.end()) break;
            node = it->second;
            if (trie_token[node] >= 0) present[trie_token[node]] = 1, any = true;
        }
    }
    if (!any) return frags;
    for (int32_t id : specials) {
        if (!present[id]) continue;
        const uint32_t a = attr[id];
        if (!parse_special && (a & (TOKEN_ATTR_CONTROL | TOKEN_ATTR_UNKNOWN))) continue;
        const std::string& tok = text[id];
        std::vector<Fragment> next;
        for (const Fragment& f : frags) {
            if (f.token >= 0) { next.push_back(f); continue; }
            size_t off = f.off, len = f.len;
            while (true) {
                size_t m = std::string_view(s.data(), off + len).find(tok, off);
                if (m == std::string::npos) { next.push_back({-1, off, len}); break; }
                size_t left_len = m - off;
                if (a & TOKEN_ATTR_LSTRIP)
                    while (left_len > 0 && tokenizer_impl::is_c_space(s[off + left_len - 1])) left_len--;
                if (left_len > 0) next.push_back({-1, off, left_len});
                next.push_back({id, 0, 0});
                size_t r_off = m + tok.size(), r_len = off + len - r_off;
                if (a & TOKEN_ATTR_RSTRIP)
                    while (r_len > 0 && tokenizer_impl::is_c_space(s[r_off])) r_off++, r_len--;
                if (r_len == 0) break;
                off = r_off;
                len = r_len;
            }
        }
        frags.swap(next);
    }
    return frags;
}

// ---- Vocab -----------------------------------------------------------------------------------------
// WordPiece (BERT), as the reference: NFD-first code points, lowercased, controls dropped; words split at
// whitespace, with every punctuation mark, ASCII symbol and CJK ideograph a word of its own. Each word,
// "▁"-prefixed, becomes its longest matching tokens from the left; a word with an unmatched rest is one
// unknown token.
void VocabData::wpm_tokenize(const std::string& text, std::vector<int32_t>& out) const {
    using namespace tokenizer_impl;
    std::vector<std::string> words(1);
    for (size_t off = 0; off < text.size();) {
        const uint32_t cp = unicode_nfd_first(utf8_decode(text, off));
        const UCat cat = ucat(cp);
        if (is_ws(cp)) {
            if (!words.back().empty()) words.emplace_back();
            continue;
        }
        if (cp == 0 || cp == 0xFFFD || cat == UCAT_CONTROL || cat == UCAT_OTHER) continue;  // \p{C}
        std::string ch;
        utf8_append(ch, unicode_lower(cp));
        if (cat == UCAT_PUNCT || (cp < 0x7F && cat == UCAT_SYMBOL) || is_cjk_ideograph(cp)) {
            if (!words.back().empty()) words.emplace_back();
            words.back() = ch;
            words.emplace_back();
        } else {
            words.back() += ch;
        }
    }
    for (const std::string& w : words) {
        if (w.empty()) continue;
        const std::string word = "\xE2\x96\x81" + w;
        const size_t start = out.size();
        for (size_t i = 0; i < word.size();) {
            size_t j = std::min(word.size(), i + max_token_bytes + 1);
            int32_t id = -1;
            for (; j > i && (id = find(word.substr(i, j - i))) < 0; j--) {}
            if (id < 0) {
                out.resize(start);
                break;
            }
            out.push_back(id);
            i = j;
        }
        if (out.size() == start) out.push_back(unk);
    }
}

namespace tokenizer_impl {

// Special token ids: defaults per tokenizer model, then metadata (out-of-range ids are ignored).
inline void read_special_ids(const GGUF& g, VocabData& d) {
    const int32_t n = (int32_t)d.text.size();
    struct Key { const char* key; int32_t* id; };
    const Key keys[] = {
        {"tokenizer.ggml.bos_token_id", &d.bos}, {"tokenizer.ggml.eos_token_id", &d.eos},
        {"tokenizer.ggml.eot_token_id", &d.eot}, {"tokenizer.ggml.eom_token_id", &d.eom},
        {"tokenizer.ggml.unknown_token_id", &d.unk}, {"tokenizer.ggml.seperator_token_id", &d.sep},
        {"tokenizer.ggml.padding_token_id", &d.pad}, {"tokenizer.ggml.mask_token_id", &d.mask},
        {"tokenizer.ggml.fim_pre_token_id", &d.fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &d.fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &d.fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &d.fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &d.fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &d.fim_sep},
        {"tokenizer.ggml.prefix_token_id", &d.fim_pre}, {"tokenizer.ggml.suffix_token_id", &d.fim_suf},
        {"tokenizer.ggml.middle_token_id", &d.fim_mid},
    };
    for (const Key& k : keys) {
        if (*k.id >= n) *k.id = -1;
        const GGUFValue* v = g.find(k.key);
        if (!v || v->is_array() || v->type == GGUFValueType::STRING) continue;
        int64_t id = g.get_int(k.key, -1);
        if (id >= 0 && id < n) *k.id = (int32_t)id;
    }
}

constexpr const char* kDeepseekEndOfSentence = "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";  // <｜end▁of▁sentence｜>

// Tokens recognised by their text, as the reference does (its converters do not always record them).
inline void detect_special_tokens(VocabData& d) {
    auto mark_control = [&](int32_t id) { d.attr[id] |= TOKEN_ATTR_CONTROL; };
    struct Rule { int32_t* id; std::vector<const char*> names; };
    const Rule rules[] = {
        {&d.eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
                  "_<EOT>", "[EOT]", kDeepseekEndOfSentence, "<end_of_utterance>"}},
        {&d.eom, {"<|eom_id|>"}},
        {&d.fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", ("<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>"),
                      "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"}},
        {&d.fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", ("<\xEF\xBD\x9C" "fim\xE2\x96\x81hole\xEF\xBD\x9C>"),
                      "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"}},
        {&d.fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", ("<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>"),
                      "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"}},
        {&d.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
        {&d.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
        {&d.fim_sep, {"<|file_sep|>"}},
    };
    // In id order (the reference walks a hash map, so which of several candidates wins is arbitrary there).
    for (const Rule& r : rules) {
        if (*r.id >= 0) continue;
        for (int32_t id = 0; id < (int32_t)d.text.size() && *r.id < 0; id++) {
            for (const char* name : r.names) {
                if (d.text[id] == name) { *r.id = id; mark_control(id); break; }
            }
        }
    }

    std::vector<int32_t> eog;
    for (int32_t id : {d.fim_pad, d.fim_rep, d.fim_sep}) if (id >= 0) eog.push_back(id);
    static const char* const eog_names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
        "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        kDeepseekEndOfSentence, "[e~[",
    };
    for (const char* name : eog_names) {
        int32_t id = d.find(name);
        if (id >= 0) { eog.push_back(id); mark_control(id); }
    }
    // gpt-oss: these structure tokens are rendered as text
    for (const char* name : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
        int32_t id = d.find(name);
        if (id >= 0) d.attr[id] = TOKEN_ATTR_USER_DEFINED;
    }
    for (int32_t id : {d.eos, d.eot, d.eom}) if (id >= 0) eog.push_back(id);
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    auto has = [&](const char* name) {
        for (int32_t id : eog) if (d.text[id] == name) return id;
        return -1;
    };
    // o200k_harmony / solar-open: <|end|> ends a message, not the generation
    if (has("<|end|>") >= 0 && ((has("<|return|>") >= 0 && has("<|call|>") >= 0) ||
                                (has("<|calls|>") >= 0 && has("<|flush|>") >= 0))) {
        int32_t id = has("<|end|>");
        eog.erase(std::find(eog.begin(), eog.end(), id));
        d.attr[id] = TOKEN_ATTR_USER_DEFINED;
    }
    // Gemma 4: </s> is an ordinary token there
    if (has("<|tool_response>") >= 0 && has("</s>") >= 0) {
        int32_t id = has("</s>");
        eog.erase(std::find(eog.begin(), eog.end(), id));
        d.attr[id] = TOKEN_ATTR_NORMAL;
    }
    d.eog = eog;
}

} // namespace tokenizer_impl

Vocab::Vocab(const GGUF& g) {
    using namespace tokenizer_impl;
    auto d = std::make_shared<VocabData>();
    d->model = g.get_str("tokenizer.ggml.model", "no_vocab");
    const std::string pre = g.get_str("tokenizer.ggml.pre", "");
    if (d->model == "no_vocab" || d->model == "none") {
        const std::string arch = g.get_str("general.architecture", "");
        d->model = "no_vocab";
        d->n_tokens = (int32_t)std::max<int64_t>(0, g.get_int(arch + ".vocab_size", 0));
        d_ = d;
        return;
    }
    if (d->model == "llama") {
        d->kind = Kind::SPM;
        d->bos = 1, d->eos = 2, d->unk = 0;
        d->add_space_prefix = true;
        d->add_bos = true;
        d->clean_spaces = false;
    } else if (d->model == "gpt2") {
        d->kind = Kind::BPE;
        d->bos = 11, d->eos = 11;
        d->pre = pre.empty() ? "default" : pre;
        d->pretok = pre_tokenizer_for(pre);
        d->clean_spaces = d->pretok.clean_spaces;
        d->add_bos = d->pretok.add_bos;
        if (d->pretok.no_bos) d->bos = -1;
    } else if (d->model == "bert") {
        d->kind = Kind::WPM;
        d->bos = 101, d->unk = 100, d->sep = 102, d->pad = 0, d->mask = 103;  // [CLS] [UNK] [SEP] [PAD] [MASK]
        d->add_bos = d->add_sep = true;
        d->pre = pre.empty() ? "default" : pre;
    } else {
        fail("unsupported tokenizer model '%s'", d->model.c_str());
    }
    d->add_space_prefix = g.get_bool("tokenizer.ggml.add_space_prefix", d->add_space_prefix);

    const GGUFValue* tokens = g.find("tokenizer.ggml.tokens");
    if (!tokens || !tokens->is_array() || tokens->elem_type != GGUFValueType::STRING)
        fail("tokenizer.ggml.tokens missing or not an array of strings");
    const size_t n = tokens->arr_str.size();
    if (n == 0 || n > (size_t)INT32_MAX / 2) fail("tokenizer.ggml.tokens: bad token count %zu", n);
    auto numeric_array = [&](const char* key) -> const std::vector<double>* {
        const GGUFValue* v = g.find(key);
        if (!v) return nullptr;
        if (!v->is_array() || v->elem_type == GGUFValueType::STRING || v->elem_type == GGUFValueType::ARRAY)
            fail("%s is not a numeric array", key);
        if (v->arr_num.size() < n) fail("%s has %zu entries for %zu tokens", key, v->arr_num.size(), n);
        return &v->arr_num;
    };
    const std::vector<double>* scores = numeric_array("tokenizer.ggml.scores");
    const std::vector<double>* types = numeric_array("tokenizer.ggml.token_type");

    d->n_tokens = (int32_t)n;
    d->text.resize(n);
    d->score.assign(n, 0.0f);
    d->attr.assign(n, TOKEN_ATTR_NORMAL);
    d->to_id.reserve(n);
    for (size_t i = 0; i < n; i++) {
        std::string t = tokens->arr_str[i];
        if (t.empty()) t = "[EMPTY_" + std::to_string(i) + "]";
        if (!d->to_id.emplace(t, (int32_t)i).second)
            fail("duplicate token in vocabulary: '%s' has ids %d and %zu", t.c_str(), d->to_id[t], i);
        d->text[i] = std::move(t);
        if (scores) d->score[i] = (float)(*scores)[i];
        if (types) {
            static const uint32_t type_to_attr[7] = {TOKEN_ATTR_UNDEFINED, TOKEN_ATTR_NORMAL, TOKEN_ATTR_UNKNOWN,
                                                     TOKEN_ATTR_CONTROL, TOKEN_ATTR_USER_DEFINED, TOKEN_ATTR_UNUSED, TOKEN_ATTR_BYTE};
            double ty = (*types)[i];
            d->attr[i] = ty >= 0 && ty <= 6 ? type_to_attr[(int)ty] : TOKEN_ATTR_UNDEFINED;
        }
    }

    if (d->kind == Kind::BPE) {
        const GGUFValue* merges = g.find("tokenizer.ggml.merges");
        if (!merges || !merges->is_array() || merges->elem_type != GGUFValueType::STRING)
            fail("tokenizer.ggml.merges missing or not an array of strings");
        d->merge_rank.reserve(merges->arr_str.size());
        for (size_t i = 0; i < merges->arr_str.size(); i++) {
            const std::string& m = merges->arr_str[i];
            size_t sp = m.find(' ', 1);
            // A merge without a separator pairs "" with "" in the reference: it can never apply.
            if (sp == std::string::npos) continue;
            d->merge_rank.emplace(m, (int32_t)i);  // first occurrence wins
        }
    }

    read_special_ids(g, *d);
    d->add_bos = g.get_bool("tokenizer.ggml.add_bos_token", d->add_bos);
    d->add_eos = g.get_bool("tokenizer.ggml.add_eos_token", d->add_eos);
    d->add_sep = g.get_bool("tokenizer.ggml.add_sep_token", d->add_sep);
    if (d->add_sep && d->sep < 0) fail("tokenizer.ggml.add_sep_token is true, but there is no separator token");
    if (d->add_bos && d->bos < 0) fail("tokenizer.ggml.add_bos_token is true, but there is no BOS token");
    if (d->add_eos && d->eos < 0) fail("tokenizer.ggml.add_eos_token is true, but there is no EOS token");
    detect_special_tokens(*d);

    for (int32_t id = 0; id < d->n_tokens; id++)
        if (d->attr[id] & (TOKEN_ATTR_CONTROL | TOKEN_ATTR_USER_DEFINED | TOKEN_ATTR_UNKNOWN)) d->specials.push_back(id);
    std::stable_sort(d->specials.begin(), d->specials.end(),
                     [&](int32_t a, int32_t b) { return d->text[a].size() > d->text[b].size(); });
    d->trie_token.push_back(-1);
    for (int32_t id : d->specials) {
        int32_t node = 0;
        for (char ch : d->text[id]) {
            auto ins = d->trie_next.emplace((uint64_t)node << 8 | (uint8_t)ch, (int32_t)d->trie_token.size());
            if (ins.second) d->trie_token.push_back(-1);
            node = ins.first->second;
        }
        d->trie_token[node] = id;
    }

    for (const std::string& t : d->text) d->max_token_bytes = std::max(d->max_token_bytes, t.size());
    d->pieces.resize(n);
    for (int32_t id = 0; id < d->n_tokens; id++) d->pieces[id] = d->piece(id);

    // Per-model attributes the reference sets by name (they only change how specials are parsed).
    std::string name = g.get_str("general.name", "");
    for (char& ch : name) ch = (char)tolower((unsigned char)ch);
    auto set_attr = [&](const char* tok, uint32_t bit, bool on) {
        int32_t id = d->find(tok);
        if (id >= 0) d->attr[id] = on ? (d->attr[id] | bit) : (d->attr[id] & ~bit);
    };
    const std::string arch = g.get_str("general.architecture", "");
    if (pre.find("jina-v2-de") != std::string::npos || pre.find("jina-v2-es") != std::string::npos ||
        pre.find("jina-v2-code") != std::string::npos || arch.find("nomic-bert-moe") != std::string::npos ||
        arch.find("jina-bert-v3") != std::string::npos) {
        set_attr("<mask>", TOKEN_ATTR_LSTRIP, true);
    } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
        for (int32_t id : d->specials) d->attr[id] |= TOKEN_ATTR_RSTRIP;
        set_attr("</s>", TOKEN_ATTR_RSTRIP, true);
        for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(t, TOKEN_ATTR_RSTRIP, false);
    } else if (name.find("modern-bert") != std::string::npos) {
        set_attr("[MASK]", TOKEN_ATTR_LSTRIP, true);
    }
    d_ = d;
}

std::vector<int32_t> Vocab::tokenize(const std::string& text, bool add_special, bool parse_special) const {
    using tokenizer_impl::Kind;
    if (!has_tokenizer()) fail("tokenize: the model has no vocabulary");
    const VocabData& d = *d_;
    std::vector<int32_t> out;
    const auto frags = d.partition(text, parse_special);
    if (add_special && d.add_bos) out.push_back(d.bos);
    bool prev_special = true;  // SentencePiece: a space is prefixed to text at the start and after specials
    for (const auto& f : frags) {
        if (f.token >= 0) {
            out.push_back(f.token);
            prev_special = true;
            continue;
        }
        std::string t = text.substr(f.off, f.len);
        if (d.kind == Kind::SPM) {
            if (d.add_space_prefix && prev_special) t.insert(t.begin(), ' ');
            std::string esc;
            esc.reserve(t.size() + 16);
            for (char ch : t) {
                if (ch == ' ') esc += "\xE2\x96\x81"; else esc += ch;
            }
            d.spm_tokenize(esc, out);
        } else if (d.kind == Kind::WPM) {
            d.wpm_tokenize(t, out);
        } else {
            d.bpe_tokenize(t, out);
        }
        prev_special = false;
    }
    if (add_special && d.add_eos) out.push_back(d.eos);
    if (add_special && d.add_sep) out.push_back(d.sep);
    return out;
}

std::string Vocab::token_to_piece(int32_t id, bool special) const {
    if (!d_ || !d_->valid(id)) return "";
    if (!special && (d_->attr[id] & (TOKEN_ATTR_UNKNOWN | TOKEN_ATTR_CONTROL))) return "";
    return d_->pieces[id];
}

std::string Vocab::detokenize(const std::vector<int32_t>& ids, bool special) const {
    if (!has_tokenizer()) return "";
    const VocabData& d = *d_;
    std::string s;
    bool remove_space = d.add_space_prefix;  // only the very first token's leading space
    for (int32_t id : ids) {
        std::string p = token_to_piece(id, special);
        if (remove_space && !p.empty() && p[0] == ' ') p.erase(0, 1);
        remove_space = false;
        s += p;
    }
    if (!d.clean_spaces) return s;
    // The reference's three clean-up passes over the text, ported as they are (in place, with `total` as
    // the write index): " ?" " !" " ." " ," lose the space; " ' " loses both; " 's" " 'm" " 're" " 've"
    // lose the space.
    int32_t total = (int32_t)s.size();
    {
        const int32_t total1 = total;
        total = total ? 1 : 0;
        for (int32_t i = 1; i < total1; ++i) {
            const char x = s[i];
            if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
            s[total++] = x;
        }
    }
    {
        const int32_t total2 = total;
        total = total ? 1 : 0;
        for (int32_t i = 1; i < total2; ++i) {
            const char x = s[i];
            if (x == '\'' && i + 1 < total2 && s[i - 1] == ' ' && s[i + 1] == ' ') {
                total--;
                s[++i] = '\0';
            }
            s[total++] = x;
        }
    }
    {
        const int32_t total3 = total;
        total = total ? 1 : 0;
        for (int32_t i = 1; i < total3; ++i) {
            const char x = s[i];
            if (s[i - 1] == ' ' && x == '\'' && i + 1 < total3) {
                const char x1 = s[i + 1];
                if (x1 == 's' || x1 == 'm') {
                    total--;
                } else if (x1 != 't' && x1 != 'd' && i + 2 < total3) {
                    const char x2 = s[i + 2];
                    if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
                }
            }
            s[total++] = x;
        }
    }
    s.resize(total);
    return s;
}

int32_t Vocab::n_tokens() const { return d_ ? d_->n_tokens : 0; }
int32_t Vocab::bos() const { return d_ ? d_->bos : -1; }
int32_t Vocab::eos() const { return d_ ? d_->eos : -1; }
int32_t Vocab::eot() const { return d_ ? d_->eot : -1; }
int32_t Vocab::eom() const { return d_ ? d_->eom : -1; }
int32_t Vocab::unk() const { return d_ ? d_->unk : -1; }
int32_t Vocab::pad() const { return d_ ? d_->pad : -1; }
int32_t Vocab::sep() const { return d_ ? d_->sep : -1; }
int32_t Vocab::fim_pre() const { return d_ ? d_->fim_pre : -1; }
int32_t Vocab::fim_suf() const { return d_ ? d_->fim_suf : -1; }
int32_t Vocab::fim_mid() const { return d_ ? d_->fim_mid : -1; }
int32_t Vocab::fim_pad() const { return d_ ? d_->fim_pad : -1; }
int32_t Vocab::fim_rep() const { return d_ ? d_->fim_rep : -1; }
int32_t Vocab::fim_sep() const { return d_ ? d_->fim_sep : -1; }
bool Vocab::add_bos() const { return d_ && d_->add_bos; }
bool Vocab::add_eos() const { return d_ && d_->add_eos; }
bool Vocab::add_sep() const { return d_ && d_->add_sep; }
bool Vocab::add_space_prefix() const { return d_ && d_->add_space_prefix; }
bool Vocab::clean_spaces() const { return d_ && d_->clean_spaces; }
bool Vocab::is_eog(int32_t id) const { return d_ && std::binary_search(d_->eog.begin(), d_->eog.end(), id); }
const std::vector<int32_t>& Vocab::eog_ids() const {
    static const std::vector<int32_t> none;
    return d_ ? d_->eog : none;
}
bool Vocab::is_control(int32_t id) const { return (token_attr(id) & TOKEN_ATTR_CONTROL) != 0; }
uint32_t Vocab::token_attr(int32_t id) const { return d_ && d_->valid(id) ? d_->attr[id] : 0; }
const std::string& Vocab::token_text(int32_t id) const {
    static const std::string none;
    return d_ && d_->valid(id) ? d_->text[id] : none;
}
float Vocab::token_score(int32_t id) const { return d_ && d_->valid(id) ? d_->score[id] : 0.0f; }
int32_t Vocab::find_token(const std::string& text) const { return d_ ? d_->find(text) : -1; }
const std::string& Vocab::model_type() const {
    static const std::string none = "no_vocab";
    return d_ ? d_->model : none;
}
const std::string& Vocab::pre_type() const {
    static const std::string none = "default";
    return d_ ? d_->pre : none;
}
bool Vocab::has_tokenizer() const { return d_ && d_->kind != tokenizer_impl::Kind::None; }
// ============================================================================================
// 11. Chat templates (see the API comments):
//   11a-11h  the Jinja interpreter: values and JSON, lexer, syntax tree, parser, evaluation,
//            builtins, statements, rendering a chat request
//   11i      tool calls and reasoning in generated text
//   then     the family renderers: each follows its Jinja template statement by statement, so the
//            edge cases (where a system turn goes, what is trimmed, when the generation prompt is
//            skipped) match the original.
// ============================================================================================

namespace chat_detail {

// ---- Python string semantics used by the templates ----------------------------------------

// Byte length of the Python-whitespace character (str.isspace) starting at s[i], 0 if none.
// Templates use Jinja's `trim` and Python's strip()/rstrip(), which strip Unicode whitespace too.
inline size_t space_at(const std::string& s, size_t i) {
    auto b = [&](size_t k) { return i + k < s.size() ? (unsigned char)s[i + k] : 0u; };
    unsigned c = b(0);
    if ((c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20)) return 1;
    if (c == 0xc2 && (b(1) == 0x85 || b(1) == 0xa0)) return 2;                          // U+0085 U+00A0
    if (c == 0xe1 && b(1) == 0x9a && b(2) == 0x80) return 3;                            // U+1680
    if (c == 0xe2 && b(1) == 0x80 && ((b(2) >= 0x80 && b(2) <= 0x8a) || b(2) == 0xa8 || b(2) == 0xa9 || b(2) == 0xaf))
        return 3;                                                                       // U+2000-200A 2028 2029 202F
    if (c == 0xe2 && b(1) == 0x81 && b(2) == 0x9f) return 3;                            // U+205F
    if (c == 0xe3 && b(1) == 0x80 && b(2) == 0x80) return 3;                            // U+3000
    return 0;
}

// Byte length of the whitespace character that ends exactly at s[end), 0 if none.
inline size_t space_before(const std::string& s, size_t end) {
    for (size_t n = 1; n <= 3 && n <= end; n++)
        if (space_at(s, end - n) == n) return n;
    return 0;
}

inline std::string py_lstrip(const std::string& s) {
    size_t i = 0, n;
    while (i < s.size() && (n = space_at(s, i)) != 0) i += n;
    return s.substr(i);
}
inline std::string py_rstrip(const std::string& s) {
    size_t e = s.size(), n;
    while (e > 0 && (n = space_before(s, e)) != 0) e -= n;
    return s.substr(0, e);
}
inline std::string py_strip(const std::string& s) { return py_lstrip(py_rstrip(s)); }  // Jinja `trim`

// str.lstrip(c) / rstrip(c) / strip(c) for one ASCII character (the templates strip '\n').
inline std::string lstrip_char(const std::string& s, char c) {
    size_t i = 0;
    while (i < s.size() && s[i] == c) i++;
    return s.substr(i);
}
inline std::string rstrip_char(const std::string& s, char c) {
    size_t e = s.size();
    while (e > 0 && s[e - 1] == c) e--;
    return s.substr(0, e);
}
inline std::string strip_char(const std::string& s, char c) { return lstrip_char(rstrip_char(s, c), c); }

inline bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }
inline bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
inline bool ends_with(const std::string& s, const std::string& p) {
    return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// s.split(sep)[-1] and s.split(sep)[0]
inline std::string after_last(const std::string& s, const std::string& sep) {
    size_t p = s.rfind(sep);
    return p == std::string::npos ? s : s.substr(p + sep.size());
}
inline std::string before_first(const std::string& s, const std::string& sep) {
    size_t p = s.find(sep);
    return p == std::string::npos ? s : s.substr(0, p);
}

// str.replace(old, "")
inline std::string erase_all(std::string s, const std::string& old) {
    for (size_t p; (p = s.find(old)) != std::string::npos;) s.erase(p, old.size());
    return s;
}

// Python's json.dumps(s, ensure_ascii=...) of a string, appended to out.
inline void json_append_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out += '"';
    char buf[16];
    for (size_t off = 0; off < s.size();) {
        const size_t start = off;
        const uint32_t cp = tokenizer_impl::utf8_decode(s, off);
        switch (cp) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
                if (cp >= 0x10000) {
                    snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
                } else {
                    snprintf(buf, sizeof buf, "\\u%04x", cp);
                }
                out += buf;
            } else {
                out.append(s, start, off - start);
            }
        }
    }
    out += '"';
}

// Hugging Face's `tojson` of a string: json.dumps(s, ensure_ascii=False).
inline std::string json_quote(const std::string& s) {
    std::string out;
    json_append_string(out, s, false);
    return out;
}

// ---- JSON text: the one reader ---------------------------------------------------------------

// Strict JSON (RFC 8259) read into what a Builder makes, so each user keeps its own value type: the
// Jinja engine gets Values, the JSON-schema converter values that keep number literals as written.
// A Builder has a Node type and null(), boolean(b), number(literal, integral), string(s),
// array(nodes) and object(members). A repeated member name keeps its first place and the last value
// (as Python's json.loads); nesting and container sizes are bounded; errors are Error("JSON: ...").
template <class Builder>
class JsonReader {
public:
    using Node = typename Builder::Node;
    JsonReader(const std::string& text, Builder& builder, int max_depth, size_t max_items)
        : s_(text), b_(builder), max_depth_(max_depth), max_items_(max_items) {}

    Node read_document() {
        Node v = read_value(0);
        skip_space();
        if (pos_ != s_.size()) fail("trailing characters");
        return v;
    }

private:
    const std::string& s_;
    Builder& b_;
    const int max_depth_;
    const size_t max_items_;
    size_t pos_ = 0;

    [[noreturn]] void fail(const std::string& what) const {
        throw Error("JSON: " + what + " at byte " + std::to_string(pos_));
    }
    void skip_space() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) pos_++;
    }
    bool take(char c) {
        skip_space();
        if (pos_ < s_.size() && s_[pos_] == c) {
            pos_++;
            return true;
        }
        return false;
    }
    void expect(char c) {
        if (!take(c)) fail(std::string("expected '") + c + "'");
    }
    bool take_word(const char* w) {
        const size_t n = std::strlen(w);
        if (s_.compare(pos_, n, w) != 0) return false;
        pos_ += n;
        return true;
    }

    Node read_value(int depth) {
        if (depth > max_depth_) fail("nested more than " + std::to_string(max_depth_) + " deep");
        skip_space();
        if (pos_ >= s_.size()) fail("unexpected end");
        const char c = s_[pos_];
        if (c == '{') return read_object(depth);
        if (c == '[') return read_array(depth);
        if (c == '"') return b_.string(read_string());
        if (take_word("true")) return b_.boolean(true);
        if (take_word("false")) return b_.boolean(false);
        if (take_word("null")) return b_.null();
        if (c == '-' || (c >= '0' && c <= '9')) return read_number();
        fail("unexpected character");
    }

    Node read_object(int depth) {
        pos_++;
        std::vector<std::pair<std::string, Node>> members;
        std::unordered_map<std::string, size_t> index;  // name -> its place in members
        if (take('}')) return b_.object(std::move(members));
        do {
            skip_space();
            if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a member name");
            std::string key = read_string();
            expect(':');
            Node val = read_value(depth + 1);
            auto [it, added] = index.emplace(key, members.size());
            if (added) members.emplace_back(std::move(key), std::move(val));
            else members[it->second].second = std::move(val);
            if (members.size() > max_items_) fail("object too large");
        } while (take(','));
        expect('}');
        return b_.object(std::move(members));
    }

    Node read_array(int depth) {
        pos_++;
        std::vector<Node> items;
        if (take(']')) return b_.array(std::move(items));
        do {
            items.push_back(read_value(depth + 1));
            if (items.size() > max_items_) fail("array too large");
        } while (take(','));
        expect(']');
        return b_.array(std::move(items));
    }

    uint32_t read_hex4() {
        if (pos_ + 4 > s_.size()) fail("bad \\u escape");
        uint32_t v = 0;
        for (int i = 0; i < 4; i++) {
            const char h = s_[pos_++];
            v = v * 16 + (uint32_t)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                   : h >= 'A' && h <= 'F' ? h - 'A' + 10 : (fail("bad \\u escape"), 0));
        }
        return v;
    }

    std::string read_string() {
        pos_++;  // opening quote
        std::string out;
        while (true) {
            if (pos_ >= s_.size()) fail("unterminated string");
            const char c = s_[pos_++];
            if (c == '"') return out;
            if ((unsigned char)c < 0x20) fail("control character in string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (pos_ >= s_.size()) fail("unterminated string");
            const char e = s_[pos_++];
            switch (e) {
            case '"': out += '"'; break;
            case '\\': out += '\\'; break;
            case '/': out += '/'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'n': out += '\n'; break;
            case 'r': out += '\r'; break;
            case 't': out += '\t'; break;
            case 'u': {
                uint32_t cp = read_hex4();
                if (cp >= 0xd800 && cp < 0xdc00 && s_.compare(pos_, 2, "\\u") == 0) {
                    const size_t save = pos_;
                    pos_ += 2;
                    const uint32_t low = read_hex4();
                    if (low >= 0xdc00 && low < 0xe000) cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
                    else pos_ = save;
                }
                tokenizer_impl::utf8_append(out, cp);
                break;
            }
            default: fail("bad escape");
            }
        }
    }

    Node read_number() {
        const size_t start = pos_;
        if (s_[pos_] == '-') pos_++;
        auto digits = [&] {
            const size_t d = pos_;
            while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') pos_++;
            if (pos_ == d) fail("bad number");
        };
        digits();
        bool integral = true;
        if (pos_ < s_.size() && s_[pos_] == '.') {
            pos_++;
            digits();
            integral = false;
        }
        if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
            pos_++;
            if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) pos_++;
            digits();
            integral = false;
        }
        return b_.number(s_.substr(start, pos_ - start), integral);
    }
};

[[noreturn]] inline void template_error(const std::string& msg) { throw Error(msg); }

using Msgs = std::vector<ChatMessage>;

// `enable_thinking` as the templates test it: undefined counts as falsy in `if enable_thinking`.
inline bool truthy(int tri) { return tri == 1; }

// ---- ChatML family -------------------------------------------------------------------------

inline std::string im(const std::string& role, const std::string& content) {
    return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
}

// Plain ChatML, optionally with a default system turn when the first message is not a system one
// (SmolLM2, Qwen2: `{% if loop.first and messages[0]['role'] != 'system' %}`).
inline std::string render_chatml(const Msgs& m, const ChatOptions& o, const char* default_system) {
    std::string out;
    if (default_system && m[0].role != "system") out += im("system", default_system);
    for (auto& x : m) out += im(x.role, x.content);
    if (o.add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

// Qwen 2.5 and Qwen 3 group consecutive tool results into one user turn.
inline void qwen_tool(std::string& out, const Msgs& m, size_t i) {
    if (i == 0 || m[i - 1].role != "tool") out += "<|im_start|>user";
    out += "\n<tool_response>\n" + m[i].content + "\n</tool_response>";
    if (i + 1 == m.size() || m[i + 1].role != "tool") out += "<|im_end|>\n";
}

inline std::string render_qwen25(const Msgs& m, const ChatOptions& o) {
    std::string out = m[0].role == "system"
        ? im("system", m[0].content)
        : im("system", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    for (size_t i = 0; i < m.size(); i++) {
        const std::string& r = m[i].role;
        if (r == "user" || (r == "system" && i > 0) || r == "assistant") out += im(r, m[i].content);
        else if (r == "tool") qwen_tool(out, m, i);
    }
    if (o.add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

inline std::string render_qwen3(const Msgs& m, const ChatOptions& o) {
    std::string out;
    if (m[0].role == "system") out += im("system", m[0].content);
    // Index of the last real user query (not a wrapped tool response); assistant turns after it
    // keep their reasoning, earlier ones lose it.
    size_t last_query = m.size() - 1;
    for (size_t k = m.size(); k-- > 0;) {
        const std::string& c = m[k].content;
        if (m[k].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < m.size(); i++) {
        const std::string& r = m[i].role;
        if (r == "user" || (r == "system" && i > 0)) {
            out += im(r, m[i].content);
        } else if (r == "assistant") {
            std::string content = m[i].content, reasoning;
            if (contains(content, "</think>")) {
                content = lstrip_char(after_last(m[i].content, "</think>"), '\n');
                reasoning = lstrip_char(after_last(rstrip_char(before_first(m[i].content, "</think>"), '\n'), "<think>"), '\n');
            }
            bool last = i + 1 == m.size();
            if (i > last_query && (last || !reasoning.empty()))
                out += "<|im_start|>assistant\n<think>\n" + strip_char(reasoning, '\n') + "\n</think>\n\n" + lstrip_char(content, '\n');
            else
                out += "<|im_start|>assistant\n" + content;
            out += "<|im_end|>\n";
        } else if (r == "tool") {
            qwen_tool(out, m, i);
        }
    }
    if (o.add_generation_prompt) {
        out += "<|im_start|>assistant\n";
        if (o.enable_thinking == 0) out += "<think>\n\n</think>\n\n";
    }
    return out;
}

inline std::string render_smollm3(const Msgs& m, const ChatOptions& o) {
    bool think = o.enable_thinking != 0;  // undefined -> true
    std::string custom;
    if (m[0].role == "system") {
        const std::string& s = m[0].content;
        if (contains(s, "/no_think")) think = false;
        else if (contains(s, "/think")) think = true;
        custom = py_rstrip(erase_all(erase_all(s, "/no_think"), "/think"));
    }
    std::string out = "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: ";
    out += think ? "/think" : "/no_think";
    out += "\n\n## Custom Instructions\n\n";
    if (!custom.empty()) {
        out += custom + "\n\n";
    } else if (think) {
        out += "You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant "
               "involves thoroughly exploring questions through a systematic thinking process before providing "
               "the final precise and accurate solutions. This requires engaging in a comprehensive cycle of "
               "analysis, summarizing, exploration, reassessment, reflection, backtracking, and iteration to "
               "develop well-considered thinking process. Please structure your response into two main sections: "
               "Thought and Solution using the specified format: <think> Thought section </think> Solution "
               "section. In the Thought section, detail your reasoning process in steps. Each step should include "
               "detailed considerations such as analysing questions, summarizing relevant findings, brainstorming "
               "new ideas, verifying the accuracy of the current steps, refining any errors, and revisiting "
               "previous steps. In the Solution section, based on various attempts, explorations, and reflections "
               "from the Thought section, systematically present the final solution that you deem correct. The "
               "Solution section should be logical, accurate, and concise and detail necessary steps needed to "
               "reach the conclusion.\n\n";
    } else {
        out += "You are a helpful AI assistant named SmolLM, trained by Hugging Face.\n\n";
    }
    out += "<|im_end|>\n";
    const char* empty_think = think ? "" : "<think>\n\n</think>\n";
    for (auto& x : m) {
        if (x.role == "user" || x.role == "tool") out += im("user", x.content);
        else if (x.role == "assistant") out += im("assistant", empty_think + lstrip_char(x.content, '\n'));
    }
    if (o.add_generation_prompt) out += std::string("<|im_start|>assistant\n") + empty_think;
    return out;
}

// ---- Llama 3 -------------------------------------------------------------------------------

inline std::string llama_turn(const std::string& role, const std::string& body) {
    return "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + body + "<|eot_id|>";
}

inline std::string render_llama3(const Msgs& m, const ChatOptions& o) {
    std::string out = o.bos_token;
    for (auto& x : m) out += llama_turn(x.role, py_strip(x.content));
    if (o.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

// Llama 3.1 - 3.3: a system block with the knowledge cutoff and a date, then the turns. Tool results
// ("tool"/"ipython") go under the ipython header as JSON (a string is iterable, so `tojson` applies).
inline std::string render_llama31(const Msgs& m, const ChatOptions& o, const std::string& date) {
    size_t first = 0;
    std::string system;
    if (m[0].role == "system") {
        system = py_strip(m[0].content);
        first = 1;
    }
    std::string out = o.bos_token;
    out += llama_turn("system", "Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n" + system);
    for (size_t i = first; i < m.size(); i++) {
        const std::string& r = m[i].role;
        if (r == "tool" || r == "ipython") out += llama_turn("ipython", json_quote(m[i].content));
        else out += llama_turn(r, py_strip(m[i].content));
    }
    if (o.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
}

// ---- Gemma ---------------------------------------------------------------------------------

inline const char* kAlternate = "Conversation roles must alternate user/assistant/user/assistant/...";

// Both Gemma templates: roles must alternate starting with user; assistant is called "model";
// content is trimmed; `prefix` (Gemma 3's folded system text) opens the first turn.
inline std::string render_gemma_turns(const Msgs& m, size_t first, const std::string& prefix, const ChatOptions& o) {
    std::string out = o.bos_token;
    for (size_t i = first; i < m.size(); i++) {
        if ((m[i].role == "user") != ((i - first) % 2 == 0)) template_error(kAlternate);
        const std::string role = m[i].role == "assistant" ? "model" : m[i].role;
        out += "<start_of_turn>" + role + "\n" + (i == first ? prefix : "") + py_strip(m[i].content) + "<end_of_turn>\n";
    }
    if (o.add_generation_prompt) out += "<start_of_turn>model\n";
    return out;
}

// llama-server's polyfill for templates without a system role (minja's chat_template::apply).
inline Msgs fold_system(const Msgs& m) {
    Msgs out;
    std::string pending;
    auto flush = [&] {
        if (!pending.empty()) out.push_back({"user", pending});
        pending.clear();
    };
    for (auto& x : m) {
        if (x.role == "system") {
            if (!pending.empty()) pending += "\n";
            pending += x.content;
            continue;
        }
        if (x.role == "user" && !pending.empty()) {
            out.push_back({"user", pending + (x.content.empty() ? "" : "\n" + x.content)});
            pending.clear();
            continue;
        }
        if (x.role != "user") flush();
        out.push_back(x);
    }
    flush();
    return out;
}

inline std::string render_gemma2(const Msgs& m, const ChatOptions& o) {
    if (o.fold_system) {
        Msgs folded = fold_system(m);
        return render_gemma_turns(folded, 0, "", o);
    }
    if (m[0].role == "system") template_error("System role not supported");
    return render_gemma_turns(m, 0, "", o);
}

inline std::string render_gemma3(const Msgs& m, const ChatOptions& o) {
    if (m[0].role == "system") return render_gemma_turns(m, 1, m[0].content + "\n\n", o);
    return render_gemma_turns(m, 0, "", o);
}

// ---- DeepSeek ------------------------------------------------------------------------------

inline const char* kDsEos = "<｜end▁of▁sentence｜>";  // the templates spell it out, not eos_token

// System prompts joined with "\n\n" (V3, V3.1) or the last one only (R1-Distill).
inline std::string ds_system(const Msgs& m, bool join) {
    std::string s;
    bool first = true;
    for (auto& x : m) {
        if (x.role != "system") continue;
        s = join && !first ? s + "\n\n" + x.content : x.content;
        first = false;
    }
    return s;
}

inline std::string render_deepseek_r1(const Msgs& m, const ChatOptions& o, bool has_switch) {
    std::string out = o.bos_token + ds_system(m, false);
    bool is_tool = false, output_first = true;
    for (auto& x : m) {
        if (x.role == "user") {
            is_tool = false;
            out += "<｜User｜>" + x.content;
        } else if (x.role == "assistant") {
            if (is_tool) {
                out += "<｜tool▁outputs▁end｜>" + x.content + kDsEos;
                is_tool = false;
            } else {
                out += "<｜Assistant｜>" + after_last(x.content, "</think>") + kDsEos;
            }
        } else if (x.role == "tool") {
            is_tool = true;
            out += (output_first ? "<｜tool▁outputs▁begin｜>" : "\n") + std::string("<｜tool▁output▁begin｜>") + x.content + "<｜tool▁output▁end｜>";
            output_first = false;
        }
    }
    if (is_tool) out += "<｜tool▁outputs▁end｜>";
    if (o.add_generation_prompt && !is_tool) {
        out += "<｜Assistant｜><think>\n";
        if (has_switch && !truthy(o.enable_thinking)) out += "</think>";
    }
    return out;
}

inline std::string render_deepseek_v3(const Msgs& m, const ChatOptions& o) {
    std::string out = o.bos_token + ds_system(m, true);
    bool is_tool = false, output_first = true, last_user = false;
    for (auto& x : m) {
        if (x.role == "user") {
            is_tool = false;
            last_user = true;
            out += "<｜User｜>" + x.content + "<｜Assistant｜>";
        } else if (x.role == "assistant") {
            last_user = false;
            out += (is_tool ? "<｜tool▁outputs▁end｜>" : "") + x.content + kDsEos;
            is_tool = false;
        } else if (x.role == "tool") {
            last_user = false;
            is_tool = true;
            out += (output_first ? "<｜tool▁outputs▁begin｜>" : "") + std::string("<｜tool▁output▁begin｜>") + x.content + "<｜tool▁output▁end｜>";
            output_first = false;
        }
    }
    if (is_tool) out += "<｜tool▁outputs▁end｜>";
    if (o.add_generation_prompt && !last_user && !is_tool) out += "<｜Assistant｜>";
    return out;
}

inline std::string render_deepseek_v31(const Msgs& m, const ChatOptions& o) {
    bool thinking = truthy(o.enable_thinking);  // undefined -> false
    std::string out = o.bos_token + ds_system(m, true);
    bool is_tool = false, last_user = false;
    for (auto& x : m) {
        if (x.role == "user") {
            is_tool = false;
            last_user = true;
            out += "<｜User｜>" + x.content;
        } else if (x.role == "assistant") {
            if (last_user) out += "<｜Assistant｜><think></think>";
            last_user = false;
            std::string content = x.content;
            if (!is_tool && contains(content, "</think>")) content = content.substr(content.find("</think>") + 8);
            out += content + kDsEos;
            is_tool = false;
        } else if (x.role == "tool") {
            last_user = false;
            is_tool = true;
            out += "<｜tool▁output▁begin｜>" + x.content + "<｜tool▁output▁end｜>";
        }
    }
    if (o.add_generation_prompt && last_user && !is_tool) out += thinking ? "<｜Assistant｜><think>" : "<｜Assistant｜><think></think>";
    return out;
}

inline std::string render_deepseek_coder(const Msgs& m, const ChatOptions& o) {
    std::string out = o.bos_token;
    bool has_system = false;
    for (auto& x : m) has_system |= x.role == "system";
    if (!has_system)
        out += "You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek "
               "Company, and you only answer questions related to computer science. For politically sensitive "
               "questions, security and privacy issues, and other non-computer science questions, you will "
               "refuse to answer\n";
    for (auto& x : m) {
        if (x.role == "system") out += x.content;
        else if (x.role == "user") out += "### Instruction:\n" + x.content + "\n";
        else out += "### Response:\n" + x.content + "\n<|EOT|>\n";
    }
    if (o.add_generation_prompt) out += "### Response:\n";
    return out;
}

// ---- Mistral Nemo, Phi-3 -------------------------------------------------------------------

inline std::string render_mistral_nemo(const Msgs& m, const ChatOptions& o) {
    size_t first = m[0].role == "system" ? 1 : 0;
    // The template checks alternation (tool results excepted) before it prints anything.
    size_t n = 0;
    for (size_t i = first; i < m.size(); i++) {
        const std::string& r = m[i].role;
        if (r == "tool" || r == "tool_results") continue;
        if ((r == "user") != (n % 2 == 0))
            template_error("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...");
        n++;
    }
    std::string out = o.bos_token;
    for (size_t i = first; i < m.size(); i++) {
        const std::string& r = m[i].role;
        if (r == "user") {
            bool with_system = first == 1 && i + 1 == m.size();
            out += "[INST]" + (with_system ? m[0].content + "\n\n" : std::string()) + m[i].content + "[/INST]";
        } else if (r == "assistant") {
            out += m[i].content + o.eos_token;
        } else if (r == "tool" || r == "tool_results") {
            template_error("Tool call IDs should be alphanumeric strings with length 9!");  // we carry no tool_call_id
        } else {
            template_error("Only user and assistant roles are supported, with the exception of an initial optional system message!");
        }
    }
    return out;
}

inline std::string render_phi3(const Msgs& m, const ChatOptions& o) {
    std::string out;
    for (auto& x : m) {
        if ((x.role == "system" && !x.content.empty()) || x.role == "user" || x.role == "assistant")
            out += "<|" + x.role + "|>\n" + x.content + "<|end|>\n";
    }
    out += o.add_generation_prompt ? "<|assistant|>\n" : o.eos_token;
    return out;
}

// ---- Names ---------------------------------------------------------------------------------

struct FamilyName {
    ChatFamily family;
    const char* name;  // the first entry of a family is its canonical name, the rest are aliases
};
inline const FamilyName kFamilyNames[] = {
    {ChatFamily::ChatML, "chatml"},
    {ChatFamily::Qwen2, "qwen2"},
    {ChatFamily::Qwen25, "qwen2.5"},      {ChatFamily::Qwen25, "qwen25"},   {ChatFamily::Qwen25, "qwen"},
    {ChatFamily::Qwen3, "qwen3"},
    {ChatFamily::SmolLM2, "smollm2"},     {ChatFamily::SmolLM2, "smollm"},
    {ChatFamily::SmolLM3, "smollm3"},
    {ChatFamily::Llama3, "llama3"},
    {ChatFamily::Llama31, "llama3.1"},    {ChatFamily::Llama31, "llama31"}, {ChatFamily::Llama31, "llama3.3"},
    {ChatFamily::Llama32, "llama3.2"},    {ChatFamily::Llama32, "llama32"},
    {ChatFamily::Gemma2, "gemma2"},
    {ChatFamily::Gemma3, "gemma3"},       {ChatFamily::Gemma3, "gemma"},
    {ChatFamily::DeepSeekR1, "deepseek-r1"},  {ChatFamily::DeepSeekR1, "deepseek-r1-distill"},
    {ChatFamily::DeepSeekR1Switch, "deepseek-r1-switch"},
    {ChatFamily::DeepSeekV3, "deepseek3"},    {ChatFamily::DeepSeekV3, "deepseek-v3"},
    {ChatFamily::DeepSeekV31, "deepseek3.1"}, {ChatFamily::DeepSeekV31, "deepseek-v3.1"},
    {ChatFamily::DeepSeekCoder, "deepseek-coder"}, {ChatFamily::DeepSeekCoder, "deepseek"},
    {ChatFamily::MistralNemo, "mistral-nemo"}, {ChatFamily::MistralNemo, "mistral-v3-tekken"},
    {ChatFamily::Phi3, "phi3"},           {ChatFamily::Phi3, "phi3.5"},
};

} // namespace chat_detail

// ---- 11a. Jinja values: Python's object model as the templates see it --------------------------
// Values are immutable once built (the sandbox is Jinja2's immutable one), except namespaces, so
// lists and dicts are shared. Every container records its nesting depth: JSON input and values a
// template builds are bounded by kMaxNesting, which bounds every recursive walk (repr, tojson, ==).

namespace jinja_detail {

using chat_detail::space_at;
using chat_detail::space_before;
using chat_detail::py_strip;
using chat_detail::py_lstrip;
using chat_detail::py_rstrip;
using chat_detail::starts_with;
using chat_detail::ends_with;
using chat_detail::json_append_string;

constexpr int kMaxNesting = 128;         // lists/dicts inside each other
constexpr size_t kMaxItems = 1u << 20;   // elements of one list/dict, range() included

// A failure inside the template; render() turns it into an Error naming the template line.
struct Fault {
    std::string message;
};
[[noreturn]] inline void fault(const std::string& message) { throw Fault{message}; }

struct Value;
using ValueList = std::vector<Value>;
struct DictData;
struct Callable;

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Func };
enum class SeqKind : uint8_t { List, Tuple, Generator };  // how a List prints (and whether it has a len)

struct Value {
    Kind kind = Kind::Undefined;
    SeqKind seq = SeqKind::List;
    bool boolean = false;
    bool markup = false;                         // String: a Markup (|safe): `+` escapes plain text joined to it
    int depth = 0;                               // container nesting (0 for scalars)
    int64_t integer = 0;
    double number = 0;
    std::string text;                            // String; Undefined: why, for the error when used
    std::shared_ptr<const ValueList> list;
    std::shared_ptr<DictData> dict;              // shared; only a namespace's items change
    std::shared_ptr<const Callable> func;

    bool is(Kind k) const { return kind == k; }
};

struct DictData {
    std::vector<std::pair<Value, Value>> items;  // insertion order, as Python dicts
    bool is_namespace = false;
};

struct CallArgs {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> named;
};

struct Renderer;
struct Callable {
    std::string name;
    std::function<Value(Renderer&, CallArgs&)> call;
};

inline Value undefined_value(std::string why) {
    Value v;
    v.text = std::move(why);
    return v;
}
inline Value none_value() {
    Value v;
    v.kind = Kind::None;
    return v;
}
inline Value bool_value(bool b) {
    Value v;
    v.kind = Kind::Bool;
    v.boolean = b;
    return v;
}
inline Value int_value(int64_t i) {
    Value v;
    v.kind = Kind::Int;
    v.integer = i;
    return v;
}
inline Value float_value(double d) {
    Value v;
    v.kind = Kind::Float;
    v.number = d;
    return v;
}
inline Value string_value(std::string s) {
    Value v;
    v.kind = Kind::String;
    v.text = std::move(s);
    return v;
}

// Nesting depth of a new container holding these values; faults past kMaxNesting.
template <class It, class DepthOf>
int container_depth(It begin, It end, DepthOf depth_of) {
    int d = 0;
    for (It it = begin; it != end; ++it) d = std::max(d, depth_of(*it));
    if (d + 1 > kMaxNesting) fault("values nested more than " + std::to_string(kMaxNesting) + " deep");
    return d + 1;
}

inline Value list_value(ValueList items, SeqKind seq = SeqKind::List) {
    if (items.size() > kMaxItems) fault("list longer than " + std::to_string(kMaxItems) + " items");
    Value v;
    v.kind = Kind::List;
    v.seq = seq;
    v.depth = container_depth(items.begin(), items.end(), [](const Value& x) { return x.depth; });
    v.list = std::make_shared<const ValueList>(std::move(items));
    return v;
}

inline Value dict_value(std::vector<std::pair<Value, Value>> items, bool is_namespace = false) {
    if (items.size() > kMaxItems) fault("dict larger than " + std::to_string(kMaxItems) + " items");
    Value v;
    v.kind = Kind::Dict;
    v.depth = container_depth(items.begin(), items.end(), [](const std::pair<Value, Value>& kv) { return kv.second.depth; });
    auto d = std::make_shared<DictData>();
    d->items = std::move(items);
    d->is_namespace = is_namespace;
    v.dict = std::move(d);
    return v;
}

inline Value func_value(std::string name, std::function<Value(Renderer&, CallArgs&)> call) {
    Value v;
    v.kind = Kind::Func;
    v.func = std::make_shared<const Callable>(Callable{std::move(name), std::move(call)});
    return v;
}

// Python's type name, for error messages.
inline std::string type_name(const Value& v) {
    switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.seq == SeqKind::Generator ? "generator" : v.seq == SeqKind::Tuple ? "tuple" : "list";
    case Kind::Dict: return v.dict->is_namespace ? "Namespace" : "dict";
    case Kind::Func: return "function";
    }
    return "object";
}

// Using an undefined value for anything but printing, testing or iterating raises its reason.
[[noreturn]] inline void undefined_fault(const Value& v) { fault(v.text.empty() ? "value is undefined" : v.text); }

inline bool is_number(const Value& v) { return v.kind == Kind::Bool || v.kind == Kind::Int || v.kind == Kind::Float; }
inline bool is_integral(const Value& v) { return v.kind == Kind::Bool || v.kind == Kind::Int; }
inline int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? (int64_t)v.boolean : v.integer; }
inline double as_double(const Value& v) { return v.kind == Kind::Float ? v.number : (double)as_int(v); }

inline bool truthy(const Value& v) {
    switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.boolean;
    case Kind::Int: return v.integer != 0;
    case Kind::Float: return v.number != 0;
    case Kind::String: return !v.text.empty();
    case Kind::List: return v.seq == SeqKind::Generator || !v.list->empty();
    case Kind::Dict: return v.dict->is_namespace || !v.dict->items.empty();
    case Kind::Func: return true;
    }
    return false;
}

// Python ==: numbers across int/float/bool, containers element by element.
inline bool equals(const Value& a, const Value& b) {
    if (is_number(a) && is_number(b))
        return is_integral(a) && is_integral(b) ? as_int(a) == as_int(b) : as_double(a) == as_double(b);
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.text == b.text;
    case Kind::List:
        if (a.list->size() != b.list->size()) return false;
        for (size_t i = 0; i < a.list->size(); i++)
            if (!equals((*a.list)[i], (*b.list)[i])) return false;
        return true;
    case Kind::Dict: {
        if (a.dict == b.dict) return true;
        if (a.dict->is_namespace || b.dict->is_namespace || a.dict->items.size() != b.dict->items.size()) return false;
        for (auto& kv : a.dict->items) {
            bool found = false;
            for (auto& other : b.dict->items)
                if (equals(kv.first, other.first)) {
                    found = equals(kv.second, other.second);
                    break;
                }
            if (!found) return false;
        }
        return true;
    }
    case Kind::Func: return a.func == b.func;
    default: return false;
    }
}

// Python's <, > ordering: numbers, strings (code point order = UTF-8 byte order), sequences.
inline int compare(const Value& a, const Value& b, const char* op) {
    if (is_number(a) && is_number(b)) {
        if (is_integral(a) && is_integral(b)) return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
        return as_double(a) < as_double(b) ? -1 : as_double(a) > as_double(b);
    }
    if (a.kind == Kind::String && b.kind == Kind::String) return a.text.compare(b.text) < 0 ? -1 : a.text != b.text;
    if (a.kind == Kind::List && b.kind == Kind::List) {
        for (size_t i = 0; i < a.list->size() && i < b.list->size(); i++)
            if (!equals((*a.list)[i], (*b.list)[i])) return compare((*a.list)[i], (*b.list)[i], op);
        return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size();
    }
    if (a.kind == Kind::Undefined) undefined_fault(a);
    if (b.kind == Kind::Undefined) undefined_fault(b);
    fault(std::string("TypeError: '") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
          type_name(b) + "'");
}

inline const Value* dict_find(const DictData& d, const Value& key) {
    for (auto& kv : d.items)
        if (equals(kv.first, key)) return &kv.second;
    return nullptr;
}
inline const Value* dict_find(const DictData& d, const std::string& key) {
    for (auto& kv : d.items)
        if (kv.first.kind == Kind::String && kv.first.text == key) return &kv.second;
    return nullptr;
}

// ---- Python strings over UTF-8 ------------------------------------------------------------------

// Byte offsets of each code point's start, and s.size() last: indexing and slicing are by code point.
inline std::vector<size_t> codepoint_offsets(const std::string& s) {
    std::vector<size_t> off;
    for (size_t i = 0; i < s.size(); i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) off.push_back(i);
    off.push_back(s.size());
    return off;
}
inline size_t codepoint_count(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

// Python's repr() of a float: the shortest digits that round-trip, fixed notation for exponents in
// [-4, 16), else d.ddde+XX.
inline std::string py_float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[40];
    int precision = 1;
    for (; precision < 17; precision++) {
        snprintf(buf, sizeof buf, "%.*e", precision - 1, d);
        if (std::strtod(buf, nullptr) == d) break;
    }
    snprintf(buf, sizeof buf, "%.*e", precision - 1, d);
    std::string sci = buf;  // [-]d.ddde[+-]XX
    const size_t e = sci.find('e');
    const int exponent = std::atoi(sci.c_str() + e + 1);
    const bool negative = sci[0] == '-';
    std::string digits;
    for (size_t i = negative; i < e; i++)
        if (sci[i] != '.') digits += sci[i];
    std::string out = negative ? "-" : "";
    if (exponent >= -4 && exponent < 16) {
        if (exponent < 0) {
            out += "0." + std::string((size_t)(-exponent - 1), '0') + digits;
        } else if ((size_t)exponent + 1 >= digits.size()) {
            out += digits + std::string((size_t)exponent + 1 - digits.size(), '0') + ".0";
        } else {
            out += digits.substr(0, (size_t)exponent + 1) + "." + digits.substr((size_t)exponent + 1);
        }
        return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    snprintf(buf, sizeof buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + buf;
}

// Code points Python's str.isprintable() rejects among those a chat may contain (controls, format
// characters, separators other than the space); repr() escapes them.
inline bool py_unprintable(uint32_t cp) {
    return cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) ||
           (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x2064) || cp == 0x3000 || cp == 0xfeff;
}

// Python's repr() of a str: single quotes unless the text has ' and no ".
inline std::string py_quote(const std::string& s) {
    const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string out(1, quote);
    for (size_t off = 0; off < s.size();) {
        const size_t start = off;
        const uint32_t cp = tokenizer_impl::utf8_decode(s, off);
        char buf[16];
        if (cp == (uint32_t)quote || cp == '\\') {
            out += '\\';
            out += (char)cp;
        } else if (cp == '\n') {
            out += "\\n";
        } else if (cp == '\r') {
            out += "\\r";
        } else if (cp == '\t') {
            out += "\\t";
        } else if (py_unprintable(cp)) {
            snprintf(buf, sizeof buf, cp < 0x100 ? "\\x%02x" : "\\u%04x", cp);
            out += buf;
        } else {
            out.append(s, start, off - start);
        }
    }
    return out + quote;
}

inline std::string repr(const Value& v);

// Python's str(): strings as they are, undefined as "", everything else as repr.
inline std::string to_str(const Value& v) {
    if (v.kind == Kind::String) return v.text;
    if (v.kind == Kind::Undefined) return "";
    return repr(v);
}

inline std::string repr(const Value& v) {
    switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "None";
    case Kind::Bool: return v.boolean ? "True" : "False";
    case Kind::Int: return std::to_string(v.integer);
    case Kind::Float: return py_float_repr(v.number);
    case Kind::String: return py_quote(v.text);
    case Kind::List: {
        if (v.seq == SeqKind::Generator) return "<generator object>";
        const bool tuple = v.seq == SeqKind::Tuple;
        std::string out = tuple ? "(" : "[";
        for (size_t i = 0; i < v.list->size(); i++) out += (i ? ", " : "") + repr((*v.list)[i]);
        if (tuple && v.list->size() == 1) out += ",";
        return out + (tuple ? ")" : "]");
    }
    case Kind::Dict: {
        std::string out = v.dict->is_namespace ? "<Namespace {" : "{";
        bool first = true;
        for (auto& kv : v.dict->items) {
            out += (first ? "" : ", ") + repr(kv.first) + ": " + repr(kv.second);
            first = false;
        }
        return out + (v.dict->is_namespace ? "}>" : "}");
    }
    case Kind::Func: return "<function " + v.func->name + ">";
    }
    return "";
}

// ---- JSON ----------------------------------------------------------------------------------------

// Python json.dumps' options as Hugging Face's tojson passes them.
struct JsonStyle {
    bool ensure_ascii = false;
    bool indented = false;
    std::string indent;                             // per level, when indented
    std::string item_separator = ", ", key_separator = ": ";
    bool sort_keys = false;
};

// A dict key as json.dumps writes it (keys must be str, int, float, bool or None).
inline std::string json_key(const Value& k) {
    switch (k.kind) {
    case Kind::String: return k.text;
    case Kind::Int: return std::to_string(k.integer);
    case Kind::Float: return py_float_repr(k.number);
    case Kind::Bool: return k.boolean ? "true" : "false";
    case Kind::None: return "null";
    default: fault("TypeError: keys must be str, int, float, bool or None, not " + type_name(k));
    }
}

// json.dumps(v) with Python's formatting, appended to out (bounded by max_bytes).
inline void json_dump(std::string& out, const Value& v, const JsonStyle& style, int level, size_t max_bytes) {
    if (out.size() > max_bytes) fault("tojson output larger than " + std::to_string(max_bytes) + " bytes");
    auto newline = [&](int lvl) {
        if (!style.indented) return;
        out += '\n';
        for (int i = 0; i < lvl; i++) out += style.indent;
    };
    switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.boolean ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.integer); return;
    case Kind::Float:
        out += std::isnan(v.number) ? "NaN" : std::isinf(v.number) ? (v.number < 0 ? "-Infinity" : "Infinity")
                                                                   : py_float_repr(v.number);
        return;
    case Kind::String: json_append_string(out, v.text, style.ensure_ascii); return;
    case Kind::List:
        if (v.seq == SeqKind::Generator) break;
        if (v.list->empty()) {
            out += "[]";
            return;
        }
        out += '[';
        for (size_t i = 0; i < v.list->size(); i++) {
            if (i) out += style.item_separator;
            newline(level + 1);
            json_dump(out, (*v.list)[i], style, level + 1, max_bytes);
        }
        newline(level);
        out += ']';
        return;
    case Kind::Dict: {
        if (v.dict->is_namespace) break;
        if (v.dict->items.empty()) {
            out += "{}";
            return;
        }
        std::vector<std::pair<std::string, const Value*>> members;
        for (auto& kv : v.dict->items) members.push_back({json_key(kv.first), &kv.second});
        if (style.sort_keys)
            std::stable_sort(members.begin(), members.end(), [](auto& a, auto& b) { return a.first < b.first; });
        out += '{';
        for (size_t i = 0; i < members.size(); i++) {
            if (i) out += style.item_separator;
            newline(level + 1);
            json_append_string(out, members[i].first, style.ensure_ascii);
            out += style.key_separator;
            json_dump(out, *members[i].second, style, level + 1, max_bytes);
        }
        newline(level);
        out += '}';
        return;
    }
    default: break;
    }
    fault("TypeError: Object of type " + type_name(v) + " is not JSON serializable");
}

// JSON text as Values (chat_detail::JsonReader's builder): integers that fit int64 are Ints, other
// numbers Floats, objects dicts in member order.
struct ValueBuilder {
    using Node = Value;
    Value null() { return none_value(); }
    Value boolean(bool b) { return bool_value(b); }
    Value string(std::string s) { return string_value(std::move(s)); }
    Value number(const std::string& literal, bool integral) {
        if (integral) {
            errno = 0;
            const long long i = std::strtoll(literal.c_str(), nullptr, 10);
            if (errno != ERANGE) return int_value(i);
        }
        return float_value(std::strtod(literal.c_str(), nullptr));
    }
    Value array(ValueList items) { return list_value(std::move(items)); }
    Value object(std::vector<std::pair<std::string, Value>> members) {
        std::vector<std::pair<Value, Value>> items;
        items.reserve(members.size());
        for (auto& [k, v] : members) items.emplace_back(string_value(std::move(k)), std::move(v));
        return dict_value(std::move(items));
    }
};

inline Value parse_json(const std::string& text) {
    ValueBuilder builder;
    return chat_detail::JsonReader<ValueBuilder>(text, builder, kMaxNesting, kMaxItems).read_document();
}

} // namespace jinja_detail

// ---- 11b. Jinja lexer: text, {{ }}, {% %}, {# #} with Jinja2's whitespace control -------------
// trim_blocks drops the newline after a block or comment tag, lstrip_blocks drops the spaces before
// one on its line, "-" strips all whitespace on that side, "+" keeps it.

namespace jinja_detail {

enum class Tok : uint8_t { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Int, Float, String, Op, End };

struct Token {
    Tok type;
    std::string text;  // Text, Name, String (decoded), Op
    int64_t integer = 0;
    double number = 0;
    int line = 1;
};

constexpr int kMaxParseDepth = 200;  // nested expressions and blocks

class Lexer {
public:
    explicit Lexer(std::string source) : src_(std::move(source)) {
        normalize_newlines();
    }

    std::vector<Token> run() {
        while (pos_ < src_.size()) {
            const size_t open = find_tag(pos_);
            std::string text = src_.substr(pos_, open - pos_);
            if (open == src_.size()) {
                emit_text(std::move(text));
                break;
            }
            const char kind = src_[open + 1];
            const char control = open + 2 < src_.size() ? src_[open + 2] : 0;
            if (control == '-') {
                text = py_rstrip(text);
            } else if (kind != '{' && control != '+') {
                lstrip_line(text);
            }
            const int text_lines = count_lines(pos_, open);
            emit_text(std::move(text));
            line_ += text_lines;
            pos_ = open + 2 + (control == '-' || control == '+');
            if (kind == '#') skip_comment();
            else lex_tag(kind == '{');
        }
        tokens_.push_back({Tok::End, "", 0, 0, line_});
        return std::move(tokens_);
    }

private:
    std::string src_;
    size_t pos_ = 0;
    int line_ = 1;
    bool line_starting_ = true;  // the previous tag's match ended a line (lstrip_blocks applies)
    std::vector<Token> tokens_;

    [[noreturn]] void fail(const std::string& what) const { throw Error("template line " + std::to_string(line_) + ": " + what); }

    // Jinja2 joins the source's lines with "\n" and drops one trailing newline.
    void normalize_newlines() {
        std::string out;
        out.reserve(src_.size());
        for (size_t i = 0; i < src_.size(); i++) {
            if (src_[i] == '\r') {
                out += '\n';
                if (i + 1 < src_.size() && src_[i + 1] == '\n') i++;
            } else {
                out += src_[i];
            }
        }
        if (!out.empty() && out.back() == '\n') out.pop_back();
        src_ = std::move(out);
    }

    size_t find_tag(size_t from) const {
        for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1))
            if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
        return src_.size();
    }

    int count_lines(size_t from, size_t to) const { return (int)std::count(src_.begin() + (long)from, src_.begin() + (long)to, '\n'); }

    // lstrip_blocks: spaces between a line start and a block/comment tag go.
    void lstrip_line(std::string& text) const {
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_start == 0 && !line_starting_) return;
        for (size_t i = line_start, n; i < text.size(); i += n)
            if ((n = space_at(text, i)) == 0) return;
        text.resize(line_start);
    }

    void emit_text(std::string text) {
        if (!text.empty()) tokens_.push_back({Tok::Text, std::move(text), 0, 0, line_});
    }

    // After a closing tag: "-" eats the following whitespace, trim_blocks one newline after blocks.
    void after_close(bool minus, bool plus, bool is_block) {
        line_starting_ = false;
        if (minus) {
            const size_t start = pos_;
            for (size_t n; pos_ < src_.size() && (n = space_at(src_, pos_)) != 0;) pos_ += n;
            line_ += count_lines(start, pos_);
            line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
        } else if (is_block && !plus && pos_ < src_.size() && src_[pos_] == '\n') {
            pos_++;
            line_++;
            line_starting_ = true;
        }
    }

    void skip_comment() {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string::npos) fail("unterminated comment");
        const bool minus = close > pos_ && src_[close - 1] == '-';
        line_ += count_lines(pos_, close);
        pos_ = close + 2;
        after_close(minus, false, true);
    }

    void lex_tag(bool is_var) {
        tokens_.push_back({is_var ? Tok::VarBegin : Tok::BlockBegin, "", 0, 0, line_});
        const char* close = is_var ? "}}" : "%}";
        int brackets = 0;
        while (true) {
            while (pos_ < src_.size() && std::isspace((unsigned char)src_[pos_])) line_ += src_[pos_++] == '\n';
            if (pos_ >= src_.size()) fail(is_var ? "unterminated {{" : "unterminated {%");
            const char c = src_[pos_];
            const bool marked = (c == '-' || c == '+') && src_.compare(pos_ + 1, 2, close) == 0;
            if (brackets == 0 && (marked || src_.compare(pos_, 2, close) == 0)) {
                tokens_.push_back({is_var ? Tok::VarEnd : Tok::BlockEnd, "", 0, 0, line_});
                pos_ += marked ? 3 : 2;
                after_close(marked && c == '-', marked && c == '+', !is_var);
                return;
            }
            if (std::isalpha((unsigned char)c) || c == '_') {
                const size_t start = pos_;
                while (pos_ < src_.size() && (std::isalnum((unsigned char)src_[pos_]) || src_[pos_] == '_')) pos_++;
                tokens_.push_back({Tok::Name, src_.substr(start, pos_ - start), 0, 0, line_});
            } else if (std::isdigit((unsigned char)c)) {
                lex_number();
            } else if (c == '\'' || c == '"') {
                lex_string(c);
            } else {
                lex_operator(brackets);
            }
        }
    }

    void lex_number() {
        const size_t start = pos_;
        auto digits = [&] { while (pos_ < src_.size() && (std::isdigit((unsigned char)src_[pos_]) || src_[pos_] == '_')) pos_++; };
        digits();
        bool is_float = false;
        if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit((unsigned char)src_[pos_ + 1])) {
            pos_++;
            digits();
            is_float = true;
        }
        if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
            size_t p = pos_ + 1;
            if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) p++;
            if (p < src_.size() && std::isdigit((unsigned char)src_[p])) {
                pos_ = p;
                digits();
                is_float = true;
            }
        }
        std::string num;
        for (size_t i = start; i < pos_; i++)
            if (src_[i] != '_') num += src_[i];
        Token t{is_float ? Tok::Float : Tok::Int, num, 0, 0, line_};
        errno = 0;
        if (is_float) t.number = std::strtod(num.c_str(), nullptr);
        else t.integer = std::strtoll(num.c_str(), nullptr, 10);
        if (errno == ERANGE) fail("number out of range: " + num);
        tokens_.push_back(std::move(t));
    }

    // A quoted literal with Python's escapes (unknown ones are kept as written).
    void lex_string(char quote) {
        const int start_line = line_;
        std::string out;
        pos_++;
        while (true) {
            if (pos_ >= src_.size()) fail("unterminated string");
            const char c = src_[pos_++];
            if (c == quote) break;
            line_ += c == '\n';
            if (c != '\\' || pos_ >= src_.size()) {
                out += c;
                continue;
            }
            const char e = src_[pos_++];
            auto hex = [&](int n) {
                uint32_t v = 0;
                for (int i = 0; i < n; i++) {
                    if (pos_ >= src_.size() || !std::isxdigit((unsigned char)src_[pos_])) fail("bad escape in string");
                    const char h = src_[pos_++];
                    v = v * 16 + (uint32_t)(std::isdigit((unsigned char)h) ? h - '0' : (std::tolower((unsigned char)h) - 'a' + 10));
                }
                return v;
            };
            switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '0': out += '\0'; break;
            case 'a': out += '\a'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'v': out += '\v'; break;
            case '\\': out += '\\'; break;
            case '\'': out += '\''; break;
            case '"': out += '"'; break;
            case '\n': line_++; break;
            case 'x': tokenizer_impl::utf8_append(out, hex(2)); break;
            case 'u': tokenizer_impl::utf8_append(out, hex(4)); break;
            case 'U': tokenizer_impl::utf8_append(out, hex(8)); break;
            default: out += '\\'; out += e;
            }
        }
        tokens_.push_back({Tok::String, std::move(out), 0, 0, start_line});
    }

    void lex_operator(int& brackets) {
        static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        for (const char* op : kTwo)
            if (src_.compare(pos_, 2, op) == 0) {
                tokens_.push_back({Tok::Op, op, 0, 0, line_});
                pos_ += 2;
                return;
            }
        const char c = src_[pos_];
        if (!std::strchr("+-*/%~<>=()[]{},.:|", c)) fail(std::string("unexpected character '") + c + "'");
        if (c == '(' || c == '[' || c == '{') brackets++;
        if ((c == ')' || c == ']' || c == '}') && --brackets < 0) fail(std::string("unbalanced '") + c + "'");
        tokens_.push_back({Tok::Op, std::string(1, c), 0, 0, line_});
        pos_++;
    }
};

// ---- 11c. Jinja syntax tree ---------------------------------------------------------------------

struct Expr {
    int line = 0;
    virtual ~Expr() = default;
    virtual Value eval(Renderer& r) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct NamedExpr {
    std::string name;
    ExprPtr value;
};

struct ArgExprs {
    std::vector<ExprPtr> positional;
    std::vector<NamedExpr> named;
};

struct Stmt {
    int line = 0;
    virtual ~Stmt() = default;
    virtual void exec(Renderer& r) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct LiteralExpr : Expr {
    Value value;
    Value eval(Renderer&) const override { return value; }
};
struct NameExpr : Expr {
    std::string name;
    Value eval(Renderer& r) const override;
};
struct ListExpr : Expr {
    std::vector<ExprPtr> items;
    bool tuple = false;
    Value eval(Renderer& r) const override;
};
struct DictExpr : Expr {
    std::vector<std::pair<ExprPtr, ExprPtr>> items;
    Value eval(Renderer& r) const override;
};
struct AttributeExpr : Expr {
    ExprPtr object;
    std::string name;
    Value eval(Renderer& r) const override;
};
struct SubscriptExpr : Expr {
    ExprPtr object, index;
    Value eval(Renderer& r) const override;
};
struct SliceExpr : Expr {
    ExprPtr object, start, stop, step;  // each bound may be null
    Value eval(Renderer& r) const override;
};
struct CallExpr : Expr {
    ExprPtr callee;
    ArgExprs args;
    Value eval(Renderer& r) const override;
};
struct FilterExpr : Expr {
    ExprPtr operand;  // null in a {% filter %} block: the block's output
    std::string name;
    ArgExprs args;
    Value eval(Renderer& r) const override;
    Value apply(Renderer& r, const Value& input) const;
};
struct TestExpr : Expr {
    ExprPtr operand;
    std::string name;
    ArgExprs args;
    bool negated = false;
    Value eval(Renderer& r) const override;
};
struct UnaryExpr : Expr {
    std::string op;  // "-", "+", "not"
    ExprPtr operand;
    Value eval(Renderer& r) const override;
};
struct BinaryExpr : Expr {
    std::string op;  // + - * / // % ** ~ and or
    ExprPtr left, right;
    Value eval(Renderer& r) const override;
};
struct CompareExpr : Expr {  // a < b <= c, chained as Python
    ExprPtr first;
    std::vector<std::pair<std::string, ExprPtr>> rest;  // op: == != < > <= >= in "not in"
    Value eval(Renderer& r) const override;
};
struct CondExpr : Expr {
    ExprPtr condition, then, otherwise;  // otherwise may be null: undefined
    Value eval(Renderer& r) const override;
};

struct TextStmt : Stmt {
    std::string text;
    void exec(Renderer& r) const override;
};
struct OutputStmt : Stmt {
    ExprPtr value;
    void exec(Renderer& r) const override;
};
struct IfStmt : Stmt {
    std::vector<std::pair<ExprPtr, Body>> branches;
    Body otherwise;
    void exec(Renderer& r) const override;
};
struct ForStmt : Stmt {
    std::vector<std::string> targets;
    ExprPtr iterable, filter;
    Body body, otherwise;
    bool uses_loop = true;  // the body names `loop` (else it is not built)
    void exec(Renderer& r) const override;
};
struct SetStmt : Stmt {
    std::vector<std::string> targets;  // one name, several to unpack, or {namespace, attribute}
    bool attribute = false;            // set ns.attr = ...
    ExprPtr value;                     // null for a block set
    Body block;
    std::vector<std::unique_ptr<FilterExpr>> filters;  // {% set x | trim %}...{% endset %}
    void exec(Renderer& r) const override;
};
struct MacroStmt : Stmt {
    std::string name;
    std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
    Body body;
    void exec(Renderer& r) const override;
};
struct FilterBlockStmt : Stmt {
    std::vector<std::unique_ptr<FilterExpr>> filters;
    Body body;
    void exec(Renderer& r) const override;
};
struct LoopControlStmt : Stmt {
    bool is_break = false;
    void exec(Renderer& r) const override;
};

// ---- 11d. Jinja parser: Jinja2's grammar and operator precedence ------------------------------

class Parser {
public:
    explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

    Body parse_template() {
        Body body = parse_body({});
        if (peek().type != Tok::End) fail("unexpected tag");
        return body;
    }

private:
    std::vector<Token> t_;
    size_t i_ = 0;
    int depth_ = 0;       // nesting, bounded
    int loops_ = 0;       // enclosing for loops (break/continue allowed)
    std::string end_tag_; // the keyword that ended the last parse_body

    struct DepthGuard {
        Parser& p;
        explicit DepthGuard(Parser& parser) : p(parser) {
            if (++p.depth_ > kMaxParseDepth) p.fail("nested too deeply");
        }
        ~DepthGuard() { p.depth_--; }
    };

    const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
    const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
    [[noreturn]] void fail(const std::string& what) const {
        throw Error("template line " + std::to_string(peek().line) + ": " + what);
    }
    bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).type == Tok::Op && peek(ahead).text == op; }
    bool is_name(const char* name, size_t ahead = 0) const { return peek(ahead).type == Tok::Name && peek(ahead).text == name; }
    bool take_op(const char* op) { return is_op(op) ? (next(), true) : false; }
    bool take_name(const char* name) { return is_name(name) ? (next(), true) : false; }
    void expect_op(const char* op) {
        if (!take_op(op)) fail(std::string("expected '") + op + "'");
    }
    void expect_block_end() {
        if (peek().type != Tok::BlockEnd) fail("expected end of tag");
        next();
    }
    std::string expect_identifier() {
        if (peek().type != Tok::Name) fail("expected a name");
        return next().text;
    }
    template <class Node>
    std::unique_ptr<Node> node() {
        auto n = std::make_unique<Node>();
        n->line = peek().line;
        return n;
    }

    // Statements until a {% tag %} whose keyword is in `ends` (consumed up to the keyword).
    Body parse_body(const std::vector<std::string>& ends) {
        DepthGuard guard(*this);
        Body body;
        while (true) {
            const Token& tok = peek();
            if (tok.type == Tok::End) {
                if (!ends.empty()) fail("missing {% " + ends.back() + " %}");
                return body;
            }
            if (tok.type == Tok::Text) {
                auto s = node<TextStmt>();
                s->text = next().text;
                body.push_back(std::move(s));
            } else if (tok.type == Tok::VarBegin) {
                next();
                auto s = node<OutputStmt>();
                s->value = parse_tuple_or_expression();
                if (peek().type != Tok::VarEnd) fail("expected '}}'");
                next();
                body.push_back(std::move(s));
            } else if (tok.type == Tok::BlockBegin) {
                const Token& keyword = peek(1);
                if (keyword.type != Tok::Name) fail("expected a tag name");
                if (std::find(ends.begin(), ends.end(), keyword.text) != ends.end()) {
                    next();
                    end_tag_ = next().text;
                    return body;
                }
                next();
                parse_statement(body);
            } else {
                fail("unexpected token");
            }
        }
    }

    void parse_statement(Body& body) {
        const std::string kw = peek().text;
        const int line = peek().line;
        next();
        if (kw == "if") body.push_back(parse_if(line));
        else if (kw == "for") body.push_back(parse_for(line));
        else if (kw == "set") body.push_back(parse_set(line));
        else if (kw == "macro") body.push_back(parse_macro(line));
        else if (kw == "filter") body.push_back(parse_filter_block(line));
        else if (kw == "break" || kw == "continue") {
            if (loops_ == 0) fail("'" + kw + "' outside a loop");
            auto s = std::make_unique<LoopControlStmt>();
            s->line = line;
            s->is_break = kw == "break";
            expect_block_end();
            body.push_back(std::move(s));
        } else if (kw == "generation") {  // transformers' tag for assistant masks: renders its body
            expect_block_end();
            for (auto& s : parse_body({"endgeneration"})) body.push_back(std::move(s));
            expect_block_end();
        } else {
            fail("unsupported tag '" + kw + "'");
        }
    }

    StmtPtr parse_if(int line) {
        auto s = std::make_unique<IfStmt>();
        s->line = line;
        ExprPtr cond = parse_expression();
        expect_block_end();
        while (true) {
            Body b = parse_body({"elif", "else", "endif"});
            s->branches.push_back({std::move(cond), std::move(b)});
            if (end_tag_ == "elif") {
                cond = parse_expression();
                expect_block_end();
                continue;
            }
            if (end_tag_ == "else") {
                expect_block_end();
                s->otherwise = parse_body({"endif"});
            }
            expect_block_end();
            return s;
        }
    }

    std::vector<std::string> parse_targets() {
        std::vector<std::string> names;
        const bool paren = take_op("(");
        do names.push_back(expect_identifier());
        while (take_op(","));
        if (paren) expect_op(")");
        return names;
    }

    StmtPtr parse_for(int line) {
        auto s = std::make_unique<ForStmt>();
        s->line = line;
        s->targets = parse_targets();
        if (!take_name("in")) fail("expected 'in'");
        s->iterable = parse_tuple(false);
        if (take_name("if")) s->filter = parse_expression();
        if (take_name("recursive")) fail("recursive loops are not supported");
        expect_block_end();
        loops_++;
        const size_t body_start = i_;
        s->body = parse_body({"else", "endfor"});
        s->uses_loop = std::any_of(t_.begin() + (long)body_start, t_.begin() + (long)i_,
                                   [](const Token& t) { return t.type == Tok::Name && t.text == "loop"; });
        loops_--;
        if (end_tag_ == "else") {
            expect_block_end();
            s->otherwise = parse_body({"endfor"});
        }
        expect_block_end();
        return s;
    }

    StmtPtr parse_set(int line) {
        auto s = std::make_unique<SetStmt>();
        s->line = line;
        s->targets.push_back(expect_identifier());
        if (take_op(".")) {
            s->targets.push_back(expect_identifier());
            s->attribute = true;
        } else {
            while (take_op(",")) s->targets.push_back(expect_identifier());
        }
        if (take_op("=")) {
            s->value = parse_tuple_or_expression();
            expect_block_end();
            return s;
        }
        if (s->targets.size() != 1) fail("a block set assigns one name");
        while (take_op("|")) s->filters.push_back(parse_filter(nullptr));
        expect_block_end();
        const int outer_loops = loops_;
        loops_ = 0;
        s->block = parse_body({"endset"});
        loops_ = outer_loops;
        expect_block_end();
        return s;
    }

    StmtPtr parse_macro(int line) {
        auto s = std::make_unique<MacroStmt>();
        s->line = line;
        s->name = expect_identifier();
        expect_op("(");
        if (!is_op(")")) {
            do {
                std::string name = expect_identifier();
                ExprPtr def;
                if (take_op("=")) def = parse_expression();
                s->params.push_back({std::move(name), std::move(def)});
            } while (take_op(","));
        }
        expect_op(")");
        expect_block_end();
        const int outer_loops = loops_;
        loops_ = 0;
        s->body = parse_body({"endmacro"});
        loops_ = outer_loops;
        if (peek().type == Tok::Name) next();  // {% endmacro name %}
        expect_block_end();
        return s;
    }

    StmtPtr parse_filter_block(int line) {
        auto s = std::make_unique<FilterBlockStmt>();
        s->line = line;
        do s->filters.push_back(parse_filter(nullptr));
        while (take_op("|"));
        expect_block_end();
        s->body = parse_body({"endfilter"});
        expect_block_end();
        return s;
    }

    // ---- expressions ----

    // `a, b` without brackets is a tuple where Jinja2 allows one ({{ }}, set, for ... in).
    ExprPtr parse_tuple_or_expression() { return parse_tuple(true); }

    ExprPtr parse_tuple(bool with_condition) {
        const int line = peek().line;
        ExprPtr first = with_condition ? parse_expression() : parse_or();
        if (!is_op(",")) return first;
        auto t = std::make_unique<ListExpr>();
        t->line = line;
        t->tuple = true;
        t->items.push_back(std::move(first));
        while (take_op(",")) {
            if (peek().type == Tok::VarEnd || peek().type == Tok::BlockEnd || is_op(")")) break;
            t->items.push_back(with_condition ? parse_expression() : parse_or());
        }
        return t;
    }

    ExprPtr parse_expression() {
        DepthGuard guard(*this);
        ExprPtr e = parse_or();
        while (is_name("if")) {
            next();
            auto c = node<CondExpr>();
            c->then = std::move(e);
            c->condition = parse_or();
            if (take_name("else")) c->otherwise = parse_expression();
            e = std::move(c);
        }
        return e;
    }

    ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
        auto b = std::make_unique<BinaryExpr>();
        b->line = line;
        b->op = op;
        b->left = std::move(left);
        b->right = std::move(right);
        return b;
    }

    // One left-associative level: operands from `operand` joined by any of `ops` (symbols or keywords).
    template <class Operand>
    ExprPtr parse_left_assoc(Operand operand, std::initializer_list<const char*> ops) {
        ExprPtr e = operand();
        while (true) {
            const char* hit = nullptr;
            for (const char* op : ops)
                if (is_op(op) || is_name(op)) hit = op;
            if (!hit) return e;
            const int line = next().line;
            e = binary(hit, std::move(e), operand(), line);
        }
    }
    ExprPtr parse_or() { return parse_left_assoc([this] { return parse_and(); }, {"or"}); }
    ExprPtr parse_and() { return parse_left_assoc([this] { return parse_not(); }, {"and"}); }
    ExprPtr parse_not() {
        if (is_name("not")) {
            DepthGuard guard(*this);
            auto u = node<UnaryExpr>();
            next();
            u->op = "not";
            u->operand = parse_not();
            return u;
        }
        return parse_compare();
    }
    ExprPtr parse_compare() {
        ExprPtr e = parse_math1();
        std::unique_ptr<CompareExpr> chain;
        while (true) {
            std::string op;
            if (peek().type == Tok::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                           peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
                op = next().text;
            } else if (is_name("in")) {
                next();
                op = "in";
            } else if (is_name("not") && is_name("in", 1)) {
                next();
                next();
                op = "not in";
            } else {
                break;
            }
            if (!chain) {
                chain = node<CompareExpr>();
                chain->first = std::move(e);
            }
            chain->rest.push_back({op, parse_math1()});
        }
        return chain ? std::move(chain) : std::move(e);
    }
    ExprPtr parse_math1() { return parse_left_assoc([this] { return parse_concat(); }, {"+", "-"}); }
    ExprPtr parse_concat() { return parse_left_assoc([this] { return parse_math2(); }, {"~"}); }
    ExprPtr parse_math2() { return parse_left_assoc([this] { return parse_pow(); }, {"*", "/", "//", "%"}); }
    ExprPtr parse_pow() { return parse_left_assoc([this] { return parse_unary(true); }, {"**"}); }
    ExprPtr parse_unary(bool with_filter) {
        DepthGuard guard(*this);
        ExprPtr e;
        if (is_op("-") || is_op("+")) {
            auto u = node<UnaryExpr>();
            u->op = next().text;
            u->operand = parse_unary(false);
            e = std::move(u);
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        return with_filter ? parse_filter_chain(std::move(e)) : std::move(e);
    }

    ExprPtr parse_primary() {
        const Token& tok = peek();
        if (tok.type == Tok::Name) {
            next();
            auto lit = std::make_unique<LiteralExpr>();
            lit->line = tok.line;
            const std::string& n = tok.text;
            if (n == "true" || n == "True") lit->value = bool_value(true);
            else if (n == "false" || n == "False") lit->value = bool_value(false);
            else if (n == "none" || n == "None") lit->value = none_value();
            else {
                auto name = std::make_unique<NameExpr>();
                name->line = tok.line;
                name->name = n;
                return name;
            }
            return lit;
        }
        if (tok.type == Tok::String) {
            auto lit = node<LiteralExpr>();
            std::string s;
            while (peek().type == Tok::String) s += next().text;  // adjacent literals concatenate
            lit->value = string_value(std::move(s));
            return lit;
        }
        if (tok.type == Tok::Int || tok.type == Tok::Float) {
            auto lit = node<LiteralExpr>();
            lit->value = tok.type == Tok::Int ? int_value(tok.integer) : float_value(tok.number);
            next();
            return lit;
        }
        if (take_op("(")) {
            if (take_op(")")) {
                auto t = node<ListExpr>();
                t->tuple = true;
                return t;
            }
            ExprPtr e = parse_expression();
            if (is_op(",")) {
                auto t = node<ListExpr>();
                t->tuple = true;
                t->items.push_back(std::move(e));
                while (take_op(",") && !is_op(")")) t->items.push_back(parse_expression());
                e = std::move(t);
            }
            expect_op(")");
            return e;
        }
        if (take_op("[")) {
            auto l = node<ListExpr>();
            while (!is_op("]")) {
                l->items.push_back(parse_expression());
                if (!take_op(",")) break;
            }
            expect_op("]");
            return l;
        }
        if (take_op("{")) {
            auto d = node<DictExpr>();
            while (!is_op("}")) {
                ExprPtr k = parse_expression();
                expect_op(":");
                d->items.push_back({std::move(k), parse_expression()});
                if (!take_op(",")) break;
            }
            expect_op("}");
            return d;
        }
        fail("unexpected " + (tok.type == Tok::Op ? "'" + tok.text + "'" : std::string("end of expression")));
    }

    ExprPtr parse_postfix(ExprPtr e) {
        while (true) {
            const int line = peek().line;
            if (take_op(".")) {
                if (peek().type == Tok::Int) {  // foo.0 is foo[0]
                    auto s = std::make_unique<SubscriptExpr>();
                    s->line = line;
                    s->object = std::move(e);
                    auto lit = std::make_unique<LiteralExpr>();
                    lit->value = int_value(next().integer);
                    s->index = std::move(lit);
                    e = std::move(s);
                    continue;
                }
                auto a = std::make_unique<AttributeExpr>();
                a->line = line;
                a->object = std::move(e);
                a->name = expect_identifier();
                e = std::move(a);
            } else if (take_op("[")) {
                e = parse_subscript(std::move(e), line);
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }

    ExprPtr parse_subscript(ExprPtr object, int line) {
        ExprPtr start, stop, step;
        if (!is_op(":")) start = parse_expression();
        if (!take_op(":")) {
            expect_op("]");
            auto s = std::make_unique<SubscriptExpr>();
            s->line = line;
            s->object = std::move(object);
            s->index = std::move(start);
            return s;
        }
        if (!is_op("]") && !is_op(":")) stop = parse_expression();
        if (take_op(":") && !is_op("]")) step = parse_expression();
        expect_op("]");
        auto s = std::make_unique<SliceExpr>();
        s->line = line;
        s->object = std::move(object);
        s->start = std::move(start);
        s->stop = std::move(stop);
        s->step = std::move(step);
        return s;
    }

    ArgExprs parse_call_args() {
        ArgExprs args;
        expect_op("(");
        while (!is_op(")")) {
            if (peek().type == Tok::Name && is_op("=", 1)) {
                std::string name = next().text;
                next();
                args.named.push_back({std::move(name), parse_expression()});
            } else {
                if (!args.named.empty()) fail("positional argument after a keyword argument");
                args.positional.push_back(parse_expression());
            }
            if (!take_op(",")) break;
        }
        expect_op(")");
        return args;
    }

    ExprPtr parse_call(ExprPtr callee) {
        auto c = node<CallExpr>();
        c->callee = std::move(callee);
        c->args = parse_call_args();
        return c;
    }

    std::unique_ptr<FilterExpr> parse_filter(ExprPtr operand) {
        auto f = node<FilterExpr>();
        f->operand = std::move(operand);
        f->name = expect_identifier();
        if (is_op("(")) f->args = parse_call_args();
        return f;
    }

    ExprPtr parse_filter_chain(ExprPtr e) {
        while (true) {
            if (take_op("|")) {
                e = parse_filter(std::move(e));
            } else if (is_name("is")) {
                next();
                auto t = node<TestExpr>();
                t->operand = std::move(e);
                t->negated = take_name("not");
                t->name = expect_identifier();
                if (is_op("(")) {
                    t->args = parse_call_args();
                } else if ((peek().type == Tok::Name || peek().type == Tok::String || peek().type == Tok::Int ||
                            peek().type == Tok::Float || is_op("[") || is_op("{")) &&
                           !is_name("else") && !is_name("or") && !is_name("and") && !is_name("is") && !is_name("if")) {
                    t->args.positional.push_back(parse_postfix(parse_primary()));
                }
                e = std::move(t);
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }
};

} // namespace jinja_detail

// ---- 11e. Jinja evaluation: scopes, limits, operators -----------------------------------------

namespace jinja_detail {

// Variables of one block level: the template (root), a for loop, a macro call.
struct Scope {
    std::vector<std::pair<std::string, Value>> vars;
    Scope* parent = nullptr;

    const Value* find(const std::string& name) const {
        for (const Scope* s = this; s; s = s->parent)
            for (auto& kv : s->vars)
                if (kv.first == name) return &kv.second;
        return nullptr;
    }
    void set(const std::string& name, Value v) {
        for (auto& kv : vars)
            if (kv.first == name) {
                kv.second = std::move(v);
                return;
            }
        vars.push_back({name, std::move(v)});
    }
};

enum class Flow : uint8_t { Normal, Break, Continue };

struct Renderer {
    JinjaLimits limits;
    int64_t now = -1;
    std::string* out = nullptr;
    Scope* scope = nullptr;
    Scope* root = nullptr;
    uint64_t steps = 0;
    uint64_t work_bytes = 0;
    int call_depth = 0;
    int line = 0;
    Flow flow = Flow::Normal;

    // One unit of work (statement, iteration, call, filter): bounds the time a template can take.
    void step() {
        if (++steps > limits.max_steps)
            fault("template ran more than " + std::to_string(limits.max_steps) + " steps (endless loop?)");
    }
    // A new string of n bytes: bounds every string and the bytes built in total.
    void charge(size_t n) {
        if (n > limits.max_output) fault("string longer than " + std::to_string(limits.max_output) + " bytes");
        work_bytes += n;
        if (work_bytes > limits.max_work_bytes)
            fault("template built more than " + std::to_string(limits.max_work_bytes) + " bytes of text");
    }
    void emit(const std::string& s) {
        if (out->size() + s.size() > limits.max_output)
            fault("output longer than " + std::to_string(limits.max_output) + " bytes");
        charge(s.size());
        out->append(s);
    }
    void exec(const Body& body) {
        for (auto& s : body) {
            line = s->line;
            step();
            s->exec(*this);
            if (flow != Flow::Normal) return;
        }
    }
    // Runs body with its output captured, as a macro call or a block set does.
    std::string capture(const Body& body) {
        std::string buf;
        std::string* saved = out;
        out = &buf;
        try {
            exec(body);
        } catch (...) {
            out = saved;
            throw;
        }
        out = saved;
        return buf;
    }
};

// Positional argument i or the named one, else `fallback`.
inline Value arg(const CallArgs& a, size_t i, const char* name, Value fallback = undefined_value("")) {
    for (auto& kv : a.named)
        if (kv.first == name) return kv.second;
    return i < a.positional.size() ? a.positional[i] : fallback;
}
inline const Value& require_string(const Value& v, const char* what) {
    if (v.kind == Kind::Undefined) undefined_fault(v);
    if (v.kind != Kind::String) fault(std::string("TypeError: ") + what + " must be str, not " + type_name(v));
    return v;
}

// The items a for loop (or list(), join, ...) walks: a dict's keys, a string's characters.
inline ValueList iterate(const Value& v) {
    switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return *v.list;
    case Kind::Dict: {
        if (v.dict->is_namespace) break;
        ValueList keys;
        for (auto& kv : v.dict->items) keys.push_back(kv.first);
        return keys;
    }
    case Kind::String: {
        ValueList chars;
        const auto off = codepoint_offsets(v.text);
        for (size_t i = 0; i + 1 < off.size(); i++) chars.push_back(string_value(v.text.substr(off[i], off[i + 1] - off[i])));
        return chars;
    }
    default: break;
    }
    fault("TypeError: '" + type_name(v) + "' object is not iterable");
}

inline Value tuple_value(ValueList items) { return list_value(std::move(items), SeqKind::Tuple); }

// dict.items() / the items filter: (key, value) pairs.
inline Value dict_items(const Value& d) {
    ValueList pairs;
    for (auto& kv : d.dict->items) pairs.push_back(tuple_value({kv.first, kv.second}));
    return list_value(std::move(pairs));
}

inline Value builtin_method(const Value& obj, const std::string& name);

// obj.name: Python attribute first (methods), then the item; undefined (with the reason) if neither.
inline Value get_attribute(const Value& obj, const std::string& name) {
    if (obj.kind == Kind::Undefined) undefined_fault(obj);
    if (obj.kind == Kind::Dict && obj.dict->is_namespace) {
        if (const Value* v = dict_find(*obj.dict, name)) return *v;
        return undefined_value("'Namespace' object has no attribute '" + name + "'");
    }
    Value method = builtin_method(obj, name);
    if (method.kind != Kind::Undefined || !method.text.empty()) return method;
    if (obj.kind == Kind::Dict)
        if (const Value* v = dict_find(*obj.dict, name)) return *v;
    if (obj.kind == Kind::None) return undefined_value("'None' has no attribute '" + name + "'");
    return undefined_value("'" + type_name(obj) + " object' has no attribute '" + name + "'");
}

// Python's index normalization: negative from the end; -1 if out of range.
inline int64_t normalize_index(int64_t i, size_t n) {
    if (i < 0) i += (int64_t)n;
    return i >= 0 && i < (int64_t)n ? i : -1;
}

// obj[key]: the item first, then the attribute.
inline Value get_item(const Value& obj, const Value& key) {
    if (obj.kind == Kind::Undefined) undefined_fault(obj);
    if (obj.kind == Kind::Dict && !obj.dict->is_namespace) {
        if (const Value* v = dict_find(*obj.dict, key)) return *v;
    } else if (obj.kind == Kind::List && is_integral(key) && obj.seq != SeqKind::Generator) {
        const int64_t i = normalize_index(as_int(key), obj.list->size());
        if (i >= 0) return (*obj.list)[(size_t)i];
        return undefined_value("'" + type_name(obj) + " object' has no element " + std::to_string(as_int(key)));
    } else if (obj.kind == Kind::String && is_integral(key)) {
        const auto off = codepoint_offsets(obj.text);
        const int64_t i = normalize_index(as_int(key), off.size() - 1);
        if (i >= 0) return string_value(obj.text.substr(off[(size_t)i], off[(size_t)i + 1] - off[(size_t)i]));
        return undefined_value("'str object' has no element " + std::to_string(as_int(key)));
    }
    if (key.kind == Kind::String) return get_attribute(obj, key.text);
    return undefined_value("'" + type_name(obj) + " object' has no element " + repr(key));
}

// Python's slice indices for a sequence of n items.
inline std::vector<size_t> slice_indices(size_t n, const Value& start, const Value& stop, const Value& step) {
    auto bound = [](const Value& v) -> bool { return v.kind != Kind::Undefined && v.kind != Kind::None; };
    for (const Value* v : {&start, &stop, &step})
        if (bound(*v) && !is_integral(*v)) fault("TypeError: slice indices must be integers or None");
    const int64_t st = bound(step) ? as_int(step) : 1;
    if (st == 0) fault("ValueError: slice step cannot be zero");
    const int64_t len = (int64_t)n;
    auto clamp = [&](const Value& v, int64_t def) {
        if (!bound(v)) return def;
        int64_t i = as_int(v);
        if (i < 0) i += len;
        return st > 0 ? std::max<int64_t>(0, std::min(i, len)) : std::max<int64_t>(-1, std::min(i, len - 1));
    };
    const int64_t lo = clamp(start, st > 0 ? 0 : len - 1), hi = clamp(stop, st > 0 ? len : -1);
    std::vector<size_t> idx;
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) idx.push_back((size_t)i);
    return idx;
}

inline Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
    if (obj.kind == Kind::Undefined) undefined_fault(obj);
    if (obj.kind == Kind::String) {
        const auto off = codepoint_offsets(obj.text);
        std::string s;
        for (size_t i : slice_indices(off.size() - 1, start, stop, step)) s.append(obj.text, off[i], off[i + 1] - off[i]);
        return string_value(std::move(s));
    }
    if (obj.kind == Kind::List && obj.seq != SeqKind::Generator) {
        ValueList items;
        for (size_t i : slice_indices(obj.list->size(), start, stop, step)) items.push_back((*obj.list)[i]);
        return list_value(std::move(items), obj.seq);
    }
    fault("TypeError: '" + type_name(obj) + "' object is not subscriptable");
}

// Python's `in`: substring, element, or key.
inline bool contains(const Value& container, const Value& item) {
    switch (container.kind) {
    case Kind::Undefined: return false;
    case Kind::String:
        if (item.kind != Kind::String) fault("TypeError: 'in <string>' requires string as left operand, not " + type_name(item));
        return container.text.find(item.text) != std::string::npos;
    case Kind::List:
        for (auto& x : *container.list)
            if (equals(x, item)) return true;
        return false;
    case Kind::Dict:
        if (container.dict->is_namespace) break;
        return dict_find(*container.dict, item) != nullptr;
    default: break;
    }
    fault("TypeError: argument of type '" + type_name(container) + "' is not iterable");
}

inline int64_t checked_int(long double exact, const char* op) {
    if (exact > (long double)INT64_MAX || exact < (long double)INT64_MIN) fault(std::string("integer overflow in ") + op);
    return (int64_t)exact;
}

// Python floor division and modulo.
inline int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
inline int64_t floor_mod(int64_t a, int64_t b) { return a - floor_div(a, b) * b; }

[[noreturn]] inline void operand_fault(const std::string& op, const Value& a, const Value& b) {
    if (a.kind == Kind::Undefined) undefined_fault(a);
    if (b.kind == Kind::Undefined) undefined_fault(b);
    if (op == "+" && a.kind == Kind::String)
        fault("TypeError: can only concatenate str (not \"" + type_name(b) + "\") to str");
    if (op == "+" && a.kind == Kind::List)
        fault("TypeError: can only concatenate list (not \"" + type_name(b) + "\") to list");
    fault("TypeError: unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

// The sequence repeated n times (str * int, list * int).
inline Value repeat(Renderer& r, const Value& seq, int64_t n) {
    n = std::max<int64_t>(n, 0);
    if (seq.kind == Kind::String) {
        r.charge((size_t)std::min<uint64_t>((uint64_t)n * seq.text.size(), UINT64_MAX / 2));
        const size_t total = (size_t)n * seq.text.size();
        std::string s = n > 0 ? seq.text : "";
        s.reserve(total);
        while (s.size() < total) s.append(s, 0, std::min(s.size(), total - s.size()));  // doubling
        return string_value(std::move(s));
    }
    if ((uint64_t)n * seq.list->size() > kMaxItems) fault("list longer than " + std::to_string(kMaxItems) + " items");
    ValueList items;
    for (int64_t i = 0; i < n; i++) items.insert(items.end(), seq.list->begin(), seq.list->end());
    return list_value(std::move(items), seq.seq);
}

// markupsafe.escape
inline std::string html_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
        }
    }
    return out;
}

inline Value arithmetic(Renderer& r, const std::string& op, const Value& a, const Value& b) {
    if (is_number(a) && is_number(b)) {
        const bool ints = is_integral(a) && is_integral(b);
        const int64_t x = as_int(a), y = as_int(b);
        const double p = as_double(a), q = as_double(b);
        if (op == "+") return ints ? int_value(checked_int((long double)x + y, "+")) : float_value(p + q);
        if (op == "-") return ints ? int_value(checked_int((long double)x - y, "-")) : float_value(p - q);
        if (op == "*") return ints ? int_value(checked_int((long double)x * y, "*")) : float_value(p * q);
        if ((op == "/" || op == "//" || op == "%") && (ints ? y == 0 : q == 0)) fault("ZeroDivisionError: division by zero");
        if (op == "/") return float_value(p / q);
        if (op == "//") return ints ? int_value(floor_div(x, y)) : float_value(std::floor(p / q));
        if (op == "%") return ints ? int_value(floor_mod(x, y)) : float_value(p - std::floor(p / q) * q);
        if (op == "**") {
            if (ints && y >= 0) {
                long double acc = 1;
                for (int64_t i = 0; i < y && acc != 0 && std::fabs(acc) <= (long double)INT64_MAX; i++) acc *= x;
                return int_value(checked_int(acc, "**"));
            }
            return float_value(std::pow(p, q));
        }
    }
    if (op == "+" && a.kind == Kind::String && b.kind == Kind::String) {
        // Markup + str escapes the plain side (markupsafe), the result stays Markup
        const bool markup = a.markup || b.markup;
        std::string s = (markup && !a.markup ? html_escape(a.text) : a.text) + (markup && !b.markup ? html_escape(b.text) : b.text);
        r.charge(s.size());
        Value v = string_value(std::move(s));
        v.markup = markup;
        return v;
    }
    if (op == "+" && a.kind == Kind::List && b.kind == Kind::List && a.seq != SeqKind::Generator && b.seq != SeqKind::Generator) {
        ValueList items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return list_value(std::move(items), a.seq);
    }
    if (op == "*" && is_integral(b) && (a.kind == Kind::String || (a.kind == Kind::List && a.seq != SeqKind::Generator)))
        return repeat(r, a, as_int(b));
    if (op == "*" && is_integral(a) && (b.kind == Kind::String || (b.kind == Kind::List && b.seq != SeqKind::Generator)))
        return repeat(r, b, as_int(a));
    operand_fault(op, a, b);
}

// ---- 11f. Jinja builtins: string/dict methods, filters, tests, globals --------------------------

// Code points of `chars` (str.strip's argument) at the ends of s removed.
inline std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
    const auto set = tokenizer_impl::utf8_to_cps(chars);
    const auto off = codepoint_offsets(s);
    auto in_set = [&](size_t i) {
        size_t at = off[i];
        return std::find(set.begin(), set.end(), tokenizer_impl::utf8_decode(s, at)) != set.end();
    };
    size_t lo = 0, hi = off.size() - 1;
    while (left && lo < hi && in_set(lo)) lo++;
    while (right && hi > lo && in_set(hi - 1)) hi--;
    return s.substr(off[lo], off[hi] - off[lo]);
}

// str.strip / lstrip / rstrip with Python's optional characters argument.
inline Value strip_method(const std::string& s, const Value& chars, bool left, bool right) {
    if (chars.kind == Kind::String) return string_value(strip_chars(s, chars.text, left, right));
    return string_value(left && right ? py_strip(s) : left ? py_lstrip(s) : py_rstrip(s));
}

// str.split / rsplit: by sep, or by whitespace runs when sep is None.
inline Value split_method(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
    ValueList parts;
    if (sep.kind == Kind::String) {
        if (sep.text.empty()) fault("ValueError: empty separator");
        std::vector<std::string> pieces;
        if (!from_right) {
            size_t start = 0, p;
            while ((maxsplit < 0 || (int64_t)pieces.size() < maxsplit) && (p = s.find(sep.text, start)) != std::string::npos) {
                pieces.push_back(s.substr(start, p - start));
                start = p + sep.text.size();
            }
            pieces.push_back(s.substr(start));
        } else {
            size_t end = s.size();
            int64_t splits = 0;
            while (maxsplit < 0 || splits < maxsplit) {
                if (end < sep.text.size()) break;
                const size_t p = s.rfind(sep.text, end - sep.text.size());
                if (p == std::string::npos) break;
                pieces.insert(pieces.begin(), s.substr(p + sep.text.size(), end - p - sep.text.size()));
                end = p;
                splits++;
            }
            pieces.insert(pieces.begin(), s.substr(0, end));
        }
        for (auto& p : pieces) parts.push_back(string_value(std::move(p)));
        return list_value(std::move(parts));
    }
    // whitespace splitting (maxsplit counts from the left; rsplit without sep is rare in templates)
    size_t i = 0, n;
    while (i < s.size()) {
        while (i < s.size() && (n = space_at(s, i)) != 0) i += n;
        if (i >= s.size()) break;
        if (maxsplit >= 0 && (int64_t)parts.size() == maxsplit) {
            parts.push_back(string_value(py_rstrip(s.substr(i))));
            break;
        }
        const size_t start = i;
        while (i < s.size() && space_at(s, i) == 0) i++;
        parts.push_back(string_value(s.substr(start, i - start)));
    }
    return list_value(std::move(parts));
}

inline std::string replace_all(Renderer& r, const std::string& s, const std::string& old, const std::string& with, int64_t count) {
    std::string out;
    if (old.empty()) {  // Python inserts `with` around every code point
        const auto off = codepoint_offsets(s);
        int64_t done = 0;
        for (size_t i = 0; i + 1 < off.size(); i++) {
            if (count < 0 || done++ < count) out += with;
            out.append(s, off[i], off[i + 1] - off[i]);
        }
        if (count < 0 || done < count) out += with;
        r.charge(out.size());
        return out;
    }
    size_t start = 0, p;
    int64_t done = 0;
    while ((count < 0 || done < count) && (p = s.find(old, start)) != std::string::npos) {
        out.append(s, start, p - start);
        out += with;
        start = p + old.size();
        done++;
        r.charge(out.size());
    }
    out.append(s, start, std::string::npos);
    r.charge(out.size());
    return out;
}

inline std::string ascii_lower(std::string s) {
    for (char& c : s) c = (char)std::tolower((unsigned char)c);
    return s;
}
inline std::string ascii_upper(std::string s) {
    for (char& c : s) c = (char)std::toupper((unsigned char)c);
    return s;
}
// str.title(): each run of letters capitalized.
inline std::string ascii_title(std::string s) {
    bool prev_letter = false;
    for (char& c : s) {
        const bool letter = std::isalpha((unsigned char)c);
        c = (char)(letter && !prev_letter ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
        prev_letter = letter;
    }
    return s;
}
inline std::string ascii_capitalize(std::string s) {
    s = ascii_lower(std::move(s));
    if (!s.empty()) s[0] = (char)std::toupper((unsigned char)s[0]);
    return s;
}

// str.startswith / endswith: a prefix or a tuple of them.
inline bool affix_match(const std::string& s, const Value& affix, bool prefix) {
    if (affix.kind == Kind::List) {
        for (auto& a : *affix.list)
            if (affix_match(s, a, prefix)) return true;
        return false;
    }
    const std::string& x = require_string(affix, prefix ? "startswith argument" : "endswith argument").text;
    return prefix ? starts_with(s, x) : ends_with(s, x);
}

inline bool all_chars(const std::string& s, int (*pred)(int)) {
    if (s.empty()) return false;
    for (unsigned char c : s)
        if (!pred(c)) return false;
    return true;
}

inline Value string_method(const std::string& s, const std::string& name) {
    auto bind = [&](std::function<Value(Renderer&, const CallArgs&)> f) {
        return func_value("str." + name, [f](Renderer& r, CallArgs& a) { return f(r, a); });
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const bool left = name != "rstrip", right = name != "lstrip";
        return bind([s, left, right](Renderer&, const CallArgs& a) { return strip_method(s, arg(a, 0, "chars"), left, right); });
    }
    if (name == "split" || name == "rsplit") {
        const bool from_right = name == "rsplit";
        return bind([s, from_right](Renderer&, const CallArgs& a) {
            const Value max = arg(a, 1, "maxsplit", int_value(-1));
            return split_method(s, arg(a, 0, "sep"), is_integral(max) ? as_int(max) : -1, from_right);
        });
    }
    if (name == "splitlines")
        return bind([s](Renderer&, const CallArgs&) {
            ValueList lines;
            size_t start = 0;
            for (size_t i = 0; i < s.size(); i++)
                if (s[i] == '\n' || s[i] == '\r') {
                    lines.push_back(string_value(s.substr(start, i - start)));
                    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') i++;
                    start = i + 1;
                }
            if (start < s.size()) lines.push_back(string_value(s.substr(start)));
            return list_value(std::move(lines));
        });
    if (name == "startswith" || name == "endswith") {
        const bool prefix = name == "startswith";
        return bind([s, prefix](Renderer&, const CallArgs& a) { return bool_value(affix_match(s, arg(a, 0, "prefix"), prefix)); });
    }
    if (name == "replace")
        return bind([s](Renderer& r, const CallArgs& a) {
            const Value count = arg(a, 2, "count", int_value(-1));
            return string_value(replace_all(r, s, require_string(arg(a, 0, "old"), "replace() argument 1").text,
                                            require_string(arg(a, 1, "new"), "replace() argument 2").text,
                                            is_integral(count) ? as_int(count) : -1));
        });
    if (name == "lower") return bind([s](Renderer&, const CallArgs&) { return string_value(ascii_lower(s)); });
    if (name == "upper") return bind([s](Renderer&, const CallArgs&) { return string_value(ascii_upper(s)); });
    if (name == "title") return bind([s](Renderer&, const CallArgs&) { return string_value(ascii_title(s)); });
    if (name == "capitalize") return bind([s](Renderer&, const CallArgs&) { return string_value(ascii_capitalize(s)); });
    if (name == "find" || name == "rfind" || name == "count" || name == "index")
        return bind([s, name](Renderer&, const CallArgs& a) {
            const std::string& x = require_string(arg(a, 0, "sub"), "argument").text;
            if (name == "count") {
                if (x.empty()) return int_value((int64_t)codepoint_count(s) + 1);
                int64_t n = 0;
                for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) n++;
                return int_value(n);
            }
            const size_t p = name == "rfind" ? s.rfind(x) : s.find(x);
            if (p == std::string::npos && name == "index") fault("ValueError: substring not found");
            return int_value(p == std::string::npos ? -1 : (int64_t)codepoint_count(s.substr(0, p)));
        });
    if (name == "join")
        return bind([s](Renderer& r, const CallArgs& a) {
            std::string out;
            bool first = true;
            for (auto& x : iterate(arg(a, 0, "iterable"))) {
                if (!first) out += s;
                out += require_string(x, "sequence item").text;
                first = false;
                r.charge(out.size());
            }
            return string_value(std::move(out));
        });
    if (name == "isdigit") return bind([s](Renderer&, const CallArgs&) { return bool_value(all_chars(s, ::isdigit)); });
    if (name == "isalpha") return bind([s](Renderer&, const CallArgs&) { return bool_value(all_chars(s, ::isalpha)); });
    if (name == "isalnum") return bind([s](Renderer&, const CallArgs&) { return bool_value(all_chars(s, ::isalnum)); });
    if (name == "isspace") return bind([s](Renderer&, const CallArgs&) { return bool_value(!s.empty() && py_strip(s).empty()); });
    if (name == "islower") return bind([s](Renderer&, const CallArgs&) { return bool_value(ascii_lower(s) == s && ascii_upper(s) != s); });
    if (name == "isupper") return bind([s](Renderer&, const CallArgs&) { return bool_value(ascii_upper(s) == s && ascii_lower(s) != s); });
    return undefined_value("");
}

// Methods that change a list or dict: the immutable sandbox refuses them.
inline bool is_mutating_method(const std::string& name) {
    static const char* const kNames[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                                         "update", "setdefault", "popitem", "__setitem__", "__delitem__"};
    for (const char* n : kNames)
        if (name == n) return true;
    return false;
}

inline Value builtin_method(const Value& obj, const std::string& name) {
    if (obj.kind == Kind::String) return string_method(obj.text, name);
    if (obj.kind != Kind::Dict && obj.kind != Kind::List) return undefined_value("");
    if (is_mutating_method(name))
        return undefined_value("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.");
    if (obj.kind == Kind::Dict) {
        const Value d = obj;
        if (name == "get")
            return func_value("dict.get", [d](Renderer&, CallArgs& a) {
                const Value* v = dict_find(*d.dict, arg(a, 0, "key"));
                return v ? *v : arg(a, 1, "default", none_value());
            });
        if (name == "items") return func_value("dict.items", [d](Renderer&, CallArgs&) { return dict_items(d); });
        if (name == "keys") return func_value("dict.keys", [d](Renderer&, CallArgs&) { return list_value(iterate(d)); });
        if (name == "values")
            return func_value("dict.values", [d](Renderer&, CallArgs&) {
                ValueList vals;
                for (auto& kv : d.dict->items) vals.push_back(kv.second);
                return list_value(std::move(vals));
            });
        if (name == "copy") return func_value("dict.copy", [d](Renderer&, CallArgs&) { return dict_value(d.dict->items); });
    }
    if (obj.kind == Kind::List && obj.seq != SeqKind::Generator) {
        const Value l = obj;
        if (name == "index" || name == "count")
            return func_value("list." + name, [l, name](Renderer&, CallArgs& a) {
                const Value x = arg(a, 0, "value");
                int64_t n = 0;
                for (size_t i = 0; i < l.list->size(); i++)
                    if (equals((*l.list)[i], x)) {
                        if (name == "index") return int_value((int64_t)i);
                        n++;
                    }
                if (name == "index") fault("ValueError: value is not in list");
                return int_value(n);
            });
    }
    return undefined_value("");
}

// ---- tests (`x is name`) ----

inline bool apply_test(Renderer& r, const std::string& name, const Value& v, const CallArgs& a);

// Sort/unique/min/max key: strings compare case-insensitively unless asked, as Jinja2's filters do.
inline Value sort_key(const Value& v, bool case_sensitive) {
    return !case_sensitive && v.kind == Kind::String ? string_value(ascii_lower(v.text)) : v;
}

// Item lookup along a dotted path ("function.name"), as the attribute= arguments take it.
inline Value attribute_path(const Value& v, const std::string& path) {
    Value cur = v;
    size_t start = 0;
    while (true) {
        const size_t dot = path.find('.', start);
        const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        if (cur.kind == Kind::Undefined) return cur;
        const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
        cur = numeric ? get_item(cur, int_value(std::atoll(part.c_str()))) : get_item(cur, string_value(part));
        if (dot == std::string::npos) return cur;
        start = dot + 1;
    }
}

inline Value apply_filter(Renderer& r, const std::string& name, const Value& v, CallArgs& a);

// select / reject / selectattr / rejectattr: items for which the test (default: truthiness) holds.
inline Value select_items(Renderer& r, const Value& seq, CallArgs& a, bool by_attribute, bool keep) {
    size_t first_test_arg = 0;
    std::string attribute;
    if (by_attribute) {
        attribute = require_string(arg(a, 0, "attribute"), "attribute").text;
        first_test_arg = 1;
    }
    const Value test = arg(a, first_test_arg, "test");
    CallArgs test_args;
    for (size_t i = first_test_arg + 1; i < a.positional.size(); i++) test_args.positional.push_back(a.positional[i]);
    ValueList out;
    if (!truthy(seq)) return list_value({}, SeqKind::Generator);  // Jinja2 skips a falsy input (none)
    for (auto& item : iterate(seq)) {
        r.step();
        const Value subject = by_attribute ? attribute_path(item, attribute) : item;
        const bool pass = test.kind == Kind::String ? apply_test(r, test.text, subject, test_args) : truthy(subject);
        if (pass == keep) out.push_back(item);
    }
    return list_value(std::move(out), SeqKind::Generator);
}

// map(attribute=..., default=...) or map('filter', args...).
inline Value map_items(Renderer& r, const Value& seq, CallArgs& a) {
    ValueList out;
    if (!truthy(seq)) return list_value({}, SeqKind::Generator);  // Jinja2 skips a falsy input (none)
    const Value attribute = arg(a, 99, "attribute");
    if (attribute.kind == Kind::String) {
        const Value def = arg(a, 99, "default");
        for (auto& item : iterate(seq)) {
            r.step();
            Value x = attribute_path(item, attribute.text);
            out.push_back(x.kind == Kind::Undefined && def.kind != Kind::Undefined ? def : x);
        }
        return list_value(std::move(out), SeqKind::Generator);
    }
    const std::string filter = require_string(arg(a, 0, "filter"), "map filter name").text;
    CallArgs filter_args;
    filter_args.positional.assign(a.positional.begin() + std::min<size_t>(1, a.positional.size()), a.positional.end());
    filter_args.named = a.named;
    for (auto& item : iterate(seq)) {
        r.step();
        out.push_back(apply_filter(r, filter, item, filter_args));
    }
    return list_value(std::move(out), SeqKind::Generator);
}

// Hugging Face's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
inline Value tojson_filter(Renderer& r, const Value& v, const CallArgs& a) {
    JsonStyle style;
    style.ensure_ascii = truthy(arg(a, 0, "ensure_ascii", bool_value(false)));
    const Value indent = arg(a, 1, "indent", none_value());
    if (is_integral(indent)) {
        style.indented = true;
        style.indent.assign((size_t)std::max<int64_t>(0, std::min<int64_t>(as_int(indent), 64)), ' ');
    } else if (indent.kind == Kind::String) {
        style.indented = true;
        style.indent = indent.text;
    }
    if (style.indented) style.item_separator = ",";
    const Value separators = arg(a, 2, "separators", none_value());
    if (separators.kind == Kind::List && separators.list->size() == 2) {
        style.item_separator = require_string((*separators.list)[0], "separator").text;
        style.key_separator = require_string((*separators.list)[1], "separator").text;
    }
    style.sort_keys = truthy(arg(a, 3, "sort_keys", bool_value(false)));
    std::string out;
    json_dump(out, v, style, 0, r.limits.max_output);
    r.charge(out.size());
    return string_value(std::move(out));
}

inline Value length_of(const Value& v) {
    switch (v.kind) {
    case Kind::Undefined: return int_value(0);
    case Kind::String: return int_value((int64_t)codepoint_count(v.text));
    case Kind::List:
        if (v.seq == SeqKind::Generator) break;
        return int_value((int64_t)v.list->size());
    case Kind::Dict:
        if (v.dict->is_namespace) break;
        return int_value((int64_t)v.dict->items.size());
    default: break;
    }
    fault("TypeError: object of type '" + type_name(v) + "' has no len()");
}

// sort(reverse=False, case_sensitive=False, attribute=None), stable.
inline Value sort_filter(const Value& v, const CallArgs& a) {
    ValueList items = iterate(v);
    const bool reverse = truthy(arg(a, 0, "reverse", bool_value(false)));
    const bool case_sensitive = truthy(arg(a, 1, "case_sensitive", bool_value(false)));
    const Value attribute = arg(a, 2, "attribute", none_value());
    auto key = [&](const Value& x) {
        return sort_key(attribute.kind == Kind::String ? attribute_path(x, attribute.text) : x, case_sensitive);
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        return reverse ? compare(key(y), key(x), "<") < 0 : compare(key(x), key(y), "<") < 0;
    });
    return list_value(std::move(items));
}

// dictsort(case_sensitive=False, by='key', reverse=False): (key, value) pairs.
inline Value dictsort_filter(const Value& v, const CallArgs& a) {
    if (v.kind != Kind::Dict) fault("TypeError: dictsort needs a mapping");
    ValueList pairs = *dict_items(v).list;
    const bool case_sensitive = truthy(arg(a, 0, "case_sensitive", bool_value(false)));
    const size_t by = arg(a, 1, "by", string_value("key")).text == "value" ? 1 : 0;
    const bool reverse = truthy(arg(a, 2, "reverse", bool_value(false)));
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
        const int c = compare(sort_key((*x.list)[by], case_sensitive), sort_key((*y.list)[by], case_sensitive), "<");
        return reverse ? c > 0 : c < 0;
    });
    return list_value(std::move(pairs));
}

// min / max / unique with Jinja2's case-insensitive default.
inline Value extreme_filter(const Value& v, const CallArgs& a, bool want_max) {
    const ValueList items = iterate(v);
    const bool case_sensitive = truthy(arg(a, 0, "case_sensitive", bool_value(false)));
    const Value attribute = arg(a, 1, "attribute", none_value());
    auto key = [&](const Value& x) {
        return sort_key(attribute.kind == Kind::String ? attribute_path(x, attribute.text) : x, case_sensitive);
    };
    if (items.empty()) return undefined_value("No aggregated item, sequence was empty.");
    size_t best = 0;
    for (size_t i = 1; i < items.size(); i++) {
        const int c = compare(key(items[i]), key(items[best]), "<");
        if (want_max ? c > 0 : c < 0) best = i;
    }
    return items[best];
}

inline Value unique_filter(const Value& v, const CallArgs& a) {
    const bool case_sensitive = truthy(arg(a, 0, "case_sensitive", bool_value(false)));
    ValueList out, seen;
    for (auto& x : iterate(v)) {
        const Value k = sort_key(x, case_sensitive);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
            seen.push_back(k);
            out.push_back(x);
        }
    }
    return list_value(std::move(out), SeqKind::Generator);
}

inline Value int_filter(const Value& v, const CallArgs& a) {
    const Value def = arg(a, 0, "default", int_value(0));
    if (is_integral(v)) return int_value(as_int(v));
    if (v.kind == Kind::Float) return std::isfinite(v.number) ? int_value((int64_t)v.number) : def;
    if (v.kind == Kind::String) {
        const std::string s = py_strip(v.text);
        char* end = nullptr;
        errno = 0;
        const long long i = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && *end == 0 && errno == 0) return int_value(i);
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && *end == 0 && std::isfinite(d)) return int_value((int64_t)d);
    }
    return def;
}

inline Value float_filter(const Value& v, const CallArgs& a) {
    if (is_number(v)) return float_value(as_double(v));
    if (v.kind == Kind::String) {
        const std::string s = py_strip(v.text);
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && *end == 0) return float_value(d);
    }
    return arg(a, 0, "default", float_value(0));
}

// indent(width=4, first=False, blank=False): every line but the first (and blank ones) indented.
inline Value indent_filter(Renderer& r, const std::string& s, const CallArgs& a) {
    const Value width = arg(a, 0, "width", int_value(4));
    const std::string pad = width.kind == Kind::String ? width.text : std::string((size_t)std::max<int64_t>(0, std::min<int64_t>(as_int(width), 256)), ' ');
    const bool first = truthy(arg(a, 1, "first", bool_value(false))), blank = truthy(arg(a, 2, "blank", bool_value(false)));
    std::string out;
    size_t start = 0;
    for (bool is_first = true;; is_first = false) {
        const size_t nl = s.find('\n', start);
        const std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        if ((!is_first || first) && (blank || !py_strip(line).empty())) out += pad;
        out += line;
        r.charge(out.size());
        if (nl == std::string::npos) break;
        out += '\n';
        start = nl + 1;
    }
    return string_value(std::move(out));
}

inline Value apply_filter(Renderer& r, const std::string& name, const Value& v, CallArgs& a) {
    r.step();
    if (name == "default" || name == "d") {
        const bool boolean = truthy(arg(a, 1, "boolean", bool_value(false)));
        return v.kind == Kind::Undefined || (boolean && !truthy(v)) ? arg(a, 0, "default_value", string_value("")) : v;
    }
    if (name == "tojson") return tojson_filter(r, v, a);
    if (name == "safe" || name == "string") {  // markupsafe: safe marks text, string keeps the mark
        Value text = string_value(to_str(v));
        text.markup = name == "safe" || v.markup;
        return text;
    }
    if (name == "length" || name == "count") return length_of(v);
    if (name == "items") {
        if (v.kind == Kind::Undefined) return list_value({});
        if (v.kind != Kind::Dict || v.dict->is_namespace) fault("TypeError: Can only get item pairs from a mapping.");
        return dict_items(v);
    }
    if (name == "list") return list_value(iterate(v));
    if (name == "first" || name == "last") {
        const ValueList items = iterate(v);
        if (items.empty()) return undefined_value("No " + name + " item, sequence was empty.");
        return name == "first" ? items.front() : items.back();
    }
    if (name == "join") {
        const std::string sep = to_str(arg(a, 0, "d", string_value("")));
        const Value attribute = arg(a, 1, "attribute", none_value());
        std::string out;
        bool first = true;
        for (auto& x : iterate(v)) {
            if (!first) out += sep;
            out += to_str(attribute.kind == Kind::String ? attribute_path(x, attribute.text) : x);
            first = false;
            r.charge(out.size());
        }
        return string_value(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr") return select_items(r, v, a, true, name == "selectattr");
    if (name == "select" || name == "reject") return select_items(r, v, a, false, name == "select");
    if (name == "map") return map_items(r, v, a);
    if (name == "sort") return sort_filter(v, a);
    if (name == "dictsort") return dictsort_filter(v, a);
    if (name == "unique") return unique_filter(v, a);
    if (name == "min" || name == "max") return extreme_filter(v, a, name == "max");
    if (name == "reverse") {
        if (v.kind == Kind::String) return slice_value(v, none_value(), none_value(), int_value(-1));
        ValueList items = iterate(v);
        std::reverse(items.begin(), items.end());
        return list_value(std::move(items), SeqKind::Generator);
    }
    if (name == "attr") return get_attribute(v, require_string(arg(a, 0, "name"), "attribute name").text);
    if (name == "int") return int_filter(v, a);
    if (name == "float") return float_filter(v, a);
    if (name == "abs") {
        if (!is_number(v)) operand_fault("abs", v, v);
        return v.kind == Kind::Float ? float_value(std::fabs(v.number)) : int_value(std::llabs(as_int(v)));
    }
    if (name == "round") {
        const double scale = std::pow(10.0, (double)as_int(arg(a, 0, "precision", int_value(0))));
        const std::string method = arg(a, 1, "method", string_value("common")).text;
        const double x = as_double(v) * scale;
        return float_value((method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x)) / scale);
    }
    if (name == "sum") {
        Value total = arg(a, 1, "start", int_value(0));
        const Value attribute = arg(a, 0, "attribute", none_value());
        for (auto& x : iterate(v)) total = arithmetic(r, "+", total, attribute.kind == Kind::String ? attribute_path(x, attribute.text) : x);
        return total;
    }
    // the rest work on the text of the value
    static const char* const kTextFilters[] = {"trim", "lower", "upper", "title", "capitalize", "replace", "escape", "e", "indent", "wordcount"};
    if (std::none_of(std::begin(kTextFilters), std::end(kTextFilters), [&](const char* f) { return name == f; }))
        fault("No filter named '" + name + "' found.");
    if (v.kind == Kind::Undefined && name != "trim" && name != "lower" && name != "upper") undefined_fault(v);
    const std::string s = to_str(v);
    if (name == "trim") return strip_method(s, arg(a, 0, "chars"), true, true);
    if (name == "lower") return string_value(ascii_lower(s));
    if (name == "upper") return string_value(ascii_upper(s));
    if (name == "title") return string_value(ascii_title(s));
    if (name == "capitalize") return string_value(ascii_capitalize(s));
    if (name == "replace") {
        const Value count = arg(a, 2, "count", int_value(-1));
        return string_value(replace_all(r, s, to_str(arg(a, 0, "old")), to_str(arg(a, 1, "new")), is_integral(count) ? as_int(count) : -1));
    }
    if (name == "escape" || name == "e") {
        Value text = string_value(v.markup ? s : html_escape(s));
        text.markup = true;
        return text;
    }
    if (name == "indent") return indent_filter(r, s, a);
    return int_value((int64_t)split_method(s, none_value(), -1, false).list->size());  // wordcount
}

inline bool apply_test(Renderer& r, const std::string& name, const Value& v, const CallArgs& a) {
    r.step();
    if (name == "defined") return v.kind != Kind::Undefined;
    if (name == "undefined") return v.kind == Kind::Undefined;
    if (name == "none") return v.kind == Kind::None;
    if (name == "string") return v.kind == Kind::String;
    if (name == "mapping") return v.kind == Kind::Dict && !v.dict->is_namespace;
    // an undefined value iterates (over nothing) and has a len, so Jinja2 counts it as both
    if (name == "iterable") return v.kind == Kind::Undefined || v.kind == Kind::String || v.kind == Kind::List || (v.kind == Kind::Dict && !v.dict->is_namespace);
    if (name == "sequence") return v.kind == Kind::Undefined || v.kind == Kind::String || (v.kind == Kind::List && v.seq != SeqKind::Generator) || (v.kind == Kind::Dict && !v.dict->is_namespace);
    if (name == "number") return is_number(v);
    if (name == "integer") return v.kind == Kind::Int;
    if (name == "float") return v.kind == Kind::Float;
    if (name == "boolean") return v.kind == Kind::Bool;
    if (name == "true") return v.kind == Kind::Bool && v.boolean;
    if (name == "false") return v.kind == Kind::Bool && !v.boolean;
    if (name == "callable") return v.kind == Kind::Func;
    if (name == "lower") return v.kind == Kind::String && ascii_lower(v.text) == v.text;
    if (name == "upper") return v.kind == Kind::String && ascii_upper(v.text) == v.text;
    if (name == "even" || name == "odd") {
        if (!is_integral(v)) operand_fault("%", v, int_value(2));
        return (floor_mod(as_int(v), 2) == 0) == (name == "even");
    }
    const Value other = arg(a, 0, "other");
    if (name == "divisibleby") {
        if (!is_integral(v) || !is_integral(other) || as_int(other) == 0) operand_fault("%", v, other);
        return floor_mod(as_int(v), as_int(other)) == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equals(v, other);
    if (name == "ne" || name == "!=") return !equals(v, other);
    if (name == "sameas") return v.kind == other.kind && (v.kind == Kind::None || v.kind == Kind::Undefined || equals(v, other)) &&
                                  (v.kind != Kind::Dict || v.dict == other.dict) && (v.kind != Kind::List || v.list == other.list);
    if (name == "lt" || name == "lessthan" || name == "<") return compare(v, other, "<") < 0;
    if (name == "le" || name == "<=") return compare(v, other, "<=") <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, other, ">") > 0;
    if (name == "ge" || name == ">=") return compare(v, other, ">=") >= 0;
    if (name == "in") return contains(other, v);
    fault("No test named '" + name + "' found.");
}

// ---- globals ----

// strftime of `now` (Unix seconds, UTC) or of the local clock when now < 0.
inline std::string format_time(const std::string& fmt, int64_t now) {
    const time_t t = now >= 0 ? (time_t)now : std::time(nullptr);
    std::tm tm{};
#if defined(_WIN32)
    if (now >= 0) gmtime_s(&tm, &t); else localtime_s(&tm, &t);
#else
    if (now >= 0) gmtime_r(&t, &tm); else localtime_r(&t, &tm);
#endif
    char buf[512];
    const size_t n = fmt.size() < 200 ? std::strftime(buf, sizeof buf, fmt.c_str(), &tm) : 0;
    return std::string(buf, n);
}

inline Value range_global(const CallArgs& a) {
    for (auto& x : a.positional)
        if (!is_integral(x)) fault("TypeError: range() needs integers, not " + type_name(x));
    int64_t start = 0, stop = 0, step = 1;
    if (a.positional.size() == 1) stop = as_int(a.positional[0]);
    else if (a.positional.size() >= 2) {
        start = as_int(a.positional[0]);
        stop = as_int(a.positional[1]);
        if (a.positional.size() >= 3) step = as_int(a.positional[2]);
    }
    if (step == 0) fault("ValueError: range() arg 3 must not be zero");
    const long double count = step > 0 ? std::ceil(((long double)stop - start) / step) : std::ceil(((long double)start - stop) / -step);
    if (count > (long double)kMaxItems) fault("range() of more than " + std::to_string(kMaxItems) + " items");
    ValueList items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(int_value(i));
    return list_value(std::move(items));
}

// dict(mapping, **kw) and namespace(mapping, **kw).
inline Value dict_global(const CallArgs& a, bool is_namespace) {
    std::vector<std::pair<Value, Value>> items;
    auto put = [&](const Value& k, const Value& v) {
        if (is_namespace && k.kind == Kind::String && starts_with(k.text, "_"))
            fault("SecurityError: namespace attribute names must not start with '_'");
        for (auto& kv : items)
            if (equals(kv.first, k)) {
                kv.second = v;
                return;
            }
        items.push_back({k, v});
    };
    for (auto& p : a.positional) {
        if (p.kind == Kind::Dict && !p.dict->is_namespace) {
            for (auto& kv : p.dict->items) put(kv.first, kv.second);
        } else {
            for (auto& pair : iterate(p)) {
                if (pair.kind != Kind::List || pair.list->size() != 2) fault("ValueError: dictionary update sequence element has wrong length");
                put((*pair.list)[0], (*pair.list)[1]);
            }
        }
    }
    for (auto& kv : a.named) put(string_value(kv.first), kv.second);
    return dict_value(std::move(items), is_namespace);
}

inline Value lookup_global(const std::string& name) {
    if (name == "range") return func_value("range", [](Renderer&, CallArgs& a) { return range_global(a); });
    if (name == "dict") return func_value("dict", [](Renderer&, CallArgs& a) { return dict_global(a, false); });
    if (name == "namespace") return func_value("namespace", [](Renderer&, CallArgs& a) { return dict_global(a, true); });
    if (name == "raise_exception")
        return func_value("raise_exception", [](Renderer&, CallArgs& a) -> Value {
            throw Error(to_str(arg(a, 0, "message", string_value("raise_exception called"))));
        });
    if (name == "strftime_now")
        return func_value("strftime_now", [](Renderer& r, CallArgs& a) {
            return string_value(format_time(require_string(arg(a, 0, "format"), "strftime format").text, r.now));
        });
    return undefined_value("'" + name + "' is undefined");
}

// ---- 11g. Jinja statement and expression evaluation ---------------------------------------------

inline CallArgs eval_args(Renderer& r, const ArgExprs& args) {
    CallArgs a;
    for (auto& e : args.positional) a.positional.push_back(e->eval(r));
    for (auto& kv : args.named) a.named.push_back({kv.name, kv.value->eval(r)});
    return a;
}

inline Value call_value(Renderer& r, const Value& callee, CallArgs& args) {
    if (callee.kind == Kind::Undefined) undefined_fault(callee);
    if (callee.kind != Kind::Func) fault("TypeError: '" + type_name(callee) + "' object is not callable");
    r.step();
    return callee.func->call(r, args);
}

inline Value NameExpr::eval(Renderer& r) const {
    if (const Value* v = r.scope->find(name)) return *v;
    return lookup_global(name);
}

inline Value ListExpr::eval(Renderer& r) const {
    ValueList values;
    for (auto& e : items) values.push_back(e->eval(r));
    return list_value(std::move(values), tuple ? SeqKind::Tuple : SeqKind::List);
}

inline Value DictExpr::eval(Renderer& r) const {
    CallArgs a;
    ValueList pairs;
    for (auto& kv : items) pairs.push_back(tuple_value({kv.first->eval(r), kv.second->eval(r)}));
    a.positional.push_back(list_value(std::move(pairs)));
    return dict_global(a, false);
}

inline Value AttributeExpr::eval(Renderer& r) const { return get_attribute(object->eval(r), name); }
inline Value SubscriptExpr::eval(Renderer& r) const {
    const Value obj = object->eval(r);
    return get_item(obj, index->eval(r));
}
inline Value SliceExpr::eval(Renderer& r) const {
    const Value obj = object->eval(r);
    auto bound = [&](const ExprPtr& e) { return e ? e->eval(r) : none_value(); };
    const Value lo = bound(start), hi = bound(stop), st = bound(step);
    return slice_value(obj, lo, hi, st);
}

inline Value CallExpr::eval(Renderer& r) const {
    const Value f = callee->eval(r);
    CallArgs a = eval_args(r, args);
    return call_value(r, f, a);
}

inline Value FilterExpr::apply(Renderer& r, const Value& input) const {
    CallArgs a = eval_args(r, args);
    return apply_filter(r, name, input, a);
}
inline Value FilterExpr::eval(Renderer& r) const { return apply(r, operand->eval(r)); }

inline Value TestExpr::eval(Renderer& r) const {
    const Value v = operand->eval(r);
    CallArgs a = eval_args(r, args);
    return bool_value(apply_test(r, name, v, a) != negated);
}

inline Value UnaryExpr::eval(Renderer& r) const {
    const Value v = operand->eval(r);
    if (op == "not") return bool_value(!truthy(v));
    if (!is_number(v)) operand_fault(op, v, v);
    if (op == "+") return v.kind == Kind::Bool ? int_value(as_int(v)) : v;
    return v.kind == Kind::Float ? float_value(-v.number) : int_value(checked_int(-(long double)as_int(v), "-"));
}

inline Value BinaryExpr::eval(Renderer& r) const {
    Value a = left->eval(r);
    if (op == "and") return truthy(a) ? right->eval(r) : a;
    if (op == "or") return truthy(a) ? a : right->eval(r);
    const Value b = right->eval(r);
    if (op == "~") {
        std::string s = to_str(a) + to_str(b);
        r.charge(s.size());
        return string_value(std::move(s));
    }
    return arithmetic(r, op, a, b);
}

inline bool compare_op(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    const int c = compare(a, b, op.c_str());
    return op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
}

inline Value CompareExpr::eval(Renderer& r) const {
    Value a = first->eval(r);
    for (auto& step : rest) {
        Value b = step.second->eval(r);
        if (!compare_op(step.first, a, b)) return bool_value(false);
        a = std::move(b);
    }
    return bool_value(true);
}

inline Value CondExpr::eval(Renderer& r) const {
    if (truthy(condition->eval(r))) return then->eval(r);
    return otherwise ? otherwise->eval(r) : undefined_value("the inline if expression evaluated to false and no else section was defined");
}

inline void TextStmt::exec(Renderer& r) const { r.emit(text); }
inline void OutputStmt::exec(Renderer& r) const { r.emit(to_str(value->eval(r))); }

inline void IfStmt::exec(Renderer& r) const {
    for (auto& b : branches)
        if (truthy(b.first->eval(r))) {
            r.exec(b.second);
            return;
        }
    r.exec(otherwise);
}

// Binds for/set targets: one name, or a sequence unpacked into several.
inline void assign_targets(Scope& scope, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
        scope.set(targets[0], v);
        return;
    }
    const ValueList items = iterate(v);
    if (items.size() != targets.size())
        fault("ValueError: cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()));
    for (size_t i = 0; i < targets.size(); i++) scope.set(targets[i], items[i]);
}

// The `loop` variable of iteration i; `cycle` is the loop's one loop.cycle, reading `index`.
inline Value loop_value(const ValueList& items, size_t i, const Value& cycle) {
    const size_t n = items.size();
    std::vector<std::pair<Value, Value>> f;
    f.reserve(12);
    auto put = [&](const char* k, Value v) { f.push_back({string_value(k), std::move(v)}); };
    put("index", int_value((int64_t)i + 1));
    put("index0", int_value((int64_t)i));
    put("revindex", int_value((int64_t)(n - i)));
    put("revindex0", int_value((int64_t)(n - i - 1)));
    put("first", bool_value(i == 0));
    put("last", bool_value(i + 1 == n));
    put("length", int_value((int64_t)n));
    put("depth", int_value(1));
    put("depth0", int_value(0));
    put("previtem", i > 0 ? items[i - 1] : undefined_value("there is no previous item"));
    put("nextitem", i + 1 < n ? items[i + 1] : undefined_value("there is no next item"));
    put("cycle", cycle);
    return dict_value(std::move(f));
}

inline void ForStmt::exec(Renderer& r) const {
    const Value seq = iterable->eval(r);
    std::shared_ptr<const ValueList> walked = seq.kind == Kind::List ? seq.list : std::make_shared<const ValueList>(iterate(seq));
    Scope loop_scope;
    loop_scope.parent = r.scope;
    r.scope = &loop_scope;
    try {
        if (filter) {
            ValueList kept;
            for (auto& x : *walked) {
                r.step();
                assign_targets(loop_scope, targets, x);
                if (truthy(filter->eval(r))) kept.push_back(x);
            }
            walked = std::make_shared<const ValueList>(std::move(kept));
        }
        const ValueList& items = *walked;
        auto index = std::make_shared<size_t>(0);
        const Value cycle = func_value("loop.cycle", [index](Renderer&, CallArgs& a) {
            if (a.positional.empty()) fault("TypeError: no items for cycling given");
            return a.positional[*index % a.positional.size()];
        });
        for (size_t i = 0; i < items.size(); i++) {
            r.step();
            *index = i;
            assign_targets(loop_scope, targets, items[i]);
            if (uses_loop) loop_scope.set("loop", loop_value(items, i, cycle));
            r.exec(body);
            if (r.flow == Flow::Break) {
                r.flow = Flow::Normal;
                break;
            }
            r.flow = Flow::Normal;
        }
    } catch (...) {
        r.scope = loop_scope.parent;
        throw;
    }
    r.scope = loop_scope.parent;
    if (walked->empty()) r.exec(otherwise);
}

inline void SetStmt::exec(Renderer& r) const {
    Value v;
    if (value) {
        v = value->eval(r);
    } else {
        v = string_value(r.capture(block));
        for (auto& f : filters) v = f->apply(r, v);
    }
    if (!attribute) {
        assign_targets(*r.scope, targets, v);
        return;
    }
    const Value* ns = r.scope->find(targets[0]);
    if (!ns || ns->kind != Kind::Dict || !ns->dict->is_namespace) fault("cannot assign attribute on non-namespace object");
    if (v.kind == Kind::Dict && v.dict->is_namespace) fault("a namespace cannot hold a namespace");
    for (auto& kv : ns->dict->items)
        if (kv.first.text == targets[1]) {
            kv.second = std::move(v);
            return;
        }
    ns->dict->items.push_back({string_value(targets[1]), std::move(v)});
}

inline void MacroStmt::exec(Renderer& r) const {
    const MacroStmt* macro = this;
    r.scope->set(name, func_value(name, [macro](Renderer& rr, CallArgs& a) {
        if (++rr.call_depth > rr.limits.max_call_depth)
            fault("macro calls nested more than " + std::to_string(rr.limits.max_call_depth) + " deep");
        Scope local;
        local.parent = rr.root;
        if (a.positional.size() > macro->params.size()) fault("macro '" + macro->name + "' takes " + std::to_string(macro->params.size()) + " arguments");
        for (auto& kv : a.named)
            if (std::none_of(macro->params.begin(), macro->params.end(), [&](auto& p) { return p.first == kv.first; }))
                fault("macro '" + macro->name + "' takes no keyword argument '" + kv.first + "'");
        Scope* saved = rr.scope;
        rr.scope = &local;
        std::string out;
        try {
            for (size_t i = 0; i < macro->params.size(); i++) {
                const auto& p = macro->params[i];
                Value v = arg(a, i, p.first.c_str(), undefined_value("parameter '" + p.first + "' was not provided"));
                if (v.kind == Kind::Undefined && p.second) v = p.second->eval(rr);
                local.set(p.first, std::move(v));
            }
            out = rr.capture(macro->body);
        } catch (...) {
            rr.scope = saved;
            rr.call_depth--;
            throw;
        }
        rr.scope = saved;
        rr.call_depth--;
        return string_value(std::move(out));
    }));
}

inline void FilterBlockStmt::exec(Renderer& r) const {
    Value v = string_value(r.capture(body));
    for (auto& f : filters) v = f->apply(r, v);
    r.emit(to_str(v));
}

inline void LoopControlStmt::exec(Renderer& r) const { r.flow = is_break ? Flow::Break : Flow::Continue; }

} // namespace jinja_detail

struct JinjaTemplate::Program {
    jinja_detail::Body body;
};

JinjaTemplate::JinjaTemplate(const std::string& source) {
    auto p = std::make_shared<Program>();
    try {
        p->body = jinja_detail::Parser(jinja_detail::Lexer(source).run()).parse_template();
    } catch (const jinja_detail::Fault& f) {  // a value built while parsing (a literal too deep)
        throw Error("template: " + f.message);
    }
    program_ = std::move(p);
}

// ---- 11h. Rendering: a program with variables, a chat request as transformers prepares it -------

namespace jinja_detail {

// Renders a parsed program with these variables (a dict value).
inline std::string render_program(const Body& body, const Value& vars, int64_t now, const JinjaLimits& limits) {
    Scope root;
    for (auto& kv : vars.dict->items) root.set(to_str(kv.first), kv.second);
    std::string out;
    Renderer r;
    r.limits = limits;
    r.now = now;
    r.out = &out;
    r.scope = r.root = &root;
    try {
        r.exec(body);
    } catch (const Fault& f) {
        throw Error("template line " + std::to_string(r.line) + ": " + f.message);
    }
    return out;
}

inline Value parse_json_object(const std::string& text, const char* what) {
    Value v;
    try {
        v = parse_json(text);
    } catch (const Fault& f) {
        throw Error(std::string(what) + ": " + f.message);
    }
    if (v.kind != Kind::Dict) throw Error(std::string(what) + " must be a JSON object");
    return v;
}

// A message as transformers hands it to the template: members whose value is null dropped, and
// reasoning text (reasoning_content, thinking or reasoning) given as `thinking` first and as
// `reasoning_content`.
inline Value preprocess_message(const Value& m) {
    if (m.kind != Kind::Dict) throw Error("chat request: each message must be an object");
    std::vector<std::pair<Value, Value>> kept;
    const Value* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
        const Value* v = dict_find(*m.dict, key);
        if (!reasoning && v && v->kind != Kind::None) reasoning = v;
    }
    if (reasoning) kept.push_back({string_value("thinking"), *reasoning});
    bool has_reasoning_content = false;
    for (auto& kv : m.dict->items) {
        if (kv.second.kind == Kind::None || (reasoning && kv.first.text == "thinking")) continue;
        if (reasoning && kv.first.text == "reasoning_content") {
            kept.push_back({kv.first, *reasoning});
            has_reasoning_content = true;
            continue;
        }
        kept.push_back(kv);
    }
    if (reasoning && !has_reasoning_content) kept.push_back({string_value("reasoning_content"), *reasoning});
    return dict_value(std::move(kept));
}

} // namespace jinja_detail

std::string JinjaTemplate::render(const std::string& variables_json, int64_t now, const JinjaLimits& limits) const {
    return jinja_detail::render_program(program_->body, jinja_detail::parse_json_object(variables_json, "template variables"), now, limits);
}

std::string chat_apply_template(const JinjaTemplate& tpl, const std::string& request_json, int64_t now, const JinjaLimits& limits) {
    using namespace jinja_detail;
    const Value req = parse_json_object(request_json, "chat request");
    auto member = [&](const char* key) {
        const Value* v = dict_find(*req.dict, key);
        return v ? *v : none_value();
    };
    const Value messages = member("messages");
    if (messages.kind != Kind::List) throw Error("chat request: \"messages\" must be an array");
    ValueList prepared;
    for (auto& m : *messages.list) prepared.push_back(preprocess_message(m));
    auto text = [&](const char* key) {
        const Value v = member(key);
        if (v.kind != Kind::None && v.kind != Kind::String) throw Error(std::string("chat request: \"") + key + "\" must be a string");
        return string_value(v.text);
    };
    std::vector<std::pair<Value, Value>> vars = {
        {string_value("messages"), list_value(std::move(prepared))},
        {string_value("tools"), member("tools")},
        {string_value("documents"), none_value()},
        {string_value("add_generation_prompt"), bool_value(truthy(member("add_generation_prompt")))},
        {string_value("bos_token"), text("bos_token")},
        {string_value("eos_token"), text("eos_token")},
    };
    const Value kwargs = member("chat_template_kwargs");
    if (kwargs.kind == Kind::Dict) {
        for (auto& kv : kwargs.dict->items) {
            auto same = [&](const std::pair<Value, Value>& v) { return v.first.text == kv.first.text; };
            auto it = std::find_if(vars.begin(), vars.end(), same);
            if (it != vars.end()) it->second = kv.second;
            else vars.push_back(kv);
        }
    } else if (kwargs.kind != Kind::None) {
        throw Error("chat request: \"chat_template_kwargs\" must be an object");
    }
    return render_program(tpl.program_->body, dict_value(std::move(vars)), now, limits);
}

// ---- 11i. Tool calls and reasoning in generated text ---------------------------------------------
// Each parse reads the whole text generated so far; `partial` means more may follow, so a suffix that
// could still become a marker is held back and an unfinished call is reported as far as it goes
// (its name once complete, its arguments as a growing prefix). ChatOutputParser diffs successive
// parses into deltas, which is exact because every parse of a longer text extends the previous one.

namespace toolcall_detail {

using jinja_detail::Value;
using jinja_detail::Kind;
using chat_detail::starts_with;

struct ThinkTags {
    const char* open;
    const char* close;
};
inline const ThinkTags kThinkTags[] = {
    {"<think>", "</think>"}, {"<|START_THINKING|>", "<|END_THINKING|>"}, {"[THINK]", "[/THINK]"}, {"<seed:think>", "</seed:think>"}};

inline bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
inline size_t skip_space(const std::string& s, size_t pos) {
    while (pos < s.size() && is_json_space(s[pos])) pos++;
    return pos;
}

// Bytes at the end of s (from `from` on) that are a proper prefix of marker.
inline size_t marker_prefix_at_end(const std::string& s, size_t from, const std::string& marker) {
    for (size_t n = std::min(marker.size() - 1, s.size() - std::min(from, s.size())); n > 0; n--)
        if (s.compare(s.size() - n, n, marker, 0, n) == 0) return n;
    return 0;
}

// One past the JSON value starting at pos (after spaces), npos if the text ends inside it.
inline size_t json_value_end(const std::string& s, size_t pos) {
    pos = skip_space(s, pos);
    if (pos >= s.size()) return std::string::npos;
    const char c = s[pos];
    if (c == '{' || c == '[' || c == '"') {
        int depth = 0;
        bool in_string = false;
        for (size_t i = pos; i < s.size(); i++) {
            const char ch = s[i];
            if (in_string) {
                if (ch == '\\') i++;
                else if (ch == '"' && (in_string = false, depth == 0)) return i + 1;
            } else if (ch == '"') {
                in_string = true;
            } else if (ch == '{' || ch == '[') {
                depth++;
            } else if ((ch == '}' || ch == ']') && --depth == 0) {
                return i + 1;
            }
        }
        return std::string::npos;
    }
    size_t i = pos;
    while (i < s.size() && (std::isalnum((unsigned char)s[i]) || s[i] == '-' || s[i] == '+' || s[i] == '.')) i++;
    return i == s.size() ? std::string::npos : i;
}

inline bool parse_json_quietly(const std::string& text, Value& out) {
    try {
        out = jinja_detail::parse_json(text);
        return true;
    } catch (const Error&) {
    } catch (const jinja_detail::Fault&) {
    }
    return false;
}

struct Member {
    std::string key;
    size_t start = 0, end = std::string::npos;  // the value's span; end npos: not finished
};
struct ObjectScan {
    std::vector<Member> members;
    size_t end = std::string::npos;  // one past '}', npos if not finished
    bool invalid = false;
};

// The members of the JSON object at pos ('{'), as far as the text goes.
inline ObjectScan scan_object(const std::string& s, size_t pos) {
    ObjectScan scan;
    size_t i = pos + 1;
    while (true) {
        i = skip_space(s, i);
        if (i >= s.size()) return scan;
        if (s[i] == '}') {
            scan.end = i + 1;
            return scan;
        }
        if (s[i] != '"') break;
        const size_t key_end = json_value_end(s, i);
        if (key_end == std::string::npos) return scan;
        Value key;
        if (!parse_json_quietly(s.substr(i, key_end - i), key)) break;
        i = skip_space(s, key_end);
        if (i >= s.size()) return scan;
        if (s[i] != ':') break;
        Member m;
        m.key = key.text;
        m.start = skip_space(s, i + 1);
        m.end = json_value_end(s, m.start);
        scan.members.push_back(m);
        if (m.end == std::string::npos) return scan;
        i = skip_space(s, m.end);
        if (i >= s.size()) return scan;
        if (s[i] == ',') {
            i++;
            continue;
        }
        if (s[i] == '}') {
            scan.end = i + 1;
            return scan;
        }
        break;
    }
    scan.invalid = true;
    return scan;
}

inline const Member* find_member(const ObjectScan& scan, std::initializer_list<const char*> keys) {
    for (const char* k : keys)
        for (auto& m : scan.members)
            if (m.key == k) return &m;
    return nullptr;
}

// A value (complete or not) as the arguments text: objects as written, a JSON string decoded
// (models that quote their arguments), a partial string withheld.
inline std::string arguments_text(const std::string& s, const Member& m) {
    if (m.end == std::string::npos) return s[m.start] == '"' ? "" : s.substr(m.start);
    const std::string raw = s.substr(m.start, m.end - m.start);
    Value v;
    if (raw[0] == '"' && parse_json_quietly(raw, v)) return v.text;
    return raw;
}

// Compact JSON of a tool parameter written as text (XML formats): a string when its schema says so,
// else JSON if it parses, else a string.
inline std::string parameter_json(const std::string& raw, bool declared_string) {
    std::string text = raw;
    if (starts_with(text, "\n")) text.erase(0, 1);
    if (chat_detail::ends_with(text, "\n")) text.pop_back();
    Value v;
    std::string out;
    if (declared_string || !parse_json_quietly(text, v) || v.kind == Kind::String) v = jinja_detail::string_value(text);
    jinja_detail::json_dump(out, v, jinja_detail::JsonStyle{}, 0, SIZE_MAX);
    return out;
}

struct Parse {
    const std::string& s;
    const ChatParseOptions& opt;
    bool partial;
    ChatParsed out;
    bool stop = false;  // partial: the rest is undecided

    // Content up to the first of the markers; returns its index (pos at it), or -1 at the end of
    // the text (holding back a suffix that may start a marker).
    int content_until(size_t& pos, std::initializer_list<const char*> markers) {
        size_t best = std::string::npos;
        int which = -1, i = 0;
        for (const char* m : markers) {
            const size_t at = s.find(m, pos);
            if (at < best) best = at, which = i;
            i++;
        }
        if (which >= 0) {
            out.content.append(s, pos, best - pos);
            pos = best;
            return which;
        }
        size_t held = 0;
        if (partial)
            for (const char* m : markers) held = std::max(held, marker_prefix_at_end(s, pos, m));
        out.content.append(s, pos, s.size() - pos - held);
        pos = s.size();
        stop = held > 0;
        return -1;
    }

    // Skips `marker` at pos (after spaces); false if absent. Partial text ending in a prefix of it stops.
    bool take(size_t& pos, const std::string& marker) {
        const size_t at = skip_space(s, pos);
        if (s.compare(at, marker.size(), marker) == 0) {
            pos = at + marker.size();
            return true;
        }
        if (partial && s.size() - at < marker.size() && marker.compare(0, s.size() - at, s, at, std::string::npos) == 0) stop = true;
        return false;
    }

    // Text from pos up to `end_marker` (pos moves past it); a partial text gives what is there and stops.
    bool text_until(size_t& pos, const std::string& end_marker, std::string& text) {
        const size_t at = s.find(end_marker, pos);
        if (at == std::string::npos) {
            text = s.substr(pos, s.size() - pos - (partial ? marker_prefix_at_end(s, pos, end_marker) : 0));
            pos = s.size();
            stop = partial;
            return false;
        }
        text = s.substr(pos, at - pos);
        pos = at + end_marker.size();
        return true;
    }

    // Whether tool `name`'s parameter `key` is declared a string (ChatParseOptions::string_parameters).
    bool declared_string(const std::string& name, const std::string& key) const {
        auto it = opt.string_parameters.find(name);
        return it != opt.string_parameters.end() && std::find(it->second.begin(), it->second.end(), key) != it->second.end();
    }

    void add_call(std::string id, std::string name, std::string arguments) {
        out.tool_calls.push_back({std::move(id), std::move(name), std::move(arguments)});
    }

    // A call from the JSON object at pos: {"name": ..., args_key: {...}}. pos moves past it.
    bool call_from_object(size_t& pos, std::initializer_list<const char*> name_keys, std::initializer_list<const char*> args_keys,
                          std::initializer_list<const char*> id_keys) {
        const ObjectScan scan = scan_object(s, pos);
        const Member* name = find_member(scan, name_keys);
        const Member* args = find_member(scan, args_keys);
        const Member* id = find_member(scan, id_keys);
        auto member_value = [&](const Member* m, Value& v) {
            return m && m->end != std::string::npos && parse_json_quietly(s.substr(m->start, m->end - m->start), v);
        };
        Value name_value, id_value;
        const std::string id_text = member_value(id, id_value) ? jinja_detail::to_str(id_value) : "";
        const bool named = member_value(name, name_value) && name_value.kind == Kind::String;
        if (scan.end == std::string::npos && !scan.invalid && partial) {  // unfinished: reported once named
            stop = true;                                                  // (and its id known, if it has one)
            if (named && args && (id_keys.size() == 0 || !id_text.empty())) add_call(id_text, name_value.text, arguments_text(s, *args));
            pos = s.size();
            return true;
        }
        if (scan.end == std::string::npos || !named || !args) return false;
        add_call(id_text, name_value.text, arguments_text(s, *args));
        pos = scan.end;
        return true;
    }

    // Calls from a JSON array of call objects, pos just after its '['; true once the ']' is passed.
    bool call_array(size_t& pos, std::initializer_list<const char*> name_keys, std::initializer_list<const char*> args_keys,
                    std::initializer_list<const char*> id_keys) {
        while (!stop) {
            pos = skip_space(s, pos);
            if (pos >= s.size()) {
                stop = partial;
                return false;
            }
            if (s[pos] == ']') {
                pos++;
                return true;
            }
            if (s[pos] == ',') {
                pos++;
                continue;
            }
            if (s[pos] != '{' || !call_from_object(pos, name_keys, args_keys, id_keys)) return false;
        }
        return false;
    }

    // JSON arguments at pos (after spaces), complete or a growing prefix; false if the text ended.
    bool json_arguments(size_t& pos, std::string& args) {
        const size_t start = skip_space(s, pos);
        const size_t end = json_value_end(s, start);
        if (end == std::string::npos) {
            args = s.substr(start);
            pos = s.size();
            stop = partial;
            return false;
        }
        args = s.substr(start, end - start);
        pos = end;
        return true;
    }
};

// ---- reasoning ----

// Splits off a leading thinking block (or the rest of one the prompt opened); returns where the
// answer starts, s.size() with p.stop set if that is not known yet.
inline size_t take_reasoning(Parse& p) {
    const std::string& s = p.s;
    size_t pos = 0;
    const char* close = nullptr;
    if (p.opt.thinking_open) {
        size_t best = std::string::npos;
        for (auto& t : kThinkTags) {
            const size_t at = s.find(t.close);
            if (at < best) best = at, close = t.close;
        }
        if (!close) close = kThinkTags[0].close;
    } else {
        pos = skip_space(s, 0);
        for (auto& t : kThinkTags) {
            const std::string open = t.open;
            if (s.compare(pos, open.size(), open) == 0) {
                close = t.close;
                pos += open.size();
                break;
            }
            if (p.partial && pos < s.size() && s.size() - pos < open.size() && open.compare(0, s.size() - pos, s, pos) == 0) {
                p.stop = true;  // maybe the start of a thinking block
                return s.size();
            }
        }
        if (!close) return 0;
        if (p.partial && pos == s.size()) {
            p.stop = true;
            return s.size();
        }
    }
    std::string reasoning;
    const bool closed = p.text_until(pos, close, reasoning);
    // trimmed; while streaming, trailing spaces wait until more reasoning follows them
    p.out.reasoning_content = jinja_detail::py_strip(reasoning);
    if (!closed) return s.size();
    const size_t answer = skip_space(s, pos);
    if (p.partial && answer == s.size()) p.stop = true;
    return answer;
}

// ---- formats ----

inline void parse_hermes(Parse& p, size_t pos) {
    while (!p.stop && p.content_until(pos, {"<tool_call>"}) == 0) {
        const size_t marker = pos;
        pos += std::strlen("<tool_call>");
        const size_t obj = skip_space(p.s, pos);
        if (obj >= p.s.size()) {
            p.stop = p.partial;
            if (!p.partial) p.out.content.append(p.s, marker, std::string::npos);
            return;
        }
        if (p.s[obj] != '{' || !p.call_from_object(pos = obj, {"name"}, {"arguments", "parameters"}, {})) {
            p.out.content += "<tool_call>";
            pos = marker + std::strlen("<tool_call>");
            continue;
        }
        if (p.stop) return;
        p.take(pos, "</tool_call>");
        pos = skip_space(p.s, pos);
    }
}

// <tool_call> with XML parameters: Qwen3-Coder's <function=name><parameter=k>v</parameter> and
// GLM's name<arg_key>k</arg_key><arg_value>v</arg_value>.
inline void parse_xml_calls(Parse& p, size_t pos, bool glm) {
    while (!p.stop && p.content_until(pos, {"<tool_call>"}) == 0) {
        pos += std::strlen("<tool_call>");
        std::string name;
        if (glm) {
            const size_t start = skip_space(p.s, pos);
            size_t end = start;
            while (end < p.s.size() && p.s[end] != '\n' && p.s[end] != '<') end++;
            if (end >= p.s.size() && p.partial) {
                p.stop = true;
                return;
            }
            name = chat_detail::py_strip(p.s.substr(start, end - start));
            pos = end;
        } else {
            if (!p.take(pos, "<function=")) {
                if (!p.stop) p.out.content += "<tool_call>";
                continue;
            }
            if (!p.text_until(pos, ">", name)) return;
        }
        std::string args = "{";
        bool closed = false;
        while (!p.stop) {
            std::string key, value;
            if (glm ? p.take(pos, "<arg_key>") : p.take(pos, "<parameter=")) {
                if (!p.text_until(pos, glm ? "</arg_key>" : ">", key)) break;
                if (glm && !p.take(pos, "<arg_value>")) break;
                if (!p.text_until(pos, glm ? "</arg_value>" : "</parameter>", value)) break;
                std::string member;
                chat_detail::json_append_string(member, key, false);
                args += (args.size() > 1 ? ", " : "") + member + ": " + parameter_json(value, p.declared_string(name, key));
                continue;
            }
            if (p.stop) break;
            if (!glm) p.take(pos, "</function>");
            if (p.stop) break;
            closed = p.take(pos, "</tool_call>") || !p.partial;
            break;
        }
        if (closed || (!p.partial)) args += "}";
        p.add_call("", name, args);
        if (!closed) {
            p.stop = p.partial;
            return;
        }
        pos = skip_space(p.s, pos);
    }
}

// Python keyword arguments of a builtin call, name.call(query="x", n=1), as a JSON object.
inline bool python_call_arguments(const std::string& call, std::string& args) {
    args = "{";
    size_t i = 0;
    while (true) {
        i = skip_space(call, i);
        if (i >= call.size()) break;
        const size_t eq = call.find('=', i);
        if (eq == std::string::npos) return false;
        std::string key = chat_detail::py_strip(call.substr(i, eq - i)), member;
        size_t v = skip_space(call, eq + 1), end = v;
        Value value;
        if (v < call.size() && (call[v] == '"' || call[v] == '\'')) {
            const char q = call[v];
            std::string text;
            for (end = v + 1; end < call.size() && call[end] != q; end++) {
                if (call[end] == '\\' && end + 1 < call.size()) end++;
                text += call[end];
            }
            if (end >= call.size()) return false;
            value = jinja_detail::string_value(text);
            end++;
        } else {
            while (end < call.size() && call[end] != ',') end++;
            std::string lit = chat_detail::py_strip(call.substr(v, end - v));
            if (lit == "True" || lit == "False") lit = lit == "True" ? "true" : "false";
            if (!parse_json_quietly(lit, value)) value = jinja_detail::string_value(lit);
        }
        chat_detail::json_append_string(member, key, false);
        std::string json;
        jinja_detail::json_dump(json, value, jinja_detail::JsonStyle{}, 0, SIZE_MAX);
        args += (args.size() > 1 ? ", " : "") + member + ": " + json;
        i = skip_space(call, end);
        if (i < call.size() && call[i] == ',') i++;
    }
    args += "}";
    return true;
}

// <|python_tag|> then a JSON call, a builtin name.call(...), or code for the python tool.
inline void parse_python_tag(Parse& p, size_t pos) {
    const size_t start = skip_space(p.s, pos);
    if (start < p.s.size() && p.s[start] == '{') {
        size_t at = start;
        if (p.call_from_object(at, {"name"}, {"parameters", "arguments"}, {"id"})) return;
    }
    if (p.partial) {
        p.stop = true;
        return;
    }
    std::string body = chat_detail::py_rstrip(p.s.substr(start));
    for (const char* end : {"<|eom_id|>", "<|eot_id|>"})
        if (chat_detail::ends_with(body, end)) body.resize(body.size() - std::strlen(end));
    const size_t paren = body.find(".call(");
    std::string args;
    if (paren != std::string::npos && chat_detail::ends_with(body, ")") &&
        python_call_arguments(body.substr(paren + 6, body.size() - paren - 7), args)) {
        p.add_call("", body.substr(0, paren), args);
        return;
    }
    std::string code;
    chat_detail::json_append_string(code, body, false);
    p.add_call("", "python", "{\"code\": " + code + "}");
}

inline void parse_llama3(Parse& p, size_t pos) {
    // A call may follow text (the lazy grammar's trigger word {"name" can come anywhere, and llama.cpp
    // reads such calls too): the text before the first {"name" or <|python_tag|> is content.
    const size_t first = skip_space(p.s, pos);
    if (first >= p.s.size() || p.s[first] != '{') {
        const int which = p.content_until(pos, {"{\"name\"", "<|python_tag|>"});
        if (which < 0) return;
        if (which == 1) return parse_python_tag(p, pos + std::strlen("<|python_tag|>"));
    }
    while (!p.stop) {
        const size_t obj = skip_space(p.s, pos);
        if (obj < p.s.size() && p.s[obj] == '{') {
            size_t at = obj;
            if (p.call_from_object(at, {"name"}, {"parameters", "arguments"}, {})) {
                pos = at;
                if (p.stop) return;
                const size_t next = skip_space(p.s, pos);
                pos = next < p.s.size() && p.s[next] == ';' ? next + 1 : next;
                if (pos >= p.s.size()) return;
                continue;
            }
        }
        break;
    }
    if (p.stop) return;
    if (p.content_until(pos, {"<|python_tag|>"}) == 0) parse_python_tag(p, pos + std::strlen("<|python_tag|>"));
}

inline void parse_mistral(Parse& p, size_t pos) {
    while (!p.stop && p.content_until(pos, {"[TOOL_CALLS]"}) == 0) {
        pos = skip_space(p.s, pos + std::strlen("[TOOL_CALLS]"));
        if (pos >= p.s.size()) {
            p.stop = p.partial;
            return;
        }
        if (p.s[pos] == '[') {  // [{"name": ..., "arguments": {...}, "id": ...}, ...]
            if (!p.call_array(++pos, {"name"}, {"arguments", "parameters"}, {"id"})) return;
            continue;
        }
        std::string name, args;  // name[ARGS]{...}
        if (!p.text_until(pos, "[ARGS]", name)) return;
        const bool done = p.json_arguments(pos, args);
        p.add_call("", chat_detail::py_strip(name), args);
        if (!done) return;
    }
}

inline void parse_deepseek(Parse& p, size_t pos) {
    static const std::string begin = "<｜tool▁call▁begin｜>", sep = "<｜tool▁sep｜>", end = "<｜tool▁call▁end｜>",
                             section = "<｜tool▁calls▁begin｜>", section_end = "<｜tool▁calls▁end｜>";
    while (!p.stop && p.content_until(pos, {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"}) >= 0) {
        p.take(pos, section);
        while (!p.stop && p.take(pos, begin)) {
            std::string first, name, args;
            if (!p.text_until(pos, sep, first)) return;
            if (first == "function") {  // R1: function<sep>name\n```json\n{...}\n```
                if (!p.text_until(pos, "\n", name)) return;
                p.take(pos, "```json");
                if (p.stop) return;
            } else {
                name = first;
            }
            const bool done = p.json_arguments(pos, args);
            p.add_call("", chat_detail::py_strip(name), args);
            if (!done) return;
            p.take(pos, "```");
            if (!p.stop) p.take(pos, end);
        }
        if (!p.stop) p.take(pos, section_end);
        pos = skip_space(p.s, pos);
    }
}

inline void parse_functionary_v31(Parse& p, size_t pos) {
    while (!p.stop) {
        const int which = p.content_until(pos, {"<function=", "<|python_tag|>"});
        if (which < 0) return;
        if (which == 1) {
            parse_python_tag(p, pos + std::strlen("<|python_tag|>"));
            return;
        }
        pos += std::strlen("<function=");
        std::string name, args;
        if (!p.text_until(pos, ">", name)) return;
        const bool done = p.json_arguments(pos, args);
        p.add_call("", name, args);
        if (!done) return;
        p.take(pos, "</function>");
    }
}

// Functionary v3.2: blocks "recipient\nbody" separated by ">>>", the first opened by the prompt.
inline void parse_functionary_v32(Parse& p, size_t pos) {
    while (!p.stop && pos < p.s.size()) {
        std::string recipient;
        const size_t line_end = p.s.find('\n', pos);
        if (line_end == std::string::npos) {
            if (p.partial) {
                p.stop = true;
                return;
            }
            p.out.content.append(p.s, pos, std::string::npos);
            return;
        }
        recipient = chat_detail::py_strip(p.s.substr(pos, line_end - pos));
        pos = line_end + 1;
        if (recipient == "all") {
            if (p.content_until(pos, {">>>"}) < 0) return;
            pos += 3;
            continue;
        }
        std::string args;
        const bool done = p.json_arguments(pos, args);
        p.add_call("", recipient, args);
        if (!done) return;
        if (!p.take(pos, ">>>")) return;
    }
}

inline void parse_command_r7b(Parse& p, size_t pos) {
    while (!p.stop) {
        const int which = p.content_until(pos, {"<|START_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"});
        if (which < 0) return;
        if (which > 0) {  // the response markers themselves are not content
            pos += which == 1 ? std::strlen("<|START_RESPONSE|>") : std::strlen("<|END_RESPONSE|>");
            continue;
        }
        pos = skip_space(p.s, pos + std::strlen("<|START_ACTION|>"));
        if (!p.take(pos, "[") || !p.call_array(pos, {"tool_name"}, {"parameters"}, {"tool_call_id"})) return;
        p.take(pos, "<|END_ACTION|>");
    }
}

// GPT-OSS harmony: messages "<|start|>assistant<|channel|>C[ to=R]<|message|>body<|end|>" (or with
// the recipient in the role: "<|start|>assistant to=R<|channel|>C..."); the prompt opens the first
// one. analysis is reasoning, final and commentary content, commentary addressed to functions.NAME a call.
inline void parse_harmony(Parse& p, size_t pos) {
    static const std::string role_recipient = " to=";  // the first message's header may begin so
    if (p.partial && p.s.size() < role_recipient.size() && role_recipient.compare(0, p.s.size(), p.s) == 0) {
        p.stop = true;
        return;
    }
    const bool recipient_first = p.s.compare(0, role_recipient.size(), role_recipient) == 0;
    while (!p.stop && pos < p.s.size()) {
        const bool started = p.take(pos, "<|start|>") || (pos == 0 && recipient_first);
        if (p.stop) return;
        if (!started && p.s.compare(skip_space(p.s, pos), 11, "<|channel|>") != 0) {  // plain text
            p.content_until(pos, {"<|start|>", "<|channel|>"});
            continue;
        }
        std::string header;
        if (!p.text_until(pos, "<|message|>", header)) return;
        const size_t ch = header.find("<|channel|>");
        std::string channel = ch == std::string::npos ? "" : header.substr(ch + 11);
        channel = channel.substr(0, channel.find_first_of(" <"));
        const size_t to = header.find("to=");
        std::string recipient = to == std::string::npos ? "" : header.substr(to + 3);
        recipient = recipient.substr(0, recipient.find_first_of(" <"));
        size_t best = std::string::npos, marker_len = 0;
        for (const char* m : {"<|end|>", "<|call|>", "<|return|>", "<|start|>"}) {
            const size_t at = p.s.find(m, pos);
            if (at < best) best = at, marker_len = std::strcmp(m, "<|start|>") == 0 ? 0 : std::strlen(m);
        }
        std::string body;
        if (best == std::string::npos) {
            size_t held = 0;
            if (p.partial)
                for (const char* m : {"<|end|>", "<|call|>", "<|return|>", "<|start|>"}) held = std::max(held, marker_prefix_at_end(p.s, pos, m));
            body = p.s.substr(pos, p.s.size() - pos - held);
            pos = p.s.size();
            p.stop = p.partial;
        } else {
            body = p.s.substr(pos, best - pos);
            pos = best + marker_len;
        }
        if (starts_with(recipient, "functions.")) {
            p.add_call("", recipient.substr(10), p.stop ? jinja_detail::py_lstrip(body) : jinja_detail::py_strip(body));
        } else if (channel == "analysis") {
            if (p.opt.extract_reasoning) p.out.reasoning_content += body;
            else p.out.content += body;
        } else {
            p.out.content += body;
        }
    }
}

inline void parse_kimi(Parse& p, size_t pos) {
    while (!p.stop && p.content_until(pos, {"<|tool_calls_section_begin|>", "<|tool_call_begin|>"}) >= 0) {
        p.take(pos, "<|tool_calls_section_begin|>");
        while (!p.stop && p.take(pos, "<|tool_call_begin|>")) {
            std::string id, args;
            if (!p.text_until(pos, "<|tool_call_argument_begin|>", id)) return;
            id = chat_detail::py_strip(id);
            std::string name = starts_with(id, "functions.") ? id.substr(10) : id;
            name = name.substr(0, name.rfind(':'));
            const bool done = p.json_arguments(pos, args);
            p.add_call(id, name, args);
            if (!done) return;
            p.take(pos, "<|tool_call_end|>");
        }
        if (!p.stop) p.take(pos, "<|tool_calls_section_end|>");
        pos = skip_space(p.s, pos);
    }
}

inline ChatParsed parse(const std::string& s, const ChatParseOptions& opt, bool partial) {
    Parse p{s, opt, partial, {}, false};
    if (opt.format == ToolCallFormat::GptOss) {
        parse_harmony(p, 0);
        return p.out;
    }
    const size_t answer = opt.extract_reasoning ? take_reasoning(p) : 0;
    if (p.stop || answer >= s.size()) return p.out;
    switch (opt.format) {
    case ToolCallFormat::None: p.out.content.append(s, answer, std::string::npos); break;
    case ToolCallFormat::Hermes: parse_hermes(p, answer); break;
    case ToolCallFormat::Qwen3Coder: parse_xml_calls(p, answer, false); break;
    case ToolCallFormat::Glm: parse_xml_calls(p, answer, true); break;
    case ToolCallFormat::Llama3: parse_llama3(p, answer); break;
    case ToolCallFormat::Mistral: parse_mistral(p, answer); break;
    case ToolCallFormat::DeepSeek: parse_deepseek(p, answer); break;
    case ToolCallFormat::FunctionaryV31: parse_functionary_v31(p, answer); break;
    case ToolCallFormat::FunctionaryV32: parse_functionary_v32(p, answer); break;
    case ToolCallFormat::CommandR7B: parse_command_r7b(p, answer); break;
    case ToolCallFormat::KimiK2: parse_kimi(p, answer); break;
    case ToolCallFormat::GptOss: break;
    }
    return p.out;
}

struct FormatName {
    ToolCallFormat format;
    const char* name;
};
inline const FormatName kFormatNames[] = {
    {ToolCallFormat::None, "none"},           {ToolCallFormat::Hermes, "hermes"},
    {ToolCallFormat::Llama3, "llama3"},       {ToolCallFormat::Mistral, "mistral"},
    {ToolCallFormat::DeepSeek, "deepseek"},   {ToolCallFormat::FunctionaryV31, "functionary-v3.1"},
    {ToolCallFormat::FunctionaryV32, "functionary-v3.2"}, {ToolCallFormat::CommandR7B, "command-r7b"},
    {ToolCallFormat::GptOss, "gpt-oss"},      {ToolCallFormat::KimiK2, "kimi-k2"},
    {ToolCallFormat::Glm, "glm"},             {ToolCallFormat::Qwen3Coder, "qwen3-coder"},
};

// What changed from `sent` to `now`: text beyond what was sent, new calls, argument growth.
inline ChatDelta diff(const ChatParsed& sent, const ChatParsed& now) {
    ChatDelta d;
    auto grow = [](const std::string& old_text, const std::string& new_text) {
        return new_text.size() > old_text.size() && new_text.compare(0, old_text.size(), old_text) == 0 ? new_text.substr(old_text.size())
                                                                                                        : std::string();
    };
    d.content = grow(sent.content, now.content);
    d.reasoning_content = grow(sent.reasoning_content, now.reasoning_content);
    for (size_t i = 0; i < now.tool_calls.size(); i++) {
        const ChatToolCall& c = now.tool_calls[i];
        ChatToolCallDelta td;
        td.index = i;
        if (i >= sent.tool_calls.size()) {
            td.first = true;
            td.id = c.id;
            td.name = c.name;
            td.arguments = c.arguments;
        } else {
            td.arguments = grow(sent.tool_calls[i].arguments, c.arguments);
            if (td.arguments.empty()) continue;
        }
        d.tool_calls.push_back(std::move(td));
    }
    return d;
}

// Applies a delta to what was sent so far.
inline void apply(ChatParsed& sent, const ChatDelta& d) {
    sent.content += d.content;
    sent.reasoning_content += d.reasoning_content;
    for (auto& td : d.tool_calls) {
        if (td.first) sent.tool_calls.push_back({td.id, td.name, ""});
        sent.tool_calls[td.index].arguments += td.arguments;
    }
}

} // namespace toolcall_detail

const char* tool_call_format_name(ToolCallFormat f) {
    for (auto& e : toolcall_detail::kFormatNames)
        if (e.format == f) return e.name;
    return "none";
}

ToolCallFormat tool_call_format_from_name(const std::string& name) {
    std::string all;
    for (auto& e : toolcall_detail::kFormatNames) {
        if (name == e.name) return e.format;
        all += std::string(all.empty() ? "" : ", ") + e.name;
    }
    throw Error("unknown tool-call format '" + name + "' (known: " + all + ")");
}

// The family's markers in its template; specific syntaxes before the generic <tool_call>.
ToolCallFormat chat_detect_tool_call_format(const std::string& t) {
    using chat_detail::contains;
    if (contains(t, "<|channel|>") && contains(t, "<|message|>")) return ToolCallFormat::GptOss;
    if (contains(t, "<|tool_call_begin|>") || contains(t, "<|tool_calls_section_begin|>")) return ToolCallFormat::KimiK2;
    if (contains(t, "<arg_key>")) return ToolCallFormat::Glm;
    if (contains(t, "<function=") && contains(t, "<parameter=")) return ToolCallFormat::Qwen3Coder;
    if (contains(t, "tool▁call▁begin")) return ToolCallFormat::DeepSeek;
    if (contains(t, "<|START_ACTION|>")) return ToolCallFormat::CommandR7B;
    if (contains(t, ">>>all")) return ToolCallFormat::FunctionaryV32;
    if (contains(t, "<function=")) return ToolCallFormat::FunctionaryV31;
    if (contains(t, "[TOOL_CALLS]")) return ToolCallFormat::Mistral;
    if (contains(t, "<tool_call>")) return ToolCallFormat::Hermes;
    if (contains(t, "<|start_header_id|>") && (contains(t, "<|python_tag|>") || contains(t, "\"parameters\"") || contains(t, "tools")))
        return ToolCallFormat::Llama3;
    return ToolCallFormat::None;
}

ChatParsed chat_parse_output(const std::string& text, const ChatParseOptions& opt) { return toolcall_detail::parse(text, opt, false); }

ChatDelta ChatOutputParser::advance(bool partial) {
    const ChatDelta d = toolcall_detail::diff(sent_, toolcall_detail::parse(text_, opt_, partial));
    toolcall_detail::apply(sent_, d);
    return d;
}
ChatDelta ChatOutputParser::push(const std::string& text) {
    text_ += text;
    return advance(true);
}
ChatDelta ChatOutputParser::finish() { return advance(false); }

std::pair<std::string, std::string> chat_thinking_tags(const std::string& t) {
    for (auto& tags : toolcall_detail::kThinkTags)
        if (t.find(tags.close) != std::string::npos) return {tags.open, tags.close};
    return {"", ""};
}

bool chat_prompt_opens_thinking(const std::string& prompt) {
    const std::string trimmed = jinja_detail::py_rstrip(prompt);
    for (auto& tags : toolcall_detail::kThinkTags)
        if (chat_detail::ends_with(trimmed, tags.open)) return true;
    return false;
}

std::string chat_family_name(ChatFamily f) {
    for (auto& e : chat_detail::kFamilyNames)
        if (e.family == f) return e.name;
    return "unknown";
}

std::vector<std::string> chat_family_names() {
    std::vector<std::string> names;
    ChatFamily prev = ChatFamily::Unknown;
    for (auto& e : chat_detail::kFamilyNames) {
        if (e.family != prev) names.push_back(e.name);
        prev = e.family;
    }
    return names;
}

ChatFamily chat_family_from_name(const std::string& name) {
    std::string lower = name;
    for (char& c : lower) if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
    for (auto& e : chat_detail::kFamilyNames)
        if (lower == e.name) return e.family;
    std::string all;
    for (auto& n : chat_family_names()) all += (all.empty() ? "" : ", ") + n;
    throw Error("unknown chat template '" + name + "' (known: " + all + ")");
}

// Distinctive substrings of each family's template source (Jinja text, so "\n" inside string literals
// appears as backslash-n). More specific families are tested before the generic ones they resemble.
ChatFamily chat_detect_family(const std::string& t) {
    using chat_detail::contains;
    if (contains(t, "<|im_start|>")) {
        if (contains(t, "<|im_sep|>")) return ChatFamily::Unknown;  // Phi-4: ChatML-like but not ChatML
        if (contains(t, "Reasoning Mode") && contains(t, "/no_think")) return ChatFamily::SmolLM3;
        if (contains(t, "You are Qwen, created by Alibaba Cloud")) return ChatFamily::Qwen25;
        if (contains(t, "last_query_index") || (contains(t, "reasoning_content") && contains(t, "<think>")))
            return ChatFamily::Qwen3;
        if (contains(t, "named SmolLM")) return ChatFamily::SmolLM2;
        if (contains(t, "You are a helpful assistant.<|im_end|>")) return ChatFamily::Qwen2;
        if (contains(t, "<|im_end|>") && contains(t, "add_generation_prompt")) return ChatFamily::ChatML;
        return ChatFamily::Unknown;
    }
    if (contains(t, "<｜User｜>") && contains(t, "<｜Assistant｜>")) {
        if (contains(t, "<think></think>")) return ChatFamily::DeepSeekV31;
        if (contains(t, "<｜Assistant｜><think>"))
            return contains(t, "enable_thinking") ? ChatFamily::DeepSeekR1Switch : ChatFamily::DeepSeekR1;
        return ChatFamily::DeepSeekV3;
    }
    if (contains(t, "### Instruction:") && contains(t, "### Response:") && contains(t, "<|EOT|>"))
        return ChatFamily::DeepSeekCoder;
    if (contains(t, "<|start_header_id|>") && contains(t, "<|eot_id|>")) {
        if (contains(t, "Cutting Knowledge Date"))
            return contains(t, "strftime_now") ? ChatFamily::Llama32 : ChatFamily::Llama31;
        return ChatFamily::Llama3;
    }
    if (contains(t, "<start_of_turn>") && contains(t, "<end_of_turn>")) {
        if (contains(t, "first_user_prefix")) return ChatFamily::Gemma3;
        if (contains(t, "System role not supported")) return ChatFamily::Gemma2;
        return ChatFamily::Unknown;
    }
    // Mistral Nemo writes "[INST]" with no space after it; v1/v3 templates use "[INST] ", v7 adds
    // [SYSTEM_PROMPT].
    if (contains(t, "[INST]") && contains(t, "[/INST]") && !contains(t, "[INST] ") && !contains(t, "[SYSTEM_PROMPT]"))
        return ChatFamily::MistralNemo;
    if (contains(t, "<|user|>") && contains(t, "<|assistant|>") && contains(t, "<|end|>")) return ChatFamily::Phi3;
    return ChatFamily::Unknown;
}

std::string chat_render(ChatFamily f, const std::vector<ChatMessage>& m, const ChatOptions& o) {
    using namespace chat_detail;
    if (m.empty()) template_error("chat template: no messages");
    switch (f) {
    case ChatFamily::ChatML: return render_chatml(m, o, nullptr);
    case ChatFamily::Qwen2: return render_chatml(m, o, "You are a helpful assistant.");
    case ChatFamily::SmolLM2: return render_chatml(m, o, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    case ChatFamily::Qwen25: return render_qwen25(m, o);
    case ChatFamily::Qwen3: return render_qwen3(m, o);
    case ChatFamily::SmolLM3: return render_smollm3(m, o);
    case ChatFamily::Llama3: return render_llama3(m, o);
    case ChatFamily::Llama31: return render_llama31(m, o, "26 Jul 2024");
    case ChatFamily::Llama32: return render_llama31(m, o, o.date_string.empty() ? "26 Jul 2024" : o.date_string);
    case ChatFamily::Gemma2: return render_gemma2(m, o);
    case ChatFamily::Gemma3: return render_gemma3(m, o);
    case ChatFamily::DeepSeekR1: return render_deepseek_r1(m, o, false);
    case ChatFamily::DeepSeekR1Switch: return render_deepseek_r1(m, o, true);
    case ChatFamily::DeepSeekV3: return render_deepseek_v3(m, o);
    case ChatFamily::DeepSeekV31: return render_deepseek_v31(m, o);
    case ChatFamily::DeepSeekCoder: return render_deepseek_coder(m, o);
    case ChatFamily::MistralNemo: return render_mistral_nemo(m, o);
    case ChatFamily::Phi3: return render_phi3(m, o);
    case ChatFamily::Unknown: break;
    }
    template_error("chat template: unknown family");
}

std::string chat_render(ChatFamily f, const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                        const std::string& bos_token, const std::string& eos_token, const std::string& date_string) {
    ChatOptions o;
    o.add_generation_prompt = add_generation_prompt;
    o.bos_token = bos_token;
    o.eos_token = eos_token;
    o.date_string = date_string;
    return chat_render(f, msgs, o);
}

// ============================================================================================
// 12. Thread pool
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

// The spin-wait hint (x86 pause, AArch64 yield; none elsewhere, where 32-bit Arm cores before v6K
// lack yield): lets a sibling hyper-thread run and saves power.
inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// What a job runs, fn(begin, end, thread): a reference to the caller's callable, which outlives the
// job. std::function copied each capturing lambda to the heap, a malloc and free per job, on code
// and data that a decode step's weight stream has just pushed out of the caches.
class JobFn {
public:
    template <typename F>
    JobFn(const F& f) : callable_(&f), call_([](const void* c, int64_t b, int64_t e, int t) { (*(const F*)c)(b, e, t); }) {}
    void operator()(int64_t begin, int64_t end, int thread) const { call_(callable_, begin, end, thread); }

private:
    const void* callable_;
    void (*call_)(const void*, int64_t, int64_t, int);
};

class ThreadPool {
public:
    // poll: 0..100, the busy-wait level of idle workers (100: about 40000 checks of the job counter
    // before sleeping; 0: sleep at once).
    explicit ThreadPool(int n_threads, int poll = 50)
        : n_(std::max(1, n_threads)), active_(n_), spins_(std::min(100, std::max(0, poll)) * 400) {
        for (int i = 1; i < n_; i++) workers_.emplace_back([this, i] { worker_loop(i); });
    }
    ~ThreadPool() {
        {
            std::lock_guard<std::mutex> lk(mutex_);
            stop_ = true;
            generation_.fetch_add(2);
        }
        cv_.notify_all();
        for (auto& t : workers_) t.join();
    }
    int size() const { return n_; }
    // Threads that take part in the next jobs (1..size(); the rest wake and go back to waiting), so
    // prefill and decode may use different counts (-t / -tb).
    void set_active(int n) { active_.store(std::min(n_, std::max(1, n))); }

    // Calls fn over [0, n) in chunks of about `grain` items (at least one chunk per thread when n
    // allows); returns when every chunk is done. fn must not throw.
    void parallel_for(int64_t n, int64_t grain, const JobFn& fn) {
        if (n <= 0) return;
        grain = std::max<int64_t>(1, grain);
        const int active = active_.load();
        if (active == 1 || n <= grain) {
            fn(0, n, 0);
            return;
        }
        fn_ = &fn;
        n_items_ = n;
        chunk_ = std::max<int64_t>(grain, std::min<int64_t>(n / active, (n + 8 * active - 1) / (8 * active)));
        next_.store(0);
        {
            std::lock_guard<std::mutex> lk(mutex_);
            generation_.fetch_add(1);  // odd: the job is open
        }
        cv_.notify_all();
        run_chunks(0);
        // Close the job, then wait only for the workers inside it: one that has not joined yet never will,
        // so a worker that lost its core to another process does not stall every job of a decode step.
        generation_.fetch_add(1);  // even: closed
        // A spin with pause, yielding now and then: a yield per check hands the core to any runnable
        // process, however low its priority. Zen 4, decode beside two nice-19 `yes`: Llama-1B shape
        // 24.8 -> 31.1 t/s (quiet: 33.3-34.0), level quiet and beside a nice-0 one (session 26).
        for (unsigned checks = 1; joined_.load() != 0; checks++)
            if (checks % 1024) spin_pause();
            else std::this_thread::yield();
    }

    // Calls fn(i, i + 1, thread) for every i in [0, n), with the items split into one contiguous share
    // per active thread. Each thread walks its own share front to back; one that runs out takes the back
    // half of the largest share left as its own and goes on (a thread that joins late, or shares its
    // core with another process, is helped from the end of its share while it goes on from the front).
    // For the weight streams of decode: each thread reads consecutive tasks forward, so its prefetches
    // ahead fall on its own next rows, from a counter no other thread writes until it helps. Against
    // parallel_for's shared counter of chunks handed out in turn (Zen 4, session 28): SmolLM2-shape
    // decode +7 %, Gemma 3 +6 %, MoE pp8 +13 %; with one core kept busy by another process 3-6 % slower.
    void parallel_for_shares(int64_t n, const JobFn& fn) {
        if (n <= 0) return;
        if (n > (int64_t)UINT32_MAX) return parallel_for(n, 1, fn);  // beyond a share's 32-bit bounds
        const int active = (int)std::min<int64_t>(active_.load(), n);
        if (active == 1) {
            fn(0, n, 0);
            return;
        }
        if ((int)shares_.size() < active) shares_ = std::vector<Share>(active);
        for (int t = 0; t < active; t++) shares_[t].span.store(Share::pack(n * t / active, n * (t + 1) / active));
        parallel_for(active, 1, [&](int64_t home, int64_t, int thread) {
            do {
                for (int64_t i; (i = shares_[home].take_front()) >= 0;) fn(i, i + 1, thread);
            } while (steal_half(home, active));
        });
    }

private:
    // One thread's share of parallel_for_shares' items: [front, back) packed in one atomic word, so
    // its owner (from the front) and a helper (splitting off the back half) never take the same item.
    struct alignas(64) Share {
        std::atomic<uint64_t> span{0};
        static uint64_t pack(int64_t front, int64_t back) { return (uint64_t)back << 32 | (uint64_t)front; }
        static int64_t front(uint64_t s) { return (int64_t)(s & 0xFFFFFFFFu); }
        static int64_t back(uint64_t s) { return (int64_t)(s >> 32); }
        static int64_t size(uint64_t s) { return std::max<int64_t>(0, back(s) - front(s)); }
        int64_t take_front() {
            for (uint64_t s = span.load();;) {
                if (size(s) == 0) return -1;
                if (span.compare_exchange_weak(s, pack(front(s) + 1, back(s)))) return front(s);
            }
        }
    };
    // Moves the back half (at least one item) of the largest other share into share `home`, which its
    // owner has emptied; false when every share is empty.
    bool steal_half(int64_t home, int active) {
        for (;;) {
            int victim = -1;
            uint64_t span = 0;  // the victim's, as read (a stale one fails the exchange: look again)
            for (int t = 0; t < active; t++) {
                const uint64_t s = shares_[t].span.load();
                if (t != home && Share::size(s) > Share::size(span)) victim = t, span = s;
            }
            if (victim < 0) return false;
            const int64_t f = Share::front(span), b = Share::back(span), mid = f + (b - f) / 2;
            if (shares_[victim].span.compare_exchange_strong(span, Share::pack(f, mid))) {
                shares_[home].span.store(Share::pack(mid, b));
                return true;
            }
        }
    }
    void run_chunks(int thread) {
        for (;;) {
            int64_t b = next_.fetch_add(chunk_);
            if (b >= n_items_) break;
            (*fn_)(b, std::min(n_items_, b + chunk_), thread);
        }
    }
    // The next generation after `seen`: busy-waits up to the poll level, then sleeps. The busy wait
    // yields every 64 checks: beside a busy process of the same priority on a worker's core, yielding
    // while idle wins decode back (SmolLM2 Q4_1 on Zen 4 101 t/s against 66 with pause alone).
    uint64_t wait_for_change(uint64_t seen) {
        uint64_t g;
        int spins = 0;
        while ((g = generation_.load(std::memory_order_acquire)) == seen && spins < spins_) {
            spins++;
            if ((spins & 63) == 0) std::this_thread::yield();
        }
        if (g != seen) return g;
        std::unique_lock<std::mutex> lk(mutex_);
        cv_.wait(lk, [&] { return generation_.load() != seen; });
        return generation_.load();
    }
    // A worker joins an open job (odd generation) and re-checks that it is still open before touching it:
    // with the caller's close-then-wait (all seq_cst), either the caller waits for this worker or the
    // worker sees the job closed and leaves it alone.
    void worker_loop(int thread) {
        uint64_t seen = 0;
        for (;;) {
            const uint64_t g = wait_for_change(seen);
            seen = g;
            if (stop_) return;
            if (!(g & 1) || thread >= active_.load()) continue;
            joined_.fetch_add(1);
            if (generation_.load() == g) run_chunks(thread);
            joined_.fetch_sub(1);
        }
    }

    int n_;
    std::atomic<int> active_;  // set by the calling thread between jobs
    const int spins_;
    std::vector<std::thread> workers_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::atomic<uint64_t> generation_{0};  // odd while a job is open
    std::atomic<int64_t> next_{0};
    std::atomic<int> joined_{0};  // workers inside the current job
    std::atomic<bool> stop_{false};
    const JobFn* fn_ = nullptr;
    int64_t n_items_ = 0, chunk_ = 1;
    std::vector<Share> shares_;  // parallel_for_shares' (set by the calling thread between jobs)
};

// ============================================================================================
// 13. Model
// ============================================================================================

const char* arch_name(Arch a) {
    switch (a) {
        case Arch::Llama: return "llama";
        case Arch::Qwen2: return "qwen2";
        case Arch::Qwen3: return "qwen3";
        case Arch::Gemma3: return "gemma3";
        case Arch::Qwen3Moe: return "qwen3moe";
        case Arch::Deepseek2: return "deepseek2";
        case Arch::Bert: return "bert";
    }
    return "?";
}

static Arch arch_from_string(const std::string& s) {
    for (Arch a : {Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3, Arch::Qwen3Moe, Arch::Deepseek2, Arch::Bert}) {
        if (s == arch_name(a)) return a;
    }
    fail("unsupported model architecture '%s' (supported: llama, qwen2, qwen3, gemma3, qwen3moe, deepseek2, bert)", s.c_str());
}

static const char* const kPoolingNames[] = {"none", "mean", "cls", "last", "rank"};

const char* pooling_name(Pooling p) { return p == Pooling::Unspecified ? "unspecified" : kPoolingNames[(int)p]; }

Pooling pooling_from_name(const std::string& name) {
    for (int i = 0; i < 5; i++)
        if (name == kPoolingNames[i]) return (Pooling)i;
    fail("unknown pooling '%s' (none, mean, cls, last, rank)", name.c_str());
}

// Reads ARCH.key as an int; a per-layer array is accepted when all layers agree. A value beyond int's
// range is an error, not truncated (2^32 + 8 layers must not read as 8).
static int64_t hparam_int(const GGUF& g, const std::string& key, int64_t def, bool required) {
    const GGUFValue* v = g.find(key);
    if (!v) {
        if (required) fail("model metadata lacks %s", key.c_str());
        return def;
    }
    double value;
    if (v->is_array()) {
        if (v->arr_num.empty()) fail("metadata %s is an empty or non-numeric array", key.c_str());
        for (double x : v->arr_num) {
            if (x != v->arr_num[0]) fail("metadata %s varies per layer, which is not supported", key.c_str());
        }
        value = v->arr_num[0];
    } else {
        value = (double)g.get_int(key, def);
    }
    if (!(value >= INT32_MIN && value <= INT32_MAX)) fail("metadata %s is out of range", key.c_str());
    return (int64_t)value;
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

HParams read_hparams(const GGUF& g) {
    HParams hp;
    const std::string arch = g.get_str("general.architecture", "");
    const std::string a = arch + ".";
    hp.arch = arch_from_string(arch);
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
    const int64_t pooling = g.get_int(a + "pooling_type", 0);
    if (pooling < 0 || pooling > 4) fail("%spooling_type %lld is not one of 0..4", a.c_str(), (long long)pooling);
    hp.pooling = (Pooling)pooling;
    if (hp.arch == Arch::Bert) {
        hp.causal = g.get_bool(a + "attention.causal", false);
        hp.use_rope = false;
        hp.norm_eps = (float)g.get_float(a + "attention.layer_norm_epsilon", 1e-12);
        const TensorInfo* types = g.tensor("token_types.weight");
        hp.n_token_types = types ? (int)types->ne[1] : 0;
    }
    const TensorInfo* embd = g.tensor("token_embd.weight");
    int64_t vocab_meta = hparam_int(g, a + "vocab_size", 0, false);
    hp.n_vocab = (int)(vocab_meta > 0 ? vocab_meta : (embd ? embd->ne[1] : 0));
    if (hp.n_vocab <= 0) fail("cannot determine the vocabulary size");
    return hp;
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
    const int64_t kv_lora = hp.kv_lora_rank, nope = hp.qk_nope, vd = hp.v_head_dim, per_head = nope + vd;
    const Type t = kv_b->type == Type::F16 ? Type::F16 : Type::F32;
    std::vector<uint8_t> buf(row_bytes(t, nope) * kv_lora * hp.n_head);
    std::vector<float> col(nope);
    TensorInfo kb;
    kb.name = kv_b->name + ".k_b";
    kb.type = t;
    kb.n_dims = 3;
    kb.ne[0] = nope;
    kb.ne[1] = kv_lora;
    kb.ne[2] = hp.n_head;
    kb.nbytes = buf.size();
    const size_t src_row = row_bytes(kv_b->type, kv_lora);
    std::vector<float> k_rows(nope * kv_lora);
    for (int h = 0; h < hp.n_head; h++) {
        for (int64_t i = 0; i < nope; i++) dequantize_row(kv_b->type, kv_b->data + src_row * (h * per_head + i), &k_rows[i * kv_lora], kv_lora);
        for (int64_t r = 0; r < kv_lora; r++) {
            for (int64_t i = 0; i < nope; i++) col[i] = k_rows[i * kv_lora + r];
            quantize_row(t, col.data(), buf.data() + row_bytes(t, nope) * (h * kv_lora + r), nope);
        }
    }
    m.derived.push_back(std::move(buf));
    kb.data = m.derived.back().data();
    L.k_b = slice_views(&kb, hp.n_head, kv_lora);
    for (int h = 0; h < hp.n_head; h++) {
        TensorInfo v = slice_view(*kv_b, 0, vd);
        v.data = kv_b->data + src_row * (h * per_head + nope);
        v.name = kv_b->name + ".v_b[" + std::to_string(h) + "]";
        L.v_b.push_back(v);
    }
}

// BERT-style encoders: post-norm blocks with biases everywhere, learned positions and token types.
static void bind_tensors_bert(Model& m) {
    const HParams& hp = m.hp;
    TensorBinder b{*m.gguf};
    const int64_t n_embd = hp.n_embd, n_vocab = hp.n_vocab, n_ff = hp.n_ff;
    m.tok_embd = b.get("token_embd.weight", {n_embd, n_vocab});
    m.tok_types = b.get("token_types.weight", {n_embd, hp.n_token_types}, false);
    m.pos_embd = b.get("position_embd.weight", {n_embd, hp.n_ctx_train});
    m.tok_norm = b.get("token_embd_norm.weight", {n_embd});
    m.tok_norm_b = b.get("token_embd_norm.bias", {n_embd});
    // The classifier's output sizes are whatever the file has (labels; the dense layer's width).
    auto rows = [&](const char* name) { const TensorInfo* t = m.gguf->tensor(name); return t ? t->ne[1] : 1; };
    m.cls = b.get("cls.weight", {n_embd, rows("cls.weight")}, false);
    m.cls_b = m.cls ? b.get("cls.bias", {m.cls->ne[1]}, false) : nullptr;
    m.cls_out = b.get("cls.output.weight", {m.cls ? m.cls->ne[1] : n_embd, rows("cls.output.weight")}, false);
    m.cls_out_b = m.cls_out ? b.get("cls.output.bias", {m.cls_out->ne[1]}, false) : nullptr;
    m.layers.resize(hp.n_layer);
    for (int il = 0; il < hp.n_layer; il++) {
        LayerWeights& L = m.layers[il];
        auto name = [&](const char* n) { return "blk." + std::to_string(il) + "." + n; };
        L.wq = b.get(name("attn_q.weight"), {n_embd, n_embd});
        L.wk = b.get(name("attn_k.weight"), {n_embd, n_embd});
        L.wv = b.get(name("attn_v.weight"), {n_embd, n_embd});
        L.bq = b.get(name("attn_q.bias"), {n_embd});
        L.bk = b.get(name("attn_k.bias"), {n_embd});
        L.bv = b.get(name("attn_v.bias"), {n_embd});
        L.wo = b.get(name("attn_output.weight"), {n_embd, n_embd});
        L.bo = b.get(name("attn_output.bias"), {n_embd});
        L.attn_out_norm = b.get(name("attn_output_norm.weight"), {n_embd});
        L.attn_out_norm_b = b.get(name("attn_output_norm.bias"), {n_embd});
        L.ffn_up = b.get(name("ffn_up.weight"), {n_embd, n_ff});
        L.ffn_up_b = b.get(name("ffn_up.bias"), {n_ff});
        L.ffn_down = b.get(name("ffn_down.weight"), {n_ff, n_embd});
        L.ffn_down_b = b.get(name("ffn_down.bias"), {n_embd});
        L.out_norm = b.get(name("layer_output_norm.weight"), {n_embd});
        L.out_norm_b = b.get(name("layer_output_norm.bias"), {n_embd});
    }
}

static void bind_tensors(Model& m) {
    const HParams& hp = m.hp;
    if (hp.arch == Arch::Bert) return bind_tensors_bert(m);
    TensorBinder b{*m.gguf};
    const int64_t n_embd = hp.n_embd, n_vocab = hp.n_vocab, n_ff = hp.n_ff, n_head = hp.n_head;
    m.tok_embd = b.get("token_embd.weight", {n_embd, n_vocab});
    m.output_norm = b.get("output_norm.weight", {n_embd});
    m.output = b.get("output.weight", {n_embd, n_vocab}, false);
    if (!m.output) m.output = m.tok_embd;  // tied embeddings
    m.rope_freqs = b.get("rope_freqs.weight", {hp.n_rot / 2}, false);
    const bool qk_norm = hp.arch == Arch::Qwen3 || hp.arch == Arch::Gemma3 || hp.arch == Arch::Qwen3Moe;
    const bool qkv_bias = hp.arch == Arch::Qwen2;
    m.layers.resize(hp.n_layer);
    for (int il = 0; il < hp.n_layer; il++) {
        LayerWeights& L = m.layers[il];
        auto name = [&](const char* n) { return "blk." + std::to_string(il) + "." + n; };
        L.attn_norm = b.get(name("attn_norm.weight"), {n_embd});
        if (hp.mla) {
            const int64_t kv_lora = hp.kv_lora_rank, qk_dim = hp.qk_nope + hp.n_rot;
            if (hp.q_lora_rank > 0) {
                L.wq_a = b.get(name("attn_q_a.weight"), {n_embd, hp.q_lora_rank});
                L.q_a_norm = b.get(name("attn_q_a_norm.weight"), {hp.q_lora_rank});
                L.wq_b = b.get(name("attn_q_b.weight"), {hp.q_lora_rank, n_head * qk_dim});
            } else {
                L.wq = b.get(name("attn_q.weight"), {n_embd, n_head * qk_dim});
            }
            L.wkv_a = b.get(name("attn_kv_a_mqa.weight"), {n_embd, kv_lora + hp.n_rot});
            L.kv_a_norm = b.get(name("attn_kv_a_norm.weight"), {kv_lora});
            if (const TensorInfo* kv_b = b.get(name("attn_kv_b.weight"), {kv_lora, n_head * (hp.qk_nope + hp.v_head_dim)}, false)) {
                split_legacy_kv_b(m, L, kv_b);
            } else {
                L.k_b = slice_views(b.get(name("attn_k_b.weight"), {hp.qk_nope, kv_lora, n_head}), n_head, kv_lora);
                L.v_b = slice_views(b.get(name("attn_v_b.weight"), {kv_lora, hp.v_head_dim, n_head}), n_head, hp.v_head_dim);
            }
            L.wo = b.get(name("attn_output.weight"), {n_head * hp.v_head_dim, n_embd});
        } else {
            const int64_t q_dim = n_head * hp.head_dim_k, k_dim = hp.n_embd_k_gqa(), v_dim = hp.n_embd_v_gqa();
            L.wq = b.get(name("attn_q.weight"), {n_embd, q_dim});
            L.wk = b.get(name("attn_k.weight"), {n_embd, k_dim});
            L.wv = b.get(name("attn_v.weight"), {n_embd, v_dim});
            L.wo = b.get(name("attn_output.weight"), {n_head * hp.head_dim_v, n_embd});
            L.bq = b.get(name("attn_q.bias"), {q_dim}, qkv_bias);
            L.bk = b.get(name("attn_k.bias"), {k_dim}, qkv_bias);
            L.bv = b.get(name("attn_v.bias"), {v_dim}, qkv_bias);
            L.q_norm = b.get(name("attn_q_norm.weight"), {hp.head_dim_k}, qk_norm);
            L.k_norm = b.get(name("attn_k_norm.weight"), {hp.head_dim_k}, qk_norm);
        }
        L.ffn_norm = b.get(name("ffn_norm.weight"), {n_embd});
        if (hp.n_expert > 0 && il >= hp.n_layer_dense_lead) {
            const int64_t n_expert = hp.n_expert, n_ff_exp = hp.n_ff_exp;
            L.gate_inp = b.get(name("ffn_gate_inp.weight"), {n_embd, n_expert});
            L.exp_probs_b = b.get(name("exp_probs_b.bias"), {n_expert}, false);
            L.gate_exp = slice_views(b.get(name("ffn_gate_exps.weight"), {n_embd, n_ff_exp, n_expert}), n_expert, n_ff_exp);
            L.up_exp = slice_views(b.get(name("ffn_up_exps.weight"), {n_embd, n_ff_exp, n_expert}), n_expert, n_ff_exp);
            L.down_exp = slice_views(b.get(name("ffn_down_exps.weight"), {n_ff_exp, n_embd, n_expert}), n_expert, n_embd);
            if (hp.n_expert_shared > 0) {
                const int64_t n_ff_shexp = n_ff_exp * hp.n_expert_shared;
                L.gate_shexp = b.get(name("ffn_gate_shexp.weight"), {n_embd, n_ff_shexp});
                L.up_shexp = b.get(name("ffn_up_shexp.weight"), {n_embd, n_ff_shexp});
                L.down_shexp = b.get(name("ffn_down_shexp.weight"), {n_ff_shexp, n_embd});
            }
        } else {
            L.ffn_gate = b.get(name("ffn_gate.weight"), {n_embd, n_ff});
            L.ffn_up = b.get(name("ffn_up.weight"), {n_embd, n_ff});
            L.ffn_down = b.get(name("ffn_down.weight"), {n_ff, n_embd});
        }
        if (hp.arch == Arch::Gemma3) {
            L.post_attn_norm = b.get(name("post_attention_norm.weight"), {n_embd});
            L.post_ffn_norm = b.get(name("post_ffw_norm.weight"), {n_embd});
        }
    }
}

// Norms, biases and the router are read as f32 directly.
static void check_f32_tensors(const Model& m) {
    auto need_f32 = [](const TensorInfo* t) {
        if (t && t->type != Type::F32) fail("tensor %s must be f32, is %s", t->name.c_str(), type_info(t->type).name);
    };
    for (const auto& L : m.layers) {
        for (const TensorInfo* t : {L.attn_norm, L.bq, L.bk, L.bv, L.q_norm, L.k_norm, L.post_attn_norm, L.ffn_norm,
                                    L.post_ffn_norm, L.q_a_norm, L.kv_a_norm, L.exp_probs_b, L.bo, L.ffn_up_b, L.ffn_down_b,
                                    L.attn_out_norm, L.attn_out_norm_b, L.out_norm, L.out_norm_b}) {
            need_f32(t);
        }
    }
    for (const TensorInfo* t : {m.output_norm, m.rope_freqs, m.tok_norm, m.tok_norm_b, m.cls_b, m.cls_out_b}) need_f32(t);
}

static OffloadDriver& driver_slot() {
    static OffloadDriver driver;
    return driver;
}
void set_offload_driver(const OffloadDriver& driver) { driver_slot() = driver; }
const OffloadDriver& offload_driver() { return driver_slot(); }

Placement offload_placement(int n_layer, int n_gpu_layers) { return offload_placement(n_layer, n_gpu_layers, {0}, {}); }

Placement offload_placement(int n_layer, int n_gpu_layers, const std::vector<int>& devices, const std::vector<float>& shares) {
    Placement p;
    p.n_layer = n_layer;
    const bool all = n_gpu_layers < 0 || n_gpu_layers > n_layer;
    p.first_device_layer = all ? 0 : n_layer - n_gpu_layers;
    p.output_on_device = all;
    if (devices.empty() || (!shares.empty() && shares.size() != devices.size())) fail("placement: one share per device");
    double total = 0;
    for (float s : shares) total += std::max(0.0f, s);
    double sum = 0;
    for (size_t i = 0; i < devices.size(); i++) {
        sum += total > 0 ? std::max(0.0f, shares[i]) : 1.0;
        p.split.push_back(float(sum / (total > 0 ? total : (double)devices.size())));
    }
    p.split.back() = 1.0f;
    p.devices = devices;
    // As llama.cpp: layer il (the output as il = n_layer) goes to the first device whose cumulative
    // share exceeds (il - first) / (layers offloaded, the output counted).
    const int n_offloaded = all ? n_layer + 1 : n_gpu_layers;
    for (int il = p.first_device_layer; il < n_layer + (all ? 1 : 0); il++) {
        const float fraction = float(il - p.first_device_layer) / (float)n_offloaded;
        const size_t share = std::min<size_t>(devices.size() - 1, std::upper_bound(p.split.begin(), p.split.end(), fraction) - p.split.begin());
        if (p.slices.empty() || p.slices.back().device != devices[share]) p.slices.push_back({devices[share], il, il, false});
        if (il < n_layer) p.slices.back().end_layer = il + 1;
        else p.slices.back().output = true;
    }
    return p;
}

// The devices -ngl may use: --device's names (all when none are given), only -mg's with -sm none,
// and their shares: -ts, else their free memory (as llama.cpp).
Placement place_on_devices(int n_layer, const ModelOptions& opt, const std::vector<OffloadDevice>& found) {
    std::vector<int> devices;
    for (const std::string& name : opt.devices) {
        int index = -1;
        for (size_t i = 0; i < found.size(); i++)
            if (found[i].name == name) index = (int)i;
        if (index < 0) fail("invalid device: %s (--list-devices shows the available ones)", name.c_str());
        devices.push_back(index);
    }
    if (opt.devices.empty())
        for (size_t i = 0; i < found.size(); i++) devices.push_back((int)i);
    if (!opt.split_layers) {
        if (opt.main_gpu < 0 || opt.main_gpu >= (int)devices.size())
            fail("main GPU %d: there are %zu devices", opt.main_gpu, devices.size());
        devices = {devices[opt.main_gpu]};
    }
    std::vector<float> shares(devices.size(), 0.0f);  // -ts values past the devices are ignored (as llama.cpp)
    for (size_t i = 0; i < std::min(opt.tensor_split.size(), devices.size()) && opt.split_layers; i++) shares[i] = opt.tensor_split[i];
    if (std::all_of(shares.begin(), shares.end(), [](float s) { return s <= 0; }))
        for (size_t i = 0; i < devices.size(); i++) shares[i] = (float)(found[devices[i]].free_bytes >> 20);
    return offload_placement(n_layer, opt.n_gpu_layers, devices, shares);
}

// The placement a model gets: -ngl's over the devices the driver finds; otherwise everything on the
// CPU, said once on stderr when layers were asked for. --device none never asks the driver.
static Placement place_layers(int n_layer, const ModelOptions& opt) {
    const bool none = opt.devices.size() == 1 && opt.devices[0] == "none";
    if (opt.n_gpu_layers == 0 || none) return offload_placement(n_layer, 0);
    const OffloadDriver& d = offload_driver();
    std::string why = "this build has no GPU backend";
    static bool told = false;
    if (d.probe && d.probe(why)) return place_on_devices(n_layer, opt, d.list());
    if (!told) fprintf(stderr, "llm: %s%s%s: running on the CPU\n", d.name.c_str(), d.name.empty() ? "" : ": ", why.c_str());
    told = true;
    return offload_placement(n_layer, 0);
}

// Bytes of the file's tensors named PREFIX... (a layer's "blk.7.") or exactly NAME.
static size_t tensor_bytes(const GGUF& g, const std::string& name, bool prefix) {
    size_t bytes = 0;
    for (const TensorInfo& t : g.tensors)
        if (prefix ? t.name.compare(0, name.size(), name) == 0 : t.name == name) bytes += t.nbytes;
    return bytes;
}

std::vector<DeviceMemory> offload_memory(const Model& model, const Placement& placement, int n_cells, Type type_k, Type type_v, int n_tokens) {
    const HParams& hp = model.hp;
    const size_t kv_per_layer = kv_bytes_per_token(hp, type_k, type_v) / std::max(1, hp.n_layer);
    const OffloadDriver& d = offload_driver();
    std::vector<DeviceMemory> out;
    for (const Placement::Slice& s : placement.slices) {
        DeviceMemory m;
        m.device = s.device;
        for (int il = s.first_layer; il < s.end_layer; il++) m.weights += tensor_bytes(*model.gguf, "blk." + std::to_string(il) + ".", true);
        m.weights += tensor_bytes(*model.gguf, "rope_freqs.weight", false);
        if (s.output) {
            const size_t out_bytes = tensor_bytes(*model.gguf, "output.weight", false);
            m.weights += tensor_bytes(*model.gguf, "output_norm.weight", false) + (out_bytes ? out_bytes : tensor_bytes(*model.gguf, "token_embd.weight", false));
        }
        m.kv = kv_per_layer * (size_t)n_cells * (size_t)(s.end_layer - s.first_layer);
        m.compute = d.compute_bytes ? d.compute_bytes(hp, s, n_tokens) : 0;
        out.push_back(m);
    }
    return out;
}

// Layers a placement offloads, the output counted (as llama.cpp's "offloaded N/M layers").
static int offloaded_layers(const Placement& p) { return p.n_layer - std::min(p.n_layer, p.first_device_layer) + (p.output_on_device ? 1 : 0); }

static double mib(size_t bytes) { return (double)bytes / (1 << 20); }

// The slices that do not fit their device's free memory, as one line each (empty: everything fits).
static std::string devices_short_of_memory(const std::vector<DeviceMemory>& need, const std::vector<OffloadDevice>& found) {
    std::string out;
    for (const DeviceMemory& m : need) {
        const OffloadDevice& dev = found.at(m.device);
        if (m.total() <= dev.free_bytes) continue;
        char line[320];
        snprintf(line, sizeof line, "%s%s (%s) needs %.0f MiB (weights %.0f, KV cache %.0f, compute %.0f) but has %.0f MiB free",
                 out.empty() ? "" : "; ", dev.name.c_str(), dev.description.c_str(), mib(m.total()), mib(m.weights), mib(m.kv), mib(m.compute), mib(dev.free_bytes));
        out += line;
    }
    return out;
}

// Before a context uploads anything: the device layers, their cache and a decode step's activations
// must fit every device's free memory; otherwise an error names what is needed and the largest -ngl
// that fits. Then the load log, per device as llama.cpp's.
static void check_and_log_device_memory(const Model& model, const ContextParams& p, int n_cells) {
    const Placement& pl = model.placement;
    const OffloadDriver& d = offload_driver();
    const std::vector<OffloadDevice> found = d.list();
    const std::string short_of = devices_short_of_memory(offload_memory(model, pl, n_cells, p.type_k, p.type_v, p.n_seq), found);
    if (!short_of.empty()) {
        std::vector<float> shares(pl.split.size());
        for (size_t i = 0; i < shares.size(); i++) shares[i] = pl.split[i] - (i ? pl.split[i - 1] : 0.0f);
        int fits = offloaded_layers(pl) - 1;
        for (; fits > 0; fits--) {
            const Placement fewer = offload_placement(pl.n_layer, fits, pl.devices, shares);
            if (devices_short_of_memory(offload_memory(model, fewer, n_cells, p.type_k, p.type_v, p.n_seq), found).empty()) break;
        }
        throw Error("not enough device memory for " + std::to_string(offloaded_layers(pl)) + " offloaded layers with " + std::to_string(n_cells) +
                    " cache cells: " + short_of + "; the largest -ngl that fits is " + std::to_string(fits) +
                    (fits == 0 ? " (run on the CPU, or give a smaller -c)" : ""));
    }
    const int n_repeating = pl.n_layer - std::min(pl.n_layer, pl.first_device_layer);
    fprintf(stderr, "llm: offloading %d repeating layers to GPU\n", n_repeating);
    if (pl.output_on_device) fprintf(stderr, "llm: offloading output layer to GPU\n");
    fprintf(stderr, "llm: offloaded %d/%d layers to GPU\n", offloaded_layers(pl), pl.n_layer + 1);
    const std::vector<DeviceMemory> batch = offload_memory(model, pl, n_cells, p.type_k, p.type_v, std::max(1, p.n_batch));
    for (size_t i = 0; i < batch.size(); i++) {
        const Placement::Slice& s = pl.slices[i];
        const OffloadDevice& dev = found.at(s.device);
        fprintf(stderr, "llm: %s (%s): %s: model buffer %.2f MiB, KV buffer %.2f MiB, compute buffer %.2f MiB (batches of %d tokens); %.0f MiB free\n",
                dev.name.c_str(), dev.description.c_str(), s.describe().c_str(), mib(batch[i].weights),
                mib(batch[i].kv), mib(batch[i].compute), std::max(1, p.n_batch), mib(dev.free_bytes));
        if (batch[i].total() > dev.free_bytes)
            fprintf(stderr, "llm: %s: batches of %d tokens need %.0f MiB more than is free: such requests fail (lower -b / -ub)\n", dev.name.c_str(),
                    std::max(1, p.n_batch), mib(batch[i].total() - dev.free_bytes));
    }
}

// Repacks every matmul weight the interleaved kernels support into one buffer, on all cores, and
// lets the kernel drop the mapped pages (clean file pages: reading them again would just re-fault),
// so resident memory stays about one copy of the weights. Without mmap the file's bytes live in a
// buffer that cannot be given back in part, so the caller skips this (two copies would be worse).
// Returns the mapped addresses it replaced (tensors' first bytes), which --mlock must not pin.
static std::vector<const uint8_t*> interleave_weights(Model& m) {
    std::vector<TensorInfo*> todo;  // experts' and MLA heads' views, in place; dense weights, as copies
    auto dense = [&](const TensorInfo** w) {
        if (!*w || !interleave_supported((*w)->type, (*w)->ne[0], (*w)->n_rows())) return;
        m.interleaved.push_back(std::make_unique<TensorInfo>(**w));
        *w = m.interleaved.back().get();
        todo.push_back(m.interleaved.back().get());
    };
    // The output projection too; a tied token embedding then reads its rows from the repacked copy.
    // Layers placed on an offload device keep the file's layout (the device reads that).
    const bool tied = m.output == m.tok_embd;
    if (!m.placement.output_on_device) dense(&m.output);
    if (tied) m.tok_embd = m.output;
    for (int il = 0; il < std::min(m.hp.n_layer, m.placement.first_device_layer); il++) {
        LayerWeights& L = m.layers[il];
        for (const TensorInfo** w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.wq_a, &L.wq_b, &L.wkv_a, &L.ffn_gate, &L.ffn_up,
                                     &L.ffn_down, &L.gate_shexp, &L.up_shexp, &L.down_shexp})
            dense(w);
        for (auto* views : {&L.gate_exp, &L.up_exp, &L.down_exp, &L.k_b, &L.v_b})
            for (TensorInfo& e : *views)
                if (interleave_supported(e.type, e.ne[0], e.ne[1])) todo.push_back(&e);
    }
    std::vector<const uint8_t*> replaced;
    for (const TensorInfo* t : todo) replaced.push_back(t->data);
    if (todo.empty()) return replaced;
    size_t total = 0;
    for (const TensorInfo* t : todo) total += t->nbytes;
    m.interleaved_data = line_bytes(total);
    uint8_t* base = m.interleaved_data.get();
    advise_huge_pages(base, total);
    std::vector<uint8_t*> dst(todo.size());
    for (size_t i = 0, off = 0; i < todo.size(); off += todo[i]->nbytes, i++) dst[i] = base + off;
    // Work in slices of about 1 MiB of rows (a large embedding is shared out too); each slice's
    // mapped pages are dropped when it is done, so the peak stays near one copy of the weights. Only
    // whole pages inside a slice are dropped: a page shared with another slice or tensor stays.
    struct Slice { size_t tensor; int64_t r0, r1; };
    std::vector<Slice> slices;
    for (size_t i = 0; i < todo.size(); i++) {
        const size_t rb = row_bytes(todo[i]->type, todo[i]->ne[0]);
        const int64_t rows = (int64_t)(todo[i]->nbytes / rb);
        const int64_t step = std::max<int64_t>(1, (int64_t)((1 << 20) / (rb * kInterleaveRows))) * kInterleaveRows;
        for (int64_t r = 0; r < rows; r += step) slices.push_back({i, r, std::min(rows, r + step)});
    }
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t i; (i = next++) < slices.size();) {
            const Slice& sl = slices[i];
            const TensorInfo& t = *todo[sl.tensor];
            const size_t rb = row_bytes(t.type, t.ne[0]);
            const uint8_t* src = t.data + sl.r0 * rb;
            interleave_rows16(t.type, src, dst[sl.tensor] + sl.r0 * rb, t.ne[0], sl.r1 - sl.r0);
            const uintptr_t page = 4096, b = ((uintptr_t)src + page - 1) & ~(page - 1),
                            e = ((uintptr_t)src + (sl.r1 - sl.r0) * rb) & ~(page - 1);
            if (e > b) madvise((void*)b, e - b, MADV_DONTNEED);
        }
    };
    std::vector<std::thread> threads(std::min(16u, std::max(1u, std::thread::hardware_concurrency())) - 1);
    for (auto& th : threads) th = std::thread(work);
    work();
    for (auto& th : threads) th.join();
    for (size_t i = 0; i < todo.size(); i++) todo[i]->data = dst[i], todo[i]->interleaved = true;
    m.interleaved_bytes = total;
    return replaced;
}

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& opt) {
    auto m = std::make_unique<Model>();
    m->gguf = GGUF::open(path, opt.use_mmap);
    m->vocab = Vocab(*m->gguf);
    if (opt.vocab_only) return m;
    m->arch_str = m->gguf->get_str("general.architecture", "");
    if (m->arch_str.empty()) fail("%s: no general.architecture (a vocabulary-only file?)", path.c_str());
    m->hp = read_hparams(*m->gguf);
    if (opt.metadata_only) return m;
    bind_tensors(*m);
    check_f32_tensors(*m);
    m->placement = place_layers(m->hp.n_layer, opt);
    std::vector<const uint8_t*> replaced;
    if (opt.interleave && opt.use_mmap) replaced = interleave_weights(*m);
    if (opt.mlock) {
        // Best effort: the mapping stays usable when the OS refuses to pin it. Mapped bytes that were
        // repacked are not pinned (that would read them back in); their copy is.
        std::sort(replaced.begin(), replaced.end());
        std::vector<std::pair<const void*, size_t>> ranges;
        if (m->interleaved_bytes) ranges.emplace_back(m->interleaved_data.get(), m->interleaved_bytes);
        for (const auto& t : m->gguf->tensors)
            if (!std::binary_search(replaced.begin(), replaced.end(), t.data)) ranges.emplace_back(t.data, t.nbytes);
        for (const auto& [data, size] : ranges) {
            if (mlock(data, size) != 0) {
                fprintf(stderr, "warning: mlock failed (%s); continuing without\n", strerror(errno));
                break;
            }
        }
    }
    return m;
}

// ============================================================================================
// 14. KV cache
// ============================================================================================
// Each layer keeps one row of K and one of V per cell, quantized to the cache type. A sequence's
// positions map to cells through its page table (pages of 16 cells), so sequences can share one
// pool and a truncated sequence returns its pages. Memory is reserved once, untouched until used.

int kv_rotation(Type t, int head_dim, bool key, bool mla) {
    if (mla || t == Type::F32 || t == Type::F16 || head_dim % 64) return 0;
    int n = 64;  // K: the largest power of two dividing the head size; V: 64
    while (key && head_dim % (n * 2) == 0) n *= 2;
    return n;
}

struct KVCache {
    static constexpr int kBlock = 16;    // cells per page
    Type type_k = Type::F16, type_v = Type::F16;
    int n_layer = 0, n_seq = 1, n_blocks = 0;
    int seq_cap = 0;                     // most positions one sequence may hold
    int64_t dim_k = 0, dim_v = 0;        // row widths (elements)
    size_t row_k = 0, row_v = 0;         // row widths (bytes)
    std::vector<LineBytes> k, v;  // per layer: n_blocks * kBlock rows
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
    void init(const HParams& hp, const ContextParams& cp, int n_cells_total, int n_cpu_layers) {
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
        rot_k = kv_rotation(type_k, hp.head_dim_k, true, hp.mla);
        rot_v = kv_rotation(type_v, hp.head_dim_v, false, hp.mla);
        const size_t cells = (size_t)n_blocks * kBlock;
        for (int il = 0; il < n_cpu_layers; il++) {  // an offload device holds the other layers' rows
            // new[] without value-initialization: pages are only committed as tokens are written.
            k.push_back(line_bytes(cells * row_k));
            v.push_back(row_v ? line_bytes(cells * row_v) : nullptr);
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
// 15. Forward pass
// ============================================================================================
// One code path for every batch size: activations are [n_tokens x width] row-major f32. Matrix
// products convert the activations once to the weight's dot-product type (as the reference does, so
// rounding matches), then split the weight rows over the threads.
//
// The units, each the one owner of its scratch (no buffer serves two roles):
//   ops               row-wise steps free of context state: rms_norm, layer_norm, hadamard, add_bias,
//                     gather/scatter, embedding_row, gelu/silu, attention_end
//   MatMuls           batches of matrix products over the thread pool (the converted activations)
//   Attention         one layer's GQA or MLA over the KV cache: projections, RoPE, store_kv, attend
//                     (scores and weighted sums on the cache rows); the keys' re-rotation of seq_move
//   Ffn               one layer's feed-forward block: dense gated, MoE (routing, grouped experts,
//                     shared experts), the encoder's ungated GELU
//   EmbeddingsOutput  embeddings mode's results: per output entry, pooled per sequence (mean, cls,
//                     last, the rank head)
//   Context::Impl     the drivers: decode (the forward pass, top to bottom), encode (bert), the
//                     batch's checks, the device layers' hand-off (offload)

// ---- Ops -----------------------------------------------------------------------------------
// The sum of x[j]^2 over n values: each square in float and summed in double, as the reference's
// norms do, but in eight interleaved partial sums; one serial chain of double additions made the
// norms latency-bound (gemma3's six per layer, and per head for q and k: 4 % of its prefill). The
// order of the additions differs from the reference's only far below float precision.
double sum_squares(const float* x, int64_t n) {
    double part[8] = {};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int p = 0; p < 8; p++) part[p] += (double)(x[j + p] * x[j + p]);
    double sum = 0;
    for (double s : part) sum += s;
    for (; j < n; j++) sum += (double)(x[j] * x[j]);
    return sum;
}
// y = x / rms(x) * w for n rows of `dim` values spaced `stride` apart; the rows are split over the
// threads.
void rms_norm(ThreadPool& pool, float* data, const TensorInfo* w, float eps, int n, int64_t dim, int64_t stride = 0) {
    if (stride == 0) stride = dim;
    const float* wt = (const float*)w->data;
    pool.parallel_for(n, std::max<int64_t>(1, 16384 / dim), [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; i++) {
            float* r = data + i * stride;
            const float scale = 1.0f / std::sqrt((float)(sum_squares(r, dim) / dim) + eps);
            for (int64_t j = 0; j < dim; j++) r[j] = r[j] * scale * wt[j];
        }
    });
}
void rms_norm_to(ThreadPool& pool, const float* in, const TensorInfo* w, float eps, int n, int64_t dim, float* out) {
    std::copy(in, in + n * dim, out);
    rms_norm(pool, out, w, eps, n, dim);
}

// In-place orthonormal Walsh-Hadamard transform of every block of n values (n a power of two):
// the Sylvester matrix scaled by 1/sqrt(n), which is its own inverse.
void hadamard(float* data, int64_t count, int n) {
    const float scale = 1.0f / std::sqrt((float)n);
#ifdef LLM_X86
    if (isa_current() != Isa::Scalar && n >= 8) {
        for (int64_t b = 0; b + n <= count; b += n) qimpl::hadamard_avx2(data + b, n, scale);
        return;
    }
#endif
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
// The same over the pool, a share of the n-value blocks per thread (a batch's queries, keys and values:
// on one thread, SmolLM2 pp2048 with a q8_0 K/V cache spent 4.8 % of its time here while the other
// thread waited).
void hadamard(ThreadPool& pool, float* data, int64_t count, int n) {
    pool.parallel_for(count / n, 64, [&](int64_t b, int64_t e, int) { hadamard(data + b * n, (e - b) * n, n); });
}

// Adds the bias row b (when the model has one) to each of n rows.
void add_bias(float* data, const TensorInfo* b, int n) {
    if (!b) return;
    const float* bv = (const float*)b->data;
    for (int i = 0; i < n; i++) {
        for (int64_t j = 0; j < b->ne[0]; j++) data[i * b->ne[0] + j] += bv[j];
    }
}

// Copies `width` values at `offset` of each of n rows spaced `stride` apart into a dense [n x width]
// block, or back (scatter).
void gather(const float* src, int n, int64_t stride, int64_t offset, int64_t width, float* dst) {
    for (int i = 0; i < n; i++) std::copy(src + i * stride + offset, src + i * stride + offset + width, dst + i * width);
}
void scatter(const float* src, int n, int64_t stride, int64_t offset, int64_t width, float* dst) {
    for (int i = 0; i < n; i++) std::copy(src + i * width, src + (i + 1) * width, dst + i * stride + offset);
}

// The end of the positions entry i attends to (the batch's mask, or causal).
int attention_end(const Batch& batch, int i) { return batch.attn_end.empty() ? batch.pos[i] + 1 : batch.attn_end[i]; }

// The activations: GELU as ggml computes it (FFNs of gemma3 and bert), SiLU (the others).
// ggml evaluates GELU (tanh form) through an f16 table: the input rounded to f16, the output too.
float gelu_of_f16(float xh) {
    const float y = 0.5f * xh * (1.0f + std::tanh(0.79788456080286535588f * xh * (1.0f + 0.044715f * xh * xh)));
    return fp16_to_fp32(fp32_to_fp16(y));
}
float gelu(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return gelu_of_f16(fp16_to_fp32(fp32_to_fp16(x)));
}
float silu(float x) { return x / (1.0f + std::exp(-x)); }

// That table (gelu_of_f16 of each of the 65536 f16 values, indexed by their bits), built on first use,
// so the SIMD path gathers what gelu computes instead of calling tanh per value.
const float* gelu_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t h = 0; h < 65536; h++) t[h] = gelu_of_f16(fp16_to_fp32((uint16_t)h));
        return t;
    }();
    return table.data();
}

// x[i] = gelu(x[i]) * up[i] (times 1 where up is null), the reference path.
void gelu_times_scalar(float* x, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = gelu(x[i]) * (up ? up[i] : 1.0f);
}

namespace qimpl {
#ifdef LLM_X86
// gelu_times_scalar, eight values at a time: F16C rounds them (to nearest even, as fp32_to_fp16), a
// gather reads the table, the two clamps of gelu are blends. Bit-identical to the scalar path.
LLM_AVX2_FN void gelu_times_avx2(float* x, const float* up, int64_t n) {
    const float* table = gelu_table();
    const __m256 low = _mm256_set1_ps(-10.0f), high = _mm256_set1_ps(10.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i bits = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        __m256 g = _mm256_i32gather_ps(table, bits, 4);
        g = _mm256_blendv_ps(g, v, _mm256_cmp_ps(v, high, _CMP_GE_OQ));
        g = _mm256_andnot_ps(_mm256_cmp_ps(v, low, _CMP_LE_OQ), g);
        if (up) g = _mm256_mul_ps(g, _mm256_loadu_ps(up + i));
        _mm256_storeu_ps(x + i, g);
    }
    gelu_times_scalar(x + i, up ? up + i : nullptr, n - i);
}
#endif
}  // namespace qimpl

// x = gelu(x) * up (up null: x = gelu(x)); the table's SIMD gather above the scalar tier.
void gelu_times(float* x, const float* up, int64_t n) {
#ifdef LLM_X86
    if (isa_current() != Isa::Scalar) return qimpl::gelu_times_avx2(x, up, n);
#endif
    gelu_times_scalar(x, up, n);
}

// x[i] = silu(x[i]) * up[i], the reference path.
void silu_times_scalar(float* x, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = silu(x[i]) * up[i];
}

namespace qimpl {
#ifdef LLM_X86
// silu_times_scalar, eight values at a time, without expf per value: with t = e^-|x| (exp_nonpos, so it
// cannot overflow), x / (1 + e^-x) is x / (1 + t) for x >= 0 and x t / (1 + t) for x < 0. Within 3e-7
// relative of the exact value (the scalar path's expf is within 1 ulp): not bit-identical to it.
LLM_AVX2_FN void silu_times_avx2(float* x, const float* up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 t = exp_nonpos_avx2<Lanes8>(_mm256_or_ps(v, sign));
        const __m256 numerator = _mm256_blendv_ps(v, _mm256_mul_ps(v, t), v);  // (blendv picks by v's sign)
        const __m256 s = _mm256_div_ps(numerator, _mm256_add_ps(one, t));
        _mm256_storeu_ps(x + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    silu_times_scalar(x + i, up + i, n - i);
}
#endif
}  // namespace qimpl

// x = silu(x) * up; the vector exp above the scalar tier.
void silu_times(float* x, const float* up, int64_t n) {
#ifdef LLM_X86
    if (isa_current() != Isa::Scalar) return qimpl::silu_times_avx2(x, up, n);
#endif
    silu_times_scalar(x, up, n);
}

// Row `row` of an embedding table as f32 (a token embedding tied to the output may have been repacked).
void embedding_row(const TensorInfo* t, int64_t row, float* out) {
    const int64_t n_embd = t->ne[0];
    if (t->interleaved)
        dequantize_interleaved_row(t->type, t->data, n_embd, row, out);
    else
        dequantize_row(t->type, t->data + row_bytes(t->type, n_embd) * row, out, n_embd);
}

// LayerNorm of n rows of dim values: (x - mean) / sqrt(var + eps) * w + b, sums in double as the reference.
void layer_norm(float* data, const TensorInfo* w, const TensorInfo* b, float eps, int n, int64_t dim) {
    const float* wt = (const float*)w->data;
    const float* bt = (const float*)b->data;
    for (int i = 0; i < n; i++) {
        float* r = data + i * dim;
        double sum = 0;
        for (int64_t j = 0; j < dim; j++) sum += r[j];
        const float mean = (float)(sum / dim);
        for (int64_t j = 0; j < dim; j++) r[j] -= mean;
        const float scale = 1.0f / std::sqrt((float)(sum_squares(r, dim) / dim) + eps);
        for (int64_t j = 0; j < dim; j++) r[j] = r[j] * scale * wt[j] + bt[j];
    }
}

// ---- Matrix products -----------------------------------------------------------------------
// One product out[n x rows(w)] = x[n x k] * w^T. Several are run together so that a decode step
// with many small products (heads, experts) pays one thread hand-off, not one per product.
struct MatMul {
    const TensorInfo* w;
    const float* x;
    int n;
    float* out;
};

// Runs MatMul batches over a thread pool; owns the activations converted for them. Its lists live as
// long as it does: a decode step makes a hundred or more calls, each after a weight stream that has
// pushed the allocator's lines out of the caches.
class MatMuls {
public:
    explicit MatMuls(ThreadPool& pool) : pool(pool) {}
    void operator()(std::initializer_list<MatMul> jobs) { run(jobs.begin(), jobs.size()); }
    void operator()(const std::vector<MatMul>& jobs) { run(jobs.data(), jobs.size()); }

private:
    struct Conv { const float* x; Type t; int n; int64_t k; size_t row; };  // an input in a weight's dot-product type
    struct Task { int job; int64_t r0, r1; };                                // rows [r0, r1) of a job's weight

    // The products jobs[0, n_jobs): their inputs converted, their rows split into tasks, the tasks run.
    void run(const MatMul* jobs, size_t n_jobs) {
        convert_inputs(jobs, n_jobs);
        split_tasks(jobs, n_jobs);
        pool.parallel_for_shares((int64_t)tasks.size(), [&](int64_t b, int64_t e, int) {
            for (int64_t t = b; t < e; t++) {
                const MatMul& m = jobs[tasks[t].job];
                const Conv& c = convs[conv_of[tasks[t].job]];
                const uint8_t* a = act[conv_of[tasks[t].job]].data();
                const ActInfo* info = &infos[conv_of[tasks[t].job]];
                if (m.w->interleaved)
                    matmul_rows_interleaved(m.w->type, m.w->data, c.k, tasks[t].r0, tasks[t].r1, a, c.row, m.n, m.out, m.w->ne[1],
                                            info);
                else
                    matmul_rows(m.w->type, m.w->data, row_bytes(m.w->type, c.k), c.k, tasks[t].r0, tasks[t].r1, a, c.row, m.n,
                                m.out, m.w->ne[1], info);
            }
        });
    }

    // Converts each distinct input once to the dot-product type of its weight, with the tiles' per-block
    // data (once, not once per task).
    void convert_inputs(const MatMul* jobs, size_t n_jobs) {
        convs.clear();
        conv_of.resize(n_jobs);
        for (size_t j = 0; j < n_jobs; j++) {
            const Type t = vec_dot_type(jobs[j].w->type);
            const int64_t k = jobs[j].w->ne[0];
            size_t c = 0;
            while (c < convs.size() && !(convs[c].x == jobs[j].x && convs[c].t == t && convs[c].n == jobs[j].n)) c++;
            if (c == convs.size()) convs.push_back({jobs[j].x, t, jobs[j].n, k, row_bytes(t, k)});
            conv_of[j] = (int)c;
        }
        if (act.size() < convs.size()) act.resize(convs.size());
        conv_rows.clear();
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
        with_sums.assign(convs.size(), 0);
        for (size_t j = 0; j < n_jobs; j++)
            with_sums[conv_of[j]] |= jobs[j].w->interleaved && interleave_needs_sums(jobs[j].w->type);
        if (infos.size() < convs.size()) infos.resize(convs.size());
        pool.parallel_for((int64_t)convs.size(), 1, [&](int64_t b, int64_t e, int) {
            for (int64_t c = b; c < e; c++)
                act_info(convs[c].t, act[c].data(), convs[c].row, convs[c].n, convs[c].k, with_sums[c], infos[c]);
        });
    }

    // Splits all weight rows into tasks of similar cost (rows x columns), about 16 per thread, so jobs of
    // different sizes (experts with few or many tokens) still balance across threads.
    void split_tasks(const MatMul* jobs, size_t n_jobs) {
        tasks.clear();
        double total_cost = 0;
        for (size_t j = 0; j < n_jobs; j++) total_cost += (double)jobs[j].w->ne[1] * jobs[j].n;
        const double task_cost = total_cost / (pool.size() * 16);
        for (size_t j = 0; j < n_jobs; j++) {
            const int64_t rows = jobs[j].w->ne[1];
            const int64_t chunk = (std::max<int64_t>(16, (int64_t)(task_cost / std::max(1, jobs[j].n))) + 15) / 16 * 16;
            for (int64_t r = 0; r < rows; r += chunk) tasks.push_back({(int)j, r, std::min(rows, r + chunk)});
        }
    }

    ThreadPool& pool;
    std::vector<std::vector<uint8_t>> act;  // activations converted for matmuls
    std::vector<ActInfo> infos;              // and their per-block data for the tiles
    std::vector<Conv> convs;                 // a call's distinct inputs
    std::vector<int> conv_of;                // each job's input
    std::vector<std::pair<int, int>> conv_rows;  // (input, token) of every row to convert
    std::vector<char> with_sums;             // whether an input's tiles need its block sums
    std::vector<Task> tasks;
};

// ---- Attention: GQA and MLA over the KV cache ----------------------------------------------
// One layer's self-attention for a batch: the projections, RoPE, the new rows stored in the cache, scores
// and weighted sums straight on the cache rows, the output projection. Owns its scratch.
struct Attention {
    const Model& model;
    KVCache& kv;
    ThreadPool& pool;
    MatMuls& matmul;
    Scratch q, k, v;  // a batch's queries (n x n_head x head_dim_k) and keys and values as cached
    Scratch attn;     // the heads' outputs before wo (n x n_head x head_dim_v)
    std::vector<float> rope_cs;  // cos/sin pairs at one position, one set per thread
    std::vector<std::vector<float>> thread_scores;    // each thread's scores and dequantized rows
    std::vector<std::vector<uint8_t>> thread_queries;  // each thread's queries in the cache's dot-product type
    // MLA: the projected query and [latent | rope] row, the query's low-rank step, the per-head
    // products' inputs and outputs (k_b, v_b), and the v_b heads side by side (wo's input).
    Scratch q_proj, kv_a, q_lora, heads_in, heads_out, v_heads;

    Attention(const Model& m, KVCache& cache, ThreadPool& threads, MatMuls& matmuls)
        : model(m), kv(cache), pool(threads), matmul(matmuls), thread_scores(threads.size()), thread_queries(threads.size()) {}

    // The queries', keys' and values' scratch for a batch of n tokens.
    void size_for(int n) {
        const HParams& hp = model.hp;
        q.resize((size_t)n * hp.n_head * hp.head_dim_k);
        attn.resize((size_t)n * hp.n_head * hp.head_dim_v);
        k.resize((size_t)n * kv.dim_k);
        v.resize((size_t)n * kv.dim_v);
    }

    // The model's RoPE angles at one position (rope_angles, with its frequency factors).
    void rope_angles(int pos, float base, float* cs) const {
        llm::rope_angles(model.hp, model.rope_freqs ? (const float*)model.rope_freqs->data : nullptr, pos, base, cs);
    }

    // Rotates n_rot dims starting at `offset` of each head; head h of token i starts at
    // data + (i * n_heads + h) * head_stride. The tokens are split over the threads (a token's
    // angles, a cos and a sin per pair, cost more than its rotations).
    void rope(float* data, int n, int n_heads, int64_t head_stride, int offset, const int32_t* pos, float base) {
        const int n_rot = model.hp.n_rot;
        rope_cs.resize((size_t)pool.size() * n_rot);
        pool.parallel_for(n, 8, [&](int64_t b, int64_t e, int thread) {
            float* cs = rope_cs.data() + (size_t)thread * n_rot;
            for (int64_t i = b; i < e; i++) {
                rope_angles(pos[i], base, cs);
                for (int h = 0; h < n_heads; h++) rotate_pairs(data + (i * n_heads + h) * head_stride + offset, cs);
            }
        });
    }

    // One head's n_rot dims rotated by the cos/sin pairs cs (the model's pairing: adjacent or halves).
    void rotate_pairs(float* r, const float* cs) const {
        const int n_rot = model.hp.n_rot;
        const bool adjacent = model.hp.rope_type == RopeType::Norm;
        for (int i0 = 0; i0 < n_rot; i0 += 2) {
            const int a = adjacent ? i0 : i0 / 2;
            const int b = adjacent ? i0 + 1 : i0 / 2 + n_rot / 2;
            const float x0 = r[a], x1 = r[b], c = cs[i0], s = cs[i0 + 1];
            r[a] = x0 * c - x1 * s;
            r[b] = x0 * s + x1 * c;
        }
    }

    // Context::seq_move on the CPU layers: RoPE angles are linear in the position, so a key roped at
    // p becomes the key roped at p + delta by one more rotation with the angles of delta, taken at
    // unit length (YaRN's magnitude factor is in the key once already). A quantized row is undone
    // from its Hadamard rotation first and redone after.
    void move_rows(int seq, int src, int dst, int n) {
        const HParams& hp = model.hp;
        const int heads = hp.mla ? 1 : hp.n_head_kv;  // a latent row holds one roped part, at its start
        const int64_t head_stride = hp.mla ? kv.dim_k : hp.head_dim_k;
        std::vector<float> row(kv.dim_k), cs(hp.n_rot);
        for (int il = 0; il < (int)kv.k.size(); il++) {
            rope_angles(dst - src, !hp.mla && hp.swa_layer[il] ? hp.rope_base_swa : hp.rope_base, cs.data());
            for (int i0 = 0; i0 < hp.n_rot; i0 += 2) {
                const float len = std::hypot(cs[i0], cs[i0 + 1]);
                cs[i0] /= len;
                cs[i0 + 1] /= len;
            }
            for (int i = 0; i < n; i++) {
                if (hp.use_rope) {
                    dequantize_row(kv.type_k, kv.k_row(il, seq, src + i), row.data(), kv.dim_k);
                    if (kv.rot_k) hadamard(row.data(), kv.dim_k, kv.rot_k);
                    for (int h = 0; h < heads; h++) rotate_pairs(row.data() + h * head_stride, cs.data());
                    if (kv.rot_k) hadamard(row.data(), kv.dim_k, kv.rot_k);
                    quantize_row(kv.type_k, row.data(), kv.k_row(il, seq, dst + i), kv.dim_k);
                } else {
                    memcpy(kv.k_row(il, seq, dst + i), kv.k_row(il, seq, src + i), kv.row_k);
                }
                if (kv.row_v) memcpy(kv.v_row(il, seq, dst + i), kv.v_row(il, seq, src + i), kv.row_v);
            }
        }
    }

    // A prefill gives each work item about this many of a KV head's queries from consecutive tokens,
    // so every K row is transposed, and every quantized V row converted, once for all of them
    // instead of once per token. Measured (pp2048, q8_0 cache, SmolLM2's 3 heads per KV head): 32
    // takes ~6 % less CPU time than 16 on AVX2 and AVX-512; 48 is slower again (session 19).
    static constexpr int kQueriesPerItem = 32;

    // Tokens [first, first + count) of a sequence's batch entries (attend's idx) that share one work
    // item: token t sees positions [lo_t, end_t); all of them see [lo, end), some of them [from, to).
    struct TokenRun {
        int first, count, lo, end, from, to;
    };

    // The runs of at most `per_run` tokens, consecutive in idx, whose ranges share at least one
    // position, so their union is a range of cached rows (scores over it read only rows some token sees).
    std::vector<TokenRun> token_runs(const Batch& batch, const std::vector<int>& idx, int per_run, bool swa) const {
        std::vector<TokenRun> runs;
        for (int t = 0; t < (int)idx.size(); t++) {
            const int lo = seen_from(batch, idx[t], swa), end = attention_end(batch, idx[t]);
            TokenRun* last = runs.empty() ? nullptr : &runs.back();
            if (last && last->count < per_run && std::max(last->lo, lo) < std::min(last->end, end)) {
                last->count++;
                last->lo = std::max(last->lo, lo), last->end = std::min(last->end, end);
                last->from = std::min(last->from, lo), last->to = std::max(last->to, end);
            } else {
                runs.push_back({t, 1, lo, end, lo, end});
            }
        }
        return runs;
    }

    // The first cached position token i sees (a sliding window's start in SWA layers).
    int seen_from(const Batch& batch, int i, bool swa) const { return swa ? std::max(0, batch.pos[i] - model.hp.n_swa + 1) : 0; }

    // Attention of every batch token over its own sequence's cached positions [lo, end). q holds
    // n x n_head x head_dim_k, the result goes to attn as n x n_head x head_dim_v. In latent (MLA)
    // caches there is no V: the first head_dim_v values of each K row serve as V.
    void attend(int il, const Batch& batch, int n) {
        const HParams& hp = model.hp;
        const int group = hp.n_head / hp.n_head_kv;
        std::vector<int> seqs(batch.seq.begin(), batch.seq.begin() + n);
        std::sort(seqs.begin(), seqs.end());
        seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
        for (int s : seqs) {
            std::vector<int> idx;
            int n_kv = 0;
            for (int i = 0; i < n; i++) {
                if (batch.seq[i] != s) continue;
                idx.push_back(i);
                n_kv = std::max(n_kv, attention_end(batch, i));
            }
            const std::vector<TokenRun> runs = token_runs(batch, idx, std::max(1, kQueriesPerItem / group), hp.swa_layer[il]);
            // Work items: (run of tokens, KV head, slice of its query heads); slices only split a group
            // when there would otherwise be fewer items than threads (decode).
            int slices = 1;
            while ((int64_t)runs.size() * hp.n_head_kv * slices < pool.size() && slices < group) slices++;
            const int per_slice = (group + slices - 1) / slices;
            const int64_t n_work = (int64_t)runs.size() * hp.n_head_kv * slices;
            pool.parallel_for(n_work, 1, [&](int64_t b, int64_t e, int thread) {
                for (int64_t w_ = b; w_ < e; w_++) {
                    // Late tokens see the most positions: hand them out first so the threads finish together.
                    const int64_t w = n_work - 1 - w_;
                    const int hk = (int)(w / slices % hp.n_head_kv);
                    const int h0 = hk * group + (int)(w % slices) * per_slice;
                    const int nh = std::min(per_slice, (hk + 1) * group - h0);
                    if (nh > 0) attend_run(il, s, batch, idx, runs[w / (hp.n_head_kv * slices)], hk, h0, nh, n_kv, thread);
                }
            });
        }
    }

    // One work item of attend: query heads [h0, h0 + nh) of KV head hk for a run of tokens, over
    // sequence s's cached rows. Scores are dot products straight on the cache rows, with the queries
    // converted to the cache type's dot-product type as the reference does, all of the item's queries
    // in one attention_scores call; V rows (in a latent cache: the tail of the K rows) are summed
    // straight from the cache, the rows every token sees for all queries at once, each sum in row
    // order, so every output is the one a token-by-token pass gives.
    void attend_run(int il, int s, const Batch& batch, const std::vector<int>& idx, const TokenRun& run, int hk, int h0, int nh,
                    int n_kv, int thread) {
        const HParams& hp = model.hp;
        const int hd_k = hp.head_dim_k, hd_v = hp.head_dim_v, nq = run.count * nh;
        const bool swa = hp.swa_layer[il];
        const bool v_from_k = kv.dim_v == 0;
        const Type vt = v_from_k ? kv.type_k : kv.type_v;
        const size_t v_stride = v_from_k ? kv.row_k : kv.row_v, v_head = row_bytes(vt, hd_v);
        const size_t v_in_k = v_from_k ? row_bytes(kv.type_k, hp.n_rot) : 0;  // latent rows: [rope | latent]
        auto v_row = [&](int c) { return v_from_k ? kv.k_row(il, s, c) + v_in_k : kv.v_row(il, s, c); };
        // Positions [lo, hi) as runs of cells that are adjacent in the cache (pages may not be).
        auto for_cells = [&](int lo, int hi, auto&& fn) {
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
        // this thread's scratch: the scores (query j's at j * n_kv), the outputs (query j's at
        // j * hd_v), the score kernels' scratch, rows dequantized for weighted_row_sums
        std::vector<float>& scratch = thread_scores[thread];
        const size_t need = (size_t)nq * (n_kv + hd_v) + 2 * (size_t)(nq + 1) * hd_k + weighted_row_sums_scratch(hd_v);
        if (scratch.size() < need) scratch.resize(need);
        float* scores = scratch.data();
        float* outs = scores + (size_t)nq * n_kv;
        float* kernel_scratch = outs + (size_t)nq * hd_v;
        float* deq = kernel_scratch + 2 * (size_t)(nq + 1) * hd_k;
        std::vector<uint8_t>& qc = thread_queries[thread];
        qc.resize(q_row * nq);
        auto token = [&](int t) { return idx[run.first + t]; };
        for (int t = 0; t < run.count; t++) {
            const float* qrow = q.data() + ((int64_t)token(t) * hp.n_head + h0) * hd_k;
            for (int j = 0; j < nh; j++) quantize_row(qt, qrow + j * hd_k, qc.data() + (t * nh + j) * q_row, hd_k);
        }
        // scores[j * n_kv + c] = K row c . query j over the rows any of the tokens sees
        for_cells(run.from, run.to, [&](int c0, int c1) {
            const uint8_t* rows = kv.k_row(il, s, c0) + hk * k_head;
            if (!attention_scores(kv.type_k, rows, kv.row_k, c1 - c0, hd_k, qc.data(), q_row, nq, scores + c0, n_kv, kernel_scratch))
                matmul_rows(kv.type_k, rows, kv.row_k, hd_k, 0, c1 - c0, qc.data(), q_row, nq, scores + c0, n_kv);
        });
        // out (+)= the probabilities of queries [j0, j0 + count) times V rows [lo, hi)
        auto sum_rows = [&](int lo, int hi, int j0, int count) {
            for_cells(lo, hi, [&](int c0, int c1) {
                weighted_row_sums(vt, v_row(c0) + hk * v_head, v_stride, scores + (size_t)j0 * n_kv + c0, n_kv, count, c1 - c0, hd_v,
                                  outs + (size_t)j0 * hd_v, hd_v, deq, true);
            });
        };
        std::fill(outs, outs + (size_t)nq * hd_v, 0.0f);
        for (int t = 0; t < run.count; t++) {
            const int lo = seen_from(batch, token(t), swa), end = attention_end(batch, token(t));
            for (int j = t * nh; j < (t + 1) * nh; j++) softmax_scaled(scores + (size_t)j * n_kv + lo, end - lo, hp.attn_scale, round_p);
            sum_rows(lo, run.lo, t * nh, nh);  // the rows before the shared ones (a sliding window's)
        }
        sum_rows(run.lo, run.end, 0, nq);
        for (int t = 0; t < run.count; t++) {
            sum_rows(run.end, attention_end(batch, token(t)), t * nh, nh);  // the token's rows after the shared ones
            float* o = attn.data() + ((int64_t)token(t) * hp.n_head + h0) * hd_v;
            std::copy(outs + (size_t)t * nh * hd_v, outs + (size_t)(t + 1) * nh * hd_v, o);
        }
    }

    // The batch's keys and values into their cells, converted to the cache's types (a token's cells are
    // its own, so the tokens are split over the threads).
    void store_kv(int il, const Batch& batch, int n, const float* krows, const float* vrows) {
        pool.parallel_for(n, 16, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; i++) {
                quantize_row(kv.type_k, krows + i * kv.dim_k, kv.k_row(il, batch.seq[i], batch.pos[i]), kv.dim_k);
                if (kv.dim_v) quantize_row(kv.type_v, vrows + i * kv.dim_v, kv.v_row(il, batch.seq[i], batch.pos[i]), kv.dim_v);
            }
        });
    }

    // The tokens whose attention outputs a layer wants, and their input rows: every token of the batch,
    // or in the last layer the output rows alone (the queries' projections, scores and wo then run on
    // those rows; every token's keys and values still go to the cache).
    struct Queries {
        const Batch& batch;
        const float* in;
        int n;
    };

    // Grouped-query attention (llama, qwen2/3, gemma3, bert): the batch's n rows `in` give the cache
    // its keys and values, the queries' rows give out (queries.n x n_embd).
    void gqa(int il, const Batch& batch, const float* in, int n, const Queries& queries, float* out) {
        const HParams& hp = model.hp;
        const LayerWeights& L = model.layers[il];
        const int nq = queries.n;
        std::vector<MatMul> jobs = {{L.wk, in, n, k.data()}, {L.wv, in, n, v.data()}};
        if (nq) jobs.push_back({L.wq, queries.in, nq, q.data()});
        matmul(jobs);
        const float base = hp.swa_layer[il] ? hp.rope_base_swa : hp.rope_base;
        // every token's key and value into the cache
        add_bias(k.data(), L.bk, n);
        add_bias(v.data(), L.bv, n);
        if (L.k_norm) rms_norm(pool, k.data(), L.k_norm, hp.norm_eps, n * hp.n_head_kv, hp.head_dim_k);
        if (hp.use_rope) rope(k.data(), n, hp.n_head_kv, hp.head_dim_k, 0, batch.pos.data(), base);
        if (kv.rot_k) hadamard(pool, k.data(), (int64_t)n * kv.dim_k, kv.rot_k);
        if (kv.rot_v) hadamard(pool, v.data(), (int64_t)n * kv.dim_v, kv.rot_v);
        store_kv(il, batch, n, k.data(), v.data());
        if (nq == 0) return;
        // the queries over it
        add_bias(q.data(), L.bq, nq);
        if (L.q_norm) rms_norm(pool, q.data(), L.q_norm, hp.norm_eps, nq * hp.n_head, hp.head_dim_k);
        if (hp.use_rope) rope(q.data(), nq, hp.n_head, hp.head_dim_k, 0, queries.batch.pos.data(), base);
        if (kv.rot_k) hadamard(pool, q.data(), (int64_t)nq * hp.n_head * hp.head_dim_k, kv.rot_k);
        attend(il, queries.batch, nq);
        if (kv.rot_v) hadamard(pool, attn.data(), (int64_t)nq * hp.n_head * hp.head_dim_v, kv.rot_v);
        matmul({{L.wo, attn.data(), nq, out}});
    }

    // Multi-head latent attention in absorbed form (deepseek2). The cache row of a token is its roped
    // key part (n_rot) followed by its normalized latent (kv_lora_rank), the order the reference
    // uses (so f16 dot products sum in the same order); the query is folded into latent space per
    // head (q_nope * k_b), attention runs there, and v_b maps the result back. The batch's rows `in`
    // give the cache rows, the queries' rows give out (queries.n x n_embd).
    void mla(int il, const Batch& batch, const float* in, int n, const Queries& queries, float* out) {
        const HParams& hp = model.hp;
        const LayerWeights& L = model.layers[il];
        const int n_head = hp.n_head, rank = hp.kv_lora_rank, nope = hp.qk_nope, rot = hp.n_rot, vd = hp.v_head_dim;
        const int64_t qh = nope + rot, row = rank + rot;
        const int nq = queries.n;
        q_proj.resize((size_t)nq * n_head * qh);
        kv_a.resize((size_t)n * row);
        std::vector<MatMul> jobs = {{L.wkv_a, in, n, kv_a.data()}};
        if (nq && L.wq_a) {
            q_lora.resize((size_t)nq * hp.q_lora_rank);
            jobs.push_back({L.wq_a, queries.in, nq, q_lora.data()});
        } else if (nq) {
            jobs.push_back({L.wq, queries.in, nq, q_proj.data()});
        }
        matmul(jobs);
        // every token's [rope | latent] row into the cache
        rope(kv_a.data(), n, 1, row, rank, batch.pos.data(), hp.rope_base);
        rms_norm(pool, kv_a.data(), L.kv_a_norm, hp.norm_eps, n, rank, row);
        for (int i = 0; i < n; i++) {
            std::copy(kv_a.data() + i * row + rank, kv_a.data() + (i + 1) * row, k.data() + i * row);
            std::copy(kv_a.data() + i * row, kv_a.data() + i * row + rank, k.data() + i * row + rot);
        }
        store_kv(il, batch, n, k.data(), nullptr);
        if (nq == 0) return;

        // the queries: q (nq x n_head x (rot + rank)) = [q_rope, q_nope * k_b_h] per head
        if (L.wq_a) {
            rms_norm(pool, q_lora.data(), L.q_a_norm, hp.norm_eps, nq, hp.q_lora_rank);
            matmul({{L.wq_b, q_lora.data(), nq, q_proj.data()}});
        }
        rope(q_proj.data(), nq, n_head, qh, nope, queries.batch.pos.data(), hp.rope_base);
        heads_in.resize((size_t)nq * n_head * std::max<int64_t>(nope, rank));
        heads_out.resize((size_t)nq * n_head * rank);
        jobs.clear();
        for (int h = 0; h < n_head; h++) {
            gather(q_proj.data(), nq, n_head * qh, h * qh, nope, heads_in.data() + (size_t)h * nq * nope);
            jobs.push_back({&L.k_b[h], heads_in.data() + (size_t)h * nq * nope, nq, heads_out.data() + (size_t)h * nq * rank});
        }
        matmul(jobs);
        for (int h = 0; h < n_head; h++) {
            scatter(heads_out.data() + (size_t)h * nq * rank, nq, n_head * row, h * row + rot, rank, q.data());
            for (int i = 0; i < nq; i++) {
                std::copy(q_proj.data() + (i * n_head + h) * qh + nope, q_proj.data() + (i * n_head + h) * qh + qh, q.data() + (i * n_head + h) * row);
            }
        }
        attend(il, queries.batch, nq);
        // attn (nq x n_head x rank) -> per head v_b -> (nq x n_head x vd) -> wo.
        jobs.clear();
        for (int h = 0; h < n_head; h++) {
            gather(attn.data(), nq, (int64_t)n_head * rank, (int64_t)h * rank, rank, heads_in.data() + (size_t)h * nq * rank);
            jobs.push_back({&L.v_b[h], heads_in.data() + (size_t)h * nq * rank, nq, heads_out.data() + (size_t)h * nq * vd});
        }
        matmul(jobs);
        v_heads.resize((size_t)nq * n_head * vd);
        for (int h = 0; h < n_head; h++) scatter(heads_out.data() + (size_t)h * nq * vd, nq, (int64_t)n_head * vd, (int64_t)h * vd, vd, v_heads.data());
        matmul({{L.wo, v_heads.data(), nq, out}});
    }
};

// ---- FFN: dense, mixture of experts, the encoder's -----------------------------------------
// One layer's feed-forward block for a batch, n rows in, n rows out. Owns its scratch.
struct Ffn {
    const Model& model;
    ThreadPool& pool;
    MatMuls& matmul;
    bool moe_grouped;  // ContextParams::moe_grouped
    // The gate and up projections (experts: their tokens' rows, in expert order, then the shared
    // experts' rows), the router's logits (n x n_expert), each expert's tokens gathered and its outputs
    // (in expert order), and the shared experts' output (n x n_embd).
    Scratch gate_out, up_out, router, routed_in, routed_out, shared_out;
    // Which tokens chose each expert (route's result): users[e] the (token, weight) pairs of expert e,
    // first[e] the row of its first token in the expert-ordered buffers (first[n_expert]: all rows).
    struct Routing {
        std::vector<std::vector<std::pair<int, float>>> users;
        std::vector<int> first;
    };
    Routing routing;  // route() fills it in place (every list keeps its allocation from layer to layer)
    std::vector<int32_t> token_experts;  // one token's chosen experts and their weights (route's scratch)
    std::vector<float> token_weights;

    Ffn(const Model& m, ThreadPool& threads, MatMuls& matmuls, bool grouped)
        : model(m), pool(threads), matmul(matmuls), moe_grouped(grouped) {}

    // gate = act(gate) * up, element by element (GELU for gemma3, SiLU for the others).
    void gated_activation(float* gate, const float* up, int64_t count) {
        const bool use_gelu = model.hp.arch == Arch::Gemma3;
        pool.parallel_for(count, 16384, [&](int64_t b, int64_t e, int) {
            if (use_gelu) return gelu_times(gate + b, up + b, e - b);
            silu_times(gate + b, up + b, e - b);
        });
    }

    // Dense gated FFN: out = down(act(gate(x)) * up(x)).
    void dense(const TensorInfo* gate, const TensorInfo* up, const TensorInfo* down, const float* xin, int n, float* out) {
        const int64_t n_ff = gate->ne[1];
        gate_out.resize((size_t)n * n_ff);
        up_out.resize((size_t)n * n_ff);
        matmul({{gate, xin, n, gate_out.data()}, {up, xin, n, up_out.data()}});
        gated_activation(gate_out.data(), up_out.data(), n * n_ff);
        matmul({{down, gate_out.data(), n, out}});
    }

    // Mixture of experts, grouped by expert: every token is routed first, then each chosen expert runs
    // once over all the tokens that chose it, so its weights are read once per batch; the shared
    // experts run in the same products (their few-token tiles compute while the routed experts'
    // weights stream, and the batch pays one thread hand-off for both).
    void moe(const LayerWeights& L, const float* xin, int n, float* out) {
        const int64_t n_embd = model.hp.n_embd;
        if (moe_grouped || n == 1) {
            moe_routed(L, xin, n, out, L.gate_shexp != nullptr);
        } else {
            // Token by token (the baseline that --moe-per-token measures): each token's experts run
            // on their own, so every expert is read once per token that chose it.
            for (int i = 0; i < n; i++) moe_routed(L, xin + i * n_embd, 1, out + i * n_embd, false);
            if (L.gate_shexp) {
                shared_out.resize((size_t)n * n_embd);
                dense(L.gate_shexp, L.up_shexp, L.down_shexp, xin, n, shared_out.data());
            }
        }
        if (L.gate_shexp)
            for (int64_t j = 0; j < n * n_embd; j++) out[j] += shared_out[j];
    }

    // Routes n tokens: which tokens chose each expert, with their weights (see Routing).
    const Routing& route(const LayerWeights& L, const float* xin, int n) {
        const HParams& hp = model.hp;
        const int n_expert = hp.n_expert, n_used = hp.n_expert_used;
        router.resize((size_t)n * n_expert);
        matmul({{L.gate_inp, xin, n, router.data()}});
        auto& [users, first] = routing;
        users.resize(n_expert);
        for (auto& tokens : users) tokens.clear();
        token_experts.resize(n_used);
        token_weights.resize(n_used);
        const float* bias = L.exp_probs_b ? (const float*)L.exp_probs_b->data : nullptr;
        for (int i = 0; i < n; i++) {
            moe_route(hp, router.data() + (size_t)i * n_expert, bias, token_experts.data(), token_weights.data());
            for (int j = 0; j < n_used; j++) users[token_experts[j]].emplace_back(i, token_weights[j]);
        }
        first.assign(n_expert + 1, 0);
        for (int e = 0; e < n_expert; e++) first[e + 1] = first[e] + (int)users[e].size();
        return routing;
    }

    // An expert's input rows: its tokens' rows of xin in place where they are consecutive (MatMuls then
    // converts a row shared by several experts once: in a decode step one conversion serves them all),
    // else gathered into `gathered`.
    const float* expert_input(const std::vector<std::pair<int, float>>& tokens, const float* xin, float* gathered) const {
        const int64_t n_embd = model.hp.n_embd;
        bool consecutive = true;
        for (size_t u = 1; u < tokens.size(); u++) consecutive &= tokens[u].first == tokens[0].first + (int)u;
        if (consecutive) return xin + tokens[0].first * n_embd;
        for (size_t u = 0; u < tokens.size(); u++)
            std::copy(xin + tokens[u].first * n_embd, xin + (tokens[u].first + 1) * n_embd, gathered + u * n_embd);
        return gathered;
    }

    // The routed experts of n tokens: route every token, run each chosen expert once over its tokens,
    // then sum each token's expert outputs by their weights. With_shared: the shared experts too, their
    // gate / up rows after the routed ones, their output in shared_out.
    void moe_routed(const LayerWeights& L, const float* xin, int n, float* out, bool with_shared) {
        const int n_expert = model.hp.n_expert;
        const int64_t n_embd = model.hp.n_embd, n_ff_exp = model.hp.n_ff_exp;
        const auto& [users, first] = route(L, xin, n);
        const int total = first[n_expert];
        const size_t routed_ff = (size_t)total * n_ff_exp, shared_ff = with_shared ? (size_t)n * L.gate_shexp->ne[1] : 0;
        routed_in.resize((size_t)total * n_embd);
        gate_out.resize(routed_ff + shared_ff);
        up_out.resize(routed_ff + shared_ff);
        routed_out.resize((size_t)total * n_embd);
        std::vector<MatMul> jobs;
        for (int e = 0; e < n_expert; e++) {
            if (users[e].empty()) continue;
            const float* x = expert_input(users[e], xin, routed_in.data() + first[e] * n_embd);
            const int m = (int)users[e].size();
            jobs.push_back({&L.gate_exp[e], x, m, gate_out.data() + first[e] * n_ff_exp});
            jobs.push_back({&L.up_exp[e], x, m, up_out.data() + first[e] * n_ff_exp});
        }
        if (with_shared) {
            jobs.push_back({L.gate_shexp, xin, n, gate_out.data() + routed_ff});
            jobs.push_back({L.up_shexp, xin, n, up_out.data() + routed_ff});
        }
        matmul(jobs);
        gated_activation(gate_out.data(), up_out.data(), (int64_t)gate_out.size());
        jobs.clear();
        for (int e = 0; e < n_expert; e++) {
            if (!users[e].empty()) jobs.push_back({&L.down_exp[e], gate_out.data() + first[e] * n_ff_exp, (int)users[e].size(), routed_out.data() + first[e] * n_embd});
        }
        if (with_shared) {
            shared_out.resize((size_t)n * n_embd);
            jobs.push_back({L.down_shexp, gate_out.data() + routed_ff, n, shared_out.data()});
        }
        matmul(jobs);
        std::fill(out, out + n * n_embd, 0.0f);
        for (int e = 0; e < n_expert; e++) {
            for (size_t u = 0; u < users[e].size(); u++) {
                const float w = users[e][u].second;
                const float* src = routed_out.data() + (first[e] + u) * n_embd;
                float* dst = out + users[e][u].first * n_embd;
                for (int64_t j = 0; j < n_embd; j++) dst[j] += w * src[j];
            }
        }
    }

    // The encoder's FFN (bert): out = down(gelu(up(x) + up_b)) + down_b.
    void ungated(const LayerWeights& L, const float* xin, int n, float* out) {
        const int64_t n_ff = model.hp.n_ff;
        up_out.resize((size_t)n * n_ff);
        matmul({{L.ffn_up, xin, n, up_out.data()}});
        add_bias(up_out.data(), L.ffn_up_b, n);
        pool.parallel_for(n * n_ff, 16384, [&](int64_t b, int64_t e, int) {
            gelu_times(up_out.data() + b, nullptr, e - b);
        });
        matmul({{L.ffn_down, up_out.data(), n, out}});
        add_bias(out, L.ffn_down_b, n);
    }
};

// ---- Embeddings output: per entry, pooled per sequence, the rank head ----------------------
// What an embeddings context returns after a batch: the output entries' hidden states and each
// sequence's pooled vector (and whether the last batch made one); the classification head's inputs
// and outputs (rank pooling) are its scratch.
struct EmbeddingsOutput {
    const Model& model;
    MatMuls& matmul;
    Pooling pooling = Pooling::None;
    int n_seq = 0, n_embd_out = 0, n_embd_rows = 0;
    Scratch embd, embd_pooled, rank_in, rank_hidden, rank_scores;
    std::vector<uint8_t> pooled_ready;

    EmbeddingsOutput(const Model& m, MatMuls& matmuls) : model(m), matmul(matmuls) {}

    // Embeddings mode: keeps the output entries' hidden states and pools each sequence of the batch
    // (mean of its tokens, its first or its last; rank: the classification head on its first token).
    void store(const Batch& batch, const float* hidden) {
        const int n = (int)batch.size();
        const int64_t n_embd = model.hp.n_embd;
        n_embd_rows = 0;
        embd.resize((size_t)n * n_embd);
        for (int i = 0; i < n; i++)
            if (batch.want_logits[i]) std::copy(hidden + i * n_embd, hidden + (i + 1) * n_embd, embd.data() + (size_t)n_embd_rows++ * n_embd);
        std::fill(pooled_ready.begin(), pooled_ready.end(), 0);
        if (pooling == Pooling::None) return;
        std::vector<int> first(n_seq, -1), last(n_seq, -1), count(n_seq, 0);
        for (int i = 0; i < n; i++) {
            const int s = batch.seq[i];
            if (first[s] < 0) first[s] = i;
            last[s] = i;
            count[s]++;
        }
        std::vector<int> ranked;  // sequences whose first token goes through the classifier
        for (int s = 0; s < n_seq; s++) {
            if (first[s] < 0) continue;
            pooled_ready[s] = 1;
            float* out = embd_pooled.data() + (size_t)s * n_embd_out;
            if (pooling == Pooling::Mean) {
                std::vector<double> sum(n_embd, 0.0);
                for (int i = 0; i < n; i++)
                    if (batch.seq[i] == s) for (int64_t j = 0; j < n_embd; j++) sum[j] += hidden[i * n_embd + j];
                for (int64_t j = 0; j < n_embd; j++) out[j] = (float)(sum[j] / count[s]);
            } else if (pooling == Pooling::Rank) {
                ranked.push_back(s);
            } else {
                const int i = pooling == Pooling::Cls ? first[s] : last[s];
                std::copy(hidden + i * n_embd, hidden + (i + 1) * n_embd, out);
            }
        }
        if (!ranked.empty()) rank_head(ranked, first, hidden);
    }

    // The classification head of rerankers: cls (dense + bias, tanh), then cls_out (scores + bias).
    void rank_head(const std::vector<int>& seqs, const std::vector<int>& first, const float* hidden) {
        const Model& m = model;
        const int64_t n_embd = m.hp.n_embd;
        const int r = (int)seqs.size();
        rank_in.resize((size_t)r * n_embd);
        for (int j = 0; j < r; j++) std::copy(hidden + first[seqs[j]] * n_embd, hidden + (first[seqs[j]] + 1) * n_embd, rank_in.data() + j * n_embd);
        const float* in = rank_in.data();
        if (m.cls) {
            rank_hidden.resize((size_t)r * m.cls->ne[1]);
            matmul({{m.cls, in, r, rank_hidden.data()}});
            add_bias(rank_hidden.data(), m.cls_b, r);
            for (float& h : rank_hidden) h = std::tanh(h);
            in = rank_hidden.data();
        }
        if (m.cls_out) {
            rank_scores.resize((size_t)r * n_embd_out);
            matmul({{m.cls_out, in, r, rank_scores.data()}});
            add_bias(rank_scores.data(), m.cls_out_b, r);
            in = rank_scores.data();
        }
        for (int j = 0; j < r; j++) std::copy(in + j * n_embd_out, in + (j + 1) * n_embd_out, embd_pooled.data() + (size_t)seqs[j] * n_embd_out);
    }
};

// ---- The drivers: decode, encode, offload --------------------------------------------------
// The rows of a model's output matrix whose logits a context computes: the first head_vocab, rounded
// up to a repacked group (the whole matrix for 0 or for as many as it has). Repacked groups lie one
// after another, so these rows are a prefix of the data in either layout.
static TensorInfo output_head(const Model& m, int head_vocab) {
    TensorInfo head = m.output ? *m.output : TensorInfo();
    if (!m.output || head_vocab <= 0 || m.placement.output_on_device) return head;
    head.ne[1] = std::min<int64_t>(head.ne[1], ((int64_t)head_vocab + kInterleaveRows - 1) / kInterleaveRows * kInterleaveRows);
    head.nbytes = (size_t)head.ne[1] * row_bytes(head.type, head.ne[0]);
    return head;
}

struct Context::Impl {
    const Model& model;
    ContextParams params;
    std::shared_ptr<ThreadPool> pool_shared;  // this context's workers, or the ones it shares
    ThreadPool& pool;
    MatMuls matmul{pool};  // every matrix product of the pass
    KVCache kv;
    Attention attention{model, kv, pool, matmul};
    Ffn ffn{model, pool, matmul, params.moe_grouped};
    Scratch logits;  // n_logits x n_vocab
    int n_logits = 0;
    // Scratch of a batch, n x n_embd: the residual stream, its normed copy (a block's input, the output
    // head's), a block's output (attention's or the FFN's); and one embedding row (the encoder's
    // position and token type rows).
    Scratch x, cur, sublayer_out, embd_row;
    // The last layer's queries (kept_queries): the output rows' batch entries and normed rows.
    Batch kept_batch;
    Scratch kept_in;
    EmbeddingsOutput embeddings{model, matmul};  // embeddings mode's results
    std::unique_ptr<OffloadBackend> device;     // runs the layers the model placed on a device
    const TensorInfo head = output_head(model, params.head_vocab);  // the output rows computed

    Impl(const Model& m, const ContextParams& p, std::shared_ptr<ThreadPool> shared)
        : model(m), params(p),
          pool_shared(shared ? std::move(shared) : std::make_shared<ThreadPool>(std::max(p.n_threads, p.n_threads_batch), p.poll)),
          pool(*pool_shared) {}

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
        if (!batch.attn_end.empty()) {
            if (batch.attn_end.size() != batch.size()) fail("batch attn_end has %zu entries for %d tokens", batch.attn_end.size(), n);
            for (int i = 0; i < n; i++) {
                if (batch.attn_end[i] <= batch.pos[i] || batch.attn_end[i] > next[batch.seq[i]])
                    fail("attn_end %d of position %d is outside its sequence's positions (end %d)", batch.attn_end[i],
                         batch.pos[i], next[batch.seq[i]]);
            }
        }
        int needed = 0;
        for (int s = 0; s < kv.n_seq; s++) needed += std::max(0, KVCache::blocks_for(next[s]) - (int)kv.pages[s].size());
        if (needed > (int)kv.free_blocks.size()) {
            fail("KV cache is full: the batch needs %d more cells than are free (%d of %d used)", needed * KVCache::kBlock,
                 kv.cells_used(), kv.n_blocks * KVCache::kBlock);
        }
        for (int s = 0; s < kv.n_seq; s++) kv.reserve(s, next[s]);
    }

    // The residual stream, attention and K/V scratch for a batch of n tokens.
    void size_activations(int n) {
        const HParams& hp = model.hp;
        x.resize((size_t)n * hp.n_embd);
        cur.resize((size_t)n * hp.n_embd);
        sublayer_out.resize((size_t)n * hp.n_embd);
        attention.size_for(n);
    }

    // Encoder forward (bert): token + position + type-0 embeddings and their LayerNorm, then post-norm
    // blocks of attention over the batch's mask (bidirectional by default) and a GELU FFN. An encoder
    // keeps no state: each sequence in the batch starts again at position 0.
    void encode(const Batch& in) {
        Batch batch = in;
        if (batch.attn_end.empty()) batch.set_non_causal();
        for (int s : batch.seq)
            if (s >= 0 && s < kv.n_seq) kv.truncate(s, 0);
        validate(batch);
        const Model& m = model;
        const HParams& hp = m.hp;
        const int n = (int)batch.size();
        const int64_t n_embd = hp.n_embd;
        size_activations(n);
        embd_row.resize(n_embd);
        for (int i = 0; i < n; i++) {
            if (batch.pos[i] >= m.pos_embd->ne[1]) fail("position %d is beyond the encoder's %lld positions", batch.pos[i], (long long)m.pos_embd->ne[1]);
            float* row = x.data() + i * n_embd;
            embedding_row(m.tok_embd, batch.token[i], row);
            embedding_row(m.pos_embd, batch.pos[i], embd_row.data());
            for (int64_t j = 0; j < n_embd; j++) row[j] += embd_row[j];
            if (m.tok_types) {  // every token is of type 0 (sentence A), as the reference feeds them
                embedding_row(m.tok_types, 0, embd_row.data());
                for (int64_t j = 0; j < n_embd; j++) row[j] += embd_row[j];
            }
        }
        layer_norm(x.data(), m.tok_norm, m.tok_norm_b, hp.norm_eps, n, n_embd);
        for (int il = 0; il < hp.n_layer; il++) {
            const LayerWeights& L = m.layers[il];
            attention.gqa(il, batch, x.data(), n, {batch, x.data(), n}, sublayer_out.data());
            add_bias(sublayer_out.data(), L.bo, n);
            for (int64_t j = 0; j < n * n_embd; j++) x[j] += sublayer_out[j];
            layer_norm(x.data(), L.attn_out_norm, L.attn_out_norm_b, hp.norm_eps, n, n_embd);

            ffn.ungated(L, x.data(), n, sublayer_out.data());
            for (int64_t j = 0; j < n * n_embd; j++) x[j] += sublayer_out[j];
            layer_norm(x.data(), L.out_norm, L.out_norm_b, hp.norm_eps, n, n_embd);
        }
        for (int i = 0; i < n; i++) kv.seq_len[batch.seq[i]] = batch.pos[i] + 1;
        embeddings.store(batch, x.data());
    }

    // The residual stream's start: each token's embedding row (gemma3: scaled).
    void embed_tokens(const Batch& batch, int n) {
        const HParams& hp = model.hp;
        const int64_t n_embd = hp.n_embd;
        for (int i = 0; i < n; i++) {
            embedding_row(model.tok_embd, batch.token[i], x.data() + i * n_embd);
            if (hp.embd_scale != 1.0f) for (int64_t j = 0; j < n_embd; j++) x[i * n_embd + j] *= hp.embd_scale;
        }
    }

    // One decoder block, pre-norm: x += attention(norm(x)), then x += ffn(norm(x)) (gemma3 also norms
    // each block's output). Kept (in the last layer: the output rows; else null): the block goes on
    // with these rows alone, moved to the first rows of x, since nothing reads the others' hidden
    // states. Every token's keys and values still go to the cache; the queries, wo and the FFN run on
    // the kept rows (the reference's last layer skips the other rows from its FFN on; a MoE prompt's
    // last layer then reads its output tokens' experts only).
    void decoder_layer(int il, const Batch& batch, int n, const std::vector<int32_t>* kept = nullptr) {
        const HParams& hp = model.hp;
        const LayerWeights& L = model.layers[il];
        const int64_t n_embd = hp.n_embd;
        rms_norm_to(pool, x.data(), L.attn_norm, hp.norm_eps, n, n_embd, cur.data());
        const Attention::Queries queries = kept ? kept_queries(batch, *kept) : Attention::Queries{batch, cur.data(), n};
        if (hp.mla) attention.mla(il, batch, cur.data(), n, queries, sublayer_out.data());
        else attention.gqa(il, batch, cur.data(), n, queries, sublayer_out.data());
        if (kept) move_rows_first(*kept);
        n = queries.n;
        if (n == 0) return;
        if (L.post_attn_norm) rms_norm(pool, sublayer_out.data(), L.post_attn_norm, hp.norm_eps, n, n_embd);
        for (int64_t j = 0; j < n * n_embd; j++) x[j] += sublayer_out[j];

        rms_norm_to(pool, x.data(), L.ffn_norm, hp.norm_eps, n, n_embd, cur.data());
        if (L.gate_inp) ffn.moe(L, cur.data(), n, sublayer_out.data());
        else ffn.dense(L.ffn_gate, L.ffn_up, L.ffn_down, cur.data(), n, sublayer_out.data());
        if (L.post_ffn_norm) rms_norm(pool, sublayer_out.data(), L.post_ffn_norm, hp.norm_eps, n, n_embd);
        for (int64_t j = 0; j < n * n_embd; j++) x[j] += sublayer_out[j];
    }

    // Moves row rows[j] of x to row j (rows ascending: each row moves before its place is written).
    void move_rows_first(const std::vector<int32_t>& rows) {
        const int64_t n_embd = model.hp.n_embd;
        for (size_t j = 0; j < rows.size(); j++)
            if (rows[j] != (int32_t)j) std::copy(x.begin() + rows[j] * n_embd, x.begin() + (rows[j] + 1) * n_embd, x.begin() + j * n_embd);
    }

    // The queries of the kept rows (decoder_layer): their batch entries and their normed rows (cur's).
    Attention::Queries kept_queries(const Batch& batch, const std::vector<int32_t>& kept) {
        const int64_t n_embd = model.hp.n_embd;
        kept_batch.clear();
        kept_in.resize(kept.size() * n_embd);
        for (size_t j = 0; j < kept.size(); j++) {
            const int i = kept[j];
            kept_batch.add(batch.token[i], batch.pos[i], batch.seq[i], true);
            if (!batch.attn_end.empty()) kept_batch.attn_end.push_back(batch.attn_end[i]);
            std::copy(cur.begin() + i * n_embd, cur.begin() + (i + 1) * n_embd, kept_in.begin() + j * n_embd);
        }
        return {kept_batch, kept_in.data(), (int)kept.size()};
    }

    // The forward pass of a decoder: embeddings, the CPU's layers, the device's (offload), then the
    // final norm and the output head on the rows that want logits (or the embeddings).
    void decode(const Batch& batch) {
        if (!model.hp.causal) return encode(batch);
        validate(batch);
        const Model& m = model;
        const HParams& hp = m.hp;
        const int n = (int)batch.size();
        const int64_t n_embd = hp.n_embd;
        size_activations(n);
        embed_tokens(batch, n);
        std::vector<int32_t> logit_rows;
        for (int i = 0; i < n; i++)
            if (batch.want_logits[i]) logit_rows.push_back(i);
        // The last layer keeps only the output rows when some row wants none, unless every row's hidden
        // state is wanted (embeddings) or a device reads x (its layers or its output head).
        const bool trim_last = !device && !params.embeddings && (int)logit_rows.size() < n;
        for (int il = 0; il < std::min(hp.n_layer, m.placement.first_device_layer); il++)
            decoder_layer(il, batch, n, trim_last && il == hp.n_layer - 1 ? &logit_rows : nullptr);
        n_logits = (int)logit_rows.size();
        logits.resize((size_t)n_logits * hp.n_vocab);
        if (device) offload(batch, logit_rows);
        for (int i = 0; i < n; i++) kv.seq_len[batch.seq[i]] = batch.pos[i] + 1;
        if (params.embeddings) {  // a decoder as an embedder: its final-norm hidden states
            n_logits = 0;
            rms_norm_to(pool, x.data(), m.output_norm, hp.norm_eps, n, n_embd, cur.data());
            embeddings.store(batch, cur.data());
            return;
        }
        if (m.placement.output_on_device || n_logits == 0) return;

        // Output: only the rows that asked for logits (the last layer has moved them first).
        if (!trim_last) move_rows_first(logit_rows);
        rms_norm_to(pool, x.data(), m.output_norm, hp.norm_eps, n_logits, n_embd, cur.data());
        if (head.ne[1] < hp.n_vocab) head_logits();
        else matmul({{m.output, cur.data(), n_logits, logits.data()}});
    }

    // A restricted head's logits (ContextParams::head_vocab): its rows' products, packed, spread to
    // n_vocab-wide rows whose other ids are -inf.
    void head_logits() {
        const int64_t rows = head.ne[1], n_vocab = model.hp.n_vocab;
        matmul({{&head, cur.data(), n_logits, logits.data()}});
        for (int j = n_logits - 1; j >= 0; j--) {
            float* row = logits.data() + j * n_vocab;
            if (j > 0) std::copy_backward(logits.data() + j * rows, logits.data() + (j + 1) * rows, row + rows);
            std::fill(row + rows, row + n_vocab, -INFINITY);
        }
    }

    // The cells of positions [0, n) of seq.
    std::vector<int32_t> seq_cells(int seq, int n) const {
        std::vector<int32_t> cells(n);
        for (int pos = 0; pos < n; pos++) cells[pos] = (int32_t)kv.cell(seq, pos);
        return cells;
    }

    // The device's part of a batch: its layers' cache cells (from this context's page tables) and
    // the activations, across once each way.
    void offload(const Batch& batch, const std::vector<int32_t>& logit_rows) {
        std::vector<int32_t> cells(batch.size()), page_cells;
        for (size_t i = 0; i < batch.size(); i++) cells[i] = (int32_t)kv.cell(batch.seq[i], batch.pos[i]);
        size_t pages_per_seq = 0;
        for (const auto& pages : kv.pages) pages_per_seq = std::max(pages_per_seq, pages.size());
        page_cells.assign(kv.n_seq * pages_per_seq, 0);
        for (int s = 0; s < kv.n_seq; s++)
            for (size_t b = 0; b < kv.pages[s].size(); b++) page_cells[s * pages_per_seq + b] = kv.pages[s][b] * KVCache::kBlock;
        OffloadBatch ob;
        ob.batch = &batch;
        ob.cells = cells.data();
        ob.page_cells = page_cells.data();
        ob.n_seq = kv.n_seq;
        ob.pages_per_seq = (int)pages_per_seq;
        ob.page_size = KVCache::kBlock;
        device->forward(ob, x.data(), (int)logit_rows.size(), logit_rows.data(), logits.data());
    }
};

// cos/sin of every rotated pair at one position, as ggml's rope cache computes them: theta_i =
// pos * base^(-2i/n_rot) accumulated by repeated multiplication in float, divided by the
// frequency factor, then YaRN's interpolation/extrapolation mix where configured.
void rope_angles(const HParams& hp, const float* freq_factors, int pos, float base, float* cs) {
    const int n_rot = hp.n_rot;
    const float theta_scale = std::pow(base, -2.0f / n_rot);
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
        const float extrap = theta / (freq_factors ? freq_factors[i0 / 2] : 1.0f), interp = hp.rope_freq_scale * extrap;
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

// Chooses the experts of one token: gating (softmax or sigmoid), optional selection bias, optional
// group-limited selection (keep the groups whose two best experts score highest), top-k, then the
// chosen experts' gate probabilities, optionally renormalized and scaled.
void moe_route(const HParams& hp, const float* logits, const float* selection_bias, int32_t* experts, float* weights) {
    const int n_expert = hp.n_expert, n_used = hp.n_expert_used;
    std::vector<float> probs(n_expert), select(n_expert);
    if (hp.expert_gating == ExpertGating::Softmax) {
        const float mx = *std::max_element(logits, logits + n_expert);
        double sum = 0;
        for (int e = 0; e < n_expert; e++) sum += (probs[e] = std::exp(logits[e] - mx));
        for (int e = 0; e < n_expert; e++) probs[e] = (float)(probs[e] / sum);
    } else {
        for (int e = 0; e < n_expert; e++) probs[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    }
    for (int e = 0; e < n_expert; e++) select[e] = probs[e] + (selection_bias ? selection_bias[e] : 0.0f);
    if (hp.n_expert_groups > 1) {
        const int n_groups = hp.n_expert_groups, per = n_expert / n_groups;
        std::vector<std::pair<float, int>> group_score(n_groups);
        for (int g = 0; g < n_groups; g++) {
            std::vector<float> v(select.begin() + g * per, select.begin() + (g + 1) * per);
            std::partial_sort(v.begin(), v.begin() + std::min(2, per), v.end(), std::greater<float>());
            group_score[g] = {v[0] + (per > 1 ? v[1] : 0.0f), g};
        }
        std::partial_sort(group_score.begin(), group_score.begin() + hp.n_group_used, group_score.end(),
                          [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
        std::vector<uint8_t> keep(n_groups, 0);
        for (int g = 0; g < hp.n_group_used; g++) keep[group_score[g].second] = 1;
        for (int e = 0; e < n_expert; e++) if (!keep[e / per]) select[e] = -INFINITY;
    }
    std::vector<int32_t> order(n_expert);
    for (int e = 0; e < n_expert; e++) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + n_used, order.end(),
                      [&](int a, int b) { return select[a] > select[b] || (select[a] == select[b] && a < b); });
    double sum = 0;
    for (int j = 0; j < n_used; j++) {
        experts[j] = order[j];
        weights[j] = probs[order[j]];
        sum += weights[j];
    }
    for (int j = 0; j < n_used; j++) {
        if (hp.expert_weights_norm) weights[j] = (float)(weights[j] / sum);
        weights[j] *= hp.expert_weights_scale;
    }
}

Context::Context(const Model& model, const ContextParams& params) : Context(model, params, nullptr) {}

Context::Context(const Model& model, const ContextParams& params, const Context& share_threads)
    : Context(model, params, share_threads.impl_->pool_shared) {}

Context::Context(const Model& model, const ContextParams& params, std::shared_ptr<ThreadPool> pool) {
    if (model.layers.empty()) fail("model was loaded without weights (vocab_only)");
    ContextParams p = params;
    if (p.n_threads <= 0) p.n_threads = physical_core_count();
    if (p.n_threads_batch <= 0) p.n_threads_batch = p.n_threads;
    if (p.poll < 0 || p.poll > 100) fail("poll level must be in 0..100");
    if (p.n_seq <= 0 || p.n_seq > 256) fail("number of sequences must be in 1..256");
    if (p.n_ctx <= 0) p.n_ctx = std::min(model.hp.n_ctx_train, 4096);
    if (p.n_ctx < p.n_seq) fail("context of %d cells cannot hold %d sequences", p.n_ctx, p.n_seq);
    if (!model.hp.causal && !p.embeddings) fail("an encoder (%s) has no logits: use it with embeddings on", model.arch_str.c_str());
    if (p.flash_attn == FlashAttn::Off && p.type_v != Type::F32 && p.type_v != Type::F16)
        fail("V cache quantization requires flash attention (-fa on or auto)");
    impl_ = std::make_unique<Impl>(model, p, std::move(pool));
    impl_->kv.init(model.hp, p, p.n_ctx, std::min(model.hp.n_layer, model.placement.first_device_layer));
    if (model.placement.any()) {
        if (p.embeddings && model.placement.output_on_device)
            fail("embeddings read the last hidden states on the CPU: keep the output layer there (-ngl <= n_layer)");
        check_and_log_device_memory(model, p, impl_->kv.n_blocks * KVCache::kBlock);
        impl_->device = offload_driver().create(model, p, impl_->kv.n_blocks * KVCache::kBlock);
        if (impl_->device->bytes_per_cell() != (impl_->kv.row_k + impl_->kv.row_v) * (model.hp.n_layer - model.placement.first_device_layer))
            fail("offload backend: its cache rows do not match the CPU's");
    }
    if (!p.embeddings) return;
    EmbeddingsOutput& d = impl_->embeddings;
    d.n_seq = p.n_seq;
    d.pooling = p.pooling == Pooling::Unspecified ? model.hp.pooling : p.pooling;
    if (d.pooling == Pooling::Rank && !model.cls && !model.cls_out)
        fail("rank pooling needs a classification head (cls.weight / cls.output.weight), which this model lacks");
    d.n_embd_out = d.pooling != Pooling::Rank ? model.hp.n_embd
                   : model.cls_out ? (int)model.cls_out->ne[1] : (int)model.cls->ne[1];
    d.embd_pooled.assign((size_t)p.n_seq * d.n_embd_out, 0.0f);
    d.pooled_ready.assign(p.n_seq, 0);
}
Context::~Context() = default;
void Context::decode(const Batch& batch) {
    impl_->pool.set_active(batch.size() > 1 ? impl_->params.n_threads_batch : impl_->params.n_threads);
    impl_->decode(batch);
}
const float* Context::embeddings(int i) const {
    const EmbeddingsOutput& out = impl_->embeddings;
    if (i < 0 || i >= out.n_embd_rows) fail("no embeddings for output %d", i);
    return out.embd.data() + (size_t)i * impl_->model.hp.n_embd;
}
const float* Context::seq_embeddings(int seq) const {
    const EmbeddingsOutput& out = impl_->embeddings;
    if (seq < 0 || seq >= (int)out.pooled_ready.size() || !out.pooled_ready[seq])
        fail("no pooled embedding of sequence %d in the last batch", seq);
    return out.embd_pooled.data() + (size_t)seq * out.n_embd_out;
}
int Context::n_embd_out() const { return impl_->embeddings.n_embd_out; }
Pooling Context::pooling() const { return impl_->embeddings.pooling; }

void Batch::set_non_causal() {
    std::map<int32_t, int32_t> end;
    for (size_t i = 0; i < size(); i++) end[seq[i]] = std::max(end[seq[i]], pos[i] + 1);
    attn_end.resize(size());
    for (size_t i = 0; i < size(); i++) attn_end[i] = end[seq[i]];
}

void embd_normalize(const float* in, float* out, int n, int norm) {
    double sum = 0;
    if (norm < 0) {
        sum = 1;
    } else if (norm == 0) {
        for (int i = 0; i < n; i++) sum = std::max(sum, (double)std::fabs(in[i]));
        sum /= 32760.0;
    } else if (norm == 2) {
        for (int i = 0; i < n; i++) sum += (double)in[i] * in[i];
        sum = std::sqrt(sum);
    } else {
        for (int i = 0; i < n; i++) sum += std::pow(std::fabs((double)in[i]), norm);
        sum = std::pow(sum, 1.0 / norm);
    }
    const double scale = sum > 0 ? 1.0 / sum : 0.0;
    for (int i = 0; i < n; i++) out[i] = (float)(in[i] * scale);
}
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
    for (int il = 0; il < (int)kv.k.size(); il++) {
        for (int pos = 0; pos < n; pos++, p += kv.row_k) memcpy(p, kv.k_row(il, seq, pos), kv.row_k);
        for (int pos = 0; pos < n && kv.row_v; pos++, p += kv.row_v) memcpy(p, kv.v_row(il, seq, pos), kv.row_v);
    }
    if (impl_->device) {  // then the device layers' rows
        const std::vector<uint8_t> rows = impl_->device->read_cells(impl_->seq_cells(seq, n));
        memcpy(p, rows.data(), rows.size());
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
    for (int il = 0; il < (int)kv.k.size(); il++) {
        for (int pos = 0; pos < n; pos++, p += kv.row_k) memcpy(kv.k_row(il, seq, pos), p, kv.row_k);
        for (int pos = 0; pos < n && kv.row_v; pos++, p += kv.row_v) memcpy(kv.v_row(il, seq, pos), p, kv.row_v);
    }
    if (impl_->device) impl_->device->write_cells(impl_->seq_cells(seq, n), p);
    kv.seq_len[seq] = n;
}
void Context::seq_copy(int src, int dst, int n) {
    if (src != dst) seq_restore(dst, seq_save(src, n));
}
bool Context::seq_move(int seq, int src, int dst, int n) {
    const KVCache& kv = impl_->kv;
    if (seq < 0 || seq >= kv.n_seq || n < 0 || dst < 0 || dst > src || src + n > kv.seq_len[seq])
        fail("seq_move: positions [%d, %d) of sequence %d cannot move to %d", src, src + n, seq, dst);
    if (impl_->device) return false;
    if (src != dst) impl_->attention.move_rows(seq, src, dst, n);
    return true;
}
size_t Context::kv_bytes() const { return impl_->kv.bytes(); }
size_t Context::kv_bytes_per_token() const { return impl_->kv.bytes_per_token(); }
int Context::n_threads() const { return impl_->pool.size(); }
const Model& Context::model() const { return impl_->model; }
int Context::head_vocab() const { return (int)impl_->head.ne[1]; }

// ============================================================================================
// 16. Memory planning
// ============================================================================================

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

// Multi-head latent attention's own scratch per token (Attention::mla): the projected query, the
// [latent | rope] row, the query's low-rank step, the per-head products' inputs and outputs, the v_b heads.
static size_t mla_scratch_floats(const HParams& hp) {
    if (hp.kv_lora_rank <= 0) return 0;
    const size_t heads = hp.n_head, rank = hp.kv_lora_rank, nope = hp.qk_nope, rot = hp.n_rot;
    return heads * (nope + rot) + (rank + rot) + hp.q_lora_rank + heads * std::max(nope, rank) + heads * rank + heads * hp.v_head_dim;
}

MemoryPlan plan_memory(const Model& model, int n_ctx_slot, int n_slots, Type type_k, Type type_v, int n_batch) {
    const HParams& hp = model.hp;
    if (n_ctx_slot <= 0 || n_slots <= 0 || n_batch <= 0) fail("plan: context, slots and batch must be positive");
    MemoryPlan p;
    p.weight_bytes = model.weight_bytes();
    p.kv_bytes_per_token = kv_bytes_per_token(hp, type_k, type_v);
    p.kv_bytes_per_slot = p.kv_bytes_per_token * (size_t)n_ctx_slot;
    p.kv_bytes_total = p.kv_bytes_per_slot * (size_t)n_slots;
    // Scratch of one forward pass of n_batch tokens (the buffers of Context::Impl, Attention and Ffn):
    // residual stream and norms, q/k/v and attention output, the FFN (dense or the routed experts'
    // rows), MLA's latent-space heads, one sequence's V dequantized for attention, converted activations,
    // and one row of logits.
    const size_t B = (size_t)n_batch, f = sizeof(float);
    const size_t ffn = std::max((size_t)hp.n_ff, hp.n_expert ? (size_t)hp.n_expert_used * hp.n_ff_exp : 0);  // a dense block or the routed rows
    size_t c = B * hp.n_embd * 3 * f;
    c += B * ((size_t)hp.n_head * (hp.head_dim_k + hp.head_dim_v) + 2 * (size_t)hp.n_embd_k_gqa()) * f;
    c += B * ffn * 3 * f + (hp.n_expert ? B * hp.n_expert_used * (size_t)hp.n_embd * 2 * f : 0);
    c += B * mla_scratch_floats(hp) * f;
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
// 17. Sampling: llama.cpp's chain (logit bias, penalties, DRY, top-n-sigma, top-k, typical-p,
//     top-p, min-p, XTC, temperature / dynamic temperature, mirostat v1/v2, a seeded draw) and GBNF
//     grammars (parser, pushdown matcher, vocabulary masking), as src/llama-sampling.cpp and
//     src/llama-grammar.cpp behave.
// ============================================================================================

// ---- Stage names ---------------------------------------------------------------------------
namespace simpl {

struct StageName { SamplerStage stage; const char* name; char letter; };
// In llama-server's default order.
constexpr StageName kStageNames[] = {
    {SamplerStage::Penalties, "penalties", 'e'}, {SamplerStage::Dry, "dry", 'd'},
    {SamplerStage::TopNSigma, "top_n_sigma", 's'}, {SamplerStage::TopK, "top_k", 'k'},
    {SamplerStage::TypicalP, "typ_p", 'y'}, {SamplerStage::TopP, "top_p", 'p'},
    {SamplerStage::MinP, "min_p", 'm'}, {SamplerStage::Xtc, "xtc", 'x'},
    {SamplerStage::Temperature, "temperature", 't'},
};
struct StageAlias { const char* name; SamplerStage stage; };
constexpr StageAlias kStageAliases[] = {
    {"top-k", SamplerStage::TopK}, {"top-p", SamplerStage::TopP}, {"nucleus", SamplerStage::TopP},
    {"top-n-sigma", SamplerStage::TopNSigma}, {"typical-p", SamplerStage::TypicalP},
    {"typical", SamplerStage::TypicalP}, {"typ-p", SamplerStage::TypicalP}, {"typ", SamplerStage::TypicalP},
    {"min-p", SamplerStage::MinP}, {"temp", SamplerStage::Temperature},
};

} // namespace simpl

const std::vector<SamplerStage>& default_sampler_stages() {
    static const std::vector<SamplerStage> order = [] {
        std::vector<SamplerStage> v;
        for (const auto& s : simpl::kStageNames) v.push_back(s.stage);
        return v;
    }();
    return order;
}

const char* sampler_stage_name(SamplerStage stage) {
    for (const auto& s : simpl::kStageNames) if (s.stage == stage) return s.name;
    return "";
}

std::vector<SamplerStage> sampler_stages_from_names(const std::vector<std::string>& names) {
    std::vector<SamplerStage> out;
    for (const std::string& n : names) {
        for (const auto& s : simpl::kStageNames) if (n == s.name) out.push_back(s.stage);
        for (const auto& a : simpl::kStageAliases) if (n == a.name) out.push_back(a.stage);
    }
    return out;
}

std::vector<SamplerStage> sampler_stages_from_chars(const std::string& chars) {
    std::vector<SamplerStage> out;
    for (char c : chars)
        for (const auto& s : simpl::kStageNames) if (c == s.letter) out.push_back(s.stage);
    return out;
}

// ---- GBNF grammars -------------------------------------------------------------------------
// A rule is a flat element list: alternatives separated by Alt, closed by End. A character set is a
// Char/CharNot/CharAny element followed by CharAlt (another char) and CharRangeUpper (closing a
// range [prev, value]) elements. Repetitions are rewritten into helper rules while parsing.
enum class GElemType : uint8_t { End, Alt, RuleRef, Char, CharNot, CharRangeUpper, CharAlt, CharAny };
struct GElem { GElemType type; uint32_t value; };

struct Grammar::Rules {
    std::vector<std::vector<GElem>> rules;
    std::vector<std::string> names;  // of each rule id (generated ones as name_N)
    std::vector<GElem> start;        // {RuleRef root, End}: the initial stack's element
};

namespace simpl {

constexpr size_t kGrammarMaxRules = 20000;          // rules, generated ones included
constexpr size_t kGrammarMaxElements = 1u << 20;    // elements over all rules
constexpr int kGrammarMaxNesting = 100;             // parenthesized groups inside each other
constexpr uint32_t kGrammarMaxRepeat = 10000;       // m and n of x{m,n}
constexpr size_t kGrammarMaxStacks = 4096;          // live parse stacks after one character
constexpr size_t kGrammarMaxStackDepth = 8192;      // elements on one stack
constexpr size_t kGrammarMaxSteps = 1u << 18;       // expansions to reach one character position

struct PartialUtf8 { uint32_t value = 0; int n_remain = 0; };  // an unfinished UTF-8 sequence

// One byte of UTF-8: 1 with cp set when a code point completes, 0 when more bytes are needed, -1 for
// an invalid sequence (a NUL byte included: llama.cpp stops a piece there).
int utf8_feed(PartialUtf8& st, uint8_t b, uint32_t& cp) {
    if (b == 0) return -1;
    if (st.n_remain > 0) {
        if ((b >> 6) != 2) return -1;
        st.value = (st.value << 6) | (b & 0x3F);
        if (--st.n_remain > 0) return 0;
        cp = st.value;
        st.value = 0;
        return 1;
    }
    static const int8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
    const int len = kLen[b >> 4];
    if (len == 0) return -1;
    if (len == 1) { cp = b; return 1; }
    st.value = b & ((1u << (8 - len)) - 1);
    st.n_remain = len - 1;
    return 0;
}

int hex_digit(char c) {
    return std::isdigit((unsigned char)c) ? c - '0' : std::isxdigit((unsigned char)c) ? std::tolower((unsigned char)c) - 'a' + 10 : -1;
}

bool gbnf_word_char(char c) { return std::isalnum((unsigned char)c) || c == '-' || c == '_'; }

// Recursive-descent parser of llama.cpp's GBNF, writing Grammar::Rules.
class GbnfParser {
public:
    GbnfParser(const std::string& src, Grammar::Rules& out) : src_(src), g_(out) {}

    void parse_all(const std::string& root) {
        skip_space(true);
        while (pos_ < src_.size()) parse_rule();
        g_.rules.resize(g_.names.size());
        for (size_t i = 0; i < g_.rules.size(); i++)
            if (g_.rules[i].empty()) throw Error("grammar: undefined rule '" + g_.names[i] + "'");
        auto it = ids_.find(root);
        if (it == ids_.end()) throw Error("grammar: there is no '" + root + "' rule");
        g_.start = {{GElemType::RuleRef, it->second}, {GElemType::End, 0}};
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        size_t line = 1 + std::count(src_.begin(), src_.begin() + std::min(pos_, src_.size()), '\n');
        throw Error("grammar: " + what + " (line " + std::to_string(line) + ")");
    }
    bool at(char c) const { return pos_ < src_.size() && src_[pos_] == c; }

    // Spaces, tabs and # comments; newlines too where a rule may continue (inside groups, after | and ::=).
    void skip_space(bool newline_ok) {
        while (pos_ < src_.size()) {
            char c = src_[pos_];
            if (c == ' ' || c == '\t') pos_++;
            else if (c == '#') while (pos_ < src_.size() && src_[pos_] != '\n' && src_[pos_] != '\r') pos_++;
            else if (newline_ok && (c == '\n' || c == '\r')) pos_++;
            else break;
        }
    }

    std::string parse_name() {
        size_t start = pos_;
        while (pos_ < src_.size() && gbnf_word_char(src_[pos_])) pos_++;
        if (pos_ == start) fail("expected a rule name");
        return src_.substr(start, pos_ - start);
    }

    uint32_t parse_count() {
        if (pos_ >= src_.size() || !std::isdigit((unsigned char)src_[pos_])) fail("expected a number in {m,n}");
        uint64_t v = 0;
        while (pos_ < src_.size() && std::isdigit((unsigned char)src_[pos_])) {
            v = v * 10 + (src_[pos_++] - '0');
            if (v > kGrammarMaxRepeat) fail("repetition count above " + std::to_string(kGrammarMaxRepeat));
        }
        return (uint32_t)v;
    }

    uint32_t parse_hex(int digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++, pos_++) {
            const int d = pos_ < src_.size() ? hex_digit(src_[pos_]) : -1;
            if (d < 0) fail("expected " + std::to_string(digits) + " hex digits");
            v = v * 16 + d;
        }
        return v;
    }

    // One character of a literal or class: an escape or a UTF-8 sequence.
    uint32_t parse_char() {
        if (pos_ >= src_.size()) fail("unexpected end of input");
        unsigned char c = (unsigned char)src_[pos_++];
        if (c == '\\') {
            if (pos_ >= src_.size()) fail("unexpected end of input after '\\'");
            char e = src_[pos_++];
            switch (e) {
                case 'x': return parse_hex(2);
                case 'u': return parse_hex(4);
                case 'U': return parse_hex(8);
                case 't': return '\t';
                case 'r': return '\r';
                case 'n': return '\n';
                case '\\': case '"': case '[': case ']': case '-': case '^': return (uint32_t)e;
                default: fail(std::string("unknown escape '\\") + e + "'");
            }
        }
        PartialUtf8 partial;
        uint32_t cp = 0;
        for (int r = utf8_feed(partial, c, cp); r != 1; r = utf8_feed(partial, (uint8_t)src_[pos_++], cp))
            if (r < 0 || pos_ >= src_.size()) fail("invalid UTF-8");
        return cp;
    }

    uint32_t symbol_id(const std::string& name) {
        auto it = ids_.find(name);
        if (it != ids_.end()) return it->second;
        return ids_[name] = new_symbol(name, false);
    }
    uint32_t new_symbol(const std::string& base, bool generated = true) {
        if (g_.names.size() >= kGrammarMaxRules) fail("more than " + std::to_string(kGrammarMaxRules) + " rules");
        uint32_t id = (uint32_t)g_.names.size();
        g_.names.push_back(generated ? base + "_" + std::to_string(id) : base);
        return id;
    }
    void add_rule(uint32_t id, std::vector<GElem> rule) {
        n_elements_ += rule.size();
        if (n_elements_ > kGrammarMaxElements) fail("the grammar is too large");
        if (g_.rules.size() <= id) g_.rules.resize(id + 1);
        g_.rules[id] = std::move(rule);
    }
    void push(std::vector<GElem>& out, GElem e) {
        if (out.size() + n_elements_ >= kGrammarMaxElements) fail("the grammar is too large");
        out.push_back(e);
    }

    void parse_rule() {
        std::string name = parse_name();
        skip_space(false);
        uint32_t id = symbol_id(name);
        if (src_.compare(pos_, 3, "::=") != 0) fail("expected '::=' after '" + name + "'");
        pos_ += 3;
        skip_space(true);
        parse_alternates(name, id, false);
        if (at('\r')) pos_ += (pos_ + 1 < src_.size() && src_[pos_ + 1] == '\n') ? 2 : 1;
        else if (at('\n')) pos_++;
        else if (pos_ < src_.size()) fail(std::string("unexpected '") + src_[pos_] + "'");
        skip_space(true);
    }

    void parse_alternates(const std::string& rule_name, uint32_t id, bool nested) {
        if (++depth_ > kGrammarMaxNesting) fail("groups nested deeper than " + std::to_string(kGrammarMaxNesting));
        std::vector<GElem> rule;
        parse_sequence(rule_name, rule, nested);
        while (at('|')) {
            push(rule, {GElemType::Alt, 0});
            pos_++;
            skip_space(true);
            parse_sequence(rule_name, rule, nested);
        }
        push(rule, {GElemType::End, 0});
        add_rule(id, std::move(rule));
        depth_--;
    }

    void parse_sequence(const std::string& rule_name, std::vector<GElem>& out, bool nested) {
        size_t last_sym = out.size();
        while (pos_ < src_.size()) {
            char c = src_[pos_];
            if (c == '"') {
                pos_++;
                last_sym = out.size();
                while (pos_ < src_.size() && src_[pos_] != '"') push(out, {GElemType::Char, parse_char()});
                if (!at('"')) fail("unterminated string literal");
                pos_++;
            } else if (c == '[') {
                pos_++;
                last_sym = out.size();
                GElemType first = GElemType::Char;
                if (at('^')) { pos_++; first = GElemType::CharNot; }
                while (pos_ < src_.size() && src_[pos_] != ']') {
                    push(out, {out.size() == last_sym ? first : GElemType::CharAlt, parse_char()});
                    if (at('-') && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
                        pos_++;
                        push(out, {GElemType::CharRangeUpper, parse_char()});
                    }
                }
                if (!at(']')) fail("unterminated character class");
                if (out.size() == last_sym) fail("empty character class");
                pos_++;
            } else if (gbnf_word_char(c)) {
                std::string name = parse_name();
                last_sym = out.size();
                push(out, {GElemType::RuleRef, symbol_id(name)});
            } else if (c == '(') {
                pos_++;
                skip_space(true);
                uint32_t sub = new_symbol(rule_name);
                parse_alternates(rule_name, sub, true);
                last_sym = out.size();
                push(out, {GElemType::RuleRef, sub});
                if (!at(')')) fail("expected ')'");
                pos_++;
            } else if (c == '.') {
                pos_++;
                last_sym = out.size();
                push(out, {GElemType::CharAny, 0});
            } else if (c == '*' || c == '+' || c == '?') {
                pos_++;
                repeat(rule_name, out, last_sym, c == '+' ? 1 : 0, c == '?' ? 1 : -1);
            } else if (c == '{') {
                pos_++;
                skip_space(nested);
                uint32_t lo = parse_count();
                skip_space(nested);
                int64_t hi = lo;
                if (at(',')) {
                    pos_++;
                    skip_space(nested);
                    hi = (pos_ < src_.size() && std::isdigit((unsigned char)src_[pos_])) ? (int64_t)parse_count() : -1;
                    skip_space(nested);
                }
                if (!at('}')) fail("expected '}'");
                pos_++;
                if (hi >= 0 && hi < lo) fail("repetition {m,n} with n < m");
                repeat(rule_name, out, last_sym, lo, hi);
            } else {
                break;
            }
            skip_space(nested);
        }
    }

    // x{m,n} becomes x repeated m times followed by n-m nested optional rules (x{m,}: one recursive
    // rule), as llama.cpp rewrites it: S{m,n} -> S..S S'(n-m), S'(k) ::= S S'(k-1) | "".
    void repeat(const std::string& rule_name, std::vector<GElem>& out, size_t last_sym, uint32_t min_times, int64_t max_times) {
        if (last_sym == out.size()) fail("a repetition operator with nothing before it");
        const std::vector<GElem> item(out.begin() + last_sym, out.end());
        if (min_times == 0) out.resize(last_sym);
        for (uint32_t i = 1; i < min_times; i++) for (const GElem& e : item) push(out, e);
        const int64_t n_opt = max_times < 0 ? 1 : max_times - min_times;
        uint32_t last_rule = 0;
        for (int64_t i = 0; i < n_opt; i++) {
            std::vector<GElem> rule = item;
            uint32_t id = new_symbol(rule_name);
            if (i > 0 || max_times < 0) rule.push_back({GElemType::RuleRef, max_times < 0 ? id : last_rule});
            rule.push_back({GElemType::Alt, 0});
            rule.push_back({GElemType::End, 0});
            add_rule(id, std::move(rule));
            last_rule = id;
        }
        if (n_opt > 0) push(out, {GElemType::RuleRef, last_rule});
    }

    const std::string& src_;
    Grammar::Rules& g_;
    std::map<std::string, uint32_t> ids_;
    size_t pos_ = 0, n_elements_ = 0;
    int depth_ = 0;
};

bool end_of_sequence(const GElem* e) { return e->type == GElemType::End || e->type == GElemType::Alt; }

// Left recursion (a rule reaching itself before consuming a character) would make the matcher loop;
// it is refused, as llama.cpp does. Rules that may be empty let the search continue past them.
bool left_recursive(const Grammar::Rules& g, uint32_t id, std::vector<uint8_t>& state, std::vector<uint8_t>& may_be_empty, int depth) {
    enum : uint8_t { kUnseen, kInProgress, kDone };
    if (state[id] == kInProgress) return true;
    if (state[id] == kDone) return false;
    if (depth > 4000) throw Error("grammar: rules nested too deeply");
    state[id] = kInProgress;
    const std::vector<GElem>& rule = g.rules[id];
    bool at_start = true;
    for (const GElem& e : rule) {
        if (end_of_sequence(&e)) {
            if (at_start) may_be_empty[id] = 1;
            at_start = true;
        } else {
            at_start = false;
        }
    }
    bool leftmost = true;
    for (const GElem& e : rule) {
        if (e.type == GElemType::RuleRef && leftmost) {
            if (left_recursive(g, e.value, state, may_be_empty, depth + 1)) return true;
            leftmost = may_be_empty[e.value];
        } else {
            leftmost = end_of_sequence(&e);
        }
    }
    state[id] = kDone;
    return false;
}

using GStack = std::vector<const GElem*>;

} // namespace simpl

// The matcher's state: the pushdown stacks (top at the back, each on a character element; an empty
// stack means the text so far is a complete sentence) and the bytes of an unfinished UTF-8 sequence.
struct Grammar::State {
    std::vector<simpl::GStack> stacks;
    simpl::PartialUtf8 partial;
};

namespace simpl {

// Expands rule references at the stack's top until every resulting stack tops a character element
// (or is empty), adding the new ones to out.
void advance_stack(const Grammar::Rules& g, GStack stack, std::vector<GStack>& out) {
    std::vector<GStack> todo{std::move(stack)};
    std::set<GStack> seen;
    size_t steps = 0;
    while (!todo.empty()) {
        GStack s = std::move(todo.back());
        todo.pop_back();
        if (!seen.insert(s).second) continue;
        if (++steps > kGrammarMaxSteps || s.size() > kGrammarMaxStackDepth)
            throw Error("grammar: too many parse states (the grammar is too ambiguous or nested too deeply)");
        if (s.empty() || s.back()->type != GElemType::RuleRef) {
            if (std::find(out.begin(), out.end(), s) != out.end()) continue;
            if (out.size() >= kGrammarMaxStacks) throw Error("grammar: too many parse states (the grammar is too ambiguous)");
            out.push_back(std::move(s));
            continue;
        }
        const GElem* ref = s.back();
        const GElem* alt = g.rules[ref->value].data();
        for (;;) {
            GStack next(s.begin(), s.end() - 1);
            if (!end_of_sequence(ref + 1)) next.push_back(ref + 1);
            if (!end_of_sequence(alt)) next.push_back(alt);
            todo.push_back(std::move(next));
            while (!end_of_sequence(alt)) alt++;
            if (alt->type != GElemType::Alt) break;
            alt++;
        }
    }
}

// Whether the character set at pos admits cp, and the element after the set.
std::pair<bool, const GElem*> match_char(const GElem* pos, uint32_t cp) {
    const bool positive = pos->type == GElemType::Char || pos->type == GElemType::CharAny;
    bool found = false;
    do {
        if (pos[1].type == GElemType::CharRangeUpper) {
            found = found || (pos->value <= cp && cp <= pos[1].value);
            pos += 2;
        } else if (pos->type == GElemType::CharAny) {
            found = true;
            pos += 1;
        } else {
            found = found || pos->value == cp;
            pos += 1;
        }
    } while (pos->type == GElemType::CharAlt);
    return {found == positive, pos};
}

// Whether some code point starting with the partial UTF-8 bytes could match the set at pos.
bool match_partial_char(const GElem* pos, PartialUtf8 partial) {
    const bool positive = pos->type == GElemType::Char || pos->type == GElemType::CharAny;
    if (partial.n_remain < 0 || (partial.n_remain == 1 && partial.value < 2)) return false;  // overlong
    uint32_t low = partial.value << (partial.n_remain * 6);
    uint32_t high = low | ((1u << (partial.n_remain * 6)) - 1);
    if (low == 0) low = partial.n_remain == 2 ? 1u << 11 : partial.n_remain == 3 ? 1u << 16 : low;
    do {
        if (pos[1].type == GElemType::CharRangeUpper) {
            if (pos->value <= high && low <= pos[1].value) return positive;
            pos += 2;
        } else if (pos->type == GElemType::CharAny) {
            return true;
        } else {
            if (low <= pos->value && pos->value <= high) return positive;
            pos += 1;
        }
    } while (pos->type == GElemType::CharAlt);
    return !positive;
}

// The stacks after one more character (empty: the grammar rejects it).
std::vector<GStack> accept_char(const Grammar::Rules& g, const std::vector<GStack>& stacks, uint32_t cp) {
    std::vector<GStack> next;
    for (const GStack& s : stacks) {
        if (s.empty()) continue;
        auto [ok, after] = match_char(s.back(), cp);
        if (!ok) continue;
        GStack t(s.begin(), s.end() - 1);
        if (!end_of_sequence(after)) t.push_back(after);
        advance_stack(g, std::move(t), next);
    }
    return next;
}

bool partial_can_continue(const std::vector<GStack>& stacks, PartialUtf8 partial) {
    if (partial.n_remain == 0) return true;
    for (const GStack& s : stacks) if (!s.empty() && match_partial_char(s.back(), partial)) return true;
    return false;
}

// Feeds the bytes of text into the state; false (state then unspecified) when the grammar rejects them.
bool feed_text(const Grammar::Rules& g, Grammar::State& st, const std::string& text) {
    for (unsigned char b : text) {
        uint32_t cp = 0;
        int r = utf8_feed(st.partial, b, cp);
        if (r < 0) return false;
        if (r == 1) {
            st.stacks = accept_char(g, st.stacks, cp);
            if (st.stacks.empty()) return false;
        }
    }
    return partial_can_continue(st.stacks, st.partial);
}

bool grammar_complete(const Grammar::State& st) {
    if (st.partial.n_remain != 0) return false;
    for (const GStack& s : st.stacks) if (s.empty()) return true;
    return false;
}

Grammar::State grammar_initial_state(const Grammar::Rules& g) {
    Grammar::State st;
    advance_stack(g, GStack{g.start.data()}, st.stacks);
    return st;
}

// Marks allowed[token] for the tokens (sorted by piece, [lo, hi) sharing their first depth bytes)
// whose pieces continue the grammar: a walk of the implicit trie of pieces, so that a prefix shared
// by many tokens is matched once and a rejected prefix prunes all tokens under it.
void mask_walk(const Grammar::Rules& g, const std::vector<std::string>& pieces, const std::vector<int32_t>& order,
               size_t lo, size_t hi, size_t depth, const std::vector<GStack>& stacks, PartialUtf8 partial,
               std::vector<uint8_t>& allowed) {
    for (; lo < hi && pieces[order[lo]].size() == depth; lo++)
        allowed[order[lo]] = partial_can_continue(stacks, partial);
    while (lo < hi) {
        const uint8_t b = (uint8_t)pieces[order[lo]][depth];
        size_t end = lo + 1;
        while (end < hi && (uint8_t)pieces[order[end]][depth] == b) end++;
        PartialUtf8 next_partial = partial;
        uint32_t cp = 0;
        const int r = utf8_feed(next_partial, b, cp);
        if (r == 0) {
            mask_walk(g, pieces, order, lo, end, depth + 1, stacks, next_partial, allowed);
        } else if (r == 1) {
            std::vector<GStack> next = accept_char(g, stacks, cp);
            if (!next.empty()) mask_walk(g, pieces, order, lo, end, depth + 1, next, next_partial, allowed);
        }
        lo = end;
    }
}

} // namespace simpl

Grammar::Grammar(const std::string& gbnf, const std::string& root) {
    auto rules = std::make_shared<Rules>();
    simpl::GbnfParser(gbnf, *rules).parse_all(root);
    std::vector<uint8_t> state(rules->rules.size(), 0), may_be_empty(rules->rules.size(), 0);
    for (uint32_t i = 0; i < rules->rules.size(); i++)
        if (simpl::left_recursive(*rules, i, state, may_be_empty, 0))
            throw Error("grammar: left recursion in rule '" + rules->names[i] + "' (not supported)");
    rules_ = std::move(rules);
}

size_t Grammar::rule_count() const { return rules_->rules.size(); }

bool Grammar::matches(const std::string& text) const {
    State st = simpl::grammar_initial_state(*rules_);
    return simpl::feed_text(*rules_, st, text) && simpl::grammar_complete(st);
}

// ---- The sampling chain --------------------------------------------------------------------
namespace simpl {

struct Candidate { int32_t id; float logit; float p; };

// The candidates the stages narrow down. sorted: by logit, descending, ties by id; by_id: the whole
// vocabulary in id order (c[i].id == i), so per-token adjustments can index it directly.
struct Candidates {
    std::vector<Candidate> c;
    bool sorted = false, by_id = true;
};

bool logit_greater(const Candidate& a, const Candidate& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); }

void sort_candidates(Candidates& cs) {
    if (!cs.sorted) std::sort(cs.c.begin(), cs.c.end(), logit_greater);
    cs.sorted = true;
    cs.by_id = false;
}

void keep_first(Candidates& cs, size_t n) {
    if (n < cs.c.size()) { cs.c.resize(n); cs.by_id = false; }
}

// Sorts and sets p to the softmax of the logits (llama_sampler_softmax_impl).
void softmax(Candidates& cs) {
    sort_candidates(cs);
    const float max_logit = cs.c[0].logit;
    double sum = 0;
    for (Candidate& x : cs.c) sum += (x.p = std::exp(x.logit - max_logit));
    for (Candidate& x : cs.c) x.p = (float)(x.p / sum);
}

// Applies fn(candidate, value) to the candidates whose ids are keys of per_token.
template <class Map, class Fn>
void for_listed(Candidates& cs, const Map& per_token, Fn fn) {
    if (per_token.empty()) return;
    if (cs.by_id) {
        for (const auto& [id, v] : per_token)
            if (id >= 0 && (size_t)id < cs.c.size()) fn(cs.c[id], v);
        return;
    }
    for (Candidate& x : cs.c) {
        auto it = per_token.find(x.id);
        if (it != per_token.end()) fn(x, it->second);
    }
    cs.sorted = false;
}

std::vector<int32_t> last_n(const std::vector<int32_t>& history, int n) {
    const size_t window = n < 0 ? history.size() : std::min(history.size(), (size_t)n);
    return std::vector<int32_t>(history.end() - window, history.end());
}

void apply_penalties(Candidates& cs, const SamplerParams& p, const std::vector<int32_t>& history) {
    if (p.penalty_last_n == 0 || (p.repeat_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f)) return;
    std::unordered_map<int32_t, int> count;
    for (int32_t t : last_n(history, p.penalty_last_n)) count[t]++;
    for_listed(cs, count, [&](Candidate& x, int n) {
        x.logit = x.logit <= 0 ? x.logit * p.repeat_penalty : x.logit / p.repeat_penalty;
        x.logit -= n * p.frequency_penalty + p.presence_penalty;
    });
    cs.sorted = false;
}

// DRY's breakers: token -> the tokens that must follow it to complete a breaker (empty: the token
// alone contains one), as llama.cpp's get_overlapping_token_sequences.
using DryBreakers = std::unordered_multimap<int32_t, std::vector<int32_t>>;

DryBreakers dry_breakers(const Vocab& vocab, const std::vector<std::string>& breakers) {
    constexpr size_t kMaxBreakerChars = 40, kMaxTailTokens = 20;
    DryBreakers out;
    for (std::string br : breakers) {
        if (br.empty()) continue;
        if (br.size() > kMaxBreakerChars) br.resize(kMaxBreakerChars);
        for (int32_t id = 0; id < vocab.n_tokens(); id++) {
            const std::string word = vocab.token_to_piece(id, true);
            if (word.find(br) != std::string::npos) { out.emplace(id, std::vector<int32_t>()); continue; }
            for (size_t pos = word.find(br[0]); pos != std::string::npos; pos = word.find(br[0], pos + 1)) {
                const size_t overlap = word.size() - pos;  // the word ends with br's first `overlap` bytes?
                if (overlap >= br.size() || word.compare(pos, overlap, br, 0, overlap) != 0) continue;
                std::vector<int32_t> tail = vocab.tokenize(br.substr(overlap), false, false);
                if (tail.size() > kMaxTailTokens) tail.resize(kMaxTailTokens);
                auto range = out.equal_range(id);
                bool dup = false;
                for (auto it = range.first; it != range.second; ++it) dup = dup || it->second == tail;
                if (!dup) out.emplace(id, std::move(tail));
            }
        }
    }
    return out;
}

// How far back (in tokens from the end) a repeat may reach: up to the most recent sequence breaker.
int dry_repeat_limit(const std::vector<int32_t>& recent, const DryBreakers& breakers) {
    const int n = (int)recent.size();
    auto from_end = [&](int i) { return recent[n - 1 - i]; };
    for (int i = 0; i < n; i++) {
        auto range = breakers.equal_range(from_end(i));
        int longest = -1;
        for (auto it = range.first; it != range.second; ++it) {
            const int len = (int)it->second.size();
            if (len <= longest || len > i) continue;
            bool match = true;
            for (int k = 0; k < len && match; k++) match = it->second[k] == from_end(i - k - 1);
            if (match) longest = len;
        }
        if (longest >= 0) return i - longest;
    }
    return n;
}

// DRY: for every earlier occurrence of the text's current suffix (found with the Z-function of the
// reversed window), the token that followed it is penalized by the repeat's length.
void apply_dry(Candidates& cs, const SamplerParams& p, const std::vector<int32_t>& history, const DryBreakers& breakers) {
    if (p.dry_multiplier == 0.0f || p.dry_base < 1.0f || p.dry_penalty_last_n == 0) return;
    const std::vector<int32_t> recent = last_n(history, p.dry_penalty_last_n);
    const int n = (int)recent.size();
    if (n <= p.dry_allowed_length) return;
    const int limit = dry_repeat_limit(recent, breakers);
    if (limit < p.dry_allowed_length) return;
    std::vector<int32_t> rev(recent.rbegin(), recent.rend());
    std::vector<int> z(n, 0);  // z[k]: longest common prefix of rev and rev[k..]
    for (int k = 1, l = 0, r = 0; k < n; k++) {
        if (k < r) z[k] = std::min(r - k, z[k - l]);
        while (k + z[k] < n && rev[z[k]] == rev[k + z[k]]) z[k]++;
        if (k + z[k] > r) { l = k; r = k + z[k]; }
    }
    std::unordered_map<int32_t, int> max_repeat;
    for (int k = 1; k < n; k++) {
        const int len = std::min(z[k], limit);
        if (len < p.dry_allowed_length) continue;
        int& m = max_repeat[rev[k - 1]];
        m = std::max(m, len);
    }
    const int max_exponent = p.dry_base > 1.000001f ? (int)(88.7228391f / std::log(p.dry_base)) : 0;
    for_listed(cs, max_repeat, [&](Candidate& x, int len) {
        int e = len - p.dry_allowed_length;
        if (max_exponent > 0 && e > max_exponent) e = max_exponent;
        x.logit -= p.dry_multiplier * std::pow(p.dry_base, (float)e);
    });
    cs.sorted = false;
}

void apply_top_k(Candidates& cs, int k) {
    if (k <= 0 || (size_t)k >= cs.c.size()) return;
    if (!cs.sorted) std::partial_sort(cs.c.begin(), cs.c.begin() + k, cs.c.end(), logit_greater);
    cs.c.resize(k);
    cs.sorted = true;
    cs.by_id = false;
}

void apply_top_p(Candidates& cs, float top_p, size_t min_keep) {
    if (top_p >= 1.0f) return;
    softmax(cs);
    double cum = 0;
    for (size_t i = 0; i < cs.c.size(); i++) {
        cum += cs.c[i].p;
        if (cum >= top_p && i + 1 >= min_keep) return keep_first(cs, i + 1);
    }
}

void apply_min_p(Candidates& cs, float min_p, size_t min_keep) {
    if (min_p <= 0.0f) return;
    sort_candidates(cs);
    const float min_logit = cs.c[0].logit + std::log(min_p);
    size_t i = 1;
    while (i < cs.c.size() && (cs.c[i].logit >= min_logit || i < min_keep)) i++;
    keep_first(cs, i);
}

// Locally typical sampling: keeps the tokens whose surprise is closest to the entropy, up to mass p.
void apply_typical(Candidates& cs, float typical_p, size_t min_keep) {
    if (typical_p >= 1.0f) return;
    softmax(cs);
    double entropy = 0;
    for (const Candidate& x : cs.c) if (x.p > 0) entropy -= x.p * std::log(x.p);
    std::vector<std::pair<double, size_t>> shifted;  // |surprise - entropy|, index
    for (size_t i = 0; i < cs.c.size(); i++) shifted.emplace_back(std::fabs(-std::log(cs.c[i].p) - entropy), i);
    std::stable_sort(shifted.begin(), shifted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t keep = shifted.size();
    double cum = 0;
    for (size_t i = 0; i < shifted.size(); i++) {
        cum += cs.c[shifted[i].second].p;
        if (cum > typical_p && (min_keep == 0 || i + 1 >= min_keep)) { keep = i + 1; break; }
    }
    std::vector<Candidate> kept;
    for (size_t i = 0; i < keep; i++) kept.push_back(cs.c[shifted[i].second]);
    cs.c = std::move(kept);
    cs.sorted = false;
    cs.by_id = false;
}

// Top-n-sigma: drops logits more than n standard deviations below the best.
void apply_top_n_sigma(Candidates& cs, float n) {
    if (n <= 0.0f || cs.c.size() <= 1) return;
    double sum = 0, max_logit = cs.c[0].logit;
    for (const Candidate& x : cs.c) { sum += x.logit; max_logit = std::max(max_logit, (double)x.logit); }
    const double mean = sum / cs.c.size();
    double acc = 0;
    for (const Candidate& x : cs.c) acc += (x.logit - mean) * (x.logit - mean);
    const double cut = max_logit - n * std::sqrt(acc / cs.c.size());
    sort_candidates(cs);
    size_t keep = 0;
    while (keep < cs.c.size() && cs.c[keep].logit >= cut) keep++;
    keep_first(cs, std::max<size_t>(keep, 1));
}

// XTC: with the given probability, removes every token at or above the threshold except the least
// likely of them.
void apply_xtc(Candidates& cs, float probability, float threshold, size_t min_keep, std::mt19937_64& rng) {
    if (probability <= 0.0f || threshold > 0.5f || cs.c.size() < 2) return;
    if (std::uniform_real_distribution<float>(0.0f, 1.0f)(rng) > probability) return;
    softmax(cs);
    size_t last = 0;
    while (last + 1 < cs.c.size() && cs.c[last + 1].p >= threshold) last++;
    if (last > 0 && cs.c.size() - last >= min_keep) {
        cs.c.erase(cs.c.begin(), cs.c.begin() + last);
        cs.by_id = false;
    }
}

// Temperature; t <= 0 keeps only the best token (greedy).
void apply_temperature(Candidates& cs, float t) {
    if (t <= 0.0f) {
        Candidate best = *std::min_element(cs.c.begin(), cs.c.end(), logit_greater);
        cs.c.assign(1, best);
        cs.sorted = true;
        cs.by_id = false;
        return;
    }
    for (Candidate& x : cs.c) x.logit /= t;
}

// Dynamic temperature: t +- range, scaled by the normalized entropy raised to exponent.
void apply_dynatemp(Candidates& cs, float t, float range, float exponent) {
    if (range <= 0.0f) return apply_temperature(cs, t);
    if (cs.c.size() <= 1) return;
    const float min_t = std::max(0.0f, t - range), max_t = t + range;
    softmax(cs);
    double entropy = 0;
    for (const Candidate& x : cs.c) if (x.p > 0) entropy -= x.p * std::log(x.p);
    const double normalized = entropy / std::log((double)cs.c.size());
    apply_temperature(cs, (float)(min_t + (max_t - min_t) * std::pow(normalized, exponent)));
}

size_t draw_index(const Candidates& cs, std::mt19937_64& rng) {
    std::vector<double> w(cs.c.size());
    for (size_t i = 0; i < w.size(); i++) w[i] = cs.c[i].p;
    return std::discrete_distribution<size_t>(w.begin(), w.end())(rng);
}

// Mirostat v1 (Basu et al.): estimates the Zipf exponent from the top 100 tokens, picks k for the
// target surprise mu, and moves mu toward tau.
int32_t mirostat_v1(Candidates& cs, float tau, float eta, float& mu, int n_vocab, std::mt19937_64& rng) {
    softmax(cs);
    double sum_ti_bi = 0, sum_ti_sq = 0;
    for (size_t i = 0; i + 1 < cs.c.size() && i < 99; i++) {
        const double t_i = std::log((i + 2.0) / (i + 1.0)), b_i = std::log((double)cs.c[i].p / cs.c[i + 1].p);
        sum_ti_bi += t_i * b_i;
        sum_ti_sq += t_i * t_i;
    }
    const double s_hat = sum_ti_sq > 0 ? sum_ti_bi / sum_ti_sq : 1.0, eps = s_hat - 1;
    const double k = std::pow(eps * std::pow(2.0, mu) / (1 - std::pow((double)n_vocab, -eps)), 1 / s_hat);
    apply_top_k(cs, std::isfinite(k) ? std::max(1, (int)std::min(k, 1e9)) : 1);
    softmax(cs);
    const size_t i = draw_index(cs, rng);
    mu -= eta * (float)(-std::log2(cs.c[i].p) - tau);
    return cs.c[i].id;
}

// Mirostat v2: keeps the tokens whose surprise is at most mu, draws, and moves mu toward tau.
int32_t mirostat_v2(Candidates& cs, float tau, float eta, float& mu, std::mt19937_64& rng) {
    softmax(cs);
    size_t keep = 0;
    while (keep < cs.c.size() && -std::log2(cs.c[keep].p) <= mu) keep++;
    keep_first(cs, std::max<size_t>(keep, 1));
    softmax(cs);
    const size_t i = draw_index(cs, rng);
    mu -= eta * (float)(-std::log2(cs.c[i].p) - tau);
    return cs.c[i].id;
}

} // namespace simpl

// What a sampler keeps besides its parameters: the token biases (logit_bias and ignore_eos), DRY's
// breakers, and the grammar with the vocabulary's pieces sorted for the masking walk.
struct Sampler::Chain {
    std::unordered_map<int32_t, float> bias;
    simpl::DryBreakers dry_breakers;
    std::shared_ptr<const Grammar::Rules> grammar;
    Grammar::State grammar_state;
    bool grammar_waiting = false;  // lazy grammar not triggered yet: nothing is constrained
    std::string trigger_tail;      // text kept while waiting: enough to see a trigger word
    size_t trigger_prompt_chars = 0;  // how much of trigger_tail is the prompt's (its words are not triggers)
    std::vector<std::string> pieces;  // token_to_piece(id, true)
    std::vector<int32_t> by_piece;    // non-empty, non-EOG pieces' tokens, sorted by piece
    simpl::Candidates cands;
};

Sampler::Sampler(const SamplerParams& p, const Vocab* vocab) : p_(p), vocab_(vocab), chain_(std::make_unique<Chain>()) {
    const bool needs_vocab = !p_.grammar.empty() || p_.ignore_eos || (p_.dry_multiplier != 0.0f && !p_.dry_sequence_breakers.empty());
    if (needs_vocab && !vocab_) throw Error("sampler: grammar, ignore_eos and DRY need the model's vocabulary");
    for (auto [id, b] : p_.logit_bias) chain_->bias[id] += b;
    if (p_.ignore_eos) for (int32_t id : vocab_->eog_ids()) chain_->bias[id] = -INFINITY;
    if (p_.dry_multiplier != 0.0f && vocab_) chain_->dry_breakers = simpl::dry_breakers(*vocab_, p_.dry_sequence_breakers);
    if (!p_.grammar.empty()) {
        chain_->grammar = Grammar(p_.grammar).rules();
        for (int32_t id = 0; id < vocab_->n_tokens(); id++) {
            chain_->pieces.push_back(vocab_->token_to_piece(id, true));
            if (!chain_->pieces.back().empty() && !vocab_->is_eog(id)) chain_->by_piece.push_back(id);
        }
        std::sort(chain_->by_piece.begin(), chain_->by_piece.end(),
                  [&](int32_t a, int32_t b) { return chain_->pieces[a] < chain_->pieces[b]; });
    }
    reset();
}

Sampler::~Sampler() = default;
Sampler::Sampler(Sampler&&) noexcept = default;
Sampler& Sampler::operator=(Sampler&&) noexcept = default;

void Sampler::reset() {
    history_.clear();
    rng_.seed(p_.seed == 0xFFFFFFFF ? std::random_device{}() : p_.seed);
    mirostat_mu_ = 2 * p_.mirostat_tau;
    if (chain_->grammar) chain_->grammar_state = simpl::grammar_initial_state(*chain_->grammar);
    chain_->grammar_waiting = chain_->grammar && p_.grammar_lazy;
    chain_->trigger_tail.clear();
    chain_->trigger_prompt_chars = 0;
}

// The first occurrence at or after `from` of any trigger word that ends past the prompt's text in the
// tail (npos when none).
static size_t next_trigger(const Sampler::Chain& ch, const std::vector<std::string>& triggers, size_t from) {
    size_t at = std::string::npos;
    for (const std::string& w : triggers) {
        if (w.empty()) continue;
        const size_t past_prompt = ch.trigger_prompt_chars >= w.size() ? ch.trigger_prompt_chars - w.size() + 1 : 0;
        at = std::min(at, ch.trigger_tail.find(w, std::max(from, past_prompt)));
    }
    return at;
}

// A lazy grammar's wait: the piece joins the tail of the text (the prompt's pieces too, so that a word
// the prompt began, as Functionary's ">>>" or GPT-OSS's "<|start|>assistant", triggers when the model
// completes it). At the first trigger word in generated text the grammar starts there and takes the
// rest of the tail; an occurrence whose rest does not fit (the word written in passing) gives way to
// the next one, in the same piece too, so the grammar starts at the token that completes its word.
static void watch_triggers(Sampler::Chain& ch, const std::vector<std::string>& triggers, const std::string& piece, bool generated) {
    ch.trigger_tail += piece;
    if (!generated) ch.trigger_prompt_chars = ch.trigger_tail.size();
    for (size_t at = generated ? next_trigger(ch, triggers, 0) : std::string::npos; at != std::string::npos;
         at = next_trigger(ch, triggers, at + 1)) {
        Grammar::State st = simpl::grammar_initial_state(*ch.grammar);
        if (simpl::feed_text(*ch.grammar, st, ch.trigger_tail.substr(at))) {
            ch.grammar_state = std::move(st);
            ch.grammar_waiting = false;
            ch.trigger_tail.clear();
            ch.trigger_prompt_chars = 0;
            return;
        }
    }
    // only a suffix that may still begin a trigger word matters
    size_t longest = 0;
    for (const std::string& w : triggers) longest = std::max(longest, w.size());
    if (longest > 0 && ch.trigger_tail.size() >= longest) {
        const size_t cut = ch.trigger_tail.size() - (longest - 1);
        ch.trigger_tail.erase(0, cut);
        ch.trigger_prompt_chars -= std::min(cut, ch.trigger_prompt_chars);
    }
}

void Sampler::truncate_history(size_t n) {
    if (n < history_.size()) history_.resize(n);
}

Sampler::Snapshot Sampler::snapshot() const {
    Snapshot s;
    s.history = history_;
    s.mirostat_mu = mirostat_mu_;
    s.rng = rng_;
    if (chain_->grammar) s.grammar = std::make_shared<const Grammar::State>(chain_->grammar_state);
    s.grammar_waiting = chain_->grammar_waiting;
    s.trigger_tail = chain_->trigger_tail;
    s.trigger_prompt_chars = chain_->trigger_prompt_chars;
    return s;
}

void Sampler::restore(const Snapshot& s) {
    if (!chain_->grammar != !s.grammar) fail("sampler: the snapshot is of a sampler %s a grammar", s.grammar ? "with" : "without");
    history_ = s.history;
    mirostat_mu_ = s.mirostat_mu;
    rng_ = s.rng;
    if (s.grammar) chain_->grammar_state = *s.grammar;
    chain_->grammar_waiting = s.grammar_waiting;
    chain_->trigger_tail = s.trigger_tail;
    chain_->trigger_prompt_chars = s.trigger_prompt_chars;
}

bool Sampler::grammar_accepts_eog() const {
    if (!chain_->grammar || chain_->grammar_waiting) return true;
    for (const auto& s : chain_->grammar_state.stacks) if (s.empty()) return true;
    return false;
}

void Sampler::accept(int32_t token, bool accept_grammar) {
    history_.push_back(token);
    if (!chain_->grammar || (accept_grammar && vocab_->is_eog(token))) return;
    if (chain_->grammar_waiting) {
        if (token >= 0 && (size_t)token < chain_->pieces.size()) watch_triggers(*chain_, p_.grammar_triggers, chain_->pieces[token], accept_grammar);
        return;
    }
    if (!accept_grammar) return;
    if (token < 0 || (size_t)token >= chain_->pieces.size() ||
        !simpl::feed_text(*chain_->grammar, chain_->grammar_state, chain_->pieces[token]))
        throw Error("grammar: token " + std::to_string(token) + " does not continue the grammar");
}

// Whether the grammar lets token come next.
static bool grammar_allows(const Sampler::Chain& ch, const Vocab& vocab, int32_t token, bool eog_ok) {
    if (vocab.is_eog(token)) return eog_ok;
    if (token < 0 || (size_t)token >= ch.pieces.size() || ch.pieces[token].empty()) return false;
    Grammar::State st = ch.grammar_state;
    return simpl::feed_text(*ch.grammar, st, ch.pieces[token]);
}

int32_t Sampler::sample(const float* logits, int n_vocab) {
    Chain& ch = *chain_;
    simpl::Candidates& cs = ch.cands;
    // The logits with the biases, -inf (banned) tokens left out.
    auto load = [&](const std::vector<uint8_t>* allowed) {
        cs.c.resize(n_vocab);
        for (int i = 0; i < n_vocab; i++) cs.c[i] = {i, logits[i], 0.0f};
        cs.sorted = false;
        cs.by_id = true;
        simpl::for_listed(cs, ch.bias, [](simpl::Candidate& x, float b) { x.logit += b; });
        cs.sorted = false;
        auto banned = [&](const simpl::Candidate& x) { return x.logit == -INFINITY || (allowed && !(*allowed)[x.id]); };
        if (std::any_of(cs.c.begin(), cs.c.end(), banned)) {
            cs.c.erase(std::remove_if(cs.c.begin(), cs.c.end(), banned), cs.c.end());
            cs.by_id = false;
        }
        if (cs.c.empty()) throw Error("sampling: no token is allowed (logit_bias, ignore_eos or the grammar exclude all)");
    };
    auto run = [&]() -> int32_t {
        using simpl::Candidates;
        if (p_.mirostat == 1 || p_.mirostat == 2) {
            simpl::apply_temperature(cs, p_.temperature);
            return p_.mirostat == 1 ? simpl::mirostat_v1(cs, p_.mirostat_tau, p_.mirostat_eta, mirostat_mu_, n_vocab, rng_)
                                    : simpl::mirostat_v2(cs, p_.mirostat_tau, p_.mirostat_eta, mirostat_mu_, rng_);
        }
        const size_t min_keep = (size_t)std::max(0, p_.min_keep);
        for (SamplerStage stage : p_.samplers) {
            switch (stage) {
                case SamplerStage::Penalties: simpl::apply_penalties(cs, p_, history_); break;
                case SamplerStage::Dry: simpl::apply_dry(cs, p_, history_, ch.dry_breakers); break;
                case SamplerStage::TopNSigma: simpl::apply_top_n_sigma(cs, p_.top_n_sigma); break;
                case SamplerStage::TopK: simpl::apply_top_k(cs, p_.top_k); break;
                case SamplerStage::TypicalP: simpl::apply_typical(cs, p_.typical_p, min_keep); break;
                case SamplerStage::TopP: simpl::apply_top_p(cs, p_.top_p, min_keep); break;
                case SamplerStage::MinP: simpl::apply_min_p(cs, p_.min_p, min_keep); break;
                case SamplerStage::Xtc: simpl::apply_xtc(cs, p_.xtc_probability, p_.xtc_threshold, min_keep, rng_); break;
                case SamplerStage::Temperature: simpl::apply_dynatemp(cs, p_.temperature, p_.dynatemp_range, p_.dynatemp_exponent); break;
            }
        }
        simpl::softmax(cs);
        return cs.c[simpl::draw_index(cs, rng_)].id;
    };
    load(nullptr);
    const int32_t token = run();
    if (!ch.grammar || ch.grammar_waiting) return token;
    const bool eog_ok = grammar_accepts_eog();
    if (grammar_allows(ch, *vocab_, token, eog_ok)) return token;
    // Rejected: mask the whole vocabulary by the grammar and run the chain again.
    std::vector<uint8_t> allowed(std::max((size_t)n_vocab, ch.pieces.size()), 0);
    simpl::mask_walk(*ch.grammar, ch.pieces, ch.by_piece, 0, ch.by_piece.size(), 0, ch.grammar_state.stacks,
                     ch.grammar_state.partial, allowed);
    if (eog_ok) for (int32_t id : vocab_->eog_ids()) if (id < n_vocab) allowed[id] = 1;
    load(&allowed);
    return run();
}

// ---- JSON schema to grammar ----------------------------------------------------------------
namespace simpl {

// A parsed JSON value, objects in document order (the grammar keeps the schema's property order).
struct JsonValue {
    enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
    bool boolean = false;
    bool integral = false;  // a Number written without fraction or exponent
    std::string text;       // a string's value, or a number's literal as written
    std::vector<JsonValue> items;
    std::vector<std::pair<std::string, JsonValue>> members;
    const JsonValue* get(const std::string& key) const {
        for (const auto& [k, v] : members) if (k == key) return &v;
        return nullptr;
    }
};

// JSON text as JsonValues (chat_detail::JsonReader's builder), number literals kept.
struct JsonValueBuilder {
    using Node = JsonValue;
    static JsonValue of_kind(JsonValue::Kind kind) {
        JsonValue v;
        v.kind = kind;
        return v;
    }
    JsonValue null() { return JsonValue(); }
    JsonValue boolean(bool b) {
        JsonValue v = of_kind(JsonValue::Bool);
        v.boolean = b;
        return v;
    }
    JsonValue string(std::string s) {
        JsonValue v = of_kind(JsonValue::String);
        v.text = std::move(s);
        return v;
    }
    JsonValue number(const std::string& literal, bool integral) {
        JsonValue v = of_kind(JsonValue::Number);
        v.text = literal;
        v.integral = integral;
        return v;
    }
    JsonValue array(std::vector<JsonValue> items) {
        JsonValue v = of_kind(JsonValue::Array);
        v.items = std::move(items);
        return v;
    }
    JsonValue object(std::vector<std::pair<std::string, JsonValue>> members) {
        JsonValue v = of_kind(JsonValue::Object);
        v.members = std::move(members);
        return v;
    }
};

using chat_detail::json_quote;

// Compact JSON text of a value (what a const or enum member must be generated as).
std::string json_dump(const JsonValue& v) {
    switch (v.kind) {
        case JsonValue::Null: return "null";
        case JsonValue::Bool: return v.boolean ? "true" : "false";
        case JsonValue::Number: return v.text;
        case JsonValue::String: return json_quote(v.text);
        case JsonValue::Array: {
            std::string out = "[";
            for (size_t i = 0; i < v.items.size(); i++) out += (i ? "," : "") + json_dump(v.items[i]);
            return out + "]";
        }
        case JsonValue::Object: {
            std::string out = "{";
            for (size_t i = 0; i < v.members.size(); i++)
                out += (i ? "," : "") + json_quote(v.members[i].first) + ":" + json_dump(v.members[i].second);
            return out + "}";
        }
    }
    return "null";
}

// A GBNF literal matching exactly text.
std::string gbnf_literal(const std::string& text) {
    std::string out = "\"";
    for (char c : text) {
        if (c == '"' || c == '\\') { out += '\\'; out += c; }
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else out += c;
    }
    return out + "\"";
}

// ---- integer ranges: minimum/maximum as digit rules (llama.cpp's _generate_min_max_int) ----

// Integers between two bounds; an absent bound is open. Bounds are within +-kIntegerBoundLimit.
struct IntegerRange {
    bool has_min = false, has_max = false;
    int64_t min = 0, max = 0;
};
constexpr int64_t kIntegerBoundLimit = 1000000000000000000;  // 10^18: negation and +-1 cannot overflow
constexpr size_t kIntegerMaxDigits = 16;                    // of an open range, as integral-part

// The decimal strings between lo and hi (equal lengths, lo <= hi) as a GBNF sequence: the common
// prefix, then the first differing digit's low end, middle digits and high end.
std::string same_length_digits(const std::string& lo, const std::string& hi) {
    size_t k = 0;
    while (k < lo.size() && lo[k] == hi[k]) k++;
    const std::string prefix = k ? "\"" + lo.substr(0, k) + "\"" : "";
    if (k == lo.size()) return prefix;
    const size_t rest = lo.size() - k - 1;
    auto digits = [](char a, char b) { return a == b ? std::string("[") + a + "]" : std::string("[") + a + "-" + b + "]"; };
    auto any_digits = [&](size_t n) { return n == 0 ? std::string() : n == 1 ? std::string(" [0-9]") : " [0-9]{" + std::to_string(n) + "}"; };
    const std::string lo_rest = lo.substr(k + 1), hi_rest = hi.substr(k + 1);
    const bool lo_full = lo_rest == std::string(rest, '0'), hi_full = hi_rest == std::string(rest, '9');
    const char mid_lo = lo_full ? lo[k] : (char)(lo[k] + 1), mid_hi = hi_full ? hi[k] : (char)(hi[k] - 1);
    std::vector<std::string> alts;
    if (!lo_full) alts.push_back(digits(lo[k], lo[k]) + " (" + same_length_digits(lo_rest, std::string(rest, '9')) + ")");
    if (mid_lo <= mid_hi) alts.push_back(digits(mid_lo, mid_hi) + any_digits(rest));
    if (!hi_full) alts.push_back(digits(hi[k], hi[k]) + " (" + same_length_digits(std::string(rest, '0'), hi_rest) + ")");
    std::string body;
    for (size_t i = 0; i < alts.size(); i++) body += (i ? " | " : "") + alts[i];
    return prefix.empty() ? body : prefix + " (" + body + ")";
}

// The non-negative integers from lo on (to hi when bounded), without leading zeros: one
// same-length range per digit count; an open range stops at kIntegerMaxDigits digits (or lo's).
std::string natural_range(int64_t lo, bool has_hi, int64_t hi) {
    const std::string lo_s = std::to_string(lo);
    const size_t last_len = has_hi ? std::to_string(hi).size() : std::max(lo_s.size(), kIntegerMaxDigits);
    std::string body;
    for (size_t len = lo_s.size(); len <= last_len; len++) {
        const std::string from = len == lo_s.size() ? lo_s : "1" + std::string(len - 1, '0');
        const std::string to = has_hi && len == last_len ? std::to_string(hi) : std::string(len, '9');
        if (!has_hi && len > lo_s.size()) {  // every longer length at once
            body += " | [1-9] [0-9]{" + std::to_string(len - 1) + "," + std::to_string(last_len - 1) + "}";
            break;
        }
        body += (body.empty() ? "(" : " | (") + same_length_digits(from, to) + ")";
    }
    return body;
}

// The integers of r as a GBNF alternation: "-" and the negated negative part, then the rest.
std::string integer_range_rule(const IntegerRange& r) {
    std::vector<std::string> alts;
    if (!r.has_min || r.min < 0) {
        const int64_t neg_lo = r.has_max && r.max < 0 ? -r.max : 1;  // magnitudes of the negative part
        alts.push_back("\"-\" (" + natural_range(neg_lo, r.has_min, r.has_min ? -r.min : 0) + ")");
    }
    if (!r.has_max || r.max >= 0) alts.push_back(natural_range(r.has_min ? std::max<int64_t>(r.min, 0) : 0, r.has_max, r.max));
    std::string body;
    for (size_t i = 0; i < alts.size(); i++) body += (i ? " | " : "") + alts[i];
    return body;
}

// ---- code point sets (regex classes) ---------------------------------------------------------

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Sorted, disjoint, non-adjacent inclusive ranges of code points.
using CodeSet = std::vector<std::pair<uint32_t, uint32_t>>;

CodeSet normalized(CodeSet s) {
    std::sort(s.begin(), s.end());
    CodeSet out;
    for (const auto& r : s) {
        if (!out.empty() && r.first <= out.back().second + 1) out.back().second = std::max(out.back().second, r.second);
        else out.push_back(r);
    }
    return out;
}

CodeSet complement(const CodeSet& s) {
    CodeSet out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : s) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    return out;
}

CodeSet intersection(const CodeSet& a, const CodeSet& b) {
    CodeSet out;
    for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
        const uint32_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
        if (lo <= hi) out.emplace_back(lo, hi);
        (a[i].second < b[j].second ? i : j)++;
    }
    return out;
}

bool contains(const CodeSet& s, uint32_t cp) {
    for (const auto& [lo, hi] : s) if (cp >= lo && cp <= hi) return true;
    return false;
}

// ECMAScript's \d, \w and \s (the dialect JSON Schema patterns are written in).
CodeSet class_escape_set(char e) {
    CodeSet s;
    switch (std::tolower((unsigned char)e)) {
        case 'd': s = {{'0', '9'}}; break;
        case 'w': s = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; break;
        default:
            s = normalized({{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                            {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
    }
    return std::isupper((unsigned char)e) ? complement(s) : s;
}

// A code point inside a GBNF class: plain when alphanumeric ASCII, else an escape.
std::string gbnf_class_char(uint32_t cp) {
    if (cp < 0x80 && std::isalnum((int)cp)) return std::string(1, (char)cp);
    char buf[16];
    if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
    else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
    else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
    return buf;
}

// The JSON text (inside a string) that stands for one code point: itself, or its escape.
std::string json_text_of(uint32_t cp) {
    std::string ch;
    tokenizer_impl::utf8_append(ch, cp);
    const std::string quoted = json_quote(ch);
    return quoted.substr(1, quoted.size() - 2);
}

// GBNF for the JSON text of one character of s. Characters written raw form a class; '"', '\\' and
// the named control escapes (\b \f \n \r \t) are written escaped; other control characters, which
// JSON writes as \u00XX, are left out. Empty when nothing remains.
std::string json_char_of_set(const CodeSet& s) {
    static const CodeSet raw_ok = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}};
    std::vector<std::string> alts;
    const CodeSet raw = intersection(s, raw_ok);
    if (!raw.empty()) {
        std::string cls = "[";
        for (const auto& [lo, hi] : raw) cls += gbnf_class_char(lo) + (lo == hi ? "" : "-" + gbnf_class_char(hi));
        alts.push_back(cls + "]");
    }
    std::string escapes;
    for (auto [cp, letter] : {std::pair<uint32_t, const char*>{'"', "\\\""}, {'\\', "\\\\"}, {'\b', "b"}, {'\f', "f"},
                              {'\n', "n"}, {'\r', "r"}, {'\t', "t"}})
        if (contains(s, cp)) escapes += letter;
    if (!escapes.empty()) alts.push_back("\"\\\\\" [" + escapes + "]");
    if (alts.size() == 1) return alts[0];
    return alts.empty() ? "" : "(" + alts[0] + " | " + alts[1] + ")";
}

// ---- regex patterns ------------------------------------------------------------------------------

// A JSON Schema "pattern" (ECMAScript regex) as the GBNF of a JSON string's contents whose decoded
// text it matches, as llama.cpp's _visit_pattern: literals, ., classes and escapes (\d \w \s and
// their negations), groups ((?:...) and named ones too), alternation, the quantifiers * + ? {m}
// {m,} {m,n} (lazy ones alike). Unanchored ends match anything (a search, as validators do); ^ and
// $ may only begin and end a top-level alternative. Lookarounds, backreferences and word
// boundaries are errors. `any_char` names the rule of one JSON string character.
class PatternConverter {
public:
    PatternConverter(const std::string& pattern, const std::string& any_char) : any_char_(any_char) {
        for (size_t off = 0; off < pattern.size();) cps_.push_back(tokenizer_impl::utf8_decode(pattern, off));
        if (cps_.size() > kMaxPatternChars) fail("longer than " + std::to_string(kMaxPatternChars) + " characters");
    }

    std::string convert() {
        std::string body;
        do {
            const bool from_start = take('^');
            std::string alt = sequence(0);
            const bool to_end = take('$');
            if (!at_end() && !at('|')) fail(at(')') ? "unbalanced ')'" : "'$' before the end of an alternative");
            alt = (from_start ? "" : any_char_ + "* ") + alt + (to_end ? "" : " " + any_char_ + "*");
            body += (body.empty() ? "" : " | ") + alt;
        } while (take('|'));
        return body;
    }

private:
    static constexpr size_t kMaxPatternChars = 4096;
    static constexpr int kMaxGroupNesting = 64;
    std::vector<uint32_t> cps_;
    size_t pos_ = 0;
    std::string any_char_;

    [[noreturn]] void fail(const std::string& what) const {
        throw Error("json_schema: pattern: " + what + " (at character " + std::to_string(pos_) + ")");
    }
    bool at_end() const { return pos_ >= cps_.size(); }
    bool at(uint32_t c) const { return pos_ < cps_.size() && cps_[pos_] == c; }
    bool take(uint32_t c) {
        if (!at(c)) return false;
        pos_++;
        return true;
    }
    uint32_t next() {
        if (at_end()) fail("unexpected end");
        return cps_[pos_++];
    }

    // Alternatives inside a group, up to its ')'.
    std::string alternatives(int depth) {
        if (depth > kMaxGroupNesting) fail("groups nested deeper than " + std::to_string(kMaxGroupNesting));
        std::string body = sequence(depth);
        while (take('|')) body += " | " + sequence(depth);
        return body;
    }

    // Atoms with their quantifiers up to '|', ')' or the end; neighbouring plain characters merge
    // into one literal.
    std::string sequence(int depth) {
        std::vector<std::string> terms;
        std::string literal;  // JSON text of the pending plain characters
        auto flush = [&] {
            if (!literal.empty()) terms.push_back(gbnf_literal(literal));
            literal.clear();
        };
        while (!at_end() && !at('|') && !at(')')) {
            if (at('$') && depth == 0 && (pos_ + 1 == cps_.size() || cps_[pos_ + 1] == '|')) break;
            if (at('^') || at('$')) fail("'^' and '$' are only supported at the ends of the pattern");
            uint32_t plain = 0;
            std::string atom_rule = atom(depth, plain);
            const std::string quantifier = take_quantifier();
            if (plain && quantifier.empty()) {
                literal += json_text_of(plain);
                continue;
            }
            flush();
            if (plain) atom_rule = gbnf_literal(json_text_of(plain));
            if (atom_rule.empty()) fail("a character class that matches only control characters");
            terms.push_back(atom_rule + quantifier);
        }
        flush();
        std::string out;
        for (size_t i = 0; i < terms.size(); i++) out += (i ? " " : "") + terms[i];
        return out.empty() ? "\"\"" : out;
    }

    // One atom as a single GBNF term; plain is set to the character when it is a plain one.
    std::string atom(int depth, uint32_t& plain) {
        const uint32_t c = next();
        switch (c) {
            case '(': {
                if (take('?')) {
                    if (take('<') && !at('=') && !at('!')) {
                        while (!at_end() && !at('>')) pos_++;  // a named group is a plain group
                        if (!take('>')) fail("unterminated group name");
                    } else if (!take(':')) fail("lookaround assertions are not supported");
                }
                std::string body = alternatives(depth + 1);
                if (!take(')')) fail("unbalanced '('");
                return "(" + body + ")";
            }
            case '[': return json_char_of_set(bracket_class());
            case '.': return json_char_of_set(complement({{'\n', '\n'}, {'\r', '\r'}}));
            case '\\': return escape_atom(plain);
            case '*': case '+': case '?': fail("nothing to repeat");
            case '{': if (quantifier_ahead(pos_ - 1)) fail("nothing to repeat"); break;
            case ')': fail("unbalanced ')'");
            default: break;
        }
        if (c < 0x20) return json_char_of_set({{c, c}});
        plain = c;
        return "";
    }

    // The character of an escape that stands for one, or 0x110000 when e is a class escape.
    uint32_t escaped_char(uint32_t e) {
        auto hex = [&](int n) {
            uint32_t v = 0;
            for (int i = 0; i < n; i++) {
                const uint32_t h = next();
                const int d = h < 0x80 ? hex_digit((char)h) : -1;
                if (d < 0) fail("expected " + std::to_string(n) + " hex digits");
                v = v * 16 + d;
            }
            return v;
        };
        switch (e) {
            case 'n': return '\n';
            case 'r': return '\r';
            case 't': return '\t';
            case 'f': return '\f';
            case 'v': return '\v';
            case '0': return 0;
            case 'x': return hex(2);
            case 'u': return hex(4);
            case 'd': case 'D': case 'w': case 'W': case 's': case 'S': return kMaxCodePoint + 1;
            default: break;
        }
        if (e >= '1' && e <= '9') fail("backreferences are not supported");
        if (e == 'b' || e == 'B') fail("word boundaries are not supported");
        if (e < 0x80 && std::isalnum((int)e)) fail(std::string("unsupported escape '\\") + (char)e + "'");
        return e;  // an escaped punctuation character stands for itself
    }

    std::string escape_atom(uint32_t& plain) {
        const uint32_t e = next();
        const uint32_t c = escaped_char(e);
        if (c > kMaxCodePoint) return json_char_of_set(class_escape_set((char)e));
        if (c < 0x20) return json_char_of_set({{c, c}});
        plain = c;
        return "";
    }

    // [...] after its '[': ranges, escapes and class escapes; [^...] negates.
    CodeSet bracket_class() {
        const bool negated = take('^');
        CodeSet set;
        while (!take(']')) {
            CodeSet item = class_member();
            if (at('-') && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != ']') {
                pos_++;
                CodeSet hi = class_member();
                if (item.size() != 1 || hi.size() != 1 || item[0].first != item[0].second || hi[0].first != hi[0].second)
                    fail("a class escape cannot bound a range");
                if (hi[0].first < item[0].first) fail("range out of order in character class");
                item = {{item[0].first, hi[0].first}};
            }
            set.insert(set.end(), item.begin(), item.end());
        }
        set = normalized(set);
        return negated ? complement(set) : set;
    }

    CodeSet class_member() {
        const uint32_t c = next();
        if (c != '\\') return {{c, c}};
        const uint32_t e = next();
        if (e == 'b') return {{'\b', '\b'}};
        const uint32_t x = escaped_char(e);
        return x > kMaxCodePoint ? class_escape_set((char)e) : CodeSet{{x, x}};
    }

    // Whether a {m}, {m,} or {m,n} quantifier starts at i (otherwise '{' is a plain character).
    bool quantifier_ahead(size_t i) const {
        size_t j = i + 1, digits = 0;
        while (j < cps_.size() && cps_[j] >= '0' && cps_[j] <= '9') { j++; digits++; }
        if (digits == 0) return false;
        if (j < cps_.size() && cps_[j] == ',') {
            j++;
            while (j < cps_.size() && cps_[j] >= '0' && cps_[j] <= '9') j++;
        }
        return j < cps_.size() && cps_[j] == '}';
    }

    uint32_t read_count() {
        uint64_t v = 0;
        while (at_end() == false && cps_[pos_] >= '0' && cps_[pos_] <= '9') {
            v = v * 10 + (cps_[pos_++] - '0');
            if (v > kGrammarMaxRepeat) fail("repetition count above " + std::to_string(kGrammarMaxRepeat));
        }
        return (uint32_t)v;
    }

    // A quantifier after an atom, as GBNF ("" when none); a lazy one's '?' changes nothing here.
    std::string take_quantifier() {
        std::string q;
        if (take('*')) q = "*";
        else if (take('+')) q = "+";
        else if (take('?')) q = "?";
        else if (at('{') && quantifier_ahead(pos_)) {
            pos_++;
            const uint32_t min = read_count();
            std::string max = std::to_string(min);
            if (take(',')) max = at('}') ? "" : std::to_string(read_count());
            pos_++;  // '}'
            if (!max.empty() && std::stoul(max) < min) fail("numbers out of order in {} quantifier");
            q = "{" + std::to_string(min) + (max == std::to_string(min) ? "" : "," + max) + "}";
        }
        if (q.empty()) return q;
        take('?');
        if (at('*') || at('+') || at('?') || (at('{') && quantifier_ahead(pos_))) fail("nothing to repeat");
        return q;
    }
};

// ---- property names outside a set (additionalProperties next to declared ones) ----------------

// The JSON string of a key that is none of names (llama.cpp's _not_strings): a trie of the names,
// each node allowing the string to end (unless a name ends there), to continue with a character
// that leaves the trie, or to follow a child. `any_char` names the rule of one string character.
class KeyExclusion {
public:
    KeyExclusion(const std::vector<std::string>& names, const std::string& any_char) : any_char_(any_char) {
        nodes_.emplace_back();
        for (const std::string& name : names) {
            size_t n = 0, length = 0;
            for (size_t off = 0; off < name.size(); length++) {
                if (length == kMaxNameChars)  // rest() recurses once per character
                    throw Error("json_schema: property names next to additionalProperties are limited to " +
                                std::to_string(kMaxNameChars) + " characters");
                const uint32_t cp = tokenizer_impl::utf8_decode(name, off);
                const auto it = nodes_[n].children.find(cp);
                if (it != nodes_[n].children.end()) {
                    n = it->second;
                    continue;
                }
                const size_t child = nodes_.size();
                nodes_[n].children.emplace(cp, child);
                nodes_.emplace_back();
                n = child;
            }
            nodes_[n].is_name = true;
        }
    }
    std::string rule() const { return "\"\\\"\" " + rest(0) + " \"\\\"\" space"; }

private:
    static constexpr size_t kMaxNameChars = 1024;
    struct Node {
        std::map<uint32_t, size_t> children;
        bool is_name = false;
    };
    std::vector<Node> nodes_;
    std::string any_char_;

    std::string rest(size_t n) const {
        const Node& node = nodes_[n];
        if (node.children.empty()) return any_char_ + "+";
        std::string alts;
        CodeSet taken;
        for (const auto& [cp, child] : node.children) {
            alts += (alts.empty() ? "" : " | ") + gbnf_literal(json_text_of(cp)) + " " + rest(child);
            taken.emplace_back(cp, cp);
        }
        const std::string other = json_char_of_set(complement(normalized(taken)));
        alts += " | " + other + " " + any_char_ + "*";
        return "(" + alts + ")" + (node.is_name ? "" : "?");
    }
};

// llama.cpp's primitive rules (common/json-schema-to-grammar.cpp): name, body, dependencies.
struct PrimitiveRule { const char* name; const char* body; const char* deps; };
constexpr PrimitiveRule kJsonPrimitives[] = {
    {"space", "| \" \" | \"\\n\"{1,2} [ \\t]{0,20}", ""},
    {"boolean", "(\"true\" | \"false\") space", ""},
    {"decimal-part", "[0-9]{1,16}", ""},
    {"integral-part", "[0] | [1-9] [0-9]{0,15}", ""},
    {"number", "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space", "integral-part decimal-part"},
    {"integer", "(\"-\"? integral-part) space", "integral-part"},
    {"value", "object | array | string | number | boolean | null", "object array string number boolean null"},
    {"object", "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space", "string value"},
    {"array", "\"[\" space ( value (\",\" space value)* )? \"]\" space", "value"},
    {"uuid", "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12} \"\\\"\" space", ""},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})", ""},
    {"string", "\"\\\"\" char* \"\\\"\" space", "char"},
    {"null", "\"null\" space", ""},
    {"date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )", ""},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{3} )? ( \"Z\" | ( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )", ""},
    {"date-time", "date \"T\" time", "date time"},
    {"date-string", "\"\\\"\" date \"\\\"\" space", "date"},
    {"time-string", "\"\\\"\" time \"\\\"\" space", "time"},
    {"date-time-string", "\"\\\"\" date-time \"\\\"\" space", "date-time"},
};

// Converts a schema to rules the way llama.cpp's SchemaConverter does, for the common subset.
class SchemaConverter {
public:
    explicit SchemaConverter(const JsonValue& root) : root_(root) {}

    std::string convert() {
        primitive("space");  // literals, enums and objects all end with it
        visit(root_, "", 0);
        std::string out;
        for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
        return out;
    }

private:
    [[noreturn]] static void fail(const std::string& what) { throw Error("json_schema: " + what); }

    static bool primitive_name(const std::string& name) {
        for (const PrimitiveRule& r : kJsonPrimitives) if (name == r.name) return true;
        return false;
    }
    // A rule name from a schema path: each run of other characters becomes '-', and primitives'
    // names are kept free.
    static std::string rule_key(const std::string& name) {
        std::string key;
        for (size_t i = 0; i < name.size(); i++) {
            const bool word = std::isalnum((unsigned char)name[i]) || name[i] == '-';
            if (word) key += name[i];
            else if (i == 0 || std::isalnum((unsigned char)name[i - 1]) || name[i - 1] == '-') key += '-';
        }
        if (key.empty()) return "root";
        return primitive_name(key) ? key + "-rule" : key;
    }

    // Adds a rule under a unique name (an identical rule already there is reused).
    std::string add_rule(const std::string& name, const std::string& body, bool is_primitive = false) {
        const std::string key = is_primitive ? name : rule_key(name);
        std::string unique = key;
        for (int i = 0;; i++) {
            auto it = index_.find(unique);
            if (it == index_.end()) break;
            if (rules_[it->second].second == body) return unique;
            unique = key + std::to_string(i);
        }
        if (rules_.size() >= 5000) fail("the schema makes too many rules");
        index_[unique] = rules_.size();
        rules_.emplace_back(unique, body);
        return unique;
    }

    std::string primitive(const std::string& name) {
        for (const PrimitiveRule& r : kJsonPrimitives) {
            if (name != r.name) continue;
            if (!index_.count(name)) {
                add_rule(name, r.body, true);  // first: "value" and "object" refer to each other
                std::string deps = r.deps;
                for (size_t b = 0; b < deps.size();) {
                    size_t e = deps.find(' ', b);
                    if (e == std::string::npos) e = deps.size();
                    primitive(deps.substr(b, e - b));
                    b = e + 1;
                }
            }
            return name;
        }
        fail("internal: no primitive rule '" + name + "'");
    }

    static int64_t get_int(const JsonValue& s, const char* key, int64_t def) {
        const JsonValue* v = s.get(key);
        if (!v) return def;
        if (v->kind != JsonValue::Number) fail(std::string("'") + key + "' must be a number");
        double d = std::strtod(v->text.c_str(), nullptr);
        if (d < 0 || d > 1e6) fail(std::string("'") + key + "' is out of range");
        return (int64_t)d;
    }

    // item{min,max}, items separated by sep when given (llama.cpp's build_repetition).
    static std::string repetition(const std::string& item, int64_t min, int64_t max, const std::string& sep) {
        if (max == 0) return "";
        if (!sep.empty()) {
            std::string result = item + " " + repetition("(" + sep + " " + item + ")", min == 0 ? 0 : min - 1, max < 0 ? max : max - 1, "");
            return min == 0 ? "(" + result + ")?" : result;
        }
        if (min == 0 && max == 1) return item + "?";
        if (max < 0) return item + (min == 0 ? "*" : min == 1 ? "+" : "{" + std::to_string(min) + ",}");
        if (min == max) return item + "{" + std::to_string(min) + "}";
        return item + "{" + std::to_string(min) + "," + std::to_string(max) + "}";
    }

    std::string sub_name(const std::string& name, const std::string& part) { return name.empty() ? part : name + "-" + part; }

    // A $ref's rule, named from its fragment as llama.cpp does ("#/$defs/node" -> ref-defs-node),
    // visited once; a reference met while its target is being visited (recursion) names the rule.
    // The name is held by a placeholder while the target is visited (so no other rule takes it) and
    // then made an alias of the target's rule.
    std::string resolve_ref(const std::string& ref, int depth) {
        if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return it->second;
        const JsonValue* target = lookup_ref(ref);
        const std::string name = add_rule("ref" + ref.substr(1), std::string(1, '\0') + ref);  // no rule's body
        ref_rules_[ref] = name;
        const std::string rule = visit(*target, name, depth + 1);
        rules_[index_[name]].second = rule;
        return name;
    }

    // A local reference: a JSON pointer into the schema ("#", "#/$defs/a/properties/b", "~0" and
    // "~1" escapes, array indices); "#/$defs/NAME" also finds a $defs nested anywhere (llama.cpp
    // hoists those to the root).
    const JsonValue* lookup_ref(const std::string& ref) const {
        if (ref.empty() || ref[0] != '#') fail("only local $ref ('#...') are supported, not '" + ref + "'");
        const JsonValue* at = &root_;
        for (size_t b = 1; at && b < ref.size();) {
            if (ref[b] != '/') fail("bad $ref '" + ref + "'");
            size_t e = ref.find('/', b + 1);
            if (e == std::string::npos) e = ref.size();
            std::string token;
            for (size_t i = b + 1; i < e; i++) {
                if (ref[i] == '~' && i + 1 < e && (ref[i + 1] == '0' || ref[i + 1] == '1')) token += ref[++i] == '0' ? '~' : '/';
                else token += ref[i];
            }
            if (at->kind == JsonValue::Array) {
                char* end = nullptr;
                const unsigned long i = std::strtoul(token.c_str(), &end, 10);
                at = !token.empty() && *end == 0 && i < at->items.size() ? &at->items[i] : nullptr;
            } else {
                at = at->get(token);
            }
            b = e;
        }
        const std::string defs = "#/$defs/";
        if (!at && ref.compare(0, defs.size(), defs) == 0 && ref.find('/', defs.size()) == std::string::npos)
            at = nested_def(root_, ref.substr(defs.size()), 0);
        if (!at) fail("unresolved $ref '" + ref + "'");
        return at;
    }

    // The first definition `name` of a $defs anywhere in v (document order).
    static const JsonValue* nested_def(const JsonValue& v, const std::string& name, int depth) {
        if (depth > 64) return nullptr;
        if (const JsonValue* defs = v.kind == JsonValue::Object ? v.get("$defs") : nullptr)
            if (const JsonValue* d = defs->get(name)) return d;
        for (const JsonValue& x : v.items) if (const JsonValue* d = nested_def(x, name, depth + 1)) return d;
        for (const auto& m : v.members) if (const JsonValue* d = nested_def(m.second, name, depth + 1)) return d;
        return nullptr;
    }

    // The body of a string's rule: pattern, then a format (uuid, uuid1-5, date, time, date-time; others
    // are plain strings), then minLength/maxLength.
    std::string string_rule(const JsonValue& s) {
        if (const JsonValue* p = s.get("pattern")) {
            if (p->kind != JsonValue::String) fail("'pattern' must be a string");
            return "\"\\\"\" (" + PatternConverter(p->text, primitive("char")).convert() + ") \"\\\"\" space";
        }
        if (const JsonValue* f = s.get("format")) {
            const std::string& name = f->text;
            if (name == "date" || name == "time" || name == "date-time") return primitive(name + "-string");
            if (name == "uuid" || (name.size() == 5 && name.compare(0, 4, "uuid") == 0 && name[4] >= '1' && name[4] <= '5'))
                return primitive("uuid");
        }
        const int64_t min = get_int(s, "minLength", 0), max = get_int(s, "maxLength", -1);
        if (min == 0 && max < 0) return primitive("string");
        if (max >= 0 && max < min) fail("maxLength is below minLength");
        return "\"\\\"\" " + repetition(primitive("char"), min, max, "") + " \"\\\"\" space";
    }

    // The least (or greatest) integer a bound admits: x itself, or past it when exclusive.
    static int64_t integer_bound(const JsonValue& v, const char* key, bool lower, bool exclusive) {
        if (v.kind != JsonValue::Number) fail(std::string("'") + key + "' must be a number");
        const double d = std::strtod(v.text.c_str(), nullptr);
        if (!(std::fabs(d) <= (double)kIntegerBoundLimit)) fail(std::string("'") + key + "' is out of range");
        const int64_t floor_v = v.integral ? std::strtoll(v.text.c_str(), nullptr, 10) : (int64_t)std::floor(d);
        const int64_t ceil_v = v.integral ? floor_v : (int64_t)std::ceil(d);
        if (lower) return exclusive ? floor_v + 1 : ceil_v;
        return exclusive ? ceil_v - 1 : floor_v;
    }

    // minimum, maximum, exclusiveMinimum and exclusiveMaximum of an integer (the stricter one where
    // several bound a side; draft 4's boolean exclusiveMinimum/Maximum makes minimum/maximum strict).
    static IntegerRange integer_range(const JsonValue& s) {
        IntegerRange r;
        auto side = [&](const char* inclusive, const char* exclusive, bool lower, bool& has, int64_t& bound) {
            const JsonValue* ex = s.get(exclusive);
            const bool draft4 = ex && ex->kind == JsonValue::Bool;
            auto tighten = [&](int64_t b) {
                bound = !has ? b : lower ? std::max(bound, b) : std::min(bound, b);
                has = true;
            };
            if (const JsonValue* in = s.get(inclusive)) tighten(integer_bound(*in, inclusive, lower, draft4 && ex->boolean));
            if (ex && !draft4) tighten(integer_bound(*ex, exclusive, lower, true));
        };
        side("minimum", "exclusiveMinimum", true, r.has_min, r.min);
        side("maximum", "exclusiveMaximum", false, r.has_max, r.max);
        if (r.has_min && r.has_max && r.min > r.max) fail("no integer lies within minimum and maximum");
        return r;
    }

    // The body of an array's rule: a tuple (prefixItems, or an items array), optionally followed by
    // more items of an `items` schema; else items{minItems,maxItems}; items false: nothing more.
    std::string array_rule(const JsonValue& s, const std::string& name, int depth) {
        const JsonValue* items = s.get("items");
        const JsonValue* prefix = s.get("prefixItems");
        if (prefix && prefix->kind != JsonValue::Array) fail("'prefixItems' must be an array");
        if (!prefix && items && items->kind == JsonValue::Array) std::swap(prefix, items);
        const bool no_items = items && items->kind == JsonValue::Bool && !items->boolean;
        std::string body = "\"[\" space ";
        if (prefix) {
            for (size_t i = 0; i < prefix->items.size(); i++)
                body += (i ? " \",\" space " : "") + visit(prefix->items[i], sub_name(name, "tuple-" + std::to_string(i)), depth + 1);
            if (items && !no_items)
                body += " ( \",\" space " + visit(*items, sub_name(name, "additional-item"), depth + 1) + " )*";
            return body + " \"]\" space";
        }
        const int64_t min = get_int(s, "minItems", 0), max = no_items ? 0 : get_int(s, "maxItems", -1);
        if (max >= 0 && max < min) fail(no_items ? "'items' false admits no items but minItems is set" : "maxItems is below minItems");
        const std::string item = items && !no_items ? visit(*items, sub_name(name, "item"), depth + 1) : primitive("value");
        return body + repetition(item, min, max, "\",\" space") + " \"]\" space";
    }

    std::string object_rule(const JsonValue& s, const std::string& name, int depth) {
        std::set<std::string> required;
        if (const JsonValue* r = s.get("required")) {
            if (r->kind != JsonValue::Array) fail("'required' must be an array");
            for (const JsonValue& k : r->items) required.insert(k.text);
        }
        std::vector<std::pair<std::string, const JsonValue*>> props;
        collect_properties(s, props, required, depth);
        std::vector<std::string> req, opt, names;
        std::map<std::string, std::string> kv;
        for (const auto& [prop, schema] : props) {
            if (kv.count(prop)) continue;
            const std::string value = visit(*schema, sub_name(name, prop), depth + 1);
            kv[prop] = add_rule(sub_name(name, prop) + "-kv", gbnf_literal(json_quote(prop)) + " space \":\" space " + value);
            (required.count(prop) ? req : opt).push_back(prop);
            names.push_back(prop);
        }
        const JsonValue* additional = s.get("additionalProperties");
        if (additional && !(additional->kind == JsonValue::Bool && !additional->boolean)) {
            const std::string value = additional->kind == JsonValue::Object ? visit(*additional, sub_name(name, "additional-value"), depth + 1) : primitive("value");
            const std::string key = names.empty() ? primitive("string")
                                                  : add_rule(sub_name(name, "additional-k"), KeyExclusion(names, primitive("char")).rule());
            kv["*"] = add_rule(sub_name(name, "additional-kv"), key + " \":\" space " + value);
            opt.push_back("*");
        }
        std::string rule = "\"{\" space ";
        for (size_t i = 0; i < req.size(); i++) rule += (i ? " \",\" space " : "") + kv[req[i]];
        if (!opt.empty()) {
            rule += " (";
            if (!req.empty()) rule += " \",\" space ( ";
            for (size_t i = 0; i < opt.size(); i++) rule += (i ? " | " : "") + optional_chain(opt, i, false, kv, name);
            if (!req.empty()) rule += " )";
            rule += " )?";
        }
        return rule + " \"}\" space";
    }

    // The optional properties from index i on, each at most once and in order (llama.cpp's
    // get_recursive_refs); "*" stands for any number of additional properties.
    std::string optional_chain(const std::vector<std::string>& keys, size_t i, bool first_optional,
                               std::map<std::string, std::string>& kv, const std::string& name) {
        const std::string& k = keys[i];
        const std::string comma_ref = "( \",\" space " + kv[k] + " )";
        std::string res = first_optional ? comma_ref + (k == "*" ? "*" : "?") : kv[k] + (k == "*" ? " " + comma_ref + "*" : "");
        if (i + 1 < keys.size()) res += " " + add_rule(sub_name(name, k == "*" ? "additional" : k) + "-rest", optional_chain(keys, i + 1, true, kv, name));
        return res;
    }

    // A schema behind its $ref (if any).
    const JsonValue& dereferenced(const JsonValue& s) const {
        const JsonValue* ref = s.kind == JsonValue::Object ? s.get("$ref") : nullptr;
        return ref ? *lookup_ref(ref->text) : s;
    }

    // properties of s, and of the objects of its allOf (whose required lists are merged; the
    // properties of an allOf member's anyOf alternatives are optional, as llama.cpp's).
    void collect_properties(const JsonValue& s, std::vector<std::pair<std::string, const JsonValue*>>& props,
                            std::set<std::string>& required, int depth) {
        if (depth > 64) fail("nested deeper than 64 levels");
        if (const JsonValue* p = s.get("properties")) {
            if (p->kind != JsonValue::Object) fail("'properties' must be an object");
            for (const auto& [k, v] : p->members) props.emplace_back(k, &v);
        }
        const JsonValue* all = s.get("allOf");
        if (!all) return;
        if (all->kind != JsonValue::Array) fail("'allOf' must be an array");
        for (const JsonValue& part : all->items) {
            const JsonValue& target = dereferenced(part);
            if (const JsonValue* r = target.get("required"))
                for (const JsonValue& k : r->items) required.insert(k.text);
            collect_properties(target, props, required, depth + 1);
            if (const JsonValue* any = target.get("anyOf")) {
                std::set<std::string> optional;  // their required lists do not apply to the whole
                for (const JsonValue& alt : any->items) collect_properties(dereferenced(alt), props, optional, depth + 1);
            }
        }
    }

    // allOf of enums: the values every member admits, in the first one's order ("" if some member
    // has no enum).
    std::string enum_intersection(const JsonValue& all) {
        std::vector<const JsonValue*> enums;
        if (all.items.empty()) return "";
        for (const JsonValue& part : all.items) {
            const JsonValue* e = dereferenced(part).get("enum");
            if (!e || e->kind != JsonValue::Array) return "";
            enums.push_back(e);
        }
        std::string body;
        for (const JsonValue& v : enums.empty() ? std::vector<JsonValue>() : enums[0]->items) {
            const std::string text = json_dump(v);
            bool everywhere = true;
            for (const JsonValue* e : enums) {
                bool found = false;
                for (const JsonValue& w : e->items) found = found || json_dump(w) == text;
                everywhere = everywhere && found;
            }
            if (everywhere) body += (body.empty() ? "" : " | ") + gbnf_literal(text);
        }
        if (body.empty()) fail("the allOf enums have no value in common");
        return "(" + body + ") space";
    }

    std::string enum_rule(const JsonValue& e) {
        if (e.kind != JsonValue::Array || e.items.empty()) fail("'enum' must be a non-empty array");
        std::string body = "(";
        for (size_t i = 0; i < e.items.size(); i++) body += (i ? " | " : "") + gbnf_literal(json_dump(e.items[i]));
        return body + ") space";
    }

    std::string visit(const JsonValue& s, const std::string& name, int depth) {
        if (depth > 64) fail("nested deeper than 64 levels");
        const std::string rule_name = name.empty() ? "root" : name;
        if (s.kind == JsonValue::Bool) {
            if (!s.boolean) fail("the schema 'false' admits nothing");
            return add_rule(rule_name, primitive("value"));
        }
        if (s.kind != JsonValue::Object) fail("a schema must be an object or a boolean");
        if (const JsonValue* ref = s.get("$ref")) {
            if (ref->kind != JsonValue::String) fail("'$ref' must be a string");
            return add_rule(rule_name, resolve_ref(ref->text, depth));
        }
        const JsonValue* alts = s.get("oneOf") ? s.get("oneOf") : s.get("anyOf");
        if (alts) {
            if (alts->kind != JsonValue::Array || alts->items.empty()) fail("'oneOf'/'anyOf' must be a non-empty array");
            std::string body;
            for (size_t i = 0; i < alts->items.size(); i++)
                body += (i ? " | " : "") + visit(alts->items[i], sub_name(name, std::to_string(i)), depth + 1);
            return add_rule(rule_name, body);
        }
        if (const JsonValue* c = s.get("const")) return add_rule(rule_name, gbnf_literal(json_dump(*c)) + " space");
        if (const JsonValue* e = s.get("enum")) return add_rule(rule_name, enum_rule(*e));
        const JsonValue* type = s.get("type");
        if (type && type->kind == JsonValue::Array) {
            std::string body;
            for (size_t i = 0; i < type->items.size(); i++) {
                JsonValue one = s;
                for (auto& [k, v] : one.members) if (k == "type") v = type->items[i];
                body += (i ? " | " : "") + visit(one, sub_name(name, type->items[i].text), depth + 1);
            }
            if (body.empty()) fail("'type' must not be an empty array");
            return add_rule(rule_name, body);
        }
        const std::string t = type ? type->text : "";
        if (type && type->kind != JsonValue::String) fail("'type' must be a string or an array");
        if (const JsonValue* all = s.get("allOf"); all && all->kind == JsonValue::Array && (t.empty() || t == "string")) {
            const std::string body = enum_intersection(*all);
            if (!body.empty()) return add_rule(rule_name, body);
        }
        const JsonValue* additional = s.get("additionalProperties");
        if ((t.empty() || t == "object") && (s.get("properties") || s.get("allOf") || (additional && !(additional->kind == JsonValue::Bool && additional->boolean))))
            return add_rule(rule_name, object_rule(s, name, depth));
        if (t == "object") return add_rule(rule_name, primitive("object"));
        if (t == "array" || (t.empty() && (s.get("items") || s.get("prefixItems")))) return add_rule(rule_name, array_rule(s, name, depth));
        if (t == "string" || (t.empty() && (s.get("pattern") || s.get("format")))) return add_rule(rule_name, string_rule(s));
        if (t == "integer" && (s.get("minimum") || s.get("maximum") || s.get("exclusiveMinimum") || s.get("exclusiveMaximum")))
            return add_rule(rule_name, "(" + integer_range_rule(integer_range(s)) + ") space");
        if (t == "integer" || t == "number" || t == "boolean" || t == "null") return add_rule(rule_name, primitive(t));
        if (t.empty()) return add_rule(rule_name, primitive("value"));
        fail("unsupported type '" + t + "'");
    }

    const JsonValue& root_;
    std::vector<std::pair<std::string, std::string>> rules_;  // in creation order
    std::map<std::string, size_t> index_;
    std::map<std::string, std::string> ref_rules_;  // $ref -> its rule's name
};

} // namespace simpl

std::string json_schema_to_grammar(const std::string& schema_json) {
    simpl::JsonValueBuilder builder;
    simpl::JsonValue schema;
    try {
        schema = chat_detail::JsonReader<simpl::JsonValueBuilder>(schema_json, builder, 64, 1u << 20).read_document();
    } catch (const Error& e) {
        throw Error(std::string("json_schema: invalid JSON (") + e.what() + ")");
    }
    std::string gbnf = simpl::SchemaConverter(schema).convert();
    Grammar check(gbnf);  // the converter's output must itself be a valid grammar
    (void)check;
    return gbnf;
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

// ============================================================================================
// 18. Evaluation: perplexity and KL divergence (see the API section)
// ============================================================================================

// Running mean and standard error of a per-position quantity (NLL, KL, top-1 agreement).
struct EvalAccumulator {
    double sum = 0, sum2 = 0, max = 0;
    int64_t n = 0;
    void add(double x) {
        sum += x;
        sum2 += x * x;
        max = n == 0 ? x : std::max(max, x);
        n++;
    }
    double mean() const { return n ? sum / n : 0; }
    // Standard error of the mean, as llama-perplexity computes it: sqrt(var / (n - 1)).
    double err() const {
        if (n < 2) return 0;
        const double m = mean(), var = sum2 / n - m * m;
        return var > 0 ? std::sqrt(var / (n - 1)) : 0;
    }
};

// log(sum(exp(x))) of one logit row (the log-softmax normalizer) and its argmax (first on ties).
struct EvalRowStats {
    double log_norm;
    int argmax;
};

static EvalRowStats eval_row_stats(const float* x, int n) {
    int am = 0;
    for (int i = 1; i < n; i++) am = x[i] > x[am] ? i : am;
    const float mx = x[am];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += std::exp(x[i] - mx);
    return {mx + std::log(sum), am};
}

// KL(base || model) = sum_i p_base(i) * (log p_base(i) - log p_model(i)). The log-probability
// difference is formed from the raw logits in double (exact for floats) minus the normalizers'
// difference, so identical rows give exactly 0 and small divergences keep their precision.
static double eval_kl(const float* base, const EvalRowStats& sb, const float* model, const EvalRowStats& sm, int n) {
    const double dnorm = sb.log_norm - sm.log_norm;
    const float bnorm = (float)sb.log_norm;
    double kl = 0;
    for (int i = 0; i < n; i++) kl += std::exp(base[i] - bnorm) * ((double)base[i] - (double)model[i] - dnorm);
    return std::max(0.0, kl);
}

static void eval_check_base(const Model& model, const Model* base) {
    if (base && base->hp.n_vocab != model.hp.n_vocab) {
        fail("the base model's vocabulary has %d tokens, the model's %d: KL divergence needs the same vocabulary",
             base->hp.n_vocab, model.hp.n_vocab);
    }
}

PerplexityResult evaluate_perplexity(const Model& model, const Model* base, const std::vector<int32_t>& tokens,
                                     const PerplexityParams& params, const PerplexityProgress& progress) {
    const int n_ctx = params.n_ctx, n_vocab = model.hp.n_vocab;
    if (n_ctx < 4) fail("perplexity needs a context of at least 4 tokens (got %d)", n_ctx);
    if (params.n_batch <= 0) fail("batch size must be positive");
    eval_check_base(model, base);
    if ((int64_t)tokens.size() < 2 * (int64_t)n_ctx) {
        fail("perplexity with a context of %d needs at least %d tokens; the text has only %zu", n_ctx, 2 * n_ctx,
             tokens.size());
    }
    int n_chunks = (int)(tokens.size() / n_ctx);
    if (params.n_chunks > 0) n_chunks = std::min(n_chunks, params.n_chunks);

    const double t0 = now_seconds();
    ContextParams cp;
    cp.n_ctx = n_ctx;
    cp.n_threads = params.n_threads;
    Context ctx(model, cp);
    std::unique_ptr<Context> base_ctx = base ? std::make_unique<Context>(*base, cp) : nullptr;
    ThreadPool pool(ctx.n_threads());

    // As llama-perplexity: every chunk starts with BOS when the model adds one, so each is scored like
    // a document of its own; the replaced token is never a scored target (those start at n_ctx/2 + 1).
    const bool add_bos = model.vocab.add_bos() && model.vocab.bos() >= 0;
    const int first = n_ctx / 2;  // first position whose prediction is scored

    // Per scored position of one batch, filled in parallel, then added in order (deterministic sums).
    struct PositionScore { double nll, base_nll, kl; bool same_top; };
    std::vector<PositionScore> scores;
    EvalAccumulator nll, base_nll, kl, same_top;
    Batch batch;
    for (int c = 0; c < n_chunks; c++) {
        const int32_t* chunk = tokens.data() + (size_t)c * n_ctx;
        ctx.seq_truncate(0, 0);
        if (base_ctx) base_ctx->seq_truncate(0, 0);
        for (int b0 = 0; b0 < n_ctx; b0 += params.n_batch) {
            const int b1 = std::min(n_ctx, b0 + params.n_batch);
            batch.clear();
            for (int i = b0; i < b1; i++) {
                batch.add(i == 0 && add_bos ? model.vocab.bos() : chunk[i], i, 0, i >= first && i < n_ctx - 1);
            }
            ctx.decode(batch);
            if (base_ctx) base_ctx->decode(batch);
            const int n_out = ctx.n_logits();
            if (n_out == 0) continue;
            const int out0 = std::max(b0, first);  // position of the first output row
            scores.resize(n_out);
            pool.parallel_for(n_out, 1, [&](int64_t j0, int64_t j1, int) {
                for (int64_t j = j0; j < j1; j++) {
                    const int32_t target = chunk[out0 + j + 1];
                    const float* lm = ctx.logits((int)j);
                    const EvalRowStats sm = eval_row_stats(lm, n_vocab);
                    PositionScore& s = scores[j];
                    s = {sm.log_norm - lm[target], 0, 0, false};
                    if (base_ctx) {
                        const float* lb = base_ctx->logits((int)j);
                        const EvalRowStats sb = eval_row_stats(lb, n_vocab);
                        s.base_nll = sb.log_norm - lb[target];
                        s.kl = eval_kl(lb, sb, lm, sm, n_vocab);
                        s.same_top = sb.argmax == sm.argmax;
                    }
                }
            });
            for (const PositionScore& s : scores) {
                nll.add(s.nll);
                if (!base_ctx) continue;
                base_nll.add(s.base_nll);
                kl.add(s.kl);
                same_top.add(s.same_top ? 1.0 : 0.0);
            }
        }
        if (progress) progress(c + 1, n_chunks, std::exp(nll.mean()));
    }

    PerplexityResult r;
    r.n_ctx = n_ctx;
    r.n_tokens = (int)tokens.size();
    r.n_chunks = n_chunks;
    r.n_scored = (int)nll.n;
    r.ppl = std::exp(nll.mean());
    r.ppl_err = r.ppl * nll.err();  // d exp(m) = exp(m) dm
    if (base_ctx) {
        r.has_kl = true;
        r.base_ppl = std::exp(base_nll.mean());
        r.base_ppl_err = r.base_ppl * base_nll.err();
        r.mean_kl = kl.mean();
        r.mean_kl_err = kl.err();
        r.max_kl = kl.max;
        r.top1_agree = 100 * same_top.mean();
        r.top1_agree_err = 100 * same_top.err();  // = sqrt(p(1-p)/(n-1)) for 0/1 values
    }
    r.seconds = now_seconds() - t0;
    return r;
}

PerplexityResult evaluate_perplexity(const Model& model, const Model* base, const std::string& text,
                                     const PerplexityParams& params, const PerplexityProgress& progress) {
    if (!model.vocab.has_tokenizer()) fail("the model has no tokenizer: evaluate token ids instead of text");
    eval_check_base(model, base);
    std::vector<int32_t> tokens = model.vocab.tokenize(text, /*add_special=*/true, /*parse_special=*/false);
    // Same size is not enough for KL to mean anything: the ids must stand for the same text.
    if (base && base->vocab.has_tokenizer() && base->vocab.tokenize(text, true, false) != tokens) {
        fail("the base model tokenizes the text differently: the vocabularies do not match");
    }
    return evaluate_perplexity(model, base, tokens, params, progress);
}

PerplexityProgress perplexity_progress_printer(FILE* out) {
    return [out](int chunk, int n_chunks, double ppl) {
        fprintf(out, "[%d]%.4f,%s", chunk, ppl, chunk == n_chunks ? "\n" : "");
        fflush(out);
    };
}

void print_perplexity_report(const PerplexityResult& r, FILE* out) {
    fprintf(out, "%d chunks of %d tokens (%d tokens in the text), %d positions scored, %.2f s\n", r.n_chunks, r.n_ctx,
            r.n_tokens, r.n_scored, r.seconds);
    fprintf(out, "Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
    if (!r.has_kl) return;
    fprintf(out, "Mean PPL(base): %.4f +/- %.5f\n", r.base_ppl, r.base_ppl_err);
    fprintf(out, "Mean    KLD: %10.6f ± %10.6f\n", r.mean_kl, r.mean_kl_err);
    fprintf(out, "Maximum KLD: %10.6f\n", r.max_kl);
    fprintf(out, "Same top p: %6.3f ± %5.3f %%\n", r.top1_agree, r.top1_agree_err);
}

// ============================================================================================
// 19. Speculative decoding: drafts from the text itself (prompt lookup) or from a draft model (see
//     the API section); the caller verifies them against the target.
// ============================================================================================

// Where the continuation of the latest occurrence, among tokens[0, end), of the longest suffix (ngram_n..2
// tokens) of tail[0, tail_len) begins, with at least one token of it before `end`: {the suffix's
// length, the continuation's index}; {0, 0} when none occurs.
static std::pair<int, size_t> latest_suffix_match(const std::vector<int32_t>& tokens, size_t end, const int32_t* tail, size_t tail_len,
                                                  int ngram_n) {
    for (int n = (int)std::min<long>(ngram_n, (long)tail_len); n >= 2; n--) {
        const int32_t* suffix = tail + tail_len - n;
        for (long start = (long)end - n - 1; start >= 0; start--) {
            if (std::equal(suffix, suffix + n, tokens.data() + start)) return {n, (size_t)start + n};
        }
    }
    return {0, 0};
}

std::vector<int32_t> ngram_draft(const std::vector<int32_t>& tokens, int ngram_n, int n_max) {
    const auto [n, from] = latest_suffix_match(tokens, tokens.size(), tokens.data(), tokens.size(), ngram_n);
    if (n == 0) return {};
    const size_t count = std::min(tokens.size() - from, (size_t)std::max(0, n_max));
    return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
}

std::vector<int32_t> NgramLookup::draft(const std::vector<int32_t>& tokens, int ngram_n, int n_max) {
    if (tokens.empty()) return {};
    if (!started_ || tokens.size() < followed_) {  // the first call, or another sequence: start over
        *this = NgramLookup();
        started_ = true;
        prompt_end_ = tokens.size() - 1;
        followed_ = tokens.size();
    }
    follow(tokens, ngram_n, n_max);
    propose(tokens, tokens.size(), ngram_n, n_max);
    std::vector<int32_t> out;
    for (const Proposed& p : proposal_) out.push_back(p.token);
    return out;
}

// Compares each token since the last call with the proposal in force: a substitution whose new tokens
// it contradicts loses confidence; a copied prompt token it contradicts is where the output left the
// prompt's text. Where no proposal is in force (rejected or used up) the lookup proposes anew after
// the token, as if each token were verified alone, so text drafted by others teaches the map too.
void NgramLookup::follow(const std::vector<int32_t>& tokens, int ngram_n, int n_max) {
    for (; followed_ < tokens.size(); followed_++) {
        const size_t i = followed_ - proposal_at_;
        if (i < proposal_.size()) {
            const Proposed& p = proposal_[i];
            auto through = std::find_if(substitutions_.begin(), substitutions_.end(), [&](const Substitution& s) { return s.id == p.through; });
            if (tokens[followed_] == p.token) {
                if (through != substitutions_.end()) through->failures = 0;
                continue;
            }
            if (through != substitutions_.end()) {
                if (++through->failures >= kMaxFailures) substitutions_.erase(through);
            } else if (p.through == 0 && p.source < prompt_end_) {
                diverged_ = true;
                divergence_source_ = p.source;
                divergence_at_ = followed_;
            }
        }
        resolve_divergence(tokens, followed_ + 1);
        if (followed_ + 1 < tokens.size()) propose(tokens, followed_ + 1, ngram_n, n_max);  // after the last: draft() proposes
    }
}

// The proposal after tokens[0, end): the renamed lookup's unless the plain one matches a longer suffix.
void NgramLookup::propose(const std::vector<int32_t>& tokens, size_t end, int ngram_n, int n_max) {
    const auto plain = latest_suffix_match(tokens, end, tokens.data(), end, ngram_n);
    std::pair<int, size_t> renamed{0, 0};
    if (!substitutions_.empty()) {
        const std::vector<int32_t> tail = tail_with_old_names(tokens, end, ngram_n);
        renamed = latest_suffix_match(tokens, prompt_end_, tail.data(), tail.size(), ngram_n);
    }
    proposal_.clear();
    proposal_at_ = end;
    if (renamed.first > 0 && renamed.first >= plain.first) propose_from_prompt(tokens, renamed.second, n_max);
    else if (plain.first > 0) propose_from_sequence(tokens, end, plain.second, n_max);
}

std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> NgramLookup::substitutions() const {
    std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> out;
    for (const Substitution& s : substitutions_) out.emplace_back(s.old_tokens, s.new_tokens);
    return out;
}

// Where tokens[0, end) re-join the prompt's text after a divergence (the fewest tokens skipped on both
// sides), the skipped prompt tokens -> the output's tokens instead is a substitution.
void NgramLookup::resolve_divergence(const std::vector<int32_t>& tokens, size_t end) {
    if (!diverged_) return;
    if (end > divergence_at_ + kGiveUpAfter + 1) {
        diverged_ = false;
        return;
    }
    for (int skipped = 2; skipped <= kMaxOldTokens + kMaxNewTokens; skipped++) {
        for (int n_old = 1; n_old <= kMaxOldTokens; n_old++) {
            const int n_new = skipped - n_old;
            const size_t old_end = divergence_source_ + n_old, new_end = divergence_at_ + n_new;
            if (n_new < 1 || n_new > kMaxNewTokens || old_end >= prompt_end_ || new_end >= end) continue;
            if (tokens[old_end] != tokens[new_end]) continue;
            learn(std::vector<int32_t>(tokens.begin() + divergence_source_, tokens.begin() + old_end),
                  std::vector<int32_t>(tokens.begin() + divergence_at_, tokens.begin() + new_end));
            diverged_ = false;
            return;
        }
    }
}

// Adds a substitution, or renews the one of the same old tokens; the oldest goes beyond the bound.
void NgramLookup::learn(std::vector<int32_t> old_tokens, std::vector<int32_t> new_tokens) {
    auto same = std::find_if(substitutions_.begin(), substitutions_.end(), [&](const Substitution& s) { return s.old_tokens == old_tokens; });
    if (same == substitutions_.end()) same = substitutions_.insert(substitutions_.end(), Substitution{std::move(old_tokens), {}, 0, 0});
    same->new_tokens = std::move(new_tokens);
    same->failures = 0;
    same->id = next_id_++;
    if ((int)substitutions_.size() > kMaxSubstitutions) {
        substitutions_.erase(std::min_element(substitutions_.begin(), substitutions_.end(),
                                              [](const Substitution& a, const Substitution& b) { return a.id < b.id; }));
    }
}

// The last n tokens of tokens[0, end) with the output's new names read as the prompt's old ones (the
// latest substitution whose new tokens end there), so a tail that ends in a new name occurs in the prompt.
std::vector<int32_t> NgramLookup::tail_with_old_names(const std::vector<int32_t>& tokens, size_t end, int n) const {
    std::vector<int32_t> reversed;
    while (end > 0 && (int)reversed.size() < n) {
        const Substitution* named = nullptr;
        for (const Substitution& s : substitutions_) {
            const size_t k = s.new_tokens.size();
            if (end < prompt_end_ + k || !std::equal(s.new_tokens.begin(), s.new_tokens.end(), tokens.begin() + (end - k))) continue;
            if (!named || s.id > named->id) named = &s;
        }
        if (named) {
            reversed.insert(reversed.end(), named->old_tokens.rbegin(), named->old_tokens.rend());
            end -= named->new_tokens.size();
        } else {
            reversed.push_back(tokens[--end]);
        }
    }
    reversed.resize(std::min<size_t>(reversed.size(), n));
    return std::vector<int32_t>(reversed.rbegin(), reversed.rend());
}

// The substitution whose old tokens the prompt holds at `at` (the longest, then the latest), if any.
const NgramLookup::Substitution* NgramLookup::substitution_at(const std::vector<int32_t>& tokens, size_t at) const {
    const Substitution* best = nullptr;
    for (const Substitution& s : substitutions_) {
        const size_t k = s.old_tokens.size();
        if (at + k > prompt_end_ || !std::equal(s.old_tokens.begin(), s.old_tokens.end(), tokens.begin() + at)) continue;
        if (!best || k > best->old_tokens.size() || (k == best->old_tokens.size() && s.id > best->id)) best = &s;
    }
    return best;
}

// The prompt's tokens from `from` with the old names replaced by the new ones, at most n_max.
void NgramLookup::propose_from_prompt(const std::vector<int32_t>& tokens, size_t from, int n_max) {
    for (size_t at = from; (int)proposal_.size() < n_max && at < prompt_end_;) {
        const Substitution* s = substitution_at(tokens, at);
        if (!s) {
            proposal_.push_back({tokens[at], at, 0});
            at++;
            continue;
        }
        for (int32_t t : s->new_tokens) proposal_.push_back({t, at, s->id});
        at += s->old_tokens.size();
    }
    proposal_.resize(std::min<size_t>(proposal_.size(), std::max(0, n_max)));
}

// tokens[from, end) as they are, at most n_max (an earlier stretch of the output holds its new names).
void NgramLookup::propose_from_sequence(const std::vector<int32_t>& tokens, size_t end, size_t from, int n_max) {
    for (size_t at = from; (int)proposal_.size() < n_max && at < end; at++) proposal_.push_back({tokens[at], at, 0});
}

void check_draft_vocab(const Model& target, const Model& draft) {
    const Vocab &tv = target.vocab, &dv = draft.vocab;
    if (tv.model_type() != dv.model_type())
        fail("draft model: its tokenizer (%s) is not the target's (%s)", dv.model_type().c_str(), tv.model_type().c_str());
    if (std::abs(target.hp.n_vocab - draft.hp.n_vocab) > 128)
        fail("draft model: %d tokens against the target's %d (they may differ by 128 at most)", draft.hp.n_vocab, target.hp.n_vocab);
    if (tv.bos() != dv.bos() || tv.eos() != dv.eos())
        fail("draft model: BOS/EOS are %d/%d, the target's %d/%d", dv.bos(), dv.eos(), tv.bos(), tv.eos());
    const int32_t shared = std::min(tv.n_tokens(), dv.n_tokens());
    for (int32_t id = 0; id < shared; id++) {
        if (tv.token_text(id) != dv.token_text(id))
            fail("draft model: token %d is '%s', the target's is '%s'", id, dv.token_text(id).c_str(), tv.token_text(id).c_str());
    }
}

DraftModel::DraftModel(const Model& draft, int target_vocab, const ContextParams& params, const Context& share_threads)
    : ctx_(draft, params, share_threads), target_vocab_(target_vocab), cached_(ctx_.n_seq()) {}

// The most likely token of a row of logits and its probability.
static std::pair<int32_t, double> best_token(const float* logits, int n_vocab) {
    const int32_t best = (int32_t)(std::max_element(logits, logits + n_vocab) - logits);
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += std::exp((double)logits[i] - logits[best]);
    return {best, 1.0 / sum};
}

size_t DraftModel::cached_prefix(int seq, const std::vector<int32_t>& tokens) const {
    if (seq < 0 || seq >= ctx_.n_seq()) fail("draft model: no sequence %d", seq);
    const std::vector<int32_t>& cached = cached_[seq];
    const size_t n = std::min(cached.size(), tokens.size());
    return (size_t)(std::mismatch(cached.begin(), cached.begin() + n, tokens.begin()).first - cached.begin());
}

void DraftModel::feed(int seq, const std::vector<int32_t>& tokens, int n_batch) { feed_with(seq, tokens, {}, n_batch); }

// Brings sequence seq to tokens + extra: the common prefix stays (the last token of `tokens` is evaluated
// again), the rest goes n_batch at a time, the first batch the short one, so the last batch holds the
// logits rows: the last token of `tokens`, then each of `extra` (at most n_batch - 1 of them).
void DraftModel::feed_with(int seq, const std::vector<int32_t>& tokens, const std::vector<int32_t>& extra, int n_batch) {
    if (seq < 0 || seq >= ctx_.n_seq()) fail("draft model: no sequence %d", seq);
    const int len = (int)tokens.size(), end = len + (int)extra.size(), step = std::max(1, n_batch);
    if (tokens.empty() || end > ctx_.n_ctx_seq()) fail("draft model: %d tokens do not fit its sequence", end);
    if ((int)extra.size() >= step) fail("draft model: %zu tokens to check in batches of %d", extra.size(), step);
    std::vector<int32_t>& cached = cached_[seq];
    size_t keep = 0;
    while (keep < cached.size() && keep + 1 < tokens.size() && cached[keep] == tokens[keep]) keep++;
    ctx_.seq_truncate(seq, (int)keep);
    cached.resize(keep);
    auto token_at = [&](int i) { return i < len ? tokens[i] : extra[i - len]; };
    const int first = (end - (int)keep) % step == 0 ? step : (end - (int)keep) % step;
    Batch batch;
    for (int from = (int)keep, to = std::min(end, from + first); from < end; from = to, to = std::min(end, to + step)) {
        batch.clear();
        for (int i = from; i < to; i++) batch.add(token_at(i), i, seq, i >= len - 1);
        decode(seq, batch);
        for (int i = from; i < to; i++) cached.push_back(token_at(i));
    }
}

void DraftModel::decode(int seq, const Batch& batch) {
    try {
        ctx_.decode(batch);
    } catch (const Error&) {  // what the cache holds is unknown now: the sequence starts over next time
        ctx_.seq_truncate(seq, 0);
        cached_[seq].clear();
        throw;
    }
}

std::vector<int32_t> DraftModel::draft(int seq, const std::vector<int32_t>& tokens, const DraftParams& p, int n_batch,
                                       const std::vector<int32_t>& proposal, int n_own_max) {
    last_confirmed_ = last_decodes_ = 0;
    const int len = (int)tokens.size();
    const int n_max = std::min(p.n_max, ctx_.n_ctx_seq() - len);  // positions the draft's sequence has left
    if (len == 0 || n_max <= 0 || n_max < p.n_min) return {};
    // Row r of the first batch's logits checks proposal[r]: the tokens before the last one checked are evaluated.
    const int n_check = std::min({(int)proposal.size(), n_max, std::max(1, n_batch)});
    const std::vector<int32_t> evaluated(proposal.begin(), proposal.begin() + std::max(0, n_check - 1));
    feed_with(seq, tokens, evaluated, n_batch);
    last_decodes_ = 1;
    std::vector<int32_t> out;
    int row = 0, own = 0;
    bool checking = n_check > 0;  // the logits rows are the proposal's, not yet the draft's own tokens
    for (;;) {
        const auto [token, prob] = best_token(ctx_.logits(row), ctx_.head_vocab());
        const bool confirmed = checking && row < n_check && token == proposal[row];
        if (token >= target_vocab_ || prob < p.p_min || (!confirmed && own >= n_own_max)) break;
        out.push_back(token);
        own += !confirmed;
        last_confirmed_ += confirmed;
        if ((int)out.size() >= n_max) break;
        if (confirmed && row < (int)evaluated.size()) {  // the next row is evaluated already
            row++;
            continue;
        }
        if (own >= n_own_max) break;
        // Alone from here: the cache drops the proposal's rows after the tokens drafted so far.
        const int pos = len + (int)out.size() - 1;
        if ((int)cached_[seq].size() > pos) {
            ctx_.seq_truncate(seq, pos);
            cached_[seq].resize(pos);
        }
        Batch batch;
        batch.add(token, pos, seq, true);
        decode(seq, batch);
        cached_[seq].push_back(token);
        last_decodes_++;
        checking = false;
        row = 0;
    }
    if ((int)out.size() < p.n_min) out.clear();
    return out;
}

// The prior's shape of a decode's time by batch size: matmuls stay bound by reading the weights up
// to about 8 rows, then grow with the rows (measured on AVX-512: pp8 1.3x pp1, pp16 2.4x).
static double decode_cost_prior(int n_tokens) { return std::max(1.0 + 0.02 * (n_tokens - 1), n_tokens / 8.0); }

void DraftCost::record_decode(int n_tokens, double ms) {
    if (n_tokens < 1 || n_tokens > kMaxTokens || !(ms > 0)) return;
    double& avg = ms_[n_tokens];
    if (avg == 0) n_measured_++;
    avg = avg == 0 ? ms : 0.8 * avg + 0.2 * ms;
}

double DraftCost::decode_ms(int n_tokens) const {
    n_tokens = std::clamp(n_tokens, 1, kMaxTokens);
    if (ms_[n_tokens] > 0 || n_measured_ == 0) return ms_[n_tokens];
    int nearest = 0;
    for (int n = 1; n <= kMaxTokens; n++)
        if (ms_[n] > 0 && (nearest == 0 || std::abs(n - n_tokens) < std::abs(nearest - n_tokens))) nearest = n;
    return ms_[nearest] * decode_cost_prior(n_tokens) / decode_cost_prior(nearest);
}

double DraftCost::expected_kept(double alpha, int k) {
    double kept = 0, p = 1;
    for (int i = 0; i < k; i++) kept += (p *= alpha);
    return kept;
}

int DraftCost::best_length(double alpha, int n_max, int base, double ms_per_token) const {
    if (!measured()) return std::max(0, n_max);
    int best = 0;
    double best_rate = rate(0, 0, 0, base);
    for (int k = 1; k <= n_max && base + k <= kMaxTokens; k++) {
        const double r = rate(expected_kept(alpha, k), k, k * ms_per_token, base);
        if (r > best_rate) { best = k; best_rate = r; }
    }
    return best;
}

double DraftCost::rate(double kept, double drafted, double draft_ms, int base) const {
    if (!measured()) return 0;
    base = std::max(1, base);
    return (base + kept) / (draft_ms + decode_ms(base + (int)std::lround(drafted)));
}

bool DraftCost::pays(double kept, double drafted, double draft_ms, int base) const {
    return !measured() || rate(kept, drafted, draft_ms, base) > rate(0, 0, 0, base);
}

} // namespace llm
#endif // LLM_IMPLEMENTATION
