// Read bandwidth of this host as the decode roofline sees it: T threads stream-sum disjoint parts of a
// buffer far larger than the caches (default 2 threads, 512 MiB), best of 5 passes, in GB/s. The buffer
// asks for transparent huge pages, as the engine's repacked weights do (llm::advise_huge_pages).
//
// The figure is the best of stream-sum.hpp's loops (scalar, AVX2 and AVX-512 loads: narrow loads can
// under-read a core's bandwidth); `-v` prints each loop's figure.
//
//   g++ -O2 -pthread -o build/bandwidth-probe scripts/bandwidth-probe.cpp && build/bandwidth-probe [THREADS] [MiB] [-v]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include "stream-sum.hpp"

int main(int argc, char** argv) {
    std::vector<const char*> pos;
    bool verbose = false;
    for (int i = 1; i < argc; i++) (strcmp(argv[i], "-v") == 0 ? (void)(verbose = true) : pos.push_back(argv[i]));
    const int threads = pos.size() > 0 ? std::max(1, atoi(pos[0])) : 2;
    const size_t mib = pos.size() > 1 ? (size_t)std::max(64, atoi(pos[1])) : 512;
    const size_t n = mib * (1 << 20) / sizeof(uint64_t);
    const size_t huge = 2 << 20;
    uint64_t* buf = (uint64_t*)aligned_alloc(huge, (n * sizeof(uint64_t) + huge - 1) / huge * huge);
    if (!buf) return 1;
    madvise(buf, n * sizeof(uint64_t), MADV_HUGEPAGE);  // best effort, before the first write
    for (size_t i = 0; i < n; i++) buf[i] = i;  // touch every page before timing
    std::vector<uint64_t> sums(threads * 8);  // a cache line per thread
    double best_gbs = 0;
    uint64_t check = 0;
    for (const stream_sum::Loop& loop : stream_sum::available_loops()) {
        double best = 1e30;
        for (int pass = 0; pass < 5; pass++) {
            const auto t0 = std::chrono::steady_clock::now();
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; t++) {
                pool.emplace_back([&, t] {
                    const size_t b = n * t / threads / 32 * 32, e = t + 1 == threads ? n / 32 * 32 : n * (t + 1) / threads / 32 * 32;
                    sums[t * 8] = loop.sum(buf, b, e);
                });
            }
            for (auto& th : pool) th.join();
            best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        const double gbs = n / 32 * 32 * sizeof(uint64_t) / best / 1e9;
        if (verbose) fprintf(stderr, "bandwidth-probe: %-6s %.1f GB/s\n", loop.name, gbs);
        best_gbs = std::max(best_gbs, gbs);
        for (int t = 0; t < threads; t++) check += sums[t * 8];
    }
    free(buf);
    printf("%.1f\n", best_gbs);
    fprintf(stderr, "bandwidth-probe: %d threads, %zu MiB, checksum %llu\n", threads, mib, (unsigned long long)check);
    return 0;
}
