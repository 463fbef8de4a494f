// Decode's share of the roofline measured in one process (issue 14): rounds of TOKENS decoded tokens,
// each followed by T threads stream-summing a 512 MiB buffer twice, and the mean decode bandwidth
// (bytes read per token x tokens/s) over the mean streaming bandwidth, in percent. bench-cpu's roofline
// column sets a run's decode against a probe's best pass taken beside it; on a shared host whose
// bandwidth moves by half within minutes, that probe often lands in another phase than the run. Here
// both see the same phases, round by round.
//
// The streaming loop is the fastest of stream-sum.hpp's loops over three first passes each (as
// bandwidth-probe's best); the buffer asks for huge pages, as the engine's repacked weights do. The ISA
// tier is LLM_ISA's.
//
//   g++ -O2 -std=c++17 -pthread -o build/bench-roofline scripts/bench-roofline.cpp
//   LLM_ISA=avx2 build/bench-roofline MODEL BYTES_PER_TOKEN [THREADS] [ROUNDS] [TOKENS]
//   (defaults 2, 12, 32; BYTES_PER_TOKEN as bench-cpu's bytes_per_token)
#define LLM_IMPLEMENTATION
#include "../llm.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "stream-sum.hpp"

namespace {

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL BYTES_PER_TOKEN [THREADS] [ROUNDS] [TOKENS]\n", argv[0]);
        return 2;
    }
    const double bytes_per_token = atof(argv[2]);
    const int threads = argc > 3 ? std::max(1, atoi(argv[3])) : 2;
    const int rounds = argc > 4 ? std::max(1, atoi(argv[4])) : 12;
    const int tokens = argc > 5 ? std::max(1, atoi(argv[5])) : 32;
    std::unique_ptr<llm::Model> model;
    try {
        model = llm::Model::load(argv[1]);
    } catch (const std::exception& e) {
        fprintf(stderr, "bench-roofline: %s\n", e.what());
        return 1;
    }
    const int horizon = std::max(128, tokens + 2);  // positions a round may reach (a prompt token, an untimed one)
    llm::ContextParams params;
    params.n_ctx = horizon;
    params.n_threads = threads;
    llm::Context ctx(*model, params);

    const stream_sum::Buffer buffer(512u << 20);
    if (!buffer.data) {
        fprintf(stderr, "bench-roofline: no memory for the streaming buffer\n");
        return 1;
    }
    uint64_t check = 0;
    stream_sum::Loop loop = stream_sum::available_loops()[0];
    double fastest = 0;
    for (const stream_sum::Loop& l : stream_sum::available_loops()) {
        for (int pass = 0; pass < 3; pass++) {
            const double g = buffer.gbs(l, threads, 1, check);
            if (g > fastest) fastest = g, loop = l;
        }
    }

    // Decode from a one-token prompt, back to it before a round would pass position 128: attention reads
    // as much of the cache as tg128 does (the bytes per token count the weights only).
    llm::Batch batch;
    const auto step = [&](int token, int pos) {
        batch.clear();
        batch.add(token, pos, 0, true);
        ctx.decode(batch);
    };
    step(1, 0);
    int pos = 1;
    double decode_sum = 0, stream_sum_gbs = 0;
    for (int r = 0; r < rounds; r++) {
        if (pos + 1 + tokens > horizon) {
            ctx.seq_truncate(0, 1);
            pos = 1;
        }
        step(2, pos++);  // untimed: the first step after the stream warms the caches again
        const double t0 = seconds();
        for (int i = 0; i < tokens; i++) step(100 + i, pos++);
        const double decode = bytes_per_token * tokens / (seconds() - t0) / 1e9;
        const double stream = buffer.gbs(loop, threads, 2, check);
        fprintf(stderr, "bench-roofline: round %d: decode %.1f GB/s, stream (%s) %.1f GB/s, %.0f%%\n", r + 1, decode, loop.name,
                stream, 100 * decode / stream);
        decode_sum += decode;
        stream_sum_gbs += stream;
    }
    printf("%.0f%%\n", 100 * decode_sum / stream_sum_gbs);
    fprintf(stderr, "bench-roofline: %d threads, %d rounds of %d tokens: decode %.1f GB/s, stream %.1f GB/s (checksum %llu)\n",
            threads, rounds, tokens, decode_sum / rounds, stream_sum_gbs / rounds, (unsigned long long)check);
    return 0;
}
