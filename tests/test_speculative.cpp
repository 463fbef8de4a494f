// Speculative decoding: the drafters (n-gram lookup, a draft model on the target's threads), the
// sampler's snapshots, and the server and -p mode end to end: greedy output identical token for token,
// sampled output following the target's distribution, penalties unaffected by rejected drafts.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include <unistd.h>

#include "../llm.hpp"
#include "server_util.hpp"

namespace {

using json = nlohmann::json;
using namespace testserver;

std::string golden(const std::string& name) { return testutil::shared_dir() + "/golden/models/" + name; }

// The greedy continuation of `prompt` by the model alone, one token per decode, among the first
// n_ids token ids (0: all).
std::vector<int32_t> greedy(llm::Context& ctx, std::vector<int32_t> tokens, int n, int n_ids = 0) {
    ctx.seq_truncate(0, 0);
    llm::Batch b;
    for (size_t i = 0; i < tokens.size(); i++) b.add(tokens[i], (int)i, 0, i + 1 == tokens.size());
    std::vector<int32_t> out;
    const int n_vocab = n_ids > 0 ? n_ids : ctx.model().hp.n_vocab;
    for (int i = 0; i < n; i++) {
        ctx.decode(b);
        const float* l = ctx.logits(0);
        out.push_back((int32_t)(std::max_element(l, l + n_vocab) - l));
        b.clear();
        b.add(out.back(), (int)(tokens.size() + out.size() - 1), 0, true);
    }
    return out;
}

const std::vector<int32_t> kIds = {1, 17, 300, 42, 9, 17, 300, 42, 5, 77, 81, 17, 300};

}  // namespace

TEST_CASE("speculative: n-gram lookup drafts what followed the latest earlier occurrence of the longest suffix") {
    // ... 7 8 9 1 2 3 | 4 5 6 ... 7 8 9: the suffix 7 8 9 occurred at 6..8, followed by 1 2 3.
    const std::vector<int32_t> t = {7, 8, 9, 4, 5, 6, 7, 8, 9, 1, 2, 3, 0, 7, 8, 9};
    CHECK(llm::ngram_draft(t, 3, 16) == std::vector<int32_t>{1, 2, 3, 0, 7, 8, 9});
    CHECK(llm::ngram_draft(t, 3, 2) == std::vector<int32_t>{1, 2});
    // No earlier occurrence of the last 2 tokens: no draft. A shorter suffix matches when the longest does not.
    CHECK(llm::ngram_draft({1, 2, 3, 5, 9}, 3, 8).empty());
    CHECK(llm::ngram_draft({4, 6, 1, 6, 1}, 3, 8) == std::vector<int32_t>{6, 1});  // suffix "6 1" at 1..2
    CHECK(llm::ngram_draft({4, 6, 1, 6, 1}, 2, 1) == std::vector<int32_t>{6});
    CHECK(llm::ngram_draft({1}, 3, 8).empty());
    CHECK(llm::ngram_draft({}, 3, 8).empty());
}

namespace {

using Tokens = std::vector<int32_t>;
using Substitutions = std::vector<std::pair<Tokens, Tokens>>;

// Greedy verification of `lookup`'s drafts over a known continuation: each step the draft is kept while
// it equals `output`, then the target's own token follows. Returns the drafted tokens kept.
int kept_over(llm::NgramLookup& lookup, const Tokens& prompt, const Tokens& output) {
    Tokens seq = prompt;
    seq.push_back(output[0]);
    int kept = 0;
    while (seq.size() < prompt.size() + output.size()) {
        const Tokens draft = lookup.draft(seq, 3, 16);
        size_t n = 0;
        while (n < draft.size() && seq.size() < prompt.size() + output.size() && draft[n] == output[seq.size() - prompt.size()]) {
            seq.push_back(draft[n++]);
        }
        kept += (int)n;
        if (seq.size() < prompt.size() + output.size()) seq.push_back(output[seq.size() - prompt.size()]);
    }
    return kept;
}

// The rewritten "function" of these tests: the name 50 three times among other tokens.
const Tokens kFunction = {90, 1, 2, 3, 50, 4, 5, 6, 7, 50, 8, 9, 10, 11, 50, 12, 13, 91};

}  // namespace

TEST_CASE("speculative: the n-gram lookup learns a 1 -> 1 rename from its rejected proposal and proposes the new name") {
    llm::NgramLookup lookup;
    Tokens seq = kFunction;  // the output copies the function from 1 on, with 50 renamed 60
    seq.push_back(1);
    CHECK(lookup.draft(seq, 3, 16).empty());
    seq.push_back(2);  // "1 2" as in the prompt: ngram_draft's proposal, the old name included
    CHECK(lookup.draft(seq, 3, 16) == llm::ngram_draft(seq, 3, 16));
    seq.insert(seq.end(), {3, 60});  // 3 kept, then the target's 60 instead of 50
    CHECK(lookup.draft(seq, 3, 16).empty());  // "3 60" occurs nowhere; the divergence is pending
    CHECK(lookup.substitutions().empty());
    seq.push_back(4);  // back on the prompt's text after one token each: 50 -> 60
    // The tail "3 60 4" reads as "3 50 4": the rest of the function follows, the new name in it
    // (ngram_draft finds no "60 4" anywhere).
    CHECK(llm::ngram_draft(seq, 3, 16).empty());
    CHECK(lookup.draft(seq, 3, 16) == Tokens{5, 6, 7, 60, 8, 9, 10, 11, 60, 12, 13, 91});
    CHECK(lookup.substitutions() == Substitutions{{{50}, {60}}});
    CHECK(lookup.draft(seq, 3, 4) == Tokens{5, 6, 7, 60});
    // Over the whole rewrite the lookup carries more of it than the plain lookup.
    llm::NgramLookup fresh;
    const Tokens rewrite = {1, 2, 3, 60, 4, 5, 6, 7, 60, 8, 9, 10, 11, 60, 12, 13, 91};
    CHECK(kept_over(fresh, kFunction, rewrite) == 13);
    // A shorter sequence is another one: the lookup starts over.
    CHECK(lookup.draft(Tokens(kFunction.begin(), kFunction.begin() + 4), 3, 16).empty());
    CHECK(lookup.substitutions().empty());
}

TEST_CASE("speculative: the n-gram lookup learns a 1 -> 2 rename; a new name at the end reads as its old name") {
    llm::NgramLookup lookup;
    Tokens seq = kFunction;  // 50 renamed 60 61
    seq.push_back(1);
    CHECK(lookup.draft(seq, 3, 16).empty());
    seq.push_back(2);
    CHECK(lookup.draft(seq, 3, 16).at(1) == 50);
    seq.insert(seq.end(), {3, 60});
    CHECK(lookup.draft(seq, 3, 16).empty());
    seq.push_back(61);  // no re-join yet: 61 is neither 4 nor 5 nor 6
    CHECK(lookup.draft(seq, 3, 16).empty());
    CHECK(lookup.substitutions().empty());
    seq.push_back(4);  // 4 two tokens after the divergence, one after it in the prompt
    CHECK(lookup.draft(seq, 3, 16) == Tokens{5, 6, 7, 60, 61, 8, 9, 10, 11, 60, 61, 12, 13, 91});
    CHECK(lookup.substitutions() == Substitutions{{{50}, {60, 61}}});
    // Right after the new name, "6 7 60 61" reads as "6 7 50" (the plain lookup would follow "60 61"
    // to the 4 after its first occurrence).
    seq.insert(seq.end(), {5, 6, 7, 60, 61});
    CHECK(llm::ngram_draft(seq, 3, 16).at(0) == 4);
    CHECK(lookup.draft(seq, 3, 16) == Tokens{8, 9, 10, 11, 60, 61, 12, 13, 91});
}

TEST_CASE("speculative: the n-gram lookup learns a rename in tokens it did not propose (a draft model's)") {
    llm::NgramLookup lookup;
    Tokens seq = kFunction;
    seq.push_back(1);
    CHECK(lookup.draft(seq, 3, 16).empty());
    // Another drafter's tokens come in one go: the lookup follows them one at a time, proposing after
    // "1 2" as if alone, sees 60 where the prompt has 50 and 4 re-join.
    seq.insert(seq.end(), {2, 3, 60, 4});
    CHECK(lookup.draft(seq, 3, 16) == Tokens{5, 6, 7, 60, 8, 9, 10, 11, 60, 12, 13, 91});
    CHECK(lookup.substitutions() == Substitutions{{{50}, {60}}});
}

TEST_CASE("speculative: the n-gram lookup drops a substitution the target rejects twice in a row") {
    llm::NgramLookup lookup;
    Tokens seq = kFunction;
    for (const Tokens& step : {Tokens{1}, Tokens{2}, Tokens{3, 60}, Tokens{4}}) {
        seq.insert(seq.end(), step.begin(), step.end());
        lookup.draft(seq, 3, 16);
    }
    CHECK(lookup.substitutions() == Substitutions{{{50}, {60}}});
    seq.insert(seq.end(), {5, 6, 7, 50});  // the proposal's 60 rejected: the old name stays here
    CHECK(lookup.draft(seq, 3, 16) == Tokens{8, 9, 10, 11, 60, 12, 13, 91});
    CHECK(lookup.substitutions().size() == 1);
    seq.insert(seq.end(), {8, 9, 10, 11, 50});  // and again: it goes
    CHECK(lookup.draft(seq, 3, 16) == llm::ngram_draft(seq, 3, 16));
    CHECK(lookup.substitutions().empty());
}

TEST_CASE("speculative: the n-gram lookup keeps its 64 latest substitutions") {
    // 70 names, each renamed, each between two tokens of its own: every rename is learnt in turn.
    Tokens prompt, output;
    for (int32_t i = 0; i < 70; i++) {
        prompt.insert(prompt.end(), {3000 + i, 3500 + i, 1000 + i, 4000 + i});
        output.insert(output.end(), {3000 + i, 3500 + i, 2000 + i, 4000 + i});
    }
    llm::NgramLookup lookup;
    // After the first segment the lookup carries each segment's first two tokens (up to the next name).
    CHECK(kept_over(lookup, prompt, output) == 2 * 69);
    const Substitutions learnt = lookup.substitutions();
    REQUIRE(learnt.size() == llm::NgramLookup::kMaxSubstitutions);
    CHECK(learnt.front() == std::pair<Tokens, Tokens>{{1005}, {2005}});  // 1000..1004 went first
    CHECK(learnt.back() == std::pair<Tokens, Tokens>{{1068}, {2068}});   // 1069's re-join is the last token
}

TEST_CASE("speculative: a draft model beside its target shares its thread pool and drafts the target's greedy text") {
    auto target = llm::Model::load(golden("tiny-llama-F16.gguf"));
    auto other = llm::Model::load(golden("tiny-qwen2-F16.gguf"));
    llm::ContextParams cp;
    cp.n_ctx = 256;
    cp.n_threads = 2;
    llm::Context ctx(*target, cp);
    const std::vector<int32_t> want = greedy(ctx, kIds, 12);
    // The same weights as their own draft: the draft is the greedy continuation itself.
    llm::check_draft_vocab(*target, *target);
    llm::DraftModel self(*target, target->hp.n_vocab, cp, ctx);
    CHECK(self.context().n_threads() == ctx.n_threads());
    llm::DraftParams dp;
    dp.n_max = 12;
    dp.p_min = 0;
    CHECK(self.draft(0, kIds, dp, 512) == want);
    CHECK(self.last_decodes() == 12);  // the last prompt token, then each drafted token but the last
    CHECK(self.last_confirmed() == 0);
    // A proposal is checked in one batch: the tokens the draft agrees with come without a decode each;
    // from the first it disagrees with it drafts alone (its cache drops the proposal's other rows).
    std::vector<int32_t> proposal(want.begin(), want.begin() + 5);
    proposal.insert(proposal.end(), {want[5] == 7 ? 8 : 7, 3, 4});
    CHECK(self.draft(0, kIds, dp, 512, proposal) == want);
    CHECK(self.last_confirmed() == 5);
    CHECK(self.last_decodes() == 7);  // the checking batch, then want[5..10] alone (want[11] reaches n_max)
    CHECK(self.draft(0, kIds, dp, 512, proposal, 2) == std::vector<int32_t>(want.begin(), want.begin() + 7));
    CHECK(self.last_decodes() == 2);  // at most 2 tokens alone: one decode after the first of them
    CHECK(self.draft(0, kIds, dp, 512, want) == want);
    CHECK(self.last_confirmed() == 12);
    CHECK(self.last_decodes() == 1);
    // A new prompt with the check: the catch-up goes in batches of 5, the last one holding the 5 rows checked.
    std::vector<int32_t> other_prompt = kIds;
    other_prompt[0] = 100;
    const std::vector<int32_t> other_want = greedy(ctx, other_prompt, 12);
    CHECK(self.draft(0, other_prompt, dp, 5, other_want) == other_want);
    CHECK(self.last_confirmed() == 5);
    CHECK(self.draft(0, kIds, dp, 512, proposal) == want);
    // Later tokens reuse the cached prefix and give the rest of the same continuation.
    std::vector<int32_t> longer = kIds;
    longer.insert(longer.end(), want.begin(), want.begin() + 5);
    dp.n_max = 7;
    CHECK(self.draft(0, longer, dp, 4) == std::vector<int32_t>(want.begin() + 5, want.end()));
    // p_min: nothing drafted when the first token is below it (random weights are far from confident);
    // n_min: a shorter draft is dropped.
    dp.p_min = 0.999f;
    CHECK(self.draft(0, kIds, dp, 512).empty());
    dp.p_min = 0;
    dp.n_min = 8;
    dp.n_max = 4;
    CHECK(self.draft(0, kIds, dp, 512).empty());
    // A different model with the same (id-only) vocabulary drafts, mostly other tokens.
    llm::check_draft_vocab(*target, *other);
    llm::DraftModel draft(*other, target->hp.n_vocab, cp, ctx);
    dp.n_min = 0;
    dp.n_max = 12;
    const std::vector<int32_t> d = draft.draft(0, kIds, dp, 512);
    CHECK(d.size() == 12);
    CHECK(d != want);
    // The target still decodes as before on the shared workers.
    CHECK(greedy(ctx, kIds, 12) == want);
}

TEST_CASE("speculative: a restricted draft head (head_vocab) computes the first ids' logits bit for bit, on every ISA tier") {
    const llm::Isa saved = llm::isa_current();
    for (const char* name : {"tiny-qwen2-Q8_0.gguf", "tiny-qwen2-Q4_K_M.gguf", "tiny-llama-F16.gguf"}) {
        for (llm::Isa isa : {llm::Isa::Scalar, llm::Isa::AVX2, llm::Isa::AVXVNNI, llm::Isa::AVX512}) {
            if (!llm::isa_supported(isa)) continue;
            llm::isa_set(isa);  // before loading: the output matrix is repacked for the tier in use
            auto model = llm::Model::load(golden(name));
            const int n_vocab = model->hp.n_vocab, kept = (n_vocab / 3 + 15) / 16 * 16;
            CAPTURE(name);
            CAPTURE(llm::isa_name(isa));
            llm::ContextParams cp;
            cp.n_ctx = 256;
            cp.n_threads = 2;
            llm::Context full(*model, cp);
            cp.head_vocab = kept - 5;  // rounded up to the 16-row group
            llm::Context restricted(*model, cp, full);
            CHECK(full.head_vocab() == n_vocab);
            CHECK(restricted.head_vocab() == kept);
            llm::Batch b;
            for (size_t i = 0; i < kIds.size(); i++) b.add(kIds[i], (int)i, 0, i % 3 == 0 || i + 1 == kIds.size());
            full.decode(b);
            restricted.decode(b);
            REQUIRE(restricted.n_logits() == full.n_logits());
            for (int r = 0; r < full.n_logits(); r++) {
                CHECK(memcmp(full.logits(r), restricted.logits(r), kept * sizeof(float)) == 0);
                const float* l = restricted.logits(r);
                CHECK(std::all_of(l + kept, l + n_vocab, [](float x) { return x == -INFINITY; }));
            }
            // The draft proposes what greedy decoding over the kept ids gives, never an id beyond.
            llm::DraftModel draft(*model, n_vocab, cp, full);
            llm::DraftParams dp;
            dp.n_max = 10;
            dp.p_min = 0;
            const std::vector<int32_t> d = draft.draft(0, kIds, dp, 512);
            CHECK(d == greedy(full, kIds, 10, kept));
            CHECK(std::all_of(d.begin(), d.end(), [&](int32_t t) { return t < kept; }));
            CHECK(greedy(full, kIds, 10) != greedy(full, kIds, 10, kept));  // the restriction mattered
        }
    }
    llm::isa_set(saved);
}

TEST_CASE("speculative: a draft model of another vocabulary is refused at load") {
    auto smol = llm::Model::load(kModel, [] { llm::ModelOptions mo; mo.vocab_only = true; return mo; }());
    auto gemma = llm::Model::load("models/gemma-3-270m-Q4_K_M.gguf", [] { llm::ModelOptions mo; mo.vocab_only = true; return mo; }());
    auto tiny = llm::Model::load(golden("tiny-llama-F16.gguf"));
    CHECK_THROWS_WITH_AS(llm::check_draft_vocab(*smol, *gemma), doctest::Contains("tokenizer"), llm::Error);
    CHECK_THROWS_AS(llm::check_draft_vocab(*smol, *tiny), llm::Error);
    CHECK_NOTHROW(llm::check_draft_vocab(*smol, *smol));
}

TEST_CASE("speculative: a sampler snapshot restores penalties, DRY, mirostat, the grammar and the random draws") {
    auto smol = llm::Model::load(kModel, [] { llm::ModelOptions mo; mo.vocab_only = true; return mo; }());
    const int n_vocab = smol->vocab.n_tokens();
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0, 2);
    std::vector<std::vector<float>> rows(24, std::vector<float>(n_vocab));
    for (auto& r : rows) for (float& x : r) x = nd(rng);
    auto run = [&](const llm::SamplerParams& p) {
        llm::Sampler s(p, &smol->vocab);
        for (int i = 0; i < 8; i++) s.accept(s.sample(rows[i].data(), n_vocab));
        const llm::Sampler::Snapshot snap = s.snapshot();
        std::vector<int32_t> first, again;
        for (int i = 8; i < 24; i++) { first.push_back(s.sample(rows[i].data(), n_vocab)); s.accept(first.back()); }
        s.restore(snap);
        CHECK(s.history_size() == 8);
        for (int i = 8; i < 24; i++) { again.push_back(s.sample(rows[i].data(), n_vocab)); s.accept(again.back()); }
        CHECK(first == again);
        return first;
    };
    llm::SamplerParams p;
    p.seed = 11;
    p.temperature = 1.0f;
    p.repeat_penalty = 1.3f;
    p.dry_multiplier = 0.8f;
    const std::vector<int32_t> plain = run(p);
    p.mirostat = 2;
    run(p);
    p.mirostat = 0;
    p.grammar = "root ::= [a-z ]+";
    const std::vector<int32_t> constrained = run(p);
    CHECK(constrained != plain);
    llm::Sampler without(llm::SamplerParams{}, &smol->vocab);
    llm::Sampler with(p, &smol->vocab);
    CHECK_THROWS_AS(without.restore(with.snapshot()), llm::Error);  // a grammar's state has nowhere to go
}

namespace {

// A server on tiny-llama (ids only) with extra flags; requests give token ids and read tokens back.
std::unique_ptr<ServerProcess> tiny_server(std::vector<std::string> extra) {
    std::vector<std::string> a = {"./llm-server", "-m", golden("tiny-llama-F16.gguf"), "--host", "127.0.0.1", "--port", "0",
                                  "-np", "4", "-c", "2048", "-t", "2", "--metrics", "--no-warmup"};
    a.insert(a.end(), extra.begin(), extra.end());
    return std::make_unique<ServerProcess>(a);
}

json complete(int port, json body) {
    body["return_tokens"] = true;
    Reply r = post(port, "/completion", body);
    REQUIRE_MESSAGE(r.status == 200, r.raw);
    return r.body;
}

json greedy_body(const std::vector<int32_t>& prompt, int n, int n_max) {
    return json{{"prompt", prompt}, {"n_predict", n}, {"temperature", 0}, {"cache_prompt", false}, {"speculative.n_max", n_max}};
}

double metric(const std::string& text, const std::string& name) {
    const size_t at = text.find("\nllamacpp:" + name + " ");
    REQUIRE_MESSAGE(at != std::string::npos, name);
    return atof(text.c_str() + at + name.size() + 11);
}

}  // namespace

TEST_CASE("speculative: the cost model sizes drafts by measured decode times and acceptance") {
    llm::DraftCost cost;
    // Before any measurement: everything is worth a try.
    CHECK(cost.decode_ms(4) == 0);
    CHECK(cost.best_length(0.1, 16, 1, 0) == 16);
    CHECK(cost.pays(0, 5, 100, 1));
    // The 1.5B target's batch costs on AVX-512 (ms): pp1 64, pp2 66, pp4 67, pp8 83, pp16 153.
    for (auto [n, ms] : {std::pair<int, double>{1, 64}, {2, 66}, {4, 67}, {8, 83}, {16, 153}}) cost.record_decode(n, ms);
    cost.record_decode(0, 1);     // ignored: no entries
    cost.record_decode(100, 1);   // ignored: a prompt chunk beyond the tracked sizes
    CHECK(cost.decode_ms(8) == doctest::Approx(83));
    CHECK(cost.decode_ms(3) == doctest::Approx(66 * 1.04 / 1.02));  // from pp2 by the prior's shape
    CHECK(cost.decode_ms(32) == doctest::Approx(153 * 4.0 / 2.0));  // from pp16: linear beyond 8
    cost.record_decode(8, 93);  // a moving average
    CHECK(cost.decode_ms(8) == doctest::Approx(0.8 * 83 + 0.2 * 93));
    cost.record_decode(8, 75);  // back: 0.8 * 85 + 0.2 * 75 = 83
    CHECK(cost.decode_ms(8) == doctest::Approx(83));
    CHECK(llm::DraftCost::expected_kept(0.5, 3) == doctest::Approx(0.5 + 0.25 + 0.125));
    CHECK(llm::DraftCost::expected_kept(1.0, 7) == doctest::Approx(7));
    // Free drafts (n-gram): a poor guess is still worth one row (1.1 tokens in 66 ms against 1 in 64),
    // not two; a good one is verified 9 at a time, where the extrapolated costs start to climb.
    CHECK(cost.best_length(0.1, 16, 1, 0) == 1);
    CHECK(cost.best_length(0.01, 16, 1, 0) == 0);
    CHECK(cost.best_length(0.97, 16, 1, 0) == 9);
    CHECK(cost.best_length(0.97, 4, 1, 0) == 4);
    // A draft model at 21.6 ms a token: the same acceptance earns shorter drafts.
    CHECK(cost.best_length(0.97, 16, 1, 21.6) == 5);
    CHECK(cost.best_length(0.3, 16, 1, 21.6) == 0);
    // Free-form text: the draft model mostly stops at once (0.44 drafted, 0.41 kept per call of 31 ms):
    // it does not pay; rewriting code (5.7 drafted, 5.5 kept per call of 145 ms) does.
    CHECK(!cost.pays(0.41, 0.44, 31, 1));
    CHECK(cost.pays(5.5, 5.7, 145, 1));
}

TEST_CASE("speculative: server with the target as its own draft: every draft accepted, the same tokens, 4 slots mixing") {
    auto s = tiny_server({"-md", golden("tiny-llama-F16.gguf"), "--draft-p-min", "0", "--spec-backoff", "none"});
    const int port = s->port;
    const json plain = complete(port, greedy_body(kIds, 40, 0));
    const json spec = complete(port, greedy_body(kIds, 40, 16));
    CHECK(spec["tokens"] == plain["tokens"]);
    CHECK(plain["tokens"].size() == 40);
    CHECK(!plain["timings"].contains("draft_n"));
    CHECK(spec["timings"]["draft_n"].get<int>() >= 30);
    CHECK(spec["timings"]["draft_n_accepted"] == spec["timings"]["draft_n"]);
    CHECK(spec["generation_settings"]["speculative.n_max"] == 16);
    // 4 concurrent requests, two speculating, two not, each its own prompt: the answers each gets alone.
    std::vector<std::vector<int32_t>> prompts;
    std::vector<json> alone;
    for (int i = 0; i < 4; i++) {
        std::vector<int32_t> p = kIds;
        p[0] = 100 + 50 * i;
        prompts.push_back(p);
        alone.push_back(complete(port, greedy_body(p, 32, 0))["tokens"]);
    }
    std::vector<json> together(4);
    std::vector<std::thread> th;
    for (int i = 0; i < 4; i++) th.emplace_back([&, i] { together[i] = complete(port, greedy_body(prompts[i], 32, i % 2 ? 0 : 8))["tokens"]; });
    for (auto& t : th) t.join();
    for (int i = 0; i < 4; i++) CHECK_MESSAGE(together[i] == alone[i], "prompt " << i);
    CHECK(alone[0] != alone[1]);
    // /slots and /props show the settings; /metrics counts drafted and accepted tokens.
    Reply props = get(port, "/props");
    CHECK(props.body["default_generation_settings"]["speculative"] == true);
    CHECK(props.body["default_generation_settings"]["params"]["speculative.p_min"] == 0.0);
    Reply slots = get(port, "/slots");
    REQUIRE(slots.status == 200);
    CHECK(slots.body.size() == 4);
    const std::string m = get(port, "/metrics").raw;
    CHECK(metric(m, "spec_decode_num_draft_tokens_total") >= 30 + 2 * 16);
    CHECK(metric(m, "spec_decode_num_accepted_tokens_total") == metric(m, "spec_decode_num_draft_tokens_total"));
    CHECK(metric(m, "spec_decode_num_drafts_total") >= 3);
    // Repeat and frequency penalties: the draft (greedy without them) is partly rejected, and the penalty
    // history holds only what was sampled, so the output is the one without speculation.
    json pen_plain = greedy_body(kIds, 40, 0), pen_spec = greedy_body(kIds, 40, 16);
    for (json* b : {&pen_plain, &pen_spec}) {
        (*b)["repeat_penalty"] = 1.5;
        (*b)["repeat_last_n"] = 16;
        (*b)["frequency_penalty"] = 0.3;
    }
    const json a = complete(port, pen_plain), b = complete(port, pen_spec);
    CHECK(b["tokens"] == a["tokens"]);
    CHECK(a["tokens"] != plain["tokens"]);  // the penalties changed the text
    const int drafted = b["timings"].value("draft_n", 0), accepted = b["timings"].value("draft_n_accepted", 0);
    CHECK(drafted > 0);
    CHECK(accepted < drafted);  // some drafts were rejected
    MESSAGE("with penalties: " << accepted << " of " << drafted << " drafted tokens accepted");
    for (int i = 0; i < 4; i++) CHECK(slots.body[i]["speculative"].is_boolean());
}

TEST_CASE("speculative: server with a different draft model: few drafts accepted, the output unchanged; the cost model backs off") {
    // --spec-backoff none: every step drafts; cost (the default): a draft model that costs as much as
    // the target and is rarely right is skipped for 1, 2, 4 .. steps after each try.
    int drafted_by_mode[2] = {0, 0};
    for (int mode = 0; mode < 2; mode++) {
        auto s = tiny_server({"-md", golden("tiny-qwen2-F16.gguf"), "--draft-p-min", "0", "--draft-max", "4", "--spec-backoff", mode ? "cost" : "none"});
        const int port = s->port;
        for (int i = 0; i < 3; i++) {
            std::vector<int32_t> p = kIds;
            p[1] = 500 + i;
            const json plain = complete(port, greedy_body(p, 32, 0));
            const json spec = complete(port, greedy_body(p, 32, 4));
            CHECK(spec["tokens"] == plain["tokens"]);
            const int drafted = spec["timings"].value("draft_n", 0), accepted = spec["timings"].value("draft_n_accepted", 0);
            if (mode == 0) CHECK(drafted >= 16);
            CHECK(accepted * 4 <= drafted);
            drafted_by_mode[mode] += drafted;
        }
    }
    MESSAGE("drafted without back-off " << drafted_by_mode[0] << ", with " << drafted_by_mode[1]);
    CHECK(drafted_by_mode[1] * 3 < drafted_by_mode[0]);
    CHECK(drafted_by_mode[1] > 0);  // it tries again now and then
}

TEST_CASE("speculative: server with n-gram lookup: the greedy output's own repeats are drafted, the output unchanged") {
    auto s = tiny_server({"--spec-type", "ngram-simple"});
    const int port = s->port;
    // Greedy text of a random model falls into loops ("619 166 619 166 ..."): the lookup drafts them.
    std::vector<int32_t> p;
    for (int r = 0; r < 3; r++) p.insert(p.end(), kIds.begin(), kIds.end());
    const json plain = complete(port, greedy_body(p, 48, 0));
    const json spec = complete(port, greedy_body(p, 48, 16));
    CHECK(spec["tokens"] == plain["tokens"]);
    const int drafted = spec["timings"].value("draft_n", 0), accepted = spec["timings"].value("draft_n_accepted", 0);
    CHECK(drafted > 0);
    CHECK(accepted > 0);
    MESSAGE("n-gram: " << accepted << " of " << drafted << " drafted tokens accepted");
}

TEST_CASE("speculative: sampled tokens follow the target's distribution (chi-square), seed for seed as without drafts") {
    auto s = tiny_server({"-md", golden("tiny-llama-F16.gguf"), "--draft-p-min", "0", "--spec-backoff", "none"});
    const int port = s->port;
    // The target's own distribution of the third token after the prompt and a fixed two-token prefix,
    // through the chain the requests use (top_k 4, temperature 1).
    auto target = llm::Model::load(golden("tiny-llama-F16.gguf"));
    llm::ContextParams cp;
    cp.n_ctx = 256;
    llm::Context ctx(*target, cp);
    const int n_runs = 400;
    auto body = [&](int seed, int n_max) {
        return json{{"prompt", kIds}, {"n_predict", 3}, {"temperature", 1.0}, {"top_k", 4}, {"top_p", 1.0}, {"min_p", 0.0},
                    {"seed", seed}, {"cache_prompt", false}, {"speculative.n_max", n_max}};
    };
    std::vector<std::vector<int32_t>> runs[2];
    std::atomic<int> next{0};
    for (int mode = 0; mode < 2; mode++) {
        runs[mode].resize(n_runs);
        next = 0;
        std::vector<std::thread> th;
        for (int c = 0; c < 4; c++) {
            th.emplace_back([&, mode] {
                for (int i; (i = next++) < n_runs;) runs[mode][i] = complete(port, body(i, mode ? 8 : 0))["tokens"].get<std::vector<int32_t>>();
            });
        }
        for (auto& t : th) t.join();
    }
    CHECK(runs[0] == runs[1]);  // the same seed draws the same tokens with or without speculation
    // Chi-square of the third token, among the runs whose first two tokens are the most common prefix.
    std::map<std::pair<int32_t, int32_t>, int> prefixes;
    for (const auto& r : runs[1]) prefixes[{r[0], r[1]}]++;
    const auto prefix = std::max_element(prefixes.begin(), prefixes.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
    std::vector<int32_t> ids = kIds;
    ids.push_back(prefix.first);
    ids.push_back(prefix.second);
    llm::Batch b;
    for (size_t i = 0; i < ids.size(); i++) b.add(ids[i], (int)i, 0, i + 1 == ids.size());
    ctx.decode(b);
    const float* l = ctx.logits(0);
    std::vector<int32_t> top(target->hp.n_vocab);
    for (int i = 0; i < target->hp.n_vocab; i++) top[i] = i;
    std::partial_sort(top.begin(), top.begin() + 4, top.end(), [&](int32_t x, int32_t y) { return l[x] > l[y]; });
    double z = 0;
    for (int k = 0; k < 4; k++) z += std::exp((double)l[top[k]] - l[top[0]]);
    std::map<int32_t, int> count;
    int n = 0;
    for (const auto& r : runs[1]) {
        if (r[0] == prefix.first && r[1] == prefix.second) { count[r[2]]++; n++; }
    }
    REQUIRE(n >= 40);
    // Bins of the top 4 by probability; the least likely ones are merged until each expects >= 5 draws.
    std::vector<double> expected, observed;
    int seen = 0;
    for (int k = 0; k < 4; k++) {
        const double e = n * std::exp((double)l[top[k]] - l[top[0]]) / z;
        if (expected.empty() || expected.back() >= 5) {
            expected.push_back(e);
            observed.push_back(count[top[k]]);
        } else {
            expected.back() += e;
            observed.back() += count[top[k]];
        }
        seen += count[top[k]];
    }
    if (expected.size() > 1 && expected.back() < 5) {
        expected[expected.size() - 2] += expected.back();
        observed[observed.size() - 2] += observed.back();
        expected.pop_back();
        observed.pop_back();
    }
    double chi2 = 0;
    for (size_t k = 0; k < expected.size(); k++) chi2 += (observed[k] - expected[k]) * (observed[k] - expected[k]) / expected[k];
    CHECK(seen == n);  // only the target's top 4 were ever drawn
    REQUIRE(expected.size() >= 2);
    const double critical[] = {0, 10.83, 13.82, 16.27};  // p = 0.001 for 1..3 degrees of freedom
    CHECK(chi2 < critical[expected.size() - 1]);
    MESSAGE("chi-square " << chi2 << " over " << n << " runs with prefix " << prefix.first << "," << prefix.second);
}

TEST_CASE("speculative: -p mode with n-gram lookup and a draft model prints the text it prints without") {
    const std::string prompt = "def add(a, b):\\n    return a + b\\n\\ndef sub(a, b):\\n    return a - b\\n\\ndef mul(a, b):\\n";
    const std::string base = std::string("./llm-server -m ") + kModel + " -e -p '" + prompt + "' -n 24 --temp 0 -c 512 -t 2 ";
    std::string plain, ngram, self, log;
    REQUIRE(testutil::run(base + "2>/dev/null", &plain) == 0);
    REQUIRE(testutil::run(base + "--spec-type ngram-simple 2>/dev/null", &ngram) == 0);
    REQUIRE(testutil::run(base + "-md " + kModel + " --draft-p-min 0 --spec-backoff none --spec-draft-vocab 0 2>&1 >/dev/null", &log) == 0);
    REQUIRE(testutil::run(base + "-md " + kModel + " --draft-p-min 0 2>/dev/null", &self) == 0);
    CHECK(plain.size() > strlen("def add"));
    CHECK(ngram == plain);
    CHECK(self == plain);
    // Both drafters: the draft model checks the lookup's proposals in one batch (the prompt ends where
    // the text repeats: the lookup proposes the first function's body), the text unchanged.
    const std::string again = std::string("./llm-server -m ") + kModel + " -e -p 'def add(a, b):\\n    return a + b\\n\\ndef sub(a, b):\\n    return a - b\\n\\ndef add(a, b):' -n 24 --temp 0 -c 512 -t 2 ";
    std::string again_plain, both, both_log;
    const std::string both_flags = "-md " + std::string(kModel) + " --spec-type ngram-simple --draft-p-min 0 ";
    REQUIRE(testutil::run(again + "2>/dev/null", &again_plain) == 0);
    REQUIRE(testutil::run(again + both_flags + "2>/dev/null", &both) == 0);
    CHECK(both == again_plain);
    REQUIRE(testutil::run(again + both_flags + "--spec-backoff none 2>&1 >/dev/null", &both_log) == 0);
    const size_t checks_at = both_log.find("draft checks =");
    REQUIRE(checks_at != std::string::npos);
    int checked = 0, confirmed = 0;
    REQUIRE(sscanf(both_log.c_str() + checks_at, "draft checks = %d lookup proposals checked by the draft model, %d tokens confirmed", &checked,
                   &confirmed) == 2);
    CHECK(checked >= 1);
    CHECK(confirmed >= 4);
    MESSAGE("both drafters: " << checked << " proposals checked, " << confirmed << " tokens confirmed");
    // Every draft of the model itself is accepted: "draft = N tokens in D drafts, N accepted".
    const size_t at = log.find("draft =");
    REQUIRE(at != std::string::npos);
    int drafted = 0, drafts = 0, accepted = 0;
    REQUIRE(sscanf(log.c_str() + at, "draft = %d tokens in %d drafts, %d accepted", &drafted, &drafts, &accepted) == 3);
    CHECK(drafted >= 16);
    CHECK(accepted == drafted);
    // A draft model whose vocabulary is not the target's is refused with a clear error.
    REQUIRE(testutil::run(base + "-md models/gemma-3-270m-Q4_K_M.gguf 2>&1", &log) != 0);
    CHECK(log.find("draft model: its tokenizer") != std::string::npos);
}

TEST_CASE("speculative: a restricted draft head (--spec-draft-vocab) leaves the output unchanged, in -p mode and over HTTP") {
    const std::string prompt = "def add(a, b):\\n    return a + b\\n\\ndef sub(a, b):\\n    return a - b\\n\\ndef mul(a, b):\\n";
    const std::string base = std::string("./llm-server -m ") + kModel + " -e -p '" + prompt + "' -n 24 --temp 0 -c 512 -t 2 ";
    std::string plain, log, restricted;
    REQUIRE(testutil::run(base + "2>/dev/null", &plain) == 0);
    const std::string text_path = "/tmp/llm-test-spec-vocab-" + std::to_string(getpid()) + ".txt";
    REQUIRE(testutil::run(base + "-md " + kModel + " --draft-p-min 0 --spec-backoff none --spec-draft-vocab 1000 2>&1 >" + text_path, &log) == 0);
    restricted = testutil::read_file(text_path);
    std::remove(text_path.c_str());
    CHECK(restricted == plain);
    const size_t at = log.find("draft =");
    REQUIRE(at != std::string::npos);
    int drafted = 0, drafts = 0, accepted = 0;
    REQUIRE(sscanf(log.c_str() + at, "draft = %d tokens in %d drafts, %d accepted", &drafted, &drafts, &accepted) == 3);
    CHECK(drafted > 0);
    CHECK(log.find("ms per decode") != std::string::npos);
    MESSAGE("SmolLM as its own draft over ids < 1000: " << accepted << " of " << drafted << " accepted");
    REQUIRE(testutil::run(base + "--spec-draft-vocab -1 2>&1", &log) != 0);
    CHECK(log.find("--spec-draft-vocab") != std::string::npos);
    // Tiny models (ids only): the target as its own draft and a different draft, a third of the ids kept.
    auto tiny = llm::Model::load(golden("tiny-llama-F16.gguf"));
    REQUIRE(tiny->hp.n_vocab >= 64);
    const std::string kept = std::to_string(tiny->hp.n_vocab / 3);
    for (const char* draft : {"tiny-llama-F16.gguf", "tiny-qwen2-F16.gguf"}) {
        CAPTURE(draft);
        auto s = tiny_server({"-md", golden(draft), "--draft-p-min", "0", "--spec-backoff", "none", "--spec-draft-vocab", kept});
        for (int i = 0; i < 2; i++) {
            std::vector<int32_t> p = kIds;
            p[2] = 200 + 90 * i;
            const json want = complete(s->port, greedy_body(p, 32, 0)), got = complete(s->port, greedy_body(p, 32, 8));
            CHECK(got["tokens"] == want["tokens"]);
            CHECK(got["timings"].value("draft_n", 0) > 0);
        }
    }
}
