// GGUF reader: real files, every metadata type, split files, and malformed input that must give a
// clear llm::Error (never a crash or a huge allocation).
#include <doctest/doctest.h>

#include <cstring>
#include <unistd.h>

#include "../llm.hpp"
#include "util.hpp"

namespace {

using testutil::GGUFBuilder;

std::unique_ptr<llm::GGUF> parse(const std::string& s) { return llm::gguf_parse_memory((const uint8_t*)s.data(), s.size()); }

std::string error_of(const std::string& s) {
    try {
        parse(s);
    } catch (const llm::Error& e) {
        return e.what();
    }
    return "";
}

std::string golden_model(const std::string& name) { return testutil::shared_dir() + "/golden/models/" + name; }

}  // namespace

TEST_CASE("gguf: golden model metadata and tensors") {
    auto g = llm::GGUF::open(golden_model("tiny-llama-Q4_K_M.gguf"));
    CHECK(g->version == 3);
    CHECK(g->get_str("general.architecture") == "llama");
    CHECK(g->get_int("llama.block_count", 0) == 4);
    CHECK(g->get_float("llama.attention.layer_norm_rms_epsilon", 0) == doctest::Approx(1e-6));
    const llm::TensorInfo* t = g->tensor("blk.0.attn_q.weight");
    REQUIRE(t);
    CHECK(t->ne[0] == 256);
    CHECK(t->ne[1] == 256);
    CHECK(t->nbytes == llm::row_bytes(t->type, 256) * 256);
    CHECK(g->tensor("no.such.tensor") == nullptr);
}

TEST_CASE("gguf: every metadata value type, nested arrays, version 2") {
    for (uint32_t version : {2u, 3u}) {
        GGUFBuilder w;
        w.header(version, 0, 9);
        w.str("u8").put<uint32_t>(0).put<uint8_t>(200);
        w.str("i16").put<uint32_t>(3).put<int16_t>(-7);
        w.str("i64").put<uint32_t>(11).put<int64_t>(-1234567890123LL);
        w.str("f64").put<uint32_t>(12).put<double>(2.5);
        w.str("b").put<uint32_t>(7).put<uint8_t>(1);
        w.kv_str("s", "hello");
        w.str("strs").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a").str("bc");
        w.str("nums").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(3).put<float>(1).put<float>(2).put<float>(3);
        // array of arrays of u16
        w.str("nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(2);
        w.put<uint32_t>(2).put<uint64_t>(1).put<uint16_t>(5);
        w.put<uint32_t>(2).put<uint64_t>(2).put<uint16_t>(6).put<uint16_t>(7);
        auto g = parse(w.b);
        CHECK(g->version == version);
        CHECK(g->get_int("u8", 0) == 200);
        CHECK(g->get_int("i16", 0) == -7);
        CHECK(g->get_int("i64", 0) == -1234567890123LL);
        CHECK(g->get_float("f64", 0) == 2.5);
        CHECK(g->get_bool("b", false));
        CHECK(g->get_str("s") == "hello");
        REQUIRE(g->find("strs"));
        CHECK(g->find("strs")->arr_str == std::vector<std::string>{"a", "bc"});
        CHECK(g->find("nums")->arr_num == std::vector<double>{1, 2, 3});
        const llm::GGUFValue* n = g->find("nested");
        REQUIRE(n->arr.size() == 2);
        CHECK(n->arr[1].arr_num == std::vector<double>{6, 7});
        CHECK_THROWS_AS(g->get_int("s", 0), llm::Error);  // a string is not a number
    }
}

TEST_CASE("gguf: alignment and tensor data placement") {
    GGUFBuilder w;
    w.header(3, 1, 1).kv_u32("general.alignment", 64).tensor("t", {4}, 0, 0).pad(64);
    size_t data_at = w.b.size();
    for (int i = 0; i < 4; i++) w.put<float>((float)i + 0.5f);
    auto g = parse(w.b);
    CHECK(g->alignment == 64);
    CHECK(g->tensors[0].data == (const uint8_t*)w.b.data() + data_at);
    CHECK(((const float*)g->tensors[0].data)[3] == 3.5f);
}

TEST_CASE("gguf: malformed headers give one-line errors") {
    auto valid = [] {
        GGUFBuilder w;
        w.header(3, 1, 1).kv_str("general.architecture", "llama").tensor("t", {32, 2}, 0, 0).pad().zeros(256);
        return w;
    };
    REQUIRE(error_of(valid().b).empty());
    CHECK(error_of("").find("too short") != std::string::npos);
    CHECK(error_of("GGUX" + valid().b.substr(4)).find("magic") != std::string::npos);
    {
        GGUFBuilder w;
        w.header(1, 0, 0);
        CHECK(error_of(w.b).find("version") != std::string::npos);
    }
    {
        GGUFBuilder w;  // absurd counts must be rejected before allocating
        w.header(3, 1ull << 60, 0);
        CHECK(error_of(w.b).find("tensor count") != std::string::npos);
        GGUFBuilder w2;
        w2.header(3, 0, 1ull << 62);
        CHECK(error_of(w2.b).find("metadata count") != std::string::npos);
    }
    {
        GGUFBuilder w;  // string length beyond the file
        w.header(3, 0, 1).put<uint64_t>(1ull << 40).zeros(16);
        CHECK(error_of(w.b).find("metadata key") != std::string::npos);
    }
    {
        GGUFBuilder w;  // array with an absurd length
        w.header(3, 0, 1).str("a").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(1ull << 61);
        CHECK(error_of(w.b).find("array length") != std::string::npos);
    }
    {
        GGUFBuilder w;  // unknown value type
        w.header(3, 0, 1).str("a").put<uint32_t>(99);
        CHECK(error_of(w.b).find("value type") != std::string::npos);
    }
    {
        GGUFBuilder w;  // arrays nested without end
        w.header(3, 0, 1).str("a");
        w.put<uint32_t>(9);
        for (int i = 0; i < 20; i++) w.put<uint32_t>(9).put<uint64_t>(1);
        CHECK(error_of(w.b).find("nested") != std::string::npos);
    }
    {
        GGUFBuilder w;
        w.header(3, 1, 0).tensor("t", {32, 1ull << 40, 1ull << 40}, 0, 0).pad();
        CHECK(error_of(w.b).find("overflow") != std::string::npos);
    }
    {
        GGUFBuilder w;
        w.header(3, 1, 0).tensor("t", {32, 2}, 0, 1ull << 50).pad();
        CHECK(error_of(w.b).find("beyond the end") != std::string::npos);
    }
    {
        GGUFBuilder w;
        w.header(3, 1, 0).tensor("t", {32}, 0, 3).pad().zeros(256);
        CHECK(error_of(w.b).find("aligned") != std::string::npos);
    }
    {
        GGUFBuilder w;
        w.header(3, 1, 0).tensor("t", {32}, 77, 0).pad().zeros(256);
        CHECK(error_of(w.b).find("unsupported type") != std::string::npos);
    }
    {
        GGUFBuilder w;
        w.header(3, 1, 0).tensor("t", {33}, 2, 0).pad().zeros(256);  // q4_0 rows need multiples of 32
        CHECK(error_of(w.b).find("block size") != std::string::npos);
    }
    {
        GGUFBuilder w;
        w.header(3, 1, 0).tensor("t", {32, 1, 1, 1, 1}, 0, 0);
        CHECK(error_of(w.b).find("dimension count") != std::string::npos);
    }
    {
        GGUFBuilder w;
        w.header(3, 2, 0).tensor("t", {32}, 0, 0).tensor("t", {32}, 0, 128).pad().zeros(512);
        CHECK(error_of(w.b).find("duplicate tensor") != std::string::npos);
    }
    {
        GGUFBuilder w;
        w.header(3, 0, 1).kv_u32("general.alignment", 48);
        CHECK(error_of(w.b).find("power of two") != std::string::npos);
    }
}

TEST_CASE("gguf: a golden model truncated at many offsets always fails cleanly") {
    std::string full = testutil::read_file(golden_model("tiny-qwen2-Q4_K_M.gguf"));
    REQUIRE(error_of(full).empty());
    int errors = 0, tried = 0;
    for (size_t cut = 0; cut < full.size(); cut += 1 + full.size() / 300 + (cut < 4096 ? 0 : 0)) {
        std::string part = full.substr(0, cut);
        tried++;
        errors += !error_of(part).empty();
    }
    for (size_t cut = 0; cut < 4096; cut += 7) errors += !error_of(full.substr(0, cut)).empty(), tried++;
    CHECK(errors == tried);
    // Random byte flips in the header: parse or a clean error, nothing else.
    std::mt19937 rng(7);
    for (int i = 0; i < 2000; i++) {
        std::string bad = full.substr(0, 8192);
        for (int k = 0; k < 4; k++) bad[rng() % bad.size()] = (char)rng();
        (void)error_of(bad);
    }
}

TEST_CASE("gguf: missing file and split sets") {
    CHECK_THROWS_WITH_AS(llm::GGUF::open("/nonexistent/model.gguf"), doctest::Contains("cannot open"), llm::Error);
    // Write a 2-part split model by hand: each part is a GGUF with split.* keys and its own tensors.
    std::string dir = "/tmp/llm-test-split-" + std::to_string(getpid());
    testutil::run("mkdir -p " + dir);
    for (int part = 0; part < 2; part++) {
        GGUFBuilder w;
        w.header(3, 1, part == 0 ? 4 : 3);
        if (part == 0) w.kv_str("general.architecture", "llama");
        w.str("split.no").put<uint32_t>(2).put<uint16_t>((uint16_t)part);
        w.str("split.count").put<uint32_t>(2).put<uint16_t>(2);
        w.str("split.tensors.count").put<uint32_t>(5).put<int32_t>(2);
        w.tensor(part == 0 ? "a" : "b", {4}, 0, 0).pad();
        for (int i = 0; i < 4; i++) w.put<float>((float)(part * 10 + i));
        std::ofstream(dir + "/m-0000" + std::to_string(part + 1) + "-of-00002.gguf", std::ios::binary) << w.b;
    }
    auto g = llm::GGUF::open(dir + "/m-00001-of-00002.gguf");
    REQUIRE(g->tensors.size() == 2);
    CHECK(((const float*)g->tensor("b")->data)[2] == 12.0f);
    CHECK(g->get_str("general.architecture") == "llama");
    CHECK_THROWS_WITH_AS(llm::GGUF::open(dir + "/m-00002-of-00002.gguf"), doctest::Contains("first part"), llm::Error);
    testutil::run("rm -f " + dir + "/m-00002-of-00002.gguf");
    CHECK_THROWS_WITH_AS(llm::GGUF::open(dir + "/m-00001-of-00002.gguf"), doctest::Contains("cannot open"), llm::Error);
    testutil::run("rm -rf " + dir);
}
