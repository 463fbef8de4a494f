// The API dialects llm-server speaks besides llama.cpp's and OpenAI's chat/completions, as llama-server
// speaks them: Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) and OpenAI's
// Responses API (/v1/responses). A request is converted to an OpenAI chat request (which api.cpp
// renders and runs like /v1/chat/completions); the results are shaped back into the dialect, whole
// or as its server-sent events. JSON only: no engine, no scheduler state.
//
// Tool use: requests carrying tools, tool_use / tool_result blocks or function_call items are
// converted to OpenAI's tools / tool_calls / tool messages (as llama-server does). Anthropic answers
// carry the parsed answer: thinking, text and tool_use blocks (stop_reason "tool_use"), streamed as
// thinking_delta, text_delta and input_json_delta events. Responses answers hold text only so far;
// function_call items are where its tool calls will plug in.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "scheduler.hpp"

namespace srv {

// ---- Anthropic Messages ----------------------------------------------------------------------------

// An Anthropic Messages request as an OpenAI chat request: system (a string or text blocks) first,
// content blocks (text, thinking, image, tool_use, tool_result: a user turn's results first, as the
// tool messages answering the calls before them), tools, tool_choice (auto, any: "required", tool: the
// named function, none) and its disable_parallel_tool_use, stop_sequences as stop, max_tokens (4096
// when absent), temperature/top_p/top_k/stream passed through. A malformed request throws ApiError (400).
nlohmann::json anthropic_to_chat(const nlohmann::json& body);

// The message object answering a request, once its generation is done: the answer's thinking, text
// and tool calls (their ids set) as content blocks.
nlohmann::json anthropic_message(const std::string& id, const std::string& model, const llm::ChatParsed& answer, const Result& r);

// The event stream of one answer: message_start, content_block_start, content_block_delta...,
// content_block_stop, message_delta, message_stop (no [DONE]: Anthropic's streams end with
// message_stop).
class AnthropicStream {
public:
    AnthropicStream(std::string id, std::string model) : id_(std::move(id)), model_(std::move(model)) {}
    // The events for what a result made certain of the answer (tool calls' first deltas carry ids).
    std::string partial(const Result& r, const llm::ChatDelta& d);
    std::string final(const Result& r, const llm::ChatDelta& d);  // the last of it, the closing events
    static std::string error(const nlohmann::json& err);  // an "error" event

private:
    enum class Block { None, Thinking, Text, ToolUse };
    std::string delta_events(const Result& r, const llm::ChatDelta& d);
    std::string open_block(Block kind, const nlohmann::json& content_block);
    std::string close_block();
    std::string id_, model_;
    bool started_ = false, called_ = false;
    Block open_ = Block::None;
    int index_ = -1;  // the open (or last) content block's index
};

// ---- OpenAI Responses ------------------------------------------------------------------------------

// A Responses request as a chat request: instructions as the system message, input (a string or a
// list of message / function_call / function_call_output / reasoning items), tools, max_output_tokens
// as max_tokens; other fields passed through. previous_response_id is refused (400), as llama-server
// does: this server keeps no conversation state.
nlohmann::json responses_to_chat(const nlohmann::json& body);

// The response object of a finished generation.
nlohmann::json response_object(const std::string& id, const std::string& message_id, const std::string& model,
                               const std::string& text, const Result& r);

// The event stream: response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta..., response.output_text.done,
// response.content_part.done, response.output_item.done, response.completed (no [DONE]).
class ResponsesStream {
public:
    ResponsesStream(std::string id, std::string message_id, std::string model)
        : id_(std::move(id)), message_id_(std::move(message_id)), model_(std::move(model)) {}
    std::string partial(const Result& r);
    std::string final(const Result& r);

private:
    std::string text_events(const std::string& text);
    std::string id_, message_id_, model_, text_;
    bool started_ = false, text_open_ = false;
};

}  // namespace srv
