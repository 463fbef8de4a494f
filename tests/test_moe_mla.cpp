// Issue 3: the memory plan from metadata, the latent (MLA) cache size, and expert routing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <unistd.h>

#include "../llm.hpp"
#include "util.hpp"

namespace {

using testutil::GGUFBuilder;

// A metadata-only GGUF (no tensors) with the real hyperparameters of a published model.
std::string write_metadata_model(const std::string& name, const std::string& arch,
                                 const std::vector<std::pair<std::string, uint32_t>>& ints) {
    GGUFBuilder w;
    w.header(3, 0, ints.size() + 2).kv_str("general.architecture", arch).kv_str("general.name", name);
    for (const auto& [k, v] : ints) w.kv_u32(arch + "." + k, v);
    std::string path = "/tmp/llm-plan-" + name + "-" + std::to_string(getpid()) + ".gguf";
    testutil::write_file(path, w.b);
    return path;
}

std::string deepseek_coder_v2_lite() {
    return write_metadata_model("DeepSeek-Coder-V2-Lite", "deepseek2", {
        {"vocab_size", 102400}, {"context_length", 163840}, {"embedding_length", 2048}, {"block_count", 27},
        {"feed_forward_length", 10944}, {"attention.head_count", 16}, {"attention.head_count_kv", 1},
        {"attention.key_length", 576}, {"attention.value_length", 512}, {"attention.key_length_mla", 192},
        {"attention.value_length_mla", 128}, {"attention.q_lora_rank", 0}, {"attention.kv_lora_rank", 512},
        {"rope.dimension_count", 64}, {"leading_dense_block_count", 1}, {"expert_count", 64},
        {"expert_used_count", 6}, {"expert_shared_count", 2}, {"expert_feed_forward_length", 1408}});
}

std::string qwen25_coder_7b() {
    return write_metadata_model("Qwen2.5-Coder-7B", "qwen2", {
        {"vocab_size", 152064}, {"context_length", 32768}, {"embedding_length", 3584}, {"block_count", 28},
        {"feed_forward_length", 18944}, {"attention.head_count", 28}, {"attention.head_count_kv", 4}});
}

llm::MemoryPlan plan(const std::string& path, int n_ctx, int n_slots, llm::Type t) {
    llm::ModelOptions mo;
    mo.metadata_only = true;
    auto m = llm::Model::load(path, mo);
    return llm::plan_memory(*m, n_ctx, n_slots, t, t);
}

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

TEST_CASE("plan: DeepSeek-Coder-V2-Lite latent cache and Qwen2.5-Coder-7B GQA cache") {
    const std::string ds = deepseek_coder_v2_lite(), qw = qwen25_coder_7b();
    // MLA: n_layer x (kv_lora_rank + rope) x 2 bytes = 27 x 576 x 2.
    llm::MemoryPlan p = plan(ds, 8192, 4, llm::Type::F16);
    CHECK(p.kv_bytes_per_token == 31104);
    CHECK(p.kv_bytes_per_slot == 31104ull * 8192);
    CHECK(p.kv_bytes_total / GiB == doctest::Approx(0.95).epsilon(0.005));
    CHECK(p.weight_bytes == 0);  // metadata only
    // q8_0: 34 bytes per 32 values, about half.
    CHECK(plan(ds, 8192, 4, llm::Type::Q8_0).kv_bytes_per_token == 27ull * 576 / 32 * 34);
    // One batch of 512 tokens' scratch, floats per token: residual stream and norms 3 x 2048; q, attention
    // output and k/v rows 16 x (576 + 512) + 2 x 576; the FFN's three buffers 3 x max(dense 10944, 6 x 1408)
    // and the routed rows' 6 x 2048 x 2; MLA's heads 16 x 192 + 576 + 16 x 512 x 2 + 16 x 128; converted
    // activations max(2048, 10944) x 2 bytes; plus one sequence's V (8192 x 512) and two rows of logits.
    const size_t per_token = (3 * 2048 + 16 * 1088 + 2 * 576 + 3 * 10944 + 6 * 2048 * 2 + 16 * 192 + 576 + 16 * 512 * 2 + 16 * 128) * 4 + 10944 * 2;
    CHECK(p.compute_bytes == 512 * per_token + 8192ull * 512 * 4 + 102400ull * 4 * 2);
    // GQA: n_layer x n_kv_head x head_dim x 2 (K and V) x 2 bytes = 28 x 4 x 128 x 2 x 2.
    p = plan(qw, 8192, 4, llm::Type::F16);
    CHECK(p.kv_bytes_per_token == 57344);
    CHECK(p.kv_bytes_total / GiB == doctest::Approx(1.75).epsilon(0.001));
    CHECK(plan(qw, 8192, 4, llm::Type::Q8_0).kv_bytes_per_token == 28ull * 2 * 512 / 32 * 34);
    // The CLI prints the same numbers.
    std::string out;
    // Exit status 2 says the plan does not fit this host's free memory at the moment: the figures hold either way.
    const int rc = testutil::run("./llm-server -m " + ds + " --plan -c 8192 -np 4", &out);
    CAPTURE(out);
    REQUIRE((rc == 0 || (rc == 2 && out.find("DOES NOT FIT") != std::string::npos)));
    CHECK(out.find("31104 B") != std::string::npos);
    CHECK(out.find("0.95 GiB") != std::string::npos);
    const int rc_q8 = testutil::run("./llm-server -m " + qw + " --plan -c 8192 -np 4 -ctk q8_0 -ctv q8_0", &out);
    REQUIRE((rc_q8 == 0 || (rc_q8 == 2 && out.find("DOES NOT FIT") != std::string::npos)));
    CHECK(out.find("30464 B") != std::string::npos);
    unlink(ds.c_str());
    unlink(qw.c_str());
}

TEST_CASE("MLA: the latent cache holds kv_lora_rank + rope values once per token and layer") {
    const std::string dir = testutil::shared_dir() + "/golden/models/";
    for (const char* name : {"tiny-deepseek2-lite-F16.gguf", "tiny-deepseek2-lite-legacy-F16.gguf", "tiny-deepseek2-v3-F16.gguf"}) {
        CAPTURE(name);
        auto m = llm::Model::load(dir + name);
        const llm::HParams& hp = m->hp;
        REQUIRE(hp.mla);
        for (llm::Type t : {llm::Type::F16, llm::Type::Q8_0, llm::Type::Q4_0}) {
            llm::ContextParams cp;
            cp.n_ctx = 128;
            cp.n_threads = 1;
            cp.type_k = cp.type_v = t;
            llm::Context ctx(*m, cp);
            const size_t per_token = (size_t)hp.n_layer * llm::row_bytes(t, hp.kv_lora_rank + hp.n_rot);
            CHECK(ctx.kv_bytes_per_token() == per_token);
            CHECK(ctx.kv_bytes() == per_token * 128);
            CHECK(ctx.kv_bytes_per_token() == llm::kv_bytes_per_token(hp, t, t));
        }
    }
}

namespace {

// Routing written out the obvious way, for comparison with llm::moe_route.
void route_reference(const llm::HParams& hp, const std::vector<float>& logits, const std::vector<float>& bias,
                     std::vector<int32_t>& experts, std::vector<float>& weights) {
    const int X = hp.n_expert;
    std::vector<double> p(X);
    if (hp.expert_gating == llm::ExpertGating::Softmax) {
        double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
        for (int e = 0; e < X; e++) sum += p[e] = std::exp(logits[e] - mx);
        for (double& v : p) v /= sum;
    } else {
        for (int e = 0; e < X; e++) p[e] = 1 / (1 + std::exp(-(double)logits[e]));
    }
    std::vector<double> score(X);
    for (int e = 0; e < X; e++) score[e] = p[e] + (bias.empty() ? 0 : bias[e]);
    std::vector<bool> allowed(X, true);
    if (hp.n_expert_groups > 1) {
        const int per = X / hp.n_expert_groups;
        std::vector<std::pair<double, int>> groups;
        for (int g = 0; g < hp.n_expert_groups; g++) {
            std::vector<double> s(score.begin() + g * per, score.begin() + (g + 1) * per);
            std::sort(s.rbegin(), s.rend());
            groups.push_back({s[0] + s[1], g});
        }
        std::sort(groups.begin(), groups.end(), [](auto& a, auto& b) { return a.first > b.first; });
        for (int e = 0; e < X; e++) allowed[e] = false;
        for (int k = 0; k < hp.n_group_used; k++) {
            for (int e = 0; e < per; e++) allowed[groups[k].second * per + e] = true;
        }
    }
    std::vector<int> order;
    for (int e = 0; e < X; e++) if (allowed[e]) order.push_back(e);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
    experts.assign(order.begin(), order.begin() + hp.n_expert_used);
    weights.clear();
    double sum = 0;
    for (int e : experts) sum += p[e];
    for (int e : experts) weights.push_back((float)((hp.expert_weights_norm ? p[e] / sum : p[e]) * hp.expert_weights_scale));
}

}  // namespace

TEST_CASE("MoE routing: every gating variant matches a direct implementation") {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0, 2);
    struct Variant { const char* name; llm::ExpertGating gating; bool bias, norm; float scale; int groups, used_groups; };
    const Variant variants[] = {
        {"softmax (deepseek-v2)", llm::ExpertGating::Softmax, false, false, 1.0f, 0, 0},
        {"softmax + norm (qwen3moe)", llm::ExpertGating::Softmax, false, true, 1.0f, 0, 0},
        {"sigmoid + bias + groups + norm + scale (deepseek-v3)", llm::ExpertGating::Sigmoid, true, true, 2.5f, 8, 3},
        {"sigmoid, no groups", llm::ExpertGating::Sigmoid, false, false, 16.0f, 0, 0},
    };
    for (const Variant& v : variants) {
        CAPTURE(v.name);
        llm::HParams hp;
        hp.n_expert = 64;
        hp.n_expert_used = 6;
        hp.expert_gating = v.gating;
        hp.expert_weights_norm = v.norm;
        hp.expert_weights_scale = v.scale;
        hp.n_expert_groups = v.groups;
        hp.n_group_used = v.used_groups;
        for (int trial = 0; trial < 200; trial++) {
            std::vector<float> logits(64), bias;
            for (float& x : logits) x = nd(rng);
            if (v.bias) for (int e = 0; e < 64; e++) bias.push_back(nd(rng) * 0.1f);
            std::vector<int32_t> got(6), want;
            std::vector<float> got_w(6), want_w;
            llm::moe_route(hp, logits.data(), v.bias ? bias.data() : nullptr, got.data(), got_w.data());
            route_reference(hp, logits, bias, want, want_w);
            REQUIRE(got == want);
            for (int k = 0; k < 6; k++) CHECK(got_w[k] == doctest::Approx(want_w[k]).epsilon(1e-5));
            if (v.norm) CHECK(std::accumulate(got_w.begin(), got_w.end(), 0.0) == doctest::Approx(v.scale).epsilon(1e-5));
        }
    }
}
