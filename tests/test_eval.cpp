// Perplexity and KL divergence (evaluate_perplexity) on the golden tiny models, which have no
// tokenizer: the token-id form is checked against a direct computation from Context logits.
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "../llm.hpp"
#include "util.hpp"

namespace {

std::string golden_model(const std::string& name) { return testutil::shared_dir() + "/golden/models/" + name + ".gguf"; }

std::vector<int32_t> random_tokens(int n, int n_vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = (int32_t)(rng() % n_vocab);
    return t;
}

// Perplexity as the definition says: each chunk from an empty cache, logits of every position,
// log-softmax in double, NLL of the next token over positions [n_ctx/2, n_ctx-1).
double direct_perplexity(const llm::Model& m, const std::vector<int32_t>& tokens, int n_ctx) {
    llm::ContextParams cp;
    cp.n_ctx = n_ctx;
    cp.n_threads = 2;
    llm::Context ctx(m, cp);
    const int n_vocab = m.hp.n_vocab, n_chunks = (int)tokens.size() / n_ctx;
    double nll = 0;
    int count = 0;
    for (int c = 0; c < n_chunks; c++) {
        ctx.seq_truncate(0, 0);
        llm::Batch b;
        for (int i = 0; i < n_ctx; i++) b.add(tokens[c * n_ctx + i], i, 0, true);
        ctx.decode(b);
        for (int i = n_ctx / 2; i < n_ctx - 1; i++) {
            const float* l = ctx.logits(i);
            double mx = l[0], sum = 0;
            for (int v = 0; v < n_vocab; v++) mx = std::max(mx, (double)l[v]);
            for (int v = 0; v < n_vocab; v++) sum += std::exp(l[v] - mx);
            nll += mx + std::log(sum) - l[tokens[c * n_ctx + i + 1]];
            count++;
        }
    }
    return std::exp(nll / count);
}

}  // namespace

TEST_CASE("eval: perplexity of a golden model matches a direct computation") {
    auto m = llm::Model::load(golden_model("tiny-llama-F16"));
    REQUIRE_FALSE(m->vocab.add_bos());  // no tokenizer: the chunks are evaluated as given
    const int n_ctx = 32;
    const auto tokens = random_tokens(3 * n_ctx + 7, m->hp.n_vocab, 7);  // 3 chunks and a remainder
    llm::PerplexityParams p;
    p.n_ctx = n_ctx;
    p.n_threads = 2;
    std::vector<int> progress;
    const auto r = llm::evaluate_perplexity(*m, nullptr, tokens, p, [&](int chunk, int n, double ppl) {
        CHECK(n == 3);
        CHECK(ppl > 1);
        progress.push_back(chunk);
    });
    CHECK(progress == std::vector<int>{1, 2, 3});
    CHECK(r.n_chunks == 3);
    CHECK(r.n_scored == 3 * (n_ctx - 1 - n_ctx / 2));
    CHECK_FALSE(r.has_kl);
    const double ref = direct_perplexity(*m, tokens, n_ctx);
    CHECK(r.ppl == doctest::Approx(ref).epsilon(1e-5));
    CHECK(r.ppl_err > 0);
    CHECK(r.ppl_err < r.ppl);

    // Smaller batches (the scored half split across decode calls) and a chunk limit.
    p.n_batch = 5;
    CHECK(llm::evaluate_perplexity(*m, nullptr, tokens, p).ppl == doctest::Approx(ref).epsilon(1e-3));
    p.n_chunks = 1;
    CHECK(llm::evaluate_perplexity(*m, nullptr, tokens, p).n_chunks == 1);
}

TEST_CASE("eval: KL divergence against a base model") {
    auto f16 = llm::Model::load(golden_model("tiny-llama-F16"));
    auto q8 = llm::Model::load(golden_model("tiny-llama-Q8_0"));
    const auto tokens = random_tokens(2 * 32, f16->hp.n_vocab, 11);
    llm::PerplexityParams p;
    p.n_ctx = 32;
    p.n_threads = 2;

    // A model against itself: identical logits, so KL is exactly 0 and the argmaxes always agree.
    const auto self = llm::evaluate_perplexity(*f16, f16.get(), tokens, p);
    REQUIRE(self.has_kl);
    CHECK(self.mean_kl == 0);
    CHECK(self.max_kl == 0);
    CHECK(self.top1_agree == 100);
    CHECK(self.base_ppl == doctest::Approx(self.ppl));

    // Q8_0 against its F16 source: a small positive divergence, mostly the same top token (a random
    // network on random tokens has flat distributions, so the argmax flips more than a real model's).
    const auto q = llm::evaluate_perplexity(*q8, f16.get(), tokens, p);
    MESSAGE("tiny-llama Q8_0 vs F16: KL " << q.mean_kl << " +/- " << q.mean_kl_err << ", top-1 " << q.top1_agree << "%");
    CHECK(q.mean_kl > 0);
    CHECK(q.mean_kl < 0.02);
    CHECK(q.mean_kl_err > 0);
    CHECK(q.max_kl >= q.mean_kl);
    CHECK(q.top1_agree >= 60);
    CHECK(q.base_ppl == doctest::Approx(self.ppl).epsilon(1e-6));  // the base's numbers do not depend on the model
}

TEST_CASE("eval: errors") {
    auto m = llm::Model::load(golden_model("tiny-llama-F16"));
    llm::PerplexityParams p;
    p.n_ctx = 32;
    p.n_threads = 2;
    // Fewer than two chunks of tokens, as llama-perplexity refuses.
    CHECK_THROWS_AS(llm::evaluate_perplexity(*m, nullptr, random_tokens(63, m->hp.n_vocab, 1), p), llm::Error);
    CHECK_NOTHROW(llm::evaluate_perplexity(*m, nullptr, random_tokens(64, m->hp.n_vocab, 1), p));
    // No tokenizer: text cannot be evaluated.
    CHECK_THROWS_AS(llm::evaluate_perplexity(*m, nullptr, std::string("some text"), p), llm::Error);
    // A token id outside the vocabulary.
    auto bad = random_tokens(64, m->hp.n_vocab, 1);
    bad[40] = m->hp.n_vocab;
    CHECK_THROWS_AS(llm::evaluate_perplexity(*m, nullptr, bad, p), llm::Error);
    // A base with another vocabulary size (every golden model has 1024 tokens: fake one; the check
    // comes before anything is evaluated).
    auto other = llm::Model::load(golden_model("tiny-qwen2-F16"));
    other->hp.n_vocab += 1;
    CHECK_THROWS_WITH_AS(llm::evaluate_perplexity(*m, other.get(), random_tokens(64, m->hp.n_vocab, 1), p),
                         doctest::Contains("vocabulary"), llm::Error);
}
