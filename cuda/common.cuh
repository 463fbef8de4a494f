// common.cuh - what every kernel file shares: the portability line between nvcc and the SIMT emulator
// (tests/simt.hpp), half-precision loads, and warp / block reductions.
//
// The kernels are plain CUDA C++. nvcc compiles them for the GPU (cuda/kernels.cu); the tests compile the
// same source with g++ after including tests/simt.hpp, which provides the CUDA names.
#pragma once
#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#ifdef __CUDACC_RTC__  // NVRTC (the sm_70 cubin, scripts/nvrtc-cubin) has no C library headers
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#ifndef INFINITY
#define INFINITY __builtin_bit_cast(float, 0x7f800000u)
#endif
#else
#include <stdint.h>
#endif
#endif

#ifdef __CUDACC__
#define LLM_KERNEL extern "C" __global__
#else  // the emulator: several test files may include the kernels
#define LLM_KERNEL extern "C" inline
#endif

constexpr unsigned kFullMask = 0xffffffffu;

// An f16 stored as its bits (ggml's blocks keep scales this way).
__device__ __forceinline__ float f16_bits_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ uint16_t float_to_f16_bits(float f) { return __half_as_ushort(__float2half(f)); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) { return __int_as_float(int(uint32_t(bits) << 16)); }

// A little-endian uint16 of a block (2-byte aligned in every ggml block).
__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
// Four bytes at a 2-byte aligned address as one int (the quants of 18- and 22-byte blocks are not
// 4-byte aligned).
__device__ __forceinline__ int load_int_b2(const uint8_t* p) {
    return int(uint32_t(load_u16(p)) | uint32_t(load_u16(p + 2)) << 16);
}

// Reductions: Combine is SumOp or MaxOp (functors, so nvcc needs no extended lambdas).
struct SumOp {
    static constexpr float identity = 0.0f;
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    static constexpr float identity = -INFINITY;
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Combines v over the 32 lanes of a warp; every lane gets the result.
template <class Combine> __device__ __forceinline__ float warp_reduce(float v, Combine combine) {
    for (int offset = 16; offset > 0; offset >>= 1) v = combine(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp()); }

// Combines v over a whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <class Combine> __device__ __forceinline__ float block_reduce(float v, Combine combine) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_reduce(v, combine);
    __syncthreads();  // a previous call's readers are done with partial[]
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : Combine::identity;
    return warp_reduce(v, combine);
}
