// Small helpers every unit of llm-server uses (see util.hpp).
#include "util.hpp"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>

namespace srv {

namespace {
std::mutex g_log_mu;
int g_log_verbosity = 3;
FILE* g_log_file = nullptr;

int level_number(char level) { return level == 'E' ? 1 : level == 'W' ? 2 : level == 'I' ? 3 : 4; }
}  // namespace

void set_log_options(int verbosity, const std::string& file) {
    g_log_verbosity = verbosity;
    if (file.empty()) return;
    g_log_file = fopen(file.c_str(), "a");
    if (!g_log_file) throw std::runtime_error("cannot open --log-file " + file);
}

bool log_enabled(char level) { return level_number(level) <= g_log_verbosity; }

void log_msg(char level, const char* fmt, ...) {
    if (!log_enabled(level)) return;
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    tm t;
    gmtime_r(&ts.tv_sec, &t);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &t);
    std::lock_guard<std::mutex> lock(g_log_mu);
    for (FILE* f : {stderr, g_log_file}) {
        if (!f) continue;
        fprintf(f, "%s.%03dZ %c %s\n", stamp, (int)(ts.tv_nsec / 1000000), level, msg);
        fflush(f);
    }
}

double now_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

double mib(size_t bytes) { return bytes / (1024.0 * 1024.0); }

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

size_t incomplete_utf8_tail(const std::string& s) {
    for (size_t i = 1; i <= std::min<size_t>(4, s.size()); i++) {
        unsigned char c = (unsigned char)s[s.size() - i];
        if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > i ? i : 0;
    }
    return 0;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t n = 0, m = std::min(a.size(), b.size());
    while (n < m && a[n] == b[n]) n++;
    return n;
}

}  // namespace srv
