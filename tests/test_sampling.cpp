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

namespace {

// A sampler with everything off but what a test turns on.
llm::SamplerParams plain(float temperature) {
    llm::SamplerParams p;
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 7;
    return p;
}

std::vector<float> log_probs(const std::vector<double>& probs) {
    std::vector<float> l;
    for (double p : probs) l.push_back((float)std::log(p));
    return l;
}

// Which tokens n draws produce.
std::map<int32_t, int> histogram(const llm::SamplerParams& p, const std::vector<float>& logits, int n) {
    std::map<int32_t, int> h;
    for (int32_t t : draw(p, logits, n)) h[t]++;
    return h;
}

const llm::Vocab& smollm_vocab() {
    static auto gguf = llm::GGUF::open("models/SmolLM2-135M-Instruct-Q4_1.gguf");
    static llm::Vocab vocab(*gguf);
    return vocab;
}

}  // namespace

TEST_CASE("sampling: logit_bias adds to the logits and -inf bans") {
    std::vector<float> logits = {0, 1, 2, 3};
    llm::SamplerParams p = plain(0);
    CHECK(draw(p, logits, 1)[0] == 3);
    p.logit_bias = {{3, -INFINITY}};
    CHECK(draw(p, logits, 1)[0] == 2);
    p.logit_bias = {{3, -INFINITY}, {0, 1.5f}, {0, 1.0f}};  // 0 + 2.5 > 2
    CHECK(draw(p, logits, 1)[0] == 0);
    p.logit_bias = {{0, -INFINITY}, {1, -INFINITY}, {2, -INFINITY}, {3, -INFINITY}};
    llm::Sampler s(p);
    CHECK_THROWS_AS(s.sample(logits.data(), 4), llm::Error);
}

TEST_CASE("sampling: stage names, letters and the order they run in") {
    using S = llm::SamplerStage;
    const std::vector<S> def = {S::Penalties, S::Dry, S::TopNSigma, S::TopK, S::TypicalP, S::TopP, S::MinP, S::Xtc, S::Temperature};
    CHECK(llm::default_sampler_stages() == def);
    CHECK(llm::sampler_stages_from_chars("edskypmxt") == def);
    CHECK(llm::sampler_stages_from_names({"penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"}) == def);
    CHECK(llm::sampler_stages_from_names({"top-k", "nucleus", "typical", "temp", "bogus"}) == std::vector<S>{S::TopK, S::TopP, S::TypicalP, S::Temperature});
    CHECK(llm::sampler_stages_from_chars("kz?t") == std::vector<S>{S::TopK, S::Temperature});
    CHECK(std::string(llm::sampler_stage_name(S::TypicalP)) == "typ_p");
    // Order matters: the repeat penalty halves token 0's logit 3.0 to 1.5 (< 2.9) when it runs first;
    // after top_k = 1 only token 0 is left to penalize.
    std::vector<float> logits = {3.0f, 2.9f, 0.0f};
    llm::SamplerParams p = plain(0);
    p.repeat_penalty = 2.0f;
    llm::Sampler first(p);
    first.accept(0);
    CHECK(first.sample(logits.data(), 3) == 1);
    p.top_k = 1;
    p.samplers = {S::TopK, S::Penalties, S::Temperature};
    llm::Sampler later(p);
    later.accept(0);
    CHECK(later.sample(logits.data(), 3) == 0);
}

TEST_CASE("sampling: typical_p keeps the tokens whose surprise is nearest the entropy") {
    // p = .5 .3 .2: entropy 1.0297; |surprise - entropy| = .3366 .1743 .5797, so the order is 1, 0, 2.
    const auto logits = log_probs({0.5, 0.3, 0.2});
    llm::SamplerParams p = plain(1.0f);
    p.typical_p = 0.5f;  // mass .3 then .8 > .5: keeps {1, 0}
    auto h = histogram(p, logits, 400);
    CHECK(h.count(2) == 0);
    CHECK(h[0] > 0);
    CHECK(h[1] > 0);
    p.typical_p = 0.2f;  // .3 > .2 already: only token 1, though token 0 is likelier
    CHECK(histogram(p, logits, 100) == std::map<int32_t, int>{{1, 100}});
    p.min_keep = 2;      // ... unless min_keep asks for more
    CHECK(histogram(p, logits, 400).count(2) == 0);
    CHECK(histogram(p, logits, 400).count(0) == 1);
}

TEST_CASE("sampling: top_n_sigma cuts below max - n * stddev of the logits") {
    // logits 4 3 0 0: mean 1.75, stddev 1.7854.
    const std::vector<float> logits = {4, 3, 0, 0};
    llm::SamplerParams p = plain(1.0f);
    p.top_n_sigma = 0.5f;  // cut 3.107: token 0 alone
    CHECK(histogram(p, logits, 100) == std::map<int32_t, int>{{0, 100}});
    p.top_n_sigma = 1.0f;  // cut 2.215: tokens 0 and 1
    auto h = histogram(p, logits, 400);
    CHECK(h.size() == 2);
    CHECK(h[1] > 0);
    p.top_n_sigma = 3.0f;  // cut < 0: all four
    CHECK(histogram(p, logits, 2000).size() == 4);
}

TEST_CASE("sampling: XTC removes the top choices above the threshold but the least likely of them") {
    const auto logits = log_probs({0.4, 0.3, 0.2, 0.1});
    llm::SamplerParams p = plain(0);  // greedy after XTC
    p.xtc_probability = 1.0f;
    p.xtc_threshold = 0.15f;  // 0, 1, 2 are above: 0 and 1 go, 2 stays
    CHECK(draw(p, logits, 1)[0] == 2);
    p.xtc_threshold = 0.35f;  // only token 0 is above: nothing to remove
    CHECK(draw(p, logits, 1)[0] == 0);
    p.xtc_threshold = 0.6f;   // > 0.5: off
    CHECK(draw(p, logits, 1)[0] == 0);
    p.xtc_threshold = 0.15f;
    p.min_keep = 3;           // only 2 would remain
    CHECK(draw(p, logits, 1)[0] == 0);
    p.min_keep = 0;
    p.xtc_probability = 0.5f;  // a coin flip per token
    auto h = histogram(p, logits, 400);
    CHECK(h.size() == 2);
    CHECK(h[0] > 100);
    CHECK(h[2] > 100);
}

TEST_CASE("sampling: dynamic temperature follows the entropy") {
    // logits 5,0 x9: p0 = .943, normalized entropy .149, so t = 0 + 2 * .149 = .299 with t = 1 +- 1:
    // token 0's probability becomes 1 - 9 e^(-16.7) (all 300 draws are 0); at plain t = 1 about 6% are not.
    std::vector<float> logits(10, 0.0f);
    logits[0] = 5.0f;
    llm::SamplerParams p = plain(1.0f);
    CHECK(histogram(p, logits, 300).size() > 1);
    p.dynatemp_range = 1.0f;
    CHECK(histogram(p, logits, 300) == std::map<int32_t, int>{{0, 300}});
    // Uniform logits: normalized entropy 1, t = max = 2, and any exponent leaves it there.
    p.dynatemp_exponent = 3.0f;
    CHECK(histogram(p, std::vector<float>(4, 1.0f), 400).size() == 4);
}

TEST_CASE("sampling: mirostat v2 keeps tokens with surprise <= mu and moves mu toward tau") {
    const auto logits = log_probs({0.6, 0.3, 0.1});
    llm::SamplerParams p = plain(1.0f);
    p.mirostat = 2;
    p.mirostat_tau = 0.5f;  // mu = 1: only p >= .5 survives; each draw (surprise 0) raises mu by .05,
    p.mirostat_eta = 0.1f;  // so token 1 (surprise 1.737) is out for the first 14 draws
    CHECK(histogram(p, logits, 14) == std::map<int32_t, int>{{0, 14}});
    p.mirostat_tau = 10.0f;  // mu = 20: everything survives
    CHECK(histogram(p, logits, 400).size() == 3);
}

TEST_CASE("sampling: mirostat v1 estimates the Zipf exponent and picks k from mu") {
    // p_i ~ 1/(i+1)^2 over 200 tokens: s_hat = 2 exactly, eps = 1; tau = 1 -> mu = 2 ->
    // k = (2^2 / (1 - 1/200))^(1/2) = 2.005 -> the first draw is token 0 or 1.
    std::vector<float> logits;
    for (int i = 0; i < 200; i++) logits.push_back(-2.0f * std::log(i + 1.0f));
    llm::SamplerParams p = plain(1.0f);
    p.mirostat = 1;
    p.mirostat_tau = 1.0f;
    std::map<int32_t, int> first;
    for (uint64_t seed = 0; seed < 200; seed++) {
        p.seed = seed;
        first[draw(p, logits, 1)[0]]++;
    }
    CHECK(first.size() == 2);
    CHECK(first[0] > first[1]);  // 0.8 : 0.2
    CHECK(first[1] > 10);
}

TEST_CASE("sampling: DRY penalizes the token that would extend a repeat") {
    // History 1 2 3 4 1 2 3: the suffix "1 2 3" (length 3) was followed by 4, so token 4 loses
    // multiplier * base^(3 - allowed_length) = 1.75 * multiplier.
    std::vector<float> logits(6, 0.0f);
    logits[4] = 2.0f;
    logits[5] = 1.0f;
    llm::SamplerParams p = plain(0);
    p.dry_multiplier = 1.0f;
    p.dry_sequence_breakers = {};
    auto run = [&](const llm::SamplerParams& q) {
        llm::Sampler s(q);
        for (int t : {1, 2, 3, 4, 1, 2, 3}) s.accept(t);
        return s.sample(logits.data(), 6);
    };
    CHECK(run(p) == 5);  // 2 - 1.75 < 1
    p.dry_multiplier = 0.5f;
    CHECK(run(p) == 4);  // 2 - .875 > 1
    p.dry_multiplier = 1.0f;
    p.dry_allowed_length = 4;  // a repeat of 3 is allowed
    CHECK(run(p) == 4);
    p.dry_allowed_length = 2;
    p.dry_penalty_last_n = 4;  // the window 4 1 2 3 holds no earlier "1 2 3"
    CHECK(run(p) == 4);
}

TEST_CASE("sampling: DRY's sequence breakers stop a repeat (real vocabulary)") {
    const llm::Vocab& v = smollm_vocab();
    const int32_t nl = v.tokenize("\n", false, false).at(0);
    const int32_t a = v.tokenize("apple", false, false).at(0), b = v.tokenize(" tree", false, false).at(0);
    const int32_t c = v.tokenize(" green", false, false).at(0);
    // a NL b c a NL b c: the suffix "c b NL a"... matches 4 back, but the newline 2 tokens back
    // limits the repeat to 2: the penalty is multiplier * base^0 instead of base^2.
    std::vector<float> logits(v.n_tokens(), 0.0f);
    logits[a] = 3.5f;
    logits[b] = 1.0f;
    llm::SamplerParams p = plain(0);
    p.dry_multiplier = 1.0f;
    p.dry_base = 2.0f;
    auto run = [&](const llm::SamplerParams& q) {
        llm::Sampler s(q, &v);
        for (int32_t t : {a, nl, b, c, a, nl, b, c}) s.accept(t);
        return s.sample(logits.data(), (int)logits.size());
    };
    CHECK(run(p) == a);  // 3.5 - 1 > 1
    p.dry_sequence_breakers = {};
    CHECK(run(p) == b);  // 3.5 - 4 < 1
    p.dry_sequence_breakers = {"\n"};
    CHECK_THROWS_AS(llm::Sampler(p, nullptr), llm::Error);  // breakers need the vocabulary
}

TEST_CASE("sampling: ignore_eos bans the end-of-generation tokens; min_keep holds top_p and min_p") {
    const llm::Vocab& v = smollm_vocab();
    std::vector<float> logits(v.n_tokens(), 0.0f);
    for (int32_t e : v.eog_ids()) logits[e] = 10.0f;
    logits[42] = 5.0f;
    llm::SamplerParams p = plain(0);
    CHECK(v.is_eog(draw(p, logits, 1)[0]));
    p.ignore_eos = true;
    llm::Sampler s(p, &v);
    CHECK(s.sample(logits.data(), (int)logits.size()) == 42);
    // top_p .1 would keep one of three equal tokens; min_keep 3 keeps all.
    std::vector<float> flat(3, 0.0f);
    llm::SamplerParams q = plain(1.0f);
    q.top_p = 0.1f;
    CHECK(histogram(q, flat, 100).size() == 1);
    q.min_keep = 3;
    CHECK(histogram(q, flat, 300).size() == 3);
    q.top_p = 1.0f;
    q.min_p = 0.99f;
    std::vector<float> steep = {0.0f, -1.0f, -2.0f};
    CHECK(histogram(q, steep, 300).size() == 3);
    q.min_keep = 0;
    CHECK(histogram(q, steep, 300).size() == 1);
}

TEST_CASE("sampling: the penalty history rolls back") {
    std::vector<float> logits = {2.0f, 1.9f, 1.8f};
    llm::SamplerParams p = plain(0);
    p.presence_penalty = 0.5f;
    llm::Sampler s(p);
    s.accept(1);
    s.accept(0);
    CHECK(s.history_size() == 2);
    CHECK(s.sample(logits.data(), 3) == 2);  // 0 and 1 are penalized to 1.5 and 1.4
    s.truncate_history(1);                   // forget the 0
    CHECK(s.history_size() == 1);
    CHECK(s.sample(logits.data(), 3) == 0);
}
