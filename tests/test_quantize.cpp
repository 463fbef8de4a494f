// Quantizer: every reference quantization in ../shared/golden/models is rebuilt from its F16 source and
// must come out identical (file bytes, hence every tensor's type and data); mix rules the references do
// not cover, the command-line options, and bad input.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <map>
#include <csignal>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../llm.hpp"
#include "util.hpp"

namespace {

std::string models_dir() { return testutil::shared_dir() + "/golden/models/"; }

// A scratch directory, removed with its files at the end of the test.
struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/llm-test-quantize-XXXXXX";
        const char* p = mkdtemp(tmpl);
        REQUIRE(p != nullptr);
        path = p;
    }
    ~TempDir() { testutil::run("rm -rf '" + path + "'"); }
    std::string file(const std::string& name) const { return path + "/" + name; }
    std::vector<std::string> files() const { return testutil::list_dir(path, ""); }
};

llm::QuantizeOptions options(const std::string& type, bool pure = false) {
    llm::QuantizeOptions o;
    o.ftype = llm::file_type_from_name(type);
    o.pure = pure;
    o.n_threads = 2;
    o.verbose = false;
    return o;
}

// A reference file NAME-TYPE[-pure].gguf and how it was made.
struct Reference {
    std::string file, source, type;
    bool pure = false;
};

std::vector<Reference> references() {
    std::vector<Reference> refs;
    for (const std::string& f : testutil::list_dir(models_dir(), ".gguf")) {
        std::string base = f.substr(0, f.size() - 5);
        Reference r;
        r.file = f;
        if (base.size() > 5 && base.compare(base.size() - 5, 5, "-pure") == 0) {
            r.pure = true;
            base.resize(base.size() - 5);
        }
        size_t dash = base.rfind('-');
        r.type = base.substr(dash + 1);
        r.source = base.substr(0, dash) + "-F16.gguf";
        if (r.type == "F16") continue;
        refs.push_back(r);
    }
    return refs;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const llm::Error& e) {
        return e.what();
    }
    return "";
}

std::map<std::string, llm::Type> plan_types(const std::string& model, const llm::QuantizeOptions& o) {
    auto g = llm::GGUF::open(models_dir() + model);
    std::map<std::string, llm::Type> m;
    for (const auto& e : llm::quantize_plan(*g, o).plan) m[e.src->name] = e.type;
    return m;
}

}  // namespace

TEST_CASE("quantize: every reference quantization is reproduced byte for byte") {
    std::vector<Reference> refs = references();
    REQUIRE(refs.size() >= 29);  // 8 models x (Q4_K_M, Q8_0) less 2, tiny-llama's pure types and mixes, one Q5_K_M
    TempDir tmp;
    for (const Reference& r : refs) {
        CAPTURE(r.file);
        const std::string out = tmp.file(r.file);
        llm::quantize_model(models_dir() + r.source, out, options(r.type, r.pure));
        auto mine = llm::GGUF::open(out);
        auto ref = llm::GGUF::open(models_dir() + r.file);
        // Tensor by tensor first, so a failure names the tensor; then the whole file (metadata, order, padding).
        REQUIRE(mine->tensors.size() == ref->tensors.size());
        for (const auto& rt : ref->tensors) {
            CAPTURE(rt.name);
            const llm::TensorInfo* mt = mine->tensor(rt.name);
            REQUIRE(mt != nullptr);
            CHECK(llm::type_info(mt->type).name == std::string(llm::type_info(rt.type).name));
            REQUIRE(mt->nbytes == rt.nbytes);
            CHECK(memcmp(mt->data, rt.data, rt.nbytes) == 0);
        }
        CHECK(testutil::read_file(out) == testutil::read_file(models_dir() + r.file));
        unlink(out.c_str());
    }
}

TEST_CASE("quantize: the result does not depend on the thread count") {
    TempDir tmp;
    auto o = options("Q4_K_M");
    o.n_threads = 1;
    llm::quantize_model(models_dir() + "tiny-qwen3moe-F16.gguf", tmp.file("a.gguf"), o);
    o.n_threads = 5;
    llm::quantize_model(models_dir() + "tiny-qwen3moe-F16.gguf", tmp.file("b.gguf"), o);
    CHECK(testutil::read_file(tmp.file("a.gguf")) == testutil::read_file(models_dir() + "tiny-qwen3moe-Q4_K_M.gguf"));
    CHECK(testutil::read_file(tmp.file("b.gguf")) == testutil::read_file(models_dir() + "tiny-qwen3moe-Q4_K_M.gguf"));
}

TEST_CASE("quantize: mixes without a reference file follow llama.cpp's rules") {
    using T = llm::Type;
    // tiny-llama: 4 layers, GQA 2, untied output.
    auto q2 = plan_types("tiny-llama-F16.gguf", options("Q2_K"));
    CHECK(q2["output.weight"] == T::Q6_K);
    CHECK(q2["token_embd.weight"] == T::Q2_K);
    CHECK(q2["blk.0.attn_v.weight"] == T::Q3_K);       // GQA < 4
    CHECK(q2["blk.0.ffn_down.weight"] == T::Q3_K);
    CHECK(q2["blk.0.attn_output.weight"] == T::Q3_K);
    CHECK(q2["blk.0.attn_q.weight"] == T::Q2_K);
    CHECK(q2["blk.0.attn_norm.weight"] == T::F32);
    auto q3s = plan_types("tiny-llama-F16.gguf", options("Q3_K_S"));
    CHECK(q3s["blk.3.attn_v.weight"] == T::Q3_K);
    CHECK(q3s["blk.3.ffn_down.weight"] == T::Q3_K);
    CHECK(q3s["output.weight"] == T::Q6_K);
    auto q3l = plan_types("tiny-llama-F16.gguf", options("Q3_K_L"));
    CHECK(q3l["blk.1.attn_v.weight"] == T::Q5_K);
    CHECK(q3l["blk.1.ffn_down.weight"] == T::Q5_K);
    CHECK(q3l["blk.1.attn_output.weight"] == T::Q5_K);
    CHECK(q3l["blk.1.ffn_up.weight"] == T::Q3_K);
    auto q5s = plan_types("tiny-llama-F16.gguf", options("Q5_K_S"));
    CHECK(q5s["blk.2.attn_v.weight"] == T::Q5_K);
    CHECK(q5s["output.weight"] == T::Q6_K);
    auto q40 = plan_types("tiny-llama-F16.gguf", options("Q4_0"));  // the mix, unlike --pure, lifts the output
    CHECK(q40["output.weight"] == T::Q6_K);
    CHECK(q40["blk.0.ffn_down.weight"] == T::Q4_0);
    auto nl = plan_types("tiny-llama-F16.gguf", options("IQ4_NL"));
    CHECK(nl["blk.0.attn_v.weight"] == T::IQ4_NL);    // GQA < 4: no lift
    CHECK(nl["blk.0.ffn_down.weight"] == T::IQ4_NL);  // layer 0 < 4/8 = 0 is false
    auto f16 = plan_types("tiny-llama-F16.gguf", options("BF16"));
    CHECK(f16["output.weight"] == T::BF16);
    CHECK(f16["blk.0.ffn_norm.weight"] == T::F32);
    // qwen2 ties its output to the embedding, which then gets the output's type.
    CHECK(plan_types("tiny-qwen2-F16.gguf", options("Q3_K_M"))["token_embd.weight"] == T::Q6_K);
}

TEST_CASE("quantize: rows the type cannot hold fall back to a 32-block type") {
    using T = llm::Type;
    auto g = llm::GGUF::open(models_dir() + "tiny-deepseek2-lite-F16.gguf");  // attn_k_b rows are 64 long
    const std::pair<const char*, T> cases[] = {{"Q2_K", T::IQ4_NL}, {"Q3_K_M", T::IQ4_NL}, {"Q4_K_S", T::Q5_0},
                                               {"Q5_K_S", T::Q5_1}, {"Q6_K", T::Q8_0}};
    for (const auto& c : cases) {
        CAPTURE(c.first);
        llm::QuantizeResult r = llm::quantize_plan(*g, options(c.first, true));
        int fallbacks = 0;
        for (const auto& e : r.plan) {
            if (e.src->name.find("attn_k_b") != std::string::npos) {
                CHECK(e.type == c.second);
                fallbacks++;
            }
        }
        CHECK(fallbacks == 3);
        CHECK(r.n_fallback == 3);
    }
}

TEST_CASE("quantize: tensor type options, dry run") {
    using T = llm::Type;
    auto o = options("Q4_K_M");
    o.has_output_tensor_type = true;
    o.output_tensor_type = T::Q8_0;
    o.has_token_embedding_type = true;
    o.token_embedding_type = T::F16;
    auto m = plan_types("tiny-llama-F16.gguf", o);
    CHECK(m["output.weight"] == T::Q8_0);
    CHECK(m["token_embd.weight"] == T::F16);
    CHECK(m["blk.3.attn_v.weight"] == T::Q6_K);

    o = options("Q4_K_M");
    o.leave_output_tensor = true;
    CHECK(plan_types("tiny-llama-F16.gguf", o)["output.weight"] == T::F16);

    o = options("Q4_K", true);  // alias of Q4_K_M; --pure: one type for all, output included
    CHECK(o.ftype == llm::FileType::Q4_K_M);
    m = plan_types("tiny-llama-F16.gguf", o);
    CHECK(m["output.weight"] == T::Q4_K);
    CHECK(m["blk.3.ffn_down.weight"] == T::Q4_K);

    TempDir tmp;
    o = options("Q5_K_M");
    o.dry_run = true;
    llm::QuantizeResult r = llm::quantize_model(models_dir() + "tiny-llama-F16.gguf", tmp.file("x.gguf"), o);
    CHECK(tmp.files().empty());
    CHECK(r.bytes_out > 0);
    CHECK(r.bytes_out < r.bytes_in);
}

TEST_CASE("quantize: requantizing needs --allow-requantize") {
    TempDir tmp;
    const std::string q8 = models_dir() + "tiny-llama-Q8_0.gguf";
    std::string err = error_of([&] { llm::quantize_model(q8, tmp.file("x.gguf"), options("Q4_0")); });
    CHECK(err.find("requantiz") != std::string::npos);
    CHECK(tmp.files().empty());
    auto o = options("Q4_0");
    o.allow_requantize = true;
    llm::quantize_model(q8, tmp.file("x.gguf"), o);
    auto g = llm::GGUF::open(tmp.file("x.gguf"));
    CHECK(g->tensor("blk.0.ffn_up.weight")->type == llm::Type::Q4_0);
    CHECK(g->get_int("general.file_type", -1) == 2);
    CHECK(g->get_int("general.quantization_version", -1) == 2);
    // Same type as the input is a plain copy, allowed without the flag.
    llm::quantize_model(q8, tmp.file("y.gguf"), options("Q8_0", true));
    CHECK(testutil::read_file(tmp.file("y.gguf")).size() > 0);
}

TEST_CASE("quantize: bad input gives a clear error and leaves no output") {
    TempDir tmp;
    const std::string src = models_dir() + "tiny-llama-F16.gguf";
    CHECK(error_of([] { llm::file_type_from_name("Q9_K"); }).find("unknown quantization type") != std::string::npos);
    CHECK(error_of([] { llm::file_type_from_name(""); }) != "");

    std::string err = error_of([&] { llm::quantize_model(src, tmp.file("no/such/dir/x.gguf"), options("Q4_0")); });
    CHECK(err.find("cannot create") != std::string::npos);

    std::string data = testutil::read_file(src);
    {
        FILE* f = fopen(tmp.file("trunc.gguf").c_str(), "wb");
        fwrite(data.data(), 1, data.size() / 2, f);
        fclose(f);
        f = fopen(tmp.file("junk.gguf").c_str(), "wb");
        fputs("this is not a model", f);
        fclose(f);
    }
    CHECK(error_of([&] { llm::quantize_model(tmp.file("trunc.gguf"), tmp.file("o.gguf"), options("Q4_0")); }).find("truncated") !=
          std::string::npos);
    CHECK(error_of([&] { llm::quantize_model(tmp.file("junk.gguf"), tmp.file("o.gguf"), options("Q4_0")); }).find("GGUF") !=
          std::string::npos);
    CHECK(error_of([&] { llm::quantize_model(tmp.file("missing.gguf"), tmp.file("o.gguf"), options("Q4_0")); }) != "");
    for (const std::string& f : tmp.files()) CHECK(f.find("o.gguf") == std::string::npos);  // no output, no temp file
}

TEST_CASE("quantize: K-quant rows, edge values") {
    using T = llm::Type;
    std::vector<float> zeros(256, 0.0f), ramp(256), big(256);
    for (int i = 0; i < 256; i++) {
        ramp[i] = (float)(i - 100) / 64.0f;
        big[i] = (i % 7 == 0 ? -3e4f : 1e3f) * (float)((i % 5) + 1);
    }
    for (T t : {T::Q2_K, T::Q3_K, T::Q4_K, T::Q5_K, T::Q6_K}) {
        CAPTURE(llm::type_info(t).name);
        std::vector<uint8_t> out(llm::row_bytes(t, 256), 0xAB);
        for (const auto* x : {&zeros, &ramp, &big}) {
            llm::quantize_row_kquant(t, x->data(), out.data(), 256);
            // The scale fields (fp16) must be finite: no NaN or infinity for any of these inputs.
            const size_t d_off = t == T::Q2_K ? 80 : t == T::Q3_K ? 108 : t == T::Q6_K ? 208 : 0;
            uint16_t d;
            memcpy(&d, out.data() + d_off, 2);
            CHECK((d & 0x7c00) != 0x7c00);
        }
        CHECK(error_of([&] { llm::quantize_row_kquant(t, ramp.data(), out.data(), 128); }) != "");
    }
    CHECK(error_of([&] { llm::quantize_row_kquant(T::Q8_0, ramp.data(), zeros.data(), 256); }) != "");
}

TEST_CASE("quantize: round trip of random data stays within each type's error bound") {
    using T = llm::Type;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n = 64 * 256;
    std::vector<float> x(n), y(n);
    for (float& v : x) v = nd(rng);
    double sum2 = 0;
    for (float v : x) sum2 += (double)v * v;
    // Relative RMS error of gaussian data: what each format's bits allow, with some room (the values
    // measured here are about 0.75 of these bounds; each extra bit should roughly halve them).
    const std::pair<T, double> cases[] = {
        {T::F16, 3e-4}, {T::BF16, 2.5e-3}, {T::Q8_0, 7e-3}, {T::Q6_K, 2.3e-2}, {T::Q5_1, 4.8e-2}, {T::Q5_0, 5.5e-2},
        {T::Q5_K, 4.8e-2}, {T::Q4_1, 1e-1}, {T::Q4_0, 1.1e-1}, {T::IQ4_NL, 1e-1}, {T::Q4_K, 9.5e-2},
        {T::Q3_K, 2e-1}, {T::Q2_K, 3.8e-1},
    };
    for (const auto& [t, bound] : cases) {
        CAPTURE(llm::type_info(t).name);
        std::vector<uint8_t> q(llm::row_bytes(t, n));
        llm::quantize_row_weights(t, x.data(), q.data(), n);
        llm::dequantize_row(t, q.data(), y.data(), n);
        double err2 = 0;
        for (int64_t i = 0; i < n; i++) err2 += (double)(y[i] - x[i]) * (y[i] - x[i]);
        const double rel = std::sqrt(err2 / sum2);
        MESSAGE(std::string(llm::type_info(t).name) << " relative RMS error " << rel);
        CHECK(rel < bound);
    }
}

namespace {

// A minimal llama file: valid hyperparameters (each overridable), a tensor with a zero dimension and an
// ordinary one. Tensor data: 32 x 2 floats.
std::string tiny_file(const std::map<std::string, uint32_t>& overrides = {}, std::vector<uint64_t> zero_shape = {0, 4}) {
    std::map<std::string, uint32_t> hp = {{"llama.embedding_length", 64}, {"llama.block_count", 1},
                                          {"llama.attention.head_count", 2}, {"llama.context_length", 128},
                                          {"llama.vocab_size", 16}};
    for (const auto& [k, v] : overrides) hp[k] = v;
    testutil::GGUFBuilder b;
    b.header(3, 2, 1 + hp.size()).kv_str("general.architecture", "llama");
    for (const auto& [k, v] : hp) b.kv_u32(k, v);
    b.tensor("zero.weight", zero_shape, 0, 0).tensor("one.weight", {32, 2}, 0, 0).pad();
    for (int i = 0; i < 64; i++) b.put<float>((float)i / 8);
    return b.b;
}

// Runs llm-quantize ARGS in the background; returns its pid.
pid_t spawn_quantize(const std::vector<std::string>& args) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        std::vector<char*> argv = {(char*)"./llm-quantize"};
        for (const std::string& a : args) argv.push_back((char*)a.c_str());
        argv.push_back(nullptr);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 2);
        execv(argv[0], argv.data());
        _exit(127);
    }
    return pid;
}

}  // namespace

TEST_CASE("quantize: a zero dimension is legal for the loader and the quantizer; overflowing shapes are refused") {
    TempDir tmp;
    testutil::write_file(tmp.file("zero.gguf"), tiny_file());
    auto g = llm::GGUF::open(tmp.file("zero.gguf"));
    const llm::TensorInfo* z = g->tensor("zero.weight");
    REQUIRE(z);
    CHECK(z->nelements() == 0);
    CHECK(z->n_rows() == 4);
    CHECK(z->nbytes == 0);
    // The loader gets past the shapes and fails on what is missing, with a message.
    CHECK(error_of([&] { llm::Model::load(tmp.file("zero.gguf")); }).find("token_embd") != std::string::npos);

    auto o = options("Q8_0");
    o.dry_run = true;   // the plan alone divided by ne[0] (SIGFPE)
    CHECK(llm::quantize_model(tmp.file("zero.gguf"), "", o).bytes_in == 256);
    llm::quantize_model(tmp.file("zero.gguf"), tmp.file("out.gguf"), options("Q8_0"));
    auto q = llm::GGUF::open(tmp.file("out.gguf"));
    const llm::TensorInfo* qz = q->tensor("zero.weight");
    REQUIRE(qz);
    CHECK(qz->ne[0] == 0);
    CHECK(qz->ne[1] == 4);
    CHECK(qz->nbytes == 0);
    CHECK(q->tensor("one.weight")->nelements() == 64);
    // The program too: exit status 0, not a signal.
    CHECK(testutil::run("./llm-quantize --dry-run '" + tmp.file("zero.gguf") + "' Q4_0 1 2>/dev/null") == 0);

    // The fuzzer's shape: the zero hid a product of the other dimensions that overflows int64.
    testutil::write_file(tmp.file("huge.gguf"), tiny_file({}, {0, 2385218952646099200ull, 20890720927744ull}));
    CHECK(error_of([&] { llm::GGUF::open(tmp.file("huge.gguf")); }).find("tensor dimension too large") != std::string::npos);
    testutil::write_file(tmp.file("huge.gguf"), tiny_file({}, {0, 1ull << 40, 1ull << 40}));
    CHECK(error_of([&] { llm::GGUF::open(tmp.file("huge.gguf")); }).find("tensor element count overflows") != std::string::npos);
}

TEST_CASE("quantize: hyperparameters are validated exactly as the loader does; no output for a rejected file") {
    TempDir tmp;
    const std::map<std::string, uint32_t> bad[] = {{{"llama.attention.head_count", 0}},
                                                   {{"llama.block_count", 1u << 31}},
                                                   {{"llama.context_length", 0}}};
    for (const auto& overrides : bad) {
        CAPTURE(overrides.begin()->first);
        testutil::write_file(tmp.file("bad.gguf"), tiny_file(overrides));
        llm::ModelOptions mo;
        mo.metadata_only = true;
        const std::string load_err = error_of([&] { llm::Model::load(tmp.file("bad.gguf"), mo); });
        CHECK(load_err.find("out of range") != std::string::npos);
        CHECK(error_of([&] { llm::quantize_model(tmp.file("bad.gguf"), tmp.file("o.gguf"), options("Q8_0")); }) == load_err);
        CHECK(testutil::run("./llm-quantize '" + tmp.file("bad.gguf") + "' '" + tmp.file("o.gguf") + "' Q8_0 2>/dev/null") == 1);
        for (const std::string& f : tmp.files()) CHECK(f.find("o.gguf") == std::string::npos);
    }
    // A count beyond int is refused, not truncated to a small valid one.
    testutil::GGUFBuilder b;
    b.header(3, 0, 5).kv_str("general.architecture", "llama").kv_u32("llama.embedding_length", 64);
    b.str("llama.block_count").put<uint32_t>(10).put<uint64_t>((1ull << 32) + 1);   // UINT64
    b.kv_u32("llama.attention.head_count", 2).kv_u32("llama.vocab_size", 16);
    testutil::write_file(tmp.file("wrap.gguf"), b.b);
    CHECK(error_of([&] { llm::read_hparams(*llm::GGUF::open(tmp.file("wrap.gguf"))); }).find("block_count is out of range") !=
          std::string::npos);
}

TEST_CASE("quantize: SIGTERM, SIGINT and SIGHUP leave no file; stale temp files of dead processes are removed") {
    const std::string model = "models/gemma-3-270m-Q4_K_M.gguf";   // large enough to be caught mid-write
    REQUIRE(testutil::file_exists(model));
    TempDir tmp;
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
        CAPTURE(sig);
        pid_t pid = spawn_quantize({"--allow-requantize", model, tmp.file("out.gguf"), "Q2_K", "1"});
        const std::string partial = tmp.file("out.gguf.tmp." + std::to_string(pid));
        for (int i = 0; i < 3000 && !testutil::file_exists(partial); i++) usleep(2000);
        CHECK(testutil::file_exists(partial));
        kill(pid, sig);
        int status = 0;
        REQUIRE(waitpid(pid, &status, 0) == pid);
        CHECK(WIFSIGNALED(status));
        if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == sig);
        CHECK(tmp.files().empty());
    }
    // A dead process's leftover (pid above any pid_max) goes; a live process's (our parent's) stays.
    const std::string dead = "x.gguf.tmp.999999999", live = "x.gguf.tmp." + std::to_string(getppid());
    testutil::write_file(tmp.file(dead), "partial");
    testutil::write_file(tmp.file(live), "partial");
    llm::quantize_model(models_dir() + "tiny-llama-F16.gguf", tmp.file("x.gguf"), options("Q8_0"));
    CHECK(tmp.files() == std::vector<std::string>{"x.gguf", live});
}
