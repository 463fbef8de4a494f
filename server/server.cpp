// llm-server's HTTP mode: listening, loading, signals and shutdown (see server.hpp).
#include "server.hpp"

#include <atomic>
#include <csignal>
#include <cstdint>
#include <memory>
#include <thread>

#include <unistd.h>

#include "../http.hpp"
#include "api.hpp"
#include "scheduler.hpp"
#include "util.hpp"

namespace srv {

namespace {

// ---- Signals: the first SIGINT/SIGTERM stops accepting and drains; a second one exits at once with
// status 1 and llama-server's message ----
std::atomic<bool> g_stop_requested{false};
http::Server* g_http = nullptr;

void on_stop_signal(int) {
    if (g_stop_requested.exchange(true)) {
        static const char msg[] = "Received second interrupt, terminating immediately.\n";
        (void)!write(2, msg, sizeof msg - 1);
        _exit(1);
    }
    if (g_http) g_http->stop();  // async-signal-safe: an atomic store and a write to a pipe
}

// Flags the server mode checks before it listens.
void check_server_options(const ServerOptions& so) {
    if (so.port < 0 || so.port > 65535) usage_error("--port must be in 0..65535");
    if (so.n_ubatch <= 0) usage_error("--ubatch-size must be positive");
    if (so.cache_reuse < 0) usage_error("--cache-reuse must not be negative");
    if (so.max_queue < 0 || so.shutdown_grace_s < 0 || so.timeout_s <= 0 || so.max_connections <= 0 ||
        so.max_connections_per_client < 0) {
        usage_error("--max-queue, --shutdown-grace and --max-connections-per-client must not be negative, --timeout and --max-connections must be positive");
    }
}

// llama-server's built-in template names (llama_chat_apply_template's list).
const char* const kLlamaTemplateNames[] = {
    "bailing", "bailing-think", "bailing2", "chatglm3", "chatglm4", "chatml", "command-r", "deepseek", "deepseek-ocr", "deepseek2",
    "deepseek3", "exaone-moe", "exaone3", "exaone4", "falcon3", "gemma", "gigachat", "glmedge", "gpt-oss", "granite", "granite-4.0",
    "granite-4.1", "grok-2", "hunyuan-dense", "hunyuan-moe", "hunyuan-vl", "kimi-k2", "llama2", "llama2-sys", "llama2-sys-bos",
    "llama2-sys-strip", "llama3", "llama4", "megrez", "minicpm", "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7",
    "mistral-v7-tekken", "monarch", "openchat", "orion", "pangu-embedded", "phi3", "phi4", "rwkv-world", "seed_oss", "smolvlm",
    "solar-open", "vicuna", "vicuna-orca", "yandex", "zephyr"};

// --chat-template VALUE: one of our family names; else a llama-server built-in name this build does
// not render (chatml, with a warning); else the text of a Jinja template, recognized like a file's.
ChatTemplate template_from_flag(const std::string& value) {
    ChatTemplate chat;
    try {
        chat.family = llm::chat_family_from_name(value);
        log_msg('I', "chat template: %s (--chat-template)", llm::chat_family_name(chat.family).c_str());
        return chat;
    } catch (const llm::Error&) {
    }
    for (const char* name : kLlamaTemplateNames) {
        if (value == name) {
            log_msg('W', "chat template '%s' (a llama-server built-in) is not rendered by this build: using chatml", name);
            return chat;
        }
    }
    chat.source = value;
    chat.family = llm::chat_detect_family(value);
    if (chat.family == llm::ChatFamily::Unknown) {
        log_msg('W', "--chat-template is not a known name and its Jinja text is not recognized: falling back to chatml");
        chat.family = llm::ChatFamily::ChatML;
    } else {
        log_msg('I', "chat template: %s (recognized from the --chat-template text)", llm::chat_family_name(chat.family).c_str());
    }
    return chat;
}

// Whether a template prints a message whose content is a list of OpenAI text parts (as llama-server
// probes its templates' typed-content support); many print only string content.
bool renders_content_parts(const llm::JinjaTemplate& tpl) {
    const std::string probe = "\x7f content part probe \x7f";
    const std::string req = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"" + probe +
                            "\"}]}],\"add_generation_prompt\":true,\"bos_token\":\"\",\"eos_token\":\"\"}";
    try {
        return llm::chat_apply_template(tpl, req).find(probe) != std::string::npos;
    } catch (const llm::Error&) {
        return false;
    }
}

// The Jinja program of a template's source, unless --no-jinja or it does not parse (then the
// family's renderer is used).
void attach_jinja(const ServerOptions& so, ChatTemplate& chat, const std::string& from) {
    if (!so.jinja || chat.source.empty()) return;
    try {
        chat.jinja = std::make_shared<const llm::JinjaTemplate>(chat.source);
        chat.tool_format = llm::chat_detect_tool_call_format(chat.source);
        chat.typed_content = renders_content_parts(*chat.jinja);
        log_msg('I', "chat template: the Jinja of %s (tool calls: %s)", from.c_str(), llm::tool_call_format_name(chat.tool_format));
    } catch (const llm::Error& e) {
        log_msg('W', "chat template of %s does not parse (%s): using the family renderer", from.c_str(), e.what());
    }
}

// --chat-template, else --chat-template-file or the model's tokenizer.chat_template: rendered as
// Jinja, with the recognized family (chatml when absent or not recognized) as the fallback.
ChatTemplate choose_chat_template(const ServerOptions& so, const llm::Model& model) {
    if (!so.chat_template.empty()) {
        ChatTemplate chat = template_from_flag(so.chat_template);
        attach_jinja(so, chat, "--chat-template");
        return chat;
    }
    ChatTemplate chat;
    std::string from;
    if (!so.chat_template_file.empty()) {
        chat.source = read_file(so.chat_template_file);
        from = so.chat_template_file;
    } else {
        chat.source = model.gguf->get_str("tokenizer.chat_template");
        from = "the model's tokenizer.chat_template";
    }
    chat.family = chat.source.empty() ? llm::ChatFamily::Unknown : llm::chat_detect_family(chat.source);
    if (chat.family == llm::ChatFamily::Unknown) {
        log_msg('W', "chat template of %s is %s: the fallback renderer is chatml", from.c_str(), chat.source.empty() ? "absent" : "not recognized");
        chat.family = llm::ChatFamily::ChatML;
    } else {
        log_msg('I', "chat template: %s (from %s)", llm::chat_family_name(chat.family).c_str(), from.c_str());
    }
    attach_jinja(so, chat, from);
    return chat;
}

// What the server loads once it listens: the model, its context (one KV sequence per slot), the
// drafters of speculative decoding, the chat template and the scheduler.
struct Engine {
    std::unique_ptr<llm::Model> model;
    std::unique_ptr<llm::Context> ctx;
    std::unique_ptr<Speculator> spec;
    std::unique_ptr<Scheduler> sched;
    ChatTemplate chat;
};

void load(const Options& o, const SchedulerConfig& cfg, Engine& e) {
    double t0 = now_seconds();
    e.model = llm::Model::load(o.model, model_options(o));
    const llm::HParams& hp = e.model->hp;
    log_msg('I', "loaded %s: %s, %d layers, n_embd %d, vocab %d, %.1fM params, weights %.2f MiB, %.0f ms", o.model.c_str(),
            e.model->arch_str.c_str(), hp.n_layer, hp.n_embd, hp.n_vocab, e.model->n_params() / 1e6, mib(e.model->weight_bytes()),
            (now_seconds() - t0) * 1000);
    if (!e.model->vocab.has_tokenizer()) log_msg('W', "the model has no tokenizer: only prompts of token ids will work");
    llm::ContextParams cp = context_params(o, o.n_ctx);
    if (!hp.causal && !cp.embeddings) {
        log_msg('W', "%s is an encoder: serving embeddings (as with --embeddings)", e.model->arch_str.c_str());
        cp.embeddings = true;
    }
    cp.n_seq = cfg.n_slots;
    cp.kv_unified = cfg.kv_unified;
    cp.n_batch = cfg.budget;
    e.ctx = std::make_unique<llm::Context>(*e.model, cp);
    log_msg('I', "kv cache: %d slots, %s of %d tokens, %.2f MiB (K %s, V %s); %d threads; %d tokens per step", cfg.n_slots,
            cfg.kv_unified ? "one shared pool" : "each", cfg.kv_unified ? e.ctx->n_ctx() : e.ctx->n_ctx_seq(), mib(e.ctx->kv_bytes()),
            llm::type_info(o.type_k).name, llm::type_info(o.type_v).name, e.ctx->n_threads(), cfg.budget);
    log_msg('I', "cpu kernels: %s", llm::isa_name(llm::isa_current()).c_str());
    e.chat = choose_chat_template(o.srv, *e.model);
    if (o.srv.warmup) {  // touch every weight once, so the first request does not pay for page-ins
        t0 = now_seconds();
        llm::Batch b;
        b.add(e.model->vocab.bos() >= 0 ? e.model->vocab.bos() : 0, 0, 0, true);
        e.ctx->decode(b);
        e.ctx->seq_truncate(0, 0);
        log_msg('I', "warm-up done in %.0f ms", (now_seconds() - t0) * 1000);
    }
    if (o.spec.enabled() && !cp.embeddings) {
        e.spec = std::make_unique<Speculator>(o, *e.model, *e.ctx, cfg.n_slots);
        log_msg('I', "speculative decoding: %s", e.spec->describe().c_str());
    }
    SchedulerConfig sc = cfg;
    sc.embeddings = cp.embeddings;
    e.sched = std::make_unique<Scheduler>(*e.model, *e.ctx, sc, e.spec.get());
}

}  // namespace

void stop_on_signals(http::Server& srv) {
    g_http = &srv;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    if (g_stop_requested) srv.stop();
}

int run_server(const Options& o) {
    const ServerOptions& so = o.srv;
    check_server_options(so);
    SchedulerConfig cfg;
    cfg.n_slots = o.n_parallel;
    cfg.budget = std::max(1, std::min(o.n_batch, so.n_ubatch));
    cfg.max_queue = so.max_queue;
    cfg.context_shift = so.context_shift;
    cfg.kv_unified = so.kv_unified;
    cfg.special = o.special;
    cfg.ram_cache_bytes = so.cache_ram_mib < 0 ? SIZE_MAX : (size_t)so.cache_ram_mib << 20;

    http::Options ho;
    ho.host = so.host;
    ho.port = so.port;
    ho.write_timeout_ms = so.timeout_s * 1000;
    ho.shutdown_grace_ms = so.shutdown_grace_s * 1000;
    ho.max_connections = so.max_connections;
    ho.max_connections_per_client = so.max_connections_per_client;
    ho.priority_paths = {so.api_prefix + "/health", so.api_prefix + "/v1/health", so.api_prefix + "/metrics"};
    ho.server_name = "llm-server";
    ho.cors_echo_origin = true;  // as llama-server: the Origin is reflected, credentials allowed
    http::Server srv(ho);
    Api api(o);
    api.install(srv);
    try {
        srv.listen();
    } catch (const std::exception& e) {
        log_msg('E', "%s", e.what());
        return 1;
    }
    // The listener is up before the model loads: /health answers 503 meanwhile.
    log_msg('I', "listening on %s:%d", so.host.c_str(), srv.port());
    stop_on_signals(srv);
    std::thread http_thread([&] { srv.run(); });

    int rc = 0;
    Engine engine;
    std::thread sched;
    try {
        load(o, cfg, engine);
    } catch (const std::exception& e) {
        log_msg('E', "cannot start: %s", e.what());
        rc = 1;
        srv.stop();
    }
    if (rc == 0 && !g_stop_requested) {
        api.attach(*engine.model, *engine.sched, engine.chat, engine.ctx->n_ctx());
        sched = std::thread([&engine] { engine.sched->run(); });
        log_msg('I', "ready: %d slots of %d tokens, model '%s' at http://%s:%d", cfg.n_slots, engine.sched->n_ctx_slot(),
                api.model_id().c_str(), so.host.c_str(), srv.port());
    }
    http_thread.join();  // after stop(): in-flight requests finished, or cut after --shutdown-grace
    if (g_stop_requested) log_msg('I', "stopping: connections drained");
    if (engine.sched) engine.sched->stop();
    if (sched.joinable()) sched.join();
    g_http = nullptr;
    log_msg('I', "stopped");
    return rc;
}

}  // namespace srv
