// Sampling: deterministic per seed, and each filter does what it says.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <random>

#include "../llm.hpp"

namespace {

std::vector<float> random_logits(int n, int seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0, 3);
    std::vector<float> l(n);
    for (float& x : l) x = nd(rng);
    return l;
}

std::vector<int32_t> draw(const llm::SamplerParams& p, const std::vector<float>& logits, int n) {
    llm::Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < n; i++) out.push_back(s.sample(logits.data(), (int)logits.size()));
    return out;
}

int argmax(const std::vector<float>& l) { return (int)(std::max_element(l.begin(), l.end()) - l.begin()); }

}  // namespace

TEST_CASE("sampling: the same seed gives the same tokens, another seed others") {
    auto logits = random_logits(500, 1);
    llm::SamplerParams p;
    p.temperature = 1.5f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0;
    p.seed = 42;
    auto a = draw(p, logits, 50), b = draw(p, logits, 50);
    CHECK(a == b);
    p.seed = 43;
    CHECK(draw(p, logits, 50) != a);
}

TEST_CASE("sampling: greedy, top-k, top-p and min-p keep only what they should") {
    auto logits = random_logits(1000, 2);
    llm::SamplerParams p;
    p.temperature = 0;
    CHECK(draw(p, logits, 1)[0] == argmax(logits));
    p.temperature = 1.0f;
    p.top_k = 1;
    p.seed = 5;
    for (int t : draw(p, logits, 20)) CHECK(t == argmax(logits));
    // top-k 5: only the five largest ever come out.
    std::vector<int> order(1000);
    for (int i = 0; i < 1000; i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    p.top_k = 5;
    p.top_p = 1.0f;
    p.min_p = 0;
    for (int t : draw(p, logits, 200)) CHECK(std::find(order.begin(), order.begin() + 5, t) != order.begin() + 5);
    // min-p 0.5: only tokens at least half as likely as the best.
    p.top_k = 0;
    p.min_p = 0.5f;
    for (int t : draw(p, logits, 200)) CHECK(std::exp(logits[t] - logits[order[0]]) >= 0.5 - 1e-6);
    // top-p: a dominant token alone covers p.
    std::vector<float> peaked(100, 0.0f);
    peaked[7] = 10.0f;
    p.min_p = 0;
    p.top_p = 0.9f;
    for (int t : draw(p, peaked, 50)) CHECK(t == 7);
}

TEST_CASE("sampling: repeat, frequency and presence penalties push seen tokens down") {
    std::vector<float> logits(10, 0.0f);
    logits[3] = 2.0f;
    logits[4] = 1.9f;
    llm::SamplerParams p;
    p.temperature = 0;
    p.repeat_penalty = 1.5f;
    llm::Sampler s(p);
    CHECK(s.sample(logits.data(), 10) == 3);
    s.accept(3);
    CHECK(s.sample(logits.data(), 10) == 4);  // 2.0 / 1.5 < 1.9
    llm::SamplerParams f;
    f.temperature = 0;
    f.frequency_penalty = 0.1f;
    llm::Sampler s2(f);
    s2.accept(3);
    CHECK(s2.sample(logits.data(), 10) == 3);  // 2.0 - 0.1 > 1.9
    s2.accept(3);
    CHECK(s2.sample(logits.data(), 10) == 4);  // 2.0 - 0.2 < 1.9
    llm::SamplerParams pr;
    pr.temperature = 0;
    pr.presence_penalty = 0.5f;
    llm::Sampler s3(pr);
    s3.accept(3);
    CHECK(s3.sample(logits.data(), 10) == 4);
    // The window: tokens older than penalty_last_n are forgiven.
    pr.penalty_last_n = 2;
    llm::Sampler s4(pr);
    s4.accept(3);
    s4.accept(1);
    s4.accept(1);
    CHECK(s4.sample(logits.data(), 10) == 3);
}
