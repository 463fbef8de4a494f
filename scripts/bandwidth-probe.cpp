// Read bandwidth of this host as the decode roofline sees it: T threads stream-sum disjoint parts of a
// buffer far larger than the caches (default 2 threads, 512 MiB), best of 5 passes, in GB/s. The buffer
// asks for transparent huge pages, as the engine's repacked weights do (llm::advise_huge_pages).
//
// The figure is the best of stream-sum.hpp's loops (scalar, AVX2 and AVX-512 loads: narrow loads can
// under-read a core's bandwidth); `-v` prints each loop's figure.
//
//   g++ -O2 -pthread -o build/bandwidth-probe scripts/bandwidth-probe.cpp && build/bandwidth-probe [THREADS] [MiB] [-v]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "stream-sum.hpp"

int main(int argc, char** argv) {
    std::vector<const char*> pos;
    bool verbose = false;
    for (int i = 1; i < argc; i++) (strcmp(argv[i], "-v") == 0 ? (void)(verbose = true) : pos.push_back(argv[i]));
    const int threads = pos.size() > 0 ? std::max(1, atoi(pos[0])) : 2;
    const size_t mib = pos.size() > 1 ? (size_t)std::max(64, atoi(pos[1])) : 512;
    const stream_sum::Buffer buffer(mib << 20);
    if (!buffer.data) return 1;
    double best_gbs = 0;
    uint64_t check = 0;
    for (const stream_sum::Loop& loop : stream_sum::available_loops()) {
        double gbs = 0;
        for (int pass = 0; pass < 5; pass++) gbs = std::max(gbs, buffer.gbs(loop, threads, 1, check));
        if (verbose) fprintf(stderr, "bandwidth-probe: %-6s %.1f GB/s\n", loop.name, gbs);
        best_gbs = std::max(best_gbs, gbs);
    }
    printf("%.1f\n", best_gbs);
    fprintf(stderr, "bandwidth-probe: %d threads, %zu MiB, checksum %llu\n", threads, mib, (unsigned long long)check);
    return 0;
}
