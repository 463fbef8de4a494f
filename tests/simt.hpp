// simt.hpp - a small SIMT emulator: CUDA kernel source (cuda/*.cuh) compiled by g++ and run on the CPU.
//
// Each CUDA thread is a fiber with its own stack (a hand-rolled x86-64 context switch); a block's fibers
// run on one OS thread, cooperatively, and switch only where CUDA lets threads wait for each other:
//   __syncthreads()                      a block barrier (threads that have exited no longer count)
//   __shfl*_sync, __ballot_sync,         warp collectives that wait only for the lanes in their mask
//   __any_sync, __all_sync, __syncwarp
//   simt::mma_s8<K>                      the tensor cores' int8 mma.sync (m16n8k32 / m16n8k16), lane by
//                                        lane in PTX's fragment layout (cuda/mma.cuh calls it)
// Everything else runs a thread alone until its next collective, so a kernel that reads shared memory
// another thread wrote without a barrier sees stale data under some order: launches take an Order
// (forward, reverse, or a seeded shuffle of the block's threads), and tests run kernels in all of them.
//
// Blocks are spread over OS threads (simt::set_workers; default: hardware threads). `__shared__` is
// `static thread_local`: every fiber of a block shares it, blocks on other workers have their own, and
// (as on a GPU) it is not cleared between blocks. Atomics are real atomics, since blocks run in parallel.
//
// Launch: simt::launch(grid, block, kernel, args...) stands for kernel<<<grid, block>>>(args...).
// A deadlock (a barrier or collective some thread never reaches) aborts the launch with a message.
#pragma once
#if !defined(__x86_64__)
#error "simt.hpp: the fiber switch is written for x86-64"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <sys/mman.h>

// ---- CUDA vector types and the kernel qualifiers -------------------------------------------------------
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 { float x, y; };
struct int4 { int x, y, z, w; };

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __constant__ static const

namespace simt {

constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 1024;
constexpr size_t kStackBytes = 64 * 1024;

// Thrown by launch when the kernel deadlocks or misuses a collective.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

enum class Order { Forward, Reverse, Shuffle };

// ---- fibers ----------------------------------------------------------------------------------------------
// simt_switch(save, to): saves the callee-saved registers and the stack pointer into *save, continues at
// `to`. A fresh stack starts in simt_fiber_start, which calls r13(r12). Weak, so several translation
// units may include this header.
extern "C" void simt_switch(void** save, void* to);
extern "C" void simt_fiber_start();
asm(R"(
    .text
    .weak simt_switch
    .type simt_switch, @function
simt_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size simt_switch, .-simt_switch
    .weak simt_fiber_start
    .type simt_fiber_start, @function
simt_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size simt_fiber_start, .-simt_fiber_start
)");

enum class State : uint8_t { Runnable, AtBarrier, AtWarp, Done };

struct Block;

struct Fiber {
    void* sp = nullptr;
    State state = State::Runnable;
    dim3 thread_idx;
    int lane = 0, warp = 0;
    Block* block = nullptr;
    uint64_t result = 0;  // what a collective hands back to this lane
};

// What a warp's lanes deposit at a collective, and who has arrived.
enum class Op : uint8_t { Shfl, ShflXor, ShflDown, ShflUp, Ballot, Any, All, Sync, Mma };
struct Warp {
    uint32_t arrived = 0, exited = 0, present = 0;  // lane masks
    uint32_t mask[kWarpSize];
    Op op[kWarpSize];
    uint64_t value[kWarpSize];
    int param[kWarpSize], width[kWarpSize];
    // mma: each lane's A, B and C fragment registers as PTX distributes them, and its part of D
    int mma_a[kWarpSize][4], mma_b[kWarpSize][2], mma_c[kWarpSize][4], mma_d[kWarpSize][4];
};

// One block in flight on a worker: its fibers, warps and barrier.
struct Block {
    dim3 block_idx, block_dim, grid_dim;
    int n_threads = 0, n_alive = 0, n_at_barrier = 0;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    const std::function<void()>* body = nullptr;
    void* scheduler_sp = nullptr;
    Fiber* current = nullptr;
    std::string error;  // a misuse one thread detected; the launch fails with it
};

// The block and fiber running on this OS thread (fibers never migrate between OS threads).
inline Block*& this_block() { static thread_local Block* b = nullptr; return b; }
inline Fiber* this_fiber() { return this_block()->current; }

// Back to the scheduler; returns when this fiber is resumed.
inline void yield_to_scheduler() {
    Block* b = this_block();
    simt_switch(&b->current->sp, b->scheduler_sp);
}

// Makes every thread waiting at the barrier runnable once all live threads are there.
inline void release_barrier_if_complete(Block& b) {
    if (b.n_at_barrier == 0 || b.n_at_barrier < b.n_alive) return;
    for (Fiber& f : b.fibers) if (f.state == State::AtBarrier) f.state = State::Runnable;
    b.n_at_barrier = 0;
}

// The first and only frame of every fiber: runs the kernel body, then marks the thread exited.
inline void fiber_main(Fiber* f) {
    Block& b = *f->block;
    try {
        (*b.body)();
    } catch (const std::exception& e) {
        b.error = e.what();
    }
    f->state = State::Done;
    b.n_alive--;
    b.warps[f->warp].exited |= 1u << f->lane;
    release_barrier_if_complete(b);
    simt_switch(&f->sp, b.scheduler_sp);
}

// Per-worker fiber stacks, reserved once per worker thread (pages are touched only as deep as kernels
// go) and returned when the thread ends: every launch starts new workers, so a test process that
// launches thousands of kernels must not keep each one's stacks.
struct WorkerStacks {
    uint8_t* base = nullptr;
    ~WorkerStacks() {
        if (base) munmap(base, kStackBytes * kMaxBlockThreads);
    }
};
inline uint8_t* worker_stacks() {
    static thread_local WorkerStacks stacks;
    if (!stacks.base) {
        void* p = mmap(nullptr, kStackBytes * kMaxBlockThreads, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) throw Error("simt: cannot reserve fiber stacks");
        stacks.base = static_cast<uint8_t*>(p);
    }
    return stacks.base;
}

// Prepares fiber i's stack so that the first switch to it enters fiber_main(&fiber).
inline void init_fiber_stack(Fiber& f, uint8_t* stack_top) {
    void** sp = reinterpret_cast<void**>(stack_top) - 7;
    sp[0] = nullptr; sp[1] = nullptr;                            // r15, r14
    sp[2] = reinterpret_cast<void*>(&fiber_main);                // r13: the function
    sp[3] = &f;                                                  // r12: its argument
    sp[4] = nullptr; sp[5] = nullptr;                            // rbx, rbp
    sp[6] = reinterpret_cast<void*>(&simt_fiber_start);          // return address
    f.sp = sp;
}

// The order a block's threads are visited in each scheduling round.
inline std::vector<int> visit_order(int n, Order order, uint64_t seed) {
    std::vector<int> idx(n);
    for (int i = 0; i < n; i++) idx[i] = i;
    if (order == Order::Reverse) std::reverse(idx.begin(), idx.end());
    if (order == Order::Shuffle) std::shuffle(idx.begin(), idx.end(), std::mt19937_64(seed));
    return idx;
}

// Runs one block to completion on this OS thread.
inline void run_block(Block& b, const std::vector<int>& order) {
    uint8_t* stacks = worker_stacks();
    b.n_alive = b.n_threads;
    b.n_at_barrier = 0;
    b.error.clear();
    for (Warp& w : b.warps) w.arrived = w.exited = w.present = 0;  // the lanes' slots are written before they are read
    for (int i = 0; i < b.n_threads; i++) {
        Fiber& f = b.fibers[i];
        f.state = State::Runnable;
        f.block = &b;
        f.thread_idx = dim3(i % b.block_dim.x, (i / b.block_dim.x) % b.block_dim.y, i / (b.block_dim.x * b.block_dim.y));
        f.lane = i % kWarpSize;
        f.warp = i / kWarpSize;
        b.warps[f.warp].present |= 1u << f.lane;
        init_fiber_stack(f, stacks + kStackBytes * (i + 1));
    }
    this_block() = &b;
    while (b.n_alive > 0) {
        bool progressed = false;
        for (int i : order) {
            Fiber& f = b.fibers[i];
            if (f.state != State::Runnable) continue;
            b.current = &f;
            simt_switch(&b.scheduler_sp, f.sp);
            progressed = true;
            if (!b.error.empty()) {
                this_block() = nullptr;
                throw Error(b.error);
            }
        }
        if (!progressed) {
            this_block() = nullptr;
            throw Error("simt: deadlock in block (" + std::to_string(b.block_idx.x) + "," +
                        std::to_string(b.block_idx.y) + "): a barrier or collective some thread never reaches");
        }
    }
    this_block() = nullptr;
}

inline int& worker_count() {
    static int n = std::max(1u, std::thread::hardware_concurrency());
    return n;
}
// OS threads that run blocks in parallel (1: blocks strictly in grid order).
inline void set_workers(int n) { worker_count() = std::max(1, n); }

// kernel<<<grid, block>>>(args...): every block of the grid, its threads in `order`.
template <class Kernel, class... Args>
void launch_ordered(Order order, uint64_t seed, dim3 grid, dim3 block, Kernel kernel, Args... args) {
    const int n_threads = int(block.x * block.y * block.z);
    if (n_threads < 1 || n_threads > kMaxBlockThreads) throw Error("simt: block of " + std::to_string(n_threads) + " threads");
    const std::function<void()> body = [&] { kernel(args...); };
    const std::vector<int> visit = visit_order(n_threads, order, seed);
    const int64_t n_blocks = int64_t(grid.x) * grid.y * grid.z;
    std::atomic<int64_t> next{0};
    std::string failure;
    std::mutex failure_mutex;
    auto work = [&] {
        Block b;
        b.block_dim = block;
        b.grid_dim = grid;
        b.n_threads = n_threads;
        b.fibers.resize(n_threads);
        b.warps.resize((n_threads + kWarpSize - 1) / kWarpSize);
        b.body = &body;
        for (int64_t id; (id = next.fetch_add(1)) < n_blocks;) {
            b.block_idx = dim3(unsigned(id % grid.x), unsigned(id / grid.x % grid.y), unsigned(id / (int64_t(grid.x) * grid.y)));
            try {
                run_block(b, visit);
            } catch (const Error& e) {
                std::lock_guard<std::mutex> lock(failure_mutex);
                failure = e.what();
                next = n_blocks;
            }
        }
    };
    const int n_workers = int(std::min<int64_t>(worker_count(), n_blocks));
    std::vector<std::thread> workers;
    for (int i = 1; i < n_workers; i++) workers.emplace_back(work);
    work();
    for (std::thread& t : workers) t.join();
    if (!failure.empty()) throw Error(failure);
}

template <class Kernel, class... Args>
void launch(dim3 grid, dim3 block, Kernel kernel, Args... args) {
    launch_ordered(Order::Forward, 0, grid, block, kernel, args...);
}

// ---- warp collectives --------------------------------------------------------------------------------
// The lane whose value a shuffle returns (its own when the source lies outside its width segment).
inline int shuffle_source(Op op, int lane, int param, int width) {
    const int base = lane / width * width;
    switch (op) {
    case Op::Shfl: return base + (param % width + width) % width;
    case Op::ShflXor: { int src = lane ^ param; return src >= base + width ? lane : src; }
    case Op::ShflDown: return lane % width + param < width ? lane + param : lane;
    case Op::ShflUp: return lane % width >= param ? lane - param : lane;
    default: return lane;
    }
}

// D = A B + C of mma.sync.aligned.m16n8k{k}.row.col.s32.s8.s8.s32 from the lanes' fragments (PTX ISA,
// "Matrix Fragments for mma.m16n8k16 / m16n8k32 with integer type"): with g = lane / 4, t = lane % 4,
// A register r (k / 8 of them) holds A[g + 8 (r % 2)][4t + 16 (r / 2) + 0..3], B register r (k / 16)
// holds B[4t + 16 r + 0..3][g], and C / D element i (4) is [g + 8 (i / 2)][2t + i % 2]; bytes low to high.
inline void complete_mma(Warp& w, int k) {
    int8_t A[16][32], B[32][8];
    auto byte = [](int reg, int i) { return int8_t(uint32_t(reg) >> (8 * i)); };
    for (int lane = 0; lane < kWarpSize; lane++) {
        const int g = lane / 4, t = lane % 4;
        for (int r = 0; r < k / 8; r++)
            for (int i = 0; i < 4; i++) A[g + 8 * (r % 2)][4 * t + 16 * (r / 2) + i] = byte(w.mma_a[lane][r], i);
        for (int r = 0; r < k / 16; r++)
            for (int i = 0; i < 4; i++) B[4 * t + 16 * r + i][g] = byte(w.mma_b[lane][r], i);
    }
    for (int lane = 0; lane < kWarpSize; lane++)
        for (int i = 0; i < 4; i++) {
            const int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
            uint32_t sum = uint32_t(w.mma_c[lane][i]);  // the hardware's s32 sum wraps
            for (int j = 0; j < k; j++) sum += uint32_t(int(A[row][j]) * int(B[j][col]));
            w.mma_d[lane][i] = int(sum);
        }
}

// Called by the last lane of `mask` to arrive: computes every member's result and wakes them.
inline void complete_collective(Block& b, int warp, uint32_t mask) {
    Warp& w = b.warps[warp];
    const int first = __builtin_ctz(mask);
    if (w.op[first] == Op::Mma) complete_mma(w, w.param[first]);
    uint32_t votes = 0;
    for (int l = 0; l < kWarpSize; l++) if ((mask >> l & 1) && w.value[l]) votes |= 1u << l;
    for (int l = 0; l < kWarpSize; l++) {
        if (!(mask >> l & 1)) continue;
        if (w.mask[l] != mask || w.op[l] != w.op[first])
            throw Error("simt: lanes of one warp met at different collectives or with different masks");
        Fiber& f = b.fibers[warp * kWarpSize + l];
        switch (w.op[l]) {
        case Op::Ballot: f.result = votes & mask; break;
        case Op::Any: f.result = votes != 0; break;
        case Op::All: f.result = votes == mask; break;
        case Op::Sync: case Op::Mma: f.result = 0; break;
        default: {
            const int src = shuffle_source(w.op[l], l, w.param[l], w.width[l]);
            f.result = (mask >> src & 1) ? w.value[src] : w.value[l];
        }
        }
        f.state = State::Runnable;
    }
    w.arrived &= ~mask;
}

// A lane's part in a collective: deposit, wait for the mask's lanes, return this lane's result.
inline uint64_t collective(Op op, uint32_t mask, uint64_t value, int param = 0, int width = kWarpSize) {
    Fiber* f = this_fiber();
    Block& b = *f->block;
    Warp& w = b.warps[f->warp];
    if (!(mask >> f->lane & 1)) throw Error("simt: a lane called a collective without itself in the mask");
    if (mask & ~w.present) throw Error("simt: collective mask names lanes outside the block");
    w.mask[f->lane] = mask;
    w.op[f->lane] = op;
    w.value[f->lane] = value;
    w.param[f->lane] = param;
    w.width[f->lane] = width;
    w.arrived |= 1u << f->lane;
    f->state = State::AtWarp;
    if ((w.arrived & mask) == mask) complete_collective(b, f->warp, mask);
    else if (mask & w.exited) throw Error("simt: collective waits for a lane that has exited");
    yield_to_scheduler();
    return f->result;
}

// One lane's part in the warp's mma.sync m16n8k{K} on int8 (K = 32 or 16): a holds K / 8 registers of
// A, b K / 16 of B, c and d 4 of the accumulators, in PTX's fragment layout (complete_mma). Every lane
// of a full warp takes part, as .sync.aligned requires.
template <int K> void mma_s8(int (&d)[4], const int* a, const int* b, const int (&c)[4]) {
    static_assert(K == 16 || K == 32, "simt: int8 mma shapes m16n8k16 and m16n8k32");
    Fiber* f = this_fiber();
    Warp& w = f->block->warps[f->warp];
    if (w.present != 0xffffffffu) throw Error("simt: mma.sync needs a full warp of 32 threads");
    std::memcpy(w.mma_a[f->lane], a, sizeof(int) * K / 8);
    std::memcpy(w.mma_b[f->lane], b, sizeof(int) * K / 16);
    std::memcpy(w.mma_c[f->lane], c, sizeof c);
    collective(Op::Mma, 0xffffffffu, 0, K);
    std::memcpy(d, w.mma_d[f->lane], sizeof d);
}

template <class T> uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "simt: shuffles carry at most 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof v);
    return u;
}
template <class T> T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

} // namespace simt

// ---- the CUDA names kernels use --------------------------------------------------------------------------
#define threadIdx (::simt::this_fiber()->thread_idx)
#define blockIdx (::simt::this_block()->block_idx)
#define blockDim (::simt::this_block()->block_dim)
#define gridDim (::simt::this_block()->grid_dim)
#define warpSize 32

inline void __syncthreads() {
    simt::Fiber* f = simt::this_fiber();
    simt::Block& b = *f->block;
    f->state = simt::State::AtBarrier;
    b.n_at_barrier++;
    simt::release_barrier_if_complete(b);
    simt::yield_to_scheduler();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { simt::collective(simt::Op::Sync, mask, 0); }
inline unsigned __activemask() { simt::Fiber* f = simt::this_fiber(); return f->block->warps[f->warp].present & ~f->block->warps[f->warp].exited; }

template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
    return simt::from_bits<T>(simt::collective(simt::Op::Shfl, mask, simt::to_bits(v), src, width));
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
    return simt::from_bits<T>(simt::collective(simt::Op::ShflXor, mask, simt::to_bits(v), lane_mask, width));
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    return simt::from_bits<T>(simt::collective(simt::Op::ShflDown, mask, simt::to_bits(v), int(delta), width));
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
    return simt::from_bits<T>(simt::collective(simt::Op::ShflUp, mask, simt::to_bits(v), int(delta), width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return unsigned(simt::collective(simt::Op::Ballot, mask, pred != 0)); }
inline int __any_sync(unsigned mask, int pred) { return int(simt::collective(simt::Op::Any, mask, pred != 0)); }
inline int __all_sync(unsigned mask, int pred) { return int(simt::collective(simt::Op::All, mask, pred != 0)); }

// ---- atomics (blocks run in parallel on several OS threads) -------------------------------------------
template <class T> T __simt_atomic_cas_op(T* p, T v, T (*op)(T, T)) {
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &old, op(old, v), true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline float atomicAdd(float* p, float v) {
    uint32_t* u = reinterpret_cast<uint32_t*>(p);
    uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED), sum;
    do {
        float f;
        std::memcpy(&f, &old, 4);
        f += v;
        std::memcpy(&sum, &f, 4);
    } while (!__atomic_compare_exchange_n(u, &old, sum, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    std::memcpy(&sum, &old, 4);
    float r;
    std::memcpy(&r, &sum, 4);
    return r;
}
inline int atomicMax(int* p, int v) { return __simt_atomic_cas_op<int>(p, v, [](int a, int b) { return a > b ? a : b; }); }
inline int atomicMin(int* p, int v) { return __simt_atomic_cas_op<int>(p, v, [](int a, int b) { return a < b ? a : b; }); }
inline int atomicExch(int* p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline int atomicCAS(int* p, int expected, int desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;
}

// ---- integer and float intrinsics ------------------------------------------------------------------------
// Four signed byte products of a and b, summed into c.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += int(int8_t(unsigned(a) >> (8 * i))) * int(int8_t(unsigned(b) >> (8 * i)));
    return c;
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0 ? 0 : x > 1 ? 1 : x; }
template <class T> T __ldg(const T* p) { return *p; }

// ---- __half / __half2 / __nv_bfloat16 ---------------------------------------------------------------------
// IEEE binary16 stored as its bits; conversions round to nearest even like the hardware's.
struct __half { uint16_t bits; };
struct __half2 { __half x, y; };
struct __nv_bfloat16 { uint16_t bits; };

inline float __half2float(__half h) {
    const uint32_t sign = uint32_t(h.bits & 0x8000) << 16, exp = h.bits >> 10 & 0x1f, mant = h.bits & 0x3ff;
    uint32_t u;
    if (exp == 0x1f) u = sign | 0x7f800000 | mant << 13;
    else if (exp != 0) u = sign | (exp + 112) << 23 | mant << 13;
    else if (mant == 0) u = sign;
    else {  // subnormal: normalize
        int e = -1;
        uint32_t m = mant;
        do { m <<= 1; e++; } while (!(m & 0x400));
        u = sign | uint32_t(112 - e) << 23 | (m & 0x3ff) << 13;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline __half __float2half(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = u >> 16 & 0x8000;
    const uint32_t abs = u & 0x7fffffff;
    if (abs >= 0x7f800000) return {uint16_t(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0))};
    if (abs >= 0x477ff000) return {uint16_t(sign | 0x7c00)};  // rounds to infinity
    if (abs < 0x38800000) {  // subnormal or zero: scale into the 10-bit mantissa, round to even
        const uint32_t m = (abs & 0x7fffff) | 0x800000;
        const int shift = 126 - int(abs >> 23);
        if (shift > 24) return {uint16_t(sign)};
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return {uint16_t(sign | q)};
    }
    uint32_t h = ((abs >> 23) - 112) << 10 | (abs >> 13 & 0x3ff);
    const uint32_t rem = abs & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return {uint16_t(sign | h)};
}
inline __half __ushort_as_half(unsigned short u) { return {u}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half(a), __float2half(b)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return __int_as_float(int(uint32_t(b.bits) << 16)); }
