// llama-server's request fields and flags beyond the basics, end to end over real sockets against
// SmolLM2: n_cmpl / OpenAI's n, timings_per_token, --cache-reuse / n_cache_reuse, n_indent,
// t_max_predict_ms, and the TLS flags (refused: this build has no TLS).
#include <set>

#include "server_util.hpp"

namespace {

using json = nlohmann::json;
using namespace testserver;

// 3 slots of 512 tokens; chunks of 8 or more cached tokens are reused at new positions by default.
ServerProcess& compat_server() {
    static std::unique_ptr<ServerProcess> s;
    if (!s) s = std::make_unique<ServerProcess>(server_cmd({"-np", "3", "-c", "1536", "--cache-reuse", "8"}));
    return *s;
}

json ok(const Reply& r) {
    REQUIRE_MESSAGE(r.status == 200, r.raw);
    return r.body;
}

const char* kCode = "def fibonacci(n):";

}  // namespace

TEST_CASE("server compat: n_cmpl and OpenAI's n give one choice per completion, the prompt evaluated once") {
    const int port = compat_server().port;
    const json base = {{"prompt", "The capital of France is"}, {"n_predict", 8}, {"temperature", 0}, {"cache_prompt", false}};
    const std::string greedy = ok(post(port, "/completion", base))["content"];

    json body = base;
    body["n_cmpl"] = 3;
    body["cache_prompt"] = true;
    const json all = ok(post(port, "/completion", body));
    REQUIRE(all.is_array());
    REQUIRE(all.size() == 3);
    for (int i = 0; i < 3; i++) {
        CAPTURE(i);
        CHECK(all[i]["index"] == i);
        CHECK(all[i]["content"] == greedy);
        CHECK(all[i]["tokens_predicted"] == 8);
    }
    // The children start from a copy of the first's cache: only the last prompt token is evaluated.
    const int n_prompt = all[0]["tokens_evaluated"];
    for (int i = 1; i < 3; i++) {
        CHECK(all[i]["timings"]["cache_n"] == n_prompt - 1);
        CHECK(all[i]["timings"]["prompt_n"] == 1);
    }

    // Two prompts x 2 completions: index = prompt * n_cmpl + completion.
    json two = base;
    two["prompt"] = json::array({"The capital of France is", "The three primary colors are"});
    two["n_cmpl"] = 2;
    const json four = ok(post(port, "/completion", two));
    REQUIRE(four.size() == 4);
    for (int i = 0; i < 4; i++) CHECK(four[i]["index"] == i);
    CHECK(four[0]["content"] == greedy);
    CHECK(four[1]["content"] == greedy);
    CHECK(four[2]["content"] == four[3]["content"]);
    CHECK(four[2]["prompt"].get<std::string>().find("primary colors") != std::string::npos);

    // OpenAI chat with n: one choice each, usage counts the prompt once and every completion.
    const json chat_body = {{"model", "gpt-4o-mini"}, {"messages", {{{"role", "user"}, {"content", "Name a color."}}}},
                            {"max_tokens", 6}, {"temperature", 0}, {"n", 2}};
    const json chat = ok(post(port, "/v1/chat/completions", chat_body));
    REQUIRE(chat["choices"].size() == 2);
    CHECK(chat["choices"][0]["index"] == 0);
    CHECK(chat["choices"][1]["index"] == 1);
    CHECK(chat["choices"][0]["message"]["content"] == chat["choices"][1]["message"]["content"]);
    json one_body = chat_body;
    one_body.erase("n");
    const json one = ok(post(port, "/v1/chat/completions", one_body));
    CHECK(chat["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]);
    CHECK(chat["usage"]["completion_tokens"] == 2 * one["usage"]["completion_tokens"].get<int>());

    // Streamed OpenAI completions: both indices stream, each the same text as unstreamed.
    const json cmpl_body = {{"model", "x"}, {"prompt", "The capital of France is"}, {"max_tokens", 8}, {"temperature", 0}, {"n", 2}};
    const json whole = ok(post(port, "/v1/completions", cmpl_body));
    REQUIRE(whole["choices"].size() == 2);
    json stream_body = cmpl_body;
    stream_body["stream"] = true;
    Stream st = post_stream(port, "/v1/completions", stream_body);
    REQUIRE(st.status == 200);
    CHECK(st.done);
    std::string text[2];
    int finishes = 0;
    for (const json& e : st.events) {
        for (const json& c : e["choices"]) {
            const int i = c["index"];
            REQUIRE((i == 0 || i == 1));
            text[i] += c["text"].get<std::string>();
            finishes += !c["finish_reason"].is_null();
        }
    }
    CHECK(finishes == 2);
    CHECK(text[0] == whole["choices"][0]["text"]);
    CHECK(text[1] == whole["choices"][1]["text"]);
    CHECK(text[0] == greedy);

    // Streamed chat: each choice opens with its own role delta.
    json chat_stream = chat_body;
    chat_stream["stream"] = true;
    Stream cs = post_stream(port, "/v1/chat/completions", chat_stream);
    std::set<int> roles;
    for (const json& e : cs.events) {
        for (const json& c : e["choices"])
            if (c["delta"].contains("role")) roles.insert(c["index"].get<int>());
    }
    CHECK(roles == std::set<int>{0, 1});

    // More completions than slots, or none: llama-server's 400.
    json too_many = base;
    too_many["n_cmpl"] = 4;
    Reply r = post(port, "/completion", too_many);
    CHECK(r.status == 400);
    CHECK(r.body["error"]["message"].get<std::string>().find("n_cmpl cannot be greater than the number of slots") != std::string::npos);
    json zero = chat_body;
    zero["n"] = 0;
    CHECK(post(port, "/v1/chat/completions", zero).status == 400);
}

TEST_CASE("server compat: timings_per_token puts timings in every streamed result") {
    const int port = compat_server().port;
    json body = {{"prompt", "Once upon a time"}, {"n_predict", 6}, {"temperature", 0}, {"stream", true}, {"timings_per_token", true}};
    Stream s = post_stream(port, "/completion", body);
    REQUIRE(s.status == 200);
    REQUIRE(s.events.size() >= 2);
    for (const json& e : s.events) {
        REQUIRE(e.contains("timings"));
        CHECK(e["timings"]["predicted_n"] == e["tokens_predicted"]);
        CHECK(e["timings"]["prompt_n"].get<int>() > 0);
    }
    CHECK(s.events.back()["generation_settings"]["timings_per_token"] == true);
    body["timings_per_token"] = false;
    Stream plain = post_stream(port, "/completion", body);
    for (size_t i = 0; i + 1 < plain.events.size(); i++) CHECK_FALSE(plain.events[i].contains("timings"));
    CHECK(plain.events.back().contains("timings"));  // the final result always has them

    Stream chat = post_stream(port, "/v1/chat/completions",
                              {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 4}, {"stream", true}, {"timings_per_token", true}});
    int with_content = 0;
    for (const json& e : chat.events) {
        if (e["choices"].empty() || !e["choices"][0]["delta"].contains("content") || e["choices"][0]["delta"]["content"].is_null()) continue;
        with_content++;
        CHECK(e.contains("timings"));
    }
    CHECK(with_content > 0);
}

// The moved chunk keeps the keys and values its old context (with the gap) gave it, so the output is
// not the no-reuse output token for token (as in llama-server); the keys' rotation itself is checked
// exactly in test_cache_reuse.cpp. Here: the chunk is reused, and the answer starts as without reuse.
TEST_CASE("server compat: --cache-reuse moves a cached chunk past a removed gap; the greedy answer starts as without reuse") {
    const int port = compat_server().port;
    const std::string prefix = "Here is a Python file.\n";
    const std::string gap = "# TODO: remove this comment block before the review, it is obsolete now.\n";
    const std::string chunk =
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result\n\n";
    const std::string tail = "# Print the first ten Fibonacci numbers\n";
    auto count = [&](const std::string& text) { return (int)ok(post(port, "/tokenize", {{"content", text}}))["tokens"].size(); };
    const int n_chunk = count(chunk);
    // Slot 0 caches prefix + gap + chunk.
    ok(post(port, "/completion", {{"prompt", prefix + gap + chunk}, {"n_predict", 1}, {"id_slot", 0}, {"temperature", 0}}));
    const json ask = {{"prompt", prefix + chunk + tail}, {"n_predict", 24}, {"temperature", 0}, {"id_slot", 0}};
    const json reused = ok(post(port, "/completion", ask));
    // The chunk came from the cache, moved to its new position: only the tail was evaluated.
    const int n_prompt = reused["tokens_evaluated"], cache_n = reused["timings"]["cache_n"];
    CHECK(cache_n >= count(prefix) + n_chunk - 2);
    CHECK(reused["timings"]["prompt_n"] == n_prompt - cache_n);
    CHECK(reused["timings"]["prompt_n"].get<int>() <= count(tail) + 2);

    // The reference: the same prompt evaluated whole on another slot.
    json fresh = ask;
    fresh["id_slot"] = 1;
    fresh["cache_prompt"] = false;
    const json want = ok(post(port, "/completion", fresh));
    CHECK(want["timings"]["cache_n"] == 0);
    const std::string got = reused["content"], expected = want["content"];
    const size_t line = expected.find('\n');
    REQUIRE(line != std::string::npos);
    CHECK(got.substr(0, line + 1) == expected.substr(0, line + 1));

    // n_cache_reuse 0 turns it off for a request: only the common prefix is reused.
    ok(post(port, "/completion", {{"prompt", prefix + gap + chunk}, {"n_predict", 1}, {"id_slot", 2}, {"temperature", 0}}));
    json off = ask;
    off["id_slot"] = 2;
    off["n_cache_reuse"] = 0;
    const json no_reuse = ok(post(port, "/completion", off));
    CHECK(no_reuse["timings"]["cache_n"].get<int>() <= count(prefix));
    CHECK(no_reuse["content"] == want["content"]);
    CHECK(post(port, "/completion", {{"prompt", "x"}, {"n_cache_reuse", -1}}).status == 400);
}

TEST_CASE("server compat: n_indent cuts at the first under-indented line; t_max_predict_ms stops at a new line") {
    const int port = compat_server().port;
    const json base = {{"prompt", kCode}, {"n_predict", 48}, {"temperature", 0}, {"cache_prompt", false}};
    const std::string full = ok(post(port, "/completion", base))["content"];

    // Expected (llama-server's rule): after the first new line, the first line whose first non-blank
    // byte comes before n_indent blanks ends the text there.
    const int n_indent = 4;
    size_t cut = std::string::npos;
    for (size_t nl = full.find('\n'); nl != std::string::npos && cut == std::string::npos; nl = full.find('\n', nl + 1)) {
        const size_t first = full.find_first_not_of(" \t", nl + 1);
        if (first != std::string::npos && first - (nl + 1) < (size_t)n_indent) cut = first;
    }
    const bool late_cut = cut != std::string::npos && cut > full.find('\n', full.find('\n') + 1);
    REQUIRE_MESSAGE(late_cut, "no late under-indented line in: " << full);
    json ind = base;
    ind["n_indent"] = n_indent;
    const json cut_reply = ok(post(port, "/completion", ind));
    CHECK(cut_reply["content"] == full.substr(0, cut));
    CHECK(cut_reply["stop_type"] == "limit");

    json timed = base;
    timed["t_max_predict_ms"] = 1;
    const json t = ok(post(port, "/completion", timed));
    const std::string text = t["content"];
    CHECK(t["stop_type"] == "limit");
    // It ends with the token that brought a new line (maybe with blanks after it).
    const size_t last_nl = text.rfind('\n');
    REQUIRE(last_nl != std::string::npos);
    CHECK(text.find_first_not_of(" \t", last_nl + 1) == std::string::npos);
    CHECK(full.compare(0, text.size(), text) == 0);
    CHECK(t["tokens_predicted"].get<int>() < 48);
    CHECK(post(port, "/completion", {{"prompt", "x"}, {"t_max_predict_ms", -5}}).status == 400);
}

TEST_CASE("server compat: TLS flags refuse to start (this build has no TLS), as llama-server without OpenSSL") {
    for (const char* flags : {"--ssl-key-file key.pem --ssl-cert-file cert.pem", "--ssl-cert-file cert.pem"}) {
        CAPTURE(flags);
        std::string out;
        const int rc = testutil::run(std::string("./llm-server -m ") + kModel + " --port 0 " + flags + " 2>&1", &out);
        CHECK(rc == 1);
        CHECK(out.find("built without SSL support") != std::string::npos);
    }
    std::string out;
    CHECK(testutil::run(std::string("LLAMA_ARG_SSL_KEY_FILE=k.pem ./llm-server -m ") + kModel + " --port 0 2>&1", &out) == 1);
}

TEST_CASE("server compat: OpenAI logprobs (chat: logprobs + top_logprobs; completions: logprobs N), streamed too") {
    const int port = compat_server().port;
    const json chat_body = {{"messages", {{{"role", "user"}, {"content", "Name a color."}}}}, {"max_tokens", 4}, {"temperature", 0},
                            {"logprobs", true}, {"top_logprobs", 3}};
    const json chat = ok(post(port, "/v1/chat/completions", chat_body));
    const json& content = chat["choices"][0]["logprobs"]["content"];
    REQUIRE(content.size() == 4);
    for (const json& t : content) {
        CHECK(t["logprob"].get<double>() <= 0);
        REQUIRE(t["top_logprobs"].size() == 3);
        CHECK(t["top_logprobs"][0]["id"] == t["id"]);  // greedy: the most likely token
    }
    json no_lp = chat_body;
    no_lp.erase("logprobs");
    CHECK(post(port, "/v1/chat/completions", no_lp).status == 400);  // top_logprobs alone, as llama-server
    no_lp.erase("top_logprobs");
    CHECK_FALSE(ok(post(port, "/v1/chat/completions", no_lp))["choices"][0].contains("logprobs"));

    const json cmpl = ok(post(port, "/v1/completions", {{"prompt", "The capital of France is"}, {"max_tokens", 3}, {"temperature", 0}, {"logprobs", 2}}));
    REQUIRE(cmpl["choices"][0]["logprobs"]["content"].size() == 3);
    CHECK(cmpl["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size() == 2);
    CHECK(ok(post(port, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}))["choices"][0]["logprobs"].is_null());

    json stream_body = chat_body;
    stream_body["stream"] = true;
    Stream s = post_stream(port, "/v1/chat/completions", stream_body);
    size_t n_entries = 0;
    for (const json& e : s.events) {
        if (!e["choices"].empty() && e["choices"][0].contains("logprobs")) n_entries += e["choices"][0]["logprobs"]["content"].size();
    }
    CHECK(n_entries == 4);
}

TEST_CASE("server compat: with an API key, /models stays public and a bare Authorization key is accepted, as llama-server") {
    ServerProcess s(server_cmd({"-np", "1", "-c", "256", "--api-key", "sekret"}));
    CHECK(get(s.port, "/v1/models").status == 200);
    CHECK(get(s.port, "/models").status == 200);
    CHECK(get(s.port, "/props").status == 401);
    CHECK(get(s.port, "/props", {{"Authorization", "sekret"}}).status == 200);
    CHECK(get(s.port, "/props", {{"Authorization", "Bearer sekret"}}).status == 200);
    CHECK(get(s.port, "/props", {{"Authorization", "Bearer nope"}, {"X-Api-Key", "sekret"}}).status == 401);  // Authorization wins
}

TEST_CASE("server compat: /lora-adapters and a request's lora, with no adapters loaded") {
    const int port = compat_server().port;
    Reply g = get(port, "/lora-adapters");
    CHECK(g.status == 200);
    CHECK(g.body == json::array());
    CHECK(call(port, "POST", "/lora-adapters", " [ ] ").status == 200);
    CHECK(post(port, "/lora-adapters", json::array({{{"id", 0}, {"scale", 0.5}}})).status == 400);
    CHECK(call(port, "POST", "/lora-adapters", "{}").status == 400);
    CHECK(ok(post(port, "/completion", {{"prompt", "Hi"}, {"n_predict", 1}, {"lora", json::array()}}))["tokens_predicted"] == 1);
    Reply bad = post(port, "/completion", {{"prompt", "Hi"}, {"n_predict", 1}, {"lora", {{{"id", 0}, {"scale", 1.0}}}}});
    CHECK(bad.status == 400);
    CHECK(bad.body["error"]["message"].get<std::string>().find("invalid adapter id") != std::string::npos);
    CHECK(post(port, "/completion", {{"prompt", "Hi"}, {"lora", "x"}}).status == 400);
}
