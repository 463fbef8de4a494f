// llm-server: one static binary with the command-line modes of llama-cli / llama-bench and (later)
// the HTTP API of llama-server.
//
//   llm-server -m MODEL -p PROMPT [-n N]           complete a prompt, print llama.cpp-style timings
//   llm-server -m MODEL --prompt-ids 1,2,3 --dump-logits FILE
//                                                   write float32 logits of every prompt position
//   llm-server -m MODEL --tokenize -p TEXT          print token ids (vocabulary-only files work)
//   llm-server -m MODEL --bench -p 512 -n 128 -r 5  prompt / generation tokens per second
#define LLM_IMPLEMENTATION
#include "llm.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

// HTTP server mode
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdarg>
#include <ctime>
#include <deque>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>
#include "http.hpp"

namespace {

// Flags of the HTTP server mode (see the section "HTTP server mode" below).
struct ServerOptions {
    std::string host = "127.0.0.1", api_key, alias, chat_template, chat_template_file;
    int port = 8080, n_ubatch = 512, max_queue = 64, timeout_s = 600, shutdown_grace_s = 10, n_keep = 0;
    int cache_ram_mib = 8192, max_connections = 64;
    bool context_shift = false, kv_unified = false, warmup = true;
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

[[noreturn]] void usage_error(const std::string& msg) {
    fprintf(stderr, "error: %s\n(run llm-server --help for usage)\n", msg.c_str());
    exit(1);
}

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
        "  --no-warmup              skip the warm-up decode before reporting healthy\n");
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

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw llm::Error("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

double mib(size_t bytes) { return bytes / (1024.0 * 1024.0); }

// Feeds tokens [0, n) of `tokens` into sequence 0 in chunks of n_batch; returns the logits of the
// last token (or, with all_logits, appends every row to *all).
void prefill(llm::Context& ctx, const std::vector<int32_t>& tokens, int start, int n_batch, std::vector<float>* all) {
    const int n_vocab = ctx.model().hp.n_vocab;
    llm::Batch batch;
    for (int b = start; b < (int)tokens.size(); b += n_batch) {
        batch.clear();
        int e = std::min((int)tokens.size(), b + n_batch);
        for (int i = b; i < e; i++) batch.add(tokens[i], i, 0, all != nullptr || i == (int)tokens.size() - 1);
        ctx.decode(batch);
        if (all) {
            for (int i = 0; i < ctx.n_logits(); i++) all->insert(all->end(), ctx.logits(i), ctx.logits(i) + n_vocab);
        }
    }
}

std::vector<int32_t> prompt_tokens(const Options& o, const llm::Model& m, bool add_special, bool parse_special) {
    if (o.has_prompt_ids) {
        for (int32_t id : o.prompt_ids) {
            if (m.hp.n_vocab > 0 && id >= m.hp.n_vocab) usage_error("token id " + std::to_string(id) + " is outside the vocabulary");
        }
        return o.prompt_ids;
    }
    std::string text = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
    return m.vocab.tokenize(text, add_special, parse_special);
}

// How the model files of a run are loaded (the main model, --kl-base, the server's).
llm::ModelOptions model_options(const Options& o) {
    llm::ModelOptions mo;
    mo.use_mmap = o.use_mmap;
    mo.mlock = o.mlock;
    mo.interleave = o.repack;
    return mo;
}

int run_tokenize(const Options& o) {
    llm::ModelOptions mo;
    mo.vocab_only = true;
    mo.use_mmap = o.use_mmap;
    auto m = llm::Model::load(o.model, mo);
    if (!o.has_prompt && o.prompt_file.empty()) usage_error("--tokenize needs -p TEXT or -f FILE");
    std::string text = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
    std::vector<int32_t> ids = m->vocab.tokenize(text, o.add_special, o.parse_special);
    std::string line;
    for (size_t i = 0; i < ids.size(); i++) line += (i ? " " : "") + std::to_string(ids[i]);
    printf("%s\n", line.c_str());
    return 0;
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

int run_dump_logits(const Options& o, const llm::Model& m) {
    std::vector<int32_t> tokens = prompt_tokens(o, m, true, true);
    if (tokens.empty()) usage_error("the prompt is empty");
    llm::Context ctx(m, context_params(o, o.n_ctx > 0 ? o.n_ctx : std::max<int>(256, (int)tokens.size())));
    if ((int)tokens.size() > ctx.n_ctx_seq()) {
        throw llm::Error("prompt of " + std::to_string(tokens.size()) + " tokens is longer than the context (" +
                         std::to_string(ctx.n_ctx_seq()) + ")");
    }
    std::vector<float> logits;
    prefill(ctx, tokens, 0, o.n_batch, &logits);
    FILE* f = fopen(o.dump_logits.c_str(), "wb");
    if (!f) throw llm::Error("cannot write " + o.dump_logits + ": " + strerror(errno));
    size_t w = fwrite(logits.data(), sizeof(float), logits.size(), f);
    if (fclose(f) != 0 || w != logits.size()) throw llm::Error("write to " + o.dump_logits + " failed");
    fprintf(stderr, "wrote %zu x %d logits to %s\n", tokens.size(), m.hp.n_vocab, o.dump_logits.c_str());
    return 0;
}

void print_timing(const char* what, double ms, int n) {
    fprintf(stderr, "%18s = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n", what, ms, n,
            n > 0 ? ms / n : 0.0, n > 0 && ms > 0 ? 1000.0 * n / ms : 0.0);
}

int run_complete(const Options& o, const llm::Model& m) {
    std::vector<int32_t> tokens = prompt_tokens(o, m, true, true);
    if (tokens.empty()) usage_error("the prompt is empty");
    llm::Context ctx(m, context_params(o, o.n_ctx));
    fprintf(stderr, "kv cache: %.2f MiB for %d tokens, %.2f KiB per token (K %s, V %s); %d threads\n",
            mib(ctx.kv_bytes()), ctx.n_ctx(), ctx.kv_bytes_per_token() / 1024.0, llm::type_info(o.type_k).name,
            llm::type_info(o.type_v).name, ctx.n_threads());
    if ((int)tokens.size() >= ctx.n_ctx_seq()) {
        throw llm::Error("prompt of " + std::to_string(tokens.size()) + " tokens does not fit the context of " +
                         std::to_string(ctx.n_ctx_seq()) + " (raise -c)");
    }
    if (o.verbose_prompt) {
        for (int32_t t : tokens) fprintf(stderr, "%6d -> '%s'\n", t, m.vocab.token_to_piece(t).c_str());
    }
    llm::Sampler sampler(o.sampling);
    for (int32_t t : tokens) sampler.accept(t);
    fputs(o.prompt_file.empty() && !o.has_prompt_ids ? o.prompt.c_str() : "", stdout);
    fflush(stdout);

    double t0 = llm::now_seconds();
    prefill(ctx, tokens, 0, o.n_batch, nullptr);
    double t_prompt = llm::now_seconds() - t0;

    int n_gen = 0, pos = (int)tokens.size();
    const int limit = o.n_predict < 0 ? ctx.n_ctx_seq() - pos : std::min(o.n_predict, ctx.n_ctx_seq() - pos);
    double t1 = llm::now_seconds();
    llm::Batch batch;
    while (n_gen < limit) {
        int32_t tok = sampler.sample(ctx.logits(0), m.hp.n_vocab);
        sampler.accept(tok);
        n_gen++;
        if (m.vocab.is_eog(tok)) break;
        fputs(m.vocab.token_to_piece(tok, false).c_str(), stdout);
        fflush(stdout);
        if (n_gen == limit) break;
        batch.clear();
        batch.add(tok, pos++, 0, true);
        ctx.decode(batch);
    }
    double t_gen = llm::now_seconds() - t1;
    printf("\n");
    fprintf(stderr, "\n");
    print_timing("prompt eval time", t_prompt * 1000, (int)tokens.size());
    print_timing("eval time", t_gen * 1000, n_gen);
    print_timing("total time", (t_prompt + t_gen) * 1000, (int)tokens.size() + n_gen);
    return 0;
}

// llama-bench style: pp = one prompt of n_prompt tokens from an empty cache; tg = n_gen single-token
// steps. Each test repeats; the median is reported with the standard deviation.
int run_bench(const Options& o, const llm::Model& m) {
    const int n_prompt = o.has_prompt ? atoi(o.prompt.c_str()) : 512;
    const int n_gen = o.n_predict < 0 ? 128 : o.n_predict;
    if (n_prompt < 0 || n_gen < 0 || o.bench_reps <= 0) usage_error("--bench needs -p N >= 0, -n N >= 0, -r N > 0");
    llm::Context ctx(m, context_params(o, std::max(o.n_ctx, n_prompt + n_gen + 1)));
    std::mt19937 rng(42);
    std::vector<int32_t> tokens(std::max(n_prompt, 1));
    for (auto& t : tokens) t = (int32_t)(rng() % m.hp.n_vocab);

    // Warm-up pass (page in the weights), not measured.
    prefill(ctx, std::vector<int32_t>(tokens.begin(), tokens.begin() + std::min<size_t>(tokens.size(), 16)), 0, o.n_batch, nullptr);
    auto measure = [&](bool pp) {
        std::vector<double> tps;
        for (int r = 0; r < o.bench_reps; r++) {
            ctx.seq_truncate(0, 0);
            double t0 = llm::now_seconds();
            if (pp) {
                prefill(ctx, tokens, 0, o.n_batch, nullptr);
            } else {
                llm::Batch b;
                for (int i = 0; i < n_gen; i++) {
                    b.clear();
                    b.add(tokens[i % tokens.size()], i, 0, true);
                    ctx.decode(b);
                }
            }
            tps.push_back((pp ? n_prompt : n_gen) / (llm::now_seconds() - t0));
        }
        std::vector<double> sorted = tps;
        std::sort(sorted.begin(), sorted.end());
        double median = sorted[sorted.size() / 2], mean = 0, var = 0;
        for (double x : tps) mean += x / tps.size();
        for (double x : tps) var += (x - mean) * (x - mean) / std::max<size_t>(1, tps.size() - 1);
        return std::make_pair(median, std::sqrt(var));
    };
    char model_desc[128];
    snprintf(model_desc, sizeof model_desc, "%s %.0fM", m.arch_str.c_str(), m.n_params() / 1e6);
    printf("| %-20s | %10s | %8s | %7s | %7s | %16s |\n", "model", "size", "params", "threads", "test", "t/s (median)");
    printf("| %-20s | %10s | %8s | %7s | %7s | %16s |\n", "---", "---", "---", "---", "---", "---");
    auto row = [&](const std::string& test, std::pair<double, double> r) {
        printf("| %-20s | %7.2f MiB | %7.2fM | %7d | %7s | %8.2f ± %5.2f |\n", model_desc, mib(m.weight_bytes()),
               m.n_params() / 1e6, ctx.n_threads(), test.c_str(), r.first, r.second);
        fflush(stdout);
    };
    if (n_prompt > 0) row("pp" + std::to_string(n_prompt), measure(true));
    if (n_gen > 0) row("tg" + std::to_string(n_gen), measure(false));
    return 0;
}

// --perplexity FILE [--kl-base BASE]: llama-perplexity's numbers (and its --kl-divergence ones).
int run_perplexity(const Options& o, const llm::Model& m) {
    std::unique_ptr<llm::Model> base;
    if (!o.kl_base.empty()) {
        base = llm::Model::load(o.kl_base, model_options(o));
    }
    llm::PerplexityParams p;
    p.n_ctx = o.n_ctx > 0 ? o.n_ctx : 512;
    p.n_batch = o.n_batch;
    p.n_chunks = o.n_chunks;
    p.n_threads = o.n_threads;
    llm::PerplexityResult r = llm::evaluate_perplexity(m, base.get(), read_file(o.perplexity_file), p, llm::perplexity_progress_printer(stdout));
    llm::print_perplexity_report(r, stdout);
    return 0;
}

std::string human_bytes(size_t b) {
    char buf[64];
    if (b >= (1ull << 29)) snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
    else if (b >= 1024) snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
    else snprintf(buf, sizeof buf, "%zu B", b);
    return buf;
}

// --plan: the KV-cache spreadsheet, from metadata only. -c is the context each slot gets here, so the
// total is slots x context (the server itself splits -c across its slots: give it -c C*N for N
// slots of C tokens).
int run_plan(const Options& o) {
    llm::ModelOptions mo;
    mo.metadata_only = true;
    auto m = llm::Model::load(o.model, mo);
    const int n_ctx = o.n_ctx > 0 ? o.n_ctx : std::min(m->hp.n_ctx_train, 4096);
    llm::MemoryPlan p = llm::plan_memory(*m, n_ctx, o.n_parallel, o.type_k, o.type_v, o.n_batch);
    const llm::HParams& hp = m->hp;
    printf("model:            %s (%s), %d layers, n_embd %d, %d heads", o.model.c_str(), m->arch_str.c_str(), hp.n_layer, hp.n_embd, hp.n_head);
    if (hp.mla) printf(", MLA latent %d + rope %d\n", hp.kv_lora_rank, hp.n_rot);
    else printf(" (%d kv) x %d dims\n", hp.n_head_kv, hp.head_dim_k);
    printf("weights:          %s (%zu bytes)\n", human_bytes(p.weight_bytes).c_str(), p.weight_bytes);
    printf("kv per token:     %zu B (%s) with K %s, V %s\n", p.kv_bytes_per_token, human_bytes(p.kv_bytes_per_token).c_str(),
           llm::type_info(o.type_k).name, hp.mla ? "- (latent)" : llm::type_info(o.type_v).name);
    printf("kv per slot:      %s (%d tokens)\n", human_bytes(p.kv_bytes_per_slot).c_str(), n_ctx);
    printf("kv total:         %s (%d slots)\n", human_bytes(p.kv_bytes_total).c_str(), o.n_parallel);
    printf("compute buffers:  %s (estimate, batch %d)\n", human_bytes(p.compute_bytes).c_str(), o.n_batch);
    printf("total:            %s\n", human_bytes(p.total_bytes).c_str());
    if (p.mem_available) {
        printf("available:        %s -> %s\n", human_bytes(p.mem_available).c_str(), p.fits ? "fits" : "DOES NOT FIT");
    } else {
        printf("available:        unknown\n");
    }
    printf("server flags:     -c %lld -np %d\n", (long long)n_ctx * o.n_parallel, o.n_parallel);
    return p.fits ? 0 : 2;
}

// ============================================================================================
// HTTP server mode (BEGIN) - llama-server's HTTP API; the default mode when no CLI mode is asked for
// ============================================================================================
// Threads: http::Server runs an accept loop and one thread per connection; one scheduler thread owns
// the llm::Context (which is not thread-safe). A handler validates its request, tokenizes it (the
// Vocab is immutable, so any thread may use it) and submits a Task; the scheduler answers through the
// task's Channel, which the handler drains into one JSON body or a server-sent-event stream. A client
// that goes away cancels its task.
//
// Continuous batching: each scheduler step builds ONE Batch holding the next token of every generating
// slot plus prompt chunks of the slots still evaluating their prompt (oldest request first), bounded
// by min(-b, -ub) tokens, calls decode once and samples every slot that finished its input. A long
// prompt is spread over several steps, so the other streams keep producing tokens while it is read.
//
// Prompt cache: a slot keeps the tokens of its last request in its KV sequence. A request goes to the
// idle slot whose cache shares the longest prefix with its prompt (least recently used otherwise) and
// evaluates only the rest (the last prompt token is always evaluated again: it gives the logits).
// With --cache-ram, the tokens a slot is about to overwrite are first saved (seq_save) to an LRU of
// host-RAM blobs, and restored (seq_restore) when a later prompt shares a longer prefix with a blob
// than with its slot.
//
// --kv-unified: all slots share one pool of -c cells (the engine pages it), so one request may use
// all of it. Each step is planned against the free cells: idle slots give their cells back first (their
// tokens go to the RAM cache), and if the running requests alone outgrow the pool, the youngest one is
// stopped (stop_type "limit", or a 503 if it was still reading its prompt) rather than failing a decode.
//
// A full slot never degrades silently: a prompt that cannot fit (with n_predict, when given) is a 400
// at once; generation that reaches the end of the slot stops with stop_type "limit", or with
// --context-shift drops the older half of the tokens after n_keep and evaluates the kept tail again
// (the engine has no in-place RoPE shift, so the kept tokens are re-evaluated at their new positions).

using json = nlohmann::json;

// ---- Logging: "2026-11-29T10:00:00.123Z I message", one line per event, from any thread ----------
std::mutex g_log_mu;

__attribute__((format(printf, 2, 3))) void log_msg(char level, const char* fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tm t;
    gmtime_r(&ts.tv_sec, &t);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &t);
    std::lock_guard<std::mutex> lock(g_log_mu);
    fprintf(stderr, "%s.%03dZ %c %s\n", stamp, (int)(ts.tv_nsec / 1000000), level, msg);
    fflush(stderr);
}

// ---- Signals: the first SIGINT/SIGTERM stops accepting and drains; a second one exits at once ----
std::atomic<bool> g_stop_requested{false};
http::Server* g_http = nullptr;

void on_stop_signal(int) {
    if (g_stop_requested.exchange(true)) _exit(130);
    if (g_http) g_http->stop();  // async-signal-safe: an atomic store and a write to a pipe
}

// ---- Request errors: answered with an OpenAI-style error body -------------------------------------
struct ApiError : std::runtime_error {
    int status;
    std::string type;
    ApiError(int s, const std::string& msg, std::string t = "") : std::runtime_error(msg), status(s), type(std::move(t)) {}
};

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Parses a request body as a JSON object. Nesting is bounded before parsing, so a body of 100000 '['
// costs a scan, not a deep tree.
json parse_body(const std::string& body) {
    if (body.empty()) throw ApiError(400, "the request body is empty (expected a JSON object)");
    int depth = 0;
    bool in_str = false, esc = false;
    for (char c : body) {
        if (in_str) {
            if (esc) esc = false;
            else if (c == '\\') esc = true;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '[' || c == '{') {
            if (++depth > 64) throw ApiError(400, "JSON nesting is deeper than 64 levels");
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    json j;
    try {
        j = json::parse(body);
    } catch (const json::exception& e) {
        throw ApiError(400, std::string("invalid JSON: ") + e.what());
    }
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return j;
}

// Typed fields: absent or null gives the default; a wrong type or a value out of range is a 400.
const json* opt_field(const json& b, const char* k) {
    auto it = b.find(k);
    return it == b.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void bad_field(const char* k, const std::string& what) {
    throw ApiError(400, std::string("'") + k + "' must be " + what);
}

bool get_bool(const json& b, const char* k, bool def) {
    const json* v = opt_field(b, k);
    if (!v) return def;
    if (!v->is_boolean()) bad_field(k, "a boolean");
    return v->get<bool>();
}

int64_t get_int(const json& b, const char* k, int64_t def, int64_t lo, int64_t hi) {
    const json* v = opt_field(b, k);
    if (!v) return def;
    int64_t x = 0;
    if (v->is_number_unsigned()) {
        uint64_t u = v->get<uint64_t>();
        x = u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u;
    } else if (v->is_number_integer()) {
        x = v->get<int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) && std::floor(v->get<double>()) == v->get<double>() &&
               std::fabs(v->get<double>()) < 9e18) {
        x = (int64_t)v->get<double>();
    } else {
        bad_field(k, "an integer");
    }
    if (x < lo || x > hi) bad_field(k, "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
}

double get_num(const json& b, const char* k, double def) {
    const json* v = opt_field(b, k);
    if (!v) return def;
    if (!v->is_number() || !std::isfinite(v->get<double>())) bad_field(k, "a number");
    return v->get<double>();
}

std::string get_str(const json& b, const char* k, const std::string& def) {
    const json* v = opt_field(b, k);
    if (!v) return def;
    if (!v->is_string()) bad_field(k, "a string");
    return v->get<std::string>();
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Bytes at the end of s that start a UTF-8 sequence not complete yet (held back from a stream).
size_t incomplete_utf8_tail(const std::string& s) {
    for (size_t i = 1; i <= std::min<size_t>(4, s.size()); i++) {
        unsigned char c = (unsigned char)s[s.size() - i];
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > i ? i : 0;
    }
    return 0;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t n = 0, m = std::min(a.size(), b.size());
    while (n < m && a[n] == b[n]) n++;
    return n;
}

// ---- Tasks and results -----------------------------------------------------------------------------
struct TaskParams {
    int n_predict = -1, n_probs = 0, id_slot = -1, n_keep = 0;
    bool stream = false, cache_prompt = true, return_tokens = false, ignore_eos = false;
    std::vector<std::string> stop;
    llm::SamplerParams sampling;
};

json params_json(const TaskParams& p) {
    return json{{"n_predict", p.n_predict},
                {"seed", p.sampling.seed},
                {"temperature", p.sampling.temperature},
                {"top_k", p.sampling.top_k},
                {"top_p", p.sampling.top_p},
                {"min_p", p.sampling.min_p},
                {"repeat_last_n", p.sampling.penalty_last_n},
                {"repeat_penalty", p.sampling.repeat_penalty},
                {"presence_penalty", p.sampling.presence_penalty},
                {"frequency_penalty", p.sampling.frequency_penalty},
                {"n_keep", p.n_keep},
                {"n_probs", p.n_probs},
                {"stop", p.stop},
                {"stream", p.stream},
                {"cache_prompt", p.cache_prompt},
                {"ignore_eos", p.ignore_eos}};
}

// What the scheduler sends back: partial results (text as it becomes final) and one final result, or
// an error.
struct Result {
    enum Kind { Partial, Final, Error } kind = Partial;
    std::string text;
    std::vector<int32_t> tokens;
    json probs = json::array();
    // Final
    int slot = -1, n_prompt = 0, n_prompt_evaluated = 0, n_cache_reused = 0, n_predicted = 0, n_cache = 0;
    std::string stop_type = "none", stopping_word;
    bool truncated = false;
    double prompt_ms = 0, predicted_ms = 0;
    // Error
    int status = 500;
    std::string message, err_type;
};

// One task's results, from the scheduler thread to the handler thread.
struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Result> q;
    std::atomic<bool> cancelled{false};
    void push(Result r) {
        {
            std::lock_guard<std::mutex> lock(mu);
            q.push_back(std::move(r));
        }
        cv.notify_one();
    }
    bool pop(Result& r, int timeout_ms) {
        std::unique_lock<std::mutex> lock(mu);
        if (!cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !q.empty(); })) return false;
        r = std::move(q.front());
        q.pop_front();
        return true;
    }
};

struct Task {
    int64_t id = 0;
    std::vector<int32_t> prompt;
    TaskParams p;
    std::shared_ptr<Channel> ch;
};

struct Slot {
    int id = 0;
    std::vector<int32_t> cache;   // the tokens held in KV sequence `id` (always ctx.seq_len(id) of them)
    std::vector<int32_t> target;  // the tokens that must be in the cache before the next sample
    std::unique_ptr<Task> task;   // null when idle
    std::unique_ptr<llm::Sampler> sampler;
    uint64_t last_used = 0;
    bool generating = false;      // the prompt is evaluated; producing tokens
    int n_prompt = 0, n_cache_reused = 0, n_prompt_evaluated = 0, n_decoded = 0, n_shifts = 0;
    std::string text;             // generated so far (cut at a stop string)
    size_t n_sent = 0;            // bytes of text already sent as partial results
    std::vector<int32_t> unsent_tokens;
    json unsent_probs = json::array();
    double t_start = 0, t_first = 0;
    std::string stop_type = "none", stopping_word;
    bool truncated = false;
    size_t pending() const { return target.size() - cache.size(); }
};

// Host-RAM copies of evicted slot states (--cache-ram), least recently used first out.
struct RamCache {
    struct Entry {
        std::vector<int32_t> tokens;
        std::vector<uint8_t> blob;
        uint64_t last_used = 0;
    };
    size_t limit = 0;  // bytes; SIZE_MAX: unbounded, 0: off
    size_t bytes = 0;
    uint64_t clock = 0;
    std::vector<Entry> entries;

    bool enabled() const { return limit > 0; }
    // Keeps tokens/blob unless an entry already holds them (or more of the same sequence); drops
    // entries that are prefixes of it, then the least recently used ones until within the limit.
    void save(std::vector<int32_t> tokens, std::vector<uint8_t> blob) {
        if (!enabled() || blob.size() > limit) return;
        for (auto& e : entries) {
            if (common_prefix(e.tokens, tokens) == tokens.size()) { e.last_used = ++clock; return; }
        }
        for (size_t i = entries.size(); i-- > 0;) {
            if (common_prefix(entries[i].tokens, tokens) == entries[i].tokens.size()) remove(i);
        }
        bytes += blob.size();
        entries.push_back({std::move(tokens), std::move(blob), ++clock});
        while (bytes > limit) {
            size_t lru = 0;
            for (size_t i = 1; i < entries.size(); i++) if (entries[i].last_used < entries[lru].last_used) lru = i;
            remove(lru);
        }
    }
    // The entry sharing the longest prefix with prompt (at least min_len tokens), or nullptr.
    Entry* best(const std::vector<int32_t>& prompt, size_t min_len, size_t* len) {
        Entry* r = nullptr;
        for (auto& e : entries) {
            size_t n = common_prefix(e.tokens, prompt);
            if (n > min_len) { min_len = n; r = &e; }
        }
        if (r) { r->last_used = ++clock; *len = min_len; }
        return r;
    }
    void remove(size_t i) {
        bytes -= entries[i].blob.size();
        entries.erase(entries.begin() + i);
    }
};

// What /slots shows of a slot, copied by the scheduler after each step.
struct SlotView {
    int id = 0, n_past = 0, n_decoded = 0, n_remain = -1, n_prompt = 0;
    int64_t task = -1;
    bool busy = false, has_new_line = false;
    json params;
};

struct Stats {
    uint64_t prompt_tokens = 0, predicted_tokens = 0, n_decode = 0, n_busy_slots = 0, requests_done = 0;
    double prompt_s = 0, predicted_s = 0;
    int64_t kv_tokens = 0;
};

enum class ApiKind { Completion, OaiCompletion, OaiChat };

class LlmServer {
public:
    explicit LlmServer(const Options& o) : o_(o) {}
    int run();

private:
    // ---- setup
    void setup_routes(http::Server& srv);
    void load();
    void choose_chat_template();
    std::string model_id() const { return o_.srv.alias.empty() ? o_.model : o_.srv.alias; }

    // ---- handlers
    void handle_generate(const http::Request& req, http::Response& res, ApiKind kind);
    void handle_tokenize(const http::Request& req, http::Response& res);
    void handle_detokenize(const http::Request& req, http::Response& res);
    void handle_apply_template(const http::Request& req, http::Response& res);
    void handle_props(http::Response& res);
    void handle_slots(const http::Request& req, http::Response& res);
    void handle_metrics(http::Response& res);
    void handle_models(http::Response& res);

    TaskParams parse_params(const json& b, ApiKind kind) const;
    std::vector<int32_t> parse_prompt(const json& prompt) const;
    std::string render_chat(const json& b) const;
    std::vector<int32_t> tokenize_prompt(const std::string& text) const;
    void check_model(const json& b) const;
    json timings_json(const Result& r) const;
    json final_completion(const Result& r, const std::string& content, const std::vector<int32_t>& tokens,
                          const json& probs, const TaskParams& p, const std::vector<int32_t>& prompt) const;

    // ---- queue (handler side)
    std::shared_ptr<Channel> submit(std::vector<int32_t> prompt, const TaskParams& p);
    void cancel(const std::shared_ptr<Channel>& ch);

    // ---- scheduler (its thread only)
    void scheduler_loop();
    Slot* pick_slot(const Task& t, const std::vector<bool>& taken);
    void start_task(Slot& s, std::unique_ptr<Task> t);
    bool step(llm::Batch& batch);
    void on_logits(Slot& s, const float* logits);
    void emit_partial(Slot& s);
    void finish(Slot& s, const std::string& stop_type);
    void fail_slot(Slot& s, int status, const std::string& msg);
    void release(Slot& s);
    void context_shift(Slot& s);
    void publish();
    int pool_room();
    bool make_room(size_t need);
    json prob_json(const float* logits, int32_t tok, const Slot& s) const;

    const Options& o_;
    std::atomic<int> state_{0};  // 0 loading, 1 ready
    std::unique_ptr<llm::Model> model_;
    std::unique_ptr<llm::Context> ctx_;
    llm::ChatFamily chat_family_ = llm::ChatFamily::ChatML;
    std::string chat_template_;  // the Jinja source the family was recognized from ("" if none)
    int n_slots_ = 1, n_ctx_slot_ = 0, n_ctx_total_ = 0, n_vocab_ = 0, budget_ = 512;
    std::atomic<int64_t> next_task_id_{0};
    int64_t created_ = 0;

    // Shared between handlers and the scheduler, under mu_.
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Task>> queue_;
    int n_busy_ = 0;
    bool stop_sched_ = false;
    std::vector<SlotView> views_;
    Stats stats_;

    // Scheduler only.
    std::vector<Slot> slots_;
    RamCache ram_;
    uint64_t use_clock_ = 0;
};

// ---- handlers --------------------------------------------------------------------------------------

void LlmServer::check_model(const json& b) const {
    const json* m = opt_field(b, "model");
    if (!m) return;
    if (!m->is_string()) bad_field("model", "a string");
    std::string name = m->get<std::string>();
    std::string base = o_.model.substr(o_.model.find_last_of('/') + 1);
    std::string stem = ends_with(base, ".gguf") ? base.substr(0, base.size() - 5) : base;
    if (name == model_id() || name == o_.model || name == base || name == stem) return;
    throw ApiError(404, "model '" + name + "' not found (this server serves '" + model_id() + "')", "not_found_error");
}

TaskParams LlmServer::parse_params(const json& b, ApiKind kind) const {
    TaskParams p;
    p.sampling = o_.sampling;
    p.n_predict = o_.n_predict;
    p.n_keep = o_.srv.n_keep;
    p.stream = get_bool(b, "stream", false);
    if (kind != ApiKind::Completion) {
        p.n_predict = (int)get_int(b, "max_tokens", p.n_predict, -1, INT32_MAX);
        p.n_predict = (int)get_int(b, "max_completion_tokens", p.n_predict, -1, INT32_MAX);
        if (get_int(b, "n", 1, 1, INT32_MAX) != 1) throw ApiError(400, "only n = 1 is supported");
    }
    p.n_predict = (int)get_int(b, "n_predict", p.n_predict, -1, INT32_MAX);
    p.sampling.temperature = (float)get_num(b, "temperature", p.sampling.temperature);
    p.sampling.top_k = (int)get_int(b, "top_k", p.sampling.top_k, INT32_MIN, INT32_MAX);
    p.sampling.top_p = (float)get_num(b, "top_p", p.sampling.top_p);
    p.sampling.min_p = (float)get_num(b, "min_p", p.sampling.min_p);
    p.sampling.repeat_penalty = (float)get_num(b, "repeat_penalty", p.sampling.repeat_penalty);
    p.sampling.penalty_last_n = (int)get_int(b, "repeat_last_n", p.sampling.penalty_last_n, -1, INT32_MAX);
    p.sampling.presence_penalty = (float)get_num(b, "presence_penalty", p.sampling.presence_penalty);
    p.sampling.frequency_penalty = (float)get_num(b, "frequency_penalty", p.sampling.frequency_penalty);
    int64_t seed = get_int(b, "seed", -1, -1, INT64_MAX);
    if (seed >= 0) p.sampling.seed = (uint64_t)seed;
    p.n_probs = (int)get_int(b, "n_probs", 0, 0, 100);
    p.cache_prompt = get_bool(b, "cache_prompt", true);
    p.return_tokens = get_bool(b, "return_tokens", false);
    p.ignore_eos = get_bool(b, "ignore_eos", false);
    p.id_slot = (int)get_int(b, "id_slot", -1, -1, n_slots_ - 1);
    p.n_keep = (int)get_int(b, "n_keep", p.n_keep, -1, INT32_MAX);
    if (const json* s = opt_field(b, "stop")) {
        if (s->is_string()) {
            p.stop.push_back(s->get<std::string>());
        } else if (s->is_array()) {
            for (const json& x : *s) {
                if (!x.is_string()) bad_field("stop", "a string or an array of strings");
                p.stop.push_back(x.get<std::string>());
            }
        } else {
            bad_field("stop", "a string or an array of strings");
        }
        p.stop.erase(std::remove(p.stop.begin(), p.stop.end(), std::string()), p.stop.end());
    }
    return p;
}

std::vector<int32_t> LlmServer::tokenize_prompt(const std::string& text) const {
    const llm::Vocab& v = model_->vocab;
    std::vector<int32_t> ids = v.tokenize(text, true, true);
    // A template that writes bos_token itself, tokenized with the model's own BOS: keep one.
    if (ids.size() >= 2 && v.bos() >= 0 && ids[0] == v.bos() && ids[1] == v.bos()) ids.erase(ids.begin());
    return ids;
}

// "prompt": a string, an array of token ids, or an array mixing strings and ids (concatenated; only the
// first string gets BOS); a one-element array of either is the same. Several prompts are refused.
std::vector<int32_t> LlmServer::parse_prompt(const json& pr) const {
    const json* p = &pr;
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
    if (p->is_string()) return tokenize_prompt(p->get<std::string>());
    if (!p->is_array()) bad_field("prompt", "a string or an array of token ids");
    std::vector<int32_t> ids;
    bool first = true;
    for (const json& x : *p) {
        if (x.is_number_integer()) {
            int64_t id = x.get<int64_t>();
            if (x.is_number_unsigned() && x.get<uint64_t>() > (uint64_t)INT32_MAX) id = INT32_MAX;
            if (id < 0 || id >= n_vocab_) {
                throw ApiError(400, "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_vocab_) + ")");
            }
            ids.push_back((int32_t)id);
        } else if (x.is_string()) {
            std::vector<int32_t> t = model_->vocab.tokenize(x.get<std::string>(), first, true);
            ids.insert(ids.end(), t.begin(), t.end());
        } else if (x.is_array()) {
            throw ApiError(400, "more than one prompt per request is not supported");
        } else {
            bad_field("prompt", "a string or an array of token ids");
        }
        first = false;
    }
    return ids;
}

std::string LlmServer::render_chat(const json& b) const {
    const json* m = opt_field(b, "messages");
    if (!m) throw ApiError(400, "'messages' is required");
    if (!m->is_array() || m->empty()) bad_field("messages", "a non-empty array of messages");
    std::vector<llm::ChatMessage> msgs;
    for (const json& x : *m) {
        if (!x.is_object()) bad_field("messages", "an array of objects");
        llm::ChatMessage cm;
        cm.role = get_str(x, "role", "");
        if (cm.role.empty()) throw ApiError(400, "every message needs a 'role' string");
        const json* c = opt_field(x, "content");
        if (!c) {
            cm.content = "";
        } else if (c->is_string()) {
            cm.content = c->get<std::string>();
        } else if (c->is_array()) {  // content parts: the text ones, joined by newlines
            for (const json& part : *c) {
                if (!part.is_object() || get_str(part, "type", "") != "text") {
                    throw ApiError(400, "only text content parts are supported");
                }
                if (!cm.content.empty()) cm.content += "\n";
                cm.content += get_str(part, "text", "");
            }
        } else {
            bad_field("content", "a string or an array of content parts");
        }
        msgs.push_back(std::move(cm));
    }
    llm::ChatOptions opt;
    opt.add_generation_prompt = get_bool(b, "add_generation_prompt", true);
    const llm::Vocab& v = model_->vocab;
    if (v.bos() >= 0) opt.bos_token = v.token_to_piece(v.bos(), true);
    if (v.eos() >= 0) opt.eos_token = v.token_to_piece(v.eos(), true);
    time_t now = time(nullptr);
    tm t;
    localtime_r(&now, &t);
    char date[32];
    strftime(date, sizeof date, "%d %b %Y", &t);
    opt.date_string = date;
    opt.fold_system = true;
    if (const json* kw = opt_field(b, "chat_template_kwargs")) {
        if (!kw->is_object()) bad_field("chat_template_kwargs", "an object");
        if (const json* th = opt_field(*kw, "enable_thinking")) {
            if (!th->is_boolean()) bad_field("enable_thinking", "a boolean");
            opt.enable_thinking = th->get<bool>() ? 1 : 0;
        }
    }
    try {
        return llm::chat_render(chat_family_, msgs, opt);
    } catch (const llm::Error& e) {
        throw ApiError(400, std::string("chat template: ") + e.what());
    }
}

std::shared_ptr<Channel> LlmServer::submit(std::vector<int32_t> prompt, const TaskParams& p) {
    auto t = std::make_unique<Task>();
    t->id = next_task_id_++;
    t->prompt = std::move(prompt);
    t->p = p;
    t->ch = std::make_shared<Channel>();
    auto ch = t->ch;
    {
        std::lock_guard<std::mutex> lock(mu_);
        // Requests that will wait for a slot: the queue beyond the idle slots.
        int waiting = (int)queue_.size() - (n_slots_ - n_busy_);
        if (waiting >= o_.srv.max_queue) {
            throw ApiError(503, "server is busy: " + std::to_string(queue_.size()) + " requests are waiting for a slot (--max-queue " +
                                    std::to_string(o_.srv.max_queue) + ")", "unavailable_error");
        }
        queue_.push_back(std::move(t));
    }
    cv_.notify_one();
    return ch;
}

void LlmServer::cancel(const std::shared_ptr<Channel>& ch) {
    ch->cancelled = true;
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_one();
}

json LlmServer::timings_json(const Result& r) const {
    auto per_tok = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
    auto per_s = [](double ms, int n) { return ms > 0 ? 1000.0 * n / ms : 0.0; };
    return json{{"cache_n", r.n_cache_reused},
                {"prompt_n", r.n_prompt_evaluated},
                {"prompt_ms", r.prompt_ms},
                {"prompt_per_token_ms", per_tok(r.prompt_ms, r.n_prompt_evaluated)},
                {"prompt_per_second", per_s(r.prompt_ms, r.n_prompt_evaluated)},
                {"predicted_n", r.n_predicted},
                {"predicted_ms", r.predicted_ms},
                {"predicted_per_token_ms", per_tok(r.predicted_ms, r.n_predicted)},
                {"predicted_per_second", per_s(r.predicted_ms, r.n_predicted)}};
}

json LlmServer::final_completion(const Result& r, const std::string& content, const std::vector<int32_t>& tokens,
                                 const json& probs, const TaskParams& p, const std::vector<int32_t>& prompt) const {
    json j{{"index", 0},
           {"content", content},
           {"tokens", p.return_tokens ? tokens : std::vector<int32_t>()},
           {"id_slot", r.slot},
           {"stop", true},
           {"model", model_id()},
           {"tokens_predicted", r.n_predicted},
           {"tokens_evaluated", r.n_prompt},
           {"generation_settings", params_json(p)},
           {"prompt", model_->vocab.detokenize(prompt, true)},
           {"has_new_line", content.find('\n') != std::string::npos},
           {"truncated", r.truncated},
           {"stop_type", r.stop_type},
           {"stopping_word", r.stopping_word},
           {"tokens_cached", r.n_cache},
           {"timings", timings_json(r)}};
    if (p.n_probs > 0) j["completion_probabilities"] = probs;
    return j;
}

std::string random_id(const char* prefix) {
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    thread_local std::mt19937_64 rng(std::random_device{}());
    std::string s = prefix;
    for (int i = 0; i < 32; i++) s += alnum[rng() % (sizeof alnum - 1)];
    return s;
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

void LlmServer::handle_generate(const http::Request& req, http::Response& res, ApiKind kind) {
    json b = parse_body(req.body);
    check_model(b);
    TaskParams p = parse_params(b, kind);
    std::vector<int32_t> prompt;
    if (kind == ApiKind::OaiChat) {
        prompt = tokenize_prompt(render_chat(b));
    } else {
        const json* pr = opt_field(b, "prompt");
        if (!pr) throw ApiError(400, "'prompt' is required");
        prompt = parse_prompt(*pr);
    }
    if (prompt.empty()) throw ApiError(400, "the prompt is empty");
    const int n_prompt = (int)prompt.size();
    if (n_prompt >= n_ctx_slot_) {
        throw ApiError(400, "the prompt (" + std::to_string(n_prompt) + " tokens) exceeds the context of a slot (" +
                                std::to_string(n_ctx_slot_) + " tokens); raise -c or lower -np", "exceed_context_size_error");
    }
    if (p.n_predict > 0 && !o_.srv.context_shift && n_prompt + p.n_predict > n_ctx_slot_) {
        throw ApiError(400, "the prompt (" + std::to_string(n_prompt) + " tokens) plus n_predict (" + std::to_string(p.n_predict) +
                                ") exceeds the context of a slot (" + std::to_string(n_ctx_slot_) + " tokens)",
                       "exceed_context_size_error");
    }
    std::shared_ptr<Channel> ch = submit(prompt, p);

    const std::string id = random_id(kind == ApiKind::OaiChat ? "chatcmpl-" : "cmpl-");
    const int64_t created = (int64_t)time(nullptr);
    const std::string model = model_id();
    auto finish_reason = [](const Result& r) { return r.stop_type == "limit" ? "length" : "stop"; };
    auto usage = [](const Result& r) {
        return json{{"completion_tokens", r.n_predicted}, {"prompt_tokens", r.n_prompt}, {"total_tokens", r.n_predicted + r.n_prompt}};
    };
    auto oai_base = [id, created, model](const char* object) {
        return json{{"id", id}, {"created", created}, {"model", model}, {"system_fingerprint", "llm.hpp"}, {"object", object}};
    };

    if (!p.stream) {
        std::string content;
        std::vector<int32_t> tokens;
        json probs = json::array();
        Result r;
        for (;;) {
            if (!ch->pop(r, 100)) {
                if (!req.client_connected()) { cancel(ch); throw ApiError(400, "client disconnected"); }
                continue;
            }
            if (r.kind == Result::Error) { cancel(ch); throw ApiError(r.status, r.message, r.err_type); }
            content += r.text;
            tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
            for (auto& x : r.probs) probs.push_back(std::move(x));
            if (r.kind == Result::Final) break;
        }
        json j;
        if (kind == ApiKind::Completion) {
            j = final_completion(r, content, tokens, probs, p, prompt);
        } else if (kind == ApiKind::OaiCompletion) {
            j = oai_base("text_completion");
            j["choices"] = json::array({json{{"text", content}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(r)}}});
            j["usage"] = usage(r);
            j["timings"] = timings_json(r);
        } else {
            j = oai_base("chat.completion");
            j["choices"] = json::array({json{{"finish_reason", finish_reason(r)},
                                             {"index", 0},
                                             {"message", {{"role", "assistant"}, {"content", content}}}}});
            j["usage"] = usage(r);
            j["timings"] = timings_json(r);
        }
        res.set_json(dump(j));
        return;
    }

    res.stream([=](http::Writer& w) {
        auto chunk = [&](const Result& r, bool last) -> std::string {
            if (kind == ApiKind::Completion) {
                if (last) return sse(final_completion(r, r.text, r.tokens, r.probs, p, prompt));
                json j{{"index", 0}, {"content", r.text}, {"tokens", r.tokens}, {"stop", false}, {"id_slot", -1},
                       {"tokens_predicted", 0}, {"tokens_evaluated", (int)prompt.size()}};
                if (p.n_probs > 0) j["completion_probabilities"] = r.probs;
                return sse(j);
            }
            std::string out;
            json j = oai_base(kind == ApiKind::OaiChat ? "chat.completion.chunk" : "text_completion");
            if (!r.text.empty() || !last) {
                if (kind == ApiKind::OaiChat) {
                    j["choices"] = json::array({json{{"finish_reason", nullptr}, {"index", 0}, {"delta", {{"content", r.text}}}}});
                } else {
                    j["choices"] = json::array({json{{"text", r.text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
                }
                out += sse(j);
            }
            if (last) {
                if (kind == ApiKind::OaiChat) {
                    j["choices"] = json::array({json{{"finish_reason", finish_reason(r)}, {"index", 0}, {"delta", json::object()}}});
                } else {
                    j["choices"] = json::array({json{{"text", ""}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason(r)}}});
                }
                j["usage"] = usage(r);
                j["timings"] = timings_json(r);
                out += sse(j) + "data: [DONE]\n\n";
            }
            return out;
        };
        if (kind == ApiKind::OaiChat) {
            json j = oai_base("chat.completion.chunk");
            j["choices"] = json::array({json{{"finish_reason", nullptr}, {"index", 0}, {"delta", {{"role", "assistant"}, {"content", nullptr}}}}});
            if (!w.write(sse(j))) { cancel(ch); return false; }
        }
        for (;;) {
            Result r;
            if (!ch->pop(r, 100)) {
                if (!w.alive()) { cancel(ch); return false; }
                continue;
            }
            if (r.kind == Result::Error) {
                json e = json::parse(http::error_json(r.status, r.message, r.err_type));
                w.write(kind == ApiKind::Completion ? "error: " + dump(e) + "\n\n" : sse(e));
                return true;
            }
            bool last = r.kind == Result::Final;
            if (!w.write(chunk(r, last))) { cancel(ch); return false; }
            if (last) return true;
        }
    });
}

void LlmServer::handle_tokenize(const http::Request& req, http::Response& res) {
    json b = parse_body(req.body);
    std::string content = get_str(b, "content", "");
    bool add_special = get_bool(b, "add_special", false);
    bool parse_special = get_bool(b, "parse_special", true);
    bool with_pieces = get_bool(b, "with_pieces", false);
    std::vector<int32_t> ids = model_->vocab.tokenize(content, add_special, parse_special);
    json tokens = json::array();
    for (int32_t id : ids) {
        if (!with_pieces) { tokens.push_back(id); continue; }
        std::string piece = model_->vocab.token_to_piece(id, true);
        json pj;
        if (http::is_valid_utf8(piece)) {
            pj = piece;
        } else {
            pj = json::array();
            for (unsigned char c : piece) pj.push_back(c);
        }
        tokens.push_back({{"id", id}, {"piece", pj}});
    }
    res.set_json(dump(json{{"tokens", tokens}}));
}

void LlmServer::handle_detokenize(const http::Request& req, http::Response& res) {
    json b = parse_body(req.body);
    std::vector<int32_t> ids;
    if (const json* t = opt_field(b, "tokens")) {
        if (!t->is_array()) bad_field("tokens", "an array of token ids");
        for (const json& x : *t) {
            if (!x.is_number_integer()) bad_field("tokens", "an array of token ids");
            int64_t id = x.is_number_unsigned() && x.get<uint64_t>() > (uint64_t)INT32_MAX ? INT32_MAX : x.get<int64_t>();
            if (id < 0 || id >= n_vocab_) throw ApiError(400, "token id " + std::to_string(id) + " is outside the vocabulary");
            ids.push_back((int32_t)id);
        }
    }
    res.set_json(dump(json{{"content", model_->vocab.detokenize(ids, true)}}));
}

void LlmServer::handle_apply_template(const http::Request& req, http::Response& res) {
    json b = parse_body(req.body);
    res.set_json(dump(json{{"prompt", render_chat(b)}}));
}

void LlmServer::handle_props(http::Response& res) {
    TaskParams def = parse_params(json::object(), ApiKind::Completion);
    const llm::Vocab& v = model_->vocab;
    json j{{"default_generation_settings",
            {{"id", 0}, {"id_task", -1}, {"n_ctx", n_ctx_slot_}, {"speculative", false}, {"is_processing", false}, {"params", params_json(def)}}},
           {"total_slots", n_slots_},
           {"model_alias", model_id()},
           {"model_path", o_.model},
           {"n_ctx", n_ctx_total_},
           {"chat_template", chat_template_},
           {"chat_template_family", llm::chat_family_name(chat_family_)},
           {"bos_token", v.bos() >= 0 ? v.token_to_piece(v.bos(), true) : ""},
           {"eos_token", v.eos() >= 0 ? v.token_to_piece(v.eos(), true) : ""},
           {"modalities", {{"vision", false}, {"audio", false}}},
           {"build_info", "llm.hpp"}};
    res.set_json(dump(j));
}

void LlmServer::handle_slots(const http::Request& req, http::Response& res) {
    json arr = json::array();
    bool any_idle = false;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (const SlotView& v : views_) {
            any_idle = any_idle || !v.busy;
            arr.push_back({{"id", v.id},
                           {"id_task", v.task},
                           {"n_ctx", n_ctx_slot_},
                           {"speculative", false},
                           {"is_processing", v.busy},
                           {"n_past", v.n_past},
                           {"tokens_cached", v.n_past},
                           {"n_prompt_tokens", v.n_prompt},
                           {"params", v.params},
                           {"next_token",
                            {{"has_next_token", v.busy}, {"has_new_line", v.has_new_line}, {"n_remain", v.n_remain},
                             {"n_decoded", v.n_decoded}, {"stopping_word", ""}}}});
        }
    }
    std::string f = req.param("fail_on_no_slot");
    if (!f.empty() && f != "0" && f != "false" && !any_idle) throw ApiError(503, "no slot available", "unavailable_error");
    res.set_json(dump(arr));
}

void LlmServer::handle_metrics(http::Response& res) {
    Stats s;
    int busy, deferred;
    {
        std::lock_guard<std::mutex> lock(mu_);
        s = stats_;
        busy = n_busy_;
        deferred = std::max(0, (int)queue_.size() - (n_slots_ - n_busy_));
    }
    std::string out;
    auto metric = [&](const char* type, const char* name, const char* help, double value) {
        char line[128];
        snprintf(line, sizeof line, "%.10g", value);
        out += std::string("# HELP llamacpp:") + name + " " + help + "\n# TYPE llamacpp:" + name + " " + type + "\nllamacpp:" + name + " " + line + "\n";
    };
    metric("counter", "prompt_tokens_total", "Number of prompt tokens processed.", (double)s.prompt_tokens);
    metric("counter", "prompt_seconds_total", "Prompt process time", s.prompt_s);
    metric("counter", "tokens_predicted_total", "Number of generation tokens processed.", (double)s.predicted_tokens);
    metric("counter", "tokens_predicted_seconds_total", "Predict process time", s.predicted_s);
    metric("counter", "n_decode_total", "Total number of llama_decode() calls", (double)s.n_decode);
    metric("counter", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
           s.n_decode ? (double)s.n_busy_slots / s.n_decode : 0.0);
    metric("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.", s.prompt_s > 0 ? s.prompt_tokens / s.prompt_s : 0.0);
    metric("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.",
           s.predicted_s > 0 ? s.predicted_tokens / s.predicted_s : 0.0);
    metric("gauge", "kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.",
           (double)s.kv_tokens / std::max(1, n_ctx_total_));
    metric("gauge", "kv_cache_tokens", "KV-cache tokens.", (double)s.kv_tokens);
    metric("gauge", "requests_processing", "Number of requests processing.", busy);
    metric("gauge", "requests_deferred", "Number of requests deferred.", deferred);
    res.set_content(out, "text/plain; version=0.0.4");
}

void LlmServer::handle_models(http::Response& res) {
    const llm::HParams& hp = model_->hp;
    json meta{{"vocab_type", model_->vocab.model_type()}, {"n_vocab", n_vocab_},     {"n_ctx_train", hp.n_ctx_train},
              {"n_embd", hp.n_embd},                      {"n_params", model_->n_params()}, {"size", model_->weight_bytes()}};
    json m{{"id", model_id()}, {"object", "model"}, {"created", created_}, {"owned_by", "llamacpp"}, {"meta", meta}};
    res.set_json(dump(json{{"object", "list"}, {"data", json::array({m})}}));
}

void LlmServer::setup_routes(http::Server& srv) {
    // Errors a handler raises become OpenAI-style error bodies; the server keeps serving.
    auto wrap = [](std::function<void(const http::Request&, http::Response&)> fn) {
        return [fn](const http::Request& req, http::Response& res) {
            try {
                fn(req, res);
            } catch (const ApiError& e) {
                res = http::Response();
                res.set_error(e.status, e.what(), e.type);
            } catch (const llm::Error& e) {
                res = http::Response();
                res.set_error(400, e.what());
            }
        };
    };
    auto health = [this](const http::Request&, http::Response& res) {
        if (state_.load() == 1) res.set_json("{\"status\":\"ok\"}");
        else res.set_error(503, "Loading model", "unavailable_error");
    };
    srv.route("GET", "/health", health);
    srv.route("GET", "/v1/health", health);
    auto gen = [&](ApiKind k) { return wrap([this, k](const http::Request& q, http::Response& r) { handle_generate(q, r, k); }); };
    for (const char* p : {"/completion", "/completions"}) srv.route("POST", p, gen(ApiKind::Completion));
    srv.route("POST", "/v1/completions", gen(ApiKind::OaiCompletion));
    for (const char* p : {"/chat/completions", "/v1/chat/completions"}) srv.route("POST", p, gen(ApiKind::OaiChat));
    srv.route("POST", "/tokenize", wrap([this](const http::Request& q, http::Response& r) { handle_tokenize(q, r); }));
    srv.route("POST", "/detokenize", wrap([this](const http::Request& q, http::Response& r) { handle_detokenize(q, r); }));
    srv.route("POST", "/apply-template", wrap([this](const http::Request& q, http::Response& r) { handle_apply_template(q, r); }));
    srv.route("GET", "/props", wrap([this](const http::Request&, http::Response& r) { handle_props(r); }));
    srv.route("GET", "/slots", wrap([this](const http::Request& q, http::Response& r) { handle_slots(q, r); }));
    srv.route("GET", "/metrics", wrap([this](const http::Request&, http::Response& r) { handle_metrics(r); }));
    for (const char* p : {"/models", "/v1/models"}) srv.route("GET", p, wrap([this](const http::Request&, http::Response& r) { handle_models(r); }));

    if (!o_.srv.api_key.empty()) {
        const std::string key = o_.srv.api_key;
        srv.set_auth([key](const http::Request& r) {
            if (r.path == "/health" || r.path == "/v1/health") return true;
            std::string given = r.header("x-api-key");
            std::string auth = r.header("authorization");
            if (given.empty() && auth.size() > 7 && http::detail::iequals(auth.substr(0, 7), "bearer ")) given = auth.substr(7);
            unsigned diff = given.size() != key.size();  // compare without an early exit
            for (size_t i = 0; i < given.size(); i++) diff |= (unsigned)(given[i] ^ key[i % key.size()]);
            return diff == 0;
        });
    }
    // While the model loads, everything but /health answers 503.
    srv.set_pre_route([this](const http::Request& r, http::Response& res) {
        if (state_.load() == 1 || r.path == "/health" || r.path == "/v1/health") return true;
        res.set_error(503, "Loading model", "unavailable_error");
        return false;
    });
    srv.set_logger([](const http::Request& r, const http::Response& res) {
        if (res.status == 200 && (r.path == "/health" || r.path == "/v1/health")) return;
        log_msg('I', "http: %s:%d %s %s -> %d", r.remote_addr.c_str(), r.remote_port, r.method.c_str(), r.path.c_str(), res.status);
    });
}

// ---- scheduler -------------------------------------------------------------------------------------

Slot* LlmServer::pick_slot(const Task& t, const std::vector<bool>& taken) {
    if (t.p.id_slot >= 0) {
        Slot& s = slots_[t.p.id_slot];
        return s.task || taken[s.id] ? nullptr : &s;
    }
    Slot *best = nullptr, *lru = nullptr;
    size_t best_len = 0;
    for (Slot& s : slots_) {
        if (s.task || taken[s.id]) continue;
        size_t n = t.p.cache_prompt ? common_prefix(s.cache, t.prompt) : 0;
        if (n > best_len || (n == best_len && best && s.last_used < best->last_used)) {
            if (n > 0) { best = &s; best_len = n; }
        }
        if (!lru || s.last_used < lru->last_used) lru = &s;
    }
    return best ? best : lru;
}

void LlmServer::start_task(Slot& s, std::unique_ptr<Task> t) {
    const std::vector<int32_t>& prompt = t->prompt;
    size_t reuse = t->p.cache_prompt ? common_prefix(s.cache, prompt) : 0;
    if (ram_.enabled()) {
        // What this request would overwrite goes to host RAM first; a saved state sharing a longer
        // prefix with the prompt comes back.
        if (s.cache.size() > reuse && s.cache.size() >= 16) ram_.save(s.cache, ctx_->seq_save(s.id, (int)s.cache.size()));
        size_t len = 0;
        if (t->p.cache_prompt) {
            RamCache::Entry* e = ram_.best(prompt, reuse, &len);
            // In a unified pool, only when the cells are free anyway (a restore must not push out
            // running requests).
            if (e && (int)(e->tokens.size() + s.cache.size()) <= pool_room()) {
                try {
                    ctx_->seq_restore(s.id, e->blob);
                    s.cache = e->tokens;
                    reuse = len;
                    log_msg('I', "slot %d: restored %zu tokens from the RAM cache (%zu of them reused)", s.id, e->tokens.size(), len);
                } catch (const llm::Error& err) {  // the sequence is empty now
                    log_msg('W', "slot %d: RAM cache restore failed: %s", s.id, err.what());
                    s.cache.clear();
                    reuse = 0;
                }
            }
        }
    }
    if (reuse >= prompt.size()) reuse = prompt.size() - 1;  // the last prompt token gives the logits
    ctx_->seq_truncate(s.id, (int)reuse);
    s.cache.resize(reuse);
    s.target = prompt;
    s.sampler = std::make_unique<llm::Sampler>(t->p.sampling);
    for (int32_t tok : prompt) s.sampler->accept(tok);
    s.generating = false;
    s.n_prompt = (int)prompt.size();
    s.n_cache_reused = (int)reuse;
    s.n_prompt_evaluated = s.n_decoded = s.n_shifts = 0;
    s.text.clear();
    s.n_sent = 0;
    s.unsent_tokens.clear();
    s.unsent_probs = json::array();
    s.t_start = llm::now_seconds();
    s.t_first = 0;
    s.stop_type = "none";
    s.stopping_word.clear();
    s.truncated = false;
    log_msg('I', "slot %d: task %lld: prompt %zu tokens, %zu cached, n_predict %d", s.id, (long long)t->id, prompt.size(), reuse,
            t->p.n_predict);
    s.task = std::move(t);
}

void LlmServer::release(Slot& s) {
    s.task.reset();
    s.generating = false;
    s.target = s.cache;
    s.last_used = ++use_clock_;
    std::lock_guard<std::mutex> lock(mu_);
    n_busy_--;
}

void LlmServer::fail_slot(Slot& s, int status, const std::string& msg) {
    Result r;
    r.kind = Result::Error;
    r.status = status;
    r.message = msg;
    s.task->ch->push(std::move(r));
    release(s);
}

// Sends the generated text that is final: not the start of a possible stop string, not an incomplete
// UTF-8 sequence.
void LlmServer::emit_partial(Slot& s) {
    size_t hold = incomplete_utf8_tail(s.text);
    for (const std::string& stop : s.task->p.stop) {
        for (size_t k = std::min(stop.size() - 1, s.text.size()); k > hold; k--) {
            if (s.text.compare(s.text.size() - k, k, stop, 0, k) == 0) { hold = k; break; }
        }
    }
    size_t end = std::max(s.n_sent, s.text.size() - hold);
    if (end == s.n_sent) return;
    Result r;
    r.text = s.text.substr(s.n_sent, end - s.n_sent);
    r.tokens.swap(s.unsent_tokens);
    r.probs = std::move(s.unsent_probs);
    s.unsent_probs = json::array();
    s.n_sent = end;
    s.task->ch->push(std::move(r));
}

json LlmServer::prob_json(const float* logits, int32_t tok, const Slot& s) const {
    const llm::Vocab& v = model_->vocab;
    float mx = *std::max_element(logits, logits + n_vocab_);
    double sum = 0;
    for (int i = 0; i < n_vocab_; i++) sum += std::exp((double)logits[i] - mx);
    auto entry = [&](int32_t id, double logprob) {
        std::string piece = v.token_to_piece(id, true);
        json bytes = json::array();
        for (unsigned char c : piece) bytes.push_back(c);
        return json{{"id", id}, {"token", piece}, {"bytes", bytes}, {"logprob", logprob}};
    };
    json j = entry(tok, (double)logits[tok] - mx - std::log(sum));
    json top = json::array();
    for (auto [id, p] : s.sampler->top_probs(logits, n_vocab_, s.task->p.n_probs)) top.push_back(entry(id, std::log((double)p)));
    j["top_logprobs"] = top;
    return j;
}

void LlmServer::finish(Slot& s, const std::string& stop_type) {
    const double now = llm::now_seconds();
    if (s.t_first == 0) s.t_first = now;
    Result r;
    r.kind = Result::Final;
    r.text = s.n_sent < s.text.size() ? s.text.substr(s.n_sent) : "";
    r.tokens.swap(s.unsent_tokens);
    r.probs = std::move(s.unsent_probs);
    s.unsent_probs = json::array();
    r.slot = s.id;
    r.n_prompt = s.n_prompt;
    r.n_prompt_evaluated = s.n_prompt_evaluated;
    r.n_cache_reused = s.n_cache_reused;
    r.n_predicted = s.n_decoded;
    r.n_cache = (int)s.cache.size();
    r.stop_type = stop_type;
    r.stopping_word = s.stopping_word;
    r.truncated = s.truncated;
    r.prompt_ms = (s.t_first - s.t_start) * 1000;
    r.predicted_ms = (now - s.t_first) * 1000;
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.prompt_tokens += s.n_prompt_evaluated;
        stats_.prompt_s += r.prompt_ms / 1000;
        stats_.predicted_tokens += s.n_decoded;
        stats_.predicted_s += r.predicted_ms / 1000;
        stats_.requests_done++;
    }
    log_msg('I', "slot %d: task %lld done (%s): prompt %d tokens, %d evaluated in %.1f ms; %d predicted in %.1f ms (%.2f tokens/s)%s",
            s.id, (long long)s.task->id, stop_type.c_str(), s.n_prompt, s.n_prompt_evaluated, r.prompt_ms, s.n_decoded, r.predicted_ms,
            r.predicted_ms > 0 ? 1000.0 * s.n_decoded / r.predicted_ms : 0.0,
            s.n_shifts ? (", " + std::to_string(s.n_shifts) + " context shifts").c_str() : "");
    s.task->ch->push(std::move(r));
    release(s);
}

// --context-shift: the slot is full. Keep the first n_keep tokens, drop half of the rest, and evaluate
// the kept tail again at its new positions (re-evaluation stands in for a RoPE shift of the cache).
void LlmServer::context_shift(Slot& s) {
    const int n_cached = (int)s.cache.size();
    int n_keep = s.task->p.n_keep < 0 ? s.n_prompt : s.task->p.n_keep;
    n_keep = std::max(0, std::min(n_keep, n_cached - 2));
    const int n_discard = (n_cached - n_keep) / 2;
    std::vector<int32_t> t(s.target.begin(), s.target.begin() + n_keep);
    t.insert(t.end(), s.target.begin() + n_keep + n_discard, s.target.end());
    s.target = std::move(t);
    ctx_->seq_truncate(s.id, n_keep);
    s.cache.resize(n_keep);
    s.n_shifts++;
    log_msg('I', "slot %d: context shift: keep %d, discard %d, evaluate %zu tokens again", s.id, n_keep, n_discard, s.pending());
}

void LlmServer::on_logits(Slot& s, const float* logits) {
    const TaskParams& p = s.task->p;
    if (!s.generating) {
        s.generating = true;
        s.t_first = llm::now_seconds();
        if (p.n_predict == 0) return finish(s, "limit");
    }
    const int32_t tok = s.sampler->sample(logits, n_vocab_);
    s.sampler->accept(tok);
    s.n_decoded++;
    if (p.n_probs > 0) s.unsent_probs.push_back(prob_json(logits, tok, s));
    const llm::Vocab& v = model_->vocab;
    if (v.is_eog(tok) && !p.ignore_eos) return finish(s, "eos");
    s.unsent_tokens.push_back(tok);
    const size_t before = s.text.size();
    s.text += v.token_to_piece(tok, false);
    size_t stop_at = std::string::npos;
    for (const std::string& stop : p.stop) {  // the earliest match that ends in the new piece
        size_t at = s.text.find(stop, before > stop.size() ? before - stop.size() : 0);
        if (at < stop_at) { stop_at = at; s.stopping_word = stop; }
    }
    if (stop_at != std::string::npos) {
        s.text.resize(stop_at);
        s.n_sent = std::min(s.n_sent, stop_at);
        return finish(s, "word");
    }
    if (p.n_predict > 0 && s.n_decoded >= p.n_predict) return finish(s, "limit");
    s.target.push_back(tok);
    if ((int)s.cache.size() >= n_ctx_slot_) {  // no cell left for the token just sampled
        if (!o_.srv.context_shift) {
            s.target.pop_back();
            log_msg('W', "slot %d: context full (%d tokens): stopping", s.id, n_ctx_slot_);
            return finish(s, "limit");
        }
        context_shift(s);
    }
    emit_partial(s);
}

// One scheduler step: one Batch, one decode. Returns false when there was nothing to evaluate.
bool LlmServer::step(llm::Batch& batch) {
    struct Part { Slot* s; size_t n; bool logits; };
    std::vector<Part> parts;
    batch.clear();
    size_t n_next = 0;  // generating slots: one token each
    for (Slot& s : slots_) n_next += s.task && s.pending() == 1;
    if (!make_room(std::max<size_t>(n_next, 1))) return false;
    size_t budget = std::min((size_t)budget_, (size_t)pool_room());
    auto add = [&](Slot& s, size_t n) {
        const size_t from = s.cache.size();
        const bool logits = n == s.pending();
        for (size_t i = 0; i < n; i++) batch.add(s.target[from + i], (int32_t)(from + i), s.id, logits && i == n - 1);
        parts.push_back({&s, n, logits});
        budget -= n;
    };
    // The next token of every generating slot first, then prompt chunks, oldest request first.
    for (Slot& s : slots_) {
        if (s.task && s.pending() == 1 && budget > 0) add(s, 1);
    }
    std::vector<Slot*> prefill;
    for (Slot& s : slots_) {
        if (s.task && s.pending() > 1) prefill.push_back(&s);
    }
    std::sort(prefill.begin(), prefill.end(), [](Slot* a, Slot* b) { return a->task->id < b->task->id; });
    for (Slot* s : prefill) {
        if (budget == 0) break;
        add(*s, std::min(budget, s->pending()));
    }
    if (parts.empty()) return false;
    try {
        ctx_->decode(batch);
    } catch (const llm::Error& e) {
        log_msg('E', "decode failed: %s", e.what());
        for (Part& pt : parts) {
            pt.s->cache.resize(ctx_->seq_len(pt.s->id));
            fail_slot(*pt.s, 500, std::string("decode failed: ") + e.what());
        }
        return true;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.n_decode++;
        stats_.n_busy_slots += n_busy_;
    }
    int li = 0;
    for (Part& pt : parts) {
        Slot& s = *pt.s;
        const size_t from = s.cache.size();
        s.cache.insert(s.cache.end(), s.target.begin() + from, s.target.begin() + from + pt.n);
        if (!s.generating) s.n_prompt_evaluated += (int)pt.n;
        if (pt.logits) on_logits(s, ctx_->logits(li++));
    }
    return true;
}

// Cells a step may still add (unified pool): the free pages, less one page for each running slot
// whose next token may open a new page. Split mode: unbounded here (the per-slot checks guard it).
int LlmServer::pool_room() {
    if (!o_.srv.kv_unified) return INT32_MAX;
    const int page = ctx_->kv_page_size();
    int opening = 0;
    for (const Slot& s : slots_) opening += s.task && s.cache.size() % page == 0;
    return std::max(0, ctx_->n_cells_free() - page * opening);
}

// Frees pool cells until `need` fit: idle slots' caches first (least recently used; they go to the
// RAM cache), then the youngest running request is stopped. False when no request is left to run.
bool LlmServer::make_room(size_t need) {
    while ((size_t)pool_room() < need) {
        Slot* idle = nullptr;
        for (Slot& s : slots_) {
            if (!s.task && !s.cache.empty() && (!idle || s.last_used < idle->last_used)) idle = &s;
        }
        if (idle) {
            if (ram_.enabled() && idle->cache.size() >= 16) ram_.save(idle->cache, ctx_->seq_save(idle->id, (int)idle->cache.size()));
            log_msg('I', "slot %d: %zu cached tokens evicted to make room in the KV pool", idle->id, idle->cache.size());
            ctx_->seq_truncate(idle->id, 0);
            idle->cache.clear();
            idle->target.clear();
            continue;
        }
        Slot* young = nullptr;
        for (Slot& s : slots_) {
            if (s.task && (!young || s.task->id > young->task->id)) young = &s;
        }
        if (!young) return false;
        log_msg('W', "slot %d: the KV pool is full (%d of %d cells used): stopping task %lld", young->id, ctx_->n_cells_used(),
                ctx_->n_ctx(), (long long)young->task->id);
        if (young->generating) {
            young->target.resize(young->cache.size());
            finish(*young, "limit");
        } else {
            fail_slot(*young, 503, "the KV cache pool is full: try again later");
        }
        size_t n_next = 0, n_busy = 0;
        for (Slot& s : slots_) {
            n_next += s.task && s.pending() == 1;
            n_busy += s.task != nullptr;
        }
        if (n_busy == 0) return false;
        need = std::max<size_t>(n_next, 1);
    }
    return true;
}

void LlmServer::publish() {
    std::vector<SlotView> views(slots_.size());
    int64_t kv = 0;
    for (size_t i = 0; i < slots_.size(); i++) {
        const Slot& s = slots_[i];
        SlotView& v = views[i];
        v.id = s.id;
        v.n_past = (int)s.cache.size();
        kv += v.n_past;
        v.busy = s.task != nullptr;
        if (v.busy) {
            v.task = s.task->id;
            v.n_decoded = s.n_decoded;
            v.n_prompt = s.n_prompt;
            v.n_remain = s.task->p.n_predict < 0 ? -1 : s.task->p.n_predict - s.n_decoded;
            v.has_new_line = s.text.find('\n') != std::string::npos;
            v.params = params_json(s.task->p);
        } else {
            v.params = json::object();
        }
    }
    std::lock_guard<std::mutex> lock(mu_);
    views_ = std::move(views);
    stats_.kv_tokens = kv;
}

void LlmServer::scheduler_loop() {
    llm::Batch batch;
    for (;;) {
        std::vector<std::pair<Slot*, std::unique_ptr<Task>>> starts;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_sched_ || !queue_.empty() || n_busy_ > 0; });
            if (stop_sched_) break;
            // Waiting requests go to idle slots in arrival order; cancelled ones are dropped.
            std::vector<bool> taken(slots_.size(), false);
            for (auto it = queue_.begin(); it != queue_.end();) {
                if ((*it)->ch->cancelled) { it = queue_.erase(it); continue; }
                Slot* s = pick_slot(**it, taken);
                if (!s) { ++it; continue; }
                taken[s->id] = true;
                n_busy_++;
                starts.emplace_back(s, std::move(*it));
                it = queue_.erase(it);
            }
        }
        for (auto& st : starts) start_task(*st.first, std::move(st.second));
        for (Slot& s : slots_) {
            if (s.task && s.task->ch->cancelled) {
                log_msg('I', "slot %d: task %lld cancelled (client gone)", s.id, (long long)s.task->id);
                release(s);
            }
        }
        step(batch);
        publish();
    }
    for (Slot& s : slots_) {
        if (s.task) fail_slot(s, 503, "the server is shutting down");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : queue_) {
        Result r;
        r.kind = Result::Error;
        r.status = 503;
        r.message = "the server is shutting down";
        t->ch->push(std::move(r));
    }
    queue_.clear();
}

// ---- lifecycle -------------------------------------------------------------------------------------

void LlmServer::choose_chat_template() {
    std::string from;
    if (!o_.srv.chat_template.empty()) {
        chat_family_ = llm::chat_family_from_name(o_.srv.chat_template);  // checked at startup
        log_msg('I', "chat template: %s (--chat-template)", llm::chat_family_name(chat_family_).c_str());
        return;
    }
    if (!o_.srv.chat_template_file.empty()) {
        chat_template_ = read_file(o_.srv.chat_template_file);
        from = o_.srv.chat_template_file;
    } else {
        chat_template_ = model_->gguf->get_str("tokenizer.chat_template");
        from = "the model's tokenizer.chat_template";
    }
    chat_family_ = chat_template_.empty() ? llm::ChatFamily::Unknown : llm::chat_detect_family(chat_template_);
    if (chat_family_ == llm::ChatFamily::Unknown) {
        log_msg('W', "chat template of %s is %s: falling back to chatml", from.c_str(), chat_template_.empty() ? "absent" : "not recognized");
        chat_family_ = llm::ChatFamily::ChatML;
    } else {
        log_msg('I', "chat template: %s (from %s)", llm::chat_family_name(chat_family_).c_str(), from.c_str());
    }
}

void LlmServer::load() {
    double t0 = llm::now_seconds();
    model_ = llm::Model::load(o_.model, model_options(o_));
    const llm::HParams& hp = model_->hp;
    log_msg('I', "loaded %s: %s, %d layers, n_embd %d, vocab %d, %.1fM params, weights %.2f MiB, %.0f ms", o_.model.c_str(),
            model_->arch_str.c_str(), hp.n_layer, hp.n_embd, hp.n_vocab, model_->n_params() / 1e6, mib(model_->weight_bytes()),
            (llm::now_seconds() - t0) * 1000);
    if (!model_->vocab.has_tokenizer()) log_msg('W', "the model has no tokenizer: only prompts of token ids will work");
    n_vocab_ = hp.n_vocab;
    llm::ContextParams cp = context_params(o_, o_.n_ctx);
    cp.n_seq = n_slots_;
    cp.kv_unified = o_.srv.kv_unified;
    ctx_ = std::make_unique<llm::Context>(*model_, cp);
    n_ctx_slot_ = ctx_->n_ctx_seq();
    n_ctx_total_ = ctx_->n_ctx();
    log_msg('I', "kv cache: %d slots, %s of %d tokens, %.2f MiB (K %s, V %s); %d threads; %d tokens per step", n_slots_,
            o_.srv.kv_unified ? "one shared pool" : "each", o_.srv.kv_unified ? n_ctx_total_ : n_ctx_slot_, mib(ctx_->kv_bytes()),
            llm::type_info(o_.type_k).name, llm::type_info(o_.type_v).name, ctx_->n_threads(), budget_);
    choose_chat_template();
    slots_.resize(n_slots_);
    for (int i = 0; i < n_slots_; i++) slots_[i].id = i;
    ram_.limit = o_.srv.cache_ram_mib < 0 ? SIZE_MAX : (size_t)o_.srv.cache_ram_mib << 20;
    if (o_.srv.warmup) {  // touch every weight once, so the first request does not pay for page-ins
        t0 = llm::now_seconds();
        llm::Batch b;
        b.add(model_->vocab.bos() >= 0 ? model_->vocab.bos() : 0, 0, 0, true);
        ctx_->decode(b);
        ctx_->seq_truncate(0, 0);
        log_msg('I', "warm-up done in %.0f ms", (llm::now_seconds() - t0) * 1000);
    }
    publish();
}

int LlmServer::run() {
    const ServerOptions& so = o_.srv;
    if (so.port < 0 || so.port > 65535) usage_error("--port must be in 0..65535");
    if (so.n_ubatch <= 0) usage_error("--ubatch-size must be positive");
    if (so.max_queue < 0 || so.shutdown_grace_s < 0 || so.timeout_s <= 0 || so.max_connections <= 0) {
        usage_error("--max-queue and --shutdown-grace must not be negative, --timeout and --max-connections must be positive");
    }
    if (!so.chat_template.empty()) {
        try {
            llm::chat_family_from_name(so.chat_template);
        } catch (const llm::Error&) {
            std::string names;
            for (const std::string& n : llm::chat_family_names()) names += " " + n;
            usage_error("unknown --chat-template '" + so.chat_template + "'; known:" + names);
        }
    }
    n_slots_ = o_.n_parallel;
    budget_ = std::max(1, std::min(o_.n_batch, so.n_ubatch));
    created_ = (int64_t)time(nullptr);

    http::Options ho;
    ho.host = so.host;
    ho.port = so.port;
    ho.write_timeout_ms = so.timeout_s * 1000;
    ho.shutdown_grace_ms = so.shutdown_grace_s * 1000;
    ho.max_connections = so.max_connections;
    ho.server_name = "llm-server";
    http::Server srv(ho);
    setup_routes(srv);
    try {
        srv.listen();
    } catch (const std::exception& e) {
        log_msg('E', "%s", e.what());
        return 1;
    }
    // The listener is up before the model loads: /health answers 503 meanwhile.
    log_msg('I', "listening on %s:%d", so.host.c_str(), srv.port());
    g_http = &srv;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    if (g_stop_requested) srv.stop();
    std::thread http_thread([&] { srv.run(); });

    int rc = 0;
    std::thread sched;
    try {
        load();
    } catch (const std::exception& e) {
        log_msg('E', "cannot start: %s", e.what());
        rc = 1;
        srv.stop();
    }
    if (rc == 0 && !g_stop_requested) {
        state_ = 1;
        sched = std::thread([this] { scheduler_loop(); });
        log_msg('I', "ready: %d slots of %d tokens, model '%s' at http://%s:%d", n_slots_, n_ctx_slot_, model_id().c_str(),
                so.host.c_str(), srv.port());
    }
    http_thread.join();  // after stop(): in-flight requests finished, or cut after --shutdown-grace
    if (g_stop_requested) log_msg('I', "stopping: connections drained");
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_sched_ = true;
    }
    cv_.notify_all();
    if (sched.joinable()) sched.join();
    g_http = nullptr;
    log_msg('I', "stopped");
    return rc;
}

bool wants_server(const Options& o) {
    return !o.tokenize && !o.plan && !o.bench && o.dump_logits.empty() && o.perplexity_file.empty() && !o.has_prompt &&
           !o.has_prompt_ids && o.prompt_file.empty();
}

int run_server(const Options& o) {
    LlmServer server(o);
    return server.run();
}

// ============================================================================================
// HTTP server mode (END)
// ============================================================================================

}  // namespace

int main(int argc, char** argv) {
    Options o = parse_args(argc, argv);
    try {
        if (o.tokenize) return run_tokenize(o);
        if (o.plan) return run_plan(o);
        if (wants_server(o)) return run_server(o);
        double t0 = llm::now_seconds();
        auto model = llm::Model::load(o.model, model_options(o));
        fprintf(stderr, "loaded %s: %s, %d layers, n_embd %d, %d heads (%d kv), vocab %d, %.1fM params, "
                        "weights %.2f MiB, %.0f ms\n",
                o.model.c_str(), model->arch_str.c_str(), model->hp.n_layer, model->hp.n_embd, model->hp.n_head,
                model->hp.n_head_kv, model->hp.n_vocab, model->n_params() / 1e6, mib(model->weight_bytes()),
                (llm::now_seconds() - t0) * 1000);
        if (!o.dump_logits.empty()) return run_dump_logits(o, *model);
        if (!o.perplexity_file.empty()) return run_perplexity(o, *model);
        if (o.bench) return run_bench(o, *model);
        if (o.has_prompt || o.has_prompt_ids || !o.prompt_file.empty()) return run_complete(o, *model);
        usage_error("nothing to do: give -p PROMPT, --prompt-ids, --tokenize, --dump-logits or --bench");
    } catch (const std::exception& e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
