// llm-server's HTTP API (see api.hpp).
#include "api.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <random>

#include "dialects.hpp"
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

std::string random_id(const char* prefix) {
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    thread_local std::mt19937_64 rng(std::random_device{}());
    std::string s = prefix;
    for (int i = 0; i < 32; i++) s += alnum[rng() % (sizeof alnum - 1)];
    return s;
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

// Requests given as chat messages (rendered with the chat template), in whichever dialect.
bool is_chat(ApiKind k) { return k == ApiKind::OaiChat || k == ApiKind::Anthropic || k == ApiKind::Responses; }
// Requests answered in llama.cpp's own /completion shape.
bool is_native(ApiKind k) { return k == ApiKind::Completion || k == ApiKind::Infill; }

// The id of an answer: chatcmpl-..., msg_... (Anthropic), resp_... (Responses) or cmpl-....
std::string answer_id(ApiKind k) {
    return random_id(k == ApiKind::OaiChat ? "chatcmpl-" : k == ApiKind::Anthropic ? "msg_" : k == ApiKind::Responses ? "resp_" : "cmpl-");
}

}  // namespace

Api::Api(const Options& o) : o_(o), created_((int64_t)time(nullptr)) {}

void Api::attach(const llm::Model& model, Scheduler& sched, const ChatTemplate& chat, int n_ctx_total) {
    model_ = &model;
    sched_ = &sched;
    chat_ = chat;
    n_slots_ = sched.n_slots();
    n_ctx_slot_ = sched.n_ctx_slot();
    n_ctx_total_ = n_ctx_total;
    n_vocab_ = model.hp.n_vocab;
    ready_ = true;
}

void Api::check_model(const json& b) const {
    const json* m = opt_field(b, "model");
    if (!m) return;
    if (!m->is_string()) bad_field("model", "a string");
    std::string name = m->get<std::string>();
    std::string base = o_.model.substr(o_.model.find_last_of('/') + 1);
    std::string stem = ends_with(base, ".gguf") ? base.substr(0, base.size() - 5) : base;
    if (name == model_id() || name == o_.model || name == base || name == stem) return;
    throw ApiError(404, "model '" + name + "' not found (this server serves '" + model_id() + "')", "not_found_error");
}

TaskParams Api::parse_params(const json& b, ApiKind kind) const {
    TaskParams p;
    p.sampling = o_.sampling;
    p.n_predict = o_.n_predict;
    p.n_keep = o_.srv.n_keep;
    p.stream = get_bool(b, "stream", false);
    if (!is_native(kind)) {
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

std::vector<int32_t> Api::tokenize_prompt(const std::string& text) const {
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

// "prompt": a string, an array of token ids, or an array mixing strings and ids (concatenated; only the
// first string gets BOS); a one-element array of either is the same. Several prompts are refused.
std::vector<int32_t> Api::parse_prompt(const json& pr) const {
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

std::string Api::render_chat(const json& b) const {
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
        return llm::chat_render(chat_.family, msgs, opt);
    } catch (const llm::Error& e) {
        throw ApiError(400, std::string("chat template: ") + e.what());
    }
}

json Api::timings_json(const Result& r) const {
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

json Api::probs_json(const std::vector<TokenProb>& probs) const {
    const llm::Vocab& v = model_->vocab;
    auto entry = [&](int32_t id, double logprob) {
        std::string piece = v.token_to_piece(id, true);
        json bytes = json::array();
        for (unsigned char c : piece) bytes.push_back(c);
        return json{{"id", id}, {"token", piece}, {"bytes", bytes}, {"logprob", logprob}};
    };
    json out = json::array();
    for (const TokenProb& tp : probs) {
        json j = entry(tp.id, tp.logprob);
        json top = json::array();
        for (auto [id, p] : tp.top) top.push_back(entry(id, std::log((double)p)));
        j["top_logprobs"] = top;
        out.push_back(std::move(j));
    }
    return out;
}

json Api::final_completion(const Result& r, const std::string& content, const std::vector<int32_t>& tokens,
                                 const std::vector<TokenProb>& probs, const TaskParams& p, const std::vector<int32_t>& prompt) const {
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
    if (p.n_probs > 0) j["completion_probabilities"] = probs_json(probs);
    return j;
}

void Api::handle_generate(const http::Request& req, http::Response& res, ApiKind kind) {
    json b = parse_body(req.body);
    if (kind == ApiKind::Anthropic) b = anthropic_to_chat(b);
    if (kind == ApiKind::Responses) b = responses_to_chat(b);
    check_model(b);
    TaskParams p = parse_params(b, kind);
    std::vector<int32_t> prompt;
    if (is_chat(kind)) {
        prompt = tokenize_prompt(render_chat(b));
    } else if (kind == ApiKind::Infill) {
        prompt = infill_prompt(b);
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
    std::shared_ptr<Channel> ch = sched_->submit(prompt, p);

    const std::string id = answer_id(kind);
    const std::string message_id = random_id("msg_");  // the Responses API's output message
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
        std::vector<TokenProb> probs;
        Result r;
        for (;;) {
            if (!ch->pop(r, 100)) {
                if (!req.client_connected()) { sched_->cancel(ch); throw ApiError(400, "client disconnected"); }
                continue;
            }
            if (r.kind == Result::Error) { sched_->cancel(ch); throw ApiError(r.status, r.message, r.err_type); }
            content += r.text;
            tokens.insert(tokens.end(), r.tokens.begin(), r.tokens.end());
            probs.insert(probs.end(), r.probs.begin(), r.probs.end());
            if (r.kind == Result::Final) break;
        }
        json j;
        if (is_native(kind)) {
            j = final_completion(r, content, tokens, probs, p, prompt);
        } else if (kind == ApiKind::Anthropic) {
            j = anthropic_message(id, model, content, r);
        } else if (kind == ApiKind::Responses) {
            j = response_object(id, message_id, model, content, r);
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

    // The event sequences of the other dialects keep state across results.
    auto anthropic = kind == ApiKind::Anthropic ? std::make_shared<AnthropicStream>(id, model, n_prompt) : nullptr;
    auto responses = kind == ApiKind::Responses ? std::make_shared<ResponsesStream>(id, message_id, model) : nullptr;
    res.stream([=](http::Writer& w) {
        auto chunk = [&](const Result& r, bool last) -> std::string {
            if (kind == ApiKind::Anthropic) return last ? anthropic->final(r) : anthropic->partial(r);
            if (kind == ApiKind::Responses) return last ? responses->final(r) : responses->partial(r);
            if (is_native(kind)) {
                if (last) return sse(final_completion(r, r.text, r.tokens, r.probs, p, prompt));
                json j{{"index", 0}, {"content", r.text}, {"tokens", r.tokens}, {"stop", false}, {"id_slot", -1},
                       {"tokens_predicted", 0}, {"tokens_evaluated", (int)prompt.size()}};
                if (p.n_probs > 0) j["completion_probabilities"] = probs_json(r.probs);
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
            if (!w.write(sse(j))) { sched_->cancel(ch); return false; }
        }
        for (;;) {
            Result r;
            if (!ch->pop(r, 100)) {
                if (!w.alive()) { sched_->cancel(ch); return false; }
                continue;
            }
            if (r.kind == Result::Error) {
                json e = json::parse(http::error_json(r.status, r.message, r.err_type));
                w.write(is_native(kind) ? "error: " + dump(e) + "\n\n" : kind == ApiKind::Anthropic ? AnthropicStream::error(e["error"]) : sse(e));
                return true;
            }
            bool last = r.kind == Result::Final;
            if (!w.write(chunk(r, last))) { sched_->cancel(ch); return false; }
            if (last) return true;
        }
    });
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
    res.set_json(dump(json{{"prompt", render_chat(b)}}));
}

// /v1/messages/count_tokens: the prompt an Anthropic request renders to, counted (with BOS).
void Api::handle_count_tokens(const http::Request& req, http::Response& res) {
    json b = anthropic_to_chat(parse_body(req.body));
    res.set_json(dump(json{{"input_tokens", (int)tokenize_prompt(render_chat(b)).size()}}));
}

void Api::handle_props(http::Response& res) {
    TaskParams def = parse_params(json::object(), ApiKind::Completion);
    const llm::Vocab& v = model_->vocab;
    json j{{"default_generation_settings",
            {{"id", 0}, {"id_task", -1}, {"n_ctx", n_ctx_slot_}, {"speculative", false}, {"is_processing", false}, {"params", params_json(def)}}},
           {"total_slots", n_slots_},
           {"model_alias", model_id()},
           {"model_path", o_.model},
           {"n_ctx", n_ctx_total_},
           {"chat_template", chat_.source},
           {"chat_template_family", llm::chat_family_name(chat_.family)},
           {"bos_token", v.bos() >= 0 ? v.token_to_piece(v.bos(), true) : ""},
           {"eos_token", v.eos() >= 0 ? v.token_to_piece(v.eos(), true) : ""},
           {"modalities", {{"vision", false}, {"audio", false}}},
           {"build_info", "llm.hpp"}};
    res.set_json(dump(j));
}

void Api::handle_slots(const http::Request& req, http::Response& res) {
    json arr = json::array();
    bool any_idle = false;
    {
        for (const SlotView& v : sched_->slot_views()) {
            any_idle = any_idle || !v.busy;
            arr.push_back({{"id", v.id},
                           {"id_task", v.task},
                           {"n_ctx", n_ctx_slot_},
                           {"speculative", false},
                           {"is_processing", v.busy},
                           {"n_past", v.n_past},
                           {"tokens_cached", v.n_past},
                           {"n_prompt_tokens", v.n_prompt},
                           {"params", v.busy ? params_json(v.params) : json::object()},
                           {"next_token",
                            {{"has_next_token", v.busy}, {"has_new_line", v.has_new_line}, {"n_remain", v.n_remain},
                             {"n_decoded", v.n_decoded}, {"stopping_word", ""}}}});
        }
    }
    std::string f = req.param("fail_on_no_slot");
    if (!f.empty() && f != "0" && f != "false" && !any_idle) throw ApiError(503, "no slot available", "unavailable_error");
    res.set_json(dump(arr));
}

void Api::handle_metrics(http::Response& res) {
    const Load l = sched_->load();
    const Stats& s = l.stats;
    const int busy = l.busy, deferred = l.deferred;
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

void Api::handle_models(http::Response& res) {
    const llm::HParams& hp = model_->hp;
    json meta{{"vocab_type", model_->vocab.model_type()}, {"n_vocab", n_vocab_},     {"n_ctx_train", hp.n_ctx_train},
              {"n_embd", hp.n_embd},                      {"n_params", model_->n_params()}, {"size", model_->weight_bytes()}};
    json m{{"id", model_id()}, {"object", "model"}, {"created", created_}, {"owned_by", "llamacpp"}, {"meta", meta}};
    res.set_json(dump(json{{"object", "list"}, {"data", json::array({m})}}));
}

void Api::install(http::Server& srv) {
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
        if (ready_.load()) res.set_json("{\"status\":\"ok\"}");
        else res.set_error(503, "Loading model", "unavailable_error");
    };
    srv.route("GET", "/health", health);
    srv.route("GET", "/v1/health", health);
    auto gen = [&](ApiKind k) { return wrap([this, k](const http::Request& q, http::Response& r) { handle_generate(q, r, k); }); };
    for (const char* p : {"/completion", "/completions"}) srv.route("POST", p, gen(ApiKind::Completion));
    srv.route("POST", "/v1/completions", gen(ApiKind::OaiCompletion));
    for (const char* p : {"/chat/completions", "/v1/chat/completions"}) srv.route("POST", p, gen(ApiKind::OaiChat));
    srv.route("POST", "/infill", gen(ApiKind::Infill));
    srv.route("POST", "/v1/messages", gen(ApiKind::Anthropic));
    srv.route("POST", "/v1/messages/count_tokens", wrap([this](const http::Request& q, http::Response& r) { handle_count_tokens(q, r); }));
    srv.route("POST", "/v1/responses", gen(ApiKind::Responses));
    if (o_.srv.webui) {  // off: / is a 404 like any unknown path, as llama-server's --no-webui
        srv.route("GET", "/", [](const http::Request&, http::Response& r) {
            r.set_content(std::string((const char*)webui_html, webui_html_size), "text/html; charset=utf-8");
        });
    }
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
            if (r.path == "/health" || r.path == "/v1/health" || r.path == "/") return true;  // the page asks for the key
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
        if (ready_.load() || r.path == "/health" || r.path == "/v1/health") return true;
        res.set_error(503, "Loading model", "unavailable_error");
        return false;
    });
    srv.set_logger([](const http::Request& r, const http::Response& res) {
        if (res.status == 200 && (r.path == "/health" || r.path == "/v1/health")) return;
        log_msg('I', "http: %s:%d %s %s -> %d", r.remote_addr.c_str(), r.remote_port, r.method.c_str(), r.path.c_str(), res.status);
    });
}

}  // namespace srv
