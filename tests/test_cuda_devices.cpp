// Device management of the GPU backend on the SIMT emulator: llama.cpp's layer split (-ts, -sm, -mg,
// --device), the fit check before anything is uploaded (the error names the largest -ngl that fits),
// out of device memory during a batch (that batch fails, the context goes on), and llm-server-emu's
// flags and requests (-ngl 99 over two devices, 503 when a prompt finds no device memory).
#include <doctest/doctest.h>

#include "simt_device.hpp"
#include "golden.hpp"
#include "server_util.hpp"

namespace {

const std::string kTinyModel = "tiny-llama-F16.gguf";  // 4 layers, n_embd 64 (../shared/golden)

std::string tiny_path() { return testutil::shared_dir() + "/golden/models/" + kTinyModel; }

std::unique_ptr<llm::Model> load_tiny(int n_gpu_layers) {
    llm::ModelOptions opt;
    opt.n_gpu_layers = n_gpu_layers;
    return llm::Model::load(tiny_path(), opt);
}

llm::ContextParams tiny_context() {
    llm::ContextParams cp;
    cp.n_ctx = 256;
    cp.n_threads = 2;
    return cp;
}

// The devices' slices as "device:first-last[+out]" for compact checks.
std::string slices(const llm::Placement& p) {
    std::string out;
    for (const llm::Placement::Slice& s : p.slices)
        out += (out.empty() ? "" : " ") + std::to_string(s.device) + ":" + std::to_string(s.first_layer) + "-" + std::to_string(s.end_layer - 1) +
               (s.output ? "+out" : "");
    return out;
}

// Logits of `tokens` fed as one batch into sequence 0 of ctx, all rows.
std::vector<float> decode_all(llm::Context& ctx, const std::vector<int32_t>& tokens, int n_vocab, int start = 0) {
    llm::Batch b;
    for (size_t i = 0; i < tokens.size(); i++) b.add(tokens[i], start + int(i), 0, true);
    ctx.decode(b);
    std::vector<float> out;
    for (int i = 0; i < ctx.n_logits(); i++) out.insert(out.end(), ctx.logits(i), ctx.logits(i) + n_vocab);
    return out;
}

} // namespace

TEST_CASE("cuda devices: -ts splits layers as llama.cpp (cumulative shares, the output counted as a layer)") {
    // 4 layers + output over two devices 1:1: fractions 0, .2, .4 | .6, .8.
    CHECK(slices(llm::offload_placement(4, 99, {0, 1}, {1, 1})) == "0:0-2 1:3-3+out");
    CHECK(slices(llm::offload_placement(4, 99, {0, 1}, {})) == "0:0-2 1:3-3+out");  // no shares: equal
    CHECK(slices(llm::offload_placement(4, 99, {0, 1}, {4, 1})) == "0:0-3 1:4-3+out");  // device 1: the output only
    CHECK(slices(llm::offload_placement(4, 99, {0, 1}, {1, 0})) == "0:0-3+out");
    CHECK(slices(llm::offload_placement(4, 2, {0, 1}, {1, 1})) == "0:2-2 1:3-3");
    CHECK(slices(llm::offload_placement(30, 99, {0, 1, 2}, {1, 2, 1})) == "0:0-7 1:8-23 2:24-29+out");
    CHECK(slices(llm::offload_placement(4, 0, {0, 1}, {1, 1})).empty());
    CHECK(slices(llm::offload_placement(4, 4, {1}, {})) == "1:0-3");
    CHECK_THROWS_AS(llm::offload_placement(4, 4, {0, 1}, {1}), llm::Error);
    // Over the devices a driver found: --device picks and orders them, -sm none keeps -mg's, no -ts
    // shares by free memory.
    const std::vector<llm::OffloadDevice> found = {{"CUDA0", "a", size_t(16) << 30, size_t(12) << 30}, {"CUDA1", "b", size_t(16) << 30, size_t(4) << 30}};
    llm::ModelOptions opt;
    opt.n_gpu_layers = -1;
    CHECK(slices(llm::place_on_devices(8, opt, found)) == "0:0-6 1:7-7+out");  // 12:4 GiB free
    opt.tensor_split = {1, 1};
    CHECK(slices(llm::place_on_devices(8, opt, found)) == "0:0-4 1:5-7+out");
    opt.devices = {"CUDA1"};
    CHECK(slices(llm::place_on_devices(8, opt, found)) == "1:0-7+out");  // -ts values past the devices are ignored, as llama.cpp
    opt.devices.clear();
    opt.tensor_split = {3, 1, 5, 7};
    CHECK(slices(llm::place_on_devices(8, opt, found)) == "0:0-6 1:7-7+out");  // 3:1 over the two found
    opt.devices = {"CUDA1"};
    opt.tensor_split.clear();
    CHECK(slices(llm::place_on_devices(8, opt, found)) == "1:0-7+out");
    opt.devices = {"CUDA1", "CUDA0"};
    opt.tensor_split = {1, 1};
    CHECK(slices(llm::place_on_devices(8, opt, found)) == "1:0-4 0:5-7+out");
    opt.devices = {"CUDA7"};
    CHECK_THROWS_WITH_AS(llm::place_on_devices(8, opt, found), doctest::Contains("invalid device: CUDA7"), llm::Error);
    opt.devices.clear();
    opt.tensor_split.clear();
    opt.split_layers = false;
    opt.main_gpu = 1;
    CHECK(slices(llm::place_on_devices(8, opt, found)) == "1:0-7+out");
    opt.main_gpu = 2;
    CHECK_THROWS_AS(llm::place_on_devices(8, opt, found), llm::Error);
}

TEST_CASE("cuda devices: --device none and -ngl 0 never ask the driver; CUDA_VISIBLE_DEVICES hides emulated devices") {
    int probes = 0;
    simt_gpu::register_emulator_driver(2);
    llm::OffloadDriver d = llm::offload_driver();
    auto probe = d.probe;
    d.probe = [&probes, probe](std::string& why) { return probes++, probe(why); };
    llm::set_offload_driver(d);
    llm::ModelOptions opt;
    opt.n_gpu_layers = 99;
    opt.devices = {"none"};
    CHECK(!llm::Model::load(tiny_path(), opt)->placement.any());
    opt.n_gpu_layers = 0;
    opt.devices.clear();
    CHECK(!llm::Model::load(tiny_path(), opt)->placement.any());
    CHECK(probes == 0);
    opt.n_gpu_layers = 99;
    CHECK(slices(llm::Model::load(tiny_path(), opt)->placement) == "0:0-2 1:3-3+out");
    CHECK(probes == 1);

    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    simt_gpu::register_emulator_driver(2);
    CHECK(llm::offload_driver().list().size() == 1);
    setenv("CUDA_VISIBLE_DEVICES", "1,0,7,0", 1);  // the list ends at the first invalid entry
    simt_gpu::register_emulator_driver(2);
    CHECK(llm::offload_driver().list().size() == 2);
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    simt_gpu::register_emulator_driver(2);
    std::string why;
    CHECK(!llm::offload_driver().probe(why));
    CHECK(why == "no CUDA device");
    unsetenv("CUDA_VISIBLE_DEVICES");
    simt_gpu::register_emulator_driver(1);
}

TEST_CASE("cuda devices: a model that does not fit fails before any upload, naming the largest -ngl that fits") {
    simt_gpu::register_emulator_driver(1);
    auto all = load_tiny(99);
    const int n_cells = 256;
    // Between what layers 1-3 (-ngl 3) and layers 0-3 (-ngl 4) need: -ngl 3 fits, -ngl 4 does not.
    auto need = [&](int ngl) { return llm::offload_memory(*all, llm::offload_placement(4, ngl), n_cells, llm::Type::F16, llm::Type::F16, 1).at(0); };
    const llm::HParams& hp = all->hp;
    CHECK(need(3).kv == size_t(3) * n_cells * 2 * hp.n_head_kv * hp.head_dim_k * 2);  // 3 layers x cells x (K + V) x f16 values
    CHECK(need(3).weights > 0);
    CHECK(need(4).weights > need(3).weights);
    CHECK(need(99).weights > need(4).weights);
    CHECK(need(99).compute > need(4).compute);  // the logits row
    const size_t limit = (need(3).total() + need(4).total()) / 2;
    simt_gpu::register_emulator_driver(1, limit);
    auto m = load_tiny(99);
    std::string message;
    try {
        llm::Context ctx(*m, tiny_context());
    } catch (const llm::Error& e) {
        message = e.what();
    }
    MESSAGE(message);
    CHECK(message.find("CUDA0 (SIMT emulator) needs") != std::string::npos);
    CHECK(message.find("the largest -ngl that fits is 3") != std::string::npos);
    CHECK(llm::offload_driver().list()[0].free_bytes == limit);  // nothing was allocated
    auto fits = load_tiny(3);
    llm::Context ctx(*fits, tiny_context());
    const std::vector<float> logits = decode_all(ctx, {1}, fits->hp.n_vocab);
    CHECK(std::isfinite(logits[0]));
    simt_gpu::register_emulator_driver(1);
}

TEST_CASE("cuda devices: out of device memory in a batch fails that batch; the context goes on and agrees") {
    simt_gpu::register_emulator_driver(1);
    auto free_model = load_tiny(99);
    const std::vector<llm::DeviceMemory> short_batch = llm::offload_memory(*free_model, free_model->placement, 256, llm::Type::F16, llm::Type::F16, 4);
    const std::vector<llm::DeviceMemory> prompt = llm::offload_memory(*free_model, free_model->placement, 256, llm::Type::F16, llm::Type::F16, 48);
    REQUIRE(prompt[0].compute > short_batch[0].compute + 8192);
    std::vector<int32_t> long_prompt;
    for (int i = 0; i < 48; i++) long_prompt.push_back(i * 7 % 1000);
    std::vector<float> expected;
    {
        llm::Context ctx(*free_model, tiny_context());
        expected = decode_all(ctx, {5, 6, 7, 8}, free_model->hp.n_vocab);
    }
    simt_gpu::register_emulator_driver(1, short_batch[0].total() + 4096);  // 4096: the page table
    auto m = load_tiny(99);
    llm::Context ctx(*m, tiny_context());
    CHECK_THROWS_AS(decode_all(ctx, long_prompt, m->hp.n_vocab), llm::DeviceMemoryError);
    CHECK(ctx.seq_len(0) == 0);
    const std::vector<float> got = decode_all(ctx, {5, 6, 7, 8}, m->hp.n_vocab);
    REQUIRE(got.size() == expected.size());
    float max_diff = 0;
    for (size_t i = 0; i < got.size(); i++) max_diff = std::max(max_diff, std::fabs(got[i] - expected[i]));
    CHECK(max_diff <= 1e-4f);
    simt_gpu::register_emulator_driver(1);
}

TEST_CASE("cuda devices: llm-server-emu --list-devices, --plan per device, the load log") {
    REQUIRE(testutil::file_exists("./llm-server-emu"));
    std::string out;
    REQUIRE(testutil::run("LLM_EMU_DEVICES=3 LLM_EMU_MEMORY=100M CUDA_VISIBLE_DEVICES=2,0 ./llm-server-emu --list-devices 2>&1", &out) == 0);
    CHECK(out == "Available devices:\n  CUDA0: SIMT emulator (100 MiB, 100 MiB free)\n  CUDA1: SIMT emulator (100 MiB, 100 MiB free)\n");
    REQUIRE(testutil::run("LLM_EMU_DEVICES=2 ./llm-server-emu -m " + tiny_path() + " --plan -ngl 99 -ts 1,1 -c 256 2>&1", &out) == 0);
    CHECK(out.find("offload:          5/5 layers over 2 device(s)") != std::string::npos);
    CHECK(out.find("  CUDA0 (SIMT emulator): layers 0-2: weights") != std::string::npos);
    CHECK(out.find("  CUDA1 (SIMT emulator): layers 3-3 and the output: weights") != std::string::npos);
    CHECK(out.find("-> fits") != std::string::npos);
    MESSAGE(out);
    REQUIRE(testutil::run("LLM_EMU_MEMORY=1M ./llm-server-emu -m " + tiny_path() + " --plan -ngl 99 -c 4096 2>&1", &out) == 2);
    CHECK(out.find("DOES NOT FIT") != std::string::npos);
    std::string ids = "1,2,3,4,5,6,7,8";
    REQUIRE(testutil::run("LLM_EMU_DEVICES=2 ./llm-server-emu -m " + tiny_path() + " --prompt-ids " + ids + " -n 2 -ngl 99 -ts 3,1 2>&1", &out) == 0);
    CHECK(out.find("llm: offloaded 5/5 layers to GPU") != std::string::npos);
    CHECK(out.find("llm: CUDA0 (SIMT emulator): layers 0-3: model buffer") != std::string::npos);
    CHECK(out.find("llm: CUDA1 (SIMT emulator): the output: model buffer") != std::string::npos);
    // Too little memory: one line naming what is needed and the -ngl that fits, no crash.
    CHECK(testutil::run("LLM_EMU_MEMORY=1M ./llm-server-emu -m " + tiny_path() + " --prompt-ids " + ids + " -n 2 -ngl 99 -c 4096 2>&1", &out) != 0);
    CHECK(out.find("not enough device memory") != std::string::npos);
    CHECK(out.find("the largest -ngl that fits is") != std::string::npos);
    REQUIRE(testutil::run("./llm-server-emu -m " + tiny_path() + " --prompt-ids " + ids + " -n 2 -ngl 99 --device none 2>&1", &out) == 0);
    CHECK(out.find("offloaded") == std::string::npos);
}

TEST_CASE("cuda devices: llm-server-emu serves -ngl 99 over two devices as the CPU server does; a prompt without device memory gets 503") {
    using testserver::json;
    std::vector<int> prompt;
    for (int i = 0; i < 24; i++) prompt.push_back(i * 13 % 1000);
    const json body = {{"prompt", prompt}, {"n_predict", 4}, {"temperature", 0}, {"return_tokens", true}};
    auto tokens_of = [&](testserver::ServerProcess& s, const json& req) {
        const testserver::Reply r = testserver::post(s.port, "/completion", req);
        REQUIRE_MESSAGE(r.status == 200, r.raw);
        return r.body.at("tokens");
    };
    json cpu_tokens;
    {
        // The same binary without -ngl: the CPU engine.
        testserver::ServerProcess cpu({"./llm-server-emu", "-m", tiny_path(), "--port", "0", "-c", "512", "-np", "2"});
        cpu_tokens = tokens_of(cpu, body);
    }
    {
        testserver::ServerProcess emu({"env", "LLM_EMU_DEVICES=2", "./llm-server-emu", "-m", tiny_path(), "--port", "0", "-c", "512", "-np", "2", "-ngl", "99",
                                       "-ts", "1,1"});
        CHECK(tokens_of(emu, body) == cpu_tokens);
        CHECK(tokens_of(emu, body) == cpu_tokens);  // again, from the prompt cache
        CHECK(emu.log().find("offloaded 5/5 layers") != std::string::npos);
    }
    {
        // Room for the weights, the cache and batches of 8 tokens, not for a 24-token prompt's activations.
        simt_gpu::register_emulator_driver(1);  // its compute_bytes, for the figures below
        llm::ModelOptions meta;
        meta.metadata_only = true;
        auto m = llm::Model::load(tiny_path(), meta);
        const size_t limit = llm::offload_memory(*m, llm::offload_placement(4, 99), 512, llm::Type::F16, llm::Type::F16, 8)[0].total() + 4096;
        REQUIRE(llm::offload_memory(*m, llm::offload_placement(4, 99), 512, llm::Type::F16, llm::Type::F16, 24)[0].total() > limit);
        testserver::ServerProcess emu({"env", "LLM_EMU_MEMORY=" + std::to_string(limit), "./llm-server-emu", "-m", tiny_path(), "--port", "0", "-c", "512",
                                       "-ngl", "99"});
        testserver::Reply r = testserver::post(emu.port, "/completion", body);
        CHECK_MESSAGE(r.status == 503, r.raw << "\n" << emu.log());
        json small = body;
        small["prompt"] = json::array({1, 2, 3});
        r = testserver::post(emu.port, "/completion", small);
        CHECK_MESSAGE(r.status == 200, r.raw);
        CHECK(testserver::get(emu.port, "/health").status == 200);
    }
}
