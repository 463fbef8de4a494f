// llm-server's HTTP mode, end to end: ./llm-server runs as a child process on 127.0.0.1 (port 0, the
// bound port is read from its log) and the tests talk to it over real sockets with http::Client.
#include <atomic>
#include <cstring>

#include "server_util.hpp"

namespace {

using json = nlohmann::json;
using namespace testserver;

// The server most tests share: 4 slots of 512 tokens.
ServerProcess& main_server() {
    static std::unique_ptr<ServerProcess> s;
    if (!s) s = std::make_unique<ServerProcess>(server_cmd({"-np", "4", "-c", "2048", "--cache-ram", "64", "--metrics"}));
    return *s;
}

json completion(int port, const json& body) {
    Reply r = post(port, "/completion", body);
    REQUIRE_MESSAGE(r.status == 200, r.raw);
    return r.body;
}

const char* kPrompts[4] = {"The capital of France is", "Once upon a time, in a small village,", "The three primary colors are",
                           "def fibonacci(n):"};

}  // namespace

TEST_CASE("server: health, props, models, slots and metrics") {
    int port = main_server().port;
    Reply h = get(port, "/health");
    CHECK(h.status == 200);
    CHECK(h.body == json{{"status", "ok"}});

    Reply p = get(port, "/props");
    REQUIRE(p.status == 200);
    CHECK(p.body["total_slots"] == 4);
    CHECK(p.body["default_generation_settings"]["n_ctx"] == 512);
    CHECK(p.body["chat_template_family"] == "smollm2");
    CHECK(p.body["chat_template"].get<std::string>().find("<|im_start|>") != std::string::npos);
    CHECK(p.body["model_path"] == kModel);

    Reply m = get(port, "/v1/models");
    REQUIRE(m.status == 200);
    CHECK(m.body["object"] == "list");
    CHECK(m.body["data"][0]["id"] == kModel);
    CHECK(m.body["data"][0]["meta"]["n_vocab"] == 49152);

    Reply s = get(port, "/slots");
    REQUIRE(s.status == 200);
    REQUIRE(s.body.size() == 4);
    for (int i = 0; i < 4; i++) {
        CHECK(s.body[i]["id"] == i);
        CHECK(s.body[i]["n_ctx"] == 512);
        CHECK(s.body[i]["is_processing"] == false);
        CHECK(s.body[i].contains("n_past"));
    }

    completion(port, {{"prompt", "Hello"}, {"n_predict", 2}});
    Reply mt = get(port, "/metrics");
    REQUIRE(mt.status == 200);
    CHECK(mt.resp.header("content-type").find("text/plain") == 0);
    for (const char* name : {"prompt_tokens_total", "prompt_seconds_total", "tokens_predicted_total", "tokens_predicted_seconds_total",
                             "prompt_tokens_seconds", "predicted_tokens_seconds", "n_decode_total", "n_busy_slots_per_decode",
                             "requests_processing", "requests_deferred", "kv_cache_usage_ratio", "kv_cache_tokens"}) {
        CHECK_MESSAGE(mt.raw.find(std::string("\nllamacpp:") + name + " ") != std::string::npos, name);
        CHECK(mt.raw.find(std::string("# TYPE llamacpp:") + name + " ") != std::string::npos);
    }
    CHECK(mt.raw.find("llamacpp:tokens_predicted_total 0\n") == std::string::npos);

    // CORS on every response, preflight answered.
    CHECK(h.resp.header("access-control-allow-origin") == "*");
    CHECK(call(port, "OPTIONS", "/completion").status == 204);
    // With an Origin, as llama-server: echoed, credentials allowed (the preflight too).
    Reply ho = call(port, "GET", "/health", "", {{"Origin", "http://app.example"}});
    CHECK(ho.resp.header("access-control-allow-origin") == "http://app.example");
    CHECK(ho.resp.header("access-control-allow-credentials") == "true");
    Reply pre = call(port, "OPTIONS", "/v1/chat/completions", "",
                     {{"Origin", "http://app.example"}, {"Access-Control-Request-Method", "POST"}, {"Access-Control-Request-Headers", "authorization"}});
    CHECK(pre.status == 204);
    CHECK(pre.resp.header("access-control-allow-origin") == "http://app.example");
    CHECK(pre.resp.header("access-control-allow-headers") == "authorization");
    CHECK(pre.resp.header("access-control-allow-methods").find("POST") != std::string::npos);
}

TEST_CASE("server: /completion fields, stop strings, n_probs, return_tokens") {
    int port = main_server().port;
    json r = completion(port, {{"prompt", kPrompts[0]}, {"n_predict", 8}, {"temperature", 0}, {"cache_prompt", false}});
    CHECK(r["content"].get<std::string>().find("Paris") != std::string::npos);
    CHECK(r["tokens_predicted"] == 8);
    CHECK(r["tokens_evaluated"] == 5);
    CHECK(r["stop_type"] == "limit");
    CHECK(r["stop"] == true);
    CHECK(r["model"] == kModel);
    CHECK(r["id_slot"].get<int>() >= 0);
    const json& t = r["timings"];
    CHECK(t["prompt_n"] == 5);
    CHECK(t["predicted_n"] == 8);
    for (const char* k : {"prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second"}) CHECK(t[k].get<double>() > 0);
    CHECK(r["generation_settings"]["n_predict"] == 8);

    // A stop string ends generation and is not part of the content.
    json s = completion(port, {{"prompt", kPrompts[0]}, {"n_predict", 16}, {"temperature", 0}, {"stop", {"Paris"}}});
    CHECK(s["stop_type"] == "word");
    CHECK(s["stopping_word"] == "Paris");
    CHECK(s["content"] == " ");

    // Token ids as the prompt, probabilities and token ids in the answer.
    Reply tk = post(port, "/tokenize", {{"content", kPrompts[0]}});
    json ids = tk.body["tokens"];
    json q = completion(port, {{"prompt", ids}, {"n_predict", 3}, {"temperature", 0}, {"n_probs", 2}, {"return_tokens", true}});
    CHECK(q["content"] == r["content"].get<std::string>().substr(0, q["content"].get<std::string>().size()));
    REQUIRE(q["tokens"].size() == 3);
    REQUIRE(q["completion_probabilities"].size() == 3);
    const json& p0 = q["completion_probabilities"][0];
    CHECK(p0["id"] == q["tokens"][0]);
    CHECK(p0["top_logprobs"].size() == 2);
    CHECK(p0["top_logprobs"][0]["id"] == p0["id"]);  // greedy: the most likely token
    CHECK(p0["logprob"].get<double>() <= 0);

    // Seeded sampling is reproducible.
    json a = completion(port, {{"prompt", kPrompts[1]}, {"n_predict", 8}, {"temperature", 1.0}, {"seed", 42}, {"cache_prompt", false}});
    json b = completion(port, {{"prompt", kPrompts[1]}, {"n_predict", 8}, {"temperature", 1.0}, {"seed", 42}, {"cache_prompt", false}});
    CHECK(a["content"] == b["content"]);

    // n_predict 0: the prompt is evaluated (and cached), nothing generated.
    json z = completion(port, {{"prompt", kPrompts[2]}, {"n_predict", 0}});
    CHECK(z["content"] == "");
    CHECK(z["tokens_predicted"] == 0);
}

TEST_CASE("server: 4 concurrent clients on -np 4 get the greedy answers each gets alone") {
    int port = main_server().port;
    auto body = [](int i) { return json{{"prompt", kPrompts[i]}, {"n_predict", 16}, {"temperature", 0}, {"cache_prompt", false}}; };
    std::string alone[4], together[4];
    for (int i = 0; i < 4; i++) alone[i] = completion(port, body(i))["content"];
    std::vector<std::thread> th;
    std::atomic<int> ok{0};
    json slots_seen = json::array();
    for (int i = 0; i < 4; i++) {
        th.emplace_back([&, i] {
            Reply r = post(port, "/completion", body(i));
            if (r.status == 200) { together[i] = r.body["content"]; ok++; }
        });
    }
    for (auto& t : th) t.join();
    CHECK(ok == 4);
    for (int i = 0; i < 4; i++) {
        CHECK_MESSAGE(together[i] == alone[i], "prompt " << i);
        CHECK(!alone[i].empty());
    }
    // The answers are independent: different prompts, different continuations.
    CHECK(alone[0] != alone[1]);
    // And the same as the engine's one-shot mode (which prints prompt + continuation).
    std::string out;
    testutil::run(std::string("./llm-server -m ") + kModel + " -p '" + kPrompts[0] + "' -n 16 --temp 0 2>/dev/null", &out);
    CHECK(out == std::string(kPrompts[0]) + alone[0] + "\n");
}

TEST_CASE("server: SSE streaming, token by token") {
    int port = main_server().port;
    json plain = completion(port, {{"prompt", kPrompts[1]}, {"n_predict", 12}, {"temperature", 0}});

    std::vector<double> arrival;
    Stream s = post_stream(port, "/completion", {{"prompt", kPrompts[1]}, {"n_predict", 12}, {"temperature", 0}, {"stream", true}},
                           [&](const json&) { arrival.push_back(now_s()); });
    REQUIRE(s.status == 200);
    REQUIRE(s.events.size() >= 10);  // one event per token (a few may be held back for UTF-8), then the final one
    std::string content;
    for (size_t i = 0; i + 1 < s.events.size(); i++) {
        CHECK(s.events[i]["stop"] == false);
        content += s.events[i]["content"].get<std::string>();
    }
    const json& last = s.events.back();
    CHECK(last["stop"] == true);
    CHECK(last["stop_type"] == "limit");
    CHECK(last["timings"]["predicted_n"] == 12);
    content += last["content"].get<std::string>();
    CHECK(content == plain["content"]);
    CHECK(arrival.back() - arrival.front() > 0.01);  // events arrived over time, not in one piece
    CHECK(!s.done);  // no [DONE] outside the OpenAI endpoints, as llama-server

    // OpenAI chat streaming: role first, content deltas, finish_reason with usage, then [DONE].
    Stream c = post_stream(port, "/v1/chat/completions",
                           {{"messages", {{{"role", "user"}, {"content", "Name a color."}}}}, {"max_tokens", 6}, {"temperature", 0}, {"stream", true}});
    REQUIRE(c.status == 200);
    CHECK(c.done);
    REQUIRE(c.events.size() >= 3);
    CHECK(c.events[0]["choices"][0]["delta"]["role"] == "assistant");
    CHECK(c.events[0]["object"] == "chat.completion.chunk");
    std::string id = c.events[0]["id"];
    CHECK(id.rfind("chatcmpl-", 0) == 0);
    for (const json& e : c.events) CHECK(e["id"] == id);
    const json& fin = c.events.back();
    CHECK(fin["choices"][0]["finish_reason"] == "length");
    CHECK(fin["usage"]["completion_tokens"] == 6);
    CHECK(c.raw.size() >= 14);
    CHECK(c.raw.substr(c.raw.size() - 14) == "data: [DONE]\n\n");
}

TEST_CASE("server: OpenAI-compatible completions and chat") {
    int port = main_server().port;
    json msgs = {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "What is the capital of France?"}}};
    Reply c = post(port, "/v1/chat/completions", {{"model", kModel}, {"messages", msgs}, {"max_tokens", 16}, {"temperature", 0}});
    REQUIRE_MESSAGE(c.status == 200, c.raw);
    CHECK(c.body["object"] == "chat.completion");
    CHECK(c.body["choices"][0]["message"]["role"] == "assistant");
    std::string answer = c.body["choices"][0]["message"]["content"];
    CHECK(!answer.empty());
    const json& u = c.body["usage"];
    CHECK(u["total_tokens"] == u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
    CHECK((c.body["choices"][0]["finish_reason"] == "stop" || c.body["choices"][0]["finish_reason"] == "length"));

    // The rendered prompt is what /apply-template shows, and what the chat endpoint evaluated.
    Reply t = post(port, "/apply-template", {{"messages", msgs}});
    REQUIRE(t.status == 200);
    std::string prompt = t.body["prompt"];
    CHECK(prompt == "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                    "<|im_start|>assistant\n");
    Reply tk = post(port, "/tokenize", {{"content", prompt}});
    CHECK(u["prompt_tokens"] == tk.body["tokens"].size());
    // A 135M model's answer to this prompt flips with the last bit of a dot product, so instead of a
    // fixed string the chat answer must be exactly the raw completion of the rendered prompt.
    Reply raw = post(port, "/completion", {{"prompt", prompt}, {"n_predict", 16}, {"temperature", 0}});
    REQUIRE(raw.status == 200);
    std::string raw_answer = raw.body["content"];
    CHECK(answer == raw_answer.substr(0, answer.size()));

    Reply o = post(port, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 4}, {"temperature", 0}});
    REQUIRE(o.status == 200);
    CHECK(o.body["object"] == "text_completion");
    CHECK(o.body["choices"][0]["text"].get<std::string>().find("Paris") != std::string::npos);
    CHECK(o.body["choices"][0]["finish_reason"] == "length");
    CHECK(o.body["usage"]["completion_tokens"] == 4);
    CHECK(o.body["usage"]["prompt_tokens"] == 5);

    Stream os = post_stream(port, "/v1/completions", {{"prompt", kPrompts[0]}, {"max_tokens", 4}, {"temperature", 0}, {"stream", true}});
    CHECK(os.done);
    std::string text;
    for (const json& e : os.events) text += e["choices"][0]["text"].get<std::string>();
    CHECK(text == o.body["choices"][0]["text"]);

    // Any model name is served (one model loaded, as llama-server); responses name the served model.
    Reply other = post(port, "/v1/chat/completions", {{"model", "gpt-17"}, {"messages", msgs}, {"max_tokens", 1}});
    CHECK(other.status == 200);
    CHECK(other.body["model"] == kModel);
    CHECK(post(port, "/v1/completions", {{"model", "SmolLM2-135M-Instruct-Q4_1"}, {"prompt", "Hi"}, {"max_tokens", 1}}).status == 200);
}

TEST_CASE("server: tokenize and detokenize") {
    int port = main_server().port;
    Reply t = post(port, "/tokenize", {{"content", "Hello world"}, {"with_pieces", true}});
    REQUIRE(t.status == 200);
    REQUIRE(t.body["tokens"].size() == 2);
    CHECK(t.body["tokens"][0]["piece"] == "Hello");
    CHECK(t.body["tokens"][1]["piece"] == " world");
    json ids = json::array({t.body["tokens"][0]["id"], t.body["tokens"][1]["id"]});
    Reply d = post(port, "/detokenize", {{"tokens", ids}});
    CHECK(d.body["content"] == "Hello world");
    Reply sp = post(port, "/tokenize", {{"content", "<|im_start|>"}});
    CHECK(sp.body["tokens"].size() == 1);
    CHECK(post(port, "/detokenize", {{"tokens", {1, 999999}}}).status == 400);
    CHECK(post(port, "/detokenize", {{"tokens", "abc"}}).status == 400);
}

TEST_CASE("server: the prompt cache skips the prefill of the first turn") {
    int port = main_server().port;
    std::string history = "<|im_start|>system\nYou are a helpful assistant who answers in detail.<|im_end|>\n"
                          "<|im_start|>user\nTell me about the history of Paris, the capital of France, in a few sentences.<|im_end|>\n"
                          "<|im_start|>assistant\n";
    json a = completion(port, {{"prompt", history}, {"n_predict", 8}, {"temperature", 0}});
    int n1 = a["tokens_evaluated"];
    CHECK(a["timings"]["prompt_n"].get<int>() <= n1);
    // A second conversation in between lands on another slot (the LRU one), not on this one.
    completion(port, {{"prompt", "Something else entirely"}, {"n_predict", 2}});
    std::string turn2 = history + a["content"].get<std::string>() + "<|im_end|>\n<|im_start|>user\nAnd Rome?<|im_end|>\n<|im_start|>assistant\n";
    json b = completion(port, {{"prompt", turn2}, {"n_predict", 4}, {"temperature", 0}});
    CHECK(b["id_slot"] == a["id_slot"]);
    int n2 = b["tokens_evaluated"], reused = b["timings"]["cache_n"], evaluated = b["timings"]["prompt_n"];
    CHECK(reused >= n1 - 1);             // the first turn came from the cache (its last token may re-tokenize)
    CHECK(evaluated == n2 - reused);     // only the new tokens were evaluated
    CHECK(evaluated < 20);
    CHECK(b["tokens_cached"].get<int>() >= n2);

    // cache_prompt false evaluates everything again.
    json c = completion(port, {{"prompt", turn2}, {"n_predict", 1}, {"cache_prompt", false}});
    CHECK(c["timings"]["prompt_n"] == n2);
    CHECK(c["timings"]["cache_n"] == 0);
}

TEST_CASE("server: malformed requests get 4xx and never kill the server") {
    int port = main_server().port;
    auto raw = [&](const std::string& bytes, bool half_close = false) {
        http::Client c("127.0.0.1", port, 10000);
        c.send_raw(bytes);
        if (half_close) c.shutdown_write();
        try {
            return c.read_response().status;
        } catch (const std::exception&) {
            return 0;  // the server may also just close
        }
    };
    auto post_body = [&](const std::string& body) { return call(port, "POST", "/completion", body); };
    std::string big_prompt(1, '[');
    // Transport level.
    CHECK(raw("POST /completion HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\":", true) == 400);  // truncated body
    CHECK(raw("POST /completion HTTP/1.1\r\nContent-Le", true) == 400);                                // truncated headers
    CHECK(raw("POST /completion HTTP/1.1\r\nContent-Length: 999999999999\r\n\r\n") == 413);            // oversized
    CHECK(raw("GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n") == 414);
    CHECK(raw("GET / HTTP/1.1\r\nX: " + std::string(40000, 'b') + "\r\n\r\n") == 431);
    std::string garbage;
    for (int i = 0; i < 512; i++) garbage += char((i * 7919 + 13) % 256);
    int g = raw(garbage);
    CHECK((g >= 400 && g < 500));
    CHECK(raw("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello\r\n\r\n") == 400);
    // JSON level.
    std::vector<std::string> bad = {
        "",                                          // empty
        "{",                                         // truncated
        "{\"prompt\": \"abc",                        // truncated string
        "[1,2,3]",                                   // not an object
        "{\"prompt\": \"\xff\xfe invalid utf-8\"}",  // invalid UTF-8
        std::string(100000, '['),                    // deeply nested
        std::string(100000, '{'),
        "{\"prompt\":" + std::string(5000, '[') + std::string(5000, ']') + "}",
        "{\"prompt\": 12}",                          // wrong types
        "{\"prompt\": \"x\", \"n_predict\": \"ten\"}",
        "{\"prompt\": \"x\", \"temperature\": [1]}",
        "{\"prompt\": \"x\", \"stream\": 1}",
        "{\"prompt\": \"x\", \"stop\": {\"a\": 1}}",
        "{\"prompt\": \"x\", \"n_predict\": 1e300}",
        "{\"prompt\": \"x\", \"id_slot\": 99}",
        "{\"prompt\": [1, -5]}",                     // token ids out of range
        "{\"prompt\": [1, 4294967296]}",
        "{\"prompt\": [1, 2.5]}",
        "{\"prompt\": \"\"}",                        // empty prompt
        "{\"n_predict\": 4}",                        // no prompt
        "\x00\x01\x02\x03",
    };
    for (const std::string& b : bad) {
        Reply r = post_body(b);
        CHECK_MESSAGE((r.status >= 400 && r.status < 500), "body " << b.substr(0, 40) << " -> " << r.status);
        CHECK_MESSAGE(r.body.is_object(), r.raw.substr(0, 200));
        CHECK(r.body["error"]["message"].is_string());
    }
    Reply chat = call(port, "POST", "/v1/chat/completions", "{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}");
    CHECK(chat.status == 400);
    CHECK(call(port, "POST", "/v1/chat/completions", "{\"messages\": []}").status == 400);
    CHECK(call(port, "POST", "/v1/chat/completions", "{\"messages\": \"hi\"}").status == 400);
    CHECK(call(port, "GET", "/nope").status == 404);
    CHECK(call(port, "GET", "/completion").status == 405);
    // Still serving.
    CHECK(get(port, "/health").status == 200);
    CHECK(completion(port, {{"prompt", "Hi"}, {"n_predict", 2}})["tokens_predicted"] == 2);
}

namespace {
// A second server: one slot, an API key, a queue of one, a template from a file, a small RAM cache.
ServerProcess& small_server() {
    static std::unique_ptr<ServerProcess> s;
    if (!s) {
        s = std::make_unique<ServerProcess>(server_cmd({"-np", "1", "-c", "256", "--api-key", "sekret", "--max-queue", "1",
                                                        "--chat-template-file",
                                                        testutil::shared_dir() + "/chat/templates/Qwen-Qwen2.5-7B-Instruct.jinja",
                                                        "--cache-ram", "16", "--metrics"}));
    }
    return *s;
}
const http::Headers kAuth = {{"Authorization", "Bearer sekret"}};
}  // namespace

TEST_CASE("server: API key; /health stays open") {
    int port = small_server().port;
    CHECK(get(port, "/health").status == 200);
    Reply r = get(port, "/props");
    CHECK(r.status == 401);
    CHECK(r.body["error"]["type"] == "authentication_error");
    CHECK(get(port, "/props", {{"Authorization", "Bearer wrong"}}).status == 401);
    CHECK(get(port, "/props", kAuth).status == 200);
    CHECK(get(port, "/props", {{"X-Api-Key", "sekret"}}).status == 200);
}

TEST_CASE("server: /apply-template renders the shared Qwen 2.5 cases byte for byte") {
    int port = small_server().port;
    json cases = json::parse(testutil::read_file(testutil::shared_dir() + "/chat/cases.json"));
    std::map<std::string, json> convs;
    for (const json& c : cases["conversations"]) convs[c["name"]] = c["messages"];
    int n = 0;
    for (const json& c : cases["cases"]) {
        if (c["template"] != "Qwen-Qwen2.5-7B-Instruct.jinja") continue;
        Reply r = post(port, "/apply-template", {{"messages", convs[c["conversation"]]}, {"add_generation_prompt", c["add_generation_prompt"]}}, kAuth);
        REQUIRE(r.status == 200);
        CHECK_MESSAGE(r.body["prompt"] == c["expected"], c["conversation"]);
        n++;
    }
    CHECK(n > 0);
    CHECK(get(port, "/props", kAuth).body["chat_template_family"] == "qwen2.5");
}

TEST_CASE("server: a full queue answers 503 at once; waiting requests show in /metrics") {
    int port = small_server().port;
    std::atomic<bool> first_token{false};
    std::thread a([&] {  // occupies the only slot
        http::Client c("127.0.0.1", port, 60000);
        c.request("POST", "/completion", json{{"prompt", "Count: 1, 2, 3,"}, {"n_predict", 48}, {"ignore_eos", true}, {"stream", true}}.dump(),
                  kAuth, [&](std::string_view) { first_token = true; return true; });
    });
    while (!first_token) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> b_status{0};
    std::thread b([&] { b_status = post(port, "/completion", {{"prompt", "Hello"}, {"n_predict", 2}}, kAuth).status; });
    std::string metrics;
    for (double t0 = now_s(); now_s() - t0 < 10; std::this_thread::sleep_for(std::chrono::milliseconds(10))) {
        metrics = get(port, "/metrics", kAuth).raw;
        if (metrics.find("llamacpp:requests_deferred 1\n") != std::string::npos) break;
    }
    CHECK(metrics.find("llamacpp:requests_deferred 1\n") != std::string::npos);
    CHECK(metrics.find("llamacpp:requests_processing 1\n") != std::string::npos);
    Reply slots = get(port, "/slots", kAuth);
    CHECK(slots.body[0]["is_processing"] == true);
    double t0 = now_s();
    Reply c = post(port, "/completion", {{"prompt", "Hi"}, {"n_predict", 2}}, kAuth);
    CHECK(c.status == 503);
    CHECK(c.body["error"]["type"] == "unavailable_error");
    CHECK(now_s() - t0 < 1.0);
    a.join();
    b.join();
    CHECK(b_status == 200);
}

TEST_CASE("server: --cache-ram restores an evicted slot state on a prefix hit") {
    ServerProcess& s = small_server();
    int port = s.port;
    std::string p1 = "<|im_start|>user\nPlease write a short story about a lighthouse keeper and a seagull who become friends.<|im_end|>\n";
    std::string p2 = "<|im_start|>user\nList some facts about the planet Jupiter, its moons and its great red spot.<|im_end|>\n";
    Reply a = post(port, "/completion", {{"prompt", p1}, {"n_predict", 2}}, kAuth);
    REQUIRE(a.status == 200);
    Reply b = post(port, "/completion", {{"prompt", p2}, {"n_predict", 2}}, kAuth);  // the only slot now holds p2
    REQUIRE(b.status == 200);
    Reply c = post(port, "/completion", {{"prompt", p1 + "More please."}, {"n_predict", 2}}, kAuth);
    REQUIRE(c.status == 200);
    int n1 = a.body["tokens_evaluated"];
    CHECK(c.body["timings"]["cache_n"].get<int>() >= n1);
    CHECK(c.body["timings"]["prompt_n"].get<int>() < 10);
    CHECK(s.log().find("from the RAM cache") != std::string::npos);
}

TEST_CASE("server: requests that cannot fit fail fast; a full slot stops with 'limit'") {
    int port = small_server().port;
    std::vector<int> ids(300, 504);  // longer than the slot (256)
    double t0 = now_s();
    Reply r = post(port, "/completion", {{"prompt", ids}, {"n_predict", 4}}, kAuth);
    CHECK(r.status == 400);
    CHECK(r.body["error"]["type"] == "exceed_context_size_error");
    CHECK(r.body["error"]["message"].get<std::string>().find("300 tokens") != std::string::npos);
    CHECK(now_s() - t0 < 1.0);
    CHECK(r.body["error"]["n_prompt_tokens"] == 300);
    CHECK(r.body["error"]["n_ctx"] == 256);
    // A prompt that fits but leaves less room than n_predict asks: generated until the slot is full.
    ids.resize(248);
    Reply r2 = post(port, "/completion", {{"prompt", ids}, {"n_predict", 100}, {"ignore_eos", true}, {"temperature", 0}}, kAuth);
    REQUIRE(r2.status == 200);
    CHECK(r2.body["stop_type"] == "limit");
    CHECK(r2.body["tokens_predicted"] == 256 - 248 + 1);

    // Unbounded generation near the end of the slot: stops at the slot's end, says so.
    Reply f = post(port, "/completion", {{"prompt", ids}, {"ignore_eos", true}, {"temperature", 0}}, kAuth);
    REQUIRE(f.status == 200);
    CHECK(f.body["stop_type"] == "limit");
    CHECK(f.body["tokens_predicted"] == 256 - 248 + 1);  // cells for 8 more tokens, and the last sampled one
    CHECK(f.body["tokens_cached"] == 256);
}

TEST_CASE("server: --context-shift keeps generating past the end of the slot") {
    ServerProcess s(server_cmd({"-np", "1", "-c", "48", "--context-shift", "--keep", "4", "--no-warmup"}));
    json r = completion(s.port, {{"prompt", kPrompts[1]}, {"n_predict", 64}, {"ignore_eos", true}, {"temperature", 0}});
    CHECK(r["tokens_predicted"] == 64);
    CHECK(r["stop_type"] == "limit");
    CHECK(r["tokens_cached"].get<int>() <= 48);
    CHECK(s.log().find("context shift") != std::string::npos);
}

TEST_CASE("server: --kv-unified lets one request use the whole pool; idle slots give their cells back") {
    ServerProcess s(server_cmd({"-np", "2", "-c", "256", "--kv-unified", "--no-warmup", "--metrics"}));
    CHECK(get(s.port, "/slots").body[0]["n_ctx"] == 256);
    std::vector<int> a(200, 504), b(200, 2000);  // each longer than half the pool
    json ra = completion(s.port, {{"prompt", a}, {"n_predict", 4}, {"ignore_eos", true}});
    CHECK(ra["tokens_predicted"] == 4);
    // A different prompt lands on the other slot; the pool has no room for both, so the idle slot's
    // cells are freed (and kept in the RAM cache).
    json rb = completion(s.port, {{"prompt", b}, {"n_predict", 4}, {"ignore_eos", true}});
    CHECK(rb["tokens_predicted"] == 4);
    CHECK(rb["id_slot"] != ra["id_slot"]);
    CHECK(s.log().find("evicted to make room in the KV pool") != std::string::npos);
    std::string m = get(s.port, "/metrics").raw;
    CHECK(m.find("llamacpp:kv_cache_tokens 2") != std::string::npos);  // 203 or 204 tokens: one slot's worth
    // Split mode for comparison: the same prompt does not fit a 128-token slot.
    ServerProcess split(server_cmd({"-np", "2", "-c", "256", "--no-warmup"}));
    CHECK(post(split.port, "/completion", {{"prompt", a}, {"n_predict", 4}}).status == 400);
}

TEST_CASE("server: SIGTERM stops accepting, lets the in-flight request finish, exits 0") {
    ServerProcess s(server_cmd({"-np", "2", "-c", "512", "--shutdown-grace", "20"}));
    std::atomic<bool> started{false};
    Stream st;
    std::thread t([&] {
        st = post_stream(s.port, "/v1/completions", {{"prompt", kPrompts[1]}, {"max_tokens", 24}, {"ignore_eos", true}, {"stream", true}},
                         [&](const json&) { started = true; });
    });
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    kill(s.pid, SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    bool refused = false;
    try {
        http::Client c("127.0.0.1", s.port, 2000);
        c.request("GET", "/health");
    } catch (const std::exception&) {
        refused = true;
    }
    CHECK(refused);
    t.join();
    CHECK(st.done);  // the stream ran to its end: [DONE]
    REQUIRE(!st.events.empty());
    CHECK(st.events.back()["usage"]["completion_tokens"] == 24);
    int rc = s.stop(0, 30);  // signal 0: just wait for the exit
    CHECK(rc == 0);
    CHECK(s.log().find("stopped") != std::string::npos);
}

TEST_CASE("server: the static binary serves from an empty root with no shared libraries") {
    // No program interpreter (PT_INTERP) and no dynamic section (PT_DYNAMIC): the kernel runs it as is.
    std::string bin = testutil::read_file("./llm-server");
    REQUIRE(bin.size() > 64);
    REQUIRE(bin.compare(0, 4, "\x7f" "ELF") == 0);
    uint64_t phoff;
    uint16_t phentsize, phnum;
    memcpy(&phoff, bin.data() + 0x20, 8);
    memcpy(&phentsize, bin.data() + 0x36, 2);
    memcpy(&phnum, bin.data() + 0x38, 2);
    REQUIRE(phoff + (uint64_t)phentsize * phnum <= bin.size());
    for (int i = 0; i < phnum; i++) {
        uint32_t type;
        memcpy(&type, bin.data() + phoff + (uint64_t)i * phentsize, 4);
        CHECK(type != 3u);  // PT_INTERP
        CHECK(type != 2u);  // PT_DYNAMIC
    }
    if (geteuid() != 0) {
        MESSAGE("not root: chroot part skipped");
        return;
    }
    char tmpl[] = "/tmp/llm-chroot-XXXXXX";
    REQUIRE(mkdtemp(tmpl));
    std::string root = tmpl;
    REQUIRE(testutil::run("cp ./llm-server " + root + "/llm-server && cp " + std::string(kModel) + " " + root + "/model.gguf") == 0);
    std::string listing;
    testutil::run("find " + root + " | sort", &listing);
    CHECK(listing == root + "\n" + root + "/llm-server\n" + root + "/model.gguf\n");  // nothing else: no /lib, no /etc
    {
        ServerProcess s({"chroot", root, "/llm-server", "-m", "/model.gguf", "--host", "127.0.0.1", "--port", "0", "-c", "256"});
        json r = completion(s.port, {{"prompt", kPrompts[0]}, {"n_predict", 6}, {"temperature", 0}});
        CHECK(r["content"].get<std::string>().find("Paris") != std::string::npos);
        CHECK(s.stop(SIGTERM) == 0);
    }
    testutil::run("rm -rf " + root);
}

// ---- llama-server drop-in: its command line, fields and endpoints ---------------------------------

namespace {
// A server configured the way llama-server deployments are: flags through LLAMA_ARG_* variables (the
// command line wins over them), aliases and tags, a slot save folder, POST /props, and flags that
// cannot apply to a CPU build.
struct CompatServer {
    std::string save_dir;
    std::unique_ptr<ServerProcess> proc;
    CompatServer() {
        char tmpl[] = "/tmp/llm-slots-XXXXXX";
        REQUIRE(mkdtemp(tmpl));
        save_dir = tmpl;
        std::vector<std::string> cmd = {"env", "LLAMA_ARG_CTX_SIZE=1024", "LLAMA_ARG_N_PARALLEL=3", "LLAMA_ARG_ALIAS=from-env"};
        for (const std::string& a : server_cmd({"-np", "2", "-a", "smol,gpt-4o-mini", "--tags", "small,test", "--slot-save-path", save_dir,
                                                "--props", "-ngl", "99", "-fa", "on", "--jinja", "--offline", "-cb", "--threads-http", "4",
                                                "--no-mmproj", "-lv", "3", "--cache-reuse", "256"})) {
            cmd.push_back(a);
        }
        proc = std::make_unique<ServerProcess>(cmd);
    }
    ~CompatServer() { testutil::run("rm -rf " + save_dir); }
};
CompatServer& compat_server() {
    static std::unique_ptr<CompatServer> s;
    if (!s) s = std::make_unique<CompatServer>();
    return *s;
}
}  // namespace

TEST_CASE("server: llama-server's flags, spellings and LLAMA_ARG_* variables") {
    std::string help;
    REQUIRE(testutil::run("./llm-server --help", &help) == 0);
    for (const char* group : {"----- common params -----", "----- sampling params -----", "----- example-specific params -----"}) {
        CHECK_MESSAGE(help.find(group) != std::string::npos, group);
    }
    for (const char* line : {"-ngl, --gpu-layers, --n-gpu-layers N", "-c, --ctx-size N", "(env: LLAMA_ARG_CTX_SIZE)", "--slots, --no-slots",
                             "-kvu, --kv-unified, -no-kvu, --no-kv-unified", "-fa, --flash-attn [on|off|auto]", "(env: LLAMA_API_KEY)"}) {
        CHECK_MESSAGE(help.find(line) != std::string::npos, line);
    }
    // The bash completion lists every spelling; there are more than 300 of them.
    std::string completion_script;
    REQUIRE(testutil::run("./llm-server --completion-bash", &completion_script) == 0);
    size_t n_spellings = std::count(completion_script.begin(), completion_script.end(), ' ');
    MESSAGE("spellings accepted: " << n_spellings - 3);
    CHECK(n_spellings > 300);
    CHECK(testutil::run("./llm-server --version") == 0);
    CHECK(testutil::run("./llm-server -m x --no-such-flag 2>/dev/null") == 1);
    CHECK(testutil::run("./llm-server -m x --ctx-size 2>/dev/null") == 1);  // missing value
    CHECK(testutil::run("LLAMA_ARG_CONTEXT_SHIFT=maybe ./llm-server -m x 2>/dev/null") == 1);

    ServerProcess& s = *compat_server().proc;
    Reply p = get(s.port, "/props");
    REQUIRE(p.status == 200);
    CHECK(p.body["total_slots"] == 2);  // -np 2 over LLAMA_ARG_N_PARALLEL=3
    CHECK(p.body["n_ctx"] == 1024);     // LLAMA_ARG_CTX_SIZE
    CHECK(p.body["default_generation_settings"]["n_ctx"] == 512);
    CHECK(p.body["model_alias"] == "smol");  // -a over LLAMA_ARG_ALIAS
    // Each inapplicable flag leaves one line saying what it means here.
    std::string log = s.log();
    for (const char* note : {"-ngl: this is a CPU build", "--offline: always offline",
                             "--threads-http: one thread per connection", "--no-mmproj: no multimodal input"}) {
        CHECK_MESSAGE(log.find(note) != std::string::npos, note);
    }
    // Command-line modes read the variables too.
    std::string out, direct;
    REQUIRE(testutil::run(std::string("LLAMA_ARG_MODEL=") + kModel + " ./llm-server --tokenize -p 'The capital' 2>/dev/null", &out) == 0);
    REQUIRE(testutil::run(std::string("./llm-server -m ") + kModel + " --tokenize -p 'The capital'", &direct) == 0);
    CHECK(out == direct);
    CHECK(out == "504 3575\n");
}

TEST_CASE("server: any model name is served; /models and /v1/models fields as llama-server") {
    int port = compat_server().proc->port;
    for (const char* path : {"/models", "/v1/models"}) {
        Reply m = get(port, path);
        REQUIRE(m.status == 200);
        const json& d = m.body["data"][0];
        CHECK(m.body["data"].size() == 1);
        CHECK(d["id"] == "smol");
        CHECK(d["aliases"] == json({"smol", "gpt-4o-mini"}));
        CHECK(d["tags"] == json({"small", "test"}));
        CHECK(d["owned_by"] == "llamacpp");
        CHECK(d["meta"]["n_ctx"] == 512);
        CHECK(d["meta"]["n_ctx_train"] == 8192);
        CHECK(d["meta"]["n_params"].get<int64_t>() > 130000000);
        CHECK(d["meta"]["n_vocab"] == 49152);
        CHECK(m.body["models"][0]["model"] == "smol");
    }
    for (const char* name : {"gpt-4o-mini", "llama", "smol"}) {
        Reply r = post(port, "/v1/completions", {{"model", name}, {"prompt", "Hi"}, {"max_tokens", 1}});
        CHECK(r.status == 200);
        CHECK(r.body["model"] == "smol");
    }
}

TEST_CASE("server: several prompts in one /completion, llama-server's object and mixed forms") {
    int port = main_server().port;
    auto greedy = [&](const json& prompt) { return completion(port, {{"prompt", prompt}, {"n_predict", 4}, {"temperature", 0}}); };
    json a = greedy(kPrompts[0]), b = greedy(kPrompts[2]);
    json both = greedy({kPrompts[0], kPrompts[2]});
    REQUIRE(both.is_array());
    REQUIRE(both.size() == 2);
    CHECK(both[0]["index"] == 0);
    CHECK(both[1]["index"] == 1);
    CHECK(both[0]["content"] == a["content"]);
    CHECK(both[1]["content"] == b["content"]);
    // {"prompt_string": ...} is the string; a one-element list is one prompt.
    CHECK(greedy({{"prompt_string", kPrompts[0]}})["content"] == a["content"]);
    CHECK(greedy(json::array({kPrompts[0]}))["content"] == a["content"]);
    // Mixed ids and strings: one prompt, the strings without BOS after the first element.
    json ids = post(port, "/tokenize", {{"content", "The capital of"}}).body["tokens"];
    json mixed = ids;
    mixed.push_back(" France is");
    CHECK(greedy(mixed)["content"] == a["content"]);
    // Streaming several prompts: every event says which prompt it belongs to; each ends once.
    Stream st = post_stream(port, "/completion", {{"prompt", {kPrompts[0], kPrompts[2]}}, {"n_predict", 4}, {"temperature", 0}, {"stream", true}});
    std::string text[2];
    int ends[2] = {0, 0};
    for (const json& e : st.events) {
        int i = e["index"];
        REQUIRE((i == 0 || i == 1));
        text[i] += e["content"].get<std::string>();
        ends[i] += e["stop"] == true;
    }
    CHECK(ends[0] == 1);
    CHECK(ends[1] == 1);
    CHECK(text[0] == a["content"]);
    CHECK(text[1] == b["content"]);
    // OpenAI completions with several prompts: one choice each, in order.
    Reply oc = post(port, "/v1/completions", {{"prompt", {kPrompts[0], kPrompts[2]}}, {"max_tokens", 4}, {"temperature", 0}});
    REQUIRE(oc.status == 200);
    REQUIRE(oc.body["choices"].size() == 2);
    CHECK(oc.body["choices"][1]["index"] == 1);
    CHECK(oc.body["choices"][0]["text"] == a["content"]);
    CHECK(oc.body["choices"][1]["text"] == b["content"]);
    CHECK(oc.body["usage"]["completion_tokens"] == 8);
    CHECK(post(port, "/completion", {{"prompt", {{"prompt_string", "x"}, {"multimodal_data", {"aGk="}}}}}).status == 400);
    CHECK(post(port, "/completion", {{"prompt", json::array({"a", "", "b"})}, {"n_predict", 1}}).status == 400);  // an empty prompt
}

TEST_CASE("server: streaming token counts, include_usage, cached_tokens, return_progress, post_sampling_probs") {
    int port = main_server().port;
    const json body = {{"prompt", kPrompts[1]}, {"n_predict", 6}, {"temperature", 0}, {"ignore_eos", true}};
    json wb = body;
    wb["return_tokens"] = true;
    json whole = completion(port, wb);
    json sb = body;
    sb.update({{"stream", true}, {"return_progress", true}, {"cache_prompt", false}});
    Stream st = post_stream(port, "/completion", sb);
    REQUIRE(st.events.size() >= 3);
    std::vector<int> tokens;
    int last_count = 0, progress_events = 0;
    for (const json& e : st.events) {
        if (e.contains("prompt_progress")) {
            const json& pp = e["prompt_progress"];
            CHECK(pp["total"] == whole["tokens_evaluated"]);
            CHECK(pp["processed"].get<int>() <= pp["total"].get<int>());
            CHECK(pp["cache"] == 0);
            progress_events++;
            continue;
        }
        for (int t : e["tokens"]) tokens.push_back(t);  // the last token's id, in the final event too
        if (e["stop"] == true) break;
        CHECK(e["tokens_predicted"].get<int>() > last_count);  // counts in the partial events
        last_count = e["tokens_predicted"];
        CHECK(e["tokens_evaluated"] == whole["tokens_evaluated"]);
    }
    CHECK(progress_events >= 1);
    CHECK(st.events.front()["prompt_progress"]["processed"] == whole["tokens_evaluated"]);  // one chunk: all of it
    CHECK(json(tokens) == whole["tokens"]);

    // OpenAI streaming usage: a last chunk with no choices; cached prompt tokens reported.
    json msgs = {{{"role", "user"}, {"content", "Name a color."}}};
    json chat = {{"messages", msgs}, {"max_tokens", 3}, {"temperature", 0}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
    post_stream(port, "/v1/chat/completions", chat);
    Stream cs = post_stream(port, "/v1/chat/completions", chat);
    REQUIRE(cs.done);
    const json& last = cs.events.back();
    CHECK(last["choices"].empty());
    CHECK(last["usage"]["completion_tokens"] == 3);
    CHECK(last["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() > 0);
    for (size_t i = 0; i + 1 < cs.events.size(); i++) CHECK(!cs.events[i].contains("usage"));
    Reply nc = post(port, "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 3}, {"temperature", 0}});
    CHECK(nc.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() > 0);

    // n_probs: log-probabilities by default; with post_sampling_probs, probabilities in [0, 1].
    json pre = completion(port, {{"prompt", kPrompts[0]}, {"n_predict", 2}, {"temperature", 0}, {"n_probs", 3}});
    json post_p = completion(port, {{"prompt", kPrompts[0]}, {"n_predict", 2}, {"temperature", 0}, {"n_probs", 3}, {"post_sampling_probs", true}});
    const json& e0 = pre["completion_probabilities"][0];
    const json& p0 = post_p["completion_probabilities"][0];
    CHECK(e0["logprob"].get<double>() <= 0);
    CHECK(e0["top_logprobs"].size() == 3);
    CHECK(!p0.contains("logprob"));
    REQUIRE(p0["top_probs"].size() >= 1);
    CHECK(p0["id"] == e0["id"]);
    CHECK(p0["top_probs"][0]["id"] == p0["id"]);  // greedy: the sampled token is the most likely
    CHECK(p0["prob"].get<double>() == doctest::Approx(p0["top_probs"][0]["prob"].get<double>()));
    CHECK(p0["prob"].get<double>() > 0);
    CHECK(p0["prob"].get<double>() <= 1);
    CHECK(post_p["generation_settings"]["post_sampling_probs"] == true);
    for (const char* f : {"dynatemp_range", "typical_p", "xtc_probability", "dry_multiplier", "mirostat", "top_n_sigma", "samplers", "min_keep"}) {
        CHECK_MESSAGE(pre["generation_settings"].contains(f), f);
    }
}

TEST_CASE("server: /slots/{id}?action=save|restore|erase, confined to --slot-save-path") {
    CompatServer& cs = compat_server();
    int port = cs.proc->port;
    json first = completion(port, {{"prompt", kPrompts[3]}, {"n_predict", 4}, {"temperature", 0}, {"id_slot", 1}});
    const int cached = first["tokens_cached"];
    Reply save = post(port, "/slots/1?action=save", {{"filename", "fib.bin"}});
    REQUIRE_MESSAGE(save.status == 200, save.raw);
    CHECK(save.body["id_slot"] == 1);
    CHECK(save.body["n_saved"] == cached);
    CHECK(save.body["n_written"].get<int64_t>() > cached * 1000);
    CHECK(testutil::file_exists(cs.save_dir + "/fib.bin"));
    Reply erase = post(port, "/slots/1?action=erase", json::object());
    REQUIRE(erase.status == 200);
    CHECK(erase.body["n_erased"] == cached);
    CHECK(get(port, "/slots").body[1]["n_past"] == 0);
    Reply restore = post(port, "/slots/1?action=restore", {{"filename", "fib.bin"}});
    REQUIRE_MESSAGE(restore.status == 200, restore.raw);
    CHECK(restore.body["n_restored"] == cached);
    CHECK(restore.body["n_read"] == save.body["n_written"]);
    CHECK(get(port, "/slots").body[1]["n_past"] == cached);
    // The restored cache is used: the same request evaluates only its last prompt token again.
    json again = completion(port, {{"prompt", kPrompts[3]}, {"n_predict", 4}, {"temperature", 0}, {"id_slot", 1}});
    CHECK(again["timings"]["prompt_n"] == 1);
    CHECK(again["content"] == first["content"]);
    // Names that would leave the folder, or are not names, are refused; a missing file is a 404.
    for (const char* bad : {"../escape.bin", "a/b.bin", "", "..", "/etc/passwd"}) {
        CHECK_MESSAGE(post(port, "/slots/1?action=save", {{"filename", bad}}).status == 400, bad);
    }
    CHECK(post(port, "/slots/1?action=restore", {{"filename", "missing.bin"}}).status == 404);
    CHECK(post(port, "/slots/1?action=explode", json::object()).status == 400);
    CHECK(post(port, "/slots/7?action=erase", json::object()).status == 404);
    std::string listing;
    testutil::run("ls " + cs.save_dir, &listing);
    CHECK(listing == "fib.bin\n");
    // A file that is not a slot file of this server is refused, and the slot stays usable.
    testutil::run("head -c 100 /dev/urandom > " + cs.save_dir + "/junk.bin");
    CHECK(post(port, "/slots/1?action=restore", {{"filename", "junk.bin"}}).status == 400);
    CHECK(completion(port, {{"prompt", "Hi"}, {"n_predict", 1}, {"id_slot", 1}})["tokens_predicted"] == 1);
}

TEST_CASE("server: POST /props, /chat/completions/input_tokens, the --metrics and --slots switches, embeddings") {
    int port = compat_server().proc->port;
    Reply pp = post(port, "/props", json::object());
    CHECK(pp.status == 200);
    CHECK(pp.body["success"] == true);
    json msgs = {{{"role", "user"}, {"content", "Hello there"}}};
    Reply it = post(port, "/v1/chat/completions/input_tokens", {{"messages", msgs}});
    REQUIRE(it.status == 200);
    CHECK(it.body["object"] == "response.input_tokens");
    std::string rendered = post(port, "/apply-template", {{"messages", msgs}}).body["prompt"];
    CHECK(it.body["input_tokens"] == post(port, "/tokenize", {{"content", rendered}, {"add_special", true}}).body["tokens"].size());
    // Without --metrics (as llama-server) /metrics is off; embeddings need an embedding model.
    Reply m = get(port, "/metrics");
    CHECK(m.status == 501);
    CHECK(m.body["error"]["type"] == "not_supported_error");
    Reply e = post(port, "/v1/embeddings", {{"input", "hi"}});
    CHECK(e.status == 501);
    CHECK(e.body["error"]["message"].get<std::string>().find("--embeddings") != std::string::npos);
    // The main server has --metrics: the llama.cpp names, counters moving.
    completion(main_server().port, {{"prompt", "Hi"}, {"n_predict", 1}});
    std::string mt = get(main_server().port, "/metrics").raw;
    for (const char* name : {"n_tokens_max", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"}) {
        CHECK_MESSAGE(mt.find(std::string("\nllamacpp:") + name + " ") != std::string::npos, name);
    }
    CHECK(mt.find("llamacpp:n_tokens_max 0\n") == std::string::npos);
    CHECK(post(main_server().port, "/props", json::object()).status == 501);  // no --props

    ServerProcess off(server_cmd({"-c", "256", "--no-slots", "--no-warmup", "--chat-template", "command-r"}));
    // A llama-server built-in template this build does not render: accepted, said so, chatml used.
    CHECK(off.log().find("chat template 'command-r' (a llama-server built-in) is not rendered by this build") != std::string::npos);
    CHECK(get(off.port, "/props").body["chat_template_family"] == "chatml");
    Reply sl = get(off.port, "/slots");
    CHECK(sl.status == 501);
    CHECK(sl.body["error"]["type"] == "not_supported_error");
    CHECK(post(off.port, "/slots/0?action=erase", json::object()).status == 501);
}

TEST_CASE("server: the openai Python package, several model names") {
    REQUIRE_MESSAGE(testutil::run("python3 -c 'import openai' 2>/dev/null") == 0, "the openai package is missing: run scripts/setup");
    std::string out;
    int rc = testutil::run("python3 tests/openai_client.py " + std::to_string(compat_server().proc->port) + " smol 2>&1", &out);
    CHECK_MESSAGE(rc == 0, out);
    CHECK(out.rfind("ok ", 0) == 0);
    MESSAGE("openai client: " << out);
}

TEST_CASE("server: tool calling with the openai Python package (SmolLM2 with Qwen 2.5's Jinja template)") {
    REQUIRE_MESSAGE(testutil::run("python3 -c 'import openai' 2>/dev/null") == 0, "the openai package is missing: run scripts/setup");
    ServerProcess s(server_cmd({"-np", "1", "-c", "1024", "--chat-template-file",
                                testutil::shared_dir() + "/chat/jinja/templates/Qwen-Qwen2.5-7B-Instruct.jinja"}));
    CHECK(s.log().find("tool calls: hermes") != std::string::npos);
    std::string out;
    int rc = testutil::run("python3 tests/openai_tools.py " + std::to_string(s.port) + " 2>&1", &out);
    CHECK_MESSAGE(rc == 0, out);
    CHECK(out.find("ok ") != std::string::npos);
    MESSAGE(out);
    // The same server on Anthropic's endpoint, with the anthropic package.
    REQUIRE_MESSAGE(testutil::run("python3 -c 'import anthropic, jsonschema' 2>/dev/null") == 0, "anthropic or jsonschema is missing: run scripts/setup");
    rc = testutil::run("python3 tests/anthropic_tools.py " + std::to_string(s.port) + " 2>&1", &out);
    CHECK_MESSAGE(rc == 0, out);
    CHECK(out.find("ok ") != std::string::npos);
    MESSAGE("anthropic tool use: " << out);
    // The same on the Responses API: function_call items in and out, whole and streamed.
    rc = testutil::run("python3 tests/openai_responses_tools.py " + std::to_string(s.port) + " 2>&1", &out);
    CHECK_MESSAGE(rc == 0, out);
    CHECK(out.find("ok ") != std::string::npos);
    MESSAGE("responses tool calls: " << out);
}

namespace {

// The arguments of the one tool call, of `name`, that a chat request's answer must make (an object).
json the_one_call_arguments(int port, const json& body, const std::string& name) {
    Reply r = post(port, "/v1/chat/completions", body);
    REQUIRE_MESSAGE(r.status == 200, r.body.dump());
    const json& choice = r.body["choices"][0];
    CAPTURE(choice.dump());
    CHECK(choice["finish_reason"] == "tool_calls");
    REQUIRE((choice["message"].contains("tool_calls") && choice["message"]["tool_calls"].size() == 1));
    const json& call = choice["message"]["tool_calls"][0]["function"];
    CHECK(call["name"] == name);
    const json args = json::parse(call["arguments"].get<std::string>(), nullptr, false);
    REQUIRE(args.is_object());
    return args;
}

}  // namespace

TEST_CASE("server: tool_choice required forces a call in each template's syntax, its arguments valid for the schema") {
    // SmolLM2 knows none of these syntaxes: the grammar alone makes the call, which the format's parser
    // must then read back. Every argument is bounded (enums, an integer, a boolean), so the call ends.
    // (Kept to the JSON and XML syntaxes that differ; Hermes is tested with the openai package above.)
    const json tool = {{"type", "function"},
                       {"function", {{"name", "get_forecast"},
                                     {"description", "The forecast of a city"},
                                     {"parameters", {{"type", "object"},
                                                     {"properties", {{"city", {{"enum", {"Paris", "London", "Tokyo"}}}},
                                                                     {"days", {{"type", "integer"}}},
                                                                     {"hourly", {{"type", "boolean"}}}}},
                                                     {"required", {"city", "days"}}}}}}};
    const json other = {{"type", "function"}, {"function", {{"name", "get_time"}, {"description", "The time"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}};
    const std::pair<const char*, const char*> templates[] = {
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3"},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"},
        {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "command-r7b"},
        {"meetkai-functionary-medium-v3.1.jinja", "functionary-v3.1"},
        {"meetkai-functionary-medium-v3.2.jinja", "functionary-v3.2"},
        {"openai-gpt-oss-120b.jinja", "gpt-oss"},
        {"Kimi-K2-Instruct.jinja", "kimi-k2"},
        {"deepseek-ai-DeepSeek-V3.1.jinja", "deepseek"},
        {"Qwen3-Coder.jinja", "qwen3-coder"},
        {"GLM-4.6.jinja", "glm"},
    };
    for (const auto& [file, format] : templates) {
        const std::string name = file;
        CAPTURE(name);
        ServerProcess s(server_cmd({"-np", "1", "-c", "2048", "--chat-template-file", testutil::shared_dir() + "/chat/jinja/templates/" + file}));
        CHECK(s.log().find(std::string("tool calls: ") + format) != std::string::npos);
        const json body = {{"messages", json::array({{{"role", "user"}, {"content", "Hello!"}}})},
                           {"tools", json::array({other, tool})},
                           {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_forecast"}}}}},
                           {"parallel_tool_calls", false},
                           {"max_tokens", 256},  // JSON's spaces may be newlines and indents, bounded
                           {"temperature", 0}};
        const json args = the_one_call_arguments(s.port, body, "get_forecast");
        CHECK((args["city"] == "Paris" || args["city"] == "London" || args["city"] == "Tokyo"));
        CHECK(args["days"].is_number_integer());
        CHECK((!args.contains("hourly") || args["hourly"].is_boolean()));
        for (const auto& [key, value] : args.items()) CHECK((key == "city" || key == "days" || key == "hourly"));
    }
}

TEST_CASE("server: tool_choice auto: the lazy grammar starts at the call the model opens after the prompt's >>> (Functionary v3.2)") {
    // The history shows a call (its arguments as text, which this template joins to its ">>>name\n"),
    // so the greedy model opens another one for the new city right at the prompt's ">>>": the trigger
    // word ">>>get_weather\n" begun by the prompt. The tool declares a second required parameter the
    // history never shows: only the grammar writes it. (GPT-OSS's triggers: tests/test_tool_grammar.cpp;
    // SmolLM2 does not write harmony by itself.)
    const json tool = {{"type", "function"},
                       {"function", {{"name", "get_weather"},
                                     {"description", "The weather of a city"},
                                     {"parameters", {{"type", "object"},
                                                     {"properties", {{"location", {{"type", "string"}, {"maxLength", 16}}},
                                                                     {"unit_system", {{"enum", {"metric", "imperial"}}}}}},
                                                     {"required", {"location", "unit_system"}}}}}}};
    const json messages = json::array(
        {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
         {{"role", "assistant"},
          {"content", nullptr},
          {"tool_calls", json::array({{{"id", "call_1"}, {"type", "function"},
                                       {"function", {{"name", "get_weather"}, {"arguments", "{\"location\": \"Paris\"}"}}}}})}},
         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temperature\": 20}"}},
         {{"role", "user"}, {"content", "What is the weather in London?"}}});
    ServerProcess s(server_cmd({"-np", "1", "-c", "2048", "--chat-template-file",
                                testutil::shared_dir() + "/chat/jinja/templates/meetkai-functionary-medium-v3.2.jinja"}));
    Reply t = post(s.port, "/apply-template", {{"messages", messages}});
    REQUIRE(t.status == 200);
    CHECK(t.body["prompt"].get<std::string>().find(">>>get_weather\n{\"location\": \"Paris\"}<|eot_id|>") != std::string::npos);
    const json body = {{"messages", messages}, {"tools", json::array({tool})}, {"parallel_tool_calls", false}, {"max_tokens", 64}, {"temperature", 0}};
    const json args = the_one_call_arguments(s.port, body, "get_weather");
    CHECK(args["location"] == "London");
    CHECK((args["unit_system"] == "metric" || args["unit_system"] == "imperial"));
    CHECK(args.size() == 2);
}

TEST_CASE("server: --reasoning-budget ends the thinking after exactly N tokens; reasoning_content is split off") {
    ServerProcess s(server_cmd({"-np", "1", "-c", "512", "--reasoning-budget", "5", "--chat-template-file",
                                testutil::shared_dir() + "/chat/jinja/templates/Qwen3.5-4B.jinja"}));
    const json messages = json::array({{{"role", "user"}, {"content", "What is the capital of France?"}}});
    Reply t = post(s.port, "/apply-template", {{"messages", messages}});
    REQUIRE(t.status == 200);
    const std::string prompt = t.body["prompt"];
    REQUIRE(prompt.size() > 8);
    CHECK(prompt.substr(prompt.size() - 8) == "<think>\n");  // the template opens the thinking block
    // The first 5 greedy tokens after the prompt: what the budget lets the model think.
    Reply five = post(s.port, "/completion", {{"prompt", prompt}, {"n_predict", 5}, {"temperature", 0}});
    REQUIRE(five.status == 200);
    const std::string thought = five.body["content"];
    REQUIRE(thought.find("</think>") == std::string::npos);
    Reply r = post(s.port, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 16}, {"temperature", 0}});
    REQUIRE(r.status == 200);
    const json& m = r.body["choices"][0]["message"];
    auto trim = [](std::string x) {
        x.erase(0, x.find_first_not_of(" \n"));
        x.erase(x.find_last_not_of(" \n") + 1);
        return x;
    };
    CHECK(m["reasoning_content"] == trim(thought));
    CHECK(m["content"].is_string());
    CHECK(r.body["usage"]["completion_tokens"].get<int>() > 5);
    // chat_template_kwargs reach the template: enable_thinking false closes the block in the prompt
    Reply off = post(s.port, "/apply-template", {{"messages", messages}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
    REQUIRE(off.status == 200);
    const std::string closed = off.body["prompt"];
    CHECK(closed.substr(closed.size() - 19) == "<think>\n\n</think>\n\n");
}

TEST_CASE("server: --api-prefix serves every endpoint under the prefix; -v and --log-file") {
    char tmpl[] = "/tmp/llm-log-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    const std::string log_file = tmpl;
    ServerProcess s(server_cmd({"-c", "256", "--no-warmup", "--api-prefix", "/llm", "-v", "--log-file", log_file}), false);
    for (double t0 = now_s(); get(s.port, "/llm/health").status != 200; std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
        REQUIRE_MESSAGE(now_s() - t0 < 60, s.log());
    }
    CHECK(get(s.port, "/health").status == 404);
    CHECK(get(s.port, "/llm/v1/models").body["data"][0]["id"] == kModel);
    CHECK(post(s.port, "/llm/completion", {{"prompt", "Hi"}, {"n_predict", 1}}).body["tokens_predicted"] == 1);
    CHECK(testutil::run("./llm-server -m x --api-prefix llm/ 2>/dev/null") == 1);
    // -v logs request bodies (level D); --log-file gets the same lines as stderr.
    CHECK(s.log().find(" D http: request body: {\"n_predict\":1,\"prompt\":\"Hi\"}") != std::string::npos);
    const std::string copy = testutil::read_file(log_file);
    CHECK(copy.find("listening on 127.0.0.1:") != std::string::npos);
    CHECK(copy.find("request body") != std::string::npos);
    unlink(log_file.c_str());
}

// ------------------------------------------------------------------------------------------------ reliability

namespace {

// A /proc/PID/status field in KiB (VmRSS: now, VmHWM: the peak so far).
long proc_kib(pid_t pid, const char* field) {
    std::string s = testutil::read_file("/proc/" + std::to_string(pid) + "/status");
    size_t at = s.find(std::string(field) + ":");
    return at == std::string::npos ? -1 : atol(s.c_str() + at + strlen(field) + 1);
}

bool all_slots_idle(int port, const http::Headers& h = {}) {
    Reply s = get(port, "/slots", h);
    if (s.status != 200) return false;
    for (const json& slot : s.body)
        if (slot["is_processing"] == true) return false;
    return true;
}

}  // namespace

TEST_CASE("server: a non-streaming request whose client disconnects frees its slot within 1 s") {
    ServerProcess& s = main_server();
    REQUIRE(all_slots_idle(s.port));
    http::Client c("127.0.0.1", s.port, 60000);
    c.send_raw("POST /completion HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: ");
    std::string body = json{{"prompt", kPrompts[1]}, {"n_predict", 480}, {"ignore_eos", true}}.dump();
    c.send_raw(std::to_string(body.size()) + "\r\n\r\n" + body);
    bool busy = false;
    for (double t0 = now_s(); !busy && now_s() - t0 < 10; std::this_thread::sleep_for(std::chrono::milliseconds(20))) busy = !all_slots_idle(s.port);
    REQUIRE(busy);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));   // tokens are flowing
    c.close();
    const double t_close = now_s();
    bool idle = false;
    while (!idle && now_s() - t_close < 5) {
        idle = all_slots_idle(s.port);
        if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(idle);
    CHECK(now_s() - t_close < 1.0);
    CHECK(s.log().find("cancelled (client gone)") != std::string::npos);
}

TEST_CASE("server: /health and /metrics answer within 1 s while 64 idle and 100 trickling connections are open") {
    ServerProcess& s = main_server();   // --max-connections 64 (the default)
    std::vector<std::unique_ptr<http::Client>> idle, trickling;
    for (int i = 0; i < 64; ++i) {
        idle.push_back(std::make_unique<http::Client>("127.0.0.1", s.port, 5000));
        idle.back()->connect();
    }
    for (int i = 0; i < 100; ++i) {
        trickling.push_back(std::make_unique<http::Client>("127.0.0.1", s.port, 5000));
        try { trickling.back()->send_raw("POST /completion HTTP/1.1\r\nX-Slow: "); } catch (const std::exception&) {}
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int round = 0; round < 3; ++round) {
        for (const char* path : {"/health", "/health?fail_on_no_slot=1", "/metrics"}) {
            CAPTURE(path);
            for (auto& t : trickling)   // one more byte each: still not a request
                if (t->is_open()) (void)!::send(t->fd(), "z", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            double t0 = now_s();
            Reply r = get(s.port, path);
            CHECK(r.status == 200);
            CHECK(now_s() - t0 < 1.0);
        }
    }
    trickling.clear();
    idle.clear();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(get(s.port, "/props").status == 200);
}

TEST_CASE("server: eight 16 MB prompts at once are refused without tokenizing; peak RSS stays bounded") {
    ServerProcess s(server_cmd({"-np", "4", "-c", "2048"}));
    const long idle_kib = proc_kib(s.pid, "VmRSS"), model_kib = (long)(testutil::read_file(kModel).size() / 1024);
    const std::string body = json{{"prompt", std::string(16000000, 'a')}, {"n_predict", 1}}.dump();
    std::atomic<int> refused{0}, busy{0};
    std::vector<std::thread> clients;
    const double t0 = now_s();
    for (int i = 0; i < 8; i++) {
        clients.emplace_back([&] {
            try {
                http::Client c("127.0.0.1", s.port, 60000);
                int st = c.request("POST", "/completion", body).status;
                if (st == 400) refused++;
                if (st == 503) busy++;
            } catch (const std::exception&) {
                busy++;   // refused mid-upload (bytes in flight): the server may close before reading it all
            }
        });
    }
    for (auto& t : clients) t.join();
    const double took = now_s() - t0;
    const long peak_kib = proc_kib(s.pid, "VmHWM");
    MESSAGE("idle RSS " << idle_kib / 1024 << " MiB, model " << model_kib / 1024 << " MiB, peak " << peak_kib / 1024 << " MiB; "
                        << refused.load() << " refused (context), " << busy.load() << " busy (bytes in flight), " << took << " s");
    CHECK(refused + busy == 8);
    CHECK(refused >= 1);
    CHECK(peak_kib < 2 * idle_kib + model_kib);
    CHECK(get(s.port, "/health").status == 200);
    CHECK(completion(s.port, {{"prompt", "Hello"}, {"n_predict", 2}})["tokens_predicted"] == 2);
}

TEST_CASE("server: /health?fail_on_no_slot=1 is 503 while every slot is busy") {
    int port = small_server().port;   // one slot
    Reply h = get(port, "/health?fail_on_no_slot=1");
    CHECK(h.status == 200);
    CHECK(h.body == json{{"status", "ok"}, {"slots_idle", 1}, {"slots_processing", 0}});
    std::atomic<bool> first_token{false};
    std::thread a([&] {
        http::Client c("127.0.0.1", port, 60000);
        c.request("POST", "/completion", json{{"prompt", "Count: 1, 2, 3,"}, {"n_predict", 48}, {"ignore_eos", true}, {"stream", true}}.dump(),
                  kAuth, [&](std::string_view) { first_token = true; return true; });
    });
    while (!first_token) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    h = get(port, "/health?fail_on_no_slot=1");
    CHECK(h.status == 503);
    CHECK(h.body == json{{"status", "no slot available"}, {"slots_idle", 0}, {"slots_processing", 1}});
    CHECK(get(port, "/health").status == 200);   // liveness is not readiness
    a.join();
}

TEST_CASE("server: API keys from --api-key-file and LLAMA_API_KEY") {
    char tmpl[] = "/tmp/llm-test-keys-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    testutil::write_file(tmpl, "first-key\n# a comment\nsecond-key\n");
    {
        ServerProcess s(server_cmd({"-np", "1", "-c", "256", "--api-key-file", tmpl}));
        CHECK(get(s.port, "/props").status == 401);
        CHECK(get(s.port, "/props", {{"Authorization", "Bearer first-key"}}).status == 200);
        CHECK(get(s.port, "/props", {{"Authorization", "Bearer second-key"}}).status == 200);
    }
    unlink(tmpl);
    setenv("LLAMA_API_KEY", "from-env", 1);
    ServerProcess s(server_cmd({"-np", "1", "-c", "256"}));
    unsetenv("LLAMA_API_KEY");
    CHECK(get(s.port, "/props").status == 401);
    CHECK(get(s.port, "/props", {{"X-Api-Key", "from-env"}}).status == 200);
}

TEST_CASE("server: a stream cut by the end of the shutdown grace is logged as cut; a second SIGTERM exits 1 at once") {
    for (bool second_signal : {false, true}) {
        CAPTURE(second_signal);
        ServerProcess s(server_cmd({"-np", "1", "-c", "512", "--shutdown-grace", second_signal ? "30" : "1"}));
        std::atomic<bool> started{false};
        std::thread t([&] {
            try {
                post_stream(s.port, "/completion", {{"prompt", kPrompts[0]}, {"n_predict", 500}, {"ignore_eos", true}, {"stream", true}},
                            [&](const json&) { started = true; });
            } catch (const std::exception&) {
            }
        });
        while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        kill(s.pid, SIGTERM);
        if (second_signal) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            double t0 = now_s();
            CHECK(s.stop(SIGTERM, 5) == 1);
            CHECK(now_s() - t0 < 2.0);
            CHECK(s.log().find("Received second interrupt, terminating immediately.") != std::string::npos);
        } else {
            CHECK(s.stop(0, 30) == 0);
            CHECK(s.log().find("stream cut short (shutdown grace period over)") != std::string::npos);
            CHECK(s.log().find("/completion -> 200\n") == std::string::npos);
        }
        t.join();
    }
}

TEST_CASE("server: grammar, json_schema and response_format constrain the output; bad values are 400s") {
    int port = main_server().port;
    // GBNF: the greedy answer is forced into the grammar, and ends (eos) once the grammar is complete.
    json g = completion(port, {{"prompt", "Is Paris in France? Answer:"}, {"n_predict", 16}, {"temperature", 0},
                               {"grammar", "root ::= \" \" (\"yes\" | \"no\") \".\""}});
    const std::string answer = g["content"];
    CHECK((answer == " yes." || answer == " no."));
    CHECK(g["stop_type"] == "eos");
    CHECK(g["generation_settings"]["grammar"].get<std::string>().find("yes") != std::string::npos);

    // A JSON schema: the output parses and has exactly the required shape.
    const json schema = {{"type", "object"},
                         {"properties", {{"city", {{"type", "string"}, {"maxLength", 24}}}, {"population", {{"type", "integer"}}}}},
                         {"required", {"city", "population"}}};
    auto check_doc = [](const std::string& text) {
        json doc = json::parse(text, nullptr, false);
        REQUIRE_MESSAGE(doc.is_object(), text);
        CHECK(doc.size() == 2);
        CHECK(doc["city"].is_string());
        CHECK(doc["city"].get<std::string>().size() <= 24);
        CHECK(doc["population"].is_number_integer());
    };
    json c = completion(port, {{"prompt", "The largest city in France, as JSON:"}, {"n_predict", 64}, {"temperature", 0}, {"json_schema", schema}});
    check_doc(c["content"]);
    json msgs = {{{"role", "user"}, {"content", "Give the largest city of Japan and its population as JSON."}}};
    Reply rf = post(port, "/v1/chat/completions",
                    {{"messages", msgs}, {"max_tokens", 64}, {"temperature", 0},
                     {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "city"}, {"schema", schema}}}}}});
    REQUIRE_MESSAGE(rf.status == 200, rf.raw);
    check_doc(rf.body["choices"][0]["message"]["content"]);
    Reply jo = post(port, "/v1/chat/completions",
                    {{"messages", msgs}, {"max_tokens", 64}, {"temperature", 0}, {"response_format", {{"type", "json_object"}}}});
    REQUIRE_MESSAGE(jo.status == 200, jo.raw);
    const std::string any = jo.body["choices"][0]["message"]["content"];
    CHECK_MESSAGE(!json::parse(any, nullptr, false).is_discarded(), any);

    // Invalid grammars, schemas and values: 400 naming the problem.
    auto bad = [&](const json& body, const char* needle) {
        Reply r = post(port, "/completion", body);
        CHECK_MESSAGE(r.status == 400, r.raw);
        CHECK_MESSAGE(r.raw.find(needle) != std::string::npos, r.raw);
    };
    const json base = {{"prompt", "x"}, {"n_predict", 1}};
    auto with = [&](const char* k, const json& v) { json b = base; b[k] = v; return b; };
    bad(with("grammar", "root ::= missing"), "undefined rule 'missing'");
    bad(with("grammar", "root ::= root \"a\""), "left recursion");
    bad(with("json_schema", {{"type", "strin"}}), "json_schema: unsupported type");
    bad(with("response_format", {{"type", "xml"}}), "response_format type");
    bad(with("mirostat", 3), "'mirostat' must be in [0, 2]");
    bad(with("logit_bias", "x"), "'logit_bias' must be");
    bad(with("logit_bias", {{1}}), "'logit_bias' must be");
    bad(with("dry_sequence_breakers", json::array()), "'dry_sequence_breakers' must be a non-empty array");
    bad(with("samplers", 5), "'samplers' must be");
    bad(with("typical_p", "high"), "'typical_p' must be a number");
    bad(with("min_keep", -1), "'min_keep' must be in");
}

TEST_CASE("server: logit_bias bans and boosts; the sampling fields show in generation_settings") {
    int port = main_server().port;
    const json base = {{"prompt", kPrompts[0]}, {"n_predict", 4}, {"temperature", 0}, {"return_tokens", true}};
    json plain = completion(port, base);
    const int first = plain["tokens"][0];
    json b1 = base, b2 = base, b3 = base;
    b1["logit_bias"] = {{first, false}};                   // array form, false bans
    b2["logit_bias"] = {{std::to_string(first), -100.0}};  // object form (OpenAI's)
    b3["logit_bias"] = {{"Paris", false}, {" Paris", false}};  // text: each of its tokens
    for (const json& b : {b1, b2}) {
        json r = completion(port, b);
        CHECK(r["tokens"][0] != first);
    }
    json r3 = completion(port, b3);
    CHECK(r3["content"].get<std::string>().find("Paris") == std::string::npos);
    json boost = base;
    boost["logit_bias"] = json::array({json::array({42, 100})});
    CHECK(completion(port, boost)["tokens"][0] == 42);

    json s = base;
    s.update({{"typical_p", 0.9}, {"top_n_sigma", 1.5}, {"xtc_probability", 0.25}, {"xtc_threshold", 0.2}, {"dry_multiplier", 0.8},
              {"dry_base", 0.5}, {"dry_allowed_length", 3}, {"dry_penalty_last_n", 32}, {"dry_sequence_breakers", {"\n"}},
              {"mirostat", 2}, {"mirostat_tau", 4.0}, {"mirostat_eta", 0.2}, {"dynatemp_range", 0.5}, {"dynatemp_exponent", 2.0},
              {"min_keep", 2}, {"samplers", {"top_k", "temperature"}}, {"logit_bias", {{42, 1.5}}}});
    json gs = completion(port, s)["generation_settings"];
    CHECK(gs["typical_p"].get<double>() == doctest::Approx(0.9));
    CHECK(gs["top_n_sigma"].get<double>() == doctest::Approx(1.5));
    CHECK(gs["xtc_probability"].get<double>() == doctest::Approx(0.25));
    CHECK(gs["xtc_threshold"].get<double>() == doctest::Approx(0.2));
    CHECK(gs["dry_multiplier"].get<double>() == doctest::Approx(0.8));
    CHECK(gs["dry_base"].get<double>() == doctest::Approx(1.75));  // < 1: llama-server's default
    CHECK(gs["dry_allowed_length"] == 3);
    CHECK(gs["dry_penalty_last_n"] == 32);
    CHECK(gs["dry_sequence_breakers"] == json({"\n"}));
    CHECK(gs["mirostat"] == 2);
    CHECK(gs["mirostat_tau"].get<double>() == doctest::Approx(4.0));
    CHECK(gs["mirostat_eta"].get<double>() == doctest::Approx(0.2));
    CHECK(gs["dynatemp_range"].get<double>() == doctest::Approx(0.5));
    CHECK(gs["dynatemp_exponent"].get<double>() == doctest::Approx(2.0));
    CHECK(gs["min_keep"] == 2);
    CHECK(gs["samplers"] == json({"top_k", "temperature"}));
    CHECK(gs["logit_bias"] == json::parse(R"([{"bias": 1.5, "token": 42}])"));
    CHECK(completion(port, base)["generation_settings"]["samplers"] ==
          json({"penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"}));
    // A string of letters is llama-server's other spelling of the order.
    json letters = base;
    letters["samplers"] = "kt";
    CHECK(completion(port, letters)["generation_settings"]["samplers"] == json({"top_k", "temperature"}));
}
