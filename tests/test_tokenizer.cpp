// Tokenizer: every reference vector of shared/vocab (ids produced by llama.cpp with add_special and
// parse_special off) must come out exactly; plus detokenization round trips, special-token parsing,
// BOS/EOS handling and vocabularies without a tokenizer.
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>

#include "../llm.hpp"
#include "util.hpp"

namespace {

std::string vocab_dir() { return testutil::shared_dir() + "/vocab/"; }

llm::Vocab load_vocab(const std::string& family) {
    auto g = llm::GGUF::open(vocab_dir() + "ggml-vocab-" + family + ".gguf", false);
    return llm::Vocab(*g);
}

struct VocabCase {
    std::string text;
    std::vector<int32_t> ids;
};

// .inp: texts each followed by "\n__ggml_vocab_test__\n"; .out: one line of ids per text.
std::vector<VocabCase> read_cases(const std::string& family) {
    std::string inp = testutil::read_file(vocab_dir() + "ggml-vocab-" + family + ".gguf.inp");
    const std::string out = testutil::read_file(vocab_dir() + "ggml-vocab-" + family + ".gguf.out");
    const std::string sep = "\n__ggml_vocab_test__\n";
    if (inp.size() >= sep.size() && inp.compare(inp.size() - sep.size(), sep.size(), sep) == 0) inp.resize(inp.size() - sep.size());
    std::vector<VocabCase> cases;
    for (size_t p = 0;;) {
        size_t q = inp.find(sep, p);
        cases.push_back({inp.substr(p, q == std::string::npos ? std::string::npos : q - p), {}});
        if (q == std::string::npos) break;
        p = q + sep.size();
    }
    std::stringstream lines(out);
    std::string line;
    for (VocabCase& c : cases) {
        if (!std::getline(lines, line)) break;
        std::stringstream ls(line);
        int32_t id;
        while (ls >> id) c.ids.push_back(id);
    }
    return cases;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

bool contains(const std::vector<int32_t>& v, int32_t id) { return std::find(v.begin(), v.end(), id) != v.end(); }

// Texts the BPE detokenizer's space clean-up changes on purpose (" ?" -> "?", " 's" -> "'s", ...).
bool touched_by_cleanup(const std::string& t) {
    for (const char* p : {" ?", " !", " .", " ,", " '"})
        if (t.find(p) != std::string::npos) return true;
    return false;
}

bool have_vocab_data() {
    if (testutil::file_exists(vocab_dir() + "ggml-vocab-gpt-2.gguf")) return true;
    MESSAGE("skipped: no tokenizer reference data under " << vocab_dir());
    return false;
}

}  // namespace

TEST_CASE("tokenizer: reference vectors of every family") {
    if (!have_vocab_data()) return;
    const auto inputs = testutil::list_dir(vocab_dir(), ".gguf.inp");
    CHECK(inputs.size() >= 9);
    for (const std::string& inp : inputs) {
        const std::string family = inp.substr(11, inp.size() - 11 - 9);  // ggml-vocab-FAMILY.gguf.inp
        INFO("family " << family);
        const llm::Vocab v = load_vocab(family);
        const auto cases = read_cases(family);
        CHECK(cases.size() >= 40);
        int exact = 0;
        for (size_t i = 0; i < cases.size(); i++) {
            INFO("text #" << i << ": '" << cases[i].text << "'");
            const auto ids = v.tokenize(cases[i].text, false, false);
            CHECK(ids == cases[i].ids);
            exact += ids == cases[i].ids;
            // Decoding gives the text back, except where the BPE clean-up deliberately edits spacing.
            // WordPiece lowercases and drops accents and spacing: no way back.
            if (v.model_type() != "bert" && (!v.clean_spaces() || !touched_by_cleanup(cases[i].text)))
                CHECK(v.detokenize(ids) == cases[i].text);
        }
        MESSAGE(family << ": " << exact << "/" << cases.size() << " texts exact");
    }
}

TEST_CASE("tokenizer: metadata of the reference vocabularies") {
    if (!have_vocab_data()) return;
    const llm::Vocab spm = load_vocab("llama-spm");
    CHECK(spm.model_type() == "llama");
    CHECK(spm.n_tokens() == 32000);
    CHECK(spm.bos() == 1);
    CHECK(spm.eos() == 2);
    CHECK(spm.unk() == 0);
    CHECK(spm.add_bos());
    CHECK_FALSE(spm.add_eos());
    CHECK(spm.add_space_prefix());
    CHECK(spm.is_eog(2));
    CHECK_FALSE(spm.is_eog(1));
    CHECK(spm.token_text(1) == "<s>");
    CHECK(spm.find_token("<0x0A>") == 13);
    CHECK(spm.is_control(1));

    const llm::Vocab phi3 = load_vocab("phi-3");
    CHECK(phi3.eos() == 32000);
    for (const char* t : {"<|endoftext|>", "<|end|>"}) CHECK(phi3.is_eog(phi3.find_token(t)));
    CHECK_FALSE(phi3.is_eog(phi3.find_token("<|user|>")));

    const llm::Vocab gpt2 = load_vocab("gpt-2");
    CHECK(gpt2.model_type() == "gpt2");
    CHECK(gpt2.pre_type() == "gpt-2");
    CHECK(gpt2.bos() == 50256);
    CHECK_FALSE(gpt2.add_bos());
    CHECK(gpt2.is_eog(50256));
    CHECK(gpt2.clean_spaces());

    const llm::Vocab neox = load_vocab("gpt-neox");  // no tokenizer.ggml.pre: the default pre-tokenizer
    CHECK(neox.pre_type() == "default");
    CHECK(neox.detokenize(neox.tokenize("Hello world 12345", false, false)) == "Hello world 12345");
}

TEST_CASE("tokenizer: token pieces") {
    if (!have_vocab_data()) return;
    const llm::Vocab spm = load_vocab("llama-spm");
    CHECK(spm.token_to_piece(13) == "\n");  // <0x0A>
    CHECK(spm.token_to_piece(1) == "<s>");
    CHECK(spm.token_to_piece(1, false) == "");
    CHECK(spm.token_to_piece(spm.find_token("\xE2\x96\x81Hello")) == " Hello");
    CHECK(spm.token_to_piece(-1) == "");
    CHECK(spm.token_to_piece(1 << 30) == "");

    const llm::Vocab gpt2 = load_vocab("gpt-2");
    CHECK(gpt2.token_to_piece(gpt2.find_token("\xC4\xA0world")) == " world");  // Ġworld
    CHECK(gpt2.token_to_piece(gpt2.find_token("\xC4\x8A")) == "\n");           // Ċ
    CHECK(gpt2.token_to_piece(50256, false) == "");
    // Pieces of a multi-byte character split over tokens concatenate to the character.
    const std::string llama = "\xF0\x9F\xA6\x99";  // 🦙
    const auto ids = gpt2.tokenize(llama, false, false);
    CHECK(ids.size() > 1);
    std::string joined;
    for (int32_t id : ids) joined += gpt2.token_to_piece(id);
    CHECK(joined == llama);
    // Bytes that are not valid UTF-8 still tokenize and survive as U+FFFD.
    CHECK(gpt2.detokenize(gpt2.tokenize("a\xFF" "b", false, false)) == "a\xEF\xBF\xBD" "b");
}

TEST_CASE("tokenizer: special tokens are parsed only when asked") {
    if (!have_vocab_data()) return;
    const llm::Vocab spm = load_vocab("llama-spm");
    const auto plain = spm.tokenize("<s>Hello</s>", false, false);
    CHECK_FALSE(contains(plain, 1));
    CHECK_FALSE(contains(plain, 2));
    // Parsed: a SentencePiece text fragment after a special token gets the space prefix again.
    CHECK(spm.tokenize("<s>Hello</s>", false, true) == concat(concat({1}, spm.tokenize("Hello", false, false)), {2}));
    CHECK(spm.detokenize(spm.tokenize("<s>Hello</s>", false, true), true) == "<s> Hello</s>");
    CHECK(spm.detokenize(spm.tokenize("<s>Hello</s>", false, true), false) == " Hello");

    const llm::Vocab gpt2 = load_vocab("gpt-2");
    CHECK(gpt2.tokenize("<|endoftext|>", false, true) == std::vector<int32_t>{50256});
    CHECK(gpt2.tokenize("a<|endoftext|>b", false, true) ==
          concat(concat(gpt2.tokenize("a", false, false), {50256}), gpt2.tokenize("b", false, false)));
    CHECK_FALSE(contains(gpt2.tokenize("<|endoftext|>", false, false), 50256));
    CHECK(gpt2.detokenize(gpt2.tokenize("x<|endoftext|>y", false, true), true) == "x<|endoftext|>y");
    CHECK(gpt2.detokenize(gpt2.tokenize("x<|endoftext|>y", false, true), false) == "xy");

    const llm::Vocab phi3 = load_vocab("phi-3");
    const int32_t user = phi3.find_token("<|user|>"), end = phi3.find_token("<|end|>");
    // Phi-3's specials swallow the whitespace after them (rstrip), as in llama.cpp.
    CHECK(phi3.tokenize("<|user|>\n  Hi<|end|>", false, true) == phi3.tokenize("<|user|>Hi<|end|>", false, true));
    const auto chat = phi3.tokenize("<|user|>\nHi<|end|>\n", false, true);
    REQUIRE(chat.size() >= 3);
    CHECK(chat.front() == user);
    CHECK(chat.back() == end);
    CHECK_FALSE(contains(phi3.tokenize("a<|end|>b", false, false), end));

    // User-defined tokens are split out even without parse_special (DeepSeek Coder's added "À", whose
    // text is the byte-level form of byte 0xC0, is matched against the raw text).
    const llm::Vocab coder = load_vocab("deepseek-coder");
    const int32_t a_grave = coder.find_token("\xC3\x80");
    CHECK(coder.token_attr(a_grave) == llm::TOKEN_ATTR_USER_DEFINED);
    CHECK(coder.tokenize("x\xC3\x80y", false, false) ==
          concat(concat(coder.tokenize("x", false, false), {a_grave}), coder.tokenize("y", false, false)));
}

TEST_CASE("tokenizer: BOS and EOS from metadata") {
    if (!have_vocab_data()) return;
    const llm::Vocab spm = load_vocab("llama-spm");
    CHECK(spm.tokenize("Hello", true, false) == concat({1}, spm.tokenize("Hello", false, false)));
    CHECK(spm.tokenize("", true, false) == std::vector<int32_t>{1});
    CHECK(spm.tokenize("", false, false).empty());
    // The BOS consumes the detokenizer's leading-space removal, as in llama.cpp.
    CHECK(spm.detokenize(spm.tokenize("Hello", true, false)) == " Hello");
    CHECK(spm.detokenize(spm.tokenize("Hello", false, false)) == "Hello");

    const llm::Vocab coder = load_vocab("deepseek-coder");  // add_bos_token = true
    CHECK(coder.tokenize("x", true, false).front() == 32013);
    CHECK(coder.tokenize("x", true, false).size() == coder.tokenize("x", false, false).size() + 1);

    const llm::Vocab gpt2 = load_vocab("gpt-2");  // no add_bos_token: BPE adds nothing
    CHECK(gpt2.tokenize("Hello", true, false) == gpt2.tokenize("Hello", false, false));
}

TEST_CASE("tokenizer: no vocabulary") {
    const llm::Vocab none;
    CHECK(none.model_type() == "no_vocab");
    CHECK(none.n_tokens() == 0);
    CHECK(none.bos() == -1);
    CHECK_FALSE(none.has_tokenizer());
    CHECK_FALSE(none.is_eog(0));
    CHECK(none.token_to_piece(0) == "");
    CHECK(none.detokenize({1, 2, 3}) == "");
    CHECK_THROWS_AS(none.tokenize("x", false, false), llm::Error);

    const std::string model = testutil::shared_dir() + "/golden/models/tiny-llama-F16.gguf";
    if (!testutil::file_exists(model)) return;
    auto g = llm::GGUF::open(model, false);
    const llm::Vocab v(*g);  // tokenizer.ggml.model = no_vocab; size from llama.vocab_size
    CHECK(v.model_type() == "no_vocab");
    CHECK(v.n_tokens() == 1024);
    CHECK_FALSE(v.has_tokenizer());
}
