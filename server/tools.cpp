// Tool calls' grammars and parameter typing (see tools.hpp).
#include "tools.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>

#include "util.hpp"

namespace srv {

namespace {

using ojson = nlohmann::ordered_json;

// A GBNF string literal of text.
std::string literal(const std::string& text) {
    std::string out = "\"";
    for (unsigned char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char)c;
        } else if (c < 0x20 || c == 0x7F) {
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02X", c);
            out += hex;
        } else {
            out += (char)c;
        }
    }
    return out + "\"";
}

// A character class of every character but these (ASCII).
std::string class_excluding(std::initializer_list<char> chars) {
    std::string out = "[^";
    for (char c : chars) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02X", (unsigned char)c);
        out += hex;
    }
    return out + "]";
}

// Text that does not contain `end` (ASCII), exactly: cut at each occurrence of end's first character
// c, the pieces after one must not begin with the rest of `end`. That needs c to occur in `end` once,
// so a longer `end` is cut before its second c (not containing that prefix implies not containing it).
std::string text_excluding(std::string end) {
    const char first = end[0];
    end = end.substr(0, end.find(first, 1));
    const std::string rest = end.substr(1), free = class_excluding({first}) + "*";
    std::string after_first;  // what follows each c: a proper prefix of rest, then (another character and) free text
    for (size_t j = 0; j < rest.size(); j++)
        after_first += (j ? " | " + literal(rest.substr(0, j)) + " " : "") + "(" + class_excluding({first, rest[j]}) + " " + free + ")?";
    if (rest.empty()) return free;
    return "(" + free + " (" + literal(std::string(1, first)) + " (" + after_first + "))*)";
}

// A JSON schema's grammar with its rules prefixed (the expression is prefix + "root"), appended to
// rules; a schema the converter refuses falls back to `fallback` (an object, or any value).
std::string schema_rule(const ojson& schema, const std::string& prefix, const char* fallback, std::string& rules) {
    std::string gbnf;
    try {
        gbnf = llm::json_schema_to_grammar(schema.dump());
    } catch (const llm::Error& e) {
        log_msg('W', "a tool's schema is not enforced: %s", e.what());
        gbnf = llm::json_schema_to_grammar(fallback);
    }
    rules += prefix_rules(gbnf, prefix);
    return prefix + "root";
}

const ojson& function_of(const ojson& tool) {
    static const ojson empty = ojson::object();
    auto f = tool.find("function");
    return f != tool.end() && f->is_object() ? *f : empty;
}

std::string name_of(const ojson& function) {
    auto n = function.find("name");
    return n != function.end() && n->is_string() ? n->get<std::string>() : "";
}

// A tool's parameters schema ({"type": "object"} when it declares none).
ojson parameters_of(const ojson& function) {
    auto p = function.find("parameters");
    return p != function.end() && p->is_object() ? *p : ojson{{"type", "object"}};
}

// Whether a parameter's schema admits only strings (its value is then the text as written).
bool is_string_schema(const ojson& s) {
    if (!s.is_object()) return false;
    auto all_strings = [](const ojson& a) {
        if (!a.is_array() || a.empty()) return false;
        for (const ojson& x : a) if (!x.is_string()) return false;
        return true;
    };
    if (s.contains("const")) return s["const"].is_string();
    if (s.contains("enum")) return all_strings(s["enum"]);
    auto t = s.find("type");
    return t != s.end() && t->is_string() && *t == "string";
}

// A string parameter's enum or const as the alternatives of their text.
std::string string_choices(const ojson& schema) {
    const ojson values = schema.contains("const") ? ojson::array({schema["const"]}) : schema["enum"];
    std::string out = "(";
    for (const ojson& v : values) out += (out.size() > 1 ? " | " : "") + literal(v.get<std::string>());
    return out + ")";
}

using Members = std::vector<std::pair<std::string, ojson>>;

// The JSON object of a call in the JSON formats: {leading..., name_key: NAME, args_key: parameters,
// trailing...} in that order, all but the trailing members required; the parameters' $defs move to
// the top so that their $refs still resolve.
ojson call_object_schema(const std::string& name_key, const std::string& name, const std::string& args_key, ojson params,
                         const Members& leading, const Members& trailing) {
    ojson s{{"type", "object"}, {"properties", ojson::object()}, {"required", ojson::array()}};
    for (const char* defs : {"$defs", "definitions"}) {
        if (params.contains(defs)) {
            s[defs] = params[defs];
            params.erase(defs);
        }
    }
    for (const auto& [key, schema] : leading) {
        s["properties"][key] = schema;
        s["required"].push_back(key);
    }
    s["properties"][name_key] = ojson{{"const", name}};
    s["properties"][args_key] = std::move(params);
    s["required"].push_back(name_key);
    s["required"].push_back(args_key);
    for (const auto& [key, schema] : trailing) s["properties"][key] = schema;
    return s;
}

// The XML formats' parameters: each declared one in order, once (optional ones may be left out), its
// value the text for string parameters, else JSON of its schema.
std::string xml_parameters(const ojson& params, const std::string& prefix, const std::string& open_key, const std::string& close_key,
                           const std::string& value_end, std::string& rules) {
    std::vector<std::string> required;
    if (params.contains("required") && params["required"].is_array())
        for (const ojson& r : params["required"]) if (r.is_string()) required.push_back(r.get<std::string>());
    std::string out;
    if (!params.contains("properties") || !params["properties"].is_object()) return out;
    size_t i = 0;
    for (const auto& [key, schema] : params["properties"].items()) {
        const std::string value = !is_string_schema(schema) ? schema_rule(schema, prefix + "p" + std::to_string(i) + "-", "{}", rules)
                                  : schema.contains("enum") || schema.contains("const") ? string_choices(schema)
                                                                                         : text_excluding(value_end);
        const bool must = std::find(required.begin(), required.end(), key) != required.end();
        out += " (" + literal(open_key + key + close_key) + " " + value + " " + literal(value_end) + ")" + (must ? "" : "?");
        i++;
    }
    return out;
}

// One format's syntax: the words that open its calls, the text around all calls and between two, and
// the expression of one call of a function (its rules appended).
struct CallSyntax {
    std::vector<std::string> triggers;
    std::string open, close, separator;  // GBNF expressions; "" for none
    bool one_call = false;               // the call's end is an end-of-generation token (GPT-OSS's <|call|>)
    std::function<std::string(const std::string& name)> named_trigger;  // a call of `name` opens with this word too
    std::function<std::string(const ojson& function, const std::string& prefix, std::string& rules)> call;
};

// The call's JSON object (formats whose call is one object) as a rule.
std::string json_call(const ojson& function, const std::string& prefix, std::string& rules, const std::string& name_key,
                      const std::string& args_key, const Members& leading = {}, const Members& trailing = {}) {
    const std::string name = name_of(function);
    const ojson schema = call_object_schema(name_key, name, args_key, parameters_of(function), leading, trailing);
    const ojson fallback = call_object_schema(name_key, name, args_key, ojson{{"type", "object"}}, leading, trailing);
    return schema_rule(schema, prefix, fallback.dump().c_str(), rules);
}

std::string arguments_rule(const ojson& function, const std::string& prefix, std::string& rules) {
    return schema_rule(parameters_of(function), prefix, "{\"type\": \"object\"}", rules);
}

// GPT-OSS harmony's call: the recipient in the role ("<|start|>assistant to=functions.NAME<|channel|>
// commentary json<|message|>", as the template writes calls; the prompt writes "<|start|>assistant")
// or in the channel ("<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>"), as
// llama.cpp's grammar admits them, the arguments JSON of the tool's schema.
std::string harmony_call(const ojson& f, const std::string& p, std::string& rules) {
    const std::string channel = "\"<|channel|>\" (\"commentary\" | \"analysis\")", recipient = literal(" to=functions." + name_of(f));
    return "\"<|start|>assistant\"? (" + recipient + " " + channel + " | " + channel + " " + recipient +
           ") \" \"? (\"<|constrain|>\"? \"json\")? \"<|message|>\" " + arguments_rule(f, p, rules);
}

// The XML formats' call: the name, then each parameter's key and value (Qwen3-Coder, GLM).
struct XmlCallSyntax {
    const char *open, *name_end, *key_open, *key_close, *value_end, *close;
};
const XmlCallSyntax kQwen3CoderXml{"<tool_call>\n<function=", ">\n", "<parameter=", ">\n", "\n</parameter>\n", "</function>\n</tool_call>"};
const XmlCallSyntax kGlmXml{"<tool_call>", "\n", "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n", "</tool_call>"};

// The syntax each format's parser reads (see llm::ToolCallFormat) for a lazy grammar, which starts at
// a trigger word, or a forced one, which starts at the first generated token; false for formats
// without a grammar.
bool call_syntax(llm::ToolCallFormat format, bool forced, CallSyntax& out) {
    using F = llm::ToolCallFormat;
    const std::string ws = "[ \\t\\n]{0,24}";  // as the template may indent
    switch (format) {
        case F::Hermes:
            out.triggers = {"<tool_call>"};
            out.separator = ws;
            out.call = [](const ojson& f, const std::string& p, std::string& rules) {
                return "\"<tool_call>\" \"\\n\"? " + json_call(f, p, rules, "name", "arguments") + " \"</tool_call>\"";
            };
            return true;
        case F::Llama3:
            out.triggers = {"{\"name\""};
            out.separator = ws;
            out.call = [](const ojson& f, const std::string& p, std::string& rules) { return json_call(f, p, rules, "name", "parameters"); };
            return true;
        case F::Mistral:
            out.triggers = {"[TOOL_CALLS]"};
            out.open = "\"[TOOL_CALLS]\" \"[\" " + ws;
            out.close = "\"]\"";
            out.separator = "\",\" " + ws;
            out.call = [](const ojson& f, const std::string& p, std::string& rules) {
                return json_call(f, p, rules, "name", "arguments", {}, {{"id", ojson{{"type", "string"}, {"maxLength", 16}}}});
            };
            return true;
        case F::CommandR7B:
            out.triggers = {"<|START_ACTION|>"};
            out.open = "\"<|START_ACTION|>\" \"[\" " + ws;
            out.close = "\"]\" \"<|END_ACTION|>\"";
            out.separator = "\",\" " + ws;
            out.call = [](const ojson& f, const std::string& p, std::string& rules) {
                return json_call(f, p, rules, "tool_name", "parameters", {{"tool_call_id", ojson{{"type", "string"}, {"maxLength", 8}}}});
            };
            return true;
        case F::FunctionaryV31:
            out.triggers = {"<function="};
            out.call = [](const ojson& f, const std::string& p, std::string& rules) {
                return literal("<function=" + name_of(f) + ">") + " " + arguments_rule(f, p, rules) + " \"</function>\"";
            };
            return true;
        case F::KimiK2:
            out.triggers = {"<|tool_calls_section_begin|>"};
            out.open = "\"<|tool_calls_section_begin|>\"";
            out.close = "\"<|tool_calls_section_end|>\"";
            out.call = [](const ojson& f, const std::string& p, std::string& rules) {
                return literal("<|tool_call_begin|>functions." + name_of(f) + ":") + " [0-9]{1,4} \"<|tool_call_argument_begin|>\" " +
                       arguments_rule(f, p, rules) + " \"<|tool_call_end|>\"";
            };
            return true;
        case F::DeepSeek:  // R1's "function<sep>name\n```json\n{...}\n```" or V3.1's "name<sep>{...}"
            out.triggers = {"<｜tool▁calls▁begin｜>"};
            out.open = literal("<｜tool▁calls▁begin｜>");
            out.close = literal("<｜tool▁calls▁end｜>");
            out.separator = "\"\\n\"?";
            out.call = [](const ojson& f, const std::string& p, std::string& rules) {
                const std::string args = arguments_rule(f, p, rules), name = name_of(f);
                return literal("<｜tool▁call▁begin｜>") + " (" + literal("function<｜tool▁sep｜>" + name + "\n```json\n") + " " + args +
                       " \"\\n\"? \"```\" | " + literal(name + "<｜tool▁sep｜>") + " " + args + ") " + literal("<｜tool▁call▁end｜>");
            };
            return true;
        case F::Qwen3Coder:
        case F::Glm: {
            const XmlCallSyntax& xml = format == F::Glm ? kGlmXml : kQwen3CoderXml;
            out.triggers = {"<tool_call>"};
            out.separator = ws;
            out.call = [&xml](const ojson& f, const std::string& p, std::string& rules) {
                return literal(xml.open + name_of(f) + xml.name_end) +
                       xml_parameters(parameters_of(f), p, xml.key_open, xml.key_close, xml.value_end, rules) + " " + literal(xml.close);
            };
            return true;
        }
        case F::FunctionaryV32:  // the prompt opens the first ">>>": a lazy grammar starts at the word that it or the model began
            out.open = forced ? "" : "\">>>\"";
            out.separator = ws + " \">>>\"";
            out.named_trigger = [](const std::string& name) { return ">>>" + name + "\n"; };
            out.call = [](const ojson& f, const std::string& p, std::string& rules) {
                return literal(name_of(f) + "\n") + " " + arguments_rule(f, p, rules);
            };
            return true;
        case F::GptOss:  // a forced call may follow an analysis message (thinking); the lazy one starts at its recipient
            out.triggers = {"<|start|>assistant to=", "<|channel|>commentary to=", "<|channel|>analysis to="};
            if (forced) out.open = "(\"<|channel|>analysis<|message|>\" " + text_excluding("<|end|>") + " \"<|end|><|start|>assistant\")?";
            out.one_call = true;
            out.call = harmony_call;
            return true;
        case F::None:
            return false;
    }
    return false;
}

}  // namespace

std::string prefix_rules(const std::string& gbnf, const std::string& prefix) {
    std::string out;
    for (size_t i = 0; i < gbnf.size();) {
        const char c = gbnf[i];
        size_t j = i + 1;
        if (c == '"' || c == '[') {  // a literal or a character class, escapes included
            const char close = c == '"' ? '"' : ']';
            while (j < gbnf.size() && gbnf[j] != close) j += gbnf[j] == '\\' ? 2 : 1;
            j = std::min(j + 1, gbnf.size());
        } else if (c == '{' || c == '#') {  // repetition counts; a comment
            j = gbnf.find(c == '{' ? '}' : '\n', i);
            j = j == std::string::npos ? gbnf.size() : j + 1;
        } else if (std::isalnum((unsigned char)c) || c == '-' || c == '_') {
            while (j < gbnf.size() && (std::isalnum((unsigned char)gbnf[j]) || gbnf[j] == '-' || gbnf[j] == '_')) j++;
            out += prefix;
        }
        out.append(gbnf, i, j - i);
        i = j;
    }
    return out;
}

std::map<std::string, std::vector<std::string>> string_parameters(const ojson& tools) {
    std::map<std::string, std::vector<std::string>> out;
    if (!tools.is_array()) return out;
    for (const ojson& tool : tools) {
        const ojson params = parameters_of(function_of(tool));
        if (!params.contains("properties") || !params["properties"].is_object()) continue;
        for (const auto& [key, schema] : params["properties"].items())
            if (is_string_schema(schema)) out[name_of(function_of(tool))].push_back(key);
    }
    return out;
}

// A forced call comes after the rest of a thinking block the prompt opened (as llama-server's, it
// starts at once otherwise; a lazy grammar leaves the thinking free anyway).
std::string thinking_prefix(const ThinkingSyntax& t) {
    if (t.close.empty() || !t.opened) return "";
    return text_excluding(t.close) + " " + literal(t.close) + " [ \\n]{0,4} ";
}

ToolGrammar tool_call_grammar(llm::ToolCallFormat format, const ojson& tools, const ToolChoice& choice, const ThinkingSyntax& thinking) {
    ToolGrammar g;
    g.lazy = choice.mode == ToolChoice::Auto;
    CallSyntax syntax;
    if (!tools.is_array() || !call_syntax(format, !g.lazy, syntax)) return g;
    std::string rules, calls;
    size_t n = 0;
    for (const ojson& tool : tools) {
        const ojson& f = function_of(tool);
        if (name_of(f).empty() || (choice.mode == ToolChoice::Function && name_of(f) != choice.function)) continue;
        calls += (n ? " | " : "") + syntax.call(f, "t" + std::to_string(n) + "-", rules);
        if (syntax.named_trigger) syntax.triggers.push_back(syntax.named_trigger(name_of(f)));
        n++;
    }
    if (n == 0) {
        if (choice.mode == ToolChoice::Function) throw ApiError(400, "tool_choice names '" + choice.function + "', which is not among the tools");
        return g;
    }
    const std::string more = choice.parallel && !syntax.one_call ? " (" + syntax.separator + " tool-call)*" : "";
    // trailing spaces end the calls too (the model may write a newline before its end token)
    g.gbnf = "root ::= " + (g.lazy ? "" : thinking_prefix(thinking)) + syntax.open + " tool-call" + more + " " + syntax.close + " [ \\n]{0,4}\ntool-call ::= " + calls + "\n" + rules;
    g.triggers = syntax.triggers;
    return g;
}

}  // namespace srv
