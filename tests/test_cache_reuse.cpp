// Context::seq_move (llama-server's --cache-reuse): a cached chunk moved to earlier positions must hold
// the keys a fresh evaluation writes there. Layer 0's rows depend only on the token and its position,
// so they are an exact reference: the moved rows of a sequence that dropped tokens must match the rows
// of a sequence that never had them, for every KV cache type and rope layout (adjacent pairs: llama;
// halves: qwen2; two bases: gemma3; a latent row: deepseek2).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "../llm.hpp"
#include "util.hpp"

namespace {

struct KvTypes {
    llm::Type k, v;
};

// Layer 0's K row (key) or V row of position pos, dequantized, from a seq_save blob of n positions:
// per CPU layer, n K rows then n V rows.
std::vector<float> layer0_row(const llm::HParams& hp, KvTypes t, const std::vector<uint8_t>& blob, int n, int pos, bool key) {
    const size_t row_k = llm::row_bytes(t.k, hp.n_embd_k_gqa());
    const size_t row_v = hp.mla ? 0 : llm::row_bytes(t.v, hp.n_embd_v_gqa());
    REQUIRE(blob.size() == sizeof(int32_t) + (row_k + row_v) * n * hp.n_layer);
    const uint8_t* at = blob.data() + sizeof(int32_t) + (key ? row_k * pos : row_k * n + row_v * pos);
    std::vector<float> out(key ? hp.n_embd_k_gqa() : hp.n_embd_v_gqa());
    llm::dequantize_row(key ? t.k : t.v, at, out.data(), (int64_t)out.size());
    return out;
}

// Largest difference relative to the largest magnitude of the reference row.
double rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
    double d = 0, m = 1e-9;
    for (size_t i = 0; i < got.size(); i++) {
        d = std::max(d, (double)std::fabs(got[i] - want[i]));
        m = std::max(m, (double)std::fabs(want[i]));
    }
    return d / m;
}

void feed(llm::Context& ctx, int seq, const std::vector<int32_t>& toks) {
    llm::Batch b;
    for (size_t i = 0; i < toks.size(); i++) b.add(toks[i], (int)i, seq, i + 1 == toks.size());
    ctx.decode(b);
}

}  // namespace

TEST_CASE("cache reuse: seq_move re-rotates keys to their new positions, every KV type and rope layout") {
    const char* models[] = {"tiny-llama-Q8_0.gguf", "tiny-qwen2-F16.gguf", "tiny-gemma3-Q8_0.gguf", "tiny-deepseek2-lite-Q8_0.gguf"};
    // Tolerance per K type: float rounding; then one requantization of an already quantized row.
    const std::pair<llm::Type, double> k_types[] = {{llm::Type::F32, 1e-5}, {llm::Type::F16, 4e-3}, {llm::Type::Q8_0, 4e-2},
                                                    {llm::Type::Q4_0, 0.3},  {llm::Type::IQ4_NL, 0.3}};
    // Cached: 12 tokens. The new prompt drops positions [3, 7): the chunk [7, 12) moves to [3, 8).
    const std::vector<int32_t> cached = {5, 17, 29, 41, 53, 65, 77, 89, 101, 113, 125, 137};
    std::vector<int32_t> fresh(cached.begin(), cached.begin() + 3);
    fresh.insert(fresh.end(), cached.begin() + 7, cached.end());
    for (const char* name : models) {
        auto m = llm::Model::load(testutil::shared_dir() + "/golden/models/" + name);
        const llm::HParams& hp = m->hp;
        for (const auto& type_tol : k_types) {
            const llm::Type tk = type_tol.first;  // not a structured binding: CAPTURE's lambda sees it
            const double tol = type_tol.second;
            CAPTURE(name);
            CAPTURE(llm::type_info(tk).name);
            const KvTypes t{tk, hp.mla ? llm::Type::F16 : tk};
            llm::ContextParams cp;
            cp.n_ctx = 64;
            cp.n_seq = 2;
            cp.n_threads = 2;
            cp.type_k = t.k;
            cp.type_v = t.v;
            llm::Context ctx(*m, cp);
            feed(ctx, 0, cached);
            feed(ctx, 1, fresh);
            const std::vector<uint8_t> before = ctx.seq_save(0, 12);
            REQUIRE(ctx.seq_move(0, 7, 3, 5));
            ctx.seq_truncate(0, 8);
            const std::vector<uint8_t> moved = ctx.seq_save(0, 8), want = ctx.seq_save(1, 8);
            for (int pos = 0; pos < 8; pos++) {
                CAPTURE(pos);
                const double d = rel_diff(layer0_row(hp, t, moved, 8, pos, true), layer0_row(hp, t, want, 8, pos, true));
                CHECK(d <= tol);
                if (pos >= 3) {  // the test can fail: the unmoved key of the same token is further off
                    const double stale = rel_diff(layer0_row(hp, t, before, 12, pos + 4, true), layer0_row(hp, t, want, 8, pos, true));
                    CHECK(stale > 2 * d);
                }
                if (!hp.mla) CHECK(layer0_row(hp, t, moved, 8, pos, false) == layer0_row(hp, t, want, 8, pos, false));
            }
            // The moved sequence goes on evaluating (the server test compares whole outputs).
            llm::Batch b;
            b.add(7, 8, 0, true);
            ctx.decode(b);
            const float* lg = ctx.logits(0);
            bool finite = true;
            for (int i = 0; i < hp.n_vocab; i++) finite = finite && std::isfinite(lg[i]);
            CHECK(finite);
        }
    }
    // Bad ranges are errors, not silent corruption.
    auto m = llm::Model::load(testutil::shared_dir() + "/golden/models/tiny-llama-Q8_0.gguf");
    llm::ContextParams cp;
    cp.n_ctx = 32;
    cp.n_threads = 2;
    llm::Context ctx(*m, cp);
    feed(ctx, 0, cached);
    CHECK_THROWS_AS(ctx.seq_move(0, 7, 8, 2), llm::Error);   // dst after src
    CHECK_THROWS_AS(ctx.seq_move(0, 7, 3, 6), llm::Error);   // past the sequence's end
    CHECK_THROWS_AS(ctx.seq_move(1, 7, 3, 2), llm::Error);   // no such sequence
    CHECK(ctx.seq_move(0, 5, 5, 3));                          // in place: nothing to do
}
