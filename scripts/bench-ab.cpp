// Two versions of llm.hpp in one process, run in alternating rounds (issue 14): on a shared host whose
// memory bandwidth moves by half from minute to minute, two binaries run one after the other land in
// different phases, while the rounds here see the same ones, and each round's ratio compares like with
// like. Built by scripts/bench-ab, which copies each version with its include guards renamed
// (LLM_HPP_A / LLM_HPP_B, ...) to build/bench-ab/a.hpp and b.hpp, and collects their system headers in
// system.hpp: included first, they make each version's own includes no-ops inside its namespace.
//
//   scripts/bench-ab REV MODEL [ROUNDS] [PROMPT] [GENERATED]
//   (LLM_ISA picks the tier for both; BENCH_AB_ROUNDS=1 prints every round's pair; BENCH_AB_THREADS=1
//   runs one thread instead of two)
//
// A round is one prompt of PROMPT tokens (t/s of that batch, GENERATED = 0) or PROMPT tokens then
// GENERATED decoded ones (t/s of the decoded ones), version A then B in even rounds, B then A in odd
// ones. Prints both means and the median of the rounds' B / A with its quartiles. A version against
// itself (REV = HEAD, a clean tree) shows the spread to expect: on the Zen 4 host of session 32, 12
// rounds of 32 decoded tokens read 1.001 (quartiles 0.999-1.002) on the Llama-1B shape and 0.997
// (0.965-1.034) on SmolLM2 Q4_1, whose weights partly fit the L3.
#include "system.hpp"  // both versions' system headers (scripts/bench-ab collects them)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <vector>

#define LLM_IMPLEMENTATION
namespace version_a {
#include "a.hpp"
}
namespace version_b {
#include "b.hpp"
}

namespace {

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// One version's model and context.
template <class Llm>
struct Engine {
    std::unique_ptr<typename Llm::Model> model;
    std::unique_ptr<typename Llm::Context> ctx;
    explicit Engine(const char* path) : model(Llm::Model::load(path)) {
        typename Llm::ContextParams params;
        params.n_ctx = 4096;
        const char* threads = getenv("BENCH_AB_THREADS");
        params.n_threads = threads ? std::max(1, atoi(threads)) : 2;
        ctx = std::make_unique<typename Llm::Context>(*model, params);
    }
    // t/s of one round (see the header); seed varies the tokens from round to round.
    double round(int prompt, int generated, int seed) {
        ctx->seq_truncate(0, 0);
        typename Llm::Batch batch;
        for (int i = 0; i < prompt; i++) batch.add(1000 + 37 * i + seed, i, 0, i == prompt - 1);
        double t0 = seconds();
        ctx->decode(batch);
        if (generated == 0) return prompt / (seconds() - t0);
        t0 = seconds();
        for (int s = 0; s < generated; s++) {
            batch.clear();
            batch.add(100 + s + seed, prompt + s, 0, true);
            ctx->decode(batch);
        }
        return generated / (seconds() - t0);
    }
};

struct LlmA {
    using Model = version_a::llm::Model;
    using Context = version_a::llm::Context;
    using ContextParams = version_a::llm::ContextParams;
    using Batch = version_a::llm::Batch;
};
struct LlmB {
    using Model = version_b::llm::Model;
    using Context = version_b::llm::Context;
    using ContextParams = version_b::llm::ContextParams;
    using Batch = version_b::llm::Batch;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL [ROUNDS] [PROMPT] [GENERATED]\n", argv[0]);
        return 2;
    }
    const int rounds = argc > 2 ? std::max(1, atoi(argv[2])) : 20;
    const int prompt = argc > 3 ? std::max(1, atoi(argv[3])) : 1;
    const int generated = argc > 4 ? std::max(0, atoi(argv[4])) : 32;
    if (prompt + generated > 4096) {
        fprintf(stderr, "bench-ab: PROMPT + GENERATED must fit 4096 positions\n");
        return 2;
    }
    try {
        Engine<LlmA> a(argv[1]);
        Engine<LlmB> b(argv[1]);
        std::vector<double> ta, tb, ratio;
        for (int r = 0; r < rounds; r++) {
            double x, y;
            if (r % 2 == 0) x = a.round(prompt, generated, r), y = b.round(prompt, generated, r);
            else y = b.round(prompt, generated, r), x = a.round(prompt, generated, r);
            ta.push_back(x), tb.push_back(y), ratio.push_back(y / x);
            if (getenv("BENCH_AB_ROUNDS")) fprintf(stderr, "round %d: A %.2f B %.2f t/s\n", r, x, y);
        }
        std::sort(ratio.begin(), ratio.end());
        double mean_a = 0, mean_b = 0;
        for (int r = 0; r < rounds; r++) mean_a += ta[r] / rounds, mean_b += tb[r] / rounds;
        printf("prompt %d, generated %d, %d rounds: A %.2f t/s, B %.2f t/s (means); B / A median %.3f (quartiles %.3f-%.3f)\n", prompt,
               generated, rounds, mean_a, mean_b, ratio[rounds / 2], ratio[rounds / 4], ratio[3 * rounds / 4]);
    } catch (const std::exception& e) {
        fprintf(stderr, "bench-ab: %s\n", e.what());
        return 1;
    }
}
