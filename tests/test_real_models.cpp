// The two real models scripts/setup fetches from PyPI: greedy continuations must make sense.
#include <doctest/doctest.h>

#include <cctype>
#include <sstream>

#include "../llm.hpp"
#include "util.hpp"

namespace {

std::string greedy(const std::string& path, const std::string& prompt, int n_predict) {
    REQUIRE_MESSAGE(testutil::file_exists(path), path << " is missing: run scripts/setup");
    auto m = llm::Model::load(path);
    llm::ContextParams cp;
    cp.n_ctx = 256;
    llm::Context ctx(*m, cp);
    std::vector<int32_t> toks = m->vocab.tokenize(prompt, true, true);
    llm::Batch b;
    for (size_t i = 0; i < toks.size(); i++) b.add(toks[i], (int)i, 0, i + 1 == toks.size());
    ctx.decode(b);
    llm::SamplerParams sp;
    sp.temperature = 0;
    llm::Sampler s(sp);
    std::string out;
    for (int i = 0, pos = (int)toks.size(); i < n_predict; i++) {
        int32_t t = s.sample(ctx.logits(0), m->hp.n_vocab);
        if (m->vocab.is_eog(t)) break;
        out += m->vocab.token_to_piece(t, false);
        b.clear();
        b.add(t, pos++, 0, true);
        ctx.decode(b);
    }
    return out;
}

// Share of whitespace-separated words made of letters that are common English words.
double english_score(const std::string& text) {
    static const char* common[] = {"the", "of", "and", "a", "to", "in", "is", "it", "that", "was", "for", "on", "are",
                                   "as", "with", "his", "they", "at", "be", "this", "from", "have", "or", "by", "one",
                                   "had", "not", "but", "what", "all", "were", "when", "we", "there", "can", "an",
                                   "which", "their", "if", "do", "will", "each", "about", "how", "up", "out", "many",
                                   "has", "more", "its", "also", "been", "very", "most", "city", "country", "capital"};
    std::stringstream ss(text);
    std::string w;
    int words = 0, hits = 0;
    while (ss >> w) {
        std::string lw;
        for (char c : w) if (isalpha((unsigned char)c)) lw += (char)tolower((unsigned char)c);
        if (lw.empty()) continue;
        words++;
        for (const char* c : common) hits += lw == c;
    }
    return words ? (double)hits / words : 0;
}

}  // namespace

TEST_CASE("real model: SmolLM2-135M-Instruct names Paris") {
    std::string out = greedy("models/SmolLM2-135M-Instruct-Q4_1.gguf", "The capital of France is", 16);
    MESSAGE("SmolLM2: The capital of France is" << out);
    CHECK(out.find("Paris") != std::string::npos);
}

TEST_CASE("real model: Gemma 3 270M (a base model) writes coherent English") {
    std::string out = greedy("models/gemma-3-270m-Q4_K_M.gguf", "The capital of France is", 32);
    MESSAGE("Gemma 3: The capital of France is" << out);
    CHECK(out.size() > 40);
    CHECK(english_score(out) > 0.25);
}
