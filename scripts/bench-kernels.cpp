// Kernel microbenchmark of issue 14: matmul_rows_interleaved (the repacked weights of load time) of each
// weight type on each ISA tier, in thread CPU time (best of REPS runs), so the figures hold up on a
// shared host far better than wall-clock ones. Two sizes per type: weights in cache (1024 rows x
// k = 2048, GOP/s = 2 x multiply-adds per second) and weights streamed from memory (rows x k = 2048
// of about 48 MiB, STREAM_MIB: what decode at real sizes does; GB/s of weight bytes read, to set against
// the first line's streaming sum of such a buffer (the best of scripts/stream-sum.hpp's loops), also in
// thread CPU time: one thread's roofline).
//
//   g++ -O2 -std=c++17 -pthread -o build/bench-kernels scripts/bench-kernels.cpp
//   build/bench-kernels [TYPES] [TIERS] [COLUMNS] [REPS]
//   build/bench-kernels "q8_0 q6_K" "avx2 avxvnni avx512" "1 64" 5
// CACHE_ROWS=128 (a multiple of 16) shrinks the in-cache matrix, e.g. to fit in L2; STREAM_MIB=1024
// streams more than the default 48 MiB, beyond an L3 that holds 48 MiB (some Xeons have 300-500 MiB).
#define LLM_IMPLEMENTATION
#include "../llm.hpp"

#include <time.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "stream-sum.hpp"

namespace {

double thread_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::vector<std::string> words(const char* s) {
    std::istringstream in(s);
    std::vector<std::string> v;
    for (std::string w; in >> w;) v.push_back(w);
    return v;
}

// The tier named as LLM_ISA names it; false where this CPU lacks it.
bool select_tier(const std::string& name) {
    for (llm::Isa isa : {llm::Isa::AVX2, llm::Isa::AVXVNNI, llm::Isa::AVX512}) {
        const bool match = name == (isa == llm::Isa::AVX512 ? "avx512" : llm::isa_name(isa)) ||
                           (name == "amx" && isa == llm::Isa::AVX512);
        if (!match) continue;
        if (!llm::isa_supported(isa) || (name == "amx" && !llm::amx_available())) return false;
        llm::isa_set(isa);
        if (llm::amx_available()) llm::amx_set(name == "amx");
        return true;
    }
    return false;
}

struct Matrix {
    llm::Type type;
    int64_t k, rows;
    llm::LineBytes packed;  // on huge pages where the OS grants them, as the engine's repacked weights
};

// Random weights (row 0 quantized from random floats and repeated: quantizing 48 MiB of K-quants
// would take minutes), repacked 16 rows at a time.
Matrix make_matrix(llm::Type t, int64_t k, int64_t rows, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> x(k);
    for (float& v : x) v = normal(rng);
    const size_t rb = llm::row_bytes(t, k);
    std::vector<uint8_t> W(rb * rows);
    llm::quantize_row(t, x.data(), W.data(), k);
    for (int64_t r = 1; r < rows; r++) memcpy(W.data() + r * rb, W.data(), rb);
    Matrix m{t, k, rows, llm::line_bytes(W.size())};
    llm::advise_huge_pages(m.packed.get(), W.size());
    llm::interleave_rows16(t, W.data(), m.packed.get(), k, rows);
    return m;
}

// Best thread CPU seconds of `reps` products of m with `cols` activation columns.
double time_product(const Matrix& m, int64_t cols, int reps, std::mt19937& rng) {
    const llm::Type at = llm::vec_dot_type(m.type);
    const size_t arow = llm::row_bytes(at, m.k);
    std::vector<uint8_t> A(arow * cols);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> a(m.k);
    for (int64_t c = 0; c < cols; c++) {
        for (float& v : a) v = normal(rng);
        llm::quantize_row(at, a.data(), A.data() + c * arow, m.k);
    }
    llm::ActInfo info;
    llm::act_info(at, A.data(), arow, cols, m.k, llm::interleave_needs_sums(m.type), info);
    std::vector<float> out(m.rows * cols);
    // One untimed pass first: without it the first tier's streamed figures read about half the later
    // tiers' (one Q4_K column from L3: 13-19 GB/s, then 30-35 for the same kernel; session 21).
    llm::matmul_rows_interleaved(m.type, m.packed.get(), m.k, 0, m.rows, A.data(), arow, cols, out.data(), m.rows, &info);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = thread_seconds();
        llm::matmul_rows_interleaved(m.type, m.packed.get(), m.k, 0, m.rows, A.data(), arow, cols, out.data(), m.rows, &info);
        best = std::min(best, thread_seconds() - t0);
    }
    return best;
}

// GB/s of the best of stream-sum.hpp's loops over `mib` MiB (as scripts/bandwidth-probe.cpp), best of reps.
double stream_sum_gbs(int reps, int64_t mib) {
    const size_t n = (mib << 20) / sizeof(uint64_t) / 32 * 32;
    llm::LineBytes bytes = llm::line_bytes(n * sizeof(uint64_t));
    llm::advise_huge_pages(bytes.get(), n * sizeof(uint64_t));
    uint64_t* buf = (uint64_t*)bytes.get();
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 1e30;
    uint64_t check = 0;
    for (const stream_sum::Loop& loop : stream_sum::available_loops())
        for (int r = 0; r < reps; r++) {
            const double t0 = thread_seconds();
            check += loop.sum(buf, 0, n);
            best = std::min(best, thread_seconds() - t0);
        }
    if (check == 1) printf("\n");  // keeps the sums
    return 1e-9 * n * sizeof(uint64_t) / best;
}

} // namespace

int main(int argc, char** argv) {
    const std::vector<std::string> types = words(argc > 1 ? argv[1] : "q4_0 q4_1 q5_0 q5_1 q8_0 iq4_nl q2_K q3_K q4_K q5_K q6_K");
    const std::vector<std::string> tiers = words(argc > 2 ? argv[2] : "avx2 avxvnni avx512");
    const std::vector<std::string> columns = words(argc > 3 ? argv[3] : "1 64");
    const int reps = argc > 4 ? std::max(1, atoi(argv[4])) : 5;
    std::mt19937 rng(1);
    const int64_t k = 2048, cache_rows = getenv("CACHE_ROWS") ? std::max(16, atoi(getenv("CACHE_ROWS")) / 16 * 16) : 1024;
    const int64_t stream_mib = getenv("STREAM_MIB") ? std::max(1, atoi(getenv("STREAM_MIB"))) : 48;
    printf("CPU kernels, one thread, thread CPU time (best of %d); in cache: %lld x %lld; streamed: ~%lld MiB\n", reps,
           (long long)cache_rows, (long long)k, (long long)stream_mib);
    printf("one thread's streaming sum of %lld MiB: %.2f GB/s\n", (long long)stream_mib, stream_sum_gbs(reps, stream_mib));
    printf("| type | tier | columns | in cache GOP/s | streamed GOP/s | streamed GB/s |\n|---|---|---:|---:|---:|---:|\n");
    for (const std::string& name : types) {
        const llm::Type t = llm::type_from_name(name);
        const size_t rb = llm::row_bytes(t, k);
        const int64_t stream_rows = ((stream_mib << 20) / (int64_t)rb + 15) / 16 * 16;
        const Matrix small = make_matrix(t, k, cache_rows, rng), large = make_matrix(t, k, stream_rows, rng);
        for (const std::string& tier : tiers) {
            if (!select_tier(tier)) {
                printf("| %s | %s | | (not on this CPU) | | |\n", name.c_str(), tier.c_str());
                continue;
            }
            for (const std::string& col : columns) {
                const int64_t cols = atoll(col.c_str());
                const double in_cache = time_product(small, cols, reps, rng);
                const double streamed = time_product(large, std::min<int64_t>(cols, 8), std::max(2, reps / 2), rng);
                printf("| %s | %s | %lld | %.1f | %.1f | %.2f |\n", name.c_str(), tier.c_str(), (long long)cols,
                       2e-9 * k * cache_rows * cols / in_cache, 2e-9 * k * stream_rows * std::min<int64_t>(cols, 8) / streamed,
                       1e-9 * rb * stream_rows / streamed);
                fflush(stdout);
            }
        }
    }
}
