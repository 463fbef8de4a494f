// Read bandwidth of this host as the decode roofline sees it: T threads stream-sum disjoint parts of a
// buffer far larger than the caches (default 2 threads, 512 MiB), best of 5 passes, in GB/s. The buffer
// asks for transparent huge pages, as the engine's repacked weights do (llm::advise_huge_pages).
//
//   g++ -O2 -pthread -o build/bandwidth-probe scripts/bandwidth-probe.cpp && build/bandwidth-probe [THREADS] [MiB]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <sys/mman.h>

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::max(1, atoi(argv[1])) : 2;
    const size_t mib = argc > 2 ? (size_t)std::max(64, atoi(argv[2])) : 512;
    const size_t n = mib * (1 << 20) / sizeof(uint64_t);
    const size_t huge = 2 << 20;
    uint64_t* buf = (uint64_t*)aligned_alloc(huge, (n * sizeof(uint64_t) + huge - 1) / huge * huge);
    if (!buf) return 1;
    madvise(buf, n * sizeof(uint64_t), MADV_HUGEPAGE);  // best effort, before the first write
    for (size_t i = 0; i < n; i++) buf[i] = i;  // touch every page before timing
    std::vector<uint64_t> sums(threads * 8);     // a cache line per thread
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; t++) {
            pool.emplace_back([&, t] {
                const size_t b = n * t / threads, e = n * (t + 1) / threads;
                uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;  // independent chains so the loads overlap
                for (size_t i = b; i + 4 <= e; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
                sums[t * 8] = s0 + s1 + s2 + s3;
            });
        }
        for (auto& th : pool) th.join();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    uint64_t check = 0;
    for (int t = 0; t < threads; t++) check += sums[t * 8];
    free(buf);
    printf("%.1f\n", n * sizeof(uint64_t) / best / 1e9);
    fprintf(stderr, "bandwidth-probe: %d threads, %zu MiB, checksum %llu\n", threads, mib, (unsigned long long)check);
    return 0;
}
