// The CUDA kernels (cuda/*.cuh) on the SIMT emulator (tests/simt.hpp), against the CPU engine: the
// emulator's own semantics first (barriers, warp collectives, orders), then every kernel on random
// inputs for every weight type.
#include <doctest/doctest.h>

#include "simt.hpp"
#include "../cuda/matvec.cuh"
#include "../cuda/matmul.cuh"
#include "../cuda/mma.cuh"
#include "../cuda/ops.cuh"
#include "../cuda/attention.cuh"
#include "../cuda/moe.cuh"
#include "../llm.hpp"

#include <chrono>
#include <cmath>
#include <random>
#include <vector>

namespace {

const simt::Order kOrders[] = {simt::Order::Forward, simt::Order::Reverse, simt::Order::Shuffle};

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

// Each block spreads its first 128 values out (out[i] = in[i / 2]) through shared memory;
// `with_barrier` false leaves out the __syncthreads between the writes and the reads.
void spread_kernel(const float* in, float* out, bool with_barrier) {
    __shared__ float tile[256];
    const int i = threadIdx.x, base = blockIdx.x * 256;
    tile[i] = in[base + i];
    if (with_barrier) __syncthreads();
    out[base + i] = tile[i / 2];
}

// Every collective's result written per lane: shfl from lane 3, xor 5, down 7, up 2 (width 16), ballot
// of odd lanes, any/all over the lower half (lanes 16..31 use their own half's mask).
void collectives_kernel(int* out) {
    const int lane = threadIdx.x % 32;
    int* o = out + threadIdx.x * 7;
    o[0] = __shfl_sync(kFullMask, lane * 10, 3);
    o[1] = __shfl_xor_sync(kFullMask, lane * 10, 5);
    o[2] = __shfl_down_sync(kFullMask, lane * 10, 7);
    o[3] = __shfl_up_sync(kFullMask, lane * 10, 2, 16);
    o[4] = int(__ballot_sync(kFullMask, lane % 2));
    const unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    o[5] = __any_sync(half, lane == 20);
    o[6] = __all_sync(half, lane < 16);
}

void missing_lane_kernel(int* out) {
    if (threadIdx.x == 5) return;  // lane 5 exits; the others wait for it in the full mask
    out[threadIdx.x] = __shfl_sync(kFullMask, 1, 0);
}

} // namespace

TEST_CASE("simt: a missing __syncthreads changes results under some thread order") {
    const int n_blocks = 4;
    for (bool with_barrier : {true, false}) {
        const std::vector<float> in = random_floats(256 * n_blocks, with_barrier);  // not what the tiles hold from before
        int wrong_orders = 0;
        for (simt::Order order : kOrders) {
            std::vector<float> out(in.size(), 0.0f);
            simt::launch_ordered(order, 7, dim3(n_blocks), dim3(256), spread_kernel, in.data(), out.data(), with_barrier);
            bool right = true;
            for (int b = 0; b < n_blocks; b++)
                for (int i = 0; i < 256; i++) right &= out[b * 256 + i] == in[b * 256 + i / 2];
            wrong_orders += !right;
        }
        CHECK(wrong_orders == (with_barrier ? 0 : 2));  // thread order alone makes it work forward
    }
}

TEST_CASE("simt: warp collectives return what CUDA defines") {
    for (simt::Order order : kOrders) {
        std::vector<int> out(64 * 7, -1);
        simt::launch_ordered(order, 3, dim3(1), dim3(64), collectives_kernel, out.data());
        for (int t = 0; t < 64; t++) {
            const int lane = t % 32;
            const int* o = &out[t * 7];
            CHECK(o[0] == 30);
            CHECK(o[1] == (lane ^ 5) * 10);
            CHECK(o[2] == (lane + 7 < 32 ? lane + 7 : lane) * 10);
            CHECK(o[3] == (lane % 16 >= 2 ? lane - 2 : lane) * 10);
            CHECK(unsigned(o[4]) == 0xaaaaaaaau);
            CHECK(o[5] == (lane >= 16 ? 1 : 0));
            CHECK(o[6] == (lane < 16 ? 1 : 0));
        }
    }
}

TEST_CASE("simt: a collective waiting for an exited lane is reported, not hung") {
    std::vector<int> out(32, 0);
    CHECK_THROWS_AS(simt::launch(dim3(1), dim3(32), missing_lane_kernel, out.data()), simt::Error);
}

TEST_CASE("simt: __dp4a and __half conversions") {
    CHECK(__dp4a(int(0x7f80ff01u), int(0x0102fe03u), 5) == 5 + 1 * 3 + (-1) * (-2) + (-128) * 2 + 127 * 1);
    std::mt19937 rng(5);
    for (int i = 0; i < 20000; i++) {
        const uint16_t bits = uint16_t(rng());
        if ((bits & 0x7c00) == 0x7c00) continue;  // inf / nan
        const float f = __half2float(__ushort_as_half(bits));
        CHECK(__half_as_ushort(__float2half(f)) == bits);
        const float g = f * (1.0f + 1.0f / 4096);  // between two halves: rounds to the nearer
        CHECK(std::fabs(__half2float(__float2half(g)) - g) <= std::fabs(f - g) + 1e-30f);
    }
    CHECK(__half_as_ushort(__float2half(65520.0f)) == 0x7c00);  // rounds to infinity
    CHECK(__half_as_ushort(__float2half(1.0f + 1.0f / 2048)) == 0x3c00);  // a tie to even
}

TEST_CASE("simt: 4096x4096 f32 matvec, 256-thread blocks (timing)") {
    const int k = 4096, rows = 4096;
    const std::vector<float> W = random_floats(size_t(k) * rows, 2), x = random_floats(k, 3);
    std::vector<float> y(rows);
    const auto t0 = std::chrono::steady_clock::now();
    simt::launch(dim3(rows / kMatvecRowsPerBlock), dim3(kMatvecThreads), matvec_f32, (const uint8_t*)W.data(), size_t(k) * 4, x.data(), y.data(), k, rows);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("4096x4096 f32 matvec on the emulator: " << seconds << " s with " << simt::worker_count() << " workers");
    for (int r = 0; r < rows; r += 511) {
        double ref = 0;
        for (int i = 0; i < k; i++) ref += double(W[size_t(r) * k + i]) * x[i];
        CHECK(y[r] == doctest::Approx(ref).epsilon(1e-4));
    }
}

namespace {

using MatvecKernel = void (*)(const uint8_t*, size_t, const float*, float*, int, int);
using MatvecDp4aKernel = void (*)(const uint8_t*, size_t, const BlockQ8_1*, float*, int, int);
using MatvecQ8KKernel = void (*)(const uint8_t*, size_t, const BlockQ8_K*, float*, int, int);
using MatmulQ8_1Kernel = void (*)(const uint8_t*, size_t, const BlockQ8_1*, float*, int, int, int);
using MatmulQ8KKernel = void (*)(const uint8_t*, size_t, const BlockQ8_K*, float*, int, int, int);
using MatmulKernel = void (*)(const uint8_t*, size_t, const float*, float*, int, int, int);
using GetRowsKernel = void (*)(const uint8_t*, size_t, const int*, float*, int, float);

// Each weight type's kernels: f32 activations for the float types, q8_1 (dp4a) or q8_K ones for the
// quantized types (nullptr where a type has no such kernel).
struct WeightKernels {
    llm::Type type;
    MatvecKernel matvec;
    MatmulKernel matmul;
    MatvecDp4aKernel dp4a;
    MatmulQ8_1Kernel matmul_q8_1;
    MatvecQ8KKernel q8_K;
    MatmulQ8KKernel matmul_q8_K;
    GetRowsKernel get_rows;
};
#define KERNELS_OF(name) matvec_##name, matmul_##name, nullptr, nullptr, nullptr, nullptr, get_rows_##name
#define KERNELS_OF_DP4A(name) nullptr, nullptr, matvec_q8_1_##name, matmul_q8_1_##name, nullptr, nullptr, get_rows_##name
#define KERNELS_OF_Q8_K(name) nullptr, nullptr, nullptr, nullptr, matvec_q8_K_##name, matmul_q8_K_##name, get_rows_##name
const WeightKernels kWeightKernels[] = {
    {llm::Type::F32, KERNELS_OF(f32)},   {llm::Type::F16, KERNELS_OF(f16)},   {llm::Type::BF16, KERNELS_OF(bf16)},
    {llm::Type::Q4_0, KERNELS_OF_DP4A(q4_0)}, {llm::Type::Q4_1, KERNELS_OF_DP4A(q4_1)}, {llm::Type::Q5_0, KERNELS_OF_DP4A(q5_0)},
    {llm::Type::Q5_1, KERNELS_OF_DP4A(q5_1)}, {llm::Type::Q8_0, KERNELS_OF_DP4A(q8_0)}, {llm::Type::IQ4_NL, KERNELS_OF_DP4A(iq4_nl)},
    {llm::Type::Q2_K, KERNELS_OF_Q8_K(q2_K)}, {llm::Type::Q3_K, KERNELS_OF_Q8_K(q3_K)}, {llm::Type::Q4_K, KERNELS_OF_Q8_K(q4_K)},
    {llm::Type::Q5_K, KERNELS_OF_Q8_K(q5_K)}, {llm::Type::Q6_K, KERNELS_OF_Q8_K(q6_K)},
};
#undef KERNELS_OF_Q8_K
#undef KERNELS_OF
#undef KERNELS_OF_DP4A

// A random rows x k weight matrix in type t, as a model file stores it.
std::vector<uint8_t> random_weights(llm::Type t, int rows, int k, uint64_t seed) {
    const std::vector<float> w = random_floats(size_t(rows) * k, seed, 0.05f);
    const size_t row_bytes = llm::row_bytes(t, k);
    std::vector<uint8_t> out(row_bytes * rows);
    for (int r = 0; r < rows; r++) llm::quantize_row_weights(t, &w[size_t(r) * k], &out[r * row_bytes], k);
    return out;
}

// Row r of W dequantized by the CPU engine.
std::vector<float> cpu_row(llm::Type t, const std::vector<uint8_t>& W, int k, int r) {
    std::vector<float> row(k);
    llm::dequantize_row(t, &W[r * llm::row_bytes(t, k)], row.data(), k);
    return row;
}

// Activations as the CPU's dot product takes them against a float type t: rounded to t.
std::vector<float> as_activations(llm::Type t, const std::vector<float>& x) {
    std::vector<uint8_t> bytes(llm::row_bytes(t, int64_t(x.size())));
    std::vector<float> out(x.size());
    llm::quantize_row(t, x.data(), bytes.data(), int64_t(x.size()));
    llm::dequantize_row(t, bytes.data(), out.data(), int64_t(out.size()));
    return out;
}

// |got - want| within `rel` of the sum of the magnitudes of the products (the scale of the rounding).
void check_dot(float got, double want, double magnitude, double rel) {
    CHECK(std::fabs(got - want) <= rel * magnitude + 1e-30);
}

} // namespace

TEST_CASE("cuda kernels: matvec (3 tokens) of the float types with f32 activations vs the CPU's values") {
    const int k = 512, rows = 40, n_tokens = 3;  // the last block has idle warps
    const std::vector<float> x = random_floats(size_t(n_tokens) * k, 11);
    for (const WeightKernels& wk : kWeightKernels) {
        if (!wk.matvec) continue;
        CAPTURE(std::string(llm::type_info(wk.type).name));
        const std::vector<uint8_t> W = random_weights(wk.type, rows, k, 12);
        std::vector<float> y(size_t(n_tokens) * rows, NAN);
        simt::launch(dim3((rows + kMatvecRowsPerBlock - 1) / kMatvecRowsPerBlock, n_tokens), dim3(kMatvecThreads), wk.matvec, W.data(),
                     llm::row_bytes(wk.type, k), x.data(), y.data(), k, rows);
        const std::vector<float> xa = as_activations(wk.type, x);
        for (int t = 0; t < n_tokens; t++)
            for (int r = 0; r < rows; r++) {
                const std::vector<float> w = cpu_row(wk.type, W, k, r);
                double want = 0, magnitude = 0;
                for (int i = 0; i < k; i++) want += double(w[i]) * xa[t * k + i], magnitude += std::fabs(double(w[i]) * xa[t * k + i]);
                check_dot(y[t * rows + r], want, magnitude, 1e-5);
            }
    }
}

TEST_CASE("cuda kernels: q8_1 activations bit-exact with the CPU's, dp4a matvec vs the CPU's vec_dot") {
    const int k = 1024, rows = 24;
    std::vector<float> x = random_floats(k, 21);
    for (int i = 64; i < 96; i++) x[i] = 0.0f;  // an all-zero block
    std::vector<BlockQ8_1> act(k / 32);
    simt::launch(dim3(k / 32 / 8), dim3(256), quantize_q8_1, x.data(), act.data(), k);
    std::vector<uint8_t> cpu_act(llm::row_bytes(llm::Type::Q8_1, k));
    llm::quantize_row(llm::Type::Q8_1, x.data(), cpu_act.data(), k);
    CHECK(std::memcmp(act.data(), cpu_act.data(), cpu_act.size()) == 0);
    // The same quants as q8_0 blocks (d, qs) for the types whose CPU dot product takes q8_0.
    std::vector<uint8_t> cpu_act_q8_0(llm::row_bytes(llm::Type::Q8_0, k));
    for (int b = 0; b < k / 32; b++) {
        std::memcpy(&cpu_act_q8_0[b * 34], &act[b].d, 2);
        std::memcpy(&cpu_act_q8_0[b * 34 + 2], act[b].qs, 32);
    }
    for (const WeightKernels& wk : kWeightKernels) {
        if (!wk.dp4a) continue;
        CAPTURE(std::string(llm::type_info(wk.type).name));
        const std::vector<uint8_t> W = random_weights(wk.type, rows, k, 22);
        const size_t row_bytes = llm::row_bytes(wk.type, k);
        std::vector<float> y(rows, NAN);
        simt::launch(dim3((rows + kMatvecRowsPerBlock - 1) / kMatvecRowsPerBlock), dim3(kMatvecThreads), wk.dp4a, W.data(), row_bytes, act.data(), y.data(), k, rows);
        const bool takes_q8_1 = llm::vec_dot_type(wk.type) == llm::Type::Q8_1;
        for (int r = 0; r < rows; r++) {
            const float want = llm::vec_dot(wk.type, k, &W[r * row_bytes], takes_q8_1 ? cpu_act.data() : cpu_act_q8_0.data());
            const std::vector<float> w = cpu_row(wk.type, W, k, r);
            double magnitude = 0;
            for (int i = 0; i < k; i++) magnitude += std::fabs(double(w[i]) * x[i]);
            check_dot(y[r], want, magnitude, 1e-5);
        }
    }
}

TEST_CASE("cuda kernels: q8_K activations bit-exact with the CPU's, K-quant dp4a matvec (2 tokens) vs the CPU's vec_dot") {
    const int k = 1024, rows = 24, n_tokens = 2;
    std::vector<float> x = random_floats(size_t(n_tokens) * k, 23);
    for (int i = 256; i < 512; i++) x[i] = 0.0f;  // an all-zero block
    for (int i = 512; i < 768; i++) x[i] = i % 3 ? 0.5f : -0.5f;  // ties for the largest magnitude
    x[1024 + 7] = 100.0f;  // one dominant value: the others round towards zero
    std::vector<BlockQ8_K> act(size_t(n_tokens) * k / 256);
    simt::launch(dim3(1), dim3(256), quantize_q8_K, (const float*)x.data(), act.data(), n_tokens * k);
    std::vector<uint8_t> cpu_act(llm::row_bytes(llm::Type::Q8_K, n_tokens * k));
    llm::quantize_row(llm::Type::Q8_K, x.data(), cpu_act.data(), n_tokens * k);
    REQUIRE(cpu_act.size() == act.size() * sizeof(BlockQ8_K));
    CHECK(std::memcmp(act.data(), cpu_act.data(), cpu_act.size()) == 0);
    const size_t act_row = llm::row_bytes(llm::Type::Q8_K, k);
    for (const WeightKernels& wk : kWeightKernels) {
        if (!wk.q8_K) continue;
        CAPTURE(std::string(llm::type_info(wk.type).name));
        const std::vector<uint8_t> W = random_weights(wk.type, rows, k, 24);
        const size_t row_bytes = llm::row_bytes(wk.type, k);
        std::vector<float> y(size_t(n_tokens) * rows, NAN);
        simt::launch(dim3((rows + kMatvecRowsPerBlock - 1) / kMatvecRowsPerBlock, n_tokens), dim3(kMatvecThreads), wk.q8_K, W.data(), row_bytes,
                     (const BlockQ8_K*)act.data(), y.data(), k, rows);
        for (int t = 0; t < n_tokens; t++)
            for (int r = 0; r < rows; r++) {
                const float want = llm::vec_dot(wk.type, k, &W[r * row_bytes], &cpu_act[t * act_row]);
                const std::vector<float> w = cpu_row(wk.type, W, k, r);
                double magnitude = 0;
                for (int i = 0; i < k; i++) magnitude += std::fabs(double(w[i]) * x[size_t(t) * k + i]);
                check_dot(y[size_t(t) * rows + r], want, magnitude, 1e-5);
            }
    }
}

TEST_CASE("cuda kernels: tiled matmul (prefill) of the float types vs the CPU's values, every thread order") {
    const int k = 256, rows = 40, n_tokens = 37;  // partial tiles in both directions
    const std::vector<float> X = random_floats(size_t(n_tokens) * k, 31);
    for (const WeightKernels& wk : kWeightKernels) {
        if (!wk.matmul) continue;
        CAPTURE(std::string(llm::type_info(wk.type).name));
        const std::vector<uint8_t> W = random_weights(wk.type, rows, k, 32);
        std::vector<std::vector<float>> w_rows;
        for (int r = 0; r < rows; r++) w_rows.push_back(cpu_row(wk.type, W, k, r));
        const std::vector<float> Xa = as_activations(wk.type, X);
        for (simt::Order order : kOrders) {
            std::vector<float> Y(size_t(n_tokens) * rows, NAN);
            simt::launch_ordered(order, 9, dim3((rows + kTile - 1) / kTile, (n_tokens + kTile - 1) / kTile), dim3(kMatmulThreads), wk.matmul,
                                 W.data(), llm::row_bytes(wk.type, k), X.data(), Y.data(), k, rows, n_tokens);
            for (int t = 0; t < n_tokens; t++)
                for (int r = 0; r < rows; r++) {
                    double want = 0, magnitude = 0;
                    for (int i = 0; i < k; i++) {
                        const double p = double(w_rows[r][i]) * Xa[size_t(t) * k + i];
                        want += p, magnitude += std::fabs(p);
                    }
                    check_dot(Y[size_t(t) * rows + r], want, magnitude, 1e-5);
                }
        }
    }
}

namespace {
// The device's activation blocks as the CPU's vec_dot for `weight` takes them: q8_K as they are, q8_1
// as they are for the types with a min, else as q8_0 blocks (d, qs).
std::vector<uint8_t> cpu_activations(llm::Type weight, const std::vector<BlockQ8_1>& q8_1, const std::vector<BlockQ8_K>& q8_K) {
    const llm::Type t = llm::vec_dot_type(weight);
    if (t == llm::Type::Q8_K) return std::vector<uint8_t>((const uint8_t*)q8_K.data(), (const uint8_t*)(q8_K.data() + q8_K.size()));
    if (t == llm::Type::Q8_1) return std::vector<uint8_t>((const uint8_t*)q8_1.data(), (const uint8_t*)(q8_1.data() + q8_1.size()));
    std::vector<uint8_t> out(q8_1.size() * 34);
    for (size_t b = 0; b < q8_1.size(); b++) std::memcpy(&out[b * 34], &q8_1[b].d, 2), std::memcpy(&out[b * 34 + 2], q8_1[b].qs, 32);
    return out;
}
} // namespace

// Prefill of the quantized types: the activations quantized by the device (q8_1 for the 32-value
// types, q8_K for the K-quants), the tiles against the CPU's vec_dot on the same activation blocks.
TEST_CASE("cuda kernels: integer tiled matmul (prefill) of every quantized type vs the CPU's vec_dot, every thread order") {
    const int k = 512, rows = 40, n_tokens = 37;  // partial tiles in both directions
    const std::vector<float> X = random_floats(size_t(n_tokens) * k, 33);
    std::vector<BlockQ8_1> act_q8_1(size_t(n_tokens) * k / 32);
    std::vector<BlockQ8_K> act_q8_K(size_t(n_tokens) * k / 256);
    simt::launch(dim3(unsigned(act_q8_1.size() + 7) / 8), dim3(256), quantize_q8_1, X.data(), act_q8_1.data(), n_tokens * k);
    simt::launch(dim3(unsigned(act_q8_K.size() + 7) / 8), dim3(256), quantize_q8_K, X.data(), act_q8_K.data(), n_tokens * k);
    for (const WeightKernels& wk : kWeightKernels) {
        if (!wk.matmul_q8_1 && !wk.matmul_q8_K) continue;
        CAPTURE(std::string(llm::type_info(wk.type).name));
        const std::vector<uint8_t> W = random_weights(wk.type, rows, k, 34);
        const size_t row_bytes = llm::row_bytes(wk.type, k);
        const size_t act_row = llm::row_bytes(llm::vec_dot_type(wk.type), k);
        const std::vector<uint8_t> cpu_act = cpu_activations(wk.type, act_q8_1, act_q8_K);
        for (simt::Order order : kOrders) {
            std::vector<float> Y(size_t(n_tokens) * rows, NAN);
            const dim3 grid((rows + kTile - 1) / kTile, (n_tokens + kTile - 1) / kTile);
            if (wk.q8_K) simt::launch_ordered(order, 9, grid, dim3(kMatmulThreads), wk.matmul_q8_K, W.data(), row_bytes, (const BlockQ8_K*)act_q8_K.data(), Y.data(), k, rows, n_tokens);
            else simt::launch_ordered(order, 9, grid, dim3(kMatmulThreads), wk.matmul_q8_1, W.data(), row_bytes, (const BlockQ8_1*)act_q8_1.data(), Y.data(), k, rows, n_tokens);
            for (int t = 0; t < n_tokens; t++)
                for (int r = 0; r < rows; r++) {
                    const std::vector<float> w = cpu_row(wk.type, W, k, r);
                    double magnitude = 0;
                    for (int i = 0; i < k; i++) magnitude += std::fabs(double(w[i]) * X[size_t(t) * k + i]);
                    check_dot(Y[size_t(t) * rows + r], llm::vec_dot(wk.type, k, &W[r * row_bytes], &cpu_act[t * act_row]), magnitude, 1e-5);
                }
        }
    }
}

TEST_CASE("cuda kernels: embedding lookup of every type equals the CPU's dequantized rows, scaled") {
    const int dim = 512, n_rows = 6;
    const int ids[] = {5, 0, 3, 3};
    for (const WeightKernels& wk : kWeightKernels) {
        CAPTURE(std::string(llm::type_info(wk.type).name));
        const std::vector<uint8_t> table = random_weights(wk.type, n_rows, dim, 41);
        std::vector<float> out(4 * dim, NAN);
        simt::launch(dim3(4), dim3(kRowThreads), wk.get_rows, table.data(), llm::row_bytes(wk.type, dim), ids, out.data(), dim, 2.5f);
        for (int i = 0; i < 4; i++) {
            const std::vector<float> want = cpu_row(wk.type, table, dim, ids[i]);
            for (int j = 0; j < dim; j++) CHECK(out[i * dim + j] == want[j] * 2.5f);
        }
    }
}

TEST_CASE("cuda kernels: RMSNorm (strided rows, in place) vs the CPU's formula") {
    const int dim = 300, stride = 320, n = 5;
    std::vector<float> x = random_floats(size_t(n) * stride, 51, 3.0f);
    const std::vector<float> w = random_floats(dim, 52), original = x;
    for (simt::Order order : kOrders) {
        x = original;
        simt::launch_ordered(order, 4, dim3(n), dim3(kRowThreads), rms_norm, x.data(), w.data(), x.data(), dim, stride, 1e-6f);
        for (int i = 0; i < n; i++) {
            const float* r = &original[size_t(i) * stride];
            double sum = 0;
            for (int j = 0; j < dim; j++) sum += double(r[j]) * r[j];
            const float scale = 1.0f / std::sqrt(float(sum / dim) + 1e-6f);
            for (int j = 0; j < dim; j++) CHECK(x[size_t(i) * stride + j] == doctest::Approx(r[j] * scale * w[j]).epsilon(1e-5));
            for (int j = dim; j < stride; j++) CHECK(x[size_t(i) * stride + j] == r[j]);  // between rows: untouched
        }
    }
}

namespace {
// The CPU's RoPE for one token and head: the engine's rope_angles for p's parameters, then the pairs
// (adjacent, or NeoX's halves) rotated as llm.hpp section 15 rotates them.
void rope_reference(float* r, int pos, const RopeParams& p, bool neox) {
    llm::HParams hp;
    hp.n_rot = p.n_rot, hp.rope_freq_scale = p.freq_scale, hp.rope_attn_factor = p.attn_factor, hp.n_ctx_orig = p.n_ctx_orig;
    hp.yarn_ext_factor = p.ext_factor, hp.yarn_beta_fast = p.beta_fast, hp.yarn_beta_slow = p.beta_slow;
    std::vector<float> cs(p.n_rot);
    llm::rope_angles(hp, p.freq_factors, pos, p.base, cs.data());
    for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
        const int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + p.n_rot / 2 : i0 + 1;
        const float x0 = r[a], x1 = r[b];
        r[a] = x0 * cs[i0] - x1 * cs[i0 + 1];
        r[b] = x0 * cs[i0 + 1] + x1 * cs[i0];
    }
}
} // namespace

TEST_CASE("cuda kernels: RoPE normal / NeoX, partial rotation, frequency factors and YaRN vs the CPU's") {
    const int n_tokens = 5, n_heads = 3, head_dim = 64, n_rot = 32, offset = 16;
    const int pos[n_tokens] = {0, 1, 7, 300, 4095};
    std::vector<float> factors(n_rot / 2);
    for (int i = 0; i < n_rot / 2; i++) factors[i] = 1.0f + 0.25f * i;
    const RopeParams plain{n_rot, 10000.f, 1.0f, 1.0f, 0.0f, 32.f, 1.f, 0, nullptr};
    const RopeParams yarn{n_rot, 1000000.f, 0.25f, 1.0f, 1.0f, 32.f, 1.f, 4096, nullptr};
    const RopeParams with_factors{n_rot, 500000.f, 1.0f, 1.0f, 0.0f, 32.f, 1.f, 0, factors.data()};
    for (const RopeParams& p : {plain, yarn, with_factors}) {
        for (int neox : {0, 1}) {
            std::vector<float> x = random_floats(size_t(n_tokens) * n_heads * head_dim, 61), want = x;
            std::vector<float> cs(size_t(n_tokens) * n_rot);
            simt::launch(dim3(1), dim3(32), rope_cache, pos, cs.data(), n_tokens, p);
            simt::launch(dim3(n_tokens), dim3(64), rope, x.data(), (const float*)cs.data(), n_heads, head_dim, offset, n_rot, neox);
            for (int t = 0; t < n_tokens; t++)
                for (int h = 0; h < n_heads; h++) rope_reference(&want[(size_t(t) * n_heads + h) * head_dim + offset], pos[t], p, neox);
            for (size_t i = 0; i < x.size(); i++) CHECK(x[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(1.0));
        }
    }
}

TEST_CASE("cuda kernels: SiLU / GELU gating, residual add with a period, scale, softmax") {
    const long long n = 3000;
    const std::vector<float> gate = random_floats(n, 71, 4.0f), up = random_floats(n, 72);
    std::vector<float> silu_out = gate, gelu_out = gate;
    simt::launch(dim3(4), dim3(256), silu_mul, silu_out.data(), up.data(), n);
    simt::launch(dim3(4), dim3(256), gelu_mul, gelu_out.data(), up.data(), n);
    auto f16 = [](float v) { return __half2float(__float2half(v)); };
    for (long long i = 0; i < n; i++) {
        const float g = gate[i];
        CHECK(silu_out[i] == doctest::Approx(g / (1.0f + std::exp(-g)) * up[i]).epsilon(1e-6));
        const float gh = f16(g);
        const float gelu = g <= -10.0f ? 0.0f : g >= 10.0f ? g : f16(0.5f * gh * (1.0f + std::tanh(0.79788456080286535588f * gh * (1.0f + 0.044715f * gh * gh))));
        CHECK(gelu_out[i] == doctest::Approx(gelu * up[i]).epsilon(1e-6));
    }
    std::vector<float> x = gate;
    const std::vector<float> bias = random_floats(100, 73);
    simt::launch(dim3(3), dim3(128), add, x.data(), bias.data(), n, 100LL);
    for (long long i = 0; i < n; i++) CHECK(x[i] == gate[i] + bias[i % 100]);
    simt::launch(dim3(2), dim3(64), scale, x.data(), 0.5f, n);
    for (long long i = 0; i < n; i++) CHECK(x[i] == (gate[i] + bias[i % 100]) * 0.5f);
    const int rows = 3, cols = 1000;
    std::vector<float> s = random_floats(rows * cols, 74, 5.0f), before = s;
    simt::launch(dim3(rows), dim3(kRowThreads), softmax, s.data(), cols, 0.7f);
    for (int r = 0; r < rows; r++) {
        double m = -1e30, sum = 0;
        for (int j = 0; j < cols; j++) m = std::max(m, 0.7 * before[r * cols + j]);
        for (int j = 0; j < cols; j++) sum += std::exp(0.7 * before[r * cols + j] - m);
        for (int j = 0; j < cols; j++) CHECK(s[r * cols + j] == doctest::Approx(std::exp(0.7 * before[r * cols + j] - m) / sum).epsilon(1e-5));
    }
}

namespace {

using StoreRowsKernel = void (*)(const float*, uint8_t*, const int*, int, size_t);
using AttnKernel = void (*)(const float*, const uint8_t*, const uint8_t*, const int*, const int*, const int*, float*, AttnParams);
struct KvKernels {
    llm::Type type;
    StoreRowsKernel store;
};
const KvKernels kKvKernels[] = {
    {llm::Type::F16, store_rows_f16}, {llm::Type::Q8_0, store_rows_q8_0}, {llm::Type::Q4_0, store_rows_q4_0}, {llm::Type::IQ4_NL, store_rows_iq4_nl}};
struct AttnPair {
    llm::Type k, v;
    AttnKernel kernel;
};
#define ATTN_PAIR(kname, KT, vname, VT) {llm::type_from_name(#kname), llm::type_from_name(#vname), flash_attn_##kname##_##vname},
const AttnPair kAttnPairs[] = {LLM_FOR_EACH_KV_PAIR(ATTN_PAIR)};
#undef ATTN_PAIR

// The CPU's cache rows of type t for n rows of `row` values (quantize_row, as store_kv writes them).
std::vector<uint8_t> cpu_cache_rows(llm::Type t, const std::vector<float>& values, int row) {
    const size_t bytes = llm::row_bytes(t, row), n = values.size() / row;
    std::vector<uint8_t> out(bytes * n);
    for (size_t r = 0; r < n; r++) llm::quantize_row(t, &values[r * row], &out[r * bytes], row);
    return out;
}

} // namespace

TEST_CASE("cuda kernels: KV cache rows of every cache type are bit-identical with the CPU's, in their cells") {
    const int row = 128, n_tokens = 5, n_cells = 9;
    const int cells[n_tokens] = {7, 0, 3, 8, 4};
    std::vector<float> rows = random_floats(size_t(n_tokens) * row, 91, 2.0f);
    for (int i = 32; i < 64; i++) rows[i] = 0.0f;  // an all-zero block
    for (int i = 64; i < 96; i++) rows[i] = i % 2 ? 0.5f : -0.5f;  // ties for the signed maximum
    for (const KvKernels& kk : kKvKernels) {
        CAPTURE(std::string(llm::type_info(kk.type).name));
        const size_t row_bytes = llm::row_bytes(kk.type, row);
        std::vector<uint8_t> cache(n_cells * row_bytes, 0xAB);
        simt::launch(dim3(n_tokens), dim3(32), kk.store, rows.data(), cache.data(), cells, row, row_bytes);
        const std::vector<uint8_t> want = cpu_cache_rows(kk.type, rows, row);
        for (int t = 0; t < n_tokens; t++) CHECK(std::memcmp(&cache[cells[t] * row_bytes], &want[t * row_bytes], row_bytes) == 0);
        for (int c : {1, 2, 5, 6}) CHECK(cache[c * row_bytes] == 0xAB);  // cells nobody wrote
    }
}

TEST_CASE("cuda kernels: Walsh-Hadamard rotation is the CPU's butterflies (bit-exact) and orthonormal") {
    for (int n : {64, 128, 256}) {
        CAPTURE(n);
        const std::vector<float> x = random_floats(size_t(3) * n, 92);
        std::vector<float> y = x, want = x;
        for (simt::Order order : kOrders) {
            y = x;
            simt::launch_ordered(order, 5, dim3(3), dim3(128), hadamard, y.data(), n);
            want = x;  // llm.hpp's hadamard(), written out
            for (int b = 0; b < 3; b++) {
                float* v = &want[size_t(b) * n];
                for (int len = 1; len < n; len *= 2)
                    for (int i = 0; i < n; i += 2 * len)
                        for (int j = i; j < i + len; j++) {
                            const float u = v[j], w = v[j + len];
                            v[j] = u + w, v[j + len] = u - w;
                        }
                for (int i = 0; i < n; i++) v[i] *= 1.0f / std::sqrt(float(n));
            }
            CHECK(std::memcmp(y.data(), want.data(), y.size() * 4) == 0);
        }
        simt::launch(dim3(3), dim3(64), hadamard, y.data(), n);  // its own inverse
        for (size_t i = 0; i < x.size(); i++) CHECK(y[i] == doctest::Approx(x[i]).epsilon(1e-5).scale(1.0));
    }
}

TEST_CASE("cuda kernels: fused attention over every K x V cache type pair (GQA, causal, sliding window, online or exact softmax) vs softmax then sum") {
    const int n_head = 8, n_head_kv = 2, head_dim = 64, n_cells = 48, page = 16;
    const int pos[] = {0, 13, 38, 39};
    const int seq[] = {0, 0, 0, 0};
    const int page_cells[] = {32, 0, 16};  // the sequence's pages out of order in the pool
    auto cell_of = [&](int c) { return page_cells[c / page] + c % page; };
    const int n_tokens = 4, kv_row = n_head_kv * head_dim;
    const std::vector<float> q = random_floats(size_t(n_tokens) * n_head * head_dim, 81);
    const std::vector<float> kf = random_floats(size_t(n_cells) * kv_row, 82), vf = random_floats(kf.size(), 83);
    for (const AttnPair& pair : kAttnPairs) {
        CAPTURE(std::string(llm::type_info(pair.k).name));
        CAPTURE(std::string(llm::type_info(pair.v).name));
        const std::vector<uint8_t> k_cache = cpu_cache_rows(pair.k, kf, kv_row), v_cache = cpu_cache_rows(pair.v, vf, kv_row);
        // What the attention reads: the CPU's dequantized rows, and the query as the K type's dot product takes it.
        std::vector<float> k_rows(kf.size()), v_rows(vf.size()), q_seen(q.size());
        const size_t k_bytes = llm::row_bytes(pair.k, kv_row), v_bytes = llm::row_bytes(pair.v, kv_row);
        for (int c = 0; c < n_cells; c++) {
            llm::dequantize_row(pair.k, &k_cache[c * k_bytes], &k_rows[size_t(c) * kv_row], kv_row);
            llm::dequantize_row(pair.v, &v_cache[c * v_bytes], &v_rows[size_t(c) * kv_row], kv_row);
        }
        const llm::Type qt = llm::vec_dot_type(pair.k);
        std::vector<uint8_t> q_bytes(llm::row_bytes(qt, head_dim));
        for (size_t h = 0; h < q.size() / head_dim; h++) {
            llm::quantize_row(qt, &q[h * head_dim], q_bytes.data(), head_dim);
            llm::dequantize_row(qt, q_bytes.data(), &q_seen[h * head_dim], head_dim);
        }
        for (auto [n_swa, exact] : {std::make_pair(0, 0), std::make_pair(10, 0), std::make_pair(10, 1)}) {
            CAPTURE(n_swa);
            CAPTURE(exact);
            const AttnParams p{n_tokens, n_head, n_head_kv, head_dim, head_dim, int(k_bytes), int(v_bytes), 0.125f, n_swa, 3, page, exact};
            std::vector<float> out(size_t(n_tokens) * n_head * head_dim, NAN);
            simt::launch(dim3((n_tokens * n_head + kAttnThreads / 32 - 1) / (kAttnThreads / 32)), dim3(kAttnThreads), pair.kernel, q.data(),
                         k_cache.data(), v_cache.data(), pos, seq, page_cells, out.data(), p);
            for (int t = 0; t < n_tokens; t++)
                for (int h = 0; h < n_head; h++) {
                    const int hk = h / (n_head / n_head_kv), lo = n_swa ? std::max(0, pos[t] - n_swa + 1) : 0;
                    std::vector<double> score;
                    double m = -1e30, sum = 0;
                    for (int c = lo; c <= pos[t]; c++) {
                        double d = 0;
                        for (int i = 0; i < head_dim; i++)
                            d += double(q_seen[(size_t(t) * n_head + h) * head_dim + i]) * k_rows[size_t(cell_of(c)) * kv_row + hk * head_dim + i];
                        score.push_back(d * 0.125);
                        m = std::max(m, d * 0.125);
                    }
                    for (double& sc : score) sum += (sc = std::exp(sc - m));
                    // -fa off against an f16 V: the probabilities rounded to f16 (a rounding step apart at most)
                    const bool rounded = exact && pair.v == llm::Type::F16;
                    for (int i = 0; i < head_dim; i++) {
                        double want = 0;
                        for (int c = lo; c <= pos[t]; c++) {
                            const double prob = rounded ? __half2float(__float2half(float(score[c - lo] / sum))) : score[c - lo] / sum;
                            want += prob * v_rows[size_t(cell_of(c)) * kv_row + hk * head_dim + i];
                        }
                        CHECK(out[(size_t(t) * n_head + h) * head_dim + i] == doctest::Approx(want).epsilon(rounded ? 2e-3 : 1e-5).scale(1.0));
                    }
                }
        }
    }
}

TEST_CASE("cuda kernels: MoE routing (softmax / sigmoid, selection bias, groups, normalization, scale) equals the CPU's moe_route") {
    const int n_tokens = 37, n_expert = 16;
    std::vector<float> logits = random_floats(size_t(n_tokens) * n_expert, 101, 2.0f);
    for (int e = 0; e < n_expert; e++) logits[5 * n_expert + e] = 0.25f;  // all tied: the lowest indices win
    const std::vector<float> bias = random_floats(n_expert, 102, 0.1f);
    struct Routing {
        llm::ExpertGating gating;
        int n_used, n_groups, n_group_used;
        bool normalize, with_bias;
        float scale;
    };
    const Routing routings[] = {{llm::ExpertGating::Softmax, 3, 0, 0, false, false, 1.0f},  // deepseek2-lite
                                {llm::ExpertGating::Softmax, 4, 0, 0, true, false, 1.0f},   // qwen3moe
                                {llm::ExpertGating::Sigmoid, 4, 4, 2, true, true, 2.5f}};   // deepseek-v3
    for (const Routing& r : routings) {
        CAPTURE(r.n_used);
        llm::HParams hp;
        hp.n_expert = n_expert, hp.n_expert_used = r.n_used, hp.n_expert_groups = r.n_groups, hp.n_group_used = r.n_group_used;
        hp.expert_gating = r.gating, hp.expert_weights_norm = r.normalize, hp.expert_weights_scale = r.scale;
        const MoeParams p{n_expert, r.n_used, r.n_groups, r.n_group_used, int(r.gating == llm::ExpertGating::Sigmoid), int(r.normalize), r.scale};
        std::vector<int> experts(size_t(n_tokens) * r.n_used, -1);
        std::vector<float> weights(experts.size(), NAN);
        simt::launch(dim3(2), dim3(32), moe_route, (const float*)logits.data(), r.with_bias ? bias.data() : (const float*)nullptr, experts.data(),
                     weights.data(), n_tokens, p);
        for (int t = 0; t < n_tokens; t++) {
            std::vector<int32_t> want_e(r.n_used);
            std::vector<float> want_w(r.n_used);
            llm::moe_route(hp, &logits[size_t(t) * n_expert], r.with_bias ? bias.data() : nullptr, want_e.data(), want_w.data());
            std::vector<std::pair<int, float>> want;  // the kernel lists them by ascending expert
            for (int j = 0; j < r.n_used; j++) want.emplace_back(want_e[j], want_w[j]);
            std::sort(want.begin(), want.end());
            for (int j = 0; j < r.n_used; j++) {
                CHECK(experts[t * r.n_used + j] == want[j].first);
                CHECK(weights[t * r.n_used + j] == want[j].second);
            }
        }
    }
}

TEST_CASE("cuda kernels: MoE grouping, expert-grouped products (matvec / dp4a / tiles / tensor cores) and the weighted sum vs per-token experts") {
    const int n_expert = 6, n_used = 2, k = 256, rows = 40;
    for (int n_tokens : {1, 5, 45}) {  // decode, a few slots (the matvec paths), prefill (tiles: one expert gets 45 > 32 rows)
        CAPTURE(n_tokens);
        std::vector<int> experts;
        std::vector<float> weights;
        for (int t = 0; t < n_tokens; t++) {  // every token: expert 0 (45 rows: two tiles) and one of the others (some idle)
            experts.push_back(0), experts.push_back(1 + t % (n_expert - 1));
            weights.push_back(0.25f + 0.01f * t), weights.push_back(0.75f - 0.01f * t);
        }
        std::vector<int> first(n_expert + 1, -1), row_token(n_tokens * n_used, -1), slot(n_tokens * n_used, -1);
        simt::launch(dim3(1), dim3(64), moe_group, (const int*)experts.data(), n_tokens, n_used, n_expert, first.data(), row_token.data(), slot.data());
        // Expert e's rows hold its tokens in ascending order; every (token, expert) pair has one row.
        CHECK(first[0] == 0);
        CHECK(first[n_expert] == n_tokens * n_used);
        for (int e = 0; e < n_expert; e++) {
            std::vector<int> tokens;
            for (int i = 0; i < n_tokens * n_used; i++)
                if (experts[i] == e) tokens.push_back(i / n_used);
            REQUIRE(first[e + 1] - first[e] == int(tokens.size()));
            for (size_t u = 0; u < tokens.size(); u++) CHECK(row_token[first[e] + u] == tokens[u]);
        }
        for (int i = 0; i < n_tokens * n_used; i++) CHECK(row_token[slot[i]] == i / n_used);
        const std::vector<float> x = random_floats(size_t(n_tokens) * k, 111);
        std::vector<float> gathered(size_t(n_tokens) * n_used * k);
        simt::launch(dim3(n_tokens * n_used), dim3(64), gather_rows, x.data(), (const int*)row_token.data(), gathered.data(), k);
        // The gathered rows as the products take them: f32, or quantized on the device.
        std::vector<BlockQ8_1> act_q8_1(gathered.size() / 32);
        std::vector<BlockQ8_K> act_q8_K(gathered.size() / 256);
        simt::launch(dim3(unsigned(act_q8_1.size() + 7) / 8), dim3(256), quantize_q8_1, (const float*)gathered.data(), act_q8_1.data(), int(gathered.size()));
        simt::launch(dim3(unsigned(act_q8_K.size() + 7) / 8), dim3(256), quantize_q8_K, (const float*)gathered.data(), act_q8_K.data(), int(gathered.size()));
        for (llm::Type type : {llm::Type::F16, llm::Type::Q8_0, llm::Type::Q4_K}) {
            CAPTURE(std::string(llm::type_info(type).name));
            const std::vector<uint8_t> W = random_weights(type, rows * n_expert, k, 112);
            const size_t row_bytes = llm::row_bytes(type, k), expert_bytes = row_bytes * rows;
            const dim3 per_row((rows + kMatvecRowsPerBlock - 1) / kMatvecRowsPerBlock, n_tokens, n_expert), tiles((rows + kTile - 1) / kTile, (n_tokens + kTile - 1) / kTile, n_expert);
            const bool matvec = n_tokens <= 8;
            // prefill of the quantized types: the dp4a tiles, then the tensor-core ones
            for (const bool mma : {false, true}) {
                if (mma && (matvec || type == llm::Type::F16)) continue;
                CAPTURE(mma);
                const dim3 mma_tiles((rows + kMmaRows - 1) / kMmaRows, (n_tokens + kMmaTokens - 1) / kMmaTokens, n_expert);
                const dim3 grid = matvec ? per_row : mma ? mma_tiles : tiles, block(matvec ? kMatvecThreads : mma ? kMmaThreads : kMatmulThreads);
                std::vector<float> y(size_t(n_tokens) * n_used * rows, NAN);
                const int* f = first.data();
                if (mma && type == llm::Type::Q8_0)
                    simt::launch(grid, block, matmul_mma_q8_1_id_q8_0, W.data(), expert_bytes, row_bytes, (const BlockQ8_1*)act_q8_1.data(), y.data(), k, rows, f);
                else if (mma)
                    simt::launch(grid, block, matmul_mma_q8_K_id_q4_K, W.data(), expert_bytes, row_bytes, (const BlockQ8_K*)act_q8_K.data(), y.data(), k, rows, f);
                else if (type == llm::Type::F16)
                    simt::launch(grid, block, matvec ? matvec_id_f16 : matmul_id_f16, W.data(), expert_bytes, row_bytes, (const float*)gathered.data(), y.data(), k, rows, f);
                else if (type == llm::Type::Q8_0)
                    simt::launch(grid, block, matvec ? matvec_q8_1_id_q8_0 : matmul_q8_1_id_q8_0, W.data(), expert_bytes, row_bytes, (const BlockQ8_1*)act_q8_1.data(), y.data(), k,
                                 rows, f);
                else
                    simt::launch(grid, block, matvec ? matvec_q8_K_id_q4_K : matmul_q8_K_id_q4_K, W.data(), expert_bytes, row_bytes, (const BlockQ8_K*)act_q8_K.data(), y.data(), k,
                                 rows, f);
                std::vector<float> out(size_t(n_tokens) * rows, NAN);
                simt::launch(dim3(n_tokens), dim3(32), moe_combine, (const float*)y.data(), (const int*)slot.data(), (const float*)weights.data(), out.data(), rows,
                             n_used);
                const std::vector<uint8_t> cpu_act = cpu_activations(type, act_q8_1, act_q8_K);
                const std::vector<float> xa = as_activations(llm::Type::F16, x);  // what the f16 products see
                const size_t act_row = llm::row_bytes(llm::vec_dot_type(type), k);
                for (int t = 0; t < n_tokens; t++)
                    for (int r = 0; r < rows; r++) {
                        double want = 0, magnitude = 0;
                        for (int j = 0; j < n_used; j++) {
                            const int e = experts[t * n_used + j], row = e * rows + r;
                            const std::vector<float> w = cpu_row(type, W, k, row);
                            // f16: the exact product; quantized: the CPU's vec_dot on the gathered row's activation blocks
                            double dot = 0;
                            for (int i = 0; i < k; i++) {
                                dot += double(w[i]) * xa[size_t(t) * k + i];
                                magnitude += std::fabs(weights[t * n_used + j] * double(w[i]) * x[size_t(t) * k + i]);
                            }
                            if (type != llm::Type::F16) dot = llm::vec_dot(type, k, &W[row * row_bytes], &cpu_act[slot[t * n_used + j] * act_row]);
                            want += weights[t * n_used + j] * dot;
                        }
                        check_dot(out[size_t(t) * rows + r], want, magnitude, 1e-5);
                    }
            }
        }
    }
}

namespace {

// One warp's mma_s8<K> (cuda/mma.cuh, on the emulator's lane-by-lane mma.sync): A (16 x K, row-major),
// B (K x 8, stored as 8 columns of K) and C (16 x 8) handed out to the lanes as PTX's fragment figures
// show them, D collected back the same way.
template <int K> void mma_kernel(const int8_t* A, const int8_t* B, const int* C, int* D) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    int a[K / 8], b[K / 16], c[4];
    for (int r = 0; r < K / 8; r++) std::memcpy(&a[r], &A[(g + 8 * (r % 2)) * K + 4 * t + 16 * (r / 2)], 4);
    for (int r = 0; r < K / 16; r++) std::memcpy(&b[r], &B[g * K + 4 * t + 16 * r], 4);
    for (int i = 0; i < 4; i++) c[i] = C[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    mma_s8<K>(c, a, b);
    for (int i = 0; i < 4; i++) D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = c[i];
}

template <int K> void check_mma_shape() {
    CAPTURE(K);
    std::mt19937 rng(K);
    std::vector<int8_t> A(16 * K), B(8 * K);
    std::vector<int> C(16 * 8), D(16 * 8, 0);
    for (int8_t& v : A) v = int8_t(rng());
    for (int8_t& v : B) v = int8_t(rng());
    for (int& v : C) v = int(rng() % 100000) - 50000;
    A[0] = B[0] = -128;  // the extremes of s8
    simt::launch(dim3(1), dim3(32), mma_kernel<K>, (const int8_t*)A.data(), (const int8_t*)B.data(), (const int*)C.data(), D.data());
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            int want = C[i * 8 + j];
            for (int k = 0; k < K; k++) want += A[i * K + k] * B[j * K + k];
            CHECK(D[i * 8 + j] == want);
        }
}

// Lane 6 alone holds A's byte 1 of register `reg` (all other A bytes zero), B all ones: D's row of that
// A element is all ones, and this lane's D elements say which row that is (the figures' examples).
template <int K> void single_a_byte_kernel(int reg, int* rows_hit) {
    int a[K / 8] = {}, b[K / 16], c[4] = {0, 0, 0, 0};
    for (int& v : b) v = 0x01010101;
    if (threadIdx.x == 6) a[reg] = 1 << 8;
    mma_s8<K>(c, a, b);
    // lane l's c[i] is D[l / 4 + 8 (i / 2)][2 (l % 4) + i % 2]: a hit in c[0] / c[1] is row l / 4, in c[2] / c[3] row l / 4 + 8
    for (int i = 0; i < 4; i++)
        if (c[i] == 1) atomicAdd(&rows_hit[threadIdx.x / 4 + 8 * (i / 2)], 1);
}

} // namespace

TEST_CASE("simt: int8 mma.sync m16n8k32 / m16n8k16 in PTX's fragment layout equals C + A B") {
    check_mma_shape<32>();
    check_mma_shape<16>();
    // PTX ISA figures 84 / 88: lane 6 (groupID 1, threadID_in_group 2) holds A[1][8..11] in a0..a3 and
    // A[9][8..11] in a4..a7; for m16n8k32 also A[1][24..27] in a8..a11 and A[9][24..27] in a12..a15.
    const int row_of_reg32[4] = {1, 9, 1, 9};
    for (int reg = 0; reg < 4; reg++) {
        CAPTURE(reg);
        std::vector<int> rows_hit(16, 0);
        simt::launch(dim3(1), dim3(32), single_a_byte_kernel<32>, reg, rows_hit.data());
        for (int r = 0; r < 16; r++) CHECK(rows_hit[r] == (r == row_of_reg32[reg] ? 8 : 0));  // the whole row: 8 columns
    }
    std::vector<int> rows_hit(16, 0);
    simt::launch(dim3(1), dim3(32), single_a_byte_kernel<16>, 1, rows_hit.data());
    for (int r = 0; r < 16; r++) CHECK(rows_hit[r] == (r == 9 ? 8 : 0));
    // mma.sync needs the whole warp
    CHECK_THROWS_AS(simt::launch(dim3(1), dim3(16), single_a_byte_kernel<32>, 0, rows_hit.data()), simt::Error);
}

namespace {
using MmaQ8_1Kernel = void (*)(const uint8_t*, size_t, const BlockQ8_1*, float*, int, int, int);
using MmaQ8KKernel = void (*)(const uint8_t*, size_t, const BlockQ8_K*, float*, int, int, int);
struct MmaKernel {
    llm::Type type;
    MmaQ8_1Kernel q8_1;
    MmaQ8KKernel q8_K;
};
#define MMA_Q8_1(name, T) {llm::type_from_name(#name), matmul_mma_q8_1_##name, nullptr},
#define MMA_Q8_K(name, T) {llm::type_from_name(#name), nullptr, matmul_mma_q8_K_##name},
const MmaKernel kMmaKernels[] = {LLM_FOR_EACH_DP4A_TYPE(MMA_Q8_1) LLM_FOR_EACH_Q8_K_TYPE(MMA_Q8_K)};
#undef MMA_Q8_1
#undef MMA_Q8_K
} // namespace

// The tensor-core tiles (64 x 64, partial in both directions; k = 288: a round of 8 blocks then one
// of 1 for the 32-value types) against the CPU's vec_dot on the device's activation blocks.
TEST_CASE("cuda kernels: tensor-core (mma) matmul of every quantized type vs the CPU's vec_dot, several token counts") {
    const int rows = 70;
    CHECK(std::size(kMmaKernels) == 11);
    for (const MmaKernel& mk : kMmaKernels) {
        CAPTURE(std::string(llm::type_info(mk.type).name));
        const int k = mk.q8_K ? 512 : 288;
        const std::vector<uint8_t> W = random_weights(mk.type, rows, k, 35);
        const size_t row_bytes = llm::row_bytes(mk.type, k), act_row = llm::row_bytes(llm::vec_dot_type(mk.type), k);
        std::vector<std::vector<float>> w_rows;
        for (int r = 0; r < rows; r++) w_rows.push_back(cpu_row(mk.type, W, k, r));
        for (int n_tokens : {16, 37, 70}) {
            CAPTURE(n_tokens);
            const std::vector<float> X = random_floats(size_t(n_tokens) * k, 36 + n_tokens);
            std::vector<BlockQ8_1> act_q8_1(size_t(n_tokens) * k / 32);
            std::vector<BlockQ8_K> act_q8_K(size_t(n_tokens) * k / 256);
            if (mk.q8_K) simt::launch(dim3(unsigned(act_q8_K.size() + 7) / 8), dim3(256), quantize_q8_K, X.data(), act_q8_K.data(), n_tokens * k);
            else simt::launch(dim3(unsigned(act_q8_1.size() + 7) / 8), dim3(256), quantize_q8_1, X.data(), act_q8_1.data(), n_tokens * k);
            const std::vector<uint8_t> cpu_act = cpu_activations(mk.type, act_q8_1, act_q8_K);
            const dim3 grid((rows + kMmaRows - 1) / kMmaRows, (n_tokens + kMmaTokens - 1) / kMmaTokens);
            for (simt::Order order : kOrders) {
                if (n_tokens != 37 && order != simt::Order::Shuffle) continue;  // every order once
                std::vector<float> Y(size_t(n_tokens) * rows, NAN);
                if (mk.q8_K) simt::launch_ordered(order, 11, grid, dim3(kMmaThreads), mk.q8_K, W.data(), row_bytes, (const BlockQ8_K*)act_q8_K.data(), Y.data(), k, rows, n_tokens);
                else simt::launch_ordered(order, 11, grid, dim3(kMmaThreads), mk.q8_1, W.data(), row_bytes, (const BlockQ8_1*)act_q8_1.data(), Y.data(), k, rows, n_tokens);
                for (int t = 0; t < n_tokens; t++)
                    for (int r = 0; r < rows; r++) {
                        double magnitude = 0;
                        for (int i = 0; i < k; i++) magnitude += std::fabs(double(w_rows[r][i]) * X[size_t(t) * k + i]);
                        check_dot(Y[size_t(t) * rows + r], llm::vec_dot(mk.type, k, &W[r * row_bytes], &cpu_act[t * act_row]), magnitude, 1e-5);
                    }
            }
        }
    }
}
