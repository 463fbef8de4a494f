// The GPU backend (cuda/backend.hpp and the kernels) on the SIMT emulator against the reference logits
// of ../shared/golden: every model file (dense, MoE, MLA in both layouts) with every cache type it has
// logits for (f16, q8_0, q4_0, iq4_nl) at -ngl 99 (everything on the device), and partial offloads
// where the activations cross between the CPU and the device.
#include <doctest/doctest.h>

#include "simt_device.hpp"
#include "golden.hpp"

#include <cstdio>
#include <cstdlib>

namespace {

golden::GoldenCase find_case(const std::string& name) {
    for (const golden::GoldenCase& g : golden::golden_cases())
        if (g.name == name) return g;
    throw std::runtime_error("no golden case " + name);
}

// The reference's attention: fused (-fa cases) or llama.cpp's plain softmax-then-V (the others).
llm::FlashAttn flash_attn_of(const golden::GoldenCase& c) { return c.fa ? llm::FlashAttn::On : llm::FlashAttn::Off; }

// Its logits from the device layers, `chunk` tokens per batch, in its cache type and attention mode.
std::vector<float> run_case(const golden::GoldenCase& c, const llm::Model& m, const std::vector<int32_t>& toks, int chunk) {
    const llm::Type kv = llm::type_from_name(c.kv);
    return golden::run_model(m, toks, kv, kv, chunk, flash_attn_of(c));
}

std::unique_ptr<llm::Model> load_offloaded(const golden::GoldenCase& c, int n_gpu_layers) {
    llm::ModelOptions opt;
    opt.n_gpu_layers = n_gpu_layers;
    return llm::Model::load(testutil::shared_dir() + "/golden/models/" + c.model, opt);
}

} // namespace

TEST_CASE("cuda golden: every model and cache type with -ngl 99 on the SIMT emulator, one batch") {
    simt_gpu::register_emulator_driver();
    int n_cases = 0;
    for (const golden::GoldenCase& c : golden::golden_cases()) {
        CAPTURE(c.name);
        auto m = load_offloaded(c, 99);
        REQUIRE(m->placement.first_device_layer == 0);
        REQUIRE(m->placement.output_on_device);
        const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        const std::vector<float> ref = golden::reference_logits(c, toks.size() * m->hp.n_vocab);
        const golden::Agreement a = golden::compare(ref, run_case(c, *m, toks, 64), m->hp.n_vocab);
        MESSAGE(c.name << " -ngl 99 batch: mean KL " << a.mean_kl << ", max KL " << a.max_kl << ", top-1 " << a.top1);
        golden::check_agreement(c, *m, a);
        n_cases++;
    }
    CHECK(n_cases == 55);  // dense: 30 with an f16 cache, 6 with q8_0 / q4_0 / iq4_nl; qwen3moe: 5; deepseek2: 14
}

// Prefill on emulated tensor cores (compute capability 8.0: the matmul_mma_* kernels of mma.cuh) for
// every quantized weight type (the -pure models) and the mixed K-quant models, MoE and MLA included.
TEST_CASE("cuda golden: -ngl 99 prefill on the emulated tensor cores (sm_80) for every quantized type") {
    struct Restore {  // the default emulated device (sm_70) for the tests after this one
        ~Restore() { simt_gpu::register_emulator_driver(); }
    } restore;
    int n_cases = 0;
    for (const char* name : {"tiny-llama-Q4_0-pure-kvf16", "tiny-llama-Q4_1-pure-kvf16", "tiny-llama-Q5_0-pure-kvf16", "tiny-llama-Q5_1-pure-kvf16",
                             "tiny-llama-Q8_0-kvf16", "tiny-llama-IQ4_NL-pure-kvf16", "tiny-llama-Q2_K-pure-kvf16", "tiny-llama-Q3_K-pure-kvf16",
                             "tiny-llama-Q4_K-pure-kvf16", "tiny-llama-Q5_K-pure-kvf16", "tiny-llama-Q6_K-pure-kvf16", "tiny-llama-Q4_K_M-kvf16",
                             "tiny-gemma3-Q4_K_M-kvf16", "tiny-qwen3moe-Q4_K_M-kvf16", "tiny-deepseek2-lite-Q4_K_M-kvf16"}) {
        const golden::GoldenCase c = find_case(name);
        CAPTURE(c.name);
        simt_gpu::EmulatedDevice* device = simt_gpu::register_emulator_driver(1, 0, 80).at(0);
        auto m = load_offloaded(c, 99);
        const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        const std::vector<float> ref = golden::reference_logits(c, toks.size() * m->hp.n_vocab);
        const golden::Agreement a = golden::compare(ref, run_case(c, *m, toks, 64), m->hp.n_vocab);
        MESSAGE(c.name << " -ngl 99 on sm_80 tensor cores: mean KL " << a.mean_kl << ", max KL " << a.max_kl << ", top-1 " << a.top1 << "; "
                       << device->launches("matmul_mma_") << " tensor-core launches");
        golden::check_agreement(c, *m, a);
        CHECK(device->launches("matmul_mma_") > 0);
        CHECK(device->launches("matmul_q8_") == 0);  // no quantized product left on the dp4a tiles
        n_cases++;
    }
    CHECK(n_cases == 15);
}

// Decode (the matvec kernels, attention one query at a time) over the first 24 positions: past
// gemma3's 16-token window, a few models only (the emulator runs a token's ~40 launches in ~0.1 s).
TEST_CASE("cuda golden: -ngl 99 token by token on the SIMT emulator") {
    simt_gpu::register_emulator_driver();
    const size_t n_pos = 24;
    for (const char* name : {"tiny-llama-F16-kvf16", "tiny-llama-Q4_0-pure-kvf16", "tiny-gemma3-Q4_K_M-kvf16", "tiny-qwen3-Q8_0-kvf16",
                             "tiny-gemma3-F16-kvq8_0-fa", "tiny-qwen3moe-F16-kvf16", "tiny-deepseek2-v3-F16-kvq8_0-fa"}) {
        const golden::GoldenCase c = find_case(name);
        CAPTURE(c.name);
        auto m = load_offloaded(c, 99);
        std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        std::vector<float> ref = golden::reference_logits(c, toks.size() * m->hp.n_vocab);
        toks.resize(n_pos);
        ref.resize(n_pos * m->hp.n_vocab);
        const golden::Agreement a = golden::compare(ref, run_case(c, *m, toks, 1), m->hp.n_vocab);
        MESSAGE(c.name << " -ngl 99 token by token: mean KL " << a.mean_kl << ", max KL " << a.max_kl << ", top-1 " << a.top1);
        golden::check_agreement(c, *m, a);
    }
}

TEST_CASE("cuda golden: partial offload (-ngl 2, -ngl n_layer without the output) on the SIMT emulator") {
    simt_gpu::register_emulator_driver();
    for (const char* name : {"tiny-llama-Q4_K_M-kvf16", "tiny-gemma3-Q8_0-kvf16", "tiny-qwen2-F16-kvf16", "tiny-qwen3moe-Q8_0-kvf16",
                             "tiny-deepseek2-lite-legacy-Q4_K_M-kvf16"}) {
        const golden::GoldenCase c = find_case(name);
        CAPTURE(c.name);
        const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        const int n_layer = load_offloaded(c, 0)->hp.n_layer;
        for (int ngl : {2, n_layer}) {
            CAPTURE(ngl);
            auto m = load_offloaded(c, ngl);
            CHECK(m->placement.first_device_layer == m->hp.n_layer - ngl);
            CHECK(!m->placement.output_on_device);
            const std::vector<float> ref = golden::reference_logits(c, toks.size() * m->hp.n_vocab);
            const golden::Agreement a = golden::compare(ref, run_case(c, *m, toks, 8), m->hp.n_vocab);
            MESSAGE(c.name << " -ngl " << ngl << " chunk 8: mean KL " << a.mean_kl << ", top-1 " << a.top1);
            golden::check_agreement(c, *m, a);
        }
    }
}

// Cache types without reference logits (K and V of different types; q4_0 and iq4_nl latent caches):
// the device layers against the CPU engine running the same model and cache types, at -ngl 2 (the
// activations cross) and -ngl 99.
TEST_CASE("cuda golden: K and V caches of different types and quantized latent caches agree with the CPU engine") {
    simt_gpu::register_emulator_driver();
    struct Kind {
        const char* name;
        llm::Type type_k, type_v;
    };
    const Kind kinds[] = {{"tiny-qwen3-F16-kvf16", llm::Type::Q8_0, llm::Type::IQ4_NL},
                          {"tiny-qwen3-F16-kvf16", llm::Type::F16, llm::Type::Q4_0},
                          {"tiny-qwen3-F16-kvf16", llm::Type::IQ4_NL, llm::Type::F16},
                          {"tiny-deepseek2-lite-F16-kvf16", llm::Type::Q4_0, llm::Type::F16}};
    for (const Kind& kind : kinds) {
        const golden::GoldenCase c = find_case(kind.name);
        CAPTURE(c.name);
        CAPTURE(std::string(llm::type_info(kind.type_k).name));
        CAPTURE(std::string(llm::type_info(kind.type_v).name));
        std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        toks.resize(40);
        auto cpu_model = load_offloaded(c, 0);
        const std::vector<float> cpu = golden::run_model(*cpu_model, toks, kind.type_k, kind.type_v, 16);
        for (int ngl : {2, 99}) {
            CAPTURE(ngl);
            const golden::Agreement a = golden::compare(cpu, golden::run_model(*load_offloaded(c, ngl), toks, kind.type_k, kind.type_v, 16), cpu_model->hp.n_vocab);
            MESSAGE(c.model << " -ctk " << std::string(llm::type_info(kind.type_k).name) << " -ctv " << std::string(llm::type_info(kind.type_v).name) << " -ngl " << ngl
                            << " vs the CPU: mean KL " << a.mean_kl << ", max KL " << a.max_kl << ", top-1 " << a.top1);
            // A last-bit difference upstream flips a quantized cache value, which the following layers
            // amplify (measured: mean KL up to 3e-5 at -ngl 2, 1.1e-3 at -ngl 99).
            CHECK(a.mean_kl <= (ngl == 2 ? 1e-4 : 2e-3));
            CHECK(a.top1 >= 0.95);
        }
    }
}

// A sequence saved from one context and restored into another continues bit for bit: the device
// layers' rows come back in their cache types (quantized K and V of their own sizes; a latent cache
// without V rows).
TEST_CASE("cuda golden: seq_save / seq_restore carry the device layers' quantized and latent cache rows") {
    simt_gpu::register_emulator_driver();
    struct Kind {
        const char* name;
        int ngl;
        llm::Type type_k, type_v;
    };
    for (const Kind& kind : {Kind{"tiny-qwen3-F16-kvf16", 2, llm::Type::Q8_0, llm::Type::IQ4_NL}, Kind{"tiny-deepseek2-lite-F16-kvf16", 99, llm::Type::Q4_0, llm::Type::F16}}) {
        CAPTURE(kind.name);
        const golden::GoldenCase c = find_case(kind.name);
        const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
        auto m = load_offloaded(c, kind.ngl);
        llm::ContextParams cp;
        cp.n_ctx = 64;
        cp.type_k = kind.type_k, cp.type_v = kind.type_v;
        cp.n_threads = 2;
        llm::Context original(*m, cp), restored(*m, cp);
        llm::Batch prompt, next;
        for (int i = 0; i < 20; i++) prompt.add(toks[i], i, 0, false);
        next.add(toks[20], 20, 0, true);
        original.decode(prompt);
        restored.seq_restore(0, original.seq_save(0, 20));
        original.decode(next);
        restored.decode(next);
        CHECK(std::memcmp(original.logits(0), restored.logits(0), sizeof(float) * m->hp.n_vocab) == 0);
    }
}

namespace {
// llm-server-emu --dump-logits of a golden case's tokens with `flags`: its exit status, log and logits.
struct EmuRun {
    int rc = 0;
    std::string log;
    std::vector<float> logits;
};
EmuRun run_emu(const golden::GoldenCase& c, const std::vector<int32_t>& toks, const std::string& flags) {
    std::string ids;
    for (int32_t t : toks) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    const std::string out = "build/emu-dump.f32";
    std::remove(out.c_str());
    EmuRun r;
    r.rc = testutil::run("./llm-server-emu -m " + testutil::shared_dir() + "/golden/models/" + c.model + " --prompt-ids " + ids + " --dump-logits " + out +
                             " " + flags + " 2>&1",
                         &r.log);
    if (r.rc != 0) return r;
    const std::string raw = testutil::read_file(out);
    r.logits.resize(raw.size() / sizeof(float));
    std::memcpy(r.logits.data(), raw.data(), r.logits.size() * sizeof(float));
    return r;
}
} // namespace

TEST_CASE("cuda golden: llm-server-emu --dump-logits with -ngl 99 / -ngl all / -ngl 2 matches the reference") {
    REQUIRE(testutil::file_exists("./llm-server-emu"));
    const golden::GoldenCase c = find_case("tiny-llama-Q4_0-pure-kvf16");
    const std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
    const std::vector<float> ref = golden::reference_logits(c, toks.size() * 1024);
    for (const std::string ngl : {"99", "all", "2"}) {
        CAPTURE(ngl);
        const EmuRun r = run_emu(c, toks, "-ngl " + ngl);
        REQUIRE_MESSAGE(r.rc == 0, r.log);
        REQUIRE(r.logits.size() == ref.size());
        const golden::Agreement a = golden::compare(ref, r.logits, 1024);
        MESSAGE("llm-server-emu -ngl " << ngl << ": mean KL " << a.mean_kl << ", top-1 " << a.top1);
        CHECK(a.mean_kl <= 5e-3);
        CHECK(a.top1 >= 0.90);
    }
}

// -fa as llama.cpp: on / auto (and bare -fa) run the fused kernel over a quantized cache; off refuses a
// quantized V cache (an f16 one runs); anything else is a usage error.
TEST_CASE("cuda golden: llm-server-emu -ctk/-ctv q4_0 with -fa on|auto matches the reference, -fa off refuses it") {
    REQUIRE(testutil::file_exists("./llm-server-emu"));
    const golden::GoldenCase c = find_case("tiny-llama-F16-kvq4_0-fa");
    std::vector<int32_t> toks = golden::json_tokens(testutil::read_file(testutil::shared_dir() + "/golden/logits/" + c.name + ".json"));
    toks.resize(24);
    std::vector<float> ref = golden::reference_logits(c, 64 * 1024);
    ref.resize(toks.size() * 1024);
    for (const std::string fa : {"-fa on", "-fa auto", "-fa", ""}) {
        CAPTURE(fa);
        const EmuRun r = run_emu(c, toks, "-ngl 99 -ctk q4_0 -ctv q4_0 " + fa);
        REQUIRE_MESSAGE(r.rc == 0, r.log);
        REQUIRE(r.logits.size() == ref.size());
        const golden::Agreement a = golden::compare(ref, r.logits, 1024);
        MESSAGE("llm-server-emu -ngl 99 -ctk/-ctv q4_0 " << fa << ": mean KL " << a.mean_kl << ", max KL " << a.max_kl << ", top-1 " << a.top1);
        CHECK(a.mean_kl <= 5e-3);
        CHECK(a.max_kl <= 3e-2);
        CHECK(a.top1 >= 0.90);
    }
    const EmuRun off = run_emu(c, toks, "-ngl 99 -ctk q4_0 -ctv q4_0 -fa off");
    CHECK(off.rc != 0);
    CHECK(off.log.find("V cache quantization requires flash attention") != std::string::npos);
    CHECK(run_emu(c, toks, "-ngl 99 -ctk q4_0 -fa off").rc == 0);  // a quantized K alone is fine
    std::string log;
    CHECK(testutil::run("LLAMA_ARG_FLASH_ATTN=sometimes ./llm-server-emu -m " + testutil::shared_dir() + "/golden/models/" + c.model +
                            " --prompt-ids 1 --dump-logits build/emu-dump.f32 2>&1",
                        &log) != 0);
    CHECK(log.find("expected on, off or auto after LLAMA_ARG_FLASH_ATTN, got 'sometimes'") != std::string::npos);
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
            golden::check_agreement(c, *m, a);
            if (ngl == 99) {
                float max_diff = 0;
                for (size_t i = 0; i < split.size(); i++) max_diff = std::max(max_diff, std::fabs(split[i] - single[i]));
                CHECK(max_diff <= 1e-4f);
            }
        }
    }
    simt_gpu::register_emulator_driver(1);
}

namespace {
// What a decode schedule over three sequences gave: every logits row, and the emulated device's counts
// of each decode step.
struct Schedule {
    std::vector<float> logits;
    std::vector<simt_gpu::LaunchCounts> step_counts;
};
simt_gpu::LaunchCounts difference(const simt_gpu::LaunchCounts& after, const simt_gpu::LaunchCounts& before) {
    return {after.launches - before.launches, after.captures - before.captures, after.replays - before.replays, after.kernels - before.kernels};
}
// Prompts of 5, 9 and 13 tokens in one batch, then one token per sequence per step: `grow` steps of 3
// tokens (the longest sequence's pages pass 1 -> 2 -> 3, page-table buckets 1, 2, 4), sequences 1 and
// 2 start over (the longest now has 2 pages: bucket 2 again, with no buffer reallocated) for
// `restart` steps, then sequence 2 stops: `pair` steps of 2 tokens (bucket 4).
Schedule run_schedule(const llm::Model& m, const simt_gpu::EmulatedDevice& dev, int grow, int restart, int pair) {
    llm::ContextParams cp;
    cp.n_ctx = 256;
    cp.n_seq = 3;
    cp.n_threads = 2;
    llm::Context ctx(m, cp);
    Schedule out;
    // Tokens spread over the vocabulary, none repeated soon (a sequence reading another's rows shows).
    int n_tokens = 0;
    auto next_token = [&] { return int32_t((n_tokens++ * 131 + 7) % m.hp.n_vocab); };
    int length[3] = {0, 0, 0};
    // One batch: `count` tokens into each of sequences [0, n_seqs), the last one's logits (all in decode).
    auto decode = [&](int n_seqs, int count) {
        llm::Batch batch;
        for (int s = 0; s < n_seqs; s++)
            for (int i = 0; i < count; i++, length[s]++) batch.add(next_token(), length[s], s, i == count - 1);
        const simt_gpu::LaunchCounts before = dev.counts();
        ctx.decode(batch);
        out.step_counts.push_back(difference(dev.counts(), before));
        for (int i = 0; i < ctx.n_logits(); i++) out.logits.insert(out.logits.end(), ctx.logits(i), ctx.logits(i) + m.hp.n_vocab);
    };
    llm::Batch prompt;
    const int prompt_length[3] = {5, 9, 13};
    for (int s = 0; s < 3; s++)
        for (; length[s] < prompt_length[s]; length[s]++) prompt.add(next_token(), length[s], s, length[s] == prompt_length[s] - 1);
    ctx.decode(prompt);
    for (int step = 0; step < grow; step++) decode(3, 1);
    for (int s : {1, 2}) ctx.seq_truncate(s, 0), length[s] = 0;
    for (int step = 0; step < restart; step++) decode(3, 1);
    for (int step = 0; step < pair; step++) decode(2, 1);
    return out;
}
} // namespace

// Decode through graphs (captured per shape: tokens, logits rows, page-table bucket) gives the logits
// of plain launches bit for bit, over several sequences; every new shape is captured once it repeats
// (the page table's bucket growing, shrinking back without a reallocation, the batch going from 3
// tokens to 2), and a replayed step makes no launch call. GGML_CUDA_DISABLE_GRAPHS (as llama.cpp)
// turns them off.
TEST_CASE("cuda golden: decode through graphs equals plain launches bit for bit; a shape change re-captures") {
    const simt_gpu::EmulatedDevice& dev = *simt_gpu::register_emulator_driver(1).at(0);
    const golden::GoldenCase c = find_case("tiny-llama-Q4_K_M-kvf16");
    auto m = load_offloaded(c, 99);
    const int grow = 24, restart = 3, pair = 3;
    setenv("GGML_CUDA_DISABLE_GRAPHS", "1", 1);
    const Schedule plain = run_schedule(*m, dev, grow, restart, pair);
    unsetenv("GGML_CUDA_DISABLE_GRAPHS");
    const Schedule graphs = run_schedule(*m, dev, grow, restart, pair);
    REQUIRE(plain.logits.size() == graphs.logits.size());
    CHECK(std::memcmp(plain.logits.data(), graphs.logits.data(), sizeof(float) * plain.logits.size()) == 0);
    size_t captures = 0, replays = 0;
    for (size_t step = 0; step < plain.step_counts.size(); step++) {
        CAPTURE(step);
        const simt_gpu::LaunchCounts& p = plain.step_counts[step];
        const simt_gpu::LaunchCounts& g = graphs.step_counts[step];
        CHECK(p.captures + p.replays == 0);
        CHECK(p.launches == p.kernels);
        CHECK(g.kernels == p.kernels);  // the same kernels, launched or replayed
        CHECK(g.launches == (g.replays ? 0 : p.launches));
        captures += g.captures, replays += g.replays;
    }
    // Shapes (3 tokens, bucket 1), (3, 2), (3, 4), (3, 2) again after the reallocation at bucket 4
    // dropped it, (2, 4): each runs once plainly, then is captured and replayed.
    CHECK(captures == 5);
    CHECK(replays == plain.step_counts.size() - 5);
    const size_t step = 10;
    MESSAGE(c.model << " (4 layers) decode step of 3 tokens: " << plain.step_counts[step].launches << " kernel launches one by one; with graphs: "
                    << graphs.step_counts[step].launches << " launches, " << graphs.step_counts[step].replays << " graph launch of "
                    << graphs.step_counts[step].kernels << " kernels");
}
