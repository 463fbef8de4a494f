// http.hpp: a small, hardened HTTP/1.1 server (and a minimal client) for llm-server.
//
// Header-only; every function is inline, so several translation units may include it. POSIX sockets and
// std::thread only: no third-party code, no getaddrinfo (the server binary is linked statically, and
// glibc's resolver does not work there), so hosts are numeric IPv4/IPv6 literals ("localhost" is
// accepted as 127.0.0.1).
//
//   http::Options opt;  opt.port = 8080;
//   http::Server srv(opt);
//   srv.route("GET", "/health", [](const http::Request&, http::Response& res) {
//       res.set_content("{\"status\":\"ok\"}", "application/json");
//   });
//   srv.route("POST", "/completion", [](const http::Request& req, http::Response& res) {
//       res.stream([body = req.body](http::Writer& w) {       // SSE, Transfer-Encoding: chunked
//           for (...) if (!w.write("data: {...}\n\n")) return false;   // client gone: stop generating
//           return true;                                       // true: finish the response normally
//       });
//   });
//   srv.set_auth([](const http::Request& r) { return r.path == "/health" || r.header("authorization") == "Bearer KEY"; });
//   srv.listen();            // binds (throws std::runtime_error); srv.port() is the bound port (opt.port 0 = ephemeral)
//   srv.run();               // blocks until stop(); stop() is thread-safe and async-signal-safe
//
// Pieces:
//   Parser     incremental request (or response) parser over bytes, no I/O: feed() returns NeedMore,
//              Complete or Error (error_status() is the HTTP status to answer: 400, 413, 414, 431, 501, 505, ...).
//              Fuzzed by fuzz/fuzz_http.cpp.
//   Server     thread per connection, bounded by max_connections (excess connections get 503 and are
//              closed by the accept loop itself, no thread); poll() deadlines for slow clients; keep-alive;
//              graceful stop.
//   Client     a blocking client for tests and tools (keep-alive, chunked, incremental body callback).
//
// Protocol decisions (documented here because they are policy, not accident):
//   - Request bodies: Content-Length, or Transfer-Encoding: chunked (decoded; trailers are read and
//     dropped). Other transfer codings -> 501; a Transfer-Encoding not ending in chunked -> 400;
//     Transfer-Encoding together with Content-Length -> 400 (request smuggling); Transfer-Encoding in
//     HTTP/1.0 -> 400. Content-Length must be digits only; repeated values must agree, else 400.
//   - Line endings: CRLF, bare LF tolerated (RFC 9112 2.2); a CR anywhere else is an error. obs-fold -> 400.
//   - Request targets: origin-form ("/p?q"), absolute-form ("http://h/p") and "*" (OPTIONS only); only
//     visible ASCII. The path is percent-decoded (a decoded NUL is refused); routes match it exactly.
//     Query parameters are decoded with '+' as space; for a repeated key the first occurrence wins.
//   - Expect: 100-continue is answered with 100 Continue before the body is read; other expectations -> 417.
//   - Host is not required (lenient on purpose: the server routes by path only).
//   - Timeouts: read_timeout_ms bounds the whole request (headers and body) from its first byte, and the
//     wait for the first request on a new connection; a drip-fed request cannot extend it. A request that
//     times out half-received gets 408; an idle connection is closed silently.
//   - Every response is HTTP/1.1 and, with Options::cors, carries Access-Control-Allow-Origin: * (or, with
//     cors_echo_origin, the request's Origin and Access-Control-Allow-Credentials: true); OPTIONS
//     without an explicit route is answered as a CORS preflight (204) before auth.
//   - A client that closes its end (FIN) counts as disconnected for Writer::alive / Request::client_connected,
//     which is how long non-streaming work is cancelled.
#pragma once

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace http {

// Header names as received are lower-cased by the parser; lookups are case-insensitive anyway.
using Headers = std::vector<std::pair<std::string, std::string>>;

struct Limits {
    size_t max_request_line = 8 * 1024;       // request (or status) line without its CRLF -> 414
    size_t max_header_bytes = 32 * 1024;      // all header lines with their CRLFs -> 431
    size_t max_headers = 100;                 // header count (trailers included) -> 431
    size_t max_body = 16 * 1024 * 1024;       // decoded body -> 413
};

// ---------------------------------------------------------------------------------------------------
// Small text helpers (public: llm-server uses them too).

namespace detail {

inline char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

inline bool iequals(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
    return true;
}

inline std::string to_lower(std::string_view s) {
    std::string r(s);
    for (char& c : r) c = ascii_lower(c);
    return r;
}

// RFC 9110 tchar: the characters of methods, header names and transfer codings.
inline bool is_tchar(unsigned char c) {
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return true;
    return c != 0 && std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

inline bool is_token(std::string_view s) {
    if (s.empty()) return false;
    for (unsigned char c : s)
        if (!is_tchar(c)) return false;
    return true;
}

inline std::string_view trim_ows(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// Calls fn(element) for each trimmed, non-empty element of a comma-separated header list.
template <class Fn> void for_each_list_item(std::string_view list, Fn&& fn) {
    while (!list.empty()) {
        size_t comma = list.find(',');
        std::string_view item = trim_ows(list.substr(0, comma));
        if (!item.empty()) fn(item);
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
}

inline bool list_has_token(std::string_view list, std::string_view token) {
    bool found = false;
    for_each_list_item(list, [&](std::string_view item) { found = found || iequals(item, token); });
    return found;
}

inline int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

inline const std::string* find_header(const Headers& h, std::string_view name) {
    for (const auto& kv : h)
        if (iequals(kv.first, name)) return &kv.second;
    return nullptr;
}

// All values of a header joined by ", " (how repeated list headers combine); nullopt when absent.
inline std::optional<std::string> joined_header(const Headers& h, std::string_view name) {
    std::optional<std::string> r;
    for (const auto& kv : h) {
        if (!iequals(kv.first, name)) continue;
        if (r) *r += ", "; else r.emplace();
        *r += kv.second;
    }
    return r;
}

}  // namespace detail

// Length of the well-formed UTF-8 sequence starting at p (1..4), or 0 if it is malformed (overlong,
// surrogate, above U+10FFFF, truncated, stray continuation byte).
inline size_t utf8_sequence_length(const unsigned char* p, size_t n) {
    if (n == 0) return 0;
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;   // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return 0;
    if (n < len || p[1] < lo || p[1] > hi) return 0;
    for (size_t i = 2; i < len; ++i)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return len;
}

inline bool is_valid_utf8(std::string_view s) {
    auto p = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = 0; i < s.size();) {
        size_t n = utf8_sequence_length(p + i, s.size() - i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

// Percent-decodes s ("%41" -> "A"; with plus_as_space, '+' -> ' ' as in query strings). nullopt on a
// malformed escape ("%4", "%zz").
inline std::optional<std::string> percent_decode(std::string_view s, bool plus_as_space = false) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= s.size()) return std::nullopt;
            int h = detail::hex_value(s[i + 1]), l = detail::hex_value(s[i + 2]);
            if (h < 0 || l < 0) return std::nullopt;
            out += char(h * 16 + l);
            i += 2;
        } else if (c == '+' && plus_as_space) {
            out += ' ';
        } else {
            out += c;
        }
    }
    return out;
}

// A JSON string literal (with the quotes) for s. Invalid UTF-8 becomes U+FFFD so that the output is
// always valid JSON, whatever bytes a client put in a path or a handler put in an exception message.
inline std::string json_escape(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 2);
    out += '"';
    auto p = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = 0; i < s.size();) {
        unsigned char c = p[i];
        size_t n = utf8_sequence_length(p + i, s.size() - i);
        if (n == 0) { out += "\\ufffd"; ++i; continue; }
        if (n > 1) { out.append(s.data() + i, n); i += n; continue; }
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20 || c == 0x7F) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += char(c);
                }
        }
        ++i;
    }
    out += '"';
    return out;
}

// OpenAI-style error type for a status, matching llama-server's names.
inline const char* error_type_for(int status) {
    switch (status) {
        case 401: return "authentication_error";
        case 403: return "permission_error";
        case 404: return "not_found_error";
        case 501: return "not_supported_error";
        case 503: return "unavailable_error";
        default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

// {"error":{"code":404,"message":"...","type":"not_found_error"}}
inline std::string error_json(int status, std::string_view message, std::string_view type = {}) {
    std::string r = "{\"error\":{\"code\":" + std::to_string(status) + ",\"message\":" + json_escape(message) +
                    ",\"type\":" + json_escape(type.empty() ? error_type_for(status) : type) + "}}";
    return r;
}

inline const char* reason_phrase(int status) {
    switch (status) {
        case 100: return "Continue";
        case 101: return "Switching Protocols";
        case 200: return "OK";
        case 201: return "Created";
        case 202: return "Accepted";
        case 204: return "No Content";
        case 206: return "Partial Content";
        case 301: return "Moved Permanently";
        case 302: return "Found";
        case 304: return "Not Modified";
        case 400: return "Bad Request";
        case 401: return "Unauthorized";
        case 403: return "Forbidden";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 408: return "Request Timeout";
        case 409: return "Conflict";
        case 411: return "Length Required";
        case 413: return "Content Too Large";
        case 414: return "URI Too Long";
        case 415: return "Unsupported Media Type";
        case 417: return "Expectation Failed";
        case 422: return "Unprocessable Content";
        case 429: return "Too Many Requests";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        case 501: return "Not Implemented";
        case 502: return "Bad Gateway";
        case 503: return "Service Unavailable";
        case 505: return "HTTP Version Not Supported";
        default: return "Unknown";
    }
}

// ---------------------------------------------------------------------------------------------------
// Socket helpers.

namespace detail {

using Clock = std::chrono::steady_clock;

inline Clock::time_point deadline_in(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

inline int ms_until(Clock::time_point deadline) {
    auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return d <= 0 ? 0 : d > INT_MAX ? INT_MAX : int(d);
}

// revents, 0 on timeout, -1 on error.
inline int poll_one(int fd, short events, int timeout_ms) {
    pollfd p{fd, events, 0};
    for (;;) {
        int r = ::poll(&p, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        return r < 0 ? -1 : r == 0 ? 0 : p.revents;
    }
}

// Sends everything or fails: peer gone, error, or no progress for timeout_ms. MSG_NOSIGNAL: a closed
// peer must not raise SIGPIPE.
inline bool send_all(int fd, const char* p, size_t n, int timeout_ms) {
    while (n > 0) {
        ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) { p += w; n -= size_t(w); continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int ev = poll_one(fd, POLLOUT, timeout_ms);
            if (ev <= 0 || (ev & (POLLERR | POLLHUP | POLLNVAL))) return false;
            continue;
        }
        return false;
    }
    return true;
}
inline bool send_all(int fd, std::string_view s, int timeout_ms) { return send_all(fd, s.data(), s.size(), timeout_ms); }

// Whether the peer still looks connected: no error/hangup and no pending EOF. Bytes of a pipelined next
// request do not count as a disconnect.
inline bool peer_open(int fd) {
    if (fd < 0) return false;
    int ev = poll_one(fd, POLLIN, 0);
    if (ev < 0 || (ev & (POLLERR | POLLHUP | POLLNVAL))) return false;
    if (ev & POLLIN) {
        char c;
        ssize_t r = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0) return false;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    }
    return true;
}

struct SockAddr {
    sockaddr_storage ss{};
    socklen_t len = 0;
};

// Numeric host (IPv4 or IPv6 literal, IPv6 optionally in brackets) -> socket address. No DNS.
inline SockAddr make_sockaddr(std::string host, int port) {
    if (port < 0 || port > 65535) throw std::runtime_error("http: invalid port " + std::to_string(port));
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host.empty()) host = "0.0.0.0";
    if (host == "localhost") host = "127.0.0.1";
    SockAddr a;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a.ss);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
    if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(uint16_t(port));
        a.len = sizeof(sockaddr_in);
    } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(uint16_t(port));
        a.len = sizeof(sockaddr_in6);
    } else {
        throw std::runtime_error("http: host must be a numeric IPv4 or IPv6 address: '" + host + "'");
    }
    return a;
}

inline std::pair<std::string, int> describe_sockaddr(const sockaddr_storage& ss) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (ss.ss_family == AF_INET) {
        auto* v4 = reinterpret_cast<const sockaddr_in*>(&ss);
        ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
        return {buf, ntohs(v4->sin_port)};
    }
    if (ss.ss_family == AF_INET6) {
        auto* v6 = reinterpret_cast<const sockaddr_in6*>(&ss);
        ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
        return {buf, ntohs(v6->sin6_port)};
    }
    return {"", 0};
}

inline std::string errno_text(const char* what) { return std::string("http: ") + what + ": " + std::strerror(errno); }

}  // namespace detail

// ---------------------------------------------------------------------------------------------------
// Request / Response

struct Request {
    std::string method;         // as sent ("GET"); methods are case-sensitive
    std::string target;         // raw request target
    std::string path;           // percent-decoded path ("*" for OPTIONS *)
    std::string query_string;   // raw, after '?'
    std::map<std::string, std::string> query;   // decoded query parameters
    std::string version;        // "HTTP/1.1" or "HTTP/1.0"
    Headers headers;            // names lower-cased
    std::string body;           // decoded (chunked bodies are reassembled)
    bool keep_alive = true;     // what the client asked for
    std::string remote_addr;    // set by the server
    int remote_port = 0;
    int socket_fd = -1;         // set by the server; used by client_connected()

    const std::string* find_header(std::string_view name) const { return detail::find_header(headers, name); }
    bool has_header(std::string_view name) const { return find_header(name) != nullptr; }
    std::string header(std::string_view name, std::string_view fallback = {}) const {
        const std::string* v = find_header(name);
        return v ? *v : std::string(fallback);
    }
    bool has_param(std::string_view name) const { return query.find(std::string(name)) != query.end(); }
    std::string param(std::string_view name, std::string_view fallback = {}) const {
        auto it = query.find(std::string(name));
        return it != query.end() ? it->second : std::string(fallback);
    }
    // False once the client has closed or reset the connection: poll it during long non-streaming work
    // and give up early. Always true outside a server handler.
    bool client_connected() const { return socket_fd < 0 || detail::peer_open(socket_fd); }
};

// Handed to a streaming callback. Each write() is sent at once as one chunk (Transfer-Encoding: chunked
// for HTTP/1.1; raw bytes and connection close for HTTP/1.0).
class Writer {
public:
    // False when the client is gone (or stalled past the write timeout, or the server is shutting down
    // hard): stop producing output. Writing an empty string is a no-op.
    bool write(std::string_view data) {
        if (!ok_) return false;
        if (data.empty()) return true;
        if (chunked_) {
            char size_line[24];
            int n = std::snprintf(size_line, sizeof size_line, "%zx\r\n", data.size());
            std::string frame;
            frame.reserve(size_t(n) + data.size() + 2);
            frame.append(size_line, size_t(n)).append(data).append("\r\n");
            ok_ = detail::send_all(fd_, frame, timeout_ms_);
        } else {
            ok_ = detail::send_all(fd_, data, timeout_ms_);
        }
        if (ok_) bytes_ += data.size();
        return ok_;
    }
    // Cheap liveness probe without writing (e.g. during a long prompt evaluation).
    bool alive() const { return ok_ && detail::peer_open(fd_); }
    bool ok() const { return ok_; }
    size_t bytes_written() const { return bytes_; }

    Writer(int fd, bool chunked, int timeout_ms) : fd_(fd), chunked_(chunked), timeout_ms_(timeout_ms) {}

private:
    int fd_;
    bool chunked_;
    int timeout_ms_;
    bool ok_ = true;
    size_t bytes_ = 0;
};

struct Response {
    int status = 200;
    Headers headers;    // Content-Length, Transfer-Encoding and Connection are the server's business
    std::string body;
    // Set by stream(): called after the headers are sent; return true when done (the terminating chunk is
    // sent), false to abort (the connection is closed without it, so the client sees a truncated reply).
    std::function<bool(Writer&)> streamer;

    const std::string* find_header(std::string_view name) const { return detail::find_header(headers, name); }
    std::string header(std::string_view name) const {
        const std::string* v = find_header(name);
        return v ? *v : std::string();
    }
    // Replaces any header of the same name.
    void set_header(std::string_view name, std::string_view value) {
        headers.erase(std::remove_if(headers.begin(), headers.end(),
                                     [&](const auto& kv) { return detail::iequals(kv.first, name); }),
                      headers.end());
        headers.emplace_back(std::string(name), std::string(value));
    }
    void set_content(std::string content, std::string_view content_type) {
        body = std::move(content);
        set_header("Content-Type", content_type);
    }
    void set_json(std::string json, int code = 200) {
        status = code;
        set_content(std::move(json), "application/json; charset=utf-8");
    }
    // OpenAI-style JSON error body.
    void set_error(int code, std::string_view message, std::string_view type = {}) {
        set_json(error_json(code, message, type), code);
    }
    void stream(std::function<bool(Writer&)> fn, std::string_view content_type = "text/event-stream") {
        streamer = std::move(fn);
        set_header("Content-Type", content_type);
        if (content_type.substr(0, 17) == "text/event-stream" && !find_header("Cache-Control"))
            set_header("Cache-Control", "no-cache");
    }
};

// ---------------------------------------------------------------------------------------------------
// Parser: incremental, no I/O. Request mode fills request(); response mode (for Client) fills status(),
// reason() and request().headers/.body/.version.
//
//   Parser p;                          // Limits{} by default
//   switch (p.feed(bytes)) { NeedMore: read more; Complete: use p.request(); Error: answer p.error_status() }
//   p.next();  p.feed({});             // next request on the connection (pipelined bytes are kept)
//
// Results do not depend on how the input is split into feed() calls (the fuzzer checks this).

class Parser {
public:
    enum class Mode { Request, Response };
    enum class Result { NeedMore, Complete, Error };
    static constexpr size_t kMaxChunkLine = 4096;

    explicit Parser(Limits limits = {}, Mode mode = Mode::Request) : lim_(limits), mode_(mode) {}

    Result feed(std::string_view data) {
        if (phase_ == Phase::Failed) return Result::Error;
        buf_.append(data.data(), data.size());
        Result r = advance();
        if (r == Result::NeedMore) compact();
        return r;
    }
    // The peer closed its end. Completes a close-delimited response body; anything else unfinished
    // becomes an error.
    Result feed_eof() {
        if (phase_ == Phase::UntilEof) { phase_ = Phase::Done; return Result::Complete; }
        if (phase_ == Phase::Done) return Result::Complete;
        if (phase_ == Phase::Failed) return Result::Error;
        return fail(400, in_progress() ? "connection closed before the message was complete" : "connection closed");
    }

    Result result() const {
        return phase_ == Phase::Done ? Result::Complete : phase_ == Phase::Failed ? Result::Error : Result::NeedMore;
    }
    int error_status() const { return error_status_; }
    const std::string& error_message() const { return error_message_; }

    // Any byte of the current message seen (leading blank lines excepted)?
    bool in_progress() const { return phase_ != Phase::StartLine || pos_ < buf_.size(); }
    bool headers_done() const { return phase_ > Phase::HeaderLines; }
    // Headers are complete, the body is still to come and the client sent Expect: 100-continue.
    bool expects_continue() const { return expect_continue_ && phase_ > Phase::HeaderLines && phase_ < Phase::Done; }
    size_t buffered() const { return buf_.size() - pos_; }

    // Response mode: the reply to a HEAD request has no body whatever its headers say.
    void set_no_body(bool v) { no_body_ = v; }

    Request& request() { return req_; }
    const Request& request() const { return req_; }
    int status() const { return status_; }
    const std::string& reason() const { return reason_; }

    // Starts the next message. Unparsed bytes stay buffered; call feed({}) to parse them.
    void next() {
        buf_.erase(0, pos_);
        pos_ = scan_ = 0;
        phase_ = Phase::StartLine;
        req_ = Request{};
        status_ = 0;
        reason_.clear();
        header_bytes_ = header_count_ = skipped_ = 0;
        remaining_ = 0;
        expect_continue_ = no_body_ = false;
        error_status_ = 0;
        error_message_.clear();
    }

private:
    // Order matters: headers_done() and expects_continue() compare phases.
    enum class Phase { StartLine, HeaderLines, Body, ChunkSize, ChunkData, ChunkEnd, Trailers, UntilEof, Done, Failed };

    Result fail(int status, std::string msg) {
        phase_ = Phase::Failed;
        error_status_ = status;
        error_message_ = std::move(msg);
        return Result::Error;
    }

    // Drops consumed bytes so that the buffer holds only what is not parsed yet. Amortised: only when the
    // consumed part is large or dominant.
    void compact() {
        if (pos_ == buf_.size()) { buf_.clear(); pos_ = scan_ = 0; return; }
        if (pos_ >= 65536 || pos_ * 2 >= buf_.size()) {
            buf_.erase(0, pos_);
            scan_ -= std::min(scan_, pos_);
            pos_ = 0;
        }
    }

    // Finds the next line terminator from where the last search stopped (so drip-fed input is scanned
    // once). Returns false when there is none yet; else sets `line` (without CR LF) and consumes it.
    bool take_line(std::string_view& line) {
        if (scan_ < pos_) scan_ = pos_;
        size_t nl = buf_.find('\n', scan_);
        if (nl == std::string::npos) { scan_ = buf_.size(); return false; }
        line = std::string_view(buf_.data() + pos_, nl - pos_);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        pos_ = scan_ = nl + 1;
        return true;
    }

    // Request lines are ASCII; a status line's reason phrase may carry obs-text.
    bool is_line_byte(unsigned char c) const {
        return (c >= 0x20 && c != 0x7F && (c < 0x80 || mode_ == Mode::Response)) || c == '\r';
    }

    Result advance() {
        for (;;) {
            switch (phase_) {
                case Phase::StartLine: {
                    // Validate bytes as they arrive, in order, so junk fails fast and the outcome does not
                    // depend on how the input was split. +1: room for the CR of the CRLF.
                    if (scan_ < pos_) scan_ = pos_;
                    size_t end = buf_.find('\n', scan_);
                    if (end == std::string::npos) end = buf_.size();
                    for (size_t i = scan_; i < end; ++i) {
                        if (i - pos_ >= lim_.max_request_line + 1) return fail(414, "request line too long");
                        if (!is_line_byte(static_cast<unsigned char>(buf_[i])))
                            return fail(400, mode_ == Mode::Request ? "invalid character in request line"
                                                                    : "invalid character in status line");
                    }
                    std::string_view line;
                    if (!take_line(line)) return Result::NeedMore;
                    if (line.size() > lim_.max_request_line) return fail(414, "request line too long");
                    if (line.empty()) {
                        // RFC 9112 2.2: ignore empty lines before a request line (stray CRLF after a body),
                        // but not forever.
                        if (++skipped_ > 8) return fail(400, "too many empty lines before the request line");
                        continue;
                    }
                    Result r = mode_ == Mode::Request ? parse_request_line(line) : parse_status_line(line);
                    if (r == Result::Error) return r;
                    phase_ = Phase::HeaderLines;
                    continue;
                }
                case Phase::HeaderLines:
                case Phase::Trailers: {
                    std::string_view line;
                    size_t start = pos_;
                    if (!take_line(line)) {
                        if (header_bytes_ + buffered() > lim_.max_header_bytes)
                            return fail(431, "request header fields too large");
                        return Result::NeedMore;
                    }
                    header_bytes_ += pos_ - start;   // the line with its CR LF
                    if (header_bytes_ > lim_.max_header_bytes) return fail(431, "request header fields too large");
                    if (line.empty()) {
                        if (phase_ == Phase::Trailers) { phase_ = Phase::Done; continue; }
                        if (finish_headers() == Result::Error) return Result::Error;
                        continue;
                    }
                    if (parse_header_line(line, phase_ == Phase::Trailers) == Result::Error) return Result::Error;
                    continue;
                }
                case Phase::Body:
                case Phase::ChunkData: {
                    size_t n = size_t(std::min<uint64_t>(remaining_, buffered()));
                    req_.body.append(buf_, pos_, n);
                    pos_ += n;
                    remaining_ -= n;
                    if (remaining_ > 0) return Result::NeedMore;
                    phase_ = phase_ == Phase::Body ? Phase::Done : Phase::ChunkEnd;
                    continue;
                }
                case Phase::ChunkSize: {
                    std::string_view line;
                    if (!take_line(line)) {
                        if (buffered() > kMaxChunkLine + 1) return fail(400, "chunk size line too long");
                        return Result::NeedMore;
                    }
                    if (line.size() > kMaxChunkLine) return fail(400, "chunk size line too long");
                    if (parse_chunk_size(line) == Result::Error) return Result::Error;
                    continue;
                }
                case Phase::ChunkEnd: {
                    if (buffered() < 1) return Result::NeedMore;
                    char c = buf_[pos_];
                    if (c == '\r') {
                        if (buffered() < 2) return Result::NeedMore;
                        if (buf_[pos_ + 1] != '\n') return fail(400, "missing CRLF after chunk data");
                        pos_ += 2;
                    } else if (c == '\n') {
                        pos_ += 1;
                    } else {
                        return fail(400, "missing CRLF after chunk data");
                    }
                    phase_ = Phase::ChunkSize;
                    continue;
                }
                case Phase::UntilEof: {
                    if (req_.body.size() + buffered() > lim_.max_body) return fail(413, "body too large");
                    req_.body.append(buf_, pos_, buffered());
                    pos_ = buf_.size();
                    return Result::NeedMore;
                }
                case Phase::Done: return Result::Complete;
                case Phase::Failed: return Result::Error;
            }
        }
    }

    static Result version_minor(std::string_view v, int& minor) {
        if (v == "HTTP/1.1") { minor = 1; return Result::Complete; }
        if (v == "HTTP/1.0") { minor = 0; return Result::Complete; }
        return Result::Error;
    }
    static bool looks_like_version(std::string_view v) {
        return v.size() == 8 && v.substr(0, 5) == "HTTP/" && std::isdigit(static_cast<unsigned char>(v[5])) &&
               v[6] == '.' && std::isdigit(static_cast<unsigned char>(v[7]));
    }

    Result parse_request_line(std::string_view line) {
        size_t sp1 = line.find(' ');
        size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
        if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
            return fail(400, "malformed request line");
        std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
        if (!detail::is_token(method)) return fail(400, "malformed request method");
        if (target.empty()) return fail(400, "empty request target");
        for (unsigned char c : target)
            if (c <= 0x20 || c >= 0x7F) return fail(400, "invalid character in request target");
        if (version_minor(version, minor_) == Result::Error)
            return looks_like_version(version) ? fail(505, "HTTP version not supported")
                                               : fail(400, "malformed HTTP version");
        req_.method = std::string(method);
        req_.target = std::string(target);
        req_.version = std::string(version);

        // Reduce the target to path [? query].
        std::string_view rest = target;
        if (rest == "*") {
            if (method != "OPTIONS") return fail(400, "'*' target is only valid for OPTIONS");
            req_.path = "*";
            return Result::Complete;
        }
        if (rest.front() != '/') {
            size_t scheme_end = rest.find("://");
            std::string_view scheme = scheme_end == std::string_view::npos ? std::string_view() : rest.substr(0, scheme_end);
            if (!detail::iequals(scheme, "http") && !detail::iequals(scheme, "https"))
                return fail(400, "malformed request target");
            rest.remove_prefix(scheme_end + 3);
            size_t path_start = rest.find_first_of("/?");
            if (path_start == 0) return fail(400, "malformed request target");   // empty authority
            rest = path_start == std::string_view::npos ? std::string_view() : rest.substr(path_start);
        }
        size_t q = rest.find('?');
        std::string_view raw_path = rest.substr(0, q);
        if (raw_path.empty()) raw_path = "/";
        auto path = percent_decode(raw_path);
        if (!path) return fail(400, "malformed percent-encoding in path");
        if (path->find('\0') != std::string::npos) return fail(400, "NUL in path");
        req_.path = std::move(*path);
        if (q != std::string_view::npos) {
            req_.query_string = std::string(rest.substr(q + 1));
            if (parse_query(req_.query_string) == Result::Error) return Result::Error;
        }
        return Result::Complete;
    }

    Result parse_query(std::string_view qs) {
        while (!qs.empty()) {
            size_t amp = qs.find('&');
            std::string_view item = qs.substr(0, amp);
            if (!item.empty()) {
                size_t eq = item.find('=');
                auto key = percent_decode(item.substr(0, eq), true);
                auto value = percent_decode(eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1), true);
                if (!key || !value) return fail(400, "malformed percent-encoding in query string");
                req_.query.emplace(std::move(*key), std::move(*value));   // first occurrence wins
            }
            if (amp == std::string_view::npos) break;
            qs.remove_prefix(amp + 1);
        }
        return Result::Complete;
    }

    Result parse_status_line(std::string_view line) {
        // HTTP/1.x SP 3DIGIT [SP reason]
        if (line.size() < 12 || version_minor(line.substr(0, 8), minor_) == Result::Error || line[8] != ' ')
            return fail(400, "malformed status line");
        int code = 0;
        for (size_t i = 9; i < 12; ++i) {
            if (!std::isdigit(static_cast<unsigned char>(line[i]))) return fail(400, "malformed status code");
            code = code * 10 + (line[i] - '0');
        }
        if (code < 100) return fail(400, "malformed status code");
        if (line.size() > 12 && line[12] != ' ') return fail(400, "malformed status line");
        status_ = code;
        reason_ = std::string(line.size() > 13 ? line.substr(13) : std::string_view());
        req_.version = std::string(line.substr(0, 8));
        return Result::Complete;
    }

    Result parse_header_line(std::string_view line, bool trailer) {
        if (line.front() == ' ' || line.front() == '\t') return fail(400, "obsolete header line folding is not supported");
        size_t colon = line.find(':');
        if (colon == std::string_view::npos) return fail(400, "malformed header line");
        std::string_view name = line.substr(0, colon);
        if (!detail::is_token(name)) return fail(400, "malformed header name");   // also: space before ':'
        std::string_view value = detail::trim_ows(line.substr(colon + 1));
        for (unsigned char c : value)
            if ((c < 0x20 && c != '\t') || c == 0x7F) return fail(400, "invalid character in header value");
        if (++header_count_ > lim_.max_headers) return fail(431, "too many header fields");
        if (!trailer) req_.headers.emplace_back(detail::to_lower(name), std::string(value));
        return Result::Complete;
    }

    // Decides how the body is framed once the header section is complete.
    Result finish_headers() {
        const Headers& h = req_.headers;
        auto connection = detail::joined_header(h, "connection");
        req_.keep_alive = minor_ == 1 ? !(connection && detail::list_has_token(*connection, "close"))
                                      : (connection && detail::list_has_token(*connection, "keep-alive"));
        auto te = detail::joined_header(h, "transfer-encoding");
        auto cl = detail::joined_header(h, "content-length");

        if (mode_ == Mode::Response && (no_body_ || status_ < 200 || status_ == 204 || status_ == 304)) {
            phase_ = Phase::Done;
            return Result::Complete;
        }
        if (te) {
            if (minor_ == 0) return fail(400, "Transfer-Encoding is not allowed in HTTP/1.0");
            if (cl) return fail(400, "both Content-Length and Transfer-Encoding present");
            std::vector<std::string> codings;
            bool bad = false;
            detail::for_each_list_item(*te, [&](std::string_view c) {
                bad = bad || !detail::is_token(c);
                codings.push_back(detail::to_lower(c));
            });
            if (bad || codings.empty()) return fail(400, "malformed Transfer-Encoding");
            if (codings.back() != "chunked") return fail(400, "Transfer-Encoding must end with chunked");
            if (codings.size() != 1) return fail(501, "only the chunked transfer coding is supported");
            phase_ = Phase::ChunkSize;
        } else if (cl) {
            // Every value (repeated headers, comma lists) must be the same plain decimal number.
            std::optional<uint64_t> length;
            bool bad = false, empty = true;
            detail::for_each_list_item(*cl, [&](std::string_view v) {
                empty = false;
                uint64_t n = 0;
                for (char c : v) {
                    if (c < '0' || c > '9') { bad = true; return; }
                    n = n > (UINT64_MAX - 9) / 10 ? UINT64_MAX : n * 10 + uint64_t(c - '0');   // saturate
                }
                if (length && *length != n) bad = true;
                length = n;
            });
            if (bad || empty) return fail(400, "invalid Content-Length");
            if (*length > lim_.max_body) return fail(413, "request body too large");
            remaining_ = *length;
            phase_ = remaining_ ? Phase::Body : Phase::Done;
        } else {
            phase_ = mode_ == Mode::Request ? Phase::Done : Phase::UntilEof;
        }

        if (mode_ == Mode::Request && minor_ == 1) {
            if (auto expect = detail::joined_header(h, "expect")) {
                if (!detail::iequals(detail::trim_ows(*expect), "100-continue")) return fail(417, "unsupported expectation");
                expect_continue_ = phase_ != Phase::Done;
            }
        }
        return Result::Complete;
    }

    Result parse_chunk_size(std::string_view line) {
        uint64_t size = 0;
        size_t i = 0;
        for (; i < line.size() && detail::hex_value(line[i]) >= 0; ++i) {
            if (size >= (uint64_t(1) << 56)) return fail(413, "request body too large");
            size = size * 16 + uint64_t(detail::hex_value(line[i]));
        }
        if (i == 0) return fail(400, "invalid chunk size");
        std::string_view ext = detail::trim_ows(line.substr(i));
        if (!ext.empty() && ext.front() != ';') return fail(400, "invalid chunk size");
        for (unsigned char c : ext)
            if ((c < 0x20 && c != '\t') || c == 0x7F) return fail(400, "invalid character in chunk extension");
        if (size == 0) { phase_ = Phase::Trailers; return Result::Complete; }
        if (size > lim_.max_body || req_.body.size() + size > lim_.max_body) return fail(413, "request body too large");
        remaining_ = size;
        phase_ = Phase::ChunkData;
        return Result::Complete;
    }

    Limits lim_;
    Mode mode_;
    Phase phase_ = Phase::StartLine;
    std::string buf_;
    size_t pos_ = 0;      // first unparsed byte
    size_t scan_ = 0;     // no '\n' in [pos_, scan_)
    Request req_;
    int status_ = 0;
    std::string reason_;
    int minor_ = 1;
    size_t header_bytes_ = 0, header_count_ = 0, skipped_ = 0;
    uint64_t remaining_ = 0;
    bool expect_continue_ = false, no_body_ = false;
    int error_status_ = 0;
    std::string error_message_;
};

// ---------------------------------------------------------------------------------------------------
// Server

struct Options {
    std::string host = "127.0.0.1";   // numeric IPv4/IPv6 literal ("0.0.0.0", "::", "::1"), or "localhost"
    int port = 8080;                  // 0: ephemeral, see Server::port()
    int max_connections = 64;         // concurrent connections (threads); more are answered 503 and closed
    int read_timeout_ms = 30000;      // whole request from its first byte; also the wait for a first request
    int keep_alive_timeout_ms = 5000; // idle time between requests on a kept-alive connection
    int write_timeout_ms = 30000;     // longest stall of a single send (client not reading)
    int shutdown_grace_ms = 5000;     // stop(): how long in-flight requests may still take
    bool cors = true;                 // Access-Control-Allow-* on every response, OPTIONS preflight
    bool cors_echo_origin = false;    // with cors: a request's Origin is echoed, with credentials allowed (else *)
    std::string server_name = "llm.hpp";
    Limits limits;
};

class Server {
public:
    using Handler = std::function<void(const Request&, Response&)>;

    explicit Server(Options opt = {}) : opt_(std::move(opt)) {
        if (::pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error(detail::errno_text("pipe2"));
    }
    ~Server() {
        // run() must have returned (stop() it and join its thread first).
        if (listen_fd_ >= 0) ::close(listen_fd_);
        for (int fd : wake_) if (fd >= 0) ::close(fd);
    }
    Server(const Server&) = delete;
    Server& operator=(const Server&) = delete;

    // Register before run(); routes are read concurrently by connection threads without a lock.
    // Exact path match on the decoded path. HEAD falls back to the GET handler (body dropped).
    void route(std::string_view method, std::string_view path, Handler h) {
        routes_[std::string(path)][std::string(method)] = std::move(h);
    }
    // Before routing (after CORS preflight): false -> 401 authentication_error.
    void set_auth(std::function<bool(const Request&)> fn) { auth_ = std::move(fn); }
    // Generic middleware, after auth: return false when it filled the response itself.
    void set_pre_route(std::function<bool(const Request&, Response&)> fn) { pre_ = std::move(fn); }
    // Called after each response that belongs to a parsed request (from connection threads).
    void set_logger(std::function<void(const Request&, const Response&)> fn) { logger_ = std::move(fn); }

    // Binds and listens; throws std::runtime_error. Idempotent.
    void listen() {
        if (listen_fd_ >= 0) return;
        detail::SockAddr addr = detail::make_sockaddr(opt_.host, opt_.port);
        int fd = ::socket(addr.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) throw std::runtime_error(detail::errno_text("socket"));
        int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, reinterpret_cast<sockaddr*>(&addr.ss), addr.len) != 0 || ::listen(fd, 512) != 0) {
            std::string err = detail::errno_text(("bind " + opt_.host + ":" + std::to_string(opt_.port)).c_str());
            ::close(fd);
            throw std::runtime_error(err);
        }
        sockaddr_storage bound{};
        socklen_t len = sizeof bound;
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
        port_ = detail::describe_sockaddr(bound).second;
        listen_fd_ = fd;
    }
    int port() const { return port_; }
    const Options& options() const { return opt_; }

    // Accept loop; returns after stop() once connections are finished (or cut after the grace period).
    // If stop() came first, returns at once.
    void run() {
        listen();
        while (!stopping_.load()) {
            std::vector<pollfd> fds;
            fds.push_back({listen_fd_, POLLIN, 0});
            fds.push_back({wake_[0], POLLIN, 0});
            int timeout = 500;   // also reaps finished connection threads
            for (const auto& l : lingering_) {
                fds.push_back({l.fd, POLLIN, 0});
                timeout = std::min(timeout, detail::ms_until(l.deadline));
            }
            if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) break;
            if (fds[1].revents) drain_wake_pipe();
            service_lingering(fds);
            reap();
            if (fds[0].revents & POLLIN) accept_pending();
        }
        shutdown_connections();
    }

    // Thread-safe and async-signal-safe (an atomic store and a write to the self-pipe): usable from a
    // SIGINT/SIGTERM handler.
    void stop() {
        stopping_.store(true);
        wake();
    }
    bool stopping() const { return stopping_.load(); }

    // Number of connections being served (accept-loop view; for tests and diagnostics).
    size_t active_connections() const { return active_.load(); }

private:
    struct Conn {
        std::thread thread;
        std::mutex mu;   // guards fd against shutdown() from the run thread racing close()
        int fd = -1;
        std::atomic<bool> done{false};
    };
    struct Lingering {
        int fd;
        detail::Clock::time_point deadline;
    };

    void wake() {
        char c = 1;
        if (::write(wake_[1], &c, 1) < 0) { /* pipe full: a wake-up is pending anyway */ }
    }

    void drain_wake_pipe() {
        char buf[64];
        while (::read(wake_[0], buf, sizeof buf) > 0) {}
    }

    void reap() {
        for (auto it = conns_.begin(); it != conns_.end();) {
            if ((*it)->done.load()) {
                (*it)->thread.join();
                it = conns_.erase(it);
            } else {
                ++it;
            }
        }
        active_.store(conns_.size());
    }

    void accept_pending() {
        for (int i = 0; i < 256; ++i) {
            sockaddr_storage ss{};
            socklen_t len = sizeof ss;
            int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR || errno == ECONNABORTED) continue;
                // Out of descriptors/memory: the connection stays in the backlog and poll() would report it
                // again at once; back off instead of spinning.
                if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                    std::this_thread::sleep_for(std::chrono::milliseconds(50));
                return;
            }
            int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);   // stream tokens promptly
            reap();
            if (conns_.size() >= size_t(std::max(opt_.max_connections, 1))) {
                reject(fd);
                continue;
            }
            auto conn = std::make_unique<Conn>();
            conn->fd = fd;
            Conn* c = conn.get();
            auto peer = detail::describe_sockaddr(ss);
            try {
                conn->thread = std::thread([this, c, peer] {
                    serve(*c, peer.first, peer.second);
                    c->done.store(true);
                    wake();   // reap promptly, so the slot is free for the next accept
                });
            } catch (...) {   // thread creation failed (resource limits)
                reject(fd);
                continue;
            }
            conns_.push_back(std::move(conn));
            active_.store(conns_.size());
        }
    }

    // 503 from the accept loop, no thread. The socket then lingers (read side drained) so that the
    // client's unread request does not turn our close into a reset that destroys the 503 in flight.
    void reject(int fd) {
        Response res;
        res.set_error(503, "server is busy: too many connections");
        std::string msg = serialize_head(res, false, Framing::Length) + res.body;
        (void)!::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);   // best effort, fits the socket buffer
        ::shutdown(fd, SHUT_WR);
        if (lingering_.size() >= 256) { ::close(fd); return; }
        lingering_.push_back({fd, detail::deadline_in(1000)});
    }

    void service_lingering(const std::vector<pollfd>& fds) {
        // fds[2..] mirror lingering_ at poll time; entries were only appended since.
        size_t polled = fds.size() - 2;
        std::vector<Lingering> keep;
        for (size_t i = 0; i < lingering_.size(); ++i) {
            Lingering& l = lingering_[i];
            bool finished = detail::ms_until(l.deadline) == 0;
            if (!finished && i < polled && fds[i + 2].revents) {
                char buf[4096];
                ssize_t n = ::recv(l.fd, buf, sizeof buf, MSG_DONTWAIT);
                finished = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
            }
            if (finished) ::close(l.fd); else keep.push_back(l);
        }
        lingering_.swap(keep);
    }

    void shutdown_connections() {
        if (listen_fd_ >= 0) { ::close(listen_fd_); listen_fd_ = -1; }
        // Idle keep-alive connections notice stopping_ within 100 ms; busy ones get the grace period.
        auto deadline = detail::deadline_in(opt_.shutdown_grace_ms);
        for (reap(); !conns_.empty() && detail::ms_until(deadline) > 0; reap())
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        // Past the grace period: cut the sockets. Blocked reads/writes fail at once, Writer::write returns
        // false, client_connected() turns false.
        for (auto& c : conns_) {
            std::lock_guard<std::mutex> lock(c->mu);
            if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
        }
        for (auto& c : conns_) c->thread.join();
        conns_.clear();
        active_.store(0);
        for (const auto& l : lingering_) ::close(l.fd);
        lingering_.clear();
    }

    // --- per connection (runs on the connection's thread) ---

    enum class Framing { Length, Chunked, Close };

    void close_conn(Conn& c) {
        std::lock_guard<std::mutex> lock(c.mu);
        if (c.fd >= 0) { ::close(c.fd); c.fd = -1; }
    }

    // Half-close and drain before closing: closing with unread input makes the kernel send a reset,
    // which can destroy the response the client has not read yet (e.g. a 413 while it still uploads).
    void linger_close(Conn& c, int ms) {
        ::shutdown(c.fd, SHUT_WR);
        auto deadline = detail::deadline_in(ms);
        char buf[16384];
        for (;;) {
            int ev = detail::poll_one(c.fd, POLLIN, detail::ms_until(deadline));
            if (ev <= 0) break;
            ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
        }
        close_conn(c);
    }

    void send_error_and_close(Conn& c, int status, std::string_view message) {
        Response res;
        res.set_error(status, message);
        std::string msg = serialize_head(res, false, Framing::Length) + res.body;
        detail::send_all(c.fd, msg, opt_.write_timeout_ms);
        linger_close(c, 2000);
    }

    void serve(Conn& c, const std::string& peer_addr, int peer_port) {
        Parser parser(opt_.limits);
        char buf[16384];
        bool first = true;
        for (;;) {
            // ---- read one request
            Parser::Result r = parser.buffered() ? parser.feed({}) : Parser::Result::NeedMore;
            bool started = parser.in_progress();
            auto request_deadline = detail::deadline_in(opt_.read_timeout_ms);
            auto idle_deadline = detail::deadline_in(first ? opt_.read_timeout_ms : opt_.keep_alive_timeout_ms);
            bool sent_continue = false;
            while (r == Parser::Result::NeedMore) {
                int wait;
                if (started) {
                    wait = detail::ms_until(request_deadline);
                    if (wait == 0) return send_error_and_close(c, 408, "request timeout");
                } else {
                    // Idle: poll in short slices so stop() closes idle keep-alive connections promptly.
                    if (stopping_.load()) return close_conn(c);
                    wait = std::min(100, detail::ms_until(idle_deadline));
                    if (wait == 0) return close_conn(c);
                }
                int ev = detail::poll_one(c.fd, POLLIN, wait);
                if (ev < 0) return close_conn(c);
                if (ev == 0) continue;
                ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
                if (n < 0) {
                    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
                    return close_conn(c);
                }
                if (n == 0) {
                    if (started) return send_error_and_close(c, 400, "connection closed before the request was complete");
                    return close_conn(c);
                }
                r = parser.feed(std::string_view(buf, size_t(n)));
                if (!started && parser.in_progress()) {
                    started = true;
                    request_deadline = detail::deadline_in(opt_.read_timeout_ms);
                }
                if (r == Parser::Result::NeedMore && !sent_continue && parser.expects_continue()) {
                    sent_continue = true;
                    if (!detail::send_all(c.fd, "HTTP/1.1 100 Continue\r\n\r\n", opt_.write_timeout_ms)) return close_conn(c);
                }
            }
            if (r == Parser::Result::Error) return send_error_and_close(c, parser.error_status(), parser.error_message());

            // ---- answer it
            Request& req = parser.request();
            req.remote_addr = peer_addr;
            req.remote_port = peer_port;
            req.socket_fd = c.fd;
            bool keep = respond(c.fd, req);
            if (!keep) return linger_close(c, 500);
            parser.next();
            first = false;
        }
    }

    void dispatch(const Request& req, Response& res) {
        try {
            auto pit = routes_.find(req.path);
            bool has_options_route = pit != routes_.end() && pit->second.count("OPTIONS");
            if (req.method == "OPTIONS" && opt_.cors && !has_options_route) {
                // CORS preflight: before auth, since browsers never send credentials with it.
                res.status = 204;
                std::string allow = pit != routes_.end() ? allowed_methods(pit->second) : kDefaultMethods;
                res.set_header("Access-Control-Allow-Methods", allow);
                std::string asked = req.header("access-control-request-headers");
                bool echo = !asked.empty();
                detail::for_each_list_item(asked, [&](std::string_view h) { echo = echo && detail::is_token(h); });
                res.set_header("Access-Control-Allow-Headers", echo ? asked : kDefaultAllowHeaders);
                res.set_header("Access-Control-Max-Age", "86400");
                return;
            }
            if (auth_ && !auth_(req)) return res.set_error(401, "Invalid API Key");
            if (pre_ && !pre_(req, res)) return;
            if (pit == routes_.end()) return res.set_error(404, "File Not Found: " + req.path);
            auto mit = pit->second.find(req.method);
            if (mit == pit->second.end() && req.method == "HEAD") mit = pit->second.find("GET");
            if (mit == pit->second.end()) {
                res.set_error(405, "method " + req.method + " not allowed for " + req.path);
                res.set_header("Allow", allowed_methods(pit->second));
                return;
            }
            mit->second(req, res);
        } catch (const std::exception& e) {
            res = Response();
            res.set_error(500, e.what());
        } catch (...) {
            res = Response();
            res.set_error(500, "unknown error");
        }
    }

    static std::string allowed_methods(const std::map<std::string, Handler>& methods) {
        std::string r;
        for (const auto& m : methods) r += m.first + ", ";
        if (methods.count("GET") && !methods.count("HEAD")) r += "HEAD, ";
        if (!methods.count("OPTIONS")) r += "OPTIONS, ";
        r.resize(r.size() - 2);
        return r;
    }

    // Sends the response; returns whether the connection may carry another request.
    bool respond(int fd, const Request& req) {
        Response res;
        dispatch(req, res);
        std::string origin = req.header("origin");
        if (opt_.cors && opt_.cors_echo_origin && !origin.empty() && !res.find_header("Access-Control-Allow-Origin")) {
            res.set_header("Access-Control-Allow-Origin", origin);
            res.set_header("Access-Control-Allow-Credentials", "true");
            res.set_header("Vary", "Origin");
        }
        bool head = req.method == "HEAD";
        const std::string* conn_hdr = res.find_header("Connection");
        bool keep = req.keep_alive && !stopping_.load() && !(conn_hdr && detail::list_has_token(*conn_hdr, "close"));
        bool ok;
        if (res.streamer && !head) {
            bool chunked = req.version == "HTTP/1.1";
            if (!chunked) keep = false;   // HTTP/1.0: the body ends with the connection
            ok = detail::send_all(fd, serialize_head(res, keep, chunked ? Framing::Chunked : Framing::Close),
                                  opt_.write_timeout_ms);
            if (ok) {
                Writer w(fd, chunked, opt_.write_timeout_ms);
                bool finished = false;
                try {
                    finished = res.streamer(w);
                } catch (...) {
                    finished = false;   // headers are out; the only way to signal failure is to cut it short
                }
                ok = finished && w.ok() && (!chunked || detail::send_all(fd, "0\r\n\r\n", opt_.write_timeout_ms));
            }
        } else {
            if (res.streamer) keep = false;   // HEAD of a stream: headers only, length unknown
            std::string msg = serialize_head(res, keep, res.streamer ? Framing::Close : Framing::Length);
            if (head || res.body.empty()) {
                ok = detail::send_all(fd, msg, opt_.write_timeout_ms);
            } else if (res.body.size() <= 65536) {   // one send, one packet with TCP_NODELAY
                msg += res.body;
                ok = detail::send_all(fd, msg, opt_.write_timeout_ms);
            } else {                                  // no copy of a large body
                ok = detail::send_all(fd, msg, opt_.write_timeout_ms) && detail::send_all(fd, res.body, opt_.write_timeout_ms);
            }
        }
        if (logger_) {
            try { logger_(req, res); } catch (...) {}
        }
        return ok && keep;
    }

    static constexpr const char* kDefaultMethods = "GET, POST, PUT, PATCH, DELETE, OPTIONS";
    static constexpr const char* kDefaultAllowHeaders = "Authorization, Content-Type, *";

    std::string serialize_head(const Response& res, bool keep, Framing framing) const {
        int status = (res.status >= 100 && res.status <= 999) ? res.status : 500;
        std::string s = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
        for (const auto& kv : res.headers) {
            const std::string& k = kv.first;
            if (!detail::is_token(k) || detail::iequals(k, "content-length") || detail::iequals(k, "transfer-encoding") ||
                detail::iequals(k, "connection"))
                continue;
            s += k;
            s += ": ";
            for (char ch : kv.second)   // no response splitting through a header value
                if (ch != '\r' && ch != '\n' && ch != '\0') s += ch;
            s += "\r\n";
        }
        auto add_default = [&](const char* name, std::string_view value) {
            if (!res.find_header(name)) { s += name; s += ": "; s += value; s += "\r\n"; }
        };
        if (opt_.cors) {
            add_default("Access-Control-Allow-Origin", "*");
            add_default("Access-Control-Allow-Methods", kDefaultMethods);
            add_default("Access-Control-Allow-Headers", kDefaultAllowHeaders);
        }
        if (!opt_.server_name.empty()) add_default("Server", opt_.server_name);
        bool bodyless = status < 200 || status == 204 || status == 304;
        if (framing == Framing::Length && !bodyless) {
            if (!res.body.empty() && !res.find_header("Content-Type")) s += "Content-Type: text/plain; charset=utf-8\r\n";
            s += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
        }
        if (framing == Framing::Chunked) s += "Transfer-Encoding: chunked\r\n";
        s += keep ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
        s += "\r\n";
        return s;
    }

    Options opt_;
    std::map<std::string, std::map<std::string, Handler>> routes_;
    std::function<bool(const Request&)> auth_;
    std::function<bool(const Request&, Response&)> pre_;
    std::function<void(const Request&, const Response&)> logger_;
    int listen_fd_ = -1;
    int port_ = 0;
    int wake_[2] = {-1, -1};   // self-pipe: stop() wakes the accept loop's poll()
    std::atomic<bool> stopping_{false};
    std::atomic<size_t> active_{0};
    std::list<std::unique_ptr<Conn>> conns_;   // touched by the run() thread only
    std::vector<Lingering> lingering_;         // idem
};

// ---------------------------------------------------------------------------------------------------
// Client: blocking, one connection, keep-alive. Throws std::runtime_error on connection problems,
// timeouts (timeout_ms of inactivity) and malformed responses.

struct ClientResponse {
    int status = 0;
    std::string reason;
    std::string version;
    Headers headers;
    std::string body;
    const std::string* find_header(std::string_view name) const { return detail::find_header(headers, name); }
    std::string header(std::string_view name, std::string_view fallback = {}) const {
        const std::string* v = find_header(name);
        return v ? *v : std::string(fallback);
    }
};

class Client {
public:
    // Gets each piece of the body as it arrives; return false to stop reading (the connection is closed).
    using BodyCallback = std::function<bool(std::string_view)>;

    Client(std::string host, int port, int timeout_ms = 30000)
        : host_(std::move(host)), port_(port), timeout_ms_(timeout_ms), parser_(client_limits(), Parser::Mode::Response) {}
    ~Client() { close(); }
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    void connect() {
        if (fd_ >= 0) return;
        detail::SockAddr addr = detail::make_sockaddr(host_, port_);
        int fd = ::socket(addr.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) throw std::runtime_error(detail::errno_text("socket"));
        if (::connect(fd, reinterpret_cast<sockaddr*>(&addr.ss), addr.len) != 0) {
            int ev = errno == EINPROGRESS ? detail::poll_one(fd, POLLOUT, timeout_ms_) : -1;
            int err = 0;
            socklen_t len = sizeof err;
            if (ev > 0) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (ev <= 0 || err != 0) {
                if (err) errno = err;
                std::string msg = ev == 0 ? "http: connect timed out" : detail::errno_text("connect");
                ::close(fd);
                throw std::runtime_error(msg);
            }
        }
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd_ = fd;
        parser_ = Parser(client_limits(), Parser::Mode::Response);
    }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }
    bool is_open() const { return fd_ >= 0; }
    int fd() const { return fd_; }

    void send_raw(std::string_view data) {
        connect();
        if (!detail::send_all(fd_, data, timeout_ms_)) {
            close();
            throw std::runtime_error("http: send failed");
        }
    }
    void shutdown_write() {
        if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
    }

    ClientResponse request(std::string_view method, std::string_view target, std::string_view body = {},
                           const Headers& headers = {}, const BodyCallback& on_body = {}) {
        std::string msg = std::string(method) + " " + std::string(target) + " HTTP/1.1\r\n";
        bool has_host = detail::find_header(headers, "host") != nullptr;
        if (!has_host) msg += "Host: " + host_ + ":" + std::to_string(port_) + "\r\n";
        for (const auto& kv : headers) msg += kv.first + ": " + kv.second + "\r\n";
        if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH")
            msg += "Content-Length: " + std::to_string(body.size()) + "\r\n";
        msg += "\r\n";
        msg.append(body.data(), body.size());
        send_raw(msg);
        return read_response(on_body, method == "HEAD");
    }

    // Reads one response (1xx interim responses are skipped). Closes the connection when the server
    // said so, or when on_body asked to stop.
    ClientResponse read_response(const BodyCallback& on_body = {}, bool head_request = false) {
        connect();
        parser_.set_no_body(head_request);
        size_t delivered = 0;
        char buf[16384];
        Parser::Result r = parser_.buffered() ? parser_.feed({}) : Parser::Result::NeedMore;
        for (;;) {
            const std::string& body = parser_.request().body;
            if (on_body && body.size() > delivered && parser_.status() >= 200) {
                bool more = on_body(std::string_view(body).substr(delivered));
                delivered = body.size();
                if (!more) {
                    ClientResponse resp = take_response();
                    close();
                    return resp;
                }
            }
            if (r == Parser::Result::Complete) {
                if (parser_.status() < 200) {   // interim (100 Continue): the real one follows
                    parser_.next();
                    parser_.set_no_body(head_request);
                    r = parser_.feed({});
                    continue;
                }
                ClientResponse resp = take_response();
                const std::string* conn = resp.find_header("connection");
                bool keep = resp.version == "HTTP/1.1" ? !(conn && detail::list_has_token(*conn, "close"))
                                                       : (conn && detail::list_has_token(*conn, "keep-alive"));
                bool eof_framed = !resp.find_header("content-length") && !resp.find_header("transfer-encoding") &&
                                  !head_request && resp.status != 204 && resp.status != 304;
                parser_.next();
                if (!keep || eof_framed) close();
                return resp;
            }
            if (r == Parser::Result::Error) {
                std::string msg = "http: bad response: " + parser_.error_message();
                close();
                throw std::runtime_error(msg);
            }
            int ev = detail::poll_one(fd_, POLLIN, timeout_ms_);
            if (ev == 0) { close(); throw std::runtime_error("http: response timed out"); }
            if (ev < 0) { close(); throw std::runtime_error(detail::errno_text("poll")); }
            ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
            if (n <= 0) {
                // EOF or reset: fine for a close-delimited body, otherwise the response is incomplete.
                r = parser_.feed_eof();
                if (r == Parser::Result::Error) {
                    close();
                    throw std::runtime_error("http: connection closed before the response was complete");
                }
                continue;
            }
            r = parser_.feed(std::string_view(buf, size_t(n)));
        }
    }

    // Waits until the server closes the connection, discarding input; true if it did within timeout_ms.
    bool wait_closed(int timeout_ms) {
        if (fd_ < 0) return true;
        auto deadline = detail::deadline_in(timeout_ms);
        char buf[4096];
        for (;;) {
            int ev = detail::poll_one(fd_, POLLIN, detail::ms_until(deadline));
            if (ev <= 0) return false;
            ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                close();
                return true;
            }
        }
    }

private:
    static Limits client_limits() {
        Limits l;
        l.max_body = size_t(1) << 40;   // the client trusts the server's sizes
        return l;
    }
    ClientResponse take_response() {
        ClientResponse resp;
        Request& m = parser_.request();
        resp.status = parser_.status();
        resp.reason = parser_.reason();
        resp.version = m.version;
        resp.headers = m.headers;
        resp.body = m.body;
        return resp;
    }

    std::string host_;
    int port_;
    int timeout_ms_;
    int fd_ = -1;
    Parser parser_;
};

}  // namespace http
