// The GPU backend (cuda/backend.hpp and the kernels) on the SIMT emulator against the reference logits
// of ../shared/golden: every dense model file with an f16 cache at -ngl 99 (everything on the device),
// and partial offloads where the activations cross between the CPU and the device.
#include <doctest/doctest.h>

#include "simt_device.hpp"
#include "golden.hpp"

namespace {

// Models the backend runs (dense attention, f16 cache).
bool offload_supported(const golden::GoldenCase& c) {
    if (c.kv != "f16") return false;
    for (const char* arch : {"tiny-llama", "tiny-qwen2", "tiny-qwen3-", "tiny-gemma3"})
        if (c.model.rfind(arch, 0) == 0) return true;
    return false;
}

golden::GoldenCase find_case(const std::string& name) {
    for (const golden::GoldenCase& g : golden::golden_cases())
        if (g.name == name) return g;
    throw std::runtime_error("no golden case " + name);
}

std::unique_ptr<llm::Model> load_offloaded(const golden::GoldenCase& c, int n_gpu_layers) {
    llm::ModelOptions opt;
    opt.n_gpu_layers = n_gpu_layers;
    return llm::Model::load(testutil::shared_dir() + "/golden/models/" + c.model, opt);
}

// The CPU path's tolerances (test_golden.cpp): tight for F16 weights, the reference's own rounding else.
void check_agreement(const golden::GoldenCase& c, const golden::Agreement& a) {
    if (c.model.find("-F16") != std::string::npos) {
        CHECK(a.mean_kl <= 5e-5);
        CHECK(a.top1 >= 0.98);
    } else {
        CHECK(a.mean_kl <= 5e-3);
        CHECK(a.max_kl <= 3e-2);
        CHECK(a.top1 >= 0.90);
    }
}

} // namespace

TEST_CASE("cuda golden: every dense model with -ngl 99 on the SIMT emulator, one batch") {
    simt_gpu::register_emulator_driver();
    int n_cases = 0;
    for (const golden::GoldenCase& c : golden::golden_cases()) {
        if (!offload_supported(c)) continue;
        CAPTURE(c.name);
        auto m = load_offloaded(c, 99);
        REQUIRE(m->placement.first_device_layer == 0);
        REQUIRE(m->placement.output_on_device);
        const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        const std::vector<float> ref = golden::reference_logits(c, toks.size() * m->hp.n_vocab);
        const golden::Agreement a = golden::compare(ref, golden::run_model(*m, toks, llm::Type::F16, 64), m->hp.n_vocab);
        MESSAGE(c.name << " -ngl 99 batch: mean KL " << a.mean_kl << ", max KL " << a.max_kl << ", top-1 " << a.top1);
        check_agreement(c, a);
        n_cases++;
    }
    CHECK(n_cases >= 20);
}

// Decode (the matvec kernels, attention one query at a time) over the first 24 positions: past
// gemma3's 16-token window, a few models only (the emulator runs a token's ~40 launches in ~0.1 s).
TEST_CASE("cuda golden: -ngl 99 token by token on the SIMT emulator") {
    simt_gpu::register_emulator_driver();
    const size_t n_pos = 24;
    for (const char* name : {"tiny-llama-F16-kvf16", "tiny-llama-Q4_0-pure-kvf16", "tiny-gemma3-Q4_K_M-kvf16", "tiny-qwen3-Q8_0-kvf16"}) {
        const golden::GoldenCase c = find_case(name);
        CAPTURE(c.name);
        auto m = load_offloaded(c, 99);
        std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        std::vector<float> ref = golden::reference_logits(c, toks.size() * m->hp.n_vocab);
        toks.resize(n_pos);
        ref.resize(n_pos * m->hp.n_vocab);
        const golden::Agreement a = golden::compare(ref, golden::run_model(*m, toks, llm::Type::F16, 1), m->hp.n_vocab);
        MESSAGE(c.name << " -ngl 99 token by token: mean KL " << a.mean_kl << ", max KL " << a.max_kl << ", top-1 " << a.top1);
        check_agreement(c, a);
    }
}

TEST_CASE("cuda golden: partial offload (-ngl 2 of 4 layers, -ngl 4 without the output) on the SIMT emulator") {
    simt_gpu::register_emulator_driver();
    for (const char* name : {"tiny-llama-Q4_K_M-kvf16", "tiny-gemma3-Q8_0-kvf16", "tiny-qwen2-F16-kvf16"}) {
        const golden::GoldenCase c = find_case(name);
        CAPTURE(c.name);
        const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        for (int ngl : {2, 4}) {
            CAPTURE(ngl);
            auto m = load_offloaded(c, ngl);
            CHECK(m->placement.first_device_layer == m->hp.n_layer - ngl);
            CHECK(!m->placement.output_on_device);
            const std::vector<float> ref = golden::reference_logits(c, toks.size() * m->hp.n_vocab);
            const golden::Agreement a = golden::compare(ref, golden::run_model(*m, toks, llm::Type::F16, 8), m->hp.n_vocab);
            MESSAGE(c.name << " -ngl " << ngl << " chunk 8: mean KL " << a.mean_kl << ", top-1 " << a.top1);
            check_agreement(c, a);
        }
    }
}

TEST_CASE("cuda golden: llm-server-emu --dump-logits with -ngl 99 / -ngl all / -ngl 2 matches the reference") {
    REQUIRE(testutil::file_exists("./llm-server-emu"));
    const golden::GoldenCase c = find_case("tiny-llama-Q4_0-pure-kvf16");
    const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
    std::string ids;
    for (int32_t t : toks) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    const std::string out = "build/emu-dump.f32";
    for (const std::string ngl : {"99", "all", "2"}) {
        CAPTURE(ngl);
        std::string log;
        const int rc = testutil::run("./llm-server-emu -m " + testutil::shared_dir() + "/golden/models/" + c.model + " --prompt-ids " + ids +
                                         " --dump-logits " + out + " -ngl " + ngl + " 2>&1",
                                     &log);
        REQUIRE_MESSAGE(rc == 0, log);
        const std::string raw = testutil::read_file(out);
        const std::vector<float> ref = golden::reference_logits(c, toks.size() * 1024);
        REQUIRE(raw.size() == ref.size() * sizeof(float));
        std::vector<float> ours(ref.size());
        std::memcpy(ours.data(), raw.data(), raw.size());
        const golden::Agreement a = golden::compare(ref, ours, 1024);
        MESSAGE("llm-server-emu -ngl " << ngl << ": mean KL " << a.mean_kl << ", top-1 " << a.top1);
        CHECK(a.mean_kl <= 5e-3);
        CHECK(a.top1 >= 0.90);
    }
}

// -ts over two emulated devices: the layers split as llama.cpp splits them, the activations crossing
// device to device through the host; the logits agree with one device's (the same kernels, bit for
// bit) and with the reference. Also a partial offload where the CPU, then two devices run.
TEST_CASE("cuda golden: -ts 1,1 over two emulated devices equals one device") {
    for (const char* name : {"tiny-llama-Q4_K_M-kvf16", "tiny-gemma3-Q8_0-kvf16", "tiny-qwen3-F16-kvf16"}) {
        const golden::GoldenCase c = find_case(name);
        CAPTURE(c.name);
        const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        simt_gpu::register_emulator_driver(1);
        auto one = load_offloaded(c, 99);
        const std::vector<float> single = golden::run_model(*one, toks, llm::Type::F16, 16);
        simt_gpu::register_emulator_driver(2);
        for (int ngl : {99, 3}) {
            CAPTURE(ngl);
            llm::ModelOptions opt;
            opt.n_gpu_layers = ngl;
            opt.tensor_split = {1, 1};
            auto m = llm::Model::load(testutil::shared_dir() + "/golden/models/" + c.model, opt);
            REQUIRE(m->placement.slices.size() == 2);
            // 4 layers and the output: 0-2 | 3 + output; -ngl 3: CPU 0 | 1-2 | 3.
            CHECK(m->placement.slices[0].device == 0);
            CHECK(m->placement.slices[1].device == 1);
            CHECK(m->placement.slices[0].first_layer == (ngl == 99 ? 0 : 1));
            CHECK(m->placement.slices[0].end_layer == 3);
            CHECK(m->placement.slices[1].end_layer == 4);
            CHECK(m->placement.slices[1].output == (ngl == 99));
            const std::vector<float> split = golden::run_model(*m, toks, llm::Type::F16, 16);
            REQUIRE(split.size() == single.size());
            const std::vector<float> ref = golden::reference_logits(c, toks.size() * m->hp.n_vocab);
            const golden::Agreement a = golden::compare(ref, split, m->hp.n_vocab);
            MESSAGE(c.name << " -ngl " << ngl << " -ts 1,1: mean KL " << a.mean_kl << ", top-1 " << a.top1);
            check_agreement(c, a);
            if (ngl == 99) {
                float max_diff = 0;
                for (size_t i = 0; i < split.size(); i++) max_diff = std::max(max_diff, std::fabs(split[i] - single[i]));
                CHECK(max_diff <= 1e-4f);
            }
        }
    }
    simt_gpu::register_emulator_driver(1);
}
