// The CUDA kernels (cuda/*.cuh) on the SIMT emulator (tests/simt.hpp), against the CPU engine: the
// emulator's own semantics first (barriers, warp collectives, orders), then every kernel on random
// inputs for every weight type.
#include <doctest/doctest.h>

#include "simt.hpp"
#include "../cuda/matvec.cuh"
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
    simt::launch(dim3(rows / 8), dim3(kMatvecThreads), matvec_f32, (const uint8_t*)W.data(), size_t(k) * 4, x.data(), y.data(), k, rows);
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

struct WeightKernels {
    llm::Type type;
    MatvecKernel dequant;
    MatvecDp4aKernel dp4a;  // nullptr: no integer path for this type
};
const WeightKernels kWeightKernels[] = {
    {llm::Type::F32, matvec_f32, nullptr},        {llm::Type::F16, matvec_f16, nullptr},
    {llm::Type::BF16, matvec_bf16, nullptr},      {llm::Type::Q4_0, matvec_q4_0, matvec_q8_1_q4_0},
    {llm::Type::Q4_1, matvec_q4_1, matvec_q8_1_q4_1}, {llm::Type::Q5_0, matvec_q5_0, matvec_q8_1_q5_0},
    {llm::Type::Q5_1, matvec_q5_1, matvec_q8_1_q5_1}, {llm::Type::Q8_0, matvec_q8_0, matvec_q8_1_q8_0},
    {llm::Type::IQ4_NL, matvec_iq4_nl, matvec_q8_1_iq4_nl}, {llm::Type::Q2_K, matvec_q2_K, nullptr},
    {llm::Type::Q3_K, matvec_q3_K, nullptr},      {llm::Type::Q4_K, matvec_q4_K, nullptr},
    {llm::Type::Q5_K, matvec_q5_K, nullptr},      {llm::Type::Q6_K, matvec_q6_K, nullptr},
};

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

// |got - want| within `rel` of the sum of the magnitudes of the products (the scale of the rounding).
void check_dot(float got, double want, double magnitude, double rel) {
    CHECK(std::fabs(got - want) <= rel * magnitude + 1e-30);
}

} // namespace

TEST_CASE("cuda kernels: matvec of every weight type with f32 activations vs the CPU's dequantization") {
    const int k = 512, rows = 40;  // rows not a multiple of 8: the last block has idle warps
    const std::vector<float> x = random_floats(k, 11);
    for (const WeightKernels& wk : kWeightKernels) {
        CAPTURE(std::string(llm::type_info(wk.type).name));
        const std::vector<uint8_t> W = random_weights(wk.type, rows, k, 12);
        std::vector<float> y(rows, NAN);
        simt::launch(dim3((rows + 7) / 8), dim3(kMatvecThreads), wk.dequant, W.data(), llm::row_bytes(wk.type, k), x.data(), y.data(), k, rows);
        for (int r = 0; r < rows; r++) {
            const std::vector<float> w = cpu_row(wk.type, W, k, r);
            double want = 0, magnitude = 0;
            for (int i = 0; i < k; i++) want += double(w[i]) * x[i], magnitude += std::fabs(double(w[i]) * x[i]);
            check_dot(y[r], want, magnitude, 1e-5);
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
        simt::launch(dim3(rows / 8), dim3(kMatvecThreads), wk.dp4a, W.data(), row_bytes, act.data(), y.data(), k, rows);
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
