// llm-server's HTTP API (see api.hpp).
#include "api.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <deque>
#include <functional>
#include <random>
#include <tuple>

#include "dialects.hpp"
#include "tools.hpp"
#include "util.hpp"
#include "webui_html.hpp"

namespace srv {

namespace {

using json = nlohmann::json;

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

// llama-server's logit_bias: [[token or "text", bias or false], ...] or {"token or text": bias}; a
// text biases each of its tokens, false bans; ids outside the vocabulary are skipped as llama-server does.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& lb, const llm::Vocab& vocab, int n_vocab) {
    const char* shape = "[[token, bias], ...] or {\"token\": bias} (bias a number or false)";
    auto bias_of = [&](const json& v) {
        if (v.is_number() && (std::isfinite(v.get<double>()))) return v.get<float>();
        if (v.is_boolean() && !v.get<bool>()) return -INFINITY;
        bad_field("logit_bias", shape);
    };
    std::vector<std::pair<int32_t, float>> out;
    auto add = [&](const json& key, float bias) {
        if (key.is_number_integer()) {
            const int64_t id = key.get<int64_t>();
            if (id >= 0 && id < n_vocab) out.emplace_back((int32_t)id, bias);
        } else if (key.is_string()) {
            for (int32_t t : vocab.tokenize(key.get<std::string>(), false, false)) out.emplace_back(t, bias);
        } else {
            bad_field("logit_bias", shape);
        }
    };
    if (lb.is_array()) {
        for (const json& el : lb) {
            if (!el.is_array() || el.size() != 2) bad_field("logit_bias", shape);
            add(el[0], bias_of(el[1]));
        }
    } else if (lb.is_object()) {
        for (const auto& [key, value] : lb.items()) {
            char* end = nullptr;
            const long id = strtol(key.c_str(), &end, 10);
            add(!key.empty() && *end == 0 ? json(id) : json(key), bias_of(value));
        }
    } else {
        bad_field("logit_bias", shape);
    }
    return out;
}

// The grammar a request asks for: "grammar", else "json_schema", else response_format's schema
// (json_object without one: any JSON value, as llama-server); else def (the command line's). An
// invalid grammar or schema is a 400 with the parser's message.
std::string parse_grammar(const json& b, const std::string& def) {
    const json* schema = opt_field(b, "json_schema");
    json rf_schema;
    if (const json* rf = opt_field(b, "response_format"); rf && !schema) {
        if (!rf->is_object()) bad_field("response_format", "an object");
        const std::string type = get_str(*rf, "type", "");
        const json* wrapper = type == "json_schema" ? opt_field(*rf, "json_schema") : rf;
        if (type == "json_object" || type == "json_schema") {
            rf_schema = wrapper && wrapper->is_object() ? wrapper->value("schema", json::object()) : json::object();
            schema = &rf_schema;
        } else if (!type.empty() && type != "text") {
            throw ApiError(400, "response_format type must be one of \"text\", \"json_object\" or \"json_schema\", but got: " + type);
        }
    }
    try {
        if (opt_field(b, "grammar")) {
            const std::string grammar = get_str(b, "grammar", "");
            if (!grammar.empty()) llm::Grammar check(grammar);
            return grammar;
        }
        if (schema) return llm::json_schema_to_grammar(schema->dump());
    } catch (const llm::Error& e) {
        throw ApiError(400, e.what());
    }
    return def;
}

// logit_bias as generation_settings shows it: [{"bias": b, "token": t}, ...].
json logit_bias_json(const std::vector<std::pair<int32_t, float>>& bias) {
    json out = json::array();
    for (auto [token, b] : bias) out.push_back({{"bias", std::isfinite(b) ? json(b) : json(false)}, {"token", token}});
    return out;
}

json sampler_names_json(const std::vector<llm::SamplerStage>& stages) {
    json out = json::array();
    for (llm::SamplerStage st : stages) out.push_back(llm::sampler_stage_name(st));
    return out;
}

// generation_settings: every field llama-server reports.
json params_json(const TaskParams& p) {
    const llm::SamplerParams& sp = p.sampling;
    return json{{"n_predict", p.n_predict},
                {"seed", sp.seed},
                {"temperature", sp.temperature},
                {"dynatemp_range", sp.dynatemp_range},
                {"dynatemp_exponent", sp.dynatemp_exponent},
                {"top_k", sp.top_k},
                {"top_p", sp.top_p},
                {"min_p", sp.min_p},
                {"top_n_sigma", sp.top_n_sigma},
                {"xtc_probability", sp.xtc_probability},
                {"xtc_threshold", sp.xtc_threshold},
                {"typical_p", sp.typical_p},
                {"repeat_last_n", sp.penalty_last_n},
                {"repeat_penalty", sp.repeat_penalty},
                {"presence_penalty", sp.presence_penalty},
                {"frequency_penalty", sp.frequency_penalty},
                {"dry_multiplier", sp.dry_multiplier},
                {"dry_base", sp.dry_base},
                {"dry_allowed_length", sp.dry_allowed_length},
                {"dry_penalty_last_n", sp.dry_penalty_last_n},
                {"dry_sequence_breakers", sp.dry_sequence_breakers},
                {"mirostat", sp.mirostat},
                {"mirostat_tau", sp.mirostat_tau},
                {"mirostat_eta", sp.mirostat_eta},
                {"stop", p.stop},
                {"max_tokens", p.n_predict},
                {"n_keep", p.n_keep},
                {"n_discard", 0},
                {"ignore_eos", p.ignore_eos},
                {"stream", p.stream},
                {"logit_bias", logit_bias_json(sp.logit_bias)},
                {"n_probs", p.n_probs},
                {"min_keep", sp.min_keep},
                {"grammar", sp.grammar},
                {"samplers", sampler_names_json(sp.samplers)},
                {"speculative.n_max", p.speculative.n_max},
                {"speculative.n_min", p.speculative.n_min},
                {"speculative.p_min", p.speculative.p_min},
                {"timings_per_token", p.timings_per_token},
                {"post_sampling_probs", p.post_sampling_probs},
                {"cache_prompt", p.cache_prompt},
                {"return_progress", p.return_progress},
                {"lora", json::array()}};
}

std::string random_id(const char* prefix) {
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    thread_local std::mt19937_64 rng(std::random_device{}());
    std::string s = prefix;
    for (int i = 0; i < 32; i++) s += alnum[rng() % (sizeof alnum - 1)];
    return s;
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

// llama-server's response_fields: only the values at these paths ("timings/prompt_n"), each under its
// path as a key; paths that lead nowhere are left out. Nothing asked: the whole object.
json select_fields(json j, const std::vector<std::string>& paths) {
    if (paths.empty()) return j;
    json out = json::object();
    for (const std::string& path : paths) {
        const json* at = &j;
        for (size_t start = 0; at && start <= path.size();) {
            size_t end = std::min(path.find('/', start), path.size());
            auto it = at->is_object() ? at->find(path.substr(start, end - start)) : at->end();
            at = at->is_object() && it != at->end() ? &*it : nullptr;
            start = end + 1;
        }
        if (at) out[path] = *at;
    }
    return out;
}

// Requests given as chat messages (rendered with the chat template), in whichever dialect.
bool is_chat(ApiKind k) { return k == ApiKind::OaiChat || k == ApiKind::Anthropic || k == ApiKind::Responses; }
// Requests answered in llama.cpp's own /completion shape.
bool is_native(ApiKind k) { return k == ApiKind::Completion || k == ApiKind::Infill; }

// The id of an answer: chatcmpl-..., msg_... (Anthropic), resp_... (Responses) or cmpl-....
std::string answer_id(ApiKind k) {
    return random_id(k == ApiKind::OaiChat ? "chatcmpl-" : k == ApiKind::Anthropic ? "msg_" : k == ApiKind::Responses ? "resp_" : "cmpl-");
}

}  // namespace

Api::Api(const Options& o) : o_(o), created_((int64_t)time(nullptr)) {
    if (!o.srv.chat_template_kwargs.empty()) {
        try {
            default_kwargs_ = json::parse(o.srv.chat_template_kwargs);
        } catch (const json::exception&) {
        }
        if (!default_kwargs_.is_object()) usage_error("--chat-template-kwargs must be a JSON object");
    }
    if (o.srv.reasoning != "auto" && !default_kwargs_.contains("enable_thinking")) default_kwargs_["enable_thinking"] = o.srv.reasoning == "on";
}

void Api::attach(const llm::Model& model, Scheduler& sched, const ChatTemplate& chat, int n_ctx_total) {
    model_ = &model;
    sched_ = &sched;
    chat_ = chat;
    n_slots_ = sched.n_slots();
    n_ctx_slot_ = sched.n_ctx_slot();
    n_ctx_total_ = n_ctx_total;
    n_vocab_ = model.hp.n_vocab;
    for (int32_t id = 0; id < model.vocab.n_tokens(); id++)
        max_token_bytes_ = std::max(max_token_bytes_, model.vocab.token_to_piece(id, true).size());
    ready_ = true;
}

// A text of more than max_token_bytes_ bytes per context cell cannot fit a slot whatever it tokenizes
// to: refuse it before tokenizing (which costs memory and time outside the scheduler's threads).
void Api::check_prompt_bytes(size_t bytes) const {
    if (bytes / max_token_bytes_ >= (size_t)n_ctx_slot_) {
        throw ApiError(400, "the prompt (" + std::to_string(bytes) + " bytes, at least " + std::to_string(bytes / max_token_bytes_) +
                                " tokens) exceeds the context of a slot (" + std::to_string(n_ctx_slot_) + " tokens)",
                       "exceed_context_size_error");
    }
}

// A body this large cannot carry a prompt that fits a slot: each context cell stands for at most
// max_token_bytes_ of text, written as at most 6 JSON bytes per byte (\u00XX), or for one token id of
// at most 12 characters; 1 MiB more for the other fields. Refused before parsing: the JSON copy of a
// 16 MB prompt costs 2-3 times its size.
void Api::check_body_bytes(size_t bytes) const {
    const size_t per_cell = std::max<size_t>(6 * max_token_bytes_, 12);
    if (bytes > per_cell * (size_t)n_ctx_slot_ + (1u << 20)) {
        throw ApiError(400, "the request (" + std::to_string(bytes) + " bytes) cannot hold a prompt that fits the context of a slot (" +
                                std::to_string(n_ctx_slot_) + " tokens)", "exceed_context_size_error");
    }
}

// A query flag as llama-server reads it: present and not "0" / "false".
static bool flag_param(const http::Request& req, const char* name) {
    std::string f = req.param(name);
    return !f.empty() && f != "0" && f != "false";
}

// A request's "lora" ([{"id", "scale"}, ...]) as llama-server checks it: an array, and every id one of
// the loaded adapters; this build loads none, so only an empty list passes.
static void check_lora(const nlohmann::json& b) {
    const nlohmann::json* lora = opt_field(b, "lora");
    if (!lora) return;
    if (!lora->is_array()) bad_field("lora", "an array of objects with 'id' and 'scale' fields");
    if (!lora->empty()) throw ApiError(400, "invalid adapter id: no LoRA adapters are loaded");
}

// OpenAI's logprobs as llama-server maps them to n_probs: chat's "logprobs": true with
// "top_logprobs" (default 20), completions' "logprobs": N.
static int openai_logprobs(const nlohmann::json& b, ApiKind kind) {
    if (kind == ApiKind::OaiCompletion) return (int)get_int(b, "logprobs", 0, 0, 100);
    if (kind != ApiKind::OaiChat) return 0;
    if (get_bool(b, "logprobs", false)) return (int)get_int(b, "top_logprobs", 20, 0, 20);
    if (opt_field(b, "top_logprobs")) throw ApiError(400, "top_logprobs requires logprobs to be set to true");
    return 0;
}

TaskParams Api::parse_params(const json& b, ApiKind kind) const {
    TaskParams p;
    p.sampling = o_.sampling;
    p.n_predict = o_.n_predict;
    p.n_keep = o_.srv.n_keep;
    p.stop = o_.reverse_prompts;
    p.stream = get_bool(b, "stream", false);
    if (!is_native(kind)) {
        p.n_predict = (int)get_int(b, "max_tokens", p.n_predict, -1, INT32_MAX);
        p.n_predict = (int)get_int(b, "max_completion_tokens", p.n_predict, -1, INT32_MAX);
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
    parse_sampling(b, p.sampling);
    int64_t seed = get_int(b, "seed", -1, -1, INT64_MAX);
    if (seed >= 0) p.sampling.seed = (uint64_t)seed;
    p.n_probs = (int)get_int(b, "n_probs", openai_logprobs(b, kind), 0, 100);
    // As llama-server: the server's drafting settings, per request; n_min at most n_max.
    p.speculative = o_.spec.draft;
    p.speculative.n_max = (int)get_int(b, "speculative.n_max", p.speculative.n_max, 0, 256);
    p.speculative.n_min = std::min(p.speculative.n_max, (int)get_int(b, "speculative.n_min", p.speculative.n_min, 0, 256));
    p.speculative.p_min = (float)get_num(b, "speculative.p_min", p.speculative.p_min);
    p.post_sampling_probs = get_bool(b, "post_sampling_probs", false);
    p.cache_prompt = get_bool(b, "cache_prompt", o_.srv.cache_prompt);
    p.return_tokens = get_bool(b, "return_tokens", false);
    p.return_progress = get_bool(b, "return_progress", false);
    p.timings_per_token = get_bool(b, "timings_per_token", false);
    check_lora(b);
    p.n_indent = (int)get_int(b, "n_indent", 0, 0, INT32_MAX);
    p.t_max_predict_ms = (int)get_int(b, "t_max_predict_ms", 0, 0, INT32_MAX);
    p.n_cache_reuse = (int)get_int(b, "n_cache_reuse", o_.srv.cache_reuse, 0, INT32_MAX);
    p.ignore_eos = get_bool(b, "ignore_eos", o_.ignore_eos);
    p.sampling.ignore_eos = p.ignore_eos;  // as llama-server: end-of-generation tokens are never sampled
    p.id_slot = (int)get_int(b, "id_slot", -1, -1, n_slots_ - 1);
    p.n_keep = (int)get_int(b, "n_keep", p.n_keep, -1, INT32_MAX);
    if (const json* s = opt_field(b, "stop")) {
        p.stop.clear();
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

// The sampling fields beyond the basic ones, with llama-server's names and defaults from the command line.
void Api::parse_sampling(const json& b, llm::SamplerParams& sp) const {
    sp.typical_p = (float)get_num(b, "typical_p", sp.typical_p);
    sp.top_n_sigma = (float)get_num(b, "top_n_sigma", sp.top_n_sigma);
    sp.xtc_probability = (float)get_num(b, "xtc_probability", sp.xtc_probability);
    sp.xtc_threshold = (float)get_num(b, "xtc_threshold", sp.xtc_threshold);
    sp.dynatemp_range = (float)get_num(b, "dynatemp_range", sp.dynatemp_range);
    sp.dynatemp_exponent = (float)get_num(b, "dynatemp_exponent", sp.dynatemp_exponent);
    sp.dry_multiplier = (float)get_num(b, "dry_multiplier", sp.dry_multiplier);
    sp.dry_base = (float)get_num(b, "dry_base", sp.dry_base);
    if (sp.dry_base < 1.0f) sp.dry_base = o_.sampling.dry_base;  // as llama-server
    sp.dry_allowed_length = (int)get_int(b, "dry_allowed_length", sp.dry_allowed_length, 0, INT32_MAX);
    sp.dry_penalty_last_n = (int)get_int(b, "dry_penalty_last_n", sp.dry_penalty_last_n, -1, INT32_MAX);
    if (const json* br = opt_field(b, "dry_sequence_breakers")) {
        if (!br->is_array() || br->empty()) bad_field("dry_sequence_breakers", "a non-empty array of strings");
        sp.dry_sequence_breakers.clear();
        for (const json& x : *br) {
            if (!x.is_string()) bad_field("dry_sequence_breakers", "a non-empty array of strings");
            sp.dry_sequence_breakers.push_back(x.get<std::string>());
        }
    }
    sp.mirostat = (int)get_int(b, "mirostat", sp.mirostat, 0, 2);
    sp.mirostat_tau = (float)get_num(b, "mirostat_tau", sp.mirostat_tau);
    sp.mirostat_eta = (float)get_num(b, "mirostat_eta", sp.mirostat_eta);
    sp.min_keep = (int)get_int(b, "min_keep", sp.min_keep, 0, INT32_MAX);
    if (const json* s = opt_field(b, "samplers")) {
        const char* shape = "an array of sampler names or a string of their letters";
        if (s->is_string()) {
            sp.samplers = llm::sampler_stages_from_chars(s->get<std::string>());
        } else if (s->is_array()) {
            std::vector<std::string> names;
            for (const json& x : *s) {
                if (!x.is_string()) bad_field("samplers", shape);
                names.push_back(x.get<std::string>());
            }
            sp.samplers = llm::sampler_stages_from_names(names);
        } else {
            bad_field("samplers", shape);
        }
    }
    if (const json* lb = opt_field(b, "logit_bias")) sp.logit_bias = parse_logit_bias(*lb, model_->vocab, n_vocab_);
    sp.grammar = parse_grammar(b, sp.grammar);
}

std::vector<int32_t> Api::tokenize_prompt(const std::string& text) const {
    check_prompt_bytes(text.size());
    const llm::Vocab& v = model_->vocab;
    std::vector<int32_t> ids = v.tokenize(text, true, true);
    // A template that writes bos_token itself, tokenized with the model's own BOS: keep one.
    if (ids.size() >= 2 && v.bos() >= 0 && ids[0] == v.bos() && ids[1] == v.bos()) ids.erase(ids.begin());
    return ids;
}

// A string, or an array of token ids and strings, as plain text (control tokens are not parsed, no
// BOS): how /infill reads input_prefix and input_suffix.
std::vector<int32_t> Api::tokenize_mixed(const json& value, const char* field) const {
    if (value.is_string()) return model_->vocab.tokenize(value.get<std::string>(), false, false);
    if (!value.is_array()) bad_field(field, "a string or an array of token ids and strings");
    std::vector<int32_t> ids;
    for (const json& x : value) {
        if (x.is_string()) {
            std::vector<int32_t> t = model_->vocab.tokenize(x.get<std::string>(), false, false);
            ids.insert(ids.end(), t.begin(), t.end());
        } else if (x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < n_vocab_) {
            ids.push_back((int32_t)x.get<int64_t>());
        } else {
            bad_field(field, "a string or an array of token ids and strings");
        }
    }
    return ids;
}

// /infill's prompt, built as llama-server builds it (format_prompt_infill), with the repo-level FIM
// pattern:
//   [FIM_REP]myproject\n [FIM_SEP]filename0\n extra chunk 0 ... [FIM_SEP]filename\n
//   [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]prompt
// (suffix first with --spm-infill; BOS before the prefix when the model adds one). The prefix keeps its
// last 3/4 batch of tokens, the suffix its first quarter (less the prompt), the extra chunks the end
// of what remains of the slot after a batch and twice -n. A model without the prefix, suffix and
// middle tokens gets llama-server's 501.
std::vector<int32_t> Api::infill_prompt(const json& b) const {
    const llm::Vocab& v = model_->vocab;
    std::string missing;
    if (v.fim_pre() < 0) missing += "prefix token is missing. ";
    if (v.fim_suf() < 0) missing += "suffix token is missing. ";
    if (v.fim_mid() < 0) missing += "middle token is missing. ";
    if (!missing.empty()) throw ApiError(501, "Infill is not supported by this model: " + missing, "not_supported_error");
    if (b.contains("prompt") && !b["prompt"].is_string()) throw ApiError(400, "\"prompt\" must be a string");
    if (!b.contains("input_prefix")) throw ApiError(400, "\"input_prefix\" is required");
    if (!b.contains("input_suffix")) throw ApiError(400, "\"input_suffix\" is required");
    const json* extra = opt_field(b, "input_extra");
    if (extra && !extra->is_array()) throw ApiError(400, "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}");

    auto plain = [&](const std::string& text) { return v.tokenize(text, false, false); };
    auto append = [](std::vector<int32_t>& to, const std::vector<int32_t>& from) { to.insert(to.end(), from.begin(), from.end()); };
    std::vector<int32_t> extra_tokens;
    if (v.fim_rep() >= 0) {
        extra_tokens.push_back(v.fim_rep());
        append(extra_tokens, plain("myproject\n"));
    }
    for (const json& chunk : extra ? *extra : json::array()) {
        if (!chunk.is_object() || !chunk.contains("text") || !chunk["text"].is_string()) {
            throw ApiError(400, "extra_context chunk must contain a \"text\" field with a string value");
        }
        if (chunk.contains("filename") && !chunk["filename"].is_string()) {
            throw ApiError(400, "extra_context chunk's \"filename\" field must be a string");
        }
        if (v.fim_sep() >= 0) {
            extra_tokens.push_back(v.fim_sep());
            append(extra_tokens, plain(chunk.value("filename", std::string("tmp")) + "\n"));
        } else {
            append(extra_tokens, plain("\n\n--- snippet ---\n\n"));
        }
        append(extra_tokens, plain(chunk["text"].get<std::string>()));
    }
    if (v.fim_sep() >= 0) {
        extra_tokens.push_back(v.fim_sep());
        append(extra_tokens, plain("filename\n"));
    }

    std::vector<int32_t> prefix = tokenize_mixed(b["input_prefix"], "input_prefix");
    std::vector<int32_t> suffix = tokenize_mixed(b["input_suffix"], "input_suffix");
    std::vector<int32_t> prompt = v.tokenize(get_str(b, "prompt", ""), false, true);
    const int n_batch = o_.n_batch;
    const size_t n_prefix_take = std::min<size_t>(prefix.size(), 3 * (n_batch / 4));
    const size_t n_suffix_take = std::min<size_t>(suffix.size(), std::max<int64_t>(0, n_batch / 4 - (2 + (int64_t)prompt.size())));
    const size_t n_extra_take = std::min<size_t>(std::max<int64_t>(0, (int64_t)n_ctx_slot_ - n_batch - 2 * (int64_t)o_.n_predict),
                                                 extra_tokens.size());
    prefix.erase(prefix.begin(), prefix.end() - n_prefix_take);
    suffix.resize(n_suffix_take);
    prefix.insert(prefix.begin(), v.fim_pre());
    append(prefix, prompt);
    suffix.insert(suffix.begin(), v.fim_suf());

    std::vector<int32_t> first = o_.srv.spm_infill ? suffix : prefix, second = o_.srv.spm_infill ? prefix : suffix;
    if (v.add_bos()) first.insert(first.begin(), v.bos());
    first.insert(first.begin(), extra_tokens.end() - n_extra_take, extra_tokens.end());
    append(first, second);
    first.push_back(v.fim_mid());
    return first;
}

// One prompt: a string, an array of token ids or of ids and strings (concatenated; only the first
// string gets BOS), or llama-server's object form {"prompt_string": ..., "multimodal_data": [...]}.
std::vector<int32_t> Api::parse_prompt(const json& p) const {
    if (p.is_object()) {
        const json* md = opt_field(p, "multimodal_data");
        if (md && !(md->is_array() && md->empty())) throw ApiError(400, "multimodal_data: this build has no multimodal input", "not_supported_error");
        const json* ps = opt_field(p, "prompt_string");
        if (!ps || !ps->is_string()) bad_field("prompt_string", "a string");
        return tokenize_prompt(ps->get_ref<const std::string&>());
    }
    if (p.is_string()) return tokenize_prompt(p.get_ref<const std::string&>());
    if (!p.is_array()) bad_field("prompt", "a string, an array of token ids, or an array of prompts");
    std::vector<int32_t> ids;
    bool first = true;
    size_t text_bytes = 0;
    for (const json& x : p) {
        if (x.is_number_integer()) {
            int64_t id = x.get<int64_t>();
            if (x.is_number_unsigned() && x.get<uint64_t>() > (uint64_t)INT32_MAX) id = INT32_MAX;
            if (id < 0 || id >= n_vocab_) {
                throw ApiError(400, "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_vocab_) + ")");
            }
            ids.push_back((int32_t)id);
        } else if (x.is_string()) {
            text_bytes += x.get_ref<const std::string&>().size();
            check_prompt_bytes(text_bytes + ids.size() * max_token_bytes_);
            std::vector<int32_t> t = model_->vocab.tokenize(x.get_ref<const std::string&>(), first, true);
            ids.insert(ids.end(), t.begin(), t.end());
        } else {
            bad_field("prompt", "a string or an array of token ids and strings");
        }
        first = false;
    }
    return ids;
}

// "prompt" as llama-server reads it: an array holding no bare token id is several prompts (each a
// string, an array or an object); anything else is one.
std::vector<std::vector<int32_t>> Api::parse_prompts(const json& pr, size_t max_prompts) const {
    std::vector<std::vector<int32_t>> out;
    const bool several = pr.is_array() && !pr.empty() && std::none_of(pr.begin(), pr.end(), [](const json& x) { return x.is_number(); });
    if (!several) {
        out.push_back(parse_prompt(pr));
        return out;
    }
    if (pr.size() > max_prompts) throw ApiError(400, "at most " + std::to_string(max_prompts) + " prompts per request");
    for (const json& x : pr) out.push_back(parse_prompt(x));
    return out;
}

// A prompt must leave room for at least one generated token in its slot; generation then stops
// when the slot is full (stop_type "limit"), whatever n_predict asks.
void Api::check_fits(const std::vector<int32_t>& prompt) const {
    if (prompt.empty()) throw ApiError(400, "the prompt is empty");
    const int n = (int)prompt.size();
    if (n >= n_ctx_slot_) {
        throw ApiError(400, "the prompt (" + std::to_string(n) + " tokens) exceeds the context of a slot (" + std::to_string(n_ctx_slot_) +
                                " tokens); raise -c or lower -np", "exceed_context_size_error", {{"n_prompt_tokens", n}, {"n_ctx", n_ctx_slot_}});
    }
}

namespace {

// tool_choice: "auto" (default), "none", "required", or "function" for {"type": "function", ...}.
std::string tool_choice_of(const nlohmann::json& b) {
    const nlohmann::json* tc = opt_field(b, "tool_choice");
    if (!tc) return "auto";
    if (tc->is_string() && (*tc == "auto" || *tc == "none" || *tc == "required")) return tc->get<std::string>();
    const nlohmann::json* f = tc->is_object() ? opt_field(*tc, "function") : nullptr;
    if (f && f->is_object() && opt_field(*f, "name") && opt_field(*f, "name")->is_string()) return "function";
    bad_field("tool_choice", "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
}

// A message's content of text parts as one string (joined by newlines, as the family renderers do),
// for templates that print only string content; content with other parts stays as it is.
void flatten_text_parts(nlohmann::ordered_json& message) {
    auto c = message.find("content");
    if (c == message.end() || !c->is_array()) return;
    std::string text;
    for (const auto& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) return;
        if (!text.empty()) text += "\n";
        text += part["text"].get<std::string>();
    }
    *c = text;
}

}  // namespace

// The request as transformers' apply_chat_template gets it: messages and tools in the client's
// member order (from the raw body), --chat-template-kwargs under the request's, the vocabulary's
// bos/eos tokens. tool_choice "none" leaves the tools out.
std::string Api::render_jinja(const json& b, const std::string& body) const {
    using ojson = nlohmann::ordered_json;
    const ojson raw = ojson::parse(body);  // parsed before as b, so valid
    ojson req = ojson::object();
    req["messages"] = raw.at("messages");
    for (ojson& m : req["messages"])
        if (!chat_.typed_content && m.is_object()) flatten_text_parts(m);
    // OpenAI clients send tool-call arguments as JSON text; templates print them as objects (tojson),
    // so text that parses as an object goes in as one, as llama-server does.
    const ojson messages_as_sent = req["messages"];
    bool objects_given = false;
    for (ojson& m : req["messages"]) {
        if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
        for (ojson& call : m["tool_calls"]) {
            ojson* args = call.is_object() && call.contains("function") && call["function"].is_object() && call["function"].contains("arguments")
                              ? &call["function"]["arguments"] : nullptr;
            if (!args || !args->is_string()) continue;
            ojson parsed = ojson::parse(args->get<std::string>(), nullptr, false);
            if (!parsed.is_object()) continue;
            *args = std::move(parsed);
            objects_given = true;
        }
    }
    if (const json* tools = opt_field(b, "tools")) {
        if (!tools->is_array()) bad_field("tools", "an array of tools");
        if (tool_choice_of(b) != "none") req["tools"] = raw.at("tools");
    }
    ojson kwargs = ojson::parse(default_kwargs_.dump());
    if (raw.contains("chat_template_kwargs") && !raw["chat_template_kwargs"].is_null()) {
        if (!raw["chat_template_kwargs"].is_object()) bad_field("chat_template_kwargs", "an object");
        for (auto& kv : raw["chat_template_kwargs"].items()) kwargs[kv.key()] = kv.value();
    }
    req["chat_template_kwargs"] = kwargs;
    req["add_generation_prompt"] = get_bool(b, "add_generation_prompt", true);
    const llm::Vocab& v = model_->vocab;
    req["bos_token"] = v.bos() >= 0 ? v.token_to_piece(v.bos(), true) : "";
    req["eos_token"] = v.eos() >= 0 ? v.token_to_piece(v.eos(), true) : "";
    auto render = [&] { return llm::chat_apply_template(*chat_.jinja, req.dump(-1, ' ', false, ojson::error_handler_t::replace)); };
    try {
        return render();
    } catch (const llm::Error& e) {
        if (!objects_given) throw ApiError(400, std::string("chat template: ") + e.what());
        // A template that joins the arguments to text (Functionary v3.2) takes them as sent, as
        // llama-server's template capabilities (requires_object_arguments) have it.
        req["messages"] = messages_as_sent;
        try {
            return render();
        } catch (const llm::Error&) {
            throw ApiError(400, std::string("chat template: ") + e.what());
        }
    }
}

std::string Api::render_chat(const json& b, const std::string& body) const {
    const json* m = opt_field(b, "messages");
    if (!m) throw ApiError(400, "'messages' is required");
    if (!m->is_array() || m->empty()) bad_field("messages", "a non-empty array of messages");
    if (chat_.jinja) return render_jinja(b, body);
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
    json kwargs = default_kwargs_;  // --chat-template-kwargs, then the request's
    if (const json* kw = opt_field(b, "chat_template_kwargs")) {
        if (!kw->is_object()) bad_field("chat_template_kwargs", "an object");
        kwargs.update(*kw);
    }
    {
        if (const json* th = opt_field(kwargs, "enable_thinking")) {
            if (!th->is_boolean()) bad_field("enable_thinking", "a boolean");
            opt.enable_thinking = th->get<bool>() ? 1 : 0;
        }
    }
    try {
        return llm::chat_render(chat_.family, msgs, opt);
    } catch (const llm::Error& e) {
        throw ApiError(400, std::string("chat template: ") + e.what());
    }
}

json Api::timings_json(const Result& r) const {
    auto per_tok = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
    auto per_s = [](double ms, int n) { return ms > 0 ? 1000.0 * n / ms : 0.0; };
    json j{{"cache_n", r.n_cache_reused},
           {"prompt_n", r.n_prompt_evaluated},
           {"prompt_ms", r.prompt_ms},
           {"prompt_per_token_ms", per_tok(r.prompt_ms, r.n_prompt_evaluated)},
           {"prompt_per_second", per_s(r.prompt_ms, r.n_prompt_evaluated)},
           {"predicted_n", r.n_predicted},
           {"predicted_ms", r.predicted_ms},
           {"predicted_per_token_ms", per_tok(r.predicted_ms, r.n_predicted)},
           {"predicted_per_second", per_s(r.predicted_ms, r.n_predicted)}};
    if (r.n_draft > 0) {  // as llama-server: only when the request drafted
        j["draft_n"] = r.n_draft;
        j["draft_n_accepted"] = r.n_draft_accepted;
    }
    return j;
}

// n_probs entries: log-probabilities before sampling, or with post_sampling_probs the probabilities
// the sampler kept ("prob", "top_probs").
json Api::probs_json(const std::vector<TokenProb>& probs, bool post_sampling) const {
    const llm::Vocab& v = model_->vocab;
    const char* value = post_sampling ? "prob" : "logprob";
    auto entry = [&](int32_t id, double x) {
        std::string piece = v.token_to_piece(id, true);
        json bytes = json::array();
        for (unsigned char c : piece) bytes.push_back(c);
        return json{{"id", id}, {"token", piece}, {"bytes", bytes}, {value, x}};
    };
    json out = json::array();
    for (const TokenProb& tp : probs) {
        double chosen = post_sampling ? 0.0 : tp.logprob;
        json top = json::array();
        for (auto [id, p] : tp.top) {
            top.push_back(entry(id, post_sampling ? (double)p : std::log((double)p)));
            if (post_sampling && id == tp.id) chosen = p;
        }
        json j = entry(tp.id, chosen);
        j[post_sampling ? "top_probs" : "top_logprobs"] = top;
        out.push_back(std::move(j));
    }
    return out;
}

json Api::final_completion(const Completion& c, const TaskParams& p, const std::vector<int32_t>& prompt, int index) const {
    const Result& r = c.final;
    json j{{"index", index},
           {"content", c.content},
           {"tokens", p.return_tokens || p.stream ? c.tokens : std::vector<int32_t>()},
           {"id_slot", r.slot},
           {"stop", true},
           {"model", model_id()},
           {"tokens_predicted", r.n_predicted},
           {"tokens_evaluated", r.n_prompt},
           {"generation_settings", params_json(p)},
           {"prompt", model_->vocab.detokenize(prompt, true)},
           {"has_new_line", c.content.find('\n') != std::string::npos},
           {"truncated", r.truncated},
           {"stop_type", r.stop_type},
           {"stopping_word", r.stopping_word},
           {"tokens_cached", r.n_cache},
           {"timings", timings_json(r)}};
    if (p.n_probs > 0) j["completion_probabilities"] = probs_json(c.probs, p.post_sampling_probs);
    return j;
}

// Every prompt's n_cmpl tasks, submitted together (all or none: a full queue cancels those already in).
std::vector<std::shared_ptr<Channel>> Api::submit_all(const Generation& g) {
    std::vector<std::shared_ptr<Channel>> chs;
    try {
        for (const auto& prompt : g.prompts) {
            for (auto& ch : sched_->submit_n(prompt, g.p, g.n_cmpl)) chs.push_back(ch);
        }
    } catch (...) {
        for (auto& ch : chs) sched_->cancel(ch);
        throw;
    }
    return chs;
}

// Drains a task's results into one completion; the request fails with the task's error.
Api::Completion Api::collect(const std::shared_ptr<Channel>& ch, const http::Request& req) {
    Completion c;
    for (;;) {
        Result r;
        // Liveness after every result, not only while waiting: a steady stream of tokens must not hide
        // a disconnect.
        const bool got = ch->pop(r, 100);
        if (!req.client_connected()) throw ApiError(400, "client disconnected");
        if (!got) continue;
        if (r.kind == Result::Error) throw ApiError(r.status, r.message, r.err_type);
        if (r.kind == Result::Progress) continue;
        c.content += r.text;
        c.tokens.insert(c.tokens.end(), r.tokens.begin(), r.tokens.end());
        c.probs.insert(c.probs.end(), r.probs.begin(), r.probs.end());
        if (r.kind == Result::Final) {
            c.final = std::move(r);
            return c;
        }
    }
}

namespace {

const char* finish_reason(const Result& r) { return r.stop_type == "limit" ? "length" : "stop"; }

json usage_json(int n_prompt, int n_predicted, int n_cached) {
    return json{{"completion_tokens", n_predicted},
                {"prompt_tokens", n_prompt},
                {"total_tokens", n_predicted + n_prompt},
                {"prompt_tokens_details", {{"cached_tokens", n_cached}}}};
}

json progress_json(const Result& r) {
    return json{{"total", r.n_prompt}, {"cache", r.n_cache_reused}, {"processed", r.n_prompt_evaluated}, {"time_ms", r.prompt_ms}};
}

}  // namespace

json Api::oai_base(const Generation& g, const char* object) const {
    return json{{"id", g.id}, {"created", g.created}, {"model", model_id()}, {"system_fingerprint", "llm.hpp"}, {"object", object}};
}

// The whole answer of a non-streamed request: /completion's object (an array for several prompts),
// or OpenAI's with one choice per prompt.
// How a chat's output is parsed: the template's tool-call syntax when tools are offered, reasoning
// per --reasoning-format, and whether the prompt left a thinking block open; --reasoning-budget's
// thinking tags for the scheduler.
void Api::chat_parse_options(const json& b, const std::string& body, const std::string& prompt, Generation& g) const {
    const json* tools = opt_field(b, "tools");
    if (tools && !tools->is_array()) bad_field("tools", "an array of tools");
    const bool offered = tools && !tools->empty() && tool_choice_of(b) != "none";
    g.parse_output = true;
    g.parse.format = offered ? chat_.tool_format : llm::ToolCallFormat::None;
    g.parse.extract_reasoning = o_.srv.reasoning_format != "none";
    g.parse.thinking_open = g.parse.extract_reasoning && llm::chat_prompt_opens_thinking(prompt);
    g.parallel_tool_calls = get_bool(b, "parallel_tool_calls", true);
    if (offered) constrain_tool_calls(b, body, prompt, g);
    const auto tags = llm::chat_thinking_tags(chat_.source);
    if (o_.srv.reasoning_budget >= 0 && !tags.second.empty()) {
        g.p.reasoning_budget = o_.srv.reasoning_budget;
        g.p.thinking_open = llm::chat_prompt_opens_thinking(prompt);
        g.p.think_open = tags.first;
        g.p.think_end = tags.second;
        g.p.think_end_tokens = model_->vocab.tokenize(tags.second, false, true);
    }
}

// Offered tools: their declared string parameters type the XML formats' values, and (unless the
// request brings its own grammar) the grammar of the template's call syntax keeps the calls' arguments
// valid for each tool's schema: lazy for tool_choice "auto", from the first token for "required" or a
// named function (after the thinking, for reasoning templates), one call without parallel_tool_calls.
void Api::constrain_tool_calls(const json& b, const std::string& body, const std::string& prompt, Generation& g) const {
    const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(body).at("tools");  // the client's member order
    g.parse.string_parameters = string_parameters(tools);
    if (!g.p.sampling.grammar.empty()) return;
    ToolChoice choice;
    const std::string mode = tool_choice_of(b);
    choice.mode = mode == "required" ? ToolChoice::Required : mode == "function" ? ToolChoice::Function : ToolChoice::Auto;
    if (choice.mode == ToolChoice::Function) choice.function = b["tool_choice"]["function"]["name"].get<std::string>();
    choice.parallel = g.parallel_tool_calls;
    ThinkingSyntax thinking;
    std::tie(thinking.open, thinking.close) = llm::chat_thinking_tags(chat_.source);
    thinking.opened = llm::chat_prompt_opens_thinking(prompt);
    ToolGrammar tg = tool_call_grammar(chat_.tool_format, tools, choice, thinking);
    if (tg.gbnf.empty()) return;
    try {
        llm::Grammar check(tg.gbnf);
    } catch (const llm::Error& e) {  // the schemas were each valid; their combination should be too
        log_msg('W', "tool-call grammar not used: %s", e.what());
        return;
    }
    g.p.sampling.grammar = std::move(tg.gbnf);
    g.p.sampling.grammar_lazy = tg.lazy;
    g.p.sampling.grammar_triggers = std::move(tg.triggers);
}

namespace {

// OpenAI's tool call object; `index` only in streamed deltas. A call without a model-given id gets a random one.
nlohmann::json tool_call_json(const std::string& id, const std::string& name, const std::string& arguments, const size_t* index) {
    nlohmann::json c{{"id", id.empty() ? random_id("call_") : id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", arguments}}}};
    if (index) c["index"] = *index;
    return c;
}

}  // namespace

// The assistant message of a chat's whole output; `finish` becomes "tool_calls" when it calls tools.
nlohmann::json Api::chat_message(const Generation& g, const std::string& text, std::string& finish) const {
    if (!g.parse_output) return json{{"role", "assistant"}, {"content", text}};
    const llm::ChatParsed p = llm::chat_parse_output(text, g.parse);
    json m{{"role", "assistant"}, {"content", p.content.empty() && !p.tool_calls.empty() ? json(nullptr) : json(p.content)}};
    if (!p.reasoning_content.empty()) m["reasoning_content"] = p.reasoning_content;
    if (p.tool_calls.empty()) return m;
    m["tool_calls"] = json::array();
    for (size_t i = 0; i < p.tool_calls.size() && (g.parallel_tool_calls || i == 0); i++)
        m["tool_calls"].push_back(tool_call_json(p.tool_calls[i].id, p.tool_calls[i].name, p.tool_calls[i].arguments, nullptr));
    finish = "tool_calls";
    return m;
}

// An OpenAI choice's logprobs: {"content": [n_probs entries]} when asked for, else null.
json Api::oai_logprobs(const std::vector<TokenProb>& probs, const TaskParams& p) const {
    return p.n_probs > 0 ? json{{"content", probs_json(probs, p.post_sampling_probs)}} : json(nullptr);
}

namespace {

// The id a call the model gave none gets in a dialect: Anthropic's tool_use ids, else OpenAI's call ids.
const char* call_id_prefix(ApiKind k) { return k == ApiKind::Anthropic ? "toolu_" : "call_"; }

}  // namespace

// The parsed answer for Anthropic's content blocks and the Responses API's output items: one call
// without parallel tool calls, every call with an id.
llm::ChatParsed Api::dialect_answer(const Generation& g, const std::string& text) const {
    llm::ChatParsed p = llm::chat_parse_output(text, g.parse);
    if (!g.parallel_tool_calls && p.tool_calls.size() > 1) p.tool_calls.resize(1);
    for (llm::ChatToolCall& c : p.tool_calls)
        if (c.id.empty()) c.id = random_id(call_id_prefix(g.kind));
    return p;
}

json Api::whole_response(const Generation& g, const std::vector<Completion>& done) const {
    if (g.kind == ApiKind::Anthropic) return anthropic_message(g.id, model_id(), dialect_answer(g, done[0].content), done[0].final);
    if (g.kind == ApiKind::Responses) return response_object(g.id, g.message_id, model_id(), dialect_answer(g, done[0].content), done[0].final);
    if (is_native(g.kind)) {
        json j = json::array();
        for (size_t i = 0; i < done.size(); i++) j.push_back(select_fields(final_completion(done[i], g.p, g.prompts[i / g.n_cmpl], (int)i), g.response_fields));
        return done.size() == 1 ? j[0] : j;
    }
    const bool chat = g.kind == ApiKind::OaiChat;
    json j = oai_base(g, chat ? "chat.completion" : "text_completion");
    j["choices"] = json::array();
    int n_prompt = 0, n_predicted = 0, n_cached = 0;
    for (size_t i = 0; i < done.size(); i++) {
        const Result& r = done[i].final;
        n_predicted += r.n_predicted;
        if (i % g.n_cmpl == 0) {  // a prompt counts once, however many completions it has
            n_prompt += r.n_prompt;
            n_cached += r.n_cache_reused;
        }
        if (chat) {
            std::string finish = finish_reason(r);
            const json message = chat_message(g, done[i].content, finish);
            j["choices"].push_back(json{{"finish_reason", finish}, {"index", i}, {"message", message}});
            if (g.p.n_probs > 0) j["choices"].back()["logprobs"] = oai_logprobs(done[i].probs, g.p);
        } else {
            j["choices"].push_back(json{{"text", done[i].content}, {"index", i}, {"logprobs", oai_logprobs(done[i].probs, g.p)}, {"finish_reason", finish_reason(r)}});
        }
    }
    j["usage"] = usage_json(n_prompt, n_predicted, n_cached);
    j["timings"] = timings_json(done[0].final);
    return j;
}

// The server-sent events of one result of prompt `index`: /completion's, or OpenAI's chunks (the last
// result gives a finish chunk, and with include_usage a chunk with no choices and the usage).
std::string Api::stream_events(const Generation& g, const Result& r, int index, llm::ChatOutputParser* parser) const {
    const bool last = r.kind == Result::Final;
    if (is_native(g.kind)) {
        if (last) return sse(select_fields(final_completion(Completion{r, r.text, r.tokens, r.probs}, g.p, g.prompts[index / g.n_cmpl], index), g.response_fields));
        json j{{"index", index}, {"content", r.text}, {"tokens", r.tokens}, {"stop", false}, {"id_slot", r.slot},
               {"tokens_predicted", r.n_predicted}, {"tokens_evaluated", r.n_prompt}};
        if (r.kind == Result::Progress) j["prompt_progress"] = progress_json(r);
        if (g.p.n_probs > 0 && r.kind == Result::Partial) j["completion_probabilities"] = probs_json(r.probs, g.p.post_sampling_probs);
        if (g.p.timings_per_token && r.kind == Result::Partial) j["timings"] = timings_json(r);
        return sse(j);
    }
    const bool chat = g.kind == ApiKind::OaiChat;
    json j = oai_base(g, chat ? "chat.completion.chunk" : "text_completion");
    if (g.p.timings_per_token && r.kind != Result::Progress) j["timings"] = timings_json(r);
    const json logprobs = r.probs.empty() ? json(nullptr) : oai_logprobs(r.probs, g.p);
    auto choice = [&](const std::string& text, json finish) {
        if (chat) {
            json c{{"finish_reason", finish}, {"index", index}, {"delta", finish.is_null() ? json{{"content", text}} : json::object()}};
            if (!logprobs.is_null() && finish.is_null()) c["logprobs"] = logprobs;
            return c;
        }
        return json{{"text", text}, {"index", index}, {"logprobs", finish.is_null() ? logprobs : json(nullptr)}, {"finish_reason", finish}};
    };
    if (r.kind == Result::Progress) {
        j["choices"] = json::array({choice("", nullptr)});
        j["prompt_progress"] = progress_json(r);
        return sse(j);
    }
    std::string out;
    // one chunk per kind of delta: reasoning_content, content, each tool call's piece; the first
    // carries the result's logprobs
    bool logprobs_sent = logprobs.is_null();
    auto send_delta = [&](const llm::ChatDelta& d) {
        auto chunk = [&](json delta) {
            j["choices"] = json::array({json{{"finish_reason", nullptr}, {"index", index}, {"delta", std::move(delta)}}});
            if (!logprobs_sent) j["choices"][0]["logprobs"] = logprobs;
            logprobs_sent = true;
            out += sse(j);
        };
        if (!d.reasoning_content.empty()) chunk({{"reasoning_content", d.reasoning_content}});
        if (!d.content.empty()) chunk({{"content", d.content}});
        for (const llm::ChatToolCallDelta& t : d.tool_calls) {
            if (!g.parallel_tool_calls && t.index > 0) continue;
            json call = t.first ? tool_call_json(t.id, t.name, t.arguments, &t.index) : json{{"index", t.index}, {"function", {{"arguments", t.arguments}}}};
            chunk({{"tool_calls", json::array({call})}});
        }
    };
    if (parser) {
        send_delta(parser->push(r.text));
        if (last) send_delta(parser->finish());
    } else if (!r.text.empty() || !last) {
        j["choices"] = json::array({choice(r.text, nullptr)});
        out += sse(j);
    }
    if (!last) return out;
    const bool called = parser && !parser->parsed().tool_calls.empty();
    j["choices"] = json::array({choice("", called ? "tool_calls" : finish_reason(r))});
    j["timings"] = timings_json(r);
    const json usage = usage_json(r.n_prompt, r.n_predicted, r.n_cache_reused);
    if (!g.include_usage) j["usage"] = usage;
    out += sse(j);
    if (g.include_usage) {
        j.erase("timings");
        j["choices"] = json::array();
        j["usage"] = usage;
        out += sse(j);
    }
    return out;
}

// Writes every task's results as they come (several prompts interleave); false when the client went away.
bool Api::stream_all(const Generation& g, const std::vector<std::shared_ptr<Channel>>& chs, http::Writer& w) {
    auto cancel_all = [&] { for (auto& ch : chs) sched_->cancel(ch); };
    std::vector<std::unique_ptr<llm::ChatOutputParser>> parsers(chs.size());
    if (g.parse_output)
        for (auto& p : parsers) p = std::make_unique<llm::ChatOutputParser>(g.parse);
    // Anthropic's and the Responses API's event sequences keep state across results (one prompt).
    AnthropicStream anthropic(g.id, model_id());
    ResponsesStream responses(g.id, g.message_id, model_id());
    // Anthropic's tool_use blocks and the Responses API's function_call items: one call without
    // parallel tool calls, each with an id.
    auto dialect_delta = [&](llm::ChatDelta d) {
        auto excluded = [&](const llm::ChatToolCallDelta& t) { return !g.parallel_tool_calls && t.index > 0; };
        d.tool_calls.erase(std::remove_if(d.tool_calls.begin(), d.tool_calls.end(), excluded), d.tool_calls.end());
        for (llm::ChatToolCallDelta& t : d.tool_calls)
            if (t.first && t.id.empty()) t.id = random_id(call_id_prefix(g.kind));
        return d;
    };
    auto dialect_events = [&](auto& stream, const Result& r, llm::ChatOutputParser& parser) {
        const std::string out = stream.partial(r, dialect_delta(parser.push(r.text)));
        return r.kind == Result::Final ? out + stream.final(r, dialect_delta(parser.finish())) : out;
    };
    auto events = [&](const Result& r, int index) {
        if (g.kind == ApiKind::Anthropic) return dialect_events(anthropic, r, *parsers[index]);
        if (g.kind == ApiKind::Responses) return dialect_events(responses, r, *parsers[index]);
        return stream_events(g, r, index, parsers[index].get());
    };
    for (size_t i = 0; g.kind == ApiKind::OaiChat && i < chs.size(); i++) {  // each choice opens with its role
        json j = oai_base(g, "chat.completion.chunk");
        j["choices"] = json::array({json{{"finish_reason", nullptr}, {"index", i}, {"delta", {{"role", "assistant"}, {"content", nullptr}}}}});
        if (!w.write(sse(j))) { cancel_all(); return false; }
    }
    std::vector<bool> finished(chs.size(), false);
    size_t n_finished = 0;
    while (n_finished < chs.size()) {
        for (size_t i = 0; i < chs.size(); i++) {
            Result r;
            if (finished[i] || !chs[i]->pop(r, chs.size() == 1 ? 100 : 5)) continue;
            if (r.kind == Result::Error) {
                cancel_all();
                json e = json::parse(http::error_json(r.status, r.message, r.err_type));
                w.write(is_native(g.kind) ? "error: " + dump(e) + "\n\n" : g.kind == ApiKind::Anthropic ? AnthropicStream::error(e["error"]) : sse(e));
                return true;
            }
            if (!w.write(events(r, (int)i))) { cancel_all(); return false; }
            if (r.kind == Result::Final) { finished[i] = true; n_finished++; }
        }
        if (!w.alive()) { cancel_all(); return false; }   // every round: results need not pause for it
    }
    // OpenAI's streams end with [DONE]; llama.cpp's, Anthropic's and the Responses API's do not.
    const bool oai = g.kind == ApiKind::OaiCompletion || g.kind == ApiKind::OaiChat;
    return !oai || w.write("data: [DONE]\n\n");
}

void Api::handle_generate(const http::Request& req, http::Response& res, ApiKind kind) {
    check_body_bytes(req.body.size());
    if (sched_->embeddings())
        throw ApiError(501, "This server does not support completions. Start it without `--embeddings`", "not_supported_error");
    json b = parse_body(req.body);
    if (kind == ApiKind::Anthropic) b = anthropic_to_chat(b);
    if (kind == ApiKind::Responses) b = responses_to_chat(b);
    Generation g;
    g.kind = kind;
    g.p = parse_params(b, kind);
    if (is_chat(kind)) {
        // The request's own text keeps its members' order for the template (tojson); a converted
        // dialect's request is re-serialized.
        const std::string prompt = render_chat(b, kind == ApiKind::OaiChat ? req.body : dump(b));
        chat_parse_options(b, kind == ApiKind::OaiChat ? req.body : dump(b), prompt, g);
        g.prompts.push_back(tokenize_prompt(prompt));
    } else if (kind == ApiKind::Infill) {
        g.prompts.push_back(infill_prompt(b));
    } else {
        const json* pr = opt_field(b, "prompt");
        if (!pr) throw ApiError(400, "'prompt' is required");
        g.prompts = parse_prompts(*pr);
    }
    for (const auto& prompt : g.prompts) check_fits(prompt);
    // n_cmpl (or OpenAI's n) completions of each prompt, at most one per slot, as llama-server.
    if (kind != ApiKind::Anthropic && kind != ApiKind::Responses) g.n_cmpl = (int)get_int(b, "n_cmpl", get_int(b, "n", 1, 1, INT32_MAX), 1, INT32_MAX);
    if (g.n_cmpl > n_slots_) throw ApiError(400, "n_cmpl cannot be greater than the number of slots, please increase -np");
    if (g.prompts.size() * g.n_cmpl > kMaxPrompts) throw ApiError(400, "at most " + std::to_string(kMaxPrompts) + " completions per request");
    if (const json* so = opt_field(b, "stream_options")) {
        if (!so->is_object()) bad_field("stream_options", "an object");
        g.include_usage = get_bool(*so, "include_usage", false);
    }
    if (const json* f = opt_field(b, "response_fields"); f && is_native(kind)) {
        if (!f->is_array()) bad_field("response_fields", "an array of strings");
        for (const json& x : *f) {
            if (!x.is_string()) bad_field("response_fields", "an array of strings");
            g.response_fields.push_back(x.get<std::string>());
        }
    }
    g.id = answer_id(kind);
    g.message_id = random_id("msg_");
    g.created = (int64_t)time(nullptr);
    std::vector<std::shared_ptr<Channel>> chs = submit_all(g);
    if (g.p.stream) {
        res.stream([this, g, chs](http::Writer& w) { return stream_all(g, chs, w); });
        return;
    }
    std::vector<Completion> done;
    try {
        for (auto& ch : chs) done.push_back(collect(ch, req));
    } catch (...) {
        for (auto& ch : chs) sched_->cancel(ch);
        throw;
    }
    res.set_json(dump(whole_response(g, done)));
}

void Api::handle_tokenize(const http::Request& req, http::Response& res) {
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

void Api::handle_detokenize(const http::Request& req, http::Response& res) {
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

void Api::handle_apply_template(const http::Request& req, http::Response& res) {
    json b = parse_body(req.body);
    res.set_json(dump(json{{"prompt", render_chat(b, req.body)}}));
}

// /chat/completions/input_tokens: the token count of a chat request's rendered prompt.
void Api::handle_input_tokens(const http::Request& req, http::Response& res) {
    json b = parse_body(req.body);
    const size_t n = tokenize_prompt(render_chat(b, req.body)).size();
    res.set_json(dump(json{{"object", "response.input_tokens"}, {"input_tokens", n}}));
}

// /v1/messages/count_tokens: the prompt an Anthropic request renders to, counted (with BOS).
void Api::handle_count_tokens(const http::Request& req, http::Response& res) {
    json b = anthropic_to_chat(parse_body(req.body));
    res.set_json(dump(json{{"input_tokens", (int)tokenize_prompt(render_chat(b, dump(b))).size()}}));
}

void Api::handle_props(http::Response& res) {
    TaskParams def = parse_params(json::object(), ApiKind::Completion);
    const llm::Vocab& v = model_->vocab;
    json j{{"default_generation_settings",
            {{"id", 0}, {"id_task", -1}, {"n_ctx", n_ctx_slot_}, {"speculative", sched_->speculative()}, {"is_processing", false}, {"params", params_json(def)},
             {"prompt", ""}, {"next_token", {{"has_next_token", true}, {"has_new_line", false}, {"n_remain", -1}, {"n_decoded", 0}, {"stopping_word", ""}}}}},
           {"total_slots", n_slots_},
           {"model_alias", model_id()},
           {"model_path", o_.model},
           {"n_ctx", n_ctx_total_},
           {"chat_template", chat_.source},
           {"chat_template_family", llm::chat_family_name(chat_.family)},
           {"chat_template_caps", json::object()},
           {"bos_token", v.bos() >= 0 ? v.token_to_piece(v.bos(), true) : ""},
           {"eos_token", v.eos() >= 0 ? v.token_to_piece(v.eos(), true) : ""},
           {"modalities", {{"vision", false}, {"audio", false}}},
           {"webui", o_.srv.webui},
           {"is_sleeping", false},
           {"build_info", "llm.hpp"}};
    res.set_json(dump(j));
}

// POST /props (with --props, as llama-server): there are no settable properties yet.
void Api::handle_props_post(const http::Request& req, http::Response& res) {
    if (!o_.srv.props_post) {
        throw ApiError(501, "This server does not support changing global properties. Start it with `--props`", "not_supported_error");
    }
    parse_body(req.body);
    res.set_json(dump(json{{"success", true}}));
}

void Api::handle_slots(const http::Request& req, http::Response& res) {
    if (!o_.srv.slots) throw ApiError(501, "This server does not support slots endpoint.", "not_supported_error");
    json arr = json::array();
    bool any_idle = false;
    for (const SlotView& v : sched_->slot_views()) {
        any_idle = any_idle || !v.busy;
        arr.push_back({{"id", v.id},
                       {"id_task", v.task},
                       {"n_ctx", n_ctx_slot_},
                       {"speculative", v.speculative},
                       {"is_processing", v.busy},
                       {"n_past", v.n_past},
                       {"tokens_cached", v.n_past},
                       {"n_prompt_tokens", v.n_prompt},
                       {"n_prompt_tokens_processed", v.n_prompt_processed},
                       {"n_prompt_tokens_cache", v.n_prompt_cache},
                       {"params", v.busy ? params_json(v.params) : json::object()},
                       {"next_token",
                        {{"has_next_token", v.busy}, {"has_new_line", v.has_new_line}, {"n_remain", v.n_remain},
                         {"n_decoded", v.n_decoded}, {"stopping_word", ""}}}});
    }
    if (flag_param(req, "fail_on_no_slot") && !any_idle) throw ApiError(503, "no slot available", "unavailable_error");
    res.set_json(dump(arr));
}

namespace {

// A --slot-save-path file name: a plain name (no folder, no "..", no control characters), at most
// 255 bytes, so that the file stays in that folder.
bool valid_slot_filename(const std::string& name) {
    if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
    for (unsigned char c : name) {
        if (c < 0x20 || c == 0x7f || c == '/' || c == '\\' || c == ':') return false;
    }
    return http::is_valid_utf8(name);
}

}  // namespace

// POST /slots/{id}?action=save|restore|erase.
void Api::handle_slot_action(const http::Request& req, http::Response& res, int slot) {
    if (!o_.srv.slots) throw ApiError(501, "This server does not support slots endpoint.", "not_supported_error");
    const std::string action = req.param("action");
    SlotAction a;
    a.slot = slot;
    std::string name;
    if (action == "erase") {
        a.kind = SlotAction::Erase;
    } else if (action == "save" || action == "restore") {
        if (o_.srv.slot_save_path.empty()) throw ApiError(501, "slot save/restore needs --slot-save-path", "not_supported_error");
        name = get_str(parse_body(req.body), "filename", "");
        if (!valid_slot_filename(name)) throw ApiError(400, "Invalid filename");
        a.kind = action == "save" ? SlotAction::Save : SlotAction::Restore;
        a.path = o_.srv.slot_save_path + "/" + name;
    } else {
        throw ApiError(400, "Invalid action: '" + action + "' (save, restore or erase)");
    }
    const SlotActionResult r = sched_->slot_action(a);
    if (r.status != 200) throw ApiError(r.status, r.error);
    json j{{"id_slot", slot}};
    if (a.kind == SlotAction::Erase) {
        j["n_erased"] = r.n_tokens;
    } else {
        const bool save = a.kind == SlotAction::Save;
        j["filename"] = name;
        j[save ? "n_saved" : "n_restored"] = r.n_tokens;
        j[save ? "n_written" : "n_read"] = r.n_bytes;
        j["timings"] = {{save ? "save_ms" : "restore_ms", r.ms}};
    }
    res.set_json(dump(j));
}

void Api::handle_metrics(http::Response& res) {
    if (!o_.srv.metrics) throw ApiError(501, "This server does not support metrics endpoint. Start it with `--metrics`", "not_supported_error");
    const Load l = sched_->load();
    const Stats& s = l.stats;
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
    metric("counter", "n_tokens_max", "Largest observed n_tokens.", (double)s.n_tokens_max);
    metric("gauge", "n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
           s.n_decode ? (double)s.n_busy_slots / s.n_decode : 0.0);
    metric("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.", s.prompt_s > 0 ? s.prompt_tokens / s.prompt_s : 0.0);
    metric("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.",
           s.predicted_s > 0 ? s.predicted_tokens / s.predicted_s : 0.0);
    metric("gauge", "kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.",
           (double)s.kv_tokens / std::max(1, n_ctx_total_));
    metric("gauge", "kv_cache_tokens", "KV-cache tokens.", (double)s.kv_tokens);
    metric("gauge", "requests_processing", "Number of requests processing.", l.busy);
    metric("gauge", "requests_deferred", "Number of requests deferred.", l.deferred);
    metric("counter", "spec_decode_num_draft_tokens_total", "Total draft tokens generated (0 when spec-decode is off).", (double)s.n_draft_tokens);
    metric("counter", "spec_decode_num_accepted_tokens_total", "Total draft tokens accepted by the target model (0 when spec-decode is off).",
           (double)s.n_draft_accepted);
    metric("counter", "spec_decode_num_drafts_total", "Total speculative decoding verification steps (0 when spec-decode is off).", (double)s.n_drafts);
    res.set_content(out, "text/plain; version=0.0.4");
}

// /models and /v1/models: OpenAI's list with llama-server's fields (one entry), and the Ollama-style
// "models" list llama-server adds.
// As llama-server: 503 while loading; with ?fail_on_no_slot=1 also 503 "no slot available" when every slot
// is busy (a readiness probe: route new work elsewhere). Answered from the accept loop when connections
// are short, so it only reads the scheduler's counters.
void Api::handle_health(const http::Request& req, http::Response& res) {
    if (!ready_.load()) return res.set_error(503, "Loading model", "unavailable_error");
    if (!req.has_param("fail_on_no_slot")) return res.set_json("{\"status\":\"ok\"}");
    const int busy = sched_->load().busy, idle = std::max(0, n_slots_ - busy);
    const bool refuse = flag_param(req, "fail_on_no_slot") && idle == 0;
    res.set_json(dump(json{{"status", refuse ? "no slot available" : "ok"}, {"slots_idle", idle}, {"slots_processing", busy}}),
                 refuse ? 503 : 200);
}

void Api::handle_models(http::Response& res) {
    const llm::HParams& hp = model_->hp;
    const std::string id = model_id();
    json meta{{"vocab_type", model_->vocab.model_type()}, {"n_vocab", n_vocab_},          {"n_ctx_train", hp.n_ctx_train},
              {"n_embd", hp.n_embd},                      {"n_params", model_->n_params()}, {"size", model_->weight_bytes()},
              {"n_ctx", n_ctx_slot_}};
    json m{{"id", id},
           {"aliases", o_.srv.aliases},
           {"tags", o_.srv.tags},
           {"object", "model"},
           {"created", created_},
           {"owned_by", "llamacpp"},
           {"architecture", {{"input_modalities", {"text"}}, {"output_modalities", {"text"}}}},
           {"meta", meta}};
    json ollama{{"name", id}, {"model", id}, {"modified_at", ""}, {"size", ""}, {"digest", ""}, {"type", "model"}, {"description", ""},
                {"tags", o_.srv.tags}, {"capabilities", {"completion"}}, {"parameters", ""},
                {"details", {{"parent_model", ""}, {"format", "gguf"}, {"family", model_->arch_str}, {"families", {model_->arch_str}},
                             {"parameter_size", ""}, {"quantization_level", ""}}}};
    res.set_json(dump(json{{"models", json::array({ollama})}, {"object", "list"}, {"data", json::array({m})}}));
}

namespace {

// Whether a request carries one of the keys, as llama-server reads it: Authorization (less a "Bearer "
// prefix), else x-api-key; compared in time independent of where they differ.
bool has_api_key(const http::Request& r, const std::vector<std::string>& keys) {
    std::string given = r.header("authorization");
    if (given.size() >= 7 && http::detail::iequals(given.substr(0, 7), "bearer ")) given = given.substr(7);
    if (given.empty()) given = r.header("x-api-key");
    bool ok = false;
    for (const std::string& key : keys) {
        unsigned diff = given.size() != key.size();
        for (size_t i = 0; i < given.size(); i++) diff |= (unsigned)(given[i] ^ key[i % key.size()]);
        ok |= diff == 0;
    }
    return ok;
}

}  // namespace

HttpHandler guarded(HttpHandler fn) {
    return [fn](const http::Request& req, http::Response& res) {
        try {
            fn(req, res);
        } catch (const ApiError& e) {
            res = http::Response();
            json body = json::parse(http::error_json(e.status, e.what(), e.type));
            for (const auto& [k, v] : e.fields) body["error"][k] = v;
            res.set_json(dump(body), e.status);
        } catch (const llm::Error& e) {
            res = http::Response();
            res.set_error(400, e.what());
        }
    };
}

void Api::install(http::Server& srv) {
    // Every path under --api-prefix (default: the root).
    const std::string prefix = o_.srv.api_prefix;
    auto route = [&](const char* method, const std::string& path, http::Server::Handler h) { srv.route(method, prefix + path, std::move(h)); };
    auto is_health = [prefix](const std::string& path) { return path == prefix + "/health" || path == prefix + "/v1/health"; };
    auto is_page = [prefix](const std::string& path) { return path == prefix + "/"; };
    const auto& wrap = guarded;
    auto health = [this](const http::Request& q, http::Response& r) { handle_health(q, r); };
    route("GET", "/health", health);
    route("GET", "/v1/health", health);
    auto gen = [&](ApiKind k) { return wrap([this, k](const http::Request& q, http::Response& r) { handle_generate(q, r, k); }); };
    for (const char* p : {"/completion", "/completions"}) route("POST", p, gen(ApiKind::Completion));
    route("POST", "/v1/completions", gen(ApiKind::OaiCompletion));
    for (const char* p : {"/chat/completions", "/v1/chat/completions"}) route("POST", p, gen(ApiKind::OaiChat));
    route("POST", "/infill", gen(ApiKind::Infill));
    route("POST", "/v1/messages", gen(ApiKind::Anthropic));
    route("POST", "/v1/messages/count_tokens", wrap([this](const http::Request& q, http::Response& r) { handle_count_tokens(q, r); }));
    route("POST", "/v1/responses", gen(ApiKind::Responses));
    if (o_.srv.webui) {  // off: / is a 404 like any unknown path, as llama-server's --no-webui
        route("GET", "/", [](const http::Request&, http::Response& r) {
            r.set_content(std::string((const char*)webui_html, webui_html_size), "text/html; charset=utf-8");
        });
    }
    for (const char* p : {"/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"}) {
        route("POST", p, wrap([this](const http::Request& q, http::Response& r) { handle_input_tokens(q, r); }));
    }
    route("POST", "/tokenize", wrap([this](const http::Request& q, http::Response& r) { handle_tokenize(q, r); }));
    route("POST", "/detokenize", wrap([this](const http::Request& q, http::Response& r) { handle_detokenize(q, r); }));
    route("POST", "/apply-template", wrap([this](const http::Request& q, http::Response& r) { handle_apply_template(q, r); }));
    route("GET", "/props", wrap([this](const http::Request&, http::Response& r) { handle_props(r); }));
    route("POST", "/props", wrap([this](const http::Request& q, http::Response& r) { handle_props_post(q, r); }));
    route("GET", "/slots", wrap([this](const http::Request& q, http::Response& r) { handle_slots(q, r); }));
    for (int i = 0; i < o_.n_parallel; i++) {
        route("POST", "/slots/" + std::to_string(i), wrap([this, i](const http::Request& q, http::Response& r) { handle_slot_action(q, r, i); }));
    }
    // /lora-adapters: no adapters are loaded (the --lora flags are accepted and noted); setting an
    // empty list succeeds, any adapter id is llama-server's 400.
    route("GET", "/lora-adapters", wrap([](const http::Request&, http::Response& r) { r.set_json("[]"); }));
    route("POST", "/lora-adapters", wrap([](const http::Request& q, http::Response& r) {
        std::string compact;  // no need to parse: only "[]" can succeed
        for (char c : q.body) if (!isspace((unsigned char)c)) compact += c;
        if (compact.empty() || compact[0] != '[') throw ApiError(400, "the request body must be an array of {\"id\": int, \"scale\": float}");
        if (compact != "[]") throw ApiError(400, "invalid adapter id: no LoRA adapters are loaded");
        r.set_json(dump(json{{"success", true}}));
    }));
    route("GET", "/metrics", wrap([this](const http::Request&, http::Response& r) { handle_metrics(r); }));
    for (const char* p : {"/models", "/v1/models"}) route("GET", p, wrap([this](const http::Request&, http::Response& r) { handle_models(r); }));
    for (const char* p : {"/embedding", "/embeddings"})
        route("POST", p, wrap([this](const http::Request& q, http::Response& r) { handle_embeddings(q, r, false); }));
    route("POST", "/v1/embeddings", wrap([this](const http::Request& q, http::Response& r) { handle_embeddings(q, r, true); }));
    for (const char* p : {"/rerank", "/reranking", "/v1/rerank", "/v1/reranking"})
        route("POST", p, wrap([this](const http::Request& q, http::Response& r) { handle_rerank(q, r); }));

    if (!o_.srv.api_keys.empty()) {
        const std::vector<std::string> keys = o_.srv.api_keys;
        // Public as in llama-server: /health, the page (it asks for the key) and the model list.
        auto is_models = [prefix](const std::string& path) { return path == prefix + "/models" || path == prefix + "/v1/models"; };
        srv.set_auth([keys, is_health, is_page, is_models](const http::Request& r) {
            return is_health(r.path) || is_page(r.path) || is_models(r.path) || has_api_key(r, keys);
        });
    }
    // While the model loads, everything but /health (and the page, which waits for /props) answers 503.
    srv.set_pre_route([this, is_health, is_page](const http::Request& r, http::Response& res) {
        if (ready_.load() || is_health(r.path) || is_page(r.path)) return true;
        res.set_error(503, "Loading model", "unavailable_error");
        return false;
    });
    srv.set_logger([is_health, &srv](const http::Request& r, const http::Response& res) {
        if (res.status == 200 && is_health(r.path)) return;
        if (res.cut_short) {
            log_msg('W', "http: %s:%d %s %s -> %d, stream cut short (%s)", r.remote_addr.c_str(), r.remote_port, r.method.c_str(),
                    r.path.c_str(), res.status, srv.stopping() ? "shutdown grace period over" : "client gone");
        } else {
            log_msg('I', "http: %s:%d %s %s -> %d", r.remote_addr.c_str(), r.remote_port, r.method.c_str(), r.path.c_str(), res.status);
        }
        if (log_enabled('D') && !r.body.empty()) log_msg('D', "http: request body: %.2000s", r.body.c_str());
    });
}


// ---- embeddings and reranking ----------------------------------------------------------------------
// llama-server's bodies: /embedding(s) answer [{"index", "embedding": [[...]]}] (one vector per token with
// --pooling none), /v1/embeddings OpenAI's list with usage and encoding_format float|base64; /rerank
// Jina's {"results": [{"index", "relevance_score"}]} sorted by score (TEI's [{"index", "score"}] when
// the body has "texts"), cut to top_n.

namespace {

std::string base64(const void* data, size_t n) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const uint8_t* p = (const uint8_t*)data;
    std::string out;
    out.reserve((n + 2) / 3 * 4);
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out += alphabet[v >> 18];
        out += alphabet[(v >> 12) & 63];
        out += i + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        out += i + 2 < n ? alphabet[v & 63] : '=';
    }
    return out;
}

}  // namespace

// Evaluates the prompts (each whole, in one step; the scheduler packs several into a step and shares
// the slots with other requests) and returns their results in order. At most one task per slot is in
// flight for this request, so a long list neither fills the queue nor starves other clients.
std::vector<Result> Api::run_embeddings(const http::Request& req, const std::vector<std::vector<int32_t>>& prompts, const TaskParams& p) {
    for (const auto& pr : prompts) {
        if (pr.empty()) throw ApiError(400, "Input content cannot be empty");
        if ((int)pr.size() > n_ctx_slot_) {
            throw ApiError(400, "input (" + std::to_string(pr.size()) + " tokens) is larger than the context of a slot (" +
                                    std::to_string(n_ctx_slot_) + " tokens)", "exceed_context_size_error");
        }
        if ((int)pr.size() > sched_->budget()) {
            throw ApiError(500, "input (" + std::to_string(pr.size()) + " tokens) is too large to process. increase the physical batch size (current batch size: " +
                                    std::to_string(sched_->budget()) + ")", "server_error");
        }
    }
    std::vector<Result> results(prompts.size());
    std::deque<std::pair<size_t, std::shared_ptr<Channel>>> running;
    size_t next = 0;
    auto cancel_all = [&] { for (auto& r : running) sched_->cancel(r.second); };
    while (next < prompts.size() || !running.empty()) {
        while (next < prompts.size() && (int)running.size() < n_slots_) {
            running.emplace_back(next, sched_->submit(prompts[next], p));
            next++;
        }
        Result r;
        if (!running.front().second->pop(r, 100)) {
            if (!req.client_connected()) { cancel_all(); throw ApiError(400, "client disconnected"); }
            continue;
        }
        if (r.kind == Result::Error) { cancel_all(); throw ApiError(r.status, r.message, r.err_type); }
        if (r.kind != Result::Final) continue;
        results[running.front().first] = std::move(r);
        running.pop_front();
    }
    return results;
}

void Api::handle_embeddings(const http::Request& req, http::Response& res, bool oai) {
    if (!sched_->embeddings())
        throw ApiError(501, "This server does not support embeddings. Start it with `--embeddings`", "not_supported_error");
    json b = parse_body(req.body);
    const json* input = opt_field(b, "input");
    if (!input) {
        input = opt_field(b, "content");
        oai = false;  // "content" is llama.cpp's own field: its response shape
    }
    if (!input) throw ApiError(400, "\"input\" or \"content\" must be provided");
    const std::string format = get_str(b, "encoding_format", "float");
    if (format != "float" && format != "base64")
        throw ApiError(400, "The format to return the embeddings in. Can be either float or base64");
    const bool pooled = sched_->pooling() != llm::Pooling::None;
    if (oai && !pooled) throw ApiError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type");
    TaskParams p;
    p.embed = true;
    p.embd_normalize = (int)get_int(b, "embd_normalize", o_.srv.embd_normalize, -1, 64);
    const std::vector<Result> results = run_embeddings(req, parse_prompts(*input, kMaxInputs), p);
    if (!oai) {
        json out = json::array();
        for (size_t i = 0; i < results.size(); i++) out.push_back(json{{"index", i}, {"embedding", results[i].embedding}});
        res.set_json(dump(out));
        return;
    }
    json data = json::array();
    int n_tokens = 0;
    for (size_t i = 0; i < results.size(); i++) {
        const std::vector<float>& e = results[i].embedding[0];
        json item{{"index", i}, {"object", "embedding"}};
        if (format == "base64") {
            item["embedding"] = base64(e.data(), e.size() * sizeof(float));
            item["encoding_format"] = "base64";
        } else {
            item["embedding"] = e;
        }
        data.push_back(item);
        n_tokens += results[i].n_prompt;
    }
    res.set_json(dump(json{{"model", get_str(b, "model", model_id())},
                           {"object", "list"},
                           {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}},
                           {"data", data}}));
}

void Api::handle_rerank(const http::Request& req, http::Response& res) {
    if (!sched_->embeddings() || sched_->pooling() != llm::Pooling::Rank)
        throw ApiError(501, "This server does not support reranking. Start it with `--reranking`", "not_supported_error");
    json b = parse_body(req.body);
    const json* query = opt_field(b, "query");
    if (!query) throw ApiError(400, "\"query\" must be provided");
    if (!query->is_string()) throw ApiError(400, "\"query\" must be a string");
    const bool tei = b.contains("texts");
    const json* docs = opt_field(b, tei ? "texts" : "documents");
    if (!docs || !docs->is_array() || docs->empty() || docs->size() > kMaxInputs ||
        !std::all_of(docs->begin(), docs->end(), [](const json& d) { return d.is_string(); }))
        throw ApiError(400, "\"documents\" must be a non-empty string array");
    const int top_n = (int)get_int(b, "top_n", (int64_t)docs->size(), 0, INT32_MAX);
    const bool return_text = tei && get_bool(b, "return_text", false);
    // Query and document as one pair, as llama-server joins them: [BOS] query [EOS] [SEP] doc [EOS].
    const llm::Vocab& v = model_->vocab;
    const int32_t eos = v.eos() >= 0 ? v.eos() : v.sep();
    const std::vector<int32_t> q = v.tokenize(query->get<std::string>(), false, true);
    std::vector<std::vector<int32_t>> prompts;
    for (const json& d : *docs) {
        std::vector<int32_t> t;
        if (v.add_bos()) t.push_back(v.bos());
        t.insert(t.end(), q.begin(), q.end());
        if (v.add_eos()) t.push_back(eos);
        if (v.add_sep()) t.push_back(v.sep());
        const std::vector<int32_t> doc = v.tokenize(d.get<std::string>(), false, true);
        t.insert(t.end(), doc.begin(), doc.end());
        if (v.add_eos()) t.push_back(eos);
        prompts.push_back(std::move(t));
    }
    TaskParams p;
    p.embed = true;
    p.embd_normalize = -1;  // the score is the head's raw output
    const std::vector<Result> results = run_embeddings(req, prompts, p);
    const char* score_key = tei ? "score" : "relevance_score";
    json items = json::array();
    int n_tokens = 0;
    for (size_t i = 0; i < results.size(); i++) {
        json item{{"index", i}, {score_key, results[i].embedding[0][0]}};
        if (return_text) item["text"] = (*docs)[i];
        items.push_back(item);
        n_tokens += results[i].n_prompt;
    }
    std::stable_sort(items.begin(), items.end(), [&](const json& x, const json& y) { return x[score_key].get<double>() > y[score_key].get<double>(); });
    if ((int)items.size() > top_n) items.erase(items.begin() + top_n, items.end());
    if (tei) {
        res.set_json(dump(items));
        return;
    }
    res.set_json(dump(json{{"model", get_str(b, "model", model_id())},
                           {"object", "list"},
                           {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}},
                           {"results", items}}));
}

}  // namespace srv
