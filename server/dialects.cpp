// Anthropic Messages and OpenAI Responses (see dialects.hpp).
#include "dialects.hpp"

#include <algorithm>
#include <ctime>

#include "util.hpp"

namespace srv {

namespace {

using json = nlohmann::json;

// A string field, "" when absent; another type is a 400 naming the field.
std::string text_field(const json& obj, const char* key) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return "";
    if (!it->is_string()) throw ApiError(400, std::string("'") + key + "' must be a string");
    return it->get<std::string>();
}

const json& array_field(const json& obj, const char* key) {
    static const json empty = json::array();
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return empty;
    if (!it->is_array()) throw ApiError(400, std::string("'") + key + "' must be an array");
    return *it;
}

void require_object(const json& j, const char* what) {
    if (!j.is_object()) throw ApiError(400, std::string(what) + " must be an object");
}

// The text of the "text" blocks of a content array (other blocks are skipped), or the string itself.
std::string joined_text(const json& content) {
    if (content.is_string()) return content.get<std::string>();
    std::string out;
    if (!content.is_array()) return out;
    for (const json& block : content) {
        if (block.is_object() && text_field(block, "type") == "text") out += text_field(block, "text");
    }
    return out;
}

// "event: NAME" and its data (which carries "type": NAME), one server-sent event.
std::string sse_event(const char* name, json data) {
    data["type"] = name;
    return std::string("event: ") + name + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// Anthropic's stop_reason: tool_use when the answer calls tools, max_tokens when the length limit cut
// it, end_turn otherwise.
const char* anthropic_stop_reason(const Result& r, bool called) {
    return called ? "tool_use" : r.stop_type == "limit" ? "max_tokens" : "end_turn";
}

json anthropic_stop_sequence(const Result& r) { return r.stopping_word.empty() ? json(nullptr) : json(r.stopping_word); }

// One Anthropic message's content blocks as OpenAI messages: text (and image) blocks form the content,
// thinking blocks the reasoning_content, tool_use blocks tool_calls; each tool_result block becomes a
// "tool" message after it.
void convert_anthropic_blocks(const std::string& role, const json& content, json& out) {
    json parts = json::array(), tool_calls = json::array(), tool_results = json::array();
    std::string reasoning;
    for (const json& block : content) {
        require_object(block, "a content block");
        const std::string type = text_field(block, "type");
        if (type == "text") {
            parts.push_back({{"type", "text"}, {"text", text_field(block, "text")}});
        } else if (type == "thinking") {
            reasoning += text_field(block, "thinking");
        } else if (type == "image") {
            json source = block.value("source", json::object());
            require_object(source, "'source'");
            std::string url = text_field(source, "type") == "base64"
                                  ? "data:" + (source.contains("media_type") ? text_field(source, "media_type") : "image/jpeg") +
                                        ";base64," + text_field(source, "data")
                                  : text_field(source, "url");
            parts.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
        } else if (type == "tool_use") {
            json input = block.value("input", json::object());
            tool_calls.push_back({{"id", text_field(block, "id")},
                                  {"type", "function"},
                                  {"function", {{"name", text_field(block, "name")}, {"arguments", input.dump()}}}});
        } else if (type == "tool_result") {
            tool_results.push_back({{"role", "tool"},
                                    {"tool_call_id", text_field(block, "tool_use_id")},
                                    {"content", joined_text(block.value("content", json()))}});
        }
    }
    if (role == "user")  // the results answer the calls of the assistant turn before
        for (json& t : tool_results) out.push_back(std::move(t));
    if (!parts.empty() || !tool_calls.empty() || !reasoning.empty()) {
        json msg{{"role", role}};
        msg["content"] = parts.empty() ? json("") : parts;
        if (!tool_calls.empty()) msg["tool_calls"] = tool_calls;
        if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
        out.push_back(std::move(msg));
    }
    if (role != "user")
        for (json& t : tool_results) out.push_back(std::move(t));
}

// An input message's content parts (input_text, input_image) as chat content parts.
json input_parts(const json& content) {
    json parts = json::array();
    for (const json& part : content) {
        require_object(part, "a content part");
        const std::string type = text_field(part, "type");
        if (type == "input_text") {
            if (!part.contains("text")) throw ApiError(400, "'Input text' requires 'text'");
            parts.push_back({{"type", "text"}, {"text", text_field(part, "text")}});
        } else if (type == "input_image") {
            if (!part.contains("image_url")) throw ApiError(400, "'image_url' is required");
            parts.push_back({{"type", "image_url"}, {"image_url", {{"url", part["image_url"]}}}});
        } else if (type == "input_file") {
            throw ApiError(400, "'input_file' is not supported by llamacpp at this moment");
        } else {
            throw ApiError(400, "'type' must be one of 'input_text', 'input_image', or 'input_file'");
        }
    }
    return parts;
}

// An assistant output message's output_text parts as chat content parts.
json output_parts(const json& content) {
    json parts = json::array();
    for (const json& part : content) {
        require_object(part, "a content part");
        if (text_field(part, "type") != "output_text") throw ApiError(400, "'type' must be 'output_text'");
        if (!part.contains("text") || !part["text"].is_string()) throw ApiError(400, "'Output text' requires 'text'");
        parts.push_back({{"type", "text"}, {"text", part["text"]}});
    }
    return parts;
}

// The assistant turn an output item belongs to: the last message if it is the assistant's (output
// messages, function calls and reasoning of one turn merge), else a new one.
json& assistant_turn(json& messages) {
    if (messages.empty() || messages.back().value("role", "") != "assistant") messages.push_back({{"role", "assistant"}});
    return messages.back();
}

// A function call's output as a "tool" message (a string, or input_text parts).
json tool_output_message(const json& item) {
    json output = item.value("output", json(""));
    if (output.is_array()) {
        for (json& o : output) {
            if (!o.is_object() || text_field(o, "type") != "input_text") throw ApiError(400, "Output of tool call should be 'Input text'");
            o["type"] = "text";
        }
    } else if (!output.is_string()) {
        throw ApiError(400, "'output' must be a string or an array of 'input_text' parts");
    }
    return json{{"role", "tool"}, {"tool_call_id", text_field(item, "call_id")}, {"content", output}};
}

// One Responses input item as chat messages (llama-server's conversion): an input message, an assistant
// output message, a function call or its output, reasoning.
void convert_response_item(json item, json& messages) {
    require_object(item, "an input item");
    const std::string type = text_field(item, "type"), role = text_field(item, "role");
    if (item.contains("content") && item["content"].is_string()) {
        item["content"] = json::array({{{"type", "input_text"}, {"text", item["content"]}}});
    }
    const bool has_content = item.contains("content") && item["content"].is_array();
    if (has_content && (role == "user" || role == "system" || role == "developer")) {
        messages.push_back({{"role", role}, {"content", input_parts(item["content"])}});
    } else if (has_content && role == "assistant" && type == "message") {
        json& turn = assistant_turn(messages);
        if (!turn.contains("content") || !turn["content"].is_array()) turn["content"] = json::array();
        for (json& part : output_parts(item["content"])) turn["content"].push_back(std::move(part));
    } else if (type == "function_call") {
        assistant_turn(messages)["tool_calls"].push_back(
            {{"id", text_field(item, "call_id")},
             {"type", "function"},
             {"function", {{"name", text_field(item, "name")}, {"arguments", text_field(item, "arguments")}}}});
    } else if (type == "function_call_output") {
        messages.push_back(tool_output_message(item));
    } else if (type == "reasoning") {
        const json& content = array_field(item, "content");
        if (content.empty() || !content[0].is_object()) throw ApiError(400, "item['content'] is empty");
        assistant_turn(messages)["reasoning_content"] = text_field(content[0], "text");
    } else {
        throw ApiError(400, "Cannot determine type of 'item'");
    }
}

json response_usage(const Result& r) {
    return json{{"input_tokens", r.n_prompt},
                {"output_tokens", r.n_predicted},
                {"total_tokens", r.n_prompt + r.n_predicted},
                {"input_tokens_details", {{"cached_tokens", r.n_cache_reused}}}};
}

json output_text_part(const std::string& text) {
    return json{{"type", "output_text"}, {"annotations", json::array()}, {"logprobs", json::array()}, {"text", text}};
}

// The Responses API's output items: done, completed with their text; else in progress and empty, as
// response.output_item.added announces them.
const char* item_status(bool done) { return done ? "completed" : "in_progress"; }

json message_item(const std::string& id, const std::string& text, bool done) {
    return json{{"type", "message"}, {"status", item_status(done)}, {"id", id}, {"role", "assistant"},
                {"content", done ? json::array({output_text_part(text)}) : json::array()}};
}

json reasoning_item(const std::string& id, const std::string& text, bool done) {
    return json{{"type", "reasoning"}, {"status", item_status(done)}, {"id", id}, {"summary", json::array()},
                {"content", done ? json::array({{{"type", "reasoning_text"}, {"text", text}}}) : json::array()}};
}

json function_call_item(const std::string& id, const std::string& call_id, const std::string& name, const std::string& arguments, bool done) {
    return json{{"type", "function_call"}, {"status", item_status(done)}, {"id", id}, {"call_id", call_id}, {"name", name}, {"arguments", arguments}};
}

// A function_call item's id, "fc_" and the call id's random part (as llama-server derives it).
std::string function_call_item_id(const std::string& call_id) {
    return "fc_" + (call_id.rfind("call_", 0) == 0 ? call_id.substr(5) : call_id);
}

// The reasoning item's id, from the answer's message id ("msg_..." -> "rs_...").
std::string reasoning_item_id(const std::string& message_id) { return "rs_" + message_id.substr(std::min<size_t>(4, message_id.size())); }

}  // namespace

// ---- Anthropic -------------------------------------------------------------------------------------

json anthropic_to_chat(const json& body) {
    json messages = json::array();
    if (body.contains("system") && !body["system"].is_null()) {
        messages.push_back({{"role", "system"}, {"content", joined_text(body["system"])}});
    }
    if (!body.contains("messages")) throw ApiError(400, "'messages' is required");
    for (const json& msg : array_field(body, "messages")) {
        require_object(msg, "a message");
        const std::string role = text_field(msg, "role");
        auto content = msg.find("content");
        if (content == msg.end() || content->is_null()) {
            if (role != "assistant") messages.push_back(msg);
        } else if (content->is_array()) {
            convert_anthropic_blocks(role, *content, messages);
        } else {
            messages.push_back(msg);
        }
    }
    json chat{{"messages", messages}};
    if (body.contains("tools")) {
        json tools = json::array();
        for (const json& t : array_field(body, "tools")) {
            require_object(t, "a tool");
            tools.push_back({{"type", "function"},
                             {"function", {{"name", text_field(t, "name")},
                                           {"description", text_field(t, "description")},
                                           {"parameters", t.value("input_schema", json::object())}}}});
        }
        chat["tools"] = tools;
    }
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
        const json& choice = body["tool_choice"];
        require_object(choice, "'tool_choice'");
        const std::string type = text_field(choice, "type");
        if (type == "auto" || type == "none") chat["tool_choice"] = type;
        else if (type == "any") chat["tool_choice"] = "required";
        else if (type == "tool") chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", text_field(choice, "name")}}}};
        else throw ApiError(400, "'tool_choice' type must be one of 'auto', 'any', 'tool' or 'none'");
        if (choice.contains("disable_parallel_tool_use") && choice["disable_parallel_tool_use"].is_boolean())
            chat["parallel_tool_calls"] = !choice["disable_parallel_tool_use"].get<bool>();
    }
    if (body.contains("stop_sequences")) chat["stop"] = body["stop_sequences"];
    chat["max_tokens"] = body.contains("max_tokens") ? body["max_tokens"] : json(4096);
    for (const char* key : {"temperature", "top_p", "top_k", "stream"}) {
        if (body.contains(key)) chat[key] = body[key];
    }
    return chat;
}

json anthropic_message(const std::string& id, const std::string& model, const llm::ChatParsed& answer, const Result& r) {
    json content = json::array();
    if (!answer.reasoning_content.empty()) content.push_back({{"type", "thinking"}, {"thinking", answer.reasoning_content}, {"signature", ""}});
    if (!answer.content.empty()) content.push_back({{"type", "text"}, {"text", answer.content}});
    for (const llm::ChatToolCall& c : answer.tool_calls) {
        json input = json::parse(c.arguments, nullptr, false);
        content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", input.is_object() ? input : json::object()}});
    }
    return json{{"id", id},
                {"type", "message"},
                {"role", "assistant"},
                {"content", content},
                {"model", model},
                {"stop_reason", anthropic_stop_reason(r, !answer.tool_calls.empty())},
                {"stop_sequence", anthropic_stop_sequence(r)},
                {"usage", {{"cache_read_input_tokens", r.n_cache_reused},
                           {"input_tokens", r.n_prompt - r.n_cache_reused},
                           {"output_tokens", r.n_predicted}}}};
}

std::string AnthropicStream::open_block(Block kind, const json& content_block) {
    std::string out = close_block();
    open_ = kind;
    return out + sse_event("content_block_start", {{"index", ++index_}, {"content_block", content_block}});
}

std::string AnthropicStream::close_block() {
    if (open_ == Block::None) return "";
    open_ = Block::None;
    return sse_event("content_block_stop", {{"index", index_}});
}

// message_start (with the prompt's token counts) first; then each kind of delta in its own block,
// opened by its first delta: thinking, text, and one tool_use block per call.
std::string AnthropicStream::delta_events(const Result& r, const llm::ChatDelta& d) {
    std::string out;
    if (!started_) {
        started_ = true;
        out += sse_event("message_start", {{"message", {{"id", id_},
                                                        {"type", "message"},
                                                        {"role", "assistant"},
                                                        {"content", json::array()},
                                                        {"model", model_},
                                                        {"stop_reason", nullptr},
                                                        {"stop_sequence", nullptr},
                                                        {"usage", {{"cache_read_input_tokens", r.n_cache_reused},
                                                                   {"input_tokens", r.n_prompt - r.n_cache_reused},
                                                                   {"output_tokens", 0}}}}}});
    }
    if (!d.reasoning_content.empty()) {
        if (open_ != Block::Thinking) out += open_block(Block::Thinking, {{"type", "thinking"}, {"thinking", ""}});
        out += sse_event("content_block_delta", {{"index", index_}, {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning_content}}}});
    }
    if (!d.content.empty()) {
        if (open_ != Block::Text) out += open_block(Block::Text, {{"type", "text"}, {"text", ""}});
        out += sse_event("content_block_delta", {{"index", index_}, {"delta", {{"type", "text_delta"}, {"text", d.content}}}});
    }
    for (const llm::ChatToolCallDelta& t : d.tool_calls) {
        if (t.first) {
            called_ = true;
            out += open_block(Block::ToolUse, {{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", json::object()}});
        }
        if (!t.arguments.empty() && open_ == Block::ToolUse)
            out += sse_event("content_block_delta", {{"index", index_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", t.arguments}}}});
    }
    return out;
}

std::string AnthropicStream::partial(const Result& r, const llm::ChatDelta& d) { return delta_events(r, d); }

std::string AnthropicStream::final(const Result& r, const llm::ChatDelta& d) {
    std::string out = delta_events(r, d) + close_block();
    out += sse_event("message_delta", {{"delta", {{"stop_reason", anthropic_stop_reason(r, called_)}, {"stop_sequence", anthropic_stop_sequence(r)}}},
                                       {"usage", {{"output_tokens", r.n_predicted}}}});
    return out + sse_event("message_stop", json::object());
}

std::string AnthropicStream::error(const json& err) {
    return "event: error\ndata: " + err.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// ---- Responses -------------------------------------------------------------------------------------

json responses_to_chat(const json& body) {
    if (!body.contains("input")) throw ApiError(400, "'input' is required");
    if (!text_field(body, "previous_response_id").empty()) throw ApiError(400, "llama.cpp does not support 'previous_response_id'.");
    json chat = body;
    chat.erase("input");
    chat.erase("instructions");
    chat.erase("previous_response_id");
    json messages = json::array();
    if (body.contains("instructions")) messages.push_back({{"role", "system"}, {"content", text_field(body, "instructions")}});
    const json& input = body["input"];
    if (input.is_string()) {
        messages.push_back({{"role", "user"}, {"content", input}});
    } else if (input.is_array()) {
        for (const json& item : input) convert_response_item(item, messages);
    } else {
        throw ApiError(400, "'input' must be a string or array of objects");
    }
    chat["messages"] = messages;
    if (body.contains("tool_choice") && body["tool_choice"].is_object()) {  // {"type": "function", "name"}: the chat shape
        const json& choice = body["tool_choice"];
        if (text_field(choice, "type") != "function") throw ApiError(400, "'tool_choice' must be 'auto', 'none', 'required' or a function");
        chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", text_field(choice, "name")}}}};
    }
    if (body.contains("tools")) {
        json tools = json::array();
        for (json t : array_field(body, "tools")) {
            require_object(t, "a tool");
            if (text_field(t, "type") != "function") throw ApiError(400, "'type' of tool must be 'function'");
            t.erase("type");
            if (!t.contains("strict")) t["strict"] = true;
            tools.push_back({{"type", "function"}, {"function", t}});
        }
        chat["tools"] = tools;
    }
    if (body.contains("max_output_tokens")) {
        chat["max_tokens"] = body["max_output_tokens"];
        chat.erase("max_output_tokens");
    }
    return chat;
}

json response_object(const std::string& id, const std::string& message_id, const std::string& model, const llm::ChatParsed& answer,
                     const Result& r) {
    const int64_t now = (int64_t)time(nullptr);
    json output = json::array();
    if (!answer.reasoning_content.empty()) output.push_back(reasoning_item(reasoning_item_id(message_id), answer.reasoning_content, true));
    if (!answer.content.empty()) output.push_back(message_item(message_id, answer.content, true));
    for (const llm::ChatToolCall& c : answer.tool_calls)
        output.push_back(function_call_item(function_call_item_id(c.id), c.id, c.name, c.arguments, true));
    return json{{"completed_at", now}, {"created_at", now}, {"id", id},          {"model", model},
                {"object", "response"}, {"output", output}, {"status", "completed"}, {"usage", response_usage(r)}};
}

// Closes the open item (if any) and announces the next: output_item.added (a message's text part too).
std::string ResponsesStream::open_item(Item kind, std::string item_id, std::string call_id, std::string name) {
    std::string out = close_item();
    open_ = kind;
    item_id_ = std::move(item_id);
    call_id_ = std::move(call_id);
    name_ = std::move(name);
    text_.clear();
    const json item = kind == Item::Reasoning ? reasoning_item(item_id_, "", false)
                      : kind == Item::Message ? message_item(item_id_, "", false)
                                              : function_call_item(item_id_, call_id_, name_, "", false);
    out += sse_event("response.output_item.added", {{"output_index", output_.size()}, {"item", item}});
    if (kind == Item::Message)
        out += sse_event("response.content_part.added",
                         {{"item_id", item_id_}, {"output_index", output_.size()}, {"content_index", 0}, {"part", output_text_part("")}});
    return out;
}

// The open item's closing events (its whole text, the done item), the item joining the output.
std::string ResponsesStream::close_item() {
    if (open_ == Item::None) return "";
    std::string out;
    json item;
    const size_t index = output_.size();
    if (open_ == Item::Reasoning) {
        out += sse_event("response.reasoning_text.done", {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
        item = reasoning_item(item_id_, text_, true);
    } else if (open_ == Item::Message) {
        out += sse_event("response.output_text.done", {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
        out += sse_event("response.content_part.done",
                         {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"part", output_text_part(text_)}});
        item = message_item(item_id_, text_, true);
    } else {
        out += sse_event("response.function_call_arguments.done", {{"item_id", item_id_}, {"output_index", index}, {"name", name_}, {"arguments", text_}});
        item = function_call_item(item_id_, call_id_, name_, text_, true);
    }
    out += sse_event("response.output_item.done", {{"output_index", index}, {"item", item}});
    output_.push_back(std::move(item));
    open_ = Item::None;
    return out;
}

// response.created and response.in_progress first; then each kind of delta in its item, opened by its
// first delta: reasoning, the message's text, and one function_call item per call.
std::string ResponsesStream::delta_events(const llm::ChatDelta& d) {
    std::string out;
    if (!started_) {
        started_ = true;
        json resp{{"id", id_}, {"object", "response"}, {"status", "in_progress"}};
        out += sse_event("response.created", {{"response", resp}});
        out += sse_event("response.in_progress", {{"response", resp}});
    }
    auto delta = [&](const char* event, const std::string& piece, bool text_part) {
        text_ += piece;
        json data{{"item_id", item_id_}, {"output_index", output_.size()}, {"delta", piece}};
        if (text_part) data["content_index"] = 0;
        out += sse_event(event, std::move(data));
    };
    if (!d.reasoning_content.empty()) {
        if (open_ != Item::Reasoning) out += open_item(Item::Reasoning, reasoning_item_id(message_id_));
        delta("response.reasoning_text.delta", d.reasoning_content, true);
    }
    if (!d.content.empty()) {
        if (open_ != Item::Message) {
            const int n = n_messages_++;
            out += open_item(Item::Message, n == 0 ? message_id_ : message_id_ + "_" + std::to_string(n));
        }
        delta("response.output_text.delta", d.content, true);
    }
    for (const llm::ChatToolCallDelta& t : d.tool_calls) {
        if (t.first) out += open_item(Item::FunctionCall, function_call_item_id(t.id), t.id, t.name);
        if (!t.arguments.empty() && open_ == Item::FunctionCall) delta("response.function_call_arguments.delta", t.arguments, false);
    }
    return out;
}

std::string ResponsesStream::partial(const Result&, const llm::ChatDelta& d) { return delta_events(d); }

std::string ResponsesStream::final(const Result& r, const llm::ChatDelta& d) {
    std::string out = delta_events(d) + close_item();
    return out + sse_event("response.completed", {{"response", {{"id", id_},
                                                                 {"object", "response"},
                                                                 {"created_at", (int64_t)time(nullptr)},
                                                                 {"status", "completed"},
                                                                 {"model", model_},
                                                                 {"output", output_},
                                                                 {"usage", response_usage(r)}}}});
}

}  // namespace srv
