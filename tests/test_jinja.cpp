// Jinja chat templates: every case of shared/chat/jinja/cases.json (40 real templates, rendered by
// Hugging Face's apply_chat_template) byte for byte and every error case an error; the older
// shared/chat cases through the interpreter too; Jinja2 semantics case by case (expected strings
// produced by Python's jinja2 3.1.6 with transformers' environment); hostile templates stopped by
// the limits in bounded time.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "../llm.hpp"
#include "util.hpp"

using ojson = nlohmann::ordered_json;  // member order matters: templates print tools as given

namespace {

using testutil::read_file;
using testutil::shared_dir;

constexpr int64_t kCorpusNow = 1795910400;  // 2026-11-29 00:00:00 UTC, the corpus' strftime_now

struct CorpusResult {
    int total = 0, passed = 0, errors = 0;
};

// Renders every case of a cases.json through chat_apply_template; `exact_errors` also compares the
// error text with the template's own message.
CorpusResult run_corpus(const std::string& dir, bool exact_errors) {
    const ojson data = ojson::parse(read_file(dir + "/cases.json"));
    std::map<std::string, ojson> conversations;
    for (auto& c : data.at("conversations")) conversations[c.at("name")] = c;
    std::map<std::string, std::unique_ptr<llm::JinjaTemplate>> templates;
    CorpusResult res;
    for (auto& c : data.at("cases")) {
        const std::string tpl = c.at("template"), conv = c.at("conversation");
        CAPTURE(tpl);
        CAPTURE(conv);
        CAPTURE(c.at("add_generation_prompt"));
        if (!templates.count(tpl)) templates[tpl] = std::make_unique<llm::JinjaTemplate>(read_file(dir + "/templates/" + tpl));
        const ojson& cv = conversations.at(conv);
        ojson req = {{"messages", cv.at("messages")}, {"add_generation_prompt", c.at("add_generation_prompt")},
                     {"bos_token", c.at("bos_token")}, {"eos_token", c.at("eos_token")}};
        if (cv.contains("tools")) req["tools"] = cv.at("tools");
        if (c.contains("kwargs")) req["chat_template_kwargs"] = c.at("kwargs");
        res.total++;
        std::string got, error;
        try {
            got = llm::chat_apply_template(*templates[tpl], req.dump(), kCorpusNow);
        } catch (const llm::Error& e) {
            error = e.what();
            if (error.empty()) error = "(empty message)";
        }
        if (c.contains("error")) {
            res.errors++;
            const bool ok = exact_errors ? error == c.at("error").get<std::string>() : !error.empty();
            CHECK_MESSAGE(ok, "expected an error like: " << c.at("error").get<std::string>() << "; got: " << error);
            res.passed += ok;
        } else {
            const bool ok = error.empty() && got == c.at("expected").get<std::string>();
            CHECK_MESSAGE(ok, "error: " << error);
            if (!ok && error.empty()) CHECK(got == c.at("expected").get<std::string>());
            res.passed += ok;
        }
    }
    return res;
}

std::string render(const std::string& tpl, const std::string& vars = "{}") {
    return llm::JinjaTemplate(tpl).render(vars, kCorpusNow);
}

struct SemanticsCase {
    const char* tpl;
    const char* vars;
    const char* expected;  // nullptr: Jinja2 raises
};

// Template, variables, and what jinja2 3.1.6 renders in transformers' environment (trim_blocks,
// lstrip_blocks, loopcontrols, its tojson, raise_exception, strftime_now at the corpus date).
const SemanticsCase kSemantics[] = {
#include "jinja_semantics.inc"
};

} // namespace

TEST_CASE("jinja: every shared/chat/jinja case renders byte for byte, every error case fails") {
    const CorpusResult r = run_corpus(shared_dir() + "/chat/jinja", false);
    MESSAGE("jinja corpus cases passed: " << r.passed << " / " << r.total << " (" << r.errors << " error cases)");
    CHECK(r.total == 650);
    CHECK(r.errors == 98);
    CHECK(r.passed == r.total);
}

TEST_CASE("jinja: the shared/chat cases through the interpreter, error messages as the templates raise them") {
    const CorpusResult r = run_corpus(shared_dir() + "/chat", true);
    CHECK(r.total == 60);
    CHECK(r.passed == r.total);
}

TEST_CASE("jinja: Jinja2 semantics, case by case") {
    int n = 0;
    for (const SemanticsCase& c : kSemantics) {
        CAPTURE(c.tpl);
        n++;
        if (c.expected) {
            std::string got;
            CHECK_NOTHROW(got = render(c.tpl, c.vars));
            CHECK(got == c.expected);
        } else {
            CHECK_THROWS_AS(render(c.tpl, c.vars), llm::Error);
        }
    }
    CHECK(n == 38);
}

TEST_CASE("jinja: error messages name the problem and the line") {
    CHECK_THROWS_WITH_AS(render("{{ raise_exception('Custom message here') }}"), "Custom message here", llm::Error);
    CHECK_THROWS_WITH_AS(render("a\n{{ messages.append(1) }}", R"({"messages": []})"),
                         "template line 2: access to attribute 'append' of 'list' object is unsafe.", llm::Error);
    CHECK_THROWS_WITH_AS(render("{{ x | from_json }}"), "template line 1: No filter named 'from_json' found.", llm::Error);
    CHECK_THROWS_WITH_AS(render("\n\n{{ 'a' + [1] }}"), "template line 3: TypeError: can only concatenate str (not \"list\") to str",
                         llm::Error);
    CHECK_THROWS_WITH_AS(render("{{ d.content.strip() }}", R"({"d": {}})"),
                         "template line 1: 'dict object' has no attribute 'content'", llm::Error);
    CHECK_THROWS_WITH_AS(llm::JinjaTemplate("x\n{% if x %}unclosed"), "template line 2: missing {% endif %}", llm::Error);
    CHECK_THROWS_WITH_AS(llm::JinjaTemplate("{% break %}"), "template line 1: 'break' outside a loop", llm::Error);
    CHECK_THROWS_WITH_AS(render("{{ namespace(_x=1) }}"),
                         "template line 1: SecurityError: namespace attribute names must not start with '_'", llm::Error);
    CHECK_THROWS_AS(render("{{ x }}", "[1]"), llm::Error);          // variables must be an object
    CHECK_THROWS_AS(render("{{ x }}", "{\"x\": tru}"), llm::Error);  // and valid JSON
}

TEST_CASE("jinja: apply_chat_template preprocessing and variables") {
    const llm::JinjaTemplate t(
        "{% for m in messages %}{{ m | tojson }};{% endfor %}{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|"
        "{{ bos_token }}{{ eos_token }}|{{ enable_thinking }}");
    const std::string req = R"({"messages": [{"role": "user", "content": "hi", "name": null},
        {"role": "assistant", "content": null, "reasoning_content": "think", "tool_calls": [{"id": "1"}]},
        {"role": "assistant", "content": "x", "reasoning": "r"}],
        "bos_token": "<s>", "chat_template_kwargs": {"enable_thinking": false}})";
    CHECK(llm::chat_apply_template(t, req) ==
          R"({"role": "user", "content": "hi"};{"thinking": "think", "role": "assistant", "reasoning_content": "think", "tool_calls": [{"id": "1"}]};)"
          R"({"thinking": "r", "role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"};None|None|False|<s>|False)");
    CHECK_THROWS_AS(llm::chat_apply_template(t, R"({"messages": "x"})"), llm::Error);
    CHECK_THROWS_AS(llm::chat_apply_template(t, R"({"messages": [], "chat_template_kwargs": 1})"), llm::Error);
}

TEST_CASE("jinja: hostile templates fail with a clear error in bounded time") {
    using clock = std::chrono::steady_clock;
    struct Hostile {
        const char* what;
        std::string tpl;
        const char* message;  // part of the error
    };
    const Hostile cases[] = {
        {"endless nested loops", "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", "steps (endless loop?)"},
        {"unbounded recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested more than 100 deep"},
        {"huge output", "{% for i in range(1000000) %}{{ 'x' * 1000 }}{% endfor %}", "output longer than"},
        {"huge string", "{{ 'x' * 1000000000000 }}", "string longer than"},
        {"doubling string", "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "string longer than"},
        {"huge range", "{{ range(10000000000) | length }}", "range() of more than"},
        {"deep nesting", "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}", "nested more than"},
        {"many big strings", "{% for i in range(1000) %}{% for j in range(1000) %}{% set s = 'y' * 1000000 %}{% endfor %}{% endfor %}", "bytes of text"},
    };
    for (const Hostile& h : cases) {
        const std::string what = h.what;
        CAPTURE(what);
        const auto t0 = clock::now();
        std::string error;
        try {
            render(h.tpl);
        } catch (const llm::Error& e) {
            error = e.what();
        }
        const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
        CHECK(error.find(h.message) != std::string::npos);
        CHECK(seconds < 10);
        MESSAGE(what << ": " << error << " (" << seconds << " s)");
    }
    // too deep to parse: expressions, blocks, and JSON input
    CHECK_THROWS_WITH_AS(llm::JinjaTemplate("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"),
                         "template line 1: nested too deeply", llm::Error);
    std::string ifs;
    for (int i = 0; i < 5000; i++) ifs += "{% if true %}";
    CHECK_THROWS_WITH_AS(llm::JinjaTemplate{ifs}, "template line 1: nested too deeply", llm::Error);
    CHECK_THROWS_AS(render("{{ x }}", "{\"x\": " + std::string(5000, '[') + std::string(5000, ']') + "}"), llm::Error);
    // a smaller limit applies
    llm::JinjaLimits small;
    small.max_output = 10;
    CHECK_THROWS_AS(llm::JinjaTemplate("{{ 'x' * 11 }}").render("{}", 0, small), llm::Error);
    CHECK(llm::JinjaTemplate("{{ 'x' * 10 }}").render("{}", 0, small) == "xxxxxxxxxx");
}

TEST_CASE("jinja: llm-server --render-chat prints each corpus template's prompt byte for byte; errors are one line, status 1") {
    const std::string dir = shared_dir() + "/chat/jinja";
    const ojson data = ojson::parse(read_file(dir + "/cases.json"));
    std::map<std::string, ojson> conversations;
    for (auto& c : data.at("conversations")) conversations[c.at("name")] = c;
    char tmpl[] = "/tmp/llm-render-XXXXXX";
    REQUIRE(mkdtemp(tmpl));
    const std::string req_file = std::string(tmpl) + "/request.json", err_file = std::string(tmpl) + "/stderr";
    std::set<std::string> rendered, failed;  // a successful and a failing case of each template
    for (auto& c : data.at("cases")) {
        const std::string tpl = c.at("template");
        const bool is_error = c.contains("error");
        if ((is_error ? failed : rendered).count(tpl)) continue;
        const std::string source = read_file(dir + "/templates/" + tpl);
        if (source.find("strftime_now") != std::string::npos) continue;  // prints today's date
        CAPTURE(tpl);
        const ojson& cv = conversations.at(c.at("conversation"));
        ojson req = {{"messages", cv.at("messages")}, {"add_generation_prompt", c.at("add_generation_prompt")},
                     {"bos_token", c.at("bos_token")}, {"eos_token", c.at("eos_token")}, {"chat_template_kwargs", c.at("kwargs")}};
        if (cv.contains("tools")) req["tools"] = cv.at("tools");
        std::ofstream(req_file, std::ios::binary) << req.dump();
        std::string out;
        const int rc = testutil::run("./llm-server --chat-template-file '" + dir + "/templates/" + tpl + "' --render-chat " + req_file + " 2>" + err_file, &out);
        const std::string err = read_file(err_file);
        if (is_error) {
            CHECK(rc == 1);
            CHECK(out.empty());
            CHECK(err.rfind("error: ", 0) == 0);
            CHECK(std::count(err.begin(), err.end(), '\n') == 1);
            failed.insert(tpl);
        } else {
            CHECK(rc == 0);
            CHECK(err.empty());
            CHECK(out == c.at("expected").get<std::string>());
            rendered.insert(tpl);
        }
    }
    MESSAGE("--render-chat: " << rendered.size() << " templates rendered, " << failed.size() << " failing as they should");
    CHECK(rendered.size() == 33);  // the 34 templates that do not print today's date, one with only error cases here
    CHECK(failed.size() == 27);
    std::remove(req_file.c_str());
    std::remove(err_file.c_str());
    rmdir(tmpl);
}
