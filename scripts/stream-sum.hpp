// The streaming sums of scripts/bandwidth-probe.cpp and bench-kernels' one-thread line: loops that
// read a buffer once, each with independent sums so the loads overlap, 64-bit scalar loads, 256-bit AVX2
// loads and, where the CPU has them, 512-bit AVX-512 loads. A loop of narrow loads can under-read a
// core's bandwidth (on an Emerald Rapids-class Xeon in KVM one thread of the scalar loop read 11.5 GB/s,
// 512-bit loads 17.4), so a roofline takes the best of them (docs/performance.md, session 17).
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stream_sum {

// Each loop sums words [b, e) of buf (b and e multiples of 64 bytes) and returns a checksum.
inline uint64_t sum_scalar(const uint64_t* buf, size_t b, size_t e) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = b; i < e; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
    return s0 + s1 + s2 + s3;
}

__attribute__((target("avx2"))) inline uint64_t sum_avx2(const uint64_t* buf, size_t b, size_t e) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = b; i < e; i += 16) {  // two lines per step
        const __m256i* p = (const __m256i*)(buf + i);
        s0 = _mm256_add_epi64(s0, _mm256_load_si256(p));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256(p + 1));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256(p + 2));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256(p + 3));
    }
    alignas(32) uint64_t v[4];
    _mm256_store_si256((__m256i*)v, _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
    return v[0] + v[1] + v[2] + v[3];
}

__attribute__((target("avx512f"))) inline uint64_t sum_avx512(const uint64_t* buf, size_t b, size_t e) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = b; i < e; i += 32) {  // four lines per step
        const __m512i* p = (const __m512i*)(buf + i);
        s0 = _mm512_add_epi64(s0, _mm512_load_si512(p));
        s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + 1));
        s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + 2));
        s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + 3));
    }
    return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
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

}  // namespace stream_sum
