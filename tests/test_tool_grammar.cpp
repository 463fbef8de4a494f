// Tool calls' grammars (server/tools.cpp) against each format's syntax: a recorded call, fed token by
// token to a sampler with the format's grammar, is accepted whole (lazy: free text until the trigger
// word, which the prompt may begin; forced: from the first token), the grammar is active after it (a
// stray token is refused), arguments off the schema are refused, and the format's parser reads the
// same text back as the call.
#include <doctest/doctest.h>

#include "../llm.hpp"
#include "../server/tools.hpp"
#include "../server/util.hpp"

namespace {

using F = llm::ToolCallFormat;
using ojson = nlohmann::ordered_json;

const llm::Vocab& vocab() {
    static auto gguf = llm::GGUF::open("models/SmolLM2-135M-Instruct-Q4_1.gguf");
    static llm::Vocab v(*gguf);
    return v;
}

struct FormatCall {
    F format;
    const char* prompt_end;  // what the generation prompt ends with, where the format's call may continue it
    const char* lazy;        // free text, then the call (a tool_choice "auto" answer)
    const char* forced;      // the call alone, from the first token (tool_choice "required")
};

// get_weather({"location": "Paris"}) in each format, as its models write it.
const FormatCall kCalls[] = {
    {F::Hermes, "", "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>"},
    {F::Llama3, "", "Let me check.\n{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}",
     "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}"},
    {F::Mistral, "", "Checking.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}, \"id\": \"abc123XYZ\"}]",
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}]"},
    {F::DeepSeek, "",
     "On it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"location\": \"Paris\"}\n```<｜tool▁call▁end｜>"
     "<｜tool▁calls▁end｜>"},
    {F::FunctionaryV31, "", "Sure. <function=get_weather>{\"location\": \"Paris\"}</function>",
     "<function=get_weather>{\"location\": \"Paris\"}</function>"},
    {F::FunctionaryV32, ">>>", "all\nLet me check.>>>get_weather\n{\"location\": \"Paris\"}", "get_weather\n{\"location\": \"Paris\"}"},
    {F::CommandR7B, "",
     "<|START_THINKING|>I should look it up.<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
     "\"parameters\": {\"location\": \"Paris\"}}\n]<|END_ACTION|>",
     "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\"}}]<|END_ACTION|>"},
    {F::GptOss, "<|start|>assistant",
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
     "<|constrain|>json<|message|>{\"location\": \"Paris\"}",
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary "
     "json<|message|>{\"location\": \"Paris\"}"},
    {F::KimiK2, "",
     "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"location\": \"Paris\"}"
     "<|tool_call_end|><|tool_calls_section_end|>",
     "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"location\": \"Paris\"}"
     "<|tool_call_end|><|tool_calls_section_end|>"},
    {F::Glm, "", "<think>Need the weather.</think>\n<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
     "<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"},
    {F::Qwen3Coder, "", "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>"},
};

const ojson kTools = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city",
     "parameters": {"type": "object", "properties": {"location": {"type": "string", "maxLength": 16}}, "required": ["location"]}}}
])");

// A sampler with the format's grammar for tool_choice mode, the prompt's end accepted as prompt.
llm::Sampler sampler_for(const FormatCall& c, srv::ToolChoice::Mode mode) {
    srv::ToolChoice choice;
    choice.mode = mode;
    const srv::ToolGrammar g = srv::tool_call_grammar(c.format, kTools, choice);
    REQUIRE(!g.gbnf.empty());
    CHECK(g.lazy == (mode == srv::ToolChoice::Auto));
    llm::SamplerParams p;
    p.grammar = g.gbnf;
    p.grammar_lazy = g.lazy;
    p.grammar_triggers = g.triggers;
    llm::Sampler s(p, &vocab());
    for (int32_t t : vocab().tokenize(c.prompt_end, false, false)) s.accept(t, false);
    return s;
}

// Accepts text token by token; false at the first token the grammar refuses.
bool accept_text(llm::Sampler& s, const std::string& text) {
    for (int32_t t : vocab().tokenize(text, false, false)) {
        try {
            s.accept(t);
        } catch (const llm::Error&) {
            return false;
        }
    }
    return true;
}

}  // namespace

TEST_CASE("tool grammar: each format's lazy and forced grammar accepts its recorded call and nothing else after it") {
    for (const FormatCall& c : kCalls) {
        const std::string name = llm::tool_call_format_name(c.format);
        CAPTURE(name);
        for (const srv::ToolChoice::Mode mode : {srv::ToolChoice::Auto, srv::ToolChoice::Required}) {
            const std::string text = mode == srv::ToolChoice::Auto ? c.lazy : c.forced;
            CAPTURE(text);
            llm::Sampler s = sampler_for(c, mode);
            CHECK(accept_text(s, text));
            CHECK(s.grammar_accepts_eog());  // the call is complete
            CHECK_FALSE(accept_text(s, " hello"));  // and the grammar is on: no text after it
            // Arguments off the schema (a number for the string) are refused, lazily too.
            std::string wrong = text;
            wrong.replace(wrong.find("Paris"), 5, "12345");
            const bool xml = c.format == F::Glm || c.format == F::Qwen3Coder;  // their string values are free text
            if (!xml) {
                wrong.replace(wrong.find("\"12345\""), 7, "12345");
                llm::Sampler w = sampler_for(c, mode);
                CHECK_FALSE(accept_text(w, wrong));
            }
            // The format's parser reads the same text as the call.
            llm::ChatParseOptions o;
            o.format = c.format;
            o.string_parameters = srv::string_parameters(kTools);
            const llm::ChatParsed parsed = llm::chat_parse_output(text, o);
            REQUIRE(parsed.tool_calls.size() == 1);
            CHECK(parsed.tool_calls[0].name == "get_weather");
            CHECK(ojson::parse(parsed.tool_calls[0].arguments) == ojson{{"location", "Paris"}});
        }
    }
}

TEST_CASE("tool grammar: a lazy grammar leaves text free before its trigger; a named function allows only that function") {
    for (const FormatCall& c : kCalls) {
        const std::string name = llm::tool_call_format_name(c.format);
        CAPTURE(name);
        llm::Sampler s = sampler_for(c, srv::ToolChoice::Auto);
        CHECK(accept_text(s, "Paris is in France: no call needed."));
        CHECK(s.grammar_accepts_eog());
        // A named function: get_time's call is refused where get_weather's is accepted.
        srv::ToolChoice choice;
        choice.mode = srv::ToolChoice::Function;
        choice.function = "get_time";
        const srv::ToolGrammar g = srv::tool_call_grammar(c.format, kTools, choice);
        llm::SamplerParams p;
        p.grammar = g.gbnf;
        llm::Sampler named(p, &vocab());
        for (int32_t t : vocab().tokenize(c.prompt_end, false, false)) named.accept(t, false);
        CHECK_FALSE(accept_text(named, c.forced));
    }
    srv::ToolChoice missing;
    missing.mode = srv::ToolChoice::Function;
    missing.function = "nope";
    CHECK_THROWS_AS(srv::tool_call_grammar(F::GptOss, kTools, missing), srv::ApiError);
}
