// The interleaved matmul kernels alone (matmul_rows_interleaved): one thread, 512 rows x k 2048 of
// every interleaved type (in cache) times N activation columns, thread CPU time (holds up on a busy
// host far better than wall clock), best of 7 rounds, in GOP/s (2 x multiply-adds per second).
//
//   g++ -O2 -std=c++17 -pthread -o build/bench-kernels scripts/bench-kernels.cpp
//   LLM_ISA=avx2 build/bench-kernels [N...]        (default N: 1 8 64; LLM_ISA picks the tier)
#define LLM_IMPLEMENTATION
#include "../llm.hpp"

#include <cstdlib>
#include <ctime>
#include <random>

// Seconds of CPU time this thread has used.
static double thread_seconds() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char** argv) {
    using llm::Type;
    const int64_t k = 2048, rows = 512;
    std::vector<int64_t> widths;
    for (int i = 1; i < argc; i++) widths.push_back(atoll(argv[i]));
    if (widths.empty()) widths = {1, 8, 64};
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> values(rows * k);
    for (float& v : values) v = normal(rng);
    printf("isa %s, %lld rows x k %lld, one thread, GOP/s (best of 7 rounds)\n", llm::isa_name(llm::isa_current()).c_str(),
           (long long)rows, (long long)k);
    for (Type t : {Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0, Type::IQ4_NL, Type::Q2_K, Type::Q3_K, Type::Q4_K,
                   Type::Q5_K, Type::Q6_K}) {
        const size_t rb = llm::row_bytes(t, k);
        std::vector<uint8_t> W(rows * rb), packed(rows * rb);
        for (int64_t r = 0; r < rows; r++) llm::quantize_row_weights(t, values.data() + r * k, W.data() + r * rb, k);
        llm::interleave_rows16(t, W.data(), packed.data(), k, rows);
        const Type at = llm::vec_dot_type(t);
        const size_t arow = llm::row_bytes(at, k);
        printf("%-7s", llm::type_info(t).name);
        for (int64_t n : widths) {
            std::vector<uint8_t> A(n * arow);
            for (int64_t c = 0; c < n; c++) llm::quantize_row(at, values.data() + (c % rows) * k, A.data() + c * arow, k);
            llm::ActInfo info;
            llm::act_info(at, A.data(), arow, n, k, llm::interleave_needs_sums(t), info);
            std::vector<float> out(n * rows);
            const int reps = std::max<int64_t>(1, 256 / n);
            double best = 1e30;
            for (int round = 0; round < 7; round++) {
                const double t0 = thread_seconds();
                for (int i = 0; i < reps; i++)
                    llm::matmul_rows_interleaved(t, packed.data(), k, 0, rows, A.data(), arow, n, out.data(), rows, &info);
                best = std::min(best, (thread_seconds() - t0) / reps);
            }
            printf("  %3lld cols %6.1f", (long long)n, 2.0 * rows * k * n / best * 1e-9);
        }
        printf("\n");
    }
}
