// llm-server's command line: the options of every mode, their parsing and --help, and how they map
// onto the engine's parameters.
#pragma once
#include <string>
#include <vector>

#include "../llm.hpp"

namespace srv {

// Flags of the HTTP server mode.
struct ServerOptions {
    std::string host = "127.0.0.1", api_key, alias, chat_template, chat_template_file;
    int port = 8080, n_ubatch = 512, max_queue = 64, timeout_s = 600, shutdown_grace_s = 10, n_keep = 0;
    int cache_ram_mib = 8192, max_connections = 64;
    bool context_shift = false, kv_unified = false, warmup = true;
    bool webui = true;        // GET / serves the chat page (--no-webui: 404, as llama-server)
    bool spm_infill = false;  // /infill puts the suffix first (suffix/prefix/middle), for models trained so
};

struct Options {
    std::string model, prompt, prompt_file, dump_logits, perplexity_file, kl_base;
    std::vector<int32_t> prompt_ids;
    bool has_prompt = false, has_prompt_ids = false;
    int n_predict = -1, n_ctx = 0, n_threads = 0, n_batch = 512, bench_reps = 5, n_parallel = 1, n_chunks = -1;
    llm::Type type_k = llm::Type::F16, type_v = llm::Type::F16;
    bool tokenize = false, add_special = false, parse_special = false, bench = false, plan = false;
    bool use_mmap = true, mlock = false, repack = true, verbose_prompt = false, moe_per_token = false;
    llm::SamplerParams sampling;
    ServerOptions srv;
};

[[noreturn]] void usage_error(const std::string& msg);
Options parse_args(int argc, char** argv);
// True when no command-line mode is asked for: the HTTP server runs.
bool wants_server(const Options& o);

// How the model files of a run are loaded (the main model, --kl-base, the server's).
llm::ModelOptions model_options(const Options& o);
llm::ContextParams context_params(const Options& o, int n_ctx);

}  // namespace srv
