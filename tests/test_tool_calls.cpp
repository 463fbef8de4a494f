// Tool calls and reasoning parsed out of generated text: for each family's syntax, a model output
// in that syntax (complete, and streamed in fragments of every length) gives the expected content,
// reasoning_content and tool calls; the streamed deltas add up to exactly the complete parse.
#include <doctest/doctest.h>

#include "../llm.hpp"
#include "util.hpp"

namespace {

struct Call {
    const char* name;
    const char* arguments;
    const char* id;
};

struct OutputCase {
    const char* what;
    llm::ToolCallFormat format;
    bool thinking_open;
    const char* text;
    const char* content;
    const char* reasoning;
    std::vector<Call> calls;
};

using F = llm::ToolCallFormat;

const OutputCase kOutputs[] = {
    {"hermes: content then a call", F::Hermes, false,
     "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\"}}\n</tool_call>",
     "I'll check.\n", "", {{"get_weather", "{\"location\": \"Paris, France\"}", ""}}},
    {"hermes (qwen3): thinking, parallel calls", F::Hermes, false,
     "<think>\nTwo cities.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\", \"unit\": \"celsius\"}}\n</tool_call>",
     "", "Two cities.",
     {{"get_weather", "{\"location\": \"Paris\"}", ""}, {"get_weather", "{\"location\": \"Rome\", \"unit\": \"celsius\"}", ""}}},
    {"hermes: arguments as a JSON string, text between calls", F::Hermes, false,
     "A <tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call> B <tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
     "A B ", "", {{"f", "{\"x\": 1}", ""}, {"g", "{}", ""}}},
    {"hermes: no call, a literal tag mention", F::Hermes, false, "Use <tool_call> tags: <tool_call>oops",
     "Use <tool_call> tags: <tool_call>oops", "", {}},
    {"qwen3 (prompt opened <think>)", F::Hermes, true, "Thinking here.\n</think>\n\nThe answer is 4.", "The answer is 4.",
     "Thinking here.", {}},
    {"qwen3-coder: XML parameters", F::Qwen3Coder, false,
     "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, France\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
     "</function>\n</tool_call>",
     "Sure.\n", "", {{"get_weather", "{\"location\": \"Paris, France\", \"days\": 3}", ""}}},
    {"glm 4.6: thinking and arg_key/arg_value", F::Glm, false,
     "<think>Need the weather.</think>\n<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Paris</arg_value>\n"
     "<arg_key>detail</arg_key>\n<arg_value>{\"hourly\": true}</arg_value>\n</tool_call>",
     "", "Need the weather.", {{"get_weather", "{\"location\": \"Paris\", \"detail\": {\"hourly\": true}}", ""}}},
    {"llama 3.x: JSON call", F::Llama3, false, "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\", \"days\": 2}}", "", "",
     {{"get_weather", "{\"location\": \"Paris\", \"days\": 2}", ""}}},
    {"llama 3.x: text, then a JSON call", F::Llama3, false, "Let me look.\n{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
     "Let me look.\n", "", {{"get_weather", "{\"location\": \"Paris\"}", ""}}},
    {"llama 3.x: JSON that is not a call is content", F::Llama3, false, "{\"answer\": 42} is the JSON.", "{\"answer\": 42} is the JSON.", "", {}},
    {"llama 3.x: builtin tool through <|python_tag|>", F::Llama3, false, "<|python_tag|>brave_search.call(query=\"weather in Paris\", count=3)",
     "", "", {{"brave_search", "{\"query\": \"weather in Paris\", \"count\": 3}", ""}}},
    {"llama 3.x: code through <|python_tag|>", F::Llama3, false, "<|python_tag|>print(1 + 1)", "", "",
     {{"python", "{\"code\": \"print(1 + 1)\"}", ""}}},
    {"mistral nemo: JSON array with ids", F::Mistral, false,
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}, \"id\": \"abcDEF123\"}, "
     "{\"name\": \"get_time\", \"arguments\": {}, \"id\": \"xyz987ABC\"}]",
     "", "", {{"get_weather", "{\"location\": \"Paris\"}", "abcDEF123"}, {"get_time", "{}", "xyz987ABC"}}},
    {"mistral small 3.2 / devstral: name[ARGS]", F::Mistral, false,
     "Checking.[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}", "Checking.", "",
     {{"get_weather", "{\"location\": \"Paris\"}", ""}, {"get_time", "{\"tz\": \"CET\"}", ""}}},
    {"ministral reasoning: [THINK]", F::Mistral, false, "[THINK]Short.[/THINK]Hello!", "Hello!", "Short.", {}},
    {"deepseek r1: fenced JSON after the opened <think>", F::DeepSeek, true,
     "Let me call it.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
     "{\"location\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "", "Let me call it.", {{"get_weather", "{\"location\": \"Paris\"}", ""}}},
    {"deepseek v3.1: name<sep>arguments", F::DeepSeek, false,
     "On it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"Paris\"}<｜tool▁call▁end｜>"
     "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "On it.", "", {{"get_weather", "{\"location\": \"Paris\"}", ""}, {"get_time", "{}", ""}}},
    {"functionary v3.1: <function=name>", F::FunctionaryV31, false, "Sure. <function=get_weather>{\"location\": \"Paris\"}</function>", "Sure. ",
     "", {{"get_weather", "{\"location\": \"Paris\"}", ""}}},
    {"functionary v3.2: >>> blocks", F::FunctionaryV32, false,
     "all\nLet me check.>>>get_weather\n{\"location\": \"Paris\"}>>>get_time\n{}", "Let me check.", "",
     {{"get_weather", "{\"location\": \"Paris\"}", ""}, {"get_time", "{}", ""}}},
    {"functionary v3.2: plain answer", F::FunctionaryV32, false, "all\nHello there.", "Hello there.", "", {}},
    {"command r7b: thinking then an action", F::CommandR7B, false,
     "<|START_THINKING|>I should look it up.<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
     "\"parameters\": {\"location\": \"Paris\"}}\n]<|END_ACTION|>",
     "", "I should look it up.", {{"get_weather", "{\"location\": \"Paris\"}", "0"}}},
    {"command r7b: response", F::CommandR7B, false, "<|START_RESPONSE|>Hello!<|END_RESPONSE|>", "Hello!", "", {}},
    {"gpt-oss: analysis then a call", F::GptOss, false,
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
     "<|constrain|>json<|message|>{\"location\":\"Paris\"}<|call|>",
     "", "Need the weather.", {{"get_weather", "{\"location\":\"Paris\"}", ""}}},
    {"gpt-oss: analysis then final", F::GptOss, false,
     "<|channel|>analysis<|message|>Simple greeting.<|end|><|start|>assistant<|channel|>final<|message|>Hi there!<|return|>", "Hi there!",
     "Simple greeting.", {}},
    {"gpt-oss: the recipient in the role the prompt opened, as the template writes calls", F::GptOss, false,
     " to=functions.get_weather<|channel|>commentary json<|message|>{\"location\":\"Paris\"}<|call|>", "", "",
     {{"get_weather", "{\"location\":\"Paris\"}", ""}}},
    {"kimi k2: section of calls with ids", F::KimiK2, false,
     "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"location\": \"Paris\"}"
     "<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
     "Checking.", "", {{"get_weather", "{\"location\": \"Paris\"}", "functions.get_weather:0"}, {"get_time", "{}", "functions.get_time:1"}}},
    {"kimi k2 thinking", F::KimiK2, false, "<think>Hmm.</think>Done.", "Done.", "Hmm.", {}},
    {"no format: text as is", F::None, false, "<tool_call>{\"name\": \"x\"}</tool_call>", "<tool_call>{\"name\": \"x\"}</tool_call>", "", {}},
};

void check_parsed(const llm::ChatParsed& got, const OutputCase& c) {
    CHECK(got.content == std::string(c.content));
    CHECK(got.reasoning_content == std::string(c.reasoning));
    REQUIRE(got.tool_calls.size() == c.calls.size());
    for (size_t i = 0; i < c.calls.size(); i++) {
        CAPTURE(i);
        CHECK(got.tool_calls[i].name == std::string(c.calls[i].name));
        CHECK(got.tool_calls[i].arguments == std::string(c.calls[i].arguments));
        CHECK(got.tool_calls[i].id == std::string(c.calls[i].id));
    }
}

llm::ChatParseOptions options(const OutputCase& c) {
    llm::ChatParseOptions o;
    o.format = c.format;
    o.thinking_open = c.thinking_open;
    return o;
}

} // namespace

TEST_CASE("tool calls: each format's output parses into content, reasoning and calls") {
    for (const OutputCase& c : kOutputs) {
        const std::string what = c.what;
        CAPTURE(what);
        check_parsed(llm::chat_parse_output(c.text, options(c)), c);
    }
}

TEST_CASE("tool calls: streamed in fragments of every length, the deltas add up to the same result") {
    size_t streams = 0;
    for (const OutputCase& c : kOutputs) {
        const std::string what = c.what;
        CAPTURE(what);
        const std::string text = c.text;
        for (size_t len = 1; len <= text.size(); len++) {
            CAPTURE(len);
            llm::ChatOutputParser parser(options(c));
            llm::ChatParsed sum;  // rebuilt from the deltas alone, as a client does
            auto add = [&](const llm::ChatDelta& d) {
                sum.content += d.content;
                sum.reasoning_content += d.reasoning_content;
                for (auto& t : d.tool_calls) {
                    if (t.first) {
                        REQUIRE(t.index == sum.tool_calls.size());
                        sum.tool_calls.push_back({t.id, t.name, ""});
                    }
                    REQUIRE(t.index < sum.tool_calls.size());
                    sum.tool_calls[t.index].arguments += t.arguments;
                }
            };
            for (size_t off = 0; off < text.size(); off += len) add(parser.push(text.substr(off, len)));
            add(parser.finish());
            check_parsed(sum, c);
            streams++;
        }
    }
    MESSAGE("streams checked: " << streams);
}

TEST_CASE("tool calls: a stream reveals a call's name before its arguments end") {
    llm::ChatParseOptions o;
    o.format = F::Hermes;
    llm::ChatOutputParser p(o);
    CHECK(p.push("Hi <tool_").content == "Hi ");  // the tag prefix is held back
    const llm::ChatDelta d = p.push("call>{\"name\": \"f\", \"arguments\": {\"a\": ");
    REQUIRE(d.tool_calls.size() == 1);
    CHECK(d.tool_calls[0].first);
    CHECK(d.tool_calls[0].name == "f");
    CHECK(d.tool_calls[0].arguments == "{\"a\": ");
    const llm::ChatDelta d2 = p.push("1}}</tool_call>");
    REQUIRE(d2.tool_calls.size() == 1);
    CHECK_FALSE(d2.tool_calls[0].first);
    CHECK(d2.tool_calls[0].arguments == "1}");
    CHECK(p.finish().empty());
}

TEST_CASE("tool calls: XML parameters are typed by the declared schema (Qwen3-Coder, GLM)") {
    // zip and flag are declared strings: their text stays a string even where it reads as JSON; count
    // (an integer) and opts are parsed; a value that is not JSON stays a string whatever the schema.
    const std::string qwen = "<tool_call>\n<function=lookup>\n<parameter=zip>\n02139\n</parameter>\n<parameter=code>\n123\n</parameter>\n"
                             "<parameter=flag>\ntrue\n</parameter>\n<parameter=count>\n7\n</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n"
                             "<parameter=note>\nnot json\n</parameter>\n</function>\n</tool_call>";
    const std::string glm = "<tool_call>lookup\n<arg_key>code</arg_key>\n<arg_value>123</arg_value>\n<arg_key>flag</arg_key>\n"
                            "<arg_value>true</arg_value>\n<arg_key>count</arg_key>\n<arg_value>7</arg_value>\n</tool_call>";
    llm::ChatParseOptions o;
    o.string_parameters["lookup"] = {"zip", "code", "flag"};
    o.string_parameters["other"] = {"count"};
    o.format = F::Qwen3Coder;
    llm::ChatParsed p = llm::chat_parse_output(qwen, o);
    REQUIRE(p.tool_calls.size() == 1);
    CHECK(p.tool_calls[0].arguments == "{\"zip\": \"02139\", \"code\": \"123\", \"flag\": \"true\", \"count\": 7, \"opts\": {\"a\": [1]}, \"note\": \"not json\"}");
    o.format = F::Glm;
    p = llm::chat_parse_output(glm, o);
    REQUIRE(p.tool_calls.size() == 1);
    CHECK(p.tool_calls[0].arguments == "{\"code\": \"123\", \"flag\": \"true\", \"count\": 7}");
    // Without declarations (or for another tool's), values that parse as JSON are JSON.
    o.string_parameters.erase("lookup");
    p = llm::chat_parse_output(glm, o);
    REQUIRE(p.tool_calls.size() == 1);
    CHECK(p.tool_calls[0].arguments == "{\"code\": 123, \"flag\": true, \"count\": 7}");
}

TEST_CASE("tool calls: formats are detected from the corpus templates and named") {
    auto detect = [](const char* file) {
        return llm::chat_detect_tool_call_format(testutil::read_file(testutil::shared_dir() + "/chat/jinja/templates/" + file));
    };
    const std::pair<const char*, F> want[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", F::Hermes},
        {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", F::Hermes},
        {"Qwen3-Coder.jinja", F::Qwen3Coder},
        {"GLM-4.6.jinja", F::Glm},
        {"meta-llama-Llama-3.3-70B-Instruct.jinja", F::Llama3},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", F::Llama3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", F::Mistral},
        {"unsloth-mistral-Devstral-Small-2507.jinja", F::Mistral},
        {"deepseek-ai-DeepSeek-V3.1.jinja", F::DeepSeek},
        {"llama-cpp-deepseek-r1.jinja", F::DeepSeek},
        {"meetkai-functionary-medium-v3.1.jinja", F::FunctionaryV31},
        {"meetkai-functionary-medium-v3.2.jinja", F::FunctionaryV32},
        {"CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", F::CommandR7B},
        {"openai-gpt-oss-120b.jinja", F::GptOss},
        {"Kimi-K2-Instruct.jinja", F::KimiK2},
    };
    for (auto& w : want) {
        CAPTURE(w.first);
        CHECK(std::string(llm::tool_call_format_name(detect(w.first))) == llm::tool_call_format_name(w.second));
    }
    for (auto& w : want) CHECK(llm::tool_call_format_from_name(llm::tool_call_format_name(w.second)) == w.second);
    CHECK_THROWS_AS(llm::tool_call_format_from_name("nope"), llm::Error);
    CHECK(llm::chat_prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
    CHECK_FALSE(llm::chat_prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    CHECK(llm::chat_thinking_tags("{{ '<think>' }}...{{ '</think>' }}") == std::make_pair(std::string("<think>"), std::string("</think>")));
    CHECK(llm::chat_thinking_tags("{{ '<|START_THINKING|>' }}{{ '<|END_THINKING|>' }}").second == "<|END_THINKING|>");
    CHECK(llm::chat_thinking_tags("{{ messages }}").second.empty());
}
