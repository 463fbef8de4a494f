// Quantization formats: dequantizers and reference quantizers against the `gguf` Python package
// (llama.cpp's gguf-py), round-trip error bounds, every SIMD dot-product path against the scalar
// reference, and matmul_rows against vec_dot.
#include <doctest/doctest.h>

#include "../llm.hpp"
#include "util.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <unistd.h>

using llm::Type;

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::string s = testutil::read_file(path);
    return std::vector<uint8_t>(s.begin(), s.end());
}
std::vector<float> read_floats(const std::string& path) {
    std::vector<uint8_t> b = read_bytes(path);
    std::vector<float> f(b.size() / 4);
    memcpy(f.data(), b.data(), f.size() * 4);
    return f;
}
// Minimal half conversions for normal values (the engine's own are implementation-only).
float h2f(uint16_t h) {
    const uint32_t e = (h >> 10) & 0x1f, bits = (uint32_t)(h & 0x8000) << 16 | (e ? (e + 112) << 23 | (h & 0x3ff) << 13 : 0);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
uint16_t f2h(float f) {  // truncating; only used for test scales
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u >> 16 & 0x8000) | (((u >> 23 & 0xff) - 112) << 10) | (u >> 13 & 0x3ff));
}
struct BlockQ8_1 { uint16_t d, s; int8_t qs[32]; };  // ggml's block_q8_1
struct BlockQ8_K { float d; int8_t qs[256]; int16_t bsums[16]; };

uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// Runs tests/quant_ref.py once; returns its output directory, or "" when python3 + gguf are missing.
struct RefData {
    std::string dir;
    std::vector<std::vector<std::string>> index;  // kind, type name, count, file prefix
};
const RefData& ref_data() {
    static RefData r = [] {
        RefData d;
        if (testutil::run("python3 -c 'import gguf, numpy' 2>/dev/null") != 0) return d;
        std::string script = std::string(__FILE__);
        script = script.substr(0, script.rfind('/') + 1) + "quant_ref.py";
        if (!testutil::file_exists(script)) script = "tests/quant_ref.py";
        d.dir = "/tmp/llm_quant_ref_" + std::to_string(getpid());
        std::string models;
        const std::string mdir = testutil::shared_dir() + "/golden/models/";
        for (const std::string& f : testutil::list_dir(mdir, ".gguf"))
            if (f.rfind("tiny-llama-", 0) == 0 && (f.find("-pure") != std::string::npos || f == "tiny-llama-Q6_K.gguf" || f == "tiny-llama-Q8_0.gguf"))
                models += " '" + mdir + f + "'";
        std::string out;
        if (testutil::run("python3 '" + script + "' '" + d.dir + "'" + models + " 2>&1", &out) != 0) {
            MESSAGE("quant_ref.py failed: " << out);
            d.dir.clear();
            return d;
        }
        static struct Cleanup {  // remove the reference files when the test program exits
            std::string dir;
            ~Cleanup() { if (!dir.empty()) testutil::run("rm -rf '" + dir + "'"); }
        } cleanup;
        cleanup.dir = d.dir;
        std::stringstream ss(testutil::read_file(d.dir + "/index.txt"));
        std::string kind, name, count, prefix;
        while (ss >> kind >> name >> count >> prefix) d.index.push_back({kind, name, count, prefix});
        return d;
    }();
    return r;
}

template <class Fn>
void for_each_ref(const std::string& kind, Fn fn) {
    const RefData& r = ref_data();
    if (r.dir.empty()) {
        MESSAGE("SKIPPED: python3 with the gguf package is not available");
        return;
    }
    int n = 0;
    for (const auto& e : r.index) {
        if (e[0] != kind) continue;
        n++;
        fn(llm::type_from_name(e[1]), std::stoll(e[2]), r.dir + "/" + e[3]);
    }
    CHECK(n > 0);
}

void check_dequant_exact(Type t, int64_t n, const std::string& prefix) {
    CAPTURE(prefix);
    std::vector<uint8_t> raw = read_bytes(prefix + ".raw");
    std::vector<float> want = read_floats(prefix + ".f32");
    REQUIRE(want.size() == (size_t)n);
    REQUIRE(raw.size() == llm::row_bytes(t, n));
    std::vector<float> got(n);
    llm::dequantize_row(t, raw.data(), got.data(), n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        if (bits_of(got[i]) != bits_of(want[i])) {
            if (bad++ < 3) MESSAGE("value " << i << ": got " << got[i] << ", gguf " << want[i]);
        }
    CHECK(bad == 0);
}

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

std::vector<uint8_t> quantized(Type t, const std::vector<float>& x) {
    std::vector<uint8_t> q(llm::row_bytes(t, (int64_t)x.size()));
    llm::quantize_row(t, x.data(), q.data(), (int64_t)x.size());
    return q;
}

// Sets every fp16 scale field (d, and dmin where the type has one) of K-quant blocks in q to what
// value() returns; other types are left alone.
template <class Value>
void set_k_scales(Type t, std::vector<uint8_t>& q, Value value) {
    struct Field { Type t; size_t block, off[2]; int count; };
    static const Field fields[] = {
        {Type::Q2_K, 84, {80, 82}, 2}, {Type::Q3_K, 110, {108, 0}, 1}, {Type::Q4_K, 144, {0, 2}, 2},
        {Type::Q5_K, 176, {0, 2}, 2}, {Type::Q6_K, 210, {208, 0}, 1},
    };
    for (const Field& f : fields) {
        if (f.t != t) continue;
        for (size_t b = 0; b < q.size() / f.block; b++)
            for (int i = 0; i < f.count; i++) {
                uint16_t h = f2h(value());
                memcpy(&q[b * f.block + f.off[i]], &h, 2);
            }
    }
}

// Random weights of type t: produced by quantizing random floats, so scales are realistic. K-quant
// weights come from quantize_row_kquant when it is available, else from random bytes with sane scales.
std::vector<uint8_t> random_weights(std::mt19937& rng, Type t, int64_t n) {
    std::vector<float> x = random_floats(rng, n, 0.05f);
    try {
        return quantized(t, x);
    } catch (const llm::Error&) {
    }
    std::vector<uint8_t> q(llm::row_bytes(t, n));
    for (auto& b : q) b = (uint8_t)rng();
    std::uniform_real_distribution<float> ud(0.001f, 0.01f);
    set_k_scales(t, q, [&] { return ud(rng); });  // small positive scales
    return q;
}

const Type kWeightTypes[] = {Type::F32, Type::F16, Type::BF16, Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1,
                             Type::Q8_0, Type::IQ4_NL, Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K};

std::vector<llm::Isa> supported_isas() {
    std::vector<llm::Isa> v;
    for (llm::Isa isa : {llm::Isa::Scalar, llm::Isa::AVX2, llm::Isa::AVXVNNI, llm::Isa::AVX512})
        if (llm::isa_supported(isa)) v.push_back(isa);
    return v;
}

// `rows` random weight rows of type t; `cols` activation columns of type `at` (quantized random floats).
std::vector<uint8_t> random_rows(std::mt19937& rng, Type t, int64_t k, int64_t rows) {
    std::vector<uint8_t> W;
    for (int64_t r = 0; r < rows; r++) {
        std::vector<uint8_t> w = random_weights(rng, t, k);
        W.insert(W.end(), w.begin(), w.end());
    }
    return W;
}
std::vector<uint8_t> random_activations(std::mt19937& rng, Type at, int64_t k, int64_t cols) {
    std::vector<uint8_t> A;
    for (int64_t c = 0; c < cols; c++) {
        std::vector<uint8_t> q = quantized(at, random_floats(rng, k, 1.0f));
        A.insert(A.end(), q.begin(), q.end());
    }
    return A;
}

struct IsaGuard {  // restores the automatic choice when a test forced one
    llm::Isa saved = llm::isa_current();
    ~IsaGuard() { llm::isa_set(saved); }
};

} // namespace

TEST_CASE("quants: dequantize_row matches gguf-py on random blocks, bit for bit") {
    for_each_ref("deq", check_dequant_exact);
}

TEST_CASE("quants: dequantize_row matches gguf-py on real model tensors") {
    for_each_ref("model", check_dequant_exact);
}

TEST_CASE("quants: quantize_row matches gguf-py's quantizers, byte for byte") {
    for_each_ref("quant", [](Type t, int64_t n, const std::string& prefix) {
        CAPTURE(prefix);
        std::vector<float> x = read_floats(prefix + ".in");
        std::vector<uint8_t> want = read_bytes(prefix + ".raw");
        REQUIRE(x.size() == (size_t)n);
        // Model-file quantization (the reference rounding that gguf-py reproduces).
        std::vector<uint8_t> got(llm::row_bytes(t, n));
        llm::quantize_row_weights(t, x.data(), got.data(), n);
        REQUIRE(got.size() == want.size());
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); i++) bad += got[i] != want[i];
        CHECK(bad == 0);
    });
}

TEST_CASE("quants: float conversions are exact where they should be") {
    std::mt19937 rng(7);
    std::vector<float> x = random_floats(rng, 64, 1.0f);
    std::vector<float> y(64);
    llm::dequantize_row(Type::F32, quantized(Type::F32, x).data(), y.data(), 64);
    CHECK(memcmp(x.data(), y.data(), 64 * 4) == 0);
    for (Type t : {Type::F16, Type::BF16}) {
        std::vector<uint8_t> q = quantized(t, x);
        llm::dequantize_row(t, q.data(), y.data(), 64);
        for (int i = 0; i < 64; i++) CHECK(std::fabs(y[i] - x[i]) <= std::fabs(x[i]) * (t == Type::F16 ? 1e-3f : 8e-3f));
    }
}

TEST_CASE("quants: quantize/dequantize round trip error bounds") {
    std::mt19937 rng(42);
    const int64_t n = 4 * 256;
    std::vector<float> x = random_floats(rng, n, 1.0f);
    // Relative RMS error bound per type (generous: a few times the expected value for gaussian data).
    const std::pair<Type, double> cases[] = {
        {Type::Q8_0, 0.01}, {Type::Q8_1, 0.01}, {Type::Q8_K, 0.01}, {Type::Q5_0, 0.05}, {Type::Q5_1, 0.05},
        {Type::Q4_0, 0.1}, {Type::Q4_1, 0.1}, {Type::IQ4_NL, 0.1},
    };
    double sum2 = 0;
    for (float v : x) sum2 += (double)v * v;
    for (const auto& tc : cases) {
        const Type t = tc.first;
        const double bound = tc.second;
        CAPTURE(llm::type_info(t).name);
        std::vector<uint8_t> q = quantized(t, x);
        std::vector<float> y(n);
        if (t == Type::Q8_1) {
            // no dequantizer for q8_1 (activation-only type): read the blocks directly
            for (int64_t b = 0; b < n / 32; b++) {
                const auto* blk = (const BlockQ8_1*)q.data() + b;
                int sum = 0;
                for (int j = 0; j < 32; j++) {
                    y[b * 32 + j] = blk->qs[j] * h2f(blk->d);
                    sum += blk->qs[j];
                }
                CHECK(std::fabs(h2f(blk->s) - sum * h2f(blk->d)) <=
                      1e-2f * std::fabs(sum * h2f(blk->d)) + 1e-3f);
            }
        } else {
            llm::dequantize_row(t, q.data(), y.data(), n);
        }
        double err2 = 0;
        for (int64_t i = 0; i < n; i++) err2 += (double)(y[i] - x[i]) * (y[i] - x[i]);
        CHECK(std::sqrt(err2 / sum2) < bound);
    }
    // Q8_K block sums are the sums of its quants.
    std::vector<uint8_t> q = quantized(Type::Q8_K, x);
    const auto* blk = (const BlockQ8_K*)q.data();
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += blk->qs[16 * j + i];
        CHECK(blk->bsums[j] == s);
    }
    // All-zero input quantizes to zeros.
    std::vector<float> zeros(n, 0.0f), back(n, 1.0f);
    for (const auto& tc : cases) {
        const Type t = tc.first;
        if (t == Type::Q8_1) continue;
        std::vector<uint8_t> qz = quantized(t, zeros);
        llm::dequantize_row(t, qz.data(), back.data(), n);
        for (float v : back) CHECK(v == 0.0f);
    }
}

TEST_CASE("quants: activation quantizers (quantize_row) give the scalar path's bytes on every tier") {
    IsaGuard guard;
    // Gaussian blocks at several magnitudes (down to scales that are f16 subnormals), an all-zero
    // block, blocks whose largest value has either sign, values halfway between two quants, and a
    // block of one repeated value (its sum is 32 x 127).
    std::mt19937 rng(23);
    std::vector<float> x;
    for (float scale : {1.0f, 1e-3f, 1e-6f, 300.0f})
        for (float v : random_floats(rng, 1024, scale)) x.push_back(v);
    for (int i = 0; i < 256; i++) x.push_back(0.0f);
    for (int i = 0; i < 256; i++) x.push_back(i % 32 == 5 ? -127.0f : (i % 7) - 3.5f + (i % 2 ? 0.5f : 0.0f));
    for (int i = 0; i < 256; i++) x.push_back(0.75f);
    const int64_t n = (int64_t)x.size();
    for (Type t : {Type::Q8_0, Type::Q8_1, Type::Q8_K, Type::F16}) {
        CAPTURE(llm::type_info(t).name);
        llm::isa_set(llm::Isa::Scalar);
        const std::vector<uint8_t> want = quantized(t, x);
        for (llm::Isa isa : supported_isas()) {
            CAPTURE(llm::isa_name(isa));
            llm::isa_set(isa);
            std::vector<uint8_t> got(llm::row_bytes(t, n));
            llm::quantize_row(t, x.data(), got.data(), n);
            CHECK(got == want);
        }
    }
}

TEST_CASE("quants: vec_dot_type") {
    CHECK(llm::vec_dot_type(Type::F32) == Type::F32);
    CHECK(llm::vec_dot_type(Type::F16) == Type::F16);
    CHECK(llm::vec_dot_type(Type::BF16) == Type::BF16);
    for (Type t : {Type::Q4_0, Type::Q5_0, Type::Q8_0, Type::IQ4_NL}) CHECK(llm::vec_dot_type(t) == Type::Q8_0);
    for (Type t : {Type::Q4_1, Type::Q5_1}) CHECK(llm::vec_dot_type(t) == Type::Q8_1);
    for (Type t : {Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K}) CHECK(llm::vec_dot_type(t) == Type::Q8_K);
}

TEST_CASE("quants: scalar vec_dot approximates the float dot product of the dequantized rows") {
    IsaGuard guard;
    llm::isa_set(llm::Isa::Scalar);
    std::mt19937 rng(3);
    const int64_t n = 512;
    for (Type t : kWeightTypes) {
        CAPTURE(llm::type_info(t).name);
        std::vector<uint8_t> w = random_weights(rng, t, n);
        std::vector<float> a = random_floats(rng, n, 1.0f);
        const Type at = llm::vec_dot_type(t);
        std::vector<uint8_t> aq = quantized(at, a);
        std::vector<float> wf(n), af(n);
        llm::dequantize_row(t, w.data(), wf.data(), n);
        if (at == Type::Q8_1) {
            for (int64_t i = 0; i < n; i++) {
                const auto* b = (const BlockQ8_1*)aq.data() + i / 32;
                af[i] = b->qs[i % 32] * h2f(b->d);
            }
        } else {
            llm::dequantize_row(at, aq.data(), af.data(), n);
        }
        double want = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            want += (double)wf[i] * af[i];
            mag += std::fabs((double)wf[i] * af[i]);
        }
        const float got = llm::vec_dot(t, n, w.data(), aq.data());
        CHECK(std::fabs(got - want) <= 1e-4 * mag + 1e-6);
    }
}

TEST_CASE("quants: every SIMD path agrees with the scalar vec_dot") {
    IsaGuard guard;
    std::mt19937 rng(11);
    MESSAGE("best instruction set: " << llm::isa_name(llm::isa_best()));
    for (Type t : kWeightTypes) {
        for (int64_t n : {256, 768, 4096, 264, 37}) {  // the last two only for float types (tails)
            if (n % llm::type_info(t).block_size) continue;
            CAPTURE(llm::type_info(t).name);
            CAPTURE(n);
            std::vector<uint8_t> w = random_weights(rng, t, n);
            std::vector<float> a = random_floats(rng, n, 1.0f);
            std::vector<uint8_t> aq = quantized(llm::vec_dot_type(t), a);
            llm::isa_set(llm::Isa::Scalar);
            const float want = llm::vec_dot(t, n, w.data(), aq.data());
            // scale for the tolerance: the dot product of absolute values
            std::vector<float> wf(n);
            llm::dequantize_row(t, w.data(), wf.data(), n);
            double mag = 0;
            for (int64_t i = 0; i < n; i++) mag += std::fabs(wf[i] * a[i]);
            float avx2 = 0;
            for (llm::Isa isa : supported_isas()) {
                if (isa == llm::Isa::Scalar) continue;
                CAPTURE(llm::isa_name(isa));
                llm::isa_set(isa);
                const float got = llm::vec_dot(t, n, w.data(), aq.data());
                CHECK(std::fabs(got - want) <= 2e-5 * mag + 1e-6);
                if (isa == llm::Isa::AVX2) avx2 = got;
                if (isa == llm::Isa::AVXVNNI) CHECK(got == avx2);  // the same row kernel, VNNI's exact integer sums
            }
        }
    }
}

TEST_CASE("quants: matmul_rows equals vec_dot for every tile shape") {
    IsaGuard guard;
    std::mt19937 rng(5);
    const int64_t k = 512, rows = 7, cols = 13, ld = 9;  // odd sizes: 1-row and narrow-column tails, and a
                                                        // 5-column tail after a full 8-column tile (padded)
    for (Type t : kWeightTypes) {
        CAPTURE(llm::type_info(t).name);
        const Type at = llm::vec_dot_type(t);
        const size_t wrow = llm::row_bytes(t, k), arow = llm::row_bytes(at, k);
        const std::vector<uint8_t> W = random_rows(rng, t, k, rows), A = random_activations(rng, at, k, cols);
        for (llm::Isa isa : supported_isas()) {
            CAPTURE(llm::isa_name(isa));
            llm::isa_set(isa);
            for (int64_t n_act : {(int64_t)1, (int64_t)6, (int64_t)cols}) {
                std::vector<float> out(ld * cols, -1.0f);
                llm::matmul_rows(t, W.data(), wrow, k, 1, rows, A.data(), arow, n_act, out.data(), ld);
                for (int64_t j = 0; j < cols; j++) {
                    for (int64_t i = 0; i < ld; i++) {
                        if (j < n_act && i >= 1 && i < rows) {
                            const float want = llm::vec_dot(t, k, W.data() + i * wrow, A.data() + j * arow);
                            CHECK(out[j * ld + i] == want);  // same kernel, same summation order
                        } else {
                            CHECK(out[j * ld + i] == -1.0f);  // untouched
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("quants: interleaved weights round-trip and multiply like their rows") {
    IsaGuard guard;
    std::mt19937 rng(9);
    const int64_t k = 512, rows = 48, cols = 13, ld = rows + 3;
    for (Type t : {Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K, Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0, Type::IQ4_NL}) {
        const std::string type_name = llm::type_info(t).name;
        CAPTURE(type_name);
        const Type at = llm::vec_dot_type(t);
        const size_t wrow = llm::row_bytes(t, k), arow = llm::row_bytes(at, k);
        std::vector<uint8_t> W, A;
        std::vector<float> wf(rows * k), af;
        for (int r = 0; r < rows; r++) {
            std::vector<uint8_t> w = random_weights(rng, t, k);
            llm::dequantize_row(t, w.data(), wf.data() + r * k, k);
            W.insert(W.end(), w.begin(), w.end());
        }
        for (int c = 0; c < cols; c++) {
            std::vector<float> a = random_floats(rng, k, 1.0f);
            std::vector<uint8_t> q = quantized(at, a);
            A.insert(A.end(), q.begin(), q.end());
            af.insert(af.end(), a.begin(), a.end());
        }
        std::vector<uint8_t> packed(W.size()), back(W.size());
        llm::interleave_rows16(t, W.data(), packed.data(), k, rows);
        llm::deinterleave_rows16(t, packed.data(), back.data(), k, rows);
        CHECK(packed != W);
        CHECK(back == W);  // lossless
        for (int64_t r : {0, 17, 47}) {  // single rows (a tied embedding's lookups)
            std::vector<float> want(k), got(k);
            llm::dequantize_interleaved_row(t, packed.data(), k, r, got.data());
            CHECK(std::equal(got.begin(), got.end(), wf.begin() + r * k));
        }
        CHECK_THROWS_AS(llm::interleave_rows16(t, W.data(), packed.data(), k, rows - 8), llm::Error);

        std::map<int64_t, std::vector<float>> first_fast;  // per column count: the first SIMD tier's results
        for (llm::Isa isa : supported_isas()) {
            CAPTURE(llm::isa_name(isa));
            llm::isa_set(isa);
            const bool fast = llm::interleave_supported(t, k, rows);
            CHECK(fast == (isa != llm::Isa::Scalar));  // AVX2, AVX-VNNI and AVX-512 all have interleaved kernels
            for (int64_t n_act : {(int64_t)1, (int64_t)2, (int64_t)3, (int64_t)4, (int64_t)8, (int64_t)cols}) {
                CAPTURE(n_act);
                std::vector<float> want(ld * cols, -1.0f), got(ld * cols, -1.0f);
                llm::matmul_rows(t, W.data(), wrow, k, 16, rows, A.data(), arow, n_act, want.data(), ld);
                llm::matmul_rows_interleaved(t, packed.data(), k, 16, rows, A.data(), arow, n_act, got.data(), ld);
                // the AVX2, AVX-VNNI and AVX-512 kernels: the same integer sums and float steps, bit for bit
                if (fast && first_fast.count(n_act)) CHECK(got == first_fast[n_act]);
                if (fast) first_fast.emplace(n_act, got);
                for (int64_t j = 0; j < cols; j++) {
                    for (int64_t i = 0; i < ld; i++) {
                        if (!fast) {
                            CHECK(got[j * ld + i] == want[j * ld + i]);  // the row kernels on restored rows
                            continue;
                        }
                        if (j >= n_act || i < 16 || i >= rows) {
                            CHECK(got[j * ld + i] == -1.0f);  // untouched
                            continue;
                        }
                        // the same integer block sums, summed over blocks in another order
                        double mag = 0;
                        for (int64_t e = 0; e < k; e++) mag += std::fabs(wf[i * k + e] * af[j * k + e]);
                        CHECK(std::fabs(got[j * ld + i] - want[j * ld + i]) <= 2e-5 * mag + 1e-6);
                    }
                }
            }
        }
    }
}

// The byte-product kernels' int16 runs at the extremes of their operands: Q8_0 weights -128 and 127
// (stored 0 and 255), IQ4_NL's -127 and 113, against activations -127, 127 and -1 (y & 15 = 15) as the
// quantizer writes them. With unit scales every product is an exact integer below 2^24, so each tier
// must give exactly sum(w * y): a saturated run anywhere would show.
TEST_CASE("quants: interleaved Q8_0 / IQ4_NL kernels are exact at extreme values on every tier") {
    IsaGuard guard;
    std::mt19937 rng(31);
    const int64_t k = 256, rows = 16, cols = 8, nb = k / 32;
    const uint16_t one = 0x3C00;  // 1.0 in f16
    auto pick = [&](std::initializer_list<int> v) { return v.begin()[rng() % v.size()]; };
    std::vector<uint8_t> A;  // q8_0 columns: d = 1, then 32 values per block
    std::vector<float> af;
    for (int64_t c = 0; c < cols; c++)
        for (int64_t b = 0; b < nb; b++) {
            A.push_back(one & 0xFF), A.push_back(one >> 8);
            for (int e = 0; e < 32; e++) {
                const int y = c % 4 == 0 ? -127 : c % 4 == 1 ? 127 : c % 4 == 2 ? -1 : c < 4 ? pick({-127, 127, -1}) : (int)(rng() % 255) - 127;
                A.push_back((uint8_t)(int8_t)y), af.push_back((float)y);
            }
        }
    const size_t arow = llm::row_bytes(Type::Q8_0, k);
    for (Type t : {Type::Q8_0, Type::IQ4_NL}) {
        CAPTURE(llm::type_info(t).name);
        const bool bytes = t == Type::Q8_0;
        std::vector<uint8_t> W;  // d = 1; Q8_0 bytes or IQ4_NL index nibbles (0: -127, 15: 113)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < nb; b++) {
                W.push_back(one & 0xFF), W.push_back(one >> 8);
                for (int e = 0; e < (bytes ? 32 : 16); e++) {
                    const int hi = bytes ? 127 : 0xFF, lo = bytes ? -128 : 0x00;
                    const int v = r % 4 == 0 ? hi : r % 4 == 1 ? lo : r % 4 == 2 ? (bytes ? (e % 2 ? hi : lo) : 0x0F) : (int)(rng() % 256);
                    W.push_back((uint8_t)v);
                }
            }
        const size_t wrow = llm::row_bytes(t, k);
        std::vector<float> wf(rows * k);
        for (int64_t r = 0; r < rows; r++) llm::dequantize_row(t, W.data() + r * wrow, wf.data() + r * k, k);
        std::vector<uint8_t> packed(W.size());
        llm::interleave_rows16(t, W.data(), packed.data(), k, rows);
        for (llm::Isa isa : supported_isas()) {
            CAPTURE(llm::isa_name(isa));
            llm::isa_set(isa);
            for (int64_t n_act : {(int64_t)1, (int64_t)2, (int64_t)3, (int64_t)4, (int64_t)cols}) {
                CAPTURE(n_act);
                std::vector<float> got(rows * cols, -1.0f);
                llm::matmul_rows_interleaved(t, packed.data(), k, 0, rows, A.data(), arow, n_act, got.data(), rows);
                for (int64_t j = 0; j < n_act; j++)
                    for (int64_t i = 0; i < rows; i++) {
                        double want = 0;
                        for (int64_t e = 0; e < k; e++) want += (double)wf[i * k + e] * af[j * k + e];
                        CHECK(got[j * rows + i] == want);
                    }
            }
        }
    }
}

// The K-quant kernels' integer steps at the extremes: rows with every quant and scale at its top (all
// bits set) or random, d = dmin = 1, against q8_K columns of -127 throughout (quantized from equal
// floats), of 127 but for each block's first value, of -127 and 127 in alternate 16-value runs, and
// random. The widest partial sums an int16
// step holds are reached here (AVX-VNNI's Q4_K: a 16-value half of a sub-block, 15 x -127 x 16): the
// SIMD tiers must agree bit for bit and match the row kernels to rounding.
TEST_CASE("quants: interleaved K-quant kernels agree at extreme values on every tier") {
    IsaGuard guard;
    std::mt19937 rng(37);
    const int64_t k = 512, rows = 32, cols = 8;
    std::vector<uint8_t> A;
    for (int64_t c = 0; c < cols; c++) {
        std::vector<float> a = random_floats(rng, k, 1.0f);
        if (c % 4 != 3)
            for (int64_t e = 0; e < k; e++) a[e] = c % 4 == 0 ? 1.0f : c % 4 == 1 ? (e % 256 ? -1.0f : 1.0f) : e / 16 % 2 ? -1.0f : 1.0f;
        const std::vector<uint8_t> q = quantized(Type::Q8_K, a);
        if (c % 4 < 2) CHECK((int8_t)q[5] == (c % 4 ? 127 : -127));  // qs follows the float d; ggml's q8_K stays within +-127
        A.insert(A.end(), q.begin(), q.end());
    }
    const size_t arow = llm::row_bytes(Type::Q8_K, k);
    std::vector<float> yf(cols * k);  // the columns as quantized: a block's float d, then its 256 int8 values
    for (int64_t j = 0; j < cols; j++)
        for (int64_t e = 0; e < k; e++) {
            const uint8_t* block = A.data() + j * arow + e / 256 * (arow / (k / 256));
            float d;
            memcpy(&d, block, 4);
            yf[j * k + e] = d * (int8_t)block[4 + e % 256];
        }
    for (Type t : {Type::Q2_K, Type::Q3_K, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
        CAPTURE(llm::type_info(t).name);
        REQUIRE(llm::vec_dot_type(t) == Type::Q8_K);
        const size_t wrow = llm::row_bytes(t, k);
        std::vector<uint8_t> W(wrow * rows);
        for (size_t i = 0; i < W.size(); i++) W[i] = i / wrow % 2 ? (uint8_t)rng() : 0xFF;
        set_k_scales(t, W, [] { return 1.0f; });
        std::vector<float> wf(rows * k);
        for (int64_t r = 0; r < rows; r++) llm::dequantize_row(t, W.data() + r * wrow, wf.data() + r * k, k);
        std::vector<uint8_t> packed(W.size());
        llm::interleave_rows16(t, W.data(), packed.data(), k, rows);
        std::vector<float> first_fast;
        for (llm::Isa isa : supported_isas()) {
            if (isa == llm::Isa::Scalar) continue;
            CAPTURE(llm::isa_name(isa));
            llm::isa_set(isa);
            std::vector<float> want(rows * cols), got(rows * cols);
            llm::matmul_rows(t, W.data(), wrow, k, 0, rows, A.data(), arow, cols, want.data(), rows);
            llm::matmul_rows_interleaved(t, packed.data(), k, 0, rows, A.data(), arow, cols, got.data(), rows);
            if (first_fast.empty()) first_fast = got;
            CHECK(got == first_fast);
            for (int64_t j = 0; j < cols; j++)
                for (int64_t i = 0; i < rows; i++) {
                    double mag = 0;  // the sum of the products' magnitudes: the scale of rounding
                    for (int64_t e = 0; e < k; e++) mag += std::fabs(wf[i * k + e] * yf[j * k + e]);
                    CHECK(std::fabs(got[j * rows + i] - want[j * rows + i]) <= 2e-6 * mag);
                }
        }
    }
}

namespace llm {  // the engine's attention score kernels (implementation section)
bool attention_scores(Type kt, const uint8_t* rows, size_t stride, int64_t n_rows, int64_t dim, const uint8_t* qc, size_t q_row,
                      int heads, float* out, int64_t out_stride, float* scratch);
}

TEST_CASE("quants: attention score kernels equal matmul_rows (f16) or the scalar tier (q8_0) on every tier, several heads at once") {
    IsaGuard guard;
    std::mt19937 rng(21);
    const int kv_heads = 3;  // a cache row holds 3 KV heads; the kernels read the middle one
    for (Type kt : {Type::F16, Type::Q8_0}) {
        for (int64_t dim : {64, 128}) {
            CAPTURE(llm::type_info(kt).name);
            CAPTURE(dim);
            const Type qt = llm::vec_dot_type(kt);
            const size_t head_bytes = llm::row_bytes(kt, dim), stride = kv_heads * head_bytes, q_row = llm::row_bytes(qt, dim);
            const int64_t n_rows = 203;  // several L1 blocks of rows, and a row tail after the multi-row tiles
            std::vector<uint8_t> cache;
            for (int64_t r = 0; r < n_rows * kv_heads; r++) {
                std::vector<uint8_t> q = quantized(kt, random_floats(rng, dim, 2.0f));
                cache.insert(cache.end(), q.begin(), q.end());
            }
            const int max_heads = 9;
            std::vector<uint8_t> queries;
            for (int h = 0; h < max_heads; h++) {
                std::vector<uint8_t> q = quantized(qt, random_floats(rng, dim, 1.0f));
                queries.insert(queries.end(), q.begin(), q.end());
            }
            const uint8_t* rows = cache.data() + head_bytes;
            llm::isa_set(llm::Isa::Scalar);
            std::vector<float> scalar(max_heads * n_rows);
            for (int h = 0; h < max_heads; h++)
                for (int64_t r = 0; r < n_rows; r++)
                    scalar[h * n_rows + r] = llm::vec_dot(kt, dim, rows + r * stride, queries.data() + h * q_row);
            for (llm::Isa isa : supported_isas()) {
                if (isa == llm::Isa::Scalar) continue;
                CAPTURE(llm::isa_name(isa));
                llm::isa_set(isa);
                for (int heads : {1, 2, 3, 4, 5, 8, 9}) {
                    CAPTURE(heads);
                    const int64_t ld = n_rows + 5;
                    std::vector<float> want(heads * ld, -1.0f), got(heads * ld, -1.0f), scratch(2 * (heads + 1) * dim);
                    llm::matmul_rows(kt, rows, stride, dim, 0, n_rows, queries.data(), q_row, heads, want.data(), ld);
                    REQUIRE(llm::attention_scores(kt, rows, stride, n_rows, dim, queries.data(), q_row, heads, got.data(), ld,
                                                  scratch.data()));
                    if (kt == Type::F16) {
                        CHECK(got == want);  // bit for bit, untouched entries included
                    } else {  // q8_0: one float step per block, as the scalar dot product (not ggml's AVX2 order)
                        for (int h = 0; h < heads; h++)
                            for (int64_t r = 0; r < n_rows; r++) want[h * ld + r] = scalar[h * n_rows + r];
                        CHECK(got == want);  // untouched entries included
                    }
                    for (int h = 0; h < heads; h++)
                        for (int64_t r = 0; r < n_rows; r++)
                            CHECK(std::fabs(got[h * ld + r] - scalar[h * n_rows + r]) <= 1e-4 * (1 + std::fabs(scalar[h * n_rows + r])));
                }
            }
        }
    }
}

namespace llm {  // attention's V sums (implementation section)
int64_t weighted_row_sums_scratch(int64_t dim);
void weighted_row_sums(Type t, const uint8_t* rows, size_t stride, const float* w, int64_t w_stride, int heads, int64_t n_rows,
                       int64_t dim, float* out, int64_t out_stride, float* scratch, bool accumulate);
}

// Each kernel sums a head's rows in row order, one rounding per row (the scalar path two: a multiply,
// then an add), so every output is within 2 n u sum |w v| of the exact sum (recursive summation).
TEST_CASE("quants: attention's V sums on every tier within the summation bound of the exact sums, several heads at once") {
    IsaGuard guard;
    std::mt19937 rng(31);
    const int kv_heads = 2;  // a cache row holds 2 KV heads; the kernels read the second one
    for (Type vt : {Type::F16, Type::F32, Type::Q8_0, Type::Q4_0, Type::IQ4_NL, Type::Q4_1}) {
        for (int64_t dim : {64, 128}) {
            CAPTURE(llm::type_info(vt).name);
            CAPTURE(dim);
            const size_t head_bytes = llm::row_bytes(vt, dim), stride = kv_heads * head_bytes;
            const int64_t n_rows = 181;  // several L1 blocks of rows for the 128-value rows
            std::vector<uint8_t> cache;
            for (int64_t r = 0; r < n_rows * kv_heads; r++) {
                std::vector<uint8_t> q = quantized(vt, random_floats(rng, dim, 2.0f));
                cache.insert(cache.end(), q.begin(), q.end());
            }
            const uint8_t* rows = cache.data() + head_bytes;
            std::vector<float> values(n_rows * dim);
            for (int64_t r = 0; r < n_rows; r++) llm::dequantize_row(vt, rows + r * stride, values.data() + r * dim, dim);
            const int max_heads = 9;
            const int64_t w_stride = n_rows + 3, out_stride = dim + 8;
            std::vector<float> w(max_heads * w_stride), start = random_floats(rng, max_heads * out_stride, 1.0f);
            for (float& x : w) x = std::uniform_real_distribution<float>(0.0f, 0.02f)(rng);  // probabilities
            for (llm::Isa isa : supported_isas()) {
                CAPTURE(llm::isa_name(isa));
                llm::isa_set(isa);
                for (int heads : {1, 3, 6, 7, 9}) {
                    for (bool accumulate : {false, true}) {
                        CAPTURE(heads);
                        CAPTURE(accumulate);
                        std::vector<float> got = start, scratch(llm::weighted_row_sums_scratch(dim));
                        llm::weighted_row_sums(vt, rows, stride, w.data(), w_stride, heads, n_rows, dim, got.data(), out_stride,
                                               scratch.data(), accumulate);
                        size_t bad = 0;
                        for (int h = 0; h < heads; h++)
                            for (int64_t d = 0; d < dim; d++) {
                                double want = accumulate ? start[h * out_stride + d] : 0.0, magnitude = std::fabs(want);
                                for (int64_t r = 0; r < n_rows; r++) {
                                    want += (double)w[h * w_stride + r] * values[r * dim + d];
                                    magnitude += std::fabs((double)w[h * w_stride + r] * values[r * dim + d]);
                                }
                                bad += !(std::fabs(got[h * out_stride + d] - want) <= 2.0 * (n_rows + 1) * 0x1p-24 * magnitude);
                            }
                        CHECK(bad == 0);
                        CHECK(std::equal(got.begin() + heads * out_stride, got.end(), start.begin() + heads * out_stride));  // untouched
                    }
                }
            }
        }
    }
}

namespace llm {  // the activations and the KV cache's rotation (implementation section)
float gelu(float x);
void gelu_times(float* x, const float* up, int64_t n);
float silu(float x);
void silu_times(float* x, const float* up, int64_t n);
void hadamard(float* data, int64_t count, int n);
void softmax_scaled(float* x, int64_t n, float scale, bool round_f16);
}

TEST_CASE("quants: GELU through the f16 table equals the scalar gelu bit for bit on every tier") {
    IsaGuard guard;
    // Every f16 value but the NaNs, the floats next to the clamps at -10 and 10 (some round to them in
    // f16), random ones between f16 values; an odd count, so the vector loops' tails run too.
    std::vector<uint16_t> halves(65536);
    for (uint32_t h = 0; h < 65536; h++) halves[h] = (uint16_t)h;
    std::vector<float> all_halves(65536), x;
    llm::dequantize_row(Type::F16, (const uint8_t*)halves.data(), all_halves.data(), 65536);
    for (float v : all_halves)
        if (!std::isnan(v)) x.push_back(v);
    for (float edge : {-10.0f, 10.0f}) {
        float below = edge, above = edge;
        for (int i = 0; i < 4; i++) x.push_back(below = std::nextafter(below, 0.0f)), x.push_back(above = std::nextafter(above, 2 * edge));
        x.push_back(edge - 0.004f), x.push_back(edge + 0.004f);
    }
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> wide(-12.0f, 12.0f);
    for (int i = 0; i < 10001; i++) x.push_back(wide(rng));
    std::vector<float> up(x.size());
    for (float& u : up) u = wide(rng);
    CHECK(llm::gelu(1.0f) == doctest::Approx(0.8412f).epsilon(1e-3));  // 0.5 (1 + tanh(0.7979 * 1.0447))
    CHECK(llm::gelu(-1.0f) == doctest::Approx(-0.1588f).epsilon(1e-3));
    CHECK(llm::gelu(-10.0f) == 0.0f);
    CHECK(llm::gelu(12.5f) == 12.5f);
    for (llm::Isa isa : supported_isas()) {
        CAPTURE(llm::isa_name(isa));
        llm::isa_set(isa);
        for (bool with_up : {false, true}) {
            CAPTURE(with_up);
            std::vector<float> got = x;
            llm::gelu_times(got.data(), with_up ? up.data() : nullptr, (int64_t)got.size());
            size_t bad = 0;
            for (size_t i = 0; i < x.size(); i++) {
                const float want = llm::gelu(x[i]) * (with_up ? up[i] : 1.0f);
                bad += memcmp(&got[i], &want, sizeof want) != 0;
            }
            CHECK(bad == 0);
        }
    }
}

TEST_CASE("quants: the Walsh-Hadamard transform's vector butterflies equal the scalar ones bit for bit on every tier") {
    IsaGuard guard;
    std::mt19937 rng(13);
    for (int n : {8, 16, 32, 64, 128, 256}) {
        CAPTURE(n);
        const std::vector<float> x = random_floats(rng, 3 * n, 4.0f);  // three blocks
        llm::isa_set(llm::Isa::Scalar);
        std::vector<float> want = x;
        llm::hadamard(want.data(), (int64_t)want.size(), n);
        CHECK(want[0] != x[0]);  // (transformed)
        std::vector<float> twice = want;
        llm::hadamard(twice.data(), (int64_t)twice.size(), n);  // its own inverse, to float rounding
        for (size_t i = 0; i < x.size(); i++) CHECK(twice[i] == doctest::Approx(x[i]).epsilon(1e-5).scale(4.0));
        for (llm::Isa isa : supported_isas()) {
            CAPTURE(llm::isa_name(isa));
            llm::isa_set(isa);
            std::vector<float> got = x;
            llm::hadamard(got.data(), (int64_t)got.size(), n);
            CHECK(memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("quants: attention's softmax on every tier within 1e-6 relative of the softmax in double, the vector tiers bit for bit alike") {
    IsaGuard guard;
    // Scores spread wide enough that some fall 87 below the maximum (where the vector exp gives 0);
    // lengths on both sides of the 16-value groups and the 256-value chunks; a negative scale (the
    // max of the unscaled scores would be the wrong one: the vector tiers hand it to the scalar path).
    std::mt19937 rng(17);
    for (int64_t n : {1, 7, 16, 100, 256, 257, 1000, 5003}) {
        for (float scale : {0.125f, 0.17f, -0.5f}) {
            for (bool round_f16 : {false, true}) {
                CAPTURE(n);
                CAPTURE(scale);
                CAPTURE(round_f16);
                const std::vector<float> x = random_floats(rng, n, 60.0f);
                double mx = -INFINITY, sum = 0;
                for (float v : x) mx = std::max(mx, (double)v * scale);
                for (float v : x) sum += std::exp((double)v * scale - mx);
                std::vector<float> vector_tier;
                for (llm::Isa isa : supported_isas()) {
                    CAPTURE(llm::isa_name(isa));
                    llm::isa_set(isa);
                    std::vector<float> got = x;
                    llm::softmax_scaled(got.data(), n, scale, round_f16);
                    size_t bad = 0;
                    double total = 0;
                    for (int64_t i = 0; i < n; i++) {
                        const double want = std::exp((double)x[i] * scale - mx) / sum;
                        // x * scale and its difference to the maximum round in float (an error of the
                        // exponent is a relative one of its exp); f16 rounds to 11 bits, and to a
                        // multiple of 2^-24 below its normals
                        const double argument = 0x1p-23 * (std::fabs((double)x[i] * scale) + std::fabs(mx));
                        const double rel = 1e-6 + argument + (round_f16 ? 0x1p-11 : 0), abs = round_f16 ? 0x1p-25 : 1e-37;
                        bad += !(std::fabs(got[i] - want) <= rel * want + abs);
                        total += got[i];
                    }
                    CHECK(bad == 0);
                    CHECK(total == doctest::Approx(1.0).epsilon(round_f16 ? 1e-3 : 1e-5));
                    if (isa == llm::Isa::Scalar) continue;
                    if (vector_tier.empty()) vector_tier = got;
                    CHECK(memcmp(got.data(), vector_tier.data(), n * sizeof(float)) == 0);
                }
            }
        }
    }
}

TEST_CASE("quants: SiLU times up on every tier within 1e-6 relative of x / (1 + e^-x) in double") {
    IsaGuard guard;
    // Random values over the range a gate takes, both signs' far tails (e^-x overflows a float below
    // -88.7; e^x of the vector path runs out below -87.3), zeros and the smallest normals; an odd
    // count, so the vector loops' tails run too.
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> wide(-20.0f, 20.0f), tail(-120.0f, 120.0f);
    std::vector<float> x;
    for (int i = 0; i < 10001; i++) x.push_back(i % 10 == 0 ? tail(rng) : wide(rng));
    for (float v : {0.0f, -0.0f, 1e-38f, -1e-38f, -87.0f, -88.0f, -89.0f, 87.0f, 89.0f, 1.0f, -1.0f}) x.push_back(v);
    std::vector<float> up(x.size());
    for (float& u : up) u = wide(rng);
    for (llm::Isa isa : supported_isas()) {
        CAPTURE(llm::isa_name(isa));
        llm::isa_set(isa);
        std::vector<float> got = x;
        llm::silu_times(got.data(), up.data(), (int64_t)got.size());
        size_t bad = 0;
        float first_bad = 0;
        for (size_t i = 0; i < x.size(); i++) {
            const double want = (double)x[i] / (1.0 + std::exp(-(double)x[i])) * up[i];
            // relative, with an absolute floor below which floats hold no silu (x e^x under e^-87)
            if (std::fabs(got[i] - want) > 1e-6 * std::fabs(want) + 1e-30 && bad++ == 0) first_bad = x[i];
        }
        CAPTURE(first_bad);
        CHECK(bad == 0);
    }
    CHECK(std::isnan(llm::silu(NAN)));
    CHECK(llm::silu(-1.0f) == doctest::Approx(-0.268941f).epsilon(1e-5));  // -1 / (1 + e)
}

TEST_CASE("quants: isa_set rejects what the CPU lacks") {
    IsaGuard guard;
    CHECK_NOTHROW(llm::isa_set(llm::Isa::Scalar));
    for (llm::Isa isa : {llm::Isa::AVX2, llm::Isa::AVXVNNI, llm::Isa::AVX512}) {
        CAPTURE(llm::isa_name(isa));
        if (llm::isa_supported(isa)) CHECK_NOTHROW(llm::isa_set(isa));
        else CHECK_THROWS_AS(llm::isa_set(isa), llm::Error);
    }
    CHECK_THROWS_AS(llm::isa_set((llm::Isa)7), llm::Error);
    CHECK(llm::isa_supported(llm::isa_best()));
    CHECK(!llm::isa_name(llm::isa_best()).empty());
    CHECK(llm::isa_name(llm::Isa::AVXVNNI) == "avxvnni");
}

// BF16 products are exact in f32 and every kernel sums k of them in f32, in some order: each result is
// within (k - 1) * 2^-24 * sum |w * a| of the exact sum (recursive summation's bound; no subnormals here).
TEST_CASE("quants: BF16 tiles (AVX512-BF16 and AMX) within the f32 summation bound of the exact products") {
    IsaGuard guard;
    bool amx_was = false;
    if (llm::amx_available()) llm::isa_set(llm::Isa::AVX512), amx_was = llm::amx_enabled();
    std::mt19937 rng(23);
    const int64_t k = 352, rows = 48, cols = 70, ld = rows + 3;  // 11 blocks of 32 values
    const size_t rb = llm::row_bytes(Type::BF16, k);
    const std::vector<uint8_t> W = random_rows(rng, Type::BF16, k, rows), A = random_activations(rng, Type::BF16, k, cols);
    std::vector<float> wf(rows * k), af(cols * k);
    llm::dequantize_row(Type::BF16, W.data(), wf.data(), rows * k);
    llm::dequantize_row(Type::BF16, A.data(), af.data(), cols * k);
    std::vector<uint8_t> packed(W.size()), back(W.size());
    llm::interleave_rows16(Type::BF16, W.data(), packed.data(), k, rows);
    llm::deinterleave_rows16(Type::BF16, packed.data(), back.data(), k, rows);
    CHECK(packed != W);
    CHECK(back == W);  // lossless
    std::vector<float> row17(k);
    llm::dequantize_interleaved_row(Type::BF16, packed.data(), k, 17, row17.data());
    CHECK(std::equal(row17.begin(), row17.end(), wf.begin() + 17 * k));
    CHECK_THROWS_AS(llm::interleave_rows16(Type::BF16, W.data(), packed.data(), k - 16, rows), llm::Error);  // k % 32
    std::vector<double> exact(cols * rows), bound(cols * rows);
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) {
            double sum = 0, mag = 0;
            for (int64_t e = 0; e < k; e++) sum += (double)wf[r * k + e] * af[c * k + e], mag += std::fabs((double)wf[r * k + e] * af[c * k + e]);
            exact[c * rows + r] = sum, bound[c * rows + r] = (k - 1) * std::ldexp(1.0, -24) * mag;
        }
    for (llm::Isa isa : supported_isas()) {
        for (bool amx : {false, true}) {
            if (amx && (isa != llm::Isa::AVX512 || !llm::amx_available())) continue;
            llm::isa_set(isa);
            if (llm::amx_available()) llm::amx_set(amx);
            const std::string tier = llm::isa_name(isa);
            CAPTURE(tier);
            const bool fast = llm::interleave_supported(Type::BF16, k, rows);
            if (isa != llm::Isa::AVX512) CHECK(!fast);  // the layout only where vdpbf16ps is
            MESSAGE("BF16 interleaved tiles on " << tier << ": " << std::string(fast ? "yes" : "no (the row kernels)"));
            for (int64_t n_act : {1, 3, 8, 13, 15, 16, 17, 31, 32, 33, 48, 64, 70}) {
                CAPTURE(n_act);
                std::vector<float> got(ld * cols, -1.0f);
                llm::matmul_rows_interleaved(Type::BF16, packed.data(), k, 16, rows, A.data(), rb, n_act, got.data(), ld);
                size_t outside = 0, touched = 0;
                double worst = 0;  // the largest error, as a share of its bound
                for (int64_t j = 0; j < cols; j++)
                    for (int64_t i = 0; i < ld; i++) {
                        const float v = got[j * ld + i];
                        if (j >= n_act || i < 16 || i >= rows) {
                            touched += v != -1.0f;
                            continue;
                        }
                        const double err = std::fabs(v - exact[j * rows + i]);
                        outside += err > bound[j * rows + i];
                        worst = std::max(worst, err / bound[j * rows + i]);
                    }
                CHECK(touched == 0);
                CHECK(outside == 0);
                if (n_act == cols) MESSAGE(tier << ", " << n_act << " columns: largest error " << worst << " of the bound");
            }
        }
    }
    if (llm::amx_available()) llm::amx_set(amx_was);
}

TEST_CASE("quants: AMX tiles equal the AVX-512 VNNI tiles bit for bit") {
    if (!llm::amx_available()) {
        MESSAGE("AMX not available on this CPU/OS: skipped");
        CHECK_THROWS_AS(llm::amx_set(true), llm::Error);
        return;
    }
    IsaGuard guard;
    const bool amx_was = llm::amx_enabled();
    llm::isa_set(llm::Isa::AVX512);
    std::mt19937 rng(21);
    const int64_t rows = 32, cols = 53, ld = rows + 5;  // 53 = 32 + 16 AMX columns and a 5-column vector tail
    // the types with AMX tiles (the 16-value K-quants stay on the VNNI tiles, which are faster)
    for (Type t : {Type::Q4_K, Type::Q5_K, Type::Q4_0, Type::Q4_1, Type::Q5_0, Type::Q5_1, Type::Q8_0, Type::IQ4_NL}) {
        CAPTURE(llm::type_info(t).name);
        const bool kquant = llm::type_info(t).block_size == 256;
        const int64_t k = kquant ? 512 : 352;  // 352: 11 blocks, a partial group of the kernel's 8
        const Type at = llm::vec_dot_type(t);
        const size_t wrow = llm::row_bytes(t, k), arow = llm::row_bytes(at, k);
        const std::vector<uint8_t> W = random_rows(rng, t, k, rows), A = random_activations(rng, at, k, cols);
        std::vector<uint8_t> packed(W.size());
        llm::interleave_rows16(t, W.data(), packed.data(), k, rows);
        for (int64_t n_act : {(int64_t)15, (int64_t)16, (int64_t)32, cols}) {
            CAPTURE(n_act);
            std::vector<float> vnni(ld * cols, -1.0f), amx(ld * cols, -1.0f), rows_ref(ld * cols, -1.0f);
            llm::amx_set(false);
            CHECK(llm::isa_name(llm::Isa::AVX512) == "avx512-vnni");
            llm::matmul_rows_interleaved(t, packed.data(), k, 0, rows, A.data(), arow, n_act, vnni.data(), ld);
            llm::amx_set(true);
            CHECK(llm::isa_name(llm::Isa::AVX512) == "avx512-vnni+amx");
            llm::matmul_rows_interleaved(t, packed.data(), k, 0, rows, A.data(), arow, n_act, amx.data(), ld);
            llm::matmul_rows(t, W.data(), wrow, k, 0, rows, A.data(), arow, n_act, rows_ref.data(), ld);
            CHECK(amx == vnni);  // the same integer block sums and float steps
            size_t far = 0;  // and both near the row kernels (another block summation order)
            for (size_t i = 0; i < amx.size(); i++) far += std::fabs(amx[i] - rows_ref[i]) > 1e-3f * (1 + std::fabs(rows_ref[i]));
            CHECK(far == 0);
            CHECK(amx[(n_act - 1) * ld + rows] == -1.0f);   // untouched: past the rows
            if (n_act < cols) CHECK(amx[n_act * ld] == -1.0f);  // and past the columns
        }
    }
    llm::amx_set(amx_was);
}
