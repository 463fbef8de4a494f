// The API dialects llm-server speaks besides llama.cpp's and OpenAI's chat/completions, as llama-server
// speaks them: Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) and OpenAI's
// Responses API (/v1/responses). A request is converted to an OpenAI chat request (which api.cpp
// renders and runs like /v1/chat/completions); the results are shaped back into the dialect, whole
// or as its server-sent events. JSON only: no engine, no scheduler state.
//
// Tool use: requests carrying tools, tool_use / tool_result blocks or function_call items are
// converted to OpenAI's tools / tool_calls / tool messages (as llama-server does). Anthropic answers
// carry the parsed answer: thinking, text and tool_use blocks (stop_reason "tool_use"), streamed as
// thinking_delta, text_delta and input_json_delta events. Responses answers carry reasoning, message
// and function_call items, streamed as reasoning_text, output_text and function_call_arguments events.
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
// list of message / function_call / function_call_output / reasoning items), tools in the Responses
// shape ({"type": "function", "name", "parameters", ...}), tool_choice (a string, or
// {"type": "function", "name"}), max_output_tokens as max_tokens; other fields passed through.
// previous_response_id is refused (400), as llama-server does: this server keeps no conversation state.
nlohmann::json responses_to_chat(const nlohmann::json& body);

// The response object of a finished generation: the answer's reasoning (a reasoning item), its text
// (a message item) and its tool calls (function_call items: id "fc_...", call_id the call's id, name,
// arguments, status), in that order.
nlohmann::json response_object(const std::string& id, const std::string& message_id, const std::string& model,
                               const llm::ChatParsed& answer, const Result& r);

// The event stream: response.created, response.in_progress, then each output item in turn:
// response.output_item.added, its deltas (response.reasoning_text.delta; response.content_part.added
// and response.output_text.delta; response.function_call_arguments.delta), their .done events and
// response.output_item.done; last response.completed (no [DONE]).
class ResponsesStream {
public:
    ResponsesStream(std::string id, std::string message_id, std::string model)
        : id_(std::move(id)), message_id_(std::move(message_id)), model_(std::move(model)) {}
    // The events for what a result made certain of the answer (tool calls' first deltas carry ids).
    std::string partial(const Result& r, const llm::ChatDelta& d);
    std::string final(const Result& r, const llm::ChatDelta& d);  // the last of it, the closing events

private:
    enum class Item { None, Reasoning, Message, FunctionCall };
    std::string delta_events(const llm::ChatDelta& d);
    std::string open_item(Item kind, std::string item_id, std::string call_id = "", std::string name = "");
    std::string close_item();
    std::string id_, message_id_, model_;
    bool started_ = false;
    int n_messages_ = 0;  // message items opened (the first has message_id_)
    Item open_ = Item::None;
    std::string item_id_, call_id_, name_, text_;  // the open item's; text_: its text or arguments so far
    nlohmann::json output_ = nlohmann::json::array();  // the closed items
};

}  // namespace srv
