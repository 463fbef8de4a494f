// Forward pass against the reference logits in ../shared/golden: every model file and KV-cache type
// there, fed as one batch, as 8-token chunks and one token at a time.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unistd.h>

#include "../llm.hpp"
#include "golden.hpp"
#include "util.hpp"

using namespace golden;

TEST_CASE("golden logits: every model and KV type, batch, chunks and token by token") {
    const std::string dir = testutil::shared_dir() + "/golden/";
    std::vector<GoldenCase> cases = golden_cases();
    REQUIRE(cases.size() >= 55);
    for (const GoldenCase& c : cases) {
        CAPTURE(c.name);
        auto m = llm::Model::load(dir + "models/" + c.model);
        std::vector<int32_t> toks = json_tokens(testutil::read_file(dir + "logits/" + c.name + ".json"));
        std::vector<float> ref;
        REQUIRE_NOTHROW(ref = reference_logits(c, toks.size() * m->hp.n_vocab));  // the file holds n_tokens x n_vocab floats

        const llm::Type kv = llm::type_from_name(c.kv);
        std::vector<float> batch = run_model(*m, toks, kv, 64);
        for (int chunk : {64, 8, 1}) {
            CAPTURE(chunk);
            std::vector<float> ours = chunk == 64 ? batch : run_model(*m, toks, kv, chunk);
            Agreement a = compare(ref, ours, m->hp.n_vocab);
            if (chunk == 64)
                MESSAGE(c.name << " chunk " << chunk << ": mean KL " << a.mean_kl << " (" << a.typical_kl << " without the three worst), max KL "
                               << a.max_kl << ", top-1 " << a.top1);
            check_agreement(c, *m, a);
            // The batch shape must not change the answer beyond float summation order.
            double max_diff = 0;
            for (size_t i = 0; i < ours.size(); i++) max_diff = std::max(max_diff, (double)std::fabs(ours[i] - batch[i]));
            CHECK(max_diff < 2e-3);
        }
    }
}

// The last layer runs its queries, wo and FFN on the output rows only (the others' hidden states are
// read by nothing): a prompt whose logits are wanted at a few rows, or at none and then at every row of
// the next batch, gives those rows' logits of the batch that wants them all, on every architecture (GQA
// and MLA; MoE: the last layer routes the output tokens alone). A row moved to the wrong place would
// read another token's state; keys or values not cached for every token would show in the next batch.
TEST_CASE("golden: the last layer on the output rows only gives the all-rows logits") {
    const std::string dir = testutil::shared_dir() + "/golden/";
    for (const std::string name : {"tiny-llama-Q8_0", "tiny-qwen2-Q4_K_M", "tiny-qwen3-Q8_0", "tiny-gemma3-Q4_K_M", "tiny-qwen3moe-Q4_K_M",
                                   "tiny-deepseek2-lite-Q4_K_M", "tiny-deepseek2-v3-Q4_K_M"}) {
        CAPTURE(name);
        auto m = llm::Model::load(dir + "models/" + name + ".gguf");
        const int n_vocab = m->hp.n_vocab;
        const std::vector<int32_t> toks = json_tokens(testutil::read_file(dir + "logits/" + name + "-kvf16.json"));
        const int n = (int)toks.size();
        REQUIRE(n >= 8);
        const std::vector<float> all = run_model(*m, toks, llm::Type::F16, n);
        llm::ContextParams cp;
        cp.n_ctx = 256;
        cp.type_k = cp.type_v = llm::Type::F16;
        cp.n_threads = 2;
        auto row_diff = [&](llm::Context& ctx, int j, int row) {
            double d = 0;
            for (int v = 0; v < n_vocab; v++) d = std::max(d, (double)std::fabs(ctx.logits(j)[v] - all[(size_t)row * n_vocab + v]));
            return d;
        };
        llm::Context some(*m, cp);
        const std::vector<int> wanted = {1, n / 2, n - 1};
        llm::Batch batch;
        for (int i = 0; i < n; i++) batch.add(toks[i], i, 0, std::find(wanted.begin(), wanted.end(), i) != wanted.end());
        some.decode(batch);
        REQUIRE(some.n_logits() == 3);
        for (int j = 0; j < 3; j++) CHECK(row_diff(some, j, wanted[j]) < 2e-3);

        llm::Context later(*m, cp);
        const int half = n / 2;
        batch.clear();
        for (int i = 0; i < half; i++) batch.add(toks[i], i, 0, false);
        later.decode(batch);
        CHECK(later.n_logits() == 0);
        batch.clear();
        for (int i = half; i < n; i++) batch.add(toks[i], i, 0, true);
        later.decode(batch);
        REQUIRE(later.n_logits() == n - half);
        for (int i = half; i < n; i++) CHECK(row_diff(later, i - half, i) < 2e-3);
    }
}

TEST_CASE("golden: interleaved weights (load-time repacking) agree with the row kernels") {
    const std::string dir = testutil::shared_dir() + "/golden/";
    for (const std::string name : {"tiny-llama-Q4_K-pure", "tiny-deepseek2-lite-Q4_K_M", "tiny-gemma3-Q8_0"}) {
        CAPTURE(name);
        const std::string path = dir + "models/" + name + ".gguf";
        llm::ModelOptions rows_only;
        rows_only.interleave = false;
        auto packed = llm::Model::load(path), plain = llm::Model::load(path, rows_only);
        auto count = [](const llm::Model& m) {
            int n = 0;
            for (const auto& L : m.layers) {
                for (const llm::TensorInfo* t : {L.wq, L.wk, L.wv, L.wo, L.wq_a, L.wq_b, L.wkv_a, L.ffn_gate, L.ffn_up, L.ffn_down,
                                                 L.gate_shexp, L.up_shexp, L.down_shexp})
                    n += t && t->interleaved;
                for (const auto* v : {&L.gate_exp, &L.up_exp, &L.down_exp, &L.k_b, &L.v_b})
                    for (const llm::TensorInfo& e : *v) n += e.interleaved;
            }
            return n;
        };
        CHECK(count(*plain) == 0);
        const llm::TensorInfo* probe = packed->layers.back().ffn_up ? packed->layers.back().ffn_up : &packed->layers.back().up_exp[0];
        if (!llm::interleave_supported(llm::Type::Q4_K, 256, 16)) {
            CHECK(count(*packed) == 0);
            continue;
        }
        CHECK(probe->interleaved);
        CHECK(count(*packed) > 0);
        // MLA's per-head products (views of one tensor, like the experts) too, where the shape allows
        for (const auto* heads : {&packed->layers[0].k_b, &packed->layers[0].v_b})
            for (const llm::TensorInfo& h : *heads) CHECK(h.interleaved == llm::interleave_supported(h.type, h.ne[0], h.ne[1]));
        // a tied embedding is repacked once, with the output, and looked up from there
        if (plain->output == plain->tok_embd) {
            CHECK(packed->output == packed->tok_embd);
            CHECK(packed->tok_embd->interleaved == llm::interleave_supported(packed->tok_embd->type, packed->hp.n_embd, packed->hp.n_vocab));
        }
        MESSAGE(name << std::string(plain->output == plain->tok_embd ? ": tied" : ": untied") << ", output interleaved: " << packed->output->interleaved);
        const std::vector<int32_t> toks = json_tokens(testutil::read_file(dir + "logits/" + name + "-kvf16.json"));
        for (int chunk : {64, 1}) {
            CAPTURE(chunk);
            Agreement a = compare(run_model(*plain, toks, llm::Type::F16, chunk), run_model(*packed, toks, llm::Type::F16, chunk),
                                  packed->hp.n_vocab);
            MESSAGE(name << " chunk " << chunk << ": interleaved vs rows mean KL " << a.mean_kl << ", top-1 " << a.top1);
            CHECK(a.mean_kl <= 5e-3);
            CHECK(a.top1 >= 0.9);
        }
    }
}

// ../shared/golden has no BF16 file: tiny-llama-F16 converted by our quantizer (8-bit mantissas, so a
// lossy conversion), compared with the F16 reference within the quantized-weight tolerances, and the
// repacked model (vdpbf16ps tiles, AMX-BF16 tiles from 16 columns where the CPU has them) with the
// file's rows (FMA row kernels): the same bf16 products, summed in another order.
TEST_CASE("golden: BF16 weights on the BF16 tiles (tiny-llama converted to BF16)") {
    const std::string dir = testutil::shared_dir() + "/golden/";
    const std::string path = "/tmp/llm-test-golden-bf16-" + std::to_string(getpid()) + ".gguf";
    llm::QuantizeOptions o;
    o.ftype = llm::file_type_from_name("BF16");
    o.n_threads = 2;
    o.verbose = false;
    llm::quantize_model(dir + "models/tiny-llama-F16.gguf", path, o);
    llm::ModelOptions rows_only;
    rows_only.interleave = false;
    auto packed = llm::Model::load(path), plain = llm::Model::load(path, rows_only);
    std::remove(path.c_str());
    const llm::TensorInfo* up = packed->layers[0].ffn_up;
    REQUIRE(up->type == llm::Type::BF16);
    CHECK(up->interleaved == llm::interleave_supported(llm::Type::BF16, up->ne[0], up->ne[1]));
    CHECK(packed->output->interleaved == up->interleaved);
    const GoldenCase f16_case{"tiny-llama-F16-kvf16", "tiny-llama-F16.gguf", "f16"};
    const std::vector<int32_t> toks = json_tokens(testutil::read_file(dir + "logits/" + f16_case.name + ".json"));
    const int n_vocab = packed->hp.n_vocab;
    std::vector<float> ref;
    REQUIRE_NOTHROW(ref = reference_logits(f16_case, toks.size() * n_vocab));
    const std::vector<float> rows = run_model(*plain, toks, llm::Type::F16, 64);
    const Agreement base = compare(ref, rows, n_vocab);
    MESSAGE("BF16 rows vs the F16 reference: mean KL " << base.mean_kl << ", max KL " << base.max_kl << ", top-1 " << base.top1);
    // Activations are rounded to bf16 too (8-bit mantissas), so another summation order flips a few of
    // them by a whole bf16 step: two exact kernels (the scalar and the SIMD row kernels) differ by as
    // much; the tiles must stay within a few times that spread.
    const llm::Isa isa = llm::isa_current();
    llm::isa_set(llm::Isa::Scalar);
    const Agreement spread = compare(run_model(*plain, toks, llm::Type::F16, 64), rows, n_vocab);
    llm::isa_set(isa);
    MESSAGE("BF16 rows, scalar vs " << llm::isa_name(isa) << " kernels: mean KL " << spread.mean_kl << ", top-1 " << spread.top1);
    CHECK(base.mean_kl <= 5e-3);
    CHECK(base.max_kl <= 3e-2);
    CHECK(base.top1 >= 0.90);
    for (int chunk : {64, 1}) {
        CAPTURE(chunk);
        const std::vector<float> ours = run_model(*packed, toks, llm::Type::F16, chunk);
        const Agreement a = compare(ref, ours, n_vocab), same = compare(rows, ours, n_vocab);
        MESSAGE("BF16 " << std::string(up->interleaved ? "tiles" : "rows") << " (" << llm::isa_name(llm::isa_current()) << "), chunk " << chunk
                << ": vs the F16 reference mean KL " << a.mean_kl << ", max KL " << a.max_kl << ", top-1 " << a.top1
                << "; vs the row kernels mean KL " << same.mean_kl << ", top-1 " << same.top1);
        CHECK(a.mean_kl <= 5e-3);
        CHECK(a.max_kl <= 3e-2);
        CHECK(a.top1 >= 0.90);
        CHECK(same.mean_kl <= 3 * spread.mean_kl + 1e-5);
        CHECK(same.top1 >= 0.95);
    }
}
