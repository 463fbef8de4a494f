// The llm-server command-line modes, run as users run them.
#include <doctest/doctest.h>

#include <cstring>
#include <unistd.h>

#include "../llm.hpp"
#include "util.hpp"

namespace {

std::string golden(const std::string& name) { return testutil::shared_dir() + "/golden/models/" + name; }

int run(const std::string& args, std::string* out) { return testutil::run("./llm-server " + args + " 2>&1", out); }

}  // namespace

TEST_CASE("cli: --tokenize on a vocabulary-only file, text from -f taken byte for byte") {
    const std::string vocab = testutil::shared_dir() + "/vocab/ggml-vocab-gpt-2.gguf";
    const std::string path = "/tmp/llm-cli-tok-" + std::to_string(getpid()) + ".txt";
    testutil::write_file(path, "ied 4 \xc2\xbd months\n");  // the first test text of the gpt-2 vectors, plus a newline
    std::string out;
    REQUIRE(testutil::run("./llm-server -m " + vocab + " --tokenize -p 'ied 4 \xc2\xbd months'", &out) == 0);
    CHECK(out == "798 604 25208 1933\n");
    REQUIRE(testutil::run("./llm-server -m " + vocab + " --tokenize -f " + path, &out) == 0);
    CHECK(out == "798 604 25208 1933 198\n");  // the trailing newline is a token of its own
    unlink(path.c_str());
    // Special tokens: plain text unless --parse-special; BOS/EOS only with --add-special.
    const std::string spm = testutil::shared_dir() + "/vocab/ggml-vocab-llama-spm.gguf";
    std::string plain, parsed, special;
    REQUIRE(testutil::run("./llm-server -m " + spm + " --tokenize -p '</s>'", &plain) == 0);
    REQUIRE(testutil::run("./llm-server -m " + spm + " --tokenize --parse-special -p '</s>'", &parsed) == 0);
    REQUIRE(testutil::run("./llm-server -m " + spm + " --tokenize --add-special -p 'Hi'", &special) == 0);
    CHECK(parsed == "2\n");
    CHECK(plain != parsed);
    CHECK(special.rfind("1 ", 0) == 0);  // BOS first
}

// The last row of `llm-server --prompt-ids 5,6,..,4+n --dump-logits` with extra flags, and the
// library's logits for the same tokens (loaded with `mo`).
static std::vector<float> cli_last_logits(const std::string& model, int n, const std::string& flags) {
    const std::string path = "/tmp/llm-cli-logits-" + std::to_string(getpid()) + ".f32";
    std::string ids, out;
    for (int i = 0; i < n; i++) ids += (i ? "," : "") + std::to_string(5 + i);
    REQUIRE(run("-m " + golden(model) + " --prompt-ids " + ids + " --dump-logits " + path + " -t 1 " + flags, &out) == 0);
    const std::string raw = testutil::read_file(path);
    unlink(path.c_str());
    REQUIRE(raw.size() % (n * sizeof(float)) == 0);
    const size_t nv = raw.size() / n / sizeof(float);
    std::vector<float> last(nv);
    memcpy(last.data(), raw.data() + (n - 1) * nv * sizeof(float), nv * sizeof(float));
    return last;
}
static std::vector<float> library_last_logits(const std::string& model, int n, const llm::ModelOptions& mo) {
    auto m = llm::Model::load(golden(model), mo);
    llm::ContextParams cp;
    cp.n_ctx = 256;
    llm::Context ctx(*m, cp);
    llm::Batch b;
    for (int i = 0; i < n; i++) b.add(5 + i, i, 0, true);
    ctx.decode(b);
    return std::vector<float>(ctx.logits(n - 1), ctx.logits(n - 1) + m->hp.n_vocab);
}

TEST_CASE("cli: --dump-logits writes n_tokens x n_vocab float32 equal to the library's") {
    const std::vector<float> cli = cli_last_logits("tiny-qwen2-Q8_0.gguf", 4, ""), lib = library_last_logits("tiny-qwen2-Q8_0.gguf", 4, {});
    REQUIRE(cli.size() == 1024);
    REQUIRE(lib.size() == 1024);
    double d = 0;
    for (int j = 0; j < 1024; j++) d = std::max(d, (double)std::fabs(cli[j] - lib[j]));
    CHECK(d < 1e-4);
}

TEST_CASE("cli: one-shot completion, bench and load reports") {
    std::string out;
    REQUIRE(run("-m " + golden("tiny-llama-Q4_K_M.gguf") + " --prompt-ids 1,2,3 -n 8 --temp 0 -c 64", &out) == 0);
    CHECK(out.find("weights:") == std::string::npos);  // the load line carries the size instead
    CHECK(out.find("MiB") != std::string::npos);
    CHECK(out.find("KiB per token") != std::string::npos);
    CHECK(out.find("prompt eval time") != std::string::npos);
    CHECK(out.find("tokens per second") != std::string::npos);
    REQUIRE(run("-m " + golden("tiny-llama-Q4_K_M.gguf") + " --bench -p 16 -n 4 -r 2", &out) == 0);
    CHECK(out.find("pp16") != std::string::npos);
    CHECK(out.find("tg4") != std::string::npos);
}

TEST_CASE("cli: --no-repack gives the library's file-layout logits") {
    llm::ModelOptions rows_only;
    rows_only.interleave = false;
    // the same row kernels on both sides: equal to the bit
    CHECK(cli_last_logits("tiny-llama-Q4_K-pure.gguf", 3, "--no-repack") == library_last_logits("tiny-llama-Q4_K-pure.gguf", 3, rows_only));
}

TEST_CASE("cli: -tb/--threads-batch and --poll (prefill threads, idle busy-wait level) keep the results") {
    // -t 1 comes first in cli_last_logits; prefill then runs on 2 threads, workers sleep at once
    CHECK(cli_last_logits("tiny-llama-Q4_K_M.gguf", 5, "-tb 2 --poll 0") == cli_last_logits("tiny-llama-Q4_K_M.gguf", 5, ""));
    std::string out;
    REQUIRE(run("-m " + golden("tiny-llama-Q4_K_M.gguf") + " --bench -p 16 -n 2 -r 1 -t 1 --threads-batch 2 --poll 100", &out) == 0);
    CHECK(out.find("|       2 |    pp16 |") != std::string::npos);  // one pool of max(-t, -tb) threads
    CHECK(run("-m " + golden("tiny-llama-Q4_K_M.gguf") + " -p hi --poll 101", &out) == 1);
    CHECK(out.find("--poll must be in 0..100") != std::string::npos);
    CHECK(run("-m " + golden("tiny-llama-Q4_K_M.gguf") + " -p hi -tb -2", &out) == 1);
}

TEST_CASE("cli: bad input is a clear error and a non-zero exit, never a crash") {
    std::string out;
    CHECK(run("-m /etc/os-release -p hi", &out) == 1);
    CHECK(out.find("not a GGUF file") != std::string::npos);
    CHECK(run("-m /nonexistent.gguf -p hi", &out) == 1);
    CHECK(out.find("cannot open") != std::string::npos);
    CHECK(run("-m " + golden("tiny-llama-F16.gguf") + " --prompt-ids 1,2,3,4,5,6,7,8,9 -c 8", &out) == 1);
    CHECK(out.find("context") != std::string::npos);
    CHECK(run("-m " + golden("tiny-llama-F16.gguf") + " --prompt-ids 1,99999", &out) == 1);
    CHECK(out.find("outside the vocabulary") != std::string::npos);
    CHECK(run("-m " + golden("tiny-llama-F16.gguf") + " -p hi -ctk q9_9", &out) == 1);
    CHECK(out.find("unknown type") != std::string::npos);
    CHECK(run("--no-such-flag", &out) == 1);
    // A truncated model file.
    const std::string cut = "/tmp/llm-cli-cut-" + std::to_string(getpid()) + ".gguf";
    testutil::write_file(cut, testutil::read_file(golden("tiny-llama-F16.gguf")).substr(0, 100000));
    CHECK(run("-m " + cut + " -p hi", &out) == 1);
    CHECK(out.find("truncated") != std::string::npos);
    unlink(cut.c_str());
}

TEST_CASE("cli: -r / --reverse-prompt stops a completion where the text appears (-r N with --bench: repetitions)") {
    const std::string smol = "-m models/SmolLM2-135M-Instruct-Q4_1.gguf -p 'The capital of France is' -n 24 --temp 0 --ignore-eos";
    std::string full, stopped, long_form;
    REQUIRE(testutil::run("./llm-server " + smol + " 2>/dev/null", &full) == 0);
    REQUIRE(testutil::run("./llm-server " + smol + " -r . 2>/dev/null", &stopped) == 0);
    REQUIRE(testutil::run("./llm-server " + smol + " --reverse-prompt . 2>/dev/null", &long_form) == 0);
    const size_t dot = full.find('.');
    REQUIRE(dot != std::string::npos);
    REQUIRE(dot + 1 < full.size() - 1);  // the full run goes on after the first '.'
    CHECK(stopped == full.substr(0, dot + 1) + "\n");
    CHECK(long_form == stopped);
}

TEST_CASE("cli: -sp / --special prints special tokens as their text") {
    // a question SmolLM2 answers in one word on every tier ("Say hi." was a near tie at its third
    // token, so the end token moved past the 24 tokens with the last bit of the vector softmax's sums)
    const std::string prompt = "<|im_start|>user\nIs the sky blue? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n";
    const std::string cmd = "./llm-server -m models/SmolLM2-135M-Instruct-Q4_1.gguf -p '" + prompt + "' -n 24 --temp 0 --ignore-eos 2>/dev/null";
    std::string plain, special;
    REQUIRE(testutil::run(cmd, &plain) == 0);
    REQUIRE(testutil::run(cmd + " -sp", &special) == 0);
    REQUIRE(plain.compare(0, prompt.size(), prompt) == 0);
    REQUIRE(special.compare(0, prompt.size(), prompt) == 0);
    CHECK(plain.find("<|im_end|>", prompt.size()) == std::string::npos);   // the answer's end token, silent
    CHECK(special.find("<|im_end|>", prompt.size()) != std::string::npos);  // and printed
}
