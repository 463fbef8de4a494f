// Context: several sequences in one batch, the paged KV pool (split and unified), save/restore, and
// clear errors when the cache is full.
#include <doctest/doctest.h>

#include <cmath>
#include <tuple>

#include "../llm.hpp"
#include "util.hpp"

namespace {

std::unique_ptr<llm::Model> tiny(const char* name = "tiny-llama-Q8_0.gguf") {
    return llm::Model::load(testutil::shared_dir() + "/golden/models/" + name);
}

llm::ContextParams params(int n_ctx, int n_seq, bool unified = false) {
    llm::ContextParams cp;
    cp.n_ctx = n_ctx;
    cp.n_seq = n_seq;
    cp.n_threads = 2;
    cp.kv_unified = unified;
    return cp;
}

std::vector<int32_t> tokens(int n, int seed) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; i++) t[i] = (seed * 131 + i * 17) % 1000;
    return t;
}

// Last-position logits of feeding `toks` to sequence `seq` from position `start`.
std::vector<float> feed(llm::Context& ctx, int seq, const std::vector<int32_t>& toks, int start = 0) {
    llm::Batch b;
    for (size_t i = start; i < toks.size(); i++) b.add(toks[i], (int)i, seq, i + 1 == toks.size());
    ctx.decode(b);
    return std::vector<float>(ctx.logits(0), ctx.logits(0) + ctx.model().hp.n_vocab);
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); i++) d = std::max(d, (double)std::fabs(a[i] - b[i]));
    return d;
}

}  // namespace

TEST_CASE("context: sequences interleaved in one batch match each run alone") {
    auto m = tiny();
    const auto a = tokens(40, 1), b = tokens(25, 2);
    llm::Context solo(*m, params(128, 1));
    std::vector<float> want_a = feed(solo, 0, a);
    solo.seq_truncate(0, 0);
    std::vector<float> want_b = feed(solo, 0, b);

    llm::Context ctx(*m, params(128, 2));
    llm::Batch batch;  // a's first 30 tokens and b's first 20, interleaved
    for (int i = 0; i < 30; i++) {
        batch.add(a[i], i, 0, false);
        if (i < 20) batch.add(b[i], i, 1, false);
    }
    ctx.decode(batch);
    batch.clear();  // then the rest of both in one more batch
    for (int i = 30; i < 40; i++) batch.add(a[i], i, 0, i == 39);
    for (int i = 20; i < 25; i++) batch.add(b[i], i, 1, i == 24);
    ctx.decode(batch);
    REQUIRE(ctx.n_logits() == 2);
    std::vector<float> got_a(ctx.logits(0), ctx.logits(0) + m->hp.n_vocab), got_b(ctx.logits(1), ctx.logits(1) + m->hp.n_vocab);
    CHECK(max_diff(got_a, want_a) < 1e-3);
    CHECK(max_diff(got_b, want_b) < 1e-3);
    CHECK(ctx.n_cells_used() == 65);
}

TEST_CASE("context: split pool gives each sequence its share; a full sequence is a clear error") {
    auto m = tiny();
    llm::Context ctx(*m, params(64, 2));
    CHECK(ctx.n_ctx_seq() == 32);
    feed(ctx, 0, tokens(32, 3));
    CHECK_THROWS_WITH_AS(feed(ctx, 0, tokens(33, 3), 32), doctest::Contains("context is full"), llm::Error);
    CHECK(ctx.seq_len(0) == 32);  // the failed batch changed nothing
    feed(ctx, 1, tokens(32, 4));  // the other sequence still has its own 32
    CHECK_THROWS_WITH_AS(feed(ctx, 0, tokens(5, 9), 1), doctest::Contains("does not continue"), llm::Error);
}

TEST_CASE("context: unified pool lets one sequence use the whole cache, and reports when it is full") {
    auto m = tiny();
    llm::Context ctx(*m, params(64, 2, true));
    CHECK(ctx.n_ctx_seq() == 64);
    feed(ctx, 0, tokens(48, 5));  // more than half the pool
    feed(ctx, 1, tokens(16, 6));
    CHECK(ctx.n_cells_used() == 64);
    CHECK_THROWS_WITH_AS(feed(ctx, 1, tokens(17, 6), 16), doctest::Contains("KV cache is full"), llm::Error);
    ctx.seq_truncate(0, 10);  // frees pages for the other sequence
    feed(ctx, 1, tokens(40, 6), 16);
    CHECK(ctx.seq_len(1) == 40);
}

TEST_CASE("context: a saved sequence restores to the same state") {
    auto m = tiny("tiny-qwen3-Q4_K_M.gguf");
    llm::Context ctx(*m, params(128, 2));
    const auto t = tokens(50, 7);
    std::vector<float> want = feed(ctx, 0, t);
    ctx.seq_truncate(0, 0);
    feed(ctx, 0, std::vector<int32_t>(t.begin(), t.begin() + 49));
    std::vector<uint8_t> blob = ctx.seq_save(0, 49);
    CHECK(blob.size() == 4 + ctx.kv_bytes_per_token() * 49);
    ctx.seq_truncate(0, 0);
    ctx.seq_restore(1, blob);  // into another sequence
    CHECK(ctx.seq_len(1) == 49);
    CHECK(max_diff(feed(ctx, 1, t, 49), want) < 1e-4);
    CHECK_THROWS_AS(ctx.seq_restore(0, std::vector<uint8_t>(7)), llm::Error);
}

TEST_CASE("context: prefill and decode thread counts (-t / -tb) and the poll level leave the results unchanged") {
    auto m = tiny();
    const auto toks = tokens(40, 3);
    llm::Context ref(*m, params(128, 1));
    const std::vector<float> want_prefill = feed(ref, 0, toks, 0), want_decode = feed(ref, 0, tokens(41, 3), 40);
    for (const std::tuple<int, int, int>& setting : {std::tuple{1, 2, 0}, std::tuple{2, 1, 100}, std::tuple{3, 2, 50}}) {
        llm::ContextParams cp = params(128, 1);
        std::tie(cp.n_threads, cp.n_threads_batch, cp.poll) = setting;
        CAPTURE(cp.n_threads);
        CAPTURE(cp.n_threads_batch);
        CAPTURE(cp.poll);
        llm::Context ctx(*m, cp);
        CHECK(ctx.n_threads() == std::max(cp.n_threads, cp.n_threads_batch));  // one pool for both
        CHECK(feed(ctx, 0, toks, 0) == want_prefill);                 // rows are split, never summed across threads
        CHECK(feed(ctx, 0, tokens(41, 3), 40) == want_decode);
    }
    llm::ContextParams bad = params(128, 1);
    bad.poll = 101;
    CHECK_THROWS_AS(llm::Context(*m, bad), llm::Error);
}
