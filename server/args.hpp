// llm-server's command line: every llama-server flag (short and long spellings) and its LLAMA_ARG_*
// environment variable, plus the command-line modes of llama-cli / llama-bench / llama-perplexity.
// One table (args.cpp) holds each flag's spellings, variable, value, --help group and effect. Flags
// that cannot apply to this build (GPU offload, downloads, ...) are accepted and leave a note that is
// logged at startup, saying what they mean here.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "../llm.hpp"

namespace srv {

// Flags of the HTTP server mode.
struct ServerOptions {
    std::string host = "127.0.0.1", chat_template, chat_template_file, chat_template_kwargs, slot_save_path, api_prefix;
    std::vector<std::string> api_keys, aliases, tags;
    int port = 8080, n_ubatch = 512, max_queue = 64, timeout_s = 600, shutdown_grace_s = 10, n_keep = 0;
    int cache_reuse = 0;  // --cache-reuse: least chunk moved by KV shifting (0: off)
    int cache_ram_mib = 8192, max_connections = 64, max_connections_per_client = 0;  // 0: half of max_connections
    bool context_shift = false, kv_unified = false, warmup = true, cache_prompt = true;
    bool metrics = false, props_post = false, slots = true, webui = true;
    std::string models_dir, models_preset;  // router mode (router.hpp)
    int models_max = 4;
    bool models_autoload = true;
    bool reranking = false;   // --reranking: /rerank served (implies embeddings with rank pooling)
    int embd_normalize = 2;   // --embd-normalize: the default of embedding requests
    bool jinja = true;                     // render the Jinja template itself (--no-jinja: the family's renderer)
    std::string reasoning_format = "auto"; // none: thinking stays in content; deepseek / auto: reasoning_content
    int reasoning_budget = -1;             // thinking tokens before the end tag is forced (-1: unlimited)
    std::string reasoning = "auto";        // --reasoning on|off: the default enable_thinking
    std::string ssl_key_file, ssl_cert_file;  // TLS asked for: refused at startup (no TLS in this build)
    bool spm_infill = false;  // /infill puts the suffix first (suffix/prefix/middle), for models trained so
};

// Speculative decoding (-md, --spec-type, --draft-*): used by the server, -p mode and --bench.
struct SpecOptions {
    std::string model;                // -md: the draft model
    bool ngram = false;               // --spec-type ngram-simple: drafts from the tokens themselves
    int ngram_n = 3;                  // --spec-ngram-size-n: the longest suffix looked up
    llm::DraftParams draft;           // --draft-max, --draft-min, --draft-p-min
    int n_ctx = 0, n_threads = 0, n_threads_batch = 0, n_gpu_layers = 0;  // -cd (0: the target's), -td, -tbd, -ngld
    llm::Type type_k = llm::Type::F16, type_v = llm::Type::F16;           // -ctkd, -ctvd
    bool backoff = true;              // --spec-backoff cost (true) | none: drafts sized by the cost model
    int draft_vocab = 32768;          // --spec-draft-vocab: the draft's head computes ids [0, N) only (0: all)
    bool enabled() const { return ngram || !model.empty(); }
};

struct Options {
    std::string model, prompt, prompt_file, dump_logits, perplexity_file, kl_base;
    std::string render_chat;  // --render-chat REQUEST.json
    std::vector<int32_t> prompt_ids;
    bool has_prompt = false, has_prompt_ids = false;
    int n_predict = -1, n_ctx = 0, n_threads = 0, n_batch = 512, bench_reps = 5, n_parallel = 1, n_chunks = -1;
    int n_gpu_layers = 0;  // -ngl (builds with an offload backend); -1: all
    std::vector<float> tensor_split;   // -ts
    int main_gpu = 0;                  // -mg
    bool split_layers = true;          // -sm layer (false: none)
    std::vector<std::string> devices;  // --device (empty: all; {"none"}: none)
    int n_threads_batch = 0, poll = 50;  // prefill threads (0: as -t), idle workers' busy-wait level
    llm::Type type_k = llm::Type::F16, type_v = llm::Type::F16;
    llm::FlashAttn flash_attn = llm::FlashAttn::Auto;  // -fa
    bool tokenize = false, add_special = false, parse_special = false, bench = false, plan = false;
    bool use_mmap = true, mlock = false, repack = true, verbose_prompt = false, moe_per_token = false;
    bool escape = false, ignore_eos = false, special = false;  // special: special tokens printed as their text
    bool dry_breakers_given = false;           // a --dry-sequence-breaker replaced the defaults
    std::vector<std::string> reverse_prompts;  // -r outside --bench: stop strings of every request
    std::string short_r;                       // -r's value: --bench repetitions, else a reverse prompt
    int log_verbosity = 3;                     // 1 errors, 2 warnings, 3 info, 4+ debug; -1 nothing
    std::string log_file;
    bool embedding = false;                              // --embedding(s): the context computes embeddings
    llm::Pooling pooling = llm::Pooling::Unspecified;   // --pooling
    llm::SamplerParams sampling;
    ServerOptions srv;
    SpecOptions spec;
    // What accepted flags mean here, one line each ('I' or 'W', text), logged at startup.
    std::vector<std::pair<char, std::string>> notes;
};

[[noreturn]] void usage_error(const std::string& msg);
// The environment's LLAMA_ARG_* variables, then argv (a flag given overrides its variable).
Options parse_args(int argc, char** argv);
// Values a flag spelling takes: 0 for a switch (or a flag whose value is optional), -1 if unknown.
int flag_arity(const std::string& spelling);
// True when no command-line mode is asked for: the HTTP server runs.
bool wants_server(const Options& o);
// The model name requests and responses use: the first --alias, else the model path.
std::string model_id(const Options& o);

// How the model files of a run are loaded (the main model, --kl-base, the server's).
llm::ModelOptions model_options(const Options& o);
llm::ContextParams context_params(const Options& o, int n_ctx);

}  // namespace srv
