// Small helpers shared by the test files: where the reference data lives, file reading, running the
// built programs.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace testutil {

// ../shared relative to the repository root (tests run from there); LLM_SHARED overrides.
inline std::string shared_dir() {
    const char* env = std::getenv("LLM_SHARED");
    return env && *env ? env : "../shared";
}

inline std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline bool file_exists(const std::string& path) { return std::ifstream(path).good(); }

// Runs a shell command, returns its exit status and (optionally) its standard output.
inline int run(const std::string& cmd, std::string* out = nullptr) {
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) s.append(buf, n);
    int rc = pclose(p);
    if (out) *out = s;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline std::vector<std::string> list_dir(const std::string& dir, const std::string& suffix) {
    std::string out;
    run("ls -1 '" + dir + "' 2>/dev/null", &out);
    std::vector<std::string> names;
    std::stringstream ss(out);
    std::string line;
    while (std::getline(ss, line)) {
        if (line.size() >= suffix.size() && line.compare(line.size() - suffix.size(), suffix.size(), suffix) == 0) {
            names.push_back(line);
        }
    }
    return names;
}

}  // namespace testutil
