// The streaming sums of scripts/bandwidth-probe.cpp, bench-roofline.cpp and bench-kernels' one-thread
// line, and the buffer the first two stream. The loops read a buffer once, each with independent sums so
// the loads overlap: 64-bit scalar loads, 256-bit AVX2 loads and, where the CPU has them, 512-bit
// AVX-512 loads. A loop of narrow loads can under-read a core's bandwidth (on an Emerald Rapids-class
// Xeon in KVM one thread of the scalar loop read 11.5 GB/s, 512-bit loads 17.4), so a roofline takes the
// best of them (docs/performance.md, session 17).
#pragma once
#include <sys/mman.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace stream_sum {

// Each loop sums words [b, e) of buf (b and e multiples of 64 bytes) and returns a checksum.
inline uint64_t sum_scalar(const uint64_t* buf, size_t b, size_t e) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = b; i < e; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
    return s0 + s1 + s2 + s3;
}

// Four sums of 256- or 512-bit vectors (GCC's vector extension); compiled for the ISA of the wrapper
// that it is inlined into.
typedef uint64_t Vec256 __attribute__((vector_size(32)));
typedef uint64_t Vec512 __attribute__((vector_size(64)));
template <class Vec>
__attribute__((always_inline)) inline uint64_t sum_vectors(const uint64_t* buf, size_t b, size_t e) {
    constexpr size_t kWords = sizeof(Vec) / sizeof(uint64_t);
    Vec s0 = {}, s1 = {}, s2 = {}, s3 = {};
    for (size_t i = b; i < e; i += 4 * kWords) {
        const Vec* p = (const Vec*)(buf + i);
        s0 += p[0], s1 += p[1], s2 += p[2], s3 += p[3];
    }
    const Vec s = (s0 + s1) + (s2 + s3);
    uint64_t total = 0;
    for (size_t j = 0; j < kWords; j++) total += s[j];
    return total;
}
__attribute__((target("avx2"))) inline uint64_t sum_avx2(const uint64_t* buf, size_t b, size_t e) {
    return sum_vectors<Vec256>(buf, b, e);
}
__attribute__((target("avx512f"))) inline uint64_t sum_avx512(const uint64_t* buf, size_t b, size_t e) {
    return sum_vectors<Vec512>(buf, b, e);
}

// The loops this CPU can run.
struct Loop {
    const char* name;
    uint64_t (*sum)(const uint64_t*, size_t, size_t);
};
inline std::vector<Loop> available_loops() {
    std::vector<Loop> loops = {{"scalar", sum_scalar}};
    if (__builtin_cpu_supports("avx2")) loops.push_back({"avx2", sum_avx2});
    if (__builtin_cpu_supports("avx512f")) loops.push_back({"avx512", sum_avx512});
    return loops;
}

// A buffer for threads to stream-sum: on huge pages where the OS grants them (as the engine's repacked
// weights), every page touched before it is timed. `data` is null where the allocation failed.
struct Buffer {
    uint64_t* data;
    size_t n;  // words
    explicit Buffer(size_t bytes) : n(bytes / sizeof(uint64_t)) {
        const size_t huge = 2 << 20;
        data = (uint64_t*)aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
        if (!data) return;
        madvise(data, bytes, MADV_HUGEPAGE);  // best effort, before the first write
        for (size_t i = 0; i < n; i++) data[i] = i;
    }
    ~Buffer() { free(data); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    // GB/s (wall clock) of `passes` passes of `threads` threads summing disjoint parts with `loop`;
    // their sums are added to `check`.
    double gbs(const Loop& loop, int threads, int passes, uint64_t& check) const {
        const auto t0 = std::chrono::steady_clock::now();
        for (int p = 0; p < passes; p++) {
            std::vector<uint64_t> sums(threads * 8);  // a cache line per thread
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; t++)
                pool.emplace_back([&, t] { sums[t * 8] = loop.sum(data, n * t / threads / 32 * 32, n * (t + 1) / threads / 32 * 32); });
            for (auto& th : pool) th.join();
            for (int t = 0; t < threads; t++) check += sums[t * 8];
        }
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return (double)passes * (n / 32 * 32) * sizeof(uint64_t) / seconds / 1e9;
    }
};

}  // namespace stream_sum
