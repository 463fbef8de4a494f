// llm-server's HTTP API, llama-server's: the routes, request parsing and the response shapes of its
// dialects (llama.cpp's /completion and /infill, OpenAI's completions and chat, with server-sent
// events; Anthropic's Messages and OpenAI's Responses are converted in dialects.cpp), and the web page
// at /. All JSON lives here; the Scheduler runs what a request asks for.
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

// The chat template requests are rendered with: the Jinja program when there is one (the model's
// or --chat-template-file's, unless --no-jinja or a --chat-template family name), else the family's
// renderer; the Jinja source ("" if none) and the tool-call syntax its family writes.
struct ChatTemplate {
    llm::ChatFamily family = llm::ChatFamily::ChatML;
    std::string source;
    std::shared_ptr<const llm::JinjaTemplate> jinja;
    llm::ToolCallFormat tool_format = llm::ToolCallFormat::None;
    bool typed_content = true;  // the Jinja prints OpenAI content parts; else text parts go in as one string
};

using HttpHandler = std::function<void(const http::Request&, http::Response&)>;
// A route's handler whose errors become OpenAI-style error bodies (ApiError: its status and fields;
// llm::Error: 400); the server keeps serving.
HttpHandler guarded(HttpHandler fn);

// The shape of a generation request and of its answer. Infill answers as Completion; Anthropic and
// Responses are chat requests in another dialect.
enum class ApiKind { Completion, Infill, OaiCompletion, OaiChat, Anthropic, Responses };

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
    static constexpr size_t kMaxPrompts = 64;    // prompts in one /completion request
    static constexpr size_t kMaxInputs = 2048;   // inputs (documents) of one embeddings (rerank) request, as OpenAI's

    // A generation request, parsed.
    struct Generation {
        ApiKind kind = ApiKind::Completion;
        TaskParams p;
        std::vector<std::vector<int32_t>> prompts;
        bool include_usage = false;  // stream_options.include_usage
        std::string id;              // the answer's id (chatcmpl-..., cmpl-..., msg_..., resp_...)
        std::string message_id;      // the Responses API's output message
        std::vector<std::string> response_fields;  // the final /completion object cut to these "a/b" paths
        int64_t created = 0;
        bool parse_output = false;   // chat: the output is split into content, reasoning and tool calls
        llm::ChatParseOptions parse;
        bool parallel_tool_calls = true;
        int n_cmpl = 1;              // completions per prompt (n_cmpl, OpenAI's n): choice i is of prompt i / n_cmpl
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
    void handle_count_tokens(const http::Request& req, http::Response& res);
    void handle_props(http::Response& res);
    void handle_props_post(const http::Request& req, http::Response& res);
    void handle_slots(const http::Request& req, http::Response& res);
    void handle_slot_action(const http::Request& req, http::Response& res, int slot);
    void handle_metrics(http::Response& res);
    void handle_models(http::Response& res);
    void handle_health(const http::Request& req, http::Response& res);
    // embeddings.cpp: /embedding(s), /v1/embeddings (oai) and /rerank, as llama-server answers them.
    void handle_embeddings(const http::Request& req, http::Response& res, bool oai);
    void handle_rerank(const http::Request& req, http::Response& res);
    std::vector<Result> run_embeddings(const http::Request& req, const std::vector<std::vector<int32_t>>& prompts,
                                       const TaskParams& p);

    // ---- requests
    TaskParams parse_params(const json& b, ApiKind kind) const;
    void parse_sampling(const json& b, llm::SamplerParams& sp) const;
    std::vector<int32_t> parse_prompt(const json& prompt) const;
    std::vector<std::vector<int32_t>> parse_prompts(const json& prompt, size_t max_prompts = kMaxPrompts) const;
    void check_fits(const std::vector<int32_t>& prompt) const;
    // The prompt of a chat request; `body` is the raw request (its member order reaches the template).
    std::string render_chat(const json& b, const std::string& body) const;
    std::string render_jinja(const json& b, const std::string& body) const;
    void chat_parse_options(const json& b, const std::string& body, const std::string& prompt, Generation& g) const;
    void constrain_tool_calls(const json& b, const std::string& body, const std::string& prompt, Generation& g) const;
    json chat_message(const Generation& g, const std::string& text, std::string& finish) const;
    std::vector<int32_t> tokenize_prompt(const std::string& text) const;
    void check_prompt_bytes(size_t bytes) const;
    void check_body_bytes(size_t bytes) const;
    std::vector<int32_t> tokenize_mixed(const json& value, const char* field) const;
    std::vector<int32_t> infill_prompt(const json& b) const;
    std::vector<std::shared_ptr<Channel>> submit_all(const Generation& g);
    Completion collect(const std::shared_ptr<Channel>& ch, const http::Request& req);

    // ---- responses
    json timings_json(const Result& r) const;
    json probs_json(const std::vector<TokenProb>& probs, bool post_sampling) const;
    json final_completion(const Completion& c, const TaskParams& p, const std::vector<int32_t>& prompt, int index) const;
    json oai_base(const Generation& g, const char* object) const;
    json oai_logprobs(const std::vector<TokenProb>& probs, const TaskParams& p) const;
    json whole_response(const Generation& g, const std::vector<Completion>& done) const;
    llm::ChatParsed dialect_answer(const Generation& g, const std::string& text) const;
    // parser: the choice's output parser when the chat output is parsed (else null)
    std::string stream_events(const Generation& g, const Result& r, int index, llm::ChatOutputParser* parser) const;
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
    size_t max_token_bytes_ = 1;  // the longest text one token can stand for (specials included)
};

}  // namespace srv
