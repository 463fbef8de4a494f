// llm-server's HTTP API, llama-server's: the routes, request parsing and the response shapes of its
// three dialects (llama.cpp's /completion, OpenAI's completions and chat, with server-sent events).
// All JSON lives here; the Scheduler runs what a request asks for.
#pragma once
#include <atomic>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../http.hpp"
#include "../llm.hpp"
#include "args.hpp"
#include "scheduler.hpp"

namespace srv {

// The chat template requests are rendered with: the family, and the Jinja source it was recognized
// from ("" if none).
struct ChatTemplate {
    llm::ChatFamily family = llm::ChatFamily::ChatML;
    std::string source;
};

enum class ApiKind { Completion, OaiCompletion, OaiChat };

class Api {
public:
    explicit Api(const Options& o);
    // Routes, the API key check, the loading gate and the access log.
    void install(http::Server& srv);
    // The model is loaded and the scheduler runs: requests are served from now on (until then,
    // everything but /health answers 503).
    void attach(const llm::Model& model, Scheduler& sched, const ChatTemplate& chat, int n_ctx_total);
    std::string model_id() const { return srv::model_id(o_); }

private:
    using json = nlohmann::json;
    static constexpr size_t kMaxPrompts = 64;  // prompts in one /completion request

    // A generation request, parsed.
    struct Generation {
        ApiKind kind = ApiKind::Completion;
        TaskParams p;
        std::vector<std::vector<int32_t>> prompts;
        bool include_usage = false;  // stream_options.include_usage
        std::string id;              // OpenAI's response id
        int64_t created = 0;
    };
    // One task's results, drained.
    struct Completion {
        Result final;
        std::string content;
        std::vector<int32_t> tokens;
        std::vector<TokenProb> probs;
    };

    // ---- handlers
    void handle_generate(const http::Request& req, http::Response& res, ApiKind kind);
    void handle_tokenize(const http::Request& req, http::Response& res);
    void handle_detokenize(const http::Request& req, http::Response& res);
    void handle_apply_template(const http::Request& req, http::Response& res);
    void handle_input_tokens(const http::Request& req, http::Response& res);
    void handle_props(http::Response& res);
    void handle_props_post(const http::Request& req, http::Response& res);
    void handle_slots(const http::Request& req, http::Response& res);
    void handle_slot_action(const http::Request& req, http::Response& res, int slot);
    void handle_metrics(http::Response& res);
    void handle_models(http::Response& res);

    // ---- requests
    TaskParams parse_params(const json& b, ApiKind kind) const;
    std::vector<int32_t> parse_prompt(const json& prompt) const;
    std::vector<std::vector<int32_t>> parse_prompts(const json& prompt) const;
    void check_fits(const std::vector<int32_t>& prompt) const;
    std::string render_chat(const json& b) const;
    std::vector<int32_t> tokenize_prompt(const std::string& text) const;
    std::vector<std::shared_ptr<Channel>> submit_all(const std::vector<std::vector<int32_t>>& prompts, const TaskParams& p);
    Completion collect(const std::shared_ptr<Channel>& ch, const http::Request& req);

    // ---- responses
    json timings_json(const Result& r) const;
    json probs_json(const std::vector<TokenProb>& probs, bool post_sampling) const;
    json final_completion(const Completion& c, const TaskParams& p, const std::vector<int32_t>& prompt, int index) const;
    json oai_base(const Generation& g, const char* object) const;
    json whole_response(const Generation& g, const std::vector<Completion>& done) const;
    std::string stream_events(const Generation& g, const Result& r, int index) const;
    bool stream_all(const Generation& g, const std::vector<std::shared_ptr<Channel>>& chs, http::Writer& w);

    const Options& o_;
    const int64_t created_;
    json default_kwargs_ = json::object();  // --chat-template-kwargs
    std::atomic<bool> ready_{false};
    // Set by attach().
    const llm::Model* model_ = nullptr;
    Scheduler* sched_ = nullptr;
    ChatTemplate chat_;
    int n_slots_ = 1, n_ctx_slot_ = 0, n_ctx_total_ = 0, n_vocab_ = 0;
};

}  // namespace srv
