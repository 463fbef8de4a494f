// llm-server's other dialects over real sockets against SmolLM2: /infill (fill-in-the-middle; SmolLM2
// has no FIM tokens, so a copy with FIM token ids added by the gguf package's gguf_new_metadata serves
// the prompt-building tests), Anthropic's /v1/messages and /v1/messages/count_tokens, OpenAI's
// /v1/responses, streaming included, and --no-webui.
#include <cstdio>

#include "server_util.hpp"

namespace {

using json = nlohmann::json;
using namespace testserver;

// SmolLM2's ids used as FIM tokens in the copy (its <issue_start> <issue_comment> <issue_closed> and
// <file_sep>); <reponame> (4) is recognized as the repository token by its text, in both files.
constexpr int kFimPre = 8, kFimSuf = 9, kFimMid = 10, kFimSep = 5, kFimRep = 4;

// SmolLM2 with tokenizer.ggml.fim_{pre,suf,mid,sep}_token_id, written once per run.
const std::string& fim_model() {
    static std::string path;
    if (path.empty()) {
        std::string p = "/tmp/llm-test-smollm2-fim-" + std::to_string(getpid()) + ".gguf";
        std::string cmd = "python3 -m gguf.scripts.gguf_new_metadata --force '" + std::string(kModel) + "' '" + p + "'" +
                          " --special-token-by-id fim_pre " + std::to_string(kFimPre) + " --special-token-by-id fim_suf " +
                          std::to_string(kFimSuf) + " --special-token-by-id fim_mid " + std::to_string(kFimMid) +
                          " --special-token-by-id fim_sep " + std::to_string(kFimSep) + " >/dev/null 2>&1";
        REQUIRE_MESSAGE(testutil::run(cmd) == 0, "could not write the FIM copy of SmolLM2 (python3 gguf package): " << cmd);
        static struct Remove { std::string p; ~Remove() { std::remove(p.c_str()); } } remove{p};
        path = p;
    }
    return path;
}

std::vector<std::string> fim_server_cmd(std::vector<std::string> extra) {
    std::vector<std::string> a = {"./llm-server", "-m", fim_model(), "--host", "127.0.0.1", "--port", "0", "-np", "1", "-c", "256",
                                  "-b", "64", "-n", "16", "--temp", "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
}

// The server the dialect tests share: 2 slots of 1024 tokens, greedy by default.
ServerProcess& dialect_server() {
    static std::unique_ptr<ServerProcess> s;
    if (!s) s = std::make_unique<ServerProcess>(server_cmd({"-np", "2", "-c", "2048", "--temp", "0"}));
    return *s;
}

std::vector<int> tokens_of(int port, const std::string& text, bool parse_special = false) {
    Reply r = post(port, "/tokenize", {{"content", text}, {"parse_special", parse_special}});
    REQUIRE(r.status == 200);
    return r.body["tokens"].get<std::vector<int>>();
}

void append(std::vector<int>& to, const std::vector<int>& from) { to.insert(to.end(), from.begin(), from.end()); }

// The repo-level FIM pattern's pieces: "[FIM_REP]myproject\n" and "[FIM_SEP]NAME\n".
std::vector<int> repo_header(int port) {
    std::vector<int> t = {kFimRep};
    append(t, tokens_of(port, "myproject\n"));
    return t;
}
std::vector<int> file_header(int port, const std::string& name) {
    std::vector<int> t = {kFimSep};
    append(t, tokens_of(port, name + "\n"));
    return t;
}

std::string detokenized(int port, const std::vector<int>& tokens) {
    Reply r = post(port, "/detokenize", {{"tokens", tokens}});
    REQUIRE(r.status == 200);
    return r.body["content"];
}

// A named event stream (event: NAME / data: JSON blocks), as Anthropic and Responses send them.
struct NamedEvent {
    std::string name;
    json data;
};
struct EventStream {
    int status = 0;
    std::string content_type, raw;
    std::vector<NamedEvent> events;
};

EventStream post_events(int port, const std::string& path, const json& body) {
    http::Client c("127.0.0.1", port, 60000);
    EventStream s;
    auto resp = c.request("POST", path, body.dump(), {}, [&](std::string_view piece) { s.raw += piece; return true; });
    s.status = resp.status;
    s.content_type = resp.header("content-type");
    size_t at = 0, end;
    while ((end = s.raw.find("\n\n", at)) != std::string::npos) {
        NamedEvent e;
        std::string block = s.raw.substr(at, end - at);
        at = end + 2;
        size_t line_at = 0;
        while (line_at <= block.size()) {
            size_t nl = block.find('\n', line_at);
            std::string line = block.substr(line_at, nl == std::string::npos ? std::string::npos : nl - line_at);
            if (line.rfind("event: ", 0) == 0) e.name = line.substr(7);
            if (line.rfind("data: ", 0) == 0) e.data = json::parse(line.substr(6));
            if (nl == std::string::npos) break;
            line_at = nl + 1;
        }
        s.events.push_back(std::move(e));
    }
    return s;
}

// The greedy chat answer the same conversation gets from /v1/chat/completions.
json chat_reference(int port, const json& messages, int max_tokens) {
    Reply r = post(port, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", max_tokens}});
    REQUIRE_MESSAGE(r.status == 200, r.raw);
    return r.body;
}

const json kConversation = json::array({{{"role", "system"}, {"content", "You are a helpful assistant."}},
                                        {{"role", "user"}, {"content", "Name three colors."}}});

}  // namespace

TEST_CASE("server: /infill without FIM tokens is llama-server's 501") {
    Reply r = post(dialect_server().port, "/infill", {{"input_prefix", "def f():\n"}, {"input_suffix", "\n"}});
    CHECK(r.status == 501);
    CHECK(r.body["error"]["type"] == "not_supported_error");
    CHECK(r.body["error"]["message"] ==
          "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing. ");
}

TEST_CASE("server: /infill builds llama-server's FIM prompt, token for token") {
    ServerProcess server(fim_server_cmd({}));
    const int port = server.port;
    const std::string prefix = "def add(a, b):\n    ", suffix = "\n\nprint(add(1, 2))\n", prompt = "return";

    SUBCASE("repo-level pattern with an extra file; the answer is the completion of that prompt") {
        json body{{"input_prefix", prefix}, {"input_suffix", suffix}, {"prompt", prompt},
                  {"input_extra", {{{"filename", "util.py"}, {"text", "import math\n"}}, {{"text", "X = 1\n"}}}},
                  {"n_predict", 8}, {"return_tokens", true}};
        std::vector<int> want = repo_header(port);
        append(want, file_header(port, "util.py"));
        append(want, tokens_of(port, "import math\n"));
        append(want, file_header(port, "tmp"));  // a chunk without a filename
        append(want, tokens_of(port, "X = 1\n"));
        append(want, file_header(port, "filename"));
        want.push_back(kFimPre);
        append(want, tokens_of(port, prefix));
        append(want, tokens_of(port, prompt, true));
        want.push_back(kFimSuf);
        append(want, tokens_of(port, suffix));
        want.push_back(kFimMid);

        Reply infill = post(port, "/infill", body);
        REQUIRE_MESSAGE(infill.status == 200, infill.raw);
        CHECK(infill.body["tokens_evaluated"] == want.size());
        CHECK(infill.body["prompt"] == detokenized(port, want));
        // The same tokens as a /completion prompt give the same greedy answer.
        Reply direct = post(port, "/completion", {{"prompt", want}, {"n_predict", 8}, {"return_tokens", true}});
        REQUIRE(direct.status == 200);
        CHECK(infill.body["content"] == direct.body["content"]);
        CHECK(infill.body["tokens"] == direct.body["tokens"]);
        CHECK(infill.body["tokens_predicted"] == 8);

        // response_fields (as llama.vscode asks): only those values, each under its path.
        json fields = body;
        fields["response_fields"] = {"content", "timings/prompt_n", "tokens_predicted", "timings/nothing"};
        Reply cut = post(port, "/infill", fields);
        REQUIRE(cut.status == 200);
        CHECK(cut.body.size() == 3);
        CHECK(cut.body["content"] == infill.body["content"]);
        CHECK(cut.body["tokens_predicted"] == 8);
        CHECK(cut.body["timings/prompt_n"].is_number_integer());

        // Streamed, as /completion streams: the same text, the last event with stop: true, no [DONE].
        json streamed = body;
        streamed["stream"] = true;
        Stream st = post_stream(port, "/infill", streamed);
        REQUIRE(st.status == 200);
        std::string text;
        for (const json& e : st.events) text += e["content"].get<std::string>();
        CHECK(text == infill.body["content"]);
        REQUIRE(!st.events.empty());
        CHECK(st.events.back()["stop"] == true);
        CHECK_FALSE(st.done);
    }

    SUBCASE("prefix, suffix and extra context are cut to their shares of the batch and the slot") {
        // -b 64: the prefix keeps its last 48 tokens, the suffix its first 16 - 2 - 1 (prompt) = 13;
        // -c 256, -n 16: the extra tokens keep their last 256 - 64 - 2 * 16 = 160.
        std::string long_prefix, long_suffix, long_extra;
        for (int i = 0; i < 40; i++) long_prefix += "x" + std::to_string(i) + " = " + std::to_string(i) + "\n";
        for (int i = 0; i < 20; i++) long_suffix += "print(x" + std::to_string(i) + ")\n";
        for (int i = 0; i < 60; i++) long_extra += "y" + std::to_string(i) + " = " + std::to_string(i * 7) + "\n";
        std::vector<int> p = tokens_of(port, long_prefix), s = tokens_of(port, long_suffix);
        REQUIRE(p.size() > 48);
        REQUIRE(s.size() > 13);
        std::vector<int> extra = repo_header(port);
        append(extra, file_header(port, "big.py"));
        append(extra, tokens_of(port, long_extra));
        append(extra, file_header(port, "filename"));
        REQUIRE(extra.size() > 160);
        std::vector<int> want(extra.end() - 160, extra.end());
        want.push_back(kFimPre);
        want.insert(want.end(), p.end() - 48, p.end());
        append(want, tokens_of(port, "x", true));
        want.push_back(kFimSuf);
        want.insert(want.end(), s.begin(), s.begin() + 13);
        want.push_back(kFimMid);

        json body{{"input_prefix", long_prefix}, {"input_suffix", long_suffix}, {"prompt", "x"},
                  {"input_extra", {{{"filename", "big.py"}, {"text", long_extra}}}}, {"n_predict", 2}};
        Reply infill = post(port, "/infill", body);
        REQUIRE_MESSAGE(infill.status == 200, infill.raw);
        CHECK(infill.body["tokens_evaluated"] == want.size());
        CHECK(infill.body["prompt"] == detokenized(port, want));
    }

    SUBCASE("input_prefix and input_suffix may be token ids; bad requests are 400s naming the field") {
        Reply ids = post(port, "/infill", {{"input_prefix", json::array({100, 200})}, {"input_suffix", json::array({300})}, {"n_predict", 1}});
        REQUIRE(ids.status == 200);
        std::vector<int> want = repo_header(port);
        append(want, file_header(port, "filename"));
        append(want, {kFimPre, 100, 200, kFimSuf, 300, kFimMid});
        CHECK(ids.body["tokens_evaluated"] == want.size());
        CHECK(ids.body["prompt"] == detokenized(port, want));
        struct Bad { json body; std::string message; };
        for (const Bad& b : std::vector<Bad>{
                 {{{"input_suffix", ""}}, "\"input_prefix\" is required"},
                 {{{"input_prefix", ""}}, "\"input_suffix\" is required"},
                 {{{"input_prefix", ""}, {"input_suffix", ""}, {"prompt", 5}}, "\"prompt\" must be a string"},
                 {{{"input_prefix", ""}, {"input_suffix", ""}, {"input_extra", "x"}},
                  "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}"},
                 {{{"input_prefix", ""}, {"input_suffix", ""}, {"input_extra", {{{"filename", "a"}}}}},
                  "extra_context chunk must contain a \"text\" field with a string value"},
                 {{{"input_prefix", ""}, {"input_suffix", ""}, {"input_extra", {{{"text", "a"}, {"filename", 1}}}}},
                  "extra_context chunk's \"filename\" field must be a string"}}) {
            Reply r = post(port, "/infill", b.body);
            CHECK(r.status == 400);
            CHECK(r.body["error"]["message"] == b.message);
        }
    }
}

TEST_CASE("server: --spm-infill puts the suffix first") {
    ServerProcess server(fim_server_cmd({"--spm-infill"}));
    const int port = server.port;
    Reply r = post(port, "/infill", {{"input_prefix", "a = 1\n"}, {"input_suffix", "b = 2\n"}, {"n_predict", 1}});
    REQUIRE(r.status == 200);
    std::vector<int> want = repo_header(port);
    append(want, file_header(port, "filename"));
    want.push_back(kFimSuf);
    append(want, tokens_of(port, "b = 2\n"));
    want.push_back(kFimPre);
    append(want, tokens_of(port, "a = 1\n"));
    want.push_back(kFimMid);
    CHECK(r.body["tokens_evaluated"] == want.size());
    CHECK(r.body["prompt"] == detokenized(port, want));
}

TEST_CASE("server: Anthropic /v1/messages answers as the chat endpoint does, in Anthropic's shape") {
    const int port = dialect_server().port;
    json ref = chat_reference(port, kConversation, 12);
    const std::string text = ref["choices"][0]["message"]["content"];
    json request{{"model", "claude-3-5-haiku-latest"},
                 {"system", {{{"type", "text"}, {"text", "You are a helpful assistant."}}}},
                 {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Name three colors."}}}}}}},
                 {"max_tokens", 12}};

    Reply r = post(port, "/v1/messages", request);
    REQUIRE_MESSAGE(r.status == 200, r.raw);
    CHECK(r.body["id"].get<std::string>().rfind("msg_", 0) == 0);
    CHECK(r.body["type"] == "message");
    CHECK(r.body["role"] == "assistant");
    CHECK(r.body["content"] == json::array({{{"type", "text"}, {"text", text}}}));
    CHECK(r.body["stop_reason"] == (ref["choices"][0]["finish_reason"] == "length" ? "max_tokens" : "end_turn"));
    CHECK(r.body["stop_sequence"].is_null());
    CHECK(r.body["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]);
    CHECK(r.body["usage"]["input_tokens"].get<int>() + r.body["usage"]["cache_read_input_tokens"].get<int>() ==
          ref["usage"]["prompt_tokens"].get<int>());

    // count_tokens counts the same prompt.
    Reply count = post(port, "/v1/messages/count_tokens", request);
    REQUIRE(count.status == 200);
    CHECK(count.body == json{{"input_tokens", ref["usage"]["prompt_tokens"]}});

    // A stop sequence taken from the answer ends it there and is reported.
    std::string word = text.substr(text.size() / 2, 3);
    json stopped = request;
    stopped["stop_sequences"] = {word};
    Reply s = post(port, "/v1/messages", stopped);
    REQUIRE(s.status == 200);
    CHECK(s.body["stop_reason"] == "end_turn");
    CHECK(s.body["stop_sequence"] == word);
    CHECK(s.body["content"][0]["text"] == text.substr(0, text.find(word)));

    // A plain string content and a string system prompt are the same conversation.
    json plain{{"system", "You are a helpful assistant."}, {"messages", {{{"role", "user"}, {"content", "Name three colors."}}}}, {"max_tokens", 12}};
    CHECK(post(port, "/v1/messages", plain).body["content"] == r.body["content"]);

    // Several turns with content blocks: the chat endpoint's answer to the same turns.
    json turns = json::array({{{"role", "system"}, {"content", "You are a helpful assistant."}},
                              {{"role", "user"}, {"content", "Hi!"}},
                              {{"role", "assistant"}, {"content", "Hello! How can I help?"}},
                              {{"role", "user"}, {"content", "Name three colors."}}});
    json blocks{{"system", "You are a helpful assistant."},
                {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi!"}}}}},
                              {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "Hello! How can I help?"}}}}},
                              {{"role", "user"}, {"content", "Name three colors."}}}},
                {"max_tokens", 12}};
    CHECK(post(port, "/v1/messages", blocks).body["content"][0]["text"] == chat_reference(port, turns, 12)["choices"][0]["message"]["content"]);

    CHECK(post(port, "/v1/messages", {{"max_tokens", 4}}).status == 400);
    CHECK(post(port, "/v1/messages", {{"messages", "hi"}}).status == 400);
}

TEST_CASE("server: Anthropic /v1/messages streams message_start ... message_stop") {
    const int port = dialect_server().port;
    json ref = chat_reference(port, kConversation, 12);
    json request{{"system", "You are a helpful assistant."},
                 {"messages", {{{"role", "user"}, {"content", "Name three colors."}}}},
                 {"max_tokens", 12},
                 {"stream", true}};
    EventStream s = post_events(port, "/v1/messages", request);
    REQUIRE(s.status == 200);
    CHECK(s.content_type.rfind("text/event-stream", 0) == 0);
    CHECK(s.raw.find("[DONE]") == std::string::npos);
    REQUIRE(s.events.size() >= 6);
    std::vector<std::string> names;
    std::string text;
    for (const NamedEvent& e : s.events) {
        CHECK(e.data["type"] == e.name);
        if (names.empty() || names.back() != e.name) names.push_back(e.name);
        if (e.name == "content_block_delta") {
            CHECK(e.data["index"] == 0);
            CHECK(e.data["delta"]["type"] == "text_delta");
            text += e.data["delta"]["text"].get<std::string>();
        }
    }
    CHECK(names == std::vector<std::string>{"message_start", "content_block_start", "content_block_delta", "content_block_stop",
                                            "message_delta", "message_stop"});
    CHECK(text == ref["choices"][0]["message"]["content"]);
    const json& start = s.events[0].data["message"];
    CHECK(start["role"] == "assistant");
    CHECK(start["content"] == json::array());
    // The same conversation again: its prompt is in a slot's cache, read rather than evaluated.
    CHECK(start["usage"]["input_tokens"].get<int>() + start["usage"]["cache_read_input_tokens"].get<int>() ==
          ref["usage"]["prompt_tokens"].get<int>());
    CHECK(start["usage"]["cache_read_input_tokens"].get<int>() > 0);
    CHECK(s.events[1].data["content_block"] == json{{"type", "text"}, {"text", ""}});
    const json& delta = s.events[s.events.size() - 2].data;
    CHECK(delta["delta"]["stop_reason"] == (ref["choices"][0]["finish_reason"] == "length" ? "max_tokens" : "end_turn"));
    CHECK(delta["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]);
}

TEST_CASE("server: /v1/responses answers as the chat endpoint does, whole and streamed") {
    const int port = dialect_server().port;
    json ref = chat_reference(port, kConversation, 12);
    const std::string text = ref["choices"][0]["message"]["content"];
    json request{{"instructions", "You are a helpful assistant."}, {"input", "Name three colors."},
                 {"max_output_tokens", 12}};

    Reply r = post(port, "/v1/responses", request);
    REQUIRE_MESSAGE(r.status == 200, r.raw);
    CHECK(r.body["id"].get<std::string>().rfind("resp_", 0) == 0);
    CHECK(r.body["object"] == "response");
    CHECK(r.body["status"] == "completed");
    REQUIRE(r.body["output"].size() == 1);
    const json& item = r.body["output"][0];
    CHECK(item["type"] == "message");
    CHECK(item["role"] == "assistant");
    CHECK(item["status"] == "completed");
    CHECK(item["id"].get<std::string>().rfind("msg_", 0) == 0);
    CHECK(item["content"] == json::array({{{"type", "output_text"}, {"annotations", json::array()}, {"logprobs", json::array()}, {"text", text}}}));
    CHECK(r.body["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]);
    CHECK(r.body["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]);
    CHECK(r.body["usage"]["total_tokens"] == ref["usage"]["total_tokens"]);

    // Input items instead of a string: the same conversation.
    json items = request;
    items["input"] = {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Name three colors."}}}}}};
    CHECK(post(port, "/v1/responses", items).body["output"][0]["content"][0]["text"] == text);
    // Earlier turns as items: a user message, the assistant's output message, then the question.
    json turns = json::array({{{"role", "system"}, {"content", "You are a helpful assistant."}},
                              {{"role", "user"}, {"content", "Hi!"}},
                              {{"role", "assistant"}, {"content", "Hello! How can I help?"}},
                              {{"role", "user"}, {"content", "Name three colors."}}});
    items["input"] = {{{"role", "user"}, {"content", "Hi!"}},
                      {{"type", "message"}, {"role", "assistant"}, {"content", {{{"type", "output_text"}, {"text", "Hello! How can I help?"}}}}},
                      {{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Name three colors."}}}}}};
    CHECK(post(port, "/v1/responses", items).body["output"][0]["content"][0]["text"] ==
          chat_reference(port, turns, 12)["choices"][0]["message"]["content"]);

    json streamed = request;
    streamed["stream"] = true;
    EventStream s = post_events(port, "/v1/responses", streamed);
    REQUIRE(s.status == 200);
    CHECK(s.raw.find("[DONE]") == std::string::npos);
    std::vector<std::string> names;
    std::string deltas;
    for (const NamedEvent& e : s.events) {
        CHECK(e.data["type"] == e.name);
        if (names.empty() || names.back() != e.name) names.push_back(e.name);
        if (e.name == "response.output_text.delta") deltas += e.data["delta"].get<std::string>();
    }
    CHECK(names == std::vector<std::string>{"response.created", "response.in_progress", "response.output_item.added",
                                            "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                                            "response.content_part.done", "response.output_item.done", "response.completed"});
    CHECK(deltas == text);
    REQUIRE(!s.events.empty());
    const json& done = s.events.back().data["response"];
    CHECK(done["status"] == "completed");
    CHECK(done["output"][0]["content"][0]["text"] == text);
    CHECK(done["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]);

    Reply prev = post(port, "/v1/responses", {{"input", "hi"}, {"previous_response_id", "resp_1"}});
    CHECK(prev.status == 400);
    CHECK(prev.body["error"]["message"] == "llama.cpp does not support 'previous_response_id'.");
    CHECK(post(port, "/v1/responses", {{"instructions", "x"}}).status == 400);
}

TEST_CASE("server: the anthropic and openai SDKs get the chat endpoint's answer from /v1/messages and /v1/responses") {
    const int port = dialect_server().port;
    json ref = chat_reference(port, kConversation, 12);
    const json& text = ref["choices"][0]["message"]["content"];
    const char* stop_reason = ref["choices"][0]["finish_reason"] == "length" ? "max_tokens" : "end_turn";
    std::string out;
    const std::string cmd = "timeout 120 python3 tests/sdk_dialects.py http://127.0.0.1:" + std::to_string(port) + " 2>&1";
    REQUIRE_MESSAGE(testutil::run(cmd, &out) == 0, out);
    json sdk = json::parse(out);
    CHECK(sdk["messages"]["text"] == text);
    CHECK(sdk["messages"]["stop_reason"] == stop_reason);
    CHECK(sdk["messages"]["output_tokens"] == ref["usage"]["completion_tokens"]);
    CHECK(sdk["messages_stream"]["text"] == text);
    CHECK(sdk["messages_stream"]["final_text"] == text);
    CHECK(sdk["messages_stream"]["stop_reason"] == stop_reason);
    CHECK(sdk["messages_stream"]["output_tokens"] == ref["usage"]["completion_tokens"]);
    CHECK(sdk["count_tokens"] == ref["usage"]["prompt_tokens"]);
    CHECK(sdk["responses"]["text"] == text);
    CHECK(sdk["responses"]["status"] == "completed");
    CHECK(sdk["responses"]["output_tokens"] == ref["usage"]["completion_tokens"]);
    CHECK(sdk["responses_stream"]["text"] == text);
    CHECK(sdk["responses_stream"]["final_text"] == text);
}

TEST_CASE("server: --no-webui turns the page off; with --api-key the page stays public") {
    ServerProcess off(server_cmd({"--no-webui"}));
    Reply r = get(off.port, "/");
    CHECK(r.status == 404);
    CHECK(r.body["error"]["type"] == "not_found_error");

    ServerProcess keyed(server_cmd({"--api-key", "sekrit"}));
    Reply page = get(keyed.port, "/");
    CHECK(page.status == 200);
    CHECK(page.raw == testutil::read_file("server/webui.html"));
    CHECK(get(keyed.port, "/props").status == 401);
}
