// The built-in chat page (GET /), end to end: llm-server on loopback, the page loaded in a headless
// Chromium driven over the DevTools protocol (tests/chromium.hpp), a message typed and sent, the answer
// watched while it streams in, a second answer stopped half-way.
#include "chromium.hpp"
#include "server_util.hpp"

namespace {

using json = nlohmann::json;
using namespace testserver;

// A JavaScript promise that resolves with the value of `expr` once it is truthy, polling every 20 ms,
// and rejects after timeout_ms.
std::string wait_for(const std::string& expr, int timeout_ms = 20000) {
    return "new Promise((resolve, reject) => { const t0 = Date.now(); (function poll() {"
           " let v; try { v = (" + expr + "); } catch (e) {}"
           " if (v) return resolve(v);"
           " if (Date.now() - t0 > " + std::to_string(timeout_ms) + ") return reject(new Error('timed out waiting for: ' + " +
           json(expr).dump() + "));"
           " setTimeout(poll, 20); })(); })";
}

// The last assistant bubble's answer text (its first text node: the stats line is a child element).
const char* kLastAnswer =
    "(() => { const all = document.querySelectorAll('.msg.assistant'); const m = all[all.length - 1];"
    " return m && m.firstChild && m.firstChild.nodeType === 3 ? m.firstChild.textContent : ''; })()";

// Types `text` into the page with max tokens `max_tokens` and presses Send; resolves when the page is
// generating.
std::string send_message(const std::string& text, int max_tokens) {
    return "(async () => { document.getElementById('maxtokens').value = '" + std::to_string(max_tokens) + "';"
           " document.getElementById('input').value = " + json(text).dump() + ";"
           " document.getElementById('send').click();"
           " return await " + wait_for("document.body.dataset.state === 'generating'") + "; })()";
}

}  // namespace

TEST_CASE("web page: GET / serves the embedded page; headless Chromium shows model and context, streams, stops") {
    const std::string browser = testutil::Chromium::find_binary();
    REQUIRE_MESSAGE(!browser.empty(), "chromium is not installed: run scripts/setup");
    ServerProcess server(server_cmd({"-np", "2", "-c", "2048", "--temp", "0"}));
    const int port = server.port;
    const std::string base = "http://127.0.0.1:" + std::to_string(port) + "/";

    // The page is the repository's file, byte for byte, as HTML.
    Reply page = get(port, "/");
    REQUIRE(page.status == 200);
    CHECK(page.resp.header("content-type") == "text/html; charset=utf-8");
    CHECK(page.raw == testutil::read_file("server/webui.html"));

    testutil::Chromium c(browser);
    c.open_page();
    c.call("Network.enable");
    c.call("Runtime.enable");
    c.call("Page.navigate", {{"url", base}});

    // /props fills in the model's file name and a slot's context (2048 over 2 slots).
    c.eval(wait_for("document.body.dataset.state === 'idle'"));
    CHECK(c.eval("document.getElementById('model').textContent") == "SmolLM2-135M-Instruct-Q4_1.gguf");
    CHECK(c.eval("document.getElementById('ctx').textContent") == "1024 tokens per slot (2 slots)");

    SUBCASE("a message is answered token by token, as the API answers it") {
        // Record the answer's length at every change while the page is generating.
        c.eval("window.lengths = []; new MutationObserver(() => { if (document.body.dataset.state === 'generating')"
               " window.lengths.push(" + std::string(kLastAnswer) + ".length); })"
               ".observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true}); true");
        const std::string question = "What is the capital of France?";
        c.eval(send_message(question, 24));
        c.eval(wait_for("document.body.dataset.state === 'idle'", 60000), 70000);
        std::string answer = c.eval(kLastAnswer).get<std::string>();
        std::vector<int> lengths = c.eval("window.lengths").get<std::vector<int>>();
        std::vector<int> growing;
        for (int n : lengths) if (n > 0 && (growing.empty() || n > growing.back())) growing.push_back(n);
        INFO("lengths seen: " << json(lengths).dump());
        CHECK(growing.size() >= 3);  // not one block at the end
        // (the page's lengths count UTF-16 units, not the UTF-8 bytes of `answer`)
        CHECK(growing.back() == c.eval(std::string(kLastAnswer) + ".length").get<int>());

        // The same conversation through the API (greedy: --temp 0) gives the same text.
        Reply api = post(port, "/v1/chat/completions",
                         {{"messages", {{{"role", "user"}, {"content", question}}}}, {"max_tokens", 24}});
        REQUIRE(api.status == 200);
        CHECK(answer == api.body["choices"][0]["message"]["content"].get<std::string>());
        std::string stats = c.eval("document.querySelector('.msg.assistant .stats').textContent").get<std::string>();
        CHECK(stats.find(std::to_string(api.body["usage"]["completion_tokens"].get<int>()) + " tokens, ") == 0);
        CHECK(stats.find("tokens/s") != std::string::npos);
    }

    SUBCASE("Stop ends the answer where it is, and the server stops generating") {
        c.eval(send_message("Write a very long story about a dragon who learns to read.", -1));
        c.eval(wait_for(std::string(kLastAnswer) + ".length >= 40", 60000), 70000);
        int at_click = c.eval("document.getElementById('stop').click(); " + std::string(kLastAnswer) + ".length").get<int>();
        c.eval(wait_for("document.body.dataset.state === 'idle'"));
        c.eval("new Promise(r => setTimeout(r, 500))");
        CHECK(c.eval(std::string(kLastAnswer) + ".length").get<int>() == at_click);
        CHECK(c.eval("document.querySelector('.msg.assistant .stats').textContent") == "stopped");
        CHECK(c.eval("document.getElementById('send').disabled") == false);
        // The dropped connection cancels the request: no slot stays busy.
        bool idle = false;
        for (double t0 = now_s(); !idle && now_s() - t0 < 15; std::this_thread::sleep_for(std::chrono::milliseconds(50))) {
            Reply slots = get(port, "/slots");
            idle = slots.status == 200;
            for (const json& s : slots.body) idle = idle && !s["is_processing"].get<bool>();
        }
        CHECK(idle);
    }

    // Offline: everything the page loaded came from this server, and no script failed.
    for (const json& e : c.events()) {
        if (e.value("method", "") == "Network.requestWillBeSent") {
            std::string url = e["params"]["request"]["url"].get<std::string>();
            CHECK_MESSAGE(url.rfind(base, 0) == 0, "the page fetched " << url);
        }
        CHECK_MESSAGE(e.value("method", "") != "Runtime.exceptionThrown", e.dump());
    }
}
