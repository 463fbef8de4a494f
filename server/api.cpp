// llm-server's HTTP API (see api.hpp).
#include "api.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <functional>
#include <random>

#include "util.hpp"

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

// generation_settings: every field llama-server reports; samplers this build does not have yet
// show their "off" values.
json params_json(const TaskParams& p) {
    const llm::SamplerParams& sp = p.sampling;
    return json{{"n_predict", p.n_predict},
                {"seed", sp.seed},
                {"temperature", sp.temperature},
                {"dynatemp_range", 0.0},
                {"dynatemp_exponent", 1.0},
                {"top_k", sp.top_k},
                {"top_p", sp.top_p},
                {"min_p", sp.min_p},
                {"top_n_sigma", -1.0},
                {"xtc_probability", 0.0},
                {"xtc_threshold", 0.1},
                {"typical_p", 1.0},
                {"repeat_last_n", sp.penalty_last_n},
                {"repeat_penalty", sp.repeat_penalty},
                {"presence_penalty", sp.presence_penalty},
                {"frequency_penalty", sp.frequency_penalty},
                {"dry_multiplier", 0.0},
                {"dry_base", 1.75},
                {"dry_allowed_length", 2},
                {"dry_penalty_last_n", -1},
                {"dry_sequence_breakers", {"\n", ":", "\"", "*"}},
                {"mirostat", 0},
                {"mirostat_tau", 5.0},
                {"mirostat_eta", 0.1},
                {"stop", p.stop},
                {"max_tokens", p.n_predict},
                {"n_keep", p.n_keep},
                {"n_discard", 0},
                {"ignore_eos", p.ignore_eos},
                {"stream", p.stream},
                {"logit_bias", json::array()},
                {"n_probs", p.n_probs},
                {"min_keep", 0},
                {"grammar", ""},
                {"samplers", {"penalties", "top_k", "top_p", "min_p", "temperature"}},
                {"speculative.n_max", 0},
                {"speculative.n_min", 0},
                {"speculative.p_min", 0.0},
                {"timings_per_token", false},
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

}  // namespace

Api::Api(const Options& o) : o_(o), created_((int64_t)time(nullptr)) {
    if (!o.srv.chat_template_kwargs.empty()) {
        try {
            default_kwargs_ = json::parse(o.srv.chat_template_kwargs);
        } catch (const json::exception&) {
        }
        if (!default_kwargs_.is_object()) usage_error("--chat-template-kwargs must be a JSON object");
    }
}

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

TaskParams Api::parse_params(const json& b, ApiKind kind) const {
    TaskParams p;
    p.sampling = o_.sampling;
    p.n_predict = o_.n_predict;
    p.n_keep = o_.srv.n_keep;
    p.stop = o_.reverse_prompts;
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
    p.post_sampling_probs = get_bool(b, "post_sampling_probs", false);
    p.cache_prompt = get_bool(b, "cache_prompt", o_.srv.cache_prompt);
    p.return_tokens = get_bool(b, "return_tokens", false);
    p.return_progress = get_bool(b, "return_progress", false);
    p.ignore_eos = get_bool(b, "ignore_eos", o_.ignore_eos);
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

std::vector<int32_t> Api::tokenize_prompt(const std::string& text) const {
    const llm::Vocab& v = model_->vocab;
    std::vector<int32_t> ids = v.tokenize(text, true, true);
    // A template that writes bos_token itself, tokenized with the model's own BOS: keep one.
    if (ids.size() >= 2 && v.bos() >= 0 && ids[0] == v.bos() && ids[1] == v.bos()) ids.erase(ids.begin());
    return ids;
}

// One prompt: a string, an array of token ids or of ids and strings (concatenated; only the first
// string gets BOS), or llama-server's object form {"prompt_string": ..., "multimodal_data": [...]}.
std::vector<int32_t> Api::parse_prompt(const json& p) const {
    if (p.is_object()) {
        const json* md = opt_field(p, "multimodal_data");
        if (md && !(md->is_array() && md->empty())) throw ApiError(400, "multimodal_data: this build has no multimodal input", "not_supported_error");
        const json* ps = opt_field(p, "prompt_string");
        if (!ps || !ps->is_string()) bad_field("prompt_string", "a string");
        return tokenize_prompt(ps->get<std::string>());
    }
    if (p.is_string()) return tokenize_prompt(p.get<std::string>());
    if (!p.is_array()) bad_field("prompt", "a string, an array of token ids, or an array of prompts");
    std::vector<int32_t> ids;
    bool first = true;
    for (const json& x : p) {
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
        } else {
            bad_field("prompt", "a string or an array of token ids and strings");
        }
        first = false;
    }
    return ids;
}

// "prompt" as llama-server reads it: an array holding no bare token id is several prompts (each a
// string, an array or an object); anything else is one.
std::vector<std::vector<int32_t>> Api::parse_prompts(const json& pr) const {
    std::vector<std::vector<int32_t>> out;
    const bool several = pr.is_array() && !pr.empty() && std::none_of(pr.begin(), pr.end(), [](const json& x) { return x.is_number(); });
    if (!several) {
        out.push_back(parse_prompt(pr));
        return out;
    }
    if (pr.size() > kMaxPrompts) throw ApiError(400, "at most " + std::to_string(kMaxPrompts) + " prompts per request");
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

// Every prompt's task, submitted together (all or none: a full queue cancels those already in).
std::vector<std::shared_ptr<Channel>> Api::submit_all(const std::vector<std::vector<int32_t>>& prompts, const TaskParams& p) {
    std::vector<std::shared_ptr<Channel>> chs;
    try {
        for (const auto& prompt : prompts) chs.push_back(sched_->submit(prompt, p));
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
        if (!ch->pop(r, 100)) {
            if (!req.client_connected()) throw ApiError(400, "client disconnected");
            continue;
        }
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
json Api::whole_response(const Generation& g, const std::vector<Completion>& done) const {
    if (g.kind == ApiKind::Completion) {
        json j = json::array();
        for (size_t i = 0; i < done.size(); i++) j.push_back(final_completion(done[i], g.p, g.prompts[i], (int)i));
        return done.size() == 1 ? j[0] : j;
    }
    const bool chat = g.kind == ApiKind::OaiChat;
    json j = oai_base(g, chat ? "chat.completion" : "text_completion");
    j["choices"] = json::array();
    int n_prompt = 0, n_predicted = 0, n_cached = 0;
    for (size_t i = 0; i < done.size(); i++) {
        const Result& r = done[i].final;
        n_prompt += r.n_prompt;
        n_predicted += r.n_predicted;
        n_cached += r.n_cache_reused;
        if (chat) {
            j["choices"].push_back(json{{"finish_reason", finish_reason(r)}, {"index", i}, {"message", {{"role", "assistant"}, {"content", done[i].content}}}});
        } else {
            j["choices"].push_back(json{{"text", done[i].content}, {"index", i}, {"logprobs", nullptr}, {"finish_reason", finish_reason(r)}});
        }
    }
    j["usage"] = usage_json(n_prompt, n_predicted, n_cached);
    j["timings"] = timings_json(done[0].final);
    return j;
}

// The server-sent events of one result of prompt `index`: /completion's, or OpenAI's chunks (the last
// result gives a finish chunk, and with include_usage a chunk with no choices and the usage).
std::string Api::stream_events(const Generation& g, const Result& r, int index) const {
    const bool last = r.kind == Result::Final;
    if (g.kind == ApiKind::Completion) {
        if (last) return sse(final_completion(Completion{r, r.text, r.tokens, r.probs}, g.p, g.prompts[index], index));
        json j{{"index", index}, {"content", r.text}, {"tokens", r.tokens}, {"stop", false}, {"id_slot", r.slot},
               {"tokens_predicted", r.n_predicted}, {"tokens_evaluated", r.n_prompt}};
        if (r.kind == Result::Progress) j["prompt_progress"] = progress_json(r);
        if (g.p.n_probs > 0 && r.kind == Result::Partial) j["completion_probabilities"] = probs_json(r.probs, g.p.post_sampling_probs);
        return sse(j);
    }
    const bool chat = g.kind == ApiKind::OaiChat;
    json j = oai_base(g, chat ? "chat.completion.chunk" : "text_completion");
    auto choice = [&](const std::string& text, json finish) {
        if (chat) return json{{"finish_reason", finish}, {"index", index}, {"delta", finish.is_null() ? json{{"content", text}} : json::object()}};
        return json{{"text", text}, {"index", index}, {"logprobs", nullptr}, {"finish_reason", finish}};
    };
    if (r.kind == Result::Progress) {
        j["choices"] = json::array({choice("", nullptr)});
        j["prompt_progress"] = progress_json(r);
        return sse(j);
    }
    std::string out;
    if (!r.text.empty() || !last) {
        j["choices"] = json::array({choice(r.text, nullptr)});
        out += sse(j);
    }
    if (!last) return out;
    j["choices"] = json::array({choice("", finish_reason(r))});
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
    if (g.kind == ApiKind::OaiChat) {
        json j = oai_base(g, "chat.completion.chunk");
        j["choices"] = json::array({json{{"finish_reason", nullptr}, {"index", 0}, {"delta", {{"role", "assistant"}, {"content", nullptr}}}}});
        if (!w.write(sse(j))) { cancel_all(); return false; }
    }
    std::vector<bool> finished(chs.size(), false);
    size_t n_finished = 0;
    while (n_finished < chs.size()) {
        bool any = false;
        for (size_t i = 0; i < chs.size(); i++) {
            Result r;
            if (finished[i] || !chs[i]->pop(r, chs.size() == 1 ? 100 : 5)) continue;
            any = true;
            if (r.kind == Result::Error) {
                cancel_all();
                json e = json::parse(http::error_json(r.status, r.message, r.err_type));
                w.write(g.kind == ApiKind::Completion ? "error: " + dump(e) + "\n\n" : sse(e));
                return true;
            }
            if (!w.write(stream_events(g, r, (int)i))) { cancel_all(); return false; }
            if (r.kind == Result::Final) { finished[i] = true; n_finished++; }
        }
        if (!any && !w.alive()) { cancel_all(); return false; }
    }
    return g.kind == ApiKind::Completion || w.write("data: [DONE]\n\n");
}

void Api::handle_generate(const http::Request& req, http::Response& res, ApiKind kind) {
    json b = parse_body(req.body);
    Generation g;
    g.kind = kind;
    g.p = parse_params(b, kind);
    if (kind == ApiKind::OaiChat) {
        g.prompts.push_back(tokenize_prompt(render_chat(b)));
    } else {
        const json* pr = opt_field(b, "prompt");
        if (!pr) throw ApiError(400, "'prompt' is required");
        g.prompts = parse_prompts(*pr);
    }
    for (const auto& prompt : g.prompts) check_fits(prompt);
    if (const json* so = opt_field(b, "stream_options")) {
        if (!so->is_object()) bad_field("stream_options", "an object");
        g.include_usage = get_bool(*so, "include_usage", false);
    }
    g.id = random_id(kind == ApiKind::OaiChat ? "chatcmpl-" : "cmpl-");
    g.created = (int64_t)time(nullptr);
    std::vector<std::shared_ptr<Channel>> chs = submit_all(g.prompts, g.p);
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
    res.set_json(dump(json{{"prompt", render_chat(b)}}));
}

// /chat/completions/input_tokens: the token count of a chat request's rendered prompt.
void Api::handle_input_tokens(const http::Request& req, http::Response& res) {
    json b = parse_body(req.body);
    const size_t n = tokenize_prompt(render_chat(b)).size();
    res.set_json(dump(json{{"object", "response.input_tokens"}, {"input_tokens", n}}));
}

void Api::handle_props(http::Response& res) {
    TaskParams def = parse_params(json::object(), ApiKind::Completion);
    const llm::Vocab& v = model_->vocab;
    json j{{"default_generation_settings",
            {{"id", 0}, {"id_task", -1}, {"n_ctx", n_ctx_slot_}, {"speculative", false}, {"is_processing", false}, {"params", params_json(def)},
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
    std::string f = req.param("fail_on_no_slot");
    if (!f.empty() && f != "0" && f != "false" && !any_idle) throw ApiError(503, "no slot available", "unavailable_error");
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
    metric("counter", "spec_decode_num_draft_tokens_total", "Total draft tokens generated (0 when spec-decode is off).", 0);
    metric("counter", "spec_decode_num_accepted_tokens_total", "Total draft tokens accepted by the target model (0 when spec-decode is off).", 0);
    metric("counter", "spec_decode_num_drafts_total", "Total speculative decoding verification steps (0 when spec-decode is off).", 0);
    res.set_content(out, "text/plain; version=0.0.4");
}

// /models and /v1/models: OpenAI's list with llama-server's fields (one entry), and the Ollama-style
// "models" list llama-server adds.
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

// Whether a request carries one of the keys (x-api-key, or Authorization: Bearer), compared in time
// independent of where they differ.
bool has_api_key(const http::Request& r, const std::vector<std::string>& keys) {
    std::string given = r.header("x-api-key");
    std::string auth = r.header("authorization");
    if (given.empty() && auth.size() > 7 && http::detail::iequals(auth.substr(0, 7), "bearer ")) given = auth.substr(7);
    bool ok = false;
    for (const std::string& key : keys) {
        unsigned diff = given.size() != key.size();
        for (size_t i = 0; i < given.size(); i++) diff |= (unsigned)(given[i] ^ key[i % key.size()]);
        ok |= diff == 0;
    }
    return ok;
}

}  // namespace

void Api::install(http::Server& srv) {
    // Every path under --api-prefix (default: the root).
    const std::string prefix = o_.srv.api_prefix;
    auto route = [&](const char* method, const std::string& path, http::Server::Handler h) { srv.route(method, prefix + path, std::move(h)); };
    auto is_health = [prefix](const std::string& path) { return path == prefix + "/health" || path == prefix + "/v1/health"; };
    // Errors a handler raises become OpenAI-style error bodies; the server keeps serving.
    auto wrap = [](std::function<void(const http::Request&, http::Response&)> fn) {
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
    };
    auto health = [this](const http::Request&, http::Response& res) {
        if (ready_.load()) res.set_json("{\"status\":\"ok\"}");
        else res.set_error(503, "Loading model", "unavailable_error");
    };
    route("GET", "/health", health);
    route("GET", "/v1/health", health);
    auto gen = [&](ApiKind k) { return wrap([this, k](const http::Request& q, http::Response& r) { handle_generate(q, r, k); }); };
    for (const char* p : {"/completion", "/completions"}) route("POST", p, gen(ApiKind::Completion));
    route("POST", "/v1/completions", gen(ApiKind::OaiCompletion));
    for (const char* p : {"/chat/completions", "/v1/chat/completions"}) route("POST", p, gen(ApiKind::OaiChat));
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
    // No embedding model is ever loaded here: llama-server's answer without --embeddings.
    for (const char* p : {"/embedding", "/embeddings", "/v1/embeddings"}) {
        route("POST", p, wrap([](const http::Request&, http::Response&) {
            throw ApiError(501, "This server does not support embeddings. Start it with `--embeddings`", "not_supported_error");
        }));
    }
    route("GET", "/metrics", wrap([this](const http::Request&, http::Response& r) { handle_metrics(r); }));
    for (const char* p : {"/models", "/v1/models"}) route("GET", p, wrap([this](const http::Request&, http::Response& r) { handle_models(r); }));

    if (!o_.srv.api_keys.empty()) {
        const std::vector<std::string> keys = o_.srv.api_keys;
        srv.set_auth([keys, is_health](const http::Request& r) { return is_health(r.path) || has_api_key(r, keys); });
    }
    // While the model loads, everything but /health answers 503.
    srv.set_pre_route([this, is_health](const http::Request& r, http::Response& res) {
        if (ready_.load() || is_health(r.path)) return true;
        res.set_error(503, "Loading model", "unavailable_error");
        return false;
    });
    srv.set_logger([is_health](const http::Request& r, const http::Response& res) {
        if (res.status == 200 && is_health(r.path)) return;
        log_msg('I', "http: %s:%d %s %s -> %d", r.remote_addr.c_str(), r.remote_port, r.method.c_str(), r.path.c_str(), res.status);
        if (log_enabled('D') && !r.body.empty()) log_msg('D', "http: request body: %.2000s", r.body.c_str());
    });
}

}  // namespace srv
