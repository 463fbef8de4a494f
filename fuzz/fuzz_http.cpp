// libFuzzer target for http.hpp's message parser (no sockets involved).
//
// Input: one control byte, then the bytes of the stream.
//   bit 0     response mode (the client's parser) instead of request mode
//   bit 1     tiny limits, so that the 413/414/431 paths are reached with short inputs
//   bits 2-7  piece size for the incremental run (1..64 bytes per feed)
// Checks, beyond the sanitizers: feeding the stream in pieces gives exactly the same messages and the
// same error as feeding it at once (so no decision depends on where a read() happened to end); every
// message respects the limits; percent_decode and json_escape behave (the latter always yields valid
// UTF-8 without raw control characters).
#include "../http.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct Outcome {
    std::vector<std::string> messages;   // a digest of each complete message
    int error_status = 0;
    std::string error_message;
    bool operator==(const Outcome& o) const {
        return messages == o.messages && error_status == o.error_status && error_message == o.error_message;
    }
};

void check(bool ok) {
    if (!ok) std::abort();
}

std::string digest(const http::Parser& p, const http::Limits& lim, bool response) {
    const http::Request& r = p.request();
    check(r.body.size() <= lim.max_body);
    check(r.headers.size() <= lim.max_headers);
    std::string d = r.method + '\n' + r.target + '\n' + r.path + '\n' + r.query_string + '\n' + r.version + '\n' +
                    std::to_string(p.status()) + ' ' + p.reason() + '\n' + (r.keep_alive ? "ka\n" : "close\n");
    if (!response) {
        check(r.target.size() <= lim.max_request_line);
        check(!r.path.empty());
        check(r.version == "HTTP/1.1" || r.version == "HTTP/1.0");
    }
    for (const auto& q : r.query) d += q.first + '=' + q.second + '&';
    for (const auto& h : r.headers) {
        check(!h.first.empty());
        for (char c : h.first) check(http::detail::is_tchar(static_cast<unsigned char>(c)) && !(c >= 'A' && c <= 'Z'));
        check(h.second.empty() || (h.second.front() != ' ' && h.second.back() != ' '));
        d += h.first + ':' + h.second + '\n';
    }
    return d + '\n' + r.body;
}

// Feeds `pieces` in order; after each complete message moves on to the next one (pipelining), at most
// 16 messages. EOF at the end (it completes a close-delimited response body).
Outcome run(const std::vector<std::string_view>& pieces, const http::Limits& lim, bool response) {
    http::Parser p(lim, response ? http::Parser::Mode::Response : http::Parser::Mode::Request);
    Outcome out;
    using R = http::Parser::Result;
    const size_t kMaxMessages = 16;   // the same cap for both runs: stop parsing at once when reached
    auto drain = [&](R r) {
        while (r == R::Complete) {
            out.messages.push_back(digest(p, lim, response));
            if (out.messages.size() == kMaxMessages) return R::Complete;
            p.next();
            r = p.feed({});
        }
        return r;
    };
    R r = R::NeedMore;
    for (std::string_view piece : pieces) {
        r = drain(p.feed(piece));
        if (r != R::NeedMore) break;
        (void)p.expects_continue();
        (void)p.in_progress();
    }
    if (r == R::NeedMore && response) r = drain(p.feed_eof());
    if (r == R::Error) {
        out.error_status = p.error_status();
        out.error_message = p.error_message();
        check(out.error_status >= 400 && out.error_status <= 599);
    }
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const uint8_t ctl = data[0];
    std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
    const bool response = ctl & 1;
    http::Limits lim;
    if (ctl & 2) {
        lim.max_request_line = 40;
        lim.max_header_bytes = 120;
        lim.max_headers = 4;
        lim.max_body = 64;
    }
    const size_t piece = 1 + (ctl >> 2);

    Outcome whole = run({input}, lim, response);
    std::vector<std::string_view> pieces;
    for (size_t i = 0; i < input.size(); i += piece) pieces.push_back(input.substr(i, piece));
    Outcome split = run(pieces, lim, response);
    check(whole == split);

    // Helpers on arbitrary bytes.
    if (auto dec = http::percent_decode(input, ctl & 4)) check(dec->size() <= input.size());
    std::string js = http::json_escape(input);
    check(http::is_valid_utf8(js));
    for (unsigned char c : js) check(c >= 0x20);
    std::string ej = http::error_json(400, input);
    check(http::is_valid_utf8(ej));
    return 0;
}
