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

// Builds GGUF images byte by byte, so tests can write well-formed files and then break them.
struct GGUFBuilder {
    std::string b;
    template <class T> GGUFBuilder& put(T v) { b.append((const char*)&v, sizeof v); return *this; }
    GGUFBuilder& str(const std::string& s) { put<uint64_t>(s.size()); b += s; return *this; }
    GGUFBuilder& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
        b += "GGUF";
        return put(version).put(n_tensors).put(n_kv);
    }
    GGUFBuilder& kv_u32(const std::string& k, uint32_t v) { return str(k).put<uint32_t>(4).put(v); }
    GGUFBuilder& kv_str(const std::string& k, const std::string& v) { return str(k).put<uint32_t>(8).str(v); }
    GGUFBuilder& kv_f32(const std::string& k, float v) { return str(k).put<uint32_t>(6).put(v); }
    GGUFBuilder& kv_bool(const std::string& k, bool v) { return str(k).put<uint32_t>(7).put<uint8_t>(v); }
    GGUFBuilder& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
        str(name).put<uint32_t>((uint32_t)ne.size());
        for (uint64_t x : ne) put(x);
        return put(type).put(offset);
    }
    GGUFBuilder& pad(size_t align = 32) { while (b.size() % align) b += '\0'; return *this; }
    GGUFBuilder& zeros(size_t n) { b.append(n, '\0'); return *this; }
};

inline void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace testutil
