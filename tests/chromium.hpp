// A headless Chromium driven over the DevTools protocol, for the web page's tests.
//
// The transport is --remote-debugging-pipe: the browser reads commands from its fd 3 and writes replies
// and events to its fd 4, each message one JSON text ended by a NUL byte. No WebSocket, no port, no
// third-party code. One page target is opened and attached in flat mode, so page commands carry its
// sessionId. Every wait is bounded; the browser is killed (process group) when the object goes away.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace testutil {

class Chromium {
public:
    using json = nlohmann::json;

    // The chromium binary, or "" when none is installed.
    static std::string find_binary() {
        for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
            if (access(p, X_OK) == 0) return p;
        }
        return "";
    }

    explicit Chromium(const std::string& binary) {
        char tmpl[] = "/tmp/llm-chromium-XXXXXX";
        if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
        profile_dir_ = tmpl;
        int to_browser[2], from_browser[2];
        if (pipe(to_browser) != 0 || pipe(from_browser) != 0) throw std::runtime_error("pipe failed");
        pid_ = fork();
        if (pid_ < 0) throw std::runtime_error("fork failed");
        if (pid_ == 0) exec_browser(binary, profile_dir_, to_browser[0], from_browser[1]);
        close(to_browser[0]);
        close(from_browser[1]);
        out_fd_ = to_browser[1];
        in_fd_ = from_browser[0];
    }

    ~Chromium() {
        if (pid_ > 0) {
            kill(-pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        if (out_fd_ >= 0) close(out_fd_);
        if (in_fd_ >= 0) close(in_fd_);
        std::string cmd = "rm -rf '" + profile_dir_ + "'";
        if (system(cmd.c_str()) != 0) { /* best effort */ }
    }

    Chromium(const Chromium&) = delete;
    Chromium& operator=(const Chromium&) = delete;

    // Opens a blank page and attaches to it; later page commands go to this session.
    void open_page() {
        json t = call("Target.createTarget", {{"url", "about:blank"}}, false);
        json a = call("Target.attachToTarget", {{"targetId", t["targetId"]}, {"flatten", true}}, false);
        session_ = a["sessionId"].get<std::string>();
    }

    // Sends a command (to the page session unless to_page is false) and returns its result; events that
    // arrive meanwhile are kept in events(). A protocol error or a timeout throws.
    json call(const std::string& method, const json& params = json::object(), bool to_page = true, int timeout_ms = 30000) {
        json msg{{"id", ++next_id_}, {"method", method}, {"params", params}};
        if (to_page) msg["sessionId"] = session_;
        std::string text = msg.dump();
        text.push_back('\0');
        for (size_t off = 0; off < text.size();) {
            ssize_t n = write(out_fd_, text.data() + off, text.size() - off);
            if (n <= 0) throw std::runtime_error("chromium: write failed (browser gone?)");
            off += (size_t)n;
        }
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
            json m = read_message(deadline);
            if (m.contains("id") && m["id"] == next_id_) {
                if (m.contains("error")) throw std::runtime_error("chromium: " + method + ": " + m["error"].dump());
                return m.value("result", json::object());
            }
            events_.push_back(std::move(m));
        }
    }

    // Evaluates a JavaScript expression in the page (a promise is awaited) and returns its value.
    json eval(const std::string& expression, int timeout_ms = 30000) {
        json r = call("Runtime.evaluate", {{"expression", expression}, {"awaitPromise", true}, {"returnByValue", true}}, true, timeout_ms);
        if (r.contains("exceptionDetails")) throw std::runtime_error("chromium: page script failed: " + r["exceptionDetails"].dump());
        return r["result"].value("value", json());
    }

    const std::vector<json>& events() const { return events_; }

private:
    [[noreturn]] static void exec_browser(const std::string& binary, const std::string& profile_dir, int cmd_fd, int reply_fd) {
        setpgid(0, 0);  // its helpers (zygote, renderers) die with it
        int cmd_high = fcntl(cmd_fd, F_DUPFD, 16), reply_high = fcntl(reply_fd, F_DUPFD, 16);  // never clobbered below
        dup2(cmd_high, 3);
        dup2(reply_high, 4);
        int devnull = open("/dev/null", O_RDWR);
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        for (int fd = 5; fd < 1024; fd++) close(fd);
        std::string profile = "--user-data-dir=" + profile_dir;
        execl(binary.c_str(), binary.c_str(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
              "--disable-sync", "--disable-component-update", "--remote-debugging-pipe", profile.c_str(), (char*)nullptr);
        _exit(127);
    }

    json read_message(std::chrono::steady_clock::time_point deadline) {
        for (;;) {
            size_t end = buf_.find('\0');
            if (end != std::string::npos) {
                json m = json::parse(buf_.substr(0, end));
                buf_.erase(0, end + 1);
                return m;
            }
            int left = (int)std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
            if (left <= 0) throw std::runtime_error("chromium: no reply in time");
            pollfd p{in_fd_, POLLIN, 0};
            if (poll(&p, 1, left) <= 0) continue;
            char chunk[65536];
            ssize_t n = read(in_fd_, chunk, sizeof chunk);
            if (n <= 0) throw std::runtime_error("chromium: the browser closed its pipe");
            buf_.append(chunk, (size_t)n);
        }
    }

    pid_t pid_ = -1;
    int out_fd_ = -1, in_fd_ = -1;
    int next_id_ = 0;
    std::string session_, buf_, profile_dir_;
    std::vector<json> events_;
};

}  // namespace testutil
