// Router mode (see router.hpp).
#include "router.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../http.hpp"
#include "api.hpp"
#include "server.hpp"
#include "util.hpp"

namespace srv {

namespace {

using json = nlohmann::json;

enum class Status { Unloaded, Loading, Loaded, Failed };

const char* status_name(Status s) {
    switch (s) {
        case Status::Unloaded: return "unloaded";
        case Status::Loading: return "loading";
        case Status::Loaded: return "loaded";
        case Status::Failed: return "failed";
    }
    return "";
}

// One model the router serves, and its child process while it runs.
struct Model {
    std::string name, path;
    std::vector<std::string> flags;  // from the preset: --key value ...
    Status status = Status::Unloaded;
    std::string reason;              // why it failed
    pid_t pid = -1;
    int port = 0;
    bool stopping = false;           // an unload, not a crash
    uint64_t last_used = 0;
    double load_ms = 0;
    std::thread reader;              // forwards the child's log, then reaps it
};

// A preset file: section -> ordered (key, value); "*" holds the defaults.
std::map<std::string, std::vector<std::pair<std::string, std::string>>> read_ini(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read --models-preset " + path);
    std::map<std::string, std::vector<std::pair<std::string, std::string>>> out;
    std::string line, section;
    auto trim = [](std::string s) {
        const size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
        return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    for (int n = 1; std::getline(in, line); n++) {
        line = trim(line);
        if (line.empty() || line[0] == '#' || line[0] == ';') continue;
        if (line[0] == '[') {
            if (line.back() != ']') throw std::runtime_error(path + ":" + std::to_string(n) + ": bad section header");
            section = trim(line.substr(1, line.size() - 2));
            out[section];
            continue;
        }
        const size_t eq = line.find('=');
        if (eq == std::string::npos || section.empty()) throw std::runtime_error(path + ":" + std::to_string(n) + ": expected key = value in a section");
        out[section].emplace_back(trim(line.substr(0, eq)), trim(line.substr(eq + 1)));
    }
    return out;
}

// A preset key (a long flag name without dashes) as command-line arguments; "model" is -m.
void preset_flag(Model& m, const std::string& key, const std::string& value) {
    if (key == "model" || key == "m") { m.path = value; return; }
    const std::string flag = "--" + key;
    const int arity = flag_arity(flag);
    if (arity < 0) throw std::runtime_error("preset [" + m.name + "]: unknown key '" + key + "'");
    const bool off = value == "0" || value == "false" || value == "off" || value == "disabled";
    if (arity == 0) {
        if (!off) m.flags.push_back(flag);
        return;
    }
    m.flags.push_back(flag);
    m.flags.push_back(value);
}

std::vector<std::unique_ptr<Model>> discover(const ServerOptions& so) {
    std::vector<std::unique_ptr<Model>> models;
    auto find = [&](const std::string& name) -> Model& {
        for (auto& m : models) if (m->name == name) return *m;
        models.push_back(std::make_unique<Model>());
        models.back()->name = name;
        return *models.back();
    };
    if (!so.models_dir.empty()) {
        DIR* d = opendir(so.models_dir.c_str());
        if (!d) throw std::runtime_error("cannot read --models-dir " + so.models_dir);
        std::vector<std::string> files;
        while (dirent* e = readdir(d)) {
            const std::string f = e->d_name;
            if (ends_with(f, ".gguf")) files.push_back(f);
        }
        closedir(d);
        std::sort(files.begin(), files.end());
        for (const std::string& f : files) find(f.substr(0, f.size() - 5)).path = so.models_dir + "/" + f;
    }
    if (!so.models_preset.empty()) {
        auto ini = read_ini(so.models_preset);
        for (auto& [section, keys] : ini) {
            if (section == "*") continue;
            Model& m = find(section);
            for (auto& [k, v] : ini["*"]) preset_flag(m, k, v);
            for (auto& [k, v] : keys) preset_flag(m, k, v);
        }
    }
    for (auto& m : models)
        if (m->path.empty()) throw std::runtime_error("model '" + m->name + "' has no file (preset key 'model')");
    return models;
}

// The router's own arguments, less the router's flags and the address: what every child inherits.
std::vector<std::string> inherited_args(int argc, char** argv) {
    static const char* own[] = {"--models-dir", "--models-preset", "--models-max", "--models-autoload", "--no-models-autoload",
                                "--host", "--port"};
    std::vector<std::string> out;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const int arity = std::max(0, flag_arity(a));
        if (std::find(std::begin(own), std::end(own), a) != std::end(own)) {
            i += arity;
            continue;
        }
        out.push_back(a);
        for (int k = 0; k < arity && i + 1 < argc; k++) out.push_back(argv[++i]);
    }
    return out;
}

class Router {
public:
    Router(const Options& o, int argc, char** argv)
        : o_(o), models_(discover(o.srv)), inherited_(inherited_args(argc, argv)) {}
    ~Router() {
        for (auto& m : models_) unload(*m);
    }

    void install(http::Server& srv);

private:
    Model* find(const std::string& name) {
        for (auto& m : models_) if (m->name == name) return m.get();
        return nullptr;
    }
    int ensure_loaded(Model& m, bool autoload);
    void start(Model& m);  // under mu_
    void unload(Model& m);
    void read_child(Model& m, int fd);
    void proxy(const http::Request& req, http::Response& res);
    json models_json();

    const Options& o_;
    std::vector<std::unique_ptr<Model>> models_;
    const std::vector<std::string> inherited_;
    std::mutex mu_;
    std::condition_variable cv_;
    uint64_t clock_ = 0;
};

// Starts the child: this binary with the inherited arguments, the preset's and the model's, on a free
// loopback port that its log reports. Called with mu_ held; the reader thread takes it from there.
void Router::start(Model& m) {
    std::vector<std::string> args = {"/proc/self/exe"};
    args.insert(args.end(), inherited_.begin(), inherited_.end());
    args.insert(args.end(), m.flags.begin(), m.flags.end());
    for (const char* a : {"-m", m.path.c_str(), "--host", "127.0.0.1", "--port", "0", "--alias", m.name.c_str()}) args.push_back(a);
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + strerror(errno));
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error(std::string("fork: ") + strerror(errno));
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(out[1], 2);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv(argv[0], argv.data());
        _exit(127);
    }
    close(out[1]);
    m.pid = pid;
    m.port = 0;
    m.status = Status::Loading;
    m.stopping = false;
    m.reason.clear();
    if (m.reader.joinable()) m.reader.join();
    m.reader = std::thread([this, &m, fd = out[0]] { read_child(m, fd); });
    log_msg('I', "router: starting '%s' (pid %d): %s", m.name.c_str(), (int)pid, m.path.c_str());
}

// The child's log, line by line, into the router's (prefixed); its "ready" line makes the model
// loaded. At end of output the child is reaped: a death the router did not ask for is a failure.
void Router::read_child(Model& m, int fd) {
    const double t0 = now_seconds();
    std::string buf, last_error;
    char chunk[4096];
    for (ssize_t n; (n = read(fd, chunk, sizeof chunk)) > 0;) {
        buf.append(chunk, (size_t)n);
        for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
            const std::string line = buf.substr(0, nl);
            fprintf(stderr, "[%s] %s\n", m.name.c_str(), line.c_str());
            if (line.find(" E ") != std::string::npos || line.rfind("error:", 0) == 0) last_error = line;
            const size_t at = line.find("listening on 127.0.0.1:");
            std::lock_guard<std::mutex> lock(mu_);
            if (at != std::string::npos) m.port = atoi(line.c_str() + at + 23);
            if (line.find(" I ready: ") != std::string::npos && m.status == Status::Loading) {
                m.status = Status::Loaded;
                m.load_ms = (now_seconds() - t0) * 1000;
                log_msg('I', "router: '%s' loaded in %.0f ms (port %d)", m.name.c_str(), m.load_ms, m.port);
                cv_.notify_all();
            }
        }
    }
    close(fd);
    int st = 0;
    waitpid(m.pid, &st, 0);
    std::lock_guard<std::mutex> lock(mu_);
    if (m.stopping) {
        m.status = Status::Unloaded;
    } else {
        m.status = Status::Failed;
        m.reason = WIFSIGNALED(st) ? std::string("killed by signal ") + std::to_string(WTERMSIG(st)) + " (" + strsignal(WTERMSIG(st)) + ")"
                                   : "exited with status " + std::to_string(WEXITSTATUS(st));
        if (!last_error.empty()) m.reason += ": " + last_error;
        log_msg('W', "router: '%s' %s", m.name.c_str(), m.reason.c_str());
    }
    m.pid = -1;
    m.port = 0;
    cv_.notify_all();
}

// The port of a running child, starting it (and stopping the least recently used one past
// --models-max) when needed. Throws ApiError when it cannot be served.
int Router::ensure_loaded(Model& m, bool autoload) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        if (m.status == Status::Loaded) {
            m.last_used = ++clock_;
            return m.port;
        }
        if (m.status == Status::Loading) {
            cv_.wait(lock);
            continue;
        }
        if (!autoload) throw ApiError(400, "model '" + m.name + "' is not loaded", "invalid_request_error");
        if (m.status == Status::Failed && m.pid > 0) {  // dead, being reaped
            cv_.wait(lock);
            continue;
        }
        int running = 0;
        Model* lru = nullptr;
        for (auto& x : models_) {
            if (x->status != Status::Loaded && x->status != Status::Loading) continue;
            running++;
            if (x->status == Status::Loaded && (!lru || x->last_used < lru->last_used)) lru = x.get();
        }
        if (o_.srv.models_max > 0 && running >= o_.srv.models_max && lru) {
            log_msg('I', "router: --models-max %d reached: unloading '%s' (least recently used)", o_.srv.models_max, lru->name.c_str());
            lock.unlock();
            unload(*lru);
            lock.lock();
            continue;
        }
        start(m);
        cv_.wait(lock, [&] { return m.status != Status::Loading; });
        if (m.status != Status::Loaded)
            throw ApiError(503, "model '" + m.name + "' failed to load: " + m.reason, "unavailable_error");
    }
}

// Stops a child (SIGTERM, then SIGKILL after the grace period) and waits for it.
void Router::unload(Model& m) {
    std::unique_lock<std::mutex> lock(mu_);
    if (m.pid > 0) {
        m.stopping = true;
        kill(m.pid, SIGTERM);
        if (!cv_.wait_for(lock, std::chrono::seconds(o_.srv.shutdown_grace_s + 5), [&] { return m.pid < 0; }) && m.pid > 0) {
            kill(m.pid, SIGKILL);
            cv_.wait(lock, [&] { return m.pid < 0; });
        }
    }
    if (m.status != Status::Failed) m.status = Status::Unloaded;
    lock.unlock();
    if (m.reader.joinable()) m.reader.join();
}

json Router::models_json() {
    std::lock_guard<std::mutex> lock(mu_);
    json data = json::array();
    for (auto& m : models_) {
        json status{{"value", status_name(m->status)}};
        if (m->status == Status::Failed) status["reason"] = m->reason;
        if (m->status == Status::Loaded) status["load_ms"] = m->load_ms;
        data.push_back(json{{"id", m->name}, {"object", "model"}, {"owned_by", "llamacpp"}, {"path", m->path}, {"status", status}});
    }
    return json{{"object", "list"}, {"data", data}};
}

// Forwards a request to its model's child; a streamed answer (stream: true) is relayed as it comes.
void Router::proxy(const http::Request& req, http::Response& res) {
    json body;
    std::string name = req.param("model");
    if (req.method == "POST") {
        body = json::parse(req.body, nullptr, false);
        if (body.is_object() && body.contains("model") && body["model"].is_string()) name = body["model"].get<std::string>();
    }
    if (name.empty()) throw ApiError(400, "\"model\" is required in router mode (the body's \"model\", or ?model= for GET)");
    Model* m = find(name);
    if (!m) throw ApiError(404, "model '" + name + "' not found", "not_found_error");
    const std::string autoload = req.param("autoload");
    const int port = ensure_loaded(*m, autoload.empty() ? o_.srv.models_autoload : autoload == "true" || autoload == "1");
    http::Headers headers;
    for (const char* h : {"content-type", "authorization", "x-api-key"})
        if (const std::string* v = req.find_header(h)) headers.emplace_back(h, *v);
    const std::string target = req.target;
    if (body.is_object() && body.value("stream", false)) {
        const std::string payload = req.body;
        res.stream([port, target, payload, headers, method = req.method](http::Writer& w) {
            http::Client c("127.0.0.1", port, 600000);
            c.request(method, target, payload, headers, [&](std::string_view piece) { return w.write(piece); });
            return true;
        });
        return;
    }
    http::Client c("127.0.0.1", port, 600000);
    http::ClientResponse r;
    try {
        r = c.request(req.method, target, req.body, headers);
    } catch (const std::runtime_error& e) {  // the child went away mid-request
        throw ApiError(502, "model '" + name + "': " + e.what(), "server_error");
    }
    const std::string* type = http::detail::find_header(r.headers, "content-type");
    res.status = r.status;
    res.set_content(r.body, type ? *type : "application/json");
}

void Router::install(http::Server& srv) {
    const auto& wrap = guarded;
    auto health = [](const http::Request&, http::Response& res) { res.set_json("{\"status\":\"ok\"}"); };
    srv.route("GET", "/health", health);
    srv.route("GET", "/v1/health", health);
    for (const char* p : {"/models", "/v1/models"})
        srv.route("GET", p, wrap([this](const http::Request&, http::Response& r) { r.set_json(models_json().dump()); }));
    auto named = [this](const http::Request& req) -> Model& {
        json b = json::parse(req.body, nullptr, false);
        const std::string name = b.is_object() && b.contains("model") && b["model"].is_string() ? b["model"].get<std::string>() : "";
        Model* m = find(name);
        if (!m) throw ApiError(name.empty() ? 400 : 404, name.empty() ? "\"model\" is required" : "model '" + name + "' not found");
        return *m;
    };
    srv.route("POST", "/models/load", wrap([this, named](const http::Request& q, http::Response& r) {
        ensure_loaded(named(q), true);
        r.set_json("{\"success\":true}");
    }));
    srv.route("POST", "/models/unload", wrap([this, named](const http::Request& q, http::Response& r) {
        unload(named(q));
        r.set_json("{\"success\":true}");
    }));
    for (const char* p : {"/completion", "/completions", "/v1/completions", "/chat/completions", "/v1/chat/completions", "/infill",
                          "/tokenize", "/detokenize", "/apply-template", "/embedding", "/embeddings", "/v1/embeddings", "/rerank",
                          "/reranking", "/v1/rerank", "/v1/reranking"})
        srv.route("POST", p, wrap([this](const http::Request& q, http::Response& r) { proxy(q, r); }));
    for (const char* p : {"/props", "/slots", "/metrics"})
        srv.route("GET", p, wrap([this](const http::Request& q, http::Response& r) { proxy(q, r); }));
}

}  // namespace

bool wants_router(const Options& o) { return o.model.empty() && (!o.srv.models_dir.empty() || !o.srv.models_preset.empty()); }

int run_router(const Options& o, int argc, char** argv) {
    std::unique_ptr<Router> router;
    try {
        router = std::make_unique<Router>(o, argc, argv);
    } catch (const std::exception& e) {
        log_msg('E', "router: %s", e.what());
        return 1;
    }
    http::Options ho;
    ho.host = o.srv.host;
    ho.port = o.srv.port;
    ho.write_timeout_ms = o.srv.timeout_s * 1000;
    ho.shutdown_grace_ms = o.srv.shutdown_grace_s * 1000;
    ho.max_connections = o.srv.max_connections;
    ho.server_name = "llm-server";
    http::Server srv(ho);
    router->install(srv);
    try {
        srv.listen();
    } catch (const std::exception& e) {
        log_msg('E', "%s", e.what());
        return 1;
    }
    log_msg('I', "listening on %s:%d", o.srv.host.c_str(), srv.port());
    log_msg('I', "router mode: %s%s%s", o.srv.models_dir.c_str(), o.srv.models_dir.empty() || o.srv.models_preset.empty() ? "" : ", ",
            o.srv.models_preset.c_str());
    stop_on_signals(srv);
    srv.run();
    router.reset();  // stops every child
    log_msg('I', "router stopped");
    return 0;
}

}  // namespace srv
