// The llm-server child process and the small HTTP helpers the server tests share (test_server.cpp,
// test_webui.cpp, ...): ./llm-server runs on 127.0.0.1 (port 0, the bound port is read from its log) and
// the tests talk to it over real sockets with http::Client.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../http.hpp"
#include "util.hpp"

namespace testserver {

using json = nlohmann::json;
inline const char* kModel = "models/SmolLM2-135M-Instruct-Q4_1.gguf";

inline double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A server child process. argv is the command (normally ./llm-server ...); its stdout and stderr go
// to a log file, from which the port is read ("listening on 127.0.0.1:PORT").
struct ServerProcess {
    pid_t pid = -1;
    int port = 0;
    std::string log_path;

    explicit ServerProcess(std::vector<std::string> argv, bool wait_healthy = true) {
        REQUIRE_MESSAGE(testutil::file_exists(kModel), kModel << " is missing: run scripts/setup");
        char tmpl[] = "/tmp/llm-server-test-XXXXXX";
        int fd = mkstemp(tmpl);
        REQUIRE(fd >= 0);
        log_path = tmpl;
        pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            std::vector<char*> args;
            for (auto& a : argv) args.push_back(a.data());
            args.push_back(nullptr);
            execvp(args[0], args.data());
            _exit(127);
        }
        close(fd);
        const std::string key = "listening on 127.0.0.1:";
        for (double t0 = now_s(); port == 0; std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
            std::string l = log();
            size_t at = l.find(key);
            if (at != std::string::npos && l.find('\n', at) != std::string::npos) port = atoi(l.c_str() + at + key.size());
            int st;
            if (port == 0 && (waitpid(pid, &st, WNOHANG) == pid || now_s() - t0 > 30)) {
                pid = -1;
                FAIL("server did not start:\n" << l);
            }
        }
        if (wait_healthy) wait_health();
    }
    ~ServerProcess() {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        unlink(log_path.c_str());
    }
    std::string log() const {
        try { return testutil::read_file(log_path); } catch (...) { return ""; }
    }
    void wait_health() {
        for (double t0 = now_s();; std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
            try {
                http::Client c("127.0.0.1", port, 5000);
                if (c.request("GET", "/health").status == 200) return;
            } catch (const std::exception&) {
            }
            REQUIRE_MESSAGE(now_s() - t0 < 60, "server not healthy:\n" << log());
        }
    }
    // Sends sig and waits for the exit; returns the exit status (-1: killed by a signal or timeout).
    int stop(int sig, double timeout_s = 30) {
        kill(pid, sig);
        for (double t0 = now_s(); now_s() - t0 < timeout_s; std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                pid = -1;
                return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            }
        }
        return -1;
    }
};

inline std::vector<std::string> server_cmd(std::vector<std::string> extra) {
    std::vector<std::string> a = {"./llm-server", "-m", kModel, "--host", "127.0.0.1", "--port", "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
}

struct Reply {
    int status = 0;
    json body;
    std::string raw;
    http::ClientResponse resp;
};

inline Reply call(int port, const std::string& method, const std::string& path, const std::string& body = "", const http::Headers& h = {}) {
    http::Client c("127.0.0.1", port, 60000);
    Reply r;
    r.resp = c.request(method, path, body, h);
    r.status = r.resp.status;
    r.raw = r.resp.body;
    r.body = json::parse(r.raw, nullptr, false);
    return r;
}
inline Reply post(int port, const std::string& path, const json& body, const http::Headers& h = {}) { return call(port, "POST", path, body.dump(), h); }
inline Reply get(int port, const std::string& path, const http::Headers& h = {}) { return call(port, "GET", path, "", h); }

// A streamed request: the JSON of each "data:" event, and how many reads delivered events.
struct Stream {
    int status = 0;
    std::vector<json> events;
    bool done = false;  // saw "data: [DONE]"
    std::string raw;
};

inline Stream post_stream(int port, const std::string& path, const json& body, const std::function<void(const json&)>& on_event = {}) {
    http::Client c("127.0.0.1", port, 60000);
    Stream s;
    std::string buf;
    auto resp = c.request("POST", path, body.dump(), {}, [&](std::string_view piece) {
        buf += piece;
        s.raw += piece;
        size_t end;
        while ((end = buf.find("\n\n")) != std::string::npos) {
            std::string ev = buf.substr(0, end);
            buf.erase(0, end + 2);
            if (ev.rfind("data: ", 0) != 0) continue;
            if (ev == "data: [DONE]") { s.done = true; continue; }
            s.events.push_back(json::parse(ev.substr(6)));
            if (on_event) on_event(s.events.back());
        }
        return true;
    });
    s.status = resp.status;
    return s;
}

}  // namespace testserver
