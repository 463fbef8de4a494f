// Encoders, pooling and embeddings, their HTTP endpoints and router mode, and the HF -> GGUF converter.
//
// Reference data comes from two Python scripts run once: tests/embd_ref.py (all-MiniLM-L6-v2 converted
// by scripts/convert-hf-to-gguf, and the same model evaluated independently in float64 numpy) and
// tests/convert_roundtrip.py (golden tiny models written back as HF folders and converted again).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <unistd.h>

#include "../llm.hpp"
#include "util.hpp"

namespace {

std::string tests_dir() {
    std::string d = std::string(__FILE__);
    d = d.substr(0, d.rfind('/') + 1);
    return testutil::file_exists(d + "embd_ref.py") ? d : "tests/";
}

// A scratch folder removed when the test program exits.
struct TempDir {
    std::string path = "/tmp/llm_embd_test_" + std::to_string(getpid());
    ~TempDir() { testutil::run("rm -rf '" + path + "'"); }
};
const std::string& temp_dir() {
    static TempDir d;
    return d.path;
}

struct Reference {
    std::string dir;  // "" when the Python side is unavailable
    nlohmann::json data;
};

// Runs tests/embd_ref.py once (converter + float64 reference).
const Reference& reference() {
    static Reference r = [] {
        Reference ref;
        std::string out;
        const std::string dir = temp_dir() + "/minilm";
        const int rc = testutil::run("python3 '" + tests_dir() + "embd_ref.py' '" + dir + "' 2>&1", &out);
        if (rc != 0) {
            MESSAGE("embd_ref.py: " << out);
            if (rc != 2) FAIL("embd_ref.py failed");
            return ref;
        }
        ref.dir = dir;
        ref.data = nlohmann::json::parse(testutil::read_file(dir + "/reference.json"));
        return ref;
    }();
    return r;
}

double cosine(const float* a, const std::vector<double>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < b.size(); i++) ab += a[i] * b[i], aa += (double)a[i] * a[i], bb += b[i] * b[i];
    return ab / std::sqrt(aa * bb);
}

// Embeds every reference sentence (all of them in one batch, one sequence each) and returns the
// normalized pooled vectors.
std::vector<std::vector<float>> embed_all(const llm::Model& model, const nlohmann::json& cases, llm::Pooling pooling,
                                          int norm) {
    llm::ContextParams cp;
    cp.n_seq = (int)cases.size();
    cp.n_ctx = 64 * cp.n_seq;
    cp.n_threads = 2;
    cp.embeddings = true;
    cp.pooling = pooling;
    llm::Context ctx(model, cp);
    llm::Batch batch;
    for (size_t s = 0; s < cases.size(); s++) {
        const auto ids = model.vocab.tokenize(cases[s]["text"].get<std::string>(), true, false);
        for (size_t i = 0; i < ids.size(); i++) batch.add(ids[i], (int)i, (int)s, false);
    }
    ctx.decode(batch);
    std::vector<std::vector<float>> out;
    for (size_t s = 0; s < cases.size(); s++) {
        std::vector<float> e(ctx.n_embd_out());
        llm::embd_normalize(ctx.seq_embeddings((int)s), e.data(), ctx.n_embd_out(), norm);
        out.push_back(e);
    }
    return out;
}

}  // namespace

TEST_CASE("embeddings: all-MiniLM-L6-v2 converted from safetensors matches a float64 numpy reference") {
    const Reference& ref = reference();
    if (ref.dir.empty()) return;
    const auto& cases = ref.data["cases"];
    for (const std::string type : {"f32", "f16"}) {
        INFO("outtype " << type);
        auto model = llm::Model::load(ref.dir + "/minilm-" + type + ".gguf");
        CHECK(model->hp.arch == llm::Arch::Bert);
        CHECK(model->hp.pooling == llm::Pooling::Mean);  // from the sentence-transformers pooling config
        CHECK_FALSE(model->hp.causal);
        const auto embs = embed_all(*model, cases, llm::Pooling::Unspecified, 2);
        double worst = 1;
        for (size_t s = 0; s < cases.size(); s++) {
            INFO("sentence '" << cases[s]["text"].get<std::string>() << "'");
            // Our WordPiece gives the ids of BERT's own tokenizer (written independently in the script).
            CHECK(model->vocab.tokenize(cases[s]["text"].get<std::string>(), true, false) == cases[s]["ids"].get<std::vector<int32_t>>());
            const double c = cosine(embs[s].data(), cases[s]["embedding"].get<std::vector<double>>());
            CHECK(c >= 0.9999);
            worst = std::min(worst, c);
        }
        MESSAGE("all-MiniLM-L6-v2 " << type << ": " << cases.size() << " sentences in one batch, min cosine vs float64 "
                                    << std::setprecision(8) << worst << ", 1 - min = " << 1 - worst);
    }
}

TEST_CASE("embeddings: one sequence at a time equals the batch; pooling and normalization variants") {
    const Reference& ref = reference();
    if (ref.dir.empty()) return;
    const auto& cases = ref.data["cases"];
    auto model = llm::Model::load(ref.dir + "/minilm-f32.gguf");
    const auto batched = embed_all(*model, cases, llm::Pooling::Mean, -1);
    llm::ContextParams cp;
    cp.n_threads = 2;
    cp.embeddings = true;
    llm::Context ctx(*model, cp);
    const int E = model->hp.n_embd;
    for (size_t s = 0; s < cases.size(); s++) {
        const auto ids = model->vocab.tokenize(cases[s]["text"].get<std::string>(), true, false);
        llm::Batch batch;
        for (size_t i = 0; i < ids.size(); i++) batch.add(ids[i], (int)i, 0, true);
        ctx.decode(batch);  // the encoder restarts the sequence every call
        // mean pooling = the average of the per-token outputs; cls = the first, last = the last
        std::vector<double> mean(E, 0.0);
        for (size_t i = 0; i < ids.size(); i++)
            for (int j = 0; j < E; j++) mean[j] += ctx.embeddings((int)i)[j] / ids.size();
        for (int j = 0; j < E; j++) {
            CHECK(ctx.seq_embeddings(0)[j] == doctest::Approx(mean[j]).epsilon(1e-5));
            CHECK(ctx.seq_embeddings(0)[j] == doctest::Approx(batched[s][j]).epsilon(1e-4).scale(1e-3));
        }
    }
    llm::Batch one;
    one.add(101, 0, 0, false);
    one.add(1060, 1, 0, false);
    one.add(102, 2, 0, false);
    for (llm::Pooling p : {llm::Pooling::Cls, llm::Pooling::Last, llm::Pooling::None}) {
        llm::ContextParams c2 = cp;
        c2.pooling = p;
        llm::Context pc(*model, c2);
        llm::Batch all = one;
        all.want_logits.assign(3, 1);
        pc.decode(all);
        if (p == llm::Pooling::None) {
            CHECK_THROWS_AS(pc.seq_embeddings(0), llm::Error);
            continue;
        }
        const float* want = pc.embeddings(p == llm::Pooling::Cls ? 0 : 2);
        for (int j = 0; j < E; j++) CHECK(pc.seq_embeddings(0)[j] == want[j]);
    }
    // An encoder cannot produce logits, and rank pooling needs a classifier head.
    CHECK_THROWS_AS(llm::Context(*model, llm::ContextParams{}), llm::Error);
    llm::ContextParams rank = cp;
    rank.pooling = llm::Pooling::Rank;
    CHECK_THROWS_AS(llm::Context(*model, rank), llm::Error);
}

TEST_CASE("embeddings: a BERT sequence classifier ranks with its head (rank pooling)") {
    const Reference& ref = reference();
    if (ref.dir.empty()) return;
    const auto& cases = ref.data["cases"];
    auto model = llm::Model::load(ref.dir + "/minilm-rank-f32.gguf");
    CHECK(model->hp.pooling == llm::Pooling::Rank);
    REQUIRE(model->cls);
    REQUIRE(model->cls_out);
    llm::ContextParams cp;
    cp.n_seq = (int)cases.size();
    cp.n_ctx = 64 * cp.n_seq;
    cp.n_threads = 2;
    cp.embeddings = true;
    llm::Context ctx(*model, cp);
    CHECK(ctx.n_embd_out() == 1);
    llm::Batch batch;
    for (size_t s = 0; s < cases.size(); s++) {
        const auto ids = model->vocab.tokenize(cases[s]["text"].get<std::string>(), true, false);
        for (size_t i = 0; i < ids.size(); i++) batch.add(ids[i], (int)i, (int)s, false);
    }
    ctx.decode(batch);
    // The random classifier sums 384 unit-variance weights: the encoder's ~1e-3 relative rounding (f16
    // GELU, as the reference engine) shows as a few 1e-2 on scores spread over -4..8; a wrong head or
    // bias would be off by whole units. The order of the scores (the ranking) must be the reference's.
    double worst = 0;
    std::vector<std::pair<double, size_t>> want_order, got_order;
    for (size_t s = 0; s < cases.size(); s++) {
        const double want = cases[s]["score"].get<double>(), got = ctx.seq_embeddings((int)s)[0];
        CHECK(std::fabs(got - want) < 0.05);
        worst = std::max(worst, std::fabs(got - want));
        want_order.emplace_back(want, s);
        got_order.emplace_back(got, s);
    }
    std::sort(want_order.begin(), want_order.end());
    std::sort(got_order.begin(), got_order.end());
    for (size_t s = 0; s < cases.size(); s++) CHECK(want_order[s].second == got_order[s].second);
    MESSAGE("reranker scores vs float64: max |diff| " << worst << " (scores " << want_order.front().first << " .. "
                                                      << want_order.back().first << ")");
}

TEST_CASE("embeddings: normalization as llama-server's --embd-normalize") {
    const float v[4] = {3, -4, 0, 12};
    float out[4];
    llm::embd_normalize(v, out, 4, 2);  // Euclidean: |v| = 13
    CHECK(out[0] == doctest::Approx(3.0 / 13));
    CHECK(out[3] == doctest::Approx(12.0 / 13));
    llm::embd_normalize(v, out, 4, 1);  // taxicab: 19
    CHECK(out[1] == doctest::Approx(-4.0 / 19));
    llm::embd_normalize(v, out, 4, 0);  // max-abs to int16: 12 -> 32760
    CHECK(out[3] == doctest::Approx(32760.0));
    CHECK(out[0] == doctest::Approx(3 * 32760.0 / 12));
    llm::embd_normalize(v, out, 4, 3);  // p = 3: (27 + 64 + 1728)^(1/3)
    CHECK(out[3] == doctest::Approx(12.0 / std::cbrt(27.0 + 64 + 1728)));
    llm::embd_normalize(v, out, 4, -1);
    CHECK(out[1] == -4.0f);
    const float zero[2] = {0, 0};
    llm::embd_normalize(zero, out, 2, 2);
    CHECK(out[0] == 0.0f);
    CHECK(llm::pooling_from_name("rank") == llm::Pooling::Rank);
    CHECK(std::string(llm::pooling_name(llm::Pooling::Cls)) == "cls");
    CHECK_THROWS_AS(llm::pooling_from_name("max"), llm::Error);
}

TEST_CASE("embeddings: decoder models as embedders, and the batch attention mask") {
    const std::string path = testutil::shared_dir() + "/golden/models/tiny-qwen3-F16.gguf";
    if (!testutil::file_exists(path)) return;
    auto model = llm::Model::load(path);
    llm::ContextParams cp;
    cp.n_ctx = 256;
    cp.n_threads = 2;
    llm::Context gen(*model, cp);
    cp.embeddings = true;
    cp.pooling = llm::Pooling::Last;
    llm::Context emb(*model, cp);
    llm::Batch batch;
    const int32_t toks[5] = {5, 77, 301, 9, 640};
    for (int i = 0; i < 5; i++) batch.add(toks[i], i, 0, true);
    gen.decode(batch);
    emb.decode(batch);
    // The last-token embedding is the hidden state the logits come from: output * it = logits.
    const int E = model->hp.n_embd;
    std::vector<float> row(E);
    double max_diff = 0;
    for (int t : {0, 17, 1000}) {
        llm::dequantize_row(model->output->type, model->output->data + llm::row_bytes(model->output->type, E) * t, row.data(), E);
        double dot = 0;
        for (int j = 0; j < E; j++) dot += (double)row[j] * emb.seq_embeddings(0)[j];
        max_diff = std::max(max_diff, std::fabs(dot - gen.logits(4)[t]));
    }
    CHECK(max_diff < 0.05);  // the logits' matmul rounds its input to the weights' dot type
    for (int j = 0; j < E; j++) CHECK(emb.seq_embeddings(0)[j] == emb.embeddings(4)[j]);

    // An explicit causal mask changes nothing; a non-causal one lets early tokens see later ones.
    llm::Batch masked = batch;
    masked.attn_end = {1, 2, 3, 4, 5};
    gen.seq_truncate(0, 0);
    gen.decode(masked);
    std::vector<float> first(gen.logits(0), gen.logits(0) + model->hp.n_vocab);
    gen.seq_truncate(0, 0);
    gen.decode(batch);
    CHECK(std::equal(first.begin(), first.end(), gen.logits(0)));
    masked.set_non_causal();
    CHECK(masked.attn_end == std::vector<int32_t>{5, 5, 5, 5, 5});
    gen.seq_truncate(0, 0);
    gen.decode(masked);
    CHECK_FALSE(std::equal(first.begin(), first.end(), gen.logits(0)));
    // Bounds: an end before the token itself, or past its sequence, is refused.
    masked.attn_end = {1, 2, 3, 4, 6};
    gen.seq_truncate(0, 0);
    CHECK_THROWS_AS(gen.decode(masked), llm::Error);
    masked.attn_end = {0, 2, 3, 4, 5};
    CHECK_THROWS_AS(gen.decode(masked), llm::Error);
    masked.attn_end = {1, 2};
    CHECK_THROWS_AS(gen.decode(masked), llm::Error);
}

TEST_CASE("convert-hf-to-gguf: golden tiny models through Hugging Face folders and back") {
    if (testutil::run("python3 -c 'import gguf, numpy' 2>/dev/null") != 0) {
        MESSAGE("SKIPPED: python3 with gguf and numpy is not available");
        return;
    }
    if (!testutil::file_exists(testutil::shared_dir() + "/golden/models/tiny-llama-F16.gguf")) return;
    std::string out;
    const int rc = testutil::run("python3 '" + tests_dir() + "convert_roundtrip.py' '" + temp_dir() + "/roundtrip' 2>&1", &out);
    MESSAGE(out);
    CHECK(rc == 0);
}

TEST_CASE("embeddings server: every endpoint and input form over HTTP, the openai client, reranking") {
    const Reference& ref = reference();
    if (ref.dir.empty()) return;
    REQUIRE_MESSAGE(testutil::file_exists("llm-server"), "build ./llm-server first (make test does)");
    std::string out;
    const int rc = testutil::run("python3 '" + tests_dir() + "embd_server.py' '" + ref.dir + "' 2>&1", &out);
    MESSAGE(out);
    CHECK(rc == 0);
}

TEST_CASE("router: a preset of a chat and an embedding model, on demand, LRU, surviving SIGKILL") {
    const Reference& ref = reference();
    if (ref.dir.empty()) return;
    if (!testutil::file_exists("models/SmolLM2-135M-Instruct-Q4_1.gguf")) {
        MESSAGE("SKIPPED: models/SmolLM2-135M-Instruct-Q4_1.gguf is missing (scripts/setup)");
        return;
    }
    std::string out;
    const int rc = testutil::run("python3 '" + tests_dir() + "router_test.py' '" + ref.dir + "' 2>&1", &out);
    MESSAGE(out);
    CHECK(rc == 0);
}
