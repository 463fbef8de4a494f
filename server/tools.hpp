// Tool calls' constraints, as llama-server builds them: a grammar that keeps a model's tool calls in
// its template's syntax, with arguments valid JSON for each declared tool's schema (lazy, starting at
// the word that opens a call, for tool_choice "auto"; from the first token for "required" or a named
// function), and the declared string parameters that the XML formats' parsers type values by.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../llm.hpp"

namespace srv {

struct ToolChoice {
    enum Mode { Auto, Required, Function } mode = Auto;
    std::string function;  // Function: the one tool that may be called
    bool parallel = true;  // false: one call at most
};

// The template's thinking block, which a forced call may follow (reasoning models think first).
struct ThinkingSyntax {
    std::string open, close;  // "" when the template has none
    bool opened = false;      // the prompt ends inside the block
};

struct ToolGrammar {
    std::string gbnf;                   // empty: no grammar (no tool-call format, or no tools)
    bool lazy = false;                  // the grammar starts at the first trigger word
    std::vector<std::string> triggers;
};

// tools: the request's "tools" (OpenAI's shape) in the client's member order (properties keep their
// order in the grammar). A named function that is not among the tools is a 400 (ApiError).
ToolGrammar tool_call_grammar(llm::ToolCallFormat format, const nlohmann::ordered_json& tools, const ToolChoice& choice,
                              const ThinkingSyntax& thinking = {});

// Each tool's parameters whose declared schema is a string (llm::ChatParseOptions::string_parameters).
std::map<std::string, std::vector<std::string>> string_parameters(const nlohmann::ordered_json& tools);

// The same grammar with every rule name prefixed, so that several grammars merge into one.
std::string prefix_rules(const std::string& gbnf, const std::string& prefix);

}  // namespace srv
