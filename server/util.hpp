// Small helpers every unit of llm-server uses: logging, request errors, file reading, token and text
// prefixes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace srv {

// "2026-11-29T10:00:00.123Z I message", one line per event, from any thread. Levels: 'E' error (1),
// 'W' warning (2), 'I' info (3), 'D' debug (4); a line is written when its number is at most the
// verbosity (-lv N; -v: all; --log-disable: none), to stderr and to the --log-file.
__attribute__((format(printf, 2, 3))) void log_msg(char level, const char* fmt, ...);
// Sets the verbosity and the log file (throws when the file cannot be opened); call before logging.
void set_log_options(int verbosity, const std::string& file);
bool log_enabled(char level);

// A request that cannot be served: answered with an OpenAI-style error body of this status and type
// (and these numbers in it, e.g. n_prompt_tokens and n_ctx).
struct ApiError : std::runtime_error {
    int status;
    std::string type;
    std::vector<std::pair<std::string, int64_t>> fields;
    ApiError(int s, const std::string& msg, std::string t = "", std::vector<std::pair<std::string, int64_t>> f = {})
        : std::runtime_error(msg), status(s), type(std::move(t)), fields(std::move(f)) {}
};

double now_seconds();  // a steady clock
std::string read_file(const std::string& path);
double mib(size_t bytes);
bool ends_with(const std::string& s, const std::string& suffix);
// Bytes at the end of s that start a UTF-8 sequence not complete yet (held back from a stream).
size_t incomplete_utf8_tail(const std::string& s);
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace srv
