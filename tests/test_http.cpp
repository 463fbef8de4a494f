// http.hpp: parser unit tests, and an in-process server (127.0.0.1, ephemeral port) exercised over real
// sockets with http::Client and raw bytes.
#include <doctest/doctest.h>

#include "../http.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace {

using http::Parser;
using Result = http::Parser::Result;
using namespace std::chrono_literals;

Result parse_all(Parser& p, std::string_view s) { return p.feed(s); }

// A server running on its own thread for the duration of a test.
struct TestServer {
    http::Server srv;
    std::thread th;
    explicit TestServer(http::Options o = options()) : srv(std::move(o)) {}
    static http::Options options() {
        http::Options o;
        o.port = 0;
        o.read_timeout_ms = 5000;
        o.keep_alive_timeout_ms = 5000;
        o.shutdown_grace_ms = 2000;
        return o;
    }
    void start() {
        srv.listen();
        th = std::thread([this] { srv.run(); });
    }
    int port() const { return srv.port(); }
    void stop() {
        srv.stop();
        if (th.joinable()) th.join();
    }
    ~TestServer() { stop(); }
};

// Sends raw bytes on a fresh connection and reads one response.
http::ClientResponse raw_exchange(int port, std::string_view bytes, bool half_close = false) {
    http::Client c("127.0.0.1", port, 5000);
    c.send_raw(bytes);
    if (half_close) c.shutdown_write();
    return c.read_response();
}

// The server must still work after whatever the previous test did to it.
void check_still_serving(int port) {
    http::Client c("127.0.0.1", port, 5000);
    auto r = c.request("GET", "/hello");
    CHECK(r.status == 200);
    CHECK(r.body == "hello");
}

void add_basic_routes(http::Server& s) {
    s.route("GET", "/hello", [](const http::Request&, http::Response& res) { res.set_content("hello", "text/plain"); });
    s.route("POST", "/echo", [](const http::Request& req, http::Response& res) {
        res.set_content(req.body, req.header("content-type", "application/octet-stream"));
        res.set_header("X-Query-A", req.param("a"));
        res.set_header("X-Path", req.path);
    });
    s.route("GET", "/peer", [](const http::Request& req, http::Response& res) {
        res.set_content(std::to_string(req.remote_port), "text/plain");
    });
}

bool is_json_error(const std::string& body, int code, std::string_view type) {
    return body.find("{\"error\":{\"code\":" + std::to_string(code) + ",") == 0 &&
           body.find("\"type\":\"" + std::string(type) + "\"") != std::string::npos && http::is_valid_utf8(body);
}

}  // namespace

// ------------------------------------------------------------------------------------------------ parser

TEST_CASE("http parser: simple GET with query and case-insensitive headers") {
    Parser p;
    REQUIRE(parse_all(p, "GET /v1/models?a=1&b=x%20y+z&a=2&flag HTTP/1.1\r\nHost: x\r\nX-Thing:   v  \r\n\r\n") == Result::Complete);
    const http::Request& r = p.request();
    CHECK(r.method == "GET");
    CHECK(r.path == "/v1/models");
    CHECK(r.query_string == "a=1&b=x%20y+z&a=2&flag");
    CHECK(r.param("a") == "1");   // first occurrence wins
    CHECK(r.param("b") == "x y z");
    CHECK(r.has_param("flag"));
    CHECK(r.header("x-thing") == "v");
    CHECK(r.header("X-THING") == "v");
    CHECK(r.keep_alive);
    CHECK(r.body.empty());
}

TEST_CASE("http parser: byte-by-byte feeding gives the same result, and pipelining keeps the rest") {
    std::string two = "POST /a%2Fb HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.0\r\n\r\n";
    Parser p;
    Result r = Result::NeedMore;
    size_t i = 0;
    for (; i < two.size() && r == Result::NeedMore; ++i) r = p.feed(two.substr(i, 1));
    REQUIRE(r == Result::Complete);
    CHECK(p.request().path == "/a/b");
    CHECK(p.request().body == "hello");
    p.feed(std::string_view(two).substr(i));
    p.next();
    REQUIRE(p.feed({}) == Result::Complete);
    CHECK(p.request().path == "/next");
    CHECK(p.request().version == "HTTP/1.0");
    CHECK_FALSE(p.request().keep_alive);
}

TEST_CASE("http parser: chunked bodies") {
    Parser p;
    std::string req = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    REQUIRE(p.feed(req) == Result::Complete);
    CHECK(p.request().body == "hello world");
    CHECK_FALSE(p.request().has_header("x-trailer"));   // trailers are dropped

    Parser q;
    CHECK(q.feed("POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") == Result::Error);
    CHECK(q.error_status() == 501);
    Parser r;
    CHECK(r.feed("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n") == Result::Error);
    CHECK(r.error_status() == 400);
    Parser s;
    CHECK(s.feed("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n") == Result::Error);
    CHECK(s.error_status() == 400);
    Parser t;
    CHECK(t.feed("POST /x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") == Result::Error);
    CHECK(t.error_status() == 400);
    Parser u;   // chunk data not followed by CRLF
    CHECK(u.feed("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n") == Result::Error);
    http::Limits small;
    small.max_body = 8;
    Parser v(small);
    CHECK(v.feed("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5\r\n") == Result::Error);
    CHECK(v.error_status() == 413);
    Parser w(small);
    CHECK(w.feed("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffffff\r\n") == Result::Error);
    CHECK(w.error_status() == 413);
}

TEST_CASE("http parser: Content-Length validation") {
    auto status_of = [](std::string headers) {
        Parser p;
        Result r = p.feed("POST /x HTTP/1.1\r\n" + headers + "\r\n");
        return r == Result::Error ? p.error_status() : r == Result::Complete ? 0 : -1;
    };
    CHECK(status_of("Content-Length: abc\r\n") == 400);
    CHECK(status_of("Content-Length: -1\r\n") == 400);
    CHECK(status_of("Content-Length: +5\r\n") == 400);
    CHECK(status_of("Content-Length: 1 2\r\n") == 400);
    CHECK(status_of("Content-Length:\r\n") == 400);
    CHECK(status_of("Content-Length: 5\r\nContent-Length: 6\r\n") == 400);
    CHECK(status_of("Content-Length: 5, 6\r\n") == 400);
    CHECK(status_of("Content-Length: 0, 0\r\n") == 0);
    CHECK(status_of("Content-Length: 0\r\nContent-Length: 00\r\n") == 0);
    CHECK(status_of("Content-Length: 99999999999999999999999999\r\n") == 413);
    CHECK(status_of("Content-Length: 16777217\r\n") == 413);
    CHECK(status_of("Content-Length: 16777216\r\n") == -1);   // allowed, waits for the body
}

TEST_CASE("http parser: malformed requests") {
    auto status_of = [](std::string_view s) {
        Parser p;
        Result r = p.feed(s);
        return r == Result::Error ? p.error_status() : r == Result::Complete ? 0 : -1;
    };
    CHECK(status_of("GET / HTTP/1.1\r\nX: a\r\n  folded\r\n\r\n") == 400);   // obs-fold
    CHECK(status_of("GET / HTTP/1.1\r\nX : a\r\n\r\n") == 400);              // space before colon
    CHECK(status_of("GET / HTTP/1.1\r\nNoColon\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n") == 400);            // bare CR
    CHECK(status_of("GET / HTTP/1.1\r\nX: a\x01\r\n\r\n") == 400);
    CHECK(status_of("GET  / HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("GET /\r\n\r\n") == 400);
    CHECK(status_of("GET / HTTP/2.0\r\n\r\n") == 505);
    CHECK(status_of("GET / FTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("G@T / HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("GET nopath HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("GET * HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("OPTIONS * HTTP/1.1\r\n\r\n") == 0);
    CHECK(status_of("GET /a%zz HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("GET /a%00 HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("GET /?q=%4 HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of("GET /\xff\xfe HTTP/1.1\r\n\r\n") == 400);
    CHECK(status_of(std::string_view("\0\x01\x02garbage", 10)) == 400);     // fails before any newline
    CHECK(status_of("POST / HTTP/1.1\r\nExpect: magic\r\nContent-Length: 1\r\n\r\n") == 417);
    CHECK(status_of("GET / HTTP/1.1\n\n") == 0);                             // bare LF tolerated
    CHECK(status_of("\r\n\r\nGET / HTTP/1.1\r\n\r\n") == 0);                 // leading blank lines skipped
    CHECK(status_of("GET http://example.com/p?x=1 HTTP/1.1\r\n\r\n") == 0);
    Parser abs;
    abs.feed("GET http://example.com:80/p%41?x=1 HTTP/1.1\r\n\r\n");
    CHECK(abs.request().path == "/pA");
    CHECK(abs.request().param("x") == "1");
}

TEST_CASE("http parser: limits") {
    auto status_of = [](std::string_view s) {
        Parser p;
        Result r = p.feed(s);
        return r == Result::Error ? p.error_status() : r == Result::Complete ? 0 : -1;
    };
    std::string long_target(9000, 'a');
    CHECK(status_of("GET /" + long_target + " HTTP/1.1\r\n\r\n") == 414);
    CHECK(status_of("GET /" + long_target) == 414);   // detected before the line ends
    CHECK(status_of("GET /" + std::string(8000, 'a') + " HTTP/1.1\r\n\r\n") == 0);
    std::string many;
    for (int i = 0; i < 101; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
    CHECK(status_of("GET / HTTP/1.1\r\n" + many + "\r\n") == 431);
    CHECK(status_of("GET / HTTP/1.1\r\nX: " + std::string(33000, 'v') + "\r\n\r\n") == 431);
    CHECK(status_of("GET / HTTP/1.1\r\nX: " + std::string(33000, 'v')) == 431);   // before the line ends
    http::Limits l;
    l.max_body = 10;
    Parser p(l);
    CHECK(p.feed("POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n") == Result::Error);
    CHECK(p.error_status() == 413);
}

TEST_CASE("http parser: Expect 100-continue and connection tokens") {
    Parser p;
    CHECK(p.feed("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n") == Result::NeedMore);
    CHECK(p.expects_continue());
    CHECK(p.feed("abc") == Result::Complete);
    Parser q;
    q.feed("GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n");
    CHECK_FALSE(q.request().keep_alive);
    Parser r;
    r.feed("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    CHECK(r.request().keep_alive);
}

TEST_CASE("http helpers: percent_decode, json_escape, error_json") {
    CHECK(*http::percent_decode("a%20b+c") == "a b+c");
    CHECK(*http::percent_decode("a%20b+c", true) == "a b c");
    CHECK_FALSE(http::percent_decode("%").has_value());
    CHECK_FALSE(http::percent_decode("%a").has_value());
    CHECK_FALSE(http::percent_decode("%gg").has_value());
    CHECK(http::json_escape("a\"b\\c\n\x01") == "\"a\\\"b\\\\c\\n\\u0001\"");
    CHECK(http::json_escape("h\xc3\xa9") == "\"h\xc3\xa9\"");
    CHECK(http::json_escape("\xff\xc3") == "\"\\ufffd\\ufffd\"");
    CHECK(http::json_escape("\xed\xa0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");   // surrogate
    CHECK(http::error_json(404, "nope") == "{\"error\":{\"code\":404,\"message\":\"nope\",\"type\":\"not_found_error\"}}");
    CHECK(http::error_json(500, "x").find("server_error") != std::string::npos);
}

// ------------------------------------------------------------------------------------------------ server

TEST_CASE("http server: GET/POST round trips, keep-alive, HEAD, HTTP/1.0") {
    TestServer ts;
    add_basic_routes(ts.srv);
    ts.start();
    REQUIRE(ts.port() > 0);

    http::Client c("127.0.0.1", ts.port());
    auto r1 = c.request("GET", "/hello");
    CHECK(r1.status == 200);
    CHECK(r1.body == "hello");
    CHECK(r1.header("content-type") == "text/plain");
    CHECK(r1.header("access-control-allow-origin") == "*");
    CHECK(c.is_open());

    std::string big(200000, 'x');   // larger than one socket read and the single-send threshold
    for (size_t i = 0; i < big.size(); i += 7) big[i] = char('a' + i % 26);
    auto r2 = c.request("POST", "/echo?a=%C3%A9", big, {{"Content-Type", "application/json"}});
    CHECK(r2.status == 200);
    CHECK(r2.body == big);
    CHECK(r2.header("content-type") == "application/json");
    CHECK(r2.header("x-query-a") == "\xc3\xa9");

    // Two requests on one connection: the server sees the same client port.
    auto p1 = c.request("GET", "/peer");
    auto p2 = c.request("GET", "/peer");
    CHECK(p1.body == p2.body);
    CHECK(c.is_open());

    auto h = c.request("HEAD", "/hello");
    CHECK(h.status == 200);
    CHECK(h.header("content-length") == "5");
    CHECK(h.body.empty());

    // Connection: close is honoured.
    auto r3 = c.request("GET", "/hello", {}, {{"Connection", "close"}});
    CHECK(r3.header("connection") == "close");
    CHECK_FALSE(c.is_open());

    // HTTP/1.0 closes unless keep-alive was asked for.
    http::Client c10("127.0.0.1", ts.port());
    c10.send_raw("GET /hello HTTP/1.0\r\n\r\n");
    auto r4 = c10.read_response();
    CHECK(r4.body == "hello");
    CHECK(c10.wait_closed(2000));
    http::Client c10k("127.0.0.1", ts.port());
    c10k.send_raw("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    CHECK(c10k.read_response().header("connection") == "keep-alive");
    CHECK_FALSE(c10k.wait_closed(200));

    // Pipelined requests in one packet, a chunked request body, and Expect: 100-continue.
    http::Client pc("127.0.0.1", ts.port());
    pc.send_raw("GET /hello HTTP/1.1\r\n\r\nPOST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    CHECK(pc.read_response().body == "hello");
    CHECK(pc.read_response().body == "abc");
    pc.send_raw("POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
    std::this_thread::sleep_for(50ms);
    pc.send_raw("body");
    auto rc = pc.read_response();   // the interim 100 is skipped by the client
    CHECK(rc.status == 200);
    CHECK(rc.body == "body");
}

TEST_CASE("http server: chunked streaming arrives incrementally; disconnect stops the writer") {
    TestServer ts;
    std::mutex mu;
    std::condition_variable cv;
    bool first_seen = false;
    std::atomic<int> write_failed{0};
    ts.srv.route("GET", "/stream", [&](const http::Request&, http::Response& res) {
        res.stream([&](http::Writer& w) {
            if (!w.write("data: one\n\n")) return false;
            {
                // The second chunk is only written once the client has received the first one: if the
                // server buffered the stream, this would wait until the timeout and the test would fail.
                std::unique_lock<std::mutex> lock(mu);
                if (!cv.wait_for(lock, 3s, [&] { return first_seen; })) return false;
            }
            if (!w.write("data: two\n\n")) return false;
            w.write("");   // no-op, must not terminate the stream
            return w.write("data: [DONE]\n\n");
        });
    });
    ts.srv.route("GET", "/forever", [&](const http::Request&, http::Response& res) {
        res.stream([&](http::Writer& w) {
            for (int i = 0; i < 100000; ++i) {
                if (!w.write(std::string(1000, 'x') + "\n")) { write_failed = 1; return false; }
                std::this_thread::sleep_for(1ms);
            }
            return true;
        });
    });
    ts.start();

    http::Client c("127.0.0.1", ts.port());
    std::vector<std::string> pieces;
    auto r = c.request("GET", "/stream", {}, {}, [&](std::string_view piece) {
        pieces.emplace_back(piece);
        if (piece.find("one") != std::string_view::npos) {
            std::lock_guard<std::mutex> lock(mu);
            first_seen = true;
            cv.notify_all();
        }
        return true;
    });
    CHECK(r.status == 200);
    CHECK(r.header("content-type") == "text/event-stream");
    CHECK(r.header("transfer-encoding") == "chunked");
    CHECK(r.body == "data: one\n\ndata: two\n\ndata: [DONE]\n\n");
    CHECK(pieces.size() >= 2);
    CHECK(c.is_open());   // a finished stream keeps the connection
    CHECK(c.request("GET", "/stream").status == 200);

    // The client hangs up mid-stream: write() returns false soon after.
    http::Client d("127.0.0.1", ts.port());
    size_t got = 0;
    d.request("GET", "/forever", {}, {}, [&](std::string_view piece) { got += piece.size(); return got < 20000; });
    CHECK_FALSE(d.is_open());
    for (int i = 0; i < 300 && !write_failed; ++i) std::this_thread::sleep_for(10ms);
    CHECK(write_failed == 1);
}

TEST_CASE("http server: oversized and malformed requests get 4xx and the server keeps serving") {
    http::Options o = TestServer::options();
    o.limits.max_body = 1000;
    TestServer ts(o);
    add_basic_routes(ts.srv);
    ts.start();
    int port = ts.port();

    CHECK(raw_exchange(port, "GET /" + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n").status == 414);
    std::string many;
    for (int i = 0; i < 150; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
    CHECK(raw_exchange(port, "GET /hello HTTP/1.1\r\n" + many + "\r\n").status == 431);
    CHECK(raw_exchange(port, "GET /hello HTTP/1.1\r\nX: " + std::string(40000, 'v') + "\r\n\r\n").status == 431);

    // Body too large: answered from the headers, even while the client keeps sending.
    {
        http::Client c("127.0.0.1", port, 5000);
        c.send_raw("POST /echo HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + std::string(3000, 'b'));
        auto r = c.read_response();
        CHECK(r.status == 413);
        CHECK(is_json_error(r.body, 413, "invalid_request_error"));
    }
    {
        http::Client c("127.0.0.1", port, 5000);
        auto r = c.request("POST", "/echo", std::string(1001, 'b'));
        CHECK(r.status == 413);
    }
    auto ok = raw_exchange(port, "POST /echo HTTP/1.1\r\nContent-Length: 1000\r\n\r\n" + std::string(1000, 'b'));
    CHECK(ok.status == 200);
    CHECK(ok.body.size() == 1000);

    auto garbage = raw_exchange(port, "this is not http\r\n\r\n");
    CHECK(garbage.status == 400);
    CHECK(is_json_error(garbage.body, 400, "invalid_request_error"));
    CHECK(garbage.header("connection") == "close");
    std::string junk;
    for (int i = 0; i < 4096; ++i) junk += char((i * 7919 + 13) & 0xFF);
    CHECK(raw_exchange(port, junk).status == 400);
    CHECK(raw_exchange(port, "GET /hello HTTP/1.1\r\nHost: x\r\n", /*half_close=*/true).status == 400);   // truncated
    CHECK(raw_exchange(port, "POST /echo HTTP/1.1\r\nContent-Length: -5\r\n\r\n").status == 400);
    CHECK(raw_exchange(port, "POST /echo HTTP/1.1\r\nContent-Length: 5x\r\n\r\n").status == 400);
    CHECK(raw_exchange(port, "POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd").status == 400);
    CHECK(raw_exchange(port, "GET /\xc3\x28\xff HTTP/1.1\r\n\r\n").status == 400);   // raw invalid UTF-8 in the path
    auto enc = raw_exchange(port, "GET /%C3%28%FF%22 HTTP/1.1\r\n\r\n");             // percent-encoded invalid UTF-8
    CHECK(enc.status == 404);
    CHECK(is_json_error(enc.body, 404, "not_found_error"));   // still valid JSON/UTF-8
    CHECK(raw_exchange(port, "GET / HTTP/3.0\r\n\r\n").status == 505);
    CHECK(raw_exchange(port, "POST /echo HTTP/1.1\r\nTransfer-Encoding: br\r\n\r\n").status == 400);
    CHECK(raw_exchange(port, "POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").status == 501);
    check_still_serving(port);
}

TEST_CASE("http server: slow and idle clients time out") {
    http::Options o = TestServer::options();
    o.read_timeout_ms = 300;
    o.keep_alive_timeout_ms = 300;
    TestServer ts(o);
    add_basic_routes(ts.srv);
    ts.start();
    int port = ts.port();

    auto t0 = std::chrono::steady_clock::now();
    {   // Partial headers, then silence: 408.
        http::Client c("127.0.0.1", port, 5000);
        c.send_raw("GET /hello HTTP/1.1\r\nHost: x\r\n");
        auto r = c.read_response();
        CHECK(r.status == 408);
    }
    {   // Slowloris: a byte every 50 ms does not extend the deadline.
        http::Client c("127.0.0.1", port, 5000);
        std::string req = "GET /hello HTTP/1.1\r\nX-Slow: " + std::string(100, 'z') + "\r\n\r\n";
        bool cut = false;
        for (char ch : req) {
            try {
                c.send_raw(std::string(1, ch));
            } catch (const std::exception&) {
                cut = true;
                break;
            }
            std::this_thread::sleep_for(50ms);
            if (http::detail::poll_one(c.fd(), POLLIN, 0) > 0) { cut = true; break; }
        }
        CHECK(cut);
        if (c.is_open()) CHECK(c.read_response().status == 408);
    }
    {   // A connection that never sends anything is closed silently.
        http::Client c("127.0.0.1", port, 5000);
        c.connect();
        CHECK(c.wait_closed(2000));
    }
    {   // An idle keep-alive connection is closed after keep_alive_timeout_ms.
        http::Client c("127.0.0.1", port, 5000);
        CHECK(c.request("GET", "/hello").status == 200);
        CHECK(c.wait_closed(2000));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 8s);
    check_still_serving(port);
}

// A handler that holds its connection busy until release(): a client that cannot be evicted.
struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    std::atomic<int> entered{0};
    void add_route(http::Server& s) {
        s.route("POST", "/block", [this](const http::Request&, http::Response& res) {
            entered++;
            std::unique_lock<std::mutex> lock(mu);
            cv.wait_for(lock, 10s, [this] { return open; });
            res.set_content("done", "text/plain");
        });
    }
    void release() {
        std::lock_guard<std::mutex> lock(mu);
        open = true;
        cv.notify_all();
    }
    void wait_entered(int n) {
        for (int i = 0; i < 500 && entered < n; ++i) std::this_thread::sleep_for(10ms);
    }
};

// A started test server with the basic routes and a Gate.
struct GatedServer {
    Gate gate;        // outlives the server: handlers may still wait in it while it stops
    TestServer ts;
    explicit GatedServer(http::Options o) : ts(std::move(o)) {
        add_basic_routes(ts.srv);
        gate.add_route(ts.srv);
        ts.start();
    }
    int port() const { return ts.port(); }
    // A client whose request waits in the gate until release(): a connection that cannot be evicted.
    std::thread busy_client(std::string body = "x") {
        return std::thread([this, body] {
            http::Client x("127.0.0.1", port());
            CHECK(x.request("POST", "/block", body).status == 200);
        });
    }
};

// A raw connection from a chosen loopback source address (Linux routes all of 127.0.0.0/8 to lo).
int connect_from(const char* source, int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, source, &src.sin_addr);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) == 0);
    http::detail::SockAddr dst = http::detail::make_sockaddr("127.0.0.1", port);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&dst.ss), dst.len) == 0);
    return fd;
}

// Status of one GET /hello sent on fd (0 when the server closed without an answer).
int status_of_get(int fd, const char* path = "/hello") {
    std::string req = std::string("GET ") + path + " HTTP/1.1\r\nConnection: close\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) < 0) return 0;
    std::string got;
    char buf[4096];
    for (ssize_t n; http::detail::poll_one(fd, POLLIN, 3000) > 0 && (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
    ::close(fd);
    return got.size() > 12 ? std::atoi(got.c_str() + 9) : 0;
}

TEST_CASE("http server: busy connections beyond max_connections get 503; idle ones make room") {
    http::Options o = TestServer::options();
    o.max_connections = 2;
    o.max_connections_per_client = 2;
    GatedServer gs(o);
    int port = gs.port();

    {   // Two idle keep-alive connections fill the pool, but a third client evicts the longest idle one.
        http::Client a("127.0.0.1", port), b("127.0.0.1", port);
        CHECK(a.request("GET", "/hello").status == 200);
        std::this_thread::sleep_for(20ms);
        CHECK(b.request("GET", "/hello").status == 200);
        http::Client c("127.0.0.1", port);
        CHECK(c.request("GET", "/hello").status == 200);
        CHECK(a.wait_closed(2000));   // the oldest idle one went
        CHECK(b.request("GET", "/hello").status == 200);
    }
    for (int i = 0; i < 200 && gs.ts.srv.active_connections() > 0; ++i) std::this_thread::sleep_for(10ms);

    // Two busy connections cannot be evicted: the next one gets 503 (and /health-like priority paths
    // would still be answered, see below).
    std::thread t1 = gs.busy_client(), t2 = gs.busy_client();
    gs.gate.wait_entered(2);
    http::Client c("127.0.0.1", port);
    auto r = c.request("GET", "/hello");
    CHECK(r.status == 503);
    CHECK(is_json_error(r.body, 503, "unavailable_error"));
    CHECK_FALSE(c.is_open());
    gs.gate.release();
    t1.join();
    t2.join();
    check_still_serving(port);
}

TEST_CASE("http server: one client address cannot take every connection") {
    http::Options o = TestServer::options();
    o.max_connections = 8;
    o.max_connections_per_client = 2;
    GatedServer gs(o);
    int port = gs.port();
    std::thread t1 = gs.busy_client(), t2 = gs.busy_client();
    gs.gate.wait_entered(2);
    CHECK(status_of_get(connect_from("127.0.0.1", port)) == 503);   // its limit is reached
    CHECK(status_of_get(connect_from("127.0.0.2", port)) == 200);   // another address is served
    gs.gate.release();
    t1.join();
    t2.join();
}

TEST_CASE("http server: /health and /metrics answer within 1 s while 64 idle and 100 trickling connections are open") {
    http::Options o = TestServer::options();   // max_connections 64, per client 32
    o.read_timeout_ms = 20000;
    TestServer ts(o);
    add_basic_routes(ts.srv);
    std::atomic<int> health_calls{0};
    ts.srv.route("GET", "/health", [&](const http::Request&, http::Response& res) {
        health_calls++;
        res.set_json("{\"status\":\"ok\"}");
    });
    ts.srv.route("GET", "/metrics", [](const http::Request&, http::Response& res) { res.set_content("up 1\n", "text/plain"); });
    ts.start();
    int port = ts.port();

    std::vector<std::unique_ptr<http::Client>> idle, trickling;
    for (int i = 0; i < 64; ++i) {
        idle.push_back(std::make_unique<http::Client>("127.0.0.1", port, 5000));
        idle.back()->connect();
    }
    for (int i = 0; i < 100; ++i) {
        trickling.push_back(std::make_unique<http::Client>("127.0.0.1", port, 5000));
        try { trickling.back()->send_raw("GET /hello HTTP/1.1\r\nX-Slow: "); } catch (const std::exception&) {}
    }
    std::atomic<bool> done{false};
    std::thread trickle([&] {   // one byte per connection every 500 ms: never a complete request
        while (!done) {
            for (auto& t : trickling)
                if (t->is_open()) (void)!::send(t->fd(), "z", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            for (int i = 0; i < 50 && !done; ++i) std::this_thread::sleep_for(10ms);
        }
    });
    std::this_thread::sleep_for(300ms);   // let the server take them all in
    for (int round = 0; round < 3; ++round) {
        for (const char* path : {"/health", "/metrics"}) {
            CAPTURE(path);
            auto t0 = std::chrono::steady_clock::now();
            http::Client c("127.0.0.1", port, 2000);
            auto r = c.request("GET", path);
            CHECK(r.status == 200);
            CHECK(std::chrono::steady_clock::now() - t0 < 1s);
        }
    }
    CHECK(health_calls == 3);
    // Ordinary requests are refused while the pool is full of busy connections, and quickly.
    auto t0 = std::chrono::steady_clock::now();
    http::Client c("127.0.0.1", port, 2000);
    CHECK(c.request("GET", "/hello").status == 503);
    CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    // The idle connections were closed to make room for the others.
    int closed = 0;
    for (auto& i : idle) closed += i->wait_closed(0);
    CHECK(closed >= 32);
    done = true;
    trickle.join();
    trickling.clear();
    idle.clear();
    for (int i = 0; i < 300 && ts.srv.active_connections() > 0; ++i) std::this_thread::sleep_for(10ms);
    check_still_serving(port);
}

TEST_CASE("http server: the bytes of all requests in flight are bounded") {
    http::Options o = TestServer::options();
    o.max_bytes_in_flight = 1 << 20;
    GatedServer gs(o);
    int port = gs.port();
    const std::string body(600 * 1024, 'b');
    std::thread first = gs.busy_client(body);
    gs.gate.wait_entered(1);
    {   // 600 KB are held by the blocked request: another 600 KB do not fit in 1 MB.
        http::Client x("127.0.0.1", port);
        auto r = x.request("POST", "/echo", body);
        CHECK(r.status == 503);
        CHECK(r.body.find("in flight") != std::string::npos);
    }
    gs.gate.release();
    first.join();
    // Released once the response is out (the client may see it a moment before): fits again.
    http::ClientResponse r;
    for (int i = 0; i < 20; ++i) {
        http::Client x("127.0.0.1", port);
        r = x.request("POST", "/echo", body);
        if (r.status != 503) break;
        std::this_thread::sleep_for(50ms);
    }
    CHECK(r.status == 200);
    CHECK(r.body.size() == body.size());
}

TEST_CASE("http server: 404/405 JSON errors, CORS, OPTIONS, auth, handler exceptions") {
    TestServer ts;
    add_basic_routes(ts.srv);
    ts.srv.route("GET", "/health", [](const http::Request&, http::Response& res) { res.set_json("{\"status\":\"ok\"}"); });
    ts.srv.route("GET", "/throw", [](const http::Request&, http::Response&) { throw std::runtime_error("boom \"quoted\""); });
    ts.srv.route("GET", "/throw-int", [](const http::Request&, http::Response&) { throw 42; });
    ts.srv.set_auth([](const http::Request& r) {
        return r.path == "/health" || r.header("authorization") == "Bearer secret";
    });
    std::atomic<int> logged{0};
    ts.srv.set_logger([&](const http::Request&, const http::Response&) { ++logged; });
    ts.start();
    http::Headers auth = {{"Authorization", "Bearer secret"}};

    http::Client c("127.0.0.1", ts.port());
    auto nf = c.request("GET", "/nope", {}, auth);
    CHECK(nf.status == 404);
    CHECK(nf.header("content-type") == "application/json; charset=utf-8");
    CHECK(is_json_error(nf.body, 404, "not_found_error"));
    CHECK(nf.header("access-control-allow-origin") == "*");

    auto na = c.request("DELETE", "/hello", {}, auth);
    CHECK(na.status == 405);
    CHECK(is_json_error(na.body, 405, "invalid_request_error"));
    CHECK(na.header("allow") == "GET, HEAD, OPTIONS");
    CHECK(c.is_open());   // errors from handlers/routing keep the connection

    auto pre = c.request("OPTIONS", "/echo", {},
                         {{"Origin", "http://x"}, {"Access-Control-Request-Method", "POST"},
                          {"Access-Control-Request-Headers", "authorization, content-type"}});
    CHECK(pre.status == 204);
    CHECK(pre.body.empty());
    CHECK(pre.header("access-control-allow-origin") == "*");
    CHECK(pre.header("access-control-allow-methods") == "POST, OPTIONS");
    CHECK(pre.header("access-control-allow-headers") == "authorization, content-type");
    CHECK(c.request("OPTIONS", "*").status == 204);

    auto unauth = c.request("GET", "/hello");
    CHECK(unauth.status == 401);
    CHECK(is_json_error(unauth.body, 401, "authentication_error"));
    CHECK(c.request("GET", "/hello", {}, {{"Authorization", "Bearer wrong"}}).status == 401);
    CHECK(c.request("GET", "/health").status == 200);
    CHECK(c.request("GET", "/hello", {}, auth).status == 200);

    auto ex = c.request("GET", "/throw", {}, auth);
    CHECK(ex.status == 500);
    CHECK(is_json_error(ex.body, 500, "server_error"));
    CHECK(ex.body.find("boom \\\"quoted\\\"") != std::string::npos);
    CHECK(c.request("GET", "/throw-int", {}, auth).status == 500);
    CHECK(c.request("GET", "/hello", {}, auth).body == "hello");
    CHECK(logged.load() >= 10);
}

TEST_CASE("http server: stop() lets an in-flight request finish") {
    TestServer ts;
    std::atomic<bool> entered{false};
    ts.srv.route("GET", "/slow", [&](const http::Request&, http::Response& res) {
        entered = true;
        std::this_thread::sleep_for(300ms);
        res.set_content("done", "text/plain");
    });
    add_basic_routes(ts.srv);
    ts.start();
    int port = ts.port();

    http::Client idle("127.0.0.1", port);   // an idle keep-alive connection must not delay shutdown
    CHECK(idle.request("GET", "/hello").status == 200);

    http::ClientResponse r;
    std::thread client([&] {
        http::Client c("127.0.0.1", port);
        r = c.request("GET", "/slow");
    });
    for (int i = 0; i < 200 && !entered; ++i) std::this_thread::sleep_for(5ms);
    REQUIRE(entered);
    auto t0 = std::chrono::steady_clock::now();
    ts.srv.stop();
    ts.th.join();
    auto took = std::chrono::steady_clock::now() - t0;
    client.join();
    CHECK(r.status == 200);
    CHECK(r.body == "done");
    CHECK(r.header("connection") == "close");
    CHECK(took < 1500ms);
    CHECK(idle.wait_closed(1000));
    // Nothing listens any more.
    http::Client late("127.0.0.1", port, 1000);
    CHECK_THROWS(late.request("GET", "/hello"));
}

TEST_CASE("http server: stop() cuts a stream that outlives the grace period") {
    http::Options o = TestServer::options();
    o.shutdown_grace_ms = 200;
    TestServer ts(o);
    std::atomic<bool> streaming{false}, write_failed{false};
    ts.srv.route("GET", "/forever", [&](const http::Request&, http::Response& res) {
        res.stream([&](http::Writer& w) {
            streaming = true;
            while (w.write("data: x\n\n")) std::this_thread::sleep_for(5ms);
            write_failed = true;
            return false;
        });
    });
    ts.start();
    std::thread client([&] {
        http::Client c("127.0.0.1", ts.port());
        try {
            c.request("GET", "/forever");
        } catch (const std::exception&) {   // the stream ends without its terminating chunk
        }
    });
    for (int i = 0; i < 200 && !streaming; ++i) std::this_thread::sleep_for(5ms);
    auto t0 = std::chrono::steady_clock::now();
    ts.stop();
    auto took = std::chrono::steady_clock::now() - t0;
    client.join();
    CHECK(write_failed);
    CHECK(took < 1500ms);
}

TEST_CASE("http server: stop() before run() returns at once; bind errors; IPv6") {
    {
        http::Options o = TestServer::options();
        http::Server s(o);
        s.stop();
        s.run();   // returns immediately
        CHECK(s.port() > 0);
    }
    {
        http::Options o;
        o.host = "example.com";   // no resolver on purpose
        http::Server s(o);
        CHECK_THROWS_AS(s.listen(), std::runtime_error);
    }
    {
        http::Options o = TestServer::options();
        o.host = "::1";
        TestServer ts(o);
        add_basic_routes(ts.srv);
        bool have_v6 = true;
        try {
            ts.start();
        } catch (const std::exception&) {
            have_v6 = false;   // no IPv6 loopback in this environment
        }
        if (have_v6) {
            http::Client c("::1", ts.port());
            CHECK(c.request("GET", "/hello").body == "hello");
        }
    }
}

TEST_CASE("http server: client_connected() notices a client that hung up during a long handler") {
    TestServer ts;
    std::atomic<int> seen{0};   // 1: noticed the disconnect, 2: gave up waiting
    std::atomic<bool> entered{false};
    ts.srv.route("POST", "/long", [&](const http::Request& req, http::Response& res) {
        entered = true;
        CHECK(req.client_connected());
        for (int i = 0; i < 300; ++i) {
            if (!req.client_connected()) { seen = 1; return; }
            std::this_thread::sleep_for(10ms);
        }
        seen = 2;
        res.set_content("late", "text/plain");
    });
    ts.start();
    {
        http::Client c("127.0.0.1", ts.port());
        c.send_raw("POST /long HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
        for (int i = 0; i < 200 && !entered; ++i) std::this_thread::sleep_for(5ms);
    }   // closes the socket
    for (int i = 0; i < 400 && !seen; ++i) std::this_thread::sleep_for(10ms);
    CHECK(seen == 1);
}
