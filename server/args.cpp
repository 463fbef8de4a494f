// llm-server's command line (see args.hpp).
#include "args.hpp"

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace srv {

[[noreturn]] void usage_error(const std::string& msg) {
    fprintf(stderr, "error: %s\n(run llm-server --help for usage)\n", msg.c_str());
    exit(1);
}

namespace {

void print_usage() {
    printf(
        "usage: llm-server -m MODEL [options]\n"
        "\n"
        "modes:\n"
        "  -p, --prompt TEXT        complete TEXT and print timings (with --bench: prompt length)\n"
        "  -f, --file FILE          read the prompt from FILE (its bytes exactly)\n"
        "  --prompt-ids 1,2,3       give the prompt as token ids\n"
        "  --dump-logits FILE       write float32 logits of every prompt position (n_tokens x n_vocab) and exit\n"
        "  --tokenize               print the prompt's token ids and exit\n"
        "  --add-special            with --tokenize: add BOS/EOS as the model's metadata says\n"
        "  --parse-special          with --tokenize: parse special-token text into special tokens\n"
        "  --bench                  measure pp (-p N tokens) and tg (-n N tokens), -r repetitions, median\n"
        "  --perplexity FILE        perplexity of FILE in chunks of -c tokens (default 512), second halves scored\n"
        "  --kl-base BASE.gguf      with --perplexity: also KL divergence and top-1 agreement against BASE\n"
        "  --chunks N               with --perplexity: at most N chunks\n"
        "  --plan                   print the memory a deployment needs (weights, KV per token/slot/total,\n"
        "                           compute) for -c N tokens per slot and -np N slots, without loading weights\n"
        "\n"
        "options:\n"
        "  -n, --n-predict N        tokens to generate (default: until end of text or context)\n"
        "  -np, --parallel N        slots (server) / sequences planned for (--plan)\n"
        "  -c, --ctx-size N         context size (default: the model's, at most 4096)\n"
        "  -t, --threads N          threads (default: physical cores)\n"
        "  -b, --batch-size N       prompt tokens per forward pass (default 512)\n"
        "  -r, --repetitions N      --bench repetitions (default 5)\n"
        "  -ctk, --cache-type-k T   K cache type: f32, f16, q8_0, q4_0, iq4_nl (default f16)\n"
        "  -ctv, --cache-type-v T   V cache type (default f16)\n"
        "  --temp T  --top-k N  --top-p P  --min-p P  --seed N\n"
        "  --repeat-penalty P  --repeat-last-n N  --presence-penalty P  --frequency-penalty P\n"
        "  --no-mmap  --mlock\n"
        "  --no-repack              keep weights as in the file (default: interleave them for the AVX-512 VNNI kernels)\n"
        "  --moe-per-token          run MoE experts token by token instead of grouped by expert (benchmarks)\n"
        "\n"
        "HTTP server (the mode when none of the above is asked for; llama-server's API):\n"
        "  --host H                 address to listen on, numeric IPv4/IPv6 (default 127.0.0.1)\n"
        "  --port P                 port (default 8080; 0 = any free one, logged as 'listening on H:P')\n"
        "  -np, --parallel N        slots: requests served at once; -c is split across them\n"
        "  -ub, --ubatch-size N     most tokens per forward pass (default 512; also bounded by -b)\n"
        "  --api-key KEY            require 'Authorization: Bearer KEY' (/health stays open)\n"
        "  -a, --alias NAME         model name in responses (default: the model path)\n"
        "  --cache-ram MiB          host-RAM cache of evicted slot states (default 8192, 0 off, -1 no limit)\n"
        "  --context-shift          when a slot fills up, drop the older half after --keep N tokens\n"
        "  --kv-unified             one KV pool of -c cells shared by all slots (a request may use all of it)\n"
        "  --chat-template NAME     chatml, llama3, gemma, ... (default: recognized from the model)\n"
        "  --chat-template-file F   recognize the family from a Jinja template file\n"
        "  --max-queue N            requests that may wait for a slot; beyond, 503 at once (default 64)\n"
        "  --max-connections N      concurrent connections (default 64)\n"
        "  -to, --timeout S         write timeout for slow clients (default 600)\n"
        "  --shutdown-grace S       on SIGTERM/SIGINT, time in-flight requests get to finish (default 10)\n"
        "  --no-warmup              skip the warm-up decode before reporting healthy\n"
        "  --no-webui               do not serve the chat page at / (--webui: serve it, the default)\n"
        "  --spm-infill             /infill prompts in suffix/prefix/middle order (default: prefix/suffix/middle)\n");
}

std::vector<int32_t> parse_ids(const std::string& s) {
    std::vector<int32_t> ids;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        long v = strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) usage_error("bad token id '" + item + "' in --prompt-ids");
        ids.push_back((int32_t)v);
    }
    return ids;
}

}  // namespace

Options parse_args(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) usage_error("missing value after " + a);
            return argv[++i];
        };
        auto next_int = [&]() {
            std::string v = next();
            char* end = nullptr;
            long x = strtol(v.c_str(), &end, 10);
            if (v.empty() || *end) usage_error("expected an integer after " + a + ", got '" + v + "'");
            return (int)x;
        };
        auto next_float = [&]() {
            std::string v = next();
            char* end = nullptr;
            float x = strtof(v.c_str(), &end);
            if (v.empty() || *end) usage_error("expected a number after " + a + ", got '" + v + "'");
            return x;
        };
        auto next_type = [&]() {
            try {
                return llm::type_from_name(next());
            } catch (const llm::Error& e) {
                usage_error(e.what());
            }
        };
        if (a == "-h" || a == "--help") { print_usage(); exit(0); }
        else if (a == "-m" || a == "--model") o.model = next();
        else if (a == "-p" || a == "--prompt") { o.prompt = next(); o.has_prompt = true; }
        else if (a == "-f" || a == "--file") o.prompt_file = next();
        else if (a == "--prompt-ids") { o.prompt_ids = parse_ids(next()); o.has_prompt_ids = true; }
        else if (a == "--dump-logits") o.dump_logits = next();
        else if (a == "--tokenize") o.tokenize = true;
        else if (a == "--add-special") o.add_special = true;
        else if (a == "--parse-special") o.parse_special = true;
        else if (a == "--bench") o.bench = true;
        else if (a == "--plan") o.plan = true;
        else if (a == "--perplexity") o.perplexity_file = next();
        else if (a == "--kl-base") o.kl_base = next();
        else if (a == "--chunks") o.n_chunks = next_int();
        else if (a == "-np" || a == "--parallel") o.n_parallel = next_int();
        else if (a == "-n" || a == "--n-predict") o.n_predict = next_int();
        else if (a == "-c" || a == "--ctx-size") o.n_ctx = next_int();
        else if (a == "-t" || a == "--threads") o.n_threads = next_int();
        else if (a == "-b" || a == "--batch-size") o.n_batch = next_int();
        else if (a == "-r" || a == "--repetitions") o.bench_reps = next_int();
        else if (a == "-ctk" || a == "--cache-type-k") o.type_k = next_type();
        else if (a == "-ctv" || a == "--cache-type-v") o.type_v = next_type();
        else if (a == "--temp") o.sampling.temperature = next_float();
        else if (a == "--top-k") o.sampling.top_k = next_int();
        else if (a == "--top-p") o.sampling.top_p = next_float();
        else if (a == "--min-p") o.sampling.min_p = next_float();
        else if (a == "--seed") o.sampling.seed = (uint64_t)(uint32_t)next_int();
        else if (a == "--repeat-penalty") o.sampling.repeat_penalty = next_float();
        else if (a == "--repeat-last-n") o.sampling.penalty_last_n = next_int();
        else if (a == "--presence-penalty") o.sampling.presence_penalty = next_float();
        else if (a == "--frequency-penalty") o.sampling.frequency_penalty = next_float();
        else if (a == "--no-mmap") o.use_mmap = false;
        else if (a == "--mlock") o.mlock = true;
        else if (a == "--no-repack" || a == "-nr") o.repack = false;
        else if (a == "--moe-per-token") o.moe_per_token = true;
        else if (a == "--verbose-prompt") o.verbose_prompt = true;
        // HTTP server mode
        else if (a == "--host") o.srv.host = next();
        else if (a == "--port") o.srv.port = next_int();
        else if (a == "--api-key") o.srv.api_key = next();
        else if (a == "-a" || a == "--alias") o.srv.alias = next();
        else if (a == "-ub" || a == "--ubatch-size") o.srv.n_ubatch = next_int();
        else if (a == "-cram" || a == "--cache-ram") o.srv.cache_ram_mib = next_int();
        else if (a == "--context-shift") o.srv.context_shift = true;
        else if (a == "--no-context-shift") o.srv.context_shift = false;
        else if (a == "-kvu" || a == "--kv-unified") o.srv.kv_unified = true;
        else if (a == "--keep") o.srv.n_keep = next_int();
        else if (a == "--chat-template") o.srv.chat_template = next();
        else if (a == "--chat-template-file") o.srv.chat_template_file = next();
        else if (a == "--no-warmup") o.srv.warmup = false;
        else if (a == "--webui") o.srv.webui = true;
        else if (a == "--no-webui") o.srv.webui = false;
        else if (a == "--spm-infill") o.srv.spm_infill = true;
        else if (a == "--shutdown-grace") o.srv.shutdown_grace_s = next_int();
        else if (a == "--max-queue") o.srv.max_queue = next_int();
        else if (a == "--max-connections") o.srv.max_connections = next_int();
        else if (a == "-to" || a == "--timeout") o.srv.timeout_s = next_int();
        else if (a == "-cb" || a == "--cont-batching" || a == "--metrics" || a == "--slots") {}  // always on
        else usage_error("unknown argument '" + a + "'");
    }
    if (o.model.empty()) usage_error("no model given (-m MODEL)");
    if (o.n_batch <= 0) usage_error("--batch-size must be positive");
    if (o.n_threads < 0) usage_error("--threads must not be negative");
    if (o.n_parallel <= 0 || o.n_parallel > 256) usage_error("--parallel must be in 1..256");
    return o;
}

llm::ModelOptions model_options(const Options& o) {
    llm::ModelOptions mo;
    mo.use_mmap = o.use_mmap;
    mo.mlock = o.mlock;
    mo.interleave = o.repack;
    return mo;
}

llm::ContextParams context_params(const Options& o, int n_ctx) {
    llm::ContextParams cp;
    cp.n_ctx = n_ctx;
    cp.n_threads = o.n_threads;
    cp.type_k = o.type_k;
    cp.type_v = o.type_v;
    cp.moe_grouped = !o.moe_per_token;
    return cp;
}

bool wants_server(const Options& o) {
    return !o.tokenize && !o.plan && !o.bench && o.dump_logits.empty() && o.perplexity_file.empty() && !o.has_prompt &&
           !o.has_prompt_ids && o.prompt_file.empty();
}

}  // namespace srv
